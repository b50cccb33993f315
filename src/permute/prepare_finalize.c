/* Local (single-process) prepare/finalize implementations, one per activation format. */
#include "core/knobs.h"
#include "permute/permute.h"

#include <omp.h>
#include <string.h>

/* Group rows by expert with the method the execute's knobs pick (MOE_PERMUTE or a tuning file); every method gives the same
 * offsets, rows and pos. */
void moe_pf_group_rows(moe_chunk *c)
{
    const moe_exec_knobs *kn = c->knobs;
    const int64_t K = c->st->desc.top_k;
    int64_t E = c->st->desc.num_experts;
    const int32_t *ids = c->ids;
    int spare = c->st->desc.num_identity_experts > 0; /* rows kept out of the experts */
    for (int64_t r = 0; r < c->T * K && !spare; r++)
        spare = c->ids[r] < 0; /* an empty slot (expert_capacity's drop, or given -1) */
    if (spare) {
        /* identity experts (ids in [E, E + Z)) and empty slots (-1) into one last bucket E,
         * kept out of the experts; the combine adds w * x or nothing for them */
        for (int64_t r = 0; r < c->T * K; r++)
            c->bids[r] = c->ids[r] >= 0 && c->ids[r] < E ? c->ids[r] : (int32_t)E;
        ids = c->bids;
        E += 1;
    }
    int method = kn->permute;
    if (method == MOE_PERMUTE_AUTO)
        method = c->T * K <= kn->onehot_threshold ? MOE_PERMUTE_ONEHOT : MOE_PERMUTE_SORT;
    switch (method) {
    case MOE_PERMUTE_ONEHOT:
        moe_permute_onehot(ids, c->T, K, E, c->offsets, c->rows, c->pos);
        c->stats->permute = "onehot";
        c->stats->permute_onehot++;
        break;
    case MOE_PERMUTE_PACKED:
        moe_permute_packed(ids, c->T, K, E, c->offsets, c->rows, c->pos, c->keys, c->keys_tmp);
        c->stats->permute = "packed";
        c->stats->permute_packed++;
        break;
    default:
        moe_permute_sort(ids, c->T, K, E, c->offsets, c->rows, c->pos);
        c->stats->permute = "sort";
        c->stats->permute_sort++;
        break;
    }
}

/* Standard format: rows stay in the token buffer, addressed through the sorted row list. */
static moe_status prepare_standard(moe_chunk *c, moe_dispatch *d)
{
    const int64_t E = c->st->desc.num_experts;
    moe_pf_group_rows(c);
    for (int64_t e = 0; e < E; e++) {
        c->begin[e] = c->offsets[e];
        c->end[e] = c->offsets[e + 1];
    }
    *d = (moe_dispatch){.format = MOE_FORMAT_STANDARD, .x = c->x, .n_groups = E, .begin = c->begin,
                        .end = c->end, .rows = c->rows, .row_div = c->st->desc.top_k, .pos = c->pos,
                        .h = c->h, .y = c->y,
                        .in_scale = c->st->desc.apply_router_weight_on_input ? c->wts : NULL};
    return MOE_OK;
}

/* Batched format: each expert's rows copied into its [cap, H] slots, in row-id order. The
 * chunk never holds more than cap tokens, and a token picks an expert at most once, so no
 * expert overflows its capacity. */
static moe_status prepare_batched(moe_chunk *c, moe_dispatch *d)
{
    const moe_layer_desc *ds = &c->st->desc;
    const int64_t E = ds->num_experts, K = ds->top_k, H = ds->hidden_size;
    const int64_t cap = c->st->capacity;
    moe_pf_group_rows(c);
    for (int64_t e = 0; e < E; e++) {
        c->begin[e] = e * cap;
        c->end[e] = e * cap + (c->offsets[e + 1] - c->offsets[e]);
    }
    /* pos: slot of (t, k); copy the token rows into the slots */
    for (int64_t e = 0; e < E; e++) {
        for (int64_t i = c->offsets[e]; i < c->offsets[e + 1]; i++) {
            int64_t r = c->rows[i];
            int64_t slot = e * cap + (i - c->offsets[e]);
            c->pos[r] = (int32_t)slot;
            if (ds->apply_router_weight_on_input) {
                /* the routing weight goes onto the expert input (as src/ref: one rounding) */
                const float wr = c->wts[r];
                for (int64_t k = 0; k < H; k++)
                    c->slots[slot * H + k] = wr * c->x[(r / K) * H + k];
            } else {
                memcpy(c->slots + slot * H, c->x + (r / K) * H, sizeof(float) * (size_t)H);
            }
        }
    }
    *d = (moe_dispatch){.format = MOE_FORMAT_BATCHED, .x = c->slots, .n_groups = E, .begin = c->begin,
                        .end = c->end, .rows = NULL, .row_div = 1, .pos = c->pos, .h = c->h, .y = c->y};
    return MOE_OK;
}

/* Weighted sum over K in top-k order, threaded over tokens. */
static moe_status finalize_local(moe_chunk *c, const moe_dispatch *d)
{
    const moe_layer_desc *ds = &c->st->desc;
#pragma omp parallel num_threads(c->st->ctx->num_threads)
    {
        int tid = omp_get_thread_num(), n = omp_get_num_threads();
        int64_t a0 = c->T * tid / n, a1 = c->T * (tid + 1) / n;
        moe_combine(ds, a0, a1, c->wts, d->y, d->pos, c->ids, (c->st->par.tp_size <= 1 || c->st->par.tp_rank == 0) ? c->x : NULL, c->has_shared,
                    c->sgate, c->out);
    }
    return MOE_OK;
}

const moe_pf_impl moe_pf_local = {.name = "local", .format = MOE_FORMAT_STANDARD,
                                  .prepare = prepare_standard, .finalize = finalize_local};

const moe_pf_impl moe_pf_local_batched = {.name = "local_batched", .format = MOE_FORMAT_BATCHED,
                                          .prepare = prepare_batched, .finalize = finalize_local};
