/* AVX2 + FMA kernels for weight-only quantized weights (table "avx2"'s linear entries of the quantized formats); the same bits
 * as src/gemm/linear_q_ref.c (docs/numerics.md section 5), modelled on
 * src/gemm/avx512/linear_q_avx512.c with 8-lane vectors: a panel's 16 output features are two
 * ymm halves (h = 0: features 0..7, h = 1: features 8..15).
 *  - Each lane runs the ref's operation sequence: per scale group part = fma(x[k], v[k], part)
 *    from +0 in increasing k on the codes' exact f32 values v (zero points: xs = xs + x[k] per k,
 *    then part = fnmadd(z, xs, part)), then y = fma(part, s, y) from +0 in increasing group,
 *    y held in the out rows between groups.
 *  - Decodes (all exact): int8 vpmovsxbd + vcvtdq2ps; fp8 with moe_qmat.f8h through f16
 *    (vcvtph2ps, as the AVX-512 kernel), otherwise the exact e4m3 decode (NaN codes 0x7f / 0xff
 *    give the ref's NaN bits); int4 signed: the nibble shifted to the top and shifted back
 *    arithmetically, then vcvtdq2ps; int4 with zero points: the unsigned nibble, vcvtdq2ps;
 *    mxfp4 e2m1: vpermps of the 8 magnitudes on the code's low 3 bits, bit 3 xor-ed into the
 *    sign (code 8 is -0, as moe_e2m1_to_f32).
 *  - A narrow last panel (nw < 16 features): AVX2 has no byte-masked loads, so its byte rows are
 *    copied into a zeroed 16-byte buffer; words, scales, zero points and out go through
 *    vmaskmov (lanes >= nw neither read nor written).
 *  - MOE_WF_W8A8 and MOE_WF_F8A8 stay on the scalar ref entries (the table leaves them).
 * Kernel names: moe_ukr_<format>_avx2_4x32 (rows in blocks of up to 4, up to 2 panels).
 * No static constructor here (tests: isa_objects_no_constructors): the only tables are constant
 * initializers. */
#include "gemm/avx2/avx2.h"
#include "quant/quant.h"

#include <immintrin.h>
#include <string.h>

#define MOE_AI static inline __attribute__((always_inline))

enum { XS_G = 256 }; /* zero points: groups per x-sum window */

/* Lanes of half h of a panel of nw features that are valid: all ones where 8h + i < nw. */
MOE_AI __m256i half_mask(int nw, int h)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nw - 8 * h), idx);
}

/* The 4-bit code in bits sh .. sh+3 of each lane of v (other bits anything) -> its exact value:
 * int4 signed (nib ^ 8) - 8, int4 with zero points the unsigned nib, mxfp4 e2m1. */
MOE_AI __m256 dec4(int kind, int zp, __m256i v, int sh)
{
    if (kind == MOE_WF_FP4) {
        const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
        __m256i idx = sh ? _mm256_srli_epi32(v, sh) : v; /* vpermps reads bits 0..2 */
        __m256 m = _mm256_permutevar8x32_ps(mag, idx);
        __m256i sign = _mm256_and_si256(sh == 28 ? v : _mm256_slli_epi32(v, 28 - sh),
                                        _mm256_set1_epi32((int)0x80000000u));
        return _mm256_xor_ps(m, _mm256_castsi256_ps(sign));
    }
    if (zp) {
        __m256i n = sh ? _mm256_srli_epi32(v, sh) : v;
        if (sh != 28)
            n = _mm256_and_si256(n, _mm256_set1_epi32(15));
        return _mm256_cvtepi32_ps(n);
    }
    __m256i n = sh == 28 ? v : _mm256_slli_epi32(v, 28 - sh);
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(n, 28));
}

/* 8 e4m3 bytes (zero-extended to dwords) -> their exact f32 values (moe_e4m3_to_f32's bits). */
MOE_AI __m256 dec_e4m3(__m256i v)
{
    const __m256i m = _mm256_and_si256(v, _mm256_set1_epi32(0x7f));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
    /* eeeemmm at f32 bits 20..26: 2^(e-127) 1.mmm (or the subnormal 0.mmm 2^-126); times 2^120
     * exactly: 2^(e-7) 1.mmm (0.mmm 2^-6) */
    const __m256 f = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(m, 20)), _mm256_set1_ps(0x1p120f));
    const __m256i bits = _mm256_or_si256(_mm256_castps_si256(f), sign);
    const __m256i nan = _mm256_cmpeq_epi32(m, _mm256_set1_epi32(0x7f));
    const __m256i qnan = _mm256_or_si256(sign, _mm256_set1_epi32(0x7fc00000));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(bits, qnan, nan));
}

