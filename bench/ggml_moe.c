/* bench/ggml_moe.c: ggml's MoE expert FFN on the CPU, timed under the memory conditions of
 * libmoe's `moe bench` (tools/bench.c).
 *
 * Our code calling ggml's public C API (ggml.h, ggml-cpu.h); ggml itself is built from source
 * outside this repository (bench/README.md, bench/build_ggml_harness.sh). Not part of the
 * library or of `make test`.
 *
 * The graph is the expert part of llama.cpp's build_moe_ffn (src/llama-graph.cpp) for a
 * model with separate gate and up expert tensors (qwen3moe: ffn_gate_exps, ffn_up_exps,
 * ffn_down_exps), with the router's output given as inputs:
 *
 *   x       [H, 1, T]  f32   hidden states
 *   ids     [K, T]     i32   selected experts per token
 *   w       [1, K, T]  f32   their routing weights
 *   gate    = ggml_mul_mat_id(gate_exps [H, I, E], x, ids)   -> [I, K, T]
 *   up      = ggml_mul_mat_id(up_exps   [H, I, E], x, ids)   -> [I, K, T]
 *   act     = ggml_swiglu_split(gate, up)  silu(gate) * up   -> [I, K, T]
 *   experts = ggml_mul_mat_id(down_exps [I, H, E], act, ids) -> [H, K, T]
 *   experts = ggml_mul(experts, w)                           -> [H, K, T]
 *   out     = sum over k of ggml_view_2d(experts, H, T, ...)  (K - 1 ggml_add) -> [H, T]
 *
 * Memory conditions, as in libmoe's bench: forward r, token t, slot j uses expert
 * (walk0 + r*T*K + t*K + j) mod E, so consecutive forwards walk round-robin through all E
 * experts and the walk goes on across rows; when the layer's expert weights are under 4 x LLC
 * (LLC = max(sysfs, 260 MiB), the figure libmoe's bench assumes), several copies of the
 * weights are made and rotated (one copy per pass over the experts), with the same copy count
 * formula. Inputs and routing weights come from a ring of distinct slots. The weights are
 * generated uniform in +-1/sqrt(fan_in) and converted to the weight type with
 * ggml_quantize_chunk (F16/BF16: ggml's own conversion; Q8_0/Q4_0: ggml's quantizers).
 *
 * Timed: ggml_graph_compute only (a persistent ggml threadpool of N threads, the caller is
 * one of them); inputs are copied into the graph's input tensors and the weight tensors are
 * pointed at the copy in use before the clock starts. Per row: one warm-up forward, then
 * enough forwards for --min-time (between --min-iters and --max-iters), median reported.
 *
 * Output: one JSON object per line per T on stdout; a header on stderr.
 *
 * --check: builds a small layer (H 64, I 64, E 16, K 4 unless overridden), runs the same graph
 * for T = 1 and T = 5 and compares with a straightforward double-precision computation on the
 * weights ggml dequantizes (type traits to_float) and the activations rounded to the type
 * ggml's CPU dot products take (vec_dot_type). Each output may differ by 1e-4 of the largest
 * output plus its flip budget: the effect of the SwiGLU activations that lie within 1e-5 of
 * the row's largest activation of a rounding boundary rounding one step the other way
 * (ggml computes them in float, the reference in double). Also computes the same with gate
 * and up swapped, which must miss by 10x the allowance, to show the comparison can fail.
 * --shape 2048,768,16,8 checks the real H, I, K. Exit status 0 = pass. */
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROJECT_LLC_BYTES (260ull << 20) /* libmoe's bench: documented LLC of the project's machines */
#define MAX_COPIES 64
#define POOL_BUDGET (256ull << 20) /* bytes of distinct generated f32 expert values */
#define RING_CAP_BYTES (64ull << 20) /* inputs per ring */
#define MAX_TOKEN_ROWS 32

typedef struct cfg {
    int64_t H, I, E, K;
    int64_t tokens[MAX_TOKEN_ROWS];
    int ntokens;
    int threads;
    enum ggml_type type;
    double min_time;
    int min_iters, max_iters;
    int copies; /* 0: libmoe's formula */
    uint64_t llc;
    uint64_t seed;
    int check;
    int repack; /* --repack: q4_0 weights in ggml's CPU_REPACK buffer type, as llama.cpp does */
} cfg;

