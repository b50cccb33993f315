/* Plan creation, workspace sizing and the forward pass: route -> permute -> experts ->
 * finalize, in chunks of at most chunk_size tokens. */
#include "core/kernels.h"
#include "core/knobs.h"
#include "core/modular.h"
#include "gemm/grouped.h"
#include "parallel/parallel.h"
#include "permute/permute.h"
#include "quant/convert.h"
#include "quant/quant.h"
#include "route/route.h"

#include <stdio.h>
#include <xxhash.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

void moe_layer_desc_init(moe_layer_desc *d)
{
    memset(d, 0, sizeof *d);
    d->family = MOE_FAMILY_CUSTOM;
    d->scoring_func = MOE_SCORING_SOFTMAX;
    d->renormalize = 0;
    d->routed_scaling_factor = 1.0f;
    d->activation = MOE_ACT_SWIGLU;
    d->shared_expert_intermediate_size = 0;
    d->shared_expert_gated = 0;
    d->weight_dtype = MOE_DTYPE_BF16;
    d->group_score = MOE_GROUP_SCORE_MAX;
    d->swiglu_alpha = 1.702f;
    d->swiglu_limit = 7.0f;
}

/* Largest sizes accepted: keep every product below 2^62 elements. */
#define MOE_MAX_DIM ((int64_t)1 << 24)

void moe_plan_config_init(moe_plan_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->prepare_finalize = MOE_PF_LOCAL;
    cfg->experts = MOE_EXPERTS_GROUPED;
    cfg->batched_capacity = 64;
    cfg->parallel.ep_size = 1;
    cfg->parallel.ep_rank = 0;
    cfg->parallel.tp_size = 1;
    cfg->parallel.tp_rank = 0;
    cfg->parallel.dp_size = 1;
    cfg->parallel.dp_rank = 0;
    cfg->parallel.comm = NULL;
    cfg->parallel.low_latency = 0;
    cfg->parallel.dispatch_dtype = MOE_DTYPE_F32;
    cfg->parallel.timeout_s = 300.0;
}

/* The parallel fields every rank can check alone (coordinates are checked collectively). */
static moe_status check_parallel(moe_ctx *ctx, const moe_layer_desc *d, const moe_parallel_config *par)
{
    const int64_t E = d->num_experts, I = d->moe_intermediate_size, Is = d->shared_expert_intermediate_size;
    if (par->ep_size < 1 || par->ep_size > E)
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: parallel.ep_size = %d, must be in [1, num_experts = %lld] (every EP rank "
                             "holds at least one expert)",
                             par->ep_size, (long long)E);
    if (par->tp_size < 1 || par->tp_size > I || (Is > 0 && par->tp_size > Is))
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: parallel.tp_size = %d, must be in [1, %lld] (every TP rank holds at least "
                             "one column of moe_intermediate_size = %lld%s)",
                             par->tp_size, (long long)(Is > 0 && Is < I ? Is : I), (long long)I,
                             Is > 0 ? " and of shared_expert_intermediate_size" : "");
    if ((int64_t)par->ep_size * par->tp_size > (1 << 20))
        return moe_set_error(ctx, MOE_EINVAL, "plan config: parallel.ep_size * tp_size = %lld is too large",
                             (long long)par->ep_size * par->tp_size);
    const int single = par->ep_size * par->tp_size == 1;
    if (par->ep_rank < -1 || par->tp_rank < -1 || (single && (par->ep_rank > 0 || par->tp_rank > 0)))
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: parallel.ep_rank = %d, tp_rank = %d: each must be in [0, its size) or -1 "
                             "(derived from the communicator rank)",
                             par->ep_rank, par->tp_rank);
    if (single && (par->dp_size < 1 || par->dp_rank < 0 || par->dp_rank >= par->dp_size))
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: parallel.dp_rank = %d with dp_size = %d; need dp_size >= 1 and 0 <= dp_rank "
                             "< dp_size",
                             par->dp_rank, par->dp_size);
    if (!(par->timeout_s > 0.0) || isinf(par->timeout_s))
        return moe_set_error(ctx, MOE_EINVAL, "plan config: parallel.timeout_s = %g, must be finite and > 0",
                             par->timeout_s);
    if (par->low_latency != 0 && par->low_latency != 1)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: parallel.low_latency = %d, must be 0 or 1", par->low_latency);
    if (par->dispatch_dtype != MOE_DTYPE_F32 && par->dispatch_dtype != MOE_DTYPE_F8_E4M3 &&
        par->dispatch_dtype != MOE_DTYPE_I8)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: parallel.dispatch_dtype = %s, expected F32, F8_E4M3 or I8",
                             moe_dtype_name(par->dispatch_dtype));
    if (par->dispatch_dtype != MOE_DTYPE_F32 && par->ep_size < 2)
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: parallel.dispatch_dtype = %s needs ep_size > 1 (only the expert-parallel "
                             "dispatch sends activations)",
                             moe_dtype_name(par->dispatch_dtype));
    return MOE_OK;
}

