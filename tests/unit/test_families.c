/* Every routing and expert mode of the MoE families (moe.h "Layer description"):
 *
 *  - the plan path against the src/ref oracle, bit for bit, for every mode: every kernel
 *    table, 1 and 2 threads, chunk sizes 7 and 2^20, top-k by sort and by row-max, the
 *    standard and the batched prepare/finalize;
 *  - weight layouts (input-major halves as Llama-4, interleaved as gpt-oss) give the bits of
 *    the same weights given row-major;
 *  - hand-checked values of each scoring mode, group selection and activation;
 *  - REGRESSIONS.md R6 (NaN, +-Inf in logits and biases; a selection bias leaving fewer than
 *    topk_group groups finite), R7 (ties at the K-th boundary, all-equal rows) and R8
 *    (renormalize, scaling once, weight on the input once) in every scoring mode;
 *  - description and weight-source validation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "quant/convert.h"
#include "ref/ref.h"
#include "testutil.h"

/* ---- a layer in any layout ------------------------------------------------------------ */

enum { LAYOUT_ROW = 0, LAYOUT_HALVES = 1, LAYOUT_INTERLEAVED = 2 };

typedef struct fam_cfg {
    int64_t H, I, E, K, Is;
    int gated;
    moe_scoring scoring;
    int renorm;
    float scale;
    int64_t n_group, topk_group;
    moe_group_score gscore;
    int sel_bias, router_bias, expert_bias, on_input;
    moe_activation act;
    int layout;
    moe_dtype dt, bias_dt;
    float wscale; /* gate/up weight scale multiplier (reach gpt-oss's clamp) */
    float sm_eps; /* MOE_SCORING_SPARSEMIXER: sparsemixer_jitter_eps */
    int out_bias; /* has_output_bias (JetMoE), b_o [H] in bias_dt */
    float cg, cu; /* MOE_ACT_SWIGLU_SOFTCAP: softcap_gate, softcap_up (0: the defaults) */
    int sh_act_on; /* has_shared_activation (HY-V4), the shared expert computing sh_act */
    int out_norm;  /* has_output_norm (A.X-K1), w_n [H] in bias_dt, eps 1e-5 */
    moe_activation sh_act;
    float renorm_eps; /* renormalize_eps (LFM2-MoE 1e-6, Cohere2-MoE 0); default 1e-20 */
    float sh_scale;   /* shared_expert_scale (Cohere2-MoE's "average" 0.5); default 1 */
    int64_t Z;     /* num_identity_experts (LongCat-Flash): router and its biases [E + Z] */
    float limit, sh_limit; /* swiglu_limit (0: the default 7), shared_swiglu_limit (Step-3.7) */
    float sh_wscale;       /* shared gate/up weight scale multiplier (0: 1) */
    float renorm_p;        /* renormalize_p (DBRX's moe_normalize_expert_weights); default 1 */
} fam_cfg;

static fam_cfg cfg_default(int64_t H, int64_t I, int64_t E, int64_t K)
{
    fam_cfg c;
    memset(&c, 0, sizeof c);
    c.H = H;
    c.I = I;
    c.E = E;
    c.K = K;
    c.scoring = MOE_SCORING_SOFTMAX;
    c.scale = 1.0f;
    c.gscore = MOE_GROUP_SCORE_MAX;
    c.act = MOE_ACT_SWIGLU;
    c.dt = MOE_DTYPE_F32;
    c.bias_dt = MOE_DTYPE_F32;
    c.wscale = 1.0f;
    c.renorm_eps = 1e-20f;
    c.sh_scale = 1.0f;
    c.renorm_p = 1.0f;
    return c;
}

typedef struct fam_layer {
    fam_cfg c;
    moe_layer_desc d;
    void *router;                   /* [E, H] dt */
    float *gf, *uf, *df;            /* f32 masters: [E][I*H], [E][I*H], [E][H*I] row-major */
    void *gu_store, *dn_store;      /* the weights in the chosen layout, dtype dt */
    const void **gp, **upp, **dp;   /* [E] */
    void *sg, *su, *sd, *sgate;
    void *rbias, *sbias;            /* [E] bias_dt */
    void *obias;
    void *onorm;                    /* [H] bias_dt: the output RMSNorm weight (has_output_norm) */                    /* [H] bias_dt */
    void *gub, *db;                 /* gate/up bias [E, 2I] (interleaved or halves), down [E, H] */
    const void **gbp, **ubp, **dbp; /* [E] */
    moe_weight_source src;
} fam_layer;

static void *to_dtype(const float *f, int64_t n, moe_dtype dt)
{
    size_t es = moe_dtype_size(dt);
    void *p = malloc(es * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        if (dt == MOE_DTYPE_F32)
            ((float *)p)[i] = f[i];
        else if (dt == MOE_DTYPE_BF16)
            ((uint16_t *)p)[i] = moe_f32_to_bf16(f[i]);
        else
            ((uint16_t *)p)[i] = moe_f32_to_f16(f[i]);
    }
    return p;
}

static void *rand_dt(int64_t n, moe_dtype dt, uint64_t seed, float lo, float hi)
{
    float *f = malloc(sizeof(float) * (size_t)(n ? n : 1));
    tu_fill_uniform(f, (size_t)n, seed, lo, hi);
    void *p = to_dtype(f, n, dt);
    free(f);
    return p;
}

static void layer_build(fam_layer *L, const fam_cfg *c, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    L->c = *c;
    const int64_t H = c->H, I = c->I, E = c->E;
    moe_layer_desc_init(&L->d);
    L->d.hidden_size = H;
    L->d.moe_intermediate_size = I;
    L->d.num_experts = E;
    L->d.top_k = c->K;
    L->d.scoring_func = c->scoring;
    L->d.renormalize = c->renorm;
    L->d.routed_scaling_factor = c->scale;
    L->d.activation = c->act;
    L->d.shared_expert_intermediate_size = c->Is;
    L->d.shared_expert_gated = c->gated;
    L->d.weight_dtype = c->dt;
    L->d.n_group = c->n_group;
    L->d.topk_group = c->topk_group;
    L->d.group_score = c->gscore;
    L->d.has_selection_bias = c->sel_bias;
    L->d.has_router_bias = c->router_bias;
    L->d.has_expert_bias = c->expert_bias;
    L->d.apply_router_weight_on_input = c->on_input;
    if (c->scoring == MOE_SCORING_SPARSEMIXER)
        L->d.sparsemixer_jitter_eps = c->sm_eps;
    L->d.has_output_bias = c->out_bias;
    if (c->cg > 0.0f)
        L->d.softcap_gate = c->cg, L->d.softcap_up = c->cu;
    L->d.has_shared_activation = c->sh_act_on;
    L->d.shared_activation = c->sh_act;
    L->d.renormalize_eps = c->renorm_eps;
    L->d.renormalize_p = c->renorm_p;
    L->d.shared_expert_scale = c->sh_scale;
    L->d.has_output_norm = c->out_norm;
    L->d.output_norm_eps = 1e-5f;
    L->d.num_identity_experts = c->Z;
    const int64_t R = E + c->Z; /* the router's rows */
    if (c->limit > 0.0f)
        L->d.swiglu_limit = c->limit;
    L->d.shared_swiglu_limit = c->sh_limit;

    const float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
    L->router = rand_dt(R * H, c->dt, seed + 1, -4.0f * sh, 4.0f * sh);
    L->gf = malloc(sizeof(float) * (size_t)(E * I * H));
    L->uf = malloc(sizeof(float) * (size_t)(E * I * H));
    L->df = malloc(sizeof(float) * (size_t)(E * H * I));
    tu_fill_uniform(L->gf, (size_t)(E * I * H), seed + 2, -c->wscale * sh, c->wscale * sh);
    tu_fill_uniform(L->uf, (size_t)(E * I * H), seed + 3, -c->wscale * sh, c->wscale * sh);
    tu_fill_uniform(L->df, (size_t)(E * H * I), seed + 4, -si, si);

    /* Gate and up in the chosen layout (same values), down row-major [E][H, I] or input-major
     * [E][I, H]. */
    float *gu = calloc((size_t)(E * 2 * I * H), sizeof(float));
    float *dn = calloc((size_t)(E * H * I), sizeof(float));
    L->gp = calloc((size_t)E, sizeof(void *));
    L->upp = calloc((size_t)E, sizeof(void *));
    L->dp = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        for (int64_t o = 0; o < I; o++) {
            for (int64_t i = 0; i < H; i++) {
                float g = L->gf[(e * I + o) * H + i], u = L->uf[(e * I + o) * H + i];
                if (c->layout == LAYOUT_ROW) { /* [E][gate [I,H] then up [I,H]] */
                    gu[e * 2 * I * H + o * H + i] = g;
                    gu[e * 2 * I * H + I * H + o * H + i] = u;
                } else if (c->layout == LAYOUT_HALVES) { /* [E, H, 2I], gate = columns [0, I) */
                    gu[e * 2 * I * H + i * 2 * I + o] = g;
                    gu[e * 2 * I * H + i * 2 * I + I + o] = u;
                } else { /* [E, H, 2I], gate = even columns */
                    gu[e * 2 * I * H + i * 2 * I + 2 * o] = g;
                    gu[e * 2 * I * H + i * 2 * I + 2 * o + 1] = u;
                }
            }
        }
        for (int64_t o = 0; o < H; o++)
            for (int64_t i = 0; i < I; i++) {
                float v = L->df[(e * H + o) * I + i];
                if (c->layout == LAYOUT_ROW)
                    dn[e * H * I + o * I + i] = v;
                else
                    dn[e * H * I + i * H + o] = v; /* [E, I, H] */
            }
    }
    L->gu_store = to_dtype(gu, E * 2 * I * H, c->dt);
    L->dn_store = to_dtype(dn, E * H * I, c->dt);
    free(gu);
    free(dn);
    const size_t es = moe_dtype_size(c->dt);
    for (int64_t e = 0; e < E; e++) {
        const unsigned char *base = (const unsigned char *)L->gu_store + (size_t)(e * 2 * I * H) * es;
        L->gp[e] = base;
        L->upp[e] = base + (size_t)(c->layout == LAYOUT_ROW ? I * H : c->layout == LAYOUT_HALVES ? I : 1) * es;
        L->dp[e] = (const unsigned char *)L->dn_store + (size_t)(e * H * I) * es;
    }
    L->src.router = L->router;
    L->src.router_dtype = c->dt;
    L->src.gate_proj = L->gp;
    L->src.up_proj = L->upp;
    L->src.down_proj = L->dp;
    if (c->layout != LAYOUT_ROW) {
        L->src.gate_up_stride_out = c->layout == LAYOUT_HALVES ? 1 : 2;
        L->src.gate_up_stride_in = 2 * I;
        L->src.down_stride_out = 1;
        L->src.down_stride_in = H;
    }
    if (c->Is > 0) {
        const float ss = 1.0f / sqrtf((float)c->Is);
        const float sw = c->sh_wscale > 0.0f ? c->sh_wscale * sh : sh;
        L->sg = rand_dt(c->Is * H, c->dt, seed + 7, -sw, sw);
        L->su = rand_dt(c->Is * H, c->dt, seed + 8, -sw, sw);
        L->sd = rand_dt(H * c->Is, c->dt, seed + 9, -ss, ss);
        L->src.shared_gate_proj = L->sg;
        L->src.shared_up_proj = L->su;
        L->src.shared_down_proj = L->sd;
        if (c->gated) {
            L->sgate = rand_dt(H, c->dt, seed + 10, -sh, sh);
            L->src.shared_expert_gate = L->sgate;
        }
    }
    if (c->router_bias) {
        L->rbias = rand_dt(R, c->bias_dt, seed + 11, -1.0f, 1.0f);
        L->src.router_bias = L->rbias;
        L->src.router_bias_dtype = c->bias_dt;
    }
    if (c->out_bias) {
        L->obias = rand_dt(H, c->bias_dt, seed + 15, -0.7f, 0.7f);
        L->src.output_bias = L->obias;
        L->src.output_bias_dtype = c->bias_dt;
    }
    if (c->out_norm) {
        L->onorm = rand_dt(H, c->bias_dt, seed + 16, 0.5f, 1.5f);
        L->src.output_norm = L->onorm;
        L->src.output_norm_dtype = c->bias_dt;
    }
    if (c->sel_bias) {
        L->sbias = rand_dt(R, c->bias_dt, seed + 12, -0.3f, 0.3f);
        L->src.selection_bias = L->sbias;
        L->src.selection_bias_dtype = c->bias_dt;
    }
    if (c->expert_bias) {
        /* the same b_g, b_u values in either arrangement: halves [E][b_g | b_u] or
         * interleaved [E][b_g0 b_u0 b_g1 b_u1 ...] */
        float *bgu = malloc(sizeof(float) * (size_t)(E * 2 * I)), *arr = malloc(sizeof(float) * (size_t)(E * 2 * I));
        tu_fill_uniform(bgu, (size_t)(E * 2 * I), seed + 13, -1.0f, 1.0f);
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = 0; j < I; j++) {
                float bgv = bgu[e * 2 * I + j], buv = bgu[e * 2 * I + I + j];
                if (c->layout == LAYOUT_INTERLEAVED) {
                    arr[e * 2 * I + 2 * j] = bgv;
                    arr[e * 2 * I + 2 * j + 1] = buv;
                } else {
                    arr[e * 2 * I + j] = bgv;
                    arr[e * 2 * I + I + j] = buv;
                }
            }
        L->gub = to_dtype(arr, E * 2 * I, c->bias_dt);
        free(bgu);
        free(arr);
        L->db = rand_dt(E * H, c->bias_dt, seed + 14, -0.5f, 0.5f);
        L->gbp = calloc((size_t)E, sizeof(void *));
        L->ubp = calloc((size_t)E, sizeof(void *));
        L->dbp = calloc((size_t)E, sizeof(void *));
        const size_t bs = moe_dtype_size(c->bias_dt);
        const int inter = c->layout == LAYOUT_INTERLEAVED;
        for (int64_t e = 0; e < E; e++) {
            const unsigned char *b = (const unsigned char *)L->gub + (size_t)(e * 2 * I) * bs;
            L->gbp[e] = b;
            L->ubp[e] = b + (size_t)(inter ? 1 : I) * bs;
            L->dbp[e] = (const unsigned char *)L->db + (size_t)(e * H) * bs;
        }
        L->src.gate_bias = L->gbp;
        L->src.up_bias = L->ubp;
        L->src.down_bias = L->dbp;
        L->src.expert_bias_dtype = c->bias_dt;
        L->src.gate_up_bias_stride = inter ? 2 : 1;
    }
    /* non-gated experts (moe_activation_gated 0): W1 is up_proj; the gate arrays are left
     * NULL, so a read of them crashes the test */
    if (!moe_activation_gated(c->act)) {
        L->src.gate_proj = NULL;
        L->src.gate_bias = NULL;
    }
    if (c->Is > 0 && !moe_activation_gated(c->sh_act_on ? c->sh_act : c->act))
        L->src.shared_gate_proj = NULL;
}

