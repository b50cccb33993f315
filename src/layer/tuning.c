/* Tuning files (docs/tuning.md): with MOE_TUNING_DIR set, plan creation reads the file named
 * for the plan's layer shape and machine (moe_plan_tuning_name), whose entries give, per token
 * count, values of the knobs that never change the output bits (chunk_size, permute,
 * onehot_threshold, topk, lowtok_threshold). An execute of T tokens runs the entry whose token
 * count is nearest to T (ties: the smaller). A knob set explicitly (moe_options or the
 * environment) keeps its value whatever the file says. `moe tune` writes these files. */
#include "core/cpu.h"
#include "core/file.h"
#include "core/knobs.h"
#include "layer/layer.h"
#include "quant/quant.h"
#include "route/route.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

/* A tuning file larger than this is refused (a real one holds a few dozen entries). */
#define TUNING_MAX_BYTES (1u << 20)

static const char *const permute_names[] = {"auto", "sort", "onehot", "packed", NULL};
static const char *const topk_names[] = {"sort", "rowmax", NULL};

moe_status moe_plan_tuning_name(const moe_plan *plan, char *out, size_t len)
{
    if (!plan)
        return MOE_EINVAL;
    if (!out || len == 0)
        return moe_set_error(plan->st.ctx, MOE_EINVAL, "moe_plan_tuning_name: out is NULL or len is 0");
    const moe_layer_desc *d = &plan->st.desc;
    char fmt[48], shared[48] = "";
    if (moe_quant_active(&d->quant)) {
        snprintf(fmt, sizeof fmt, "%s", moe_quant_name(&d->quant));
    } else {
        const char *n = moe_dtype_name(d->weight_dtype); /* "BF16" -> "bf16" */
        size_t i = 0;
        for (; n[i] && i + 1 < sizeof fmt; i++)
            fmt[i] = (char)(n[i] >= 'A' && n[i] <= 'Z' ? n[i] - 'A' + 'a' : n[i]);
        fmt[i] = '\0';
    }
    if (d->shared_expert_intermediate_size > 0)
        snprintf(shared, sizeof shared, ",shared_N=%lld", (long long)d->shared_expert_intermediate_size);
    int n = snprintf(out, len, "E=%lld,N=%lld,K=%lld,top_k=%lld%s,format=%s,compute=%s,device_name=%s,threads=%d.json",
                     (long long)d->num_experts, (long long)d->moe_intermediate_size, (long long)d->hidden_size,
                     (long long)d->top_k, shared, fmt, moe_compute_name(plan->st.compute), moe_cpu_device_name(),
                     plan->st.ctx->num_threads);
    if (n < 0 || (size_t)n >= len)
        return moe_set_error(plan->st.ctx, MOE_ERANGE, "moe_plan_tuning_name: the name needs %d bytes, len is %zu",
                             n + 1, len);
    return MOE_OK;
}

const char *moe_plan_tuning_file(const moe_plan *plan)
{
    return plan ? plan->tuning_file : "";
}

const moe_exec_knobs *moe_plan_knobs(const moe_plan *p, int64_t n_tokens)
{
    const moe_stage *st = &p->st;
    if (st->n_tuned == 0 || n_tokens < 1)
        return &st->knobs;
    int best = 0;
    for (int i = 1; i < st->n_tuned; i++) { /* ascending: a tie keeps the smaller token count */
        const int64_t a = st->tuned[i].tokens - n_tokens, b = st->tuned[best].tokens - n_tokens;
        if ((a < 0 ? -a : a) < (b < 0 ? -b : b))
            best = i;
    }
    return &st->tuned[best];
}

int64_t moe_plan_max_chunk(const moe_plan *p, int64_t max_tokens)
{
    const moe_stage *st = &p->st;
    if (st->n_tuned == 0)
        return max_tokens < st->chunk_size ? max_tokens : st->chunk_size;
    int64_t tc = 0;
    for (int i = 0; i < st->n_tuned; i++) {
        /* the smallest token count entry i is nearest to (ties go to entry i - 1) */
        const int64_t lo = i == 0 ? 1 : (st->tuned[i - 1].tokens + st->tuned[i].tokens) / 2 + 1;
        if (lo > max_tokens)
            break;
        const int64_t c = max_tokens < st->tuned[i].chunk_size ? max_tokens : st->tuned[i].chunk_size;
        if (c > tc)
            tc = c;
    }
    return tc;
}

