/* Knobs you can trust: every knob changes what runs (moe_exec_stats shows it) and leaves the
 * output bits unchanged; bad values are errors naming the variable and what it accepts; an
 * unknown MOE_* variable warns with the closest name; the modular kernel refuses a mismatched
 * pair; the last chunk of a long batch is right. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "ref/ref.h"
#include "testutil.h"

enum { H = 24, I = 20, E = 12, K = 3, IS = 10 };

typedef struct layer {
    moe_layer_desc d;
    float router[E * H], sg[H];
    float g[E][I * H], u[E][I * H], dn[E][H * I];
    float shg[IS * H], shu[IS * H], shd[H * IS];
    const void *gp[E], *up[E], *dp[E];
    moe_weight_source src;
} layer;

static layer L;

static int setup(void **state)
{
    (void)state;
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
    return 0;
}

/* Run T tokens with options `o` and plan config `cfg`; fills out [T,H] and stats. */
static void run(const moe_options *o, const moe_plan_config *cfg, const float *x, int64_t T, float *out,
                moe_exec_stats *st)
{
    moe_ctx *ctx = NULL;
    char err[512];
    if (moe_ctx_create(o, &ctx, err, sizeof err) != MOE_OK)
        fail_msg("ctx: %s", err);
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    if (moe_plan_create_ex(ctx, &L.d, cfg, &plan) != MOE_OK)
        fail_msg("plan: %s", moe_ctx_last_error(ctx));
    assert_int_equal(moe_weights_create(plan, &L.src, &w), MOE_OK);
    size_t wsz = moe_plan_workspace_size(plan, T);
    void *ws = malloc(wsz);
    assert_non_null(ws);
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = T, .output = out,
                       .workspace = ws, .workspace_size = wsz, .stats = st};
    assert_int_equal(moe_plan_execute_ex(plan, w, &a), MOE_OK);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
}

#define T1 97

/* The oracle's output for the shared input. */
static float X[T1 * H], REF[T1 * H];

static int setup_ref(void **state)
{
    setup(state);
    tu_fill_uniform(X, T1 * H, 99, -1, 1);
    return moe_ref_forward(&L.d, &L.src, X, T1, NULL, REF, NULL, NULL) == MOE_OK ? 0 : -1;
}

static void opts1(moe_options *o)
{
    moe_options_init(o);
    o->num_threads = 1;
}

static void test_chunk_size(void **state)
{
    (void)state;
    const int64_t chunks[] = {1, 7, 96, 97, 1024};
    const int64_t want[] = {97, 14, 2, 1, 1};
    for (size_t i = 0; i < 5; i++) {
        moe_options o;
        opts1(&o);
        o.chunk_size = chunks[i];
        float out[T1 * H];
        moe_exec_stats st;
        run(&o, NULL, X, T1, out, &st);
        assert_int_equal(st.chunks, want[i]);
        assert_memory_equal(out, REF, sizeof out);
    }
}

static void test_permute(void **state)
{
    (void)state;
    const char *m[] = {"sort", "onehot", "packed"};
    for (size_t i = 0; i < 3; i++) {
        moe_options o;
        opts1(&o);
        o.permute = m[i];
        float out[T1 * H];
        moe_exec_stats st;
        run(&o, NULL, X, T1, out, &st);
        assert_string_equal(st.permute, m[i]);
        assert_int_equal(st.permute_sort + st.permute_onehot + st.permute_packed, 1);
        assert_memory_equal(out, REF, sizeof out);
    }
    /* auto: onehot at or below the threshold (T*K routed rows), sort above it */
    moe_options o;
    opts1(&o);
    o.onehot_threshold = T1 * K;
    float out[T1 * H];
    moe_exec_stats st;
    run(&o, NULL, X, T1, out, &st);
    assert_string_equal(st.permute, "onehot");
    o.onehot_threshold = T1 * K - 1;
    run(&o, NULL, X, T1, out, &st);
    assert_string_equal(st.permute, "sort");
    assert_memory_equal(out, REF, sizeof out);
}

