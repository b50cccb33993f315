/* Compute bf16 for the weight-only quantized formats (MOE_WF_I8, F8, I4, I4ZP, FP4) on
 * vdpbf16ps (table "avx512_bf16"): the same bits as moe_ukr_qbf16_rows_ref
 * (src/gemm/linear_bf16_ref.c; gemm/kernels.h "Compute bf16"): per scale group g the pair
 * chain part = dp(part, x[2i+1], v[2i+1]); part = dp(part, x[2i], v[2i]) from +0 on the codes'
 * exact values v (minus the zero point), then y = fmaf(part, s[g], y) from +0 in increasing g.
 *
 * Decode. A pair step of a panel (16 features, k = 2i and 2i + 1) becomes one zmm in the lane
 * layout of the pair panels (quant/layout.h MOE_WF_BF16P: lane j = bf16(v[2i]) |
 * bf16(v[2i+1]) << 16), vdpbf16ps's weight operand. Every code value is exact in bf16 (at most
 * 8 significant bits: int8, int4, int4 - z, e2m1, e4m3 with its subnormals, times 2^-8 when
 * f8h; e4m3's NaN codes give moe_e4m3_to_f32's quiet NaN):
 *  - int8, e4m3: the exact f32 values as the f32 kernels compute them
 *    (src/gemm/avx512/linear_q_avx512.c: vpmovsxbd + vcvtdq2ps; f16 bits + vcvtph2ps), whose
 *    top 16 bits are the bf16 (the low 16 are zero): the even k's top half under the odd k's;
 *  - int4, e2m1: one vpermw per pair on a 16-entry bf16 table (the f32 table's top halves),
 *    word 2j indexed by the even code, word 2j + 1 by the odd one; a body word row (8 codes
 *    per lane) is loaded once for its 4 pairs;
 *  - int4 with zero points: code - z is entry code + 16 - z of a table of t - 16 when the
 *    call's zero points are all in 0 .. 15 (the format's range), else f32 (vpermps, minus z).
 *
 * Multiply. Up to 4 rows (decode, T = 1): the codes are decoded into registers and used at
 * once by every row (tiles of 4 full panels, else one panel), accumulators over each whole
 * group. More rows: per block of 4 panels and chunk of up to 64 pairs inside a group, the
 * chunk is decoded once into a 16 KB stack buffer (L1), then tiles of 6 rows x 4 panels run
 * over it as tile() of linear_avx512_bf16.c (24 accumulators, one vdpbf16ps per row, panel
 * and pair), so at large T the decode is shared by every row of the call (the grouped driver
 * passes up to 48) and the kernel runs at about the pair-panel GEMM's rate. A group longer
 * than a chunk carries its partial sums from chunk to chunk in a second buffer.
 *
 * Bits. vdpbf16ps takes the weights as its first multiplicand and the row's activation pair
 * broadcast as the second (the order whose NaN propagation is that of the ref's fmaf chain,
 * payloads included, where only one multiplicand is NaN). At the group's end y = fma(part, s,
 * y), y held in out (+0 before group 0). Partial panels load and store masked (lanes past nw
 * decode zero bytes and are never stored); no load reaches past a panel. */
#include "gemm/avx512_bf16/avx512_bf16.h"

#include <immintrin.h>
#include <string.h>

#define MOE_AI static inline __attribute__((always_inline))

enum {
    CHUNK = 64,     /* pairs of k decoded at a time (128 k) */
    BLOCK = 4,      /* panels decoded at a time */
    TILE_ROWS = 6,  /* rows per multiply tile (24 accumulators with 4 panels) */
    ROW_BLOCK = 48, /* rows whose partial sums the carry buffer holds (the driver's MOE_GEMM_RB) */
    DIRECT_ROWS = 4, /* up to this many rows: no buffer, the codes decoded into registers */
};

/* ---- decode: the codes of one pair step of a panel -> 16 lanes of bf16 pairs ---- */

/* The 16-entry table of a 4-bit code's exact value, as f32 (vpermps reads an index's low 4
 * bits); zero points: the unsigned code, z subtracted after. */
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

