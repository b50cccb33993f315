/* The avx2 row of the registry (src/gemm/registry.c): AVX2 with FMA and F16C. What the folder
 * implements, merged over the reference entries (moe_kernels_merge): every plain and weight-only
 * quantized format. The quantized-activation formats (int8 w8a8, fp8 w8a8) keep the scalar
 * entries (no VNNI here): the plan reports that fallback (moe_plan_report). A partial last panel
 * of plain weights runs the scalar kernel (tail_ref), since AVX2 has no masked 16-bit loads. */
#include "gemm/avx2/avx2.h"

void moe_kernels_init_avx2(moe_kernels *k, const moe_cpu_features *f)
{
    (void)f;
    const moe_kernels own = {
        .caps = MOE_CAP_FMA | MOE_CAP_F16C,
        .linear = {[MOE_WF_F32] = moe_ukr_f32_avx2_6x16, [MOE_WF_BF16] = moe_ukr_bf16_avx2_6x16,
                   [MOE_WF_F16] = moe_ukr_f16_avx2_6x16, [MOE_WF_F8] = moe_ukr_fp8_avx2_4x32,
                   [MOE_WF_I8] = moe_ukr_i8_avx2_4x32, [MOE_WF_I4] = moe_ukr_i4_avx2_4x32,
                   [MOE_WF_I4ZP] = moe_ukr_i4zp_avx2_4x32, [MOE_WF_FP4] = moe_ukr_mxfp4_avx2_4x32},
        .act_row = moe_act_row_avx2,
        .tail_ref = 1u << MOE_WF_F32 | 1u << MOE_WF_BF16 | 1u << MOE_WF_F16,
        .peak_read = moe_roofline_read_avx2,
        .peak_fma = moe_roofline_fma_avx2,
        .fma_lanes = 8,
    };
    moe_kernels_merge(k, &own);
}