/* Codes of k = kk of one panel (nw valid features; full: nw = 16) -> the 16 f32 values before
 * scale in c[0] (features 0..7) and c[1] (8..15); lanes >= nw are 0. */
MOE_AI void decode1(int kind, int zp, int f8h, const uint8_t *panel, int64_t K, int64_t kk, int nw, int full,
                    const __m256i mk[2], __m256 c[2])
{
    if (kind == MOE_WF_F8 || kind == MOE_WF_I8) {
        const uint8_t *row = panel + kk * nw; /* [K][nw] bytes */
        __m128i b;
        if (full) {
            b = _mm_loadu_si128((const __m128i *)row);
        } else {
            uint8_t buf[16] = {0};
            memcpy(buf, row, (size_t)nw);
            b = _mm_loadu_si128((const __m128i *)buf);
        }
        const __m128i bh = _mm_srli_si128(b, 8);
        if (kind == MOE_WF_I8) {
            c[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
            c[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bh));
        } else if (f8h) {
            /* sign-extended to words, << 7, bit 14 cleared: the f16 bits (b & 0x80) << 8 |
             * (b & 0x7f) << 7, the e4m3 value times 2^-8 exactly (quant/layout.h moe_qmat.f8h) */
            __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                         _mm256_set1_epi16((short)-16385 /* 0xbfff */));
            c[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
            c[1] = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        } else {
            c[0] = dec_e4m3(_mm256_cvtepu8_epi32(b));
            c[1] = dec_e4m3(_mm256_cvtepu8_epi32(bh));
        }
        return;
    }
    /* 4-bit (quant/layout.h MOE_WF_I4): body word row kk / 8, code kk % 8 in bits 4 (kk % 8) */
    const int64_t K8 = K / 8;
    if (kk < 8 * K8) {
        const int32_t *wr = (const int32_t *)(panel + 4 * (kk / 8) * nw); /* [nw] words */
        const __m128i cnt = _mm_cvtsi32_si128(4 * (int)(kk % 8));
        for (int h = 0; h < 2; h++) {
            __m256i v = full ? _mm256_loadu_si256((const __m256i *)(wr + 8 * h))
                             : _mm256_maskload_epi32((const int *)(wr + 8 * h), mk[h]);
            c[h] = dec4(kind, zp, _mm256_srl_epi32(v, cnt), 0);
        }
        return;
    }
    /* tail row: ceil(nw/2) bytes, low nibble = even feature; each byte to two dword lanes, the
     * odd lane's shifted down by 4 */
    const int rb = (nw + 1) / 2;
    const uint8_t *row = panel + 4 * nw * K8 + (kk - 8 * K8) * rb;
    __m128i b;
    if (full) {
        b = _mm_loadl_epi64((const __m128i *)row);
    } else {
        uint8_t buf[16] = {0};
        memcpy(buf, row, (size_t)rb);
        b = _mm_loadl_epi64((const __m128i *)buf);
    }
    const __m128i bb = _mm_unpacklo_epi8(b, b); /* b0 b0 b1 b1 .. b7 b7 */
    const __m256i sh = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    c[0] = dec4(kind, zp, _mm256_srlv_epi32(_mm256_cvtepu8_epi32(bb), sh), 0);
    c[1] = dec4(kind, zp, _mm256_srlv_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bb, 8)), sh), 0);
    if (!full) { /* lanes >= nw: 0 (the odd half-byte of an odd nw decodes to anything) */
        c[0] = _mm256_and_ps(c[0], _mm256_castsi256_ps(mk[0]));
        c[1] = _mm256_and_ps(c[1], _mm256_castsi256_ps(mk[1]));
    }
}

/* Weight-only, scale after the group: NP panels from p by MB rows (linear_q_ref.c's sequence
 * per lane, see the top of this file). */
