/* The built-in EP placement policies (moe_parallel.h "Expert placement": moe_placement_build)
 * and the rows a placement would give each rank under a measured load
 * (moe_placement_rank_rows). Pure arithmetic on the caller's arrays: no MPI, no plan.
 *
 * BALANCED follows the scheme DeepSeek's EPLB README describes (replicate the hottest
 * experts, then pack the physical experts onto ranks heaviest first), written from the
 * header's description: every tie is broken by a lower id, so every rank that builds a
 * placement from the same load builds the same one. */
#include "parallel/parallel.h"

#include <stdlib.h>
#include <string.h>

/* Sign of a/b - c/d for a, c >= 0 and b, d > 0, exactly (Euclid on the continued fractions,
 * so no product can overflow int64). */
static int ratio_cmp(int64_t a, int64_t b, int64_t c, int64_t d)
{
    int flip = 1;
    for (;;) {
        const int64_t qa = a / b, qc = c / d;
        if (qa != qc)
            return qa < qc ? -flip : flip;
        const int64_t ra = a % b, rc = c % d;
        if (ra == 0 || rc == 0)
            return ra == rc ? 0 : (ra == 0 ? -flip : flip);
        /* 0 < ra/b, rc/d < 1: ra/b vs rc/d is b/ra vs d/rc, reversed */
        const int64_t nb = ra, nd = rc;
        a = b;
        c = d;
        b = nb;
        d = nd;
        flip = -flip;
    }
}

/* Rows replica j (0-based) of a logical expert with `load` rows and c replicas runs: an even
 * share, the remainder to the first replicas (the replica rule's long-run split). */
static int64_t replica_rows(int64_t load, int64_t c, int64_t j)
{
    return load / c + (j < load % c ? 1 : 0);
}

typedef struct phys_item {
    int32_t logical; /* logical expert */
    int32_t replica; /* its replica index in packing order */
    int64_t load;    /* the logical expert's rows */
    int64_t c;       /* its replica count */
} phys_item;

/* Heaviest first: load / c descending, then lower logical id, then lower replica. */
static int item_order(const void *pa, const void *pb)
{
    const phys_item *a = pa, *b = pb;
    const int r = ratio_cmp(a->load, a->c, b->load, b->c);
    if (r != 0)
        return -r;
    if (a->logical != b->logical)
        return a->logical < b->logical ? -1 : 1;
    return a->replica < b->replica ? -1 : a->replica > b->replica;
}

static int int32_order(const void *pa, const void *pb)
{
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return a < b ? -1 : a > b;
}

