/* Reading config.json and the shard index: JSON files and typed fields. Every message names
 * the file and the field as config.json spells it ("text_config.<field>" for the decoder
 * fields of a multimodal wrapper). */
#include "io/fields.h"
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const json_t *moe_cfg_get(const moe_cfg_fields *f, const char **key)
{
    const json_t *v = json_object_get(f->obj, *key);
    for (size_t i = 0; !v && i < f->n_aliases; i++)
        if (strcmp(f->aliases[i][0], *key) == 0 && (v = json_object_get(f->obj, f->aliases[i][1])) != NULL)
            *key = f->aliases[i][1];
    return v;
}

/* Field *key (or its alias, moe_cfg_get), or NULL when it is absent or null (the fields below
 * then take their default). */
static const json_t *given(const moe_cfg_fields *f, const char **key)
{
    const json_t *v = moe_cfg_get(f, key);
    return v && !json_is_null(v) ? v : NULL;
}

void moe_cfg_note_default(const moe_cfg_fields *f, const char *key, const char *fmt, ...)
{
    moe_cfg_assumed *a = f->assumed;
    if (!a || a->used >= sizeof a->text)
        return;
    int len = snprintf(a->text + a->used, sizeof a->text - a->used, "%s%s%s = ", a->n ? ", " : "", f->prefix, key);
    if (len > 0)
        a->used += (size_t)len;
    if (a->used < sizeof a->text) {
        va_list ap;
        va_start(ap, fmt);
        len = vsnprintf(a->text + a->used, sizeof a->text - a->used, fmt, ap);
        va_end(ap);
        if (len > 0)
            a->used += (size_t)len;
    }
    if (a->used > sizeof a->text - 1)
        a->used = sizeof a->text - 1;
    a->n++;
}

/* MOE_EFORMAT: field `key` is `v`, not `expected` ("an integer", ...). */
static moe_status wrong_type(const moe_cfg_fields *f, const char *key, const char *expected, const json_t *v)
{
    return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s' must be %s, found %s", f->path, f->prefix, key,
                         expected, moe_io_json_found(v));
}

moe_status moe_cfg_int(const moe_cfg_fields *f, const char *key, bool required, int64_t dflt, int64_t min,
                       int64_t *out)
{
    const json_t *v = moe_cfg_get(f, &key);
    if (!v || (!required && json_is_null(v))) {
        if (required)
            return moe_set_error(f->ctx, MOE_ENOTFOUND, "%s: field '%s%s' is missing", f->path, f->prefix, key);
        *out = dflt;
        moe_cfg_note_default(f, key, "%lld", (long long)dflt);
        return MOE_OK;
    }
    if (!json_is_integer(v))
        return wrong_type(f, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < min)
        return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s' = %lld must be >= %lld", f->path, f->prefix,
                             key, (long long)x, (long long)min);
    *out = (int64_t)x;
    return MOE_OK;
}

moe_status moe_cfg_int_alias(const moe_cfg_fields *f, const char *key, const char *alias, int64_t min,
                             int64_t *out)
{
    if (!json_object_get(f->obj, key) && json_object_get(f->obj, alias))
        return moe_cfg_int(f, alias, true, 0, min, out);
    if (!json_object_get(f->obj, key))
        return moe_set_error(f->ctx, MOE_ENOTFOUND, "%s: field '%s%s' (or '%s%s') is missing", f->path, f->prefix,
                             key, f->prefix, alias);
    return moe_cfg_int(f, key, true, 0, min, out);
}

moe_status moe_cfg_int_uniform(const moe_cfg_fields *f, const char *key, const char *alias, int64_t min,
                               int64_t n_layers, int64_t *out)
{
    if (alias && !json_object_get(f->obj, key) && json_object_get(f->obj, alias))
        key = alias;
    const json_t *v = json_object_get(f->obj, key);
    if (!json_is_array(v))
        return alias ? moe_cfg_int_alias(f, key, alias, min, out) : moe_cfg_int(f, key, true, 0, min, out);
    const size_t n = json_array_size(v);
    if (n == 0)
        return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s' is an empty list", f->path, f->prefix, key);
    if (n_layers > 0 && (int64_t)n != n_layers) /* the modeling code indexes it by layer */
        return moe_set_error(f->ctx, MOE_EFORMAT,
                             "%s: field '%s%s' is a per-layer list of %zu entries, but num_hidden_layers is %lld: it "
                             "needs one entry per layer",
                             f->path, f->prefix, key, n, (long long)n_layers);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] must be an integer, found %s", f->path,
                                 f->prefix, key, i, moe_io_json_kind(e));
        const json_int_t x = json_integer_value(e);
        if (x < min)
            return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] = %lld must be >= %lld", f->path,
                                 f->prefix, key, i, (long long)x, (long long)min);
        if (i > 0 && x != (json_int_t)*out)
            return moe_set_error(f->ctx, MOE_EUNSUPPORTED,
                                 "%s: field '%s%s' is a per-layer list whose entries differ ([0] = %lld, [%zu] = "
                                 "%lld): libmoe describes every MoE layer of a checkpoint with one value",
                                 f->path, f->prefix, key, (long long)*out, i, (long long)x);
        *out = (int64_t)x;
    }
    return MOE_OK;
}

