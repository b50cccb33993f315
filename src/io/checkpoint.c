/* Hugging Face checkpoints: config.json + model.safetensors (or shards listed in
 * model.safetensors.index.json), for Mixtral, Qwen2-MoE and Qwen3-MoE.
 *
 * Two expert layouts are read (per layer L, prefix P = "model.layers.L.mlp." for Qwen, and
 * "model.layers.L.block_sparse_moe." for Mixtral as released):
 *  - per expert (every released checkpoint; what transformers' save_pretrained writes by
 *    default): P.experts.e.{gate_proj,up_proj,down_proj}.weight (Mixtral: w1, w3, w2);
 *  - stacked (transformers >= 5 with save_pretrained(save_original_format=False), which also
 *    renames Mixtral's block_sparse_moe to mlp): P.experts.gate_up_proj [E, 2I, H] (gate rows
 *    first) and P.experts.down_proj [E, H, I], no ".weight" suffix.
 * Both give the same moe_weight_source: E pointers per projection into the mapped files.
 */
#include "io/io_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CK_NAME_LEN 256 /* a tensor name: prefix + at most ~60 characters */
#define CK_PREFIX_LEN 64 /* "model.layers.<int64>.block_sparse_moe." */

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

    /* config.json */
    moe_family family;
    int64_t hidden_size;        /* H */
    int64_t num_layers;
    int64_t top_k;              /* K */
    int64_t intermediate;       /* I per expert */
    int64_t num_experts;        /* E */
    int64_t shared_intermediate;/* I_s, 0 = no shared expert */
    int renormalize;
    int64_t sparse_step;        /* Qwen decoder_sparse_step */
    int64_t *mlp_only;          /* [n_mlp_only] Qwen mlp_only_layers */
    size_t n_mlp_only;

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
            return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: field '%s' is missing",
                                 ck->config_path, key);
        *out = dflt;
        return MOE_OK;
    }
    if (!json_is_integer(v))
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s' must be an integer, found %s",
                             ck->config_path, key, json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < min)
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s' = %lld must be >= %lld",
                             ck->config_path, key, (long long)x, (long long)min);
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
        return moe_set_error(ck->ctx, MOE_ENOTFOUND, "%s: field '%s' (or '%s') is missing",
                             ck->config_path, key, alias);
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
        return moe_set_error(ck->ctx, MOE_EFORMAT, "%s: field '%s' must be true or false, found %s",
                             ck->config_path, key, json_kind(v));
    *out = json_is_true(v) ? 1 : 0;
    return MOE_OK;
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
                             "%s: neither 'architectures' nor 'model_type' is given; supported: "
                             "MixtralForCausalLM (mixtral), Qwen2MoeForCausalLM (qwen2_moe), "
                             "Qwen3MoeForCausalLM (qwen3_moe)",
                             ck->config_path);
    return moe_set_error(ck->ctx, MOE_EUNSUPPORTED,
                         "%s: architecture '%s' (model_type '%s') is not supported; supported: "
                         "MixtralForCausalLM (mixtral), Qwen2MoeForCausalLM (qwen2_moe), "
                         "Qwen3MoeForCausalLM (qwen3_moe)",
                         ck->config_path, arch ? arch : "(none)", model_type ? model_type : "(none)");
}