/* BALANCED into physical_to_logical [P] and rank_num_physical [ep]. */
static moe_status build_balanced(moe_ctx *ctx, int64_t E, int ep, int64_t R, const int64_t *load,
                                 int32_t *physical_to_logical, int32_t *rank_num_physical)
{
    const int64_t P = E + R;
    int64_t *reps = calloc((size_t)E, sizeof *reps);              /* [E] replicas per logical expert */
    phys_item *items = malloc(sizeof *items * (size_t)P);           /* [P] physical experts to pack */
    int32_t *slot = malloc(sizeof *slot * (size_t)P);               /* [P] logical ids, rank r's at first[r] */
    int64_t *slot_rows = malloc(sizeof *slot_rows * (size_t)P);     /* [P] rows of each slot's replica */
    int64_t *cnt = calloc((size_t)ep, sizeof *cnt);                 /* [ep] experts on each rank so far */
    int64_t *rows = calloc((size_t)ep, sizeof *rows);               /* [ep] rows on each rank so far */
    int64_t *cap = malloc(sizeof *cap * (size_t)ep);                /* [ep] slots of each rank */
    int64_t *first = malloc(sizeof *first * (size_t)ep);            /* [ep] first slot of each rank in `slot` */
    unsigned char *has = calloc((size_t)ep * (size_t)E, 1);         /* [ep, E] rank holds logical */
    moe_status st = MOE_OK;
    if (!reps || !items || !slot || !slot_rows || !cnt || !rows || !cap || !first || !has) {
        st = moe_set_error(ctx, MOE_ENOMEM, "moe_placement_build: out of memory (%lld physical experts)",
                           (long long)P);
        goto done;
    }

    /* 1. Replicate: each extra replica to the logical expert with the highest load per
     * replica among those with fewer than ep replicas (a rank holds an expert at most once),
     * ties to the lower id. R <= E * (ep - 1) leaves one always. */
    for (int64_t e = 0; e < E; e++)
        reps[e] = 1;
    for (int64_t n = 0; n < R; n++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (reps[e] < ep && (best < 0 || ratio_cmp(load[e], reps[e], load[best], reps[best]) > 0))
                best = e;
        reps[best]++;
    }

    /* 2. Pack heaviest first onto the least-loaded rank with a free slot and no replica of
     * the expert, ties to the lower rank; a replica adds its share of the rows. */
    int64_t n_items = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t j = 0; j < reps[e]; j++)
            items[n_items++] = (phys_item){.logical = (int32_t)e, .replica = (int32_t)j, .load = load[e], .c = reps[e]};
    qsort(items, (size_t)P, sizeof *items, item_order);
    for (int r = 0, at = 0; r < ep; r++) {
        cap[r] = moe_split_count(P, ep, r);
        first[r] = at;
        at += (int)cap[r];
    }
    for (int64_t i = 0; i < P; i++) {
        const phys_item *it = &items[i];
        const int64_t w = replica_rows(it->load, it->c, it->replica);
        int best = -1;
        for (int r = 0; r < ep; r++)
            if (cnt[r] < cap[r] && !has[(size_t)r * (size_t)E + (size_t)it->logical] &&
                (best < 0 || rows[r] < rows[best]))
                best = r;
        if (best < 0) {
            /* Every rank with a free slot already holds this expert (possible only for the
             * last few physical experts). Some rank q lacks it and is full, and holds an
             * expert x that the free rank f lacks (f holds fewer experts than q): move the
             * last-packed such x from q to f and put this one on q. Lowest q, lowest f. */
            int f = -1, q = -1;
            for (int r = 0; r < ep && f < 0; r++)
                if (cnt[r] < cap[r])
                    f = r;
            for (int r = 0; r < ep && q < 0; r++)
                if (!has[(size_t)r * (size_t)E + (size_t)it->logical])
                    q = r;
            int64_t k = -1;
            for (int64_t s = f >= 0 && q >= 0 ? cnt[q] - 1 : -1; s >= 0 && k < 0; s--)
                if (!has[(size_t)f * (size_t)E + (size_t)slot[first[q] + s]])
                    k = s;
            if (k < 0) { /* unreachable by the argument above */
                st = moe_set_error(ctx, MOE_EINVAL,
                                   "moe_placement_build: balanced found no rank for a replica of logical expert %d",
                                   it->logical);
                goto done;
            }
            const int64_t at_q = first[q] + k, at_f = first[f] + cnt[f]++;
            const int32_t x = slot[at_q];
            const int64_t xw = slot_rows[at_q];
            slot[at_f] = x;
            slot_rows[at_f] = xw;
            has[(size_t)f * (size_t)E + (size_t)x] = 1;
            rows[f] += xw;
            slot[at_q] = it->logical;
            slot_rows[at_q] = w;
            has[(size_t)q * (size_t)E + (size_t)x] = 0;
            has[(size_t)q * (size_t)E + (size_t)it->logical] = 1;
            rows[q] += w - xw;
            continue;
        }
        slot_rows[first[best] + cnt[best]] = w;
        slot[first[best] + cnt[best]++] = it->logical;
        has[(size_t)best * (size_t)E + (size_t)it->logical] = 1;
        rows[best] += w;
    }

    /* 3. Physical order: rank by rank, each rank's experts by logical id. */
    for (int r = 0; r < ep; r++) {
        qsort(slot + first[r], (size_t)cnt[r], sizeof *slot, int32_order);
        memcpy(physical_to_logical + first[r], slot + first[r], sizeof *slot * (size_t)cnt[r]);
        rank_num_physical[r] = (int32_t)cnt[r];
    }