/* ---- small helpers ------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* uniform in [-1, 1), a pure function of (seed, i) */
static float uniform_pm1(uint64_t seed, uint64_t i)
{
    uint64_t r = splitmix64(seed ^ splitmix64(i));
    return (float)((double)(r >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static void *xalloc(size_t n)
{
    void *p = NULL;
    if (n == 0)
        n = 1;
    if (posix_memalign(&p, 4096, (n + 4095) / 4096 * 4096) != 0) {
        fprintf(stderr, "ggml_moe: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int parse_type(const char *s, enum ggml_type *t)
{
    static const struct { const char *n; enum ggml_type t; } tab[] = {
        {"bf16", GGML_TYPE_BF16}, {"f16", GGML_TYPE_F16}, {"f32", GGML_TYPE_F32},
        {"q8_0", GGML_TYPE_Q8_0}, {"q4_0", GGML_TYPE_Q4_0},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(s, tab[i].n) == 0) {
            *t = tab[i].t;
            return 0;
        }
    return -1;
}

/* Largest data/unified cache size from sysfs (cpu0), 0 when unknown. */
static uint64_t llc_sysfs(void)
{
    uint64_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(buf, sizeof buf, f)) {
            char *end;
            uint64_t v = strtoull(buf, &end, 10);
            if (*end == 'K')
                v <<= 10;
            else if (*end == 'M')
                v <<= 20;
            if (v > best)
                best = v;
        }
        fclose(f);
    }
    return best;
}

static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lu kB", (unsigned long *)&kb) == 1)
            break;
    fclose(f);
    return kb << 10;
}

/* ---- the layer's weights --------------------------------------------------------------- */

/* One copy of the layer: ggml's layout, expert-major.
 *   gate, up: [E][I rows][row of H in `type`]  (ggml ne = {H, I, E})
 *   down:     [E][H rows][row of I in `type`]  (ggml ne = {I, H, E}) */
typedef struct layer_copy {
    void *gate, *up, *down;
    /* --repack: the same weights in a CPU_REPACK backend buffer (ggml re-lays them out,
     * e.g. q4_0 -> q4_0_8x8 on AVX2); the plain bytes above are then freed, except copy 0's
     * under --check (the reference reads them) */
    struct ggml_context *rctx;
    ggml_backend_buffer_t rbuf;
    struct ggml_tensor *rg, *ru, *rd;
} layer_copy;

typedef struct layer {
    const cfg *c;
    size_t row_h, row_i; /* bytes of a row of H / of I elements in `type` */
    size_t mat_gu;       /* one expert's gate (= up) matrix, bytes: I * row_h */
    size_t mat_d;        /* one expert's down matrix, bytes: H * row_i */
    double expert_bytes; /* 2 * mat_gu + mat_d */
    int copies, copies_wanted;
    layer_copy *cp;
    /* the G distinct generated experts, f32, for --check's reference:
     * pool_f32[g]: gate [I][H], up [I][H], down [H][I] */
    int64_t G;
} layer;

/* Generate expert g's three f32 matrices: gate [I][H], up [I][H], down [H][I]. */
static void gen_expert_f32(const cfg *c, int64_t g, float *gate, float *up, float *down)
{
    const int64_t H = c->H, I = c->I;
    const float bh = 1.0f / sqrtf((float)H), bi = 1.0f / sqrtf((float)I);
    const uint64_t first = (uint64_t)g * 3 * (uint64_t)(H * I);
    for (int64_t n = 0; n < H * I; n++) {
        gate[n] = bh * uniform_pm1(c->seed, first + (uint64_t)n);
        up[n] = bh * uniform_pm1(c->seed, first + (uint64_t)(H * I + n));
        down[n] = bi * uniform_pm1(c->seed, first + (uint64_t)(2 * H * I + n));
    }
}

/* Fill L->cp[0..copies): experts e use generated expert e % G, converted to `type` with
 * ggml_quantize_chunk; further copies are byte copies of the first (distinct addresses, so
 * distinct cache lines, which is what the rotation needs). */
static void layer_build(layer *L, const cfg *c, int copies)
{
    const int64_t H = c->H, I = c->I, E = c->E;
    L->c = c;
    L->row_h = ggml_row_size(c->type, H);
    L->row_i = ggml_row_size(c->type, I);
    L->mat_gu = (size_t)I * L->row_h;
    L->mat_d = (size_t)H * L->row_i;
    L->expert_bytes = 2.0 * (double)L->mat_gu + (double)L->mat_d;
    L->copies = copies;
    L->cp = calloc((size_t)copies, sizeof *L->cp);
    int64_t G = (int64_t)(POOL_BUDGET / ((uint64_t)3 * (uint64_t)(H * I) * sizeof(float)));
    if (G < 1)
        G = 1;
    if (G > E)
        G = E;
    L->G = G;
    for (int k = 0; k < copies; k++) {
        L->cp[k].gate = xalloc(L->mat_gu * (size_t)E);
        L->cp[k].up = xalloc(L->mat_gu * (size_t)E);
        L->cp[k].down = xalloc(L->mat_d * (size_t)E);
    }
    float *fg = xalloc(sizeof(float) * (size_t)(H * I)); /* [I][H] */
    float *fu = xalloc(sizeof(float) * (size_t)(H * I)); /* [I][H] */
    float *fd = xalloc(sizeof(float) * (size_t)(H * I)); /* [H][I] */
    for (int64_t g = 0; g < G; g++) {
        gen_expert_f32(c, g, fg, fu, fd);
        char *dg = (char *)L->cp[0].gate + (size_t)g * L->mat_gu;
        char *du = (char *)L->cp[0].up + (size_t)g * L->mat_gu;
        char *dd = (char *)L->cp[0].down + (size_t)g * L->mat_d;
        ggml_quantize_chunk(c->type, fg, dg, 0, I, H, NULL);
        ggml_quantize_chunk(c->type, fu, du, 0, I, H, NULL);
        ggml_quantize_chunk(c->type, fd, dd, 0, H, I, NULL);
    }
    for (int64_t e = G; e < E; e++) {
        int64_t g = e % G;
        memcpy((char *)L->cp[0].gate + (size_t)e * L->mat_gu,
               (char *)L->cp[0].gate + (size_t)g * L->mat_gu, L->mat_gu);
        memcpy((char *)L->cp[0].up + (size_t)e * L->mat_gu,
               (char *)L->cp[0].up + (size_t)g * L->mat_gu, L->mat_gu);
        memcpy((char *)L->cp[0].down + (size_t)e * L->mat_d,
               (char *)L->cp[0].down + (size_t)g * L->mat_d, L->mat_d);
    }
    for (int k = 1; k < copies; k++) {
        memcpy(L->cp[k].gate, L->cp[0].gate, L->mat_gu * (size_t)E);
        memcpy(L->cp[k].up, L->cp[0].up, L->mat_gu * (size_t)E);
        memcpy(L->cp[k].down, L->cp[0].down, L->mat_d * (size_t)E);
    }
    free(fg);
    free(fu);
    free(fd);
}

/* ggml's CPU_REPACK buffer type (an extra buffer type of the CPU device), or NULL. */
static ggml_backend_buffer_type_t repack_buft(void)
{
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    ggml_backend_dev_get_extra_bufts_t fn = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (!fn)
        return NULL;
    for (ggml_backend_buffer_type_t *b = fn(dev); b && *b; b++)
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0)
            return *b;
    return NULL;
}

/* Move every copy's weights into CPU_REPACK buffers (ggml_backend_tensor_set repacks). */
static int layer_repack(layer *L, int keep_plain0)
{
    const cfg *c = L->c;
    ggml_backend_buffer_type_t buft = repack_buft();
    if (!buft) {
        fprintf(stderr, "ggml_moe: --repack: this ggml has no CPU_REPACK buffer type\n");
        return -1;
    }
    for (int k = 0; k < L->copies; k++) {
        layer_copy *cp = &L->cp[k];
        struct ggml_init_params ip = {ggml_tensor_overhead() * 4, NULL, true};
        cp->rctx = ggml_init(ip);
        cp->rg = ggml_new_tensor_3d(cp->rctx, c->type, c->H, c->I, c->E);
        cp->ru = ggml_new_tensor_3d(cp->rctx, c->type, c->H, c->I, c->E);
        cp->rd = ggml_new_tensor_3d(cp->rctx, c->type, c->I, c->H, c->E);
        cp->rbuf = ggml_backend_alloc_ctx_tensors_from_buft(cp->rctx, buft);
        if (!cp->rbuf || !cp->rg->extra) {
            fprintf(stderr, "ggml_moe: --repack: CPU_REPACK has no layout for %s [%lld, %lld, "
                            "%lld] on this CPU\n", ggml_type_name(c->type), (long long)c->H,
                    (long long)c->I, (long long)c->E);
            return -1;
        }
        ggml_backend_tensor_set(cp->rg, cp->gate, 0, ggml_nbytes(cp->rg));
        ggml_backend_tensor_set(cp->ru, cp->up, 0, ggml_nbytes(cp->ru));
        ggml_backend_tensor_set(cp->rd, cp->down, 0, ggml_nbytes(cp->rd));
        if (!(keep_plain0 && k == 0)) {
            free(cp->gate);
            free(cp->up);
            free(cp->down);
            cp->gate = cp->up = cp->down = NULL;
        }
    }
    return 0;
}

static void layer_free(layer *L)
{
    for (int k = 0; k < L->copies; k++) {
        if (L->cp[k].rbuf)
            ggml_backend_buffer_free(L->cp[k].rbuf);
        if (L->cp[k].rctx)
            ggml_free(L->cp[k].rctx);
        free(L->cp[k].gate);
        free(L->cp[k].up);
        free(L->cp[k].down);
    }
    free(L->cp);
}

/* ---- the graph ----------------------------------------------------------------------- */

typedef struct moe_graph {
    struct ggml_context *meta; /* weight tensors, no data of their own */
    struct ggml_context *ctx;  /* inputs, intermediates, graph */
    struct ggml_tensor *wg, *wu, *wd; /* [H, I, E], [H, I, E], [I, H, E] */
    struct ggml_tensor *x;     /* [H, 1, T] f32 */
    struct ggml_tensor *ids;   /* [K, T] i32 */
    struct ggml_tensor *w;     /* [1, K, T] f32 */
    struct ggml_tensor *out;   /* [H, T] f32 */
    struct ggml_cgraph *gf;
    struct ggml_cplan plan;
    uint8_t *work;
} moe_graph;

static void graph_set_copy(moe_graph *g, const layer_copy *cp);

static void graph_build(moe_graph *g, const cfg *c, int64_t T, struct ggml_threadpool *tp,
                        const layer_copy *cp0)
{
    const int64_t H = c->H, I = c->I, E = c->E, K = c->K;
    memset(g, 0, sizeof *g);
    struct ggml_init_params mp = {ggml_tensor_overhead() * 8, NULL, true};
    g->meta = ggml_init(mp);
    g->wg = ggml_new_tensor_3d(g->meta, c->type, H, I, E);
    g->wu = ggml_new_tensor_3d(g->meta, c->type, H, I, E);
    g->wd = ggml_new_tensor_3d(g->meta, c->type, I, H, E);

    /* intermediates: gate, up, act [I, K, T]; experts, weighted [H, K, T]; K-1 sums [H, T];
     * inputs; plus per-tensor overhead and the graph */
    size_t data = sizeof(float) * (size_t)T *
                  ((size_t)(3 * I * K) + (size_t)(2 * H * K) + (size_t)(H * K) + (size_t)H +
                   (size_t)(2 * K));
    size_t nt = (size_t)(16 + 2 * K);
    struct ggml_init_params cp = {data + nt * (ggml_tensor_overhead() + 64) +
                                      ggml_graph_overhead() + (1u << 20),
                                  NULL, false};
    g->ctx = ggml_init(cp);
    struct ggml_context *ctx = g->ctx;
    g->x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, H, 1, T);
    g->ids = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, K, T);
    g->w = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, K, T);
    ggml_set_input(g->x);
    ggml_set_input(g->ids);
    ggml_set_input(g->w);

    struct ggml_tensor *gate = ggml_mul_mat_id(ctx, g->wg, g->x, g->ids); /* [I, K, T] */
    struct ggml_tensor *up = ggml_mul_mat_id(ctx, g->wu, g->x, g->ids);   /* [I, K, T] */
    struct ggml_tensor *act = ggml_swiglu_split(ctx, gate, up);           /* [I, K, T] */
    struct ggml_tensor *ex = ggml_mul_mat_id(ctx, g->wd, act, g->ids);    /* [H, K, T] */
    ex = ggml_mul(ctx, ex, g->w);                                         /* [H, K, T] */
    struct ggml_tensor *out = ggml_view_2d(ctx, ex, H, T, ex->nb[2], 0);  /* [H, T] */
    for (int64_t k = 1; k < K; k++)
        out = ggml_add(ctx, out, ggml_view_2d(ctx, ex, H, T, ex->nb[2], (size_t)k * ex->nb[1]));
    if (K == 1)
        out = ggml_cont(ctx, out);
    ggml_set_output(out);
    g->out = out;
    g->gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(g->gf, out);
    if (cp0)
        graph_set_copy(g, cp0); /* the plan's work size depends on the weights' layout */
    g->plan = ggml_graph_plan(g->gf, c->threads, tp);
    g->work = g->plan.work_size ? xalloc(g->plan.work_size) : NULL;
    g->plan.work_data = g->work;
}

