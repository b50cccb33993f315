/* Compute bf16's arithmetic (core/bf16.h) and kernels against independent references:
 *  - moe_bf16_round against round-to-nearest-even computed from the two neighbouring bf16
 *    values in double;
 *  - moe_bf16_dp against the instruction it emulates (vdpbf16ps, where this CPU has it) and
 *    against vfmadd under MXCSR FTZ|DAZ (x86 with FMA), on random chains and on the cases that
 *    separate the readings of the rule (the flush point, signs, denormal operands);
 *  - every kernel table's bf16_row and bf16 pair-panel GEMM against the ref table's, bit for bit,
 *    on odd K, partial panels, 1..13 rows, sub-ranges of panels, and rows holding tiny values,
 *    denormals, infinities and NaN. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/cpu.h"
#include "gemm/avx512_bf16/avx512_bf16.h"
#include "gemm/kernels.h"
#include "moe.h"
#include "quant/pack.h"
#include "testutil.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    return tu_xorshift(&g_rng);
}

/* A bf16 of a chosen exponent range: 0 any, 1 tiny (exponent field < 80), 2 around 1. */
static uint16_t rand_bf16(int mode)
{
    uint16_t h = (uint16_t)rnd();
    if (mode == 1)
        h = (uint16_t)((h & 0x807fu) | (unsigned)(rnd() % 80) << 7);
    else if (mode == 2)
        h = (uint16_t)((h & 0x807fu) | (unsigned)(120 + rnd() % 16) << 7);
    return h;
}

static int same_or_both_nan(float a, float b)
{
    return tu_f32_bits(a) == tu_f32_bits(b) || (isnan(a) && isnan(b));
}

/* The reference rounding: of the two bf16 values around f (truncation and the next one up in
 * magnitude), the nearer in exact double arithmetic, the even one on a tie. */
static uint16_t round_by_distance(float f)
{
    const uint32_t u = tu_f32_bits(f);
    const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    const double dl = fabs((double)f - (double)moe_bf16_value(lo));
    /* past the largest bf16 the next value is +-2^128 (IEEE: round as if the exponent were
     * unbounded, then overflow to +-Inf) */
    const double vh = (hi & 0x7fffu) == 0x7f80u ? copysign(0x1p128, (double)f) : (double)moe_bf16_value(hi);
    const double dh = fabs(vh - (double)f);
    if ((u & 0xffffu) == 0)
        return lo;
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1u) ? hi : lo;
}

static void test_round(void **state)
{
    (void)state;
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x00008000u, 0x00018000u,
                                    0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
                                    0x7f800000u, 0xff800000u};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        assert_int_equal(moe_bf16_round(tu_f32_of(edge[i])), round_by_distance(tu_f32_of(edge[i])));
    for (int i = 0; i < 2000000; i++) {
        const uint32_t u = (uint32_t)rnd();
        const float f = tu_f32_of(u);
        const uint16_t got = moe_bf16_round(f);
        if (isnan(f)) { /* NaN: a quiet NaN of the same sign */
            assert_true(isnan(moe_bf16_value(got)));
            assert_int_equal(got & 0x8000u, (u >> 16) & 0x8000u);
            assert_true(got & 0x0040u);
            continue;
        }
        if (got != round_by_distance(f))
            fail_msg("moe_bf16_round(%08x) = %04x, nearest even is %04x", u, got, round_by_distance(f));
    }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bf16"))) static float hw_dp(float acc, uint16_t a1, uint16_t b1, uint16_t a0,
                                                                uint16_t b0)
{
    const __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(acc), (__m512bh)_mm512_set1_epi32((int)(a0 | (uint32_t)a1 << 16)),
                                      (__m512bh)_mm512_set1_epi32((int)(b0 | (uint32_t)b1 << 16)));
    return _mm512_cvtss_f32(r);
}

__attribute__((target("fma"))) static float fma_ftz_daz(float acc, float a1, float b1, float a0, float b0)
{
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    __m128 r = _mm_fmadd_ss(_mm_set_ss(a1), _mm_set_ss(b1), _mm_set_ss(acc));
    r = _mm_fmadd_ss(_mm_set_ss(a0), _mm_set_ss(b0), r);
    const float out = _mm_cvtss_f32(r);
    _mm_setcsr(csr);
    return out;
}
#endif

/* One pair step by the emulation: odd element first. */
static float emu_dp(float acc, uint16_t a1, uint16_t b1, uint16_t a0, uint16_t b0)
{
    acc = moe_bf16_dp(acc, moe_bf16_value(a1), moe_bf16_value(b1));
    return moe_bf16_dp(acc, moe_bf16_value(a0), moe_bf16_value(b0));
}

