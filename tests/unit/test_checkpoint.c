/* Hugging Face checkpoints: family detection, config.json fields, MoE-layer rules, tensor
 * naming for Mixtral / Qwen2-MoE / Qwen3-MoE in the per-expert and stacked layouts, shards,
 * and every error (status and message). Tiny models are built in a temp folder; the packed
 * weights are checked by executing the layer against a scalar reference written here. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe.h"
#include "testutil.h"

/* --------------------------------------------------------------------------------------
 * A tiny model description and its weights
 * ------------------------------------------------------------------------------------ */

typedef struct model_spec {
    moe_family family;
    int64_t H, I, E, K, L;
    int64_t Is;              /* Qwen2-MoE shared_expert_intermediate_size; 0 = none */
    int stacked;             /* 1: experts.gate_up_proj [E,2I,H] + experts.down_proj [E,H,I] */
    moe_dtype wdt;           /* expert weights: F32 or BF16 */
    moe_dtype rdt;           /* router (and shared_expert_gate): F32 or BF16 */
    int norm_topk;           /* Qwen norm_topk_prob: 0, 1, or -1 to leave it out */
    int64_t sparse_step;     /* Qwen decoder_sparse_step; 0 leaves it out */
    const char *mlp_only;    /* Qwen mlp_only_layers as JSON text, or NULL */
} model_spec;

static model_spec qwen3_spec(void)
{
    model_spec s = {MOE_FAMILY_QWEN3_MOE, 16, 8, 4, 2, 2, 0, 0, MOE_DTYPE_BF16, MOE_DTYPE_BF16,
                    1, 0, NULL};
    return s;
}

