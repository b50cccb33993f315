/* The routed experts of one MoE layer, under its block prefix P, in the layouts the family's
 * row names (docs/checkpoints.md is the format reference):
 *  - per expert: P experts.<e>.<proj>.weight, proj = the row's gate, up, down names
 *    (gate_proj / up_proj / down_proj; Mixtral w1 / w3 / w2), what save_pretrained writes by
 *    default for every family but gpt-oss, Llama-4 and Granite; in float, in FP8 block
 *    checkpoints (weight F8_E4M3 [out, in] + weight_scale_inv F32 [ceil(out/bn),
 *    ceil(in/bk)], which MULTIPLIES: w = q * s), or compressed-tensors (src/io/ckpt_ct.c);
 *  - stacked output-major: P gate_up [E, 2I, H] (gate rows first) and P down [E, H, I]: the
 *    transformers >= 5 in-memory names experts.gate_up_proj / experts.down_proj (no
 *    ".weight"), Granite's input_linear.weight / output_linear.weight;
 *  - flat (DBRX): P experts.mlp.w1 / v1 [E I, H] (expert e's gate / up rows at e I ..) and
 *    P experts.mlp.w2 [E I, H] (expert e's [I, H] block input-major: down read with strides);
 *  - stacked input-major: P experts.gate_up_proj [E, H, 2I] and experts.down_proj [E, I, H],
 *    gate = the first I columns (Llama-4) or the even columns (gpt-oss, with the biases
 *    experts.gate_up_proj_bias [E, 2I], interleaved too, and experts.down_proj_bias [E, H]);
 *  - MXFP4 (gpt-oss as released): the input-major weights as *_blocks U8 [E, N, K/32, 16]
 *    and *_scales U8 [E, N, K/32] (E8M0), row n of gate_up = column n of the bf16 tensor.
 * Which one a layer is in follows from the row and the tensors present:
 *   MXFP4        quantization_config mxfp4, and the layer has *_blocks (or lacks the bf16
 *                gate_up: a modules_to_not_convert layer has it);
 *   input-major  the row has one, unless the row's per-expert layout is quantized_only, the
 *                checkpoint is fp8 / compressed-tensors and the layer lacks gate_up
 *                (Llama-4 quantized per expert by llm-compressor or moe quantize);
 *   stacked      the first of the row's output-major layouts whose gate_up is present;
 *   per expert   otherwise, when the row has it; else the last output-major layout.
 * FP8 is read in the per-expert layout only. Every layout gives pointers into the mapped
 * files (strides for the input-major ones): nothing is copied before moe_weights_create packs
 * it, except MXFP4's gate/up rows (moe_ck_mxfp4_split_gate_up). */
#include "core/mem.h"
#include "io/layouts.h"
#include "io/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The layouts of layouts.c's header. */
typedef enum ck_layout {
    CK_LAYOUT_PER_EXPERT,
    CK_LAYOUT_STACKED,
    CK_LAYOUT_INPUT_MAJOR,
    CK_LAYOUT_MXFP4
} ck_layout;

/* P + tail into out [MOE_CK_NAME_LEN]. */
static void tensor_name(char *out, const char *prefix, const char *tail)
{
    snprintf(out, MOE_CK_NAME_LEN, "%s%s", prefix, tail);
}

