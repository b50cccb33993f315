/* Grouped-GEMM driver (see grouped.h). */
#include "gemm/grouped.h"

#include <math.h>
#include <omp.h>

/* Per-thread scratch layout (floats):
 *   gate tile [RB][PG_MAX*16], up tile [RB][PG_MAX*16], row pointers [RB] (stored as pointers). */
#define PG_MAX (MOE_GEMM_PG > MOE_GEMM_PG_LOWTOK ? MOE_GEMM_PG : MOE_GEMM_PG_LOWTOK)
#define TILE_FLOATS (MOE_GEMM_RB * PG_MAX * MOE_PANEL)
#define PTR_FLOATS ((MOE_GEMM_RB * sizeof(void *) + sizeof(float) - 1) / sizeof(float))

size_t moe_gemm_thread_scratch_floats(void)
{
    /* rounded to 16 floats so every thread's slice stays 64-byte aligned */
    size_t n = 2 * TILE_FLOATS + PTR_FLOATS;
    return (n + 15) & ~(size_t)15;
}

static float silu_mul(float g, float u)
{
    return (g / (1.0f + expf(-g))) * u;
}

/* Phase 1 item: rows of group g, gate/up panels [p0, p1) -> h[:, 16*p0 .. 16*p1). */
static void gate_up_item(const moe_kernels *kern, const moe_pmat *gate, const moe_pmat *up,
                         const float *x, int64_t H, const int32_t *rows, int64_t row_div,
                         int64_t r0, int64_t r1, int64_t p0, int64_t p1, float *h, float *tls)
{
    const int64_t I = gate->n;
    const int64_t ld = PG_MAX * MOE_PANEL;
    float *gt = tls;                                /* [RB][ld] */
    float *ut = tls + TILE_FLOATS;                  /* [RB][ld] */
    const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
    const int64_t n0 = p0 * MOE_PANEL;
    const int64_t n1 = (p1 * MOE_PANEL < I) ? p1 * MOE_PANEL : I;
    for (int64_t b = r0; b < r1; b += MOE_GEMM_RB) {
        int mb = (int)((r1 - b) < MOE_GEMM_RB ? (r1 - b) : MOE_GEMM_RB);
        for (int m = 0; m < mb; m++) {
            int64_t tok = rows ? rows[b + m] / row_div : b + m;
            xr[m] = x + tok * H;
        }
        kern->linear(gate, p0, p1, xr, mb, gt, ld);
        kern->linear(up, p0, p1, xr, mb, ut, ld);
        for (int m = 0; m < mb; m++) {
            float *hr = h + (b + m) * I; /* [I] */
            for (int64_t n = n0; n < n1; n++)
                hr[n] = silu_mul(gt[m * ld + (n - n0)], ut[m * ld + (n - n0)]);
        }
    }
}

/* Phase 2 item: rows [r0, r1) of h through down panels [p0, p1) -> y. */
static void down_item(const moe_kernels *kern, const moe_pmat *down, const float *h, int64_t r0,
                      int64_t r1, int64_t p0, int64_t p1, float *y, float *tls)
{
    const int64_t I = down->k, H = down->n;
    const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
    for (int64_t b = r0; b < r1; b += MOE_GEMM_RB) {
        int mb = (int)((r1 - b) < MOE_GEMM_RB ? (r1 - b) : MOE_GEMM_RB);
        for (int m = 0; m < mb; m++)
            xr[m] = h + (b + m) * I;
        kern->linear(down, p0, p1, xr, mb, y + b * H + p0 * MOE_PANEL, H);
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

void moe_mlp_run(const moe_ctx *ctx, const moe_weights *w, const moe_mlp_groups *gr,
                 float *scratch, int64_t *item_off, moe_mlp_stats *stats)
{
    const moe_kernels *kern = ctx->kernels;
    const int64_t H = w->plan->desc.hidden_size;
    const size_t tls_n = moe_gemm_thread_scratch_floats();
    moe_pmat g0, u0, d0;
    moe_weights_expert(w, gr->shared ? -1 : 0, &g0, &u0, &d0);
    const int64_t pi = moe_pmat_panels(g0.n); /* panels of I */
    const int64_t ph = moe_pmat_panels(H);    /* panels of H */

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

        /* phase 1: h = silu(x Wg^T) * (x Wu^T) */
#pragma omp single
        count_items(gr, pi, item_off);
        int64_t n1 = item_off[gr->n_groups];
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n1; it++) {
            int64_t g = item_group(item_off, gr->n_groups, it);
            int64_t pg = group_pg(gr->end[g] - gr->begin[g], gr->lowtok_threshold);
            int64_t p0 = (it - item_off[g]) * pg;
            int64_t p1 = p0 + pg < pi ? p0 + pg : pi;
            moe_pmat gate, up, down;
            moe_weights_expert(w, gr->shared ? -1 : g, &gate, &up, &down);
            gate_up_item(kern, &gate, &up, gr->x, H, gr->rows, gr->row_div, gr->begin[g], gr->end[g],
                         p0, p1, gr->h, tls);
        }
        /* implicit barrier: h complete */

        /* phase 2: y = h Wd^T */
#pragma omp single
        count_items(gr, ph, item_off);
        int64_t n2 = item_off[gr->n_groups];
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n2; it++) {
            int64_t g = item_group(item_off, gr->n_groups, it);
            int64_t pg = group_pg(gr->end[g] - gr->begin[g], gr->lowtok_threshold);
            int64_t p0 = (it - item_off[g]) * pg;
            int64_t p1 = p0 + pg < ph ? p0 + pg : ph;
            moe_pmat gate, up, down;
            moe_weights_expert(w, gr->shared ? -1 : g, &gate, &up, &down);
            down_item(kern, &down, gr->h, gr->begin[g], gr->end[g], p0, p1, gr->y, tls);
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
