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
