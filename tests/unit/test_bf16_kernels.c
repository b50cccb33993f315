/* Compute bf16 on the weight-only quantized formats: the avx512_bf16 table's kernels
 * (src/gemm/avx512_bf16/linear_qbf16_avx512_bf16.c) against the definition,
 * moe_ukr_qbf16_rows_ref (src/gemm/linear_bf16_ref.c), bit for bit (memcmp of the whole
 * output buffer: lanes past a narrow panel, columns past the call's panels and rows past mb
 * keep their sentinel; NaN payloads included, except where a product has two NaN operands,
 * check_matrix):
 *  - kernels: every quantized format (int8, fp8 e4m3 through f16 and exact, int4, int4 with
 *    zero points, mxfp4) on matrices of random codes (every code value, e4m3 subnormals, -0
 *    and NaN codes included) and scales packed by the library's own moe_quant_pack: odd K, K
 *    not a multiple of 8 (4-bit tails), scale groups of 32, 128, 256 (longer than the
 *    kernel's chunk) and one group of K (some longer than a chunk), N not a multiple of 16,
 *    mb = 1 .. 13 and 53, panel sub-ranges, and activation rows with NaN, +-Inf, values past the
 *    largest bf16, denormals and values near FLT_MIN (the DAZ / FTZ cases), scales up to
 *    2^127 (infinite results);
 *  - the layer through moe.h: a compute-bf16 plan per quantized scheme (int8-channel,
 *    fp8-block, fp8-channel, int4-g128, int4-g128-zp, mxfp4) under MOE_ISA avx512_bf16 and ref:
 *    the same output bits, at 1 and 2 threads, and token t's bits at T = 1 equal to its
 *    row inside T = 37 (batch invariance).
 * Skipped, with a message, on a CPU without avx512_bf16 (no such table to check). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/kernels.h"
#include "moe.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
    return tu_xorshift(&g_rng);
}

/* The avx512_bf16 table, or NULL with a message (this CPU lacks avx512_bf16, or its vdpbf16ps
 * failed the registration probe). */
static const moe_kernels *bf16_table(void)
{
    const moe_kernels *k = tu_table("avx512_bf16");
    if (!k)
        print_message("no avx512_bf16 table on this CPU (avx512_bf16 absent, or vdpbf16ps failed the probe): "
                      "the quantized bf16 kernels are not checked here\n");
    return k;
}

/* ---- kernels ---- */

/* One f32 activation row of n elements: mode 0 uniform in [-2, 2]; 1 tiny (2^-100 .. 2^-140,
 * so bf16 denormals, which DAZ reads as zero, and products below FLT_MIN, which FTZ flushes),
 * with f32 denormals; 2 NaN of either sign (which one a sum keeps is checked too), +-Inf and
 * values past the largest bf16 among normal values; 3 near FLT_MIN (2^-126 .. 2^-122 times
 * 1..2: products with the codes and their sums land on both sides of the flush point). */
static void fill_row(float *x, int64_t n, int mode)
{
    for (int64_t k = 0; k < n; k++) {
        const float u = (float)((int64_t)(rnd() % 4001) - 2000) * 1e-3f;
        float v = u;
        if (mode == 1)
            v = ldexpf(u, -100 - (int)(rnd() % 40)) + (rnd() % 7 == 0 ? tu_f32_of((uint32_t)rnd() & 0x807fffffu) : 0.0f);
        else if (mode == 2 && rnd() % 13 == 0) {
            const unsigned c = (unsigned)(rnd() % 4);
            v = c == 0   ? (rnd() & 1 ? NAN : -NAN)
                : c == 1 ? INFINITY
                : c == 2 ? -INFINITY
                         : (rnd() & 1 ? 3.3e38f : -3.3e38f);
        } else if (mode == 3)
            v = ldexpf(1.0f + fabsf(u) / 2.0f, -126 - (int)(rnd() % 5)) * (u < 0 ? -1.0f : 1.0f);
        x[k] = v;
    }
}

/* A packed quantized matrix [N, K] of random codes and scales 2^(lo .. hi) (random sign; E8M0
 * exponents for mxfp4), zero points 0 .. zero_max when qw has them; NaN codes (e4m3 0x7f / 0xff)
 * only when nan_codes; NaN scales of either sign (E8M0 255) in 1/16 of the cells when
 * nan_scales. Every buffer is allocated at its exact size (ASan sees an overread). */
