/* Compute bf16 for the weight-only quantized formats (MOE_WF_I8, F8, I4, I4ZP, FP4) on
 * vdpbf16ps (table "avx512_bf16"): the same bits as moe_ukr_qbf16_rows_ref
 * (src/gemm/linear_bf16_ref.c; gemm/kernels.h "Compute bf16"): per scale group g the pair
 * chain part = dp(part, x[2i+1], v[2i+1]); part = dp(part, x[2i], v[2i]) from +0 on the codes'
 * exact values v (minus the zero point), then y = fmaf(part, s[g], y) from +0 in increasing g.
 *
 * Two stages, per block of up to 4 panels and chunk of up to 64 pairs of k inside one group:
 *  1. decode: each panel's codes of the chunk become bf16 pairs in the lane layout of the
 *     pair panels (quant/layout.h MOE_WF_BF16P: lane j = bf16(v[2i]) | bf16(v[2i+1]) << 16),
 *     in a 16 KB buffer on the stack (L1). Every code value has at most 8 significant bits
 *     (int8, int4, int4 - z for z in 0..255, e2m1, e4m3 with its subnormals, times 2^-8 when
 *     f8h, and e4m3's NaN code as the quiet NaN moe_e4m3_to_f32 gives), so the top 16 bits of
 *     its f32 value are its bf16, exactly, and the low 16 are zero: the decoders compute the
 *     exact f32 values as the f32 kernels do (src/gemm/avx512/linear_q_avx512.c: vpmovsxbd +
 *     vcvtdq2ps for int8, f16 bits + vcvtph2ps for e4m3, vpermps on a 16-entry table for the
 *     4-bit codes) and keep the even k's top half under the odd k's.
 *  2. multiply: tiles of up to 6 rows by 4 (or 1) panels over the decoded chunk, as tile() of
 *     linear_avx512_bf16.c: one vdpbf16ps per row, panel and pair, weights as its first
 *     multiplicand and the row's activation pair broadcast as the second (the operand order
 *     whose NaN propagation is that of the ref's fmaf chain, payloads included). A group
 *     longer than a chunk carries its partial sums from chunk to chunk in a buffer; at the
 *     group's end y = fma(part, s, y), y held in out (a NaN part or s wins over a NaN y in
 *     every vfmadd form, as in fmaf; which of a NaN part and a NaN scale is kept is the
 *     compiler's choice in the ref too: NaN payloads are not part of the contract).
 * A chunk's decode serves every row of the call (the grouped driver passes up to 48), so at
 * large T the kernel runs at about the pair-panel GEMM's rate; at T = 1 each code is read and
 * decoded once, and the loop streams the panels. Partial panels load and store masked (lanes
 * past nw are decoded from zero bytes and never stored); no load reaches past a panel. */
#include "gemm/avx512_bf16/avx512_bf16.h"

#include <immintrin.h>
#include <string.h>

#define MOE_AI static inline __attribute__((always_inline))

enum {
    CHUNK = 64,     /* pairs of k decoded at a time (128 k) */
    BLOCK = 4,      /* panels decoded at a time */
    TILE_ROWS = 6,  /* rows per multiply tile (24 accumulators with 4 panels) */
    ROW_BLOCK = 48, /* rows whose partial sums the carry buffer holds (the driver's MOE_GEMM_RB) */
};

/* ---- stage 1: decode ---- */

/* The 16-entry table of a 4-bit code's exact value (vpermps reads an index's low 4 bits);
 * zero points: the unsigned code, z subtracted after. */
MOE_AI __m512 lut4(const int kind)
{
    if (kind == MOE_WF_FP4)
        return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f,
                              -4.0f, -6.0f);
    if (kind == MOE_WF_I4ZP)
        return _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f,
                              14.0f, 15.0f);
    return _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, -8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f,
                          -2.0f, -1.0f);
}

/* 16 byte codes (one per lane) -> their exact f32 values: int8, or e4m3 (times 2^-8 when f8h:
 * moe_qmat.f8h, whose scales hold s * 256). e4m3 goes through f16: the sign-extended byte
 * shifted left by 7 has the magnitude in bits 7..13 and sign copies in 14 and 15; clearing
 * bit 14 leaves the f16 bits of the e4m3 value times 2^-8 (subnormals included), which
 * vcvtph2ps widens exactly. Without f8h: times 256 (exact), and the NaN codes 0x7f / 0xff
 * become sign | 0x7fc00000, moe_e4m3_to_f32's NaN. */
