/* moe.h: moe_plan_execute is thread-safe on one plan and weights, and the last error is per
 * thread (moe_ctx_last_error returns the calling thread's last failure on that ctx). Four
 * pthreads share one ctx, one plan and one weights; each, many times over, runs failing
 * executes and plan creations with inputs no other thread uses, and succeeding executes,
 * and checks that it reads back exactly its own message (computed first by the same failing
 * call on the main thread) and the serial output bits. Before the fix every thread wrote the
 * ctx's one buffer: a thread read another's message (and ThreadSanitizer, make test-tsan,
 * reported the race). The ctx has one OpenMP thread, so each execute runs on its caller's
 * pthread and no libgomp team (not TSan-instrumented) is involved. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

enum { H = 16, I = 8, E = 4, K = 2, T = 3, NTHREADS = 4, ROUNDS = 400 };

typedef struct layer {
    moe_ctx *ctx;
    moe_layer_desc d;
    moe_plan *plan;
    moe_weights *w;
    float router[E * H], w1[E][I * H], w3[E][I * H], w2[E][H * I]; /* [E,H], [I,H], [I,H], [H,I] */
    float x[T * H];      /* [T, H] */
    float want[T * H];   /* serial output */
} layer;

static layer L;
/* Each thread's too-small workspace, the same during the serial pass and the threaded one: the
 * MOE_EWORKSPACE message gives its address. */
static char small_ws[NTHREADS][64];

/* What thread `tid` does wrong, and the message each gives (filled serially). */
typedef struct job {
    int tid;
    moe_dtype bad_dtype;  /* an hidden_states dtype execute refuses */
    int64_t bad_tokens;   /* negative n_tokens */
    int64_t bad_top_k;    /* > num_experts */
    char msg_dtype[1024], msg_tokens[1024], msg_top_k[1024], msg_ws[1024];
    int failures;         /* rounds in which the thread read a message other than its own */
    char first_wrong[1024];
} job;

static moe_status exec(const void *x, moe_dtype dt, int64_t n, float *out, void *ws, size_t wsn)
{
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = dt, .n_tokens = n, .output = out,
                       .workspace = ws, .workspace_size = wsn};
    return moe_plan_execute_ex(L.plan, L.w, &a);
}

static moe_status bad_plan(int64_t top_k)
{
    moe_layer_desc d = L.d;
    d.top_k = top_k;
    moe_plan *p = NULL;
    moe_status st = moe_plan_create(L.ctx, &d, &p);
    moe_plan_free(p);
    return st;
}

/* The four failing calls of job j, each followed by a check of the calling thread's message;
 * small_ws[j->tid] holds fewer bytes than needed. Returns 1 when a status or a message is not j's. */
static int run_failures(const job *j, float *out)
{
    void *ws = small_ws[j->tid];
    int bad = 0;
    bad |= exec(L.x, j->bad_dtype, T, out, ws, 8) != MOE_EDTYPE;
    bad |= strcmp(moe_ctx_last_error(L.ctx), j->msg_dtype) != 0;
    bad |= exec(L.x, MOE_DTYPE_F32, j->bad_tokens, out, ws, 8) != MOE_EINVAL;
    bad |= strcmp(moe_ctx_last_error(L.ctx), j->msg_tokens) != 0;
    bad |= bad_plan(j->bad_top_k) != MOE_EINVAL;
    bad |= strcmp(moe_ctx_last_error(L.ctx), j->msg_top_k) != 0;
    /* the workspace is 8 + tid bytes: the message gives that size */
    bad |= exec(L.x, MOE_DTYPE_F32, T, out, ws, (size_t)(8 + j->tid)) != MOE_EWORKSPACE;
    bad |= strcmp(moe_ctx_last_error(L.ctx), j->msg_ws) != 0;
    return bad;
}

