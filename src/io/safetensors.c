/* Safetensors files: a validating mmap reader and an atomic writer.
 *
 * File layout (https://github.com/huggingface/safetensors):
 *   bytes [0, 8)        N, the header length, u64 little-endian
 *   bytes [8, 8 + N)    header: a JSON object, possibly padded with spaces
 *                         { "__metadata__": {str: str}  (optional),
 *                           "<tensor>": {"dtype": "BF16", "shape": [d0, ...],
 *                                        "data_offsets": [begin, end]}, ... }
 *   bytes [8 + N, end)  data section; a tensor's bytes are [begin, end) relative to it
 *
 * The reader validates every header field against the file size before any tensor byte is
 * handed out, so a truncated or hostile file is an error, never a read out of bounds.
 */
#include "io/safetensors.h"
#include "quant/convert.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000)

/* One tensor as the header describes it. */
typedef struct st_tensor {
    const char *name;           /* into moe_safetensors.names */
    moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    uint64_t begin, end;        /* byte range [begin, end) within the data section */
} st_tensor;

/* A (name, header index) pair; the array of them sorted by name answers lookups. */
typedef struct st_name_ref {
    const char *name;
    size_t index;
} st_name_ref;

struct moe_safetensors {
    moe_ctx *ctx;               /* borrowed: errors of moe_safetensors_get go here */
    char *path;                 /* as the caller spelled it */
    uint8_t *map;               /* [map_size] the whole file, mapped read-only */
    size_t map_size;
    const uint8_t *data;        /* [data_size] the data section, map + 8 + N */
    size_t data_size;
    size_t n;                   /* number of tensors */
    st_tensor *tensors;         /* [n] in header order */
    st_name_ref *by_name;       /* [n] sorted by name (strcmp) */
    char *names;                /* every tensor name, NUL-terminated, back to back */
};

/* Safetensors dtype strings. "F8_E4M3" is what the reference writer emits for
 * torch.float8_e4m3fn; "F8_E4M3FN" is accepted as an alias. */
static const struct {
    const char *name;
    moe_dtype dtype;
} st_dtype_names[] = {
    {"F32", MOE_DTYPE_F32},   {"BF16", MOE_DTYPE_BF16},      {"F16", MOE_DTYPE_F16},
    {"I32", MOE_DTYPE_I32},   {"I64", MOE_DTYPE_I64},        {"F64", MOE_DTYPE_F64},
    {"U8", MOE_DTYPE_U8},     {"I8", MOE_DTYPE_I8},          {"F8_E4M3", MOE_DTYPE_F8_E4M3},
    {"F8_E4M3FN", MOE_DTYPE_F8_E4M3}, {"I16", MOE_DTYPE_I16}, {"BOOL", MOE_DTYPE_BOOL},
    {"U16", MOE_DTYPE_U16},   {"U32", MOE_DTYPE_U32},        {"U64", MOE_DTYPE_U64},
    {"F8_E5M2", MOE_DTYPE_F8_E5M2},
};

/* Look up a safetensors dtype string. Returns false for an unknown one. */
static bool st_dtype_from_name(const char *s, moe_dtype *out)
{
    for (size_t i = 0; i < sizeof st_dtype_names / sizeof st_dtype_names[0]; i++) {
        if (strcmp(s, st_dtype_names[i].name) == 0) {
            *out = st_dtype_names[i].dtype;
            return true;
        }
    }
    return false;
}

