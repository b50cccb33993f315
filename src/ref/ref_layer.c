/* The reference MoE layer, stage by stage. */
#include "ref/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

moe_status moe_ref_forward(const moe_layer_desc *desc, const moe_weight_source *src,
                           const float *x, int64_t T, const float *router_logits, float *out,
                           int32_t *ids_out, float *weights_out)
{
    return moe_ref_forward_compute(desc, src, MOE_COMPUTE_F32, x, T, router_logits, out, ids_out, weights_out);
}

moe_status moe_ref_forward_compute(const moe_layer_desc *desc, const moe_weight_source *src, moe_compute compute,
                                   const float *x, int64_t T, const float *router_logits, float *out,
                                   int32_t *ids_out, float *weights_out)
{
    return moe_ref_forward_given(desc, src, compute, x, T, router_logits, NULL, NULL, out, ids_out, weights_out);
}

moe_status moe_ref_forward_given(const moe_layer_desc *desc, const moe_weight_source *src, moe_compute compute,
                                 const float *x, int64_t T, const float *router_logits, const int32_t *given_ids,
                                 const float *given_weights, float *out, int32_t *ids_out, float *weights_out)
{
    return moe_ref_forward_seq(desc, src, compute, x, T, router_logits, given_ids, given_weights, NULL, 0, out,
                               ids_out, weights_out);
}

moe_status moe_ref_forward_seq(const moe_layer_desc *desc, const moe_weight_source *src, moe_compute compute,
                               const float *x, int64_t T, const float *router_logits, const int32_t *given_ids,
                               const float *given_weights, const int64_t *sequence_lengths, int64_t n_sequences,
                               float *out, int32_t *ids_out, float *weights_out)
{
    const int bf16 = compute == MOE_COMPUTE_BF16;
    const int64_t H = desc->hidden_size, I = desc->moe_intermediate_size;
    const int64_t E = desc->num_experts, K = desc->top_k;
    const int64_t Z = desc->num_identity_experts, R = E + Z; /* the router scores E + Z experts */
    const int64_t Is = desc->shared_expert_intermediate_size;
    if (T <= 0)
        return T == 0 ? MOE_OK : MOE_EINVAL;
    const moe_dtype dt = desc->weight_dtype;

    float *logits = malloc(sizeof(float) * (size_t)(T * R));     /* [T, E + Z] */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K));    /* [T, K] */
    float *weights = malloc(sizeof(float) * (size_t)(T * K));    /* [T, K] */
    float *fw = malloc(sizeof(float) * (size_t)(T * K));         /* [T, K] the finalize's: 0 at empty slots */
    int64_t *offsets = malloc(sizeof(int64_t) * (size_t)(E + 1));/* [E+1] */
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)(T * K));   /* [T*K] */
    float *y = malloc(sizeof(float) * (size_t)(T * K * H));      /* [T*K, H] by row id */
    float *xs = malloc(sizeof(float) * (size_t)H);               /* [H] scaled input */
    int64_t hmax = I > Is ? I : Is;
    float *h = malloc(sizeof(float) * (size_t)hmax);             /* [max(I, Is)] */
    const int64_t bmax = (H > hmax ? H : hmax) + 1;
    float *xb = malloc(sizeof(float) * (size_t)bmax);            /* [max(H, I, Is) + 1] bf16 rows; static
                                                                    FP8: the codes, bytes */
    const int f8s = desc->quant.act == MOE_QACT_STATIC;          /* static FP8 activations */
    float *shared_y = Is > 0 ? malloc(sizeof(float) * (size_t)(T * H)) : NULL; /* [T, H] */
    float *shared_scale = Is > 0 ? malloc(sizeof(float) * (size_t)T) : NULL;   /* [T] */
    moe_status st = MOE_OK;
    if (!logits || !ids || !weights || !fw || !offsets || !rows || !y || !xs || !h || !xb ||
        (Is > 0 && (!shared_y || !shared_scale))) {
        st = MOE_ENOMEM;
        goto done;
    }

    /* route: logits (+ router bias when computed here), then scores, selection, weights;
     * or the caller's ids and weights as given */
    if (given_ids) {
        memcpy(ids, given_ids, sizeof(int32_t) * (size_t)(T * K));
        memcpy(weights, given_weights, sizeof(float) * (size_t)(T * K));
        goto routed;
    }
    if (router_logits) {
        memcpy(logits, router_logits, sizeof(float) * (size_t)(T * R));
    } else {
        moe_ref_router_logits(x, T, H, R, src->router, src->router_dtype, logits);
        if (desc->has_router_bias)
            for (int64_t t = 0; t < T; t++)
                for (int64_t e = 0; e < R; e++)
                    logits[t * R + e] = logits[t * R + e] + moe_ref_load(src->router_bias, src->router_bias_dtype, e);
    }
    {
        /* the routing sees the E + Z experts as one range (identity ids are E..E+Z-1) */
        moe_layer_desc rd = *desc;
        rd.num_experts = R;
        rd.num_identity_experts = 0;
        st = moe_ref_route(&rd, desc->has_selection_bias ? src->selection_bias : NULL, src->selection_bias_dtype,
                           logits, T, ids, weights);
    }
    if (st != MOE_OK)
        goto done;
    moe_ref_expert_capacity(desc, T, sequence_lengths, n_sequences, ids, weights); /* Switch's drops */