static void test_dp_against_hardware(void **state)
{
    (void)state;
#if defined(__x86_64__)
    const moe_cpu_features *f = moe_cpu_features_get();
    const int have_bf16 = f->avx512_bf16 && f->os_zmm && f->avx512f;
    const int have_fma = f->fma && f->os_ymm;
    long n = 0;
    for (int it = 0; it < 3000000; it++) {
        const int mode = it % 3;
        float acc = 0.0f;
        if (it % 5 == 1) /* an accumulator of any value, tiny ones included */
            acc = tu_f32_of((uint32_t)rnd() & (mode == 1 ? 0x80ffffffu : 0xffffffffu));
        if (isnan(acc))
            acc = 0.0f;
        const uint16_t a1 = rand_bf16(mode), b1 = rand_bf16(mode), a0 = rand_bf16(mode), b0 = rand_bf16(mode);
        const float want = emu_dp(acc, a1, b1, a0, b0);
        if (have_bf16) {
            const float hw = hw_dp(acc, a1, b1, a0, b0);
            if (!same_or_both_nan(hw, want))
                fail_msg("vdpbf16ps(%08x; %04x*%04x, %04x*%04x) = %08x, moe_bf16_dp gives %08x", tu_f32_bits(acc), a1,
                         b1, a0, b0, tu_f32_bits(hw), tu_f32_bits(want));
        }
        if (have_fma) {
            const float fm = fma_ftz_daz(acc, moe_bf16_value(a1), moe_bf16_value(b1), moe_bf16_value(a0),
                                         moe_bf16_value(b0));
            if (!same_or_both_nan(fm, want))
                fail_msg("vfmadd under FTZ|DAZ (%08x; %04x*%04x, %04x*%04x) = %08x, moe_bf16_dp gives %08x",
                         tu_f32_bits(acc), a1, b1, a0, b0, tu_f32_bits(fm), tu_f32_bits(want));
        }
        n++;
    }
    /* the flush point: accumulators next to FLT_MIN plus products near 2^-150 (the even
     * element -0 * 1 keeps the sign of the odd step's result) */
    for (int it = 0; it < 1000000; it++) {
        uint32_t au = 0x00800000u + (uint32_t)(rnd() % 64);
        if (rnd() & 1)
            au |= 0x80000000u;
        const int ea = 40 + (int)(rnd() % 40);
        int eb = 254 - 150 - ea + (int)(rnd() % 6);
        eb = eb < 1 ? 1 : eb;
        const uint16_t a1 = (uint16_t)((rnd() & 0x807fu) | (unsigned)ea << 7);
        const uint16_t b1 = (uint16_t)((rnd() & 0x807fu) | (unsigned)eb << 7);
        const float acc = tu_f32_of(au), want = emu_dp(acc, a1, b1, 0x8000, 0x3f80);
        if (have_bf16 && !same_or_both_nan(hw_dp(acc, a1, b1, 0x8000, 0x3f80), want))
            fail_msg("flush point: vdpbf16ps(%08x; %04x*%04x) = %08x, moe_bf16_dp gives %08x", au, a1, b1,
                     tu_f32_bits(hw_dp(acc, a1, b1, 0x8000, 0x3f80)), tu_f32_bits(want));
        if (have_fma && !same_or_both_nan(fma_ftz_daz(acc, moe_bf16_value(a1), moe_bf16_value(b1), -0.0f, 1.0f), want))
            fail_msg("flush point: vfmadd under FTZ|DAZ (%08x; %04x*%04x) differs from moe_bf16_dp", au, a1, b1);
        n++;
    }
    print_message("%ld pair steps compared (vdpbf16ps: %s, vfmadd FTZ|DAZ: %s)\n", n, have_bf16 ? "yes" : "absent",
                  have_fma ? "yes" : "absent");
    if (!have_bf16 && !have_fma)
        skip();
#else
    skip();
#endif
}

/* A row of n f32 for the kernels: mode 0 uniform in [-1, 1]; 1 tiny (2^-70 .. 2^-60, so
 * products fall below FLT_MIN), with f32 denormals; 2 with +-Inf and NaN among normal values. */
static void fill_row(float *x, int64_t n, int mode)
{
    for (int64_t k = 0; k < n; k++) {
        float v = (float)((int64_t)(rnd() % 2001) - 1000) * 1e-3f;
        if (mode == 1)
            v = ldexpf(v, -60 - (int)(rnd() % 10)) + (rnd() % 7 == 0 ? tu_f32_of((uint32_t)rnd() & 0x807fffffu) : 0.0f);
        if (mode == 2 && rnd() % 17 == 0)
            v = rnd() % 3 == 0 ? NAN : (rnd() & 1) ? INFINITY : -INFINITY;
        x[k] = v;
    }
}