/* The same table as bf16 words (the f32 values' top halves, exact), twice: words 0..15 and
 * 16..31, so vpermw (which reads an index's low 5 bits) ignores bit 4 of an index. */
MOE_AI __m512i lut4_bf16(const int kind)
{
    const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lut4(kind)), 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(h), h, 1);
}

/* Two vectors of exact f32 values -> lane j = bf16(even[j]) | bf16(odd[j]) << 16: the top
 * halves (the values have at most 8 significant bits, so odd's low half is zero). */
MOE_AI __m512i top_halves(__m512 even, __m512 odd)
{
    return _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(even), 16), _mm512_castps_si512(odd));
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

/* bf16 words of t - 16 for t = 0 .. 31: a 4-bit code c minus a zero point z in 0 .. 15 is
 * entry c + 16 - z (1 .. 31) */
MOE_AI __m512i lut_minus16(void)
{
    const __m512 lo = _mm512_setr_ps(-16.0f, -15.0f, -14.0f, -13.0f, -12.0f, -11.0f, -10.0f, -9.0f, -8.0f, -7.0f, -6.0f,
                                     -5.0f, -4.0f, -3.0f, -2.0f, -1.0f);
    const __m512 hi = _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f,
                                     13.0f, 14.0f, 15.0f);
    const __m256i l = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
    const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
}

/* The tables a decode reads (built once per call) and how zero points decode: zlut = 1 when
 * every zero point of the call's panels is in 0 .. 15 (the format's range: moe_quant.h), so
 * code - z is entry code + 16 - z of lut32; 0 (the packer takes any u8) through f32, where
 * code - z is exact too. A constant of each kernel instance. */
typedef struct decode_tables {
    __m512 lut;    /* 4-bit code -> f32 (zero points, zlut = 0) */
    __m512i lut16; /* 4-bit code -> bf16, twice (int4, e2m1) */
    __m512i lut32; /* t -> bf16(t - 16) (zero points, zlut = 1) */
    int zlut;
} decode_tables;

/* A scale group's zero points of one panel (I4ZP; zeros elsewhere): z per lane as f32, and
 * 16 - z in both 16-bit halves of its lane (zlut). */
typedef struct zeros {
    __m512 f;
    __m512i off;
} zeros;

/* Byte formats: rows 2i and 2i + 1 at row, row + nw ([2][nw] bytes of the panel's [K][nw]);
 * odd = 0 for the last pair of an odd K (its k = K is +0). */
MOE_AI __m512i bytes_pair(const int kind, const int f8h, const uint8_t *row, int nw, __mmask16 mask, int odd)
{
    if (kind == MOE_WF_F8 && f8h && nw == MOE_PANEL && odd) {
        /* both rows in one 32-byte load: 32 f16 words, the even row's in the low half */
        const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)row));
        const __m512i h = _mm512_and_si512(_mm512_slli_epi16(b, 7), _mm512_set1_epi16((short)0xbfff));
        return top_halves(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
    }
    const __m128i b0 = _mm_maskz_loadu_epi8(mask, row);
    const __m128i b1 = odd ? _mm_maskz_loadu_epi8(mask, row + nw) : _mm_setzero_si128();
    return top_halves(byte_values(kind, f8h, b0), byte_values(kind, f8h, b1));
}

/* 4-bit: lo, hi hold per lane the code of k = 2i (2i + 1) in bits 0..3 (higher bits are not
 * read; hi < 2^16). int4, e2m1: one vpermw on the bf16 table, word 2j indexed by lo, word
 * 2j + 1 by hi shifted up; zero points: the same indexes cut to the code, plus 16 - z, on the
 * t - 16 table (zlut), or code - z in f32 (integers, exact for any u8 z). */
