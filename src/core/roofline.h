/* The roofline loops of each ISA (src/gemm/avx512/peak_avx512.c, src/gemm/avx2/peak_avx2.c),
 * driven by src/core/roofline.c. Not API. Each function runs on the calling thread only;
 * the caller threads them and times them. Call an ISA's functions only when the CPU and OS
 * support it (moe_cpu_has_avx512 / moe_cpu_has_avx2; VNNI also needs CPUID's AVX512-VNNI). */
#ifndef MOE_CORE_ROOFLINE_H
#define MOE_CORE_ROOFLINE_H

#include <stddef.h>
#include <stdint.h>

/* Independent FMA chains per thread in the peak loops. */
#define MOE_ROOFLINE_CHAINS 12

/* Read `bytes` bytes at `buf` (64-byte aligned, a multiple of 512 bytes) with vector loads
 * and return their sum as 64-bit integers (a value to keep, so the loads stay). */
uint64_t moe_roofline_read_avx512(const void *buf, size_t bytes);
uint64_t moe_roofline_read_avx2(const void *buf, size_t bytes);

/* `iters` x MOE_ROOFLINE_CHAINS dependent vfmadd231ps, MOE_ROOFLINE_CHAINS chains in
 * registers: 2 * lanes * MOE_ROOFLINE_CHAINS * iters FLOPs (lanes 16 for zmm, 8 for ymm).
 * Returns a value to keep. */
float moe_roofline_fma_avx512(int64_t iters);
float moe_roofline_fma_avx2(int64_t iters);

/* `iters` x MOE_ROOFLINE_CHAINS vpdpbusd on zmm in as many chains: 2 * 64 *
 * MOE_ROOFLINE_CHAINS * iters ops. Needs AVX512-VNNI. */
int32_t moe_roofline_vnni_avx512(int64_t iters);

#endif
