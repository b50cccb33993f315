/* The kernels of the avx512_bf16 row (compiled with this folder's AVX-512 + AVX512_BF16 flags;
 * reached only through the table moe_kernels_init_avx512_bf16 fills, after the registry's
 * detect passed). The row extends the avx512 row: every compute-f32 entry is avx512's, and
 * compute bf16 (gemm/kernels.h "Compute bf16") runs on vdpbf16ps. */
#ifndef MOE_GEMM_AVX512_BF16_H
#define MOE_GEMM_AVX512_BF16_H

#include "gemm/kernels.h"

/* 1 when this CPU's vdpbf16ps computes core/bf16.h's moe_bf16_dp (DAZ, FTZ, the pair order)
 * on a set of edge cases (probe_avx512_bf16.c); the registry's detect requires it. */
int moe_avx512_bf16_probe(void);

/* compute bf16: the pair-panel GEMM, 6 rows x 4 panels (linear_avx512_bf16.c) */
void moe_ukr_bf16p_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                         const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                         int64_t pf_bytes);

/* compute bf16 on the weight-only quantized formats: the codes decoded to bf16 pairs, into
 * registers for up to 4 rows, else a chunk at a time into a buffer that tiles of 6 rows x 4
 * panels then run over on vdpbf16ps (linear_qbf16_avx512_bf16.c) */
void moe_ukr_qbf16_i8_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                            int64_t pf_bytes);
void moe_ukr_qbf16_fp8_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                             const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                             int64_t pf_bytes);
void moe_ukr_qbf16_i4_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                            int64_t pf_bytes);
void moe_ukr_qbf16_i4zp_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                              const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                              int64_t pf_bytes);
void moe_ukr_qbf16_mxfp4_rows_avx512_bf16_6x64(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                               const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                               int64_t pf_bytes);

/* the roofline loop: MOE_ROOFLINE_CHAINS dependent vdpbf16ps chains (peak_avx512_bf16.c) */
float moe_roofline_bf16_avx512_bf16(int64_t iters);

#endif
