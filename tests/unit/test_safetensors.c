/* Safetensors reader and writer: round trips, the exact on-disk layout, atomic writes, and
 * every malformed header the reader must refuse (status and message). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe.h"
#include "testutil.h"

/* Write a safetensors file by hand: the 8-byte little-endian `hdr_len`, then `header`
 * (strlen bytes, whatever hdr_len says), then `data` [data_len]. */
static void write_raw(const char *path, uint64_t hdr_len, const char *header, const void *data,
                      size_t data_len)
{
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_len;
    uint8_t *buf = malloc(total); /* [total] */
    assert_non_null(buf);
    for (int b = 0; b < 8; b++)
        buf[b] = (uint8_t)(hdr_len >> (8 * b));
    memcpy(buf + 8, header, hl);
    if (data_len)
        memcpy(buf + 8 + hl, data, data_len);
    assert_int_equal(tu_write_file(path, buf, total), 0);
    free(buf);
}

/* Same, with hdr_len = strlen(header). */
static void write_st(const char *path, const char *header, const void *data, size_t data_len)
{
    write_raw(path, strlen(header), header, data, data_len);
}

/* Open `path`, expecting failure with status `want` and a message naming the path and every
 * string of `subs`. */
static void check_open_fails(moe_ctx *ctx, const char *path, moe_status want,
                             const char *const *subs)
{
    moe_safetensors *f = (moe_safetensors *)(uintptr_t)1;
    moe_status st = moe_safetensors_open(ctx, path, &f);
    assert_null(f);
    const char *with_path[] = {path, NULL};
    tu_check_error(ctx, st, want, with_path);
    tu_check_error(ctx, st, want, subs);
}
#define expect_open_fails(ctx, path, want, ...) \
    check_open_fails((ctx), (path), (want), (const char *const[]){__VA_ARGS__, NULL})

/* Number of entries of folder `dir` whose name contains `part`. */
static int count_entries(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, part))
            n++;
    closedir(d);
    return n;
}

/* Read a whole file into a malloc'd buffer. */
static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)sz + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)sz, fp), (size_t)sz);
    fclose(fp);
    *len = (size_t)sz;
    return buf;
}

/* --------------------------------------------------------------------------------------
 * Good paths
 * ------------------------------------------------------------------------------------ */

static void test_roundtrip_dtypes(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-rt");
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);

    float f32[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f}; /* [2, 3] */
    uint16_t bf16[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};    /* [4] */
    uint16_t f16[4] = {0x3c00, 0xc000, 0x7bff, 0x8001};     /* [2, 2] */
    int64_t i64[3] = {-1, INT64_MAX, 42};                   /* [3] */
    uint8_t u8[5] = {0, 1, 2, 254, 255};                    /* [5]: odd size, unaligned after */
    int32_t i32[1] = {-123456};                             /* [] scalar */
    uint8_t f8[3] = {0x38, 0xb8, 0x7e};                     /* [3, 1] */
    double f64[2] = {3.141592653589793, -1e300};            /* [2] */
    moe_tensor_out t[] = {
        {"w.f32", MOE_DTYPE_F32, 2, {2, 3}, f32},
        {"w.bf16", MOE_DTYPE_BF16, 1, {4}, bf16},
        {"w.f16", MOE_DTYPE_F16, 2, {2, 2}, f16},
        {"w.i64", MOE_DTYPE_I64, 1, {3}, i64},
        {"w.u8", MOE_DTYPE_U8, 1, {5}, u8},
        {"empty", MOE_DTYPE_BOOL, 2, {0, 7}, NULL},
        {"scalar", MOE_DTYPE_I32, 0, {0}, i32},
        {"w.f8", MOE_DTYPE_F8_E4M3, 2, {3, 1}, f8},
        {"w.f64", MOE_DTYPE_F64, 1, {2}, f64},
    };
    const size_t n = sizeof t / sizeof t[0];
    const size_t nbytes[] = {24, 8, 8, 24, 5, 0, 4, 3, 16};
    assert_int_equal(moe_safetensors_write(ctx, path, t, n), MOE_OK);
    assert_int_equal(count_entries(dir, ".tmp."), 0);

    /* The exact layout: header length a multiple of 8, JSON, then the tensors back to back. */
    size_t flen;
    uint8_t *raw = read_all(path, &flen);
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--)
        hl = (hl << 8) | raw[b];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(raw[8], '{');
    size_t data_total = 0;
    for (size_t i = 0; i < n; i++)
        data_total += nbytes[i];
    assert_int_equal(flen, 8 + hl + data_total);
    assert_memory_equal(raw + 8 + hl, f32, sizeof f32);            /* first tensor at offset 0 */
    assert_memory_equal(raw + 8 + hl + 24, bf16, sizeof bf16);     /* then contiguous */
    assert_memory_equal(raw + flen - sizeof f64, f64, sizeof f64); /* last at the end */
    char *hdr = strndup((const char *)raw + 8, (size_t)hl);
    assert_non_null(strstr(hdr, "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"));
    assert_non_null(strstr(hdr, "\"w.f8\":{\"dtype\":\"F8_E4M3\""));
    assert_non_null(strstr(hdr, "\"scalar\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[69,73]}"));
    assert_true(strstr(hdr, "\"w.f32\"") < strstr(hdr, "\"w.bf16\"")); /* given order kept */
    free(hdr);
    free(raw);

    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_count(f), n);
    for (size_t i = 0; i < n; i++) {
        moe_tensor_info info;
        assert_int_equal(moe_safetensors_at(f, i, &info), MOE_OK);
        assert_string_equal(info.name, t[i].name);
        assert_int_equal(info.dtype, t[i].dtype);
        assert_int_equal(info.ndim, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++)
            assert_int_equal(info.shape[d], t[i].shape[d]);
        assert_int_equal(info.nbytes, nbytes[i]);
        if (nbytes[i])
            assert_memory_equal(info.data, t[i].data, nbytes[i]);

        moe_tensor_info by_name;
        assert_int_equal(moe_safetensors_get(f, t[i].name, &by_name), MOE_OK);
        assert_ptr_equal(by_name.data, info.data);
        assert_int_equal(by_name.nbytes, info.nbytes);
    }
    moe_tensor_info info;
    expect_error(ctx, moe_safetensors_get(f, "w.nope", &info), MOE_ENOTFOUND, path, "'w.nope'");
    expect_error(ctx, moe_safetensors_at(f, n, &info), MOE_ERANGE, path, "9");
    moe_safetensors_free(f);

    /* Read with an exact f32 check, not only bytes. */
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_get(f, "w.f32", &info), MOE_OK);
    float back[6];
    memcpy(back, info.data, sizeof back);
    assert_true(back[2] == 3.25f && back[5] == 1e-30f);
    moe_safetensors_free(f);
    moe_safetensors_free(NULL);
    moe_ctx_free(ctx);
}

