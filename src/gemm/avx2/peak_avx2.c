/* Roofline loops on AVX2 (ymm): read bandwidth and f32 FMA peak (gemm/kernels.h peak_read / peak_fma).
 * Compiled with this folder's AVX2/FMA flags. */
#include "gemm/avx2/avx2.h"

#include <immintrin.h>

uint64_t moe_roofline_read_avx2(const void *buf, size_t bytes)
{
    const __m256i *p = (const __m256i *)buf;
    const size_t n = bytes / 32; /* a multiple of 16 */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
            a6 = a0, a7 = a0;
    for (size_t i = 0; i < n; i += 8) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 1));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + i + 2));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + i + 3));
        a4 = _mm256_add_epi64(a4, _mm256_load_si256(p + i + 4));
        a5 = _mm256_add_epi64(a5, _mm256_load_si256(p + i + 5));
        a6 = _mm256_add_epi64(a6, _mm256_load_si256(p + i + 6));
        a7 = _mm256_add_epi64(a7, _mm256_load_si256(p + i + 7));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)),
                          _mm256_add_epi64(_mm256_add_epi64(a4, a5), _mm256_add_epi64(a6, a7)));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

float moe_roofline_fma_avx2(int64_t iters)
{
    /* acc = acc * m + c converges to 1: no overflow, no subnormals. 12 accumulators + 2
     * operands fit the 16 ymm registers. */
    const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
    __m256 acc[MOE_ROOFLINE_CHAINS];
    for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
        acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
            acc[j] = _mm256_fmadd_ps(acc[j], m, c);
    __m256 s = acc[0];
    for (int j = 1; j < MOE_ROOFLINE_CHAINS; j++)
        s = _mm256_add_ps(s, acc[j]);
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    float r = 0.0f;
    for (int j = 0; j < 8; j++)
        r += lanes[j];
    return r;
}