char *moe_io_format_shape(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t used = 0;
    if (len == 0)
        return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

moe_status moe_io_check_scales(moe_ctx *ctx, const char *path, const char *name, moe_dtype dt, const void *data,
                               int64_t rows, int64_t cols, const char *what)
{
    const size_t es = dt == MOE_DTYPE_F32 ? 4 : (dt == MOE_DTYPE_BF16 || dt == MOE_DTYPE_F16) ? 2 : 0;
    if (!es || !data)
        return MOE_OK;
    const int64_t n = rows * (cols > 0 ? cols : 1);
    const unsigned char *p = data;
    int64_t bad = 0, first = -1;
    float first_v = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float s;
        if (es == 4) {
            memcpy(&s, p + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            s = dt == MOE_DTYPE_BF16 ? moe_bf16_to_f32(h) : moe_f16_to_f32(h);
        }
        if (!(s > 0.0f) || s - s != 0.0f) { /* NaN, <= 0, or infinite */
            if (first < 0) {
                first = i;
                first_v = s;
            }
            bad++;
        }
    }
    if (first < 0)
        return MOE_OK;
    char at[64];
    if (cols > 0)
        snprintf(at, sizeof at, "[%" PRId64 ", %" PRId64 "]", first / cols, first % cols);
    else
        snprintf(at, sizeof at, "[%" PRId64 "]", first);
    const char *kind = first_v != first_v ? "NaN" : first_v - first_v != 0.0f ? "infinite" : first_v == 0.0f ? "zero"
                                                                                                           : "negative";
    return moe_set_error(ctx, MOE_EFORMAT,
                         "%s: tensor '%s': entry %s = %g is %s (%" PRId64 " of its %" PRId64 " values are NaN, "
                         "infinite, zero or negative): every %s value must be finite and positive (quantizers "
                         "clamp them above zero); a corrupt or edited checkpoint, refused",
                         path, name, at, first_v != first_v ? (double)fabsf(first_v) : (double)first_v, kind, bad, n,
                         what);
}

/* --------------------------------------------------------------------------------------
 * Reader
 * ------------------------------------------------------------------------------------ */

void moe_safetensors_free(moe_safetensors *f)
{
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->map_size);
    free(f->tensors);
    free(f->by_name);
    free(f->names);
    free(f->path);
    free(f);
}

/* qsort/bsearch comparator of st_name_ref by name. */
static int cmp_name_ref(const void *a, const void *b)
{
    const st_name_ref *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* qsort comparator of st_tensor pointers by data_offsets begin, then end. */
static int cmp_tensor_ptr_by_begin(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a;
    const st_tensor *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* Read a JSON integer that must be >= 0 into *out. Returns false when `v` is not one. */
static bool json_nonneg_int(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v))
        return false;
    json_int_t x = json_integer_value(v);
    if (x < 0)
        return false;
    *out = (uint64_t)x;
    return true;
}

/* Parse and validate one tensor entry `obj` named `name` into *t. `data_size` is the size of
 * the data section. On error records a message naming the file and the tensor. */
