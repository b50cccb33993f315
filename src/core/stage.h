/* The stage contract (DESIGN.md section 6, the modular kernel): the data the orchestrator
 * (src/layer) hands to the stages it composes, and the interfaces they implement. Types only,
 * no code: every stage stands on it, and none reaches up into the orchestrator. A plan
 * composes one prepare/finalize and one experts implementation; each declares the activation
 * format it produces or consumes, and moe_plan_create_ex refuses a mismatched pair. Local
 * prepare/finalize implementations live in src/permute/prepare_finalize.c, the expert-parallel
 * (MPI) ones in src/parallel/ep.c, the experts in src/gemm/experts.c. */
#ifndef MOE_CORE_STAGE_H
#define MOE_CORE_STAGE_H

#include "core/internal.h"

/* Bytes of a plan's canonical text (moe_plan_text), compared across ranks. */
#define MOE_PLAN_TEXT_LEN 4096

/* This rank's share of a layer (src/parallel/shard.c computes it): one process holds
 * everything (p0 = 0, n_experts = E, logical the identity, i0 = is0 = 0, I = desc I,
 * Is = desc I_s). */
typedef struct moe_shard {
    int64_t p0, n_experts;   /* local experts: physical experts [p0, p0 + n_experts) of the
                                placement (moe_parallel.h "Expert placement") */
    const int32_t *logical;  /* [n_experts] the logical expert of each local expert (its
                                weights), borrowed from the placement (the weights hold their
                                own copy); NULL = p0 + i (the contiguous placement) */
    int64_t i0, I;           /* columns [i0, i0 + I) of each expert's intermediate dim */
    int64_t is0, Is;         /* columns [is0, is0 + Is) of the shared expert's (Is = 0: none) */
    int down_bias;           /* 1: this rank adds b_d (tp_rank 0) */
} moe_shard;

/* The logical expert of local expert i of shard sh. */
static inline int64_t moe_shard_logical(const moe_shard *sh, int64_t i)
{
    return sh->logical ? (int64_t)sh->logical[i] : sh->p0 + i;
}

/* The EP dispatch's view of a placement (src/parallel/placement.c builds it): where each
 * (token, k) row of a logical expert goes. Replica j of logical expert e is physical expert
 * replica_phys[replica_off[e] + j] (physical order); physical expert q lives on EP rank
 * phys_rank[q] as its local expert phys_local[q]. */
typedef struct moe_ep_map {
    int32_t *replica_off;  /* [E + 1] */
    int32_t *replica_phys; /* [P] physical experts grouped by logical expert */
    int32_t *phys_rank;    /* [P] owning EP rank */
    int32_t *phys_local;   /* [P] local expert id on that rank */
    int64_t emax;          /* the most physical experts one rank holds */
    int contiguous;        /* 1: the contiguous placement (no replicas, id order) */
} moe_ep_map;

/* The knobs of an execute that never change the output bits (DESIGN.md section 5,
 * docs/tuning.md): the context's (chunk size clamped by the plan), or the entry of a tuning
 * file that the execute's token count selects (src/layer/tuning.c). */
typedef struct moe_exec_knobs {
    int64_t tokens;           /* the tuning entry's token count; 0: the context's knobs */
    int64_t chunk_size;       /* tokens per chunk, >= 1 */
    int permute;              /* MOE_PERMUTE_* (core/knobs.h) */
    int64_t onehot_threshold; /* routed rows; permute auto picks onehot at or below */
    int topk;                 /* moe_topk_method (route/route.h) */
    int64_t lowtok_threshold; /* rows per expert below which the few-token path runs */
} moe_exec_knobs;

/* Entries of one tuning file at most. */
#define MOE_TUNED_MAX 64

/* What every stage reads of a plan: filled once at plan creation (src/layer/plan.c; the
 * parallel fields by src/parallel), read-only in execute. */
typedef struct moe_stage {
    moe_ctx *ctx;                /* borrowed; errors are recorded here */
    moe_layer_desc desc;         /* the whole layer, as the caller described it */
    moe_parallel_config par;     /* resolved (ranks filled in, comm NULL) */
    int parallel;                /* ep_size * tp_size > 1 */
    moe_shard shard;             /* this rank's share */
    moe_placement placement;     /* EP expert placement, owned: physical_to_logical [P],
                                    rank_num_physical [ep_size]; the contiguous one when
                                    parallel.placement was NULL (moe_parallel.h) */
    int64_t chunk_size;          /* tokens per chunk (the context's, clamped) */
    moe_exec_knobs knobs;        /* the context's knobs (chunk_size as above) */
    moe_exec_knobs tuned[MOE_TUNED_MAX]; /* a tuning file's entries, by ascending tokens */
    int n_tuned;                 /* 0: no tuning file (parallel plans never have one) */
    int64_t capacity;            /* batched format: slots per expert (0 otherwise) */
    int batched;                 /* the composition uses the batched activation format */
    moe_compute compute;         /* the expert GEMMs' arithmetic (moe.h moe_compute) */
    moe_ep_map epmap;            /* EP routing tables of `placement` (ep_size > 1), owned */
    struct moe_par *mpi;         /* MPI state (src/parallel), NULL for one process */
} moe_stage;

