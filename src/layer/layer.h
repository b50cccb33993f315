/* The orchestrator's objects (src/layer): the plan (a layer description compiled once: the
 * stage view every stage reads, the composition, the canonical text) and the weights (packed
 * once, seen by the experts stage as an array of moe_expert_mats). Only src/layer includes
 * this: the stages read core/stage.h's moe_stage and gemm/grouped.h's moe_expert_mats. */
#ifndef MOE_LAYER_LAYER_H
#define MOE_LAYER_LAYER_H

#include "core/stage.h"
#include "gemm/grouped.h"

struct moe_plan {
    moe_stage st;                           /* what the stages read (core/stage.h) */
    const moe_pf_impl *pf;                  /* prepare/finalize */
    const moe_experts_impl *experts;        /* experts */
    char text[MOE_PLAN_TEXT_LEN];           /* canonical text: knobs + description (+ tuning) */
    char tuning_file[1088];                 /* the tuning file read (path), "" = none */
    uint64_t hash;                          /* XXH64 of text */
};

struct moe_weights {
    const moe_plan *plan;
    moe_shard shard;          /* the share packed: local experts, I and I_s shards (shard.logical
                                 = logical) */
    int32_t *logical;         /* [shard.n_experts] the logical expert of each local expert, owned */
    moe_dtype dtype;          /* expert weight dtype (the shared expert's) */
    moe_pmat router;          /* [E, H] f32, packed */
    moe_pmat shared_gate;     /* [1, H] f32, packed; data NULL unless gated */
    float *router_bias;       /* [E] f32 b_r, or NULL (desc has_router_bias) */
    float *sel_bias;          /* [E] f32 b_s, or NULL (desc has_selection_bias) */
    float *output_bias;       /* [H] f32 b_o, or NULL (desc has_output_bias) */
    float *output_norm;       /* [H] f32 w_n, or NULL (desc has_output_norm) */
    moe_expert_mats *experts; /* [n_experts] the local experts as the driver reads them */
    moe_expert_mats shared;   /* the shared expert (I = shard.Is; data NULL without one) */
    size_t expert_bytes;      /* packed routed (codes and scales) + shared expert bytes */
    size_t routed_each;       /* packed bytes of one local routed expert (all are the same size);
                                 0 while none was packed */
    /* owned buffers */
    void *router_buf;         /* router.data */
    void *shared_gate_buf;    /* shared_gate.data */
    void *shared_buf;         /* the shared expert: gate [Is, H], up [Is, H], down [H, Is] packed */
    void **mats;              /* [3 * n_experts] each routed matrix's packed codes (gate, up, down) */
    float **scales;           /* [3 * n_experts] quantized: each matrix's [N * ng] f32 scales, else NULL */
    float **zeros;            /* [3 * n_experts] MOE_WF_I4ZP: its zero points, else NULL */
    int32_t **comps;          /* [3 * n_experts] MOE_WF_W8A8: its [N] compensation, else NULL */
    struct moe_qmat *qm;      /* [3 * n_experts] quantized: what the kernels read beside the codes */
    float *expert_bias;       /* [n_experts, 2I + H] f32 {b_g, b_u, b_d}, or NULL (has_expert_bias) */
};

/* moe_plan_rebalance's staging on this rank: the weights of the new share, built beside the
 * current ones. The experts kept are not copied: their packed buffers move at commit. */
typedef struct moe_weights_stage {
    moe_shard shard;           /* the new share (shard.logical = logical) */
    int32_t *logical;          /* [n] the logical expert of each new local expert, n = shard.n_experts */
    int32_t *from_old;         /* [n] the current local expert it reuses, or -1 (packed anew, in fresh) */
    moe_weights *fresh;        /* the experts packed anew, in local order (experts only), or NULL */
    /* the new weights' arrays, allocated here so the commit cannot fail; filled at commit */
    moe_expert_mats *experts;  /* [n] */
    void **mats;               /* [3n] */
    float **scales, **zeros;   /* [3n] quantized, else NULL */
    int32_t **comps;           /* [3n] quantized, else NULL */
    struct moe_qmat *qm;       /* [3n] quantized, else NULL */
    float *expert_bias;        /* [n, 2I + H] with expert biases, else NULL */
    int64_t kept, packed, freed;           /* local experts reused, packed anew, dropped */
    size_t bytes_packed, bytes_resident;   /* bytes packed anew; expert bytes after the commit */
} moe_weights_stage;

