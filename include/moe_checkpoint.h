/*
 * libmoe: safetensors files, Hugging Face checkpoints, and moe quantize.
 *
 * Part of the public API. Include moe.h, which includes this header where its types are
 * needed; this file also works on its own (it includes moe.h first).
 */
#include "moe.h"

#ifndef MOE_CHECKPOINT_H
#define MOE_CHECKPOINT_H

#ifdef __cplusplus
extern "C" {
#endif

/* MOE_API marks the public functions: the only symbols libmoe.so exports (the library is
 * built with -fvisibility=hidden; tests/exports.sh checks the export list against these
 * headers). Define MOE_API before including to override (e.g. empty). */
#ifndef MOE_API
#if defined(__GNUC__) || defined(__clang__)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif
#endif

/* ---------------------------------------------------------------------------------------
 * Safetensors files (https://github.com/huggingface/safetensors format): read by mmap
 * after validating the whole header against the file size; written atomically.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_safetensors moe_safetensors;

#define MOE_MAX_DIMS 8

typedef struct moe_tensor_info {
    const char *name;              /* valid while the file is open */
    moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    const void *data;              /* mmap'd, read-only, valid while the file is open */
    size_t nbytes;
} moe_tensor_info;

/* Open and validate: 8-byte little-endian header length within the file, header valid JSON
 * object, every tensor with a known dtype, shape of non-negative ints, data_offsets
 * [begin, end] inside the data section with end - begin = numel * dtype size, and no two
 * tensors overlapping. The file is opened with O_NONBLOCK and fstat'ed before anything is
 * read: anything but a regular file (after following symlinks) is MOE_EIO naming its type
 * ("is a FIFO, not a regular file", "is a directory, ..."), so a named pipe never blocks.
 * Errors (message names the file and the tensor or field): MOE_ENOTFOUND (no such file; a
 * dangling symlink: "is a dangling symlink to 'TARGET', which does not exist"), MOE_EIO (open / stat / mmap failed, with strerror, e.g. a symlink loop; not a regular
 * file), MOE_EFORMAT, MOE_EDTYPE, MOE_ENOMEM.
 * Safetensors does not promise aligned tensor data: moe_tensor_info.data may be unaligned for
 * its dtype (read it with memcpy, or copy it, before using it as a typed array). */
MOE_API moe_status moe_safetensors_open(moe_ctx *ctx, const char *path, moe_safetensors **out);
MOE_API void moe_safetensors_free(moe_safetensors *f);
MOE_API size_t moe_safetensors_count(const moe_safetensors *f);
/* i-th tensor in header order. MOE_ERANGE when i >= count. */
MOE_API moe_status moe_safetensors_at(const moe_safetensors *f, size_t i, moe_tensor_info *out);
/* Tensor by name. MOE_ENOTFOUND (message names file and tensor) when absent. */
MOE_API moe_status moe_safetensors_get(moe_safetensors *f, const char *name, moe_tensor_info *out);

/* A tensor to write. */
typedef struct moe_tensor_out {
    const char *name;
    moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    const void *data; /* numel * dtype size bytes */
} moe_tensor_out;

/* Write `n` tensors to `path` atomically: a temporary file beside it, renamed over `path`
 * only once complete, so a failure leaves nothing at `path`. Errors: MOE_EINVAL, MOE_EIO. */
MOE_API moe_status moe_safetensors_write(moe_ctx *ctx, const char *path, const moe_tensor_out *tensors,
                                 size_t n);