static void layer_free(fam_layer *L)
{
    free(L->router);
    free(L->gf);
    free(L->uf);
    free(L->df);
    free(L->gu_store);
    free(L->dn_store);
    free(L->gp);
    free(L->upp);
    free(L->dp);
    free(L->sg);
    free(L->su);
    free(L->sd);
    free(L->sgate);
    free(L->rbias);
    free(L->sbias);
    free(L->obias);
    free(L->onorm);
    free(L->gub);
    free(L->db);
    free(L->gbp);
    free(L->ubp);
    free(L->dbp);
}

/* ---- running ------------------------------------------------------------------------- */

static const char *g_permute; /* moe_options.permute of the next make_ctx (NULL: auto) */

static moe_ctx *make_ctx(const char *isa, int threads, int64_t chunk, const char *topk)
{
    moe_options o;
    moe_options_init(&o);
    o.permute = g_permute;
    o.isa = isa;
    o.num_threads = threads;
    o.chunk_size = chunk;
    o.topk = topk;
    o.log_level = MOE_LOG_ERROR; /* the avx2 table's partial-panel warning is expected here */
    moe_ctx *ctx = NULL;
    char err[512];
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        return NULL; /* ISA not supported here */
    return ctx;
}

static void run_plan(moe_ctx *ctx, const moe_plan_config *pc, fam_layer *L, const float *x, int64_t T,
                     const float *logits, float *out, int32_t *ids, float *wts)
{
    moe_plan *plan = NULL;
    moe_status st = moe_plan_create_ex(ctx, &L->d, pc, &plan);
    if (st != MOE_OK)
        fail_msg("plan: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    moe_weights *w = NULL;
    st = moe_weights_create(plan, &L->src, &w);
    if (st != MOE_OK)
        fail_msg("weights: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    size_t wsz = moe_plan_workspace_size(plan, T);
    void *ws = wsz ? malloc(wsz) : NULL;
    moe_exec_args a;
    memset(&a, 0, sizeof a);
    a.hidden_states = x;
    a.hidden_dtype = MOE_DTYPE_F32;
    a.n_tokens = T;
    a.router_logits = logits;
    a.output = out;
    a.topk_ids = ids;
    a.topk_weights = wts;
    a.workspace = ws;
    a.workspace_size = wsz;
    st = moe_plan_execute_ex(plan, w, &a);
    if (st != MOE_OK)
        fail_msg("execute: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(plan);
}

/* Bits equal, NaN payloads included. */
static int same_bits(const void *a, const void *b, size_t n)
{
    return memcmp(a, b, n) == 0;
}

/* The plan path gives src/ref's bits in every configuration. Returns the reference outputs
 * (caller frees) when out_ref etc. are non-NULL. */
static void check_bits(fam_layer *L, const float *x, int64_t T, const float *logits, float **out_ref,
                       int32_t **ids_ref, float **w_ref)
{
    const int64_t H = L->c.H, K = L->c.K;
    const size_t nx = (size_t)(T * H), nk = (size_t)(T * K);
    float *ref = malloc(sizeof(float) * (nx + 1));
    int32_t *rid = malloc(sizeof(int32_t) * (nk + 1));
    float *rw = malloc(sizeof(float) * (nk + 1));
    assert_int_equal(moe_ref_forward(&L->d, &L->src, x, T, logits, ref, rid, rw), MOE_OK);
    for (size_t i = 0; i < nk; i++) {
        assert_in_range(rid[i], 0, L->c.E + L->c.Z - 1); /* ids >= E: identity experts */
        for (size_t j = i - i % (size_t)K; j < i; j++)
            assert_int_not_equal(rid[i], rid[j]);
    }

    /* every table x threads x chunk size with sort and the standard format, then the other
     * top-k method and the batched format on a few of them */
    typedef struct run_cfg {
        const char *isa;
        int threads;
        int64_t chunk;
        const char *topk;
        int pf;
        const char *permute; /* NULL: auto */
    } run_cfg;
    const char *isas[16]; /* the kernel registry's rows */
    const size_t n_isas = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    run_cfg runs[4 * 16 + 5];
    size_t nr = 0;
    for (size_t i = 0; i < n_isas; i++)
        for (int th = 1; th <= 2; th++)
            for (int ch = 0; ch < 2; ch++)
                runs[nr++] = (run_cfg){isas[i], th, ch ? 7 : 1 << 20, "sort", 0, NULL};
    runs[nr++] = (run_cfg){NULL, 2, 7, "rowmax", 0, NULL};
    runs[nr++] = (run_cfg){NULL, 2, 1 << 20, "sort", 1, NULL};
    runs[nr++] = (run_cfg){"ref", 1, 7, "rowmax", 1, NULL};
    runs[nr++] = (run_cfg){NULL, 2, 7, "sort", 0, "onehot"};
    runs[nr++] = (run_cfg){NULL, 1, 1 << 20, "sort", 0, "packed"};
    float *out = malloc(sizeof(float) * (nx + 1));
    int32_t *id = malloc(sizeof(int32_t) * (nk + 1));
    float *w = malloc(sizeof(float) * (nk + 1));
    for (size_t r = 0; r < nr; r++) {
        const char *isa = runs[r].isa;
        const int thr = runs[r].threads, pf = runs[r].pf;
        const int64_t chunk = runs[r].chunk;
        const char *tkm = runs[r].topk;
        g_permute = runs[r].permute;
        moe_ctx *ctx = make_ctx(isa, thr, chunk, tkm);
        g_permute = NULL;
        if (!ctx)
            continue;
        moe_plan_config pc;
        moe_plan_config_init(&pc);
        if (pf) {
            pc.prepare_finalize = MOE_PF_LOCAL_BATCHED;
            pc.experts = MOE_EXPERTS_BATCHED;
            pc.batched_capacity = 5;
        }
        out[nx] = -777.0f;
        run_plan(ctx, &pc, L, x, T, logits, out, id, w);
        if (!same_bits(out, ref, sizeof(float) * nx) || !same_bits(id, rid, sizeof(int32_t) * nk) ||
            !same_bits(w, rw, sizeof(float) * nk))
            fail_msg("plan differs from src/ref: isa %s threads %d chunk %lld topk %s %s; scoring %d "
                     "act %d layout %d groups %lld/%lld on_input %d (max out diff %g)",
                     isa ? isa : "auto", thr, (long long)chunk, tkm,
                     pf ? "batched" : "standard", (int)L->c.scoring, (int)L->c.act, L->c.layout,
                     (long long)L->c.n_group, (long long)L->c.topk_group, L->c.on_input,
                     tu_max_abs_diff(out, ref, nx));
        assert_true(out[nx] == -777.0f);
        moe_ctx_free(ctx);
    }
    free(out);
    free(id);
    free(w);
    if (out_ref)
        *out_ref = ref;
    else
        free(ref);
    if (ids_ref)
        *ids_ref = rid;
    else
        free(rid);
    if (w_ref)
        *w_ref = rw;
    else
        free(rw);
}

static float *rand_x(int64_t T, int64_t H, uint64_t seed, float amp)
{
    float *x = malloc(sizeof(float) * (size_t)(T * H + 1));
    tu_fill_uniform(x, (size_t)(T * H), seed, -amp, amp);
    return x;
}

static void check_cfg(const fam_cfg *c, int64_t T, uint64_t seed)
{
    fam_layer L;
    layer_build(&L, c, seed);
    float *x = rand_x(T, c->H, seed ^ 0x5a5a, 1.5f);
    check_bits(&L, x, T, NULL, NULL, NULL, NULL);
    free(x);
    layer_free(&L);
}

/* ---- plan == oracle, every mode ------------------------------------------------------- */

/* DeepSeek-V3: sigmoid, selection bias, groups by top-2 sum, renormalize, scale 2.5, one
 * ungated shared expert; and V2: softmax, groups by max, scale 16, two shared experts. */
static void test_deepseek_bits(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(40, 24, 16, 4);
    c.scoring = MOE_SCORING_SIGMOID;
    c.sel_bias = 1;
    c.n_group = 4;
    c.topk_group = 2;
    c.gscore = MOE_GROUP_SCORE_TOP2_SUM;
    c.renorm = 1;
    c.scale = 2.5f;
    c.Is = 24;
    check_cfg(&c, 37, 100);
    c.dt = MOE_DTYPE_BF16;
    c.bias_dt = MOE_DTYPE_F32;
    check_cfg(&c, 9, 101);
    /* groups of one expert (top-2 sum of a single member), bias in bf16 */
    c = cfg_default(24, 16, 6, 2);
    c.scoring = MOE_SCORING_SIGMOID;
    c.sel_bias = 1;
    c.bias_dt = MOE_DTYPE_BF16;
    c.n_group = 6;
    c.topk_group = 3;
    c.gscore = MOE_GROUP_SCORE_TOP2_SUM;
    check_cfg(&c, 13, 102);

    c = cfg_default(33, 17, 12, 3);
    c.n_group = 4;
    c.topk_group = 2;
    c.gscore = MOE_GROUP_SCORE_MAX;
    c.scale = 16.0f;
    c.Is = 34;
    check_cfg(&c, 21, 103);
    /* sigmoid without groups or bias, no renormalize */
    c = cfg_default(32, 16, 8, 2);
    c.scoring = MOE_SCORING_SIGMOID;
    check_cfg(&c, 17, 104);
}

/* gpt-oss: top-k softmax on logits + router bias, clamped SwiGLU with biases, interleaved
 * input-major gate/up; gate/up weights scaled so the clamp is reached. */
static void test_gpt_oss_bits(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(48, 20, 8, 4);
    c.scoring = MOE_SCORING_TOPK_SOFTMAX;
    c.router_bias = 1;
    c.expert_bias = 1;
    c.act = MOE_ACT_SWIGLU_OAI;
    c.layout = LAYOUT_INTERLEAVED;
    c.wscale = 12.0f;
    check_cfg(&c, 31, 200);
    c.dt = MOE_DTYPE_BF16;
    c.bias_dt = MOE_DTYPE_BF16;
    check_cfg(&c, 8, 201);
    c.layout = LAYOUT_ROW;
    c.dt = MOE_DTYPE_F16;
    check_cfg(&c, 5, 202);
}

/* Llama-4: top-1 sigmoid on logits, weight on the expert input, ungated shared expert,
 * input-major halves; also K = 2 and the batched format. */
static void test_llama4_bits(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(40, 32, 8, 1);
    c.scoring = MOE_SCORING_TOPK_SIGMOID;
    c.on_input = 1;
    c.Is = 32;
    c.layout = LAYOUT_HALVES;
    check_cfg(&c, 29, 300);
    c.K = 2;
    c.dt = MOE_DTYPE_BF16;
    check_cfg(&c, 11, 301);
    c.K = 3;
    c.scale = 1.5f;
    c.scoring = MOE_SCORING_SOFTMAX;
    c.Is = 0;
    check_cfg(&c, 7, 302);
}

/* Granite (top-k softmax on logits), OLMoE/Qwen3.5 (softmax, gated shared), the GELU gates,
 * and every activation with the input-major halves layout. */
static void test_other_modes_bits(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(32, 24, 10, 3);
    c.scoring = MOE_SCORING_TOPK_SOFTMAX;
    check_cfg(&c, 19, 400);
    c.renorm = 1;
    check_cfg(&c, 3, 401);
    c = cfg_default(36, 20, 8, 2);
    c.renorm = 1;
    c.Is = 28;
    c.gated = 1;
    check_cfg(&c, 23, 402);
    const moe_activation acts[] = {MOE_ACT_SWIGLU, MOE_ACT_GEGLU, MOE_ACT_GEGLU_TANH, MOE_ACT_SWIGLU_OAI};
    for (int i = 0; i < 4; i++) {
        c = cfg_default(24, 18, 6, 2);
        c.act = acts[i];
        c.layout = LAYOUT_HALVES;
        c.Is = 10;
        c.wscale = 6.0f;
        check_cfg(&c, 12, 410 + (uint64_t)i);
    }
}

/* Input-major and interleaved layouts give exactly the bits of the row-major layout. */
static void test_layouts_identical(void **state)
{
    (void)state;
    const int64_t T = 14;
    float *outs[3];
    for (int lay = 0; lay < 3; lay++) {
        fam_cfg c = cfg_default(40, 20, 6, 2);
        c.layout = lay;
        c.expert_bias = 1;
        c.act = MOE_ACT_SWIGLU_OAI;
        c.wscale = 8.0f;
        c.dt = MOE_DTYPE_BF16;
        fam_layer L;
        layer_build(&L, &c, 500);
        float *x = rand_x(T, c.H, 501, 1.0f);
        outs[lay] = malloc(sizeof(float) * (size_t)(T * c.H));
        moe_ctx *ctx = make_ctx(NULL, 2, 0, NULL);
        run_plan(ctx, NULL, &L, x, T, NULL, outs[lay], NULL, NULL);
        moe_ctx_free(ctx);
        float *ref = malloc(sizeof(float) * (size_t)(T * c.H));
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, ref, NULL, NULL), MOE_OK);
        assert_memory_equal(ref, outs[lay], sizeof(float) * (size_t)(T * c.H));
        free(ref);
        free(x);
        layer_free(&L);
    }
    assert_memory_equal(outs[0], outs[1], sizeof(float) * (size_t)(T * 40));
    assert_memory_equal(outs[0], outs[2], sizeof(float) * (size_t)(T * 40));
    for (int i = 0; i < 3; i++)
        free(outs[i]);
}

/* ---- routing by hand ------------------------------------------------------------------ */

/* Route one row of caller-supplied logits through the plan path (checking src/ref's bits in
 * every configuration) and return the ids and weights. */
static void route_row(fam_layer *L, const float *logits, int32_t *ids, float *w)
{
    float x[64];
    tu_fill_uniform(x, (size_t)L->c.H, 7, -1, 1);
    float *ro;
    int32_t *ri;
    float *rw;
    check_bits(L, x, 1, logits, &ro, &ri, &rw);
    memcpy(ids, ri, sizeof(int32_t) * (size_t)L->c.K);
    memcpy(w, rw, sizeof(float) * (size_t)L->c.K);
    free(ro);
    free(ri);
    free(rw);
}

static fam_layer *tiny(fam_cfg c)
{
    fam_layer *L = malloc(sizeof *L);
    layer_build(L, &c, 900);
    return L;
}

static void tiny_free(fam_layer *L)
{
    layer_free(L);
    free(L);
}

/* Write b [E] f32 into the layer's selection bias (bias_dt F32). */
static void set_sel_bias(fam_layer *L, const float *b)
{
    memcpy(L->sbias, b, sizeof(float) * (size_t)L->c.E);
}

static double sig(double v)
{
    return 1.0 / (1.0 + exp(-v));
}

/* Phi-MoE's sparsemixer: the plan gives src/ref's bits in every table / thread / chunk /
 * top-k method / format (check_bits), with and without renormalization, a shared expert and
 * the weight on the input, for eps 0 (only ties kept), the PhimoeConfig default 0.01 and a
 * wide 0.4 that keeps several experts in each softmax. */
static void test_sparsemixer_bits(void **state)
{
    (void)state;
    const float eps[] = {0.0f, 0.01f, 0.4f};
    for (int i = 0; i < 3; i++) {
        for (int v = 0; v < 3; v++) {
            fam_cfg c = cfg_default(24, 16, 8, 2);
            c.scoring = MOE_SCORING_SPARSEMIXER;
            c.sm_eps = eps[i];
            c.renorm = v == 1;
            c.Is = v == 2 ? 12 : 0;
            c.on_input = v == 2;
            check_cfg(&c, 19, 600 + (uint64_t)(3 * i + v));
        }
    }
}

/* MOE_ACT_SWIGLU_SOFTCAP (Inkling2) and a shared expert with its own activation
 * (HY-V4: clamped routed experts, plain SwiGLU shared; and other pairs) give src/ref's bits on
 * every table, thread count, chunk size and prepare/finalize (check_bits); the plan's output
 * of a batch is row for row its output of each token alone; the shared activation changes the
 * output (it is applied); bad values are refused naming the field. */
static void test_acts_modes(void **state)
{
    (void)state;
    for (int v = 0; v < 4; v++) {
        fam_cfg c = cfg_default(40, 16, 8, 3);
        c.scoring = MOE_SCORING_SIGMOID;
        c.sel_bias = 1;
        c.renorm = 1;
        c.scale = 2.5f;
        c.Is = v == 0 ? 0 : 24;
        c.wscale = 4.0f; /* gate/up values past the clamp and into the softcaps' saturation */
        c.act = v == 0 || v == 3 ? MOE_ACT_SWIGLU_SOFTCAP : MOE_ACT_SWIGLU_CLAMP;
        c.cg = 1.5f, c.cu = 2.5f;
        c.sh_act_on = v >= 2;
        c.sh_act = v == 2 ? MOE_ACT_SWIGLU : MOE_ACT_GEGLU;
        c.dt = v == 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        check_cfg(&c, 13, 800 + (uint64_t)v);

        fam_layer L;
        layer_build(&L, &c, 810 + (uint64_t)v);
        const int64_t T = 6, H = c.H;
        float *x = rand_x(T, H, 811, 1.5f);
        float *batch = malloc(sizeof(float) * (size_t)(T * H)), *one = malloc(sizeof(float) * (size_t)H);
        int32_t ids[6 * 3];
        float wts[6 * 3];
        moe_ctx *ctx = make_ctx(NULL, 2, 1 << 20, "sort");
        assert_non_null(ctx);
        moe_plan_config pc;
        moe_plan_config_init(&pc);
        run_plan(ctx, &pc, &L, x, T, NULL, batch, ids, wts);
        for (int64_t t = 0; t < T; t++) {
            run_plan(ctx, &pc, &L, x + t * H, 1, NULL, one, ids, wts);
            assert_true(same_bits(one, batch + t * H, sizeof(float) * (size_t)H));
        }
        if (c.Is > 0) { /* the shared expert's activation is what it computes */
            float *other = malloc(sizeof(float) * (size_t)(T * H));
            L.d.has_shared_activation = 1; /* another function than the shared expert computed */
            L.d.shared_activation = MOE_ACT_GEGLU_TANH;
            assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, other, NULL, NULL), MOE_OK);
            if (same_bits(other, batch, sizeof(float) * (size_t)(T * H)))
                fail_msg("v %d: the shared activation changed nothing", v);
            free(other);
            L.d.has_shared_activation = c.sh_act_on;
            L.d.shared_activation = c.sh_act;
        }
        moe_ctx_free(ctx);
        free(x), free(batch), free(one);
        layer_free(&L);
    }

    /* validation, by field name */
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = 16, d.moe_intermediate_size = 8, d.num_experts = 4, d.top_k = 2;
    moe_plan *p = NULL;
    d.has_shared_activation = 1; /* without a shared expert */
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "has_shared_activation"));
    d.shared_expert_intermediate_size = 8;
    d.shared_activation = (moe_activation)99;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "shared_activation = 99"));
    d.shared_activation = MOE_ACT_SWIGLU_SOFTCAP;
    d.softcap_up = 0.0f; /* the shared expert's softcap reads it too */
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "softcap_up"));
    d.has_shared_activation = 0;
    d.activation = MOE_ACT_SWIGLU_SOFTCAP;
    d.softcap_up = 25.0f;
    d.softcap_gate = INFINITY;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "softcap_gate"));
    d.softcap_gate = NAN;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    d.softcap_gate = 4.0f;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

