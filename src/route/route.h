/* Production routing: scoring, selection key, group-limited selection and top-k for a block of
 * tokens (moe.h "Layer description", docs/numerics.md section 1). */
#ifndef MOE_ROUTE_H
#define MOE_ROUTE_H

#include "core/internal.h"

/* Top-k selection algorithms (MOE_TOPK). Both give identical ids and weights. */
typedef enum moe_topk_method {
    MOE_TOPK_SORT = 0,  /* one pass keeping the K best in a sorted list (insertion) */
    MOE_TOPK_ROWMAX = 1 /* K rounds of row-max over the remaining experts */
} moe_topk_method;

/* Validate the routing and activation fields of a layer description (n_group, topk_group,
 * group_score, swiglu_alpha, swiglu_limit): MOE_EINVAL naming the field, recorded on ctx. */
moe_status moe_route_check_desc(moe_ctx *ctx, const moe_layer_desc *desc);

/* Bytes of scratch moe_route_topk needs (for one token at a time; any alignment of 4). */
size_t moe_route_scratch_bytes(const moe_layer_desc *desc);

/* Route T tokens: logits [T, E] -> ids [T, K], weights [T, K] (after renormalization,
 * before routed_scaling_factor). sel_bias: [E] f32 selection bias, or NULL. The same
 * selection (experts, and with groups, the kept groups) is made by either method; the
 * result is bit-identical to moe_ref_route. */
void moe_route_topk(const moe_layer_desc *desc, const float *sel_bias, const float *logits,
                    int64_t T, int32_t *ids, float *weights, void *scratch,
                    moe_topk_method method);

/* logits [T, E] += router bias [E] (f32 add), when bias is non-NULL. */
void moe_route_add_bias(const float *bias, int64_t T, int64_t E, float *logits);

#endif
