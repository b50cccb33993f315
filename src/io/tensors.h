/* One MoE layer's tensors, resolved (src/io/tensors.c): the layer they fill (moe_ck_layer)
 * and the checked lookups that fill it, each tensor found through the index and its dtype and
 * shape checked against config.json. Not installed; not API. */
#ifndef MOE_IO_TENSORS_H
#define MOE_IO_TENSORS_H

#include "io/ckpt_ct.h"
#include "io/index.h"

#include <stdbool.h>
#include <stdint.h>

#define MOE_CK_NAME_LEN 256  /* a tensor name: prefix + at most ~60 characters */
#define MOE_CK_PREFIX_LEN 96 /* "language_model.model.layers.<int64>.feed_forward." */

/* Everything one MoE layer needs, resolved and checked against config.json. */
typedef struct moe_ck_layer {
    moe_tensor_info router;     /* [E, H] (a transposed router, when loading: router_t's) */
    void *router_t;             /* the router saved [H, E] (ERNIE-4.5-VL), when loading: its [E, H]
                                   copy, owned; NULL otherwise */
    bool have_weight_dtype;
    moe_dtype weight_dtype;     /* of every expert and shared-expert tensor */
    char weight_dtype_from[MOE_CK_NAME_LEN]; /* the tensor that set weight_dtype */
    const void **gate;          /* [E] pointers, each [I, H] (or strided) */
    const void **up;            /* [E] pointers, each [I, H] (or strided) */
    const void **down;          /* [E] pointers, each [H, I] (or strided) */
    const void **gate_scale;    /* FP8: [E] pointers, each F32 [ceil(I/bn), ceil(H/bk)];
                                   MXFP4: each U8 E8M0 [I, H/32] */
    const void **up_scale;      /* FP8, MXFP4: the same */
    const void **down_scale;    /* FP8: [E] pointers, each F32 [ceil(H/bn), ceil(I/bk)];
                                   MXFP4: each U8 E8M0 [H, I/32] */
    bool mxfp4;                 /* MXFP4 experts (*_blocks / *_scales) */
    const uint8_t *gu_blocks;   /* MXFP4: gate_up_proj_blocks [E, 2I, H/32, 16], gate = even rows */
    const uint8_t *gu_scales;   /* MXFP4: gate_up_proj_scales [E, 2I, H/32] */
    float *sh_deq;              /* a quantized shared expert, when loading: gate [I_s, H],
                                   up [I_s, H], down [H, I_s] dequantized to f32; NULL otherwise */
    uint8_t *gu_split;          /* MXFP4, when loading: the local experts' gate and up rows
                                   de-interleaved, per expert e - e_lo: gate codes [I, H/2], up
                                   codes [I, H/2], gate scales [I, H/32], up scales [I, H/32] */
    int64_t gu_so, gu_si;       /* moe_weight_source strides; 0 = row-major */
    int64_t dn_so, dn_si;
    bool has_shared;
    moe_tensor_info sh_gate;    /* [I_s, H] */
    moe_tensor_info sh_up;      /* [I_s, H] */
    moe_tensor_info sh_down;    /* [H, I_s] */
    moe_tensor_info sh_gate_w;  /* [1, H], router dtype */
    moe_tensor_info router_bias;/* [E] (gpt-oss router.bias) */
    moe_tensor_info sel_bias;   /* [E] (DeepSeek-V3 e_score_correction_bias) */
    moe_tensor_info out_bias;   /* [H] (JetMoE mlp.bias) */
    moe_tensor_info out_norm;   /* [H] (A.X-K1 post_mlp_layernorm.weight) */
    const void **gate_bias;     /* [E] pointers into gate_up_proj_bias [E, 2I] */
    const void **up_bias;
    const void **down_bias;     /* [E] pointers into down_proj_bias [E, H] */
    moe_dtype expert_bias_dtype;
    int64_t gate_up_bias_stride;/* elements between a gate (or up) bias and the next: 2 when
                                   interleaved with the other, 1 when in halves */
    int64_t e_lo, e_hi;         /* the experts resolved: [e_lo, e_hi); the others' pointers stay
                                   NULL (a parallel plan's rank reads only its own experts) */
    moe_ckq_layer *ckq;         /* compressed-tensors experts' scales / zero points, or NULL */
} moe_ck_layer;

void moe_ck_layer_free(moe_ck_layer *lt);

/* true for the dtypes weights, routers and biases may have: F32, BF16, F16. */
bool moe_ck_is_float_dtype(moe_dtype dt);

/* MOE_ESHAPE unless `info` (from file `path`) has shape `want` [ndim]; `label` spells it in
 * config terms ("[I, H]"). */
moe_status moe_ck_check_shape(const moe_ck_index *ix, const char *path, const moe_tensor_info *info,
                              const char *label, int ndim, const int64_t *want);

/* Look up an expert or shared-expert weight `name`, check its dtype (the first one seen sets
 * lt's weight dtype; every other must agree) and its shape `want` [ndim]. */
moe_status moe_ck_get_weight(const moe_ck_index *ix, moe_ck_layer *lt, const char *name, const char *label, int ndim,
                             const int64_t *want, moe_tensor_info *info);

/* MOE_DTYPE_COUNT as moe_ck_get_checked's dtype: any float dtype (F32, BF16, F16). */
#define MOE_CK_ANY_FLOAT MOE_DTYPE_COUNT

/* Look up tensor `name` (*path: its file) and check its dtype, `dtype` or any float dtype
 * for MOE_CK_ANY_FLOAT ("dtype not accepted for <what> (expected ..., found ...)", `what` its
 * role: "the router", "a bias", ...) and, unless label is NULL, its shape `want` [ndim]. */
moe_status moe_ck_get_checked(const moe_ck_index *ix, const char *name, const char *what, moe_dtype dtype,
                              const char *label, int ndim, const int64_t *want, moe_tensor_info *info,
                              const char **path);

/* An FP8 block checkpoint's weight `name` (F8_E4M3 [N, K], N x K = `want`) and its
 * `name`_scale_inv (F32 [ceil(N/bn), ceil(K/bk)], a multiplier): *codes and *scale point into
 * the mapped file. bn = bk = 0: per-tensor FP8, the scale is `name`_scale_inv or `name`_scale
 * (F32 [] or [1], a multiplier either way; both present is MOE_EFORMAT). `label` is "[I, H]", "[H, I]" or the shared expert's "[I_s, H]", "[H, I_s]". */
moe_status moe_ck_get_fp8_weight(const moe_ck_index *ix, int64_t bn, int64_t bk, const char *name, const char *label,
                                 const int64_t *want, const void **codes, const void **scale);

#endif
