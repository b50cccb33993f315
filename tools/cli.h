/* The `moe` command line: shared helpers. The tool uses only the public API (moe.h). */
#ifndef MOE_TOOLS_CLI_H
#define MOE_TOOLS_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe.h"

#if defined(__GNUC__)
#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CLI_PRINTF(a, b)
#endif

/* Exit codes of every subcommand; CLI_GO_ON (never an exit code): cli_parse_opts found
 * nothing that ends the command. */
enum { CLI_GO_ON = -1, CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Subcommands (each returns an exit code). argv[0] is the subcommand name. */
int cli_cmd_run(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_env(int argc, char **argv);
int cli_cmd_plan(int argc, char **argv);
int cli_cmd_quantize(int argc, char **argv);
int cli_cmd_tune(int argc, char **argv);

/* ---- option parsing ------------------------------------------------------------------- */

/* What an option's value is, and so what cli_opt.dst points to. */
typedef enum cli_opt_kind {
    CLI_FLAG,   /* no value ("--name=VALUE" is refused); int *dst = 1 */
    CLI_STR,    /* const char **dst = the value, as it stands in argv */
    CLI_I64,    /* int64_t *dst = an integer in [lo, hi] (cli_parse_i64) */
    CLI_F64,    /* double *dst = a number in [dlo, dhi] (cli_parse_double) */
    CLI_SIZE,   /* uint64_t *dst = a byte size such as 16G (cli_parse_size) */
    CLI_CUSTOM, /* parse(cmd, name, value, dst) checks and stores the value */
} cli_opt_kind;

/* One row of a subcommand's option table: one option "--name", its kind, where its value
 * goes (a variable or a field of the command's own options) and how it is checked. Rows
 * are written with designated initializers; the fields a row does not name are zero. */
typedef struct cli_opt {
    const char *name;  /* "--threads": matched exactly, as "--name VALUE" or "--name=VALUE" */
    cli_opt_kind kind;
    void *dst;         /* where the value goes (type: see cli_opt_kind) */
    int64_t lo, hi;    /* CLI_I64: the accepted range */
    double dlo, dhi;   /* CLI_F64: the accepted range */
    /* CLI_CUSTOM: checks `value` and stores it through dst; 0 on success, -1 after reporting
     * the error with cli_err(cmd, ...) */
    int (*parse)(const char *cmd, const char *name, const char *value, void *dst);
    int *seen;         /* NULL, or set to 1 once the option has been given */
    int nonempty;      /* 1: an empty value is refused ("--name: empty path") */
} cli_opt;

/* A subcommand's command line: argv[1..] parsed against opts[0..n) (opts may be NULL when
 * n is 0). Options may repeat (the last one wins); their values are checked and stored in
 * the order given, so the first bad one is the one reported. -h / --help (also
 * "--help=...") prints usage(stdout). Returns CLI_GO_ON when the command should go on,
 * CLI_OK after --help, CLI_USAGE after an error reported on stderr as "CMD: ...": an
 * unknown option, a stray positional argument, a missing value, a flag given "=VALUE", or
 * a value that is not accepted. */
int cli_parse_opts(int argc, char **argv, const char *cmd, const cli_opt *opts, size_t n,
                   void (*usage)(FILE *));
#define CLI_NOPTS(table) (sizeof(table) / sizeof((table)[0]))

/* Check, before any work, that `path` (the value of option `opt`) can be written atomically
 * (a temporary file in its folder renamed over it): it does not exist and its folder does, or
 * it is a regular file or a symlink to one (followed: *resolved gets the file to write, else
 * path itself). A folder, FIFO or device is refused, since the rename would replace it.
 * Returns 0, or -1 after "CMD: OPT PATH: ..." on stderr. */
int cli_check_output_path(const char *cmd, const char *opt, const char *path, char *resolved, size_t len);

/* CLI_CUSTOM parser of --family NAME into a const char * (the library checks the name and
 * lists the families for an unknown one); an empty name is refused here, listing them. */
int cli_parse_family(const char *cmd, const char *name, const char *value, void *dst);

/* CLI_CUSTOM parser of --compute f32|bf16 into a moe_compute (moe.h). */
int cli_parse_compute(const char *cmd, const char *name, const char *value, void *dst);

/* Strict numeric parsing: the whole string, no leading space, in [lo, hi]. On failure
 * print "CMD: OPT: ..." and return -1. */
int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi,
                  int64_t *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                     double *out);
/* A comma-separated list of integers in [lo, hi] (token counts, layer numbers) into out [max];
 * *n gets the count. An empty list or item, more than max items, or a bad item is reported ("CMD: NAME: ...")
 * and gives -1. */
int cli_parse_i64_list(const char *cmd, const char *name, const char *s, int64_t lo, int64_t hi, int64_t *out,
                       int max, int *n);
/* A byte size: a number with an optional K, M, G or T suffix (powers of 1024), optional
 * trailing 'B' / "iB". */
int cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t *out);

/* "; did you mean NAME?" into buf when moe_suggest finds a name of names[0, n) close to word,
 * else "" (for an "unknown ..." message). Returns buf. */
const char *cli_did_you_mean(char *buf, size_t len, const char *word, const char *const *names, size_t n);

/* The width of the help texts: no line of `moe help` or `moe CMD --help` is wider. */
enum { CLI_HELP_WIDTH = 100 };

/* `text` on f from column `indent` (the caller has printed the first line's first `indent`
 * columns), wrapped at spaces so that no line is wider than `width`; each further line is
 * indented by `indent` spaces. A parenthesis "(...)" is kept on one line whenever it fits in
 * one. Ends with a newline. */
void cli_print_wrapped(FILE *f, const char *text, int indent, int width);

