/*
 * libmoe: this machine's roofline (DRAM bandwidth, FMA, VNNI and bf16 dot-product peaks), for
 * benchmarks.
 *
 * Part of the public API. Include moe.h, which includes this header where its types are
 * needed; this file also works on its own (it includes moe.h first).
 */
#include "moe.h"

#ifndef MOE_BENCH_H
#define MOE_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* MOE_API marks the public functions: the only symbols libmoe.so exports (the library is
 * built with -fvisibility=hidden; tests/exports.sh checks the export list against these
 * headers). Define MOE_API before including to override (e.g. empty). */
#ifndef MOE_API
#if defined(__GNUC__) || defined(__clang__)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif
#endif

/* ---------------------------------------------------------------------------------------
 * Roofline: this machine's limits, measured (used by `moe bench --roofline`).
 * ------------------------------------------------------------------------------------- */

/* Units are decimal: 1 GB/s = 1e9 bytes per second, 1 GFLOP/s = 1e9 floating-point
 * operations per second (a fused multiply-add counts 2), 1 GOP/s = 1e9 integer operations
 * per second (an int8 multiply-accumulate counts 2). */
typedef struct moe_roofline {
    double dram_read_gbs;       /* DRAM read bandwidth, GB/s, all `threads` together */
    double fma_f32_gflops;      /* f32 fused multiply-add peak, GFLOP/s, all threads */
    double vnni_int8_gops;      /* int8 dot-product (vpdpbusd) peak, GOP/s; 0 without
                                   AVX512-VNNI (CPU, or loops not avx512) */
    double bf16_dp_gflops;      /* bf16 dot-product (vdpbf16ps) peak, GFLOP/s, all threads:
                                   2 FLOPs per bf16 product (a bf16 pair into one f32 lane
                                   counts 4); 0 when the loops' table has no vdpbf16ps loop
                                   (no avx512_bf16 on this CPU, or MOE_ISA chose a table
                                   without it: avx512, avx2) */
    double ridge_flop_per_byte; /* fma_f32_gflops / dram_read_gbs: below this arithmetic
                                   intensity (FLOP per weight byte) a kernel is bound by
                                   DRAM, above it by the FMA peak */
    int threads;                /* threads the loops ran on (the ctx's thread count) */
    const char *isa;            /* static: the kernel table whose loops ran ("avx512_bf16",
                                   "avx512", "avx2"), or "scalar" */
    size_t dram_buffer_bytes;   /* bytes the bandwidth loop streamed over per pass */
    size_t llc_bytes;           /* last-level cache per sysfs (0: unknown) */
    double seconds;             /* wall time of the whole measurement */
} moe_roofline;

/* Measure this machine's roofline with ctx's thread count (OpenMP), in about 1 to 3 s.
 * Nothing is cached: every call measures again, so run it on an otherwise idle machine.
 *  - dram_read_gbs: a read-only streaming sum (vector loads, integer adds) over a buffer of
 *    4 x max(LLC from sysfs, 260 MiB) (about 1 GiB; less, down to 64 MiB, when
 *    MemAvailable is short), split into one contiguous slice per thread, written first by
 *    the thread that reads it, in ordinary pages like the packed weights; the best of 8
 *    passes (a pass ends when the slowest thread ends) = buffer bytes / wall time. Other
 *    processes' memory traffic or CPU use lowers it.
 *  - fma_f32_gflops: every thread runs 12 independent register-resident chains of vector
 *    FMAs (zmm for avx512, ymm for avx2) - enough to cover FMA latency x throughput on
 *    current x86 cores - for about 0.06 s; 2 x lanes x FMAs over the thread's own CPU
 *    time (CLOCK_THREAD_CPUTIME_ID: FMA units are per core, so time-sharing a core with
 *    another process does not lower it), summed over the threads; best of 5.
 *  - vnni_int8_gops: the same with vpdpbusd on zmm (64 u8 x s8 products each, counted 2
 *    ops per product), when CPUID leaf 7 ECX bit 11 (AVX512-VNNI) is set and the loops
 *    run avx512 (below); else 0.
 *  - bf16_dp_gflops: the same with vdpbf16ps on zmm (16 lanes x 2 bf16 products each, 64
 *    FLOPs per instruction), when the loops' table is avx512_bf16 (the CPU has AVX512_BF16
 *    and its vdpbf16ps passed the registry's probe); else 0. It is the compute roof of
 *    compute bf16 (moe.h MOE_COMPUTE_BF16) where that table's pair GEMM runs vdpbf16ps; where
 *    vdpbf16ps is the slower form the table runs two vfmadds per pair (same bits), against
 *    fma_f32_gflops (moe_rank_report.compute_roof says which).
 * The loops use the ISA of ctx's kernel table (avx512_bf16, avx512 or avx2); for the "ref"
 * table, the widest this CPU and OS support, or portable scalar C without AVX2.
 * Errors: MOE_EINVAL (NULL ctx or out), MOE_ENOMEM (the buffer, size named). */
MOE_API moe_status moe_roofline_measure(moe_ctx *ctx, moe_roofline *out);

#ifdef __cplusplus
}
#endif

#endif /* MOE_BENCH_H */
