/* libFuzzer target: the safetensors reader (moe_safetensors_open, _at, _get) on any bytes.
 * The input is the whole file. An open that succeeds must give tensors whose shape, dtype and
 * byte count agree and whose data lies in the file (every byte is read); one that fails must
 * name the file in its message. What opens is written back with moe_safetensors_write and
 * must read back the same: names in order, dtypes, shapes, bytes. */
#include "fuzz_util.h"

#include <stdint.h>

static moe_ctx *ctx;
static char path[PATH_MAX], copy_path[PATH_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ctx = fz_ctx();
    fz_join(path, fz_dir(), "fuzz.safetensors");
    fz_join(copy_path, fz_dir(), "copy.safetensors");
    return 0;
}

/* Write f's n tensors to copy_path and read them back: the same tensors. */
static void round_trip(moe_safetensors *f, size_t n)
{
    moe_tensor_out *to = calloc(n ? n : 1, sizeof *to); /* [n] */
    if (!to)
        abort();
    for (size_t i = 0; i < n; i++) {
        moe_tensor_info ti;
        moe_safetensors_at(f, i, &ti);
        to[i].name = ti.name;
        to[i].dtype = ti.dtype;
        to[i].ndim = ti.ndim;
        memcpy(to[i].shape, ti.shape, sizeof ti.shape);
        to[i].data = ti.data;
    }
    moe_status st = moe_safetensors_write(ctx, copy_path, to, n);
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_safetensors_write");
        free(to);
        return;
    }
    moe_safetensors *g = NULL;
    if (moe_safetensors_open(ctx, copy_path, &g) != MOE_OK) {
        fprintf(stderr, "fuzz: the written copy does not read back: %s\n", moe_ctx_last_error(ctx));
        abort();
    }
    if (moe_safetensors_count(g) != n)
        abort();
    for (size_t i = 0; i < n; i++) {
        moe_tensor_info a, b;
        moe_safetensors_at(f, i, &a);
        moe_safetensors_at(g, i, &b);
        if (strcmp(a.name, b.name) != 0 || a.dtype != b.dtype || a.ndim != b.ndim ||
            memcmp(a.shape, b.shape, sizeof a.shape[0] * (size_t)a.ndim) != 0 || a.nbytes != b.nbytes ||
            (a.nbytes && memcmp(a.data, b.data, a.nbytes) != 0))
            abort();
    }
    moe_safetensors_free(g);
    free(to);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_write(path, data, size);
    moe_safetensors *f = NULL;
    moe_status st = moe_safetensors_open(ctx, path, &f);
    if (st != MOE_OK) {
        fz_check_error(ctx, st, "moe_safetensors_open");
        if (!strstr(moe_ctx_last_error(ctx), path)) {
            fprintf(stderr, "fuzz: message does not name the file: %s\n", moe_ctx_last_error(ctx));
            abort();
        }
        if (f)
            abort(); /* nothing handed out on failure */
        return 0;
    }
    size_t n = moe_safetensors_count(f);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        moe_tensor_info ti, tg;
        if (moe_safetensors_at(f, i, &ti) != MOE_OK)
            abort();
        if (ti.ndim < 0 || ti.ndim > MOE_MAX_DIMS)
            abort();
        uint64_t numel = 1;
        for (int d = 0; d < ti.ndim; d++) {
            if (ti.shape[d] < 0)
                abort();
            numel *= (uint64_t)ti.shape[d];
        }
        if (numel * moe_dtype_size(ti.dtype) != ti.nbytes)
            abort();
        total += ti.nbytes;
        if (total > size)
            abort(); /* tensors do not overlap, so together they fit in the file */
        fz_touch(ti.data, ti.nbytes);
        if (moe_safetensors_get(f, ti.name, &tg) != MOE_OK || tg.data != ti.data || tg.nbytes != ti.nbytes)
            abort();
    }
    moe_tensor_info tx;
    if (moe_safetensors_at(f, n, &tx) != MOE_ERANGE)
        abort();
    st = moe_safetensors_get(f, "fuzz: surely absent", &tx);
    if (st != MOE_ENOTFOUND && !(st == MOE_OK && n > 0))
        abort();
    round_trip(f, n);
    moe_safetensors_free(f);
    return 0;
}