/* One chunk of tokens and its workspace slices (shapes for Tc tokens, cap = batched capacity). */
typedef struct moe_chunk {
    const moe_stage *st;
    const moe_exec_knobs *knobs;          /* what this execute runs with (never NULL) */
    const struct moe_expert_mats *experts; /* [n_experts] the local experts' packed matrices
                                              (src/gemm/grouped.h) */
    const float *x;       /* [Tc, H] f32 hidden states */
    int64_t T;            /* tokens in this chunk, Tc */
    int64_t t0;           /* the chunk's first token within the execute on this rank (the
                             EP replica rule counts tokens from the execute's start) */
    const int32_t *ids;   /* [Tc, K] routed expert ids */
    const float *wts;     /* [Tc, K] routing weights */
    float *out;           /* [Tc, H] output rows (hold the shared expert's output on finalize);
                             under TP the rank's partial output, summed afterwards */
    int has_shared;
    const float *sgate;   /* [Tc] shared-expert scale */
    /* workspace */
    int64_t *offsets;     /* [E + 1] ([E + 2] with identity experts) */
    int64_t *begin;       /* [E] */
    int64_t *end;         /* [E] */
    int32_t *rows;        /* [Tc * K] */
    int32_t *pos;         /* [Tc * K] */
    uint64_t *keys;       /* [Tc * K] (packed permute) */
    uint64_t *keys_tmp;   /* [Tc * K] */
    int32_t *bids;        /* [Tc * K] ids bucketed for the permutation (identity experts: E);
                             only with num_identity_experts > 0 */
    float *slots;         /* batched: [E * cap, H] */
    float *h;             /* [positions, I] */
    float *y;             /* [positions, H] */
    float *scratch;       /* per-thread GEMM scratch */
    int64_t *item_off;    /* [E + 1] */
    moe_exec_stats *stats;/* never NULL inside execute */
    /* parallel plans */
    int64_t tc_max;       /* the longest chunk any rank runs in this execute */
    unsigned char *par_ws;/* moe_par_workspace_bytes(st, Tc) bytes, 64-byte aligned */
} moe_chunk;

/* What prepare hands to experts. */
typedef struct moe_dispatch {
    moe_act_format format;
    const float *x;       /* standard: token rows [Tc, H]; batched: slots [E * cap, H] */
    int64_t n_groups;     /* E */
    const int64_t *begin; /* [E] first row position of each expert */
    const int64_t *end;   /* [E] one past its last */
    const int32_t *rows;  /* standard: [Tc * K] row ids t*K+k by position; batched: NULL */
    int64_t row_div;      /* K (standard) or 1 */
    const int32_t *pos;   /* [Tc * K] position of row t*K+k in y */
    float *h;             /* [positions, I] */
    float *y;             /* [positions, H] */
    const float *in_scale;/* standard format with apply_router_weight_on_input: [Tc * K]
                             routing weights by row id, applied to the expert inputs; NULL
                             otherwise (the batched prepare scales the slots itself) */
} moe_dispatch;

typedef struct moe_pf_impl {
    const char *name;
    moe_act_format format;
    /* group the chunk's routed rows by expert into d (under EP: the rows this rank's
     * experts run, received from every rank). Errors are recorded on the stage's ctx. */
    moe_status (*prepare)(moe_chunk *c, moe_dispatch *d);
    /* out[t] = scale * sum_k w[t][k] * y[pos[t*K+k]] (+ shared), over the chunk */
    moe_status (*finalize)(moe_chunk *c, const moe_dispatch *d);
} moe_pf_impl;

typedef struct moe_experts_impl {
    const char *name;
    moe_act_format format;
    void (*run)(moe_chunk *c, const moe_dispatch *d);
} moe_experts_impl;

extern const moe_pf_impl moe_pf_local;
extern const moe_pf_impl moe_pf_local_batched;
extern const moe_pf_impl moe_pf_ep_alltoall; /* src/parallel */
extern const moe_pf_impl moe_pf_ep_batched;
extern const moe_experts_impl moe_experts_grouped;
extern const moe_experts_impl moe_experts_batched;

#endif
