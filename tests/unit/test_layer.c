/* The plan path (every kernel table, thread count and chunk size) against the src/ref oracle,
 * bit for bit, over the REGRESSIONS.md size classes R2, R4, R5; batch invariance; in both
 * compute modes (moe.h moe_compute: the bf16 tests run the same cases with compute bf16
 * against moe_ref_forward_compute). */
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

/* A random layer: weights kept unpacked (for src/ref) in the chosen dtype. */
typedef struct layer {
    moe_layer_desc desc;
    void *router;             /* [E, H] router dtype */
    moe_dtype router_dtype;
    void **gate, **up, **down; /* E x [I,H], [I,H], [H,I] */
    void *sg, *su, *sd, *sgate; /* shared [Is,H], [Is,H], [H,Is], gate [1,H] */
    moe_weight_source src;
} layer;

static void *rand_mat(int64_t n, moe_dtype dt, uint64_t seed, float scale)
{
    float *f = malloc(sizeof(float) * (size_t)n);
    tu_fill_uniform(f, (size_t)n, seed, -scale, scale);
    if (dt == MOE_DTYPE_F32)
        return f;
    uint16_t *h = malloc(2 * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == MOE_DTYPE_BF16 ? moe_f32_to_bf16(f[i]) : moe_f32_to_f16(f[i]);
    free(f);
    return h;
}

static void layer_init(layer *L, int64_t H, int64_t I, int64_t E, int64_t K, int64_t Is, int gated,
                       int renorm, moe_dtype dt, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    moe_layer_desc_init(&L->desc);
    L->desc.hidden_size = H;
    L->desc.moe_intermediate_size = I;
    L->desc.num_experts = E;
    L->desc.top_k = K;
    L->desc.renormalize = renorm;
    L->desc.shared_expert_intermediate_size = Is;
    L->desc.shared_expert_gated = gated;
    L->desc.weight_dtype = dt;
    L->router_dtype = dt;
    float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
    L->router = rand_mat(E * H, dt, seed + 1, 4.0f * sh);
    L->gate = calloc((size_t)E, sizeof(void *));
    L->up = calloc((size_t)E, sizeof(void *));
    L->down = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        L->gate[e] = rand_mat(I * H, dt, seed + 100 + 3 * (uint64_t)e, sh);
        L->up[e] = rand_mat(I * H, dt, seed + 101 + 3 * (uint64_t)e, sh);
        L->down[e] = rand_mat(H * I, dt, seed + 102 + 3 * (uint64_t)e, si);
    }
    L->src.router = L->router;
    L->src.router_dtype = dt;
    L->src.gate_proj = (const void *const *)L->gate;
    L->src.up_proj = (const void *const *)L->up;
    L->src.down_proj = (const void *const *)L->down;
    if (Is > 0) {
        float ss = 1.0f / sqrtf((float)Is);
        L->sg = rand_mat(Is * H, dt, seed + 7, sh);
        L->su = rand_mat(Is * H, dt, seed + 8, sh);
        L->sd = rand_mat(H * Is, dt, seed + 9, ss);
        L->src.shared_gate_proj = L->sg;
        L->src.shared_up_proj = L->su;
        L->src.shared_down_proj = L->sd;
        if (gated) {
            L->sgate = rand_mat(H, dt, seed + 10, sh);
            L->src.shared_expert_gate = L->sgate;
        }
    }
}

static void layer_free(layer *L)
{
    for (int64_t e = 0; e < L->desc.num_experts; e++) {
        free(L->gate[e]);
        free(L->up[e]);
        free(L->down[e]);
    }
    free(L->gate);
    free(L->up);
    free(L->down);
    free(L->router);
    free(L->sg);
    free(L->su);
    free(L->sd);
    free(L->sgate);
}

/* The compute mode of the plans and of the oracle in the running test. */
static moe_compute g_compute = MOE_COMPUTE_F32;

static moe_status ref_forward(const layer *L, const float *x, int64_t T, const float *logits, float *out,
                              int32_t *ids, float *wts)
{
    return moe_ref_forward_compute(&L->desc, &L->src, g_compute, x, T, logits, out, ids, wts);
}

static moe_ctx *make_ctx(const char *isa, int threads, int64_t chunk)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = isa;
    o.num_threads = threads;
    o.chunk_size = chunk;
    moe_ctx *ctx = NULL;
    char err[512];
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        return NULL; /* ISA not supported here */
    return ctx;
}

