/* The packed weight layouts every kernel reads: panels of 16 output features (moe_pmat), the
 * weight formats (moe_wfmt: the index of the format table, quant/format.h, and of every kernel
 * table's entries, gemm/kernels.h) and what the quantized formats keep beside their codes
 * (moe_qmat). Types and inline helpers only. */
#ifndef MOE_QUANT_LAYOUT_H
#define MOE_QUANT_LAYOUT_H

#include "core/internal.h"

/* Output features per panel of a packed matrix. */
#define MOE_PANEL 16

/* Weight formats of a packed matrix (moe_pmat): the index of the format table and of every
 * kernel table's entries. */
typedef enum moe_wfmt {
    MOE_WF_F32 = 0,  /* plain panels [K][nw] of the dtype, converted exactly to f32 in the loop */
    MOE_WF_BF16 = 1,
    MOE_WF_F16 = 2,
    MOE_WF_F8 = 3,   /* e4m3, weight-only: panel p at byte p*16*K, [K][nw] (the source bytes) */
    MOE_WF_I8 = 4,   /* int8, weight-only: the same layout */
    MOE_WF_I4 = 5,   /* signed int4 (-8..7): panel p at byte p*8*K, holding K8 = K / 8 and Kt = K % 8
                        (0, 2, 4 or 6; K is even):
                          body [K8][nw] 4-byte words: word (kb, j) holds the 8 codes k = 8kb ..
                            8kb+7 of feature j, code 8kb+i in bits 4i..4i+3 (byte i/2, low nibble
                            for even i), i.e. 4 consecutive bytes of the source row;
                          tail [Kt][ceil(nw/2)] bytes at panel byte 4*nw*K8: row k - 8*K8, low
                            nibble = even feature.
                        A full panel is 64*K8 + 8*Kt = 8*K bytes; nothing is padded but the
                        odd-width tail nibble of a last panel with odd nw. */
    MOE_WF_I4ZP = 6, /* unsigned int4 (0..15) with zero points: as MOE_WF_I4 */
    MOE_WF_FP4 = 7,  /* e2m1 (mxfp4): as MOE_WF_I4 */
    MOE_WF_W8A8 = 8, /* int8 for VNNI, int8 activations per token: panel p at byte p*16*K4
                        (K4 = K rounded up to 4, zero-filled), [K4/4][nw][4] */
    MOE_WF_F8A8 = 9, /* e4m3 weights for fp8 w8a8 (activations TOKEN_GROUP, or STATIC with
                        moe_qmat.in_scale > 0; TENSOR / CHANNEL weights then have one group of
                        gk = K): the codes laid out as
                        MOE_WF_F8; scale holds s itself (never s * 256: the kernels multiply the
                        group's partial sum by s after the group); gk = block_k */
    MOE_WF_BF16P = 10, /* bf16 pairs for compute bf16 (moe.h MOE_COMPUTE_BF16): panel p at bf16
                        element p*32*K2 (K2 = ceil(K / 2)), [K2][nw][2]: element (n, k) at
                        (k / 2) * 2 nw + 2 (n % 16) + k % 2, so one 4-byte lane holds the pair
                        (2i, 2i+1) of one feature (vdpbf16ps's operand); for odd K the last
                        pair's second element is +0. Packed from f32 / bf16 / f16 sources by
                        round to nearest even (core/bf16.h moe_bf16_round). */
    MOE_WF__COUNT = 11
} moe_wfmt;

/* The units the packed layouts are made of, declared so their sizes are checked where the
 * kernels rely on them (a 16-feature panel row of them is one 64-byte zmm load). */

/* MOE_WF_I4 / I4ZP / FP4 body word: the 8 codes k = 8kb .. 8kb+7 of one feature, code i in
 * bits 4i .. 4i+3 (byte i / 2, low nibble for even i): 4 consecutive bytes of the source row. */
typedef struct moe_q4_word {
    uint8_t b[4];
} moe_q4_word;
_Static_assert(sizeof(moe_q4_word) == 4, "a 4-bit body word is 8 codes in 4 bytes");
_Static_assert(MOE_PANEL * sizeof(moe_q4_word) == 64, "a 4-bit panel row of 8 k is one 64-byte load");

