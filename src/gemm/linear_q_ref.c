/* Scalar kernels for quantized weights (table entry linear_q of "ref"; the avx2 table's
 * moe_linear_q_avx2 calls it for W8A8 and F8A8).
 *  - Weight-only (fp8, int8, int4, mxfp4): the scale applied after each scale group's dot
 *    product (docs/numerics.md section 5): per group g of gk consecutive k (per channel or per
 *    tensor: one group of K), part = fmaf(x[k], v[k], part) in increasing k from +0 on the
 *    codes' exact values (int4 with zero points: then part = fmaf(-z, xs, part), xs the sum of
 *    the group's x in increasing k from +0), then y = fmaf(part, s[g], y) from y = +0 in
 *    increasing g.
 *  - W8A8 int8: per-row dynamic int8 activations, exact int32 dot products,
 *    out = ((float)acc * s_x) * s_w[n]. */
#include "quant/quant.h"

float moe_qmat_code(const moe_pmat *w, int64_t n, int64_t kk)
{
    const struct moe_qmat *q = w->q;
    const uint8_t *d = w->data;
    const int64_t K = w->k, p = n / MOE_PANEL;
    const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
    switch (q->kind) {
    case MOE_QK_F8:
        /* f8h: the f16 value e4m3 * 2^-8 (exact in f32), scale = s * 256 (quant.h) */
        return moe_e4m3_to_f32(d[p * 16 * K + kk * nw + j]) * (q->f8h ? 0x1p-8f : 1.0f);
    case MOE_QK_F8A8: return moe_e4m3_to_f32(d[p * 16 * K + kk * nw + j]); /* scale holds s */
    case MOE_QK_I8: return (float)(int8_t)d[p * 16 * K + kk * nw + j];
    case MOE_QK_W8A8: {
        const int64_t K4 = (K + 3) / 4 * 4;
        return (float)(int8_t)d[p * 16 * K4 + (kk / 4) * nw * 4 + j * 4 + kk % 4];
    }
    default: {
        /* 4-bit (quant.h MOE_QK_I4): body words [K/8][nw], then tail rows [K%8][ceil(nw/2)] */
        const uint8_t *panel = d + p * 8 * K;
        const int64_t K8 = K / 8;
        unsigned nib;
        if (kk < 8 * K8) {
            unsigned b = panel[4 * ((kk / 8) * nw + j) + (kk % 8) / 2];
            nib = (kk & 1) ? (b >> 4) : (b & 15u);
        } else {
            unsigned b = panel[4 * nw * K8 + (kk - 8 * K8) * ((nw + 1) / 2) + j / 2];
            nib = (j & 1) ? (b >> 4) : (b & 15u);
        }
        if (q->kind == MOE_QK_FP4)
            return moe_e2m1_to_f32(nib);
        if (q->zero)
            return (float)nib;
        return (float)((int)(nib ^ 8u) - 8);
    }
    }
}

/* Index of the scale (and zero point) of weight (n, kk) in q->scale: panel p at p*16*ng,
 * [ng][nw]. */
static int64_t qmat_scale_index(const moe_pmat *w, int64_t n, int64_t kk)
{
    const int64_t p = n / MOE_PANEL;
    const int nw = moe_pmat_panel_width(w->n, p);
    return p * 16 * w->q->ng + (kk / w->q->gk) * nw + (n % MOE_PANEL);
}

enum { KC_REF = 2048, NB_REF = 8 * MOE_PANEL };

static void linear_w8a8_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
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

/* The row quantizer (core/kernels.h moe_quant_row_i8_fn), scalar: the same arithmetic as
 * moe_qact_i8_scale / moe_qact_i8, on v[k] = x[k] or *mul * x[k]. */
float moe_quant_row_i8_ref(const float *x, int64_t n, const float *mul, uint8_t *dst)
{
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
    return s;
}

/* W8A8 on quantized rows (core/kernels.h moe_linear_w8a8_fn), scalar; no prefetch. */
void moe_linear_w8a8_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                              const float *sx, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes)
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
            out[m * ldo + (n - n0)] = ((float)a * sx[m]) * q->scale[n];
        }
    }
}

/* fp8 w8a8 row quantizer (core/kernels.h moe_quant_row_f8_fn), scalar. */
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

/* fp8 w8a8 on quantized rows (core/kernels.h moe_linear_f8a8_fn), scalar: the definition. */
void moe_linear_f8a8_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                              const float *const *sa, int mb, float *out, int64_t ldo)
{
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

/* fp8 w8a8 on f32 rows: each group quantized on the fly (the row quantizer's arithmetic),
 * then the definition above; out holds the running sum y between groups. */
static void linear_f8a8_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                            int64_t ldo)
{
    const struct moe_qmat *q = w->q;
    const uint8_t *d = w->data;
    const int64_t K = w->k, G = q->gk;
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    for (int m = 0; m < mb; m++) {
        for (int64_t g = 0; g < q->ng; g++) {
            const int64_t k1 = (g + 1) * G < K ? (g + 1) * G : K;
            const float sa = moe_qact_f8_scale(x[m] + g * G, k1 - g * G);
            for (int64_t n = n0; n < n1; n++) {
                const int64_t p = n / MOE_PANEL;
                const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
                const uint8_t *panel = d + p * 16 * K; /* [K][nw] */
                float part = 0.0f;
                for (int64_t k = g * G; k < k1; k++)
                    part = fmaf(moe_e4m3_to_f32(moe_f32_to_e4m3(x[m][k] / sa)), moe_e4m3_to_f32(panel[k * nw + j]),
                                part);
                float *o = out + m * ldo + (n - n0);
                *o = (g == 0 ? 0.0f : *o) + (part * sa) * q->scale[p * 16 * q->ng + g * nw + j];
            }
        }
    }
}

void moe_linear_q_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                      int64_t ldo)
{
    if (w->q->kind == MOE_QK_W8A8) {
        linear_w8a8_ref(w, p0, p1, x, mb, out, ldo);
        return;
    }
    if (w->q->kind == MOE_QK_F8A8) {
        linear_f8a8_ref(w, p0, p1, x, mb, out, ldo);
        return;
    }
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