/* Every table's bf16_row and bf16_rows[MOE_WF_BF16P] give the ref table's bits. */
static void test_pair_kernels(void **state)
{
    (void)state;
    const moe_kernels *ref = tu_table("ref");
    assert_non_null(ref);
    const moe_kernels *tables[17];
    size_t nt = tu_tables(tables, 16);
    /* the avx512_bf16 row keeps the vfmadd form where vdpbf16ps is slower (its init measures):
     * the vdpbf16ps kernel is then checked through a copy of the table that runs it */
    static moe_kernels dp_table;
    const moe_kernels *bt = tu_table("avx512_bf16");
    if (bt && bt->bf16_rows[MOE_WF_BF16P] != moe_ukr_bf16p_rows_avx512_bf16_6x64) {
        dp_table = *bt;
        dp_table.name = "avx512_bf16 (its vdpbf16ps form)";
        dp_table.bf16_rows[MOE_WF_BF16P] = moe_ukr_bf16p_rows_avx512_bf16_6x64;
        tables[nt++] = &dp_table;
    }
    static const int64_t Ks[] = {1, 2, 3, 7, 32, 33, 129, 200};
    static const int64_t Ns[] = {1, 16, 17, 33, 80};
    int compared = 0;
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
            const int64_t K = Ks[ki], N = Ns[ni], K2 = (K + 1) / 2, np = (N + 15) / 16;
            for (int mode = 0; mode < 3; mode++) {
                /* weights [N, K] f32 of the row's kind, packed as bf16 pairs */
                float *wf = malloc(sizeof(float) * (size_t)(N * K));
                fill_row(wf, N * K, mode);
                uint16_t *wp = malloc(sizeof(uint16_t) * (size_t)(2 * N * K2)); /* [np][K2][nw][2] */
                moe_pack_bf16_pairs(wp, wf, MOE_DTYPE_F32, N, K, K, 1);
                const moe_pmat w = {.data = wp, .dtype = MOE_DTYPE_BF16, .n = N, .k = K, .pairs = 1};
                enum { MB = 13 };
                float xf[MB][208];                         /* f32 rows [MB][K] */
                uint8_t xr[MB][4 * 104], xt[MB][4 * 104];  /* bf16 pair rows: ref's, the table's */
                const uint8_t *xp[MB];
                for (int m = 0; m < MB; m++) {
                    fill_row(xf[m], K, mode);
                    const float mul = 0.75f;
                    ref->bf16_row(xf[m], K, 0, m % 2 ? &mul : NULL, xr[m], NULL);
                    xp[m] = xr[m];
                }
                float *want = malloc(sizeof(float) * (size_t)(MB * N)), *got = malloc(sizeof(float) * (size_t)(MB * N));
                for (size_t t = 0; t < nt; t++) {
                    const moe_kernels *k = tables[t];
                    for (int m = 0; m < MB; m++) {
                        const float mul = 0.75f;
                        k->bf16_row(xf[m], K, 0, m % 2 ? &mul : NULL, xt[m], NULL);
                        if (memcmp(xt[m], xr[m], (size_t)(4 * K2)) != 0)
                            fail_msg("table %s: bf16_row differs from the ref's (K %lld, mode %d)", k->name,
                                     (long long)K, mode);
                    }
                    for (int mb = 1; mb <= MB; mb += (mb < 7 ? 1 : 6)) {
                        const int64_t p0 = np > 2 ? 1 : 0, p1 = np; /* a sub-range when there are panels */
                        ref->bf16_rows[MOE_WF_BF16P](&w, p0, p1, xp, NULL, mb, want, N, NULL, 0);
                        k->bf16_rows[MOE_WF_BF16P](&w, p0, p1, xp, NULL, mb, got, N, NULL, 0);
                        const int64_t cols = (p1 * 16 < N ? p1 * 16 : N) - p0 * 16;
                        for (int m = 0; m < mb; m++)
                            for (int64_t c = 0; c < cols; c++)
                                if (!same_or_both_nan(got[m * N + c], want[m * N + c]))
                                    fail_msg("table %s: bf16 pair GEMM K %lld N %lld mb %d mode %d: [%d][%lld] = "
                                             "%08x, ref %08x",
                                             k->name, (long long)K, (long long)N, mb, mode, m, (long long)c,
                                             tu_f32_bits(got[m * N + c]), tu_f32_bits(want[m * N + c]));
                        compared++;
                    }
                }
                free(want);
                free(got);
                free(wf);
                free(wp);
            }
        }
    print_message("%d kernel calls compared over %zu tables\n", compared, nt);
}

/* ---- compute bf16 against the exact (f64) layer, with a derived bound ----
 *
 * The library's compute-bf16 output is compared with the layer computed exactly (double, on the
 * caller's weights and f32 hidden states, with the library's own routing: the routing is f32 in
 * both modes, and the test checks that its ids and weights are those of compute f32), element
 * by element, against a bound propagated along the same path (docs/numerics.md section 7):
 *   b = 2^-9 (bf16 round to nearest even), u = 2^-24 (f32), g_n = n u / (1 - n u);
 *   expert input x (times the routing weight on the input, rounded to f32 first: relative u)
 *     rounded to bf16: relative rx = b (or u + b + bu); weights rounded when not bf16: bw = b;
 *   gate g = sum_k x_k W_k: e_g = A [(1 + rx)(1 + bw)(1 + g_H) - 1] + 4 H FLT_MIN (1 + max |W|),
 *     A = sum |x_k| |W_k| (the flushes of FTZ/DAZ are absolute and at most FLT_MIN a step); a
 *     bias add rounds once more (u); the same for up;
 *   h = act(g, u): |dh| <= L e_g (|u'| + e_u) + |phi(g)| e_u, with L the Lipschitz constant of
 *     the gate nonlinearity phi (silu, g sigmoid(alpha g): 1.1; gelu, tanh gelu: 1.15; the
 *     clamps are 1-Lipschitz) and u' the up factor (u, or clamp(u) + 1 for gpt-oss), plus its
 *     f32 evaluation, 16 u (|h| + |g| |u'| + |u'|) + 16 u e_h; then h rounded to bf16: + b |h^|;
 *   down y = sum_i h_i D_i: sum |D_i| (1 + bw) E_h,i + bw sum |h_i| |D_i| + g_I sum (|h_i| +
 *     E_h,i) |D_i| (1 + bw) + 4 I FLT_MIN (1 + max |D|), a bias add u;
 *   output rsf (sum_k c_k y_k) + s y_shared (c_k = w_k, or 1 with the weight on the input):
 *     rsf sum |c_k| e_y,k + |s| e_ys + |ds| (|ys| + e_ys) + g_(K+3) (rsf sum |c_k| (|y_k| + e_y,k)
 *     + |s| (|ys| + e_ys)), ds the f32 shared gate's error 0.25 g_H sum |x| |w_g| + 4 u.
 * Every step is a worst-case (interval) bound, not first order, so the test allows no slack. */

