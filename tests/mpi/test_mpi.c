/* Expert and tensor parallelism over MPI (moe_parallel.h "Parallelism"), run under mpirun:
 *
 *   mpirun -np N test_mpi MODE
 *
 * MODE:
 *   ep         EP (both formats) bit-identical to one process: every family fixture of
 *              $LIBMOE_TEST_DATA (each rank brings its own slice of the tokens, through the
 *              `moe run` path: checkpoint -> plan -> moe_checkpoint_load_weights), and random
 *              layers with skewed caller-supplied routing (90% of the rows to one expert, one row
 *              on each of the others), uneven placement (E = 6 on 4 ranks), bf16 weights, expert
 *              biases, shared experts, weight on input, several chunks, a rank with no tokens,
 *              NULL pointers for the other ranks' experts; resident bytes = the local share.
 *   tp         TP (tp = N) on every fixture and on random layers: within 1e-5 max|one process|,
 *              bit-identical run to run, on every rank, for both all-reduce algorithms, and
 *              reduce_scatter rows equal to the all-reduce rows; with N = 4 also TP x EP (2 x 2),
 *              both formats.
 *   errors     plan mismatches refused on every rank naming the field (description and knob),
 *              duplicate coordinates, wrong communicator size; a rank's bad argument, a short
 *              workspace and a TP group's disagreeing token counts fail every rank, and the plan
 *              stays usable.
 *   quant      dispatch_dtype F8_E4M3 and I8: measured error against exact F32 dispatch.
 *   qexperts   quantized routed experts (fp8 128x128 blocks cut by the TP shard (R11), fp8
 *              [16, 16] blocks, int8-channel, int8-w8a8, fp8-block-w8a8 ([16, 16] and 128x128
 *              blocks), fp8-channel-static / fp8-tensor-static (per-expert input scales),
 *              int4-g32 with and without zero points, mxfp4): EP bit-identical to the
 *              one-process quantized plan; TP (and TP 2 x EP 2) equal to an oracle summing
 *              one-process plans on shards cut by hand (w8a8 and static fp8: codes and scales,
 *              the input scales per expert unchanged, bit-identical;
 *              weight-only: the dequantized f32 shards, within TU_REASSOC_REL),
 *              within 1e-5 of the one-process plan (all but int8-w8a8, whose per-shard
 *              activation scales must put it further away), bit-identical run to run;
 *              fp8-block-w8a8 with top_k 1 and one k-block per shard bit-identical to one
 *              process; fp8-block-w8a8 shards starting inside a k-block and odd int4 shards
 *              refused on every rank / the odd ranks, message checked.
 *   placement  128 experts on N = 6 ranks: 22,22,21,21,21,21, resident bytes, bit-identical;
 *              a round-robin placement runs and is in the plan text.
 *   eplb       placements (contiguous, round_robin, balanced with redundant experts, a hand-made
 *              one with an empty rank): EP bit-identical to one process, both formats, skewed
 *              and routed, several chunks; validation errors; ranks given different placements
 *              (a physical expert, a rank count, contiguous vs round robin) fail together; with
 *              N = 4 also TP 2 x EP 2 with round robin and balanced placements (within 1e-5).
 *   rebal      moe_plan_rebalance: contiguous -> balanced (redundant) -> round_robin, both formats,
 *              bit-identical to one process after each, the report checked, only the new experts
 *              read; a different next / a staging failure on one rank fail every rank, nothing
 *              moves; a rebalance on rank 0 alone times out there, the plan still runs and frees.
 *   eplb_nongated, rebal_nongated   the same on non-gated relu2 experts (Nemotron-H: no gate
 *              arrays given), so placement, redundant copies and moves never read a gate.
 *   capacity   expert_capacity (Switch's per-sequence top-1 capacity) under EP, each rank its own
 *              sequences: bit-identical to one process, both formats, two placements.
 *   bench      dispatch / combine seconds and bytes per token (printed, not checked).
 *   kill       rank 1 dies (SIGKILL) before an execute: the job must end, not hang (driven by
 *              tests/mpi/kill_rank.sh).
 *   compare A B TOL   (one process) two `moe run` outputs: topk_ids equal, output within TOL *
 *              max |A| (TOL 0: bit-identical); used by tests/mpi/run_cli.sh.
 *   late       rank 1 arrives after the timeout: the others get MOE_ETIMEOUT (kill_rank.sh).
 *
 * Exit 0 on success; a failure prints "[rank r] FAIL file:line: why" and calls MPI_Abort (this
 * test may; the library never does). */
#include <mpi.h>

#include <jansson.h>

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe.h"
#include "quant/convert.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

static int R, N;              /* world rank and size */
static const char *g_mode = "";

static void fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "[rank %d] %s: FAIL %s:%d: ", R, g_mode, file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}
#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(c, ...)                                                                                   \
    do {                                                                                                \
        if (!(c))                                                                                       \
            FAIL(__VA_ARGS__);                                                                          \
    } while (0)
#define OKC(ctx, call)                                                                                  \
    do {                                                                                                \
        moe_status s_ = (call);                                                                         \
        CHECK(s_ == MOE_OK, "%s -> %s: %s", #call, moe_status_name(s_), moe_ctx_last_error(ctx));       \
    } while (0)

static void say(const char *fmt, ...)
{
    if (R != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    CHECK(p, "out of memory (%zu bytes)", n);
    return p;
}

static int g_threads = 1; /* worker threads of the contexts made next */

/* WARNING lines of the contexts make_ctx creates, appended (tp_algorithms checks moe.h "Idle
 * knobs"), and echoed to stderr but for the idle-knob lines: the one-process reference plans
 * beside a TP plan on the same ctx make small_allreduce idle on purpose. */
static char g_warnings[4096];
static void log_warnings(moe_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level <= MOE_LOG_WARN) {
        if (!strstr(msg, "has no effect"))
            fprintf(stderr, "libmoe: %s\n", msg);
        size_t n = strlen(g_warnings);
        snprintf(g_warnings + n, sizeof g_warnings - n, "%s\n", msg);
    }
}

static moe_ctx *make_ctx(int64_t chunk, int64_t small_allreduce, const char *tp_reduce)
{
    moe_options o;
    moe_options_init(&o);
    o.log_fn = log_warnings;
    o.num_threads = g_threads;
    o.chunk_size = chunk;
    o.small_allreduce = small_allreduce;
    o.tp_reduce = tp_reduce;
    moe_ctx *ctx = NULL;
    char err[512];
    moe_status st = moe_ctx_create(&o, &ctx, err, sizeof err);
    CHECK(st == MOE_OK, "moe_ctx_create: %s", err);
    return ctx;
}

/* ---- a random layer ------------------------------------------------------------------------- */

typedef struct rlayer {
    moe_layer_desc d;
    float *router;                 /* [E, H] f32 */
    void *g, *u, *dn;              /* [E][I, H], [E][I, H], [E][H, I] in weight_dtype */
    void *shg, *shu, *shd;         /* [Is, H], [Is, H], [H, Is] */
    float *sg;                     /* [1, H] */
    float *gb, *ub, *db;           /* [E][I], [E][I], [E][H] expert biases */
    float *ob;                     /* [H] output bias (with the expert biases) */
    float *on;                     /* [H] output RMSNorm weight (with the expert biases too) */
    float *selb;                   /* [E + Z] selection bias (rlayer_identity) */
    const void **gp, **up, **dp;   /* [E] */
    const void **gbp, **ubp, **dbp;/* [E] */
    moe_weight_source src;
} rlayer;

static void *make_weights(size_t n, moe_dtype dt, uint64_t seed, float scale)
{
    float *f = xmalloc(n * sizeof(float));
    tu_fill_uniform(f, n, seed, -scale, scale);
    if (dt == MOE_DTYPE_F32)
        return f;
    uint16_t *b = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        b[i] = moe_f32_to_bf16(f[i]);
    free(f);
    return b;
}

static void rlayer_make(rlayer *L, int64_t H, int64_t I, int64_t E, int64_t K, int64_t Is, int gated, int bias,
                        int on_input, moe_dtype wdt, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    moe_layer_desc_init(&L->d);
    L->d.hidden_size = H;
    L->d.moe_intermediate_size = I;
    L->d.num_experts = E;
    L->d.top_k = K;
    L->d.renormalize = !on_input;
    L->d.weight_dtype = wdt;
    L->d.shared_expert_intermediate_size = Is;
    L->d.shared_expert_gated = Is > 0 && gated;
    L->d.has_expert_bias = bias;
    if (on_input) {
        L->d.scoring_func = MOE_SCORING_TOPK_SIGMOID;
        L->d.apply_router_weight_on_input = 1;
    }
    if (bias) {
        L->d.activation = MOE_ACT_SWIGLU_OAI;
        L->d.routed_scaling_factor = 1.5f;
    }
    const size_t es = moe_dtype_size(wdt);
    L->router = make_weights((size_t)(E * H), MOE_DTYPE_F32, seed + 1, 1.0f);
    L->g = make_weights((size_t)(E * I * H), wdt, seed + 2, 0.3f);
    L->u = make_weights((size_t)(E * I * H), wdt, seed + 3, 0.3f);
    L->dn = make_weights((size_t)(E * H * I), wdt, seed + 4, 0.3f);
    L->gp = calloc((size_t)E, sizeof(void *));
    L->up = calloc((size_t)E, sizeof(void *));
    L->dp = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        L->gp[e] = (const unsigned char *)L->g + (size_t)(e * I * H) * es;
        L->up[e] = (const unsigned char *)L->u + (size_t)(e * I * H) * es;
        L->dp[e] = (const unsigned char *)L->dn + (size_t)(e * H * I) * es;
    }
    L->src.router = L->router;
    L->src.router_dtype = MOE_DTYPE_F32;
    L->src.gate_proj = L->gp;
    L->src.up_proj = L->up;
    L->src.down_proj = L->dp;
    if (Is > 0) {
        L->shg = make_weights((size_t)(Is * H), wdt, seed + 5, 0.3f);
        L->shu = make_weights((size_t)(Is * H), wdt, seed + 6, 0.3f);
        L->shd = make_weights((size_t)(H * Is), wdt, seed + 7, 0.3f);
        L->sg = make_weights((size_t)H, MOE_DTYPE_F32, seed + 8, 0.3f);
        L->src.shared_gate_proj = L->shg;
        L->src.shared_up_proj = L->shu;
        L->src.shared_down_proj = L->shd;
        L->src.shared_expert_gate = L->sg;
    }
    if (bias) {
        L->gb = make_weights((size_t)(E * I), MOE_DTYPE_F32, seed + 9, 0.2f);
        L->ub = make_weights((size_t)(E * I), MOE_DTYPE_F32, seed + 10, 0.2f);
        L->db = make_weights((size_t)(E * H), MOE_DTYPE_F32, seed + 11, 0.2f);
        L->gbp = calloc((size_t)E, sizeof(void *));
        L->ubp = calloc((size_t)E, sizeof(void *));
        L->dbp = calloc((size_t)E, sizeof(void *));
        for (int64_t e = 0; e < E; e++) {
            L->gbp[e] = L->gb + e * I;
            L->ubp[e] = L->ub + e * I;
            L->dbp[e] = L->db + e * H;
        }
        L->src.gate_bias = L->gbp;
        L->src.up_bias = L->ubp;
        L->src.down_bias = L->dbp;
        L->src.expert_bias_dtype = MOE_DTYPE_F32;
        /* and JetMoE's output bias, added once per token on the rank that writes its row */
        L->d.has_output_bias = 1;
        L->ob = make_weights((size_t)H, MOE_DTYPE_F32, seed + 12, 0.5f);
        L->src.output_bias = L->ob;
        L->src.output_bias_dtype = MOE_DTYPE_F32;
        /* and A.X-K1's output RMSNorm after it, on the complete rows of the rank that writes them */
        L->d.has_output_norm = 1;
        L->d.output_norm_eps = 1e-5f;
        L->on = make_weights((size_t)H, MOE_DTYPE_F32, seed + 13, 0.5f);
        L->src.output_norm = L->on;
        L->src.output_norm_dtype = MOE_DTYPE_F32;
    }
}

/* Make L's experts non-gated (Nemotron-H's relu2: W1 is up_proj; the gate arrays, gate biases
 * and the shared expert's gate_proj are not given, so a read of one crashes). */
static void rlayer_nongated(rlayer *L)
{
    L->d.activation = MOE_ACT_RELU2;
    L->src.gate_proj = NULL;
    L->src.gate_bias = NULL;
    L->src.shared_gate_proj = NULL;
}

/* modes eplb_nongated and rebal_nongated: mode_eplb / mode_rebal on non-gated experts */
static int g_nongated;

static void rlayer_free(rlayer *L)
{
    free(L->router);
    free(L->g);
    free(L->u);
    free(L->dn);
    free(L->shg);
    free(L->shu);
    free(L->shd);
    free(L->sg);
    free(L->gb);
    free(L->ub);
    free(L->db);
    free(L->ob);
    free(L->on);
    free(L->selb);
    free(L->gp);
    free(L->up);
    free(L->dp);
    free(L->gbp);
    free(L->ubp);
    free(L->dbp);
}

/* LongCat-Flash's identity experts on a layer of rlayer_make: Z more router rows [E + Z, H] and a
 * selection bias [E + Z] (softmax, not renormalized, scale 1.5); ids >= E are w * x terms. */
static void rlayer_identity(rlayer *L, int64_t Z, uint64_t seed)
{
    const int64_t E = L->d.num_experts, H = L->d.hidden_size;
    free(L->router);
    L->router = make_weights((size_t)((E + Z) * H), MOE_DTYPE_F32, seed + 1, 1.0f);
    L->src.router = L->router;
    L->selb = make_weights((size_t)(E + Z), MOE_DTYPE_F32, seed + 2, 0.1f);
    L->src.selection_bias = L->selb;
    L->src.selection_bias_dtype = MOE_DTYPE_F32;
    L->d.has_selection_bias = 1;
    L->d.num_identity_experts = Z;
    L->d.scoring_func = MOE_SCORING_SOFTMAX;
    L->d.renormalize = 0;
    L->d.routed_scaling_factor = 1.5f;
}

/* The source with the other EP ranks' experts as NULL pointers (they must not be read). */
typedef struct local_src {
    moe_weight_source src;
    const void **gp, **up, **dp, **gbp, **ubp, **dbp;
} local_src;

static void local_src_make(local_src *ls, const rlayer *L, const moe_plan *plan)
{
    const int64_t E = L->d.num_experts;
    int32_t *map = xmalloc(sizeof(int32_t) * (size_t)E);
    CHECK(moe_plan_expert_map(plan, map) == MOE_OK, "moe_plan_expert_map");
    ls->src = L->src;
    ls->gp = calloc((size_t)E, sizeof(void *));
    ls->up = calloc((size_t)E, sizeof(void *));
    ls->dp = calloc((size_t)E, sizeof(void *));
    ls->gbp = calloc((size_t)E, sizeof(void *));
    ls->ubp = calloc((size_t)E, sizeof(void *));
    ls->dbp = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        if (map[e] < 0)
            continue;
        ls->gp[e] = L->gp[e];
        ls->up[e] = L->up[e];
        ls->dp[e] = L->dp[e];
        if (L->gbp) {
            ls->gbp[e] = L->gbp[e];
            ls->ubp[e] = L->ubp[e];
            ls->dbp[e] = L->dbp[e];
        }
    }
    ls->src.gate_proj = L->src.gate_proj ? ls->gp : NULL; /* NULL: non-gated experts */
    ls->src.up_proj = ls->up;
    ls->src.down_proj = ls->dp;
    if (L->gbp) {
        ls->src.gate_bias = L->src.gate_bias ? ls->gbp : NULL;
        ls->src.up_bias = ls->ubp;
        ls->src.down_bias = ls->dbp;
    }
    free(map);
}

static void local_src_free(local_src *ls)
{
    free(ls->gp);
    free(ls->up);
    free(ls->dp);
    free(ls->gbp);
    free(ls->ubp);
    free(ls->dbp);
}

/* ---- running a plan ------------------------------------------------------------------------- */

typedef struct result {
    float *out;      /* [T, H] (rows outside [t0, t1) are the poison NaN) */
    int32_t *ids;    /* [T, K] */
    float *wts;      /* [T, K] */
    int64_t t0, t1;  /* this rank's tokens */
    moe_exec_stats st;
} result;

static void result_free(result *r)
{
    free(r->out);
    free(r->ids);
    free(r->wts);
    memset(r, 0, sizeof *r);
}

/* Execute tokens [t0, t1) of x [T, H] (dtype xdt; logits [T, E] or NULL) on plan, with a
 * workspace for ws_tokens tokens; the results land at their rows of full-size buffers. */
static moe_status exec_rows_ex(moe_plan *plan, moe_weights *w, const void *x, moe_dtype xdt, const float *logits,
                               int64_t T, int64_t t0, int64_t t1, int64_t ws_tokens, const int32_t *in_ids,
                               const float *in_wts, moe_dtype odt, result *r);
static moe_status exec_rows(moe_plan *plan, moe_weights *w, const void *x, moe_dtype xdt, const float *logits,
                            int64_t T, int64_t t0, int64_t t1, int64_t ws_tokens, result *r)
{
    return exec_rows_ex(plan, w, x, xdt, logits, T, t0, t1, ws_tokens, NULL, NULL, MOE_DTYPE_F32, r);
}

/* exec_rows with caller-given routing in_ids / in_wts [T, K] (rows t0.. passed; NULL: routed)
 * and output dtype odt (BF16: r->out holds [T, H] bf16 bits, poison 0xffff). */
