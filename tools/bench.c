/* `moe bench`: MoE layer benchmarks on embedded model shapes or a checkpoint's layer.
 *
 * Decode rows must measure DRAM, not the last-level cache. Embedded layers have a router
 * we control: Wr[e, h] = 8 * (h == e) + noise, and each input row carries descending spikes
 * at the coordinates of the experts it must select, so forward r, token t picks experts
 * (r*T*K + t*K + j) mod E, j < K: consecutive forwards walk round-robin through every
 * expert, and a ring of distinct inputs (one per forward) keeps the router GEMM in the timed
 * region. When a layer's expert weights are smaller than 4 x LLC, several copies of the
 * layer are packed and rotated too. Distinct experts are counted from the topk_ids output. */
#ifdef _OPENMP
#include <omp.h>
#endif
#include "bench.h"
#include "cli.h"
#include "models.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *CMD = "moe bench"; /* "moe tune" when the tuner runs the bench */

#define MAX_TOKEN_ROWS 64
#define MAX_ITERS_AUTO 50
#define MIN_ITERS_AUTO 3
#define DEFAULT_MIN_TIME 1.5
#define PROJECT_LLC_BYTES (260ull << 20) /* documented LLC of this project's machines */
#define MAX_COPIES 4096
#define POOL_BUDGET (256ull << 20)  /* distinct generated expert values, bytes */
#define ROUTER_SPIKE 8.0f
#define ROUTER_NOISE 1e-3f
#define INPUT_NOISE 0.05f

typedef struct bench_cfg {
    const cli_model *model;
    const char *ckdir;
    int64_t layer;
    int have_layer;
    int64_t tokens[MAX_TOKEN_ROWS];
    int ntokens;
    int64_t threads;
    moe_dtype dtype;
    int have_dtype;
    int64_t num_experts; /* 0: the preset's */
    int64_t iters;       /* 0: automatic */
    double min_time;
    int have_min_time;
    int json;
    int roofline;       /* --roofline: measure the machine's limits, a fraction per row */
    uint64_t mem_limit; /* 0: none */
    uint64_t seed;
    const char *quant;       /* --quant SCHEME, or NULL */
    moe_quant_config q;      /* its configuration */
    moe_compute compute;     /* --compute f32|bf16 (moe_plan_config.compute) */
    moe_checkpoint_options ck_opt; /* --strict, --family: how --checkpoint is read */
    int have_ck_opt;         /* --strict or --family given (they need --checkpoint) */
    const char *output;      /* moe tune --output DIR */
    int64_t rounds;          /* moe tune --rounds N (0: its default) */
} bench_cfg;

/* A roof of the roofline: the DRAM bandwidth or the compute peak of the instructions the expert
 * GEMMs run (moe_rank_report.compute_roof). */
typedef struct bench_roof {
    const char *key;   /* "dram", "fma", "vnni", "bf16": compute_roof's names, and JSON "roof" */
    const char *label; /* the table's column: "DRAM", "FMA", "VNNI", "BF16" */
    const char *what;  /* for the header */
} bench_roof;

static const bench_roof ROOF_DRAM = {"dram", "DRAM", "DRAM read bandwidth"};
static const bench_roof COMPUTE_ROOFS[] = {
    {"fma", "FMA", "f32 FMA peak"},
    {"vnni", "VNNI", "VNNI int8 peak, vpdpbusd"},
    {"bf16", "BF16", "bf16 dot-product peak, vdpbf16ps"},
};

typedef struct bench_row {
    int64_t tokens;
    int runs;
    double median_ms, best_ms, mean_ms;
    double tokens_per_s, gflops, gbps;
    double distinct_experts; /* mean per forward */
    double bytes_per_forward;
    double flops_per_forward;
    int64_t ring;             /* distinct input tensors */
    int64_t union_experts;    /* distinct experts over all forwards of the row */
    /* Fractions of the weight bytes read by the timed forwards whose reuse distance (bytes
     * of weights touched since the same copy's expert was last used) is under 4 x LLC. */
    double resident_fraction;        /* routed + shared */
    double routed_resident_fraction;
    double shared_resident_fraction;
    int cache_resident;              /* resident_fraction >= 1/2 */
    int64_t route_mismatch; /* forwards whose routing left the designed pattern */
    int64_t tuned_tokens;   /* the tuning file entry the forwards ran (moe_exec_stats), 0: none */
    /* --roofline: FLOP per weight byte, the bound that applies and the row's fraction of it */
    double intensity;
    const bench_roof *bound; /* DRAM or the layer's compute roof; NULL without --roofline */
    double bound_value;      /* that roof's measured value: GB/s, GFLOP/s or GOP/s */
    double bound_fraction;
} bench_row;

static void bench_usage(FILE *f)
{
    fputs("usage: moe bench [options]\n"
          "\n"
          "Times one MoE layer forward (router, top-k, expert GEMMs, combine) for each token\n"
          "count T. Default: the Qwen3-30B-A3B MoE layer (H 2048, I 768, E 128, K 8, softmax,\n"
          "renormalize) with BF16 weights generated in memory, T = 1, 16, 256, 2048.\n"
          "\n"
          "Options:\n"
          "  --model NAME       an embedded model layer (--list-models); default qwen3-30b-a3b\n"
          "  --list-models      list the embedded models and exit\n"
          "  --checkpoint DIR   bench a Hugging Face checkpoint's layer (real router, random\n"
          "                     inputs) instead of an embedded model\n"
          "  --layer L          the checkpoint's layer (default: its first MoE layer)\n"
          "  --strict           with --checkpoint: refuse (exit 1) tensors under the layer's MoE\n"
          "                     block that libmoe does not read (default: a WARNING names them)\n"
          "  --family NAME      with --checkpoint: read it as family NAME whatever config.json\n"
          "                     names (moe run --help; a WARNING names both)\n"
          "  --experts SET      with --checkpoint: the expert set of a block with one per\n"
          "                     modality (ernie4_5_vl_moe: text, the default, or vision)\n"
          "  --tokens LIST      comma-separated token counts, each >= 1 (default 1,16,256,2048)\n"
          "  --threads N        worker threads (default: MOE_NUM_THREADS, OMP_NUM_THREADS,\n"
          "                     else all cores)\n"
          "  --dtype D          generated weights' dtype: bf16 (default), f16 or f32\n"
          "  --num-experts N    override E (keeps H, I, K, so per-token bytes and FLOPs stay\n"
          "                     the real model's) for layers that do not fit in memory;\n"
          "                     K <= N <= H\n"
          "  --iters N          timed forwards per row (default: enough for --min-time,\n"
          "                     3 to 50)\n"
          "  --min-time S       target seconds per row when --iters is not given (default 1.5)\n"
          "  --mem-limit SIZE   use at most SIZE bytes of memory (e.g. 16G; default: 90% of\n"
          "                     MemAvailable)\n"
          "  --seed N           seed of the generated weights and inputs (default 1)\n"
          "  --quant SCHEME     quantize the generated routed experts (moe_quantize_matrix of\n"
          "                     f32 weights): fp8-tensor, fp8-channel, fp8-block, fp8-block-w8a8,\n"
          "                     int8-channel,\n"
          "                     int8-w8a8, int4-g32, int4-g64, int4-g128 (-zp: zero points),\n"
          "                     mxfp4, fp8-tensor-static, fp8-channel-static, fp8-block-static\n"
          "                     (static FP8 activations, input scale 8 / 448 per expert);\n"
          "                     embedded layers only. GB/s and the roofline then count\n"
          "                     the packed bytes the kernels read (codes + f32 scales)\n"
          "  --compute C        the expert GEMMs' arithmetic (moe_plan_config.compute): f32\n"
          "                     (default) or bf16 (activations rounded to bf16, f32\n"
          "                     accumulation; f32/f16 weights rounded to bf16 at packing, so\n"
          "                     GB/s counts 2 bytes per weight)\n"
          "  --roofline         first measure this machine's DRAM read bandwidth, f32 FMA peak,\n"
          "                     VNNI int8 peak and vdpbf16ps peak (1-3 s, moe_roofline_measure)\n"
          "                     and give each row as a fraction of the bound that applies\n"
          "  --json             print one JSON document on stdout instead of the table\n"
          "  --ep N, --tp M     expert / tensor parallelism under mpirun -np N*M: the\n"
          "                     per-rank bench with its own options (moe bench --ep 1 --help)\n"
          "  -h, --help         this text\n"
          "\n"
          "Each row: T, runs (timed, after one warm-up), median and best ms per forward,\n"
          "tokens/s (T / median), GFLOP/s (2*T*K*3*H*I + shared expert 2*T*3*H*Is + router\n"
          "2*T*E*H, over the median), GB/s (expert weight bytes of the distinct experts the\n"
          "forward selected, from topk_ids, plus the shared expert, over the median), the\n"
          "distinct experts per forward, and whether the row is served from cache: the share\n"
          "of weight bytes read whose reuse cycle (distinct weight bytes the forwards from\n"
          "that expert copy's previous use to this one touch) is under 4 x LLC; 'YES' from\n"
          "50%. LLC: sysfs, but at least 260 MiB (the documented LLC of this project's\n"
          "machines).\n"
          "Embedded layers use a controlled router so consecutive forwards walk round-robin\n"
          "through every expert, and several copies of a small layer are rotated.\n"
          "The header gives the packing cost: wall time of moe_weights_create per layer copy\n"
          "(checkpoints: moe_checkpoint_load_weights, which also reads the tensors) and the\n"
          "packed bytes.\n"
          "With --roofline, a last column: a row whose arithmetic intensity (FLOP/s over GB/s\n"
          "above, i.e. FLOPs per weight byte read) is below the ridge point (compute roof /\n"
          "DRAM bandwidth) is memory-bound and gets GB/s / DRAM read bandwidth ('0.93 DRAM');\n"
          "any other row gets GFLOP/s / the compute roof of the instructions its expert GEMMs\n"
          "run (moe_rank_report.compute_roof): the f32 FMA peak ('0.81 FMA'), the VNNI int8\n"
          "peak for int8-w8a8 experts on a table with VNNI ('0.62 VNNI'), the vdpbf16ps peak\n"
          "for --compute bf16 where the table's pair GEMM runs vdpbf16ps ('0.55 BF16': the\n"
          "avx512_bf16 table on a CPU where that form is the faster, as 'moe version' says;\n"
          "compute bf16 on vfmadd pairs or the scalar emulation keeps the FMA roof). A\n"
          "cache-resident row can exceed 1 DRAM.\n",
          f);
}

