/* The expert activations h = act(g, u) of moe.h's moe_activation values, in f32, in the operation
 * order docs/numerics.md section 1 states. One definition, used by src/ref and by the fast
 * path, so the two agree bit for bit by construction. */
#ifndef MOE_CORE_ACT_H
#define MOE_CORE_ACT_H

#include <math.h>

#include "moe.h"

static inline float moe_act_apply(const moe_layer_desc *d, float g, float u)
{
    switch (d->activation) {
    case MOE_ACT_GEGLU: {
        float gelu = (0.5f * g) * (1.0f + erff(g * 0.70710678118654752f));
        return gelu * u;
    }
    case MOE_ACT_GEGLU_TANH: {
        float inner = 0.79788456080286536f * (g + 0.044715f * ((g * g) * g));
        float gelu = (0.5f * g) * (1.0f + tanhf(inner));
        return gelu * u;
    }
    case MOE_ACT_SWIGLU_OAI: {
        const float limit = d->swiglu_limit, alpha = d->swiglu_alpha;
        float gc = g > limit ? limit : g;                         /* min(g, limit), NaN kept */
        float uc = u > limit ? limit : (u < -limit ? -limit : u); /* clamp, NaN kept */
        float glu = gc / (1.0f + expf(-(alpha * gc)));            /* gc * sigmoid(alpha gc) */
        return (uc + 1.0f) * glu;
    }
    default: {
        float silu = g / (1.0f + expf(-g));
        return silu * u;
    }
    }
}

#endif
