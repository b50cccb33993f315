/* Routing: hand-checked small cases, REGRESSIONS.md R6 (NaN/Inf), R7 (ties), R8 (renormalize,
 * scaling once), for the production path (through the public API) and for src/ref. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "ref/ref.h"
#include "testutil.h"

enum { H = 8, I = 4, MAXE = 16, MAXK = 8 };

/* A tiny f32 layer with E experts whose weights are small deterministic values. */
typedef struct tiny {
    moe_layer_desc d;
    float router[MAXE * H];
    float g[MAXE][I * H], u[MAXE][I * H], dn[MAXE][H * I];
    const void *gp[MAXE], *up[MAXE], *dp[MAXE];
    moe_weight_source src;
} tiny;

static void tiny_init(tiny *t, int64_t E, int64_t K, int renorm)
{
    memset(t, 0, sizeof *t);
    moe_layer_desc_init(&t->d);
    t->d.hidden_size = H;
    t->d.moe_intermediate_size = I;
    t->d.num_experts = E;
    t->d.top_k = K;
    t->d.renormalize = renorm;
    t->d.weight_dtype = MOE_DTYPE_F32;
    tu_fill_uniform(t->router, (size_t)(E * H), 3, -1, 1);
    for (int64_t e = 0; e < E; e++) {
        tu_fill_uniform(t->g[e], I * H, 10 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(t->u[e], I * H, 50 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(t->dn[e], H * I, 90 + (uint64_t)e, -0.5f, 0.5f);
        t->gp[e] = t->g[e];
        t->up[e] = t->u[e];
        t->dp[e] = t->dn[e];
    }
    t->src.router = t->router;
    t->src.router_dtype = MOE_DTYPE_F32;
    t->src.gate_proj = t->gp;
    t->src.up_proj = t->up;
    t->src.down_proj = t->dp;
}

/* Route one row of logits through the public API (caller-supplied router_logits) and through
 * src/ref; assert both agree exactly; return ids/weights of the API path. */
static void route_row(tiny *t, const float *logits, int32_t *ids, float *w, float *out)
{
    moe_ctx *ctx = tu_ctx();
    moe_plan *plan = NULL;
    moe_weights *wt = NULL;
    assert_int_equal(moe_plan_create(ctx, &t->d, &plan), MOE_OK);
    assert_int_equal(moe_weights_create(plan, &t->src, &wt), MOE_OK);
    float x[H];
    tu_fill_uniform(x, H, 7, -1, 1);
    size_t wsz = moe_plan_workspace_size(plan, 1);
    void *ws = malloc(wsz);
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = 1,
                       .router_logits = logits, .output = out, .topk_ids = ids, .topk_weights = w,
                       .workspace = ws, .workspace_size = wsz};
    assert_int_equal(moe_plan_execute_ex(plan, wt, &a), MOE_OK);

    int32_t rid[MAXK];
    float rw[MAXK], rout[H];
    assert_int_equal(moe_ref_forward(&t->d, &t->src, x, 1, logits, rout, rid, rw), MOE_OK);
    assert_memory_equal(rid, ids, sizeof(int32_t) * (size_t)t->d.top_k);
    assert_memory_equal(rw, w, sizeof(float) * (size_t)t->d.top_k); /* NaN bits included */
    assert_memory_equal(rout, out, sizeof rout);
    free(ws);
    moe_weights_free(wt);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
}

static void assert_ids_valid(const int32_t *ids, int64_t K, int64_t E)
{
    for (int64_t i = 0; i < K; i++) {
        assert_in_range(ids[i], 0, E - 1);
        for (int64_t j = 0; j < i; j++)
            assert_int_not_equal(ids[i], ids[j]);
    }
}

/* Softmax of [1,2,3,4], top-2: by hand p = e^(l-4) / sum = 0.6439142598, 0.2368828180;
 * renormalized they are sigmoid(1) = 0.7310585786 and 1 - sigmoid(1) = 0.2689414214. */
static void test_hand_checked(void **state)
{
    (void)state;
    tiny t;
    float logits[4] = {1, 2, 3, 4};
    int32_t ids[2];
    float w[2], out[H];
    tiny_init(&t, 4, 2, 0);
    route_row(&t, logits, ids, w, out);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 2);
    assert_float_equal(w[0], 0.6439142598f, 1e-6);
    assert_float_equal(w[1], 0.2368828180f, 1e-6);
    tiny_init(&t, 4, 2, 1);
    route_row(&t, logits, ids, w, out);
    assert_float_equal(w[0], 0.7310585786f, 1e-6);
    assert_float_equal(w[1], 0.2689414214f, 1e-6);

    /* the combine by hand: out = w0 * y(expert 3) + w1 * y(expert 2), y from src/ref */
    float x[H], y3[H], y2[H], hbuf[I];
    tu_fill_uniform(x, H, 7, -1, 1);
    moe_ref_expert(t.g[3], t.u[3], t.dn[3], MOE_DTYPE_F32, H, I, x, y3, hbuf);
    moe_ref_expert(t.g[2], t.u[2], t.dn[2], MOE_DTYPE_F32, H, I, x, y2, hbuf);
    for (int h = 0; h < H; h++)
        assert_float_equal(out[h], 0.7310585786 * y3[h] + 0.2689414214 * y2[h], 1e-6);

    /* one expert by hand: H = 8, I = 4 is small enough to recompute in double here */
    for (int o = 0; o < H; o++) {
        double acc = 0;
        for (int i = 0; i < I; i++) {
            double g = 0, u = 0;
            for (int k = 0; k < H; k++) {
                g += (double)x[k] * t.g[3][i * H + k];
                u += (double)x[k] * t.u[3][i * H + k];
            }
            acc += (g / (1 + exp(-g))) * u * t.dn[3][o * I + i];
        }
        assert_float_equal(y3[o], acc, 1e-6);
    }
}