/* ---------------------------------------------------------------------------------------
 * Hugging Face checkpoints: a folder with config.json and model.safetensors, or shards
 * listed in model.safetensors.index.json. Families: every moe_family but custom, in their
 * per-expert, stacked (output- or input-major) and quantized layouts: FP8 block
 * (quant_method fp8, weight + weight_scale_inv), gpt-oss MXFP4 as released (*_blocks +
 * *_scales), compressed-tensors int4 / int8 (llm-compressor). Multimodal wrappers
 * (Llama4ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration) are read through
 * their config's text_config. docs/checkpoints.md is the format reference (tensor names and
 * shapes per layout, how quantized shared experts load, what is refused and why).
 * What the quantized layouts return, beside the errors each function lists:
 *   FP8 block: an fp8 shared expert is dequantized at load to f32 (logged at INFO with the
 *     bytes); one with only some projections in fp8 is MOE_EDTYPE; fp8 in a stacked expert
 *     layout is MOE_EUNSUPPORTED.
 *   gpt-oss MXFP4: H or I not a multiple of 32, or *_blocks without quantization_config
 *     mxfp4, is MOE_EFORMAT; scale bytes 255 (NaN) load with a WARNING naming the tensor.
 *   Every other format's scales (compressed-tensors weight_scale, GPTQ / AWQ scales, FP8
 *     weight_scale_inv / weight_scale): a NaN, infinite, zero or negative value is MOE_EFORMAT
 *     naming the tensor and the entry (at load; FP8 HF scales when the layer is described).
 *   compressed-tensors: int 4-bit (channel or group 32/64/128, with or without zero points)
 *     and int 8-bit (channel or group) weights, weight-only or dynamic int8 per token; FP8
 *     (float-quantized, tensor or channel) weight-only, with dynamic per-token FP8
 *     activations served weight-only (a WARNING), or with static per-tensor FP8 activations
 *     as fp8-tensor-static / fp8-channel-static (each linear's input_scale required, checked
 *     and applied per expert; a plan with quant.act NONE runs them weight-only); other
 *     num_bits, float types, static
 *     int activations, actorder "group" (g_idx), tensor / block
 *     strategies, sparsity or several groups are MOE_EUNSUPPORTED naming the field; a
 *     weight_shape that is not an integer vector, or a quantized shared expert inconsistent
 *     with itself or config.json (a missing tensor, mixed quantized and float projections,
 *     quantized tensors of an `ignore`d module), is MOE_EFORMAT naming the tensor; a
 *     quantized shared expert is dequantized at load to f32 (logged with the bytes); a
 *     quantized shared_expert_gate is MOE_EUNSUPPORTED.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_checkpoint moe_checkpoint;

/* The most layers a config.json may declare (num_hidden_layers, 2^20; released models have
 * at most a few hundred): a larger value is MOE_EFORMAT naming the field, its value and this
 * limit, so no count read from a config walks an unbounded number of layers. */
#define MOE_MAX_LAYERS ((int64_t)1 << 20)
/* The largest config.json (16 MiB) and model.safetensors.index.json (64 MiB) read: the size
 * is checked by fstat before reading, and a larger file is MOE_EFORMAT naming the file, its
 * size and the limit (released configs are a few KiB, indexes a few MiB). */
#define MOE_CONFIG_MAX_BYTES ((uint64_t)16 << 20)
#define MOE_INDEX_MAX_BYTES ((uint64_t)64 << 20)

/* Open `dir`: parse config.json, detect the family from `architectures` (or `model_type`),
 * open and validate every safetensors file. config.json, the index and every safetensors
 * file must be regular files (see moe_safetensors_open; a FIFO is refused, never read), and
 * the two JSON files at most MOE_CONFIG_MAX_BYTES / MOE_INDEX_MAX_BYTES. Errors:
 * MOE_ENOTFOUND (config.json, a shard, a config field; "neither model.safetensors nor
 * model.safetensors.index.json found" only when both are absent: a dangling symlink there is
 * named with its target, and anything else, e.g. a symlink loop, is MOE_EIO with its errno), MOE_EFORMAT (bad JSON or safetensors, a config
 * value out of range, e.g. num_hidden_layers above MOE_MAX_LAYERS, a JSON file over its size
 * limit), MOE_EIO (unreadable, or not a regular file),
 * MOE_EUNSUPPORTED (unknown architecture, named: moe_checkpoint_open_opts with
 * moe_checkpoint_options.family reads it as a known family; or a config value libmoe does not compute:
 * hidden_act, DeepSeek scoring_func / topk_method, a quantization_config.quant_method other
 * than fp8, mxfp4 and compressed-tensors, e.g. gptq, awq, bitsandbytes), MOE_ENOMEM. */
