/* The forward pass: route -> prepare -> experts -> finalize (and under TP the sum of the
 * partial outputs), in chunks of at most chunk_size tokens, on a workspace the caller sized
 * with moe_plan_workspace_size: execute never allocates (tests/unit/test_noalloc.c counts). */
#include "core/bf16.h"
#include "layer/layer.h"
#include "parallel/parallel.h"
#include "quant/pack.h"
#include "quant/quant.h"
#include "route/route.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Workspace of one chunk of Tc tokens, as byte offsets (each slice 64-byte aligned). I and
 * I_s are this rank's shards; under EP the experts' rows live in the parallel slice. */
typedef struct ws_layout {
    size_t xf;       /* [Tc, H] f32: bf16 hidden_states converted */
    size_t logits;   /* [Tc, E + Z] f32 (Z identity experts) */
    size_t ids;      /* [Tc, K] i32 */
    size_t wts;      /* [Tc, K] f32 */
    size_t scores;   /* [E] f32 */
    size_t offsets;  /* [E + 2] i64 */
    size_t begin;    /* [E] i64 */
    size_t end;      /* [E] i64 */
    size_t item_off; /* [E + 1] i64 */
    size_t rows;     /* [Tc * K] i32, sorted by expert */
    size_t pos;      /* [Tc * K] i32, position of each (t, k) row in y */
    size_t keys;     /* [Tc * K] u64 (packed permute) */
    size_t keys_tmp; /* [Tc * K] u64 */
    size_t bids;     /* [Tc * K] i32 bucketed ids (identity experts, empty slots) */
    size_t slots;    /* local batched: [E * cap, H] f32 */
    size_t h;        /* [max(positions * I, Tc * Is)] f32; positions = Tc*K or E*cap (0 under EP) */
    size_t y;        /* [positions, H] f32 */
    size_t sgate;    /* [Tc] f32 shared-expert gate */
    size_t partial;  /* TP: [Tc, H] f32 this rank's partial output */
    size_t outf;     /* [Tc, H] f32: the chunk's output before rounding (output_dtype BF16) */
    size_t scratch;  /* [threads, moe_gemm_thread_scratch_floats()] f32 */
    size_t par;      /* moe_par_workspace_bytes(plan, Tc): EP buffers, TP gather */
    size_t load;     /* [E] i64 expert_load of this execute so far, over its chunks (added
                        to moe_exec_args.expert_load only once every chunk succeeded) */
    size_t capcount; /* [E] i64 (expert_capacity > 0): tokens of the current sequence each
                        expert has taken so far, over the chunks */
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
    const moe_stage *st = &p->st;
    const moe_layer_desc *d = &st->desc;
    const size_t T = (size_t)Tc, H = (size_t)d->hidden_size, E = (size_t)d->num_experts;
    const size_t K = (size_t)d->top_k, I = (size_t)st->shard.I;
    const size_t R = (size_t)moe_route_width(d); /* E + Z: the router's width */
    const size_t Is = (size_t)st->shard.Is;
    const int ep_mode = st->par.ep_size > 1;
    ws_layout l;
    size_t c = 0;
    l.xf = take(&c, T * H * 4);
    l.logits = take(&c, T * R * 4);
    l.ids = take(&c, T * K * 4);
    l.wts = take(&c, T * K * 4);
    l.scores = take(&c, moe_route_scratch_bytes(d));
    l.offsets = take(&c, (E + 2) * 8);
    l.begin = take(&c, E * 8);
    l.end = take(&c, E * 8);
    l.item_off = take(&c, (E + 1) * 8);
    l.rows = take(&c, T * K * 4);
    l.pos = take(&c, T * K * 4);
    l.keys = take(&c, T * K * 8);
    l.keys_tmp = take(&c, T * K * 8);
    l.bids = take(&c, T * K * 4); /* any plan may get empty slots (given -1) */
    const size_t cap = ep_mode ? 0 : (size_t)st->capacity;
    const size_t positions = ep_mode ? 0 : cap > 0 ? E * cap : T * K;
    l.slots = take(&c, cap > 0 ? E * cap * H * 4 : 0);
    size_t hn = positions * I > T * Is ? positions * I : T * Is;
    l.h = take(&c, hn * 4);
    l.y = take(&c, positions * H * 4);
    l.sgate = take(&c, T * 4);
    l.partial = take(&c, st->par.tp_size > 1 ? T * H * 4 : 0);
    l.outf = take(&c, T * H * 4);
    l.scratch = take(&c, (size_t)st->ctx->num_threads * moe_gemm_thread_scratch_floats() * 4);
    l.par = take(&c, moe_par_workspace_bytes(st, Tc));
    l.load = take(&c, E * 8);
    l.capcount = take(&c, d->expert_capacity > 0 ? E * 8 : 0);
    l.total = c + 64; /* room to align the caller's pointer up to 64 bytes */
    return l;
}

