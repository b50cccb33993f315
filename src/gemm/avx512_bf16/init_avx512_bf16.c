/* The avx512_bf16 row of the registry (src/gemm/registry.c): the avx512 row's table (its init
 * runs first: every compute-f32 entry, and the bf16 row rounder, bit for bit the same) extended
 * with the compute-bf16 GEMMs on vdpbf16ps (MOE_CAP_AVX512_BF16: the bf16 pair panels and every
 * weight-only quantized format) and the bf16 roofline loop.
 *
 * The bf16-pair GEMM (MOE_WF_BF16P) has two forms with the same bits: vdpbf16ps (32 products an
 * instruction) and the avx512 row's two vfmadds per pair under FTZ|DAZ (16 products an
 * instruction). Which is faster depends on the core: Zen 4 and Zen 5 issue vdpbf16ps at the
 * vfmadd rate (twice the products), the Intel Xeons measured here (Sapphire Rapids class) at
 * half of it (the same products as one vfmadd port pair, less than the two vfmadd ports). The
 * init times both roofline loops once, when the table is built, and keeps vdpbf16ps unless its
 * product rate is below 0.9 of vfmadd's (the vfmadd form also splits each weight pair: about
 * a tenth more work a product). The choice changes no bits, only the speed; it is in the
 * table's notes (`moe version`). */
#include "gemm/avx512_bf16/avx512_bf16.h"

#include <stdio.h>
#include <time.h>

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Products per second of vdpbf16ps over those of vfmadd231ps zmm on this thread: the best of 5
 * alternating runs of each roofline loop (about 0.2 ms each on a 3 GHz core). */
static double dp_over_fma(float (*peak_fma)(int64_t), float (*peak_bf16)(int64_t))
{
    enum { ITERS = 20000, RUNS = 5 };
    volatile float sink = 0.0f;
    double best_dp = 1e30, best_fma = 1e30;
    for (int r = 0; r < RUNS; r++) {
        double t0 = seconds();
        sink += peak_bf16(ITERS);
        double t1 = seconds();
        sink += peak_fma(ITERS);
        double t2 = seconds();
        best_dp = t1 - t0 < best_dp ? t1 - t0 : best_dp;
        best_fma = t2 - t1 < best_fma ? t2 - t1 : best_fma;
    }
    (void)sink;
    /* per instruction: vdpbf16ps 16 lanes x 2 products, vfmadd231ps 16 lanes x 1 */
    return (32.0 / best_dp) / (16.0 / best_fma);
}

void moe_kernels_init_avx512_bf16(moe_kernels *k, const moe_cpu_features *f)
{
    moe_kernels_init_avx512(k, f);
    moe_kernels own = {
        .caps = MOE_CAP_AVX512_BF16,
        .bf16_rows = {[MOE_WF_BF16P] = moe_ukr_bf16p_rows_avx512_bf16_6x64,
                      [MOE_WF_I8] = moe_ukr_qbf16_i8_rows_avx512_bf16_6x64,
                      [MOE_WF_F8] = moe_ukr_qbf16_fp8_rows_avx512_bf16_6x64,
                      [MOE_WF_I4] = moe_ukr_qbf16_i4_rows_avx512_bf16_6x64,
                      [MOE_WF_I4ZP] = moe_ukr_qbf16_i4zp_rows_avx512_bf16_6x64,
                      [MOE_WF_FP4] = moe_ukr_qbf16_mxfp4_rows_avx512_bf16_6x64},
        /* with the entries: the pair panels' bit goes with theirs when vfmadd is kept */
        .bf16_dp = 1u << MOE_WF_BF16P | 1u << MOE_WF_I8 | 1u << MOE_WF_F8 | 1u << MOE_WF_I4 | 1u << MOE_WF_I4ZP |
                   1u << MOE_WF_FP4,
        .peak_bf16 = moe_roofline_bf16_avx512_bf16,
    };
    const double ratio = dp_over_fma(k->peak_fma, moe_roofline_bf16_avx512_bf16);
    if (ratio < 0.9) {
        own.bf16_rows[MOE_WF_BF16P] = NULL; /* keep the avx512 row's vfmadd form */
        snprintf(own.notes, sizeof own.notes,
                 "compute bf16 pair GEMM: two vfmadds per pair (vdpbf16ps measured here at %.2fx their products "
                 "per second)",
                 ratio);
    } else {
        snprintf(own.notes, sizeof own.notes,
                 "compute bf16 pair GEMM: vdpbf16ps (measured here at %.2fx the products per second of two vfmadds "
                 "per pair)",
                 ratio);
    }
    moe_kernels_merge(k, &own);
}