typedef struct bound_layer {
    moe_layer_desc d;
    float *router, *rbias, *sbias;       /* [E, H], [E], [E] */
    float *wg, *wu, *wd;                 /* f32 values of every expert: [E][I][H], [E][I][H], [E][H][I] */
    void *g_src, *u_src, *d_src;         /* the same in weight_dtype (bf16-exact values when BF16) */
    float *bg, *bu, *bd;                 /* biases [E][I], [E][I], [E][H] */
    float *sg, *su, *sd, *sgate;         /* shared [Is][H], [Is][H], [H][Is], gate [H] */
    float *obias;                        /* output bias [H] (has_output_bias) */
    float *onorm;                        /* output RMSNorm weight [H] (has_output_norm) */
    void *sg_src, *su_src, *sd_src;
} bound_layer;

static void *as_dtype(float *f, size_t n, moe_dtype dt)
{
    if (dt == MOE_DTYPE_F32) {
        void *p = malloc(sizeof(float) * n);
        memcpy(p, f, sizeof(float) * n);
        return p;
    }
    uint16_t *h = malloc(sizeof(uint16_t) * n); /* bf16: the values are bf16-exact already */
    for (size_t i = 0; i < n; i++)
        h[i] = (uint16_t)(tu_f32_bits(f[i]) >> 16);
    return h;
}

static float *rand_f32(size_t n, float amp, int bf16_exact)
{
    float *f = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        f[i] = amp * (float)((int64_t)(rnd() % 200001) - 100000) * 1e-5f;
        if (bf16_exact)
            f[i] = moe_bf16_value((uint16_t)(tu_f32_bits(f[i]) >> 16));
    }
    return f;
}

static double act64(const moe_layer_desc *d, double g, double u, double *phi, double *uf, double *L)
{
    switch (d->activation) {
    case MOE_ACT_GEGLU:
        *phi = 0.5 * g * (1.0 + erf(g / sqrt(2.0)));
        *uf = u;
        *L = 1.15;
        break;
    case MOE_ACT_GEGLU_TANH:
        *phi = 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
        *uf = u;
        *L = 1.15;
        break;
    case MOE_ACT_SWIGLU_OAI: {
        const double lim = d->swiglu_limit, gc = g > lim ? lim : g;
        *phi = gc / (1.0 + exp(-(double)d->swiglu_alpha * gc));
        *uf = (u > lim ? lim : u < -lim ? -lim : u) + 1.0;
        *L = 1.1;
        break;
    }
    case MOE_ACT_SWIGLU_SOFTCAP: {
        /* phi(g) = tanh(g / c_g) c_g sigmoid(g): |phi'| <= sech^2 sigmoid + c tanh sigmoid (1 - sigmoid),
         * below silu's 1.1 for every c_g (it tends to silu as c_g grows; 0.93 at c_g = 4); the cap on u
         * has |cap'| <= 1, so e_u bounds its error too */
        const double cg = d->softcap_gate, cu = d->softcap_up;
        *phi = tanh(g / cg) * cg / (1.0 + exp(-g));
        *uf = tanh(u / cu) * cu;
        *L = 1.1;
        break;
    }
    /* non-gated (g not read): phi = 1 exactly, uf = f(u), L bounds |f'| near u (expert64 multiplies
     * it by e_u alone): relu 1; relu^2 2 |u| + e_u ((u + d)^2 - u^2 = (2u + d) d); the gelus 1.13
     * (max |gelu'| = 1.129 at u = 2.4), as GEGLU's 1.15 */
    case MOE_ACT_RELU:
        *phi = 1.0, *uf = u > 0.0 ? u : 0.0, *L = 1.0;
        break;
    case MOE_ACT_RELU2:
        *phi = 1.0, *uf = u > 0.0 ? u * u : 0.0, *L = 2.0 * fabs(u); /* + e_u: expert64 */
        break;
    case MOE_ACT_GELU:
        *phi = 1.0, *uf = 0.5 * u * (1.0 + erf(u / sqrt(2.0))), *L = 1.15;
        break;
    case MOE_ACT_GELU_TANH:
        *phi = 1.0, *uf = 0.5 * u * (1.0 + tanh(0.7978845608028654 * (u + 0.044715 * u * u * u))), *L = 1.15;
        break;
    default:
        *phi = g / (1.0 + exp(-g));
        *uf = u;
        *L = 1.1;
        break;
    }
    return *phi * *uf;
}

static double gamma_n(double n)
{
    const double u = 0x1p-24;
    return n * u / (1.0 - n * u);
}

/* One expert on x (exact input xin [H], rx its relative rounding to bf16): y [H] exact, ey [H]
 * its bound. W* [I][H] / [H][I] f32 values; biases may be NULL. */
