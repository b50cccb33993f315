/* The family table (src/io/families.c) and its public face, moe_family_layer_defaults:
 *
 *  - every moe_family but custom has exactly one row, complete enough for the readers to walk
 *    (names, fields, a prefix with %L, a router, a layout; an MXFP4 layout is the quantized
 *    form of an input-major one; a gated shared expert names its gate);
 *  - moe_family_layer_defaults gives each family's routing and expert math as
 *    moe_checkpoint.h documents it, leaves the sizes alone, refuses custom and unknown values;
 *  - every transformers fixture, described as a bench preset is (moe_family_layer_defaults,
 *    then the sizes and the routing fields its config.json sets), computes transformers'
 *    output on the checkpoint's weights; every family has such a fixture (or is listed as
 *    lacking one). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/families.h"
#include "moe.h"
#include "testutil.h"

/* moe_family values are below FAM_END; the families with a row are some of 1 .. FAM_END - 1
 * (the values may have gaps). */
#define FAM_END 256

/* How many values have a row. */
static int n_families(void)
{
    int n = 0;
    for (int f = 1; f < FAM_END; f++)
        n += moe_fam_row_of((moe_family)f) != NULL;
    return n;
}

static void test_rows_complete(void **state)
{
    (void)state;
    assert_null(moe_fam_row_of(MOE_FAMILY_CUSTOM));
    const int n_rows = n_families();
    assert_true(n_rows >= 11);
    assert_string_equal(moe_family_name((moe_family)FAM_END), "?");
    for (int f = 1; f < FAM_END; f++) {
        const moe_fam_row *row = moe_fam_row_of((moe_family)f);
        if (!row) {
            assert_string_equal(moe_family_name((moe_family)f), "?");
            continue;
        }
        assert_int_equal(row->family, f);
        assert_string_equal(moe_family_name((moe_family)f), row->name);
        assert_non_null(row->names[0].arch);
        for (int n = 0; n < MOE_FAM_MAX_NAMES && row->names[n].arch; n++) {
            assert_ptr_equal(moe_fam_by_arch(row->names[n].arch), row);
            assert_ptr_equal(moe_fam_by_model_type(row->names[n].model_type), row);
        }
        assert_non_null(row->intermediate_field);
        assert_non_null(row->experts_field);
        if (!row->experts_default) /* a default E: the field alone (DbrxFFNConfig's moe_num_experts) */
            assert_non_null(row->experts_alias);
        if (row->renormalize.rule == MOE_FAM_RENORM_PNORM)
            assert_true(row->renormalize.field && row->renormalize.p > 0.0);
        if (moe_fam_flat_experts(row))
            assert_true(row->stacked[0].up && !row->per_expert.proj[1] && !row->input_major.gate_up);
        assert_non_null(row->prefixes[0]);
        for (int p = 0; p < MOE_FAM_MAX_PREFIXES && row->prefixes[p]; p++)
            assert_non_null(strstr(row->prefixes[p], "%L"));
        assert_non_null(row->router[0]);
        /* a layout the readers can fall back to */
        assert_true(row->per_expert.proj[1] || row->stacked[0].gate_up || row->input_major.gate_up);
        if (row->per_expert.proj[0] || row->per_expert.proj[1]) /* proj[0] NULL: non-gated experts */
            assert_true(row->per_expert.proj[1] && row->per_expert.proj[2] &&
                        (row->per_expert.proj[0] != NULL) == (row->activation.rule != MOE_FAM_ACT_NONGATED));
        if (row->per_expert.quantized_only)
            assert_non_null(row->input_major.gate_up);
        if (row->mxfp4.gate_up_blocks)
            assert_true(row->input_major.gate_up && row->mxfp4.gate_up_scales && row->mxfp4.down_blocks &&
                        row->mxfp4.down_scales);
        if (row->input_major.gate_up_bias)
            assert_non_null(row->input_major.down_bias);
        if (row->shared.rule != MOE_FAM_SHARED_NONE)
            assert_non_null(row->shared.module);
        if (row->shared.gated)
            assert_non_null(row->shared.gate);
        assert_true(!row->shared.fused_gate_up == !row->shared.fused_down);
        if (row->shared.prefix)
            assert_non_null(strstr(row->shared.prefix, "%L"));
        if (row->shared.rule == MOE_FAM_SHARED_FIELD || row->shared.rule == MOE_FAM_SHARED_COUNT)
            assert_non_null(row->shared.field);
        if (row->renormalize.rule == MOE_FAM_RENORM_FIELD)
            assert_non_null(row->renormalize.field);
        if (row->activation.rule == MOE_FAM_ACT_CLAMPED_SWIGLU)
            assert_true(row->activation.alpha_field && row->activation.limit_field);
        switch (row->layers.rule) {
        case MOE_FAM_LAYERS_EVERY: break;
        case MOE_FAM_LAYERS_SPARSE_STEP:
        case MOE_FAM_LAYERS_LISTED_ELSE_STEP: assert_true(row->layers.step_field && row->layers.list_field); break;
        case MOE_FAM_LAYERS_DENSE_PREFIX: assert_non_null(row->layers.first_field); break; /* step: optional */
        case MOE_FAM_LAYERS_TYPES_ELSE_PREFIX: assert_non_null(row->layers.list_field); break;
        case MOE_FAM_LAYERS_PERIOD_OFFSET: assert_true(row->layers.first_field && row->layers.step_field); break;
        case MOE_FAM_LAYERS_INTERVAL_RANGE:
            assert_true(row->layers.first_field && row->layers.step_field && row->layers.last_field);
            break;
        case MOE_FAM_LAYERS_BLOCK_TYPES:
            assert_true(row->layers.list_field && row->layers.n_layers_default > 0);
            break;
        }
        if (row->activation.rule == MOE_FAM_ACT_POSTCLAMP_LAYER_LISTS)
            assert_true(row->activation.limit_field && row->activation.shared_limit_field);
        if (row->refuse_layers.field)
            assert_true(row->refuse_layers.value && row->refuse_layers.other && row->refuse_layers.count_field &&
                        row->refuse_layers.what);
        /* a routing hook reads the group fields, but Inkling2's and DeepSeek-V4's (scoring_func
         * only: no groups) */
        if (row->groups.n_group > 1 ||
            (row->routing_hook && row->family != MOE_FAMILY_INKLING2 && row->family != MOE_FAMILY_INKLING2_LOOP &&
             row->family != MOE_FAMILY_DEEPSEEK_V4))
            assert_true(row->groups.n_group_field && row->groups.topk_group_field);
    }
}

