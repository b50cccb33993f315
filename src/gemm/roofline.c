/* moe_roofline_measure(): this machine's DRAM read bandwidth, f32 FMA peak, VNNI int8 peak and
 * vdpbf16ps peak, measured with the ctx's thread count. The vector loops are entries of the
 * kernel tables (gemm/kernels.h peak_read / peak_fma / peak_vnni / peak_bf16, in each ISA folder
 * so they get their ISA's flags); this file picks a table from the registry, threads and times
 * them. */
#include "gemm/kernels.h"

#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define MIB ((size_t)1 << 20)
#define PROJECT_LLC_BYTES (260 * MIB) /* documented LLC of this project's machines */
#define MIN_BUFFER (64 * MIB)
#define SLICE_ALIGN (2 * MIB)         /* per-thread slices start 2 MiB apart, aligned */
#define READ_PASSES 8
#define PEAK_TRIALS 5
#define PEAK_SECONDS 0.06

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Size of the highest-level data or unified cache of cpu0 per sysfs; 0 when unknown. */
static size_t llc_sysfs(void)
{
    size_t best = 0;
    int best_level = -1;
    for (int i = 0; i < 16; i++) {
        char path[128], buf[64];
        int level;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int ok = fscanf(f, "%d", &level) == 1;
        fclose(f);
        if (!ok)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if ((f = fopen(path, "r")) != NULL) {
            ok = fgets(buf, sizeof buf, f) != NULL;
            fclose(f);
            if (ok && strncmp(buf, "Instruction", 11) == 0)
                continue;
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r")))
            continue;
        unsigned long long v = 0;
        char unit = 0;
        int n = fscanf(f, "%llu%c", &v, &unit);
        fclose(f);
        if (n < 1)
            continue;
        size_t bytes = (size_t)v;
        if (n == 2 && (unit == 'K' || unit == 'k'))
            bytes <<= 10;
        else if (n == 2 && unit == 'M')
            bytes <<= 20;
        else if (n == 2 && unit == 'G')
            bytes <<= 30;
        if (level > best_level || (level == best_level && bytes > best)) {
            best_level = level;
            best = bytes;
        }
    }
    return best;
}

/* MemAvailable in bytes; 0 when unknown. */
static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb << 10;
}

/* Portable fallbacks (no AVX2): 64-bit loads; multiply then add (2 FLOPs, -ffp-contract=off
 * keeps them separate). */