MOE_API moe_status moe_checkpoint_open(moe_ctx *ctx, const char *dir, moe_checkpoint **out);
MOE_API void moe_checkpoint_free(moe_checkpoint *ck);

/* How moe_checkpoint_open_opts reads a checkpoint. Initialise with moe_checkpoint_options_init
 * (all fields 0 / NULL: moe_checkpoint_open's behaviour), then set fields. */
typedef struct moe_checkpoint_options {
    /* Unread tensors. After resolving an MoE layer (moe_checkpoint_layer_desc,
     * moe_checkpoint_load_weights), every tensor of the checkpoint under that layer's block
     * prefix (e.g. "model.layers.3.mlp."; the family row's) that the loader did not read -- a
     * shared expert the family or config.json does not have, a bias the family has no use for
     * -- is named: 0 (default): one WARNING per layer (logged once per checkpoint object)
     * naming the layer, the count and the first names ("and N more"); 1: the call fails with
     * MOE_EFORMAT and the same message. Tensors outside the MoE blocks (attention, norms,
     * embeddings, dense layers) are not examined. */
    int strict;
    /* A family name (moe_family_name: "mixtral", "qwen3_moe", "deepseek_v3", ...: every row of
     * docs/families.md "Supported"; `moe run --family` lists them;
     * a row's architecture class or model_type is accepted too), or NULL (default): the
     * family of config.json's architectures[0], else model_type. When set, that family's row
     * reads config.json and the tensors whatever config.json names; a WARNING names
     * config.json's architecture and model_type, the family used, and every config field that
     * was absent and took the family's default ("norm_topk_prob = false, ..."). No WARNING
     * when config.json already names that family. An unknown name is MOE_EINVAL listing the
     * families. */
    const char *family;
    /* The expert set of a block that holds several, one per token modality, or NULL (default):
     * the family's first. ERNIE-4.5-VL (ernie4_5_vl_moe, Ernie4_5_VLMoeMoeBlock, transformers
     * 5.24): "text" (default: text_moe, for tokens with moe_mm_token_type_ids 0 or none given:
     * router mlp.gate.weight, moe_statics.e_score_correction_bias row 0, experts 0..E-1 of
     * moe_intermediate_size[0]) or "vision" (vision_moe, for image / video tokens: mlp.gate.
     * weight_1, bias row 1, experts E..2E-1 of moe_intermediate_size[1]); the shared experts
     * (moe_intermediate_size[0] * moe_num_shared_experts) belong to both. The layer then
     * computes that modality's block for every token it is given: splitting a batch by
     * modality, and running one layer per set, is the caller's. Another name, or any name for a
     * family with one set, is MOE_EINVAL naming the family's sets. moe_checkpoint_expert_set
     * says which set was read. */
    const char *expert_set;
} moe_checkpoint_options;

MOE_API void moe_checkpoint_options_init(moe_checkpoint_options *opt);

/* moe_checkpoint_open with options (opt NULL: the defaults, i.e. moe_checkpoint_open). Errors:
 * those of moe_checkpoint_open; MOE_EINVAL for an unknown opt->family (the message lists the
 * families). */
MOE_API moe_status moe_checkpoint_open_opts(moe_ctx *ctx, const char *dir, const moe_checkpoint_options *opt,
                                    moe_checkpoint **out);

MOE_API moe_family moe_checkpoint_family(const moe_checkpoint *ck);
/* The expert set read (moe_checkpoint_options.expert_set: "text", "vision" for ernie4_5_vl_moe),
 * static; NULL for a family with one set of experts (or ck NULL). */
MOE_API const char *moe_checkpoint_expert_set(const moe_checkpoint *ck);
/* config `num_hidden_layers` (LongCat-Flash: `num_layers`, each layer one MoE block; DBRX:
 * `n_layers`). */
