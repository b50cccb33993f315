/* The packed weight layout, the per-ISA kernel table, and the plan and weights objects. */
#ifndef MOE_CORE_KERNELS_H
#define MOE_CORE_KERNELS_H

#include "core/internal.h"

/* Output features per panel of a packed matrix. */
#define MOE_PANEL 16

/* A linear layer's weight W [N, K] (N output features, K input features, nn.Linear layout)
 * packed into panels of MOE_PANEL output features, K-contiguous:
 *
 *   panel p (p = 0 .. ceil(N/16)-1) covers features n = 16p .. 16p + nw - 1, where
 *   nw = min(16, N - 16p), and is stored [K][nw] at element offset p * 16 * K.
 *
 * The last panel is stored at its true width (no padding). Element (n, k) lives at
 *   (n / 16) * 16 * K + k * nw(n / 16) + n % 16.
 * The packed matrix holds exactly N * K elements in the weight dtype. */
typedef struct moe_pmat {
    const void *data; /* N * K elements of dtype */
    moe_dtype dtype;  /* F32, BF16 or F16 (ignored when q is set) */
    int64_t n, k;
    const struct moe_qmat *q; /* NULL, or quantized codes at data (quant/quant.h): the
                                 table's linear_q entry runs it */
} moe_pmat;

static inline int64_t moe_pmat_panels(int64_t n)
{
    return (n + MOE_PANEL - 1) / MOE_PANEL;
}

/* Width of panel p of a matrix with n rows. */
static inline int moe_pmat_panel_width(int64_t n, int64_t p)
{
    int64_t w = n - p * MOE_PANEL;
    return (int)(w < MOE_PANEL ? w : MOE_PANEL);
}

/* Element offset of (row, col) in the packed layout. */
static inline int64_t moe_pmat_offset(int64_t n, int64_t k, int64_t row, int64_t col)
{
    int64_t p = row / MOE_PANEL;
    return p * MOE_PANEL * k + col * moe_pmat_panel_width(n, p) + row % MOE_PANEL;
}

/* Pack W [n, k] (row-major, `src_dtype` elements) into the panel layout at dst (same dtype;
 * n * k elements). */
void moe_pack_panels(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k);
/* The same for a row-major W [n, k] whose rows are ld >= k elements apart (a column slice:
 * the TP shard of a down projection). */
void moe_pack_panels_ld(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k, int64_t ld);

/* Convert a small [n, k] matrix (dtype dt, row-major, any alignment) to f32 and pack it into
 * panels; returns a moe_alloc_aligned buffer of n * k floats, or NULL when out of memory. */
void *moe_pack_f32(const void *src, moe_dtype dt, int64_t n, int64_t k);

/* Convert `count` elements of dtype at src to f32. */
void moe_convert_to_f32(float *dst, const void *src, moe_dtype dtype, size_t count);

/* ------------------------------------------------------------------------------------------
 * The kernel table. Every ISA fills the same entries; the reduction order and rounding are
 * fixed by the contract below, so all tables give the same bits.
 * ---------------------------------------------------------------------------------------- */

/* Linear microkernel over a range of panels:
 *
 *   for m in [0, mb), for n in [16 * p0, min(N, 16 * p1)):
 *       acc = +0.0f; for k = 0, 1, ..., K-1: acc = fmaf(x[m][k], W[n][k], acc)
 *       out[m][n - 16 * p0] = acc
 *
 * strictly in increasing k, one fused multiply-add (a single rounding) per term, exactly as
 * C's fmaf. x rows are given as mb pointers to K floats; out rows start at
 * out + m * ldo. W's elements are converted to f32 exactly before the multiply. mb >= 1; any
 * mb is allowed (implementations block it internally). */
typedef void (*moe_linear_fn)(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x,
                              int mb, float *out, int64_t ldo);

/* One row of the gate/up epilogue: h[j] = act(g[j] (+ bg[j]), u[j] (+ bu[j])) for j in
 * [0, n), with exactly the operations of core/act.h (moe_act_row_scalar); bg and bu are both
 * NULL or both set. */
typedef void (*moe_act_row_fn)(const moe_layer_desc *d, const float *g, const float *u, const float *bg,
                               const float *bu, float *h, int64_t n);

