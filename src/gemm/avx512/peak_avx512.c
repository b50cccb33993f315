/* Roofline loops on AVX-512 (zmm): read bandwidth, f32 FMA peak and VNNI int8 peak (the table's
 * peak_read / peak_fma / peak_vnni, gemm/kernels.h). Compiled with this folder's AVX-512 flags;
 * VNNI by a function attribute, installed only when the CPU has it. */
#include "gemm/avx512/avx512.h"

#include <immintrin.h>

uint64_t moe_roofline_read_avx512(const void *buf, size_t bytes)
{
    const __m512i *p = (const __m512i *)buf;
    const size_t n = bytes / 64; /* a multiple of 8 */
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0,
            a6 = a0, a7 = a0;
    for (size_t i = 0; i < n; i += 8) {
        a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 1));
        a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 2));
        a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 3));
        a4 = _mm512_add_epi64(a4, _mm512_load_si512(p + i + 4));
        a5 = _mm512_add_epi64(a5, _mm512_load_si512(p + i + 5));
        a6 = _mm512_add_epi64(a6, _mm512_load_si512(p + i + 6));
        a7 = _mm512_add_epi64(a7, _mm512_load_si512(p + i + 7));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)),
                          _mm512_add_epi64(_mm512_add_epi64(a4, a5), _mm512_add_epi64(a6, a7)));
    /* the lanes summed as unsigned (wrapping): the header's _mm512_reduce_add_epi64 adds signed
     * long longs, undefined on overflow (UBSan), and the sum of arbitrary bytes overflows */
    uint64_t lane[8];
    _mm512_storeu_si512(lane, a0);
    uint64_t sum = 0;
    for (int i = 0; i < 8; i++)
        sum += lane[i];
    return sum;
}

float moe_roofline_fma_avx512(int64_t iters)
{
    /* acc = acc * m + c converges to 1: no overflow, no subnormals. */
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
    __m512 acc[MOE_ROOFLINE_CHAINS];
    for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
        acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
            acc[j] = _mm512_fmadd_ps(acc[j], m, c);
    __m512 s = acc[0];
    for (int j = 1; j < MOE_ROOFLINE_CHAINS; j++)
        s = _mm512_add_ps(s, acc[j]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) int32_t moe_roofline_vnni_avx512(int64_t iters)
{
    const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(3);
    __m512i acc[MOE_ROOFLINE_CHAINS];
    for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
        acc[j] = _mm512_set1_epi32(j);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
            acc[j] = _mm512_dpbusd_epi32(acc[j], a, b); /* wraps: no overflow trap */
    __m512i s = acc[0];
    for (int j = 1; j < MOE_ROOFLINE_CHAINS; j++)
        s = _mm512_add_epi32(s, acc[j]);
    uint32_t lane[16]; /* summed unsigned (wrapping), as above */
    _mm512_storeu_si512(lane, s);
    uint32_t sum = 0;
    for (int i = 0; i < 16; i++)
        sum += lane[i];
    return (int32_t)sum;
}
