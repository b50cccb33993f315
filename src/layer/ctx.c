/* The context: knobs resolved once (API value, else environment, else default; see
 * core/knobs.c), the kernel table chosen from the registry (src/gemm/registry.c: CPUID and
 * XCR0 through core/cpu.c), logging and the last error. The ISA knob's accepted values are
 * "auto" and the registry's rows, supplied here to core's knob table. */
#include "core/knobs.h"
#include "gemm/kernels.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

static moe_status fail(char *msg, size_t len, moe_status st, const char *text)
{
    if (msg && len) {
        snprintf(msg, len, "%s", text);
        moe_escape_controls(msg, len);
    }
    return st;
}

/* "auto" then every registry row, and the same as one line of text. */
static const char *isa_names[MOE_ISA_MAX_ROWS + 2]; /* "auto", the rows, NULL */
static char isa_accepted[512];
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static void isa_values_build(void)
{
    size_t n = 0, used = 0;
    isa_names[n++] = "auto";
    used += (size_t)snprintf(isa_accepted, sizeof isa_accepted, "auto");
    for (size_t i = 0; i < moe_isa_rows(); i++) {
        isa_names[n++] = moe_isa_row_at(i)->name;
        if (used < sizeof isa_accepted)
            used += (size_t)snprintf(isa_accepted + used, sizeof isa_accepted - used, ", %s", moe_isa_row_at(i)->name);
    }
    isa_names[n] = NULL;
}

static const moe_knob_isa *isa_values(void)
{
    static const moe_knob_isa v = {isa_names, isa_accepted};
    pthread_once(&isa_once, isa_values_build);
    return &v;
}

moe_status moe_knob_describe(const moe_options *opts, size_t i, moe_knob_info *out)
{
    if (!out || i >= MOE_KNOB__COUNT)
        return MOE_ERANGE;
    long long num[MOE_KNOB__COUNT];
    moe_knob_info info[MOE_KNOB__COUNT];
    int ok = 1;
    for (int k = 0; k < MOE_KNOB__COUNT; k++)
        ok &= moe_knob_resolve(opts, (moe_knob)k, isa_values(), &info[k], &num[k]);
    if (ok) /* inertness is judged only on a valid configuration */
        moe_knob_inert(info, num, (moe_knob)i, MOE_INERT_TP_NOTE, info[i].inert, sizeof info[i].inert);
    *out = info[i];
    return MOE_OK;
}