static moe_status parse_tensor_entry(moe_ctx *ctx, const char *path, const char *name,
                                     const json_t *obj, uint64_t data_size, st_tensor *t)
{
    if (!json_is_object(obj))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': entry must be an object, found %s",
                             path, name, moe_io_json_kind(obj));

    /* dtype */
    const json_t *jdtype = json_object_get(obj, "dtype");
    if (!jdtype)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': field 'dtype' is missing", path,
                             name);
    if (!json_is_string(jdtype))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': field 'dtype' must be a string, found %s",
                             path, name, moe_io_json_kind(jdtype));
    const char *dtype_str = json_string_value(jdtype);
    if (!st_dtype_from_name(dtype_str, &t->dtype))
        return moe_set_error(ctx, MOE_EDTYPE,
                             "%s: tensor '%s': dtype '%s' is not a safetensors dtype, so its byte size "
                             "cannot be checked (the format's: BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, "
                             "BF16, I32, U32, F32, F64, I64, U64)",
                             path, name, dtype_str);

    /* shape */
    const json_t *jshape = json_object_get(obj, "shape");
    if (!jshape)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': field 'shape' is missing", path,
                             name);
    if (!json_is_array(jshape))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': field 'shape' must be an array, found %s",
                             path, name, moe_io_json_kind(jshape));
    size_t ndim = json_array_size(jshape);
    if (ndim > MOE_MAX_DIMS)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': shape has %zu dimensions, at most %d supported",
                             path, name, ndim, MOE_MAX_DIMS);
    t->ndim = (int)ndim;
    size_t numel = 1;
    bool numel_overflow = false;
    for (size_t d = 0; d < ndim; d++) {
        uint64_t dim;
        const json_t *jd = json_array_get(jshape, d);
        if (!json_nonneg_int(jd, &dim))
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: tensor '%s': shape[%zu] must be a non-negative integer", path,
                                 name, d);
        t->shape[d] = (int64_t)dim;
        if (dim > SIZE_MAX || !moe_mul_size(numel, (size_t)dim, &numel))
            numel_overflow = true;
    }
    size_t nbytes = 0;
    if (!numel_overflow && !moe_mul_size(numel, moe_dtype_size(t->dtype), &nbytes))
        numel_overflow = true;
    /* A shape whose product is zero has zero bytes, whatever overflowed on the way. */
    for (size_t d = 0; d < ndim; d++) {
        if (t->shape[d] == 0) {
            numel_overflow = false;
            nbytes = 0;
        }
    }
    if (numel_overflow)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': shape is too large (byte size overflows)",
                             path, name);

    /* data_offsets */
    const json_t *joff = json_object_get(obj, "data_offsets");
    if (!joff)
        return moe_set_error(ctx, MOE_EFORMAT, "%s: tensor '%s': field 'data_offsets' is missing",
                             path, name);
    if (!json_is_array(joff) || json_array_size(joff) != 2 ||
        !json_nonneg_int(json_array_get(joff, 0), &t->begin) ||
        !json_nonneg_int(json_array_get(joff, 1), &t->end))
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: tensor '%s': data_offsets must be [begin, end] of two non-negative integers",
                             path, name);
    if (t->begin > t->end)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin after end",
                             path, name, t->begin, t->end);
    if (t->end > data_size)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                             "] end beyond data section of %" PRIu64 " bytes",
                             path, name, t->begin, t->end, data_size);
    if (t->end - t->begin != (uint64_t)nbytes) {
        char sbuf[160];
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                             " bytes but dtype %s shape %s needs %zu",
                             path, name, t->begin, t->end, t->end - t->begin, dtype_str,
                             moe_io_format_shape(sbuf, sizeof sbuf, t->ndim, t->shape), nbytes);
    }
    return MOE_OK;
}

/* Check the "__metadata__" entry: an object whose values are strings. */
static moe_status check_metadata(moe_ctx *ctx, const char *path, const json_t *meta)
{
    if (!json_is_object(meta))
        return moe_set_error(ctx, MOE_EFORMAT, "%s: __metadata__ must be an object, found %s", path,
                             moe_io_json_kind(meta));
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)meta, key, val) {
        if (!json_is_string(val))
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "%s: __metadata__ field '%s' must be a string, found %s", path, key,
                                 moe_io_json_kind(val));
    }
    return MOE_OK;
}

/* Parse the header JSON `hdr` [hdr_len bytes] of `f` (whose map, data and data_size are set)
 * into f->tensors, f->names and f->by_name, validating every entry. */