MOE_AI __m512i nibbles_pair(const int kind, const decode_tables *t, __m512i lo, __m512i hi, const zeros *z)
{
    if (kind == MOE_WF_I4ZP && !t->zlut)
        return top_halves(_mm512_sub_ps(_mm512_permutexvar_ps(lo, t->lut), z->f),
                          _mm512_sub_ps(_mm512_permutexvar_ps(hi, t->lut), z->f));
    const __m512i idx = _mm512_mask_blend_epi16(0xaaaaaaaau, lo, _mm512_slli_epi32(hi, 16));
    if (kind == MOE_WF_I4ZP) /* entry code + 16 - z of the t - 16 table */
        return _mm512_permutexvar_epi16(
            _mm512_add_epi16(_mm512_and_si512(idx, _mm512_set1_epi16(15)), z->off), t->lut32);
    return _mm512_permutexvar_epi16(idx, t->lut16);
}

/* 4-bit body word row v (quant/layout.h MOE_WF_I4: pair q of the word in byte q, code 2q in its
 * low nibble), prepared once for its 4 pairs: int4 / e2m1 the vpermw indexes of pairs 0, 2
 * (a: words v and v << 12, i.e. each lane's bits 0..15 and 4..19; b: the same from bit 16),
 * pairs 1 and 3 being those shifted right by 8 within each word (zero points without zlut:
 * v itself, shifted per pair). */
typedef struct word4 {
    __m512i a, b;
} word4;

MOE_AI word4 word_prep(const int kind, const decode_tables *t, __m512i v)
{
    if (kind == MOE_WF_I4ZP && !t->zlut)
        return (word4){v, v};
    return (word4){_mm512_mask_blend_epi16(0xaaaaaaaau, v, _mm512_slli_epi32(v, 12)),
                   _mm512_mask_blend_epi16(0xaaaaaaaau, _mm512_srli_epi32(v, 16), _mm512_srli_epi32(v, 4))};
}

/* pair q (0..3, a constant) of a prepared body word */
MOE_AI __m512i word_pair(const int kind, const decode_tables *t, word4 w, const int q, const zeros *z)
{
    if (kind == MOE_WF_I4ZP && !t->zlut) {
        const __m512i x = _mm512_srli_epi32(w.a, 8 * q);
        return nibbles_pair(kind, t, x, _mm512_srli_epi32(x, 4), z);
    }
    __m512i idx = q < 2 ? w.a : w.b;
    if (q & 1)
        idx = _mm512_srli_epi16(idx, 8);
    if (kind == MOE_WF_I4ZP)
        return _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_and_si512(idx, _mm512_set1_epi16(15)), z->off),
                                        t->lut32);
    return _mm512_permutexvar_epi16(idx, t->lut16);
}

/* 4-bit tail rows t0 = 2i - 8 K8 and t0 + 1 of ceil(nw / 2) bytes each at row: byte j / 2 of a
 * row holds feature j, even features in the low nibble */
MOE_AI __m512i tail_pair(const int kind, const decode_tables *t, const uint8_t *row, int nw, const zeros *z)
{
    const int rb = (nw + 1) / 2;
    const __mmask16 bm = (__mmask16)((1u << rb) - 1u);
    const __m512i sh = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    const __m128i b0 = _mm_maskz_loadu_epi8(bm, row), b1 = _mm_maskz_loadu_epi8(bm, row + rb);
    /* each byte to two lanes, the odd feature's nibble shifted down */
    const __m512i lo = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b0, b0)), sh);
    const __m512i hi = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b1, b1)), sh);
    return nibbles_pair(kind, t, lo, hi, z);
}

/* Pair i (k = 2i, 2i + 1) of the 16 lanes of one panel of width nw (mask: its lanes) as bf16
 * pairs of the codes' exact values (quant/layout.h MOE_WF_BF16P's lanes). code: the panel's
 * first byte; z: the group's zero points per lane (I4ZP). Lanes past nw read no memory and
 * decode code 0. */