/* --tokens LIST into cfg->tokens (a cli_opt parse: dst is the bench_cfg) */
static int parse_tokens(const char *cmd, const char *name, const char *s, void *dst)
{
    bench_cfg *cfg = dst;
    return cli_parse_i64_list(cmd, name, s, 1, (int64_t)1 << 24, cfg->tokens, MAX_TOKEN_ROWS, &cfg->ntokens);
}

/* --dtype D (a cli_opt parse: dst is the moe_dtype) */
static int parse_dtype(const char *cmd, const char *name, const char *s, void *dst)
{
    moe_dtype *out = dst;
    if (strcmp(s, "bf16") == 0 || strcmp(s, "BF16") == 0)
        *out = MOE_DTYPE_BF16;
    else if (strcmp(s, "f16") == 0 || strcmp(s, "F16") == 0 || strcmp(s, "fp16") == 0)
        *out = MOE_DTYPE_F16;
    else if (strcmp(s, "f32") == 0 || strcmp(s, "F32") == 0 || strcmp(s, "fp32") == 0)
        *out = MOE_DTYPE_F32;
    else {
        cli_err(cmd, "%s: '%s' is not one of f32, bf16, f16", name, s);
        return -1;
    }
    return 0;
}

/* --mem-limit SIZE (a cli_opt parse: dst is the uint64_t) */
static int parse_mem_limit(const char *cmd, const char *name, const char *s, void *dst)
{
    uint64_t *out = dst;
    if (cli_parse_size(cmd, name, s, out))
        return -1;
    if (*out == 0) {
        cli_err(cmd, "%s: must be more than 0", name);
        return -1;
    }
    return 0;
}

/* --quant SCHEME into cfg->quant and cfg->q (a cli_opt parse: dst is the bench_cfg) */
static int parse_quant(const char *cmd, const char *name, const char *s, void *dst)
{
    bench_cfg *cfg = dst;
    cfg->quant = s;
    if (moe_quant_from_name(cfg->quant, &cfg->q) != MOE_OK) {
        static const char *const none[] = {"none"};
        cli_scheme_unknown(cmd, name, cfg->quant, none, 1, NULL);
        return -1;
    }
    return 0;
}

/* Exit code >= 0 to stop now, CLI_GO_ON (-1) to go on. hook: `moe tune` (its usage, its
 * --output, no --json / --roofline / --list-models). */
static int parse_bench_args(int argc, char **argv, bench_cfg *cfg, const cli_bench_hook *hook)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->dtype = MOE_DTYPE_BF16;
    cfg->min_time = hook ? hook->min_time : DEFAULT_MIN_TIME;
    int list = 0;
    const char *model_name = NULL;
    int64_t seed = 1;
    const cli_opt opts[] = {
        /* flags */
        {.name = "--list-models", .kind = CLI_FLAG, .dst = &list},
        {.name = "--json", .kind = CLI_FLAG, .dst = &cfg->json},
        {.name = "--roofline", .kind = CLI_FLAG, .dst = &cfg->roofline},
        /* the layer: an embedded model by name (looked up below), or a checkpoint's */
        {.name = "--model", .kind = CLI_STR, .dst = &model_name},
        {.name = "--checkpoint", .kind = CLI_STR, .dst = &cfg->ckdir, .nonempty = 1},
        {.name = "--layer", .kind = CLI_I64, .dst = &cfg->layer, .lo = INT64_MIN, .hi = INT64_MAX,
         .seen = &cfg->have_layer},
        /* comma-separated token counts, each in [1, 2^24] */
        {.name = "--tokens", .kind = CLI_CUSTOM, .dst = cfg, .parse = parse_tokens},
        {.name = "--threads", .kind = CLI_I64, .dst = &cfg->threads, .lo = 1, .hi = 4096},
        /* bf16 / f16 / f32; seen: refused with --checkpoint */
        {.name = "--dtype", .kind = CLI_CUSTOM, .dst = &cfg->dtype, .parse = parse_dtype,
         .seen = &cfg->have_dtype},
        /* the upper bound here; K <= N <= H is checked below, once the model is known */
        {.name = "--num-experts", .kind = CLI_I64, .dst = &cfg->num_experts, .lo = 1,
         .hi = (int64_t)1 << 20},
        {.name = "--iters", .kind = CLI_I64, .dst = &cfg->iters, .lo = 1, .hi = 100000},
        /* seen: refused with --iters */
        {.name = "--min-time", .kind = CLI_F64, .dst = &cfg->min_time, .dlo = 1e-3, .dhi = 3600.0,
         .seen = &cfg->have_min_time},
        /* a byte size, more than 0 */
        {.name = "--mem-limit", .kind = CLI_CUSTOM, .dst = &cfg->mem_limit, .parse = parse_mem_limit},
        /* a moe_quant_from_name scheme, into cfg->quant and cfg->q */
        {.name = "--quant", .kind = CLI_CUSTOM, .dst = cfg, .parse = parse_quant},
        /* f32 / bf16 (cli_parse_compute names the accepted values) */
        {.name = "--compute", .kind = CLI_CUSTOM, .dst = &cfg->compute, .parse = cli_parse_compute},
        {.name = "--seed", .kind = CLI_I64, .dst = &seed, .lo = 0, .hi = INT64_MAX},
        /* how --checkpoint is read (moe_checkpoint_options); refused without it */
        {.name = "--strict", .kind = CLI_FLAG, .dst = &cfg->ck_opt.strict, .seen = &cfg->have_ck_opt},
        {.name = "--family", .kind = CLI_CUSTOM, .dst = &cfg->ck_opt.family, .parse = cli_parse_family,
         .seen = &cfg->have_ck_opt},
        /* the expert set (ERNIE-4.5-VL's text / vision); the library checks the name */
        {.name = "--experts", .kind = CLI_STR, .dst = &cfg->ck_opt.expert_set, .nonempty = 1,
         .seen = &cfg->have_ck_opt},
        /* moe tune only, the last two (the first three are bench's only) */
        {.name = "--output", .kind = CLI_STR, .dst = &cfg->output, .nonempty = 1},
        {.name = "--rounds", .kind = CLI_I64, .dst = &cfg->rounds, .lo = 1, .hi = 100},
    };
    const size_t nopts = CLI_NOPTS(opts);
    const int prc = hook ? cli_parse_opts(argc, argv, CMD, opts + 3, nopts - 3, hook->usage)
                         : cli_parse_opts(argc, argv, CMD, opts, nopts - 2, bench_usage);
    if (prc != CLI_GO_ON)
        return prc;
    cfg->seed = (uint64_t)seed;
    if (list) {
        cli_model_list(stdout);
        return CLI_OK;
    }
    if (model_name) {
        cfg->model = cli_model_find(model_name);
        if (!cfg->model)
            return cli_model_unknown(CMD, model_name);
    }
    if (cfg->ckdir) {
        const char *bad = model_name ? "--model" : cfg->have_dtype ? "--dtype"
                        : cfg->num_experts ? "--num-experts" : cfg->quant ? "--quant" : NULL;
        if (bad) {
            cli_err(CMD, "%s cannot be combined with --checkpoint (a checkpoint's layer has "
                    "its own shapes and dtype)", bad);
            return CLI_USAGE;
        }
    } else {
        if (cfg->have_layer || cfg->have_ck_opt) {
            cli_err(CMD, "%s needs --checkpoint",
                    cfg->have_layer ? "--layer" : cfg->ck_opt.strict ? "--strict"
                                        : cfg->ck_opt.family ? "--family" : "--experts");
            return CLI_USAGE;
        }
        if (!cfg->model)
            cfg->model = cli_model_find("qwen3-30b-a3b");
        if (cfg->num_experts) {
            const cli_model *m = cfg->model;
            if (cfg->num_experts < m->top_k || cfg->num_experts > m->hidden_size) {
                cli_err(CMD, "--num-experts: %lld is out of range [%lld, %lld] for %s (at least "
                        "K; at most H, which the controlled router needs)",
                        (long long)cfg->num_experts, (long long)m->top_k,
                        (long long)m->hidden_size, m->name);
                return CLI_USAGE;
            }
        }
    }
    if (cfg->iters && cfg->have_min_time) {
        cli_err(CMD, "--iters and --min-time cannot be combined");
        return CLI_USAGE;
    }
    if (cfg->ntokens == 0 && hook) {
        for (int i = 0; i < hook->ntokens; i++)
            cfg->tokens[i] = hook->tokens[i];
        cfg->ntokens = hook->ntokens;
    } else if (cfg->ntokens == 0) {
        static const int64_t def[] = {1, 16, 256, 2048};
        for (int i = 0; i < 4; i++)
            cfg->tokens[i] = def[i];
        cfg->ntokens = 4;
    }
    return -1;
}

/* ---- helpers ------------------------------------------------------------------------- */

static void *alloc64(size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64;
    if (n == 0)
        n = 64;
    return aligned_alloc(64, n);
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Store `v` at element i of a buffer of dtype dt. */
static inline void store_elem(void *buf, moe_dtype dt, size_t i, float v)
{
    if (dt == MOE_DTYPE_F32)
        ((float *)buf)[i] = v;
    else if (dt == MOE_DTYPE_BF16)
        ((uint16_t *)buf)[i] = cli_f32_to_bf16(v);
    else
        ((uint16_t *)buf)[i] = cli_f32_to_f16(v);
}

/* n elements uniform in [-bound, bound) from (seed, first + i), converted to dt. */
static void gen_uniform(void *buf, moe_dtype dt, size_t n, uint64_t seed, uint64_t first,
                        float bound, int threads)
{
    int64_t nn = (int64_t)n;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t i = 0; i < nn; i++)
        store_elem(buf, dt, (size_t)i, bound * cli_uniform_pm1(seed, first + (uint64_t)i));
    (void)threads;
}

/* Ring size for T tokens: embedded layers need one input per forward of the expert walk's
 * period; checkpoints get enough random inputs for ~4096 tokens per ring. Capped by
 * `cap_bytes` of inputs. */
static int64_t ring_size(int embedded, int64_t T, int64_t H, int64_t E, int64_t K,
                         uint64_t cap_bytes)
{
    int64_t want;
    if (embedded) {
        int64_t step = (T % E) * (K % E) % E; /* (T*K) mod E without overflow */
        want = step == 0 ? 1 : E / gcd64(E, step);
    } else {
        want = (4096 + T - 1) / T;
        if (want > 256)
            want = 256;
    }
    uint64_t per = (uint64_t)T * (uint64_t)H * sizeof(float);
    uint64_t fit = per ? cap_bytes / per : (uint64_t)want;
    if (fit < 1)
        fit = 1;
    if ((uint64_t)want > fit)
        want = (int64_t)fit;
    return want;
}

