/* Production routing: scoring and top-k for a block of tokens. */
#ifndef MOE_ROUTE_H
#define MOE_ROUTE_H

#include "core/kernels.h"

/* Top-k selection algorithms (MOE_TOPK). Both give identical ids and weights. */
typedef enum moe_topk_method {
    MOE_TOPK_SORT = 0,  /* one pass keeping the K best in a sorted list (insertion) */
    MOE_TOPK_ROWMAX = 1 /* K rounds of row-max over the remaining experts */
} moe_topk_method;

/* Softmax scoring, top-k (value descending, lower id first, NaN last), renormalize:
 * logits [T, E] -> ids [T, K], weights [T, K]. scores_scratch [E]. Same bits as
 * moe_ref_route (docs/numerics.md) for either method. */
void moe_route_topk(const moe_layer_desc *desc, const float *logits, int64_t T, int32_t *ids,
                    float *weights, float *scores_scratch, moe_topk_method method);

#endif
