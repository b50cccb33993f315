/* Reading config.json and the shard index (src/io/fields.c): JSON files, typed fields whose
 * messages name the file and the field, and the path helpers the readers share. Not
 * installed; not API. */
#ifndef MOE_IO_FIELDS_H
#define MOE_IO_FIELDS_H

#include "core/internal.h"

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

/* The fields that were absent (or null) and took their default, as "key = value, ..." (keys
 * spelt as in messages, with the prefix), for the WARNING of a checkpoint read as a family
 * its config.json does not name. Cut at the buffer's end. */
typedef struct moe_cfg_assumed {
    char text[512];        /* [512] chars, NUL-terminated */
    size_t used;
    size_t n;              /* fields recorded */
} moe_cfg_assumed;

/* One JSON object being read: config.json's root or its text_config. */
typedef struct moe_cfg_fields {
    moe_ctx *ctx;          /* errors go here */
    const char *path;      /* the file, for messages */
    const char *prefix;    /* "", "text_config." or a row's config_path: how messages spell the
                              fields */
    const json_t *obj;     /* the object the fields are read from */
    moe_cfg_assumed *assumed; /* or NULL: each optional field below that takes its default is
                                 appended here */
    const char *const (*aliases)[2]; /* or NULL: [n_aliases] pairs {field, alias}: a field absent
                                        from obj is read from its alias (transformers'
                                        attribute_map), and messages then name the alias */
    size_t n_aliases;
} moe_cfg_fields;

/* Field *key of f->obj, or, when it is absent and f has an alias for it, the alias (*key is
 * then the alias); NULL when neither is present. */
const json_t *moe_cfg_get(const moe_cfg_fields *f, const char **key);

/* Append "key = value" to f->assumed (when set); value is printf-formatted. */
void moe_cfg_note_default(const moe_cfg_fields *f, const char *key, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Integer field `key` into *out, checked >= min. An absent field (or null) is MOE_ENOTFOUND
 * when `required`, else takes `dflt`. MOE_EFORMAT for another type or a value below min. */
moe_status moe_cfg_int(const moe_cfg_fields *f, const char *key, bool required, int64_t dflt, int64_t min,
                       int64_t *out);
/* Required integer field `key`, or `alias` when `key` is absent: transformers maps one name
 * onto the other (Qwen3MoeConfig saves num_experts as num_local_experts since 5.x; Mixtral
 * accepts num_experts for num_local_experts). MOE_ENOTFOUND names both when neither is there. */
moe_status moe_cfg_int_alias(const moe_cfg_fields *f, const char *key, const char *alias, int64_t min,
                             int64_t *out);
/* moe_cfg_int_alias (alias NULL: `key` only), where the field may also be a per-layer list
 * (Hunyuan's moe_topk): a list of equal integers gives that integer; a list whose entries
 * differ is MOE_EUNSUPPORTED naming the first that differs (libmoe describes every MoE layer
 * of a checkpoint with one value); a list whose length is not n_layers (when > 0) is
 * MOE_EFORMAT naming both. */
moe_status moe_cfg_int_uniform(const moe_cfg_fields *f, const char *key, const char *alias, int64_t min,
                               int64_t n_layers, int64_t *out);
/* Optional boolean field `key` (absent or null: `dflt`). */
moe_status moe_cfg_bool(const moe_cfg_fields *f, const char *key, int dflt, int *out);
/* Optional number field `key` (integer or real; absent or null: `dflt`); it must be finite (as
 * a float too) and, when check_min, > min_excl. */
moe_status moe_cfg_float(const moe_cfg_fields *f, const char *key, double dflt, bool check_min, double min_excl,
                         float *out);
/* Optional string field `key` (absent or null: `dflt`); *out points into the JSON. */
moe_status moe_cfg_str(const moe_cfg_fields *f, const char *key, const char *dflt, const char **out);
/* Optional array of integers `key` into a malloc'd *out [*n_out]; absent or null: *present =
 * false, *out NULL (noted in f->assumed as "none"). */
moe_status moe_cfg_int_list(const moe_cfg_fields *f, const char *key, int64_t **out, size_t *n_out,
                            bool *present);
/* A per-layer list of non-negative numbers (Step-3.7's swiglu_limits): *out [*n_out] (malloc'ed),
 * a null entry read as 0 (no clamp), *present false when the field is absent or null.
 * MOE_EFORMAT naming the field and the index for an entry that is not a number or null, or is
 * negative or not finite; MOE_ENOMEM. */
moe_status moe_cfg_limit_list(const moe_cfg_fields *f, const char *key, float **out, size_t *n_out, bool *present);
/* A per-layer list of strings (config `mlp_layer_types`: "dense" / "sparse"): *out [*n_out]
 * (malloc'd, caller frees) = the indices whose entry is `match`. The list must have n_layers
 * entries, each `match` or `other` (else MOE_EFORMAT naming the field and the length, or the
 * entry and both values). Absent or null: *present false, *out NULL, the default noted as
 * "none". */
moe_status moe_cfg_index_list_of(const moe_cfg_fields *f, const char *key, const char *match, const char *other,
                                 int64_t n_layers, int64_t **out, size_t *n_out, bool *present);

/* Load the JSON object at `path` (opened by moe_io_open_regular), at most max_bytes long (the
 * size checked by fstat before reading; over it is MOE_EFORMAT naming the file, its size, the
 * limit and `limit_name`): MOE_ENOTFOUND when absent, MOE_EFORMAT for bad JSON or a root
 * that is not an object, MOE_EIO when unreadable or not a regular file. */
moe_status moe_json_load_object(moe_ctx *ctx, const char *path, uint64_t max_bytes, const char *limit_name,
                                json_t **out);

/* malloc'd "a/b". NULL on out of memory. */
char *moe_io_path_join(const char *a, const char *b);
/* 1 if `path` exists (as anything, a dangling symlink included), 0 if not, -1 on another stat
 * error (errno set). */
int moe_io_path_exists(const char *path);

#endif
