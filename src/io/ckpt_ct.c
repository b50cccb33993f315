/* The compressed-tensors reader: int4 / int8 routed experts (and shared experts) of
 * checkpoints that llm-compressor writes (quant_method "compressed-tensors"). Below the
 * checkpoint loader: it reaches tensors only through the moe_ckq_lookup it is handed
 * (src/io/ckpt_ct.h), and knows nothing of files, families or config.json beyond its
 * quantization_config.
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
 *   format "float-quantized" (type float, num_bits 8: FP8 e4m3, e.g. llm-compressor's FP8 and
 *     FP8_DYNAMIC schemes; naive-quantized with float weights is the same bytes): <module>.weight
 *     F8_E4M3 [N, K] holding the codes, <module>.weight_scale [1] (strategy tensor) or [N, 1]
 *     (channel): w = q * s; input_activations dynamic per-token FP8 are served weight-only;
 *     static per-tensor FP8 (<module>.input_scale [1] per linear) load as the static schemes
 *     (fp8-tensor-static, fp8-channel-static: quant.act MOE_QACT_STATIC, each expert's
 *     gate_proj / up_proj input_scale quantizing the w13 input and its down_proj input_scale
 *     the w2 input, as written per expert).
 * libmoe's source layout (moe_quant.h "Quantized experts") is reached with
 *   int4 symmetric:  nibble = stored ^ 8 (two's complement q), [N, K/2] bytes, low nibble k even
 *   int4 zero point: v = stored nibble (q + 8), z = stored zero nibble (zp + 8): w = (v - z) s
 *   int8 packed:     byte = stored ^ 0x80; int-quantized: the I8 bytes as they are.
 * The packed int32 words are little-endian in the file, so byte j of a row holds elements 2j
 * (low nibble) and 2j + 1 for int4, and element j for int8.
 */
#include "io/ckpt_ct.h"
#include "io/ckpt_gptq.h"
#include "io/safetensors.h"
#include "quant/format.h"
#include "quant/quant.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CKQ_FMT_GPTQ: quant_method gptq / awq, read by src/io/ckpt_gptq.c.
 * FLOAT: format float-quantized (or naive-quantized with float weights), <module>.weight
 * F8_E4M3 [N, K] holding the e4m3 codes, weight_scale F32/BF16/F16 [1] or [] (strategy
 * tensor) or [N, 1] / [N] (channel): w = q * s. */
typedef enum { CKQ_FMT_PACKED = 1, CKQ_FMT_INT = 2, CKQ_FMT_GPTQ = 3, CKQ_FMT_FLOAT = 4 } ckq_format;

struct moe_ckq {
    ckq_format format;     /* where the codes are: weight_packed or weight */
    int num_bits;          /* 4 or 8 */
    int symmetric;
    int is_float;          /* weights type float (FP8 e4m3) */
    int act_dynamic_fp8;   /* input_activations dynamic per-token FP8: served weight-only (logged) */
    int act_static_fp8;    /* input_activations static per-tensor FP8 (input_scale per linear):
                              quant.act MOE_QACT_STATIC, the scales loaded per expert */
    moe_quant_config quant;/* w13 = w2 = the weight scheme, act */
    json_t *targets;       /* the config groups' targets (strings), or NULL when a group has none */
    json_t *ignore;        /* quantization_config.ignore (strings), or NULL */
    moe_gptq_scheme gq;    /* CKQ_FMT_GPTQ: the GPTQ / AWQ scheme */
};

struct moe_ckq_layer {
    moe_quant_config quant;
    const void **scale[3];     /* [3][E] f32 scales (into the file, or into owned) */
    const uint8_t **zero[3];   /* [3][E] u8 [N, G] zero points, or NULL */
    void **owned;              /* [n_owned] converted buffers */
    size_t n_owned, cap_owned;
    size_t owned_bytes;
    int act_order;             /* GPTQ: a g_idx of this layer is act-order */
    int f32;                   /* GPTQ act-order: the experts are f32 [N, K] dequantizations, quant NONE */
    float *in13, *in2;         /* static FP8 activations: [E] f32 input scales of w13 (max of gate_proj's
                                  and up_proj's) and of w2 (down_proj's); 0 for experts not loaded */
};

static bool jstr_is(const json_t *v, const char *s)
{
    return v && json_is_string(v) && strcmp(json_string_value(v), s) == 0;
}

static bool jnull(const json_t *v)
{
    return !v || json_is_null(v);
}

/* A config value as the messages below show it after "= ": a string's text, a number as
 * written, true / false, or the value's kind ("absent", "an object", ...). Only for values
 * whose JSON type was checked (check_arg_types) or whose kind is the point. */
static const char *jvalue(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    return moe_io_json_value(v);
}

/* The JSON types compressed-tensors' QuantizationArgs (quantization/quant_args.py) takes for
 * each field; null is accepted for every one (the default). */
