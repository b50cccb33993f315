/* Hugging Face checkpoints: config.json + model.safetensors (or shards listed in
 * model.safetensors.index.json), for every family of moe.h's moe_family. The fields and
 * names follow transformers 5.24's modeling and config classes (and, where those leave a
 * field out, the models' own published code; each such place says so).
 *
 * config.json: multimodal wrappers (Llama4ForConditionalGeneration,
 * Qwen3_5MoeForConditionalGeneration) keep the decoder's fields in "text_config"; those are
 * read from there, and messages name them "text_config.<field>".
 *
 * Per layer L the MoE block sits under a prefix P, the first of the family's candidates
 * that holds the router:
 *   Mixtral      model.layers.L.block_sparse_moe. (as released), model.layers.L.mlp.
 *   Qwen2/3-MoE, Qwen3-Next, OLMoE, DeepSeek-V2/V3, gpt-oss: model.layers.L.mlp.
 *   Qwen3.5-MoE  model.language_model.layers.L.mlp. (ConditionalGeneration), model.layers.L.mlp.
 *   Llama-4      language_model.model.layers.L.feed_forward. (as released),
 *                model.language_model.layers.L.feed_forward., model.layers.L.feed_forward.
 *   Granite-MoE  model.layers.L.block_sparse_moe.
 * Router: P.gate.weight [E, H]; gpt-oss, Llama-4: P.router.weight; Granite:
 * P.router.layer.weight (as released) or P.router.weight. DeepSeek-V3 adds
 * P.gate.e_score_correction_bias [E]; gpt-oss P.router.bias [E].
 * Experts, in one of these layouts:
 *  - per expert: P.experts.e.{gate_proj,up_proj,down_proj}.weight (Mixtral: w1, w3, w2), what
 *    save_pretrained writes by default for every family but gpt-oss, Llama-4 and Granite;
 *  - stacked output-major: P.experts.gate_up_proj [E, 2I, H] (gate rows first) and
 *    P.experts.down_proj [E, H, I], no ".weight" (transformers >= 5 in-memory names, written by
 *    save_pretrained(save_original_format=False); released Qwen3.5-MoE); Granite as released:
 *    P.input_linear.weight [E, 2I, H] and P.output_linear.weight [E, H, I];
 *  - stacked input-major: Llama-4 P.experts.gate_up_proj [E, H, 2I] (gate = the first I
 *    columns) and P.experts.down_proj [E, I, H]; gpt-oss (bf16) the same shapes with gate and
 *    up interleaved (gate = even columns) plus P.experts.gate_up_proj_bias [E, 2I] (interleaved
 *    too) and P.experts.down_proj_bias [E, H];
 *  - gpt-oss MXFP4 (as released; see below).
 * Shared expert: P.shared_expert.{gate,up,down}_proj.weight and P.shared_expert_gate.weight
 * [1, H] (Qwen2-MoE, Qwen3-Next, Qwen3.5: gated); P.shared_experts.* (DeepSeek: ungated,
 * I_s = n_shared_experts * moe_intermediate_size); P.shared_expert.* (Llama-4: ungated,
 * I_s = intermediate_size).
 * FP8 block checkpoints (DeepSeek-V3, Qwen3-*-FP8): config.json quantization_config =
 * {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic, weight_block_size: [bn, bk]};
 * per-expert layout only: each expert linear's P.experts.e.<proj>.weight is F8_E4M3 [out, in]
 * with P.experts.e.<proj>.weight_scale_inv F32 [ceil(out/bn), ceil(in/bk)], which MULTIPLIES
 * (w = q * s) despite its name: desc.quant becomes fp8 e4m3 BLOCK [bn, bk] for w13 and w2 and
 * the scale tensors are passed as the source's gate/up/down_scale. Router, norms and biases
 * stay bf16/f32; an fp8 shared expert (DeepSeek-V3 FP8) is dequantized to f32 at load (w = q * s,
 * lt->sh_deq, logged with its size) and runs in weight_dtype F32; otherwise weight_dtype is the
 * shared expert's dtype, or the router's without one.
 * compressed-tensors checkpoints (src/io/ckpt_quant.c) whose shared expert is quantized too
 * (llm-compressor does so unless `ignore` lists it): its linears are validated like the routed
 * experts' and dequantized to f32 at load ((v - z) * s or v * s, lt->sh_deq, logged with its
 * size); it runs in weight_dtype F32. Which way it is stored is read from the tensors and
 * checked against config_groups targets and ignore (moe_ckq_shared_check).
 * MXFP4 checkpoints (gpt-oss as released): config.json quantization_config = {quant_method:
 * mxfp4, modules_to_not_convert: [...]} (transformers' Mxfp4Config); per layer
 * P.experts.gate_up_proj_blocks U8 [E, 2I, H/32, 16], P.experts.gate_up_proj_scales U8
 * [E, 2I, H/32], P.experts.down_proj_blocks U8 [E, H, I/32, 16], P.experts.down_proj_scales U8
 * [E, H, I/32], plus the bf16 biases above. Per expert a *_blocks tensor is the output-major
 * codes [N, K/2] bytes (input 32 g + 2 b in the low nibble of byte b of group g, the next
 * input in the high nibble) and *_scales the E8M0 exponents [N, K/32], w = e2m1 * 2^(s - 127)
 * (transformers' integrations/mxfp4.py, convert_moe_packed_tensors, which writes row n of the
 * blocks into column n of the bf16 gate_up_proj [E, H, 2I]: so gate = even rows, up = odd
 * rows, like the bf16 columns). desc.quant becomes MXFP4 GROUP 32 for w13 and w2 (act NONE);
 * weight_dtype follows the router. A layer without *_blocks but with gate_up_proj (a
 * modules_to_not_convert layer) is read as bf16. H and I must be multiples of 32.
 * compressed-tensors checkpoints (quant_method "compressed-tensors": int4 / int8 experts):
 * read by src/io/ckpt_quant.c, called from cfg_quant and the per-expert lookup.
 * Llama-4 quantized per expert (compressed-tensors or fp8 block; llm-compressor's layout and
 * `moe quantize`'s): a layer without P.experts.gate_up_proj reads
 * P.experts.e.{gate,up,down}_proj.* through the per-expert path.
 * Every layout gives one moe_weight_source of pointers into the mapped files (strides for the
 * input-major ones): nothing is copied before moe_weights_create packs it, except MXFP4's
 * gate/up rows, which moe_weight_source takes row-major only: the local experts' gate_up
 * blocks and scales are copied apart (logged at INFO with their size) and freed once packed.
 */
#include "io/ckpt_ct.h"
#include "io/safetensors.h"
#include "quant/quant.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CK_NAME_LEN 256 /* a tensor name: prefix + at most ~60 characters */
#define CK_PREFIX_LEN 96 /* "language_model.model.layers.<int64>.feed_forward." */

/* One weight_map entry of a sharded checkpoint. */
typedef struct ck_map_entry {
    const char *tensor;         /* owned by moe_checkpoint.index_json */
    size_t file;                /* index into moe_checkpoint.files */
} ck_map_entry;

struct moe_checkpoint {
    moe_ctx *ctx;               /* borrowed */
    char *dir;
    char *config_path;          /* dir/config.json */
    char *index_path;           /* dir/model.safetensors.index.json; NULL for a single file */
    const char *cfg_prefix;     /* "" or "text_config." (static): where the fields were read */

    /* config.json */
    moe_family family;
    int64_t hidden_size;        /* H */
    int64_t num_layers;
    int64_t top_k;              /* K */
    int64_t intermediate;       /* I per expert */
    int64_t num_experts;        /* E */
    int64_t shared_intermediate;/* I_s, 0 = no shared expert */
    int shared_gated;
    int renormalize;
    moe_scoring scoring;
    float routed_scaling_factor;
    int64_t n_group, topk_group;/* 0: no group-limited selection */
    moe_group_score group_score;
    int has_selection_bias;     /* DeepSeek-V3 e_score_correction_bias */
    int has_router_bias;        /* gpt-oss router.bias */
    int has_expert_bias;        /* gpt-oss gate_up_proj_bias, down_proj_bias */
    int on_input;               /* Llama-4: routing weight on the expert input */
    moe_activation activation;
    float swiglu_alpha, swiglu_limit;
    int fp8;                    /* quantization_config quant_method fp8 (block scales) */
    int64_t fp8_bn, fp8_bk;     /* its weight_block_size [out, in] */
    int mxfp4;                  /* quantization_config quant_method mxfp4 (gpt-oss) */
    moe_ckq *ct;                /* quant_method compressed-tensors (src/io/ckpt_quant.c), or NULL */

    /* which layers are MoE */
    int64_t sparse_step;        /* Qwen decoder_sparse_step */
    int64_t *mlp_only;          /* [n_mlp_only] Qwen mlp_only_layers */
    size_t n_mlp_only;
    int64_t first_k_dense;      /* DeepSeek first_k_dense_replace */
    int64_t moe_layer_freq;     /* DeepSeek moe_layer_freq */
    int64_t *moe_layers;        /* [n_moe_layers] Llama-4 moe_layers, when given */
    size_t n_moe_layers;
    bool have_moe_layers;
    int64_t interleave_step;    /* Llama-4 interleave_moe_layer_step */

    /* files */
    size_t n_files;
    moe_safetensors **files;    /* [n_files] each distinct file, opened once */
    size_t n_map;
    ck_map_entry *map;          /* [n_map] weight_map sorted by tensor name; NULL if unsharded */
    json_t *index_json;         /* the parsed index, owner of map[].tensor */
};

/* The families read, by architecture class name and config model_type. */
static const struct {
    const char *arch;
    const char *model_type;
    moe_family family;
} ck_families[] = {
    {"MixtralForCausalLM", "mixtral", MOE_FAMILY_MIXTRAL},
    {"Qwen2MoeForCausalLM", "qwen2_moe", MOE_FAMILY_QWEN2_MOE},
    {"Qwen3MoeForCausalLM", "qwen3_moe", MOE_FAMILY_QWEN3_MOE},
    {"DeepseekV2ForCausalLM", "deepseek_v2", MOE_FAMILY_DEEPSEEK_V2},
    {"DeepseekV3ForCausalLM", "deepseek_v3", MOE_FAMILY_DEEPSEEK_V3},
    {"GptOssForCausalLM", "gpt_oss", MOE_FAMILY_GPT_OSS},
    {"Llama4ForConditionalGeneration", "llama4", MOE_FAMILY_LLAMA4},
    {"Llama4ForCausalLM", "llama4_text", MOE_FAMILY_LLAMA4},
    {"OlmoeForCausalLM", "olmoe", MOE_FAMILY_OLMOE},
    {"GraniteMoeForCausalLM", "granitemoe", MOE_FAMILY_GRANITE_MOE},
    {"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", MOE_FAMILY_QWEN3_5_MOE},
    {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", MOE_FAMILY_QWEN3_5_MOE},
    {"Qwen3NextForCausalLM", "qwen3_next", MOE_FAMILY_QWEN3_NEXT},
};
#define CK_N_FAMILIES (sizeof ck_families / sizeof ck_families[0])

/* Human name of a JSON value's type, for messages. */
static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* malloc'd "a/b". NULL on out of memory. */
static char *path_join(const char *a, const char *b)
{
    size_t len = strlen(a) + 1 + strlen(b) + 1;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/%s", a, b);
    return p;
}

/* 1 if `path` exists (as anything), 0 if not, -1 on another stat error (errno set). */
static int path_exists(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0)
        return 1;
    return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
}

/* Load a JSON file: MOE_ENOTFOUND when absent, MOE_EFORMAT for bad JSON or a non-object root,
 * MOE_EIO when unreadable. */
static moe_status load_json_object(moe_ctx *ctx, const char *path, json_t **out)
{
    *out = NULL;
    int ex = path_exists(path);
    if (ex == 0)
        return moe_set_error(ctx, MOE_ENOTFOUND, "%s: not found", path);
    if (ex < 0)
        return moe_set_error(ctx, MOE_EIO, "%s: cannot stat: %s", path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson reports unreadable files through the same error struct. */
        if (json_error_code(&jerr) == json_error_cannot_open_file)
            return moe_set_error(ctx, MOE_EIO, "%s: %s", path, jerr.text);
        return moe_set_error(ctx, MOE_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", path,
                             jerr.text, jerr.line, jerr.column);
    }
    if (!json_is_object(root)) {
        moe_status st = moe_set_error(ctx, MOE_EFORMAT, "%s: must be a JSON object, found %s",
                                      path, json_kind(root));
        json_decref(root);
        return st;
    }
    *out = root;
    return MOE_OK;
}

/* --------------------------------------------------------------------------------------
 * config.json
 * ------------------------------------------------------------------------------------ */

/* Read integer field `key` of config.json into *out and check *out >= min. An absent field
 * (or null) is MOE_ENOTFOUND when `required`, else takes `dflt`. */
static moe_status cfg_int(moe_checkpoint *ck, const json_t *cfg, const char *key, bool required,
                          int64_t dflt, int64_t min, int64_t *out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || (!required && json_is_null(v))) {
        if (required)
            return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: field '%s%s' is missing",
                                 ck->config_path, ck->cfg_prefix, key);
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_integer(v))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' must be an integer, found %s",
                             ck->config_path, ck->cfg_prefix, key, json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < min)
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' = %lld must be >= %lld",
                             ck->config_path, ck->cfg_prefix, key, (long long)x, (long long)min);
    *out = (int64_t)x;
    return MOE_OK;
}