/* Point the graph's weight tensors at copy cp: its plain bytes, or (--repack) its
 * CPU_REPACK tensors' data, buffer and layout (extra), which ggml-cpu dispatches on. */
static void graph_set_copy(moe_graph *g, const layer_copy *cp)
{
    if (cp->rbuf) {
        struct ggml_tensor *src[3] = {cp->rg, cp->ru, cp->rd}, *dst[3] = {g->wg, g->wu, g->wd};
        for (int m = 0; m < 3; m++) {
            dst[m]->data = src[m]->data;
            dst[m]->buffer = src[m]->buffer;
            dst[m]->extra = src[m]->extra;
        }
        return;
    }
    g->wg->data = cp->gate;
    g->wu->data = cp->up;
    g->wd->data = cp->down;
}

static void graph_free(moe_graph *g)
{
    free(g->work);
    ggml_free(g->ctx);
    ggml_free(g->meta);
}

/* ---- routing and inputs ---------------------------------------------------------------- */

/* libmoe's walk: forward r, token t, slot j -> (walk0 + r*T*K + t*K + j) mod E */
static void walk_ids(int32_t *ids, int64_t walk0, int64_t r, int64_t T, int64_t K, int64_t E)
{
    int64_t base = (walk0 + (r % E) * ((T * K) % E)) % E;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < K; j++)
            ids[t * K + j] = (int32_t)((base + t * K + j) % E);
}

