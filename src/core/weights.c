/* Weights packed once into the panel layout of core/kernels.h: this rank's share of the layer
 * (moe_shard: the local experts under EP, the I shard under TP; everything in one process). */
#include "core/kernels.h"
#include "quant/quant.h"

#include <stdlib.h>
#include <string.h>

static int dtype_ok(moe_dtype dt)
{
    return dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
}

void moe_weights_expert(const moe_weights *w, int64_t e, moe_pmat *gate, moe_pmat *up,
                        moe_pmat *down)
{
    if (w->q) {
        moe_qweights_expert(w, e, gate, up, down);
        return;
    }
    const moe_layer_desc *d = &w->plan->desc;
    const int64_t H = d->hidden_size;
    const int64_t I = e < 0 ? w->shard.Is : w->shard.I;
    const size_t es = moe_dtype_size(w->dtype);
    const unsigned char *w13 = e < 0 ? w->shared_w13 : (const unsigned char *)w->w13 + (size_t)e * (size_t)(2 * I * H) * es;
    const unsigned char *w2 = e < 0 ? w->shared_w2 : (const unsigned char *)w->w2 + (size_t)e * (size_t)(H * I) * es;
    *gate = (moe_pmat){.data = w13, .dtype = w->dtype, .n = I, .k = H};
    *up = (moe_pmat){.data = w13 + (size_t)(I * H) * es, .dtype = w->dtype, .n = I, .k = H};
    *down = (moe_pmat){.data = w2, .dtype = w->dtype, .n = H, .k = I};
}


/* Pack W [n, k] whose element (o, i) sits at src[o * so + i * si] (elements of dtype dt; src
 * need not be aligned) into the panel layout at dst. Row-major sources take
 * moe_pack_panels; the others (input-major, interleaved) are transposed here, panel by panel,
 * reading each input row's nw outputs (contiguous when so = 1). */
static void pack_strided(void *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so,
                         int64_t si)
{
    if (si == 1 && so >= k) {
        moe_pack_panels_ld(dst, src, dt, n, k, so); /* row-major, rows so apart */
        return;
    }
    const size_t es = moe_dtype_size(dt);
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (int64_t p = 0; p < moe_pmat_panels(n); p++) {
        const int nw = moe_pmat_panel_width(n, p);
        unsigned char *panel = d + (size_t)(p * MOE_PANEL * k) * es; /* [k][nw] */
        for (int64_t kk = 0; kk < k; kk++) {
            for (int j = 0; j < nw; j++) {
                const unsigned char *from = s + (size_t)((p * MOE_PANEL + j) * so + kk * si) * es;
                unsigned char *to = panel + (size_t)(kk * nw + j) * es;
                if (es == 2)
                    memcpy(to, from, 2);
                else
                    memcpy(to, from, 4);
            }
        }
    }
}

/* n elements of dtype dt at src[j * stride] (src need not be aligned) -> dst [n] f32, exact. */
static void bias_to_f32(float *dst, const void *src, moe_dtype dt, int64_t n, int64_t stride)
{
    const size_t es = moe_dtype_size(dt);
    const unsigned char *s = src;
    for (int64_t j = 0; j < n; j++)
        moe_convert_to_f32(dst + j, s + (size_t)(j * stride) * es, dt, 1);
}

void moe_weights_expert_bias(const moe_weights *w, int64_t e, const float **gate_bias,
                             const float **up_bias, const float **down_bias)
{
    if (!w->expert_bias || e < 0) {
        *gate_bias = *up_bias = *down_bias = NULL;
        return;
    }
    const moe_layer_desc *d = &w->plan->desc;
    const int64_t I = w->shard.I, H = d->hidden_size;
    const float *b = w->expert_bias + (size_t)e * (size_t)(2 * I + H); /* [2I + H] */
    *gate_bias = b;
    *up_bias = b + I;
    *down_bias = w->shard.down_bias ? b + 2 * I : NULL; /* under TP one rank adds b_d */
}

