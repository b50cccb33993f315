/* The shared expert of one MoE layer, named by the family's row: P<module>.<proj>.weight
 * (gate_proj, up_proj, down_proj: [I_s, H], [I_s, H], [H, I_s]) and, when the row gates it,
 * P<gate>.weight [1, H] (out += sigmoid(w_sg . x) * shared(x)). Stored in float, it loads in
 * place. Quantized, it is dequantized to f32 at load and runs as an f32 shared expert
 * (weight_dtype F32, 4 bytes per weight resident, logged with the byte count):
 *  - FP8 block checkpoints (DeepSeek-V3's FP8 releases quantize it too): the same weight +
 *    weight_scale_inv pair as the routed experts, w = q * s;
 *  - compressed-tensors (llm-compressor quantizes it unless `ignore` lists it): which way it
 *    is stored is read from the tensors and checked against config.json's targets and ignore
 *    (moe_ckq_shared_check); w = (v - z) * s or v * s.
 * Both are one f32 multiply (moe_quant_dequant_source), within f32 reassociation of what the
 * weight-only kernels would compute (docs/numerics.md section 5). */
#include "core/mem.h"
#include "io/shared.h"
#include "quant/format.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>


/* lt->sh_deq [3, I_s * H] f32 for the dequantized projections (none when describing: the
 * tensors are only validated). */
static moe_status alloc_dequantized(const moe_ck_index *ix, moe_ck_layer *lt, size_t n1, int describe,
                                    const char *what)
{
    if (describe)
        return MOE_OK;
    char w[160];
    snprintf(w, sizeof w, "dequantizing the %s shared expert to f32", what);
    moe_status st = moe_mem_check(ix->ctx, 3 * (uint64_t)n1 * sizeof(float), w);
    if (st != MOE_OK)
        return st;
    if (!(lt->sh_deq = malloc(3 * n1 * sizeof(float))))
        return moe_set_error(ix->ctx, MOE_ENOMEM, "out of memory dequantizing the %s shared expert (%zu bytes)", what,
                             3 * n1 * sizeof(float));
    return MOE_OK;
}

/* Projection j's f32 matrix w (into lt->sh_deq, or NULL when describing) [N, K]. */
static void set_dequantized(moe_ck_layer *lt, int j, int64_t N, int64_t K, float *w)
{
    moe_tensor_info *dst[3] = {&lt->sh_gate, &lt->sh_up, &lt->sh_down};
    *dst[j] = (moe_tensor_info){.name = NULL, .dtype = MOE_DTYPE_F32, .ndim = 2, .shape = {N, K}, .data = w,
                                .nbytes = (size_t)(N * K) * sizeof(float)};
    lt->have_weight_dtype = true;
    lt->weight_dtype = MOE_DTYPE_F32;
}

/* A compressed-tensors, GPTQ or AWQ shared expert, base[j] = P<module>.<proj j>. */
static moe_status shared_ct(const moe_ck_index *ix, const moe_ck_config *c, const char *prefix,
                            const char *const base[3], int describe, moe_ck_layer *lt)
{
    const int64_t H = c->desc.hidden_size, Is = c->desc.shared_expert_intermediate_size;
    const int64_t rows[3] = {Is, Is, H}, cols[3] = {H, H, Is}; /* [N, K] per projection */
    const size_t n1 = (size_t)(Is * H); /* elements per matrix */
    const moe_ckq_lookup lk = moe_ck_lookup(ix);
    moe_status st = alloc_dequantized(ix, lt, n1, describe, moe_ckq_method(c->ct));
    if (st != MOE_OK)
        return st;
    size_t code_bytes = 0;
    for (int j = 0; j < 3; j++) {
        float *w = lt->sh_deq ? lt->sh_deq + (size_t)j * n1 : NULL; /* [N, K] f32 */
        size_t cb = 0;
        if ((st = moe_ckq_dequant_linear(ix->ctx, c->ct, &lk, base[j], rows[j], cols[j], describe, w, &cb)) != MOE_OK)
            return st;
        code_bytes += cb;
        set_dequantized(lt, j, rows[j], cols[j], w);
    }
    const moe_quant_config *cq = moe_ckq_quant(c->ct);
    if (lt->sh_deq)
        moe_log(ix->ctx, cq->act == MOE_QACT_NONE ? MOE_LOG_INFO : MOE_LOG_WARN,
                "%s%s: %s %s shared expert dequantized to f32 ((v - z) * s, one f32 "
                "multiply): %zu bytes resident instead of %zu of codes%s",
                prefix, c->row->shared.module, moe_ckq_method(c->ct), moe_quant_name(cq), 3 * n1 * sizeof(float), code_bytes,
                cq->act == MOE_QACT_NONE     ? ""
                : cq->act == MOE_QACT_STATIC ? "; it runs with f32 activations (its static FP8 input_scale is "
                                               "read and checked, not applied: the checkpoint's static activation "
                                               "quantization applies to the routed experts only)"
                                             : "; it runs with f32 activations (the checkpoint's dynamic int8 "
                                               "activation quantization applies to the routed experts only)");
    return MOE_OK;
}

