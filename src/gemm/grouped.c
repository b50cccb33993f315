/* Grouped-GEMM driver (see grouped.h). */
#include "gemm/grouped.h"
#include "core/act.h"
#include "quant/quant.h"

#include <math.h>
#include <omp.h>

/* Per-thread scratch layout (floats):
 *   gate tile [RB][PG_MAX*16], up tile [RB][PG_MAX*16], row pointers [RB] (stored as pointers),
 *   then for W8A8 row scales [RB] f32, then for fp8 w8a8 row-scale pointers [RB]. */
#define PG_MAX (MOE_GEMM_PG > MOE_GEMM_PG_LOWTOK ? MOE_GEMM_PG : MOE_GEMM_PG_LOWTOK)
#define TILE_FLOATS (MOE_GEMM_RB * PG_MAX * MOE_PANEL)
#define PTR_FLOATS ((MOE_GEMM_RB * sizeof(void *) + sizeof(float) - 1) / sizeof(float))

size_t moe_gemm_thread_scratch_floats(void)
{
    /* rounded to 16 floats so every thread's slice stays 64-byte aligned */
    size_t n = 2 * TILE_FLOATS + 2 * PTR_FLOATS + MOE_GEMM_RB;
    return (n + 15) & ~(size_t)15;
}

/* W8A8 (int8 weights, TOKEN activations): every GEMM input row is quantized once, not once
 * per work item (moe.h "Dynamic activation quantization": per row of the GEMM input), and the
 * kernels run on the codes (kernels.h moe_linear_w8a8_fn). The codes live in the buffers the
 * f32 path already has, so this costs no memory:
 *   x codes: in y (free until phase 2): [S][H4] u8 at byte 0, then [S] f32 scales at byte
 *            S * H4 (H4 = ceil(H / 4) * 4), S the number of source rows: the tokens (each
 *            token row feeds top_k experts: quantized once) or, with in_scale or without row
 *            ids, the positions. Needs S * (H4 + 4) <= positions * H * 4 bytes.
 *   h codes: in place in h after phase 1: row i's [I4] u8 at its start, its f32 scale at
 *            byte I4 of the row (needs I4 + 4 <= 4 I, i.e. I >= 2).
 * Same bits as linear_q on the f32 rows (the quantization of a row does not depend on who
 * does it). */
typedef struct w8a8_rows {
    const uint8_t *x8; /* [S][H4] u8 codes of the w13 input rows */
    const float *xs;   /* [S] their scales (fp8: [S][ngH]) */
    int per_token;     /* 1: source row of position i is token rows[i] / row_div; 0: i */
    int64_t H4, I4;
    int f8;            /* 1: fp8 w8a8 block (MOE_QK_F8A8), see below */
    int64_t ngH, ngI;  /* fp8: activation groups per x row and per h row */
} w8a8_rows;

/* fp8 w8a8 block (fp8 weights, TOKEN_GROUP activations): the same scheme with e4m3 codes and
 * one f32 scale per group of act_group_size channels (kernels.h moe_quant_row_f8_fn), also
 * in the existing buffers:
 *   x codes: in y: [S][H4] e4m3 bytes at byte 0, then [S][ngH] f32 scales at byte S * H4.
 *            Needs S * (H4 + 4 ngH) <= positions * H * 4 bytes.
 *   h codes: in place in h after phase 1: row i's [I] codes at its start, its [ngI] f32 scales
 *            at byte I4 of the row (needs I4 + 4 ngI <= 4 I); the quantizer writes the scales
 *            to the thread's scratch first (ngI <= 2 * TILE_FLOATS) and they are copied into
 *            the row after its codes.
 * Otherwise linear_q quantizes each row once per work item (logged at DEBUG). */


