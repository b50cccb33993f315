/* Model presets of `moe bench`: the real shapes of ../shared/MODELS.md, each with its family's
 * routing and expert math (moe.h "Layer description"). Where the bench still does not
 * compute exactly the released layer, `differs` says what differs. */
#include "models.h"

#include <stdio.h>
#include <string.h>

#define SOFTMAX MOE_SCORING_SOFTMAX, 0, 0, MOE_GROUP_SCORE_MAX, MOE_ACT_SWIGLU, 0

const cli_model cli_models[] = {
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", "qwen3_moe", MOE_FAMILY_QWEN3_MOE,
     2048, 768, 128, 8, 0, 0, 1, 1.0f, NULL, SOFTMAX},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B", "qwen3_moe", MOE_FAMILY_QWEN3_MOE,
     4096, 1536, 128, 8, 0, 0, 1, 1.0f, NULL, SOFTMAX},
    {"qwen3.5-35b-a3b", "Qwen3.5-35B-A3B", "qwen3_5_moe", MOE_FAMILY_QWEN3_5_MOE,
     2048, 512, 256, 8, 512, 1, 1, 1.0f, NULL, SOFTMAX},
    {"qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B", "qwen3_next", MOE_FAMILY_QWEN3_NEXT,
     2048, 512, 512, 10, 512, 1, 1, 1.0f, NULL, SOFTMAX},
    {"qwen1.5-moe-a2.7b", "Qwen1.5-MoE-A2.7B", "qwen2_moe", MOE_FAMILY_QWEN2_MOE,
     2048, 1408, 60, 4, 5632, 1, 0, 1.0f, NULL, SOFTMAX},
    {"mixtral-8x7b", "Mixtral-8x7B", "mixtral", MOE_FAMILY_MIXTRAL,
     4096, 14336, 8, 2, 0, 0, 1, 1.0f, NULL, SOFTMAX},
    /* sigmoid + e_score_correction_bias, 8 groups keep 4 by top-2 sums, renormalized, x 2.5 */
    {"deepseek-v3", "DeepSeek-V3", "deepseek_v3", MOE_FAMILY_DEEPSEEK_V3,
     7168, 2048, 256, 8, 2048, 0, 1, 2.5f,
     "e_score_correction_bias is not generated (zero): it moves which experts win, not the "
     "cost; the released experts are FP8 (benched in --dtype)",
     MOE_SCORING_SIGMOID, 8, 4, MOE_GROUP_SCORE_TOP2_SUM, MOE_ACT_SWIGLU, 0},
    /* greedy softmax, no renormalization, two shared experts */
    {"deepseek-v2-lite", "DeepSeek-V2-Lite", "deepseek_v2", MOE_FAMILY_DEEPSEEK_V2,
     2048, 1408, 64, 6, 2816, 0, 0, 1.0f, NULL, SOFTMAX},
    /* top-k softmax over the biased logits; clamped SwiGLU */
    {"gpt-oss-20b", "gpt-oss-20b", "gpt_oss", MOE_FAMILY_GPT_OSS,
     2880, 2880, 32, 4, 0, 0, 0, 1.0f,
     "the router and expert biases are not generated (omitted: one add per output); the "
     "released experts are MXFP4 (benched in --dtype)",
     MOE_SCORING_TOPK_SOFTMAX, 0, 0, MOE_GROUP_SCORE_MAX, MOE_ACT_SWIGLU_OAI, 0},
    {"gpt-oss-120b", "gpt-oss-120b", "gpt_oss", MOE_FAMILY_GPT_OSS,
     2880, 2880, 128, 4, 0, 0, 0, 1.0f,
     "the router and expert biases are not generated (omitted: one add per output); the "
     "released experts are MXFP4 (benched in --dtype)",
     MOE_SCORING_TOPK_SOFTMAX, 0, 0, MOE_GROUP_SCORE_MAX, MOE_ACT_SWIGLU_OAI, 0},
    {"olmoe-1b-7b", "OLMoE-1B-7B-0924", "olmoe", MOE_FAMILY_OLMOE,
     2048, 1024, 64, 8, 0, 0, 0, 1.0f, NULL, SOFTMAX},
    /* top-1 on the logits, sigmoid weight on the expert input, ungated shared expert */
    {"llama4-scout", "Llama-4-Scout-17B-16E", "llama4", MOE_FAMILY_LLAMA4,
     5120, 8192, 16, 1, 8192, 0, 0, 1.0f, NULL,
     MOE_SCORING_TOPK_SIGMOID, 0, 0, MOE_GROUP_SCORE_MAX, MOE_ACT_SWIGLU, 1},
    /* top-k on the logits, softmax over the k */
    {"granite-3.0-1b-a400m", "granite-3.0-1b-a400m", "granitemoe", MOE_FAMILY_GRANITE_MOE,
     1024, 512, 32, 8, 0, 0, 0, 1.0f, NULL,
     MOE_SCORING_TOPK_SOFTMAX, 0, 0, MOE_GROUP_SCORE_MAX, MOE_ACT_SWIGLU, 0},
};

const size_t cli_num_models = sizeof cli_models / sizeof cli_models[0];

const cli_model *cli_model_find(const char *name)
{
    for (size_t i = 0; i < cli_num_models; i++)
        if (strcmp(cli_models[i].name, name) == 0)
            return &cli_models[i];
    return NULL;
}

const char *cli_model_routing(const cli_model *m, moe_layer_desc *d)
{
    static char note[256];
    d->scoring_func = m->scoring;
    d->activation = m->activation;
    d->apply_router_weight_on_input = m->weight_on_input;
    d->group_score = m->group_score;
    d->n_group = 0;
    d->topk_group = 0;
    if (m->n_group > 1) {
        const int64_t E = d->num_experts, G = m->n_group;
        if (E % G == 0 && m->topk_group * (E / G) >= d->top_k) {
            d->n_group = G;
            d->topk_group = m->topk_group;
        } else {
            snprintf(note, sizeof note,
                     "no group-limited selection: %lld experts do not split into the preset's %lld "
                     "groups keeping %lld (of which top_k = %lld must fit)",
                     (long long)E, (long long)G, (long long)m->topk_group, (long long)d->top_k);
            return note;
        }
    }
    return NULL;
}

const char *cli_scoring_name(const moe_layer_desc *d)
{
    static char buf[64];
    const char *base = d->scoring_func == MOE_SCORING_SIGMOID        ? "sigmoid"
                       : d->scoring_func == MOE_SCORING_TOPK_SOFTMAX ? "topk_softmax"
                       : d->scoring_func == MOE_SCORING_TOPK_SIGMOID ? "topk_sigmoid"
                                                                     : "softmax";
    snprintf(buf, sizeof buf, "%s%s%s", base, d->n_group > 1 ? "+groups" : "",
             d->apply_router_weight_on_input ? "+weight_on_input" : "");
    return buf;
}
