/* The activations' exp (core/act.h moe_expf) against correctly rounded exp (double exp,
 * rounded once to f32), and every table's act_row against the scalar form, bit for bit
 * (NaN, infinities, signed zeros, subnormal results, gpt-oss clamps, biases, tails). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/act.h"
#include "gemm/kernels.h"
#include "testutil.h"

static float bits_f(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t f_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* |got - exact| in units of the last place of the f32 nearest to `exact` (subnormal results:
 * units of 2^-149). */
static double ulp_err(float got, double exact)
{
    const float near = (float)exact;
    if (isinf(near)) /* the exact value rounds to infinity: so must the result */
        return got == near ? 0.0 : INFINITY;
    int ex;
    frexpf(near == 0.0f ? 0x1p-149f : near, &ex); /* near = m 2^ex, m in [0.5, 1) */
    double ulp = ldexp(1.0, ex - 24);
    if (ulp < 0x1p-149)
        ulp = 0x1p-149;
    return fabs((double)got - exact) / ulp;
}

static void test_expf_accuracy(void **state)
{
    (void)state;
    double worst = 0.0;
    float worst_x = 0.0f;
    long n = 0;
    /* every 97th bit pattern of [+0, 89] and [-0, -105]: about 23 million arguments */
    const uint32_t hi_pos = f_bits(MOE_EXPF_HI), hi_neg = f_bits(MOE_EXPF_LO);
    for (int side = 0; side < 2; side++) {
        const uint32_t b0 = side ? 0x80000000u : 0u, b1 = side ? hi_neg : hi_pos;
        for (uint32_t b = b0; b <= b1; b += 97) {
            const float x = bits_f(b);
            const double e = ulp_err(moe_expf(x), exp((double)x));
            if (e > worst) {
                worst = e;
                worst_x = x;
            }
            n++;
        }
    }
    print_message("moe_expf: %ld arguments, worst error %.3f ulp at x = %a\n", n, worst, (double)worst_x);
    assert_true(worst <= MOE_EXPF_MAX_ULP);
}

static void test_expf_special(void **state)
{
    (void)state;
    assert_true(isnan(moe_expf(NAN)));
    assert_true(moe_expf(INFINITY) == INFINITY);
    assert_true(moe_expf(-INFINITY) == 0.0f && !signbit(moe_expf(-INFINITY)));
    assert_true(moe_expf(0.0f) == 1.0f && moe_expf(-0.0f) == 1.0f);
    assert_true(moe_expf(88.8f) == INFINITY && moe_expf(1e30f) == INFINITY);
    assert_true(moe_expf(-103.0f) == 0x1p-149f); /* e^-103 = 0.96 x 2^-149 */
    assert_true(moe_expf(-104.0f) == 0.0f);      /* e^-104 = 0.35 x 2^-149 */
    assert_true(moe_expf(-105.5f) == 0.0f && moe_expf(-1e30f) == 0.0f);
    /* the largest finite result and the first overflow */
    const float xmax = nextafterf((float)log((double)FLT_MAX), 0.0f);
    assert_true(isfinite(moe_expf(xmax)) && ulp_err(moe_expf(xmax), exp((double)xmax)) <= MOE_EXPF_MAX_ULP);
    assert_true(moe_expf(nextafterf(89.0f, 0.0f)) == INFINITY);
    /* near 0, where e^x is 1 + x */
    for (float x = 0x1p-30f; x < 1.0f; x *= 1.7f) {
        assert_true(ulp_err(moe_expf(x), exp((double)x)) <= MOE_EXPF_MAX_ULP);
        assert_true(ulp_err(moe_expf(-x), exp(-(double)x)) <= MOE_EXPF_MAX_ULP);
    }
}

enum { N = 203 }; /* not a multiple of 16: masked tails */

static void fill_inputs(float *g, float *u, float *bg, float *bu, unsigned seed)
{
    const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 7.0f, -7.0f,
                             7.0000005f, -7.0000005f, 88.0f, -88.0f, 100.0f, -100.0f, 150.0f, -150.0f,
                             3e38f, -3e38f, 0x1p-126f, 1.0f, -1.0f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    srand(seed);
    for (int j = 0; j < N; j++) {
        const float r1 = ((float)rand() / (float)RAND_MAX - 0.5f) * 40.0f;
        const float r2 = ((float)rand() / (float)RAND_MAX - 0.5f) * 40.0f;
        g[j] = j < ns ? special[j] : (j < 2 * ns ? r1 : r1 * 0.1f);
        u[j] = j >= ns && j < 2 * ns ? special[j - ns] : r2;
        bg[j] = ((float)rand() / (float)RAND_MAX - 0.5f);
        bu[j] = ((float)rand() / (float)RAND_MAX - 0.5f);
    }
}