/* R7: an all-equal row picks 0..K-1; a tie at the K-th boundary picks the lower id. */
static void test_ties(void **state)
{
    (void)state;
    tiny t;
    int32_t ids[MAXK];
    float w[MAXK], out[H];
    float eq[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    tiny_init(&t, 6, 4, 1);
    route_row(&t, eq, ids, w, out);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(ids[k], k);
        assert_float_equal(w[k], 0.25f, 1e-7);
    }
    float boundary[5] = {5, 1, 3, 3, 0};
    tiny_init(&t, 5, 2, 0);
    route_row(&t, boundary, ids, w, out);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 2);
}

/* R6: NaN ranks below every number, +Inf takes the mass, all -Inf is the all-equal limit. */
static void test_nan_inf(void **state)
{
    (void)state;
    tiny t;
    int32_t ids[MAXK];
    float w[MAXK], out[H];

    float some_nan[5] = {NAN, 1, NAN, 2, 0};
    tiny_init(&t, 5, 3, 1);
    route_row(&t, some_nan, ids, w, out);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 4);
    for (int k = 0; k < 3; k++)
        assert_true(isfinite(w[k]));
    for (int h = 0; h < H; h++)
        assert_true(isfinite(out[h]));

    /* more experts asked than numbers: the NaN experts come last, lower id first */
    tiny_init(&t, 5, 5, 0);
    route_row(&t, some_nan, ids, w, out);
    const int32_t want[5] = {3, 1, 4, 0, 2};
    assert_memory_equal(ids, want, sizeof want);
    assert_true(isnan(w[3]) && isnan(w[4]));

    float all_nan[5] = {NAN, NAN, NAN, NAN, NAN};
    tiny_init(&t, 5, 3, 1);
    route_row(&t, all_nan, ids, w, out);
    for (int k = 0; k < 3; k++)
        assert_int_equal(ids[k], k);
    assert_ids_valid(ids, 3, 5);

    float pinf[4] = {1, INFINITY, 0, INFINITY};
    tiny_init(&t, 4, 3, 0);
    route_row(&t, pinf, ids, w, out);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 0);
    assert_float_equal(w[0], 0.5f, 0);
    assert_float_equal(w[1], 0.5f, 0);
    assert_float_equal(w[2], 0.0f, 0);

    float ninf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    tiny_init(&t, 4, 2, 0);
    route_row(&t, ninf, ids, w, out);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    assert_float_equal(w[0], 0.25f, 0);

    /* -Inf next to numbers is just probability 0 */
    float mixed[4] = {-INFINITY, 0, -INFINITY, 0};
    route_row(&t, mixed, ids, w, out);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_float_equal(w[0], 0.5f, 0);
}