/* The largest zero point qmatrix_make draws (15, the format's range; larger ones are outside
 * moe_quant.h's contract but the packer takes any u8, and the kernels decode them exactly). */
static unsigned zero_max = 15;

typedef struct qmatrix {
    uint8_t *packed;     /* moe_quant_packed_bytes */
    float *scale, *zero; /* [N * ng] each (zero: NULL without zero points) */
    struct moe_qmat q;
    moe_pmat w;
} qmatrix;

static void qmatrix_make(qmatrix *m, const moe_qweight *qw, int64_t N, int64_t K, int nan_codes, int nan_scales, int lo,
                         int hi)
{
    size_t cb, sb, zb;
    moe_quant_source_sizes(qw, N, K, &cb, &sb, &zb);
    uint8_t *codes = malloc(cb), *zero = zb ? malloc(zb) : NULL;
    unsigned char *scale = malloc(sb);
    for (size_t i = 0; i < cb; i++) {
        codes[i] = (uint8_t)rnd();
        if (qw->dtype == MOE_QTYPE_F8_E4M3 && !nan_codes && (codes[i] & 0x7f) == 0x7f)
            codes[i] ^= 0x01; /* +-448 instead */
    }
    if (nan_codes) /* at least one (random bytes hold about 1 in 128 more) */
        codes[rnd() % cb] = rnd() & 1 ? 0xff : 0x7f;
    for (size_t i = 0; i < zb; i++)
        zero[i] = (uint8_t)(rnd() % (zero_max + 1u));
    if (qw->dtype == MOE_QTYPE_MXFP4) {
        for (size_t i = 0; i < sb; i++)
            scale[i] = (uint8_t)(nan_scales && rnd() % 16 == 0 ? 255 /* NaN */
                                                               : 127 + lo + (int)(rnd() % (unsigned)(hi - lo + 1)));
    } else {
        for (size_t i = 0; i < sb / 4; i++) {
            float s = ldexpf(1.0f + (float)(rnd() & 0xffff) / 65536.0f, lo + (int)(rnd() % (unsigned)(hi - lo + 1)));
            if (rnd() % 5 == 0)
                s = -s;
            if (nan_scales && rnd() % 16 == 0)
                s = rnd() & 1 ? NAN : -NAN;
            memcpy(scale + 4 * i, &s, 4);
        }
    }
    const moe_wfmt kind = moe_quant_kind(qw, MOE_QACT_NONE);
    const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
    m->packed = malloc(moe_quant_packed_bytes(kind, N, K));
    m->scale = malloc(sizeof(float) * (size_t)(N * ng));
    m->zero = zb ? malloc(sizeof(float) * (size_t)(N * ng)) : NULL;
    const int f8h = moe_quant_pack(qw, MOE_QACT_NONE, codes, scale, zero, N, K, m->packed, m->scale, m->zero, NULL);
    m->q = (struct moe_qmat){.kind = kind, .f8h = f8h, .gk = gk, .ng = ng, .scale = m->scale, .zero = m->zero};
    m->w = (moe_pmat){.data = m->packed, .dtype = MOE_DTYPE_U8, .n = N, .k = K, .q = &m->q};
    free(codes), free(zero), free(scale);
}

static void qmatrix_free(qmatrix *m)
{
    free(m->packed), free(m->scale), free(m->zero);
}

static int kernel_calls; /* kernel calls compared */

/* The matrix qw [N, K] against rows of every mode (bits compared with memcmp, NaN payloads
 * included, except with NaN codes or scales: below): for mb = 1 .. 13 the whole panel range and
 * one sub-range (rotating through [1, P), [0, 1), [P-1, P), [1, P-1)), and mb = 53 (the 13 rows
 * repeated: two row blocks of the kernel); returns moe_qmat.f8h. */
