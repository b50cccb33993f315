/* AVX-512 kernels for quantized weights (table "avx512"'s entries of the quantized formats); the same bits as
 * src/gemm/linear_q_ref.c.
 *  - Weight-only (fp8 e4m3, int8, int4, mxfp4): 16 codes of a panel row decoded to their exact
 *    f32 values go straight into the group's partial sums (vfmadd in increasing k), and the
 *    scale is applied once per group and output (docs/numerics.md section 5). 4-bit codes come
 *    8 k per 32-bit lane (quant/layout.h MOE_WF_I4: one 64-byte load per 8 k, then per k a shift, a
 *    vpermps and the vfmadd); fp8 goes through f16 (quant/layout.h moe_qmat.f8h: sign-extend, shift,
 *    mask, vcvtph2ps); int8 through vpmovsxbd and vcvtdq2ps.
 *  - fp8 w8a8 block (MOE_WF_F8A8) on quantized rows: below; W8A8 int8: w8a8_avx512.c.
 * Kernel names: moe_ukr_<format>_avx512_4x64 (rows in blocks of up to 4, up to 4 panels). */
#include "gemm/avx512/avx512.h"
#include "quant/quant.h"

#include <immintrin.h>

#define MOE_AI static inline __attribute__((always_inline))

/* The 16-entry table of a 4-bit code's exact value (vpermps reads the index's low 4 bits). */
MOE_AI __m512 lut4(int kind, int zp)
{
    if (kind == MOE_WF_FP4)
        return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f,
                              -4.0f, -6.0f);
    if (zp)
        return _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f,
                              14.0f, 15.0f);
    return _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, -8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f,
                          -2.0f, -1.0f);
}

/* e4m3 bytes sign-extended to 16-bit words -> the f16 bits (b & 0x80) << 8 | (b & 0x7f) << 7:
 * << 7 puts the magnitude in bits 7..13 and copies of the sign in bits 14 and 15; clear bit 14.
 * The f16 value is the e4m3 value times 2^-8 exactly (subnormals included). */
MOE_AI __m512i f8_half_bits(__m512i words)
{
    return _mm512_and_si512(_mm512_slli_epi16(words, 7), _mm512_set1_epi16((short)-16385 /* 0xbfff */));
}

/* Codes of k = kk of one panel (nw valid lanes; full: nw = 16) -> f32 values before scale:
 * e4m3 value (times 2^-8 when f8h), int8, or the 4-bit value. */
MOE_AI __m512 decode1(int kind, int f8h, const uint8_t *panel, int64_t K, int64_t kk, int nw, __mmask16 mask,
                      int full, __m512 lut)
{
    if (kind == MOE_WF_F8 || kind == MOE_WF_I8) {
        const uint8_t *row = panel + kk * nw; /* [K][nw] bytes */
        __m128i b = full ? _mm_loadu_si128((const __m128i *)row) : _mm_maskz_loadu_epi8(mask, row);
        if (kind == MOE_WF_I8)
            return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
        if (f8h) {
            __m512i h = f8_half_bits(_mm512_castsi256_si512(_mm256_cvtepi8_epi16(b)));
            return _mm512_cvtph_ps(_mm512_castsi512_si256(h));
        }
        /* exact e4m3 decode (matrices with NaN codes or scales near the f32 top) */
        __m512i v = _mm512_cvtepu8_epi32(b);
        __m512i m = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
        __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
        __m512 f = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(m, 20)), _mm512_set1_ps(0x1p120f));
        __m512i bits = _mm512_or_si512(_mm512_castps_si512(f), sign);
        __mmask16 nan = _mm512_cmpeq_epi32_mask(m, _mm512_set1_epi32(0x7f));
        bits = _mm512_mask_mov_epi32(bits, nan, _mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000)));
        return _mm512_castsi512_ps(bits);
    }
    /* 4-bit (quant/layout.h MOE_WF_I4): body word row kk / 8, code kk % 8 in bits 4 (kk % 8) of each lane */
    const int64_t K8 = K / 8;
    if (kk < 8 * K8) {
        const uint8_t *wr = panel + 4 * (kk / 8) * nw; /* [nw] words */
        __m512i v = full ? _mm512_loadu_si512(wr) : _mm512_maskz_loadu_epi32(mask, wr);
        v = _mm512_srl_epi32(v, _mm_cvtsi32_si128(4 * (int)(kk % 8)));
        return _mm512_permutexvar_ps(v, lut);
    }
    /* tail row: ceil(nw/2) bytes, low nibble first; each byte to two dword lanes, the high
     * nibble shifted down */
    const int rb = (nw + 1) / 2;
    const uint8_t *row = panel + 4 * nw * K8 + (kk - 8 * K8) * rb;
    __m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << rb) - 1u), row);
    __m512i v = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    v = _mm512_srlv_epi32(v, _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4));
    return _mm512_permutexvar_ps(v, lut);
}