/* DeepSeek-V4 and Step-3.7: MOE_SCORING_SQRTSOFTPLUS with a correction bias (DeepSeek-V4; and with groups),
 * MOE_ACT_SWIGLU_POSTCLAMP (Step-3.7) in the routed and the shared expert with its own limit
 * (shared_swiglu_limit), or beside a plain / clamped shared expert (has_shared_activation), in
 * f32 and bf16: src/ref's bits on every table, thread count, chunk size and prepare/finalize
 * (check_bits); the shared limit is applied (changing it changes the output); bad values are
 * refused naming the field. */
static void test_v4step_modes(void **state)
{
    (void)state;
    for (int v = 0; v < 6; v++) {
        fam_cfg c = cfg_default(40, 16, 8, 3);
        c.scoring = v <= 1 ? MOE_SCORING_SQRTSOFTPLUS : MOE_SCORING_SIGMOID;
        c.sel_bias = 1;
        c.renorm = 1;
        c.scale = v <= 1 ? 1.5f : 2.0f;
        c.Is = v == 5 ? 0 : 16;
        c.wscale = 4.0f; /* gate / up values past the limits, routed and shared */
        c.sh_wscale = 4.0f;
        c.act = v <= 1 ? MOE_ACT_SWIGLU_CLAMP : v == 4 ? MOE_ACT_SWIGLU : MOE_ACT_SWIGLU_POSTCLAMP;
        c.limit = v <= 1 ? 3.0f : 1.5f;
        if (v == 1) { /* groups on the sqrtsoftplus keys */
            c.n_group = 4, c.topk_group = 2, c.gscore = MOE_GROUP_SCORE_TOP2_SUM;
        }
        if (v == 2 || v == 4) /* the shared expert's own limit */
            c.sh_limit = 2.5f;
        if (v == 3) { /* clamped routed, plain shared */
            c.sh_act_on = 1;
            c.sh_act = MOE_ACT_SWIGLU;
        }
        if (v == 4) { /* plain routed, clamped shared (Step-3.7 layer 2) */
            c.sh_act_on = 1;
            c.sh_act = MOE_ACT_SWIGLU_POSTCLAMP;
        }
        c.dt = v == 2 || v == 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        check_cfg(&c, 13, 900 + (uint64_t)v);
        if (c.Is > 0 && c.sh_limit > 0.0f) { /* the shared limit is what the shared expert reads */
            fam_layer L;
            layer_build(&L, &c, 910 + (uint64_t)v);
            const int64_t T = 5;
            float *x = rand_x(T, c.H, 911, 1.5f);
            float *a = malloc(sizeof(float) * (size_t)(T * c.H)), *b = malloc(sizeof(float) * (size_t)(T * c.H));
            assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, a, NULL, NULL), MOE_OK);
            L.d.shared_swiglu_limit = 0.0f; /* back to swiglu_limit */
            assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, b, NULL, NULL), MOE_OK);
            if (same_bits(a, b, sizeof(float) * (size_t)(T * c.H)))
                fail_msg("v %d: shared_swiglu_limit changed nothing", v);
            free(x), free(a), free(b);
            layer_free(&L);
        }
    }

    /* validation, by field name */
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = 16, d.moe_intermediate_size = 8, d.num_experts = 4, d.top_k = 2;
    moe_plan *p = NULL;
    d.activation = MOE_ACT_SWIGLU_POSTCLAMP;
    d.swiglu_limit = 0.0f;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "swiglu_limit = 0"));
    d.swiglu_limit = INFINITY; /* no clamp: allowed */
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    moe_plan_free(p);
    d.shared_swiglu_limit = 2.0f; /* without a shared expert */
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "shared_swiglu_limit set without a shared expert"));
    d.shared_expert_intermediate_size = 8;
    d.shared_swiglu_limit = -1.0f;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "shared_swiglu_limit = -1"));
    d.shared_swiglu_limit = NAN;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    d.shared_swiglu_limit = 2.0f;
    d.scoring_func = (moe_scoring)6;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "scoring_func = 6"));
    d.scoring_func = MOE_SCORING_SQRTSOFTPLUS;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

