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
#include <xxhash.h>



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

int moe_placement_is_contiguous(const moe_placement *p)
{
    const int64_t E = p->num_logical_experts, ep = p->ep_size;
    if (p->num_physical_experts != E)
        return 0;
    for (int64_t r = 0; r < ep; r++)
        if (p->rank_num_physical[r] != moe_split_count(E, ep, r))
            return 0;
    for (int64_t q = 0; q < E; q++)
        if (p->physical_to_logical[q] != q)
            return 0;
    return 1;
}

uint64_t moe_placement_hash(const moe_placement *p)
{
    XXH64_state_t *s = XXH64_createState();
    if (!s)
        return 0;
    XXH64_reset(s, 0);
    const int32_t head[3] = {p->ep_size, p->num_logical_experts, p->num_physical_experts};
    XXH64_update(s, head, sizeof head);
    XXH64_update(s, p->rank_num_physical, sizeof(int32_t) * (size_t)p->ep_size);
    XXH64_update(s, p->physical_to_logical, sizeof(int32_t) * (size_t)p->num_physical_experts);
    const uint64_t h = XXH64_digest(s);
    XXH64_freeState(s);
    return h;
}

int moe_placement_copy(moe_placement *dst, const moe_placement *src)
{
    memset(dst, 0, sizeof *dst);
    const size_t P = (size_t)src->num_physical_experts, ep = (size_t)src->ep_size;
    dst->physical_to_logical = malloc((P ? P : 1) * sizeof(int32_t)); /* [P] */
    dst->rank_num_physical = malloc((ep ? ep : 1) * sizeof(int32_t)); /* [ep_size] */
    if (!dst->physical_to_logical || !dst->rank_num_physical) {
        moe_placement_clear(dst);
        return -1;
    }
    memcpy(dst->physical_to_logical, src->physical_to_logical, P * sizeof(int32_t));
    memcpy(dst->rank_num_physical, src->rank_num_physical, ep * sizeof(int32_t));
    dst->ep_size = src->ep_size;
    dst->num_logical_experts = src->num_logical_experts;
    dst->num_physical_experts = src->num_physical_experts;
    return 0;
}

void moe_ep_map_free(moe_ep_map *m)
{
    if (!m)
        return;
    free(m->replica_off);
    free(m->replica_phys);
    free(m->phys_rank);
    free(m->phys_local);
    memset(m, 0, sizeof *m);
}

int moe_ep_map_build(const moe_placement *p, moe_ep_map *out)
{
    memset(out, 0, sizeof *out);
    const int64_t E = p->num_logical_experts, P = p->num_physical_experts;
    out->replica_off = calloc((size_t)E + 1, sizeof(int32_t)); /* [E + 1] */
    out->replica_phys = malloc((size_t)P * sizeof(int32_t));   /* [P] */
    out->phys_rank = malloc((size_t)P * sizeof(int32_t));      /* [P] */
    out->phys_local = malloc((size_t)P * sizeof(int32_t));     /* [P] */
    if (!out->replica_off || !out->replica_phys || !out->phys_rank || !out->phys_local) {
        moe_ep_map_free(out);
        return -1;
    }
    int64_t q = 0;
    for (int32_t r = 0; r < p->ep_size; r++) {
        if (p->rank_num_physical[r] > out->emax)
            out->emax = p->rank_num_physical[r];
        for (int32_t i = 0; i < p->rank_num_physical[r]; i++, q++) {
            out->phys_rank[q] = r;
            out->phys_local[q] = i;
            out->replica_off[p->physical_to_logical[q] + 1]++;
        }
    }
    for (int64_t e = 0; e < E; e++)
        out->replica_off[e + 1] += out->replica_off[e];
    /* counting sort by logical expert, stable: replicas in physical order */
    int32_t *cur = malloc((size_t)E * sizeof(int32_t)); /* [E] cursors */
    if (!cur) {
        moe_ep_map_free(out);
        return -1;
    }
    memcpy(cur, out->replica_off, (size_t)E * sizeof(int32_t));
    for (q = 0; q < P; q++)
        out->replica_phys[cur[p->physical_to_logical[q]]++] = (int32_t)q;
    free(cur);
    out->contiguous = moe_placement_is_contiguous(p);
    return 0;
}