/* The NP panels from p of a packed code matrix: their widths (16 when full), first bytes
 * (bytes_per_k: 8 for the 4-bit layouts, 16 for the byte layouts, per k of a full panel) and
 * lane masks. */
MOE_AI void panels_at(const moe_pmat *w, int64_t p, const int NP, const int full, int64_t bytes_per_k,
                      const uint8_t **base, int *nw, __mmask16 *mask)
{
    for (int j = 0; j < NP; j++) {
        nw[j] = full ? MOE_PANEL : moe_pmat_panel_width(w->n, p + j);
        base[j] = (const uint8_t *)w->data + (p + j) * bytes_per_k * w->k;
        mask[j] = (__mmask16)((1u << nw[j]) - 1u);
    }
}

/* Weight-only, scale after the group (linear_q_ref.c): NP panels from p by MB rows. Per
 * group, part[j][m] = fma(x[m][k], v, part) from +0 in increasing k on the codes' exact values
 * v (zp: and xs[m] = xs[m] + x[m][k], the group's x sum, every lane the same); then
 * y = fma(part, s, y) (zp: part - z * xs first, one fnmadd), y kept in the out rows (+0 before
 * group 0). */
MOE_AI void post_tile(const moe_pmat *w, const int kind, const int zp, const int f8h, const int full, int64_t p,
                      int64_t p0, const int NP, const int MB, const float *const *x, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, gk = q->gk, ng = q->ng;
    const int four = kind == MOE_WF_I4 || kind == MOE_WF_FP4;
    const int64_t K8x = four ? K / 8 * 8 : 0; /* 4-bit: k below this are in the body words */
    const __m512 lut = four ? lut4(kind, zp) : _mm512_setzero_ps();
    const __m512 zero = _mm512_setzero_ps();
    const uint8_t *base[4];
    int nw[4];
    __mmask16 mask[4];
    panels_at(w, p, NP, full, four ? 8 : 16, base, nw, mask);
    for (int64_t g = 0; g < ng; g++) {
        __m512 part[4][4], xs[4];
        for (int m = 0; m < MB; m++) {
            xs[m] = zero;
            for (int j = 0; j < NP; j++)
                part[j][m] = zero;
        }
        const int64_t k1 = (g + 1) * gk < K ? (g + 1) * gk : K;
        int64_t kk = g * gk;
        if (four && kk % 8 == 0) {
            /* 8 k per body word row: one load, then per k a shift, the table, the fma */
            for (; kk + 8 <= k1 && kk + 8 <= K8x; kk += 8) {
                __m512i v[4];
                for (int j = 0; j < NP; j++) {
                    const uint8_t *wr = base[j] + 4 * (kk / 8) * nw[j];
                    v[j] = full ? _mm512_loadu_si512(wr) : _mm512_maskz_loadu_epi32(mask[j], wr);
                    /* 16 lines ahead in this panel's stream (past the panel's end: a harmless
                     * hint): T = 1 median 1.07 -> 1.02 ms (int4-g128, 6 runs each, 2026-11-29) */
                    _mm_prefetch((const char *)wr + 1024, _MM_HINT_T0);
                }
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    __m512 c[4];
                    for (int j = 0; j < NP; j++)
                        c[j] = _mm512_permutexvar_ps(i ? _mm512_srli_epi32(v[j], 4 * i) : v[j], lut);
                    for (int m = 0; m < MB; m++) {
                        const __m512 xb = _mm512_set1_ps(x[m][kk + i]);
                        if (zp)
                            xs[m] = _mm512_add_ps(xs[m], xb);
                        for (int j = 0; j < NP; j++)
                            part[j][m] = _mm512_fmadd_ps(xb, c[j], part[j][m]);
                    }
                }
            }
        }
        if (kind == MOE_WF_F8 && f8h && full) {
            /* 2 k per 32-byte load: 32 bytes -> 32 f16 words -> 2 x 16 f32 */
            for (; kk + 2 <= k1; kk += 2) {
                __m512 c0[4], c1[4];
                for (int j = 0; j < NP; j++) {
                    __m512i h = f8_half_bits(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(base[j] + kk * 16))));
                    c0[j] = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
                    c1[j] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
                }
                for (int m = 0; m < MB; m++) {
                    const __m512 xb = _mm512_set1_ps(x[m][kk]);
                    for (int j = 0; j < NP; j++)
                        part[j][m] = _mm512_fmadd_ps(xb, c0[j], part[j][m]);
                }
                for (int m = 0; m < MB; m++) {
                    const __m512 xb = _mm512_set1_ps(x[m][kk + 1]);
                    for (int j = 0; j < NP; j++)
                        part[j][m] = _mm512_fmadd_ps(xb, c1[j], part[j][m]);
                }
            }
        }
        for (; kk < k1; kk++) {
            __m512 c[4];
            for (int j = 0; j < NP; j++)
                c[j] = decode1(kind, f8h, base[j], K, kk, nw[j], mask[j], full, lut);
            for (int m = 0; m < MB; m++) {
                const __m512 xb = _mm512_set1_ps(x[m][kk]);
                if (zp)
                    xs[m] = _mm512_add_ps(xs[m], xb);
                for (int j = 0; j < NP; j++)
                    part[j][m] = _mm512_fmadd_ps(xb, c[j], part[j][m]);
            }
        }
        for (int j = 0; j < NP; j++) {
            const float *sp = q->scale + (p + j) * 16 * ng + g * nw[j]; /* [nw] scales of group g */
            const __m512 sc = full ? _mm512_loadu_ps(sp) : _mm512_maskz_loadu_ps(mask[j], sp);
            __m512 zr = zero;
            if (zp) {
                const float *zq = q->zero + (p + j) * 16 * ng + g * nw[j];
                zr = full ? _mm512_loadu_ps(zq) : _mm512_maskz_loadu_ps(mask[j], zq);
            }
            for (int m = 0; m < MB; m++) {
                float *o = out + m * ldo + (p + j - p0) * MOE_PANEL;
                __m512 t = part[j][m];
                if (zp)
                    t = _mm512_fnmadd_ps(zr, xs[m], t);
                __m512 y = g == 0 ? zero : full ? _mm512_loadu_ps(o) : _mm512_maskz_loadu_ps(mask[j], o);
                y = _mm512_fmadd_ps(t, sc, y);
                if (full)
                    _mm512_storeu_ps(o, y);
                else
                    _mm512_mask_storeu_ps(o, mask[j], y);
            }
        }
    }
}

