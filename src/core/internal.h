/* Internal definitions shared by the stages. Not installed; not API. */
#ifndef MOE_CORE_INTERNAL_H
#define MOE_CORE_INTERNAL_H

#include "moe.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOE_ERRMSG_LEN 4096 /* an unsupported-architecture message lists every row's classes (57 rows: about 2100 chars) */

#if defined(__GNUC__)
#define MOE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MOE_PRINTF(a, b)
#endif

struct moe_kernels; /* src/gemm/kernels.h */

struct moe_ctx {
    int num_threads;
    moe_log_level log_level;
    moe_log_fn log_fn;
    void *log_user;
    moe_pack_progress_fn pack_progress_fn; /* moe_options.pack_progress_fn, or NULL */
    void *pack_progress_user;
    int64_t chunk_size;
    int permute;              /* MOE_PERMUTE_* (core/knobs.h) */
    int64_t onehot_threshold; /* routed rows */
    int topk;                 /* moe_topk_method */
    int64_t lowtok_threshold; /* rows per expert */
    int64_t small_allreduce;  /* bytes */
    int tp_reduce;            /* MOE_TP_* */
    char tuning_dir[512];     /* "" = none */
    unsigned knob_explicit;   /* bit k: knob k (moe_knob) was set by the API or the environment */
    const struct moe_kernels *kernels; /* the chosen ISA table */
    char options_text[1024];  /* canonical "key=value;" text of the resolved knobs */
    uint64_t options_hash;    /* XXH64 of options_text */
    char tp_idle[2][640];     /* WARNINGs for the TP knobs given without TP ("" = none), logged
                                 by the first plan with tp_size = 1 (layer/plan.c) */
    _Atomic int tp_idle_logged;
    _Atomic int tuning_idle_logged; /* the MOE_TUNING_DIR-under-EP/TP WARNING was logged */
    uint64_t generation;      /* unique per moe_ctx_create in this process: keys the per-thread
                                 last error (core/error.c) */
};

/* A new ctx generation (1, 2, ...; atomic). */
uint64_t moe_ctx_generation_next(void);
/* The calling thread's last error message on ctx, "" when none. */
const char *moe_error_of_thread(const moe_ctx *ctx);

/* Record the message of a failing call on ctx (if non-NULL) for the calling thread (core/error.c)
 * and log it at DEBUG. Errors are
 * returned, not logged at ERROR: the caller decides. Returns `st` so callers can write
 * `return moe_set_error(ctx, MOE_EINVAL, "...")`. */
moe_status moe_set_error(moe_ctx *ctx, moe_status st, const char *fmt, ...) MOE_PRINTF(3, 4);
moe_status moe_set_errorv(moe_ctx *ctx, moe_status st, const char *fmt, va_list ap);

/* Make the NUL-terminated text in buf [size] safe to print on a terminal or in a log line:
 * every control byte (< 0x20, 0x7f) becomes a visible escape ("\\n", "\\r", "\\t", else
 * "\\xHH") and every UTF-8 C1 control (U+0080..U+009F) "\\u00HH"; the result is truncated to
 * fit size. Names read from files (tensor names, config values) reach messages this way
 * raw; no library message holds a control byte on purpose. moe_set_error(v), moe_log and
 * the other message sinks apply it after formatting. */
void moe_escape_controls(char *buf, size_t size);

/* Log one line through ctx's sink if `level` <= ctx->log_level. ctx may be NULL (stderr,
 * WARN threshold). */
void moe_log(const moe_ctx *ctx, moe_log_level level, const char *fmt, ...) MOE_PRINTF(3, 4);

/* Allocation aligned to 64 bytes; free with moe_free_aligned. Returns NULL on overflow or
 * failure. */
void *moe_alloc_aligned(size_t bytes);
void moe_free_aligned(void *p);

/* a * b with overflow check: false on overflow. */
/* The router's width: E + Z, the experts the router scores (moe.h num_identity_experts: ids
 * in [E, E + Z) are identity experts). */
static inline int64_t moe_route_width(const moe_layer_desc *d)
{
    return d->num_experts + d->num_identity_experts;
}

static inline bool moe_mul_size(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return false;
    *out = a * b;
    return true;
}

#endif
