/* Compute bf16 on AVX-512 without vdpbf16ps (table "avx512"; also the row rounder of
 * "avx512_bf16", which extends this table): the same bits as src/gemm/linear_bf16_ref.c.
 * Each vdpbf16ps half is one vfmadd under MXCSR FTZ|DAZ (core/bf16.h moe_bf16_dp: the product
 * of two bf16 is exact, the add rounds once, DAZ reads denormal operands as zero, FTZ flushes
 * tiny results; checked against the instruction by test_bf16.c), so the pair panels are split
 * into their odd and even bf16 (each exact as f32: the half as the high bits) and run two
 * fmadds per pair, odd first. The kernel sets FTZ|DAZ for its own duration and restores the
 * caller's MXCSR. Tiles of 12 rows x 2 panels (5 rows x 4 below 6 rows): the weight split (2
 * ops a panel step) is shared by 12 rows, the activations come as broadcast loads from an L1
 * copy of their halves, and the caller's next weights are prefetched (one line a step,
 * moe_format.prefetch). One fmadd per product: where vdpbf16ps issues at half the vfmadd rate
 * this is the faster form (the avx512_bf16 row measures which, init_avx512_bf16.c). */
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

/* Pairs of K per block of the expanded activations below (2 x 12 x 256 floats, 24 kB, in L1). */
#define XB_PAIRS 256
/* Rows of the largest tile (with 2 panels: 24 accumulators). */
#define TILE_ROWS 12

/* The caller's prefetch region (gemm/kernels.h moe_linear_rows_fn's pf, pf_bytes: the
 * weights its next call reads), walked one 64-byte line per pair step over the tiles in order
 * until covered. */
typedef struct prefetch_walk {
    const uint8_t *at, *end;
} prefetch_walk;

/* A tile of NP panels (from panel p) by MB rows. The MB activation rows are expanded, a block
 * of XB_PAIRS pairs at a time, into their odd and even halves as f32 (each bf16 exact as the
 * high bits of an f32), so the activations reach the fmadds as broadcast loads from L1, not
 * shuffles. Per pair step the NP panels' 16 pairs are split into odd (high half) and even (low
 * half shifted up) f32 vectors, then per row two broadcasts and two fmadds per panel, odd
 * first. Registers: MB x NP accumulators, 2 NP weight halves, 2 broadcasts, the mask (at most
 * 31 of 32 for the shapes the driver uses: 12 x 2, 5 x 4). */
