/* The family table: one row per family libmoe reads (families.h says what each field
 * means). The config.json names and defaults are those of transformers 5.24's config
 * classes and modeling code (and, where those leave a field out, the models' own published
 * code: each such place says so); ../shared/MODELS.md has the routing per family. Rows are in
 * moe_family order, which is also the order of the supported list in messages. */
#include "io/families.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* DeepSeek-V2 (transformers' DeepseekV2TopkRouter): scoring_func "softmax" only; topk_method
 * "greedy", or "group_limited_greedy" with n_group and topk_group (group score: the best
 * expert); norm_topk_prob is read only to warn that it is ignored. */
static moe_status deepseek_v2_routing(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group,
                                      int64_t *topk_group)
{
    const char *scoring = NULL, *method = NULL;
    int norm = 0;
    moe_status st;
    if ((st = moe_cfg_bool(f, row->renormalize.field, row->renormalize.dflt, &norm)) != MOE_OK ||
        (st = moe_cfg_str(f, "scoring_func", "softmax", &scoring)) != MOE_OK ||
        (st = moe_cfg_str(f, "topk_method", "greedy", &method)) != MOE_OK)
        return st;
    if (strcmp(scoring, "softmax") != 0)
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%sscoring_func' = \"%s\": DeepSeek-V2 routes with \"softmax\" only", f->path,
                             f->prefix, scoring);
    /* transformers' DeepseekV2TopkRouter never renormalizes (the published code does when
     * norm_topk_prob, and then skips routed_scaling_factor; every released V2 has false) */
    if (norm)
        moe_log(f->ctx, MOE_LOG_WARN,
                "%s: '%snorm_topk_prob' is true; ignored, as transformers' DeepSeek-V2 router does "
                "(weights are the softmax scores times routed_scaling_factor)",
                f->path, f->prefix);
    if (strcmp(method, "group_limited_greedy") == 0) {
        if ((st = moe_cfg_int(f, row->groups.n_group_field, true, 0, 1, n_group)) != MOE_OK ||
            (st = moe_cfg_int(f, row->groups.topk_group_field, true, 0, 1, topk_group)) != MOE_OK)
            return st;
    } else if (strcmp(method, "greedy") != 0) {
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%stopk_method' = \"%s\": DeepSeek-V2 selects with \"greedy\" or "
                             "\"group_limited_greedy\"",
                             f->path, f->prefix, method);
    }
    return MOE_OK;
}

/* DeepSeek-V3 (DeepseekV3TopkRouter): scoring_func "sigmoid" and topk_method "noaux_tc" only;
 * n_group and topk_group default to the config class's 8 and 4. */
static moe_status deepseek_v3_routing(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group,
                                      int64_t *topk_group)
{
    const char *scoring = NULL, *method = NULL;
    moe_status st;
    if ((st = moe_cfg_str(f, "scoring_func", "sigmoid", &scoring)) != MOE_OK ||
        (st = moe_cfg_str(f, "topk_method", "noaux_tc", &method)) != MOE_OK)
        return st;
    if (strcmp(scoring, "sigmoid") != 0)
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%sscoring_func' = \"%s\": DeepSeek-V3 routes with \"sigmoid\" only "
                             "(DeepseekV3TopkRouter)",
                             f->path, f->prefix, scoring);
    if (strcmp(method, "noaux_tc") != 0)
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%stopk_method' = \"%s\": DeepSeek-V3 selects with \"noaux_tc\" only", f->path,
                             f->prefix, method);
    if ((st = moe_cfg_int(f, row->groups.n_group_field, false, row->groups.n_group, 1, n_group)) != MOE_OK ||
        (st = moe_cfg_int(f, row->groups.topk_group_field, false, row->groups.topk_group, 1, topk_group)) != MOE_OK)
        return st;
    return MOE_OK;
}

/* Glm4MoeTopkRouter, Dots1TopkRouter and their copies: DeepSeek-V3's routing without
 * scoring_func or topk_method fields (the classes always use sigmoid + e_score_correction_bias,
 * top-2-sum groups): n_group and topk_group with the config class's defaults (the row's, or 1
 * when the row has none); one group (n_group <= 1) is no group-limited selection (0, 0). */
static moe_status sigmoid_groups_routing(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group,
                                         int64_t *topk_group)
{
    moe_status st;
    const int64_t g0 = row->groups.n_group ? row->groups.n_group : 1;
    const int64_t k0 = row->groups.topk_group ? row->groups.topk_group : 1;
    if ((st = moe_cfg_int(f, row->groups.n_group_field, false, g0, 1, n_group)) != MOE_OK ||
        (st = moe_cfg_int(f, row->groups.topk_group_field, false, k0, 1, topk_group)) != MOE_OK)
        return st;
    if (*n_group <= 1)
        *n_group = 0, *topk_group = 0;
    return MOE_OK;
}

/* DeepseekV4TopKRouter: score_fn = ACT2FN[scoring_func] (DeepseekV4Config: "sqrtsoftplus",
 * `softmax` or `sigmoid` by its docstring); libmoe computes "sqrtsoftplus" (MOE_SCORING_SQRTSOFTPLUS),
 * the released models' and the class's default. The router has no groups. */
static moe_status deepseek_v4_routing(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group,
                                      int64_t *topk_group)
{
    (void)row;
    (void)n_group;
    (void)topk_group;
    const char *scoring = NULL;
    moe_status st = moe_cfg_str(f, "scoring_func", "sqrtsoftplus", &scoring);
    if (st != MOE_OK)
        return st;
    if (strcmp(scoring, "sqrtsoftplus") != 0)
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%sscoring_func' = \"%s\": libmoe computes DeepseekV4TopKRouter with "
                             "\"sqrtsoftplus\" (sqrt(softplus(l)) + e_score_correction_bias, renormalized) only",
                             f->path, f->prefix, scoring);
    return MOE_OK;
}

/* Inkling2TopKRouter: score_fn = ACT2FN[scoring_func]; libmoe computes "sigmoid" (the config
 * classes' default), any other is refused by name; no expert groups */
static moe_status inkling2_routing(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group,
                                   int64_t *topk_group)
{
    (void)row;
    const char *scoring = NULL;
    moe_status st = moe_cfg_str(f, "scoring_func", "sigmoid", &scoring);
    if (st != MOE_OK)
        return st;
    if (strcmp(scoring, "sigmoid") != 0)
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%sscoring_func' = \"%s\": libmoe computes Inkling2TopKRouter with "
                             "\"sigmoid\" scores only",
                             f->path, f->prefix, scoring);
    *n_group = *topk_group = 0;
    return MOE_OK;
}

/* AXK2TopkRouter (A.X-K2): DeepSeek-V3's routing, with expert groups only when n_group is set
 * (null or absent: none, A.X-K2-Light). Its grouped path fills the dropped groups' selection
 * keys with 0.0, not -inf (apply_group_scoring: "fill with `0.0` intentionally"), so an expert of
 * a dropped group can be chosen over a kept group's expert whose biased score is negative;
 * libmoe selects within the kept groups only, so n_group > 1 is refused. */
static moe_status axk2_routing(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group, int64_t *topk_group)
{
    const json_t *g = json_object_get(f->obj, row->groups.n_group_field);
    int64_t ng = 0;
    moe_status st;
    *n_group = *topk_group = 0;
    if (!g || json_is_null(g))
        return MOE_OK;
    if ((st = moe_cfg_int(f, row->groups.n_group_field, true, 0, 1, &ng)) != MOE_OK)
        return st;
    if (ng > 1)
        return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                             "%s: field '%s%s' = %" PRId64 ": A.X-K2's grouped routing fills the dropped groups' "
                             "selection keys with 0.0, not -inf (AXK2TopkRouter.apply_group_scoring), which libmoe "
                             "does not compute (it selects within the kept groups, as deepseek_v3 does); A.X-K2 "
                             "without groups (n_group null or 1) is read",
                             f->path, f->prefix, row->groups.n_group_field, ng);
    return MOE_OK;
}

/* One line per concern: identity; I; E; shared expert; routing; router tensors and the routing
 * hook; activation; MoE layers; block prefixes; expert layouts. */