static void *worker(void *arg)
{
    job *j = arg;
    float out[T * H];
    size_t wsn = moe_plan_workspace_size(L.plan, T);
    void *ws = aligned_alloc(64, (wsn + 63) / 64 * 64);
    /* a thread that has not failed yet reads "" */
    if (moe_ctx_last_error(L.ctx)[0] != '\0') {
        j->failures++;
        snprintf(j->first_wrong, sizeof j->first_wrong, "fresh thread read \"%s\"", moe_ctx_last_error(L.ctx));
    }
    for (int r = 0; r < ROUNDS; r++) {
        int bad = run_failures(j, out);
        /* a success leaves the thread's last error as it was, and gives the serial bits */
        memset(out, 0, sizeof out);
        if (exec(L.x, MOE_DTYPE_F32, T, out, ws, wsn) != MOE_OK || !tu_same_bits(out, L.want, T * H) ||
            strcmp(moe_ctx_last_error(L.ctx), j->msg_ws) != 0)
            bad = 1;
        if (bad && !j->failures++)
            snprintf(j->first_wrong, sizeof j->first_wrong, "round %d read \"%s\"", r, moe_ctx_last_error(L.ctx));
    }
    free(ws);
    return NULL;
}

static void layer_setup(void)
{
    L.ctx = tu_ctx(); /* one OpenMP thread */
    moe_layer_desc_init(&L.d);
    L.d.hidden_size = H;
    L.d.moe_intermediate_size = I;
    L.d.num_experts = E;
    L.d.top_k = K;
    L.d.renormalize = 1;
    assert_int_equal(moe_plan_create(L.ctx, &L.d, &L.plan), MOE_OK);
    tu_fill_uniform(L.router, E * H, 1, -1, 1);
    const void *g[E], *u[E], *dn[E];
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(L.w1[e], I * H, 10 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(L.w3[e], I * H, 20 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(L.w2[e], H * I, 30 + (uint64_t)e, -0.5f, 0.5f);
        g[e] = L.w1[e];
        u[e] = L.w3[e];
        dn[e] = L.w2[e];
    }
    moe_weight_source src = {.router = L.router, .router_dtype = MOE_DTYPE_F32, .gate_proj = g, .up_proj = u,
                             .down_proj = dn};
    assert_int_equal(moe_weights_create(L.plan, &src, &L.w), MOE_OK);
    tu_fill_uniform(L.x, T * H, 2, -1, 1);
    size_t wsn = moe_plan_workspace_size(L.plan, T);
    void *ws = aligned_alloc(64, (wsn + 63) / 64 * 64);
    assert_int_equal(exec(L.x, MOE_DTYPE_F32, T, L.want, ws, wsn), MOE_OK);
    free(ws);
}

static void layer_teardown(void)
{
    moe_weights_free(L.w);
    moe_plan_free(L.plan);
    moe_ctx_free(L.ctx);
}

static void test_last_error_per_thread(void **state)
{
    (void)state;
    layer_setup();
    static const moe_dtype dts[NTHREADS] = {MOE_DTYPE_I32, MOE_DTYPE_I64, MOE_DTYPE_F64, MOE_DTYPE_U8};
    static job jobs[NTHREADS];
    float out[T * H];
    for (int t = 0; t < NTHREADS; t++) {
        job *j = &jobs[t];
        void *ws = small_ws[t];
        memset(j, 0, sizeof *j);
        j->tid = t;
        j->bad_dtype = dts[t];
        j->bad_tokens = -1 - t;
        j->bad_top_k = E + 1 + t;
        /* each message, serially: the same calls one at a time on this thread */
        assert_int_equal(exec(L.x, j->bad_dtype, T, out, ws, 8), MOE_EDTYPE);
        snprintf(j->msg_dtype, sizeof j->msg_dtype, "%s", moe_ctx_last_error(L.ctx));
        assert_int_equal(exec(L.x, MOE_DTYPE_F32, j->bad_tokens, out, ws, 8), MOE_EINVAL);
        snprintf(j->msg_tokens, sizeof j->msg_tokens, "%s", moe_ctx_last_error(L.ctx));
        assert_int_equal(bad_plan(j->bad_top_k), MOE_EINVAL);
        snprintf(j->msg_top_k, sizeof j->msg_top_k, "%s", moe_ctx_last_error(L.ctx));
        assert_int_equal(exec(L.x, MOE_DTYPE_F32, T, out, ws, (size_t)(8 + t)), MOE_EWORKSPACE);
        snprintf(j->msg_ws, sizeof j->msg_ws, "%s", moe_ctx_last_error(L.ctx));
    }
    /* the messages are distinct, so reading another thread's is caught */
    for (int a = 0; a < NTHREADS; a++)
        for (int b = a + 1; b < NTHREADS; b++) {
            assert_string_not_equal(jobs[a].msg_dtype, jobs[b].msg_dtype);
            assert_string_not_equal(jobs[a].msg_tokens, jobs[b].msg_tokens);
            assert_string_not_equal(jobs[a].msg_top_k, jobs[b].msg_top_k);
            assert_string_not_equal(jobs[a].msg_ws, jobs[b].msg_ws);
        }
    pthread_t th[NTHREADS];
    for (int t = 0; t < NTHREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, worker, &jobs[t]), 0);
    for (int t = 0; t < NTHREADS; t++)
        assert_int_equal(pthread_join(th[t], NULL), 0);
    int failed = 0;
    for (int t = 0; t < NTHREADS; t++)
        if (jobs[t].failures) {
            print_error("thread %d: %d of %d rounds read a message not its own; first: %s\n", t, jobs[t].failures,
                        ROUNDS, jobs[t].first_wrong);
            failed = 1;
        }
    /* the main thread's own last error is untouched by the workers' */
    assert_string_equal(moe_ctx_last_error(L.ctx), jobs[NTHREADS - 1].msg_ws);
    layer_teardown();
    assert_int_equal(failed, 0);
}

