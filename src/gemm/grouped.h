/* The grouped-GEMM driver: expert MLPs over rows grouped by expert, threaded with OpenMP.
 * Work items are (group, panel group); each output element is computed by exactly one item
 * with the table's linear kernel, so results do not depend on the thread count or on which
 * thread takes which item. */
#ifndef MOE_GEMM_GROUPED_H
#define MOE_GEMM_GROUPED_H

#include "gemm/kernels.h"

/* Rows per inner block of an item (a multiple of the microkernels' 6-row tiles). */
#define MOE_GEMM_RB 48
/* Panels (of 16 output features) per work item: tiled path and few-token path. */
#define MOE_GEMM_PG 4
#define MOE_GEMM_PG_LOWTOK 8

/* Scratch floats per thread needed by moe_mlp_run / moe_gemm_rows. */
size_t moe_gemm_thread_scratch_floats(void);

/* One expert as the driver reads it: its packed gate [I, H], up [I, H] and down [H, I] (I this
 * rank's shard) and its biases as f32 vectors (all NULL without expert biases; bd also NULL on
 * the TP ranks that do not add it). Built once by the weights (src/layer/weights.c). */
typedef struct moe_expert_mats {
    moe_pmat gate, up, down;
    const float *bg, *bu, *bd; /* [I], [I], [H] */
} moe_expert_mats;

/* A set of row groups through the expert MLPs (desc->activation, expert biases). Row positions index h and y; both activation
 * formats map onto this: the standard format (rows grouped by expert, adjacent ranges from
 * offsets) and the batched format ([E, capacity] slots, group e = [e*cap, e*cap + count[e])). */
typedef struct moe_mlp_groups {
    const moe_expert_mats *experts; /* [n_groups]: group g runs experts[g] */
    const float *x;         /* input rows, each H floats */
    int64_t n_groups;
    const int64_t *begin;   /* [n_groups] first row position of group g */
    const int64_t *end;     /* [n_groups] one past its last row position */
    const int32_t *rows;    /* [positions] row ids: the input of position i is
                               x + (rows[i] / row_div) * H; NULL: x + i * H */
    int64_t row_div;
    float *h;               /* [positions, I] f32 workspace: act(gate, up) */
    float *y;               /* [positions, H] f32 output */
    int64_t lowtok_threshold; /* groups with fewer rows take the few-token path */
    const float *in_scale;  /* NULL, or (apply_router_weight_on_input; needs rows) [row ids]
                               the scale of each row's input: position i runs on
                               in_scale[rows[i]] * x_i, rounded to f32 per element */
    moe_compute compute;    /* the plan's: MOE_COMPUTE_BF16 runs the bf16 entries on rounded rows */
} moe_mlp_groups;

/* What moe_mlp_run did (added to, not reset). */
typedef struct moe_mlp_stats {
    int64_t gemm_groups;   /* groups run on the tiled GEMM path */
    int64_t lowtok_groups; /* groups run on the few-token streaming path */
    int64_t skipped_groups;/* groups with no rows (skipped) */
} moe_mlp_stats;

/* Run every group. scratch: nthreads * moe_gemm_thread_scratch_floats() floats; item_off:
 * [n_groups + 1] int64 workspace; stats may be NULL.
 * Few-token path: a group with fewer than lowtok_threshold rows is split into longer weight
 * streams (MOE_GEMM_PG_LOWTOK panels per item) so each expert's weights are read once, in long
 * sequential runs; the tiled path uses MOE_GEMM_PG panels per item so a tile stays in L2
 * while all of the group's rows pass over it. Both paths compute every element with the same
 * kernel and order, so switching never changes a bit. */
void moe_mlp_run(const moe_ctx *ctx, const moe_layer_desc *desc, const moe_mlp_groups *g, float *scratch,
                 int64_t *item_off, moe_mlp_stats *stats);

/* out[t][n] = sum_k x[t][k] * W[n][k] for t < T (x [T, W.k] with row stride ldx, out [T, W.n]
 * with row stride ldo), threaded over (row block, panel group). */
void moe_gemm_rows(const moe_ctx *ctx, const moe_pmat *W, const float *x, int64_t ldx, int64_t T, float *out,
                   int64_t ldo, float *scratch);

#endif