/* Parse every field libmoe needs from config.json into ck. */
static moe_status parse_config(moe_checkpoint *ck, const json_t *cfg)
{
    moe_status st = cfg_family(ck, cfg);
    if (st != MOE_OK)
        return st;
    if ((st = cfg_int(ck, cfg, "hidden_size", true, 0, 1, &ck->hidden_size)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "num_hidden_layers", true, 0, 1, &ck->num_layers)) != MOE_OK ||
        (st = cfg_int(ck, cfg, "num_experts_per_tok", true, 0, 1, &ck->top_k)) != MOE_OK)
        return st;

    if (ck->family == MOE_FAMILY_MIXTRAL) {
        if ((st = cfg_int(ck, cfg, "intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_local_experts", "num_experts", 1, &ck->num_experts)) != MOE_OK)
            return st;
        ck->renormalize = 1; /* Mixtral always renormalizes the top-k weights */
        ck->sparse_step = 1;
        ck->shared_intermediate = 0;
    } else {
        /* Qwen2-MoE / Qwen3-MoE; defaults as transformers' config classes set them. */
        if ((st = cfg_int(ck, cfg, "moe_intermediate_size", true, 0, 1, &ck->intermediate)) != MOE_OK ||
            (st = cfg_int_alias(ck, cfg, "num_experts", "num_local_experts", 0, &ck->num_experts)) != MOE_OK ||
            (st = cfg_bool(ck, cfg, "norm_topk_prob", 0, &ck->renormalize)) != MOE_OK ||
            (st = cfg_int(ck, cfg, "decoder_sparse_step", false, 1, 1, &ck->sparse_step)) != MOE_OK)
            return st;
        if (ck->family == MOE_FAMILY_QWEN2_MOE &&
            (st = cfg_int(ck, cfg, "shared_expert_intermediate_size", true, 0, 0,
                          &ck->shared_intermediate)) != MOE_OK)
            return st;

        const json_t *mlo = json_object_get(cfg, "mlp_only_layers");
        if (mlo && !json_is_null(mlo)) {
            if (!json_is_array(mlo))
                return moe_set_error(ck->ctx, MOE_EFORMAT,
                                     "%s: field 'mlp_only_layers' must be an array of integers, found %s",
                                     ck->config_path, json_kind(mlo));
            size_t n = json_array_size(mlo);
            ck->mlp_only = calloc(n ? n : 1, sizeof *ck->mlp_only); /* [n] */
            if (!ck->mlp_only)
                return moe_set_error(ck->ctx, MOE_ENOMEM, "%s: out of memory", ck->config_path);
            for (size_t i = 0; i < n; i++) {
                const json_t *v = json_array_get(mlo, i);
                if (!json_is_integer(v))
                    return moe_set_error(ck->ctx, MOE_EFORMAT,
                                         "%s: field 'mlp_only_layers'[%zu] must be an integer, found %s",
                                         ck->config_path, i, json_kind(v));
                ck->mlp_only[i] = (int64_t)json_integer_value(v);
            }
            ck->n_mlp_only = n;
        }
    }
    if (ck->num_experts > 0 && ck->top_k > ck->num_experts)
        return moe_set_error(ck->ctx, MOE_EFORMAT,
                             "%s: field 'num_experts_per_tok' = %" PRId64 " exceeds the %" PRId64
                             " experts",
                             ck->config_path, ck->top_k, ck->num_experts);
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

