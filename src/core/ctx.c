/* The context: options resolved once (API value, else environment, else default), the
 * kernel table chosen from CPUID/XCR0, logging and the last error. */
#include "core/kernels.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

extern char **environ;

/* Every MOE_* variable this version reads. A MOE_* variable not listed is reported with the
 * closest known name, so a typo is never silently ignored. */
static const char *const known_vars[] = {
    "MOE_NUM_THREADS", "MOE_LOG_LEVEL", "MOE_ISA", "MOE_CHUNK_SIZE",
};
#define N_KNOWN (sizeof known_vars / sizeof known_vars[0])

#define MOE_DEFAULT_CHUNK 1024

void moe_options_init(moe_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->num_threads = 0;
    opts->log_level = -1;
    opts->log_fn = NULL;
    opts->log_user = NULL;
    opts->isa = NULL;
    opts->chunk_size = 0;
}

/* Levenshtein distance, for "did you mean". */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 64;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = (a[i - 1] == b[j - 1]) ? 0 : 1;
            size_t best = diag + cost;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static void warn_unknown_vars(const moe_ctx *ctx)
{
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "MOE_", 4) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        char name[128];
        if (len >= sizeof name)
            len = sizeof name - 1;
        memcpy(name, *e, len);
        name[len] = '\0';
        int known = 0;
        const char *closest = known_vars[0];
        size_t best = (size_t)-1;
        for (size_t i = 0; i < N_KNOWN; i++) {
            if (strcmp(name, known_vars[i]) == 0)
                known = 1;
            size_t d = edit_distance(name, known_vars[i]);
            if (d < best) {
                best = d;
                closest = known_vars[i];
            }
        }
        if (!known)
            moe_log(ctx, MOE_LOG_WARN, "unknown environment variable %s is ignored; did you mean %s?",
                    name, closest);
    }
}

/* Parse a whole decimal integer in [lo, hi]; false on junk, overflow or out of range. */
static int parse_int(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s)
        return 0;
    errno = 0;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

static moe_status fail(char *msg, size_t len, moe_status st, const char *text)
{
    if (msg && len)
        snprintf(msg, len, "%s", text);
    return st;
}

