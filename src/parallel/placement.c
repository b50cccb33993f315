/* Expert placement as data (moe_parallel.h "Expert placement", docs/parallel.md "Placement
 * file"): the validity check that plan creation and the placement file reader use
 * (src/io/placement_file.c reads and writes the files). No MPI here: a one-process build
 * checks placements too. */
#include "core/internal.h"
#include "parallel/parallel.h"
#include "moe_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>



moe_status moe_placement_check(moe_ctx *ctx, const moe_placement *p, int64_t num_experts, int ep_size)
{
    if (!p)
        return moe_set_error(ctx, MOE_EINVAL, "placement: NULL");
    if (p->ep_size != ep_size)
        return moe_set_error(ctx, MOE_EINVAL, "placement: ep_size = %d, but the plan's parallel.ep_size = %d",
                             (int)p->ep_size, ep_size);
    if (ep_size < 1 || ep_size > PLACEMENT_MAX_RANKS)
        return moe_set_error(ctx, MOE_EINVAL, "placement: ep_size = %d, must be in [1, %d]", ep_size,
                             PLACEMENT_MAX_RANKS);
    if ((int64_t)p->num_logical_experts != num_experts)
        return moe_set_error(ctx, MOE_EINVAL,
                             "placement: num_logical_experts = %d, but the layer's num_experts = %lld",
                             (int)p->num_logical_experts, (long long)num_experts);
    const int64_t E = num_experts, P = p->num_physical_experts;
    if (E < 1 || E > PLACEMENT_MAX_EXPERTS)
        return moe_set_error(ctx, MOE_EINVAL, "placement: num_logical_experts = %lld, must be in [1, %d]",
                             (long long)E, PLACEMENT_MAX_EXPERTS);
    if (P < E || P > E * ep_size)
        return moe_set_error(ctx, MOE_EINVAL,
                             "placement: num_physical_experts = %lld, must be in [num_logical_experts = %lld, "
                             "num_logical_experts * ep_size = %lld]",
                             (long long)P, (long long)E, (long long)(E * ep_size));
    if (!p->rank_num_physical)
        return moe_set_error(ctx, MOE_EINVAL, "placement: rank_num_physical is NULL");
    if (!p->physical_to_logical)
        return moe_set_error(ctx, MOE_EINVAL, "placement: physical_to_logical is NULL");
    int64_t sum = 0;
    for (int r = 0; r < ep_size; r++) {
        if (p->rank_num_physical[r] < 0)
            return moe_set_error(ctx, MOE_EINVAL, "placement: rank_num_physical[%d] = %d, must be >= 0", r,
                                 (int)p->rank_num_physical[r]);
        sum += p->rank_num_physical[r];
    }
    if (sum != P)
        return moe_set_error(ctx, MOE_EINVAL,
                             "placement: rank_num_physical sums to %lld over the %d ranks, but "
                             "num_physical_experts = %lld",
                             (long long)sum, ep_size, (long long)P);
    for (int64_t q = 0; q < P; q++)
        if (p->physical_to_logical[q] < 0 || p->physical_to_logical[q] >= E)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "placement: physical expert %lld holds logical expert %d, out of range [0, %lld)",
                                 (long long)q, (int)p->physical_to_logical[q], (long long)E);
    /* last_rank [E]: the last rank seen holding each logical expert (-1: none yet); last_phys
     * [E]: that holding's physical expert, for the duplicate message. Ranks are visited in
     * order, so a repeat on one rank is a hit on the current rank. */
    int32_t *last_rank = malloc((size_t)E * sizeof *last_rank);
    int64_t *last_phys = malloc((size_t)E * sizeof *last_phys);
    if (!last_rank || !last_phys) {
        free(last_rank);
        free(last_phys);
        return moe_set_error(ctx, MOE_ENOMEM, "placement: out of memory checking %lld experts", (long long)E);
    }
    for (int64_t e = 0; e < E; e++)
        last_rank[e] = -1;
    moe_status st = MOE_OK;
    int64_t q = 0;
    for (int r = 0; r < ep_size && st == MOE_OK; r++)
        for (int32_t i = 0; i < p->rank_num_physical[r] && st == MOE_OK; i++, q++) {
            const int32_t e = p->physical_to_logical[q];
            if (last_rank[e] == r)
                st = moe_set_error(ctx, MOE_EINVAL,
                                   "placement: physical expert %lld (rank %d) repeats logical expert %d on that rank "
                                   "(already physical expert %lld)",
                                   (long long)q, r, (int)e, (long long)last_phys[e]);
            last_rank[e] = r;
            last_phys[e] = q;
        }
    for (int64_t e = 0; e < E && st == MOE_OK; e++)
        if (last_rank[e] < 0)
            st = moe_set_error(ctx, MOE_EINVAL, "placement: logical expert %lld is held by no physical expert",
                               (long long)e);
    free(last_rank);
    free(last_phys);
    if (st != MOE_OK)
        return st;
    /* One rank: the no-repeat rule leaves a permutation; only the identity is accepted, so a
     * one-process plan has exactly one placement (and one plan text) for its weights. */
    if (ep_size == 1)
        for (int64_t e = 0; e < E; e++)
            if (p->physical_to_logical[e] != e)
                return moe_set_error(ctx, MOE_EINVAL,
                                     "placement: ep_size = 1 must be the identity, but physical expert %lld holds "
                                     "logical expert %d",
                                     (long long)e, (int)p->physical_to_logical[e]);
    return MOE_OK;
}

void moe_placement_clear(moe_placement *p)
{
    if (!p)
        return;
    free(p->physical_to_logical);
    free(p->rank_num_physical);
    memset(p, 0, sizeof *p);
}