/* Run the plan path; returns 0 on success. out [T,H], ids/wts [T,K]. */
static void run_plan(moe_ctx *ctx, layer *L, const float *x, int64_t T, const float *logits, float *out,
                     int32_t *ids, float *wts)
{
    moe_plan *plan = NULL;
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.compute = g_compute;
    assert_int_equal(moe_plan_create_ex(ctx, &L->desc, &cfg, &plan), MOE_OK);
    assert_int_equal(moe_plan_compute(plan), g_compute);
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(plan, &L->src, &w), MOE_OK);
    size_t wsz = moe_plan_workspace_size(plan, T);
    void *ws = wsz ? malloc(wsz) : NULL;
    moe_exec_args a = {0};
    a.hidden_states = x;
    a.hidden_dtype = MOE_DTYPE_F32;
    a.n_tokens = T;
    a.router_logits = logits;
    a.output = out;
    a.topk_ids = ids;
    a.topk_weights = wts;
    a.workspace = ws;
    a.workspace_size = wsz;
    moe_status st = moe_plan_execute_ex(plan, w, &a);
    if (st != MOE_OK)
        fail_msg("execute: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(plan);
}

/* Plan path == oracle, bit for bit, for every table, 1 and 2 threads, two chunk sizes. */
static void check_case(int64_t H, int64_t I, int64_t E, int64_t K, int64_t Is, int gated, int renorm,
                       moe_dtype dt, int64_t T, uint64_t seed)
{
    layer L;
    layer_init(&L, H, I, E, K, Is, gated, renorm, dt, seed);
    size_t nx = (size_t)(T * H), nk = (size_t)(T * K);
    float *x = malloc(sizeof(float) * (nx ? nx : 1));
    tu_fill_uniform(x, nx, seed ^ 0x55, -1.0f, 1.0f);
    float *ref = calloc(nx + 1, sizeof(float));
    int32_t *rid = calloc(nk + 1, sizeof(int32_t));
    float *rw = calloc(nk + 1, sizeof(float));
    assert_int_equal(ref_forward(&L, x, T, NULL, ref, rid, rw), MOE_OK);

    const char *isas[16]; /* the kernel registry's rows */
    const size_t n_isas = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    const int threads[] = {1, 2};
    const int64_t chunks[] = {1 << 20, 7};
    for (size_t i = 0; i < n_isas; i++) {
        for (size_t th = 0; th < 2; th++) {
            for (size_t c = 0; c < 2; c++) {
                moe_ctx *ctx = make_ctx(isas[i], threads[th], chunks[c]);
                if (!ctx)
                    continue;
                float *out = malloc(sizeof(float) * (nx + 1));
                int32_t *id = malloc(sizeof(int32_t) * (nk + 1));
                float *w = malloc(sizeof(float) * (nk + 1));
                for (size_t j = 0; j <= nx; j++)
                    out[j] = -12345.0f;
                run_plan(ctx, &L, x, T, NULL, out, id, w);
                if (T > 0) {
                    if (memcmp(out, ref, sizeof(float) * nx) != 0)
                        fail_msg("output differs from src/ref (compute %s): isa %s threads %d chunk %lld H%lld I%lld "
                                 "E%lld K%lld Is%lld %s T%lld (max diff %g)",
                                 moe_compute_name(g_compute), isas[i], threads[th], (long long)chunks[c], (long long)H, (long long)I,
                                 (long long)E, (long long)K, (long long)Is, moe_dtype_name(dt), (long long)T,
                                 tu_max_abs_diff(out, ref, nx));
                    assert_memory_equal(id, rid, sizeof(int32_t) * nk);
                    assert_memory_equal(w, rw, sizeof(float) * nk);
                }
                assert_true(out[nx] == -12345.0f); /* nothing written past T*H; T = 0 writes nothing */
                free(out);
                free(id);
                free(w);
                moe_ctx_free(ctx);
            }
        }
    }
    free(x);
    free(ref);
    free(rid);
    free(rw);
    layer_free(&L);
}

/* R2: token counts around every block and tile edge (T = 0 included). */
static void test_token_counts(void **state)
{
    (void)state;
    const int64_t Ts[] = {0, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 127, 129};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        check_case(40, 24, 8, 2, 0, 0, 1, MOE_DTYPE_F32, Ts[i], 1000 + i);
}