static int check_matrix(const moe_kernels *k, const moe_qweight *qw, int64_t N, int64_t K, int nan_codes,
                        int nan_scales, int lo, int hi)
{
    const moe_kernels *ref = tu_table("ref");
    qmatrix m;
    qmatrix_make(&m, qw, N, K, nan_codes, nan_scales, lo, hi);
    const moe_wfmt f = moe_pmat_format(&m.w);
    if (!(k->native_bf16 >> f & 1u))
        fail_msg("table %s has no bf16 kernel of its own for format %s", k->name, moe_format_row(f)->name);
    /* A product of two NaN operands (a NaN activation times a NaN code, a NaN partial sum times
     * a NaN scale) keeps either operand's NaN: in the ref, whichever operand order the
     * compiler gave fmaf (commutative to it), so NaN equals NaN for those matrices. Otherwise
     * only one side of every product can be NaN, and NaN payloads must match too. */
    const int nan_eq = nan_codes || nan_scales;
    enum { MB = 13 };
    const int64_t K2 = (K + 1) / 2, P = moe_pmat_panels(N), ldo = P * MOE_PANEL + 3; /* odd stride */
    float *xf = malloc(sizeof(float) * (size_t)K); /* [K] one f32 row */
    uint8_t *xr[MB];                               /* [MB] bf16 pair rows of 4 K2 bytes each */
    for (int r = 0; r < MB; r++) {
        fill_row(xf, K, (int)((r + rnd()) % 4));
        xr[r] = malloc((size_t)(4 * K2));
        const float mul = 0.75f;
        ref->bf16_row(xf, K, 0, r % 3 == 1 ? &mul : NULL, xr[r], NULL);
    }
    enum { MBX = 53 }; /* the largest call: 48 rows (the kernel's row block) and 5 */
    const uint8_t *xp[MBX]; /* the rows again and again */
    for (int r = 0; r < MBX; r++)
        xp[r] = xr[r % MB];
    const size_t out_n = (size_t)(MBX * ldo);
    float *want = malloc(sizeof(float) * out_n), *got = malloc(sizeof(float) * out_n); /* [MBX][ldo] */
    for (int mb = 1; mb <= MBX; mb = mb == MB ? MBX : mb + 1) {
        int64_t ranges[2][2] = {{0, P}, {0, P}};
        switch (mb % 4) {
        case 0: ranges[1][0] = P > 1 ? 1 : 0; break;
        case 1: ranges[1][1] = 1; break;
        case 2: ranges[1][0] = P - 1; break;
        default:
            if (P > 2)
                ranges[1][0] = 1, ranges[1][1] = P - 1;
            break;
        }
        for (int r = 0; r < (mb == MBX ? 1 : 2); r++) {
            const int64_t p0 = ranges[r][0], p1 = ranges[r][1];
            for (size_t i = 0; i < out_n; i++)
                want[i] = got[i] = -12345.0f; /* sentinel */
            moe_ukr_qbf16_rows_ref(&m.w, p0, p1, xp, NULL, mb, want, ldo, NULL, 0);
            k->bf16_rows[f](&m.w, p0, p1, xp, NULL, mb, got, ldo, NULL, 0);
            if (nan_eq ? !tu_same_bits(got, want, out_n) : memcmp(got, want, sizeof(float) * out_n) != 0) {
                size_t i = 0;
                while (nan_eq ? tu_same_bits(got + i, want + i, 1) : tu_f32_bits(got[i]) == tu_f32_bits(want[i]))
                    i++;
                fail_msg("%s bf16 kernel, format %s N %lld K %lld gk %lld f8h %d mb %d panels [%lld, %lld): "
                         "out[%zu][%zu] = %08x, ref %08x",
                         k->name, moe_format_row(f)->name, (long long)N, (long long)K, (long long)m.q.gk, m.q.f8h,
                         mb, (long long)p0, (long long)p1, i / (size_t)ldo, i % (size_t)ldo, tu_f32_bits(got[i]),
                         tu_f32_bits(want[i]));
            }
            kernel_calls++;
        }
    }
    for (int r = 0; r < MB; r++)
        free(xr[r]);
    free(xf), free(want), free(got);
    const int f8h = m.q.f8h;
    qmatrix_free(&m);
    return f8h;
}

/* N: one narrow panel, one full, 2 full + a narrow one (a block of 3), 5 full (a block of 4
 * and one), 4 full + a narrow one */
static const int64_t Ns[] = {7, 16, 33, 80, 69};

