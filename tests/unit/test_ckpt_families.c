/* Checkpoint adapters of the families beyond Mixtral / Qwen2/3-MoE (test_checkpoint.c has
 * those): DeepSeek-V2/V3, gpt-oss (bf16), Llama-4, OLMoE, Granite-MoE, Qwen3.5-MoE and
 * Qwen3-Next, each written here as a tiny checkpoint with the tensor names, layouts and
 * config.json fields that transformers 5.24 writes (or the released checkpoints use).
 *
 * For each: the layer description (every routing and expert field), the MoE-layer rules
 * (dense layers refused with the config field that makes them dense), and the output of
 * `moe_checkpoint_load_weights` + execute, which must be bit-identical to src/ref run on a
 * plain row-major f32 copy of the same weights (so names, layouts, strides, interleaving and
 * biases are all read as the model means them). Then the family-specific errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe.h"
#include "quant/convert.h"
#include "ref/ref.h"
#include "testutil.h"

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* ---- tensors to write ------------------------------------------------------------------ */

typedef struct tlist {
    moe_tensor_out t[512];
    size_t n;
} tlist;

/* Append `name` [shape] holding the f32 values v (exact in dt: see rounded()). */
static void tl_add(tlist *tl, const char *name, moe_dtype dt, int ndim, const int64_t *shape, const float *v)
{
    assert_true(tl->n < 512);
    moe_tensor_out *t = &tl->t[tl->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        n *= (size_t)shape[d];
    }
    if (dt == MOE_DTYPE_F32) {
        float *b = malloc(n * 4 + 4);
        memcpy(b, v, n * 4);
        t->data = b;
    } else {
        uint16_t *b = malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++)
            b[i] = dt == MOE_DTYPE_BF16 ? moe_f32_to_bf16(v[i]) : moe_f32_to_f16(v[i]);
        t->data = b;
    }
}

static void tl_free(tlist *tl)
{
    for (size_t i = 0; i < tl->n; i++) {
        free((void *)tl->t[i].name);
        free((void *)tl->t[i].data);
    }
    tl->n = 0;
}

/* n uniform values in [-a, a), rounded to dt (so the f32 copy is exactly what is stored). */
static float *rounded(size_t n, uint64_t seed, float a, moe_dtype dt)
{
    float *x = malloc(sizeof(float) * (n ? n : 1));
    tu_fill_uniform(x, n, seed, -a, a);
    for (size_t i = 0; i < n && dt == MOE_DTYPE_BF16; i++)
        x[i] = moe_bf16_to_f32(moe_f32_to_bf16(x[i]));
    return x;
}

/* ---- a family checkpoint --------------------------------------------------------------- */

enum { L_PER_EXPERT, L_STACKED, L_GRANITE, L_LLAMA4, L_GPTOSS };

typedef struct fspec {
    const char *tag;
    moe_family family;
    const char *config;       /* config.json text */
    int64_t H, I, E, K, L, Is;
    const char *prefix;       /* "model.layers.%lld.mlp." */
    const char *router;       /* "gate.weight" */
    int layout;
    const char *shared;       /* "shared_expert", "shared_experts" or NULL */
    int shared_gated;
    int sel_bias, router_bias;
    const char *sel_bias_name; /* the selection bias' full name, "%lld" = the layer (NULL:
                                  P gate.e_score_correction_bias) */
    moe_dtype wdt;
    const char *moe_mask;     /* one char per layer: '1' MoE, '0' dense */
    const char *dense_why;    /* a substring of the first dense layer's EDENSE message */
    moe_layer_desc want;      /* the description the adapter must give */
} fspec;

/* One MoE layer's weights as f32 (exact in wdt), row-major. */
typedef struct fweights {
    float *router, *gate, *up, *down;   /* [E,H], [E,I,H], [E,I,H], [E,H,I] */
    float *sg, *su, *sd, *sgw;          /* [Is,H], [Is,H], [H,Is], [H] */
    float *rbias, *sbias;               /* [E] */
    float *gbias, *ubias, *dbias;       /* [E,I], [E,I], [E,H] */
} fweights;

static fweights gen_weights(const fspec *s, int64_t layer)
{
    const size_t E = (size_t)s->E, H = (size_t)s->H, I = (size_t)s->I, Is = (size_t)s->Is;
    const uint64_t b = 100 * (uint64_t)(layer + 1);
    fweights w;
    memset(&w, 0, sizeof w);
    w.router = rounded(E * H, b + 1, 1.0f, s->wdt);
    w.gate = rounded(E * I * H, b + 2, s->family == MOE_FAMILY_GPT_OSS ? 3.0f : 0.5f, s->wdt);
    w.up = rounded(E * I * H, b + 3, s->family == MOE_FAMILY_GPT_OSS ? 3.0f : 0.5f, s->wdt);
    w.down = rounded(E * H * I, b + 4, 0.5f, s->wdt);
    if (Is) {
        w.sg = rounded(Is * H, b + 5, 0.5f, s->wdt);
        w.su = rounded(Is * H, b + 6, 0.5f, s->wdt);
        w.sd = rounded(H * Is, b + 7, 0.5f, s->wdt);
        w.sgw = rounded(H, b + 8, 1.0f, s->wdt);
    }
    if (s->router_bias)
        w.rbias = rounded(E, b + 9, 1.0f, s->wdt);
    if (s->sel_bias)
        w.sbias = rounded(E, b + 10, 0.2f, MOE_DTYPE_F32);
    if (s->layout == L_GPTOSS) {
        w.gbias = rounded(E * I, b + 11, 1.0f, s->wdt);
        w.ubias = rounded(E * I, b + 12, 1.0f, s->wdt);
        w.dbias = rounded(E * H, b + 13, 0.5f, s->wdt);
    }
    return w;
}

static void free_weights(fweights *w)
{
    free(w->router);
    free(w->gate);
    free(w->up);
    free(w->down);
    free(w->sg);
    free(w->su);
    free(w->sd);
    free(w->sgw);
    free(w->rbias);
    free(w->sbias);
    free(w->gbias);
    free(w->ubias);
    free(w->dbias);
}

static void add_layer(const fspec *s, int64_t layer, const fweights *w, tlist *tl)
{
    const int64_t E = s->E, H = s->H, I = s->I, Is = s->Is;
    char p[160], name[320];
    snprintf(p, sizeof p, s->prefix, (long long)layer);
    snprintf(name, sizeof name, "%s%s", p, s->router);
    tl_add(tl, name, s->wdt, 2, (int64_t[]){E, H}, w->router);
    if (s->router_bias) {
        snprintf(name, sizeof name, "%srouter.bias", p);
        tl_add(tl, name, s->wdt, 1, (int64_t[]){E}, w->rbias);
    }
    if (s->sel_bias && s->sel_bias_name) {
        snprintf(name, sizeof name, s->sel_bias_name, (long long)layer);
        tl_add(tl, name, MOE_DTYPE_F32, 1, (int64_t[]){E}, w->sbias);
    } else if (s->sel_bias) {
        snprintf(name, sizeof name, "%sgate.e_score_correction_bias", p);
        tl_add(tl, name, MOE_DTYPE_F32, 1, (int64_t[]){E}, w->sbias);
    }
    if (s->layout == L_PER_EXPERT) {
        for (int64_t e = 0; e < E; e++) {
            snprintf(name, sizeof name, "%sexperts.%lld.gate_proj.weight", p, (long long)e);
            tl_add(tl, name, s->wdt, 2, (int64_t[]){I, H}, w->gate + e * I * H);
            snprintf(name, sizeof name, "%sexperts.%lld.up_proj.weight", p, (long long)e);
            tl_add(tl, name, s->wdt, 2, (int64_t[]){I, H}, w->up + e * I * H);
            snprintf(name, sizeof name, "%sexperts.%lld.down_proj.weight", p, (long long)e);
            tl_add(tl, name, s->wdt, 2, (int64_t[]){H, I}, w->down + e * H * I);
        }
    } else if (s->layout == L_STACKED || s->layout == L_GRANITE) {
        float *gu = malloc(sizeof(float) * (size_t)(E * 2 * I * H)); /* [E, 2I, H] */
        for (int64_t e = 0; e < E; e++) {
            memcpy(gu + e * 2 * I * H, w->gate + e * I * H, sizeof(float) * (size_t)(I * H));
            memcpy(gu + e * 2 * I * H + I * H, w->up + e * I * H, sizeof(float) * (size_t)(I * H));
        }
        const int gr = s->layout == L_GRANITE;
        snprintf(name, sizeof name, "%s%s", p, gr ? "input_linear.weight" : "experts.gate_up_proj");
        tl_add(tl, name, s->wdt, 3, (int64_t[]){E, 2 * I, H}, gu);
        snprintf(name, sizeof name, "%s%s", p, gr ? "output_linear.weight" : "experts.down_proj");
        tl_add(tl, name, s->wdt, 3, (int64_t[]){E, H, I}, w->down);
        free(gu);
    } else {
        /* input-major [E, H, 2I]: Llama-4 halves, gpt-oss interleaved; down [E, I, H] */
        const int inter = s->layout == L_GPTOSS;
        float *gu = malloc(sizeof(float) * (size_t)(E * 2 * I * H));
        float *dn = malloc(sizeof(float) * (size_t)(E * I * H));
        for (int64_t e = 0; e < E; e++)
            for (int64_t i = 0; i < H; i++)
                for (int64_t o = 0; o < I; o++) {
                    float g = w->gate[(e * I + o) * H + i], u = w->up[(e * I + o) * H + i];
                    gu[e * H * 2 * I + i * 2 * I + (inter ? 2 * o : o)] = g;
                    gu[e * H * 2 * I + i * 2 * I + (inter ? 2 * o + 1 : I + o)] = u;
                }
        for (int64_t e = 0; e < E; e++)
            for (int64_t o = 0; o < H; o++)
                for (int64_t i = 0; i < I; i++)
                    dn[e * I * H + i * H + o] = w->down[(e * H + o) * I + i];
        snprintf(name, sizeof name, "%sexperts.gate_up_proj", p);
        tl_add(tl, name, s->wdt, 3, (int64_t[]){E, H, 2 * I}, gu);
        snprintf(name, sizeof name, "%sexperts.down_proj", p);
        tl_add(tl, name, s->wdt, 3, (int64_t[]){E, I, H}, dn);
        if (inter) {
            float *gb = malloc(sizeof(float) * (size_t)(E * 2 * I));
            for (int64_t e = 0; e < E; e++)
                for (int64_t o = 0; o < I; o++) {
                    gb[e * 2 * I + 2 * o] = w->gbias[e * I + o];
                    gb[e * 2 * I + 2 * o + 1] = w->ubias[e * I + o];
                }
            snprintf(name, sizeof name, "%sexperts.gate_up_proj_bias", p);
            tl_add(tl, name, s->wdt, 2, (int64_t[]){E, 2 * I}, gb);
            snprintf(name, sizeof name, "%sexperts.down_proj_bias", p);
            tl_add(tl, name, s->wdt, 2, (int64_t[]){E, H}, w->dbias);
            free(gb);
        }
        free(gu);
        free(dn);
    }
    if (Is > 0) {
        snprintf(name, sizeof name, "%s%s.gate_proj.weight", p, s->shared);
        tl_add(tl, name, s->wdt, 2, (int64_t[]){Is, H}, w->sg);
        snprintf(name, sizeof name, "%s%s.up_proj.weight", p, s->shared);
        tl_add(tl, name, s->wdt, 2, (int64_t[]){Is, H}, w->su);
        snprintf(name, sizeof name, "%s%s.down_proj.weight", p, s->shared);
        tl_add(tl, name, s->wdt, 2, (int64_t[]){H, Is}, w->sd);
        if (s->shared_gated) {
            snprintf(name, sizeof name, "%sshared_expert_gate.weight", p);
            tl_add(tl, name, s->wdt, 2, (int64_t[]){1, H}, w->sgw);
        }
    }
}

