/* The integration API of moe.h: caller-given routing (moe_exec_args.in_topk_ids /
 * in_topk_weights) against src/ref with the same ids and weights and against the routed
 * path's own routing (bit for bit), its validation, and bf16 output (moe_exec_args.output_dtype)
 * against rounding the f32 output (round to nearest even, written here from its definition). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "ref/ref.h"
#include "testutil.h"

enum { H = 32, I = 24, IS = 16, T = 13, MAXE = 16 };

/* One f32 layer: every tensor row-major, per-expert pointers into stacked arrays. */
typedef struct layer {
    moe_layer_desc d;
    float router[MAXE * H];       /* [E, H] */
    float rbias[MAXE], sbias[MAXE]; /* [E] router bias, selection bias */
    float g[MAXE * I * H], u[MAXE * I * H], dn[MAXE * H * I]; /* [E, I, H] x2, [E, H, I] */
    float gb[MAXE * I], ub[MAXE * I], db[MAXE * H];           /* [E, I] x2, [E, H] */
    float sg[IS * H], su[IS * H], sd[H * IS], sgate[H];       /* shared expert, its gate */
    const void *gp[MAXE], *upp[MAXE], *dp[MAXE], *gbp[MAXE], *ubp[MAXE], *dbp[MAXE];
    moe_weight_source src;
} layer;

/* kinds: 0 Qwen2-MoE (softmax, renormalize, gated shared expert), 1 DeepSeek-V3 (sigmoid,
 * groups, selection bias, routed_scaling_factor, ungated shared), 2 gpt-oss (top-k softmax,
 * router and expert biases, clamped SwiGLU), 3 Llama-4 (top-k sigmoid, weight on input),
 * 4 Nemotron-H-like (sigmoid + selection bias, non-gated relu2 experts with biases and a
 * non-gated shared expert: gate_proj / gate_bias / shared_gate_proj are not given). */