/* f32 -> bf16 bits, round to nearest even (inputs are finite). */
static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round every value to what dtype `dt` can hold, so the f32 copy equals the stored one. */
static void round_to(float *x, size_t n, moe_dtype dt)
{
    if (dt == MOE_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            x[i] = from_bf16(to_bf16(x[i]));
}

/* One MoE layer's weights in f32 (already rounded to their dtype). */
typedef struct layer_w {
    float *router;  /* [E, H] */
    float *gate;    /* [E, I, H] */
    float *up;      /* [E, I, H] */
    float *down;    /* [E, H, I] */
    float *sgate;   /* [Is, H] */
    float *sup;     /* [Is, H] */
    float *sdown;   /* [H, Is] */
    float *sgw;     /* [1, H] */
} layer_w;

static float *gen(size_t n, uint64_t seed, float scale, moe_dtype dt)
{
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    tu_fill_uniform(x, n, seed, -scale, scale);
    round_to(x, n, dt);
    return x;
}

static layer_w gen_layer(const model_spec *s, int64_t layer)
{
    const size_t E = (size_t)s->E, H = (size_t)s->H, I = (size_t)s->I, Is = (size_t)s->Is;
    uint64_t base = 1000 * (uint64_t)(layer + 1);
    layer_w w = {0};
    w.router = gen(E * H, base + 1, 1.0f, s->rdt);
    w.gate = gen(E * I * H, base + 2, 0.5f, s->wdt);
    w.up = gen(E * I * H, base + 3, 0.5f, s->wdt);
    w.down = gen(E * H * I, base + 4, 0.5f, s->wdt);
    if (Is) {
        w.sgate = gen(Is * H, base + 5, 0.5f, s->wdt);
        w.sup = gen(Is * H, base + 6, 0.5f, s->wdt);
        w.sdown = gen(H * Is, base + 7, 0.5f, s->wdt);
        w.sgw = gen(H, base + 8, 1.0f, s->rdt);
    }
    return w;
}

static void free_layer(layer_w *w)
{
    free(w->router);
    free(w->gate);
    free(w->up);
    free(w->down);
    free(w->sgate);
    free(w->sup);
    free(w->sdown);
    free(w->sgw);
}

/* A growing list of tensors to write, owning names and converted data. */
typedef struct tlist {
    moe_tensor_out *t;
    size_t n, cap;
} tlist;

/* Append tensor `name` with f32 values `v` stored as dtype `dt`. */
static void tl_add(tlist *tl, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                   const float *v)
{
    if (tl->n == tl->cap) {
        tl->cap = tl->cap ? 2 * tl->cap : 64;
        tl->t = realloc(tl->t, tl->cap * sizeof *tl->t);
        assert_non_null(tl->t);
    }
    moe_tensor_out *t = &tl->t[tl->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    size_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        numel *= (size_t)shape[d];
    }
    if (dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16) {
        /* F16 only appears in dtype-error tests: its bits need not mean anything. */
        uint16_t *b = malloc(numel * 2 + 1);
        assert_non_null(b);
        for (size_t i = 0; i < numel; i++)
            b[i] = to_bf16(v[i]);
        t->data = b;
    } else {
        size_t es = moe_dtype_size(dt);
        void *b = calloc(numel ? numel : 1, es);
        assert_non_null(b);
        if (dt == MOE_DTYPE_F32)
            memcpy(b, v, numel * es);
        t->data = b;
    }
}

static moe_tensor_out *tl_find(tlist *tl, const char *name)
{
    for (size_t i = 0; i < tl->n; i++)
        if (strcmp(tl->t[i].name, name) == 0)
            return &tl->t[i];
    fail_msg("test bug: no tensor %s", name);
    return NULL;
}

/* Drop tensor `name` from the list. */
static void tl_remove(tlist *tl, const char *name)
{
    moe_tensor_out *t = tl_find(tl, name);
    free((void *)t->name);
    free((void *)t->data);
    *t = tl->t[--tl->n];
}

/* Replace tensor `name` by one of dtype `dt` and shape `shape` (values from `v`). */
static void tl_replace(tlist *tl, const char *name, moe_dtype dt, int ndim, const int64_t *shape,
                       const float *v)
{
    tl_remove(tl, name);
    tl_add(tl, name, dt, ndim, shape, v);
}

static void tl_free(tlist *tl)
{
    for (size_t i = 0; i < tl->n; i++) {
        free((void *)tl->t[i].name);
        free((void *)tl->t[i].data);
    }
    free(tl->t);
    memset(tl, 0, sizeof *tl);
}

static int spec_is_moe(const model_spec *s, int64_t layer)
{
    if (s->family == MOE_FAMILY_MIXTRAL)
        return 1;
    int64_t step = s->sparse_step ? s->sparse_step : 1;
    if (s->mlp_only) {
        char pat[32];
        snprintf(pat, sizeof pat, "%lld", (long long)layer);
        /* mlp_only lists single-digit layers in these tests */
        if (strstr(s->mlp_only, pat))
            return 0;
    }
    return (layer + 1) % step == 0;
}

/* The prefix of layer L's MoE block in the file. */
static void layer_prefix(const model_spec *s, int64_t layer, char *buf, size_t len)
{
    if (s->family == MOE_FAMILY_MIXTRAL && !s->stacked)
        snprintf(buf, len, "model.layers.%lld.block_sparse_moe.", (long long)layer);
    else
        snprintf(buf, len, "model.layers.%lld.mlp.", (long long)layer);
}

/* Add layer `layer`'s tensors, named and laid out as `s` says, to tl. */
static void add_layer_tensors(const model_spec *s, int64_t layer, const layer_w *w, tlist *tl)
{
    const int64_t E = s->E, H = s->H, I = s->I, Is = s->Is;
    char p[128], name[256];
    layer_prefix(s, layer, p, sizeof p);

    snprintf(name, sizeof name, "%sgate.weight", p);
    tl_add(tl, name, s->rdt, 2, (int64_t[]){E, H}, w->router);
    if (s->stacked) {
        /* [E, 2I, H]: per expert, the I gate rows then the I up rows. */
        float *gu = malloc((size_t)(E * 2 * I * H) * sizeof *gu);
        assert_non_null(gu);
        for (int64_t e = 0; e < E; e++) {
            memcpy(gu + (size_t)(e * 2 * I * H), w->gate + (size_t)(e * I * H), (size_t)(I * H) * sizeof *gu);
            memcpy(gu + (size_t)(e * 2 * I * H + I * H), w->up + (size_t)(e * I * H), (size_t)(I * H) * sizeof *gu);
        }
        snprintf(name, sizeof name, "%sexperts.gate_up_proj", p);
        tl_add(tl, name, s->wdt, 3, (int64_t[]){E, 2 * I, H}, gu);
        snprintf(name, sizeof name, "%sexperts.down_proj", p);
        tl_add(tl, name, s->wdt, 3, (int64_t[]){E, H, I}, w->down);
        free(gu);
    } else {
        const int mixtral = s->family == MOE_FAMILY_MIXTRAL;
        for (int64_t e = 0; e < E; e++) {
            snprintf(name, sizeof name, "%sexperts.%lld.%s.weight", p, (long long)e, mixtral ? "w1" : "gate_proj");
            tl_add(tl, name, s->wdt, 2, (int64_t[]){I, H}, w->gate + (size_t)(e * I * H));
            snprintf(name, sizeof name, "%sexperts.%lld.%s.weight", p, (long long)e, mixtral ? "w3" : "up_proj");
            tl_add(tl, name, s->wdt, 2, (int64_t[]){I, H}, w->up + (size_t)(e * I * H));
            snprintf(name, sizeof name, "%sexperts.%lld.%s.weight", p, (long long)e, mixtral ? "w2" : "down_proj");
            tl_add(tl, name, s->wdt, 2, (int64_t[]){H, I}, w->down + (size_t)(e * H * I));
        }
    }
    if (Is > 0) {
        snprintf(name, sizeof name, "%sshared_expert.gate_proj.weight", p);
        tl_add(tl, name, s->wdt, 2, (int64_t[]){Is, H}, w->sgate);
        snprintf(name, sizeof name, "%sshared_expert.up_proj.weight", p);
        tl_add(tl, name, s->wdt, 2, (int64_t[]){Is, H}, w->sup);
        snprintf(name, sizeof name, "%sshared_expert.down_proj.weight", p);
        tl_add(tl, name, s->wdt, 2, (int64_t[]){H, Is}, w->sdown);
        snprintf(name, sizeof name, "%sshared_expert_gate.weight", p);
        tl_add(tl, name, s->rdt, 2, (int64_t[]){1, H}, w->sgw);
    }
}

/* Every tensor of the model (MoE layers, plus a few dense ones as real files have). */
static void build_tensors(const model_spec *s, tlist *tl)
{
    float dummy[16] = {0};
    tl_add(tl, "model.embed_tokens.weight", MOE_DTYPE_F32, 2, (int64_t[]){1, 16}, dummy);
    for (int64_t l = 0; l < s->L; l++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
        tl_add(tl, name, MOE_DTYPE_F32, 1, (int64_t[]){16}, dummy);
        if (!spec_is_moe(s, l))
            continue;
        layer_w w = gen_layer(s, l);
        add_layer_tensors(s, l, &w, tl);
        free_layer(&w);
    }
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* config.json of spec `s`. */
static void write_config(const char *dir, const model_spec *s)
{
    char buf[2048];
    int n;
    if (s->family == MOE_FAMILY_MIXTRAL) {
        n = snprintf(buf, sizeof buf,
                     "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\",\n"
                     " \"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_local_experts\": %lld,\n"
                     " \"num_experts_per_tok\": %lld, \"num_hidden_layers\": %lld, \"torch_dtype\": \"bfloat16\"}\n",
                     (long long)s->H, (long long)s->I, (long long)s->E, (long long)s->K, (long long)s->L);
    } else {
        const int q2 = s->family == MOE_FAMILY_QWEN2_MOE;
        n = snprintf(buf, sizeof buf,
                     "{\"architectures\": [\"%s\"], \"model_type\": \"%s\",\n"
                     " \"hidden_size\": %lld, \"intermediate_size\": 99, \"moe_intermediate_size\": %lld,\n"
                     " \"num_experts\": %lld, \"num_experts_per_tok\": %lld, \"num_hidden_layers\": %lld",
                     q2 ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM", q2 ? "qwen2_moe" : "qwen3_moe",
                     (long long)s->H, (long long)s->I, (long long)s->E, (long long)s->K, (long long)s->L);
        if (q2)
            n += snprintf(buf + n, sizeof buf - (size_t)n, ", \"shared_expert_intermediate_size\": %lld",
                          (long long)s->Is);
        if (s->norm_topk >= 0)
            n += snprintf(buf + n, sizeof buf - (size_t)n, ", \"norm_topk_prob\": %s",
                          s->norm_topk ? "true" : "false");
        if (s->sparse_step)
            n += snprintf(buf + n, sizeof buf - (size_t)n, ", \"decoder_sparse_step\": %lld",
                          (long long)s->sparse_step);
        if (s->mlp_only)
            n += snprintf(buf + n, sizeof buf - (size_t)n, ", \"mlp_only_layers\": %s", s->mlp_only);
        n += snprintf(buf + n, sizeof buf - (size_t)n, "}\n");
    }
    assert_true(n > 0 && (size_t)n < sizeof buf);
    write_text(dir, "config.json", buf);
}

/* Write the tensors as model.safetensors (n_shards = 1) or as n_shards shards with an index
 * (tensor i goes to shard i % n_shards). */
static void write_weights(moe_ctx *ctx, const char *dir, tlist *tl, int n_shards)
{
    char path[700];
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        assert_int_equal(moe_safetensors_write(ctx, path, tl->t, tl->n), MOE_OK);
        return;
    }
    json_t *wm = json_object();
    for (int s = 0; s < n_shards; s++) {
        char file[128];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        moe_tensor_out *part = malloc(tl->n * sizeof *part); /* [<= n] */
        size_t np = 0;
        for (size_t i = (size_t)s; i < tl->n; i += (size_t)n_shards) {
            part[np++] = tl->t[i];
            json_object_set_new(wm, tl->t[i].name, json_string(file));
        }
        snprintf(path, sizeof path, "%s/%s", dir, file);
        assert_int_equal(moe_safetensors_write(ctx, path, part, np), MOE_OK);
        free(part);
    }
    json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", wm);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(idx, path, JSON_INDENT(2)), 0);
    json_decref(idx);
}

/* A whole checkpoint for `s` in a fresh folder `dir`. */
static void make_checkpoint(moe_ctx *ctx, char *dir, size_t len, const char *tag, const model_spec *s,
                            int n_shards)
{
    tu_tmpdir(dir, len, tag);
    write_config(dir, s);
    tlist tl = {0};
    build_tensors(s, &tl);
    write_weights(ctx, dir, &tl, n_shards);
    tl_free(&tl);
}

/* --------------------------------------------------------------------------------------
 * Reference forward (independent of libmoe): softmax router, top-k, SwiGLU experts.
 * ------------------------------------------------------------------------------------ */

static void ref_forward(const model_spec *s, const layer_w *w, const float *x /* [T, H] */,
                        int64_t T, float *out /* [T, H] */)
{
    const int64_t E = s->E, H = s->H, I = s->I, K = s->K, Is = s->Is;
    const int renorm = s->family == MOE_FAMILY_MIXTRAL ? 1 : s->norm_topk == 1;
    double *p = malloc((size_t)E * sizeof *p);     /* [E] probabilities */
    double *h = malloc((size_t)(I > Is ? I : Is) * sizeof *h); /* [max(I, Is)] */
    int *used = malloc((size_t)E * sizeof *used);  /* [E] */
    assert_true(p && h && used);
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * H;
        double mx = -INFINITY, sum = 0;
        for (int64_t e = 0; e < E; e++) {
            double l = 0;
            for (int64_t k = 0; k < H; k++)
                l += (double)w->router[e * H + k] * xt[k];
            p[e] = l;
            mx = l > mx ? l : mx;
        }
        for (int64_t e = 0; e < E; e++) {
            p[e] = exp(p[e] - mx);
            sum += p[e];
            used[e] = 0;
        }
        int64_t ids[16];
        double wt[16], wsum = 0;
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (!used[e] && (best < 0 || p[e] > p[best]))
                    best = e;
            used[best] = 1;
            ids[k] = best;
            wt[k] = p[best] / sum;
            wsum += wt[k];
        }
        for (int64_t j = 0; j < H; j++)
            out[t * H + j] = 0;
        double *acc = calloc((size_t)H, sizeof *acc); /* [H] */
        assert_non_null(acc);
        for (int64_t k = 0; k < K; k++) {
            const int64_t e = ids[k];
            const double wk = renorm ? wt[k] / (wsum + 1e-20) : wt[k];
            for (int64_t i = 0; i < I; i++) {
                double g = 0, u = 0;
                for (int64_t c = 0; c < H; c++) {
                    g += (double)w->gate[(e * I + i) * H + c] * xt[c];
                    u += (double)w->up[(e * I + i) * H + c] * xt[c];
                }
                h[i] = g / (1 + exp(-g)) * u;
            }
            for (int64_t j = 0; j < H; j++) {
                double y = 0;
                for (int64_t i = 0; i < I; i++)
                    y += (double)w->down[(e * H + j) * I + i] * h[i];
                acc[j] += wk * y;
            }
        }
        if (Is > 0) {
            double gl = 0;
            for (int64_t c = 0; c < H; c++)
                gl += (double)w->sgw[c] * xt[c];
            const double gate = 1 / (1 + exp(-gl));
            for (int64_t i = 0; i < Is; i++) {
                double g = 0, u = 0;
                for (int64_t c = 0; c < H; c++) {
                    g += (double)w->sgate[i * H + c] * xt[c];
                    u += (double)w->sup[i * H + c] * xt[c];
                }
                h[i] = g / (1 + exp(-g)) * u;
            }
            for (int64_t j = 0; j < H; j++) {
                double y = 0;
                for (int64_t i = 0; i < Is; i++)
                    y += (double)w->sdown[j * Is + i] * h[i];
                acc[j] += gate * y;
            }
        }
        for (int64_t j = 0; j < H; j++)
            out[t * H + j] = (float)acc[j];
        free(acc);
    }
    free(p);
    free(h);
    free(used);
}

