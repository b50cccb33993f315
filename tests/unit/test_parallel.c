/* The parallel API in one process (MPI or not): defaults, validation, the one-process expert
 * map and row range, the low-latency switch, the refusal of parallel configurations without
 * MPI (naming MOE_WITH_MPI) or before MPI_Init, and the float8 e4m3 conversion of the
 * low-precision dispatch. The MPI behaviour itself is tests/mpi (label mpi). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "quant/convert.h"
#include "ref/ref.h"
#include "testutil.h"

enum { H = 24, I = 20, E = 6, K = 2, T = 23 };

static float router[E * H], wg[E][I * H], wu[E][I * H], wd[E][H * I];
static const void *gp[E], *up[E], *dp[E];
static moe_layer_desc D;
static moe_weight_source SRC;

static int setup(void **state)
{
    (void)state;
    moe_layer_desc_init(&D);
    D.hidden_size = H;
    D.moe_intermediate_size = I;
    D.num_experts = E;
    D.top_k = K;
    D.renormalize = 1;
    D.weight_dtype = MOE_DTYPE_F32;
    tu_fill_uniform(router, E * H, 1, -1, 1);
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(wg[e], I * H, 10 + (uint64_t)e, -0.3f, 0.3f);
        tu_fill_uniform(wu[e], I * H, 20 + (uint64_t)e, -0.3f, 0.3f);
        tu_fill_uniform(wd[e], H * I, 30 + (uint64_t)e, -0.3f, 0.3f);
        gp[e] = wg[e];
        up[e] = wu[e];
        dp[e] = wd[e];
    }
    SRC = (moe_weight_source){.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = gp, .up_proj = up,
                              .down_proj = dp};
    return 0;
}

static void test_status_and_defaults(void **state)
{
    (void)state;
    assert_string_equal(moe_status_name(MOE_ETIMEOUT), "MOE_ETIMEOUT");
    assert_string_equal(moe_status_name(MOE_EMPI), "MOE_EMPI");
    assert_int_equal(MOE_ETIMEOUT, 12);
    assert_int_equal(MOE_EMPI, 13);
    moe_plan_config c;
    moe_plan_config_init(&c);
    assert_int_equal(c.parallel.ep_size, 1);
    assert_int_equal(c.parallel.tp_size, 1);
    assert_int_equal(c.parallel.dp_size, 1);
    assert_int_equal(c.parallel.ep_rank, 0);
    assert_null(c.parallel.comm);
    assert_int_equal(c.parallel.low_latency, 0);
    assert_int_equal(c.parallel.dispatch_dtype, MOE_DTYPE_F32);
    assert_true(c.parallel.timeout_s > 0);
    assert_true(moe_mpi_available() == 0 || moe_mpi_available() == 1);
}

/* One process: the identity map, every row, sizes 1, and the text names the sizes. */
static void test_one_process(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &D, &p), MOE_OK);
    int32_t map[E];
    assert_int_equal(moe_plan_expert_map(p, map), MOE_OK);
    for (int e = 0; e < E; e++)
        assert_int_equal(map[e], e);
    assert_int_equal(moe_plan_expert_map(p, NULL), MOE_EINVAL);
    int64_t b = -1, en = -1;
    moe_plan_tp_rows(p, 17, &b, &en);
    assert_int_equal(b, 0);
    assert_int_equal(en, 17);
    const moe_parallel_config *pc = moe_plan_parallel(p);
    assert_int_equal(pc->ep_size, 1);
    assert_int_equal(pc->tp_size, 1);
    assert_non_null(strstr(moe_plan_text(p), "ep_size=1;tp_size=1;dispatch_dtype=F32;"));
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p, &SRC, &w), MOE_OK);
    assert_int_equal(moe_weights_expert_bytes(w), (size_t)E * 3 * H * I * 4);
    float x[T * H], out[T * H];
    tu_fill_uniform(x, T * H, 5, -1, 1);
    size_t wsz = moe_plan_workspace_size(p, T);
    void *ws = malloc(wsz);
    moe_exec_stats st;
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = out,
                       .workspace = ws, .workspace_size = wsz, .stats = &st};
    assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_OK);
    assert_true(st.dispatch_seconds == 0 && st.combine_bytes == 0 && st.received_rows == 0);
    assert_int_equal(st.max_tokens, T);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

/* low_latency = 1 picks the batched format in one process: same bits as the default. */
static void test_low_latency_one_process(void **state)
{
    (void)state;
    float x[T * H], ref[T * H], out[T * H];
    tu_fill_uniform(x, T * H, 6, -1, 1);
    assert_int_equal(moe_ref_forward(&D, &SRC, x, T, NULL, ref, NULL, NULL), MOE_OK);
    moe_ctx *ctx = tu_ctx();
    moe_plan_config c;
    moe_plan_config_init(&c);
    c.parallel.low_latency = 1;
    c.batched_capacity = 5;
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create_ex(ctx, &D, &c, &p), MOE_OK);
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p, &SRC, &w), MOE_OK);
    size_t wsz = moe_plan_workspace_size(p, T);
    void *ws = malloc(wsz);
    moe_exec_stats st;
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = out,
                       .workspace = ws, .workspace_size = wsz, .stats = &st};
    assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_OK);
    assert_string_equal(st.prepare_finalize, "local_batched");
    assert_string_equal(st.experts, "batched");
    assert_int_equal(st.chunk_tokens, 5);
    assert_memory_equal(out, ref, sizeof out);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

