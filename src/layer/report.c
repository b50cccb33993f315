/* The plan report (moe.h "Plan report"): a rank's bytes and every cost nobody asked for, from
 * the same rules the weight builder (weights.c: the format rows' packed sizes and TP slicing)
 * and the kernel tables (their native and tail_ref masks) follow, so `moe plan` prints the
 * library's numbers instead of recomputing them. Also the WARNINGs a plan logs when created. */
#include "core/knobs.h"
#include "layer/layer.h"
#include "parallel/parallel.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "route/route.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The routed experts' format of d (the weight dtype's plain row, bf16 pairs under compute
 * bf16, or the scheme's). */
static moe_wfmt routed_format(const moe_layer_desc *d, int w2, moe_compute c)
{
    const moe_quant_config *qc = &d->quant;
    if (!moe_quant_active(qc))
        return c == MOE_COMPUTE_BF16 ? MOE_WF_BF16P : moe_plain_format(d->weight_dtype);
    return moe_quant_kind(w2 ? &qc->w2 : &qc->w13, qc->act);
}

/* Bytes of the routed experts of shard sh as weights.c packs them: codes (padding included),
 * the layout's padding among them, f32 scales (and zero points, w8a8 sums), the scale bytes
 * held twice over the TP ranks, and the down projection's scale cell along I as the source
 * has it and as this shard keeps it. */
typedef struct shard_bytes {
    uint64_t codes, padding, scales, dup;
    int64_t w2_cell, w2_kept;
} shard_bytes;

/* Packed bytes of a shared expert of Is columns (gate, up [Is, H], down [H, Is]): plain panels
 * of the weight dtype, or under compute bf16 bf16 pair panels (moe_format "bf16-pairs": K
 * rounded up to 2), as src/layer/weights.c packs it. */
static uint64_t shared_bytes(const moe_layer_desc *d, int64_t Is, moe_compute c)
{
    const int64_t H = d->hidden_size;
    /* matrices of [Is, H]: gate and up, or up alone for a non-gated activation */
    const int64_t nk = moe_activation_gated(d->has_shared_activation ? d->shared_activation : d->activation) ? 2 : 1;
    if (Is <= 0)
        return 0;
    if (c == MOE_COMPUTE_BF16) {
        const moe_format *f = moe_format_row(MOE_WF_BF16P);
        return (uint64_t)(nk * Is * f->feature_bytes(H) + H * f->feature_bytes(Is));
    }
    return (uint64_t)((nk + 1) * H * Is) * (uint64_t)moe_dtype_size(d->weight_dtype);
}

static shard_bytes routed_bytes(const moe_layer_desc *d, const moe_shard *sh, moe_compute c)
{
    shard_bytes b = {0};
    const moe_quant_config *qc = &d->quant;
    const int quant = moe_quant_active(qc);
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, Il = sh->I, i0 = sh->i0;
    moe_qweight q13 = qc->w13, q2 = qc->w2;
    if (quant && (moe_quant_slice_qweight(&qc->w13, i0, Il, 0, H, &q13) != 0 ||
                  moe_quant_slice_qweight(&qc->w2, 0, H, i0, Il, &q2) != 0))
        return b; /* not packable: report() refused the layout first (moe_weights_check_shard) */
    for (int mat = 0; mat < 3; mat++) {
        if (mat == 0 && !moe_activation_gated(d->activation))
            continue; /* non-gated experts: no gate matrix (weights.c) */
        const moe_format *f = moe_format_row(routed_format(d, mat == 2, c));
        const int64_t N = mat == 2 ? H : Il, K = mat == 2 ? Il : H;
        const uint64_t packed = (uint64_t)f->packed_bytes(N, K);
        b.codes += packed;
        b.padding += packed - ((uint64_t)N * (uint64_t)K * (uint64_t)f->bits + 7) / 8;
        if (!quant)
            continue;
        const moe_qweight *qw = mat == 2 ? &q2 : &q13, *whole = mat == 2 ? &qc->w2 : &qc->w13;
        const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
        const uint64_t per = sizeof(float) * (qw->has_zero_point ? 2 : 1);
        b.scales += per * (uint64_t)(N * ng) + (uint64_t)f->comp_bytes * (uint64_t)N;
        /* the cells along K whose first column lies in the shard are its own (weights.c) */
        const int64_t gkw = moe_quant_gk(whole, mat == 2 ? I : H);
        const int64_t k0 = mat == 2 ? i0 : 0;
        const int64_t own = (k0 + K - 1) / gkw - (k0 + gkw - 1) / gkw + 1;
        b.dup += per * (uint64_t)(N * (ng - own));
    }
    if (quant) {
        b.w2_cell = moe_quant_gk(&qc->w2, I);
        b.w2_kept = moe_quant_gk(&q2, Il);
    }
    b.codes *= (uint64_t)sh->n_experts;
    b.padding *= (uint64_t)sh->n_experts;
    b.scales *= (uint64_t)sh->n_experts;
    b.dup *= (uint64_t)sh->n_experts;
    return b;
}