/* Fill ring slot q ([T, H] f32). */
static void gen_input(float *x, int embedded, int64_t q, int64_t walk0, int64_t T, int64_t H,
                      int64_t E, int64_t K, uint64_t seed, int threads)
{
    uint64_t first = (uint64_t)q * (uint64_t)T * (uint64_t)H;
    uint64_t s = seed ^ 0x1A2B3C4D5E6F7788ull;
    if (!embedded) {
        gen_uniform(x, MOE_DTYPE_F32, (size_t)(T * H), s, first, 1.0f, threads);
        return;
    }
    gen_uniform(x, MOE_DTYPE_F32, (size_t)(T * H), s, first, INPUT_NOISE, threads);
    int64_t base = (walk0 + (q % E) * ((T % E) * (K % E) % E)) % E; /* walk0 + q*T*K mod E */
    for (int64_t t = 0; t < T; t++) {
        int64_t tb = (base + (t % E) * (K % E)) % E;
        for (int64_t j = 0; j < K; j++) {
            int64_t e = (tb + j) % E;
            /* descending spikes: logits 8 * (2 - j/K), separated by 8/K >= 0.8 */
            x[t * H + e] = 2.0f - (float)j / (float)K;
        }
    }
}

/* ---- the benchmark ------------------------------------------------------------------- */

typedef struct bench_state {
    bench_cfg *cfg;
    moe_ctx *ctx;
    moe_plan *plan;
    moe_layer_desc desc;
    int embedded;
    moe_weights **w;
    int copies;
    int copies_wanted;
    double expert_bytes; /* one routed expert, nominal (3 * H * I * dtype size; 2 * when non-gated) */
    double shared_bytes;
    double layer_bytes; /* E experts + shared */
    double packed_bytes; /* moe_weights_expert_bytes of one copy */
    uint64_t llc, llc_sysfs;
    int llc_level;
    uint64_t mem_avail;
    uint64_t ring_cap;
    size_t ws_size;
    void *ws;
    float *out;
    int32_t *ids;
    float *tw;
    uint32_t *stamp; /* [E] */
    unsigned char *seen; /* [E] */
    int32_t *dlist;  /* [E + 1] distinct experts of one forward (+ shared) */
    /* Reuse distances (LRU stack distance in bytes): the forward at which each copy's
     * expert (index E: the shared expert) was last used, and a Fenwick tree over forwards
     * of the bytes whose last use is that forward. */
    int64_t *last_fwd; /* [copies, E + 1], -1: never */
    double *fen;       /* [fen_n + 1] */
    int64_t fen_n;
    int64_t fwd;       /* forwards run so far, all rows */
    int64_t copy_next; /* the copy a row starts on: rows carry on the rotation */
    int64_t walk_next; /* the expert the next row's walk starts from */
    int threads;
    int pool; /* distinct generated experts */
    /* packing cost: wall seconds of each copy's moe_weights_create (or checkpoint load) */
    double pack_first_s, pack_total_s;
    int pack_count;
    int have_rf; /* --roofline measured */
    moe_roofline rf;
    /* the compute roof of the expert GEMMs' instructions (moe_rank_report.compute_roof), its
     * measured peak and the ridge point it makes with the DRAM bandwidth (--roofline) */
    const bench_roof *roof;
    double roof_peak, ridge;
    char notes[8][640];
    int nnotes;
    moe_exec_stats last; /* the stats of the last forward run_row ran */
} bench_state;

static void add_note(bench_state *s, const char *fmt, ...) CLI_PRINTF(2, 3);
static void add_note(bench_state *s, const char *fmt, ...)
{
    if (s->nnotes >= 8)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->notes[s->nnotes++], sizeof s->notes[0], fmt, ap);
    va_end(ap);
}

static void fen_add(bench_state *s, int64_t i, double v)
{
    for (i++; i <= s->fen_n; i += i & -i)
        s->fen[i] += v;
}

/* Bytes last used at forwards [0, i). */
static double fen_prefix(const bench_state *s, int64_t i)
{
    double r = 0.0;
    for (; i > 0; i -= i & -i)
        r += s->fen[i];
    return r;
}

/* Forwards of one pass over one copy (embedded layers): as many as take disjoint sets of
 * T*K experts from the walk, at least 1. */
static int64_t pass_forwards(int64_t E, int64_t T, int64_t K)
{
    return (T >= E || T * K >= E) ? 1 : E / (T * K);
}

static int lib_fail(bench_state *s, moe_status st)
{
    const char *m = moe_ctx_last_error(s->ctx);
    cli_err(CMD, "%s", (m && m[0]) ? m : moe_status_name(st));
    return CLI_FAIL;
}

static void note_pack_time(bench_state *s, double dt)
{
    if (s->pack_count == 0)
        s->pack_first_s = dt;
    s->pack_total_s += dt;
    s->pack_count++;
}

/* The layer's compute roof: the peak of the instructions its expert GEMMs run on the ctx's table
 * (moe_rank_report.compute_roof of the plan: vdpbf16ps for compute bf16 where the table's pair GEMM
 * runs it, VNNI for
 * int8-w8a8 on a table with VNNI, else f32 FMA), and with --roofline its measured value and
 * ridge point. A roof the roofline measured as 0 (none on these loops) falls back to FMA. */
static int set_compute_roof(bench_state *s)
{
    moe_rank_report rep;
    moe_status st = moe_plan_report(s->plan, &rep);
    if (st != MOE_OK)
        return lib_fail(s, st);
    s->roof = &COMPUTE_ROOFS[0];
    for (size_t i = 0; i < sizeof COMPUTE_ROOFS / sizeof COMPUTE_ROOFS[0]; i++)
        if (strcmp(rep.compute_roof, COMPUTE_ROOFS[i].key) == 0)
            s->roof = &COMPUTE_ROOFS[i];
    if (!s->have_rf)
        return CLI_OK;
    const double peaks[] = {s->rf.fma_f32_gflops, s->rf.vnni_int8_gops, s->rf.bf16_dp_gflops};
    s->roof_peak = peaks[s->roof - COMPUTE_ROOFS];
    if (!(s->roof_peak > 0)) {
        s->roof = &COMPUTE_ROOFS[0];
        s->roof_peak = s->rf.fma_f32_gflops;
    }
    s->ridge = s->rf.dram_read_gbs > 0 ? s->roof_peak / s->rf.dram_read_gbs : s->rf.ridge_flop_per_byte;
    return CLI_OK;
}

/* --roofline: the row's arithmetic intensity, bound and fraction of it. */
static void row_roofline(const bench_state *s, bench_row *r)
{
    if (!s->have_rf)
        return;
    r->intensity = r->bytes_per_forward > 0 ? r->flops_per_forward / r->bytes_per_forward : 0.0;
    if (r->intensity < s->ridge) {
        r->bound = &ROOF_DRAM;
        r->bound_value = s->rf.dram_read_gbs;
        r->bound_fraction = s->rf.dram_read_gbs > 0 ? r->gbps / s->rf.dram_read_gbs : 0.0;
    } else {
        r->bound = s->roof;
        r->bound_value = s->roof_peak;
        r->bound_fraction = s->roof_peak > 0 ? r->gflops / s->roof_peak : 0.0;
    }
}

/* [I, H]-sized matrices of one routed expert: 3 (gate, up, down) for a gated activation, 2
 * (up, down) for a non-gated one (moe_activation_gated: Nemotron-H's relu2) */
static int expert_mats(const moe_layer_desc *d)
{
    return moe_activation_gated(d->activation) ? 3 : 2;
}

/* the same for the shared expert, whose activation may be its own (has_shared_activation) */
static int shared_mats(const moe_layer_desc *d)
{
    return moe_activation_gated(d->has_shared_activation ? d->shared_activation : d->activation) ? 3 : 2;
}

