/* `moe bench --ep N --tp M`: one MoE layer forward under expert / tensor parallelism, under
 * mpirun -np N*M (--ep 1 --tp 1 runs the same measurement in one process, the baseline).
 *
 * Each rank generates and packs only its share of the embedded model's weights (its experts,
 * its I columns; values are a function of (seed, tensor, element), so the ranks agree), and
 * every EP rank brings its own T tokens per forward (a TP group shares them). Per T: the
 * forward time (median over the iterations on each rank, the slowest rank's), and from
 * moe_exec_stats the dispatch, combine and TP-reduce seconds (mean over ranks, per forward)
 * and the bytes each rank sent to the others per token. The per-rank lines give the resident
 * expert bytes (moe_weights_expert_bytes). */
#include "cli.h"
#include "models.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const CMD = "moe bench";

#define MAX_T 32

int cli_bench_parallel_wanted(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--ep") || !strcmp(argv[i], "--tp") || !strncmp(argv[i], "--ep=", 5) ||
            !strncmp(argv[i], "--tp=", 5))
            return 1;
    return 0;
}

static void usage(FILE *f)
{
    fputs("usage: mpirun -np N*M moe bench --ep N [--tp M] [options]\n"
          "       moe bench --ep 1 [options]         (the same measurement in one process)\n"
          "\n"
          "One MoE layer of an embedded model under expert parallelism (--ep: experts placed\n"
          "E/N per rank, the first E%N ranks one more; each EP rank brings its own T tokens)\n"
          "and tensor parallelism (--tp: I split across the ranks, partial outputs summed in\n"
          "rank order). Each rank generates and packs only its own share of the weights.\n"
          "\n"
          "Options:\n"
          "  --ep N               expert-parallel ranks (default 1)\n"
          "  --tp M               tensor-parallel ranks (default 1)\n"
          "  --model NAME         an embedded model (moe bench --list-models); default qwen3-30b-a3b\n"
          "  --num-experts N      override E (keeps H, I, K)\n"
          "  --dtype D            bf16 (default), f16 or f32 weights\n"
          "  --tokens LIST        tokens per EP rank per forward (default 1,256)\n"
          "  --threads N          worker threads per rank (default: MOE_NUM_THREADS, else 1)\n"
          "  --iters N            timed forwards per T (default 20, after 2 warm-ups)\n"
          "  --low-latency        the batched format (one MPI_Alltoall of fixed slot blocks)\n"
          "  --capacity N         batched slots per expert and source rank (default: the\n"
          "                       largest T, at most 256)\n"
          "  --dispatch-dtype D   f32 (default, exact), fp8 (e4m3) or int8 activations on the wire\n"
          "  --compute C          the expert GEMMs' arithmetic: f32 (default) or bf16 (bf16\n"
          "                       activations, f32 accumulation; moe_plan_config.compute)\n"
          "  --seed N             weights and inputs (default 1)\n"
          "  --skew HOT:SHARE     skewed routing: router logits (given to the execute) biased so\n"
          "                       experts 0..HOT-1 take about SHARE of the (token, k) rows, the\n"
          "                       rest spread evenly; deterministic (e.g. 8:0.5); 1 <= HOT < E,\n"
          "                       0 <= SHARE <= HOT / top_k\n"
          "  --load-out FILE      write the expert load gathered over the EP group, summed over\n"
          "                       every timed forward (moe_plan_gather_load; a load file for\n"
          "                       moe plan --load)\n"
          "  --placement LIST     EP expert placements to run, one after the other in this run,\n"
          "                       comma-separated: contiguous (default), round_robin, balanced,\n"
          "                       or a placement file (docs/parallel.md); e.g. contiguous,balanced\n"
          "  --redundant R        with balanced: R redundant experts (replicas), default 0\n"
          "  --load FILE          with balanced: the expert load to balance (a load file); without\n"
          "                       it, balanced uses the load measured by the placements before it\n"
          "                       in the list (the routing does not depend on the placement)\n"
          "  --rebalance POLICY   after the timed forwards, move the first placement's plan in place\n"
          "                       (moe_plan_rebalance) to POLICY (contiguous, round_robin or\n"
          "                       balanced with --redundant R, on the load of the timed forwards);\n"
          "                       per rank the experts kept / packed / dropped, bytes packed and\n"
          "                       seconds, then per T the forward again (needs --ep > 1)\n"
          "  -h, --help           this text\n"
          "\n"
          "Per rank (in rank order): its experts, I shard and resident expert bytes\n"
          "(moe_weights_expert_bytes), and the packing time. Per T: forward ms (median per\n"
          "rank, the slowest rank), dispatch / combine / TP-reduce ms (mean over ranks, per\n"
          "forward, waiting included), and the bytes sent to other ranks per token (dispatch +\n"
          "combine + TP reduce, summed over ranks, over all ranks' tokens). Under --ep, per T\n"
          "also the rows each EP rank's experts received per forward, the imbalance (max\n"
          "rank rows / mean) and the time lost to it: the slowest rank's expert time minus the\n"
          "mean (expert time: forward minus dispatch, combine and TP reduce, mean per forward).\n"
          "With several placements, a closing table compares them per T.\n",
          f);
}

static int parse_list(const char *s, int64_t *v, int *n)
{
    return cli_parse_i64_list(CMD, "--tokens", s, 1, (int64_t)1 << 20, v, MAX_T, n);
}

/* --dtype D (the weights: f32, bf16, f16) or --dispatch-dtype D (activations on the wire:
 * f32, fp8, int8); a cli_opt parse: dst is the moe_dtype. */
static int parse_dtype(const char *cmd, const char *name, const char *v, void *dst)
{
    const int disp = strcmp(name, "--dispatch-dtype") == 0;
    moe_dtype *to = dst;
    if (!strcmp(v, "f32"))
        *to = MOE_DTYPE_F32;
    else if (!disp && !strcmp(v, "bf16"))
        *to = MOE_DTYPE_BF16;
    else if (!disp && !strcmp(v, "f16"))
        *to = MOE_DTYPE_F16;
    else if (disp && !strcmp(v, "fp8"))
        *to = MOE_DTYPE_F8_E4M3;
    else if (disp && !strcmp(v, "int8"))
        *to = MOE_DTYPE_I8;
    else {
        cli_err(cmd, "%s: '%s' is not one of %s", name, v, disp ? "f32, fp8, int8" : "f32, bf16, f16");
        return -1;
    }
    return 0;
}