static void add_cost(moe_rank_report *r, const char *kind, double bytes, double flop_share, const char *fmt, ...)
    MOE_PRINTF(5, 6);
static void add_cost(moe_rank_report *r, const char *kind, double bytes, double flop_share, const char *fmt, ...)
{
    if (r->n_costs >= MOE_REPORT_MAX_COSTS)
        return;
    moe_cost *c = &r->costs[r->n_costs++];
    c->kind = kind;
    c->bytes = bytes;
    c->flop_share = flop_share;
    c->level = MOE_LOG_WARN; /* lowered for small memory costs at the end of moe_plan_report_for */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->what, sizeof c->what, fmt, ap);
    va_end(ap);
}

/* Matrices of an expert: 3 (gate, up, down), 2 for a non-gated activation (up, down); shared:
 * the shared expert's. */
static double n_mats(const moe_layer_desc *d, int shared)
{
    const moe_activation a = shared && d->has_shared_activation ? d->shared_activation : d->activation;
    return moe_activation_gated(a) ? 3.0 : 2.0;
}

/* The share of the layer's FLOPs (router + routed experts + shared expert) the routed experts are. */
static double routed_flop_share(const moe_layer_desc *d)
{
    const double H = (double)d->hidden_size, I = (double)d->moe_intermediate_size;
    const double ex = 2.0 * (double)d->top_k * n_mats(d, 0) * H * I;
    const double all =
        ex + 2.0 * (double)moe_route_width(d) * H + 2.0 * n_mats(d, 1) * H * (double)d->shared_expert_intermediate_size;
    return ex / all;
}

/* The share of the routed experts' FLOPs on a partial last panel of 16 features: I % 16 rows of
 * gate and up (K = H) and H % 16 rows of down (K = I). */
static double tail_share(const moe_layer_desc *d)
{
    const double H = (double)d->hidden_size, I = (double)d->moe_intermediate_size;
    const double tail = (double)(d->moe_intermediate_size % MOE_PANEL), tail_h = (double)(d->hidden_size % MOE_PANEL);
    return ((n_mats(d, 0) - 1.0) * tail * H + tail_h * I) / (n_mats(d, 0) * I * H);
}

/* 1 when the kernel table runs format f (under compute c) on the ref's scalar entries (never
 * for the "ref" row, whose kernels are all its own). */
static int is_fallback(const moe_kernels *k, moe_wfmt f, moe_compute c)
{
    return !((c == MOE_COMPUTE_BF16 ? k->native_bf16 : k->native) >> f & 1u);
}

/* 1 when the table runs both routed formats of d (under compute c) on its own kernels. */
static int routed_native(const moe_kernels *k, const moe_layer_desc *d, moe_compute c)
{
    return !is_fallback(k, routed_format(d, 0, c), c) && !is_fallback(k, routed_format(d, 1, c), c);
}