/* Generate the embedded layer and pack `copies` copies of it. */
static int build_embedded(bench_state *s)
{
    const moe_layer_desc *d = &s->desc;
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t Is = d->shared_expert_intermediate_size;
    const moe_dtype dt = d->weight_dtype;
    const size_t ds = moe_dtype_size(dt);
    const uint64_t seed = s->cfg->seed;
    int rc = CLI_FAIL;
    const size_t mat = (size_t)I * (size_t)H; /* elements of one [I,H] or [H,I] matrix */
    void *pool = NULL, *shared = NULL;
    float *router = NULL, *sgate = NULL;
    const void **ptrs = NULL;
    /* a routed expert's matrices in the pool: [gate,] up, down (non-gated: no gate) */
    const int nm = expert_mats(d), up_m = nm - 2, down_m = nm - 1, snm = shared_mats(d);

    int G = s->pool;
    const moe_quant_config *qc = &d->quant;
    const int quant = moe_quant_name(qc)[0] != 'n';
    float *in_scales = NULL; /* [2E] static FP8 activations: w13 then w2 input scales */
    size_t qoff[4] = {0}, qsoff[4] = {0}, qzoff[4] = {0}; /* per matrix: code/scale/zero offsets (nm + 1 used) */
    unsigned char *qpool = NULL, *qscales = NULL, *qzeros = NULL;
    const void **sptrs = NULL;
    const uint8_t **zptrs = NULL;
    if (quant) {
        for (int m = 0; m < nm; m++) {
            const int dn = m == down_m;
            size_t cb, sb, zb;
            (void)moe_quantize_matrix_sizes(dn ? &qc->w2 : &qc->w13, dn ? H : I, dn ? I : H, &cb, &sb,
                                            &zb); /* checked in cli_cmd_bench */
            qoff[m + 1] = qoff[m] + cb;
            qsoff[m + 1] = qsoff[m] + (sb + 63) / 64 * 64;
            qzoff[m + 1] = qzoff[m] + zb;
        }
        qpool = alloc64((size_t)G * qoff[nm]);
        qscales = alloc64((size_t)G * qsoff[nm]);
        qzeros = qzoff[nm] ? alloc64((size_t)G * qzoff[nm]) : NULL;
        sptrs = calloc((size_t)E * 3, sizeof *sptrs);
        zptrs = calloc((size_t)E * 3, sizeof *zptrs);
        pool = alloc64(mat * sizeof(float) * (size_t)s->threads); /* f32 scratch per thread */
        if (!qpool || !qscales || (qzoff[nm] && !qzeros) || !sptrs || !zptrs) {
            cli_err(CMD, "out of memory generating the quantized weights");
            goto done;
        }
    } else {
        pool = alloc64((size_t)G * (size_t)nm * mat * ds);
    }
    router = alloc64((size_t)E * (size_t)H * sizeof(float));
    ptrs = calloc((size_t)E * 3, sizeof *ptrs);
    if (Is > 0) {
        shared = alloc64((size_t)snm * (size_t)Is * (size_t)H * ds); /* [gate,] up, down */
        sgate = alloc64((size_t)H * sizeof(float));
    }
    if (!pool || !router || !ptrs || (Is > 0 && (!shared || !sgate))) {
        cli_err(CMD, "out of memory generating the weights");
        goto done;
    }

    cli_progress pr;
    cli_progress_start(&pr);
    const float bh = 1.0f / sqrtf((float)H), bi = 1.0f / sqrtf((float)I);
    if (quant) {
        /* f32 weights, quantized matrix by matrix (G * nm in parallel, one scratch each) */
        int qfail = 0;
        const int64_t nq = (int64_t)G * nm;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(s->threads) reduction(| : qfail)
#endif
        for (int64_t i = 0; i < nq; i++) {
            int tid = 0;
#ifdef _OPENMP
            tid = omp_get_thread_num();
#endif
            float *scratch = (float *)pool + (size_t)tid * mat;
            const int g = (int)(i / nm), m = (int)(i % nm), dn = m == down_m;
            const float b = dn ? bi : bh;
            for (size_t j = 0; j < mat; j++)
                scratch[j] = b * cli_uniform_pm1(seed, (uint64_t)g * (uint64_t)nm * mat + (uint64_t)m * mat + j);
            moe_status qs = moe_quantize_matrix(dn ? &qc->w2 : &qc->w13, scratch, dn ? H : I, dn ? I : H,
                                                qpool + (size_t)g * qoff[nm] + qoff[m],
                                                qscales + (size_t)g * qsoff[nm] + qsoff[m],
                                                qzeros ? qzeros + (size_t)g * qzoff[nm] + qzoff[m] : NULL);
            qfail |= qs != MOE_OK;
        }
        if (qfail) {
            cli_progress_end(&pr);
            cli_err(CMD, "moe_quantize_matrix failed (out of memory)");
            goto done;
        }
        cli_progress_update(&pr, "quantizing weights (%s) done", moe_quant_name(qc));
    }
    for (int g = 0; !quant && g < G; g++) {
        char *base = (char *)pool + (size_t)g * (size_t)nm * mat * ds;
        uint64_t first = (uint64_t)g * (uint64_t)nm * mat;
        for (int m = 0; m < nm; m++) /* [gate,] up (scale 1/sqrt(H)), down (1/sqrt(I)) */
            gen_uniform(base + (size_t)m * mat * ds, dt, mat, seed, first + (uint64_t)m * mat, m == down_m ? bi : bh,
                        s->threads);
        cli_progress_update(&pr, "generating weights %d%%...", (int)(100.0 * (g + 1) / G));
    }
    /* Router [E, H]: 8 at (e, e), plus small noise: the input spikes choose the experts. */
    gen_uniform(router, MOE_DTYPE_F32, (size_t)(E * H), seed ^ 0xABCDEF12345ull, 0,
                ROUTER_NOISE, s->threads);
    for (int64_t e = 0; e < E; e++)
        router[e * H + e] += ROUTER_SPIKE;
    if (Is > 0) {
        size_t smat = (size_t)Is * (size_t)H;
        uint64_t ss = seed ^ 0x5EED5EED5EEDull;
        for (int m = 0; m < snm; m++) /* [gate,] up, down */
            gen_uniform((char *)shared + (size_t)m * smat * ds, dt, smat, ss, (uint64_t)m * smat,
                        m == snm - 1 ? 1.0f / sqrtf((float)Is) : bh, s->threads);
        gen_uniform(sgate, MOE_DTYPE_F32, (size_t)H, ss ^ 0x77ull, 0, bh, s->threads);
    }
    for (int64_t e = 0; !quant && e < E; e++) {
        /* ptrs [3E]: gate (NULL when non-gated), up, down pointers */
        const char *base = (const char *)pool + (size_t)(e % G) * (size_t)nm * mat * ds;
        ptrs[e] = nm == 3 ? base : NULL;
        ptrs[E + e] = base + (size_t)up_m * mat * ds;
        ptrs[2 * E + e] = base + (size_t)down_m * mat * ds;
    }
    for (int64_t e = 0; quant && e < E; e++) {
        const size_t g = (size_t)(e % G);
        for (int m = 0; m < nm; m++) {
            const int slot = m + 3 - nm; /* gate 0, up 1, down 2 */
            ptrs[slot * E + e] = qpool + g * qoff[nm] + qoff[m];
            sptrs[slot * E + e] = qscales + g * qsoff[nm] + qsoff[m];
            zptrs[slot * E + e] = qzeros ? qzeros + g * qzoff[nm] + qzoff[m] : NULL;
        }
    }
    moe_weight_source src;
    memset(&src, 0, sizeof src);
    src.router = router;
    src.router_dtype = MOE_DTYPE_F32;
    src.gate_proj = nm == 3 ? ptrs : NULL;
    src.up_proj = ptrs + E;
    src.down_proj = ptrs + 2 * E;
    if (quant) {
        src.gate_scale = nm == 3 ? sptrs : NULL;
        src.up_scale = sptrs + E;
        src.down_scale = sptrs + 2 * E;
        if (qzeros) {
            src.gate_zero = nm == 3 ? zptrs : NULL;
            src.up_zero = zptrs + E;
            src.down_zero = zptrs + 2 * E;
        }
    }
    if (quant && qc->act == MOE_QACT_STATIC) {
        in_scales = malloc(sizeof(float) * (size_t)(2 * E));
        if (!in_scales) {
            cli_progress_end(&pr);
            cli_err(CMD, "out of memory");
            goto done;
        }
        /* the inputs' spikes reach ~8 and the weights are uniform: 8 / 448 keeps the codes in
         * range (values only; the timing does not depend on them) */
        for (int64_t i = 0; i < 2 * E; i++)
            in_scales[i] = 8.0f / 448.0f;
        src.w13_input_scale = in_scales;
        src.w2_input_scale = in_scales + E;
    }
    if (Is > 0) {
        size_t smat = (size_t)Is * (size_t)H;
        src.shared_gate_proj = snm == 3 ? shared : NULL;
        src.shared_up_proj = (const char *)shared + (size_t)(snm - 2) * smat * ds;
        src.shared_down_proj = (const char *)shared + (size_t)(snm - 1) * smat * ds;
        src.shared_expert_gate = d->shared_expert_gated ? sgate : NULL;
    }
    for (int c = 0; c < s->copies; c++) {
        cli_progress_update(&pr, "packing weights: copy %d/%d...", c + 1, s->copies);
        double t0 = cli_now();
        moe_status st = moe_weights_create(s->plan, &src, &s->w[c]);
        note_pack_time(s, cli_now() - t0);
        if (st != MOE_OK) {
            cli_progress_end(&pr);
            rc = lib_fail(s, st);
            goto done;
        }
    }
    cli_progress_end(&pr);
    rc = CLI_OK;
done:
    free(pool);
    free(qpool);
    free(qscales);
    free(qzeros);
    free(sptrs);
    free(zptrs);
    free(router);
    free(ptrs);
    free(shared);
    free(sgate);
    free(in_scales);
    return rc;
}

