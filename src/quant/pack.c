/* Plain f32 / bf16 / f16 weights into the panel layout (quant/layout.h) and dtype conversion:
 * the packers of the format table's plain rows and of the router. */
#include "quant/pack.h"

#include "quant/convert.h"

#include <stdlib.h>
#include <string.h>

/* Panels of 16 rows of src [n, k] (row stride ld) -> dst, each panel [k][nw]; 2-byte elements. */
static void pack_u16(uint16_t *dst, const uint16_t *src, int64_t n, int64_t k, int64_t ld)
{
    for (int64_t p = 0; p < moe_pmat_panels(n); p++) {
        int nw = moe_pmat_panel_width(n, p);
        uint16_t *panel = dst + p * MOE_PANEL * k; /* [k][nw] */
        for (int j = 0; j < nw; j++) {
            const uint16_t *row = src + (p * MOE_PANEL + j) * ld; /* [k] */
            for (int64_t kk = 0; kk < k; kk++)
                panel[kk * nw + j] = row[kk];
        }
    }
}

/* The same for 4-byte elements. */
static void pack_u32(uint32_t *dst, const uint32_t *src, int64_t n, int64_t k, int64_t ld)
{
    for (int64_t p = 0; p < moe_pmat_panels(n); p++) {
        int nw = moe_pmat_panel_width(n, p);
        uint32_t *panel = dst + p * MOE_PANEL * k; /* [k][nw] */
        for (int j = 0; j < nw; j++) {
            const uint32_t *row = src + (p * MOE_PANEL + j) * ld; /* [k] */
            for (int64_t kk = 0; kk < k; kk++)
                panel[kk * nw + j] = row[kk];
        }
    }
}

void moe_pack_panels(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k)
{
    moe_pack_panels_ld(dst, src, dtype, n, k, k);
}

void moe_pack_panels_ld(void *dst, const void *src, moe_dtype dtype, int64_t n, int64_t k, int64_t ld)
{
    size_t es = moe_dtype_size(dtype);
    if ((uintptr_t)src % es != 0) {
        /* A file may place a tensor at an odd offset: read it through memcpy, one row at a
         * time, so no misaligned access happens. */
        unsigned char *dst_b = dst;
        const unsigned char *src_b = src;
        for (int64_t r = 0; r < n; r++) {
            for (int64_t kk = 0; kk < k; kk++) {
                int64_t off = moe_pmat_offset(n, k, r, kk);
                memcpy(dst_b + (size_t)off * es, src_b + (size_t)(r * ld + kk) * es, es);
            }
        }
        return;
    }
    if (es == 2)
        pack_u16(dst, src, n, k, ld);
    else
        pack_u32(dst, src, n, k, ld);
}

void moe_convert_to_f32(float *dst, const void *src, moe_dtype dtype, size_t count)
{
    size_t es = moe_dtype_size(dtype);
    if (es > 1 && (uintptr_t)src % es != 0) {
        /* misaligned source: convert element by element through memcpy */
        const unsigned char *b = src;
        for (size_t i = 0; i < count; i++) {
            uint32_t v = 0;
            memcpy(&v, b + i * es, es);
            if (dtype == MOE_DTYPE_F32)
                dst[i] = moe_bits_to_f32(v);
            else if (dtype == MOE_DTYPE_BF16)
                dst[i] = moe_bf16_to_f32((uint16_t)v);
            else if (dtype == MOE_DTYPE_F16)
                dst[i] = moe_f16_to_f32((uint16_t)v);
            else
                dst[i] = 0.0f;
        }
        return;
    }
    switch (dtype) {
    case MOE_DTYPE_F32:
        memcpy(dst, src, count * sizeof(float));
        break;
    case MOE_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < count; i++)
            dst[i] = moe_bf16_to_f32(s[i]);
        break;
    }
    case MOE_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < count; i++)
            dst[i] = moe_f16_to_f32(s[i]);
        break;
    }
    default:
        memset(dst, 0, count * sizeof(float));
        break;
    }
}

void moe_pack_bf16_pairs(uint16_t *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so, int64_t si)
{
    const size_t es = moe_dtype_size(dt);
    const int64_t k2 = (k + 1) / 2;
    const unsigned char *s = src;
    for (int64_t p = 0; p < moe_pmat_panels(n); p++) {
        const int nw = moe_pmat_panel_width(n, p);
        uint16_t *panel = dst + p * 2 * MOE_PANEL * k2; /* [k2][nw][2] */
        for (int j = 0; j < nw; j++) {
            const int64_t o = p * MOE_PANEL + j;
            for (int64_t kk = 0; kk < 2 * k2; kk++) {
                uint16_t h = 0; /* +0: the odd-k pad */
                if (kk < k) {
                    const unsigned char *e = s + (size_t)(o * so + kk * si) * es;
                    if (dt == MOE_DTYPE_BF16) {
                        memcpy(&h, e, 2); /* exact already */
                    } else if (dt == MOE_DTYPE_F32) {
                        float v;
                        memcpy(&v, e, 4);
                        h = moe_f32_to_bf16(v);
                    } else {
                        uint16_t f;
                        memcpy(&f, e, 2);
                        h = moe_f32_to_bf16(moe_f16_to_f32(f));
                    }
                }
                panel[(kk / 2) * 2 * nw + 2 * j + kk % 2] = h;
            }
        }
    }
}

void *moe_pack_f32(const void *src, moe_dtype dt, int64_t n, int64_t k)
{
    float *tmp = malloc(sizeof(float) * (size_t)(n * k)); /* [n, k] f32 */
    float *dst = moe_alloc_aligned(sizeof(float) * (size_t)(n * k));
    if (!tmp || !dst) {
        free(tmp);
        moe_free_aligned(dst);
        return NULL;
    }
    moe_convert_to_f32(tmp, src, dt, (size_t)(n * k));
    moe_pack_panels(dst, tmp, MOE_DTYPE_F32, n, k);
    free(tmp);
    return dst;
}

void moe_pack_strided(void *dst, const void *src, moe_dtype dt, int64_t n, int64_t k, int64_t so, int64_t si)
{
    if (si == 1 && so >= k) {
        moe_pack_panels_ld(dst, src, dt, n, k, so); /* row-major, rows so apart */
        return;
    }
    /* input-major or interleaved: transposed panel by panel, reading each input row's nw
     * outputs (contiguous when so = 1) */
    const size_t es = moe_dtype_size(dt);
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (int64_t p = 0; p < moe_pmat_panels(n); p++) {
        const int nw = moe_pmat_panel_width(n, p);
        unsigned char *panel = d + (size_t)(p * MOE_PANEL * k) * es; /* [k][nw] */
        for (int64_t kk = 0; kk < k; kk++) {
            for (int j = 0; j < nw; j++) {
                const unsigned char *from = s + (size_t)((p * MOE_PANEL + j) * so + kk * si) * es;
                unsigned char *to = panel + (size_t)(kk * nw + j) * es;
                if (es == 2)
                    memcpy(to, from, 2);
                else
                    memcpy(to, from, 4);
            }
        }
    }
}
