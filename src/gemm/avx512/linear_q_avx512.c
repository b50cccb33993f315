/* AVX-512 kernels for quantized weights (linear_q of table "avx512"); the same bits as
 * src/gemm/linear_q_ref.c.
 *  - Weight-only (fp8 e4m3, int8, int4, mxfp4): 16 codes of a panel row decoded to f32
 *    exactly, times the f32 scale (minus the zero point first), then vfmadd in increasing k:
 *    the f32 contract of linear_avx512.c on the dequantized weights.
 *  - W8A8 int8: w8a8_avx512.c. */
#include "core/kernels.h"
#include "quant/quant.h"

#include <immintrin.h>

#define MOE_AI static inline __attribute__((always_inline))

/* 16 codes (nw valid) of row kk of panel base -> f32 code values (before scale). */
MOE_AI __m512 decode16(int kind, int zp, const uint8_t *row, int rb, __mmask16 mask)
{
    if (kind == MOE_QK_F8) {
        __m512i v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, row));
        __m512i m = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
        __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
        __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(m, 20)), _mm512_set1_ps(0x1p120f));
        __m512i bits = _mm512_or_si512(_mm512_castps_si512(f), sign);
        __mmask16 nan = _mm512_cmpeq_epi32_mask(m, _mm512_set1_epi32(0x7f));
        bits = _mm512_mask_mov_epi32(bits, nan, _mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000)));
        return _mm512_castsi512_ps(bits);
    }
    if (kind == MOE_QK_I8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, row)));
    /* 4-bit: rb bytes, low nibble first. Each byte to two dword lanes, the high nibble
     * shifted down; vpermps reads only the index's low 4 bits, so the nibble goes straight
     * through a 16-entry table of its exact value (no mask, no int->float conversion). */
    __m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << rb) - 1u), row);
    __m512i v = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    v = _mm512_srlv_epi32(v, _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
    const __m512 lut = kind == MOE_QK_FP4
                           ? _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                                            -2.0f, -3.0f, -4.0f, -6.0f)
                       : zp ? _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f,
                                             12.0f, 13.0f, 14.0f, 15.0f)
                            : _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, -8.0f, -7.0f, -6.0f, -5.0f,
                                             -4.0f, -3.0f, -2.0f, -1.0f);
    return _mm512_permutexvar_ps(v, lut);
}

/* NP panels from p by MB rows, weight-only. */
MOE_AI void wo_tile(const moe_pmat *w, const int kind, const int zp, int64_t p, int64_t p0, const int NP,
                    const int MB, const float *const *x, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, gk = q->gk, ng = q->ng;
    const uint8_t *d = w->data;
    const int four = kind == MOE_QK_I4 || kind == MOE_QK_FP4;
    __m512 acc[4][4];
    const uint8_t *base[4];
    int nw[4], rs[4];
    __mmask16 mask[4];
    for (int j = 0; j < NP; j++) {
        nw[j] = moe_pmat_panel_width(w->n, p + j);
        rs[j] = four ? (nw[j] + 1) / 2 : nw[j]; /* bytes per panel row */
        base[j] = d + (p + j) * (four ? 8 : 16) * K;
        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
        for (int m = 0; m < MB; m++)
            acc[j][m] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < ng; g++) {
        __m512 sc[4], zr[4];
        for (int j = 0; j < NP; j++) {
            const int64_t si = (p + j) * 16 * ng + g * nw[j];
            sc[j] = _mm512_maskz_loadu_ps(mask[j], q->scale + si);
            zr[j] = zp ? _mm512_maskz_loadu_ps(mask[j], q->zero + si) : _mm512_setzero_ps();
        }
        const int64_t k1 = (g + 1) * gk < K ? (g + 1) * gk : K;
        for (int64_t kk = g * gk; kk < k1; kk++) {
            __m512 wv[4];
            for (int j = 0; j < NP; j++) {
                __m512 v = decode16(kind, zp, base[j] + kk * rs[j], rs[j], mask[j]);
                wv[j] = zp ? _mm512_mul_ps(_mm512_sub_ps(v, zr[j]), sc[j]) : _mm512_mul_ps(v, sc[j]);
            }
            for (int m = 0; m < MB; m++) {
                __m512 xb = _mm512_set1_ps(x[m][kk]);
                for (int j = 0; j < NP; j++)
                    acc[j][m] = _mm512_fmadd_ps(xb, wv[j], acc[j][m]);
            }
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            _mm512_mask_storeu_ps(out + m * ldo + (p + j - p0) * MOE_PANEL, mask[j], acc[j][m]);
}

MOE_AI void wo_linear(const moe_pmat *w, const int kind, const int zp, int64_t p0, int64_t p1,
                      const float *const *x, int mb, float *out, int64_t ldo)
{
    for (int m0 = 0; m0 < mb;) {
        const int rows = mb - m0;
        const float *const *xr = x + m0;
        float *o = out + (int64_t)m0 * ldo;
        int64_t p = p0;
        if (rows >= 4) {
            for (; p + 2 <= p1; p += 2)
                wo_tile(w, kind, zp, p, p0, 2, 4, xr, o, ldo);
            for (; p < p1; p++)
                wo_tile(w, kind, zp, p, p0, 1, 4, xr, o, ldo);
            m0 += 4;
            continue;
        }
#define MOE_QROWS(R)                                         \
    case R:                                                  \
        for (; p + 4 <= p1; p += 4)                          \
            wo_tile(w, kind, zp, p, p0, 4, R, xr, o, ldo);   \
        for (; p < p1; p++)                                  \
            wo_tile(w, kind, zp, p, p0, 1, R, xr, o, ldo);   \
        break;
        switch (rows) {
            MOE_QROWS(1)
            MOE_QROWS(2)
            MOE_QROWS(3)
        default: break;
        }
#undef MOE_QROWS
        m0 = mb;
    }
}

void moe_linear_q_avx512(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                         int64_t ldo)
{
    switch (w->q->kind) {
    case MOE_QK_F8: wo_linear(w, MOE_QK_F8, 0, p0, p1, x, mb, out, ldo); break;
    case MOE_QK_I8: wo_linear(w, MOE_QK_I8, 0, p0, p1, x, mb, out, ldo); break;
    case MOE_QK_FP4: wo_linear(w, MOE_QK_FP4, 0, p0, p1, x, mb, out, ldo); break;
    case MOE_QK_I4:
        if (w->q->zero)
            wo_linear(w, MOE_QK_I4, 1, p0, p1, x, mb, out, ldo);
        else
            wo_linear(w, MOE_QK_I4, 0, p0, p1, x, mb, out, ldo);
        break;
    default:
        moe_linear_w8a8_avx512(w, p0, p1, x, mb, out, ldo);
        break;
    }
}
