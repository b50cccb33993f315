/* The GPTQ / AWQ reader: int4 (and GPTQ int8) linears of checkpoints that AutoGPTQ /
 * GPTQModel (quant_method "gptq") and AutoAWQ (quant_method "awq", version "gemm") write,
 * converted once at load into libmoe's source layout (include/moe_quant.h "Quantized experts").
 *
 * Formats (facts from the published descriptions: AutoGPTQ's / GPTQModel's QuantLinear pack(),
 * AutoAWQ's WQLinear_GEMM.from_linear, vLLM's gptq / awq / moe_wna16 loaders), for a linear of
 * K input and N output features, group size g (g = -1: one group over K), Gc = ceil(K / g):
 *   GPTQ  qweight I32 [K * b / 32, N]: 32 / b codes along K per word, code j of a word (row
 *           k = word_row * 32 / b + j) at bit b * j; qzeros I32 [Gc, N * b / 32], packed the
 *           same way along N; scales F16 [Gc, N]; g_idx I32 [K] (the group of each input row;
 *           k / g unless act-order, desc_act). w = (q - z) * s[g_idx[k]]. checkpoint_format
 *           "gptq" (v1, the default) stores z - 1 in qzeros (so a stored 15 means z = 16),
 *           "gptq_v2" stores z. sym: vLLM reads z = 2^(b-1) (uint4b8 / uint8b128) whatever
 *           qzeros hold; libmoe does too.
 *   AWQ   qweight I32 [K, N / 8]: 8 codes along N per word, in the interleaved order
 *           [0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds column 8 c + order[i]; column 8 c + j is
 *           nibble rev[j], rev = [0, 4, 1, 5, 2, 6, 3, 7]); qzeros I32 [Gc, N / 8], the same
 *           interleave; scales F16 [Gc, N]; always asymmetric: w = (q - z) * s[k / g].
 * libmoe's layout: INT4 codes [N, K/2] (low nibble = even k), unsigned with zero points u8
 * [N, Gl] or signed (nibble ^ 8, sym) without; GROUP scales f32 [N, Gl], Gl = ceil(K / L) with
 * L the libmoe group (128 / 64 / 32 dividing g: the checkpoint's scale and zero point
 * repeated, exactly the same weights); CHANNEL [N] for sym g = -1. f16 scales convert to f32
 * exactly, and (v - z) * s is then exact in f32 (a 5-bit integer times an 11-bit significand).
 * Act-order (a g_idx that is not k / g): the groups are then not contiguous along K, and
 * regrouping them permutes the input features per expert, which the routed kernels do not take
 * (vLLM's Marlin MoE permutes the activations inside its kernel); such a layer loads as the
 * exact f32 dequantization of its experts instead (docs/checkpoints.md: 8x the int4 bytes).
 */
#include "io/ckpt_gptq.h"
#include "core/file.h"
#include "io/safetensors.h"
#include "quant/convert.h"
#include "quant/format.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool jnull(const json_t *v)
{
    return !v || json_is_null(v);
}

static const char *jtext(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_boolean(v))
        return json_is_true(v) ? "true" : "false";
    return moe_io_json_kind(v);
}

/* A boolean field (absent: dflt). */
static moe_status get_bool(moe_ctx *ctx, const char *cp, const char *qpre, const json_t *qc, const char *key,
                           int dflt, int *out)
{
    const json_t *v = json_object_get(qc, key);
    if (jnull(v)) {
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_boolean(v))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%squantization_config.%s' must be true or false, found %s",
                             cp, qpre, key, moe_io_json_found(v));
    *out = json_is_true(v);
    return MOE_OK;
}

