/* The bf16 compute mode's arithmetic (moe.h MOE_COMPUTE_BF16, docs/numerics.md section 7), in
 * portable C: what the oracle (src/ref) and the scalar kernels (src/gemm/linear_ref.c, linear_q_ref.c) compute and
 * every vector kernel reproduces bit for bit.
 *
 *  - moe_bf16_round: f32 -> bf16 by round to nearest even on the bit pattern, as torch's
 *    c10::BFloat16 conversion (subnormals rounded, not flushed; NaN -> a quiet NaN of the same
 *    sign; overflow to +-Inf).
 *  - moe_bf16_dp: one step of the pair dot product, the arithmetic of each half of x86's
 *    vdpbf16ps (Intel SDM: DAZ, FTZ, round to nearest even, no exceptions) and of vfmadd under
 *    MXCSR FTZ|DAZ (checked against the instruction on this project's machines: test_bf16.c):
 *        r = DAZ(acc) + DAZ(a) * DAZ(b), rounded once to f32 with an unbounded exponent;
 *        the result is r, or a zero of r's sign when 0 < |r| < FLT_MIN (FTZ);
 *    DAZ(v) = a zero of v's sign when |v| < FLT_MIN. a and b are bf16 values (8-bit
 *    significands: their product is exact in double).
 * Header-only, no ISA flags: the oracle, the ref table and the tests include it. */
#ifndef MOE_CORE_BF16_H
#define MOE_CORE_BF16_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t moe_bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)            /* NaN: keep the sign, make it quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float moe_bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* a zero of v's sign when |v| < FLT_MIN (denormals and zeros), else v */
static inline float moe_bf16_daz(float v)
{
    return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}

static inline float moe_bf16_dp(float acc, float a, float b)
{
    acc = moe_bf16_daz(acc);
    a = moe_bf16_daz(a);
    b = moe_bf16_daz(b);
    /* fmaf rounds once, but on the f32 grid, whose step below FLT_MIN is 2^-149; FTZ looks at
     * the rounding with an unbounded exponent (step 2^-150 just below FLT_MIN). The two can
     * differ only when fmaf gives exactly +-FLT_MIN or a tiny result. */
    const float r = fmaf(a, b, acc);
    const float m = fabsf(r);
    if (m > FLT_MIN || isnan(r))
        return r;
    if (m < FLT_MIN) {
        /* a zero result keeps IEEE's sign only when the exact sum is zero (fmaf's zero of a
         * nonzero tiny sum already carries that sum's sign) */
        return copysignf(0.0f, r);
    }
    /* |r| == FLT_MIN: the exact sum v rounds (unbounded exponent) to FLT_MIN, not to the tiny
     * FLT_MIN - 2^-150, iff |v| >= FLT_MIN - 2^-151 (the midpoint goes to FLT_MIN, the even
     * one). Here |acc| < 2^-99 and |p| < 2^-98 (a cancellation between larger values leaves a
     * multiple of 2^-122 or coarser), so sgn * acc - c is exact in double and the sign of the
     * double sum below is the sign of the exact one. */
    const double p = (double)a * (double)b; /* exact: 16 significant bits */
    const double c = 0x1p-126 - 0x1p-151;
    const double sgn = r > 0.0f ? 1.0 : -1.0;
    const double t = sgn * (double)acc - c;
    return t + sgn * p >= 0.0 ? r : copysignf(0.0f, r);
}

#endif