/* Phase 1 item: rows of group g, gate/up panels [p0, p1) -> h[:, 16*p0 .. 16*p1). */
static void gate_up_item(const moe_kernels *kern, const moe_layer_desc *d, const moe_pmat *gate,
                         const moe_pmat *up, const float *bg, const float *bu, const float *x,
                         int64_t H, const int32_t *rows, int64_t row_div, int64_t r0, int64_t r1,
                         int64_t p0, int64_t p1, float *h, const w8a8_rows *q8, const void *pf_next,
                         int64_t pf_next_bytes, float *tls)
{
    const int64_t I = gate->n;
    const int64_t ld = PG_MAX * MOE_PANEL;
    float *gt = tls;                                /* [RB][ld] */
    float *ut = tls + TILE_FLOATS;                  /* [RB][ld] */
    const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
    const uint8_t **xq = (const uint8_t **)(tls + 2 * TILE_FLOATS); /* [RB] (W8A8, instead of xr) */
    float *sx = tls + 2 * TILE_FLOATS + PTR_FLOATS;                 /* [RB] (W8A8) */
    const float **sa = (const float **)(tls + 2 * TILE_FLOATS + PTR_FLOATS + MOE_GEMM_RB); /* [RB] (fp8) */
    const int64_t n0 = p0 * MOE_PANEL;
    const int64_t n1 = (p1 * MOE_PANEL < I) ? p1 * MOE_PANEL : I;
    for (int64_t b = r0; b < r1; b += MOE_GEMM_RB) {
        int mb = (int)((r1 - b) < MOE_GEMM_RB ? (r1 - b) : MOE_GEMM_RB);
        if (q8 && q8->f8) {
            for (int m = 0; m < mb; m++) {
                int64_t src = q8->per_token ? rows[b + m] / row_div : b + m;
                xq[m] = q8->x8 + src * q8->H4;
                sa[m] = q8->xs + src * q8->ngH;
            }
            kern->linear_f8a8(gate, p0, p1, xq, sa, mb, gt, ld);
            kern->linear_f8a8(up, p0, p1, xq, sa, mb, ut, ld);
        } else if (q8) {
            for (int m = 0; m < mb; m++) {
                int64_t src = q8->per_token ? rows[b + m] / row_div : b + m;
                xq[m] = q8->x8 + src * q8->H4;
                sx[m] = q8->xs[src];
            }
            /* prefetch: during the first gate call this item's up panels, during the last up
             * call the next item's gate panels */
            const int64_t K4 = (gate->k + 3) / 4 * 4;
            const int last = b + MOE_GEMM_RB >= r1;
            const uint8_t *up_panels = (const uint8_t *)up->data + p0 * MOE_PANEL * K4; /* [n1 - n0][K4] */
            kern->linear_w8a8(gate, p0, p1, xq, sx, mb, gt, ld, b == r0 ? up_panels : NULL,
                              b == r0 ? (n1 - n0) * K4 : 0);
            kern->linear_w8a8(up, p0, p1, xq, sx, mb, ut, ld, last ? pf_next : NULL, last ? pf_next_bytes : 0);
        } else {
            for (int m = 0; m < mb; m++) {
                int64_t tok = rows ? rows[b + m] / row_div : b + m;
                xr[m] = x + tok * H;
            }
            kern->linear(gate, p0, p1, xr, mb, gt, ld);
            kern->linear(up, p0, p1, xr, mb, ut, ld);
        }
        for (int m = 0; m < mb; m++) /* h[b + m][n0, n1) */
            kern->act_row(d, gt + m * ld, ut + m * ld, bg ? bg + n0 : NULL, bu ? bu + n0 : NULL,
                          h + (b + m) * I + n0, n1 - n0);
    }
}

/* Phase 2 item: rows [r0, r1) of h through down panels [p0, p1) -> y. */
static void down_item(const moe_kernels *kern, const moe_pmat *down, const float *bd, const float *h,
                      int64_t r0, int64_t r1, int64_t p0, int64_t p1, float *y, const w8a8_rows *q8,
                      const void *pf_next, int64_t pf_next_bytes, float *tls)
{
    const int64_t I = down->k, H = down->n;
    const int64_t n0 = p0 * MOE_PANEL;
    const int64_t n1 = (p1 * MOE_PANEL < H) ? p1 * MOE_PANEL : H;
    const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
    const uint8_t **xq = (const uint8_t **)(tls + 2 * TILE_FLOATS); /* [RB] (W8A8) */
    float *sx = tls + 2 * TILE_FLOATS + PTR_FLOATS;                 /* [RB] (W8A8) */
    const float **sa = (const float **)(tls + 2 * TILE_FLOATS + PTR_FLOATS + MOE_GEMM_RB); /* [RB] (fp8) */
    for (int64_t b = r0; b < r1; b += MOE_GEMM_RB) {
        int mb = (int)((r1 - b) < MOE_GEMM_RB ? (r1 - b) : MOE_GEMM_RB);
        if (q8 && q8->f8) {
            for (int m = 0; m < mb; m++) {
                const uint8_t *hq = (const uint8_t *)(h + (b + m) * I); /* [I] codes, [ngI] scales at byte I4 */
                xq[m] = hq;
                sa[m] = (const float *)(hq + q8->I4);
            }
            kern->linear_f8a8(down, p0, p1, xq, sa, mb, y + b * H + n0, H);
        } else if (q8) {
            for (int m = 0; m < mb; m++) {
                const uint8_t *hq = (const uint8_t *)(h + (b + m) * I); /* [I4] codes, then the scale */
                xq[m] = hq;
                __builtin_memcpy(&sx[m], hq + q8->I4, sizeof(float));
            }
            const int last = b + MOE_GEMM_RB >= r1; /* then prefetch the next item's panels */
            kern->linear_w8a8(down, p0, p1, xq, sx, mb, y + b * H + n0, H, last ? pf_next : NULL,
                              last ? pf_next_bytes : 0);
        } else {
            for (int m = 0; m < mb; m++)
                xr[m] = h + (b + m) * I;
            kern->linear(down, p0, p1, xr, mb, y + b * H + n0, H);
        }
        if (bd)
            for (int m = 0; m < mb; m++)
                for (int64_t n = n0; n < n1; n++)
                    y[(b + m) * H + n] = y[(b + m) * H + n] + bd[n];
    }
}