MOE_AI __m512 byte_values(const int kind, const int f8h, __m128i b)
{
    if (kind == MOE_WF_I8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7), _mm256_set1_epi16((short)0xbfff));
    __m512 f = _mm512_cvtph_ps(h);
    if (!f8h) {
        f = _mm512_mul_ps(f, _mm512_set1_ps(256.0f));
        const __mmask16 nan = _mm_cmpeq_epi8_mask(_mm_and_si128(b, _mm_set1_epi8(0x7f)), _mm_set1_epi8(0x7f));
        const __m512i sign = _mm512_and_si512(_mm512_castps_si512(f), _mm512_set1_epi32((int)0x80000000u));
        f = _mm512_mask_mov_ps(f, nan, _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x7fc00000))));
    }
    return f;
}

/* The exact f32 values of the codes of pair i (k = 2i in *even, k = 2i + 1 in *odd) of the
 * 16 lanes of one panel of width nw (mask: its lanes). panel: the panel's first code byte; z:
 * the group's zero points per lane (I4ZP). Lanes past nw read no memory. k = K (odd K, byte
 * formats) is code 0, +0. */
MOE_AI void decode_pair(const int kind, const int f8h, const uint8_t *panel, int64_t K, int nw, __mmask16 mask,
                        int64_t i, __m512 lut, __m512 z, __m512 *even, __m512 *odd)
{
    if (kind == MOE_WF_I8 || kind == MOE_WF_F8) {
        const uint8_t *row = panel + 2 * i * nw; /* rows 2i and 2i + 1: [2][nw] bytes of [K][nw] */
        const __m128i b0 = _mm_maskz_loadu_epi8(mask, row);
        const __m128i b1 = 2 * i + 1 < K ? _mm_maskz_loadu_epi8(mask, row + nw) : _mm_setzero_si128();
        *even = byte_values(kind, f8h, b0);
        *odd = byte_values(kind, f8h, b1);
        return;
    }
    /* 4-bit (quant/layout.h MOE_WF_I4; K even): body word (i / 4, j) holds pair i in byte i % 4,
     * k = 2i in its low nibble; the tail rows k - 8 K8 of ceil(nw / 2) bytes, two features each */
    const int64_t K8 = K / 8;
    __m512i lo, hi; /* per lane: the code of k = 2i (resp. 2i + 1) in bits 0..3 */
    if (2 * i < 8 * K8) {
        const uint8_t *wr = panel + 4 * (i / 4) * nw; /* [nw] body words */
        const __m512i v = _mm512_srl_epi32(_mm512_maskz_loadu_epi32(mask, wr), _mm_cvtsi32_si128(8 * (int)(i % 4)));
        lo = v;
        hi = _mm512_srli_epi32(v, 4);
    } else {
        const int rb = (nw + 1) / 2;
        const uint8_t *row = panel + 4 * nw * K8 + (2 * i - 8 * K8) * rb; /* rows 2i, 2i + 1: [2][rb] bytes */
        const __mmask16 bm = (__mmask16)((1u << rb) - 1u);
        /* each byte to two lanes (even feature: low nibble; odd: high nibble shifted down) */
        const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
        const __m128i b0 = _mm_maskz_loadu_epi8(bm, row), b1 = _mm_maskz_loadu_epi8(bm, row + rb);
        lo = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b0, b0)), sh);
        hi = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b1, b1)), sh);
    }
    *even = _mm512_permutexvar_ps(lo, lut);
    *odd = _mm512_permutexvar_ps(hi, lut);
    if (kind == MOE_WF_I4ZP) { /* code - z: integers, exact */
        *even = _mm512_sub_ps(*even, z);
        *odd = _mm512_sub_ps(*odd, z);
    }
}

/* Pairs [c0, c1) of one panel -> dst [c1 - c0][16] u32, lane j = bf16(v[2i]) | bf16(v[2i+1]) << 16
 * (the top halves of the exact f32 values; the odd value's low half is zero). */
MOE_AI void decode_chunk(const int kind, const int f8h, const uint8_t *panel, int64_t K, int nw, __mmask16 mask,
                         int64_t c0, int64_t c1, __m512 z, uint32_t *dst)
{
    const __m512 lut = lut4(kind);
    for (int64_t i = c0; i < c1; i++) {
        __m512 even, odd;
        decode_pair(kind, f8h, panel, K, nw, mask, i, lut, z, &even, &odd);
        const __m512i pair = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(even), 16), _mm512_castps_si512(odd));
        _mm512_store_si512(dst + (i - c0) * MOE_PANEL, pair);
    }
}

