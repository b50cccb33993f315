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
 *  - EP: experts are placed contiguously by default (parallel.placement NULL: the
 *    contiguous placement of "Expert placement" below, which moe_plan_placement returns);
 *    any valid placement runs (replicas included, docs/parallel.md). Contiguous: EP rank r
 *    holds E / ep_size experts, plus one when r < E % ep_size (128 experts on 6 ranks:
 *    22,22,21,21,21,21), global ids [first_r, first_r + count_r); in general its physical
 *    experts; moe_plan_expert_map() gives the logical -> local map. Each
 *    EP rank brings its own tokens (n_tokens may differ per rank: data-parallel attention
 *    feeding EP is the normal case). A rank routes its tokens (the router is replicated),
 *    sends each (token, k) row and the local id of its physical expert (the replica rule
 *    below picks one of logical expert ids[t][k]'s replicas) to the rank that holds
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
                       destination cap * min(K, emax) row slots (emax: the most physical
                       experts one rank holds, ceil(E / ep_size) when contiguous), cap = the
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
    const struct moe_placement *placement; /* EP expert placement (see "Expert placement"
                          below), borrowed during moe_plan_create_ex (the plan copies it);
                          NULL = contiguous. Needs ep_size > 1 unless it is the identity */
} moe_parallel_config;

/* ---------------------------------------------------------------------------------------
 * Expert placement (EP load balance; vLLM's EPLB vocabulary).
 *
 * The E experts of the description are the logical experts. A placement lays P >= E
 * physical experts over the ep_size ranks, P = E + num_redundant_experts: physical experts
 * are numbered rank by rank, rank r holding the rank_num_physical[r] physical experts that
 * follow those of ranks 0 .. r-1, and physical expert p holds the weights of logical expert
 * physical_to_logical[p]. A logical expert with c >= 2 physical experts has c replicas; its
 * replicas are listed in physical order. On rank r, local expert i is physical expert
 * (first physical of r) + i.
 *
 * Valid (moe_placement_check; plan creation checks the same and names the entry): ep_size
 * equals parallel.ep_size; num_logical_experts equals the description's num_experts;
 * E <= P <= E * ep_size; every rank_num_physical[r] >= 0 and they sum to P; every
 * physical_to_logical[p] in [0, E); every logical expert held at least once; no logical
 * expert twice on one rank. A rank may hold no expert. With ep_size = 1 only the identity
 * (physical expert p holds logical p) is valid: a one-process plan has one placement.
 *
 * Replica choice (deterministic, the same on every run): the (token t, slot k) row of a
 * rank's execute, t counted from 0 over the execute's tokens on that rank, whose logical
 * expert e has c replicas, goes to replica (t + ep_rank) mod c. Every replica computes a row
 * with the same kernel in the same order, so with dispatch_dtype F32 the output stays
 * bit-identical to one process whatever the placement.
 *
 * The plan text and hash include a non-contiguous placement (`placement=<hash>;`, the
 * XXH64 of ep_size, E, P, rank_num_physical and physical_to_logical; the contiguous one adds
 * nothing, so its plans keep their text), so ranks given different placements fail plan
 * creation together within timeout_s (MOE_EINVAL naming the first EP rank count or physical
 * expert that differs between rank 0 and the differing rank, with both values: the ranks
 * exchange the arrays once the texts show the difference).
 *
 * Weights: moe_weights_create (and moe_checkpoint_load_weights) read only this rank's
 * logical experts from the source (indexed by logical id) and pack each physical expert
 * once: a replica costs one expert's packed bytes on its rank. moe_plan_report_for follows
 * the configuration's placement (expert_first is then the rank's first physical expert).
 * ------------------------------------------------------------------------------------- */
/* The largest expert-load count the load functions take (2^40 rows, about 1.1e12): sums over
 * up to 2^20 experts and products with replica counts then stay inside int64. */
#define MOE_LOAD_MAX ((int64_t)1 << 40)

typedef struct moe_placement {
    int32_t ep_size;               /* ranks the placement spans */
    int32_t num_logical_experts;   /* E, the description's num_experts */
    int32_t num_physical_experts;  /* P = E + num_redundant_experts */
    int32_t *physical_to_logical;  /* [P] logical expert of each physical expert, rank by rank */
    int32_t *rank_num_physical;    /* [ep_size] physical experts on each rank, sum P */
} moe_placement;