moe_status moe_gptq_parse(moe_ctx *ctx, const char *cp, const char *qpre, const json_t *qc, moe_gptq_scheme *s,
                          moe_qweight *qw)
{
    memset(s, 0, sizeof *s);
    memset(qw, 0, sizeof *qw);
    const char *m = json_string_value(json_object_get(qc, "quant_method"));
    s->awq = m && strcmp(m, "awq") == 0;
    const char *what = s->awq ? "AWQ" : "GPTQ";
    const json_t *b = json_object_get(qc, s->awq && !json_object_get(qc, "bits") ? "w_bit" : "bits");
    if (!json_is_integer(b))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%squantization_config.%s' must be an integer, found %s",
                             cp, qpre, s->awq && !json_object_get(qc, "bits") ? "w_bit" : "bits", moe_io_json_found(b));
    const json_int_t bits = json_integer_value(b);
    if (bits != 4 && !(bits == 8 && !s->awq))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.bits' = %lld: %s %lld-bit checkpoints are not loaded; "
                             "libmoe reads %s (nearest: a 4-bit %s checkpoint, or bf16 converted with moe quantize)",
                             cp, qpre, (long long)bits, what, (long long)bits,
                             s->awq ? "AWQ int4" : "GPTQ int4 and symmetric int8", what);
    s->bits = (int)bits;
    const json_t *g = json_object_get(qc, s->awq && !json_object_get(qc, "group_size") ? "q_group_size" : "group_size");
    if (!json_is_integer(g) || (json_integer_value(g) < 1 && json_integer_value(g) != -1))
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: field '%squantization_config.group_size' must be a positive integer or -1, found %s",
                             cp, qpre, moe_io_json_found(g));
    s->group_size = (int64_t)json_integer_value(g);
    moe_status st;
    if (s->awq) {
        const json_t *ver = json_object_get(qc, "version");
        if (!jnull(ver) && !json_is_string(ver))
            return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%squantization_config.version' must be a string "
                                 "(\"gemm\"), found %s", cp, qpre, moe_io_json_found(ver));
        if (!jnull(ver) && strcasecmp(json_string_value(ver), "gemm") != 0)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.version' = %s: AutoAWQ's %s layout is not loaded "
                                 "(its words pack codes in another order); libmoe reads version \"gemm\" (nearest: "
                                 "re-export the model as AWQ gemm)",
                                 cp, qpre, jtext(ver), jtext(ver));
        int zp = 1;
        if ((st = get_bool(ctx, cp, qpre, qc, "zero_point", 1, &zp)) != MOE_OK)
            return st;
        if (!zp)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.zero_point' = false: symmetric AWQ is not loaded; "
                                 "libmoe reads AWQ with zero points (AutoAWQ's default) and symmetric GPTQ",
                                 cp, qpre);
    } else {
        const json_t *fmt = json_object_get(qc, "checkpoint_format");
        if (jnull(fmt) || (json_is_string(fmt) && strcasecmp(json_string_value(fmt), "gptq") == 0))
            s->v1 = 1;
        else if (!json_is_string(fmt))
            return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%squantization_config.checkpoint_format' must be a "
                                 "string (\"gptq\" or \"gptq_v2\"), found %s", cp, qpre, moe_io_json_found(fmt));
        else if (strcasecmp(json_string_value(fmt), "gptq_v2") != 0)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.checkpoint_format' = %s: the %s layout (a kernel's "
                                 "repacked tiles) is not loaded; libmoe reads \"gptq\" and \"gptq_v2\" (nearest: the "
                                 "model's plain GPTQ export)",
                                 cp, qpre, jtext(fmt), jtext(fmt));
        if ((st = get_bool(ctx, cp, qpre, qc, "sym", 1, &s->sym)) != MOE_OK)
            return st;
        int desc_act = 0;
        if ((st = get_bool(ctx, cp, qpre, qc, "desc_act", 0, &desc_act)) != MOE_OK)
            return st;
        s->desc_act = desc_act; /* the g_idx tensors decide the groups; with desc_act each must exist */
        const json_t *dyn = json_object_get(qc, "dynamic");
        if (!jnull(dyn) && !(json_is_object(dyn) && json_object_size(dyn) == 0))
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.dynamic' is set: GPTQModel's per-module overrides "
                                 "are not loaded (libmoe needs one scheme for every routed expert)",
                                 cp, qpre);
        if (s->bits == 8 && !s->sym)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.sym' = false with bits 8: asymmetric int8 is not "
                                 "loaded (libmoe's int8 has no zero points); nearest: symmetric GPTQ int8 or "
                                 "asymmetric GPTQ int4",
                                 cp, qpre);
    }
    const int asym = s->awq || !s->sym;
    qw->dtype = s->bits == 4 ? MOE_QTYPE_INT4 : MOE_QTYPE_I8;
    if (s->group_size == -1 && !asym) {
        qw->scale = MOE_QSCALE_CHANNEL;
    } else {
        int64_t L = 0;
        if (s->group_size == -1)
            L = 128; /* one group over K: its scale / zero repeated per 128 */
        else
            for (int64_t c = 128; c >= 32 && !L; c /= 2)
                if (s->group_size % c == 0)
                    L = c;
        if (!L)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.group_size' = %lld: %s groups that are not a "
                                 "multiple of 32 are not loaded (libmoe's groups are 32, 64 or 128 inputs); nearest: "
                                 "group_size 32, 64, 128 or -1",
                                 cp, qpre, (long long)s->group_size, what);
        qw->scale = MOE_QSCALE_GROUP;
        qw->group_size = L;
        qw->has_zero_point = asym;
    }
    moe_log(ctx, MOE_LOG_INFO,
            "%s: %s checkpoint (%d-bit, group_size %lld, %s%s): routed experts %s, converted once at load", cp, what,
            s->bits, (long long)s->group_size, asym ? "asymmetric" : "symmetric",
            s->awq ? "" : (s->v1 ? ", checkpoint_format gptq (v1)" : ", checkpoint_format gptq_v2"),
            qw->dtype == MOE_QTYPE_INT4 ? (qw->scale == MOE_QSCALE_CHANNEL ? "int4-channel" : "int4 group")
                                         : "int8");
    return MOE_OK;
}

