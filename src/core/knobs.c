/* The knob table: every tuning switch of DESIGN.md section 5, resolved from the API value,
 * else the environment, else the default, and validated in one place. moe_ctx_create and
 * `moe env` (moe_knob_describe) both go through moe_knob_resolve (src/layer/ctx.c supplies the
 * ISA knob's values from the kernel registry), so what `moe env` shows is what runs. */
#include "core/knobs.h"

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <omp.h>

extern char **environ;

static const char *const permute_values[] = {"auto", "sort", "onehot", "packed", NULL};
static const char *const topk_values[] = {"sort", "rowmax", NULL};
static const char *const tp_reduce_values[] = {"allreduce", "reduce_scatter", NULL};
static const char *const log_values[] = {"error", "warn", "info", "debug", NULL};

enum { KIND_INT, KIND_ENUM, KIND_PATH };

/* How the moe_options field of a knob is typed: an int, an int64_t or a string. */
enum { FIELD_INT, FIELD_I64, FIELD_STR };

typedef struct knob_def {
    moe_knob id;
    const char *field, *env, *accepted, *doc;
    int kind;
    long long lo, hi;           /* KIND_INT range */
    const char *const *values;  /* KIND_ENUM, NULL-terminated */
    const char *default_text;   /* NULL: computed (threads) */
    size_t off;                 /* offsetof(moe_options, <field>) */
    int ftype;                  /* FIELD_* */
    long long unset;            /* the field's "unset" value (FIELD_INT / FIELD_I64; strings: NULL) */
} knob_def;

#define OPT(f) offsetof(moe_options, f)

static const knob_def defs[MOE_KNOB__COUNT] = {
    {MOE_KNOB_NUM_THREADS, "num_threads", "MOE_NUM_THREADS", "integer 1..4096",
     "worker threads (else OMP_NUM_THREADS, else cores)", KIND_INT, 1, 4096, NULL, NULL, OPT(num_threads), FIELD_INT, 0},
    /* accepted values and names: "auto" and the kernel registry's rows, given by the caller
     * (src/layer/ctx.c; core does not know the registry) */
    {MOE_KNOB_ISA, "isa", "MOE_ISA", NULL,
     "kernel table; auto picks the best the CPU and OS support (CPUID, XCR0)", KIND_ENUM, 0, 0, NULL, "auto",
     OPT(isa), FIELD_STR, 0},
    {MOE_KNOB_CHUNK_SIZE, "chunk_size", "MOE_CHUNK_SIZE", "integer >= 1 (tokens)",
     "tokens per chunk: bounds the workspace; results unchanged", KIND_INT, 1, (long long)1 << 40, NULL, "1024",
     OPT(chunk_size), FIELD_I64, 0},
    {MOE_KNOB_PERMUTE, "permute", "MOE_PERMUTE", "auto, sort, onehot, packed",
     "how rows are grouped by expert: counting sort, per-expert scan, or radix sort of packed keys",
     KIND_ENUM, 0, 0, permute_values, "auto", OPT(permute), FIELD_STR, 0},
    {MOE_KNOB_ONEHOT_THRESHOLD, "onehot_threshold", "MOE_ONEHOT_THRESHOLD", "integer >= 0 (routed rows)",
     "permute=auto uses onehot when a chunk has at most this many routed rows (T*K)", KIND_INT, 0,
     (long long)1 << 40, NULL, "256", OPT(onehot_threshold), FIELD_I64, -1},
    {MOE_KNOB_TOPK, "topk", "MOE_TOPK", "sort, rowmax", "top-k algorithm; results identical", KIND_ENUM, 0, 0,
     topk_values, "sort", OPT(topk), FIELD_STR, 0},
    {MOE_KNOB_LOWTOK_THRESHOLD, "lowtok_threshold", "MOE_LOWTOK_THRESHOLD", "integer >= 0 (rows per expert)",
     "experts with fewer rows take the few-token streaming path", KIND_INT, 0, (long long)1 << 40, NULL, "4",
     OPT(lowtok_threshold), FIELD_I64, -1},
    {MOE_KNOB_SMALL_ALLREDUCE, "small_allreduce", "MOE_SMALL_ALLREDUCE", "integer >= 0 (bytes)",
     "TP: all-gather + sum below this many bytes per chunk, reduce-scatter + all-gather at or above (same bits)", KIND_INT, 0,
     (long long)1 << 50, NULL, "65536", OPT(small_allreduce), FIELD_I64, -1},
    {MOE_KNOB_TP_REDUCE, "tp_reduce", "MOE_TP_REDUCE", "allreduce, reduce_scatter",
     "TP output on every rank (allreduce) or each rank's share of the rows (reduce_scatter)", KIND_ENUM, 0, 0,
     tp_reduce_values, "allreduce", OPT(tp_reduce), FIELD_STR, 0},
    {MOE_KNOB_TUNING_DIR, "tuning_dir", "MOE_TUNING_DIR", "an existing folder",
     "tuning files `moe tune` writes (docs/tuning.md): plans read the file of their shape; explicit knobs win",
     KIND_PATH, 0, 0, NULL, "",
     OPT(tuning_dir), FIELD_STR, 0},
    {MOE_KNOB_LOG_LEVEL, "log_level", "MOE_LOG_LEVEL", "error, warn, info, debug", "logging threshold",
     KIND_ENUM, 0, 0, log_values, "warn", OPT(log_level), FIELD_INT, -1},
};