MOE_AI void post_tile(const moe_pmat *w, const int kind, const int zp, const int f8h, const int full, int64_t p,
                      int64_t p0, const int NP, const int MB, const float *const *x, int64_t g0, int64_t g1,
                      const float *xsum, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, gk = q->gk, ng = q->ng;
    const int four = kind == MOE_WF_I4 || kind == MOE_WF_FP4;
    const int64_t K8x = four ? K / 8 * 8 : 0; /* 4-bit: k below this are in the body words */
    const __m256 zero = _mm256_setzero_ps();
    const uint8_t *base[4];
    int nw[4];
    __m256i mk[4][2];
    for (int j = 0; j < NP; j++) {
        nw[j] = full ? MOE_PANEL : moe_pmat_panel_width(w->n, p + j);
        base[j] = (const uint8_t *)w->data + (p + j) * (four ? 8 : 16) * K;
        mk[j][0] = half_mask(nw[j], 0);
        mk[j][1] = half_mask(nw[j], 1);
    }
    for (int64_t g = g0; g < g1; g++) {
        __m256 part[4][2][4];
        for (int m = 0; m < MB; m++)
            for (int j = 0; j < NP; j++)
                part[j][0][m] = part[j][1][m] = zero;
        const int64_t k1 = (g + 1) * gk < K ? (g + 1) * gk : K;
        int64_t kk = g * gk;
        if (four && kk % 8 == 0) {
            /* 8 k per body word row: one load per panel half, then per k the decode and the
             * fmas (the order of linear_q_avx512.c; per-half loads with k innermost measured
             * int4-g128 T = 1 1.43 -> 1.29 ms, T = 256 157 -> 100 ms this way, 3 runs each) */
            for (; kk + 8 <= k1 && kk + 8 <= K8x; kk += 8) {
                __m256i v[4][2];
                for (int j = 0; j < NP; j++) {
                    const int32_t *wr = (const int32_t *)(base[j] + 4 * (kk / 8) * nw[j]); /* [nw] words */
                    /* 16 lines ahead in this panel's stream (past its end: a harmless hint) */
                    _mm_prefetch((const char *)wr + 1024, _MM_HINT_T0);
                    for (int h = 0; h < 2; h++)
                        v[j][h] = full ? _mm256_loadu_si256((const __m256i *)(wr + 8 * h))
                                       : _mm256_maskload_epi32((const int *)(wr + 8 * h), mk[j][h]);
                }
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    __m256 c[4][2];
                    for (int j = 0; j < NP; j++)
                        for (int h = 0; h < 2; h++)
                            c[j][h] = dec4(kind, zp, v[j][h], 4 * i);
                    for (int m = 0; m < MB; m++) {
                        const __m256 xb = _mm256_set1_ps(x[m][kk + i]);
                        for (int j = 0; j < NP; j++)
                            for (int h = 0; h < 2; h++)
                                part[j][h][m] = _mm256_fmadd_ps(xb, c[j][h], part[j][h][m]);
                    }
                }
            }
        }
        for (; kk < k1; kk++) {
            __m256 c[4][2];
            for (int j = 0; j < NP; j++)
                decode1(kind, zp, f8h, base[j], K, kk, nw[j], full, mk[j], c[j]);
            for (int m = 0; m < MB; m++) {
                const __m256 xb = _mm256_set1_ps(x[m][kk]);
                for (int j = 0; j < NP; j++)
                    for (int h = 0; h < 2; h++)
                        part[j][h][m] = _mm256_fmadd_ps(xb, c[j][h], part[j][h][m]);
            }
        }
        for (int j = 0; j < NP; j++) {
            const float *sp = q->scale + (p + j) * 16 * ng + g * nw[j]; /* [nw] scales of group g */
            const float *zq = zp ? q->zero + (p + j) * 16 * ng + g * nw[j] : NULL; /* [nw] zero points */
            for (int h = 0; h < 2; h++) {
                const __m256 sc = full ? _mm256_loadu_ps(sp + 8 * h) : _mm256_maskload_ps(sp + 8 * h, mk[j][h]);
                __m256 zr = zero;
                if (zp)
                    zr = full ? _mm256_loadu_ps(zq + 8 * h) : _mm256_maskload_ps(zq + 8 * h, mk[j][h]);
                for (int m = 0; m < MB; m++) {
                    float *o = out + m * ldo + (p + j - p0) * MOE_PANEL + 8 * h; /* [8] */
                    __m256 t = part[j][h][m];
                    if (zp)
                        t = _mm256_fnmadd_ps(zr, _mm256_set1_ps(xsum[m * XS_G + (g - g0)]), t);
                    __m256 y = g == 0 ? zero : full ? _mm256_loadu_ps(o) : _mm256_maskload_ps(o, mk[j][h]);
                    y = _mm256_fmadd_ps(t, sc, y);
                    if (full)
                        _mm256_storeu_ps(o, y);
                    else
                        _mm256_maskstore_ps(o, mk[j][h], y);
                }
            }
        }
    }
}

