/* Production routing: softmax over E, then one pass that keeps the K best in a sorted list
 * (insertion), then renormalization. The reference (src/ref/ref_route.c) selects by K
 * rounds of row-max instead; both follow the same order, so they agree bit for bit. */
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

void moe_route_topk(const moe_layer_desc *desc, const float *logits, int64_t T, int32_t *ids,
                    float *weights, float *scores)
{
    const int64_t E = desc->num_experts, K = desc->top_k;
    for (int64_t t = 0; t < T; t++) {
        softmax_row(logits + t * E, E, scores);
        int32_t *id = ids + t * K;   /* [K], kept sorted */
        float *w = weights + t * K;  /* [K] */
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
        if (desc->renormalize) {
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++)
                sum += w[k];
            for (int64_t k = 0; k < K; k++)
                w[k] = w[k] / (sum + 1e-20f);
        }
    }
}
