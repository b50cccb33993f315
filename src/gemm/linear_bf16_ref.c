/* Scalar kernels of compute bf16 (gemm/kernels.h "Compute bf16"): the reference entries every
 * table starts from, and the definition the vector kernels reproduce bit for bit. The
 * arithmetic is core/bf16.h's (moe_bf16_round, moe_bf16_dp). */
#include "core/bf16.h"
#include "gemm/kernels.h"
#include "quant/format.h"

/* pair i of a bf16 row: element 2i + e (e = 0 low half, 1 high half) as f32 */
static inline float row_elem(const uint8_t *row, int64_t k)
{
    uint32_t pair;
    memcpy(&pair, row + 4 * (k / 2), sizeof pair);
    return moe_bf16_value((uint16_t)(k % 2 ? pair >> 16 : pair & 0xffffu));
}

void moe_bf16_row_ref(const float *x, int64_t n, int64_t G, const float *mul, uint8_t *dst, float *scales)
{
    (void)G, (void)scales;
    for (int64_t i = 0; i < (n + 1) / 2; i++) {
        /* both elements are read before the pair is stored: in place is safe (4 bytes written
         * at 4i cover floats i only, and x[2i], x[2i+1] are at 8i and beyond) */
        const float v0 = mul ? *mul * x[2 * i] : x[2 * i];
        const float v1 = 2 * i + 1 < n ? (mul ? *mul * x[2 * i + 1] : x[2 * i + 1]) : 0.0f;
        const uint32_t pair = (uint32_t)moe_bf16_round(v0) | (uint32_t)moe_bf16_round(v1) << 16;
        memcpy(dst + 4 * i, &pair, sizeof pair);
    }
}

void moe_ukr_bf16p_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    const uint16_t *d = w->data;
    const int64_t K2 = (w->k + 1) / 2;
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    for (int m = 0; m < mb; m++) {
        for (int64_t n = n0; n < n1; n++) {
            const int64_t p = n / MOE_PANEL;
            const int nw = moe_pmat_panel_width(w->n, p), j = (int)(n % MOE_PANEL);
            const uint16_t *panel = d + p * 2 * MOE_PANEL * K2; /* [K2][nw][2] */
            float acc = 0.0f;
            for (int64_t i = 0; i < K2; i++) {
                const uint16_t *wp = panel + i * 2 * nw + 2 * j; /* the pair (2i, 2i+1) of feature n */
                acc = moe_bf16_dp(acc, row_elem(xq[m], 2 * i + 1), moe_bf16_value(wp[1]));
                acc = moe_bf16_dp(acc, row_elem(xq[m], 2 * i), moe_bf16_value(wp[0]));
            }
            out[m * ldo + (n - n0)] = acc;
        }
    }
}

/* Index of the scale (and zero point) of weight (n, kk) in q->scale: panel p at p*16*ng,
 * [ng][nw]. */
static int64_t scale_index(const moe_pmat *w, int64_t n, int64_t kk)
{
    const int64_t p = n / MOE_PANEL;
    const int nw = moe_pmat_panel_width(w->n, p);
    return p * 16 * w->q->ng + (kk / w->q->gk) * nw + (n % MOE_PANEL);
}

void moe_ukr_qbf16_rows_ref(const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                            const float *const *xs, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes)
{
    (void)xs, (void)pf, (void)pf_bytes;
    const struct moe_qmat *q = w->q;
    const int64_t K = w->k;
    /* groups of gk inputs (even, or one group of all K: plan creation refuses odd ones) */
    const int64_t gk = q->ng > 1 ? q->gk : 2 * ((K + 1) / 2);
    const int64_t n0 = p0 * MOE_PANEL, n1 = (p1 * MOE_PANEL < w->n) ? p1 * MOE_PANEL : w->n;
    for (int m = 0; m < mb; m++) {
        for (int64_t n = n0; n < n1; n++) {
            float y = 0.0f;
            for (int64_t g = 0; g < q->ng; g++) {
                const int64_t k0 = g * gk, k1 = k0 + gk < K ? k0 + gk : K;
                const float z = q->zero ? q->zero[scale_index(w, n, k0)] : 0.0f;
                float part = 0.0f;
                for (int64_t k = k0; k < k1; k += 2) {
                    /* the code's exact value (minus the zero point: exact, |v| <= 15); +0 past K */
                    const float v1 = k + 1 < K ? moe_qmat_code(w, n, k + 1) - z : 0.0f;
                    const float v0 = moe_qmat_code(w, n, k) - z;
                    part = moe_bf16_dp(part, row_elem(xq[m], k + 1), v1);
                    part = moe_bf16_dp(part, row_elem(xq[m], k), v0);
                }
                y = fmaf(part, q->scale[scale_index(w, n, k0)], y);
            }
            out[m * ldo + (n - n0)] = y;
        }
    }
}
