/* Weights packed once: this rank's share of the layer (moe_shard: the local experts under EP,
 * the I shard under TP; everything in one process). One builder for every format: each routed
 * matrix goes through its format row (quant/format.h): slice for TP, then pack (plain f32 /
 * bf16 / f16 panels, or a quantized scheme's codes with f32 scales beside them). The router, the
 * biases and the shared expert (always plain) are packed the same way for every format. The
 * experts stage sees the result as one moe_expert_mats per local expert. */
#include "core/mem.h"
#include "layer/layer.h"
#include "quant/format.h"
#include "quant/pack.h"
#include "quant/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <string.h>

static int dtype_ok(moe_dtype dt)
{
    return dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
}

/* n elements of dtype dt at src[j * stride] (src need not be aligned) -> dst [n] f32, exact. */
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

/* The source as the checks see it: a non-gated activation (moe_activation_gated 0) reads no
 * gate array, so the routed gate arrays are checked as up's (NULL allowed), and the shared
 * expert's gate as its up when its activation is non-gated. */
static moe_weight_source gate_view(const moe_layer_desc *d, const moe_weight_source *src)
{
    moe_weight_source v = *src;
    if (!moe_activation_gated(d->activation)) {
        v.gate_proj = src->up_proj;
        v.gate_bias = src->up_bias;
        v.gate_scale = src->up_scale;
        v.gate_zero = src->up_zero;
    }
    if (!moe_activation_gated(d->has_shared_activation ? d->shared_activation : d->activation))
        v.shared_gate_proj = src->shared_up_proj;
    return v;
}

/* The checks every format shares (the caller's pointers, strides and bias dtypes).
 * experts_only: the router, its biases and the shared expert are not read (not checked). */
static moe_status check_source(const moe_plan *plan, const moe_shard *shp, const moe_weight_source *src,
                               int experts_only)
{
    moe_ctx *ctx = plan->st.ctx;
    const moe_layer_desc *d = &plan->st.desc;
    const moe_weight_source v = gate_view(d, src);
    const moe_shard sh = *shp;
    const int64_t Is = experts_only ? 0 : d->shared_expert_intermediate_size, El = sh.n_experts;
    if (!experts_only && !src->router)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->router is NULL");
    if (!experts_only && !dtype_ok(src->router_dtype))
        return moe_set_error(ctx, MOE_EDTYPE, "moe_weights_create: router dtype %s, expected F32, BF16 or F16",
                             moe_dtype_name(src->router_dtype));
    if (!v.gate_proj || !src->up_proj || !src->down_proj)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: src->%s is NULL",
                             !v.gate_proj ? "gate_proj" : !src->up_proj ? "up_proj" : "down_proj");
    for (int64_t le = 0; le < El; le++) { /* only this rank's experts are read */
        const int64_t e = moe_shard_logical(&sh, le);
        if (!v.gate_proj[e] || !src->up_proj[e] || !src->down_proj[e])
            return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL",
                                 (long long)e,
                                 !v.gate_proj[e] ? "gate_proj" : !src->up_proj[e] ? "up_proj" : "down_proj");
    }
    if (Is > 0 && (!v.shared_gate_proj || !src->shared_up_proj || !src->shared_down_proj))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_weights_create: the layer has a shared expert (I_shared %lld) but src->shared_%s is NULL",
                             (long long)Is,
                             !v.shared_gate_proj ? "gate_proj" : !src->shared_up_proj ? "up_proj" : "down_proj");
    if (Is > 0 && d->shared_expert_gated && !src->shared_expert_gate) /* Is = 0 when experts_only */
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
    if (d->has_router_bias && !experts_only && !src->router_bias)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: has_router_bias is set but src->router_bias is NULL");
    if (d->has_output_bias && !experts_only && !src->output_bias)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: has_output_bias is set but src->output_bias is NULL");
    if (d->has_output_norm && !experts_only && !src->output_norm)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: has_output_norm is set but src->output_norm is NULL");
    if (d->has_selection_bias && !experts_only && !src->selection_bias)
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_weights_create: has_selection_bias is set but src->selection_bias is NULL");
    if (d->has_expert_bias && (!v.gate_bias || !src->up_bias || !src->down_bias))
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: has_expert_bias is set but src->%s is NULL",
                             !v.gate_bias ? "gate_bias" : !src->up_bias ? "up_bias" : "down_bias");
    if (d->has_expert_bias) {
        for (int64_t le = 0; le < El; le++) {
            const int64_t e = moe_shard_logical(&sh, le);
            if (!v.gate_bias[e] || !src->up_bias[e] || !src->down_bias[e])
                return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL",
                                     (long long)e,
                                     !v.gate_bias[e] ? "gate_bias" : !src->up_bias[e] ? "up_bias" : "down_bias");
        }
    }
    const struct {
        const char *name;
        int used;
        moe_dtype dt;
    } bias_dts[] = {{"router_bias_dtype", d->has_router_bias && !experts_only, src->router_bias_dtype},
                    {"selection_bias_dtype", d->has_selection_bias && !experts_only, src->selection_bias_dtype},
                    {"expert_bias_dtype", d->has_expert_bias, src->expert_bias_dtype},
                    {"output_bias_dtype", d->has_output_bias && !experts_only, src->output_bias_dtype},
                    {"output_norm_dtype", d->has_output_norm && !experts_only, src->output_norm_dtype}};
    for (size_t i = 0; i < sizeof bias_dts / sizeof bias_dts[0]; i++) {
        if (bias_dts[i].used && !dtype_ok(bias_dts[i].dt))
            return moe_set_error(ctx, MOE_EDTYPE, "moe_weights_create: src->%s is %s, expected F32, BF16 or F16",
                                 bias_dts[i].name, moe_dtype_name(bias_dts[i].dt));
    }
    return MOE_OK;
}