static void make_ckpt(moe_ctx *ctx, const fspec *s, char *dir, size_t len, tlist *tl)
{
    tu_tmpdir(dir, len, s->tag);
    write_text(dir, "config.json", s->config);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    for (int64_t l = 0; l < s->L; l++) {
        if (s->moe_mask[l] != '1')
            continue;
        fweights w = gen_weights(s, l);
        add_layer(s, l, &w, tl);
        free_weights(&w);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(moe_safetensors_write(ctx, path, tl->t, tl->n), MOE_OK);
}

static void assert_desc(const char *tag, const moe_layer_desc *got, const moe_layer_desc *want)
{
#define CHK(f)                                                                                              \
    if ((long long)got->f != (long long)want->f)                                                             \
        fail_msg("%s: desc.%s = %lld, want %lld", tag, #f, (long long)got->f, (long long)want->f);
    CHK(family) CHK(hidden_size) CHK(moe_intermediate_size) CHK(num_experts) CHK(top_k) CHK(scoring_func)
    CHK(renormalize) CHK(activation) CHK(shared_expert_intermediate_size) CHK(shared_expert_gated)
    CHK(weight_dtype) CHK(n_group) CHK(topk_group) CHK(group_score) CHK(has_selection_bias)
    CHK(has_router_bias) CHK(has_expert_bias) CHK(apply_router_weight_on_input)
#undef CHK
    if (got->routed_scaling_factor != want->routed_scaling_factor || got->swiglu_alpha != want->swiglu_alpha ||
        got->swiglu_limit != want->swiglu_limit)
        fail_msg("%s: desc scale %g alpha %g limit %g, want %g %g %g", tag, (double)got->routed_scaling_factor,
                 (double)got->swiglu_alpha, (double)got->swiglu_limit, (double)want->routed_scaling_factor,
                 (double)want->swiglu_alpha, (double)want->swiglu_limit);
    if (got->renormalize_eps != want->renormalize_eps || got->shared_expert_scale != want->shared_expert_scale)
        fail_msg("%s: desc renormalize_eps %g shared_expert_scale %g, want %g %g", tag, (double)got->renormalize_eps,
                 (double)got->shared_expert_scale, (double)want->renormalize_eps, (double)want->shared_expert_scale);
}

/* The whole check of one family spec (see the file comment). */
static void check_family(const fspec *s)
{
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tlist *tl = calloc(1, sizeof *tl);
    make_ckpt(ctx, s, dir, sizeof dir, tl);
    moe_checkpoint *ck = NULL;
    if (moe_checkpoint_open(ctx, dir, &ck) != MOE_OK)
        fail_msg("%s: open: %s", s->tag, moe_ctx_last_error(ctx));
    assert_int_equal(moe_checkpoint_family(ck), s->family);
    assert_int_equal(moe_checkpoint_num_layers(ck), s->L);

    int64_t moe_layer = -1;
    int dense_seen = 0;
    for (int64_t l = 0; l < s->L; l++) {
        const int is_moe = s->moe_mask[l] == '1';
        assert_int_equal(moe_checkpoint_is_moe_layer(ck, l), is_moe);
        moe_layer_desc d;
        if (is_moe) {
            if (moe_layer < 0)
                moe_layer = l;
            continue;
        }
        moe_status st = moe_checkpoint_layer_desc(ck, l, &d);
        if (!dense_seen && s->dense_why)
            expect_error(ctx, st, MOE_EDENSE, "dense MLP layer", s->dense_why);
        else
            assert_int_equal(st, MOE_EDENSE);
        dense_seen = 1;
    }
    assert_true(moe_layer >= 0);

    moe_layer_desc d;
    if (moe_checkpoint_layer_desc(ck, moe_layer, &d) != MOE_OK)
        fail_msg("%s: layer_desc: %s", s->tag, moe_ctx_last_error(ctx));
    assert_desc(s->tag, &d, &s->want);

    enum { T = 7 };
    float x[T * 64];
    assert_true(s->H <= 64);
    tu_fill_uniform(x, (size_t)(T * s->H), 5, -1.5f, 1.5f);
    float out[2][T * 64];
    int32_t ids[2][T * 8];
    float wts[2][T * 8];
    for (int th = 1; th <= 2; th++) {
        moe_options o;
        moe_options_init(&o);
        o.num_threads = th;
        moe_ctx *c2 = NULL;
        char err[256];
        assert_int_equal(moe_ctx_create(&o, &c2, err, sizeof err), MOE_OK);
        moe_plan *plan = NULL;
        assert_int_equal(moe_plan_create(c2, &d, &plan), MOE_OK);
        moe_weights *w = NULL;
        if (moe_checkpoint_load_weights(ck, moe_layer, plan, &w) != MOE_OK)
            fail_msg("%s: load: %s", s->tag, moe_ctx_last_error(ctx));
        size_t wsz = moe_plan_workspace_size(plan, T);
        void *ws = malloc(wsz);
        moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T,
                           .output = out[th - 1], .topk_ids = ids[th - 1], .topk_weights = wts[th - 1],
                           .workspace = ws, .workspace_size = wsz};
        assert_int_equal(moe_plan_execute_ex(plan, w, &a), MOE_OK);
        free(ws);
        moe_weights_free(w);
        moe_plan_free(plan);
        moe_ctx_free(c2);
    }
    assert_memory_equal(out[0], out[1], sizeof(float) * (size_t)(T * s->H));
    moe_checkpoint_free(ck);

    /* src/ref on a plain row-major f32 copy of the same values */
    fweights fw = gen_weights(s, moe_layer);
    const int64_t E = s->E, H = s->H, I = s->I;
    const void **gp = calloc((size_t)E, sizeof(void *)), **upp = calloc((size_t)E, sizeof(void *)),
               **dp = calloc((size_t)E, sizeof(void *)), **gbp = calloc((size_t)E, sizeof(void *)),
               **ubp = calloc((size_t)E, sizeof(void *)), **dbp = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        gp[e] = fw.gate + e * I * H;
        upp[e] = fw.up + e * I * H;
        dp[e] = fw.down + e * H * I;
        if (fw.gbias) {
            gbp[e] = fw.gbias + e * I;
            ubp[e] = fw.ubias + e * I;
            dbp[e] = fw.dbias + e * H;
        }
    }
    moe_weight_source src;
    memset(&src, 0, sizeof src);
    src.router = fw.router;
    src.router_dtype = MOE_DTYPE_F32;
    src.gate_proj = gp;
    src.up_proj = upp;
    src.down_proj = dp;
    src.shared_gate_proj = fw.sg;
    src.shared_up_proj = fw.su;
    src.shared_down_proj = fw.sd;
    src.shared_expert_gate = fw.sgw;
    src.router_bias = fw.rbias;
    src.selection_bias = fw.sbias;
    src.gate_bias = gbp;
    src.up_bias = ubp;
    src.down_bias = dbp;
    moe_layer_desc d32 = d;
    d32.weight_dtype = MOE_DTYPE_F32;
    float ref[T * 64];
    int32_t rid[T * 8];
    float rw[T * 8];
    assert_int_equal(moe_ref_forward(&d32, &src, x, T, NULL, ref, rid, rw), MOE_OK);
    if (memcmp(ref, out[0], sizeof(float) * (size_t)(T * H)) != 0)
        fail_msg("%s: checkpoint layer %lld differs from src/ref on the row-major weights (max diff %g)", s->tag,
                 (long long)moe_layer, tu_max_abs_diff(out[0], ref, (size_t)(T * H)));
    assert_memory_equal(rid, ids[0], sizeof(int32_t) * (size_t)(T * s->K));
    assert_memory_equal(rw, wts[0], sizeof(float) * (size_t)(T * s->K));
    assert_true(tu_max_abs(ref, (size_t)(T * H)) > 1e-3);
    free(gp);
    free(upp);
    free(dp);
    free(gbp);
    free(ubp);
    free(dbp);
    free_weights(&fw);
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

static moe_layer_desc base_desc(moe_family f, int64_t H, int64_t I, int64_t E, int64_t K, moe_dtype dt)
{
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.family = f;
    d.hidden_size = H;
    d.moe_intermediate_size = I;
    d.num_experts = E;
    d.top_k = K;
    d.weight_dtype = dt;
    return d;
}

/* ---- the families ---------------------------------------------------------------------- */

static void test_deepseek_v3(void **state)
{
    (void)state;
    /* 4 layers, first_k_dense_replace 1 and moe_layer_freq 2: layer 2 is the only MoE layer */
    fspec s = {.tag = "ck-dsv3", .family = MOE_FAMILY_DEEPSEEK_V3,
               .config = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\","
                         " \"hidden_size\": 16, \"num_hidden_layers\": 4, \"intermediate_size\": 40,"
                         " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                         " \"n_group\": 4, \"topk_group\": 2, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2,"
                         " \"n_shared_experts\": 2, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true,"
                         " \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", \"hidden_act\": \"silu\"}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 4, .Is = 16, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_experts", .sel_bias = 1,
               .wdt = MOE_DTYPE_F32, .moe_mask = "0010", .dense_why = "first_k_dense_replace = 1"};
    s.want = base_desc(MOE_FAMILY_DEEPSEEK_V3, 16, 8, 8, 2, MOE_DTYPE_F32);
    s.want.scoring_func = MOE_SCORING_SIGMOID;
    s.want.renormalize = 1;
    s.want.routed_scaling_factor = 2.5f;
    s.want.shared_expert_intermediate_size = 16;
    s.want.n_group = 4;
    s.want.topk_group = 2;
    s.want.group_score = MOE_GROUP_SCORE_TOP2_SUM;
    s.want.has_selection_bias = 1;
    check_family(&s);

    /* the same model in the stacked layout with bf16 weights (bias kept f32) */
    s.tag = "ck-dsv3s";
    s.layout = L_STACKED;
    s.wdt = MOE_DTYPE_BF16;
    s.want.weight_dtype = MOE_DTYPE_BF16;
    check_family(&s);
}

static void test_deepseek_v2(void **state)
{
    (void)state;
    /* V2 (full) routing: group_limited_greedy, scale 16; norm_topk_prob true is ignored as
     * transformers does; one shared expert; layer 0 dense */
    fspec s = {.tag = "ck-dsv2", .family = MOE_FAMILY_DEEPSEEK_V2,
               .config = "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"model_type\": \"deepseek_v2\","
                         " \"hidden_size\": 16, \"num_hidden_layers\": 2, \"intermediate_size\": 40,"
                         " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 3,"
                         " \"n_group\": 4, \"topk_group\": 2, \"topk_method\": \"group_limited_greedy\","
                         " \"first_k_dense_replace\": 1, \"n_shared_experts\": 1, \"routed_scaling_factor\": 16.0,"
                         " \"norm_topk_prob\": true, \"scoring_func\": \"softmax\"}",
               .H = 16, .I = 8, .E = 8, .K = 3, .L = 2, .Is = 8, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_experts",
               .wdt = MOE_DTYPE_BF16, .moe_mask = "01", .dense_why = "first_k_dense_replace"};
    s.want = base_desc(MOE_FAMILY_DEEPSEEK_V2, 16, 8, 8, 3, MOE_DTYPE_BF16);
    s.want.routed_scaling_factor = 16.0f;
    s.want.shared_expert_intermediate_size = 8;
    s.want.n_group = 4;
    s.want.topk_group = 2;
    s.want.group_score = MOE_GROUP_SCORE_MAX;
    check_family(&s);

    /* V2-Lite: greedy, two shared experts by default (n_shared_experts absent -> 2) */
    fspec lite = {.tag = "ck-dsv2l", .family = MOE_FAMILY_DEEPSEEK_V2,
                  .config = "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"hidden_size\": 16,"
                            " \"num_hidden_layers\": 2, \"moe_intermediate_size\": 8, \"n_routed_experts\": 8,"
                            " \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"topk_method\": \"greedy\","
                            " \"n_group\": 1, \"topk_group\": 1}",
                  .H = 16, .I = 8, .E = 8, .K = 2, .L = 2, .Is = 16, .prefix = "model.layers.%lld.mlp.",
                  .router = "gate.weight", .layout = L_STACKED, .shared = "shared_experts",
                  .wdt = MOE_DTYPE_F32, .moe_mask = "01"};
    lite.want = base_desc(MOE_FAMILY_DEEPSEEK_V2, 16, 8, 8, 2, MOE_DTYPE_F32);
    lite.want.shared_expert_intermediate_size = 16;
    check_family(&lite);
}

static void test_gpt_oss(void **state)
{
    (void)state;
    fspec s = {.tag = "ck-oss", .family = MOE_FAMILY_GPT_OSS,
               .config = "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\","
                         " \"hidden_size\": 16, \"num_hidden_layers\": 1, \"intermediate_size\": 8,"
                         " \"num_local_experts\": 6, \"num_experts_per_tok\": 3, \"swiglu_limit\": 5.0,"
                         " \"hidden_act\": \"silu\"}",
               .H = 16, .I = 8, .E = 6, .K = 3, .L = 1, .prefix = "model.layers.%lld.mlp.",
               .router = "router.weight", .layout = L_GPTOSS, .router_bias = 1, .wdt = MOE_DTYPE_BF16,
               .moe_mask = "1"};
    s.want = base_desc(MOE_FAMILY_GPT_OSS, 16, 8, 6, 3, MOE_DTYPE_BF16);
    s.want.scoring_func = MOE_SCORING_TOPK_SOFTMAX;
    s.want.activation = MOE_ACT_SWIGLU_OAI;
    s.want.has_router_bias = 1;
    s.want.has_expert_bias = 1;
    s.want.swiglu_limit = 5.0f;
    check_family(&s);
}

static void test_llama4(void **state)
{
    (void)state;
    /* as released: Llama4ForConditionalGeneration, text_config, language_model.model prefix,
     * moe_layers [1, 3] */
    fspec s = {.tag = "ck-l4", .family = MOE_FAMILY_LLAMA4,
               .config = "{\"architectures\": [\"Llama4ForConditionalGeneration\"], \"model_type\": \"llama4\","
                         " \"text_config\": {\"hidden_size\": 16, \"num_hidden_layers\": 4, \"intermediate_size\": 8,"
                         " \"intermediate_size_mlp\": 24, \"num_local_experts\": 4, \"num_experts_per_tok\": 1,"
                         " \"moe_layers\": [1, 3], \"interleave_moe_layer_step\": 2, \"model_type\": \"llama4_text\"},"
                         " \"vision_config\": {\"hidden_size\": 8}}",
               .H = 16, .I = 8, .E = 4, .K = 1, .L = 4, .Is = 8,
               .prefix = "language_model.model.layers.%lld.feed_forward.", .router = "router.weight",
               .layout = L_LLAMA4, .shared = "shared_expert", .wdt = MOE_DTYPE_BF16, .moe_mask = "0101",
               .dense_why = "text_config.moe_layers"};
    s.want = base_desc(MOE_FAMILY_LLAMA4, 16, 8, 4, 1, MOE_DTYPE_BF16);
    s.want.scoring_func = MOE_SCORING_TOPK_SIGMOID;
    s.want.apply_router_weight_on_input = 1;
    s.want.shared_expert_intermediate_size = 8;
    check_family(&s);

    /* text-only Llama4ForCausalLM, no moe_layers: every interleave_moe_layer_step-th layer */
    fspec t = s;
    t.tag = "ck-l4t";
    t.config = "{\"architectures\": [\"Llama4ForCausalLM\"], \"model_type\": \"llama4_text\", \"hidden_size\": 16,"
               " \"num_hidden_layers\": 4, \"intermediate_size\": 8, \"num_local_experts\": 4,"
               " \"num_experts_per_tok\": 2, \"interleave_moe_layer_step\": 2}";
    t.prefix = "model.layers.%lld.feed_forward.";
    t.K = 2;
    t.want.top_k = 2;
    t.wdt = MOE_DTYPE_F32;
    t.want.weight_dtype = MOE_DTYPE_F32;
    t.dense_why = "interleave_moe_layer_step";
    check_family(&t);
}

static void test_olmoe_granite(void **state)
{
    (void)state;
    fspec o = {.tag = "ck-olmoe", .family = MOE_FAMILY_OLMOE,
               .config = "{\"architectures\": [\"OlmoeForCausalLM\"], \"model_type\": \"olmoe\", \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 1, \"intermediate_size\": 8, \"num_experts\": 8,"
                         " \"num_experts_per_tok\": 3, \"norm_topk_prob\": false}",
               .H = 16, .I = 8, .E = 8, .K = 3, .L = 1, .prefix = "model.layers.%lld.mlp.", .router = "gate.weight",
               .layout = L_PER_EXPERT, .wdt = MOE_DTYPE_F32, .moe_mask = "1"};
    o.want = base_desc(MOE_FAMILY_OLMOE, 16, 8, 8, 3, MOE_DTYPE_F32);
    check_family(&o);

    fspec g = {.tag = "ck-granite", .family = MOE_FAMILY_GRANITE_MOE,
               .config = "{\"architectures\": [\"GraniteMoeForCausalLM\"], \"model_type\": \"granitemoe\","
                         " \"hidden_size\": 16, \"num_hidden_layers\": 1, \"intermediate_size\": 8,"
                         " \"num_local_experts\": 6, \"num_experts_per_tok\": 2}",
               .H = 16, .I = 8, .E = 6, .K = 2, .L = 1, .prefix = "model.layers.%lld.block_sparse_moe.",
               .router = "router.layer.weight", .layout = L_GRANITE, .wdt = MOE_DTYPE_BF16, .moe_mask = "1"};
    g.want = base_desc(MOE_FAMILY_GRANITE_MOE, 16, 8, 6, 2, MOE_DTYPE_BF16);
    g.want.scoring_func = MOE_SCORING_TOPK_SOFTMAX;
    check_family(&g);
    /* transformers' in-memory names (save_original_format=False) */
    g.tag = "ck-granite-mem";
    g.router = "router.weight";
    g.layout = L_STACKED;
    check_family(&g);
}

static void test_qwen35_next(void **state)
{
    (void)state;
    fspec q = {.tag = "ck-q35", .family = MOE_FAMILY_QWEN3_5_MOE,
               .config = "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\","
                         " \"text_config\": {\"hidden_size\": 16, \"num_hidden_layers\": 1, \"moe_intermediate_size\": 8,"
                         " \"shared_expert_intermediate_size\": 12, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                         " \"hidden_act\": \"silu\"}}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 1, .Is = 12, .prefix = "model.language_model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_STACKED, .shared = "shared_expert", .shared_gated = 1,
               .wdt = MOE_DTYPE_BF16, .moe_mask = "1"};
    q.want = base_desc(MOE_FAMILY_QWEN3_5_MOE, 16, 8, 8, 2, MOE_DTYPE_BF16);
    q.want.renormalize = 1;
    q.want.shared_expert_intermediate_size = 12;
    q.want.shared_expert_gated = 1;
    check_family(&q);

    fspec n = {.tag = "ck-qnext", .family = MOE_FAMILY_QWEN3_NEXT,
               .config = "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\","
                         " \"hidden_size\": 16, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 8,"
                         " \"shared_expert_intermediate_size\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                         " \"decoder_sparse_step\": 2}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 2, .Is = 8, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_expert", .shared_gated = 1,
               .wdt = MOE_DTYPE_F32, .moe_mask = "01", .dense_why = "decoder_sparse_step"};
    n.want = base_desc(MOE_FAMILY_QWEN3_NEXT, 16, 8, 8, 2, MOE_DTYPE_F32);
    n.want.renormalize = 1; /* norm_topk_prob absent: Qwen3NextConfig's default, true */
    n.want.shared_expert_intermediate_size = 8;
    n.want.shared_expert_gated = 1;
    check_family(&n);

    /* Qwen3-Omni as released: the decoder's fields two levels down (config_path
     * thinker_config.text_config), a text_config beside them that is not the decoder's (the
     * talker's config has one too), tensors under thinker.model.layers. */
    fspec o = {.tag = "ck-qomni", .family = MOE_FAMILY_QWEN3_OMNI_MOE,
               .config = "{\"architectures\": [\"Qwen3OmniMoeForConditionalGeneration\"], \"model_type\": \"qwen3_omni_moe\","
                         " \"talker_config\": {\"text_config\": {\"hidden_size\": 99, \"num_experts\": 3}},"
                         " \"thinker_config\": {\"text_config\": {\"hidden_size\": 16, \"num_hidden_layers\": 2,"
                         " \"moe_intermediate_size\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
                         " \"norm_topk_prob\": false, \"mlp_only_layers\": [0]}}}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 2, .prefix = "thinker.model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .wdt = MOE_DTYPE_BF16, .moe_mask = "01",
               .dense_why = "thinker_config.text_config.mlp_only_layers"};
    o.want = base_desc(MOE_FAMILY_QWEN3_OMNI_MOE, 16, 8, 8, 2, MOE_DTYPE_BF16);
    o.want.renormalize = 0; /* read from thinker_config.text_config (the class default is true) */
    check_family(&o);
    /* the thinker alone (Qwen3OmniMoeThinkerForConditionalGeneration): one level, text_config;
     * norm_topk_prob absent: Qwen3OmniMoeTextConfig's true */
    fspec t = {.tag = "ck-qthink", .family = MOE_FAMILY_QWEN3_OMNI_MOE,
               .config = "{\"architectures\": [\"Qwen3OmniMoeThinkerForConditionalGeneration\"],"
                         " \"model_type\": \"qwen3_omni_moe_thinker\", \"text_config\": {\"hidden_size\": 16,"
                         " \"num_hidden_layers\": 1, \"moe_intermediate_size\": 8, \"num_experts\": 8,"
                         " \"num_experts_per_tok\": 2}}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 1, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_STACKED, .wdt = MOE_DTYPE_F32, .moe_mask = "1"};
    t.want = base_desc(MOE_FAMILY_QWEN3_OMNI_MOE, 16, 8, 8, 2, MOE_DTYPE_F32);
    t.want.renormalize = 1;
    check_family(&t);
}

/* hidden_act picks the gate function: gelu and gelu_pytorch_tanh give the GELU gates. */
static void test_gelu_act(void **state)
{
    (void)state;
    fspec o = {.tag = "ck-gelu", .family = MOE_FAMILY_OLMOE,
               .config = "{\"architectures\": [\"OlmoeForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                         " \"intermediate_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
                         " \"norm_topk_prob\": true, \"hidden_act\": \"gelu_pytorch_tanh\"}",
               .H = 16, .I = 8, .E = 4, .K = 2, .L = 1, .prefix = "model.layers.%lld.mlp.", .router = "gate.weight",
               .layout = L_PER_EXPERT, .wdt = MOE_DTYPE_F32, .moe_mask = "1"};
    o.want = base_desc(MOE_FAMILY_OLMOE, 16, 8, 4, 2, MOE_DTYPE_F32);
    o.want.renormalize = 1;
    o.want.activation = MOE_ACT_GEGLU_TANH;
    check_family(&o);
    o.tag = "ck-gelu2";
    o.config = "{\"architectures\": [\"OlmoeForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
               " \"intermediate_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
               " \"norm_topk_prob\": true, \"hidden_act\": \"gelu\"}";
    o.want.activation = MOE_ACT_GEGLU;
    check_family(&o);
}

/* ---- errors ---------------------------------------------------------------------------- */

/* Open `config` over an empty weights file and return the status of open + layer_desc(layer). */
static moe_status open_desc(moe_ctx *ctx, const char *dir, const char *config, const tlist *tl, int64_t layer)
{
    write_text(dir, "config.json", config);
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(moe_safetensors_write(ctx, path, tl->t, tl->n), MOE_OK);
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        moe_layer_desc d;
        st = moe_checkpoint_layer_desc(ck, layer, &d);
        moe_checkpoint_free(ck);
    }
    return st;
}

/* The mlp_layer_types rule (DeepSeek-V3.2, GLM-4.7-Flash, K-EXAONE, MiMo-V2-Flash): absent, the
 * config class's dense prefix (DeepseekV32Config: first_k_dense_replace, default 3) with its
 * default groups (8 keep 4); given, the "sparse" entries; any other string is refused by entry. */
static void test_mlp_layer_types(void **state)
{
    (void)state;
    fspec s = {.tag = "ck-dsv32", .family = MOE_FAMILY_DEEPSEEK_V32,
               .config = "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 4, \"moe_intermediate_size\": 8, \"n_routed_experts\": 8,"
                         " \"num_experts_per_tok\": 2}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 4, .Is = 8, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_experts", .sel_bias = 1,
               .wdt = MOE_DTYPE_F32, .moe_mask = "0001", .dense_why = "first_k_dense_replace = 3"};
    s.want = base_desc(MOE_FAMILY_DEEPSEEK_V32, 16, 8, 8, 2, MOE_DTYPE_F32);
    s.want.scoring_func = MOE_SCORING_SIGMOID;
    s.want.renormalize = 1;
    s.want.routed_scaling_factor = 2.5f;
    s.want.shared_expert_intermediate_size = 8;
    s.want.n_group = 8;
    s.want.topk_group = 4;
    s.want.group_score = MOE_GROUP_SCORE_TOP2_SUM;
    s.want.has_selection_bias = 1;
    check_family(&s);

    s.tag = "ck-dsv32l";
    s.config = "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 4,"
               " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
               " \"n_group\": 1, \"topk_group\": 1, \"mlp_layer_types\": [\"sparse\", \"dense\", \"sparse\", \"dense\"]}";
    s.moe_mask = "1010";
    s.dense_why = "mlp_layer_types[1] is not \"sparse\"";
    s.want.n_group = 0; /* one group: no group-limited selection */
    s.want.topk_group = 0;
    check_family(&s);

    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "ck-dsv32x");
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *bad = "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                      " \"mlp_layer_types\": [\"dense\", \"moe\"]}";
    expect_error(ctx, open_desc(ctx, dir, bad, tl, 1), MOE_EFORMAT, "mlp_layer_types'[1] = \"moe\"",
                 "must be \"sparse\" or \"dense\"");
    /* one entry per layer: a short list would leave layer 1 without a rule, a long one names a
     * layer 2 that does not exist */
    const char *lens[] = {"[\"sparse\"]", "[\"sparse\", \"dense\", \"sparse\"]"};
    for (int i = 0; i < 2; i++) {
        char cfgl[600], want[120];
        snprintf(cfgl, sizeof cfgl,
                 "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                 " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                 " \"mlp_layer_types\": %s}", lens[i]);
        snprintf(want, sizeof want, "field 'mlp_layer_types' has %d entries, but num_hidden_layers is 2", i ? 3 : 1);
        expect_error(ctx, open_desc(ctx, dir, cfgl, tl, 0), MOE_EFORMAT, want, "one \"dense\" or \"sparse\" per layer");
    }
    /* every layer dense: the message says the model has none, for the first layer (what the
     * first-MoE-layer lookup of moe plan asks when there is none) and any other; an index
     * outside [0, L) stays MOE_ERANGE, and says so too */
    const char *alld = "{\"architectures\": [\"DeepseekV32ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                       " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                       " \"mlp_layer_types\": [\"dense\", \"dense\"]}";
    expect_error(ctx, open_desc(ctx, dir, alld, tl, 0), MOE_EDENSE, "the model has no MoE layers (all 2 are dense",
                 "layer 0: mlp_layer_types[0] is not \"sparse\"");
    expect_error(ctx, open_desc(ctx, dir, alld, tl, 1), MOE_EDENSE, "no MoE layers", "layer 1:");
    expect_error(ctx, open_desc(ctx, dir, alld, tl, -1), MOE_ERANGE, "layer -1 out of range", "no MoE layers");
    expect_error(ctx, open_desc(ctx, dir, alld, tl, 2), MOE_ERANGE, "layer 2 out of range", "no MoE layers");
    /* DeepSeek-OCR-2 (layers.list_required): its decoder layers index mlp_layer_types, which its
     * config class does not default, so an absent list is refused by name */
    const char *ocr2 = "{\"architectures\": [\"DeepseekOcr2ForConditionalGeneration\"], \"text_config\": {"
                       "\"hidden_size\": 16, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 8,"
                       " \"n_routed_experts\": 8, \"num_experts_per_tok\": 2}}";
    expect_error(ctx, open_desc(ctx, dir, ocr2, tl, 1), MOE_EFORMAT, "'text_config.mlp_layer_types' is absent",
                 "deepseek_ocr2", "no default");
    /* Unlimited-OCR: the original checkpoints' language_config is read first (here: its mlp_bias) */
    const char *uocr = "{\"architectures\": [\"UnlimitedOcrForConditionalGeneration\"], \"language_config\": {"
                       "\"hidden_size\": 16, \"num_hidden_layers\": 2, \"moe_intermediate_size\": 8,"
                       " \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"mlp_bias\": true},"
                       " \"text_config\": {\"hidden_size\": 16}}";
    expect_error(ctx, open_desc(ctx, dir, uocr, tl, 1), MOE_EUNSUPPORTED, "'language_config.mlp_bias'",
                 "shared experts' projections get biases");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* The family-table pieces the hybrid-decoder rows brought:
 *  - a selection bias saved beside the block (a bias name holding %L is a full name):
 *    Kolibri1's model.layers.L.moe.router.expert_bias, with top-k sigmoid scoring;
 *  - a layer list's class default (FlintConfig: mlp_only_layers absent = [0, 1]);
 *  - refused config values (Laguna's moe_router_logit_softcapping, tested in
 *    test_family_errors). */
static void test_hybrid_rows(void **state)
{
    (void)state;
    fspec k = {.tag = "ck-kolibri", .family = MOE_FAMILY_KOLIBRI1,
               .config = "{\"architectures\": [\"Kolibri1ForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 2, \"moe_intermediate_size\": 8, \"num_local_experts\": 8,"
                         " \"num_experts_per_tok\": 2, \"shared_expert_intermediate_size\": 12}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 2, .Is = 12, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_experts", .sel_bias = 1,
               .sel_bias_name = "model.layers.%lld.moe.router.expert_bias", .wdt = MOE_DTYPE_F32, .moe_mask = "11"};
    k.want = base_desc(MOE_FAMILY_KOLIBRI1, 16, 8, 8, 2, MOE_DTYPE_F32);
    k.want.scoring_func = MOE_SCORING_TOPK_SIGMOID;
    k.want.renormalize = 0; /* Kolibri1Config's norm_topk_prob default */
    k.want.shared_expert_intermediate_size = 12;
    k.want.has_selection_bias = 1;
    check_family(&k);

    /* the bias under the block prefix instead is not Kolibri1's name: the missing tensor is
     * named as the row spells it for the layer */
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "ck-kolibrix");
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    k.sel_bias_name = NULL;
    k.L = 1;
    fweights w = gen_weights(&k, 0);
    add_layer(&k, 0, &w, tl);
    expect_error(ctx, open_desc(ctx, dir, k.config, tl, 0), MOE_ENOTFOUND, "model.layers.0.moe.router.expert_bias");
    free_weights(&w);
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);

    /* Flint without mlp_only_layers: FlintConfig's [0, 1] are dense */
    fspec f = {.tag = "ck-flint", .family = MOE_FAMILY_FLINT,
               .config = "{\"architectures\": [\"FlintForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 3, \"moe_intermediate_size\": 8, \"num_experts\": 4,"
                         " \"num_experts_per_tok\": 2, \"shared_expert_intermediate_size\": 8}",
               .H = 16, .I = 8, .E = 4, .K = 2, .L = 3, .Is = 8, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_expert", .wdt = MOE_DTYPE_F32,
               .moe_mask = "001", .dense_why = "listed in mlp_only_layers"};
    f.want = base_desc(MOE_FAMILY_FLINT, 16, 8, 4, 2, MOE_DTYPE_F32);
    f.want.scoring_func = MOE_SCORING_SIGMOID;
    f.want.renormalize = 1;
    f.want.shared_expert_intermediate_size = 8;
    check_family(&f);
    /* given, the list is read as written (an empty list: every layer MoE) */
    f.tag = "ck-flint2";
    f.config = "{\"architectures\": [\"FlintForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 3,"
               " \"moe_intermediate_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
               " \"shared_expert_intermediate_size\": 8, \"mlp_only_layers\": [], \"norm_topk_prob\": false}";
    f.moe_mask = "111";
    f.dense_why = NULL;
    f.want.renormalize = 0;
    check_family(&f);
}