static moe_status parse_header(moe_ctx *ctx, moe_safetensors *f, const char *hdr, size_t hdr_len)
{
    const char *path = f->path;
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hdr_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return moe_set_error(ctx, MOE_EFORMAT,
                             "%s: header is not valid JSON: %s (at byte %d of the %zu-byte header)",
                             path, jerr.text, jerr.position, hdr_len);
    moe_status st = MOE_OK;
    if (!json_is_object(root)) {
        st = moe_set_error(ctx, MOE_EFORMAT, "%s: header must be a JSON object, found %s", path,
                           moe_io_json_kind(root));
        goto done;
    }

    /* First pass: count tensors and the bytes of their names; check key spelling. */
    size_t n = 0, names_bytes = 0;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach(root, key, key_len, val) {
        if (strlen(key) != key_len) {
            st = moe_set_error(ctx, MOE_EFORMAT, "%s: a tensor name contains a NUL character", path);
            goto done;
        }
        if (strcmp(key, "__metadata__") == 0) {
            st = check_metadata(ctx, path, val);
            if (st != MOE_OK)
                goto done;
            continue;
        }
        n++;
        names_bytes += key_len + 1;
    }

    f->n = n;
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);  /* [n] */
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);  /* [n] */
    f->names = malloc(names_bytes ? names_bytes : 1);     /* [names_bytes] */
    st_tensor **by_begin = calloc(n ? n : 1, sizeof *by_begin); /* [n] */
    if (!f->tensors || !f->by_name || !f->names || !by_begin) {
        free(by_begin);
        st = moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory for a header of %zu tensors", path, n);
        goto done;
    }

    /* Second pass: parse every tensor entry, in header order. */
    size_t i = 0;
    char *name_dst = f->names;
    json_object_keylen_foreach(root, key, key_len, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        st_tensor *t = &f->tensors[i];
        memcpy(name_dst, key, key_len + 1);
        t->name = name_dst;
        name_dst += key_len + 1;
        st = parse_tensor_entry(ctx, path, t->name, val, f->data_size, t);
        if (st != MOE_OK) {
            free(by_begin);
            goto done;
        }
        f->by_name[i].name = t->name;
        f->by_name[i].index = i;
        by_begin[i] = t;
        i++;
    }

    /* No two tensors may share bytes: sort by begin and compare neighbours. Zero-byte tensors
     * own no bytes and are skipped. */
    qsort(by_begin, n, sizeof *by_begin, cmp_tensor_ptr_by_begin);
    const st_tensor *prev = NULL;
    for (size_t k = 0; k < n; k++) {
        const st_tensor *t = by_begin[k];
        if (t->begin == t->end)
            continue;
        if (prev && t->begin < prev->end) {
            st = moe_set_error(ctx, MOE_EFORMAT,
                               "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                               "] overlap those of tensor '%s' [%" PRIu64 ", %" PRIu64 "]",
                               path, t->name, t->begin, t->end, prev->name, prev->begin,
                               prev->end);
            free(by_begin);
            goto done;
        }
        prev = t;
    }
    /* As the reference parser requires, the data section is fully indexed: tensors follow
     * each other with no gap ... */
    prev = NULL;
    for (size_t k = 0; k < n; k++) {
        const st_tensor *t = by_begin[k];
        if (t->begin == t->end)
            continue; /* owns no bytes */
        uint64_t expect = prev ? prev->end : 0;
        if (t->begin != expect) {
            st = moe_set_error(ctx, MOE_EFORMAT,
                               "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] leave %" PRIu64
                               " unindexed bytes before it (the data section must be fully indexed)",
                               path, t->name, t->begin, t->end, t->begin - expect);
            free(by_begin);
            goto done;
        }
        prev = t;
    }
    /* ... and no bytes after the last one. */
    uint64_t last_end = prev ? prev->end : 0;
    if (last_end != f->data_size) {
        st = moe_set_error(ctx, MOE_EFORMAT,
                           "%s: %" PRIu64 " bytes after the last tensor's data (data section of %zu bytes, "
                           "tensors end at %" PRIu64 "; it must be fully indexed)",
                           path, (uint64_t)f->data_size - last_end, f->data_size, last_end);
        free(by_begin);
        goto done;
    }
    free(by_begin);

    qsort(f->by_name, n, sizeof *f->by_name, cmp_name_ref);

done:
    json_decref(root);
    return st;
}