moe_status moe_plan_create(moe_ctx *ctx, const moe_layer_desc *desc, moe_plan **out)
{
    return moe_plan_create_ex(ctx, desc, NULL, out);
}

/* Canonical "key=value;" text of the knobs, the description and the composition (the parallel
 * sizes and dispatch dtype included, the rank coordinates not: every rank has the same text). */
static void plan_text(moe_plan *p)
{
    const moe_layer_desc *d = &p->desc;
    snprintf(p->text, sizeof p->text,
             "%shidden_size=%lld;moe_intermediate_size=%lld;num_experts=%lld;top_k=%lld;scoring_func=%d;"
             "renormalize=%d;routed_scaling_factor=%.9g;activation=%d;shared_expert_intermediate_size=%lld;"
             "shared_expert_gated=%d;weight_dtype=%s;n_group=%lld;topk_group=%lld;group_score=%d;"
             "has_selection_bias=%d;has_router_bias=%d;has_expert_bias=%d;apply_router_weight_on_input=%d;"
             "swiglu_alpha=%.9g;swiglu_limit=%.9g;prepare_finalize=%s;experts=%s;capacity=%lld;ep_size=%d;"
             "tp_size=%d;dispatch_dtype=%s;",
             p->ctx->options_text, (long long)d->hidden_size, (long long)d->moe_intermediate_size,
             (long long)d->num_experts, (long long)d->top_k, (int)d->scoring_func, d->renormalize,
             (double)d->routed_scaling_factor, (int)d->activation, (long long)d->shared_expert_intermediate_size,
             d->shared_expert_gated, moe_dtype_name(d->weight_dtype), (long long)d->n_group,
             (long long)d->topk_group, (int)d->group_score, d->has_selection_bias, d->has_router_bias,
             d->has_expert_bias, d->apply_router_weight_on_input, (double)d->swiglu_alpha,
             (double)d->swiglu_limit, p->pf->name, p->experts->name, (long long)p->capacity, p->par.ep_size,
             p->par.tp_size, moe_dtype_name(p->par.dispatch_dtype));
    if (moe_quant_active(&d->quant)) {
        size_t used = strlen(p->text);
        moe_quant_text(&d->quant, p->text + used, sizeof p->text - used);
    }
    p->hash = XXH64(p->text, strlen(p->text), 0);
}

