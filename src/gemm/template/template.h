/* The template row: a deliberately plain kernel folder that a port copies (docs/adding-an-isa.md).
 * Rename the folder and every "template" to the ISA's name, replace the loops in
 * linear_template.c with the ISA's vector instructions (keeping the contract of
 * src/gemm/kernels.h: one fused multiply-add per term, in increasing k, from +0), then add the
 * row to src/gemm/registry.c and the folder to CMakeLists.txt. The kernels below are portable
 * C and give exactly the ref's bits; tests/unit/test_template.c checks them. */
#ifndef MOE_GEMM_TEMPLATE_H
#define MOE_GEMM_TEMPLATE_H

#include "gemm/kernels.h"

/* Plain f32 / bf16 / f16 weights: one row by one panel of 16 features per step (the tile name
 * says so: 1 row x 16 features). A vector port keeps 16 lanes per panel and blocks rows and
 * panels so that enough independent accumulators hide the FMA latency (avx512: 6 x 64). */
void moe_ukr_f32_template_1x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                               float *out, int64_t ldo);
void moe_ukr_bf16_template_1x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                                float *out, int64_t ldo);
void moe_ukr_f16_template_1x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                               float *out, int64_t ldo);

/* The row's init: what the registry calls after detect passed, on a table holding the
 * reference entries. */
void moe_kernels_init_template(moe_kernels *k, const moe_cpu_features *f);

#endif