/* MOE_SCORING_SQRTSOFTPLUS (DeepSeek-V4's DeepseekV4TopKRouter): s = sqrt(softplus(l)) against
 * its double definition sqrt(log(1 + e^l)) within 2 ulp over l in [-80, 100] (below about -87
 * softplus(l) ~ e^l is an f32 denormal and keeps fewer bits, as torch's f32 softplus does) and at the
 * extremes (no overflow for large l, where s = sqrt(l); the tiny values kept for very negative
 * l); selection on s + the correction bias, weights the unbiased s renormalized (+ 1e-20), with
 * and without groups; NaN ranked last, +-inf; the production path and src/ref bit for bit
 * (route_row) */
static void test_sqrtsoftplus(void **state)
{
    (void)state;
    double worst = 0.0;
    for (int i = 0; i <= 18000; i++) {
        const float l = -80.0f + 0.01f * (float)i;
        const double want = sqrt(log1p(exp((double)l)));
        const float got = moe_ref_sqrtsoftplus(l);
        const double ulp = nextafterf((float)want, INFINITY) - (float)want;
        const double e = fabs((double)got - want) / ulp;
        worst = e > worst ? e : worst;
    }
    print_message("sqrtsoftplus: worst %.2f ulp against the double definition\n", worst);
    assert_true(worst <= 2.0);
    assert_true(moe_ref_sqrtsoftplus(1e30f) == sqrtf(1e30f));    /* no exp overflow */
    assert_true(moe_ref_sqrtsoftplus(-80.0f) > 0.0f);            /* e^-40, not 0 */
    assert_true(moe_ref_sqrtsoftplus(INFINITY) == INFINITY);
    assert_true(moe_ref_sqrtsoftplus(-INFINITY) == 0.0f && !signbit(moe_ref_sqrtsoftplus(-INFINITY)));
    assert_true(isnan(moe_ref_sqrtsoftplus(NAN)));
    assert_true(moe_ref_sqrtsoftplus(0.0f) == sqrtf(logf(2.0f)) ||
                fabsf(moe_ref_sqrtsoftplus(0.0f) - 0.8325546f) <= 1e-7f);

    tiny t;
    int32_t ids[MAXK];
    float w[MAXK], out[H];
    /* by hand: l = [0, 2, -1, 1, 3, -2], no bias, top-3 = 4, 1, 3, weights s / sum */
    float l6[6] = {0, 2, -1, 1, 3, -2};
    tiny_init(&t, 6, 3, 1);
    t.d.scoring_func = MOE_SCORING_SQRTSOFTPLUS;
    route_row(&t, l6, ids, w, out);
    assert_int_equal(ids[0], 4);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 3);
    double s[3] = {sqrt(log1p(exp(3.0))), sqrt(log1p(exp(2.0))), sqrt(log1p(exp(1.0)))};
    for (int k = 0; k < 3; k++)
        assert_true(fabs(w[k] - s[k] / (s[0] + s[1] + s[2])) <= 2e-7);

    /* a correction bias moves the choice, not the weights: expert 5 (l = -2) gets +2 */
    float bias[6] = {0, 0, 0, 0, 0, 2.0f};
    t.d.has_selection_bias = 1;
    t.src.selection_bias = bias;
    t.src.selection_bias_dtype = MOE_DTYPE_F32;
    t.d.renormalize = 0;
    route_row(&t, l6, ids, w, out);
    assert_int_equal(ids[0], 5); /* sqrtsoftplus(-2) + 2 = 2.357 > 1.84 (l = 3) */
    assert_true(fabs(w[0] - sqrt(log1p(exp(-2.0)))) <= 1e-7);

    /* groups (2 of 3, keep 1, top-2 sum) on the biased keys: the group of 5 wins */
    t.d.n_group = 2;
    t.d.topk_group = 1;
    t.d.group_score = MOE_GROUP_SCORE_TOP2_SUM;
    t.d.renormalize = 1;
    t.d.top_k = 2;
    route_row(&t, l6, ids, w, out);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 4); /* group 1 (3, 4, 5) kept: 2.357 + 1.840 > group 0's 1.404 + 0.833 */
    assert_true(fabsf(w[0] + w[1] - 1.0f) <= 1e-7f);

    /* NaN last, +inf first (its score +inf, not renormalized here), -inf scores +0 */
    float odd[5] = {NAN, -INFINITY, 1.0f, INFINITY, 0.0f};
    tiny_init(&t, 5, 4, 0);
    t.d.scoring_func = MOE_SCORING_SQRTSOFTPLUS;
    route_row(&t, odd, ids, w, out);
    const int32_t want[4] = {3, 2, 4, 1};
    assert_memory_equal(ids, want, sizeof want);
    assert_true(w[0] == INFINITY && w[3] == 0.0f);
    float some_nan[4] = {NAN, 1.0f, NAN, -3.0f};
    tiny_init(&t, 4, 2, 1);
    t.d.scoring_func = MOE_SCORING_SQRTSOFTPLUS;
    route_row(&t, some_nan, ids, w, out);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_true(isfinite(w[0]) && isfinite(w[1]));
}