MOE_AI void post_rows(const moe_pmat *w, const int kind, const int zp, const int f8h, int64_t p0, int64_t p1,
                      const int NP, const int MB, const float *const *x, float *out, int64_t ldo)
{
    const int64_t pf = w->n / MOE_PANEL < p1 ? w->n / MOE_PANEL : p1; /* full panels end */
    int64_t p = p0;
    for (; p + NP <= pf; p += NP)
        post_tile(w, kind, zp, f8h, 1, p, p0, NP, MB, x, out, ldo);
    for (; p < pf; p++)
        post_tile(w, kind, zp, f8h, 1, p, p0, 1, MB, x, out, ldo);
    for (; p < p1; p++)
        post_tile(w, kind, zp, f8h, 0, p, p0, 1, MB, x, out, ldo);
}

MOE_AI void post_linear(const moe_pmat *w, const int kind, const int zp, const int f8h, int64_t p0, int64_t p1,
                        const float *const *x, int mb, float *out, int64_t ldo)
{
    for (int m0 = 0; m0 < mb;) {
        const int rows = mb - m0 < 4 ? mb - m0 : 4;
        const float *const *xr = x + m0;
        float *o = out + (int64_t)m0 * ldo;
        switch (rows) {
        case 1: post_rows(w, kind, zp, f8h, p0, p1, 4, 1, xr, o, ldo); break;
        case 2: post_rows(w, kind, zp, f8h, p0, p1, 4, 2, xr, o, ldo); break;
        case 3: post_rows(w, kind, zp, f8h, p0, p1, 4, 3, xr, o, ldo); break;
        default: post_rows(w, kind, zp, f8h, p0, p1, 2, 4, xr, o, ldo); break;
        }
        m0 += rows;
    }
}