MOE_AI __m512i decode_pair(const int kind, const int f8h, const uint8_t *code, int64_t K, int nw, __mmask16 mask,
                           int64_t i, const decode_tables *t, const zeros *z)
{
    if (kind == MOE_WF_I8 || kind == MOE_WF_F8)
        return bytes_pair(kind, f8h, code + 2 * i * nw, nw, mask, 2 * i + 1 < K);
    const int64_t K8 = K / 8;
    if (2 * i >= 8 * K8)
        return tail_pair(kind, t, code + 4 * nw * K8 + (2 * i - 8 * K8) * ((nw + 1) / 2), nw, z);
    const __m512i v = _mm512_maskz_loadu_epi32(mask, code + 4 * (i / 4) * nw); /* body word row i / 4: [nw] words */
    const __m512i x = _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * (int)(i % 4))); /* the pair in bits 0..7 */
    return nibbles_pair(kind, t, x, _mm512_srli_epi32(x, 4), z);
}

/* ---- the panels of a block and a group's scales ---- */

/* Up to BLOCK panels from panel p: their codes, widths and lane masks. */
typedef struct block {
    int64_t p;                   /* the first panel */
    int np;                      /* panels */
    const uint8_t *code[BLOCK];  /* each panel's codes (quant/layout.h) */
    int nw[BLOCK];
    __mmask16 mask[BLOCK];
} block;

MOE_AI void block_at(const moe_pmat *w, const int kind, int64_t p, int64_t p1, block *b)
{
    const int four = kind == MOE_WF_I4 || kind == MOE_WF_I4ZP || kind == MOE_WF_FP4;
    const int64_t panel_bytes = (four ? 8 : 16) * w->k; /* a full panel's codes */
    b->p = p;
    b->np = p1 - p < BLOCK ? (int)(p1 - p) : BLOCK;
    for (int j = 0; j < b->np; j++) {
        b->nw[j] = moe_pmat_panel_width(w->n, p + j);
        b->code[j] = (const uint8_t *)w->data + (p + j) * panel_bytes;
        b->mask[j] = (__mmask16)((1u << b->nw[j]) - 1u);
    }
}

/* Pairs per scale group (even groups; one group: all of K, its odd end +0). */
static inline int64_t group_pairs(const moe_pmat *w)
{
    return w->q->ng > 1 ? w->q->gk / 2 : (w->k + 1) / 2;
}

/* Group g's scales (and zero points) of the block's panel j, per lane (q->scale: panel p at
 * p * 16 * ng, [ng][nw]). */
MOE_AI void group_params(const moe_pmat *w, const int kind, const block *b, int j, int64_t g, __m512 *s, zeros *z)
{
    const int64_t at = (b->p + j) * MOE_PANEL * w->q->ng + g * b->nw[j];
    *s = _mm512_maskz_loadu_ps(b->mask[j], w->q->scale + at);
    z->f = kind == MOE_WF_I4ZP ? _mm512_maskz_loadu_ps(b->mask[j], w->q->zero + at) : _mm512_setzero_ps();
    const __m512i off = _mm512_sub_epi32(_mm512_set1_epi32(16), _mm512_cvttps_epi32(z->f)); /* 1 .. 16 (zlut) */
    z->off = _mm512_or_si512(off, _mm512_slli_epi32(off, 16));
}

/* y = fma(part, s, y) into out's 16 columns of a panel (y = +0 before group 0), masked. A NaN
 * part or s wins over a NaN y in every vfmadd form, as in fmaf; which of a NaN part and a NaN
 * scale is kept is the compiler's choice in the ref too (NaN payloads are not part of the
 * contract). */
MOE_AI void apply_scale(float *o, __mmask16 mask, int group0, __m512 part, __m512 s)
{
    const __m512 y = group0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, o);
    _mm512_mask_storeu_ps(o, mask, _mm512_fmadd_ps(part, s, y));
}

/* ---- few rows (mb <= DIRECT_ROWS): decode into registers ---- */

/* The activation pair i of MB rows, broadcast. */
MOE_AI void row_pairs(const uint8_t *const *x, const int MB, int64_t i, __m512bh *xb)
{
    for (int m = 0; m < MB; m++) {
        int32_t pair;
        memcpy(&pair, x[m] + 4 * i, sizeof pair);
        xb[m] = (__m512bh)_mm512_set1_epi32(pair);
    }
}

/* MB rows x NP panels (from the block's panel j0; full: NP panels of 16 features) over all of
 * K: per pair step each panel's codes decoded once and used at once by every row; per group
 * acc from +0, then the scale. 4-bit body words are loaded once for their 4 pairs. */