/* routing weights of ring slot q: positive, summing to 1 per token ([T, K]) */
static void gen_weights(float *w, uint64_t seed, int64_t q, int64_t T, int64_t K)
{
    for (int64_t t = 0; t < T; t++) {
        double s = 0;
        for (int64_t j = 0; j < K; j++) {
            w[t * K + j] = 0.5f + 0.5f * (1.0f + uniform_pm1(seed ^ 0x77ull, (uint64_t)((q * T + t) * K + j)));
            s += w[t * K + j];
        }
        for (int64_t j = 0; j < K; j++)
            w[t * K + j] = (float)(w[t * K + j] / s);
    }
}

static void gen_x(float *x, uint64_t seed, int64_t q, int64_t T, int64_t H)
{
    for (int64_t n = 0; n < T * H; n++)
        x[n] = uniform_pm1(seed ^ 0x1A2B3C4D5E6F7788ull, (uint64_t)(q * T * H + n));
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

static int64_t pass_forwards(int64_t E, int64_t T, int64_t K)
{
    return (T >= E || T * K >= E) ? 1 : E / (T * K);
}

/* ---- the benchmark ------------------------------------------------------------------- */

typedef struct runner {
    const cfg *c;
    layer *L;
    struct ggml_threadpool *tp;
    int64_t walk_next;
    int copy_next;
} runner;

static void run_row(runner *R, int64_t T)
{
    const cfg *c = R->c;
    const int64_t H = c->H, E = c->E, K = c->K, I = c->I;
    moe_graph g;
    graph_build(&g, c, T, R->tp, &R->L->cp[0]);

    int64_t step = (T * K) % E;
    int64_t ring = step == 0 ? 1 : E / gcd64(E, step);
    int64_t fit = (int64_t)(RING_CAP_BYTES / ((uint64_t)T * (uint64_t)H * sizeof(float)));
    if (fit < 1)
        fit = 1;
    if (ring > fit)
        ring = fit;
    float *xr = xalloc(sizeof(float) * (size_t)(ring * T * H)); /* [ring][T][H] */
    float *wr = xalloc(sizeof(float) * (size_t)(ring * T * K)); /* [ring][T][K] */
    for (int64_t q = 0; q < ring; q++) {
        gen_x(xr + q * T * H, c->seed, q, T, H);
        gen_weights(wr + q * T * K, c->seed, q, T, K);
    }
    int32_t *ids = xalloc(sizeof(int32_t) * (size_t)(T * K));
    unsigned char *seen = calloc((size_t)E, 1);
    double *times = malloc(sizeof(double) * (size_t)c->max_iters);
    const int64_t walk0 = R->walk_next;
    const int64_t mpass = pass_forwards(E, T, K);
    int n_timed = 0, c_last = 0;
    double distinct_sum = 0;
    for (int r = 0; n_timed == 0 || r <= n_timed; r++) {
        int64_t q = r % ring;
        int cpi = (int)((R->copy_next + r / mpass) % R->L->copies);
        c_last = cpi;
        walk_ids(ids, walk0, r, T, K, E);
        memcpy(g.x->data, xr + q * T * H, sizeof(float) * (size_t)(T * H));
        memcpy(g.w->data, wr + q * T * K, sizeof(float) * (size_t)(T * K));
        memcpy(g.ids->data, ids, sizeof(int32_t) * (size_t)(T * K));
        graph_set_copy(&g, &R->L->cp[cpi]);
        double t0 = now_s();
        enum ggml_status st = ggml_graph_compute(g.gf, &g.plan);
        double dt = now_s() - t0;
        if (st != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "ggml_moe: ggml_graph_compute failed (status %d)\n", (int)st);
            exit(1);
        }
        memset(seen, 0, (size_t)E);
        int64_t distinct = 0;
        for (int64_t n = 0; n < T * K; n++)
            if (!seen[ids[n]]) {
                seen[ids[n]] = 1;
                distinct++;
            }
        if (r == 0) {
            double n = dt > 0 ? ceil(c->min_time / dt) : c->max_iters;
            n_timed = n < c->min_iters ? c->min_iters : n > c->max_iters ? c->max_iters : (int)n;
        } else {
            times[r - 1] = dt;
            distinct_sum += (double)distinct;
        }
    }
    R->copy_next = (c_last + 1) % R->L->copies;
    R->walk_next = (walk0 + ((int64_t)(n_timed + 1) % E) * step) % E;

    double mean = 0;
    for (int i = 0; i < n_timed; i++)
        mean += times[i];
    mean /= n_timed;
    qsort(times, (size_t)n_timed, sizeof(double), cmp_double);
    double med = (n_timed % 2) ? times[n_timed / 2]
                               : 0.5 * (times[n_timed / 2 - 1] + times[n_timed / 2]);
    double flops = 2.0 * (double)T * (double)K * 3.0 * (double)H * (double)I;
    double dexp = distinct_sum / n_timed;
    double bytes = dexp * R->L->expert_bytes;
    printf("{\"tool\": \"ggml_moe\", \"ggml_version\": \"%s\", \"ggml_commit\": \"%s\", "
           "\"dtype\": \"%s\", \"T\": %lld, \"threads\": %d, \"H\": %lld, \"I\": %lld, "
           "\"E\": %lld, \"K\": %lld, \"runs\": %d, \"median_ms\": %.4f, \"best_ms\": %.4f, "
           "\"mean_ms\": %.4f, \"gflops\": %.3f, \"gbps\": %.3f, \"flops_per_forward\": %.0f, "
           "\"distinct_experts\": %.2f, \"bytes_per_forward\": %.0f, \"copies\": %d, "
           "\"copies_wanted\": %d, \"layer_bytes\": %.0f, \"llc_bytes\": %llu, "
           "\"input_ring\": %lld, \"work_bytes\": %zu, \"repack\": %s}\n",
           ggml_version(), ggml_commit(), ggml_type_name(c->type), (long long)T, c->threads,
           (long long)H, (long long)I, (long long)E, (long long)K, n_timed, med * 1e3,
           times[0] * 1e3, mean * 1e3, flops / med * 1e-9, bytes / med * 1e-9, flops, dexp,
           bytes, R->L->copies, R->L->copies_wanted, R->L->expert_bytes * (double)E,
           (unsigned long long)c->llc, (long long)ring, g.plan.work_size,
           c->repack ? "true" : "false");
    fflush(stdout);
    free(times);
    free(seen);
    free(ids);
    free(xr);
    free(wr);
    graph_free(&g);
}