moe_status moe_plan_create_ex(moe_ctx *ctx, const moe_layer_desc *desc, const moe_plan_config *cfg,
                              moe_plan **out)
{
    if (!out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_create: out is NULL");
    *out = NULL;
    if (!ctx)
        return MOE_EINVAL;
    if (!desc)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_create: desc is NULL");
    const moe_layer_desc *d = desc;
    struct {
        const char *name;
        int64_t v;
    } sizes[] = {{"hidden_size", d->hidden_size},
                 {"moe_intermediate_size", d->moe_intermediate_size},
                 {"num_experts", d->num_experts},
                 {"top_k", d->top_k}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].v <= 0 || sizes[i].v > MOE_MAX_DIM)
            return moe_set_error(ctx, MOE_EINVAL, "layer description: %s = %lld, must be in [1, %lld]",
                                 sizes[i].name, (long long)sizes[i].v, (long long)MOE_MAX_DIM);
    }
    if (d->top_k > d->num_experts)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: top_k = %lld exceeds num_experts = %lld",
                             (long long)d->top_k, (long long)d->num_experts);
    if (d->shared_expert_intermediate_size < 0 || d->shared_expert_intermediate_size > MOE_MAX_DIM)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: shared_expert_intermediate_size = %lld, must be in [0, %lld]",
                             (long long)d->shared_expert_intermediate_size, (long long)MOE_MAX_DIM);
    if (d->shared_expert_gated && d->shared_expert_intermediate_size == 0)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: shared_expert_gated set without a shared expert "
                             "(shared_expert_intermediate_size = 0)");
    if (!(d->routed_scaling_factor > 0.0f) || isinf(d->routed_scaling_factor))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: routed_scaling_factor = %g, must be finite and > 0",
                             (double)d->routed_scaling_factor);
    if (d->scoring_func != MOE_SCORING_SOFTMAX && d->scoring_func != MOE_SCORING_SIGMOID &&
        d->scoring_func != MOE_SCORING_TOPK_SOFTMAX && d->scoring_func != MOE_SCORING_TOPK_SIGMOID)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: scoring_func = %d is not a moe_scoring value",
                             (int)d->scoring_func);
    if (d->activation != MOE_ACT_SWIGLU && d->activation != MOE_ACT_GEGLU && d->activation != MOE_ACT_GEGLU_TANH &&
        d->activation != MOE_ACT_SWIGLU_OAI)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: activation = %d is not a moe_activation value",
                             (int)d->activation);
    {
        moe_status rst = moe_route_check_desc(ctx, d);
        if (rst != MOE_OK)
            return rst;
    }
    if (d->weight_dtype != MOE_DTYPE_F32 && d->weight_dtype != MOE_DTYPE_BF16 &&
        d->weight_dtype != MOE_DTYPE_F16)
        return moe_set_error(ctx, MOE_EDTYPE, "layer description: weight_dtype %s, expected F32, BF16 or F16",
                             moe_dtype_name(d->weight_dtype));
    {
        moe_status qst = moe_quant_validate(ctx, d); /* desc->quant (src/quant) */
        if (qst != MOE_OK)
            return qst;
    }
    /* the packed weights must be addressable */
    size_t bytes = 0;
    if (!moe_mul_size((size_t)d->num_experts, (size_t)(3 * d->moe_intermediate_size), &bytes) ||
        !moe_mul_size(bytes, (size_t)d->hidden_size * moe_dtype_size(d->weight_dtype), &bytes))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: expert weights exceed the address space");

    moe_plan_config c;
    if (cfg)
        c = *cfg;
    else
        moe_plan_config_init(&c);
    moe_status pst = check_parallel(ctx, d, &c.parallel);
    if (pst != MOE_OK)
        return pst;
    const moe_parallel_config *par = &c.parallel;
    if (d->quant.act == MOE_QACT_TOKEN_GROUP) /* fp8 w8a8: every TP shard must start on a k-block of w2 */
        for (int r = 0; r < par->tp_size; r++) {
            const int64_t i0 = moe_split_first(d->moe_intermediate_size, par->tp_size, r);
            if (i0 % d->quant.w2.block_k != 0)
                return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                     "layer description: fp8 w8a8 (quant.act = TOKEN_GROUP) under TP: tp rank %d's "
                                     "shard of the intermediate size %lld starts at column %lld, inside a "
                                     "down-projection k-block of %lld (block_k), so its activation groups would not "
                                     "line up with the weight blocks; choose tp_size so that every shard starts on a "
                                     "multiple of block_k, use EP, or weight-only fp8-block",
                                     r, (long long)d->moe_intermediate_size, (long long)i0,
                                     (long long)d->quant.w2.block_k);
        }
    /* Composition: low_latency picks the batched format; with ep_size > 1 the local kinds
     * become the expert-parallel kind of the same format. */
    moe_prepare_finalize_kind pfk = c.prepare_finalize;
    moe_experts_kind exk = c.experts;
    if (par->low_latency) {
        pfk = par->ep_size > 1 ? MOE_PF_EP_BATCHED : MOE_PF_LOCAL_BATCHED;
        exk = MOE_EXPERTS_BATCHED;
    } else if (par->ep_size > 1) {
        if (pfk == MOE_PF_LOCAL)
            pfk = MOE_PF_EP_ALLTOALL;
        else if (pfk == MOE_PF_LOCAL_BATCHED)
            pfk = MOE_PF_EP_BATCHED;
    }
    const moe_pf_impl *pf = pfk == MOE_PF_LOCAL           ? &moe_pf_local
                            : pfk == MOE_PF_LOCAL_BATCHED ? &moe_pf_local_batched
                            : pfk == MOE_PF_EP_ALLTOALL   ? &moe_pf_ep_alltoall
                            : pfk == MOE_PF_EP_BATCHED    ? &moe_pf_ep_batched
                                                          : NULL;
    const moe_experts_impl *ex = exk == MOE_EXPERTS_GROUPED   ? &moe_experts_grouped
                                 : exk == MOE_EXPERTS_BATCHED ? &moe_experts_batched
                                                              : NULL;
    if (!pf)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: prepare_finalize = %d is not a moe_prepare_finalize_kind",
                             (int)c.prepare_finalize);
    if (!ex)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: experts = %d is not a moe_experts_kind", (int)c.experts);
    if ((pf == &moe_pf_ep_alltoall || pf == &moe_pf_ep_batched) && par->ep_size < 2)
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: prepare_finalize '%s' is expert parallel and needs parallel.ep_size > 1 "
                             "(ep_size = %d); use MOE_PF_LOCAL or MOE_PF_LOCAL_BATCHED in one process",
                             pf->name, par->ep_size);
    if (pf->format != ex->format)
        return moe_set_error(ctx, MOE_EINVAL,
                             "plan config: prepare/finalize '%s' produces the %s activation format but experts '%s' "
                             "consume the %s format; pair them by format",
                             pf->name, moe_format_name(pf->format), ex->name, moe_format_name(ex->format));
    if (pf->format == MOE_FORMAT_BATCHED && c.batched_capacity < 1)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: batched_capacity = %lld, must be >= 1",
                             (long long)c.batched_capacity);
    if (pf == &moe_pf_ep_batched) {
        /* slot blocks are counted in int: [emax][capacity] slots per block, E_local * ep *
         * capacity slots on the receiving side */
        const int64_t emax = (d->num_experts + par->ep_size - 1) / par->ep_size;
        if (c.batched_capacity > (int64_t)(INT32_MAX / 4) / (emax * par->ep_size))
            return moe_set_error(ctx, MOE_EINVAL,
                                 "plan config: batched_capacity = %lld is too large for %lld experts per rank on %d "
                                 "ranks (slot blocks would exceed 2^31 slots)",
                                 (long long)c.batched_capacity, (long long)emax, par->ep_size);
    }

    moe_plan *p = calloc(1, sizeof *p);
    if (!p)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
    p->ctx = ctx;
    p->desc = *d;
    p->pf = pf;
    p->experts = ex;
    p->par = *par;
    p->par.comm = NULL;
    p->parallel = par->ep_size * par->tp_size > 1;
    if (!p->parallel) /* -1 = derived: the only rank */
        p->par.ep_rank = p->par.tp_rank = 0;
    /* Row ids t*K+k of a chunk are int32: keep chunk * K below 2^31; under EP a rank may
     * receive ep_size chunks' rows, so keep ep_size * chunk * K below 2^31 too. */
    int64_t max_chunk = (int64_t)(INT32_MAX / (d->top_k * par->ep_size));
    p->chunk_size = ctx->chunk_size < max_chunk ? ctx->chunk_size : max_chunk;
    if (p->chunk_size < ctx->chunk_size)
        moe_log(ctx, MOE_LOG_INFO, "chunk size lowered from %lld to %lld tokens so that row ids fit in 32 bits",
                (long long)ctx->chunk_size, (long long)p->chunk_size);
    if (pf->format == MOE_FORMAT_BATCHED) {
        /* a chunk of at most `capacity` tokens never overflows an expert's slots */
        p->capacity = c.batched_capacity;
        if (p->chunk_size > p->capacity) {
            moe_log(ctx, MOE_LOG_INFO, "batched format: chunks cut from %lld to %lld tokens (the capacity per expert)",
                    (long long)p->chunk_size, (long long)p->capacity);
            p->chunk_size = p->capacity;
        }
    }
    plan_text(p);
    if (p->parallel) {
        /* collective: every rank checks that every other has the same plan */
        moe_status st = moe_par_create(p, par->comm);
        if (st != MOE_OK) {
            free(p);
            return st;
        }
    }
    moe_par_shard(&p->desc, &p->par, &p->shard);
    /* A cost nobody asked for is logged with its size: the AVX2 table runs a partial last
     * panel (fewer than 16 output features) through the scalar kernel. Not for weight-only
     * quantized routed experts: gemm/avx2/linear_q_avx2.c runs their narrow panel vectorized
     * (w8a8 schemes run the scalar entry throughout, logged by moe_quant_validate). */
    if (ctx->kernels == &moe_kernels_avx2 && !moe_quant_active(&d->quant)) {
        int64_t tail = d->moe_intermediate_size % MOE_PANEL, tail_h = d->hidden_size % MOE_PANEL;
        if (tail || tail_h) {
            double share = (2.0 * (double)tail * (double)d->hidden_size + (double)tail_h * (double)d->moe_intermediate_size) /
                           (3.0 * (double)d->moe_intermediate_size * (double)d->hidden_size);
            moe_log(ctx, MOE_LOG_WARN,
                    "avx2 table: I = %lld and H = %lld are not multiples of %d, so the last partial panel runs the "
                    "scalar fallback kernel: %.2f%% of expert FLOPs (%.0f FLOP per routed token)",
                    (long long)d->moe_intermediate_size, (long long)d->hidden_size, MOE_PANEL, 100.0 * share,
                    share * 6.0 * (double)d->moe_intermediate_size * (double)d->hidden_size * (double)d->top_k);
        }
    }
    *out = p;
    return MOE_OK;
}