/* The file's bytes, NUL-terminated, into *buf (caller frees). MOE_ENOTFOUND when nothing is
 * there (not recorded on ctx: the caller logs INFO); other failures recorded as MOE_EFORMAT,
 * naming path: a dangling symlink (a file was put there, so not "no tuning file"), a folder or
 * FIFO, an unreadable file (core/file.h moe_io_open_regular's messages). */
static moe_status read_file(moe_ctx *ctx, const char *path, char **buf, size_t *len)
{
    *buf = NULL;
    struct stat ls;
    if (lstat(path, &ls) != 0 && errno == ENOENT)
        return MOE_ENOTFOUND;
    int fd;
    uint64_t fsize;
    if (moe_io_open_regular(ctx, path, &fd, &fsize) != MOE_OK) {
        char why[MOE_ERRMSG_LEN]; /* the reader's message, which names path */
        snprintf(why, sizeof why, "%s", moe_ctx_last_error(ctx));
        return moe_set_error(ctx, MOE_EFORMAT, "tuning file %s", why);
    }
    if (fsize > TUNING_MAX_BYTES) {
        close(fd);
        return moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: %" PRIu64 " bytes, over the %u-byte limit", path,
                             fsize, TUNING_MAX_BYTES);
    }
    const size_t size = (size_t)fsize;
    char *b = malloc(size + 1); /* [size + 1] */
    if (!b) {
        close(fd);
        return moe_set_error(ctx, MOE_ENOMEM, "tuning file %s: out of memory", path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, b + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            const int e = errno;
            free(b);
            close(fd);
            return moe_set_error(ctx, MOE_EIO, "tuning file %s: read failed: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    b[got] = '\0';
    *buf = b;
    *len = got;
    return MOE_OK;
}

/* A token-count key: a decimal integer in [1, 2^40] without sign or leading zeros. */
static int parse_tokens_key(const char *key, int64_t *out)
{
    if (!*key || *key == '0' || strlen(key) > 13)
        return 0;
    int64_t v = 0;
    for (const char *c = key; *c; c++) {
        if (*c < '0' || *c > '9')
            return 0;
        v = v * 10 + (*c - '0');
    }
    if (v > (int64_t)1 << 40)
        return 0;
    *out = v;
    return 1;
}

/* One entry: the knobs of the context, overwritten by the file's fields unless explicitly set. */
static moe_status parse_entry(moe_ctx *ctx, const char *path, const char *key, const json_t *obj,
                              const moe_exec_knobs *base, moe_exec_knobs *out)
{
    *out = *base;
    if (!json_is_object(obj))
        return moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: entry \"%s\" must be an object of knob values, found %s",
                             path, key, moe_io_json_kind(obj));
    const char *field;
    const json_t *v;
    json_object_foreach((json_t *)obj, field, v) {
        int knob = -1;
        const char *const *names = NULL;
        int64_t lo = 0, *dst = NULL;
        int *edst = NULL;
        if (strcmp(field, "chunk_size") == 0) {
            knob = MOE_KNOB_CHUNK_SIZE, lo = 1, dst = &out->chunk_size;
        } else if (strcmp(field, "onehot_threshold") == 0) {
            knob = MOE_KNOB_ONEHOT_THRESHOLD, dst = &out->onehot_threshold;
        } else if (strcmp(field, "lowtok_threshold") == 0) {
            knob = MOE_KNOB_LOWTOK_THRESHOLD, dst = &out->lowtok_threshold;
        } else if (strcmp(field, "permute") == 0) {
            knob = MOE_KNOB_PERMUTE, names = permute_names, edst = &out->permute;
        } else if (strcmp(field, "topk") == 0) {
            knob = MOE_KNOB_TOPK, names = topk_names, edst = &out->topk;
        } else {
            return moe_set_error(ctx, MOE_EFORMAT,
                                 "tuning file %s: entry \"%s\": unknown field '%.60s' (accepted: chunk_size, permute, "
                                 "onehot_threshold, topk, lowtok_threshold)",
                                 path, key, field);
        }
        int idx = 0;
        int64_t num = 0;
        if (dst) {
            if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > (json_int_t)1 << 40) {
                char found[64]; /* an integer out of range by its value, anything else by its kind */
                if (json_is_integer(v))
                    snprintf(found, sizeof found, "%lld", (long long)json_integer_value(v));
                else
                    snprintf(found, sizeof found, "%s", moe_io_json_kind(v));
                return moe_set_error(ctx, MOE_EFORMAT,
                                     "tuning file %s: entry \"%s\": field '%s' must be an integer in [%lld, 2^40], "
                                     "found %s",
                                     path, key, field, (long long)lo, found);
            }
            num = (int64_t)json_integer_value(v);
        } else {
            const char *s = json_is_string(v) ? json_string_value(v) : NULL;
            for (idx = 0; s && names[idx] && strcmp(s, names[idx]) != 0; idx++)
                ;
            if (!s || !names[idx]) {
                char found[64];
                if (s)
                    snprintf(found, sizeof found, "'%.40s'", s);
                else
                    snprintf(found, sizeof found, "%s", moe_io_json_kind(v));
                return moe_set_error(ctx, MOE_EFORMAT,
                                     "tuning file %s: entry \"%s\": field '%s' must be one of %s, found %s", path, key,
                                     field, names == permute_names ? "auto, sort, onehot, packed" : "sort, rowmax",
                                     found);
            }
        }
        if (ctx->knob_explicit >> knob & 1u)
            continue; /* an explicit knob wins over the file */
        if (dst)
            *dst = num;
        else
            *edst = idx;
    }
    return MOE_OK;
}

