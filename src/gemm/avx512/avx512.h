/* The kernels of the avx512 row (compiled with this folder's AVX-512 flags; reached only
 * through the table moe_kernels_init_avx512 fills, after the registry's detect passed). */
#ifndef MOE_GEMM_AVX512_H
#define MOE_GEMM_AVX512_H

#include "gemm/kernels.h"

/* plain weights, 6 rows x 4 panels (linear_avx512.c) */
void moe_ukr_f32_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                             int64_t ldo);
void moe_ukr_bf16_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                              int64_t ldo);
void moe_ukr_f16_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                             int64_t ldo);
/* weight-only quantized, rows in blocks of up to 4 (linear_q_avx512.c) */
void moe_ukr_fp8_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                             int64_t ldo);
void moe_ukr_i8_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo);
void moe_ukr_i4_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo);
void moe_ukr_i4zp_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                              int64_t ldo);
void moe_ukr_mxfp4_avx512_4x64(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                               float *out, int64_t ldo);
/* fp8 w8a8 block on quantized rows (linear_q_avx512.c) */
void moe_ukr_f8a8_rows_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                   const float *const *sa, int mb, float *out, int64_t ldo, const void *pf,
                                   int64_t pf_bytes);
/* compute bf16 without vdpbf16ps (bf16_avx512.c): the row rounder, and the pair-panel GEMM on
 * vfmadd under MXCSR FTZ|DAZ */
void moe_bf16_row_avx512(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales);
void moe_ukr_bf16p_rows_avx512_12x32(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                    const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                    int64_t pf_bytes);
/* int8 w8a8 (w8a8_avx512.c): the row quantizer, and the VNNI GEMM (call only with VNNI) */
void moe_quant_row_i8_avx512(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales);
void moe_ukr_w8a8_rows_avx512_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                   const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                   int64_t pf_bytes);
/* the gate/up epilogue (act_avx512.c) */
void moe_act_row_avx512(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                        float *h, int64_t n);
/* roofline loops (peak_avx512.c) */
uint64_t moe_roofline_read_avx512(const void *buf, size_t bytes);
float moe_roofline_fma_avx512(int64_t iters);
int32_t moe_roofline_vnni_avx512(int64_t iters);

#endif