/* Panels per item for a group of n rows. */
static int64_t group_pg(int64_t n, int64_t lowtok_threshold)
{
    return n < lowtok_threshold ? MOE_GEMM_PG_LOWTOK : MOE_GEMM_PG;
}

/* item_off[g] = first item of group g; a group with no rows has no items. */
static int64_t count_items(const moe_mlp_groups *gr, int64_t panels, int64_t *item_off)
{
    item_off[0] = 0;
    for (int64_t g = 0; g < gr->n_groups; g++) {
        int64_t n = gr->end[g] - gr->begin[g];
        int64_t pg = group_pg(n, gr->lowtok_threshold);
        item_off[g + 1] = item_off[g] + (n > 0 ? (panels + pg - 1) / pg : 0);
    }
    return item_off[gr->n_groups];
}

/* Group of item `it` (binary search over item_off). */
static int64_t item_group(const int64_t *item_off, int64_t n_groups, int64_t it)
{
    int64_t lo = 0, hi = n_groups - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (item_off[mid] <= it)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* W8A8: items per dynamic-schedule chunk. A thread runs W8A8_CHUNK consecutive items, so for
 * all but the last of them it knows its next item and prefetches that item's weights (the
 * other paths keep chunks of 1 item). */
#define W8A8_CHUNK 4

/* Panels [p0, p1) of item `it` (its group in *g). */
static void item_panels(const moe_mlp_groups *gr, const int64_t *item_off, int64_t panels, int64_t it,
                        int64_t *g, int64_t *p0, int64_t *p1)
{
    *g = item_group(item_off, gr->n_groups, it);
    const int64_t pg = group_pg(gr->end[*g] - gr->begin[*g], gr->lowtok_threshold);
    *p0 = (it - item_off[*g]) * pg;
    *p1 = *p0 + pg < panels ? *p0 + pg : panels;
}

/* W8A8: the packed bytes of panels [p0, p1) of matrix `which` (0 gate, 2 down) of the next
 * item this thread runs (it + 1 in the same chunk), for the prefetch hint; NULL otherwise. */
static const void *next_item_weights(const moe_weights *w, const moe_mlp_groups *gr, const int64_t *item_off,
                                     int64_t panels, int64_t n_items, int64_t it, int which, int64_t *bytes)
{
    *bytes = 0;
    if ((it + 1) % W8A8_CHUNK == 0 || it + 1 >= n_items)
        return NULL;
    int64_t g, p0, p1;
    item_panels(gr, item_off, panels, it + 1, &g, &p0, &p1);
    moe_pmat m[3];
    moe_weights_expert(w, gr->shared ? -1 : g, &m[0], &m[1], &m[2]);
    const moe_pmat *x = &m[which];
    if (!x->q || x->q->kind != MOE_QK_W8A8)
        return NULL;
    const int64_t K4 = (x->k + 3) / 4 * 4, n1 = p1 * MOE_PANEL < x->n ? p1 * MOE_PANEL : x->n;
    *bytes = (n1 - p0 * MOE_PANEL) * K4;
    return (const uint8_t *)x->data + p0 * MOE_PANEL * K4;
}

