/* The scalar linear microkernel: the "ref" kernel table. Readable on purpose; the vector
 * tables must give exactly these bits. */
#include "core/act.h"
#include "core/kernels.h"
#include "quant/quant.h"
#include "quant/convert.h"

#include <math.h>

static float load_w(const void *base, moe_dtype dt, int64_t i)
{
    switch (dt) {
    case MOE_DTYPE_BF16: return moe_bf16_to_f32(((const uint16_t *)base)[i]);
    case MOE_DTYPE_F16: return moe_f16_to_f32(((const uint16_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

static void linear_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb,
                       float *out, int64_t ldo)
{
    if (w->q) { /* quantized weights (quant/quant.h) */
        moe_linear_q_ref(w, p0, p1, x, mb, out, ldo);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        int nw = moe_pmat_panel_width(w->n, p);
        int64_t panel = p * MOE_PANEL * w->k; /* element offset of panel p: [k][nw] */
        for (int m = 0; m < mb; m++) {
            for (int j = 0; j < nw; j++) {
                float acc = 0.0f;
                for (int64_t kk = 0; kk < w->k; kk++)
                    acc = fmaf(x[m][kk], load_w(w->data, w->dtype, panel + kk * nw + j), acc);
                out[m * ldo + (p - p0) * MOE_PANEL + j] = acc;
            }
        }
    }
}

void moe_act_row_ref(const moe_layer_desc *d, const float *g, const float *u, const float *bg, const float *bu,
                     float *h, int64_t n)
{
    moe_act_row_scalar(d, g, u, bg, bu, h, n);
}

const moe_kernels moe_kernels_ref = {
    .name = "ref",
    .linear = linear_ref,
    .linear_q = moe_linear_q_ref,
    .act_row = moe_act_row_ref,
    .linear_w8a8 = moe_linear_w8a8_rows_ref,
    .quant_row_i8 = moe_quant_row_i8_ref,
    .linear_f8a8 = moe_linear_f8a8_rows_ref,
    .quant_row_f8 = moe_quant_row_f8_ref,
};
