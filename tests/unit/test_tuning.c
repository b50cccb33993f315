/* Tuning files (MOE_TUNING_DIR, docs/tuning.md): a hand-written file's values run (the plan
 * text and moe_exec_stats show them), the output bits do not change, explicitly set knobs win,
 * the entry of the nearest token count runs (ties: the smaller), a workspace sized for
 * max_tokens serves every smaller T whatever chunk its entry picks, a malformed file is
 * MOE_EFORMAT naming the file and the field, and no file is an INFO line. */
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

enum { H = 24, I = 20, E = 12, K = 3, IS = 10, TMAX = 64 };

typedef struct layer {
    moe_layer_desc d;
    float router[E * H], sg[H];
    float g[E][I * H], u[E][I * H], dn[E][H * I];
    float shg[IS * H], shu[IS * H], shd[H * IS];
    const void *gp[E], *up[E], *dp[E];
    moe_weight_source src;
    float x[TMAX * H];
} layer;

static layer L;

static int setup(void **state)
{
    if (tu_group_tmp_setup(state) != 0)
        return -1;
    moe_layer_desc_init(&L.d);
    L.d.hidden_size = H;
    L.d.moe_intermediate_size = I;
    L.d.num_experts = E;
    L.d.top_k = K;
    L.d.renormalize = 1;
    L.d.shared_expert_intermediate_size = IS;
    L.d.shared_expert_gated = 1;
    L.d.weight_dtype = MOE_DTYPE_F32;
    tu_fill_uniform(L.router, E * H, 1, -1, 1);
    tu_fill_uniform(L.sg, H, 2, -0.3f, 0.3f);
    tu_fill_uniform(L.shg, IS * H, 3, -0.3f, 0.3f);
    tu_fill_uniform(L.shu, IS * H, 4, -0.3f, 0.3f);
    tu_fill_uniform(L.shd, H * IS, 5, -0.3f, 0.3f);
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(L.g[e], I * H, 10 + (uint64_t)e, -0.3f, 0.3f);
        tu_fill_uniform(L.u[e], I * H, 40 + (uint64_t)e, -0.3f, 0.3f);
        tu_fill_uniform(L.dn[e], H * I, 70 + (uint64_t)e, -0.3f, 0.3f);
        L.gp[e] = L.g[e];
        L.up[e] = L.u[e];
        L.dp[e] = L.dn[e];
    }
    L.src = (moe_weight_source){.router = L.router, .router_dtype = MOE_DTYPE_F32, .gate_proj = L.gp,
                                .up_proj = L.up, .down_proj = L.dp, .shared_gate_proj = L.shg,
                                .shared_up_proj = L.shu, .shared_down_proj = L.shd, .shared_expert_gate = L.sg};
    tu_fill_uniform(L.x, TMAX * H, 99, -1, 1);
    return 0;
}

/* Appends each log line and a newline to the tu_logcap at user. */
static void capture(moe_log_level level, const char *msg, void *user)
{
    (void)level;
    tu_logcap *c = user;
    const size_t used = strlen(c->text);
    snprintf(c->text + used, sizeof c->text - used, "%s\n", msg);
}

/* A one-thread context logging INFO into cap (NULL: dropped). dir: moe_options.tuning_dir
 * (NULL: left unset, so MOE_TUNING_DIR applies); opts: further knobs (NULL: none). */
static moe_ctx *ctx_on(const char *dir, tu_logcap *cap, const moe_options *opts)
{
    static tu_logcap sink;
    moe_options o;
    if (opts)
        o = *opts;
    else
        moe_options_init(&o);
    o.num_threads = 1;
    o.tuning_dir = dir;
    o.log_level = MOE_LOG_INFO;
    o.log_fn = capture;
    o.log_user = cap ? cap : &sink;
    ((tu_logcap *)o.log_user)->text[0] = '\0';
    moe_ctx *ctx = NULL;
    char err[1024] = "";
    moe_status st = moe_ctx_create(&o, &ctx, err, sizeof err);
    if (st != MOE_OK)
        fail_msg("moe_ctx_create: %s", err);
    return ctx;
}

