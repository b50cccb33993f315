/* Quantized checkpoints: the compressed-tensors loader and `moe quantize`'s writer.
 *
 * compressed-tensors (the format llm-compressor writes and vLLM loads; facts from the
 * compressed-tensors 0.20 package source: compressors/pack_quantized/{base,helpers}.py,
 * compressors/naive_quantized/base.py, quantization/quant_args.py,
 * quantization/lifecycle/forward_helpers.py):
 *   config.json quantization_config = {quant_method: "compressed-tensors", format,
 *     quantization_status: "compressed", config_groups: {NAME: {targets, weights,
 *     input_activations, output_activations, format}}, ignore: [...]}
 *   weights (QuantizationArgs): num_bits, type "int" | "float", symmetric, strategy
 *     "tensor" | "channel" | "group" | "block" | "token" | ..., group_size, block_structure,
 *     dynamic, actorder.
 *   Dequantization (_dequantize): w = (q - zp) * scale; q, zp signed in
 *     [-2^(b-1), 2^(b-1) - 1] (int4: -8..7, int8: -128..127).
 *   format "pack-quantized" (int weights of 1..8 bits without float activations):
 *     <module>.weight_packed I32 [N, ceil(K * b / 32)]: element k of a row at bit k * b of the
 *     row's bit string, stored as q + 2^(b-1) (so int4: 8 nibbles per int32, the lowest
 *     nibble the lowest k, value q + 8; int8: 4 bytes per int32, q + 128), rows padded with
 *     raw zero bits; <module>.weight_scale [N, 1] (channel) or [N, K / group_size] (group;
 *     K % group_size == 0 is required by the package); <module>.weight_shape I64 [2] = [N, K];
 *     asymmetric (group or channel) also <module>.weight_zero_point I32
 *     [ceil(N * b / 32), n_groups], packed the same way along N (zp + 2^(b-1)).
 *   format "int-quantized" (int weights with int activations, e.g. W8A8) or
 *     "naive-quantized": <module>.weight I8 [N, K] holding q, <module>.weight_scale [N, 1].
 * libmoe's source layout (moe_quant.h "Quantized experts") is reached with
 *   int4 symmetric:  nibble = stored ^ 8 (two's complement q), [N, K/2] bytes, low nibble k even
 *   int4 zero point: v = stored nibble (q + 8), z = stored zero nibble (zp + 8): w = (v - z) s
 *   int8 packed:     byte = stored ^ 0x80; int-quantized: the I8 bytes as they are.
 * The packed int32 words are little-endian in the file, so byte j of a row holds elements 2j
 * (low nibble) and 2j + 1 for int4, and element j for int8.
 */
#include "io/io_internal.h"
#include "quant/format.h"
#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { CKQ_FMT_PACKED = 1, CKQ_FMT_INT = 2 } ckq_format;

struct moe_ckq {
    ckq_format format;     /* where the codes are: weight_packed or weight */
    int num_bits;          /* 4 or 8 */
    int symmetric;
    moe_quant_config quant;/* w13 = w2 = the weight scheme, act */
    json_t *targets;       /* the config groups' targets (strings), or NULL when a group has none */
    json_t *ignore;        /* quantization_config.ignore (strings), or NULL */
};

struct moe_ckq_layer {
    moe_quant_config quant;
    const void **scale[3];     /* [3][E] f32 scales (into the file, or into owned) */
    const uint8_t **zero[3];   /* [3][E] u8 [N, G] zero points, or NULL */
    void **owned;              /* [n_owned] converted buffers */
    size_t n_owned, cap_owned;
    size_t owned_bytes;
    /* weight_scale values that are NaN, infinite, zero or negative (loaded as they are; warned
     * once) */
    int64_t bad_nan, bad_inf, bad_zero, bad_neg, bad_total;
    int bad_tensors;
    char bad_first[320];       /* the first tensor with one */
};

static const char *jkind(const json_t *v)
{
    if (!v)
        return "absent";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return json_string_value(v);
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "?";
}

static bool jstr_is(const json_t *v, const char *s)
{
    return v && json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

static bool jnull(const json_t *v)
{
    return !v || json_is_null(v);
}

void moe_ckq_free(moe_ckq *q)
{
    if (!q)
        return;
    json_decref(q->targets);
    json_decref(q->ignore);
    free(q);
}

/* MOE_EFORMAT unless `v` is null / absent or an array of strings. */
static moe_status check_str_array(moe_ctx *ctx, const char *cp, const char *field, const json_t *v)
{
    if (jnull(v))
        return MOE_OK;
    bool ok = json_is_array(v);
    for (size_t i = 0; ok && i < json_array_size(v); i++)
        ok = json_is_string(json_array_get(v, i));
    return ok ? MOE_OK
              : moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s' must be a list of strings (module names, \"re:\" "
                              "patterns or class names), found %s", cp, field, jkind(v));
}

/* weights of one config group into q. `f` is the group's field prefix for messages. */
static moe_status parse_weights(moe_ctx *ctx, const char *cp, const char *f, const json_t *w, moe_ckq *q)
{
    if (!w || !json_is_object(w))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights' is %s: libmoe loads weight quantization only",
                             cp, f, jkind(w));
    const json_t *type = json_object_get(w, "type"), *nb = json_object_get(w, "num_bits");
    const json_t *sym = json_object_get(w, "symmetric"), *strat = json_object_get(w, "strategy");
    const json_t *gs = json_object_get(w, "group_size"), *dyn = json_object_get(w, "dynamic");
    const json_t *ao = json_object_get(w, "actorder"), *bs = json_object_get(w, "block_structure");
    if (!jnull(type) && !jstr_is(type, "int"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.type' = %s: only int weights are loaded (float compressed-tensors "
                             "schemes are not)",
                             cp, f, jkind(type));
    if (!json_is_integer(nb))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.num_bits' = %s: only 4 and 8 are loaded", cp,
                             f, jkind(nb));
    if (json_integer_value(nb) != 4 && json_integer_value(nb) != 8)
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.num_bits' = %lld: only 4 and 8 are loaded",
                             cp, f, (long long)json_integer_value(nb));
    q->num_bits = (int)json_integer_value(nb);
    if (!jnull(sym) && !json_is_boolean(sym))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.weights.symmetric' must be true or false", cp, f);
    q->symmetric = jnull(sym) || json_is_true(sym);
    if (!jnull(dyn) && !json_is_false(dyn))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.dynamic' = %s: only static weights are loaded",
                             cp, f, jkind(dyn));
    if (!jnull(bs))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.block_structure' is set: int block scales are "
                             "not loaded", cp, f);
    /* actorder "weight" (alias "static") only changes calibration; "group" needs g_idx */
    if (!jnull(ao) && !jstr_is(ao, "weight") && !jstr_is(ao, "static"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.actorder' = %s: activation reordering with g_idx is not loaded "
                             "(only null or \"weight\")",
                             cp, f, jkind(ao));
    moe_qweight qw = {.dtype = q->num_bits == 4 ? MOE_QTYPE_INT4 : MOE_QTYPE_I8};
    /* strategy: absent is inferred as quant_args does (group_size > 0: group, -1: channel) */
    const char *s = json_is_string(strat) ? json_string_value(strat) : NULL;
    if (!s && jnull(strat))
        s = json_is_integer(gs) ? (json_integer_value(gs) > 0 ? "group" : "channel") : "tensor";
    if (!s)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.weights.strategy' must be a string", cp, f);
    if (strcmp(s, "channel") == 0) {
        qw.scale = MOE_QSCALE_CHANNEL;
    } else if (strcmp(s, "group") == 0) {
        if (!json_is_integer(gs) || json_integer_value(gs) < 1)
            return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.weights.group_size' must be a positive integer for "
                                 "strategy group", cp, f);
        qw.scale = MOE_QSCALE_GROUP;
        qw.group_size = (int64_t)json_integer_value(gs);
        if (q->num_bits == 4 && qw.group_size != 32 && qw.group_size != 64 && qw.group_size != 128)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s.weights.group_size' = %lld: int4 groups of 32, 64 or 128 are loaded",
                                 cp, f, (long long)qw.group_size);
    } else {
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.strategy' = %s: only channel and group are loaded", cp, f, s);
    }
    if (!q->symmetric) {
        if (q->num_bits != 4 || qw.scale != MOE_QSCALE_GROUP)
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s.weights.symmetric' = false: zero points are loaded for int4 group "
                                 "scales only",
                                 cp, f);
        qw.has_zero_point = 1;
    }
    q->quant.w13 = qw;
    q->quant.w2 = qw;
    return MOE_OK;
}

static moe_status parse_acts(moe_ctx *ctx, const char *cp, const char *f, const json_t *g, moe_ckq *q)
{
    const json_t *oa = json_object_get(g, "output_activations");
    if (!jnull(oa))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.output_activations' is set: output quantization is "
                             "not loaded", cp, f);
    const json_t *ia = json_object_get(g, "input_activations");
    q->quant.act = MOE_QACT_NONE;
    if (jnull(ia))
        return MOE_OK;
    if (!json_is_object(ia))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.input_activations' must be an object or null", cp, f);
    const json_t *type = json_object_get(ia, "type"), *nb = json_object_get(ia, "num_bits");
    const json_t *sym = json_object_get(ia, "symmetric"), *strat = json_object_get(ia, "strategy");
    const json_t *dyn = json_object_get(ia, "dynamic");
    if (!jnull(type) && !jstr_is(type, "int"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.input_activations.type' = %s: only int8 activations "
                             "are loaded", cp, f, jkind(type));
    if (!json_is_integer(nb) || json_integer_value(nb) != 8)
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.input_activations.num_bits': only 8 is loaded", cp,
                             f);
    if (!jnull(sym) && !json_is_true(sym))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.input_activations.symmetric' = false: only symmetric "
                             "activations are loaded", cp, f);
    if (!json_is_true(dyn))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.input_activations.dynamic' = %s: static activation scales are not loaded "
                             "(only dynamic per-token int8)",
                             cp, f, jkind(dyn));
    if (!jstr_is(strat, "token"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.input_activations.strategy' = %s: only token (dynamic per-token int8) is "
                             "loaded",
                             cp, f, jkind(strat));
    if (q->num_bits != 8 || q->quant.w13.scale != MOE_QSCALE_CHANNEL)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.input_activations': int8 activations are loaded with int8 channel weights "
                             "only (w8a8)",
                             cp, f);
    q->quant.act = MOE_QACT_TOKEN;
    return MOE_OK;
}