static void check_table(const moe_kernels *k)
{
    const moe_activation acts[] = {MOE_ACT_SWIGLU, MOE_ACT_SWIGLU_OAI, MOE_ACT_GEGLU, MOE_ACT_GEGLU_TANH,
                                   MOE_ACT_SWIGLU_CLAMP, MOE_ACT_SWIGLU_SOFTCAP, MOE_ACT_SWIGLU_POSTCLAMP};
    float g[N], u[N], bg[N], bu[N], want[N], got[N];
    for (size_t a = 0; a < sizeof acts / sizeof acts[0]; a++) {
        for (int biased = 0; biased < 2; biased++) {
            for (int n = 1; n <= N; n += (n < 40 ? 1 : 37)) {
                moe_layer_desc d;
                moe_layer_desc_init(&d);
                d.activation = acts[a];
                d.swiglu_alpha = 1.702f;
                d.swiglu_limit = 7.0f;
                d.softcap_gate = 1.5f; /* small caps: the inputs (|v| up to 20, specials) saturate them */
                d.softcap_up = 2.5f;
                fill_inputs(g, u, bg, bu, (unsigned)(n * 7 + (int)a));
                memset(want, 0x5a, sizeof want);
                memset(got, 0x5a, sizeof got);
                moe_act_row_scalar(&d, g, u, biased ? bg : NULL, biased ? bu : NULL, want, n);
                k->act_row(&d, g, u, biased ? bg : NULL, biased ? bu : NULL, got, n);
                for (int j = 0; j < N; j++)
                    if (f_bits(want[j]) != f_bits(got[j]))
                        fail_msg("table %s act %d biased %d n %d: h[%d] = %a, scalar %a (g %a u %a)", k->name,
                                 (int)acts[a], biased, n, j, (double)got[j], (double)want[j], (double)g[j],
                                 (double)u[j]);
            }
        }
    }
    /* non-gated activations: g and bg NULL, h = act(u (+ bu)); against the scalar row and the
     * definitions (relu, relu^2 exact; the two gelus within 4 ulp of the double formula) */
    (void)bg;
    const moe_activation acts1[] = {MOE_ACT_RELU, MOE_ACT_RELU2, MOE_ACT_GELU, MOE_ACT_GELU_TANH};
    for (size_t a = 0; a < sizeof acts1 / sizeof acts1[0]; a++) {
        for (int biased = 0; biased < 2; biased++) {
            for (int n = 1; n <= N; n += (n < 40 ? 1 : 37)) {
                moe_layer_desc d;
                moe_layer_desc_init(&d);
                d.activation = acts1[a];
                fill_inputs(g, u, bg, bu, (unsigned)(n * 11 + (int)a));
                memset(want, 0x5a, sizeof want);
                memset(got, 0x5a, sizeof got);
                moe_act_row_scalar(&d, NULL, u, NULL, biased ? bu : NULL, want, n);
                k->act_row(&d, NULL, u, NULL, biased ? bu : NULL, got, n);
                for (int j = 0; j < N; j++)
                    if (f_bits(want[j]) != f_bits(got[j]))
                        fail_msg("table %s act %d biased %d n %d: h[%d] = %a, scalar %a (u %a)", k->name,
                                 (int)acts1[a], biased, n, j, (double)got[j], (double)want[j], (double)u[j]);
                for (int j = 0; j < n; j++) {
                    const float v = biased ? u[j] + bu[j] : u[j];
                    const double x = v;
                    double ref;
                    if (acts1[a] == MOE_ACT_RELU)
                        ref = v < 0.0f ? 0.0 : x;
                    else if (acts1[a] == MOE_ACT_RELU2)
                        ref = v < 0.0f ? 0.0 : (double)(v * v); /* one f32 product */
                    else if (acts1[a] == MOE_ACT_GELU)
                        ref = 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
                    else
                        ref = 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
                    if (isnan(ref) || isnan(v)) {
                        if (!isnan(want[j]))
                            fail_msg("act %d: NaN in, %a out", (int)acts1[a], (double)want[j]);
                        continue;
                    }
                    /* relu, relu^2: exact; gelu: 4 ulp, or where 1 + erf(v) cancels (v << 0) the f32
                     * rounding of 1 + erf scaled by 0.5 |v| */
                    const int ok = acts1[a] <= MOE_ACT_RELU2
                                       ? (double)want[j] == ref
                                       : ulp_err(want[j], ref) <= 4.0 || fabs((double)want[j] - ref) <= 0x1p-24 * fabs(x);
                    if (!ok)
                        fail_msg("act %d (u %a): %a, want %a", (int)acts1[a], (double)v, (double)want[j], ref);
                }
            }
        }
    }
}

