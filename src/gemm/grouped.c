/* Grouped-GEMM driver (see grouped.h). */
#include "gemm/grouped.h"

#include "core/act.h"
#include "quant/format.h"
#include "quant/quant.h"

#include <math.h>
#include <omp.h>

/* Per-thread scratch layout (floats):
 *   gate tile [RB][PG_MAX*16], up tile [RB][PG_MAX*16], row pointers [RB] (stored as pointers),
 *   then row-scale pointers [RB] (quantized-activation formats). */
#define PG_MAX (MOE_GEMM_PG > MOE_GEMM_PG_LOWTOK ? MOE_GEMM_PG : MOE_GEMM_PG_LOWTOK)
#define TILE_FLOATS (MOE_GEMM_RB * PG_MAX * MOE_PANEL)
#define PTR_FLOATS ((MOE_GEMM_RB * sizeof(void *) + sizeof(float) - 1) / sizeof(float))

size_t moe_gemm_thread_scratch_floats(void)
{
    /* rounded to 16 floats so every thread's slice stays 64-byte aligned */
    size_t n = 2 * TILE_FLOATS + 2 * PTR_FLOATS;
    return (n + 15) & ~(size_t)15;
}

/* Quantized-activation formats (quant/format.h rows with act != NONE: int8 w8a8, fp8 w8a8) and
 * compute bf16: every GEMM input row is converted once, not once per work item (moe_quant.h
 * "Dynamic activation quantization": per row of the GEMM input; compute bf16: rounded to bf16
 * pairs), by the table's quant_row for the format (bf16_row), and the kernels run its
 * linear_rows (bf16_rows[format]) on the converted rows (gemm/kernels.h). Compute bf16 has no
 * scales (ngH = ngI = 0) and its rows always fit (4 ceil(n / 2) <= 4 n bytes). The codes live in
 * the buffers the f32 path already has, so this costs no memory:
 *   x codes: in y (free until phase 2): [S][H4] codes at byte 0, then [S][ngH] f32 scales at
 *            byte S * H4 (H4 = ceil(H / 4) * 4; ngH = the gate matrix's scale groups: 1 for
 *            int8 per channel, ceil(H / block_k) for fp8 blocks), S the number of source rows: the
 *            tokens (each token row feeds top_k experts: quantized once) or, with in_scale or
 *            without row ids, the positions. Needs S * (H4 + 4 ngH) <= positions * H * 4 bytes.
 *   h codes: in place in h after phase 1: row i's codes at its start ([I4] for int8, bytes I .. I4 set to 128; [I] for fp8), its [ngI] f32 scales
 *            at byte I4 of the row (needs I4 + 4 ngI <= 4 I); the quantizer writes the scales
 *            to the thread's scratch first (ngI <= 2 * TILE_FLOATS) and they are copied into
 *            the row after its codes.
 * Static fp8 activations (MOE_QACT_STATIC): the codes depend on the expert (its input scale), so
 * S is always the positions, and the one static quantizer (quant/quant.h
 * moe_quant_row_f8_static) writes the codes and [ngH] / [ngI] copies of the expert's scale.
 * Otherwise (no room: H or I of 1, or a table without the entries) the table's linear for the
 * format runs on the f32 rows and quantizes them itself, once per work item (logged at DEBUG):
 * the same bits, since the quantization of a row does not depend on who does it. */
typedef struct qrows {
    const uint8_t *x8;         /* [S][H4] codes of the w13 input rows */
    const float *xs;           /* [S][ngH] their scales */
    int per_token;             /* 1: source row of position i is token rows[i] / row_div; 0: i */
    int64_t H4, I4;
    int64_t ngH, ngI;          /* scale groups per x row and per h row */
    int64_t gH, gI;            /* their group lengths (the row quantizer's G) */
    moe_quant_row_fn quant;    /* the table's quant_row for the format */
    moe_linear_rows_fn rows;   /* and its linear_rows */
    int prefetch;              /* the format row's prefetch flag */
    int stat;                  /* static fp8 activations (moe_quant.h MOE_QACT_STATIC): the rows are
                                  quantized per position by moe_quant_row_f8_static with the
                                  expert's scale (its gate matrix's q->in_scale for x, its down
                                  matrix's for h), never per token; quant is not used */
} qrows;