static bool shape2(const moe_tensor_info *t, int64_t a, int64_t b)
{
    return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

static moe_status bad_shape(moe_ctx *ctx, const char *path, const char *name, const moe_tensor_info *t, int64_t a,
                            int64_t b, const char *why)
{
    char got[96];
    return moe_set_error(ctx, MOE_ESHAPE, "%s: tensor '%s': shape %s, expected [%" PRId64 ", %" PRId64 "] (%s)", path,
                         name, moe_io_format_shape(got, sizeof got, t->ndim, t->shape), a, b, why);
}

static moe_status get_i32(moe_ctx *ctx, const moe_ckq_lookup *lk, const char *name, moe_tensor_info *t,
                          const char **path)
{
    moe_status st = lk->get(lk->u, name, t, path);
    if (st == MOE_OK && t->dtype != MOE_DTYPE_I32)
        st = moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected I32 (packed codes)", *path, name,
                           moe_dtype_name(t->dtype));
    return st;
}

static uint32_t word(const void *p, size_t i)
{
    uint32_t w;
    memcpy(&w, (const uint8_t *)p + 4 * i, 4);
    return w;
}

/* Code (k along the packed dimension's word row or column) of a word: GPTQ in order, AWQ
 * through the interleave. */
static unsigned nib(uint32_t w, int bits, int awq, int64_t j)
{
    static const int rev[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    const int pos = awq ? rev[j] : (int)j;
    return (unsigned)(w >> (bits * pos)) & ((1u << bits) - 1u);
}

/* The exact f32 dequantization w [N, K] of a linear (act-order: each input row k's group is
 * g_idx[k], or k / g without g_idx): w = (q - z) * s in f32, z = 2^(b-1) when symmetric. */
static moe_status dequant_f32(moe_ctx *ctx, const moe_gptq_scheme *s, int asym, const moe_tensor_info *tg,
                              const moe_tensor_info *tw, const moe_tensor_info *ts, const moe_tensor_info *tz,
                              const char *base, int64_t N, int64_t K, moe_gptq_alloc alloc, void *u,
                              const void **out)
{
    const int bits = s->bits, per = 32 / bits;
    const int64_t g = s->group_size == -1 ? K : s->group_size;
    const int64_t qc = s->awq ? N / 8 : N;
    float *w = alloc(u, sizeof(float) * (size_t)(N * K)); /* [N, K] f32 */
    if (!w)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", base);
    for (int64_t k = 0; k < K; k++) {
        int64_t gk = k / g;
        if (tg) {
            if (tg->dtype == MOE_DTYPE_I32) {
                int32_t x;
                memcpy(&x, (const uint8_t *)tg->data + 4 * k, 4);
                gk = x;
            } else
                memcpy(&gk, (const uint8_t *)tg->data + 8 * k, 8);
        }
        for (int64_t n = 0; n < N; n++) {
            const unsigned q = s->awq ? nib(word(tw->data, (size_t)(k * qc + n / 8)), 4, 1, n % 8)
                                      : nib(word(tw->data, (size_t)((k / per) * qc + n)), bits, 0, k % per);
            int z = 1 << (bits - 1);
            if (asym) {
                const int zper = s->awq ? 8 : per;
                z = (int)nib(word(tz->data, (size_t)(gk * (N / zper) + n / zper)), bits, s->awq, n % zper);
                if (s->v1) {
                    if (z == 15)
                        return moe_set_error(ctx, MOE_EFORMAT,
                                             "%s.qzeros: group %" PRId64 ", out feature %" PRId64 ": stored 15 in a "
                                             "checkpoint_format \"gptq\" (v1) checkpoint means zero point 16 (v1 "
                                             "stores z - 1), outside libmoe's 0..15",
                                             base, gk, n);
                    z += 1;
                }
            }
            const size_t i = (size_t)(gk * N + n);
            float sc;
            uint16_t h;
            if (ts->dtype == MOE_DTYPE_F32)
                memcpy(&sc, (const uint8_t *)ts->data + 4 * i, 4);
            else {
                memcpy(&h, (const uint8_t *)ts->data + 2 * i, 2);
                sc = ts->dtype == MOE_DTYPE_F16 ? moe_f16_to_f32(h) : moe_bf16_to_f32(h);
            }
            w[n * K + k] = (float)((int)q - z) * sc; /* exact: a 5 (9) bit integer times a f16 / bf16 value */
        }
    }
    *out = w;
    return MOE_OK;
}

moe_status moe_gptq_load_linear(moe_ctx *ctx, const moe_gptq_scheme *s, const moe_qweight *qw,
                                const moe_ckq_lookup *lk, const char *base, int64_t N, int64_t K, int describe,
                                int to_f32, int *act_order, moe_gptq_alloc alloc, void *u, const void **codes,
                                const void **scale, const uint8_t **zero)
{
    char name[320], why[160];
    moe_tensor_info tw, ts, tz, tg;
    const char *path = NULL;
    moe_status st;
    const int bits = s->bits, per = 32 / bits;
    const int64_t g = s->group_size == -1 ? K : s->group_size;
    const int64_t Gc = (K + g - 1) / g; /* the checkpoint's groups */
    const int asym = qw->has_zero_point;
    *codes = NULL;
    *scale = NULL;
    *zero = NULL;
    /* qweight */
    snprintf(name, sizeof name, "%s.qweight", base);
    if ((st = get_i32(ctx, lk, name, &tw, &path)) != MOE_OK)
        return st;
    if (s->awq ? (N % 8 != 0) : (K % per != 0))
        return moe_set_error(ctx, MOE_ESHAPE, "%s: tensor '%s': %s = %" PRId64 " is not a multiple of %d (codes per "
                             "int32 word)", path, name, s->awq ? "out_features" : "in_features", s->awq ? N : K,
                             s->awq ? 8 : per);
    const int64_t qr = s->awq ? K : K / per, qc = s->awq ? N / 8 : N;
    if (!shape2(&tw, qr, qc)) {
        snprintf(why, sizeof why, "%s: [%s, %s], %d-bit codes, %d per int32", s->awq ? "AWQ" : "GPTQ",
                 s->awq ? "in" : "in / per", s->awq ? "out / 8" : "out", bits, per);
        return bad_shape(ctx, path, name, &tw, qr, qc, why);
    }
    if (bits == 4 && K % 2)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: tensor '%s': int4 with an odd input size %" PRId64 " (libmoe packs two codes per byte)",
                             path, name, K);
    /* scales */
    snprintf(name, sizeof name, "%s.scales", base);
    const char *spath = NULL;
    if ((st = lk->get(lk->u, name, &ts, &spath)) != MOE_OK)
        return st;
    if (ts.dtype != MOE_DTYPE_F16 && ts.dtype != MOE_DTYPE_BF16 && ts.dtype != MOE_DTYPE_F32)
        return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected F16 (or BF16, F32)", spath, name,
                             moe_dtype_name(ts.dtype));
    if (!shape2(&ts, Gc, N))
        return bad_shape(ctx, spath, name, &ts, Gc, N, "[groups, out]");
    /* qzeros: read when asymmetric (required) and checked when present */
    snprintf(name, sizeof name, "%s.qzeros", base);
    const char *zpath = NULL;
    bool have_z = asym || lk->has(lk->u, name);
    if (have_z) {
        if ((st = get_i32(ctx, lk, name, &tz, &zpath)) != MOE_OK)
            return st;
        const int zper = s->awq ? 8 : per;
        if (N % zper != 0)
            return moe_set_error(ctx, MOE_ESHAPE, "%s: tensor '%s': out_features %" PRId64 " is not a multiple of %d",
                                 zpath, name, N, zper);
        if (!shape2(&tz, Gc, N / zper)) {
            snprintf(why, sizeof why, "[groups, out / %d], packed along out", zper);
            return bad_shape(ctx, zpath, name, &tz, Gc, N / zper, why);
        }
    }
    /* g_idx (GPTQ): in range, and k / g (else act-order) */
    snprintf(name, sizeof name, "%s.g_idx", base);
    const bool have_g = !s->awq && lk->has(lk->u, name);
    if (!s->awq && s->desc_act && !have_g)
        return moe_set_error(ctx, MOE_ENOTFOUND,
                             "tensor '%s' not found: quantization_config.desc_act is true (act-order), so each "
                             "quantized linear's input rows may use any group and its g_idx is required (without it "
                             "the groups k / group_size would be guessed)",
                             name);
    if (have_g) {
        const char *gpath = NULL;
        if ((st = lk->get(lk->u, name, &tg, &gpath)) != MOE_OK)
            return st;
        if (tg.dtype != MOE_DTYPE_I32 && tg.dtype != MOE_DTYPE_I64)
            return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected I32", gpath, name,
                                 moe_dtype_name(tg.dtype));
        if (tg.ndim != 1 || tg.shape[0] != K) {
            char got[96];
            return moe_set_error(ctx, MOE_ESHAPE, "%s: tensor '%s': shape %s, expected [%" PRId64 "] (in_features)",
                                 gpath, name, moe_io_format_shape(got, sizeof got, tg.ndim, tg.shape), K);
        }
        int64_t first_ao = -1, first_ao_v = 0;
        for (int64_t k = 0; k < K; k++) {
            int64_t v;
            if (tg.dtype == MOE_DTYPE_I32) {
                int32_t x;
                memcpy(&x, (const uint8_t *)tg.data + 4 * k, 4);
                v = x;
            } else
                memcpy(&v, (const uint8_t *)tg.data + 8 * k, 8);
            if (v < 0 || v >= Gc)
                return moe_set_error(ctx, MOE_EFORMAT,
                                     "%s: tensor '%s': entry %" PRId64 " = %" PRId64 " is outside the %" PRId64
                                     " groups [0, %" PRId64 ")",
                                     gpath, name, k, v, Gc, Gc);
            if (v != k / g && first_ao < 0) {
                first_ao = k;
                first_ao_v = v;
            }
        }
        if (first_ao >= 0 && !*act_order) {
            moe_log(ctx, MOE_LOG_INFO,
                    "%s: tensor '%s': act-order (desc_act) groups (entry %" PRId64 " = %" PRId64 ", not %" PRId64
                    " / %" PRId64 "): this layer's experts load as their exact f32 dequantization",
                    gpath, name, first_ao, first_ao_v, first_ao, g);
            *act_order = 1;
        }
    }
    if (describe)
        return MOE_OK;
    /* a NaN, infinite, zero or negative scale is refused, naming its [group, out] entry */
    snprintf(name, sizeof name, "%s.scales", base);
    if ((st = moe_io_check_scales(ctx, spath, name, ts.dtype, ts.data, Gc, N, s->awq ? "AWQ scale" : "GPTQ scale")) !=
        MOE_OK)
        return st;
    if (to_f32)
        return dequant_f32(ctx, s, asym, have_g ? &tg : NULL, &tw, &ts, have_z ? &tz : NULL, base, N, K, alloc, u,
                           codes);
    /* codes */
    const size_t row = bits == 4 ? (size_t)K / 2 : (size_t)K;
    uint8_t *c = alloc(u, (size_t)N * row); /* [N, K/2] int4 or [N, K] int8 */
    if (!c)
        return moe_set_error(ctx, MOE_ENOMEM, "%s.qweight: out of memory", base);
    const uint8_t flip = bits == 8 ? 0x80 : (asym ? 0 : 8); /* signed: q - 2^(b-1) */
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            unsigned v = s->awq ? nib(word(tw.data, (size_t)(k * qc + n / 8)), 4, 1, n % 8)
                                : nib(word(tw.data, (size_t)((k / per) * qc + n)), bits, 0, k % per);
            v ^= flip;
            if (bits == 8)
                c[n * (int64_t)row + k] = (uint8_t)v;
            else if (k % 2 == 0)
                c[n * (int64_t)row + k / 2] = (uint8_t)v;
            else
                c[n * (int64_t)row + k / 2] |= (uint8_t)(v << 4);
        }
    *codes = c;
    /* scales (and zero points) per libmoe group, from the checkpoint group holding it */
    const int64_t L = qw->scale == MOE_QSCALE_GROUP ? qw->group_size : K;
    const int64_t Gl = (K + L - 1) / L;
    float *sc = alloc(u, sizeof(float) * (size_t)(N * Gl)); /* [N, Gl] f32 */
    uint8_t *z = asym ? alloc(u, (size_t)(N * Gl)) : NULL;  /* [N, Gl] u8 0..15 */
    if (!sc || (asym && !z))
        return moe_set_error(ctx, MOE_ENOMEM, "%s.scales: out of memory", base);
    for (int64_t n = 0; n < N; n++)
        for (int64_t l = 0; l < Gl; l++) {
            const int64_t gc = (l * L) / g;
            const size_t i = (size_t)(gc * N + n);
            uint16_t h;
            if (ts.dtype == MOE_DTYPE_F32)
                memcpy(&sc[n * Gl + l], (const uint8_t *)ts.data + 4 * i, 4);
            else {
                memcpy(&h, (const uint8_t *)ts.data + 2 * i, 2);
                sc[n * Gl + l] = ts.dtype == MOE_DTYPE_F16 ? moe_f16_to_f32(h) : moe_bf16_to_f32(h);
            }
            if (!asym)
                continue;
            const int zper = s->awq ? 8 : per;
            unsigned zv = nib(word(tz.data, (size_t)(gc * (N / zper) + n / zper)), bits, s->awq, n % zper);
            if (s->v1) {
                if (zv == 15u)
                    return moe_set_error(ctx, MOE_EFORMAT,
                                         "%s: tensor '%s.qzeros': group %" PRId64 ", out feature %" PRId64
                                         ": stored 15 in a checkpoint_format \"gptq\" (v1) checkpoint means zero "
                                         "point 16 (v1 stores z - 1), outside libmoe's 0..15",
                                         zpath, base, gc, n);
                zv += 1;
            }
            z[n * Gl + l] = (uint8_t)zv;
        }
    *scale = sc;
    *zero = z;
    return MOE_OK;
}