MOE_AI void direct_tile(const moe_pmat *w, const int kind, const int f8h, const decode_tables *t, const block *b,
                        int j0, const int NP, const int full, const int MB, const uint8_t *const *x, float *out,
                        int64_t ldo)
{
    const int four = kind == MOE_WF_I4 || kind == MOE_WF_I4ZP || kind == MOE_WF_FP4;
    const int64_t K = w->k, K2 = (K + 1) / 2, gp = group_pairs(w), body = four ? K / 8 * 4 : 0;
    const uint8_t *code[4]; /* each panel's codes */
    int nw[4];
    __mmask16 mask[4];
    for (int j = 0; j < NP; j++) {
        code[j] = b->code[j0 + j];
        nw[j] = full ? MOE_PANEL : b->nw[j0 + j];
        mask[j] = full ? (__mmask16)0xffffu : b->mask[j0 + j];
    }
    for (int64_t g = 0; g < w->q->ng; g++) {
        const int64_t i0 = g * gp, i1 = i0 + gp < K2 ? i0 + gp : K2;
        __m512 s[4];
        zeros z[4];
        for (int j = 0; j < NP; j++)
            group_params(w, kind, b, j0 + j, g, &s[j], &z[j]);
        __m512 acc[4][DIRECT_ROWS]; /* [panel][row] */
        for (int j = 0; j < NP; j++)
            for (int m = 0; m < MB; m++)
                acc[j][m] = _mm512_setzero_ps();
        int64_t i = i0;
        if (four) /* whole body words: 4 pairs per load, shifted by constants */
            for (i = i0; i < i1; i++) {
                if (i % 4 == 0 && i + 4 <= i1 && i + 4 <= body)
                    break;
                __m512bh xb[DIRECT_ROWS];
                row_pairs(x, MB, i, xb);
                for (int j = 0; j < NP; j++) {
                    const __m512i wv = decode_pair(kind, f8h, code[j], K, nw[j], mask[j], i, t, &z[j]);
                    for (int m = 0; m < MB; m++)
                        acc[j][m] = _mm512_dpbf16_ps(acc[j][m], (__m512bh)wv, xb[m]);
                }
            }
        if (four)
            for (; i + 4 <= i1 && i + 4 <= body; i += 4) {
                word4 v[4]; /* [panel] the body word row i / 4, prepared */
                for (int j = 0; j < NP; j++)
                    v[j] = word_prep(kind, t, _mm512_maskz_loadu_epi32(mask[j], code[j] + 4 * (i / 4) * nw[j]));
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    __m512bh xb[DIRECT_ROWS];
                    row_pairs(x, MB, i + q, xb);
                    for (int j = 0; j < NP; j++) {
                        const __m512i wv = word_pair(kind, t, v[j], q, &z[j]);
                        for (int m = 0; m < MB; m++)
                            acc[j][m] = _mm512_dpbf16_ps(acc[j][m], (__m512bh)wv, xb[m]);
                    }
                }
            }
        for (; i < i1; i++) {
            __m512bh xb[DIRECT_ROWS];
            row_pairs(x, MB, i, xb);
            for (int j = 0; j < NP; j++) {
                const __m512i wv = decode_pair(kind, f8h, code[j], K, nw[j], mask[j], i, t, &z[j]);
                for (int m = 0; m < MB; m++)
                    acc[j][m] = _mm512_dpbf16_ps(acc[j][m], (__m512bh)wv, xb[m]);
            }
        }
        for (int j = 0; j < NP; j++)
            for (int m = 0; m < MB; m++)
                apply_scale(out + m * ldo + j * MOE_PANEL, mask[j], g == 0, acc[j][m], s[j]);
    }
}

