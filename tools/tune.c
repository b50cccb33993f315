/* `moe tune`: for one layer shape, measure per token count the knobs that never change the
 * output bits (chunk_size, permute, onehot_threshold, topk, lowtok_threshold) with the bench
 * machinery (tools/bench.c: rotating weight copies and input rings, medians of timed
 * forwards), and write the tuning file plan creation reads under MOE_TUNING_DIR
 * (docs/tuning.md). Threads and the kernel table are the machine's: the file's name and meta
 * record them. */
#include "bench.h"
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const CMD = "moe tune";

/* A candidate replaces the current choice only when its fastest run is this much faster: the
 * machine is noisy, and a tie keeps the default. */
#define TUNE_MARGIN 0.03
/* Default --rounds: candidate / best pairs per candidate; the final defaults / tuned
 * comparison takes one round more. */
#define TUNE_ROUNDS 2
#define TUNE_MAX_T 64

static const int64_t DEFAULT_TOKENS[] = {1, 4, 16, 64, 256, 1024, 2048};

static void tune_usage(FILE *f)
{
    fputs("usage: moe tune [--model NAME | --checkpoint DIR [--layer L]] [--output DIR] [options]\n"
          "\n"
          "Measures, for one MoE layer shape and each token count T, the knobs that never\n"
          "change the output bits: permute (sort, onehot, packed), topk (sort, rowmax),\n"
          "lowtok_threshold (when a chunk has under 64 rows per expert) and chunk_size (a\n"
          "quarter to four times the current chunk, at most T), one at a time in that order,\n"
          "each from the best so far: --rounds pairs of the candidate then the best again, and\n"
          "the candidate is kept only when its fastest run is 3% faster than the best's (the\n"
          "fastest run: on a shared machine other jobs only add time). Then the defaults and\n"
          "the tuned knobs are timed again, --rounds + 1 times interleaved; a T whose tuned\n"
          "knobs are not faster keeps the defaults. Writes one JSON file named for the\n"
          "layer shape and machine (docs/tuning.md) into --output; plan creation reads it when\n"
          "MOE_TUNING_DIR names that folder. Threads and the kernel table are not tuned: the\n"
          "file is for the threads it was measured with (its name) and records the table.\n"
          "\n"
          "Options (the layer and timing options are moe bench's):\n"
          "  --model NAME       an embedded model layer (moe bench --list-models); default\n"
          "                     qwen3-30b-a3b\n"
          "  --checkpoint DIR   a Hugging Face checkpoint's layer; --layer L (default: its\n"
          "                     first MoE layer)\n"
          "  --output DIR       an existing folder (default: MOE_TUNING_DIR); an existing\n"
          "                     file of the same name is replaced\n"
          "  --tokens LIST      token counts (default 1,4,16,64,256,1024,2048)\n"
          "  --threads N        worker threads (default: MOE_NUM_THREADS, OMP_NUM_THREADS,\n"
          "                     else all cores)\n"
          "  --dtype D, --quant SCHEME, --compute C, --num-experts N, --seed N, --mem-limit\n"
          "                     SIZE: as moe bench\n"
          "  --iters N          timed forwards per measurement (default: enough for\n"
          "                     --min-time, 3 to 50)\n"
          "  --min-time S       target seconds per measurement (default 0.5)\n"
          "  --rounds N         measurement pairs per candidate (default 2)\n"
          "  -h, --help         this text\n"
          "\n"
          "Knobs set in the environment (MOE_PERMUTE, ...) are the defaults it compares with.\n",
          f);
}

/* One setting of the five knobs. */
typedef struct tune_knobs {
    int64_t chunk_size;
    const char *permute; /* static */
    int64_t onehot_threshold;
    const char *topk; /* static */
    int64_t lowtok_threshold;
} tune_knobs;

typedef struct tune_result {
    int64_t T;
    tune_knobs knobs;
    double default_ms, tuned_ms; /* the fastest run of all their measurements */
    double default_median_ms, tuned_median_ms; /* the lowest median of their measurements */
    int kept_default;            /* the tuned knobs were not faster at the end */
    int measurements;
} tune_result;

static const char *static_name(const char *v, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (strcmp(v, names[i]) == 0)
            return names[i];
    return names[0];
}

static const char *const PERMUTES[] = {"auto", "sort", "onehot", "packed", NULL};
static const char *const TOPKS[] = {"sort", "rowmax", NULL};

