/* Reference expert MLP on one token: dot products accumulated in increasing index with one
 * fused multiply-add (fmaf) per term, biases added after the dot product, then the
 * activation of moe.h's moe_activation, written out. */
#include "ref/ref.h"
#include "core/act.h"
#include "core/bf16.h"
#include "quant/convert.h"

#include <math.h>

float moe_ref_activation(const moe_layer_desc *d, float g, float u)
{
    return moe_act_apply(d, g, u);
}

void moe_ref_expert_ex(const moe_layer_desc *desc, const moe_ref_mlp *m, int64_t H, int64_t I,
                       const float *x, float *y, float *h)
{
    const int gated = moe_activation_gated(desc->activation); /* 0: no gate, m->gate not read */
    for (int64_t i = 0; i < I; i++) {
        float g = 0.0f, u = 0.0f;
        for (int64_t k = 0; gated && k < H; k++)
            g = fmaf(x[k], moe_ref_load(m->gate, m->dt, i * m->gu_so + k * m->gu_si), g);
        for (int64_t k = 0; k < H; k++)
            u = fmaf(x[k], moe_ref_load(m->up, m->dt, i * m->gu_so + k * m->gu_si), u);
        if (m->up_bias) {
            if (gated)
                g = g + moe_ref_load(m->gate_bias, m->bias_dt, i * m->gu_bias_stride);
            u = u + moe_ref_load(m->up_bias, m->bias_dt, i * m->gu_bias_stride);
        }
        h[i] = moe_ref_activation(desc, g, u);
    }
    for (int64_t o = 0; o < H; o++) {
        float acc = 0.0f;
        for (int64_t i = 0; i < I; i++)
            acc = fmaf(h[i], moe_ref_load(m->down, m->dt, o * m->dn_so + i * m->dn_si), acc);
        if (m->down_bias)
            acc = acc + moe_ref_load(m->down_bias, m->bias_dt, o);
        y[o] = acc;
    }
}

/* sum over k < n of a[k] * w(k) as the bf16 pair chain: a already bf16 values, w(k) rounded
 * to bf16 here; the element past an odd n is +0 on both sides */
static float dot_bf16(const float *a, const moe_ref_mlp *m, const void *base, int64_t o, int64_t so, int64_t si,
                      int64_t n)
{
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k += 2) {
        const float a1 = k + 1 < n ? a[k + 1] : 0.0f;
        const float w1 = k + 1 < n ? moe_bf16_value(moe_bf16_round(moe_ref_load(base, m->dt, o * so + (k + 1) * si)))
                                   : 0.0f;
        const float w0 = moe_bf16_value(moe_bf16_round(moe_ref_load(base, m->dt, o * so + k * si)));
        acc = moe_bf16_dp(acc, a1, w1);
        acc = moe_bf16_dp(acc, a[k], w0);
    }
    return acc;
}

void moe_ref_expert_bf16(const moe_layer_desc *desc, const moe_ref_mlp *m, int64_t H, int64_t I,
                         const float *x, float *y, float *h, float *xb)
{
    for (int64_t k = 0; k < H; k++) /* the hidden state entering gate/up, in bf16 */
        xb[k] = moe_bf16_value(moe_bf16_round(x[k]));
    const int gated = moe_activation_gated(desc->activation); /* 0: no gate, m->gate not read */
    for (int64_t i = 0; i < I; i++) {
        float g = gated ? dot_bf16(xb, m, m->gate, i, m->gu_so, m->gu_si, H) : 0.0f;
        float u = dot_bf16(xb, m, m->up, i, m->gu_so, m->gu_si, H);
        if (m->up_bias) {
            if (gated)
                g = g + moe_ref_load(m->gate_bias, m->bias_dt, i * m->gu_bias_stride);
            u = u + moe_ref_load(m->up_bias, m->bias_dt, i * m->gu_bias_stride);
        }
        h[i] = moe_ref_activation(desc, g, u);
    }
    for (int64_t i = 0; i < I; i++) /* the activation output entering down, in bf16 */
        xb[i] = moe_bf16_value(moe_bf16_round(h[i]));
    for (int64_t o = 0; o < H; o++) {
        float acc = dot_bf16(xb, m, m->down, o, m->dn_so, m->dn_si, I);
        if (m->down_bias)
            acc = acc + moe_ref_load(m->down_bias, m->bias_dt, o);
        y[o] = acc;
    }
}

