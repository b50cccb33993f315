/* Production routing: scores (softmax, sigmoid, or the logits for the top-k-first modes), the
 * selection key (+ selection bias), group-limited masking, top-k by insertion into a sorted
 * list (MOE_TOPK=sort) or by K rounds of row-max (MOE_TOPK=rowmax), weights, renormalization.
 * Every selection uses one strict total order (value descending, NaN last, lower index
 * first), so both methods pick the same experts and groups as src/ref's row-max; the
 * elementwise formulas are src/ref's, operation for operation, so the bits agree. */
#include "route/route.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* Softmax with the NaN / Inf rules of docs/numerics.md. */
static void softmax_row(const float *l, int64_t E, float *s)
{
    float mx = -INFINITY;
    int64_t n_num = 0, n_pinf = 0;
    for (int64_t e = 0; e < E; e++) {
        if (isnan(l[e]))
            continue;
        n_num++;
        n_pinf += (l[e] == INFINITY);
        mx = l[e] > mx ? l[e] : mx;
    }
    if (n_pinf > 0 || mx == -INFINITY) {
        /* limits: +Inf logits share the mass; all -Inf is the all-equal case */
        for (int64_t e = 0; e < E; e++) {
            if (isnan(l[e]))
                s[e] = NAN;
            else if (n_pinf > 0)
                s[e] = (l[e] == INFINITY) ? 1.0f / (float)n_pinf : 0.0f;
            else
                s[e] = 1.0f / (float)n_num;
        }
        return;
    }
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        s[e] = isnan(l[e]) ? NAN : expf(l[e] - mx);
        if (!isnan(s[e]))
            sum += s[e];
    }
    for (int64_t e = 0; e < E; e++)
        s[e] = s[e] / sum;
}

static inline float sigmoid(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

/* sqrt(softplus(v)), softplus(v) = log1p(exp(-|v|)) + max(v, 0) (moe.h MOE_SCORING_SQRTSOFTPLUS;
 * src/ref writes the same operations). NaN: log1pf(expf(NaN)) is NaN, so the sum is. */
static inline float sqrtsoftplus(float v)
{
    return sqrtf(log1pf(expf(-fabsf(v))) + fmaxf(v, 0.0f));
}

/* a before b in top-k order */
static inline bool before(float va, int32_t ia, float vb, int32_t ib)
{
    bool na = isnan(va), nb = isnan(vb);
    if (na != nb)
        return nb;
    if (na || va == vb)
        return ia < ib;
    return va > vb;
}

/* K best of v [n] by insertion into a sorted list: id, w [K] (w = their values). */
static void topk_sort(const float *v, int64_t n, int64_t K, int32_t *id, float *w)
{
    int64_t cnt = 0;
    for (int32_t e = 0; e < (int32_t)n; e++) {
        float x = v[e];
        if (cnt == K && !before(x, e, w[K - 1], id[K - 1]))
            continue;
        int64_t pos = cnt < K ? cnt : K - 1;
        while (pos > 0 && before(x, e, w[pos - 1], id[pos - 1])) {
            w[pos] = w[pos - 1];
            id[pos] = id[pos - 1];
            pos--;
        }
        w[pos] = x;
        id[pos] = e;
        if (cnt < K)
            cnt++;
    }
}

/* K best of v [n] by K rounds of row-max over the entries not yet taken. */
static void topk_rowmax(const float *v, int64_t n, int64_t K, int32_t *id, float *w)
{
    for (int64_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int32_t e = 0; e < (int32_t)n; e++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++)
                taken |= (id[j] == e);
            if (taken)
                continue;
            if (best < 0 || before(v[e], e, v[best], best))
                best = e;
        }
        id[k] = best;
        w[k] = v[best];
    }
}

static void topk(const float *v, int64_t n, int64_t K, int32_t *id, float *w, moe_topk_method method)
{
    if (method == MOE_TOPK_ROWMAX)
        topk_rowmax(v, n, K, id, w);
    else
        topk_sort(v, n, K, id, w);
}

/* Scratch layout, in 4-byte units: s [E], c [E], kv [max(G, K)], gid [G] (i32), gval [G],
 * then kept [G] bytes. */
static int64_t n_groups(const moe_layer_desc *d)
{
    return d->n_group > 1 ? d->n_group : 1;
}

size_t moe_route_scratch_bytes(const moe_layer_desc *d)
{
    const size_t E = (size_t)moe_route_width(d), K = (size_t)d->top_k, G = (size_t)n_groups(d); /* E + Z */
    return 4 * (2 * E + (G > K ? G : K) + 2 * G) + G + 64;
}