/* Read required integer field `key`, or `alias` when `key` is absent: transformers maps one
 * name onto the other (Qwen3MoeConfig saves num_experts as num_local_experts since 5.x; Mixtral
 * accepts num_experts for num_local_experts). MOE_ENOTFOUND names both when neither is there. */
static moe_status cfg_int_alias(moe_checkpoint *ck, const json_t *cfg, const char *key,
                                const char *alias, int64_t min, int64_t *out)
{
    if (!json_object_get(cfg, key) && json_object_get(cfg, alias))
        return cfg_int(ck, cfg, alias, true, 0, min, out);
    if (!json_object_get(cfg, key))
        return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: field '%s%s' (or '%s%s') is missing",
                             ck->config_path, ck->cfg_prefix, key, ck->cfg_prefix, alias);
    return cfg_int(ck, cfg, key, true, 0, min, out);
}

/* Read optional boolean field `key` (absent or null: `dflt`). */
static moe_status cfg_bool(moe_checkpoint *ck, const json_t *cfg, const char *key, int dflt,
                           int *out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_boolean(v))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' must be true or false, found %s",
                             ck->config_path, ck->cfg_prefix, key, json_kind(v));
    *out = json_is_true(v) ? 1 : 0;
    return MOE_OK;
}

/* Read optional number field `key` (integer or real; absent or null: `dflt`); it must be
 * finite and > min_excl (when check_min). */
static moe_status cfg_float(moe_checkpoint *ck, const json_t *cfg, const char *key, double dflt,
                            bool check_min, double min_excl, float *out)
{
    const json_t *v = json_object_get(cfg, key);
    double x = dflt;
    if (v && !json_is_null(v)) {
        if (!json_is_number(v))
            return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' must be a number, found %s",
                                 ck->config_path, ck->cfg_prefix, key, json_kind(v));
        x = json_number_value(v);
    }
    if (!isfinite(x) || !isfinite((float)x) || (check_min && !(x > min_excl)))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' = %g must be finite%s", ck->config_path,
                             ck->cfg_prefix, key, x, check_min ? " and > 0" : "");
    *out = (float)x;
    return MOE_OK;
}

/* Read optional string field `key` (absent or null: `dflt`). */
static moe_status cfg_str(moe_checkpoint *ck, const json_t *cfg, const char *key, const char *dflt,
                          const char **out)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_string(v))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' must be a string, found %s",
                             ck->config_path, ck->cfg_prefix, key, json_kind(v));
    *out = json_string_value(v);
    return MOE_OK;
}

/* Read optional array of integers `key` into a malloc'd *out [*n]; absent or null: *present
 * = false, *out NULL. */
static moe_status cfg_int_list(moe_checkpoint *ck, const json_t *cfg, const char *key, int64_t **out,
                               size_t *n_out, bool *present)
{
    *out = NULL;
    *n_out = 0;
    *present = false;
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v))
        return MOE_OK;
    if (!json_is_array(v))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s' must be an array of integers, found %s",
                             ck->config_path, ck->cfg_prefix, key, json_kind(v));
    size_t n = json_array_size(v);
    int64_t *a = calloc(n ? n : 1, sizeof *a); /* [n] */
    if (!a)
        return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: out of memory", ck->config_path);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) {
            free(a);
            return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] must be an integer, found %s",
                                 ck->config_path, ck->cfg_prefix, key, i, json_kind(x));
        }
        a[i] = (int64_t)json_integer_value(x);
    }
    *out = a;
    *n_out = n;
    *present = true;
    return MOE_OK;
}

/* "A (a), B (b), ..." of every family, for messages. */
static const char *supported_list(void)
{
    static char buf[1024];
    if (buf[0])
        return buf;
    size_t used = 0;
    for (size_t i = 0; i < CK_N_FAMILIES && used < sizeof buf; i++)
        used += (size_t)snprintf(buf + used, sizeof buf - used, "%s%s (%s)", i ? ", " : "", ck_families[i].arch,
                                 ck_families[i].model_type);
    return buf;
}

/* Decide the family from "architectures"[0], falling back to "model_type" when the
 * architecture is absent or not one of ours (e.g. a *ForSequenceClassification head over the
 * same decoder). MOE_EUNSUPPORTED names both and lists the supported ones. */
static moe_status cfg_family(moe_checkpoint *ck, const json_t *cfg)
{
    const char *arch = NULL, *model_type = NULL;
    const json_t *archs = json_object_get(cfg, "architectures");
    if (archs && !json_is_null(archs)) {
        if (!json_is_array(archs))
            return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field 'architectures' must be an array, found %s",
                                 ck->config_path, json_kind(archs));
        if (json_array_size(archs) > 0) {
            const json_t *a0 = json_array_get(archs, 0);
            if (!json_is_string(a0))
                return moe_set_error(ck->ctx, MOE_EFORMAT,
                                     "%s: field 'architectures'[0] must be a string, found %s",
                                     ck->config_path, json_kind(a0));
            arch = json_string_value(a0);
        }
    }
    const json_t *mt = json_object_get(cfg, "model_type");
    if (mt && json_is_string(mt))
        model_type = json_string_value(mt);

    for (size_t i = 0; arch && i < CK_N_FAMILIES; i++) {
        if (strcmp(arch, ck_families[i].arch) == 0) {
            ck->family = ck_families[i].family;
            return MOE_OK;
        }
    }
    for (size_t i = 0; model_type && i < CK_N_FAMILIES; i++) {
        if (strcmp(model_type, ck_families[i].model_type) == 0) {
            ck->family = ck_families[i].family;
            if (arch)
                moe_log(ck->ctx, MOE_LOG_INFO,
                        "%s: architecture '%s' is not one libmoe knows; using model_type '%s'",
                        ck->config_path, arch, model_type);
            return MOE_OK;
        }
    }
    if (!arch && !model_type)
        return moe_set_error(ck->ctx, MOE_ENOTFOUND,
                             "%s: neither 'architectures' nor 'model_type' is given; supported: %s",
                             ck->config_path, supported_list());
    return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                         "%s: architecture '%s' (model_type '%s') is not supported; supported: %s",
                         ck->config_path, arch ? arch : "(none)", model_type ? model_type : "(none)",
                         supported_list());
}

/* The expert activation from config `hidden_act` (transformers' ACT2FN name; absent means the
 * config classes' default, silu). gpt-oss ignores hidden_act: its experts always run the
 * clamped SwiGLU with swiglu_alpha and swiglu_limit (GptOssExperts). */
static moe_status cfg_activation(moe_checkpoint *ck, const json_t *cfg)
{
    if (ck->family == MOE_FAMILY_GPT_OSS) {
        ck->activation = MOE_ACT_SWIGLU_OAI;
        moe_status st = cfg_float(ck, cfg, "swiglu_alpha", 1.702, false, 0.0, &ck->swiglu_alpha);
        if (st == MOE_OK)
            st = cfg_float(ck, cfg, "swiglu_limit", 7.0, true, 0.0, &ck->swiglu_limit);
        return st;
    }
    const char *a = NULL;
    moe_status st = cfg_str(ck, cfg, "hidden_act", "silu", &a);
    if (st != MOE_OK)
        return st;
    if (strcmp(a, "silu") == 0 || strcmp(a, "swish") == 0)
        ck->activation = MOE_ACT_SWIGLU;
    else if (strcmp(a, "gelu") == 0)
        ck->activation = MOE_ACT_GEGLU;
    else if (strcmp(a, "gelu_pytorch_tanh") == 0 || strcmp(a, "gelu_new") == 0)
        ck->activation = MOE_ACT_GEGLU_TANH;
    else
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%shidden_act' = \"%s\": libmoe's experts support silu / swish (SwiGLU), "
                             "gelu and gelu_pytorch_tanh / gelu_new (GEGLU)",
                             ck->config_path, ck->cfg_prefix, a);
    return MOE_OK;
}

/* Qwen's mlp_only_layers. */
static moe_status cfg_mlp_only(moe_checkpoint *ck, const json_t *cfg)
{
    bool present;
    return cfg_int_list(ck, cfg, "mlp_only_layers", &ck->mlp_only, &ck->n_mlp_only, &present);
}

/* DeepSeek-V2/V3 (DeepseekV2Config / DeepseekV3Config and the models' published
 * modeling_deepseek.py; the defaults are the config classes'). */
static moe_status cfg_deepseek(moe_checkpoint *ck, const json_t *cfg)
{
    const bool v3 = ck->family == MOE_FAMILY_DEEPSEEK_V3;
    moe_status st;
    int64_t n_shared = 0;
    const char *scoring = NULL, *method = NULL;
    int norm = 0;
    if ((st = cfg_int(ck, cfg, "moe_intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
        (st = cfg_int_alias(ck, cfg, "n_routed_experts", v3 ? "num_local_experts" : "num_experts", 0,
                            &ck->num_experts)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "n_shared_experts", false, 0, 0, &n_shared)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "first_k_dense_replace", false, v3 ? 3 : 0, 0, &ck->first_k_dense)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "moe_layer_freq", false, 1, 1, &ck->moe_layer_freq)) != MOE_OK ||
        (st = cfg_float(ck, cfg, "routed_scaling_factor", v3 ? 2.5 : 1.0, true, 0.0, &ck->routed_scaling_factor)) !=
            MOE_OK ||
        (st = cfg_bool(ck, cfg, "norm_topk_prob", v3 ? 1 : 0, &norm)) != MOE_OK ||
        (st = cfg_str(ck, cfg, "scoring_func", v3 ? "sigmoid" : "softmax", &scoring)) != MOE_OK ||
        (st = cfg_str(ck, cfg, "topk_method", v3 ? "noaux_tc" : "greedy", &method)) != MOE_OK)
        return st;
    /* n_shared_experts: the class default (V2 2, V3 1) when absent; null means none, as the
     * published code's "if config.n_shared_experts is not None" */
    const json_t *ns = json_object_get(cfg, "n_shared_experts");
    if (!ns)
        n_shared = v3 ? 1 : 2;
    ck->shared_intermediate = n_shared * ck->intermediate;
    ck->shared_gated = 0;
    /* DeepSeek's MoE layers have a gate of their own; scoring_func / topk_method pick it. */
    if (v3) {
        if (strcmp(scoring, "sigmoid") != 0)
            return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%sscoring_func' = \"%s\": DeepSeek-V3 routes with \"sigmoid\" only "
                                 "(DeepseekV3TopkRouter)",
                                 ck->config_path, ck->cfg_prefix, scoring);
        if (strcmp(method, "noaux_tc") != 0)
            return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%stopk_method' = \"%s\": DeepSeek-V3 selects with \"noaux_tc\" only",
                                 ck->config_path, ck->cfg_prefix, method);
        ck->scoring = MOE_SCORING_SIGMOID;
        ck->has_selection_bias = 1;
        ck->renormalize = norm;
        ck->group_score = MOE_GROUP_SCORE_TOP2_SUM;
        if ((st = cfg_int(ck, cfg, "n_group", false, 8, 1, &ck->n_group)) != MOE_OK ||
            (st = cfg_int(ck, cfg, "topk_group", false, 4, 1, &ck->topk_group)) != MOE_OK)
            return st;
    } else {
        if (strcmp(scoring, "softmax") != 0)
            return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%sscoring_func' = \"%s\": DeepSeek-V2 routes with \"softmax\" only",
                                 ck->config_path, ck->cfg_prefix, scoring);
        ck->scoring = MOE_SCORING_SOFTMAX;
        /* transformers' DeepseekV2TopkRouter never renormalizes (the published code does when
         * norm_topk_prob, and then skips routed_scaling_factor; every released V2 has false) */
        ck->renormalize = 0;
        if (norm)
            moe_log(ck->ctx, MOE_LOG_WARN,
                    "%s: '%snorm_topk_prob' is true; ignored, as transformers' DeepSeek-V2 router does "
                    "(weights are the softmax scores times routed_scaling_factor)",
                    ck->config_path, ck->cfg_prefix);
        if (strcmp(method, "group_limited_greedy") == 0) {
            ck->group_score = MOE_GROUP_SCORE_MAX;
            if ((st = cfg_int(ck, cfg, "n_group", true, 0, 1, &ck->n_group)) != MOE_OK ||
                (st = cfg_int(ck, cfg, "topk_group", true, 0, 1, &ck->topk_group)) != MOE_OK)
                return st;
        } else if (strcmp(method, "greedy") != 0) {
            return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%stopk_method' = \"%s\": DeepSeek-V2 selects with \"greedy\" or "
                                 "\"group_limited_greedy\"",
                                 ck->config_path, ck->cfg_prefix, method);
        }
    }
    if (ck->n_group > 1 && ck->num_experts > 0) {
        const int64_t E = ck->num_experts, G = ck->n_group;
        if (E % G != 0)
            return moe_set_error(ck->ctx, MOE_EFORMAT,
                                 "%s: field '%sn_routed_experts' = %" PRId64 " is not a multiple of 'n_group' = %" PRId64,
                                 ck->config_path, ck->cfg_prefix, E, G);
        if (ck->topk_group > G || ck->topk_group * (E / G) < ck->top_k)
            return moe_set_error(ck->ctx, MOE_EFORMAT,
                                 "%s: field '%stopk_group' = %" PRId64 ": must be <= n_group = %" PRId64
                                 " and keep at least num_experts_per_tok = %" PRId64 " experts (%" PRId64
                                 " per group)",
                                 ck->config_path, ck->cfg_prefix, ck->topk_group, G, ck->top_k, E / G);
    }
    return MOE_OK;
}