/* The checks of quantized sources, and the shard's granularity q13 / q2 (moe_quant_slice_qweight). */
static moe_status check_quant_source(const moe_plan *plan, const moe_shard *shp, const moe_weight_source *src,
                                     moe_qweight *q13, moe_qweight *q2)
{
    moe_ctx *ctx = plan->st.ctx;
    const moe_layer_desc *d = &plan->st.desc;
    const moe_weight_source v = gate_view(d, src);
    const moe_quant_config *qc = &d->quant;
    const moe_shard sh = *shp;
    const int64_t El = sh.n_experts;
    if (src->gate_up_stride_out || src->gate_up_stride_in || src->down_stride_out || src->down_stride_in)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "moe_weights_create: quantized experts must be row-major (src strides must be 0)");
    if (!v.gate_scale || !src->up_scale || !src->down_scale)
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: quantized experts (%s) but src->%s is NULL",
                             moe_quant_name(qc), !v.gate_scale ? "gate_scale" : !src->up_scale ? "up_scale" : "down_scale");
    if ((qc->w13.has_zero_point && (!v.gate_zero || !src->up_zero)) || (qc->w2.has_zero_point && !src->down_zero))
        return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: zero points requested but src->%s is NULL",
                             qc->w2.has_zero_point && !src->down_zero ? "down_zero"
                             : !v.gate_zero                        ? "gate_zero"
                                                                      : "up_zero");
    for (int64_t le = 0; le < El; le++) { /* only this rank's experts are read */
        const int64_t e = moe_shard_logical(&sh, le);
        const char *bad = !v.gate_scale[e] ? "gate_scale" : !src->up_scale[e] ? "up_scale"
                                             : !src->down_scale[e]              ? "down_scale"
                          : (qc->w13.has_zero_point && (!v.gate_zero[e] || !src->up_zero[e])) ? "gate_zero/up_zero"
                          : (qc->w2.has_zero_point && !src->down_zero[e])                        ? "down_zero"
                                                                                                 : NULL;
        if (bad)
            return moe_set_error(ctx, MOE_EINVAL, "moe_weights_create: expert %lld: %s pointer is NULL", (long long)e, bad);
    }
    /* static fp8 activations: every held expert's two input scales, finite and > 0 */
    if (qc->act == MOE_QACT_STATIC && (!src->w13_input_scale || !src->w2_input_scale))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_weights_create: static FP8 activations (%s) but src->%s is NULL (one f32 input "
                             "scale per expert)",
                             moe_quant_name(qc), !src->w13_input_scale ? "w13_input_scale" : "w2_input_scale");
    for (int64_t le = 0; qc->act == MOE_QACT_STATIC && le < El; le++) {
        const int64_t e = moe_shard_logical(&sh, le);
        for (int m = 0; m < 2; m++) {
            const float v = m == 0 ? src->w13_input_scale[e] : src->w2_input_scale[e];
            if (!(isfinite(v) && v > 0.0f))
                return moe_set_error(ctx, MOE_EINVAL,
                                     "moe_weights_create: expert %lld: src->%s[%lld] = %g (the %s input scale), must "
                                     "be finite and > 0",
                                     (long long)e, m == 0 ? "w13_input_scale" : "w2_input_scale", (long long)e,
                                     (double)v, m == 0 ? "gate_proj / up_proj" : "down_proj");
        }
    }
    return moe_weights_check_shard(ctx, "moe_weights_create", d, &sh, plan->st.par.tp_size, -1, plan->st.compute, q13,
                                   q2);
}

moe_status moe_weights_check_shard(moe_ctx *ctx, const char *fn, const moe_layer_desc *d, const moe_shard *sh,
                                   int tp_size, int tp_rank, moe_compute compute, moe_qweight *q13, moe_qweight *q2)
{
    char whose[32]; /* "this rank's" or "TP rank 3's" */
    if (tp_rank < 0)
        snprintf(whose, sizeof whose, "this rank's");
    else
        snprintf(whose, sizeof whose, "TP rank %d's", tp_rank);
    const moe_quant_config *qc = &d->quant;
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, i0 = sh->i0, Il = sh->I;
    /* The shard's granularity: w13 [Il, H] = rows [i0, i0 + Il) of [I, H]; w2 [H, Il] = columns
     * [i0, i0 + Il) of [H, I]. */
    *q13 = qc->w13;
    *q2 = qc->w2;
    if (moe_quant_slice_qweight(&qc->w13, i0, Il, 0, H, q13) != 0 || moe_quant_slice_qweight(&qc->w2, 0, H, i0, Il, q2) != 0)
        return moe_set_error(ctx, MOE_ESHAPE,
                             "%s: %s experts under TP: %s shard of the intermediate size is %lld columns (%lld..%lld of I = %lld over tp_size %d), odd, but the down projection packs "
                             "two codes per byte along I, so every shard must be even: choose tp_size so that I / "
                             "tp_size and the remainder split give even shards",
                             fn, moe_quant_name(qc), whose, (long long)Il, (long long)i0, (long long)(i0 + Il - 1),
                             (long long)I, tp_size);
    if (qc->act == MOE_QACT_TOKEN_GROUP && i0 % qc->w2.block_k != 0)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: fp8 w8a8 (%s) under TP: %s shard of the intermediate size starts at column %lld (of I = %lld over tp_size %d), inside a down-projection k-block of "
                             "%lld, so its activation groups of act_group_size %lld would not line up with the weight "
                             "blocks; choose tp_size so that every shard starts on a multiple of block_k, use EP, or "
                             "use weight-only fp8-block",
                             fn, moe_quant_name(qc), whose, (long long)i0, (long long)I, tp_size, (long long)qc->w2.block_k,
                             (long long)qc->act_group_size);
    const int64_t gk13 = moe_quant_gk(q13, H), gk2 = moe_quant_gk(q2, Il);
    if (compute == MOE_COMPUTE_BF16 && gk13 % 2 != 0 && gk13 < H)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: compute bf16 with %s: quant.w13 scale groups of %lld inputs (odd) would split the "
                             "bf16 pairs (2i, 2i+1); use compute f32",
                             fn, moe_quant_name(qc), (long long)gk13);
    if (compute == MOE_COMPUTE_BF16 && gk2 % 2 != 0 && gk2 < Il)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: compute bf16 with %s under TP: %s shard of the intermediate size (columns "
                             "%lld..%lld) keeps the down projection's scales per %lld columns (odd), which would split "
                             "the bf16 pairs (2i, 2i+1); choose tp_size so that every shard starts on an even column, "
                             "or use compute f32",
                             fn, moe_quant_name(qc), whose, (long long)i0, (long long)(i0 + Il - 1), (long long)gk2);
    return MOE_OK;
}