static int run_row(bench_state *s, int64_t T, bench_row *row)
{
    const moe_layer_desc *d = &s->desc;
    const int64_t H = d->hidden_size, E = d->num_experts, K = d->top_k;
    const int64_t I = d->moe_intermediate_size, Is = d->shared_expert_intermediate_size;
    int rc = CLI_FAIL;
    memset(row, 0, sizeof *row);
    row->tokens = T;

    int64_t R = ring_size(s->embedded, T, H, E, K, s->ring_cap);
    row->ring = R;
    const int64_t walk0 = s->walk_next; /* the walk over the experts goes on across rows */
    size_t per = (size_t)T * (size_t)H;
    float *ring = alloc64((size_t)R * per * sizeof(float));
    double *times = NULL;
    if (!ring) {
        cli_err(CMD, "out of memory for %lld input tensors of T = %lld", (long long)R,
                (long long)T);
        return CLI_FAIL;
    }
    cli_progress pr;
    cli_progress_start(&pr);
    for (int64_t q = 0; q < R; q++) {
        gen_input(ring + (size_t)q * per, s->embedded, q, walk0, T, H, E, K, s->cfg->seed,
                  s->threads);
        cli_progress_update(&pr, "T=%lld: preparing inputs %d%%...", (long long)T,
                            (int)(100.0 * (double)(q + 1) / (double)R));
    }
    memset(s->seen, 0, (size_t)E);

    moe_exec_args ea;
    memset(&ea, 0, sizeof ea);
    ea.hidden_dtype = MOE_DTYPE_F32;
    ea.n_tokens = T;
    ea.output = s->out;
    ea.topk_ids = s->ids;
    ea.topk_weights = s->tw;
    ea.workspace = s->ws;
    ea.workspace_size = s->ws_size;
    ea.stats = &s->last;

    int n_timed = (int)s->cfg->iters;
    times = malloc(sizeof(double) * (size_t)(n_timed > 0 ? n_timed : MAX_ITERS_AUTO));
    if (!times) {
        cli_err(CMD, "out of memory");
        goto done;
    }
    double distinct_sum = 0.0, res_routed = 0.0, res_shared = 0.0;
    int c_last = 0;
    static uint32_t stamp_gen = 0;
    const int64_t mpass = pass_forwards(E, T, K);
    for (int r = 0; n_timed == 0 || r <= n_timed; r++) {
        int64_t q = r % R;
        /* Embedded: a pass of disjoint expert sets on one copy, then the next copy. A real
         * router picks experts at random, so a checkpoint's copies rotate every forward. */
        int c = (int)((s->copy_next + (s->embedded ? r / mpass : r)) % s->copies);
        c_last = c;
        ea.hidden_states = ring + (size_t)q * per;
        double t0 = cli_now();
        moe_status st = moe_plan_execute_ex(s->plan, s->w[c], &ea);
        double dt = cli_now() - t0;
        if (st != MOE_OK) {
            cli_progress_end(&pr);
            rc = lib_fail(s, st);
            goto done;
        }
        /* distinct experts this forward, and the designed pattern */
        stamp_gen++;
        if (stamp_gen == 0) {
            memset(s->stamp, 0, sizeof(uint32_t) * (size_t)E);
            stamp_gen = 1;
        }
        int64_t distinct = 0, mismatch = 0;
        const int timed = r > 0;
        int64_t base = (walk0 + (q % E) * ((T % E) * (K % E) % E)) % E;
        for (int64_t t = 0; t < T; t++) {
            int64_t tb = (base + (t % E) * (K % E)) % E;
            for (int64_t j = 0; j < K; j++) {
                int32_t id = s->ids[t * K + j];
                if (id < 0 || id >= E) {
                    cli_err(CMD, "T=%lld: topk_ids[%lld][%lld] = %d is outside [0, %lld)",
                            (long long)T, (long long)t, (long long)j, id, (long long)E);
                    goto done;
                }
                if (s->stamp[id] != stamp_gen) {
                    s->stamp[id] = stamp_gen;
                    s->dlist[distinct++] = id;
                }
                s->seen[id] = 1;
                if (s->embedded && id != (tb + j) % E)
                    mismatch = 1;
            }
        }
        row->route_mismatch += mismatch;
        /* Reuse cycles: the distinct weight bytes the forwards from this copy's expert's
         * previous use to this one (both included) touch, the expert itself excluded. Under
         * 4 x LLC the expert counts as served from cache. */
        if (s->shared_bytes > 0)
            s->dlist[distinct] = (int32_t)E;
        int64_t nd = distinct + (s->shared_bytes > 0);
        int64_t *lf = s->last_fwd + (size_t)c * (size_t)(E + 1);
        const double lim = 4.0 * (double)s->llc;
        const int64_t g = s->fwd;
        if (g < s->fen_n) {
            double upto_g = fen_prefix(s, g);
            for (int64_t i = 0; i < nd; i++) {
                int32_t id = s->dlist[i];
                double b = id == E ? s->shared_bytes : s->expert_bytes;
                int64_t L = lf[id];
                if (!timed || L < 0)
                    continue;
                double cur = 0.0; /* this forward's others not counted from L on */
                for (int64_t k = 0; k < nd; k++) {
                    int32_t o = s->dlist[k];
                    if (o != id && lf[o] < L)
                        cur += o == E ? s->shared_bytes : s->expert_bytes;
                }
                if (upto_g - fen_prefix(s, L) - b + cur < lim) {
                    if (id == E)
                        res_shared += b;
                    else
                        res_routed += b;
                }
            }
            for (int64_t i = 0; i < nd; i++) {
                int32_t id = s->dlist[i];
                double b = id == E ? s->shared_bytes : s->expert_bytes;
                if (lf[id] >= 0)
                    fen_add(s, lf[id], -b);
                fen_add(s, g, b);
                lf[id] = g;
            }
        }
        s->fwd++;
        if (r == 0) {
            if (n_timed == 0) { /* choose the number of runs from the warm-up */
                double target = s->cfg->min_time;
                double n = dt > 0 ? ceil(target / dt) : MAX_ITERS_AUTO;
                n_timed = n < MIN_ITERS_AUTO ? MIN_ITERS_AUTO
                        : n > MAX_ITERS_AUTO ? MAX_ITERS_AUTO : (int)n;
            }
        } else {
            times[r - 1] = dt;
            distinct_sum += (double)distinct;
        }
        if (r == 0)
            cli_progress_update(&pr, "T=%lld: warm-up done, %d timed runs", (long long)T, n_timed);
        else
            cli_progress_update(&pr, "T=%lld: run %d/%d", (long long)T, r, n_timed);
    }
    cli_progress_end(&pr);
    s->copy_next = (c_last + 1) % s->copies;
    s->walk_next = (walk0 + ((int64_t)(n_timed + 1) % R % E) * ((T % E) * (K % E) % E)) % E;

    row->runs = n_timed;
    row->tuned_tokens = s->last.tuned_tokens;
    double mean = 0;
    for (int i = 0; i < n_timed; i++)
        mean += times[i];
    mean /= n_timed;
    qsort(times, (size_t)n_timed, sizeof(double), cmp_double);
    double med = (n_timed % 2) ? times[n_timed / 2]
                               : 0.5 * (times[n_timed / 2 - 1] + times[n_timed / 2]);
    row->median_ms = med * 1e3;
    row->best_ms = times[0] * 1e3;
    row->mean_ms = mean * 1e3;
    row->distinct_experts = distinct_sum / n_timed;
    row->flops_per_forward = 2.0 * (double)T * (double)K * expert_mats(d) * (double)H * (double)I +
                             2.0 * (double)T * shared_mats(d) * (double)H * (double)Is +
                             2.0 * (double)T * (double)E * (double)H;
    row->bytes_per_forward = row->distinct_experts * s->expert_bytes + s->shared_bytes;
    row->tokens_per_s = (double)T / med;
    row->gflops = row->flops_per_forward / med * 1e-9;
    row->gbps = row->bytes_per_forward / med * 1e-9;
    int64_t uni = 0;
    for (int64_t e = 0; e < E; e++)
        uni += s->seen[e];
    row->union_experts = uni;
    double routed_total = distinct_sum * s->expert_bytes;
    double shared_total = (double)n_timed * s->shared_bytes;
    row->routed_resident_fraction = routed_total > 0 ? res_routed / routed_total : 0.0;
    row->shared_resident_fraction = shared_total > 0 ? res_shared / shared_total : 0.0;
    row->resident_fraction = (routed_total + shared_total) > 0
                           ? (res_routed + res_shared) / (routed_total + shared_total) : 0.0;
    row->cache_resident = row->resident_fraction >= 0.5;
    row_roofline(s, row);
    rc = CLI_OK;
done:
    free(times);
    free(ring);
    return rc;
}

static void print_header(bench_state *s)
{
    const moe_layer_desc *d = &s->desc;
    const bench_cfg *cfg = s->cfg;
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    if (s->embedded) {
        const cli_model *m = cfg->model;
        printf("moe bench: %s MoE layer (model_type %s; library family %s), weights generated "
               "in memory (seed %llu)\n", m->display, m->arch, moe_family_name(d->family),
               (unsigned long long)cfg->seed);
    } else {
        printf("moe bench: checkpoint %s layer %lld (family %s), random inputs\n", cfg->ckdir,
               (long long)cfg->layer, moe_family_name(d->family));
    }
    printf("layer: H %lld, I %lld, E %lld, K %lld", (long long)d->hidden_size,
           (long long)d->moe_intermediate_size, (long long)d->num_experts, (long long)d->top_k);
    if (d->shared_expert_intermediate_size)
        printf(", shared %lld%s", (long long)d->shared_expert_intermediate_size,
               d->shared_expert_gated ? " gated" : "");
    printf(", %s%s, scale %g,%s %s weights%s%s, compute %s\n", cli_scoring_name(d),
           d->renormalize ? " + renormalize" : "", (double)d->routed_scaling_factor,
           expert_mats(d) == 2 ? " non-gated experts (up, down)," : "",
           moe_dtype_name(d->weight_dtype), moe_quant_name(&d->quant)[0] != 'n' ? ", experts quantized " : "",
           moe_quant_name(&d->quant)[0] != 'n' ? moe_quant_name(&d->quant) : "", moe_compute_name(cfg->compute));
    if (s->llc_sysfs >= PROJECT_LLC_BYTES)
        printf("machine: %d threads, kernel table %s, LLC %.0f MiB (sysfs, L%d), MemAvailable "
               "%s\n", moe_ctx_num_threads(s->ctx), moe_ctx_isa(s->ctx),
               (double)s->llc / 1048576.0, s->llc_level, cli_fmt_bytes(b1, sizeof b1, (double)s->mem_avail));
    else
        printf("machine: %d threads, kernel table %s, LLC %.0f MiB per sysfs%s -> assuming "
               "%.0f MiB (the documented LLC of this project's machines), MemAvailable %s\n",
               moe_ctx_num_threads(s->ctx), moe_ctx_isa(s->ctx),
               (double)s->llc_sysfs / 1048576.0, s->llc_sysfs ? "" : " (unknown)",
               (double)s->llc / 1048576.0, cli_fmt_bytes(b1, sizeof b1, (double)s->mem_avail));
    printf("weights: %s per layer copy (experts %s + shared %s; packed %s), %d cop%s in "
           "rotation = %s (%.1f x LLC)\n",
           cli_fmt_bytes(b1, sizeof b1, s->layer_bytes),
           cli_fmt_bytes(b2, sizeof b2, s->layer_bytes - s->shared_bytes),
           cli_fmt_bytes(b3, sizeof b3, s->shared_bytes),
           cli_fmt_bytes(b4, sizeof b4, s->packed_bytes), s->copies, s->copies == 1 ? "y" : "ies",
           cli_fmt_bytes(b5, sizeof b5, s->layer_bytes * s->copies),
           s->layer_bytes * s->copies / (double)s->llc);
    if (s->pack_count > 0)
        printf("packing: %.3f s for the first copy (%s packed, %.2f GB/s), %.3f s for all %d "
               "(%s, in moe_%s)\n",
               s->pack_first_s, cli_fmt_bytes(b1, sizeof b1, s->packed_bytes),
               s->pack_first_s > 0 ? s->packed_bytes / s->pack_first_s * 1e-9 : 0.0,
               s->pack_total_s, s->pack_count,
               s->pack_count == 1 ? "one copy" : "wall time per copy summed",
               s->embedded ? "weights_create" : "checkpoint_load_weights, reading included");
    if (s->have_rf)
        printf("roofline: DRAM read %.1f GB/s (best of 8 passes over %s), f32 FMA %.1f "
               "GFLOP/s, VNNI int8 %.1f GOP/s, bf16 vdpbf16ps %.1f GFLOP/s (%d threads, %s loops); "
               "compute roof %s (the %s), ridge %.2f FLOP/byte; measured in %.2f s\n",
               s->rf.dram_read_gbs, cli_fmt_bytes(b2, sizeof b2, (double)s->rf.dram_buffer_bytes),
               s->rf.fma_f32_gflops, s->rf.vnni_int8_gops, s->rf.bf16_dp_gflops, s->rf.threads, s->rf.isa,
               s->roof->label, s->roof->what, s->ridge, s->rf.seconds);
    for (int i = 0; i < s->nnotes; i++)
        printf("note: %s\n", s->notes[i]);
    if (moe_plan_tuning_file(s->plan)[0])
        printf("tuning: %s (each row runs the entry of the nearest token count: 'entry' ends the row)\n",
               moe_plan_tuning_file(s->plan));
    printf("\n%7s %5s %11s %11s %12s %10s %9s %8s  %-*s%s\n", "T", "runs", "median ms",
           "best ms", "tokens/s", "GFLOP/s", "GB/s", "experts", s->have_rf ? 26 : 0,
           "cache-resident", s->have_rf ? " roofline" : "");
    fflush(stdout);
}

