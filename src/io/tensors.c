/* Checked tensor lookups of one MoE layer: each tensor found through the index, its dtype
 * and shape checked against config.json, with messages naming the file, the tensor, what was
 * expected (in config terms: "[I, H]") and what was found. */
#include "io/safetensors.h"
#include "io/tensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

void moe_ck_layer_free(moe_ck_layer *lt)
{
    void *owned[] = {lt->gate,      lt->up,      lt->down,      lt->gate_scale, lt->up_scale, lt->down_scale,
                     lt->gate_bias, lt->up_bias, lt->down_bias, lt->gu_split,   lt->sh_deq, lt->router_t};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        free(owned[i]);
    moe_ckq_layer_free(lt->ckq);
}

bool moe_ck_is_float_dtype(moe_dtype dt)
{
    return dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
}

moe_status moe_ck_check_shape(const moe_ck_index *ix, const char *path, const moe_tensor_info *info,
                              const char *label, int ndim, const int64_t *want)
{
    bool ok = info->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = info->shape[d] == want[d];
    if (ok)
        return MOE_OK;
    char want_s[128], got_s[128];
    return moe_set_error(ix->ctx, MOE_ESHAPE,
                         "%s: tensor '%s': shape disagrees with config.json (expected %s = %s, found %s)", path,
                         info->name, label, moe_io_format_shape(want_s, sizeof want_s, ndim, want),
                         moe_io_format_shape(got_s, sizeof got_s, info->ndim, info->shape));
}

moe_status moe_ck_get_weight(const moe_ck_index *ix, moe_ck_layer *lt, const char *name, const char *label, int ndim,
                             const int64_t *want, moe_tensor_info *info)
{
    const char *path = NULL;
    moe_status st = moe_ck_get(ix, name, info, &path);
    if (st != MOE_OK)
        return st;
    if (!lt->have_weight_dtype) {
        if (!moe_ck_is_float_dtype(info->dtype))
            return moe_set_error(ix->ctx, MOE_EDTYPE,
                                 "%s: tensor '%s': dtype not accepted for expert weights (expected F32, BF16 or F16, found %s)%s",
                                 path, name, moe_dtype_name(info->dtype),
                                 info->dtype == MOE_DTYPE_F8_E4M3
                                     ? "; FP8 experts need config.json quantization_config {quant_method: fp8, "
                                       "weight_block_size: [bn, bk]} and the per-expert layout"
                                     : "");
        lt->have_weight_dtype = true;
        lt->weight_dtype = info->dtype;
        snprintf(lt->weight_dtype_from, sizeof lt->weight_dtype_from, "%s", name);
    } else if (info->dtype != lt->weight_dtype) {
        return moe_set_error(ix->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype disagrees with the other expert weights (expected %s as '%s', found %s)",
                             path, name, moe_dtype_name(lt->weight_dtype), lt->weight_dtype_from,
                             moe_dtype_name(info->dtype));
    }
    return moe_ck_check_shape(ix, path, info, label, ndim, want);
}

moe_status moe_ck_get_checked(const moe_ck_index *ix, const char *name, const char *what, moe_dtype dtype,
                              const char *label, int ndim, const int64_t *want, moe_tensor_info *info,
                              const char **path)
{
    moe_status st = moe_ck_get(ix, name, info, path);
    if (st != MOE_OK)
        return st;
    const bool any_float = dtype == MOE_CK_ANY_FLOAT;
    if (any_float ? !moe_ck_is_float_dtype(info->dtype) : info->dtype != dtype)
        return moe_set_error(ix->ctx, MOE_EDTYPE, "%s: tensor '%s': dtype not accepted for %s (expected %s, found %s)",
                             *path, name, what, any_float ? "F32, BF16 or F16" : moe_dtype_name(dtype),
                             moe_dtype_name(info->dtype));
    return label ? moe_ck_check_shape(ix, *path, info, label, ndim, want) : MOE_OK;
}

