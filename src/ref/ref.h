/* src/ref: one readable scalar MoE layer, the numerics baseline and the test oracle.
 *
 * It reads the caller's unpacked weights (moe_weight_source, in their own dtype and layout),
 * allocates what it needs, runs single-threaded, accumulates in f32 and follows
 * docs/numerics.md literally. Every kernel table is tested against it. Split by stage so each
 * production stage has its twin here: route (ref_route.c), permute (ref_permute.c), experts
 * (ref_experts.c), finalize (ref_finalize.c), and the whole layer (ref_layer.c).
 *
 * Elementwise formulas (sigmoid, activations, bias adds, the input scaling of
 * apply_router_weight_on_input) are written here and in the production stages with the same
 * operations in the same order, so the bits agree (CMake passes -ffp-contract=off). */
#ifndef MOE_REF_H
#define MOE_REF_H

#include "moe.h"

/* Weight element i of a matrix in dtype dt, as f32 (exact). */
float moe_ref_load(const void *base, moe_dtype dt, int64_t i);

/* logits[t][e] = sum_h x[t][h] * Wr[e][h], h increasing from +0.0f, one fmaf per term.
 * x [T, H] f32, router [E, H] in router_dtype, logits [T, E]. */
void moe_ref_router_logits(const float *x, int64_t T, int64_t H, int64_t E, const void *router,
                           moe_dtype router_dtype, float *logits);

/* Softmax of one row of n values into out [n] (docs/numerics.md, NaN/Inf rules). */
void moe_ref_softmax(const float *logits, int64_t n, float *out);

/* sigmoid(v) = 1 / (1 + exp(-v)), in f32. */
float moe_ref_sigmoid(float v);

/* sqrt(softplus(v)), softplus(v) = log1p(exp(-|v|)) + max(v, 0), in f32 (moe.h
 * MOE_SCORING_SQRTSOFTPLUS). */
float moe_ref_sqrtsoftplus(float v);

/* Route T tokens (docs/numerics.md section 1): scores from logits [T, E] by
 * desc->scoring_func, selection key (+ selection_bias [E] in dtype bias_dtype when non-NULL),
 * group-limited masking when desc->n_group > 1, top-k by rounds of row-max (value
 * descending, lower id first, NaN below every number), weights, renormalize.
 * ids [T, K], weights [T, K]. Errors: MOE_ENOMEM. */
moe_status moe_ref_route(const moe_layer_desc *desc, const void *selection_bias,
                         moe_dtype bias_dtype, const float *logits, int64_t T, int32_t *ids,
                         float *weights);

/* Group the T*K (token, k) rows by expert: offsets [E+1], rows [T*K] holding row ids t*K + k,
 * ascending within each expert. */
void moe_ref_permute(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                     int32_t *rows);

/* h = act(g, u) of desc->activation (moe.h moe_activation). */
float moe_ref_activation(const moe_layer_desc *desc, float g, float u);

/* One expert's weights as the caller has them. */
typedef struct moe_ref_mlp {
    const void *gate, *up, *down; /* dtype dt */
    moe_dtype dt;
    int64_t gu_so, gu_si;         /* gate/up element (o, i) at p[o * gu_so + i * gu_si] */
    int64_t dn_so, dn_si;         /* down element (o, i) at p[o * dn_so + i * dn_si] */
    const void *gate_bias, *up_bias, *down_bias; /* NULL: no biases */
    moe_dtype bias_dt;
    int64_t gu_bias_stride;       /* element j of gate_bias / up_bias at p[j * stride] */
} moe_ref_mlp;

/* One expert on one token: g = gate x (+ b_g), u = up x (+ b_u), h = act(g, u),
 * y = down h (+ b_d). x [H]; y [H]; h_scratch [I]. */
void moe_ref_expert_ex(const moe_layer_desc *desc, const moe_ref_mlp *m, int64_t H, int64_t I,
                       const float *x, float *y, float *h_scratch);

/* The same under compute bf16 (moe.h MOE_COMPUTE_BF16, core/bf16.h): x and h rounded to bf16,
 * every weight rounded to bf16 (exact for bf16 weights), each dot product the pair chain of
 * moe_bf16_dp over (2i+1, 2i) from +0 (a +0 pair element past an odd length); biases and the
 * activation in f32 as above. x [H]; y [H]; h_scratch [I]; xb_scratch [max(H, I) + 1] f32. */
void moe_ref_expert_bf16(const moe_layer_desc *desc, const moe_ref_mlp *m, int64_t H, int64_t I,
                         const float *x, float *y, float *h_scratch, float *xb_scratch);