/* Stacked output-major experts: gate_up [E, 2I, H] (gate rows first), down [E, H, I]. */
static moe_status stacked_experts(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt,
                                  const char *gu_name, const char *dn_name, bool interleaved, const char *up_name,
                                  bool flat)
{
    const int64_t E = c->desc.num_experts, H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    moe_tensor_info gu, dn;
    if (up_name && flat) {
        /* DBRX: gate w1 [E I, H] and up v1 [E I, H], expert e's rows e I .. (e + 1) I (output-major
         * [I, H]); down w2 [E I, H] whose block e is [I, H] input-major (y = h @ w2_e), so
         * down_e [H, I] element (h, i) is at i H + h: strides out 1, in H (no copy) */
        moe_tensor_info up;
        const int64_t shape[2] = {E * I, H};
        moe_status st;
        if ((st = moe_ck_get_weight(ix, lt, gu_name, "[E I, H]", 2, shape, &gu)) != MOE_OK ||
            (st = moe_ck_get_weight(ix, lt, up_name, "[E I, H]", 2, shape, &up)) != MOE_OK ||
            (st = moe_ck_get_weight(ix, lt, dn_name, "[E I, H] (per expert [I, H] input-major)", 2, shape, &dn)) !=
                MOE_OK)
            return st;
        const size_t es = moe_dtype_size(lt->weight_dtype);
        for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
            lt->gate[e] = (const uint8_t *)gu.data + (size_t)e * (size_t)(I * H) * es;
            lt->up[e] = (const uint8_t *)up.data + (size_t)e * (size_t)(I * H) * es;
            lt->down[e] = (const uint8_t *)dn.data + (size_t)e * (size_t)(I * H) * es;
        }
        lt->dn_so = 1;
        lt->dn_si = H;
        return MOE_OK;
    }
    if (up_name) {
        /* gate [E, I, H] and up [E, I, H] stacked apart (Step-3.7), down [E, H, I] */
        moe_tensor_info up;
        const int64_t g_shape[3] = {E, I, H};
        const int64_t d_shape[3] = {E, H, I};
        moe_status st;
        if ((st = moe_ck_get_weight(ix, lt, gu_name, "[E, I, H]", 3, g_shape, &gu)) != MOE_OK ||
            (st = moe_ck_get_weight(ix, lt, up_name, "[E, I, H]", 3, g_shape, &up)) != MOE_OK ||
            (st = moe_ck_get_weight(ix, lt, dn_name, "[E, H, I]", 3, d_shape, &dn)) != MOE_OK)
            return st;
        const size_t es = moe_dtype_size(lt->weight_dtype);
        for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
            lt->gate[e] = (const uint8_t *)gu.data + (size_t)e * (size_t)(I * H) * es;
            lt->up[e] = (const uint8_t *)up.data + (size_t)e * (size_t)(I * H) * es;
            lt->down[e] = (const uint8_t *)dn.data + (size_t)e * (size_t)(H * I) * es;
        }
        return MOE_OK;
    }
    const int64_t gu_shape[3] = {E, 2 * I, H};
    const int64_t dn_shape[3] = {E, H, I};
    moe_status st;
    if ((st = moe_ck_get_weight(ix, lt, gu_name, "[E, 2I, H]", 3, gu_shape, &gu)) != MOE_OK ||
        (st = moe_ck_get_weight(ix, lt, dn_name, "[E, H, I]", 3, dn_shape, &dn)) != MOE_OK)
        return st;
    const size_t es = moe_dtype_size(lt->weight_dtype);
    const uint8_t *gu_base = gu.data; /* [E, 2I, H] gate rows then up rows per expert, or
                                         (interleaved) gate row i at 2i, up row i at 2i + 1 */
    const uint8_t *dn_base = dn.data; /* [E, H, I] */
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->gate[e] = gu_base + (size_t)e * (size_t)(2 * I * H) * es;
        lt->up[e] = (const uint8_t *)lt->gate[e] + (size_t)(interleaved ? H : I * H) * es;
        lt->down[e] = dn_base + (size_t)e * (size_t)(H * I) * es;
    }
    if (interleaved) { /* row i of gate (and of up) is 2H elements after row i - 1 */
        lt->gu_so = 2 * H;
        lt->gu_si = 1;
    }
    return MOE_OK;
}

/* The row's expert biases (gpt-oss, bf16 and MXFP4 checkpoints alike): gate_up bias [E, 2I],
 * split like gate_up's columns (interleaved: gate = even entries; else gate = the first I),
 * down bias [E, H]. */