moe_status moe_ckq_parse(moe_ctx *ctx, const char *cp, const char *qpre, const json_t *qc, moe_ckq **out)
{
    *out = NULL;
    if (!jstr_is(json_object_get(qc, "quant_method"), "compressed-tensors"))
        return MOE_OK;
    char f[160];
    const json_t *status = json_object_get(qc, "quantization_status");
    if (!jnull(status) && !jstr_is(status, "compressed"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.quantization_status' = %s: only compressed checkpoints "
                             "are loaded",
                             cp, qpre, jkind(status));
    const json_t *sp = json_object_get(qc, "sparsity_config");
    if (!jnull(sp) && !(json_is_object(sp) && json_object_size(sp) == 0))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%squantization_config.sparsity_config' is set: sparse "
                             "compressed-tensors checkpoints are not loaded", cp, qpre);
    const json_t *msp = json_object_get(qc, "moe_sparsity_config");
    if (!jnull(msp))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%squantization_config.moe_sparsity_config' is set: "
                             "expert sparsity is not loaded", cp, qpre);
    const json_t *groups = json_object_get(qc, "config_groups");
    if (!groups || !json_is_object(groups) || json_object_size(groups) == 0)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%squantization_config.config_groups' must be a non-empty "
                             "object", cp, qpre);
    moe_ckq *q = calloc(1, sizeof *q);
    if (!q)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", cp);
    const char *key;
    json_t *g;
    bool first = true, first_targets = true;
    moe_status st = MOE_OK;
    json_object_foreach((json_t *)groups, key, g) {
        snprintf(f, sizeof f, "%squantization_config.config_groups.%s", qpre, key);
        if (!json_is_object(g)) {
            st = moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s' must be an object", cp, f);
            break;
        }
        moe_ckq one = {0};
        const json_t *fmt = json_object_get(g, "format");
        if (jnull(fmt))
            fmt = json_object_get(qc, "format");
        if (jstr_is(fmt, "pack-quantized")) {
            one.format = CKQ_FMT_PACKED;
        } else if (jstr_is(fmt, "int-quantized") || jstr_is(fmt, "naive-quantized")) {
            one.format = CKQ_FMT_INT;
        } else {
            st = moe_set_error(ctx, MOE_EUNSUPPORTED,
                               "%s: field '%s.format' (or '%squantization_config.format') = %s: libmoe loads "
                               "pack-quantized, int-quantized and naive-quantized",
                               cp, f, qpre, jkind(fmt));
            break;
        }
        const json_t *tg = json_object_get(g, "targets");
        char tf[200];
        snprintf(tf, sizeof tf, "%s.targets", f);
        if ((st = check_str_array(ctx, cp, tf, tg)) != MOE_OK)
            break;
        if ((st = parse_weights(ctx, cp, f, json_object_get(g, "weights"), &one)) != MOE_OK ||
            (st = parse_acts(ctx, cp, f, g, &one)) != MOE_OK)
            break;
        if (one.format == CKQ_FMT_INT && one.num_bits != 8) {
            st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.num_bits' = %d with format int-quantized: "
                               "only 8-bit codes are stored unpacked", cp, f, one.num_bits);
            break;
        }
        if (!first && (one.format != q->format || one.num_bits != q->num_bits || one.symmetric != q->symmetric ||
                       !moe_quant_equal(&one.quant, &q->quant))) {
            st = moe_set_error(ctx, MOE_EUNSUPPORTED,
                               "%s: field '%s': config groups with different schemes are not loaded (libmoe needs one "
                               "scheme for every routed expert)",
                               cp, f);
            break;
        }
        one.targets = q->targets;
        *q = one;
        first = false;
        /* the union of the groups' targets; a group without targets makes it unknown (NULL) */
        if (first_targets) {
            q->targets = json_is_array(tg) ? json_array() : NULL;
            first_targets = false;
        }
        if (q->targets && json_is_array(tg))
            json_array_extend(q->targets, (json_t *)tg);
        else if (q->targets) {
            json_decref(q->targets);
            q->targets = NULL;
        }
    }
    if (st == MOE_OK) {
        snprintf(f, sizeof f, "%squantization_config.ignore", qpre);
        const json_t *ig = json_object_get(qc, "ignore");
        if ((st = check_str_array(ctx, cp, f, ig)) == MOE_OK && json_is_array(ig))
            q->ignore = json_deep_copy(ig);
    }
    if (st != MOE_OK) {
        moe_ckq_free(q);
        return st;
    }
    moe_log(ctx, MOE_LOG_INFO, "%s: compressed-tensors checkpoint: routed experts %s", cp, moe_quant_name(&q->quant));
    *out = q;
    return MOE_OK;
}

/* ---- one layer ---- */

void moe_ckq_layer_free(moe_ckq_layer *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n_owned; i++)
        free(l->owned[i]);
    free(l->owned);
    for (int j = 0; j < 3; j++) {
        free(l->scale[j]);
        free(l->zero[j]);
    }
    free(l);
}

/* malloc'd buffer of `n` bytes owned by l; NULL on out of memory. */
static void *own(moe_ckq_layer *l, size_t n)
{
    if (l->n_owned == l->cap_owned) {
        size_t c = l->cap_owned ? 2 * l->cap_owned : 64;
        void **p = realloc(l->owned, c * sizeof *p);
        if (!p)
            return NULL;
        l->owned = p;
        l->cap_owned = c;
    }
    void *b = malloc(n ? n : 1);
    if (b) {
        l->owned[l->n_owned++] = b;
        l->owned_bytes += n;
    }
    return b;
}

const moe_quant_config *moe_ckq_quant(const moe_ckq *q)
{
    return &q->quant;
}

void moe_ckq_layer_quant(const moe_ckq_layer *l, moe_quant_config *out)
{
    *out = l->quant;
}

void moe_ckq_layer_source(const moe_ckq_layer *l, moe_weight_source *src)
{
    src->gate_scale = l->scale[0];
    src->up_scale = l->scale[1];
    src->down_scale = l->scale[2];
    src->gate_zero = l->zero[0];
    src->up_zero = l->zero[1];
    src->down_zero = l->zero[2];
}

/* Count the NaN, zero and negative values of scale tensor `name` (f32 [n], possibly unaligned)
 * into l: llm-compressor never writes them (a zero scale would make every weight of its group
 * zero, a NaN poisons the whole output row), so they are a corrupt or hand-edited checkpoint;
 * the load goes on and computes what the maths gives, with a WARNING
 * (warn_scales). */
static void scan_scales(moe_ckq_layer *l, const char *name, const void *scale, int64_t n)
{
    int64_t nan = 0, inf = 0, zero = 0, neg = 0;
    const unsigned char *p = scale;
    for (int64_t i = 0; i < n; i++) {
        float s;
        memcpy(&s, p + 4 * i, 4);
        nan += s != s;
        inf += isinf(s) != 0;
        zero += s == 0.0f;
        neg += s < 0.0f;
    }
    l->bad_total += n;
    if (nan + inf + zero + neg == 0)
        return;
    if (l->bad_tensors++ == 0)
        snprintf(l->bad_first, sizeof l->bad_first, "%s", name);
    l->bad_nan += nan;
    l->bad_inf += inf;
    l->bad_zero += zero;
    l->bad_neg += neg;
}

static void warn_scales(moe_ctx *ctx, const moe_ckq_layer *l, const char *what)
{
    if (l->bad_tensors)
        moe_log(ctx, MOE_LOG_WARN,
                "%s: %" PRId64 " NaN, %" PRId64 " infinite, %" PRId64 " zero and %" PRId64
                " negative weight_scale values (of %" PRId64 ") in %d tensor(s), the first '%s': loaded as they "
                "are, so the output follows (v - z) * s (a NaN or infinite scale makes the rows that use it NaN "
                "or infinite, a zero one their weights zero)",
                what, l->bad_nan, l->bad_inf, l->bad_zero, l->bad_neg, l->bad_total, l->bad_tensors, l->bad_first);
}

static bool shape_is(const moe_tensor_info *t, int nd, int64_t a, int64_t b)
{
    return t->ndim == nd && t->shape[0] == a && (nd < 2 || t->shape[1] == b);
}

static moe_status bad_shape(moe_ctx *ctx, const char *path, const char *name, const moe_tensor_info *t,
                            const char *want)
{
    char got[96];
    return moe_set_error(ctx, MOE_ESHAPE, "%s: tensor '%s': shape %s, expected %s", path, name,
                         moe_io_format_shape(got, sizeof got, t->ndim, t->shape), want);
}