static void test_prefix(void **state)
{
    (void)state;
    char p[96];
    const moe_fam_row *l4 = moe_fam_row_of(MOE_FAMILY_LLAMA4);
    assert_true(moe_fam_prefix(l4, 0, 47, p, sizeof p));
    assert_string_equal(p, "language_model.model.layers.47.feed_forward.");
    assert_true(moe_fam_prefix(l4, 2, 3, p, sizeof p));
    assert_string_equal(p, "model.layers.3.feed_forward.");
    assert_false(moe_fam_prefix(moe_fam_row_of(MOE_FAMILY_QWEN3_MOE), 1, 0, p, sizeof p));
    assert_false(moe_fam_prefix(l4, 0, 1, p, 8)); /* does not fit */
}

/* The documented defaults of moe_family_layer_defaults (moe_checkpoint.h), one entry per
 * family row: a new family adds its entry here. */
static const struct {
    moe_family family;
    moe_scoring scoring;
    int renorm;
    float scale;
    int64_t n_group, topk_group;
    moe_group_score gscore;
    int sel_bias, router_bias, expert_bias, on_input, gated;
    moe_activation act;
} expect[] = {
    {MOE_FAMILY_MIXTRAL, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_QWEN2_MOE, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 1, MOE_ACT_SWIGLU},
    {MOE_FAMILY_QWEN3_MOE, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_DEEPSEEK_V2, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_DEEPSEEK_V3, MOE_SCORING_SIGMOID, 1, 2.5f, 8, 4, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_GPT_OSS, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 1, 1, 0, 0,
     MOE_ACT_SWIGLU_OAI},
    {MOE_FAMILY_LLAMA4, MOE_SCORING_TOPK_SIGMOID, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 1, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_OLMOE, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GRANITE_MOE, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_QWEN3_5_MOE, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 1, MOE_ACT_SWIGLU},
    {MOE_FAMILY_QWEN3_NEXT, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 1, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GLM4_MOE, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_DOTS1, MOE_SCORING_SIGMOID, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_MINIMAX, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_QWEN3_VL_MOE, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_FLEX_OLMO, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GLM4_MOE_LITE, MOE_SCORING_SIGMOID, 1, 1.8f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_DEEPSEEK_V32, MOE_SCORING_SIGMOID, 1, 2.5f, 8, 4, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_EXAONE_MOE, MOE_SCORING_SIGMOID, 1, 2.5f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_MIMO_V2_FLASH, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_LAGUNA, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_KOLIBRI1, MOE_SCORING_TOPK_SIGMOID, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_BEAM, MOE_SCORING_SIGMOID, 1, 2.5f, 8, 4, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_MINIMAX_M3_VL, MOE_SCORING_SIGMOID, 1, 2.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_OAI},
    {MOE_FAMILY_AFMOE, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_FLINT, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GRANITEMOE_SWA, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_LARA_MINI, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_QWEN4_EXP, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 1, MOE_ACT_SWIGLU},
    {MOE_FAMILY_PHIMOE, MOE_SCORING_SPARSEMIXER, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_JETMOE, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_OPENAI_PRIVACY_FILTER, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 1, 1, 0, 0,
     MOE_ACT_SWIGLU_OAI},
    {MOE_FAMILY_QWEN3_OMNI_MOE, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GRANITE_MOE_SHARED, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_GRANITE_MOE_HYBRID, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_HUNYUAN_V1_MOE, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_MELLUM, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_JAMBA, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_MISTRAL4, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_ARIA, MOE_SCORING_TOPK_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_ERNIE4_5_MOE, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GLM_MOE_DSA, MOE_SCORING_SIGMOID, 1, 2.5f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_SOLAR_OPEN, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_GLM4V_MOE, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_KIMI_LINEAR, MOE_SCORING_SIGMOID, 1, 2.446f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_BAILING_HYBRID, MOE_SCORING_SIGMOID, 1, 2.5f, 8, 4, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    {MOE_FAMILY_MINIMAX_M2, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_HY_V3, MOE_SCORING_SIGMOID, 1, 2.826f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_AXK2, MOE_SCORING_SIGMOID, 1, 2.5f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_GLM5_NEXT, MOE_SCORING_SIGMOID, 1, 2.5f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_CLAMP},
    {MOE_FAMILY_AXK1, MOE_SCORING_SIGMOID, 1, 2.5f, 8, 4, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_INKLING2, MOE_SCORING_SIGMOID, 1, 8.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_SOFTCAP},
    {MOE_FAMILY_INKLING2_LOOP, MOE_SCORING_SIGMOID, 1, 8.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_SOFTCAP},
    {MOE_FAMILY_HY_V4, MOE_SCORING_SIGMOID, 1, 2.827f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_CLAMP},
    {MOE_FAMILY_HY_V4_VL, MOE_SCORING_SIGMOID, 1, 2.827f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_CLAMP},
    /* Lfm2MoeConfig: norm_topk_prob true, use_expert_bias true, routed_scaling_factor 1 */
    {MOE_FAMILY_LFM2_MOE, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    /* Cohere2MoeConfig: expert_selection_fn "softmax" (norm_topk_prob not applied), "average":
     * 0.5 with the shared expert this test gives */
    {MOE_FAMILY_COHERE2_MOE, MOE_SCORING_TOPK_SOFTMAX, 0, 0.5f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    /* LongcatFlashConfig: softmax over E + zero_expert_num (256), not renormalized, 6.0 */
    {MOE_FAMILY_LONGCAT_FLASH, MOE_SCORING_SOFTMAX, 0, 6.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    /* DeepseekV4Config: sqrtsoftplus, always renormalized, 1.5, no groups, swiglu_limit 10 */
    {MOE_FAMILY_DEEPSEEK_V4, MOE_SCORING_SQRTSOFTPLUS, 1, 1.5f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU_CLAMP},
    /* Step3p7TextConfig: sigmoid + bias, renormalized, moe_router_scaling_factor 1; no limits: SwiGLU */
    {MOE_FAMILY_STEP3P7, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    /* DeepseekOcr2TextConfig, UnlimitedOcrTextConfig: DeepSeek-V2's softmax, greedy, not
     * renormalized, routed_scaling_factor 1; MistralLarge4TextConfig: Mistral-4's router, always
     * renormalized */
    {MOE_FAMILY_DEEPSEEK_OCR2, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_UNLIMITED_OCR, MOE_SCORING_SOFTMAX, 0, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    {MOE_FAMILY_MISTRAL_LARGE4, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 0, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    /* NemotronHConfig: n_group 1 (no groups), routed_scaling_factor 1.0, mlp_hidden_act relu2 */
    {MOE_FAMILY_NEMOTRON_H, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_RELU2},
    /* DbrxFFNConfig: softmax, moe_normalize_expert_weights 1.0 (renormalized by the sum),
     * ffn_act_fn silu */
    {MOE_FAMILY_DBRX, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 0, 0, 0, 0, 0, MOE_ACT_SWIGLU},
    /* Ernie4_5_VLMoeTextConfig: each modality's router is ERNIE-4.5-MoE's */
    {MOE_FAMILY_ERNIE4_5_VL_MOE, MOE_SCORING_SOFTMAX, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_MAX, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
    /* Dots3NoteTextConfig: n_group 1, norm_topk_prob true, routed_scaling_factor 1 */
    {MOE_FAMILY_DOTS3_NOTE, MOE_SCORING_SIGMOID, 1, 1.0f, 0, 0, MOE_GROUP_SCORE_TOP2_SUM, 1, 0, 0, 0, 0,
     MOE_ACT_SWIGLU},
};

/* the renormalization's epsilon of a family's router (moe_layer_desc.renormalize_eps) */
static float renorm_eps_of(moe_family f)
{
    return f == MOE_FAMILY_LFM2_MOE ? 1e-6f : f == MOE_FAMILY_COHERE2_MOE ? 0.0f : 1e-20f;
}

/* HY-V4: the shared expert's own activation (plain SwiGLU beside the clamped routed experts) */
static int has_shared_activation(moe_family f)
{
    return f == MOE_FAMILY_HY_V4 || f == MOE_FAMILY_HY_V4_VL;
}

/* The families whose block adds an output bias [H] (has_output_bias; the row's output_bias). */
static const moe_family k_output_bias[] = {MOE_FAMILY_JETMOE};

static int has_output_bias(moe_family f)
{
    for (size_t i = 0; i < sizeof k_output_bias / sizeof k_output_bias[0]; i++)
        if (k_output_bias[i] == f)
            return 1;
    return 0;
}

static void test_layer_defaults(void **state)
{
    (void)state;
    assert_int_equal(sizeof expect / sizeof expect[0], n_families());
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        moe_layer_desc d;
        moe_layer_desc_init(&d);
        d.hidden_size = 64, d.moe_intermediate_size = 32, d.num_experts = 16, d.top_k = 2;
        d.shared_expert_intermediate_size = 48;
        d.weight_dtype = MOE_DTYPE_F16;
        assert_int_equal(moe_family_layer_defaults(expect[i].family, &d), MOE_OK);
        assert_int_equal(d.family, expect[i].family);
        assert_int_equal(d.scoring_func, expect[i].scoring);
        assert_int_equal(d.renormalize, expect[i].renorm);
        assert_true(d.routed_scaling_factor == expect[i].scale);
        assert_int_equal(d.n_group, expect[i].n_group);
        assert_int_equal(d.topk_group, expect[i].topk_group);
        assert_int_equal(d.group_score, expect[i].gscore);
        assert_int_equal(d.has_selection_bias, expect[i].sel_bias);
        assert_int_equal(d.has_router_bias, expect[i].router_bias);
        assert_int_equal(d.has_expert_bias, expect[i].expert_bias);
        assert_int_equal(d.apply_router_weight_on_input, expect[i].on_input);
        assert_int_equal(d.shared_expert_gated, expect[i].gated);
        assert_int_equal(d.activation, expect[i].act);
        assert_int_equal(d.has_output_bias, has_output_bias(expect[i].family));
        /* GptOssConfig's constants; GLM-5-Next's clamp at its config's swiglu_limit 10 */
        assert_true(d.swiglu_alpha == 1.702f && d.swiglu_limit == (expect[i].act == MOE_ACT_SWIGLU_CLAMP ? 10.0f : 7.0f));
        /* Inkling2TextConfig's softcaps (4, 25), which are also moe_layer_desc_init's */
        assert_true(d.softcap_gate == 4.0f && d.softcap_up == 25.0f);
        assert_int_equal(d.has_shared_activation, has_shared_activation(expect[i].family));
        assert_int_equal(d.shared_activation, MOE_ACT_SWIGLU);
        /* A.X-K1's post_mlp_layernorm (AXK1Config rms_norm_eps 1e-6) */
        assert_int_equal(d.has_output_norm, expect[i].family == MOE_FAMILY_AXK1);
        assert_true(d.output_norm_eps == 1e-6f);
        /* LFM2-MoE's (sum + 1e-6), Cohere2-MoE's sum alone; Cohere2-MoE's "average" halves the shared expert */
        assert_true(d.renormalize_eps == renorm_eps_of(expect[i].family));
        assert_true(d.renormalize_p == 1.0f); /* DbrxFFNConfig's p 1.0 too: the sum */
        assert_true(d.shared_expert_scale == (expect[i].family == MOE_FAMILY_COHERE2_MOE ? 0.5f : 1.0f));
        /* LongCat-Flash's identity experts: LongcatFlashConfig zero_expert_num 256 */
        assert_int_equal(d.num_identity_experts, expect[i].family == MOE_FAMILY_LONGCAT_FLASH ? 256 : 0);
        /* sizes, dtype and quant untouched */
        assert_int_equal(d.hidden_size, 64);
        assert_int_equal(d.moe_intermediate_size, 32);
        assert_int_equal(d.num_experts, 16);
        assert_int_equal(d.top_k, 2);
        assert_int_equal(d.shared_expert_intermediate_size, 48);
        assert_int_equal(d.weight_dtype, MOE_DTYPE_F16);
        assert_int_equal(d.quant.w13.dtype, MOE_QTYPE_NONE);
        /* without a shared expert nothing is gated */
        d.shared_expert_intermediate_size = 0;
        assert_int_equal(moe_family_layer_defaults(expect[i].family, &d), MOE_OK);
        assert_int_equal(d.shared_expert_gated, 0);
        /* nor scaled: Cohere2-MoE's average applies to a block with a shared expert only */
        assert_true(d.shared_expert_scale == 1.0f);
        if (expect[i].family == MOE_FAMILY_COHERE2_MOE)
            assert_true(d.routed_scaling_factor == 1.0f);
    }
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    assert_int_equal(moe_family_layer_defaults(MOE_FAMILY_CUSTOM, &d), MOE_EINVAL);
    assert_int_equal(moe_family_layer_defaults((moe_family)99, &d), MOE_EINVAL);
    assert_int_equal(moe_family_layer_defaults(MOE_FAMILY_MIXTRAL, NULL), MOE_EINVAL);
}

/* ---- a fixture's layer described the way the bench presets do ---------------------- */

/* Families with a row but no transformers fixture yet (gen_fixtures.py has no entry): the
 * test below fails when one of them gains a fixture, so this list stays true. */
static const moe_family k_no_fixture[] = {MOE_FAMILY_CUSTOM /* no row: none lacks one now */};

static json_t *load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        fail_msg("%s: %s (line %d)", path, je.text, je.line);
    return j;
}

static int64_t json_int_field(const char *file, const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("%s: integer field '%s' missing", file, key);
    return (int64_t)json_integer_value(v);
}

static const char *json_str_field(const char *file, const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        fail_msg("%s: string field '%s' missing", file, key);
    return json_string_value(v);
}

static moe_dtype dtype_field(const char *file, const json_t *o, const char *key)
{
    const char *s = json_str_field(file, o, key);
    if (!strcmp(s, "F32"))
        return MOE_DTYPE_F32;
    if (!strcmp(s, "BF16"))
        return MOE_DTYPE_BF16;
    fail_msg("%s: field '%s' = %s: F32 or BF16 expected", file, key, s);
    return MOE_DTYPE_F32;
}

/* The family whose moe_family_name is s (meta.json "family"). */
static moe_family family_named(const char *file, const char *s)
{
    for (int f = 1; f < FAM_END; f++)
        if (moe_fam_row_of((moe_family)f) && !strcmp(s, moe_family_name((moe_family)f)))
            return (moe_family)f;
    fail_msg("%s: unknown family %s", file, s);
    return MOE_FAMILY_CUSTOM;
}

/* A tensor [d0, d1] of dtype dt from an open safetensors file, copied (aligned) into a fresh
 * buffer of d0 * d1 elements. */
static void *tensor_copy(moe_safetensors *f, const char *file, const char *name, moe_dtype dt, int64_t d0,
                         int64_t d1)
{
    moe_tensor_info ti;
    if (moe_safetensors_get(f, name, &ti) != MOE_OK)
        fail_msg("%s: no tensor %s", file, name);
    if (ti.dtype != dt || ti.ndim != 2 || ti.shape[0] != d0 || ti.shape[1] != d1)
        fail_msg("%s: tensor %s is %s rank %d; expected %s [%lld, %lld]", file, name, moe_dtype_name(ti.dtype),
                 ti.ndim, moe_dtype_name(dt), (long long)d0, (long long)d1);
    void *p = aligned_alloc(64, (ti.nbytes + 63) / 64 * 64 + 64);
    assert_non_null(p);
    memcpy(p, ti.data, ti.nbytes);
    return p;
}

/* The description a caller without the checkpoint reader builds, as tools/models.c builds a
 * bench preset: moe_layer_desc_init, the sizes (meta.json, written by gen_fixtures.py from the
 * transformers model), moe_family_layer_defaults, then only the routing fields config.json
 * sets, read here with transformers' meaning (not the family table's field names):
 *   norm_topk_prob          renormalize (DeepSeek-V2's router never renormalizes:
 *                           transformers' DeepseekV2Moe does not read it)
 *   routed_scaling_factor   routed_scaling_factor (Laguna's moe_routed_scaling_factor, AFMoE's
 *                           route_scale)
 *   n_group, topk_group     the groups (null, or topk_method "greedy": none)
 *   hidden_act              the gate function, for a family whose defaults give the SwiGLU that
 *                           hidden_act's default "silu" selects (the clamped SwiGLU ignores it)
 *   swiglu_alpha / _limit   the clamped SwiGLU's constants
 *   router_jitter_noise     sparsemixer's eps (Phi-MoE)
 *   activation_function     JetMoE's name for hidden_act
 *   quantization_config     quant_method "mxfp4": the routed experts' scheme
 * The decoder's fields of a multimodal wrapper are in config.json text_config (Qwen3-Omni's:
 * thinker_config.text_config). */
static void preset_desc(const char *dir, const json_t *meta, moe_layer_desc *d)
{
    char path[2200];
    tu_join(path, sizeof path, dir, "config.json");
    json_t *root = load_json(path);
    const json_t *cfg = json_object_get(json_object_get(root, "thinker_config"), "text_config");
    if (!json_is_object(cfg))
        cfg = json_object_get(root, "text_config");
    if (!json_is_object(cfg))
        cfg = root;
    moe_layer_desc_init(d);
    d->hidden_size = json_int_field("meta.json", meta, "H");
    d->moe_intermediate_size = json_int_field("meta.json", meta, "I");
    d->num_experts = json_int_field("meta.json", meta, "E");
    d->top_k = json_int_field("meta.json", meta, "K");
    d->shared_expert_intermediate_size = json_int_field("meta.json", meta, "shared_expert_intermediate_size");
    d->weight_dtype = dtype_field("meta.json", meta, "weight_dtype");
    const moe_family fam = family_named("meta.json", json_str_field("meta.json", meta, "family"));
    assert_int_equal(moe_family_layer_defaults(fam, d), MOE_OK);

    const json_t *v;
    if ((v = json_object_get(cfg, "norm_topk_prob")) && json_is_boolean(v) && fam != MOE_FAMILY_DEEPSEEK_V2)
        d->renormalize = json_is_true(v);
    if ((v = json_object_get(cfg, "routed_scaling_factor")) && json_is_number(v))
        d->routed_scaling_factor = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "moe_routed_scaling_factor")) && json_is_number(v))
        d->routed_scaling_factor = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "route_scale")) && json_is_number(v))
        d->routed_scaling_factor = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "moe_router_scaling_factor")) && json_is_number(v)) /* Step-3.7 */
        d->routed_scaling_factor = (float)json_number_value(v);
    /* the same fields under the names the config classes' attribute_map writes (Kimi-Linear,
     * Ling hybrid: moe_renormalize, num_expert_group) or their own (Hunyuan-V3:
     * router_scaling_factor) */
    if ((v = json_object_get(cfg, "moe_renormalize")) && json_is_boolean(v))
        d->renormalize = json_is_true(v);
    if ((v = json_object_get(cfg, "router_scaling_factor")) && json_is_number(v))
        d->routed_scaling_factor = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "num_expert_group")))
        d->n_group = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
    const json_t *method = json_object_get(cfg, "topk_method");
    if (json_is_string(method) && !strcmp(json_string_value(method), "greedy")) {
        d->n_group = 0;
        d->topk_group = 0;
    } else {
        if ((v = json_object_get(cfg, "n_group")))
            d->n_group = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
        if ((v = json_object_get(cfg, "topk_group")))
            d->topk_group = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
    }
    if (((v = json_object_get(cfg, "hidden_act")) || (v = json_object_get(cfg, "activation_function"))) &&
        d->activation == MOE_ACT_SWIGLU) {
        const char *act = json_is_string(v) ? json_string_value(v) : "?";
        if (!strcmp(act, "silu"))
            d->activation = MOE_ACT_SWIGLU;
        else if (!strcmp(act, "gelu"))
            d->activation = MOE_ACT_GEGLU;
        else if (!strcmp(act, "gelu_pytorch_tanh"))
            d->activation = MOE_ACT_GEGLU_TANH;
        else
            fail_msg("%s: hidden_act %s: not described here", path, act);
    }
    if ((v = json_object_get(cfg, "swiglu_alpha")) && json_is_number(v))
        d->swiglu_alpha = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "swiglu_limit")) && json_is_number(v))
        d->swiglu_limit = (float)json_number_value(v);
    {
        /* Step-3.7: Step3p7Experts / Step3p7MLP clamp after the SiLU at swiglu_limits[L] /
         * swiglu_limits_shared[L] of the fixture's layer (null or 0: no clamp, plain SwiGLU) */
        const int64_t L = json_int_field("meta.json", meta, "layer");
        const json_t *lr = json_array_get(json_object_get(cfg, "swiglu_limits"), (size_t)L);
        const json_t *ls = json_array_get(json_object_get(cfg, "swiglu_limits_shared"), (size_t)L);
        const double r = json_is_number(lr) ? json_number_value(lr) : 0.0;
        const double s = json_is_number(ls) ? json_number_value(ls) : 0.0;
        if (r > 0.0) {
            d->activation = MOE_ACT_SWIGLU_POSTCLAMP;
            d->swiglu_limit = (float)r;
        }
        if (s > 0.0 && d->shared_expert_intermediate_size > 0) {
            if (!(r > 0.0)) {
                d->has_shared_activation = 1;
                d->shared_activation = MOE_ACT_SWIGLU_POSTCLAMP;
            }
            d->shared_swiglu_limit = (float)s;
        } else if (r > 0.0 && d->shared_expert_intermediate_size > 0) {
            d->has_shared_activation = 1;
            d->shared_activation = MOE_ACT_SWIGLU;
        }
    }
    {
        /* DBRX: the block's fields in ffn_config (DbrxFFNConfig): ffn_act_fn {"name"} and the
         * p-norm moe_normalize_expert_weights (null: not renormalized) */
        const json_t *ffn = json_object_get(cfg, "ffn_config");
        if (json_is_object(ffn)) {
            const json_t *a = json_object_get(json_object_get(ffn, "ffn_act_fn"), "name");
            if (json_is_string(a) && !strcmp(json_string_value(a), "gelu"))
                d->activation = MOE_ACT_GEGLU;
            else if (json_is_string(a) && strcmp(json_string_value(a), "silu") != 0)
                fail_msg("%s: ffn_act_fn %s: not described here", path, json_string_value(a));
            v = json_object_get(ffn, "moe_normalize_expert_weights");
            if (v && json_is_null(v))
                d->renormalize = 0;
            else if (v && json_is_number(v))
                d->renormalize_p = (float)json_number_value(v);
        }
    }
    if ((v = json_object_get(cfg, "rms_norm_eps")) && json_is_number(v) && d->has_output_norm) /* A.X-K1 */
        d->output_norm_eps = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "zero_expert_num")) && d->num_identity_experts > 0) /* LongCat-Flash; null: 0 */
        d->num_identity_experts = json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
    if ((v = json_object_get(cfg, "mlp_gate_softcap")) && json_is_number(v)) /* Inkling2 */
        d->softcap_gate = (float)json_number_value(v);
    if ((v = json_object_get(cfg, "mlp_up_softcap")) && json_is_number(v))
        d->softcap_up = (float)json_number_value(v);
    /* LFM2-MoE: use_expert_bias false reads no selection bias */
    if ((v = json_object_get(cfg, "use_expert_bias")) && json_is_boolean(v))
        d->has_selection_bias = d->has_selection_bias && json_is_true(v);
    /* Cohere2-MoE: expert_selection_fn "sigmoid" (+ norm_topk_prob) or "softmax" of the k (never
     * renormalized); shared_expert_combination_strategy "sum" adds the shared expert as is */
    if ((v = json_object_get(cfg, "expert_selection_fn")) && json_is_string(v)) {
        if (!strcmp(json_string_value(v), "sigmoid"))
            d->scoring_func = MOE_SCORING_TOPK_SIGMOID;
        else
            d->renormalize = 0;
    }
    if ((v = json_object_get(cfg, "shared_expert_combination_strategy")) && json_is_string(v) &&
        !strcmp(json_string_value(v), "sum") && d->shared_expert_intermediate_size > 0)
        d->routed_scaling_factor = 1.0f, d->shared_expert_scale = 1.0f;
    if ((v = json_object_get(cfg, "router_jitter_noise")) && json_is_number(v) &&
        d->scoring_func == MOE_SCORING_SPARSEMIXER)
        d->sparsemixer_jitter_eps = (float)json_number_value(v);
    const json_t *qc = json_object_get(root, "quantization_config");
    if (qc && !json_is_null(qc)) {
        const char *m = json_str_field(path, qc, "quant_method");
        if (strcmp(m, "mxfp4") != 0 || moe_quant_from_name("mxfp4", &d->quant) != MOE_OK)
            fail_msg("%s: quant_method %s: not described here", path, m);
    }
    json_decref(root);
}

