/*
 * libmoe: expert and tensor parallelism over MPI (configuration, placement queries).
 *
 * Part of the public API. Include moe.h, which includes this header where its types are
 * needed; this file also works on its own (it includes moe.h first).
 */
#include "moe.h"

#ifndef MOE_PARALLEL_H
#define MOE_PARALLEL_H

#ifdef __cplusplus
extern "C" {
#endif

/* MOE_API marks the public functions: the only symbols libmoe.so exports (the library is
 * built with -fvisibility=hidden; tests/exports.sh checks the export list against these
 * headers). Define MOE_API before including to override (e.g. empty). */
#ifndef MOE_API
#if defined(__GNUC__) || defined(__clang__)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif
#endif

/* ---------------------------------------------------------------------------------------
 * Parallelism: expert (EP) and tensor (TP) parallelism over MPI (DESIGN.md section 7).
 *
 * A parallel plan spans ep_size * tp_size MPI processes ("ranks"). Every rank creates the
 * plan from the same description, knobs and composition, with its own coordinates
 * (ep_rank, tp_rank), and packs only its own share of the weights.
 *
 *  - EP: experts are placed contiguously. EP rank r holds E / ep_size experts, plus one when
 *    r < E % ep_size (128 experts on 6 ranks: 22,22,21,21,21,21), global ids
 *    [first_r, first_r + count_r); moe_plan_expert_map() gives the global -> local map. Each
 *    EP rank brings its own tokens (n_tokens may differ per rank: data-parallel attention
 *    feeding EP is the normal case). A rank routes its tokens (the router is replicated),
 *    sends each (token, k) row and the local id of expert ids[t][k] to the rank that holds
 *    it, runs its experts on the rows it receives (grouped by local expert, stable), sends
 *    the expert outputs back and combines them locally in top-k order. Each row's expert
 *    output is computed by the same kernel in the same order as in one process and the
 *    combine order is unchanged, so with dispatch_dtype F32 the output is bit-identical to
 *    one process (numerics contract 3 holds across ep_size). An expert id outside every
 *    rank's range is an error (MOE_EINVAL on every rank), never dropped.
 *  - TP: every expert's intermediate dimension is split: tp_rank t holds the columns
 *    [i0_t, i0_t + I_t) of the gate/up rows and down columns, I_t = I / tp_size plus one when
 *    t < I % tp_size (an uneven split, no padding), and the same split of the shared
 *    expert's I_s (b_g, b_u follow the split; b_d is added by tp_rank 0 only). Each rank
 *    computes the partial layer output over its columns (routed sum and shared expert, the
 *    same combine), and the ranks of a TP group sum the partials deterministically: every
 *    element as ((p_0 + p_1) + p_2) + ... in tp_rank order, the same expression on every rank
 *    and for both all-reduce algorithms, so TP output is bit-for-bit reproducible run to run
 *    and identical on every rank of the group. The split changes the order of the down
 *    projection's sum, so TP output matches one process within the f32 bound
 *    (max |tp - one| <= 1e-5 max |one|; tests/mpi), not bit for bit. Knobs:
 *      MOE_SMALL_ALLREDUCE: below this many bytes per chunk (Tc * H * 4) the partials are
 *        all-gathered and summed by every rank; at or above, each rank sums one contiguous
 *        slice of the elements (reduce-scatter) and the slices are all-gathered;
 *      MOE_TP_REDUCE=reduce_scatter: output sharded over tokens. tp_rank t receives the
 *        rows [r0_t, r0_t + n_t) of the execute's T tokens, n_t = T / tp_size plus one when
 *        t < T % tp_size (r0_t the sum of the earlier n), written at their own place in
 *        output[T, H]; the other rows of output are not written. moe_plan_tp_rows() gives
 *        the range. topk_ids and topk_weights are written in full on every rank.
 *  - TP x EP: rank (ep_rank, tp_rank) holds the experts of ep_rank at I shard tp_rank. The
 *    dispatch runs among the ranks with the same tp_rank, the TP sum among the ranks with the
 *    same ep_rank (a TP group shares its tokens).
 *  - Shared expert (R17): under EP every rank runs it for its own tokens; under TP it is split
 *    like the experts and summed by the reduction: it is added exactly once.
 *
 * Plan creation is collective over `comm`: the ranks exchange moe_plan_hash() and
 * moe_plan_text() (description, knobs and composition, without the coordinates) and their
 * coordinates. A mismatch fails on every rank with MOE_EINVAL naming the first differing
 * key and both values (rank 0's and the differing rank's), as do duplicate or out-of-range
 * coordinates and a communicator whose size is not ep_size * tp_size. Every collective is
 * nonblocking and polled against timeout_s: a rank that never arrives, hangs or dies gives
 * MOE_ETIMEOUT on the others instead of a hang.
 *
 * moe_plan_execute_ex on a parallel plan is collective over the plan's ranks:
 *  - every rank calls it the same number of times, in the same order, never concurrently on
 *    one plan; also with n_tokens = 0 (hidden_states and output may then be NULL): the
 *    rank still runs its experts for its peers;
 *  - the ranks of a TP group pass the same tokens (hidden_states, router_logits, n_tokens);
 *  - the workspace must be moe_plan_workspace_size(plan, M) bytes where M >= the most tokens
 *    ANY rank passes to that execute (it sizes the rows received from peers);
 *  - a rank whose arguments are invalid, or whose workspace is too small for the chunk its
 *    peers use, fails and makes every rank fail (the message names the rank), before any
 *    data moves; a peer that dies or stops calling gives MOE_ETIMEOUT within timeout_s, an
 *    MPI failure MOE_EMPI. Collectives cannot be cancelled: after MOE_ETIMEOUT or MOE_EMPI
 *    the plan is unusable (every later execute fails with MOE_EMPI) and the usual recovery
 *    is MPI_Abort by the application (the library never calls it).
 * The caller initializes MPI (MPI_Init, or MPI_Init_thread with at least
 * MPI_THREAD_FUNNELED: libmoe calls MPI only from the thread that calls it) before creating a
 * parallel plan and finalizes it only after freeing the plan. Without MPI (CMake option
 * MOE_WITH_MPI=OFF, moe_mpi_available() = 0) the same symbols exist and only
 * ep_size = tp_size = 1 works; anything else is MOE_EUNSUPPORTED naming the option.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_parallel_config {
    int ep_size;    /* expert-parallel ranks, 1 <= ep_size <= E; default 1 */
    int ep_rank;    /* this rank's EP coordinate in [0, ep_size); -1 = from the rank r in
                       comm: r / tp_size. Default 0 */
    int tp_size;    /* tensor-parallel ranks, 1 <= tp_size <= I (and <= I_s with a shared
                       expert); default 1 */
    int tp_rank;    /* in [0, tp_size); -1 = from comm: r % tp_size (TP ranks adjacent, as
                       vLLM places them). Default 0 */
    int dp_size;    /* informational (vLLM's data-parallel attention ranks feeding EP: each
                       brings its own tokens, which EP already allows); >= 1, default 1 */
    int dp_rank;    /* in [0, dp_size); default 0 */
    void *comm;     /* pointer to an MPI_Comm holding exactly the ep_size * tp_size ranks
                       (borrowed during moe_plan_create_ex, which duplicates it); NULL =
                       MPI_COMM_WORLD */
    int low_latency;/* 1: the batched format (MOE_PF_EP_BATCHED when ep_size > 1, else
                       MOE_PF_LOCAL_BATCHED, with MOE_EXPERTS_BATCHED), whatever
                       prepare_finalize and experts say. Instead of a count exchange plus
                       MPI_Alltoallv, one MPI_Alltoall of fixed-size blocks each way: per
                       destination cap * min(K, ceil(E / ep_size)) row slots, cap = the
                       execute's longest chunk; the receiver runs the experts on batched
                       slots [E_local, ep_size * cap]. Chunks are cut to batched_capacity
                       tokens, so neither a block nor an expert's slots can overflow (an
                       overflow would fail every rank; no row is ever dropped). Fewer
                       collectives, more bytes (the whole block is sent). Default 0 */
    moe_dtype dispatch_dtype; /* the activations sent by the EP dispatch: F32 (default,
                       exact, bit-identical to one process); F8_E4M3 (e4m3fn, per-row
                       scale max|x| / 448: each element rounded to 4 significant bits,
                       relative error <= 2^-4, elements below max|x| * 2^-9 / 448 flushed
                       toward 0) or I8 (per-row scale max|x| / 127: absolute error <= max|x|
                       / 254 per element) cut the dispatched bytes about 4x. Lossy: on
                       random layers (H = 256, tests/mpi "quant") the layer output moves by
                       3.2% (F8_E4M3) and 0.41% (I8) of max |output| (asserted below 5% and
                       1%), against 0 for F32; routing is unaffected (it precedes the
                       dispatch); a row holding Inf or NaN becomes NaN. Expert outputs always
                       return in f32. Needs ep_size > 1 */
    double timeout_s;  /* seconds a collective may wait for the peers before MOE_ETIMEOUT;
                          > 0, default 300 (a peer still packing weights is indistinguishable
                          from a dead one: allow for the slowest load) */
} moe_parallel_config;

/* 1 when libmoe was built with MPI (CMake option MOE_WITH_MPI), else 0. */
MOE_API int moe_mpi_available(void);

/* The parallel configuration of the plan, resolved (ranks of -1 replaced by the derived
 * coordinates; comm is NULL). Valid while the plan lives. */
MOE_API const moe_parallel_config *moe_plan_parallel(const moe_plan *plan);

/* Fill out [E] (the description's num_experts) with the local id of each global expert id on
 * this rank, or -1 when another EP rank holds it. One process: the identity.
 * Errors: MOE_EINVAL (NULL argument). */
MOE_API moe_status moe_plan_expert_map(const moe_plan *plan, int32_t *out);

/* The rows [*begin, *end) of an execute of n_tokens tokens whose output this rank writes:
 * its tp_rank's share under MOE_TP_REDUCE=reduce_scatter with tp_size > 1, else [0, n_tokens). */
MOE_API void moe_plan_tp_rows(const moe_plan *plan, int64_t n_tokens, int64_t *begin, int64_t *end);

#ifdef __cplusplus
}
#endif

#endif /* MOE_PARALLEL_H */