static moe_status exec_rows_ex(moe_plan *plan, moe_weights *w, const void *x, moe_dtype xdt, const float *logits,
                               int64_t T, int64_t t0, int64_t t1, int64_t ws_tokens, const int32_t *in_ids,
                               const float *in_wts, moe_dtype odt, result *r)
{
    const moe_layer_desc *d = moe_plan_desc(plan);
    const int64_t H = d->hidden_size, K = d->top_k, E = d->num_experts;
    const size_t es = moe_dtype_size(xdt);
    memset(r, 0, sizeof *r);
    r->t0 = t0;
    r->t1 = t1;
    r->out = xmalloc(sizeof(float) * (size_t)(T * H));
    r->ids = xmalloc(sizeof(int32_t) * (size_t)(T * K));
    r->wts = xmalloc(sizeof(float) * (size_t)(T * K));
    for (int64_t i = 0; i < T * H; i++)
        r->out[i] = NAN;
    if (odt == MOE_DTYPE_BF16)
        memset(r->out, 0xff, sizeof(uint16_t) * (size_t)(T * H));
    size_t wsz = moe_plan_workspace_size(plan, ws_tokens);
    void *ws = wsz ? xmalloc(wsz) : NULL;
    moe_exec_args a;
    memset(&a, 0, sizeof a);
    a.hidden_states = t1 > t0 ? (const unsigned char *)x + (size_t)(t0 * H) * es : NULL;
    a.hidden_dtype = xdt;
    a.n_tokens = t1 - t0;
    a.router_logits = logits && t1 > t0 ? logits + t0 * (E + d->num_identity_experts) : NULL; /* [T, E + Z] */
    a.output = t1 <= t0 ? NULL : odt == MOE_DTYPE_BF16 ? (void *)((uint16_t *)r->out + t0 * H) : (void *)(r->out + t0 * H);
    a.output_dtype = odt;
    a.in_topk_ids = in_ids && t1 > t0 ? in_ids + t0 * K : NULL;
    a.in_topk_weights = in_wts && t1 > t0 ? in_wts + t0 * K : NULL;
    a.topk_ids = t1 > t0 ? r->ids + t0 * K : NULL;
    a.topk_weights = t1 > t0 ? r->wts + t0 * K : NULL;
    a.workspace = ws;
    a.workspace_size = wsz;
    a.stats = &r->st;
    moe_status st = moe_plan_execute_ex(plan, w, &a);
    free(ws);
    return st;
}

/* Rank r's tokens of T over `parts` ranks (parts = ep), unevenly: part r gets a share
 * proportional to r + 1; with zero_last the last part gets none. */
static void token_range(int64_t T, int parts, int r, int zero_last, int64_t *b, int64_t *e)
{
    int64_t tot = 0, before = 0;
    int n = zero_last && parts > 1 ? parts - 1 : parts;
    for (int i = 0; i < n; i++)
        tot += i + 1;
    for (int i = 0; i < r && i < n; i++)
        before += i + 1;
    if (r >= n) {
        *b = *e = T;
        return;
    }
    *b = T * before / tot;
    *e = T * (before + r + 1) / tot;
}

typedef struct pcfg {
    int ep, tp, low_latency;
    int64_t cap;
    moe_dtype ddt;
    int zero_last;
    const moe_placement *pl; /* parallel.placement (NULL: contiguous) */
} pcfg;

/* moe_plan_create_ex for the parallel configuration c. */
static moe_status par_plan_create(moe_ctx *ctx, const moe_layer_desc *d, const pcfg *c, moe_plan **p)
{
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = c->ep;
    cfg.parallel.tp_size = c->tp;
    cfg.parallel.ep_rank = -1;
    cfg.parallel.tp_rank = -1;
    cfg.parallel.low_latency = c->low_latency;
    cfg.parallel.dispatch_dtype = c->ddt;
    cfg.parallel.timeout_s = 60;
    cfg.parallel.placement = c->pl;
    if (c->cap)
        cfg.batched_capacity = c->cap;
    return moe_plan_create_ex(ctx, d, &cfg, p);
}

static moe_plan *par_plan(moe_ctx *ctx, const moe_layer_desc *d, const pcfg *c)
{
    moe_plan *p = NULL;
    OKC(ctx, par_plan_create(ctx, d, c, &p));
    const moe_parallel_config *pc = moe_plan_parallel(p);
    CHECK(pc->ep_rank == R / c->tp && pc->tp_rank == R % c->tp, "derived coordinates (%d, %d) on rank %d",
          pc->ep_rank, pc->tp_rank, R);
    return p;
}

/* This rank's token range under c, and the most tokens any rank gets. */
static void par_tokens(const pcfg *c, int64_t T, int64_t *b, int64_t *e, int64_t *maxslice)
{
    const int ep_rank = R / c->tp;
    token_range(T, c->ep, ep_rank, c->zero_last, b, e);
    *maxslice = 0;
    for (int i = 0; i < c->ep; i++) {
        int64_t bi, ei;
        token_range(T, c->ep, i, c->zero_last, &bi, &ei);
        if (ei - bi > *maxslice)
            *maxslice = ei - bi;
    }
}

/* Compare this rank's rows of `got` with `ref`: bitwise (tol < 0) or max |diff| <= tol *
 * max |ref| over the whole reference. ids and weights always bitwise. Returns max |diff|. */
static double compare(const char *what, const result *got, const result *ref, int64_t H, int64_t K, int64_t T,
                      double tol, int64_t rows0, int64_t rows1)
{
    (void)T;
    const int64_t a = rows0, b = rows1;
    if (b > a) {
        CHECK(memcmp(got->ids + a * K, ref->ids + a * K, sizeof(int32_t) * (size_t)((b - a) * K)) == 0,
              "%s: topk_ids differ", what);
        CHECK(memcmp(got->wts + a * K, ref->wts + a * K, sizeof(float) * (size_t)((b - a) * K)) == 0,
              "%s: topk_weights differ", what);
    }
    const size_t n = (size_t)((b - a) * H);
    double diff = tu_max_abs_diff(got->out + a * H, ref->out + a * H, n);
    if (tol < 0) {
        if (n && memcmp(got->out + a * H, ref->out + a * H, n * sizeof(float)) != 0) {
            for (size_t i = 0; i < n; i++)
                if (memcmp(&got->out[a * H + (int64_t)i], &ref->out[a * H + (int64_t)i], sizeof(float)))
                    FAIL("%s: not bit-identical to one process: row %lld col %lld: %.9g vs %.9g (max |diff| %g)", what,
                         (long long)(a + (int64_t)i / H), (long long)((int64_t)i % H), (double)got->out[a * H + (int64_t)i],
                         (double)ref->out[a * H + (int64_t)i], diff);
        }
    } else {
        double bound = tol * tu_max_abs(ref->out + a * H, n);
        CHECK(diff <= bound, "%s: max |diff| %g exceeds %g (tol %g of max |one process|)", what, diff, bound, tol);
    }
    return diff;
}

/* ---- fixtures -------------------------------------------------------------------------------- */

typedef struct fixture {
    char name[256];
    char dir[1400];
    int64_t layer, T;
    moe_dtype xdt;
    char expert_set[32];        /* meta.json expert_set (ERNIE-4.5-VL's text / vision), or "" */
} fixture;

static int list_fixtures(fixture *fx, int max)
{
    char root[1024];
    tu_data_path(root, sizeof root, "");
    DIR *d = opendir(root);
    CHECK(d, "cannot open fixtures folder %s (LIBMOE_TEST_DATA)", root);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < max) {
        if (de->d_name[0] == '.')
            continue;
        char meta[1600];
        snprintf(meta, sizeof meta, "%s/%s/meta.json", root, de->d_name);
        json_error_t je;
        json_t *m = json_load_file(meta, 0, &je);
        if (!m)
            continue;
        snprintf(fx[n].name, sizeof fx[n].name, "%s", de->d_name);
        snprintf(fx[n].dir, sizeof fx[n].dir, "%s/%s", root, de->d_name);
        fx[n].layer = (int64_t)json_integer_value(json_object_get(m, "layer"));
        fx[n].T = (int64_t)json_integer_value(json_object_get(m, "T"));
        const char *idt = json_string_value(json_object_get(m, "input_dtype"));
        fx[n].xdt = idt && !strcmp(idt, "BF16") ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
        const char *set = json_string_value(json_object_get(m, "expert_set"));
        snprintf(fx[n].expert_set, sizeof fx[n].expert_set, "%s", set ? set : "");
        json_decref(m);
        n++;
    }
    closedir(d);
    /* the same order on every rank */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(fx[j - 1].name, fx[j].name) > 0; j--) {
            fixture t = fx[j];
            fx[j] = fx[j - 1];
            fx[j - 1] = t;
        }
    return n;
}

/* hidden_states of a fixture, aligned copy. */
static void *fixture_input(moe_ctx *ctx, const fixture *f, int64_t H)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/input.safetensors", f->dir);
    moe_safetensors *in = NULL;
    OKC(ctx, moe_safetensors_open(ctx, path, &in));
    moe_tensor_info ti;
    OKC(ctx, moe_safetensors_get(in, "hidden_states", &ti));
    CHECK(ti.dtype == f->xdt && ti.ndim == 2 && ti.shape[0] == f->T && ti.shape[1] == H, "%s: input shape", f->name);
    void *x = xmalloc(ti.nbytes);
    memcpy(x, ti.data, ti.nbytes);
    moe_safetensors_free(in);
    return x;
}

/* One fixture through one process and through the parallel configuration c; tol < 0: bitwise. */
static void fixture_case(const fixture *f, const pcfg *c, double tol, int64_t chunk)
{
    moe_ctx *ctx = make_ctx(chunk, c->tp > 1 ? 0 : -1, NULL);
    moe_checkpoint *ck = NULL;
    moe_checkpoint_options fo; /* the fixture's expert set (ERNIE-4.5-VL's vision fixture) */
    moe_checkpoint_options_init(&fo);
    fo.expert_set = f->expert_set[0] ? f->expert_set : NULL;
    OKC(ctx, moe_checkpoint_open_opts(ctx, f->dir, &fo, &ck));
    moe_layer_desc d;
    OKC(ctx, moe_checkpoint_layer_desc(ck, f->layer, &d));
    void *x = fixture_input(ctx, f, d.hidden_size);
    const int64_t T = f->T, H = d.hidden_size, K = d.top_k;

    moe_plan *p1 = NULL;
    moe_weights *w1 = NULL;
    OKC(ctx, moe_plan_create(ctx, &d, &p1));
    OKC(ctx, moe_checkpoint_load_weights(ck, f->layer, p1, &w1));
    result ref;
    OKC(ctx, exec_rows(p1, w1, x, f->xdt, NULL, T, 0, T, T, &ref));

    const int quantized = strcmp(moe_quant_name(&d.quant), "none") != 0; /* gpt_oss_mxfp4 */
    moe_plan *pp = par_plan(ctx, &d, c);
    moe_weights *wp = NULL;
    OKC(ctx, moe_checkpoint_load_weights(ck, f->layer, pp, &wp));
    {
        /* a rank's share loaded first on a fresh strict checkpoint: the unread-tensor check
         * then resolves the whole layer itself, and finds every tensor read */
        moe_checkpoint_options o;
        moe_checkpoint_options_init(&o);
        o.strict = 1;
        o.expert_set = fo.expert_set;
        moe_checkpoint *ck2 = NULL;
        moe_weights *w2 = NULL;
        OKC(ctx, moe_checkpoint_open_opts(ctx, f->dir, &o, &ck2));
        OKC(ctx, moe_checkpoint_load_weights(ck2, f->layer, pp, &w2));
        moe_weights_free(w2);
        moe_checkpoint_free(ck2);
    }
    /* only the local share is resident */
    const moe_parallel_config *pc = moe_plan_parallel(pp);
    int64_t El = d.num_experts / c->ep + (pc->ep_rank < d.num_experts % c->ep ? 1 : 0);
    int64_t Il = d.moe_intermediate_size / c->tp + (pc->tp_rank < d.moe_intermediate_size % c->tp ? 1 : 0);
    int64_t Is = d.shared_expert_intermediate_size;
    int64_t Isl = Is ? Is / c->tp + (pc->tp_rank < Is % c->tp ? 1 : 0) : 0;
    size_t es = moe_dtype_size(d.weight_dtype);
    /* matrices per expert: gate, up, down; a non-gated activation (Nemotron-H) packs no gate */
    const int64_t nm = moe_activation_gated(d.activation) ? 3 : 2;
    const int64_t nms = moe_activation_gated(d.has_shared_activation ? d.shared_activation : d.activation) ? 3 : 2;
    size_t want = (size_t)(El * nm * H * Il + nms * H * Isl) * es;
    if (quantized) /* codes + scales: tests/mpi "qexperts" checks the exact per-rank layout */
        CHECK(moe_weights_expert_bytes(wp) < moe_weights_expert_bytes(w1), "%s: resident quantized expert bytes %zu, "
              "not below one process's %zu", f->name, moe_weights_expert_bytes(wp), moe_weights_expert_bytes(w1));
    else
        CHECK(moe_weights_expert_bytes(wp) == want, "%s: resident expert bytes %zu, expected %zu (local share)",
              f->name, moe_weights_expert_bytes(wp), want);
    int64_t b, e, maxs;
    par_tokens(c, T, &b, &e, &maxs);
    result got;
    OKC(ctx, exec_rows(pp, wp, x, f->xdt, NULL, T, b, e, maxs, &got));
    int64_t rb = b, re = e;
    if (c->tp > 1) {
        int64_t o0, o1;
        moe_plan_tp_rows(pp, e - b, &o0, &o1);
        rb = b + o0;
        re = b + o1;
    }
    char what[512];
    snprintf(what, sizeof what, "%s (ep %d tp %d %s%s)", f->name, c->ep, c->tp,
             c->low_latency ? "batched" : "standard", c->zero_last ? ", last rank without tokens" : "");
    compare(what, &got, &ref, H, K, T, tol, rb, re);
    {
        /* caller-given routing: this rank's routed ids and weights give the routed bits */
        result given;
        OKC(ctx, exec_rows_ex(pp, wp, x, f->xdt, NULL, T, b, e, maxs, got.ids, got.wts, MOE_DTYPE_F32, &given));
        CHECK(memcmp(given.out + rb * H, got.out + rb * H, sizeof(float) * (size_t)((re - rb) * H)) == 0,
              "%s: caller-given routing (the routed ids and weights) differs from the routed output", what);
        result_free(&given);
    }
    if (tol >= 0) {
        /* TP: bit-identical run to run */
        result again;
        OKC(ctx, exec_rows(pp, wp, x, f->xdt, NULL, T, b, e, maxs, &again));
        CHECK(memcmp(again.out + rb * H, got.out + rb * H, sizeof(float) * (size_t)((re - rb) * H)) == 0,
              "%s: TP output differs between two runs", what);
        result_free(&again);
    }
    result_free(&got);
    result_free(&ref);
    moe_weights_free(wp);
    moe_plan_free(pp);
    moe_weights_free(w1);
    moe_plan_free(p1);
    moe_checkpoint_free(ck);
    free(x);
    moe_ctx_free(ctx);
}

static void all_fixtures(const pcfg *c, double tol, int64_t chunk)
{
    static fixture fx[128]; /* every fixture folder (69 with LongCat-Flash's; 64 dropped some) */
    int n = list_fixtures(fx, 128);
    CHECK(n >= 20, "only %d fixtures found under LIBMOE_TEST_DATA", n);
    for (int i = 0; i < n; i++)
        fixture_case(&fx[i], c, tol, chunk);
    say("  %d fixtures: ep %d x tp %d, %s%s: %s\n", n, c->ep, c->tp,
        c->low_latency ? "batched" : "standard", c->zero_last ? ", last EP rank without tokens" : "",
        tol < 0 ? "bit-identical to one process" : "within bound");
}

/* ---- random layers ----------------------------------------------------------------------------- */

/* Skewed caller-supplied routing: 90% of the T*K rows' first choice is expert 0, one row on
 * each other expert; with K > 1 the other slots are spread. logits [T, E]. */
static float *skewed_logits(int64_t T, int64_t E, int64_t K, uint64_t seed)
{
    float *lg = xmalloc(sizeof(float) * (size_t)(T * E));
    tu_fill_uniform(lg, (size_t)(T * E), seed, -1.0f, 0.0f);
    for (int64_t t = 0; t < T; t++) {
        /* the first E-1 tokens put one row on each expert 1..E-1; all others pick expert 0 */
        int64_t first = t < E - 1 ? t + 1 : 0;
        lg[t * E + first] = 6.0f;
        for (int64_t k = 1; k < K; k++)
            lg[t * E + (first + k * 3 + t) % E] = 5.0f - 0.5f * (float)k;
    }
    return lg;
}