/* Load layer `layer` of checkpoint `dir`, run T tokens of x through it, write out [T, H]. */
static void run_layer(moe_ctx *ctx, const char *dir, int64_t layer, const float *x, int64_t T,
                      float *out)
{
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st != MOE_OK)
        fail_msg("open %s: %s", dir, moe_ctx_last_error(ctx));
    moe_layer_desc d;
    st = moe_checkpoint_layer_desc(ck, layer, &d);
    if (st != MOE_OK)
        fail_msg("layer_desc: %s", moe_ctx_last_error(ctx));
    moe_plan *plan = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
    moe_weights *w = NULL;
    st = moe_checkpoint_load_weights(ck, layer, plan, &w);
    if (st != MOE_OK)
        fail_msg("load_weights: %s", moe_ctx_last_error(ctx));
    moe_checkpoint_free(ck); /* the weights are copies: the files may go */
    size_t ws = moe_plan_workspace_size(plan, T);
    void *work = malloc(ws ? ws : 1);
    assert_non_null(work);
    st = moe_plan_execute(plan, w, x, T, out, work, ws);
    if (st != MOE_OK)
        fail_msg("execute: %s", moe_ctx_last_error(ctx));
    free(work);
    moe_weights_free(w);
    moe_plan_free(plan);
}

/* Executes layer `layer` of a checkpoint of `s` and compares with ref_forward. Writes the
 * output [T, H] to out. */
static void check_against_ref(moe_ctx *ctx, const char *dir, const model_spec *s, int64_t layer,
                              float *out)
{
    enum { T = 5 };
    float *x = malloc((size_t)(T * s->H) * sizeof *x);    /* [T, H] */
    float *want = malloc((size_t)(T * s->H) * sizeof *want); /* [T, H] */
    assert_true(x && want);
    tu_fill_uniform(x, (size_t)(T * s->H), 99, -1.0f, 1.0f);
    run_layer(ctx, dir, layer, x, T, out);
    layer_w w = gen_layer(s, layer);
    ref_forward(s, &w, x, T, want);
    double diff = tu_max_abs_diff(out, want, (size_t)(T * s->H));
    double mag = tu_max_abs(want, (size_t)(T * s->H));
    if (!(mag > 1e-3) || diff > 1e-5 * (1 + mag))
        fail_msg("%s layer %lld: max |out - ref| = %g (max |ref| %g)", dir, (long long)layer, diff, mag);
    free_layer(&w);
    free(x);
    free(want);
}

/* --------------------------------------------------------------------------------------
 * Good paths
 * ------------------------------------------------------------------------------------ */