moe_status moe_ctx_create(const moe_options *opts, moe_ctx **out, char *out_err_msg,
                          size_t out_err_len)
{
    if (out_err_msg && out_err_len)
        out_err_msg[0] = '\0';
    if (!out)
        return fail(out_err_msg, out_err_len, MOE_EINVAL, "moe_ctx_create: out is NULL");
    *out = NULL;

    /* Resolve and validate every knob before creating anything. */
    long long num[MOE_KNOB__COUNT];
    moe_knob_info info[MOE_KNOB__COUNT];
    for (int k = 0; k < MOE_KNOB__COUNT; k++) {
        if (!moe_knob_resolve(opts, (moe_knob)k, isa_values(), &info[k], &num[k]))
            return fail(out_err_msg, out_err_len, MOE_EINVAL, info[k].error);
    }

    /* The kernel table: MOE_ISA = auto (the registry's best runnable row) or a row by name,
     * which must be runnable here. */
    const char *isa_where = info[MOE_KNOB_ISA].source == MOE_KNOB_API ? "moe_options.isa" : "MOE_ISA";
    const size_t row = num[MOE_KNOB_ISA] == MOE_ISA_AUTO ? moe_isa_best() : (size_t)(num[MOE_KNOB_ISA] - 1);
    const moe_kernels *kern = moe_isa_kernels(row);
    if (!kern) {
        char m[MOE_ERRMSG_LEN];
        snprintf(m, sizeof m, "%s=%s: this CPU or OS does not support %s", isa_where, moe_isa_row_at(row)->name,
                 moe_isa_row_at(row)->requires);
        return fail(out_err_msg, out_err_len, MOE_EUNSUPPORTED, m);
    }

    moe_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return fail(out_err_msg, out_err_len, MOE_ENOMEM, "moe_ctx_create: out of memory");
    ctx->num_threads = (int)num[MOE_KNOB_NUM_THREADS];
    ctx->chunk_size = num[MOE_KNOB_CHUNK_SIZE];
    ctx->permute = (int)num[MOE_KNOB_PERMUTE];
    ctx->onehot_threshold = num[MOE_KNOB_ONEHOT_THRESHOLD];
    ctx->topk = (int)num[MOE_KNOB_TOPK];
    ctx->lowtok_threshold = num[MOE_KNOB_LOWTOK_THRESHOLD];
    ctx->small_allreduce = num[MOE_KNOB_SMALL_ALLREDUCE];
    ctx->tp_reduce = (int)num[MOE_KNOB_TP_REDUCE];
    snprintf(ctx->tuning_dir, sizeof ctx->tuning_dir, "%s", info[MOE_KNOB_TUNING_DIR].value);
    for (int k = 0; k < MOE_KNOB__COUNT; k++)
        if (info[k].source != MOE_KNOB_DEFAULT)
            ctx->knob_explicit |= 1u << k;
    ctx->log_level = (moe_log_level)num[MOE_KNOB_LOG_LEVEL];
    ctx->log_fn = opts ? opts->log_fn : NULL;
    ctx->log_user = opts ? opts->log_user : NULL;
    ctx->pack_progress_fn = opts ? opts->pack_progress_fn : NULL;
    ctx->pack_progress_user = opts ? opts->pack_progress_user : NULL;
    ctx->kernels = kern;
    ctx->generation = moe_ctx_generation_next();

    /* Canonical text: every knob but the logging one, in table order, with the resolved ISA. */
    size_t used = 0;
    for (int k = 0; k < MOE_KNOB__COUNT; k++) {
        if (k == MOE_KNOB_LOG_LEVEL)
            continue;
        const char *v = k == MOE_KNOB_ISA ? kern->name : info[k].value;
        int n = snprintf(ctx->options_text + used, sizeof ctx->options_text - used, "%s=%s;", info[k].field, v);
        if (n > 0 && (size_t)n < sizeof ctx->options_text - used)
            used += (size_t)n;
    }
    ctx->options_hash = XXH64(ctx->options_text, strlen(ctx->options_text), 0);

    /* A typo must never be silently ignored. */
    const char *name, *suggestion;
    size_t len;
    for (size_t i = 0; moe_env_unknown(i, &name, &len, &suggestion); i++)
        if (suggestion)
            moe_log(ctx, MOE_LOG_WARN, "unknown environment variable %.*s is ignored; did you mean %s?", (int)len,
                    name, suggestion);
        else
            moe_log(ctx, MOE_LOG_WARN, "unknown environment variable %.*s is ignored ('moe env' lists the known ones)",
                    (int)len, name);
    /* Idle knobs (core/knobs.c moe_knob_inert): the knob-vs-knob cases now, the TP ones when
     * a plan without TP is created. */
    for (int k = 0; k < MOE_KNOB__COUNT; k++) {
        char why[224], wb[96];
        const char *where = moe_knob_where(&info[k], wb, sizeof wb);
        if (moe_knob_inert(info, num, (moe_knob)k, MOE_INERT_TP_UNKNOWN, why, sizeof why)) {
            moe_log(ctx, MOE_LOG_WARN, "%s=%s has no effect: it %s", where, info[k].value, why);
        } else if (k == MOE_KNOB_SMALL_ALLREDUCE || k == MOE_KNOB_TP_REDUCE) {
            char *msg = ctx->tp_idle[k == MOE_KNOB_TP_REDUCE];
            if (moe_knob_inert(info, num, (moe_knob)k, MOE_INERT_NO_TP, why, sizeof why))
                snprintf(msg, sizeof ctx->tp_idle[0], "%s=%s has no effect: it %s", where, info[k].value, why);
        }
    }
    for (int k = 0; k < MOE_KNOB__COUNT; k++)
        moe_log(ctx, MOE_LOG_DEBUG, "knob %s = %s (%s)", info[k].env, info[k].value,
                info[k].source == MOE_KNOB_API ? "api" : info[k].source == MOE_KNOB_ENV ? "environment" : "default");
    moe_log(ctx, MOE_LOG_INFO, "kernel table %s (isa=%s), %d threads, chunk %lld tokens, options hash %016llx",
            kern->name, info[MOE_KNOB_ISA].value, ctx->num_threads, (long long)ctx->chunk_size,
            (unsigned long long)ctx->options_hash);
    const moe_cpu_features *cf = moe_cpu_features_get();
    moe_log(ctx, MOE_LOG_DEBUG, "cpu %s: %s", cf->vendor, moe_cpu_features_text());
    *out = ctx;
    return MOE_OK;
}

void moe_ctx_free(moe_ctx *ctx)
{
    free(ctx);
}

const char *moe_ctx_last_error(const moe_ctx *ctx)
{
    return ctx ? moe_error_of_thread(ctx) : "moe_ctx_last_error: ctx is NULL";
}

int moe_ctx_num_threads(const moe_ctx *ctx)
{
    return ctx ? ctx->num_threads : 0;
}

const char *moe_ctx_options_text(const moe_ctx *ctx)
{
    return ctx ? ctx->options_text : "";
}

uint64_t moe_ctx_options_hash(const moe_ctx *ctx)
{
    return ctx ? ctx->options_hash : 0;
}

const char *moe_ctx_isa(const moe_ctx *ctx)
{
    return ctx ? ctx->kernels->name : "?";
}

size_t moe_isa_count(void)
{
    return moe_isa_rows();
}

moe_status moe_isa_describe(size_t i, moe_isa_info *out)
{
    if (!out)
        return MOE_EINVAL;
    memset(out, 0, sizeof *out);
    const moe_isa_row *r = moe_isa_row_at(i);
    if (!r)
        return MOE_ERANGE;
    out->name = r->name;
    out->requires = r->requires;
    const moe_kernels *k = moe_isa_kernels(i);
    out->runnable = k != NULL;
    static const struct {
        unsigned cap;
        const char *name;
    } caps[] = {{MOE_CAP_FMA, "fma"},   {MOE_CAP_F16C, "f16c"},         {MOE_CAP_AVX512, "avx512"},
                {MOE_CAP_VNNI, "vnni"}, {MOE_CAP_AVX512_BF16, "avx512_bf16"}};
    size_t used = 0;
    for (size_t c = 0; k && c < sizeof caps / sizeof caps[0]; c++)
        if (k->caps & caps[c].cap && used < sizeof out->capabilities)
            used += (size_t)snprintf(out->capabilities + used, sizeof out->capabilities - used, "%s%s",
                                     used ? " " : "", caps[c].name);
    _Static_assert(sizeof out->notes == sizeof k->notes, "moe_isa_info.notes holds moe_kernels.notes");
    if (k)
        memcpy(out->notes, k->notes, sizeof out->notes);
    return MOE_OK;
}