static int cmp_tokens(const void *a, const void *b)
{
    const moe_exec_knobs *x = a, *y = b;
    return (x->tokens > y->tokens) - (x->tokens < y->tokens);
}

/* "T:chunk_size/permute/onehot_threshold/topk/lowtok_threshold" */
static int entry_text(const moe_exec_knobs *k, char *out, size_t len)
{
    return snprintf(out, len, "%lld:%lld/%s/%lld/%s/%lld", (long long)k->tokens, (long long)k->chunk_size,
                    permute_names[k->permute], (long long)k->onehot_threshold, topk_names[k->topk],
                    (long long)k->lowtok_threshold);
}

size_t moe_plan_tuning_text(const moe_plan *p, char *out, size_t len)
{
    const moe_stage *st = &p->st;
    size_t used = 0;
    int n = snprintf(out, len, "tuning_file=%s;", p->tuning_file[0] ? p->tuning_file : "none");
    if (n > 0)
        used = (size_t)n < len ? (size_t)n : len;
    if (st->n_tuned == 0 || used >= len)
        return used;
    n = snprintf(out + used, len - used, "tuned=");
    used += n > 0 && (size_t)n < len - used ? (size_t)n : 0;
    for (int i = 0; i < st->n_tuned && used < len; i++) {
        n = entry_text(&st->tuned[i], out + used, len - used);
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
        n = snprintf(out + used, len - used, "%s", i + 1 < st->n_tuned ? "," : ";");
        if (n < 0 || (size_t)n >= len - used)
            break;
        used += (size_t)n;
    }
    return used;
}

