/* Expert and tensor parallelism (moe_parallel.h "Parallelism", DESIGN.md section 7): the interface the
 * layer room (src/layer) uses. Every MPI call of the library lives in src/parallel (mpi.c, ep.c); without MPI
 * (MOE_WITH_MPI off) stub.c gives the same symbols and only one-process plans exist. */
#ifndef MOE_PARALLEL_PARALLEL_H
#define MOE_PARALLEL_PARALLEL_H

#include "core/stage.h"

/* The contiguous split of n items over `parts` used for experts (EP), intermediate columns
 * (TP) and reduce-scatter rows: part r gets n / parts items, plus one when r < n % parts. */
static inline int64_t moe_split_count(int64_t n, int64_t parts, int64_t r)
{
    return n / parts + (r < n % parts ? 1 : 0);
}

/* First item of part r. */
static inline int64_t moe_split_first(int64_t n, int64_t parts, int64_t r)
{
    return r * (n / parts) + (r < n % parts ? r : n % parts);
}

/* The part holding item i, or -1 when i is outside [0, n). */
static inline int64_t moe_split_owner(int64_t n, int64_t parts, int64_t i)
{
    if (i < 0 || i >= n)
        return -1;
    const int64_t q = n / parts, rem = n % parts;
    if (i < rem * (q + 1))
        return i / (q + 1);
    return rem + (i - rem * (q + 1)) / q;
}

/* Bounds of a placement (moe_placement_check, the placement file reader): every count stays
 * in int32 and every array allocation small. */
#define PLACEMENT_MAX_RANKS 65536
#define PLACEMENT_MAX_EXPERTS (1 << 20)

/* This rank's share of layer d under `par` (ranks already resolved): the experts of
 * par->placement on par->ep_rank (logical pointing into it), or with placement NULL the
 * contiguous split (logical NULL). */
void moe_par_shard(const moe_layer_desc *d, const moe_parallel_config *par, moe_shard *out);

/* 1 when placement p (valid) is the contiguous one of its E and ep_size. */
int moe_placement_is_contiguous(const moe_placement *p);

/* XXH64 of a placement's ep_size, E, P, rank_num_physical and physical_to_logical (the plan
 * text's placement=<hash>). */
uint64_t moe_placement_hash(const moe_placement *p);

/* Deep copy of a valid placement src into *dst (arrays malloc'ed; free with
 * moe_placement_clear). Returns 0, or -1 when out of memory (dst then cleared). */
int moe_placement_copy(moe_placement *dst, const moe_placement *src);

/* The routing tables of a valid placement (core/stage.h moe_ep_map). Returns 0, or -1 when out
 * of memory (out then cleared). moe_ep_map_free frees them (twice is harmless). */
int moe_ep_map_build(const moe_placement *p, moe_ep_map *out);
void moe_ep_map_free(moe_ep_map *m);

/* Parallel plan creation, collective over the user's communicator `user_comm` (a pointer to
 * an MPI_Comm, NULL = MPI_COMM_WORLD): duplicate it, exchange and compare moe_plan_hash /
 * moe_plan_text and the coordinates, resolve ranks of -1, build the EP and TP
 * sub-communicators and the plan's exchange scratch. On success p->mpi is set and p->par's
 * ranks are resolved (p->shard must be computed afterwards). Errors are recorded on
 * p->ctx: MOE_EINVAL (a mismatch or bad coordinates, named), MOE_ETIMEOUT, MOE_EMPI,
 * MOE_ENOMEM; MOE_EUNSUPPORTED without MPI. */
moe_status moe_par_create(moe_stage *p, const char *text, uint64_t hash, void *user_comm);
void moe_par_free(struct moe_par *m);

/* Bytes of workspace the parallel stages need for chunks of up to Tc tokens on this rank
 * (EP send and receive buffers, the rows received from peers, TP partial and gather
 * buffers). 0 for one-process plans. */
size_t moe_par_workspace_bytes(const moe_stage *p, int64_t Tc);

/* The start of a parallel execute, collective over all of the plan's ranks: each rank gives
 * its status so far (`local`, with the message already recorded on the ctx when not
 * MOE_OK), its n_tokens and the longest chunk its workspace fits (`ws_tokens`). Every rank
 * then fails the same way when any rank failed (naming it), when the ranks of a TP group
 * disagree on n_tokens, or when some rank's workspace is smaller than the agreed chunk.
 * On success: *tc_max = min(max n_tokens over ranks, chunk size), the chunk length every
 * rank uses; *n_chunks = chunks every rank runs (a rank out of tokens runs empty ones);
 * *max_tokens = max n_tokens. */
moe_status moe_par_begin(const moe_stage *p, moe_status local, int64_t n_tokens, int64_t ws_tokens,
                         int64_t *tc_max, int64_t *n_chunks, int64_t *max_tokens);

/* TP: sum the partial outputs c->out [c->T, H] of the TP group deterministically (moe.h
 * "Parallelism") into `rows` [c->T, H] f32, the output rows [t0, t0 + c->T) of the execute
 * (only the rank's own rows under MOE_TP_REDUCE=reduce_scatter; T is the execute's
 * n_tokens). */
moe_status moe_par_tp_reduce(moe_chunk *c, int64_t t0, int64_t T, float *rows);

/* moe_plan_gather_load: sum local [E] (E = p->desc.num_experts, int64 expert load) over the
 * EP group of this rank (the ranks with its tp_rank) into total [E], on every rank; local
 * may equal total (in place). One-process plans (p->mpi NULL): a copy. Collective,
 * nonblocking and polled against timeout_s. Errors recorded on p->ctx: MOE_ETIMEOUT,
 * MOE_EMPI (a broken plan included), MOE_EINVAL (E too large for one MPI call). */
moe_status moe_par_gather_load(const moe_stage *p, const int64_t *local, int64_t *total);

/* moe_plan_rebalance on a parallel plan (moe_parallel.h): MOE_ETIMEOUT when an earlier
 * rebalance of the plan timed out, MOE_EMPI when the plan is broken, else MOE_OK (recorded on
 * p->ctx). */
moe_status moe_par_rebalance_usable(const moe_stage *p);

/* The agreement of a rebalance to `next`, collective over all of the plan's ranks on the
 * plan's rebalance communicator: each rank gives its status so far (`local`, its message
 * already recorded when not MOE_OK); every rank returns MOE_OK only when every rank staged
 * (local MOE_OK) the same next (by moe_placement_hash; a difference is MOE_EINVAL naming the
 * first differing entry, the placements exchanged) and every rank then confirmed (a second
 * round). A timeout in the first round marks only the rebalance communicator unusable (the
 * plan still executes); one in the confirming round marks the plan broken. Errors recorded
 * on p->ctx: the failing rank's status (named), MOE_EINVAL, MOE_ETIMEOUT, MOE_EMPI,
 * MOE_ENOMEM. */
moe_status moe_par_rebalance_agree(const moe_stage *p, const moe_placement *next, moe_status local);

/* The plan's placement and routing tables (p->epmap) changed: update the MPI state derived
 * from them (the fullest rank's physical experts). */
void moe_par_placement_changed(const moe_stage *p);

/* The rows [*begin, *end) of T whose output this rank writes (moe_plan_tp_rows). */
void moe_par_tp_rows(const moe_stage *p, int64_t T, int64_t *begin, int64_t *end);

#endif