/* W8A8 int8 GEMM on rows already quantized by moe_quant_row_i8_fn (w->q->kind ==
 * MOE_QK_W8A8, docs/numerics.md section 5); pf, pf_bytes: a region the caller reads next
 * (the next weights), which the kernel may prefetch into L2 while it computes (NULL, 0: none;
 * never read as data, no effect on the result):
 *
 *   for m in [0, mb), for n in [16 * p0, min(N, 16 * p1)):
 *       acc = sum_{k < K} (xq[m][k] - 128) * w[n][k]      (exact int32)
 *       out[m][n - 16 * p0] = ((float)acc * sx[m]) * s_w[n]
 *
 * xq rows: K4 = ceil(K / 4) * 4 bytes each, u8 = q + 128, bytes K .. K4-1 equal to 128;
 * sx[m] the row's scale. The same bits as linear_q on the f32 rows they were quantized from. */
typedef void (*moe_linear_w8a8_fn)(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                   const float *sx, int mb, float *out, int64_t ldo, const void *pf,
                                   int64_t pf_bytes);

/* Dynamic int8 quantization of one row of n >= 1 elements (the rule of moe.h "Dynamic
 * activation quantization"): v[k] = x[k] (mul NULL) or *mul * x[k] rounded to f32;
 * a = max_k |v[k]| (NaN ignored), s = a / 127 (1 when a == 0), q[k] = rint(clamp(v[k] / s,
 * -127, 127)) (NaN quotient -127). Writes u8 q[k] + 128 to dst[0 .. n), 128 to dst[n .. n4)
 * (n4 = ceil(n / 4) * 4) and returns s. dst may be the same address as x (in place: byte k
 * is written only after x[0 .. k] were read). */
typedef float (*moe_quant_row_i8_fn)(const float *x, int64_t n, const float *mul, uint8_t *dst);

/* fp8 w8a8 block GEMM on rows already quantized by moe_quant_row_f8_fn (w->q->kind ==
 * MOE_QK_F8A8, docs/numerics.md section 5). G = w->q->gk (= act_group_size = block_k),
 * ng = w->q->ng groups of k; dec() the exact e4m3 value:
 *
 *   for m in [0, mb), for n in [16 * p0, min(N, 16 * p1)):
 *       y = +0.0f
 *       for g = 0 .. ng-1:
 *           part = +0.0f; for k in [gG, min(K, (g+1)G)): part = fmaf(dec(xq[m][k]), dec(w[n][k]), part)
 *           y = y + (part * sa[m][g]) * s_w[n][g]          (three f32 roundings)
 *       out[m][n - 16 * p0] = y
 *
 * xq rows: K e4m3 codes; sa[m]: the row's [ng] f32 group scales. The same bits as linear_q
 * on the f32 rows they were quantized from. */
typedef void (*moe_linear_f8a8_fn)(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                                   const float *const *sa, int mb, float *out, int64_t ldo);

/* Dynamic fp8 quantization of one row of n >= 1 elements per group of G channels (moe.h
 * "Dynamic activation quantization", TOKEN_GROUP): v[k] = x[k] (mul NULL) or *mul * x[k]
 * rounded to f32; per group g (the last one partial): a = max |v| over the group (NaN
 * ignored), sa[g] = max(a, 1e-10f) / 448; q[k] = e4m3(v[k] / sa[g]) (nearest even,
 * saturating to +-448; NaN gives the NaN code 0x7f / 0xff). Writes sa[0 .. ceil(n/G)) first
 * (sa must not overlap x), then the codes to dst[0 .. n); dst may be the same address as x
 * (byte k is written only after x[0 .. k] were read). */
typedef void (*moe_quant_row_f8_fn)(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst,
                                    float *sa);

typedef struct moe_kernels {
    const char *name; /* "ref", "avx2", "avx512" */
    moe_linear_fn linear;
    /* Quantized weights (w->q set, quant/quant.h): weight-only, each scale group's dot
     * product on the codes' exact values, then times the scale; or the w8a8 integer contract
     * (docs/numerics.md section 5).
     * `linear` hands matrices with w->q to it. */
    moe_linear_fn linear_q;
    moe_act_row_fn act_row;
    /* W8A8: the grouped driver quantizes each GEMM input row once (quant_row_i8) and runs
     * linear_w8a8 on the codes; linear_q on f32 rows gives the same bits. */
    moe_linear_w8a8_fn linear_w8a8;
    moe_quant_row_i8_fn quant_row_i8;
    /* fp8 w8a8 block (MOE_QK_F8A8): the same scheme with per-token-group e4m3 codes. */
    moe_linear_f8a8_fn linear_f8a8;
    moe_quant_row_f8_fn quant_row_f8;
} moe_kernels;