/* ---- fp8 w8a8 block (MOE_WF_F8A8) on quantized rows: gemm/kernels.h moe_linear_rows_fn ----
 * Per group: part[j][m] accumulated in registers from +0 with vfmadd in increasing k on the
 * broadcast activation dec(q_a) * 2^8 (a 256-entry table, exact) and the panel's weights
 * dec(q_w) * 2^-8 (f8h: through f16; otherwise the exact decode times 2^-8, exact): each
 * product is the real dec(q_a) * dec(q_w), exact in f32, so every fma rounds as the ref's.
 * At the group's end: y = y + (part * sa[m][g]) * s_w, y held in the out rows (+0 before the
 * first group). */

/* the activation table dec(c) * 256: moe_e4m3_x256 (quant.h; no constructor in this file) */

MOE_AI void f8a8_tile(const moe_pmat *w, const int f8h, const int full, int64_t p, int64_t p0, const int NP,
                      const int MB, const uint8_t *const *xq, const float *const *sa, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, G = q->gk, ng = q->ng;
    const __m512 zero = _mm512_setzero_ps();
    const uint8_t *base[4];
    int nw[4];
    __mmask16 mask[4];
    panels_at(w, p, NP, full, 16, base, nw, mask);
    for (int64_t g = 0; g < ng; g++) {
        __m512 acc[4][6];
        for (int j = 0; j < NP; j++)
            for (int m = 0; m < MB; m++)
                acc[j][m] = zero;
        const int64_t k1 = (g + 1) * G < K ? (g + 1) * G : K;
        for (int64_t kk = g * G; kk < k1; kk++) {
            __m512 wv[4];
            for (int j = 0; j < NP; j++) {
                wv[j] = decode1(MOE_WF_F8, f8h, base[j], K, kk, nw[j], mask[j], full, zero);
                if (!f8h)
                    wv[j] = _mm512_mul_ps(wv[j], _mm512_set1_ps(0x1p-8f)); /* exact */
            }
            for (int m = 0; m < MB; m++) {
                __m512 xb = _mm512_set1_ps(moe_e4m3_x256[xq[m][kk]]);
                for (int j = 0; j < NP; j++)
                    acc[j][m] = _mm512_fmadd_ps(xb, wv[j], acc[j][m]);
            }
        }
        for (int j = 0; j < NP; j++) {
            const float *sp = q->scale + (p + j) * 16 * ng + g * nw[j]; /* [nw] s_w of group g */
            const __m512 sw = full ? _mm512_loadu_ps(sp) : _mm512_maskz_loadu_ps(mask[j], sp);
            for (int m = 0; m < MB; m++) {
                float *o = out + m * ldo + (p + j - p0) * MOE_PANEL;
                __m512 y = g == 0 ? zero : full ? _mm512_loadu_ps(o) : _mm512_maskz_loadu_ps(mask[j], o);
                __m512 t = _mm512_mul_ps(_mm512_mul_ps(acc[j][m], _mm512_set1_ps(sa[m][g])), sw);
                y = _mm512_add_ps(y, t);
                if (full)
                    _mm512_storeu_ps(o, y);
                else
                    _mm512_mask_storeu_ps(o, mask[j], y);
            }
        }
    }
}