/* Source row i of the w13 input, xr [H] (times *mul when set), -> its codes at x8 + i * H4
 * and its scale(s): xs[i] (int8 W8A8) or xs[i * ngH ..] (fp8 w8a8, groups of G). */
static inline void quant_x_row(const moe_kernels *kern, const w8a8_rows *q8, int64_t G, const float *xr, int64_t H,
                               const float *mul, uint8_t *x8, float *xs, int64_t i)
{
    if (q8->f8)
        kern->quant_row_f8(xr, H, G, mul, x8 + i * q8->H4, xs + i * q8->ngH);
    else
        xs[i] = kern->quant_row_i8(xr, H, mul, x8 + i * q8->H4);
}

/* Quantized activations: *P = one past the last position used, *Tt = one past the last
 * token a position reads (0 with in_scale or without row ids). */
static void rows_extent(const moe_mlp_groups *gr, int64_t *P, int64_t *Tt)
{
    *P = 0;
    *Tt = 0;
    for (int64_t g = 0; g < gr->n_groups; g++) {
        if (gr->end[g] > gr->begin[g] && gr->end[g] > *P)
            *P = gr->end[g];
        if (gr->rows && !gr->in_scale)
            for (int64_t i = gr->begin[g]; i < gr->end[g]; i++)
                if (gr->rows[i] / gr->row_div + 1 > *Tt)
                    *Tt = gr->rows[i] / gr->row_div + 1;
    }
}