moe_status moe_safetensors_open(moe_ctx *ctx, const char *path, moe_safetensors **out)
{
    if (!out)
        return moe_set_error(ctx, MOE_EINVAL, "moe_safetensors_open: out is NULL");
    *out = NULL;
    if (!path)
        return moe_set_error(ctx, MOE_EINVAL, "moe_safetensors_open: path is NULL");

    moe_safetensors *f = calloc(1, sizeof *f);
    if (!f)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
    f->ctx = ctx;
    f->path = strdup(path);
    if (!f->path) {
        free(f);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
    }

    moe_status st = MOE_OK;
    int fd;
    uint64_t file_size;
    if ((st = moe_io_open_regular(ctx, path, &fd, &file_size)) != MOE_OK)
        goto fail;
    if (file_size < 8) {
        close(fd);
        st = moe_set_error(ctx, MOE_EFORMAT,
                           "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
                           path, file_size);
        goto fail;
    }
    if (file_size > SIZE_MAX) {
        close(fd);
        st = moe_set_error(ctx, MOE_ENOMEM, "%s: file of %" PRIu64 " bytes cannot be mapped", path,
                           file_size);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        st = moe_set_error(ctx, MOE_EIO, "%s: mmap of %" PRIu64 " bytes failed: %s", path,
                           file_size, strerror(map_errno));
        goto fail;
    }
    f->map = map;
    f->map_size = (size_t)file_size;

    /* Header length: u64 little-endian, read byte by byte (no alignment or endian assumption). */
    uint64_t hdr_len = 0;
    for (int b = 7; b >= 0; b--)
        hdr_len = (hdr_len << 8) | f->map[b];
    if (hdr_len > file_size - 8) {
        st = moe_set_error(ctx, MOE_EFORMAT,
                           "%s: header length %" PRIu64 " runs beyond the end of the file (%" PRIu64
                           " bytes after the 8-byte length)",
                           path, hdr_len, file_size - 8);
        goto fail;
    }
    if (hdr_len > ST_MAX_HEADER_BYTES) {
        st = moe_set_error(ctx, MOE_EFORMAT, "%s: header length %" PRIu64 " exceeds the %" PRIu64
                           "-byte limit", path, hdr_len, ST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (hdr_len == 0) {
        st = moe_set_error(ctx, MOE_EFORMAT, "%s: header length is 0 (the header must be a JSON object)",
                           path);
        goto fail;
    }
    f->data = f->map + 8 + hdr_len;
    f->data_size = (size_t)(file_size - 8 - hdr_len);

    st = parse_header(ctx, f, (const char *)f->map + 8, (size_t)hdr_len);
    if (st != MOE_OK)
        goto fail;

    moe_log(ctx, MOE_LOG_DEBUG, "%s: %zu tensors, %zu data bytes", path, f->n, f->data_size);
    *out = f;
    return MOE_OK;

fail:
    moe_safetensors_free(f);
    return st;
}

size_t moe_safetensors_count(const moe_safetensors *f)
{
    return f ? f->n : 0;
}

/* Fill the public view of tensor i. */
static void tensor_info(const moe_safetensors *f, size_t i, moe_tensor_info *out)
{
    const st_tensor *t = &f->tensors[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++)
        out->shape[d] = t->shape[d];
    out->data = f->data + t->begin;
    out->nbytes = (size_t)(t->end - t->begin);
}

moe_status moe_safetensors_at(const moe_safetensors *f, size_t i, moe_tensor_info *out)
{
    if (!f || !out)
        return MOE_EINVAL;
    if (i >= f->n)
        return moe_set_error(f->ctx, MOE_ERANGE, "%s: tensor index %zu out of range [0, %zu)",
                             f->path, i, f->n);
    tensor_info(f, i, out);
    return MOE_OK;
}

long moe_st_find(const moe_safetensors *f, const char *name)
{
    if (!f || !name || f->n == 0)
        return -1;
    st_name_ref key = {name, 0};
    const st_name_ref *hit = bsearch(&key, f->by_name, f->n, sizeof *f->by_name, cmp_name_ref);
    return hit ? (long)hit->index : -1;
}

const char *moe_st_path(const moe_safetensors *f)
{
    return f ? f->path : "";
}

/* MOE_ENOTFOUND for `name`, with the closest key (moe_suggest) and the keys the file holds
 * (the first eight in header order), so a file saved under another key says which. */
static moe_status not_found(moe_safetensors *f, const char *name)
{
    enum { SHOWN = 8 };
    char keys[512] = "";
    size_t used = 0;
    for (size_t k = 0; k < f->n && k < SHOWN && used < sizeof keys; k++)
        used += (size_t)snprintf(keys + used, sizeof keys - used, "%s'%.80s'", k ? ", " : "", f->tensors[k].name);
    if (f->n > SHOWN && used < sizeof keys)
        snprintf(keys + used, sizeof keys - used, ", ...");
    const char *close = NULL;
    const char **names = f->n ? malloc(f->n * sizeof *names) : NULL; /* [n] the keys; NULL: no hint */
    if (names) {
        for (size_t k = 0; k < f->n; k++)
            names[k] = f->tensors[k].name;
        close = moe_suggest(name, strlen(name), names, f->n);
    }
    moe_status st;
    if (f->n == 0)
        st = moe_set_error(f->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found: the file holds no tensors", f->path,
                           name);
    else
        st = moe_set_error(f->ctx, MOE_ENOTFOUND, "%s: tensor '%s' not found%s%.80s%s; the file holds %zu tensor%s: %s",
                           f->path, name, close ? " (did you mean '" : "", close ? close : "", close ? "'?)" : "",
                           f->n, f->n == 1 ? "" : "s", keys);
    free(names);
    return st;
}

moe_status moe_safetensors_get(moe_safetensors *f, const char *name, moe_tensor_info *out)
{
    if (!f)
        return MOE_EINVAL;
    if (!name || !out)
        return moe_set_error(f->ctx, MOE_EINVAL, "moe_safetensors_get: %s is NULL",
                             !name ? "name" : "out");
    long i = moe_st_find(f, name);
    if (i < 0)
        return not_found(f, name);
    tensor_info(f, (size_t)i, out);
    return MOE_OK;
}

/* --------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------ */

/* Check the tensors to write and compute each one's byte size into nbytes [n]. */
static moe_status check_write_args(moe_ctx *ctx, const char *path, const moe_tensor_out *tensors,
                                   size_t n, size_t *nbytes)
{
    for (size_t i = 0; i < n; i++) {
        const moe_tensor_out *t = &tensors[i];
        if (!t->name)
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor %zu: name is NULL", path, i);
        if (t->name[0] == '\0')
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor %zu: name is empty", path, i);
        if (strcmp(t->name, "__metadata__") == 0)
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor %zu: the name '__metadata__' is reserved",
                                 path, i);
        if ((int)t->dtype < 0 || t->dtype >= MOE_DTYPE_COUNT || moe_dtype_size(t->dtype) == 0)
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor '%s': dtype %d is not a moe_dtype",
                                 path, t->name, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > MOE_MAX_DIMS)
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor '%s': ndim %d outside [0, %d]", path,
                                 t->name, t->ndim, MOE_MAX_DIMS);
        size_t numel = 1;
        bool overflow = false, empty = false;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0)
                return moe_set_error(ctx, MOE_EINVAL, "%s: tensor '%s': shape[%d] = %" PRId64
                                     " is negative", path, t->name, d, t->shape[d]);
            if (t->shape[d] == 0)
                empty = true;
            if ((uint64_t)t->shape[d] > SIZE_MAX || !moe_mul_size(numel, (size_t)t->shape[d], &numel))
                overflow = true;
        }
        if (!overflow && !moe_mul_size(numel, moe_dtype_size(t->dtype), &nbytes[i]))
            overflow = true;
        if (empty) {
            overflow = false;
            nbytes[i] = 0;
        }
        if (overflow)
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor '%s': shape is too large (byte size overflows)",
                                 path, t->name);
        if (nbytes[i] > 0 && !t->data)
            return moe_set_error(ctx, MOE_EINVAL, "%s: tensor '%s': data is NULL", path, t->name);
    }
    /* Duplicate names: sort (name, index) pairs and compare neighbours. */
    if (n > 1) {
        st_name_ref *refs = malloc(n * sizeof *refs); /* [n] */
        if (!refs)
            return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
        for (size_t i = 0; i < n; i++) {
            refs[i].name = tensors[i].name;
            refs[i].index = i;
        }
        qsort(refs, n, sizeof *refs, cmp_name_ref);
        for (size_t i = 1; i < n; i++) {
            if (strcmp(refs[i - 1].name, refs[i].name) == 0) {
                size_t a = refs[i - 1].index < refs[i].index ? refs[i - 1].index : refs[i].index;
                size_t b = refs[i - 1].index < refs[i].index ? refs[i].index : refs[i - 1].index;
                moe_status st = moe_set_error(ctx, MOE_EINVAL,
                                              "%s: tensor name '%s' appears twice (tensors %zu and %zu)",
                                              path, refs[i].name, a, b);
                free(refs);
                return st;
            }
        }
        free(refs);
    }
    return MOE_OK;
}