/* Parse every field libmoe needs from config.json (or its text_config) into ck. */
/* quantization_config (top level, else in text_config). quant_method "fp8" (FP8 block
 * checkpoints) and "mxfp4" (gpt-oss) are read here, see the file comment; other methods are
 * left to the tensor checks. */
static moe_status cfg_quant(moe_checkpoint *ck, const json_t *root, const json_t *cfg)
{
    const char *qpre = "";
    const json_t *qc = json_object_get(root, "quantization_config");
    if ((!qc || json_is_null(qc)) && cfg != root) {
        qc = json_object_get(cfg, "quantization_config");
        qpre = ck->cfg_prefix;
    }
    if (!qc || json_is_null(qc))
        return MOE_OK;
    if (!json_is_object(qc))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%squantization_config' must be an object, found %s",
                             ck->config_path, qpre, json_kind(qc));
    const json_t *m = json_object_get(qc, "quant_method");
    if (m && json_is_string(m) && strcmp(json_string_value(m), "mxfp4") == 0) {
        /* transformers' Mxfp4Config: {quant_method, modules_to_not_convert}; which layers are
         * quantized is read from the tensors (*_blocks present or not), so a layer named in
         * modules_to_not_convert and saved in bf16 loads as bf16. */
        if (ck->family != MOE_FAMILY_GPT_OSS)
            return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%squantization_config.quant_method' = mxfp4: MXFP4 checkpoints are "
                                 "read for gpt-oss only (GptOssForCausalLM), not %s",
                                 ck->config_path, qpre, moe_family_name(ck->family));
        ck->mxfp4 = 1;
        moe_log(ck->ctx, MOE_LOG_INFO,
                "%s: MXFP4 checkpoint (e2m1 codes, one E8M0 scale per 32 inputs): routed experts run "
                "weight-only (mxfp4) with f32 activations",
                ck->config_path);
        return MOE_OK;
    }
    if (m && json_is_string(m) && strcmp(json_string_value(m), "compressed-tensors") == 0)
        return moe_ckq_parse(ck->ctx, ck->config_path, qpre, qc, &ck->ct);
    if (!m || json_is_null(m))
        return MOE_OK; /* no method: nothing quantized */
    if (!json_is_string(m) || strcmp(json_string_value(m), "fp8") != 0)
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.quant_method' = '%s': libmoe reads fp8 (block), mxfp4 "
                             "(gpt-oss) and compressed-tensors (int8 / int4) checkpoints; dequantize this one to "
                             "bf16 first or convert a bf16 checkpoint with moe quantize",
                             ck->config_path, qpre, json_is_string(m) ? json_string_value(m) : json_kind(m));
    const json_t *fmt = json_object_get(qc, "fmt");
    if (fmt && !json_is_null(fmt) && (!json_is_string(fmt) || strcmp(json_string_value(fmt), "e4m3") != 0))
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.fmt' = %s: only e4m3 FP8 checkpoints are supported",
                             ck->config_path, qpre, json_is_string(fmt) ? json_string_value(fmt) : json_kind(fmt));
    const json_t *as = json_object_get(qc, "activation_scheme");
    if (as && !json_is_null(as) && (!json_is_string(as) || strcmp(json_string_value(as), "dynamic") != 0))
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.activation_scheme' = %s: only dynamic is supported",
                             ck->config_path, qpre, json_is_string(as) ? json_string_value(as) : json_kind(as));
    const json_t *bs = json_object_get(qc, "weight_block_size");
    if (!bs || json_is_null(bs))
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%squantization_config.weight_block_size' is absent: only FP8 block "
                             "checkpoints (weight_block_size [bn, bk]) are supported, not per-tensor FP8",
                             ck->config_path, qpre);
    int64_t b[2] = {0, 0};
    bool ok = json_is_array(bs) && json_array_size(bs) == 2;
    for (size_t i = 0; ok && i < 2; i++) {
        const json_t *x = json_array_get(bs, i);
        ok = json_is_integer(x) && json_integer_value(x) >= 1 && json_integer_value(x) <= ((json_int_t)1 << 20);
        if (ok)
            b[i] = (int64_t)json_integer_value(x);
    }
    if (!ok)
        return moe_set_error(ck->ctx, MOE_EFORMAT,
                             "%s: field '%squantization_config.weight_block_size' must be [bn, bk], two integers "
                             "in 1..1048576",
                             ck->config_path, qpre);
    ck->fp8 = 1;
    ck->fp8_bn = b[0];
    ck->fp8_bk = b[1];
    /* The checkpoint's dynamic activation scheme (e4m3 activations, one scale per token per
     * bk channels) is run weight-only: f32 activations times the exactly dequantized weights,
     * which is more exact than the fp8 x fp8 products the model was served with. */
    moe_log(ck->ctx, MOE_LOG_INFO,
            "%s: FP8 block checkpoint (e4m3, %" PRId64 "x%" PRId64 " blocks): routed experts run weight-only "
            "(fp8-block); the checkpoint's dynamic activation scheme is run with f32 activations, which is "
            "more exact",
            ck->config_path, b[0], b[1]);
    return MOE_OK;
}

static moe_status parse_config(moe_checkpoint *ck, const json_t *root)
{
    moe_status st = cfg_family(ck, root);
    if (st != MOE_OK)
        return st;
    const json_t *cfg = root;
    const json_t *tc = json_object_get(root, "text_config");
    ck->cfg_prefix = "";
    if (tc && json_is_object(tc) &&
        (ck->family == MOE_FAMILY_LLAMA4 || ck->family == MOE_FAMILY_QWEN3_5_MOE)) {
        cfg = tc;
        ck->cfg_prefix = "text_config.";
    }
    if ((st = cfg_int(ck, cfg, "hidden_size", true, 0, 1, &ck->hidden_size)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "num_hidden_layers", true, 0, 1, &ck->num_layers)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "num_experts_per_tok", true, 0, 1, &ck->top_k)) != MOE_OK)
        return st;

    /* defaults: softmax, no renormalize, scale 1, no groups or biases, every layer MoE */
    ck->scoring = MOE_SCORING_SOFTMAX;
    ck->routed_scaling_factor = 1.0f;
    ck->group_score = MOE_GROUP_SCORE_MAX;
    ck->swiglu_alpha = 1.702f;
    ck->swiglu_limit = 7.0f;
    ck->sparse_step = 1;
    ck->moe_layer_freq = 1;
    ck->interleave_step = 1;

    switch (ck->family) {
    case MOE_FAMILY_MIXTRAL:
        if ((st = cfg_int(ck, cfg, "intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_local_experts", "num_experts", 1, &ck->num_experts)) != MOE_OK)
            return st;
        ck->renormalize = 1; /* Mixtral always renormalizes the top-k weights */
        break;
    case MOE_FAMILY_QWEN2_MOE:
    case MOE_FAMILY_QWEN3_MOE:
    case MOE_FAMILY_QWEN3_NEXT:
        /* defaults as transformers' config classes set them (Qwen3-Next: norm_topk_prob true) */
        if ((st = cfg_int(ck, cfg, "moe_intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_experts", "num_local_experts", 0, &ck->num_experts)) != MOE_OK ||
            (st = cfg_bool(ck, cfg, "norm_topk_prob", ck->family == MOE_FAMILY_QWEN3_NEXT, &ck->renormalize)) !=
                MOE_OK ||
            (st = cfg_int(ck, cfg, "decoder_sparse_step", false, 1, 1, &ck->sparse_step)) != MOE_OK ||
            (st = cfg_mlp_only(ck, cfg)) != MOE_OK)
            return st;
        if (ck->family != MOE_FAMILY_QWEN3_MOE) {
            if ((st = cfg_int(ck, cfg, "shared_expert_intermediate_size", true, 0, 0, &ck->shared_intermediate)) !=
                MOE_OK)
                return st;
            ck->shared_gated = ck->shared_intermediate > 0;
        }
        break;
    case MOE_FAMILY_QWEN3_5_MOE:
        /* Qwen3_5MoeTopKRouter always renormalizes; every layer is MoE with a gated shared expert */
        if ((st = cfg_int(ck, cfg, "moe_intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_experts", "num_local_experts", 1, &ck->num_experts)) != MOE_OK ||
            (st = cfg_int(ck, cfg, "shared_expert_intermediate_size", true, 0, 0, &ck->shared_intermediate)) != MOE_OK)
            return st;
        ck->renormalize = 1;
        ck->shared_gated = ck->shared_intermediate > 0;
        break;
    case MOE_FAMILY_OLMOE:
        if ((st = cfg_int(ck, cfg, "intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_experts", "num_local_experts", 1, &ck->num_experts)) != MOE_OK ||
            (st = cfg_bool(ck, cfg, "norm_topk_prob", 0, &ck->renormalize)) != MOE_OK)
            return st;
        break;
    case MOE_FAMILY_GRANITE_MOE:
        /* GraniteMoeTopKRouter: top-k on the logits, softmax over the k */
        if ((st = cfg_int(ck, cfg, "intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_local_experts", "num_experts", 1, &ck->num_experts)) != MOE_OK)
            return st;
        ck->scoring = MOE_SCORING_TOPK_SOFTMAX;
        break;
    case MOE_FAMILY_GPT_OSS:
        /* GptOssTopKRouter: top-k on l = Wr x + b, softmax over the k; biased clamped experts */
        if ((st = cfg_int(ck, cfg, "intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_local_experts", "num_experts", 1, &ck->num_experts)) != MOE_OK)
            return st;
        ck->scoring = MOE_SCORING_TOPK_SOFTMAX;
        ck->has_router_bias = 1;
        ck->has_expert_bias = 1;
        break;
    case MOE_FAMILY_LLAMA4: {
        /* Llama4Router: top-k on the logits, sigmoid of the selected; Llama4TextMoe scales the
         * expert input and adds the ungated shared expert (intermediate_size) */
        bool present;
        if ((st = cfg_int(ck, cfg, "intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_local_experts", "num_experts", 1, &ck->num_experts)) != MOE_OK ||
            (st = cfg_int(ck, cfg, "interleave_moe_layer_step", false, 1, 1, &ck->interleave_step)) != MOE_OK ||
            (st = cfg_int_list(ck, cfg, "moe_layers", &ck->moe_layers, &ck->n_moe_layers, &present)) != MOE_OK)
            return st;
        ck->have_moe_layers = present;
        ck->scoring = MOE_SCORING_TOPK_SIGMOID;
        ck->on_input = 1;
        ck->shared_intermediate = ck->intermediate;
        break;
    }
    case MOE_FAMILY_DEEPSEEK_V2:
    case MOE_FAMILY_DEEPSEEK_V3:
        if ((st = cfg_deepseek(ck, cfg)) != MOE_OK)
            return st;
        break;
    default:
        break;
    }
    if ((st = cfg_activation(ck, cfg)) != MOE_OK || (st = cfg_quant(ck, root, cfg)) != MOE_OK)
        return st;
    if (ck->num_experts > 0 && ck->top_k > ck->num_experts)
        return moe_set_error(ck->ctx, MOE_EFORMAT,
                             "%s: field '%snum_experts_per_tok' = %" PRId64 " exceeds the %" PRId64
                             " experts",
                             ck->config_path, ck->cfg_prefix, ck->top_k, ck->num_experts);
    return MOE_OK;
}

/* --------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------ */

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_map_entry(const void *a, const void *b)
{
    const ck_map_entry *x = a, *y = b;
    return strcmp(x->tensor, y->tensor);
}

/* Open dir/<name> as the checkpoint's next file. A missing file is MOE_ENOTFOUND, saying
 * which index listed it when `listed_by` is not NULL. */
static moe_status open_file(moe_checkpoint *ck, const char *name, const char *listed_by)
{
    char *path = path_join(ck->dir, name);
    if (!path)
        return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: out of memory", ck->dir);
    moe_status st;
    if (path_exists(path) == 0) {
        if (listed_by)
            st = moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: not found (shard listed in %s)", path,
                               listed_by);
        else
            st = moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: not found", path);
    } else {
        st = moe_safetensors_open(ck->ctx, path, &ck->files[ck->n_files]);
        if (st == MOE_OK)
            ck->n_files++;
    }
    free(path);
    return st;
}

/* Read model.safetensors.index.json: open each distinct shard once and build the sorted
 * weight_map. */