moe_status moe_ctx_create(const moe_options *opts, moe_ctx **out, char *out_err_msg,
                          size_t out_err_len)
{
    char m[MOE_ERRMSG_LEN];
    if (out_err_msg && out_err_len)
        out_err_msg[0] = '\0';
    if (!out)
        return fail(out_err_msg, out_err_len, MOE_EINVAL, "moe_ctx_create: out is NULL");
    *out = NULL;
    moe_options o;
    if (opts)
        o = *opts;
    else
        moe_options_init(&o);

    /* MOE_LOG_LEVEL first, so later warnings obey it. */
    moe_log_level level = MOE_LOG_WARN;
    if (o.log_level >= 0) {
        if (o.log_level > MOE_LOG_DEBUG)
            return fail(out_err_msg, out_err_len, MOE_EINVAL,
                        "moe_options.log_level: must be 0..3 (error, warn, info, debug)");
        level = (moe_log_level)o.log_level;
    } else {
        const char *v = getenv("MOE_LOG_LEVEL");
        if (v) {
            static const char *const names[] = {"error", "warn", "info", "debug"};
            int found = -1;
            for (int i = 0; i < 4; i++)
                if (strcmp(v, names[i]) == 0)
                    found = i;
            if (found < 0) {
                snprintf(m, sizeof m, "MOE_LOG_LEVEL=%s: accepted values are error, warn, info, debug", v);
                return fail(out_err_msg, out_err_len, MOE_EINVAL, m);
            }
            level = (moe_log_level)found;
        }
    }

    /* Threads: API, else MOE_NUM_THREADS, else OMP_NUM_THREADS (OpenMP's own default), else cores. */
    int threads = 0;
    if (o.num_threads < 0)
        return fail(out_err_msg, out_err_len, MOE_EINVAL, "moe_options.num_threads: must be >= 1 (0 = unset)");
    if (o.num_threads > 0) {
        threads = o.num_threads;
    } else {
        const char *v = getenv("MOE_NUM_THREADS");
        if (v) {
            long long t;
            if (!parse_int(v, 1, 4096, &t)) {
                snprintf(m, sizeof m, "MOE_NUM_THREADS=%s: accepted values are integers 1..4096", v);
                return fail(out_err_msg, out_err_len, MOE_EINVAL, m);
            }
            threads = (int)t;
        } else {
            threads = omp_get_max_threads();
            if (threads < 1)
                threads = 1;
        }
    }

    /* Kernel table. */
    const char *isa = o.isa;
    const char *isa_src = "moe_options.isa";
    if (!isa) {
        isa = getenv("MOE_ISA");
        isa_src = "MOE_ISA";
    }
    if (!isa)
        isa = "auto";
    const moe_kernels *k = NULL;
    if (strcmp(isa, "auto") == 0) {
        if (moe_cpu_has_avx512())
            k = &moe_kernels_avx512;
        else if (moe_cpu_has_avx2())
            k = &moe_kernels_avx2;
        else
            k = &moe_kernels_ref;
    } else if (strcmp(isa, "ref") == 0) {
        k = &moe_kernels_ref;
    } else if (strcmp(isa, "avx2") == 0) {
        if (!moe_cpu_has_avx2()) {
            snprintf(m, sizeof m, "%s=avx2: this CPU or OS does not support AVX2+FMA+F16C", isa_src);
            return fail(out_err_msg, out_err_len, MOE_EUNSUPPORTED, m);
        }
        k = &moe_kernels_avx2;
    } else if (strcmp(isa, "avx512") == 0) {
        if (!moe_cpu_has_avx512()) {
            snprintf(m, sizeof m, "%s=avx512: this CPU or OS does not support AVX-512 F/BW/VL/DQ", isa_src);
            return fail(out_err_msg, out_err_len, MOE_EUNSUPPORTED, m);
        }
        k = &moe_kernels_avx512;
    } else {
        snprintf(m, sizeof m, "%s=%s: accepted values are auto, ref, avx2, avx512", isa_src, isa);
        return fail(out_err_msg, out_err_len, MOE_EINVAL, m);
    }

    /* Chunk size. */
    int64_t chunk = MOE_DEFAULT_CHUNK;
    if (o.chunk_size < 0)
        return fail(out_err_msg, out_err_len, MOE_EINVAL, "moe_options.chunk_size: must be >= 1 (0 = unset)");
    if (o.chunk_size > 0) {
        chunk = o.chunk_size;
    } else {
        const char *v = getenv("MOE_CHUNK_SIZE");
        if (v) {
            long long c;
            if (!parse_int(v, 1, (long long)1 << 40, &c)) {
                snprintf(m, sizeof m, "MOE_CHUNK_SIZE=%s: accepted values are integers >= 1 (tokens)", v);
                return fail(out_err_msg, out_err_len, MOE_EINVAL, m);
            }
            chunk = c;
        }
    }

    moe_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return fail(out_err_msg, out_err_len, MOE_ENOMEM, "moe_ctx_create: out of memory");
    ctx->num_threads = threads;
    ctx->log_level = level;
    ctx->log_fn = o.log_fn;
    ctx->log_user = o.log_user;
    ctx->chunk_size = chunk;
    ctx->kernels = k;
    warn_unknown_vars(ctx);
    moe_log(ctx, MOE_LOG_INFO, "kernel table %s (%s=%s), %d threads, chunk %lld tokens", k->name,
            isa_src, isa, threads, (long long)chunk);
    *out = ctx;
    return MOE_OK;
}

void moe_ctx_free(moe_ctx *ctx)
{
    free(ctx);
}

const char *moe_ctx_last_error(const moe_ctx *ctx)
{
    return ctx ? ctx->last_error : "moe_ctx_last_error: ctx is NULL";
}

int moe_ctx_num_threads(const moe_ctx *ctx)
{
    return ctx ? ctx->num_threads : 0;
}

const char *moe_ctx_isa(const moe_ctx *ctx)
{
    return ctx ? ctx->kernels->name : "?";
}