static void test_qwen3_desc(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    model_spec s = qwen3_spec();
    make_checkpoint(ctx, dir, sizeof dir, "ck-q3", &s, 1);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_QWEN3_MOE);
    assert_int_equal(moe_checkpoint_num_layers(ck), 2);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 0), 1);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 1), 1);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 2), 0);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, -1), 0);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 1, &d), MOE_OK);
    assert_int_equal(d.family, MOE_FAMILY_QWEN3_MOE);
    assert_int_equal(d.hidden_size, 16);
    assert_int_equal(d.moe_intermediate_size, 8); /* moe_intermediate_size, not intermediate_size */
    assert_int_equal(d.num_experts, 4);
    assert_int_equal(d.top_k, 2);
    assert_int_equal(d.renormalize, 1);
    assert_int_equal(d.scoring_func, MOE_SCORING_SOFTMAX);
    assert_true(d.routed_scaling_factor == 1.0f);
    assert_int_equal(d.activation, MOE_ACT_SWIGLU);
    assert_int_equal(d.shared_expert_intermediate_size, 0);
    assert_int_equal(d.shared_expert_gated, 0);
    assert_int_equal(d.weight_dtype, MOE_DTYPE_BF16);
    moe_checkpoint_free(ck);
    moe_checkpoint_free(NULL);

    /* norm_topk_prob absent: false, as transformers defaults it. F32 weights. */
    s.norm_topk = -1;
    s.wdt = MOE_DTYPE_F32;
    make_checkpoint(ctx, dir, sizeof dir, "ck-q3b", &s, 1);
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_int_equal(d.renormalize, 0);
    assert_int_equal(d.weight_dtype, MOE_DTYPE_F32);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_mixtral_and_qwen2_desc(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    model_spec m = {MOE_FAMILY_MIXTRAL, 16, 12, 8, 2, 3, 0, 0, MOE_DTYPE_BF16, MOE_DTYPE_F32, -1, 0, NULL};
    make_checkpoint(ctx, dir, sizeof dir, "ck-mx", &m, 1);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_MIXTRAL);
    for (int64_t l = 0; l < 3; l++)
        assert_int_equal(moe_checkpoint_is_moe_layer(ck, l), 1);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 2, &d), MOE_OK);
    assert_int_equal(d.family, MOE_FAMILY_MIXTRAL);
    assert_int_equal(d.moe_intermediate_size, 12);
    assert_int_equal(d.num_experts, 8);
    assert_int_equal(d.renormalize, 1); /* Mixtral always */
    assert_int_equal(d.weight_dtype, MOE_DTYPE_BF16);
    moe_checkpoint_free(ck);

    model_spec q = {MOE_FAMILY_QWEN2_MOE, 16, 8, 6, 3, 2, 20, 0, MOE_DTYPE_BF16, MOE_DTYPE_BF16, -1, 0, NULL};
    make_checkpoint(ctx, dir, sizeof dir, "ck-q2", &q, 1);
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_QWEN2_MOE);
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_int_equal(d.shared_expert_intermediate_size, 20);
    assert_int_equal(d.shared_expert_gated, 1);
    assert_int_equal(d.renormalize, 0); /* Qwen2-MoE default norm_topk_prob = false */
    assert_int_equal(d.top_k, 3);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* model_type decides when architectures is absent or not a CausalLM we know; config field
 * spellings that transformers writes are accepted. */
static void test_family_and_config_aliases(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    model_spec s = qwen3_spec();
    make_checkpoint(ctx, dir, sizeof dir, "ck-mt", &s, 1);
    write_text(dir, "config.json",
               "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_QWEN3_MOE);
    moe_checkpoint_free(ck);
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForSequenceClassification\"], \"model_type\": \"qwen3_moe\","
               " \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_QWEN3_MOE);
    moe_checkpoint_free(ck);

    /* transformers >= 5 saves Qwen3MoeConfig.num_experts as "num_local_experts". */
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
               " \"norm_topk_prob\": true, \"mlp_only_layers\": [], \"decoder_sparse_step\": 1}");
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 1, &d), MOE_OK);
    assert_int_equal(d.num_experts, 4);
    assert_int_equal(d.renormalize, 1);
    moe_checkpoint_free(ck);
    /* Neither spelling: both named. */
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, cfg, "'num_experts'",
                 "'num_local_experts'");
    moe_ctx_free(ctx);
}

/* decoder_sparse_step and mlp_only_layers decide the MoE layers; errors for the others. */
static void test_layer_rules(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    model_spec s = qwen3_spec();
    s.L = 8;
    s.sparse_step = 2;
    s.mlp_only = "[3]";
    make_checkpoint(ctx, dir, sizeof dir, "ck-rules", &s, 1);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    const int want[8] = {0, 1, 0, 0, 0, 1, 0, 1}; /* (l+1) % 2 == 0 and l != 3 */
    for (int64_t l = 0; l < 8; l++)
        assert_int_equal(moe_checkpoint_is_moe_layer(ck, l), want[l]);

    moe_layer_desc d;
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 2, &d), MOE_EDENSE, cfg, "layer 2",
                 "decoder_sparse_step", "MoE layers (3): 1, 5, 7");
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 3, &d), MOE_EDENSE, cfg, "layer 3",
                 "mlp_only_layers", "1, 5, 7");
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 8, &d), MOE_ERANGE, cfg, "layer 8",
                 "num_hidden_layers is 8", "0..7");
    expect_error(ctx, moe_checkpoint_layer_desc(ck, -1, &d), MOE_ERANGE, "layer -1", "0..7");
    moe_weights *w = (moe_weights *)(uintptr_t)1;
    expect_error(ctx, moe_checkpoint_load_weights(ck, 4, NULL, &w), MOE_EINVAL, "plan is NULL");
    assert_null(w);
    assert_int_equal(moe_checkpoint_layer_desc(ck, 5, &d), MOE_OK);
    moe_checkpoint_free(ck);

    /* num_experts 0: no MoE layer at all. */
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 0, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
               " \"shared_expert_intermediate_size\": 0}");
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 0), 0);
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 1, &d), MOE_EDENSE, "num_experts is 0",
                 "no MoE layers");
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* Issue 17: a huge num_hidden_layers is refused at open (naming the field, its value and
 * MOE_MAX_LAYERS) instead of a dense layer's message walking every layer for hours; at the
 * limit, with a long mlp_only_layers, that message is still quick. alarm() ends the test
 * (SIGALRM kills it, a failure) should either regress into a hang. */
static void test_layer_count_bounds(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    model_spec s = qwen3_spec();
    make_checkpoint(ctx, dir, sizeof dir, "ck-nlayers", &s, 1);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    alarm(60);

    s.L = 1099511627776LL;
    s.mlp_only = "[0]";
    write_config(dir, &s);
    moe_checkpoint *ck = (moe_checkpoint *)(uintptr_t)1;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) { /* the unfixed reader: what used to loop */
        moe_layer_desc d;
        (void)moe_checkpoint_layer_desc(ck, 0, &d);
        moe_checkpoint_free(ck);
        fail_msg("num_hidden_layers 1099511627776 was accepted");
    }
    expect_error(ctx, st, MOE_EFORMAT, cfg, "'num_hidden_layers'", "1099511627776", "1048576");
    assert_null(ck);
    s.L = MOE_MAX_LAYERS + 1;
    write_config(dir, &s);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'num_hidden_layers'", "1048577",
                 "1048576");

    /* At the limit: every even layer below 400000 listed dense (200000 entries). */
    enum { N_LISTED = 200000 };
    size_t cap = 16 + 8 * (size_t)N_LISTED, n = 0;
    char *list = malloc(cap);
    assert_non_null(list);
    list[n++] = '[';
    for (int i = 0; i < N_LISTED; i++)
        n += (size_t)snprintf(list + n, cap - n, "%s%d", i ? "," : "", 2 * i);
    snprintf(list + n, cap - n, "]");
    s.L = MOE_MAX_LAYERS;
    s.mlp_only = list;
    char *buf = NULL;
    { /* write_config's buffer is too small for the list: the same config, built here */
        size_t len = strlen(list) + 512;
        buf = malloc(len);
        assert_non_null(buf);
        snprintf(buf, len,
                 "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"hidden_size\": %lld,"
                 " \"moe_intermediate_size\": %lld, \"num_experts\": %lld, \"num_experts_per_tok\": %lld,"
                 " \"num_hidden_layers\": %lld, \"norm_topk_prob\": true, \"mlp_only_layers\": %s}\n",
                 (long long)s.H, (long long)s.I, (long long)s.E, (long long)s.K, (long long)s.L, list);
        write_text(dir, "config.json", buf);
    }
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_num_layers(ck), MOE_MAX_LAYERS);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 399998), 0);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 399999), 1);
    assert_int_equal(moe_checkpoint_is_moe_layer(ck, 400000), 1);
    moe_layer_desc d;
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 0, &d), MOE_EDENSE, cfg, "layer 0", "mlp_only_layers",
                 "MoE layers (848576): 1, 3, 5, 7, 9, 11, 13, 15, ...");
    moe_checkpoint_free(ck);
    alarm(0);
    free(buf);
    free(list);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* A sharded checkpoint reads the same as a single file; per-expert and stacked layouts pack
 * to the same weights: outputs bit-identical, and equal to the reference here. */
