/* Packed weight matrices and the format table: one row per layout the kernels read (plain
 * f32 / bf16 / f16 panels and every quantized scheme), holding what is particular to it:
 * validation of the description, source sizes, packing, TP slicing, the exact decode of a
 * code (the definition the kernels must reproduce) and dequantization. The kernel tables
 * (src/gemm/kernels.h) are indexed by the same moe_wfmt, so a new scheme is a row here plus
 * its kernel entries, not a switch in every file. */
#ifndef MOE_QUANT_FORMAT_H
#define MOE_QUANT_FORMAT_H

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
    MOE_WF_F8A8 = 9, /* e4m3 weights for fp8 w8a8 (activations TOKEN_GROUP): the codes laid out as
                        MOE_WF_F8; scale holds s itself (never s * 256: the kernels multiply the
                        group's partial sum by s after the group); gk = block_k */
    MOE_WF__COUNT = 10
} moe_wfmt;

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
    moe_dtype dtype;          /* F32, BF16 or F16 (ignored when q is set) */
    int64_t n, k;
    const struct moe_qmat *q; /* NULL, or the quantized format's scales (q->kind the format) */
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

/* The format of a packed matrix. */
static inline moe_wfmt moe_pmat_format(const moe_pmat *w)
{
    if (w->q)
        return (moe_wfmt)w->q->kind;
    return w->dtype == MOE_DTYPE_BF16 ? MOE_WF_BF16 : w->dtype == MOE_DTYPE_F16 ? MOE_WF_F16 : MOE_WF_F32;
}

/* One source matrix [N, K] to pack (moe_weight_source's view of it). */
typedef struct moe_pack_src {
    const void *data;     /* plain: elements (o, i) at data[o * so + i * si] in the row's dtype
                             (need not be aligned); quantized: the codes, row-major [N, K] */
    int64_t so, si;       /* plain: strides in elements; both 0 = row-major (K, 1) */
    const void *scale;    /* quantized: the scales in the shapes of moe_quant.h */
    const uint8_t *zero;  /* quantized with zero points: [rows, cols] of the scale grid, else NULL */
    moe_qweight qw;       /* quantized: the source's scheme (its scale granularity) */
    moe_qact act;         /* quantized: the layer's activation scheme */
} moe_pack_src;

/* Where a packed matrix goes (sizes from the row: packed_bytes, and for the quantized rows
 * N * ng f32 scales, the same for zero points, N int32 for W8A8). */
typedef struct moe_pack_dst {
    void *data;      /* packed_bytes(N, K) */
    float *scale;    /* quantized: [N * ng] by panel ([ng][nw] per panel) */
    float *zero;     /* MOE_WF_I4ZP: as scale; else NULL */
    int32_t *comp;   /* MOE_WF_W8A8: [N] 128 * sum_k w[n][k]; else NULL */
} moe_pack_dst;

/* One row of the format table. The quantized rows' functions take the source format of
 * moe_quant.h (codes, scales, zero points per expert and matrix, row-major [N, K]). */
typedef struct moe_format {
    moe_wfmt fmt;
    const char *name;   /* "f32", "bf16", "f16", "fp8", "int8", "int4", "int4-zp", "mxfp4",
                           "int8-w8a8", "fp8-w8a8" */
    moe_qtype qtype;    /* MOE_QTYPE_NONE for the plain rows */
    moe_qact act;       /* the activations the kernels quantize before this format's GEMMs */
    int four_bit;       /* two codes per byte along K (K must be even) */
    /* Bytes of one output feature's packed codes along K (the panel row stride, for prefetch
     * hints): K elements of the dtype, K (8-bit), K4 (W8A8), K / 2 (4-bit). */
    int64_t (*feature_bytes)(int64_t K);
    /* Bytes of the whole packed matrix [N, K]. */
    size_t (*packed_bytes)(int64_t N, int64_t K);
    /* Validate quant.<which> (K: its input dimension) with the layer's activation scheme;
     * MOE_OK or the error recorded on ctx naming the field. NULL: nothing to check. */
    moe_status (*validate)(moe_ctx *ctx, const char *which, const moe_qweight *w, moe_qact act,
                           int64_t act_group, int64_t K);
    /* The exact value of packed code (n, k) before its scale: decode_ref, the definition the
     * kernels reproduce (f8h: the e4m3 value times 2^-8; zero points: the unsigned code, the
     * zero point not subtracted). NULL for the plain rows. */
    float (*code)(const moe_pmat *w, int64_t n, int64_t k);
    /* Pack src [N, K] into dst; returns moe_qmat.f8h for the fp8 rows, else 0. */
    int (*pack)(const moe_pack_src *src, int64_t N, int64_t K, const moe_pack_dst *dst);
    /* The TP shard rows [n0, n0 + Ns) x columns [k0, k0 + Ks) of src [N, K] as a source of its
     * own in *out: plain rows offset the pointer (no copy); quantized rows copy the codes and
     * scales into malloc'd bufs (free all three after packing; a cut scale cell is
     * re-expressed, moe_quant_slice_qweight). 0, or -1 when the shard cannot be expressed
     * (an odd 4-bit width) or out of memory. */
    int (*slice)(const struct moe_format *f, const moe_pack_src *src, int64_t N, int64_t K, int64_t n0, int64_t Ns,
                 int64_t k0, int64_t Ks, moe_pack_src *out, void *bufs[3]);
    /* Grouped driver: work items claimed per dynamic-schedule step, and whether the kernels
     * take the next item's weights as a prefetch hint (linear_rows' pf). */
    int claim;
    int prefetch;
} moe_format;

/* The row of format f (f < MOE_WF__COUNT). */
const moe_format *moe_format_row(moe_wfmt f);

/* The packed format of a quantized weight qw under activations act (qw->dtype != NONE). */
moe_wfmt moe_quant_kind(const moe_qweight *qw, moe_qact act);
/* The plain row of dtype dt (F32, BF16, F16). */
static inline moe_wfmt moe_plain_format(moe_dtype dt)
{
    return dt == MOE_DTYPE_BF16 ? MOE_WF_BF16 : dt == MOE_DTYPE_F16 ? MOE_WF_F16 : MOE_WF_F32;
}

/* ---- plain panels (quant/pack.c) ---- */

/* Pack W [n, k] whose element (o, i) sits at src[o * so + i * si] (elements of dtype dt; src
 * need not be aligned) into the panel layout at dst (n * k elements of dt). */
void moe_pack_strided(void *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so, int64_t si);
/* Pack W [n, k] (row-major, rows ld >= k elements apart) into panels at dst (same dtype). */
void moe_pack_panels_ld(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k, int64_t ld);
void moe_pack_panels(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k);
/* Convert a small [n, k] matrix (dtype dt, row-major, any alignment) to f32 and pack it into
 * panels; returns a moe_alloc_aligned buffer of n * k floats, or NULL when out of memory. */
void *moe_pack_f32(const void *src, moe_dtype dt, int64_t n, int64_t k);
/* Convert `count` elements of dtype at src (any alignment) to f32, exactly. */
void moe_convert_to_f32(float *dst, const void *src, moe_dtype dtype, size_t count);

#endif