/* 1 when compute bf16's routed expert GEMMs run on vdpbf16ps: the table's bf16 kernels for both
 * routed formats are vdpbf16ps ones (kernels.h bf16_dp; the avx512_bf16 row may keep the vfmadd
 * form where that is faster, with the same bits). */
static int runs_vdpbf16ps(const moe_kernels *k, const moe_layer_desc *d, moe_compute c)
{
    return c == MOE_COMPUTE_BF16 && (k->bf16_dp >> routed_format(d, 0, c) & 1u) &&
           (k->bf16_dp >> routed_format(d, 1, c) & 1u);
}

/* moe_rank_report.compute_roof: the roofline peak of the instructions the routed experts' GEMMs
 * run on table k. */
static const char *compute_roof(const moe_kernels *k, const moe_layer_desc *d, moe_compute c)
{
    if (runs_vdpbf16ps(k, d, c))
        return "bf16";
    if (c == MOE_COMPUTE_F32 && routed_format(d, 0, c) == MOE_WF_W8A8 && routed_native(k, d, c) &&
        (k->caps & MOE_CAP_VNNI))
        return "vnni";
    return "fma";
}

/* Compute bf16 on a table without vdpbf16ps, or without a bf16 kernel for the routed format:
 * the sentence of the cost (and of the plan's WARNING), 1; 0 when the table has both. */
static int bf16_cost(const moe_kernels *k, const moe_layer_desc *d, moe_compute cm, char *buf, size_t n)
{
    const int native = routed_native(k, d, cm);
    const char *fmt = moe_quant_active(&d->quant) ? moe_quant_name(&d->quant) : "bf16";
    if (native && (k->caps & MOE_CAP_AVX512_BF16)) /* vdpbf16ps, or the vfmadd form chosen as faster */
        return 0;
    if (native && !(k->caps & MOE_CAP_FMA)) /* the scalar row (MOE_ISA=ref) */
        snprintf(buf, n,
                 "compute bf16 on kernel table %s, scalar C without avx512_bf16 (vdpbf16ps) or any vector kernel: the "
                 "%s expert GEMMs run the scalar emulation of vdpbf16ps (the same bits, tens of times slower than a "
                 "vector table; %.1f%% of the layer's FLOPs)",
                 k->name, fmt, 100.0 * routed_flop_share(d));
    else if (native)
        snprintf(buf, n,
                 "compute bf16 on kernel table %s, which has no avx512_bf16 (vdpbf16ps, CPUID leaf 7 subleaf 1 EAX "
                 "bit 5 on a CPU that has it): the %s expert GEMMs multiply bf16 pairs with vfmadd under FTZ/DAZ, "
                 "the same bits at about the f32 mode's speed (up to twice it with vdpbf16ps on a core that issues it "
                 "at the vfmadd rate, e.g. AMD Zen 4/5; %.1f%% of the layer's FLOPs)",
                 k->name, fmt, 100.0 * routed_flop_share(d));
    else
        snprintf(buf, n,
                 "compute bf16 on kernel table %s, which has no bf16 kernel for %s experts%s: they run on the scalar "
                 "ref entries (the same bits, tens of times slower than the vector tables; %.1f%% of the layer's "
                 "FLOPs)",
                 k->name, fmt, k->caps & MOE_CAP_AVX512_BF16 ? "" : " and no avx512_bf16 (vdpbf16ps)",
                 100.0 * routed_flop_share(d));
    return 1;
}