/* Local matrix i (expert i / 3; 0 gate, 1 up, 2 down) of the source, as its format row sees
 * it: the whole source matrix [N, K] (the layer's shapes), before the TP slice. */
static moe_pack_src source_of(const moe_layer_desc *d, const moe_weight_source *src, int64_t e, int mat)
{
    const moe_quant_config *qc = &d->quant;
    moe_pack_src s = {0};
    s.data = mat == 0 ? src->gate_proj[e] : mat == 1 ? src->up_proj[e] : src->down_proj[e];
    if (moe_quant_active(qc)) {
        const moe_qweight *qw = mat == 2 ? &qc->w2 : &qc->w13;
        s.scale = mat == 0 ? src->gate_scale[e] : mat == 1 ? src->up_scale[e] : src->down_scale[e];
        s.zero = !qw->has_zero_point ? NULL : mat == 0 ? src->gate_zero[e] : mat == 1 ? src->up_zero[e] : src->down_zero[e];
        s.qw = *qw;
        s.act = qc->act;
    } else {
        s.so = mat == 2 ? src->down_stride_out : src->gate_up_stride_out;
        s.si = mat == 2 ? src->down_stride_in : src->gate_up_stride_in;
        s.dt = d->weight_dtype;
    }
    return s;
}

/* Free the routed experts' packed buffers still held in w's 3 * n_experts slots (NULL slots
 * were moved out) and the per-slot arrays around them: mats, scales, zeros, comps [3 El], qm,
 * experts, logical [El] and expert_bias [El, 2Il + H]. The pointers are left dangling. */
static void free_routed(moe_weights *w)
{
    const int64_t n = 3 * w->shard.n_experts;
    for (int64_t i = 0; i < n; i++) {
        if (w->mats)
            moe_free_aligned(w->mats[i]);
        if (w->scales)
            moe_free_aligned(w->scales[i]);
        if (w->zeros)
            moe_free_aligned(w->zeros[i]);
        if (w->comps)
            moe_free_aligned(w->comps[i]);
    }
    free(w->mats);
    free(w->scales);
    free(w->zeros);
    free(w->comps);
    free(w->qm);
    free(w->experts);
    free(w->logical);
    free(w->expert_bias);
}

void moe_weights_free(moe_weights *w)
{
    if (!w)
        return;
    free_routed(w);
    moe_free_aligned(w->shared_buf);
    moe_free_aligned(w->router_buf);
    moe_free_aligned(w->shared_gate_buf);
    free(w->router_bias);
    free(w->sel_bias);
    free(w->output_bias);
    free(w->output_norm);
    free(w);
}

/* Pack the experts of shard *shp (plan's description, TP shard and compute) from src into a
 * new moe_weights. experts_only: the routed experts only (moe_plan_rebalance's staging: the
 * router, the shared expert and the router / selection biases are left NULL, expert_bytes
 * counts the routed experts only); else the whole share (moe_weights_create). */