moe_status moe_weights_create(const moe_plan *plan, const moe_weight_source *src,
                              moe_weights **out)
{
    if (!out)
        return MOE_EINVAL;
    *out = NULL;
    if (!plan)
        return MOE_EINVAL;
    moe_ctx *ctx = plan->ctx;
    if (!src)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src is NULL");
    const moe_layer_desc *d = &plan->desc;
    const moe_shard sh = plan->shard;
    /* I and Is are the whole layer's (the source's shapes); El, Il, Isl this rank's share */
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t Is = d->shared_expert_intermediate_size;
    const int64_t e0 = sh.e0, El = sh.n_experts, Il = sh.I, Isl = sh.Is;
    if (!src->router)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->router is NULL");
    if (!dtype_ok(src->router_dtype))
        return moe_set_error(ctx, MOE_EDTYPE, "moe_weights_create: router dtype %s, expected F32, BF16 or F16",
                             moe_dtype_name(src->router_dtype));
    if (!src->gate_proj || !src->up_proj || !src->down_proj)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->%s is NULL",
                             !src->gate_proj ? "gate_proj" : !src->up_proj ? "up_proj" : "down_proj");
    for (int64_t e = e0; e < e0 + El; e++) { /* only this rank's experts are read */
        if (!src->gate_proj[e] || !src->up_proj[e] || !src->down_proj[e])
            return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL",
                                 (long long)e,
                                 !src->gate_proj[e] ? "gate_proj" : !src->up_proj[e] ? "up_proj" : "down_proj");
    }
    if (Is > 0 && (!src->shared_gate_proj || !src->shared_up_proj || !src->shared_down_proj))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_weights_create: the layer has a shared expert (I_shared %lld) but src->shared_%s is NULL",
                             (long long)Is,
                             !src->shared_gate_proj ? "gate_proj" : !src->shared_up_proj ? "up_proj" : "down_proj");
    if (Is > 0 && d->shared_expert_gated && !src->shared_expert_gate)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_weights_create: shared_expert_gated is set but src->shared_expert_gate is NULL");
    const struct {
        const char *name;
        int64_t so, si;
    } strides[] = {{"gate_up", src->gate_up_stride_out, src->gate_up_stride_in},
                   {"down", src->down_stride_out, src->down_stride_in}};
    for (size_t i = 0; i < 2; i++) {
        if ((strides[i].so == 0) != (strides[i].si == 0) || strides[i].so < 0 || strides[i].si < 0)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "moe_weights_create: src->%s_stride_out = %lld, %s_stride_in = %lld: both 0 "
                                 "(row-major) or both >= 1",
                                 strides[i].name, (long long)strides[i].so, strides[i].name, (long long)strides[i].si);
    }
    if (src->gate_up_bias_stride < 0)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->gate_up_bias_stride = %lld is negative",
                             (long long)src->gate_up_bias_stride);
    if (d->has_router_bias && !src->router_bias)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: has_router_bias is set but src->router_bias is NULL");
    if (d->has_selection_bias && !src->selection_bias)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_weights_create: has_selection_bias is set but src->selection_bias is NULL");
    if (d->has_expert_bias && (!src->gate_bias || !src->up_bias || !src->down_bias))
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: has_expert_bias is set but src->%s is NULL",
                             !src->gate_bias ? "gate_bias" : !src->up_bias ? "up_bias" : "down_bias");
    if (d->has_expert_bias) {
        for (int64_t e = e0; e < e0 + El; e++) {
            if (!src->gate_bias[e] || !src->up_bias[e] || !src->down_bias[e])
                return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL",
                                     (long long)e,
                                     !src->gate_bias[e] ? "gate_bias" : !src->up_bias[e] ? "up_bias" : "down_bias");
        }
    }
    const struct {
        const char *name;
        int used;
        moe_dtype dt;
    } bias_dts[] = {{"router_bias_dtype", d->has_router_bias, src->router_bias_dtype},
                    {"selection_bias_dtype", d->has_selection_bias, src->selection_bias_dtype},
                    {"expert_bias_dtype", d->has_expert_bias, src->expert_bias_dtype}};
    for (size_t i = 0; i < 3; i++) {
        if (bias_dts[i].used && !dtype_ok(bias_dts[i].dt))
            return moe_set_error(ctx, MOE_EDTYPE, "moe_weights_create: src->%s is %s, expected F32, BF16 or F16",
                                 bias_dts[i].name, moe_dtype_name(bias_dts[i].dt));
    }
    const int64_t gu_so = src->gate_up_stride_out ? src->gate_up_stride_out : H;
    const int64_t gu_si = src->gate_up_stride_in ? src->gate_up_stride_in : 1;
    const int64_t dn_so = src->down_stride_out ? src->down_stride_out : I;
    const int64_t dn_si = src->down_stride_in ? src->down_stride_in : 1;
    const int64_t gub_stride = src->gate_up_bias_stride ? src->gate_up_bias_stride : 1;

    const size_t es = moe_dtype_size(d->weight_dtype);
    size_t w13_bytes = (size_t)El * (size_t)(2 * Il * H) * es;
    size_t w2_bytes = (size_t)El * (size_t)(H * Il) * es;
    size_t shared_bytes = (size_t)(3 * Isl * H) * es;

    if (moe_quant_active(&d->quant)) /* quantized experts: src/quant/qweights.c */
        return moe_qweights_create(plan, src, out);
    moe_weights *w = calloc(1, sizeof *w);
    if (!w)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory");
    w->plan = plan;
    w->shard = sh;
    w->dtype = d->weight_dtype;
    w->w13 = moe_alloc_aligned(w13_bytes); /* El x {gate [Il,H], up [Il,H]} packed */
    w->w2 = moe_alloc_aligned(w2_bytes);   /* El x [H, Il] packed */
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
    if (!w->w13 || !w->w2 || !w->router_buf || (Is > 0 && (!w->shared_w13 || !w->shared_w2)) ||
        (Is > 0 && d->shared_expert_gated && !w->shared_gate_buf) || (d->has_router_bias && !w->router_bias) ||
        (d->has_selection_bias && !w->sel_bias) || (d->has_expert_bias && !w->expert_bias)) {
        moe_weights_free(w);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory packing %zu bytes of expert weights",
                             w13_bytes + w2_bytes + shared_bytes);
    }
    w->router = (moe_pmat){.data = w->router_buf, .dtype = MOE_DTYPE_F32, .n = E, .k = H};
    w->shared_gate = (moe_pmat){.data = w->shared_gate_buf, .dtype = MOE_DTYPE_F32, .n = 1, .k = H};

    /* Experts are independent: pack them in parallel. Local expert le is global e0 + le; the
     * TP shard is the gate/up rows and the down columns [i0, i0 + Il). */
    const size_t bes = moe_dtype_size(src->expert_bias_dtype);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->num_threads)
    for (int64_t le = 0; le < El; le++) {
        const int64_t e = e0 + le;
        moe_pmat g, u, dn;
        moe_weights_expert(w, le, &g, &u, &dn);
        const unsigned char *gs = (const unsigned char *)src->gate_proj[e] + (size_t)(sh.i0 * gu_so) * es;
        const unsigned char *us = (const unsigned char *)src->up_proj[e] + (size_t)(sh.i0 * gu_so) * es;
        const unsigned char *ds = (const unsigned char *)src->down_proj[e] + (size_t)(sh.i0 * dn_si) * es;
        pack_strided((void *)g.data, gs, w->dtype, Il, H, gu_so, gu_si);
        pack_strided((void *)u.data, us, w->dtype, Il, H, gu_so, gu_si);
        pack_strided((void *)dn.data, ds, w->dtype, H, Il, dn_so, dn_si);
        if (w->expert_bias) {
            float *b = w->expert_bias + (size_t)le * (size_t)(2 * Il + H); /* [2Il + H] */
            const size_t boff = (size_t)(sh.i0 * gub_stride) * bes;
            bias_to_f32(b, (const unsigned char *)src->gate_bias[e] + boff, src->expert_bias_dtype, Il, gub_stride);
            bias_to_f32(b + Il, (const unsigned char *)src->up_bias[e] + boff, src->expert_bias_dtype, Il, gub_stride);
            bias_to_f32(b + 2 * Il, src->down_bias[e], src->expert_bias_dtype, H, 1);
        }
    }
    if (w->router_bias)
        bias_to_f32(w->router_bias, src->router_bias, src->router_bias_dtype, E, 1);
    if (w->sel_bias)
        bias_to_f32(w->sel_bias, src->selection_bias, src->selection_bias_dtype, E, 1);
    if (Is > 0) {
        /* the shared expert's TP shard: gate/up rows and down columns [is0, is0 + Isl) */
        moe_pmat g, u, dn;
        moe_weights_expert(w, -1, &g, &u, &dn);
        moe_pack_panels((void *)g.data, (const unsigned char *)src->shared_gate_proj + (size_t)(sh.is0 * H) * es,
                        w->dtype, Isl, H);
        moe_pack_panels((void *)u.data, (const unsigned char *)src->shared_up_proj + (size_t)(sh.is0 * H) * es,
                        w->dtype, Isl, H);
        moe_pack_panels_ld((void *)dn.data, (const unsigned char *)src->shared_down_proj + (size_t)sh.is0 * es,
                           w->dtype, H, Isl, Is);
    }
    w->expert_bytes = w13_bytes + w2_bytes + shared_bytes;
    moe_log(ctx, MOE_LOG_INFO,
            "packed %lld of %lld experts (ids %lld..%lld, I columns %lld..%lld of %lld, %s): %zu bytes of expert "
            "weights, no padding",
            (long long)El, (long long)E, (long long)e0, (long long)(e0 + El - 1), (long long)sh.i0,
            (long long)(sh.i0 + Il - 1), (long long)I, moe_dtype_name(w->dtype), w->expert_bytes);
    *out = w;
    return MOE_OK;
}

void moe_weights_free(moe_weights *w)
{
    if (!w)
        return;
    moe_qweights_free(w->q);
    moe_free_aligned(w->w13);
    moe_free_aligned(w->w2);
    moe_free_aligned(w->shared_w13);
    moe_free_aligned(w->shared_w2);
    moe_free_aligned(w->router_buf);
    moe_free_aligned(w->shared_gate_buf);
    free(w->router_bias);
    free(w->sel_bias);
    free(w->expert_bias);
    free(w);
}

size_t moe_weights_expert_bytes(const moe_weights *w)
{
    return w ? w->expert_bytes : 0;
}
