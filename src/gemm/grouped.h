/* The grouped-GEMM driver: expert MLPs over rows grouped by expert, threaded with OpenMP.
 * Work items are (group, panel group); each output element is computed by exactly one item
 * with the table's linear kernel, so results do not depend on the thread count or on which
 * thread takes which item. */
#ifndef MOE_GEMM_GROUPED_H
#define MOE_GEMM_GROUPED_H

#include "core/kernels.h"

/* Rows per inner block of an item (a multiple of the microkernels' 6-row tiles). */
#define MOE_GEMM_RB 48
/* Panels (of 16 output features) per work item. */
#define MOE_GEMM_PG 4

/* Scratch floats per thread needed by moe_mlp_run / moe_linear_rows. */
size_t moe_gemm_thread_scratch_floats(void);

/* A set of row groups through SwiGLU MLPs.
 *   groups: n_groups; group g covers sorted rows [offsets[g], offsets[g+1]) and uses expert
 *           g's weights (or, with shared != 0, the single shared expert; n_groups = 1).
 *   rows:   [n_rows] row ids; the input of sorted row i is x + (rows[i] / row_div) * H.
 *           NULL: the input of row i is x + i * H.
 *   h:      [n_rows, I] f32 workspace (silu(gate) * up), I = the groups' intermediate size
 *   y:      [n_rows, H] f32 output, in sorted-row order
 *   scratch: nthreads * moe_gemm_thread_scratch_floats() floats
 *   item_off: [n_groups + 1] int64 workspace */
void moe_mlp_run(const moe_ctx *ctx, const moe_weights *w, int shared, const float *x,
                 int64_t n_groups, const int64_t *offsets, const int32_t *rows, int64_t row_div,
                 float *h, float *y, float *scratch, int64_t *item_off);

/* out[t][n] = sum_k x[t][k] * W[n][k] for t < T (x [T, W.k] with row stride ldx, out [T, W.n]
 * with row stride ldo), threaded over (row block, panel group). */
void moe_linear_rows(const moe_ctx *ctx, const moe_pmat *W, const float *x, int64_t ldx,
                     int64_t T, float *out, int64_t ldo, float *scratch);

#endif
