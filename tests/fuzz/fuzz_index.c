/* libFuzzer target: a sharded checkpoint (model.safetensors.index.json and its shards) with a
 * valid config.json (that of tests/fixtures/olmoe_gelu_f32). The input holds up to five files
 * separated by the line "#moe-fuzz-file#": model.safetensors.index.json, then the shards
 * model-00001.safetensors .. model-00004.safetensors (a shard not given is absent). It goes
 * through moe_checkpoint_open, moe_checkpoint_layer_desc of layer 0, moe_plan_create and
 * moe_checkpoint_load_weights. Every failure must carry a message. */
#define _GNU_SOURCE /* memmem */
#include "fuzz_util.h"

#define CKPT MOE_FUZZ_FIXTURES "/olmoe_gelu_f32"
#define SEP "\n#moe-fuzz-file#\n"
#define MAX_SHARDS 4

static moe_ctx *ctx;
static char dir[PATH_MAX], index_path[PATH_MAX], shard_path[MAX_SHARDS][PATH_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ctx = fz_ctx();
    snprintf(dir, sizeof dir, "%s", fz_dir());
    size_t n;
    unsigned char *cfg = fz_read(CKPT "/config.json", &n);
    char p[PATH_MAX];
    fz_write(fz_join(p, dir, "config.json"), cfg, n);
    free(cfg);
    fz_join(index_path, dir, "model.safetensors.index.json");
    for (int k = 0; k < MAX_SHARDS; k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d.safetensors", k + 1);
        fz_join(shard_path[k], dir, name);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* split at SEP: part 0 the index, parts 1.. the shards */
    const size_t sl = sizeof SEP - 1;
    const uint8_t *part = data, *end = data + size;
    int k = -1;
    while (k < MAX_SHARDS) {
        const uint8_t *next = memmem(part, (size_t)(end - part), SEP, sl);
        const uint8_t *stop = next ? next : end;
        fz_write(k < 0 ? index_path : shard_path[k], part, (size_t)(stop - part));
        k++;
        if (!next)
            break;
        part = next + sl;
    }
    for (; k < MAX_SHARDS; k++)
        unlink(shard_path[k]);

    moe_checkpoint *ck = NULL;
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_layer_desc d;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        st = moe_checkpoint_layer_desc(ck, 0, &d);
        if (st == MOE_OK)
            st = moe_plan_create(ctx, &d, &plan);
        if (st == MOE_OK)
            st = moe_checkpoint_load_weights(ck, 0, plan, &w);
    }
    fz_check_error(ctx, st, "opening the sharded checkpoint and loading layer 0");
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    return 0;
}