/* Phase 1 item: rows of group g, gate/up panels [p0, p1) -> h[:, 16*p0 .. 16*p1). Non-gated
 * experts (moe_activation_gated 0: em->gate is empty, W1 is em->up): the up GEMM only, and the
 * activation of u alone in the epilogue. */
static void gate_up_item(const moe_kernels *kern, const moe_layer_desc *d, const moe_expert_mats *em, const float *x,
                         int64_t H, const int32_t *rows, int64_t row_div, int64_t r0, int64_t r1, int64_t p0,
                         int64_t p1, float *h, const qrows *q8, const void *pf_next, int64_t pf_next_bytes, float *tls)
{
    const int gated = moe_activation_gated(d->activation);
    const moe_pmat *gate = &em->gate, *up = &em->up;
    const int64_t I = up->n;
    const int64_t ld = PG_MAX * MOE_PANEL;
    float *gt = tls;                                /* [RB][ld] */
    float *ut = tls + TILE_FLOATS;                  /* [RB][ld] */
    const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
    const uint8_t **xq = (const uint8_t **)(tls + 2 * TILE_FLOATS); /* [RB] (quantized, instead of xr) */
    const float **sx = (const float **)(tls + 2 * TILE_FLOATS + PTR_FLOATS); /* [RB] row scales (quantized) */
    const moe_linear_fn lin = kern->linear[moe_pmat_format(up)];
    const int64_t n0 = p0 * MOE_PANEL;
    const int64_t n1 = (p1 * MOE_PANEL < I) ? p1 * MOE_PANEL : I;
    const int64_t fb = q8 ? moe_format_row(moe_pmat_format(up))->feature_bytes(up->k) : 0;
    for (int64_t b = r0; b < r1; b += MOE_GEMM_RB) {
        int mb = (int)((r1 - b) < MOE_GEMM_RB ? (r1 - b) : MOE_GEMM_RB);
        if (q8) {
            for (int m = 0; m < mb; m++) {
                int64_t src = q8->per_token ? rows[b + m] / row_div : b + m;
                xq[m] = q8->x8 + src * q8->H4;
                sx[m] = q8->xs + src * q8->ngH;
            }
            /* prefetch (formats with the flag): during the first gate call this item's up
             * panels, during the last up call the next item's gate panels */
            const int last = b + MOE_GEMM_RB >= r1;
            const uint8_t *up_panels = (const uint8_t *)up->data + n0 * fb; /* [n1 - n0][fb] */
            const int pf1 = q8->prefetch && b == r0, pf2 = q8->prefetch && last;
            if (gated)
                q8->rows(gate, p0, p1, xq, sx, mb, gt, ld, pf1 ? up_panels : NULL, pf1 ? (n1 - n0) * fb : 0);
            q8->rows(up, p0, p1, xq, sx, mb, ut, ld, pf2 ? pf_next : NULL, pf2 ? pf_next_bytes : 0);
        } else {
            for (int m = 0; m < mb; m++) {
                int64_t tok = rows ? rows[b + m] / row_div : b + m;
                xr[m] = x + tok * H;
            }
            if (gated)
                lin(gate, p0, p1, xr, mb, gt, ld);
            lin(up, p0, p1, xr, mb, ut, ld);
        }
        for (int m = 0; m < mb; m++) /* h[b + m][n0, n1) */
            kern->act_row(d, gated ? gt + m * ld : NULL, ut + m * ld, gated && em->bg ? em->bg + n0 : NULL,
                          em->bu ? em->bu + n0 : NULL, h + (b + m) * I + n0, n1 - n0);
    }
}