static moe_status open_sharded(moe_checkpoint *ck)
{
    moe_status st = load_json_object(ck->ctx, ck->index_path, &ck->index_json);
    if (st != MOE_OK)
        return st;
    const json_t *wm = json_object_get(ck->index_json, "weight_map");
    if (!wm)
        return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: field 'weight_map' is missing",
                             ck->index_path);
    if (!json_is_object(wm))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field 'weight_map' must be an object, found %s",
                             ck->index_path, json_kind(wm));

    size_t n = json_object_size(wm);
    ck->map = calloc(n ? n : 1, sizeof *ck->map);               /* [n] */
    const char **shards = calloc(n ? n : 1, sizeof *shards);    /* [n] shard name per entry */
    if (!ck->map || !shards) {
        free(shards);
        return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: out of memory", ck->index_path);
    }
    size_t i = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val) {
        if (!json_is_string(val)) {
            free(shards);
            return moe_set_error(ck->ctx, MOE_EFORMAT,
                                 "%s: weight_map entry '%s' must be a file name string, found %s",
                                 ck->index_path, key, json_kind(val));
        }
        const char *file = json_string_value(val);
        if (file[0] == '\0' || strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0) {
            free(shards);
            return moe_set_error(ck->ctx, MOE_EFORMAT,
                                 "%s: weight_map entry '%s': shard '%s' is not a plain file name in the checkpoint folder",
                                 ck->index_path, key, file);
        }
        ck->map[i].tensor = key;
        shards[i] = file;
        i++;
    }
    ck->n_map = n;

    /* Distinct shard names, sorted: each is opened once. */
    const char **distinct = calloc(n ? n : 1, sizeof *distinct); /* [n_distinct <= n] */
    if (!distinct) {
        free(shards);
        return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: out of memory", ck->index_path);
    }
    memcpy(distinct, shards, n * sizeof *shards);
    qsort(distinct, n, sizeof *distinct, cmp_str_ptr);
    size_t n_distinct = 0;
    for (size_t k = 0; k < n; k++) {
        if (n_distinct == 0 || strcmp(distinct[n_distinct - 1], distinct[k]) != 0)
            distinct[n_distinct++] = distinct[k];
    }
    for (size_t k = 0; k < n; k++) {
        const char **hit = bsearch(&shards[k], distinct, n_distinct, sizeof *distinct, cmp_str_ptr);
        ck->map[k].file = (size_t)(hit - distinct);
    }
    free(shards);

    ck->files = calloc(n_distinct ? n_distinct : 1, sizeof *ck->files); /* [n_distinct] */
    if (!ck->files) {
        free(distinct);
        return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: out of memory", ck->index_path);
    }
    for (size_t k = 0; k < n_distinct; k++) {
        st = open_file(ck, distinct[k], ck->index_path);
        if (st != MOE_OK) {
            free(distinct);
            return st;
        }
    }
    free(distinct);
    qsort(ck->map, ck->n_map, sizeof *ck->map, cmp_map_entry);
    return MOE_OK;
}

void moe_checkpoint_free(moe_checkpoint *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->n_files; i++)
        moe_safetensors_free(ck->files[i]);
    free(ck->files);
    free(ck->map);
    json_decref(ck->index_json);
    free(ck->mlp_only);
    free(ck->moe_layers);
    moe_ckq_free(ck->ct);
    free(ck->index_path);
    free(ck->config_path);
    free(ck->dir);
    free(ck);
}

moe_status moe_checkpoint_open(moe_ctx *ctx, const char *dir, moe_checkpoint **out)
{
    if (!out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_checkpoint_open: out is NULL");
    *out = NULL;
    if (!dir)
        return moe_set_error(ctx, MOE_EINVAL, "moe_checkpoint_open: dir is NULL");
    struct stat dst;
    if (stat(dir, &dst) != 0)
        return moe_set_error(ctx, MOE_ENOTFOUND, "%s: checkpoint folder does not exist (%s)", dir, strerror(errno));
    if (!S_ISDIR(dst.st_mode))
        return moe_set_error(ctx, MOE_EINVAL, "%s: not a folder (a checkpoint is a folder with config.json)", dir);

    moe_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    ck->ctx = ctx;
    ck->dir = strdup(dir);
    ck->config_path = path_join(dir, "config.json");
    if (!ck->dir || !ck->config_path) {
        moe_checkpoint_free(ck);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    }

    json_t *cfg = NULL;
    moe_status st = load_json_object(ctx, ck->config_path, &cfg);
    if (st == MOE_OK) {
        st = parse_config(ck, cfg);
        json_decref(cfg);
    }
    if (st != MOE_OK) {
        moe_checkpoint_free(ck);
        return st;
    }

    /* Weights: model.safetensors first (as transformers looks), else the sharded index. */
    char *single = path_join(dir, "model.safetensors");
    ck->index_path = path_join(dir, "model.safetensors.index.json");
    if (!single || !ck->index_path) {
        free(single);
        moe_checkpoint_free(ck);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    }
    if (path_exists(single) == 1) {
        free(ck->index_path);
        ck->index_path = NULL;
        ck->files = calloc(1, sizeof *ck->files);
        st = ck->files ? open_file(ck, "model.safetensors", NULL)
                       : moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    } else if (path_exists(ck->index_path) == 1) {
        st = open_sharded(ck);
    } else {
        st = moe_set_error(ctx, MOE_ENOTFOUND,
                           "%s: neither model.safetensors nor model.safetensors.index.json found",
                           dir);
    }
    free(single);
    if (st != MOE_OK) {
        moe_checkpoint_free(ck);
        return st;
    }
    moe_log(ctx, MOE_LOG_INFO,
            "%s: %s, %" PRId64 " layers, H=%" PRId64 " I=%" PRId64 " E=%" PRId64 " K=%" PRId64
            ", %zu safetensors file(s)",
            dir, moe_family_name(ck->family), ck->num_layers, ck->hidden_size, ck->intermediate,
            ck->num_experts, ck->top_k, ck->n_files);
    *out = ck;
    return MOE_OK;
}

moe_family moe_checkpoint_family(const moe_checkpoint *ck)
{
    return ck ? ck->family : MOE_FAMILY_CUSTOM;
}

int64_t moe_checkpoint_num_layers(const moe_checkpoint *ck)
{
    return ck ? ck->num_layers : 0;
}

/* 1 if `layer` is listed in mlp_only_layers. */
static int in_mlp_only(const moe_checkpoint *ck, int64_t layer)
{
    for (size_t i = 0; i < ck->n_mlp_only; i++)
        if (ck->mlp_only[i] == layer)
            return 1;
    return 0;
}

/* 1 if `layer` is listed in Llama-4's moe_layers. */
static int in_moe_layers(const moe_checkpoint *ck, int64_t layer)
{
    for (size_t i = 0; i < ck->n_moe_layers; i++)
        if (ck->moe_layers[i] == layer)
            return 1;
    return 0;
}

int moe_checkpoint_is_moe_layer(const moe_checkpoint *ck, int64_t layer)
{
    if (!ck || layer < 0 || layer >= ck->num_layers || ck->num_experts <= 0)
        return 0;
    switch (ck->family) {
    case MOE_FAMILY_QWEN2_MOE:
    case MOE_FAMILY_QWEN3_MOE:
    case MOE_FAMILY_QWEN3_NEXT:
        return !in_mlp_only(ck, layer) && (layer + 1) % ck->sparse_step == 0;
    case MOE_FAMILY_DEEPSEEK_V2:
    case MOE_FAMILY_DEEPSEEK_V3:
        /* the published code's rule; transformers has no moe_layer_freq (released configs: 1) */
        return layer >= ck->first_k_dense && layer % ck->moe_layer_freq == 0;
    case MOE_FAMILY_LLAMA4:
        /* Llama4TextConfig: moe_layers, else range(step - 1, L, step) */
        if (ck->have_moe_layers)
            return in_moe_layers(ck, layer);
        return (layer + 1) % ck->interleave_step == 0;
    default:
        return 1; /* Mixtral, OLMoE, Granite, gpt-oss, Qwen3.5: every layer */
    }
}

/* --------------------------------------------------------------------------------------
 * Tensor lookup
 * ------------------------------------------------------------------------------------ */

/* The file holding tensor `name`, or NULL. Silent. With an index, a tensor whose weight_map
 * entry points at a shard that lacks it still gives that shard (ck_get reports it). */
static const moe_safetensors *ck_file_of(const moe_checkpoint *ck, const char *name)
{
    if (!ck->map)
        return ck->n_files ? ck->files[0] : NULL;
    ck_map_entry key = {name, 0};
    const ck_map_entry *hit = bsearch(&key, ck->map, ck->n_map, sizeof *ck->map, cmp_map_entry);
    return hit ? ck->files[hit->file] : NULL;
}

/* true if the checkpoint lists tensor `name` (in weight_map, or in the single file). */
static bool ck_has(const moe_checkpoint *ck, const char *name)
{
    const moe_safetensors *f = ck_file_of(ck, name);
    if (!f)
        return false;
    return ck->map ? true : moe_st_find(f, name) >= 0;
}

/* Find tensor `name`: fills *info and *path (its file). MOE_ENOTFOUND names the file (or the
 * index) and the tensor; MOE_EFORMAT when the index maps it to a shard without it. */
static moe_status ck_get(moe_checkpoint *ck, const char *name, moe_tensor_info *info,
                         const char **path)
{
    const moe_safetensors *f = ck_file_of(ck, name);
    if (!f) {
        if (ck->map)
            return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found in weight_map",
                                 ck->index_path, name);
        return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found", ck->dir, name);
    }
    long i = moe_st_find(f, name);
    if (i < 0) {
        if (ck->map)
            return moe_set_error(ck->ctx, MOE_EFORMAT,
                                 "%s: tensor '%s' is mapped by %s to this shard, which does not contain it",
                                 moe_st_path(f), name, ck->index_path);
        return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found", moe_st_path(f),
                             name);
    }
    *path = moe_st_path(f);
    return moe_safetensors_at(f, (size_t)i, info);
}

/* moe_ckq_lookup callbacks (u = the checkpoint). */
static bool ckq_has(void *u, const char *name)
{
    return ck_has(u, name);
}

static moe_status ckq_get(void *u, const char *name, moe_tensor_info *info, const char **path)
{
    return ck_get(u, name, info, path);
}

/* --------------------------------------------------------------------------------------
 * Layers
 * ------------------------------------------------------------------------------------ */

/* Everything one MoE layer needs, resolved and checked against config.json. */
typedef struct ck_layer {
    moe_tensor_info router;     /* [E, H] */
    bool have_weight_dtype;
    moe_dtype weight_dtype;     /* of every expert and shared-expert tensor */
    char weight_dtype_from[CK_NAME_LEN]; /* the tensor that set weight_dtype */
    const void **gate;          /* [E] pointers, each [I, H] (or strided) */
    const void **up;            /* [E] pointers, each [I, H] (or strided) */
    const void **down;          /* [E] pointers, each [H, I] (or strided) */
    const void **gate_scale;    /* FP8: [E] pointers, each F32 [ceil(I/bn), ceil(H/bk)];
                                   MXFP4: each U8 E8M0 [I, H/32] */
    const void **up_scale;      /* FP8, MXFP4: the same */
    const void **down_scale;    /* FP8: [E] pointers, each F32 [ceil(H/bn), ceil(I/bk)];
                                   MXFP4: each U8 E8M0 [H, I/32] */
    bool mxfp4;                 /* gpt-oss MXFP4 experts (*_blocks / *_scales) */
    const uint8_t *gu_blocks;   /* MXFP4: gate_up_proj_blocks [E, 2I, H/32, 16], gate = even rows */
    const uint8_t *gu_scales;   /* MXFP4: gate_up_proj_scales [E, 2I, H/32] */
    float *sh_deq;              /* FP8 shared expert, when loading: gate [I_s, H], up [I_s, H],
                                   down [H, I_s] dequantized to f32 (w = q * s rounded
                                   once); NULL otherwise */
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
    moe_tensor_info router_bias;/* gpt-oss [E] */
    moe_tensor_info sel_bias;   /* DeepSeek-V3 [E] */
    const void **gate_bias;     /* gpt-oss: [E] pointers into gate_up_proj_bias, stride 2 */
    const void **up_bias;
    const void **down_bias;     /* [E] pointers into down_proj_bias */
    moe_dtype expert_bias_dtype;
    int64_t e_lo, e_hi;         /* the experts resolved: [e_lo, e_hi); the others' pointers stay
                                   NULL (a parallel plan's rank reads only its own experts) */
    moe_ckq_layer *ckq;         /* compressed-tensors experts' scales / zero points, or NULL */
} ck_layer;

static void ck_layer_free(ck_layer *lt)
{
    free(lt->gate);
    free(lt->up);
    free(lt->down);
    free(lt->gate_scale);
    free(lt->up_scale);
    free(lt->down_scale);
    free(lt->gate_bias);
    free(lt->up_bias);
    free(lt->down_bias);
    free(lt->gu_split);
    free(lt->sh_deq);
    moe_ckq_layer_free(lt->ckq);
}

/* MOE_ERANGE for a layer outside [0, L), MOE_EDENSE (with the reason and a few MoE layers)
 * for a dense one. */