done:
    free(reps);
    free(items);
    free(slot);
    free(slot_rows);
    free(cnt);
    free(rows);
    free(cap);
    free(first);
    free(has);
    return st;
}

moe_status moe_placement_build(moe_ctx *ctx, moe_placement_policy policy, int64_t num_experts, int ep_size,
                               int64_t num_redundant_experts, const int64_t *load, int32_t *physical_to_logical,
                               int32_t *rank_num_physical, moe_placement *out)
{
    const int64_t E = num_experts, R = num_redundant_experts;
    const int ep = ep_size;
    const char *pname = policy == MOE_PLACEMENT_CONTIGUOUS    ? "contiguous"
                        : policy == MOE_PLACEMENT_ROUND_ROBIN ? "round_robin"
                        : policy == MOE_PLACEMENT_BALANCED    ? "balanced"
                                                              : NULL;
    if (!pname)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_placement_build: policy = %d is not a moe_placement_policy (contiguous 0, "
                             "round_robin 1, balanced 2)",
                             (int)policy);
    if (E < 1 || E > INT32_MAX)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_build: num_experts = %lld, need 1 <= num_experts <= 2^31 - 1",
                             (long long)E);
    if (ep < 1 || ep > E)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_placement_build: ep_size = %d, need 1 <= ep_size <= num_experts (%lld): every rank "
                             "holds at least one physical expert only when there are as many",
                             ep, (long long)E);
    if (policy != MOE_PLACEMENT_BALANCED && R != 0)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_placement_build: num_redundant_experts = %lld with policy %s, which places no replicas "
                             "(only balanced takes redundant experts)",
                             (long long)R, pname);
    if (R < 0 || R > E * (int64_t)(ep - 1))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_placement_build: num_redundant_experts = %lld outside [0, num_experts * (ep_size - 1)] "
                             "= [0, %lld] (a rank holds a logical expert at most once)",
                             (long long)R, (long long)(E * (int64_t)(ep - 1)));
    if (E + R > INT32_MAX)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_build: %lld physical experts, over 2^31 - 1",
                             (long long)(E + R));
    if (!physical_to_logical || !rank_num_physical || !out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_build: %s is NULL",
                             !physical_to_logical ? "physical_to_logical" : !rank_num_physical ? "rank_num_physical" : "out");
    if (policy == MOE_PLACEMENT_BALANCED) {
        if (!load)
            return moe_set_error(ctx, MOE_EINVAL, "moe_placement_build: policy balanced needs load [num_experts], got NULL");
        for (int64_t e = 0; e < E; e++)
            if (load[e] < 0 || load[e] > MOE_LOAD_MAX)
                return moe_set_error(ctx, MOE_EINVAL, "moe_placement_build: load[%lld] = %lld: counts must be in [0, 2^40]",
                                     (long long)e, (long long)load[e]);
    }

    if (policy == MOE_PLACEMENT_CONTIGUOUS) {
        for (int r = 0; r < ep; r++) {
            const int64_t f = moe_split_first(E, ep, r), n = moe_split_count(E, ep, r);
            rank_num_physical[r] = (int32_t)n;
            for (int64_t i = 0; i < n; i++)
                physical_to_logical[f + i] = (int32_t)(f + i);
        }
    } else if (policy == MOE_PLACEMENT_ROUND_ROBIN) {
        int64_t at = 0;
        for (int r = 0; r < ep; r++) {
            int32_t n = 0;
            for (int64_t e = r; e < E; e += ep, n++)
                physical_to_logical[at++] = (int32_t)e;
            rank_num_physical[r] = n;
        }
    } else {
        moe_status st = build_balanced(ctx, E, ep, R, load, physical_to_logical, rank_num_physical);
        if (st != MOE_OK)
            return st;
    }
    out->ep_size = ep;
    out->num_logical_experts = (int32_t)E;
    out->num_physical_experts = (int32_t)(E + R);
    out->physical_to_logical = physical_to_logical;
    out->rank_num_physical = rank_num_physical;
    return MOE_OK;
}