/* Cohere2-MoE's config strings: expert_selection_fn picks the scoring
 * ("softmax" of the k, never renormalized; "sigmoid", / sum when norm_topk_prob), and
 * shared_expert_combination_strategy the shared expert's mix ("average": routed_scaling_factor and
 * shared_expert_scale 0.5; "sum": 1), read only with a shared expert; any other string is refused
 * naming the field, the value and those read. */
static void test_cohere2_strings(void **state)
{
    (void)state;
    fspec s = {.tag = "ck-cohere2", .family = MOE_FAMILY_COHERE2_MOE,
               .config = "{\"architectures\": [\"Cohere2MoeForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": 8,"
                         " \"num_experts_per_tok\": 2, \"num_shared_experts\": 2}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 2, .Is = 16, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_experts",
               .wdt = MOE_DTYPE_F32, .moe_mask = "11"};
    s.want = base_desc(MOE_FAMILY_COHERE2_MOE, 16, 8, 8, 2, MOE_DTYPE_F32);
    s.want.scoring_func = MOE_SCORING_TOPK_SOFTMAX; /* the defaults: "softmax", "average" */
    s.want.renormalize = 0;                         /* norm_topk_prob (true) is not read by softmax */
    s.want.renormalize_eps = 0.0f;
    s.want.shared_expert_intermediate_size = 16;
    s.want.routed_scaling_factor = 0.5f;
    s.want.shared_expert_scale = 0.5f;
    check_family(&s);

    s.tag = "ck-cohere2s";
    s.config = "{\"architectures\": [\"Cohere2MoeForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
               " \"intermediate_size\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"num_shared_experts\": 1,"
               " \"expert_selection_fn\": \"sigmoid\", \"shared_expert_combination_strategy\": \"sum\","
               " \"mlp_layer_types\": [\"dense\", \"sparse\"]}";
    s.Is = 8;
    s.moe_mask = "01";
    s.dense_why = "mlp_layer_types[0] is not \"sparse\"";
    s.want.scoring_func = MOE_SCORING_TOPK_SIGMOID;
    s.want.renormalize = 1;
    s.want.shared_expert_intermediate_size = 8;
    s.want.routed_scaling_factor = 1.0f;
    s.want.shared_expert_scale = 1.0f;
    check_family(&s);

    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "ck-cohere2x");
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const char *base = "{\"architectures\": [\"Cohere2MoeForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                       " \"intermediate_size\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 2%s}";
    char buf[1024];
    snprintf(buf, sizeof buf, base, ", \"expert_selection_fn\": \"relu\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'expert_selection_fn' = \"relu\"",
                 "\"softmax\" or \"sigmoid\"");
    snprintf(buf, sizeof buf, base, ", \"num_shared_experts\": 1, \"shared_expert_combination_strategy\": \"max\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg,
                 "'shared_expert_combination_strategy' = \"max\"", "\"average\" or \"sum\"");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