MOE_API int64_t moe_checkpoint_num_layers(const moe_checkpoint *ck);
/* 1 if layer `layer` is an MoE layer, else 0. Qwen2/3-MoE, Qwen3-Next, Qwen3-Omni: not in
 * mlp_only_layers and (layer + 1) % decoder_sparse_step == 0; DeepSeek-V2/V3: layer >=
 * first_k_dense_replace and layer % moe_layer_freq == 0 (the published code's rule;
 * transformers, which has no moe_layer_freq, agrees for the released value 1); Llama-4:
 * listed in moe_layers, else (layer + 1) % interleave_moe_layer_step == 0; Mixtral, OLMoE,
 * Granite-MoE (-Shared, -Hybrid), gpt-oss, Qwen3.5-MoE, Hunyuan-MoE: every layer. Jamba: layer %
 * expert_layer_period == expert_layer_offset, with more than one expert. ERNIE-4.5-MoE: (layer
 * + 1) % moe_layer_interval == 0 and moe_layer_start_index <= layer <= moe_layer_end_index (-1:
 * the last). GLM-5 (glm_moe_dsa), Kimi-Linear, Ling hybrid
 * (bailing_hybrid), Hunyuan-V3 (hy_v3): mlp_layer_types[layer] == "sparse", else layer >=
 * first_k_dense_replace (3, 1, 2; Hunyuan-V3: 1); A.X-K2 (axk2): mlp_layer_types, else layer >=
 * first_k_dense_replace (1) and layer % moe_layer_freq (1) == 0; GLM-5-Next (glm5_next):
 * text_config.mlp_layer_types, else layer >= 3; GLM-4.5V (glm4v_moe): layer >=
 * first_k_dense_replace (1); Solar-Open, MiniMax-M2, LongCat-Flash: every layer; DeepSeek-V4: every layer, its
 * "hash_moe" ones included (moe_checkpoint_layer_desc refuses those); Step-3.7: mlp_layer_types,
 * else layer >= 3. Mistral-Large-4 (mistral_large4), Unlimited-OCR (unlimited_ocr):
 * text_config.mlp_layer_types, else layer >= first_k_dense_replace (1); DeepSeek-OCR-2
 * (deepseek_ocr2): text_config.mlp_layer_types, which must be given (moe_checkpoint_open refuses
 * a config without it, MOE_EFORMAT). Nemotron-H (nemotron_h): layers_block_type[layer] == "moe"
 * (the list's length is the layer count), else the legacy hybrid_override_pattern[layer] == 'E',
 * else NemotronHConfig's default list (layer 1 of 4). DBRX (dbrx): every layer (DbrxBlock.ffn).
 * ERNIE-4.5-VL (ernie4_5_vl_moe): text_config.mlp_layer_types[layer] == "sparse", else
 * layer >= 1 (Ernie4_5_VLMoeTextConfig's default; moe_layer_start_index / interval / end_index
 * are not read, as transformers 5.24 does not). dots.3-note (dots3_note): mlp_layer_types, else
 * layer >= first_k_dense_replace (1) and moe_layer_freq (1), a number (layer % freq == 0) or a
 * per-layer list (its entry true or non-zero). No layer is MoE when the expert count is 0. */
MOE_API int moe_checkpoint_is_moe_layer(const moe_checkpoint *ck, int64_t layer);

/* The layer description of MoE layer `layer`, from config.json and the tensors' dtype (moe.h
 * "Layer description" says which field of which family sets what).
 * Errors: MOE_ERANGE (layer outside [0, num_hidden_layers)), MOE_EDENSE (a dense layer; the
 * message names the config field that makes it dense), MOE_ENOTFOUND (a tensor),
 * MOE_EDTYPE / MOE_ESHAPE (a tensor disagreeing with config.json or with the other experts;
 * the message names tensor, expected and found; FP8 checkpoints: every weight_scale_inv too,
 * F32 on the ceil grid; MXFP4 checkpoints: every *_blocks / *_scales U8 in the shapes of
 * docs/checkpoints.md),
 * MOE_EFORMAT (MXFP4 with H or I not a multiple of 32, or *_blocks without quantization_config
 * mxfp4; a compressed-tensors shared expert inconsistent with itself or config.json, see
 * docs/checkpoints.md), MOE_EUNSUPPORTED (quant_method mxfp4 on a family other than gpt-oss, from
 * moe_checkpoint_open; a DeepSeek-V4 "hash_moe" layer, mlp_layer_types[L]: DeepseekV4HashRouter
 * picks its experts by tid2eid[input_ids], token ids the layer is never given; the message names
 * the layer, the value, what a caller would need -- moe_exec_args.in_topk_ids -- and the first
 * score-routed layer); with moe_checkpoint_options.strict, MOE_EFORMAT for a tensor under the
 * layer's block prefix that the loader does not read (the message names them). */