static void test_int8(void **state)
{
    (void)state;
    const moe_kernels *k = bf16_table();
    if (!k)
        skip();
    static const int64_t Ks[] = {1, 2, 37, 129, 300};
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof Ks / sizeof Ks[0]; b++) {
            const int64_t N = Ns[a], K = Ks[b];
            moe_qweight ch = {.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_CHANNEL};
            check_matrix(k, &ch, N, K, 0, 0, -8, 8);
            moe_qweight g32 = {.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_GROUP, .group_size = 32};
            check_matrix(k, &g32, N, K, 0, 0, -20, 20);
            check_matrix(k, &g32, N, K, 0, 1, -4, 4);
            moe_qweight bl = {.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_BLOCK, .block_n = 16, .block_k = 128};
            check_matrix(k, &bl, N, K, 0, 0, 100, 127); /* large scales: infinities */
        }
    print_message("%d kernel calls compared\n", kernel_calls);
}

static void test_fp8(void **state)
{
    (void)state;
    const moe_kernels *k = bf16_table();
    if (!k)
        skip();
    static const int64_t Ks[] = {1, 2, 37, 129, 300};
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof Ks / sizeof Ks[0]; b++) {
            const int64_t N = Ns[a], K = Ks[b];
            /* decoded through f16 (codes e4m3 * 2^-8, scales s * 256): blocks of 128 and of 32 k,
             * scales down to 2^-140 (f32 subnormal) and up to 2^119 */
            moe_qweight bl = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_BLOCK, .block_n = 16, .block_k = 128};
            assert_int_equal(check_matrix(k, &bl, N, K, 0, 0, -30, 30), 1);
            bl.block_n = 7, bl.block_k = 32;
            assert_int_equal(check_matrix(k, &bl, N, K, 0, 0, -140, 119), 1);
            assert_int_equal(check_matrix(k, &bl, N, K, 0, 1, -4, 4), 1);
            /* s * 256 overflows: the exact e4m3 decode, results up to infinity */
            assert_int_equal(check_matrix(k, &bl, N, K, 0, 0, 120, 127), 0);
            /* NaN codes 0x7f / 0xff: the exact decode's NaN */
            moe_qweight ch = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_CHANNEL};
            assert_int_equal(check_matrix(k, &ch, N, K, 1, 0, -4, 4), 0);
            assert_int_equal(check_matrix(k, &ch, N, K, 0, 0, -4, 4), 1);
            moe_qweight te = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_TENSOR};
            assert_int_equal(check_matrix(k, &te, N, K, 1, 0, 0, 0), 0);
        }
    print_message("%d kernel calls compared\n", kernel_calls);
}

/* 4-bit K (even): K % 8 = 0, 4, 2, 6 (tail rows), one chunk and several; 600 with groups of 256
 * (groups longer than a chunk, ng > 1) */
static const int64_t K4s[] = {8, 36, 66, 102, 128, 300, 600};

static void test_int4(void **state)
{
    (void)state;
    const moe_kernels *k = bf16_table();
    if (!k)
        skip();
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof K4s / sizeof K4s[0]; b++) {
            const int64_t N = Ns[a], K = K4s[b];
            moe_qweight g = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
            check_matrix(k, &g, N, K, 0, 0, -12, 12);
            g.group_size = 128;
            check_matrix(k, &g, N, K, 0, 0, 100, 127); /* large scales: infinities */
            g.group_size = 256;
            check_matrix(k, &g, N, K, 0, 1, -12, 12);
            /* groups of 6 (a TP slice's granularity): groups that start inside a body word */
            g.group_size = 6;
            check_matrix(k, &g, N, K, 0, 0, -12, 12);
            moe_qweight ch = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_CHANNEL}; /* one group of K */
            check_matrix(k, &ch, N, K, 0, 0, -3, 3);
        }
    print_message("%d kernel calls compared\n", kernel_calls);
}

static void test_int4_zero_points(void **state)
{
    (void)state;
    const moe_kernels *k = bf16_table();
    if (!k)
        skip();
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof K4s / sizeof K4s[0]; b++) {
            const int64_t N = Ns[a], K = K4s[b];
            moe_qweight g = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 32, .has_zero_point = 1};
            check_matrix(k, &g, N, K, 0, 0, -12, 12);
            g.group_size = 128;
            check_matrix(k, &g, N, K, 0, 0, 100, 127);
            check_matrix(k, &g, N, K, 0, 1, -4, 4);
            g.group_size = 256;
            check_matrix(k, &g, N, K, 0, 0, -12, 12);
            g.group_size = 10;
            check_matrix(k, &g, N, K, 0, 0, -12, 12);
            /* zero points up to 255: the kernels' f32 decode of code - z (0 .. 15: a table) */
            zero_max = 255;
            g.group_size = 32;
            check_matrix(k, &g, N, K, 0, 0, -12, 12);
            zero_max = 15;
        }
    print_message("%d kernel calls compared\n", kernel_calls);
}

