/* AVX-512 W8A8 int8 kernels (AVX512-VNNI vpdpbusd) of table "avx512": the same bits as
 * src/gemm/linear_q_ref.c.
 *
 *  - moe_quant_row_i8_avx512: one activation row -> u8 codes q + 128 and its scale, the rule
 *    of moe_quant.h (vector absmax, then one vdivps per 16 elements: the scalar division's bits).
 *  - moe_ukr_w8a8_rows_avx512_6x64: the GEMM on quantized rows. Tiles of 6 rows x 4 panels keep
 *    24 zmm int32 accumulators in registers over all of K (no overflow for K <= 65536, which
 *    moe_quant.h enforces); per k4 step 4 weight loads and 6 broadcast 4-byte activation groups.
 *    vpdpbusd multiplies u8 (q + 128) by s8 w, so 128 * sum_k w[n][k] (packed as comp) is
 *    subtracted: exactly the ref's int32 sum_k q[k] w[n][k]. Epilogue straight to f32:
 *    out = ((float)(acc - comp) * s_x) * s_w. One prefetcht1 per k4 step walks the caller's
 *    next weights (the pf hint) into L2 so the DRAM stream overlaps the arithmetic.
 * The table's init (init_avx512.c) installs the GEMM only when the features report VNNI
 * (MOE_CAP_VNNI); without it the ref entries run (identical bits). linear on f32 rows stays the
 * ref's: the grouped driver quantizes rows itself (gemm/grouped.c). */
#include "gemm/avx512/avx512.h"
#include "quant/quant.h"

#include <immintrin.h>

#define W8A8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

/* ---- activation rows ---- */

void moe_quant_row_i8_avx512(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales)
{
    (void)G; /* one scale per row */
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const __m512 vm = _mm512_set1_ps(mul ? *mul : 1.0f);
    /* pass 1: a = max |v| over the row. _mm512_max_ps(v, a) is (v > a ? v : a), so a NaN |v|
     * keeps a, exactly the scalar loop; a never holds NaN, so the lane order of the final
     * reduction cannot change the result (max of non-NaN values, +0 only). */
    __m512 va = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 mk = (__mmask16)(n - k >= 16 ? 0xffffu : (1u << (n - k)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(mk, x + k); /* masked-out lanes 0: no effect */
        if (mul)
            v = _mm512_mul_ps(vm, v);
        va = _mm512_max_ps(_mm512_andnot_ps(sign, v), va);
    }
    const float a = _mm512_reduce_max_ps(va);
    const float s = a == 0.0f ? 1.0f : a / 127.0f;
    /* pass 2: q = rint(clamp(v / s, -127, 127)) + 128. max(NaN, -127) = -127 as the ref;
     * cvtps rounds to nearest even (MXCSR default), as nearbyintf. In place: the 16 bytes
     * written at k lie within floats 0 .. k/4 + 3 <= k + 15, all read by now. */
    const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i off = _mm512_set1_epi32(128);
    for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 mk = (__mmask16)(n - k >= 16 ? 0xffffu : (1u << (n - k)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(mk, x + k);
        if (mul)
            v = _mm512_mul_ps(vm, v);
        __m512 qf = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v, vs), lo), hi);
        __m512i qi = _mm512_add_epi32(_mm512_cvtps_epi32(qf), off);
        _mm512_mask_cvtepi32_storeu_epi8(dst + k, mk, qi);
    }
    for (int64_t k = n; k % 4; k++)
        dst[k] = 128;
    scales[0] = s;
}

/* ---- the GEMM ---- */

enum { MR = 6, NR = 4 }; /* rows x panels per register tile */

/* One MB x NP tile (MB <= 6, NP <= 4, compile-time constants) over all of K:
 * out[m][16 j + c] for row m, panel j. The accumulators are named variables a<m>_<j>, not an
 * array: GCC 12 keeps a [6][4] array of zmm in memory (a store per vpdpbusd), named
 * variables stay in 24 registers (unused ones are removed). */