void moe_ref_expert(const void *gate, const void *up, const void *down, moe_dtype dt, int64_t H,
                    int64_t I, const float *x, float *y, float *h)
{
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.activation = MOE_ACT_SWIGLU;
    moe_ref_mlp m = {.gate = gate, .up = up, .down = down, .dt = dt, .gu_so = H, .gu_si = 1,
                     .dn_so = I, .dn_si = 1};
    moe_ref_expert_ex(&d, &m, H, I, x, y, h);
}

/* Static FP8: output n of W [N, K] (codes w row-major, scales ws in the shapes of q) on the
 * codes c [K] of input scale sx: y = +0, then per activation group g (one of K for TENSOR /
 * CHANNEL, block_k long for BLOCK) y = y + (part * sx) * s_w(n, g). */
static float f8s_out(const moe_qweight *q, const uint8_t *w, const float *ws, int64_t K, int64_t n, const uint8_t *c,
                     float sx)
{
    const int64_t G = q->scale == MOE_QSCALE_BLOCK ? q->block_k : K;
    const int64_t cols = (K + G - 1) / G; /* BLOCK: the scale grid [ceil(N / bn), cols] */
    float y = 0.0f;
    for (int64_t g = 0; g < cols; g++) {
        float part = 0.0f;
        for (int64_t k = g * G; k < K && k < (g + 1) * G; k++)
            part = fmaf(moe_e4m3_to_f32(c[k]), moe_e4m3_to_f32(w[n * K + k]), part);
        const float sw = q->scale == MOE_QSCALE_TENSOR    ? ws[0]
                         : q->scale == MOE_QSCALE_CHANNEL ? ws[n]
                                                          : ws[(n / q->block_n) * cols + g];
        y = y + (part * sx) * sw;
    }
    return y;
}

void moe_ref_expert_f8static(const moe_layer_desc *desc, const moe_ref_f8s *m, const moe_ref_mlp *bias, int64_t H,
                             int64_t I, const float *x, float *y, float *h, uint8_t *cq)
{
    for (int64_t k = 0; k < H; k++) /* the codes of x [H]: e4m3 saturates (the clamp), keeps NaN */
        cq[k] = moe_f32_to_e4m3(x[k] / m->s13);
    const int gated = moe_activation_gated(desc->activation); /* 0: no gate, m->gate not read */
    for (int64_t i = 0; i < I; i++) {
        float g = gated ? f8s_out(&m->q13, m->gate, m->gate_s, H, i, cq, m->s13) : 0.0f;
        float u = f8s_out(&m->q13, m->up, m->up_s, H, i, cq, m->s13);
        if (bias && bias->up_bias) {
            if (gated)
                g = g + moe_ref_load(bias->gate_bias, bias->bias_dt, i * bias->gu_bias_stride);
            u = u + moe_ref_load(bias->up_bias, bias->bias_dt, i * bias->gu_bias_stride);
        }
        h[i] = moe_ref_activation(desc, g, u);
    }
    for (int64_t i = 0; i < I; i++) /* the codes of h [I] */
        cq[i] = moe_f32_to_e4m3(h[i] / m->s2);
    for (int64_t o = 0; o < H; o++) {
        y[o] = f8s_out(&m->q2, m->down, m->down_s, I, o, cq, m->s2);
        if (bias && bias->down_bias)
            y[o] = y[o] + moe_ref_load(bias->down_bias, bias->bias_dt, o);
    }
}