static void test_mxfp4(void **state)
{
    (void)state;
    const moe_kernels *k = bf16_table();
    if (!k)
        skip();
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof K4s / sizeof K4s[0]; b++) {
            const int64_t N = Ns[a], K = K4s[b];
            moe_qweight g = {.dtype = MOE_QTYPE_MXFP4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
            check_matrix(k, &g, N, K, 0, 0, -20, 20);
            check_matrix(k, &g, N, K, 0, 0, 100, 127); /* E8M0 up to 2^127 */
            check_matrix(k, &g, N, K, 0, 1, -127, 0);  /* down to 2^-127 (the subnormal f32 scale), 255 NaN */
        }
    print_message("%d kernel calls compared\n", kernel_calls);
}

/* ---- the layer through moe.h ---- */

/* A compute-bf16 layer with routed experts quantized by `scheme` (moe_quantize_matrix of random
 * f32 weights) and an f32 shared expert: H = 134 and I = 90 (4-bit tails K % 8 = 6 and 2,
 * partial last panels of 6 and 10 features, two scale groups of 128 along H). */
typedef struct qbf16_layer {
    moe_layer_desc d;
    float *router;                 /* [E, H] */
    void *codes[3 * 8];            /* expert e's gate, up, down at 3e .. 3e + 2 */
    void *scales[3 * 8];
    uint8_t *zeros[3 * 8];         /* NULL without zero points */
    float *sg, *su, *sd;           /* shared [Is, H], [Is, H], [H, Is] */
    const void *g[8], *u[8], *dn[8], *gs[8], *us[8], *ds[8];
    const uint8_t *gz[8], *uz[8], *dz[8];
    moe_weight_source src;
} qbf16_layer;

enum { LH = 134, LI = 90, LE = 8, LK = 2, LIS = 20 };

static void layer_make(qbf16_layer *L, const char *scheme, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    moe_layer_desc_init(&L->d);
    L->d.hidden_size = LH;
    L->d.moe_intermediate_size = LI;
    L->d.num_experts = LE;
    L->d.top_k = LK;
    L->d.renormalize = 1;
    L->d.weight_dtype = MOE_DTYPE_F32;
    L->d.shared_expert_intermediate_size = LIS;
    assert_int_equal(moe_quant_from_name(scheme, &L->d.quant), MOE_OK);
    L->router = malloc(sizeof(float) * LE * LH);
    tu_fill_uniform(L->router, LE * LH, seed, -0.3f, 0.3f);
    float *w = malloc(sizeof(float) * LH * LI); /* [N, K] one f32 matrix */
    for (int i = 0; i < 3 * LE; i++) {
        const int down = i % 3 == 2;
        const int64_t N = down ? LH : LI, K = down ? LI : LH;
        const moe_qweight *qw = down ? &L->d.quant.w2 : &L->d.quant.w13;
        const float a = 2.0f / sqrtf((float)K);
        tu_fill_uniform(w, (size_t)(N * K), seed + 7 + (uint64_t)i, -a, a);
        size_t cb, sb, zb;
        assert_int_equal(moe_quantize_matrix_sizes(qw, N, K, &cb, &sb, &zb), MOE_OK);
        L->codes[i] = malloc(cb);
        L->scales[i] = malloc(sb);
        L->zeros[i] = zb ? malloc(zb) : NULL;
        assert_int_equal(moe_quantize_matrix(qw, w, N, K, L->codes[i], L->scales[i], L->zeros[i]), MOE_OK);
    }
    free(w);
    L->sg = malloc(sizeof(float) * LIS * LH);
    L->su = malloc(sizeof(float) * LIS * LH);
    L->sd = malloc(sizeof(float) * LIS * LH);
    tu_fill_uniform(L->sg, LIS * LH, seed + 1, -0.1f, 0.1f);
    tu_fill_uniform(L->su, LIS * LH, seed + 2, -0.1f, 0.1f);
    tu_fill_uniform(L->sd, LIS * LH, seed + 3, -0.1f, 0.1f);
    for (int e = 0; e < LE; e++) {
        L->g[e] = L->codes[3 * e], L->u[e] = L->codes[3 * e + 1], L->dn[e] = L->codes[3 * e + 2];
        L->gs[e] = L->scales[3 * e], L->us[e] = L->scales[3 * e + 1], L->ds[e] = L->scales[3 * e + 2];
        L->gz[e] = L->zeros[3 * e], L->uz[e] = L->zeros[3 * e + 1], L->dz[e] = L->zeros[3 * e + 2];
    }
    L->src = (moe_weight_source){.router = L->router, .router_dtype = MOE_DTYPE_F32, .gate_proj = L->g,
                                 .up_proj = L->u, .down_proj = L->dn, .gate_scale = L->gs, .up_scale = L->us,
                                 .down_scale = L->ds, .shared_gate_proj = L->sg, .shared_up_proj = L->su,
                                 .shared_down_proj = L->sd};
    if (L->zeros[0])
        L->src.gate_zero = L->gz, L->src.up_zero = L->uz, L->src.down_zero = L->dz;
}