static layer *make_layer(int kind)
{
    layer *L = calloc(1, sizeof *L);
    assert_non_null(L);
    moe_layer_desc *d = &L->d;
    moe_layer_desc_init(d);
    d->hidden_size = H;
    d->moe_intermediate_size = I;
    d->weight_dtype = MOE_DTYPE_F32;
    d->num_experts = 8;
    d->top_k = 2;
    switch (kind) {
    case 0:
        d->family = MOE_FAMILY_QWEN2_MOE;
        d->renormalize = 1;
        d->shared_expert_intermediate_size = IS;
        d->shared_expert_gated = 1;
        break;
    case 1:
        d->family = MOE_FAMILY_DEEPSEEK_V3;
        d->num_experts = 16;
        d->top_k = 4;
        d->scoring_func = MOE_SCORING_SIGMOID;
        d->n_group = 4;
        d->topk_group = 2;
        d->group_score = MOE_GROUP_SCORE_TOP2_SUM;
        d->has_selection_bias = 1;
        d->renormalize = 1;
        d->routed_scaling_factor = 2.5f;
        d->shared_expert_intermediate_size = IS;
        break;
    case 2:
        d->family = MOE_FAMILY_GPT_OSS;
        d->top_k = 3;
        d->scoring_func = MOE_SCORING_TOPK_SOFTMAX;
        d->has_router_bias = 1;
        d->has_expert_bias = 1;
        d->activation = MOE_ACT_SWIGLU_OAI;
        break;
    case 4:
        d->family = MOE_FAMILY_NEMOTRON_H;
        d->scoring_func = MOE_SCORING_SIGMOID;
        d->has_selection_bias = 1;
        d->renormalize = 1;
        d->routed_scaling_factor = 2.5f;
        d->activation = MOE_ACT_RELU2;
        d->has_expert_bias = 1; /* not Nemotron-H's: covers the non-gated up bias [E, I] */
        d->shared_expert_intermediate_size = IS;
        break;
    default:
        d->family = MOE_FAMILY_LLAMA4;
        d->top_k = 1;
        d->scoring_func = MOE_SCORING_TOPK_SIGMOID;
        d->apply_router_weight_on_input = 1;
        d->shared_expert_intermediate_size = IS;
        break;
    }
    const int64_t E = d->num_experts;
    uint64_t seed = 100 * (uint64_t)kind;
    tu_fill_uniform(L->router, (size_t)(E * H), ++seed, -1, 1);
    tu_fill_uniform(L->rbias, MAXE, ++seed, -0.5f, 0.5f);
    tu_fill_uniform(L->sbias, MAXE, ++seed, -0.2f, 0.2f);
    tu_fill_uniform(L->g, sizeof L->g / 4, ++seed, -0.3f, 0.3f);
    tu_fill_uniform(L->u, sizeof L->u / 4, ++seed, -0.3f, 0.3f);
    tu_fill_uniform(L->dn, sizeof L->dn / 4, ++seed, -0.3f, 0.3f);
    tu_fill_uniform(L->gb, sizeof L->gb / 4, ++seed, -0.1f, 0.1f);
    tu_fill_uniform(L->ub, sizeof L->ub / 4, ++seed, -0.1f, 0.1f);
    tu_fill_uniform(L->db, sizeof L->db / 4, ++seed, -0.1f, 0.1f);
    tu_fill_uniform(L->sg, sizeof L->sg / 4, ++seed, -0.3f, 0.3f);
    tu_fill_uniform(L->su, sizeof L->su / 4, ++seed, -0.3f, 0.3f);
    tu_fill_uniform(L->sd, sizeof L->sd / 4, ++seed, -0.3f, 0.3f);
    tu_fill_uniform(L->sgate, H, ++seed, -0.3f, 0.3f);
    for (int64_t e = 0; e < E; e++) {
        L->gp[e] = L->g + e * I * H;
        L->upp[e] = L->u + e * I * H;
        L->dp[e] = L->dn + e * H * I;
        L->gbp[e] = L->gb + e * I;
        L->ubp[e] = L->ub + e * I;
        L->dbp[e] = L->db + e * H;
    }
    moe_weight_source *s = &L->src;
    s->router = L->router;
    s->router_dtype = MOE_DTYPE_F32;
    const int gated = moe_activation_gated(d->activation);
    s->gate_proj = gated ? L->gp : NULL;
    s->up_proj = L->upp;
    s->down_proj = L->dp;
    if (d->shared_expert_intermediate_size) {
        s->shared_gate_proj = gated ? L->sg : NULL;
        s->shared_up_proj = L->su;
        s->shared_down_proj = L->sd;
        s->shared_expert_gate = L->sgate;
    }
    if (d->has_router_bias)
        s->router_bias = L->rbias;
    if (d->has_selection_bias)
        s->selection_bias = L->sbias;
    if (d->has_expert_bias) {
        s->gate_bias = gated ? L->gbp : NULL;
        s->up_bias = L->ubp;
        s->down_bias = L->dbp;
    }
    return L;
}

/* A context with `threads` threads and chunks of 5 tokens (T = 13: three chunks). */
static moe_ctx *make_ctx(int threads)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = threads;
    o.chunk_size = 5;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    return ctx;
}

typedef struct run {
    moe_ctx *ctx;
    moe_plan *plan;
    moe_weights *w;
    void *ws;
    size_t wsz;
} run;

static void run_open(run *r, const layer *L, moe_compute compute, int threads)
{
    r->ctx = make_ctx(threads);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.compute = compute;
    assert_int_equal(moe_plan_create_ex(r->ctx, &L->d, &cfg, &r->plan), MOE_OK);
    moe_status st = moe_weights_create(r->plan, &L->src, &r->w);
    if (st != MOE_OK)
        fail_msg("%s", moe_ctx_last_error(r->ctx));
    r->wsz = moe_plan_workspace_size(r->plan, T);
    r->ws = aligned_alloc(64, (r->wsz + 63) / 64 * 64); /* workspace */
}

static void run_close(run *r)
{
    free(r->ws);
    moe_weights_free(r->w);
    moe_plan_free(r->plan);
    moe_ctx_free(r->ctx);
}

