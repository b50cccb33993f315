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
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/cpu.h"
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
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
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
        assert_int_equal(moe_bf16_round(f32_of(edge[i])), round_by_distance(f32_of(edge[i])));
    for (int i = 0; i < 2000000; i++) {
        const uint32_t u = (uint32_t)rnd();
        const float f = f32_of(u);
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
            acc = f32_of((uint32_t)rnd() & (mode == 1 ? 0x80ffffffu : 0xffffffffu));
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
        const float acc = f32_of(au), want = emu_dp(acc, a1, b1, 0x8000, 0x3f80);
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
            v = ldexpf(v, -60 - (int)(rnd() % 10)) + (rnd() % 7 == 0 ? f32_of((uint32_t)rnd() & 0x807fffffu) : 0.0f);
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
    const moe_kernels *tables[16];
    const size_t nt = tu_tables(tables, 16);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round),
        cmocka_unit_test(test_dp_against_hardware),
        cmocka_unit_test(test_pair_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
