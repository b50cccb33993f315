/* REGRESSIONS.md R1: flat indices past 2^31. T * K * H = 262144 * 8 * 1024 = 2^31 elements
 * of routed activations (and T * H = 2^28 of output), with a small layer so the test stays
 * cheap (~2.6 GB, seconds). Tokens at the start, the middle and the very end of the batch must
 * have exactly the bits they have alone, and those must equal src/ref's. Label "slow". */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "ref/ref.h"
#include "testutil.h"

enum { H = 1024, I = 16, E = 8, K = 8 };
#define T_BIG ((int64_t)262144)

static void test_large_index(void **state)
{
    (void)state;
    assert_true(T_BIG * K * H >= ((int64_t)1 << 31));
    static float router[E * H], g[E][I * H], u[E][I * H], dn[E][H * I];
    const void *gp[E], *up[E], *dp[E];
    tu_fill_uniform(router, E * H, 1, -0.05f, 0.05f);
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(g[e], I * H, 10 + (uint64_t)e, -0.03f, 0.03f);
        tu_fill_uniform(u[e], I * H, 20 + (uint64_t)e, -0.03f, 0.03f);
        tu_fill_uniform(dn[e], H * I, 30 + (uint64_t)e, -0.25f, 0.25f);
        gp[e] = g[e];
        up[e] = u[e];
        dp[e] = dn[e];
    }
    moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = gp,
                             .up_proj = up, .down_proj = dp};
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = H;
    d.moe_intermediate_size = I;
    d.num_experts = E;
    d.top_k = K;
    d.renormalize = 1;
    d.weight_dtype = MOE_DTYPE_F32;

    moe_options o;
    moe_options_init(&o);
    o.num_threads = 2;
    o.chunk_size = 16384; /* 16 chunks; row ids per chunk 16384 * 8 = 2^17; workspace ~0.6 GB */
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
    assert_int_equal(moe_weights_create(plan, &src, &w), MOE_OK);

    const size_t n = (size_t)T_BIG * H;
    float *x = malloc(n * sizeof(float));   /* [T, H] 1 GiB */
    float *out = malloc(n * sizeof(float)); /* [T, H] 1 GiB */
    int32_t *ids = malloc((size_t)T_BIG * K * sizeof(int32_t));
    assert_non_null(x);
    assert_non_null(out);
    assert_non_null(ids);
    tu_fill_uniform(x, n, 77, -1, 1);
    size_t wsz = moe_plan_workspace_size(plan, T_BIG);
    void *ws = malloc(wsz);
    assert_non_null(ws);
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T_BIG, .output = out,
                       .topk_ids = ids, .workspace = ws, .workspace_size = wsz};
    assert_int_equal(moe_plan_execute_ex(plan, w, &a), MOE_OK);

    const int64_t probes[] = {0, 1, T_BIG / 2, T_BIG - 16385, T_BIG - 2, T_BIG - 1};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        const int64_t t = probes[i];
        float alone[H], ref[H];
        int32_t rid[K];
        assert_int_equal(moe_plan_execute(plan, w, x + (size_t)t * H, 1, alone, ws, wsz), MOE_OK);
        assert_int_equal(moe_ref_forward(&d, &src, x + (size_t)t * H, 1, NULL, ref, rid, NULL), MOE_OK);
        if (memcmp(alone, out + (size_t)t * H, sizeof alone) != 0)
            fail_msg("token %lld differs alone and in the batch of %lld", (long long)t, (long long)T_BIG);
        assert_memory_equal(alone, ref, sizeof ref);
        assert_memory_equal(rid, ids + (size_t)t * K, sizeof rid);
    }
    free(ws);
    free(x);
    free(out);
    free(ids);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_large_index)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