/* ---- --check ------------------------------------------------------------------------- */

/* Row of n elements of type t to f32 (ggml's type traits; F32 has no to_float). */
static void to_f32(enum ggml_type t, const void *src, float *dst, int64_t n)
{
    if (t == GGML_TYPE_F32)
        memcpy(dst, src, sizeof(float) * (size_t)n);
    else
        ggml_get_type_traits(t)->to_float(src, dst, n);
}

/* Round a row of n floats through `t` (quantize or convert, then back to f32): what ggml's
 * CPU kernels see when they convert an f32 operand to their vec_dot_type. */
static void round_through(enum ggml_type t, const float *src, float *dst, int64_t n)
{
    if (t == GGML_TYPE_F32) {
        memcpy(dst, src, sizeof(float) * (size_t)n);
        return;
    }
    void *tmp = xalloc(ggml_row_size(t, n));
    ggml_quantize_chunk(t, src, tmp, 0, 1, n, NULL);
    to_f32(t, tmp, dst, n);
    free(tmp);
}

/* Flip budget of a row of n floats rounded to `t` ([n] into step): ggml computes the
 * SwiGLU activations in float with its own silu, we in double, so the two may lie on either
 * side of a rounding boundary of ggml's vec_dot_type and round one step apart. step_i is one
 * rounding step where rounding v_i - d and v_i + d differs (d = 1e-5 of the row's largest
 * |v|, far above the float-vs-double difference of the activations), else 0. bf16 / f16: the
 * neighbouring representable value; q8_0: one code of the 32-element block, amax / 127;
 * f32: no rounding, 0. */
