/* The routed experts of one MoE layer in the layouts a family's row names
 * (src/io/layouts.c). Not installed; not API. */
#ifndef MOE_IO_LAYOUTS_H
#define MOE_IO_LAYOUTS_H

#include "io/config.h"
#include "io/tensors.h"

/* The routed experts of layer `layer` (block prefix `prefix`) for lt's experts [e_lo, e_hi):
 * the layout is chosen from the row and the tensors present (layouts.c says how), every
 * tensor checked, and lt's expert pointers (strides, scales, biases) pointed into the mapped
 * files. describe != 0 (moe_checkpoint_layer_desc): validate only (no compressed-tensors
 * conversion, no NaN scale scan). Errors: MOE_EFORMAT (MXFP4 tensors without quantization_config
 * mxfp4, H or I not a multiple of 32), MOE_EUNSUPPORTED (fp8 in a stacked layout), those of the
 * lookups, MOE_ENOMEM. */
moe_status moe_ck_experts_resolve(const moe_ck_index *ix, const moe_ck_config *c, int64_t layer, const char *prefix,
                                  int describe, moe_ck_layer *lt);

/* MXFP4 layers, when loading: copy the local experts' interleaved gate_up rows (gate = even,
 * up = odd) apart into row-major gate and up codes and scales (moe_weight_source takes
 * quantized codes row-major only). The copy (lt->gu_split, logged at INFO with its size)
 * lives until moe_ck_layer_free, after moe_weights_create has packed it. */
moe_status moe_ck_mxfp4_split_gate_up(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt,
                                      int64_t layer);

#endif