W8A8_TARGET static inline __attribute__((always_inline)) void
vnni_tile(const uint8_t *const *xq, const float *const *xs, const uint8_t *const *wp, const int64_t *wst,
          const __mmask16 *mk, const int32_t *const *comp, const float *const *sw, int64_t k4n, float *out,
          int64_t ldo, const uint8_t *pf, int64_t pf_last, const int MB, const int NP)
{
    const __m512i z = _mm512_setzero_si512();
    __m512i a0_0 = z, a0_1 = z, a0_2 = z, a0_3 = z, a1_0 = z, a1_1 = z, a1_2 = z, a1_3 = z;
    __m512i a2_0 = z, a2_1 = z, a2_2 = z, a2_3 = z, a3_0 = z, a3_1 = z, a3_2 = z, a3_3 = z;
    __m512i a4_0 = z, a4_1 = z, a4_2 = z, a4_3 = z, a5_0 = z, a5_1 = z, a5_2 = z, a5_3 = z;
    const uint8_t *w0 = wp[0], *w1 = NP > 1 ? wp[1] : wp[0], *w2 = NP > 2 ? wp[2] : wp[0], *w3 = NP > 3 ? wp[3] : wp[0];
    const int64_t s0 = wst[0], s1 = NP > 1 ? wst[1] : 0, s2 = NP > 2 ? wst[2] : 0, s3 = NP > 3 ? wst[3] : 0;
    const __mmask16 k0 = mk[0], k1 = NP > 1 ? mk[1] : 0, k2 = NP > 2 ? mk[2] : 0, k3 = NP > 3 ? mk[3] : 0;
    const uint8_t *x0 = xq[0], *x1 = MB > 1 ? xq[1] : xq[0], *x2 = MB > 2 ? xq[2] : xq[0];
    const uint8_t *x3 = MB > 3 ? xq[3] : xq[0], *x4 = MB > 4 ? xq[4] : xq[0], *x5 = MB > 5 ? xq[5] : xq[0];
    for (int64_t k4 = 0; k4 < k4n; k4++) {
        /* one 64-byte line of the caller's next region per step, up to its last line */
        _mm_prefetch((const char *)(pf + (64 * k4 < pf_last ? 64 * k4 : pf_last)), _MM_HINT_T1);
        /* panel j, k4 group: [nw][4] bytes */
        const __m512i v0 = _mm512_maskz_loadu_epi32(k0, w0 + k4 * s0);
        const __m512i v1 = NP > 1 ? _mm512_maskz_loadu_epi32(k1, w1 + k4 * s1) : z;
        const __m512i v2 = NP > 2 ? _mm512_maskz_loadu_epi32(k2, w2 + k4 * s2) : z;
        const __m512i v3 = NP > 3 ? _mm512_maskz_loadu_epi32(k3, w3 + k4 * s3) : z;
        /* row m: 4 consecutive u8 broadcast, times the NP weight vectors */
#define MOE_ROW(m)                                                                                              \
    if (MB > m) {                                                                                               \
        int32_t xv;                                                                                             \
        __builtin_memcpy(&xv, x##m + 4 * k4, 4);                                                                \
        const __m512i b = _mm512_set1_epi32(xv);                                                                \
        a##m##_0 = _mm512_dpbusd_epi32(a##m##_0, b, v0);                                                        \
        if (NP > 1)                                                                                             \
            a##m##_1 = _mm512_dpbusd_epi32(a##m##_1, b, v1);                                                    \
        if (NP > 2)                                                                                             \
            a##m##_2 = _mm512_dpbusd_epi32(a##m##_2, b, v2);                                                    \
        if (NP > 3)                                                                                             \
            a##m##_3 = _mm512_dpbusd_epi32(a##m##_3, b, v3);                                                    \
    }
        MOE_ROW(0) MOE_ROW(1) MOE_ROW(2) MOE_ROW(3) MOE_ROW(4) MOE_ROW(5)
#undef MOE_ROW
    }
    /* The sums go through a small buffer to the epilogue: computing the epilogue straight
     * from the 24 registers makes GCC 12 spill accumulators inside the K loop. */
    int32_t acc[MR][NR * MOE_PANEL] __attribute__((aligned(64))); /* [row][panel j * 16 + c] */
#define MOE_ROW_STORE(m)                                                                                        \
    if (MB > m) {                                                                                               \
        _mm512_store_si512(&acc[m][0], a##m##_0);                                                               \
        if (NP > 1)                                                                                             \
            _mm512_store_si512(&acc[m][MOE_PANEL], a##m##_1);                                                   \
        if (NP > 2)                                                                                             \
            _mm512_store_si512(&acc[m][2 * MOE_PANEL], a##m##_2);                                               \
        if (NP > 3)                                                                                             \
            _mm512_store_si512(&acc[m][3 * MOE_PANEL], a##m##_3);                                               \
    }
    MOE_ROW_STORE(0) MOE_ROW_STORE(1) MOE_ROW_STORE(2) MOE_ROW_STORE(3) MOE_ROW_STORE(4) MOE_ROW_STORE(5)
#undef MOE_ROW_STORE
    for (int j = 0; j < NP; j++) {
        const __m512i c = _mm512_maskz_loadu_epi32(mk[j], comp[j]);
        const __m512 s = _mm512_maskz_loadu_ps(mk[j], sw[j]);
        for (int m = 0; m < MB; m++) {
            const __m512i a = _mm512_sub_epi32(_mm512_load_si512(&acc[m][j * MOE_PANEL]), c);
            const __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(xs[m][0])), s);
            _mm512_mask_storeu_ps(out + m * ldo + j * MOE_PANEL, mk[j], r);
        }
    }
}

/* One function per tile shape (each compiled on its own keeps the 24 accumulators in
 * registers), called through tiles[MB - 1][NP - 1]. */
typedef void (*tile_fn)(const uint8_t *const *xq, const float *const *xs, const uint8_t *const *wp, const int64_t *wst,
                        const __mmask16 *mk, const int32_t *const *comp, const float *const *sw, int64_t k4n,
                        float *out, int64_t ldo, const uint8_t *pf, int64_t pf_last);
#define MOE_TILE_FN(mbv, npv)                                                                                   \
    W8A8_TARGET __attribute__((noinline)) static void tile_##mbv##x##npv(                                      \
        const uint8_t *const *xq, const float *const *xs, const uint8_t *const *wp, const int64_t *wst,       \
        const __mmask16 *mk, const int32_t *const *comp, const float *const *sw, int64_t k4n, float *out,     \
        int64_t ldo, const uint8_t *pf, int64_t pf_last)                                                        \
    {                                                                                                           \
        vnni_tile(xq, xs, wp, wst, mk, comp, sw, k4n, out, ldo, pf, pf_last, mbv, npv);                         \
    }
MOE_TILE_FN(1, 1) MOE_TILE_FN(1, 2) MOE_TILE_FN(1, 3) MOE_TILE_FN(1, 4)
MOE_TILE_FN(2, 1) MOE_TILE_FN(2, 2) MOE_TILE_FN(2, 3) MOE_TILE_FN(2, 4)
MOE_TILE_FN(3, 1) MOE_TILE_FN(3, 2) MOE_TILE_FN(3, 3) MOE_TILE_FN(3, 4)
MOE_TILE_FN(4, 1) MOE_TILE_FN(4, 2) MOE_TILE_FN(4, 3) MOE_TILE_FN(4, 4)
MOE_TILE_FN(5, 1) MOE_TILE_FN(5, 2) MOE_TILE_FN(5, 3) MOE_TILE_FN(5, 4)
MOE_TILE_FN(6, 1) MOE_TILE_FN(6, 2) MOE_TILE_FN(6, 3) MOE_TILE_FN(6, 4)
#undef MOE_TILE_FN
static const tile_fn tiles[MR][NR] = {
    {tile_1x1, tile_1x2, tile_1x3, tile_1x4}, {tile_2x1, tile_2x2, tile_2x3, tile_2x4},
    {tile_3x1, tile_3x2, tile_3x3, tile_3x4}, {tile_4x1, tile_4x2, tile_4x3, tile_4x4},
    {tile_5x1, tile_5x2, tile_5x3, tile_5x4}, {tile_6x1, tile_6x2, tile_6x3, tile_6x4},
};

W8A8_TARGET void moe_ukr_w8a8_rows_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1,
                                               const uint8_t *const *xq, const float *const *xs, int mb, float *out,
                                               int64_t ldo, const void *pf, int64_t pf_bytes)
{
    const struct moe_qmat *q = w->q;
    const int64_t K4 = (w->k + 3) / 4 * 4, k4n = K4 / 4;
    const uint8_t *d = w->data;
    /* the prefetch region, one line per k4 step spread over the tiles in order; without one
     * (or once it is covered) every step prefetches a line of the panels in use (in L1) */
    const uint8_t *pfb = pf_bytes > 0 ? (const uint8_t *)pf : d + p0 * 16 * K4;
    const int64_t pf_last = pf_bytes > 64 ? (pf_bytes - 1) / 64 * 64 : 0; /* offset of its last line */
    int64_t pf_at = 0;                                                     /* next tile's first line */
    /* panels outer, rows inner: the NP panels' weights (NP * 16 * K4 bytes) are reused from
     * L1/L2 by every row tile */
    for (int64_t pb = p0; pb < p1; pb += NR) {
        const int NP = p1 - pb >= NR ? NR : (int)(p1 - pb);
        const uint8_t *wp[NR];
        int64_t wst[NR];
        __mmask16 mk[NR];
        const int32_t *comp[NR];
        const float *sw[NR];
        for (int j = 0; j < NP; j++) {
            const int nw = moe_pmat_panel_width(w->n, pb + j);
            wp[j] = d + (pb + j) * 16 * K4; /* [K4/4][nw][4] */
            wst[j] = 4 * nw;
            mk[j] = (__mmask16)((1u << nw) - 1u);
            comp[j] = q->comp + (pb + j) * MOE_PANEL;
            sw[j] = q->scale + (pb + j) * MOE_PANEL;
        }
        float *ob = out + (pb - p0) * MOE_PANEL;
        for (int m0 = 0; m0 < mb; m0 += MR) {
            const int MB = mb - m0 >= MR ? MR : mb - m0;
            tiles[MB - 1][NP - 1](xq + m0, xs + m0, wp, wst, mk, comp, sw, k4n, ob + m0 * ldo, ldo, pfb + pf_at,
                                  pf_last - pf_at);
            pf_at = pf_at + 64 * k4n < pf_last ? pf_at + 64 * k4n : pf_last;
        }
    }
}