/* Per-tensor FP8: the scalar `name`_scale_inv or `name`_scale (F32 [] or [1]) of weight `name`. */
static moe_status get_fp8_tensor_scale(const moe_ck_index *ix, const char *name, const void **scale)
{
    char inv[MOE_CK_NAME_LEN], plain[MOE_CK_NAME_LEN];
    int l1 = snprintf(inv, sizeof inv, "%s_scale_inv", name), l2 = snprintf(plain, sizeof plain, "%s_scale", name);
    if (l1 < 0 || (size_t)l1 >= sizeof inv || l2 < 0 || (size_t)l2 >= sizeof plain)
        return moe_set_error(ix->ctx, MOE_EINVAL, "%s: tensor name too long: '%s_scale_inv'", ix->dir, name);
    const bool has_inv = moe_ck_has(ix, inv), has_plain = moe_ck_has(ix, plain);
    if (has_inv && has_plain)
        return moe_set_error(ix->ctx, MOE_EFORMAT,
                             "%s: tensors '%s' and '%s' are both present: a per-tensor FP8 weight has one scale",
                             ix->dir, inv, plain);
    if (!has_inv && !has_plain)
        return moe_set_error(ix->ctx, MOE_ENOTFOUND,
                             "%s: tensor '%s' (or '%s') is missing: per-tensor FP8 weight '%s' (quantization_config "
                             "quant_method fp8 without weight_block_size) needs its scalar scale",
                             ix->dir, inv, plain, name);
    const char *sname = has_inv ? inv : plain, *path = NULL;
    moe_tensor_info info;
    moe_status st = moe_ck_get_checked(ix, sname, "FP8 per-tensor scales", MOE_DTYPE_F32, NULL, 0, NULL, &info, &path);
    if (st != MOE_OK)
        return st;
    if (!(info.ndim == 0 || (info.ndim == 1 && info.shape[0] == 1))) {
        char got_s[128];
        return moe_set_error(ix->ctx, MOE_ESHAPE,
                             "%s: tensor '%s': FP8 per-tensor scale shape %s, expected [] or [1] (config.json "
                             "quantization_config has no weight_block_size)",
                             path, sname, moe_io_format_shape(got_s, sizeof got_s, info.ndim, info.shape));
    }
    if ((st = moe_io_check_scales(ix->ctx, path, sname, info.dtype, info.data, 1, 0, "FP8 per-tensor scale")) != MOE_OK)
        return st;
    *scale = info.data;
    return MOE_OK;
}

moe_status moe_ck_get_fp8_weight(const moe_ck_index *ix, int64_t bn, int64_t bk, const char *name, const char *label,
                                 const int64_t *want, const void **codes, const void **scale)
{
    const char *path = NULL;
    moe_tensor_info info;
    moe_status st = moe_ck_get(ix, name, &info, &path);
    if (st != MOE_OK)
        return st;
    if (info.dtype != MOE_DTYPE_F8_E4M3)
        return moe_set_error(ix->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype disagrees with config.json quantization_config (fp8: expected "
                             "F8_E4M3, found %s)",
                             path, name, moe_dtype_name(info.dtype));
    if ((st = moe_ck_check_shape(ix, path, &info, label, 2, want)) != MOE_OK)
        return st;
    *codes = info.data;
    char sname[MOE_CK_NAME_LEN];
    if (bn == 0) /* per-tensor */
        return get_fp8_tensor_scale(ix, name, scale);
    int len = snprintf(sname, sizeof sname, "%s_scale_inv", name);
    if (len < 0 || (size_t)len >= sizeof sname)
        return moe_set_error(ix->ctx, MOE_EINVAL, "%s: tensor name too long: '%s_scale_inv'", ix->dir, name);
    if ((st = moe_ck_get_checked(ix, sname, "FP8 block scales", MOE_DTYPE_F32, NULL, 0, NULL, &info, &path)) != MOE_OK)
        return st;
    const int64_t grid[2] = {(want[0] + bn - 1) / bn, (want[1] + bk - 1) / bk};
    bool ok = info.ndim == 2 && info.shape[0] == grid[0] && info.shape[1] == grid[1];
    if (!ok) {
        char want_s[128], got_s[128];
        return moe_set_error(ix->ctx, MOE_ESHAPE,
                             "%s: tensor '%s': FP8 block scale shape disagrees with config.json (expected "
                             "[ceil(%s / %" PRId64 "), ceil(%s / %" PRId64 ")] = %s for weight_block_size [%" PRId64
                             ", %" PRId64 "], found %s)",
                             path, sname, label[1] == 'I' ? "I" : "H", bn, label[1] == 'I' ? "H" : "I", bk,
                             moe_io_format_shape(want_s, sizeof want_s, 2, grid), bn, bk,
                             moe_io_format_shape(got_s, sizeof got_s, info.ndim, info.shape));
    }
    if ((st = moe_io_check_scales(ix->ctx, path, sname, info.dtype, info.data, grid[0], grid[1],
                                  "FP8 block scale (weight_scale_inv)")) != MOE_OK)
        return st;
    *scale = info.data;
    return MOE_OK;
}