/* The knobs a context resolves today without a tuning file (environment, else defaults). */
static void default_knobs(tune_knobs *k)
{
    k->chunk_size = 1024;
    k->permute = "auto";
    k->onehot_threshold = 256;
    k->topk = "sort";
    k->lowtok_threshold = 4;
    for (size_t i = 0; i < moe_knob_count(); i++) {
        moe_knob_info info;
        if (moe_knob_describe(NULL, i, &info) != MOE_OK || info.error[0])
            continue;
        if (strcmp(info.field, "chunk_size") == 0)
            k->chunk_size = strtoll(info.value, NULL, 10);
        else if (strcmp(info.field, "permute") == 0)
            k->permute = static_name(info.value, PERMUTES);
        else if (strcmp(info.field, "onehot_threshold") == 0)
            k->onehot_threshold = strtoll(info.value, NULL, 10);
        else if (strcmp(info.field, "topk") == 0)
            k->topk = static_name(info.value, TOPKS);
        else if (strcmp(info.field, "lowtok_threshold") == 0)
            k->lowtok_threshold = strtoll(info.value, NULL, 10);
    }
}

static void knobs_text(const tune_knobs *k, char *out, size_t len)
{
    snprintf(out, len, "chunk_size %lld, permute %s, onehot_threshold %lld, topk %s, lowtok_threshold %lld",
             (long long)k->chunk_size, k->permute, (long long)k->onehot_threshold, k->topk,
             (long long)k->lowtok_threshold);
}

/* The fastest run (ms) of T-token forwards with knobs k (a context and plan of their own over
 * the bench's weights), *median_ms their median and *stats the last forward's. The fastest
 * run decides: on a shared machine other jobs only ever add time, so the fastest run is the
 * closest to what the knobs themselves cost. */
static int measure(cli_bench *b, const tune_knobs *k, int64_t T, double *ms, double *median_ms, moe_exec_stats *stats)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = moe_ctx_num_threads(cli_bench_ctx(b));
    o.isa = moe_ctx_isa(cli_bench_ctx(b));
    o.tuning_dir = "";
    o.chunk_size = k->chunk_size;
    o.permute = k->permute;
    /* only permute auto reads onehot_threshold: for the others leave it unset (-1), else the
     * context warns of an idle knob the user never set */
    o.onehot_threshold = strcmp(k->permute, "auto") == 0 ? k->onehot_threshold : -1;
    o.topk = k->topk;
    o.lowtok_threshold = k->lowtok_threshold;
    moe_ctx *ctx = NULL;
    char err[1024] = "";
    moe_status st = moe_ctx_create(&o, &ctx, err, sizeof err);
    if (st != MOE_OK) {
        cli_err(CMD, "%s", err[0] ? err : moe_status_name(st));
        return CLI_FAIL;
    }
    moe_plan_config pc;
    moe_plan_config_init(&pc);
    pc.compute = moe_plan_compute(cli_bench_plan(b));
    moe_plan *plan = NULL;
    st = moe_plan_create_ex(ctx, moe_plan_desc(cli_bench_plan(b)), &pc, &plan);
    if (st != MOE_OK) {
        cli_err(CMD, "%s", moe_ctx_last_error(ctx));
        moe_ctx_free(ctx);
        return CLI_FAIL;
    }
    int runs = 0;
    const int rc = cli_bench_time(b, ctx, plan, T, median_ms, ms, &runs, stats);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
    return rc;
}

static int same_knobs(const tune_knobs *a, const tune_knobs *b)
{
    return a->chunk_size == b->chunk_size && strcmp(a->permute, b->permute) == 0 &&
           a->onehot_threshold == b->onehot_threshold && strcmp(a->topk, b->topk) == 0 &&
           a->lowtok_threshold == b->lowtok_threshold;
}

/* Two forwards ran the same code path: the same chunks, permute method, top-k method and
 * expert paths (a threshold that moves no expert to the other path changes nothing). */
static int same_path(const moe_exec_stats *a, const moe_exec_stats *b)
{
    return a->chunks == b->chunks && a->chunk_tokens == b->chunk_tokens && a->permute_sort == b->permute_sort &&
           a->permute_onehot == b->permute_onehot && a->permute_packed == b->permute_packed &&
           strcmp(a->topk, b->topk) == 0 && a->gemm_groups == b->gemm_groups && a->lowtok_groups == b->lowtok_groups;
}