typedef enum moe_placement_policy {
    MOE_PLACEMENT_CONTIGUOUS = 0,  /* today's split: rank r holds E / ep_size experts, plus one
                                      when r < E % ep_size, in id order; no redundancy */
    MOE_PLACEMENT_ROUND_ROBIN = 1, /* logical expert e on rank e mod ep_size; no redundancy */
    MOE_PLACEMENT_BALANCED = 2     /* from measured load with num_redundant_experts extra
                                      physical experts (the scheme DeepSeek's EPLB describes):
                                      each extra replica goes to the logical expert with the
                                      highest load per replica (ties to the lower id), then the
                                      physical experts, heaviest first (load / replicas, ties
                                      to the lower logical id, then the lower replica), go to
                                      the rank with the least load so far that has a free slot
                                      and no replica of that expert (ties to the lower rank);
                                      rank r has P / ep_size slots, plus one when
                                      r < P % ep_size */
} moe_placement_policy;

/* Check a placement against num_experts and ep_size (rules above). Errors: MOE_EINVAL naming
 * the first offending entry (for example "physical expert 17 (rank 2) repeats logical expert
 * 5 on that rank"), recorded on ctx (ctx may be NULL: the status only). */
MOE_API moe_status moe_placement_check(moe_ctx *ctx, const moe_placement *p, int64_t num_experts,
                               int ep_size);

/* Build a placement by `policy` into caller arrays: physical_to_logical [E + num_redundant]
 * and rank_num_physical [ep_size]; out's fields are set to point at them. load [E] (routed
 * rows per logical expert, each >= 0) is needed for BALANCED and ignored by the others;
 * num_redundant_experts must be 0 for CONTIGUOUS and ROUND_ROBIN, and in
 * [0, E * (ep_size - 1)] for BALANCED. Errors: MOE_EINVAL (named argument). */
MOE_API moe_status moe_placement_build(moe_ctx *ctx, moe_placement_policy policy, int64_t num_experts,
                               int ep_size, int64_t num_redundant_experts, const int64_t *load,
                               int32_t *physical_to_logical, int32_t *rank_num_physical,
                               moe_placement *out);

/* Rows each rank's experts would run under placement p for a routed load [E] (rows per
 * logical expert over the whole EP group), replicas splitting their expert's rows as evenly
 * as the replica rule does in the long run (an expert's rows / c each, the remainder to its
 * first replicas): out [ep_size]. imbalance = max(out) / mean(out) (1 when all are 0). */
MOE_API moe_status moe_placement_rank_rows(moe_ctx *ctx, const moe_placement *p, const int64_t *load,
                                   int64_t *out, double *imbalance);

/* A placement file (docs/parallel.md): JSON {"ep_size": N, "num_logical_experts": E,
 * "ranks": [[logical ids of rank 0's physical experts], ...]}. moe_placement_read allocates
 * out's arrays (free them with moe_placement_clear) and checks the file (moe_placement_check
 * with its own ep_size and E; the caller compares those with the plan's). Errors:
 * MOE_ENOTFOUND (no such file), MOE_EIO,
 * MOE_EFORMAT (bad JSON, a missing or mistyped field, named with its path), MOE_EINVAL,
 * MOE_ENOMEM. moe_placement_write writes p (atomically: a temporary file renamed). */
MOE_API moe_status moe_placement_read(moe_ctx *ctx, const char *path, moe_placement *out);
MOE_API moe_status moe_placement_write(moe_ctx *ctx, const char *path, const moe_placement *p);
MOE_API void moe_placement_clear(moe_placement *p);

/* A load file: JSON {"num_logical_experts": E, "load": [E non-negative integers]} (moe bench
 * --ep writes one). Reads into load [num_experts]; a length other than num_experts or a
 * negative / non-integer count is MOE_EFORMAT naming the entry. */
MOE_API moe_status moe_load_read(moe_ctx *ctx, const char *path, int64_t num_experts, int64_t *load);
MOE_API moe_status moe_load_write(moe_ctx *ctx, const char *path, const int64_t *load, int64_t num_experts);

/* The plan's placement (the contiguous one built at creation when none was given). Valid
 * while the plan lives and until the next moe_plan_rebalance. */
MOE_API const moe_placement *moe_plan_placement(const moe_plan *plan);

/* Sum per-logical-expert loads [E] (as accumulated in moe_exec_args.expert_load) over the
 * ranks of this rank's EP group (the ranks with the same tp_rank; a TP group shares its
 * tokens, so summing over it would count them tp_size times) into total [E], on every rank.
 * Collective over the plan's ranks, polled against timeout_s. One process: a copy.
 * Errors: MOE_EINVAL, MOE_ETIMEOUT, MOE_EMPI. */