static moe_status expert_biases(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt, const char *prefix)
{
    const int64_t E = c->desc.num_experts, H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    const bool interleaved = c->row->input_major.interleaved;
    char name[MOE_CK_NAME_LEN];
    moe_status st;
    moe_tensor_info gb, db;
    const char *path = NULL;
    const int64_t gb_shape[2] = {E, 2 * I}, db_shape[2] = {E, H};
    tensor_name(name, prefix, c->row->input_major.gate_up_bias);
    if ((st = moe_ck_get_checked(ix, name, "a bias", MOE_CK_ANY_FLOAT, "[E, 2I]", 2, gb_shape, &gb, &path)) != MOE_OK)
        return st;
    tensor_name(name, prefix, c->row->input_major.down_bias);
    if ((st = moe_ck_get(ix, name, &db, &path)) != MOE_OK)
        return st;
    if (db.dtype != gb.dtype)
        return moe_set_error(ix->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype must match gate_up_proj_bias (expected %s, found %s)", path, name,
                             moe_dtype_name(gb.dtype), moe_dtype_name(db.dtype));
    if ((st = moe_ck_check_shape(ix, path, &db, "[E, H]", 2, db_shape)) != MOE_OK)
        return st;
    lt->gate_bias = calloc((size_t)E, sizeof *lt->gate_bias); /* [E] */
    lt->up_bias = calloc((size_t)E, sizeof *lt->up_bias);     /* [E] */
    lt->down_bias = calloc((size_t)E, sizeof *lt->down_bias); /* [E] */
    if (!lt->gate_bias || !lt->up_bias || !lt->down_bias)
        return moe_set_error(ix->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
    const size_t bs = moe_dtype_size(gb.dtype);
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->gate_bias[e] = (const uint8_t *)gb.data + (size_t)(e * 2 * I) * bs;
        lt->up_bias[e] = (const uint8_t *)lt->gate_bias[e] + (size_t)(interleaved ? 1 : I) * bs;
        lt->down_bias[e] = (const uint8_t *)db.data + (size_t)(e * H) * bs;
    }
    lt->expert_bias_dtype = gb.dtype;
    lt->gate_up_bias_stride = interleaved ? 2 : 1;
    return MOE_OK;
}

/* Stacked input-major experts: gate_up [E, H, 2I], down [E, I, H]; gate = the first I columns
 * (halves) or the even columns (interleaved); then the row's expert biases, if it has them. */
static moe_status input_major_experts(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt,
                                      const char *prefix)
{
    const int64_t E = c->desc.num_experts, H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    const bool interleaved = c->row->input_major.interleaved;
    char name[MOE_CK_NAME_LEN];
    moe_tensor_info gu, dn;
    const int64_t gu_shape[3] = {E, H, 2 * I};
    const int64_t dn_shape[3] = {E, I, H};
    moe_status st;
    tensor_name(name, prefix, c->row->input_major.gate_up);
    if ((st = moe_ck_get_weight(ix, lt, name, "[E, H, 2I]", 3, gu_shape, &gu)) != MOE_OK)
        return st;
    tensor_name(name, prefix, c->row->input_major.down);
    if ((st = moe_ck_get_weight(ix, lt, name, "[E, I, H]", 3, dn_shape, &dn)) != MOE_OK)
        return st;
    const size_t es = moe_dtype_size(lt->weight_dtype);
    const uint8_t *gu_base = gu.data; /* [E, H, 2I] */
    const uint8_t *dn_base = dn.data; /* [E, I, H] */
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->gate[e] = gu_base + (size_t)e * (size_t)(H * 2 * I) * es;
        lt->up[e] = (const uint8_t *)lt->gate[e] + (size_t)(interleaved ? 1 : I) * es;
        lt->down[e] = dn_base + (size_t)e * (size_t)(I * H) * es;
    }
    lt->gu_so = interleaved ? 2 : 1;
    lt->gu_si = 2 * I;
    lt->dn_so = 1;
    lt->dn_si = H;
    if (!c->row->input_major.gate_up_bias)
        return MOE_OK;
    return expert_biases(ix, c, lt, prefix);
}

/* An MXFP4 tensor `name` (U8, shape `want` [ndim], spelled `label` in config terms): look it
 * up, check it, and point *data at it. */