/* Non-gated experts (MOE_ACT_RELU, RELU2, GELU, GELU_TANH; y = W2 act(W1 x + b1) + b2, W1 as
 * up_proj, no gate arrays given): src/ref's bits on every table, thread count, chunk size and
 * prepare/finalize (check_bits), with Nemotron-H's routing (sigmoid + selection bias + groups,
 * renormalized, scaled) and a shared expert of the same mode, with expert biases, in bf16,
 * strided W1, and a shared expert of the other kind (gated routed + non-gated shared and back);
 * src/ref's output equals a double-precision hand computation; the packed bytes hold no gate;
 * moe_activation_gated answers 1 for 0 .. 5 and 0 for 6 .. 9. */
static double hand_act1(moe_activation a, double u)
{
    switch (a) {
    case MOE_ACT_RELU:
        return u > 0.0 ? u : 0.0;
    case MOE_ACT_RELU2:
        return u > 0.0 ? u * u : 0.0;
    case MOE_ACT_GELU:
        return 0.5 * u * (1.0 + erf(u / sqrt(2.0)));
    default:
        return 0.5 * u * (1.0 + tanh(sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
    }
}

static void test_nongated_modes(void **state)
{
    (void)state;
    /* gated: SWIGLU .. SWIGLU_SOFTCAP (0 .. 5) and SWIGLU_POSTCLAMP (10); non-gated: 6 .. 9 */
    for (int a = 0; a <= 10; a++)
        assert_int_equal(moe_activation_gated((moe_activation)a), a <= 5 || a == MOE_ACT_SWIGLU_POSTCLAMP);
    assert_int_equal(moe_activation_gated((moe_activation)11), 0);
    const moe_activation acts[] = {MOE_ACT_RELU, MOE_ACT_RELU2, MOE_ACT_GELU, MOE_ACT_GELU_TANH};
    for (int v = 0; v < 8; v++) {
        fam_cfg c = cfg_default(40, 20, 8, 3); /* I = 20: a partial last panel */
        c.act = acts[v % 4];
        c.scoring = MOE_SCORING_SIGMOID;
        c.sel_bias = 1;
        c.renorm = v != 3;
        c.scale = v == 2 ? 1.0f : 2.5f;
        c.n_group = v == 1 || v == 5 ? 4 : 0;
        c.topk_group = c.n_group ? 2 : 0;
        c.gscore = MOE_GROUP_SCORE_TOP2_SUM;
        c.Is = v == 3 ? 0 : 24;
        c.expert_bias = v == 4 || v == 6;
        c.dt = v == 5 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        c.layout = v == 6 ? LAYOUT_HALVES : LAYOUT_ROW; /* v 6: W1 and W2 through strides */
        if (v == 7) { /* gated routed experts, non-gated shared expert */
            c.act = MOE_ACT_SWIGLU;
            c.sh_act_on = 1;
            c.sh_act = MOE_ACT_RELU2;
        }
        if (v == 2) { /* non-gated routed, gated shared */
            c.sh_act_on = 1;
            c.sh_act = MOE_ACT_GEGLU;
        }
        check_cfg(&c, 13, 900 + (uint64_t)v);
    }

    /* src/ref against the formula in double: y = sum_k w_k W2 act(W1 x + b1) + b2, + shared */
    for (int a = 0; a < 4; a++) {
        fam_cfg c = cfg_default(24, 12, 6, 2);
        c.act = acts[a];
        c.scoring = MOE_SCORING_SIGMOID;
        c.renorm = 1;
        c.scale = 2.0f;
        c.Is = 8;
        c.expert_bias = 1;
        fam_layer L;
        layer_build(&L, &c, 950 + (uint64_t)a);
        const int64_t T = 5, H = c.H, I = c.I, K = c.K, Is = c.Is;
        float *x = rand_x(T, H, 951, 1.5f);
        float *out = malloc(sizeof(float) * (size_t)(T * H));
        int32_t ids[5 * 2];
        float wts[5 * 2];
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids, wts), MOE_OK);
        const float *ub = L.gub, *db = L.db, *su = L.su, *sd = L.sd;
        for (int64_t t = 0; t < T; t++)
            for (int64_t o = 0; o < H; o++) {
                double y = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    const int64_t e = ids[t * K + k];
                    double acc = 0.0;
                    for (int64_t i = 0; i < I; i++) {
                        double u = ub[e * 2 * I + I + i];
                        for (int64_t j = 0; j < H; j++)
                            u += (double)x[t * H + j] * L.uf[(e * I + i) * H + j];
                        acc += hand_act1(c.act, u) * L.df[(e * H + o) * I + i];
                    }
                    y += (double)wts[t * K + k] * (acc + db[e * H + o]);
                }
                double s = 0.0;
                for (int64_t i = 0; i < Is; i++) {
                    double u = 0.0;
                    for (int64_t j = 0; j < H; j++)
                        u += (double)x[t * H + j] * su[i * H + j];
                    s += hand_act1(c.act, u) * sd[o * Is + i];
                }
                const double want = (double)c.scale * y + s; /* weights_out: unscaled */
                const double got = out[t * H + o];
                if (fabs(got - want) > 2e-5 * fmax(1.0, fabs(want)))
                    fail_msg("act %d t %lld o %lld: %.9g, want %.9g", (int)c.act, (long long)t, (long long)o, got,
                             want);
            }
        free(x), free(out);
        layer_free(&L);
    }

    /* no gate memory: the packed experts of a non-gated layer are 2/3 of the gated ones */
    {
        fam_cfg c = cfg_default(32, 16, 4, 2);
        fam_layer L;
        size_t bytes[2];
        for (int g = 0; g < 2; g++) {
            c.act = g ? MOE_ACT_SWIGLU : MOE_ACT_RELU2;
            layer_build(&L, &c, 970);
            moe_ctx *ctx = tu_ctx();
            moe_plan *plan = NULL;
            moe_weights *w = NULL;
            assert_int_equal(moe_plan_create(ctx, &L.d, &plan), MOE_OK);
            assert_int_equal(moe_weights_create(plan, &L.src, &w), MOE_OK);
            bytes[g] = moe_weights_expert_bytes(w);
            moe_weights_free(w);
            moe_plan_free(plan);
            moe_ctx_free(ctx);
            layer_free(&L);
        }
        assert_int_equal(bytes[0] * 3, bytes[1] * 2);
    }
}

/* A.X-K1's output RMSNorm: src/ref's bits on every table, thread count, chunk size and
 * prepare/finalize (check_bits), alone and after an output bias, with a shared expert and
 * groups; src/ref's output is w_n * (y * r) of its output without the norm; a missing weight
 * or a bad dtype / eps is refused by name. */
