/* The avx512 row of the registry (src/gemm/registry.c): AVX-512 F/BW/VL/DQ with AVX2, FMA and
 * F16C. What the folder implements, merged over the reference entries (moe_kernels_merge): every
 * plain and weight-only quantized format, the fp8 w8a8 GEMM on quantized rows, the int8 w8a8
 * row quantizer, compute bf16's row rounder and pair-panel GEMM (vfmadd under FTZ|DAZ), and
 * with AVX512-VNNI (MOE_CAP_VNNI) the int8 w8a8 GEMM. The fp8 w8a8 row
 * quantizer and the quantized-activation formats' f32-row entries stay the ref's (the grouped
 * driver quantizes rows itself). Partial panels run masked. */
#include "gemm/avx512/avx512.h"

void moe_kernels_init_avx512(moe_kernels *k, const moe_cpu_features *f)
{
    moe_kernels own = {
        .caps = MOE_CAP_FMA | MOE_CAP_F16C | MOE_CAP_AVX512,
        .linear = {[MOE_WF_F32] = moe_ukr_f32_avx512_6x64, [MOE_WF_BF16] = moe_ukr_bf16_avx512_6x64,
                   [MOE_WF_F16] = moe_ukr_f16_avx512_6x64, [MOE_WF_F8] = moe_ukr_fp8_avx512_4x64,
                   [MOE_WF_I8] = moe_ukr_i8_avx512_4x64, [MOE_WF_I4] = moe_ukr_i4_avx512_4x64,
                   [MOE_WF_I4ZP] = moe_ukr_i4zp_avx512_4x64, [MOE_WF_FP4] = moe_ukr_mxfp4_avx512_4x64},
        .act_row = moe_act_row_avx512,
        .quant_row = {[MOE_WF_W8A8] = moe_quant_row_i8_avx512},
        .linear_rows = {[MOE_WF_F8A8] = moe_ukr_f8a8_rows_avx512_6x64},
        .bf16_row = moe_bf16_row_avx512,
        .bf16_rows = {[MOE_WF_BF16P] = moe_ukr_bf16p_rows_avx512_12x32},
        .tail_ref = 0,
        .peak_read = moe_roofline_read_avx512,
        .peak_fma = moe_roofline_fma_avx512,
        .fma_lanes = 16,
    };
    if (f->avx512_vnni) {
        own.caps |= MOE_CAP_VNNI;
        own.linear_rows[MOE_WF_W8A8] = moe_ukr_w8a8_rows_avx512_6x64;
        own.peak_vnni = moe_roofline_vnni_avx512;
    }
    moe_kernels_merge(k, &own);
}