void moe_plan_free(moe_plan *plan)
{
    if (!plan)
        return;
    moe_par_free(plan->mpi);
    free(plan);
}

const moe_parallel_config *moe_plan_parallel(const moe_plan *plan)
{
    return plan ? &plan->par : NULL;
}

moe_status moe_plan_expert_map(const moe_plan *plan, int32_t *out)
{
    if (!plan)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(plan->ctx, MOE_EINVAL, "moe_plan_expert_map: out is NULL");
    const moe_shard *sh = &plan->shard;
    for (int64_t e = 0; e < plan->desc.num_experts; e++)
        out[e] = e >= sh->e0 && e < sh->e0 + sh->n_experts ? (int32_t)(e - sh->e0) : -1;
    return MOE_OK;
}

void moe_plan_tp_rows(const moe_plan *plan, int64_t n_tokens, int64_t *begin, int64_t *end)
{
    int64_t b = 0, e = n_tokens > 0 ? n_tokens : 0;
    if (plan)
        moe_par_tp_rows(plan, e, &b, &e);
    if (begin)
        *begin = b;
    if (end)
        *end = e;
}

const moe_layer_desc *moe_plan_desc(const moe_plan *plan)
{
    return plan ? &plan->desc : NULL;
}

const char *moe_plan_text(const moe_plan *plan)
{
    return plan ? plan->text : "";
}