/* n values of tensor `tid` in dtype dt into buf: scale * uniform(-1, 1), a function of (seed,
 * tid, index) only, so every rank generates the same tensor. */
static void fill(void *buf, moe_dtype dt, size_t n, uint64_t seed, uint64_t tid, float scale)
{
    const uint64_t s = seed * 1000003ull + tid;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = scale * cli_uniform_pm1(s, i);
        if (dt == MOE_DTYPE_F32)
            ((float *)buf)[i] = v;
        else if (dt == MOE_DTYPE_BF16)
            ((uint16_t *)buf)[i] = cli_f32_to_bf16(v);
        else
            ((uint16_t *)buf)[i] = cli_f32_to_f16(v);
    }
}

/* --skew HOT:SHARE: HOT an integer >= 1 (below E and at least SHARE * K: checked once the
 * model is known), SHARE a number in [0, 1]; each part as strict as the integer and number
 * options (no leading space, no overflow or underflow: cli_parse_i64 / cli_parse_double). */
static int parse_skew(const char *s, int64_t *hot, double *share)
{
    const char *colon = strchr(s, ':');
    char h[32];
    if (!colon || colon == s || !colon[1] || (size_t)(colon - s) >= sizeof h || strchr(colon + 1, ':')) {
        cli_err(CMD, "--skew '%s': expected HOT:SHARE, e.g. 8:0.5 (the HOT >= 1 hottest experts take SHARE of the rows)",
                s);
        return -1;
    }
    memcpy(h, s, (size_t)(colon - s));
    h[colon - s] = '\0';
    if (cli_parse_i64(CMD, "--skew HOT", h, 1, (int64_t)1 << 30, hot) != 0 ||
        cli_parse_double(CMD, "--skew SHARE", colon + 1, 0.0, 1.0, share) != 0)
        return -1;
    return 0;
}

/* Router logits [T, E] whose top-K sends about `share` of each rank's rows to experts
 * [0, hot): token t takes h_t of its K experts among the hot ones (h_t by error diffusion, so
 * the mean is share * K), chosen by a hash of (seed, t), the others by noise in [0, 1). */