size_t moe_knob_count(void)
{
    return MOE_KNOB__COUNT;
}

void moe_options_init(moe_options *opts)
{
    memset(opts, 0, sizeof *opts); /* strings NULL, log_fn / log_user NULL */
    for (size_t k = 0; k < MOE_KNOB__COUNT; k++) {
        unsigned char *f = (unsigned char *)opts + defs[k].off;
        if (defs[k].ftype == FIELD_INT) {
            const int v = (int)defs[k].unset;
            memcpy(f, &v, sizeof v);
        } else if (defs[k].ftype == FIELD_I64) {
            const int64_t v = defs[k].unset;
            memcpy(f, &v, sizeof v);
        }
    }
}

/* The API value of knob d as text, or NULL when unset. buf holds numbers. *bad_unset = 1 for
 * an enum given as an index out of range (log_level). */
static const char *api_value(const moe_options *o, const knob_def *d, char *buf, size_t len, int *bad_unset)
{
    *bad_unset = 0;
    if (!o)
        return NULL;
    const unsigned char *f = (const unsigned char *)o + d->off;
    if (d->ftype == FIELD_STR) {
        const char *v;
        memcpy(&v, f, sizeof v);
        return v;
    }
    long long v;
    if (d->ftype == FIELD_INT) {
        int i;
        memcpy(&i, f, sizeof i);
        v = i;
    } else {
        int64_t i;
        memcpy(&i, f, sizeof i);
        v = i;
    }
    if (v == d->unset)
        return NULL;
    snprintf(buf, len, "%lld", v);
    if (d->kind == KIND_ENUM) { /* an enum given as its index (log_level) */
        long long n = 0;
        while (d->values[n])
            n++;
        if (v < 0 || v >= n) {
            *bad_unset = 1;
            return buf;
        }
        return d->values[v];
    }
    return buf;
}

/* Validate text for knob d (values, accepted: its enum's, for KIND_ENUM): canonical value into
 * `value`, or a message into `err`. */
static int validate(const knob_def *d, const char *const *values, const char *accepted, const char *text,
                    char *value, size_t vlen, long long *num, char *err, size_t elen)

{
    if (d->kind == KIND_INT) {
        errno = 0;
        char *end = NULL;
        long long v = strtoll(text, &end, 10);
        if (!*text || errno != 0 || *end != '\0' || v < d->lo || v > d->hi) {
            snprintf(err, elen, "'%.60s' is not accepted: %s", text, accepted);
            return 0;
        }
        *num = v;
        snprintf(value, vlen, "%lld", v);
        return 1;
    }
    if (d->kind == KIND_ENUM) {
        for (int i = 0; values[i]; i++) {
            if (strcmp(text, values[i]) == 0) {
                *num = i;
                snprintf(value, vlen, "%s", text);
                return 1;
            }
        }
        snprintf(err, elen, "'%.60s' is not accepted: accepted values are %s", text, accepted);
        return 0;
    }
    /* KIND_PATH: empty means none; otherwise an existing folder */
    if (*text) {
        struct stat st;
        errno = 0;
        if (stat(text, &st) != 0 || !S_ISDIR(st.st_mode)) {
            snprintf(err, elen, "'%.60s' is not accepted: %s (%s)", text, accepted,
                     errno ? strerror(errno) : "not a folder");
            return 0;
        }
    }
    *num = 0;
    snprintf(value, vlen, "%s", text);
    return 1;
}

