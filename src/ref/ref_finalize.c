/* Reference finalize: weighted sum over K in top-k order (unweighted when the weight went
 * onto the expert input), scaling once, shared expert added. */
#include "ref/ref.h"

void moe_ref_finalize(const moe_layer_desc *desc, int64_t T, const float *weights, const float *y,
                      const float *shared_y, const float *shared_scale, float *out)
{
    const int64_t H = desc->hidden_size, K = desc->top_k;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                if (desc->apply_router_weight_on_input)
                    acc += y[(t * K + k) * H + h];
                else
                    acc += weights[t * K + k] * y[(t * K + k) * H + h];
            }
            if (desc->routed_scaling_factor != 1.0f)
                acc = acc * desc->routed_scaling_factor;
            if (shared_y)
                acc = acc + shared_scale[t] * shared_y[t * H + h];
            out[t * H + h] = acc;
        }
    }
}

void moe_ref_expert_capacity(const moe_layer_desc *desc, int64_t T, const int64_t *sequence_lengths,
                             int64_t n_sequences, int32_t *ids, float *weights)
{
    const int64_t C = desc->expert_capacity, E = desc->num_experts;
    if (C <= 0)
        return;
    const int64_t n_seq = sequence_lengths ? n_sequences : 1;
    int64_t s0 = 0; /* the sequence's first token */
    for (int64_t s = 0; s < n_seq; s++) {
        const int64_t n = sequence_lengths ? sequence_lengths[s] : T;
        for (int64_t e = 0; e < E; e++) {
            int64_t priority = 0; /* cumsum of the one-hot column e over the sequence */
            for (int64_t t = s0; t < s0 + n; t++) {
                if (ids[t] != e)
                    continue;
                priority += 1;
                if (priority > C) {
                    ids[t] = -1;
                    weights[t] = 0.0f;
                }
            }
        }
        s0 += n;
    }
}