/* One expert linear `base` ([N, K]): codes, scales, zero points. */
static moe_status load_linear(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, moe_ckq_layer *l,
                              const char *base, int64_t N, int64_t K, int describe, const void **codes,
                              const void **scale, const uint8_t **zero)
{
    char name[320], want[96];
    moe_tensor_info t;
    const char *path = NULL;
    moe_status st;
    const moe_qweight *qw = &q->quant.w13;
    if (q->format == CKQ_FMT_INT) {
        snprintf(name, sizeof name, "%s.weight", base);
        if ((st = lk->get(lk->u, name, &t, &path)) != MOE_OK)
            return st;
        if (t.dtype != MOE_DTYPE_I8)
            return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected I8 (compressed-tensors "
                                 "int-quantized)", path, name, moe_dtype_name(t.dtype));
        if (!shape_is(&t, 2, N, K)) {
            snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", N, K);
            return bad_shape(ctx, path, name, &t, want);
        }
        *codes = t.data; /* q as int8: libmoe's I8 source as it is */
    } else {
        snprintf(name, sizeof name, "%s.weight_shape", base);
        if ((st = lk->get(lk->u, name, &t, &path)) != MOE_OK)
            return st;
        int64_t ws[2] = {0, 0};
        if (t.dtype == MOE_DTYPE_I64 && shape_is(&t, 1, 2, 0))
            memcpy(ws, t.data, sizeof ws);
        else if (t.dtype == MOE_DTYPE_I32 && shape_is(&t, 1, 2, 0)) {
            int32_t w32[2];
            memcpy(w32, t.data, sizeof w32);
            ws[0] = w32[0];
            ws[1] = w32[1];
        } else {
            char got[96];
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: tensor '%s': %s %s, expected an integer vector I64 (or I32) [2] holding the "
                                 "unpacked [out, in]",
                                 path, name, moe_dtype_name(t.dtype),
                                 moe_io_format_shape(got, sizeof got, t.ndim, t.shape));
        }
        if (ws[0] != N || ws[1] != K)
            return moe_set_error(ctx, MOE_ESHAPE, "%s: tensor '%s' = [%" PRId64 ", %" PRId64 "], expected [%" PRId64
                                 ", %" PRId64 "]", path, name, ws[0], ws[1], N, K);
        snprintf(name, sizeof name, "%s.weight_packed", base);
        if ((st = lk->get(lk->u, name, &t, &path)) != MOE_OK)
            return st;
        const int64_t per = 32 / q->num_bits, words = (K + per - 1) / per;
        if (t.dtype != MOE_DTYPE_I32)
            return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected I32 (pack-quantized)", path,
                                 name, moe_dtype_name(t.dtype));
        if (!shape_is(&t, 2, N, words)) {
            snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "] (%d-bit codes, %" PRId64 " per int32)", N, words,
                     q->num_bits, per);
            return bad_shape(ctx, path, name, &t, want);
        }
        if (q->num_bits == 4 && K % 2)
            return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: tensor '%s': int4 with an odd input size %" PRId64
                                 " (libmoe packs two codes per byte)", path, name, K);
        /* little-endian words: row n's bytes are its codes in k order */
        const size_t row_in = (size_t)words * 4, row_out = q->num_bits == 4 ? (size_t)K / 2 : (size_t)K;
        const uint8_t flip = q->num_bits == 8 ? 0x80 : (q->symmetric ? 0x88 : 0x00);
        uint8_t *c = describe ? NULL : own(l, (size_t)N * row_out); /* [N, K/2] (int4) or [N, K] (int8) */
        if (!c && !describe)
            return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", name);
        const uint8_t *src = t.data;
        for (int64_t n = 0; c && n < N; n++)
            for (size_t b = 0; b < row_out; b++)
                c[(size_t)n * row_out + b] = src[(size_t)n * row_in + b] ^ flip;
        *codes = c;
    }
    /* scales */
    int64_t G = 1;
    if (qw->scale == MOE_QSCALE_GROUP)
        G = (K + qw->group_size - 1) / qw->group_size;
    snprintf(name, sizeof name, "%s.weight_scale", base);
    if ((st = lk->get(lk->u, name, &t, &path)) != MOE_OK)
        return st;
    if (!shape_is(&t, 2, N, G) && !(G == 1 && shape_is(&t, 1, N, 0))) {
        snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", N, G);
        return bad_shape(ctx, path, name, &t, want);
    }
    if (t.dtype == MOE_DTYPE_F32) {
        *scale = t.data;
    } else if ((t.dtype == MOE_DTYPE_BF16 || t.dtype == MOE_DTYPE_F16) && describe) {
        *scale = NULL;
    } else if (t.dtype == MOE_DTYPE_BF16 || t.dtype == MOE_DTYPE_F16) {
        float *s = own(l, sizeof(float) * (size_t)(N * G)); /* [N, G] f32, exact */
        if (!s)
            return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", name);
        const uint8_t *p = t.data;
        for (int64_t i = 0; i < N * G; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            s[i] = t.dtype == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
        }
        *scale = s;
    } else {
        return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected F32, BF16 or F16", path, name,
                             moe_dtype_name(t.dtype));
    }
    if (!describe)
        scan_scales(l, name, *scale, N * G);
    if (!qw->has_zero_point)
        return MOE_OK;
    snprintf(name, sizeof name, "%s.weight_zero_point", base);
    if ((st = lk->get(lk->u, name, &t, &path)) != MOE_OK)
        return st;
    const int64_t zrows = (N + 7) / 8; /* 8 nibbles per int32 along N */
    if (t.dtype != MOE_DTYPE_I32)
        return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected I32 (packed along the output "
                             "dimension)", path, name, moe_dtype_name(t.dtype));
    if (!shape_is(&t, 2, zrows, G)) {
        snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "] (ceil(out / 8), groups)", zrows, G);
        return bad_shape(ctx, path, name, &t, want);
    }
    if (describe)
        return MOE_OK;
    uint8_t *z = own(l, (size_t)(N * G)); /* [N, G] u8 0..15 */
    if (!z)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", name);
    const uint8_t *zp = t.data;
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            uint32_t w;
            memcpy(&w, zp + 4 * (size_t)((n / 8) * G + g), 4);
            z[n * G + g] = (uint8_t)((w >> (4 * (n % 8))) & 15u);
        }
    *zero = z;
    return MOE_OK;
}

moe_status moe_ckq_layer_load(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *prefix,
                              const char *const proj[3], int64_t e_lo, int64_t e_hi, int64_t E, int64_t I, int64_t H,
                              int describe, const void **codes[3], moe_ckq_layer **out)
{
    *out = NULL;
    char base[300], name[320];
    if (e_lo >= e_hi)
        return MOE_OK;
    /* a layer the quantization left out keeps a float `weight` */
    snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight_packed", prefix, e_lo, proj[0]);
    bool quantized = lk->has(lk->u, name);
    if (!quantized && q->format == CKQ_FMT_INT) {
        moe_tensor_info t;
        const char *path;
        snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e_lo, proj[0]);
        quantized = lk->has(lk->u, name) && lk->get(lk->u, name, &t, &path) == MOE_OK && t.dtype == MOE_DTYPE_I8;
    }
    if (!quantized)
        return MOE_OK;
    moe_ckq_layer *l = calloc(1, sizeof *l);
    if (!l)
        return moe_set_error(ctx, MOE_ENOMEM, "out of memory");
    l->quant = q->quant;
    for (int j = 0; j < 3; j++) {
        l->scale[j] = calloc((size_t)E, sizeof *l->scale[j]); /* [E] */
        l->zero[j] = calloc((size_t)E, sizeof *l->zero[j]);   /* [E] */
        if (!l->scale[j] || !l->zero[j]) {
            moe_ckq_layer_free(l);
            return moe_set_error(ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
        }
    }
    moe_status st = MOE_OK;
    for (int64_t e = e_lo; e < e_hi && st == MOE_OK; e++)
        for (int j = 0; j < 3 && st == MOE_OK; j++) {
            snprintf(base, sizeof base, "%sexperts.%" PRId64 ".%s", prefix, e, proj[j]);
            st = load_linear(ctx, q, lk, l, base, j == 2 ? H : I, j == 2 ? I : H, describe, &codes[j][e], &l->scale[j][e],
                             &l->zero[j][e]);
        }
    if (st != MOE_OK) {
        moe_ckq_layer_free(l);
        return st;
    }
    if (!l->quant.w13.has_zero_point)
        for (int j = 0; j < 3; j++) {
            free(l->zero[j]);
            l->zero[j] = NULL;
        }
    char what[320];
    snprintf(what, sizeof what, "%sexperts", prefix);
    warn_scales(ctx, l, what);
    if (l->owned_bytes)
        moe_log(ctx, MOE_LOG_INFO,
                "%sexperts: %zu bytes of compressed-tensors codes / scales converted to libmoe's source layout "
                "(a temporary copy, freed once packed)",
                prefix, l->owned_bytes);
    *out = l;
    return MOE_OK;
}

/* ---- a quantized shared expert ---- */

/* Does module `name` match compressed-tensors target / ignore entry `t` (utils/match.py
 * match_name and _match_class): "re:<pattern>" is Python's re.match (anchored at the start
 * only), evaluated here as a POSIX extended regex "^(<pattern>)"; any other string is an exact
 * module name or a class name, and a shared-expert projection is an nn.Linear, so "Linear"
 * (and "Module", a base class) match it. 1 match, 0 no match, -1 undecidable (a pattern POSIX
 * regcomp refuses, e.g. Python-only syntax). */
static int target_matches(const char *name, const char *t)
{
    if (strncmp(t, "re:", 3) != 0)
        return strcmp(t, name) == 0 || strcmp(t, "Linear") == 0 || strcmp(t, "Module") == 0;
    size_t n = strlen(t + 3) + 4;
    char *pat = malloc(n);
    if (!pat)
        return -1;
    snprintf(pat, n, "^(%s)", t + 3);
    regex_t re;
    int r = -1;
    if (regcomp(&re, pat, REG_EXTENDED | REG_NOSUB) == 0) {
        r = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
    }
    free(pat);
    return r;
}

/* Over a list: 1 when an entry matches (*hit = it), 0 when none does, -1 when none matches
 * but one was undecidable (*hit = it). */
static int list_matches(const json_t *list, const char *name, const char **hit)
{
    int r = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *t = json_string_value(json_array_get(list, i));
        int m = target_matches(name, t);
        if (m == 1) {
            *hit = t;
            return 1;
        }
        if (m < 0 && r == 0) {
            *hit = t;
            r = -1;
        }
    }
    return r;
}

/* Which compressed-tensors tensors of linear `base` are present: bit 0 weight_packed, 1
 * weight_scale, 2 weight_shape, 3 weight_zero_point, 4 an I8 `weight` (int-quantized), 5 a
 * float `weight`. */