/* A file written by Python's safetensors (bytes pasted): header with __metadata__ and
 * trailing-space padding, F32 tensors in non-header order in the data section. */
static void test_read_foreign_layout(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-foreign");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,12]},"
                      "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}   ";
    float data[3] = {1.0f, 2.0f, 3.0f};
    write_st(path, hdr, data, sizeof data);

    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_count(f), 3); /* __metadata__ is not a tensor */
    moe_tensor_info info;
    assert_int_equal(moe_safetensors_at(f, 0, &info), MOE_OK);
    assert_string_equal(info.name, "b"); /* header order, not name order */
    assert_int_equal(moe_safetensors_get(f, "a", &info), MOE_OK);
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.nbytes, 4);
    float a_val;
    memcpy(&a_val, info.data, sizeof a_val); /* the data section here is not 4-byte aligned */
    assert_true(a_val == 3.0f);
    assert_int_equal(moe_safetensors_get(f, "z", &info), MOE_OK); /* zero-byte inside others */
    assert_int_equal(info.nbytes, 0);
    assert_int_equal(moe_safetensors_get(f, "__metadata__", &info), MOE_ENOTFOUND);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
}

/* The header is parsed with its exact length: bytes right after it (here '}' and junk in
 * the data section) must not be read as JSON. */
static void test_header_exact_length(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-exact");
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    const char *hdr = "{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    write_st(path, hdr, "}}x\0", 4);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    moe_tensor_info info;
    assert_int_equal(moe_safetensors_get(f, "t", &info), MOE_OK);
    assert_memory_equal(info.data, "}}x\0", 4);
    moe_safetensors_free(f);

    /* A header length one short of the JSON cuts its closing brace: not JSON. */
    write_raw(path, strlen(hdr) - 1, hdr, "}}x\0", 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, "not valid JSON");
    moe_ctx_free(ctx);
}