routed:
    /* permute */
    moe_ref_permute(ids, T, K, E, offsets, rows);

    /* experts: each row through its expert, outputs kept f32 by row id */
    moe_ref_mlp m = {.dt = dt,
                     .gu_so = src->gate_up_stride_out ? src->gate_up_stride_out : H,
                     .gu_si = src->gate_up_stride_out ? src->gate_up_stride_in : 1,
                     .dn_so = src->down_stride_out ? src->down_stride_out : I,
                     .dn_si = src->down_stride_out ? src->down_stride_in : 1,
                     .bias_dt = src->expert_bias_dtype,
                     .gu_bias_stride = src->gate_up_bias_stride ? src->gate_up_bias_stride : 1};
    for (int64_t e = 0; e < E; e++) {
        /* non-gated experts (moe_activation_gated 0): the gate arrays are not read */
        const int gated = moe_activation_gated(desc->activation);
        m.gate = gated ? src->gate_proj[e] : NULL;
        m.up = src->up_proj[e];
        m.down = src->down_proj[e];
        m.gate_bias = desc->has_expert_bias && gated ? src->gate_bias[e] : NULL;
        m.up_bias = desc->has_expert_bias ? src->up_bias[e] : NULL;
        m.down_bias = desc->has_expert_bias ? src->down_bias[e] : NULL;
        for (int64_t i = offsets[e]; i < offsets[e + 1]; i++) {
            int64_t r = rows[i];
            int64_t t = r / K;
            const float *in = x + t * H;
            if (desc->apply_router_weight_on_input) {
                /* the routing weight goes onto the expert's input, one rounding per element */
                for (int64_t k = 0; k < H; k++)
                    xs[k] = weights[r] * x[t * H + k];
                in = xs;
            }
            if (f8s) {
                const moe_ref_f8s q = {.gate = gated ? src->gate_proj[e] : NULL, .up = src->up_proj[e],
                                       .down = src->down_proj[e], .gate_s = gated ? src->gate_scale[e] : NULL,
                                       .up_s = src->up_scale[e],
                                       .down_s = src->down_scale[e], .q13 = desc->quant.w13, .q2 = desc->quant.w2,
                                       .s13 = src->w13_input_scale[e], .s2 = src->w2_input_scale[e]};
                moe_ref_expert_f8static(desc, &q, &m, H, I, in, y + r * H, h, (uint8_t *)xb);
            } else if (bf16) {
                moe_ref_expert_bf16(desc, &m, H, I, in, y + r * H, h, xb);
            } else {
                moe_ref_expert_ex(desc, &m, H, I, in, y + r * H, h);
            }
        }
    }

    /* identity experts (ids >= E, never permuted above): the row's output is its input x (with
     * apply_router_weight_on_input w * x, one rounding, and the finalize sums it unweighted) */
    for (int64_t r = 0; r < T * K; r++) {
        if (ids[r] < E) /* routed experts and empty slots (-1) */
            continue;
        const int64_t t = r / K;
        for (int64_t k = 0; k < H; k++)
            y[r * H + k] = desc->apply_router_weight_on_input ? weights[r] * x[t * H + k] : x[t * H + k];
    }

    /* shared expert: row-major, no biases, on the unscaled input */
    if (Is > 0) {
        moe_layer_desc sd = *desc; /* its activation: the routed one or its own (HY-V4's plain SwiGLU) */
        if (desc->has_shared_activation)
            sd.activation = desc->shared_activation;
        if (desc->shared_swiglu_limit > 0.0f) /* its own limit (moe.h shared_swiglu_limit) */
            sd.swiglu_limit = desc->shared_swiglu_limit;
        moe_ref_mlp sm = {.gate = src->shared_gate_proj, .up = src->shared_up_proj,
                          .down = src->shared_down_proj, .dt = dt, .gu_so = H, .gu_si = 1,
                          .dn_so = Is, .dn_si = 1};
        for (int64_t t = 0; t < T; t++) {
            if (bf16)
                moe_ref_expert_bf16(&sd, &sm, H, Is, x + t * H, shared_y + t * H, h, xb);
            else
                moe_ref_expert_ex(&sd, &sm, H, Is, x + t * H, shared_y + t * H, h);
            float s = 1.0f;
            if (desc->shared_expert_gated) {
                float l = 0.0f;
                for (int64_t k = 0; k < H; k++)
                    l = fmaf(x[t * H + k], moe_ref_load(src->shared_expert_gate, src->router_dtype, k), l);
                s = moe_ref_sigmoid(l);
            }
            if (desc->shared_expert_scale != 1.0f) /* Cohere2-MoE's "average": 0.5 */
                s = s * desc->shared_expert_scale;
            shared_scale[t] = s;
        }
    }

    /* finalize */
    /* empty slots (id -1: a capacity drop or given -1) add nothing: their row of y is +0 with
     * weight 0, so the term is +0, and acc + (+0) == acc bit for bit (the sum starts at +0 and
     * a sum of two numbers is never -0 in round-to-nearest, NaN stays the same NaN) */
    for (int64_t r = 0; r < T * K; r++)
        if (ids[r] == -1) {
            fw[r] = 0.0f;
            for (int64_t k = 0; k < H; k++)
                y[r * H + k] = 0.0f;
        } else {
            fw[r] = weights[r];
        }
    moe_ref_finalize(desc, T, fw, y, shared_y, shared_scale, out);
    if (desc->has_output_bias) /* JetMoE: the block's bias [H], last, one f32 add */
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < H; k++)
                out[t * H + k] = out[t * H + k] + moe_ref_load(src->output_bias, src->output_bias_dtype, k);
    if (desc->has_output_norm) /* A.X-K1's post_mlp_layernorm [H], last; written out here */
        for (int64_t t = 0; t < T; t++) {
            float *y = out + t * H; /* [H] */
            float ss = 0.0f;
            for (int64_t k = 0; k < H; k++)
                ss = fmaf(y[k], y[k], ss);
            const float r = 1.0f / sqrtf(ss / (float)H + desc->output_norm_eps);
            for (int64_t k = 0; k < H; k++)
                y[k] = moe_ref_load(src->output_norm, src->output_norm_dtype, k) * (y[k] * r);
        }
    if (ids_out)
        memcpy(ids_out, ids, sizeof(int32_t) * (size_t)(T * K));
    if (weights_out)
        memcpy(weights_out, weights, sizeof(float) * (size_t)(T * K));

done:
    free(logits);
    free(ids);
    free(weights);
    free(fw);
    free(offsets);
    free(rows);
    free(y);
    free(xs);
    free(h);
    free(xb);
    free(shared_y);
    free(shared_scale);
    return st;
}