static moe_status weights_build(const moe_plan *plan, const moe_shard *shp, const moe_weight_source *src,
                                int experts_only, moe_weights **out)
{
    moe_ctx *ctx = plan->st.ctx;
    const moe_layer_desc *d = &plan->st.desc;
    const moe_quant_config *qc = &d->quant;
    const moe_shard sh = *shp;
    /* H, I, Is the layer's (the source's shapes); El, Il, Isl this rank's share */
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t R = moe_route_width(d); /* the router's rows: E + Z (identity experts) */
    const int64_t Is = experts_only ? 0 : d->shared_expert_intermediate_size; /* 0: no shared expert packed */
    const int64_t El = sh.n_experts, i0 = sh.i0, Il = sh.I, Isl = sh.Is;
    const int quant = moe_quant_active(qc);
    moe_status st = check_source(plan, &sh, src, experts_only);
    moe_qweight q13 = qc->w13, q2 = qc->w2; /* the shard's granularity (quantized) */
    if (st == MOE_OK && quant)
        st = check_quant_source(plan, &sh, src, &q13, &q2);
    if (st != MOE_OK)
        return st;

    /* Every routed matrix's format: the weight dtype's plain row (bf16 pairs under compute bf16),
     * or the scheme's. */
    const int pairs = plan->st.compute == MOE_COMPUTE_BF16;
    const moe_wfmt fplain = pairs ? MOE_WF_BF16P : moe_plain_format(d->weight_dtype);
    const moe_wfmt f13 = quant ? moe_quant_kind(&qc->w13, qc->act) : fplain;
    const moe_wfmt f2 = quant ? moe_quant_kind(&qc->w2, qc->act) : fplain;
    const size_t es = moe_dtype_size(d->weight_dtype);
    /* non-gated experts (moe_activation_gated 0): local matrix 3 le (the gate) is not packed:
     * no bytes, a NULL slot, an empty pmat; W1 is the up matrix. The shared expert by its own
     * activation. */
    const int gated = moe_activation_gated(d->activation);
    const int sgated = moe_activation_gated(d->has_shared_activation ? d->shared_activation : d->activation);
#define MOE_NO_GATE(i) (!gated && (i) % 3 == 0)
    /* the shared expert's packed bytes: gate (gated only), up [Isl, H] and down [H, Isl], plain or pairs */
    const moe_format *fs = moe_format_row(fplain);
    const size_t shared_bytes = Is > 0 ? (sgated ? 2 : 1) * fs->packed_bytes(Isl, H) + fs->packed_bytes(H, Isl) : 0;
    /* Every byte packed below, summed before anything is allocated: a layer that cannot fit is
     * refused with the sizes (core/mem.c), not failed half-way or killed by the OOM killer. */
    uint64_t need = experts_only ? 0
                                 : (uint64_t)shared_bytes +
                                       sizeof(float) * (uint64_t)(R * H + (d->shared_expert_gated ? H : 0));
    need += experts_only ? 0
                         : sizeof(float) * (uint64_t)((d->has_router_bias ? R : 0) + (d->has_selection_bias ? R : 0) +
                                                      (d->has_output_bias ? d->hidden_size : 0) +
                                                      (d->has_output_norm ? d->hidden_size : 0));
    need += d->has_expert_bias ? sizeof(float) * (uint64_t)El * (uint64_t)(2 * Il + H) : 0;
    for (int64_t i = 0; i < 3 * El; i++) {
        if (MOE_NO_GATE(i))
            continue;
        const int mat = (int)(i % 3);
        const moe_format *f = moe_format_row(mat == 2 ? f2 : f13);
        const int64_t N = mat == 2 ? H : Il, K = mat == 2 ? Il : H; /* shard [N, K] */
        need += f->packed_bytes(N, K);
        if (quant) {
            const moe_qweight *qw = mat == 2 ? &q2 : &q13;
            const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
            need += sizeof(float) * (uint64_t)(N * ng) * (qw->has_zero_point ? 2 : 1) + (uint64_t)f->comp_bytes * (uint64_t)N;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "moe_weights_create: packing %lld experts", (long long)El);
    if ((st = moe_mem_check(ctx, need, what)) != MOE_OK)
        return st;
    moe_weights *w = calloc(1, sizeof *w);
    if (!w)
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory");
    w->plan = plan;
    w->shard = sh;
    w->dtype = d->weight_dtype;
    /* the logical expert of each local expert, owned: the plan's placement may change
     * (moe_plan_rebalance), the weights keep describing what they hold */
    w->logical = malloc((size_t)(El > 0 ? El : 1) * sizeof *w->logical); /* [El] */
    for (int64_t le = 0; w->logical && le < El; le++)
        w->logical[le] = (int32_t)moe_shard_logical(&sh, le);
    w->shard.logical = w->logical;
    const int64_t n = 3 * El; /* matrices: gate, up, down per local expert */
    w->experts = calloc((size_t)(El > 0 ? El : 1), sizeof *w->experts); /* [El] */
    w->mats = calloc((size_t)(n > 0 ? n : 1), sizeof *w->mats);           /* [3 El] */
    int fail = !w->experts || !w->mats || !w->logical;
    if (quant && !fail) {
        w->scales = calloc((size_t)n, sizeof *w->scales);
        w->zeros = calloc((size_t)n, sizeof *w->zeros);
        w->comps = calloc((size_t)n, sizeof *w->comps);
        w->qm = calloc((size_t)n, sizeof *w->qm);
        fail = !w->scales || !w->zeros || !w->comps || !w->qm;
    }
    /* packed bytes of the routed experts; quantized: f32 scale (and zero) bytes repeated by cut cells */
    size_t bytes = 0, dup = 0;
    for (int64_t i = 0; !fail && i < n; i++) {
        if (MOE_NO_GATE(i))
            continue;
        const int mat = (int)(i % 3);
        const moe_format *f = moe_format_row(mat == 2 ? f2 : f13);
        const int64_t N = mat == 2 ? H : Il, K = mat == 2 ? Il : H; /* shard [N, K] */
        const size_t cb = f->packed_bytes(N, K);
        w->mats[i] = moe_alloc_aligned(cb); /* packed panels */
        fail = !w->mats[i];
        bytes += cb;
        if (!quant || fail)
            continue;
        const moe_qweight *qw = mat == 2 ? &q2 : &q13;
        const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
        w->scales[i] = moe_alloc_aligned(sizeof(float) * (size_t)(N * ng)); /* [N, ng] by panel */
        if (qw->has_zero_point)
            w->zeros[i] = moe_alloc_aligned(sizeof(float) * (size_t)(N * ng)); /* as scales */
        if (f->comp_bytes)
            w->comps[i] = moe_alloc_aligned((size_t)f->comp_bytes * (size_t)N); /* [N] int32 */
        fail = !w->scales[i] || (qw->has_zero_point && !w->zeros[i]) || (f->comp_bytes && !w->comps[i]);
        /* static fp8 activations: the logical expert's input scale of this matrix (EP: the expert
         * this slot holds; TP: every shard keeps it) */
        const int64_t e = w->logical ? w->logical[i / 3] : 0;
        const float in_scale = qc->act != MOE_QACT_STATIC ? 0.0f
                               : mat == 2                 ? src->w2_input_scale[e]
                                                          : src->w13_input_scale[e];
        w->qm[i] = (struct moe_qmat){.kind = f->fmt, .gk = gk, .ng = ng, .scale = w->scales[i], .zero = w->zeros[i],
                                     .comp = w->comps[i], .in_scale = in_scale};
        const size_t per = sizeof(float) * (qw->has_zero_point ? 2 : 1);
        bytes += per * (size_t)(N * ng) + (size_t)f->comp_bytes * (size_t)N;
        const int64_t own = mat == 2 ? cells_owned(&qc->w2, I, i0, Il) : cells_owned(&qc->w13, H, 0, H);
        dup += per * (size_t)(N * (ng - own));
    }
    if (!experts_only)
        w->router_buf = moe_pack_f32(src->router, src->router_dtype, R, H); /* [E + Z, H] f32 packed */
    if (Is > 0) {
        w->shared_buf = moe_alloc_aligned(shared_bytes); /* gate, up [Isl, H], down [H, Isl] packed */
        if (d->shared_expert_gated)
            w->shared_gate_buf = moe_pack_f32(src->shared_expert_gate, src->router_dtype, 1, H); /* [1, H] */
    }
    if (d->has_router_bias && !experts_only)
        w->router_bias = malloc(sizeof(float) * (size_t)R); /* [E + Z] */
    if (d->has_selection_bias && !experts_only)
        w->sel_bias = malloc(sizeof(float) * (size_t)R); /* [E + Z] */
    if (d->has_output_bias && !experts_only)
        w->output_bias = malloc(sizeof(float) * (size_t)H); /* [H] */
    if (d->has_output_norm && !experts_only)
        w->output_norm = malloc(sizeof(float) * (size_t)H); /* [H] */
    if (d->has_expert_bias)
        w->expert_bias = malloc(sizeof(float) * (size_t)(El > 0 ? El : 1) * (size_t)(2 * Il + H)); /* [El, 2Il + H] */
    if (fail || (!experts_only && !w->router_buf) || (Is > 0 && !w->shared_buf) ||
        (Is > 0 && d->shared_expert_gated && !w->shared_gate_buf) ||
        (d->has_router_bias && !experts_only && !w->router_bias) ||
        (d->has_selection_bias && !experts_only && !w->sel_bias) ||
        (d->has_output_bias && !experts_only && !w->output_bias) ||
        (d->has_output_norm && !experts_only && !w->output_norm) ||
        (d->has_expert_bias && !w->expert_bias)) {
        moe_weights_free(w);
        if (quant)
            return moe_set_error(ctx, MOE_ENOMEM,
                                 "moe_weights_create: out of memory packing %zu bytes of quantized experts", bytes);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory packing %zu bytes of expert weights",
                             bytes + shared_bytes);
    }
    w->router = (moe_pmat){.data = w->router_buf, .dtype = MOE_DTYPE_F32, .n = R, .k = H};
    w->shared_gate = (moe_pmat){.data = w->shared_gate_buf, .dtype = MOE_DTYPE_F32, .n = 1, .k = H};

    /* Every local expert's view: pmats of its matrices, and its biases (f32, below). */
    const int64_t gub_stride = src->gate_up_bias_stride ? src->gate_up_bias_stride : 1;
    for (int64_t le = 0; le < El; le++) {
        moe_expert_mats *em = &w->experts[le];
        moe_pmat *mp[3] = {&em->gate, &em->up, &em->down};
        for (int mat = 0; mat < 3; mat++) {
            const int64_t N = mat == 2 ? H : Il, K = mat == 2 ? Il : H;
            if (MOE_NO_GATE(mat)) { /* non-gated: no gate matrix */
                *mp[mat] = (moe_pmat){0};
                continue;
            }
            *mp[mat] = (moe_pmat){.data = w->mats[3 * le + mat],
                                  .dtype = quant ? MOE_DTYPE_U8 : pairs ? MOE_DTYPE_BF16 : w->dtype, .n = N, .k = K,
                                  .q = quant ? &w->qm[3 * le + mat] : NULL, .pairs = pairs && !quant};
        }
        if (w->expert_bias) {
            float *b = w->expert_bias + (size_t)le * (size_t)(2 * Il + H); /* [2Il + H] */
            em->bg = gated ? b : NULL; /* non-gated: [0, Il) unused, b_1 = bu */
            em->bu = b + Il;
            em->bd = sh.down_bias ? b + 2 * Il : NULL; /* under TP one rank adds b_d */
        }
    }

    /* Experts are independent: pack their matrices in parallel. Local matrix i is of the
     * logical expert that local expert i / 3 holds (a replica is packed once per physical expert);
     * the TP shard is the gate/up rows and the down columns [i0, i0 + Il), cut by the format row
     * (quantized: a block or group cut by the shard boundary is re-expressed with a finer cell
     * that repeats its scale) and then packed like a whole matrix. */
    int oom = 0;
    /* progress (moe_options.pack_progress_fn): bytes of packed matrices, reported by the
     * calling thread (the parallel region's thread 0) only, never decreasing */
    moe_pack_progress_fn progress = ctx->pack_progress_fn;
    uint64_t prog_total = 0, prog_done = 0, prog_said = 0;
    for (int64_t i = 0; progress && i < n; i++)
        if (!MOE_NO_GATE(i))
            prog_total += moe_format_row(i % 3 == 2 ? f2 : f13)->packed_bytes(i % 3 == 2 ? H : Il, i % 3 == 2 ? Il : H);
    if (progress)
        progress(0, prog_total, ctx->pack_progress_user);
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->num_threads)
    for (int64_t i = 0; i < n; i++) {
        if (MOE_NO_GATE(i))
            continue;
        const int64_t e = w->logical[i / 3]; /* the logical expert of local matrix i */
        const int mat = (int)(i % 3);
        const moe_format *f = moe_format_row(mat == 2 ? f2 : f13);
        const int64_t N = mat == 2 ? H : I, K = mat == 2 ? I : H;     /* source [N, K] */
        const int64_t Nl = mat == 2 ? H : Il, Kl = mat == 2 ? Il : H; /* shard [Nl, Kl] */
        const moe_pack_src whole = source_of(d, src, e, mat);
        moe_pack_src part;
        void *bufs[3];
        if (f->slice(f, &whole, N, K, mat == 2 ? 0 : i0, Nl, mat == 2 ? i0 : 0, Kl, &part, bufs) != 0) {
#pragma omp atomic write
            oom = 1;
            continue;
        }
        const moe_pack_dst dst = {.data = w->mats[i], .scale = quant ? w->scales[i] : NULL,
                                  .zero = quant ? w->zeros[i] : NULL, .comp = quant ? w->comps[i] : NULL};
        const int f8h = f->pack(&part, Nl, Kl, &dst);
        if (quant)
            w->qm[i].f8h = f8h;
        free(bufs[0]);
        free(bufs[1]);
        free(bufs[2]);
        if (progress) {
            const uint64_t cb = f->packed_bytes(Nl, Kl);
            uint64_t now;
#pragma omp atomic capture
            now = prog_done += cb;
#ifdef _OPENMP
            const int caller = omp_get_thread_num() == 0;
#else
            const int caller = 1;
#endif
            /* only thread 0 touches prog_said; the last report (total) comes after the loop */
            if (caller && now > prog_said && now < prog_total) {
                prog_said = now;
                progress(now, prog_total, ctx->pack_progress_user);
            }
        }
    }
    if (oom) {
        moe_weights_free(w);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_weights_create: out of memory slicing the TP shard of the experts");
    }
    if (quant) {
        int64_t exact_f8 = 0; /* fp8 matrices on the exact (slower) e4m3 decode, format.h moe_qmat.f8h */
        size_t exact_f8_bytes = 0;
        for (int64_t i = 0; i < n; i++)
            if (!MOE_NO_GATE(i) && moe_format_row(w->qm[i].kind)->fast_decode && !w->qm[i].f8h) {
                exact_f8++;
                exact_f8_bytes += moe_format_row(w->qm[i].kind)->packed_bytes(i % 3 == 2 ? H : Il, i % 3 == 2 ? Il : H);
            }
        if (exact_f8 > 0)
            moe_log(ctx, MOE_LOG_WARN,
                    "%lld of %lld fp8 expert matrices (%zu bytes of codes) hold NaN codes (0x7f/0xff) or scales with "
                    "s * 256 above the f32 range: they run the exact e4m3 decode, slower than the f16 "
                    "decode",
                    (long long)exact_f8, (long long)n, exact_f8_bytes);
    }
    const size_t bes = moe_dtype_size(src->expert_bias_dtype);
    for (int64_t le = 0; w->expert_bias && le < El; le++) {
        const int64_t e = w->logical[le];
        float *b = w->expert_bias + (size_t)le * (size_t)(2 * Il + H); /* [2Il + H] */
        const size_t boff = (size_t)(i0 * gub_stride) * bes;
        if (gated)
            bias_to_f32(b, (const unsigned char *)src->gate_bias[e] + boff, src->expert_bias_dtype, Il, gub_stride);
        else
            memset(b, 0, sizeof(float) * (size_t)Il); /* not read (em->bg NULL) */
        bias_to_f32(b + Il, (const unsigned char *)src->up_bias[e] + boff, src->expert_bias_dtype, Il, gub_stride);
        bias_to_f32(b + 2 * Il, src->down_bias[e], src->expert_bias_dtype, H, 1);
    }
    if (w->router_bias)
        bias_to_f32(w->router_bias, src->router_bias, src->router_bias_dtype, R, 1);
    if (w->sel_bias)
        bias_to_f32(w->sel_bias, src->selection_bias, src->selection_bias_dtype, R, 1);
    if (w->output_bias)
        bias_to_f32(w->output_bias, src->output_bias, src->output_bias_dtype, H, 1);
    if (w->output_norm)
        bias_to_f32(w->output_norm, src->output_norm, src->output_norm_dtype, H, 1);
    if (Is > 0) {
        /* the shared expert's TP shard (row-major, in weight_dtype): gate/up rows and down
         * columns [is0, is0 + Isl) */
        unsigned char *b = w->shared_buf;
        const size_t gb = fs->packed_bytes(Isl, H); /* bytes of gate (and of up) */
        const moe_dtype pdt = pairs ? MOE_DTYPE_BF16 : w->dtype;
        const size_t uo = sgated ? gb : 0; /* non-gated shared expert: up, down; no gate (an empty pmat) */
        w->shared.gate = sgated ? (moe_pmat){.data = b, .dtype = pdt, .n = Isl, .k = H, .pairs = pairs} : (moe_pmat){0};
        w->shared.up = (moe_pmat){.data = b + uo, .dtype = pdt, .n = Isl, .k = H, .pairs = pairs};
        w->shared.down = (moe_pmat){.data = b + uo + gb, .dtype = pdt, .n = H, .k = Isl, .pairs = pairs};
        const unsigned char *sg =
            sgated ? (const unsigned char *)src->shared_gate_proj + (size_t)(sh.is0 * H) * es : NULL;
        const unsigned char *su = (const unsigned char *)src->shared_up_proj + (size_t)(sh.is0 * H) * es;
        const unsigned char *sd = (const unsigned char *)src->shared_down_proj + (size_t)sh.is0 * es;
        if (pairs) {
            if (sgated)
                moe_pack_bf16_pairs((void *)w->shared.gate.data, sg, w->dtype, Isl, H, H, 1);
            moe_pack_bf16_pairs((void *)w->shared.up.data, su, w->dtype, Isl, H, H, 1);
            moe_pack_bf16_pairs((void *)w->shared.down.data, sd, w->dtype, H, Isl, Is, 1);
        } else {
            if (sgated)
                moe_pack_panels((void *)w->shared.gate.data, sg, w->dtype, Isl, H);
            moe_pack_panels((void *)w->shared.up.data, su, w->dtype, Isl, H);
            moe_pack_panels_ld((void *)w->shared.down.data, sd, w->dtype, H, Isl, Is);
        }
    }
    w->expert_bytes = bytes + shared_bytes;
    if (pairs && !quant && w->dtype != MOE_DTYPE_BF16)
        moe_log(ctx, MOE_LOG_INFO,
                "compute bf16: the %s expert weights were rounded to bf16 at packing (nearest even): %zu bytes "
                "resident instead of about %zu",
                moe_dtype_name(w->dtype), w->expert_bytes,
                (size_t)((double)w->expert_bytes * (double)es / 2.0));
    w->routed_each = El > 0 ? bytes / (size_t)El : 0; /* every local expert packs the same bytes */
    if (experts_only) { /* moe_plan_rebalance's staging: it logs what it did */
        if (progress)
            progress(prog_total, prog_total, ctx->pack_progress_user);
        *out = w;
        return MOE_OK;
    }
    char ids[96]; /* which experts: logical ids (contiguous), or the physical range */
    if (!sh.logical || (El > 0 && w->logical[El - 1] - w->logical[0] == El - 1 && w->logical[0] == sh.p0))
        snprintf(ids, sizeof ids, "ids %lld..%lld", (long long)sh.p0, (long long)(sh.p0 + El - 1));
    else
        snprintf(ids, sizeof ids, "physical %lld..%lld of the placement, logical ids from %lld", (long long)sh.p0,
                 (long long)(sh.p0 + El - 1), El > 0 ? (long long)w->logical[0] : -1LL);
    if (!quant) {
        moe_log(ctx, MOE_LOG_INFO,
                "packed %lld of %lld experts (%s, I columns %lld..%lld of %lld, %s): %zu bytes of expert "
                "weights, %s",
                (long long)El, (long long)E, ids, (long long)sh.i0,
                (long long)(sh.i0 + Il - 1), (long long)I, pairs ? "bf16 pairs" : moe_dtype_name(w->dtype),
                w->expert_bytes,
                pairs && (H % 2 || Il % 2) ? "odd K padded by one +0 per feature (bf16 pairs)" : "no padding");
    } else {
        moe_log(ctx, MOE_LOG_INFO,
                "packed %lld of %lld experts (%s, I columns %lld..%lld of %lld, %s): %zu bytes of expert "
                "weights (codes and f32 scales), no code padding",
                (long long)El, (long long)E, ids, (long long)i0,
                (long long)(i0 + Il - 1), (long long)I, moe_quant_name(qc), w->expert_bytes);
        if (Il != I && dup > 0)
            moe_log(ctx, MOE_LOG_INFO,
                    "TP shard I %lld..%lld of %lld cuts the scale cells of %s (w2: %lld columns per cell, kept per %lld "
                    "on this shard; w13 block rows %lld kept per %lld): %zu bytes of f32 scales on this rank repeat a "
                    "cell another shard also holds or a finer cell repeats; no code padding",
                    (long long)i0, (long long)(i0 + Il - 1), (long long)I, moe_quant_name(qc),
                    (long long)moe_quant_gk(&qc->w2, I), (long long)moe_quant_gk(&q2, Il), (long long)qc->w13.block_n,
                    (long long)q13.block_n, dup);
    }
    if (progress)
        progress(prog_total, prog_total, ctx->pack_progress_user);
    *out = w;
    return MOE_OK;
}
#undef MOE_NO_GATE

