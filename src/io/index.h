/* The tensors of a checkpoint folder (src/io/index.c): model.safetensors, or the shards that
 * model.safetensors.index.json lists, each opened (and validated) once; tensor lookup by name.
 * Not installed; not API. */
#ifndef MOE_IO_INDEX_H
#define MOE_IO_INDEX_H

#include "io/ckpt_ct.h"

#include <stdbool.h>

#include <jansson.h>

/* One weight_map entry of a sharded checkpoint. */
typedef struct moe_ck_map_entry {
    const char *tensor;         /* owned by moe_ck_index.index_json */
    size_t file;                /* index into moe_ck_index.files */
} moe_ck_map_entry;

/* The names of the tensors moe_ck_get found, while an MoE layer is resolved (the unread-tensor
 * check of src/io/checkpoint.c). names point into the open files' headers. */
typedef struct moe_ck_seen {
    const char **names;         /* [n] (capacity cap) */
    size_t n, cap;
    bool oom;                   /* a name could not be recorded */
} moe_ck_seen;

typedef struct moe_ck_index {
    moe_ctx *ctx;               /* borrowed */
    const char *dir;            /* the checkpoint folder (borrowed), for messages */
    char *index_path;           /* dir/model.safetensors.index.json; NULL for a single file */
    size_t n_files;
    moe_safetensors **files;    /* [n_files] each distinct file, opened once */
    size_t n_map;
    moe_ck_map_entry *map;      /* [n_map] weight_map sorted by tensor name; NULL if unsharded */
    json_t *index_json;         /* the parsed index, owner of map[].tensor */
    moe_ck_seen *seen;          /* or NULL: moe_ck_get appends each tensor it finds (a copy of
                                   the index made for one layer's resolve sets it) */
} moe_ck_index;

/* Open the tensors of folder `dir` (borrowed for ix's life): model.safetensors first (as
 * transformers looks), else the sharded index. MOE_ENOTFOUND when neither is there or a
 * listed shard is missing; the errors of moe_safetensors_open; MOE_EFORMAT for a bad index.
 * Free with moe_ck_index_free, also on error. */
moe_status moe_ck_index_open(moe_ctx *ctx, const char *dir, moe_ck_index *ix);
void moe_ck_index_free(moe_ck_index *ix);

/* The file holding tensor `name`, or NULL. Silent. With an index, a tensor whose weight_map
 * entry points at a shard that lacks it still gives that shard (moe_ck_get reports it). */
const moe_safetensors *moe_ck_file_of(const moe_ck_index *ix, const char *name);
/* true if the checkpoint lists tensor `name` (in weight_map, or in the single file). Silent. */
bool moe_ck_has(const moe_ck_index *ix, const char *name);
/* Find tensor `name`: fills *info and *path (its file), and records it in ix->seen when set.
 * MOE_ENOTFOUND names the file (or the index) and the tensor; MOE_EFORMAT when the index maps it
 * to a shard without it. */
moe_status moe_ck_get(const moe_ck_index *ix, const char *name, moe_tensor_info *info, const char **path);
/* Call fn(name, u) for every tensor of the checkpoint whose name starts with `prefix` (the
 * weight_map's names, or the single file's), in name order (weight_map) or header order. */
void moe_ck_each_with_prefix(const moe_ck_index *ix, const char *prefix, void (*fn)(const char *name, void *u),
                             void *u);
/* The lookup the compressed-tensors reader reaches ix's tensors through. */
moe_ckq_lookup moe_ck_lookup(const moe_ck_index *ix);

#endif