static unsigned ct_tensors_present(const moe_ckq_lookup *lk, const char *base)
{
    static const char *const sfx[4] = {"weight_packed", "weight_scale", "weight_shape", "weight_zero_point"};
    char name[320];
    unsigned m = 0;
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "%s.%s", base, sfx[i]);
        m |= lk->has(lk->u, name) ? 1u << i : 0u;
    }
    snprintf(name, sizeof name, "%s.weight", base);
    moe_tensor_info t;
    const char *path;
    if (lk->has(lk->u, name) && lk->get(lk->u, name, &t, &path) == MOE_OK)
        m |= t.dtype == MOE_DTYPE_I8 ? 1u << 4 : 1u << 5;
    return m;
}

moe_status moe_ckq_shared_check(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *dir,
                                const char *const base[3], int *quantized)
{
    *quantized = 0;
    const bool packed = q->format == CKQ_FMT_PACKED;
    /* the tensors a quantized linear of this scheme has, and any of them */
    const unsigned need = packed ? (1u | 2u | 4u | (q->quant.w13.has_zero_point ? 8u : 0u)) : (16u | 2u);
    const unsigned any_q = 1u | 2u | 4u | 8u | 16u;
    static const char *const nm[6] = {"weight_packed", "weight_scale", "weight_shape", "weight_zero_point",
                                      "weight (I8)", "weight (float)"};
    int nq = 0, jq = -1, jf = -1;
    bool jf_float = false; /* base[jf] has a float weight (else no weight tensor at all) */
    for (int j = 0; j < 3; j++) {
        const unsigned m = ct_tensors_present(lk, base[j]);
        if ((m & any_q) && (m & 32u))
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: shared expert linear '%s': both a float '%s.weight' and compressed-tensors "
                                 "tensors (%s%s%s%s): one or the other",
                                 dir, base[j], base[j], m & 1u ? "weight_packed " : "", m & 2u ? "weight_scale " : "",
                                 m & 4u ? "weight_shape " : "", m & 8u ? "weight_zero_point" : "");
        if (!(m & any_q)) {
            jf = j;
            jf_float = (m & 32u) != 0;
            continue;
        }
        nq++;
        jq = j;
        for (int b = 0; b < 5; b++)
            if ((need & (1u << b)) && !(m & (1u << b))) {
                /* the first tensor present names what was found */
                int have = 0;
                while (have < 5 && !(m & (1u << have)))
                    have++;
                return moe_set_error(ctx, MOE_EFORMAT,
                                     "%s: tensor '%s.%s' is missing: shared expert linear '%s' has '%s.%s', so it is "
                                     "stored quantized (compressed-tensors %s: %s), but incompletely",
                                     dir, base[j], b == 4 ? "weight" : nm[b], base[j], base[j],
                                     have == 4 ? "weight" : nm[have], packed ? "pack-quantized" : "int-quantized",
                                     packed ? (q->quant.w13.has_zero_point
                                                   ? "weight_packed, weight_scale, weight_shape, weight_zero_point"
                                                   : "weight_packed, weight_scale, weight_shape")
                                            : "I8 weight, weight_scale");
            }
    }
    if (nq > 0 && nq < 3)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: shared expert: %d of its 3 projections are stored quantized ('%s') and %d not "
                             "('%s' has %s): all three or none",
                             dir, nq, base[jq], 3 - nq, base[jf],
                             jf_float ? "a float weight" : "neither a weight nor weight_packed");
    /* what config.json says: quantized when a config group targets it and `ignore` does not
     * list it (compressed-tensors is_match) */
    const char *thit = NULL, *ihit = NULL;
    const int targeted = q->targets ? list_matches(q->targets, base[0], &thit) : -1;
    const int ignored = q->ignore ? list_matches(q->ignore, base[0], &ihit) : 0;
    if (nq == 3) {
        if (ignored == 1)
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: shared expert linear '%s' is stored quantized, but quantization_config.ignore "
                                 "lists it (entry \"%s\"): the checkpoint contradicts its config.json",
                                 dir, base[0], ihit);
        if (targeted == 0)
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: shared expert linear '%s' is stored quantized, but no "
                                 "quantization_config.config_groups target matches it: the checkpoint contradicts its "
                                 "config.json",
                                 dir, base[0]);
        *quantized = 1;
        return MOE_OK;
    }
    if (targeted == 1 && ignored == 0)
        moe_log(ctx, MOE_LOG_WARN,
                "%s: shared expert linear '%s' is stored as a float weight although config_groups target \"%s\" "
                "matches it and ignore does not list it; loaded as stored (vLLM would expect it quantized)",
                dir, base[0], thit);
    return MOE_OK;
}

moe_status moe_ckq_dequant_linear(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *base,
                                  int64_t N, int64_t K, int describe, float *w, size_t *code_bytes)
{
    moe_ckq_layer *l = calloc(1, sizeof *l); /* owns the converted codes / scales / zero points */
    if (!l)
        return moe_set_error(ctx, MOE_ENOMEM, "out of memory");
    const void *codes = NULL, *scale = NULL;
    const uint8_t *zero = NULL;
    moe_status st = load_linear(ctx, q, lk, l, base, N, K, describe, &codes, &scale, &zero);
    if (st == MOE_OK && w) {
        moe_quant_dequant_source(&q->quant.w13, codes, scale, zero, N, K, w);
        warn_scales(ctx, l, base);
    }
    if (code_bytes)
        *code_bytes = (size_t)(N * K) * (size_t)q->num_bits / 8;
    moe_ckq_layer_free(l);
    return st;
}

/* ==========================================================================================
 * The writer: moe_checkpoint_quantize (`moe quantize`).
 * ======================================================================================== */

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

/* malloc'd "a/b". */
static char *pjoin(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            char *p = pjoin(dir, de->d_name);
            struct stat sb;
            if (p && lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
                rm_tree(p);
            else if (p)
                unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Copy file src to dst (created, 0644). 0 or an errno value. */
static int copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return errno;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        int e = errno;
        close(in);
        return e;
    }
    char buf[1 << 16];
    int err = 0;
    for (;;) {
        ssize_t r = read(in, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (r == 0)
            break;
        for (ssize_t off = 0; off < r;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                err = errno;
                break;
            }
            off += w;
        }
        if (err)
            break;
    }
    if (close(out) != 0 && !err)
        err = errno;
    close(in);
    return err;
}

/* The layer number L of the last "layers.<L>." of name that starts before x. 1 when there is
 * one. */
static int layer_before(const char *name, const char *x, int64_t *layer)
{
    const char *l = NULL;
    for (const char *s = name; (s = strstr(s, "layers.")) && s < x; s++)
        l = s;
    if (!l)
        return 0;
    char *end;
    long long v = strtoll(l + strlen("layers."), &end, 10);
    if (end == l + strlen("layers.") || *end != '.')
        return 0;
    *layer = v;
    return 1;
}

/* A routed expert linear: "<P>experts.<e>.<proj>.weight" with proj one of the per-expert names,
 * and the layer number L from the last "layers.<L>." of P. 1 when `name` is one. */
static int expert_linear(const char *name, int64_t *layer)
{
    static const char *const projs[] = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"};
    const char *x = strstr(name, ".experts.");
    if (!x)
        return 0;
    const char *p = x + strlen(".experts.");
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p++ != '.')
        return 0;
    int hit = 0;
    for (size_t i = 0; i < sizeof projs / sizeof projs[0]; i++) {
        size_t n = strlen(projs[i]);
        if (strncmp(p, projs[i], n) == 0 && strcmp(p + n, ".weight") == 0)
            hit = 1;
    }
    if (!hit)
        return 0;
    return layer_before(name, x, layer);
}

/* A stacked input-major expert tensor "<P>experts.gate_up_proj" (*which 0) or
 * "<P>experts.down_proj" (*which 1) of gpt-oss / Llama-4, and the layer number L from the last
 * "layers.<L>." of P. 1 when `name` is one. */
static int stacked_linear(const char *name, int64_t *layer, int *which)
{
    const char *x = strstr(name, ".experts.");
    if (!x)
        return 0;
    const char *p = x + strlen(".experts.");
    if (strcmp(p, "gate_up_proj") == 0)
        *which = 0;
    else if (strcmp(p, "down_proj") == 0)
        *which = 1;
    else
        return 0;
    return layer_before(name, x, layer);
}

/* The output tensors of one shard under construction. */
typedef struct qw_shard {
    moe_tensor_out *t;   /* [n] */
    size_t n, cap;
    void **bufs;         /* [nb] owned buffers */
    size_t nb, capb;
} qw_shard;

static moe_tensor_out *shard_add(qw_shard *s)
{
    if (s->n == s->cap) {
        size_t c = s->cap ? 2 * s->cap : 256;
        moe_tensor_out *p = realloc(s->t, c * sizeof *p);
        if (!p)
            return NULL;
        s->t = p;
        s->cap = c;
    }
    moe_tensor_out *o = &s->t[s->n++];
    memset(o, 0, sizeof *o);
    return o;
}

/* An owned zeroed buffer of n bytes kept until the shard is written; its name too. */
static void *shard_buf(qw_shard *s, size_t n)
{
    if (s->nb == s->capb) {
        size_t c = s->capb ? 2 * s->capb : 256;
        void **p = realloc(s->bufs, c * sizeof *p);
        if (!p)
            return NULL;
        s->bufs = p;
        s->capb = c;
    }
    void *b = calloc(1, n ? n : 1);
    if (b)
        s->bufs[s->nb++] = b;
    return b;
}

static void shard_clear(qw_shard *s)
{
    for (size_t i = 0; i < s->nb; i++)
        free(s->bufs[i]);
    s->nb = 0;
    s->n = 0;
}

static char *shard_name(qw_shard *s, const char *base, const char *suffix)
{
    size_t n = strlen(base) + strlen(suffix) + 1;
    char *p = shard_buf(s, n);
    if (p)
        snprintf(p, n, "%s%s", base, suffix);
    return p;
}