moe_status moe_cfg_bool(const moe_cfg_fields *f, const char *key, int dflt, int *out)
{
    const json_t *v = given(f, &key);
    if (v && !json_is_boolean(v))
        return wrong_type(f, key, "true or false", v);
    *out = v ? json_is_true(v) : dflt;
    if (!v)
        moe_cfg_note_default(f, key, "%s", dflt ? "true" : "false");
    return MOE_OK;
}

moe_status moe_cfg_float(const moe_cfg_fields *f, const char *key, double dflt, bool check_min, double min_excl,
                         float *out)
{
    const json_t *v = given(f, &key);
    if (v && !json_is_number(v))
        return wrong_type(f, key, "a number", v);
    const double x = v ? json_number_value(v) : dflt;
    if (!isfinite(x) || !isfinite((float)x) || (check_min && !(x > min_excl)))
        return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s' = %g must be finite%s", f->path, f->prefix,
                             key, x, check_min ? " and > 0" : "");
    *out = (float)x;
    if (!v)
        moe_cfg_note_default(f, key, "%g", x);
    return MOE_OK;
}

moe_status moe_cfg_str(const moe_cfg_fields *f, const char *key, const char *dflt, const char **out)
{
    const json_t *v = given(f, &key);
    if (v && !json_is_string(v))
        return wrong_type(f, key, "a string", v);
    *out = v ? json_string_value(v) : dflt;
    if (!v)
        moe_cfg_note_default(f, key, "\"%s\"", dflt ? dflt : "");
    return MOE_OK;
}

moe_status moe_cfg_int_list(const moe_cfg_fields *f, const char *key, int64_t **out, size_t *n_out,
                            bool *present)
{
    *out = NULL;
    *n_out = 0;
    *present = false;
    const json_t *v = given(f, &key);
    if (!v) {
        moe_cfg_note_default(f, key, "none");
        return MOE_OK;
    }
    if (!json_is_array(v))
        return wrong_type(f, key, "an array of integers", v);
    size_t n = json_array_size(v);
    int64_t *a = calloc(n ? n : 1, sizeof *a); /* [n] */
    if (!a)
        return moe_set_error(f->ctx, MOE_ENOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) {
            free(a);
            return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] must be an integer, found %s",
                                 f->path, f->prefix, key, i, moe_io_json_found(x));
        }
        a[i] = (int64_t)json_integer_value(x);
    }
    *out = a;
    *n_out = n;
    *present = true;
    return MOE_OK;
}

moe_status moe_cfg_limit_list(const moe_cfg_fields *f, const char *key, float **out, size_t *n_out, bool *present)
{
    *out = NULL;
    *n_out = 0;
    *present = false;
    const json_t *v = given(f, &key);
    if (!v) {
        moe_cfg_note_default(f, key, "none");
        return MOE_OK;
    }
    if (!json_is_array(v))
        return wrong_type(f, key, "an array of numbers or null", v);
    const size_t n = json_array_size(v);
    float *a = calloc(n ? n : 1, sizeof *a); /* [n] */
    if (!a)
        return moe_set_error(f->ctx, MOE_ENOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (json_is_null(x))
            continue; /* no clamp on this layer */
        const double d = json_is_number(x) ? json_number_value(x) : -1.0;
        if (!json_is_number(x) || !(d >= 0.0) || !isfinite((float)d)) {
            free(a);
            if (!json_is_number(x))
                return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] must be a number or null, found %s",
                                     f->path, f->prefix, key, i, moe_io_json_found(x));
            return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] = %g must be finite and >= 0 (0 or null: "
                                 "no clamp)", f->path, f->prefix, key, i, d);
        }
        a[i] = (float)d;
    }
    *out = a;
    *n_out = n;
    *present = true;
    return MOE_OK;
}