static moe_status check_layer_index(moe_checkpoint *ck, int64_t layer)
{
    if (layer < 0 || layer >= ck->num_layers)
        return moe_set_error(ck->ctx, MOE_ERANGE,
                             "%s: layer %" PRId64 " out of range: num_hidden_layers is %" PRId64
                             ", valid layers are 0..%" PRId64,
                             ck->config_path, layer, ck->num_layers, ck->num_layers - 1);
    if (moe_checkpoint_is_moe_layer(ck, layer))
        return MOE_OK;

    char why[200];
    const char *pre = ck->cfg_prefix;
    if (ck->num_experts == 0)
        snprintf(why, sizeof why, "%s%s is 0", pre,
                 ck->family == MOE_FAMILY_DEEPSEEK_V2 || ck->family == MOE_FAMILY_DEEPSEEK_V3 ? "n_routed_experts"
                                                                                          : "num_experts");
    else if (ck->family == MOE_FAMILY_DEEPSEEK_V2 || ck->family == MOE_FAMILY_DEEPSEEK_V3)
        snprintf(why, sizeof why,
                 layer < ck->first_k_dense ? "layer %" PRId64 " < %sfirst_k_dense_replace = %" PRId64
                                           : "layer %" PRId64 " %% %smoe_layer_freq = %" PRId64 " != 0",
                 layer, pre, layer < ck->first_k_dense ? ck->first_k_dense : ck->moe_layer_freq);
    else if (ck->family == MOE_FAMILY_LLAMA4 && ck->have_moe_layers)
        snprintf(why, sizeof why, "it is not listed in %smoe_layers", pre);
    else if (ck->family == MOE_FAMILY_LLAMA4)
        snprintf(why, sizeof why,
                 "(layer + 1) %% %sinterleave_moe_layer_step = (%" PRId64 " + 1) %% %" PRId64 " != 0", pre, layer,
                 ck->interleave_step);
    else if (in_mlp_only(ck, layer))
        snprintf(why, sizeof why, "it is listed in %smlp_only_layers", pre);
    else
        snprintf(why, sizeof why,
                 "(layer + 1) %% %sdecoder_sparse_step = (%" PRId64 " + 1) %% %" PRId64 " != 0", pre, layer,
                 ck->sparse_step);

    /* The first few MoE layers, so the user sees what to ask for instead. */
    char list[160] = "";
    size_t used = 0, shown = 0, total = 0;
    for (int64_t l = 0; l < ck->num_layers; l++) {
        if (!moe_checkpoint_is_moe_layer(ck, l))
            continue;
        total++;
        if (shown < 8 && used < sizeof list) {
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%" PRId64, shown ? ", " : "", l);
            shown++;
        }
    }
    if (total > shown && used < sizeof list)
        snprintf(list + used, sizeof list - used, ", ...");
    if (total == 0)
        return moe_set_error(ck->ctx, MOE_EDENSE,
                             "%s: layer %" PRId64 " is a dense MLP layer, not an MoE layer: %s; the model has no MoE layers",
                             ck->config_path, layer, why);
    return moe_set_error(ck->ctx, MOE_EDENSE,
                         "%s: layer %" PRId64 " is a dense MLP layer, not an MoE layer: %s; MoE layers (%zu): %s",
                         ck->config_path, layer, why, total, list);
}

/* ESHAPE unless `info` has shape `want` [ndim]; `label` spells it in config terms ("[I, H]"). */
static moe_status check_shape(moe_checkpoint *ck, const char *path, const moe_tensor_info *info,
                              const char *label, int ndim, const int64_t *want)
{
    bool ok = info->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = info->shape[d] == want[d];
    if (ok)
        return MOE_OK;
    char want_s[128], got_s[128];
    return moe_set_error(ck->ctx, MOE_ESHAPE,
                         "%s: tensor '%s': shape disagrees with config.json (expected %s = %s, found %s)",
                         path, info->name, label, moe_io_format_shape(want_s, sizeof want_s, ndim, want),
                         moe_io_format_shape(got_s, sizeof got_s, info->ndim, info->shape));
}

/* true for the dtypes weights and routers may have. */
static bool is_float_weight_dtype(moe_dtype dt)
{
    return dt == MOE_DTYPE_F32 || dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16;
}

/* Look up an expert or shared-expert weight `name`, check its dtype (the first one seen sets
 * the layer's weight dtype; every other must agree) and its shape. */
static moe_status get_weight(moe_checkpoint *ck, ck_layer *lt, const char *name, const char *label,
                             int ndim, const int64_t *want, moe_tensor_info *info)
{
    const char *path = NULL;
    moe_status st = ck_get(ck, name, info, &path);
    if (st != MOE_OK)
        return st;
    if (!lt->have_weight_dtype) {
        if (!is_float_weight_dtype(info->dtype))
            return moe_set_error(ck->ctx, MOE_EDTYPE,
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
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype disagrees with the other expert weights (expected %s as '%s', found %s)",
                             path, name, moe_dtype_name(lt->weight_dtype), lt->weight_dtype_from,
                             moe_dtype_name(info->dtype));
    }
    return check_shape(ck, path, info, label, ndim, want);
}

/* A vector tensor [n] of a float dtype (a bias): look it up and check it. */
static moe_status get_vector(moe_checkpoint *ck, const char *name, const char *label, int64_t n,
                             moe_tensor_info *info)
{
    const char *path = NULL;
    moe_status st = ck_get(ck, name, info, &path);
    if (st != MOE_OK)
        return st;
    if (!is_float_weight_dtype(info->dtype))
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype not accepted for a bias (expected F32, BF16 or F16, found %s)",
                             path, name, moe_dtype_name(info->dtype));
    const int64_t shape[1] = {n};
    return check_shape(ck, path, info, label, 1, shape);
}

/* An FP8 block checkpoint's expert weight `name` (F8_E4M3 [N, K], N x K = `want`) and its
 * `name`_scale_inv (F32 [ceil(N/bn), ceil(K/bk)], a multiplier): *codes and *scale point into
 * the mapped file. */
static moe_status get_fp8_weight(moe_checkpoint *ck, const char *name, const char *label, const int64_t *want,
                                 const void **codes, const void **scale)
{
    const char *path = NULL;
    moe_tensor_info info;
    moe_status st = ck_get(ck, name, &info, &path);
    if (st != MOE_OK)
        return st;
    if (info.dtype != MOE_DTYPE_F8_E4M3)
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype disagrees with config.json quantization_config (fp8: expected "
                             "F8_E4M3, found %s)",
                             path, name, moe_dtype_name(info.dtype));
    if ((st = check_shape(ck, path, &info, label, 2, want)) != MOE_OK)
        return st;
    *codes = info.data;
    char sname[CK_NAME_LEN];
    int len = snprintf(sname, sizeof sname, "%s_scale_inv", name);
    if (len < 0 || (size_t)len >= sizeof sname)
        return moe_set_error(ck->ctx, MOE_EINVAL, "%s: tensor name too long: '%s_scale_inv'", ck->dir, name);
    if ((st = ck_get(ck, sname, &info, &path)) != MOE_OK)
        return st;
    if (info.dtype != MOE_DTYPE_F32)
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype not accepted for FP8 block scales (expected F32, found %s)", path,
                             sname, moe_dtype_name(info.dtype));
    const int64_t grid[2] = {(want[0] + ck->fp8_bn - 1) / ck->fp8_bn, (want[1] + ck->fp8_bk - 1) / ck->fp8_bk};
    bool ok = info.ndim == 2 && info.shape[0] == grid[0] && info.shape[1] == grid[1];
    if (!ok) {
        char want_s[128], got_s[128];
        return moe_set_error(ck->ctx, MOE_ESHAPE,
                             "%s: tensor '%s': FP8 block scale shape disagrees with config.json (expected "
                             "[ceil(%s / %" PRId64 "), ceil(%s / %" PRId64 ")] = %s for weight_block_size [%" PRId64
                             ", %" PRId64 "], found %s)",
                             path, sname, label[1] == 'I' ? "I" : "H", ck->fp8_bn, label[1] == 'I' ? "H" : "I",
                             ck->fp8_bk, moe_io_format_shape(want_s, sizeof want_s, 2, grid), ck->fp8_bn, ck->fp8_bk,
                             moe_io_format_shape(got_s, sizeof got_s, info.ndim, info.shape));
    }
    *scale = info.data;
    return MOE_OK;
}

/* The candidate prefixes of layer `layer`'s MoE block, most likely first. Returns the count. */
static int layer_prefixes(const moe_checkpoint *ck, int64_t layer, char out[3][CK_PREFIX_LEN])
{
    static const char *const mixtral[] = {"model.layers.%" PRId64 ".block_sparse_moe.", "model.layers.%" PRId64 ".mlp."};
    static const char *const qwen35[] = {"model.language_model.layers.%" PRId64 ".mlp.", "model.layers.%" PRId64 ".mlp."};
    static const char *const llama4[] = {"language_model.model.layers.%" PRId64 ".feed_forward.",
                                         "model.language_model.layers.%" PRId64 ".feed_forward.",
                                         "model.layers.%" PRId64 ".feed_forward."};
    static const char *const granite[] = {"model.layers.%" PRId64 ".block_sparse_moe."};
    static const char *const plain[] = {"model.layers.%" PRId64 ".mlp."};
    const char *const *fmts = plain;
    int n = 1;
    switch (ck->family) {
    case MOE_FAMILY_MIXTRAL: fmts = mixtral; n = 2; break;
    case MOE_FAMILY_QWEN3_5_MOE: fmts = qwen35; n = 2; break;
    case MOE_FAMILY_LLAMA4: fmts = llama4; n = 3; break;
    case MOE_FAMILY_GRANITE_MOE: fmts = granite; n = 1; break;
    default: break;
    }
    for (int i = 0; i < n; i++)
        snprintf(out[i], CK_PREFIX_LEN, fmts[i], layer);
    return n;
}

/* Find the MoE block of `layer`: its prefix (the first candidate holding a router) and the
 * router's name. When none holds one, the first candidate and router name (ck_get then
 * reports the missing tensor). */
static void find_block(const moe_checkpoint *ck, int64_t layer, char *prefix, char *router_name)
{
    static const char *const gate[] = {"gate.weight"};
    static const char *const router[] = {"router.weight"};
    static const char *const granite[] = {"router.layer.weight", "router.weight"};
    const char *const *names = gate;
    int nn = 1;
    if (ck->family == MOE_FAMILY_GPT_OSS || ck->family == MOE_FAMILY_LLAMA4) {
        names = router;
    } else if (ck->family == MOE_FAMILY_GRANITE_MOE) {
        names = granite;
        nn = 2;
    }
    char cand[3][CK_PREFIX_LEN];
    int np = layer_prefixes(ck, layer, cand);
    for (int p = 0; p < np; p++) {
        for (int i = 0; i < nn; i++) {
            int len = snprintf(router_name, CK_NAME_LEN, "%s%s", cand[p], names[i]);
            if (len > 0 && len < CK_NAME_LEN && ck_has(ck, router_name)) {
                memcpy(prefix, cand[p], CK_PREFIX_LEN);
                return;
            }
        }
    }
    memcpy(prefix, cand[0], CK_PREFIX_LEN);
    int len = snprintf(router_name, CK_NAME_LEN, "%s%s", cand[0], names[0]);
    (void)len;
}

/* Stacked output-major experts: gate_up [E, 2I, H] (gate rows first), down [E, H, I]. */
static moe_status stacked_experts(moe_checkpoint *ck, ck_layer *lt, const char *gu_name, const char *dn_name)
{
    const int64_t E = ck->num_experts, H = ck->hidden_size, I = ck->intermediate;
    moe_tensor_info gu, dn;
    const int64_t gu_shape[3] = {E, 2 * I, H};
    const int64_t dn_shape[3] = {E, H, I};
    moe_status st;
    if ((st = get_weight(ck, lt, gu_name, "[E, 2I, H]", 3, gu_shape, &gu)) != MOE_OK ||
        (st = get_weight(ck, lt, dn_name, "[E, H, I]", 3, dn_shape, &dn)) != MOE_OK)
        return st;
    const size_t es = moe_dtype_size(lt->weight_dtype);
    const uint8_t *gu_base = gu.data; /* [E, 2I, H] gate rows then up rows per expert */
    const uint8_t *dn_base = dn.data; /* [E, H, I] */
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->gate[e] = gu_base + (size_t)e * (size_t)(2 * I * H) * es;
        lt->up[e] = gu_base + ((size_t)e * (size_t)(2 * I * H) + (size_t)(I * H)) * es;
        lt->down[e] = dn_base + (size_t)e * (size_t)(H * I) * es;
    }
    return MOE_OK;
}

static moe_status gpt_oss_expert_biases(moe_checkpoint *ck, ck_layer *lt, const char *prefix);

/* Stacked input-major experts (Llama-4, gpt-oss): gate_up [E, H, 2I], down [E, I, H]; gate
 * = the first I columns (halves) or the even columns (interleaved). */
