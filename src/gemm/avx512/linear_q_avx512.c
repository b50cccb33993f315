/* AVX-512 kernels for quantized weights (linear_q of table "avx512"); the same bits as
 * src/gemm/linear_q_ref.c.
 *  - Weight-only (fp8 e4m3, int8, int4, mxfp4): 16 codes of a panel row decoded to f32
 *    exactly, times the f32 scale (minus the zero point first), then vfmadd in increasing k:
 *    the f32 contract of linear_avx512.c on the dequantized weights.
 *  - W8A8 int8 (AVX512-VNNI vpdpbusd): activations quantized per row (s = absmax / 127) to
 *    u8 = q + 128, weights s8, int32 sums; 128 * sum_k w[n][k] (precomputed) is subtracted,
 *    which gives exactly sum_k q[k] w[n][k]: the ref's int32. Without VNNI at run time the
 *    ref entry runs (identical bits). */
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

/* ---- W8A8 int8 with VNNI ---- */

enum { KC = 1024, PB = 8 }; /* K chunk (bytes of quantized activations per row), panels per block */

/* u8 = q + 128 of x[kc, kc + len) into dst, then zeros (u8 128) up to a multiple of 4. */
static void quant_row(const float *x, int64_t len, float s, uint8_t *dst)
{
    const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    int64_t k = 0;
    for (; k + 16 <= len; k += 16) {
        __m512 qf = _mm512_div_ps(_mm512_loadu_ps(x + k), vs);
        qf = _mm512_min_ps(_mm512_max_ps(qf, lo), hi); /* max(NaN, lo) = lo, as the ref */
        __m512i qi = _mm512_add_epi32(_mm512_cvtps_epi32(qf), _mm512_set1_epi32(128));
        _mm_storeu_si128((__m128i *)(dst + k), _mm512_cvtepi32_epi8(qi));
    }
    for (; k < len; k++)
        dst[k] = (uint8_t)(moe_qact_i8(x[k], s) + 128);
    for (; k % 4; k++)
        dst[k] = 128;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static inline __attribute__((always_inline)) void
vnni_tile(const uint8_t *const *bp, const int *nw, const __mmask16 *mask, const int NP, const int MB,
          const uint8_t (*xq)[KC], int64_t k4n, int32_t (*acc)[PB * MOE_PANEL], int col0)
{
    __m512i a[4][4];
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            a[j][m] = _mm512_loadu_si512(&acc[m][col0 + j * MOE_PANEL]);
    for (int64_t k4 = 0; k4 < k4n; k4++) {
        __m512i wv[4];
        for (int j = 0; j < NP; j++)
            wv[j] = _mm512_maskz_loadu_epi32(mask[j], bp[j] + k4 * nw[j] * 4);
        for (int m = 0; m < MB; m++) {
            int32_t xv;
            __builtin_memcpy(&xv, &xq[m][4 * k4], 4);
            __m512i xb = _mm512_set1_epi32(xv);
            for (int j = 0; j < NP; j++)
                a[j][m] = _mm512_dpbusd_epi32(a[j][m], xb, wv[j]);
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            _mm512_storeu_si512(&acc[m][col0 + j * MOE_PANEL], a[j][m]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void
w8a8_vnni(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, K4 = (K + 3) / 4 * 4;
    const uint8_t *d = w->data;
    uint8_t xq[4][KC] __attribute__((aligned(64)));
    int32_t acc[4][PB * MOE_PANEL] __attribute__((aligned(64)));
    for (int m0 = 0; m0 < mb; m0 += 4) {
        const int MB = mb - m0 < 4 ? mb - m0 : 4;
        float sx[4];
        for (int m = 0; m < MB; m++)
            sx[m] = moe_qact_i8_scale(x[m0 + m], K);
        for (int64_t pb = p0; pb < p1; pb += PB) {
            const int64_t pe = pb + PB < p1 ? pb + PB : p1;
            for (int m = 0; m < MB; m++)
                for (int c = 0; c < PB * MOE_PANEL; c++)
                    acc[m][c] = 0;
            for (int64_t kc = 0; kc < K; kc += KC) {
                const int64_t len = kc + KC < K ? KC : K - kc;
                for (int m = 0; m < MB; m++)
                    quant_row(x[m0 + m] + kc, len, sx[m], xq[m]);
                const int64_t k4n = (len + 3) / 4;
                for (int64_t p = pb; p < pe;) {
                    const int NP = pe - p >= 4 ? 4 : (pe - p >= 2 ? 2 : 1);
                    const uint8_t *bp[4];
                    int nw[4];
                    __mmask16 mask[4];
                    for (int j = 0; j < NP; j++) {
                        nw[j] = moe_pmat_panel_width(w->n, p + j);
                        bp[j] = d + (p + j) * 16 * K4 + (kc / 4) * nw[j] * 4;
                        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
                    }
                    const int col0 = (int)(p - pb) * MOE_PANEL;
#define MOE_VT(np, mbv) vnni_tile(bp, nw, mask, np, mbv, (const uint8_t(*)[KC])xq, k4n, acc, col0)
                    if (NP == 4) {
                        switch (MB) { case 1: MOE_VT(4, 1); break; case 2: MOE_VT(4, 2); break;
                                      case 3: MOE_VT(4, 3); break; default: MOE_VT(4, 4); break; }
                    } else if (NP == 2) {
                        switch (MB) { case 1: MOE_VT(2, 1); break; case 2: MOE_VT(2, 2); break;
                                      case 3: MOE_VT(2, 3); break; default: MOE_VT(2, 4); break; }
                    } else {
                        switch (MB) { case 1: MOE_VT(1, 1); break; case 2: MOE_VT(1, 2); break;
                                      case 3: MOE_VT(1, 3); break; default: MOE_VT(1, 4); break; }
                    }
#undef MOE_VT
                    p += NP;
                }
            }
            /* out = ((float)(acc - 128 sum w) * s_x) * s_w */
            const int64_t n0 = pb * MOE_PANEL, n1 = pe * MOE_PANEL < w->n ? pe * MOE_PANEL : w->n;
            for (int m = 0; m < MB; m++) {
                const __m512 vsx = _mm512_set1_ps(sx[m]);
                for (int64_t n = n0; n < n1; n += 16) {
                    const __mmask16 mk = (__mmask16)(n1 - n >= 16 ? 0xffffu : (1u << (n1 - n)) - 1u);
                    __m512i a = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(mk, &acc[m][n - n0]),
                                                 _mm512_maskz_loadu_epi32(mk, q->comp + n));
                    __m512 r = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), vsx),
                                             _mm512_maskz_loadu_ps(mk, q->scale + n));
                    _mm512_mask_storeu_ps(out + (int64_t)(m0 + m) * ldo + (n - p0 * MOE_PANEL), mk, r);
                }
            }
        }
    }
}

static int has_vnni(void)
{
    static int v = -1;
    if (v < 0) {
        unsigned a, b, c, dd;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(dd) : "a"(0), "c"(0));
        int r = 0;
        if (a >= 7) {
            __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(dd) : "a"(7), "c"(0));
            r = (c >> 11) & 1;
        }
        v = r;
    }
    return v;
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
        if (has_vnni())
            w8a8_vnni(w, p0, p1, x, mb, out, ldo);
        else
            moe_linear_q_ref(w, p0, p1, x, mb, out, ldo);
        break;
    }
}