static void expert64(const moe_layer_desc *d, int64_t H, int64_t I, const double *xin, double rx, double bw,
                     const float *Wg, const float *Wu, const float *Wd, const float *bg, const float *bu,
                     const float *bd, double *y, double *ey)
{
    const double b = 0x1p-9, u = 0x1p-24, tiny = 4.0 * FLT_MIN;
    double *h = malloc(sizeof(double) * (size_t)I), *eh = malloc(sizeof(double) * (size_t)I);
    double wmax = 0.0;
    for (int64_t i = 0; i < I * H; i++)
        wmax = fmax(wmax, fmax(fabs(Wg[i]), fmax(fabs(Wu[i]), fabs(Wd[i]))));
    for (int64_t i = 0; i < I; i++) {
        double g = 0.0, uu = 0.0, Ag = 0.0, Au = 0.0;
        for (int64_t k = 0; k < H; k++) {
            g += xin[k] * Wg[i * H + k];
            uu += xin[k] * Wu[i * H + k];
            Ag += fabs(xin[k]) * fabs(Wg[i * H + k]);
            Au += fabs(xin[k]) * fabs(Wu[i * H + k]);
        }
        const double rel = (1.0 + rx) * (1.0 + bw) * (1.0 + gamma_n((double)H)) - 1.0;
        double eg = Ag * rel + (double)H * tiny * (1.0 + wmax), eu = Au * rel + (double)H * tiny * (1.0 + wmax);
        if (bg) {
            g += bg[i];
            uu += bu[i];
            eg += u * (fabs(g) + eg);
            eu += u * (fabs(uu) + eu);
        }
        double phi, uf, L;
        h[i] = act64(d, g, uu, &phi, &uf, &L);
        double e;
        if (!moe_activation_gated(d->activation)) { /* h = f(u): |f(u + d) - f(u)| <= L |d| (relu^2: + d^2) */
            e = (d->activation == MOE_ACT_RELU2 ? L + eu : L) * eu;
            e += 16.0 * u * (fabs(h[i]) + fabs(uf)) + 16.0 * u * e;
        } else {
            e = L * eg * (fabs(uf) + eu) + fabs(phi) * eu;
            e += 16.0 * u * (fabs(h[i]) + fabs(g) * fabs(uf) + fabs(uf)) + 16.0 * u * e;
        }
        eh[i] = e + b * (fabs(h[i]) + e); /* rounded to bf16 before down */
    }
    for (int64_t j = 0; j < H; j++) {
        double acc = 0.0, e = 0.0, A = 0.0, Ae = 0.0;
        for (int64_t i = 0; i < I; i++) {
            const double w = fabs(Wd[j * I + i]);
            acc += h[i] * Wd[j * I + i];
            e += w * (1.0 + bw) * eh[i];
            A += fabs(h[i]) * w;
            Ae += (fabs(h[i]) + eh[i]) * w * (1.0 + bw);
        }
        e += bw * A + gamma_n((double)I) * Ae + (double)I * tiny * (1.0 + wmax);
        if (bd) {
            acc += bd[j];
            e += u * (fabs(acc) + e);
        }
        y[j] = acc;
        ey[j] = e;
    }
    free(h);
    free(eh);
}

/* family f's math (moe_family_layer_defaults) on a random layer with odd H and I; bf16 or f32
 * weights. */