static void test_family_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "ck-ferr");
    tlist *tl = calloc(1, sizeof *tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    char cfg[700];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);

    const char *v3 = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                     " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                     " \"n_group\": 4, \"topk_group\": 2, \"first_k_dense_replace\": 0%s}";
    char buf[1024];
    snprintf(buf, sizeof buf, v3, ", \"topk_method\": \"greedy\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'topk_method'", "greedy", "noaux_tc");
    snprintf(buf, sizeof buf, v3, ", \"scoring_func\": \"softmax\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'scoring_func'", "sigmoid");
    const char *v3g = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 6,"
                      " \"n_group\": 4, \"topk_group\": 2}";
    expect_error(ctx, open_desc(ctx, dir, v3g, tl, 0), MOE_EFORMAT, cfg, "'topk_group'", "num_experts_per_tok");
    const char *v3n = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                      " \"n_group\": 3, \"topk_group\": 2}";
    expect_error(ctx, open_desc(ctx, dir, v3n, tl, 0), MOE_EFORMAT, cfg, "'n_routed_experts'", "'n_group'");
    /* first_k_dense_replace defaults to 3 (DeepseekV3Config): layer 1 is dense */
    const char *v3d = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 4,"
                      " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2}";
    expect_error(ctx, open_desc(ctx, dir, v3d, tl, 1), MOE_EDENSE, "first_k_dense_replace = 3", "MoE layers (1): 3");
    const char *v2 = "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                     " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                     " \"scoring_func\": \"sigmoid\"}";
    expect_error(ctx, open_desc(ctx, dir, v2, tl, 0), MOE_EUNSUPPORTED, cfg, "'scoring_func'", "softmax");
    const char *v2g = "{\"architectures\": [\"DeepseekV2ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                      " \"topk_method\": \"group_limited_greedy\"}";
    expect_error(ctx, open_desc(ctx, dir, v2g, tl, 0), MOE_ENOTFOUND, cfg, "'n_group'");
    const char *l4 = "{\"architectures\": [\"Llama4ForConditionalGeneration\"], \"text_config\": {\"num_hidden_layers\": 2,"
                     " \"intermediate_size\": 8, \"num_local_experts\": 4, \"num_experts_per_tok\": 1}}";
    expect_error(ctx, open_desc(ctx, dir, l4, tl, 0), MOE_ENOTFOUND, cfg, "'text_config.hidden_size'");
    const char *omni = "{\"architectures\": [\"Qwen3OmniMoeForConditionalGeneration\"], \"thinker_config\":"
                       " {\"text_config\": {\"num_hidden_layers\": 2, \"moe_intermediate_size\": 8, \"num_experts\": 4,"
                       " \"num_experts_per_tok\": 1}}}";
    expect_error(ctx, open_desc(ctx, dir, omni, tl, 0), MOE_ENOTFOUND, cfg, "'thinker_config.text_config.hidden_size'");
    const char *oss = "{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                      " \"intermediate_size\": 8, \"num_local_experts\": 4, \"num_experts_per_tok\": 2,"
                      " \"swiglu_limit\": -1}";
    expect_error(ctx, open_desc(ctx, dir, oss, tl, 0), MOE_EFORMAT, cfg, "'swiglu_limit'");
    /* a refused value (moe_fam_refuse) is named with what it asks for; 0 / false pass on to
     * the next check (here the missing router) */
    const char *lag = "{\"architectures\": [\"LagunaForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                      " \"moe_intermediate_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
                      " \"shared_expert_intermediate_size\": 8, \"mlp_layer_types\": [\"sparse\"]%s}";
    snprintf(buf, sizeof buf, lag, ", \"moe_router_logit_softcapping\": 30.0");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'moe_router_logit_softcapping' = 30",
                 "soft-capping", "laguna");
    snprintf(buf, sizeof buf, lag, ", \"moe_apply_router_weight_on_input\": true");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'moe_apply_router_weight_on_input' = true");
    snprintf(buf, sizeof buf, lag, ", \"moe_router_logit_softcapping\": \"30\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EFORMAT, cfg, "'moe_router_logit_softcapping'",
                 "a number or a boolean");
    snprintf(buf, sizeof buf, lag,
             ", \"moe_router_logit_softcapping\": 0.0, \"moe_apply_router_weight_on_input\": false");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_ENOTFOUND, "model.layers.0.mlp.gate.weight");
    const char *swa = "{\"architectures\": [\"GraniteMoeSWAForCausalLM\"], \"hidden_size\": 16,"
                      " \"num_hidden_layers\": 1, \"intermediate_size\": 8, \"num_local_experts\": 4,"
                      " \"num_experts_per_tok\": 2, \"shared_intermediate_size\": 16}";
    expect_error(ctx, open_desc(ctx, dir, swa, tl, 0), MOE_EUNSUPPORTED, cfg, "'shared_intermediate_size' = 16",
                 "shared_mlp", "granitemoe_swa");
    tl_free(tl);

    /* gpt-oss MXFP4 blocks without config.json's quantization_config {quant_method: mxfp4}
     * are refused by name (test_ckpt_mxfp4 checks the MXFP4 checkpoints themselves) */
    const char *oss_ok = "{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 1,"
                         " \"intermediate_size\": 8, \"num_local_experts\": 4, \"num_experts_per_tok\": 2}";
    float zeros[4 * 64 * 16] = {0};
    tl_add(tl, "model.layers.0.mlp.router.weight", MOE_DTYPE_BF16, 2, (int64_t[]){4, 64}, zeros);
    tl_add(tl, "model.layers.0.mlp.router.bias", MOE_DTYPE_BF16, 1, (int64_t[]){4}, zeros);
    moe_tensor_out *blk = &tl->t[tl->n];
    tl_add(tl, "model.layers.0.mlp.experts.gate_up_proj_blocks", MOE_DTYPE_F32, 4, (int64_t[]){4, 16, 2, 4}, zeros);
    blk->dtype = MOE_DTYPE_U8; /* 4 * 16 * 2 * 16 bytes: the same bytes as the F32 [.., 4] */
    blk->shape[3] = 16;
    expect_error(ctx, open_desc(ctx, dir, oss_ok, tl, 0), MOE_EFORMAT, "gate_up_proj_blocks", "MXFP4",
                 "quantization_config", "quant_method: mxfp4");
    tl_free(tl);

    /* DeepSeek-V3 without its e_score_correction_bias: named */
    fspec s = {.tag = "ck-dsv3x", .family = MOE_FAMILY_DEEPSEEK_V3, .H = 16, .I = 8, .E = 8, .K = 2, .L = 1, .Is = 8,
               .prefix = "model.layers.%lld.mlp.", .router = "gate.weight", .layout = L_PER_EXPERT,
               .shared = "shared_experts", .wdt = MOE_DTYPE_F32, .moe_mask = "1"};
    const char *v3ok = "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                       " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2,"
                       " \"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 0}";
    fweights w = gen_weights(&s, 0);
    add_layer(&s, 0, &w, tl);
    expect_error(ctx, open_desc(ctx, dir, v3ok, tl, 0), MOE_ENOTFOUND, "gate.e_score_correction_bias");
    free_weights(&w);
    tl_free(tl);

    /* gpt-oss with the down bias in another dtype than the gate/up bias */
    fspec o = {.tag = "ck-ossx", .family = MOE_FAMILY_GPT_OSS, .H = 16, .I = 8, .E = 4, .K = 2, .L = 1,
               .prefix = "model.layers.%lld.mlp.", .router = "router.weight", .layout = L_GPTOSS, .router_bias = 1,
               .wdt = MOE_DTYPE_BF16, .moe_mask = "1"};
    const char *osscfg = "{\"architectures\": [\"GptOssForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                         " \"intermediate_size\": 8, \"num_local_experts\": 4, \"num_experts_per_tok\": 2}";
    w = gen_weights(&o, 0);
    add_layer(&o, 0, &w, tl);
    for (size_t i = 0; i < tl->n; i++) {
        if (strstr(tl->t[i].name, "down_proj_bias")) {
            free((void *)tl->t[i].data);
            tl->t[i].data = calloc(4 * 16, 4);
            tl->t[i].dtype = MOE_DTYPE_F32;
        }
    }
    expect_error(ctx, open_desc(ctx, dir, osscfg, tl, 0), MOE_EDTYPE, "down_proj_bias", "gate_up_proj_bias");
    free_weights(&w);
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* Granite-MoE-Shared / -Hybrid: the shared expert is the decoder layer's shared_mlp, outside
 * the block prefix, with a fused input_linear [2 I_s, H] (gate rows, then up rows): an absent
 * shared_intermediate_size is the config class's (0: none; Hybrid's 1024, whose tensors must
 * then be there), a wrong shape or a quantized fused tensor is refused by name. (The maths is
 * checked against transformers on the granitemoeshared_f32 / granitemoehybrid_f32 fixtures.) */