MOE_API moe_status moe_plan_gather_load(const moe_plan *plan, const int64_t *local, int64_t *total);

/* What a rebalance did on this rank. */
typedef struct moe_rebalance_report {
    int64_t experts_kept;   /* local physical experts whose packed weights were reused */
    int64_t experts_packed; /* local physical experts packed anew (the ones that moved here) */
    int64_t experts_freed;  /* local physical experts dropped */
    size_t bytes_packed;    /* packed bytes written for the new experts */
    size_t bytes_resident;  /* expert bytes resident on this rank afterwards */
    double seconds;         /* wall time on this rank, the agreement included */
} moe_rebalance_report;

/* Move a parallel plan and its weights to placement `next` between executes, collective over
 * the plan's ranks (never concurrently with an execute on the plan). Every rank passes the
 * same `next` (checked by hash: a difference fails every rank, naming the entry) and the
 * source of the weights again (`src` as for moe_weights_create, indexing experts by logical
 * id; only the experts that move to this rank are read: the weights are re-read from the
 * source, not sent rank to rank; the pointers of other experts, the router, its biases and
 * the shared expert are not read and may be NULL). Experts this rank already holds keep
 * their packed bytes.
 * The switch is atomic across ranks: each rank packs what it needs beside the current
 * weights, the ranks agree, and only then does every rank switch (plan placement, text and
 * hash, and weights) before returning; if any rank fails, or a rank never arrives within
 * timeout_s (a rebalance called on one rank only), every rank that returns keeps the old
 * placement and weights intact (MOE_ETIMEOUT / the peer's error, named) and the staged
 * experts are freed. The rebalance memory peak is the current bytes plus the new experts'.
 * report may be NULL. Errors: MOE_EINVAL (next invalid or differing, weights of another
 * plan), MOE_ENOMEM, MOE_ETIMEOUT, MOE_EMPI, and the errors of moe_weights_create.
 * Status: a one-process plan's rebalance to the identity is a no-op success (anything else
 * MOE_EINVAL). A parallel plan's runs as above (docs/parallel.md "Rebalance"): the ranks
 * agree on a communicator of the plan's own (duplicated at plan creation), so a timed-out
 * rebalance never disturbs executes: after MOE_ETIMEOUT the plan keeps its placement and
 * still executes, but every later rebalance of it fails at once with MOE_ETIMEOUT ("an
 * earlier rebalance on this plan timed out"; its exchange is still pending and cannot be
 * cancelled; moe_plan_free and MPI_Finalize leave it to MPI). A timeout in the final
 * confirming round (a peer lost between the two rounds) marks the plan broken (executes
 * MOE_EMPI). The kept experts' packed buffers move into the new layout (no repack); re-query
 * moe_plan_workspace_size afterwards (a rank may hold more experts). */
/* moe.h defines these after including this header: declared here by tag. */
struct moe_weights;
struct moe_weight_source;
MOE_API moe_status moe_plan_rebalance(moe_plan *plan, struct moe_weights *weights, const moe_placement *next,
                              const struct moe_weight_source *src, moe_rebalance_report *report);

/* 1 when libmoe was built with MPI (CMake option MOE_WITH_MPI), else 0. */
MOE_API int moe_mpi_available(void);

/* The parallel configuration of the plan, resolved (ranks of -1 replaced by the derived
 * coordinates; comm is NULL). Valid while the plan lives. */
MOE_API const moe_parallel_config *moe_plan_parallel(const moe_plan *plan);

/* Fill out [E] (the description's num_experts) with the local id of each logical expert on
 * this rank (the local physical expert holding it; a rank holds a logical expert at most
 * once), or -1 when this rank holds none of its replicas. One process: the identity.
 * Errors: MOE_EINVAL (NULL argument). */
MOE_API moe_status moe_plan_expert_map(const moe_plan *plan, int32_t *out);

/* The rows [*begin, *end) of an execute of n_tokens tokens whose output this rank writes:
 * its tp_rank's share under MOE_TP_REDUCE=reduce_scatter with tp_size > 1, else [0, n_tokens). */
MOE_API void moe_plan_tp_rows(const moe_plan *plan, int64_t n_tokens, int64_t *begin, int64_t *end);

#ifdef __cplusplus
}
#endif

#endif /* MOE_PARALLEL_H */