/* One execute; in_ids / in_wts may be NULL (routed). */
static moe_status exec(run *r, const void *x, moe_dtype xdt, const int32_t *in_ids, const float *in_wts, void *out,
                       moe_dtype odt, int32_t *ids, float *wts)
{
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = xdt, .n_tokens = T, .output = out, .topk_ids = ids,
                       .topk_weights = wts, .workspace = r->ws, .workspace_size = r->wsz,
                       .in_topk_ids = in_ids, .in_topk_weights = in_wts, .output_dtype = odt};
    return moe_plan_execute_ex(r->plan, r->w, &a);
}

/* bf16 of f32 v by round to nearest even, from the definition: the 16 high bits, plus one when
 * the 16 dropped bits exceed half, or equal half with the kept low bit set; NaN stays NaN. */
static uint16_t bf16_rne(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if (isnan(v))
        return (uint16_t)((u >> 16) | 0x40);
    uint32_t hi = u >> 16, lo = u & 0xffff;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1)))
        hi++;
    return (uint16_t)hi;
}

/* Given the routed path's own ids and weights, the output is bit-identical to it: every layer
 * kind, f32 and bf16 hidden states, both compute modes, one and two threads. */
static void test_given_equals_routed(void **state)
{
    (void)state;
    for (int kind = 0; kind < 5; kind++)
        for (int comp = 0; comp < 2; comp++) {
            layer *L = make_layer(kind);
            const int64_t K = L->d.top_k;
            run r;
            run_open(&r, L, comp ? MOE_COMPUTE_BF16 : MOE_COMPUTE_F32, 1 + comp);
            float x[T * H];        /* [T, H] */
            uint16_t xb[T * H];    /* [T, H] bf16 */
            tu_fill_uniform(x, T * H, 7 + (uint64_t)kind, -1, 1);
            for (int i = 0; i < T * H; i++)
                xb[i] = bf16_rne(x[i]);
            for (int bf = 0; bf < 2; bf++) {
                const void *xin = bf ? (const void *)xb : (const void *)x;
                const moe_dtype xdt = bf ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
                float out1[T * H], out2[T * H]; /* [T, H] */
                int32_t ids[T * 8], ids2[T * 8]; /* [T, K] */
                float wts[T * 8], wts2[T * 8];   /* [T, K] */
                assert_int_equal(exec(&r, xin, xdt, NULL, NULL, out1, MOE_DTYPE_F32, ids, wts), MOE_OK);
                moe_status st = exec(&r, xin, xdt, ids, wts, out2, MOE_DTYPE_F32, ids2, wts2);
                if (st != MOE_OK)
                    fail_msg("%s", moe_ctx_last_error(r.ctx));
                assert_memory_equal(out1, out2, sizeof out1);
                assert_memory_equal(ids, ids2, sizeof(int32_t) * (size_t)(T * K));
                assert_memory_equal(wts, wts2, sizeof(float) * (size_t)(T * K));
            }
            run_close(&r);
            free(L);
        }
}

/* Arbitrary ids (distinct per token, any order) and weights (not normalized, negative ones
 * included) against src/ref given the same routing, bit for bit; routed_scaling_factor and
 * the shared expert still apply as described. */
static void test_given_vs_ref(void **state)
{
    (void)state;
    for (int kind = 0; kind < 5; kind++)
        for (int comp = 0; comp < 2; comp++) {
            layer *L = make_layer(kind);
            const int64_t E = L->d.num_experts, K = L->d.top_k;
            run r;
            run_open(&r, L, comp ? MOE_COMPUTE_BF16 : MOE_COMPUTE_F32, 2);
            float x[T * H];
            tu_fill_uniform(x, T * H, 31 + (uint64_t)kind, -1, 1);
            int32_t ids[T * 8]; /* [T, K] */
            float wts[T * 8];   /* [T, K] */
            uint64_t s = 12345 + (uint64_t)kind;
            for (int t = 0; t < T; t++) {
                int32_t perm[MAXE]; /* a random permutation of the experts; its first K */
                for (int e = 0; e < E; e++)
                    perm[e] = e;
                for (int64_t e = E - 1; e > 0; e--) {
                    int64_t j = (int64_t)(tu_xorshift(&s) % (uint64_t)(e + 1));
                    int32_t tmp = perm[e];
                    perm[e] = perm[j];
                    perm[j] = tmp;
                }
                memcpy(ids + t * K, perm, sizeof(int32_t) * (size_t)K);
            }
            tu_fill_uniform(wts, (size_t)(T * K), 77, -0.5f, 1.5f);
            float out[T * H], want[T * H];
            moe_status st = exec(&r, x, MOE_DTYPE_F32, ids, wts, out, MOE_DTYPE_F32, NULL, NULL);
            if (st != MOE_OK)
                fail_msg("%s", moe_ctx_last_error(r.ctx));
            assert_int_equal(moe_ref_forward_given(&L->d, &L->src, comp ? MOE_COMPUTE_BF16 : MOE_COMPUTE_F32, x, T,
                                                   NULL, ids, wts, want, NULL, NULL),
                             MOE_OK);
            assert_memory_equal(out, want, sizeof out);
            run_close(&r);
            free(L);
        }
}

