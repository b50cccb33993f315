/* Scalar dtype conversions, exact and branch-light. Every kernel table converts weights with
 * these semantics (the vector versions are bit-identical: bf16 and f16 -> f32 are exact). */
#ifndef MOE_QUANT_CONVERT_H
#define MOE_QUANT_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline float moe_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t moe_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* bf16 -> f32: exact (bf16 is the top half of an f32). */
static inline float moe_bf16_to_f32(uint16_t h)
{
    return moe_bits_to_f32((uint32_t)h << 16);
}

/* f32 -> bf16, round to nearest even; NaN stays NaN (quiet). */
static inline uint16_t moe_f32_to_bf16(float f)
{
    uint32_t u = moe_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

/* IEEE binary16 -> f32: exact, subnormals, infinities and NaN included. */
static inline float moe_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {
            /* subnormal: man * 2^-24, exact in f32 */
            float v = (float)man * 5.9604644775390625e-8f;
            u = sign | moe_f32_to_bits(v);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return moe_bits_to_f32(u);
}

/* f32 -> IEEE binary16, round to nearest even, overflow to infinity, NaN kept. */
static inline uint16_t moe_f32_to_f16(float f)
{
    uint32_t u = moe_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero in f16 */
        /* value * 2^24 rounded to nearest even integer gives the subnormal mantissa */
        float v = moe_bits_to_f32(a) * 16777216.0f;
        /* v < 1024, exact rounding via the f32 magic-number trick */
        float r = (v + 8388608.0f) - 8388608.0f;
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}

#endif
