/* The bench machinery as `moe tune` (tools/tune.c) uses it: bench's command line, layer,
 * weight copies and input rings (tools/bench.c), with the tuner's body in place of bench's
 * rows. */
#ifndef MOE_TOOLS_BENCH_H
#define MOE_TOOLS_BENCH_H

#include "moe.h"

#include <stdio.h>

typedef struct bench_state cli_bench;

typedef struct cli_bench_hook {
    const char *cmd;              /* "moe tune": the prefix of messages */
    void (*usage)(FILE *f);       /* --help */
    const int64_t *tokens;        /* default --tokens */
    int ntokens;
    double min_time;              /* default --min-time, seconds per measurement */
    int (*body)(cli_bench *b, void *user); /* runs once the layer is packed; returns an exit code */
    void *user;
} cli_bench_hook;

/* `moe bench` (hook NULL), or its command line and setup under hook (its ctx reads no tuning
 * file). Returns an exit code. */
int cli_bench_main(int argc, char **argv, const cli_bench_hook *hook);

/* The bench's context (threads, ISA; knobs at their defaults but for num_threads), plan (the
 * layer and compute, default knobs), and what the command line gave. */
moe_ctx *cli_bench_ctx(const cli_bench *b);
const moe_plan *cli_bench_plan(const cli_bench *b);
int cli_bench_ntokens(const cli_bench *b);
int64_t cli_bench_tokens(const cli_bench *b, int i);
const char *cli_bench_output(const cli_bench *b); /* --output, or NULL */
int cli_bench_rounds(const cli_bench *b);         /* --rounds, or 0 */
/* "qwen3-30b-a3b" or "CKPT layer L" */
void cli_bench_layer_name(const cli_bench *b, char *out, size_t len);

/* Time forwards of T tokens on plan (created on ctx for the bench's layer description, with
 * the bench's compute), over the bench's packed weights and input ring, as a bench row does:
 * one warm-up, then --iters runs or enough for --min-time (3 to 50): their median and best
 * (fastest) ms. *stats: the last forward's. Returns an exit code (the error printed). */
int cli_bench_time(cli_bench *b, moe_ctx *ctx, const moe_plan *plan, int64_t T, double *median_ms, double *best_ms,
                   int *runs, moe_exec_stats *stats);

#endif