/* A setting measured for one T: its fastest run over all its measurements so far (the more
 * measurements, the closer to what it costs without other jobs' time), the lowest median, and
 * the code path its forwards ran. */
typedef struct tune_seen {
    tune_knobs k;
    double best_ms, median_ms;
    moe_exec_stats path;
} tune_seen;

#define TUNE_MAX_SEEN 32

typedef struct tune_state {
    cli_bench *b;
    int64_t T;
    tune_seen seen[TUNE_MAX_SEEN];
    int n;
    int measurements;
} tune_state;

static tune_seen *find_seen(tune_state *ts, const tune_knobs *k)
{
    for (int i = 0; i < ts->n; i++)
        if (same_knobs(&ts->seen[i].k, k))
            return &ts->seen[i];
    return NULL;
}

/* Measure k once more; its entry in *out. */
static int remeasure(tune_state *ts, const tune_knobs *k, tune_seen **out)
{
    tune_seen *e = find_seen(ts, k);
    if (!e) {
        if (ts->n == TUNE_MAX_SEEN) {
            cli_err(CMD, "more than %d settings for T = %lld", TUNE_MAX_SEEN, (long long)ts->T);
            return CLI_FAIL;
        }
        e = &ts->seen[ts->n++];
        e->k = *k;
        e->best_ms = INFINITY;
        e->median_ms = INFINITY;
    }
    double ms = 0, med = 0;
    if (measure(ts->b, k, ts->T, &ms, &med, &e->path) != CLI_OK)
        return CLI_FAIL;
    ts->measurements++;
    if (ms < e->best_ms)
        e->best_ms = ms;
    if (med < e->median_ms)
        e->median_ms = med;
    *out = e;
    return CLI_OK;
}

/* Try candidate c against the best so far: `rounds` pairs of the candidate then the best again
 * (the load drifts). A candidate that runs the best's code path is not timed further; one that
 * runs another is kept when its fastest run is TUNE_MARGIN faster than the best's. */
static int try_candidate(tune_state *ts, const tune_knobs *c, tune_knobs *best, const char *what, int rounds)
{
    tune_seen *ec = NULL, *eb = find_seen(ts, best);
    for (int i = 0; i < rounds; i++) {
        if (remeasure(ts, c, &ec) != CLI_OK)
            return CLI_FAIL;
        if (eb && same_path(&ec->path, &eb->path)) {
            printf("  T=%lld %-22s runs the best's code path: not kept\n", (long long)ts->T, what);
            fflush(stdout);
            return CLI_OK;
        }
        if (remeasure(ts, best, &eb) != CLI_OK)
            return CLI_FAIL;
    }
    const int keep = ec->best_ms < eb->best_ms * (1.0 - TUNE_MARGIN);
    printf("  T=%lld %-22s %10.3f ms vs %10.3f ms%s\n", (long long)ts->T, what, ec->best_ms, eb->best_ms,
           keep ? "  (kept)" : "");
    fflush(stdout);
    if (keep)
        *best = *c;
    return CLI_OK;
}