static void test_topk(void **state)
{
    (void)state;
    const char *m[] = {"sort", "rowmax"};
    for (size_t i = 0; i < 2; i++) {
        moe_options o;
        opts1(&o);
        o.topk = m[i];
        float out[T1 * H];
        moe_exec_stats st;
        run(&o, NULL, X, T1, out, &st);
        assert_string_equal(st.topk, m[i]);
        assert_memory_equal(out, REF, sizeof out);
    }
}

static void test_lowtok(void **state)
{
    (void)state;
    moe_options o;
    opts1(&o);
    float out[T1 * H];
    moe_exec_stats st;
    o.lowtok_threshold = 0; /* never */
    run(&o, NULL, X, T1, out, &st);
    assert_int_equal(st.lowtok_groups, 0);
    assert_true(st.gemm_groups > 0);
    assert_memory_equal(out, REF, sizeof out);
    o.lowtok_threshold = 1000000; /* always */
    run(&o, NULL, X, T1, out, &st);
    assert_int_equal(st.gemm_groups, 0);
    assert_true(st.lowtok_groups > 0);
    assert_memory_equal(out, REF, sizeof out);
    /* a single token routes to K experts with one row each: few-token path by default */
    opts1(&o);
    float one[H];
    run(&o, NULL, X, 1, one, &st);
    assert_int_equal(st.lowtok_groups, K);
    assert_int_equal(st.skipped_groups, E - K);
    assert_memory_equal(one, REF, sizeof one);
}

static void test_isa_and_threads(void **state)
{
    (void)state;
    const char *isas[16]; /* the kernel registry's rows */
    const size_t n_isas = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    for (size_t i = 0; i < n_isas; i++) {
        for (int th = 1; th <= 2; th++) {
            moe_options o;
            moe_options_init(&o);
            o.isa = isas[i];
            o.num_threads = th;
            moe_ctx *probe = NULL;
            char err[256];
            if (moe_ctx_create(&o, &probe, err, sizeof err) != MOE_OK) {
                assert_non_null(strstr(err, "does not support")); /* this CPU lacks it */
                continue;
            }
            moe_ctx_free(probe);
            float out[T1 * H];
            moe_exec_stats st;
            run(&o, NULL, X, T1, out, &st);
            assert_string_equal(st.isa, isas[i]);
            assert_int_equal(st.threads, th);
            assert_memory_equal(out, REF, sizeof out);
        }
    }
}

/* The batched format (local prepare/finalize + batched experts) gives the same bits; a
 * mismatched pair is refused naming both sides. */
static void test_modular_formats(void **state)
{
    (void)state;
    moe_options o;
    opts1(&o);
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.prepare_finalize = MOE_PF_LOCAL_BATCHED;
    cfg.experts = MOE_EXPERTS_BATCHED;
    cfg.batched_capacity = 16;
    float out[T1 * H];
    moe_exec_stats st;
    run(&o, &cfg, X, T1, out, &st);
    assert_string_equal(st.prepare_finalize, "local_batched");
    assert_string_equal(st.experts, "batched");
    assert_int_equal(st.chunk_tokens, 16);
    assert_int_equal(st.chunks, 7);
    assert_memory_equal(out, REF, sizeof out);

    moe_ctx *ctx = tu_ctx();
    moe_plan *p = NULL;
    cfg.experts = MOE_EXPERTS_GROUPED;
    assert_int_equal(moe_plan_create_ex(ctx, &L.d, &cfg, &p), MOE_EINVAL);
    assert_null(p);
    const char *msg = moe_ctx_last_error(ctx);
    assert_non_null(strstr(msg, "local_batched"));
    assert_non_null(strstr(msg, "grouped"));
    assert_non_null(strstr(msg, "format"));
    cfg.prepare_finalize = MOE_PF_LOCAL;
    cfg.experts = MOE_EXPERTS_BATCHED;
    assert_int_equal(moe_plan_create_ex(ctx, &L.d, &cfg, &p), MOE_EINVAL);
    moe_ctx_free(ctx);
}

/* Captures log lines. */
static char logbuf[4096];
static void capture(moe_log_level level, const char *msg, void *user)
{
    (void)user;
    if (level <= MOE_LOG_WARN && strlen(logbuf) + strlen(msg) + 2 < sizeof logbuf) {
        strcat(logbuf, msg);
        strcat(logbuf, "\n");
    }
}

