/* Helpers of the `moe` command line: option parsing, machine facts, progress, numbers. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- option parsing ------------------------------------------------------------------- */

void cli_err(const char *cmd, const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "%s: ", cmd);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* under mpirun the line waits for cli_mpi_exit, which prints it once (or per rank) */
    const size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    if (!cli_mpi_defer_err(line))
        fputs(line, stderr);
}

int cli_parse_family(const char *cmd, const char *name, const char *value, void *dst)
{
    if (value[0]) {
        *(const char **)dst = value;
        return 0;
    }
    char list[2048] = ""; /* the family table's names but custom, in enum order */
    size_t used = 0;
    for (int f = 1; f < 256; f++) { /* every moe_family value is below 256; there may be gaps */
        if (strcmp(moe_family_name((moe_family)f), "?") == 0)
            continue;
        int n = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", moe_family_name((moe_family)f));
        if (n < 0 || (size_t)n >= sizeof list - used)
            break;
        used += (size_t)n;
    }
    cli_err(cmd, "%s: empty family name; families: %s", name, list);
    return -1;
}

/* ---- SIGINT / SIGTERM / SIGHUP -------------------------------------------------------- */

volatile sig_atomic_t cli_interrupted;
static volatile sig_atomic_t sig_reraise, sig_deferred;
static char sig_cleanup_path[PATH_MAX + 64]; /* NUL-terminated; "" = nothing to remove */
static volatile sig_atomic_t sig_cleanup_set;

static void die_by(int sig)
{
    if (sig_cleanup_set)
        unlink(sig_cleanup_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_signal(int sig)
{
    cli_interrupted = sig;
    if (sig_reraise && !sig_deferred)
        die_by(sig);
}

void cli_signal_catch(int reraise)
{
    sig_reraise = reraise;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT); /* one handler at a time */
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGHUP);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int cli_signal_cleanup(const char *path)
{
    sig_cleanup_set = 0; /* the handler never reads a half-copied path */
    if (!path || !path[0]) {
        sig_cleanup_path[0] = '\0';
        return 0;
    }
    if (strlen(path) >= sizeof sig_cleanup_path)
        return -1;
    memcpy(sig_cleanup_path, path, strlen(path) + 1);
    sig_cleanup_set = 1;
    return 0;
}

void cli_signal_defer(int on)
{
    sig_deferred = on;
    if (!on && sig_reraise && cli_interrupted)
        die_by((int)cli_interrupted);
}

/* The end of the unit of text that starts at s (s[0] is not a space): a word, or a whole
 * parenthesis "(...)" with the word its ')' ends, when that fits in `room` columns. */
static const char *wrap_unit_end(const char *s, size_t room)
{
    const char *w = s;
    while (*w && *w != ' ')
        w++;
    if (s[0] != '(' || memchr(s, ')', (size_t)(w - s)))
        return w;
    const char *close = strchr(s, ')');
    if (!close)
        return w;
    const char *e = close;
    while (*e && *e != ' ')
        e++;
    return (size_t)(e - s) <= room ? e : w;
}

void cli_print_wrapped(FILE *f, const char *text, int indent, int width)
{
    const size_t room = width > indent ? (size_t)(width - indent) : 1;
    size_t col = 0; /* columns used after the indent on this line */
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        const char *e = wrap_unit_end(p, room);
        /* a parenthesis that fits on a line but not on this one moves to the next whole;
         * otherwise word by word */
        const size_t len = (size_t)(e - p);
        if (col > 0 && col + 1 + len > room) {
            fprintf(f, "\n%*s", indent, "");
            col = 0;
        }
        if (col > 0) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, len, f);
        col += len;
        p = e;
    }
    fputc('\n', f);
}

/* Walks argv[1..] for cli_parse_opts: options are "--name VALUE" or "--name=VALUE" or
 * flags "--name". */
typedef struct cli_args {
    int argc;
    char **argv;
    int i;               /* next index */
    const char *cmd;     /* "moe run", for messages */
    const char *opt;     /* the option being parsed (without "=value") */
    char optbuf[64];
    const char *inline_value; /* value after '=', or NULL */
} cli_args;

static void cli_args_init(cli_args *a, int argc, char **argv, const char *cmd)
{
    memset(a, 0, sizeof *a);
    a->argc = argc;
    a->argv = argv;
    a->i = 1;
    a->cmd = cmd;
}

/* Next option name into a->opt; 0 at the end, 1 for an option, -1 for a stray positional
 * argument (already reported, exit 2). */