static int tune_one(cli_bench *b, int64_t T, int rounds, tune_result *r)
{
    const moe_layer_desc *d = moe_plan_desc(cli_bench_plan(b));
    const int64_t K = d->top_k, E = d->num_experts;
    static tune_state ts; /* large: not on the stack */
    memset(&ts, 0, sizeof ts);
    ts.b = b;
    ts.T = T;
    tune_knobs def, best, c;
    default_knobs(&def);
    best = def;
    char what[64];
    memset(r, 0, sizeof *r);
    r->T = T;
    tune_seen *e = NULL;
    if (remeasure(&ts, &def, &e) != CLI_OK)
        return CLI_FAIL;
    printf("  T=%lld %-22s %10.3f ms\n", (long long)T, "defaults", e->best_ms);
    /* permute: the three methods (auto is one of them at each chunk) */
    static const char *const methods[] = {"sort", "onehot", "packed"};
    for (int i = 0; i < 3; i++) {
        c = best;
        c.permute = methods[i];
        snprintf(what, sizeof what, "permute=%s", methods[i]);
        if (try_candidate(&ts, &c, &best, what, rounds) != CLI_OK)
            return CLI_FAIL;
    }
    /* topk */
    c = best;
    c.topk = strcmp(best.topk, "sort") == 0 ? "rowmax" : "sort";
    snprintf(what, sizeof what, "topk=%s", c.topk);
    if (try_candidate(&ts, &c, &best, what, rounds) != CLI_OK)
        return CLI_FAIL;
    /* lowtok_threshold, when a chunk has few rows per expert */
    const int64_t tc = T < best.chunk_size ? T : best.chunk_size;
    static const int64_t lowtoks[] = {0, 2, 8, 16, 64};
    if (tc * K < 64 * E)
        for (int i = 0; i < 5; i++) {
            if (lowtoks[i] == best.lowtok_threshold)
                continue;
            c = best;
            c.lowtok_threshold = lowtoks[i];
            snprintf(what, sizeof what, "lowtok_threshold=%lld", (long long)lowtoks[i]);
            if (try_candidate(&ts, &c, &best, what, rounds) != CLI_OK)
                return CLI_FAIL;
        }
    /* chunk_size: a quarter to four times the chunk this T runs, at least 64, at most T */
    const int64_t ec = T < best.chunk_size ? T : best.chunk_size;
    int64_t tried[4];
    int nt = 0;
    const int64_t cands[] = {ec / 4, ec / 2, ec * 2, ec * 4};
    for (int i = 0; i < 4; i++) {
        int64_t cs = cands[i] > T ? T : cands[i];
        if (cs < 64 || cs == ec)
            continue;
        int dup = 0;
        for (int j = 0; j < nt; j++)
            dup |= tried[j] == cs;
        if (dup)
            continue;
        tried[nt++] = cs;
        c = best;
        c.chunk_size = cs;
        snprintf(what, sizeof what, "chunk_size=%lld", (long long)cs);
        if (try_candidate(&ts, &c, &best, what, rounds) != CLI_OK)
            return CLI_FAIL;
    }
    /* the defaults and the tuned knobs again, interleaved (nothing to compare when the same) */
    tune_seen *ed = find_seen(&ts, &def), *et = find_seen(&ts, &best);
    for (int round = 0; !same_knobs(&best, &def) && round < rounds + 1; round++)
        if (remeasure(&ts, &def, &ed) != CLI_OK || remeasure(&ts, &best, &et) != CLI_OK)
            return CLI_FAIL;
    r->kept_default = !(et->best_ms < ed->best_ms);
    r->knobs = r->kept_default ? def : best;
    r->default_ms = ed->best_ms;
    r->tuned_ms = r->kept_default ? ed->best_ms : et->best_ms;
    r->default_median_ms = ed->median_ms;
    r->tuned_median_ms = r->kept_default ? ed->median_ms : et->median_ms;
    r->measurements = ts.measurements;
    char kt[256];
    knobs_text(&r->knobs, kt, sizeof kt);
    printf("T=%lld: %s; defaults %.3f ms, tuned %.3f ms (%.3fx; fastest runs)%s\n", (long long)T, kt, r->default_ms,
           et->best_ms, r->default_ms / et->best_ms,
           same_knobs(&best, &def) ? ": no candidate was faster, the defaults are kept"
           : r->kept_default        ? ": not faster in the end, the defaults are kept"
                                    : "");
    fflush(stdout);
    return CLI_OK;
}

static int cmp_result(const void *a, const void *b)
{
    const tune_result *x = a, *y = b;
    return (x->T > y->T) - (x->T < y->T);
}