static moe_status get_mxfp4_tensor(const moe_ck_index *ix, const char *name, const char *label, int ndim,
                                   const int64_t *want, const uint8_t **data)
{
    const char *path = NULL;
    moe_tensor_info info;
    moe_status st = moe_ck_get_checked(ix, name,
                                       ndim == 4 ? "MXFP4 blocks (two e2m1 codes per byte)" : "MXFP4 scales (E8M0 exponents)",
                                       MOE_DTYPE_U8, label, ndim, want, &info, &path);
    if (st == MOE_OK)
        *data = info.data;
    return st;
}

/* MXFP4 experts (transformers' integrations/mxfp4.py, the layout of gpt-oss's released
 * checkpoints), per layer prefix P:
 *   P gate_up_blocks [E, 2I, H/32, 16] U8, P gate_up_scales [E, 2I, H/32] U8
 *   P down_blocks    [E, H, I/32, 16]  U8, P down_scales    [E, H, I/32]  U8
 * Per expert the blocks are the output-major codes [N, K/2] bytes (row n = output feature n;
 * byte b of group g holds input k = 32 g + 2 b in its low nibble and k + 1 in its high one)
 * and the scales [N, K/32] E8M0 exponents, w = e2m1(code) * 2^(scale - 127): exactly
 * moe_quant.h's MXFP4 GROUP 32 source format. transformers' dequantization writes row n of the
 * blocks into column n of the bf16 gate_up_proj [E, H, 2I], so gate_up's rows interleave
 * gate (even rows) and up (odd rows) as the bf16 columns do. down is used in place; gate and
 * up are split into row-major copies when the weights are loaded (moe_ck_mxfp4_split_gate_up). */
static moe_status mxfp4_experts(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt, const char *prefix)
{
    const int64_t E = c->desc.num_experts, H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    char name[MOE_CK_NAME_LEN];
    moe_status st;
    tensor_name(name, prefix, c->row->mxfp4.gate_up_blocks);
    if (H % 32 != 0 || I % 32 != 0)
        return moe_set_error(ix->ctx, MOE_EFORMAT,
                             "%s: tensor '%s': MXFP4 experts need hidden_size (%" PRId64 ") and intermediate_size (%" PRId64
                             ") to be multiples of 32, the MXFP4 group along the input dimension",
                             ix->dir, name, H, I);
    const int64_t gu_blocks_shape[4] = {E, 2 * I, H / 32, 16};
    const int64_t gu_scales_shape[3] = {E, 2 * I, H / 32};
    const int64_t dn_blocks_shape[4] = {E, H, I / 32, 16};
    const int64_t dn_scales_shape[3] = {E, H, I / 32};
    const uint8_t *dn_blocks = NULL, *dn_scales = NULL; /* [E, H, I/32, 16], [E, H, I/32] */
    if ((st = get_mxfp4_tensor(ix, name, "[E, 2I, H/32, 16]", 4, gu_blocks_shape, &lt->gu_blocks)) != MOE_OK)
        return st;
    tensor_name(name, prefix, c->row->mxfp4.gate_up_scales);
    if ((st = get_mxfp4_tensor(ix, name, "[E, 2I, H/32]", 3, gu_scales_shape, &lt->gu_scales)) != MOE_OK)
        return st;
    tensor_name(name, prefix, c->row->mxfp4.down_blocks);
    if ((st = get_mxfp4_tensor(ix, name, "[E, H, I/32, 16]", 4, dn_blocks_shape, &dn_blocks)) != MOE_OK)
        return st;
    tensor_name(name, prefix, c->row->mxfp4.down_scales);
    if ((st = get_mxfp4_tensor(ix, name, "[E, H, I/32]", 3, dn_scales_shape, &dn_scales)) != MOE_OK)
        return st;
    lt->mxfp4 = true;
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->down[e] = dn_blocks + (size_t)e * (size_t)(H * (I / 2));        /* [H, I/2] bytes */
        lt->down_scale[e] = dn_scales + (size_t)e * (size_t)(H * (I / 32)); /* [H, I/32] */
    }
    if (!c->row->input_major.gate_up_bias)
        return MOE_OK;
    return expert_biases(ix, c, lt, prefix);
}

/* E8M0 scale byte 255 is NaN (OCP MX): the rows using it compute NaN. Loaded as it is (the
 * output follows the maths), with one WARNING per tensor naming it and the count; only the
 * local experts' scales are read. */