/* Write `body` into dir under the tuning file name of the test layer on a one-thread context;
 * its path into path. */
static void write_tuning(const char *dir, const char *body, char *path, size_t len)
{
    moe_ctx *ctx = ctx_on("", NULL, NULL);
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    char name[1024];
    assert_int_equal(moe_plan_tuning_name(p, name, sizeof name), MOE_OK);
    snprintf(path, len, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, body, strlen(body)), 0);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

/* One forward of T tokens on plan p with weights w, on a workspace sized for ws_tokens. */
static void forward(const moe_plan *p, const moe_weights *w, int64_t T, int64_t ws_tokens, float *out,
                    moe_exec_stats *stats)
{
    const size_t wsz = moe_plan_workspace_size(p, ws_tokens);
    void *ws = malloc(wsz);
    assert_non_null(ws);
    moe_exec_args a = {0};
    a.hidden_states = L.x;
    a.hidden_dtype = MOE_DTYPE_F32;
    a.n_tokens = T;
    a.output = out;
    a.workspace = ws;
    a.workspace_size = wsz;
    a.stats = stats;
    moe_status st = moe_plan_execute_ex(p, w, &a);
    free(ws);
    assert_int_equal(st, MOE_OK);
}

static void test_name(void **state)
{
    (void)state;
    moe_ctx *ctx = ctx_on("", NULL, NULL);
    moe_plan *p = NULL;
    moe_plan_config pc;
    moe_plan_config_init(&pc);
    pc.compute = MOE_COMPUTE_BF16;
    assert_int_equal(moe_plan_create_ex(ctx, &L.d, &pc, &p), MOE_OK);
    char name[1024];
    assert_int_equal(moe_plan_tuning_name(p, name, sizeof name), MOE_OK);
    const char *head = "E=12,N=20,K=24,top_k=3,shared_N=10,format=f32,compute=bf16,device_name=";
    assert_memory_equal(name, head, strlen(head));
    const char *dev = name + strlen(head), *tail = strstr(dev, ",threads=1.json");
    assert_non_null(tail);
    assert_string_equal(tail, ",threads=1.json");
    assert_true(tail > dev);
    for (const char *c = dev; c < tail; c++) /* sanitized: no separators, no spaces */
        assert_true((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
                    *c == '-' || *c == '_');
    assert_true(dev[0] != '_' && tail[-1] != '_');
    char small[16];
    expect_error(ctx, moe_plan_tuning_name(p, small, sizeof small), MOE_ERANGE, "needs");
    assert_string_equal(moe_plan_tuning_file(p), "");
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

/* The file's values run; the bits do not change; the plan text names the file and entries. */
static void test_values_take_effect_same_bits(void **state)
{
    (void)state;
    char dir[512], path[2048];
    tu_tmpdir(dir, sizeof dir, "tuning");
    write_tuning(dir,
                 "{\"1\": {\"chunk_size\": 3, \"permute\": \"packed\", \"topk\": \"rowmax\", \"lowtok_threshold\": 0},\n"
                 " \"64\": {\"chunk_size\": 5, \"permute\": \"sort\", \"lowtok_threshold\": 100},\n"
                 " \"meta\": {\"tool\": \"hand-written\"}}\n",
                 path, sizeof path);
    moe_ctx *c0 = ctx_on("", NULL, NULL);
    moe_ctx *c1 = ctx_on(dir, NULL, NULL);
    moe_plan *p0 = NULL, *p1 = NULL;
    assert_int_equal(moe_plan_create(c0, &L.d, &p0), MOE_OK);
    assert_int_equal(moe_plan_create(c1, &L.d, &p1), MOE_OK);
    assert_string_equal(moe_plan_tuning_file(p1), path);
    /* fields not in an entry take the context's values (onehot_threshold 256, topk sort) */
    char want[2300];
    snprintf(want, sizeof want, "tuning_file=%s;tuned=1:3/packed/256/rowmax/0,64:5/sort/256/sort/100;", path);
    assert_non_null(strstr(moe_plan_text(p1), want));
    assert_null(strstr(moe_plan_text(p0), "tuning_file="));
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p0, &L.src, &w), MOE_OK);

    static float out0[TMAX * H], out1[TMAX * H];
    /* T, the entry it runs, its chunk, permute, topk */
    const struct {
        int64_t T, entry, chunk;
        const char *permute, *topk;
    } cases[] = {{1, 1, 1, "packed", "rowmax"}, {20, 1, 3, "packed", "rowmax"}, {40, 64, 5, "sort", "sort"},
                 {64, 64, 5, "sort", "sort"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int64_t T = cases[i].T;
        moe_exec_stats s0, s1;
        forward(p0, w, T, T, out0, &s0);
        forward(p1, w, T, T, out1, &s1);
        assert_true(tu_same_bits(out0, out1, (size_t)(T * H)));
        assert_int_equal(s0.tuned_tokens, 0);
        assert_int_equal(s0.chunks, 1);
        assert_int_equal(s1.tuned_tokens, cases[i].entry);
        assert_int_equal(s1.chunk_tokens, cases[i].chunk);
        assert_int_equal(s1.chunks, (T + cases[i].chunk - 1) / cases[i].chunk);
        assert_string_equal(s1.permute, cases[i].permute);
        assert_string_equal(s1.topk, cases[i].topk);
        if (cases[i].entry == 1) /* lowtok_threshold 0: no group takes the few-token path */
            assert_int_equal(s1.lowtok_groups, 0);
        else /* 100: every group with rows does (a chunk of 5 tokens has at most 5 rows per expert) */
            assert_int_equal(s1.gemm_groups, 0);
        assert_true(s1.lowtok_groups + s1.gemm_groups > 0);
        moe_plan_path pp; /* the plan path says the same */
        assert_int_equal(moe_plan_path_for(p1, T, &pp), MOE_OK);
        assert_int_equal(pp.tuned_tokens, cases[i].entry);
        assert_int_equal(pp.chunk_tokens, cases[i].chunk);
        assert_string_equal(pp.permute, cases[i].permute);
        assert_string_equal(pp.topk, cases[i].topk);
    }
    moe_weights_free(w);
    moe_plan_free(p0);
    moe_plan_free(p1);
    moe_ctx_free(c0);
    moe_ctx_free(c1);
    tu_rm_tree(dir);
}

/* Nearest token count, ties to the smaller; a workspace for max_tokens serves every smaller T. */
static void test_nearest_and_workspace(void **state)
{
    (void)state;
    char dir[512], path[2048];
    tu_tmpdir(dir, sizeof dir, "tuning");
    write_tuning(dir, "{\"1000\": {\"chunk_size\": 2}, \"4\": {\"chunk_size\": 64}, \"16\": {\"chunk_size\": 7}}", path,
                 sizeof path);
    moe_ctx *ctx = ctx_on(dir, NULL, NULL);
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    /* entries by ascending token count in the text */
    assert_non_null(strstr(moe_plan_text(p), ";tuned=4:64/auto/256/sort/4,16:7/auto/256/sort/4,1000:2/"));
    const struct {
        int64_t T, entry;
    } cases[] = {{1, 4},   {4, 4},   {9, 4},      {10, 4} /* tie 6 / 6 */,
                 {11, 16}, {508, 16} /* tie 492 / 492 */, {509, 1000}, {5000, 1000}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        moe_plan_path pp;
        assert_int_equal(moe_plan_path_for(p, cases[i].T, &pp), MOE_OK);
        assert_int_equal(pp.tuned_tokens, cases[i].entry);
    }
    /* a workspace for 12 tokens: T = 10 runs one chunk of 10 (entry 4, chunk 64) though T = 12
     * runs chunks of 7 */
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_OK);
    static float out[TMAX * H];
    moe_exec_stats s;
    forward(p, w, 10, 12, out, &s);
    assert_int_equal(s.tuned_tokens, 4);
    assert_int_equal(s.chunk_tokens, 10);
    forward(p, w, 12, 12, out, &s);
    assert_int_equal(s.tuned_tokens, 16);
    assert_int_equal(s.chunk_tokens, 7);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
    tu_rm_tree(dir);
}