static void print_row(const bench_state *s, const bench_row *r)
{
    char cache[64];
    double pct = 100.0 * r->resident_fraction;
    if (r->resident_fraction <= 0.0)
        snprintf(cache, sizeof cache, "no");
    else if (r->cache_resident)
        snprintf(cache, sizeof cache, "YES (%.0f%% of bytes)", pct);
    else
        snprintf(cache, sizeof cache, "partly (%.0f%% of bytes%s)", pct < 1 ? 1.0 : pct,
                 r->shared_resident_fraction > 0 && r->routed_resident_fraction == 0
                     ? ": shared expert" : "");
    char rf[32] = "";
    if (s->have_rf && r->bound)
        snprintf(rf, sizeof rf, " %.2f %s", r->bound_fraction, r->bound->label);
    char entry[40] = "";
    if (r->tuned_tokens > 0)
        snprintf(entry, sizeof entry, " entry %lld", (long long)r->tuned_tokens);
    printf("%7lld %5d %11.3f %11.3f %12.1f %10.2f %9.2f %8.1f  %-*s%s%s\n", (long long)r->tokens,
           r->runs, r->median_ms, r->best_ms, r->tokens_per_s, r->gflops, r->gbps,
           r->distinct_experts, s->have_rf ? 26 : 0, cache, rf, entry);
    fflush(stdout);
}

static void print_json(bench_state *s, const bench_row *rows, int nrows)
{
    const moe_layer_desc *d = &s->desc;
    FILE *f = stdout;
    fputs("{\n  \"tool\": \"moe bench\",\n  \"libmoe_version\": ", f);
    cli_json_string(f, moe_version_string());
    fputs(",\n  \"compute\": ", f);
    cli_json_string(f, moe_compute_name(s->cfg->compute));
    fputs(",\n  \"compute_roof\": ", f);
    cli_json_string(f, s->roof->key);
    fputs(",\n  \"tuning_file\": ", f);
    if (moe_plan_tuning_file(s->plan)[0])
        cli_json_string(f, moe_plan_tuning_file(s->plan));
    else
        fputs("null", f);
    fputs(",\n  \"machine\": {\"threads\": ", f);
    cli_json_number(f, moe_ctx_num_threads(s->ctx));
    fputs(", \"isa\": ", f);
    cli_json_string(f, moe_ctx_isa(s->ctx));
    fputs(", \"llc_bytes_sysfs\": ", f);
    cli_json_number(f, (double)s->llc_sysfs);
    fputs(", \"llc_bytes\": ", f);
    cli_json_number(f, (double)s->llc);
    fputs(", \"llc_assumed\": ", f);
    fputs(s->llc_sysfs >= PROJECT_LLC_BYTES ? "false" : "true", f);
    fputs(", \"mem_available_bytes\": ", f);
    cli_json_number(f, (double)s->mem_avail);
    fputs("},\n  \"roofline\": ", f);
    if (s->have_rf) {
        fputs("{\"dram_read_gbs\": ", f);
        cli_json_number(f, s->rf.dram_read_gbs);
        fputs(", \"fma_f32_gflops\": ", f);
        cli_json_number(f, s->rf.fma_f32_gflops);
        fputs(", \"vnni_int8_gops\": ", f);
        cli_json_number(f, s->rf.vnni_int8_gops);
        fputs(", \"bf16_dp_gflops\": ", f);
        cli_json_number(f, s->rf.bf16_dp_gflops);
        fputs(", \"ridge_flop_per_byte\": ", f);
        cli_json_number(f, s->rf.ridge_flop_per_byte);
        fputs(", \"compute_roof\": ", f);
        cli_json_string(f, s->roof->key);
        fputs(", \"compute_roof_value\": ", f);
        cli_json_number(f, s->roof_peak);
        fputs(", \"compute_ridge_flop_per_byte\": ", f);
        cli_json_number(f, s->ridge);
        fprintf(f, ", \"threads\": %d, \"isa\": ", s->rf.threads);
        cli_json_string(f, s->rf.isa);
        fputs(", \"dram_buffer_bytes\": ", f);
        cli_json_number(f, (double)s->rf.dram_buffer_bytes);
        fputs(", \"llc_bytes_sysfs\": ", f);
        cli_json_number(f, (double)s->rf.llc_bytes);
        fputs(", \"seconds\": ", f);
        cli_json_number(f, s->rf.seconds);
        fputs("}", f);
    } else {
        fputs("null", f);
    }
    fputs(",\n  \"layer\": {\"source\": ", f);
    cli_json_string(f, s->embedded ? "embedded" : "checkpoint");
    if (s->embedded) {
        fputs(", \"model\": ", f);
        cli_json_string(f, s->cfg->model->name);
        fputs(", \"display\": ", f);
        cli_json_string(f, s->cfg->model->display);
        fputs(", \"model_type\": ", f);
        cli_json_string(f, s->cfg->model->arch);
        fputs(", \"routing_as_real_model\": ", f);
        fputs(s->cfg->model->differs ? "false" : "true", f);
        fputs(", \"seed\": ", f);
        cli_json_number(f, (double)s->cfg->seed);
    } else {
        fputs(", \"checkpoint\": ", f);
        cli_json_string(f, s->cfg->ckdir);
        fputs(", \"layer\": ", f);
        cli_json_number(f, (double)s->cfg->layer);
    }
    fputs(", \"family\": ", f);
    cli_json_string(f, moe_family_name(d->family));
    fprintf(f, ", \"hidden_size\": %lld, \"moe_intermediate_size\": %lld, \"num_experts\": %lld, "
            "\"top_k\": %lld, \"shared_expert_intermediate_size\": %lld, "
            "\"shared_expert_gated\": %s, \"scoring\": \"%s\", \"renormalize\": %s, "
            "\"routed_scaling_factor\": ",
            (long long)d->hidden_size, (long long)d->moe_intermediate_size,
            (long long)d->num_experts, (long long)d->top_k,
            (long long)d->shared_expert_intermediate_size,
            d->shared_expert_gated ? "true" : "false",
            cli_scoring_name(d),
            d->renormalize ? "true" : "false");
    cli_json_number(f, (double)d->routed_scaling_factor);
    fputs(", \"weight_dtype\": ", f);
    cli_json_string(f, moe_dtype_name(d->weight_dtype));
    fputs(", \"quant\": ", f);
    cli_json_string(f, moe_quant_name(&d->quant));
    fputs("},\n  \"weights\": {\"expert_bytes\": ", f);
    cli_json_number(f, s->expert_bytes);
    fputs(", \"shared_bytes\": ", f);
    cli_json_number(f, s->shared_bytes);
    fputs(", \"layer_bytes\": ", f);
    cli_json_number(f, s->layer_bytes);
    fputs(", \"packed_bytes\": ", f);
    cli_json_number(f, s->packed_bytes);
    fputs(", \"pack_seconds\": ", f);
    cli_json_number(f, s->pack_count ? s->pack_first_s : NAN);
    fputs(", \"pack_seconds_all_copies\": ", f);
    cli_json_number(f, s->pack_count ? s->pack_total_s : NAN);
    fputs(", \"pack_includes_reading\": ", f);
    fputs(s->embedded ? "false" : "true", f);
    fprintf(f, ", \"copies\": %d, \"copies_wanted\": %d", s->copies, s->copies_wanted);
    if (s->embedded)
        fprintf(f, ", \"distinct_generated_experts\": %d", s->pool);
    fputs("},\n  \"notes\": [", f);
    for (int i = 0; i < s->nnotes; i++) {
        fputs(i ? ", " : "", f);
        cli_json_string(f, s->notes[i]);
    }
    fputs("],\n  \"rows\": [", f);
    for (int i = 0; i < nrows; i++) {
        const bench_row *r = &rows[i];
        fputs(i ? ",\n    " : "\n    ", f);
        fprintf(f, "{\"tokens\": %lld, \"runs\": %d, \"median_ms\": ", (long long)r->tokens,
                r->runs);
        cli_json_number(f, r->median_ms);
        fputs(", \"best_ms\": ", f);
        cli_json_number(f, r->best_ms);
        fputs(", \"mean_ms\": ", f);
        cli_json_number(f, r->mean_ms);
        fputs(", \"tokens_per_s\": ", f);
        cli_json_number(f, r->tokens_per_s);
        fputs(", \"gflops\": ", f);
        cli_json_number(f, r->gflops);
        fputs(", \"gbps\": ", f);
        cli_json_number(f, r->gbps);
        fputs(", \"distinct_experts\": ", f);
        cli_json_number(f, r->distinct_experts);
        fputs(", \"flops_per_forward\": ", f);
        cli_json_number(f, r->flops_per_forward);
        fputs(", \"bytes_per_forward\": ", f);
        cli_json_number(f, r->bytes_per_forward);
        fprintf(f, ", \"input_ring\": %lld, \"experts_touched\": %lld, \"resident_fraction\": ",
                (long long)r->ring, (long long)r->union_experts);
        cli_json_number(f, r->resident_fraction);
        fputs(", \"routed_resident_fraction\": ", f);
        cli_json_number(f, r->routed_resident_fraction);
        fputs(", \"shared_resident_fraction\": ", f);
        cli_json_number(f, r->shared_resident_fraction);
        fprintf(f, ", \"cache_resident\": %s", r->cache_resident ? "true" : "false");
        fprintf(f, ", \"tuned_tokens\": %lld", (long long)r->tuned_tokens);
        if (s->embedded)
            fprintf(f, ", \"routing_mismatches\": %lld", (long long)r->route_mismatch);
        if (s->have_rf && r->bound) {
            fputs(", \"arithmetic_intensity\": ", f);
            cli_json_number(f, r->intensity);
            fputs(", \"roofline_bound\": ", f);
            cli_json_string(f, r->bound->label);
            fputs(", \"roofline_fraction\": ", f);
            cli_json_number(f, r->bound_fraction);
            fputs(", \"roof\": ", f);
            cli_json_string(f, r->bound->key);
            fputs(", \"roof_value\": ", f);
            cli_json_number(f, r->bound_value);
        }
        fputs("}", f);
    }
    fputs("\n  ]\n}\n", f);
    fflush(f);
}