static moe_status input_major_experts(moe_checkpoint *ck, ck_layer *lt, const char *prefix, bool interleaved)
{
    const int64_t E = ck->num_experts, H = ck->hidden_size, I = ck->intermediate;
    char name[CK_NAME_LEN];
    moe_tensor_info gu, dn;
    const int64_t gu_shape[3] = {E, H, 2 * I};
    const int64_t dn_shape[3] = {E, I, H};
    moe_status st;
    snprintf(name, sizeof name, "%sexperts.gate_up_proj", prefix);
    if ((st = get_weight(ck, lt, name, "[E, H, 2I]", 3, gu_shape, &gu)) != MOE_OK)
        return st;
    snprintf(name, sizeof name, "%sexperts.down_proj", prefix);
    if ((st = get_weight(ck, lt, name, "[E, I, H]", 3, dn_shape, &dn)) != MOE_OK)
        return st;
    const size_t es = moe_dtype_size(lt->weight_dtype);
    const uint8_t *gu_base = gu.data, *dn_base = dn.data;
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->gate[e] = gu_base + (size_t)e * (size_t)(H * 2 * I) * es;
        lt->up[e] = (const uint8_t *)lt->gate[e] + (size_t)(interleaved ? 1 : I) * es;
        lt->down[e] = dn_base + (size_t)e * (size_t)(I * H) * es;
    }
    lt->gu_so = interleaved ? 2 : 1;
    lt->gu_si = 2 * I;
    lt->dn_so = 1;
    lt->dn_si = H;
    if (!interleaved)
        return MOE_OK;
    return gpt_oss_expert_biases(ck, lt, prefix);
}

/* gpt-oss expert biases, bf16 and MXFP4 checkpoints alike: gate_up_proj_bias [E, 2I]
 * (interleaved like gate_up's outputs: gate = even entries), down_proj_bias [E, H]. */
static moe_status gpt_oss_expert_biases(moe_checkpoint *ck, ck_layer *lt, const char *prefix)
{
    const int64_t E = ck->num_experts, H = ck->hidden_size, I = ck->intermediate;
    char name[CK_NAME_LEN];
    moe_status st;
    moe_tensor_info gb, db;
    const char *path = NULL;
    const int64_t gb_shape[2] = {E, 2 * I}, db_shape[2] = {E, H};
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_bias", prefix);
    if ((st = ck_get(ck, name, &gb, &path)) != MOE_OK)
        return st;
    if (!is_float_weight_dtype(gb.dtype))
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype not accepted for a bias (expected F32, BF16 or F16, found %s)",
                             path, name, moe_dtype_name(gb.dtype));
    if ((st = check_shape(ck, path, &gb, "[E, 2I]", 2, gb_shape)) != MOE_OK)
        return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_bias", prefix);
    if ((st = ck_get(ck, name, &db, &path)) != MOE_OK)
        return st;
    if (db.dtype != gb.dtype)
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype must match gate_up_proj_bias (expected %s, found %s)", path,
                             name, moe_dtype_name(gb.dtype), moe_dtype_name(db.dtype));
    if ((st = check_shape(ck, path, &db, "[E, H]", 2, db_shape)) != MOE_OK)
        return st;
    lt->gate_bias = calloc((size_t)E, sizeof *lt->gate_bias); /* [E] */
    lt->up_bias = calloc((size_t)E, sizeof *lt->up_bias);     /* [E] */
    lt->down_bias = calloc((size_t)E, sizeof *lt->down_bias); /* [E] */
    if (!lt->gate_bias || !lt->up_bias || !lt->down_bias)
        return moe_set_error(ck->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
    const size_t bs = moe_dtype_size(gb.dtype);
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->gate_bias[e] = (const uint8_t *)gb.data + (size_t)(e * 2 * I) * bs;
        lt->up_bias[e] = (const uint8_t *)lt->gate_bias[e] + bs;
        lt->down_bias[e] = (const uint8_t *)db.data + (size_t)(e * H) * bs;
    }
    lt->expert_bias_dtype = gb.dtype;
    return MOE_OK;
}

/* A gpt-oss MXFP4 tensor `name` (U8, shape `want` [ndim], spelled `label` in config terms):
 * look it up, check it, and point *data at it. */
static moe_status get_mxfp4_tensor(moe_checkpoint *ck, const char *name, const char *label, int ndim,
                                   const int64_t *want, const uint8_t **data)
{
    const char *path = NULL;
    moe_tensor_info info;
    moe_status st = ck_get(ck, name, &info, &path);
    if (st != MOE_OK)
        return st;
    if (info.dtype != MOE_DTYPE_U8)
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype not accepted for MXFP4 %s (expected U8, found %s)", path, name,
                             ndim == 4 ? "blocks (two e2m1 codes per byte)" : "scales (E8M0 exponents)",
                             moe_dtype_name(info.dtype));
    if ((st = check_shape(ck, path, &info, label, ndim, want)) != MOE_OK)
        return st;
    *data = info.data;
    return MOE_OK;
}

/* gpt-oss MXFP4 experts (transformers' integrations/mxfp4.py, the layout of the released
 * checkpoints), per layer prefix P:
 *   P.experts.gate_up_proj_blocks [E, 2I, H/32, 16] U8, P.experts.gate_up_proj_scales [E, 2I, H/32] U8
 *   P.experts.down_proj_blocks    [E, H, I/32, 16]  U8, P.experts.down_proj_scales    [E, H, I/32]  U8
 * Per expert the blocks are the output-major codes [N, K/2] bytes (row n = output feature n;
 * byte b of group g holds input k = 32 g + 2 b in its low nibble and k + 1 in its high one)
 * and the scales [N, K/32] E8M0 exponents, w = e2m1(code) * 2^(scale - 127): exactly
 * moe.h's MXFP4 GROUP 32 source format. transformers' dequantization writes row n of the
 * blocks into column n of the bf16 gate_up_proj [E, H, 2I], so gate_up's rows interleave
 * gate (even rows) and up (odd rows) as the bf16 columns do. down is used in place; gate and
 * up are split into row-major copies when the weights are loaded (mxfp4_split_gate_up). */
static moe_status mxfp4_experts(moe_checkpoint *ck, ck_layer *lt, const char *prefix)
{
    const int64_t E = ck->num_experts, H = ck->hidden_size, I = ck->intermediate;
    char name[CK_NAME_LEN];
    moe_status st;
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_blocks", prefix);
    if (H % 32 != 0 || I % 32 != 0)
        return moe_set_error(ck->ctx, MOE_EFORMAT,
                             "%s: tensor '%s': MXFP4 experts need hidden_size (%" PRId64 ") and intermediate_size (%" PRId64
                             ") to be multiples of 32, the MXFP4 group along the input dimension",
                             ck->dir, name, H, I);
    const int64_t gu_blocks_shape[4] = {E, 2 * I, H / 32, 16};
    const int64_t gu_scales_shape[3] = {E, 2 * I, H / 32};
    const int64_t dn_blocks_shape[4] = {E, H, I / 32, 16};
    const int64_t dn_scales_shape[3] = {E, H, I / 32};
    const uint8_t *dn_blocks = NULL, *dn_scales = NULL;
    if ((st = get_mxfp4_tensor(ck, name, "[E, 2I, H/32, 16]", 4, gu_blocks_shape, &lt->gu_blocks)) != MOE_OK)
        return st;
    snprintf(name, sizeof name, "%sexperts.gate_up_proj_scales", prefix);
    if ((st = get_mxfp4_tensor(ck, name, "[E, 2I, H/32]", 3, gu_scales_shape, &lt->gu_scales)) != MOE_OK)
        return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_blocks", prefix);
    if ((st = get_mxfp4_tensor(ck, name, "[E, H, I/32, 16]", 4, dn_blocks_shape, &dn_blocks)) != MOE_OK)
        return st;
    snprintf(name, sizeof name, "%sexperts.down_proj_scales", prefix);
    if ((st = get_mxfp4_tensor(ck, name, "[E, H, I/32]", 3, dn_scales_shape, &dn_scales)) != MOE_OK)
        return st;
    lt->mxfp4 = true;
    for (int64_t e = lt->e_lo; e < lt->e_hi; e++) {
        lt->down[e] = dn_blocks + (size_t)e * (size_t)(H * (I / 2));        /* [H, I/2] bytes */
        lt->down_scale[e] = dn_scales + (size_t)e * (size_t)(H * (I / 32)); /* [H, I/32] */
    }
    return gpt_oss_expert_biases(ck, lt, prefix);
}

/* E8M0 scale byte 255 is NaN (OCP MX): the rows using it compute NaN. Loaded as it is (the
 * output follows the maths), with one WARNING per tensor naming it and the count; only the
 * local experts' scales are read. */
static void mxfp4_warn_nan_scales(moe_checkpoint *ck, const ck_layer *lt, const char *prefix)
{
    const int64_t H = ck->hidden_size, I = ck->intermediate;
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
        moe_log(ck->ctx, MOE_LOG_WARN,
                "%s: tensor '%sexperts.gate_up_proj_scales': %" PRId64 " of %" PRId64 " E8M0 scales are 255 (NaN): "
                "loaded as they are, so the rows using them compute NaN",
                ck->dir, prefix, gu_nan, n_local * (int64_t)gu_n);
    if (dn_nan)
        moe_log(ck->ctx, MOE_LOG_WARN,
                "%s: tensor '%sexperts.down_proj_scales': %" PRId64 " of %" PRId64 " E8M0 scales are 255 (NaN): "
                "loaded as they are, so the rows using them compute NaN",
                ck->dir, prefix, dn_nan, n_local * (int64_t)dn_n);
}

/* Split the local experts' interleaved MXFP4 gate_up rows (gate = even, up = odd) into
 * row-major gate and up codes and scales (moe_weight_source takes quantized codes row-major
 * only). The copy (lt->gu_split, logged with its size) lives until ck_layer_free, after
 * moe_weights_create has packed it. */
static moe_status mxfp4_split_gate_up(moe_checkpoint *ck, ck_layer *lt, int64_t layer)
{
    const int64_t H = ck->hidden_size, I = ck->intermediate;
    const int64_t n = lt->e_hi - lt->e_lo;
    if (n <= 0)
        return MOE_OK;
    const size_t row_b = (size_t)(H / 2), row_s = (size_t)(H / 32); /* bytes per row: codes, scales */
    const size_t per_expert = 2 * (size_t)I * (row_b + row_s);
    const size_t total = (size_t)n * per_expert;
    lt->gu_split = malloc(total); /* n x (gate [I, H/2], up [I, H/2], gate [I, H/32], up [I, H/32]) */
    if (!lt->gu_split)
        return moe_set_error(ck->ctx, MOE_ENOMEM,
                             "%s: layer %" PRId64 ": out of memory for the de-interleaved MXFP4 gate/up rows (%zu bytes)",
                             ck->dir, layer, total);
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
    moe_log(ck->ctx, MOE_LOG_INFO,
            "%s: layer %" PRId64 ": MXFP4 gate_up_proj interleaves gate (even) and up (odd) rows; copied %" PRId64
            " experts' rows apart for packing: %zu bytes (%.2f MiB), freed once packed",
            ck->dir, layer, n, total, (double)total / (1024.0 * 1024.0));
    return MOE_OK;
}

/* Resolve MoE layer `layer`: find every tensor, check dtypes and shapes against config.json,
 * and fill lt (free with ck_layer_free, also on error). */
/* describe != 0 (moe_checkpoint_layer_desc): every tensor is validated but quantized codes
 * are not converted (compressed-tensors). */