/* Phase 2 item: rows [r0, r1) of h through down panels [p0, p1) -> y. */
static void down_item(const moe_kernels *kern, const moe_expert_mats *em, const float *h, int64_t r0, int64_t r1,
                      int64_t p0, int64_t p1, float *y, const qrows *q8, const void *pf_next, int64_t pf_next_bytes,
                      float *tls)
{
    const moe_pmat *down = &em->down;
    const float *bd = em->bd;
    const int64_t I = down->k, H = down->n;
    const int64_t n0 = p0 * MOE_PANEL;
    const int64_t n1 = (p1 * MOE_PANEL < H) ? p1 * MOE_PANEL : H;
    const float **xr = (const float **)(tls + 2 * TILE_FLOATS); /* [RB] */
    const uint8_t **xq = (const uint8_t **)(tls + 2 * TILE_FLOATS); /* [RB] (quantized) */
    const float **sx = (const float **)(tls + 2 * TILE_FLOATS + PTR_FLOATS); /* [RB] (quantized) */
    const moe_linear_fn lin = kern->linear[moe_pmat_format(down)];
    for (int64_t b = r0; b < r1; b += MOE_GEMM_RB) {
        int mb = (int)((r1 - b) < MOE_GEMM_RB ? (r1 - b) : MOE_GEMM_RB);
        if (q8) {
            for (int m = 0; m < mb; m++) {
                const uint8_t *hq = (const uint8_t *)(h + (b + m) * I); /* [I4] codes, [ngI] scales at byte I4 */
                xq[m] = hq;
                sx[m] = (const float *)(hq + q8->I4);
            }
            const int last = q8->prefetch && b + MOE_GEMM_RB >= r1; /* then prefetch the next item's panels */
            q8->rows(down, p0, p1, xq, sx, mb, y + b * H + n0, H, last ? pf_next : NULL, last ? pf_next_bytes : 0);
        } else {
            for (int m = 0; m < mb; m++)
                xr[m] = h + (b + m) * I;
            lin(down, p0, p1, xr, mb, y + b * H + n0, H);
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

/* Panels [p0, p1) of item `it` (its group in *g). */
static void item_panels(const moe_mlp_groups *gr, const int64_t *item_off, int64_t panels, int64_t it,
                        int64_t *g, int64_t *p0, int64_t *p1)
{
    *g = item_group(item_off, gr->n_groups, it);
    const int64_t pg = group_pg(gr->end[*g] - gr->begin[*g], gr->lowtok_threshold);
    *p0 = (it - item_off[*g]) * pg;
    *p1 = *p0 + pg < panels ? *p0 + pg : panels;
}

/* Formats with the prefetch flag: the packed bytes of panels [p0, p1) of matrix `which` (0
 * the first w13 matrix: gate, or up for non-gated experts; 2 down) of the next item this thread runs (it + 1 in the same claim of `claim` items),
 * for the prefetch hint; NULL otherwise. */
static const void *next_item_weights(const moe_mlp_groups *gr, const int64_t *item_off, int64_t panels,
                                     int64_t n_items, int64_t it, int which, int claim, int gated, int64_t *bytes)
{
    *bytes = 0;
    if ((it + 1) % claim == 0 || it + 1 >= n_items)
        return NULL;
    int64_t g, p0, p1;
    item_panels(gr, item_off, panels, it + 1, &g, &p0, &p1);
    const moe_pmat *x = which == 2 ? &gr->experts[g].down : gated ? &gr->experts[g].gate : &gr->experts[g].up;
    const moe_format *f = moe_format_row(moe_pmat_format(x));
    if (!f->prefetch)
        return NULL;
    const int64_t fb = f->feature_bytes(x->k), n1 = p1 * MOE_PANEL < x->n ? p1 * MOE_PANEL : x->n;
    *bytes = (n1 - p0 * MOE_PANEL) * fb;
    return (const uint8_t *)x->data + p0 * MOE_PANEL * fb;
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

/* Phase 1 (gate/up + activation, `panels` of I) or 2 (down, `panels` of H) inside the parallel
 * region: one thread counts the items, then every thread claims `chunk` at a time (the
 * implicit barrier of the loop ends the phase). xin, xrows, xdiv: phase 1's input rows. */
static void run_phase(int phase, const moe_kernels *kern, const moe_layer_desc *desc, const moe_mlp_groups *gr,
                      const float *xin, const int32_t *xrows, int64_t xdiv, int64_t panels, int chunk,
                      const qrows *q8, int64_t *item_off, float *tls)
{
#pragma omp single
    count_items(gr, panels, item_off);
    const int64_t n = item_off[gr->n_groups];
#pragma omp for schedule(dynamic, chunk)
    for (int64_t it = 0; it < n; it++) {
        int64_t g, p0, p1;
        item_panels(gr, item_off, panels, it, &g, &p0, &p1);
        int64_t pfn = 0;
        const void *pf = q8 ? next_item_weights(gr, item_off, panels, n, it, phase == 1 ? 0 : 2, chunk,
                                                    moe_activation_gated(desc->activation), &pfn) : NULL;
        if (phase == 1)
            gate_up_item(kern, desc, &gr->experts[g], xin, desc->hidden_size, xrows, xdiv, gr->begin[g], gr->end[g],
                         p0, p1, gr->h, q8, pf, pfn, tls);
        else
            down_item(kern, &gr->experts[g], gr->h, gr->begin[g], gr->end[g], p0, p1, gr->y, q8, pf, pfn, tls);
    }
}

void moe_mlp_run(const moe_ctx *ctx, const moe_layer_desc *desc, const moe_mlp_groups *gr, float *scratch,
                 int64_t *item_off, moe_mlp_stats *stats)
{
    const moe_kernels *kern = ctx->kernels;
    const int64_t H = desc->hidden_size;
    const size_t tls_n = moe_gemm_thread_scratch_floats();
    /* With in_scale, phase 0 writes each position's scaled input row into y (free until
     * phase 2), and phase 1 reads the rows from there. */
    const float *xin = gr->in_scale ? gr->y : gr->x;
    const int32_t *xrows = gr->in_scale ? NULL : gr->rows;
    const int64_t xdiv = gr->in_scale ? 1 : gr->row_div;
    /* w13's shape and format from up: a non-gated expert (moe_activation_gated 0) has no gate */
    const moe_pmat *g0 = &gr->experts[0].up, *d0 = &gr->experts[0].down;
    const int64_t pi = moe_pmat_panels(g0->n); /* panels of I */
    const int64_t ph = moe_pmat_panels(H);     /* panels of H */

    /* quantized-activation formats and compute bf16: convert each input row once (see qrows
     * above) */
    const moe_wfmt fmt = moe_pmat_format(g0);
    const moe_format *frow = moe_format_row(fmt);
    const int bf16 = gr->compute == MOE_COMPUTE_BF16;
    qrows q8v = {0}, *q8 = NULL;
    int64_t n_src = 0; /* S: source rows to convert before w13 */
    if (bf16 || frow->act != MOE_QACT_NONE) {
        int64_t P, Tt;
        rows_extent(gr, &P, &Tt);
        if (bf16) { /* rows of bf16 pairs, no scales (always fit: 4 ceil(n / 2) <= 4 n bytes) */
            q8v.H4 = 4 * ((H + 1) / 2);
            q8v.I4 = 4 * ((g0->n + 1) / 2);
            q8v.quant = kern->bf16_row;
            q8v.rows = kern->bf16_rows[fmt];
        } else {
            q8v.H4 = (H + 3) / 4 * 4;
            q8v.I4 = (g0->n + 3) / 4 * 4;
            q8v.ngH = g0->q->ng;
            q8v.ngI = d0->q->ng;
            q8v.gH = g0->q->gk;
            q8v.gI = d0->q->gk;
            q8v.quant = kern->quant_row[fmt];
            q8v.rows = kern->linear_rows[fmt];
            q8v.stat = desc->quant.act == MOE_QACT_STATIC;
        }
        q8v.prefetch = frow->prefetch;
        const int64_t xrow = q8v.H4 + 4 * q8v.ngH; /* bytes per quantized x row */
        q8v.per_token = gr->rows && !gr->in_scale && !q8v.stat && Tt * xrow <= P * H * 4;
        n_src = q8v.per_token ? Tt : P;
        q8v.x8 = (const uint8_t *)gr->y;
        q8v.xs = (const float *)((const uint8_t *)gr->y + n_src * q8v.H4);
        const int fits = n_src * xrow <= P * H * 4 && q8v.I4 + 4 * q8v.ngI <= 4 * g0->n &&
                         q8v.ngI <= 2 * (int64_t)TILE_FLOATS;
        if (P > 0 && fits && (q8v.quant || q8v.stat) && q8v.rows)
            q8 = &q8v;
        else if (P > 0)
            moe_log(ctx, MOE_LOG_DEBUG,
                    "%s: H = %lld, I = %lld: %s; each row is quantized once per work item of %d panels",
                    frow->name, (long long)H, (long long)g0->n,
                    fits ? "the table has no quantized-row kernels" : "no room for the codes in y / h", MOE_GEMM_PG);
    }

    const int chunk = q8 ? frow->claim : 1; /* items per dynamic-schedule claim */

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

        if (q8) {
            /* phase 0 (quantized activations): the w13 input rows -> codes and scales in y.
             * Per position with in_scale: v = in_scale[r] * x[r / row_div], rounded per element. */
            uint8_t *x8 = (uint8_t *)gr->y;                     /* [S][H4] */
            float *xs = (float *)(x8 + n_src * q8->H4);          /* [S][ngH] */
            if (q8->per_token) {
#pragma omp for schedule(static)
                for (int64_t t = 0; t < n_src; t++)
                    q8->quant(gr->x + t * H, H, q8->gH, NULL, x8 + t * q8->H4, xs + t * q8->ngH);
            } else {
                for (int64_t g = 0; g < gr->n_groups; g++) {
#pragma omp for schedule(static) nowait
                    for (int64_t i = gr->begin[g]; i < gr->end[g]; i++) {
                        const int64_t r = gr->rows ? gr->rows[i] : i;
                        const float *xr = gr->x + (gr->rows ? r / gr->row_div : i) * H; /* [H] */
                        const float *mul = gr->in_scale ? &gr->in_scale[r] : NULL;
                        if (q8->stat) /* the expert's w13 input scale */
                            moe_quant_row_f8_static(xr, H, q8->ngH, mul, gr->experts[g].up.q->in_scale,
                                                    x8 + i * q8->H4, xs + i * q8->ngH);
                        else
                            q8->quant(xr, H, q8->gH, mul, x8 + i * q8->H4, xs + i * q8->ngH);
                    }
                }
#pragma omp barrier
            }
        } else if (gr->in_scale) {
            /* phase 0 (apply_router_weight_on_input): y[i] = in_scale[r] * x[r / row_div],
             * r = rows[i], one rounding per element, as src/ref scales the expert input */
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
        run_phase(1, kern, desc, gr, xin, xrows, xdiv, pi, chunk, q8, item_off, tls);
        /* implicit barrier: h complete */

        /* phase 1b (quantized activations): each h row -> codes in place (row start) and its
         * scales at byte I4 */
        if (q8) {
            const int64_t I = g0->n;
            float *sc = tls; /* [ngI] the row's scales until its codes are written */
            for (int64_t g = 0; g < gr->n_groups; g++) {
#pragma omp for schedule(static) nowait
                for (int64_t i = gr->begin[g]; i < gr->end[g]; i++) {
                    uint8_t *hq = (uint8_t *)(gr->h + i * I); /* [I] f32 in, [I4] codes + [ngI] f32 out */
                    if (q8->stat) /* the expert's w2 input scale */
                        moe_quant_row_f8_static(gr->h + i * I, I, q8->ngI, NULL, gr->experts[g].down.q->in_scale,
                                                hq, sc);
                    else
                        q8->quant(gr->h + i * I, I, q8->gI, NULL, hq, sc);
                    __builtin_memcpy(hq + q8->I4, sc, sizeof(float) * (size_t)q8->ngI);
                }
            }
#pragma omp barrier
        }

        /* phase 2: y = h Wd^T (+ b_d) */
        run_phase(2, kern, desc, gr, xin, xrows, xdiv, ph, chunk, q8, item_off, tls);
    }
}

void moe_gemm_rows(const moe_ctx *ctx, const moe_pmat *W, const float *x, int64_t ldx, int64_t T, float *out,
                   int64_t ldo, float *scratch)
{
    const moe_kernels *kern = ctx->kernels;
    const moe_linear_fn lin = kern->linear[moe_pmat_format(W)];
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
        lin(W, p0, p1, xr, mb, out + r0 * ldo + p0 * MOE_PANEL, ldo);
    }
}