static void test_output_norm(void **state)
{
    (void)state;
    for (int v = 0; v < 3; v++) {
        fam_cfg c = cfg_default(40, 16, 8, 3);
        c.scoring = MOE_SCORING_SIGMOID;
        c.sel_bias = 1;
        c.renorm = 1;
        c.scale = 2.5f;
        c.n_group = v == 2 ? 2 : 0;
        c.topk_group = v == 2 ? 1 : 0;
        c.gscore = MOE_GROUP_SCORE_TOP2_SUM;
        c.Is = v == 0 ? 0 : 16;
        c.out_norm = 1;
        c.out_bias = v == 1;
        c.bias_dt = v == 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        c.dt = v == 2 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        check_cfg(&c, 13, 900 + (uint64_t)v);

        fam_layer L;
        layer_build(&L, &c, 910 + (uint64_t)v);
        const int64_t T = 5, H = c.H;
        float *x = rand_x(T, H, 911, 1.0f);
        float *with = malloc(sizeof(float) * (size_t)(T * H)), *without = malloc(sizeof(float) * (size_t)(T * H));
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, with, NULL, NULL), MOE_OK);
        L.d.has_output_norm = 0;
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, without, NULL, NULL), MOE_OK);
        L.d.has_output_norm = 1;
        for (int64_t t = 0; t < T; t++) {
            const float *y = without + t * H; /* [H] */
            double ss = 0.0;
            for (int64_t h = 0; h < H; h++)
                ss += (double)y[h] * y[h];
            const double r = 1.0 / sqrt(ss / (double)H + 1e-5);
            for (int64_t h = 0; h < H; h++) {
                const double want = moe_ref_load(L.onorm, c.bias_dt, h) * (y[h] * r);
                assert_true(fabs(with[t * H + h] - want) <= 1e-5 * fabs(want) + 1e-30);
            }
        }

        moe_ctx *ctx = tu_ctx();
        moe_plan *p = NULL;
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
        moe_weights *w = NULL;
        L.src.output_norm = NULL;
        assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "output_norm"));
        L.src.output_norm = L.onorm;
        L.src.output_norm_dtype = MOE_DTYPE_I32;
        assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EDTYPE);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "output_norm_dtype"));
        moe_plan_free(p);
        L.d.output_norm_eps = -1.0f;
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "output_norm_eps"));
        moe_ctx_free(ctx);
        free(x), free(with), free(without);
        layer_free(&L);
    }
}

/* Router knobs: renormalize_eps (LFM2-MoE's sum + 1e-6, Cohere2-MoE's sum alone) and
 * shared_expert_scale (Cohere2-MoE's "average"). The plan gives src/ref's bits on every table,
 * thread count, chunk size and prepare/finalize (check_bits) for each family's mode; src/ref's
 * renormalized weights are its unrenormalized ones divided by (sum in top-k order + eps) in f32;
 * routed_scaling_factor = shared_expert_scale = 0.5 is exactly half of the plain sum, bit for bit
 * ((r + s) / 2, Cohere2MoeSparseMoeBlock.forward); bad values are refused by field name. */
static void test_router_knobs(void **state)
{
    (void)state;
    for (int v = 0; v < 5; v++) {
        fam_cfg c = cfg_default(36, 16, 8, v == 2 ? 3 : 2);
        if (v <= 1) { /* LFM2-MoE: sigmoid (+ expert_bias), / (sum + 1e-6), times the scale */
            c.scoring = MOE_SCORING_SIGMOID;
            c.sel_bias = v == 0;
            c.renorm = 1;
            c.renorm_eps = 1e-6f;
            c.scale = 1.5f;
        } else { /* Cohere2-MoE: top-k on the logits, sigmoid / sum (eps 0) or softmax; shared averaged */
            c.scoring = v == 2 ? MOE_SCORING_TOPK_SIGMOID : MOE_SCORING_TOPK_SOFTMAX;
            c.renorm = v == 2;
            c.renorm_eps = 0.0f;
            c.Is = 32;
            c.scale = v == 2 ? 1.0f : 0.5f;
            c.sh_scale = v == 2 ? 1.0f : 0.5f;
            c.gated = v == 4; /* a gated shared expert scaled too (g_sh * scale) */
            c.dt = v == 4 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        }
        check_cfg(&c, 13, 1000 + (uint64_t)v);
    }

    /* renormalize_eps against its definition, for eps 0, 1e-6 and a large 0.25 */
    fam_cfg c = cfg_default(32, 12, 8, 3);
    c.scoring = MOE_SCORING_SIGMOID;
    c.sel_bias = 1;
    fam_layer L;
    layer_build(&L, &c, 1010);
    const int64_t T = 9, K = c.K, H = c.H;
    float *x = rand_x(T, H, 1011, 1.5f);
    float raw[9 * 3], w[9 * 3], w20[9 * 3];
    int32_t ids[9 * 3], ids2[9 * 3];
    float *out = malloc(sizeof(float) * (size_t)(T * 40)), *out2 = malloc(sizeof(float) * (size_t)(T * 40)); /* [T, H <= 40] */
    assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids, raw), MOE_OK);
    L.d.renormalize = 1;
    assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids2, w20), MOE_OK); /* eps 1e-20 */
    const float epss[] = {0.0f, 1e-6f, 0.25f};
    for (int i = 0; i < 3; i++) {
        L.d.renormalize_eps = epss[i];
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids2, w), MOE_OK);
        assert_true(same_bits(ids, ids2, sizeof ids));
        for (int64_t t = 0; t < T; t++) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++)
                sum += raw[t * K + k];
            for (int64_t k = 0; k < K; k++) {
                const float want = raw[t * K + k] / (sum + epss[i]);
                assert_true(same_bits(&w[t * K + k], &want, sizeof want));
            }
        }
    }
    assert_false(same_bits(w, w20, sizeof w)); /* 0.25 is read */
    free(x);
    layer_free(&L);

    /* "average" is half of "sum", bit for bit, on the plan path */
    c = cfg_default(40, 16, 8, 2);
    c.scoring = MOE_SCORING_TOPK_SOFTMAX;
    c.Is = 32;
    layer_build(&L, &c, 1020);
    x = rand_x(T, c.H, 1021, 1.5f);
    moe_ctx *ctx = make_ctx(NULL, 2, 1 << 20, "sort");
    assert_non_null(ctx);
    moe_plan_config pc;
    moe_plan_config_init(&pc);
    run_plan(ctx, &pc, &L, x, T, NULL, out, ids, w); /* routed + shared */
    L.d.routed_scaling_factor = 0.5f, L.d.shared_expert_scale = 0.5f;
    run_plan(ctx, &pc, &L, x, T, NULL, out2, ids2, w20);
    for (int64_t i = 0; i < T * c.H; i++) {
        const float half = out[i] / 2.0f;
        assert_true(same_bits(&out2[i], &half, sizeof half));
    }
    L.d.routed_scaling_factor = 1.0f; /* the shared expert alone halved: a different sum */
    run_plan(ctx, &pc, &L, x, T, NULL, out2, ids2, w20);
    assert_false(same_bits(out, out2, sizeof(float) * (size_t)(T * c.H)));
    moe_ctx_free(ctx);

    /* validation, by field name */
    ctx = tu_ctx();
    moe_plan *p = NULL;
    const float bad[] = {-1e-6f, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        L.d.shared_expert_scale = 1.0f;
        L.d.renormalize_eps = bad[i];
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "renormalize_eps"));
        L.d.renormalize_eps = 1e-20f;
        L.d.shared_expert_scale = i == 0 ? 0.0f : bad[i];
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "shared_expert_scale"));
    }
    L.d.shared_expert_intermediate_size = 0; /* not read without a shared expert */
    L.d.shared_expert_scale = 0.0f;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    moe_plan_free(p);
    moe_ctx_free(ctx);
    free(x), free(out), free(out2);
    layer_free(&L);
}

/* Identity experts (num_identity_experts, LongCat-Flash): the plan gives src/ref's bits in every
 * configuration check_bits runs (every table, 1 / 2 threads, chunks of 7 tokens, both top-k
 * methods, the three permutations, the batched format), with LongCat's routing (softmax over
 * E + Z, a selection bias, no renormalization, scale 1.5) and with a shared expert, a router bias,
 * the weight on the input, sigmoid groups over E + Z and bf16 weights; enough tokens pick an
 * identity expert; with caller-given routing to identity experts only, the output is exactly
 * ((0 + w_0 x) + w_1 x) * scale (the combine's f32 operations), and the description is
 * validated by name. */
static void test_identity_experts(void **state)
{
    (void)state;
    for (int v = 0; v < 5; v++) {
        fam_cfg c = cfg_default(40, 16, 6, 3);
        c.Z = 3;
        c.sel_bias = 1;
        c.scale = 1.5f;
        if (v == 1)
            c.Is = 16, c.gated = 1, c.router_bias = 1;
        if (v == 2)
            c.on_input = 1, c.K = 1, c.Z = 5; /* Llama-4's weight on the input: the same w * x */
        if (v == 3)
            c.scoring = MOE_SCORING_SIGMOID, c.renorm = 1, c.n_group = 3, c.topk_group = 2,
            c.gscore = MOE_GROUP_SCORE_TOP2_SUM; /* 3 groups of (6 + 3) / 3 */
        if (v == 4)
            c.dt = MOE_DTYPE_BF16, c.bias_dt = MOE_DTYPE_BF16, c.K = 4, c.Z = 8;
        fam_layer L;
        layer_build(&L, &c, 1200 + (uint64_t)v);
        const int64_t T = 29;
        float *x = rand_x(T, c.H, 1210 + (uint64_t)v, 1.5f);
        int32_t *rid = NULL;
        check_bits(&L, x, T, NULL, NULL, &rid, NULL);
        int64_t n_id = 0;
        for (int64_t i = 0; i < T * c.K; i++)
            n_id += rid[i] >= c.E;
        if (n_id < 3 || n_id == T * c.K)
            fail_msg("identity case %d: %lld of %lld rows pick an identity expert", v, (long long)n_id,
                     (long long)(T * c.K));
        free(rid);
        free(x);
        layer_free(&L);
    }

    /* caller-given routing onto identity experts only: exact values */
    fam_cfg c = cfg_default(24, 8, 4, 2);
    c.Z = 2;
    c.scale = 6.0f;
    fam_layer L;
    layer_build(&L, &c, 1230);
    const int64_t T = 3, H = c.H;
    float *x = rand_x(T, H, 1231, 2.0f);
    int32_t gid[6] = {4, 5, 5, 4, 5, 1};
    float gw[6] = {0.3f, 0.7f, 0.125f, 0.61f, 0.9f, 0.2f};
    float *out = malloc(sizeof(float) * (size_t)(T * H)), *ref = malloc(sizeof(float) * (size_t)(T * H));
    moe_ctx *ctx = tu_ctx();
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_OK);
    const size_t wsz = moe_plan_workspace_size(p, T);
    void *ws = malloc(wsz);
    moe_exec_args a;
    memset(&a, 0, sizeof a);
    a.hidden_states = x, a.hidden_dtype = MOE_DTYPE_F32, a.n_tokens = T, a.output = out;
    a.in_topk_ids = gid, a.in_topk_weights = gw, a.workspace = ws, a.workspace_size = wsz;
    int64_t load[4] = {0, 0, 0, 0};
    a.expert_load = load;
    assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_OK);
    assert_int_equal(moe_ref_forward_given(&L.d, &L.src, MOE_COMPUTE_F32, x, T, NULL, gid, gw, ref, NULL, NULL), MOE_OK);
    assert_true(same_bits(out, ref, sizeof(float) * (size_t)(T * H)));
    for (int64_t t = 0; t < 2; t++) /* tokens 0 and 1: identity experts only */
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            acc += gw[t * 2] * x[t * H + h];
            acc += gw[t * 2 + 1] * x[t * H + h];
            assert_true(out[t * H + h] == acc * 6.0f);
        }
    /* expert_load counts the routed rows only: expert 1 once */
    assert_true(load[0] == 0 && load[1] == 1 && load[2] == 0 && load[3] == 0);
    gid[0] = 6; /* outside [0, E + Z) */
    assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "num_experts + num_identity_experts"));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    /* validation by name */
    L.d.num_identity_experts = -1;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "num_identity_experts"));
    L.d.num_identity_experts = 2;
    L.d.top_k = 7;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "num_experts + num_identity_experts"));
    L.d.top_k = 5; /* K > E is fine with identity experts: K <= E + Z */
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    moe_plan_free(p);
    moe_ctx_free(ctx);
    free(x), free(out), free(ref);
    layer_free(&L);
}

