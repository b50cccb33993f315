/* The GPTQ / AWQ reader (src/io/ckpt_gptq.c): quant_method "gptq" (AutoGPTQ, GPTQModel) and
 * "awq" (AutoAWQ gemm) int4 / int8 linears, converted to libmoe's INT4 / I8 source layout
 * (include/moe_quant.h "Quantized experts"). Reached from the compressed-tensors reader
 * (src/io/ckpt_ct.c), which owns the layer and its buffers; tensors only through a
 * moe_ckq_lookup. Not installed; not API. */
#ifndef MOE_IO_CKPT_GPTQ_H
#define MOE_IO_CKPT_GPTQ_H

#include "io/ckpt_ct.h"

#include <jansson.h>

/* The parsed quantization_config of a GPTQ or AWQ checkpoint. */
typedef struct moe_gptq_scheme {
    int awq;            /* 1: AutoAWQ (version gemm), 0: GPTQ */
    int bits;           /* 4, or 8 (GPTQ sym only) */
    int64_t group_size; /* the checkpoint's input features per scale; -1: one group over K */
    int sym;            /* GPTQ sym: zero point 2^(bits-1) (as vLLM reads it; qzeros validated, not used) */
    int v1;             /* GPTQ checkpoint_format "gptq" (v1): qzeros hold z - 1 */
    int desc_act;       /* GPTQ desc_act (act-order): every quantized linear must have its g_idx */
} moe_gptq_scheme;

/* quantization_config `qc` (quant_method "gptq" or "awq") of `config_path` (field prefix
 * `qpre`) into *s and the libmoe scheme *qw (w13 = w2): INT4 (I8 for GPTQ bits 8) with GROUP
 * scales of the largest of 128 / 64 / 32 dividing group_size (the checkpoint's scale repeated
 * per libmoe group: exact), zero points when asymmetric; group_size -1 is CHANNEL when
 * symmetric, else GROUP 128 with the row's one scale and zero point repeated. MOE_EUNSUPPORTED
 * naming the field and the nearest supported format for what is not loaded (bits 2 / 3, AWQ
 * gemv / marlin, GPTQ marlin / bitblas checkpoint formats, asymmetric int8, group sizes not a
 * multiple of 32, GPTQModel `dynamic` per-module overrides); MOE_EFORMAT for malformed fields. */
moe_status moe_gptq_parse(moe_ctx *ctx, const char *config_path, const char *qpre, const json_t *qc,
                          moe_gptq_scheme *s, moe_qweight *qw);

/* Allocator of converted buffers (owned by the caller's layer); NULL on out of memory. */
typedef void *(*moe_gptq_alloc)(void *u, size_t n);

/* Linear `base` ([N, K] = [out_features, in_features]) stored as s says: validates
 * base.{qweight, qzeros, scales, g_idx} (names, dtypes, shapes, g_idx values) and, unless
 * describe, converts them into buffers from alloc: *codes INT4 [N, K/2] (low nibble even k;
 * signed when qw has no zero points) or I8 [N, K]; *scale f32 [N, ceil(K / qw.group_size)]
 * (GROUP) or [N] (CHANNEL); *zero u8 [N, ceil(K / qw.group_size)] 0..15 or NULL. Errors:
 * MOE_ENOTFOUND (a tensor missing, from lk), MOE_EDTYPE, MOE_ESHAPE, MOE_EFORMAT (g_idx out of
 * range, a v1 zero point of 16), MOE_ENOMEM. *act_order is set to 1 (else left) when base's
 * g_idx is not k / group_size (act-order, desc_act). to_f32 (with describe 0): *codes instead
 * receives the exact f32 dequantization [N, K] (w = (q - z) * s[g_idx[k]], z = 2^(b-1) when
 * symmetric) and *scale, *zero stay NULL: how an act-order layer loads (docs/checkpoints.md). */
moe_status moe_gptq_load_linear(moe_ctx *ctx, const moe_gptq_scheme *s, const moe_qweight *qw,
                                const moe_ckq_lookup *lk, const char *base, int64_t N, int64_t K, int describe,
                                int to_f32, int *act_order, moe_gptq_alloc alloc, void *u, const void **codes,
                                const void **scale, const uint8_t **zero);

#endif