/* Build the header text: compact JSON with "__metadata__" {"format": "pt"} first, then the
 * tensors in the given order with contiguous data_offsets, padded with spaces so that 8 + its
 * length is a multiple of 8. Returns a malloc'd string (length in *len) or NULL with an error
 * recorded. */
static char *build_header(moe_ctx *ctx, const char *path, const moe_tensor_out *tensors, size_t n,
                          const size_t *nbytes, size_t *len, moe_status *st)
{
    *st = MOE_OK;
    json_t *root = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    if (!root || !meta || json_object_set_new(root, "__metadata__", meta) != 0) {
        json_decref(root);
        *st = moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory building the header", path);
        return NULL;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const moe_tensor_out *t = &tensors[i];
        if ((uint64_t)nbytes[i] > (uint64_t)INT64_MAX - offset) {
            json_decref(root);
            *st = moe_set_error(ctx, MOE_EINVAL, "%s: tensor '%s': the data section would exceed 2^63 bytes",
                                path, t->name);
            return NULL;
        }
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->ndim; d++) {
            if (json_array_append_new(shape, json_integer((json_int_t)t->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        }
        json_t *entry = shape ? json_pack("{s:s, s:o, s:[I,I]}", "dtype", moe_dtype_name(t->dtype),
                                          "shape", shape, "data_offsets", (json_int_t)offset,
                                          (json_int_t)(offset + nbytes[i]))
                              : NULL;
        if (!entry) {
            json_decref(root);
            *st = moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory building the header", path);
            return NULL;
        }
        /* json_object_set_new fails on a key that is not valid UTF-8 (and on memory). */
        if (json_object_set_new(root, t->name, entry) != 0) {
            json_decref(root);
            *st = moe_set_error(ctx, MOE_EINVAL, "%s: tensor %zu: name is not valid UTF-8", path, i);
            return NULL;
        }
        offset += nbytes[i];
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) {
        *st = moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory building the header", path);
        return NULL;
    }
    size_t raw = strlen(text);
    size_t padded = (raw + 7) & ~(size_t)7;
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        *st = moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory building the header", path);
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = '\0';
    *len = padded;
    return out;
}

moe_status moe_safetensors_write(moe_ctx *ctx, const char *path, const moe_tensor_out *tensors,
                                 size_t n)
{
    if (!path || path[0] == '\0')
        return moe_set_error(ctx, MOE_EINVAL, "moe_safetensors_write: path is %s",
                             path ? "empty" : "NULL");
    if (!tensors && n > 0)
        return moe_set_error(ctx, MOE_EINVAL, "%s: tensors is NULL but n = %zu", path, n);

    size_t *nbytes = calloc(n ? n : 1, sizeof *nbytes); /* [n] byte size of each tensor */
    if (!nbytes)
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
    moe_status st = check_write_args(ctx, path, tensors, n, nbytes);
    if (st != MOE_OK) {
        free(nbytes);
        return st;
    }
    size_t hdr_len = 0;
    char *hdr = build_header(ctx, path, tensors, n, nbytes, &hdr_len, &st);
    if (!hdr) {
        free(nbytes);
        return st;
    }

    /* 8-byte little-endian header length, then the header, then each tensor's bytes, written
     * atomically (a temporary file beside path, renamed over it) */
    uint8_t len_bytes[8];
    for (int b = 0; b < 8; b++)
        len_bytes[b] = (uint8_t)((uint64_t)hdr_len >> (8 * b));
    const void **parts = malloc((n + 2) * sizeof *parts); /* [n + 2] the byte ranges in file order */
    size_t *lens = malloc((n + 2) * sizeof *lens);        /* [n + 2] their sizes */
    if (!parts || !lens) {
        free(parts);
        free(lens);
        free(hdr);
        free(nbytes);
        return moe_set_error(ctx, MOE_ENOMEM, "%s: out of memory", path);
    }
    parts[0] = len_bytes;
    lens[0] = sizeof len_bytes;
    parts[1] = hdr;
    lens[1] = hdr_len;
    for (size_t i = 0; i < n; i++) {
        parts[2 + i] = tensors[i].data;
        lens[2 + i] = nbytes[i];
    }
    st = moe_io_write_atomic(ctx, "", path, parts, lens, n + 2);
    if (st == MOE_OK)
        moe_log(ctx, MOE_LOG_DEBUG, "%s: wrote %zu tensors", path, n);
    free(parts);
    free(lens);
    free(hdr);
    free(nbytes);
    return st;
}