uint64_t moe_plan_hash(const moe_plan *plan)
{
    return plan ? plan->hash : 0;
}

/* Workspace of one chunk of Tc tokens, as byte offsets (each slice 64-byte aligned). I and
 * I_s are this rank's shards; under EP the experts' rows live in the parallel slice. */
typedef struct ws_layout {
    size_t xf;       /* [Tc, H] f32: bf16 hidden_states converted */
    size_t logits;   /* [Tc, E] f32 */
    size_t ids;      /* [Tc, K] i32 */
    size_t wts;      /* [Tc, K] f32 */
    size_t scores;   /* [E] f32 */
    size_t offsets;  /* [E + 1] i64 */
    size_t begin;    /* [E] i64 */
    size_t end;      /* [E] i64 */
    size_t item_off; /* [E + 1] i64 */
    size_t rows;     /* [Tc * K] i32, sorted by expert */
    size_t pos;      /* [Tc * K] i32, position of each (t, k) row in y */
    size_t keys;     /* [Tc * K] u64 (packed permute) */
    size_t keys_tmp; /* [Tc * K] u64 */
    size_t slots;    /* local batched: [E * cap, H] f32 */
    size_t h;        /* [max(positions * I, Tc * Is)] f32; positions = Tc*K or E*cap (0 under EP) */
    size_t y;        /* [positions, H] f32 */
    size_t sgate;    /* [Tc] f32 shared-expert gate */
    size_t partial;  /* TP: [Tc, H] f32 this rank's partial output */
    size_t scratch;  /* [threads, moe_gemm_thread_scratch_floats()] f32 */
    size_t par;      /* moe_par_workspace_bytes(plan, Tc): EP buffers, TP gather */
    size_t total;
} ws_layout;

static size_t take(size_t *cur, size_t bytes)
{
    size_t at = *cur;
    *cur += (bytes + 63) & ~(size_t)63;
    return at;
}