typedef struct qw_job {
    moe_ctx *ctx;
    const moe_quantize_options *opt;
    moe_quant_config q;
    int ct;                  /* compressed-tensors output (else fp8 block or mxfp4) */
    int mxfp4;               /* gpt-oss MXFP4 output (*_blocks / *_scales) */
    moe_family fam;
    moe_quantize_stats *stats;
    json_t *ignore;          /* non-expert Linear-like modules (2-D weights) */
    json_t *keep;            /* mxfp4: "<P>experts" of the layers left out by --layers */
} qw_job;

static void progress(const qw_job *j, const char *fmt, ...) MOE_PRINTF(2, 3);
static void progress(const qw_job *j, const char *fmt, ...)
{
    if (!j->opt->progress)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->opt->progress(msg, j->opt->progress_user);
}

/* Element i of a F32 / BF16 / F16 tensor, in f32 (exact). */
static float elem_f32(const moe_tensor_info *t, size_t i)
{
    const uint8_t *src = t->data;
    if (t->dtype == MOE_DTYPE_F32) {
        float f;
        memcpy(&f, src + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    return t->dtype == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
}

/* Refuse a non-finite expert weight: int codes cannot hold NaN / Inf (moe_quantize_matrix would
 * turn a NaN into code 0, and an Inf makes its cell's absmax scale Inf, so every weight of that
 * scale cell decodes to NaN), so the output would silently differ from the input. w is f32
 * [N, K] (expert `e` of `name` for stacked tensors, e < 0 otherwise). MOE_EINVAL naming the
 * tensor, the count and the first [n, k]. */
static moe_status check_finite(qw_job *j, const char *path, const char *name, int64_t e, const float *w, int64_t N,
                               int64_t K)
{
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < N * K; i++)
        if (!isfinite(w[i]) && bad++ == 0)
            first = i;
    if (bad == 0)
        return MOE_OK;
    char where[48] = "";
    if (e >= 0)
        snprintf(where, sizeof where, " (expert %" PRId64 ")", e);
    return moe_set_error(j->ctx, MOE_EINVAL,
                         "%s: tensor '%s'%s has %" PRId64 " non-finite value(s) (the first, %g, at [n, k] = [%" PRId64
                         ", %" PRId64 "] of the [%" PRId64 ", %" PRId64 "] = [out, in] matrix): %s cannot represent "
                         "NaN / Inf weights (a NaN would become 0, an Inf would turn its whole scale cell into NaN); "
                         "fix the input checkpoint",
                         path, name, where, bad, (double)w[first], first / K, first % K, N, K, moe_quant_name(&j->q));
}

/* Quantize one expert linear w (f32 [N, K], the weight "<base>.weight", `in_bytes` bytes in
 * the input) into shard s under the names of the job's format. */
static moe_status quantize_f32(qw_job *j, qw_shard *s, const char *path, const char *base, const float *w, int64_t N,
                               int64_t K, size_t in_bytes)
{
    const moe_qweight *qw = &j->q.w13;
    size_t cb, sb, zb;
    if (moe_quantize_matrix_sizes(qw, N, K, &cb, &sb, &zb) != MOE_OK)
        return moe_set_error(j->ctx, MOE_ESHAPE, "%s: tensor '%s.weight' [%" PRId64 ", %" PRId64 "] cannot be quantized "
                             "to %s", path, base, N, K, moe_quant_name(&j->q));
    if (j->ct && qw->scale == MOE_QSCALE_GROUP && K % qw->group_size != 0)
        return moe_set_error(j->ctx, MOE_ESHAPE,
                             "%s: tensor '%s.weight': input size %" PRId64 " is not a multiple of the group size %" PRId64
                             " (compressed-tensors and vLLM need whole groups); use a smaller group",
                             path, base, K, qw->group_size);
    char wname[320];
    snprintf(wname, sizeof wname, "%s.weight", base);
    moe_status fin = check_finite(j, path, wname, -1, w, N, K);
    if (fin != MOE_OK)
        return fin;
    uint8_t *codes = malloc(cb ? cb : 1), *zero = malloc(zb ? zb : 1);
    float *scale = malloc(sb ? sb : 1);
    if (!codes || !zero || !scale) {
        free(codes), free(zero), free(scale);
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s.weight'", path, base);
    }
    moe_status st = moe_quantize_matrix(qw, w, N, K, codes, scale, zero);
    if (st != MOE_OK) {
        free(codes), free(zero), free(scale);
        return moe_set_error(j->ctx, st, "%s: tensor '%s.weight': quantization failed", path, base);
    }
    moe_tensor_out *o;
    st = MOE_ENOMEM;
    int64_t rows = 1, cols = 1; /* the scale grid */
    if (qw->scale == MOE_QSCALE_BLOCK) {
        rows = (N + qw->block_n - 1) / qw->block_n;
        cols = (K + qw->block_k - 1) / qw->block_k;
    } else if (qw->scale == MOE_QSCALE_GROUP) {
        rows = N;
        cols = (K + qw->group_size - 1) / qw->group_size;
    } else {
        rows = N;
    }
    float *sc = shard_buf(s, sb);
    if (!sc)
        goto done;
    memcpy(sc, scale, sb);
    if (!j->ct) {
        /* FP8 block: weight F8_E4M3 [N, K], weight_scale_inv F32 [ceil(N/bn), ceil(K/bk)] */
        uint8_t *c = shard_buf(s, cb);
        const char *wn = shard_name(s, base, ".weight");
        if (!c || !wn || !(o = shard_add(s)))
            goto done;
        memcpy(c, codes, cb);
        *o = (moe_tensor_out){.name = wn, .dtype = MOE_DTYPE_F8_E4M3, .ndim = 2, .shape = {N, K}, .data = c};
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_scale_inv")))
            goto done;
        o->dtype = MOE_DTYPE_F32, o->ndim = 2, o->shape[0] = rows, o->shape[1] = cols, o->data = sc;
        j->stats->output_code_bytes += cb;
    } else if (j->q.act == MOE_QACT_TOKEN) {
        /* int-quantized: weight I8 [N, K] (q), weight_scale F32 [N, 1] */
        uint8_t *c = shard_buf(s, cb);
        const char *wn = shard_name(s, base, ".weight");
        if (!c || !wn || !(o = shard_add(s)))
            goto done;
        memcpy(c, codes, cb);
        *o = (moe_tensor_out){.name = wn, .dtype = MOE_DTYPE_I8, .ndim = 2, .shape = {N, K}, .data = c};
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_scale")))
            goto done;
        o->dtype = MOE_DTYPE_F32, o->ndim = 2, o->shape[0] = N, o->shape[1] = 1, o->data = sc;
        j->stats->output_code_bytes += cb;
    } else {
        /* pack-quantized: weight_packed I32 [N, ceil(K / per)], stored q + 2^(b-1), rows padded
         * with zero bits; weight_scale F32 [N, cols]; weight_shape I64 [2] */
        const int bits = qw->dtype == MOE_QTYPE_INT4 ? 4 : 8;
        const int64_t per = 32 / bits, words = (K + per - 1) / per;
        const size_t row_in = bits == 4 ? (size_t)K / 2 : (size_t)K, row_out = (size_t)words * 4;
        const uint8_t flip = bits == 8 ? 0x80 : (qw->has_zero_point ? 0x00 : 0x88);
        uint8_t *c = shard_buf(s, (size_t)N * row_out); /* [N, words] int32, little-endian */
        if (!c)
            goto done;
        for (int64_t n = 0; n < N; n++)
            for (size_t b = 0; b < row_in; b++)
                c[(size_t)n * row_out + b] = codes[(size_t)n * row_in + b] ^ flip;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_packed")))
            goto done;
        o->dtype = MOE_DTYPE_I32, o->ndim = 2, o->shape[0] = N, o->shape[1] = words, o->data = c;
        j->stats->output_code_bytes += (uint64_t)N * row_out;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_scale")))
            goto done;
        o->dtype = MOE_DTYPE_F32, o->ndim = 2, o->shape[0] = rows, o->shape[1] = cols, o->data = sc;
        int64_t *shape = shard_buf(s, 2 * sizeof(int64_t));
        if (!shape || !(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_shape")))
            goto done;
        shape[0] = N, shape[1] = K;
        o->dtype = MOE_DTYPE_I64, o->ndim = 1, o->shape[0] = 2, o->data = shape;
        j->stats->output_scale_bytes += 2 * sizeof(int64_t);
        if (qw->has_zero_point) {
            /* weight_zero_point I32 [ceil(N/8), cols]: zero nibble z (= zp + 8) of row n at bits
             * 4 (n % 8) of word (n / 8, g) */
            const int64_t zr = (N + 7) / 8;
            uint32_t *zw = shard_buf(s, sizeof(uint32_t) * (size_t)(zr * cols));
            if (!zw || !(o = shard_add(s)) || !(o->name = shard_name(s, base, ".weight_zero_point")))
                goto done;
            for (int64_t n = 0; n < N; n++)
                for (int64_t g = 0; g < cols; g++)
                    zw[(n / 8) * cols + g] |= (uint32_t)(zero[n * cols + g] & 15u) << (4 * (n % 8));
            /* the file is little-endian: store the words byte by byte */
            uint8_t *zb8 = (uint8_t *)zw;
            for (int64_t i = 0; i < zr * cols; i++) {
                uint32_t v = zw[i];
                zb8[4 * i] = (uint8_t)v, zb8[4 * i + 1] = (uint8_t)(v >> 8), zb8[4 * i + 2] = (uint8_t)(v >> 16),
                         zb8[4 * i + 3] = (uint8_t)(v >> 24);
            }
            o->dtype = MOE_DTYPE_I32, o->ndim = 2, o->shape[0] = zr, o->shape[1] = cols, o->data = zw;
            j->stats->output_zero_bytes += sizeof(uint32_t) * (size_t)(zr * cols);
        }
    }
    j->stats->output_scale_bytes += sb;
    j->stats->input_expert_bytes += in_bytes;
    j->stats->expert_tensors++;
    st = MOE_OK;
done:
    free(codes), free(zero), free(scale);
    if (st != MOE_OK)
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory writing tensor '%s.weight'", path, base);
    return MOE_OK;
}

/* Quantize one per-expert linear t ("<base>.weight", [N, K] F32 / BF16 / F16) into shard s. */
static moe_status quantize_linear(qw_job *j, qw_shard *s, const char *path, const moe_tensor_info *t)
{
    const int64_t N = t->shape[0], K = t->shape[1];
    float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] f32: one tensor at a time */
    if (!w)
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s' (%zu bytes in f32)", path, t->name,
                             sizeof(float) * (size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++)
        w[i] = elem_f32(t, (size_t)i);
    char base[300];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - strlen(".weight")), t->name);
    moe_status st = quantize_f32(j, s, path, base, w, N, K, t->nbytes);
    free(w);
    return st;
}

