/* The kernel tables and the ISA registry (BLIS-style): one table of ISA rows {name, detect,
 * init} in src/gemm/registry.c; each row's init starts from the reference entries (filled by
 * the registry first) and overrides only what its ISA implements; sub-ISA features (VNNI,
 * avx512_bf16, AMX, f16c) are capability flags of a row, read from core/cpu.h's features, never
 * tests on table addresses. Entries are indexed by the weight format (quant/layout.h moe_wfmt).
 * The reduction order and rounding are fixed by the contracts below, so every table gives
 * the same bits (docs/numerics.md section 2). docs/adding-an-isa.md is the checklist of a new
 * row; src/gemm/template/ the folder a port copies.
 *
 * Kernel names carry dtype, ISA and tile (DESIGN.md section 3): moe_ukr_<format>_<isa>_<rows>x<features>,
 * e.g. moe_ukr_bf16_avx512_6x64 (6 rows by 4 panels of 16 features); scalar twins end in _ref. */
#ifndef MOE_GEMM_KERNELS_H
#define MOE_GEMM_KERNELS_H

#include "core/cpu.h"
#include "quant/layout.h"

/* Linear microkernel over a range of panels:
 *
 *   for m in [0, mb), for n in [16 * p0, min(N, 16 * p1)):
 *       acc = +0.0f; for k = 0, 1, ..., K-1: acc = fmaf(x[m][k], W[n][k], acc)
 *       out[m][n - 16 * p0] = acc
 *
 * strictly in increasing k, one fused multiply-add (a single rounding) per term, exactly as
 * C's fmaf (plain formats). x rows are given as mb pointers to K floats; out rows start at
 * out + m * ldo. W's elements are converted to f32 exactly before the multiply. mb >= 1; any
 * mb is allowed (implementations block it internally). Weight-only quantized formats: each
 * scale group's dot product on the codes' exact values, then times the scale (docs/numerics.md
 * section 5, src/gemm/linear_q_ref.c the definition); the quantized-activation formats (W8A8,
 * F8A8): the activations quantized on the fly per row with the rule of quant_row below, then
 * the integer / fp8 contract of linear_rows (the same bits as quant_row + linear_rows). */
typedef void (*moe_linear_fn)(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                              float *out, int64_t ldo);

/* One row of the gate/up epilogue: h[j] = act(g[j] (+ bg[j]), u[j] (+ bu[j])) for j in
 * [0, n), with exactly the operations of core/act.h (moe_act_row_scalar); bg and bu are both
 * NULL or both set. Non-gated activations (moe.h moe_activation_gated 0): g and bg are NULL and
 * h[j] = act(u[j] (+ bu[j])), bu NULL or set. */
typedef void (*moe_act_row_fn)(const moe_layer_desc *d, const float *g, const float *u, const float *bg,
                               const float *bu, float *h, int64_t n);

/* Dynamic quantization of one activation row of n >= 1 elements for a quantized-activation
 * format, v[k] = x[k] (mul NULL) or *mul * x[k] rounded to f32 (moe_quant.h "Dynamic activation
 * quantization"):
 *  - MOE_WF_W8A8 (G ignored, one scale): a = max_k |v[k]| (NaN ignored), s = a / 127 (1 when
 *    a == 0), q[k] = rint(clamp(v[k] / s, -127, 127)) (NaN quotient -127). Writes u8 q[k] + 128
 *    to dst[0 .. n), 128 to dst[n .. n4) (n4 = ceil(n / 4) * 4), and s to scales[0].
 *  - MOE_WF_F8A8 (groups of G channels, the last one partial): a = max |v| over the group (NaN
 *    ignored), scales[g] = max(a, 1e-10f) / 448; q[k] = e4m3(v[k] / scales[g]) (nearest even,
 *    saturating to +-448; NaN gives the NaN code 0x7f / 0xff). Writes every scale first, then
 *    the codes to dst[0 .. n).
 * dst may be the same address as x (in place: byte k is written only after x[0 .. k] were
 * read); scales must not overlap x. */
typedef void (*moe_quant_row_fn)(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst,
                                 float *scales);

/* The GEMM on rows already quantized by the format's quant_row; xs[m] points at row m's
 * scales (one for W8A8, w->q->ng for F8A8); pf, pf_bytes: a region the caller reads next (the
 * next weights), which the kernel may prefetch into L2 while it computes (NULL, 0: none; never
 * read as data, no effect on the result):
 *  - MOE_WF_W8A8:
 *       for m in [0, mb), for n in [16 * p0, min(N, 16 * p1)):
 *           acc = sum_{k < K} (xq[m][k] - 128) * w[n][k]      (exact int32)
 *           out[m][n - 16 * p0] = ((float)acc * xs[m][0]) * s_w[n]
 *    xq rows: K4 bytes each, u8 = q + 128, bytes K .. K4-1 equal to 128.
 *  - MOE_WF_F8A8 (G = w->q->gk, ng = w->q->ng groups of k; dec() the exact e4m3 value):
 *       for m in [0, mb), for n in [16 * p0, min(N, 16 * p1)):
 *           y = +0.0f
 *           for g = 0 .. ng-1:
 *               part = +0.0f; for k in [gG, min(K, (g+1)G)): part = fmaf(dec(xq[m][k]), dec(w[n][k]), part)
 *               y = y + (part * xs[m][g]) * s_w[n][g]          (three f32 roundings)
 *           out[m][n - 16 * p0] = y
 *    xq rows: K e4m3 codes.
 * The same bits as linear on the f32 rows they were quantized from. */