/* Knobs set explicitly (API or environment) keep their value; the rest come from the file. */
static void test_explicit_knobs_win(void **state)
{
    (void)state;
    char dir[512], path[2048];
    tu_tmpdir(dir, sizeof dir, "tuning");
    write_tuning(dir, "{\"8\": {\"chunk_size\": 3, \"permute\": \"packed\", \"topk\": \"rowmax\"}}", path, sizeof path);
    moe_options o;
    moe_options_init(&o);
    o.permute = "onehot";                                  /* API */
    assert_int_equal(setenv("MOE_CHUNK_SIZE", "5", 1), 0); /* environment */
    tu_logcap cap;
    moe_ctx *ctx = ctx_on(dir, &cap, &o);
    unsetenv("MOE_CHUNK_SIZE");
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    assert_non_null(strstr(moe_plan_text(p), ";tuned=8:5/onehot/256/rowmax/4;"));
    assert_non_null(strstr(cap.text, "knob MOE_PERMUTE is set explicitly and keeps its value"));
    assert_non_null(strstr(cap.text, "knob MOE_CHUNK_SIZE is set explicitly and keeps its value"));
    moe_weights *w = NULL;
    assert_int_equal(moe_weights_create(p, &L.src, &w), MOE_OK);
    static float out[TMAX * H];
    moe_exec_stats s;
    forward(p, w, 8, 8, out, &s);
    assert_int_equal(s.tuned_tokens, 8);
    assert_int_equal(s.chunk_tokens, 5);
    assert_string_equal(s.permute, "onehot");
    assert_string_equal(s.topk, "rowmax"); /* not set explicitly: the file's */
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
    tu_rm_tree(dir);
}