static void random_case(const char *name, rlayer *L, const float *logits, int64_t T, const pcfg *c, double tol,
                        int64_t chunk)
{
    const moe_layer_desc *d = &L->d;
    const int64_t H = d->hidden_size, K = d->top_k;
    moe_ctx *ctx = make_ctx(chunk, c->tp > 1 ? 0 : -1, NULL);
    float *x = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 77 + (uint64_t)T, -1.0f, 1.0f);
    moe_plan *p1 = NULL;
    moe_weights *w1 = NULL;
    OKC(ctx, moe_plan_create(ctx, d, &p1));
    OKC(ctx, moe_weights_create(p1, &L->src, &w1));
    result ref;
    OKC(ctx, exec_rows(p1, w1, x, MOE_DTYPE_F32, logits, T, 0, T, T, &ref));

    moe_plan *pp = par_plan(ctx, d, c);
    local_src ls;
    local_src_make(&ls, L, pp);
    moe_weights *wp = NULL;
    OKC(ctx, moe_weights_create(pp, &ls.src, &wp));
    int64_t b, e, maxs;
    par_tokens(c, T, &b, &e, &maxs);
    result got;
    OKC(ctx, exec_rows(pp, wp, x, MOE_DTYPE_F32, logits, T, b, e, maxs, &got));
    char what[512];
    snprintf(what, sizeof what, "%s (ep %d tp %d %s%s)", name, c->ep, c->tp, c->low_latency ? "batched" : "standard",
             c->zero_last ? ", last rank without tokens" : "");
    if (c->pl) { /* the resident experts follow the placement: one packed copy per physical expert */
        int64_t P0 = 0;
        for (int r = 0; r < R / c->tp; r++)
            P0 += c->pl->rank_num_physical[r];
        int32_t *map = xmalloc(sizeof(int32_t) * (size_t)d->num_experts); /* [E] */
        OKC(ctx, moe_plan_expert_map(pp, map));
        for (int32_t i = 0; i < c->pl->rank_num_physical[R / c->tp]; i++)
            CHECK(map[c->pl->physical_to_logical[P0 + i]] == i, "%s: expert map: logical %d is not local %d", what,
                  (int)c->pl->physical_to_logical[P0 + i], (int)i);
        free(map);
    }
    int64_t rb = b, re = e;
    if (c->tp > 1) {
        int64_t o0, o1;
        moe_plan_tp_rows(pp, e - b, &o0, &o1);
        rb = b + o0;
        re = b + o1;
    }
    compare(what, &got, &ref, H, K, T, tol, rb, re);
    CHECK(strcmp(got.st.prepare_finalize, c->ep > 1 ? (c->low_latency ? "ep_batched" : "ep_alltoall")
                                                    : (c->low_latency ? "local_batched" : "local")) == 0,
          "%s: prepare_finalize %s", what, got.st.prepare_finalize);
    /* every row routed to this rank's experts was received: sum over ranks = T*K, less the
     * identity experts' rows (ids >= E: never sent, added by the sender's combine) */
    long long rows = got.st.received_rows, all = 0, n_identity = 0;
    for (int64_t i = 0; i < T * K; i++)
        n_identity += ref.ids[i] >= d->num_experts;
    if (d->num_identity_experts > 0)
        CHECK(n_identity > 0 && n_identity < T * K, "%s: %lld of %lld rows pick an identity expert", what, n_identity,
              (long long)(T * K));
    MPI_Allreduce(&rows, &all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (c->ep > 1)
        CHECK(all == (long long)((T * K - n_identity) * c->tp), "%s: %lld rows received over all ranks, expected %lld",
              what, all, (long long)((T * K - n_identity) * c->tp));
    if (c->pl && c->tp == 1) {
        /* the replica rule, computed here from the one-process topk_ids: rank s's token t
         * (counted from its first) of logical expert e with c replicas goes to replica
         * (t + s) mod c in physical order; the rows this rank's experts received must match */
        const moe_placement *pl = c->pl;
        long long want = 0;
        for (int s = 0; s < c->ep; s++) {
            int64_t bs, es;
            token_range(T, c->ep, s, c->zero_last, &bs, &es);
            for (int64_t t = bs; t < es; t++)
                for (int64_t k = 0; k < K; k++) {
                    const int32_t e = ref.ids[t * K + k];
                    if (e >= d->num_experts) /* an identity expert: not sent */
                        continue;
                    int n_rep = 0;
                    for (int32_t q = 0; q < pl->num_physical_experts; q++)
                        n_rep += pl->physical_to_logical[q] == e;
                    const int pick = (int)((t - bs + s) % n_rep);
                    int seen = 0, owner = -1;
                    for (int32_t q = 0, r = 0, in_r = 0; q < pl->num_physical_experts; q++, in_r++) {
                        while (in_r >= pl->rank_num_physical[r]) {
                            r++;
                            in_r = 0;
                        }
                        if (pl->physical_to_logical[q] == e && seen++ == pick)
                            owner = r;
                    }
                    want += owner == R;
                }
        }
        CHECK(rows == want, "%s: this rank's experts received %lld rows, the replica rule gives %lld", what, rows, want);
    }
    result_free(&got);
    result_free(&ref);
    moe_weights_free(wp);
    local_src_free(&ls);
    moe_plan_free(pp);
    moe_weights_free(w1);
    moe_plan_free(p1);
    free(x);
    moe_ctx_free(ctx);
}

/* The random layers of the ep and tp modes. */
static void random_suite(const pcfg *base, double tol)
{
    for (int fmt = 0; fmt < 2; fmt++) {
        for (int zl = 0; zl < 2; zl++) {
            pcfg c = *base;
            c.low_latency = fmt;
            c.cap = fmt ? 8 : 0;
            c.zero_last = zl && c.ep > 1;
            if (zl && c.ep == 1)
                continue;
            rlayer L;
            /* 1. E = 6 (uneven on 4 ranks), K = 1, 90% of the rows to expert 0, gated shared expert */
            {
                const int64_t E = 6, T = 10 * (E - 1);
                rlayer_make(&L, 24, 20, E, 1, 14, 1, 0, 0, MOE_DTYPE_F32, 11);
                float *lg = skewed_logits(T, E, 1, 5);
                random_case("skewed E=6 K=1 shared", &L, lg, T, &c, tol, 16);
                free(lg);
                rlayer_free(&L);
            }
            /* 2. E = 8, K = 2, skewed first choice, bf16 weights, gpt-oss biases and activation,
             *    an output bias */
            {
                const int64_t E = 8, T = 70;
                rlayer_make(&L, 32, 22, E, 2, 0, 0, 1, 0, MOE_DTYPE_BF16, 21);
                float *lg = skewed_logits(T, E, 2, 6);
                random_case("skewed E=8 K=2 bf16 biases + output bias", &L, lg, T, &c, tol, 13);
                free(lg);
                rlayer_free(&L);
            }
            /* 3. weight on the expert input (Llama-4), router computed, ungated shared expert */
            {
                rlayer_make(&L, 16, 12, 5, 1, 12, 0, 0, 1, MOE_DTYPE_F32, 31);
                random_case("weight-on-input E=5 K=1", &L, NULL, 29, &c, tol, 1024);
                rlayer_free(&L);
            }
            /* 4. larger rows with 2 threads: the threaded packing, grouping and combine loops */
            {
                g_threads = 2;
                rlayer_make(&L, 256, 48, 12, 4, 32, 1, 0, 0, MOE_DTYPE_BF16, 35);
                random_case("2 threads H=256 E=12 K=4", &L, NULL, 150, &c, tol, 64);
                rlayer_free(&L);
                g_threads = 1;
            }
            /* 5. LFM2-MoE's renormalize_eps 1e-6 on sigmoid top-k weights and
             *    Cohere2-MoE's "average" (routed_scaling_factor = shared_expert_scale = 0.5) */
            {
                rlayer_make(&L, 24, 16, 8, 3, 16, 0, 0, 0, MOE_DTYPE_F32, 37);
                L.d.scoring_func = MOE_SCORING_TOPK_SIGMOID;
                L.d.renormalize_eps = 1e-6f;
                L.d.routed_scaling_factor = 0.5f;
                L.d.shared_expert_scale = 0.5f;
                random_case("renormalize_eps 1e-6, shared_expert_scale 0.5", &L, NULL, 31, &c, tol, 16);
                rlayer_free(&L);
            }
            /* 5b. DBRX's p-norm renormalization (renormalize_p 2: the top-k over its 2-norm) */
            {
                rlayer_make(&L, 24, 16, 8, 3, 0, 0, 0, 0, MOE_DTYPE_F32, 39);
                L.d.renormalize_p = 2.0f;
                random_case("renormalize_p 2 (DBRX)", &L, NULL, 23, &c, tol, 16);
                rlayer_free(&L);
            }
            /* 6. identity experts (LongCat-Flash): E = 6 + Z = 4 scored, K = 3, a gated shared
             *    expert, router computed; then E = 5 + Z = 3 with skewed caller logits [T, E + Z] */
            {
                rlayer_make(&L, 24, 16, 6, 3, 12, 1, 0, 0, MOE_DTYPE_F32, 45);
                rlayer_identity(&L, 4, 46);
                random_case("identity experts E=6 Z=4 K=3 shared", &L, NULL, 41, &c, tol, 9);
                rlayer_free(&L);
                rlayer_make(&L, 16, 12, 5, 2, 0, 0, 0, 0, MOE_DTYPE_BF16, 47);
                rlayer_identity(&L, 3, 48);
                const int64_t T = 33;
                float *lg = skewed_logits(T, 8, 2, 49);
                random_case("identity experts E=5 Z=3 K=2 skewed logits", &L, lg, T, &c, tol, 1024);
                free(lg);
                rlayer_free(&L);
            }
            /* 7. DeepSeek-V4's sqrt(softplus) scores (router computed on every
             *    rank), Step-3.7's clamp after the SiLU in the routed experts, the shared expert
             *    clamped before it at a limit of its own (shared_swiglu_limit) */
            {
                rlayer_make(&L, 24, 16, 8, 3, 12, 0, 0, 0, MOE_DTYPE_F32, 81);
                L.d.scoring_func = MOE_SCORING_SQRTSOFTPLUS;
                L.d.routed_scaling_factor = 1.5f;
                L.d.activation = MOE_ACT_SWIGLU_POSTCLAMP;
                L.d.swiglu_limit = 0.25f;
                L.d.has_shared_activation = 1;
                L.d.shared_activation = MOE_ACT_SWIGLU_CLAMP;
                L.d.shared_swiglu_limit = 0.2f;
                random_case("sqrtsoftplus + postclamp, shared clamp E=8 K=3", &L, NULL, 41, &c, tol, 1024);
                rlayer_free(&L);
            }
            /* 8. non-gated experts (Nemotron-H's relu2: W1 as up_proj, no gate array given, a
             *    read of one crashes), expert biases, a non-gated ungated shared expert; and GELU */
            for (int a = 0; a < 2; a++) {
                const int64_t E = 8, T = 41;
                rlayer_make(&L, 24, 20, E, 2, 12, 0, 1, 0, a ? MOE_DTYPE_BF16 : MOE_DTYPE_F32, 37 + (uint64_t)a);
                rlayer_nongated(&L);
                if (a)
                    L.d.activation = MOE_ACT_GELU;
                float *lg = skewed_logits(T, E, 2, 7);
                random_case(a ? "non-gated gelu bf16 E=8 K=2 biases shared" : "non-gated relu2 E=8 K=2 biases shared",
                            &L, lg, T, &c, tol, 16);
                free(lg);
                rlayer_free(&L);
            }
        }
    }
    say("  random layers (skewed routing, uneven placement, bf16, biases, weight on input, shared, renormalize_eps, "
        "renormalize_p, shared_expert_scale, identity experts, sqrtsoftplus, postclamp, non-gated): ep %d x tp %d, both "
        "formats: %s\n",
        base->ep, base->tp, tol < 0 ? "bit-identical to one process" : "within bound");
}

/* ---- modes --------------------------------------------------------------------------------------- */

static void mode_ep(void)
{
    pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32};
    for (int fmt = 0; fmt < 2; fmt++) {
        c.low_latency = fmt;
        c.cap = fmt ? 4 : 0;
        c.zero_last = 0;
        all_fixtures(&c, -1, fmt ? 1024 : 3);
    }
    c.low_latency = 0;
    c.cap = 0;
    c.zero_last = 1;
    all_fixtures(&c, -1, 4);
    random_suite(&c, -1);
}

/* TP: the all-reduce algorithms and the reduce_scatter layout on one random layer. */
static void tp_algorithms(int tp, int ep)
{
    rlayer L;
    rlayer_make(&L, 40, 42, 8, 2, 26, 1, 0, 0, MOE_DTYPE_F32, 41);
    const int64_t T = 37, H = 40;
    float *x = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 9, -1.0f, 1.0f);
    pcfg c = {.ep = ep, .tp = tp, .ddt = MOE_DTYPE_F32};
    int64_t b, e, maxs;
    par_tokens(&c, T, &b, &e, &maxs);
    float *outs[3];
    const int64_t small[3] = {1 << 30, 0, 0};
    const char *mode[3] = {"allreduce", "allreduce", "reduce_scatter"};
    /* MOE_TUNING_DIR under a parallel plan is an idle knob (tuning files apply to
     * single-process plans): one WARNING naming it, for two plans on the ctx */
    {
        g_warnings[0] = '\0';
        moe_options o;
        moe_options_init(&o);
        o.log_fn = log_warnings;
        o.num_threads = g_threads;
        o.tuning_dir = "/";
        moe_ctx *ctx = NULL;
        char err[512];
        CHECK(moe_ctx_create(&o, &ctx, err, sizeof err) == MOE_OK, "moe_ctx_create: %s", err);
        moe_plan *p1 = par_plan(ctx, &L.d, &c), *p2 = par_plan(ctx, &L.d, &c);
        const char *w = strstr(g_warnings, "MOE_TUNING_DIR=/ has no effect");
        CHECK(w && !strstr(w + 1, "MOE_TUNING_DIR=/ has no effect"),
              "MOE_TUNING_DIR under EP %d x TP %d: expected one idle-knob WARNING:\n%s", ep, tp, g_warnings);
        moe_plan_free(p1);
        moe_plan_free(p2);
        moe_ctx_free(ctx);
    }
    for (int v = 0; v < 3; v++) {
        g_warnings[0] = '\0';
        moe_ctx *ctx = make_ctx(16, small[v], mode[v]);
        moe_plan *pp = par_plan(ctx, &L.d, &c);
        /* both TP knobs given, and a plan with tp_size > 1: they act, so no idle-knob WARNING
         * (reduce_scatter does make small_allreduce idle, said by the ctx) */
        if (v < 2)
            CHECK(!strstr(g_warnings, "has no effect"), "TP knobs called idle under TP %d:\n%s", tp, g_warnings);
        else
            CHECK(strstr(g_warnings, "small_allreduce=0 has no effect") && !strstr(g_warnings, "tp_reduce=reduce_scatter has no effect"),
                  "reduce_scatter under TP %d: expected only small_allreduce idle:\n%s", tp, g_warnings);
        moe_weights *wp = NULL;
        OKC(ctx, moe_weights_create(pp, &L.src, &wp));
        result got;
        OKC(ctx, exec_rows(pp, wp, x, MOE_DTYPE_F32, NULL, T, b, e, maxs, &got));
        outs[v] = got.out;
        got.out = NULL;
        CHECK(got.st.tp_reduce_seconds > 0 && got.st.tp_reduce_bytes > 0, "TP stats not filled");
        if (v == 2) {
            int64_t o0, o1;
            moe_plan_tp_rows(pp, e - b, &o0, &o1);
            /* owned rows equal the all-reduce rows bit for bit; the others are left alone */
            CHECK(memcmp(outs[2] + (b + o0) * H, outs[0] + (b + o0) * H, sizeof(float) * (size_t)((o1 - o0) * H)) == 0,
                  "reduce_scatter rows differ from the all-reduce rows");
            for (int64_t t = b; t < e; t++)
                if (t < b + o0 || t >= b + o1)
                    CHECK(isnan(outs[2][t * H]), "reduce_scatter wrote row %lld it does not own", (long long)t);
            int64_t want0 = (e - b) / tp * (R % tp) + ((R % tp) < (e - b) % tp ? R % tp : (e - b) % tp);
            CHECK(o0 == want0, "reduce_scatter rows start at %lld, expected %lld", (long long)o0, (long long)want0);
            /* bf16 output: the owned rows are the f32 rows rounded to nearest even, the others untouched */
            result gb;
            OKC(ctx, exec_rows_ex(pp, wp, x, MOE_DTYPE_F32, NULL, T, b, e, maxs, NULL, NULL, MOE_DTYPE_BF16, &gb));
            const uint16_t *ob = (const uint16_t *)gb.out;
            for (int64_t t = b; t < e; t++)
                for (int64_t h = 0; h < H; h++) {
                    const int own = t >= b + o0 && t < b + o1;
                    uint32_t u;
                    memcpy(&u, &outs[2][t * H + h], 4);
                    const uint32_t lo = u & 0xffff, hi = (u >> 16) + (lo > 0x8000 || (lo == 0x8000 && ((u >> 16) & 1)));
                    CHECK(own ? ob[t * H + h] == (uint16_t)hi : ob[t * H + h] == 0xffff,
                          "reduce_scatter bf16 output row %lld col %lld: 0x%04x (%s)", (long long)t, (long long)h,
                          ob[t * H + h], own ? "not the f32 row rounded" : "written, not owned");
                }
            result_free(&gb);
        }
        result_free(&got);
        moe_weights_free(wp);
        moe_plan_free(pp);
        moe_ctx_free(ctx);
    }
    /* both all-reduce algorithms: the same bits */
    CHECK(memcmp(outs[0] + b * H, outs[1] + b * H, sizeof(float) * (size_t)((e - b) * H)) == 0,
          "small-message and reduce-scatter + all-gather all-reduce differ");
    /* identical on every rank of the TP group: compare with the group's first rank */
    MPI_Comm tpc;
    MPI_Comm_split(MPI_COMM_WORLD, R / tp, R % tp, &tpc);
    float *first = xmalloc(sizeof(float) * (size_t)(T * H));
    memcpy(first, outs[0], sizeof(float) * (size_t)(T * H));
    MPI_Bcast(first + b * H, (int)((e - b) * H), MPI_FLOAT, 0, tpc);
    CHECK(memcmp(first + b * H, outs[0] + b * H, sizeof(float) * (size_t)((e - b) * H)) == 0,
          "TP output differs between the ranks of a TP group");
    MPI_Comm_free(&tpc);
    free(first);
    for (int v = 0; v < 3; v++)
        free(outs[v]);
    free(x);
    rlayer_free(&L);
    say("  TP %d x EP %d: both all-reduce algorithms give the same bits on every rank; reduce_scatter rows equal\n", tp,
        ep);
}

static void mode_tp(void)
{
    const double tol = 1e-5;
    pcfg c = {.ep = 1, .tp = N, .ddt = MOE_DTYPE_F32};
    all_fixtures(&c, tol, 1024);
    random_suite(&c, tol);
    tp_algorithms(N, 1);
    if (N == 4) {
        pcfg cc = {.ep = 2, .tp = 2, .ddt = MOE_DTYPE_F32};
        for (int fmt = 0; fmt < 2; fmt++) {
            cc.low_latency = fmt;
            cc.cap = fmt ? 4 : 0;
            all_fixtures(&cc, tol, 5);
        }
        random_suite(&cc, tol);
        tp_algorithms(2, 2);
    }
}

/* A plan on rank-dependent input that must fail on every rank; the message must hold `needle`. */
static void expect_plan_fail(moe_ctx *ctx, const moe_layer_desc *d, const moe_plan_config *cfg, moe_status want,
                             const char *needle, const char *what)
{
    moe_plan *p = NULL;
    moe_status st = moe_plan_create_ex(ctx, d, cfg, &p);
    CHECK(st == want && !p, "%s: got %s (%s), expected %s", what, moe_status_name(st), moe_ctx_last_error(ctx),
          moe_status_name(want));
    CHECK(strstr(moe_ctx_last_error(ctx), needle), "%s: message lacks '%s': %s", what, needle, moe_ctx_last_error(ctx));
    if (R == 0)
        printf("  %s refused on every rank: %s\n", what, moe_ctx_last_error(ctx));
}