/* DBRX's renormalization by a p-norm (renormalize_p: DbrxFFN.route_tokens_to_experts divides the
 * top-k softmax weights by torch.norm(w, p = moe_normalize_expert_weights)). The plan gives
 * src/ref's bits on every table, thread count, chunk size and prepare/finalize (check_bits) for
 * p = 1, 2, 3, 0.5 and +inf (softmax, and sigmoid + a selection bias, bf16 weights, K 4);
 * src/ref's weights are its unrenormalized ones divided by moe.h's N_p (written here from the
 * header's definition) plus eps, bit for bit, and within an f32 rounding of the long-double
 * p-norm; p = 1 is the plain sum (the same bits as every other family's renormalization, and the
 * same plan text); renormalize_p is read only with renormalize and refused by name when <= 0 or
 * NaN. */
static void test_renorm_pnorm(void **state)
{
    (void)state;
    const float ps[] = {1.0f, 2.0f, 3.0f, 0.5f, INFINITY};
    for (int v = 0; v < 7; v++) {
        fam_cfg c = cfg_default(36, 16, 8, v >= 5 ? 4 : 2);
        c.renorm = 1;
        c.renorm_p = ps[v % 5];
        if (v >= 5) { /* sigmoid scores + a selection bias (any scoring's weights may be divided) */
            c.scoring = MOE_SCORING_SIGMOID;
            c.sel_bias = 1;
            c.dt = v == 6 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        }
        check_cfg(&c, 13, 1100 + (uint64_t)v);
    }

    /* src/ref against N_p by its definition, eps 1e-20 and 0.25 */
    fam_cfg c = cfg_default(32, 12, 8, 3);
    fam_layer L;
    layer_build(&L, &c, 1110);
    const int64_t T = 9, K = c.K;
    float *x = rand_x(T, c.H, 1111, 1.5f);
    float raw[9 * 3], w[9 * 3], wsum[9 * 3];
    int32_t ids[9 * 3], ids2[9 * 3];
    float *out = malloc(sizeof(float) * (size_t)(T * c.H));
    assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids, raw), MOE_OK);
    L.d.renormalize = 1;
    assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids2, wsum), MOE_OK); /* p = 1 */
    const float epss[] = {1e-20f, 0.25f};
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 5; i++) {
            const float p = ps[i];
            L.d.renormalize_p = p;
            L.d.renormalize_eps = epss[e];
            assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, out, ids2, w), MOE_OK);
            assert_true(same_bits(ids, ids2, sizeof ids));
            for (int64_t t = 0; t < T; t++) {
                const float *r = raw + t * K;
                float n = 0.0f;
                long double nl = 0.0L;
                if (p == 1.0f) {
                    for (int64_t k = 0; k < K; k++)
                        n += r[k];
                    nl = (long double)n;
                } else if (isinf(p)) {
                    for (int64_t k = 0; k < K; k++)
                        n = fmaxf(n, fabsf(r[k]));
                    nl = (long double)n;
                } else {
                    double acc = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        acc += pow(fabs((double)r[k]), (double)p);
                        nl += powl(fabsl((long double)r[k]), (long double)p);
                    }
                    n = (float)pow(acc, 1.0 / (double)p);
                    nl = powl(nl, 1.0L / (long double)p);
                }
                /* N_p in f32 is the long-double p-norm rounded (within one f32 ulp) */
                assert_true(fabsl((long double)n - nl) <= 1.2e-7L * nl);
                for (int64_t k = 0; k < K; k++) {
                    const float want = r[k] / (n + epss[e]);
                    assert_true(same_bits(&w[t * K + k], &want, sizeof want));
                }
                if (e == 0 && p == 1.0f) /* the plain renormalization's bits */
                    assert_true(same_bits(w + t * K, wsum + t * K, sizeof(float) * (size_t)K));
                if (e == 0 && p == 2.0f) { /* unit 2-norm */
                    double ss = 0.0;
                    for (int64_t k = 0; k < K; k++)
                        ss += (double)w[t * K + k] * w[t * K + k];
                    assert_true(fabs(ss - 1.0) < 1e-6);
                }
                if (e == 0 && isinf(p)) { /* the largest weight becomes 1 exactly */
                    float m = 0.0f;
                    for (int64_t k = 0; k < K; k++)
                        m = fmaxf(m, w[t * K + k]);
                    assert_true(m == 1.0f);
                }
            }
        }
    free(x);
    free(out);

    /* validation by name; p = 1 keeps the plan text, another p is in it; unread without renormalize */
    moe_ctx *ctx = tu_ctx();
    moe_plan *p1 = NULL, *p2 = NULL;
    L.d.renormalize_eps = 1e-20f;
    L.d.renormalize_p = 1.0f;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p1), MOE_OK);
    assert_null(strstr(moe_plan_text(p1), "renormalize_p"));
    L.d.renormalize_p = 2.0f;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p2), MOE_OK);
    assert_non_null(strstr(moe_plan_text(p2), "renormalize_p=2;"));
    assert_true(moe_plan_hash(p1) != moe_plan_hash(p2));
    moe_plan_free(p1);
    moe_plan_free(p2);
    const float bad[] = {0.0f, -2.0f, NAN, -INFINITY};
    for (int i = 0; i < 4; i++) {
        moe_plan *p = NULL;
        L.d.renormalize = 1;
        L.d.renormalize_p = bad[i];
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "renormalize_p"));
        L.d.renormalize = 0; /* not read */
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
        assert_null(strstr(moe_plan_text(p), "renormalize_p"));
        moe_plan_free(p);
    }
    moe_ctx_free(ctx);
    layer_free(&L);
}

/* JetMoE's output bias: the plan gives src/ref's bits in every configuration check_bits runs
 * (bf16 / f32 bias, with a gated shared expert, scaling, the weight on the input), and src/ref's
 * output is its output without the bias plus b_o, one f32 add per element; a description
 * with has_output_bias and no src->output_bias (or a bad dtype) is refused by name. */
static void test_output_bias(void **state)
{
    (void)state;
    for (int v = 0; v < 3; v++) {
        fam_cfg c = cfg_default(40, 16, 8, 2);
        c.scoring = MOE_SCORING_TOPK_SOFTMAX;
        c.out_bias = 1;
        c.bias_dt = v == 1 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        c.Is = v == 2 ? 24 : 0;
        c.gated = v == 2;
        c.scale = v == 2 ? 2.5f : 1.0f;
        c.on_input = v == 1;
        check_cfg(&c, 13, 700 + (uint64_t)v);

        fam_layer L;
        layer_build(&L, &c, 710 + (uint64_t)v);
        const int64_t T = 5, H = c.H;
        float *x = rand_x(T, H, 711, 1.0f);
        float *with = malloc(sizeof(float) * (size_t)(T * H)), *without = malloc(sizeof(float) * (size_t)(T * H));
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, with, NULL, NULL), MOE_OK);
        L.d.has_output_bias = 0;
        assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, without, NULL, NULL), MOE_OK);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                const float b = moe_ref_load(L.obias, c.bias_dt, h);
                assert_true(b != 0.0f);
                assert_true(with[t * H + h] == without[t * H + h] + b);
            }
        L.d.has_output_bias = 1;

        moe_ctx *ctx = tu_ctx();
        moe_plan *p = NULL;
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
        moe_weights *w = NULL;
        L.src.output_bias = NULL;
        assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "output_bias"));
        L.src.output_bias = L.obias;
        L.src.output_bias_dtype = MOE_DTYPE_I32;
        assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EDTYPE);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "output_bias_dtype"));
        moe_plan_free(p);
        moe_ctx_free(ctx);
        free(x), free(with), free(without);
        layer_free(&L);
    }
}

/* The sparsemixer weights against the definition computed here in double (moe.h
 * MOE_SCORING_SPARSEMIXER, from transformers' phimoe `sparsemixer` in eval mode), on random
 * logit rows; rows where a ratio lies within 1e-4 of the threshold are skipped (ambiguous in
 * f32). Also: the threshold masks something on some row, and keeps several experts on some. */
static void test_hand_sparsemixer(void **state)
{
    (void)state;
    const int64_t E = 8;
    fam_cfg c = cfg_default(8, 4, E, 2);
    c.scoring = MOE_SCORING_SPARSEMIXER;
    c.sm_eps = 0.25f;
    fam_layer *L = tiny(c);
    const double thr = 2.0 * (double)c.sm_eps;
    int checked = 0, masked_some = 0, kept_many = 0;
    for (uint64_t r = 0; r < 64; r++) {
        float l[8];
        tu_fill_uniform(l, (size_t)E, 1000 + r, -3.0f, 3.0f);
        int want[2] = {-1, -1};
        double ww[2];
        int ambiguous = 0;
        for (int k = 0; k < 2; k++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (e != want[0] && (best < 0 || l[e] > l[best]))
                    best = e;
            want[k] = best;
            const double m = l[best];
            double num = 0.0, den = 0.0;
            int kept = 0;
            for (int e = 0; e < E; e++) {
                const double ratio = (m - l[e]) / fmax(fabs((double)l[e]), m);
                if (fabs(ratio - thr) < 1e-4)
                    ambiguous = 1;
                if ((k == 1 && e == want[0]) || ratio > thr) {
                    masked_some |= ratio > thr;
                    continue;
                }
                kept++;
                den += exp(l[e] - m);
                if (e == best)
                    num = exp(l[e] - m);
            }
            kept_many |= kept > 1;
            ww[k] = num / den;
        }
        if (ambiguous)
            continue;
        int32_t ids[2];
        float w[2];
        route_row(L, l, ids, w);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(ids[k], want[k]);
            assert_true(fabs(w[k] - ww[k]) <= 1e-6 * ww[k]);
        }
        checked++;
    }
    assert_true(checked >= 48);
    assert_true(masked_some && kept_many);
    tiny_free(L);

    /* descriptions sparsemixer cannot run: top_k != 2, groups, a selection bias, a bad eps */
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = 8, d.moe_intermediate_size = 4, d.num_experts = 8, d.top_k = 2;
    d.scoring_func = MOE_SCORING_SPARSEMIXER;
    moe_plan *p = NULL;
    assert_true(d.sparsemixer_jitter_eps == 0.01f);
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    moe_plan_free(p);
    d.top_k = 3;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "top_k"));
    d.top_k = 2;
    d.n_group = 2, d.topk_group = 1;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "n_group"));
    d.n_group = 0, d.topk_group = 0;
    d.has_selection_bias = 1;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "has_selection_bias"));
    d.has_selection_bias = 0;
    const float bad[] = {NAN, -0.1f, INFINITY};
    for (int i = 0; i < 3; i++) {
        d.sparsemixer_jitter_eps = bad[i];
        assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
        assert_non_null(strstr(moe_ctx_last_error(ctx), "sparsemixer_jitter_eps"));
    }
    moe_ctx_free(ctx);
}

