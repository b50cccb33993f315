/* Expert load under MPI (moe_parallel.h moe_plan_gather_load), run under mpirun:
 *
 *   mpirun -np N test_load
 *
 * 1. EP = N: known per-rank counts (rank r: (r + 1) * 1000 + e) sum to the sum of every
 *    rank's counts, on every rank, also in place; real executes (each rank its own tokens,
 *    a different count per rank, one rank with none) count the topk_ids each rank returned,
 *    and the gathered load equals those counts summed by the test's own MPI_Allreduce.
 * 2. N = 4: TP 2 x EP 2: the ranks of a TP group share their tokens, so the gathered load
 *    counts each token once: the sum over the EP group (the ranks with the same tp_rank)
 *    only, checked with known counts and with executes.
 * Exit 0 on success; a failure prints "[rank r] FAIL ..." and calls MPI_Abort. */
#include <mpi.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

static int R, N;

#define CHECK(c, ...)                                                                                   \
    do {                                                                                                \
        if (!(c)) {                                                                                     \
            fprintf(stderr, "[rank %d] FAIL %s:%d: ", R, __FILE__, __LINE__);                           \
            fprintf(stderr, __VA_ARGS__);                                                               \
            fputc('\n', stderr);                                                                        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                               \
        }                                                                                               \
    } while (0)
#define OKC(ctx, call)                                                                                  \
    do {                                                                                                \
        moe_status s_ = (call);                                                                         \
        CHECK(s_ == MOE_OK, "%s -> %s: %s", #call, moe_status_name(s_), moe_ctx_last_error(ctx));       \
    } while (0)

enum { H = 16, I = 12, E = 12, K = 2, TMAX = 41 };

static float router[E * H], w1[E][I * H], w3[E][I * H], w2[E][H * I];

/* One case: ep x tp ranks; returns after checking every rank. */
static void run_case(int ep, int tp)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 1;
    o.chunk_size = 16; /* several chunks */
    moe_ctx *ctx = NULL;
    char err[512];
    CHECK(moe_ctx_create(&o, &ctx, err, sizeof err) == MOE_OK, "moe_ctx_create: %s", err);
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = H;
    d.moe_intermediate_size = I;
    d.num_experts = E;
    d.top_k = K;
    d.renormalize = 1;
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.parallel.ep_size = ep;
    cfg.parallel.tp_size = tp;
    cfg.parallel.ep_rank = -1;
    cfg.parallel.tp_rank = -1;
    cfg.parallel.timeout_s = 60;
    moe_plan *p = NULL;
    OKC(ctx, moe_plan_create_ex(ctx, &d, &cfg, &p));
    const moe_parallel_config *par = moe_plan_parallel(p);
    const int er = par->ep_rank;

    /* known counts: rank (er, tr) gives (er + 1) * 1000 + e; the EP group sums over er only */
    int64_t local[E], total[E];
    for (int e = 0; e < E; e++)
        local[e] = (int64_t)(er + 1) * 1000 + e;
    OKC(ctx, moe_plan_gather_load(p, local, total));
    for (int e = 0; e < E; e++) {
        int64_t want = 0;
        for (int r = 0; r < ep; r++)
            want += (int64_t)(r + 1) * 1000 + e;
        CHECK(total[e] == want, "ep %d tp %d: total[%d] = %lld, want %lld", ep, tp, e, (long long)total[e],
              (long long)want);
    }
    OKC(ctx, moe_plan_gather_load(p, local, local)); /* in place */
    CHECK(!memcmp(local, total, sizeof total), "ep %d tp %d: in-place gather differs", ep, tp);

    /* executes: every rank of EP group member er routes T(er) tokens of its own */
    const void *g[E], *u[E], *dn[E];
    for (int e = 0; e < E; e++) {
        g[e] = w1[e];
        u[e] = w3[e];
        dn[e] = w2[e];
    }
    moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = g, .up_proj = u,
                             .down_proj = dn};
    moe_weights *w = NULL;
    OKC(ctx, moe_weights_create(p, &src, &w));
    const int64_t T = er == 1 ? 0 : 17 + 7 * er; /* ep rank 1 has no tokens */
    static float x[TMAX * H], out[TMAX * H];
    static int32_t ids[TMAX * K];
    tu_fill_uniform(x, TMAX * H, 100 + (uint64_t)er, -1, 1); /* the TP group shares its tokens */
    const size_t wsn = moe_plan_workspace_size(p, TMAX);
    void *ws = aligned_alloc(64, (wsn + 63) / 64 * 64);
    CHECK(ws, "out of memory");
    int64_t load[E], count[E] = {0};
    memset(load, 0, sizeof load);
    for (int rep = 0; rep < 2; rep++) {
        moe_exec_args a = {0};
        a.hidden_states = T ? x : NULL;
        a.hidden_dtype = MOE_DTYPE_F32;
        a.n_tokens = T;
        a.output = T ? out : NULL;
        a.workspace = ws;
        a.workspace_size = wsn;
        a.topk_ids = T ? ids : NULL;
        a.expert_load = load;
        OKC(ctx, moe_plan_execute_ex(p, w, &a));
        for (int64_t i = 0; i < T * K; i++)
            count[ids[i]]++;
    }
    for (int e = 0; e < E; e++)
        CHECK(load[e] == count[e], "ep %d tp %d: load[%d] = %lld, the topk_ids count %lld", ep, tp, e,
              (long long)load[e], (long long)count[e]);
    OKC(ctx, moe_plan_gather_load(p, load, total));
    /* the independent sum: over the world, divided by tp (every TP rank counted its group's tokens) */
    int64_t world[E];
    MPI_Allreduce(count, world, E, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t sum = 0, want_sum = 0;
    for (int e = 0; e < E; e++) {
        CHECK(world[e] % tp == 0, "world count not a multiple of tp");
        CHECK(total[e] == world[e] / tp, "ep %d tp %d: gathered load[%d] = %lld, want %lld", ep, tp, e,
              (long long)total[e], (long long)(world[e] / tp));
        sum += total[e];
    }
    for (int r = 0; r < ep; r++)
        want_sum += 2 * (r == 1 ? 0 : 17 + 7 * r) * K;
    CHECK(sum == want_sum, "ep %d tp %d: %lld rows gathered, the ranks routed %lld", ep, tp, (long long)sum,
          (long long)want_sum);
    if (R == 0)
        printf("test_load: ep %d x tp %d: %lld rows gathered, every token once\n", ep, tp, (long long)sum);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    int prov = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &prov);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    tu_fill_uniform(router, E * H, 1, -1, 1);
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(w1[e], I * H, 10 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(w3[e], I * H, 20 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(w2[e], H * I, 30 + (uint64_t)e, -0.5f, 0.5f);
    }
    run_case(N, 1);
    if (N == 4)
        run_case(2, 2);
    MPI_Finalize();
    return 0;
}
