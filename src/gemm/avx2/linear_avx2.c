/* AVX2 linear microkernels for plain f32 / bf16 / f16 weights (table "avx2"), 6 rows by one
 * panel of 16 features (fewer rows: 2 panels; moe_ukr_<dtype>_avx2_6x16). Same contract and
 * bits as linear_ref.c: every output
 * element is accumulated in increasing k from +0.0f with one fused multiply-add per term. A panel's 16
 * features are two 8-lane halves. A partial last panel goes through the scalar reference
 * kernel (identical bits), since AVX2 has no masked 16-bit loads. */
#include "gemm/avx2/avx2.h"

#include <immintrin.h>

#define MOE_AI static inline __attribute__((always_inline))

MOE_AI __m256 load8(const void *base, moe_dtype dt, int64_t idx)
{
    if (dt == MOE_DTYPE_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (dt == MOE_DTYPE_F16) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + idx));
        return _mm256_cvtph_ps(h);
    }
    return _mm256_loadu_ps((const float *)base + idx);
}

/* NP full panels (starting at p) by MB rows; 2 * NP * MB accumulators. */
MOE_AI void tile(const moe_pmat *w, moe_dtype dt, int64_t p, int64_t p0, const int NP, const int MB,
                 const float *const *x, float *out, int64_t ldo)
{
    const int64_t K = w->k;
    __m256 acc[2][2][6];
    for (int j = 0; j < NP; j++)
        for (int h = 0; h < 2; h++)
            for (int m = 0; m < MB; m++)
                acc[j][h][m] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < K; kk++) {
        __m256 wv[2][2];
        for (int j = 0; j < NP; j++)
            for (int h = 0; h < 2; h++)
                wv[j][h] = load8(w->data, dt, (p + j) * MOE_PANEL * K + kk * MOE_PANEL + h * 8);
        for (int m = 0; m < MB; m++) {
            __m256 xb = _mm256_set1_ps(x[m][kk]);
            for (int j = 0; j < NP; j++)
                for (int h = 0; h < 2; h++)
                    acc[j][h][m] = _mm256_fmadd_ps(xb, wv[j][h], acc[j][h][m]);
        }
    }
    for (int j = 0; j < NP; j++)
        for (int h = 0; h < 2; h++)
            for (int m = 0; m < MB; m++)
                _mm256_storeu_ps(out + m * ldo + (p + j - p0) * MOE_PANEL + h * 8, acc[j][h][m]);
}

MOE_AI void linear_dt(const moe_pmat *w, moe_dtype dt, int64_t p0, int64_t p1, const float *const *x,
                      int mb, float *out, int64_t ldo)
{
    /* full panels are [p0, pf); a partial last panel, if any, is pf */
    int64_t pf = p1;
    if (p1 > p0 && moe_pmat_panel_width(w->n, p1 - 1) < MOE_PANEL)
        pf = p1 - 1;
    int m0 = 0;
    while (m0 < mb) {
        int rows = mb - m0;
        const float *const *xr = x + m0;
        float *o = out + (int64_t)m0 * ldo;
        int64_t p = p0;
        if (rows >= 6) {
            for (; p < pf; p++)
                tile(w, dt, p, p0, 1, 6, xr, o, ldo);
            m0 += 6;
            continue;
        }
#define MOE_ROWS_CASE(R, NPB)                                    \
    case R:                                                      \
        for (; p + NPB <= pf; p += NPB)                          \
            tile(w, dt, p, p0, NPB, R, xr, o, ldo);              \
        for (; p < pf; p++)                                      \
            tile(w, dt, p, p0, 1, R, xr, o, ldo);                \
        break;
        switch (rows) {
            MOE_ROWS_CASE(1, 2)
            MOE_ROWS_CASE(2, 2)
            MOE_ROWS_CASE(3, 1)
            MOE_ROWS_CASE(4, 1)
            MOE_ROWS_CASE(5, 1)
        default:
            break;
        }
#undef MOE_ROWS_CASE
        m0 = mb;
    }
    if (pf < p1) /* the partial last panel: the scalar kernel (MOE_WF_* bits in the table's tail_ref) */
        moe_ukr_plain_ref(w, pf, p1, x, mb, out + (pf - p0) * MOE_PANEL, ldo);
}

void moe_ukr_f32_avx2_6x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                           int64_t ldo)
{
    linear_dt(w, MOE_DTYPE_F32, p0, p1, x, mb, out, ldo);
}

void moe_ukr_bf16_avx2_6x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    linear_dt(w, MOE_DTYPE_BF16, p0, p1, x, mb, out, ldo);
}

void moe_ukr_f16_avx2_6x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                           int64_t ldo)
{
    linear_dt(w, MOE_DTYPE_F16, p0, p1, x, mb, out, ldo);
}