moe_status moe_placement_rank_rows(moe_ctx *ctx, const moe_placement *p, const int64_t *load, int64_t *out,
                                   double *imbalance)
{
    if (!p || !load || !out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_rank_rows: %s is NULL", !p ? "p" : !load ? "load" : "out");
    const int ep = p->ep_size;
    const int64_t E = p->num_logical_experts, P = p->num_physical_experts;
    if (ep < 1 || E < 1 || P < E || !p->physical_to_logical || !p->rank_num_physical)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_placement_rank_rows: placement with ep_size %d, %lld logical and %lld physical "
                             "experts%s is not a placement",
                             ep, (long long)E, (long long)P,
                             !p->physical_to_logical || !p->rank_num_physical ? " (NULL arrays)" : "");
    int64_t sum = 0;
    for (int r = 0; r < ep; r++) {
        if (p->rank_num_physical[r] < 0)
            return moe_set_error(ctx, MOE_EINVAL, "moe_placement_rank_rows: rank_num_physical[%d] = %d is negative", r,
                                 p->rank_num_physical[r]);
        sum += p->rank_num_physical[r];
    }
    if (sum != P)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_placement_rank_rows: rank_num_physical sums to %lld, num_physical_experts is %lld",
                             (long long)sum, (long long)P);
    for (int64_t e = 0; e < E; e++)
        if (load[e] < 0 || load[e] > MOE_LOAD_MAX)
            return moe_set_error(ctx, MOE_EINVAL, "moe_placement_rank_rows: load[%lld] = %lld: counts must be in [0, 2^40]",
                                 (long long)e, (long long)load[e]);
    int64_t *reps = calloc((size_t)E, sizeof *reps); /* [E] replicas of each logical expert */
    int64_t *seen = calloc((size_t)E, sizeof *seen); /* [E] replicas met so far in physical order */
    if (!reps || !seen) {
        free(reps);
        free(seen);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_placement_rank_rows: out of memory");
    }
    moe_status st = MOE_OK;
    for (int64_t i = 0; i < P && st == MOE_OK; i++) {
        const int32_t e = p->physical_to_logical[i];
        if (e < 0 || e >= E)
            st = moe_set_error(ctx, MOE_EINVAL,
                               "moe_placement_rank_rows: physical expert %lld holds logical expert %d, outside [0, %lld)",
                               (long long)i, e, (long long)E);
        else
            reps[e]++;
    }
    for (int64_t e = 0; e < E && st == MOE_OK; e++)
        if (reps[e] == 0)
            st = moe_set_error(ctx, MOE_EINVAL, "moe_placement_rank_rows: logical expert %lld has no physical expert",
                               (long long)e);
    if (st == MOE_OK) {
        int64_t at = 0, total = 0, max = 0;
        for (int r = 0; r < ep; r++) {
            int64_t rows = 0;
            for (int32_t i = 0; i < p->rank_num_physical[r]; i++, at++) {
                const int32_t e = p->physical_to_logical[at];
                rows += replica_rows(load[e], reps[e], seen[e]++);
            }
            out[r] = rows;
            total += rows;
            if (rows > max)
                max = rows;
        }
        if (imbalance)
            *imbalance = total > 0 ? (double)max / ((double)total / (double)ep) : 1.0;
    }
    free(reps);
    free(seen);
    return st;
}
