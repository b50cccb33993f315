/* Weights with quantized routed experts (desc->quant): the codes packed per expert and matrix
 * in the kernel layout of quant/quant.h, scales expanded to f32 beside them. The router, the
 * biases and the shared expert are packed as weights.c packs them. */
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

struct moe_qweights {
    int64_t n;             /* matrices: 3 per expert (gate, up, down) */
    uint8_t **codes;       /* [n] packed codes */
    float **scales;        /* [n] */
    float **zeros;         /* [n] or NULL entries */
    int32_t **comp;        /* [n] or NULL entries */
    struct moe_qmat *qm;   /* [n] */
};

void moe_qweights_free(moe_qweights *q)
{
    if (!q)
        return;
    for (int64_t i = 0; i < q->n; i++) {
        if (q->codes)
            moe_free_aligned(q->codes[i]);
        if (q->scales)
            moe_free_aligned(q->scales[i]);
        if (q->zeros)
            moe_free_aligned(q->zeros[i]);
        if (q->comp)
            moe_free_aligned(q->comp[i]);
    }
    free(q->codes);
    free(q->scales);
    free(q->zeros);
    free(q->comp);
    free(q->qm);
    free(q);
}

void moe_qweights_expert(const moe_weights *w, int64_t e, moe_pmat *gate, moe_pmat *up, moe_pmat *down)
{
    const moe_layer_desc *d = &w->plan->desc;
    const int64_t H = d->hidden_size;
    if (e < 0) { /* the shared expert: plain, in weight_dtype, this rank's I_s shard */
        const int64_t Is = w->shard.Is;
        const size_t es = moe_dtype_size(w->dtype);
        const unsigned char *w13 = w->shared_w13;
        *gate = (moe_pmat){.data = w13, .dtype = w->dtype, .n = Is, .k = H};
        *up = (moe_pmat){.data = w13 + (size_t)(Is * H) * es, .dtype = w->dtype, .n = Is, .k = H};
        *down = (moe_pmat){.data = w->shared_w2, .dtype = w->dtype, .n = H, .k = Is};
        return;
    }
    const int64_t I = w->shard.I; /* e is the local expert, I the shard's */
    const moe_qweights *q = w->q;
    *gate = (moe_pmat){.data = q->codes[3 * e], .dtype = MOE_DTYPE_U8, .n = I, .k = H, .q = &q->qm[3 * e]};
    *up = (moe_pmat){.data = q->codes[3 * e + 1], .dtype = MOE_DTYPE_U8, .n = I, .k = H, .q = &q->qm[3 * e + 1]};
    *down = (moe_pmat){.data = q->codes[3 * e + 2], .dtype = MOE_DTYPE_U8, .n = H, .k = I, .q = &q->qm[3 * e + 2]};
}

static void bias_to_f32(float *dst, const void *src, moe_dtype dt, int64_t n, int64_t stride)
{
    const size_t es = moe_dtype_size(dt);
    const unsigned char *s = src;
    for (int64_t j = 0; j < n; j++)
        moe_convert_to_f32(dst + j, s + (size_t)(j * stride) * es, dt, 1);
}

/* The scale cells along K of the source whose first column lies in [k0, k0 + Ks): this
 * shard's own cells. What a shard stores beyond them is held twice over the ranks (a cell cut
 * by a shard boundary is on both shards; a re-expressed cell repeats its scale), so the sum over
 * the TP ranks of the excess is what TP adds to the one-process scale bytes. */
static int64_t cells_owned(const moe_qweight *qw, int64_t K, int64_t k0, int64_t Ks)
{
    const int64_t gk = moe_quant_gk(qw, K);
    return (k0 + Ks - 1) / gk - (k0 + gk - 1) / gk + 1;
}

/* Called by moe_weights_create after it has validated the common fields. Packs this rank's
 * share (plan->shard): the local experts [e0, e0 + El) under EP; under TP the gate/up rows and
 * the down columns [i0, i0 + Il) of each, sliced at the level of the source matrices
 * (moe_quant_slice_source: a block or group cut by the shard boundary is re-expressed with a
 * finer cell that repeats its scale) and then packed like a whole matrix. */