/* Bad caller routing: named errors, nothing written. */
static void test_given_errors(void **state)
{
    (void)state;
    layer *L = make_layer(0); /* E = 8, K = 2 */
    run r;
    run_open(&r, L, MOE_COMPUTE_F32, 1);
    float x[T * H], out[T * H], logits[T * 8];
    tu_fill_uniform(x, T * H, 5, -1, 1);
    tu_fill_uniform(logits, T * 8, 6, -1, 1);
    int32_t ids[T * 2];
    float wts[T * 2];
    for (int t = 0; t < T; t++) {
        ids[2 * t] = t % 8;
        ids[2 * t + 1] = (t + 3) % 8;
        wts[2 * t] = 0.75f;
        wts[2 * t + 1] = 0.25f;
    }
    const float sentinel = -123.0f;
    for (int i = 0; i < T * H; i++)
        out[i] = sentinel;

    ids[2 * 4 + 1] = 8; /* token 4, slot 1: = E */
    tu_check_error(r.ctx, exec(&r, x, MOE_DTYPE_F32, ids, wts, out, MOE_DTYPE_F32, NULL, NULL), MOE_EINVAL,
                   (const char *const[]){"in_topk_ids[4][1] = 8", "token 4, slot 1", "[0, 8)", NULL});
    ids[2 * 4 + 1] = -2; /* -1 is an empty slot (test_capacity); other negatives are refused */
    tu_check_error(r.ctx, exec(&r, x, MOE_DTYPE_F32, ids, wts, out, MOE_DTYPE_F32, NULL, NULL), MOE_EINVAL,
                   (const char *const[]){"in_topk_ids[4][1] = -2", "is not -1 (an empty slot)", NULL});
    ids[2 * 4 + 1] = ids[2 * 4]; /* token 4: slot 1 repeats slot 0 */
    tu_check_error(r.ctx, exec(&r, x, MOE_DTYPE_F32, ids, wts, out, MOE_DTYPE_F32, NULL, NULL), MOE_EINVAL,
                   (const char *const[]){"in_topk_ids[4][1] = 4", "repeats slot 0 of token 4", "distinct", NULL});
    ids[2 * 4 + 1] = 7;
    tu_check_error(r.ctx, exec(&r, x, MOE_DTYPE_F32, ids, NULL, out, MOE_DTYPE_F32, NULL, NULL), MOE_EINVAL,
                   (const char *const[]){"in_topk_ids is set but in_topk_weights is NULL", NULL});
    tu_check_error(r.ctx, exec(&r, x, MOE_DTYPE_F32, NULL, wts, out, MOE_DTYPE_F32, NULL, NULL), MOE_EINVAL,
                   (const char *const[]){"in_topk_weights is set but in_topk_ids is NULL", NULL});
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = out,
                       .router_logits = logits, .workspace = r.ws, .workspace_size = r.wsz,
                       .in_topk_ids = ids, .in_topk_weights = wts};
    tu_check_error(r.ctx, moe_plan_execute_ex(r.plan, r.w, &a), MOE_EINVAL,
                   (const char *const[]){"router_logits and in_topk_ids are both set", NULL});
    for (int i = 0; i < T * H; i++)
        assert_true(out[i] == sentinel);
    /* the good routing runs */
    assert_int_equal(exec(&r, x, MOE_DTYPE_F32, ids, wts, out, MOE_DTYPE_F32, NULL, NULL), MOE_OK);
    run_close(&r);
    free(L);
}