MOE_AI void post_rows(const moe_pmat *w, const int kind, const int zp, const int f8h, int64_t p0, int64_t p1,
                      const int NP, const int MB, const float *const *x, int64_t g0, int64_t g1, const float *xsum,
                      float *out, int64_t ldo)
{
    const int64_t pf = w->n / MOE_PANEL < p1 ? w->n / MOE_PANEL : p1; /* full panels end */
    int64_t p = p0;
    for (; p + NP <= pf; p += NP)
        post_tile(w, kind, zp, f8h, 1, p, p0, NP, MB, x, g0, g1, xsum, out, ldo);
    for (; p < pf; p++)
        post_tile(w, kind, zp, f8h, 1, p, p0, 1, MB, x, g0, g1, xsum, out, ldo);
    for (; p < p1; p++)
        post_tile(w, kind, zp, f8h, 0, p, p0, 1, MB, x, g0, g1, xsum, out, ldo);
}

/* Rows in blocks of up to 4: 2 * NP * MB accumulators of the 16 ymm registers.
 * Zero points: the group sums of x (xs = xs + x[k] from +0 in increasing k, the ref's scalar
 * operations; the same in every lane) are summed once per row block here, 4 rows interleaved,
 * into xsum [4][XS_G] for a window of at most XS_G groups at a time (y stays in out between
 * windows), instead of in ymm registers inside each tile (int4-g128-zp T = 256: 210 -> 135 ms,
 * 3 runs each, 2026-11-29). */
MOE_AI void post_linear(const moe_pmat *w, const int kind, const int zp, const int f8h, int64_t p0, int64_t p1,
                        const float *const *x, int mb, float *out, int64_t ldo)
{
    const int64_t ng = w->q->ng, gk = w->q->gk, K = w->k;
    float xsum[4 * XS_G]; /* [4][XS_G] (zero points) */
    for (int m0 = 0; m0 < mb;) {
        const int rows = mb - m0 < 4 ? mb - m0 : 4;
        const float *const *xr = x + m0;
        float *o = out + (int64_t)m0 * ldo;
        for (int64_t g0 = 0; g0 < ng; g0 += zp ? XS_G : ng) {
            const int64_t g1 = zp && g0 + XS_G < ng ? g0 + XS_G : ng;
            if (zp) {
                /* 4 independent scalar chains (rows past the block repeat row 0, not stored) */
                const float *x0 = xr[0], *x1 = xr[rows > 1 ? 1 : 0], *x2 = xr[rows > 2 ? 2 : 0],
                            *x3 = xr[rows > 3 ? 3 : 0];
                for (int64_t g = g0; g < g1; g++) {
                    const int64_t k1 = (g + 1) * gk < K ? (g + 1) * gk : K;
                    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
                    for (int64_t k = g * gk; k < k1; k++) {
                        s0 = s0 + x0[k];
                        s1 = s1 + x1[k];
                        s2 = s2 + x2[k];
                        s3 = s3 + x3[k];
                    }
                    const float sm[4] = {s0, s1, s2, s3};
                    for (int m = 0; m < rows; m++)
                        xsum[m * XS_G + (g - g0)] = sm[m];
                }
            }
            switch (rows) {
            case 1: post_rows(w, kind, zp, f8h, p0, p1, 2, 1, xr, g0, g1, xsum, o, ldo); break;
            case 2: post_rows(w, kind, zp, f8h, p0, p1, 2, 2, xr, g0, g1, xsum, o, ldo); break;
            case 3: post_rows(w, kind, zp, f8h, p0, p1, 1, 3, xr, g0, g1, xsum, o, ldo); break;
            default: post_rows(w, kind, zp, f8h, p0, p1, 1, 4, xr, g0, g1, xsum, o, ldo); break;
            }
        }
        m0 += rows;
    }
}

void moe_ukr_fp8_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                           int64_t ldo)
{
    if (w->q->f8h) /* a property of the matrix (quant/format.h moe_qmat.f8h), chosen at packing */
        post_linear(w, MOE_WF_F8, 0, 1, p0, p1, x, mb, out, ldo);
    else
        post_linear(w, MOE_WF_F8, 0, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_i8_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                          int64_t ldo)
{
    post_linear(w, MOE_WF_I8, 0, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_i4_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                          int64_t ldo)
{
    post_linear(w, MOE_WF_I4, 0, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_i4zp_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    post_linear(w, MOE_WF_I4, 1, 0, p0, p1, x, mb, out, ldo);
}

void moe_ukr_mxfp4_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                             int64_t ldo)
{
    post_linear(w, MOE_WF_FP4, 0, 0, p0, p1, x, mb, out, ldo);
}
