/* Plan creation: the layer description validated and compiled once (the stage view, the
 * prepare/finalize and experts composition, the canonical text and hash; collective for
 * parallel plans), and the plan's accessors. The forward pass is in execute.c, the costs it
 * reports in report.c. */
#include "layer/layer.h"
#include "parallel/parallel.h"
#include "quant/format.h"
#include "quant/quant.h"

#include <stdatomic.h>
#include <stdio.h>
#include <xxhash.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    if ((int64_t)par->ep_size * par->tp_size > MOE_MAX_RANKS)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: parallel.ep_size * tp_size = %lld is too large (at most %d)",
                             (long long)par->ep_size * par->tp_size, MOE_MAX_RANKS);
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
    const moe_layer_desc *d = &p->st.desc;
    snprintf(p->text, sizeof p->text,
             "%shidden_size=%lld;moe_intermediate_size=%lld;num_experts=%lld;top_k=%lld;scoring_func=%d;"
             "renormalize=%d;routed_scaling_factor=%.9g;activation=%d;shared_expert_intermediate_size=%lld;"
             "shared_expert_gated=%d;weight_dtype=%s;n_group=%lld;topk_group=%lld;group_score=%d;"
             "has_selection_bias=%d;has_router_bias=%d;has_expert_bias=%d;apply_router_weight_on_input=%d;"
             "swiglu_alpha=%.9g;swiglu_limit=%.9g;prepare_finalize=%s;experts=%s;capacity=%lld;ep_size=%d;"
             "tp_size=%d;dispatch_dtype=%s;",
             p->st.ctx->options_text, (long long)d->hidden_size, (long long)d->moe_intermediate_size,
             (long long)d->num_experts, (long long)d->top_k, (int)d->scoring_func, d->renormalize,
             (double)d->routed_scaling_factor, (int)d->activation, (long long)d->shared_expert_intermediate_size,
             d->shared_expert_gated, moe_dtype_name(d->weight_dtype), (long long)d->n_group,
             (long long)d->topk_group, (int)d->group_score, d->has_selection_bias, d->has_router_bias,
             d->has_expert_bias, d->apply_router_weight_on_input, (double)d->swiglu_alpha,
             (double)d->swiglu_limit, p->pf->name, p->experts->name, (long long)p->st.capacity, p->st.par.ep_size,
             p->st.par.tp_size, moe_dtype_name(p->st.par.dispatch_dtype));
    if (moe_quant_active(&d->quant)) {
        size_t used = strlen(p->text);
        moe_quant_text(&d->quant, p->text + used, sizeof p->text - used);
    }
    if (d->has_output_bias) { /* descriptions without it keep their text and hash */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "has_output_bias=1;");
    }
    if (d->activation == MOE_ACT_SWIGLU_SOFTCAP ||
        (d->has_shared_activation && d->shared_activation == MOE_ACT_SWIGLU_SOFTCAP)) { /* the others keep theirs */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "softcap_gate=%.9g;softcap_up=%.9g;",
                 (double)d->softcap_gate, (double)d->softcap_up);
    }
    if (d->has_output_norm) {
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "has_output_norm=1;output_norm_eps=%.9g;",
                 (double)d->output_norm_eps);
    }
    if (d->has_shared_activation) {
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "shared_activation=%d;", (int)d->shared_activation);
    }
    if (d->renormalize && d->renormalize_eps != 1e-20f) { /* the default keeps the text and hash */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "renormalize_eps=%.9g;", (double)d->renormalize_eps);
    }
    if (d->renormalize && d->renormalize_p != 1.0f) { /* the sum (p = 1) keeps the text and hash */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "renormalize_p=%.9g;", (double)d->renormalize_p);
    }
    if (d->shared_expert_intermediate_size > 0 && d->shared_expert_scale != 1.0f) {
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "shared_expert_scale=%.9g;", (double)d->shared_expert_scale);
    }
    if (d->num_identity_experts > 0) { /* descriptions without identity experts keep their text */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "num_identity_experts=%lld;", (long long)d->num_identity_experts);
    }
    if (d->expert_capacity > 0) { /* descriptions without a capacity keep their text and hash */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "expert_capacity=%lld;", (long long)d->expert_capacity);
    }
    if (d->shared_swiglu_limit > 0.0f) { /* descriptions without it keep their text and hash */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "shared_swiglu_limit=%.9g;", (double)d->shared_swiglu_limit);
    }
    if (d->scoring_func == MOE_SCORING_SPARSEMIXER) { /* the other modes keep their text and hash */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "sparsemixer_jitter_eps=%.9g;",
                 (double)d->sparsemixer_jitter_eps);
    }
    if (p->st.compute != MOE_COMPUTE_F32) { /* f32 plans keep the text (and hash) they always had */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "compute=%s;", moe_compute_name(p->st.compute));
    }
    if (!moe_placement_is_contiguous(&p->st.placement)) {
        /* a placement other than the default split (moe_parallel.h "Expert placement"); the
         * contiguous one keeps the text (and hash) plans always had */
        size_t used = strlen(p->text);
        snprintf(p->text + used, sizeof p->text - used, "placement=%016llx;",
                 (unsigned long long)moe_placement_hash(&p->st.placement));
    }
    if (p->st.ctx->tuning_dir[0]) { /* the tuning file and the entries read (docs/tuning.md) */
        size_t used = strlen(p->text);
        moe_plan_tuning_text(p, p->text + used, sizeof p->text - used);
    }
    p->hash = XXH64(p->text, strlen(p->text), 0);
}