static ws_layout layout(const moe_plan *p, int64_t Tc)
{
    const moe_layer_desc *d = &p->desc;
    const size_t T = (size_t)Tc, H = (size_t)d->hidden_size, E = (size_t)d->num_experts;
    const size_t K = (size_t)d->top_k, I = (size_t)p->shard.I;
    const size_t Is = (size_t)p->shard.Is;
    const int ep_mode = p->par.ep_size > 1;
    ws_layout l;
    size_t c = 0;
    l.xf = take(&c, T * H * 4);
    l.logits = take(&c, T * E * 4);
    l.ids = take(&c, T * K * 4);
    l.wts = take(&c, T * K * 4);
    l.scores = take(&c, moe_route_scratch_bytes(d));
    l.offsets = take(&c, (E + 1) * 8);
    l.begin = take(&c, E * 8);
    l.end = take(&c, E * 8);
    l.item_off = take(&c, (E + 1) * 8);
    l.rows = take(&c, T * K * 4);
    l.pos = take(&c, T * K * 4);
    l.keys = take(&c, T * K * 8);
    l.keys_tmp = take(&c, T * K * 8);
    const size_t cap = ep_mode ? 0 : (size_t)p->capacity;
    const size_t positions = ep_mode ? 0 : cap > 0 ? E * cap : T * K;
    l.slots = take(&c, cap > 0 ? E * cap * H * 4 : 0);
    size_t hn = positions * I > T * Is ? positions * I : T * Is;
    l.h = take(&c, hn * 4);
    l.y = take(&c, positions * H * 4);
    l.sgate = take(&c, T * 4);
    l.partial = take(&c, p->par.tp_size > 1 ? T * H * 4 : 0);
    l.scratch = take(&c, (size_t)p->ctx->num_threads * moe_gemm_thread_scratch_floats() * 4);
    l.par = take(&c, moe_par_workspace_bytes(p, Tc));
    l.total = c + 64; /* room to align the caller's pointer up to 64 bytes */
    return l;
}

size_t moe_plan_workspace_size(const moe_plan *plan, int64_t max_tokens)
{
    if (!plan || max_tokens <= 0)
        return 0;
    int64_t Tc = max_tokens < plan->chunk_size ? max_tokens : plan->chunk_size;
    return layout(plan, Tc).total;
}

