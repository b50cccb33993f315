/* libFuzzer target: config.json to layer description to plan. The input is config.json; it is
 * read beside the model.safetensors of the tests/fixtures checkpoint of its family (by
 * model_type and quantization_config.quant_method, so a config close to a fixture's reaches
 * the tensor checks and the plan), then moe_checkpoint_open, moe_checkpoint_is_moe_layer and,
 * for the first layers and the last, moe_checkpoint_layer_desc, moe_plan_create and
 * moe_checkpoint_load_weights. Every failure must carry a message. */
#include "fuzz_util.h"

#include <jansson.h>
#include <sys/stat.h>

/* model_type, quant_method (NULL: none or any other), fixture folder */
static const struct {
    const char *model_type, *quant, *fixture;
} ROWS[] = {
    {"qwen3_moe", NULL, "qwen3_moe_f32"},          /* the first row is the default */
    {"qwen3_moe", "compressed-tensors", "qwen3_moe_ct_w4a16_zp"},
    {"qwen2_moe", NULL, "qwen2_moe_f32"},
    {"qwen2_moe", "compressed-tensors", "qwen2_moe_ct_w8a16_shared"},
    {"qwen3_5_moe", NULL, "qwen3_5_moe_f32"},
    {"mixtral", NULL, "mixtral_f32"},
    {"olmoe", NULL, "olmoe_f32"},
    {"granitemoe", NULL, "granitemoe_f32"},
    {"deepseek_v2", NULL, "deepseek_v2_lite_f32"},
    {"deepseek_v3", NULL, "deepseek_v3_f32"},
    {"llama4", NULL, "llama4_f32"},
    {"gpt_oss", NULL, "gpt_oss_bf16"},
    {"gpt_oss", "mxfp4", "gpt_oss_mxfp4"},
};
#define N_ROWS (sizeof ROWS / sizeof ROWS[0])

static moe_ctx *ctx;
static char dirs[N_ROWS][PATH_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ctx = fz_ctx();
    for (size_t r = 0; r < N_ROWS; r++) {
        char target[PATH_MAX], link[PATH_MAX];
        fz_join(dirs[r], fz_dir(), ROWS[r].fixture);
        if (mkdir(dirs[r], 0700) != 0)
            abort();
        snprintf(target, sizeof target, "%s/%s/model.safetensors", MOE_FUZZ_FIXTURES, ROWS[r].fixture);
        if (access(target, R_OK) != 0 || symlink(target, fz_join(link, dirs[r], "model.safetensors")) != 0) {
            perror(target);
            abort();
        }
    }
    return 0;
}

/* The row for a config: its model_type (top level) and quant_method. */
static size_t pick_row(const uint8_t *data, size_t size)
{
    json_t *root = json_loadb((const char *)data, size, 0, NULL);
    size_t pick = 0;
    if (json_is_object(root)) {
        const char *mt = json_string_value(json_object_get(root, "model_type"));
        const char *qm = json_string_value(json_object_get(json_object_get(root, "quantization_config"), "quant_method"));
        for (size_t r = 0; mt && r < N_ROWS; r++)
            if (strcmp(ROWS[r].model_type, mt) == 0 && (ROWS[r].quant ? qm && strcmp(qm, ROWS[r].quant) == 0 : 1)) {
                pick = r; /* a later row with the quant_method wins over the plain one */
            }
    }
    json_decref(root);
    return pick;
}

static void one_layer(moe_checkpoint *ck, int64_t layer)
{
    moe_layer_desc d;
    moe_status st = moe_checkpoint_layer_desc(ck, layer, &d);
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_checkpoint_layer_desc");
        if (st == MOE_EDENSE && moe_checkpoint_is_moe_layer(ck, layer))
            abort(); /* is_moe_layer and layer_desc must agree */
        return;
    }
    if (!moe_checkpoint_is_moe_layer(ck, layer))
        abort();
    moe_plan *plan = NULL;
    st = moe_plan_create(ctx, &d, &plan);
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_plan_create");
        return;
    }
    moe_weights *w = NULL;
    st = moe_checkpoint_load_weights(ck, layer, plan, &w);
    fz_check_error(ctx, st, "moe_checkpoint_load_weights");
    moe_weights_free(w);
    moe_plan_free(plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = dirs[pick_row(data, size)];
    char cfg[PATH_MAX];
    fz_write(fz_join(cfg, dir, "config.json"), data, size);
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_checkpoint_open");
        return 0;
    }
    const int64_t n = moe_checkpoint_num_layers(ck);
    if (n < 0 || n > MOE_MAX_LAYERS)
        abort();
    moe_layer_desc d;
    if (moe_checkpoint_layer_desc(ck, -1, &d) != MOE_ERANGE || moe_checkpoint_layer_desc(ck, n, &d) != MOE_ERANGE)
        abort();
    for (int64_t layer = 0; layer < n && layer < 3; layer++)
        one_layer(ck, layer);
    if (n > 3)
        one_layer(ck, n - 1);
    moe_checkpoint_free(ck);
    return 0;
}