/* Every malformed file: MOE_EFORMAT naming the file and what is wrong; no plan. */
static void test_malformed(void **state)
{
    (void)state;
    const struct {
        const char *body, *what;
    } cases[] = {
        {"{\"1\": {\"chunk_size\": 4}", "not valid JSON"},
        {"[1, 2]", "must be a JSON object, found an array"},
        {"{\"abc\": {}}", "key 'abc' is not a token count"},
        {"{\"0\": {}}", "key '0' is not a token count"},
        {"{\"016\": {}}", "key '016' is not a token count"},
        {"{\"-4\": {}}", "key '-4' is not a token count"},
        {"{\"1\": 5}", "entry \"1\" must be an object of knob values, found an integer"},
        {"{\"1\": {\"chunk\": 4}}", "entry \"1\": unknown field 'chunk'"},
        {"{\"1\": {\"permute\": \"fast\"}}",
         "entry \"1\": field 'permute' must be one of auto, sort, onehot, packed, found 'fast'"},
        {"{\"1\": {\"topk\": 1}}", "field 'topk' must be one of sort, rowmax, found an integer"},
        {"{\"1\": {\"chunk_size\": 0}}", "field 'chunk_size' must be an integer in [1, 2^40], found 0"},
        {"{\"1\": {\"chunk_size\": 9223372036854775807}}",
         "field 'chunk_size' must be an integer in [1, 2^40], found 9223372036854775807"},
        {"{\"1\": {\"onehot_threshold\": 1099511627777}}",
         "field 'onehot_threshold' must be an integer in [0, 2^40], found 1099511627777"},
        {"{\"1\": {\"chunk_size\": \"8\"}}", "field 'chunk_size' must be an integer in [1, 2^40], found a string"},
        {"{\"1\": {\"lowtok_threshold\": -1}}", "field 'lowtok_threshold' must be an integer in [0, 2^40], found -1"},
        {"{\"1\": {\"onehot_threshold\": 2.5}}",
         "field 'onehot_threshold' must be an integer in [0, 2^40], found a real number"},
        {"{\"1\": {}, \"1\": {}}", "not valid JSON"},
        {"{\"meta\": []}", "field 'meta' must be an object, found an array"},
        {"{\"meta\": {}}", "no token-count entries"},
        {"", "not valid JSON"},
    };
    char dir[512], path[2048];
    tu_tmpdir(dir, sizeof dir, "tuning");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_tuning(dir, cases[i].body, path, sizeof path);
        moe_ctx *ctx = ctx_on(dir, NULL, NULL);
        moe_plan *p = (moe_plan *)&p; /* must come back NULL */
        expect_error(ctx, moe_plan_create(ctx, &L.d, &p), MOE_EFORMAT, "tuning file", path, cases[i].what);
        assert_null(p);
        moe_ctx_free(ctx);
    }
    /* a folder in the file's place */
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    moe_ctx *ctx = ctx_on(dir, NULL, NULL);
    moe_plan *p = NULL;
    expect_error(ctx, moe_plan_create(ctx, &L.d, &p), MOE_EFORMAT, path, "not a regular file");
    moe_ctx_free(ctx);
    /* a dangling symlink in the file's place: a file was put there, so not "no tuning file" */
    assert_int_equal(rmdir(path), 0);
    char target[2100];
    snprintf(target, sizeof target, "%s/gone.json", dir);
    assert_int_equal(symlink(target, path), 0);
    ctx = ctx_on(dir, NULL, NULL);
    p = (moe_plan *)&p;
    expect_error(ctx, moe_plan_create(ctx, &L.d, &p), MOE_EFORMAT, path, "is a dangling symlink to", target,
                 "which does not exist");
    assert_null(p);
    moe_ctx_free(ctx);
    tu_rm_tree(dir);
}