static void test_granite_shared_mlp(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-gshared");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const int64_t H = 16, I = 8, E = 4, Is = 6;
    float *v = rounded((size_t)(E * 2 * I * H), 901, 0.5f, MOE_DTYPE_F32); /* the largest tensor's values */
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    tl_add(tl, "model.layers.0.block_sparse_moe.router.layer.weight", MOE_DTYPE_F32, 2, (int64_t[]){E, H}, v);
    tl_add(tl, "model.layers.0.block_sparse_moe.input_linear.weight", MOE_DTYPE_F32, 3, (int64_t[]){E, 2 * I, H}, v);
    tl_add(tl, "model.layers.0.block_sparse_moe.output_linear.weight", MOE_DTYPE_F32, 3, (int64_t[]){E, H, I}, v);
    const char *shared_cfg = "{\"architectures\": [\"GraniteMoeSharedForCausalLM\"], \"hidden_size\": 16,"
                             " \"num_hidden_layers\": 1, \"intermediate_size\": 8, \"num_local_experts\": 4,"
                             " \"num_experts_per_tok\": 2%s}";
    const char *hybrid_cfg = "{\"architectures\": [\"GraniteMoeHybridForCausalLM\"], \"hidden_size\": 16,"
                             " \"num_hidden_layers\": 1, \"intermediate_size\": 8, \"num_local_experts\": 4,"
                             " \"num_experts_per_tok\": 2}";
    char buf[600];
    moe_checkpoint *ck = NULL;
    moe_layer_desc d;
    /* GraniteMoeSharedConfig's shared_intermediate_size default 0: no shared expert, none read */
    snprintf(buf, sizeof buf, shared_cfg, "");
    assert_int_equal(open_desc(ctx, dir, buf, tl, 0), MOE_OK);
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_int_equal(d.shared_expert_intermediate_size, 0);
    assert_int_equal(d.scoring_func, MOE_SCORING_TOPK_SOFTMAX);
    moe_checkpoint_free(ck);
    /* GraniteMoeHybridConfig's default 1024: its shared_mlp must be there */
    expect_error(ctx, open_desc(ctx, dir, hybrid_cfg, tl, 0), MOE_ENOTFOUND, "model.layers.0.shared_mlp.input_linear.weight");
    /* given: read beside the block, gate and up the two halves of input_linear */
    snprintf(buf, sizeof buf, shared_cfg, ", \"shared_intermediate_size\": 6");
    tl_add(tl, "model.layers.0.shared_mlp.input_linear.weight", MOE_DTYPE_F32, 2, (int64_t[]){2 * Is, H}, v);
    tl_add(tl, "model.layers.0.shared_mlp.output_linear.weight", MOE_DTYPE_F32, 2, (int64_t[]){H, Is}, v);
    assert_int_equal(open_desc(ctx, dir, buf, tl, 0), MOE_OK);
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_int_equal(d.shared_expert_intermediate_size, Is);
    assert_int_equal(d.shared_expert_gated, 0);
    moe_checkpoint_free(ck);
    /* input_linear [I_s, H]: not the fused [2 I_s, H] */
    moe_tensor_out *gu = &tl->t[tl->n - 2];
    gu->shape[0] = Is;
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_ESHAPE, "shared_mlp.input_linear.weight", "[2 I_s, H]");
    /* stored quantized (I8): refused by name */
    gu->shape[0] = 2 * Is;
    gu->dtype = MOE_DTYPE_I8;
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, "shared_mlp.input_linear.weight", "I8",
                 "fused shared MLP");
    free(v);
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* ---- the row fields a config.json may name differently (fam-a families) --------------- */