static uint64_t read_scalar(const void *buf, size_t bytes)
{
    const uint64_t *p = (const uint64_t *)buf;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

static float fma_scalar(int64_t iters)
{
    float acc[MOE_ROOFLINE_CHAINS];
    for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
        acc[j] = (float)j;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
            acc[j] = acc[j] * 0.999f + 0.001f;
    float s = 0.0f;
    for (int j = 0; j < MOE_ROOFLINE_CHAINS; j++)
        s += acc[j];
    return s;
}

/* The loops of one table, or the portable ones where it has none. */
typedef struct rf_loops {
    const char *isa; /* "avx512", "avx2" (the table's name) or "scalar" */
    uint64_t (*read)(const void *buf, size_t bytes);
    float (*fma)(int64_t iters);
    int32_t (*vnni)(int64_t iters);
    float (*bf16)(int64_t iters);
    int lanes;
} rf_loops;

/* The compute loops measure_peak times. */
enum { PEAK_FMA, PEAK_VNNI, PEAK_BF16 };

/* Runs loop `kind` for `iters` iterations; returns a value to keep. */
static double peak_isa(const rf_loops *L, int kind, int64_t iters)
{
    return kind == PEAK_VNNI ? (double)L->vnni(iters) : kind == PEAK_BF16 ? (double)L->bf16(iters)
                                                                           : (double)L->fma(iters);
}

static volatile double g_sink; /* keeps the loops' results */

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every thread runs `iters` iterations at once (from a barrier); returns the sum over the
 * threads of iterations per second of the thread's own CPU time. CPU time, not wall time:
 * the FMA and VNNI units are per core, so a thread time-shared with another process still
 * measures its core's peak, and the sum is the peak of `nt` cores. *wall gets the wall time
 * of the slowest thread. */
static double run_peak(const rf_loops *L, int kind, int64_t iters, int nt, double *wall)
{
    double rate = 0.0, sink = 0.0, t0 = 0.0, t1 = 0.0;
#pragma omp parallel num_threads(nt) reduction(+ : rate, sink)
    {
#pragma omp barrier
#pragma omp master
        t0 = now_s();
        double c0 = thread_cpu_s();
        sink += peak_isa(L, kind, iters);
        double c = thread_cpu_s() - c0;
        rate += c > 0 ? (double)iters / c : 0.0;
#pragma omp barrier
#pragma omp master
        t1 = now_s();
    }
    g_sink += sink;
    *wall = t1 - t0;
    return rate;
}

/* Operations per second (ops_per_iter per thread per iteration), all threads: the best of
 * PEAK_TRIALS runs of about PEAK_SECONDS each, after a calibration that also warms the
 * clocks up. */
static double measure_peak(const rf_loops *L, int kind, double ops_per_iter, int nt)
{
    int64_t iters = 1 << 16;
    double wall;
    run_peak(L, kind, iters, nt, &wall);
    while (wall < 0.02) { /* calibrate: at least 20 ms */
        iters *= 4;
        run_peak(L, kind, iters, nt, &wall);
    }
    iters = (int64_t)((double)iters * PEAK_SECONDS / wall) + 1;
    double best = 0.0;
    for (int r = 0; r < PEAK_TRIALS; r++) {
        double rate = ops_per_iter * run_peak(L, kind, iters, nt, &wall);
        if (rate > best)
            best = rate;
    }
    return best;
}

moe_status moe_roofline_measure(moe_ctx *ctx, moe_roofline *out)
{
    if (!ctx)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_roofline_measure: out is NULL");
    memset(out, 0, sizeof *out);
    const double start = now_s();
    const int nt = ctx->num_threads > 0 ? ctx->num_threads : 1;

    /* The loops: the ctx's table's; for a table without them ("ref"), the best runnable row
     * that has them; portable C without any. */
    rf_loops L = {.isa = "scalar", .read = read_scalar, .fma = fma_scalar, .vnni = NULL, .bf16 = NULL, .lanes = 1};
    const moe_kernels *kt = ctx->kernels;
    if (!kt->peak_read || !kt->peak_fma)
        for (size_t i = moe_isa_rows(); i-- > 0;) {
            const moe_kernels *k = moe_isa_kernels(i);
            if (k && k->peak_read && k->peak_fma) {
                kt = k;
                break;
            }
        }
    if (kt->peak_read && kt->peak_fma)
        L = (rf_loops){.isa = kt->name, .read = kt->peak_read, .fma = kt->peak_fma, .vnni = kt->peak_vnni,
                       .bf16 = kt->peak_bf16, .lanes = kt->fma_lanes};
    out->isa = L.isa;
    out->threads = nt;

    /* DRAM read bandwidth. */
    size_t llc = llc_sysfs();
    out->llc_bytes = llc;
    size_t want = 4 * (llc > PROJECT_LLC_BYTES ? llc : PROJECT_LLC_BYTES);
    size_t avail = mem_available();
    if (avail && want > avail / 2)
        want = avail / 2;
    if (want < MIN_BUFFER)
        want = MIN_BUFFER;
    const size_t unit = SLICE_ALIGN * (size_t)nt;
    size_t slice = want / unit * SLICE_ALIGN; /* bytes per thread */
    if (slice == 0)
        slice = SLICE_ALIGN;
    const size_t bytes = slice * (size_t)nt;
    const size_t map_bytes = bytes + SLICE_ALIGN;
    void *map = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return moe_set_error(ctx, MOE_ENOMEM,
                             "moe_roofline_measure: cannot map the %zu-byte bandwidth buffer",
                             map_bytes);
    char *buf = (char *)(((uintptr_t)map + SLICE_ALIGN - 1) & ~(uintptr_t)(SLICE_ALIGN - 1));
    /* No MADV_HUGEPAGE: packed weights live in ordinary pages, and with THP in "madvise"
     * mode the huge-page faults may stall in compaction for a second or more. */
    out->dram_buffer_bytes = bytes;
    double best_read = 0.0, t0 = 0.0, t1 = 0.0;
    uint64_t rsink = 0;
#pragma omp parallel num_threads(nt) reduction(+ : rsink)
    {
        const int tid = omp_get_thread_num();
        char *mine = buf + (size_t)tid * slice;
        memset(mine, 1 + tid, slice); /* first touch by the reader: real pages, local node */
        for (int pass = 0; pass < READ_PASSES; pass++) {
#pragma omp barrier
#pragma omp master
            t0 = now_s();
            rsink += L.read(mine, slice);
#pragma omp barrier
#pragma omp master
            {
                t1 = now_s();
                double gbs = t1 > t0 ? (double)bytes / (t1 - t0) * 1e-9 : 0.0;
                if (gbs > best_read)
                    best_read = gbs;
            }
        }
    }
    g_sink += (double)rsink;
    munmap(map, map_bytes);
    out->dram_read_gbs = best_read;

    /* Compute peaks. */
    out->fma_f32_gflops = 1e-9 * measure_peak(&L, PEAK_FMA, 2.0 * (double)L.lanes * MOE_ROOFLINE_CHAINS, nt);
    if (L.vnni)
        out->vnni_int8_gops = 1e-9 * measure_peak(&L, PEAK_VNNI, 2.0 * 64.0 * MOE_ROOFLINE_CHAINS, nt);
    if (L.bf16) /* 16 lanes x 2 bf16 products, 2 FLOPs each, per vdpbf16ps */
        out->bf16_dp_gflops = 1e-9 * measure_peak(&L, PEAK_BF16, 2.0 * 32.0 * MOE_ROOFLINE_CHAINS, nt);
    out->ridge_flop_per_byte = out->dram_read_gbs > 0 ? out->fma_f32_gflops / out->dram_read_gbs
                                                      : 0.0;
    out->seconds = now_s() - start;
    moe_log(ctx, MOE_LOG_INFO,
            "roofline (%d threads, %s): DRAM read %.1f GB/s over %zu MiB, f32 FMA %.1f GFLOP/s, "
            "VNNI int8 %.1f GOP/s, bf16 vdpbf16ps %.1f GFLOP/s, ridge %.2f FLOP/byte, measured in %.2f s",
            nt, out->isa, out->dram_read_gbs, bytes >> 20, out->fma_f32_gflops,
            out->vnni_int8_gops, out->bf16_dp_gflops, out->ridge_flop_per_byte, out->seconds);
    return MOE_OK;
}