/* No file for the shape (the folder from MOE_TUNING_DIR): INFO naming it, the context's knobs,
 * "tuning_file=none;" in the text. */
static void test_no_file(void **state)
{
    (void)state;
    char dir[512];
    tu_tmpdir(dir, sizeof dir, "tuning");
    assert_int_equal(setenv("MOE_TUNING_DIR", dir, 1), 0);
    tu_logcap cap;
    moe_ctx *ctx = ctx_on(NULL, &cap, NULL);
    unsetenv("MOE_TUNING_DIR");
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    char name[1024];
    assert_int_equal(moe_plan_tuning_name(p, name, sizeof name), MOE_OK);
    assert_non_null(strstr(cap.text, "no tuning file"));
    assert_non_null(strstr(cap.text, name));
    assert_non_null(strstr(moe_plan_text(p), "tuning_file=none;"));
    assert_null(strstr(moe_plan_text(p), "tuned="));
    assert_string_equal(moe_plan_tuning_file(p), "");
    moe_plan_path pp;
    assert_int_equal(moe_plan_path_for(p, 16, &pp), MOE_OK);
    assert_int_equal(pp.tuned_tokens, 0);
    moe_plan_free(p);
    moe_ctx_free(ctx);
    tu_rm_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name),
        cmocka_unit_test(test_values_take_effect_same_bits),
        cmocka_unit_test(test_nearest_and_workspace),
        cmocka_unit_test(test_explicit_knobs_win),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_no_file),
    };
    return cmocka_run_group_tests_name("tuning", tests, setup, tu_group_tmp_teardown);
}