/* A ctx created after another is freed (often at the same address) has no last error: the
 * message kept for the freed one is not returned for it. */
static void test_new_ctx_no_stale_error(void **state)
{
    (void)state;
    for (int round = 0; round < 4; round++) {
        moe_ctx *a = tu_ctx();
        assert_string_equal(moe_ctx_last_error(a), "");
        moe_layer_desc d;
        moe_layer_desc_init(&d);
        moe_plan *p = NULL;
        assert_int_not_equal(moe_plan_create(a, &d, &p), MOE_OK);
        assert_string_not_equal(moe_ctx_last_error(a), "");
        moe_ctx_free(a);
    }
}

/* One thread failing on more contexts than it keeps slots for: the 8 it failed on last keep
 * their own messages, each distinct. */
static void test_many_ctx_one_thread(void **state)
{
    (void)state;
    enum { N = 8 };
    moe_ctx *c[N];
    char want[N][1024];
    for (int i = 0; i < N; i++)
        c[i] = tu_ctx();
    for (int i = 0; i < N; i++) {
        moe_layer_desc d;
        moe_layer_desc_init(&d);
        d.hidden_size = 8;
        d.moe_intermediate_size = 8;
        d.num_experts = 2;
        d.top_k = 3 + i; /* > num_experts, distinct per ctx */
        moe_plan *p = NULL;
        assert_int_equal(moe_plan_create(c[i], &d, &p), MOE_EINVAL);
        snprintf(want[i], sizeof want[i], "%s", moe_ctx_last_error(c[i]));
    }
    for (int i = 0; i < N; i++) {
        char top_k[32];
        snprintf(top_k, sizeof top_k, "top_k = %d ", 3 + i);
        assert_non_null(strstr(moe_ctx_last_error(c[i]), top_k));
        assert_string_equal(moe_ctx_last_error(c[i]), want[i]);
        moe_ctx_free(c[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_error_per_thread),
        cmocka_unit_test(test_new_ctx_no_stale_error),
        cmocka_unit_test(test_many_ctx_one_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
