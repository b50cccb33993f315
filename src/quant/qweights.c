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
    if (e < 0) { /* the shared expert: plain, in weight_dtype */
        const int64_t Is = d->shared_expert_intermediate_size;
        const size_t es = moe_dtype_size(w->dtype);
        const unsigned char *w13 = w->shared_w13;
        *gate = (moe_pmat){.data = w13, .dtype = w->dtype, .n = Is, .k = H};
        *up = (moe_pmat){.data = w13 + (size_t)(Is * H) * es, .dtype = w->dtype, .n = Is, .k = H};
        *down = (moe_pmat){.data = w->shared_w2, .dtype = w->dtype, .n = H, .k = Is};
        return;
    }
    const int64_t I = d->moe_intermediate_size;
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

/* Called by moe_weights_create after it has validated the common fields. */
moe_status moe_qweights_create(const moe_plan *plan, const moe_weight_source *src, moe_weights **out)
{
    moe_ctx *ctx = plan->ctx;
    const moe_layer_desc *d = &plan->desc;
    const moe_quant_config *qc = &d->quant;
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t Is = d->shared_expert_intermediate_size;
    if (plan->parallel)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "moe_weights_create: quantized experts (%s) under expert or tensor parallelism are not "
                             "implemented yet", moe_quant_name(qc));
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
    for (int64_t e = 0; e < E; e++) {
        const char *bad = !src->gate_scale[e] ? "gate_scale" : !src->up_scale[e] ? "up_scale"
                                             : !src->down_scale[e]              ? "down_scale"
                          : (qc->w13.has_zero_point && (!src->gate_zero[e] || !src->up_zero[e])) ? "gate_zero/up_zero"
                          : (qc->w2.has_zero_point && !src->down_zero[e])                        ? "down_zero"
                                                                                                 : NULL;
        if (bad)
            return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL", (long long)e, bad);
    }
    moe_weights *w = calloc(1, sizeof *w);
    moe_qweights *q = calloc(1, sizeof *q);
    if (!w || !q) {
        free(w);
        free(q);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory");
    }
    w->plan = plan;
    w->shard = plan->shard;
    w->dtype = d->weight_dtype;
    w->q = q;
    q->n = 3 * E;
    q->codes = calloc((size_t)q->n, sizeof(void *));
    q->scales = calloc((size_t)q->n, sizeof(void *));
    q->zeros = calloc((size_t)q->n, sizeof(void *));
    q->comp = calloc((size_t)q->n, sizeof(void *));
    q->qm = calloc((size_t)q->n, sizeof *q->qm);
    int fail = !q->codes || !q->scales || !q->zeros || !q->comp || !q->qm;
    size_t bytes = 0;
    for (int64_t i = 0; !fail && i < q->n; i++) {
        const int mat = (int)(i % 3);
        const moe_qweight *qw = mat == 2 ? &qc->w2 : &qc->w13;
        const int64_t N = mat == 2 ? H : I, K = mat == 2 ? I : H;
        const int kind = moe_quant_kind(qw, qc->act);
        const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
        size_t cb = moe_quant_packed_bytes(kind, N, K);
        q->codes[i] = moe_alloc_aligned(cb);
        q->scales[i] = moe_alloc_aligned(sizeof(float) * (size_t)(N * ng));
        if (qw->has_zero_point)
            q->zeros[i] = moe_alloc_aligned(sizeof(float) * (size_t)(N * ng));
        if (kind == MOE_QK_W8A8)
            q->comp[i] = moe_alloc_aligned(sizeof(int32_t) * (size_t)N);
        fail = !q->codes[i] || !q->scales[i] || (qw->has_zero_point && !q->zeros[i]) ||
               (kind == MOE_QK_W8A8 && !q->comp[i]);
        q->qm[i] = (struct moe_qmat){.kind = kind, .gk = gk, .ng = ng, .scale = q->scales[i], .zero = q->zeros[i],
                                     .comp = q->comp[i]};
        bytes += cb + sizeof(float) * (size_t)(N * ng) * (qw->has_zero_point ? 2 : 1) +
                 (kind == MOE_QK_W8A8 ? sizeof(int32_t) * (size_t)N : 0);
    }
    const size_t es = moe_dtype_size(d->weight_dtype);
    w->router_buf = moe_pack_f32(src->router, src->router_dtype, E, H);
    if (Is > 0) {
        w->shared_w13 = moe_alloc_aligned((size_t)(2 * Is * H) * es);
        w->shared_w2 = moe_alloc_aligned((size_t)(H * Is) * es);
        if (d->shared_expert_gated)
            w->shared_gate_buf = moe_pack_f32(src->shared_expert_gate, src->router_dtype, 1, H);
    }
    if (d->has_router_bias)
        w->router_bias = malloc(sizeof(float) * (size_t)E);
    if (d->has_selection_bias)
        w->sel_bias = malloc(sizeof(float) * (size_t)E);
    if (d->has_expert_bias)
        w->expert_bias = malloc(sizeof(float) * (size_t)E * (size_t)(2 * I + H));
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
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->num_threads)
    for (int64_t i = 0; i < q->n; i++) {
        const int64_t e = i / 3;
        const int mat = (int)(i % 3);
        const moe_qweight *qw = mat == 2 ? &qc->w2 : &qc->w13;
        const int64_t N = mat == 2 ? H : I, K = mat == 2 ? I : H;
        const void *codes = mat == 0 ? src->gate_proj[e] : mat == 1 ? src->up_proj[e] : src->down_proj[e];
        const void *scale = mat == 0 ? src->gate_scale[e] : mat == 1 ? src->up_scale[e] : src->down_scale[e];
        const uint8_t *zero = !qw->has_zero_point ? NULL
                              : mat == 0          ? src->gate_zero[e]
                              : mat == 1          ? src->up_zero[e]
                                                  : src->down_zero[e];
        q->qm[i].f8h = moe_quant_pack(qw, qc->act, codes, scale, zero, N, K, q->codes[i], q->scales[i],
                                      q->zeros[i], q->comp[i]);
    }
    int64_t exact_f8 = 0; /* fp8 matrices on the exact (slower) e4m3 decode, quant.h moe_qmat.f8h */
    size_t exact_f8_bytes = 0;
    for (int64_t i = 0; i < q->n; i++)
        if (q->qm[i].kind == MOE_QK_F8 && !q->qm[i].f8h) {
            exact_f8++;
            exact_f8_bytes += moe_quant_packed_bytes(MOE_QK_F8, i % 3 == 2 ? H : I, i % 3 == 2 ? I : H);
        }
    if (exact_f8 > 0)
        moe_log(ctx, MOE_LOG_WARN,
                "%lld of %lld fp8 expert matrices (%zu bytes of codes) hold NaN codes (0x7f/0xff) or scales with "
                "s * 256 above the f32 range: they run the exact e4m3 decode, slower than the f16 "
                "decode",
                (long long)exact_f8, (long long)q->n, exact_f8_bytes);
    for (int64_t e = 0; w->expert_bias && e < E; e++) {
        float *b = w->expert_bias + (size_t)e * (size_t)(2 * I + H); /* [2I + H] */
        bias_to_f32(b, src->gate_bias[e], src->expert_bias_dtype, I, gub_stride);
        bias_to_f32(b + I, src->up_bias[e], src->expert_bias_dtype, I, gub_stride);
        bias_to_f32(b + 2 * I, src->down_bias[e], src->expert_bias_dtype, H, 1);
    }
    if (w->router_bias)
        bias_to_f32(w->router_bias, src->router_bias, src->router_bias_dtype, E, 1);
    if (w->sel_bias)
        bias_to_f32(w->sel_bias, src->selection_bias, src->selection_bias_dtype, E, 1);
    if (Is > 0) {
        moe_pmat g, u, dn;
        moe_qweights_expert(w, -1, &g, &u, &dn);
        moe_pack_panels((void *)g.data, src->shared_gate_proj, w->dtype, Is, H);
        moe_pack_panels((void *)u.data, src->shared_up_proj, w->dtype, Is, H);
        moe_pack_panels((void *)dn.data, src->shared_down_proj, w->dtype, H, Is);
    }
    w->expert_bytes = bytes + (size_t)(3 * Is * H) * es;
    moe_log(ctx, MOE_LOG_INFO, "packed %lld experts (%s): %zu bytes of expert weights (codes and f32 scales)",
            (long long)E, moe_quant_name(qc), w->expert_bytes);
    *out = w;
    return MOE_OK;
}
