/* Reference permutation: group (token, k) rows by expert, ascending row id within an expert. */
#include "ref/ref.h"

void moe_ref_permute(const int32_t *ids, int64_t T, int64_t K, int64_t E, int64_t *offsets,
                     int32_t *rows)
{
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) {
        offsets[e] = n;
        for (int64_t r = 0; r < T * K; r++)
            if (ids[r] == e)
                rows[n++] = (int32_t)r;
    }
    offsets[E] = n;
}