moe_status moe_route_check_desc(moe_ctx *ctx, const moe_layer_desc *d)
{
    const long long E = (long long)moe_route_width(d), K = (long long)d->top_k; /* E + Z */
    const long long G = (long long)d->n_group, TG = (long long)d->topk_group;
    if (G < 0)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: n_group = %lld is negative (0 or 1: no groups)", G);
    if (G > 1) {
        if (E % G != 0)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: %s = %lld is not a multiple of n_group = %lld",
                                 d->num_identity_experts ? "num_experts + num_identity_experts" : "num_experts", E, G);
        if (TG < 1 || TG > G)
            return moe_set_error(ctx, MOE_EINVAL, "layer description: topk_group = %lld, must be in [1, n_group = %lld]",
                                 TG, G);
        if (TG * (E / G) < K)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: topk_group = %lld groups of %lld experts hold fewer than top_k = %lld "
                                 "experts",
                                 TG, E / G, K);
        if (d->group_score != MOE_GROUP_SCORE_MAX && d->group_score != MOE_GROUP_SCORE_TOP2_SUM)
            return moe_set_error(ctx, MOE_EINVAL, "layer description: group_score = %d is not a moe_group_score value",
                                 (int)d->group_score);
    }
    if (d->scoring_func == MOE_SCORING_SPARSEMIXER) {
        if (K != 2)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: top_k = %lld with scoring_func sparsemixer, which selects exactly 2 "
                                 "experts (Phi-MoE's sparsemixer)",
                                 K);
        if (G > 1 || d->has_selection_bias)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: scoring_func sparsemixer selects on the logits alone: %s is not "
                                 "supported with it",
                                 G > 1 ? "n_group > 1" : "has_selection_bias");
        if (!(d->sparsemixer_jitter_eps >= 0.0f) || isinf(d->sparsemixer_jitter_eps))
            return moe_set_error(ctx, MOE_EINVAL, "layer description: sparsemixer_jitter_eps = %g, must be finite and >= 0",
                                 (double)d->sparsemixer_jitter_eps);
    }
    if (d->activation == MOE_ACT_SWIGLU_CLAMP && !(d->swiglu_limit > 0.0f))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: swiglu_limit = %g, must be > 0",
                             (double)d->swiglu_limit);
    if (d->activation == MOE_ACT_SWIGLU_OAI) {
        if (!(d->swiglu_limit > 0.0f))
            return moe_set_error(ctx, MOE_EINVAL, "layer description: swiglu_limit = %g, must be > 0",
                                 (double)d->swiglu_limit);
        if (!isfinite(d->swiglu_alpha))
            return moe_set_error(ctx, MOE_EINVAL, "layer description: swiglu_alpha = %g, must be finite",
                                 (double)d->swiglu_alpha);
    }
    return MOE_OK;
}

void moe_route_add_bias(const float *bias, int64_t T, int64_t E, float *logits)
{
    if (!bias)
        return;
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < E; e++)
            logits[t * E + e] = logits[t * E + e] + bias[e];
}

/* N_p of the K weights w (moe.h renormalize_p): p = 1 the f32 sum in top-k order (every
 * family's renormalization), p = +inf the largest |w_k|, any other p (sum_k |w_k|^p)^(1/p) in
 * double, rounded once to f32. src/ref's operations in src/ref's order. */
static float renorm_norm(const float *w, int64_t K, float p)
{
    if (p == 1.0f) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++)
            sum += w[k];
        return sum;
    }
    if (isinf(p)) {
        float m = fabsf(w[0]);
        for (int64_t k = 1; k < K; k++)
            m = fabsf(w[k]) > m || isnan(w[k]) ? fabsf(w[k]) : m;
        return m;
    }
    double acc = 0.0;
    for (int64_t k = 0; k < K; k++)
        acc += pow(fabs((double)w[k]), (double)p);
    return (float)pow(acc, 1.0 / (double)p);
}