static void mode_errors(void)
{
    rlayer L;
    rlayer_make(&L, 16, 8, 8, 2, 0, 0, 0, 0, MOE_DTYPE_F32, 51);
    moe_ctx *ctx = make_ctx(0, -1, NULL);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = R;
    cfg.parallel.timeout_s = 30;

    /* a description field differs on the last rank */
    moe_layer_desc d = L.d;
    if (R == N - 1)
        d.top_k = 3;
    expect_plan_fail(ctx, &d, &cfg, MOE_EINVAL, "'top_k'", "top_k mismatch");
    d = L.d;
    if (R == 0)
        d.renormalize = 0;
    expect_plan_fail(ctx, &d, &cfg, MOE_EINVAL, "'renormalize'", "renormalize mismatch");
    /* a knob differs */
    moe_ctx *other = R == N - 1 ? make_ctx(7, -1, NULL) : make_ctx(0, -1, NULL);
    expect_plan_fail(other, &L.d, &cfg, MOE_EINVAL, "'chunk_size'", "chunk_size knob mismatch");
    moe_ctx_free(other);
    /* the composition differs */
    moe_plan_config c2 = cfg;
    c2.parallel.low_latency = R == 0;
    expect_plan_fail(ctx, &L.d, &c2, MOE_EINVAL, "'prepare_finalize'", "format mismatch");
    /* duplicate coordinates */
    c2 = cfg;
    c2.parallel.ep_rank = 0;
    expect_plan_fail(ctx, &L.d, &c2, MOE_EINVAL, "both have", "duplicate coordinates");
    /* communicator size */
    c2 = cfg;
    c2.parallel.ep_size = 2 * N;
    c2.parallel.ep_rank = -1;
    expect_plan_fail(ctx, &L.d, &c2, MOE_EINVAL, "communicator holds", "wrong communicator size");

    /* execute: one rank's bad argument fails every rank, before any data moves */
    moe_plan *p = NULL;
    OKC(ctx, moe_plan_create_ex(ctx, &L.d, &cfg, &p));
    moe_weights *w = NULL;
    OKC(ctx, moe_weights_create(p, &L.src, &w));
    const int64_t T = 9, H = 16;
    float *x = xmalloc(sizeof(float) * (size_t)(T * H)), *out = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 3, -1, 1);
    size_t wsz = moe_plan_workspace_size(p, T);
    void *ws = xmalloc(wsz);
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = R == 0 ? MOE_DTYPE_I32 : MOE_DTYPE_F32, .n_tokens = T,
                       .output = out, .workspace = ws, .workspace_size = wsz};
    moe_status st = moe_plan_execute_ex(p, w, &a);
    CHECK(st == MOE_EDTYPE, "bad dtype on rank 0: got %s on rank %d", moe_status_name(st), R);
    CHECK(R == 0 ? strstr(moe_ctx_last_error(ctx), "dtype") != NULL : strstr(moe_ctx_last_error(ctx), "rank 0") != NULL,
          "message: %s", moe_ctx_last_error(ctx));
    say("  a bad argument on rank 0 fails every rank: %s\n", moe_ctx_last_error(ctx));
    a.hidden_dtype = MOE_DTYPE_F32;
    OKC(ctx, moe_plan_execute_ex(p, w, &a)); /* the plan stays usable */
    /* a short workspace: the last rank sized for 1 token while rank 0 brings T */
    a.n_tokens = R == N - 1 ? 1 : T;
    a.workspace_size = R == N - 1 ? moe_plan_workspace_size(p, 1) : wsz;
    st = moe_plan_execute_ex(p, w, &a);
    CHECK(st == MOE_EWORKSPACE, "short workspace: got %s", moe_status_name(st));
    char needle[32];
    snprintf(needle, sizeof needle, "rank %d's workspace", N - 1);
    CHECK(strstr(moe_ctx_last_error(ctx), needle), "message: %s", moe_ctx_last_error(ctx));
    say("  a short workspace fails every rank: %s\n", moe_ctx_last_error(ctx));
    a.workspace_size = wsz;
    OKC(ctx, moe_plan_execute_ex(p, w, &a));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);

    /* TP: the ranks of a TP group must pass the same token count */
    moe_plan_config ct;
    moe_plan_config_init(&ct);
    ct.parallel.tp_size = N;
    ct.parallel.tp_rank = -1;
    ct.parallel.timeout_s = 30;
    OKC(ctx, moe_plan_create_ex(ctx, &L.d, &ct, &p));
    OKC(ctx, moe_weights_create(p, &L.src, &w));
    wsz = moe_plan_workspace_size(p, T);
    ws = xmalloc(wsz);
    moe_exec_args b = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = R == 1 ? T - 1 : T,
                       .output = out, .workspace = ws, .workspace_size = wsz};
    st = moe_plan_execute_ex(p, w, &b);
    CHECK(st == MOE_EINVAL && strstr(moe_ctx_last_error(ctx), "TP group"), "TP token mismatch: %s: %s",
          moe_status_name(st), moe_ctx_last_error(ctx));
    say("  TP ranks with different token counts fail every rank: %s\n", moe_ctx_last_error(ctx));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);

    /* configuration errors every rank finds alone */
    moe_plan_config bad;
    moe_plan_config_init(&bad);
    bad.parallel.ep_size = 9;
    expect_plan_fail(ctx, &L.d, &bad, MOE_EINVAL, "ep_size", "ep_size > E");
    moe_plan_config_init(&bad);
    bad.parallel.dispatch_dtype = MOE_DTYPE_F8_E4M3;
    expect_plan_fail(ctx, &L.d, &bad, MOE_EINVAL, "dispatch_dtype", "fp8 dispatch without EP");
    moe_plan_config_init(&bad);
    bad.prepare_finalize = MOE_PF_EP_ALLTOALL;
    expect_plan_fail(ctx, &L.d, &bad, MOE_EINVAL, "ep_size > 1", "EP prepare/finalize in one process");
    free(x);
    free(out);
    moe_ctx_free(ctx);
    rlayer_free(&L);
}

static void mode_quant(void)
{
    /* realistic activations: H = 256, outputs compared with exact (F32) dispatch */
    rlayer L;
    rlayer_make(&L, 256, 64, 8, 2, 0, 0, 0, 0, MOE_DTYPE_F32, 61);
    const moe_dtype dts[2] = {MOE_DTYPE_F8_E4M3, MOE_DTYPE_I8};
    const double bound[2] = {5e-2, 1e-2};
    const int64_t T = 64, H = 256, K = 2;
    float *x = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 5, -1.0f, 1.0f);
    for (int fmt = 0; fmt < 2; fmt++) {
        pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .low_latency = fmt, .cap = fmt ? 16 : 0};
        moe_ctx *ctx = make_ctx(1024, -1, NULL);
        int64_t b, e, maxs;
        par_tokens(&c, T, &b, &e, &maxs);
        moe_plan *p0 = par_plan(ctx, &L.d, &c);
        moe_weights *w0 = NULL;
        OKC(ctx, moe_weights_create(p0, &L.src, &w0));
        result exact;
        OKC(ctx, exec_rows(p0, w0, x, MOE_DTYPE_F32, NULL, T, b, e, maxs, &exact));
        for (int i = 0; i < 2; i++) {
            c.ddt = dts[i];
            moe_plan *p = par_plan(ctx, &L.d, &c);
            moe_weights *w = NULL;
            OKC(ctx, moe_weights_create(p, &L.src, &w));
            result got;
            OKC(ctx, exec_rows(p, w, x, MOE_DTYPE_F32, NULL, T, b, e, maxs, &got));
            double diff = tu_max_abs_diff(got.out + b * H, exact.out + b * H, (size_t)((e - b) * H));
            double mx = tu_max_abs(exact.out + b * H, (size_t)((e - b) * H));
            double gd = 0, gm = 0;
            MPI_Allreduce(&diff, &gd, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(&mx, &gm, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            long long db = got.st.dispatch_bytes, db0 = exact.st.dispatch_bytes, sdb = 0, sdb0 = 0;
            MPI_Allreduce(&db, &sdb, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            MPI_Allreduce(&db0, &sdb0, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            say("  dispatch %s (%s): max |out - exact| = %.3g = %.3g of max |out|; dispatched bytes %lld vs %lld "
                "(F32)\n",
                moe_dtype_name(dts[i]), fmt ? "batched" : "standard", gd, gd / gm, sdb, sdb0);
            CHECK(gd <= bound[i] * gm, "%s dispatch error %g of max exceeds %g", moe_dtype_name(dts[i]), gd / gm,
                  bound[i]);
            CHECK(gd > 0, "%s dispatch changed nothing", moe_dtype_name(dts[i]));
            CHECK(sdb * 3 < sdb0, "%s dispatch did not cut the bytes (%lld vs %lld)", moe_dtype_name(dts[i]), sdb, sdb0);
            CHECK(memcmp(got.ids + b * K, exact.ids + b * K, sizeof(int32_t) * (size_t)((e - b) * K)) == 0,
                  "routing changed");
            result_free(&got);
            moe_weights_free(w);
            moe_plan_free(p);
        }
        result_free(&exact);
        moe_weights_free(w0);
        moe_plan_free(p0);
        moe_ctx_free(ctx);
    }
    free(x);
    rlayer_free(&L);
}

/* ---- quantized experts under EP and TP ----------------------------------------------------- */

/* A layer with quantized routed experts: per expert and matrix m (0 gate [I, H], 1 up [I, H],
 * 2 down [H, I]) the source codes, scales and zero points (moe_quant.h "Quantized experts") and
 * their dequantized f32 matrix (the oracle's weights). */
typedef struct qlayer {
    moe_layer_desc d;
    float *router;    /* [E, H] f32 */
    void **c[3];      /* [E] codes */
    void **s[3];      /* [E] scales */
    uint8_t **z[3];   /* [E] zero points or NULL */
    float **f[3];     /* [E] dequantized [N, K] f32 */
    float *in13, *in2; /* [E] static FP8 activations (act STATIC): the input scales, else NULL */
} qlayer;

/* The experts' activation of the qexperts layers (mode_qexperts' non-gated cases set
 * MOE_ACT_RELU2: qsrc_make then leaves the gate arrays NULL) */
static moe_activation g_qact = MOE_ACT_SWIGLU;

static void qlayer_make(qlayer *L, const char *scheme, int64_t bn, int64_t H, int64_t I, int64_t E, int64_t K,
                        uint64_t seed)
{
    memset(L, 0, sizeof *L);
    moe_layer_desc_init(&L->d);
    L->d.activation = g_qact;
    L->d.hidden_size = H;
    L->d.moe_intermediate_size = I;
    L->d.num_experts = E;
    L->d.top_k = K;
    L->d.renormalize = 1;
    L->d.weight_dtype = MOE_DTYPE_F32;
    CHECK(moe_quant_from_name(scheme, &L->d.quant) == MOE_OK, "scheme %s", scheme);
    if (bn) { /* a custom block shape [bn, bn] */
        L->d.quant.w13.block_n = L->d.quant.w13.block_k = bn;
        L->d.quant.w2.block_n = L->d.quant.w2.block_k = bn;
        if (L->d.quant.act == MOE_QACT_TOKEN_GROUP) /* fp8 w8a8: the activation groups follow block_k */
            L->d.quant.act_group_size = bn;
    }
    L->router = make_weights((size_t)(E * H), MOE_DTYPE_F32, seed, 1.0f);
    if (L->d.quant.act == MOE_QACT_STATIC) { /* per-expert input scales, some inputs clip */
        L->in13 = xmalloc(sizeof(float) * (size_t)E);
        L->in2 = xmalloc(sizeof(float) * (size_t)E);
        for (int64_t e = 0; e < E; e++) {
            L->in13[e] = (0.5f + 0.1f * (float)(e % 5)) / 448.0f;
            L->in2[e] = (0.3f + 0.2f * (float)(e % 4)) / 448.0f;
        }
    }
    for (int m = 0; m < 3; m++) {
        const moe_qweight *qw = m == 2 ? &L->d.quant.w2 : &L->d.quant.w13;
        const int64_t n = m == 2 ? H : I, k = m == 2 ? I : H;
        L->c[m] = calloc((size_t)E, sizeof(void *));
        L->s[m] = calloc((size_t)E, sizeof(void *));
        L->z[m] = calloc((size_t)E, sizeof(void *));
        L->f[m] = calloc((size_t)E, sizeof(void *));
        for (int64_t e = 0; e < E; e++) {
            float *w = make_weights((size_t)(n * k), MOE_DTYPE_F32, seed + 10 * (uint64_t)e + (uint64_t)m + 1, 0.3f);
            /* scales over a wide exponent range: a misaddressed scale shows (R12) */
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < k; j++)
                    w[r * k + j] = ldexpf(w[r * k + j], (int)((r / 4 + j / 8 + e) % 5) - 2);
            size_t cb, sb, zb;
            CHECK(moe_quantize_matrix_sizes(qw, n, k, &cb, &sb, &zb) == MOE_OK, "%s: moe_quantize_matrix_sizes", scheme);
            L->c[m][e] = xmalloc(cb);
            L->s[m][e] = xmalloc(sb);
            L->z[m][e] = zb ? xmalloc(zb) : NULL;
            CHECK(moe_quantize_matrix(qw, w, n, k, L->c[m][e], L->s[m][e], L->z[m][e]) == MOE_OK,
                  "%s: moe_quantize_matrix", scheme);
            L->f[m][e] = w;
            moe_quant_dequant_source(qw, L->c[m][e], L->s[m][e], L->z[m][e], n, k, w);
        }
    }
}

static void qlayer_free(qlayer *L)
{
    free(L->router);
    free(L->in13);
    free(L->in2);
    for (int m = 0; m < 3; m++) {
        for (int64_t e = 0; e < L->d.num_experts; e++) {
            free(L->c[m][e]);
            free(L->s[m][e]);
            free(L->z[m][e]);
            free(L->f[m][e]);
        }
        free(L->c[m]);
        free(L->s[m]);
        free(L->z[m]);
        free(L->f[m]);
    }
}

/* The quantized source; with `plan` the other EP ranks' experts are NULL pointers. */
typedef struct qsrc {
    moe_weight_source src;
    const void **p[9]; /* codes, scales (gate, up, down), then zero points */
} qsrc;

static void qsrc_make(qsrc *q, const qlayer *L, const moe_plan *plan)
{
    const int64_t E = L->d.num_experts;
    int32_t *map = xmalloc(sizeof(int32_t) * (size_t)E);
    if (plan)
        CHECK(moe_plan_expert_map(plan, map) == MOE_OK, "moe_plan_expert_map");
    memset(q, 0, sizeof *q);
    for (int i = 0; i < 9; i++)
        q->p[i] = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        if (plan && map[e] < 0)
            continue;
        for (int m = 0; m < 3; m++) {
            q->p[m][e] = L->c[m][e];
            q->p[3 + m][e] = L->s[m][e];
            q->p[6 + m][e] = L->z[m][e];
        }
    }
    q->src.router = L->router;
    q->src.router_dtype = MOE_DTYPE_F32;
    q->src.gate_proj = q->p[0];
    q->src.up_proj = q->p[1];
    q->src.down_proj = q->p[2];
    q->src.gate_scale = q->p[3];
    q->src.up_scale = q->p[4];
    q->src.down_scale = q->p[5];
    if (L->d.quant.w13.has_zero_point) {
        q->src.gate_zero = (const uint8_t *const *)q->p[6];
        q->src.up_zero = (const uint8_t *const *)q->p[7];
    }
    if (L->d.quant.w2.has_zero_point)
        q->src.down_zero = (const uint8_t *const *)q->p[8];
    if (!moe_activation_gated(L->d.activation)) /* non-gated: W1 is up_proj, no gate array read */
        q->src.gate_proj = NULL, q->src.gate_scale = NULL, q->src.gate_zero = NULL;
    q->src.w13_input_scale = L->in13; /* static FP8: [E], every rank reads its experts' */
    q->src.w2_input_scale = L->in2;
    free(map);
}

static void qsrc_free(qsrc *q)
{
    for (int i = 0; i < 9; i++)
        free(q->p[i]);
}

/* The oracle of a TP layer over tp shards, independent of the library's slicing: for each
 * shard t (I columns [i0, i0 + It)), a one-process plan of intermediate size It whose experts
 * are the shard cut by hand
 *   - weight-only schemes: from the dequantized f32 matrices (the quantized kernels give the
 *     f32 path's result up to the reassociation of scaling after each group, TU_REASSOC_REL);
 *   - int8 w8a8 (act TOKEN): from the int8 codes with their per-channel scales (the down
 *     projection's activation scale is then max |h| over the shard's It columns, as under TP);
 *   - fp8 w8a8 (act TOKEN_GROUP): from the e4m3 codes with their block scales, rows
 *     [i0 / bn, ..) of the w13 scale grid and columns [i0 / bk, ..) of the w2 grid; only for
 *     shards that start on a block of both (the library refuses the others), so each shard's
 *     activation groups of h are exactly one-process groups;
 *   - static fp8 (act STATIC, TENSOR or CHANNEL scales): from the e4m3 codes, the gate / up
 *     channel scales [i0, i0 + It) (a tensor scale as it is), the down scales as they are, and
 *     each expert's two input scales unchanged (they are per expert);
 * the partial outputs summed in tp_rank order, ((p_0 + p_1) + p_2) + ..., as the TP reduction
 * does. out [T, H]. */
