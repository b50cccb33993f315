/* Does this CPU's vdpbf16ps compute core/bf16.h's rule? The SDM states DAZ, FTZ and round to
 * nearest even but not where the flush looks (rounding with an unbounded exponent, as vfmadd
 * under MXCSR FTZ) nor the order of the two products; the kernels rely on both, so the registry
 * runs this probe before it installs them: each case below separates one reading of the rule
 * from its neighbours (measured on an AMD Zen 5: every case agrees). */
#include "core/bf16.h"
#include "gemm/avx512_bf16/avx512_bf16.h"

#include <immintrin.h>

typedef struct probe_case {
    uint32_t acc;    /* f32 bits */
    uint16_t a1, b1; /* the odd pair element: taken first */
    uint16_t a0, b0; /* the even one */
} probe_case;

int moe_avx512_bf16_probe(void)
{
    static const probe_case cases[] = {
        {0x00800000u, 0x1a00, 0x9980, 0x8000, 0x3f80}, /* FLT_MIN - 2^-151: rounds to FLT_MIN, kept */
        {0x00800000u, 0x1a00, 0x9a00, 0x8000, 0x3f80}, /* FLT_MIN - 2^-150: tiny with an unbounded exponent: 0 */
        {0x80800000u, 0x1a00, 0x1a00, 0x8000, 0x3f80}, /* the same, negative: -0 */
        {0x00000000u, 0x9f80, 0x2000, 0x8000, 0x3f80}, /* -2^-127 (a tiny product), then + -0: -0 */
        {0x00000000u, 0x0001, 0x3f80, 0x8000, 0x3f80}, /* a bf16 denormal operand reads as +0 */
        {0x80000001u, 0x8000, 0x3f80, 0x8000, 0x3f80}, /* a denormal accumulator reads as -0 */
        {0x3f800000u, 0x3380, 0x3f80, 0x3380, 0x3f80}, /* 1 + 2^-24 + 2^-24: two roundings give 1 */
        {0x3f800000u, 0x3400, 0x3f80, 0x3380, 0x3f80}, /* 1 + 2^-23 + 2^-24: tie after the odd step */
        {0x3f800000u, 0x3380, 0x3f80, 0x3400, 0x3f80}, /* the order: even first would give 1 + 2^-22 */
        {0x7f000000u, 0x7f00, 0x4000, 0xff00, 0x4000}, /* overflow to +Inf, then +Inf - big */
        {0x00000000u, 0x7f80, 0x0000, 0x3f80, 0x3f80}, /* Inf * 0: NaN */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const probe_case *c = &cases[i];
        float acc;
        memcpy(&acc, &c->acc, sizeof acc);
        const __m512 r = _mm512_dpbf16_ps(_mm512_set1_ps(acc),
                                          (__m512bh)_mm512_set1_epi32((int)((uint32_t)c->a0 | (uint32_t)c->a1 << 16)),
                                          (__m512bh)_mm512_set1_epi32((int)((uint32_t)c->b0 | (uint32_t)c->b1 << 16)));
        const float hw = _mm512_cvtss_f32(r);
        const float want = moe_bf16_dp(moe_bf16_dp(acc, moe_bf16_value(c->a1), moe_bf16_value(c->b1)),
                                       moe_bf16_value(c->a0), moe_bf16_value(c->b0));
        uint32_t hb, wb;
        memcpy(&hb, &hw, sizeof hb);
        memcpy(&wb, &want, sizeof wb);
        if (hb != wb && !(hw != hw && want != want)) /* NaN payloads are not part of the rule */
            return 0;
    }
    return 1;
}