/* R4: expert counts templated kernels often miss; K = 1 and K = E; odd widths. */
static void test_expert_counts(void **state)
{
    (void)state;
    check_case(33, 17, 1, 1, 0, 0, 1, MOE_DTYPE_F32, 9, 11);
    check_case(33, 17, 3, 3, 0, 0, 0, MOE_DTYPE_F32, 9, 12);
    check_case(48, 20, 6, 1, 0, 0, 0, MOE_DTYPE_BF16, 13, 13);
    check_case(32, 16, 60, 4, 0, 0, 0, MOE_DTYPE_F16, 21, 14);
    check_case(32, 8, 160, 6, 0, 0, 1, MOE_DTYPE_BF16, 5, 15);
    check_case(24, 8, 384, 8, 0, 0, 1, MOE_DTYPE_F32, 3, 16);
    check_case(16, 80, 5, 5, 0, 0, 1, MOE_DTYPE_F32, 7, 17);
}

/* Shared expert gated and not, every weight dtype, with odd I_shared. */
static void test_shared_and_dtypes(void **state)
{
    (void)state;
    const moe_dtype dts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F16};
    for (size_t i = 0; i < 3; i++) {
        check_case(64, 32, 8, 4, 40, 1, 0, dts[i], 19, 20 + i);
        check_case(35, 18, 4, 2, 21, 0, 1, dts[i], 6, 30 + i);
    }
}

/* R5: rows per expert of 1, 31, 33 and one expert with every row, most with none: routing
 * forced through caller-supplied router logits. */
static void test_rows_per_expert(void **state)
{
    (void)state;
    const int64_t H = 32, I = 16, E = 128, K = 2, T = 65;
    layer L;
    layer_init(&L, H, I, E, K, 0, 0, 1, MOE_DTYPE_BF16, 77);
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 78, -1, 1);
    float *logits = malloc(sizeof(float) * (size_t)(T * E)); /* [T, E] */
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++)
            logits[t * E + e] = -5.0f + 0.001f * (float)e;
        /* first choice: expert 0 for every token (65 rows); second: 1 row on expert 1,
         * 31 rows on expert 2, 33 rows on expert 3 */
        logits[t * E + 0] = 3.0f;
        int64_t second = t == 0 ? 1 : (t <= 31 ? 2 : 3);
        logits[t * E + second] = 2.0f;
    }
    float *ref = malloc(sizeof(float) * (size_t)(T * H));
    int32_t *rid = malloc(sizeof(int32_t) * (size_t)(T * K));
    assert_int_equal(ref_forward(&L, x, T, logits, ref, rid, NULL), MOE_OK);
    int counts[4] = {0};
    for (int64_t i = 0; i < T * K; i++)
        if (rid[i] < 4)
            counts[rid[i]]++;
    assert_int_equal(counts[0], 65);
    assert_int_equal(counts[1], 1);
    assert_int_equal(counts[2], 31);
    assert_int_equal(counts[3], 33);
    const char *isas[16]; /* the kernel registry's rows */
    const size_t n_isas = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    for (size_t i = 0; i < n_isas; i++) {
        moe_ctx *ctx = make_ctx(isas[i], 2, 0);
        if (!ctx)
            continue;
        float *out = malloc(sizeof(float) * (size_t)(T * H));
        int32_t *id = malloc(sizeof(int32_t) * (size_t)(T * K));
        run_plan(ctx, &L, x, T, logits, out, id, NULL);
        assert_memory_equal(out, ref, sizeof(float) * (size_t)(T * H));
        assert_memory_equal(id, rid, sizeof(int32_t) * (size_t)(T * K));
        free(out);
        free(id);
        moe_ctx_free(ctx);
    }
    free(x);
    free(logits);
    free(ref);
    free(rid);
    layer_free(&L);
}

/* Batch invariance: a token's output bits are the same alone and inside a batch of 300, with
 * 1 or 2 threads and any chunk size, on the default table. */
