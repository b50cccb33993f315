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

/* Pack W [n, k] whose element (o, i) sits at src[o * so + i * si] (elements of dtype dt; src
 * need not be aligned) into the panel layout at dst. Row-major sources take
 * moe_pack_panels; the others (input-major, interleaved) are transposed here, panel by panel,
 * reading each input row's nw outputs (contiguous when so = 1). */
static void pack_strided(void *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so,
                         int64_t si)
{
    if (so == k && si == 1) {
        moe_pack_panels(dst, src, dt, n, k);
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
    const int64_t I = d->moe_intermediate_size, H = d->hidden_size;
    const float *b = w->expert_bias + (size_t)e * (size_t)(2 * I + H); /* [2I + H] */
    *gate_bias = b;
    *up_bias = b + I;
    *down_bias = b + 2 * I;
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
        for (int64_t e = 0; e < E; e++) {
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
    if (d->has_router_bias)
        w->router_bias = malloc(sizeof(float) * (size_t)E); /* [E] */
    if (d->has_selection_bias)
        w->sel_bias = malloc(sizeof(float) * (size_t)E); /* [E] */
    if (d->has_expert_bias)
        w->expert_bias = malloc(sizeof(float) * (size_t)E * (size_t)(2 * I + H)); /* [E, 2I + H] */
    if (!w->w13 || !w->w2 || !w->router_buf || (Is > 0 && (!w->shared_w13 || !w->shared_w2)) ||
        (Is > 0 && d->shared_expert_gated && !w->shared_gate_buf) || (d->has_router_bias && !w->router_bias) ||
        (d->has_selection_bias && !w->sel_bias) || (d->has_expert_bias && !w->expert_bias)) {
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
        pack_strided((void *)g.data, src->gate_proj[e], w->dtype, I, H, gu_so, gu_si);
        pack_strided((void *)u.data, src->up_proj[e], w->dtype, I, H, gu_so, gu_si);
        pack_strided((void *)dn.data, src->down_proj[e], w->dtype, H, I, dn_so, dn_si);
        if (w->expert_bias) {
            float *b = w->expert_bias + (size_t)e * (size_t)(2 * I + H); /* [2I + H] */
            bias_to_f32(b, src->gate_bias[e], src->expert_bias_dtype, I, gub_stride);
            bias_to_f32(b + I, src->up_bias[e], src->expert_bias_dtype, I, gub_stride);
            bias_to_f32(b + 2 * I, src->down_bias[e], src->expert_bias_dtype, H, 1);
        }
    }
    if (w->router_bias)
        bias_to_f32(w->router_bias, src->router_bias, src->router_bias_dtype, E, 1);
    if (w->sel_bias)
        bias_to_f32(w->sel_bias, src->selection_bias, src->selection_bias_dtype, E, 1);
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
    free(w->router_bias);
    free(w->sel_bias);
    free(w->expert_bias);
    free(w);
}

size_t moe_weights_expert_bytes(const moe_weights *w)
{
    return w ? w->expert_bytes : 0;
}
