/* The avx512 row of the registry (src/gemm/registry.c): AVX-512 F/BW/VL/DQ with AVX2, FMA and
 * F16C. Its table starts from the reference entries; this overrides what the folder
 * implements. Sub-ISA: AVX512-VNNI enables the int8 w8a8 GEMM (MOE_CAP_VNNI). The fp8 w8a8
 * row quantizer and every format's linear on f32 rows for the quantized-activation formats
 * stay the ref's (the grouped driver quantizes rows itself). */
#include "gemm/avx512/avx512.h"

void moe_kernels_init_avx512(moe_kernels *k, const moe_cpu_features *f)
{
    k->caps = MOE_CAP_FMA | MOE_CAP_F16C | MOE_CAP_AVX512;
    k->linear[MOE_WF_F32] = moe_ukr_f32_avx512_6x64;
    k->linear[MOE_WF_BF16] = moe_ukr_bf16_avx512_6x64;
    k->linear[MOE_WF_F16] = moe_ukr_f16_avx512_6x64;
    k->linear[MOE_WF_F8] = moe_ukr_fp8_avx512_4x64;
    k->linear[MOE_WF_I8] = moe_ukr_i8_avx512_4x64;
    k->linear[MOE_WF_I4] = moe_ukr_i4_avx512_4x64;
    k->linear[MOE_WF_I4ZP] = moe_ukr_i4zp_avx512_4x64;
    k->linear[MOE_WF_FP4] = moe_ukr_mxfp4_avx512_4x64;
    k->act_row = moe_act_row_avx512;
    k->quant_row[MOE_WF_W8A8] = moe_quant_row_i8_avx512;
    k->linear_rows[MOE_WF_F8A8] = moe_ukr_f8a8_rows_avx512_6x64;
    unsigned native = 1u << MOE_WF_F32 | 1u << MOE_WF_BF16 | 1u << MOE_WF_F16 | 1u << MOE_WF_F8 | 1u << MOE_WF_I8 |
                      1u << MOE_WF_I4 | 1u << MOE_WF_I4ZP | 1u << MOE_WF_FP4 | 1u << MOE_WF_F8A8;
    if (f->avx512_vnni) {
        k->caps |= MOE_CAP_VNNI;
        k->linear_rows[MOE_WF_W8A8] = moe_ukr_w8a8_avx512vnni_6x64;
        native |= 1u << MOE_WF_W8A8;
    }
    k->native = native;
    k->tail_ref = 0; /* partial panels run masked */
    k->peak_read = moe_roofline_read_avx512;
    k->peak_fma = moe_roofline_fma_avx512;
    k->peak_vnni = f->avx512_vnni ? moe_roofline_vnni_avx512 : NULL;
    k->fma_lanes = 16;
}