/* ---- stage 2: multiply ---- */

/* What a multiply tile needs beside its rows: the decoded chunk and where the group stands. */
typedef struct chunk_ctx {
    const uint32_t *buf; /* [BLOCK][CHUNK][16] decoded pairs; panel j at j * CHUNK * 16 */
    int64_t c0;          /* the chunk's first pair (index into the activation rows) */
    int n;               /* its pairs */
    int first, last;     /* the chunk opens / closes its group */
    int group0;          /* the group is group 0 (y = +0 before it) */
} chunk_ctx;

/* MB rows x NP panels over the chunk: acc from +0 (first chunk) or the carry rows; at the
 * group's end y = fma(acc, s, y) into out's rows (masked), else acc into the carry rows.
 * x: MB pair rows; carry [MB][BLOCK * 16]; out: row m at out + m * ldo, panel j's 16 columns at
 * 16 j; s, mask: per panel. */
MOE_AI void tile(const chunk_ctx *c, const uint32_t *buf, const int NP, const int MB, const uint8_t *const *x,
                 float *carry, float *out, int64_t ldo, const __m512 *s, const __mmask16 *mask)
{
    __m512 acc[4][6]; /* [panel][row] */
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++)
            acc[j][m] = c->first ? _mm512_setzero_ps() : _mm512_load_ps(carry + m * BLOCK * MOE_PANEL + j * MOE_PANEL);
    for (int i = 0; i < c->n; i++) {
        __m512i wv[4];
        for (int j = 0; j < NP; j++)
            wv[j] = _mm512_load_si512(buf + ((int64_t)j * CHUNK + i) * MOE_PANEL);
        for (int m = 0; m < MB; m++) {
            int32_t pair;
            memcpy(&pair, x[m] + 4 * (c->c0 + i), sizeof pair);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
            for (int j = 0; j < NP; j++)
                acc[j][m] = _mm512_dpbf16_ps(acc[j][m], (__m512bh)wv[j], xb);
        }
    }
    for (int j = 0; j < NP; j++)
        for (int m = 0; m < MB; m++) {
            if (c->last) {
                float *o = out + m * ldo + j * MOE_PANEL;
                const __m512 y = c->group0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], o);
                _mm512_mask_storeu_ps(o, mask[j], _mm512_fmadd_ps(acc[j][m], s[j], y));
            } else {
                _mm512_store_ps(carry + m * BLOCK * MOE_PANEL + j * MOE_PANEL, acc[j][m]);
            }
        }
}

/* rows x NP panels (4, or 1 at buf's panel 0): tiles of 6 rows, then the rest */
MOE_AI void tile_rows_np(const chunk_ctx *c, const uint32_t *buf, const int NP, int rows, const uint8_t *const *x,
                         float *carry, float *out, int64_t ldo, const __m512 *s, const __mmask16 *mask)
{
    int m0 = 0;
    for (; m0 + TILE_ROWS <= rows; m0 += TILE_ROWS)
        tile(c, buf, NP, TILE_ROWS, x + m0, carry + m0 * BLOCK * MOE_PANEL, out + m0 * ldo, ldo, s, mask);
    const uint8_t *const *xr = x + m0;
    float *cr = carry + m0 * BLOCK * MOE_PANEL, *o = out + m0 * ldo;
    switch (rows - m0) {
    case 0: break;
    case 1: tile(c, buf, NP, 1, xr, cr, o, ldo, s, mask); break;
    case 2: tile(c, buf, NP, 2, xr, cr, o, ldo, s, mask); break;
    case 3: tile(c, buf, NP, 3, xr, cr, o, ldo, s, mask); break;
    case 4: tile(c, buf, NP, 4, xr, cr, o, ldo, s, mask); break;
    default: tile(c, buf, NP, 5, xr, cr, o, ldo, s, mask); break;
    }
}

/* Every row against the chunk's np decoded panels: 4 at a time when the block is full, else
 * one by one. Not inlined: one copy serves every format. */