/* One expert under static FP8 activations (moe_quant.h MOE_QACT_STATIC), from the source
 * layout as the caller passes it (not the packed panels): e4m3 codes row-major gate, up [I, H]
 * and down [H, I], their scales in the shapes of q13 / q2 (TENSOR, CHANNEL or BLOCK), and the
 * expert's input scales s13 (gate / up) and s2 (down). Per matrix W [N, K] on input v [K]:
 * c[k] = e4m3(clamp(v[k] / s, -448, 448)) (quotient rounded once in f32, nearest even, NaN the
 * NaN code), then for each output n: y = +0, and per activation group g (one of K for TENSOR /
 * CHANNEL weights, block_k long for BLOCK) in increasing order y = y + (part * s) * s_w(n, g),
 * part the fmaf chain in increasing k from +0 of dec(c[k]) * dec(W[n][k]). Biases (when m has
 * them) are added after, the activation between, as moe_ref_expert_ex. x [H]; y [H];
 * h_scratch [I]; cq [max(H, I)] bytes of codes. */
typedef struct moe_ref_f8s {
    const uint8_t *gate, *up, *down;       /* codes */
    const float *gate_s, *up_s, *down_s;   /* weight scales */
    moe_qweight q13, q2;                   /* their granularity */
    float s13, s2;                         /* the expert's input scales */
} moe_ref_f8s;
void moe_ref_expert_f8static(const moe_layer_desc *desc, const moe_ref_f8s *m, const moe_ref_mlp *bias, int64_t H,
                             int64_t I, const float *x, float *y, float *h_scratch, uint8_t *cq);

/* One SwiGLU expert with row-major weights and no biases: y[H] = down (silu(gate x) * (up x)).
 * gate, up [I, H] and down [H, I] in dtype dt; x [H]; h_scratch [I]. */
void moe_ref_expert(const void *gate, const void *up, const void *down, moe_dtype dt, int64_t H,
                    int64_t I, const float *x, float *y, float *h_scratch);

/* out[t][:] = routed_scaling_factor * (sum over k in top-k order of weights[t][k] * y[t*K+k][:]
 *             (of y[t*K+k][:] alone with apply_router_weight_on_input))
 *             (+ shared_scale[t] * shared_y[t][:] when shared_y is non-NULL).
 * y [T*K, H] indexed by row id; shared_y [T, H]; shared_scale [T] (1 when ungated). */
void moe_ref_finalize(const moe_layer_desc *desc, int64_t T, const float *weights, const float *y,
                      const float *shared_y, const float *shared_scale, float *out);

/* Expert capacity (moe.h expert_capacity C > 0, top_k 1), as Switch Transformers' router
 * writes it: per sequence, for each expert, the running count of its tokens in token order
 * (the cumsum of the one-hot choice); a token whose count exceeds C is dropped: ids -1,
 * weights 0. ids, weights [T, 1]; sequence_lengths [n_sequences] (summing to T), or NULL:
 * one sequence of T. C == 0: nothing. */
void moe_ref_expert_capacity(const moe_layer_desc *desc, int64_t T, const int64_t *sequence_lengths,
                             int64_t n_sequences, int32_t *ids, float *weights);

/* The whole layer. x [T, H] f32; router_logits [T, E] (complete: no router bias is added)
 * or NULL; out [T, H]; ids, weights [T, K] or NULL. Allocates (it is the oracle, not the
 * product). Errors: MOE_EINVAL, MOE_ENOMEM. */
moe_status moe_ref_forward(const moe_layer_desc *desc, const moe_weight_source *src,
                           const float *x, int64_t T, const float *router_logits, float *out,
                           int32_t *ids, float *weights);
/* The same with the experts (routed and shared) in compute mode `compute`; routing, the shared
 * expert's gate and the combine stay f32. */
moe_status moe_ref_forward_compute(const moe_layer_desc *desc, const moe_weight_source *src, moe_compute compute,
                                   const float *x, int64_t T, const float *router_logits, float *out, int32_t *ids,
                                   float *weights);
/* The same with the routing given: when given_ids is set, token t's experts are
 * given_ids[t][0..K) with weights given_weights[t][0..K) (both [T, K], used as they are: no
 * scoring, renormalization or selection), router_logits is ignored; else as
 * moe_ref_forward_compute. ids / weights, when set, receive the routing used. */
moe_status moe_ref_forward_given(const moe_layer_desc *desc, const moe_weight_source *src, moe_compute compute,
                                 const float *x, int64_t T, const float *router_logits, const int32_t *given_ids,
                                 const float *given_weights, float *out, int32_t *ids, float *weights);
/* moe_ref_forward_given with the sequences expert_capacity counts in (moe_ref_expert_capacity:
 * sequence_lengths [n_sequences], or NULL: one sequence of T), applied to the routing computed
 * here (not to given ids, which may hold -1: empty slots). The others pass NULL. */
moe_status moe_ref_forward_seq(const moe_layer_desc *desc, const moe_weight_source *src, moe_compute compute,
                               const float *x, int64_t T, const float *router_logits, const int32_t *given_ids,
                               const float *given_weights, const int64_t *sequence_lengths, int64_t n_sequences,
                               float *out, int32_t *ids, float *weights);

#endif