static moe_status report(moe_ctx *ctx, const moe_layer_desc *d, const moe_parallel_config *par, moe_compute cm,
                         moe_rank_report *r)
{
    const moe_kernels *k = ctx->kernels;
    const moe_quant_config *qc = &d->quant;
    const int quant = moe_quant_active(qc);
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts, K = d->top_k;
    const int64_t Is = d->shared_expert_intermediate_size;
    const int ep = par->ep_size, tp = par->tp_size;
    const moe_wfmt f13 = routed_format(d, 0, cm);
    memset(r, 0, sizeof *r);
    /* every rank's shard must be one moe_weights_create packs */
    for (int g = 0; quant && g < ep; g++)
        for (int t = 0; t < tp; t++) {
            moe_parallel_config pr = *par;
            pr.ep_rank = g;
            pr.tp_rank = t;
            moe_shard s;
            moe_qweight q13, q2;
            moe_par_shard(d, &pr, &s);
            moe_status st = moe_weights_check_shard(ctx, "moe_plan_report", d, &s, tp, t, cm, &q13, &q2);
            if (st != MOE_OK)
                return st;
        }
    r->kernel_table = k->name;
    r->compute_roof = compute_roof(k, d, cm);
    r->quantized = quant;
    r->experts_format = quant ? moe_quant_name(qc) : moe_format_row(f13)->name;
    r->code_bits = moe_format_row(f13)->bits;

    /* this rank */
    moe_shard sh;
    moe_par_shard(d, par, &sh);
    const shard_bytes mine = routed_bytes(d, &sh, cm);
    r->ep_rank = par->ep_rank;
    r->tp_rank = par->tp_rank;
    r->expert_first = sh.p0;
    r->n_experts = sh.n_experts;
    r->i_first = sh.i0;
    r->i_cols = sh.I;
    r->shared_i_first = sh.is0;
    r->shared_i_cols = sh.Is;
    r->code_bytes = mine.codes;
    r->scale_bytes = mine.scales;
    r->dup_scale_bytes = mine.dup;
    r->shared_bytes = shared_bytes(d, sh.Is, cm);
    r->router_bytes = (uint64_t)(4 * moe_route_width(d) * H); /* [E + Z, H] */
    r->padding_bytes = mine.padding;
    r->w2_scale_cell = mine.w2_cell;
    r->w2_scale_cell_kept = mine.w2_kept;

    /* the layer in one process, and every rank of the layout */
    moe_parallel_config one = *par;
    one.ep_size = one.tp_size = 1;
    one.ep_rank = one.tp_rank = 0;
    moe_shard whole;
    moe_par_shard(d, &one, &whole);
    const shard_bytes all1 = routed_bytes(d, &whole, cm);
    r->layer_bytes = all1.codes + shared_bytes(d, Is, cm);
    const double expert_codes = E > 0 ? (double)all1.codes / (double)E : 0.0; /* one expert's packed weights */
    r->flops_per_token = 2.0 * (double)K * n_mats(d, 0) * (double)H * (double)I + 2.0 * n_mats(d, 1) * (double)H * (double)Is +
                         2.0 * (double)moe_route_width(d) * (double)H; /* the router: [E + Z, H] */
    r->decode_bytes_per_token = (double)K * expert_codes + (double)shared_bytes(d, Is, cm);
    uint64_t max_dup = 0, total_dup = 0, max_pad = 0;
    double min_rank_bytes = -1.0; /* the expert bytes (codes + scales + shared) of the rank holding the fewest */
    int cut_cell = 0, tail = 0;
    for (int g = 0; g < ep; g++)
        for (int t = 0; t < tp; t++) {
            moe_parallel_config pr = *par;
            pr.ep_rank = g;
            pr.tp_rank = t;
            moe_shard s;
            moe_par_shard(d, &pr, &s);
            const shard_bytes b = routed_bytes(d, &s, cm);
            const double rank_bytes = (double)(b.codes + b.scales + shared_bytes(d, s.Is, cm));
            r->total_bytes += b.codes + b.scales + shared_bytes(d, s.Is, cm);
            if (min_rank_bytes < 0.0 || rank_bytes < min_rank_bytes)
                min_rank_bytes = rank_bytes;
            total_dup += b.dup;
            max_dup = b.dup > max_dup ? b.dup : max_dup;
            max_pad = b.padding > max_pad ? b.padding : max_pad;
            if (quant && tp > 1 && b.w2_kept != b.w2_cell && b.w2_kept != s.I)
                cut_cell = 1;
            if (s.I % MOE_PANEL != 0)
                tail = 1;
        }
    if (H % MOE_PANEL != 0)
        tail = 1;

    /* every cost nobody asked for */
    if (Is && ep > 1)
        add_cost(r, "replicated", (double)shared_bytes(d, Is / tp + (Is % tp ? 1 : 0), cm), 0.0,
                 "shared expert replicated on every expert-parallel group (each adds it once, for its own tokens); "
                 "bytes per replica");
    if (ep > 1 || tp > 1)
        add_cost(r, "replicated", 4.0 * (double)E * (double)H, 0.0,
                 "router weight [E, H] f32 replicated on every rank; bytes per rank");
    if (quant && max_dup > 0 && all1.w2_cell == I)
        add_cost(r, "duplicated", (double)max_dup, 0.0,
                 "%s: the down projection's scale cell spans all of I (one scale per output feature), so every TP "
                 "shard (I %lld per shard) holds all of its scales; no extra codes, no extra FLOPs; duplicated scale "
                 "bytes (all ranks %.0f), on the worst rank",
                 moe_quant_name(qc), (long long)(I / tp), (double)total_dup);
    else if (quant && max_dup > 0)
        add_cost(r, "duplicated", (double)max_dup, 0.0,
                 "%s scale cells cut by the TP split (I %lld per shard): the down projection's scales of a cut cell "
                 "are held by both shards%s; no extra codes, no extra FLOPs; duplicated scale bytes (all ranks %.0f), "
                 "on the worst rank",
                 moe_quant_name(qc), (long long)(I / tp),
                 cut_cell ? ", and a shard starting inside a cell and leaving it keeps them per finer cells (listed "
                            "above)"
                          : "",
                 (double)total_dup);
    const int fp8 = quant && qc->w13.dtype == MOE_QTYPE_F8_E4M3 && qc->w13.scale == MOE_QSCALE_BLOCK;
    if (fp8 && (H % qc->w13.block_k != 0 || I % qc->w2.block_k != 0 || I % qc->w13.block_n != 0 ||
                H % qc->w2.block_n != 0))
        add_cost(r, "padding", 0.0, 0.0,
                 "fp8 blocks: partial trailing blocks (H or I not a multiple of the block) are masked, not padded; "
                 "padding");
    const moe_format *pf13 = moe_format_row(f13), *pf2 = moe_format_row(routed_format(d, 1, cm));
    if (max_pad > 0)
        add_cost(r, "padding", (double)max_pad, 0.0,
                 "%s codes: the packed layout pads with zeros the kernels multiply (%s); padding on the worst rank",
                 r->experts_format, pf13->pads ? pf13->pads : pf2->pads ? pf2->pads : "");
    if (tail && cm == MOE_COMPUTE_F32 && (k->tail_ref >> f13 & 1u)) {
        /* the share over every rank's shard: I % 16 of the whole layer bounds each shard's tail */
        double share = routed_flop_share(d) * tail_share(d);
        for (int t = 0; t < tp; t++) {
            moe_parallel_config pr = *par;
            pr.tp_rank = t;
            moe_shard s;
            moe_par_shard(d, &pr, &s);
            moe_layer_desc ds = *d;
            ds.moe_intermediate_size = s.I;
            const double st = routed_flop_share(d) * tail_share(&ds);
            share = st > share ? st : share;
        }
        add_cost(r, "fallback", -1.0, share,
                 "%s table: the last partial panel of 16 features (I shard or H not a multiple of 16) runs the scalar "
                 "fallback kernel: %.2f%% of the layer's FLOPs on the worst rank",
                 k->name, 100.0 * share);
    }
    if (cm == MOE_COMPUTE_BF16) {
        char what[sizeof r->costs[0].what];
        if (bf16_cost(k, d, cm, what, sizeof what))
            add_cost(r, "fallback", -1.0, routed_flop_share(d), "%s", what);
    } else if (is_fallback(k, f13, cm) || is_fallback(k, routed_format(d, 1, cm), cm)) {
        add_cost(r, "fallback", -1.0, routed_flop_share(d),
                 "kernel table %s has no %s kernel: the routed experts (%.1f%% of the layer's FLOPs) run on the "
                 "scalar ref entry",
                 k->name, r->experts_format, 100.0 * routed_flop_share(d));
    }
    /* small memory costs are stated, not warned about */
    for (size_t i = 0; i < r->n_costs; i++)
        if (r->costs[i].bytes >= 0.0 && r->costs[i].bytes < MOE_REPORT_SMALL_FRACTION * min_rank_bytes)
            r->costs[i].level = MOE_LOG_INFO;
    return MOE_OK;
}

