/* Scalar kernels for quantized weights: the reference entries of every kernel table for the
 * quantized formats (gemm/kernels.h; moe_kernels_init_ref installs them).
 *  - Weight-only (fp8, int8, int4, mxfp4): the scale applied after each scale group's dot
 *    product (docs/numerics.md section 5): per group g of gk consecutive k (per channel or per
 *    tensor: one group of K), part = fmaf(x[k], v[k], part) in increasing k from +0 on the
 *    codes' exact values (int4 with zero points: then part = fmaf(-z, xs, part), xs the sum of
 *    the group's x in increasing k from +0), then y = fmaf(part, s[g], y) from y = +0 in
 *    increasing g.
 *  - W8A8 int8: per-row dynamic int8 activations, exact int32 dot products,
 *    out = ((float)acc * s_x) * s_w[n]. */
#include "gemm/kernels.h"
#include "quant/format.h"
#include "quant/quant.h"

/* Index of the scale (and zero point) of weight (n, kk) in q->scale: panel p at p*16*ng,
 * [ng][nw]. */
static int64_t qmat_scale_index(const moe_pmat *w, int64_t n, int64_t kk)
{
    const int64_t p = n / MOE_PANEL;
    const int nw = moe_pmat_panel_width(w->n, p);
    return p * 16 * w->q->ng + (kk / w->q->gk) * nw + (n % MOE_PANEL);
}

enum { KC_REF = 2048, NB_REF = 8 * MOE_PANEL };

void moe_ukr_w8a8_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const uint8_t *d = w->data;
    const int64_t K = w->k, K4 = (K + 3) / 4 * 4;
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    int8_t xq[KC_REF];
    int32_t acc[NB_REF];
    for (int m = 0; m < mb; m++) {
        const float sx = moe_qact_i8_scale(x[m], K);
        for (int64_t nb = n0; nb < n1; nb += NB_REF) {
            const int64_t ne = nb + NB_REF < n1 ? nb + NB_REF : n1;
            for (int64_t n = nb; n < ne; n++)
                acc[n - nb] = 0;
            for (int64_t kc = 0; kc < K; kc += KC_REF) {
                const int64_t ke = kc + KC_REF < K ? kc + KC_REF : K;
                for (int64_t k = kc; k < ke; k++)
                    xq[k - kc] = moe_qact_i8(x[m][k], sx);
                for (int64_t n = nb; n < ne; n++) {
                    const int64_t p = n / MOE_PANEL;
                    const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
                    const uint8_t *panel = d + p * 16 * K4;
                    int32_t a = acc[n - nb];
                    for (int64_t k = kc; k < ke; k++)
                        a += (int32_t)xq[k - kc] * (int32_t)(int8_t)panel[(k / 4) * nw * 4 + j * 4 + k % 4];
                    acc[n - nb] = a;
                }
            }
            for (int64_t n = nb; n < ne; n++)
                out[m * ldo + (n - n0)] = ((float)acc[n - nb] * sx) * q->scale[n];
        }
    }
}

/* The W8A8 row quantizer (gemm/kernels.h moe_quant_row_fn), scalar: the same arithmetic as
 * moe_qact_i8_scale / moe_qact_i8, on v[k] = x[k] or *mul * x[k]. */
void moe_quant_row_i8_ref(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales)
{
    (void)G; /* one scale per row */
    float a = 0.0f;
    for (int64_t k = 0; k < n; k++) {
        const float v = fabsf(mul ? *mul * x[k] : x[k]);
        a = v > a ? v : a; /* NaN ignored */
    }
    const float s = a == 0.0f ? 1.0f : a / 127.0f;
    int64_t k = 0;
    for (; k < n; k++) { /* in place: x[k] is read before byte k is written */
        const float v = mul ? *mul * x[k] : x[k];
        dst[k] = (uint8_t)(moe_qact_i8(v, s) + 128);
    }
    for (; k % 4; k++)
        dst[k] = 128;
    scales[0] = s;
}

/* W8A8 on quantized rows (gemm/kernels.h moe_linear_rows_fn), scalar; no prefetch. */
void moe_ukr_w8a8_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                           const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes)
{
    (void)pf, (void)pf_bytes;
    const struct moe_qmat *q = w->q;
    const uint8_t *d = w->data;
    const int64_t K = w->k, K4 = (K + 3) / 4 * 4;
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    for (int m = 0; m < mb; m++) {
        for (int64_t n = n0; n < n1; n++) {
            const int64_t p = n / MOE_PANEL;
            const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
            const uint8_t *panel = d + p * 16 * K4; /* [K4/4][nw][4] */
            int32_t a = 0;
            for (int64_t k = 0; k < K; k++)
                a += ((int32_t)xq[m][k] - 128) * (int32_t)(int8_t)panel[(k / 4) * nw * 4 + j * 4 + k % 4];
            out[m * ldo + (n - n0)] = ((float)a * xs[m][0]) * q->scale[n];
        }
    }
}