/* Report an unknown --quant value on stderr: "CMD: OPT VALUE: unknown scheme; did you mean X?;
 * accepted: ...", the accepted names being extra[0, n_extra) (dtypes, "none") and the
 * library's schemes (moe_quant_scheme_name) for which keep (NULL: all) returns 1. */
void cli_scheme_unknown(const char *cmd, const char *opt, const char *value, const char *const *extra,
                        size_t n_extra, int (*keep)(const char *scheme));

/* Error message to stderr with the command prefix. */
void cli_err(const char *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);

/* ---- SIGINT / SIGTERM / SIGHUP -------------------------------------------------------- */
/* The signal caught (0: none); `moe quantize` hands it to the library as its cancel flag. */
extern volatile sig_atomic_t cli_interrupted;
/* Installs one handler for SIGINT, SIGTERM and SIGHUP. reraise 0: the handler only records
 * the signal in cli_interrupted (the caller polls it). reraise 1: it unlinks the file named
 * by cli_signal_cleanup (if any) and re-raises the signal with the default action, so the
 * process ends by the signal; between cli_signal_defer(1) and cli_signal_defer(0) it only
 * records the signal, and cli_signal_defer(0) acts on a recorded one. Async-signal-safe: the
 * handler calls only unlink, signal and raise. */
void cli_signal_catch(int reraise);
/* The file the handler removes (NULL or "": none); at most PATH_MAX + 63 bytes, else -1. */
int cli_signal_cleanup(const char *path);
/* on 1: record signals without acting (a library call that must not be cut off);
 * on 0: act now on one recorded meanwhile. */
void cli_signal_defer(int on);

/* ---- MPI (tools/mpi.c) ------------------------------------------------------------------ */

/* Initialize MPI when argv asks for --ep / --tp > 1 or the process was launched by mpirun;
 * -1 (reported) on failure or when MPI is asked for but not built in. */
int cli_mpi_init(int *argc, char ***argv);
void cli_mpi_finalize(void);
int cli_mpi_rank(void); /* 0 without MPI */
int cli_mpi_size(void); /* 1 without MPI */
/* End the whole job with `code` (MPI_Abort) when running on several ranks; else return. */
void cli_mpi_abort(int code);
/* On a multi-rank run, hold back an error line (cli_err's) for cli_mpi_exit: 1 when held, 0 when
 * the caller prints it now (one process). */
int cli_mpi_defer_err(const char *line);
/* The end of a command: on a multi-rank run the ranks agree on the worst exit status (on a
 * communicator of their own), rank 0 prints the held-back error lines once when every rank has
 * the same, else each with "rank N: ", and the job ends with MPI_Finalize and that status; a
 * failing rank whose peers do not arrive within 10 s (stuck in a collective) prints its own
 * lines and ends the job with MPI_Abort. Returns the exit status. */
int cli_mpi_exit(int rc);
void cli_mpi_barrier(void);
/* Rank 0 gets every rank's n doubles in rank order (all: [size, n]); one process: a copy. */
void cli_mpi_gather_doubles(const double *v, int n, double *all);
/* Rows [row0, row0 + nrows) of every rank's buf (the same [rows, row_bytes] layout on every
 * rank) land at their place in rank 0's buf. 0 on success. */
int cli_mpi_gather_rows(void *buf, size_t row_bytes, int64_t row0, int64_t nrows);
/* Every rank's line printed by rank 0 in rank order (one process: printed). */
void cli_mpi_print_ordered(const char *line);

/* `moe bench --ep N --tp M` (tools/bench_par.c): 1 when argv asks for it. */
int cli_bench_parallel_wanted(int argc, char **argv);
int cli_bench_parallel(int argc, char **argv);

/* ---- machine facts --------------------------------------------------------------------- */

/* MemAvailable from /proc/meminfo in bytes; 0 when unknown. */
uint64_t cli_mem_available(void);
/* Size in bytes of the last-level cache from sysfs (highest cache level of cpu0); 0 when
 * unknown. *level gets its level. */
uint64_t cli_llc_sysfs(int *level);

/* ---- time and progress ----------------------------------------------------------------- */

double cli_now(void); /* monotonic seconds */

/* Progress on stderr for anything that takes over a second, only when stderr is a terminal:
 * one line updated in place with \r (at most every 0.1 s) and cleared at the end. Into a log
 * or a pipe nothing is printed, so progress never interleaves with results. */
typedef struct cli_progress {
    double start;
    double last;
    int tty;
    int shown; /* something printed on the current tty line */
    int quiet;
} cli_progress;

void cli_progress_start(cli_progress *p);
/* Print when over a second has passed since start (and the rate limit allows). */
void cli_progress_update(cli_progress *p, const char *fmt, ...) CLI_PRINTF(2, 3);
/* Clear the in-place line, if any. */
void cli_progress_end(cli_progress *p);

/* ---- numbers --------------------------------------------------------------------------- */

uint64_t cli_splitmix64(uint64_t x);
/* Uniform in [-1, 1) from (seed, index), counter-based. */
static inline float cli_uniform_pm1(uint64_t seed, uint64_t index)
{
    uint64_t z = cli_splitmix64(seed * 0x9E3779B97F4A7C15ull + index);
    return (float)((double)(z >> 40) * (2.0 / 16777216.0) - 1.0);
}
uint16_t cli_f32_to_bf16(float f); /* round to nearest even; NaN stays NaN */
uint16_t cli_f32_to_f16(float f);  /* round to nearest even, subnormals, overflow to Inf */

/* "1.21 GB" style (decimal units) into buf. */
const char *cli_fmt_bytes(char *buf, size_t len, double bytes);

/* JSON string literal (with quotes) of `s` on `f`. */
void cli_json_string(FILE *f, const char *s);
/* A JSON number, or null when not finite. */
void cli_json_number(FILE *f, double v);

#endif