static void check_bound(moe_family fam, moe_dtype wdt, double *worst_ratio, double *worst_rel)
{
    const int64_t H = 45, I = 23, E = 16, T = 9;
    int64_t K = 4; /* 2 for sparsemixer, which selects exactly 2 (moe_route_check_desc) */
    const int shared = fam == MOE_FAMILY_QWEN2_MOE || fam == MOE_FAMILY_DEEPSEEK_V2 ||
                       fam == MOE_FAMILY_DEEPSEEK_V3 || fam == MOE_FAMILY_LLAMA4 || fam == MOE_FAMILY_QWEN3_NEXT ||
                       fam == MOE_FAMILY_QWEN3_5_MOE || fam == MOE_FAMILY_GLM4_MOE || fam == MOE_FAMILY_DOTS1 ||
                       fam == MOE_FAMILY_GLM4_MOE_LITE || fam == MOE_FAMILY_DEEPSEEK_V32 || fam == MOE_FAMILY_EXAONE_MOE ||
                       fam == MOE_FAMILY_NEMOTRON_H;
    const int64_t Is = shared ? 19 : 0;
    bound_layer L;
    memset(&L, 0, sizeof L);
    moe_layer_desc *d = &L.d;
    moe_layer_desc_init(d);
    d->hidden_size = H;
    d->moe_intermediate_size = I;
    d->num_experts = E;
    d->top_k = K;
    d->shared_expert_intermediate_size = Is;
    d->weight_dtype = wdt;
    assert_int_equal(moe_family_layer_defaults(fam, d), MOE_OK);
    if (d->scoring_func == MOE_SCORING_SPARSEMIXER)
        K = d->top_k = 2;
    if (d->num_identity_experts > 0) /* LongCat-Flash: 3 identity experts (ids >= E: w * x, exact) */
        d->num_identity_experts = 3;
    const int64_t R = E + d->num_identity_experts; /* the router's rows */
    const int bx = wdt == MOE_DTYPE_BF16;
    L.router = rand_f32((size_t)(R * H), 0.5f, 0);
    L.rbias = rand_f32((size_t)R, 0.1f, 0);
    L.sbias = rand_f32((size_t)R, 0.1f, 0);
    const float sh = 1.0f / sqrtf((float)H), si = 1.0f / sqrtf((float)I);
    L.wg = rand_f32((size_t)(E * I * H), 2.0f * sh, bx);
    L.wu = rand_f32((size_t)(E * I * H), 2.0f * sh, bx);
    L.wd = rand_f32((size_t)(E * H * I), 2.0f * si, bx);
    L.g_src = as_dtype(L.wg, (size_t)(E * I * H), wdt);
    L.u_src = as_dtype(L.wu, (size_t)(E * I * H), wdt);
    L.d_src = as_dtype(L.wd, (size_t)(E * H * I), wdt);
    L.bg = rand_f32((size_t)(E * I), 0.2f, 0);
    L.bu = rand_f32((size_t)(E * I), 0.2f, 0);
    L.bd = rand_f32((size_t)(E * H), 0.2f, 0);
    const void *gp[16], *up[16], *dp[16], *bgp[16], *bup[16], *bdp[16];
    const size_t es = moe_dtype_size(wdt);
    for (int64_t e = 0; e < E; e++) {
        gp[e] = (const char *)L.g_src + (size_t)(e * I * H) * es;
        up[e] = (const char *)L.u_src + (size_t)(e * I * H) * es;
        dp[e] = (const char *)L.d_src + (size_t)(e * H * I) * es;
        bgp[e] = L.bg + e * I;
        bup[e] = L.bu + e * I;
        bdp[e] = L.bd + e * H;
    }
    moe_weight_source src = {.router = L.router, .router_dtype = MOE_DTYPE_F32, .gate_proj = gp, .up_proj = up,
                             .down_proj = dp};
    if (d->has_router_bias)
        src.router_bias = L.rbias, src.router_bias_dtype = MOE_DTYPE_F32;
    if (d->has_selection_bias)
        src.selection_bias = L.sbias, src.selection_bias_dtype = MOE_DTYPE_F32;
    if (d->has_expert_bias)
        src.gate_bias = bgp, src.up_bias = bup, src.down_bias = bdp, src.expert_bias_dtype = MOE_DTYPE_F32;
    if (d->has_output_bias) {
        L.obias = rand_f32((size_t)H, 0.2f, 0);
        src.output_bias = L.obias, src.output_bias_dtype = MOE_DTYPE_F32;
    }
    if (d->has_output_norm) { /* weights in [0.8, 1.2] */
        L.onorm = rand_f32((size_t)H, 0.2f, 0);
        for (int64_t j = 0; j < H; j++)
            L.onorm[j] += 1.0f;
        src.output_norm = L.onorm, src.output_norm_dtype = MOE_DTYPE_F32;
    }
    if (Is) {
        L.sg = rand_f32((size_t)(Is * H), 2.0f * sh, bx);
        L.su = rand_f32((size_t)(Is * H), 2.0f * sh, bx);
        L.sd = rand_f32((size_t)(H * Is), 2.0f / sqrtf((float)Is), bx);
        L.sgate = rand_f32((size_t)H, sh, 0);
        L.sg_src = as_dtype(L.sg, (size_t)(Is * H), wdt);
        L.su_src = as_dtype(L.su, (size_t)(Is * H), wdt);
        L.sd_src = as_dtype(L.sd, (size_t)(H * Is), wdt);
        src.shared_gate_proj = L.sg_src;
        src.shared_up_proj = L.su_src;
        src.shared_down_proj = L.sd_src;
        if (d->shared_expert_gated)
            src.shared_expert_gate = L.sgate;
    }
    float *x = rand_f32((size_t)(T * H), 2.0f, 0); /* [T, H], not bf16-exact */
    float out[2][9 * 45];
    int32_t ids[2][9 * 4];
    float wts[2][9 * 4];
    moe_ctx *ctx = tu_ctx();
    for (int c = 0; c < 2; c++) {
        moe_plan_config cfg;
        moe_plan_config_init(&cfg);
        cfg.compute = c ? MOE_COMPUTE_BF16 : MOE_COMPUTE_F32;
        moe_plan *p = NULL;
        moe_weights *w = NULL;
        if (moe_plan_create_ex(ctx, d, &cfg, &p) != MOE_OK)
            fail_msg("%s: %s", moe_family_name(fam), moe_ctx_last_error(ctx));
        if (moe_weights_create(p, &src, &w) != MOE_OK)
            fail_msg("%s: %s", moe_family_name(fam), moe_ctx_last_error(ctx));
        const size_t ws = moe_plan_workspace_size(p, T);
        void *wsp = malloc(ws);
        moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = out[c],
                           .topk_ids = ids[c], .topk_weights = wts[c], .workspace = wsp, .workspace_size = ws};
        assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_OK);
        free(wsp);
        moe_weights_free(w);
        moe_plan_free(p);
    }
    moe_ctx_free(ctx);
    /* routing is f32 in both modes */
    assert_memory_equal(ids[0], ids[1], sizeof(int32_t) * (size_t)(T * K));
    assert_memory_equal(wts[0], wts[1], sizeof(float) * (size_t)(T * K));
    assert_true(memcmp(out[0], out[1], sizeof out[0]) != 0); /* the mode is not a no-op */

    const double b = 0x1p-9, u = 0x1p-24, bw = wdt == MOE_DTYPE_BF16 ? 0.0 : b;
    const double rsf = d->routed_scaling_factor;
    double *xin = malloc(sizeof(double) * (size_t)H), *y = malloc(sizeof(double) * (size_t)H);
    double *ey = malloc(sizeof(double) * (size_t)H);
    double *acc = malloc(sizeof(double) * (size_t)H), *eacc = malloc(sizeof(double) * (size_t)H);
    double *mag = malloc(sizeof(double) * (size_t)H);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < H; j++)
            acc[j] = eacc[j] = mag[j] = 0.0;
        for (int64_t k = 0; k < K; k++) {
            const int64_t e = ids[1][t * K + k];
            const double wk = wts[1][t * K + k];
            const int on_input = d->apply_router_weight_on_input;
            for (int64_t j = 0; j < H; j++)
                xin[j] = on_input ? wk * (double)x[t * H + j] : (double)x[t * H + j];
            const double rx = on_input ? u + b + b * u : b;
            if (e >= E) { /* an identity expert: y = its input, the same in both compute modes */
                for (int64_t j = 0; j < H; j++)
                    y[j] = xin[j], ey[j] = 0.0;
            } else {
                expert64(d, H, I, xin, rx, bw, L.wg + e * I * H, L.wu + e * I * H, L.wd + e * H * I,
                         d->has_expert_bias ? L.bg + e * I : NULL, d->has_expert_bias ? L.bu + e * I : NULL,
                         d->has_expert_bias ? L.bd + e * H : NULL, y, ey);
            }
            const double ck = on_input ? 1.0 : wk;
            for (int64_t j = 0; j < H; j++) {
                acc[j] += rsf * ck * y[j];
                eacc[j] += rsf * fabs(ck) * ey[j];
                mag[j] += rsf * fabs(ck) * (fabs(y[j]) + ey[j]);
            }
        }
        if (Is) {
            for (int64_t j = 0; j < H; j++)
                xin[j] = x[t * H + j];
            expert64(d, H, Is, xin, b, bw, L.sg, L.su, L.sd, NULL, NULL, NULL, y, ey);
            double s = 1.0, ds = 0.0;
            if (d->shared_expert_gated) {
                double l = 0.0, A = 0.0;
                for (int64_t j = 0; j < H; j++) {
                    l += (double)x[t * H + j] * L.sgate[j];
                    A += fabs((double)x[t * H + j] * L.sgate[j]);
                }
                s = 1.0 / (1.0 + exp(-l));
                ds = 0.25 * gamma_n((double)H) * A + 4.0 * u;
            }
            for (int64_t j = 0; j < H; j++) {
                acc[j] += s * y[j];
                eacc[j] += s * ey[j] + ds * (fabs(y[j]) + ey[j]);
                mag[j] += (s + ds) * (fabs(y[j]) + ey[j]);
            }
        }
        if (L.obias) /* added last, one f32 add (moe.h: after the routed sum and the shared expert) */
            for (int64_t j = 0; j < H; j++) {
                acc[j] += L.obias[j];
                mag[j] += fabs(L.obias[j]);
            }
        for (int64_t j = 0; j < H; j++) /* the bound of the output before any norm */
            eacc[j] = eacc[j] + gamma_n((double)(K + 3)) * mag[j];
        if (L.onorm) {
            /* n_j = w_j acc_j / R, R = sqrt(sum acc^2 / H + eps). The computed sum is acc + d,
             * |d_j| <= B_j (eacc above): its rms moves by at most D = ||B||_2 / sqrt(H), so
             * |1/R' - 1/R| <= D / (R (R - D)); the norm's own rounding (H fmaf terms, the
             * division, the add, sqrtf, the reciprocal and two products) is below
             * gamma(H + 8) relative to |w_j| (|acc_j| + B_j) / (R - D) */
            double ss = 0.0, sb = 0.0;
            for (int64_t j = 0; j < H; j++)
                ss += acc[j] * acc[j], sb += eacc[j] * eacc[j];
            const double R = sqrt(ss / (double)H + (double)d->output_norm_eps), D = sqrt(sb / (double)H);
            if (!(R > 2.0 * D))
                fail_msg("%s: the output norm's bound needs R > 2 D (R %g, D %g)", moe_family_name(fam), R, D);
            for (int64_t j = 0; j < H; j++) {
                const double w = fabs((double)L.onorm[j]), a = fabs(acc[j]), bj = eacc[j];
                acc[j] = (double)L.onorm[j] * acc[j] / R;
                eacc[j] = w * (bj / R + a * D / (R * (R - D))) + gamma_n((double)(H + 8)) * w * (a + bj) / (R - D);
            }
        }
        for (int64_t j = 0; j < H; j++) {
            const double bound = eacc[j];
            const double err = fabs((double)out[1][t * H + j] - acc[j]);
            if (!(err <= bound))
                fail_msg("%s %s weights: output[%lld][%lld] = %.9g, exact %.9g: error %.3e above the bound %.3e",
                         moe_family_name(fam), moe_dtype_name(wdt), (long long)t, (long long)j,
                         (double)out[1][t * H + j], acc[j], err, bound);
            *worst_ratio = fmax(*worst_ratio, err / bound);
            *worst_rel = fmax(*worst_rel, err / (b * (fabs(acc[j]) + 1e-30)));
        }
    }
    free(xin), free(y), free(ey), free(acc), free(eacc), free(mag), free(x);
    free(L.router), free(L.rbias), free(L.sbias), free(L.wg), free(L.wu), free(L.wd), free(L.g_src);
    free(L.u_src), free(L.d_src), free(L.bg), free(L.bu), free(L.bd), free(L.sg), free(L.su), free(L.sd);
    free(L.sgate), free(L.sg_src), free(L.su_src), free(L.sd_src), free(L.obias), free(L.onorm);
}