/* Compute bf16 on d: the schemes it cannot run (moe.h moe_compute). */
static moe_status check_compute(moe_ctx *ctx, const moe_layer_desc *d, moe_compute c)
{
    if (c != MOE_COMPUTE_F32 && c != MOE_COMPUTE_BF16)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: compute = %d is not a moe_compute (MOE_COMPUTE_F32 or "
                             "MOE_COMPUTE_BF16)", (int)c);
    if (c != MOE_COMPUTE_BF16 || !moe_quant_active(&d->quant))
        return MOE_OK;
    const moe_quant_config *q = &d->quant;
    if (q->act != MOE_QACT_NONE)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "plan config: compute bf16 with %s: this scheme quantizes the activations to 8 bits and "
                             "computes in 8-bit integers or fp8 already; use compute f32 (its default)",
                             moe_quant_name(q));
    /* bf16 pairs are (2i, 2i+1) along K: a scale group must not split one */
    const moe_qweight *w[2] = {&q->w13, &q->w2};
    const int64_t K[2] = {d->hidden_size, d->moe_intermediate_size};
    for (int i = 0; i < 2; i++) {
        const int64_t gk = moe_quant_gk(w[i], K[i]);
        if (gk % 2 != 0 && gk < K[i])
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "plan config: compute bf16 with %s: quant.%s scale groups of %lld inputs (odd) would "
                                 "split the bf16 pairs (2i, 2i+1) the dot products run on; use compute f32",
                                 moe_quant_name(q), i ? "w2" : "w13", (long long)gk);
    }
    return MOE_OK;
}

/* "standard" or "batched". */
static const char *format_name(moe_act_format f)
{
    return f == MOE_FORMAT_BATCHED ? "batched" : "standard";
}

/* The plan's own placement: a copy of `given` (valid: moe_plan_check_placement passed), or
 * the contiguous one when given is NULL; and under EP its routing tables (st->epmap).
 * MOE_ENOMEM recorded on ctx. */
