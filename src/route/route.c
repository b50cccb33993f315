/* Production routing: softmax over E, top-k by insertion into a sorted list (MOE_TOPK=sort) or
 * by K rounds of row-max (MOE_TOPK=rowmax), then renormalization. Both follow the order of
 * docs/numerics.md, so they agree with each other and with src/ref bit for bit. */
#include "route/route.h"

#include <math.h>
#include <stdbool.h>

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

/* K best of scores [E] by insertion into a sorted list: id, w [K]. */
static void topk_sort(const float *scores, int64_t E, int64_t K, int32_t *id, float *w)
{
    int64_t n = 0;
    for (int32_t e = 0; e < (int32_t)E; e++) {
        float v = scores[e];
        if (n == K && !before(v, e, w[K - 1], id[K - 1]))
            continue;
        int64_t pos = n < K ? n : K - 1;
        while (pos > 0 && before(v, e, w[pos - 1], id[pos - 1])) {
            w[pos] = w[pos - 1];
            id[pos] = id[pos - 1];
            pos--;
        }
        w[pos] = v;
        id[pos] = e;
        if (n < K)
            n++;
    }
}

/* K best of scores [E] by K rounds of row-max over the experts not yet taken. */
static void topk_rowmax(const float *scores, int64_t E, int64_t K, int32_t *id, float *w)
{
    for (int64_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int32_t e = 0; e < (int32_t)E; e++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++)
                taken |= (id[j] == e);
            if (taken)
                continue;
            if (best < 0 || before(scores[e], e, scores[best], best))
                best = e;
        }
        id[k] = best;
        w[k] = scores[best];
    }
}

void moe_route_topk(const moe_layer_desc *desc, const float *logits, int64_t T, int32_t *ids,
                    float *weights, float *scores, moe_topk_method method)
{
    const int64_t E = desc->num_experts, K = desc->top_k;
    for (int64_t t = 0; t < T; t++) {
        softmax_row(logits + t * E, E, scores);
        int32_t *id = ids + t * K;  /* [K] */
        float *w = weights + t * K; /* [K] */
        if (method == MOE_TOPK_ROWMAX)
            topk_rowmax(scores, E, K, id, w);
        else
            topk_sort(scores, E, K, id, w);
        if (desc->renormalize) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++)
                sum += w[k];
            for (int64_t k = 0; k < K; k++)
                w[k] = w[k] / (sum + 1e-20f);
        }
    }
}