static void mxfp4_warn_nan_scales(const moe_ck_index *ix, const moe_ck_config *c, const moe_ck_layer *lt,
                                  const char *prefix)
{
    const int64_t H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    const size_t gu_n = (size_t)(2 * I * (H / 32)), dn_n = (size_t)(H * (I / 32)); /* per expert */
    int64_t gu_nan = 0, dn_nan = 0;
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        const uint8_t *g = lt->gu_scales + (size_t)e * gu_n;  /* [2I, H/32] */
        const uint8_t *d = lt->down_scale[e];                /* [H, I/32] */
        for (size_t i = 0; i < gu_n; i++)
            gu_nan += g[i] == 255;
        for (size_t i = 0; d && i < dn_n; i++)
            dn_nan += d[i] == 255;
    }
    const int64_t n_local = lt->e_hi - lt->e_lo;
    if (gu_nan)
        moe_log(ix->ctx, MOE_LOG_WARN,
                "%s: tensor '%s%s': %" PRId64 " of %" PRId64 " E8M0 scales are 255 (NaN): "
                "loaded as they are, so the rows using them compute NaN",
                ix->dir, prefix, c->row->mxfp4.gate_up_scales, gu_nan, n_local * (int64_t)gu_n);
    if (dn_nan)
        moe_log(ix->ctx, MOE_LOG_WARN,
                "%s: tensor '%s%s': %" PRId64 " of %" PRId64 " E8M0 scales are 255 (NaN): "
                "loaded as they are, so the rows using them compute NaN",
                ix->dir, prefix, c->row->mxfp4.down_scales, dn_nan, n_local * (int64_t)dn_n);
}

moe_status moe_ck_mxfp4_split_gate_up(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt,
                                      int64_t layer)
{
    const int64_t H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    const int64_t n = lt->e_hi - lt->e_lo;
    if (n <= 0)
        return MOE_OK;
    const size_t row_b = (size_t)(H / 2), row_s = (size_t)(H / 32); /* bytes per row: codes, scales */
    const size_t per_expert = 2 * (size_t)I * (row_b + row_s);
    const size_t total = (size_t)n * per_expert;
    char what[160];
    snprintf(what, sizeof what, "layer %" PRId64 ": splitting gate_up_proj_blocks / _scales into gate and up", layer);
    moe_status mst = moe_mem_check(ix->ctx, total, what);
    if (mst != MOE_OK)
        return mst;
    lt->gu_split = malloc(total); /* n x (gate [I, H/2], up [I, H/2], gate [I, H/32], up [I, H/32]) */
    if (!lt->gu_split)
        return moe_set_error(ix->ctx, MOE_ENOMEM,
                             "%s: layer %" PRId64 ": out of memory for the de-interleaved MXFP4 gate/up rows (%zu bytes)",
                             ix->dir, layer, total);
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        uint8_t *gc = lt->gu_split + (size_t)(e - lt->e_lo) * per_expert; /* gate codes [I, H/2] */
        uint8_t *uc = gc + (size_t)I * row_b;                            /* up codes [I, H/2] */
        uint8_t *gs = uc + (size_t)I * row_b;                            /* gate scales [I, H/32] */
        uint8_t *us = gs + (size_t)I * row_s;                            /* up scales [I, H/32] */
        const uint8_t *b = lt->gu_blocks + (size_t)e * 2 * (size_t)I * row_b; /* [2I, H/2] */
        const uint8_t *sc = lt->gu_scales + (size_t)e * 2 * (size_t)I * row_s; /* [2I, H/32] */
        for (int64_t j = 0; j < I; j++) {
            memcpy(gc + (size_t)j * row_b, b + (size_t)(2 * j) * row_b, row_b);
            memcpy(uc + (size_t)j * row_b, b + (size_t)(2 * j + 1) * row_b, row_b);
            memcpy(gs + (size_t)j * row_s, sc + (size_t)(2 * j) * row_s, row_s);
            memcpy(us + (size_t)j * row_s, sc + (size_t)(2 * j + 1) * row_s, row_s);
        }
        lt->gate[e] = gc;
        lt->up[e] = uc;
        lt->gate_scale[e] = gs;
        lt->up_scale[e] = us;
    }
    moe_log(ix->ctx, MOE_LOG_INFO,
            "%s: layer %" PRId64 ": MXFP4 gate_up_proj interleaves gate (even) and up (odd) rows; copied %" PRId64
            " experts' rows apart for packing: %zu bytes (%.2f MiB), freed once packed",
            ix->dir, layer, n, total, (double)total / (1024.0 * 1024.0));
    return MOE_OK;
}

