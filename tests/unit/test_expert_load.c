/* Expert load (moe_exec_args.expert_load, moe_plan_gather_load in one process) and load files
 * (moe_load_read / moe_load_write). The counts are checked against a count of the topk_ids
 * the same executes returned; chunking and threads must not change them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moe.h"
#include "testutil.h"

enum { H = 16, I = 12, E = 10, K = 3, T = 53 };

static float router[E * H], w1[E][I * H], w3[E][I * H], w2[E][H * I];
static float X[2][T * H];
static moe_layer_desc D;

static int setup(void **state)
{
    (void)state;
    moe_layer_desc_init(&D);
    D.hidden_size = H;
    D.moe_intermediate_size = I;
    D.num_experts = E;
    D.top_k = K;
    D.renormalize = 1;
    tu_fill_uniform(router, E * H, 1, -1, 1);
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(w1[e], I * H, 10 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(w3[e], I * H, 20 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(w2[e], H * I, 30 + (uint64_t)e, -0.5f, 0.5f);
    }
    tu_fill_uniform(X[0], T * H, 2, -1, 1);
    tu_fill_uniform(X[1], T * H, 3, -1, 1);
    return 0;
}

static moe_ctx *ctx_with(int threads, int64_t chunk)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = threads;
    o.chunk_size = chunk;
    moe_ctx *ctx = NULL;
    char err[512];
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        fail_msg("moe_ctx_create: %s", err);
    return ctx;
}

/* The test layer's plan and packed weights on ctx. */
static void make_layer(moe_ctx *ctx, moe_plan **p, moe_weights **w)
{
    assert_int_equal(moe_plan_create(ctx, &D, p), MOE_OK);
    const void *g[E], *u[E], *dn[E]; /* E pointers each, [I, H] / [I, H] / [H, I] */
    for (int e = 0; e < E; e++) {
        g[e] = w1[e];
        u[e] = w3[e];
        dn[e] = w2[e];
    }
    moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = g, .up_proj = u,
                             .down_proj = dn};
    assert_int_equal(moe_weights_create(*p, &src, w), MOE_OK);
}

/* Two executes (the second with n_tokens n2) accumulating into load [E]; ids [2][T * K] the
 * topk_ids they returned. */
static void run_two(int threads, int64_t chunk, int64_t n2, int64_t *load, int32_t ids[2][T * K])
{
    moe_ctx *ctx = ctx_with(threads, chunk);
    moe_plan *p = NULL;
    moe_weights *w = NULL;
    make_layer(ctx, &p, &w);
    const size_t wsn = moe_plan_workspace_size(p, T);
    void *ws = aligned_alloc(64, (wsn + 63) / 64 * 64);
    static float out[T * H];
    for (int i = 0; i < 2; i++) {
        moe_exec_args a = {0};
        a.hidden_states = X[i];
        a.hidden_dtype = MOE_DTYPE_F32;
        a.n_tokens = i == 0 ? T : n2;
        a.output = out;
        a.workspace = ws;
        a.workspace_size = wsn;
        a.topk_ids = ids[i];
        a.expert_load = load;
        assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_OK);
    }
    /* an execute that fails leaves the counts untouched */
    int64_t before[E];
    memcpy(before, load, sizeof before);
    moe_exec_args bad = {0};
    bad.hidden_states = X[0];
    bad.hidden_dtype = MOE_DTYPE_F32;
    bad.n_tokens = T;
    bad.output = out;
    bad.workspace = ws;
    bad.workspace_size = 8;
    bad.expert_load = load;
    assert_int_equal(moe_plan_execute_ex(p, w, &bad), MOE_EWORKSPACE);
    assert_memory_equal(load, before, sizeof before);

    /* one process: the gathered load is the local one (also in place) */
    int64_t total[E];
    assert_int_equal(moe_plan_gather_load(p, load, total), MOE_OK);
    assert_memory_equal(total, load, sizeof total);
    assert_int_equal(moe_plan_gather_load(p, total, total), MOE_OK);
    assert_memory_equal(total, load, sizeof total);
    expect_error(ctx, moe_plan_gather_load(p, NULL, total), MOE_EINVAL, "local is NULL");
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

static void test_counts_equal_topk_ids(void **state)
{
    (void)state;
    const int64_t n2 = 31;
    int64_t want[E] = {0}, got[E];
    int32_t ids[2][T * K];
    /* threads 1 / 3, one chunk / chunks of 7 tokens: the same counts */
    const int cfg[][2] = {{1, 1024}, {3, 1024}, {1, 7}, {3, 7}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int e = 0; e < E; e++)
            got[e] = 1000 + e; /* accumulates onto what is there */
        run_two(cfg[c][0], cfg[c][1], n2, got, ids);
        int64_t count[E] = {0}; /* the returned topk_ids counted here */
        for (int64_t i = 0; i < T * K; i++)
            count[ids[0][i]]++;
        for (int64_t i = 0; i < n2 * K; i++)
            count[ids[1][i]]++;
        int64_t sum = 0;
        for (int e = 0; e < E; e++) {
            assert_int_equal(got[e], 1000 + e + count[e]);
            sum += count[e];
        }
        assert_int_equal(sum, (T + n2) * K);
        if (c == 0)
            memcpy(want, got, sizeof want);
        else
            assert_memory_equal(got, want, sizeof want);
    }
}