typedef void (*moe_linear_rows_fn)(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                   const float *const *xs, int mb, float *out, int64_t ldo, const void *pf,
                                   int64_t pf_bytes);

/* Compute bf16 (moe.h MOE_COMPUTE_BF16; core/bf16.h the arithmetic, docs/numerics.md section
 * 7). Activation rows are bf16 pairs: row of n elements = ceil(n / 2) little-endian u32, pair i
 * = bf16(v[2i]) | bf16(v[2i+1]) << 16 (v[n] = +0 for odd n), read through uint8_t pointers
 * like the quantized rows (4 * ceil(n / 2) bytes).
 *
 * bf16_row (a moe_quant_row_fn; G and scales unused): v[k] = x[k] (mul NULL) or *mul * x[k]
 * rounded to f32, then moe_bf16_round; writes the row's pairs to dst. In place allowed (dst ==
 * x: pair i is written after x[0 .. 2i+1] were read).
 *
 * bf16_rows[f] (a moe_linear_rows_fn; xs and the prefetch hint may be ignored): with dp =
 * moe_bf16_dp and pairs (2i, 2i+1) taken odd element first (vdpbf16ps's order):
 *  - MOE_WF_BF16P: for m in [0, mb), n in [16 p0, min(N, 16 p1)):
 *        acc = +0.0f; for i in 0 .. ceil(K/2)-1:
 *            acc = dp(acc, x[m][2i+1], w[n][2i+1]); acc = dp(acc, x[m][2i], w[n][2i])
 *        out[m][n - 16 p0] = acc                  (w[n][K] = x[m][K] = +0 for odd K)
 *  - weight-only quantized formats (I8, F8, I4, I4ZP, FP4; scale groups of even length, or one
 *    group of K): per group g the same pair chain from part = +0 over the group's pairs on v
 *    = the code's value (moe_qmat_code; zero points: v = code - z, exact), then
 *    y = fmaf(part, s[g], y) from y = +0 in increasing g (IEEE: no flush).
 * NULL for the quantized-activation formats (compute bf16 refuses them). */

/* Capability flags of a table (the sub-ISA features its init found and uses). */
enum {
    MOE_CAP_FMA = 1u << 0,         /* vfmadd (AVX2+FMA) */
    MOE_CAP_F16C = 1u << 1,        /* vcvtph2ps */
    MOE_CAP_AVX512 = 1u << 2,      /* zmm F/BW/VL/DQ */
    MOE_CAP_VNNI = 1u << 3,        /* AVX512-VNNI vpdpbusd */
    MOE_CAP_AVX512_BF16 = 1u << 4, /* vdpbf16ps */
};

/* A kernel table: what one ISA row computes with. Built once per row by the registry. */
typedef struct moe_kernels {
    const char *name; /* the row's name ("ref", "avx2", "avx512"): MOE_ISA's value */
    unsigned caps;    /* MOE_CAP_* */
    /* f32 activation rows times weights of each format (every entry set: the ref's unless the
     * row overrides it). */
    moe_linear_fn linear[MOE_WF__COUNT];
    moe_act_row_fn act_row;
    /* Quantized-activation formats (W8A8, F8A8): the row quantizer and the GEMM on quantized
     * rows; the grouped driver quantizes each GEMM input row once and runs linear_rows on the
     * codes. NULL for the other formats (and for a table that leaves them out: the driver then
     * runs linear on f32 rows, which gives the same bits). */
    moe_quant_row_fn quant_row[MOE_WF__COUNT];
    moe_linear_rows_fn linear_rows[MOE_WF__COUNT];
    /* Compute bf16 (above): the row rounder and the GEMM on bf16 rows per weight format. */
    moe_quant_row_fn bf16_row;
    moe_linear_rows_fn bf16_rows[MOE_WF__COUNT];
    /* Costs the plan reports (moe_plan_report): `native` has bit f when this row's own kernels
     * compute format f (clear: the ref's scalar entries run it); `native_bf16` the same for
     * compute bf16 (bf16_rows); `tail_ref` has bit f when a partial last panel (fewer than 16
     * features) of format f runs the ref kernel (compute f32; the bf16 kernels mask). `bf16_dp`
     * has bit f when bf16_rows[f] runs vdpbf16ps (its compute roof is peak_bf16's, not
     * peak_fma's: moe_rank_report.compute_roof); a row sets it beside the entry in its own
     * table, and a merge that replaces the entry takes the bit from the same table. */
    unsigned native, native_bf16, tail_ref, bf16_dp;
    /* Roofline loops of this ISA (src/gemm/roofline.c; each runs on the calling thread): read
     * `bytes` (64-byte aligned, a multiple of 512) and return a value to keep; `iters` x
     * MOE_ROOFLINE_CHAINS dependent vfmadd231ps in as many chains (fma_lanes lanes each);
     * the same with vpdpbusd (64 u8 x s8 products each). NULL where the row has none. */
    uint64_t (*peak_read)(const void *buf, size_t bytes);
    float (*peak_fma)(int64_t iters);
    int32_t (*peak_vnni)(int64_t iters);
    /* `iters` x MOE_ROOFLINE_CHAINS dependent vdpbf16ps (32 bf16 products each); NULL without
     * avx512_bf16 */
    float (*peak_bf16)(int64_t iters);
    int fma_lanes;
    /* What the row's init chose on this CPU and why, for moe_isa_describe and `moe version`
     * ("" when it made no choice), e.g. which form of compute bf16's pair GEMM it runs. */
    char notes[160];
} moe_kernels;

