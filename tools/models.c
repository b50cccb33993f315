/* Model presets of `moe bench`: the real shapes of ../shared/MODELS.md. For families whose
 * routing or activation the library does not have yet, the same shapes are benched with
 * softmax routing and SwiGLU, and `differs` says what the real model does instead. */
#include "models.h"

#include <string.h>

const cli_model cli_models[] = {
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", "qwen3_moe", MOE_FAMILY_QWEN3_MOE,
     2048, 768, 128, 8, 0, 0, 1, 1.0f, NULL},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B", "qwen3_moe", MOE_FAMILY_QWEN3_MOE,
     4096, 1536, 128, 8, 0, 0, 1, 1.0f, NULL},
    {"qwen3.5-35b-a3b", "Qwen3.5-35B-A3B", "qwen3_5_moe", MOE_FAMILY_CUSTOM,
     2048, 512, 256, 8, 512, 1, 1, 1.0f, NULL},
    {"qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B", "qwen3_next", MOE_FAMILY_CUSTOM,
     2048, 512, 512, 10, 512, 1, 1, 1.0f, NULL},
    {"qwen1.5-moe-a2.7b", "Qwen1.5-MoE-A2.7B", "qwen2_moe", MOE_FAMILY_QWEN2_MOE,
     2048, 1408, 60, 4, 5632, 1, 0, 1.0f, NULL},
    {"mixtral-8x7b", "Mixtral-8x7B", "mixtral", MOE_FAMILY_MIXTRAL,
     4096, 14336, 8, 2, 0, 0, 1, 1.0f, NULL},
    {"deepseek-v3", "DeepSeek-V3", "deepseek_v3", MOE_FAMILY_CUSTOM,
     7168, 2048, 256, 8, 2048, 0, 1, 2.5f,
     "DeepSeek-V3 routes with sigmoid scores plus e_score_correction_bias and grouped top-k "
     "(8 groups, keep 4); the library only has softmax scoring now, so this layer is routed "
     "with softmax + renormalize (expert GEMM FLOPs and bytes are the same)"},
    {"deepseek-v2-lite", "DeepSeek-V2-Lite", "deepseek_v2", MOE_FAMILY_CUSTOM,
     2048, 1408, 64, 6, 2816, 0, 0, 1.0f, NULL},
    {"gpt-oss-20b", "gpt-oss-20b", "gpt_oss", MOE_FAMILY_CUSTOM,
     2880, 2880, 32, 4, 0, 0, 1, 1.0f,
     "gpt-oss adds a router bias, uses a clamped SwiGLU with biases (interleaved gate/up) "
     "and ships MXFP4 experts; benched with softmax + renormalize and plain SwiGLU on the "
     "same shapes"},
    {"gpt-oss-120b", "gpt-oss-120b", "gpt_oss", MOE_FAMILY_CUSTOM,
     2880, 2880, 128, 4, 0, 0, 1, 1.0f,
     "gpt-oss adds a router bias, uses a clamped SwiGLU with biases (interleaved gate/up) "
     "and ships MXFP4 experts; benched with softmax + renormalize and plain SwiGLU on the "
     "same shapes"},
    {"olmoe-1b-7b", "OLMoE-1B-7B-0924", "olmoe", MOE_FAMILY_CUSTOM,
     2048, 1024, 64, 8, 0, 0, 0, 1.0f, NULL},
    {"llama4-scout", "Llama-4-Scout-17B-16E", "llama4", MOE_FAMILY_CUSTOM,
     5120, 8192, 16, 1, 8192, 0, 0, 1.0f,
     "Llama-4 selects top-1 on raw logits with a sigmoid weight applied to the expert's "
     "input; benched with softmax routing and the weight applied to the output (same FLOPs "
     "and bytes)"},
    {"granite-3.0-1b-a400m", "granite-3.0-1b-a400m", "granitemoe", MOE_FAMILY_CUSTOM,
     1024, 512, 32, 8, 0, 0, 1, 1.0f, NULL},
};

const size_t cli_num_models = sizeof cli_models / sizeof cli_models[0];

const cli_model *cli_model_find(const char *name)
{
    for (size_t i = 0; i < cli_num_models; i++)
        if (strcmp(cli_models[i].name, name) == 0)
            return &cli_models[i];
    return NULL;
}
