/* Experts implementations (core/stage.h): the grouped GEMM over the standard format and the
 * per-expert GEMM over the batched format. Both run every row through moe_mlp_run, so they give
 * the same bits. */
#include "core/stage.h"
#include "gemm/grouped.h"

static void run_groups(moe_chunk *c, const moe_dispatch *d)
{
    moe_mlp_groups g = {.experts = c->experts, .x = d->x, .n_groups = d->n_groups, .begin = d->begin,
                        .end = d->end, .rows = d->rows, .row_div = d->row_div, .h = d->h, .y = d->y,
                        .lowtok_threshold = c->knobs->lowtok_threshold, .in_scale = d->in_scale,
                        .compute = c->st->compute};
    moe_mlp_stats st = {0};
    moe_mlp_run(c->st->ctx, &c->st->desc, &g, c->scratch, c->item_off, &st);
    c->stats->gemm_groups += st.gemm_groups;
    c->stats->lowtok_groups += st.lowtok_groups;
    c->stats->skipped_groups += st.skipped_groups;
}

const moe_experts_impl moe_experts_grouped = {.name = "grouped", .format = MOE_FORMAT_STANDARD,
                                              .run = run_groups};

const moe_experts_impl moe_experts_batched = {.name = "batched", .format = MOE_FORMAT_BATCHED,
                                              .run = run_groups};
