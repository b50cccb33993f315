/* Production permutation (counting sort) and combine. */
#ifndef MOE_PERMUTE_H
#define MOE_PERMUTE_H

#include "core/stage.h"

/* Counting sort of the T*K rows by expert, stable (ascending row id within an expert).
 * ids [T*K] in [0, E); offsets [E+1]; rows [T*K] row ids t*K+k; pos [T*K] inverse:
 * rows[pos[r]] == r. */
void moe_permute_sort(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                      int32_t *rows, int32_t *pos);

/* The same result by scanning all rows once per expert (cheap for few rows). */
void moe_permute_onehot(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                        int32_t *rows, int32_t *pos);

/* The same result by an LSD radix sort of packed keys (expert << 32 | row id), 11 bits per
 * pass over the expert bits. keys, tmp: [T*K] u64 workspace. */
void moe_permute_packed(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                        int32_t *rows, int32_t *pos, uint64_t *keys, uint64_t *tmp);

/* out[t][h] = scale * (sum over k of weights[t][k] * v_k[h]; of v_k alone with
 * desc->apply_router_weight_on_input) (+ shared_scale[t] *
 * out[t][h] when has_shared: out then holds the shared expert's output on entry), the sum in
 * top-k order. v_k = y[pos[t*K+k]] for a routed id; for an identity id (ids[t*K+k] >=
 * num_experts, moe.h num_identity_experts) the term is weights[t][k] * x[t][h] whatever
 * apply_router_weight_on_input (the same f32 operations: the product rounded, then added), or
 * nothing when x is NULL (a TP rank other than 0: rank 0 adds it once). ids may be NULL when
 * the layer has no identity experts. y [T*K, H] in expert-sorted order. Tokens [t0, t1). */
void moe_combine(const moe_layer_desc *desc, int64_t t0, int64_t t1, const float *weights,
                 const float *y, const int32_t *pos, const int32_t *ids, const float *x, int has_shared,
                 const float *shared_scale, float *out);

/* Group the chunk's T*K routed rows by (global) expert id with the method MOE_PERMUTE picks:
 * c->offsets [E + 1], c->rows [T*K] (row ids t*K+k by position, ascending within an expert)
 * and c->pos [T*K] (the inverse); every method gives the same result. Counts it in stats.
 * With identity experts (Z > 0) the ids in [E, E + Z) form one last bucket E, after every
 * expert's rows: offsets [E + 2], offsets[E + 1] = T*K; offsets[E] is the routed rows' count
 * (the experts and the EP dispatch read [0, offsets[E]) only). */
void moe_pf_group_rows(moe_chunk *c);

#endif