/* Caller-given routing (in_topk_ids / in_topk_weights) is counted like libmoe's own. */
static void test_given_routing_counted(void **state)
{
    (void)state;
    moe_ctx *ctx = ctx_with(1, 7);
    moe_plan *p = NULL;
    moe_weights *w = NULL;
    make_layer(ctx, &p, &w);
    const size_t wsn = moe_plan_workspace_size(p, T);
    void *ws = aligned_alloc(64, (wsn + 63) / 64 * 64);
    static float out[T * H];
    static int32_t ids[T * K];   /* [T, K] skewed: token t picks (t % 2, 2 + t % 3, 5 + t % 5) */
    static float wts[T * K];     /* [T, K] */
    int64_t count[E] = {0}, load[E] = {0};
    for (int t = 0; t < T; t++) {
        const int32_t row[K] = {t % 2, 2 + t % 3, 5 + t % 5};
        for (int k = 0; k < K; k++) {
            ids[t * K + k] = row[k];
            wts[t * K + k] = 1.0f / K;
            count[row[k]]++;
        }
    }
    moe_exec_args a = {0};
    a.hidden_states = X[0];
    a.hidden_dtype = MOE_DTYPE_F32;
    a.n_tokens = T;
    a.output = out;
    a.workspace = ws;
    a.workspace_size = wsn;
    a.in_topk_ids = ids;
    a.in_topk_weights = wts;
    a.expert_load = load;
    assert_int_equal(moe_plan_execute_ex(p, w, &a), MOE_OK);
    assert_memory_equal(load, count, sizeof count);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

static void test_load_files(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir, "load");
    snprintf(path, sizeof path, "%s/load.json", dir);
    int64_t load[E], back[E];
    for (int e = 0; e < E; e++)
        load[e] = e == 3 ? MOE_LOAD_MAX : (int64_t)e * 1000003; /* the largest count taken, exactly */
    assert_int_equal(moe_load_write(ctx, path, load, E), MOE_OK);
    assert_int_equal(moe_load_read(ctx, path, E, back), MOE_OK);
    assert_memory_equal(back, load, sizeof load);

    /* bad files: each names the entry; the caller's array stays untouched */
    struct {
        const char *text;
        moe_status want;
        const char *sub1, *sub2;
    } bad[] = {
        {"{\"num_logical_experts\": 10, \"load\": [0,1,2,3,4,5,6,7,8]}", MOE_EFORMAT, "has 9 entries",
         "num_experts is 10"},
        {"{\"num_logical_experts\": 10, \"load\": [0,1,2,3,4,5,6,-3,8,9]}", MOE_EFORMAT, "load[7] = -3",
         "counts must be in [0, 2^40]"},
        {"{\"num_logical_experts\": 10, \"load\": [0,1,2,4611686018427387904,4,5,6,7,8,9]}", MOE_EFORMAT,
         "load[3] = 4611686018427387904", "counts must be in [0, 2^40]"}, /* 2^62: sums would overflow */
        {"{\"num_logical_experts\": 10, \"load\": [0,1,2,3,4.5,5,6,7,8,9]}", MOE_EFORMAT, "load[4] must be an integer",
         "a real number"},
        {"{\"num_logical_experts\": 12, \"load\": []}", MOE_EFORMAT, "num_logical_experts = 12",
         "num_experts = 10"},
        {"{\"load\": [0,1,2,3,4,5,6,7,8,9]}", MOE_EFORMAT, "'num_logical_experts' must be an integer", "absent"},
        {"{\"num_logical_experts\": 10, \"load\": \"x\"}", MOE_EFORMAT, "'load' must be an array", "a string"},
        {"[1, 2]", MOE_EFORMAT, "must be a JSON object", "an array"},
        {"{\"num_logical_experts\": 10, \"load\": [0,1,2,3,4,5,6,7,8,9], \"laod\": []}", MOE_EFORMAT,
         "unknown field \"laod\"", "a load file has num_logical_experts, load"},
        {"{\"num_logical_experts\": 10,", MOE_EFORMAT, "not valid JSON", "load.json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(tu_write_file(path, bad[i].text, strlen(bad[i].text)), 0);
        for (int e = 0; e < E; e++)
            back[e] = -7;
        expect_error(ctx, moe_load_read(ctx, path, E, back), bad[i].want, bad[i].sub1, bad[i].sub2);
        for (int e = 0; e < E; e++)
            assert_int_equal(back[e], -7);
    }
    char missing[700];
    snprintf(missing, sizeof missing, "%s/none.json", dir);
    expect_error(ctx, moe_load_read(ctx, missing, E, back), MOE_ENOTFOUND, "none.json");
    expect_error(ctx, moe_load_read(ctx, dir, E, back), MOE_EIO, "directory");
    load[2] = -1;
    expect_error(ctx, moe_load_write(ctx, path, load, E), MOE_EINVAL, "load[2] = -1");
    snprintf(missing, sizeof missing, "%s/no/such/dir/load.json", dir);
    load[2] = 2;
    expect_error(ctx, moe_load_write(ctx, missing, load, E), MOE_EIO, "load.json", "folder does not exist");
    /* a FIFO (or any non-regular file) at the path is refused and stays what it was */
    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_error(ctx, moe_load_write(ctx, fifo, load, E), MOE_EIO, "fifo.json", "a FIFO, not a regular file");
    struct stat sb;
    assert_int_equal(stat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode));
    unlink(fifo);
    expect_error(ctx, moe_load_write(ctx, dir, load, E), MOE_EIO, "a directory, not a regular file");
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_equal_topk_ids),
        cmocka_unit_test(test_given_routing_counted),
        cmocka_unit_test(test_load_files),
    };
    setup(NULL);
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