size_t moe_plan_workspace_size(const moe_plan *plan, int64_t max_tokens)
{
    if (!plan || max_tokens <= 0)
        return 0;
    return layout(plan, moe_plan_max_chunk(plan, max_tokens)).total;
}

/* The longest chunk (<= chunk_size) a workspace of `size` bytes at `ws` fits. */
static int64_t fit_tokens(const moe_plan *p, const void *ws, size_t size)
{
    if (!ws)
        return 0;
    int64_t lo = 0, hi = p->st.chunk_size;
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
           a->has_expert_bias == b->has_expert_bias && a->has_output_bias == b->has_output_bias &&
           a->has_output_norm == b->has_output_norm && a->num_identity_experts == b->num_identity_experts;
}

/* The quantization config's identity: "none", or the canonical text (moe_quant_text) of an
 * active one, into buf. */
static void quant_identity(const moe_quant_config *q, char *buf, size_t n)
{
    if (moe_quant_active(q))
        moe_quant_text(q, buf, n);
    else
        snprintf(buf, n, "none");
}

/* Whether weights packed by plan wp can be executed by plan p: the layer's sizes, dtypes and
 * biases, the quantization config (scheme, scale granularity, block and group sizes, zero
 * points, activation quantization) and the compute mode all decide how the weights were packed.
 * 0: they match; otherwise MOE_EINVAL recorded on p's ctx naming what differs. */
static moe_status check_packed_for(const moe_plan *wp, const moe_plan *p)
{
    moe_ctx *ctx = p->st.ctx;
    if (wp == p)
        return MOE_OK;
    const moe_layer_desc *wd = &wp->st.desc, *d = &p->st.desc;
    if (!same_desc(wd, d))
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: weights were packed for a different layer description");
    char wq[256], pq[256];
    quant_identity(&wd->quant, wq, sizeof wq);
    quant_identity(&d->quant, pq, sizeof pq);
    if (strcmp(wq, pq) != 0) {
        const char *wn = moe_quant_active(&wd->quant) ? moe_quant_name(&wd->quant) : "none";
        const char *pn = moe_quant_active(&d->quant) ? moe_quant_name(&d->quant) : "none";
        if (strcmp(wn, pn) != 0)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "moe_plan_execute: weights were packed for quantization %s, this "
                                 "plan's quantization is %s: pack the weights with this plan (moe_weights_create)",
                                 wn, pn);
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_execute: weights were packed for quantization %s [%s], this plan's "
                             "quantization is %s [%s]: pack the weights with this plan (moe_weights_create)",
                             wn, wq, pn, pq);
    }
    if (wp->st.compute != p->st.compute)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_execute: weights were packed for compute %s, this plan computes in %s: pack "
                             "the weights with this plan (moe_weights_create)",
                             moe_compute_name(wp->st.compute), moe_compute_name(p->st.compute));
    return MOE_OK;
}

static int same_shard(const moe_shard *a, const moe_shard *b)
{
    if (!(a->p0 == b->p0 && a->n_experts == b->n_experts && a->i0 == b->i0 && a->I == b->I && a->is0 == b->is0 &&
          a->Is == b->Is && a->down_bias == b->down_bias))
        return 0;
    for (int64_t i = 0; i < a->n_experts; i++) /* the same logical expert in every local slot */
        if (moe_shard_logical(a, i) != moe_shard_logical(b, i))
            return 0;
    return 1;
}

