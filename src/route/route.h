/* Production routing: scoring and top-k for a block of tokens. */
#ifndef MOE_ROUTE_H
#define MOE_ROUTE_H

#include "core/kernels.h"

/* Softmax scoring, top-k (value descending, lower id first, NaN last), renormalize:
 * logits [T, E] -> ids [T, K], weights [T, K]. scores_scratch [E]. Same bits as
 * moe_ref_route (docs/numerics.md). */
void moe_route_topk(const moe_layer_desc *desc, const float *logits, int64_t T, int32_t *ids,
                    float *weights, float *scores_scratch);

#endif