static void multiply_chunk(const chunk_ctx *c, int np, int rows, const uint8_t *const *x, float *carry, float *out,
                           int64_t ldo, const __m512 *s, const __mmask16 *mask)
{
    if (np == BLOCK) {
        tile_rows_np(c, c->buf, BLOCK, rows, x, carry, out, ldo, s, mask);
        return;
    }
    for (int j = 0; j < np; j++)
        tile_rows_np(c, c->buf + (int64_t)j * CHUNK * MOE_PANEL, 1, rows, x, carry + j * MOE_PANEL,
                     out + j * MOE_PANEL, ldo, s + j, mask + j);
}

/* ---- the kernel ---- */

MOE_AI void qbf16_rows(const moe_pmat *w, const int kind, const int f8h, int64_t p0, int64_t p1,
                       const uint8_t *const *xq, int mb, float *out, int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k, K2 = (K + 1) / 2, ng = q->ng;
    const int four = kind == MOE_WF_I4 || kind == MOE_WF_I4ZP || kind == MOE_WF_FP4;
    const int64_t panel_bytes = (four ? 8 : 16) * K; /* a full panel's codes */
    /* pairs per scale group (even groups; one group: all of K, its odd end +0) */
    const int64_t gp = ng > 1 ? q->gk / 2 : K2;
    _Alignas(64) uint32_t buf[BLOCK * CHUNK * MOE_PANEL];       /* [BLOCK][CHUNK][16] decoded pairs */
    _Alignas(64) float carry[ROW_BLOCK * BLOCK * MOE_PANEL];    /* [ROW_BLOCK][BLOCK * 16] group sums across chunks */
    for (int m0 = 0; m0 < mb; m0 += ROW_BLOCK) {
        const int rows = mb - m0 < ROW_BLOCK ? mb - m0 : ROW_BLOCK;
        const uint8_t *const *x = xq + m0;
        for (int64_t p = p0; p < p1; p += BLOCK) {
            const int np = p1 - p < BLOCK ? (int)(p1 - p) : BLOCK;
            const uint8_t *panel[BLOCK]; /* each panel's codes */
            int nw[BLOCK];
            __mmask16 mask[BLOCK];
            for (int j = 0; j < np; j++) {
                nw[j] = moe_pmat_panel_width(w->n, p + j);
                panel[j] = (const uint8_t *)w->data + (p + j) * panel_bytes;
                mask[j] = (__mmask16)((1u << nw[j]) - 1u);
            }
            float *o = out + (int64_t)m0 * ldo + (p - p0) * MOE_PANEL;
            for (int64_t g = 0; g < ng; g++) {
                const int64_t gi0 = g * gp, gi1 = gi0 + gp < K2 ? gi0 + gp : K2;
                __m512 s[BLOCK], z[BLOCK]; /* the group's scales and zero points per panel lane */
                for (int j = 0; j < np; j++) {
                    const int64_t at = (p + j) * MOE_PANEL * ng + g * nw[j]; /* [ng][nw] per panel */
                    s[j] = _mm512_maskz_loadu_ps(mask[j], q->scale + at);
                    z[j] = kind == MOE_WF_I4ZP ? _mm512_maskz_loadu_ps(mask[j], q->zero + at) : _mm512_setzero_ps();
                }
                for (int64_t c0 = gi0; c0 < gi1; c0 += CHUNK) {
                    const int64_t c1 = c0 + CHUNK < gi1 ? c0 + CHUNK : gi1;
                    for (int j = 0; j < np; j++)
                        decode_chunk(kind, f8h, panel[j], K, nw[j], mask[j], c0, c1, z[j],
                                     buf + (int64_t)j * CHUNK * MOE_PANEL);
                    const chunk_ctx c = {.buf = buf, .c0 = c0, .n = (int)(c1 - c0), .first = c0 == gi0,
                                         .last = c1 == gi1, .group0 = g == 0};
                    multiply_chunk(&c, np, rows, x, carry, o, ldo, s, mask);
                }
            }
        }
    }
}

void moe_ukr_qbf16_i8_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                            int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_I8, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_fp8_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                             const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                             int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    if (w->q->f8h) /* codes e4m3 * 2^-8, scales s * 256 (moe_qmat.f8h, chosen at packing) */
        qbf16_rows(w, MOE_WF_F8, 1, p0, p1, xq, mb, out, ldo);
    else
        qbf16_rows(w, MOE_WF_F8, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_i4_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                            int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_I4, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_i4zp_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                              const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                              int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_I4ZP, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_mxfp4_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                               const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                               int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_FP4, 0, p0, p1, xq, mb, out, ldo);
}
