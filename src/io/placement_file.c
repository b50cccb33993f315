/* Placement files (moe_parallel.h "Expert placement", docs/parallel.md "Placement file"): the
 * reader and the atomic writer. The rules are checked by moe_placement_check and what the
 * reader allocates is freed by moe_placement_clear (both in src/parallel/placement.c, which
 * plan creation uses too). JSON through jansson and the regular-file helpers of
 * src/core/file.c, as the other readers of src/io. */
#include "core/file.h"
#include "core/internal.h"
#include "io/fields.h"
#include "moe_parallel.h"
#include "parallel/parallel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

/* A placement file is a few integers per physical expert: 64 MiB holds millions of them. */
#define PLACEMENT_FILE_MAX_BYTES ((uint64_t)64 << 20)


/* root[key] as an integer in [lo, hi] into *out, else MOE_EFORMAT naming path and key. */
static moe_status read_int(moe_ctx *ctx, const char *path, json_t *root, const char *key, int64_t lo, int64_t hi,
                           int32_t *out)
{
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: %s must be an integer, found %s", path, key, moe_io_json_found(v));
    const json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: %s = %lld, must be in [%lld, %lld]", path, key, (long long)x,
                             (long long)lo, (long long)hi);
    *out = (int32_t)x;
    return MOE_OK;
}

static moe_status parse(moe_ctx *ctx, const char *path, json_t *root, moe_placement *out)
{
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "ep_size") != 0 && strcmp(key, "num_logical_experts") != 0 && strcmp(key, "ranks") != 0)
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: unknown field \"%s\" (a placement file has ep_size, num_logical_experts, ranks)",
                                 path, key);
    }
    moe_status st;
    if ((st = read_int(ctx, path, root, "ep_size", 1, PLACEMENT_MAX_RANKS, &out->ep_size)) != MOE_OK)
        return st;
    if ((st = read_int(ctx, path, root, "num_logical_experts", 1, PLACEMENT_MAX_EXPERTS, &out->num_logical_experts)) !=
        MOE_OK)
        return st;
    json_t *ranks = json_object_get(root, "ranks");
    if (!json_is_array(ranks))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: ranks must be an array (one per rank), found %s", path,
                             moe_io_json_found(ranks));
    if (json_array_size(ranks) != (size_t)out->ep_size)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: ranks has %zu entries, but ep_size = %d", path,
                             json_array_size(ranks), (int)out->ep_size);
    const int64_t E = out->num_logical_experts, pmax = E * out->ep_size;
    int64_t P = 0;
    for (size_t r = 0; r < json_array_size(ranks); r++) {
        json_t *list = json_array_get(ranks, r);
        if (!json_is_array(list))
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: ranks[%zu] must be an array of logical expert ids, found %s", path, r,
                                 moe_io_json_found(list));
        P += (int64_t)json_array_size(list);
        if (P > pmax)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "%s: ranks[0..%zu] hold over %lld physical experts (num_logical_experts * "
                                 "ep_size), the most a placement may have",
                                 path, r, (long long)pmax);
    }
    out->num_physical_experts = (int32_t)P;
    /* rank_num_physical [ep_size], physical_to_logical [P] (at least one element for malloc) */
    out->rank_num_physical = malloc((size_t)out->ep_size * sizeof *out->rank_num_physical);
    out->physical_to_logical = malloc((size_t)(P > 0 ? P : 1) * sizeof *out->physical_to_logical);
    if (!out->rank_num_physical || !out->physical_to_logical)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory for %lld physical experts", path, (long long)P);
    int64_t q = 0;
    for (size_t r = 0; r < json_array_size(ranks); r++) {
        json_t *list = json_array_get(ranks, r);
        out->rank_num_physical[r] = (int32_t)json_array_size(list);
        for (size_t i = 0; i < json_array_size(list); i++, q++) {
            json_t *v = json_array_get(list, i);
            if (!json_is_integer(v))
                return moe_set_error(ctx, MOE_EFORMAT, "%s: ranks[%zu][%zu] must be an integer, found %s", path, r,
                                     i, moe_io_json_found(v));
            const json_int_t e = json_integer_value(v);
            if (e < 0 || e >= E)
                return moe_set_error(ctx, MOE_EINVAL,
                                     "%s: ranks[%zu][%zu] = %lld (physical expert %lld), logical expert out of "
                                     "range [0, %lld)",
                                     path, r, i, (long long)e, (long long)q, (long long)E);
            out->physical_to_logical[q] = (int32_t)e;
        }
    }
    if ((st = moe_placement_check(ctx, out, E, out->ep_size)) != MOE_OK)
        return moe_set_error(ctx, st, "%s: %s", path, ctx ? moe_ctx_last_error(ctx) : "");
    return MOE_OK;
}

moe_status moe_placement_read(moe_ctx *ctx, const char *path, moe_placement *out)
{
    if (!out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_read: path is NULL");
    json_t *root = NULL;
    moe_status st = moe_json_load_object(ctx, path, PLACEMENT_FILE_MAX_BYTES, "for a placement file", &root);
    if (st != MOE_OK)
        return st;
    st = parse(ctx, path, root, out);
    json_decref(root);
    if (st != MOE_OK)
        moe_placement_clear(out);
    return st;
}

moe_status moe_placement_write(moe_ctx *ctx, const char *path, const moe_placement *p)
{
    if (!path || !p)
        return moe_set_error(ctx, MOE_EINVAL, "moe_placement_write: %s is NULL", !path ? "path" : "placement");
    moe_status st = moe_placement_check(ctx, p, p->num_logical_experts, p->ep_size);
    if (st != MOE_OK)
        return moe_set_error(ctx, st, "%s: not written: %s", path, ctx ? moe_ctx_last_error(ctx) : "");
    /* One line per rank: {"ep_size": N, "num_logical_experts": E, "ranks": [[...], ...]}, built in
     * memory, then written atomically (a temporary file renamed over path) */
    char *text = NULL; /* [len] the file's bytes */
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
    fprintf(f, "{\"ep_size\": %d, \"num_logical_experts\": %d, \"ranks\": [", (int)p->ep_size,
            (int)p->num_logical_experts);
    int64_t q = 0;
    for (int r = 0; r < p->ep_size; r++) {
        fprintf(f, "%s\n  [", r ? "," : "");
        for (int32_t i = 0; i < p->rank_num_physical[r]; i++, q++)
            fprintf(f, "%s%d", i ? ", " : "", (int)p->physical_to_logical[q]);
        fputc(']', f);
    }
    fputs("\n]}\n", f);
    const int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        free(text);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
    }
    const void *parts[1] = {text};
    st = moe_io_write_atomic(ctx, "", path, parts, &len, 1);
    free(text);
    return st;
}