static void tp_oracle(const qlayer *L, int tp, const float *x, int64_t T, float *out)
{
    const int64_t H = L->d.hidden_size, I = L->d.moe_intermediate_size, E = L->d.num_experts;
    const int w8a8 = L->d.quant.act == MOE_QACT_TOKEN, f8a8 = L->d.quant.act == MOE_QACT_TOKEN_GROUP;
    const int f8s = L->d.quant.act == MOE_QACT_STATIC;
    const int tensor = L->d.quant.w13.scale == MOE_QSCALE_TENSOR;
    const int codes = w8a8 || f8a8 || f8s; /* the shard plans run on the codes (1 byte each) */
    const int64_t bn13 = L->d.quant.w13.block_n, bk13 = L->d.quant.w13.block_k; /* fp8 w8a8 blocks */
    const int64_t bn2 = L->d.quant.w2.block_n, bk2 = L->d.quant.w2.block_k;
    const int64_t gH13 = f8a8 ? (H + bk13 - 1) / bk13 : 0;                        /* w13 scale grid columns */
    const int64_t gI2 = f8a8 ? (I + bk2 - 1) / bk2 : 0, gH2 = f8a8 ? (H + bn2 - 1) / bn2 : 0; /* w2 grid [gH2, gI2] */
    moe_ctx *ctx = make_ctx(1024, -1, NULL);
    for (int t = 0; t < tp; t++) {
        const int64_t i0 = t * (I / tp) + (t < I % tp ? t : I % tp), It = I / tp + (t < I % tp ? 1 : 0);
        if (f8a8)
            CHECK(i0 % bn13 == 0 && i0 % bk2 == 0, "tp_oracle: fp8 w8a8 shard %d starts at %lld, inside a block", t,
                  (long long)i0);
        const int64_t gIt2 = f8a8 ? (It + bk2 - 1) / bk2 : 0; /* the shard's w2 scale grid [gH2, gIt2] */
        moe_layer_desc d = L->d;
        d.moe_intermediate_size = It;
        if (!codes)
            memset(&d.quant, 0, sizeof d.quant); /* f32 experts */
        const void **gp = calloc((size_t)E, sizeof(void *)), **up = calloc((size_t)E, sizeof(void *));
        const void **dp = calloc((size_t)E, sizeof(void *)), **gs = calloc((size_t)E, sizeof(void *));
        const void **us = calloc((size_t)E, sizeof(void *)), **ds = calloc((size_t)E, sizeof(void *));
        void **down = calloc((size_t)E, sizeof(void *));   /* [E][H, It] the down columns */
        float **dsc = calloc((size_t)E, sizeof(float *)); /* [E][gH2, gIt2] fp8 w8a8: the down scale columns */
        for (int64_t e = 0; e < E; e++) {
            const size_t es = codes ? 1 : 4;
            const unsigned char *dsrc = codes ? L->c[2][e] : (const void *)L->f[2][e]; /* [H, I] */
            down[e] = xmalloc((size_t)(H * It) * es);
            for (int64_t r = 0; r < H; r++)
                memcpy((unsigned char *)down[e] + (size_t)(r * It) * es, dsrc + (size_t)(r * I + i0) * es,
                       (size_t)It * es);
            gp[e] = codes ? (const void *)((const uint8_t *)L->c[0][e] + i0 * H) : L->f[0][e] + i0 * H;
            up[e] = codes ? (const void *)((const uint8_t *)L->c[1][e] + i0 * H) : L->f[1][e] + i0 * H;
            dp[e] = down[e];
            if (f8a8) { /* BLOCK scales: w13 [ceil(I / bn13), gH13], w2 [gH2, gI2] */
                gs[e] = (const float *)L->s[0][e] + (i0 / bn13) * gH13;
                us[e] = (const float *)L->s[1][e] + (i0 / bn13) * gH13;
                dsc[e] = xmalloc(sizeof(float) * (size_t)(gH2 * gIt2));
                for (int64_t r = 0; r < gH2; r++)
                    memcpy(dsc[e] + r * gIt2, (const float *)L->s[2][e] + r * gI2 + i0 / bk2,
                           sizeof(float) * (size_t)gIt2);
                ds[e] = dsc[e];
            } else { /* int8 w8a8, static fp8: CHANNEL scales [I] and [H] (or one TENSOR scale) */
                gs[e] = (const float *)L->s[0][e] + (tensor ? 0 : i0);
                us[e] = (const float *)L->s[1][e] + (tensor ? 0 : i0);
                ds[e] = L->s[2][e];
            }
        }
        moe_weight_source src;
        memset(&src, 0, sizeof src);
        src.router = L->router;
        src.router_dtype = MOE_DTYPE_F32;
        src.gate_proj = gp;
        src.up_proj = up;
        src.down_proj = dp;
        if (codes) {
            src.gate_scale = gs;
            src.up_scale = us;
            src.down_scale = ds;
        }
        if (f8s) { /* per expert: the same scales on every shard */
            src.w13_input_scale = L->in13;
            src.w2_input_scale = L->in2;
        }
        moe_plan *p = NULL;
        moe_weights *w = NULL;
        OKC(ctx, moe_plan_create(ctx, &d, &p));
        OKC(ctx, moe_weights_create(p, &src, &w));
        result r;
        OKC(ctx, exec_rows(p, w, x, MOE_DTYPE_F32, NULL, T, 0, T, T, &r));
        for (int64_t i = 0; i < T * H; i++)
            out[i] = t == 0 ? r.out[i] : out[i] + r.out[i];
        result_free(&r);
        moe_weights_free(w);
        moe_plan_free(p);
        for (int64_t e = 0; e < E; e++) {
            free(down[e]);
            free(dsc[e]);
        }
        free(down);
        free(dsc);
        free(gp);
        free(up);
        free(dp);
        free(gs);
        free(us);
        free(ds);
    }
    moe_ctx_free(ctx);
}

/* One scheme: EP bit-identical to the one-process quantized plan (both formats); TP (and TP x
 * EP with 4 ranks) equal to the shard oracle (w8a8: bit-identical; weight-only: within
 * TU_REASSOC_REL) and bit-identical run to run, and within 1e-5 of the
 * one-process plan except int8 w8a8 (its down projection's per-token activation scale is per
 * shard; the difference is printed). fp8 w8a8 (act TOKEN_GROUP): a TP size whose shards start
 * inside a down-projection k-block is refused on every rank (MOE_EUNSUPPORTED, message
 * checked); with top_k 1 (router weight exactly 1) and one k-block per shard, TP is also
 * bit-identical to one process (see docs/numerics.md section 6). */
static void qexperts_case(const char *scheme, int64_t bn, int64_t H, int64_t I, int64_t E, int64_t K)
{
    qlayer L;
    qlayer_make(&L, scheme, bn, H, I, E, K, 500 + (uint64_t)I);
    const int64_t T = 37;
    const int w8a8 = L.d.quant.act == MOE_QACT_TOKEN, f8a8 = L.d.quant.act == MOE_QACT_TOKEN_GROUP;
    const int f8s = L.d.quant.act == MOE_QACT_STATIC; /* static fp8: the shard oracle on the codes too */
    char name[96];
    snprintf(name, sizeof name, "%s%s%s (H %lld, I %lld, top_k %lld)", scheme,
             bn ? (bn == 16 ? " 16x16" : " custom") : "", moe_activation_gated(L.d.activation) ? "" : " non-gated relu2",
             (long long)H, (long long)I, (long long)K);
    float *x = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 91, -1.0f, 1.0f);
    moe_ctx *ctx = make_ctx(16, -1, NULL);
    /* the one-process quantized plan */
    qsrc all;
    qsrc_make(&all, &L, NULL);
    moe_plan *p1 = NULL;
    moe_weights *w1 = NULL;
    OKC(ctx, moe_plan_create(ctx, &L.d, &p1));
    OKC(ctx, moe_weights_create(p1, &all.src, &w1));
    result ref;
    OKC(ctx, exec_rows(p1, w1, x, MOE_DTYPE_F32, NULL, T, 0, T, T, &ref));
    const size_t one_bytes = moe_weights_expert_bytes(w1);

    pcfg cfgs[6];
    int nc = 0;
    cfgs[nc++] = (pcfg){.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32};
    cfgs[nc++] = (pcfg){.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .low_latency = 1, .cap = 8};
    cfgs[nc++] = (pcfg){.ep = 1, .tp = N, .ddt = MOE_DTYPE_F32};
    if (N == 4) {
        cfgs[nc++] = (pcfg){.ep = 2, .tp = 2, .ddt = MOE_DTYPE_F32};
        cfgs[nc++] = (pcfg){.ep = 2, .tp = 2, .ddt = MOE_DTYPE_F32, .low_latency = 1, .cap = 8};
    }
    float *oracle = xmalloc(sizeof(float) * (size_t)(T * H));
    int oracle_tp = 0;
    size_t ep_bytes = 0, tp_bytes = 0;
    char tp_notes[512] = "";
    for (int ci = 0; ci < nc; ci++) {
        const pcfg *c = &cfgs[ci];
        char what[256];
        snprintf(what, sizeof what, "%s: ep %d tp %d %s", name, c->ep, c->tp, c->low_latency ? "batched" : "standard");
        /* fp8 w8a8: does a shard of this TP size start inside a down-projection k-block? */
        int cut = 0, one_block = f8a8 && c->tp > 1;
        for (int t = 0; f8a8 && t < c->tp; t++) {
            const int64_t i0 = t * (I / c->tp) + (t < I % c->tp ? t : I % c->tp);
            const int64_t It = I / c->tp + (t < I % c->tp ? 1 : 0);
            cut |= i0 % L.d.quant.w2.block_k != 0;
            one_block &= It == L.d.quant.w2.block_k;
        }
        if (cut) { /* refused by moe_plan_create on every rank, before any collective that could hang */
            moe_plan *pp = NULL;
            moe_status st = par_plan_create(ctx, &L.d, c, &pp);
            CHECK(st == MOE_EUNSUPPORTED && !pp, "%s: a shard cutting a k-block: got %s (%s), expected MOE_EUNSUPPORTED",
                  what, moe_status_name(st), moe_ctx_last_error(ctx));
            CHECK(strstr(moe_ctx_last_error(ctx), "inside a down-projection k-block") &&
                      strstr(moe_ctx_last_error(ctx), "block_k"),
                  "%s: message: %s", what, moe_ctx_last_error(ctx));
            MPI_Barrier(MPI_COMM_WORLD); /* every rank got here: none hangs in the refused plan */
            say("  %s: refused on every rank: %s\n", what, moe_ctx_last_error(ctx));
            continue;
        }
        moe_plan *pp = par_plan(ctx, &L.d, c);
        qsrc ls;
        qsrc_make(&ls, &L, pp);
        moe_weights *wp = NULL;
        OKC(ctx, moe_weights_create(pp, &ls.src, &wp));
        int64_t b, e, maxs;
        par_tokens(c, T, &b, &e, &maxs);
        result got, again;
        OKC(ctx, exec_rows(pp, wp, x, MOE_DTYPE_F32, NULL, T, b, e, maxs, &got));
        if (c->tp == 1) {
            compare(what, &got, &ref, H, K, T, -1, b, e);
            ep_bytes = moe_weights_expert_bytes(wp);
        } else {
            if (oracle_tp != c->tp) {
                tp_oracle(&L, c->tp, x, T, oracle);
                oracle_tp = c->tp;
            }
            result orc = ref; /* the oracle's routing is the one-process plan's */
            orc.out = oracle;
            char w2[300];
            snprintf(w2, sizeof w2, "%s vs the shard oracle", what);
            /* weight-only: the oracle runs f32 on the dequantized shards, the kernels scale after
             * each group (cell) of the shard: an f32 reassociation (testutil.h TU_REASSOC_REL) */
            compare(w2, &got, &orc, H, K, T, w8a8 || f8a8 || f8s ? -1 : TU_REASSOC_REL, b, e);
            /* against one process: within the TP bound, except int8 w8a8 (per-shard scales) */
            double diff = w8a8 ? tu_max_abs_diff(got.out + b * H, ref.out + b * H, (size_t)((e - b) * H))
                               : compare(what, &got, &ref, H, K, T, 1e-5, b, e);
            double gdiff = 0;
            MPI_Allreduce(&diff, &gdiff, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            const double rel = gdiff / tu_max_abs(ref.out, (size_t)(T * H));
            /* fp8 w8a8, top_k 1, one k-block per shard: the shards' activation groups are the
             * one-process groups and nothing is reassociated, so the bits are one process's */
            const int exact = one_block && K == 1 && L.d.renormalize;
            if (exact)
                compare(what, &got, &ref, H, K, T, -1, b, e);
            if (w8a8) /* per-shard scales of h: more than the TP bound (what moe.h states) */
                CHECK(rel > 1e-5, "%s: int8 w8a8 TP within %g of one process: per-shard scales not exercised", what,
                      rel);
            size_t nl = strlen(tp_notes);
            snprintf(tp_notes + nl, sizeof tp_notes - nl, "; ep %d tp %d %s: max |tp - one| = %.3g of max |one|%s",
                     c->ep, c->tp, c->low_latency ? "batched" : "standard", rel, exact ? " (bit-identical)" : "");
            /* run to run: the same bits */
            OKC(ctx, exec_rows(pp, wp, x, MOE_DTYPE_F32, NULL, T, b, e, maxs, &again));
            CHECK(memcmp(got.out + b * H, again.out + b * H, sizeof(float) * (size_t)((e - b) * H)) == 0,
                  "%s: two runs differ", what);
            result_free(&again);
            if (c->ep == 1 || !tp_bytes)
                tp_bytes = moe_weights_expert_bytes(wp);
        }
        result_free(&got);
        moe_weights_free(wp);
        qsrc_free(&ls);
        moe_plan_free(pp);
    }
    /* resident bytes: EP holds its experts' share; TP (when not refused) about 1/N of the codes */
    CHECK(ep_bytes < one_bytes && tp_bytes < one_bytes, "%s: resident bytes ep %zu tp %zu of one process %zu", name,
          ep_bytes, tp_bytes, one_bytes);
    if (tp_notes[0])
        say("  %s: EP %d bit-identical to one process (both formats); TP %s the shard oracle, bit-identical run to "
            "run%s; bytes per rank ep %zu tp %zu (one process %zu)\n",
            name, N, w8a8 || f8a8 || f8s ? "bit-identical to" : "within TU_REASSOC_REL of", tp_notes, ep_bytes, tp_bytes,
            one_bytes);
    else
        say("  %s: EP %d bit-identical to one process (both formats); every TP configuration refused; bytes per rank "
            "ep %zu (one process %zu)\n", name, N, ep_bytes, one_bytes);
    free(oracle);
    result_free(&ref);
    moe_weights_free(w1);
    moe_plan_free(p1);
    qsrc_free(&all);
    moe_ctx_free(ctx);
    free(x);
    qlayer_free(&L);
}

static void mode_qexperts(void)
{
    /* R11: 128x128 blocks; I = 384 splits into 192 (TP 2) or 96 (TP 4): shards start inside a block */
    qexperts_case("fp8-block", 0, 64, 384, 4, 2);
    /* [16, 16] blocks with I = 24: 12 per shard at TP 2, 6 at TP 4 */
    qexperts_case("fp8-block", 16, 40, 24, 6, 2);
    qexperts_case("int8-channel", 0, 48, 40, 5, 2);
    qexperts_case("int8-w8a8", 0, 48, 40, 5, 2);
    /* fp8 w8a8 (per-token-group activations): [16, 16] blocks, I = 192: 96 per shard at TP 2,
     * 48 at TP 4, every shard on a k-block; H = 40 ends in a partial group */
    qexperts_case("fp8-block-w8a8", 16, 40, 192, 6, 2);
    /* one k-block of 16 per shard at TP N, top_k 1: TP bit-identical to one process */
    qexperts_case("fp8-block-w8a8", 16, 40, 16 * (int64_t)N, 4, 1);
    /* 128x128, I = 256: TP 2 (and TP 2 x EP 2) runs; TP 4's shards of 64 cut a block: refused */
    qexperts_case("fp8-block-w8a8", 0, 192, 256, 4, 2);
    /* R11: I = 384 cuts a 128 block at TP 2 (192) and TP 4 (96): refused, EP runs */
    qexperts_case("fp8-block-w8a8", 0, 64, 384, 4, 2);
    /* static fp8 activations, per-expert input scales: EP reads each rank's experts' scales, TP
     * keeps them on every shard (within 1e-5 of one process; bit-identical to the shard oracle) */
    qexperts_case("fp8-channel-static", 0, 48, 40, 5, 2);
    qexperts_case("fp8-tensor-static", 0, 40, 24, 6, 1);
    /* int4 / mxfp4 groups of 32 along I = 96: shards of 48 (TP 2) or 24 (TP 4) cut the groups */
    qexperts_case("int4-g32", 0, 64, 96, 4, 2);
    qexperts_case("int4-g32-zp", 0, 64, 96, 4, 2);
    qexperts_case("mxfp4", 0, 64, 96, 4, 2);
    /* non-gated experts (relu2; no gate arrays given): weight-only, w8a8 and static schemes
     * under EP and TP, shards cutting the groups */
    g_qact = MOE_ACT_RELU2;
    qexperts_case("int8-channel", 0, 48, 40, 5, 2);
    qexperts_case("int4-g32", 0, 64, 96, 4, 2);
    qexperts_case("fp8-block-w8a8", 16, 40, 192, 6, 2);
    qexperts_case("fp8-channel-static", 0, 48, 40, 5, 2);
    g_qact = MOE_ACT_SWIGLU;
    /* a 4-bit down projection whose shard is odd cannot be expressed: refused on those ranks */
    {
        qlayer L;
        const int64_t I = 98; /* TP 2: 49, 49; TP 4: 25, 25, 24, 24 */
        qlayer_make(&L, "int4-g32", 0, 64, I, 2, 1, 7);
        moe_ctx *ctx = make_ctx(16, -1, NULL);
        pcfg c = {.ep = 1, .tp = N, .ddt = MOE_DTYPE_F32};
        moe_plan *pp = par_plan(ctx, &L.d, &c);
        qsrc ls;
        qsrc_make(&ls, &L, pp);
        moe_weights *wp = NULL;
        const int64_t It = I / N + (R < I % N ? 1 : 0);
        moe_status st = moe_weights_create(pp, &ls.src, &wp);
        if (It % 2) {
            CHECK(st == MOE_ESHAPE && !wp && strstr(moe_ctx_last_error(ctx), "even"),
                  "odd int4 shard: got %s (%s), expected MOE_ESHAPE", moe_status_name(st), moe_ctx_last_error(ctx));
        } else {
            CHECK(st == MOE_OK, "even int4 shard refused: %s", moe_ctx_last_error(ctx));
        }
        moe_weights_free(wp);
        qsrc_free(&ls);
        moe_plan_free(pp);
        moe_ctx_free(ctx);
        qlayer_free(&L);
        say("  int4 with odd TP shards of I = %lld: refused (MOE_ESHAPE) on the odd ranks\n", (long long)I);
    }
}

