/* Load files (docs/parallel.md "Expert load"): JSON {"num_logical_experts": E, "load": [E
 * non-negative integers]}, the per-logical-expert routed rows that `moe bench --ep
 * --load-out` writes and `moe plan --load` / the balanced policy read. */
#include "core/file.h"
#include "io/fields.h"
#include "core/internal.h"
#include "moe_parallel.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A load file larger than this is refused (E integers of at most 20 digits: 1 MiB holds
 * 40000 experts). */
#define MOE_LOAD_MAX_BYTES ((uint64_t)1 << 20)

moe_status moe_load_read(moe_ctx *ctx, const char *path, int64_t num_experts, int64_t *load)
{
    if (!path || !load)
        return moe_set_error(ctx, MOE_EINVAL, "moe_load_read: %s is NULL", !path ? "path" : "load");
    if (num_experts < 1)
        return moe_set_error(ctx, MOE_EINVAL, "moe_load_read: num_experts = %lld, need >= 1", (long long)num_experts);
    json_t *root = NULL;
    moe_status st = moe_json_load_object(ctx, path, MOE_LOAD_MAX_BYTES, "for a load file", &root);
    if (st != MOE_OK)
        return st;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "num_logical_experts") != 0 && strcmp(key, "load") != 0) {
            st = moe_set_error(ctx, MOE_EFORMAT,
                               "load file %s: unknown field \"%.60s\" (a load file has num_logical_experts, load)",
                               path, key);
            json_decref(root);
            return st;
        }
    }
    const json_t *ne = json_object_get(root, "num_logical_experts");
    const json_t *arr = json_object_get(root, "load");
    if (!json_is_integer(ne))
        st = moe_set_error(ctx, MOE_EFORMAT, "load file %s: field 'num_logical_experts' must be an integer, found %s",
                           path, moe_io_json_found(ne));
    else if (json_integer_value(ne) != num_experts)
        st = moe_set_error(ctx, MOE_EFORMAT,
                           "load file %s: num_logical_experts = %lld, the layer has num_experts = %lld (a load file "
                           "of another model?)",
                           path, (long long)json_integer_value(ne), (long long)num_experts);
    else if (!json_is_array(arr))
        st = moe_set_error(ctx, MOE_EFORMAT, "load file %s: field 'load' must be an array of integers, found %s", path,
                           moe_io_json_found(arr));
    else if ((int64_t)json_array_size(arr) != num_experts)
        st = moe_set_error(ctx, MOE_EFORMAT, "load file %s: 'load' has %zu entries, num_experts is %lld", path,
                           json_array_size(arr), (long long)num_experts);
    for (int64_t e = 0; e < num_experts && st == MOE_OK; e++) {
        const json_t *v = json_array_get(arr, (size_t)e);
        if (!json_is_integer(v))
            st = moe_set_error(ctx, MOE_EFORMAT, "load file %s: load[%lld] must be an integer, found %s", path,
                               (long long)e, moe_io_json_found(v));
        else if (json_integer_value(v) < 0 || json_integer_value(v) > MOE_LOAD_MAX)
            st = moe_set_error(ctx, MOE_EFORMAT, "load file %s: load[%lld] = %lld: counts must be in [0, 2^40]", path,
                               (long long)e, (long long)json_integer_value(v));
    }
    if (st == MOE_OK) /* the caller's array only once the whole file checked */
        for (int64_t e = 0; e < num_experts; e++)
            load[e] = (int64_t)json_integer_value(json_array_get(arr, (size_t)e));
    json_decref(root);
    return st;
}

moe_status moe_load_write(moe_ctx *ctx, const char *path, const int64_t *load, int64_t num_experts)
{
    if (!path || !load)
        return moe_set_error(ctx, MOE_EINVAL, "moe_load_write: %s is NULL", !path ? "path" : "load");
    if (num_experts < 1)
        return moe_set_error(ctx, MOE_EINVAL, "moe_load_write: num_experts = %lld, need >= 1", (long long)num_experts);
    for (int64_t e = 0; e < num_experts; e++)
        if (load[e] < 0 || load[e] > MOE_LOAD_MAX)
            return moe_set_error(ctx, MOE_EINVAL, "moe_load_write: load[%lld] = %lld: counts must be in [0, 2^40]",
                                 (long long)e, (long long)load[e]);
    json_t *root = json_object(), *arr = json_array();
    int bad = !root || !arr;
    for (int64_t e = 0; e < num_experts && !bad; e++)
        bad = json_array_append_new(arr, json_integer((json_int_t)load[e])) != 0;
    if (!bad)
        bad = json_object_set_new(root, "num_logical_experts", json_integer((json_int_t)num_experts)) != 0 ||
              json_object_set(root, "load", arr) != 0;
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(arr);
    json_decref(root);
    if (!text)
        return moe_set_error(ctx, MOE_ENOMEM, "load file %s: out of memory", path);

    /* the text and a newline, written atomically (a temporary file renamed over path) */
    const void *parts[2] = {text, "\n"};
    const size_t lens[2] = {strlen(text), 1};
    moe_status st = moe_io_write_atomic(ctx, "load file ", path, parts, lens, 2);
    free(text);
    return st;
}