moe_status moe_plan_report(const moe_plan *plan, moe_rank_report *out)
{
    if (!plan)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(plan->st.ctx, MOE_EINVAL, "moe_plan_report: out is NULL");
    return report(plan->st.ctx, &plan->st.desc, &plan->st.par, plan->st.compute, out);
}

moe_status moe_plan_report_for(moe_ctx *ctx, const moe_layer_desc *desc, const moe_plan_config *cfg,
                               moe_rank_report *out)
{
    if (!ctx)
        return MOE_EINVAL;
    if (!desc || !cfg || !out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_report_for: %s is NULL", !desc ? "desc" : !cfg ? "cfg" : "out");
    const moe_parallel_config *par = &cfg->parallel;
    /* the description must be one moe_plan_create accepts */
    moe_status st = moe_plan_check_desc(ctx, desc);
    if (st != MOE_OK)
        return st;
    const int64_t E = desc->num_experts, I = desc->moe_intermediate_size, Is = desc->shared_expert_intermediate_size;
    if (par->ep_size < 1 || par->ep_size > E)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_report_for: ep_size = %d, must be in [1, num_experts = %lld]",
                             par->ep_size, (long long)E);
    if (par->tp_size < 1 || par->tp_size > I || (Is > 0 && par->tp_size > Is))
        return moe_set_error(ctx, MOE_EINVAL,
                             "moe_plan_report_for: tp_size = %d, must be in [1, %lld] (every TP rank holds at least one "
                             "column)",
                             par->tp_size, (long long)(Is > 0 && Is < I ? Is : I));
    if ((int64_t)par->ep_size * par->tp_size > MOE_MAX_RANKS)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_report_for: ep_size * tp_size = %lld ranks, more than %d",
                             (long long)par->ep_size * par->tp_size, MOE_MAX_RANKS);
    if (par->ep_rank < 0 || par->ep_rank >= par->ep_size || par->tp_rank < 0 || par->tp_rank >= par->tp_size)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_report_for: (ep_rank %d, tp_rank %d) outside [0, %d) x [0, %d)",
                             par->ep_rank, par->tp_rank, par->ep_size, par->tp_size);
    if (cfg->compute != MOE_COMPUTE_F32 && cfg->compute != MOE_COMPUTE_BF16)
        return moe_set_error(ctx, MOE_EINVAL, "moe_plan_report_for: compute = %d is not a moe_compute", (int)cfg->compute);
    if (cfg->compute == MOE_COMPUTE_BF16 && moe_quant_active(&desc->quant) && desc->quant.act != MOE_QACT_NONE)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "moe_plan_report_for: compute bf16 with %s: this scheme quantizes the activations to 8 "
                             "bits; use compute f32", moe_quant_name(&desc->quant));
    moe_status pst = moe_plan_check_placement(ctx, desc, par);
    if (pst != MOE_OK)
        return pst;
    return report(ctx, desc, par, cfg->compute, out);
}