static void test_write_overwrites_atomically(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-over");
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    int32_t a[2] = {1, 2}, b[3] = {7, 8, 9};
    moe_tensor_out ta = {"a", MOE_DTYPE_I32, 1, {2}, a};
    moe_tensor_out tb = {"b", MOE_DTYPE_I32, 1, {3}, b};
    assert_int_equal(moe_safetensors_write(ctx, path, &ta, 1), MOE_OK);
    assert_int_equal(moe_safetensors_write(ctx, path, &tb, 1), MOE_OK);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_count(f), 1);
    moe_tensor_info info;
    assert_int_equal(moe_safetensors_get(f, "a", &info), MOE_ENOTFOUND);
    assert_int_equal(moe_safetensors_get(f, "b", &info), MOE_OK);
    assert_memory_equal(info.data, b, sizeof b);
    moe_safetensors_free(f);
    /* Only the final file remains in the folder. */
    assert_int_equal(count_entries(dir, "w.safetensors"), 1);
    assert_int_equal(count_entries(dir, ".tmp."), 0);

    /* Zero tensors is a valid file too. */
    assert_int_equal(moe_safetensors_write(ctx, path, NULL, 0), MOE_OK);
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_count(f), 0);
    assert_int_equal(moe_safetensors_get(f, "b", &info), MOE_ENOTFOUND);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
}

static void test_write_failure_leaves_nothing(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[700];
    tu_tmpdir(dir, sizeof dir, "st-fail");
    float v[2] = {1.0f, 2.0f};
    moe_tensor_out t = {"v", MOE_DTYPE_F32, 1, {2}, v};
    struct stat sb;

    /* Folder does not exist. */
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", dir);
    expect_error(ctx, moe_safetensors_write(ctx, path, &t, 1), MOE_EIO, path);
    assert_int_not_equal(stat(path, &sb), 0);

    /* The path is a folder: refused before anything is written, the folder stays. */
    snprintf(path, sizeof path, "%s/adir", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    expect_error(ctx, moe_safetensors_write(ctx, path, &t, 1), MOE_EIO, path, "is a directory, not a regular file");
    assert_int_equal(stat(path, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(count_entries(dir, ".tmp."), 0);
    assert_int_equal(count_entries(dir, "adir"), 1);

    /* Argument errors create nothing either. */
    snprintf(path, sizeof path, "%s/args.safetensors", dir);
    moe_tensor_out bad = t;
    bad.name = NULL;
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, path, "name is NULL");
    bad = t;
    bad.dtype = (moe_dtype)99;
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, "'v'", "dtype 99");
    bad = t;
    bad.ndim = MOE_MAX_DIMS + 1;
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, "'v'", "ndim 9");
    bad = t;
    bad.shape[0] = -2;
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, "'v'", "shape[0] = -2");
    bad = t;
    bad.data = NULL;
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, "'v'", "data is NULL");
    bad = t;
    bad.name = "__metadata__";
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, "reserved");
    bad = t;
    bad.ndim = 3;
    bad.shape[0] = bad.shape[1] = bad.shape[2] = INT64_C(1) << 30;
    expect_error(ctx, moe_safetensors_write(ctx, path, &bad, 1), MOE_EINVAL, "'v'", "overflow");
    moe_tensor_out dup[3] = {t, {"w", MOE_DTYPE_F32, 1, {1}, v}, t};
    expect_error(ctx, moe_safetensors_write(ctx, path, dup, 3), MOE_EINVAL, "'v'", "twice",
                 "tensors 0 and 2");
    expect_error(ctx, moe_safetensors_write(ctx, NULL, &t, 1), MOE_EINVAL, "path");
    expect_error(ctx, moe_safetensors_write(ctx, path, NULL, 1), MOE_EINVAL, "NULL");
    assert_int_not_equal(stat(path, &sb), 0);
    assert_int_equal(count_entries(dir, ".tmp."), 0);
    moe_ctx_free(ctx);
}

/* 20000 tensors: every one found by name, quickly (the lookup is a binary search). */
static void test_many_tensors_lookup(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-many");
    snprintf(path, sizeof path, "%s/many.safetensors", dir);
    enum { N = 20000 };
    moe_tensor_out *t = calloc(N, sizeof *t);  /* [N] */
    char (*names)[64] = calloc(N, sizeof *names); /* [N][64] */
    int32_t *vals = calloc(N, sizeof *vals);   /* [N] one I32 per tensor */
    assert_true(t && names && vals);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "model.layers.%d.mlp.experts.%d.up_proj.weight", i / 128,
                 i % 128);
        vals[i] = i * 3 + 1;
        t[i].name = names[i];
        t[i].dtype = MOE_DTYPE_I32;
        t[i].ndim = 1;
        t[i].shape[0] = 1;
        t[i].data = &vals[i];
    }
    assert_int_equal(moe_safetensors_write(ctx, path, t, N), MOE_OK);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_count(f), N);
    for (int rep = 0; rep < 5; rep++) {
        for (int i = N - 1; i >= 0; i--) {
            moe_tensor_info info;
            assert_int_equal(moe_safetensors_get(f, names[i], &info), MOE_OK);
            int32_t v;
            memcpy(&v, info.data, sizeof v);
            if (v != i * 3 + 1)
                fail_msg("tensor %s holds %d, want %d", names[i], v, i * 3 + 1);
        }
    }
    moe_safetensors_free(f);
    free(t);
    free(names);
    free(vals);
    moe_ctx_free(ctx);
}