MOE_API moe_status moe_checkpoint_layer_desc(moe_checkpoint *ck, int64_t layer, moe_layer_desc *out);

/* Pack layer `layer`'s weights for `plan` (which must have been created from the
 * description moe_checkpoint_layer_desc() gave). Same errors as moe_checkpoint_layer_desc
 * plus those of moe_weights_create. The checkpoint may be freed afterwards. A parallel plan
 * packs only its rank's share (moe_weights_create): under EP only the local experts'
 * tensors are looked up and read (per-expert tensors of other ranks are not touched;
 * stacked tensors are read only in the local experts' slices, the files being mapped). */
MOE_API moe_status moe_checkpoint_load_weights(moe_checkpoint *ck, int64_t layer, const moe_plan *plan,
                                       moe_weights **out);

/* The routing and expert math of `family` as its transformers config class (transformers
 * 5.24) defaults them: what moe_checkpoint_layer_desc starts from before config.json's
 * values, and what a preset of a family's shape needs. Sets desc->family and:
 *   scoring_func          MOE_SCORING_SIGMOID for DeepSeek-V3, TOPK_SOFTMAX for gpt-oss and
 *                         OpenAI Privacy Filter, Granite-MoE and JetMoE, TOPK_SIGMOID for Llama-4,
 *                         SPARSEMIXER for Phi-MoE
 *                         (sparsemixer_jitter_eps: PhimoeConfig's router_jitter_noise, 0.01),
 *                         SQRTSOFTPLUS for DeepSeek-V4 (1.5, selection bias, renormalized),
 *                         SOFTMAX for the others
 *   renormalize           1 for Mixtral and Qwen3.5-MoE (their routers always renormalize);
 *                         the config class's `norm_topk_prob` for Qwen2-MoE (false), Qwen3-MoE
 *                         (false; the released Qwen3 models set true), Qwen3-Next (true), OLMoE
 *                         (false) and DeepSeek-V3 (true); 0 for the others (DeepSeek-V2 ignores
 *                         norm_topk_prob, as transformers does, and so do DeepSeek-OCR-2 and
 *                         Unlimited-OCR, its router's copies; Mistral-Large-4 always: 1;
 *                         ERNIE-4.5-MoE and ERNIE-4.5-VL always: 1; DBRX 1:
 *                         moe_normalize_expert_weights' default 1.0 is the sum)
 *   routed_scaling_factor `routed_scaling_factor`'s default: 2.5 for DeepSeek-V3, 1 for
 *                         DeepSeek-V2 and the families without the field
 *   n_group, topk_group, group_score
 *                         8, 4, MOE_GROUP_SCORE_TOP2_SUM for DeepSeek-V3 (`n_group`,
 *                         `topk_group`, topk_method "noaux_tc"); 0, 0, MOE_GROUP_SCORE_MAX for
 *                         the others (DeepSeek-V2: topk_method "greedy")
 *   has_selection_bias    1 for DeepSeek-V3 (e_score_correction_bias), ERNIE-4.5-MoE and
 *                         ERNIE-4.5-VL (moe_statics.e_score_correction_bias; VL: the expert set's
 *                         row) and the other rows docs/families.md gives one; else 0
 *   has_router_bias       1 for gpt-oss (router.bias), else 0
 *   has_expert_bias       1 for gpt-oss (gate_up_proj_bias, down_proj_bias), else 0
 *   apply_router_weight_on_input  1 for Llama-4, else 0
 *   has_output_bias       1 for JetMoE (the block's `bias` [H]), else 0
 *   has_output_norm, output_norm_eps  1 and 1e-6 for A.X-K1 (post_mlp_layernorm,
 *                         rms_norm_eps), else 0 and 1e-6
 *   renormalize_eps       1e-6 for LFM2-MoE (Lfm2MoeTopKRouter), 0 for Cohere2-MoE
 *                         (Cohere2MoeTopKRouter's sigmoid branch), else 1e-20
 *   renormalize_p         1 (the plain sum) for every family, DBRX included
 *                         (DbrxFFNConfig's moe_normalize_expert_weights 1.0; a config's other p
 *                         or null is config.json's, moe_checkpoint_layer_desc)
 *   shared_expert_scale   0.5 for Cohere2-MoE when desc->shared_expert_intermediate_size > 0
 *                         (shared_expert_combination_strategy "average", with
 *                         routed_scaling_factor 0.5), else 1
 *   (LFM2-MoE: has_selection_bias 1, use_expert_bias's default; Cohere2-MoE: scoring
 *   MOE_SCORING_TOPK_SOFTMAX and renormalize 0, expert_selection_fn's default "softmax")
 *   num_identity_experts  256 for LongCat-Flash (LongcatFlashConfig zero_expert_num; a caller
 *                         sets its config's value), else 0
 *   activation            MOE_ACT_SWIGLU_OAI for gpt-oss, MOE_ACT_SWIGLU_CLAMP for GLM-5-Next,
 *                         HY-V4, HY-V4-VL and DeepSeek-V4 (swiglu_limit 10),
 *                         MOE_ACT_SWIGLU_SOFTCAP for Inkling2 and Inkling2-Loop, else
 *                         MOE_ACT_SWIGLU (`hidden_act`'s default "silu"; Step-3.7 without
 *                         swiglu_limits: its per-layer MOE_ACT_SWIGLU_POSTCLAMP limits come from
 *                         config.json, moe_checkpoint_layer_desc); MOE_ACT_RELU2 for Nemotron-H
 *                         (non-gated experts, `mlp_hidden_act`'s default "relu2")
 *   shared_swiglu_limit   0 (Step-3.7's swiglu_limits_shared[L] is config.json's)
 *   softcap_gate, softcap_up  4 and 25 (Inkling2TextConfig's mlp_gate_softcap / mlp_up_softcap)
 *   has_shared_activation, shared_activation  1 and MOE_ACT_SWIGLU for HY-V4 / HY-V4-VL when
 *                         desc->shared_expert_intermediate_size > 0 (HYV4MLP), else 0
 *   swiglu_alpha, swiglu_limit  1.702 and 7 (GptOssConfig's defaults; the other families do
 *                         not use them); GLM-5-Next: swiglu_limit 10 (Glm5NextTextConfig)
 *   shared_expert_gated   1 for Qwen2-MoE, Qwen3-Next and Qwen3.5-MoE when
 *                         desc->shared_expert_intermediate_size > 0, else 0
 * Sizes (hidden_size, moe_intermediate_size, num_experts, top_k,
 * shared_expert_intermediate_size), weight_dtype and quant are left as they are. A bench
 * preset that generates no bias tensors clears the has_*_bias fields itself. Errors:
 * MOE_EINVAL (desc NULL, or `family` MOE_FAMILY_CUSTOM or not a moe_family value: no family
 * row holds its defaults). */