MOE_AI void tile(const moe_pmat *w, int64_t p, int64_t p0, const int NP, const int MB, const uint8_t *const *x,
                 float *out, int64_t ldo, prefetch_walk *pw)
{
    const int64_t K2 = (w->k + 1) / 2;
    const uint32_t *d = w->data;
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    float xo[TILE_ROWS][XB_PAIRS] __attribute__((aligned(64))); /* [row][pair of the block]: odd halves */
    float xe[TILE_ROWS][XB_PAIRS] __attribute__((aligned(64))); /* [row][pair of the block]: even halves */
    __m512 acc[4][TILE_ROWS]; /* [panel][row] */
    const uint32_t *wp[4];    /* each panel's [K2][nw] pairs */
    int nw[4];
    __mmask16 mask[4];
    for (int j = 0; j < NP; j++) {
        nw[j] = moe_pmat_panel_width(w->n, p + j);
        wp[j] = d + (p + j) * MOE_PANEL * K2;
        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
        for (int m = 0; m < MB; m++)
            acc[j][m] = _mm512_setzero_ps();
    }
    for (int64_t i0 = 0; i0 < K2; i0 += XB_PAIRS) {
        const int64_t nb = K2 - i0 < XB_PAIRS ? K2 - i0 : XB_PAIRS; /* pairs in this block */
        for (int m = 0; m < MB; m++)
            for (int64_t i = 0; i < nb; i += 16) {
                const __mmask16 mk = (__mmask16)(nb - i >= 16 ? 0xffffu : (1u << (nb - i)) - 1u);
                const __m512i v = _mm512_maskz_loadu_epi32(mk, x[m] + 4 * (i0 + i)); /* 16 pairs of row m */
                _mm512_store_ps(&xo[m][i], _mm512_castsi512_ps(_mm512_and_si512(v, hi)));
                _mm512_store_ps(&xe[m][i], _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
            }
        for (int64_t i = 0; i < nb; i++) {
            __m512 wo[4], we[4];
            if (pw->at < pw->end) { /* one line of the next weights per step (into L2) */
                _mm_prefetch((const char *)pw->at, _MM_HINT_T1);
                pw->at += 64;
            }
            for (int j = 0; j < NP; j++) {
                const __m512i v = _mm512_maskz_loadu_epi32(mask[j], wp[j] + (i0 + i) * nw[j]);
                wo[j] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
                we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            }
            for (int m = 0; m < MB; m++) {
                const __m512 bo = _mm512_set1_ps(xo[m][i]), be = _mm512_set1_ps(xe[m][i]);
                for (int j = 0; j < NP; j++)
                    acc[j][m] = _mm512_fmadd_ps(bo, wo[j], acc[j][m]);
                for (int j = 0; j < NP; j++)
                    acc[j][m] = _mm512_fmadd_ps(be, we[j], acc[j][m]);
            }
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            _mm512_mask_storeu_ps(out + m * ldo + (p + j - p0) * MOE_PANEL, mask[j], acc[j][m]);
}

/* MB rows against panels [p0, p1): 2 panels a tile from 6 rows up, 4 below (registers). */
MOE_AI void rows_tiles(const moe_pmat *w, int64_t p0, int64_t p1, const int MB, const uint8_t *const *x, float *out,
                       int64_t ldo, prefetch_walk *pw)
{
    int64_t p = p0;
    if (MB <= 5)
        for (; p + 4 <= p1; p += 4)
            tile(w, p, p0, 4, MB, x, out, ldo, pw);
    for (; p + 2 <= p1; p += 2)
        tile(w, p, p0, 2, MB, x, out, ldo, pw);
    for (; p < p1; p++)
        tile(w, p, p0, 1, MB, x, out, ldo, pw);
}

void moe_ukr_bf16p_rows_avx512_12x32(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                    const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                    int64_t pf_bytes)
{
    (void)xs;
    prefetch_walk pw = {.at = pf, .end = pf ? (const uint8_t *)pf + pf_bytes : NULL};
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ (bit 15) and DAZ (bit 6) */
    for (int m0 = 0; m0 < mb; m0 += TILE_ROWS) {
        const int rows = mb - m0 >= TILE_ROWS ? TILE_ROWS : mb - m0;
        const uint8_t *const *xr = xq + m0;
        float *o = out + (int64_t)m0 * ldo;
        switch (rows) {
        case 12: rows_tiles(w, p0, p1, 12, xr, o, ldo, &pw); break;
        case 11: rows_tiles(w, p0, p1, 11, xr, o, ldo, &pw); break;
        case 10: rows_tiles(w, p0, p1, 10, xr, o, ldo, &pw); break;
        case 9: rows_tiles(w, p0, p1, 9, xr, o, ldo, &pw); break;
        case 8: rows_tiles(w, p0, p1, 8, xr, o, ldo, &pw); break;
        case 7: rows_tiles(w, p0, p1, 7, xr, o, ldo, &pw); break;
        case 6: rows_tiles(w, p0, p1, 6, xr, o, ldo, &pw); break;
        case 5: rows_tiles(w, p0, p1, 5, xr, o, ldo, &pw); break;
        case 4: rows_tiles(w, p0, p1, 4, xr, o, ldo, &pw); break;
        case 3: rows_tiles(w, p0, p1, 3, xr, o, ldo, &pw); break;
        case 2: rows_tiles(w, p0, p1, 2, xr, o, ldo, &pw); break;
        default: rows_tiles(w, p0, p1, 1, xr, o, ldo, &pw); break;
        }
    }
    _mm_setcsr(csr);
}