static void test_layouts_and_shards_identical(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    const model_spec specs[] = {
        {MOE_FAMILY_QWEN3_MOE, 16, 8, 4, 2, 2, 0, 0, MOE_DTYPE_BF16, MOE_DTYPE_BF16, 1, 0, NULL},
        {MOE_FAMILY_MIXTRAL, 24, 12, 8, 2, 2, 0, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, -1, 0, NULL},
        {MOE_FAMILY_QWEN2_MOE, 16, 8, 6, 3, 2, 20, 0, MOE_DTYPE_BF16, MOE_DTYPE_F32, 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        model_spec s = specs[i];
        const int64_t T = 5, layer = 1;
        float *out_per = malloc((size_t)(T * s.H) * sizeof(float));     /* [T, H] */
        float *out_stacked = malloc((size_t)(T * s.H) * sizeof(float)); /* [T, H] */
        float *out_shard = malloc((size_t)(T * s.H) * sizeof(float));   /* [T, H] */
        assert_true(out_per && out_stacked && out_shard);
        char d1[512], d2[512], d3[512];

        s.stacked = 0;
        make_checkpoint(ctx, d1, sizeof d1, "ck-per", &s, 1);
        check_against_ref(ctx, d1, &s, layer, out_per);

        s.stacked = 1;
        make_checkpoint(ctx, d2, sizeof d2, "ck-stk", &s, 1);
        check_against_ref(ctx, d2, &s, layer, out_stacked);

        s.stacked = 0;
        make_checkpoint(ctx, d3, sizeof d3, "ck-shard", &s, 3);
        check_against_ref(ctx, d3, &s, layer, out_shard);

        if (memcmp(out_per, out_stacked, (size_t)(T * s.H) * sizeof(float)) != 0)
            fail_msg("%s: stacked layout output differs from per-expert", moe_family_name(s.family));
        if (memcmp(out_per, out_shard, (size_t)(T * s.H) * sizeof(float)) != 0)
            fail_msg("%s: sharded output differs from single file", moe_family_name(s.family));
        free(out_per);
        free(out_stacked);
        free(out_shard);
    }
    moe_ctx_free(ctx);
}

/* Safetensors does not promise aligned tensor data: a 1-byte tensor first puts every weight
 * at an odd address. Loading must still give the reference numbers (and no misaligned loads
 * under UBSan). */
static void test_unaligned_tensor_data(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    model_spec s = qwen3_spec();
    s.wdt = MOE_DTYPE_BF16;
    s.rdt = MOE_DTYPE_F32;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "ck-odd");
    write_config(dir, &s);
    tlist tl = {0};
    const float one = 1.0f;
    tl_add(&tl, "a.odd", MOE_DTYPE_U8, 1, (int64_t[]){1}, &one);
    build_tensors(&s, &tl);
    write_weights(ctx, dir, &tl, 1);
    tl_free(&tl);

    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    moe_tensor_info info;
    assert_int_equal(moe_safetensors_get(f, "model.layers.1.mlp.experts.0.gate_proj.weight", &info), MOE_OK);
    assert_int_equal((uintptr_t)info.data % 2, 1); /* really misaligned for BF16 */
    moe_safetensors_free(f);
    float out[5 * 16]; /* [T, H] */
    check_against_ref(ctx, dir, &s, 1, out);
    moe_ctx_free(ctx);
}

/* load_weights refuses a plan compiled from another description. */
static void test_plan_mismatch(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    model_spec s = qwen3_spec();
    make_checkpoint(ctx, dir, sizeof dir, "ck-plan", &s, 1);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);

    moe_layer_desc other = d;
    other.top_k = 3;
    moe_plan *plan = NULL;
    assert_int_equal(moe_plan_create(ctx, &other, &plan), MOE_OK);
    moe_weights *w = NULL;
    expect_error(ctx, moe_checkpoint_load_weights(ck, 0, plan, &w), MOE_EINVAL, "'top_k'", "3", "2");
    assert_null(w);
    moe_plan_free(plan);

    other = d;
    other.weight_dtype = MOE_DTYPE_F32;
    assert_int_equal(moe_plan_create(ctx, &other, &plan), MOE_OK);
    expect_error(ctx, moe_checkpoint_load_weights(ck, 0, plan, &w), MOE_EINVAL, "'weight_dtype'",
                 "F32", "BF16");
    moe_plan_free(plan);

    other = d;
    other.hidden_size = 32;
    assert_int_equal(moe_plan_create(ctx, &other, &plan), MOE_OK);
    expect_error(ctx, moe_checkpoint_load_weights(ck, 0, plan, &w), MOE_EINVAL, "'hidden_size'",
                 "32", "16");
    moe_plan_free(plan);

    assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
    assert_int_equal(moe_checkpoint_load_weights(ck, 0, plan, &w), MOE_OK);
    assert_non_null(w);
    /* w13 + w2 of E experts in bf16, plus nothing shared */
    assert_true(moe_weights_expert_bytes(w) >= (size_t)(4 * 3 * 8 * 16 * 2));
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* --------------------------------------------------------------------------------------
 * Errors: folder and config.json
 * ------------------------------------------------------------------------------------ */