/* y [H] = w [H] * (y * r), r = 1 / sqrtf(sum_k y_k^2 / H + eps), the sum by one fmaf per term in
 * increasing k (moe.h has_output_norm; src/ref writes the same operations) */
static void moe_output_rmsnorm(float *y, const float *w, int64_t H, float eps)
{
    float ss = 0.0f;
    for (int64_t k = 0; k < H; k++)
        ss = fmaf(y[k], y[k], ss);
    const float r = 1.0f / sqrtf(ss / (float)H + eps);
    for (int64_t k = 0; k < H; k++)
        y[k] = w[k] * (y[k] * r);
}

/* Where the expert-capacity count stands between chunks: the sequence the next token
 * belongs to and how many of that sequence's tokens are still to come. */
typedef struct cap_cursor {
    int64_t next_seq; /* next entry of sequence_lengths to start */
    int64_t left;     /* tokens of the current sequence not yet seen */
} cap_cursor;

/* moe.h expert_capacity: the K = 1 slots of tokens [0, Tc) of this chunk, in token order,
 * counted per expert within each sequence; a slot past the expert's first C of its sequence
 * becomes empty (id -1, weight 0). count [E] and *cur carry the state over the chunks. */
static void apply_capacity(const moe_layer_desc *d, const moe_exec_args *a, int64_t Tc, int32_t *ids, float *wts,
                           int64_t *count, cap_cursor *cur)
{
    const int64_t E = d->num_experts, C = d->expert_capacity;
    for (int64_t t = 0; t < Tc; t++) {
        while (cur->left == 0 && cur->next_seq < a->n_sequences) { /* empty sequences are skipped */
            cur->left = a->sequence_lengths[cur->next_seq++];
            memset(count, 0, sizeof(int64_t) * (size_t)E);
        }
        const int32_t e = ids[t]; /* [K = 1] */
        if (e >= 0 && e < E && ++count[e] > C) {
            ids[t] = -1;
            wts[t] = 0.0f;
        }
        cur->left--;
    }
}

/* One chunk: tokens [t0, t0 + Tc): route, shared expert, prepare, experts, finalize (and under
 * TP the sum of the partial outputs). Parallel plans run every chunk index on every rank,
 * so Tc may be 0 here (a rank out of tokens still serves its peers' rows). */
