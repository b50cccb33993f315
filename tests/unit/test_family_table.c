/* The family table (src/io/families.c) and its public face, moe_family_layer_defaults:
 *
 *  - every moe_family but custom has exactly one row, complete enough for the readers to walk
 *    (names, fields, a prefix with %L, a router, a layout; an MXFP4 layout is the quantized
 *    form of an input-major one; a gated shared expert names its gate);
 *  - moe_family_layer_defaults gives each family's routing and expert math as
 *    moe_checkpoint.h documents it, leaves the sizes alone, refuses custom and unknown values;
 *  - every fixture's layer description agrees with its family's defaults on the fields that
 *    config.json cannot change (the row's scoring, biases, weight on the input, group score,
 *    and the activation of the families that do not read hidden_act). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "io/families.h"
#include "moe.h"
#include "testutil.h"

/* The families with a row: 1 .. n_families() (moe_family values are consecutive). */
static int n_families(void)
{
    int n = 0;
    while (moe_fam_row_of((moe_family)(n + 1)))
        n++;
    return n;
}

static void test_rows_complete(void **state)
{
    (void)state;
    assert_null(moe_fam_row_of(MOE_FAMILY_CUSTOM));
    const int n_rows = n_families();
    assert_true(n_rows >= 11);
    assert_string_equal(moe_family_name((moe_family)(n_rows + 1)), "?");
    for (int f = 1; f <= n_rows; f++) {
        const moe_fam_row *row = moe_fam_row_of((moe_family)f);
        assert_non_null(row);
        assert_int_equal(row->family, f);
        assert_string_equal(moe_family_name((moe_family)f), row->name);
        assert_non_null(row->names[0].arch);
        for (int n = 0; n < MOE_FAM_MAX_NAMES && row->names[n].arch; n++) {
            assert_ptr_equal(moe_fam_by_arch(row->names[n].arch), row);
            assert_ptr_equal(moe_fam_by_model_type(row->names[n].model_type), row);
            assert_non_null(strstr(moe_fam_supported_list(), row->names[n].arch));
        }
        assert_non_null(row->intermediate_field);
        assert_non_null(row->experts_field);
        assert_non_null(row->experts_alias);
        assert_non_null(row->prefixes[0]);
        for (int p = 0; p < MOE_FAM_MAX_PREFIXES && row->prefixes[p]; p++)
            assert_non_null(strstr(row->prefixes[p], "%L"));
        assert_non_null(row->router[0]);
        /* a layout the readers can fall back to */
        assert_true(row->per_expert.proj[0] || row->stacked[0].gate_up || row->input_major.gate_up);
        if (row->per_expert.proj[0])
            assert_true(row->per_expert.proj[1] && row->per_expert.proj[2]);
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
        case MOE_FAM_LAYERS_DENSE_PREFIX: assert_true(row->layers.first_field && row->layers.step_field); break;
        }
        if (row->groups.n_group > 1 || row->routing_hook)
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
};

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
        assert_true(d.swiglu_alpha == 1.702f && d.swiglu_limit == 7.0f);
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
    }
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    assert_int_equal(moe_family_layer_defaults(MOE_FAMILY_CUSTOM, &d), MOE_EINVAL);
    assert_int_equal(moe_family_layer_defaults((moe_family)99, &d), MOE_EINVAL);
    assert_int_equal(moe_family_layer_defaults(MOE_FAMILY_MIXTRAL, NULL), MOE_EINVAL);
}

/* Every fixture: the fields that config.json cannot change equal the family's defaults. */
static void test_fixtures_agree(void **state)
{
    (void)state;
    char root[1024];
    tu_data_path(root, sizeof root, "");
    DIR *dir = opendir(root);
    assert_non_null(dir);
    moe_ctx *ctx = tu_ctx();
    int checked = 0;
    for (struct dirent *de = readdir(dir); de; de = readdir(dir)) {
        char d[2048], cfg[2200];
        if (de->d_name[0] == '.')
            continue;
        tu_join(d, sizeof d, root, de->d_name);
        tu_join(cfg, sizeof cfg, d, "config.json");
        FILE *f = fopen(cfg, "r");
        if (!f)
            continue;
        fclose(f);
        moe_checkpoint *ck = NULL;
        assert_int_equal(moe_checkpoint_open(ctx, d, &ck), MOE_OK);
        int64_t layer = -1;
        for (int64_t l = 0; l < moe_checkpoint_num_layers(ck) && layer < 0; l++)
            if (moe_checkpoint_is_moe_layer(ck, l))
                layer = l;
        moe_layer_desc got, want;
        assert_int_equal(moe_checkpoint_layer_desc(ck, layer, &got), MOE_OK);
        moe_layer_desc_init(&want);
        assert_int_equal(moe_family_layer_defaults(got.family, &want), MOE_OK);
        const moe_fam_row *row = moe_fam_row_of(got.family);
        if (got.scoring_func != want.scoring_func || got.has_selection_bias != want.has_selection_bias ||
            got.has_router_bias != want.has_router_bias || got.has_expert_bias != want.has_expert_bias ||
            got.apply_router_weight_on_input != want.apply_router_weight_on_input ||
            (got.n_group > 1 && got.group_score != want.group_score) ||
            (row->activation.rule != MOE_FAM_ACT_HIDDEN_ACT && got.activation != want.activation))
            fail_msg("%s: layer description disagrees with moe_family_layer_defaults(%s)", de->d_name,
                     moe_family_name(got.family));
        moe_checkpoint_free(ck);
        checked++;
    }
    closedir(dir);
    assert_true(checked >= n_families());
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_complete),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_layer_defaults),
        cmocka_unit_test(test_fixtures_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