static void test_act_rows_all_tables(void **state)
{
    (void)state;
    /* every row of the kernel registry this CPU runs */
    const moe_kernels *tables[16];
    const size_t n = tu_tables(tables, 16);
    for (size_t i = 0; i < n; i++) {
        if (tables[i])
            check_table(tables[i]);
        else
            print_message("this CPU cannot run kernel table %s: its act_row was not run\n", moe_isa_row_at(i)->name);
    }
}

/* MOE_ACT_SWIGLU_CLAMP (GLM-5-Next) against its definition in double, silu(min(g, L)) *
 * clamp(u, -L, L) (Glm5NextTextExperts._apply_gate), within a few ulp of the f32 result (the
 * f32 form rounds the exp, the division and the product); the clamps exactly: beyond L the
 * result is the one at L; NaN stays NaN. */
static void test_swiglu_clamp(void **state)
{
    (void)state;
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.activation = MOE_ACT_SWIGLU_CLAMP;
    d.swiglu_limit = 10.0f;
    const double L = 10.0;
    double worst = 0.0;
    for (int i = 0; i < 4001; i++) {
        const float g = -30.0f + 0.015f * (float)i, u = 25.0f - 0.0123f * (float)i;
        const double gc = fmin((double)g, L), uc = fmax(fmin((double)u, L), -L);
        const double want = gc / (1.0 + exp(-gc)) * uc;
        const double e = ulp_err(moe_act_apply(&d, g, u), want);
        worst = e > worst ? e : worst;
    }
    print_message("swiglu_clamp: worst %.2f ulp against the double definition\n", worst);
    assert_true(worst <= 4.0);
    assert_true(f_bits(moe_act_apply(&d, 50.0f, 3.0f)) == f_bits(moe_act_apply(&d, 10.0f, 3.0f)));
    assert_true(f_bits(moe_act_apply(&d, 2.0f, 40.0f)) == f_bits(moe_act_apply(&d, 2.0f, 10.0f)));
    assert_true(f_bits(moe_act_apply(&d, 2.0f, -40.0f)) == f_bits(moe_act_apply(&d, 2.0f, -10.0f)));
    /* the gate is clamped above only: a very negative gate is not lifted to -L */
    assert_true(moe_act_apply(&d, -50.0f, 3.0f) != moe_act_apply(&d, -10.0f, 3.0f));
    assert_true(isnan(moe_act_apply(&d, NAN, 1.0f)) && isnan(moe_act_apply(&d, 1.0f, NAN)));
    /* unlike gpt-oss's form (alpha, u + 1) */
    d.activation = MOE_ACT_SWIGLU_OAI;
    const float oai = moe_act_apply(&d, 2.0f, 3.0f);
    d.activation = MOE_ACT_SWIGLU_CLAMP;
    assert_true(oai != moe_act_apply(&d, 2.0f, 3.0f));
}

/* MOE_ACT_SWIGLU_SOFTCAP (Inkling2SoftcappedSwiGLU) against its definition in double,
 * (tanh(g / c_g) c_g * sigmoid(g)) * tanh(u / c_u) c_u, within a few ulp of the f32 result
 * (tanhf, the exp, the division and three products round); the sigmoid sees the raw gate (not
 * the capped one, not silu); +-inf saturates to a finite h; NaN stays NaN. */
static void test_swiglu_softcap(void **state)
{
    (void)state;
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    assert_true(d.softcap_gate == 4.0f && d.softcap_up == 25.0f); /* Inkling2TextConfig's defaults */
    d.activation = MOE_ACT_SWIGLU_SOFTCAP;
    d.softcap_gate = 4.0f;
    d.softcap_up = 2.0f;
    const double cg = 4.0, cu = 2.0;
    double worst = 0.0;
    for (int i = 0; i < 4001; i++) {
        const float g = -30.0f + 0.015f * (float)i, u = 25.0f - 0.0123f * (float)i;
        const double want = tanh((double)g / cg) * cg / (1.0 + exp(-(double)g)) * (tanh((double)u / cu) * cu);
        if (fabs(want) < 1e-30) /* the sigmoid's tail: ulp of a denormal-scale value says little */
            continue;
        const double e = ulp_err(moe_act_apply(&d, g, u), want);
        worst = e > worst ? e : worst;
    }
    print_message("swiglu_softcap: worst %.2f ulp against the double definition\n", worst);
    assert_true(worst <= 8.0);
    /* the sigmoid of the raw gate: at g = 6, sigmoid(6) = 0.9975, while sigmoid(cap(6)) would be
     * sigmoid(3.62) = 0.974 and silu would multiply by g itself */
    const double at6 = tanh(6.0 / cg) * cg / (1.0 + exp(-6.0)) * (tanh(1.0 / cu) * cu);
    assert_true(ulp_err(moe_act_apply(&d, 6.0f, 1.0f), at6) <= 8.0);
    /* saturation: |h| <= c_g c_u, finite for infinite inputs */
    const float hi = moe_act_apply(&d, INFINITY, INFINITY), lo = moe_act_apply(&d, INFINITY, -INFINITY);
    assert_true(hi == 8.0f && lo == -8.0f);
    assert_true(moe_act_apply(&d, -INFINITY, 1.0f) == 0.0f);
    assert_true(isnan(moe_act_apply(&d, NAN, 1.0f)) && isnan(moe_act_apply(&d, 1.0f, NAN)));
}