static int cli_args_next(cli_args *a)
{
    if (a->i >= a->argc)
        return 0;
    const char *s = a->argv[a->i++];
    a->inline_value = NULL;
    if (s[0] != '-' || s[1] == '\0') {
        cli_err(a->cmd, "unexpected argument '%s' (see '%s --help')", s, a->cmd);
        return -1;
    }
    const char *eq = (s[0] == '-' && s[1] == '-') ? strchr(s, '=') : NULL;
    if (eq) {
        size_t n = (size_t)(eq - s);
        if (n >= sizeof a->optbuf)
            n = sizeof a->optbuf - 1;
        memcpy(a->optbuf, s, n);
        a->optbuf[n] = '\0';
        a->opt = a->optbuf;
        a->inline_value = eq + 1;
    } else {
        a->opt = s;
    }
    return 1;
}

/* 1 if a->opt equals `name` (whether or not "=value" was given). */
static int cli_is(const cli_args *a, const char *name)
{
    return strcmp(a->opt, name) == 0;
}

/* The value of the current option; NULL (reported) when missing. */
static const char *cli_value(cli_args *a)
{
    if (a->inline_value)
        return a->inline_value;
    if (a->i >= a->argc) {
        cli_err(a->cmd, "option %s needs a value (see '%s --help')", a->opt, a->cmd);
        return NULL;
    }
    return a->argv[a->i++];
}

const char *cli_did_you_mean(char *buf, size_t len, const char *word, const char *const *names, size_t n)
{
    const char *s = word ? moe_suggest(word, strlen(word), names, n) : NULL;
    if (s)
        snprintf(buf, len, "; did you mean %s?", s);
    else if (len)
        buf[0] = '\0';
    return buf;
}

void cli_scheme_unknown(const char *cmd, const char *opt, const char *value, const char *const *extra,
                        size_t n_extra, int (*keep)(const char *scheme))
{
    const char *names[64];
    size_t n = 0;
    for (size_t i = 0; i < n_extra && n < 64; i++)
        names[n++] = extra[i];
    for (size_t i = 0; moe_quant_scheme_name(i) && n < 64; i++)
        if (!keep || keep(moe_quant_scheme_name(i)))
            names[n++] = moe_quant_scheme_name(i);
    char hint[96], list[1024];
    size_t used = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    cli_did_you_mean(hint, sizeof hint, value, names, n);
    cli_err(cmd, "%s %s: unknown scheme%s%s accepted: %s", opt, value, hint, hint[0] ? "" : ";", list);
}

/* Report "unknown option" for the current option, with the closest of the command's options.
 * Returns CLI_USAGE. */
static int cli_unknown(const cli_args *a, const cli_opt *opts, size_t n)
{
    const char *names[65];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 64; i++)
        names[k++] = opts[i].name;
    names[k++] = "--help";
    char hint[96];
    cli_err(a->cmd, "unknown option '%s'%s (see '%s --help')", a->opt,
            cli_did_you_mean(hint, sizeof hint, a->opt, names, k), a->cmd);
    return CLI_USAGE;
}

/* Report a flag given "=value". Returns CLI_USAGE. */
static int cli_flag_has_value(const cli_args *a)
{
    cli_err(a->cmd, "option %s takes no value", a->opt);
    return CLI_USAGE;
}

