/* The kernels of the avx2 row (compiled with this folder's AVX2 / FMA / F16C flags; reached
 * only through the table moe_kernels_init_avx2 fills, after the registry's detect passed). */
#ifndef MOE_GEMM_AVX2_H
#define MOE_GEMM_AVX2_H

#include "gemm/kernels.h"

/* plain weights (linear_avx2.c); a partial last panel runs the ref kernel */
void moe_ukr_f32_avx2_6x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                           int64_t ldo);
void moe_ukr_bf16_avx2_6x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo);
void moe_ukr_f16_avx2_6x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                           int64_t ldo);
/* weight-only quantized (linear_q_avx2.c) */
void moe_ukr_fp8_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                           int64_t ldo);
void moe_ukr_i8_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                          int64_t ldo);
void moe_ukr_i4_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                          int64_t ldo);
void moe_ukr_i4zp_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo);
void moe_ukr_mxfp4_avx2_4x32(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                             int64_t ldo);
/* the gate/up epilogue (act_avx2.c) */
void moe_act_row_avx2(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                      float *h, int64_t n);
/* roofline loops (peak_avx2.c) */
uint64_t moe_roofline_read_avx2(const void *buf, size_t bytes);
float moe_roofline_fma_avx2(int64_t iters);

#endif