moe_status moe_tuning_apply(moe_plan *p, int64_t chunk_limit)
{
    moe_stage *st = &p->st;
    moe_ctx *ctx = st->ctx;
    st->n_tuned = 0;
    p->tuning_file[0] = '\0';
    if (!ctx->tuning_dir[0])
        return MOE_OK;
    if (st->parallel) {
        /* an idle knob (moe.h "Idle knobs"): one WARNING per ctx */
        if (!atomic_exchange(&ctx->tuning_idle_logged, 1))
            moe_log(ctx, MOE_LOG_WARN,
                    "MOE_TUNING_DIR=%s has no effect: tuning files apply only to single-process plans, and "
                    "this plan has ep_size %d, tp_size %d (it runs the context's knobs)",
                    ctx->tuning_dir, st->par.ep_size, st->par.tp_size);
        return MOE_OK;
    }
    char name[sizeof p->tuning_file - sizeof ctx->tuning_dir - 2];
    moe_status s = moe_plan_tuning_name(p, name, sizeof name);
    if (s != MOE_OK)
        return s;
    char path[sizeof p->tuning_file];
    snprintf(path, sizeof path, "%s/%s", ctx->tuning_dir, name);
    char *buf = NULL;
    size_t len = 0;
    s = read_file(ctx, path, &buf, &len);
    if (s == MOE_ENOTFOUND) {
        moe_log(ctx, MOE_LOG_INFO, "MOE_TUNING_DIR: no tuning file %s in %s; the context's knobs are used", name,
                ctx->tuning_dir);
        return MOE_OK;
    }
    if (s != MOE_OK)
        return s;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    if (!root)
        return moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: not valid JSON: %s (line %d, column %d)", path,
                             jerr.text, jerr.line, jerr.column);
    s = MOE_OK;
    if (!json_is_object(root))
        s = moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: must be a JSON object, found %s", path, moe_io_json_kind(root));
    const char *key;
    json_t *v;
    int n = 0;
    if (s == MOE_OK)
        json_object_foreach(root, key, v) {
            if (strcmp(key, "meta") == 0) { /* what the tuner measured: not read, but must be an object */
                if (!json_is_object(v)) {
                    s = moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: field 'meta' must be an object, found %s",
                                      path, moe_io_json_kind(v));
                    break;
                }
                continue;
            }
            int64_t T;
            if (!parse_tokens_key(key, &T)) {
                s = moe_set_error(ctx, MOE_EFORMAT,
                                  "tuning file %s: key '%.60s' is not a token count (a decimal integer in [1, 2^40]) "
                                  "nor \"meta\"",
                                  path, key);
                break;
            }
            if (n == MOE_TUNED_MAX) {
                s = moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: more than %d token-count entries", path,
                                  MOE_TUNED_MAX);
                break;
            }
            if ((s = parse_entry(ctx, path, key, v, &st->knobs, &st->tuned[n])) != MOE_OK)
                break;
            st->tuned[n++].tokens = T;
        }
    json_decref(root);
    if (s == MOE_OK && n == 0)
        s = moe_set_error(ctx, MOE_EFORMAT, "tuning file %s: no token-count entries (keys such as \"1\", \"16\")",
                          path);
    if (s != MOE_OK)
        return s;
    qsort(st->tuned, (size_t)n, sizeof st->tuned[0], cmp_tokens);
    /* the plan's limits on chunks (row ids in 32 bits, batched capacity) hold for every entry */
    for (int i = 0; i < n; i++)
        if (st->tuned[i].chunk_size > chunk_limit)
            st->tuned[i].chunk_size = chunk_limit;
    st->n_tuned = n;
    snprintf(p->tuning_file, sizeof p->tuning_file, "%s", path);
    for (int k = MOE_KNOB_CHUNK_SIZE; k <= MOE_KNOB_LOWTOK_THRESHOLD; k++)
        if (ctx->knob_explicit >> k & 1u)
            moe_log(ctx, MOE_LOG_INFO, "tuning file %s: knob %s is set explicitly and keeps its value", path,
                    k == MOE_KNOB_CHUNK_SIZE         ? "MOE_CHUNK_SIZE"
                    : k == MOE_KNOB_PERMUTE          ? "MOE_PERMUTE"
                    : k == MOE_KNOB_ONEHOT_THRESHOLD ? "MOE_ONEHOT_THRESHOLD"
                    : k == MOE_KNOB_TOPK             ? "MOE_TOPK"
                                                     : "MOE_LOWTOK_THRESHOLD");
    char text[MOE_PLAN_TEXT_LEN];
    moe_plan_tuning_text(p, text, sizeof text);
    moe_log(ctx, MOE_LOG_INFO, "%s", text);
    return MOE_OK;
}