static moe_status plan_placement_init(moe_ctx *ctx, moe_stage *st, const moe_placement *given)
{
    const int64_t E = st->desc.num_experts;
    const int ep = st->par.ep_size;
    moe_placement *pl = &st->placement;
    if (given) {
        if (moe_placement_copy(pl, given) != 0)
            return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory for the expert placement");
    } else {
        pl->ep_size = ep;
        pl->num_logical_experts = (int32_t)E;
        pl->num_physical_experts = (int32_t)E;
        pl->physical_to_logical = malloc((size_t)E * sizeof *pl->physical_to_logical); /* [E] */
        pl->rank_num_physical = malloc((size_t)ep * sizeof *pl->rank_num_physical);    /* [ep_size] */
        if (!pl->physical_to_logical || !pl->rank_num_physical) {
            moe_placement_clear(pl);
            return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory for the expert placement");
        }
        for (int64_t q = 0; q < E; q++)
            pl->physical_to_logical[q] = (int32_t)q;
        for (int r = 0; r < ep; r++)
            pl->rank_num_physical[r] = (int32_t)moe_split_count(E, ep, r);
    }
    if (ep > 1 && moe_ep_map_build(pl, &st->epmap) != 0) {
        moe_placement_clear(pl);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory for the expert placement's tables");
    }
    st->par.placement = pl;
    return MOE_OK;
}