static void mode_placement(void)
{
    /* R15: 128 experts on 6 ranks = 22,22,21,21,21,21 */
    rlayer L;
    rlayer_make(&L, 16, 8, 128, 4, 8, 1, 0, 0, MOE_DTYPE_F32, 71);
    moe_ctx *ctx = make_ctx(1024, -1, NULL);
    pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32};
    moe_plan *p = par_plan(ctx, &L.d, &c);
    int32_t map[128];
    OKC(ctx, moe_plan_expert_map(p, map));
    int64_t count = 0, first = -1;
    for (int e = 0; e < 128; e++)
        if (map[e] >= 0) {
            if (first < 0)
                first = e;
            CHECK(map[e] == e - first, "expert map not contiguous at %d", e);
            count++;
        }
    int64_t want = 128 / N + (R < 128 % N ? 1 : 0), want_first = R * (128 / N) + (R < 128 % N ? R : 128 % N);
    CHECK(count == want && first == want_first, "rank %d holds %lld experts from %lld, expected %lld from %lld", R,
          (long long)count, (long long)first, (long long)want, (long long)want_first);
    long long counts[64] = {0}, mine = count;
    MPI_Gather(&mine, 1, MPI_LONG_LONG, counts, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    if (R == 0) {
        printf("  128 experts on %d ranks:", N);
        for (int i = 0; i < N; i++)
            printf(" %lld", counts[i]);
        printf("\n");
    }
    /* the plan's placement is that contiguous split, as data (moe_plan_placement) */
    const moe_placement *pl = moe_plan_placement(p);
    CHECK(pl && pl->ep_size == N && pl->num_logical_experts == 128 && pl->num_physical_experts == 128,
          "moe_plan_placement: not the contiguous placement of 128 experts on %d ranks", N);
    for (int r = 0; r < N; r++)
        CHECK(pl->rank_num_physical[r] == 128 / N + (r < 128 % N ? 1 : 0), "placement: rank %d holds %d", r,
              (int)pl->rank_num_physical[r]);
    for (int q = 0; q < 128; q++)
        CHECK(pl->physical_to_logical[q] == q, "placement: physical expert %d holds %d", q,
              (int)pl->physical_to_logical[q]);
    /* the same placement given explicitly: the same plan (text and hash); the plan keeps a copy */
    int32_t p2l[128], rcounts[64]; /* [P] physical_to_logical, [ep_size] rank_num_physical */
    memcpy(p2l, pl->physical_to_logical, sizeof(int32_t) * 128);
    memcpy(rcounts, pl->rank_num_physical, sizeof(int32_t) * (size_t)N);
    moe_placement given = {.ep_size = N, .num_logical_experts = 128, .num_physical_experts = 128,
                           .physical_to_logical = p2l, .rank_num_physical = rcounts};
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = R;
    cfg.parallel.timeout_s = 30;
    cfg.parallel.placement = &given;
    moe_plan *p2 = NULL;
    OKC(ctx, moe_plan_create_ex(ctx, &L.d, &cfg, &p2));
    CHECK(moe_plan_hash(p2) == moe_plan_hash(p) && !strcmp(moe_plan_text(p2), moe_plan_text(p)),
          "the contiguous placement given explicitly changed the plan text");
    CHECK(moe_plan_placement(p2)->physical_to_logical != p2l, "the plan borrowed the caller's placement");
    /* rebalance of a parallel plan to the placement it has: every expert kept, nothing read
     * (the source holds no expert) or packed, the state unchanged (mode rebal moves experts) */
    local_src ls;
    local_src_make(&ls, &L, p2);
    moe_weights *w = NULL;
    OKC(ctx, moe_weights_create(p2, &ls.src, &w));
    const size_t bytes = moe_weights_expert_bytes(w);
    moe_weight_source none = ls.src;
    const void *nulls[128] = {0};
    none.gate_proj = none.up_proj = none.down_proj = nulls;
    moe_rebalance_report rep;
    OKC(ctx, moe_plan_rebalance(p2, w, &given, &none, &rep));
    CHECK(rep.experts_kept == rcounts[R] && rep.experts_packed == 0 && rep.experts_freed == 0 &&
              rep.bytes_packed == 0 && rep.bytes_resident == bytes,
          "rebalance to the same placement: kept %lld packed %lld freed %lld, bytes %zu / %zu",
          (long long)rep.experts_kept, (long long)rep.experts_packed, (long long)rep.experts_freed, rep.bytes_packed,
          rep.bytes_resident);
    CHECK(moe_weights_expert_bytes(w) == bytes && moe_plan_hash(p2) == moe_plan_hash(p), "rebalance changed state");
    moe_weights_free(w);
    local_src_free(&ls);
    moe_plan_free(p2);
    /* an invalid placement fails on every rank, naming the entry, before any collective */
    p2l[127] = 128;
    expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, "physical expert 127 holds logical expert 128",
                     "placement with a logical id out of range");
    p2l[127] = 0; /* expert 0 on ranks 0 and 5: a replica, and 127 nowhere */
    expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, "logical expert 127 is held by no physical expert",
                     "placement missing an expert");
    p2l[127] = 127;
    rcounts[N - 1]--;
    expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, "rank_num_physical sums to 127", "placement with a wrong rank count");
    rcounts[N - 1]++;
    /* a round-robin placement runs; its plan text carries placement=<hash> */
    for (int r = 0, q = 0; r < N; r++)
        for (int e = r; e < 128; e += N)
            p2l[q++] = e;
    for (int r = 0; r < N; r++)
        rcounts[r] = (int32_t)((128 - r + N - 1) / N);
    OKC(ctx, moe_plan_create_ex(ctx, &L.d, &cfg, &p2));
    CHECK(strstr(moe_plan_text(p2), "placement=") && moe_plan_hash(p2) != moe_plan_hash(p),
          "round robin: the plan text lacks placement=");
    moe_plan_free(p2);
    moe_plan_free(p);
    moe_ctx_free(ctx);
    /* and bit-identical with uneven placement, both formats; and with round robin */
    for (int fmt = 0; fmt < 2; fmt++) {
        c.low_latency = fmt;
        c.cap = fmt ? 8 : 0;
        c.pl = NULL;
        random_case("128 experts", &L, NULL, 50, &c, -1, 16);
        c.pl = &given;
        random_case("128 experts round robin", &L, NULL, 50, &c, -1, 16);
    }
    say("  128 experts on %d ranks: bit-identical to one process, both formats, contiguous and round robin\n", N);
    rlayer_free(&L);
}

/* ---- placements (EP load balance, moe_parallel.h "Expert placement") -------------------------- */

/* Logits [T, E] sending about `share` of the T*K rows to the experts hot[0 .. n_hot): token t
 * puts its first min(K, n_hot) slots on hot experts when t % 4 < 4 * share (rotating which),
 * the others on the cold ones; deterministic noise below. */
static float *hot_logits(int64_t T, int64_t E, int64_t K, const int *hot, int n_hot, double share, uint64_t seed)
{
    float *lg = xmalloc(sizeof(float) * (size_t)(T * E));
    tu_fill_uniform(lg, (size_t)(T * E), seed, -1.0f, 0.0f);
    for (int64_t t = 0; t < T; t++) {
        const int use_hot = (double)(t % 8) < 8.0 * share;
        for (int64_t k = 0; k < K; k++) {
            int64_t e;
            if (use_hot && k < n_hot)
                e = hot[(t + k) % n_hot];
            else {
                e = (t * 7 + k * 5 + 3) % E;
                for (int tries = 0; tries < E; tries++) { /* a cold expert not picked yet */
                    int clash = lg[t * E + e] > 2.0f;
                    for (int h = 0; h < n_hot; h++)
                        clash |= hot[h] == e;
                    if (!clash)
                        break;
                    e = (e + 1) % E;
                }
            }
            lg[t * E + e] = 8.0f - 0.5f * (float)k;
        }
    }
    return lg;
}

/* The expert load of routing `lg` [T, E] under d (the one-process plan's topk_ids). */
static void load_of(moe_ctx *ctx, rlayer *L, const float *lg, int64_t T, int64_t *load)
{
    moe_plan *p1 = NULL;
    moe_weights *w1 = NULL;
    OKC(ctx, moe_plan_create(ctx, &L->d, &p1));
    OKC(ctx, moe_weights_create(p1, &L->src, &w1));
    float *x = xmalloc(sizeof(float) * (size_t)(T * L->d.hidden_size));
    tu_fill_uniform(x, (size_t)(T * L->d.hidden_size), 5, -1.0f, 1.0f);
    result r;
    OKC(ctx, exec_rows(p1, w1, x, MOE_DTYPE_F32, lg, T, 0, T, T, &r));
    for (int64_t e = 0; e < L->d.num_experts; e++)
        load[e] = 0;
    for (int64_t i = 0; i < T * L->d.top_k; i++)
        load[r.ids[i]]++;
    result_free(&r);
    free(x);
    moe_weights_free(w1);
    moe_plan_free(p1);
}

/* mode capacity: expert_capacity (Switch's top-1 capacity, per sequence) under EP. Each rank has
 * its own tokens and sequences (one empty); the EP plan (contiguous and round-robin placements,
 * both formats, chunks of 5 tokens and the batched format's 4-token chunks, so the count
 * crosses chunk boundaries) gives this rank's outputs, ids (-1 for the drops) and weights bit
 * for bit as a one-process plan on the same tokens and sequences; tokens are dropped on every
 * rank. */
static void mode_capacity(void)
{
    const int64_t H = 40, E = 8, C = 2;
    rlayer L;
    rlayer_make(&L, H, 24, E, 1, 0, 0, 0, 0, MOE_DTYPE_F32, 131);
    L.d.renormalize = 0; /* Switch: the top-1 probability as it is */
    L.d.activation = MOE_ACT_RELU;
    L.src.gate_proj = NULL;
    L.d.expert_capacity = C;
    for (int64_t k = 0; k < H; k++) /* expert 2 favoured (x has mean 0.2), so it overflows */
        L.router[2 * H + k] += 0.3f;
    const int64_t T = 20 + 3 * R;
    const int64_t lens[3] = {7, 0, T - 7};
    float *x = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 200 + (uint64_t)R, -0.6f, 1.0f);
    moe_ctx *ctx = make_ctx(5, -1, NULL);

    /* one process, this rank's tokens */
    float *want = xmalloc(sizeof(float) * (size_t)(T * H)), *got = xmalloc(sizeof(float) * (size_t)(T * H));
    int32_t *wid = xmalloc(sizeof(int32_t) * (size_t)T), *gid = xmalloc(sizeof(int32_t) * (size_t)T);
    float *ww = xmalloc(sizeof(float) * (size_t)T), *gw = xmalloc(sizeof(float) * (size_t)T);
    {
        moe_plan *p = NULL;
        moe_weights *w = NULL;
        OKC(ctx, moe_plan_create(ctx, &L.d, &p));
        OKC(ctx, moe_weights_create(p, &L.src, &w));
        size_t wsz = moe_plan_workspace_size(p, T);
        void *ws = xmalloc(wsz);
        moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = want,
                           .topk_ids = wid, .topk_weights = ww, .workspace = ws, .workspace_size = wsz,
                           .sequence_lengths = lens, .n_sequences = 3};
        OKC(ctx, moe_plan_execute_ex(p, w, &a));
        free(ws);
        moe_weights_free(w);
        moe_plan_free(p);
    }
    int dropped = 0;
    for (int64_t t = 0; t < T; t++)
        dropped += wid[t] == -1;
    CHECK(dropped > 0, "no token dropped on rank %d: the test would not test the capacity", R);

    int32_t p2l[16], rn[8];
    moe_placement rr;
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, E, N, 0, NULL, p2l, rn, &rr));
    for (int v = 0; v < 4; v++) {
        /* v 0, 1: contiguous, standard / batched format; v 2, 3: round robin */
        pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .low_latency = v % 2, .cap = v % 2 ? 4 : 0,
                  .pl = v >= 2 ? &rr : NULL};
        moe_plan *p = par_plan(ctx, &L.d, &c);
        moe_weights *w = NULL;
        OKC(ctx, moe_weights_create(p, &L.src, &w));
        int64_t maxT = T;
        MPI_Allreduce(MPI_IN_PLACE, &maxT, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        size_t wsz = moe_plan_workspace_size(p, maxT);
        void *ws = xmalloc(wsz);
        moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = got,
                           .topk_ids = gid, .topk_weights = gw, .workspace = ws, .workspace_size = wsz,
                           .sequence_lengths = lens, .n_sequences = 3};
        OKC(ctx, moe_plan_execute_ex(p, w, &a));
        CHECK(memcmp(gid, wid, sizeof(int32_t) * (size_t)T) == 0, "EP variant %d: topk_ids differ", v);
        CHECK(memcmp(gw, ww, sizeof(float) * (size_t)T) == 0, "EP variant %d: topk_weights differ", v);
        CHECK(memcmp(got, want, sizeof(float) * (size_t)(T * H)) == 0, "EP variant %d: output differs from one process",
              v);
        free(ws);
        moe_weights_free(w);
        moe_plan_free(p);
    }
    say("  expert_capacity %lld under EP %d (contiguous, round robin; standard, batched): bit-identical to one process, "
        "%d of %lld tokens dropped on rank %d\n",
        (long long)C, N, dropped, (long long)T, R);
    free(x);
    free(want);
    free(got);
    free(wid);
    free(gid);
    free(ww);
    free(gw);
    rlayer_free(&L);
    moe_ctx_free(ctx);
}

/* Bit-identity of EP with every placement (contiguous, round_robin, balanced with replicas, a
 * hand-made one with an empty rank when N > 2), both formats, uniform and skewed routing,
 * several chunks (the replica rule counts tokens over the execute); the validation errors; and
 * ranks given different placements failing together within the timeout. */