static void flip_step(enum ggml_type t, const float *v, float *step, int64_t n)
{
    float vmax = 0;
    for (int64_t i = 0; i < n; i++) {
        vmax = fmaxf(vmax, fabsf(v[i]));
        step[i] = 0;
    }
    const float d = 1e-5f * vmax;
    for (int64_t i = 0; i < n && t != GGML_TYPE_Q8_0 && t != GGML_TYPE_F32; i++) {
        float lo, hi;
        if (t == GGML_TYPE_BF16) {
            lo = ggml_bf16_to_fp32(ggml_fp32_to_bf16(v[i] - d));
            hi = ggml_bf16_to_fp32(ggml_fp32_to_bf16(v[i] + d));
        } else {
            lo = ggml_fp16_to_fp32(ggml_fp32_to_fp16(v[i] - d));
            hi = ggml_fp16_to_fp32(ggml_fp32_to_fp16(v[i] + d));
        }
        if (lo != hi)
            step[i] = hi - lo;
    }
    if (t == GGML_TYPE_Q8_0)
        for (int64_t b = 0; b < n; b += 32) {
            float amax = 0;
            for (int64_t i = b; i < b + 32 && i < n; i++)
                amax = fmaxf(amax, fabsf(v[i]));
            const float q = amax / 127.0f; /* one code */
            for (int64_t i = b; i < b + 32 && i < n && q > 0; i++)
                if (roundf((v[i] - d) / q) != roundf((v[i] + d) / q))
                    step[i] = q;
        }
}

/* Reference output for token t ([H] into out): double sums over the dequantized weights.
 * round_act: round the activations as ggml does; swap: use up as gate and gate as up.
 * budget ([H], or NULL): per output, sum over the K experts of w * sum_i |Wd[h, i]| *
 * step_i (flip_step): the most that one-step flips of the rounded SwiGLU activations next to
 * a rounding boundary can change it. */
static void reference_token(const layer *L, const float *x_t, const int32_t *ids_t,
                            const float *w_t, int round_act, int swap, double *out,
                            double *budget)
{
    const cfg *c = L->c;
    const int64_t H = c->H, I = c->I, K = c->K;
    enum ggml_type vt = ggml_get_type_traits_cpu(c->type)->vec_dot_type;
    float *xa = xalloc(sizeof(float) * (size_t)H);
    float *row = xalloc(sizeof(float) * (size_t)(H > I ? H : I));
    float *act = xalloc(sizeof(float) * (size_t)I);
    float *acta = xalloc(sizeof(float) * (size_t)I);
    float *step = xalloc(sizeof(float) * (size_t)I);
    if (round_act)
        round_through(vt, x_t, xa, H);
    else
        memcpy(xa, x_t, sizeof(float) * (size_t)H);
    for (int64_t h = 0; h < H; h++) {
        out[h] = 0;
        if (budget)
            budget[h] = 0;
    }
    for (int64_t j = 0; j < K; j++) {
        int64_t e = ids_t[j];
        const char *gb = (const char *)L->cp[0].gate + (size_t)e * L->mat_gu;
        const char *ub = (const char *)L->cp[0].up + (size_t)e * L->mat_gu;
        const char *db = (const char *)L->cp[0].down + (size_t)e * L->mat_d;
        if (swap) {
            const char *tmp = gb;
            gb = ub;
            ub = tmp;
        }
        for (int64_t i = 0; i < I; i++) {
            double gs = 0, us = 0;
            to_f32(c->type, gb + (size_t)i * L->row_h, row, H);
            for (int64_t k = 0; k < H; k++)
                gs += (double)row[k] * (double)xa[k];
            to_f32(c->type, ub + (size_t)i * L->row_h, row, H);
            for (int64_t k = 0; k < H; k++)
                us += (double)row[k] * (double)xa[k];
            act[i] = (float)(gs / (1.0 + exp(-gs)) * us);
        }
        if (round_act)
            round_through(vt, act, acta, I);
        else
            memcpy(acta, act, sizeof(float) * (size_t)I);
        flip_step(round_act ? vt : GGML_TYPE_F32, act, step, I);
        for (int64_t h = 0; h < H; h++) {
            double s = 0, b = 0;
            to_f32(c->type, db + (size_t)h * L->row_i, row, I);
            for (int64_t i = 0; i < I; i++) {
                s += (double)row[i] * (double)acta[i];
                b += fabs((double)row[i]) * (double)step[i];
            }
            out[h] += (double)w_t[j] * s;
            if (budget)
                budget[h] += (double)w_t[j] * b;
        }
    }
    free(xa);
    free(row);
    free(act);
    free(acta);
    free(step);
}

