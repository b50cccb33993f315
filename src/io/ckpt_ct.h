/* The compressed-tensors reader (src/io/ckpt_ct.c): quant_method "compressed-tensors"
 * checkpoints' int4 / int8 experts. It sits below the checkpoint loader and reaches tensors
 * only through a moe_ckq_lookup. Not installed; not API. */
#ifndef MOE_IO_CKPT_CT_H
#define MOE_IO_CKPT_CT_H

#include "core/internal.h"

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

/* The parsed quantization_config of a compressed-tensors checkpoint. */
typedef struct moe_ckq moe_ckq;
/* One layer's quantized experts: owned converted buffers and the per-expert pointers. */
typedef struct moe_ckq_layer moe_ckq_layer;

/* Tensor lookup of the checkpoint loader: has() is silent; get() fills *info and *path (the
 * file) or records an error naming the tensor. */
typedef struct moe_ckq_lookup {
    bool (*has)(void *u, const char *name);
    moe_status (*get)(void *u, const char *name, moe_tensor_info *info, const char **path);
    void *u;
} moe_ckq_lookup;

/* quantization_config `qc` (read from `config_path`, field prefix `qpre`): *out = NULL when
 * quant_method is not "compressed-tensors"; else the scheme, or an error naming the field
 * that libmoe does not load. */
moe_status moe_ckq_parse(moe_ctx *ctx, const char *config_path, const char *qpre, const json_t *qc,
                         moe_ckq **out);
void moe_ckq_free(moe_ckq *q);

/* The routed experts of one layer, per-expert layout `prefix`experts.<e>.<proj[j]> (j = gate,
 * up, down; gate/up [I, H], down [H, I]) for experts [e_lo, e_hi) of E: codes[j][e] receive
 * the code pointers (libmoe's source layout), and *out the scales and zero points. *out =
 * NULL (nothing set) when this layer's experts are not quantized (a float `weight`: a layer
 * the quantization left out). describe != 0: validate every tensor (names, dtypes, shapes)
 * and fill *out's scheme only, converting nothing (codes, scales and zero points stay NULL):
 * what moe_checkpoint_layer_desc needs. */
moe_status moe_ckq_layer_load(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *prefix,
                              const char *const proj[3], int64_t e_lo, int64_t e_hi, int64_t E, int64_t I,
                              int64_t H, int describe, const void **codes[3], moe_ckq_layer **out);
void moe_ckq_layer_free(moe_ckq_layer *l);

/* The shared expert's three linears base[j] (module names "<prefix>shared_expert(s).<proj>",
 * j = gate, up, down) of a compressed-tensors checkpoint: *quantized = 1 when they are stored
 * quantized in q's scheme, 0 when they are float `weight`s. The tensors decide; MOE_EFORMAT
 * (naming the tensor, `dir` in the message) when they are inconsistent: some projections
 * quantized and some not, a float weight beside compressed tensors, a compressed linear missing
 * one of its tensors (e.g. weight_packed without weight_scale), or quantized tensors that
 * config.json says are not (quantization_config.ignore lists the module, or no config group
 * targets it). A float shared expert that the config says is quantized loads with a warning. */
moe_status moe_ckq_shared_check(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *dir,
                                const char *const base[3], int *quantized);
/* Linear `base` [N, K] stored in q's scheme: validate it (names, dtypes, shapes, as the routed
 * experts) and, unless describe, dequantize it into w [N, K] f32 with the routed kernels'
 * arithmetic (moe_quant_dequant_source: (v - z) * s or v * s, one f32 multiply). *code_bytes
 * (if not NULL): the bytes of its codes as stored. */
moe_status moe_ckq_dequant_linear(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *base,
                                  int64_t N, int64_t K, int describe, float *w, size_t *code_bytes);
/* q's weight scheme ("int4-g32-zp", ...) and whether it quantizes activations (w8a8). */
const moe_quant_config *moe_ckq_quant(const moe_ckq *q);
/* The checkpoint's quant_method as messages name it: "gptq", "awq" or "compressed-tensors". */
const char *moe_ckq_method(const moe_ckq *q);
/* 1 when a loaded layer's experts are f32 [N, K] matrices (quant NONE): a GPTQ act-order layer
 * (src/io/ckpt_gptq.c); the codes pointers then point at them. */
int moe_ckq_layer_f32(const moe_ckq_layer *l);
/* desc.quant of a loaded layer. */
void moe_ckq_layer_quant(const moe_ckq_layer *l, moe_quant_config *out);
/* Scale and zero-point pointers of a loaded layer into src. */
void moe_ckq_layer_source(const moe_ckq_layer *l, moe_weight_source *src);

#endif