/* An FP8 block shared expert, base[j] = P<module>.<proj j>. */
static moe_status shared_fp8(const moe_ck_index *ix, const moe_ck_config *c, const char *prefix,
                             const char *const base[3], int describe, moe_ck_layer *lt)
{
    const int64_t H = c->desc.hidden_size, Is = c->desc.shared_expert_intermediate_size;
    const int64_t shape[3][2] = {{Is, H}, {Is, H}, {H, Is}}; /* [N, K] per projection */
    const char *const label[3] = {"[I_s, H]", "[I_s, H]", "[H, I_s]"};
    const moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3, .scale = c->fp8_bn ? MOE_QSCALE_BLOCK : MOE_QSCALE_TENSOR,
                            .block_n = c->fp8_bn, .block_k = c->fp8_bk};
    const size_t n1 = (size_t)(Is * H); /* elements per matrix */
    moe_status st = alloc_dequantized(ix, lt, n1, describe, "FP8");
    if (st != MOE_OK)
        return st;
    for (int j = 0; j < 3; j++) {
        const void *codes = NULL, *scale = NULL;
        char name[MOE_CK_NAME_LEN];
        snprintf(name, sizeof name, "%s.weight", base[j]);
        if ((st = moe_ck_get_fp8_weight(ix, c->fp8_bn, c->fp8_bk, name, label[j], shape[j], &codes, &scale)) != MOE_OK)
            return st;
        float *w = lt->sh_deq ? lt->sh_deq + (size_t)j * n1 : NULL; /* [N, K] f32 */
        if (w)
            moe_quant_dequant_source(&qw, codes, scale, NULL, shape[j][0], shape[j][1], w);
        set_dequantized(lt, j, shape[j][0], shape[j][1], w);
    }
    if (lt->sh_deq)
        moe_log(ix->ctx, MOE_LOG_INFO,
                "%s%s: FP8 shared expert dequantized to f32 (w = q * s exactly): %zu bytes resident instead of "
                "%zu of e4m3 codes",
                prefix, c->row->shared.module, 3 * n1 * sizeof(float), 3 * n1);
    return MOE_OK;
}

/* The shared expert gate P<gate>.weight [1, H] in the router's dtype; a quantized one (a
 * compressed-tensors checkpoint that did not ignore it) is refused. */
