/* The template row's init (template.h). Declare what the folder implements as a table of its
 * own and merge it over the reference entries (moe_kernels_merge): every entry left NULL stays
 * the ref's, and the plan report names every routed-expert format whose linear / linear_rows
 * you did not set as a fallback to the scalar entries. Set the caps of the sub-ISA features you
 * use, from f (core/cpu.h: never read CPUID here), tail_ref for the formats whose partial last
 * panel your kernels hand to the ref, and the roofline loops if the ISA has them
 * (src/gemm/roofline.c then measures with them). */
#include "gemm/template/template.h"

void moe_kernels_init_template(moe_kernels *k, const moe_cpu_features *f)
{
    (void)f; /* e.g. if (f->avx512_vnni) { own.caps |= MOE_CAP_VNNI; own.linear_rows[...] = ...; } */
    const moe_kernels own = {
        .caps = 0,
        .linear = {[MOE_WF_F32] = moe_ukr_f32_template_1x16, [MOE_WF_BF16] = moe_ukr_bf16_template_1x16,
                   [MOE_WF_F16] = moe_ukr_f16_template_1x16},
        .tail_ref = 0, /* partial panels run at their true width here */
        /* no roofline loops: the roofline uses the best row that has them */
    };
    moe_kernels_merge(k, &own);
}