/* Quantize a stacked input-major expert tensor t of layer `layer` (checkpoint.c's header):
 * "<P>experts.gate_up_proj" [E, H, 2I] (which 0; gpt-oss: gate = even columns, Llama-4: gate =
 * the first I) or "<P>experts.down_proj" [E, I, H] (which 1). Expert e's linear is column-major
 * there: output n is column n. Written as
 *  - mxfp4 (gpt-oss, the released openai/gpt-oss layout the MXFP4 loader reads):
 *    "<P>experts.gate_up_proj_blocks" U8 [E, 2I, H/32, 16] + "_scales" U8 [E, 2I, H/32] (row n
 *    = column n of the bf16 tensor, so gate / up stay interleaved as in the input), and
 *    "<P>experts.down_proj_blocks" U8 [E, H, I/32, 16] + "_scales" U8 [E, H, I/32]: per expert
 *    moe_quantize_matrix's MXFP4 codes [N, K/2] (low nibble = even k) and E8M0 exponents;
 *  - otherwise (Llama-4) per expert: "<P>experts.<e>.{gate,up,down}_proj" [N, K] in the job's
 *    format, as llm-compressor saves Llama-4 (one Linear per expert) and vLLM's llama4 loads. */
static moe_status quantize_stacked(qw_job *j, moe_checkpoint *ck, qw_shard *s, const char *path,
                                   const moe_tensor_info *t, int64_t layer, int which)
{
    moe_layer_desc d;
    moe_status st = moe_checkpoint_layer_desc(ck, layer, &d);
    if (st != MOE_OK)
        return st;
    const int64_t E = d.num_experts, H = d.hidden_size, I = d.moe_intermediate_size;
    const int64_t K = which == 0 ? H : I, C = which == 0 ? 2 * I : H; /* t is [E, K, C] */
    if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != K || t->shape[2] != C ||
        (t->dtype != MOE_DTYPE_F32 && t->dtype != MOE_DTYPE_BF16 && t->dtype != MOE_DTYPE_F16))
        return moe_set_error(j->ctx, MOE_ESHAPE,
                             "%s: tensor '%s': expected an F32, BF16 or F16 tensor of shape %s = [%" PRId64 ", %" PRId64
                             ", %" PRId64 "], found %s with %d dimensions",
                             path, t->name, which == 0 ? "[E, H, 2I]" : "[E, I, H]", E, K, C, moe_dtype_name(t->dtype),
                             t->ndim);
    const size_t plen = strlen(t->name) - strlen(which == 0 ? "gate_up_proj" : "down_proj"); /* "<P>experts." */
    char base[300];
    if (j->mxfp4) {
        const int64_t N = C;
        size_t cb, sb, zb;
        if (K % 32 != 0 || moe_quantize_matrix_sizes(&j->q.w13, N, K, &cb, &sb, &zb) != MOE_OK)
            return moe_set_error(j->ctx, MOE_ESHAPE,
                                 "%s: tensor '%s': MXFP4 needs the input size (%s = %" PRId64 ") to be a multiple of 32, "
                                 "the MXFP4 group",
                                 path, t->name, which == 0 ? "hidden_size" : "intermediate_size", K);
        uint8_t *blocks = shard_buf(s, (size_t)E * cb); /* [E, N, K/32, 16] */
        uint8_t *scales = shard_buf(s, (size_t)E * sb); /* [E, N, K/32] E8M0 */
        float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] one expert */
        uint8_t zero_unused = 0;
        if (!blocks || !scales || !w) {
            free(w);
            return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s'", path, t->name);
        }
        for (int64_t e = 0; e < E && st == MOE_OK; e++) {
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    w[n * K + k] = elem_f32(t, (size_t)((e * K + k) * C + n));
            if ((st = check_finite(j, path, t->name, e, w, N, K)) != MOE_OK) {
                free(w);
                return st;
            }
            st = moe_quantize_matrix(&j->q.w13, w, N, K, blocks + (size_t)e * cb, scales + (size_t)e * sb,
                                     &zero_unused);
        }
        free(w);
        if (st != MOE_OK)
            return moe_set_error(j->ctx, st, "%s: tensor '%s': quantization failed", path, t->name);
        snprintf(base, sizeof base, "%s", t->name);
        moe_tensor_out *o;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, "_blocks")))
            return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory", path);
        o->dtype = MOE_DTYPE_U8, o->ndim = 4, o->shape[0] = E, o->shape[1] = N, o->shape[2] = K / 32, o->shape[3] = 16;
        o->data = blocks;
        if (!(o = shard_add(s)) || !(o->name = shard_name(s, base, "_scales")))
            return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory", path);
        o->dtype = MOE_DTYPE_U8, o->ndim = 3, o->shape[0] = E, o->shape[1] = N, o->shape[2] = K / 32;
        o->data = scales;
        j->stats->output_code_bytes += (uint64_t)E * cb;
        j->stats->output_scale_bytes += (uint64_t)E * sb;
        j->stats->input_expert_bytes += t->nbytes;
        j->stats->expert_tensors += E * (which == 0 ? 2 : 1);
        return MOE_OK;
    }
    /* per expert: gate_up gives gate (columns [0, I)) and up ([I, 2I)), down gives down */
    static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
    const int64_t N = which == 0 ? I : H;
    float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] one expert linear */
    if (!w)
        return moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory for tensor '%s'", path, t->name);
    const size_t in_bytes = t->nbytes / (size_t)(E * (which == 0 ? 2 : 1));
    for (int64_t e = 0; e < E && st == MOE_OK; e++)
        for (int m = which == 0 ? 0 : 2; m < (which == 0 ? 2 : 3) && st == MOE_OK; m++) {
            const int64_t c0 = m == 1 ? I : 0; /* the column of output 0 */
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    w[n * K + k] = elem_f32(t, (size_t)((e * K + k) * C + c0 + n));
            snprintf(base, sizeof base, "%.*s%" PRId64 ".%s", (int)plen, t->name, e, names[m]);
            st = quantize_f32(j, s, path, base, w, N, K, in_bytes);
        }
    free(w);
    return st;
}

static bool layer_selected(const moe_quantize_options *o, int64_t layer)
{
    if (!o->layers || o->n_layers == 0)
        return true;
    for (size_t i = 0; i < o->n_layers; i++)
        if (o->layers[i] == layer)
            return true;
    return false;
}

/* Convert shard `in_path` into `out_path`; record its tensor names in weight_map (if not NULL)
 * under `shard`. */
static moe_status convert_shard(qw_job *j, moe_checkpoint *ck, const char *in_path, const char *out_path,
                                const char *shard, json_t *weight_map)
{
    moe_safetensors *f = NULL;
    moe_status st = moe_safetensors_open(j->ctx, in_path, &f);
    if (st != MOE_OK)
        return st;
    qw_shard s = {0};
    size_t nq = 0;
    for (size_t i = 0; i < moe_safetensors_count(f) && st == MOE_OK; i++) {
        if (j->opt->cancel && *j->opt->cancel) {
            st = moe_set_error(j->ctx, MOE_ECANCELED, "%s: interrupted; the partial output is removed", in_path);
            break;
        }
        moe_tensor_info t;
        moe_safetensors_at(f, i, &t);
        int64_t layer = -1;
        const bool ex = expert_linear(t.name, &layer) && layer >= 0 && layer < moe_checkpoint_num_layers(ck) &&
                        moe_checkpoint_is_moe_layer(ck, layer);
        int which = -1;
        const bool stk = !ex && (j->fam == MOE_FAMILY_GPT_OSS || j->fam == MOE_FAMILY_LLAMA4) &&
                         stacked_linear(t.name, &layer, &which) && layer >= 0 &&
                         layer < moe_checkpoint_num_layers(ck) && moe_checkpoint_is_moe_layer(ck, layer);
        if (stk && layer_selected(j->opt, layer)) {
            st = quantize_stacked(j, ck, &s, in_path, &t, layer, which);
            nq++;
            continue;
        }
        if (stk && which == 0) {
            /* a layer left out by --layers keeps its stacked float experts: named in the config
             * as a module not to convert ("<P>experts") */
            const size_t len = strlen(t.name) - strlen(".gate_up_proj");
            json_array_append_new(j->mxfp4 ? j->keep : j->ignore, json_stringn(t.name, len));
        }
        if (ex && layer_selected(j->opt, layer)) {
            if (t.ndim != 2 || (t.dtype != MOE_DTYPE_F32 && t.dtype != MOE_DTYPE_BF16 && t.dtype != MOE_DTYPE_F16)) {
                st = moe_set_error(j->ctx, MOE_EDTYPE, "%s: tensor '%s': expected a 2-D F32, BF16 or F16 expert weight, "
                                   "found %s with %d dimensions", in_path, t.name, moe_dtype_name(t.dtype), t.ndim);
                break;
            }
            st = quantize_linear(j, &s, in_path, &t);
            nq++;
            continue;
        }
        moe_tensor_out *o = shard_add(&s);
        if (!o) {
            st = moe_set_error(j->ctx, MOE_ENOMEM, "%s: out of memory", in_path);
            break;
        }
        o->name = t.name, o->dtype = t.dtype, o->ndim = t.ndim, o->data = t.data;
        memcpy(o->shape, t.shape, sizeof o->shape);
        j->stats->other_bytes += t.nbytes;
        size_t len = strlen(t.name);
        if (t.ndim == 2 && len > 7 && strcmp(t.name + len - 7, ".weight") == 0)
            json_array_append_new(j->ignore, json_stringn(t.name, len - 7));
    }
    if (st == MOE_OK)
        st = moe_safetensors_write(j->ctx, out_path, s.t, s.n);
    for (size_t i = 0; st == MOE_OK && weight_map && i < s.n; i++)
        if (json_object_set_new(weight_map, s.t[i].name, json_string(shard)) != 0)
            st = moe_set_error(j->ctx, MOE_ENOMEM, "out of memory");
    if (st == MOE_OK)
        progress(j, "%s: %zu expert tensors quantized, %zu tensors written", shard, nq, s.n);
    shard_clear(&s);
    free(s.t);
    free(s.bufs);
    moe_safetensors_free(f);
    return st;
}