static void layer_free(qbf16_layer *L)
{
    for (int i = 0; i < 3 * LE; i++)
        free(L->codes[i]), free(L->scales[i]), free(L->zeros[i]);
    free(L->router), free(L->sg), free(L->su), free(L->sd);
}

/* One compute-bf16 forward under kernel table `isa` with `threads`: x [T, H] -> out [T, H]. */
static void layer_run(const qbf16_layer *L, const char *isa, int threads, const float *x, int64_t T, float *out)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = isa;
    o.num_threads = threads;
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        fail_msg("MOE_ISA %s: %s", isa, err);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.compute = MOE_COMPUTE_BF16;
    tu_run_layer(ctx, &L->d, &cfg, &L->src, x, T, out);
    moe_ctx_free(ctx);
}

static void test_layer_schemes(void **state)
{
    (void)state;
    if (!bf16_table())
        skip();
    static const char *const schemes[] = {"int8-channel", "fp8-block", "fp8-channel", "int4-g128", "int4-g128-zp",
                                          "mxfp4"};
    enum { T = 37 };
    float *x = malloc(sizeof(float) * T * LH); /* [T, H] */
    float *want = malloc(sizeof(float) * T * LH), *got = malloc(sizeof(float) * T * LH), one[LH]; /* [T, H], [H] */
    for (size_t si = 0; si < sizeof schemes / sizeof schemes[0]; si++) {
        qbf16_layer L;
        layer_make(&L, schemes[si], 1000 + si);
        tu_fill_uniform(x, T * LH, 77 + si, -2.0f, 2.0f);
        for (int t = 0; t < T; t++) /* a few tiny and large values among them */
            x[t * LH + (t * 5) % LH] = t % 2 ? 1e-39f : 1e4f;
        layer_run(&L, "ref", 1, x, T, want);
        for (int threads = 1; threads <= 2; threads++) {
            layer_run(&L, "avx512_bf16", threads, x, T, got);
            if (memcmp(got, want, sizeof(float) * T * LH) != 0)
                fail_msg("%s, compute bf16, %d thread(s): avx512_bf16 output differs from the ref table's (max %g)",
                         schemes[si], threads, tu_max_abs_diff(got, want, T * LH));
        }
        /* batch invariance: token t alone gives its bits inside the batch of 37 */
        static const int toks[] = {0, 13, 36};
        for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
            const int t = toks[i];
            layer_run(&L, "avx512_bf16", 2, x + t * LH, 1, one);
            if (memcmp(one, want + t * LH, sizeof one) != 0)
                fail_msg("%s, compute bf16: token %d alone differs from its row at T = %d", schemes[si], t, T);
        }
        print_message("%-13s avx512_bf16 = ref bit for bit (1, 2 threads), T = 1 rows = T = %d rows\n", schemes[si],
                      T);
        layer_free(&L);
    }
    free(x), free(want), free(got);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_int4_zero_points),
        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_layer_schemes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
