/* Reference routing: router GEMM, softmax scoring, top-k by row-max rounds, renormalize. */
#include "ref/ref.h"
#include "quant/convert.h"

#include <math.h>
#include <stdbool.h>

float moe_ref_load(const void *base, moe_dtype dt, int64_t i)
{
    switch (dt) {
    case MOE_DTYPE_BF16: return moe_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOE_DTYPE_F16: return moe_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

void moe_ref_router_logits(const float *x, int64_t T, int64_t H, int64_t E, const void *router,
                           moe_dtype router_dtype, float *logits)
{
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) {
            float acc = 0.0f;
            for (int64_t h = 0; h < H; h++)
                acc = fmaf(x[t * H + h], moe_ref_load(router, router_dtype, e * H + h), acc);
            logits[t * E + e] = acc;
        }
    }
}

void moe_ref_softmax(const float *logits, int64_t E, float *scores)
{
    /* max over the non-NaN logits */
    float mx = -INFINITY;
    int64_t n_num = 0, n_pinf = 0;
    for (int64_t e = 0; e < E; e++) {
        float l = logits[e];
        if (isnan(l))
            continue;
        n_num++;
        if (l == INFINITY)
            n_pinf++;
        if (l > mx)
            mx = l;
    }
    for (int64_t e = 0; e < E; e++) {
        float l = logits[e];
        if (isnan(l)) {
            scores[e] = NAN;
        } else if (n_pinf > 0) {
            /* limit of the softmax: the +Inf logits share all the mass */
            scores[e] = (l == INFINITY) ? 1.0f / (float)n_pinf : 0.0f;
        } else if (mx == -INFINITY) {
            /* every number is -Inf: the limit of equal logits is uniform */
            scores[e] = 1.0f / (float)n_num;
        } else {
            scores[e] = expf(l - mx);
        }
    }
    if (n_pinf > 0 || mx == -INFINITY)
        return;
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++)
        if (!isnan(scores[e]))
            sum += scores[e];
    for (int64_t e = 0; e < E; e++)
        scores[e] = scores[e] / sum;
}

/* a ranks above b: larger value, NaN below every number, ties to the lower id */
static bool ranks_above(float va, int64_t ia, float vb, int64_t ib)
{
    if (isnan(va) || isnan(vb)) {
        if (isnan(va) && isnan(vb))
            return ia < ib;
        return isnan(vb);
    }
    if (va != vb)
        return va > vb;
    return ia < ib;
}

void moe_ref_route(const moe_layer_desc *desc, const float *logits, int64_t T, int32_t *ids,
                   float *weights, float *scores)
{
    const int64_t E = desc->num_experts, K = desc->top_k;
    for (int64_t t = 0; t < T; t++) {
        moe_ref_softmax(logits + t * E, E, scores);
        /* K rounds: pick the best expert not yet taken */
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k; j++)
                    if (ids[t * K + j] == e)
                        taken = true;
                if (taken)
                    continue;
                if (best < 0 || ranks_above(scores[e], e, scores[best], best))
                    best = e;
            }
            ids[t * K + k] = (int32_t)best;
            weights[t * K + k] = scores[best];
        }
        if (desc->renormalize) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++)
                sum += weights[t * K + k];
            for (int64_t k = 0; k < K; k++)
                weights[t * K + k] = weights[t * K + k] / (sum + 1e-20f);
        }
    }
}
