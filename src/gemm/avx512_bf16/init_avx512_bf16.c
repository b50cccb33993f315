/* The avx512_bf16 row of the registry (src/gemm/registry.c): the avx512 row's table (its init
 * runs first: every compute-f32 entry, and the bf16 row rounder, bit for bit the same) extended
 * with the compute-bf16 GEMMs on vdpbf16ps (MOE_CAP_AVX512_BF16: the bf16 pair panels and every
 * weight-only quantized format) and the bf16 roofline loop. */
#include "gemm/avx512_bf16/avx512_bf16.h"

void moe_kernels_init_avx512_bf16(moe_kernels *k, const moe_cpu_features *f)
{
    moe_kernels_init_avx512(k, f);
    const moe_kernels own = {
        .caps = MOE_CAP_AVX512_BF16,
        .bf16_rows = {[MOE_WF_BF16P] = moe_ukr_bf16p_rows_avx512_bf16_6x64,
                      [MOE_WF_I8] = moe_ukr_qbf16_i8_rows_avx512_bf16_6x64,
                      [MOE_WF_F8] = moe_ukr_qbf16_fp8_rows_avx512_bf16_6x64,
                      [MOE_WF_I4] = moe_ukr_qbf16_i4_rows_avx512_bf16_6x64,
                      [MOE_WF_I4ZP] = moe_ukr_qbf16_i4zp_rows_avx512_bf16_6x64,
                      [MOE_WF_FP4] = moe_ukr_qbf16_mxfp4_rows_avx512_bf16_6x64},
        .peak_bf16 = moe_roofline_bf16_avx512_bf16,
    };
    moe_kernels_merge(k, &own);
}