/* bf16 output equals rounding the f32 output (NaN rows included: token 3's input is NaN),
 * for routed and given routing, f32 and bf16 input, both compute modes. */
static void test_bf16_output(void **state)
{
    (void)state;
    for (int kind = 0; kind < 5; kind++)
        for (int comp = 0; comp < 2; comp++) {
            layer *L = make_layer(kind);
            run r;
            run_open(&r, L, comp ? MOE_COMPUTE_BF16 : MOE_COMPUTE_F32, 2);
            float x[T * H];
            tu_fill_uniform(x, T * H, 50 + (uint64_t)kind, -1, 1);
            x[3 * H + 5] = NAN;
            uint16_t xb[T * H];
            for (int i = 0; i < T * H; i++)
                xb[i] = bf16_rne(x[i]);
            for (int bf = 0; bf < 2; bf++) {
                const void *xin = bf ? (const void *)xb : (const void *)x;
                const moe_dtype xdt = bf ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
                float of[T * H];    /* [T, H] f32 */
                uint16_t ob[T * H]; /* [T, H] bf16 */
                int32_t ids[T * 8];
                float wts[T * 8];
                assert_int_equal(exec(&r, xin, xdt, NULL, NULL, of, MOE_DTYPE_F32, ids, wts), MOE_OK);
                assert_int_equal(exec(&r, xin, xdt, NULL, NULL, ob, MOE_DTYPE_BF16, NULL, NULL), MOE_OK);
                int nan_seen = 0;
                for (int i = 0; i < T * H; i++) {
                    nan_seen += isnan(of[i]) != 0;
                    if (ob[i] != bf16_rne(of[i]))
                        fail_msg("kind %d element %d: bf16 0x%04x, f32 %a rounds to 0x%04x", kind, i, ob[i],
                                 (double)of[i], bf16_rne(of[i]));
                }
                assert_true(nan_seen > 0);
                memset(ob, 0, sizeof ob);
                assert_int_equal(exec(&r, xin, xdt, ids, wts, ob, MOE_DTYPE_BF16, NULL, NULL), MOE_OK);
                for (int i = 0; i < T * H; i++)
                    assert_int_equal(ob[i], bf16_rne(of[i]));
            }
            float out[T * H];
            tu_check_error(r.ctx, exec(&r, x, MOE_DTYPE_F32, NULL, NULL, out, MOE_DTYPE_F16, NULL, NULL), MOE_EDTYPE,
                           (const char *const[]){"output_dtype F16", "F32 or BF16", NULL});
            run_close(&r);
            free(L);
        }
}

/* The stacked layouts of transformers (is_transposed x is_concatenated, with and without
 * biases) built from the row-major per-expert weights: packed through
 * moe_weight_source_from_stacked they give the row-major path's output bit for bit. */
