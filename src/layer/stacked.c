/* moe_weight_source_from_stacked: transformers' stacked expert parameters described as
 * per-expert pointers and strides (moe.h moe_stacked_experts), no copy. */
#include "core/internal.h"
#include "quant/quant.h"

#include <stdarg.h>
#include <stdio.h>

static moe_status fail(char *err, size_t len, moe_status st, const char *fmt, ...)
{
    if (err && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return st;
}

moe_status moe_weight_source_from_stacked(const moe_layer_desc *desc, const moe_stacked_experts *st,
                                          const void **ptrs, size_t n_ptrs, moe_weight_source *src,
                                          char *err, size_t err_len)
{
    static const char fn[] = "moe_weight_source_from_stacked";
    if (err && err_len)
        err[0] = '\0';
    if (!desc || !st || !ptrs || !src)
        return fail(err, err_len, MOE_EINVAL, "%s: %s is NULL", fn,
                    !desc ? "desc" : !st ? "stacked" : !ptrs ? "ptrs" : "src");
    const int64_t E = desc->num_experts, H = desc->hidden_size, I = desc->moe_intermediate_size;
    if (E < 1 || H < 1 || I < 1)
        return fail(err, err_len, MOE_EINVAL, "%s: desc sizes must be >= 1 (num_experts %lld, hidden_size %lld, "
                    "moe_intermediate_size %lld)", fn, (long long)E, (long long)H, (long long)I);
    if (moe_quant_active(&desc->quant))
        return fail(err, err_len, MOE_EUNSUPPORTED,
                    "%s: desc->quant is set: quantized experts take per-expert codes and scales (moe_quant.h)", fn);
    const size_t es = moe_dtype_size(desc->weight_dtype);
    if (desc->weight_dtype != MOE_DTYPE_F32 && desc->weight_dtype != MOE_DTYPE_BF16 &&
        desc->weight_dtype != MOE_DTYPE_F16)
        return fail(err, err_len, MOE_EDTYPE, "%s: desc->weight_dtype %s, expected F32, BF16 or F16", fn,
                    moe_dtype_name(desc->weight_dtype));
    if (!st->gate_up_proj || !st->down_proj)
        return fail(err, err_len, MOE_EINVAL, "%s: stacked->%s is NULL", fn,
                    !st->gate_up_proj ? "gate_up_proj" : "down_proj");
    if (!st->has_bias != !desc->has_expert_bias)
        return fail(err, err_len, MOE_EINVAL, "%s: stacked->has_bias = %d but desc->has_expert_bias = %d: they must agree",
                    fn, st->has_bias, desc->has_expert_bias);
    if (st->has_bias) {
        if (!st->gate_up_proj_bias || !st->down_proj_bias)
            return fail(err, err_len, MOE_EINVAL, "%s: has_bias is set but stacked->%s is NULL", fn,
                        !st->gate_up_proj_bias ? "gate_up_proj_bias" : "down_proj_bias");
        if (st->bias_dtype != MOE_DTYPE_F32 && st->bias_dtype != MOE_DTYPE_BF16 && st->bias_dtype != MOE_DTYPE_F16)
            return fail(err, err_len, MOE_EDTYPE, "%s: stacked->bias_dtype %s, expected F32, BF16 or F16", fn,
                        moe_dtype_name(st->bias_dtype));
    }
    const size_t need = MOE_STACKED_POINTERS(E);
    if (n_ptrs < need)
        return fail(err, err_len, MOE_EINVAL, "%s: ptrs holds %zu pointers, %zu needed (MOE_STACKED_POINTERS(%lld))", fn,
                    n_ptrs, need, (long long)E);

    /* Non-gated experts (moe_activation_gated 0: Nemotron-H's NemotronHExperts, has_gate=False in
     * transformers' use_experts_implementation): gate_up_proj holds up_proj alone, [E, I, H] or, with
     * is_transposed, [E, H, I]; its bias [E, I]. is_concatenated has no meaning then and is not read. */
    const int gated = moe_activation_gated(desc->activation);
    const int64_t W1 = gated ? 2 * I : I; /* gate_up_proj's outputs per expert */
    /* pointer arrays, each [E]: gate, up, down, gate bias, up bias, down bias */
    const void **gp = ptrs, **up = ptrs + E, **dp = ptrs + 2 * E;
    const void **gb = ptrs + 3 * E, **ub = ptrs + 4 * E, **db = ptrs + 5 * E;
    const unsigned char *gu = st->gate_up_proj, *dn = st->down_proj;
    /* element (o, i) of gate / up, o < I, i < H, relative to the expert's base (elements):
     *   [2I, H] concatenated: gate o*H + i, up (I+o)*H + i      -> strides (H, 1), up at +I*H
     *   [2I, H] interleaved:  gate 2o*H + i, up (2o+1)*H + i    -> strides (2H, 1), up at +H
     *   [H, 2I] concatenated: gate i*2I + o, up i*2I + I + o    -> strides (1, 2I), up at +I
     *   [H, 2I] interleaved:  gate i*2I + 2o, up i*2I + 2o + 1  -> strides (2, 2I), up at +1 */
    int64_t so, si, up_off;
    if (!gated) {
        /* up element (o, i): [I, H] at o*H + i, (H, 1); [H, I] at i*I + o, (1, I) */
        so = st->is_transposed ? 1 : H;
        si = st->is_transposed ? I : 1;
        up_off = 0;
    } else if (!st->is_transposed) {
        so = st->is_concatenated ? H : 2 * H;
        si = 1;
        up_off = st->is_concatenated ? I * H : H;
    } else {
        so = st->is_concatenated ? 1 : 2;
        si = 2 * I;
        up_off = st->is_concatenated ? I : 1;
    }
    for (int64_t e = 0; e < E; e++) {
        gp[e] = gated ? gu + (size_t)(e * W1 * H) * es : NULL;
        up[e] = gu + (size_t)(e * W1 * H + up_off) * es;
        dp[e] = dn + (size_t)(e * H * I) * es;
    }
    src->gate_proj = gated ? gp : NULL;
    src->up_proj = up;
    src->down_proj = dp;
    src->gate_up_stride_out = so;
    src->gate_up_stride_in = si;
    /* down element (o, i), o < H, i < I: [H, I] at o*I + i, (I, 1); [I, H] at i*H + o, (1, H) */
    src->down_stride_out = st->is_transposed ? 1 : I;
    src->down_stride_in = st->is_transposed ? H : 1;
    if (st->has_bias) {
        const size_t bs = moe_dtype_size(st->bias_dtype);
        const unsigned char *gub = st->gate_up_proj_bias, *dnb = st->down_proj_bias;
        for (int64_t e = 0; e < E; e++) {
            gb[e] = gated ? gub + (size_t)(e * 2 * I) * bs : NULL;
            ub[e] = gub + (size_t)(e * W1 + (!gated ? 0 : st->is_concatenated ? I : 1)) * bs;
            db[e] = dnb + (size_t)(e * H) * bs;
        }
        src->gate_bias = gated ? gb : NULL;
        src->up_bias = ub;
        src->down_bias = db;
        src->expert_bias_dtype = st->bias_dtype;
        src->gate_up_bias_stride = !gated || st->is_concatenated ? 1 : 2;
    } else {
        src->gate_bias = src->up_bias = src->down_bias = NULL;
        src->gate_up_bias_stride = 0;
    }
    return MOE_OK;
}