MOE_API moe_status moe_family_layer_defaults(moe_family family, moe_layer_desc *desc);

/* ---------------------------------------------------------------------------------------
 * Quantized checkpoints: moe_checkpoint_quantize (`moe quantize`) converts the routed experts
 * of a bf16 / f16 / f32 checkpoint (per-expert layout, or gpt-oss / Llama-4 stacked) with
 * moe_quantize_matrix and writes a checkpoint that moe_checkpoint_open (and vLLM) loads:
 * "fp8-block" as Hugging Face FP8, "fp8-tensor" / "fp8-channel" as compressed-tensors
 * float-quantized (weight F8_E4M3 + weight_scale F32 [1] / [N, 1]), "int8-channel" /
 * "int4-g32|g64|g128[-zp]" as
 * compressed-tensors pack-quantized, "int8-w8a8" as compressed-tensors int-quantized with
 * dynamic per-token activations, "mxfp4" (gpt-oss only) in the released openai/gpt-oss layout.
 * Everything else is copied unchanged; sharded inputs give shards of the same names. A NaN or
 * Inf expert weight is refused (MOE_EINVAL naming the tensor and its first [n, k]). The output
 * appears complete or not at all (a temporary folder beside it, renamed into place).
 * docs/checkpoints.md ("Writing") and docs/quantize.md give the tensors written.
 * ------------------------------------------------------------------------------------- */

