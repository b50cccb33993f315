/* What every libFuzzer target of tests/fuzz shares: a quiet one-thread ctx, a private folder
 * on tmpfs (the readers take paths) removed at exit, file writing, and the checks every
 * failure must pass (a message naming what is wrong). Header-only: each target is one
 * program. */
#ifndef MOE_FUZZ_UTIL_H
#define MOE_FUZZ_UTIL_H

#include "moe.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The repository's tests/fixtures (set by tests/fuzz/CMakeLists.txt). */
#ifndef MOE_FUZZ_FIXTURES
#error "MOE_FUZZ_FIXTURES must name tests/fixtures"
#endif

static inline void fz_quiet(moe_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)msg;
    (void)user;
}

/* A ctx with one thread and no log output (a fuzz run would print millions of lines). */
static inline moe_ctx *fz_ctx(void)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 1;
    o.log_level = MOE_LOG_ERROR;
    o.log_fn = fz_quiet;
    moe_ctx *ctx = NULL;
    char err[512] = "";
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK) {
        fprintf(stderr, "fuzz: moe_ctx_create: %s\n", err);
        abort();
    }
    return ctx;
}

static char fz_dir_path[PATH_MAX];

static inline void fz_rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[PATH_MAX + 256];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (unlink(p) != 0)
            fz_rm_dir(p); /* a folder (fuzz_config_plan's per-family folders) */
    }
    closedir(d);
    rmdir(dir);
}

static inline void fz_cleanup(void)
{
    if (fz_dir_path[0])
        fz_rm_dir(fz_dir_path);
}

/* This process's folder: /dev/shm/moe-fuzz-XXXXXX (tmpfs: no disk writes per input), else
 * under $TMPDIR or /tmp. Created once, removed at exit. */
static inline const char *fz_dir(void)
{
    if (fz_dir_path[0])
        return fz_dir_path;
    const char *bases[3] = {"/dev/shm", getenv("TMPDIR"), "/tmp"};
    for (int i = 0; i < 3; i++) {
        if (!bases[i] || !bases[i][0])
            continue;
        snprintf(fz_dir_path, sizeof fz_dir_path, "%s/moe-fuzz-XXXXXX", bases[i]);
        if (mkdtemp(fz_dir_path)) {
            atexit(fz_cleanup);
            return fz_dir_path;
        }
    }
    perror("fuzz: mkdtemp");
    abort();
}

/* dir/name into out [PATH_MAX]. */
static inline const char *fz_join(char *out, const char *dir, const char *name)
{
    snprintf(out, PATH_MAX, "%s/%s", dir, name);
    return out;
}

/* Write n bytes to path (replacing it); aborts on a write error (the folder is ours). */
static inline void fz_write(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            perror(path);
            abort();
        }
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* Read a whole fixture file (malloc'd, *n bytes); aborts when missing. */
static inline unsigned char *fz_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        abort();
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len)
        abort();
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Every failure must leave a message (the standard: bad input gets a clear error naming what
 * is wrong): a failing status with an empty moe_ctx_last_error is a finding. */
static inline void fz_check_error(const moe_ctx *ctx, moe_status st, const char *what)
{
    if (st == MOE_OK)
        return;
    const char *m = moe_ctx_last_error(ctx);
    if (!m || !m[0]) {
        fprintf(stderr, "fuzz: %s failed with %s and no message\n", what, moe_status_name(st));
        abort();
    }
}

/* Touch every byte of a tensor's data (a pointer outside the mapping faults here). */
static inline unsigned fz_touch(const void *data, size_t n)
{
    const volatile unsigned char *p = data;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

#endif