/* fp8 w8a8 row quantizer (gemm/kernels.h moe_quant_row_fn), scalar. */
void moe_quant_row_f8_ref(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *sa)
{
    for (int64_t g = 0; g * G < n; g++) { /* pass 1: every group's scale (x intact) */
        const int64_t k1 = (g + 1) * G < n ? (g + 1) * G : n;
        float a = 0.0f;
        for (int64_t k = g * G; k < k1; k++) {
            const float v = fabsf(mul ? *mul * x[k] : x[k]);
            a = v > a ? v : a; /* NaN ignored */
        }
        sa[g] = (a > 1e-10f ? a : 1e-10f) / 448.0f;
    }
    for (int64_t k = 0; k < n; k++) { /* pass 2, in place allowed: x[k] read before byte k */
        const float v = mul ? *mul * x[k] : x[k];
        dst[k] = moe_f32_to_e4m3(v / sa[k / G]);
    }
}

/* fp8 w8a8 on quantized rows (gemm/kernels.h moe_linear_rows_fn), scalar: the definition; no
 * prefetch. */
void moe_ukr_f8a8_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                           const float *const *sa, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes)
{
    (void)pf, (void)pf_bytes;
    const struct moe_qmat *q = w->q;
    const uint8_t *d = w->data;
    const int64_t K = w->k, G = q->gk;
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    for (int m = 0; m < mb; m++) {
        for (int64_t n = n0; n < n1; n++) {
            const int64_t p = n / MOE_PANEL;
            const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
            const uint8_t *panel = d + p * 16 * K; /* [K][nw] */
            float y = 0.0f;
            for (int64_t g = 0; g < q->ng; g++) {
                const int64_t k1 = (g + 1) * G < K ? (g + 1) * G : K;
                float part = 0.0f;
                for (int64_t k = g * G; k < k1; k++)
                    part = fmaf(moe_e4m3_to_f32(xq[m][k]), moe_e4m3_to_f32(panel[k * nw + j]), part);
                y = y + (part * sa[m][g]) * q->scale[p * 16 * q->ng + g * nw + j];
            }
            out[m * ldo + (n - n0)] = y;
        }
    }
}

/* fp8 w8a8 on f32 rows: each group quantized on the fly (the row quantizer's arithmetic: the
 * dynamic group scale, or with static activations, q->in_scale > 0, the matrix's static scale
 * and moe_qact_f8_static), then the definition above; out holds the running sum y between
 * groups. */
void moe_ukr_f8a8_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const uint8_t *d = w->data;
    const int64_t K = w->k, G = q->gk;
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    for (int m = 0; m < mb; m++) {
        for (int64_t g = 0; g < q->ng; g++) {
            const int64_t k1 = (g + 1) * G < K ? (g + 1) * G : K;
            const float sa = q->in_scale > 0.0f ? q->in_scale : moe_qact_f8_scale(x[m] + g * G, k1 - g * G);
            for (int64_t n = n0; n < n1; n++) {
                const int64_t p = n / MOE_PANEL;
                const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
                const uint8_t *panel = d + p * 16 * K; /* [K][nw] */
                float part = 0.0f;
                for (int64_t k = g * G; k < k1; k++)
                    part = fmaf(moe_e4m3_to_f32(moe_qact_f8_static(x[m][k], sa)), moe_e4m3_to_f32(panel[k * nw + j]),
                                part);
                float *o = out + m * ldo + (n - n0);
                *o = (g == 0 ? 0.0f : *o) + (part * sa) * q->scale[p * 16 * q->ng + g * nw + j];
            }
        }
    }
}

/* Weight-only formats (F8, I8, I4, I4ZP, FP4): the definition of docs/numerics.md section 5. */
void moe_ukr_q_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                   int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    for (int64_t p = p0; p < p1; p++) {
        const int nw = moe_pmat_panel_width(w->n, p);
        for (int m = 0; m < mb; m++) {
            for (int j = 0; j < nw; j++) {
                const int64_t n = p * MOE_PANEL + j;
                float acc = 0.0f;
                for (int64_t g = 0; g < q->ng; g++) {
                    const int64_t k0 = g * q->gk, k1 = k0 + q->gk < w->k ? k0 + q->gk : w->k;
                    const int64_t si = qmat_scale_index(w, n, k0);
                    float part = 0.0f;
                    for (int64_t kk = k0; kk < k1; kk++)
                        part = fmaf(x[m][kk], moe_qmat_code(w, n, kk), part);
                    if (q->zero) {
                        float xs = 0.0f; /* the group's sum of x, increasing k */
                        for (int64_t kk = k0; kk < k1; kk++)
                            xs = xs + x[m][kk];
                        part = fmaf(-q->zero[si], xs, part);
                    }
                    acc = fmaf(part, q->scale[si], acc);
                }
                out[m * ldo + (p - p0) * MOE_PANEL + j] = acc;
            }
        }
    }
}