static int run_check(const cfg *c0, struct ggml_threadpool *tp)
{
    static const enum ggml_type types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                           GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    static const int64_t Ts[] = {1, 5};
    int fails = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        cfg c = *c0;
        c.type = types[ti];
        layer L;
        layer_build(&L, &c, 1);
        c.repack = c0->repack && c.type == GGML_TYPE_Q4_0;
        if (c.repack && layer_repack(&L, 1))
            return 1;
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            const int64_t T = Ts[k], H = c.H, K = c.K, E = c.E;
            moe_graph g;
            graph_build(&g, &c, T, tp, &L.cp[0]);
            float *x = g.x->data;
            float *w = g.w->data;
            int32_t *ids = g.ids->data;
            gen_x(x, c.seed, 3, T, H);
            gen_weights(w, c.seed, 3, T, K);
            /* distinct random experts per token */
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < K; j++) {
                    int32_t e;
                    int dup;
                    uint64_t n = 0;
                    do {
                        e = (int32_t)(splitmix64(c.seed + (uint64_t)(t * K + j) * 1000 + n++) %
                                      (uint64_t)E);
                        dup = 0;
                        for (int64_t i = 0; i < j; i++)
                            dup |= ids[t * K + i] == e;
                    } while (dup);
                    ids[t * K + j] = e;
                }
            if (ggml_graph_compute(g.gf, &g.plan) != GGML_STATUS_SUCCESS) {
                fprintf(stderr, "ggml_moe --check: ggml_graph_compute failed\n");
                return 1;
            }
            double *ref = xalloc(sizeof(double) * (size_t)H);
            double *bud = xalloc(sizeof(double) * (size_t)H);
            double err_r = 0, err_p = 0, err_s = 0, mag = 0, bud_max = 0, excess = 0;
            for (int64_t t = 0; t < T; t++) {
                const float *o = (const float *)((const char *)g.out->data + (size_t)t * g.out->nb[1]);
                reference_token(&L, x + t * H, ids + t * K, w + t * K, 1, 0, ref, bud);
                for (int64_t h = 0; h < H; h++) {
                    mag = fmax(mag, fabs(ref[h]));
                    err_r = fmax(err_r, fabs((double)o[h] - ref[h]));
                    bud_max = fmax(bud_max, bud[h]);
                    /* error beyond this output's flip budget */
                    excess = fmax(excess, fabs((double)o[h] - ref[h]) - bud[h]);
                }
                reference_token(&L, x + t * H, ids + t * K, w + t * K, 0, 0, ref, NULL);
                for (int64_t h = 0; h < H; h++)
                    err_p = fmax(err_p, fabs((double)o[h] - ref[h]));
                reference_token(&L, x + t * H, ids + t * K, w + t * K, 1, 1, ref, NULL);
                for (int64_t h = 0; h < H; h++)
                    err_s = fmax(err_s, fabs((double)o[h] - ref[h]));
            }
            /* Each output may differ from the reference by its flip budget (rounding steps of
             * the SwiGLU activations, see reference_token) plus 1e-4 of the largest output
             * (f32 accumulation over H terms two GEMMs deep against double sums, ggml's SIMD
             * silu). The swapped-gate/up reference must miss by 10x that. */
            const double tol = 1e-4;
            int ok = excess <= tol * mag && err_s > 10.0 * (tol * mag + bud_max);
            fails += !ok;
            printf("{\"check\": \"%s\", \"dtype\": \"%s\", \"T\": %lld, \"H\": %lld, \"I\": %lld, "
                   "\"E\": %lld, \"K\": %lld, \"max_abs_out\": %.4e, "
                   "\"rel_err_vs_ref_rounded_act\": %.3e, \"rel_err_vs_ref_f32_act\": %.3e, "
                   "\"rel_err_vs_ref_gate_up_swapped\": %.3e, \"rel_flip_budget_max\": %.3e, "
                   "\"rel_err_beyond_budget\": %.3e, \"tolerance\": %.0e, "
                   "\"vec_dot_type\": \"%s\", \"repack\": %s}\n",
                   ok ? "pass" : "FAIL", ggml_type_name(c.type), (long long)T, (long long)H,
                   (long long)c.I, (long long)E, (long long)K, mag, err_r / mag, err_p / mag,
                   err_s / mag, bud_max / mag, excess / mag, tol,
                   ggml_type_name(ggml_get_type_traits_cpu(c.type)->vec_dot_type),
                   c.repack ? "true" : "false");
            free(ref);
            free(bud);
            graph_free(&g);
        }
        layer_free(&L);
    }
    return fails ? 1 : 0;
}

