/* The reference MoE layer, stage by stage. */
#include "ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

moe_status moe_ref_forward(const moe_layer_desc *desc, const moe_weight_source *src,
                           const float *x, int64_t T, const float *router_logits, float *out,
                           int32_t *ids_out, float *weights_out)
{
    const int64_t H = desc->hidden_size, I = desc->moe_intermediate_size;
    const int64_t E = desc->num_experts, K = desc->top_k;
    const int64_t Is = desc->shared_expert_intermediate_size;
    if (T <= 0)
        return T == 0 ? MOE_OK : MOE_EINVAL;
    const moe_dtype dt = desc->weight_dtype;

    float *logits = malloc(sizeof(float) * (size_t)(T * E));     /* [T, E] */
    float *scores = malloc(sizeof(float) * (size_t)E);           /* [E] */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));    /* [T, K] */
    float *weights = malloc(sizeof(float) * (size_t)(T * K));    /* [T, K] */
    int64_t *offsets = malloc(sizeof(int64_t) * (size_t)(E + 1));/* [E+1] */
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)(T * K));   /* [T*K] */
    float *y = malloc(sizeof(float) * (size_t)(T * K * H));      /* [T*K, H] by row id */
    int64_t hmax = I > Is ? I : Is;
    float *h = malloc(sizeof(float) * (size_t)hmax);             /* [max(I, Is)] */
    float *shared_y = Is > 0 ? malloc(sizeof(float) * (size_t)(T * H)) : NULL; /* [T, H] */
    float *shared_scale = Is > 0 ? malloc(sizeof(float) * (size_t)T) : NULL;   /* [T] */
    moe_status st = MOE_OK;
    if (!logits || !scores || !ids || !weights || !offsets || !rows || !y || !h ||
        (Is > 0 && (!shared_y || !shared_scale))) {
        st = MOE_ENOMEM;
        goto done;
    }

    /* route */
    if (router_logits)
        memcpy(logits, router_logits, sizeof(float) * (size_t)(T * E));
    else
        moe_ref_router_logits(x, T, H, E, src->router, src->router_dtype, logits);
    moe_ref_route(desc, logits, T, ids, weights, scores);

    /* permute */
    moe_ref_permute(ids, T, K, E, offsets, rows);

    /* experts: each row through its expert, outputs kept f32 by row id */
    for (int64_t e = 0; e < E; e++) {
        for (int64_t i = offsets[e]; i < offsets[e + 1]; i++) {
            int64_t r = rows[i];
            int64_t t = r / K;
            moe_ref_expert(src->gate_proj[e], src->up_proj[e], src->down_proj[e], dt, H, I,
                           x + t * H, y + r * H, h);
        }
    }

    /* shared expert */
    if (Is > 0) {
        for (int64_t t = 0; t < T; t++) {
            moe_ref_expert(src->shared_gate_proj, src->shared_up_proj, src->shared_down_proj, dt,
                           H, Is, x + t * H, shared_y + t * H, h);
            float s = 1.0f;
            if (desc->shared_expert_gated) {
                float l = 0.0f;
                for (int64_t k = 0; k < H; k++)
                    l = fmaf(x[t * H + k], moe_ref_load(src->shared_expert_gate, src->router_dtype, k), l);
                s = 1.0f / (1.0f + expf(-l));
            }
            shared_scale[t] = s;
        }
    }

    /* finalize */
    moe_ref_finalize(desc, T, weights, y, shared_y, shared_scale, out);
    if (ids_out)
        memcpy(ids_out, ids, sizeof(int32_t) * (size_t)(T * K));
    if (weights_out)
        memcpy(weights_out, weights, sizeof(float) * (size_t)(T * K));

done:
    free(logits);
    free(scores);
    free(ids);
    free(weights);
    free(offsets);
    free(rows);
    free(y);
    free(h);
    free(shared_y);
    free(shared_scale);
    return st;
}