MOE_AI void direct_rows(const moe_pmat *w, const int kind, const int f8h, const decode_tables *t, const block *b,
                        int j0, const int NP, const int full, int mb, const uint8_t *const *x, float *out, int64_t ldo)
{
    switch (mb) {
    case 1: direct_tile(w, kind, f8h, t, b, j0, NP, full, 1, x, out, ldo); break;
    case 2: direct_tile(w, kind, f8h, t, b, j0, NP, full, 2, x, out, ldo); break;
    case 3: direct_tile(w, kind, f8h, t, b, j0, NP, full, 3, x, out, ldo); break;
    default: direct_tile(w, kind, f8h, t, b, j0, NP, full, 4, x, out, ldo); break;
    }
}

/* ---- more rows: decode a chunk once into a buffer, then tiles of 6 rows over it ---- */

/* Pairs [c0, c1) of the block's panel j -> dst [c1 - c0][16] u32 pair lanes (4-bit body words:
 * one load for 4 pairs). */
MOE_AI void decode_chunk(const moe_pmat *w, const int kind, const int f8h, const decode_tables *t, const block *b,
                         int j, int64_t c0, int64_t c1, const zeros *z, uint32_t *dst)
{
    const int four = kind == MOE_WF_I4 || kind == MOE_WF_I4ZP || kind == MOE_WF_FP4;
    const int64_t K = w->k, body = four ? K / 8 * 4 : 0;
    const uint8_t *code = b->code[j];
    const int nw = b->nw[j];
    const __mmask16 mask = b->mask[j];
    int64_t i = c0;
    for (; i < c1 && !(four && i % 4 == 0 && i + 4 <= c1 && i + 4 <= body); i++)
        _mm512_store_si512(dst + (i - c0) * MOE_PANEL, decode_pair(kind, f8h, code, K, nw, mask, i, t, z));
    for (; four && i + 4 <= c1 && i + 4 <= body; i += 4) {
        const word4 v = word_prep(kind, t, _mm512_maskz_loadu_epi32(mask, code + 4 * (i / 4) * nw)); /* [nw] words */
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++)
            _mm512_store_si512(dst + (i + q - c0) * MOE_PANEL, word_pair(kind, t, v, q, z));
    }
    for (; i < c1; i++)
        _mm512_store_si512(dst + (i - c0) * MOE_PANEL, decode_pair(kind, f8h, code, K, nw, mask, i, t, z));
}

/* What a multiply tile needs beside its rows: the decoded chunk and where the group stands. */
typedef struct chunk_ctx {
    const uint32_t *buf; /* [BLOCK][CHUNK][16] decoded pairs; panel j at j * CHUNK * 16 */
    int64_t c0;          /* the chunk's first pair (index into the activation rows) */
    int n;               /* its pairs */
    int first, last;     /* the chunk opens / closes its group */
    int group0;          /* the group is group 0 (y = +0 before it) */
} chunk_ctx;

/* MB rows x NP panels over the chunk: acc from +0 (first chunk) or the carry rows; at the
 * group's end the scale into out's rows, else acc into the carry rows. x: MB pair rows; carry
 * [MB][BLOCK * 16]; out: row m at out + m * ldo, panel j's 16 columns at 16 j; s, mask: per
 * panel. */
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
            if (c->last)
                apply_scale(out + m * ldo + j * MOE_PANEL, mask[j], c->group0, acc[j][m], s[j]);
            else
                _mm512_store_ps(carry + m * BLOCK * MOE_PANEL + j * MOE_PANEL, acc[j][m]);
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

