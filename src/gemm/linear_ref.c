/* The scalar kernels of the "ref" table, and the reference entries every table starts from
 * (moe_kernels_init_ref). Readable on purpose; the vector tables must give exactly these bits. */
#include "core/act.h"
#include "gemm/kernels.h"
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

/* Plain f32 / bf16 / f16 panels: one fmaf per term in increasing k from +0. */
void moe_ukr_plain_ref(const moe_pmat *w, int64_t p0, int64_t p1, const float *const *x, int mb, float *out,
                       int64_t ldo)
{
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

void moe_kernels_init_ref(moe_kernels *k)
{
    *k = (moe_kernels){0};
    k->name = "ref";
    k->linear[MOE_WF_F32] = moe_ukr_plain_ref;
    k->linear[MOE_WF_BF16] = moe_ukr_plain_ref;
    k->linear[MOE_WF_F16] = moe_ukr_plain_ref;
    k->linear[MOE_WF_F8] = moe_ukr_q_ref;
    k->linear[MOE_WF_I8] = moe_ukr_q_ref;
    k->linear[MOE_WF_I4] = moe_ukr_q_ref;
    k->linear[MOE_WF_I4ZP] = moe_ukr_q_ref;
    k->linear[MOE_WF_FP4] = moe_ukr_q_ref;
    k->linear[MOE_WF_W8A8] = moe_ukr_w8a8_ref;
    k->linear[MOE_WF_F8A8] = moe_ukr_f8a8_ref;
    k->act_row = moe_act_row_ref;
    k->quant_row[MOE_WF_W8A8] = moe_quant_row_i8_ref;
    k->linear_rows[MOE_WF_W8A8] = moe_ukr_w8a8_rows_ref;
    k->quant_row[MOE_WF_F8A8] = moe_quant_row_f8_ref;
    k->linear_rows[MOE_WF_F8A8] = moe_ukr_f8a8_rows_ref;
    k->bf16_row = moe_bf16_row_ref;
    k->bf16_rows[MOE_WF_BF16P] = moe_ukr_bf16p_rows_ref;
    k->bf16_rows[MOE_WF_F8] = moe_ukr_qbf16_rows_ref;
    k->bf16_rows[MOE_WF_I8] = moe_ukr_qbf16_rows_ref;
    k->bf16_rows[MOE_WF_I4] = moe_ukr_qbf16_rows_ref;
    k->bf16_rows[MOE_WF_I4ZP] = moe_ukr_qbf16_rows_ref;
    k->bf16_rows[MOE_WF_FP4] = moe_ukr_qbf16_rows_ref;
    k->native = k->native_bf16 = 0; /* set by the row: the ref row's own, nothing for a row that merges over it */
    k->bf16_dp = 0;                 /* the scalar emulation */
    k->tail_ref = 0;
}

void moe_kernels_merge(moe_kernels *k, const moe_kernels *own)
{
    for (int f = 0; f < MOE_WF__COUNT; f++) {
        if (own->linear[f])
            k->linear[f] = own->linear[f];
        if (own->quant_row[f])
            k->quant_row[f] = own->quant_row[f];
        if (own->linear_rows[f])
            k->linear_rows[f] = own->linear_rows[f];
        if (own->linear[f] || own->linear_rows[f])
            k->native |= 1u << f;
        if (own->bf16_rows[f]) {
            k->bf16_rows[f] = own->bf16_rows[f];
            k->native_bf16 |= 1u << f;
            k->bf16_dp = (k->bf16_dp & ~(1u << f)) | (own->bf16_dp & (1u << f));
        }
    }
    if (own->act_row)
        k->act_row = own->act_row;
    if (own->bf16_row)
        k->bf16_row = own->bf16_row;
    k->caps |= own->caps;
    k->tail_ref |= own->tail_ref;
    if (own->peak_read)
        k->peak_read = own->peak_read;
    if (own->peak_fma) {
        k->peak_fma = own->peak_fma;
        k->fma_lanes = own->fma_lanes;
    }
    if (own->peak_vnni)
        k->peak_vnni = own->peak_vnni;
    if (own->notes[0])
        memcpy(k->notes, own->notes, sizeof k->notes);
    if (own->peak_bf16)
        k->peak_bf16 = own->peak_bf16;
}