MOE_AI void f8a8_rows(const moe_pmat *w, const int f8h, int64_t p0, int64_t p1, const int MB,
                      const uint8_t *const *xq, const float *const *sa, float *out, int64_t ldo)
{
    const int64_t pf = w->n / MOE_PANEL < p1 ? w->n / MOE_PANEL : p1; /* full panels end */
    int64_t p = p0;
    for (; p + 4 <= pf; p += 4)
        f8a8_tile(w, f8h, 1, p, p0, 4, MB, xq, sa, out, ldo);
    for (; p < pf; p++)
        f8a8_tile(w, f8h, 1, p, p0, 1, MB, xq, sa, out, ldo);
    for (; p < p1; p++)
        f8a8_tile(w, f8h, 0, p, p0, 1, MB, xq, sa, out, ldo);
}

MOE_AI void f8a8_linear(const moe_pmat *w, const int f8h, int64_t p0, int64_t p1, const uint8_t *const *xq,
                        const float *const *sa, int mb, float *out, int64_t ldo)
{
    for (int m0 = 0; m0 < mb;) {
        const int rows = mb - m0 < 6 ? mb - m0 : 6;
        const uint8_t *const *xr = xq + m0;
        const float *const *sr = sa + m0;
        float *o = out + (int64_t)m0 * ldo;
        switch (rows) {
        case 1: f8a8_rows(w, f8h, p0, p1, 1, xr, sr, o, ldo); break;
        case 2: f8a8_rows(w, f8h, p0, p1, 2, xr, sr, o, ldo); break;
        case 3: f8a8_rows(w, f8h, p0, p1, 3, xr, sr, o, ldo); break;
        case 4: f8a8_rows(w, f8h, p0, p1, 4, xr, sr, o, ldo); break;
        case 5: f8a8_rows(w, f8h, p0, p1, 5, xr, sr, o, ldo); break;
        default: f8a8_rows(w, f8h, p0, p1, 6, xr, sr, o, ldo); break;
        }
        m0 += rows;
    }
}

void moe_ukr_f8a8_rows_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                   const float *const *sa, int mb, float *out, int64_t ldo, const void *pf,
                                   int64_t pf_bytes)
{
    (void)pf, (void)pf_bytes; /* no prefetch (moe_format.prefetch 0) */
    if (w->q->f8h)
        f8a8_linear(w, 1, p0, p1, xq, sa, mb, out, ldo);
    else
        f8a8_linear(w, 0, p0, p1, xq, sa, mb, out, ldo);
}

void moe_ukr_fp8_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                             int64_t ldo)
{
    if (w->q->f8h) /* a property of the matrix (quant/format.h moe_qmat.f8h), chosen at packing */
        post_linear(w, MOE_WF_F8, 0, 1, p0, p1, x, mb, out, ldo);
    else
        post_linear(w, MOE_WF_F8, 0, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_i8_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    post_linear(w, MOE_WF_I8, 0, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_i4_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    post_linear(w, MOE_WF_I4, 0, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_i4zp_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                              int64_t ldo)
{
    post_linear(w, MOE_WF_I4, 1, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_mxfp4_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                               float *out, int64_t ldo)
{
    post_linear(w, MOE_WF_FP4, 0, 0, p0, p1, x, mb, out, ldo);
}