/* up to ROW_BLOCK rows against one block: per group, per chunk, decode then multiply */
MOE_AI void buffered_block(const moe_pmat *w, const int kind, const int f8h, const decode_tables *t, const block *b,
                           int rows, const uint8_t *const *x, float *out, int64_t ldo)
{
    const int64_t K2 = (w->k + 1) / 2, gp = group_pairs(w);
    _Alignas(64) uint32_t buf[BLOCK * CHUNK * MOE_PANEL];    /* [BLOCK][CHUNK][16] decoded pairs */
    _Alignas(64) float carry[ROW_BLOCK * BLOCK * MOE_PANEL]; /* [ROW_BLOCK][BLOCK * 16] group sums across chunks */
    for (int64_t g = 0; g < w->q->ng; g++) {
        const int64_t i0 = g * gp, i1 = i0 + gp < K2 ? i0 + gp : K2;
        __m512 s[BLOCK];
        zeros z[BLOCK];
        for (int j = 0; j < b->np; j++)
            group_params(w, kind, b, j, g, &s[j], &z[j]);
        for (int64_t c0 = i0; c0 < i1; c0 += CHUNK) {
            const int64_t c1 = c0 + CHUNK < i1 ? c0 + CHUNK : i1;
            for (int j = 0; j < b->np; j++)
                decode_chunk(w, kind, f8h, t, b, j, c0, c1, &z[j], buf + (int64_t)j * CHUNK * MOE_PANEL);
            const chunk_ctx c = {.buf = buf, .c0 = c0, .n = (int)(c1 - c0), .first = c0 == i0, .last = c1 == i1,
                                 .group0 = g == 0};
            multiply_chunk(&c, b->np, rows, x, carry, out, ldo, s, b->mask);
        }
    }
}

/* ---- the kernel ---- */

MOE_AI void qbf16_rows(const moe_pmat *w, const int kind, const int f8h, const int zlut, int64_t p0, int64_t p1,
                       const uint8_t *const *xq, int mb, float *out, int64_t ldo)
{
    const decode_tables t = {.lut = lut4(kind), .lut16 = lut4_bf16(kind), .lut32 = lut_minus16(), .zlut = zlut};
    if (mb <= DIRECT_ROWS) {
        const int64_t pf = w->n / MOE_PANEL < p1 ? w->n / MOE_PANEL : p1; /* full panels end */
        for (int64_t p = p0; p < p1; p += BLOCK) {
            block b;
            block_at(w, kind, p, p1, &b);
            float *o = out + (p - p0) * MOE_PANEL;
            if (p + BLOCK <= pf) /* 4 full panels */
                direct_rows(w, kind, f8h, &t, &b, 0, BLOCK, 1, mb, xq, o, ldo);
            else
                for (int j = 0; j < b.np; j++)
                    direct_rows(w, kind, f8h, &t, &b, j, 1, 0, mb, xq, o + j * MOE_PANEL, ldo);
        }
        return;
    }
    for (int m0 = 0; m0 < mb; m0 += ROW_BLOCK) {
        const int rows = mb - m0 < ROW_BLOCK ? mb - m0 : ROW_BLOCK;
        for (int64_t p = p0; p < p1; p += BLOCK) {
            block b;
            block_at(w, kind, p, p1, &b);
            buffered_block(w, kind, f8h, &t, &b, rows, xq + m0, out + (int64_t)m0 * ldo + (p - p0) * MOE_PANEL, ldo);
        }
    }
}

void moe_ukr_qbf16_i8_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                            int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_I8, 0, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_fp8_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                             const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                             int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    if (w->q->f8h) /* codes e4m3 * 2^-8, scales s * 256 (moe_qmat.f8h, chosen at packing) */
        qbf16_rows(w, MOE_WF_F8, 1, 0, p0, p1, xq, mb, out, ldo);
    else
        qbf16_rows(w, MOE_WF_F8, 0, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_i4_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                            int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_I4, 0, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_i4zp_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                              const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                              int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    /* the zero points of panels [p0, p1): panel p's [ng][nw] at p * 16 * ng, contiguous */
    const int64_t ng = w->q->ng, n1 = p1 * MOE_PANEL < w->n ? p1 * MOE_PANEL : w->n;
    const float *z = w->q->zero + p0 * MOE_PANEL * ng;
    int small = 1;
    for (int64_t i = 0; i < (n1 - p0 * MOE_PANEL) * ng; i++)
        small &= z[i] >= 0.0f && z[i] <= 15.0f;
    if (small)
        qbf16_rows(w, MOE_WF_I4ZP, 0, 1, p0, p1, xq, mb, out, ldo);
    else
        qbf16_rows(w, MOE_WF_I4ZP, 0, 0, p0, p1, xq, mb, out, ldo);
}

void moe_ukr_qbf16_mxfp4_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                               const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                               int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    qbf16_rows(w, MOE_WF_FP4, 0, 0, p0, p1, xq, mb, out, ldo);
}