/* The quantization_config written into config.json. */
static json_t *quant_config_json(const qw_job *j)
{
    const moe_qweight *qw = &j->q.w13;
    if (j->mxfp4) {
        /* transformers' Mxfp4Config as openai/gpt-oss-20b / -120b's config.json has it: the
         * released modules_to_not_convert (patterns), plus "<P>experts" of each layer left
         * out by --layers (transformers' should_convert_module matches at module boundaries) */
        json_t *keep = json_pack("[s, s, s, s]", "model.layers.*.self_attn", "model.layers.*.mlp.router",
                                 "model.embed_tokens", "lm_head");
        if (!keep || json_array_extend(keep, j->keep) != 0) {
            json_decref(keep);
            return NULL;
        }
        return json_pack("{s:o, s:s}", "modules_to_not_convert", keep, "quant_method", "mxfp4");
    }
    if (!j->ct)
        return json_pack("{s:s, s:s, s:s, s:[I,I], s:O, s:O}", "quant_method", "fp8", "fmt", "e4m3",
                         "activation_scheme", "dynamic", "weight_block_size", (json_int_t)qw->block_n,
                         (json_int_t)qw->block_k, "ignored_layers", j->ignore, "modules_to_not_convert", j->ignore);
    const int bits = qw->dtype == MOE_QTYPE_INT4 ? 4 : 8;
    const char *format = j->q.act == MOE_QACT_TOKEN ? "int-quantized" : "pack-quantized";
    json_t *w = json_pack("{s:i, s:s, s:b, s:s, s:o, s:b, s:n, s:s}", "num_bits", bits, "type", "int", "symmetric",
                          !qw->has_zero_point, "strategy", qw->scale == MOE_QSCALE_GROUP ? "group" : "channel",
                          "group_size", qw->scale == MOE_QSCALE_GROUP ? json_integer(qw->group_size) : json_null(),
                          "dynamic", 0, "actorder", "observer", "minmax");
    json_t *ia = j->q.act == MOE_QACT_TOKEN
                     ? json_pack("{s:i, s:s, s:b, s:s, s:n, s:b, s:s}", "num_bits", 8, "type", "int", "symmetric", 1,
                                 "strategy", "token", "group_size", "dynamic", 1, "observer", "memoryless")
                     : json_null();
    json_t *g0 = json_pack("{s:[s], s:o, s:o, s:n, s:s}", "targets", "Linear", "weights", w, "input_activations", ia,
                           "output_activations", "format", format);
    return json_pack("{s:s, s:s, s:s, s:{s:o}, s:O, s:n, s:n}", "quant_method", "compressed-tensors", "format", format,
                     "quantization_status", "compressed", "config_groups", "group_0", g0, "ignore", j->ignore,
                     "kv_cache_scheme", "sparsity_config");
}