static void test_hand_sigmoid(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(8, 4, 4, 2);
    c.scoring = MOE_SCORING_SIGMOID;
    fam_layer *L = tiny(c);
    const float l[4] = {0.0f, logf(3.0f), -logf(3.0f), 2.0f};
    int32_t ids[4];
    float w[4];
    route_row(L, l, ids, w);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 1);
    assert_float_equal(w[0], sig(2.0), 1e-7);
    assert_float_equal(w[1], 0.75, 1e-7);
    tiny_free(L);
    c.renorm = 1;
    L = tiny(c);
    route_row(L, l, ids, w);
    assert_float_equal(w[0], sig(2.0) / (sig(2.0) + 0.75), 1e-6);
    assert_float_equal(w[1], 0.75 / (sig(2.0) + 0.75), 1e-6);
    tiny_free(L);
}

/* DeepSeek-V3 selection by hand: E = 8 in 4 groups of 2, keep 2 groups, K = 2.
 * s = sigmoid(l); c = s + b; group score = sum of its two c. */
static void test_hand_groups(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(8, 4, 8, 2);
    c.scoring = MOE_SCORING_SIGMOID;
    c.sel_bias = 1;
    c.n_group = 4;
    c.topk_group = 2;
    c.gscore = MOE_GROUP_SCORE_TOP2_SUM;
    c.renorm = 1;
    fam_layer *L = tiny(c);
    /* logits: expert 1 alone is the best score, but its group (0) has a weak partner, so
     * groups 2 (experts 4, 5) and 3 (6, 7) win on the sum. */
    const float l[8] = {-4.0f, 3.0f, 0.5f, 0.4f, 1.0f, 1.0f, 0.8f, 0.9f};
    const float b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    set_sel_bias(L, b);
    int32_t ids[2];
    float w[2];
    route_row(L, l, ids, w);
    /* group sums: g0 = s(-4)+s(3) = 0.0180+0.9526 = 0.9706; g1 = s(.5)+s(.4) = 0.6225+0.5987
     * = 1.2212; g2 = 2 s(1) = 1.4621; g3 = s(.8)+s(.9) = 0.6900+0.7109 = 1.4009 -> keep g2, g3;
     * best experts: 4 and 5 (tie: lower id first). */
    assert_int_equal(ids[0], 4);
    assert_int_equal(ids[1], 5);
    assert_float_equal(w[0], 0.5, 1e-7);
    /* a bias moves the choice but not the weights: +0.6 on expert 7 makes group 3 win and
     * expert 7 the first pick; its weight stays its unbiased score */
    const float b2[8] = {0, 0, 0, 0, 0, 0, 0, 0.6f};
    set_sel_bias(L, b2);
    route_row(L, l, ids, w);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 4);
    assert_float_equal(w[0], sig(0.9) / (sig(0.9) + sig(1.0)), 1e-6);
    tiny_free(L);

    /* the same logits with group score = max (DeepSeek-V2 group_limited_greedy over softmax):
     * group 0 (max = expert 1) and group 2 (experts 4 and 5 tie at 1.0; max 1.0) are kept */
    c = cfg_default(8, 4, 8, 3);
    c.n_group = 4;
    c.topk_group = 2;
    c.gscore = MOE_GROUP_SCORE_MAX;
    L = tiny(c);
    int32_t id3[3];
    float w3[3];
    route_row(L, l, id3, w3);
    assert_int_equal(id3[0], 1);
    assert_int_equal(id3[1], 4);
    assert_int_equal(id3[2], 5); /* not expert 6 (0.8) or 7 (0.9): their group is dropped */
    double z = 0;
    for (int e = 0; e < 8; e++)
        z += exp((double)l[e] - 3.0);
    assert_float_equal(w3[0], 1.0 / z, 1e-6); /* softmax over all E, not renormalized */
    tiny_free(L);
}

/* Top-k softmax (Granite, gpt-oss) and top-k sigmoid (Llama-4) by hand. */
static void test_hand_topk_first(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(8, 4, 5, 2);
    c.scoring = MOE_SCORING_TOPK_SOFTMAX;
    fam_layer *L = tiny(c);
    const float l[5] = {1, 2, 3, 4, -1};
    int32_t ids[2];
    float w[2];
    route_row(L, l, ids, w);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 2);
    assert_float_equal(w[0], sig(1.0), 1e-7); /* softmax([4, 3]) = (sigmoid(1), 1 - sigmoid(1)) */
    assert_float_equal(w[1], 1.0 - sig(1.0), 1e-7);
    tiny_free(L);

    /* selection on the logits: 30 and 40 both have sigmoid 1.0f, the logit decides */
    c.scoring = MOE_SCORING_TOPK_SIGMOID;
    c.K = 1;
    L = tiny(c);
    const float big[5] = {30, 40, -2, 0, 1};
    int32_t id1;
    float w1;
    route_row(L, big, &id1, &w1);
    assert_int_equal(id1, 1);
    assert_true(w1 == 1.0f);
    const float mid[5] = {0.25f, -1, 0.5f, 0.125f, -3};
    route_row(L, mid, &id1, &w1);
    assert_int_equal(id1, 2);
    assert_float_equal(w1, sig(0.5), 1e-7);
    tiny_free(L);
}

/* The activations against their formulas in double (moe.h moe_activation). */
static void test_hand_activations(void **state)
{
    (void)state;
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    const float gs[] = {-9.0f, -2.5f, -0.3f, 0.0f, 0.7f, 3.0f, 6.99f, 7.5f, 20.0f};
    const float us[] = {-12.0f, -7.0f, -0.5f, 0.25f, 1.5f, 6.5f, 8.0f};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        for (size_t j = 0; j < sizeof us / sizeof us[0]; j++) {
            double g = gs[i], u = us[j];
            double want[4];
            want[0] = g * sig(g) * u;
            want[1] = 0.5 * g * (1.0 + erf(g / sqrt(2.0))) * u;
            want[2] = 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
            double gc = g < 7.0 ? g : 7.0, uc = u < -7.0 ? -7.0 : (u > 7.0 ? 7.0 : u);
            want[3] = (uc + 1.0) * gc * sig(1.702 * gc);
            const moe_activation acts[] = {MOE_ACT_SWIGLU, MOE_ACT_GEGLU, MOE_ACT_GEGLU_TANH, MOE_ACT_SWIGLU_OAI};
            for (int a = 0; a < 4; a++) {
                d.activation = acts[a];
                double got = moe_ref_activation(&d, gs[i], us[j]);
                if (fabs(got - want[a]) > 4e-7 * fmax(1.0, fabs(want[a])))
                    fail_msg("activation %d (g %g, u %g): %.9g, want %.9g", (int)acts[a], g, u, got, want[a]);
            }
        }
    }
    /* NaN passes through the clamps */
    d.activation = MOE_ACT_SWIGLU_OAI;
    assert_true(isnan(moe_ref_activation(&d, NAN, 1.0f)));
    assert_true(isnan(moe_ref_activation(&d, 1.0f, NAN)));
    /* +Inf gate is clamped to the limit */
    assert_true(isfinite(moe_ref_activation(&d, INFINITY, 1.0f)));
}

/* ---- R6, R7: NaN, Inf, ties in every scoring mode ------------------------------------- */

static const moe_scoring k_modes[] = {MOE_SCORING_SOFTMAX, MOE_SCORING_SIGMOID, MOE_SCORING_TOPK_SOFTMAX,
                                      MOE_SCORING_TOPK_SIGMOID};

static void assert_ids_valid(const int32_t *ids, int64_t K, int64_t E)
{
    for (int64_t i = 0; i < K; i++) {
        assert_in_range(ids[i], 0, E - 1);
        for (int64_t j = 0; j < i; j++)
            assert_int_not_equal(ids[i], ids[j]);
    }
}