static void expect_fail(const moe_plan_config *c, moe_status want, const char *needle)
{
    moe_ctx *ctx = tu_ctx();
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create_ex(ctx, &D, c, &p), want);
    assert_null(p);
    if (!strstr(moe_ctx_last_error(ctx), needle))
        fail_msg("message lacks '%s': %s", needle, moe_ctx_last_error(ctx));
    moe_ctx_free(ctx);
}

static void test_validation(void **state)
{
    (void)state;
    moe_plan_config c;
    moe_plan_config_init(&c);
    c.parallel.ep_size = 0;
    expect_fail(&c, MOE_EINVAL, "parallel.ep_size = 0");
    c.parallel.ep_size = E + 1;
    expect_fail(&c, MOE_EINVAL, "parallel.ep_size = 7");
    moe_plan_config_init(&c);
    c.parallel.tp_size = I + 1;
    expect_fail(&c, MOE_EINVAL, "parallel.tp_size = 21");
    moe_plan_config_init(&c);
    c.parallel.timeout_s = 0;
    expect_fail(&c, MOE_EINVAL, "timeout_s");
    moe_plan_config_init(&c);
    c.parallel.low_latency = 2;
    expect_fail(&c, MOE_EINVAL, "low_latency");
    moe_plan_config_init(&c);
    c.parallel.dispatch_dtype = MOE_DTYPE_BF16;
    expect_fail(&c, MOE_EINVAL, "dispatch_dtype = BF16");
    c.parallel.dispatch_dtype = MOE_DTYPE_I8;
    expect_fail(&c, MOE_EINVAL, "needs ep_size > 1");
    moe_plan_config_init(&c);
    c.parallel.ep_rank = 1;
    expect_fail(&c, MOE_EINVAL, "ep_rank = 1");
    moe_plan_config_init(&c);
    c.parallel.dp_size = 2;
    c.parallel.dp_rank = 2;
    expect_fail(&c, MOE_EINVAL, "dp_rank");
    moe_plan_config_init(&c);
    c.prepare_finalize = MOE_PF_EP_BATCHED;
    c.experts = MOE_EXPERTS_BATCHED;
    expect_fail(&c, MOE_EINVAL, "needs parallel.ep_size > 1");
}

/* A parallel configuration: refused without MPI (naming the CMake option), or, with MPI, when
 * MPI is not initialized (this test never calls MPI_Init). */
static void test_parallel_needs_mpi(void **state)
{
    (void)state;
    moe_plan_config c;
    moe_plan_config_init(&c);
    c.parallel.ep_size = 2;
    if (moe_mpi_available())
        expect_fail(&c, MOE_EINVAL, "MPI_Init");
    else
        expect_fail(&c, MOE_EUNSUPPORTED, "MOE_WITH_MPI");
    moe_plan_config_init(&c);
    c.parallel.tp_size = 2;
    if (moe_mpi_available())
        expect_fail(&c, MOE_EINVAL, "not initialized");
    else
        expect_fail(&c, MOE_EUNSUPPORTED, "MOE_WITH_MPI");
}

/* float8 e4m3fn: every code round-trips, ties go to even, out of range saturates, NaN stays. */
static void test_e4m3(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        float v = moe_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            continue;
        }
        assert_int_equal(moe_f32_to_e4m3(v), c);
    }
    assert_true(moe_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(moe_e4m3_to_f32(0x01) == 0.001953125f); /* 2^-9 */
    assert_true(moe_e4m3_to_f32(0x08) == 0.015625f);    /* 2^-6 */
    assert_int_equal(moe_f32_to_e4m3(1000.0f), 0x7e);
    assert_int_equal(moe_f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(moe_f32_to_e4m3(NAN) & 0x7f, 0x7f);
    /* ties to even: 1 + 1/16 lies between 1 (mantissa 0) and 1.125 (mantissa 1) */
    assert_int_equal(moe_f32_to_e4m3(1.0625f), 0x38);
    assert_int_equal(moe_f32_to_e4m3(1.1875f), 0x3a); /* between 1.125 and 1.25: to 1.25 (even) */
    assert_int_equal(moe_f32_to_e4m3(0.0009765625f), 0x00); /* 2^-10: tie between 0 and 2^-9 */
    assert_int_equal(moe_f32_to_e4m3(0.0029296875f), 0x02); /* 1.5 * 2^-9: tie, to 2 * 2^-9 */
    /* every f32 rounds to a nearest code */
    for (int i = 0; i < 100000; i++) {
        float v = (float)(i - 50000) * 0.009f;
        float q = moe_e4m3_to_f32(moe_f32_to_e4m3(v));
        float a = fabsf(v);
        if (a >= 448.0f) {
            assert_true(fabsf(q) == 448.0f);
            continue;
        }
        /* relative error at most 2^-4 for normals, absolute 2^-10 for subnormals */
        assert_true(fabsf(q - v) <= fmaxf(a * 0.0625f, 0.0009765625f));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_and_defaults), cmocka_unit_test(test_one_process),
        cmocka_unit_test(test_low_latency_one_process), cmocka_unit_test(test_validation),
        cmocka_unit_test(test_parallel_needs_mpi), cmocka_unit_test(test_e4m3),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