int moe_knob_resolve(const moe_options *opts, moe_knob k, const moe_knob_isa *isa, moe_knob_info *info,
                     long long *num)
{
    const knob_def *d = &defs[k];
    const char *const *values = k == MOE_KNOB_ISA ? isa->names : d->values;
    const char *accepted = k == MOE_KNOB_ISA ? isa->accepted : d->accepted;
    memset(info, 0, sizeof *info);
    info->field = d->field;
    info->env = d->env;
    info->accepted = accepted;
    info->doc = d->doc;
    char buf[64];
    int bad_unset = 0;
    const char *text = api_value(opts, d, buf, sizeof buf, &bad_unset);
    const char *where = NULL;
    char where_buf[80];
    if (text) {
        info->source = MOE_KNOB_API;
        snprintf(where_buf, sizeof where_buf, "moe_options.%s", d->field);
        where = where_buf;
    } else if ((text = getenv(d->env)) != NULL) {
        info->source = MOE_KNOB_ENV;
        where = d->env;
    } else {
        info->source = MOE_KNOB_DEFAULT;
    }
    char err[160];
    if (text && !bad_unset) {
        if (validate(d, values, accepted, text, info->value, sizeof info->value, num, err, sizeof err))
            return 1;
        snprintf(info->error, sizeof info->error, "%.80s=%s", where, err);
        return 0;
    }
    if (bad_unset) {
        snprintf(info->error, sizeof info->error, "%s=%s: accepted values are 0..3 (%s)", where, text, d->accepted);
        return 0;
    }
    /* default */
    if (k == MOE_KNOB_NUM_THREADS) {
        int t = omp_get_max_threads();
        *num = t < 1 ? 1 : t;
        snprintf(info->value, sizeof info->value, "%lld", *num);
        return 1;
    }
    validate(d, values, accepted, d->default_text, info->value, sizeof info->value, num, err, sizeof err);
    return 1;
}

const char *moe_knob_where(const moe_knob_info *info, char *buf, size_t len)
{
    if (info->source == MOE_KNOB_API) {
        snprintf(buf, len, "moe_options.%s", info->field);
        return buf;
    }
    return info->env;
}

/* The idle cases (each is what the code that reads the knob does):
 *  - ONEHOT_THRESHOLD: read only when PERMUTE is auto (permute/prepare_finalize.c
 *    moe_pf_group_rows); sort, onehot and packed ignore it.
 *  - SMALL_ALLREDUCE: read only by the allreduce algorithm of the TP reduction
 *    (parallel/mpi.c moe_par_tp_reduce); reduce_scatter always reduce-scatters.
 *  - SMALL_ALLREDUCE and TP_REDUCE: read only when the plan has tp_size > 1 (execute.c runs
 *    the TP reduction only then; shard.c splits the rows only then).
 * The other knobs act on every plan: threads, ISA, chunk size, permute, top-k (every plan
 * routes) and the few-token threshold (every expert group is split by it). */
int moe_knob_inert(const moe_knob_info *info, const long long *num, moe_knob k, int tp, char *why, size_t len)
{
    char wb[96];
    why[0] = '\0';
    if (info[k].source == MOE_KNOB_DEFAULT)
        return 0;
    if (k == MOE_KNOB_ONEHOT_THRESHOLD && num[MOE_KNOB_PERMUTE] != MOE_PERMUTE_AUTO) {
        const moe_knob_info *p = &info[MOE_KNOB_PERMUTE];
        snprintf(why, len, "acts only when the permute knob is auto, and %s=%s", moe_knob_where(p, wb, sizeof wb),
                 p->value);
        return 1;
    }
    if (k == MOE_KNOB_SMALL_ALLREDUCE && num[MOE_KNOB_TP_REDUCE] == MOE_TP_REDUCE_SCATTER) {
        const moe_knob_info *r = &info[MOE_KNOB_TP_REDUCE];
        snprintf(why, len, "acts only when the tp_reduce knob is allreduce (reduce_scatter always reduce-scatters), and %s=%s",
                 moe_knob_where(r, wb, sizeof wb), r->value);
        return 1;
    }
    if ((k == MOE_KNOB_SMALL_ALLREDUCE || k == MOE_KNOB_TP_REDUCE) && tp != MOE_INERT_TP_UNKNOWN) {
        snprintf(why, len, "acts only under tensor parallelism (parallel.tp_size > 1; the command line's --tp > 1)%s", tp == MOE_INERT_NO_TP ? ", and this plan has tp_size = 1" : "");
        return 1;
    }
    return 0;
}

int moe_env_unknown(size_t i, const char **name, size_t *name_len, const char **suggestion)
{
    size_t seen = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "MOE_", 4) != 0)
            continue;
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        int known = 0;
        const char *names[MOE_KNOB__COUNT];
        for (size_t k = 0; k < MOE_KNOB__COUNT; k++) {
            names[k] = defs[k].env;
            if (strlen(defs[k].env) == len && strncmp(*e, defs[k].env, len) == 0)
                known = 1;
        }
        if (known)
            continue;
        if (seen++ == i) {
            *name = *e;
            *name_len = len;
            *suggestion = moe_suggest(*e, len, names, MOE_KNOB__COUNT);
            return 1;
        }
    }
    return 0;
}
