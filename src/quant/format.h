/* The format table: one row per packed weight format (quant/layout.h moe_wfmt: plain f32 /
 * bf16 / f16 panels and every quantized scheme), holding what is particular to it: validation of
 * the description, packed sizes, TP slicing, packing and the exact decode of a code (the
 * definition the kernels must reproduce). The kernel tables (src/gemm/kernels.h) are indexed by
 * the same moe_wfmt, so a new scheme is a row here plus its kernel entries, not a switch in
 * every file. */
#ifndef MOE_QUANT_FORMAT_H
#define MOE_QUANT_FORMAT_H

#include "quant/layout.h"

/* One source matrix [N, K] to pack (moe_weight_source's view of it). */
typedef struct moe_pack_src {
    const void *data;     /* plain: elements (o, i) at data[o * so + i * si] in the row's dtype
                             (need not be aligned); quantized: the codes, row-major [N, K] */
    int64_t so, si;       /* plain: strides in elements; both 0 = row-major (K, 1) */
    const void *scale;    /* quantized: the scales in the shapes of moe_quant.h */
    const uint8_t *zero;  /* quantized with zero points: [rows, cols] of the scale grid, else NULL */
    moe_qweight qw;       /* quantized: the source's scheme (its scale granularity) */
    moe_qact act;         /* quantized: the layer's activation scheme */
    moe_dtype dt;         /* plain: the source elements' dtype (F32, BF16, F16) */
} moe_pack_src;

/* Where a packed matrix goes (sizes from the row: packed_bytes, and for the quantized rows
 * N * ng f32 scales, the same for zero points, N * comp_bytes for the compensation). */
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
                           "int8-w8a8", "fp8-w8a8", "bf16-pairs" */
    int bits;           /* bits of one stored code (plain rows: of the dtype); packed_bytes(N, K)
                           minus ceil(N * K * bits / 8) is what the layout pads */
    const char *pads;   /* what the layout pads, for the plan report (NULL: nothing) */
    int comp_bytes;     /* bytes per output feature the kernels read beside the scales (W8A8: the
                           int32 compensation 128 * sum_k w[n][k]); 0 for the others */
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
    /* The exact value of packed code (n, k) before its scale (moe_qmat_code): the definition the
     * kernels reproduce (f8h: the e4m3 value times 2^-8; zero points: the unsigned code, the
     * zero point not subtracted). NULL for the plain rows. */
    float (*code)(const moe_pmat *w, int64_t n, int64_t k);
    /* The exact value of a raw source code (the byte, or the nibble, of moe_quant.h's layout)
     * before its scale: what dequantization (moe_quant_dequant_source) multiplies. NULL for the
     * plain rows. */
    float (*value)(unsigned raw);
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
    /* 1 for the rows whose pack() picks between a fast decode (returns 1, moe_qmat.f8h) and the
     * exact, slower one (returns 0: the builder logs it) */
    int fast_decode;
} moe_format;

/* The row of format f (f < MOE_WF__COUNT). */
const moe_format *moe_format_row(moe_wfmt f);

/* The packed format of a quantized weight qw under activations act (qw->dtype != NONE). */
moe_wfmt moe_quant_kind(const moe_qweight *qw, moe_qact act);

/* Validate desc->quant: the generic checks, then each scheme's row (validate). */
moe_status moe_quant_validate(moe_ctx *ctx, const moe_layer_desc *d);

/* The exact value of code (n, k) of a packed quantized matrix before its scale (its row's code:
 * the f8h e4m3 value times 2^-8; int4 with zero points: the unsigned code, the zero point not
 * subtracted). */
float moe_qmat_code(const moe_pmat *w, int64_t n, int64_t k);

/* Dequantize one source matrix (codes, scales, zero points as moe_weight_source gives them)
 * [N, K] to f32 row-major, (v - z) * s or v * s rounded to f32 once (v: the row's value of
 * each code): the weights of the tests' f32 oracles and of dequantized-at-load shared experts. */
void moe_quant_dequant_source(const moe_qweight *qw, const void *codes, const void *scale, const uint8_t *zero,
                              int64_t N, int64_t K, float *out);

/* Bytes of a packed quantized matrix [N, K] of format kind. */
size_t moe_quant_packed_bytes(moe_wfmt kind, int64_t N, int64_t K);
/* Packs one source matrix into dst (moe_quant_packed_bytes), dscale / dzero ([N * ng] f32) and
 * comp (W8A8). Returns the value of moe_qmat.f8h for the packed matrix (0 unless fp8). */
int moe_quant_pack(const moe_qweight *qw, moe_qact act, const void *codes, const void *scale,
                   const uint8_t *zero, int64_t N, int64_t K, uint8_t *dst, float *dscale, float *dzero,
                   int32_t *comp);
#endif
