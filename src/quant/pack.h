/* Plain f32 / bf16 / f16 weights into the panel layout (quant/layout.h), and exact dtype
 * conversion: the packers of the format table's plain rows, the router and the shared expert. */
#ifndef MOE_QUANT_PACK_H
#define MOE_QUANT_PACK_H

#include "quant/layout.h"

/* Pack W [n, k] whose element (o, i) sits at src[o * so + i * si] (elements of dtype dt; src
 * need not be aligned) into the panel layout at dst (n * k elements of dt). */
void moe_pack_strided(void *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so, int64_t si);
/* Pack W [n, k] (row-major, rows ld >= k elements apart) into panels at dst (same dtype). */
void moe_pack_panels_ld(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k, int64_t ld);
void moe_pack_panels(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k);
/* Pack W [n, k] (element (o, i) at src[o * so + i * si] in dtype dt, any alignment) into the
 * bf16 pair panels of MOE_WF_BF16P at dst (ceil(k / 2) * 2 * n bf16): every element converted
 * to f32 exactly, then rounded to bf16 (nearest even); odd k pads each pair row with +0. */
void moe_pack_bf16_pairs(uint16_t *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so, int64_t si);
/* Convert a small [n, k] matrix (dtype dt, row-major, any alignment) to f32 and pack it into
 * panels; returns a moe_alloc_aligned buffer of n * k floats, or NULL when out of memory. */
void *moe_pack_f32(const void *src, moe_dtype dt, int64_t n, int64_t k);
/* Convert `count` elements of dtype at src (any alignment) to f32, exactly. */
void moe_convert_to_f32(float *dst, const void *src, moe_dtype dtype, size_t count);

#endif
