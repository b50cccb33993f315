/* Error messages, logging and aligned allocation. */
#include "core/internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The last error is per thread and per ctx (moe.h "moe_ctx_last_error"): each thread keeps
 * MOE_ERR_SLOTS messages, one per ctx it last failed on, the least recently written replaced
 * first. A slot names its ctx by address and generation: a ctx created later at the same
 * address has a new generation, so a message of a freed ctx is never returned for it. Only
 * the owning thread reads or writes its slots, so no lock is needed. */
#define MOE_ERR_SLOTS 8

typedef struct err_slot {
    const moe_ctx *ctx;        /* NULL: free */
    uint64_t generation;       /* ctx->generation when written */
    uint64_t written;          /* this thread's write counter at the last write (LRU) */
    char msg[MOE_ERRMSG_LEN];
} err_slot;

static _Thread_local err_slot err_slots[MOE_ERR_SLOTS];
static _Thread_local uint64_t err_writes;
static _Atomic uint64_t ctx_generations;

uint64_t moe_ctx_generation_next(void)
{
    return atomic_fetch_add(&ctx_generations, 1) + 1;
}

static err_slot *err_slot_find(const moe_ctx *ctx)
{
    for (int i = 0; i < MOE_ERR_SLOTS; i++)
        if (err_slots[i].ctx == ctx && err_slots[i].generation == ctx->generation)
            return &err_slots[i];
    return NULL;
}

const char *moe_error_of_thread(const moe_ctx *ctx)
{
    const err_slot *s = err_slot_find(ctx);
    return s ? s->msg : "";
}

void moe_escape_controls(char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    const size_t n = strnlen(buf, size - 1);
    buf[n] = '\0';
    int any = 0;
    for (size_t i = 0; i < n && !any; i++) {
        const unsigned char c = (unsigned char)buf[i];
        any = c < 0x20 || c == 0x7f || (c == 0xc2 && (unsigned char)buf[i + 1] >= 0x80 &&
                                        (unsigned char)buf[i + 1] <= 0x9f);
    }
    if (!any)
        return;
    char local[MOE_ERRMSG_LEN]; /* messages fit here: no allocation on error paths */
    char *out = size <= sizeof local ? local : malloc(size); /* the escaped text, as much as fits */
    if (!out) { /* no memory: the control bytes become '?' in place */
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] == 0x7f)
                buf[i] = '?';
        return;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)buf[i];
        char piece[8]; /* one byte, or the escape of one control */
        size_t len;
        if (c == '\n' || c == '\r' || c == '\t') {
            piece[0] = '\\';
            piece[1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
            len = 2;
        } else if (c < 0x20 || c == 0x7f) {
            len = (size_t)snprintf(piece, sizeof piece, "\\x%02x", c);
        } else if (c == 0xc2 && (unsigned char)buf[i + 1] >= 0x80 && (unsigned char)buf[i + 1] <= 0x9f) {
            len = (size_t)snprintf(piece, sizeof piece, "\\u%04x", (unsigned char)buf[++i]);
        } else {
            piece[0] = (char)c;
            len = 1;
        }
        if (o + len > size - 1) /* truncated, never inside an escape */
            break;
        memcpy(out + o, piece, len);
        o += len;
    }
    memcpy(buf, out, o);
    buf[o] = '\0';
    if (out != local)
        free(out);
}

moe_status moe_set_errorv(moe_ctx *ctx, moe_status st, const char *fmt, va_list ap)
{
    if (!ctx)
        return st;
    char buf[MOE_ERRMSG_LEN];
    vsnprintf(buf, sizeof buf, fmt, ap);
    moe_escape_controls(buf, sizeof buf);
    err_slot *s = err_slot_find(ctx);
    if (!s) { /* a free slot, else the least recently written one */
        s = &err_slots[0];
        for (int i = 0; i < MOE_ERR_SLOTS && s->ctx; i++)
            if (!err_slots[i].ctx || err_slots[i].written < s->written)
                s = &err_slots[i];
        s->ctx = ctx;
        s->generation = ctx->generation;
    }
    s->written = ++err_writes;
    memcpy(s->msg, buf, sizeof buf);
    moe_log(ctx, MOE_LOG_DEBUG, "%s: %s", moe_status_name(st), buf);
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
    moe_escape_controls(buf, sizeof buf);
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
