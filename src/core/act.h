/* The expert activations h = act(g, u) of moe.h's moe_activation values, in f32, in the operation
 * order docs/numerics.md section 1 states. One definition, used by src/ref and by the fast
 * path, so the two agree bit for bit by construction. */
#ifndef MOE_CORE_ACT_H
#define MOE_CORE_ACT_H

#include <math.h>

#include "moe.h"

/* libmoe's exp for the activations (SwiGLU, gpt-oss SwiGLU): one fixed sequence of IEEE
 * operations, so that the scalar code here and the AVX-512 rows (src/gemm/avx512/act_avx512.c,
 * vfnmadd / vfmadd / vroundscaleps / vscalefps) give the same bits (docs/numerics.md
 * section 1). NaN -> NaN; x is clamped to [-105, 89] (e^-105 rounds to +0 and e^89 overflows
 * to +inf, so the clamp changes no result); n = rint(x log2 e) in [-152, 129];
 * r = x - n ln2 in two fused steps (Cody-Waite: ln2_hi has 15 significant bits, so n ln2_hi
 * is exact); e^r by its degree-7 Taylor polynomial (|r| <= 0.35: truncation < 0.05 ulp) in
 * Horner form with fmaf; the result p * 2^n with one rounding (ldexpf; vscalefps).
 * Accuracy against correctly rounded exp, measured over every 97th float of [-105, 89]
 * (tests/unit/test_act.c): at most MOE_EXPF_MAX_ULP ulp (0.915 measured). */
#define MOE_EXPF_MAX_ULP 1

#define MOE_EXPF_LO (-105.0f)
#define MOE_EXPF_HI 89.0f
#define MOE_EXPF_LOG2E 1.44269504088896341f
#define MOE_EXPF_LN2_HI 0.693145751953125f          /* 0x3f317200 */
#define MOE_EXPF_LN2_LO 1.42860682030941723212e-6f  /* ln 2 - LN2_HI */
#define MOE_EXPF_C7 (1.0f / 5040.0f)
#define MOE_EXPF_C6 (1.0f / 720.0f)
#define MOE_EXPF_C5 (1.0f / 120.0f)
#define MOE_EXPF_C4 (1.0f / 24.0f)
#define MOE_EXPF_C3 (1.0f / 6.0f)
#define MOE_EXPF_C2 0.5f

static inline float moe_expf(float x)
{
    if (x != x)
        return x;
    float xc = x > MOE_EXPF_HI ? MOE_EXPF_HI : x;
    xc = xc < MOE_EXPF_LO ? MOE_EXPF_LO : xc;
    const float n = rintf(xc * MOE_EXPF_LOG2E);
    float r = fmaf(-n, MOE_EXPF_LN2_HI, xc);
    r = fmaf(-n, MOE_EXPF_LN2_LO, r);
    float p = MOE_EXPF_C7;
    p = fmaf(p, r, MOE_EXPF_C6);
    p = fmaf(p, r, MOE_EXPF_C5);
    p = fmaf(p, r, MOE_EXPF_C4);
    p = fmaf(p, r, MOE_EXPF_C3);
    p = fmaf(p, r, MOE_EXPF_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    return ldexpf(p, (int)n);
}

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
        float glu = gc / (1.0f + moe_expf(-(alpha * gc)));            /* gc * sigmoid(alpha gc) */
        return (uc + 1.0f) * glu;
    }
    case MOE_ACT_SWIGLU_CLAMP: {
        const float limit = d->swiglu_limit;
        float gc = g > limit ? limit : g;                         /* min(g, limit), NaN kept */
        float uc = u > limit ? limit : (u < -limit ? -limit : u); /* clamp, NaN kept */
        float silu = gc / (1.0f + moe_expf(-gc));
        return silu * uc;
    }
    case MOE_ACT_SWIGLU_SOFTCAP: {
        /* Inkling2SoftcappedSwiGLU: (tanh(g / c_g) c_g * sigmoid(g)) * (tanh(u / c_u) c_u);
         * the sigmoid sees the raw gate. NaN kept (tanhf, moe_expf and the products keep it) */
        const float cg = d->softcap_gate, cu = d->softcap_up;
        float gc = tanhf(g / cg) * cg;
        /* 0 - g, not -g: for a NaN g the sigmoid keeps g's NaN (as gc does), so the product of
         * the two NaNs is that NaN whichever operand order a compiler picks; equal otherwise
         * (exp(+-0) = 1) */
        float sig = 1.0f / (1.0f + moe_expf(0.0f - g));
        float uc = tanhf(u / cu) * cu;
        return (gc * sig) * uc;
    }
    case MOE_ACT_SWIGLU_POSTCLAMP: {
        /* Step3p7Experts._apply_gate: act_fn(gate).clamp(max=limit) * up.clamp(-limit, limit) */
        const float limit = d->swiglu_limit;
        float silu = g / (1.0f + moe_expf(-g));
        float sc = silu > limit ? limit : silu;                   /* min(silu(g), limit), NaN kept */
        float uc = u > limit ? limit : (u < -limit ? -limit : u); /* clamp, NaN kept */
        return sc * uc;
    }
    /* non-gated (g not read): h = act(u) */
    case MOE_ACT_RELU:
        return u < 0.0f ? 0.0f : u; /* NaN stays NaN, -0 stays -0 (as torch.relu) */
    case MOE_ACT_RELU2: {
        float r = u < 0.0f ? 0.0f : u;
        return r * r;
    }
    case MOE_ACT_GELU:
        return (0.5f * u) * (1.0f + erff(u * 0.70710678118654752f));
    case MOE_ACT_GELU_TANH: {
        float inner = 0.79788456080286536f * (u + 0.044715f * ((u * u) * u));
        return (0.5f * u) * (1.0f + tanhf(inner));
    }
    default: {
        float silu = g / (1.0f + moe_expf(-g));
        return silu * u;
    }
    }
}

/* One row of the gate/up epilogue, the scalar form every table may use:
 *   h[j] = act(g[j] (+ bg[j]), u[j] (+ bu[j])), j in [0, n); bg, bu NULL or both set.
 * Non-gated activations (moe_activation_gated 0): g and bg are NULL, h[j] = act(u[j] (+ bu[j])),
 * bu NULL or set. */
static inline void moe_act_row_scalar(const moe_layer_desc *d, const float *g, const float *u, const float *bg,
                                      const float *bu, float *h, int64_t n)
{
    if (!g) {
        for (int64_t j = 0; j < n; j++)
            h[j] = moe_act_apply(d, 0.0f, bu ? u[j] + bu[j] : u[j]);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        float gv = g[j], uv = u[j];
        if (bg) {
            gv = gv + bg[j];
            uv = uv + bu[j];
        }
        h[j] = moe_act_apply(d, gv, uv);
    }
}

#endif
