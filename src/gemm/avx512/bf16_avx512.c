/* Compute bf16 on AVX-512 without vdpbf16ps (table "avx512"; also the row rounder of
 * "avx512_bf16", which extends this table): the same bits as src/gemm/linear_bf16_ref.c.
 * Each vdpbf16ps half is one vfmadd under MXCSR FTZ|DAZ (core/bf16.h moe_bf16_dp: the product
 * of two bf16 is exact, the add rounds once, DAZ reads denormal operands as zero, FTZ flushes
 * tiny results; checked against the instruction by test_bf16.c), so the pair panels are split
 * into their odd and even bf16 (each exact as f32: the half as the high bits) and run two
 * fmadds per pair, odd first. The kernel sets FTZ|DAZ for its own duration and restores the
 * caller's MXCSR. About the f32 kernels' speed: the same FMA count per weight. */
#include "gemm/avx512/avx512.h"

#include <immintrin.h>
#include <string.h>

#define MOE_AI static inline __attribute__((always_inline))

/* 16 f32 -> 16 bf16 by round to nearest even on the bits (core/bf16.h moe_bf16_round): a NaN
 * keeps its sign and becomes quiet, everything else u + 0x7fff + bit 16 of u, shifted */
MOE_AI __m256i round16(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

void moe_bf16_row_avx512(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales)
{
    (void)G, (void)scales;
    const __m512 vm = _mm512_set1_ps(mul ? *mul : 1.0f);
    /* 16 elements per step: 64 bytes read at 4k, then 32 bytes written at 2k (in place: only
     * bytes already read are overwritten) */
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 mk = (__mmask16)(n - k >= 16 ? 0xffffu : (1u << (n - k)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(mk, x + k);
        if (mul)
            v = _mm512_mul_ps(vm, v);
        _mm256_mask_storeu_epi16(dst + 2 * k, mk, round16(v));
    }
    if (n % 2) { /* the +0 that completes the last pair */
        const uint16_t zero = 0;
        memcpy(dst + 2 * n, &zero, sizeof zero);
    }
}

/* A tile of NP panels (from panel p) by MB rows: per pair step, each panel's 16 pairs split
 * into odd (high half) and even (low half shifted up) f32 vectors, two fmadds per row. */
MOE_AI void tile(const moe_pmat *w, int64_t p, int64_t p0, const int NP, const int MB, const uint8_t *const *x,
                 float *out, int64_t ldo)
{
    const int64_t K2 = (w->k + 1) / 2;
    const uint32_t *d = w->data;
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[4][6];      /* [panel][row] */
    const uint32_t *wp[4]; /* each panel's [K2][nw] pairs */
    int nw[4];
    __mmask16 mask[4];
    for (int j = 0; j < NP; j++) {
        nw[j] = moe_pmat_panel_width(w->n, p + j);
        wp[j] = d + (p + j) * MOE_PANEL * K2;
        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
        for (int m = 0; m < MB; m++)
            acc[j][m] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < K2; i++) {
        __m512 wo[4], we[4];
        for (int j = 0; j < NP; j++) {
            const __m512i v = _mm512_maskz_loadu_epi32(mask[j], wp[j] + i * nw[j]);
            wo[j] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
            we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        }
        for (int m = 0; m < MB; m++) {
            uint32_t pair;
            memcpy(&pair, x[m] + 4 * i, sizeof pair);
            const __m512 xo = _mm512_castsi512_ps(_mm512_set1_epi32((int)(pair & 0xffff0000u)));
            const __m512 xe = _mm512_castsi512_ps(_mm512_set1_epi32((int)(pair << 16)));
            for (int j = 0; j < NP; j++) {
                acc[j][m] = _mm512_fmadd_ps(xo, wo[j], acc[j][m]);
                acc[j][m] = _mm512_fmadd_ps(xe, we[j], acc[j][m]);
            }
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            _mm512_mask_storeu_ps(out + m * ldo + (p + j - p0) * MOE_PANEL, mask[j], acc[j][m]);
}

void moe_ukr_bf16p_rows_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                    const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                    int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ (bit 15) and DAZ (bit 6) */
    int m0 = 0;
    while (m0 < mb) {
        const int rows = mb - m0 >= 6 ? 6 : mb - m0;
        const uint8_t *const *xr = xq + m0;
        float *o = out + (int64_t)m0 * ldo;
        int64_t p = p0;
        switch (rows) {
        case 6:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 6, xr, o, ldo);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 6, xr, o, ldo);
            break;
        case 5:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 5, xr, o, ldo);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 5, xr, o, ldo);
            break;
        case 4:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 4, xr, o, ldo);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 4, xr, o, ldo);
            break;
        case 3:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 3, xr, o, ldo);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 3, xr, o, ldo);
            break;
        case 2:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 2, xr, o, ldo);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 2, xr, o, ldo);
            break;
        default:
            for (; p + 4 <= p1; p += 4)
                tile(w, p, p0, 4, 1, xr, o, ldo);
            for (; p < p1; p++)
                tile(w, p, p0, 1, 1, xr, o, ldo);
            break;
        }
        m0 += rows;
    }
    _mm_setcsr(csr);
}