static void test_env(void **state)
{
    (void)state;
    char err[512];
    moe_ctx *ctx = NULL;
    moe_options o;
    moe_options_init(&o);
    o.log_fn = capture;

    /* a misspelled knob warns, naming the real one */
    logbuf[0] = '\0';
    setenv("MOE_CHUNKSIZE", "4", 1);
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    assert_non_null(strstr(logbuf, "MOE_CHUNKSIZE"));
    assert_non_null(strstr(logbuf, "MOE_CHUNK_SIZE"));
    moe_ctx_free(ctx);
    unsetenv("MOE_CHUNKSIZE");

    /* a bad value is an error listing the accepted values */
    setenv("MOE_PERMUTE", "fast", 1);
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_EINVAL);
    assert_non_null(strstr(err, "MOE_PERMUTE"));
    assert_non_null(strstr(err, "auto, sort, onehot, packed"));
    moe_knob_info info;
    size_t i_perm = 0;
    for (size_t i = 0; i < moe_knob_count(); i++) {
        assert_int_equal(moe_knob_describe(&o, i, &info), MOE_OK);
        if (strcmp(info.env, "MOE_PERMUTE") == 0)
            i_perm = i;
    }
    moe_knob_describe(&o, i_perm, &info);
    assert_int_equal(info.source, MOE_KNOB_ENV);
    assert_non_null(strstr(info.error, "fast"));
    /* an explicit API value wins over the environment */
    o.permute = "packed";
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    moe_knob_describe(&o, i_perm, &info);
    assert_int_equal(info.source, MOE_KNOB_API);
    assert_string_equal(info.value, "packed");
    assert_non_null(strstr(moe_ctx_options_text(ctx), "permute=packed;"));
    moe_ctx_free(ctx);
    unsetenv("MOE_PERMUTE");
    assert_int_equal(moe_knob_describe(&o, moe_knob_count(), &info), MOE_ERANGE);

    /* every integer and enum knob refuses junk */
    const char *vars[] = {"MOE_NUM_THREADS", "MOE_ISA", "MOE_CHUNK_SIZE", "MOE_ONEHOT_THRESHOLD", "MOE_TOPK",
                          "MOE_LOWTOK_THRESHOLD", "MOE_SMALL_ALLREDUCE", "MOE_TP_REDUCE", "MOE_TUNING_DIR",
                          "MOE_LOG_LEVEL"};
    moe_options_init(&o);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        setenv(vars[i], "-3x", 1);
        assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_EINVAL);
        assert_non_null(strstr(err, vars[i]));
        unsetenv(vars[i]);
    }
}

/* Occurrences of `needle` in `hay`. */
static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* A ctx from `o` (its log_fn set to capture), then `plans` plans without TP on it; logbuf
 * holds the WARNINGs of all of it. */
static void idle_run(moe_options *o, int plans)
{
    char err[512];
    moe_ctx *ctx = NULL;
    o->log_fn = capture;
    logbuf[0] = '\0';
    assert_int_equal(moe_ctx_create(o, &ctx, err, sizeof err), MOE_OK);
    for (int i = 0; i < plans; i++) {
        moe_plan *p = NULL;
        assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
        moe_plan_free(p);
    }
    moe_ctx_free(ctx);
}

/* moe_knob_describe's inert text of the knob whose variable is `env`, for options o. */
static const char *inert_of(const moe_options *o, const char *env)
{
    static moe_knob_info info;
    for (size_t i = 0; i < moe_knob_count(); i++) {
        assert_int_equal(moe_knob_describe(o, i, &info), MOE_OK);
        if (strcmp(info.env, env) == 0)
            return info.inert;
    }
    fail_msg("no knob %s", env);
    return NULL;
}

/* Idle knobs (moe.h "Idle knobs"): a given value that cannot act gets exactly one WARNING
 * naming it and why, and moe_knob_describe's inert text; a value that can act, none. */