int moe_checkpoint_is_moe_layer(const moe_checkpoint *ck, int64_t layer)
{
    if (!ck || layer < 0 || layer >= ck->num_layers)
        return 0;
    if (ck->family == MOE_FAMILY_MIXTRAL)
        return 1;
    return !in_mlp_only(ck, layer) && (layer + 1) % ck->sparse_step == 0 && ck->num_experts > 0;
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

/* --------------------------------------------------------------------------------------
 * Layers
 * ------------------------------------------------------------------------------------ */

/* Everything one MoE layer needs, resolved and checked against config.json. */
typedef struct ck_layer {
    moe_tensor_info router;     /* [E, H] */
    bool have_weight_dtype;
    moe_dtype weight_dtype;     /* of every expert and shared-expert tensor */
    char weight_dtype_from[CK_NAME_LEN]; /* the tensor that set weight_dtype */
    const void **gate;          /* [E] pointers, each [I, H] */
    const void **up;            /* [E] pointers, each [I, H] */
    const void **down;          /* [E] pointers, each [H, I] */
    bool has_shared;
    moe_tensor_info sh_gate;    /* [I_s, H] */
    moe_tensor_info sh_up;      /* [I_s, H] */
    moe_tensor_info sh_down;    /* [H, I_s] */
    moe_tensor_info sh_gate_w;  /* [1, H], router dtype */
} ck_layer;

static void ck_layer_free(ck_layer *lt)
{
    free(lt->gate);
    free(lt->up);
    free(lt->down);
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

    char why[160];
    if (ck->num_experts == 0)
        snprintf(why, sizeof why, "num_experts is 0");
    else if (in_mlp_only(ck, layer))
        snprintf(why, sizeof why, "it is listed in mlp_only_layers");
    else
        snprintf(why, sizeof why,
                 "(layer + 1) %% decoder_sparse_step = (%" PRId64 " + 1) %% %" PRId64 " != 0", layer,
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
                                 info->dtype == MOE_DTYPE_F8_E4M3 ? "; FP8 checkpoints are not supported yet" : "");
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

/* Resolve MoE layer `layer`: find every tensor, check dtypes and shapes against config.json,
 * and fill lt (free with ck_layer_free, also on error). */
static moe_status resolve_layer(moe_checkpoint *ck, int64_t layer, ck_layer *lt)
{
    memset(lt, 0, sizeof *lt);
    moe_status st = check_layer_index(ck, layer);
    if (st != MOE_OK)
        return st;

    const int64_t E = ck->num_experts, H = ck->hidden_size, I = ck->intermediate;
    const int64_t Is = ck->shared_intermediate;
    char prefix[CK_PREFIX_LEN], name[CK_NAME_LEN];
    const char *path = NULL;

    /* Router. Mixtral as released uses block_sparse_moe; transformers 5 stacked saves use mlp. */
    if (ck->family == MOE_FAMILY_MIXTRAL) {
        char alt[CK_NAME_LEN];
        snprintf(prefix, sizeof prefix, "model.layers.%" PRId64 ".block_sparse_moe.", layer);
        snprintf(name, sizeof name, "%sgate.weight", prefix);
        snprintf(alt, sizeof alt, "model.layers.%" PRId64 ".mlp.gate.weight", layer);
        if (!ck_has(ck, name) && ck_has(ck, alt))
            snprintf(prefix, sizeof prefix, "model.layers.%" PRId64 ".mlp.", layer);
    } else {
        snprintf(prefix, sizeof prefix, "model.layers.%" PRId64 ".mlp.", layer);
    }
    snprintf(name, sizeof name, "%sgate.weight", prefix);
    if ((st = ck_get(ck, name, &lt->router, &path)) != MOE_OK)
        return st;
    if (!is_float_weight_dtype(lt->router.dtype))
        return moe_set_error(ck->ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype not accepted for the router (expected F32, BF16 or F16, found %s)",
                             path, name, moe_dtype_name(lt->router.dtype));
    const int64_t router_shape[2] = {E, H};
    if ((st = check_shape(ck, path, &lt->router, "[E, H]", 2, router_shape)) != MOE_OK)
        return st;

    lt->gate = calloc((size_t)E, sizeof *lt->gate); /* [E] */
    lt->up = calloc((size_t)E, sizeof *lt->up);     /* [E] */
    lt->down = calloc((size_t)E, sizeof *lt->down); /* [E] */
    if (!lt->gate || !lt->up || !lt->down)
        return moe_set_error(ck->ctx, MOE_ENOMEM, "out of memory for %" PRId64 " experts", E);

    /* Experts: stacked when P.experts.gate_up_proj exists, else one tensor per expert. */
    char gate_up_name[CK_NAME_LEN];
    snprintf(gate_up_name, sizeof gate_up_name, "%sexperts.gate_up_proj", prefix);
    if (ck_has(ck, gate_up_name)) {
        moe_tensor_info gu, dn;
        const int64_t gu_shape[3] = {E, 2 * I, H};
        const int64_t dn_shape[3] = {E, H, I};
        if ((st = get_weight(ck, lt, gate_up_name, "[E, 2I, H]", 3, gu_shape, &gu)) != MOE_OK)
            return st;
        snprintf(name, sizeof name, "%sexperts.down_proj", prefix);
        if ((st = get_weight(ck, lt, name, "[E, H, I]", 3, dn_shape, &dn)) != MOE_OK)
            return st;
        size_t es = moe_dtype_size(lt->weight_dtype);
        const uint8_t *gu_base = gu.data; /* [E, 2I, H] gate rows then up rows per expert */
        const uint8_t *dn_base = dn.data; /* [E, H, I] */
        for (int64_t e = 0; e < E; e++) {
            lt->gate[e] = gu_base + (size_t)e * (size_t)(2 * I * H) * es;
            lt->up[e] = gu_base + ((size_t)e * (size_t)(2 * I * H) + (size_t)(I * H)) * es;
            lt->down[e] = dn_base + (size_t)e * (size_t)(H * I) * es;
        }
    } else {
        const bool mixtral = ck->family == MOE_FAMILY_MIXTRAL;
        const char *gate_s = mixtral ? "w1" : "gate_proj";
        const char *up_s = mixtral ? "w3" : "up_proj";
        const char *down_s = mixtral ? "w2" : "down_proj";
        const int64_t in_shape[2] = {I, H};  /* gate and up: [I, H] */
        const int64_t out_shape[2] = {H, I}; /* down: [H, I] */
        for (int64_t e = 0; e < E; e++) {
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

    /* Qwen2-MoE shared expert, gated by sigmoid(shared_expert_gate . x). */
    if (Is > 0) {
        const int64_t in_shape[2] = {Is, H};
        const int64_t out_shape[2] = {H, Is};
        const int64_t gw_shape[2] = {1, H};
        lt->has_shared = true;
        snprintf(name, sizeof name, "%sshared_expert.gate_proj.weight", prefix);
        if ((st = get_weight(ck, lt, name, "[I_s, H]", 2, in_shape, &lt->sh_gate)) != MOE_OK)
            return st;
        snprintf(name, sizeof name, "%sshared_expert.up_proj.weight", prefix);
        if ((st = get_weight(ck, lt, name, "[I_s, H]", 2, in_shape, &lt->sh_up)) != MOE_OK)
            return st;
        snprintf(name, sizeof name, "%sshared_expert.down_proj.weight", prefix);
        if ((st = get_weight(ck, lt, name, "[H, I_s]", 2, out_shape, &lt->sh_down)) != MOE_OK)
            return st;
        snprintf(name, sizeof name, "%sshared_expert_gate.weight", prefix);
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
    d->scoring_func = MOE_SCORING_SOFTMAX;
    d->renormalize = ck->renormalize;
    d->routed_scaling_factor = 1.0f;
    d->activation = MOE_ACT_SWIGLU;
    d->shared_expert_intermediate_size = lt->has_shared ? ck->shared_intermediate : 0;
    d->shared_expert_gated = lt->has_shared ? 1 : 0;
    d->weight_dtype = lt->weight_dtype;
}

moe_status moe_checkpoint_layer_desc(moe_checkpoint *ck, int64_t layer, moe_layer_desc *out)
{
    if (!ck)
        return MOE_EINVAL;
    if (!out)
        return moe_set_error(ck->ctx, MOE_EINVAL, "moe_checkpoint_layer_desc: out is NULL");
    ck_layer lt;
    moe_status st = resolve_layer(ck, layer, &lt);
    if (st == MOE_OK)
        fill_desc(ck, &lt, out);
    ck_layer_free(&lt);
    return st;
}

/* MOE_EINVAL naming the first field where the plan's description differs from `want`. */
static moe_status check_plan_desc(moe_checkpoint *ck, int64_t layer, const moe_layer_desc *have,
                                  const moe_layer_desc *want)
{
    const char *field = NULL;
    long long h = 0, w = 0;
    if (have->hidden_size != want->hidden_size) {
        field = "hidden_size"; h = have->hidden_size; w = want->hidden_size;
    } else if (have->moe_intermediate_size != want->moe_intermediate_size) {
        field = "moe_intermediate_size"; h = have->moe_intermediate_size; w = want->moe_intermediate_size;
    } else if (have->num_experts != want->num_experts) {
        field = "num_experts"; h = have->num_experts; w = want->num_experts;
    } else if (have->top_k != want->top_k) {
        field = "top_k"; h = have->top_k; w = want->top_k;
    } else if (have->renormalize != want->renormalize) {
        field = "renormalize"; h = have->renormalize; w = want->renormalize;
    } else if (have->scoring_func != want->scoring_func) {
        field = "scoring_func"; h = have->scoring_func; w = want->scoring_func;
    } else if (have->activation != want->activation) {
        field = "activation"; h = have->activation; w = want->activation;
    } else if (have->shared_expert_intermediate_size != want->shared_expert_intermediate_size) {
        field = "shared_expert_intermediate_size";
        h = have->shared_expert_intermediate_size; w = want->shared_expert_intermediate_size;
    } else if (have->shared_expert_gated != want->shared_expert_gated) {
        field = "shared_expert_gated"; h = have->shared_expert_gated; w = want->shared_expert_gated;
    }
    if (field)
        return moe_set_error(ck->ctx, MOE_EINVAL,
                             "%s: plan does not match layer %" PRId64 ": desc field '%s' is %lld in the plan, %lld in the checkpoint",
                             ck->dir, layer, field, h, w);
    if (have->weight_dtype != want->weight_dtype)
        return moe_set_error(ck->ctx, MOE_EINVAL,
                             "%s: plan does not match layer %" PRId64 ": desc field 'weight_dtype' is %s in the plan, %s in the checkpoint",
                             ck->dir, layer, moe_dtype_name(have->weight_dtype), moe_dtype_name(want->weight_dtype));
    if (have->routed_scaling_factor != want->routed_scaling_factor)
        return moe_set_error(ck->ctx, MOE_EINVAL,
                             "%s: plan does not match layer %" PRId64 ": desc field 'routed_scaling_factor' is %g in the plan, %g in the checkpoint",
                             ck->dir, layer, (double)have->routed_scaling_factor,
                             (double)want->routed_scaling_factor);
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

    ck_layer lt;
    moe_status st = resolve_layer(ck, layer, &lt);
    if (st == MOE_OK) {
        moe_layer_desc want;
        fill_desc(ck, &lt, &want);
        st = check_plan_desc(ck, layer, moe_plan_desc(plan), &want);
    }
    if (st == MOE_OK) {
        moe_weight_source src;
        memset(&src, 0, sizeof src);
        src.router = lt.router.data;           /* [E, H] */
        src.router_dtype = lt.router.dtype;
        src.gate_proj = lt.gate;               /* E x [I, H] */
        src.up_proj = lt.up;                   /* E x [I, H] */
        src.down_proj = lt.down;               /* E x [H, I] */
        if (lt.has_shared) {
            src.shared_gate_proj = lt.sh_gate.data;     /* [I_s, H] */
            src.shared_up_proj = lt.sh_up.data;         /* [I_s, H] */
            src.shared_down_proj = lt.sh_down.data;     /* [H, I_s] */
            src.shared_expert_gate = lt.sh_gate_w.data; /* [1, H] */
        }
        st = moe_weights_create(plan, &src, out);
    }
    ck_layer_free(&lt);
    return st;
}