/* Every fixture with config.json, meta.json and expected.safetensors (transformers' MoE block
 * in float32, gen_fixtures.py): its layer described as above, the checkpoint's weights loaded
 * into that description's plan and run on input.safetensors, against expected.safetensors
 * with test_fixtures.c's f32 class (output within 1e-5 * max |expected|, topk_ids equal,
 * topk_weights within 1e-6 * max |expected| after meta.json topk_weights_scale). A wrong row
 * default (scoring, renormalization, scaling, groups, biases, weight on the input, activation,
 * shared gate) changes what the bench presets compute and fails here, whatever the checkpoint
 * reader makes of the same row. Every family with a row has such a fixture, or is listed in
 * k_no_fixture. */
static void test_fixtures_match_defaults(void **state)
{
    (void)state;
    char root[1024];
    tu_data_path(root, sizeof root, "");
    DIR *dir = opendir(root);
    assert_non_null(dir);
    moe_ctx *ctx = tu_ctx();
    int seen[FAM_END] = {0}; /* [family] fixtures checked per moe_family value */
    for (struct dirent *de = readdir(dir); de; de = readdir(dir)) {
        char d[2048], cfg_p[2200], meta_p[2200], exp_p[2200], in_p[2200];
        if (de->d_name[0] == '.')
            continue;
        tu_join(d, sizeof d, root, de->d_name);
        tu_join(cfg_p, sizeof cfg_p, d, "config.json");
        tu_join(meta_p, sizeof meta_p, d, "meta.json");
        tu_join(exp_p, sizeof exp_p, d, "expected.safetensors");
        tu_join(in_p, sizeof in_p, d, "input.safetensors");
        if (access(cfg_p, R_OK) != 0 || access(meta_p, R_OK) != 0 || access(exp_p, R_OK) != 0)
            continue;
        json_t *meta = load_json(meta_p);
        /* expected.safetensors must be the f32 class the tolerance below is for */
        const char *cls = NULL;
        size_t i;
        json_t *ex;
        json_array_foreach(json_object_get(meta, "expectations"), i, ex) {
            const json_t *file = json_object_get(ex, "file");
            if (json_is_string(file) && !strcmp(json_string_value(file), "expected.safetensors"))
                cls = json_string_value(json_object_get(ex, "class"));
        }
        if (!cls || strcmp(cls, "f32") != 0)
            fail_msg("%s: expected.safetensors is not listed with class f32 in expectations", meta_p);

        moe_layer_desc desc;
        preset_desc(d, meta, &desc);
        const int64_t layer = json_int_field(meta_p, meta, "layer"), T = json_int_field(meta_p, meta, "T");
        const int64_t H = desc.hidden_size, K = desc.top_k;
        const json_t *ws = json_object_get(meta, "topk_weights_scale");
        const float wscale = ws ? (float)json_number_value(ws) : 1.0f;
        const moe_dtype xdt = dtype_field(meta_p, meta, "input_dtype");

        moe_safetensors *in = NULL, *e = NULL;
        if (moe_safetensors_open(ctx, in_p, &in) != MOE_OK || moe_safetensors_open(ctx, exp_p, &e) != MOE_OK)
            fail_msg("%s: %s", de->d_name, moe_ctx_last_error(ctx));
        void *x = tensor_copy(in, in_p, json_str_field(meta_p, meta, "input_tensor"), xdt, T, H); /* [T, H] */
        float *want = tensor_copy(e, exp_p, "output", MOE_DTYPE_F32, T, H);                     /* [T, H] */
        int32_t *want_ids = tensor_copy(e, exp_p, "topk_ids", MOE_DTYPE_I32, T, K);             /* [T, K] */
        float *want_w = tensor_copy(e, exp_p, "topk_weights", MOE_DTYPE_F32, T, K);             /* [T, K] */
        moe_safetensors_free(in);
        moe_safetensors_free(e);
        float *out = malloc(sizeof(float) * (size_t)(T * H));     /* [T, H] */
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K)); /* [T, K] */
        float *wts = malloc(sizeof(float) * (size_t)(T * K));     /* [T, K] */
        assert_non_null(out);
        assert_non_null(ids);
        assert_non_null(wts);

        moe_checkpoint *ck = NULL;
        moe_checkpoint_options opt; /* the fixture's expert set (ERNIE-4.5-VL's text / vision) */
        moe_checkpoint_options_init(&opt);
        const json_t *set = json_object_get(meta, "expert_set");
        opt.expert_set = json_is_string(set) ? json_string_value(set) : NULL;
        if (moe_checkpoint_open_opts(ctx, d, &opt, &ck) != MOE_OK)
            fail_msg("%s: %s", de->d_name, moe_ctx_last_error(ctx));
        printf("  %s (%s): preset-style description on the checkpoint's weights\n", de->d_name,
               moe_family_name(desc.family));
        tu_run_layer_ex(ctx, &desc, NULL, ck, layer, NULL, x, xdt, T, out, ids, wts);
        moe_checkpoint_free(ck);

        for (int64_t t = 0; t < T * K; t++) {
            if (ids[t] != want_ids[t])
                fail_msg("%s: topk_ids[%lld][%lld] = %d, transformers has %d", de->d_name, (long long)(t / K),
                         (long long)(t % K), ids[t], want_ids[t]);
            wts[t] *= wscale;
        }
        const double err = tu_max_abs_diff(out, want, (size_t)(T * H)), mx = tu_max_abs(want, (size_t)(T * H));
        const double werr = tu_max_abs_diff(wts, want_w, (size_t)(T * K)), wmx = tu_max_abs(want_w, (size_t)(T * K));
        if (!(err <= 1e-5 * mx))
            fail_msg("%s: max |output - transformers| = %.3e > 1e-5 * max |expected| = %.3e", de->d_name, err,
                     1e-5 * mx);
        if (!(werr <= 1e-6 * wmx))
            fail_msg("%s: max |topk_weights - transformers| = %.3e > 1e-6 * max = %.3e", de->d_name, werr,
                     1e-6 * wmx);
        seen[desc.family]++;
        free(x), free(want), free(want_ids), free(want_w), free(out), free(ids), free(wts);
        json_decref(meta);
    }
    closedir(dir);
    moe_ctx_free(ctx);
    /* distinct families, not folders: each row is checked by a fixture of its own */
    for (int f = 1; f < FAM_END; f++) {
        if (!moe_fam_row_of((moe_family)f))
            continue;
        int exempt = 0;
        for (size_t i = 0; i < sizeof k_no_fixture / sizeof k_no_fixture[0]; i++)
            exempt |= k_no_fixture[i] == (moe_family)f;
        if (!seen[f] && !exempt)
            fail_msg("family %s has no fixture with config.json, meta.json and expected.safetensors",
                     moe_family_name((moe_family)f));
        if (seen[f] && exempt)
            fail_msg("family %s has a fixture now: remove it from k_no_fixture", moe_family_name((moe_family)f));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_complete),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_layer_defaults),
        cmocka_unit_test(test_fixtures_match_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