static void test_stacked_layouts(void **state)
{
    (void)state;
    for (int kind = 0; kind <= 4; kind += 2) { /* 0: no biases; 2: gpt-oss biases; 4: non-gated, biases */
        layer *L = make_layer(kind);
        const int64_t E = L->d.num_experts;
        const int gated = moe_activation_gated(L->d.activation);
        const int64_t W1 = gated ? 2 * I : I; /* gate_up_proj's outputs per expert */
        run r;
        run_open(&r, L, MOE_COMPUTE_F32, 2);
        float x[T * H], want[T * H], got[T * H];
        tu_fill_uniform(x, T * H, 9, -1, 1);
        assert_int_equal(exec(&r, x, MOE_DTYPE_F32, NULL, NULL, want, MOE_DTYPE_F32, NULL, NULL), MOE_OK);
        float *gu = malloc(sizeof(float) * (size_t)(E * 2 * I * H)); /* [E, W1, H] or [E, H, W1] */
        float *dn = malloc(sizeof(float) * (size_t)(E * H * I));     /* [E, H, I] or [E, I, H] */
        float gub[MAXE * 2 * I], dnb[MAXE * H];                      /* [E, W1], [E, H] */
        assert_non_null(gu);
        assert_non_null(dn);
        for (int tr = 0; tr < 2; tr++)
            for (int cat = 0; cat < 2; cat++) {
                /* non-gated: one up row per output (cat is not read: both give the same layout) */
                for (int64_t e = 0; e < E; e++) {
                    for (int64_t o = 0; o < I; o++) {
                        const int64_t og = cat ? o : 2 * o, ou = !gated ? o : cat ? I + o : 2 * o + 1; /* rows of W1 */
                        for (int64_t i = 0; i < H; i++) {
                            const float g = L->g[(e * I + o) * H + i], u = L->u[(e * I + o) * H + i];
                            if (!tr) {
                                if (gated)
                                    gu[(e * W1 + og) * H + i] = g;
                                gu[(e * W1 + ou) * H + i] = u;
                            } else {
                                if (gated)
                                    gu[(e * H + i) * W1 + og] = g;
                                gu[(e * H + i) * W1 + ou] = u;
                            }
                        }
                        if (gated)
                            gub[e * W1 + og] = L->gb[e * I + o];
                        gub[e * W1 + ou] = L->ub[e * I + o];
                    }
                    for (int64_t o = 0; o < H; o++) {
                        dnb[e * H + o] = L->db[e * H + o];
                        for (int64_t i = 0; i < I; i++) {
                            const float v = L->dn[(e * H + o) * I + i];
                            if (!tr)
                                dn[(e * H + o) * I + i] = v;
                            else
                                dn[(e * I + i) * H + o] = v;
                        }
                    }
                }
                moe_stacked_experts se = {.gate_up_proj = gu, .down_proj = dn, .is_transposed = tr,
                                          .is_concatenated = cat, .has_bias = L->d.has_expert_bias,
                                          .gate_up_proj_bias = gub, .down_proj_bias = dnb,
                                          .bias_dtype = MOE_DTYPE_F32};
                moe_weight_source src = L->src; /* router etc. kept */
                const void *ptrs[MOE_STACKED_POINTERS(MAXE)];
                char err[256];
                moe_status st = moe_weight_source_from_stacked(&L->d, &se, ptrs, MOE_STACKED_POINTERS(E), &src, err,
                                                               sizeof err);
                if (st != MOE_OK)
                    fail_msg("%s", err);
                assert_ptr_equal(src.router, L->src.router);
                if (!gated) {
                    assert_null(src.gate_proj);
                    assert_null(src.gate_bias);
                }
                moe_weights *w2 = NULL;
                assert_int_equal(moe_weights_create(r.plan, &src, &w2), MOE_OK);
                assert_int_equal(moe_weights_expert_bytes(w2), moe_weights_expert_bytes(r.w));
                moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = got,
                                   .workspace = r.ws, .workspace_size = r.wsz};
                assert_int_equal(moe_plan_execute_ex(r.plan, w2, &a), MOE_OK);
                if (memcmp(got, want, sizeof got) != 0)
                    fail_msg("kind %d is_transposed %d is_concatenated %d: output differs from the row-major path", kind,
                             tr, cat);
                moe_weights_free(w2);
            }
        /* errors */
        moe_stacked_experts se = {.gate_up_proj = gu, .down_proj = dn, .is_concatenated = 1,
                                  .has_bias = !L->d.has_expert_bias, .gate_up_proj_bias = gub,
                                  .down_proj_bias = dnb};
        moe_weight_source src = L->src;
        const void *ptrs[MOE_STACKED_POINTERS(MAXE)];
        char err[256];
        assert_int_equal(moe_weight_source_from_stacked(&L->d, &se, ptrs, MOE_STACKED_POINTERS(E), &src, err,
                                                        sizeof err),
                         MOE_EINVAL);
        assert_non_null(strstr(err, "has_bias"));
        se.has_bias = L->d.has_expert_bias;
        assert_int_equal(moe_weight_source_from_stacked(&L->d, &se, ptrs, MOE_STACKED_POINTERS(E) - 1, &src, err,
                                                        sizeof err),
                         MOE_EINVAL);
        assert_non_null(strstr(err, "needed"));
        se.down_proj = NULL;
        assert_int_equal(moe_weight_source_from_stacked(&L->d, &se, ptrs, MOE_STACKED_POINTERS(E), &src, err,
                                                        sizeof err),
                         MOE_EINVAL);
        assert_non_null(strstr(err, "stacked->down_proj is NULL"));
        free(gu);
        free(dn);
        run_close(&r);
        free(L);
    }
}