moe_status moe_plan_path_for(const moe_plan *plan, int64_t n_tokens, moe_plan_path *out)
{
    if (!plan)
        return MOE_EINVAL;
    if (!out || n_tokens < 1)
        return moe_set_error(plan->st.ctx, MOE_EINVAL, "moe_plan_path_for: %s", !out ? "out is NULL" : "n_tokens < 1");
    const moe_stage *st = &plan->st;
    const moe_exec_knobs *kn = moe_plan_knobs(plan, n_tokens);
    const int64_t K = st->desc.top_k, E = st->desc.num_experts;
    const int64_t tc = n_tokens < kn->chunk_size ? n_tokens : kn->chunk_size;
    memset(out, 0, sizeof *out);
    out->chunk_tokens = tc;
    out->chunks = (n_tokens + tc - 1) / tc;
    out->rows_per_expert = (double)tc * (double)K / (double)E;
    /* the rule of permute/prepare_finalize.c moe_pf_group_rows */
    const int method = kn->permute != MOE_PERMUTE_AUTO    ? kn->permute
                       : tc * K <= kn->onehot_threshold ? MOE_PERMUTE_ONEHOT
                                                        : MOE_PERMUTE_SORT;
    out->permute = method == MOE_PERMUTE_ONEHOT ? "onehot" : method == MOE_PERMUTE_PACKED ? "packed" : "sort";
    out->tuned_tokens = kn->tokens;
    out->topk = kn->topk == MOE_TOPK_ROWMAX ? "rowmax" : "sort";
    out->lowtok_threshold = kn->lowtok_threshold;
    out->experts_path = out->rows_per_expert < (double)kn->lowtok_threshold
                            ? "few-token streaming"
                            : "tiled GEMM";
    out->workspace_bytes = moe_plan_workspace_size(plan, n_tokens);
    return MOE_OK;
}