/* Free a plan that never reached the caller. */
static void plan_discard(moe_plan *p)
{
    moe_ep_map_free(&p->st.epmap);
    moe_placement_clear(&p->st.placement);
    free(p);
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
    moe_status dst = moe_plan_check_desc(ctx, d);
    if (dst != MOE_OK)
        return dst;

    moe_plan_config c;
    if (cfg)
        c = *cfg;
    else
        moe_plan_config_init(&c);
    moe_status pst = check_parallel(ctx, d, &c.parallel);
    if (pst == MOE_OK)
        pst = check_compute(ctx, d, c.compute);
    if (pst != MOE_OK)
        return pst;
    const moe_parallel_config *par = &c.parallel;
    if ((pst = moe_plan_check_placement(ctx, d, par)) != MOE_OK)
        return pst;
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
                             pf->name, format_name(pf->format), ex->name, format_name(ex->format));
    if (pf->format == MOE_FORMAT_BATCHED && c.batched_capacity < 1)
        return moe_set_error(ctx, MOE_EINVAL, "plan config: batched_capacity = %lld, must be >= 1",
                             (long long)c.batched_capacity);
    if (pf == &moe_pf_ep_batched) {
        /* slot blocks are counted in int: [emax][capacity] slots per block, E_local * ep *
         * capacity slots on the receiving side */
        int64_t emax = (d->num_experts + par->ep_size - 1) / par->ep_size;
        for (int r = 0; par->placement && r < par->ep_size; r++)
            emax = r == 0 || par->placement->rank_num_physical[r] > emax ? par->placement->rank_num_physical[r] : emax;
        emax = emax > 0 ? emax : 1;
        if (c.batched_capacity > (int64_t)(INT32_MAX / 4) / (emax * par->ep_size))
            return moe_set_error(ctx, MOE_EINVAL,
                                 "plan config: batched_capacity = %lld is too large for %lld experts per rank on %d "
                                 "ranks (slot blocks would exceed 2^31 slots)",
                                 (long long)c.batched_capacity, (long long)emax, par->ep_size);
    }

    moe_plan *p = calloc(1, sizeof *p);
    if (!p)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_create: out of memory");
    moe_stage *st = &p->st;
    st->ctx = ctx;
    st->desc = *d;
    p->pf = pf;
    p->experts = ex;
    st->batched = pf->format == MOE_FORMAT_BATCHED;
    st->compute = c.compute;
    st->par = *par;
    st->par.comm = NULL;
    st->par.placement = NULL;
    if (plan_placement_init(ctx, st, par->placement) != MOE_OK) {
        free(p);
        return MOE_ENOMEM;
    }
    st->parallel = par->ep_size * par->tp_size > 1;
    if (!st->parallel) /* -1 = derived: the only rank */
        st->par.ep_rank = st->par.tp_rank = 0;
    /* Row ids t*K+k of a chunk are int32: keep chunk * K below 2^31; under EP a rank may
     * receive ep_size chunks' rows, so keep ep_size * chunk * K below 2^31 too. */
    int64_t max_chunk = (int64_t)(INT32_MAX / (d->top_k * par->ep_size));
    st->chunk_size = ctx->chunk_size < max_chunk ? ctx->chunk_size : max_chunk;
    if (st->chunk_size < ctx->chunk_size)
        moe_log(ctx, MOE_LOG_INFO, "chunk size lowered from %lld to %lld tokens so that row ids fit in 32 bits",
                (long long)ctx->chunk_size, (long long)st->chunk_size);
    if (pf->format == MOE_FORMAT_BATCHED) {
        /* a chunk of at most `capacity` tokens never overflows an expert's slots */
        st->capacity = c.batched_capacity;
        if (st->chunk_size > st->capacity) {
            moe_log(ctx, MOE_LOG_INFO, "batched format: chunks cut from %lld to %lld tokens (the capacity per expert)",
                    (long long)st->chunk_size, (long long)st->capacity);
            st->chunk_size = st->capacity;
        }
    }
    /* the context's knobs, and those of a tuning file (MOE_TUNING_DIR) */
    st->knobs = (moe_exec_knobs){.tokens = 0, .chunk_size = st->chunk_size, .permute = ctx->permute,
                                 .onehot_threshold = ctx->onehot_threshold, .topk = ctx->topk,
                                 .lowtok_threshold = ctx->lowtok_threshold};
    const int64_t chunk_limit = pf->format == MOE_FORMAT_BATCHED && st->capacity < max_chunk ? st->capacity
                                                                                               : max_chunk;
    moe_status tst = moe_tuning_apply(p, chunk_limit);
    if (tst != MOE_OK) {
        plan_discard(p);
        return tst;
    }
    plan_text(p);
    if (st->parallel) {
        /* collective: every rank checks that every other has the same plan */
        moe_status pst2 = moe_par_create(st, p->text, p->hash, par->comm);
        if (pst2 != MOE_OK) {
            plan_discard(p);
            return pst2;
        }
    }
    moe_par_shard(&st->desc, &st->par, &st->shard);
    /* Every cost nobody asked for is logged with its size (report.c: the kernel table's
     * fallbacks, padding, duplicated memory; moe_plan_report gives the same as data). */
    moe_plan_log_costs(p);
    /* TP knobs given to a ctx whose plan has no TP: one WARNING per ctx (moe.h "Idle knobs") */
    if (par->tp_size == 1 && (ctx->tp_idle[0][0] || ctx->tp_idle[1][0]) && !atomic_exchange(&ctx->tp_idle_logged, 1))
        for (int i = 0; i < 2; i++)
            if (ctx->tp_idle[i][0])
                moe_log(ctx, MOE_LOG_WARN, "%s", ctx->tp_idle[i]);
    *out = p;
    return MOE_OK;
}

void moe_plan_free(moe_plan *plan)
{
    if (!plan)
        return;
    moe_par_free(plan->st.mpi);
    moe_ep_map_free(&plan->st.epmap);
    moe_placement_clear(&plan->st.placement);
    free(plan);
}

const moe_parallel_config *moe_plan_parallel(const moe_plan *plan)
{
    return plan ? &plan->st.par : NULL;
}

moe_status moe_plan_expert_map(const moe_plan *plan, int32_t *out)
{
    if (!plan)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(plan->st.ctx, MOE_EINVAL, "moe_plan_expert_map: out is NULL");
    const moe_shard *sh = &plan->st.shard;
    for (int64_t e = 0; e < plan->st.desc.num_experts; e++)
        out[e] = -1;
    for (int64_t i = 0; i < sh->n_experts; i++) /* a rank holds a logical expert at most once */
        out[moe_shard_logical(sh, i)] = (int32_t)i;
    return MOE_OK;
}