static void test_batch_invariance(void **state)
{
    (void)state;
    const int64_t H = 64, I = 48, E = 16, K = 4, T = 300;
    layer L;
    layer_init(&L, H, I, E, K, 24, 1, 1, MOE_DTYPE_BF16, 99);
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 98, -2, 2);
    float *batch = malloc(sizeof(float) * (size_t)(T * H));
    moe_ctx *ctx = make_ctx(NULL, 2, 0);
    run_plan(ctx, &L, x, T, NULL, batch, NULL, NULL);
    moe_ctx_free(ctx);
    const int64_t probes[] = {0, 1, 150, 299};
    const int64_t chunks[] = {1, 5, 64};
    for (size_t p = 0; p < 4; p++) {
        for (int th = 1; th <= 2; th++) {
            for (size_t c = 0; c < 3; c++) {
                moe_ctx *c1 = make_ctx(NULL, th, chunks[c]);
                float alone[64];
                run_plan(c1, &L, x + probes[p] * H, 1, NULL, alone, NULL, NULL);
                assert_memory_equal(alone, batch + probes[p] * H, sizeof alone);
                moe_ctx_free(c1);
            }
        }
    }
    free(x);
    free(batch);
    layer_free(&L);
}

/* bf16 hidden_states give the same bits as their exact f32 values. */
static void test_bf16_input(void **state)
{
    (void)state;
    const int64_t H = 40, I = 24, E = 8, K = 2, T = 11;
    layer L;
    layer_init(&L, H, I, E, K, 0, 0, 1, MOE_DTYPE_F32, 5);
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    uint16_t *xb = malloc(2 * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 6, -1, 1);
    for (int64_t i = 0; i < T * H; i++) {
        xb[i] = moe_f32_to_bf16(x[i]);
        x[i] = moe_bf16_to_f32(xb[i]);
    }
    moe_ctx *ctx = make_ctx(NULL, 1, 0);
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.desc, &plan), MOE_OK);
    assert_int_equal(moe_weights_create(plan, &L.src, &w), MOE_OK);
    size_t wsz = moe_plan_workspace_size(plan, T);
    void *ws = malloc(wsz);
    float out_f[40 * 11], out_b[40 * 11];
    assert_int_equal(moe_plan_execute(plan, w, x, T, out_f, ws, wsz), MOE_OK);
    moe_exec_args a = {.hidden_states = xb, .hidden_dtype = MOE_DTYPE_BF16, .n_tokens = T, .output = out_b,
                       .workspace = ws, .workspace_size = wsz};
    assert_int_equal(moe_plan_execute_ex(plan, w, &a), MOE_OK);
    assert_memory_equal(out_f, out_b, sizeof out_f);
    /* a workspace one byte short is refused, naming the function */
    assert_int_equal(moe_plan_execute(plan, w, x, T, out_f, ws, wsz - 1), MOE_EWORKSPACE);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "workspace"));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
    free(x);
    free(xb);
    layer_free(&L);
}

/* Compute bf16: the same classes (odd H and I: a pair padded with +0; every weight dtype,
 * shared experts, the few-token and tiled paths, chunks), against the bf16 oracle. */
static void test_bf16_compute(void **state)
{
    (void)state;
    g_compute = MOE_COMPUTE_BF16;
    const int64_t Ts[] = {1, 2, 7, 33, 129};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        check_case(40, 24, 8, 2, 0, 0, 1, MOE_DTYPE_BF16, Ts[i], 2000 + i);
    check_case(33, 17, 3, 3, 0, 0, 0, MOE_DTYPE_F32, 9, 2012);
    check_case(32, 16, 60, 4, 0, 0, 0, MOE_DTYPE_F16, 21, 2014);
    check_case(16, 80, 5, 5, 0, 0, 1, MOE_DTYPE_BF16, 7, 2017);
    const moe_dtype dts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F16};
    for (size_t i = 0; i < 3; i++) {
        check_case(64, 32, 8, 4, 40, 1, 0, dts[i], 19, 2020 + i);
        check_case(35, 19, 4, 2, 21, 0, 1, dts[i], 6, 2030 + i);
    }
    g_compute = MOE_COMPUTE_F32;
}

/* Compute bf16: batch invariance as above. */
static void test_bf16_batch_invariance(void **state)
{
    g_compute = MOE_COMPUTE_BF16;
    test_batch_invariance(state);
    g_compute = MOE_COMPUTE_F32;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_counts),     cmocka_unit_test(test_expert_counts),
        cmocka_unit_test(test_bf16_compute),     cmocka_unit_test(test_bf16_batch_invariance),
        cmocka_unit_test(test_shared_and_dtypes), cmocka_unit_test(test_rows_per_expert),
        cmocka_unit_test(test_batch_invariance), cmocka_unit_test(test_bf16_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
