/* The template row's init (template.h). The table arrives holding every reference entry
 * (src/gemm/linear_ref.c, linear_q_ref.c); override only what the folder implements, and say so
 * in `native` (the plan report names every other format as a fallback to the scalar entries)
 * and `tail_ref` (formats whose partial last panel your kernels hand to the ref). Set the caps
 * of the sub-ISA features you use, from f (core/cpu.h: never read CPUID here), and the roofline
 * loops if the ISA has them (src/gemm/roofline.c then measures with them). */
#include "gemm/template/template.h"

void moe_kernels_init_template(moe_kernels *k, const moe_cpu_features *f)
{
    (void)f; /* e.g. if (f->avx512_vnni) { k->caps |= MOE_CAP_VNNI; k->linear_rows[...] = ...; } */
    k->caps = 0;
    k->linear[MOE_WF_F32] = moe_ukr_f32_template_1x16;
    k->linear[MOE_WF_BF16] = moe_ukr_bf16_template_1x16;
    k->linear[MOE_WF_F16] = moe_ukr_f16_template_1x16;
    /* the quantized formats, the activation rows, quant_row / linear_rows stay the ref's */
    k->native = 1u << MOE_WF_F32 | 1u << MOE_WF_BF16 | 1u << MOE_WF_F16;
    k->tail_ref = 0;  /* partial panels run at their true width here */
    k->peak_read = NULL; /* no roofline loops: the roofline uses the best row that has them */
    k->peak_fma = NULL;
    k->peak_vnni = NULL;
    k->fma_lanes = 0;
}