static moe_status run_chunk(const moe_plan *p, const moe_exec_knobs *kn, const moe_weights *w,
                            const moe_exec_args *a, int64_t t0, int64_t Tc, int64_t tc_max, unsigned char *ws,
                            const ws_layout *l, moe_exec_stats *stats, cap_cursor *cap)
{
    const moe_stage *st = &p->st;
    const moe_ctx *ctx = st->ctx;
    const moe_layer_desc *d = &st->desc;
    const int64_t H = d->hidden_size, E = d->num_experts, K = d->top_k;
    const int64_t R = moe_route_width(d); /* E + Z scored */
    const int64_t Is = st->shard.Is;
    const int tp = st->par.tp_size > 1;
    float *scratch = (float *)(ws + l->scratch);
    if (Tc == 0 && st->par.ep_size == 1)
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

    /* route: logits [Tc, E + Z] -> ids, wts [Tc, K] (ids >= E: identity experts) */
    int32_t *ids = (int32_t *)(ws + l->ids);
    float *wts = (float *)(ws + l->wts);
    if (Tc > 0 && a->in_topk_ids) {
        /* caller-given routing (validated by check_args), copied: the stages read ids/wts */
        memcpy(ids, a->in_topk_ids + t0 * K, sizeof(int32_t) * (size_t)(Tc * K));
        memcpy(wts, a->in_topk_weights + t0 * K, sizeof(float) * (size_t)(Tc * K));
    } else if (Tc > 0) {
        const float *logits;
        if (a->router_logits) {
            logits = a->router_logits + t0 * R;
        } else {
            float *lg = (float *)(ws + l->logits);
            moe_gemm_rows(ctx, &w->router, x, H, Tc, lg, R, scratch);
            moe_route_add_bias(w->router_bias, Tc, R, lg);
            logits = lg;
        }
        moe_route_topk(d, w->sel_bias, logits, Tc, ids, wts, ws + l->scores, (moe_topk_method)kn->topk);
        if (d->expert_capacity > 0) /* Switch's capacity, on libmoe's routing only */
            apply_capacity(d, a, Tc, ids, wts, (int64_t *)(ws + l->capcount), cap);
    }
    /* expert load: this rank's (t, k) rows per logical expert, after routing (libmoe's or the
     * caller's), before any dispatch; into the workspace's per-execute counts (see
     * moe_plan_execute_ex) */
    if (Tc > 0 && a->expert_load) {
        int64_t *load = (int64_t *)(ws + l->load); /* [E] */
        for (int64_t i = 0; i < Tc * K; i++)
            if (ids[i] >= 0 && ids[i] < E)
                load[ids[i]]++;
    }

    /* rows: the chunk's f32 output rows [Tc, H]: the caller's (F32 output) or the staging
     * slice (BF16 output, rounded into the caller's rows at the end of the chunk).
     * out: rows, or under TP this rank's partial output [Tc, H] (summed into rows) */
    const int bf16_out = a->output_dtype == MOE_DTYPE_BF16;
    float *rows = bf16_out ? (float *)(ws + l->outf) : Tc > 0 ? (float *)a->output + t0 * H : NULL;
    float *out = tp ? (float *)(ws + l->partial) : rows;
    moe_chunk c = {
        .st = st, .knobs = kn, .experts = w->experts, .x = x, .T = Tc, .t0 = t0, .ids = ids, .wts = wts, .out = out,
        .has_shared = Is > 0, .sgate = (float *)(ws + l->sgate),
        .offsets = (int64_t *)(ws + l->offsets), .begin = (int64_t *)(ws + l->begin),
        .end = (int64_t *)(ws + l->end), .rows = (int32_t *)(ws + l->rows), .pos = (int32_t *)(ws + l->pos),
        .keys = (uint64_t *)(ws + l->keys), .keys_tmp = (uint64_t *)(ws + l->keys_tmp), .bids = (int32_t *)(ws + l->bids),
        .slots = (float *)(ws + l->slots), .h = (float *)(ws + l->h), .y = (float *)(ws + l->y),
        .scratch = scratch, .item_off = (int64_t *)(ws + l->item_off), .stats = stats,
        .tc_max = tc_max, .par_ws = ws + l->par,
    };

    /* shared expert first (this rank's I_s shard under TP), straight into out; its scale into sgate */
    if (Is > 0 && Tc > 0) {
        float *sgate = (float *)(ws + l->sgate);
        int64_t b0 = 0, e0 = Tc;
        moe_mlp_groups sg = {.experts = &w->shared, .x = x, .n_groups = 1, .begin = &b0, .end = &e0, .rows = NULL,
                             .row_div = 1, .h = c.h, .y = c.out, .lowtok_threshold = 0,
                             .compute = st->compute};
        /* the shared expert's activation: the routed one, or its own (has_shared_activation: HY-V4) */
        moe_layer_desc sd = *d;
        if (d->has_shared_activation)
            sd.activation = d->shared_activation;
        if (d->shared_swiglu_limit > 0.0f) /* its own limit (Step-3.7's swiglu_limits_shared) */
            sd.swiglu_limit = d->shared_swiglu_limit;
        moe_mlp_run(ctx, &sd, &sg, scratch, c.item_off, NULL);
        if (d->shared_expert_gated) {
            moe_gemm_rows(ctx, &w->shared_gate, x, H, Tc, sgate, 1, scratch);
            for (int64_t t = 0; t < Tc; t++)
                sgate[t] = 1.0f / (1.0f + expf(-sgate[t]));
        } else {
            for (int64_t t = 0; t < Tc; t++)
                sgate[t] = 1.0f;
        }
        if (d->shared_expert_scale != 1.0f) /* Cohere2-MoE's "average": 0.5 */
            for (int64_t t = 0; t < Tc; t++)
                sgate[t] = sgate[t] * d->shared_expert_scale;
    }

    moe_dispatch disp;
    moe_status rst = p->pf->prepare(&c, &disp);
    if (rst != MOE_OK)
        return rst;
    p->experts->run(&c, &disp);
    if ((rst = p->pf->finalize(&c, &disp)) != MOE_OK)
        return rst;
    if (tp && Tc > 0 && (rst = moe_par_tp_reduce(&c, t0, a->n_tokens, rows)) != MOE_OK)
        return rst;
    if ((w->output_bias || w->output_norm) && Tc > 0) {
        /* the block's last steps, on the complete rows this rank writes (as below): JetMoE's
         * output bias [H], then A.X-K1's output RMSNorm [H] */
        int64_t g0, g1;
        moe_par_tp_rows(st, a->n_tokens, &g0, &g1);
        const int64_t r0 = g0 - t0 < 0 ? 0 : g0 - t0 > Tc ? Tc : g0 - t0;
        const int64_t r1 = g1 - t0 < 0 ? 0 : g1 - t0 > Tc ? Tc : g1 - t0;
        for (int64_t t = r0; t < r1; t++) {
            if (w->output_bias)
                for (int64_t k = 0; k < H; k++)
                    rows[t * H + k] = rows[t * H + k] + w->output_bias[k];
            if (w->output_norm)
                moe_output_rmsnorm(rows + t * H, w->output_norm, H, d->output_norm_eps);
        }
    }
    if (bf16_out && Tc > 0) {
        /* round the rows this rank wrote: all Tc, or under TP reduce_scatter the rows of the
         * chunk this rank owns (moe_plan_tp_rows: the split of T over the TP ranks) */
        int64_t g0, g1; /* rows of T this rank writes */
        moe_par_tp_rows(st, a->n_tokens, &g0, &g1);
        const int64_t r0 = g0 - t0 < 0 ? 0 : g0 - t0 > Tc ? Tc : g0 - t0;
        const int64_t r1 = g1 - t0 < 0 ? 0 : g1 - t0 > Tc ? Tc : g1 - t0;
        uint16_t *ob = (uint16_t *)a->output + t0 * H; /* [Tc, H] bf16 */
        for (int64_t i = r0 * H; i < r1 * H; i++)
            ob[i] = moe_bf16_round(rows[i]);
    }

    if (Tc > 0 && a->topk_ids)
        memcpy(a->topk_ids + t0 * K, ids, sizeof(int32_t) * (size_t)(Tc * K));
    if (Tc > 0 && a->topk_weights)
        memcpy(a->topk_weights + t0 * K, wts, sizeof(float) * (size_t)(Tc * K));
    return MOE_OK;
}

