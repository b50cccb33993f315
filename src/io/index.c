/* The tensors of a checkpoint folder: model.safetensors, or the shards listed in
 * model.safetensors.index.json ("weight_map": tensor name -> shard file name), each distinct
 * shard opened and validated once (moe_safetensors_open), and the weight_map sorted for
 * lookup by name. */
#include "io/fields.h"
#include "io/index.h"
#include "io/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_map_entry(const void *a, const void *b)
{
    const moe_ck_map_entry *x = a, *y = b;
    return strcmp(x->tensor, y->tensor);
}

/* Open dir/<name> as the next file. A missing file is MOE_ENOTFOUND, saying which index
 * listed it when `listed_by` is not NULL. */
static moe_status open_file(moe_ck_index *ix, const char *name, const char *listed_by)
{
    char *path = moe_io_path_join(ix->dir, name);
    if (!path)
        return moe_set_error(ix->ctx, MOE_ENOMEM, "%s: out of memory", ix->dir);
    moe_status st;
    if (moe_io_path_exists(path) == 0) {
        if (listed_by)
            st = moe_set_error(ix->ctx, MOE_ENOTFOUND, "%s: not found (shard listed in %s)", path, listed_by);
        else
            st = moe_set_error(ix->ctx, MOE_ENOTFOUND, "%s: not found", path);
    } else {
        st = moe_safetensors_open(ix->ctx, path, &ix->files[ix->n_files]);
        if (st == MOE_OK)
            ix->n_files++;
    }
    free(path);
    return st;
}

/* Read model.safetensors.index.json: open each distinct shard once and build the sorted
 * weight_map. */
static moe_status open_sharded(moe_ck_index *ix)
{
    moe_status st = moe_json_load_object(ix->ctx, ix->index_path, MOE_INDEX_MAX_BYTES, "(MOE_INDEX_MAX_BYTES)",
                                          &ix->index_json);
    if (st != MOE_OK)
        return st;
    const json_t *wm = json_object_get(ix->index_json, "weight_map");
    if (!wm)
        return moe_set_error(ix->ctx, MOE_ENOTFOUND, "%s: field 'weight_map' is missing", ix->index_path);
    if (!json_is_object(wm))
        return moe_set_error(ix->ctx, MOE_EFORMAT, "%s: field 'weight_map' must be an object, found %s",
                             ix->index_path, moe_io_json_found(wm));

    size_t n = json_object_size(wm);
    ix->map = calloc(n ? n : 1, sizeof *ix->map);               /* [n] */
    const char **shards = calloc(n ? n : 1, sizeof *shards);    /* [n] shard name per entry */
    if (!ix->map || !shards) {
        free(shards);
        return moe_set_error(ix->ctx, MOE_ENOMEM, "%s: out of memory", ix->index_path);
    }
    size_t i = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)wm, key, val) {
        if (!json_is_string(val)) {
            free(shards);
            return moe_set_error(ix->ctx, MOE_EFORMAT, "%s: weight_map entry '%s' must be a file name string, found %s",
                                 ix->index_path, key, moe_io_json_found(val));
        }
        const char *file = json_string_value(val);
        if (file[0] == '\0' || strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0) {
            free(shards);
            return moe_set_error(ix->ctx, MOE_EFORMAT,
                                 "%s: weight_map entry '%s': shard '%s' is not a plain file name in the checkpoint folder",
                                 ix->index_path, key, file);
        }
        ix->map[i].tensor = key;
        shards[i] = file;
        i++;
    }
    ix->n_map = n;

    /* Distinct shard names, sorted: each is opened once. */
    const char **distinct = calloc(n ? n : 1, sizeof *distinct); /* [n_distinct <= n] */
    if (!distinct) {
        free(shards);
        return moe_set_error(ix->ctx, MOE_ENOMEM, "%s: out of memory", ix->index_path);
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
        ix->map[k].file = (size_t)(hit - distinct);
    }
    free(shards);

    ix->files = calloc(n_distinct ? n_distinct : 1, sizeof *ix->files); /* [n_distinct] */
    if (!ix->files) {
        free(distinct);
        return moe_set_error(ix->ctx, MOE_ENOMEM, "%s: out of memory", ix->index_path);
    }
    for (size_t k = 0; k < n_distinct; k++) {
        st = open_file(ix, distinct[k], ix->index_path);
        if (st != MOE_OK) {
            free(distinct);
            return st;
        }
    }
    free(distinct);
    qsort(ix->map, ix->n_map, sizeof *ix->map, cmp_map_entry);
    return MOE_OK;
}


/* The hint for a folder without safetensors weights that holds PyTorch pickles instead
 * (pytorch_model.bin, its index, or consolidated.00.pth) into buf, else "". Returns buf. */