/* R6 on hidden states: NaN / Inf inputs give distinct in-range ids, and only that token's
 * output is affected. */
static void test_nan_hidden_states(void **state)
{
    (void)state;
    tiny t;
    tiny_init(&t, 8, 3, 1);
    moe_ctx *ctx = tu_ctx();
    moe_plan *plan = NULL;
    moe_weights *wt = NULL;
    assert_int_equal(moe_plan_create(ctx, &t.d, &plan), MOE_OK);
    assert_int_equal(moe_weights_create(plan, &t.src, &wt), MOE_OK);
    float x[3 * H];
    tu_fill_uniform(x, 3 * H, 9, -1, 1);
    x[H + 2] = NAN;
    x[2 * H + 5] = INFINITY;
    float out[3 * H], w[9];
    int32_t ids[9];
    size_t wsz = moe_plan_workspace_size(plan, 3);
    void *ws = malloc(wsz);
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = 3, .output = out,
                       .topk_ids = ids, .topk_weights = w, .workspace = ws, .workspace_size = wsz};
    assert_int_equal(moe_plan_execute_ex(plan, wt, &a), MOE_OK);
    for (int t3 = 0; t3 < 3; t3++)
        assert_ids_valid(ids + 3 * t3, 3, 8);
    for (int h = 0; h < H; h++)
        assert_true(isfinite(out[h])); /* token 0 untouched by its neighbours */
    float alone[H];
    assert_int_equal(moe_plan_execute(plan, wt, x, 1, alone, ws, wsz), MOE_OK);
    assert_memory_equal(alone, out, sizeof alone);
    free(ws);
    moe_weights_free(wt);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
}

/* Contract 3: adding a constant to every logit changes neither ids nor (beyond rounding) weights. */
static void test_shift_invariance(void **state)
{
    (void)state;
    tiny t;
    tiny_init(&t, 16, 4, 0);
    float l[16], l2[16];
    tu_fill_uniform(l, 16, 21, -3, 3);
    for (int e = 0; e < 16; e++)
        l2[e] = l[e] + 100.0f;
    int32_t a[MAXK], b[MAXK];
    float wa[MAXK], wb[MAXK], out[H];
    route_row(&t, l, a, wa, out);
    route_row(&t, l2, b, wb, out);
    assert_memory_equal(a, b, 4 * sizeof(int32_t));
    for (int k = 0; k < 4; k++)
        assert_float_equal(wa[k], wb[k], 1e-5 * wa[0]);
}