void moe_mlp_run(const moe_ctx *ctx, const moe_weights *w, const moe_mlp_groups *gr,
                 float *scratch, int64_t *item_off, moe_mlp_stats *stats)
{
    const moe_kernels *kern = ctx->kernels;
    const moe_layer_desc *desc = &w->plan->desc;
    const int64_t H = desc->hidden_size;
    const size_t tls_n = moe_gemm_thread_scratch_floats();
    /* With in_scale, phase 0 writes each position's scaled input row into y (free until
     * phase 2), and phase 1 reads the rows from there. */
    const float *xin = gr->in_scale ? gr->y : gr->x;
    const int32_t *xrows = gr->in_scale ? NULL : gr->rows;
    const int64_t xdiv = gr->in_scale ? 1 : gr->row_div;
    moe_pmat g0, u0, d0;
    moe_weights_expert(w, gr->shared ? -1 : 0, &g0, &u0, &d0);
    const int64_t pi = moe_pmat_panels(g0.n); /* panels of I */
    const int64_t ph = moe_pmat_panels(H);    /* panels of H */

    /* W8A8: quantize each input row once (see w8a8_rows above) */
    w8a8_rows q8v = {0}, *q8 = NULL;
    int64_t n_src = 0; /* S: source rows to quantize before w13 */
    if (g0.q && g0.q->kind == MOE_QK_W8A8 && kern->linear_w8a8 && kern->quant_row_i8 && H >= 2 && g0.n >= 2) {
        int64_t P, Tt;
        rows_extent(gr, &P, &Tt);
        q8v.H4 = (H + 3) / 4 * 4;
        q8v.I4 = (g0.n + 3) / 4 * 4;
        q8v.per_token = gr->rows && !gr->in_scale && Tt * (q8v.H4 + 4) <= P * H * 4;
        n_src = q8v.per_token ? Tt : P; /* P * (H4 + 4) <= P * 4H since H >= 2 */
        q8v.x8 = (const uint8_t *)gr->y;
        q8v.xs = (const float *)((const uint8_t *)gr->y + n_src * q8v.H4);
        if (P > 0)
            q8 = &q8v;
    } else if (g0.q && g0.q->kind == MOE_QK_F8A8 && kern->linear_f8a8 && kern->quant_row_f8) {
        int64_t P, Tt;
        rows_extent(gr, &P, &Tt);
        q8v.f8 = 1;
        q8v.H4 = (H + 3) / 4 * 4;
        q8v.I4 = (g0.n + 3) / 4 * 4;
        q8v.ngH = g0.q->ng;
        q8v.ngI = d0.q->ng;
        const int64_t xrow = q8v.H4 + 4 * q8v.ngH; /* bytes per quantized x row */
        q8v.per_token = gr->rows && !gr->in_scale && Tt * xrow <= P * H * 4;
        n_src = q8v.per_token ? Tt : P;
        q8v.x8 = (const uint8_t *)gr->y;
        q8v.xs = (const float *)((const uint8_t *)gr->y + n_src * q8v.H4);
        const int fits = n_src * xrow <= P * H * 4 && q8v.I4 + 4 * q8v.ngI <= 4 * g0.n &&
                         q8v.ngI <= 2 * (int64_t)TILE_FLOATS;
        if (P > 0 && fits)
            q8 = &q8v;
        else if (P > 0)
            moe_log(ctx, MOE_LOG_DEBUG, "fp8 w8a8: H = %lld, I = %lld: no room for the codes in y / h; each row is "
                    "quantized once per work item of %d panels", (long long)H, (long long)g0.n, MOE_GEMM_PG);
    } else if (g0.q && g0.q->kind == MOE_QK_W8A8) {
        /* H or I of 1: no room for the codes in y / h; linear_q quantizes per work item */
        moe_log(ctx, MOE_LOG_DEBUG, "w8a8: H = %lld, I = %lld: each row is quantized once per work item of "
                "%d panels (no in-place codes for a dimension of 1)", (long long)H, (long long)g0.n, MOE_GEMM_PG);
    }

    const int chunk = q8 && !q8->f8 ? W8A8_CHUNK : 1; /* items per dynamic-schedule chunk */

    if (stats) {
        for (int64_t g = 0; g < gr->n_groups; g++) {
            int64_t n = gr->end[g] - gr->begin[g];
            if (n == 0)
                stats->skipped_groups++;
            else if (n < gr->lowtok_threshold)
                stats->lowtok_groups++;
            else
                stats->gemm_groups++;
        }
    }

#pragma omp parallel num_threads(ctx->num_threads)
    {
        float *tls = scratch + (size_t)omp_get_thread_num() * tls_n;

        /* phase 0 (apply_router_weight_on_input): y[i] = in_scale[r] * x[r / row_div],
         * r = rows[i], one rounding per element, as src/ref scales the expert input */
        if (q8) {
            /* phase 0 (W8A8 / fp8 w8a8): the w13 input rows -> codes and scales in y. Per
             * position with in_scale: v = in_scale[r] * x[r / row_div], rounded per element. */
            uint8_t *x8 = (uint8_t *)gr->y;                     /* [S][H4] */
            float *xs = (float *)(x8 + n_src * q8->H4);          /* [S] (int8) or [S][ngH] (fp8) */
            if (q8->per_token) {
#pragma omp for schedule(static)
                for (int64_t t = 0; t < n_src; t++)
                    quant_x_row(kern, q8, g0.q->gk, gr->x + t * H, H, NULL, x8, xs, t);
            } else {
                for (int64_t g = 0; g < gr->n_groups; g++) {
#pragma omp for schedule(static) nowait
                    for (int64_t i = gr->begin[g]; i < gr->end[g]; i++) {
                        const int64_t r = gr->rows ? gr->rows[i] : i;
                        const float *xr = gr->x + (gr->rows ? r / gr->row_div : i) * H; /* [H] */
                        quant_x_row(kern, q8, g0.q->gk, xr, H, gr->in_scale ? &gr->in_scale[r] : NULL, x8, xs, i);
                    }
                }
#pragma omp barrier
            }
        } else if (gr->in_scale) {
            for (int64_t g = 0; g < gr->n_groups; g++) {
#pragma omp for schedule(static) nowait
                for (int64_t i = gr->begin[g]; i < gr->end[g]; i++) {
                    const int64_t r = gr->rows[i];
                    const float sc = gr->in_scale[r];
                    const float *xr = gr->x + (r / gr->row_div) * H; /* [H] */
                    float *yr = gr->y + i * H;                       /* [H] */
                    for (int64_t k = 0; k < H; k++)
                        yr[k] = sc * xr[k];
                }
            }
#pragma omp barrier
        }

        /* phase 1: h = act(x Wg^T (+ b_g), x Wu^T (+ b_u)) */
#pragma omp single
        count_items(gr, pi, item_off);
        int64_t n1 = item_off[gr->n_groups];
#pragma omp for schedule(dynamic, chunk)
        for (int64_t it = 0; it < n1; it++) {
            int64_t g, p0, p1;
            item_panels(gr, item_off, pi, it, &g, &p0, &p1);
            moe_pmat gate, up, down;
            const float *bg, *bu, *bd;
            moe_weights_expert(w, gr->shared ? -1 : g, &gate, &up, &down);
            moe_weights_expert_bias(w, gr->shared ? -1 : g, &bg, &bu, &bd);
            int64_t pfn = 0;
            const void *pf = q8 ? next_item_weights(w, gr, item_off, pi, n1, it, 0, &pfn) : NULL;
            gate_up_item(kern, desc, &gate, &up, bg, bu, xin, H, xrows, xdiv, gr->begin[g], gr->end[g],
                         p0, p1, gr->h, q8, pf, pfn, tls);
        }
        /* implicit barrier: h complete */

        /* phase 1b (W8A8): each h row -> codes in place (row start) and its scale at byte I4 */
        if (q8 && q8->f8) {
            const int64_t I = g0.n;
            float *sc = tls; /* [ngI] the row's scales until its codes are written */
            for (int64_t g = 0; g < gr->n_groups; g++) {
#pragma omp for schedule(static) nowait
                for (int64_t i = gr->begin[g]; i < gr->end[g]; i++) {
                    uint8_t *hq = (uint8_t *)(gr->h + i * I); /* [I] f32 in, [I] e4m3 + [ngI] f32 out */
                    kern->quant_row_f8(gr->h + i * I, I, d0.q->gk, NULL, hq, sc);
                    __builtin_memcpy(hq + q8->I4, sc, sizeof(float) * (size_t)q8->ngI);
                }
            }
#pragma omp barrier
        } else if (q8) {
            const int64_t I = g0.n;
            for (int64_t g = 0; g < gr->n_groups; g++) {
#pragma omp for schedule(static) nowait
                for (int64_t i = gr->begin[g]; i < gr->end[g]; i++) {
                    uint8_t *hq = (uint8_t *)(gr->h + i * I); /* [I] f32 in, [I4] u8 + f32 out */
                    const float s = kern->quant_row_i8(gr->h + i * I, I, NULL, hq);
                    __builtin_memcpy(hq + q8->I4, &s, sizeof(float));
                }
            }
#pragma omp barrier
        }

        /* phase 2: y = h Wd^T (+ b_d) */
#pragma omp single
        count_items(gr, ph, item_off);
        int64_t n2 = item_off[gr->n_groups];
#pragma omp for schedule(dynamic, chunk)
        for (int64_t it = 0; it < n2; it++) {
            int64_t g, p0, p1;
            item_panels(gr, item_off, ph, it, &g, &p0, &p1);
            moe_pmat gate, up, down;
            const float *bg, *bu, *bd;
            moe_weights_expert(w, gr->shared ? -1 : g, &gate, &up, &down);
            moe_weights_expert_bias(w, gr->shared ? -1 : g, &bg, &bu, &bd);
            int64_t pfn = 0;
            const void *pf = q8 ? next_item_weights(w, gr, item_off, ph, n2, it, 2, &pfn) : NULL;
            down_item(kern, &down, bd, gr->h, gr->begin[g], gr->end[g], p0, p1, gr->y, q8, pf, pfn, tls);
        }
    }
}