/* fixture `name`'s config.json with `key` set to `val` (NULL: removed) and `rename` (if set)
 * renamed to `to`, written with the fixture's model.safetensors (a symlink) into dir */
static void fixture_variant(const char *dir, const char *name, const char *key, json_t *val, const char *rename,
                            const char *to)
{
    char src[1024], rel[256], path[1200];
    snprintf(rel, sizeof rel, "%s/config.json", name);
    tu_data_path(src, sizeof src, rel);
    json_error_t je;
    json_t *cfg = json_load_file(src, 0, &je);
    if (!cfg)
        fail_msg("%s: %s", src, je.text);
    if (rename) {
        json_t *v = json_object_get(cfg, rename);
        assert_non_null(v);
        json_object_set(cfg, to, v);
        json_object_del(cfg, rename);
    }
    if (key && val)
        json_object_set_new(cfg, key, val);
    else if (key)
        json_object_del(cfg, key);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg);
    snprintf(rel, sizeof rel, "%s/model.safetensors", name);
    tu_data_path(src, sizeof src, rel);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    char abs[PATH_MAX]; /* the link's target, absolute (tu_data_path may be relative) */
    assert_non_null(realpath(src, abs));
    assert_int_equal(symlink(abs, path), 0);
}

static moe_status variant_desc(moe_ctx *ctx, const char *dir, int64_t layer, moe_layer_desc *d)
{
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        st = moe_checkpoint_layer_desc(ck, layer, d);
        moe_checkpoint_free(ck);
    }
    return st;
}

/* Kimi-Linear's top_k field (the row's topk_field / topk_alias): num_experts_per_token as its
 * config class writes it, num_experts_per_tok (transformers' attribute_map name) when that is
 * absent, both absent or too large named; moe_renormalize is its norm_topk_prob, and the
 * attribute_map names (the row's aliases) are read in place of absent own names. Hunyuan-V3's
 * mlp_bias (the row's refuse_true): true is refused by name, false reads. */
static void test_row_field_names(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-fama");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    moe_layer_desc d;

    fixture_variant(dir, "kimi_linear_f32", NULL, NULL, NULL, NULL);
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.family, MOE_FAMILY_KIMI_LINEAR);
    assert_int_equal(d.top_k, 2);
    assert_int_equal(d.renormalize, 1);
    assert_int_equal(d.shared_expert_intermediate_size, 12);
    fixture_variant(dir, "kimi_linear_f32", NULL, NULL, "num_experts_per_token", "num_experts_per_tok");
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.top_k, 2);
    fixture_variant(dir, "kimi_linear_f32", "num_experts_per_token", json_integer(9), NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 1, &d), MOE_EFORMAT, cfg, "'num_experts_per_token' = 9", "8 experts");
    fixture_variant(dir, "kimi_linear_f32", "num_experts_per_token", NULL, NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 1, &d), MOE_ENOTFOUND, "'num_experts_per_token'", "'num_experts_per_tok'");
    fixture_variant(dir, "kimi_linear_f32", "moe_renormalize", json_false(), NULL, NULL);
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.renormalize, 0);

    /* the attribute_map names (norm_topk_prob, n_group, n_shared_experts) read when Kimi's own
     * are absent, and named when wrong */
    fixture_variant(dir, "kimi_linear_f32", "norm_topk_prob", json_false(), "moe_renormalize", "unused_renorm");
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.renormalize, 0);
    fixture_variant(dir, "kimi_linear_f32", "n_group", json_integer(2), "num_expert_group", "unused_groups");
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.n_group, 2);
    assert_int_equal(d.topk_group, 1);
    fixture_variant(dir, "bailing_hybrid_f32", "n_shared_experts", json_integer(2), "num_shared_experts", "unused_shared");
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.shared_expert_intermediate_size, 24); /* 2 * I (the default count is 1) */
    fixture_variant(dir, "kimi_linear_f32", "norm_topk_prob", json_integer(1), "moe_renormalize", "unused_renorm");
    expect_error(ctx, variant_desc(ctx, dir, 1, &d), MOE_EFORMAT, cfg, "'norm_topk_prob' must be true or false");

    fixture_variant(dir, "hy_v3_f32", "mlp_bias", json_true(), NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 1, &d), MOE_EUNSUPPORTED, cfg, "'mlp_bias' is true", "HYV3MLP");
    fixture_variant(dir, "hy_v3_f32", "mlp_bias", json_false(), NULL, NULL);
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.family, MOE_FAMILY_HY_V3);
    assert_true(d.routed_scaling_factor == 2.826f);

    /* A.X-K2: groups only when n_group is set; grouped (its 0.0-filled mask) refused by name */
    fixture_variant(dir, "axk2_f32", NULL, NULL, NULL, NULL);
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.family, MOE_FAMILY_AXK2);
    assert_int_equal(d.n_group, 0);
    assert_int_equal(d.shared_expert_intermediate_size, 24);
    fixture_variant(dir, "axk2_f32", "n_group", json_integer(1), NULL, NULL);
    assert_int_equal(variant_desc(ctx, dir, 1, &d), MOE_OK);
    assert_int_equal(d.n_group, 0);
    fixture_variant(dir, "axk2_f32", "n_group", json_integer(2), NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 1, &d), MOE_EUNSUPPORTED, cfg, "'n_group' = 2", "0.0, not -inf",
                 "apply_group_scoring");

    /* LongCat-Flash: zero_expert_num identity experts (the router [E + Z, H]), zero_expert_type
     * "identity" or refused by name, K <= E + Z, the layer count num_layers */
    fixture_variant(dir, "longcat_flash_f32", "zero_expert_type", json_string("identity"), NULL, NULL);
    assert_int_equal(variant_desc(ctx, dir, 0, &d), MOE_OK);
    assert_int_equal(d.family, MOE_FAMILY_LONGCAT_FLASH);
    assert_int_equal(d.num_experts, 6);
    assert_int_equal(d.num_identity_experts, 3);
    assert_int_equal(d.top_k, 3);
    assert_true(d.routed_scaling_factor == 1.5f && !d.renormalize && d.has_selection_bias);
    fixture_variant(dir, "longcat_flash_f32", "zero_expert_type", json_string("constant"), NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 0, &d), MOE_EUNSUPPORTED, cfg, "'zero_expert_type' = \"constant\"",
                 "identity");
    fixture_variant(dir, "longcat_flash_f32", "zero_expert_num", NULL, NULL, NULL); /* absent: 256 */
    expect_error(ctx, variant_desc(ctx, dir, 0, &d), MOE_ESHAPE, "router.classifier.weight", "[E + Z, H]");
    fixture_variant(dir, "longcat_flash_f32", "zero_expert_num", json_null(), NULL, NULL); /* null: none */
    expect_error(ctx, variant_desc(ctx, dir, 0, &d), MOE_ESHAPE, "router.classifier.weight", "[E, H]");
    fixture_variant(dir, "longcat_flash_f32", "moe_topk", json_integer(10), NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 0, &d), MOE_EFORMAT, cfg, "'moe_topk' = 10", "9 experts (routed and identity)");
    fixture_variant(dir, "longcat_flash_f32", "num_layers", NULL, NULL, NULL);
    expect_error(ctx, variant_desc(ctx, dir, 0, &d), MOE_ENOTFOUND, "'num_layers'");
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* Hunyuan-MoE: K is moe_topk (num_experts_per_tok its alias), which like num_experts may be a
 * per-layer list: equal entries read as the one value, differing ones refused by name; the
 * shared_mlp is as wide as an expert (I_s = I) and ungated. */
static void test_hunyuan(void **state)
{
    (void)state;
    fspec h = {.tag = "ck-hunyuan", .family = MOE_FAMILY_HUNYUAN_V1_MOE,
               .config = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": [8, 8],"
                         " \"moe_topk\": [3, 3]}",
               .H = 16, .I = 8, .E = 8, .K = 3, .L = 2, .Is = 8, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.wg.weight", .layout = L_PER_EXPERT, .shared = "shared_mlp",
               .wdt = MOE_DTYPE_BF16, .moe_mask = "11"};
    h.want = base_desc(MOE_FAMILY_HUNYUAN_V1_MOE, 16, 8, 8, 3, MOE_DTYPE_BF16);
    h.want.renormalize = 1;
    h.want.shared_expert_intermediate_size = 8;
    check_family(&h);
    /* the attribute map's other name for K */
    fspec a = h;
    a.tag = "ck-hunyuan-a";
    a.config = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
               " \"intermediate_size\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 3}";
    check_family(&a);

    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-hunyuan-x");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *differ = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": 8,"
                         " \"moe_topk\": [2, 4]}";
    expect_error(ctx, open_desc(ctx, dir, differ, tl, 0), MOE_EUNSUPPORTED, cfg, "'moe_topk'", "[1] = 4");
    const char *experts = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16,"
                          " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": [8, 16],"
                          " \"moe_topk\": 2}";
    expect_error(ctx, open_desc(ctx, dir, experts, tl, 0), MOE_EUNSUPPORTED, cfg, "'num_experts'", "per-layer");
    const char *none = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16,"
                       " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": 8}";
    expect_error(ctx, open_desc(ctx, dir, none, tl, 0), MOE_ENOTFOUND, cfg, "'moe_topk'", "'num_experts_per_tok'");
    /* a per-layer list is indexed by layer (HunYuanMoEV1Experts: config.num_experts[layer_idx]):
     * one entry per layer, else refused naming both lengths */
    const char *longer = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": [8, 8, 8],"
                         " \"moe_topk\": 2}";
    expect_error(ctx, open_desc(ctx, dir, longer, tl, 0), MOE_EFORMAT, cfg, "'num_experts' is a per-layer list of 3",
                 "num_hidden_layers is 2");
    const char *shorter = "{\"architectures\": [\"HunYuanMoEV1ForCausalLM\"], \"hidden_size\": 16,"
                          " \"num_hidden_layers\": 2, \"intermediate_size\": 8, \"num_experts\": 8,"
                          " \"moe_topk\": [2]}";
    expect_error(ctx, open_desc(ctx, dir, shorter, tl, 0), MOE_EFORMAT, cfg, "'moe_topk' is a per-layer list of 1",
                 "one entry per layer");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* Phi-MoE's sparsemixer selects exactly 2 experts: another num_experts_per_tok is refused as
 * the config's field (not as the layer description's top_k). */