/* --------------------------------------------------------------------------------------
 * Malformed files
 * ------------------------------------------------------------------------------------ */

static void test_bad_sizes(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-size");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);

    /* Shorter than the 8-byte length. */
    assert_int_equal(tu_write_file(path, "\x02\0\0\0", 4), 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "4 bytes", "8-byte");
    assert_int_equal(tu_write_file(path, "", 0), 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "0 bytes");

    /* Header length beyond the file. */
    write_raw(path, 1000, "{}", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "header length 1000", "2 bytes");
    write_raw(path, UINT64_MAX, "{}", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "header length 18446744073709551615");
    write_raw(path, 0, "{}", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "header length is 0");

    /* Not there / not a file. */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/nope.safetensors", dir);
    expect_open_fails(ctx, missing, MOE_ENOTFOUND, "cannot open");
    expect_open_fails(ctx, dir, MOE_EIO, "not a regular file");
    moe_ctx_free(ctx);
}

/* Issue 17: a FIFO is refused, not opened for reading (which would wait for a writer
 * forever: alarm() fails the test if that regresses), a directory says so, and a symlink loop
 * reports ELOOP. */
static void test_not_regular_files(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-kind");
    snprintf(path, sizeof path, "%s/fifo.safetensors", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(30);
    expect_open_fails(ctx, path, MOE_EIO, "is a FIFO", "not a regular file");
    alarm(0);
    assert_int_equal(unlink(path), 0);
    expect_open_fails(ctx, dir, MOE_EIO, "is a directory", "not a regular file");
    snprintf(path, sizeof path, "%s/loop.safetensors", dir);
    assert_int_equal(symlink("loop.safetensors", path), 0);
    expect_open_fails(ctx, path, MOE_EIO, "cannot open", strerror(ELOOP));
    assert_int_equal(unlink(path), 0);
    tu_rm_tree(dir);
    moe_ctx_free(ctx);
}

static void test_bad_json(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-json");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);

    write_st(path, "{\"a\": {\"dtype\": \"F32\",", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "header is not valid JSON");
    write_st(path, "not json", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "header is not valid JSON");
    write_st(path, "[1, 2]  ", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "must be a JSON object", "array");
    /* Duplicate tensor names would make lookups ambiguous. */
    write_st(path,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
             "xy", 2);
    expect_open_fails(ctx, path, MOE_EFORMAT, "not valid JSON", "duplicate");
    write_st(path, "{\"__metadata__\":{\"format\":1}}", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "__metadata__", "'format'");
    write_st(path, "{\"__metadata__\":[]}", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "__metadata__");
    write_st(path, "{\"t\":[1]}", NULL, 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "'t'", "must be an object");
    moe_ctx_free(ctx);
}

static void test_bad_tensor_fields(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-fields");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *name = "model.layers.0.mlp.gate.weight";
    uint8_t data[256] = {0};
    char hdr[512];

    /* Unknown dtype: EDTYPE naming tensor and dtype. */
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"Q4_K\",\"shape\":[4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EDTYPE, name, "'Q4_K'");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EDTYPE, name, "'F8_E4M3FNUZ'");
    /* The FN spelling is accepted as F8_E4M3. */
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F8_E4M3FN\",\"shape\":[4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    moe_tensor_info info;
    assert_int_equal(moe_safetensors_get(f, name, &info), MOE_OK);
    assert_int_equal(info.dtype, MOE_DTYPE_F8_E4M3);
    moe_safetensors_free(f);

    /* Missing / mistyped fields. */
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"shape\":[4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "'dtype' is missing");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "'dtype' must be a string");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "'shape' is missing");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[2,-2],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "shape[1]", "non-negative");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[2.0,2],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "shape[0]");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":4,\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "'shape' must be an array");
    snprintf(hdr, sizeof hdr,
             "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "9 dimensions");
    snprintf(hdr, sizeof hdr,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "too large");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[4]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "'data_offsets' is missing");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "data_offsets must be [begin, end]");
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "data_offsets must be [begin, end]");

    /* data_offsets begin after end. */
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", name);
    write_st(path, hdr, data, 4);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "[4, 0] begin after end");

    /* data_offsets out of range: the message of the spec, byte for byte. */
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[4,32],\"data_offsets\":[0,512]}}",
             name);
    write_st(path, hdr, data, 256);
    expect_open_fails(ctx, path, MOE_EFORMAT,
                      "model.safetensors: tensor 'model.layers.0.mlp.gate.weight': data_offsets [0, "
                      "512] end beyond data section of 256 bytes");

    /* Byte count disagreeing with dtype x shape. */
    snprintf(hdr, sizeof hdr, "{\"%s\":{\"dtype\":\"BF16\",\"shape\":[4,4],\"data_offsets\":[0,16]}}",
             name);
    write_st(path, hdr, data, 64);
    expect_open_fails(ctx, path, MOE_EFORMAT, name, "hold 16 bytes", "BF16", "[4, 4]", "needs 32");
    moe_ctx_free(ctx);
}