static void test_r6_r7_every_mode(void **state)
{
    (void)state;
    for (size_t m = 0; m < 4; m++) {
        for (int renorm = 0; renorm < 2; renorm++) {
            fam_cfg c = cfg_default(8, 4, 6, 3);
            c.scoring = k_modes[m];
            c.renorm = renorm;
            fam_layer *L = tiny(c);
            int32_t ids[6];
            float w[6];

            /* R7: all-equal rows pick 0..K-1 with equal weights */
            const float eq[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
            route_row(L, eq, ids, w);
            for (int k = 0; k < 3; k++) {
                assert_int_equal(ids[k], k);
                assert_true(w[k] == w[0]);
            }
            /* R7: a tie exactly at the K-th boundary goes to the lower id */
            const float tie[6] = {5, 1, 3, 0, 3, 3};
            route_row(L, tie, ids, w);
            assert_int_equal(ids[0], 0);
            assert_int_equal(ids[1], 2);
            assert_int_equal(ids[2], 4);

            /* R6: NaN ranks below every number; -Inf is a number */
            const float some_nan[6] = {NAN, 1, -INFINITY, NAN, 2, 0};
            route_row(L, some_nan, ids, w);
            assert_int_equal(ids[0], 4);
            assert_int_equal(ids[1], 1);
            assert_int_equal(ids[2], 5);
            for (int k = 0; k < 3; k++)
                assert_true(isfinite(w[k]));
            /* more NaN than K - numbers: NaN experts fill the last slots, lower id first */
            const float mostly_nan[6] = {NAN, NAN, 1, NAN, NAN, NAN};
            route_row(L, mostly_nan, ids, w);
            assert_int_equal(ids[0], 2);
            assert_int_equal(ids[1], 0);
            assert_int_equal(ids[2], 1);
            const float all_nan[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
            route_row(L, all_nan, ids, w);
            for (int k = 0; k < 3; k++)
                assert_int_equal(ids[k], k);
            /* +Inf and -Inf */
            const float inf[6] = {1, INFINITY, -INFINITY, INFINITY, 0, -INFINITY};
            route_row(L, inf, ids, w);
            assert_int_equal(ids[0], 1);
            assert_int_equal(ids[1], 3);
            assert_int_equal(ids[2], 0);
            assert_false(isnan(w[0]));
            const float ninf[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
            route_row(L, ninf, ids, w);
            for (int k = 0; k < 3; k++)
                assert_int_equal(ids[k], k);
            tiny_free(L);
        }
    }
}

/* R6 with groups and selection biases: NaN and -Inf biases, and a bias leaving fewer than
 * topk_group groups finite, still give K distinct valid ids, as docs/numerics.md says. */
static void test_r6_groups(void **state)
{
    (void)state;
    for (int gsc = 0; gsc < 2; gsc++) {
        fam_cfg c = cfg_default(8, 4, 12, 4);
        c.scoring = gsc ? MOE_SCORING_SIGMOID : MOE_SCORING_SOFTMAX;
        c.sel_bias = 1;
        c.n_group = 4; /* groups of 3 */
        c.topk_group = 2;
        c.gscore = gsc ? MOE_GROUP_SCORE_TOP2_SUM : MOE_GROUP_SCORE_MAX;
        c.renorm = 1;
        fam_layer *L = tiny(c);
        int32_t ids[4];
        float w[4];
        float l[12];
        tu_fill_uniform(l, 12, 31, -2, 2);

        /* only group 1 is finite: the other groups' scores are -Inf; groups 1 and 0 are kept
         * (0 wins the tie among -Inf groups); picks: group 1's three experts by score, then
         * the lowest id among the -Inf experts of the kept group 0 */
        float b[12];
        for (int e = 0; e < 12; e++)
            b[e] = (e / 3 == 1) ? 0.0f : -INFINITY;
        set_sel_bias(L, b);
        route_row(L, l, ids, w);
        assert_ids_valid(ids, 4, 12);
        for (int k = 0; k < 3; k++)
            assert_int_equal(ids[k] / 3, 1);
        assert_int_equal(ids[3], 0);
        for (int k = 0; k < 4; k++)
            assert_true(isfinite(w[k])); /* weights are the unbiased scores */

        /* every bias -Inf: all groups tie at -Inf, groups 0 and 1 are kept, experts 0..3 */
        for (int e = 0; e < 12; e++)
            b[e] = -INFINITY;
        set_sel_bias(L, b);
        route_row(L, l, ids, w);
        for (int k = 0; k < 4; k++)
            assert_int_equal(ids[k], k);

        /* NaN biases: those experts rank last within their group, and a NaN group score (all
         * members NaN) ranks below every number */
        for (int e = 0; e < 12; e++)
            b[e] = e < 3 ? NAN : 0.0f;
        b[7] = NAN;
        set_sel_bias(L, b);
        route_row(L, l, ids, w);
        assert_ids_valid(ids, 4, 12);
        for (int k = 0; k < 4; k++) {
            assert_true(ids[k] >= 3);
            assert_int_not_equal(ids[k], 7);
        }

        /* NaN logits inside a kept group: masked (-Inf) experts rank above them */
        for (int e = 0; e < 12; e++)
            b[e] = 0.0f;
        set_sel_bias(L, b);
        float ln[12];
        for (int e = 0; e < 12; e++)
            ln[e] = NAN;
        ln[4] = 1.0f;
        route_row(L, ln, ids, w);
        assert_ids_valid(ids, 4, 12);
        assert_int_equal(ids[0], 4);
        tiny_free(L);
    }
}

/* R6 on hidden states for every family mode: NaN / Inf inputs leave the other tokens' bits
 * alone and give valid ids. */
static void test_r6_hidden_states(void **state)
{
    (void)state;
    for (size_t m = 0; m < 4; m++) {
        fam_cfg c = cfg_default(16, 8, 8, 2);
        c.scoring = k_modes[m];
        c.on_input = k_modes[m] == MOE_SCORING_TOPK_SIGMOID;
        c.act = k_modes[m] == MOE_SCORING_TOPK_SOFTMAX ? MOE_ACT_SWIGLU_OAI : MOE_ACT_SWIGLU;
        c.expert_bias = c.act == MOE_ACT_SWIGLU_OAI;
        c.Is = 8;
        fam_layer L;
        layer_build(&L, &c, 77);
        float *x = rand_x(3, 16, 78, 1.0f);
        x[16 + 3] = NAN;
        x[32 + 5] = INFINITY;
        float *ref;
        int32_t *ids;
        check_bits(&L, x, 3, NULL, &ref, &ids, NULL);
        for (int t = 0; t < 3; t++)
            assert_ids_valid(ids + 2 * t, 2, 8);
        for (int h = 0; h < 16; h++)
            assert_true(isfinite(ref[h]));
        float *alone;
        check_bits(&L, x, 1, NULL, &alone, NULL, NULL);
        assert_memory_equal(alone, ref, sizeof(float) * 16);
        free(alone);
        free(ref);
        free(ids);
        free(x);
        layer_free(&L);
    }
}

/* ---- R8: renormalize, scaling once, weight on the input once ------------------------- */

static void test_r8_scaling_once(void **state)
{
    (void)state;
    for (size_t m = 0; m < 4; m++) {
        for (int on_input = 0; on_input < 2; on_input++) {
            fam_cfg c = cfg_default(16, 8, 8, 2);
            c.scoring = k_modes[m];
            c.on_input = on_input;
            c.renorm = 1;
            fam_layer *L = tiny(c);
            float x[16], l[8], o1[16], o25[16], w1[2], w25[2];
            int32_t id1[2], id25[2];
            tu_fill_uniform(x, 16, 5, -1, 1);
            tu_fill_uniform(l, 8, 6, -2, 2);
            moe_ctx *ctx = make_ctx(NULL, 1, 0, NULL);
            run_plan(ctx, NULL, L, x, 1, l, o1, id1, w1);
            L->d.routed_scaling_factor = 2.5f;
            run_plan(ctx, NULL, L, x, 1, l, o25, id25, w25);
            moe_ctx_free(ctx);
            assert_memory_equal(id1, id25, sizeof id1);
            assert_memory_equal(w1, w25, sizeof w1); /* topk_weights are reported unscaled */
            for (int h = 0; h < 16; h++)
                assert_float_equal(o25[h], 2.5 * o1[h], 1e-6 * fabs(o1[h]) + 1e-12);
            tiny_free(L);
        }
    }
}

/* Llama-4: y = SwiGLU(w * x) summed without the weight again, i.e. the weight is applied
 * exactly once and before the activation (not SwiGLU(x) * w, not SwiGLU(w x) * w). */
static void test_r8_weight_on_input(void **state)
{
    (void)state;
    fam_cfg c = cfg_default(16, 8, 4, 1);
    c.scoring = MOE_SCORING_TOPK_SIGMOID;
    c.on_input = 1;
    fam_layer *L = tiny(c);
    float x[16], l[4] = {-1.0f, 0.3f, -2.0f, -0.5f};
    tu_fill_uniform(x, 16, 8, -2, 2);
    int32_t id;
    float w, out[16];
    moe_ctx *ctx = make_ctx(NULL, 2, 0, NULL);
    run_plan(ctx, NULL, L, x, 1, l, out, &id, &w);
    moe_ctx_free(ctx);
    assert_int_equal(id, 1);
    assert_float_equal(w, sig(0.3), 1e-7);
    /* by hand in double: expert 1 on w * x */
    const int64_t H = 16, I = 8;
    double want_in[16], want_out[16];
    for (int o = 0; o < H; o++) {
        double acc_in = 0, acc_out = 0;
        for (int i = 0; i < I; i++) {
            double g_in = 0, u_in = 0, g = 0, u = 0;
            for (int k = 0; k < H; k++) {
                double gw = L->gf[(1 * I + i) * H + k], uw = L->uf[(1 * I + i) * H + k];
                g_in += (double)w * x[k] * gw;
                u_in += (double)w * x[k] * uw;
                g += (double)x[k] * gw;
                u += (double)x[k] * uw;
            }
            double dw = L->df[(1 * H + o) * I + i];
            acc_in += g_in * sig(g_in) * u_in * dw;
            acc_out += g * sig(g) * u * dw;
        }
        want_in[o] = acc_in;
        want_out[o] = (double)w * acc_out;
    }
    double diff_in = 0, diff_out = 0, mx = 0;
    for (int o = 0; o < H; o++) {
        diff_in = fmax(diff_in, fabs(out[o] - want_in[o]));
        diff_out = fmax(diff_out, fabs(out[o] - want_out[o]));
        mx = fmax(mx, fabs(want_in[o]));
    }
    assert_true(diff_in <= 1e-6 * mx);
    assert_true(diff_out > 1e-3 * mx); /* the weight-on-output result is a different number */
    tiny_free(L);
}

/* ---- validation ---------------------------------------------------------------------- */

static void test_validation(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_plan *p = NULL;
    moe_layer_desc_init(&d);
    d.hidden_size = 8;
    d.moe_intermediate_size = 4;
    d.num_experts = 12;
    d.top_k = 4;
    d.weight_dtype = MOE_DTYPE_F32;
    d.n_group = 5;
    d.topk_group = 2;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "n_group"));
    d.n_group = 4;
    d.topk_group = 5;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "topk_group"));
    d.topk_group = 1; /* 1 group of 3 experts < top_k 4 */
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "top_k"));
    d.topk_group = 2;
    d.group_score = (moe_group_score)9;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "group_score"));
    d.group_score = MOE_GROUP_SCORE_TOP2_SUM;
    d.n_group = -1;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    d.n_group = 4;
    d.activation = MOE_ACT_SWIGLU_OAI;
    d.swiglu_limit = 0.0f;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "swiglu_limit"));
    d.swiglu_limit = 7.0f;
    d.swiglu_alpha = NAN;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "swiglu_alpha"));
    d.swiglu_alpha = 1.702f;
    d.activation = (moe_activation)11;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "activation"));
    d.activation = MOE_ACT_GEGLU;
    d.scoring_func = MOE_SCORING_TOPK_SIGMOID;
    d.has_selection_bias = 1;
    d.has_router_bias = 1;
    d.has_expert_bias = 1;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);

    /* weights: every bias the description asks for is required; strides both or neither */
    fam_cfg c = cfg_default(8, 4, 12, 4);
    fam_layer L;
    layer_build(&L, &c, 1);
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "router_bias"));
    float rb[12] = {0}, sb[12] = {0};
    L.src.router_bias = rb;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "selection_bias"));
    L.src.selection_bias = sb;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "gate_bias"));
    float gb[12][4] = {{0}}, db[12][8] = {{0}};
    const void *gbp[12], *dbp[12];
    for (int e = 0; e < 12; e++) {
        gbp[e] = gb[e];
        dbp[e] = db[e];
    }
    L.src.gate_bias = gbp;
    L.src.up_bias = gbp;
    L.src.down_bias = dbp;
    L.src.selection_bias_dtype = MOE_DTYPE_I32;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EDTYPE);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "selection_bias_dtype"));
    L.src.selection_bias_dtype = MOE_DTYPE_F32;
    L.src.gate_up_stride_out = 1;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "gate_up_stride"));
    L.src.gate_up_stride_out = 0;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_OK);
    moe_weights_free(w);
    moe_plan_free(p);
    layer_free(&L);
    moe_ctx_free(ctx);
    assert_string_equal(moe_family_name(MOE_FAMILY_DEEPSEEK_V3), "deepseek_v3");
    assert_string_equal(moe_family_name(MOE_FAMILY_GRANITE_MOE), "granitemoe");
    assert_string_equal(moe_family_name(MOE_FAMILY_QWEN3_5_MOE), "qwen3_5_moe");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepseek_bits),     cmocka_unit_test(test_gpt_oss_bits),
        cmocka_unit_test(test_llama4_bits),       cmocka_unit_test(test_other_modes_bits),
        cmocka_unit_test(test_layouts_identical), cmocka_unit_test(test_hand_sigmoid),
        cmocka_unit_test(test_hand_groups),       cmocka_unit_test(test_hand_topk_first),
        cmocka_unit_test(test_hand_activations),  cmocka_unit_test(test_r6_r7_every_mode),
        cmocka_unit_test(test_r6_groups),         cmocka_unit_test(test_r6_hidden_states),
        cmocka_unit_test(test_r8_scaling_once),   cmocka_unit_test(test_r8_weight_on_input),
        cmocka_unit_test(test_validation),        cmocka_unit_test(test_sparsemixer_bits),
        cmocka_unit_test(test_hand_sparsemixer),  cmocka_unit_test(test_output_bias), cmocka_unit_test(test_acts_modes), cmocka_unit_test(test_output_norm),
        cmocka_unit_test(test_router_knobs),      cmocka_unit_test(test_renorm_pnorm),
        cmocka_unit_test(test_identity_experts),
        cmocka_unit_test(test_v4step_modes),
        cmocka_unit_test(test_nongated_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