static void test_phimoe_top_k(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-phimoe-k");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *k3 = "{\"architectures\": [\"PhimoeForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                     " \"intermediate_size\": 8, \"num_local_experts\": 4, \"num_experts_per_tok\": 3}";
    expect_error(ctx, open_desc(ctx, dir, k3, tl, 0), MOE_EFORMAT, cfg, "field 'num_experts_per_tok' = 3",
                 "phimoe routes with the sparsemixer, which selects exactly 2");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* Jamba's MoE layers: layer % expert_layer_period == expert_layer_offset (defaults 2, 1), none
 * with a single expert (JambaMLP), an offset not below the period refused. */
static void test_jamba_layers(void **state)
{
    (void)state;
    fspec j = {.tag = "ck-jamba", .family = MOE_FAMILY_JAMBA,
               .config = "{\"architectures\": [\"JambaForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 4,"
                         " \"intermediate_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2}",
               .H = 16, .I = 8, .E = 4, .K = 2, .L = 4, .prefix = "model.layers.%lld.feed_forward.",
               .router = "router.weight", .layout = L_PER_EXPERT, .wdt = MOE_DTYPE_F32, .moe_mask = "0101",
               .dense_why = "layer 0 % expert_layer_period = 0 != expert_layer_offset = 1"};
    j.want = base_desc(MOE_FAMILY_JAMBA, 16, 8, 4, 2, MOE_DTYPE_F32);
    check_family(&j);

    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-jamba-x");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *one = "{\"architectures\": [\"JambaForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"intermediate_size\": 8, \"num_experts\": 1, \"num_experts_per_tok\": 1}";
    expect_error(ctx, open_desc(ctx, dir, one, tl, 1), MOE_EDENSE, "num_experts is 1");
    const char *bad = "{\"architectures\": [\"JambaForCausalLM\"], \"hidden_size\": 16, \"num_hidden_layers\": 2,"
                      " \"intermediate_size\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
                      " \"expert_layer_period\": 2, \"expert_layer_offset\": 2}";
    expect_error(ctx, open_desc(ctx, dir, bad, tl, 1), MOE_EFORMAT, cfg, "'expert_layer_offset' = 2", "'expert_layer_period'");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* Aria: the routed experts are always SiLU-gated and the shared expert follows hidden_act, so
 * another hidden_act is refused by name, as is mlp_bias (a biased shared expert). (The maths is
 * checked against transformers on aria_f32.) */
static void test_aria_refusals(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-aria-x");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *aria = "{\"architectures\": [\"AriaForConditionalGeneration\"], \"text_config\": {\"hidden_size\": 16,"
                       " \"num_hidden_layers\": 1, \"intermediate_size\": 8, \"moe_num_experts\": 4%s}}";
    char buf[600];
    snprintf(buf, sizeof buf, aria, ", \"moe_topk\": 2, \"hidden_act\": \"gelu\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'text_config.hidden_act'", "SiLU");
    snprintf(buf, sizeof buf, aria, ", \"moe_topk\": 2, \"mlp_bias\": true");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'text_config.mlp_bias'", "biases");
    snprintf(buf, sizeof buf, aria, ", \"moe_topk\": 5");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EFORMAT, cfg, "'text_config.moe_topk' = 5");
    /* no text_config object: named as such, not as a missing top-level hidden_size */
    const char *flat = "{\"architectures\": [\"AriaForConditionalGeneration\"], \"vision_config\": {}}";
    expect_error(ctx, open_desc(ctx, dir, flat, tl, 0), MOE_EFORMAT, cfg, "aria keeps its text model's fields",
                 "'text_config', which this config.json does not have (absent)");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* ERNIE-4.5-MoE: MoE layers by moe_layer_interval / start_index / end_index (-1: the last); a
 * moe_norm_min above 1/E (the clamp could bind) and use_bias are refused by name. (The maths,
 * with its [1, E] correction bias, is checked against transformers on ernie4_5_moe_f32.) */
static void test_ernie_layers(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-ernie-x");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *ernie = "{\"architectures\": [\"Ernie4_5_MoeForCausalLM\"], \"hidden_size\": 16,"
                        " \"num_hidden_layers\": 6, \"moe_intermediate_size\": 8, \"moe_num_experts\": 8,"
                        " \"moe_k\": 2%s}";
    char buf[600];
    snprintf(buf, sizeof buf, ernie, "");
    /* defaults: start 1, interval 1, end -1 = layer 5 */
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EDENSE, "layer 0 < moe_layer_start_index = 1",
                 "MoE layers (5): 1, 2, 3, 4, 5");
    snprintf(buf, sizeof buf, ernie, ", \"moe_layer_interval\": 2, \"moe_layer_end_index\": 3");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 2), MOE_EDENSE, "(layer + 1) % moe_layer_interval", "1, 3");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 5), MOE_EDENSE, "layer 5 > moe_layer_end_index = 3");
    snprintf(buf, sizeof buf, ernie, ", \"moe_norm_min\": 0.5");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 1), MOE_EUNSUPPORTED, cfg, "'moe_norm_min'", "1 / moe_num_experts");
    snprintf(buf, sizeof buf, ernie, ", \"use_bias\": true");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 1), MOE_EUNSUPPORTED, cfg, "'use_bias'");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* The mlp_layer_types rule with a step (A.X-K2): mlp_layer_types absent, layer >=
 * first_k_dense_replace and layer % moe_layer_freq == 0, as AXK2Config fills the list; a layer
 * off the step is dense, named by moe_layer_freq. */
static void test_types_else_prefix_step(void **state)
{
    (void)state;
    fspec s = {.tag = "ck-axk2", .family = MOE_FAMILY_AXK2,
               .config = "{\"architectures\": [\"AXK2ForCausalLM\"], \"hidden_size\": 16,"
                         " \"num_hidden_layers\": 5, \"moe_intermediate_size\": 8, \"n_routed_experts\": 8,"
                         " \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 5, .Is = 8, .prefix = "model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_PER_EXPERT, .shared = "shared_experts", .sel_bias = 1,
               .wdt = MOE_DTYPE_F32, .moe_mask = "00101", .dense_why = "first_k_dense_replace = 1"};
    s.want = base_desc(MOE_FAMILY_AXK2, 16, 8, 8, 2, MOE_DTYPE_F32);
    s.want.scoring_func = MOE_SCORING_SIGMOID;
    s.want.renormalize = 1;
    s.want.routed_scaling_factor = 2.5f;
    s.want.shared_expert_intermediate_size = 8;
    s.want.group_score = MOE_GROUP_SCORE_TOP2_SUM;
    s.want.has_selection_bias = 1;
    check_family(&s);
    /* layer 1 (>= first, odd) is dense by the step */
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    tu_tmpdir(dir, sizeof dir, "ck-axk2s");
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    expect_error(ctx, open_desc(ctx, dir, s.config, tl, 3), MOE_EDENSE, "layer 3 % moe_layer_freq = 2 != 0",
                 "mlp_layer_types absent");
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* dots.3-note (Dots3NoteForConditionalGeneration as published: the text fields at the top
 * level, legacy names): the shared MLP moe_shared_expert_intermediate_size * n_shared_experts
 * wide, the legacy name winning over shared_experts_intermediate_size as the config class's
 * __post_init__ pops it; MoE layers by first_k_dense_replace and a per-layer moe_layer_freq
 * list; the same with mlp_layer_types in a text_config; a short or malformed freq list refused
 * by name. (The router and experts are checked against transformers on dots3_note_f32.) */
static void test_dots3_note_config(void **state)
{
    (void)state;
    fspec s = {.tag = "ck-dots3", .family = MOE_FAMILY_DOTS3_NOTE,
               .config = "{\"architectures\": [\"Dots3NoteForConditionalGeneration\"], \"model_type\": \"dots3_note\","
                         " \"hidden_size\": 16, \"num_hidden_layers\": 4, \"moe_intermediate_size\": 8,"
                         " \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 2,"
                         " \"moe_shared_expert_intermediate_size\": 4, \"shared_experts_intermediate_size\": 6,"
                         " \"first_k_dense_replace\": 1, \"moe_layer_freq\": [1, 1, 0, true],"
                         " \"routed_scaling_factor\": 2.0}",
               .H = 16, .I = 8, .E = 8, .K = 2, .L = 4, .Is = 8, .prefix = "model.language_model.layers.%lld.mlp.",
               .router = "gate.weight", .layout = L_STACKED, .shared = "shared_experts", .sel_bias = 1,
               .wdt = MOE_DTYPE_F32, .moe_mask = "0101", .dense_why = "layer 0 < first_k_dense_replace = 1"};
    s.want = base_desc(MOE_FAMILY_DOTS3_NOTE, 16, 8, 8, 2, MOE_DTYPE_F32);
    s.want.scoring_func = MOE_SCORING_SIGMOID;
    s.want.renormalize = 1;
    s.want.routed_scaling_factor = 2.0f;
    s.want.shared_expert_intermediate_size = 8;
    s.want.group_score = MOE_GROUP_SCORE_TOP2_SUM;
    s.want.has_selection_bias = 1;
    check_family(&s);

    /* save_pretrained's form: text_config, mlp_layer_types, the canonical shared width, the
     * CausalLM's prefix */
    s.tag = "ck-dots3t";
    s.config = "{\"architectures\": [\"Dots3NoteForCausalLM\"], \"model_type\": \"dots3_note_text\","
               " \"text_config\": {\"hidden_size\": 16, \"num_hidden_layers\": 4, \"moe_intermediate_size\": 8,"
               " \"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"n_shared_experts\": 3,"
               " \"shared_experts_intermediate_size\": 4, \"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\", \"dense\"],"
               " \"n_group\": 2, \"topk_group\": 1, \"norm_topk_prob\": false}}";
    s.prefix = "model.layers.%lld.mlp.";
    s.layout = L_PER_EXPERT;
    s.Is = 12;
    s.moe_mask = "0110";
    s.dense_why = "mlp_layer_types[0] is not \"sparse\"";
    s.want.renormalize = 0;
    s.want.routed_scaling_factor = 1.0f;
    s.want.shared_expert_intermediate_size = 12;
    s.want.n_group = 2;
    s.want.topk_group = 1;
    check_family(&s);

    /* layer 2: dense by its freq entry; a short list and a string entry are refused by name */
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    tu_tmpdir(dir, sizeof dir, "ck-dots3e");
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *base = "{\"architectures\": [\"Dots3NoteForConditionalGeneration\"], \"hidden_size\": 16,"
                       " \"num_hidden_layers\": 4, \"moe_intermediate_size\": 8, \"n_routed_experts\": 8,"
                       " \"num_experts_per_tok\": 2, \"moe_layer_freq\": %s}";
    char cfg[512];
    snprintf(cfg, sizeof cfg, base, "[1, 1, 0, 1]");
    expect_error(ctx, open_desc(ctx, dir, cfg, tl, 2), MOE_EDENSE, "moe_layer_freq[2] is false", "mlp_layer_types absent");
    snprintf(cfg, sizeof cfg, base, "[1, 1, 0]");
    expect_error(ctx, open_desc(ctx, dir, cfg, tl, 1), MOE_EFORMAT, "'moe_layer_freq' has 3 entries for 4 layers", NULL);
    snprintf(cfg, sizeof cfg, base, "[1, \"yes\", 0, 1]");
    expect_error(ctx, open_desc(ctx, dir, cfg, tl, 1), MOE_EFORMAT, "'moe_layer_freq'[1] must be a boolean or an integer",
                 NULL);
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* Nemotron-H: the MoE layers are layers_block_type's "moe" entries (the layer count is the
 * list's length: NemotronHConfig writes no num_hidden_layers), else the legacy
 * hybrid_override_pattern's 'E' characters, else the config class's default list (layer 1 of
 * 4); moe_latent_size, mlp_bias, a gated or unknown mlp_hidden_act and a quantized checkpoint
 * (non-gated experts are read in f32 / bf16 only) are refused by name. (The maths, relu2
 * experts and shared MLP, is checked against transformers on nemotron_h_f32.) */
static void test_nemotron_h_config(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700];
    tu_tmpdir(dir, sizeof dir, "ck-nemotron-h");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float dummy[4] = {0};
    tl_add(tl, "model.norm.weight", MOE_DTYPE_F32, 1, (int64_t[]){4}, dummy);
    const char *nh = "{\"architectures\": [\"NemotronHForCausalLM\"], \"hidden_size\": 16,"
                     " \"moe_intermediate_size\": 8, \"n_routed_experts\": 8, \"num_experts_per_tok\": 2%s}";
    char buf[800];
    snprintf(buf, sizeof buf, nh, ", \"layers_block_type\": [\"mlp\", \"moe\", \"full_attention\", \"moe\"]");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EDENSE, "layers_block_type", "MoE layers (2): 1, 3");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 2), MOE_EDENSE, "is not \"moe\"");
    snprintf(buf, sizeof buf, nh, ", \"hybrid_override_pattern\": \"M-E*E\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EDENSE, "MoE layers (2): 2, 4");
    snprintf(buf, sizeof buf, nh, ""); /* the class's [linear_attention, moe, full_attention, mlp] */
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 3), MOE_EDENSE, "MoE layers (1): 1");
    snprintf(buf, sizeof buf, nh, ", \"layers_block_type\": [\"moe\", 3]");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EFORMAT, cfg, "'layers_block_type'[1]");
    snprintf(buf, sizeof buf, nh, ", \"layers_block_type\": [\"moe\"], \"moe_latent_size\": 8");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'moe_latent_size' = 8", "latent");
    snprintf(buf, sizeof buf, nh, ", \"layers_block_type\": [\"moe\"], \"mlp_bias\": true");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'mlp_bias'", "biases");
    snprintf(buf, sizeof buf, nh, ", \"layers_block_type\": [\"moe\"], \"mlp_hidden_act\": \"silu\"");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "'mlp_hidden_act' = \"silu\"",
                 "non-gated");
    snprintf(buf, sizeof buf, nh,
             ", \"layers_block_type\": [\"moe\"], \"quantization_config\": {\"quant_method\": \"fp8\","
             " \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}");
    expect_error(ctx, open_desc(ctx, dir, buf, tl, 0), MOE_EUNSUPPORTED, cfg, "nemotron_h", "non-gated",
                 "quantization_config");
    static const char *const qcs[] = {
        "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": false, \"sym\": true}",
        "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 64, \"zero_point\": true, \"version\": \"gemm\"}"};
    for (int q = 0; q < 2; q++) { /* GPTQ, AWQ */
        snprintf(buf, sizeof buf, nh, ", \"layers_block_type\": [\"moe\"], \"quantization_config\": %s");
        char buf2[1200];
        snprintf(buf2, sizeof buf2, buf, qcs[q]);
        expect_error(ctx, open_desc(ctx, dir, buf2, tl, 0), MOE_EUNSUPPORTED, cfg, "nemotron_h", "non-gated",
                     "GPTQ, AWQ");
    }
    tl_free(tl);
    free(tl);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