static moe_status shared_gate(const moe_ck_index *ix, const moe_ck_config *c, const char *prefix, moe_ck_layer *lt)
{
    const int64_t gw_shape[2] = {1, c->desc.hidden_size};
    char name[MOE_CK_NAME_LEN];
    const char *path = NULL;
    snprintf(name, sizeof name, "%s%s.weight_packed", prefix, c->row->shared.gate);
    const bool gate_packed = moe_ck_has(ix, name);
    snprintf(name, sizeof name, "%s%s.weight", prefix, c->row->shared.gate);
    if (c->ct && (gate_packed || (moe_ck_has(ix, name) && moe_ck_get(ix, name, &lt->sh_gate_w, &path) == MOE_OK &&
                                  lt->sh_gate_w.dtype == MOE_DTYPE_I8)))
        return moe_set_error(ix->ctx, MOE_EUNSUPPORTED,
                             "%s: tensor '%s%s': the shared expert gate [1, H] is stored quantized; libmoe "
                             "runs it in the router's dtype: quantize with it in ignore (llm-compressor's MoE "
                             "recipes list \"re:.*shared_expert_gate$\")",
                             ix->dir, name, gate_packed ? "_packed" : "");
    moe_status st = moe_ck_get(ix, name, &lt->sh_gate_w, &path);
    if (st != MOE_OK)
        return st;
    if (lt->sh_gate_w.dtype != lt->router.dtype)
        return moe_set_error(ix->ctx, MOE_EDTYPE, "%s: tensor '%s': dtype must match the router's (expected %s, found %s)",
                             path, name, moe_dtype_name(lt->router.dtype), moe_dtype_name(lt->sh_gate_w.dtype));
    return moe_ck_check_shape(ix, path, &lt->sh_gate_w, "[1, H]", 2, gw_shape);
}

/* A fused shared MLP (the row's shared.fused_gate_up / fused_down, under prefix `sp`): gate_up
 * [2 I_s, H] read as the views gate = rows [0, I_s), up = rows [I_s, 2 I_s); down [H, I_s].
 * Float weights only. */
static moe_status shared_fused(const moe_ck_index *ix, const moe_ck_config *c, const char *sp, moe_ck_layer *lt)
{
    const moe_fam_row *row = c->row;
    const int64_t H = c->desc.hidden_size, Is = c->desc.shared_expert_intermediate_size;
    const int64_t gu_shape[2] = {2 * Is, H}, down_shape[2] = {H, Is};
    const char *const part[2] = {row->shared.fused_gate_up, row->shared.fused_down};
    const int64_t *shape[2] = {gu_shape, down_shape};
    const char *const label[2] = {"[2 I_s, H]", "[H, I_s]"};
    moe_tensor_info t[2];
    char name[MOE_CK_NAME_LEN];
    const char *path = NULL;
    for (int j = 0; j < 2; j++) {
        snprintf(name, sizeof name, "%s%s.%s.weight", sp, row->shared.module, part[j]);
        moe_status st = moe_ck_get(ix, name, &t[j], &path);
        if (st != MOE_OK)
            return st;
        if (!moe_ck_is_float_dtype(t[j].dtype))
            return moe_set_error(ix->ctx, MOE_EUNSUPPORTED,
                                 "%s: tensor '%s' is %s: libmoe reads the fused shared MLP (%s.%s / %s) in F32, BF16 "
                                 "or F16 only",
                                 path, name, moe_dtype_name(t[j].dtype), row->shared.module, part[0], part[1]);
        if ((st = moe_ck_get_weight(ix, lt, name, label[j], 2, shape[j], &t[j])) != MOE_OK)
            return st;
    }
    const size_t half = t[0].nbytes / 2; /* bytes of one [I_s, H] half */
    lt->sh_gate = t[0];
    lt->sh_gate.shape[0] = Is;
    lt->sh_gate.nbytes = half;
    lt->sh_up = lt->sh_gate;
    lt->sh_up.data = (const char *)t[0].data + half;
    lt->sh_down = t[1];
    return MOE_OK;
}