/* MOE_WF_W8A8 quad: 4 consecutive k of one feature, the int8 operand of one vpdpbusd lane. */
typedef struct moe_w8a8_quad {
    int8_t k[4];
} moe_w8a8_quad;
_Static_assert(sizeof(moe_w8a8_quad) == 4, "a W8A8 quad is 4 int8 codes");
_Static_assert(MOE_PANEL * sizeof(moe_w8a8_quad) == 64, "a W8A8 panel row of 4 k is one 64-byte load");

/* What the kernels read beside moe_pmat.data for a quantized format (moe_pmat.q). */
struct moe_qmat {
    int kind;            /* moe_wfmt, one of the quantized formats */
    int f8h;             /* MOE_WF_F8A8: 1 when the matrix has no NaN code (the kernels may decode
                            through f16 to e4m3 * 2^-8, with activations pre-scaled by 2^8).
                            MOE_WF_F8 only: 1 when the codes are decoded through f16 (no NaN code
                            0x7f/0xff in the matrix, and every finite scale s has s * 256 finite):
                            the code's f16 bits (b & 0x80) << 8 | (b & 0x7f) << 7 are the e4m3
                            value times 2^-8 exactly, and scale holds s * 256 (exact): a group's
                            partial sum on the f16 values is the e4m3 one times 2^-8 exactly
                            (unless it meets the f32 subnormal range), so times s * 256 it gives
                            the same bits. 0: scale holds s, codes decoded as e4m3 directly. */
    int64_t gk;          /* scale group length along K */
    int64_t ng;          /* ceil(K / gk) */
    const float *scale;  /* panel p at p*16*ng: [ng][nw] f32 (W8A8: [N] f32 per channel) */
    const float *zero;   /* as scale (MOE_WF_I4ZP only), else NULL */
    const int32_t *comp; /* W8A8: [N] 128 * sum_k w[n][k] */
    float in_scale;      /* MOE_WF_F8A8 with static activations (moe_quant.h MOE_QACT_STATIC): the
                            expert's input scale s of this matrix (gate and up: w13_input_scale[e],
                            down: w2_input_scale[e]), every activation group's scale; 0: dynamic */
};

/* A linear layer's weight W [N, K] (N output features, K input features, nn.Linear layout)
 * packed into panels of MOE_PANEL output features, K-contiguous:
 *
 *   panel p (p = 0 .. ceil(N/16)-1) covers features n = 16p .. 16p + nw - 1, where
 *   nw = min(16, N - 16p), and is stored [K][nw] at element offset p * 16 * K.
 *
 * The last panel is stored at its true width (no padding). Element (n, k) lives at
 *   (n / 16) * 16 * K + k * nw(n / 16) + n % 16.
 * The packed matrix holds exactly N * K elements in the weight dtype (plain formats); the
 * quantized formats' layouts are those of moe_wfmt. */
typedef struct moe_pmat {
    const void *data;         /* the packed panels */
    moe_dtype dtype;          /* F32, BF16 or F16 (ignored when q is set; BF16 for pairs) */
    int64_t n, k;
    const struct moe_qmat *q; /* NULL, or the quantized format's scales (q->kind the format) */
    int pairs;                /* 1: MOE_WF_BF16P pair panels (plain, compute bf16) */
} moe_pmat;

static inline int64_t moe_pmat_panels(int64_t n)
{
    return (n + MOE_PANEL - 1) / MOE_PANEL;
}

/* Width of panel p of a matrix with n rows. */
static inline int moe_pmat_panel_width(int64_t n, int64_t p)
{
    int64_t w = n - p * MOE_PANEL;
    return (int)(w < MOE_PANEL ? w : MOE_PANEL);
}

/* Element offset of (row, col) in the packed layout. */
static inline int64_t moe_pmat_offset(int64_t n, int64_t k, int64_t row, int64_t col)
{
    int64_t p = row / MOE_PANEL;
    return p * MOE_PANEL * k + col * moe_pmat_panel_width(n, p) + row % MOE_PANEL;
}

/* The plain row of dtype dt (F32, BF16, F16). */
static inline moe_wfmt moe_plain_format(moe_dtype dt)
{
    return dt == MOE_DTYPE_BF16 ? MOE_WF_BF16 : dt == MOE_DTYPE_F16 ? MOE_WF_F16 : MOE_WF_F32;
}

/* The format of a packed matrix. */
static inline moe_wfmt moe_pmat_format(const moe_pmat *w)
{
    return w->q ? (moe_wfmt)w->q->kind : w->pairs ? MOE_WF_BF16P : moe_plain_format(w->dtype);
}

#endif