static void mode_eplb(void)
{
    const int64_t E = 16, K = 4, T = 67;
    rlayer L;
    rlayer_make(&L, 48, 24, E, K, 16, 1, 0, 0, MOE_DTYPE_F32, 91);
    if (g_nongated)
        rlayer_nongated(&L);
    say("  experts: %s\n", g_nongated ? "non-gated relu2, no gate arrays given" : "gated SwiGLU");
    moe_ctx *ctx = make_ctx(1024, -1, NULL);
    const int hot[4] = {0, 1, 2, 5}; /* on ranks 0 (and 1 at 4 ranks) under contiguous */
    float *skew = hot_logits(T, E, K, hot, 4, 0.75, 17);
    int64_t load[16];
    load_of(ctx, &L, skew, T, load);
    /* placements: [0] contiguous (built), [1] round robin, [2] balanced with R redundant, [3]
     * hand-made (N > 2: rank 1 holds nothing, expert 0 on every other rank) */
    const int64_t Rr = N == 2 ? 4 : 6;
    int32_t p2l[4][64], rn[4][8];
    moe_placement pls[4];
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, E, N, 0, NULL, p2l[0], rn[0], &pls[0]));
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, E, N, 0, NULL, p2l[1], rn[1], &pls[1]));
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, E, N, Rr, load, p2l[2], rn[2], &pls[2]));
    int n_pl = 3;
    if (N > 2) {
        int q = 0;
        for (int r = 0; r < N; r++) {
            rn[3][r] = 0;
            if (r == 1)
                continue;
            p2l[3][q++] = 0; /* expert 0 (hot) on every rank but 1 */
            rn[3][r]++;
            for (int64_t e = 1; e < E; e++)
                if (e % (N - 1) == (r == 0 ? 0 : r - 1)) {
                    p2l[3][q++] = (int32_t)e;
                    rn[3][r]++;
                }
        }
        pls[3] = (moe_placement){.ep_size = N, .num_logical_experts = (int32_t)E, .num_physical_experts = q,
                                 .physical_to_logical = p2l[3], .rank_num_physical = rn[3]};
        OKC(ctx, moe_placement_check(ctx, &pls[3], E, N));
        n_pl = 4;
    }
    const char *names[4] = {"contiguous", "round_robin", "balanced", "hand-made, rank 1 empty"};
    /* the balanced placement spreads the skewed load: predicted max/mean below contiguous's */
    int64_t rows[8];
    double imb_c, imb_b;
    OKC(ctx, moe_placement_rank_rows(ctx, &pls[0], load, rows, &imb_c));
    OKC(ctx, moe_placement_rank_rows(ctx, &pls[2], load, rows, &imb_b));
    CHECK(imb_b < imb_c, "balanced imbalance %.3f not below contiguous %.3f", imb_b, imb_c);
    for (int i = 0; i < n_pl; i++) {
        for (int fmt = 0; fmt < 2; fmt++) {
            pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .low_latency = fmt, .cap = fmt ? 8 : 0, .pl = &pls[i]};
            char name[160];
            snprintf(name, sizeof name, "placement %s, skewed routing", names[i]);
            random_case(name, &L, skew, T, &c, -1, 16);
            snprintf(name, sizeof name, "placement %s, routed by the router", names[i]);
            random_case(name, &L, NULL, T, &c, -1, 16);
            c.zero_last = 1;
            snprintf(name, sizeof name, "placement %s, skewed, one chunk", names[i]);
            random_case(name, &L, skew, T, &c, -1, 1024);
            {
                /* identity experts: never placed (the placement covers the E routed experts), their
                 * rows never sent, with replicas of the routed ones */
                rlayer LZ;
                rlayer_make(&LZ, 48, 24, E, K, 16, 1, 0, 0, MOE_DTYPE_F32, 91);
                rlayer_identity(&LZ, 5, 92);
                c.zero_last = 0;
                snprintf(name, sizeof name, "placement %s, identity experts Z=5", names[i]);
                random_case(name, &LZ, NULL, T, &c, -1, 16);
                rlayer_free(&LZ);
            }
        }
        /* a non-contiguous placement is in the plan text and hash */
        moe_plan *pp = NULL;
        pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .pl = &pls[i]};
        OKC(ctx, par_plan_create(ctx, &L.d, &c, &pp));
        const int has = strstr(moe_plan_text(pp), "placement=") != NULL;
        const int contiguous = i == 0 || (i == 1 && N >= E); /* round robin = contiguous only when N >= E */
        CHECK(has == !contiguous, "placement %s: plan text %s placement=", names[i], has ? "has" : "lacks");
        moe_plan_free(pp);
    }
    say("  EP with placements contiguous, round_robin, balanced (%lld redundant; predicted max/mean %.3f vs "
        "contiguous %.3f)%s: bit-identical to one process, both formats, skewed and routed\n",
        (long long)Rr, imb_b, imb_c, n_pl > 3 ? ", hand-made with an empty rank" : "");
    if (N == 4) {
        /* TP 2 x EP 2 with round robin and balanced (4 redundant) placements over the EP ranks:
         * within the TP bound of one process (the TP split changes the down projection's sum) */
        int32_t t2l[2][32], trn[2][2];
        moe_placement tpl[2];
        OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, E, 2, 0, NULL, t2l[0], trn[0], &tpl[0]));
        OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, E, 2, 4, load, t2l[1], trn[1], &tpl[1]));
        for (int i = 0; i < 2; i++)
            for (int fmt = 0; fmt < 2; fmt++) {
                pcfg c = {.ep = 2, .tp = 2, .ddt = MOE_DTYPE_F32, .low_latency = fmt, .cap = fmt ? 8 : 0,
                          .pl = &tpl[i]};
                random_case(i ? "TP 2 x EP 2, balanced placement, skewed" : "TP 2 x EP 2, round robin, skewed", &L,
                            skew, T, &c, 1e-5, 16);
            }
        say("  TP 2 x EP 2 with round robin and balanced placements: within 1e-5 of one process, both formats\n");
    }
    free(skew);

    /* validation: every rank fails alike, naming the entry */
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = R;
    cfg.parallel.timeout_s = 20;
    int32_t bp2l[64], brn[8];
    memcpy(bp2l, p2l[2], sizeof bp2l);
    memcpy(brn, rn[2], sizeof brn);
    moe_placement bad = pls[2];
    bad.physical_to_logical = bp2l;
    bad.rank_num_physical = brn;
    cfg.parallel.placement = &bad;
    {
        bp2l[bad.num_physical_experts - 1] = (int32_t)(E + 3);
        char needle[96];
        snprintf(needle, sizeof needle, "physical expert %d holds logical expert %d, out of range",
                 (int)bad.num_physical_experts - 1, (int)(E + 3));
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, needle, "placement with a logical id out of range");
    }
    {
        /* missing expert: swap the contiguous placement's last expert for expert 0 (rank N-1 lacks 0) */
        memcpy(bp2l, p2l[0], sizeof(int32_t) * (size_t)E);
        memcpy(brn, rn[0], sizeof(int32_t) * (size_t)N);
        bad.num_physical_experts = (int32_t)E;
        bp2l[E - 1] = 0;
        char needle[96];
        snprintf(needle, sizeof needle, "logical expert %d is held by no physical expert", (int)(E - 1));
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, needle, "placement missing an expert");
        /* duplicate on one rank: rank 0's second expert repeats its first */
        memcpy(bp2l, p2l[0], sizeof(int32_t) * (size_t)E);
        bp2l[1] = bp2l[0];
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, "physical expert 1 (rank 0) repeats logical expert 0",
                         "placement with a duplicate on a rank");
        /* a placement for more ranks than ep_size (names a rank >= ep_size) */
        memcpy(bp2l, p2l[0], sizeof(int32_t) * (size_t)E);
        bad.ep_size = N + 1;
        char n2[96];
        snprintf(n2, sizeof n2, "ep_size = %d, but the plan's parallel.ep_size = %d", N + 1, N);
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, n2, "placement over more ranks than ep_size");
        bad.ep_size = N;
    }

    /* rank disagreement: rank N-1 swaps two physical experts of round robin (ranks 0 and 1):
     * every rank fails within the timeout, naming the first physical expert that differs */
    {
        memcpy(bp2l, p2l[1], sizeof(int32_t) * (size_t)E);
        memcpy(brn, rn[1], sizeof(int32_t) * (size_t)N);
        bad.num_physical_experts = (int32_t)E;
        const int a = 0, b = rn[1][0]; /* rank 0's first, rank 1's first physical expert */
        if (R == N - 1) {
            const int32_t tmp = bp2l[a];
            bp2l[a] = bp2l[b];
            bp2l[b] = tmp;
        }
        char needle[160];
        snprintf(needle, sizeof needle, "physical expert %d (EP rank 0's local expert 0) holds logical expert %d in rank "
                 "0's placement, %d in rank %d's", a, (int)p2l[1][a], (int)p2l[1][b], N - 1);
        const double t0 = MPI_Wtime();
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, needle, "ranks with different placements");
        CHECK(MPI_Wtime() - t0 < cfg.parallel.timeout_s, "the disagreement took %.1f s", MPI_Wtime() - t0);
        /* different rank counts: rank N-1 moves rank 0's last expert to rank 1 */
        memcpy(bp2l, p2l[0], sizeof(int32_t) * (size_t)E);
        memcpy(brn, rn[0], sizeof(int32_t) * (size_t)N);
        if (R == N - 1) {
            brn[0]--;
            brn[1]++;
        }
        snprintf(needle, sizeof needle, "EP rank 0 holds %d physical experts in rank 0's placement, %d in rank %d's",
                 (int)rn[0][0], (int)rn[0][0] - 1, N - 1);
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, needle, "ranks with different rank counts");
        /* one rank contiguous (no placement= entry), another round robin: named as well */
        if (R == N - 1)
            memcpy(bp2l, p2l[1], sizeof(int32_t) * (size_t)E), memcpy(brn, rn[1], sizeof(int32_t) * (size_t)N);
        expect_plan_fail(ctx, &L.d, &cfg, MOE_EINVAL, "the ranks' expert placements differ",
                         "one rank contiguous, another round robin");
    }
    say("  placement errors (out of range, missing, duplicate, ep_size) and disagreeing ranks refused on every rank\n");
    moe_ctx_free(ctx);
    rlayer_free(&L);
}

/* Dispatch / combine seconds and bytes per token (rank 0 prints; nothing is checked). */
static void mode_bench(void)
{
    rlayer L;
    rlayer_make(&L, 1024, 256, 32, 4, 0, 0, 0, 0, MOE_DTYPE_BF16, 81);
    const int64_t Ts[2] = {1, 256};
    for (int fmt = 0; fmt < 2; fmt++)
        for (int i = 0; i < 2; i++) {
            const int64_t T = Ts[i], H = 1024;
            float *x = xmalloc(sizeof(float) * (size_t)(T * H));
            tu_fill_uniform(x, (size_t)(T * H), 1, -1, 1);
            moe_ctx *ctx = make_ctx(1024, -1, NULL);
            pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .low_latency = fmt, .cap = fmt ? 256 : 0};
            moe_plan *p = par_plan(ctx, &L.d, &c);
            moe_weights *w = NULL;
            OKC(ctx, moe_weights_create(p, &L.src, &w));
            double disp = 0, comb = 0, tot = 0;
            long long bytes = 0, cbytes = 0;
            const int iters = 20;
            for (int it = 0; it < iters + 2; it++) {
                result r;
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                OKC(ctx, exec_rows(p, w, x, MOE_DTYPE_F32, NULL, T, 0, T, T, &r));
                double t1 = MPI_Wtime();
                if (it >= 2) {
                    disp += r.st.dispatch_seconds;
                    comb += r.st.combine_seconds;
                    tot += t1 - t0;
                    bytes += r.st.dispatch_bytes;
                    cbytes += r.st.combine_bytes;
                }
                result_free(&r);
            }
            say("  ep %d %s T %4lld: forward %.3f ms, dispatch %.3f ms, combine %.3f ms, bytes/token sent %lld + %lld\n",
                N, fmt ? "batched " : "standard", (long long)T, 1e3 * tot / iters, 1e3 * disp / iters,
                1e3 * comb / iters, bytes / iters / T, cbytes / iters / T);
            moe_weights_free(w);
            moe_plan_free(p);
            moe_ctx_free(ctx);
            free(x);
        }
    rlayer_free(&L);
}

/* Rank 1 dies before an execute; rank 0 must not hang (mpirun ends the job or the execute
 * times out). Exits non-zero either way. */
static void mode_kill(void)
{
    rlayer L;
    rlayer_make(&L, 16, 8, 8, 2, 0, 0, 0, 0, MOE_DTYPE_F32, 91);
    moe_ctx *ctx = make_ctx(1024, -1, NULL);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = -1;
    cfg.parallel.timeout_s = 5;
    moe_plan *p = NULL;
    OKC(ctx, moe_plan_create_ex(ctx, &L.d, &cfg, &p));
    moe_weights *w = NULL;
    OKC(ctx, moe_weights_create(p, &L.src, &w));
    if (R == 1) {
        fprintf(stderr, "[rank 1] raising SIGKILL\n");
        fflush(stderr);
        raise(SIGKILL);
    }
    sleep(1);
    const int64_t T = 4, H = 16;
    float x[4 * 16], out[4 * 16];
    tu_fill_uniform(x, (size_t)(T * H), 1, -1, 1);
    size_t wsz = moe_plan_workspace_size(p, T);
    void *ws = xmalloc(wsz);
    double t0 = MPI_Wtime();
    moe_status st = moe_plan_execute(p, w, x, T, out, ws, wsz);
    fprintf(stderr, "[rank %d] execute after a peer died: %s after %.1f s: %s\n", R, moe_status_name(st),
            MPI_Wtime() - t0, moe_ctx_last_error(ctx));
    fflush(stderr);
    _exit(st == MOE_OK ? 0 : 3);
}

/* Rank 1 arrives after the others' timeout: they get MOE_ETIMEOUT, not a hang. */
static void mode_late(void)
{
    rlayer L;
    rlayer_make(&L, 16, 8, 8, 2, 0, 0, 0, 0, MOE_DTYPE_F32, 92);
    moe_ctx *ctx = make_ctx(1024, -1, NULL);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = -1;
    cfg.parallel.timeout_s = 2;
    if (R == 1)
        sleep(6);
    double t0 = MPI_Wtime();
    moe_plan *p = NULL;
    moe_status st = moe_plan_create_ex(ctx, &L.d, &cfg, &p);
    double waited = MPI_Wtime() - t0;
    fprintf(stderr, "[rank %d] plan creation with a late peer: %s after %.1f s: %s\n", R, moe_status_name(st), waited,
            moe_ctx_last_error(ctx));
    fflush(stderr);
    if (R != 1 && (st != MOE_ETIMEOUT || waited > 10))
        _exit(4);
    _exit(R == 1 ? 0 : 5); /* 5: the expected outcome on the ranks that arrived */
}

/* Two `moe run` output files: ids equal, output within tol * max |a| (0: bitwise). */
/* ---- rebalance ------------------------------------------------------------------------------ */

/* The logical experts EP rank r holds under placement pl: in[e] = 1 (in [E]). */
static void rank_set(const moe_placement *pl, int r, int64_t E, int *in)
{
    int64_t q = 0;
    for (int s = 0; s < r; s++)
        q += pl->rank_num_physical[s];
    for (int64_t e = 0; e < E; e++)
        in[e] = 0;
    for (int32_t i = 0; i < pl->rank_num_physical[r]; i++)
        in[pl->physical_to_logical[q + i]] = 1;
}

/* A source holding only the experts set in `want` [E] (the others NULL: reading one fails). */
static void subset_src(local_src *ls, const rlayer *L, const int *want)
{
    const int64_t E = L->d.num_experts;
    ls->src = L->src;
    ls->gp = calloc((size_t)E, sizeof(void *));
    ls->up = calloc((size_t)E, sizeof(void *));
    ls->dp = calloc((size_t)E, sizeof(void *));
    ls->gbp = calloc((size_t)E, sizeof(void *));
    ls->ubp = calloc((size_t)E, sizeof(void *));
    ls->dbp = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++)
        if (want[e]) {
            ls->gp[e] = L->gp[e];
            ls->up[e] = L->up[e];
            ls->dp[e] = L->dp[e];
            if (L->gbp) {
                ls->gbp[e] = L->gbp[e];
                ls->ubp[e] = L->ubp[e];
                ls->dbp[e] = L->dbp[e];
            }
        }
    ls->src.gate_proj = L->src.gate_proj ? ls->gp : NULL; /* NULL: non-gated experts */
    ls->src.up_proj = ls->up;
    ls->src.down_proj = ls->dp;
    if (L->gbp) {
        ls->src.gate_bias = L->src.gate_bias ? ls->gbp : NULL;
        ls->src.up_bias = ls->ubp;
        ls->src.down_bias = ls->dbp;
    }
}

/* The EP output of (pp, wp) for this rank's tokens, bit-identical to ref (one process). */
static void rebal_check_output(const char *what, moe_ctx *ctx, moe_plan *pp, moe_weights *wp, const rlayer *L,
                               const float *x, const float *logits, int64_t T, const result *ref)
{
    const pcfg c = {.ep = N, .tp = 1};
    int64_t b, e, maxs;
    par_tokens(&c, T, &b, &e, &maxs);
    result got;
    OKC(ctx, exec_rows(pp, wp, x, MOE_DTYPE_F32, logits, T, b, e, maxs, &got));
    compare(what, &got, ref, L->d.hidden_size, L->d.top_k, T, -1, b, e);
    result_free(&got);
}

/* moe_plan_rebalance of a parallel plan: contiguous -> balanced (redundant experts) -> round
 * robin, both formats, the output bit-identical to one process after each, the report's
 * counts and bytes computed here (kept / packed / dropped from the placements, bytes from a
 * plan created with the new placement), only the new experts read (the source holds nothing
 * else), the plan's placement, text and hash those of a plan created with it; a different
 * `next` on one rank, and a staging failure on one rank, fail every rank with the old
 * placement still giving the same output; a rebalance called on rank 0 only times out there
 * within timeout_s, later ones fail at once, and the plan still executes and frees cleanly. */