static void test_bound_every_family(void **state)
{
    (void)state;
    for (int f = MOE_FAMILY_MIXTRAL; f < 128; f++) { /* every row; the values may leave gaps */
        if (strcmp(moe_family_name((moe_family)f), "?") == 0)
            continue;
        for (int wi = 0; wi < 2; wi++) {
            const moe_dtype wdt = wi ? MOE_DTYPE_F32 : MOE_DTYPE_BF16;
            double ratio = 0.0, rel = 0.0;
            check_bound((moe_family)f, wdt, &ratio, &rel);
            print_message("%-12s %-4s weights: worst error / bound %.3f\n", moe_family_name((moe_family)f),
                          moe_dtype_name(wdt), ratio);
        }
    }
}

/* The compute mode is part of the plan: bf16 plans add "compute=bf16;" to the text (so the
 * hash differs), f32 plans keep the text moe_plan_create always gave; bad values are refused. */
static void test_plan_identity(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = 32;
    d.moe_intermediate_size = 16;
    d.num_experts = 8;
    d.top_k = 2;
    moe_plan *p0 = NULL, *p32 = NULL, *p16 = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &p0), MOE_OK);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    assert_int_equal(cfg.compute, MOE_COMPUTE_F32);
    assert_int_equal(moe_plan_create_ex(ctx, &d, &cfg, &p32), MOE_OK);
    cfg.compute = MOE_COMPUTE_BF16;
    assert_int_equal(moe_plan_create_ex(ctx, &d, &cfg, &p16), MOE_OK);
    assert_string_equal(moe_plan_text(p0), moe_plan_text(p32));
    assert_null(strstr(moe_plan_text(p32), "compute="));
    char want[8192];
    snprintf(want, sizeof want, "%scompute=bf16;", moe_plan_text(p32));
    assert_string_equal(moe_plan_text(p16), want);
    assert_true(moe_plan_hash(p16) != moe_plan_hash(p32));
    assert_int_equal(moe_plan_compute(p16), MOE_COMPUTE_BF16);
    assert_int_equal(moe_plan_compute(p0), MOE_COMPUTE_F32);
    moe_plan_free(p0), moe_plan_free(p32), moe_plan_free(p16);
    /* refusals, named */
    moe_plan *bad = NULL;
    cfg.compute = (moe_compute)7;
    const char *subs_range[] = {"compute = 7", NULL};
    tu_check_error(ctx, moe_plan_create_ex(ctx, &d, &cfg, &bad), MOE_EINVAL, subs_range);
    cfg.compute = MOE_COMPUTE_BF16;
    assert_int_equal(moe_quant_from_name("int8-w8a8", &d.quant), MOE_OK);
    const char *subs_w8a8[] = {"compute bf16", "int8-w8a8", "compute f32", NULL};
    tu_check_error(ctx, moe_plan_create_ex(ctx, &d, &cfg, &bad), MOE_EUNSUPPORTED, subs_w8a8);
    d.hidden_size = 256;
    d.moe_intermediate_size = 256;
    assert_int_equal(moe_quant_from_name("fp8-block", &d.quant), MOE_OK);
    d.quant.w13.block_k = d.quant.w2.block_k = 65; /* odd blocks along K split bf16 pairs */
    d.quant.w13.block_n = d.quant.w2.block_n = 64;
    const char *subs_odd[] = {"scale groups of 65", "compute f32", NULL};
    tu_check_error(ctx, moe_plan_create_ex(ctx, &d, &cfg, &bad), MOE_EUNSUPPORTED, subs_odd);
    assert_null(bad);
    /* names */
    moe_compute c;
    assert_int_equal(moe_compute_from_name("bf16", &c), MOE_OK);
    assert_int_equal(c, MOE_COMPUTE_BF16);
    assert_int_equal(moe_compute_from_name("f32", &c), MOE_OK);
    assert_int_equal(c, MOE_COMPUTE_F32);
    assert_int_equal(moe_compute_from_name("fp32", &c), MOE_EINVAL);
    assert_int_equal(moe_compute_from_name(NULL, &c), MOE_EINVAL);
    assert_string_equal(moe_compute_name(MOE_COMPUTE_BF16), "bf16");
    assert_string_equal(moe_compute_name((moe_compute)9), "?");
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_dp_against_hardware),
        cmocka_unit_test(test_pair_kernels),
        cmocka_unit_test(test_bound_every_family),
        cmocka_unit_test(test_plan_identity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