/* Caller-given routing (moe_exec_args.in_topk_ids / in_topk_weights): both or neither, not
 * with router_logits, every id in [0, E), the K ids of a token distinct. */
static moe_status check_given_routing(const moe_plan *plan, const moe_exec_args *a)
{
    moe_ctx *ctx = plan->st.ctx;
    if (!a->in_topk_ids && !a->in_topk_weights)
        return MOE_OK;
    if (!a->in_topk_ids || !a->in_topk_weights)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: %s is set but %s is NULL: caller-given routing takes both",
                             a->in_topk_ids ? "in_topk_ids" : "in_topk_weights",
                             a->in_topk_ids ? "in_topk_weights" : "in_topk_ids");
    if (a->router_logits)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_execute: router_logits and in_topk_ids are both set: give the logits (libmoe "
                             "routes) or the routing (in_topk_ids / in_topk_weights), not both");
    const int64_t E = moe_route_width(&plan->st.desc), K = plan->st.desc.top_k; /* E + Z */
    for (int64_t t = 0; t < a->n_tokens; t++) {
        const int32_t *row = a->in_topk_ids + t * K; /* [K] */
        for (int64_t k = 0; k < K; k++) {
            if (row[k] == -1)
                continue; /* an empty slot (moe.h: as expert_capacity's drop) */
            if (row[k] < 0 || row[k] >= E)
                return moe_set_error(ctx, MOE_EINVAL,
                                     "moe_plan_execute: in_topk_ids[%lld][%lld] = %d (token %lld, slot %lld) is outside "
                                     "[0, %lld) (num_experts%s) and is not -1 (an empty slot)",
                                     (long long)t, (long long)k, (int)row[k], (long long)t, (long long)k, (long long)E,
                                     plan->st.desc.num_identity_experts ? " + num_identity_experts" : "");
            for (int64_t j = 0; j < k; j++)
                if (row[j] == row[k])
                    return moe_set_error(ctx, MOE_EINVAL,
                                         "moe_plan_execute: in_topk_ids[%lld][%lld] = %d repeats slot %lld of token %lld: "
                                         "the top_k experts of a token must be distinct",
                                         (long long)t, (long long)k, (int)row[k], (long long)j, (long long)t);
        }
    }
    return MOE_OK;
}