/* Progress lines of moe_checkpoint_quantize (one per shard, one at the end). */
typedef void (*moe_progress_fn)(const char *msg, void *user);

typedef struct moe_quantize_options {
    const char *scheme;        /* moe_quant_from_name name: fp8-block, fp8-tensor, fp8-channel
                                  (compressed-tensors float-quantized), int8-channel, int8-w8a8,
                                  int4-g32/g64/g128, int4-g32/g64/g128-zp, mxfp4 (gpt-oss) */
    const int64_t *layers;     /* [n_layers] MoE layers to quantize; NULL or 0 = all
                                  (fp8-block: all only) */
    size_t n_layers;
    int force;                 /* 1: replace an existing non-empty out_dir, only when it looks
                                  like a checkpoint: it holds a config.json and only regular
                                  files with a checkpoint's names (*.safetensors, *.json,
                                  *.jinja, *.model, *.tiktoken, *.py, vocab.txt, merges.txt,
                                  .gitattributes, README*, LICENSE*, NOTICE*, USE_POLICY*), and
                                  not the current folder nor the input; else MOE_EINVAL naming
                                  the reason, nothing touched. 0: a non-empty out_dir is
                                  MOE_EINVAL */
    moe_progress_fn progress;  /* or NULL */
    void *progress_user;
    const volatile int *cancel;/* or NULL: when *cancel becomes nonzero (a signal handler may set
                                  it; a volatile sig_atomic_t is an int on the platforms libmoe
                                  builds for) the conversion stops before the next tensor,
                                  removes its temporary folder and returns MOE_ECANCELED */
} moe_quantize_options;

typedef struct moe_quantize_stats {
    int64_t expert_tensors;        /* expert linears quantized */
    uint64_t input_expert_bytes;   /* their bytes in the input */
    uint64_t output_code_bytes;    /* codes written (weight / weight_packed) */
    uint64_t output_scale_bytes;   /* scales (and weight_shape) written */
    uint64_t output_zero_bytes;    /* zero points written */
    uint64_t other_bytes;          /* tensors copied unchanged */
    int shards;                    /* safetensors files written */
    int copied_files;              /* other files copied */
} moe_quantize_stats;

/* Quantize `in_dir` into `out_dir` (above). Errors: MOE_EINVAL (unknown scheme, out_dir the
 * input, inside it or holding it, out_dir existing and not empty without force, a parent
 * folder that does not exist), MOE_EUNSUPPORTED (mxfp4 on a family other than gpt-oss, gpt-oss
 * with another scheme, an already quantized input, Granite / other
 * stacked expert layouts), MOE_ERANGE (a layer that is not an MoE layer), MOE_ESHAPE (int4
 * groups not dividing K, mxfp4 with H or I not a multiple of 32), MOE_ECANCELED (opt->cancel set), those of
 * moe_checkpoint_open, MOE_EIO, MOE_ENOMEM (also before allocating for an expert linear whose
 * f32 copy and codes do not fit: the message names the tensor and both sizes;
 * docs/checkpoints.md "Memory"). On error nothing is left at out_dir (an existing
 * one is untouched) nor beside it (a process killed outright leaves its temporary folder
 * `.OUT.tmp.XXXXXX`, which the next call for the same out_dir names in a WARNING). stats
 * may be NULL. */
MOE_API moe_status moe_checkpoint_quantize(moe_ctx *ctx, const char *in_dir, const char *out_dir,
                                   const moe_quantize_options *opt, moe_quantize_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* MOE_CHECKPOINT_H */
