/* The template's plain-weight kernels (template.h). The loop a vector port replaces: for every
 * row m and panel p, the 16 (nw) accumulators of the panel's features run over k in increasing
 * order from +0, one fmaf per term, on the weight converted exactly to f32. A partial last
 * panel (nw < 16) is handled by its true width: never pad, never read past it. */
#include "gemm/template/template.h"
#include "quant/convert.h"

#include <math.h>

/* Element i of a panel in dtype dt, exactly as f32. */
static inline float weight_at(const void *base, moe_dtype dt, int64_t i)
{
    switch (dt) {
    case MOE_DTYPE_BF16: return moe_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOE_DTYPE_F16: return moe_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static void linear_plain(const moe_pmat *w, moe_dtype dt, int64_t p0, int64_t p1, const float *const *x, int mb,
                         float *out, int64_t ldo)
{
    const int64_t K = w->k;
    for (int m = 0; m < mb; m++) {
        for (int64_t p = p0; p < p1; p++) {
            const int nw = moe_pmat_panel_width(w->n, p);
            const int64_t base = p * MOE_PANEL * K; /* element offset of panel p: [K][nw] */
            float acc[MOE_PANEL] = {0.0f};           /* the panel's accumulators (a vector register) */
            for (int64_t kk = 0; kk < K; kk++) {
                const float xv = x[m][kk]; /* broadcast */
                for (int j = 0; j < nw; j++)
                    acc[j] = fmaf(xv, weight_at(w->data, dt, base + kk * nw + j), acc[j]);
            }
            for (int j = 0; j < nw; j++) /* a masked store */
                out[m * ldo + (p - p0) * MOE_PANEL + j] = acc[j];
        }
    }
}

void moe_ukr_f32_template_1x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                               float *out, int64_t ldo)
{
    linear_plain(w, MOE_DTYPE_F32, p0, p1, x, mb, out, ldo);
}

void moe_ukr_bf16_template_1x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                                float *out, int64_t ldo)
{
    linear_plain(w, MOE_DTYPE_BF16, p0, p1, x, mb, out, ldo);
}

void moe_ukr_f16_template_1x16(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                               float *out, int64_t ldo)
{
    linear_plain(w, MOE_DTYPE_F16, p0, p1, x, mb, out, ldo);
}