/* moe_exec_args.sequence_lengths for a plan with expert_capacity (other plans do not read
 * them): a count and array that agree, lengths >= 0 summing to n_tokens; none only where no
 * token can be dropped (n_tokens <= expert_capacity) or the routing is the caller's. */
static moe_status check_sequences(const moe_plan *plan, const moe_exec_args *a)
{
    moe_ctx *ctx = plan->st.ctx;
    const long long C = (long long)plan->st.desc.expert_capacity;
    if (C == 0)
        return MOE_OK;
    if (!a->sequence_lengths) {
        if (a->n_sequences != 0)
            return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: n_sequences = %lld but sequence_lengths is NULL",
                                 (long long)a->n_sequences);
        if (a->n_tokens > C && !a->in_topk_ids)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "moe_plan_execute: expert_capacity = %lld counts each expert's tokens per sequence and "
                                 "this call has %lld tokens without sequence boundaries: give sequence_lengths / "
                                 "n_sequences (a decode step of B sequences: B lengths of 1)",
                                 C, (long long)a->n_tokens);
        return MOE_OK;
    }
    if (a->n_sequences < 1)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: sequence_lengths is set but n_sequences = %lld (>= 1)",
                             (long long)a->n_sequences);
    int64_t sum = 0;
    for (int64_t i = 0; i < a->n_sequences; i++) {
        const int64_t n = a->sequence_lengths[i];
        if (n < 0 || n > a->n_tokens - sum)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "moe_plan_execute: sequence_lengths[%lld] = %lld %s (the lengths must be >= 0 and sum "
                                 "to n_tokens = %lld)",
                                 (long long)i, (long long)n, n < 0 ? "is negative" : "runs past the tokens",
                                 (long long)a->n_tokens);
        sum += n;
    }
    if (sum != a->n_tokens)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_execute: sequence_lengths sum to %lld over %lld sequences, n_tokens = %lld",
                             (long long)sum, (long long)a->n_sequences, (long long)a->n_tokens);
    return MOE_OK;
}

/* The checks of one rank's arguments (recorded on ctx). Parallel plans allow NULL
 * hidden_states and output with n_tokens = 0; their workspace is checked collectively. */