/* Independent FMA chains per thread in the roofline loops. */
#define MOE_ROOFLINE_CHAINS 12

/* One ISA row of the registry. */
typedef struct moe_isa_row {
    const char *name;     /* MOE_ISA value, the table's name */
    const char *requires; /* what detect needs, for messages ("AVX2+FMA+F16C") */
    /* 1 when this CPU and OS can run the row (from the features only; compiled without ISA
     * flags, so it runs anywhere). */
    int (*detect)(const moe_cpu_features *f);
    /* Fill k's entries this ISA implements (k holds the reference entries), its caps and
     * masks. Called only when detect passed. */
    void (*init)(moe_kernels *k, const moe_cpu_features *f);
} moe_isa_row;

/* Rows of the registry at most (tables indexed by row are sized by it; registry.c asserts). */
#define MOE_ISA_MAX_ROWS 32

/* The registry, in order of preference (the last runnable row is "auto"'s choice). */
size_t moe_isa_rows(void);
const moe_isa_row *moe_isa_row_at(size_t i);
/* The kernel table of row i, built on first use (thread-safe); NULL when the row cannot run
 * here or i is out of range. */
const moe_kernels *moe_isa_kernels(size_t i);
/* The row index of `name`, or -1. */
int moe_isa_find(const char *name);
/* The row "auto" picks: the last runnable row. */
size_t moe_isa_best(void);

/* The reference entries (src/gemm/linear_ref.c, linear_q_ref.c): every table starts here. */
void moe_kernels_init_ref(moe_kernels *k);
/* A row's init declares what its ISA implements as a table of its own (designated
 * initializers, NULL for the rest) and merges it here: every non-NULL entry of `own` (kernels
 * and roofline loops) replaces k's, k->native gets the bit of every format whose linear or
 * linear_rows entry own sets, k->native_bf16 of every bf16_rows entry, and own's caps and
 * tail_ref are added to k's. Merges accumulate, so a row may extend another's table (its init
 * first calling that row's init). */
void moe_kernels_merge(moe_kernels *k, const moe_kernels *own);
/* Each ISA folder's init (the registry's rows). */
void moe_kernels_init_avx2(moe_kernels *k, const moe_cpu_features *f);
void moe_kernels_init_avx512(moe_kernels *k, const moe_cpu_features *f);
void moe_kernels_init_avx512_bf16(moe_kernels *k, const moe_cpu_features *f);

/* Scalar entries the vector tables call for cases they hand back (a partial panel, a format
 * without a vector kernel). */
void moe_ukr_plain_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                       int64_t ldo);
void moe_ukr_q_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                   int64_t ldo);
/* The f32-row entries of the quantized-activation formats (linear_q_ref.c: quantize the row,
 * then the _rows contract). */
void moe_ukr_w8a8_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                      int64_t ldo);
void moe_ukr_f8a8_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                      int64_t ldo);
void moe_act_row_ref(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                     float *h, int64_t n);
void moe_quant_row_i8_ref(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales);
void moe_quant_row_f8_ref(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales);
void moe_ukr_w8a8_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                           const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes);
void moe_ukr_f8a8_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                           const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes);
/* compute bf16, scalar (linear_bf16_ref.c): the row rounder, the pair panels, the weight-only
 * quantized formats */
void moe_bf16_row_ref(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales);
void moe_ukr_bf16p_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes);
void moe_ukr_qbf16_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes);

/* out = W x through table k for the matrix's format. */
static inline void moe_linear(const moe_kernels *k, const moe_pmat *w, int64_t p0, int64_t p1,
                              const float *const *x, int mb, float *out, int64_t ldo)
{
    k->linear[moe_pmat_format(w)](w, p0, p1, x, mb, out, ldo);
}

#endif