/* The longest chunk (<= chunk_size) a workspace of `size` bytes at `ws` fits. */
static int64_t fit_tokens(const moe_plan *p, const void *ws, size_t size)
{
    if (!ws)
        return 0;
    int64_t lo = 0, hi = p->chunk_size;
    if (layout(p, hi).total <= size)
        return hi;
    while (lo + 1 < hi) { /* layout(lo) fits (or lo = 0), layout(hi) does not */
        int64_t mid = lo + (hi - lo) / 2;
        if (layout(p, mid).total <= size)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static int same_desc(const moe_layer_desc *a, const moe_layer_desc *b)
{
    return a->hidden_size == b->hidden_size && a->moe_intermediate_size == b->moe_intermediate_size &&
           a->num_experts == b->num_experts && a->top_k == b->top_k &&
           a->shared_expert_intermediate_size == b->shared_expert_intermediate_size &&
           a->shared_expert_gated == b->shared_expert_gated && a->weight_dtype == b->weight_dtype &&
           a->has_selection_bias == b->has_selection_bias && a->has_router_bias == b->has_router_bias &&
           a->has_expert_bias == b->has_expert_bias;
}

static int same_shard(const moe_shard *a, const moe_shard *b)
{
    return a->e0 == b->e0 && a->n_experts == b->n_experts && a->i0 == b->i0 && a->I == b->I && a->is0 == b->is0 &&
           a->Is == b->Is && a->down_bias == b->down_bias;
}

/* One chunk: tokens [t0, t0 + Tc): route, shared expert, prepare, experts, finalize (and under
 * TP the sum of the partial outputs). Parallel plans run every chunk index on every rank,
 * so Tc may be 0 here (a rank out of tokens still serves its peers' rows). */
static moe_status run_chunk(const moe_plan *p, const moe_weights *w, const moe_exec_args *a, int64_t t0,
                            int64_t Tc, int64_t tc_max, unsigned char *ws, const ws_layout *l, moe_exec_stats *stats)
{
    const moe_ctx *ctx = p->ctx;
    const moe_layer_desc *d = &p->desc;
    const int64_t H = d->hidden_size, E = d->num_experts, K = d->top_k;
    const int64_t Is = p->shard.Is;
    const int tp = p->par.tp_size > 1;
    float *scratch = (float *)(ws + l->scratch);
    if (Tc == 0 && p->par.ep_size == 1)
        return MOE_OK;

    /* x: [Tc, H] f32 */
    const float *x = NULL;
    if (Tc > 0 && a->hidden_dtype == MOE_DTYPE_BF16) {
        float *xf = (float *)(ws + l->xf);
        const uint16_t *src = (const uint16_t *)a->hidden_states + t0 * H;
        moe_convert_to_f32(xf, src, MOE_DTYPE_BF16, (size_t)(Tc * H));
        x = xf;
    } else if (Tc > 0) {
        x = (const float *)a->hidden_states + t0 * H;
    }

    /* route: logits [Tc, E] -> ids, wts [Tc, K] */
    int32_t *ids = (int32_t *)(ws + l->ids);
    float *wts = (float *)(ws + l->wts);
    if (Tc > 0) {
        const float *logits;
        if (a->router_logits) {
            logits = a->router_logits + t0 * E;
        } else {
            float *lg = (float *)(ws + l->logits);
            moe_linear_rows(ctx, &w->router, x, H, Tc, lg, E, scratch);
            moe_route_add_bias(w->router_bias, Tc, E, lg);
            logits = lg;
        }
        moe_route_topk(d, w->sel_bias, logits, Tc, ids, wts, ws + l->scores, (moe_topk_method)ctx->topk);
    }

    /* out: the output rows, or under TP this rank's partial output [Tc, H] */
    float *out = tp ? (float *)(ws + l->partial) : Tc > 0 ? a->output + t0 * H : NULL;
    moe_chunk c = {
        .plan = p, .w = w, .x = x, .T = Tc, .ids = ids, .wts = wts, .out = out,
        .has_shared = Is > 0, .sgate = (float *)(ws + l->sgate),
        .offsets = (int64_t *)(ws + l->offsets), .begin = (int64_t *)(ws + l->begin),
        .end = (int64_t *)(ws + l->end), .rows = (int32_t *)(ws + l->rows), .pos = (int32_t *)(ws + l->pos),
        .keys = (uint64_t *)(ws + l->keys), .keys_tmp = (uint64_t *)(ws + l->keys_tmp),
        .slots = (float *)(ws + l->slots), .h = (float *)(ws + l->h), .y = (float *)(ws + l->y),
        .scratch = scratch, .item_off = (int64_t *)(ws + l->item_off), .stats = stats,
        .tc_max = tc_max, .par_ws = ws + l->par,
    };

    /* shared expert first (this rank's I_s shard under TP), straight into out; its scale into sgate */
    if (Is > 0 && Tc > 0) {
        float *sgate = (float *)(ws + l->sgate);
        int64_t b0 = 0, e0 = Tc;
        moe_mlp_groups sg = {.shared = 1, .x = x, .n_groups = 1, .begin = &b0, .end = &e0, .rows = NULL,
                             .row_div = 1, .h = c.h, .y = c.out, .lowtok_threshold = 0};
        moe_mlp_run(ctx, w, &sg, scratch, c.item_off, NULL);
        if (d->shared_expert_gated) {
            moe_linear_rows(ctx, &w->shared_gate, x, H, Tc, sgate, 1, scratch);
            for (int64_t t = 0; t < Tc; t++)
                sgate[t] = 1.0f / (1.0f + expf(-sgate[t]));
        } else {
            for (int64_t t = 0; t < Tc; t++)
                sgate[t] = 1.0f;
        }
    }

    moe_dispatch disp;
    moe_status st = p->pf->prepare(&c, &disp);
    if (st != MOE_OK)
        return st;
    p->experts->run(&c, &disp);
    if ((st = p->pf->finalize(&c, &disp)) != MOE_OK)
        return st;
    if (tp && Tc > 0 && (st = moe_par_tp_reduce(&c, t0, a->n_tokens, a->output)) != MOE_OK)
        return st;

    if (Tc > 0 && a->topk_ids)
        memcpy(a->topk_ids + t0 * K, ids, sizeof(int32_t) * (size_t)(Tc * K));
    if (Tc > 0 && a->topk_weights)
        memcpy(a->topk_weights + t0 * K, wts, sizeof(float) * (size_t)(Tc * K));
    return MOE_OK;
}

/* The checks of one rank's arguments (recorded on ctx). Parallel plans allow NULL
 * hidden_states and output with n_tokens = 0; their workspace is checked collectively. */
static moe_status check_args(const moe_plan *plan, const moe_weights *weights, const moe_exec_args *a)
{
    moe_ctx *ctx = plan->ctx;
    if (!weights || !a)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: %s is NULL", !weights ? "weights" : "args");
    if (weights->plan != plan && !same_desc(&weights->plan->desc, &plan->desc))
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: weights were packed for a different layer description");
    if (!same_shard(&weights->shard, &plan->shard))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_execute: weights were packed for another share of the layer (experts [%lld, %lld), "
                             "I columns [%lld, %lld)) than this plan's rank holds (experts [%lld, %lld), I columns "
                             "[%lld, %lld))",
                             (long long)weights->shard.e0, (long long)(weights->shard.e0 + weights->shard.n_experts),
                             (long long)weights->shard.i0, (long long)(weights->shard.i0 + weights->shard.I),
                             (long long)plan->shard.e0, (long long)(plan->shard.e0 + plan->shard.n_experts),
                             (long long)plan->shard.i0, (long long)(plan->shard.i0 + plan->shard.I));
    if (a->n_tokens < 0)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: n_tokens = %lld is negative", (long long)a->n_tokens);
    if (a->n_tokens == 0)
        return MOE_OK;
    if (a->hidden_dtype != MOE_DTYPE_F32 && a->hidden_dtype != MOE_DTYPE_BF16)
        return moe_set_error(ctx, MOE_EDTYPE, "moe_plan_execute: hidden_states dtype %s, expected F32 or BF16",
                             moe_dtype_name(a->hidden_dtype));
    if (!a->hidden_states || !a->output)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: %s is NULL",
                             !a->hidden_states ? "hidden_states" : "output");
    if (plan->parallel)
        return MOE_OK;
    size_t need = moe_plan_workspace_size(plan, a->n_tokens);
    if (!a->workspace || a->workspace_size < need)
        return moe_set_error(ctx, MOE_EWORKSPACE,
                             "moe_plan_execute: workspace of %zu bytes at %p, need %zu for %lld tokens "
                             "(moe_plan_workspace_size)",
                             a->workspace ? a->workspace_size : 0, a->workspace, need, (long long)a->n_tokens);
    return MOE_OK;
}

moe_status moe_plan_execute_ex(const moe_plan *plan, const moe_weights *weights,
                               const moe_exec_args *a)
{
    if (!plan)
        return MOE_EINVAL;
    moe_ctx *ctx = plan->ctx;
    moe_status st = check_args(plan, weights, a);
    int64_t Tc, n_chunks, max_tokens;
    if (!plan->parallel) {
        if (st != MOE_OK || a->n_tokens == 0)
            return st;
        Tc = a->n_tokens < plan->chunk_size ? a->n_tokens : plan->chunk_size;
        n_chunks = (a->n_tokens + Tc - 1) / Tc;
        max_tokens = a->n_tokens;
    } else {
        /* collective: every rank learns every rank's token count, workspace and status */
        const int64_t T = st == MOE_OK ? a->n_tokens : 0;
        const int64_t fit = st == MOE_OK ? fit_tokens(plan, a->workspace, a->workspace_size) : 0;
        st = moe_par_begin(plan, st, T, fit, &Tc, &n_chunks, &max_tokens);
        if (st != MOE_OK)
            return st;
    }

    moe_exec_stats local;
    moe_exec_stats *stp = a->stats ? a->stats : &local;
    memset(stp, 0, sizeof *stp);
    stp->isa = ctx->kernels->name;
    stp->prepare_finalize = plan->pf->name;
    stp->experts = plan->experts->name;
    stp->topk = ctx->topk == MOE_TOPK_ROWMAX ? "rowmax" : "sort";
    stp->threads = ctx->num_threads;
    stp->chunk_tokens = Tc;
    stp->max_tokens = max_tokens;
    if (n_chunks == 0)
        return MOE_OK;
    ws_layout l = layout(plan, Tc);
    unsigned char *ws = (unsigned char *)(((uintptr_t)a->workspace + 63) & ~(uintptr_t)63);
    for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t t0 = c * Tc;
        const int64_t n = a->n_tokens - t0 < 0 ? 0 : a->n_tokens - t0 < Tc ? a->n_tokens - t0 : Tc;
        st = run_chunk(plan, weights, a, t0, n, Tc, ws, &l, stp);
        if (st != MOE_OK)
            return st;
        if (n > 0)
            stp->chunks++;
    }
    return MOE_OK;
}

moe_status moe_plan_execute(const moe_plan *plan, const moe_weights *weights, const float *x,
                            int64_t n_tokens, float *out, void *workspace, size_t workspace_size)
{
    moe_exec_args a = {0};
    a.hidden_states = x;
    a.hidden_dtype = MOE_DTYPE_F32;
    a.n_tokens = n_tokens;
    a.output = out;
    a.workspace = workspace;
    a.workspace_size = workspace_size;
    return moe_plan_execute_ex(plan, weights, &a);
}
