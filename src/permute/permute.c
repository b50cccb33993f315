/* Counting-sort permutation and the top-k-ordered combine. */
#include "permute/permute.h"

void moe_permute_sort(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                      int32_t *rows, int32_t *pos)
{
    for (int64_t e = 0; e <= E; e++)
        offsets[e] = 0;
    for (int64_t r = 0; r < T * K; r++)
        offsets[ids[r] + 1]++;
    for (int64_t e = 0; e < E; e++)
        offsets[e + 1] += offsets[e];
    /* place rows; offsets[e] is used as the cursor and restored afterwards */
    for (int64_t r = 0; r < T * K; r++) {
        int64_t p = offsets[ids[r]]++;
        rows[p] = (int32_t)r;
        pos[r] = (int32_t)p;
    }
    for (int64_t e = E; e > 0; e--)
        offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

void moe_permute_onehot(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                        int32_t *rows, int32_t *pos)
{
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
        offsets[e] = n;
        for (int64_t r = 0; r < T * K; r++) {
            if (ids[r] == e) {
                rows[n] = (int32_t)r;
                pos[r] = (int32_t)n;
                n++;
            }
        }
    }
    offsets[E] = n;
}

void moe_permute_packed(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                        int32_t *rows, int32_t *pos, uint64_t *keys, uint64_t *tmp)
{
    enum { BITS = 11, RADIX = 1 << BITS };
    const int64_t n = T * K;
    for (int64_t r = 0; r < n; r++)
        keys[r] = ((uint64_t)(uint32_t)ids[r] << 32) | (uint64_t)r;
    /* stable passes over the expert bits (row ids are already ascending) */
    for (int shift = 32; shift < 64 && ((uint64_t)(E - 1) >> (shift - 32)) != 0; shift += BITS) {
        int64_t count[RADIX + 1] = {0};
        for (int64_t r = 0; r < n; r++)
            count[((keys[r] >> shift) & (RADIX - 1)) + 1]++;
        for (int d = 0; d < RADIX; d++)
            count[d + 1] += count[d];
        for (int64_t r = 0; r < n; r++)
            tmp[count[(keys[r] >> shift) & (RADIX - 1)]++] = keys[r];
        uint64_t *swap = keys;
        keys = tmp;
        tmp = swap;
    }
    for (int64_t e = 0; e <= E; e++)
        offsets[e] = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)(keys[i] & 0xffffffffu);
        rows[i] = (int32_t)r;
        pos[r] = (int32_t)i;
        offsets[(keys[i] >> 32) + 1]++;
    }
    for (int64_t e = 0; e < E; e++)
        offsets[e + 1] += offsets[e];
}

void moe_combine(const moe_layer_desc *desc, int64_t t0, int64_t t1, const float *weights,
                 const float *y, const int32_t *pos, const int32_t *ids, const float *x, int has_shared,
                 const float *shared_scale, float *out)
{
    const int64_t H = desc->hidden_size, K = desc->top_k, E = desc->num_experts;
    const int identity = desc->num_identity_experts > 0 && ids;
    const float scale = desc->routed_scaling_factor;
    enum { HB = 64 };
    float acc[HB]; /* one block of a token's output, summed over k in top-k order */
    for (int64_t t = t0; t < t1; t++) {
        float *o = out + t * H; /* [H] */
        for (int64_t h0 = 0; h0 < H; h0 += HB) {
            int64_t nb = H - h0 < HB ? H - h0 : HB;
            for (int64_t j = 0; j < nb; j++)
                acc[j] = 0.0f;
            for (int64_t k = 0; k < K; k++) {
                const float w = weights[t * K + k];
                if (ids && ids[t * K + k] < 0)
                    continue; /* an empty slot (expert_capacity's drop, or given -1): adds nothing */
                if (identity && ids[t * K + k] >= E) {
                    /* an identity expert: w * x, the same operations as a routed term */
                    if (x) {
                        const float *xr = x + t * H + h0; /* [nb] */
                        for (int64_t j = 0; j < nb; j++)
                            acc[j] += w * xr[j];
                    }
                    continue;
                }
                const float *yr = y + (int64_t)pos[t * K + k] * H + h0; /* [nb] */
                if (desc->apply_router_weight_on_input) /* the weight is already in y */
                    for (int64_t j = 0; j < nb; j++)
                        acc[j] += yr[j];
                else
                    for (int64_t j = 0; j < nb; j++)
                        acc[j] += w * yr[j];
            }
            if (scale != 1.0f)
                for (int64_t j = 0; j < nb; j++)
                    acc[j] = acc[j] * scale;
            if (has_shared)
                for (int64_t j = 0; j < nb; j++)
                    acc[j] = acc[j] + shared_scale[t] * o[h0 + j];
            for (int64_t j = 0; j < nb; j++)
                o[h0 + j] = acc[j];
        }
    }
}