static void test_config_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    model_spec s = qwen3_spec();
    make_checkpoint(ctx, dir, sizeof dir, "ck-cfg", &s, 1);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    moe_checkpoint *ck = (moe_checkpoint *)(uintptr_t)1;

    /* Missing config.json. */
    assert_int_equal(unlink(cfg), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, cfg, "not found");
    assert_null(ck);
    char nodir[700];
    snprintf(nodir, sizeof nodir, "%s/nonexistent", dir);
    expect_error(ctx, moe_checkpoint_open(ctx, nodir, &ck), MOE_ENOTFOUND, "nonexistent: checkpoint folder does not exist");

    /* Not JSON. */
    write_text(dir, "config.json", "{\"hidden_size\": 16,");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "not valid JSON");
    write_text(dir, "config.json", "[1]");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "JSON object");

    /* Unknown architecture: named, with the supported families (by name: the architecture
     * classes of all 50 would not fit a message; docs/families.md lists them) and the nearest. */
    write_text(dir, "config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 16}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED, cfg, "'LlamaForCausalLM'",
                 "nearest family name: llama4", "mixtral, qwen2_moe, qwen3_moe", "docs/families.md");
    write_text(dir, "config.json", "{\"model_type\": \"switch_transformers\", \"hidden_size\": 16}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED, cfg, "'switch_transformers'",
                 "deepseek_v3", "gpt_oss", "llama4", "granitemoe", "glm5_next",
                 "step3p7, deepseek_ocr2, unlimited_ocr, mistral_large4, nemotron_h, dbrx, ernie4_5_vl_moe, dots3_note)");
    write_text(dir, "config.json", "{\"architectures\": \"MixtralForCausalLM\"}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'architectures' must be an array",
                 "found a string (\"MixtralForCausalLM\")");

    /* An activation the experts do not compute is refused by name, never computed as silu. */
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, \"hidden_act\": \"relu\"}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED, cfg, "'hidden_act'", "relu", "silu", "gelu");
    write_text(dir, "config.json",
               "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 16, \"intermediate_size\": 8,"
               " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, \"hidden_act\": 3}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'hidden_act' must be a string",
                 "found an integer (3)");

    /* Missing and mistyped fields, each named. */
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, cfg, "'hidden_size'");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": \"16\", \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'hidden_size' must be an integer",
                 "found a string (\"16\")");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, cfg, "'moe_intermediate_size'");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, \"norm_topk_prob\": 1}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'norm_topk_prob' must be true or false",
                 "found an integer (1)");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, \"decoder_sparse_step\": 0}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'decoder_sparse_step'", ">= 1");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2, \"mlp_only_layers\": [\"1\"]}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'mlp_only_layers'[0]",
                 "found a string (\"1\")");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": [2], \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'num_experts_per_tok' must be an integer",
                 "found an array");
    /* quant_method in another case: refused as transformers refuses it (quantizers/auto.py
     * matches it exactly), naming the spelling meant */
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
               " \"quantization_config\": {\"quant_method\": \"GPTQ\", \"bits\": 4}}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED, cfg, "quant_method' = 'GPTQ'",
                 "did you mean 'gptq'?");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
               " \"quantization_config\": {\"quant_method\": \"Fp8\"}}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED, cfg, "did you mean 'fp8'?");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
               " \"quantization_config\": {\"quant_method\": 4}}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "quant_method' must be a string",
                 "found an integer (4)");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 5, \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'num_experts_per_tok'");
    write_text(dir, "config.json",
               "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"hidden_size\": 16, \"moe_intermediate_size\": 8,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, cfg,
                 "'shared_expert_intermediate_size'");
    write_text(dir, "config.json",
               "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 16, \"intermediate_size\": 8,"
               " \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, cfg, "'num_local_experts'",
                 "'num_experts'");
    write_text(dir, "config.json",
               "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 16, \"intermediate_size\": 8,"
               " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2.5}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, cfg, "'num_hidden_layers'",
                 "real number");
    assert_null(ck);
    moe_ctx_free(ctx);
}

static void test_weight_file_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[700];
    model_spec s = qwen3_spec();
    moe_checkpoint *ck = NULL;

    /* Neither weights file. */
    make_checkpoint(ctx, dir, sizeof dir, "ck-files", &s, 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, dir, "model.safetensors.index.json");

    /* A bad safetensors file: its own message, naming the file. */
    assert_int_equal(tu_write_file(path, "\x04\0\0\0\0\0\0\0{}", 10), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, path, "header length");

    /* Sharded: a listed shard is missing. */
    make_checkpoint(ctx, dir, sizeof dir, "ck-shards", &s, 2);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(unlink(path), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, path,
                 "model.safetensors.index.json");

    /* Index without weight_map, and with a path outside the folder. */
    write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_ENOTFOUND, "model.safetensors.index.json",
                 "'weight_map'");
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.layers.0.mlp.gate.weight\": \"../x.safetensors\"}}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, "model.safetensors.index.json",
                 "'../x.safetensors'");
    write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": 1}}");
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EFORMAT, "model.safetensors.index.json",
                 "'a'");
    assert_null(ck);

    /* Sharded: a tensor missing from weight_map, and one mapped to a shard that lacks it. */
    make_checkpoint(ctx, dir, sizeof dir, "ck-map", &s, 2);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    json_error_t jerr;
    json_t *idx = json_load_file(path, 0, &jerr);
    assert_non_null(idx);
    json_t *wm = json_object_get(idx, "weight_map");
    const char *moved = "model.layers.1.mlp.experts.2.up_proj.weight";
    const char *where = json_string_value(json_object_get(wm, moved));
    const char *other = strstr(where, "00001-of") ? "model-00002-of-00002.safetensors"
                                                  : "model-00001-of-00002.safetensors";
    json_object_set_new(wm, moved, json_string(other));
    json_object_del(wm, "model.layers.0.mlp.experts.3.down_proj.weight");
    assert_int_equal(json_dump_file(idx, path, 0), 0);
    json_decref(idx);
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 0, &d), MOE_ENOTFOUND, path,
                 "'model.layers.0.mlp.experts.3.down_proj.weight'", "weight_map");
    char shard[700];
    snprintf(shard, sizeof shard, "%s/%s", dir, other);
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 1, &d), MOE_EFORMAT, shard, moved,
                 "model.safetensors.index.json");
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* A checkpoint for the file tests below: dir, and its config.json, model.safetensors, index
 * (absent) and a spare name beside them. */
typedef struct kind_ck {
    char dir[512], cfg[700], st[700], idx[700], keep[700];
} kind_ck;

static void kind_ck_make(moe_ctx *ctx, kind_ck *k, const char *tag)
{
    model_spec s = qwen3_spec();
    make_checkpoint(ctx, k->dir, sizeof k->dir, tag, &s, 1);
    snprintf(k->cfg, sizeof k->cfg, "%s/config.json", k->dir);
    snprintf(k->st, sizeof k->st, "%s/model.safetensors", k->dir);
    snprintf(k->idx, sizeof k->idx, "%s/model.safetensors.index.json", k->dir);
    snprintf(k->keep, sizeof k->keep, "%s/keep", k->dir);
}

/* A sparse file of `size` bytes at `path` (nothing written). */
static void make_sparse(const char *path, uint64_t size)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(ftruncate(fileno(fp), (off_t)size), 0);
    fclose(fp);
}

/* Issue 17: config.json, model.safetensors and the index as FIFOs are refused naming the file
 * and its type, never opened for reading (which waits for a writer forever: alarm() ends the
 * test if one blocks); a directory is named as one. */
