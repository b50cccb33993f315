/* Reference routing: router GEMM, scoring, selection key, group-limited masking, top-k by
 * rounds of row-max, weights, renormalize. One token at a time, written to be read. */
#include "ref/ref.h"
#include "quant/convert.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

float moe_ref_load(const void *base, moe_dtype dt, int64_t i)
{
    switch (dt) {
    case MOE_DTYPE_BF16: return moe_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOE_DTYPE_F16: return moe_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

void moe_ref_router_logits(const float *x, int64_t T, int64_t H, int64_t E, const void *router,
                           moe_dtype router_dtype, float *logits)
{
    for (int64_t t = 0; t < T; t++) {
        for (int64_t e = 0; e < E; e++) {
            float acc = 0.0f;
            for (int64_t h = 0; h < H; h++)
                acc = fmaf(x[t * H + h], moe_ref_load(router, router_dtype, e * H + h), acc);
            logits[t * E + e] = acc;
        }
    }
}

void moe_ref_softmax(const float *logits, int64_t E, float *scores)
{
    /* max over the non-NaN logits */
    float mx = -INFINITY;
    int64_t n_num = 0, n_pinf = 0;
    for (int64_t e = 0; e < E; e++) {
        float l = logits[e];
        if (isnan(l))
            continue;
        n_num++;
        if (l == INFINITY)
            n_pinf++;
        if (l > mx)
            mx = l;
    }
    for (int64_t e = 0; e < E; e++) {
        float l = logits[e];
        if (isnan(l)) {
            scores[e] = NAN;
        } else if (n_pinf > 0) {
            /* limit of the softmax: the +Inf logits share all the mass */
            scores[e] = (l == INFINITY) ? 1.0f / (float)n_pinf : 0.0f;
        } else if (mx == -INFINITY) {
            /* every number is -Inf: the limit of equal logits is uniform */
            scores[e] = 1.0f / (float)n_num;
        } else {
            scores[e] = expf(l - mx);
        }
    }
    if (n_pinf > 0 || mx == -INFINITY)
        return;
    float sum = 0.0f;
    for (int64_t e = 0; e < E; e++)
        if (!isnan(scores[e]))
            sum += scores[e];
    for (int64_t e = 0; e < E; e++)
        scores[e] = scores[e] / sum;
}

float moe_ref_sigmoid(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

float moe_ref_sqrtsoftplus(float v)
{
    /* softplus(v) = log(1 + e^v) = log1p(e^-|v|) + max(v, 0): no overflow for large v, no
     * cancellation for very negative v; NaN stays NaN (the log1pf term carries it) */
    float sp = log1pf(expf(-fabsf(v))) + fmaxf(v, 0.0f);
    return sqrtf(sp);
}

/* a ranks above b: larger value, NaN below every number, ties to the lower index */
static bool ranks_above(float va, int64_t ia, float vb, int64_t ib)
{
    if (isnan(va) || isnan(vb)) {
        if (isnan(va) && isnan(vb))
            return ia < ib;
        return isnan(vb);
    }
    if (va != vb)
        return va > vb;
    return ia < ib;
}

/* Index of the best of v[0..n) not marked in taken[] (row-max), or -1 when all are taken. */
static int64_t row_max(const float *v, int64_t n, const bool *taken)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
        if (taken[i])
            continue;
        if (best < 0 || ranks_above(v[i], i, v[best], best))
            best = i;
    }
    return best;
}

/* One token: logits l [E] -> ids [K], w [K]. Scratch: s, c [E], gs [G], taken [max(E, G)]. */
static void route_token(const moe_layer_desc *d, const void *bias, moe_dtype bias_dt, const float *l,
                        int32_t *ids, float *w, float *s, float *c, float *gs, bool *taken)
{
    const int64_t E = d->num_experts, K = d->top_k;

    /* sparsemixer (Phi-MoE, top_k 2, no groups, no selection bias): per round, the best
     * logit not yet selected, then the softmax of the logits its threshold keeps */
    if (d->scoring_func == MOE_SCORING_SPARSEMIXER) {
        const float thr = 2.0f * d->sparsemixer_jitter_eps;
        for (int64_t e = 0; e < E; e++)
            taken[e] = false;
        for (int64_t k = 0; k < K; k++) {
            int64_t best = row_max(l, E, taken);
            taken[best] = true;
            ids[k] = (int32_t)best;
            const float m = l[best];
            for (int64_t e = 0; e < E; e++) {
                float a = fabsf(l[e]);
                float factor = isnan(a) ? a : (a < m ? m : a); /* |l| clamped below at m */
                bool masked = ((m - l[e]) / factor) > thr;
                c[e] = (masked || (taken[e] && e != best)) ? -INFINITY : l[e];
            }
            moe_ref_softmax(c, E, s);
            w[k] = s[best];
        }
        goto renormalize;
    }

    /* 1. scores */
    if (d->scoring_func == MOE_SCORING_SOFTMAX) {
        moe_ref_softmax(l, E, s);
    } else if (d->scoring_func == MOE_SCORING_SIGMOID) {
        for (int64_t e = 0; e < E; e++)
            s[e] = moe_ref_sigmoid(l[e]);
    } else if (d->scoring_func == MOE_SCORING_SQRTSOFTPLUS) {
        for (int64_t e = 0; e < E; e++)
            s[e] = moe_ref_sqrtsoftplus(l[e]);
    } else {
        for (int64_t e = 0; e < E; e++)
            s[e] = l[e]; /* the top-k-first modes select on the logits */
    }

    /* 2. selection key: the score plus the selection bias */
    for (int64_t e = 0; e < E; e++)
        c[e] = bias ? s[e] + moe_ref_load(bias, bias_dt, e) : s[e];

    /* 3. group-limited selection: score each group, keep the topk_group best, mask the rest */
    if (d->n_group > 1) {
        const int64_t G = d->n_group, m = E / G;
        for (int64_t g = 0; g < G; g++) {
            const float *cg = c + g * m; /* [m] */
            for (int64_t i = 0; i < m; i++)
                taken[i] = false;
            int64_t best = row_max(cg, m, taken);
            gs[g] = cg[best];
            if (d->group_score == MOE_GROUP_SCORE_TOP2_SUM && m >= 2) {
                taken[best] = true;
                int64_t second = row_max(cg, m, taken);
                gs[g] = cg[best] + cg[second];
            }
        }
        for (int64_t g = 0; g < G; g++)
            taken[g] = false;
        for (int64_t r = 0; r < d->topk_group; r++)
            taken[row_max(gs, G, taken)] = true; /* taken = kept */
        for (int64_t g = 0; g < G; g++)
            if (!taken[g])
                for (int64_t i = 0; i < m; i++)
                    c[g * m + i] = -INFINITY;
    }

    /* 4. top-k: K rounds of row-max over the experts not yet taken */
    for (int64_t e = 0; e < E; e++)
        taken[e] = false;
    for (int64_t k = 0; k < K; k++) {
        int64_t best = row_max(c, E, taken);
        taken[best] = true;
        ids[k] = (int32_t)best;
    }

    /* 5. weights, never from the selection bias or the mask */
    if (d->scoring_func == MOE_SCORING_TOPK_SOFTMAX) {
        for (int64_t k = 0; k < K; k++)
            gs[k] = l[ids[k]]; /* gs has room for K values: see moe_ref_route */
        moe_ref_softmax(gs, K, w);
    } else if (d->scoring_func == MOE_SCORING_TOPK_SIGMOID) {
        for (int64_t k = 0; k < K; k++)
            w[k] = moe_ref_sigmoid(l[ids[k]]);
    } else {
        for (int64_t k = 0; k < K; k++)
            w[k] = s[ids[k]];
    }

    /* 6. renormalize: divide by the p-norm (renormalize_p) plus eps, in top-k order */
renormalize:
    if (d->renormalize) {
        const float p = d->renormalize_p;
        float norm = 0.0f;
        if (p == 1.0f) { /* the sum (every family but DBRX with another p) */
            for (int64_t k = 0; k < K; k++)
                norm += w[k];
        } else if (isinf(p)) { /* torch.norm(p = inf): the largest |w|, NaN if any is NaN */
            norm = fabsf(w[0]);
            for (int64_t k = 1; k < K; k++) {
                const float a = fabsf(w[k]);
                if (isnan(a) || a > norm)
                    norm = a;
            }
        } else { /* (sum |w|^p)^(1/p) in double, rounded once */
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++)
                acc += pow(fabs((double)w[k]), (double)p);
            norm = (float)pow(acc, 1.0 / (double)p);
        }
        for (int64_t k = 0; k < K; k++)
            w[k] = w[k] / (norm + d->renormalize_eps);
    }
}

moe_status moe_ref_route(const moe_layer_desc *desc, const void *selection_bias,
                         moe_dtype bias_dtype, const float *logits, int64_t T, int32_t *ids,
                         float *weights)
{
    const int64_t E = desc->num_experts, K = desc->top_k;
    const int64_t G = desc->n_group > 1 ? desc->n_group : 1;
    const int64_t ng = G > K ? G : K;
    float *s = malloc(sizeof(float) * (size_t)E);   /* [E] scores */
    float *c = malloc(sizeof(float) * (size_t)E);   /* [E] selection keys */
    float *gs = malloc(sizeof(float) * (size_t)ng); /* [max(G, K)] group scores, then K logits */
    bool *taken = malloc(sizeof(bool) * (size_t)(E > G ? E : G)); /* [max(E, G)] */
    moe_status st = MOE_OK;
    if (!s || !c || !gs || !taken) {
        st = MOE_ENOMEM;
    } else {
        for (int64_t t = 0; t < T; t++)
            route_token(desc, selection_bias, bias_dtype, logits + t * E, ids + t * K, weights + t * K, s,
                        c, gs, taken);
    }
    free(s);
    free(c);
    free(gs);
    free(taken);
    return st;
}
