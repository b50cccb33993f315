/* Weights packed once into the panel layout of core/kernels.h. */
#include "core/kernels.h"

#include <stdlib.h>
#include <string.h>

static int dtype_ok(moe_dtype dt)
{
    return dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
}

void moe_weights_expert(const moe_weights *w, int64_t e, moe_pmat *gate, moe_pmat *up,
                        moe_pmat *down)
{
    const moe_layer_desc *d = &w->plan->desc;
    const int64_t H = d->hidden_size;
    const int64_t I = e < 0 ? d->shared_expert_intermediate_size : d->moe_intermediate_size;
    const size_t es = moe_dtype_size(w->dtype);
    const unsigned char *w13 = e < 0 ? w->shared_w13 : (const unsigned char *)w->w13 + (size_t)e * (size_t)(2 * I * H) * es;
    const unsigned char *w2 = e < 0 ? w->shared_w2 : (const unsigned char *)w->w2 + (size_t)e * (size_t)(H * I) * es;
    *gate = (moe_pmat){.data = w13, .dtype = w->dtype, .n = I, .k = H};
    *up = (moe_pmat){.data = w13 + (size_t)(I * H) * es, .dtype = w->dtype, .n = I, .k = H};
    *down = (moe_pmat){.data = w2, .dtype = w->dtype, .n = H, .k = I};
}

/* Convert a small [n, k] matrix to f32 and pack it. */
static void *pack_f32(const void *src, moe_dtype dt, int64_t n, int64_t k)
{
    float *tmp = malloc(sizeof(float) * (size_t)(n * k)); /* [n, k] f32 */
    float *dst = moe_alloc_aligned(sizeof(float) * (size_t)(n * k));
    if (!tmp || !dst) {
        free(tmp);
        moe_free_aligned(dst);
        return NULL;
    }
    moe_convert_to_f32(tmp, src, dt, (size_t)(n * k));
    moe_pack_panels(dst, tmp, MOE_DTYPE_F32, n, k);
    free(tmp);
    return dst;
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
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t Is = d->shared_expert_intermediate_size;
    if (!src->router)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->router is NULL");
    if (!dtype_ok(src->router_dtype))
        return moe_set_error(ctx, MOE_EDTYPE, "moe_weights_create: router dtype %s, expected F32, BF16 or F16",
                             moe_dtype_name(src->router_dtype));
    if (!src->gate_proj || !src->up_proj || !src->down_proj)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->%s is NULL",
                             !src->gate_proj ? "gate_proj" : !src->up_proj ? "up_proj" : "down_proj");
    for (int64_t e = 0; e < E; e++) {
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

    const size_t es = moe_dtype_size(d->weight_dtype);
    size_t per_expert = (size_t)(3 * I * H) * es;
    size_t w13_bytes = (size_t)E * (size_t)(2 * I * H) * es;
    size_t w2_bytes = (size_t)E * (size_t)(H * I) * es;
    size_t shared_bytes = (size_t)(3 * Is * H) * es;
    (void)per_expert;

    moe_weights *w = calloc(1, sizeof *w);
    if (!w)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory");
    w->plan = plan;
    w->dtype = d->weight_dtype;
    w->w13 = moe_alloc_aligned(w13_bytes); /* E x {gate [I,H], up [I,H]} packed */
    w->w2 = moe_alloc_aligned(w2_bytes);   /* E x [H, I] packed */
    w->router_buf = pack_f32(src->router, src->router_dtype, E, H); /* [E, H] f32 packed */
    if (Is > 0) {
        w->shared_w13 = moe_alloc_aligned((size_t)(2 * Is * H) * es);
        w->shared_w2 = moe_alloc_aligned((size_t)(H * Is) * es);
        if (d->shared_expert_gated)
            w->shared_gate_buf = pack_f32(src->shared_expert_gate, src->router_dtype, 1, H); /* [1, H] */
    }
    if (!w->w13 || !w->w2 || !w->router_buf || (Is > 0 && (!w->shared_w13 || !w->shared_w2)) ||
        (Is > 0 && d->shared_expert_gated && !w->shared_gate_buf)) {
        moe_weights_free(w);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory packing %zu bytes of expert weights",
                             w13_bytes + w2_bytes + shared_bytes);
    }
    w->router = (moe_pmat){.data = w->router_buf, .dtype = MOE_DTYPE_F32, .n = E, .k = H};
    w->shared_gate = (moe_pmat){.data = w->shared_gate_buf, .dtype = MOE_DTYPE_F32, .n = 1, .k = H};

    /* Experts are independent: pack them in parallel. */
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->num_threads)
    for (int64_t e = 0; e < E; e++) {
        moe_pmat g, u, dn;
        moe_weights_expert(w, e, &g, &u, &dn);
        moe_pack_panels((void *)g.data, src->gate_proj[e], w->dtype, I, H);
        moe_pack_panels((void *)u.data, src->up_proj[e], w->dtype, I, H);
        moe_pack_panels((void *)dn.data, src->down_proj[e], w->dtype, H, I);
    }
    if (Is > 0) {
        moe_pmat g, u, dn;
        moe_weights_expert(w, -1, &g, &u, &dn);
        moe_pack_panels((void *)g.data, src->shared_gate_proj, w->dtype, Is, H);
        moe_pack_panels((void *)u.data, src->shared_up_proj, w->dtype, Is, H);
        moe_pack_panels((void *)dn.data, src->shared_down_proj, w->dtype, H, Is);
    }
    w->expert_bytes = w13_bytes + w2_bytes + shared_bytes;
    moe_log(ctx, MOE_LOG_INFO, "packed %lld experts (%s): %zu bytes of expert weights, no padding",
            (long long)E, moe_dtype_name(w->dtype), w->expert_bytes);
    *out = w;
    return MOE_OK;
}

void moe_weights_free(moe_weights *w)
{
    if (!w)
        return;
    moe_free_aligned(w->w13);
    moe_free_aligned(w->w2);
    moe_free_aligned(w->shared_w13);
    moe_free_aligned(w->shared_w2);
    moe_free_aligned(w->router_buf);
    moe_free_aligned(w->shared_gate_buf);
    free(w);
}

size_t moe_weights_expert_bytes(const moe_weights *w)
{
    return w ? w->expert_bytes : 0;
}
