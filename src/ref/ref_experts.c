/* Reference expert MLP: SwiGLU on one token, dot products accumulated in increasing index with
 * one fused multiply-add (fmaf) per term. */
#include "ref/ref.h"

#include <math.h>

void moe_ref_expert(const void *gate, const void *up, const void *down, moe_dtype dt, int64_t H,
                    int64_t I, const float *x, float *y, float *h)
{
    for (int64_t i = 0; i < I; i++) {
        float g = 0.0f, u = 0.0f;
        for (int64_t k = 0; k < H; k++)
            g = fmaf(x[k], moe_ref_load(gate, dt, i * H + k), g);
        for (int64_t k = 0; k < H; k++)
            u = fmaf(x[k], moe_ref_load(up, dt, i * H + k), u);
        float silu = g / (1.0f + expf(-g));
        h[i] = silu * u;
    }
    for (int64_t o = 0; o < H; o++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < I; i++)
            acc = fmaf(h[i], moe_ref_load(down, dt, o * I + i), acc);
        y[o] = acc;
    }
}