moe_status moe_cfg_index_list_of(const moe_cfg_fields *f, const char *key, const char *match, const char *other,
                                 int64_t n_layers, int64_t **out, size_t *n_out, bool *present)
{
    *out = NULL;
    *n_out = 0;
    *present = false;
    const json_t *v = given(f, &key);
    if (!v) {
        moe_cfg_note_default(f, key, "none");
        return MOE_OK;
    }
    if (!json_is_array(v))
        return wrong_type(f, key, "an array of strings", v);
    const size_t n = json_array_size(v);
    /* one entry per layer, as the config classes validate (layer_types / mlp_layer_types): a
     * shorter list would leave layers with no rule, a longer one names layers that do not exist */
    if ((int64_t)n != n_layers)
        return moe_set_error(f->ctx, MOE_EFORMAT,
                             "%s: field '%s%s' has %zu entries, but num_hidden_layers is %" PRId64
                             ": it needs one \"%s\" or \"%s\" per layer",
                             f->path, f->prefix, key, n, n_layers, other, match);
    int64_t *a = calloc(n ? n : 1, sizeof *a); /* [n]: at most every index matches */
    if (!a)
        return moe_set_error(f->ctx, MOE_ENOMEM, "%s: out of memory", f->path);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        const char *s = json_is_string(x) ? json_string_value(x) : NULL;
        if (!s || (strcmp(s, match) != 0 && strcmp(s, other) != 0)) {
            free(a);
            if (!s)
                return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] must be a string, found %s", f->path,
                                     f->prefix, key, i, moe_io_json_found(x));
            return moe_set_error(f->ctx, MOE_EFORMAT, "%s: field '%s%s'[%zu] = \"%s\": must be \"%s\" or \"%s\"",
                                 f->path, f->prefix, key, i, s, match, other);
        }
        if (strcmp(s, match) == 0)
            a[m++] = (int64_t)i;
    }
    *out = a;
    *n_out = m;
    *present = true;
    return MOE_OK;
}

moe_status moe_json_load_object(moe_ctx *ctx, const char *path, uint64_t max_bytes, const char *limit_name,
                                json_t **out)
{
    *out = NULL;
    if (moe_io_path_exists(path) == 0)
        return moe_set_error(ctx, MOE_ENOTFOUND, "%s: not found", path);
    int fd;
    uint64_t size;
    moe_status st = moe_io_open_regular(ctx, path, &fd, &size);
    if (st != MOE_OK)
        return st;
    if (size > max_bytes) {
        close(fd);
        return moe_set_error(ctx, MOE_EFORMAT, "%s: file is %" PRIu64 " bytes, over the %" PRIu64 "-byte (%" PRIu64
                             " MiB) limit %s",
                             path, size, max_bytes, max_bytes >> 20, limit_name);
    }
    char *buf = malloc((size_t)size + 1); /* [size + 1] the file's bytes */
    if (!buf) {
        close(fd);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory reading %" PRIu64 " bytes", path, size);
    }
    size_t got = 0;
    while (got < (size_t)size) { /* a file shrunk meanwhile parses short (and fails as JSON) */
        ssize_t r = read(fd, buf + got, (size_t)size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return moe_set_error(ctx, MOE_EIO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    json_error_t jerr;
    json_t *root = json_loadb(buf, got, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!root)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", path, jerr.text,
                             jerr.line, jerr.column);
    if (!json_is_object(root)) {
        st = moe_set_error(ctx, MOE_EFORMAT, "%s: must be a JSON object, found %s", path, moe_io_json_found(root));
        json_decref(root);
        return st;
    }
    *out = root;
    return MOE_OK;
}

char *moe_io_path_join(const char *a, const char *b)
{
    size_t len = strlen(a) + 1 + strlen(b) + 1;
    char *p = malloc(len);
    if (p)
        snprintf(p, len, "%s/%s", a, b);
    return p;
}

int moe_io_path_exists(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0)
        return 1;
    const int e = errno;
    if (e == ENOENT && lstat(path, &sb) == 0)
        return 1; /* a dangling symlink: opening it names its target (moe_io_open_regular) */
    errno = e;
    return e == ENOENT || e == ENOTDIR ? 0 : -1;
}