void moe_act_row_ref(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                     float *h, int64_t n);
void moe_act_row_avx2(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                      float *h, int64_t n);
void moe_act_row_avx512(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                        float *h, int64_t n);

extern const moe_kernels moe_kernels_ref;
extern const moe_kernels moe_kernels_avx2;
extern const moe_kernels moe_kernels_avx512;

/* Which ISAs this CPU and OS support (CPUID and XCR0). */
int moe_cpu_has_avx2(void);
int moe_cpu_has_avx512(void);

/* ------------------------------------------------------------------------------------------
 * Plan and weights.
 * ---------------------------------------------------------------------------------------- */
/* This rank's share of a layer (src/parallel/parallel.h computes it): one process holds
 * everything (e0 = 0, n_experts = E, i0 = is0 = 0, I = desc I, Is = desc I_s). */
typedef struct moe_shard {
    int64_t e0, n_experts;   /* local experts: global ids [e0, e0 + n_experts) */
    int64_t i0, I;           /* columns [i0, i0 + I) of each expert's intermediate dim */
    int64_t is0, Is;         /* columns [is0, is0 + Is) of the shared expert's (Is = 0: none) */
    int down_bias;           /* 1: this rank adds b_d (tp_rank 0) */
} moe_shard;

struct moe_plan {
    moe_ctx *ctx;
    moe_layer_desc desc;                     /* the whole layer, as the caller described it */
    int64_t chunk_size;                      /* tokens per chunk */
    int64_t capacity;                        /* batched format: slots per expert (0 otherwise) */
    const struct moe_pf_impl *pf;            /* prepare/finalize (core/modular.h) */
    const struct moe_experts_impl *experts;  /* experts */
    moe_parallel_config par;                 /* resolved (ranks filled in, comm NULL) */
    int parallel;                            /* ep_size * tp_size > 1 */
    moe_shard shard;                         /* this rank's share */
    struct moe_par *mpi;                     /* MPI state (src/parallel), NULL for one process */
    char text[2048];                         /* canonical text: knobs + description */
    uint64_t hash;                           /* XXH64 of text */
};

struct moe_weights {
    const moe_plan *plan;
    moe_shard shard;     /* the share packed: local experts, I and I_s shards */
    moe_dtype dtype;     /* expert weight dtype */
    moe_pmat router;     /* [E, H] f32, packed */
    void *w13;           /* n_experts local experts, each: gate [I, H] and up [I, H] (I, Is:
                            the shard's), see moe_weights_expert() */
    void *w2;            /* n_experts local experts, each [H, I] packed */
    void *shared_w13;    /* gate [Is, H] then up [Is, H], packed; NULL without shared expert */
    void *shared_w2;     /* [H, Is] packed */
    moe_pmat shared_gate; /* [1, H] f32, packed; data NULL unless gated */
    void *router_buf;    /* owns router.data */
    void *shared_gate_buf;
    size_t expert_bytes;
    float *router_bias;  /* [E] f32 b_r, or NULL (desc has_router_bias) */
    float *sel_bias;     /* [E] f32 b_s, or NULL (desc has_selection_bias) */
    float *expert_bias;  /* n_experts x {b_g [I], b_u [I], b_d [H]} f32, or NULL (has_expert_bias) */
    struct moe_qweights *q; /* quantized routed experts (desc quant), or NULL: then w13 / w2
                               are unused and moe_weights_expert reads these */
};

/* Biases of local expert e (e >= 0) as f32 vectors, or all NULL without expert biases (and
 * for the shared expert, e = -1); down_bias NULL on the TP ranks that do not add it. */
void moe_weights_expert_bias(const moe_weights *w, int64_t e, const float **gate_bias,
                             const float **up_bias, const float **down_bias);

/* Packed gate [I, H], up [I, H] and down [H, I] of local expert e (e = -1: the shared
 * expert); I is the shard's. */
void moe_weights_expert(const moe_weights *w, int64_t e, moe_pmat *gate, moe_pmat *up,
                        moe_pmat *down);

#endif