static const char *pickle_hint(const char *dir, char *buf, size_t len)
{
    static const char *const pickles[] = {"pytorch_model.bin", "pytorch_model.bin.index.json", "consolidated.00.pth"};
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof pickles / sizeof pickles[0]; i++) {
        char *p = moe_io_path_join(dir, pickles[i]);
        const int there = p && moe_io_path_exists(p) != 0;
        free(p);
        if (there) {
            snprintf(buf, len, "; it holds %s (PyTorch pickle weights, which libmoe does not read): save the model as "
                     "safetensors first (transformers: model.save_pretrained(dir, safe_serialization=True))", pickles[i]);
            break;
        }
    }
    return buf;
}
moe_status moe_ck_index_open(moe_ctx *ctx, const char *dir, moe_ck_index *ix)
{
    memset(ix, 0, sizeof *ix);
    ix->ctx = ctx;
    ix->dir = dir;
    char *single = moe_io_path_join(dir, "model.safetensors");
    ix->index_path = moe_io_path_join(dir, "model.safetensors.index.json");
    if (!single || !ix->index_path) {
        free(single);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    }
    moe_status st;
    /* Anything there but "no such file" (a symlink loop, EACCES on the path) is opened, so
     * the message is the real errno naming the file, not "neither ... found". */
    if (moe_io_path_exists(single) != 0) {
        free(ix->index_path);
        ix->index_path = NULL;
        ix->files = calloc(1, sizeof *ix->files); /* [1] */
        st = ix->files ? open_file(ix, "model.safetensors", NULL) : moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", dir);
    } else if (moe_io_path_exists(ix->index_path) != 0) {
        st = open_sharded(ix);
    } else {
        char hint[320];
        st = moe_set_error(ctx, MOE_ENOTFOUND, "%s: neither model.safetensors nor model.safetensors.index.json found%s",
                           dir, pickle_hint(dir, hint, sizeof hint));
    }
    free(single);
    return st;
}

void moe_ck_index_free(moe_ck_index *ix)
{
    if (!ix)
        return;
    for (size_t i = 0; i < ix->n_files; i++)
        moe_safetensors_free(ix->files[i]);
    free(ix->files);
    free(ix->map);
    json_decref(ix->index_json);
    free(ix->index_path);
    memset(ix, 0, sizeof *ix);
}

const moe_safetensors *moe_ck_file_of(const moe_ck_index *ix, const char *name)
{
    if (!ix->map)
        return ix->n_files ? ix->files[0] : NULL;
    moe_ck_map_entry key = {name, 0};
    const moe_ck_map_entry *hit = bsearch(&key, ix->map, ix->n_map, sizeof *ix->map, cmp_map_entry);
    return hit ? ix->files[hit->file] : NULL;
}

bool moe_ck_has(const moe_ck_index *ix, const char *name)
{
    const moe_safetensors *f = moe_ck_file_of(ix, name);
    if (!f)
        return false;
    return ix->map ? true : moe_st_find(f, name) >= 0;
}

moe_status moe_ck_get(const moe_ck_index *ix, const char *name, moe_tensor_info *info, const char **path)
{
    const moe_safetensors *f = moe_ck_file_of(ix, name);
    if (!f) {
        if (ix->map)
            return moe_set_error(ix->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found in weight_map", ix->index_path, name);
        return moe_set_error(ix->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found", ix->dir, name);
    }
    long i = moe_st_find(f, name);
    if (i < 0) {
        if (ix->map)
            return moe_set_error(ix->ctx, MOE_EFORMAT,
                                 "%s: tensor '%s' is mapped by %s to this shard, which does not contain it",
                                 moe_st_path(f), name, ix->index_path);
        return moe_set_error(ix->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found", moe_st_path(f), name);
    }
    *path = moe_st_path(f);
    moe_status st = moe_safetensors_at(f, (size_t)i, info);
    moe_ck_seen *seen = ix->seen;
    if (st == MOE_OK && seen && !seen->oom) {
        if (seen->n == seen->cap) {
            size_t cap = seen->cap ? 2 * seen->cap : 64;
            const char **grown = realloc(seen->names, cap * sizeof *grown); /* [cap] */
            if (grown) {
                seen->names = grown;
                seen->cap = cap;
            } else {
                seen->oom = true;
            }
        }
        if (!seen->oom)
            seen->names[seen->n++] = info->name;
    }
    return st;
}

void moe_ck_each_with_prefix(const moe_ck_index *ix, const char *prefix, void (*fn)(const char *name, void *u),
                             void *u)
{
    const size_t plen = strlen(prefix);
    if (ix->map) {
        /* sorted by name: the names starting with prefix are one run, from the first >= prefix */
        size_t lo = 0, hi = ix->n_map;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(ix->map[mid].tensor, prefix) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t k = lo; k < ix->n_map && strncmp(ix->map[k].tensor, prefix, plen) == 0; k++)
            fn(ix->map[k].tensor, u);
        return;
    }
    for (size_t f = 0; f < ix->n_files; f++) {
        const size_t n = moe_safetensors_count(ix->files[f]);
        for (size_t i = 0; i < n; i++) {
            moe_tensor_info t;
            if (moe_safetensors_at(ix->files[f], i, &t) == MOE_OK && strncmp(t.name, prefix, plen) == 0)
                fn(t.name, u);
        }
    }
}

/* moe_ckq_lookup callbacks (u = the index). */
static bool lookup_has(void *u, const char *name)
{
    return moe_ck_has(u, name);
}

static moe_status lookup_get(void *u, const char *name, moe_tensor_info *info, const char **path)
{
    return moe_ck_get(u, name, info, path);
}

moe_ckq_lookup moe_ck_lookup(const moe_ck_index *ix)
{
    return (moe_ckq_lookup){lookup_has, lookup_get, (void *)ix};
}