void moe_plan_tp_rows(const moe_plan *plan, int64_t n_tokens, int64_t *begin, int64_t *end)
{
    int64_t b = 0, e = n_tokens > 0 ? n_tokens : 0;
    if (plan)
        moe_par_tp_rows(&plan->st, e, &b, &e);
    if (begin)
        *begin = b;
    if (end)
        *end = e;
}

const moe_placement *moe_plan_placement(const moe_plan *plan)
{
    return plan ? &plan->st.placement : NULL;
}

const moe_layer_desc *moe_plan_desc(const moe_plan *plan)
{
    return plan ? &plan->st.desc : NULL;
}

moe_compute moe_plan_compute(const moe_plan *plan)
{
    return plan ? plan->st.compute : MOE_COMPUTE_F32;
}

const char *moe_plan_text(const moe_plan *plan)
{
    return plan ? plan->text : "";
}

uint64_t moe_plan_hash(const moe_plan *plan)
{
    return plan ? plan->hash : 0;
}


static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* What a parallel rebalance builds beside the plan before the ranks agree. */
typedef struct rebal_staging {
    moe_placement placement; /* copy of next */
    moe_ep_map epmap;        /* its routing tables */
    moe_weights_stage w;     /* this rank's new share of the weights */
} rebal_staging;

/* This rank's staging for next (checked valid): its placement copy, routing tables, and the
 * weights of its new share (only the logical experts new to it read from src). Errors
 * recorded on ctx; nothing left allocated on error. */
static moe_status rebal_stage(moe_plan *plan, moe_weights *weights, const moe_placement *next,
                              const moe_weight_source *src, rebal_staging *s)
{
    moe_ctx *ctx = plan->st.ctx;
    memset(s, 0, sizeof *s);
    if (moe_placement_copy(&s->placement, next) != 0)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_rebalance: out of memory copying next");
    if (moe_ep_map_build(&s->placement, &s->epmap) != 0) {
        moe_placement_clear(&s->placement);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_rebalance: out of memory for next's routing tables");
    }
    moe_parallel_config par = plan->st.par;
    par.placement = &s->placement;
    moe_shard sh;
    moe_par_shard(&plan->st.desc, &par, &sh);
    moe_status st = moe_weights_stage_build(weights, &sh, src, &s->w);
    if (st != MOE_OK) {
        moe_ep_map_free(&s->epmap);
        moe_placement_clear(&s->placement);
    }
    return st;
}

static void rebal_discard(rebal_staging *s)
{
    moe_weights_stage_free(&s->w);
    moe_ep_map_free(&s->epmap);
    moe_placement_clear(&s->placement);
}

/* The checks of next for this plan beyond moe_placement_check (the ones plan creation makes
 * of parallel.placement). */
static moe_status rebal_check_next(const moe_plan *plan, const moe_placement *next)
{
    if (plan->pf != &moe_pf_ep_batched)
        return MOE_OK;
    const moe_parallel_config *par = &plan->st.par;
    int64_t emax = 1;
    for (int r = 0; r < par->ep_size; r++)
        emax = next->rank_num_physical[r] > emax ? next->rank_num_physical[r] : emax;
    if (plan->st.capacity > (int64_t)(INT32_MAX / 4) / (emax * par->ep_size))
        return moe_set_error(plan->st.ctx, MOE_EINVAL,
                             "moe_plan_rebalance: next puts %lld physical experts on one rank, too many for "
                             "batched_capacity = %lld on %d ranks (slot blocks would exceed 2^31 slots)",
                             (long long)emax, (long long)plan->st.capacity, par->ep_size);
    return MOE_OK;
}

/* moe_parallel.h moe_plan_rebalance. One process: the identity only (a no-op success). A
 * parallel plan: every rank stages its new share beside the current weights, the ranks agree
 * on the plan's rebalance communicator (mpi.c), and only then does every rank switch. */