enum { JT_INT = 1, JT_BOOL = 2, JT_STR = 4, JT_ARR = 8 };
static const struct {
    const char *key;
    unsigned types;
    const char *want;
} arg_types[] = {
    {"num_bits", JT_INT, "an integer"},
    {"group_size", JT_INT, "an integer"},
    {"symmetric", JT_BOOL, "true or false"},
    {"dynamic", JT_BOOL | JT_STR, "true, false or \"local\""},
    {"type", JT_STR, "a string (\"int\" or \"float\")"},
    {"strategy", JT_STR, "a string"},
    {"actorder", JT_STR | JT_BOOL, "a string or a boolean"},
    {"block_structure", JT_ARR, "an array of 2 integers"},
};

/* MOE_EFORMAT naming the first field of QuantizationArgs object `a` (field prefix `f`) whose
 * JSON type is not the one the package takes ("found a string (\"4\")"). */
static moe_status check_arg_types(moe_ctx *ctx, const char *cp, const char *f, const json_t *a)
{
    for (size_t i = 0; i < sizeof arg_types / sizeof arg_types[0]; i++) {
        const json_t *v = json_object_get(a, arg_types[i].key);
        if (jnull(v))
            continue;
        const unsigned t = arg_types[i].types;
        if (((t & JT_INT) && json_is_integer(v)) || ((t & JT_BOOL) && json_is_boolean(v)) ||
            ((t & JT_STR) && json_is_string(v)) || ((t & JT_ARR) && json_is_array(v)))
            continue;
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.%s' must be %s, found %s", cp, f, arg_types[i].key,
                             arg_types[i].want, moe_io_json_found(v));
    }
    return MOE_OK;
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
                              "patterns or class names), found %s", cp, field, moe_io_json_found(v));
}

/* Float weights (type "float") of one config group: FP8 e4m3 (num_bits 8), strategy tensor or
 * channel, static, symmetric. */
static moe_status parse_float_weights(moe_ctx *ctx, const char *cp, const char *f, const json_t *w, moe_ckq *q)
{
    const json_t *nb = json_object_get(w, "num_bits"), *sym = json_object_get(w, "symmetric");
    const json_t *strat = json_object_get(w, "strategy"), *dyn = json_object_get(w, "dynamic");
    const json_t *bs = json_object_get(w, "block_structure"), *gs = json_object_get(w, "group_size");
    if (!json_is_integer(nb) || json_integer_value(nb) != 8)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.num_bits' = %s with type float: only 8 (FP8 e4m3) is loaded "
                             "(4-bit float schemes such as NVFP4 are not)",
                             cp, f, json_is_integer(nb) ? (json_integer_value(nb) == 4 ? "4" : "not 8") : jvalue(nb));
    if (!jnull(sym) && !json_is_true(sym))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.symmetric' = %s: float weights are loaded "
                             "symmetric only", cp, f, jvalue(sym));
    if (!jnull(dyn) && !json_is_false(dyn))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.dynamic' = %s: only static weights are loaded",
                             cp, f, jvalue(dyn));
    if (!json_is_string(strat))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.weights.strategy' = %s: float weights need a strategy "
                             "(tensor or channel)", cp, f, jvalue(strat));
    moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3};
    if (jstr_is(strat, "tensor"))
        qw.scale = MOE_QSCALE_TENSOR;
    else if (jstr_is(strat, "channel"))
        qw.scale = MOE_QSCALE_CHANNEL;
    else
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.strategy' = %s with type float: only tensor and channel FP8 "
                             "weights are loaded",
                             cp, f, json_string_value(strat));
    if (!jnull(bs) || (!jnull(gs) && !(json_is_integer(gs) && json_integer_value(gs) <= 0)))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.%s' is set: FP8 block / group scales are "
                             "not loaded from compressed-tensors", cp, f, jnull(bs) ? "group_size" : "block_structure");
    q->num_bits = 8;
    q->symmetric = 1;
    q->is_float = 1;
    q->quant.w13 = qw;
    q->quant.w2 = qw;
    return MOE_OK;
}