static void test_fifo_files(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    kind_ck k;
    kind_ck_make(ctx, &k, "ck-fifo");
    moe_checkpoint *ck = (moe_checkpoint *)(uintptr_t)1;
    alarm(60);
    assert_int_equal(rename(k.cfg, k.keep), 0);
    assert_int_equal(mkfifo(k.cfg, 0600), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EIO, k.cfg, "is a FIFO", "not a regular file");
    assert_null(ck);
    assert_int_equal(unlink(k.cfg), 0);
    assert_int_equal(mkdir(k.cfg, 0700), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EIO, k.cfg, "is a directory");
    assert_int_equal(rmdir(k.cfg), 0);
    assert_int_equal(rename(k.keep, k.cfg), 0);

    assert_int_equal(rename(k.st, k.keep), 0);
    assert_int_equal(mkfifo(k.st, 0600), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EIO, k.st, "is a FIFO", "not a regular file");
    assert_int_equal(unlink(k.st), 0);
    assert_int_equal(mkfifo(k.idx, 0600), 0); /* no model.safetensors: the index is read */
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EIO, k.idx, "is a FIFO", "not a regular file");
    assert_null(ck);
    assert_int_equal(unlink(k.idx), 0);
    assert_int_equal(rename(k.keep, k.st), 0);
    assert_int_equal(moe_checkpoint_open(ctx, k.dir, &ck), MOE_OK); /* as it was */
    moe_checkpoint_free(ck);
    alarm(0);
    tu_rm_tree(k.dir);
    moe_ctx_free(ctx);
}

/* Issue 17: config.json and the index one byte over MOE_CONFIG_MAX_BYTES / MOE_INDEX_MAX_BYTES
 * (sparse files) are refused before reading, naming the file, its size and the limit; at the
 * limit the file is read (and here fails as JSON: zero bytes). */
static void test_json_size_limits(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    kind_ck k;
    kind_ck_make(ctx, &k, "ck-big");
    moe_checkpoint *ck = (moe_checkpoint *)(uintptr_t)1;
    alarm(120);
    assert_int_equal(rename(k.cfg, k.keep), 0);
    make_sparse(k.cfg, MOE_CONFIG_MAX_BYTES + 1);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EFORMAT, k.cfg, "16777217 bytes", "16777216-byte",
                 "16 MiB", "MOE_CONFIG_MAX_BYTES");
    assert_null(ck);
    make_sparse(k.cfg, MOE_CONFIG_MAX_BYTES);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EFORMAT, k.cfg, "not valid JSON");
    assert_int_equal(unlink(k.cfg), 0);
    assert_int_equal(rename(k.keep, k.cfg), 0);

    assert_int_equal(rename(k.st, k.keep), 0);
    make_sparse(k.idx, MOE_INDEX_MAX_BYTES + 1);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EFORMAT, k.idx, "67108865 bytes", "67108864-byte",
                 "64 MiB", "MOE_INDEX_MAX_BYTES");
    assert_null(ck);
    assert_int_equal(unlink(k.idx), 0);
    assert_int_equal(rename(k.keep, k.st), 0);
    alarm(0);
    tu_rm_tree(k.dir);
    moe_ctx_free(ctx);
}

/* Issue 17: a model.safetensors (or index) that is a symlink loop reports ELOOP naming the
 * file, not "neither model.safetensors nor ... found". */
static void test_weights_symlink_loop(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    kind_ck k;
    kind_ck_make(ctx, &k, "ck-loop");
    moe_checkpoint *ck = (moe_checkpoint *)(uintptr_t)1;
    assert_int_equal(unlink(k.st), 0);
    assert_int_equal(symlink("model.safetensors", k.st), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EIO, k.st, strerror(ELOOP));
    if (strstr(moe_ctx_last_error(ctx), "neither"))
        fail_msg("a symlink loop reported as missing: %s", moe_ctx_last_error(ctx));
    assert_null(ck);
    assert_int_equal(unlink(k.st), 0);
    assert_int_equal(symlink("model.safetensors.index.json", k.idx), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_EIO, k.idx, strerror(ELOOP));
    if (strstr(moe_ctx_last_error(ctx), "neither"))
        fail_msg("a symlink loop reported as missing: %s", moe_ctx_last_error(ctx));
    assert_int_equal(unlink(k.idx), 0);
    tu_rm_tree(k.dir);
    moe_ctx_free(ctx);
}

/* Issue 17: a model.safetensors, index, shard or config.json that is a dangling symlink is
 * reported as one, naming its target, not "not found" / "neither ... found". */
static void test_dangling_symlink(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    kind_ck k;
    kind_ck_make(ctx, &k, "ck-dangling");
    moe_checkpoint *ck = (moe_checkpoint *)(uintptr_t)1;
    char target[800];
    snprintf(target, sizeof target, "%s/gone/model-00001.safetensors", k.dir);
    /* the single file */
    assert_int_equal(rename(k.st, k.keep), 0);
    assert_int_equal(symlink(target, k.st), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_ENOTFOUND, k.st, "is a dangling symlink to", target,
                 "which does not exist");
    assert_null(strstr(moe_ctx_last_error(ctx), "neither"));
    assert_null(ck);
    /* a relative target is named as the link holds it */
    assert_int_equal(unlink(k.st), 0);
    assert_int_equal(symlink("shards/w.safetensors", k.st), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_ENOTFOUND, k.st,
                 "dangling symlink to 'shards/w.safetensors'");
    assert_int_equal(unlink(k.st), 0);
    /* the index */
    assert_int_equal(symlink(target, k.idx), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_ENOTFOUND, k.idx, "is a dangling symlink to", target);
    assert_null(strstr(moe_ctx_last_error(ctx), "neither"));
    assert_int_equal(unlink(k.idx), 0);
    /* a shard the index lists */
    char shard[800], idx_text[1024];
    snprintf(shard, sizeof shard, "%s/model-00001-of-00001.safetensors", k.dir);
    assert_int_equal(symlink(target, shard), 0);
    snprintf(idx_text, sizeof idx_text, "{\"weight_map\": {\"lm_head.weight\": \"model-00001-of-00001.safetensors\"}}");
    assert_int_equal(tu_write_file(k.idx, idx_text, strlen(idx_text)), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_ENOTFOUND, shard, "is a dangling symlink to", target);
    assert_int_equal(unlink(k.idx), 0);
    assert_int_equal(unlink(shard), 0);
    assert_int_equal(rename(k.keep, k.st), 0);
    /* config.json */
    assert_int_equal(rename(k.cfg, k.keep), 0);
    assert_int_equal(symlink(target, k.cfg), 0);
    expect_error(ctx, moe_checkpoint_open(ctx, k.dir, &ck), MOE_ENOTFOUND, k.cfg, "is a dangling symlink to", target);
    assert_int_equal(unlink(k.cfg), 0);
    assert_int_equal(rename(k.keep, k.cfg), 0);
    /* restored: it opens */
    assert_int_equal(moe_checkpoint_open(ctx, k.dir, &ck), MOE_OK);
    moe_checkpoint_free(ck);
    tu_rm_tree(k.dir);
    moe_ctx_free(ctx);
}

/* --------------------------------------------------------------------------------------
 * Errors: tensors
 * ------------------------------------------------------------------------------------ */

/* Build a Qwen3 (or `s`) checkpoint, let `edit` change its tensors, and expect layer_desc and
 * load_weights of layer 0 to fail with `want` and a message naming the file and `subs`. */
typedef void (*edit_fn)(tlist *tl, const model_spec *s);