static void test_idle_knobs(void **state)
{
    (void)state;
    moe_options o;
    /* MOE_ONEHOT_THRESHOLD under each fixed permute method: idle; under auto: acts */
    const char *fixed[] = {"sort", "onehot", "packed"};
    for (int i = 0; i < 3; i++) {
        char want[160];
        setenv("MOE_ONEHOT_THRESHOLD", "100", 1);
        setenv("MOE_PERMUTE", fixed[i], 1);
        moe_options_init(&o);
        idle_run(&o, 2);
        snprintf(want, sizeof want,
                 "MOE_ONEHOT_THRESHOLD=100 has no effect: it acts only when the permute knob is auto, and "
                 "MOE_PERMUTE=%s\n", fixed[i]);
        assert_int_equal(count_of(logbuf, want), 1);
        assert_int_equal(count_of(logbuf, "has no effect"), 1);
        assert_non_null(strstr(inert_of(&o, "MOE_ONEHOT_THRESHOLD"), fixed[i]));
        /* the API wins over the environment, and the message names the field */
        o.permute = "auto";
        idle_run(&o, 1);
        assert_int_equal(count_of(logbuf, "has no effect"), 0);
        assert_string_equal(inert_of(&o, "MOE_ONEHOT_THRESHOLD"), "");
        unsetenv("MOE_ONEHOT_THRESHOLD");
        unsetenv("MOE_PERMUTE");
    }
    moe_options_init(&o);
    o.onehot_threshold = 7;
    o.permute = "packed";
    idle_run(&o, 1);
    assert_int_equal(count_of(logbuf, "moe_options.onehot_threshold=7 has no effect: it acts only when the permute "
                                      "knob is auto, and moe_options.permute=packed\n"), 1);
    /* the default threshold under a fixed method is nobody's setting: no warning */
    moe_options_init(&o);
    o.permute = "sort";
    idle_run(&o, 1);
    assert_int_equal(count_of(logbuf, "has no effect"), 0);
    assert_string_equal(inert_of(&o, "MOE_ONEHOT_THRESHOLD"), "");

    /* MOE_TP_REDUCE without TP: one WARNING from the first plan, none from the next ones */
    const char *tp_text = "acts only under tensor parallelism (parallel.tp_size > 1; the command line's --tp > 1)";
    setenv("MOE_TP_REDUCE", "reduce_scatter", 1);
    moe_options_init(&o);
    idle_run(&o, 0); /* the ctx alone cannot know */
    assert_int_equal(count_of(logbuf, "has no effect"), 0);
    idle_run(&o, 3);
    char want[256];
    snprintf(want, sizeof want, "MOE_TP_REDUCE=reduce_scatter has no effect: it %s, and this plan has tp_size = 1\n",
             tp_text);
    assert_int_equal(count_of(logbuf, want), 1);
    assert_int_equal(count_of(logbuf, "has no effect"), 1);
    assert_string_equal(inert_of(&o, "MOE_TP_REDUCE"), tp_text);
    /* MOE_SMALL_ALLREDUCE beside reduce_scatter: idle whatever the plan, said by the ctx; the
     * plan without TP adds only MOE_TP_REDUCE's line */
    setenv("MOE_SMALL_ALLREDUCE", "1024", 1);
    idle_run(&o, 2);
    assert_int_equal(count_of(logbuf, "MOE_SMALL_ALLREDUCE=1024 has no effect: it acts only when the tp_reduce knob "
                                      "is allreduce (reduce_scatter always reduce-scatters), and "
                                      "MOE_TP_REDUCE=reduce_scatter\n"), 1);
    assert_int_equal(count_of(logbuf, want), 1);
    assert_int_equal(count_of(logbuf, "has no effect"), 2);
    unsetenv("MOE_TP_REDUCE");
    /* MOE_SMALL_ALLREDUCE alone, without TP */
    idle_run(&o, 2);
    snprintf(want, sizeof want, "MOE_SMALL_ALLREDUCE=1024 has no effect: it %s, and this plan has tp_size = 1\n",
             tp_text);
    assert_int_equal(count_of(logbuf, want), 1);
    assert_int_equal(count_of(logbuf, "has no effect"), 1);
    unsetenv("MOE_SMALL_ALLREDUCE");
    /* through the API */
    moe_options_init(&o);
    o.small_allreduce = 0;
    o.tp_reduce = "allreduce";
    idle_run(&o, 1);
    assert_int_equal(count_of(logbuf, "moe_options.small_allreduce=0 has no effect"), 1);
    assert_int_equal(count_of(logbuf, "moe_options.tp_reduce=allreduce has no effect"), 1);
    assert_int_equal(count_of(logbuf, "has no effect"), 2);
    /* nothing given: nothing said, and every knob's inert text is empty */
    moe_options_init(&o);
    idle_run(&o, 2);
    assert_int_equal(count_of(logbuf, "has no effect"), 0);
    for (size_t i = 0; i < moe_knob_count(); i++) {
        moe_knob_info info;
        assert_int_equal(moe_knob_describe(&o, i, &info), MOE_OK);
        assert_string_equal(info.inert, "");
    }
}