/* ---- main ---------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fputs("usage: ggml_moe [options]\n"
          "  --dtype D        bf16 (default), f16, f32, q8_0, q4_0\n"
          "  --tokens LIST    comma-separated T (default 1,8,32,128,512)\n"
          "  --threads N      ggml threads (default 2)\n"
          "  --min-time S     target seconds per row (default 1.5)\n"
          "  --min-iters N    at least N timed forwards (default 5)\n"
          "  --max-iters N    at most N timed forwards (default 100)\n"
          "  --copies N       weight copies to rotate (default: libmoe bench's rule)\n"
          "  --llc BYTES      last-level cache for that rule (default max(sysfs, 260 MiB))\n"
          "  --shape H,I,E,K  layer shape (default 2048,768,128,8; --check: 64,64,16,4)\n"
          "  --seed N         (default 1)\n"
          "  --repack         put the weights in ggml's CPU_REPACK buffer type, as llama.cpp\n"
          "                   does by default (q4_0 on AVX2: q4_0_8x8); --check: q4_0 only\n"
          "  --check          compare ggml's output with a double-precision reference\n",
          f);
}

int main(int argc, char **argv)
{
    cfg c = {2048, 768, 128, 8, {1, 8, 32, 128, 512}, 5, 2, GGML_TYPE_BF16, 1.5, 5, 100, 0, 0, 1, 0, 0};
    int have_shape = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--check")) {
            c.check = 1;
            continue;
        } else if (!strcmp(a, "--repack")) {
            c.repack = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "ggml_moe: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--dtype")) {
            if (parse_type(v, &c.type)) {
                fprintf(stderr, "ggml_moe: --dtype %s: expected bf16, f16, f32, q8_0 or q4_0\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--tokens")) {
            c.ntokens = 0;
            for (const char *p = v; *p;) {
                char *end;
                long long t = strtoll(p, &end, 10);
                if (end == p || t < 1 || c.ntokens == MAX_TOKEN_ROWS ||
                    (*end && *end != ',')) {
                    fprintf(stderr, "ggml_moe: --tokens %s: expected up to %d integers >= 1\n",
                            v, MAX_TOKEN_ROWS);
                    return 2;
                }
                c.tokens[c.ntokens++] = t;
                p = *end ? end + 1 : end;
            }
        } else if (!strcmp(a, "--threads")) {
            c.threads = atoi(v);
        } else if (!strcmp(a, "--min-time")) {
            c.min_time = atof(v);
        } else if (!strcmp(a, "--min-iters")) {
            c.min_iters = atoi(v);
        } else if (!strcmp(a, "--max-iters")) {
            c.max_iters = atoi(v);
        } else if (!strcmp(a, "--copies")) {
            c.copies = atoi(v);
        } else if (!strcmp(a, "--llc")) {
            c.llc = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--seed")) {
            c.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--shape")) {
            long long h, in, e, k;
            if (sscanf(v, "%lld,%lld,%lld,%lld", &h, &in, &e, &k) != 4 || h < 1 || in < 1 ||
                e < 1 || k < 1 || k > e) {
                fprintf(stderr, "ggml_moe: --shape %s: expected H,I,E,K with 1 <= K <= E\n", v);
                return 2;
            }
            c.H = h, c.I = in, c.E = e, c.K = k;
            have_shape = 1;
        } else {
            fprintf(stderr, "ggml_moe: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (c.threads < 1 || c.min_iters < 1 || c.max_iters < c.min_iters || c.copies < 0 ||
        c.copies > MAX_COPIES) {
        fprintf(stderr, "ggml_moe: need --threads >= 1, 1 <= --min-iters <= --max-iters, "
                        "0 <= --copies <= %d\n", MAX_COPIES);
        return 2;
    }
    ggml_cpu_init();
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(c.threads);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
    if (!tp) {
        fprintf(stderr, "ggml_moe: ggml_threadpool_new(%d) failed\n", c.threads);
        return 1;
    }

    if (c.check) {
        if (!have_shape)
            c.H = 64, c.I = 64, c.E = 16, c.K = 4;
        int rc = run_check(&c, tp);
        ggml_threadpool_free(tp);
        return rc;
    }

    const int64_t blck = ggml_blck_size(c.type);
    if (c.H % blck || c.I % blck) {
        fprintf(stderr, "ggml_moe: %s needs H and I multiples of %lld\n", ggml_type_name(c.type),
                (long long)blck);
        return 2;
    }

    /* copies: libmoe bench's rule (tools/bench.c) */
    uint64_t sys = llc_sysfs();
    if (c.llc == 0)
        c.llc = sys > PROJECT_LLC_BYTES ? sys : PROJECT_LLC_BYTES;
    layer L;
    memset(&L, 0, sizeof L);
    double expert_bytes = 2.0 * (double)c.I * (double)ggml_row_size(c.type, c.H) +
                          (double)c.H * (double)ggml_row_size(c.type, c.I);
    double layer_bytes = expert_bytes * (double)c.E;
    double pass_bytes = layer_bytes;
    for (int i = 0; i < c.ntokens; i++) {
        int64_t T = c.tokens[i];
        double pb = (T * c.K >= c.E ? (double)c.E : (double)(pass_forwards(c.E, T, c.K) * T * c.K)) *
                    expert_bytes;
        if (pb < pass_bytes)
            pass_bytes = pb;
    }
    double want = ceil(4.0 * (double)c.llc / pass_bytes) + 1.0;
    int copies_wanted = layer_bytes >= 4.0 * (double)c.llc ? 1
                      : want > MAX_COPIES ? MAX_COPIES : (int)want;
    int copies = c.copies ? c.copies : copies_wanted;
    uint64_t avail = mem_available();
    if (!c.copies && avail > 0) {
        double fit = floor(0.8 * (double)avail / layer_bytes);
        if (fit < 1) {
            fprintf(stderr, "ggml_moe: the layer (%.2f GB) does not fit in 80%% of MemAvailable "
                            "(%.2f GB)\n", layer_bytes * 1e-9, (double)avail * 1e-9);
            return 1;
        }
        if (fit < copies) {
            fprintf(stderr, "ggml_moe: memory: %d copies instead of %d\n", (int)fit, copies);
            copies = (int)fit;
        }
    }
    double t0 = now_s();
    layer_build(&L, &c, copies);
    L.copies_wanted = copies_wanted;
    if (c.repack && layer_repack(&L, 0))
        return 1;
    fprintf(stderr,
            "ggml_moe: ggml %s (%s), %s weights, H %lld I %lld E %lld K %lld, %d threads; "
            "layer %.3f GB x %d cop%s = %.2f GB (%.1f x LLC %.0f MiB, sysfs %.0f MiB); "
            "weights built in %.1f s\n",
            ggml_version(), ggml_commit(), ggml_type_name(c.type), (long long)c.H,
            (long long)c.I, (long long)c.E, (long long)c.K, c.threads, layer_bytes * 1e-9,
            copies, copies == 1 ? "y" : "ies", layer_bytes * copies * 1e-9,
            layer_bytes * copies / (double)c.llc, (double)c.llc / 1048576.0,
            (double)sys / 1048576.0, now_s() - t0);
    runner R = {&c, &L, tp, 0, 0};
    for (int i = 0; i < c.ntokens; i++)
        run_row(&R, c.tokens[i]);
    layer_free(&L);
    ggml_threadpool_free(tp);
    return 0;
}