moe_status moe_plan_rebalance(moe_plan *plan, struct moe_weights *weights, const moe_placement *next,
                              const struct moe_weight_source *src, moe_rebalance_report *report)
{
    if (!plan)
        return MOE_EINVAL;
    moe_ctx *ctx = plan->st.ctx;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    moe_status st = MOE_OK;
    if (plan->st.parallel && (st = moe_par_rebalance_usable(&plan->st)) != MOE_OK)
        return st; /* no collective: the communicator cannot take one */
    /* a parallel plan's ranks take part in the agreement whatever failed here, so every rank
     * fails together (naming this one) instead of waiting for it */
    if (!weights || !next || !src)
        st = moe_set_error(ctx, MOE_EINVAL, "moe_plan_rebalance: %s is NULL",
                           !weights ? "weights" : !next ? "next" : "src");
    else if (weights->plan != plan)
        st = moe_set_error(ctx, MOE_EINVAL, "moe_plan_rebalance: the weights were created for another plan");
    else if ((st = moe_placement_check(ctx, next, plan->st.desc.num_experts, plan->st.par.ep_size)) != MOE_OK)
        st = moe_set_error(ctx, st, "moe_plan_rebalance: next %s", moe_ctx_last_error(ctx));
    else if (plan->st.parallel)
        st = rebal_check_next(plan, next);
    if (!plan->st.parallel) {
        if (st != MOE_OK)
            return st;
        /* one process: next passed the check, so it is the identity, the placement already held */
        if (report)
            *report = (moe_rebalance_report){
                .experts_kept = plan->st.desc.num_experts,
                .experts_packed = 0,
                .experts_freed = 0,
                .bytes_packed = 0,
                .bytes_resident = weights->expert_bytes,
                .seconds = seconds_since(&t0),
            };
        return MOE_OK;
    }
    rebal_staging s;
    memset(&s, 0, sizeof s);
    if (st == MOE_OK)
        st = rebal_stage(plan, weights, next, src, &s);
    const moe_status agreed = moe_par_rebalance_agree(&plan->st, next, st);
    if (agreed != MOE_OK) {
        rebal_discard(&s); /* st != MOE_OK left nothing staged: harmless */
        return agreed;
    }
    /* Every rank agreed: switch (nothing below can fail). */
    moe_stage *stg = &plan->st;
    moe_ep_map_free(&stg->epmap);
    moe_placement_clear(&stg->placement);
    stg->placement = s.placement;
    stg->epmap = s.epmap;
    stg->par.placement = &stg->placement;
    moe_par_shard(&stg->desc, &stg->par, &stg->shard);
    moe_par_placement_changed(stg);
    plan_text(plan);
    const moe_weights_stage *ws = &s.w;
    const int64_t kept = ws->kept, packed = ws->packed, freed = ws->freed;
    const size_t bytes_packed = ws->bytes_packed;
    moe_weights_stage_commit(weights, &s.w);
    const double secs = seconds_since(&t0);
    moe_log(ctx, MOE_LOG_INFO,
            "rebalance: ep_rank %d now holds %lld physical experts (%lld kept, %lld packed anew, %lld dropped): %zu bytes "
            "packed, %zu bytes of expert weights resident, %.3f s; plan hash %016llx",
            stg->par.ep_rank, (long long)stg->shard.n_experts, (long long)kept, (long long)packed, (long long)freed,
            bytes_packed, weights->expert_bytes, secs, (unsigned long long)plan->hash);
    if (report)
        *report = (moe_rebalance_report){
            .experts_kept = kept,
            .experts_packed = packed,
            .experts_freed = freed,
            .bytes_packed = bytes_packed,
            .bytes_resident = weights->expert_bytes,
            .seconds = secs,
        };
    return MOE_OK;
}