/* The file, written to a temporary name in dir and renamed over the final one. */
static int write_file(cli_bench *b, const char *dir, const char *name, tune_result *res, int n, int rounds)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp%ld", dir, name, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        cli_err(CMD, "%s: cannot create: %s", tmp, strerror(errno));
        return CLI_FAIL;
    }
    qsort(res, (size_t)n, sizeof *res, cmp_result);
    errno = 0;
    fputs("{\n", f);
    for (int i = 0; i < n; i++) {
        const tune_knobs *k = &res[i].knobs;
        fprintf(f,
                "  \"%lld\": {\"chunk_size\": %lld, \"permute\": \"%s\", \"onehot_threshold\": %lld, \"topk\": \"%s\", "
                "\"lowtok_threshold\": %lld},\n",
                (long long)res[i].T, (long long)k->chunk_size, k->permute, (long long)k->onehot_threshold, k->topk,
                (long long)k->lowtok_threshold);
    }
    char date[32], layer[600];
    time_t now = time(NULL);
    struct tm tmv;
    gmtime_r(&now, &tmv);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    cli_bench_layer_name(b, layer, sizeof layer);
    moe_ctx *ctx = cli_bench_ctx(b);
    fputs("  \"meta\": {\"tool\": \"moe tune\", \"libmoe_version\": ", f);
    cli_json_string(f, moe_version_string());
    fputs(", \"date\": ", f);
    cli_json_string(f, date);
    fputs(", \"layer\": ", f);
    cli_json_string(f, layer);
    fputs(", \"isa\": ", f);
    cli_json_string(f, moe_ctx_isa(ctx));
    fprintf(f, ", \"threads\": %d, \"compute\": ", moe_ctx_num_threads(ctx));
    cli_json_string(f, moe_compute_name(moe_plan_compute(cli_bench_plan(b))));
    fprintf(f, ", \"margin\": %.2f, \"rounds\": %d,\n    \"measured\": {", TUNE_MARGIN, rounds);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n      \"%lld\": {\"default_ms\": ", i ? "," : "", (long long)res[i].T);
        cli_json_number(f, res[i].default_ms);
        fputs(", \"tuned_ms\": ", f);
        cli_json_number(f, res[i].tuned_ms);
        fputs(", \"default_median_ms\": ", f);
        cli_json_number(f, res[i].default_median_ms);
        fputs(", \"tuned_median_ms\": ", f);
        cli_json_number(f, res[i].tuned_median_ms);
        fprintf(f, ", \"kept_default\": %s, \"measurements\": %d}", res[i].kept_default ? "true" : "false",
                res[i].measurements);
    }
    fputs("\n    }\n  }\n}\n", f);
    /* the errno of the failing write (ENOSPC, EIO, ...): the flush's, else the one a failed
     * write left earlier, else the close's */
    int e = fflush(f) != 0 ? errno : ferror(f) ? errno : 0;
    const int bad = ferror(f);
    if (fclose(f) != 0 && !e)
        e = errno;
    if (bad || e) {
        cli_err(CMD, "%s: writing failed: %s", tmp, strerror(e ? e : EIO));
        unlink(tmp);
        return CLI_FAIL;
    }
    if (rename(tmp, path) != 0) {
        cli_err(CMD, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return CLI_FAIL;
    }
    printf("wrote %s\n", path);
    return CLI_OK;
}

static int tune_body(cli_bench *b, void *user)
{
    (void)user;
    const char *dir = cli_bench_output(b);
    if (!dir)
        dir = getenv("MOE_TUNING_DIR");
    struct stat sb;
    if (!dir || !*dir) {
        cli_err(CMD, "no output folder: give --output DIR or set MOE_TUNING_DIR");
        return CLI_USAGE;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        cli_err(CMD, "--output %s: not an existing folder", dir);
        return CLI_USAGE;
    }
    char name[1024];
    if (moe_plan_tuning_name(cli_bench_plan(b), name, sizeof name) != MOE_OK) {
        cli_err(CMD, "%s", moe_ctx_last_error(cli_bench_ctx(b)));
        return CLI_FAIL;
    }
    char layer[600];
    cli_bench_layer_name(b, layer, sizeof layer);
    printf("moe tune: %s, %d threads, kernel table %s; file %s\n", layer, moe_ctx_num_threads(cli_bench_ctx(b)),
           moe_ctx_isa(cli_bench_ctx(b)), name);
    const int n = cli_bench_ntokens(b);
    const int rounds = cli_bench_rounds(b) > 0 ? cli_bench_rounds(b) : TUNE_ROUNDS;
    tune_result res[TUNE_MAX_T];
    int nr = 0;
    for (int i = 0; i < n && nr < TUNE_MAX_T; i++) {
        const int64_t T = cli_bench_tokens(b, i);
        int dup = 0;
        for (int j = 0; j < nr; j++)
            dup |= res[j].T == T;
        if (!dup && tune_one(b, T, rounds, &res[nr++]) != CLI_OK)
            return CLI_FAIL;
    }
    return write_file(b, dir, name, res, nr, rounds);
}

int cli_cmd_tune(int argc, char **argv)
{
    const cli_bench_hook hook = {.cmd = CMD,
                                 .usage = tune_usage,
                                 .tokens = DEFAULT_TOKENS,
                                 .ntokens = (int)(sizeof DEFAULT_TOKENS / sizeof DEFAULT_TOKENS[0]),
                                 .min_time = 0.5,
                                 .body = tune_body,
                                 .user = NULL};
    return cli_bench_main(argc, argv, &hook);
}