static void check_tensor_error(const model_spec *s, edit_fn edit, moe_status want,
                               const char *const *subs)
{
    moe_ctx *ctx = tu_ctx();
    char dir[512], file[700];
    tu_tmpdir(dir, sizeof dir, "ck-tensor");
    write_config(dir, s);
    tlist tl = {0};
    build_tensors(s, &tl);
    edit(&tl, s);
    write_weights(ctx, dir, &tl, 1);
    tl_free(&tl);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);

    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    moe_status st = moe_checkpoint_layer_desc(ck, 0, &d);
    const char *with_file[] = {file, NULL};
    tu_check_error(ctx, st, want, with_file);
    tu_check_error(ctx, st, want, subs);

    /* load_weights re-checks and fails the same way, whatever plan it is given. */
    moe_layer_desc good;
    moe_layer_desc_init(&good);
    good.family = s->family;
    good.hidden_size = s->H;
    good.moe_intermediate_size = s->I;
    good.num_experts = s->E;
    good.top_k = s->K;
    moe_plan *plan = NULL;
    assert_int_equal(moe_plan_create(ctx, &good, &plan), MOE_OK);
    moe_weights *w = NULL;
    st = moe_checkpoint_load_weights(ck, 0, plan, &w);
    tu_check_error(ctx, st, want, subs);
    assert_null(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}
#define expect_tensor_error(s, edit, want, ...) \
    check_tensor_error((s), (edit), (want), (const char *const[]){__VA_ARGS__, NULL})

static const float zeros[4096];

static void edit_drop_up(tlist *tl, const model_spec *s)
{
    (void)s;
    tl_remove(tl, "model.layers.0.mlp.experts.1.up_proj.weight");
}

static void edit_drop_router(tlist *tl, const model_spec *s)
{
    (void)s;
    tl_remove(tl, "model.layers.0.mlp.gate.weight");
}

static void edit_expert_f16(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.experts.2.down_proj.weight", MOE_DTYPE_F16, 2,
               (int64_t[]){s->H, s->I}, zeros);
}

static void edit_expert_i32(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.experts.0.gate_proj.weight", MOE_DTYPE_I32, 2,
               (int64_t[]){s->I, s->H}, zeros);
}

static void edit_router_i64(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.gate.weight", MOE_DTYPE_I64, 2, (int64_t[]){s->E, s->H}, zeros);
}

static void edit_gate_shape(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.experts.3.gate_proj.weight", s->wdt, 2,
               (int64_t[]){s->I + 1, s->H}, zeros);
}

static void edit_down_transposed(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.experts.0.down_proj.weight", s->wdt, 2,
               (int64_t[]){s->I, s->H}, zeros);
}

static void edit_router_shape(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.gate.weight", s->rdt, 2, (int64_t[]){s->E - 1, s->H}, zeros);
}

static void edit_stacked_shape(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.experts.gate_up_proj", s->wdt, 3,
               (int64_t[]){s->E, s->I, s->H}, zeros);
}

static void edit_stacked_dtype(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.experts.down_proj", MOE_DTYPE_F32, 3,
               (int64_t[]){s->E, s->H, s->I}, zeros);
}

static void edit_shared_gate_shape(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.shared_expert_gate.weight", s->rdt, 1, (int64_t[]){s->H}, zeros);
}

static void edit_shared_dtype(tlist *tl, const model_spec *s)
{
    tl_replace(tl, "model.layers.0.mlp.shared_expert.up_proj.weight", MOE_DTYPE_F32, 2,
               (int64_t[]){s->Is, s->H}, zeros);
}

static void edit_mixtral_drop_w3(tlist *tl, const model_spec *s)
{
    (void)s;
    tl_remove(tl, "model.layers.0.block_sparse_moe.experts.5.w3.weight");
}

static void test_tensor_errors(void **state)
{
    (void)state;
    model_spec s = qwen3_spec();
    expect_tensor_error(&s, edit_drop_up, MOE_ENOTFOUND,
                        "'model.layers.0.mlp.experts.1.up_proj.weight' not found");
    expect_tensor_error(&s, edit_drop_router, MOE_ENOTFOUND, "'model.layers.0.mlp.gate.weight'");
    expect_tensor_error(&s, edit_expert_f16, MOE_EDTYPE, "'model.layers.0.mlp.experts.2.down_proj.weight'",
                        "expected BF16", "found F16");
    expect_tensor_error(&s, edit_expert_i32, MOE_EDTYPE, "'model.layers.0.mlp.experts.0.gate_proj.weight'",
                        "F32, BF16 or F16", "found I32");
    expect_tensor_error(&s, edit_router_i64, MOE_EDTYPE, "'model.layers.0.mlp.gate.weight'", "router",
                        "found I64");
    expect_tensor_error(&s, edit_gate_shape, MOE_ESHAPE, "'model.layers.0.mlp.experts.3.gate_proj.weight'",
                        "expected [I, H] = [8, 16]", "found [9, 16]");
    expect_tensor_error(&s, edit_down_transposed, MOE_ESHAPE,
                        "'model.layers.0.mlp.experts.0.down_proj.weight'", "[H, I] = [16, 8]",
                        "found [8, 16]");
    expect_tensor_error(&s, edit_router_shape, MOE_ESHAPE, "'model.layers.0.mlp.gate.weight'",
                        "[E, H] = [4, 16]", "found [3, 16]");

    model_spec st = qwen3_spec();
    st.stacked = 1;
    expect_tensor_error(&st, edit_stacked_shape, MOE_ESHAPE, "'model.layers.0.mlp.experts.gate_up_proj'",
                        "[E, 2I, H] = [4, 16, 16]", "found [4, 8, 16]");
    expect_tensor_error(&st, edit_stacked_dtype, MOE_EDTYPE, "'model.layers.0.mlp.experts.down_proj'",
                        "expected BF16", "found F32");

    model_spec q2 = {MOE_FAMILY_QWEN2_MOE, 16, 8, 4, 2, 1, 12, 0, MOE_DTYPE_BF16, MOE_DTYPE_BF16, 1, 0, NULL};
    expect_tensor_error(&q2, edit_shared_gate_shape, MOE_ESHAPE,
                        "'model.layers.0.mlp.shared_expert_gate.weight'", "[1, H] = [1, 16]", "found [16]");
    expect_tensor_error(&q2, edit_shared_dtype, MOE_EDTYPE,
                        "'model.layers.0.mlp.shared_expert.up_proj.weight'", "expected BF16", "found F32");

    model_spec mx = {MOE_FAMILY_MIXTRAL, 16, 8, 8, 2, 1, 0, 0, MOE_DTYPE_BF16, MOE_DTYPE_BF16, -1, 0, NULL};
    expect_tensor_error(&mx, edit_mixtral_drop_w3, MOE_ENOTFOUND,
                        "'model.layers.0.block_sparse_moe.experts.5.w3.weight'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_desc),
        cmocka_unit_test(test_mixtral_and_qwen2_desc),
        cmocka_unit_test(test_family_and_config_aliases),
        cmocka_unit_test(test_layer_rules),
        cmocka_unit_test(test_layer_count_bounds),
        cmocka_unit_test(test_layouts_and_shards_identical),
        cmocka_unit_test(test_unaligned_tensor_data),
        cmocka_unit_test(test_plan_mismatch),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_weight_file_errors),
        cmocka_unit_test(test_fifo_files),
        cmocka_unit_test(test_json_size_limits),
        cmocka_unit_test(test_weights_symlink_loop),
        cmocka_unit_test(test_dangling_symlink),
        cmocka_unit_test(test_tensor_errors),
    };
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