/* Packing progress: the calls one moe_weights_create makes. */
typedef struct progress_log {
    int n;
    uint64_t done[4096], total[4096];
    int other_thread; /* calls from a thread other than the caller's */
    pthread_t caller;
} progress_log;

static void on_progress(uint64_t done, uint64_t total, void *user)
{
    progress_log *p = user;
    if (!pthread_equal(pthread_self(), p->caller))
        p->other_thread++;
    if (p->n < 4096) {
        p->done[p->n] = done;
        p->total[p->n] = total;
    }
    p->n++;
}

/* The calls: at least (0, total) and (total, total), done never decreasing, the final call
 * once, every call from the calling thread, total = want_total. */
static void check_progress(const progress_log *p, uint64_t want_total)
{
    assert_true(p->n >= 2 && p->n <= 4096);
    assert_int_equal(p->other_thread, 0);
    assert_int_equal(p->done[0], 0);
    for (int i = 0; i < p->n; i++) {
        assert_int_equal(p->total[i], want_total);
        if (i > 0)
            assert_true(p->done[i] >= p->done[i - 1]);
        if (i < p->n - 1)
            assert_true(p->done[i] < want_total);
    }
    assert_int_equal(p->done[p->n - 1], want_total);
}

/* moe_weights_create (4 threads: the callback still comes from the caller's thread only) and
 * moe_checkpoint_load_weights on a fixture report packing progress in bytes. */
static void test_pack_progress(void **state)
{
    (void)state;
    static progress_log plog;
    memset(&plog, 0, sizeof plog);
    plog.caller = pthread_self();
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 4;
    o.pack_progress_fn = on_progress;
    o.pack_progress_user = &plog;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    layer *L = make_layer(2); /* no shared expert: expert bytes are the routed matrices */
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create(ctx, &L->d, &plan), MOE_OK);
    assert_int_equal(moe_weights_create(plan, &L->src, &w), MOE_OK);
    check_progress(&plog, moe_weights_expert_bytes(w));
    /* (how many calls come in between depends on which thread packs what: not asserted) */
    moe_weights_free(w);
    moe_plan_free(plan);
    free(L);

    char dir[1024];
    tu_data_path(dir, sizeof dir, "deepseek_v3_f32");
    memset(&plog, 0, sizeof plog);
    plog.caller = pthread_self();
    moe_layer_desc d;
    moe_checkpoint *ck = NULL;
    int64_t layer_i = -1;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    for (int64_t l = 0; l < moe_checkpoint_num_layers(ck) && layer_i < 0; l++)
        if (moe_checkpoint_is_moe_layer(ck, l))
            layer_i = l;
    assert_true(layer_i >= 0);
    assert_int_equal(moe_checkpoint_layer_desc(ck, layer_i, &d), MOE_OK);
    assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
    assert_int_equal(moe_checkpoint_load_weights(ck, layer_i, plan, &w), MOE_OK);
    assert_true(plog.n >= 2);
    /* DeepSeek-V3 has a shared expert: total is the routed matrices, below the expert bytes */
    assert_true(plog.total[0] > 0 && plog.total[0] < moe_weights_expert_bytes(w));
    check_progress(&plog, plog.total[0]);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_given_equals_routed),
        cmocka_unit_test(test_given_vs_ref),
        cmocka_unit_test(test_given_errors),
        cmocka_unit_test(test_bf16_output),
        cmocka_unit_test(test_stacked_layouts),
        cmocka_unit_test(test_pack_progress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
