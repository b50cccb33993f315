/* The shared expert of one MoE layer (src/io/shared.c). Not installed; not API. */
#ifndef MOE_IO_SHARED_H
#define MOE_IO_SHARED_H

#include "io/config.h"
#include "io/tensors.h"

/* The shared expert of layer `layer`, whose block prefix is `prefix` (I_s = c->desc's
 * shared_expert_intermediate_size > 0): P<module>.{gate,up,down}_proj.weight in the router's
 * family naming (the row's shared.module; P is the row's shared.prefix when it has one) or,
 * for a row with shared.fused_gate_up, P<module>.<fused_gate_up>.weight [2 I_s, H] (gate rows,
 * then up rows: read as two views) and P<module>.<fused_down>.weight [H, I_s], float only
 * (MOE_EUNSUPPORTED names a quantized one); and, when gated, P<gate>.weight [1, H] in the
 * router's dtype. Float projections load in place (their dtype is the layer's weight dtype);
 * FP8 ones (all three) and compressed-tensors ones are validated like the routed experts and,
 * unless describe, dequantized to f32 into lt->sh_deq (logged with the byte count): the
 * layer's weight dtype is then F32. Errors: MOE_EDTYPE (some projections FP8 and some not, a
 * gate of another dtype than the router), MOE_EFORMAT (an inconsistent compressed-tensors
 * shared expert, moe_ckq_shared_check), MOE_EUNSUPPORTED (a quantized gate), those of the
 * lookups, MOE_ENOMEM. */
moe_status moe_ck_shared_resolve(const moe_ck_index *ix, const moe_ck_config *c, int64_t layer, const char *prefix,
                                 int describe, moe_ck_layer *lt);

#endif