/* Stage the share `next` (same TP shard as w's) beside w: the logical experts w does not hold
 * are read from src and packed (the errors of moe_weights_create), the others reused at
 * commit. w is not changed. On error nothing is left allocated. */
moe_status moe_weights_stage_build(const moe_weights *w, const moe_shard *next, const moe_weight_source *src,
                                   moe_weights_stage *s);
/* Switch w to the staged share (cannot fail): kept experts move their buffers, dropped ones
 * are freed; s is emptied. */
void moe_weights_stage_commit(moe_weights *w, moe_weights_stage *s);
/* Free a staging that will not be committed (w untouched). Twice is harmless. */
void moe_weights_stage_free(moe_weights_stage *s);

/* Ranks of an EP x TP layout at most (plan config and report). */
#define MOE_MAX_RANKS (1 << 20)

/* Quantized experts: the TP shard sh of d can be packed (MOE_ESHAPE for an odd 4-bit shard,
 * MOE_EUNSUPPORTED for an fp8 w8a8 shard starting inside a k-block, or, with compute bf16, for
 * down-projection scale cells of odd width; recorded on ctx, the
 * message starting with fn and naming the shard as TP rank tp_rank's, or as "this rank's" for
 * tp_rank -1), and *q13 / *q2 the granularity it is expressed in. */
moe_status moe_weights_check_shard(moe_ctx *ctx, const char *fn, const moe_layer_desc *d, const moe_shard *sh,
                                   int tp_size, int tp_rank, moe_compute compute, moe_qweight *q13, moe_qweight *q2);

/* parallel.placement of a plan config: NULL, or valid for d and par->ep_size (MOE_EINVAL
 * naming "plan config: parallel.placement" and the entry). moe_plan_create_ex and
 * moe_plan_report_for check this. */
moe_status moe_plan_check_placement(moe_ctx *ctx, const moe_layer_desc *d, const moe_parallel_config *par);

/* Validate a layer description as moe_plan_create does (the error recorded on ctx). */
moe_status moe_plan_check_desc(moe_ctx *ctx, const moe_layer_desc *d);

/* Log at plan creation (WARNING) every cost of this plan nobody asked for that moe_plan_report
 * also gives as data: the kernel table's fallbacks to scalar entries (report.c). */
void moe_plan_log_costs(const moe_plan *p);

/* Tuning files (tuning.c, docs/tuning.md). moe_tuning_apply: with the context's tuning_dir
 * set, read the file for p's shape into p->st.tuned (entries' chunk sizes capped at
 * chunk_limit); none found: INFO, no entries; a malformed file: MOE_EFORMAT naming the file and
 * field (recorded on the ctx). */
moe_status moe_tuning_apply(moe_plan *p, int64_t chunk_limit);
/* The knobs an execute of n_tokens runs with: the tuning entry of the nearest token count (ties:
 * the smaller), else the context's. */
const moe_exec_knobs *moe_plan_knobs(const moe_plan *p, int64_t n_tokens);
/* The longest chunk any execute of at most max_tokens tokens runs (sizes the workspace). */
int64_t moe_plan_max_chunk(const moe_plan *p, int64_t max_tokens);
/* "tuning_file=PATH|none;" and, with entries, "tuned=T:chunk_size/permute/onehot_threshold/
 * topk/lowtok_threshold,...;" into out (NUL-terminated, truncated to len); returns its length. */
size_t moe_plan_tuning_text(const moe_plan *p, char *out, size_t len);

#endif