/* Per-expert experts P experts.<e>.<proj>.weight: FP8 (weight + weight_scale_inv),
 * compressed-tensors (src/io/ckpt_ct.c; a layer it left out keeps float weights), or float. */
static moe_status per_expert_experts(const moe_ck_index *ix, const moe_ck_config *c, moe_ck_layer *lt,
                                     const char *prefix, int describe)
{
    const int64_t E = c->desc.num_experts, H = c->desc.hidden_size, I = c->desc.moe_intermediate_size;
    const char *const *proj = c->row->per_expert.proj; /* gate, up, down */
    const int64_t in_shape[2] = {I, H};  /* gate and up: [I, H] */
    const int64_t out_shape[2] = {H, I}; /* down: [H, I] */
    const int64_t *shape[3] = {in_shape, in_shape, out_shape};
    const char *const label[3] = {"[I, H]", "[I, H]", "[H, I]"};
    const void **w[3] = {lt->gate, lt->up, lt->down};
    const void **s[3] = {lt->gate_scale, lt->up_scale, lt->down_scale};
    char name[MOE_CK_NAME_LEN];
    moe_status st;
    const int j0 = proj[0] ? 0 : 1; /* no gate tensor: non-gated experts (lt->gate stays NULL) */
    const int64_t off = c->set ? c->set->expert_offset * E : 0; /* an expert set's numbering (ERNIE-4.5-VL's
                                                                  vision experts: E..2E-1) */
    for (int64_t e = lt->e_lo; c->fp8 && e < lt->e_hi; e++)
        for (int j = j0; j < 3; j++) {
            snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e + off, proj[j]);
            if ((st = moe_ck_get_fp8_weight(ix, c->fp8_bn, c->fp8_bk, name, label[j], shape[j], &w[j][e], &s[j][e])) !=
                MOE_OK)
                return st;
        }
    if (c->ct) {
        const moe_ckq_lookup lk = moe_ck_lookup(ix);
        if ((st = moe_ckq_layer_load(ix->ctx, c->ct, &lk, prefix, proj, lt->e_lo, lt->e_hi, E, I, H, describe, w,
                                     &lt->ckq)) != MOE_OK)
            return st;
        if (lt->ckq && moe_ckq_layer_f32(lt->ckq)) { /* GPTQ act-order: exact f32 experts */
            lt->have_weight_dtype = true;
            lt->weight_dtype = MOE_DTYPE_F32;
        }
    }
    for (int64_t e = lt->e_lo; !c->fp8 && !lt->ckq && e < lt->e_hi; e++)
        for (int j = j0; j < 3; j++) {
            moe_tensor_info t;
            snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e + off, proj[j]);
            if ((st = moe_ck_get_weight(ix, lt, name, label[j], 2, shape[j], &t)) != MOE_OK)
                return st;
            w[j][e] = t.data;
        }
    return MOE_OK;
}