int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi,
                  int64_t *out)
{
    if (!s || !*s || isspace((unsigned char)s[0])) {
        cli_err(cmd, "%s: '%s' is not an integer", opt, s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0') {
        cli_err(cmd, "%s: '%s' is not an integer", opt, s);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        cli_err(cmd, "%s: %s is out of range [%lld, %lld]", opt, s, (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi,
                     double *out)
{
    if (!s || !*s || isspace((unsigned char)s[0])) {
        cli_err(cmd, "%s: '%s' is not a number", opt, s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0') {
        cli_err(cmd, "%s: '%s' is not a number", opt, s);
        return -1;
    }
    if (errno == ERANGE && fabs(v) <= DBL_MIN) { /* underflow: strtod gave 0 or a subnormal */
        cli_err(cmd, "%s: %s underflows (its magnitude is below %g, the smallest normal double)", opt, s, DBL_MIN);
        return -1;
    }
    if (errno == ERANGE || !isfinite(v) || v < lo || v > hi) {
        cli_err(cmd, "%s: %s is out of range [%g, %g]", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_size(const char *cmd, const char *opt, const char *s, uint64_t *out)
{
    if (!s || !*s || isspace((unsigned char)s[0])) {
        cli_err(cmd, "%s: '%s' is not a size", opt, s ? s : "");
        return -1;
    }
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v) || v < 0) {
        cli_err(cmd, "%s: '%s' is not a size (e.g. 16G, 512M)", opt, s);
        return -1;
    }
    double mul = 1.0;
    switch (toupper((unsigned char)*end)) {
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024.0; end++; break;
    case 'G': mul = 1024.0 * 1024.0 * 1024.0; end++; break;
    case 'T': mul = 1024.0 * 1024.0 * 1024.0 * 1024.0; end++; break;
    default: break;
    }
    if (mul > 1.0 && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0') {
        cli_err(cmd, "%s: '%s' is not a size (e.g. 16G, 512M)", opt, s);
        return -1;
    }
    double b = v * mul;
    if (b >= 1.8e19) {
        cli_err(cmd, "%s: %s is too large", opt, s);
        return -1;
    }
    *out = (uint64_t)b;
    return 0;
}

int cli_parse_opts(int argc, char **argv, const char *cmd, const cli_opt *opts, size_t n,
                   void (*usage)(FILE *))
{
    cli_args a;
    cli_args_init(&a, argc, argv, cmd);
    int r;
    while ((r = cli_args_next(&a)) != 0) {
        if (r < 0)
            return CLI_USAGE;
        if (cli_is(&a, "--help") || cli_is(&a, "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        const cli_opt *o = NULL;
        for (size_t k = 0; k < n && !o; k++)
            if (cli_is(&a, opts[k].name))
                o = &opts[k];
        if (!o)
            return cli_unknown(&a, opts, n);
        if (o->kind == CLI_FLAG) {
            if (a.inline_value)
                return cli_flag_has_value(&a);
            *(int *)o->dst = 1;
        } else {
            const char *v = cli_value(&a);
            if (!v)
                return CLI_USAGE;
            if (o->nonempty && !*v) {
                cli_err(cmd, "%s: empty path", o->name);
                return CLI_USAGE;
            }
            int bad = 0;
            switch (o->kind) {
            case CLI_STR: *(const char **)o->dst = v; break;
            case CLI_I64: bad = cli_parse_i64(cmd, o->name, v, o->lo, o->hi, o->dst); break;
            case CLI_F64: bad = cli_parse_double(cmd, o->name, v, o->dlo, o->dhi, o->dst); break;
            case CLI_SIZE: bad = cli_parse_size(cmd, o->name, v, o->dst); break;
            case CLI_CUSTOM: bad = o->parse(cmd, o->name, v, o->dst); break;
            case CLI_FLAG: break;
            }
            if (bad)
                return CLI_USAGE;
        }
        if (o->seen)
            *o->seen = 1;
    }
    return CLI_GO_ON;
}

/* ---- machine facts --------------------------------------------------------------------- */

uint64_t cli_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long v;
        if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
            kb = v;
            break;
        }
    }
    fclose(f);
    return kb * 1024ull;
}

static int read_small_file(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && isspace((unsigned char)buf[n - 1]))
        buf[--n] = '\0';
    return n > 0 ? 0 : -1;
}

uint64_t cli_llc_sysfs(int *level)
{
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (read_small_file(path, buf, sizeof buf) != 0)
            continue;
        int lv = atoi(buf);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (read_small_file(path, buf, sizeof buf) == 0 && strcmp(buf, "Instruction") == 0)
            continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (read_small_file(path, buf, sizeof buf) != 0)
            continue;
        char *end = NULL;
        unsigned long long v = strtoull(buf, &end, 10);
        uint64_t bytes = v;
        if (end && (*end == 'K' || *end == 'k'))
            bytes = v * 1024ull;
        else if (end && (*end == 'M' || *end == 'm'))
            bytes = v * 1024ull * 1024ull;
        else if (end && (*end == 'G' || *end == 'g'))
            bytes = v * 1024ull * 1024ull * 1024ull;
        if (lv > best_level || (lv == best_level && bytes > best)) {
            best_level = lv;
            best = bytes;
        }
    }
    if (level)
        *level = best_level;
    return best;
}

/* ---- time and progress ----------------------------------------------------------------- */

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_start(cli_progress *p)
{
    p->start = cli_now();
    p->last = 0.0;
    p->tty = isatty(STDERR_FILENO);
    p->shown = 0;
    /* progress is for a person watching: into a log or a pipe it would only interleave with
     * the results, so without a terminal on stderr there is none */
    p->quiet = !p->tty;
}

void cli_progress_update(cli_progress *p, const char *fmt, ...)
{
    if (p->quiet)
        return;
    double now = cli_now();
    if (now - p->start < 1.0)
        return;
    const double interval = 0.1;
    if (p->last != 0.0 && now - p->last < interval)
        return;
    p->last = now;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\r\033[K%s", msg);
    p->shown = 1;
    fflush(stderr);
}

void cli_progress_end(cli_progress *p)
{
    if (p->tty && p->shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    p->shown = 0;
}

/* ---- numbers --------------------------------------------------------------------------- */

uint64_t cli_splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint16_t cli_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

uint16_t cli_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* Inf or NaN */
        if (ax == 0x7f800000u)
            return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (ax <= 0x33000000u) /* <= 2^-25: rounds to zero (the tie goes to even 0) */
            return (uint16_t)sign;
        uint32_t e = ax >> 23;                     /* 102 .. 112 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u; /* 24-bit significand */
        uint32_t shift = 126u - e;                 /* 14 .. 24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

const char *cli_fmt_bytes(char *buf, size_t len, double bytes)
{
    if (bytes >= 1e12)
        snprintf(buf, len, "%.2f TB", bytes / 1e12);
    else if (bytes >= 1e9)
        snprintf(buf, len, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        snprintf(buf, len, "%.1f MB", bytes / 1e6);
    else if (bytes >= 1e3)
        snprintf(buf, len, "%.1f kB", bytes / 1e3);
    else
        snprintf(buf, len, "%.0f B", bytes);
    return buf;
}

void cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

void cli_json_number(FILE *f, double v)
{
    if (!isfinite(v)) {
        fputs("null", f);
        return;
    }
    if (v == floor(v) && fabs(v) < 9007199254740992.0)
        fprintf(f, "%.0f", v);
    else
        fprintf(f, "%.6g", v);
}

int cli_parse_i64_list(const char *cmd, const char *name, const char *s, int64_t lo, int64_t hi, int64_t *out,
                       int max, int *n)
{
    *n = 0;
    const char *p = s;
    if (!*p) {
        cli_err(cmd, "%s: empty list", name);
        return -1;
    }
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof item) {
            cli_err(cmd, "%s: '%s' is not a comma-separated list of integers", name, s);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (*n == max) {
            cli_err(cmd, "%s: at most %d items", name, max);
            return -1;
        }
        if (cli_parse_i64(cmd, name, item, lo, hi, &out[*n]) != 0)
            return -1;
        (*n)++;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

int cli_parse_compute(const char *cmd, const char *name, const char *value, void *dst)
{
    if (moe_compute_from_name(value, dst) != MOE_OK) {
        cli_err(cmd, "%s %s: accepted values are f32 (the default: f32 activations and products) and bf16 (bf16 "
                "activations, f32 accumulation: what a bf16 model computes)", name, value);
        return -1;
    }
    return 0;
}

int cli_check_output_path(const char *cmd, const char *opt, const char *path, char *resolved, size_t len)
{
    snprintf(resolved, len, "%s", path);
    struct stat so;
    if (lstat(path, &so) != 0) {
        if (errno != ENOENT) {
            cli_err(cmd, "%s %s: %s", opt, path, strerror(errno));
            return -1;
        }
        /* the folder the file goes in must exist (the temporary file is made there) */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (!slash)
            return 0; /* the current folder */
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
        struct stat sd;
        if (stat(dir, &sd) != 0) {
            if (errno == ENOENT)
                cli_err(cmd, "%s %s: the folder %s does not exist", opt, path, dir);
            else
                cli_err(cmd, "%s %s: the folder %s: %s", opt, path, dir, strerror(errno));
            return -1;
        }
        if (!S_ISDIR(sd.st_mode)) {
            cli_err(cmd, "%s %s: %s is not a folder", opt, path, dir);
            return -1;
        }
        return 0;
    }
    if (S_ISLNK(so.st_mode)) {
        char real[PATH_MAX];
        if (!realpath(path, real) || stat(real, &so) != 0) {
            cli_err(cmd, "%s %s: a symlink whose target cannot be resolved (%s)", opt, path, strerror(errno));
            return -1;
        }
        snprintf(resolved, len, "%s", real);
    }
    if (!S_ISREG(so.st_mode)) {
        cli_err(cmd, "%s %s: exists and is not a regular file (%s); refusing to replace it", opt, path,
                S_ISDIR(so.st_mode) ? "a folder" : S_ISFIFO(so.st_mode) ? "a FIFO"
                : (S_ISCHR(so.st_mode) || S_ISBLK(so.st_mode)) ? "a device" : "not a plain file");
        return -1;
    }
    return 0;
}