static moe_status resolve_layer(moe_checkpoint *ck, int64_t layer, ck_layer *lt, int64_t e_lo, int64_t e_hi,
                                int describe)
{
    memset(lt, 0, sizeof *lt);
    lt->e_lo = e_lo < 0 ? 0 : e_lo;
    lt->e_hi = e_hi > ck->num_experts ? ck->num_experts : e_hi;
    moe_status st = check_layer_index(ck, layer);
    if (st != MOE_OK)
        return st;

    const int64_t E = ck->num_experts, H = ck->hidden_size, I = ck->intermediate;
    const int64_t Is = ck->shared_intermediate;
    char prefix[CK_PREFIX_LEN], name[CK_NAME_LEN];
    const char *path = NULL;

    /* Router. */
    find_block(ck, layer, prefix, name);
    if ((st = ck_get(ck, name, &lt->router, &path)) != MOE_OK)
        return st;
    if (!is_float_weight_dtype(lt->router.dtype))
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype not accepted for the router (expected F32, BF16 or F16, found %s)",
                             path, name, moe_dtype_name(lt->router.dtype));
    const int64_t router_shape[2] = {E, H};
    if ((st = check_shape(ck, path, &lt->router, "[E, H]", 2, router_shape)) != MOE_OK)
        return st;
    if (ck->has_router_bias) {
        snprintf(name, sizeof name, "%srouter.bias", prefix);
        if ((st = get_vector(ck, name, "[E]", E, &lt->router_bias)) != MOE_OK)
            return st;
    }
    if (ck->has_selection_bias) {
        snprintf(name, sizeof name, "%sgate.e_score_correction_bias", prefix);
        if ((st = get_vector(ck, name, "[E]", E, &lt->sel_bias)) != MOE_OK)
            return st;
    }

    lt->gate = calloc((size_t)E, sizeof *lt->gate); /* [E] */
    lt->up = calloc((size_t)E, sizeof *lt->up);     /* [E] */
    lt->down = calloc((size_t)E, sizeof *lt->down); /* [E] */
    if (!lt->gate || !lt->up || !lt->down)
        return moe_set_error(ck->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
    if (ck->fp8 || ck->mxfp4) {
        lt->gate_scale = calloc((size_t)E, sizeof *lt->gate_scale); /* [E] */
        lt->up_scale = calloc((size_t)E, sizeof *lt->up_scale);     /* [E] */
        lt->down_scale = calloc((size_t)E, sizeof *lt->down_scale); /* [E] */
        if (!lt->gate_scale || !lt->up_scale || !lt->down_scale)
            return moe_set_error(ck->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);
    }

    /* Experts, in the family's layouts (the header comment lists them). */
    char gu_name[CK_NAME_LEN], dn_name[CK_NAME_LEN];
    snprintf(gu_name, sizeof gu_name, "%sexperts.gate_up_proj", prefix);
    char blocks_name[CK_NAME_LEN];
    snprintf(blocks_name, sizeof blocks_name, "%sexperts.gate_up_proj_blocks", prefix);
    const bool has_blocks = ck->family == MOE_FAMILY_GPT_OSS && ck_has(ck, blocks_name);
    if (has_blocks && !ck->mxfp4) {
        const moe_safetensors *f = ck_file_of(ck, blocks_name);
        return moe_set_error(ck->ctx, MOE_EFORMAT,
                             "%s: tensor '%s': MXFP4 experts, but config.json has no quantization_config "
                             "{quant_method: mxfp4} (transformers would not read them either)",
                             f ? moe_st_path(f) : ck->dir, blocks_name);
    }
    /* MXFP4 (quantization_config mxfp4): the layer's *_blocks, unless it was kept in bf16
     * (modules_to_not_convert) and has gate_up_proj instead */
    const bool mxfp4 = ck->mxfp4 && (has_blocks || !ck_has(ck, gu_name));
    /* Llama-4 quantized per expert (llm-compressor's compressed-tensors checkpoints, and
     * `moe quantize`'s int8 / int4 / fp8-block output): P.experts.e.{gate,up,down}_proj.* in
     * place of the stacked gate_up_proj / down_proj */
    const bool l4_per_expert = ck->family == MOE_FAMILY_LLAMA4 && (ck->fp8 || ck->ct) && !ck_has(ck, gu_name);
    if (ck->fp8 && (ck->family == MOE_FAMILY_GPT_OSS || (ck->family == MOE_FAMILY_LLAMA4 && !l4_per_expert) ||
                    ck->family == MOE_FAMILY_GRANITE_MOE || ck_has(ck, gu_name)))
        return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                             "%s: layer %" PRId64 ": FP8 block checkpoints (quantization_config quant_method fp8) are "
                             "read in the per-expert layout only (%sexperts.<e>.<proj>.weight + weight_scale_inv); "
                             "%s's stacked expert tensors are not supported",
                             ck->dir, layer, prefix, moe_family_name(ck->family));
    if (mxfp4) {
        if ((st = mxfp4_experts(ck, lt, prefix)) != MOE_OK)
            return st;
        if (!describe)
            mxfp4_warn_nan_scales(ck, lt, prefix);
    } else if (ck->family == MOE_FAMILY_GPT_OSS || (ck->family == MOE_FAMILY_LLAMA4 && !l4_per_expert)) {
        if ((st = input_major_experts(ck, lt, prefix, ck->family == MOE_FAMILY_GPT_OSS)) != MOE_OK)
            return st;
    } else {
        /* Granite as released: input_linear / output_linear; else the in-memory names */
        snprintf(gu_name, sizeof gu_name, "%sexperts.gate_up_proj", prefix);
        snprintf(dn_name, sizeof dn_name, "%sexperts.down_proj", prefix);
        const bool in_memory = ck_has(ck, gu_name) && !l4_per_expert;
        if (ck->family == MOE_FAMILY_GRANITE_MOE && !in_memory) {
            snprintf(gu_name, sizeof gu_name, "%sinput_linear.weight", prefix);
            snprintf(dn_name, sizeof dn_name, "%soutput_linear.weight", prefix);
        }
        if (in_memory || ck->family == MOE_FAMILY_GRANITE_MOE) {
            if ((st = stacked_experts(ck, lt, gu_name, dn_name)) != MOE_OK)
                return st;
        } else {
            const bool mixtral = ck->family == MOE_FAMILY_MIXTRAL;
            const char *gate_s = mixtral ? "w1" : "gate_proj";
            const char *up_s = mixtral ? "w3" : "up_proj";
            const char *down_s = mixtral ? "w2" : "down_proj";
            const int64_t in_shape[2] = {I, H};  /* gate and up: [I, H] */
            const int64_t out_shape[2] = {H, I}; /* down: [H, I] */
            for (int64_t e = lt->e_lo; ck->fp8 && e < lt->e_hi; e++) {
                snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e, gate_s);
                if ((st = get_fp8_weight(ck, name, "[I, H]", in_shape, &lt->gate[e], &lt->gate_scale[e])) != MOE_OK)
                    return st;
                snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e, up_s);
                if ((st = get_fp8_weight(ck, name, "[I, H]", in_shape, &lt->up[e], &lt->up_scale[e])) != MOE_OK)
                    return st;
                snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e, down_s);
                if ((st = get_fp8_weight(ck, name, "[H, I]", out_shape, &lt->down[e], &lt->down_scale[e])) != MOE_OK)
                    return st;
            }
            if (ck->ct) {
                const char *const proj[3] = {gate_s, up_s, down_s};
                const void **codes[3] = {lt->gate, lt->up, lt->down};
                const moe_ckq_lookup lk = {ckq_has, ckq_get, ck};
                if ((st = moe_ckq_layer_load(ck->ctx, ck->ct, &lk, prefix, proj, lt->e_lo, lt->e_hi, E, I, H, describe,
                                             codes, &lt->ckq)) != MOE_OK)
                    return st;
            }
            for (int64_t e = lt->e_lo; !ck->fp8 && !lt->ckq && e < lt->e_hi; e++) {
                moe_tensor_info t;
                snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e, gate_s);
                if ((st = get_weight(ck, lt, name, "[I, H]", 2, in_shape, &t)) != MOE_OK)
                    return st;
                lt->gate[e] = t.data;
                snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e, up_s);
                if ((st = get_weight(ck, lt, name, "[I, H]", 2, in_shape, &t)) != MOE_OK)
                    return st;
                lt->up[e] = t.data;
                snprintf(name, sizeof name, "%sexperts.%" PRId64 ".%s.weight", prefix, e, down_s);
                if ((st = get_weight(ck, lt, name, "[H, I]", 2, out_shape, &t)) != MOE_OK)
                    return st;
                lt->down[e] = t.data;
            }
        }
    }

    /* Shared expert: Qwen-style gated by sigmoid(shared_expert_gate . x); DeepSeek
     * (shared_experts) and Llama-4 ungated. */
    if (Is > 0) {
        const char *sh = (ck->family == MOE_FAMILY_DEEPSEEK_V2 || ck->family == MOE_FAMILY_DEEPSEEK_V3)
                             ? "shared_experts"
                             : "shared_expert";
        const int64_t in_shape[2] = {Is, H};
        const int64_t out_shape[2] = {H, Is};
        lt->has_shared = true;
        static const char *const sproj[3] = {"gate_proj", "up_proj", "down_proj"};
        int n_fp8 = 0;
        for (int j = 0; ck->fp8 && j < 3; j++) {
            moe_tensor_info t;
            snprintf(name, sizeof name, "%s%s.%s.weight", prefix, sh, sproj[j]);
            if ((st = ck_get(ck, name, &t, &path)) != MOE_OK)
                return st;
            n_fp8 += t.dtype == MOE_DTYPE_F8_E4M3;
        }
        /* compressed-tensors: llm-compressor quantizes the shared expert too unless `ignore`
         * lists it; the tensors decide, checked against config.json */
        int ct_q = 0;
        const moe_ckq_lookup lk = {ckq_has, ckq_get, ck};
        char sbase[3][CK_NAME_LEN];
        const char *const sb[3] = {sbase[0], sbase[1], sbase[2]};
        for (int j = 0; j < 3; j++)
            snprintf(sbase[j], sizeof sbase[j], "%s%s.%s", prefix, sh, sproj[j]);
        if (ck->ct && (st = moe_ckq_shared_check(ck->ctx, ck->ct, &lk, ck->dir, sb, &ct_q)) != MOE_OK)
            return st;
        if (ct_q) {
            /* dequantized to f32 ((v - z) * s or v * s, one f32 multiply:
             * moe_quant_dequant_source), within f32 reassociation of what the weight-only
             * kernels would compute (docs/numerics.md section 5); it runs in weight_dtype F32 */
            const int64_t *shp[3] = {in_shape, in_shape, out_shape};
            moe_tensor_info *dst[3] = {&lt->sh_gate, &lt->sh_up, &lt->sh_down};
            const size_t n1 = (size_t)(Is * H); /* elements per matrix */
            if (!describe && !(lt->sh_deq = malloc(3 * n1 * sizeof(float))))
                return moe_set_error(ck->ctx, MOE_ENOMEM,
                                     "out of memory dequantizing the compressed-tensors shared expert (%zu bytes)",
                                     3 * n1 * sizeof(float));
            size_t code_bytes = 0;
            for (int j = 0; j < 3; j++) {
                float *w = lt->sh_deq ? lt->sh_deq + (size_t)j * n1 : NULL; /* [N, K] f32 */
                size_t cb = 0;
                if ((st = moe_ckq_dequant_linear(ck->ctx, ck->ct, &lk, sb[j], shp[j][0], shp[j][1], describe, w,
                                                 &cb)) != MOE_OK)
                    return st;
                code_bytes += cb;
                *dst[j] = (moe_tensor_info){.name = NULL, .dtype = MOE_DTYPE_F32, .ndim = 2,
                                            .shape = {shp[j][0], shp[j][1]}, .data = w, .nbytes = n1 * sizeof(float)};
            }
            lt->have_weight_dtype = true;
            lt->weight_dtype = MOE_DTYPE_F32;
            const moe_quant_config *cq = moe_ckq_quant(ck->ct);
            if (lt->sh_deq)
                moe_log(ck->ctx, cq->act == MOE_QACT_NONE ? MOE_LOG_INFO : MOE_LOG_WARN,
                        "%s%s: compressed-tensors %s shared expert dequantized to f32 ((v - z) * s, one f32 "
                        "multiply): %zu bytes resident instead of %zu of codes%s",
                        prefix, sh, moe_quant_name(cq), 3 * n1 * sizeof(float), code_bytes,
                        cq->act == MOE_QACT_NONE ? ""
                                                 : "; it runs with f32 activations (the checkpoint's dynamic int8 "
                                                   "activation quantization applies to the routed experts only)");
        } else if (n_fp8 == 3) {
            /* FP8 shared expert (DeepSeek-V3 FP8 quantizes it too): validated like the routed
             * experts, then dequantized to f32 (w = q * s, one f32 multiply:
             * moe_quant_dequant_source), within f32 reassociation of what the weight-only fp8
             * kernels would compute (docs/numerics.md section 5); it runs in weight_dtype F32 */
            const moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_BLOCK, .block_n = ck->fp8_bn,
                                    .block_k = ck->fp8_bk};
            const int64_t *shp[3] = {in_shape, in_shape, out_shape};
            const char *lab[3] = {"[I_s, H]", "[I_s, H]", "[H, I_s]"};
            moe_tensor_info *dst[3] = {&lt->sh_gate, &lt->sh_up, &lt->sh_down};
            const size_t n1 = (size_t)(Is * H); /* elements per matrix */
            if (!describe && !(lt->sh_deq = malloc(3 * n1 * sizeof(float))))
                return moe_set_error(ck->ctx, MOE_ENOMEM, "out of memory dequantizing the FP8 shared expert (%zu bytes)",
                                     3 * n1 * sizeof(float));
            for (int j = 0; j < 3; j++) {
                const void *codes = NULL, *scale = NULL;
                snprintf(name, sizeof name, "%s%s.%s.weight", prefix, sh, sproj[j]);
                if ((st = get_fp8_weight(ck, name, lab[j], shp[j], &codes, &scale)) != MOE_OK)
                    return st;
                float *w = lt->sh_deq ? lt->sh_deq + (size_t)j * n1 : NULL; /* [N, K] f32 */
                if (w)
                    moe_quant_dequant_source(&qw, codes, scale, NULL, shp[j][0], shp[j][1], w);
                *dst[j] = (moe_tensor_info){.name = NULL, .dtype = MOE_DTYPE_F32, .ndim = 2,
                                            .shape = {shp[j][0], shp[j][1]}, .data = w, .nbytes = n1 * sizeof(float)};
            }
            lt->have_weight_dtype = true;
            lt->weight_dtype = MOE_DTYPE_F32;
            if (lt->sh_deq)
                moe_log(ck->ctx, MOE_LOG_INFO,
                        "%s%s: FP8 shared expert dequantized to f32 (w = q * s exactly): %zu bytes resident instead of "
                        "%zu of e4m3 codes",
                        prefix, sh, 3 * n1 * sizeof(float), 3 * n1);
        } else if (n_fp8 > 0) {
            snprintf(name, sizeof name, "%s%s.gate_proj.weight", prefix, sh);
            return moe_set_error(ck->ctx, MOE_EDTYPE,
                                 "%s: shared expert '%s': %d of its 3 projections are F8_E4M3: all three or none",
                                 ck->dir, name, n_fp8);
        } else {
            snprintf(name, sizeof name, "%s%s.gate_proj.weight", prefix, sh);
            if ((st = get_weight(ck, lt, name, "[I_s, H]", 2, in_shape, &lt->sh_gate)) != MOE_OK)
                return st;
            snprintf(name, sizeof name, "%s%s.up_proj.weight", prefix, sh);
            if ((st = get_weight(ck, lt, name, "[I_s, H]", 2, in_shape, &lt->sh_up)) != MOE_OK)
                return st;
            snprintf(name, sizeof name, "%s%s.down_proj.weight", prefix, sh);
            if ((st = get_weight(ck, lt, name, "[H, I_s]", 2, out_shape, &lt->sh_down)) != MOE_OK)
                return st;
        }
        if (ck->shared_gated) {
            const int64_t gw_shape[2] = {1, H};
            snprintf(name, sizeof name, "%sshared_expert_gate.weight_packed", prefix);
            const bool gate_packed = ck_has(ck, name);
            snprintf(name, sizeof name, "%sshared_expert_gate.weight", prefix);
            if (ck->ct && (gate_packed || (ck_has(ck, name) && ck_get(ck, name, &lt->sh_gate_w, &path) == MOE_OK &&
                                           lt->sh_gate_w.dtype == MOE_DTYPE_I8)))
                return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                                     "%s: tensor '%s%s': the shared expert gate [1, H] is stored quantized; libmoe "
                                     "runs it in the router's dtype: quantize with it in ignore (llm-compressor's MoE "
                                     "recipes list \"re:.*shared_expert_gate$\")",
                                     ck->dir, name, gate_packed ? "_packed" : "");
            if ((st = ck_get(ck, name, &lt->sh_gate_w, &path)) != MOE_OK)
                return st;
            if (lt->sh_gate_w.dtype != lt->router.dtype)
                return moe_set_error(ck->ctx, MOE_EDTYPE,
                                     "%s: tensor '%s': dtype must match the router's (expected %s, found %s)",
                                     path, name, moe_dtype_name(lt->router.dtype),
                                     moe_dtype_name(lt->sh_gate_w.dtype));
            if ((st = check_shape(ck, path, &lt->sh_gate_w, "[1, H]", 2, gw_shape)) != MOE_OK)
                return st;
        }
    }
    if ((ck->fp8 || lt->mxfp4 || lt->ckq) && !lt->have_weight_dtype) {
        /* FP8 / MXFP4 / compressed-tensors routed experts and no shared expert: weight_dtype
         * (which then types nothing but the description) follows the router */
        lt->have_weight_dtype = true;
        lt->weight_dtype = lt->router.dtype;
    }
    return MOE_OK;
}

