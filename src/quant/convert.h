/* Scalar dtype conversions, exact and branch-light. Every kernel table converts weights with
 * these semantics (the vector versions are bit-identical: bf16 and f16 -> f32 are exact). */
#ifndef MOE_QUANT_CONVERT_H
#define MOE_QUANT_CONVERT_H

#include "core/bf16.h"

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

/* f32 -> bf16, round to nearest even; NaN stays NaN (quiet): core/bf16.h moe_bf16_round. */
static inline uint16_t moe_f32_to_bf16(float f)
{
    return moe_bf16_round(f);
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

/* f32 -> float8 e4m3fn (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinity;
 * S.1111.111 is NaN; largest finite 448), round to nearest even, saturating: anything at or
 * above 448 in magnitude (infinity included) gives +-448; NaN gives NaN; values below 2^-6
 * become subnormals m * 2^-9. */
static inline uint8_t moe_f32_to_e4m3(float f)
{
    uint32_t u = moe_f32_to_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e00000u) /* 448 */
        return (uint8_t)(sign | 0x7eu);
    if (a < 0x3c800000u) { /* below 2^-6: subnormal m * 2^-9, m = round(|f| * 2^9) in 0..8 */
        float v = moe_bits_to_f32(a) * 512.0f;    /* exact: a power-of-two scaling */
        float r = (v + 8388608.0f) - 8388608.0f; /* round to nearest even integer (v < 8) */
        return (uint8_t)(sign | (uint8_t)r);      /* r = 8 is 2^-6, the smallest normal */
    }
    uint32_t rounded = a + 0x7ffffu + ((a >> 20) & 1u); /* keep 3 mantissa bits, ties to even */
    uint32_t e = (rounded >> 23) - 127u + 7u;           /* 1..15 (rounded < 448 + half ulp) */
    return (uint8_t)(sign | (e << 3) | ((rounded >> 20) & 7u));
}

/* float8 e4m3fn -> f32, exact. */
static inline float moe_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u)
        return moe_bits_to_f32(sign | 0x7fc00000u);
    if (e == 0u)
        return moe_bits_to_f32(sign | moe_f32_to_bits((float)m * 0.001953125f)); /* m * 2^-9 */
    return moe_bits_to_f32(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

#endif