void moe_linear_rows(const moe_ctx *ctx, const moe_pmat *W, const float *x, int64_t ldx,
                     int64_t T, float *out, int64_t ldo, float *scratch)
{
    const moe_kernels *kern = ctx->kernels;
    const size_t tls_n = moe_gemm_thread_scratch_floats();
    const int64_t np = moe_pmat_panels(W->n);
    const int64_t pgs = (np + MOE_GEMM_PG - 1) / MOE_GEMM_PG;
    const int64_t rbs = (T + MOE_GEMM_RB - 1) / MOE_GEMM_RB;
    const int64_t items = pgs * rbs;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->num_threads)
    for (int64_t it = 0; it < items; it++) {
        float *tls = scratch + (size_t)omp_get_thread_num() * tls_n;
        const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
        int64_t rb = it / pgs, pg = it % pgs;
        int64_t r0 = rb * MOE_GEMM_RB;
        int mb = (int)((T - r0) < MOE_GEMM_RB ? (T - r0) : MOE_GEMM_RB);
        int64_t p0 = pg * MOE_GEMM_PG;
        int64_t p1 = p0 + MOE_GEMM_PG < np ? p0 + MOE_GEMM_PG : np;
        for (int m = 0; m < mb; m++)
            xr[m] = x + (r0 + m) * ldx;
        kern->linear(W, p0, p1, xr, mb, out + r0 * ldo + p0 * MOE_PANEL, ldo);
    }
}
