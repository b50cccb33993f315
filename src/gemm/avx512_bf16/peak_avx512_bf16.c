/* The roofline loop of vdpbf16ps (the table's peak_bf16, gemm/kernels.h): MOE_ROOFLINE_CHAINS
 * independent accumulator chains, each step 16 lanes x 2 bf16 products (64 FLOP). */
#include "gemm/avx512_bf16/avx512_bf16.h"

#include <immintrin.h>

float moe_roofline_bf16_avx512_bf16(int64_t iters)
{
    /* acc += 2^-12 * 2^-12 per pair element: stays finite and normal for any iters used */
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x39803980), b = (__m512bh)_mm512_set1_epi32(0x39803980);
    __m512 acc[MOE_ROOFLINE_CHAINS];
    for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
        acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
            acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    __m512 s = acc[0];
    for (int j = 1; j < MOE_ROOFLINE_CHAINS; j++)
        s = _mm512_add_ps(s, acc[j]);
    return _mm512_reduce_add_ps(s);
}