static moe_status check_args(const moe_plan *plan, const moe_weights *weights, const moe_exec_args *a)
{
    moe_ctx *ctx = plan->st.ctx;
    if (!weights || !a)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_execute: %s is NULL", !weights ? "weights" : "args");
    moe_status pst = check_packed_for(weights->plan, plan);
    if (pst != MOE_OK)
        return pst;
    if (!same_shard(&weights->shard, &plan->st.shard))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_execute: weights were packed for another share of the layer (physical experts "
                             "[%lld, %lld), I columns [%lld, %lld)) than this plan's rank holds (physical experts [%lld, "
                             "%lld), I columns [%lld, %lld)), or for another expert placement",
                             (long long)weights->shard.p0, (long long)(weights->shard.p0 + weights->shard.n_experts),
                             (long long)weights->shard.i0, (long long)(weights->shard.i0 + weights->shard.I),
                             (long long)plan->st.shard.p0, (long long)(plan->st.shard.p0 + plan->st.shard.n_experts),
                             (long long)plan->st.shard.i0, (long long)(plan->st.shard.i0 + plan->st.shard.I));
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
    if (a->output_dtype != MOE_DTYPE_F32 && a->output_dtype != MOE_DTYPE_BF16)
        return moe_set_error(ctx, MOE_EDTYPE, "moe_plan_execute: output_dtype %s, expected F32 or BF16",
                             moe_dtype_name(a->output_dtype));
    moe_status rs = check_given_routing(plan, a);
    if (rs != MOE_OK)
        return rs;
    if ((rs = check_sequences(plan, a)) != MOE_OK)
        return rs;
    if (plan->st.parallel)
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
    moe_ctx *ctx = plan->st.ctx;
    moe_status st = check_args(plan, weights, a);
    int64_t Tc, n_chunks, max_tokens;
    const moe_exec_knobs *kn = &plan->st.knobs; /* parallel plans: the context's */
    if (!plan->st.parallel) {
        if (st != MOE_OK || a->n_tokens == 0)
            return st;
        kn = moe_plan_knobs(plan, a->n_tokens); /* a tuning file's entry, or the context's */
        Tc = a->n_tokens < kn->chunk_size ? a->n_tokens : kn->chunk_size;
        n_chunks = (a->n_tokens + Tc - 1) / Tc;
        max_tokens = a->n_tokens;
    } else {
        /* collective: every rank learns every rank's token count, workspace and status */
        const int64_t T = st == MOE_OK ? a->n_tokens : 0;
        const int64_t fit = st == MOE_OK ? fit_tokens(plan, a->workspace, a->workspace_size) : 0;
        st = moe_par_begin(&plan->st, st, T, fit, &Tc, &n_chunks, &max_tokens);
        if (st != MOE_OK)
            return st;
    }

    moe_exec_stats local;
    moe_exec_stats *stp = a->stats ? a->stats : &local;
    memset(stp, 0, sizeof *stp);
    stp->isa = ctx->kernels->name;
    stp->prepare_finalize = plan->pf->name;
    stp->experts = plan->experts->name;
    stp->topk = kn->topk == MOE_TOPK_ROWMAX ? "rowmax" : "sort";
    stp->tuned_tokens = kn->tokens;
    stp->threads = ctx->num_threads;
    stp->chunk_tokens = Tc;
    stp->max_tokens = max_tokens;
    if (n_chunks == 0)
        return MOE_OK;
    ws_layout l = layout(plan, Tc);
    unsigned char *ws = (unsigned char *)(((uintptr_t)a->workspace + 63) & ~(uintptr_t)63);
    /* expert_load: the chunks count into the workspace's [E] slice, which is added to the
     * caller's array only after the last chunk succeeded, so an execute that fails (a peer's
     * error, a timeout) leaves the caller's counts untouched */
    int64_t *load = (int64_t *)(ws + l.load); /* [E] */
    const int64_t E = plan->st.desc.num_experts;
    if (a->expert_load)
        memset(load, 0, sizeof(int64_t) * (size_t)E);
    /* expert_capacity: one sequence of all the tokens without sequence_lengths (check_args
     * allowed that only where no token can be dropped), else the first is started by
     * apply_capacity */
    cap_cursor cap = {.next_seq = 0, .left = a->sequence_lengths ? 0 : a->n_tokens};
    if (plan->st.desc.expert_capacity > 0)
        memset(ws + l.capcount, 0, sizeof(int64_t) * (size_t)E);
    for (int64_t c = 0; c < n_chunks; c++) {
        const int64_t t0 = c * Tc;
        const int64_t n = a->n_tokens - t0 < 0 ? 0 : a->n_tokens - t0 < Tc ? a->n_tokens - t0 : Tc;
        st = run_chunk(plan, kn, weights, a, t0, n, Tc, ws, &l, stp, &cap);
        if (st != MOE_OK)
            return st;
        if (n > 0)
            stp->chunks++;
    }
    if (a->expert_load)
        for (int64_t e = 0; e < E; e++)
            a->expert_load[e] += load[e];
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

moe_status moe_plan_gather_load(const moe_plan *plan, const int64_t *local, int64_t *total)
{
    if (!plan)
        return MOE_EINVAL;
    if (!local || !total)
        return moe_set_error(plan->st.ctx, MOE_EINVAL, "moe_plan_gather_load: %s is NULL", !local ? "local" : "total");
    return moe_par_gather_load(&plan->st, local, total);
}