/* R8: routed_scaling_factor is applied exactly once: out(s) == s * out(1) up to one rounding. */
static void test_scaling_once(void **state)
{
    (void)state;
    tiny t;
    tiny_init(&t, 8, 2, 1);
    float l[8];
    tu_fill_uniform(l, 8, 4, -1, 1);
    int32_t ids[2];
    float w[2], out1[H], out25[H];
    route_row(&t, l, ids, w, out1);
    t.d.routed_scaling_factor = 2.5f;
    float w25[2];
    route_row(&t, l, ids, w25, out25);
    assert_memory_equal(w, w25, sizeof w); /* topk_weights are reported before scaling */
    for (int h = 0; h < H; h++)
        assert_float_equal(out25[h], 2.5f * out1[h], 1e-6 * fabsf(out1[h]) + 1e-12);
}

/* Plan validation names the field at fault. */
static void test_plan_validation(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_plan *p = NULL;
    moe_layer_desc_init(&d);
    d.hidden_size = 8;
    d.moe_intermediate_size = 4;
    d.num_experts = 4;
    d.top_k = 5;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "top_k"));
    assert_null(p);
    d.top_k = 2;
    d.hidden_size = 0;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "hidden_size"));
    d.hidden_size = 8;
    d.weight_dtype = MOE_DTYPE_I32;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EDTYPE);
    d.weight_dtype = MOE_DTYPE_F32;
    d.scoring_func = (moe_scoring)7;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "scoring_func"));
    d.scoring_func = MOE_SCORING_SOFTMAX;
    d.routed_scaling_factor = NAN;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "routed_scaling_factor"));
    d.routed_scaling_factor = 1.0f;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    /* missing weights are named, and the output is not touched */
    float sentinel = 42.0f;
    assert_int_equal(moe_plan_execute(p, NULL, NULL, 0, &sentinel, NULL, 0), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "weights"));
    assert_true(sentinel == 42.0f);
    moe_plan_free(p);
    moe_plan_free(NULL);
    moe_weights_free(NULL);
    moe_ctx_free(ctx);
    moe_ctx_free(NULL);
}

/* Bad option values are refused with the variable named; version is consistent. */
static void test_ctx_options(void **state)
{
    (void)state;
    char err[512];
    moe_ctx *ctx = NULL;
    setenv("MOE_ISA", "fast", 1);
    assert_int_equal(moe_ctx_create(NULL, &ctx, err, sizeof err), MOE_EINVAL);
    assert_non_null(strstr(err, "MOE_ISA"));
    assert_non_null(strstr(err, "avx512"));
    assert_null(ctx);
    unsetenv("MOE_ISA");
    setenv("MOE_NUM_THREADS", "0", 1);
    assert_int_equal(moe_ctx_create(NULL, &ctx, err, sizeof err), MOE_EINVAL);
    assert_non_null(strstr(err, "MOE_NUM_THREADS"));
    unsetenv("MOE_NUM_THREADS");
    setenv("MOE_CHUNK_SIZE", "12x", 1);
    assert_int_equal(moe_ctx_create(NULL, &ctx, err, sizeof err), MOE_EINVAL);
    assert_non_null(strstr(err, "MOE_CHUNK_SIZE"));
    unsetenv("MOE_CHUNK_SIZE");
    assert_int_equal(moe_ctx_create(NULL, &ctx, err, sizeof err), MOE_OK);
    assert_string_equal(moe_ctx_last_error(ctx), "");
    moe_ctx_free(ctx);
    assert_int_equal(moe_version_number(), MOE_VERSION_NUMBER);
    assert_string_equal(moe_status_name(MOE_EDENSE), "MOE_EDENSE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_checked),     cmocka_unit_test(test_ties),
        cmocka_unit_test(test_nan_inf),          cmocka_unit_test(test_nan_hidden_states),
        cmocka_unit_test(test_sqrtsoftplus),
        cmocka_unit_test(test_shift_invariance), cmocka_unit_test(test_scaling_once),
        cmocka_unit_test(test_plan_validation),  cmocka_unit_test(test_ctx_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