/* The layer description of a resolved layer. */
static void fill_desc(const moe_checkpoint *ck, const ck_layer *lt, moe_layer_desc *d)
{
    moe_layer_desc_init(d);
    d->family = ck->family;
    d->hidden_size = ck->hidden_size;
    d->moe_intermediate_size = ck->intermediate;
    d->num_experts = ck->num_experts;
    d->top_k = ck->top_k;
    d->scoring_func = ck->scoring;
    d->renormalize = ck->renormalize;
    d->routed_scaling_factor = ck->routed_scaling_factor;
    d->activation = ck->activation;
    d->shared_expert_intermediate_size = lt->has_shared ? ck->shared_intermediate : 0;
    d->shared_expert_gated = lt->has_shared ? ck->shared_gated : 0;
    d->weight_dtype = lt->weight_dtype;
    d->n_group = ck->n_group > 1 ? ck->n_group : 0;
    d->topk_group = ck->n_group > 1 ? ck->topk_group : 0;
    d->group_score = ck->group_score;
    d->has_selection_bias = ck->has_selection_bias;
    d->has_router_bias = ck->has_router_bias;
    d->has_expert_bias = ck->has_expert_bias;
    d->apply_router_weight_on_input = ck->on_input;
    d->swiglu_alpha = ck->swiglu_alpha;
    d->swiglu_limit = ck->swiglu_limit;
    if (ck->fp8) {
        /* weight-only: the checkpoint's dynamic fp8 activations are run as f32 (cfg_quant) */
        const moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_BLOCK, .block_n = ck->fp8_bn,
                                .block_k = ck->fp8_bk};
        d->quant.w13 = qw;
        d->quant.w2 = qw;
        d->quant.act = MOE_QACT_NONE;
    }
    if (lt->mxfp4) {
        /* gpt-oss MXFP4: e2m1 codes, one E8M0 scale per 32 inputs, f32 activations */
        const moe_qweight qw = {.dtype = MOE_QTYPE_MXFP4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
        d->quant.w13 = qw;
        d->quant.w2 = qw;
        d->quant.act = MOE_QACT_NONE;
    }
    if (lt->ckq)
        moe_ckq_layer_quant(lt->ckq, &d->quant);
}

moe_status moe_checkpoint_layer_desc(moe_checkpoint *ck, int64_t layer, moe_layer_desc *out)
{
    if (!ck)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_layer_desc: out is NULL");
    ck_layer lt;
    moe_status st = resolve_layer(ck, layer, &lt, 0, ck->num_experts, 1);
    if (st == MOE_OK)
        fill_desc(ck, &lt, out);
    ck_layer_free(&lt);
    return st;
}

/* MOE_EINVAL naming the first field where the plan's description differs from `want`. */
static moe_status check_plan_desc(moe_checkpoint *ck, int64_t layer, const moe_layer_desc *have,
                                  const moe_layer_desc *want)
{
    const struct {
        const char *field;
        long long h, w;
    } ints[] = {
        {"hidden_size", have->hidden_size, want->hidden_size},
        {"moe_intermediate_size", have->moe_intermediate_size, want->moe_intermediate_size},
        {"num_experts", have->num_experts, want->num_experts},
        {"top_k", have->top_k, want->top_k},
        {"renormalize", have->renormalize, want->renormalize},
        {"scoring_func", have->scoring_func, want->scoring_func},
        {"activation", have->activation, want->activation},
        {"shared_expert_intermediate_size", have->shared_expert_intermediate_size,
         want->shared_expert_intermediate_size},
        {"shared_expert_gated", have->shared_expert_gated, want->shared_expert_gated},
        {"n_group", have->n_group > 1 ? have->n_group : 0, want->n_group},
        {"topk_group", have->n_group > 1 ? have->topk_group : 0, want->topk_group},
        {"group_score", have->n_group > 1 ? have->group_score : want->group_score, want->group_score},
        {"has_selection_bias", !!have->has_selection_bias, want->has_selection_bias},
        {"has_router_bias", !!have->has_router_bias, want->has_router_bias},
        {"has_expert_bias", !!have->has_expert_bias, want->has_expert_bias},
        {"apply_router_weight_on_input", !!have->apply_router_weight_on_input, want->apply_router_weight_on_input},
        {"quant.w13.dtype", have->quant.w13.dtype, want->quant.w13.dtype},
        {"quant.w13.scale", have->quant.w13.scale, want->quant.w13.scale},
        {"quant.w13.block_n", want->quant.w13.dtype ? have->quant.w13.block_n : 0, want->quant.w13.block_n},
        {"quant.w13.block_k", want->quant.w13.dtype ? have->quant.w13.block_k : 0, want->quant.w13.block_k},
        {"quant.w2.dtype", have->quant.w2.dtype, want->quant.w2.dtype},
        {"quant.w2.scale", have->quant.w2.scale, want->quant.w2.scale},
        {"quant.w2.block_n", want->quant.w2.dtype ? have->quant.w2.block_n : 0, want->quant.w2.block_n},
        {"quant.w2.block_k", want->quant.w2.dtype ? have->quant.w2.block_k : 0, want->quant.w2.block_k},
        {"quant.act", have->quant.act, want->quant.act},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (ints[i].h != ints[i].w)
            return moe_set_error(ck->ctx, MOE_EINVAL,
                                 "%s: plan does not match layer %" PRId64 ": desc field '%s' is %lld in the plan, %lld in the checkpoint",
                                 ck->dir, layer, ints[i].field, ints[i].h, ints[i].w);
    if (have->weight_dtype != want->weight_dtype)
        return moe_set_error(ck->ctx, MOE_EINVAL,
                             "%s: plan does not match layer %" PRId64 ": desc field 'weight_dtype' is %s in the plan, %s in the checkpoint",
                             ck->dir, layer, moe_dtype_name(have->weight_dtype), moe_dtype_name(want->weight_dtype));
    const struct {
        const char *field;
        float h, w;
    } floats[] = {
        {"routed_scaling_factor", have->routed_scaling_factor, want->routed_scaling_factor},
        {"swiglu_alpha", want->activation == MOE_ACT_SWIGLU_OAI ? have->swiglu_alpha : 0.0f,
         want->activation == MOE_ACT_SWIGLU_OAI ? want->swiglu_alpha : 0.0f},
        {"swiglu_limit", want->activation == MOE_ACT_SWIGLU_OAI ? have->swiglu_limit : 0.0f,
         want->activation == MOE_ACT_SWIGLU_OAI ? want->swiglu_limit : 0.0f},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (floats[i].h != floats[i].w)
            return moe_set_error(ck->ctx, MOE_EINVAL,
                                 "%s: plan does not match layer %" PRId64 ": desc field '%s' is %g in the plan, %g in the checkpoint",
                                 ck->dir, layer, floats[i].field, (double)floats[i].h, (double)floats[i].w);
    return MOE_OK;
}

moe_status moe_checkpoint_load_weights(moe_checkpoint *ck, int64_t layer, const moe_plan *plan,
                                       moe_weights **out)
{
    if (!ck)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_load_weights: out is NULL");
    *out = NULL;
    if (!plan)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_load_weights: plan is NULL");

    /* Only this rank's experts (a parallel plan's local range; all in one process). */
    int64_t e_lo = 0, e_hi = ck->num_experts;
    if (moe_plan_desc(plan)->num_experts == ck->num_experts) {
        int32_t *map = malloc(sizeof(int32_t) * (size_t)(ck->num_experts > 0 ? ck->num_experts : 1)); /* [E] */
        if (!map)
            return moe_set_error(ck->ctx, MOE_ENOMEM, "moe_checkpoint_load_weights: out of memory");
        moe_plan_expert_map(plan, map);
        e_lo = ck->num_experts;
        e_hi = 0;
        for (int64_t e = 0; e < ck->num_experts; e++)
            if (map[e] >= 0) {
                e_lo = e < e_lo ? e : e_lo;
                e_hi = e + 1;
            }
        free(map);
    }
    ck_layer lt;
    moe_status st = resolve_layer(ck, layer, &lt, e_lo, e_hi, 0);
    if (st == MOE_OK) {
        moe_layer_desc want;
        fill_desc(ck, &lt, &want);
        st = check_plan_desc(ck, layer, moe_plan_desc(plan), &want);
    }
    if (st == MOE_OK && lt.mxfp4)
        st = mxfp4_split_gate_up(ck, &lt, layer);
    if (st == MOE_OK) {
        moe_weight_source src;
        memset(&src, 0, sizeof src);
        src.router = lt.router.data;           /* [E, H] */
        src.router_dtype = lt.router.dtype;
        src.gate_proj = lt.gate;               /* E x [I, H] (or strided) */
        src.up_proj = lt.up;                   /* E x [I, H] (or strided) */
        src.down_proj = lt.down;               /* E x [H, I] (or strided) */
        src.gate_up_stride_out = lt.gu_so;
        src.gate_up_stride_in = lt.gu_si;
        src.down_stride_out = lt.dn_so;
        src.down_stride_in = lt.dn_si;
        if (ck->fp8 || lt.mxfp4) {
            /* FP8: E x F32 [ceil(I/bn), ceil(H/bk)] (down [ceil(H/bn), ceil(I/bk)]);
             * MXFP4: E x U8 [I, H/32] (down [H, I/32]) */
            src.gate_scale = lt.gate_scale;
            src.up_scale = lt.up_scale;
            src.down_scale = lt.down_scale;
        }
        if (lt.ckq)
            moe_ckq_layer_source(lt.ckq, &src); /* scales (and int4 zero points) per expert */
        if (lt.has_shared) {
            src.shared_gate_proj = lt.sh_gate.data;     /* [I_s, H] */
            src.shared_up_proj = lt.sh_up.data;         /* [I_s, H] */
            src.shared_down_proj = lt.sh_down.data;     /* [H, I_s] */
            src.shared_expert_gate = lt.sh_gate_w.data; /* [1, H] or NULL when ungated */
        }
        if (ck->has_router_bias) {
            src.router_bias = lt.router_bias.data;      /* [E] */
            src.router_bias_dtype = lt.router_bias.dtype;
        }
        if (ck->has_selection_bias) {
            src.selection_bias = lt.sel_bias.data;      /* [E] */
            src.selection_bias_dtype = lt.sel_bias.dtype;
        }
        if (ck->has_expert_bias) {
            src.gate_bias = lt.gate_bias;               /* E x [I], stride 2 */
            src.up_bias = lt.up_bias;
            src.down_bias = lt.down_bias;               /* E x [H] */
            src.expert_bias_dtype = lt.expert_bias_dtype;
            src.gate_up_bias_stride = 2;
        }
        st = moe_weights_create(plan, &src, out);
    }
    ck_layer_free(&lt);
    return st;
}