static void skew_logits(float *lg, int64_t T, int64_t E, int64_t K, int64_t hot, double share, uint64_t seed)
{
    double acc = 0;
    for (int64_t t = 0; t < T; t++) {
        uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)t * 0xBF58476D1CE4E5B9ull + 1;
        float *row = lg + t * E;
        for (int64_t e = 0; e < E; e++) {
            z ^= z >> 31;
            z *= 0x94D049BB133111EBull;
            z ^= z >> 29;
            row[e] = (float)((z >> 11) & 0xFFFFF) / (float)(1 << 20); /* noise in [0, 1) */
        }
        acc += share * (double)K;
        int64_t h = (int64_t)acc;
        acc -= (double)h;
        if (h > hot)
            h = hot;
        for (int64_t j = 0; j < h; j++) /* hot experts (t + j) mod hot: distinct, as h <= hot */
            row[(t + j) % hot] += 10.0f + (float)j;
        if (h < K) /* the remaining picks stay off the hot experts */
            for (int64_t e = 0; e < hot; e++)
                if (row[e] < 10.0f)
                    row[e] -= 10.0f;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One placement's run: its plan, weights and workspace. */
typedef struct bench_run {
    moe_placement_policy pol;
    int is_file;
    moe_placement pl;  /* the placement (arrays p2l / rn, or file's) */
    moe_placement file;/* a placement file's arrays (owned) */
    int32_t *p2l;      /* [E * ep] physical_to_logical of a built placement */
    int32_t *rn;       /* [ep] rank_num_physical */
    moe_plan *plan;
    moe_weights *w;
    void *ws;          /* [ws_size] */
    size_t ws_size;
} bench_run;

/* One forward of T tokens on run br (every rank arrives first: cli_mpi_barrier); its seconds
 * into *sec and stats into *st (both may be NULL); load [E] counts the routed rows when set. */
static moe_status bench_forward(const bench_run *br, const float *x, int64_t T, float *out, const float *logits,
                                int64_t *load, moe_exec_stats *st, double *sec)
{
    moe_exec_stats local;
    moe_exec_args ea;
    memset(&ea, 0, sizeof ea);
    ea.hidden_states = x;
    ea.hidden_dtype = MOE_DTYPE_F32;
    ea.n_tokens = T;
    ea.output = out;
    ea.workspace = br->ws;
    ea.workspace_size = br->ws_size;
    ea.stats = st ? st : &local;
    ea.router_logits = logits;
    ea.expert_load = load;
    cli_mpi_barrier();
    const double t0 = cli_now();
    const moe_status s = moe_plan_execute_ex(br->plan, br->w, &ea);
    if (sec)
        *sec = cli_now() - t0;
    return s;
}

int cli_bench_parallel(int argc, char **argv)
{
    const char *model = "qwen3-30b-a3b", *tokens = "1,256";
    int64_t ep = 1, tp = 1, num_experts = 0, threads = 0, iters = 20, capacity = 0, seed = 1;
    int low_latency = 0;
    const char *skew = NULL, *load_out = NULL, *placement_arg = "contiguous", *load_in = NULL, *rebal_arg = NULL;
    int64_t skew_hot = 0, redundant = 0;
    double skew_share = 0;
    moe_dtype dt = MOE_DTYPE_BF16, ddt = MOE_DTYPE_F32;
    moe_compute compute = MOE_COMPUTE_F32;
    const int64_t big = (int64_t)1 << 30; /* the upper bound of every integer option */
    const cli_opt opts[] = {
        {.name = "--ep", .kind = CLI_I64, .dst = &ep, .lo = 1, .hi = big},
        {.name = "--tp", .kind = CLI_I64, .dst = &tp, .lo = 1, .hi = big},
        /* an embedded model's name, looked up below */
        {.name = "--model", .kind = CLI_STR, .dst = &model},
        /* 0 (the default): the model's own E */
        {.name = "--num-experts", .kind = CLI_I64, .dst = &num_experts, .lo = 1, .hi = big},
        /* the weights' dtype: f32, bf16 or f16 */
        {.name = "--dtype", .kind = CLI_CUSTOM, .dst = &dt, .parse = parse_dtype},
        /* a comma-separated list, parsed below (parse_list) */
        {.name = "--tokens", .kind = CLI_STR, .dst = &tokens},
        {.name = "--threads", .kind = CLI_I64, .dst = &threads, .lo = 1, .hi = big},
        {.name = "--iters", .kind = CLI_I64, .dst = &iters, .lo = 1, .hi = big},
        {.name = "--low-latency", .kind = CLI_FLAG, .dst = &low_latency},
        /* 0 (the default): the largest T, at most 256 */
        {.name = "--capacity", .kind = CLI_I64, .dst = &capacity, .lo = 1, .hi = big},
        /* activations on the wire: f32, fp8 or int8 */
        {.name = "--dispatch-dtype", .kind = CLI_CUSTOM, .dst = &ddt, .parse = parse_dtype},
        {.name = "--seed", .kind = CLI_I64, .dst = &seed, .lo = 0, .hi = big},
        /* HOT:SHARE, parsed below */
        {.name = "--skew", .kind = CLI_STR, .dst = &skew},
        {.name = "--load-out", .kind = CLI_STR, .dst = &load_out, .nonempty = 1},
        /* comma-separated policies or placement files, run in order */
        {.name = "--placement", .kind = CLI_STR, .dst = &placement_arg},
        {.name = "--redundant", .kind = CLI_I64, .dst = &redundant, .lo = 0, .hi = big},
        {.name = "--load", .kind = CLI_STR, .dst = &load_in},
        /* contiguous, round_robin or balanced, checked below */
        {.name = "--rebalance", .kind = CLI_STR, .dst = &rebal_arg},
        /* f32 / bf16 (cli_parse_compute names the accepted values) */
        {.name = "--compute", .kind = CLI_CUSTOM, .dst = &compute, .parse = cli_parse_compute},
    };
    const int prc = cli_parse_opts(argc, argv, CMD, opts, CLI_NOPTS(opts), usage);
    if (prc != CLI_GO_ON)
        return prc;
    int64_t Ts[MAX_T];
    int nT = 0;
    if (parse_list(tokens, Ts, &nT) != 0)
        return CLI_USAGE;
    if (skew && parse_skew(skew, &skew_hot, &skew_share) != 0)
        return CLI_USAGE;
    const cli_model *m = cli_model_find(model);
    if (!m)
        return cli_model_unknown(CMD, model);
    const int64_t E_arg = num_experts ? num_experts : m->num_experts;
    if (skew && skew_hot >= E_arg) {
        cli_err(CMD, "--skew %s: HOT = %lld must be below the %lld experts (with every expert hot the routing is not "
                "skewed)", skew, (long long)skew_hot, (long long)E_arg);
        return CLI_USAGE;
    }
    /* a token picks K distinct experts, at most HOT of them hot: the hot share is at most HOT / K */
    if (skew && skew_share * (double)m->top_k > (double)skew_hot + 1e-9) {
        cli_err(CMD, "--skew %s: %lld hot expert(s) can take at most %.4g of the rows (each token picks top_k = %lld "
                "distinct experts, at most %lld of them hot): give SHARE <= %.4g or HOT >= %.4g",
                skew, (long long)skew_hot, (double)skew_hot / (double)m->top_k, (long long)m->top_k,
                (long long)skew_hot, (double)skew_hot / (double)m->top_k, ceil(skew_share * (double)m->top_k));
        return CLI_USAGE;
    }
    const int nranks = (int)(ep * tp), rank = cli_mpi_rank();
    if (nranks != cli_mpi_size()) {
        cli_err(CMD, "--ep %lld x --tp %lld = %d ranks, but %d %s running: launch with mpirun -np %d", (long long)ep,
                (long long)tp, nranks, cli_mpi_size(), cli_mpi_size() == 1 ? "process is" : "are", nranks);
        return CLI_USAGE;
    }
    moe_placement_policy rebal_pol = MOE_PLACEMENT_CONTIGUOUS;
    if (rebal_arg) {
        if (!strcmp(rebal_arg, "round_robin"))
            rebal_pol = MOE_PLACEMENT_ROUND_ROBIN;
        else if (!strcmp(rebal_arg, "balanced"))
            rebal_pol = MOE_PLACEMENT_BALANCED;
        else if (strcmp(rebal_arg, "contiguous") != 0) {
            cli_err(CMD, "--rebalance %s: expected contiguous, round_robin or balanced", rebal_arg);
            return CLI_USAGE;
        }
        if (ep < 2) {
            cli_err(CMD, "--rebalance %s needs --ep > 1 (one process has one placement)", rebal_arg);
            return CLI_USAGE;
        }
    }
    /* --load-out is checked before anything runs: a folder that is not there fails now, not
     * after minutes of measuring (rank 0 writes it; every rank sees the same file system) */
    char load_out_resolved[PATH_MAX];
    if (load_out && cli_check_output_path(CMD, "--load-out", load_out, load_out_resolved, sizeof load_out_resolved) != 0)
        return CLI_USAGE;
    int64_t Tmax = 0;
    for (int i = 0; i < nT; i++)
        Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;

    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.family = m->family;
    d.hidden_size = m->hidden_size;
    d.moe_intermediate_size = m->intermediate_size;
    d.num_experts = num_experts ? num_experts : m->num_experts;
    d.top_k = m->top_k;
    d.renormalize = m->renormalize;
    d.routed_scaling_factor = m->routed_scaling_factor;
    d.shared_expert_intermediate_size = m->shared_intermediate_size;
    d.shared_expert_gated = m->shared_gated;
    d.weight_dtype = dt;
    cli_model_routing(m, &d);
    const int64_t H = d.hidden_size, I = d.moe_intermediate_size, E = d.num_experts, K = d.top_k;
    const int64_t Is = d.shared_expert_intermediate_size;

    moe_options o;
    moe_options_init(&o);
    o.num_threads = (int)(threads ? threads : (getenv("MOE_NUM_THREADS") ? 0 : 1));
    moe_ctx *ctx = NULL;
    char err[1024] = "";
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK) {
        cli_err(CMD, "%s", err);
        return CLI_FAIL;
    }
    int rc = CLI_FAIL;
    void *wg = NULL, *wu = NULL, *wd = NULL, *shg = NULL, *shu = NULL, *shd = NULL;
    float *router = NULL, *sgate = NULL, *x = NULL, *out = NULL;
    float *logits = NULL;                    /* --skew: [Tmax, E] router logits */
    int64_t *load = NULL, *load_all = NULL;  /* [E] this rank's expert load, [E] summed over T (gathered) */
    int64_t *load_t = NULL;                  /* [E] the EP group's load of one T */
    int64_t *load_bal = NULL;                /* [E] the load balanced placements follow */
    int32_t *rebal_p2l = NULL, *rebal_rn = NULL; /* --rebalance: [E * ep], [ep] the placement moved to */
    double *times = NULL; /* [iters] seconds per forward */
    char *pl_list = NULL; /* --placement, split at commas */
    enum { MAX_PL = 8 };
    const char *pl_names[MAX_PL];
    int n_pl = 0, have_load = 0;
    bench_run runs[MAX_PL]; /* every placement's plan, weights and workspace */
    memset(runs, 0, sizeof runs);
    double res_fwd[MAX_PL][MAX_T], res_imb[MAX_PL][MAX_T], res_lost[MAX_PL][MAX_T]; /* the closing table */
    const void **gp = calloc((size_t)E, sizeof(void *)), **up = calloc((size_t)E, sizeof(void *));
    const void **dp = calloc((size_t)E, sizeof(void *));
    int32_t *map = malloc(sizeof(int32_t) * (size_t)E);
    pl_list = strdup(placement_arg);
    load_bal = calloc((size_t)E, sizeof *load_bal);
    load_all = calloc((size_t)E, sizeof *load_all);
    if (!gp || !up || !dp || !map || !pl_list || !load_bal || !load_all) {
        cli_err(CMD, "out of memory");
        goto done;
    }
    /* every placement checked before anything runs: a bad one is an error with nothing measured */
    for (char *tok = pl_list, *next; tok; tok = next) {
        /* split at each comma by hand: strtok would skip the empty entry of "a,,b" */
        next = strchr(tok, ',');
        if (next)
            *next++ = '\0';
        if (!*tok) {
            cli_err(CMD, "--placement '%s': an empty entry; give comma-separated contiguous, round_robin, "
                         "balanced or placement files",
                    placement_arg);
            rc = CLI_USAGE;
            goto done;
        }
        if (n_pl == MAX_PL) {
            cli_err(CMD, "--placement %s: at most %d placements", placement_arg, MAX_PL);
            rc = CLI_USAGE;
            goto done;
        }
        pl_names[n_pl++] = tok;
        const int is_policy = !strcmp(tok, "contiguous") || !strcmp(tok, "round_robin") || !strcmp(tok, "balanced");
        if (!is_policy) {
            moe_placement f;
            if (moe_placement_read(ctx, tok, &f) != MOE_OK) {
                cli_err(CMD, "--placement %s: %s (or give contiguous, round_robin or balanced)", tok,
                        moe_ctx_last_error(ctx));
                rc = CLI_USAGE;
                goto done;
            }
            const int ok = f.ep_size == ep && f.num_logical_experts == E;
            if (!ok)
                cli_err(CMD, "--placement %s: the file places %d logical experts on %d ranks, this layout has E %lld "
                             "on --ep %lld",
                        tok, f.num_logical_experts, f.ep_size, (long long)E, (long long)ep);
            moe_placement_clear(&f);
            if (!ok) {
                rc = CLI_USAGE;
                goto done;
            }
        }
    }
    if (n_pl == 0) {
        cli_err(CMD, "--placement '%s': no placement named", placement_arg);
        rc = CLI_USAGE;
        goto done;
    }
    int any_balanced = rebal_pol == MOE_PLACEMENT_BALANCED;
    for (int i = 0; i < n_pl; i++)
        any_balanced |= !strcmp(pl_names[i], "balanced");
    if (redundant && !any_balanced) { /* as moe plan: redundant experts are the balanced policy's */
        cli_err(CMD, "--redundant %lld needs a balanced placement (--placement ...,balanced or --rebalance balanced); "
                     "the others place no redundant experts",
                (long long)redundant);
        rc = CLI_USAGE;
        goto done;
    }
    if (redundant && (redundant > E * (ep - 1))) {
        cli_err(CMD, "--redundant %lld: must be in [0, E * (ep - 1)] = [0, %lld]", (long long)redundant,
                (long long)(E * (ep - 1)));
        rc = CLI_USAGE;
        goto done;
    }
    if (load_in) {
        if (moe_load_read(ctx, load_in, E, load_bal) != MOE_OK) {
            cli_err(CMD, "--load %s: %s", load_in, moe_ctx_last_error(ctx));
            rc = CLI_USAGE;
            goto done;
        }
        have_load = 1;
    }
    if (!have_load && !strcmp(pl_names[0], "balanced")) {
        cli_err(CMD, "--placement balanced needs the load: give --load FILE, or run another placement before it "
                     "(e.g. --placement contiguous,balanced) to measure it");
        rc = CLI_USAGE;
        goto done;
    }

    x = malloc(sizeof(float) * (size_t)(Tmax * H));
    out = malloc(sizeof(float) * (size_t)(Tmax * H));
    times = malloc(sizeof(double) * (size_t)iters * MAX_PL);
    load = calloc((size_t)E, sizeof *load);
    load_t = calloc((size_t)E, sizeof *load_t);
    logits = skew ? malloc(sizeof(float) * (size_t)(Tmax * E)) : NULL;
    router = malloc(sizeof(float) * (size_t)(E * H));
    if (!x || !out || !times || !load || !load_t || (skew && !logits) || !router) {
        cli_err(CMD, "out of memory for %lld tokens", (long long)Tmax);
        goto done;
    }
    {
        /* each EP rank's own tokens (a TP group shares them), and the skewed logits: the same
         * for every placement, so the routing, the load and the output are too */
        const int ep_rank = rank / (int)tp;
        fill(x, MOE_DTYPE_F32, (size_t)(Tmax * H), (uint64_t)seed + 7919u * (uint64_t)(ep_rank + 1), 6, 1.0f);
        if (skew)
            skew_logits(logits, Tmax, E, K, skew_hot, skew_share, (uint64_t)seed + 7919u * (uint64_t)(ep_rank + 1));
        fill(router, MOE_DTYPE_F32, (size_t)(E * H), (uint64_t)seed, 1, 0.1f);
    }
    if (skew && rank == 0)
        printf("routing skewed (--skew %s): router logits biased so experts 0..%lld take about %.0f%% of the rows\n",
               skew, (long long)(skew_hot - 1), 100.0 * skew_share);

    /* Every placement's plan and weights are built first, then the forwards of the placements
     * alternate within each iteration: on a noisy machine each placement sees the same noise.
     * A balanced placement without --load follows the load of the first placement's warm-up
     * forwards (the routing does not depend on the placement). */
    for (int pi = 0; pi < n_pl; pi++) {
        bench_run *br = &runs[pi];
        const char *pname = pl_names[pi];
        br->pol = MOE_PLACEMENT_CONTIGUOUS;
        if (!strcmp(pname, "round_robin"))
            br->pol = MOE_PLACEMENT_ROUND_ROBIN;
        else if (!strcmp(pname, "balanced"))
            br->pol = MOE_PLACEMENT_BALANCED;
        br->is_file = strcmp(pname, "contiguous") && strcmp(pname, "round_robin") && strcmp(pname, "balanced");
        if (br->pol == MOE_PLACEMENT_BALANCED && !have_load) {
            /* the warm-up forwards of placement 0 at every T, counted and gathered */
            memset(load_bal, 0, sizeof(int64_t) * (size_t)E);
            for (int i = 0; i < nT; i++) {
                memset(load, 0, sizeof(int64_t) * (size_t)E);
                if (bench_forward(&runs[0], x, Ts[i], out, logits, load, NULL, NULL) != MOE_OK ||
                    moe_plan_gather_load(runs[0].plan, load, load_t) != MOE_OK) {
                    cli_err(CMD, "measuring the load: %s", moe_ctx_last_error(ctx));
                    goto done;
                }
                for (int64_t e = 0; e < E; e++)
                    load_bal[e] += load_t[e];
            }
            have_load = 2; /* measured */
        }
        br->p2l = malloc(sizeof(int32_t) * (size_t)(E * ep));
        br->rn = malloc(sizeof(int32_t) * (size_t)ep);
        if (!br->p2l || !br->rn) {
            cli_err(CMD, "out of memory");
            goto done;
        }
        if (!br->is_file) {
            if (moe_placement_build(ctx, br->pol, E, (int)ep, br->pol == MOE_PLACEMENT_BALANCED ? redundant : 0,
                                    br->pol == MOE_PLACEMENT_BALANCED ? load_bal : NULL, br->p2l, br->rn, &br->pl) !=
                MOE_OK) {
                cli_err(CMD, "--placement %s: %s", pname, moe_ctx_last_error(ctx));
                goto done;
            }
        } else {
            if (moe_placement_read(ctx, pname, &br->file) != MOE_OK) {
                cli_err(CMD, "--placement %s: %s", pname, moe_ctx_last_error(ctx));
                goto done;
            }
            br->pl = br->file;
        }
        moe_plan_config cfg;
        moe_plan_config_init(&cfg);
        cfg.parallel.ep_size = (int)ep;
        cfg.parallel.tp_size = (int)tp;
        cfg.parallel.ep_rank = -1;
        cfg.parallel.tp_rank = -1;
        cfg.parallel.low_latency = low_latency;
        cfg.parallel.dispatch_dtype = ddt;
        cfg.parallel.placement = &br->pl;
        cfg.batched_capacity = capacity ? capacity : (Tmax < 256 ? Tmax : 256);
        cfg.compute = compute;
        if (moe_plan_create_ex(ctx, &d, &cfg, &br->plan) != MOE_OK || moe_plan_expert_map(br->plan, map) != MOE_OK) {
            cli_err(CMD, "%s", moe_ctx_last_error(ctx));
            goto done;
        }
        const moe_parallel_config *par = moe_plan_parallel(br->plan);

        /* the local experts' full matrices (the packer takes the rank's I shard), shared expert
         * and router on every rank; a logical expert's weights depend on its id only, so its
         * replicas hold the same expert */
        int64_t El = 0, p0 = 0;
        for (int64_t e = 0; e < E; e++)
            El += map[e] >= 0;
        for (int r = 0; r < par->ep_rank; r++)
            p0 += br->pl.rank_num_physical[r];
        const size_t es = moe_dtype_size(dt), per = (size_t)(I * H);
        double tg = cli_now();
        wg = malloc((size_t)(El ? El : 1) * per * es);
        wu = malloc((size_t)(El ? El : 1) * per * es);
        wd = malloc((size_t)(El ? El : 1) * per * es);
        if (!wg || !wu || !wd) {
            cli_err(CMD, "out of memory generating %lld experts", (long long)El);
            goto done;
        }
        for (int64_t e = 0; e < E; e++) {
            gp[e] = up[e] = dp[e] = NULL;
            if (map[e] < 0)
                continue;
            const int64_t l = map[e];
            gp[e] = (unsigned char *)wg + (size_t)l * per * es;
            up[e] = (unsigned char *)wu + (size_t)l * per * es;
            dp[e] = (unsigned char *)wd + (size_t)l * per * es;
            fill((void *)gp[e], dt, per, (uint64_t)seed, (uint64_t)(10 + 3 * e), 0.05f);
            fill((void *)up[e], dt, per, (uint64_t)seed, (uint64_t)(11 + 3 * e), 0.05f);
            fill((void *)dp[e], dt, per, (uint64_t)seed, (uint64_t)(12 + 3 * e), 0.05f);
        }
        moe_weight_source src;
        memset(&src, 0, sizeof src);
        src.router = router;
        src.router_dtype = MOE_DTYPE_F32;
        src.gate_proj = gp;
        src.up_proj = up;
        src.down_proj = dp;
        if (Is > 0) {
            shg = malloc((size_t)(Is * H) * es);
            shu = malloc((size_t)(Is * H) * es);
            shd = malloc((size_t)(Is * H) * es);
            sgate = sgate ? sgate : malloc(sizeof(float) * (size_t)H);
            if (!shg || !shu || !shd || !sgate) {
                cli_err(CMD, "out of memory");
                goto done;
            }
            fill(shg, dt, (size_t)(Is * H), (uint64_t)seed, 2, 0.05f);
            fill(shu, dt, (size_t)(Is * H), (uint64_t)seed, 3, 0.05f);
            fill(shd, dt, (size_t)(Is * H), (uint64_t)seed, 4, 0.05f);
            fill(sgate, MOE_DTYPE_F32, (size_t)H, (uint64_t)seed, 5, 0.05f);
            src.shared_gate_proj = shg;
            src.shared_up_proj = shu;
            src.shared_down_proj = shd;
            src.shared_expert_gate = sgate;
        }
        tg = cli_now() - tg;
        double tp0 = cli_now();
        if (moe_weights_create(br->plan, &src, &br->w) != MOE_OK) {
            cli_err(CMD, "%s", moe_ctx_last_error(ctx));
            goto done;
        }
        double tpack = cli_now() - tp0;
        free(wg);
        free(wu);
        free(wd);
        free(shg);
        free(shu);
        free(shd);
        wg = wu = wd = shg = shu = shd = NULL;
        br->ws_size = moe_plan_workspace_size(br->plan, Tmax);
        br->ws = br->ws_size ? aligned_alloc(64, (br->ws_size + 63) / 64 * 64) : NULL;
        if (br->ws_size && !br->ws) {
            cli_err(CMD, "out of memory for %lld tokens", (long long)Tmax);
            goto done;
        }
        if (rank == 0) {
            char b1[32];
            if (pi == 0)
                printf("bench (parallel): %s layer H %lld, I %lld, E %lld, K %lld%s, %s weights, compute %s; ep %lld x "
                       "tp %lld = %d rank%s; %s (%s), dispatch %s; %d thread%s per rank, kernel table %s\n",
                       m->display, (long long)H, (long long)I, (long long)E, (long long)K, Is ? ", shared expert" : "",
                       moe_dtype_name(dt), moe_compute_name(compute), (long long)ep, (long long)tp, nranks,
                       nranks > 1 ? "s" : "", low_latency ? "batched format" : "standard format",
                       ep > 1 ? (low_latency ? "ep_batched" : "ep_alltoall") : (low_latency ? "local_batched" : "local"),
                       moe_dtype_name(ddt), moe_ctx_num_threads(ctx), moe_ctx_num_threads(ctx) > 1 ? "s" : "",
                       moe_ctx_isa(ctx));
            printf("expert placement %s: %d physical experts = %lld logical + %d redundant%s; workspace %s per rank "
                   "for up to %lld tokens per EP rank\n",
                   pname, (int)br->pl.num_physical_experts, (long long)E, (int)(br->pl.num_physical_experts - E),
                   br->pol != MOE_PLACEMENT_BALANCED ? ""
                   : have_load == 1                  ? " (balancing --load)"
                                                     : " (balancing the load of the first placement's warm-up forwards)",
                   cli_fmt_bytes(b1, sizeof b1, (double)br->ws_size), (long long)Tmax);
        }
        {
            char line[400], b1[32];
            snprintf(line, sizeof line,
                     "  rank %d (ep_rank %d, tp_rank %d): physical experts %lld..%lld (%lld of %d), I shard %lld of "
                     "%lld, resident expert bytes %zu (%s); generated in %.2f s, packed in %.2f s\n",
                     rank, par->ep_rank, par->tp_rank, (long long)p0, (long long)(p0 + El - 1), (long long)El,
                     (int)br->pl.num_physical_experts, (long long)(I / tp + (par->tp_rank < I % tp)), (long long)I,
                     moe_weights_expert_bytes(br->w), cli_fmt_bytes(b1, sizeof b1, (double)moe_weights_expert_bytes(br->w)),
                     tg, tpack);
            cli_mpi_print_ordered(line);
        }
    }

    for (int i = 0; i < nT; i++) {
        const int64_t T = Ts[i];
        double sum[MAX_PL][8]; /* per placement: dispatch s, combine s, tp s, dispatch B, combine B, tp B, received
                                  rows, forward s over the timed runs */
        memset(sum, 0, sizeof sum);
        memset(load, 0, sizeof(int64_t) * (size_t)E);
        for (int64_t it = -2; it < iters; it++)
            for (int pi = 0; pi < n_pl; pi++) {
                moe_exec_stats st;
                double sec = 0;
                /* the timed forwards' routed rows, counted once (placement 0's) */
                if (bench_forward(&runs[pi], x, T, out, logits, it >= 0 && pi == 0 ? load : NULL, &st, &sec) !=
                    MOE_OK) {
                    cli_err(CMD, "T %lld, placement %s: %s", (long long)T, pl_names[pi], moe_ctx_last_error(ctx));
                    goto done;
                }
                if (it < 0)
                    continue;
                times[pi * iters + it] = sec;
                sum[pi][0] += st.dispatch_seconds;
                sum[pi][1] += st.combine_seconds;
                sum[pi][2] += st.tp_reduce_seconds;
                sum[pi][3] += (double)st.dispatch_bytes;
                sum[pi][4] += (double)st.combine_bytes;
                sum[pi][5] += (double)st.tp_reduce_bytes;
                sum[pi][6] += (double)st.received_rows;
                sum[pi][7] += sec;
            }
        if (moe_plan_gather_load(runs[0].plan, load, load_t) != MOE_OK) {
            cli_err(CMD, "T %lld: %s", (long long)T, moe_ctx_last_error(ctx));
            goto done;
        }
        for (int64_t e = 0; e < E; e++)
            load_all[e] += load_t[e];
        for (int pi = 0; pi < n_pl; pi++) {
            qsort(times + pi * iters, (size_t)iters, sizeof(double), cmp_double);
            enum { NV = 9 }; /* median forward s, the 6 sums of sum[] per forward, received rows, expert s */
            double mine[NV] = {times[pi * iters + iters / 2]};
            for (int k = 0; k < 7; k++)
                mine[k + 1] = sum[pi][k] / (double)iters;
            mine[8] = (sum[pi][7] - sum[pi][0] - sum[pi][1] - sum[pi][2]) / (double)iters;
            double *all = malloc(sizeof(double) * NV * (size_t)nranks); /* [nranks][NV] */
            if (!all) {
                cli_err(CMD, "out of memory");
                goto done;
            }
            cli_mpi_gather_doubles(mine, NV, all);
            if (rank == 0) {
                double med = 0, agg[6] = {0};
                for (int q = 0; q < nranks; q++) {
                    med = all[NV * q] > med ? all[NV * q] : med;
                    for (int k = 0; k < 6; k++)
                        agg[k] += all[NV * q + 1 + k];
                }
                const double tokens_all = (double)T * (double)ep; /* distinct tokens over all ranks */
                res_fwd[pi][i] = med;
                res_imb[pi][i] = 1.0;
                res_lost[pi][i] = 0.0;
                if (pi == 0)
                    printf("\n%6s %-12s %11s %12s %11s %10s %14s %14s %14s\n", "T", "placement", "forward ms",
                           "dispatch ms", "combine ms", "tp ms", "dispatch B/tok", "combine B/tok", "tp B/tok");
                printf("%6lld %-12.12s %11.3f %12.3f %11.3f %10.3f %14.0f %14.0f %14.0f\n", (long long)T, pl_names[pi],
                       1e3 * med, 1e3 * agg[0] / nranks, 1e3 * agg[1] / nranks, 1e3 * agg[2] / nranks,
                       agg[3] / tokens_all, agg[4] / tokens_all, agg[5] / tokens_all);
                if (ep > 1) { /* the EP ranks of TP rank 0 (world ranks q with q % tp == 0) */
                    double rmax = 0, rsum = 0, cmax = 0, csum = 0;
                    printf("%6s %-12s rows per EP rank per forward:", "", "");
                    for (int q = 0; q < nranks; q += (int)tp) {
                        const double rows = all[NV * q + 7], cs = all[NV * q + 8];
                        printf(" %.0f", rows);
                        rmax = rows > rmax ? rows : rmax;
                        cmax = cs > cmax ? cs : cmax;
                        rsum += rows;
                        csum += cs;
                    }
                    const double rmean = rsum / (double)ep;
                    res_imb[pi][i] = rmean > 0 ? rmax / rmean : 1.0;
                    res_lost[pi][i] = cmax - csum / (double)ep;
                    printf("; imbalance (max/mean) %.3f; expert time lost to it %.3f ms (slowest rank's %.3f ms "
                           "minus the mean %.3f ms)\n",
                           res_imb[pi][i], 1e3 * res_lost[pi][i], 1e3 * cmax, 1e3 * csum / (double)ep);
                }
                fflush(stdout);
            }
            free(all);
        }
    }
    if (n_pl > 1 && rank == 0) {
        printf("\nplacements side by side, forwards alternating (forward ms: the slowest rank's median of %lld; "
               "imbalance: max EP rank rows / mean):\n", (long long)iters);
        printf("%6s", "T");
        for (int pi = 0; pi < n_pl; pi++)
            printf("  %26.26s", pl_names[pi]);
        printf("\n");
        for (int i = 0; i < nT; i++) {
            printf("%6lld", (long long)Ts[i]);
            for (int pi = 0; pi < n_pl; pi++)
                printf("  %11.3f ms, imb %6.3f", 1e3 * res_fwd[pi][i], res_imb[pi][i]);
            printf("\n");
        }
        for (int i = 0; i < nT; i++)
            for (int pi = 1; pi < n_pl; pi++)
                printf("T %lld: %s / %s forward time %.3f (expert time lost to imbalance %.3f ms vs %.3f ms)\n",
                       (long long)Ts[i], pl_names[pi], pl_names[0], res_fwd[pi][i] / res_fwd[0][i],
                       1e3 * res_lost[pi][i], 1e3 * res_lost[0][i]);
    }
    if (rebal_arg) {
        /* --rebalance: the first placement's plan moved in place to the policy, balanced on the
         * load of every timed forward; only the experts new to a rank are generated and packed */
        bench_run *br = &runs[0];
        rebal_p2l = malloc(sizeof(int32_t) * (size_t)(E * ep));
        rebal_rn = malloc(sizeof(int32_t) * (size_t)ep);
        moe_placement next;
        if (!rebal_p2l || !rebal_rn) {
            cli_err(CMD, "out of memory");
            goto done;
        }
        const int bal = rebal_pol == MOE_PLACEMENT_BALANCED;
        if (moe_placement_build(ctx, rebal_pol, E, (int)ep, bal ? redundant : 0, bal ? load_all : NULL, rebal_p2l,
                                rebal_rn, &next) != MOE_OK ||
            moe_plan_expert_map(br->plan, map) != MOE_OK) {
            cli_err(CMD, "--rebalance %s: %s", rebal_arg, moe_ctx_last_error(ctx));
            goto done;
        }
        const moe_parallel_config *par = moe_plan_parallel(br->plan);
        int64_t p0 = 0, n_new = 0;
        for (int r = 0; r < par->ep_rank; r++)
            p0 += next.rank_num_physical[r];
        for (int64_t e = 0; e < E; e++)
            gp[e] = up[e] = dp[e] = NULL;
        for (int32_t i = 0; i < next.rank_num_physical[par->ep_rank]; i++)
            n_new += map[next.physical_to_logical[p0 + i]] < 0;
        const size_t es = moe_dtype_size(dt), per = (size_t)(I * H);
        wg = malloc((size_t)(n_new ? n_new : 1) * per * es); /* [n_new][I, H] */
        wu = malloc((size_t)(n_new ? n_new : 1) * per * es); /* [n_new][I, H] */
        wd = malloc((size_t)(n_new ? n_new : 1) * per * es); /* [n_new][H, I] */
        if (!wg || !wu || !wd) {
            cli_err(CMD, "out of memory generating %lld experts", (long long)n_new);
            goto done;
        }
        for (int32_t i = 0, l = 0; i < next.rank_num_physical[par->ep_rank]; i++) {
            const int32_t e = next.physical_to_logical[p0 + i];
            if (map[e] >= 0)
                continue; /* kept: not read */
            gp[e] = (unsigned char *)wg + (size_t)l * per * es;
            up[e] = (unsigned char *)wu + (size_t)l * per * es;
            dp[e] = (unsigned char *)wd + (size_t)l * per * es;
            l++;
            fill((void *)gp[e], dt, per, (uint64_t)seed, (uint64_t)(10 + 3 * e), 0.05f); /* as at packing */
            fill((void *)up[e], dt, per, (uint64_t)seed, (uint64_t)(11 + 3 * e), 0.05f);
            fill((void *)dp[e], dt, per, (uint64_t)seed, (uint64_t)(12 + 3 * e), 0.05f);
        }
        moe_weight_source src; /* the moved experts only: router and shared expert are not read */
        memset(&src, 0, sizeof src);
        src.gate_proj = gp;
        src.up_proj = up;
        src.down_proj = dp;
        moe_rebalance_report rr;
        if (moe_plan_rebalance(br->plan, br->w, &next, &src, &rr) != MOE_OK) {
            cli_err(CMD, "--rebalance %s: %s", rebal_arg, moe_ctx_last_error(ctx));
            goto done;
        }
        free(wg);
        free(wu);
        free(wd);
        wg = wu = wd = NULL;
        const size_t ws = moe_plan_workspace_size(br->plan, Tmax); /* a rank may hold more experts now */
        if (ws > br->ws_size) {
            free(br->ws);
            br->ws = aligned_alloc(64, (ws + 63) / 64 * 64);
            br->ws_size = ws;
            if (!br->ws) {
                cli_err(CMD, "out of memory for the workspace after the rebalance");
                goto done;
            }
        }
        if (rank == 0)
            printf("\nrebalance in place: %s -> %s (%d physical experts = %lld logical + %d redundant%s)\n",
                   pl_names[0], rebal_arg, (int)next.num_physical_experts, (long long)E,
                   (int)(next.num_physical_experts - E), bal ? ", on the load of the timed forwards" : "");
        {
            char line[400], b1[32], b2[32];
            snprintf(line, sizeof line,
                     "  rank %d (ep_rank %d, tp_rank %d): %lld experts kept, %lld packed, %lld dropped; %zu bytes "
                     "packed (%s), %s resident; %.3f s\n",
                     rank, par->ep_rank, par->tp_rank, (long long)rr.experts_kept, (long long)rr.experts_packed,
                     (long long)rr.experts_freed, rr.bytes_packed, cli_fmt_bytes(b1, sizeof b1, (double)rr.bytes_packed),
                     cli_fmt_bytes(b2, sizeof b2, (double)rr.bytes_resident), rr.seconds);
            cli_mpi_print_ordered(line);
        }
        for (int i = 0; i < nT; i++) {
            double med = 0;
            for (int64_t it = -2; it < iters; it++) {
                double sec = 0;
                if (bench_forward(br, x, Ts[i], out, logits, NULL, NULL, &sec) != MOE_OK) {
                    cli_err(CMD, "T %lld after the rebalance: %s", (long long)Ts[i], moe_ctx_last_error(ctx));
                    goto done;
                }
                if (it >= 0)
                    times[it] = sec;
            }
            qsort(times, (size_t)iters, sizeof(double), cmp_double);
            const double mine = times[iters / 2];
            double *all = malloc(sizeof(double) * (size_t)nranks); /* [nranks] */
            if (!all) {
                cli_err(CMD, "out of memory");
                goto done;
            }
            cli_mpi_gather_doubles(&mine, 1, all);
            for (int q = 0; q < nranks; q++)
                med = all[q] > med ? all[q] : med;
            free(all);
            if (rank == 0)
                printf("T %lld: forward %.3f ms after the rebalance to %s (%.3f ms before, as %s)\n", (long long)Ts[i],
                       1e3 * med, rebal_arg, 1e3 * res_fwd[0][i], pl_names[0]);
        }
    }
    if (load_out && rank == 0 && moe_load_write(ctx, load_out_resolved, load_all, E) != MOE_OK) {
        cli_err(CMD, "--load-out: %s", moe_ctx_last_error(ctx));
        goto done;
    }
    if (load_out && rank == 0)
        printf("expert load (every timed forward, summed over the EP group) written to %s\n", load_out);
    rc = CLI_OK;
done:
    free(logits);
    free(load);
    free(load_all);
    free(load_t);
    free(x);
    free(out);
    free(times);
    free(wg);
    free(wu);
    free(wd);
    free(shg);
    free(shu);
    free(shd);
    free(router);
    free(sgate);
    free(gp);
    free(up);
    free(dp);
    free(map);
    free(pl_list);
    free(load_bal);
    free(rebal_p2l);
    free(rebal_rn);
    for (int pi = 0; pi < MAX_PL; pi++) {
        free(runs[pi].ws);
        free(runs[pi].p2l);
        free(runs[pi].rn);
        moe_placement_clear(&runs[pi].file);
        moe_weights_free(runs[pi].w);
        moe_plan_free(runs[pi].plan);
    }
    moe_ctx_free(ctx);
    return rc;
}