void moe_plan_log_costs(const moe_plan *p)
{
    const moe_stage *st = &p->st;
    moe_ctx *ctx = st->ctx;
    const moe_layer_desc *d = &st->desc;
    const moe_kernels *k = ctx->kernels;
    const moe_compute cm = st->compute;
    const moe_wfmt f13 = routed_format(d, 0, cm), f2 = routed_format(d, 1, cm);
    char what[sizeof ((moe_cost *)0)->what];
    if (cm == MOE_COMPUTE_BF16) {
        /* one WARNING: the missing feature and its cost */
        if (bf16_cost(k, d, cm, what, sizeof what))
            moe_log(ctx, MOE_LOG_WARN, "%s", what);
        return; /* the bf16 kernels mask partial panels */
    }
    /* the routed experts' kernels fall back to the ref's scalar entries */
    if (is_fallback(k, f13, cm) || is_fallback(k, f2, cm))
        moe_log(ctx, MOE_LOG_WARN,
                "kernel table %s has no %s kernel: the routed experts (%.1f%% of the layer's FLOPs) run on the "
                "scalar ref entry",
                k->name, moe_quant_active(&d->quant) ? moe_quant_name(&d->quant) : moe_format_row(f13)->name,
                100.0 * routed_flop_share(d));
    /* a partial last panel (fewer than 16 output features) through the scalar kernel */
    if (k->tail_ref >> f13 & 1u) {
        int64_t tail = d->moe_intermediate_size % MOE_PANEL, tail_h = d->hidden_size % MOE_PANEL;
        if (tail || tail_h) {
            const double share = tail_share(d);
            moe_log(ctx, MOE_LOG_WARN,
                    "%s table: I = %lld and H = %lld are not multiples of %d, so the last partial panel runs the "
                    "scalar fallback kernel: %.2f%% of expert FLOPs (%.0f FLOP per routed token)",
                    k->name, (long long)d->moe_intermediate_size, (long long)d->hidden_size, MOE_PANEL, 100.0 * share,
                    share * 6.0 * (double)d->moe_intermediate_size * (double)d->hidden_size * (double)d->top_k);
        }
    }
}