moe_status moe_weights_create(const moe_plan *plan, const moe_weight_source *src, moe_weights **out)
{
    if (!out)
        return MOE_EINVAL;
    *out = NULL;
    if (!plan)
        return MOE_EINVAL;
    if (!src)
        return moe_set_error(plan->st.ctx, MOE_EINVAL, "moe_weights_create: src is NULL");
    return weights_build(plan, &plan->st.shard, src, 0, out);
}

void moe_weights_stage_free(moe_weights_stage *s)
{
    if (!s)
        return;
    moe_weights_free(s->fresh);
    free(s->logical);
    free(s->from_old);
    free(s->experts);
    free(s->mats);
    free(s->scales);
    free(s->zeros);
    free(s->comps);
    free(s->qm);
    free(s->expert_bias);
    memset(s, 0, sizeof *s);
}

moe_status moe_weights_stage_build(const moe_weights *w, const moe_shard *next, const moe_weight_source *src,
                                   moe_weights_stage *s)
{
    const moe_plan *plan = w->plan;
    moe_ctx *ctx = plan->st.ctx;
    const moe_layer_desc *d = &plan->st.desc;
    const int quant = moe_quant_active(&d->quant);
    const int64_t El = next->n_experts, Elo = w->shard.n_experts, H = d->hidden_size, Il = next->I;
    memset(s, 0, sizeof *s);
    s->shard = *next;
    const size_t n1 = (size_t)(El > 0 ? El : 1), n3 = 3 * n1;
    s->logical = malloc(n1 * sizeof *s->logical);   /* [El] */
    s->from_old = malloc(n1 * sizeof *s->from_old); /* [El] */
    s->experts = calloc(n1, sizeof *s->experts);    /* [El] */
    s->mats = calloc(n3, sizeof *s->mats);          /* [3 El] */
    int fail = !s->logical || !s->from_old || !s->experts || !s->mats;
    if (quant && !fail) {
        s->scales = calloc(n3, sizeof *s->scales); /* [3 El] each */
        s->zeros = calloc(n3, sizeof *s->zeros);
        s->comps = calloc(n3, sizeof *s->comps);
        s->qm = calloc(n3, sizeof *s->qm);
        fail = !s->scales || !s->zeros || !s->comps || !s->qm;
    }
    if (!fail && w->expert_bias) {
        s->expert_bias = malloc(n1 * (size_t)(2 * Il + H) * sizeof(float)); /* [El, 2Il + H] */
        fail = !s->expert_bias;
    }
    if (fail) {
        moe_weights_stage_free(s);
        return moe_set_error(ctx, MOE_ENOMEM, "moe_plan_rebalance: out of memory staging %lld local experts",
                             (long long)El);
    }
    /* the experts this rank keeps (a rank holds a logical expert at most once), and the new ones */
    int64_t n_new = 0;
    for (int64_t le = 0; le < El; le++) {
        const int32_t e = (int32_t)moe_shard_logical(next, le);
        s->logical[le] = e;
        s->from_old[le] = -1;
        for (int64_t j = 0; j < Elo; j++)
            if (w->logical[j] == e)
                s->from_old[le] = (int32_t)j;
        if (s->from_old[le] < 0)
            s->logical[n_new++] = e; /* packed-list order is compacted below */
    }
    /* s->logical [0, n_new) now lists the new experts in local order; rebuild the full list
     * after using it as the fresh shard's logical ids */
    moe_shard fsh = *next;
    fsh.n_experts = n_new;
    fsh.logical = s->logical;
    if (n_new > 0) {
        moe_status st = weights_build(plan, &fsh, src, 1, &s->fresh);
        if (st != MOE_OK) {
            moe_weights_stage_free(s);
            return st;
        }
    }
    for (int64_t le = 0; le < El; le++)
        s->logical[le] = (int32_t)moe_shard_logical(next, le);
    s->shard.logical = s->logical;
    s->kept = El - n_new;
    s->packed = n_new;
    s->freed = Elo - s->kept;
    const size_t each = w->routed_each ? w->routed_each : s->fresh ? s->fresh->routed_each : 0;
    s->bytes_packed = s->fresh ? s->fresh->expert_bytes : 0;
    s->bytes_resident = w->expert_bytes - (size_t)Elo * each + (size_t)El * each;
    return MOE_OK;
}