/* MOE_ACT_SWIGLU_POSTCLAMP (Step3p7Experts._apply_gate, Step3p7MLP) against its definition in
 * double, min(silu(g), L) * clamp(u, -L, L), within a few ulp (the exp, the division and the
 * product round); the clamp is on silu(g), not on g: a gate just above L is not clamped
 * (silu(L + 0.01) < L), a large one gives exactly L; negative gates are not clamped; +inf in the
 * gate gives L, -inf NaN (as torch's g * sigmoid(g)), NaN stays NaN; an infinite limit is plain
 * SwiGLU bit for bit. */
static void test_swiglu_postclamp(void **state)
{
    (void)state;
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.activation = MOE_ACT_SWIGLU_POSTCLAMP;
    d.swiglu_limit = 7.0f;
    const double L = 7.0;
    double worst = 0.0;
    for (int i = 0; i < 4001; i++) {
        const float g = -30.0f + 0.015f * (float)i, u = 25.0f - 0.0123f * (float)i;
        const double s = (double)g / (1.0 + exp(-(double)g));
        const double want = fmin(s, L) * fmax(fmin((double)u, L), -L);
        if (fabs(want) < 1e-30)
            continue;
        const double e = ulp_err(moe_act_apply(&d, g, u), want);
        worst = e > worst ? e : worst;
    }
    print_message("swiglu_postclamp: worst %.2f ulp against the double definition\n", worst);
    assert_true(worst <= 4.0);
    /* the gate side: silu(7.01) = 7.0036.. > 7 is clamped, silu(7.0) = 6.9936.. is not */
    assert_true(moe_act_apply(&d, 50.0f, 1.0f) == 7.0f && moe_act_apply(&d, 7.01f, 1.0f) == 7.0f);
    assert_true(moe_act_apply(&d, 7.0f, 1.0f) < 7.0f);
    d.activation = MOE_ACT_SWIGLU_CLAMP; /* GLM-5-Next's clamp before the silu: silu(7) there */
    const float pre = moe_act_apply(&d, 50.0f, 1.0f);
    d.activation = MOE_ACT_SWIGLU_POSTCLAMP;
    assert_true(pre < 7.0f && pre != moe_act_apply(&d, 50.0f, 1.0f));
    /* the up side, both ways */
    assert_true(f_bits(moe_act_apply(&d, 2.0f, 40.0f)) == f_bits(moe_act_apply(&d, 2.0f, 7.0f)));
    assert_true(f_bits(moe_act_apply(&d, 2.0f, -40.0f)) == f_bits(moe_act_apply(&d, 2.0f, -7.0f)));
    /* negative gates pass (silu >= -0.2785) */
    assert_true(moe_act_apply(&d, -1.0f, 1.0f) < -0.26f);
    /* specials */
    assert_true(moe_act_apply(&d, INFINITY, 2.0f) == 14.0f);
    assert_true(moe_act_apply(&d, INFINITY, INFINITY) == 49.0f);
    assert_true(isnan(moe_act_apply(&d, -INFINITY, 1.0f)));
    assert_true(isnan(moe_act_apply(&d, NAN, 1.0f)) && isnan(moe_act_apply(&d, 1.0f, NAN)));
    /* no limit (Step-3.7's None / 0 reads as plain SwiGLU; +inf computes it too, bit for bit) */
    d.swiglu_limit = INFINITY;
    moe_layer_desc s;
    moe_layer_desc_init(&s);
    for (int i = 0; i < 2001; i++) {
        const float g = -40.0f + 0.04f * (float)i, u = 9.0f - 0.009f * (float)i;
        assert_true(f_bits(moe_act_apply(&d, g, u)) == f_bits(moe_act_apply(&s, g, u)));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swiglu_postclamp),
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_expf_special),
        cmocka_unit_test(test_act_rows_all_tables),
        cmocka_unit_test(test_swiglu_clamp),
        cmocka_unit_test(test_swiglu_softcap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