moe_status moe_checkpoint_quantize(moe_ctx *ctx, const char *in_dir, const char *out_dir,
                                   const moe_quantize_options *opt, moe_quantize_stats *stats)
{
    if (!in_dir || !out_dir || !opt || !opt->scheme)
        return moe_set_error(ctx, MOE_EINVAL, "moe_checkpoint_quantize: %s is NULL",
                             !in_dir ? "in_dir" : !out_dir ? "out_dir" : !opt ? "opt" : "opt->scheme");
    moe_quantize_stats local;
    if (!stats)
        stats = &local;
    memset(stats, 0, sizeof *stats);
    qw_job j = {.ctx = ctx, .opt = opt, .stats = stats};
    if (moe_quant_from_name(opt->scheme, &j.q) != MOE_OK || !moe_quant_active(&j.q))
        return moe_set_error(ctx, MOE_EINVAL,
                             "unknown quantization scheme '%s' (accepted: fp8-block, int8-channel, int8-w8a8, int4-g32, "
                             "int4-g64, int4-g128, int4-g32-zp, int4-g64-zp, int4-g128-zp, mxfp4)",
                             opt->scheme);
j.mxfp4 = j.q.w13.dtype == MOE_QTYPE_MXFP4;
    if (j.q.w13.dtype == MOE_QTYPE_F8_E4M3 && j.q.w13.scale != MOE_QSCALE_BLOCK)
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "scheme '%s': per-tensor / per-channel FP8 checkpoints are not "
                             "written (the Hugging Face FP8 layout libmoe loads is block-scaled); use fp8-block",
                             opt->scheme);
    j.ct = j.q.w13.dtype != MOE_QTYPE_F8_E4M3 && !j.mxfp4;
    if (j.q.w13.has_zero_point)
        moe_log(ctx, MOE_LOG_WARN,
                "scheme %s: zero points (symmetric: false) load in libmoe and compressed-tensors, but vLLM's "
                "Marlin WNA16 MoE path accepts symmetric int4 only (compressed_tensors_moe.py asserts "
                "weight_quant.symmetric); use %.*s for vLLM",
                opt->scheme, (int)(strlen(opt->scheme) - 3), opt->scheme);
    if (j.q.w13.dtype == MOE_QTYPE_F8_E4M3 && opt->layers && opt->n_layers > 0)
        return moe_set_error(ctx, MOE_EINVAL, "scheme fp8-block: --layers must be all (FP8 block checkpoints are loaded "
                             "with every MoE layer quantized)");

    /* paths: the input must exist; the output may not be the input, nor inside it (or hold it) */
    char in_real[PATH_MAX], out_parent_real[PATH_MAX], out_abs[PATH_MAX + 256];
    if (!realpath(in_dir, in_real))
        return moe_set_error(ctx, errno == ENOENT ? MOE_ENOTFOUND : MOE_EIO, "%s: cannot open the input checkpoint: %s",
                             in_dir, strerror(errno));
    char *dup = strdup(out_dir);
    if (!dup)
        return moe_set_error(ctx, MOE_ENOMEM, "out of memory");
    size_t ol = strlen(dup);
    while (ol > 1 && dup[ol - 1] == '/')
        dup[--ol] = '\0';
    char *slash = strrchr(dup, '/');
    const char *parent = slash ? (slash == dup ? "/" : dup) : ".";
    char leaf[NAME_MAX + 1];
    snprintf(leaf, sizeof leaf, "%s", slash ? slash + 1 : dup);
    if (slash && slash != dup)
        *slash = '\0';
    if (!strcmp(leaf, ".") || !strcmp(leaf, "..") || !realpath(parent, out_parent_real)) {
        moe_status st = moe_set_error(ctx, MOE_EINVAL, "%s: the output's parent folder must exist (and the output "
                                      "must name a folder in it)", out_dir);
        free(dup);
        return st;
    }
    snprintf(out_abs, sizeof out_abs, "%s/%s", strcmp(out_parent_real, "/") ? out_parent_real : "", leaf);
    free(dup);
    size_t il = strlen(in_real), al = strlen(out_abs);
    if ((al >= il && strncmp(out_abs, in_real, il) == 0 && (out_abs[il] == '/' || out_abs[il] == '\0')) ||
        (il > al && strncmp(in_real, out_abs, al) == 0 && in_real[al] == '/'))
        return moe_set_error(ctx, MOE_EINVAL, "%s: the output is the input checkpoint %s, inside it, or holds it",
                             out_dir, in_dir);
    struct stat sb;
    /* a symbolic link at OUT (dangling or not) would fail only at the final rename, after all
     * the work: refuse it now */
    if (lstat(out_abs, &sb) == 0 && S_ISLNK(sb.st_mode))
        return moe_set_error(ctx, MOE_EINVAL, "%s: is a symbolic link; give the folder itself (the output is "
                             "published by renaming a finished folder into place)", out_dir);
    int exists = stat(out_abs, &sb) == 0;
    if (exists) {
        int empty = 0;
        if (S_ISDIR(sb.st_mode)) {
            DIR *d = opendir(out_abs);
            empty = 1;
            struct dirent *de;
            while (d && (de = readdir(d)))
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                    empty = 0;
            if (d)
                closedir(d);
        }
        if (!S_ISDIR(sb.st_mode))
            return moe_set_error(ctx, MOE_EINVAL, "%s: exists and is not a folder", out_dir);
        if (!empty && !opt->force)
            return moe_set_error(ctx, MOE_EINVAL, "%s: exists and is not empty (--force replaces it)", out_dir);
    }

    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, in_real, &ck);
    if (st != MOE_OK)
        return st;
    char *cfg_path = pjoin(in_real, "config.json"), *idx_path = pjoin(in_real, "model.safetensors.index.json");
    char tmp[PATH_MAX + 300];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp.XXXXXX", out_parent_real, leaf);
    json_t *cfg = NULL, *index = NULL, *weight_map = NULL;
    j.ignore = json_array();
    j.keep = json_array();
    bool made_tmp = false;
    if (!cfg_path || !idx_path || !j.ignore || !j.keep) {
        st = moe_set_error(ctx, MOE_ENOMEM, "out of memory");
        goto out;
    }
    json_error_t jerr;
    cfg = json_load_file(cfg_path, 0, &jerr);
    if (!cfg || !json_is_object(cfg)) {
        st = moe_set_error(ctx, MOE_EFORMAT, "%s: not a JSON object", cfg_path);
        goto out;
    }
    if (!jnull(json_object_get(cfg, "quantization_config"))) {
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: the checkpoint is already quantized (quantization_config is "
                           "set); quantize a bf16 / f32 checkpoint", cfg_path);
        goto out;
    }
    const moe_family fam = moe_checkpoint_family(ck);
    j.fam = fam;
    if (fam == MOE_FAMILY_GRANITE_MOE) {
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: %s stores its experts stacked (input_linear / output_linear); "
                           "moe quantize writes gpt-oss, Llama-4 and the per-expert layout "
                           "(experts.<e>.<proj>.weight) only", in_dir, moe_family_name(fam));
        goto out;
    }
    if (fam == MOE_FAMILY_GPT_OSS && !j.mxfp4) {
        /* gpt-oss's experts are one fused module with biases (no per-expert Linear that
         * compressed-tensors or the HF FP8 format could target), and libmoe's gpt-oss loader
         * reads the stacked bf16 or the MXFP4 tensors only */
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: gpt-oss experts are written as MXFP4 only (--quant mxfp4, the "
                           "layout of the released openai/gpt-oss checkpoints); scheme '%s' has no gpt-oss checkpoint "
                           "format with expert biases that libmoe or transformers load", in_dir, opt->scheme);
        goto out;
    }
    if (fam != MOE_FAMILY_GPT_OSS && j.mxfp4) {
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: scheme 'mxfp4' is written for gpt-oss only (its released "
                           "*_blocks / *_scales layout; transformers and libmoe read MXFP4 checkpoints for gpt-oss "
                           "only); for %s use int4-g32 (compressed-tensors, vLLM-loadable)", in_dir,
                           moe_family_name(fam));
        goto out;
    }
    for (size_t i = 0; i < opt->n_layers && opt->layers; i++)
        if (opt->layers[i] < 0 || opt->layers[i] >= moe_checkpoint_num_layers(ck) ||
            !moe_checkpoint_is_moe_layer(ck, opt->layers[i])) {
            st = moe_set_error(ctx, MOE_ERANGE, "layer %" PRId64 " is not an MoE layer of %s (num_hidden_layers %" PRId64
                               ")", opt->layers[i], in_dir, moe_checkpoint_num_layers(ck));
            goto out;
        }
    {
        /* a run killed outright (SIGKILL, power loss) cannot remove its temporary folder: name
         * any that are there (not removed: another run may be writing one now) */
        DIR *pd = opendir(out_parent_real);
        char pre[NAME_MAX + 16];
        snprintf(pre, sizeof pre, ".%s.tmp.", leaf);
        for (struct dirent *de = pd ? readdir(pd) : NULL; de; de = readdir(pd))
            if (strncmp(de->d_name, pre, strlen(pre)) == 0)
                moe_log(ctx, MOE_LOG_WARN, "%s/%s: a temporary folder of an earlier moe quantize of %s that did not "
                        "finish (killed?); remove it if no other run is writing it", out_parent_real, de->d_name,
                        out_dir);
        if (pd)
            closedir(pd);
    }
    if (!mkdtemp(tmp)) {
        st = moe_set_error(ctx, MOE_EIO, "%s: cannot create a temporary folder: %s", tmp, strerror(errno));
        goto out;
    }
    made_tmp = true;
    {
        /* mkdtemp makes the folder 0700; the published checkpoint gets the mode mkdir would give
         * (0777 less the umask), so other users (e.g. a serving process) can read it */
        const mode_t um = umask(0);
        umask(um);
        if (chmod(tmp, 0777 & ~um) != 0) {
            st = moe_set_error(ctx, MOE_EIO, "%s: cannot set the folder's mode: %s", tmp, strerror(errno));
            goto out;
        }
    }
    const bool sharded = access(idx_path, F_OK) == 0;
    if (sharded) {
        index = json_load_file(idx_path, 0, &jerr);
        const json_t *wm = index ? json_object_get(index, "weight_map") : NULL;
        if (!wm || !json_is_object(wm)) {
            st = moe_set_error(ctx, MOE_EFORMAT, "%s: no weight_map object", idx_path);
            goto out;
        }
        weight_map = json_object();
        /* the distinct shards, in order of first appearance */
        json_t *done = json_object();
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)wm, k, v) {
            const char *sh = json_string_value(v);
            if (!sh || json_object_get(done, sh))
                continue;
            json_object_set_new(done, sh, json_true());
            char *ip = pjoin(in_real, sh), *op = pjoin(tmp, sh);
            st = ip && op ? convert_shard(&j, ck, ip, op, sh, weight_map) : moe_set_error(ctx, MOE_ENOMEM, "oom");
            free(ip), free(op);
            if (st != MOE_OK)
                break;
            stats->shards++;
        }
        json_decref(done);
        if (st != MOE_OK)
            goto out;
    } else {
        char *ip = pjoin(in_real, "model.safetensors"), *op = pjoin(tmp, "model.safetensors");
        st = ip && op ? convert_shard(&j, ck, ip, op, "model.safetensors", NULL) : moe_set_error(ctx, MOE_ENOMEM, "oom");
        free(ip), free(op);
        if (st != MOE_OK)
            goto out;
        stats->shards = 1;
    }
    if (stats->expert_tensors == 0) {
        st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: no expert weights in the selected MoE layers "
                           "(<prefix>experts.<e>.<proj>.weight, or gpt-oss / Llama-4's experts.gate_up_proj and "
                           "down_proj): other stacked expert layouts are not written", in_dir);
        goto out;
    }
    /* config.json with quantization_config; the index with the new names */
    json_t *qc = quant_config_json(&j);
    if (!qc || json_object_set_new(cfg, "quantization_config", qc) != 0) {
        st = moe_set_error(ctx, MOE_ENOMEM, "out of memory");
        goto out;
    }
    char *p = pjoin(tmp, "config.json");
    if (!p || json_dump_file(cfg, p, JSON_INDENT(2)) != 0)
        st = moe_set_error(ctx, MOE_EIO, "%s: cannot write", p ? p : "config.json");
    free(p);
    if (st == MOE_OK && sharded) {
        uint64_t total = 0;
        DIR *d = opendir(tmp);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            size_t n = strlen(de->d_name);
            char *fp = pjoin(tmp, de->d_name);
            struct stat fs;
            if (fp && n > 12 && !strcmp(de->d_name + n - 12, ".safetensors") && stat(fp, &fs) == 0)
                total += (uint64_t)fs.st_size;
            free(fp);
        }
        if (d)
            closedir(d);
        json_t *meta = json_object_get(index, "metadata");
        if (!meta || !json_is_object(meta)) {
            meta = json_object();
            json_object_set_new(index, "metadata", meta);
        }
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set(index, "weight_map", weight_map);
        p = pjoin(tmp, "model.safetensors.index.json");
        if (!p || json_dump_file(index, p, JSON_INDENT(2)) != 0)
            st = moe_set_error(ctx, MOE_EIO, "%s: cannot write", p ? p : "index");
        free(p);
    }
    /* every other regular file (tokenizer, generation_config, ...) as it is */
    DIR *d = st == MOE_OK ? opendir(in_real) : NULL;
    struct dirent *de;
    while (d && st == MOE_OK && (de = readdir(d))) {
        const char *n = de->d_name;
        size_t nl = strlen(n);
        (void)nl;
        if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "config.json") ||
            !strcmp(n, "model.safetensors.index.json"))
            continue;
        char *ip = pjoin(in_real, n), *op = pjoin(tmp, n);
        struct stat fs;
        if (ip && op && stat(ip, &fs) == 0 && S_ISREG(fs.st_mode)) {
            int e = access(op, F_OK) == 0 ? 0 : copy_file(ip, op);
            if (e)
                st = moe_set_error(ctx, MOE_EIO, "%s: cannot copy to %s: %s", ip, op, strerror(e));
            else
                stats->copied_files++;
        } else if (ip && stat(ip, &fs) == 0 && S_ISDIR(fs.st_mode)) {
            moe_log(ctx, MOE_LOG_WARN, "%s: a folder, not copied into the quantized checkpoint", ip);
        }
        free(ip), free(op);
    }
    if (d)
        closedir(d);
    if (st != MOE_OK)
        goto out;
    /* publish: the finished folder replaces out_dir in one rename (the old one, with --force,
     * moved aside first and removed after) */
    char old[PATH_MAX + 300] = "";
    if (exists) {
        snprintf(old, sizeof old, "%s/.%s.old.XXXXXX", out_parent_real, leaf);
        if (!mkdtemp(old) || rename(out_abs, old) != 0) {
            st = moe_set_error(ctx, MOE_EIO, "%s: cannot move the existing output aside: %s", out_dir, strerror(errno));
            if (old[0])
                rmdir(old);
            goto out;
        }
    }
    if (rename(tmp, out_abs) != 0) {
        st = moe_set_error(ctx, MOE_EIO, "%s: cannot rename %s into place: %s", out_dir, tmp, strerror(errno));
        if (exists)
            (void)rename(old, out_abs);
        goto out;
    }
    made_tmp = false;
    if (exists)
        rm_tree(old);
    progress(&j, "wrote %s: %s, %" PRId64 " expert tensors in %d shard(s)", out_dir, opt->scheme, stats->expert_tensors,
             stats->shards);
out:
    if (made_tmp)
        rm_tree(tmp);
    json_decref(cfg);
    json_decref(index);
    json_decref(weight_map);
    json_decref(j.ignore);
    json_decref(j.keep);
    free(cfg_path);
    free(idx_path);
    moe_checkpoint_free(ck);
    return st;
}