moe_status moe_ck_experts_resolve(const moe_ck_index *ix, const moe_ck_config *c, int64_t layer, const char *prefix,
                                  int describe, moe_ck_layer *lt)
{
    const moe_fam_row *row = c->row;
    const int64_t E = c->desc.num_experts;
    lt->gate = calloc((size_t)E, sizeof *lt->gate); /* [E] */
    lt->up = calloc((size_t)E, sizeof *lt->up);     /* [E] */
    lt->down = calloc((size_t)E, sizeof *lt->down); /* [E] */
    if (!lt->gate || !lt->up || !lt->down)
        return moe_set_error(ix->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
    if (c->fp8 || c->mxfp4) {
        lt->gate_scale = calloc((size_t)E, sizeof *lt->gate_scale); /* [E] */
        lt->up_scale = calloc((size_t)E, sizeof *lt->up_scale);     /* [E] */
        lt->down_scale = calloc((size_t)E, sizeof *lt->down_scale); /* [E] */
        if (!lt->gate_scale || !lt->up_scale || !lt->down_scale)
            return moe_set_error(ix->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
    }

    /* Which layout (the header comment says how it is chosen). */
    char name[MOE_CK_NAME_LEN];
    bool has_blocks = false;
    if (row->mxfp4.gate_up_blocks) {
        tensor_name(name, prefix, row->mxfp4.gate_up_blocks);
        has_blocks = moe_ck_has(ix, name);
    }
    if (has_blocks && !c->mxfp4) {
        const moe_safetensors *f = moe_ck_file_of(ix, name);
        return moe_set_error(ix->ctx, MOE_EFORMAT,
                             "%s: tensor '%s': MXFP4 experts, but config.json has no quantization_config "
                             "{quant_method: mxfp4} (transformers would not read them either)",
                             f ? moe_st_path(f) : ix->dir, name);
    }
    bool im_present = false;
    if (row->input_major.gate_up) {
        tensor_name(name, prefix, row->input_major.gate_up);
        im_present = moe_ck_has(ix, name);
    }
    const bool quantized_per_expert = row->per_expert.quantized_only && (c->fp8 || c->ct) && !im_present;
    ck_layout layout = CK_LAYOUT_PER_EXPERT;
    const moe_fam_stacked *stacked = NULL;
    if (c->mxfp4 && (has_blocks || !im_present)) {
        layout = CK_LAYOUT_MXFP4;
    } else if (row->input_major.gate_up && !quantized_per_expert) {
        layout = CK_LAYOUT_INPUT_MAJOR;
    } else {
        for (int i = 0; !quantized_per_expert && !stacked && i < MOE_FAM_MAX_STACKED && row->stacked[i].gate_up; i++) {
            tensor_name(name, prefix, row->stacked[i].gate_up);
            if (moe_ck_has(ix, name))
                stacked = &row->stacked[i];
        }
        if (!stacked && !row->per_expert.proj[1]) {
            /* no per-expert layout to fall back to: the last output-major one, whose missing
             * tensor is then reported */
            for (int i = 0; i < MOE_FAM_MAX_STACKED && row->stacked[i].gate_up; i++)
                stacked = &row->stacked[i];
        }
        if (stacked)
            layout = CK_LAYOUT_STACKED;
    }
    if (c->fp8 && layout != CK_LAYOUT_PER_EXPERT)
        return moe_set_error(ix->ctx, MOE_EUNSUPPORTED,
                             "%s: layer %" PRId64 ": FP8 block checkpoints (quantization_config quant_method fp8) are "
                             "read in the per-expert layout only (%sexperts.<e>.<proj>.weight + weight_scale_inv); "
                             "%s's stacked expert tensors are not supported",
                             ix->dir, layer, prefix, moe_family_name(row->family));

    moe_status st = MOE_OK;
    switch (layout) {
    case CK_LAYOUT_MXFP4:
        if ((st = mxfp4_experts(ix, c, lt, prefix)) == MOE_OK && !describe)
            mxfp4_warn_nan_scales(ix, c, lt, prefix);
        break;
    case CK_LAYOUT_INPUT_MAJOR: st = input_major_experts(ix, c, lt, prefix); break;
    case CK_LAYOUT_STACKED: {
        char dn_name[MOE_CK_NAME_LEN], up_name[MOE_CK_NAME_LEN];
        tensor_name(name, prefix, stacked->gate_up);
        tensor_name(dn_name, prefix, stacked->down);
        if (stacked->up)
            tensor_name(up_name, prefix, stacked->up);
        st = stacked_experts(ix, c, lt, name, dn_name, stacked->interleaved, stacked->up ? up_name : NULL,
                             stacked->flat);
        break;
    }
    case CK_LAYOUT_PER_EXPERT: st = per_expert_experts(ix, c, lt, prefix, describe); break;
    }
    return st;
}