static void mode_rebal(void)
{
    /* top_k 6 > E / 4: at 4 ranks the batched blocks are sized by the fullest rank's physical
     * experts, which the balanced placement raises (a stale size would overflow them) */
    const int64_t E = 16, K = 6, T = 67, H = 48;
    rlayer L;
    rlayer_make(&L, H, 24, E, K, 16, 1, 1, 0, MOE_DTYPE_F32, 93);
    if (g_nongated)
        rlayer_nongated(&L);
    say("  experts: %s\n", g_nongated ? "non-gated relu2, no gate arrays given" : "gated SwiGLU");
    moe_ctx *ctx = make_ctx(16, -1, NULL);
    const int hot[4] = {0, 1, 2, 5};
    float *skew = hot_logits(T, E, K, hot, 4, 0.75, 19);
    int64_t load[16];
    load_of(ctx, &L, skew, T, load);
    float *x = xmalloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 77 + (uint64_t)T, -1.0f, 1.0f);
    /* the one-process reference and one routed expert's packed bytes (a layer without the
     * shared expert: its expert bytes are E experts' exactly) */
    moe_plan *p1 = NULL;
    moe_weights *w1 = NULL;
    OKC(ctx, moe_plan_create(ctx, &L.d, &p1));
    OKC(ctx, moe_weights_create(p1, &L.src, &w1));
    result ref;
    OKC(ctx, exec_rows(p1, w1, x, MOE_DTYPE_F32, skew, T, 0, T, T, &ref));
    moe_layer_desc d0 = L.d;
    d0.shared_expert_intermediate_size = 0;
    d0.shared_expert_gated = 0;
    moe_plan *p0 = NULL;
    moe_weights *w0 = NULL;
    OKC(ctx, moe_plan_create(ctx, &d0, &p0));
    OKC(ctx, moe_weights_create(p0, &L.src, &w0));
    const size_t each = moe_weights_expert_bytes(w0) / (size_t)E;
    moe_weights_free(w0);
    moe_plan_free(p0);

    const int64_t Rr = N == 2 ? 4 : 6;
    int32_t p2l[3][64], rn[3][8];
    moe_placement pls[3];
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, E, N, 0, NULL, p2l[0], rn[0], &pls[0]));
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, E, N, Rr, load, p2l[1], rn[1], &pls[1]));
    OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, E, N, 0, NULL, p2l[2], rn[2], &pls[2]));
    const char *names[3] = {"contiguous", "balanced", "round_robin"};
    int cur[16], nxt[16], fresh[16];
    for (int fmt = 0; fmt < 2; fmt++) {
        const pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32, .low_latency = fmt, .cap = fmt ? 8 : 0};
        moe_plan *pp = par_plan(ctx, &L.d, &c);
        local_src ls;
        local_src_make(&ls, &L, pp);
        moe_weights *wp = NULL;
        OKC(ctx, moe_weights_create(pp, &ls.src, &wp));
        local_src_free(&ls);
        rebal_check_output("rebalance: before (contiguous)", ctx, pp, wp, &L, x, skew, T, &ref);
        for (int i = 1; i < 3; i++) {
            rank_set(&pls[i - 1], R, E, cur);
            rank_set(&pls[i], R, E, nxt);
            int64_t kept = 0, packed = 0, freed = 0;
            for (int64_t e = 0; e < E; e++) {
                kept += cur[e] && nxt[e];
                packed += !cur[e] && nxt[e];
                freed += cur[e] && !nxt[e];
                fresh[e] = !cur[e] && nxt[e];
            }
            /* the plan a fresh start would build for this placement: its hash, text and bytes */
            pcfg cn = c;
            cn.pl = &pls[i];
            moe_plan *pn = par_plan(ctx, &L.d, &cn);
            local_src lsn;
            local_src_make(&lsn, &L, pn);
            moe_weights *wn = NULL;
            OKC(ctx, moe_weights_create(pn, &lsn.src, &wn));
            local_src_free(&lsn);
            local_src sub;
            subset_src(&sub, &L, fresh); /* only the experts new to this rank */
            sub.src.router = NULL;       /* nor the router or the shared expert (not read) */
            sub.src.shared_gate_proj = sub.src.shared_up_proj = sub.src.shared_down_proj = NULL;
            sub.src.shared_expert_gate = NULL;
            moe_rebalance_report rep;
            memset(&rep, 0xff, sizeof rep);
            OKC(ctx, moe_plan_rebalance(pp, wp, &pls[i], &sub.src, &rep));
            local_src_free(&sub);
            char what[160];
            snprintf(what, sizeof what, "rebalance %s -> %s (%s)", names[i - 1], names[i], fmt ? "batched" : "standard");
            CHECK(rep.experts_kept == kept && rep.experts_packed == packed && rep.experts_freed == freed,
                  "%s: report kept %lld packed %lld freed %lld, expected %lld %lld %lld", what,
                  (long long)rep.experts_kept, (long long)rep.experts_packed, (long long)rep.experts_freed,
                  (long long)kept, (long long)packed, (long long)freed);
            CHECK(rep.bytes_packed == (size_t)packed * each, "%s: bytes_packed %zu, expected %lld * %zu", what,
                  rep.bytes_packed, (long long)packed, each);
            CHECK(rep.bytes_resident == moe_weights_expert_bytes(wn) &&
                      moe_weights_expert_bytes(wp) == moe_weights_expert_bytes(wn),
                  "%s: bytes_resident %zu (weights say %zu), a plan created with it holds %zu", what, rep.bytes_resident,
                  moe_weights_expert_bytes(wp), moe_weights_expert_bytes(wn));
            CHECK(rep.seconds >= 0 && rep.seconds < 60, "%s: seconds %g", what, rep.seconds);
            CHECK(moe_plan_hash(pp) == moe_plan_hash(pn) && !strcmp(moe_plan_text(pp), moe_plan_text(pn)),
                  "%s: plan text/hash differ from a plan created with the placement:\n%s\n%s", what,
                  moe_plan_text(pp), moe_plan_text(pn));
            const moe_placement *now = moe_plan_placement(pp);
            CHECK(now->num_physical_experts == pls[i].num_physical_experts &&
                      !memcmp(now->physical_to_logical, pls[i].physical_to_logical,
                              sizeof(int32_t) * (size_t)pls[i].num_physical_experts) &&
                      !memcmp(now->rank_num_physical, pls[i].rank_num_physical, sizeof(int32_t) * (size_t)N),
                  "%s: moe_plan_placement is not next", what);
            int32_t map[16];
            OKC(ctx, moe_plan_expert_map(pp, map));
            for (int64_t e = 0; e < E; e++)
                CHECK((map[e] >= 0) == nxt[e], "%s: expert map of logical %lld", what, (long long)e);
            rebal_check_output(what, ctx, pp, wp, &L, x, skew, T, &ref);
            /* every token's K experts on the fullest rank of next (when it holds K): a dispatch
             * block sized by the old placement's fullest rank would overflow */
            int fullest = 0;
            for (int r = 1; r < N; r++)
                fullest = pls[i].rank_num_physical[r] > pls[i].rank_num_physical[fullest] ? r : fullest;
            if (pls[i].rank_num_physical[fullest] >= K) {
                int in_f[16];
                rank_set(&pls[i], fullest, E, in_f);
                int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)(T * K)); /* [T, K] */
                float *wts = xmalloc(sizeof(float) * (size_t)(T * K));     /* [T, K] */
                for (int64_t t = 0; t < T; t++) {
                    int64_t k = 0;
                    for (int64_t e = 0; e < E && k < K; e++)
                        if (in_f[(e + t) % E]) {
                            ids[t * K + k] = (int32_t)((e + t) % E);
                            wts[t * K + k] = 1.0f / (float)(k + 2);
                            k++;
                        }
                }
                result r1, got;
                OKC(ctx, exec_rows_ex(p1, w1, x, MOE_DTYPE_F32, NULL, T, 0, T, T, ids, wts, MOE_DTYPE_F32, &r1));
                int64_t tb, te, tm;
                par_tokens(&c, T, &tb, &te, &tm);
                OKC(ctx, exec_rows_ex(pp, wp, x, MOE_DTYPE_F32, NULL, T, tb, te, tm, ids, wts,
                                      MOE_DTYPE_F32, &got));
                char w2[200];
                snprintf(w2, sizeof w2, "%s, every token's experts on EP rank %d", what, fullest);
                compare(w2, &got, &r1, H, K, T, -1, tb, te);
                result_free(&got);
                result_free(&r1);
                free(ids);
                free(wts);
            }
            moe_weights_free(wn);
            moe_plan_free(pn);
        }
        say("  rebalance contiguous -> balanced (%lld redundant) -> round_robin, %s: report right, only the new "
            "experts read, bit-identical to one process after each\n",
            (long long)Rr, fmt ? "batched" : "standard");

        /* a different next on the last rank: every rank fails naming the entry, nothing moves */
        const uint64_t h0 = moe_plan_hash(pp);
        moe_rebalance_report rep;
        moe_status st = moe_plan_rebalance(pp, wp, R == N - 1 ? &pls[1] : &pls[0], &L.src, &rep);
        CHECK(st == MOE_EINVAL && strstr(moe_ctx_last_error(ctx), "expert placements differ (next)"),
              "different next: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
        CHECK(moe_plan_hash(pp) == h0, "different next: the plan changed");
        rebal_check_output("rebalance: after a different next", ctx, pp, wp, &L, x, skew, T, &ref);
        /* a staging failure on rank 1 (its source lacks the experts it would read) */
        int none[16] = {0};
        local_src empty;
        subset_src(&empty, &L, none);
        st = moe_plan_rebalance(pp, wp, &pls[0], R == 1 ? &empty.src : &L.src, &rep);
        local_src_free(&empty);
        CHECK(st == MOE_EINVAL && (R == 1 ? strstr(moe_ctx_last_error(ctx), "pointer is NULL") != NULL
                                          : strstr(moe_ctx_last_error(ctx), "rank 1 (ep_rank 1") != NULL),
              "staging failure on rank 1: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
        CHECK(moe_plan_hash(pp) == h0, "staging failure: the plan changed");
        rebal_check_output("rebalance: after a failed staging", ctx, pp, wp, &L, x, skew, T, &ref);
        moe_weights_free(wp);
        moe_plan_free(pp);
    }
    say("  rebalance to a different next on one rank, or failing to stage on one: every rank fails, naming it; "
        "the old placement still bit-identical\n");

    if (N == 4) {
        /* TP 2 x EP 2: contiguous -> balanced (4 redundant) moves each TP rank's I shard of
         * the experts; the output equals, bit for bit, a plan created with that placement */
        int32_t t2l[2][32], trn[2][2];
        moe_placement tpl[2];
        OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, E, 2, 0, NULL, t2l[0], trn[0], &tpl[0]));
        OKC(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, E, 2, 4, load, t2l[1], trn[1], &tpl[1]));
        const pcfg c = {.ep = 2, .tp = 2, .ddt = MOE_DTYPE_F32};
        pcfg cn = c;
        cn.pl = &tpl[1];
        moe_ctx *tctx = make_ctx(16, 0, NULL);
        moe_plan *pp = par_plan(tctx, &L.d, &c), *pn = par_plan(tctx, &L.d, &cn);
        moe_weights *wp = NULL, *wn = NULL;
        OKC(tctx, moe_weights_create(pp, &L.src, &wp));
        OKC(tctx, moe_weights_create(pn, &L.src, &wn));
        int cur[16], nxt[16];
        rank_set(&tpl[0], R / 2, E, cur);
        rank_set(&tpl[1], R / 2, E, nxt);
        int64_t packed = 0;
        for (int64_t e = 0; e < E; e++)
            packed += !cur[e] && nxt[e];
        moe_rebalance_report rep;
        OKC(tctx, moe_plan_rebalance(pp, wp, &tpl[1], &L.src, &rep));
        CHECK(rep.experts_packed == packed && rep.bytes_resident == moe_weights_expert_bytes(wn),
              "TP x EP rebalance: packed %lld (expected %lld), resident %zu (a fresh plan's %zu)",
              (long long)rep.experts_packed, (long long)packed, rep.bytes_resident, moe_weights_expert_bytes(wn));
        CHECK(moe_plan_hash(pp) == moe_plan_hash(pn), "TP x EP rebalance: plan hash differs from a fresh plan's");
        int64_t b, e, maxs;
        par_tokens(&c, T, &b, &e, &maxs);
        result got, want;
        OKC(tctx, exec_rows(pp, wp, x, MOE_DTYPE_F32, skew, T, b, e, maxs, &got));
        OKC(tctx, exec_rows(pn, wn, x, MOE_DTYPE_F32, skew, T, b, e, maxs, &want));
        compare("TP 2 x EP 2 rebalanced vs created with the placement", &got, &want, H, K, T, -1, b, e);
        compare("TP 2 x EP 2 rebalanced vs one process", &got, &ref, H, K, T, 1e-5, b, e);
        result_free(&got);
        result_free(&want);
        moe_weights_free(wp);
        moe_weights_free(wn);
        moe_plan_free(pp);
        moe_plan_free(pn);
        moe_ctx_free(tctx);
        say("  TP 2 x EP 2 rebalance contiguous -> balanced: bit-identical to a plan created with it, within 1e-5 "
            "of one process\n");
    }

    /* quantized experts (scales and zero points; w8a8 compensations): the kept experts' codes
     * and scales move with them; contiguous -> round robin -> balanced (2 redundant) */
    const char *schemes[2] = {"int4-g32-zp", "int8-w8a8"};
    for (int si = 0; si < 2; si++) {
        const int64_t qE = 8, qK = 2, qH = 64, qT = 29;
        qlayer Q;
        qlayer_make(&Q, schemes[si], 0, qH, 96, qE, qK, 31);
        moe_ctx *qctx = make_ctx(8, -1, NULL);
        float *qx = xmalloc(sizeof(float) * (size_t)(qT * qH));
        tu_fill_uniform(qx, (size_t)(qT * qH), 123, -1.0f, 1.0f);
        qsrc all;
        qsrc_make(&all, &Q, NULL);
        moe_plan *q1 = NULL;
        moe_weights *qw1 = NULL;
        OKC(qctx, moe_plan_create(qctx, &Q.d, &q1));
        OKC(qctx, moe_weights_create(q1, &all.src, &qw1));
        result qref;
        OKC(qctx, exec_rows(q1, qw1, qx, MOE_DTYPE_F32, NULL, qT, 0, qT, qT, &qref));
        const pcfg c = {.ep = N, .tp = 1, .ddt = MOE_DTYPE_F32};
        moe_plan *qp = par_plan(qctx, &Q.d, &c);
        moe_weights *qwp = NULL;
        OKC(qctx, moe_weights_create(qp, &all.src, &qwp));
        int64_t qload[8];
        for (int64_t e = 0; e < qE; e++)
            qload[e] = 1 + (e * 5) % 7;
        int32_t q2l[2][32], qrn[2][8];
        moe_placement qpl[2];
        OKC(qctx, moe_placement_build(qctx, MOE_PLACEMENT_ROUND_ROBIN, qE, N, 0, NULL, q2l[0], qrn[0], &qpl[0]));
        OKC(qctx, moe_placement_build(qctx, MOE_PLACEMENT_BALANCED, qE, N, 2, qload, q2l[1], qrn[1], &qpl[1]));
        for (int i = 0; i < 2; i++) {
            OKC(qctx, moe_plan_rebalance(qp, qwp, &qpl[i], &all.src, NULL));
            int64_t b, e, maxs;
            par_tokens(&c, qT, &b, &e, &maxs);
            result got;
            OKC(qctx, exec_rows(qp, qwp, qx, MOE_DTYPE_F32, NULL, qT, b, e, maxs, &got));
            char what[128];
            snprintf(what, sizeof what, "%s rebalanced to %s", schemes[si], i ? "balanced" : "round_robin");
            compare(what, &got, &qref, qH, qK, qT, -1, b, e);
            result_free(&got);
        }
        result_free(&qref);
        moe_weights_free(qwp);
        moe_plan_free(qp);
        moe_weights_free(qw1);
        moe_plan_free(q1);
        qsrc_free(&all);
        free(qx);
        moe_ctx_free(qctx);
        qlayer_free(&Q);
    }
    say("  quantized experts (int4-g32-zp, int8-w8a8) rebalanced contiguous -> round_robin -> balanced: "
        "bit-identical to one process\n");

    /* rank 0 alone: MOE_ETIMEOUT within timeout_s, the plan still executes, later ones refused */
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = N;
    cfg.parallel.ep_rank = -1;
    cfg.parallel.tp_rank = -1;
    cfg.parallel.timeout_s = 2;
    moe_plan *pp = NULL;
    OKC(ctx, moe_plan_create_ex(ctx, &L.d, &cfg, &pp));
    moe_weights *wp = NULL;
    OKC(ctx, moe_weights_create(pp, &L.src, &wp));
    if (R == 0) {
        const double t0 = MPI_Wtime();
        moe_status st = moe_plan_rebalance(pp, wp, &pls[2], &L.src, NULL);
        const double waited = MPI_Wtime() - t0;
        CHECK(st == MOE_ETIMEOUT && strstr(moe_ctx_last_error(ctx), "keeps its old placement"),
              "rank 0 alone: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
        CHECK(waited >= 2 && waited < 12, "rank 0 alone: returned after %.1f s (timeout_s 2)", waited);
        st = moe_plan_rebalance(pp, wp, &pls[2], &L.src, NULL);
        CHECK(st == MOE_ETIMEOUT && strstr(moe_ctx_last_error(ctx), "an earlier rebalance on this plan timed out"),
              "after the timeout: %s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
        CHECK(MPI_Wtime() - t0 - waited < 1, "the refusal after a timeout waited");
        CHECK(moe_plan_placement(pp)->num_physical_experts == E, "rank 0 alone: the placement changed");
    }
    MPI_Barrier(MPI_COMM_WORLD); /* the others wait (outside libmoe) for rank 0's timeout */
    rebal_check_output("rebalance timed out on rank 0", ctx, pp, wp, &L, x, skew, T, &ref);
    moe_weights_free(wp);
    moe_plan_free(pp); /* with rank 0's exchange still pending: no hang, no crash (nor at MPI_Finalize) */
    say("  rebalance on rank 0 alone: MOE_ETIMEOUT within timeout_s there, later ones refused at once; the plan "
        "still bit-identical and freed\n");
    result_free(&ref);
    moe_weights_free(w1);
    moe_plan_free(p1);
    free(x);
    free(skew);
    rlayer_free(&L);
    moe_ctx_free(ctx);
}

static int mode_compare(int argc, char **argv)
{
    CHECK(argc == 5, "usage: test_mpi compare A.safetensors B.safetensors TOL");
    moe_ctx *ctx = make_ctx(0, -1, NULL);
    moe_safetensors *f[2] = {NULL, NULL};
    moe_tensor_info o[2], id[2];
    for (int i = 0; i < 2; i++) {
        OKC(ctx, moe_safetensors_open(ctx, argv[2 + i], &f[i]));
        OKC(ctx, moe_safetensors_get(f[i], "output", &o[i]));
        OKC(ctx, moe_safetensors_get(f[i], "topk_ids", &id[i]));
    }
    CHECK(o[0].nbytes == o[1].nbytes && id[0].nbytes == id[1].nbytes, "shapes differ");
    CHECK(memcmp(id[0].data, id[1].data, id[0].nbytes) == 0, "topk_ids differ");
    const size_t n = o[0].nbytes / sizeof(float);
    float *a = xmalloc(o[0].nbytes), *b = xmalloc(o[1].nbytes);
    memcpy(a, o[0].data, o[0].nbytes);
    memcpy(b, o[1].data, o[1].nbytes);
    const double tol = atof(argv[4]), diff = tu_max_abs_diff(a, b, n), mx = tu_max_abs(a, n);
    if (tol == 0)
        CHECK(memcmp(a, b, o[0].nbytes) == 0, "outputs not bit-identical (max |diff| %g)", diff);
    else
        CHECK(diff <= tol * mx, "max |diff| %g exceeds %g x max |a| = %g", diff, tol, tol * mx);
    printf("compare %s %s: ids equal, max |diff| %g (%g of max |a|)\n", argv[2], argv[3], diff, mx > 0 ? diff / mx : 0);
    free(a);
    free(b);
    moe_safetensors_free(f[0]);
    moe_safetensors_free(f[1]);
    moe_ctx_free(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_mode = argc > 1 ? argv[1] : "";
    CHECK(moe_mpi_available(), "libmoe built without MPI");
    double t0 = MPI_Wtime();
    say("test_mpi %s on %d ranks\n", g_mode, N);
    if (!strcmp(g_mode, "ep"))
        mode_ep();
    else if (!strcmp(g_mode, "tp"))
        mode_tp();
    else if (!strcmp(g_mode, "errors"))
        mode_errors();
    else if (!strcmp(g_mode, "quant"))
        mode_quant();
    else if (!strcmp(g_mode, "qexperts"))
        mode_qexperts();
    else if (!strcmp(g_mode, "placement"))
        mode_placement();
    else if (!strcmp(g_mode, "eplb") || !strcmp(g_mode, "eplb_nongated")) {
        g_nongated = g_mode[4] != '\0';
        mode_eplb();
    } else if (!strcmp(g_mode, "rebal") || !strcmp(g_mode, "rebal_nongated")) {
        g_nongated = g_mode[5] != '\0';
        mode_rebal();
    }
    else if (!strcmp(g_mode, "capacity"))
        mode_capacity();
    else if (!strcmp(g_mode, "bench"))
        mode_bench();
    else if (!strcmp(g_mode, "kill"))
        mode_kill();
    else if (!strcmp(g_mode, "late"))
        mode_late();
    else if (!strcmp(g_mode, "compare"))
        mode_compare(argc, argv);
    else
        FAIL("unknown mode '%s' (ep, tp, errors, quant, placement, eplb, eplb_nongated, rebal, rebal_nongated, capacity, "
             "bench, kill, late)", g_mode);
    MPI_Barrier(MPI_COMM_WORLD);
    say("test_mpi %s on %d ranks: OK (%.1f s)\n", g_mode, N, MPI_Wtime() - t0);
    MPI_Finalize();
    return 0;
}