void moe_weights_stage_commit(moe_weights *w, moe_weights_stage *s)
{
    const moe_layer_desc *d = &w->plan->st.desc;
    const int quant = moe_quant_active(&d->quant);
    const int64_t El = s->shard.n_experts, H = d->hidden_size, Il = s->shard.I;
    const size_t brow = (size_t)(2 * Il + H); /* floats of one expert's {b_g, b_u, b_d} */
    int64_t k = 0;                             /* next fresh expert */
    for (int64_t le = 0; le < El; le++) {
        moe_weights *from = s->from_old[le] >= 0 ? w : s->fresh;
        const int64_t j = s->from_old[le] >= 0 ? s->from_old[le] : k++;
        for (int m = 0; m < 3; m++) { /* move the packed buffers: the source slot forgets them */
            s->mats[3 * le + m] = from->mats[3 * j + m];
            from->mats[3 * j + m] = NULL;
            if (quant) {
                s->scales[3 * le + m] = from->scales[3 * j + m];
                s->zeros[3 * le + m] = from->zeros[3 * j + m];
                s->comps[3 * le + m] = from->comps[3 * j + m];
                s->qm[3 * le + m] = from->qm[3 * j + m];
                from->scales[3 * j + m] = NULL;
                from->zeros[3 * j + m] = NULL;
                from->comps[3 * j + m] = NULL;
            }
        }
        moe_expert_mats *em = &s->experts[le];
        *em = from->experts[j];
        em->gate.q = quant && moe_activation_gated(d->activation) ? &s->qm[3 * le] : NULL; /* non-gated: empty */
        em->up.q = quant ? &s->qm[3 * le + 1] : NULL;
        em->down.q = quant ? &s->qm[3 * le + 2] : NULL;
        if (s->expert_bias) {
            float *b = s->expert_bias + (size_t)le * brow; /* [2Il + H] */
            memcpy(b, from->expert_bias + (size_t)j * brow, brow * sizeof(float));
            em->bg = moe_activation_gated(d->activation) ? b : NULL; /* non-gated: b_1 = bu (weights_build) */
            em->bu = b + Il;
            em->bd = s->shard.down_bias ? b + 2 * Il : NULL;
        }
    }
    /* the experts dropped: what is left in the old slots (the kept ones were moved out) */
    free_routed(w);
    w->mats = s->mats;
    w->scales = s->scales;
    w->zeros = s->zeros;
    w->comps = s->comps;
    w->qm = s->qm;
    w->experts = s->experts;
    w->logical = s->logical;
    w->expert_bias = s->expert_bias;
    w->shard = s->shard;
    w->shard.logical = w->logical;
    w->expert_bytes = s->bytes_resident;
    if (!w->routed_each && s->fresh)
        w->routed_each = s->fresh->routed_each;
    /* the fresh weights' buffers moved: free its (now empty) arrays */
    moe_weights_free(s->fresh);
    free(s->from_old);
    memset(s, 0, sizeof *s);
}

size_t moe_weights_expert_bytes(const moe_weights *w)
{
    return w ? w->expert_bytes : 0;
}
