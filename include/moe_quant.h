/*
 * libmoe: quantized expert weights (schemes, scale granularity, moe_quantize_matrix).
 *
 * Part of the public API. Include moe.h, which includes this header where its types are
 * needed; this file also works on its own (it includes moe.h first).
 */
#include "moe.h"

#ifndef MOE_QUANT_H
#define MOE_QUANT_H

#ifdef __cplusplus
extern "C" {
#endif

/* MOE_API marks the public functions: the only symbols libmoe.so exports (the library is
 * built with -fvisibility=hidden; tests/exports.sh checks the export list against these
 * headers). Define MOE_API before including to override (e.g. empty). */
#ifndef MOE_API
#if defined(__GNUC__) || defined(__clang__)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif
#endif

/* ---------------------------------------------------------------------------------------
 * Quantized experts (vLLM's FusedMoEQuantConfig). The routed experts' w13 (gate and up) and
 * w2 (down) may each hold quantized codes with scales; the router, biases and the shared
 * expert stay in weight_dtype. A weight element stands for
 *   w = v * s          (v the code's value: e4m3, int8, signed int4, e2m1; s its scale)
 *   w = (v - z) * s    (int4 with zero points: v the unsigned nibble 0..15, z in 0..15).
 * Weight-only kernels compute each scale group's dot product on the values v in f32 (one
 * fmaf per term, increasing k; zero points: minus z times the group's sum of x), then add it
 * times s with one fmaf per group: the same bits on every kernel table and batch, within f32
 * reassociation of the f32 path on the dequantized weights (docs/numerics.md section 5).
 *
 * Scale granularity, and the scale array the caller passes per expert and matrix
 * ([N, K] = the matrix's [out_features, in_features]: w13 gate and up [I, H], w2 [H, I]):
 *   MOE_QSCALE_TENSOR   one f32
 *   MOE_QSCALE_CHANNEL  [N] f32 (one per output feature)
 *   MOE_QSCALE_BLOCK    [ceil(N / block_n), ceil(K / block_k)] f32, row-major (vLLM's
 *                       [E, ceil(N/bn), ceil(K/bk)] per expert; DeepSeek-V3 / Qwen3-FP8
 *                       `weight_scale_inv`, which multiplies); partial trailing blocks use
 *                       the ceil-sized grid
 *   MOE_QSCALE_GROUP    [N, ceil(K / group_size)]: f32, or for MXFP4 u8 E8M0 exponents
 *                       (s = 2^(e - 127), e = 255 is NaN); zero points (INT4 only) have the
 *                       same shape, u8 values 0..15
 * Codes, row-major [N, K] per expert (strides unsupported): F8_E4M3 and I8 one byte per
 * element; INT4 and MXFP4 two per byte along K, low nibble = even k (K must be even),
 * [N, K/2] bytes (gpt-oss `*_blocks` [N, K/32, 16] is the same bytes).
 *
 * Accepted combinations (anything else is refused by moe_plan_create with a message naming
 * the field):
 *   F8_E4M3: TENSOR, CHANNEL or BLOCK scales; activations NONE (weight-only); or BLOCK
 *            scales with activations TOKEN_GROUP and act_group_size == block_k of w13 and of
 *            w2 ("fp8-block-w8a8", fp8 w8a8 as DeepSeek-V3 / Qwen3-FP8 run it; how the FP8
 *            block checkpoints' `activation_scheme: dynamic` is served; moe_checkpoint still
 *            loads them weight-only as fp8-block, pick fp8-block-w8a8 in the descriptor);
 *            or TENSOR, CHANNEL or BLOCK scales with activations STATIC ("fp8-tensor-static",
 *            "fp8-channel-static", "fp8-block-static": the static per-tensor FP8 input
 *            activations of llm-compressor's FP8 scheme, one input_scale per linear;
 *            act_group_size unused).
 *   I8:      TENSOR, CHANNEL, BLOCK or GROUP scales with activations NONE; or CHANNEL /
 *            TENSOR scales with activations TOKEN (w8a8: int8 x int8 -> int32, AVX512-VNNI).
 *            TOKEN activations with BLOCK weights are refused (they need per-token-group
 *            activations matching block_k, not implemented for int8).
 *   INT4:    GROUP scales, group_size 32, 64 or 128 (optional zero points), or CHANNEL;
 *            activations NONE.
 *   MXFP4:   GROUP scales with group_size 32, no zero points; activations NONE.
 *   block_n, block_k in [1, 2^20]; w13 and w2 are configured independently but must both be
 *   quantized or both NONE; TOKEN_GROUP with other weights, or with act_group_size !=
 *   block_k, is MOE_EUNSUPPORTED; STATIC with other than F8_E4M3 weights is MOE_EUNSUPPORTED.
 * Under EP / TP (moe_parallel.h "Parallelism") the caller passes the whole layer's source arrays (the
 *   other EP ranks' experts may be NULL); each rank packs its experts and, under TP, the gate/up
 *   rows and down columns [i0, i0 + I_t) of each, cut from the source codes and scales. A block
 *   or group cut by a shard boundary keeps its scale on both shards; a shard that starts inside a
 *   cell and leaves it is re-expressed with cells of gcd(cell, i0 mod cell) (e.g. Qwen3-30B-A3B-
 *   FP8, I = 768 at tp_size 4: shards 1 and 3 keep the down scales per 64 columns), the cut
 *   cell's scale repeated; no code is padded and the repeated scale bytes are logged (INFO, and
 *   per rank by `moe plan`). The weights are the same, so EP output is bit-identical to one
 *   process and TP output matches it within the TP bound. INT4 / MXFP4 need an even I_t on
 *   every rank (two codes per byte along I): moe_weights_create fails with MOE_ESHAPE on a rank
 *   whose shard is odd. w8a8 (TOKEN) under TP quantizes the down projection's input per shard:
 *   the per-token scale is max |h| over the rank's I_t columns (as vLLM's TP does), so TP w8a8
 *   output is the sum of per-shard w8a8 partials, not within the TP bound of one process.
 *   fp8 w8a8 (TOKEN_GROUP) under TP needs every rank's shard of I to start on a multiple of
 *   w2's block_k (so the activation groups of h line up with the weight blocks; e.g. I = 768
 *   over tp_size 2 or 3, not 4 or 5); otherwise moe_plan_create fails with MOE_EUNSUPPORTED.
 *   The groups then lie inside one rank, so every code and group scale is the one-process
 *   value and TP fp8 w8a8 output matches one process within the TP bound (only the sums are
 *   reassociated; docs/numerics.md section 6, tested under mpirun). EP is unaffected.
 * Dynamic activation quantization (TOKEN, int8): per row r of the GEMM input (the token's
 * hidden state before w13; the activation output h before w2), a = max_k |x[r][k]| (NaN
 * ignored), s = a / 127, q = rint(clamp(x / s, -127, 127)) (a NaN quotient gives -127);
 * an all-zero row gets s = 1 and q = 0, so its GEMM output is exactly 0 (R14).
 * Dynamic activation quantization (TOKEN_GROUP, fp8; vLLM per_token_group_quant_fp8): per
 * row and per group g of act_group_size consecutive channels (the last one partial),
 * a = max |x| over the group (NaN ignored), s[g] = max(a, 1e-10) / 448, q = e4m3(clamp(x /
 * s[g], -448, 448)) round to nearest even (a NaN element gives the NaN code; an infinite one
 * makes the group's s infinite and its own q NaN: the token's outputs are NaN). The GEMM
 * (vLLM w8a8_block_fp8_matmul): y = +0, then per group g in increasing order
 * y = y + (part_g * s[g]) * s_w[n / block_n][g], part_g the fmaf chain in increasing k from +0
 * of dec(q_x[k]) * dec(q_w[n][k]) over the group (docs/numerics.md section 5).
 * Static activation quantization (STATIC, fp8; compressed-tensors / llm-compressor static
 * per-tensor FP8, vLLM static_scaled_fp8_quant): the caller gives, per expert e, one scale
 * s13 = moe_weight_source.w13_input_scale[e] for the input of gate_proj and up_proj (the token's
 * hidden state, times the routing weight with apply_router_weight_on_input) and one s2 =
 * w2_input_scale[e] for the input of down_proj (the activation output h). Each must be finite
 * and > 0, else moe_weights_create fails with MOE_EINVAL naming the expert and the matrix. Per
 * element, q = e4m3(clamp(x / s, -448, 448)), the quotient rounded once in f32, then to
 * nearest even e4m3 (a NaN element gives the NaN code, +-inf gives +-448: clamped). The codes
 * depend on the expert, so a token routed to K experts is quantized K times (per position).
 * The GEMM is fp8 w8a8's with every activation group's scale s (one group of K along the input
 * for TENSOR / CHANNEL weights, groups of block_k for BLOCK): y[n] = +0, then per group g in
 * increasing order y = y + (part_g * s) * s_w[n][g], part_g the fmaf chain in increasing k from
 * +0 of dec(q_x[k]) * dec(q_w[n][k]) (TENSOR / CHANNEL: y[n] = +0 + (part * s) * s_w[n]).
 * The scales are applied per expert as given (as transformers 5.24's FP8Experts does with
 * activation_scheme "static": gate_up_proj_activation_scale [E], down_proj_activation_scale [E],
 * integrations/finegrained_fp8.py); vLLM instead collapses them to the maximum over
 * the experts (compressed_tensors_moe.py: w13_input_scale.max(), w2_input_scale.max()), so a
 * checkpoint whose experts have different input_scale runs with finer codes here. Under EP each
 * rank reads the scales of the experts it holds (a replica gets its logical expert's); under TP
 * every shard keeps its expert's two scales (they are per expert, not per column), so the
 * codes of x are the one-process codes, and those of h too (each h element is quantized alone),
 * and TP output matches one process within the TP bound.
 * ------------------------------------------------------------------------------------- */
typedef enum moe_qtype {
    MOE_QTYPE_NONE = 0,    /* weight_dtype, unquantized */
    MOE_QTYPE_F8_E4M3 = 1, /* e4m3fn: bias 7, no infinities, 0x7f / 0xff NaN, max 448 */
    MOE_QTYPE_I8 = 2,      /* int8, symmetric */
    MOE_QTYPE_INT4 = 3,    /* 4-bit, signed -8..7, or unsigned 0..15 with zero points */
    MOE_QTYPE_MXFP4 = 4    /* e2m1 (OCP MX), E8M0 scale per 32 along K (gpt-oss) */
} moe_qtype;

typedef enum moe_qscale {
    MOE_QSCALE_TENSOR = 0,
    MOE_QSCALE_CHANNEL = 1,
    MOE_QSCALE_BLOCK = 2,
    MOE_QSCALE_GROUP = 3
} moe_qscale;

typedef enum moe_qact {
    MOE_QACT_NONE = 0,       /* weight-only: f32 activations */
    MOE_QACT_TOKEN = 1,      /* dynamic, one scale per row (token) */
    MOE_QACT_TOKEN_GROUP = 2, /* dynamic, one scale per row per act_group_size channels */
    MOE_QACT_STATIC = 3       /* static: one caller-given scale per expert and matrix
                                 (moe_weight_source.w13_input_scale / w2_input_scale) */
} moe_qact;

typedef struct moe_qweight {
    moe_qtype dtype;         /* default NONE */
    moe_qscale scale;        /* granularity of the scales */
    int64_t block_n, block_k;/* MOE_QSCALE_BLOCK: block shape [out, in] (e.g. 128, 128) */
    int64_t group_size;      /* MOE_QSCALE_GROUP: elements along K per scale */
    int has_zero_point;      /* INT4 with GROUP scales: w = (q - z) * s (GPTQ / AWQ style) */
} moe_qweight;

typedef struct moe_quant_config {
    moe_qweight w13;         /* gate and up projections */
    moe_qweight w2;          /* down projection */
    moe_qact act;            /* activation quantization before each GEMM; default NONE */
    int64_t act_group_size;  /* MOE_QACT_TOKEN_GROUP: channels per scale (128); unused (0) with
                                MOE_QACT_STATIC, whose groups are the weights' (K, or block_k) */
} moe_quant_config;

/* Static short name of a scheme for logs and the command line: "none", "fp8-tensor",
 * "fp8-channel", "fp8-block", "fp8-block-w8a8" (act TOKEN_GROUP, act_group_size 128),
 * "fp8-tensor-static", "fp8-channel-static", "fp8-block-static" (act STATIC),
 * "int8-channel", "int8-w8a8", "int4-g128", "int4-g128-zp",
 * "mxfp4", ... ("custom" for anything else). */
MOE_API const char *moe_quant_name(const moe_quant_config *q);
/* Fill `q` with the named scheme (the names above; group sizes g32 g64 g128; "fp8-block"
 * is 128x128). MOE_EINVAL for an unknown name. */
MOE_API moe_status moe_quant_from_name(const char *name, moe_quant_config *q);
/* The i-th named scheme (0-based: "fp8-tensor", "fp8-channel", "fp8-block", ..., "mxfp4"; every
 * name moe_quant_from_name accepts except "none"), or NULL for i past the last. Static. */
MOE_API const char *moe_quant_scheme_name(size_t i);

/* Quantize one f32 matrix w [N, K] row-major (an expert's gate or up [I, H], down [H, I])
 * into the source format `qw` describes (codes, scales and zero points in the shapes above,
 * ready for moe_weight_source), as `moe quantize`-style tools and tests need it. Absmax per
 * scale cell: s = max|w| / qmax (448 e4m3, 127 int8, 7 int4; with zero points
 * s = (max - min) / 15 and z = rint(-min / s) clamped to 0..15; MXFP4 E8M0 exponent
 * floor(log2 max|w|) - 2 + 127 clamped to 0..254), s = 1 for an all-zero cell; codes round
 * to nearest even and saturate. moe_quantize_matrix_sizes gives the byte counts of the three
 * buffers (zero_bytes 0 without zero points). Both return MOE_EINVAL (nothing written) for a
 * qw that moe_plan_create would refuse whatever the activations (dtype NONE, N or K <= 0,
 * odd K for INT4 / MXFP4, block / group sizes < 1, zero points other than INT4 GROUP, MXFP4
 * without GROUP scales) and MOE_ENOMEM; w is not modified. */
MOE_API moe_status moe_quantize_matrix_sizes(const moe_qweight *qw, int64_t N, int64_t K, size_t *code_bytes,
                                     size_t *scale_bytes, size_t *zero_bytes);
MOE_API moe_status moe_quantize_matrix(const moe_qweight *qw, const float *w, int64_t N, int64_t K, void *codes,
                               void *scale, uint8_t *zero);

#ifdef __cplusplus
}
#endif

#endif /* MOE_QUANT_H */