/* Bytes besides the packed layer copies, for the memory guard. */
static double fixed_bytes(const bench_state *s, int64_t E)
{
    const moe_layer_desc *d = &s->desc;
    const int64_t H = d->hidden_size, K = d->top_k, I = d->moe_intermediate_size;
    const double ds = (double)moe_dtype_size(d->weight_dtype);
    int64_t tmax = 0;
    double ring_max = 0;
    for (int i = 0; i < s->cfg->ntokens; i++) {
        int64_t T = s->cfg->tokens[i];
        if (T > tmax)
            tmax = T;
        double rb = (double)ring_size(s->embedded, T, H, E, K, s->ring_cap) * (double)T *
                    (double)H * 4.0;
        if (rb > ring_max)
            ring_max = rb;
    }
    double b = ring_max + (double)tmax * ((double)H * 4.0 + (double)K * 8.0) + (double)s->ws_size;
    if (s->embedded) {
        int64_t G = s->pool < E ? s->pool : E;
        b += (double)G * expert_mats(d) * (double)H * (double)I * ds + (double)E * (double)H * 4.0 +
             shared_mats(d) * (double)H * (double)d->shared_expert_intermediate_size * ds + (double)H * 4.0;
    }
    return b + 64.0 * 1048576.0; /* allocator and library slack */
}

static double copy_bytes(const bench_state *s, int64_t E)
{
    const moe_layer_desc *d = &s->desc;
    double experts = (double)E * s->expert_bytes + s->shared_bytes;
    /* + f32 router and shared gate; 1% for any padding of the kernel layout */
    return experts * 1.01 + (double)E * (double)d->hidden_size * 4.0 + (double)d->hidden_size * 4.0;
}

int cli_cmd_bench(int argc, char **argv)
{
    return cli_bench_main(argc, argv, NULL);
}

int cli_bench_main(int argc, char **argv, const cli_bench_hook *hook)
{
    if (hook)
        CMD = hook->cmd;
    bench_cfg cfg;
    int prc = parse_bench_args(argc, argv, &cfg, hook);
    if (prc >= 0)
        return prc;

    bench_state S;
    memset(&S, 0, sizeof S);
    bench_state *s = &S;
    s->cfg = &cfg;
    s->embedded = cfg.ckdir == NULL;
    int rc = CLI_FAIL;
    moe_checkpoint *ck = NULL;
    bench_row *rows = NULL;
    moe_status st;
    char b1[32], b2[32], b3[32], b4[32];

    moe_options o;
    moe_options_init(&o);
    o.num_threads = (int)cfg.threads;
    if (hook)
        o.tuning_dir = ""; /* the tuner measures the knobs it sets, never a tuning file's */
    char err[1024] = "";
    st = moe_ctx_create(&o, &s->ctx, err, sizeof err);
    if (st != MOE_OK) {
        cli_err(CMD, "%s", err[0] ? err : moe_status_name(st));
        return CLI_FAIL;
    }
    s->threads = moe_ctx_num_threads(s->ctx);

    /* machine facts */
    s->llc_sysfs = cli_llc_sysfs(&s->llc_level);
    s->llc = s->llc_sysfs >= PROJECT_LLC_BYTES ? s->llc_sysfs : PROJECT_LLC_BYTES;
    s->mem_avail = cli_mem_available();
    double usable = s->mem_avail ? 0.9 * (double)s->mem_avail : 0.0;
    if (cfg.mem_limit && (usable == 0.0 || (double)cfg.mem_limit < usable))
        usable = (double)cfg.mem_limit;
    s->ring_cap = (uint64_t)(usable > 0 ? usable / 16 : 256.0 * 1048576.0);
    if (s->ring_cap > (1ull << 30))
        s->ring_cap = 1ull << 30;
    if (s->ring_cap < (64ull << 20))
        s->ring_cap = 64ull << 20;

    /* the layer */
    if (s->embedded) {
        const cli_model *m = cfg.model;
        moe_layer_desc_init(&s->desc);
        s->desc.family = m->family;
        s->desc.hidden_size = m->hidden_size;
        s->desc.moe_intermediate_size = m->intermediate_size;
        s->desc.num_experts = cfg.num_experts ? cfg.num_experts : m->num_experts;
        s->desc.top_k = m->top_k;
        s->desc.renormalize = m->renormalize;
        s->desc.routed_scaling_factor = m->routed_scaling_factor;
        s->desc.shared_expert_intermediate_size = m->shared_intermediate_size;
        s->desc.shared_expert_gated = m->shared_gated;
        s->desc.weight_dtype = cfg.dtype;
        s->desc.quant = cfg.q;
        const char *routing_note = cli_model_routing(m, &s->desc); /* the family's routing */
        if (routing_note)
            add_note(s, "%s", routing_note);
        if (m->differs)
            add_note(s, "%s", m->differs);
        if (m->family == MOE_FAMILY_CUSTOM && !m->differs)
            add_note(s, "the library has no %s family; the layer is benched as family custom "
                     "with the same routing and expert math", m->arch);
        if (cfg.num_experts && cfg.num_experts != m->num_experts)
            add_note(s, "E overridden: %lld experts instead of %lld; per-token bytes and FLOPs "
                     "are the real model's, the layer's weight set is smaller",
                     (long long)cfg.num_experts, (long long)m->num_experts);
    } else {
        if ((st = moe_checkpoint_open_opts(s->ctx, cfg.ckdir, &cfg.ck_opt, &ck)) != MOE_OK) {
            rc = lib_fail(s, st);
            goto done;
        }
        if (!cfg.have_layer) {
            int64_t n = moe_checkpoint_num_layers(ck), l;
            for (l = 0; l < n && !moe_checkpoint_is_moe_layer(ck, l); l++)
                ;
            if (l == n) {
                cli_err(CMD, "%s: no MoE layer among its %lld layers", cfg.ckdir, (long long)n);
                goto done;
            }
            /* past the MoE layers libmoe refuses (DeepSeek-V4's hash_moe ones), when one runs */
            int64_t r = l;
            while (r < n && (!moe_checkpoint_is_moe_layer(ck, r) ||
                             moe_checkpoint_layer_desc(ck, r, &s->desc) == MOE_EUNSUPPORTED))
                r++;
            cfg.layer = r < n ? r : l;
        }
        if ((st = moe_checkpoint_layer_desc(ck, cfg.layer, &s->desc)) != MOE_OK) {
            rc = lib_fail(s, st);
            goto done;
        }
        add_note(s, "the router is the checkpoint's: inputs are uniform random in [-1, 1), a "
                 "ring of distinct tensors per T; distinct experts are counted from topk_ids");
    }
    const moe_layer_desc *d = &s->desc;
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const double ds = (double)moe_dtype_size(d->weight_dtype);
    /* bytes per weight the kernels read: compute bf16 packs f32 and f16 weights as bf16 */
    const double dk = cfg.compute == MOE_COMPUTE_BF16 ? 2.0 : ds;
    s->expert_bytes = expert_mats(d) * (double)H * (double)I * dk;
    if (cfg.quant && moe_quant_name(&d->quant)[0] != 'n') {
        /* source bytes until packing gives the bytes the kernels read */
        size_t cb, sb, zb, tot = 0;
        for (int m = 0, nm = expert_mats(d); m < nm; m++) {
            const int dn = m == nm - 1;
            const moe_qweight *qw = dn ? &d->quant.w2 : &d->quant.w13;
            if (moe_quantize_matrix_sizes(qw, dn ? H : I, dn ? I : H, &cb, &sb, &zb) != MOE_OK) {
                cli_err(CMD, "--quant %s: the layer's shapes (H %lld, I %lld) cannot be quantized so",
                        cfg.quant, (long long)H, (long long)I);
                goto done;
            }
            tot += cb + sb + zb;
        }
        s->expert_bytes = (double)tot;
    }
    s->shared_bytes = shared_mats(d) * (double)H * (double)d->shared_expert_intermediate_size * dk;
    if (dk != ds)
        add_note(s, "compute bf16: the %s weights are rounded to bf16 once at packing, so the kernels read 2 bytes "
                 "per weight (GB/s and the roofline count those)", moe_dtype_name(d->weight_dtype));
    s->layer_bytes = (double)E * s->expert_bytes + s->shared_bytes;
    {
        /* the generated experts are in the source dtype (quantized: the codes and scales) */
        const double gen = cfg.quant && moe_quant_name(&d->quant)[0] != 'n' ? s->expert_bytes
                                                                             : expert_mats(d) * (double)H * (double)I * ds;
        double p = floor((double)POOL_BUDGET / gen);
        s->pool = p < 1 ? 1 : p > (double)E ? (int)E : (int)p;
    }

    moe_plan_config pc;
    moe_plan_config_init(&pc);
    pc.compute = cfg.compute;
    if ((st = moe_plan_create_ex(s->ctx, d, &pc, &s->plan)) != MOE_OK) {
        rc = lib_fail(s, st);
        if (st == MOE_EUNSUPPORTED && cfg.compute == MOE_COMPUTE_BF16) /* with a w8a8 --quant */
            rc = CLI_USAGE;
        goto done;
    }
    /* The roofline, while no weights take memory. */
    if (cfg.roofline) {
        if (!cfg.json && isatty(STDERR_FILENO)) /* progress: on a terminal only (cli_progress) */
            fprintf(stderr, "measuring the roofline (DRAM read, FMA, VNNI and vdpbf16ps peaks)...\n");
        if ((st = moe_roofline_measure(s->ctx, &s->rf)) != MOE_OK) {
            rc = lib_fail(s, st);
            goto done;
        }
        s->have_rf = 1;
    }
    if ((rc = set_compute_roof(s)) != CLI_OK)
        goto done;
    rc = CLI_FAIL;
    int64_t tmax = 0;
    for (int i = 0; i < cfg.ntokens; i++)
        if (cfg.tokens[i] > tmax)
            tmax = cfg.tokens[i];
    s->ws_size = moe_plan_workspace_size(s->plan, tmax);

    /* memory guard, before any large allocation */
    /* Copies: the bytes of the passes over the other copies must reach 4 x LLC before a
     * copy is used again, plus one copy: a row that ends mid-pass leaves its copy partly
     * walked. One copy when the layer alone is >= 4 x LLC: the walk goes through all E
     * experts before reusing any. */
    double pass_bytes = s->layer_bytes;
    if (s->embedded)
        for (int i = 0; i < cfg.ntokens; i++) {
            int64_t T = cfg.tokens[i], K = d->top_k;
            double pb = (T * K >= E ? (double)E : (double)(pass_forwards(E, T, K) * T * K)) *
                        s->expert_bytes + s->shared_bytes;
            if (pb < pass_bytes)
                pass_bytes = pb;
        }
    double want = ceil(4.0 * (double)s->llc / pass_bytes) + 1.0;
    s->copies_wanted = s->layer_bytes >= 4.0 * (double)s->llc ? 1
                     : want > MAX_COPIES ? MAX_COPIES : (int)want;
    double fixed = fixed_bytes(s, E), per_copy = copy_bytes(s, E);
    if (usable > 0) {
        double fit = floor((usable - fixed) / per_copy);
        if (fit < 1) {
            char sugg[512] = "";
            size_t n = 0;
            if (s->embedded) {
                int64_t e2 = 1;
                while (e2 * 2 < E)
                    e2 *= 2;
                for (; e2 >= d->top_k; e2 /= 2)
                    if (fixed_bytes(s, e2) + copy_bytes(s, e2) <= usable)
                        break;
                if (e2 >= d->top_k && e2 < E)
                    n += (size_t)snprintf(sugg + n, sizeof sugg - n,
                                          " --num-experts %lld (%s; each token still reads K = "
                                          "%lld experts of the same size, so per-token bytes "
                                          "and FLOPs stay the same);",
                                          (long long)e2,
                                          cli_fmt_bytes(b1, sizeof b1, fixed_bytes(s, e2) + copy_bytes(s, e2)),
                                          (long long)d->top_k);
                if (d->weight_dtype == MOE_DTYPE_F32)
                    n += (size_t)snprintf(sugg + n, sizeof sugg - n,
                                          " --dtype bf16 (half the bytes);");
            }
            if (tmax > 256 && fixed > 0.25 * usable)
                n += (size_t)snprintf(sugg + n, sizeof sugg - n,
                                      " fewer --tokens (activations and workspace for T = %lld "
                                      "take %s);", (long long)tmax,
                                      cli_fmt_bytes(b1, sizeof b1, fixed));
            if (n == 0)
                snprintf(sugg, sizeof sugg, " none on this machine (a smaller model or more "
                         "memory);");
            sugg[strlen(sugg) - 1] = '\0'; /* drop the last ';' */
            cli_err(CMD, "%s with %s weights does not fit in memory: it needs %s (%s of expert "
                    "weights per layer copy; %s of inputs, outputs, workspace and generation "
                    "buffers) and %s is usable (%s%s). Options that fit:%s",
                    s->embedded ? cfg.model->name : cfg.ckdir, moe_dtype_name(d->weight_dtype),
                    cli_fmt_bytes(b1, sizeof b1, fixed + per_copy),
                    cli_fmt_bytes(b2, sizeof b2, s->layer_bytes),
                    cli_fmt_bytes(b3, sizeof b3, fixed), cli_fmt_bytes(b4, sizeof b4, usable),
                    cfg.mem_limit ? "--mem-limit / " : "",
                    s->mem_avail ? "90% of MemAvailable" : "MemAvailable unknown", sugg);
            goto done;
        }
        s->copies = fit < s->copies_wanted ? (int)fit : s->copies_wanted;
    } else {
        s->copies = 1;
        add_note(s, "MemAvailable is unknown: no memory guard, and one layer copy");
    }
    if (s->copies < s->copies_wanted)
        add_note(s, "memory allows %d layer cop%s of the %d that keep reused weights 4 x LLC "
                 "apart: the cache-resident column shows what is served from cache", s->copies,
                 s->copies == 1 ? "y" : "ies", s->copies_wanted);

    /* buffers */
    s->w = calloc((size_t)s->copies, sizeof *s->w);
    s->ws = s->ws_size ? alloc64(s->ws_size) : NULL;
    s->out = alloc64((size_t)tmax * (size_t)H * sizeof(float));
    s->ids = alloc64((size_t)tmax * (size_t)d->top_k * sizeof(int32_t));
    s->tw = alloc64((size_t)tmax * (size_t)d->top_k * sizeof(float));
    s->stamp = calloc((size_t)E, sizeof *s->stamp);
    s->seen = calloc((size_t)E, 1);
    s->dlist = calloc((size_t)E + 1, sizeof *s->dlist);
    s->last_fwd = malloc((size_t)s->copies * (size_t)(E + 1) * sizeof *s->last_fwd);
    s->fen_n = (int64_t)cfg.ntokens * ((cfg.iters ? cfg.iters : MAX_ITERS_AUTO) + 1);
    s->fen = calloc((size_t)s->fen_n + 1, sizeof *s->fen);
    if (!s->w || (s->ws_size && !s->ws) || !s->out || !s->ids || !s->tw || !s->stamp || !s->seen ||
        !s->dlist || !s->last_fwd || !s->fen) {
        cli_err(CMD, "out of memory allocating buffers for T = %lld", (long long)tmax);
        goto done;
    }
    for (size_t i = 0; i < (size_t)s->copies * (size_t)(E + 1); i++)
        s->last_fwd[i] = -1;

    if (s->embedded) {
        if ((rc = build_embedded(s)) != CLI_OK)
            goto done;
        rc = CLI_FAIL;
    } else {
        cli_progress pr;
        cli_progress_start(&pr);
        for (int c = 0; c < s->copies; c++) {
            cli_progress_update(&pr, "loading weights: copy %d/%d...", c + 1, s->copies);
            double t0 = cli_now();
            st = moe_checkpoint_load_weights(ck, cfg.layer, s->plan, &s->w[c]);
            note_pack_time(s, cli_now() - t0);
            if (st != MOE_OK) {
                cli_progress_end(&pr);
                rc = lib_fail(s, st);
                goto done;
            }
        }
        cli_progress_end(&pr);
        moe_checkpoint_free(ck);
        ck = NULL;
    }
    s->packed_bytes = (double)moe_weights_expert_bytes(s->w[0]);
    if (moe_quant_name(&d->quant)[0] != 'n') {
        /* what the kernels read per expert: packed codes + f32 scales (+ zero points) */
        s->expert_bytes = (s->packed_bytes - s->shared_bytes) / (double)E;
        s->layer_bytes = (double)E * s->expert_bytes + s->shared_bytes;
        add_note(s, "routed experts quantized as %s (moe_quantize_matrix of f32 weights): %.2f MB "
                 "per expert read (codes + f32 scales as packed) vs %.2f MB in %s",
                 moe_quant_name(&d->quant), s->expert_bytes * 1e-6, expert_mats(d) * (double)H * (double)I * ds * 1e-6,
                 moe_dtype_name(d->weight_dtype));
    }
    if (s->shared_bytes > 0)
        add_note(s, "the shared expert (%s per copy) runs in every forward, so it is reused "
                 "every %d forward(s) and may be served from cache at small T (the cache column "
                 "counts it), unlike real decode where the other layers run in between",
                 cli_fmt_bytes(b1, sizeof b1, s->shared_bytes), s->copies);
    if (s->embedded && s->pool < E)
        add_note(s, "%d distinct expert weight sets are generated and reused round-robin over "
                 "the %lld experts (each expert still has its own packed memory)", s->pool,
                 (long long)E);

    if (hook) {
        rc = hook->body(s, hook->user);
        goto done;
    }
    rows = calloc((size_t)cfg.ntokens, sizeof *rows);
    if (!rows) {
        cli_err(CMD, "out of memory");
        goto done;
    }
    if (!cfg.json)
        print_header(s);
    for (int i = 0; i < cfg.ntokens; i++) {
        if (run_row(s, cfg.tokens[i], &rows[i]) != CLI_OK)
            goto done;
        if (!cfg.json)
            print_row(s, &rows[i]);
    }
    int64_t mism = 0;
    for (int i = 0; i < cfg.ntokens; i++)
        mism += rows[i].route_mismatch;
    if (s->embedded && mism > 0) {
        add_note(s, "routing left the designed round-robin pattern in %lld forward(s); the "
                 "distinct expert counts above come from topk_ids", (long long)mism);
        if (!cfg.json)
            printf("note: %s\n", s->notes[s->nnotes - 1]);
    }
    if (cfg.json)
        print_json(s, rows, cfg.ntokens);
    (void)b2;
    (void)b3;
    (void)b4;
    rc = CLI_OK;
done:
    free(rows);
    if (s->w)
        for (int c = 0; c < s->copies; c++)
            moe_weights_free(s->w[c]);
    free(s->w);
    free(s->ws);
    free(s->out);
    free(s->ids);
    free(s->tw);
    free(s->stamp);
    free(s->seen);
    free(s->dlist);
    free(s->last_fwd);
    free(s->fen);
    moe_checkpoint_free(ck);
    moe_plan_free(s->plan);
    moe_ctx_free(s->ctx);
    return rc;
}