/* weights of one config group into q. `f` is the group's field prefix for messages. */
static moe_status parse_weights(moe_ctx *ctx, const char *cp, const char *f, const json_t *w, moe_ckq *q)
{
    if (w && !json_is_object(w) && !json_is_null(w))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.weights' must be an object (QuantizationArgs), found %s",
                             cp, f, moe_io_json_found(w));
    if (!w || !json_is_object(w))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights' is %s: libmoe loads weight quantization only",
                             cp, f, jvalue(w));
    char wf[200];
    snprintf(wf, sizeof wf, "%s.weights", f);
    moe_status tst = check_arg_types(ctx, cp, wf, w);
    if (tst != MOE_OK)
        return tst;
    const json_t *type = json_object_get(w, "type"), *nb = json_object_get(w, "num_bits");
    const json_t *sym = json_object_get(w, "symmetric"), *strat = json_object_get(w, "strategy");
    const json_t *gs = json_object_get(w, "group_size"), *dyn = json_object_get(w, "dynamic");
    const json_t *ao = json_object_get(w, "actorder"), *bs = json_object_get(w, "block_structure");
    if (!jnull(type) && !jstr_is(type, "int") && !jstr_is(type, "float"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.type' = %s: int and float (FP8) weights are loaded", cp, f,
                             jvalue(type));
    if (jstr_is(type, "float"))
        return parse_float_weights(ctx, cp, f, w, q);
    if (!json_is_integer(nb))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.num_bits' = %s: only 4 and 8 are loaded", cp,
                             f, jvalue(nb));
    if (json_integer_value(nb) != 4 && json_integer_value(nb) != 8)
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.num_bits' = %lld: only 4 and 8 are loaded",
                             cp, f, (long long)json_integer_value(nb));
    q->num_bits = (int)json_integer_value(nb);
    if (!jnull(sym) && !json_is_boolean(sym))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.weights.symmetric' must be true or false", cp, f);
    q->symmetric = jnull(sym) || json_is_true(sym);
    if (!jnull(dyn) && !json_is_false(dyn))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.dynamic' = %s: only static weights are loaded",
                             cp, f, jvalue(dyn));
    if (!jnull(bs))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.block_structure' is set: int block scales are "
                             "not loaded", cp, f);
    /* actorder "weight" (alias "static") only changes calibration; "group" needs g_idx */
    if (!jnull(ao) && !jstr_is(ao, "weight") && !jstr_is(ao, "static"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.weights.actorder' = %s: activation reordering with g_idx is not loaded "
                             "(only null or \"weight\")",
                             cp, f, jvalue(ao));
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

/* input_activations of an FP8-weight group (object ia): dynamic per-token FP8 (FP8_DYNAMIC,
 * Llama-4 Maverick FP8) is served weight-only (libmoe has no per-token FP8 activation kernel,
 * only per-token-group with block weights): f32 activations, logged at load. Static
 * per-tensor FP8 activations (input_scale per linear) load as quant.act MOE_QACT_STATIC, the
 * scales required, checked and kept per expert at layer load (load_input_scales); other static
 * strategies are refused. */
static moe_status parse_float_acts(moe_ctx *ctx, const char *cp, const char *f, const json_t *ia, moe_ckq *q)
{
    const json_t *type = json_object_get(ia, "type"), *nb = json_object_get(ia, "num_bits");
    const json_t *strat = json_object_get(ia, "strategy"), *dyn = json_object_get(ia, "dynamic");
    if (!jstr_is(type, "float") || !json_is_integer(nb) || json_integer_value(nb) != 8)
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.input_activations': type %s, num_bits %s: with FP8 weights only FP8 "
                             "(type float, num_bits 8) activations are loaded",
                             cp, f, jvalue(type), json_is_integer(nb) ? "not 8" : jvalue(nb));
    if (json_is_false(dyn) || jnull(dyn)) {
        /* static (QuantizationArgs.dynamic defaults to false): one input_scale per linear, which
         * only strategy tensor has (llm-compressor's FP8 static scheme) */
        const json_t *sym = json_object_get(ia, "symmetric");
        if (!jstr_is(strat, "tensor"))
            return moe_set_error(ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s.input_activations.strategy' = %s with dynamic %s: static FP8 "
                                 "activations are loaded with strategy tensor (one input_scale per linear) only",
                                 cp, f, jvalue(strat), jvalue(dyn));
        if (!jnull(sym) && !json_is_true(sym))
            return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.input_activations.symmetric' = %s: static "
                                 "FP8 activations are loaded symmetric only", cp, f, jvalue(sym));
        q->act_static_fp8 = 1;
        q->quant.act = MOE_QACT_STATIC;
        return MOE_OK;
    }
    if (!json_is_true(dyn) || !jstr_is(strat, "token"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.input_activations': dynamic %s, strategy %s: only dynamic per-token "
                             "(strategy token) FP8 activations are loaded",
                             cp, f, jvalue(dyn), jvalue(strat));
    q->act_dynamic_fp8 = 1;
    q->quant.act = MOE_QACT_NONE;
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
        return moe_set_error(ctx, MOE_EFORMAT, "%s: field '%s.input_activations' must be an object or null, found %s",
                             cp, f, moe_io_json_found(ia));
    char af[200];
    snprintf(af, sizeof af, "%s.input_activations", f);
    moe_status tst = check_arg_types(ctx, cp, af, ia);
    if (tst != MOE_OK)
        return tst;
    const json_t *type = json_object_get(ia, "type"), *nb = json_object_get(ia, "num_bits");
    const json_t *sym = json_object_get(ia, "symmetric"), *strat = json_object_get(ia, "strategy");
    const json_t *dyn = json_object_get(ia, "dynamic");
    if (q->is_float)
        return parse_float_acts(ctx, cp, f, ia, q);
    if (!jnull(type) && !jstr_is(type, "int"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.input_activations.type' = %s: only int8 activations "
                             "are loaded", cp, f, jvalue(type));
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
                             cp, f, jvalue(dyn));
    if (!jstr_is(strat, "token"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s.input_activations.strategy' = %s: only token (dynamic per-token int8) is "
                             "loaded",
                             cp, f, jvalue(strat));
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
    const json_t *method = json_object_get(qc, "quant_method");
    if (jstr_is(method, "gptq") || jstr_is(method, "awq")) {
        moe_ckq *q = calloc(1, sizeof *q);
        if (!q)
            return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", cp);
        q->format = CKQ_FMT_GPTQ;
        moe_status st = moe_gptq_parse(ctx, cp, qpre, qc, &q->gq, &q->quant.w13);
        if (st != MOE_OK) {
            moe_ckq_free(q);
            return st;
        }
        q->num_bits = q->gq.bits;
        q->symmetric = !q->quant.w13.has_zero_point;
        q->quant.w2 = q->quant.w13;
        q->quant.act = MOE_QACT_NONE;
        *out = q;
        return MOE_OK;
    }
    if (!jstr_is(method, "compressed-tensors"))
        return MOE_OK;
    char f[160];
    const json_t *status = json_object_get(qc, "quantization_status");
    if (!jnull(status) && !jstr_is(status, "compressed"))
        return moe_set_error(ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.quantization_status' = %s: only compressed checkpoints "
                             "are loaded",
                             cp, qpre, jvalue(status));
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
        } else if (jstr_is(fmt, "float-quantized")) {
            one.format = CKQ_FMT_FLOAT;
        } else {
            st = moe_set_error(ctx, MOE_EUNSUPPORTED,
                               "%s: field '%s.format' (or '%squantization_config.format') = %s: libmoe loads "
                               "pack-quantized, int-quantized, naive-quantized and float-quantized",
                               cp, f, qpre, jvalue(fmt));
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
        if (one.is_float && jstr_is(fmt, "naive-quantized"))
            one.format = CKQ_FMT_FLOAT; /* naive-quantized with float weights: the F8_E4M3 weight */
        if ((one.format == CKQ_FMT_FLOAT) != (one.is_float != 0)) {
            st = moe_set_error(ctx, MOE_EUNSUPPORTED,
                               "%s: field '%s.format' = %s with field '%s.weights.type' = %s: float-quantized (or "
                               "naive-quantized) holds float (FP8) weights, pack-quantized and int-quantized int ones",
                               cp, f, json_string_value(fmt), f, one.is_float ? "float" : "int");
            break;
        }
        if (one.format == CKQ_FMT_INT && one.num_bits != 8) {
            st = moe_set_error(ctx, MOE_EUNSUPPORTED, "%s: field '%s.weights.num_bits' = %d with format int-quantized: "
                               "only 8-bit codes are stored unpacked", cp, f, one.num_bits);
            break;
        }
        if (!first && (one.format != q->format || one.num_bits != q->num_bits || one.symmetric != q->symmetric ||
                       one.act_dynamic_fp8 != q->act_dynamic_fp8 || one.act_static_fp8 != q->act_static_fp8 ||
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
    if (q->act_dynamic_fp8)
        moe_log(ctx, MOE_LOG_WARN,
                "%s: compressed-tensors input_activations dynamic per-token FP8: served weight-only (%s) with f32 "
                "activations (libmoe has no per-token FP8 activation kernel); outputs are more exact than the "
                "fp8 x fp8 products the checkpoint was calibrated for (docs/numerics.md)",
                cp, moe_quant_name(&q->quant));
    if (q->act_static_fp8)
        moe_log(ctx, MOE_LOG_INFO,
                "%s: compressed-tensors input_activations static per-tensor FP8 (an input_scale per linear): "
                "served as %s, each expert's w13 input quantized with its gate_proj / up_proj input_scale and its "
                "w2 input with its down_proj input_scale, e4m3(clamp(x / s, -448, 448)), per expert as written "
                "(vLLM applies the maximum over the experts); a plan with quant.act NONE runs the same codes "
                "weight-only (docs/checkpoints.md)",
                cp, moe_quant_name(&q->quant));
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
    free(l->in13);
    free(l->in2);
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

const char *moe_ckq_method(const moe_ckq *q)
{
    if (q && q->format == CKQ_FMT_GPTQ)
        return q->gq.awq ? "awq" : "gptq";
    return "compressed-tensors";
}

const moe_quant_config *moe_ckq_quant(const moe_ckq *q)
{
    return &q->quant;
}

int moe_ckq_layer_f32(const moe_ckq_layer *l)
{
    return l->f32;
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
    src->w13_input_scale = l->in13; /* static FP8 activations: [E], else NULL */
    src->w2_input_scale = l->in2;
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

/* Tensor `name` through lk, which must be of dtype `dt`: MOE_EDTYPE "dtype X, expected <dt>
 * (<why>)" otherwise. */
static moe_status get_typed(moe_ctx *ctx, const moe_ckq_lookup *lk, const char *name, moe_dtype dt, const char *why,
                            moe_tensor_info *t, const char **path)
{
    moe_status st = lk->get(lk->u, name, t, path);
    if (st == MOE_OK && t->dtype != dt)
        st = moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected %s (%s)", *path, name,
                           moe_dtype_name(t->dtype), moe_dtype_name(dt), why);
    return st;
}

static void *own_u(void *u, size_t n)
{
    return own(u, n);
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
    if (q->format == CKQ_FMT_GPTQ) {
        /* the scales' values are checked there (moe_io_check_scales), at load */
        return moe_gptq_load_linear(ctx, &q->gq, qw, lk, base, N, K, describe, l->f32, &l->act_order, own_u, l, codes,
                                    scale, zero);
    }
    if (q->format == CKQ_FMT_INT || q->format == CKQ_FMT_FLOAT) {
        const bool fl = q->format == CKQ_FMT_FLOAT;
        snprintf(name, sizeof name, "%s.weight", base);
        if ((st = get_typed(ctx, lk, name, fl ? MOE_DTYPE_F8_E4M3 : MOE_DTYPE_I8,
                            fl ? "compressed-tensors float-quantized" : "compressed-tensors int-quantized", &t,
                            &path)) != MOE_OK)
            return st;
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
        if ((st = get_typed(ctx, lk, name, MOE_DTYPE_I32, "pack-quantized", &t, &path)) != MOE_OK)
            return st;
        const int64_t per = 32 / q->num_bits, words = (K + per - 1) / per;
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
    if (qw->scale == MOE_QSCALE_TENSOR) {
        /* strategy tensor: one scale, [1] as llm-compressor writes it, [] or [1, 1] accepted */
        N = 1;
        if (!(t.ndim == 0 || shape_is(&t, 1, 1, 0) || shape_is(&t, 2, 1, 1)))
            return bad_shape(ctx, path, name, &t, "[1] (strategy tensor: one scale per matrix)");
    } else if (!shape_is(&t, 2, N, G) && !(G == 1 && shape_is(&t, 1, N, 0))) {
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
    /* a NaN, infinite, zero or negative scale is refused (checked at load, on the stored values) */
    if (!describe && (st = moe_io_check_scales(ctx, path, name, t.dtype, t.data, N,
                                               qw->scale == MOE_QSCALE_TENSOR ? 0 : G,
                                               q->is_float ? "compressed-tensors FP8 weight_scale"
                                                           : "compressed-tensors weight_scale")) != MOE_OK)
        return st;
    if (!qw->has_zero_point)
        return MOE_OK;
    snprintf(name, sizeof name, "%s.weight_zero_point", base);
    if ((st = get_typed(ctx, lk, name, MOE_DTYPE_I32, "packed along the output dimension", &t, &path)) != MOE_OK)
        return st;
    const int64_t zrows = (N + 7) / 8; /* 8 nibbles per int32 along N */
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

/* Static FP8 activations (moe_ckq.act_static_fp8): linear `base`'s input_scale, one scale ([1]
 * as llm-compressor writes it; [] or [1, 1] accepted), F32 / BF16 / F16. Looked up even when
 * describing (so the unread-tensor check counts it read); at load (describe 0) its value must
 * be finite and positive and goes to *v. */
static moe_status get_input_scale(moe_ctx *ctx, const moe_ckq_lookup *lk, const char *base, int describe, float *v)
{
    char name[320];
    snprintf(name, sizeof name, "%s.input_scale", base);
    *v = 0.0f;
    if (!lk->has(lk->u, name))
        return moe_set_error(ctx, MOE_ENOTFOUND,
                             "tensor '%s' not found: config_groups input_activations are static FP8 (dynamic false, "
                             "strategy tensor), so each quantized linear stores its input_scale",
                             name);
    moe_tensor_info t;
    const char *path = NULL;
    moe_status st = lk->get(lk->u, name, &t, &path);
    if (st != MOE_OK)
        return st;
    if (t.dtype != MOE_DTYPE_F32 && t.dtype != MOE_DTYPE_BF16 && t.dtype != MOE_DTYPE_F16)
        return moe_set_error(ctx, MOE_EDTYPE, "%s: tensor '%s': dtype %s, expected F32, BF16 or F16", path, name,
                             moe_dtype_name(t.dtype));
    if (!(t.ndim == 0 || shape_is(&t, 1, 1, 0) || shape_is(&t, 2, 1, 1)))
        return bad_shape(ctx, path, name, &t, "[1] (static strategy tensor: one input scale per linear)");
    if (describe)
        return MOE_OK;
    if ((st = moe_io_check_scales(ctx, path, name, t.dtype, t.data, 1, 0, "static FP8 input_scale")) != MOE_OK)
        return st;
    if (t.dtype == MOE_DTYPE_F32) {
        memcpy(v, t.data, 4);
    } else {
        uint16_t h;
        memcpy(&h, t.data, 2);
        *v = t.dtype == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
    }
    return MOE_OK;
}

/* The input_scale of every expert linear of [e_lo, e_hi) (static FP8 activations) into in13 /
 * in2 [E] (at load; describing only checks names, dtypes and shapes): w13's is gate_proj's,
 * w2's down_proj's. gate_proj and up_proj see the same input, so llm-compressor calibrates one
 * scale for both; where they differ the larger is used (the input is quantized once for both
 * GEMMs, and the larger scale clips nothing the smaller would not) and a WARNING names the
 * experts and the cost: the projection with the smaller scale gets coarser codes than it was
 * calibrated for (vLLM's loader refuses such a checkpoint: "input_scales of w1 and w3 of a layer
 * must be equal"). INFO names each projection's range; vLLM would apply the maxima over the
 * experts (compressed_tensors_moe.py process_weights_after_loading: w13_input_scale.max(),
 * w2_input_scale.max()), libmoe applies each expert's own. */
static moe_status load_input_scales(moe_ctx *ctx, const moe_ckq_lookup *lk, const char *prefix,
                                    const char *const proj[3], int64_t e_lo, int64_t e_hi, int describe, float *in13,
                                    float *in2)
{
    char base[300];
    float mx[3] = {0, 0, 0}, mn[3] = {0, 0, 0};
    int64_t differ = 0, first = -1; /* experts whose gate_proj and up_proj input_scale differ, the first */
    float fg = 0, fu = 0;           /* the first one's two scales */
    for (int64_t e = e_lo; e < e_hi; e++) {
        float v[3];
        for (int j = 0; j < 3; j++) {
            snprintf(base, sizeof base, "%sexperts.%" PRId64 ".%s", prefix, e, proj[j]);
            moe_status st = get_input_scale(ctx, lk, base, describe, &v[j]);
            if (st != MOE_OK)
                return st;
            if (e == e_lo || v[j] > mx[j])
                mx[j] = v[j];
            if (e == e_lo || v[j] < mn[j])
                mn[j] = v[j];
        }
        if (v[0] != v[1] && differ++ == 0)
            first = e, fg = v[0], fu = v[1];
        if (!describe) {
            in13[e] = v[0] > v[1] ? v[0] : v[1];
            in2[e] = v[2];
        }
    }
    if (describe || e_lo >= e_hi)
        return MOE_OK;
    moe_log(ctx, MOE_LOG_INFO,
            "%sexperts: static FP8 input_scale applied per expert: experts [%" PRId64 ", %" PRId64
            ") %s.input_scale %g .. %g, %s.input_scale %g .. %g, %s.input_scale %g .. %g (vLLM would quantize "
            "the w13 input with %g and the w2 input with %g, the maxima over the experts)",
            prefix, e_lo, e_hi, proj[0], (double)mn[0], (double)mx[0], proj[1], (double)mn[1], (double)mx[1], proj[2],
            (double)mn[2], (double)mx[2], (double)(mx[0] > mx[1] ? mx[0] : mx[1]), (double)mx[2]);
    if (differ)
        moe_log(ctx, MOE_LOG_WARN,
                "%sexperts: %s.input_scale and %s.input_scale differ in %" PRId64 " experts (the first: expert %" PRId64
                ", %g and %g): their shared input is quantized once with the larger, so the projection with the "
                "smaller scale gets codes up to %.3gx coarser than it was calibrated for (vLLM refuses such a "
                "checkpoint)",
                prefix, proj[0], proj[1], differ, first, (double)fg, (double)fu,
                (double)((fg > fu ? fg : fu) / (fg < fu ? fg : fu)));
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
    snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.%s", prefix, e_lo, proj[0],
             q->format == CKQ_FMT_GPTQ ? "qweight" : "weight_packed");
    bool quantized = lk->has(lk->u, name);
    if (!quantized && (q->format == CKQ_FMT_INT || q->format == CKQ_FMT_FLOAT)) {
        moe_tensor_info t;
        const char *path;
        snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e_lo, proj[0]);
        quantized = lk->has(lk->u, name) && lk->get(lk->u, name, &t, &path) == MOE_OK &&
                    t.dtype == (q->format == CKQ_FMT_FLOAT ? MOE_DTYPE_F8_E4M3 : MOE_DTYPE_I8);
    }
    if (!quantized && (q->format == CKQ_FMT_GPTQ || q->format == CKQ_FMT_PACKED)) {
        /* neither the quantized codes nor the float weight of a layer left unquantized: name
         * the tensor the config's format stores (the float path would name '.weight') */
        char fl[320];
        snprintf(fl, sizeof fl, "%sexperts.%" PRId64 ".%s.weight", prefix, e_lo, proj[0]);
        if (!lk->has(lk->u, fl))
            return moe_set_error(ctx, MOE_ENOTFOUND,
                                 "tensor '%s' not found: quantization_config quant_method %s stores each expert "
                                 "linear as %s (and no float '%s' of a layer left unquantized is there either)",
                                 name, moe_ckq_method(q), q->format == CKQ_FMT_GPTQ ? "qweight, qzeros, scales (and "
                                 "g_idx)" : "weight_packed, weight_scale, weight_shape", fl);
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
    /* GPTQ: an act-order g_idx anywhere in the layer makes it load as f32 (src/io/ckpt_gptq.c) */
    for (int64_t e = e_lo; q->format == CKQ_FMT_GPTQ && e < e_hi && st == MOE_OK; e++)
        for (int j = 0; j < 3 && st == MOE_OK; j++) {
            const void *c = NULL, *s = NULL;
            const uint8_t *z = NULL;
            snprintf(base, sizeof base, "%sexperts.%" PRId64 ".%s", prefix, e, proj[j]);
            st = load_linear(ctx, q, lk, l, base, j == 2 ? H : I, j == 2 ? I : H, 1, &c, &s, &z);
        }
    if (st == MOE_OK && l->act_order) {
        l->f32 = 1;
        memset(&l->quant, 0, sizeof l->quant);
    }
    for (int64_t e = e_lo; e < e_hi && st == MOE_OK; e++)
        for (int j = 0; j < 3 && st == MOE_OK; j++) {
            snprintf(base, sizeof base, "%sexperts.%" PRId64 ".%s", prefix, e, proj[j]);
            st = load_linear(ctx, q, lk, l, base, j == 2 ? H : I, j == 2 ? I : H, describe, &codes[j][e], &l->scale[j][e],
                             &l->zero[j][e]);
        }
    if (st == MOE_OK && q->act_static_fp8 && !describe) {
        l->in13 = calloc((size_t)E, sizeof *l->in13); /* [E] */
        l->in2 = calloc((size_t)E, sizeof *l->in2);   /* [E] */
        if (!l->in13 || !l->in2)
            st = moe_set_error(ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts' input scales", E);
    }
    if (st == MOE_OK && q->act_static_fp8)
        st = load_input_scales(ctx, lk, prefix, proj, e_lo, e_hi, describe, l->in13, l->in2);
    if (st != MOE_OK) {
        moe_ckq_layer_free(l);
        return st;
    }
    if (!l->quant.w13.has_zero_point)
        for (int j = 0; j < 3; j++) {
            free(l->zero[j]);
            l->zero[j] = NULL;
        }
    if (l->f32 && !describe)
        moe_log(ctx, MOE_LOG_INFO,
                "%sexperts: GPTQ act-order layer: experts [%" PRId64 ", %" PRId64 ") dequantized exactly to f32 "
                "(weight_dtype F32, quant none): %zu bytes instead of %zu of int4 codes",
                prefix, e_lo, e_hi, l->owned_bytes, (size_t)((e_hi - e_lo) * 3 * I * H) * (size_t)q->num_bits / 8);
    else if (l->owned_bytes)
        moe_log(ctx, MOE_LOG_INFO,
                "%sexperts: %zu bytes of compressed-tensors codes / scales converted to libmoe's source layout "
                "(a temporary copy, freed once packed)",
                prefix, l->owned_bytes);
    *out = l;
    return MOE_OK;
}

/* ---- a quantized shared expert ---- */

/* true if regex p could make glibc's regcomp expand without bound: a repetition operator
 * (* + ? {m,n}) right after another (e.g. "a++", which Python's re refuses as "multiple
 * repeat"), more than 16 repetitions in all (nested groups double the tree each), or an
 * interval count above 64. regcomp expands each repetition, so "re:a+++...+" with 34 '+'
 * took 24 GB (found by tests/fuzz/fuzz_config_plan); released configs use one or two.
 * Escaped characters and bracket expressions are skipped. */
static bool regex_too_costly(const char *p)
{
    bool prev_rep = false;
    int reps = 0;
    for (size_t i = 0; p[i]; i++) {
        const char c = p[i];
        if (c == '\\') {
            prev_rep = false;
            if (p[i + 1])
                i++;
            continue;
        }
        if (c == '[') { /* to the closing ']' ("[]...]" and "[^]...]" hold a literal ']') */
            size_t j = i + 1;
            if (p[j] == '^')
                j++;
            if (p[j] == ']')
                j++;
            while (p[j] && p[j] != ']')
                j++;
            i = p[j] ? j : j - 1;
            prev_rep = false;
            continue;
        }
        const bool rep = c == '*' || c == '+' || c == '?' || c == '{';
        if (rep && (prev_rep || ++reps > 16))
            return true;
        if (c == '{') { /* to the closing '}': every count at most 64 */
            long v = 0;
            while (p[i + 1] && p[i] != '}') {
                i++;
                if (p[i] >= '0' && p[i] <= '9') {
                    v = v * 10 + (p[i] - '0');
                    if (v > 64)
                        return true;
                } else
                    v = 0;
            }
        }
        prev_rep = rep;
    }
    return false;
}

/* Does module `name` match compressed-tensors target / ignore entry `t` (utils/match.py
 * match_name and _match_class): "re:<pattern>" is Python's re.match (anchored at the start
 * only), evaluated here as a POSIX extended regex "^(<pattern>)"; any other string is an exact
 * module name or a class name, and a shared-expert projection is an nn.Linear, so "Linear"
 * (and "Module", a base class) match it. 1 match, 0 no match, -1 undecidable (a pattern POSIX
 * regcomp refuses, e.g. Python-only syntax, or one with a run of repetitions,
 * regex_too_costly). */
static int target_matches(const char *name, const char *t)
{
    if (strncmp(t, "re:", 3) != 0)
        return strcmp(t, name) == 0 || strcmp(t, "Linear") == 0 || strcmp(t, "Module") == 0;
    if (regex_too_costly(t + 3))
        return -1;
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
 * weight_scale, 2 weight_shape, 3 weight_zero_point, 4 an I8 or F8_E4M3 `weight` (int- /
 * float-quantized codes), 5 a float (F32 / BF16 / F16) `weight`. */
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
        m |= t.dtype == MOE_DTYPE_I8 || t.dtype == MOE_DTYPE_F8_E4M3 ? 1u << 4 : 1u << 5;
    return m;
}

/* A GPTQ / AWQ shared expert: quantized when all three projections have a qweight, float when
 * none has; a mix is MOE_EFORMAT (the tensors are validated when dequantized). */
static moe_status gptq_shared_check(moe_ctx *ctx, const moe_ckq_lookup *lk, const char *dir,
                                    const char *const base[3], int *quantized)
{
    char name[320];
    int nq = 0, jq = 0, jf = 0;
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof name, "%s.qweight", base[j]);
        if (lk->has(lk->u, name)) {
            nq++;
            jq = j;
        } else
            jf = j;
    }
    if (nq > 0 && nq < 3)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: shared expert: %d of its 3 projections are stored quantized ('%s.qweight') and %d "
                             "not ('%s' has no qweight): all three or none",
                             dir, nq, base[jq], 3 - nq, base[jf]);
    *quantized = nq == 3;
    return MOE_OK;
}

moe_status moe_ckq_shared_check(moe_ctx *ctx, const moe_ckq *q, const moe_ckq_lookup *lk, const char *dir,
                                const char *const base[3], int *quantized)
{
    *quantized = 0;
    if (q->format == CKQ_FMT_GPTQ)
        return gptq_shared_check(ctx, lk, dir, base, quantized);
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
                                     have == 4 ? "weight" : nm[have],
                                     packed ? "pack-quantized" : q->format == CKQ_FMT_FLOAT ? "float-quantized"
                                                                                            : "int-quantized",
                                     packed ? (q->quant.w13.has_zero_point
                                                   ? "weight_packed, weight_scale, weight_shape, weight_zero_point"
                                                   : "weight_packed, weight_scale, weight_shape")
                                     : q->format == CKQ_FMT_FLOAT ? "F8_E4M3 weight, weight_scale"
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
    l->f32 = q->format == CKQ_FMT_GPTQ; /* GPTQ / AWQ: the exact f32 dequantization, act-order or not */
    moe_status st = load_linear(ctx, q, lk, l, base, N, K, describe, &codes, &scale, &zero);
    float in_scale = 0.0f; /* static FP8 activations: checked, not applied (the shared expert runs f32) */
    if (st == MOE_OK && q->act_static_fp8)
        st = get_input_scale(ctx, lk, base, describe, &in_scale);
    if (st == MOE_OK && q->act_static_fp8 && !describe)
        moe_log(ctx, MOE_LOG_INFO, "%s.input_scale = %g: NOT applied (the shared expert runs in f32)", base,
                (double)in_scale);
    if (st == MOE_OK && w && l->f32) {
        memcpy(w, codes, sizeof(float) * (size_t)(N * K));
    } else if (st == MOE_OK && w) {
        moe_quant_dequant_source(&q->quant.w13, codes, scale, zero, N, K, w);
    }
    if (code_bytes)
        *code_bytes = (size_t)(N * K) * (size_t)q->num_bits / 8;
    moe_ckq_layer_free(l);
    return st;
}