static const moe_fam_row fam_rows[] = {
    /* MixtralSparseMoeBlock: softmax, top-k, always renormalized */
    {.family = MOE_FAMILY_MIXTRAL, .name = "mixtral", .names = {{"MixtralForCausalLM", "mixtral"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe." /* as released */, "model.layers.%L.mlp."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Qwen2MoeSparseMoeBlock: softmax, norm_topk_prob (default false), sigmoid-gated shared expert */
    {.family = MOE_FAMILY_QWEN2_MOE, .name = "qwen2_moe", .names = {{"Qwen2MoeForCausalLM", "qwen2_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, true, "shared_expert", "shared_expert_gate"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", false},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_SPARSE_STEP, .step_field = "decoder_sparse_step", .step_default = 1, .list_field = "mlp_only_layers"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Qwen3MoeSparseMoeBlock: softmax, norm_topk_prob (default false; true in the releases) */
    {.family = MOE_FAMILY_QWEN3_MOE, .name = "qwen3_moe", .names = {{"Qwen3MoeForCausalLM", "qwen3_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", false},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_SPARSE_STEP, .step_field = "decoder_sparse_step", .step_default = 1, .list_field = "mlp_only_layers"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* DeepseekV2Moe: softmax, greedy or group-limited (group score max), never renormalized,
     * times routed_scaling_factor; n_shared_experts ungated shared experts. first_k_dense_replace
     * and moe_layer_freq: the published code's rule (transformers has no moe_layer_freq;
     * released configs: 1) */
    {.family = MOE_FAMILY_DEEPSEEK_V2, .name = "deepseek_v2", .names = {{"DeepseekV2ForCausalLM", "deepseek_v2"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_NEVER, "norm_topk_prob", false},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_MAX},
     .router = {"gate.weight"}, .routing_hook = deepseek_v2_routing,
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "first_k_dense_replace", 0, "moe_layer_freq", 1},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* DeepseekV3MoE (also Kimi-K2): sigmoid, e_score_correction_bias on the selection, 8
     * groups keep 4 by the sum of their top-2, renormalized, times 2.5 */
    {.family = MOE_FAMILY_DEEPSEEK_V3, .name = "deepseek_v3", .names = {{"DeepseekV3ForCausalLM", "deepseek_v3"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 8, 4, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = deepseek_v3_routing,
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "first_k_dense_replace", 3, "moe_layer_freq", 1},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* GptOssTopKRouter: top-k on l = Wr x + b, softmax over the k; GptOssExperts: the clamped
     * SwiGLU with biases, gate/up interleaved; released as MXFP4 */
    {.family = MOE_FAMILY_GPT_OSS, .name = "gpt_oss", .names = {{"GptOssForCausalLM", "gpt_oss"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.weight"}, .router_bias = "router.bias",
     .activation = {MOE_FAM_ACT_CLAMPED_SWIGLU, "swiglu_alpha", "swiglu_limit", 1.702, 7.0},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .input_major = {"experts.gate_up_proj", "experts.down_proj", true, "experts.gate_up_proj_bias", "experts.down_proj_bias"},
     .mxfp4 = {"experts.gate_up_proj_blocks", "experts.gate_up_proj_scales", "experts.down_proj_blocks", "experts.down_proj_scales"}},

    /* Llama4Router: top-k on the logits, sigmoid of the selected; Llama4TextMoe scales the
     * expert input and adds the ungated shared expert (intermediate_size). Llama4TextConfig:
     * moe_layers, else range(step - 1, L, step). Quantized per expert as llm-compressor (and moe
     * quantize) write it */
    {.family = MOE_FAMILY_LLAMA4, .name = "llama4", .text_config = true,
     .names = {{"Llama4ForConditionalGeneration", "llama4"}, {"Llama4ForCausalLM", "llama4_text"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_SAME_AS_I, .gated = false, .module = "shared_expert"},
     .scoring = MOE_SCORING_TOPK_SIGMOID, .weight_on_input = true,
     .router = {"router.weight"},
     .layers = {MOE_FAM_LAYERS_LISTED_ELSE_STEP, .step_field = "interleave_moe_layer_step", .step_default = 1,
                .list_field = "moe_layers"},
     .prefixes = {"language_model.model.layers.%L.feed_forward." /* as released */,
                  "model.language_model.layers.%L.feed_forward.", "model.layers.%L.feed_forward."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}, .quantized_only = true},
     .input_major = {"experts.gate_up_proj", "experts.down_proj", false}},

    /* OlmoeSparseMoeBlock: softmax, norm_topk_prob (false in the release) */
    {.family = MOE_FAMILY_OLMOE, .name = "olmoe", .names = {{"OlmoeForCausalLM", "olmoe"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", false},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* GraniteMoeTopKRouter: top-k on the logits, softmax over the k; experts stacked as
     * input_linear / output_linear as released */
    {.family = MOE_FAMILY_GRANITE_MOE, .name = "granitemoe", .names = {{"GraniteMoeForCausalLM", "granitemoe"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.layer.weight" /* as released */, "router.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe."},
     .stacked = {{"experts.gate_up_proj", "experts.down_proj"}, {"input_linear.weight", "output_linear.weight"}}},

    /* Qwen3_5MoeTopKRouter: softmax, always renormalized; every layer MoE with a gated shared
     * expert; released with stacked experts */
    {.family = MOE_FAMILY_QWEN3_5_MOE, .name = "qwen3_5_moe", .text_config = true,
     .names = {{"Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"}, {"Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, true, "shared_expert", "shared_expert_gate"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.language_model.layers.%L.mlp." /* ConditionalGeneration */, "model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Qwen3NextSparseMoeBlock: softmax, norm_topk_prob (default true), gated shared expert */
    {.family = MOE_FAMILY_QWEN3_NEXT, .name = "qwen3_next", .names = {{"Qwen3NextForCausalLM", "qwen3_next"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, true, "shared_expert", "shared_expert_gate"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_SPARSE_STEP, .step_field = "decoder_sparse_step", .step_default = 1, .list_field = "mlp_only_layers"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},
    /* Glm4MoeMoE (GLM-4.5 / 4.6, glm4_moe): DeepSeek-V3's router (sigmoid,
     * e_score_correction_bias on the selection, top-2-sum groups) with Glm4MoeConfig's defaults:
     * n_group 1 (no groups), norm_topk_prob true, routed_scaling_factor 1, one ungated shared
     * expert, first_k_dense_replace 1 (transformers has no moe_layer_freq: absent, 1) */
    {.family = MOE_FAMILY_GLM4_MOE, .name = "glm4_moe", .names = {{"Glm4MoeForCausalLM", "glm4_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "first_k_dense_replace", 1, "moe_layer_freq", 1},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Dots1MoE (dots.llm1): the same router; Dots1Config's defaults: n_group 1, norm_topk_prob
     * false, routed_scaling_factor 1, n_shared_experts None (no shared expert),
     * first_k_dense_replace 0 */
    {.family = MOE_FAMILY_DOTS1, .name = "dots1", .names = {{"Dots1ForCausalLM", "dots1"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 0, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", false},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "first_k_dense_replace", 0, "moe_layer_freq", 1},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* MiniMaxSparseMoeBlock (MiniMax-Text-01): Mixtral's router (softmax, top-k, always
     * renormalized) in every layer; the decoder's mlp_alpha_factor / mlp_beta_factor act on
     * the residual sum outside the block. Saved under block_sparse_moe. with w1 / w3 / w2 */
    {.family = MOE_FAMILY_MINIMAX, .name = "minimax", .names = {{"MiniMaxForCausalLM", "minimax"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe." /* as saved */, "model.layers.%L.mlp."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Qwen3VLMoeTextSparseMoeBlock (Qwen3-VL-MoE's decoder): softmax, always renormalized, no
     * shared expert; Qwen3VLMoeTextConfig's decoder_sparse_step / mlp_only_layers; released
     * with stacked experts under model.language_model. */
    {.family = MOE_FAMILY_QWEN3_VL_MOE, .name = "qwen3_vl_moe", .text_config = true,
     .names = {{"Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_SPARSE_STEP, .step_field = "decoder_sparse_step", .step_default = 1, .list_field = "mlp_only_layers"},
     .prefixes = {"model.language_model.layers.%L.mlp." /* ConditionalGeneration */, "model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},
    /* FlexOlmoSparseMoeBlock (FlexOlmo): OLMoE's router (softmax, norm_topk_prob default false)
     * in every layer */
    {.family = MOE_FAMILY_FLEX_OLMO, .name = "flex_olmo", .names = {{"FlexOlmoForCausalLM", "flex_olmo"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", false},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},
    /* Glm4MoeLiteMoE (GLM-4.7-Flash): Glm4MoeLiteTopkRouter is Glm4Moe's router; defaults n_group 1,
     * norm_topk_prob true, routed_scaling_factor 1.8, one shared expert; MoE layers by
     * mlp_layer_types (absent: every layer but the first) */
    {.family = MOE_FAMILY_GLM4_MOE_LITE, .name = "glm4_moe_lite", .names = {{"Glm4MoeLiteForCausalLM", "glm4_moe_lite"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.8}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* DeepseekV32MoE (DeepSeek-V3.2; its indexed sparse attention is not the MoE block):
     * DeepSeek-V3's router and defaults (8 groups keep 4, norm, 2.5, one shared expert); MoE
     * layers by mlp_layer_types (absent: layer >= first_k_dense_replace, default 3) */
    {.family = MOE_FAMILY_DEEPSEEK_V32, .name = "deepseek_v32", .names = {{"DeepseekV32ForCausalLM", "deepseek_v32"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 8, 4, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 3, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* ExaoneMoeSparseMoEBlock (K-EXAONE): Glm4Moe's router; ExaoneMoeConfig's defaults: n_group
     * 1, norm_topk_prob true, routed_scaling_factor 2.5, num_shared_experts 1; MoE layers by
     * mlp_layer_types (absent: layer >= first_k_dense_replace, default 1) */
    {.family = MOE_FAMILY_EXAONE_MOE, .name = "exaone_moe", .names = {{"ExaoneMoeForCausalLM", "exaone_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "num_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "e_score_correction_bias" /* as saved: not under gate. */,
     .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* MiMoV2FlashMoE (MiMo-V2-Flash): DeepseekV3MoE without shared experts, Glm4Moe's router;
     * defaults n_group 1, norm_topk_prob true, routed_scaling_factor 1; MoE layers by
     * mlp_layer_types (absent: every layer but the first) */
    {.family = MOE_FAMILY_MIMO_V2_FLASH, .name = "mimo_v2_flash", .names = {{"MiMoV2FlashForCausalLM", "mimo_v2_flash"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},
    /* LagunaSparseMoeBlock (Laguna; sliding-window and per-layer head counts are attention
     * only): LagunaTopKRouter is sigmoid + e_score_correction_bias on the selection, always
     * renormalized (no epsilon: identical in f32 to libmoe's + 1e-20 unless the top-k sum is
     * below ~1e-13); moe_routed_scaling_factor times the routed sum, then the ungated shared
     * expert. Saved (conversion_mapping's reverse) as experts.e_score_correction_bias and
     * shared_expert.; MoE layers by mlp_layer_types (absent: every layer but the first) */
    {.family = MOE_FAMILY_LAGUNA, .name = "laguna", .names = {{"LagunaForCausalLM", "laguna"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, false, "shared_expert"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"moe_routed_scaling_factor", 1.0},
     .router = {"gate.weight"}, .selection_bias = "experts.e_score_correction_bias" /* as saved */,
     .refuse = {{"moe_router_logit_softcapping", "tanh soft-capping of the router logits"},
                {"moe_apply_router_weight_on_input", "the routing weight applied to the expert input (LagunaConfig "
                                                     "itself refuses it)"}},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Kolibri1SparseMoeBlock (Kolibri1): Kolibri1TopKRouter selects the top-k on the f32
     * logits + e_score_correction_bias, weights = sigmoid of the selected logits, renormalized
     * when norm_topk_prob (default false; no epsilon, as Laguna); the ungated shared expert is
     * added; every layer. Saved with the bias beside the block, model.layers.L.moe.router.
     * expert_bias (conversion_mapping's reverse) */
    {.family = MOE_FAMILY_KOLIBRI1, .name = "kolibri1", .names = {{"Kolibri1ForCausalLM", "kolibri1"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, false, "shared_experts"},
     .scoring = MOE_SCORING_TOPK_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", false},
     .router = {"gate.weight"}, .selection_bias = "model.layers.%L.moe.router.expert_bias" /* as saved */,
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* BeamMoE (Beam): BeamTopkRouter is DeepSeek-V3's (sigmoid + e_score_correction_bias,
     * top-2-sum groups, norm_topk_prob with + 1e-20) in f32, routed_scaling_factor on the
     * routed sum; no shared expert. BeamConfig's defaults: n_group 8, topk_group 4,
     * norm_topk_prob true, 2.5; MoE layers by mlp_layer_types (absent: the first
     * min(3, L) dense) */
    {.family = MOE_FAMILY_BEAM, .name = "beam", .names = {{"BeamForCausalLM", "beam"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 8, 4, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 3, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* MiniMaxM3VLSparseMoeBlock (MiniMax-M3's text decoder; its block-sparse indexed attention
     * is not the block): MiniMaxM3VLTopKRouter is sigmoid in f32 + e_score_correction_bias on
     * the selection, always renormalized (no epsilon, as Laguna); the experts and the shared
     * expert (MiniMaxM3VLDenseMLP, shared_intermediate_size) use gpt-oss's clamped SwiGLU
     * (swiglu_alpha, swiglu_limit) on non-interleaved gate / up halves; routed_scaling_factor
     * (default 2) times the routed sum. Released (and saved: conversion_mapping's reverse)
     * under language_model.model.layers.L.block_sparse_moe. with w1 / w3 / w2 per expert, the
     * bias beside the gate and the shared expert's gate_proj / up_proj split; MoE layers by
     * mlp_layer_types (absent: every layer) */
    {.family = MOE_FAMILY_MINIMAX_M3_VL, .name = "minimax_m3_vl", .text_config = true,
     .names = {{"MiniMaxM3SparseForConditionalGeneration", "minimax_m3_vl"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_intermediate_size", 0, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"routed_scaling_factor", 2.0},
     .router = {"gate.weight"}, .selection_bias = "e_score_correction_bias" /* as saved: beside gate. */,
     .activation = {MOE_FAM_ACT_CLAMPED_SWIGLU, "swiglu_alpha", "swiglu_limit", 1.702, 7.0},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 0, .list_field = "mlp_layer_types"},
     .prefixes = {"language_model.model.layers.%L.block_sparse_moe." /* as released */},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* AfmoeSparseMoeBlock (AFMoE): AfmoeTokenChoiceRouter (router.gate) is sigmoid in f32, the
     * top-k on the scores + the block's expert_bias, always renormalized (+ 1e-20), times
     * route_scale; plus num_shared_experts (default 2) * I ungated shared experts. MoE layers:
     * layer >= num_dense_layers (default 1) */
    {.family = MOE_FAMILY_AFMOE, .name = "afmoe", .names = {{"AfmoeForCausalLM", "afmoe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_COUNT, "num_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"route_scale", 1.0},
     .router = {"router.gate.weight"}, .selection_bias = "expert_bias",
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "num_dense_layers", 1},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* FlintSparseMoeBlock (Flint): FlintTopKRouter is the top-k of the f32 sigmoid scores (no
     * bias), renormalized when norm_topk_prob (default true; no epsilon, as Laguna); the
     * shared expert added ungated. MoE layers as Qwen2-MoE's, mlp_only_layers defaulting to
     * [0, 1] (FlintConfig) */
    {.family = MOE_FAMILY_FLINT, .name = "flint", .names = {{"FlintForCausalLM", "flint"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, false, "shared_expert"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_SPARSE_STEP, .step_field = "decoder_sparse_step", .step_default = 1,
                .list_field = "mlp_only_layers", .list_default = {0, 1}, .n_list_default = 2},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* GraniteMoeSWAMoE (Granite-MoE with sliding-window attention): Granite-MoE's block
     * (top-k on the logits, softmax over the k), saved stacked. Its shared_mlp (input_linear
     * [2 I_s, H] / output_linear) sits beside block_sparse_moe in the decoder layer, outside
     * the block: a config with shared_intermediate_size > 0 is refused (the class default is
     * 0) */
    {.family = MOE_FAMILY_GRANITEMOE_SWA, .name = "granitemoe_swa", .names = {{"GraniteMoeSWAForCausalLM", "granitemoe_swa"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.weight", "router.layer.weight"},
     .refuse = {{"shared_intermediate_size", "the decoder layer's shared_mlp (a fused input_linear [2 I_s, H] "
                                             "added beside block_sparse_moe, outside the MoE block)"}},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe."},
     .stacked = {{"experts.gate_up_proj", "experts.down_proj"}, {"input_linear.weight", "output_linear.weight"}}},

    /* Qwen3OmniMoeThinkerTextSparseMoeBlock (Qwen3-Omni's thinker; its talker's MoE is another
     * decoder): Qwen3-MoE's router (softmax, norm_topk_prob, default true), no shared expert;
     * decoder_sparse_step / mlp_only_layers. The full model keeps the decoder's fields two
     * levels down (thinker_config.text_config) and saves its tensors under thinker.model.; the
     * thinker alone one level down (text_config), under model. (model.language_model. in
     * memory) */
    {.family = MOE_FAMILY_QWEN3_OMNI_MOE, .name = "qwen3_omni_moe", .text_config = true,
     .config_path = "thinker_config.text_config.",
     .names = {{"Qwen3OmniMoeForConditionalGeneration", "qwen3_omni_moe"},
               {"Qwen3OmniMoeThinkerForConditionalGeneration", "qwen3_omni_moe_thinker"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_SPARSE_STEP, .step_field = "decoder_sparse_step", .step_default = 1, .list_field = "mlp_only_layers"},
     .prefixes = {"thinker.model.layers.%L.mlp." /* as saved and released */,
                  "thinker.model.language_model.layers.%L.mlp." /* save_original_format=False */,
                  "model.layers.%L.mlp." /* the thinker alone, as saved */,
                  "model.language_model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* GraniteMoeSharedMoE: Granite-MoE's router (top-k on the logits, softmax of the k) in
     * every layer; the decoder layer adds its shared_mlp (ungated, input_linear [2 I_s, H]
     * chunked gate then up, output_linear [H, I_s], hidden_act) to the block's output, on the
     * same input: the block's shared expert here. shared_intermediate_size defaults to 0 (none) */
    {.family = MOE_FAMILY_GRANITE_MOE_SHARED, .name = "granitemoeshared",
     .names = {{"GraniteMoeSharedForCausalLM", "granitemoeshared"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_intermediate_size", .field_optional = true, .field_default = 0,
                .module = "shared_mlp", .prefix = "model.layers.%L.", .fused_gate_up = "input_linear",
                .fused_down = "output_linear"},
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.layer.weight" /* as released */, "router.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe."},
     .stacked = {{"experts.gate_up_proj", "experts.down_proj"}, {"input_linear.weight", "output_linear.weight"}}},
    /* GraniteMoeHybridMoE (Granite 4.0): the same block and shared_mlp in every layer, Mamba or
     * attention alike; shared_intermediate_size defaults to 1024; num_local_experts 0 (the
     * dense Granite 4.0 models): no MoE layer */
    {.family = MOE_FAMILY_GRANITE_MOE_HYBRID, .name = "granitemoehybrid",
     .names = {{"GraniteMoeHybridForCausalLM", "granitemoehybrid"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_intermediate_size", .field_optional = true, .field_default = 1024,
                .module = "shared_mlp", .prefix = "model.layers.%L.", .fused_gate_up = "input_linear",
                .fused_down = "output_linear"},
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.layer.weight" /* as released */, "router.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe."},
     .stacked = {{"experts.gate_up_proj", "experts.down_proj"}, {"input_linear.weight", "output_linear.weight"}}},

    /* LaraMiniSparseMoeBlock (Lara-Mini; its gated-delta-net layers are attention only):
     * LaraMiniTopKRouter is softmax over the f32 logits, top-k, renormalized when
     * norm_topk_prob (default true); the shared expert added ungated; every layer */
    {.family = MOE_FAMILY_LARA_MINI, .name = "lara_mini", .names = {{"LaraMiniForCausalLM", "lara_mini"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, false, "shared_expert"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* HunYuanMoEV1Moe (Hunyuan-A13B): HunYuanMoEV1Gate is softmax, top-k, always renormalized
     * (no epsilon), its gate.wg in float32; plus shared_mlp (ungated, intermediate_size wide, as
     * the experts) in every layer. K is moe_topk (num_experts_per_tok is its alias); moe_topk
     * and num_experts may be per-layer lists */
    {.family = MOE_FAMILY_HUNYUAN_V1_MOE, .name = "hunyuan_v1_moe", .names = {{"HunYuanMoEV1ForCausalLM", "hunyuan_v1_moe"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .top_k_field = "moe_topk", .per_layer_lists = true,
     .shared = {MOE_FAM_SHARED_SAME_AS_I, .module = "shared_mlp"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.wg.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Qwen4ExpTextSparseMoeBlock (Qwen4-Exp's decoder; its hyper-connections, n-gram and PLE
     * embeddings and indexed attention are outside the block): Qwen4ExpTextTopKRouter is
     * softmax in f32, top-k, renormalized when norm_topk_prob (default true; no epsilon, as
     * Laguna); a sigmoid-gated shared expert; every layer. ConditionalGeneration keeps the
     * decoder under model.language_model. */
    {.family = MOE_FAMILY_QWEN4_EXP, .name = "qwen4_exp", .text_config = true,
     .names = {{"Qwen4ExpForConditionalGeneration", "qwen4_exp"}, {"Qwen4ExpForCausalLM", "qwen4_exp_text"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "shared_expert_intermediate_size", 0, true, "shared_expert", "shared_expert_gate"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.language_model.layers.%L.mlp." /* ConditionalGeneration */, "model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* PhimoeSparseMoeBlock (Phi-3.5-MoE): PhimoeTopKRouter (mlp.router in memory;
     * block_sparse_moe.gate as released and as save_pretrained writes it) runs sparsemixer on the
     * logits with router_jitter_noise (default 0.01), two experts, no renormalization; Mixtral's
     * experts (w1 / w3 / w2 as released) in every layer; hidden_act (silu). */
    {.family = MOE_FAMILY_PHIMOE, .name = "phimoe", .names = {{"PhimoeForCausalLM", "phimoe"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SPARSEMIXER, .renormalize = {MOE_FAM_RENORM_NEVER},
     .sparsemixer_eps = {"router_jitter_noise", 0.01},
     .router = {"gate.weight" /* as released and saved */, "router.weight" /* in-memory naming */},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe." /* as released and saved */, "model.layers.%L.mlp."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* JetMoeMoE (the MLP block; the MoA attention is not it): JetMoeTopKGating is top-k on
     * the logits then softmax over the k (Granite-MoE's); experts stacked as input_linear
     * [E, 2I, H] (gate rows, then up) and output_linear [E, H, I]; activation_function (silu)
     * gates; the block adds its `bias` [H] to the output; every layer. */
    {.family = MOE_FAMILY_JETMOE, .name = "jetmoe", .names = {{"JetMoeForCausalLM", "jetmoe"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.layer.weight"}, .output_bias = "bias",
     .activation = {MOE_FAM_ACT_HIDDEN_ACT, .field = "activation_function"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .stacked = {{"input_linear.weight", "output_linear.weight"}}},

    /* OpenAIPrivacyFilterMLP (a bidirectional token-classification encoder): gpt-oss's block --
     * OpenAIPrivacyFilterTopKRouter is top-k on l = Wr x + b and softmax over the k (it divides
     * the weights by top_k and the block multiplies its output by top_k again: the same sum up
     * to rounding), OpenAIPrivacyFilterExperts the clamped SwiGLU with biases, in f32 -- but
     * gate_up_proj's columns are halves (chunk(2): gate first), not interleaved; every layer */
    {.family = MOE_FAMILY_OPENAI_PRIVACY_FILTER, .name = "openai_privacy_filter",
     .names = {{"OpenAIPrivacyFilterForTokenClassification", "openai_privacy_filter"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.weight"}, .router_bias = "router.bias",
     .activation = {MOE_FAM_ACT_CLAMPED_SWIGLU, "swiglu_alpha", "swiglu_limit", 1.702, 7.0},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .input_major = {"experts.gate_up_proj", "experts.down_proj", false, "experts.gate_up_proj_bias", "experts.down_proj_bias"}},
    /* MellumSparseMoeBlock (JetBrains Mellum): Qwen3-MoE's router (softmax, norm_topk_prob,
     * default true), no shared expert; MoE layers by mlp_layer_types (absent: MellumConfig
     * makes every layer "sparse"); its MTP layers are outside num_hidden_layers */
    {.family = MOE_FAMILY_MELLUM, .name = "mellum", .names = {{"MellumForCausalLM", "mellum"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 0, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* JambaSparseMoeBlock: JambaTopKRouter is softmax then top-k, never renormalized; no
     * shared expert; MoE where layer % expert_layer_period (2) == expert_layer_offset (1) and
     * num_experts > 1, in Mamba and attention layers alike (the mixer is not the block) */
    {.family = MOE_FAMILY_JAMBA, .name = "jamba", .names = {{"JambaForCausalLM", "jamba"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_NEVER},
     .router = {"router.weight"},
     .layers = {MOE_FAM_LAYERS_PERIOD_OFFSET, "expert_layer_offset", 1, "expert_layer_period", 2},
     .prefixes = {"model.layers.%L.feed_forward."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Mistral4MoE (Mistral Small 4): Mistral4TopkRouter takes the softmax scores, groups them
     * by the sum of their two best (masking the others to 0), top-k, renormalizes (+1e-20)
     * when norm_topk_prob (default true), times routed_scaling_factor (1); Mistral4Config's
     * n_group / topk_group default 1 (no groups; read by sigmoid_groups_routing, which only
     * reads the group fields); n_shared_experts (1) * I shared, ungated; MoE from
     * first_k_dense_replace (0) */
    {.family = MOE_FAMILY_MISTRAL4, .name = "mistral4", .names = {{"Mistral4ForCausalLM", "mistral4"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "first_k_dense_replace", 0, "moe_layer_freq", 1},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* AriaTextMoELayer: AriaTextTopKRouter is top-k on the logits, softmax of the k (Granite's);
     * moe_num_shared_experts (2) * I shared, ungated, with hidden_act, while AriaExperts are
     * always SiLU-gated; mlp_bias would give the shared MLP biases; every layer MoE. K is
     * moe_topk. Experts as saved: input-major experts.fc1.weight [E, H, 2I] (chunked gate
     * then up) and experts.fc2.weight [E, I, H]; released under language_model.model. */
    {.family = MOE_FAMILY_ARIA, .name = "aria", .text_config = true,
     .names = {{"AriaForConditionalGeneration", "aria"}, {"AriaTextForCausalLM", "aria_text"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "moe_num_experts", .experts_alias = "num_experts", .experts_min = 1,
     .top_k_field = "moe_topk",
     .shared = {MOE_FAM_SHARED_COUNT, "moe_num_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_TOPK_SOFTMAX,
     .router = {"router.weight"},
     .activation = {MOE_FAM_ACT_SILU_ONLY}, .refuse_true = {"mlp_bias", "the MLPs (the shared expert's projections) get biases"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"language_model.model.layers.%L.mlp." /* as saved and released */,
                  "model.language_model.layers.%L.mlp.", "model.layers.%L.mlp." /* AriaTextForCausalLM */},
     .input_major = {"experts.fc1.weight", "experts.fc2.weight", false}},

    /* Ernie4_5_MoeSparseMoeBlock (ERNIE-4.5-MoE): Ernie4_5_MoeTopKRouter in f32: softmax, top-k
     * on the scores plus moe_statics.e_score_correction_bias ([1, E]), weights the unbiased
     * scores / clamp(sum, moe_norm_min); moe_num_shared_experts (2) * I shared, ungated; MoE
     * where (L + 1) % moe_layer_interval (1) == 0 and moe_layer_start_index (1) <= L <=
     * moe_layer_end_index (-1: the last); K is moe_k; use_bias would bias the MLPs */
    {.family = MOE_FAMILY_ERNIE4_5_MOE, .name = "ernie4_5_moe", .names = {{"Ernie4_5_MoeForCausalLM", "ernie4_5_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "moe_num_experts", .experts_alias = "num_experts", .experts_min = 0,
     .top_k_field = "moe_k",
     .shared = {MOE_FAM_SHARED_COUNT, "moe_num_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"}, .selection_bias = "moe_statics.e_score_correction_bias",
     .renorm_min_field = "moe_norm_min", .renorm_min = 1e-12, .refuse_true = {"use_bias", "the MLPs get biases"},
     .layers = {MOE_FAM_LAYERS_INTERVAL_RANGE, "moe_layer_start_index", 1, "moe_layer_interval", 1,
                .last_field = "moe_layer_end_index"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* GlmMoeDsaMoE (GLM-5; its DSA indexed attention is not the block): DeepseekV32MoE line for
     * line (router, experts, block); GlmMoeDsaConfig's defaults: n_group 1, norm_topk_prob true,
     * routed_scaling_factor 2.5, one shared expert; MoE layers by mlp_layer_types (absent: layer
     * >= first_k_dense_replace, default 3) */
    {.family = MOE_FAMILY_GLM_MOE_DSA, .name = "glm_moe_dsa", .names = {{"GlmMoeDsaForCausalLM", "glm_moe_dsa"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 3, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* SolarOpenMoE (Solar-Open): Glm4Moe's router, experts and block; SolarOpenConfig's
     * defaults: n_group 1, norm_topk_prob true, routed_scaling_factor 1, one shared expert; every
     * layer MoE */
    {.family = MOE_FAMILY_SOLAR_OPEN, .name = "solar_open", .names = {{"SolarOpenForCausalLM", "solar_open"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Glm4vMoeTextMoE (GLM-4.5V's decoder): Glm4Moe's router, experts and block under the
     * multimodal wrapper (text_config, model.language_model.); Glm4vMoeTextConfig's defaults:
     * n_group 1, norm_topk_prob true, routed_scaling_factor 1, one shared expert,
     * first_k_dense_replace 1 (Glm4vMoeTextDecoderLayer: layer >= first_k_dense_replace; the
     * class has no moe_layer_freq, whose default 1 keeps that rule) */
    {.family = MOE_FAMILY_GLM4V_MOE, .name = "glm4v_moe", .text_config = true,
     .names = {{"Glm4vMoeForConditionalGeneration", "glm4v_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "first_k_dense_replace", 1, "moe_layer_freq", 1},
     .prefixes = {"model.language_model.layers.%L.mlp." /* ConditionalGeneration */, "model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* KimiLinearMoE (Kimi-Linear; its KDA linear attention is not the block): Glm4Moe's router,
     * experts and block. KimiLinearConfig's attribute_map writes config.json as num_experts,
     * num_experts_per_token, moe_renormalize, num_expert_group, num_shared_experts; defaults:
     * one group, renormalized, routed_scaling_factor 2.446, one shared expert; MoE layers by
     * mlp_layer_types (absent: layer >= first_k_dense_replace, default 1). save_pretrained
     * writes the block under block_sparse_moe. with w1 / w3 / w2 (its conversion mapping) */
    {.family = MOE_FAMILY_KIMI_LINEAR, .name = "kimi_linear", .names = {{"KimiLinearForCausalLM", "kimi_linear"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .top_k_field = "num_experts_per_token", .top_k_alias = "num_experts_per_tok",
     .aliases = {{"moe_renormalize", "norm_topk_prob"}, {"num_expert_group", "n_group"},
                 {"num_shared_experts", "n_shared_experts"}},
     .shared = {MOE_FAM_SHARED_COUNT, "num_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "moe_renormalize", true},
     .routed_scaling = {"routed_scaling_factor", 2.446},
     .groups = {"num_expert_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.block_sparse_moe." /* as saved */, "model.layers.%L.mlp."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* BailingHybridMoE (Ling / Ring hybrid linear; the linear attention is not the block):
     * Glm4Moe's router, experts and block, under Kimi-Linear's config names; defaults: 8 groups
     * keep 4, renormalized, routed_scaling_factor 2.5, one shared expert; MoE layers by
     * mlp_layer_types (absent: layer >= first_k_dense_replace, default 2). save_pretrained
     * writes the selection bias as gate.expert_bias (its conversion mapping) */
    {.family = MOE_FAMILY_BAILING_HYBRID, .name = "bailing_hybrid",
     .names = {{"BailingHybridForCausalLM", "bailing_hybrid"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .top_k_field = "num_experts_per_token", .top_k_alias = "num_experts_per_tok",
     .aliases = {{"moe_renormalize", "norm_topk_prob"}, {"num_expert_group", "n_group"},
                 {"num_shared_experts", "n_shared_experts"}},
     .shared = {MOE_FAM_SHARED_COUNT, "num_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "moe_renormalize", true},
     .routed_scaling = {"routed_scaling_factor", 2.5},
     .groups = {"num_expert_group", "topk_group", 8, 4, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.expert_bias" /* as saved */,
     .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 2, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* MiniMaxM2SparseMoeBlock (MiniMax-M2): MiniMaxM2TopKRouter, sigmoid + the block's
     * e_score_correction_bias, top-k without groups, always renormalized (no epsilon), no
     * scaling, no shared expert; every layer. Saved as Mixtral is (block_sparse_moe., w1 / w3 /
     * w2), the bias beside the gate */
    {.family = MOE_FAMILY_MINIMAX_M2, .name = "minimax_m2", .names = {{"MiniMaxM2ForCausalLM", "minimax_m2"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_local_experts", .experts_alias = "num_experts", .experts_min = 1,
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"}, .selection_bias = "e_score_correction_bias",
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.block_sparse_moe." /* as saved */, "model.layers.%L.mlp."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* HYV3MoE (Hunyuan-V3): HYV3TopKRouter, sigmoid + the block's e_score_correction_bias, top-k
     * without groups, always renormalized, times router_scaling_factor (default 2.826);
     * num_shared_experts (default 1) ungated shared experts; MoE layers by mlp_layer_types
     * (absent: every layer but the first). Saved (its conversion mapping) with the router as
     * router.gate.weight, the bias as expert_bias and the shared expert as shared_mlp. With
     * mlp_bias true the shared expert (HYV3MLP) gets biases, which is refused */
    {.family = MOE_FAMILY_HY_V3, .name = "hy_v3", .names = {{"HYV3ForCausalLM", "hy_v3"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "num_shared_experts", 1, false, "shared_mlp" /* as saved */},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"router_scaling_factor", 2.826},
     .router = {"router.gate.weight" /* as saved */, "gate.weight"}, .selection_bias = "expert_bias" /* as saved */,
     .refuse_true = {"mlp_bias", "the shared expert's projections (HYV3MLP) get biases"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* AXK2MoE (A.X-K2; its DSA attention and gated norms are not the block): DeepSeek-V3's
     * router, experts and block; AXK2Config's defaults: no groups (n_group None; grouped configs
     * are refused, axk2_routing), norm_topk_prob true, routed_scaling_factor 2.5, one shared
     * expert; MoE layers by mlp_layer_types (absent: layer >= first_k_dense_replace, default 1,
     * and layer % moe_layer_freq == 0, default 1) */
    {.family = MOE_FAMILY_AXK2, .name = "axk2", .names = {{"AXK2ForCausalLM", "axk2"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = axk2_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, "moe_layer_freq", 1, "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Glm5NextTextMoE (GLM-5-Next's decoder; its linear / DSA attention and hyper-connections
     * are not the block): Glm4Moe's router and block; the routed experts
     * (Glm5NextTextExperts._apply_gate) and the shared expert (Glm5NextTextMLP) clamp the gate
     * above and the up projection on both sides at swiglu_limit (default 10) before silu(g) * u:
     * MOE_ACT_SWIGLU_CLAMP. Glm5NextTextConfig's defaults: n_group 1, norm_topk_prob true,
     * routed_scaling_factor 2.5, one shared expert; MoE layers by mlp_layer_types (absent: every
     * layer but the first 3). Under the multimodal wrapper (text_config, model.language_model.) */
    {.family = MOE_FAMILY_GLM5_NEXT, .name = "glm5_next", .text_config = true,
     .names = {{"Glm5NextForConditionalGeneration", "glm5_next"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .activation = {MOE_FAM_ACT_CLAMPED_SILU, NULL, "swiglu_limit", 0.0, 10.0},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 3, .list_field = "mlp_layer_types"},
     .prefixes = {"model.language_model.layers.%L.mlp." /* ConditionalGeneration */, "model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* AXK1MoE (A.X-K1; transformers 5.24 axk1/modeling_axk1.py): DeepSeek-V3's router (AXK1TopkRouter:
     * sigmoid + e_score_correction_bias, top-2-sum groups masked with -inf, norm_topk_prob + 1e-20,
     * routed_scaling_factor), experts and ungated shared expert, then post_mlp_layernorm, an
     * RMSNorm (weight [H], rms_norm_eps) of routed + shared: has_output_norm. AXK1Config's
     * defaults: 8 groups keep 4, norm_topk_prob true, 2.5, one shared expert, rms_norm_eps 1e-6;
     * MoE layers by mlp_layer_types (the config class writes it from first_k_dense_replace 1 and
     * moe_layer_freq 1). Released checkpoints and save_pretrained keep the norm beside the block,
     * model.layers.L.post_mlp_layernorm.weight (the conversion mapping moves it under mlp. on
     * load) */
    {.family = MOE_FAMILY_AXK1, .name = "axk1", .names = {{"AXK1ForCausalLM", "axk1"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.5}, .groups = {"n_group", "topk_group", 8, 4, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .output_norm = "model.layers.%L.post_mlp_layernorm.weight" /* as saved */,
     .output_norm_eps = {"rms_norm_eps", 1e-6},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, "moe_layer_freq", 1, "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Inkling2SparseMoeBlock (transformers 5.24 inkling2/modeling_inkling2.py; its block
     * attention residuals and short convolutions are not the block): Inkling2TopKRouter, f32
     * sigmoid scores + e_score_correction_bias for the choice, top-k without groups, always
     * renormalized (+ 1e-20), times routed_scaling_factor (config.json `route_scale`, default
     * 8); Inkling2Experts with Inkling2SoftcappedSwiGLU (MOE_ACT_SWIGLU_SOFTCAP,
     * mlp_gate_softcap 4, mlp_up_softcap 25); no shared expert; every layer. Under text_config.
     * save_pretrained writes the original names (its conversion mapping reversed):
     * model.llm.layers.L.mlp. with experts.w13_weight [E, 2I, H] interleaving gate / up rows,
     * experts.w2_weight [E, H, I], gate.weight and the selection bias as gate.bias */
    {.family = MOE_FAMILY_INKLING2, .name = "inkling2", .text_config = true,
     .names = {{"Inkling2ForConditionalGeneration", "inkling2"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .aliases = {{"route_scale", "routed_scaling_factor"}},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"route_scale", 8.0},
     .router = {"gate.weight"}, .selection_bias = "gate.bias" /* as saved */, .routing_hook = inkling2_routing,
     .activation = {MOE_FAM_ACT_SOFTCAPPED_SWIGLU, "mlp_gate_softcap", "mlp_up_softcap", 4.0, 25.0},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.llm.layers.%L.mlp." /* as saved */},
     .stacked = {{"experts.w13_weight", "experts.w2_weight", true}}},

    /* Inkling2LoopSparseMoeBlock (inkling2_loop/modeling_inkling2_loop.py): Inkling2's block,
     * router and softcapped experts line for line (its looped layers run the same block again,
     * outside it); Inkling2LoopTextConfig defaults: 128 experts, route_scale 8, the same softcaps.
     * Saved as Inkling2 is */
    {.family = MOE_FAMILY_INKLING2_LOOP, .name = "inkling2_loop", .text_config = true,
     .names = {{"Inkling2LoopForConditionalGeneration", "inkling2_loop"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .aliases = {{"route_scale", "routed_scaling_factor"}},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"route_scale", 8.0},
     .router = {"gate.weight"}, .selection_bias = "gate.bias" /* as saved */, .routing_hook = inkling2_routing,
     .activation = {MOE_FAM_ACT_SOFTCAPPED_SWIGLU, "mlp_gate_softcap", "mlp_up_softcap", 4.0, 25.0},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.llm.layers.%L.mlp." /* as saved */},
     .stacked = {{"experts.w13_weight", "experts.w2_weight", true}}},

    /* HYV4MoE (transformers 5.24 hy_v4/modeling_hy_v4.py; hyper-connections and the indexed
     * attention are not the block): HYV4TopkRouter is Glm4Moe's (f32 sigmoid +
     * e_score_correction_bias, n_group groups by top-2 sum, norm_topk_prob + 1e-20, times
     * routed_scaling_factor, default 2.827); HYV4Experts._apply_gate clamps (MOE_ACT_SWIGLU_CLAMP,
     * swiglu_limit 10) while the shared expert HYV4MLP (n_shared_experts * I) applies
     * ACT2FN[hidden_act] unclamped: has_shared_activation. HYV4Config defaults: n_group 1,
     * norm_topk_prob true, one shared expert; MoE layers by mlp_layer_types (absent: every layer
     * but the first) */
    {.family = MOE_FAMILY_HY_V4, .name = "hy_v4", .names = {{"HYV4ForCausalLM", "hy_v4"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts",
                .gate_proj = "linear_gate" /* as saved */},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.827}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .activation = {MOE_FAM_ACT_CLAMPED_SILU_OWN_SHARED, NULL, "swiglu_limit", 0.0, 10.0},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* HYV4VLForConditionalGeneration: HY-V4's text MoE under text_config (HYV4VLTextConfig),
     * the decoder at model.language_model. */
    {.family = MOE_FAMILY_HY_V4_VL, .name = "hy_v4_vl", .text_config = true,
     .names = {{"HYV4VLForConditionalGeneration", "hy_v4_vl"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts",
                .gate_proj = "linear_gate" /* as saved */},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 2.827}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .activation = {MOE_FAM_ACT_CLAMPED_SILU_OWN_SHARED, NULL, "swiglu_limit", 0.0, 10.0},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp." /* as saved */, "model.language_model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Lfm2MoeSparseMoeBlock (transformers 5.24 lfm2_moe/modeling_lfm2_moe.py; the decoder's conv /
     * attention operators are not the block): Lfm2MoeTopKRouter (gate) is sigmoid, the top-k on
     * the scores + the block's expert_bias buffer when use_expert_bias (default true; false: no
     * bias, none saved), the weights the unbiased scores, renormalized when norm_topk_prob
     * (default true) as w / (sum + 1e-6), times routed_scaling_factor (default 1); Lfm2MoeExperts
     * always F.silu (the config has no hidden_act); no shared expert. MoE layers: layer >=
     * num_dense_layers (default 2). Saved (its conversion mapping reversed) as
     * feed_forward.experts.<e>.w1 / w3 / w2 */
    {.family = MOE_FAMILY_LFM2_MOE, .name = "lfm2_moe", .names = {{"Lfm2MoeForCausalLM", "lfm2_moe"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true, true, 1e-6},
     .routed_scaling = {"routed_scaling_factor", 1.0},
     .router = {"gate.weight"}, .selection_bias = "expert_bias" /* as saved: the block's buffer */,
     .selection_bias_on = {"use_expert_bias", true},
     .layers = {MOE_FAM_LAYERS_DENSE_PREFIX, "num_dense_layers", 2},
     .prefixes = {"model.layers.%L.feed_forward."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Cohere2MoeSparseMoeBlock (transformers 5.24 cohere2_moe/modeling_cohere2_moe.py):
     * Cohere2MoeTopKRouter (gate) takes the top-k of the logits, then by expert_selection_fn
     * (default "softmax") the softmax of the k (norm_topk_prob not applied) or their sigmoid,
     * divided by the sum alone when norm_topk_prob (default true); num_shared_experts (default 0)
     * * intermediate_size ungated shared experts, joined by shared_expert_combination_strategy
     * (default "average": (routed + shared) / 2; "sum"). MoE layers by mlp_layer_types (the
     * class fills it from first_k_dense_replace, default 0: every layer). Saved (qwen2_moe's
     * conversion mapping) per expert, gate_proj / up_proj / down_proj */
    {.family = MOE_FAMILY_COHERE2_MOE, .name = "cohere2_moe", .names = {{"Cohere2MoeForCausalLM", "cohere2_moe"}},
     .intermediate_field = "intermediate_size",
     .experts_field = "num_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "num_shared_experts", 0, false, "shared_experts",
                .combine = {"shared_expert_combination_strategy", "average",
                            {{"average", 0.5, 0.5}, {"sum", 1.0, 1.0}}}},
     .scoring = MOE_SCORING_TOPK_SOFTMAX, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true, true, 0.0},
     .scoring_by = {"expert_selection_fn", "softmax",
                    {{"softmax", MOE_SCORING_TOPK_SOFTMAX, false}, {"sigmoid", MOE_SCORING_TOPK_SIGMOID, true}}},
     .router = {"gate.weight"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 0, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},
    /* LongcatFlashMoE (transformers 5.24 longcat_flash/modeling_longcat_flash.py; the decoder
     * layer's two attention sublayers and two dense MLPs `mlps` are not the block, whose output
     * the layer adds as a shortcut): LongcatFlashTopkRouter scores n_routed_experts +
     * zero_expert_num experts (classifier [E + Z, H] in f32, its bias never applied: F.linear
     * on the weight alone), softmax over all E + Z, e_score_correction_bias [E + Z] for the
     * choice, top-k (moe_topk), not renormalized, times routed_scaling_factor (default 6);
     * LongcatFlashExperts: ids >= E are identity experts (w * x: num_identity_experts); I =
     * expert_ffn_hidden_size; every layer; the layer count is `num_layers`. save_pretrained
     * writes per-expert names (the qwen2_moe conversion reversed): experts.e.{gate,up,down}_proj
     * for e < E and experts.e.{gate,up}_proj for the Z identity slots too (gate_up_proj is
     * [E + Z, 2I, H]), which nothing reads. zero_expert_type (the released config's "identity",
     * not a LongcatFlashConfig field) must be "identity" */
    {.family = MOE_FAMILY_LONGCAT_FLASH, .name = "longcat_flash", .names = {{"LongcatFlashForCausalLM", "longcat_flash"}},
     .intermediate_field = "expert_ffn_hidden_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .top_k_field = "moe_topk",
     .aliases = {{"expert_ffn_hidden_size", "moe_intermediate_size"}},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_NEVER},
     .routed_scaling = {"routed_scaling_factor", 6.0},
     .router = {"router.classifier.weight"}, .selection_bias = "router.e_score_correction_bias",
     .identity = {"zero_expert_num", 256, "zero_expert_type", "identity"},
     .num_layers_field = "num_layers",
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}},

    /* DeepseekV4SparseMoeBlock (transformers 5.24 deepseek_v4/modeling_deepseek_v4.py; the
     * hyper-connections, compressed attention and the decoder's norms are not the block):
     * DeepseekV4TopKRouter scores s = sqrt(softplus(l)) (scoring_func "sqrtsoftplus"), selects
     * the top-k of s + e_score_correction_bias (no groups), w = s / (sum + 1e-20) always
     * (norm_topk_prob is not read), times routed_scaling_factor (default 1.5); DeepseekV4Experts
     * and the one shared DeepseekV4MLP (intermediate_size = moe_intermediate_size: I, whatever
     * n_shared_experts says) both compute act(min(g, swiglu_limit)) * clamp(u, +-limit):
     * MOE_ACT_SWIGLU_CLAMP (limit default 10). Every layer is an MoE block; the "hash_moe" ones
     * of mlp_layer_types (DeepseekV4HashRouter: experts = tid2eid[input_ids]) are refused per
     * layer. mlp_bias (biased shared expert) is refused. Saved in the released names:
     * model.layers.L.ffn., gate.bias (the correction bias), experts.<e>.w1 / w3 / w2,
     * shared_experts.w1 / w3 / w2 */
    {.family = MOE_FAMILY_DEEPSEEK_V4, .name = "deepseek_v4", .names = {{"DeepseekV4ForCausalLM", "deepseek_v4"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_SAME_AS_I, NULL, 0, false, "shared_experts", .gate_proj = "w1" /* as saved */,
                .up_proj = "w3", .down_proj = "w2"},
     .scoring = MOE_SCORING_SQRTSOFTPLUS, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"routed_scaling_factor", 1.5},
     .router = {"gate.weight"}, .selection_bias = "gate.bias" /* as saved */, .routing_hook = deepseek_v4_routing,
     .activation = {MOE_FAM_ACT_CLAMPED_SILU, NULL, "swiglu_limit", 0.0, 10.0},
     .refuse_true = {"mlp_bias", "DeepseekV4MLP's biased gate / up / down projections (the shared expert)"},
     .refuse_layers = {"mlp_layer_types", "hash_moe", "moe", "num_hash_layers", 3,
                       "DeepseekV4HashRouter chooses this layer's experts by tid2eid[input_ids], a table of token "
                       "ids the MoE layer is never given; running it would take caller-given top-k ids "
                       "(moe_exec_args.in_topk_ids = tid2eid[input_ids], weights from the sqrtsoftplus scores), "
                       "which moe_checkpoint does not load"},
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"model.layers.%L.ffn." /* as saved */, "model.layers.%L.mlp."},
     .per_expert = {{"w1", "w3", "w2"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* Step3p7SparseMoeBlock (transformers 5.24 step3p7/modeling_step3p7.py, text MoE under
     * text_config): Step3p7TopKRouter is MiniMax-M3's (f32 sigmoid, top-k of s +
     * e_score_correction_bias, renormalized without an epsilon), the routed sum times
     * moe_router_scaling_factor (default 1); Step3p7Experts._apply_gate and the shared
     * Step3p7MLP (share_expert_dim) clamp after the activation, min(silu(g), limit) *
     * clamp(u, +-limit) (MOE_ACT_SWIGLU_POSTCLAMP) with per-layer limits swiglu_limits[L] and
     * swiglu_limits_shared[L] (absent, null or 0: no clamp); mlp_bias (a biased shared expert)
     * is refused. MoE layers by mlp_layer_types (Step3p7TextConfig writes it; absent: every layer
     * from 3). Saved in the released names: model.layers.L.moe. with gate.weight, router_bias,
     * the gate and up stacks apart (gate_proj / up_proj.weight [E, I, H]) and down_proj.weight;
     * the shared expert beside the block, model.layers.L.share_expert. */
    {.family = MOE_FAMILY_STEP3P7, .name = "step3p7", .text_config = true,
     .names = {{"Step3p7ForConditionalGeneration", "step3p7"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 1,
     .shared = {MOE_FAM_SHARED_FIELD, "share_expert_dim", 0, false, "share_expert", .prefix = "model.layers.%L.",
                .field_optional = true, .field_default = 1280},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"moe_router_scaling_factor", 1.0},
     .router = {"gate.weight"}, .selection_bias = "router_bias" /* as saved */,
     .activation = {MOE_FAM_ACT_POSTCLAMP_LAYER_LISTS, NULL, "swiglu_limits", 0.0, 0.0,
                    .shared_limit_field = "swiglu_limits_shared"},
     .refuse_true = {"mlp_bias", "Step3p7MLP's biased gate / up / down projections (the shared expert)"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 3, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.moe." /* as saved */},
     .stacked = {{"gate_proj.weight", "down_proj.weight", false, "up_proj.weight"},
                 {"experts.gate_up_proj", "experts.down_proj"}}},

    /* DeepseekOcr2TextMoe (transformers 5.24 deepseek_ocr2/modeling_deepseek_ocr2.py; the SAM /
     * Qwen2 vision towers are not the block): DeepseekOcr2TextTopkRouter is DeepseekV2TopkRouter
     * line for line (f32 softmax, topk_method "greedy" or "group_limited_greedy" by the group max
     * with n_group / topk_group, never renormalized, times routed_scaling_factor), the experts
     * SwiGLU (hidden_act), n_shared_experts (2) * I ungated shared experts (DeepseekOcr2TextMLP,
     * biased when mlp_bias: refused). MoE layers: mlp_layer_types[L] == "sparse", which the
     * decoder layer indexes and DeepseekOcr2TextConfig does not default (list_required). Under
     * text_config; saved as model.layers.L.mlp. (the conversion mapping's language_model.
     * reversed) */
    {.family = MOE_FAMILY_DEEPSEEK_OCR2, .name = "deepseek_ocr2", .text_config = true,
     .names = {{"DeepseekOcr2ForConditionalGeneration", "deepseek_ocr2"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_NEVER, "norm_topk_prob", false},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_MAX},
     .router = {"gate.weight"}, .routing_hook = deepseek_v2_routing,
     .refuse_true = {"mlp_bias", "the shared experts' projections get biases"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .list_field = "mlp_layer_types", .list_required = true},
     .prefixes = {"model.layers.%L.mlp." /* as saved */, "model.language_model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* UnlimitedOcrTextMoe (transformers 5.24 unlimited_ocr/modeling_unlimited_ocr.py): DeepSeek-OCR-2's
     * block line for line (UnlimitedOcrTextTopkRouter = DeepseekV2TopkRouter's code, the same
     * experts and ungated shared experts, mlp_bias refused). UnlimitedOcrTextConfig fills an absent
     * mlp_layer_types from first_k_dense_replace (1); the original checkpoints keep the text fields
     * in language_config (read first), save_pretrained in text_config; saved as
     * model.layers.L.mlp. */
    {.family = MOE_FAMILY_UNLIMITED_OCR, .name = "unlimited_ocr", .text_config = true,
     .config_path = "language_config.",
     .names = {{"UnlimitedOcrForConditionalGeneration", "unlimited_ocr"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_NEVER, "norm_topk_prob", false},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_MAX},
     .router = {"gate.weight"}, .routing_hook = deepseek_v2_routing,
     .refuse_true = {"mlp_bias", "the shared experts' projections get biases"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp." /* as saved */, "model.language_model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},

    /* MistralLarge4TextMoE (transformers 5.24 mistral_large4/modeling_mistral_large4.py; its
     * indexer / sparse attention is not the block): MistralLarge4TextTopkRouter is
     * Mistral4TopkRouter with f32 logits (libmoe's router is f32) and the renormalization always
     * on: softmax scores, n_group groups by the sum of their two best (the others masked to 0, the
     * same choice as -inf over positive scores), top-k, w / (sum + 1e-20), times
     * routed_scaling_factor; MistralLarge4TextExperts (SwiGLU, hidden_act) and the ungated
     * shared expert (n_shared_experts * I). MistralLarge4TextConfig defaults: n_group 1, scale 1,
     * one shared expert; MoE layers by mlp_layer_types (the class writes it: first_k_dense_replace
     * (1) dense layers, then sparse). Under text_config. save_pretrained writes Mistral's own
     * names (its conversion mapping reversed): layers.L.gate.weight, layers.L.experts.<e>.w1 / w3
     * / w2, layers.L.shared_experts.w1 / w3 / w2 */
    {.family = MOE_FAMILY_MISTRAL_LARGE4, .name = "mistral_large4", .text_config = true,
     .names = {{"MistralLarge4ForConditionalGeneration", "mistral_large4"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {MOE_FAM_SHARED_COUNT, "n_shared_experts", 1, false, "shared_experts",
                .gate_proj = "w1", .up_proj = "w3", .down_proj = "w2" /* as saved */},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, .list_field = "mlp_layer_types"},
     .prefixes = {"layers.%L." /* as saved */}, .block_parts = {"gate.", "experts.", "shared_experts."},
     .per_expert = {{"w1", "w3", "w2"}}},
    /* NemotronHMoE (transformers 5.24 nemotron_h/modeling_nemotron_h.py; the "moe" mixer of a
     * NemotronHBlock, between its pre-norm and its residual): NemotronHTopkRouter, f32 sigmoid
     * scores + e_score_correction_bias for the choice, groups by the top-2 sum masked with -inf
     * (n_group, topk_group; NemotronHConfig's default 1 / 1: no group-limited selection), the
     * weights the unbiased scores, renormalized (sum + 1e-20) when norm_topk_prob (default
     * true), then times routed_scaling_factor (default 1.0) either way; NemotronHExperts are
     * non-gated, down_proj(ACT2FN[mlp_hidden_act](up_proj x)) (MOE_FAM_ACT_NONGATED, default
     * "relu2": MOE_ACT_RELU2); shared_experts a NemotronHMLP of
     * moe_shared_expert_intermediate_size (default 7688) with the same activation, ungated,
     * added unscaled. MoE layers: layers_block_type[L] == "moe" (the legacy
     * hybrid_override_pattern's 'E'; default list [linear_attention, moe, full_attention, mlp]).
     * moe_latent_size (fc1 / fc2 latent projections around the routed experts) and mlp_bias
     * (biased shared MLP and latent projections) are refused. save_pretrained writes
     * backbone.layers.L.mixer. with experts.<e>.up_proj / down_proj.weight (no gate_proj) */
    {.family = MOE_FAMILY_NEMOTRON_H, .name = "nemotron_h", .names = {{"NemotronHForCausalLM", "nemotron_h"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     .shared = {.rule = MOE_FAM_SHARED_FIELD, .field = "moe_shared_expert_intermediate_size", .gated = false,
                .module = "shared_experts", .field_optional = true, .field_default = 7688},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .activation = {.rule = MOE_FAM_ACT_NONGATED, .field = "mlp_hidden_act"},
     .refuse = {{"moe_latent_size", "latent projections (fc1_latent_proj / fc2_latent_proj) around the routed experts"}},
     .refuse_true = {"mlp_bias", "biases on the shared expert (NemotronHMLP) and the latent projections"},
     .layers = {.rule = MOE_FAM_LAYERS_BLOCK_TYPES, .list_field = "layers_block_type", .list_default = {1},
                .n_list_default = 1, .pattern_field = "hybrid_override_pattern", .n_layers_default = 4},
     .prefixes = {"backbone.layers.%L.mixer." /* as saved */, "model.layers.%L.mixer."},
     .per_expert = {{NULL, "up_proj", "down_proj"}}},

    /* DbrxFFN (transformers 5.24 dbrx/modeling_dbrx.py; DbrxBlock.ffn, every layer): DbrxRouter's
     * layer (no bias, logits in the model's dtype: libmoe's are f32), softmax over the E logits,
     * top-k (moe_top_k), divided by torch.norm(w, p = moe_normalize_expert_weights) when that is
     * not None (DbrxFFNConfig default 1.0: the sum, Mixtral's renormalization) and left as they
     * are when None; DbrxExperts / DbrxExpertGLU: act(x w1_e^T) * (x v1_e^T) @ w2_e with
     * act = ACT2FN[ffn_act_fn["name"]] (default silu), no biases, no shared expert. The MoE
     * fields are in config ffn_config (DbrxFFNConfig; its defaults when a key is absent: 3584,
     * 4 experts, top-1), the model's in d_model / n_layers (DbrxConfig's attribute_map: hidden_size,
     * num_hidden_layers). moe_jitter_eps (training only) and moe_loss_weight are not the block's.
     * save_pretrained writes transformer.blocks.L.ffn.{router.layer.weight, experts.mlp.w1 / v1 /
     * w2} (no conversion mapping), each expert tensor [E I, H] */
    {.family = MOE_FAMILY_DBRX, .name = "dbrx", .names = {{"DbrxForCausalLM", "dbrx"}},
     .moe_object = "ffn_config",
     .aliases = {{"hidden_size", "d_model"}},
     .intermediate_field = "ffn_hidden_size", .intermediate_default = 3584,
     .experts_field = "moe_num_experts", .experts_min = 1, .experts_default = 4,
     .top_k_field = "moe_top_k", .top_k_alias = "moe_top_k" /* no alias */,
     .top_k_default = 1,
     .scoring = MOE_SCORING_SOFTMAX,
     .renormalize = {MOE_FAM_RENORM_PNORM, "moe_normalize_expert_weights", true, .p = 1.0},
     .router = {"router.layer.weight"},
     .activation = {.rule = MOE_FAM_ACT_HIDDEN_ACT, .field = "ffn_act_fn", .key = "name"},
     .num_layers_field = "n_layers",
     .layers = {MOE_FAM_LAYERS_EVERY},
     .prefixes = {"transformer.blocks.%L.ffn." /* as saved */},
     .stacked = {{"experts.mlp.w1", "experts.mlp.w2", .up = "experts.mlp.v1", .flat = true}}},
    /* Ernie4_5_VLMoeMoeBlock (transformers 5.24 ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py, under
     * Ernie4_5_VLMoeForConditionalGeneration: text_config): text tokens (moe_mm_token_type_ids 0
     * or absent) go to text_moe, image / video tokens to vision_moe, two Ernie4_5_VLMoeSparseMoeBlock
     * with their own Ernie4_5_VLMoeMoeTopKRouter (ERNIE-4.5-MoE's: f32 softmax, top-k on the
     * scores + moe_statics.e_score_correction_bias, weights the unbiased scores / clamp(sum,
     * moe_norm_min)) and experts; the shared experts (moe_intermediate_size[0] *
     * moe_num_shared_experts, ungated) are added for every token. libmoe's layer is one
     * modality's block (expert_set; the modality split is the caller's). save_pretrained writes
     * the released layout (conversion_mapping.py's ernie4_5_vl_moe entries reversed): mlp.gate.
     * weight [H, E] (text) and mlp.gate.weight_1 [H, E] (vision), transposed;
     * moe_statics.e_score_correction_bias [2, E] (row 0 text, row 1 vision); experts.<e>.
     * {gate,up,down}_proj, text 0..E-1 with I = moe_intermediate_size[0], vision E..2E-1 with
     * moe_intermediate_size[1] (ErnieFuseAndSplitTextVisionExperts). MoE layers:
     * mlp_layer_types[L] == "sparse" (absent: every layer but the first); use_bias would bias the
     * MLPs; quantized checkpoints are refused (no released quantized layout read) */
    {.family = MOE_FAMILY_ERNIE4_5_VL_MOE, .name = "ernie4_5_vl_moe",
     .names = {{"Ernie4_5_VLMoeForConditionalGeneration", "ernie4_5_vl_moe"}}, .text_config = true,
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "moe_num_experts", .experts_alias = "num_experts", .experts_min = 0,
     .top_k_field = "moe_k",
     .shared = {MOE_FAM_SHARED_COUNT, "moe_num_shared_experts", 2, false, "shared_experts"},
     .scoring = MOE_SCORING_SOFTMAX, .renormalize = {MOE_FAM_RENORM_ALWAYS},
     .router = {"gate.weight"}, .selection_bias = "moe_statics.e_score_correction_bias",
     .renorm_min_field = "moe_norm_min", .renorm_min = 1e-12, .refuse_true = {"use_bias", "the MLPs get biases"},
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, .first_default = 1, .list_field = "mlp_layer_types"},
     .prefixes = {"model.layers.%L.mlp." /* as saved */},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}},
     .sets = {{.name = "text", .router = "gate.weight", .router_transposed = true, .selection_bias_row = 0,
               .intermediate_index = 0, .shared_intermediate_index = 0, .expert_offset = 0},
              {.name = "vision", .router = "gate.weight_1", .router_transposed = true, .selection_bias_row = 1,
               .intermediate_index = 1, .shared_intermediate_index = 0, .expert_offset = 1}},
     .intermediate_list = {1536, 512},
     .float_only = "ERNIE-4.5-VL's modality-split experts are read from f32 / bf16 / f16 checkpoints only (the "
                   "quantized readers number experts 0..E-1; the vision experts are saved at E..2E-1)"},

    /* Dots3NoteTextMoE (dots.3-note's text decoder; its vision encoder's pyramid MoE is not the
     * decoder's block): DeepSeek-V3's router (Dots3NoteTextTopkRouter: sigmoid + correction
     * bias, top-2-sum groups, norm_topk_prob + 1e-20, routed_scaling_factor) and stacked
     * experts, and a shared MLP shared_experts_intermediate_size * n_shared_experts wide
     * (legacy name moe_shared_expert_intermediate_size). Dots3NoteTextConfig's defaults: n_group
     * 1, norm_topk_prob true, routed_scaling_factor 1, one shared expert of 1536; MoE layers by
     * mlp_layer_types, else layer >= first_k_dense_replace (1) and moe_layer_freq (1: every
     * layer; a list: its entry per layer). The published config keeps the text fields at the
     * top level (Dots3NoteConfig builds text_config from them); per_layer_config overrides
     * attention fields only (Dots3NoteTextAttention reads it; the MoE reads the text config) */
    {.family = MOE_FAMILY_DOTS3_NOTE, .name = "dots3_note", .text_config = true,
     .names = {{"Dots3NoteForConditionalGeneration", "dots3_note"}, {"Dots3NoteForCausalLM", "dots3_note_text"}},
     .intermediate_field = "moe_intermediate_size",
     .experts_field = "n_routed_experts", .experts_alias = "num_local_experts", .experts_min = 0,
     /* the legacy name first: Dots3NoteTextConfig.__post_init__ pops moe_shared_expert_intermediate_size
      * over shared_experts_intermediate_size when config.json has it */
     .aliases = {{"moe_shared_expert_intermediate_size", "shared_experts_intermediate_size"}},
     .shared = {.rule = MOE_FAM_SHARED_FIELD_TIMES_COUNT, .field = "moe_shared_expert_intermediate_size",
                .count_default = 1, .module = "shared_experts", .field_default = 1536, .count_field = "n_shared_experts"},
     .scoring = MOE_SCORING_SIGMOID, .renormalize = {MOE_FAM_RENORM_FIELD, "norm_topk_prob", true},
     .routed_scaling = {"routed_scaling_factor", 1.0}, .groups = {"n_group", "topk_group", 0, 0, MOE_GROUP_SCORE_TOP2_SUM},
     .router = {"gate.weight"}, .selection_bias = "gate.e_score_correction_bias", .routing_hook = sigmoid_groups_routing,
     .layers = {MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, "first_k_dense_replace", 1, "moe_layer_freq", 1,
                .list_field = "mlp_layer_types", .step_list = true},
     .prefixes = {"model.language_model.layers.%L.mlp." /* ConditionalGeneration */, "model.layers.%L.mlp."},
     .per_expert = {{"gate_proj", "up_proj", "down_proj"}}, .stacked = {{"experts.gate_up_proj", "experts.down_proj"}}},
};
#define FAM_N_ROWS (sizeof fam_rows / sizeof fam_rows[0])

const moe_fam_row *moe_fam_row_of(moe_family family)
{
    for (size_t i = 0; i < FAM_N_ROWS; i++)
        if (fam_rows[i].family == family)
            return &fam_rows[i];
    return NULL;
}

const moe_fam_expert_set *moe_fam_expert_set_of(const moe_fam_row *row, const char *name)
{
    for (int i = 0; row && i < MOE_FAM_MAX_SETS && row->sets[i].name; i++)
        if (!name || strcmp(name, row->sets[i].name) == 0)
            return &row->sets[i];
    return NULL;
}

int64_t moe_fam_num_expert_sets(const moe_fam_row *row)
{
    int64_t n = 0;
    while (row && n < MOE_FAM_MAX_SETS && row->sets[n].name)
        n++;
    return n;
}

const char *moe_fam_expert_set_names(const moe_fam_row *row, char *out, size_t n)
{
    size_t used = 0;
    if (n)
        out[0] = '\0';
    for (int i = 0; row && i < MOE_FAM_MAX_SETS && row->sets[i].name && used < n; i++) {
        int len = snprintf(out + used, n - used, "%s%s", i ? ", " : "", row->sets[i].name);
        if (len < 0)
            break;
        used += (size_t)len;
    }
    return out;
}

const moe_fam_row *moe_fam_by_arch(const char *arch)
{
    for (size_t i = 0; i < FAM_N_ROWS; i++)
        for (int n = 0; n < MOE_FAM_MAX_NAMES && fam_rows[i].names[n].arch; n++)
            if (strcmp(arch, fam_rows[i].names[n].arch) == 0)
                return &fam_rows[i];
    return NULL;
}

const moe_fam_row *moe_fam_by_model_type(const char *model_type)
{
    for (size_t i = 0; i < FAM_N_ROWS; i++)
        for (int n = 0; n < MOE_FAM_MAX_NAMES && fam_rows[i].names[n].arch; n++)
            if (strcmp(model_type, fam_rows[i].names[n].model_type) == 0)
                return &fam_rows[i];
    return NULL;
}

const moe_fam_row *moe_fam_by_name(const char *name)
{
    for (size_t i = 0; i < FAM_N_ROWS; i++)
        if (strcmp(name, fam_rows[i].name) == 0)
            return &fam_rows[i];
    const moe_fam_row *r = moe_fam_by_arch(name);
    return r ? r : moe_fam_by_model_type(name);
}

const char *moe_fam_row_names(char *out, size_t n)
{
    size_t used = 0;
    if (n == 0)
        return out;
    out[0] = '\0';
    for (size_t i = 0; i < FAM_N_ROWS && used < n; i++) {
        int len = snprintf(out + used, n - used, "%s%s", i ? ", " : "", fam_rows[i].name);
        if (len > 0)
            used += (size_t)len;
    }
    return out;
}

const char *moe_fam_suggest(const char *word)
{
    const char *names[FAM_N_ROWS];
    for (size_t i = 0; i < FAM_N_ROWS; i++)
        names[i] = fam_rows[i].name;
    return word ? moe_suggest(word, strlen(word), names, FAM_N_ROWS) : NULL;
}

const char *moe_fam_names_with(moe_fam_layout layout, const char *sep, bool archs, char *out, size_t n)
{
    size_t used = 0;
    if (n == 0)
        return out;
    out[0] = '\0';
    for (size_t i = 0; i < FAM_N_ROWS && used < n; i++) {
        const moe_fam_row *r = &fam_rows[i];
        const bool has = layout == MOE_FAM_HAS_MXFP4         ? r->mxfp4.gate_up_blocks != NULL
                         : layout == MOE_FAM_HAS_INPUT_MAJOR ? r->input_major.gate_up != NULL
                                                             : moe_fam_quantize_input_major(r);
        if (!has)
            continue;
        int len = archs && r->names[0].arch
                      ? snprintf(out + used, n - used, "%s%s (%s)", used ? sep : "", r->name, r->names[0].arch)
                      : snprintf(out + used, n - used, "%s%s", used ? sep : "", r->name);
        if (len > 0)
            used += (size_t)len;
    }
    if (used == 0)
        snprintf(out, n, "no family");
    return out;
}

/* pat with its first "%L" replaced by the layer, after `lead`, into out [n]. */
static bool expand_layer(const char *lead, const char *pat, int64_t layer, char *out, size_t n)
{
    const char *at = strstr(pat, "%L");
    int len = at ? snprintf(out, n, "%s%.*s%" PRId64 "%s", lead, (int)(at - pat), pat, layer, at + 2)
                 : snprintf(out, n, "%s%s", lead, pat);
    return len >= 0 && (size_t)len < n;
}

bool moe_fam_quantize_input_major(const moe_fam_row *row)
{
    /* the names moe quantize rewrites, and a quantized form for the expert biases if any (only
     * MXFP4's layout carries them: the per-expert formats have no place for them) */
    return row->input_major.gate_up && strcmp(row->input_major.gate_up, "experts.gate_up_proj") == 0 &&
           row->input_major.down && strcmp(row->input_major.down, "experts.down_proj") == 0 &&
           (!row->input_major.gate_up_bias || row->mxfp4.gate_up_blocks);
}

bool moe_fam_flat_experts(const moe_fam_row *row)
{
    for (int i = 0; i < MOE_FAM_MAX_STACKED && row->stacked[i].gate_up; i++)
        if (row->stacked[i].flat)
            return true;
    return false;
}

bool moe_fam_prefix(const moe_fam_row *row, int i, int64_t layer, char *out, size_t n)
{
    if (i < 0 || i >= MOE_FAM_MAX_PREFIXES || !row->prefixes[i])
        return false;
    return expand_layer("", row->prefixes[i], layer, out, n);
}

bool moe_fam_pattern(const char *pat, int64_t layer, char *out, size_t n)
{
    return expand_layer("", pat, layer, out, n);
}

bool moe_fam_tensor_name(const char *name, const char *prefix, int64_t layer, char *out, size_t n)
{
    return expand_layer(strstr(name, "%L") ? "" : prefix, name, layer, out, n);
}

const moe_fam_scoring_choice *moe_fam_scoring_choice_of(const moe_fam_row *row, const char *value)
{
    for (int i = 0; i < MOE_FAM_MAX_CHOICES && row->scoring_by.choices[i].value; i++)
        if (strcmp(row->scoring_by.choices[i].value, value) == 0)
            return &row->scoring_by.choices[i];
    return NULL;
}

const moe_fam_combine_choice *moe_fam_combine_choice_of(const moe_fam_row *row, const char *value)
{
    for (int i = 0; i < MOE_FAM_MAX_CHOICES && row->shared.combine.choices[i].value; i++)
        if (strcmp(row->shared.combine.choices[i].value, value) == 0)
            return &row->shared.combine.choices[i];
    return NULL;
}

void moe_fam_layer_defaults(const moe_fam_row *row, moe_layer_desc *d)
{
    d->family = row->family;
    d->scoring_func = row->scoring;
    d->renormalize = row->renormalize.rule == MOE_FAM_RENORM_ALWAYS || row->renormalize.rule == MOE_FAM_RENORM_PNORM ||
                     (row->renormalize.rule == MOE_FAM_RENORM_FIELD && row->renormalize.dflt);
    /* DbrxFFNConfig's moe_normalize_expert_weights (1.0: the sum); every other row the sum */
    d->renormalize_p = row->renormalize.rule == MOE_FAM_RENORM_PNORM ? (float)row->renormalize.p : 1.0f;
    d->renormalize_eps = row->renormalize.has_eps ? (float)row->renormalize.eps : 1e-20f;
    if (row->scoring_by.field) { /* the config class's default string (Cohere2-MoE: "softmax") */
        const moe_fam_scoring_choice *sc = moe_fam_scoring_choice_of(row, row->scoring_by.dflt);
        d->scoring_func = sc->scoring;
        if (!sc->renormalize_field)
            d->renormalize = 0;
    }
    d->routed_scaling_factor = row->routed_scaling.field ? (float)row->routed_scaling.dflt : 1.0f;
    d->shared_expert_scale = 1.0f;
    if (row->shared.combine.field && d->shared_expert_intermediate_size > 0) { /* Cohere2-MoE: "average" */
        const moe_fam_combine_choice *cc = moe_fam_combine_choice_of(row, row->shared.combine.dflt);
        d->routed_scaling_factor = (float)((double)d->routed_scaling_factor * cc->routed_scale);
        d->shared_expert_scale = (float)cc->shared_scale;
    }
    d->n_group = row->groups.n_group;
    d->topk_group = row->groups.topk_group;
    d->group_score = row->groups.score;
    d->has_selection_bias = row->selection_bias != NULL && (!row->selection_bias_on.field || row->selection_bias_on.dflt);
    d->has_output_bias = row->output_bias != NULL;
    d->has_output_norm = row->output_norm != NULL;
    d->num_identity_experts = row->identity.field ? row->identity.dflt : 0;
    d->output_norm_eps = row->output_norm ? (float)row->output_norm_eps.dflt : 1e-6f;
    d->has_router_bias = row->router_bias != NULL;
    d->has_expert_bias = row->input_major.gate_up_bias != NULL;
    d->apply_router_weight_on_input = row->weight_on_input;
    /* hidden_act absent: the config classes' "silu"; swiglu_alpha / swiglu_limit are used by
     * the clamped SwiGLU only, and otherwise keep moe_layer_desc_init's (the same) values */
    const moe_fam_act rule = row->activation.rule;
    const int clamped_silu = rule == MOE_FAM_ACT_CLAMPED_SILU || rule == MOE_FAM_ACT_CLAMPED_SILU_OWN_SHARED;
    d->activation = rule == MOE_FAM_ACT_CLAMPED_SWIGLU      ? MOE_ACT_SWIGLU_OAI
                    : clamped_silu                          ? MOE_ACT_SWIGLU_CLAMP
                    : rule == MOE_FAM_ACT_SOFTCAPPED_SWIGLU ? MOE_ACT_SWIGLU_SOFTCAP
                    : rule == MOE_FAM_ACT_NONGATED          ? MOE_ACT_RELU2 /* NemotronHConfig's mlp_hidden_act */
                                                            : MOE_ACT_SWIGLU;
    d->swiglu_alpha = rule == MOE_FAM_ACT_CLAMPED_SWIGLU ? (float)row->activation.alpha : 1.702f;
    d->swiglu_limit = rule == MOE_FAM_ACT_CLAMPED_SWIGLU || clamped_silu ? (float)row->activation.limit : 7.0f;
    /* the softcaps (MOE_ACT_SWIGLU_SOFTCAP: alpha / limit hold c_g / c_u), else
     * moe_layer_desc_init's; the shared expert's own activation (HY-V4: hidden_act's default, silu) */
    d->softcap_gate = rule == MOE_FAM_ACT_SOFTCAPPED_SWIGLU ? (float)row->activation.alpha : 4.0f;
    d->softcap_up = rule == MOE_FAM_ACT_SOFTCAPPED_SWIGLU ? (float)row->activation.limit : 25.0f;
    d->has_shared_activation = rule == MOE_FAM_ACT_CLAMPED_SILU_OWN_SHARED && d->shared_expert_intermediate_size > 0;
    d->shared_activation = MOE_ACT_SWIGLU;
    d->shared_expert_gated = row->shared.gated && d->shared_expert_intermediate_size > 0;
    d->sparsemixer_jitter_eps = row->sparsemixer_eps.field ? (float)row->sparsemixer_eps.dflt : 0.01f;
}

const char *moe_family_name(moe_family f)
{
    if (f == MOE_FAMILY_CUSTOM)
        return "custom";
    const moe_fam_row *row = moe_fam_row_of(f);
    return row ? row->name : "?";
}

moe_status moe_family_layer_defaults(moe_family family, moe_layer_desc *desc)
{
    const moe_fam_row *row = moe_fam_row_of(family);
    if (!row || !desc)
        return MOE_EINVAL;
    moe_fam_layer_defaults(row, desc);
    return MOE_OK;
}