void moe_route_topk(const moe_layer_desc *desc, const float *sel_bias, const float *logits,
                    int64_t T, int32_t *ids, float *weights, void *scratch,
                    moe_topk_method method)
{
    const int64_t E = moe_route_width(desc), K = desc->top_k, G = n_groups(desc); /* E + Z scored */
    const int64_t nkv = G > K ? G : K;
    float *s = scratch;                   /* [E] scores */
    float *c = s + E;                     /* [E] selection keys */
    float *kv = c + E;                    /* [max(G, K)] group scores, then K logits */
    int32_t *gid = (int32_t *)(kv + nkv); /* [G] kept groups */
    float *gval = (float *)(gid + G);     /* [G] */
    unsigned char *kept = (unsigned char *)(gval + G); /* [G] */
    const moe_scoring sf = desc->scoring_func;

    for (int64_t t = 0; t < T; t++) {
        const float *l = logits + t * E; /* [E] */
        int32_t *id = ids + t * K;       /* [K] */
        float *w = weights + t * K;      /* [K] */

        /* sparsemixer (Phi-MoE): K rounds (K = 2, moe_route_check_desc) of the best logit not
         * yet selected, its threshold mask, and the softmax of what the mask keeps; src/ref's
         * operations in src/ref's order */
        if (sf == MOE_SCORING_SPARSEMIXER) {
            const float thr = 2.0f * desc->sparsemixer_jitter_eps;
            for (int64_t k = 0; k < K; k++) {
                int32_t best = -1;
                for (int32_t e = 0; e < (int32_t)E; e++) {
                    int taken = 0;
                    for (int64_t j = 0; j < k; j++)
                        taken |= (id[j] == e);
                    if (!taken && (best < 0 || before(l[e], e, l[best], best)))
                        best = e;
                }
                id[k] = best;
                const float m = l[best];
                for (int64_t e = 0; e < E; e++) {
                    int taken = 0;
                    for (int64_t j = 0; j < k; j++)
                        taken |= (id[j] == e);
                    float a = fabsf(l[e]);
                    float factor = isnan(a) ? a : (a < m ? m : a); /* |l| clamped below at m */
                    bool masked = ((m - l[e]) / factor) > thr;
                    c[e] = (masked || taken) ? -INFINITY : l[e];
                }
                softmax_row(c, E, s);
                w[k] = s[best];
            }
            goto renormalize;
        }

        /* scores and selection keys */
        if (sf == MOE_SCORING_SOFTMAX) {
            softmax_row(l, E, s);
        } else if (sf == MOE_SCORING_SIGMOID) {
            for (int64_t e = 0; e < E; e++)
                s[e] = sigmoid(l[e]);
        } else if (sf == MOE_SCORING_SQRTSOFTPLUS) {
            for (int64_t e = 0; e < E; e++)
                s[e] = sqrtsoftplus(l[e]);
        } else {
            memcpy(s, l, sizeof(float) * (size_t)E);
        }
        if (sel_bias)
            for (int64_t e = 0; e < E; e++)
                c[e] = s[e] + sel_bias[e];
        else
            memcpy(c, s, sizeof(float) * (size_t)E);

        /* group-limited selection */
        if (G > 1) {
            const int64_t m = E / G;
            for (int64_t g = 0; g < G; g++) {
                const float *cg = c + g * m; /* [m] */
                int32_t b1 = -1, b2 = -1;    /* best and second best member */
                for (int32_t i = 0; i < (int32_t)m; i++) {
                    if (b1 < 0 || before(cg[i], i, cg[b1], b1)) {
                        b2 = b1;
                        b1 = i;
                    } else if (b2 < 0 || before(cg[i], i, cg[b2], b2)) {
                        b2 = i;
                    }
                }
                kv[g] = cg[b1];
                if (desc->group_score == MOE_GROUP_SCORE_TOP2_SUM && m >= 2)
                    kv[g] = cg[b1] + cg[b2];
            }
            topk(kv, G, desc->topk_group, gid, gval, method);
            memset(kept, 0, (size_t)G);
            for (int64_t r = 0; r < desc->topk_group; r++)
                kept[gid[r]] = 1;
            for (int64_t g = 0; g < G; g++)
                if (!kept[g])
                    for (int64_t i = 0; i < m; i++)
                        c[g * m + i] = -INFINITY;
        }

        /* top-k on the keys, then the weights */
        topk(c, E, K, id, w, method);
        if (sf == MOE_SCORING_TOPK_SOFTMAX) {
            for (int64_t k = 0; k < K; k++)
                kv[k] = l[id[k]];
            softmax_row(kv, K, w);
        } else if (sf == MOE_SCORING_TOPK_SIGMOID) {
            for (int64_t k = 0; k < K; k++)
                w[k] = sigmoid(l[id[k]]);
        } else {
            for (int64_t k = 0; k < K; k++)
                w[k] = s[id[k]];
        }
    renormalize:
        if (desc->renormalize) {
            const float norm = renorm_norm(w, K, desc->renormalize_p); /* src/ref's N_p */
            for (int64_t k = 0; k < K; k++)
                w[k] = w[k] / (norm + desc->renormalize_eps);
        }
    }
}