moe_status moe_qweights_create(const moe_plan *plan, const moe_weight_source *src, moe_weights **out)
{
    moe_ctx *ctx = plan->ctx;
    const moe_layer_desc *d = &plan->desc;
    const moe_quant_config *qc = &d->quant;
    const moe_shard sh = plan->shard;
    /* H, I, Is the layer's (the source's shapes); El, Il, Isl this rank's share */
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t Is = d->shared_expert_intermediate_size;
    const int64_t e0 = sh.e0, El = sh.n_experts, i0 = sh.i0, Il = sh.I, Isl = sh.Is;
    const int cut = Il != I; /* TP: the source matrices are sliced */
    if (src->gate_up_stride_out || src->gate_up_stride_in || src->down_stride_out || src->down_stride_in)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "moe_weights_create: quantized experts must be row-major (src strides must be 0)");
    if (!src->gate_scale || !src->up_scale || !src->down_scale)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: quantized experts (%s) but src->%s is NULL",
                             moe_quant_name(qc), !src->gate_scale ? "gate_scale" : !src->up_scale ? "up_scale" : "down_scale");
    if ((qc->w13.has_zero_point && (!src->gate_zero || !src->up_zero)) || (qc->w2.has_zero_point && !src->down_zero))
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: zero points requested but src->%s is NULL",
                             qc->w2.has_zero_point && !src->down_zero ? "down_zero"
                             : !src->gate_zero                        ? "gate_zero"
                                                                      : "up_zero");
    for (int64_t e = e0; e < e0 + El; e++) { /* only this rank's experts are read */
        const char *bad = !src->gate_scale[e] ? "gate_scale" : !src->up_scale[e] ? "up_scale"
                                             : !src->down_scale[e]              ? "down_scale"
                          : (qc->w13.has_zero_point && (!src->gate_zero[e] || !src->up_zero[e])) ? "gate_zero/up_zero"
                          : (qc->w2.has_zero_point && !src->down_zero[e])                        ? "down_zero"
                                                                                                 : NULL;
        if (bad)
            return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL", (long long)e, bad);
    }
    /* The shard's granularity: w13 [Il, H] = rows [i0, i0 + Il) of [I, H]; w2 [H, Il] = columns
     * [i0, i0 + Il) of [H, I]. */
    moe_qweight q13 = qc->w13, q2 = qc->w2;
    if (moe_quant_slice_qweight(&qc->w13, i0, Il, 0, H, &q13) != 0 || moe_quant_slice_qweight(&qc->w2, 0, H, i0, Il, &q2) != 0)
        return moe_set_error(ctx, MOE_ESHAPE,
                             "moe_weights_create: %s experts under TP: this rank's shard of the intermediate size is "
                             "%lld columns (%lld..%lld of I = %lld over tp_size %d), odd, but the down projection packs "
                             "two codes per byte along I, so every shard must be even: choose tp_size so that I / "
                             "tp_size and the remainder split give even shards",
                             moe_quant_name(qc), (long long)Il, (long long)i0, (long long)(i0 + Il - 1), (long long)I,
                             plan->par.tp_size);
    if (qc->act == MOE_QACT_TOKEN_GROUP && i0 % qc->w2.block_k != 0)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "moe_weights_create: fp8 w8a8 (%s) under TP: this rank's shard of the intermediate size "
                             "starts at column %lld (of I = %lld over tp_size %d), inside a down-projection k-block of "
                             "%lld, so its activation groups of act_group_size %lld would not line up with the weight "
                             "blocks; choose tp_size so that every shard starts on a multiple of block_k, use EP, or "
                             "use weight-only fp8-block",
                             moe_quant_name(qc), (long long)i0, (long long)I, plan->par.tp_size,
                             (long long)qc->w2.block_k, (long long)qc->act_group_size);
    moe_weights *w = calloc(1, sizeof *w);
    moe_qweights *q = calloc(1, sizeof *q);
    if (!w || !q) {
        free(w);
        free(q);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory");
    }
    w->plan = plan;
    w->shard = sh;
    w->dtype = d->weight_dtype;
    w->q = q;
    q->n = 3 * El;
    q->codes = calloc((size_t)q->n, sizeof(void *));
    q->scales = calloc((size_t)q->n, sizeof(void *));
    q->zeros = calloc((size_t)q->n, sizeof(void *));
    q->comp = calloc((size_t)q->n, sizeof(void *));
    q->qm = calloc((size_t)q->n, sizeof *q->qm);
    int fail = !q->codes || !q->scales || !q->zeros || !q->comp || !q->qm;
    size_t bytes = 0, dup = 0; /* packed bytes; f32 scale (and zero) bytes repeated by cut cells */
    for (int64_t i = 0; !fail && i < q->n; i++) {
        const int mat = (int)(i % 3);
        const moe_qweight *qw = mat == 2 ? &q2 : &q13;
        const int64_t N = mat == 2 ? H : Il, K = mat == 2 ? Il : H;
        const int kind = moe_quant_kind(qw, qc->act);
        const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
        const size_t cb = moe_quant_packed_bytes(kind, N, K);
        q->codes[i] = moe_alloc_aligned(cb);                                 /* packed panels */
        q->scales[i] = moe_alloc_aligned(sizeof(float) * (size_t)(N * ng)); /* [N, ng] by panel */
        if (qw->has_zero_point)
            q->zeros[i] = moe_alloc_aligned(sizeof(float) * (size_t)(N * ng)); /* as scales */
        if (kind == MOE_QK_W8A8)
            q->comp[i] = moe_alloc_aligned(sizeof(int32_t) * (size_t)N); /* [N] */
        fail = !q->codes[i] || !q->scales[i] || (qw->has_zero_point && !q->zeros[i]) ||
               (kind == MOE_QK_W8A8 && !q->comp[i]);
        q->qm[i] = (struct moe_qmat){.kind = kind, .gk = gk, .ng = ng, .scale = q->scales[i], .zero = q->zeros[i],
                                     .comp = q->comp[i]};
        const size_t per = sizeof(float) * (qw->has_zero_point ? 2 : 1);
        bytes += cb + per * (size_t)(N * ng) + (kind == MOE_QK_W8A8 ? sizeof(int32_t) * (size_t)N : 0);
        const int64_t own = mat == 2 ? cells_owned(&qc->w2, I, i0, Il) : cells_owned(&qc->w13, H, 0, H);
        dup += per * (size_t)(N * (ng - own));
    }
    const size_t es = moe_dtype_size(d->weight_dtype);
    w->router_buf = moe_pack_f32(src->router, src->router_dtype, E, H); /* [E, H] f32 packed */
    if (Is > 0) {
        w->shared_w13 = moe_alloc_aligned((size_t)(2 * Isl * H) * es); /* gate, up [Isl, H] */
        w->shared_w2 = moe_alloc_aligned((size_t)(H * Isl) * es);      /* [H, Isl] */
        if (d->shared_expert_gated)
            w->shared_gate_buf = moe_pack_f32(src->shared_expert_gate, src->router_dtype, 1, H); /* [1, H] */
    }
    if (d->has_router_bias)
        w->router_bias = malloc(sizeof(float) * (size_t)E); /* [E] */
    if (d->has_selection_bias)
        w->sel_bias = malloc(sizeof(float) * (size_t)E); /* [E] */
    if (d->has_expert_bias)
        w->expert_bias = malloc(sizeof(float) * (size_t)El * (size_t)(2 * Il + H)); /* [El, 2Il + H] */
    if (fail || !w->router_buf || (Is > 0 && (!w->shared_w13 || !w->shared_w2)) ||
        (Is > 0 && d->shared_expert_gated && !w->shared_gate_buf) || (d->has_router_bias && !w->router_bias) ||
        (d->has_selection_bias && !w->sel_bias) || (d->has_expert_bias && !w->expert_bias)) {
        moe_weights_free(w);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory packing %zu bytes of quantized experts",
                             bytes);
    }
    w->router = (moe_pmat){.data = w->router_buf, .dtype = MOE_DTYPE_F32, .n = E, .k = H};
    w->shared_gate = (moe_pmat){.data = w->shared_gate_buf, .dtype = MOE_DTYPE_F32, .n = 1, .k = H};
    const int64_t gub_stride = src->gate_up_bias_stride ? src->gate_up_bias_stride : 1;
    int oom = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->num_threads)
    for (int64_t i = 0; i < q->n; i++) {
        const int64_t e = e0 + i / 3; /* the global expert of local matrix i */
        const int mat = (int)(i % 3);
        const moe_qweight *qw = mat == 2 ? &qc->w2 : &qc->w13; /* the source's granularity */
        const moe_qweight *lq = mat == 2 ? &q2 : &q13;         /* the shard's */
        const int64_t N = mat == 2 ? H : I, K = mat == 2 ? I : H;  /* source [N, K] */
        const int64_t Nl = mat == 2 ? H : Il, Kl = mat == 2 ? Il : H; /* shard [Nl, Kl] */
        const void *codes = mat == 0 ? src->gate_proj[e] : mat == 1 ? src->up_proj[e] : src->down_proj[e];
        const void *scale = mat == 0 ? src->gate_scale[e] : mat == 1 ? src->up_scale[e] : src->down_scale[e];
        const uint8_t *zero = !qw->has_zero_point ? NULL
                              : mat == 0          ? src->gate_zero[e]
                              : mat == 1          ? src->up_zero[e]
                                                  : src->down_zero[e];
        void *lc = NULL, *ls = NULL; /* the shard as a source matrix: codes, scales */
        uint8_t *lz = NULL;          /* and zero points, in the shapes of moe.h for lq */
        if (cut) {
            size_t cbytes, sbytes, zbytes;
            moe_quant_source_sizes(lq, Nl, Kl, &cbytes, &sbytes, &zbytes);
            lc = malloc(cbytes);
            ls = malloc(sbytes);
            lz = zbytes ? malloc(zbytes) : NULL;
            if (!lc || !ls || (zbytes && !lz)) {
#pragma omp atomic write
                oom = 1;
                free(lc);
                free(ls);
                free(lz);
                continue;
            }
            moe_quant_slice_source(qw, codes, scale, zero, N, K, mat == 2 ? 0 : i0, mat == 2 ? i0 : 0, lq, Nl, Kl, lc,
                                   ls, lz);
            codes = lc;
            scale = ls;
            zero = lz;
        }
        q->qm[i].f8h = moe_quant_pack(lq, qc->act, codes, scale, zero, Nl, Kl, q->codes[i], q->scales[i], q->zeros[i],
                                      q->comp[i]);
        free(lc);
        free(ls);
        free(lz);
    }
    if (oom) {
        moe_weights_free(w);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory slicing the TP shard of the experts");
    }
    int64_t exact_f8 = 0; /* fp8 matrices on the exact (slower) e4m3 decode, quant.h moe_qmat.f8h */
    size_t exact_f8_bytes = 0;
    for (int64_t i = 0; i < q->n; i++)
        if ((q->qm[i].kind == MOE_QK_F8 || q->qm[i].kind == MOE_QK_F8A8) && !q->qm[i].f8h) {
            exact_f8++;
            exact_f8_bytes += moe_quant_packed_bytes(MOE_QK_F8, i % 3 == 2 ? H : Il, i % 3 == 2 ? Il : H);
        }
    if (exact_f8 > 0)
        moe_log(ctx, MOE_LOG_WARN,
                "%lld of %lld fp8 expert matrices (%zu bytes of codes) hold NaN codes (0x7f/0xff) or scales with "
                "s * 256 above the f32 range: they run the exact e4m3 decode, slower than the f16 "
                "decode",
                (long long)exact_f8, (long long)q->n, exact_f8_bytes);
    const size_t bes = moe_dtype_size(src->expert_bias_dtype);
    for (int64_t le = 0; w->expert_bias && le < El; le++) {
        const int64_t e = e0 + le;
        float *b = w->expert_bias + (size_t)le * (size_t)(2 * Il + H); /* [2Il + H] */
        const size_t boff = (size_t)(i0 * gub_stride) * bes;
        bias_to_f32(b, (const unsigned char *)src->gate_bias[e] + boff, src->expert_bias_dtype, Il, gub_stride);
        bias_to_f32(b + Il, (const unsigned char *)src->up_bias[e] + boff, src->expert_bias_dtype, Il, gub_stride);
        bias_to_f32(b + 2 * Il, src->down_bias[e], src->expert_bias_dtype, H, 1);
    }
    if (w->router_bias)
        bias_to_f32(w->router_bias, src->router_bias, src->router_bias_dtype, E, 1);
    if (w->sel_bias)
        bias_to_f32(w->sel_bias, src->selection_bias, src->selection_bias_dtype, E, 1);
    if (Is > 0) {
        /* the shared expert's TP shard: gate/up rows and down columns [is0, is0 + Isl) */
        moe_pmat g, u, dn;
        moe_qweights_expert(w, -1, &g, &u, &dn);
        moe_pack_panels((void *)g.data, (const unsigned char *)src->shared_gate_proj + (size_t)(sh.is0 * H) * es,
                        w->dtype, Isl, H);
        moe_pack_panels((void *)u.data, (const unsigned char *)src->shared_up_proj + (size_t)(sh.is0 * H) * es,
                        w->dtype, Isl, H);
        moe_pack_panels_ld((void *)dn.data, (const unsigned char *)src->shared_down_proj + (size_t)sh.is0 * es,
                           w->dtype, H, Isl, Is);
    }
    w->expert_bytes = bytes + (size_t)(3 * Isl * H) * es;
    moe_log(ctx, MOE_LOG_INFO,
            "packed %lld of %lld experts (ids %lld..%lld, I columns %lld..%lld of %lld, %s): %zu bytes of expert "
            "weights (codes and f32 scales), no code padding",
            (long long)El, (long long)E, (long long)e0, (long long)(e0 + El - 1), (long long)i0,
            (long long)(i0 + Il - 1), (long long)I, moe_quant_name(qc), w->expert_bytes);
    if (cut && dup > 0)
        moe_log(ctx, MOE_LOG_INFO,
                "TP shard I %lld..%lld of %lld cuts the scale cells of %s (w2: %lld columns per cell, kept per %lld on "
                "this shard; w13 block rows %lld kept per %lld): %zu bytes of f32 scales on this rank repeat a cell "
                "another shard also holds or a finer cell repeats; no code padding",
                (long long)i0, (long long)(i0 + Il - 1), (long long)I, moe_quant_name(qc),
                (long long)moe_quant_gk(&qc->w2, I), (long long)moe_quant_gk(&q2, Il), (long long)qc->w13.block_n,
                (long long)q13.block_n, dup);
    *out = w;
    return MOE_OK;
}