/* DBRX (config.json of DbrxConfig.save_pretrained: d_model, n_layers, and the block's fields in
 * the ffn_config object) into d: the router and the three fused [E I, H] expert tensors of layer
 * 0 are written for E, I, H; returns what moe_checkpoint_open / moe_checkpoint_layer_desc return. */
static moe_status dbrx_desc(moe_ctx *ctx, const char *dir, const char *config, int64_t E, int64_t I, int64_t H,
                            int64_t w2_rows, moe_layer_desc *d)
{
    tlist *tl = calloc(1, sizeof *tl);
    assert_non_null(tl);
    float *z = calloc((size_t)(E * I * H + E * H), sizeof(float)); /* values do not matter here */
    assert_non_null(z);
    tl_add(tl, "transformer.blocks.0.ffn.router.layer.weight", MOE_DTYPE_F32, 2, (int64_t[]){E, H}, z);
    tl_add(tl, "transformer.blocks.0.ffn.experts.mlp.w1", MOE_DTYPE_F32, 2, (int64_t[]){E * I, H}, z);
    tl_add(tl, "transformer.blocks.0.ffn.experts.mlp.v1", MOE_DTYPE_F32, 2, (int64_t[]){E * I, H}, z);
    tl_add(tl, "transformer.blocks.0.ffn.experts.mlp.w2", MOE_DTYPE_F32, 2, (int64_t[]){w2_rows, H}, z);
    write_text(dir, "config.json", config);
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(moe_safetensors_write(ctx, path, tl->t, tl->n), MOE_OK);
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        assert_int_equal(moe_checkpoint_num_layers(ck), 2);
        assert_int_equal(moe_checkpoint_is_moe_layer(ck, 1), 1); /* every DbrxBlock has a DbrxFFN */
        st = moe_checkpoint_layer_desc(ck, 0, d);
        moe_checkpoint_free(ck);
    }
    tl_free(tl);
    free(tl);
    free(z);
    return st;
}

/* DBRX: the MoE fields are read in ffn_config (DbrxFFNConfig's defaults when a key, or the whole
 * object, is absent: 3584, 4 experts, top-1, silu, p 1.0), H in d_model and the layer count in
 * n_layers; moe_normalize_expert_weights gives renormalize_p (null: not renormalized; 0, a
 * negative p or a string refused by name); ffn_act_fn.name picks the activation (another refused
 * by its full name); a quantization_config is refused for the fused layout; a w2 of another shape
 * is an MOE_ESHAPE naming it. (The maths is checked against transformers on dbrx_f32 and
 * dbrx_p2_f32.) */
static void test_dbrx_config(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], cfg[700], buf[1200];
    tu_tmpdir(dir, sizeof dir, "ck-dbrx");
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    const char *db = "{\"architectures\": [\"DbrxForCausalLM\"], \"model_type\": \"dbrx\", \"d_model\": 8,"
                     " \"n_layers\": 2%s}";
    moe_layer_desc d;
    struct {
        const char *ffn;
        int renorm;
        float p;
        moe_activation act;
    } ok[] = {
        {", \"ffn_config\": {\"ffn_hidden_size\": 4, \"moe_num_experts\": 6, \"moe_top_k\": 3}", 1, 1.0f,
         MOE_ACT_SWIGLU},
        {", \"ffn_config\": {\"ffn_hidden_size\": 4, \"moe_num_experts\": 6, \"moe_top_k\": 3,"
         " \"moe_normalize_expert_weights\": null, \"ffn_act_fn\": {\"name\": \"gelu_pytorch_tanh\"}}", 0, 1.0f,
         MOE_ACT_GEGLU_TANH},
        {", \"ffn_config\": {\"ffn_hidden_size\": 4, \"moe_num_experts\": 6, \"moe_top_k\": 3,"
         " \"moe_normalize_expert_weights\": 2.0, \"ffn_act_fn\": {\"name\": \"gelu\", \"approximate\": 1},"
         " \"moe_jitter_eps\": 0.01, \"moe_loss_weight\": 0.05}", 1, 2.0f, MOE_ACT_GEGLU},
        {", \"ffn_config\": {\"ffn_hidden_size\": 4, \"moe_num_experts\": 6, \"moe_top_k\": 3,"
         " \"moe_normalize_expert_weights\": 3, \"ffn_act_fn\": null}", 1, 3.0f, MOE_ACT_SWIGLU},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        snprintf(buf, sizeof buf, db, ok[i].ffn);
        if (dbrx_desc(ctx, dir, buf, 6, 4, 8, 24, &d) != MOE_OK)
            fail_msg("case %zu: %s", i, moe_ctx_last_error(ctx));
        assert_int_equal(d.family, MOE_FAMILY_DBRX);
        assert_int_equal(d.hidden_size, 8);
        assert_int_equal(d.moe_intermediate_size, 4);
        assert_int_equal(d.num_experts, 6);
        assert_int_equal(d.top_k, 3);
        assert_int_equal(d.scoring_func, MOE_SCORING_SOFTMAX);
        assert_int_equal(d.renormalize, ok[i].renorm);
        if (d.renormalize)
            assert_true(d.renormalize_p == ok[i].p && d.renormalize_eps == 1e-20f);
        assert_int_equal(d.activation, ok[i].act);
        assert_int_equal(d.shared_expert_intermediate_size, 0);
    }
    /* DbrxFFNConfig's defaults: ffn_config absent, or present without the sizes */
    for (int v = 0; v < 2; v++) {
        snprintf(buf, sizeof buf, db, v ? ", \"ffn_config\": {\"moe_jitter_eps\": null}" : "");
        if (dbrx_desc(ctx, dir, buf, 4, 3584, 8, 4 * 3584, &d) != MOE_OK)
            fail_msg("defaults %d: %s", v, moe_ctx_last_error(ctx));
        assert_true(d.moe_intermediate_size == 3584 && d.num_experts == 4 && d.top_k == 1);
        assert_true(d.renormalize == 1 && d.renormalize_p == 1.0f && d.activation == MOE_ACT_SWIGLU);
    }
    /* refused by name */
    const char *sizes = "\"ffn_hidden_size\": 4, \"moe_num_experts\": 6, \"moe_top_k\": 3";
    struct {
        const char *extra;
        moe_status st;
        const char *a, *b;
    } bad[] = {
        {", \"moe_normalize_expert_weights\": 0", MOE_EUNSUPPORTED, "'ffn_config.moe_normalize_expert_weights' = 0",
         "p > 0"},
        {", \"moe_normalize_expert_weights\": -1.5", MOE_EUNSUPPORTED, "'ffn_config.moe_normalize_expert_weights' = -1.5",
         "torch.norm"},
        {", \"moe_normalize_expert_weights\": \"2\"", MOE_EFORMAT, "'ffn_config.moe_normalize_expert_weights'",
         "must be a number"},
        {", \"ffn_act_fn\": {\"name\": \"relu\"}", MOE_EUNSUPPORTED, "'ffn_config.ffn_act_fn.name' = \"relu\"", "silu"},
        {", \"ffn_act_fn\": \"silu\"", MOE_EFORMAT, "'ffn_config.ffn_act_fn' must be an object", "name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char ffn[400];
        snprintf(ffn, sizeof ffn, ", \"ffn_config\": {%s%s}", sizes, bad[i].extra);
        snprintf(buf, sizeof buf, db, ffn);
        expect_error(ctx, dbrx_desc(ctx, dir, buf, 6, 4, 8, 24, &d), bad[i].st, cfg, bad[i].a, bad[i].b);
    }
    snprintf(buf, sizeof buf, db, ", \"ffn_config\": {\"ffn_hidden_size\": 4, \"moe_num_experts\": 6, \"moe_top_k\": 7}");
    expect_error(ctx, dbrx_desc(ctx, dir, buf, 6, 4, 8, 24, &d), MOE_EFORMAT, cfg, "'ffn_config.moe_top_k' = 7",
                 "exceeds the 6 experts");
    snprintf(buf, sizeof buf, db, ", \"ffn_config\": [4]");
    expect_error(ctx, dbrx_desc(ctx, dir, buf, 6, 4, 8, 24, &d), MOE_EFORMAT, cfg, "'ffn_config' must be an object");
    char ffn[400];
    snprintf(ffn, sizeof ffn, ", \"ffn_config\": {%s}, \"quantization_config\": {\"quant_method\": \"fp8\","
             " \"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}", sizes);
    snprintf(buf, sizeof buf, db, ffn);
    expect_error(ctx, dbrx_desc(ctx, dir, buf, 6, 4, 8, 24, &d), MOE_EUNSUPPORTED, cfg, "family dbrx",
                 "experts.mlp.w1, experts.mlp.v1, experts.mlp.w2", "quantization_config");
    snprintf(ffn, sizeof ffn, ", \"ffn_config\": {%s}", sizes);
    snprintf(buf, sizeof buf, db, ffn);
    expect_error(ctx, dbrx_desc(ctx, dir, buf, 6, 4, 8, 25, &d), MOE_ESHAPE, "transformer.blocks.0.ffn.experts.mlp.w2",
                 "[E I, H]");
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepseek_v3),   cmocka_unit_test(test_mlp_layer_types), cmocka_unit_test(test_phimoe_top_k),
        cmocka_unit_test(test_deepseek_v2),
        cmocka_unit_test(test_gpt_oss),       cmocka_unit_test(test_llama4),
        cmocka_unit_test(test_olmoe_granite), cmocka_unit_test(test_qwen35_next),
        cmocka_unit_test(test_gelu_act),      cmocka_unit_test(test_family_errors),
        cmocka_unit_test(test_hybrid_rows),
        cmocka_unit_test(test_granite_shared_mlp),
        cmocka_unit_test(test_hunyuan),
        cmocka_unit_test(test_jamba_layers),
        cmocka_unit_test(test_aria_refusals), cmocka_unit_test(test_cohere2_strings),
        cmocka_unit_test(test_ernie_layers),
        cmocka_unit_test(test_row_field_names), cmocka_unit_test(test_types_else_prefix_step),
        cmocka_unit_test(test_nemotron_h_config),
        cmocka_unit_test(test_dbrx_config), cmocka_unit_test(test_dots3_note_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