/* The options hash: equal for equal knobs, different when a knob differs, blind to logging. */
static void test_hash(void **state)
{
    (void)state;
    moe_options o;
    opts1(&o);
    char err[256];
    moe_ctx *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(moe_ctx_create(&o, &a, err, sizeof err), MOE_OK);
    o.log_level = MOE_LOG_DEBUG;
    o.log_fn = capture;
    assert_int_equal(moe_ctx_create(&o, &b, err, sizeof err), MOE_OK);
    o.chunk_size = 33;
    assert_int_equal(moe_ctx_create(&o, &c, err, sizeof err), MOE_OK);
    assert_true(moe_ctx_options_hash(a) == moe_ctx_options_hash(b));
    assert_true(moe_ctx_options_hash(a) != moe_ctx_options_hash(c));
    assert_non_null(strstr(moe_ctx_options_text(c), "chunk_size=33;"));
    moe_plan *pa = NULL, *pb = NULL;
    assert_int_equal(moe_plan_create(a, &L.d, &pa), MOE_OK);
    moe_layer_desc d2 = L.d;
    d2.top_k = 2;
    assert_int_equal(moe_plan_create(b, &d2, &pb), MOE_OK);
    assert_true(moe_plan_hash(pa) != moe_plan_hash(pb));
    assert_non_null(strstr(moe_plan_text(pb), "top_k=2;"));
    moe_plan_free(pa);
    moe_plan_free(pb);
    moe_ctx_free(a);
    moe_ctx_free(b);
    moe_ctx_free(c);
}

/* The last chunk: T = 64*1024 + 10 with chunk 32768 matches the oracle, and the workspace is
 * bounded by the chunk, not by T. */
static void test_last_chunk(void **state)
{
    (void)state;
    const int64_t T = 64 * 1024 + 10;
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    float *ref = malloc(sizeof(float) * (size_t)(T * H));
    float *out = malloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 1234, -1, 1);
    assert_int_equal(moe_ref_forward(&L.d, &L.src, x, T, NULL, ref, NULL, NULL), MOE_OK);
    moe_options o;
    moe_options_init(&o);
    o.chunk_size = 32768;
    o.num_threads = 2;
    moe_exec_stats st;
    run(&o, NULL, x, T, out, &st);
    assert_int_equal(st.chunks, 3);
    assert_int_equal(st.chunk_tokens, 32768);
    assert_memory_equal(out, ref, sizeof(float) * (size_t)(T * H));
    moe_ctx *ctx = NULL;
    char err[128];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    assert_true(moe_plan_workspace_size(p, T) == moe_plan_workspace_size(p, 32768));
    assert_true(moe_plan_workspace_size(p, 10) < moe_plan_workspace_size(p, 32768));
    moe_plan_free(p);
    moe_ctx_free(ctx);
    free(x);
    free(ref);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_size), cmocka_unit_test(test_permute),   cmocka_unit_test(test_topk),
        cmocka_unit_test(test_lowtok),     cmocka_unit_test(test_isa_and_threads),
        cmocka_unit_test(test_modular_formats), cmocka_unit_test(test_env), cmocka_unit_test(test_hash),
        cmocka_unit_test(test_last_chunk), cmocka_unit_test(test_idle_knobs),
    };
    return cmocka_run_group_tests(tests, setup_ref, NULL);
}