/* ---- what `moe tune` uses (tools/bench.h) ---------------------------------------------- */

moe_ctx *cli_bench_ctx(const cli_bench *b)
{
    return b->ctx;
}

const moe_plan *cli_bench_plan(const cli_bench *b)
{
    return b->plan;
}

int cli_bench_ntokens(const cli_bench *b)
{
    return b->cfg->ntokens;
}

int64_t cli_bench_tokens(const cli_bench *b, int i)
{
    return b->cfg->tokens[i];
}

const char *cli_bench_output(const cli_bench *b)
{
    return b->cfg->output;
}

int cli_bench_rounds(const cli_bench *b)
{
    return (int)b->cfg->rounds;
}

void cli_bench_layer_name(const cli_bench *b, char *out, size_t len)
{
    if (b->embedded)
        snprintf(out, len, "%s", b->cfg->model->name);
    else
        snprintf(out, len, "%s layer %lld", b->cfg->ckdir, (long long)b->cfg->layer);
}

int cli_bench_time(cli_bench *b, moe_ctx *ctx, const moe_plan *plan, int64_t T, double *median_ms, double *best_ms,
                   int *runs, moe_exec_stats *stats)
{
    const size_t need = moe_plan_workspace_size(plan, T);
    if (need > b->ws_size) { /* a tuned chunk longer than the default's */
        void *ws = alloc64(need);
        if (!ws) {
            cli_err(CMD, "out of memory for a workspace of %zu bytes", need);
            return CLI_FAIL;
        }
        free(b->ws);
        b->ws = ws;
        b->ws_size = need;
    }
    moe_ctx *ctx0 = b->ctx;
    moe_plan *plan0 = b->plan;
    b->ctx = ctx;
    b->plan = (moe_plan *)plan; /* run_row only executes it */
    bench_row row;
    const int rc = run_row(b, T, &row);
    b->ctx = ctx0;
    b->plan = plan0;
    if (rc != CLI_OK)
        return rc;
    *median_ms = row.median_ms;
    *best_ms = row.best_ms;
    *runs = row.runs;
    if (stats)
        *stats = b->last;
    return CLI_OK;
}
