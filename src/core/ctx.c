/* The context: knobs resolved once (API value, else environment, else default; see
 * core/knobs.c), the kernel table chosen from CPUID/XCR0, logging and the last error. */
#include "core/kernels.h"
#include "core/knobs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

static moe_status fail(char *msg, size_t len, moe_status st, const char *text)
{
    if (msg && len)
        snprintf(msg, len, "%s", text);
    return st;
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
        if (!moe_knob_resolve(opts, (moe_knob)k, &info[k], &num[k]))
            return fail(out_err_msg, out_err_len, MOE_EINVAL, info[k].error);
    }

    const moe_kernels *kern = NULL;
    const char *isa_where = info[MOE_KNOB_ISA].source == MOE_KNOB_API ? "moe_options.isa" : "MOE_ISA";
    char m[MOE_ERRMSG_LEN];
    switch ((int)num[MOE_KNOB_ISA]) {
    case MOE_ISA_REF:
        kern = &moe_kernels_ref;
        break;
    case MOE_ISA_AVX2:
        if (!moe_cpu_has_avx2()) {
            snprintf(m, sizeof m, "%s=avx2: this CPU or OS does not support AVX2+FMA+F16C", isa_where);
            return fail(out_err_msg, out_err_len, MOE_EUNSUPPORTED, m);
        }
        kern = &moe_kernels_avx2;
        break;
    case MOE_ISA_AVX512:
        if (!moe_cpu_has_avx512()) {
            snprintf(m, sizeof m, "%s=avx512: this CPU or OS does not support AVX-512 F/BW/VL/DQ", isa_where);
            return fail(out_err_msg, out_err_len, MOE_EUNSUPPORTED, m);
        }
        kern = &moe_kernels_avx512;
        break;
    default:
        kern = moe_cpu_has_avx512() ? &moe_kernels_avx512
               : moe_cpu_has_avx2() ? &moe_kernels_avx2
                                    : &moe_kernels_ref;
        break;
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
    ctx->log_level = (moe_log_level)num[MOE_KNOB_LOG_LEVEL];
    ctx->log_fn = opts ? opts->log_fn : NULL;
    ctx->log_user = opts ? opts->log_user : NULL;
    ctx->kernels = kern;

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
        moe_log(ctx, MOE_LOG_WARN, "unknown environment variable %.*s is ignored; did you mean %s?", (int)len, name,
                suggestion);
    for (int k = 0; k < MOE_KNOB__COUNT; k++)
        moe_log(ctx, MOE_LOG_DEBUG, "knob %s = %s (%s)", info[k].env, info[k].value,
                info[k].source == MOE_KNOB_API ? "api" : info[k].source == MOE_KNOB_ENV ? "environment" : "default");
    moe_log(ctx, MOE_LOG_INFO, "kernel table %s (isa=%s), %d threads, chunk %lld tokens, options hash %016llx",
            kern->name, info[MOE_KNOB_ISA].value, ctx->num_threads, (long long)ctx->chunk_size,
            (unsigned long long)ctx->options_hash);
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
