/* Placement of a layer over the ranks (no MPI here): the experts of the EP placement (the
 * contiguous split without one), contiguous intermediate columns for TP (moe_parallel.h
 * "Parallelism", "Expert placement"). */
#include "core/knobs.h"
#include "parallel/parallel.h"

void moe_par_shard(const moe_layer_desc *d, const moe_parallel_config *par, moe_shard *out)
{
    const int64_t E = d->num_experts, I = d->moe_intermediate_size, Is = d->shared_expert_intermediate_size;
    const int64_t ep = par->ep_size, tp = par->tp_size;
    const moe_placement *pl = par->placement;
    if (pl) {
        int64_t p0 = 0;
        for (int r = 0; r < par->ep_rank; r++)
            p0 += pl->rank_num_physical[r];
        out->p0 = p0;
        out->n_experts = pl->rank_num_physical[par->ep_rank];
        out->logical = pl->physical_to_logical + p0;
    } else {
        out->p0 = moe_split_first(E, ep, par->ep_rank);
        out->n_experts = moe_split_count(E, ep, par->ep_rank);
        out->logical = NULL;
    }
    out->i0 = moe_split_first(I, tp, par->tp_rank);
    out->I = moe_split_count(I, tp, par->tp_rank);
    out->is0 = Is > 0 ? moe_split_first(Is, tp, par->tp_rank) : 0;
    out->Is = Is > 0 ? moe_split_count(Is, tp, par->tp_rank) : 0;
    out->down_bias = par->tp_rank == 0;
}

void moe_par_tp_rows(const moe_stage *p, int64_t T, int64_t *begin, int64_t *end)
{
    if (p->par.tp_size > 1 && p->ctx->tp_reduce == MOE_TP_REDUCE_SCATTER) {
        *begin = moe_split_first(T, p->par.tp_size, p->par.tp_rank);
        *end = *begin + moe_split_count(T, p->par.tp_size, p->par.tp_rank);
    } else {
        *begin = 0;
        *end = T;
    }
}