moe_status moe_ck_shared_resolve(const moe_ck_index *ix, const moe_ck_config *c, int64_t layer, const char *prefix,
                                 int describe, moe_ck_layer *lt)
{
    const int64_t H = c->desc.hidden_size, Is = c->desc.shared_expert_intermediate_size;
    const char *sh = c->row->shared.module;
    char sp_buf[MOE_CK_PREFIX_LEN]; /* the shared MLP's own prefix, when the row gives one */
    if (c->row->shared.prefix) {
        if (!moe_fam_pattern(c->row->shared.prefix, layer, sp_buf, sizeof sp_buf))
            return moe_set_error(ix->ctx, MOE_EINVAL, "layer %" PRId64 ": the shared MLP's prefix does not fit", layer);
        prefix = sp_buf;
    }
    if (c->row->shared.fused_gate_up) {
        lt->has_shared = true;
        moe_status st = shared_fused(ix, c, prefix, lt);
        if (st == MOE_OK && c->desc.shared_expert_gated)
            st = shared_gate(ix, c, prefix, lt);
        return st;
    }
    const int64_t in_shape[2] = {Is, H};
    const int64_t out_shape[2] = {H, Is};
    const int64_t *shape[3] = {in_shape, in_shape, out_shape};
    const char *const label[3] = {"[I_s, H]", "[I_s, H]", "[H, I_s]"};
    moe_tensor_info *dst[3] = {&lt->sh_gate, &lt->sh_up, &lt->sh_down};
    char name[MOE_CK_NAME_LEN];
    const char *path = NULL;
    moe_status st = MOE_OK;
    /* the projections' names: gate_proj, up_proj, down_proj, or the row's saved names (HY-V4's
     * linear_gate; Mistral-Large-4's w1 / w3 / w2) */
    const char *const shared_proj[3] = {c->row->shared.gate_proj ? c->row->shared.gate_proj : "gate_proj",
                                        c->row->shared.up_proj ? c->row->shared.up_proj : "up_proj",
                                        c->row->shared.down_proj ? c->row->shared.down_proj : "down_proj"};
    lt->has_shared = true;
    int n_fp8 = 0;
    for (int j = 0; c->fp8 && j < 3; j++) {
        moe_tensor_info t;
        snprintf(name, sizeof name, "%s%s.%s.weight", prefix, sh, shared_proj[j]);
        if ((st = moe_ck_get(ix, name, &t, &path)) != MOE_OK)
            return st;
        n_fp8 += t.dtype == MOE_DTYPE_F8_E4M3;
    }
    /* compressed-tensors: the tensors decide, checked against config.json */
    int ct_q = 0;
    const moe_ckq_lookup lk = moe_ck_lookup(ix);
    char sbase[3][MOE_CK_NAME_LEN];
    const char *const sb[3] = {sbase[0], sbase[1], sbase[2]};
    for (int j = 0; j < 3; j++)
        snprintf(sbase[j], sizeof sbase[j], "%s%s.%s", prefix, sh, shared_proj[j]);
    if (c->ct && (st = moe_ckq_shared_check(ix->ctx, c->ct, &lk, ix->dir, sb, &ct_q)) != MOE_OK)
        return st;
    if (ct_q) {
        st = shared_ct(ix, c, prefix, sb, describe, lt);
    } else if (n_fp8 == 3) {
        st = shared_fp8(ix, c, prefix, sb, describe, lt);
    } else if (n_fp8 > 0) {
        snprintf(name, sizeof name, "%s%s.%s.weight", prefix, sh, shared_proj[0]);
        return moe_set_error(ix->ctx, MOE_EDTYPE,
                             "%s: shared expert '%s': %d of its 3 projections are F8_E4M3: all three or none", ix->dir,
                             name, n_fp8);
    } else {
        /* a non-gated shared expert (Nemotron-H's NemotronHMLP: up_proj, down_proj) has no gate
         * tensor; lt->sh_gate stays empty */
        const moe_activation sa = c->desc.has_shared_activation ? c->desc.shared_activation : c->desc.activation;
        for (int j = moe_activation_gated(sa) ? 0 : 1; j < 3 && st == MOE_OK; j++) {
            snprintf(name, sizeof name, "%s%s.%s.weight", prefix, sh, shared_proj[j]);
            st = moe_ck_get_weight(ix, lt, name, label[j], 2, shape[j], dst[j]);
        }
    }
    if (st != MOE_OK)
        return st;
    if (c->desc.shared_expert_gated)
        return shared_gate(ix, c, prefix, lt);
    return MOE_OK;
}