static void test_overlap_and_truncation(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-overlap");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint8_t data[64] = {0};

    /* Overlapping ranges, listed in reverse order in the header: both tensors named. */
    write_st(path,
             "{\"second\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[12,28]},"
             "\"first\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
             data, 32);
    expect_open_fails(ctx, path, MOE_EFORMAT, "overlap", "'first'", "'second'", "[12, 28]", "[0, 16]");
    /* Same range twice. */
    write_st(path,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]}}",
             data, 16);
    expect_open_fails(ctx, path, MOE_EFORMAT, "overlap", "'a'", "'b'");
    /* Touching ranges and an empty tensor between them are fine. */
    write_st(path,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]}}",
             data, 16);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    assert_int_equal(moe_safetensors_count(f), 3);
    moe_safetensors_free(f);

    /* Unindexed bytes: a gap before a tensor, or bytes after the last one. */
    write_st(path,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[12,16]}}",
             data, 16);
    expect_open_fails(ctx, path, MOE_EFORMAT, "'b'", "4 unindexed bytes", "fully indexed");
    write_st(path,
             "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
             data, 11);
    expect_open_fails(ctx, path, MOE_EFORMAT, "3 bytes after the last tensor", "fully indexed");

    /* Truncated file: a good file cut short loses its last tensor's end. */
    float w[2][8]; /* two tensors [8] f32 */
    tu_fill_uniform(&w[0][0], 16, 7, -1.0f, 1.0f);
    moe_tensor_out t[2] = {{"x.weight", MOE_DTYPE_F32, 1, {8}, w[0]},
                           {"y.weight", MOE_DTYPE_F32, 1, {8}, w[1]}};
    assert_int_equal(moe_safetensors_write(ctx, path, t, 2), MOE_OK);
    size_t len;
    uint8_t *raw = read_all(path, &len);
    assert_int_equal(tu_write_file(path, raw, len - 3), 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "'y.weight'", "data_offsets [32, 64]",
                      "data section of 61 bytes");
    /* Cut inside the header. */
    assert_int_equal(tu_write_file(path, raw, 20), 0);
    expect_open_fails(ctx, path, MOE_EFORMAT, "header length", "beyond the end of the file");
    free(raw);
    moe_ctx_free(ctx);
}

/* ctx may be NULL: errors are still returned. */
static void test_null_ctx(void **state)
{
    (void)state;
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "st-null");
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_st(path, "nope", NULL, 0);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(NULL, path, &f), MOE_EFORMAT);
    assert_null(f);
    assert_int_equal(moe_safetensors_open(NULL, path, NULL), MOE_EINVAL);
    uint8_t b = 5;
    moe_tensor_out t = {"b", MOE_DTYPE_U8, 1, {1}, &b};
    assert_int_equal(moe_safetensors_write(NULL, path, &t, 1), MOE_OK);
    assert_int_equal(moe_safetensors_open(NULL, path, &f), MOE_OK);
    moe_tensor_info info;
    assert_int_equal(moe_safetensors_get(f, "c", &info), MOE_ENOTFOUND);
    assert_int_equal(moe_safetensors_get(f, "b", &info), MOE_OK);
    assert_int_equal(*(const uint8_t *)info.data, 5);
    assert_int_equal(moe_safetensors_count(NULL), 0);
    moe_safetensors_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_dtypes),
        cmocka_unit_test(test_read_foreign_layout),
        cmocka_unit_test(test_header_exact_length),
        cmocka_unit_test(test_write_overwrites_atomically),
        cmocka_unit_test(test_write_failure_leaves_nothing),
        cmocka_unit_test(test_many_tensors_lookup),
        cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_not_regular_files),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_bad_tensor_fields),
        cmocka_unit_test(test_overlap_and_truncation),
        cmocka_unit_test(test_null_ctx),
    };
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
