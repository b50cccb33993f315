/* Error messages, logging and aligned allocation. */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

moe_status moe_set_errorv(moe_ctx *ctx, moe_status st, const char *fmt, va_list ap)
{
    char buf[MOE_ERRMSG_LEN];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (ctx) {
        memcpy(ctx->last_error, buf, sizeof buf);
        moe_log(ctx, MOE_LOG_DEBUG, "%s: %s", moe_status_name(st), buf);
    }
    return st;
}

moe_status moe_set_error(moe_ctx *ctx, moe_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    moe_status r = moe_set_errorv(ctx, st, fmt, ap);
    va_end(ap);
    return r;
}

static const char *level_name(moe_log_level l)
{
    switch (l) {
    case MOE_LOG_ERROR: return "error";
    case MOE_LOG_WARN: return "warning";
    case MOE_LOG_INFO: return "info";
    case MOE_LOG_DEBUG: return "debug";
    }
    return "?";
}

void moe_log(const moe_ctx *ctx, moe_log_level level, const char *fmt, ...)
{
    moe_log_level threshold = ctx ? ctx->log_level : MOE_LOG_WARN;
    if (level > threshold)
        return;
    char buf[MOE_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (ctx && ctx->log_fn) {
        ctx->log_fn(level, buf, ctx->log_user);
    } else {
        fprintf(stderr, "libmoe: %s: %s\n", level_name(level), buf);
    }
}

void *moe_alloc_aligned(size_t bytes)
{
    if (bytes == 0)
        bytes = 64;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(64, rounded);
}

void moe_free_aligned(void *p)
{
    free(p);
}
