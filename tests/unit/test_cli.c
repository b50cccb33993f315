/* The `moe` command line ($LIBMOE_BIN): exit codes, messages, no output file on failure,
 * `moe run` bit-identical to a direct moe_plan_execute_ex on the same checkpoint, and
 * --compute f32|bf16 on run, bench and plan. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "moe.h"
#include "testutil.h"

#define RUN_DEADLINE_S 900.0

typedef struct cli_result {
    int exited;  /* 1 when the child exited normally */
    int code;    /* its exit status */
    char *out;   /* stdout, NUL-terminated */
    char *err;   /* stderr */
    double secs; /* wall time */
} cli_result;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(n < 0 ? 0 : n) + 1);
    assert_non_null(b);
    size_t got = n > 0 ? fread(b, 1, (size_t)n, f) : 0;
    b[got] = '\0';
    fclose(f);
    return b;
}

static const char *moe_bin(void)
{
    const char *b = getenv("LIBMOE_BIN");
    return (b && *b && access(b, X_OK) == 0) ? b : NULL;
}

/* Run $LIBMOE_BIN with args (NULL-terminated, without argv[0]), capturing stdout and stderr;
 * killed (and the test failed) after deadline_s. */
static void run_moe_within(cli_result *r, const char *const *args, double deadline_s)
{
    memset(r, 0, sizeof *r);
    const char *bin = moe_bin();
    assert_non_null(bin);
    char dir[512], outp[600], errp[600];
    tu_tmpdir(dir, sizeof dir, "cli-io");
    snprintf(outp, sizeof outp, "%s/stdout", dir);
    snprintf(errp, sizeof errp, "%s/stderr", dir);
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)bin;
    for (; args[n - 1] && n < 63; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;

    double t0 = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
            _exit(127);
        close(fo);
        close(fe);
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        assert_true(w == 0 || errno == EINTR);
        if (now_s() - t0 > deadline_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            unlink(outp);
            unlink(errp);
            rmdir(dir);
            fail_msg("moe %s did not finish within %.0f s", args[0], deadline_s);
        }
        usleep(2000);
    }
    r->secs = now_s() - t0;
    r->exited = WIFEXITED(status);
    r->code = r->exited ? WEXITSTATUS(status) : -1;
    r->out = slurp(outp);
    r->err = slurp(errp);
    unlink(outp);
    unlink(errp);
    rmdir(dir);
}

static void run_moe(cli_result *r, const char *const *args)
{
    run_moe_within(r, args, RUN_DEADLINE_S);
}

static void result_free(cli_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

#define SKIP_WITHOUT_BIN()                                                                \
    do {                                                                                  \
        if (!moe_bin()) {                                                                 \
            print_message("LIBMOE_BIN is not set to an executable: skipped\n");              \
            skip();                                                                       \
        }                                                                                 \
    } while (0)

static void expect(cli_result *r, int code, const char *const *in_err)
{
    if (!r->exited || r->code != code)
        fail_msg("expected exit %d, got %s %d\nstdout:\n%s\nstderr:\n%s", code,
                 r->exited ? "exit" : "signal/abnormal", r->code, r->out, r->err);
    for (; in_err && *in_err; in_err++)
        if (!strstr(r->err, *in_err))
            fail_msg("stderr lacks \"%s\":\n%s", *in_err, r->err);
}

static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return 1;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n == 0;
}

/* ---- a tiny Qwen3-MoE checkpoint ---------------------------------------------------- */

enum { CK_H = 32, CK_I = 16, CK_E = 4, CK_K = 2, CK_LAYERS = 2 };

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void fill_bf16(uint16_t *dst, size_t n, uint64_t seed, float bound)
{
    float *tmp = malloc(n * sizeof(float));
    assert_non_null(tmp);
    tu_fill_uniform(tmp, n, seed, -bound, bound);
    for (size_t i = 0; i < n; i++)
        dst[i] = to_bf16(tmp[i]);
    free(tmp);
}

/* Writes config.json and model.safetensors into a fresh folder `dir`. */
static void make_checkpoint(char *dir, size_t len)
{
    tu_tmpdir(dir, len, "cli-ck");
    char path[700];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[1024];
    int n = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", "
                     "\"hidden_size\": %d, \"intermediate_size\": %d, \"moe_intermediate_size\": %d, "
                     "\"num_experts\": %d, \"num_experts_per_tok\": %d, \"num_hidden_layers\": %d, "
                     "\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [], "
                     "\"torch_dtype\": \"bfloat16\", \"vocab_size\": 128, "
                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                     "\"rms_norm_eps\": 1e-06}\n",
                     CK_H, 4 * CK_H, CK_I, CK_E, CK_K, CK_LAYERS);
    assert_int_equal(tu_write_file(path, cfg, (size_t)n), 0);

    enum { PER_LAYER = 1 + 3 * CK_E, NT = CK_LAYERS * PER_LAYER };
    moe_tensor_out t[NT];
    char names[NT][96];
    uint16_t *bufs[NT];
    memset(t, 0, sizeof t);
    int k = 0;
    for (int l = 0; l < CK_LAYERS; l++) {
        snprintf(names[k], sizeof names[k], "model.layers.%d.mlp.gate.weight", l);
        t[k].shape[0] = CK_E;
        t[k].shape[1] = CK_H;
        k++;
        for (int e = 0; e < CK_E; e++) {
            static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int p = 0; p < 3; p++) {
                snprintf(names[k], sizeof names[k], "model.layers.%d.mlp.experts.%d.%s.weight", l,
                         e, proj[p]);
                t[k].shape[0] = p == 2 ? CK_H : CK_I;
                t[k].shape[1] = p == 2 ? CK_I : CK_H;
                k++;
            }
        }
    }
    for (int i = 0; i < NT; i++) {
        size_t ne = (size_t)(t[i].shape[0] * t[i].shape[1]);
        bufs[i] = malloc(ne * sizeof(uint16_t));
        assert_non_null(bufs[i]);
        /* routers get larger values so routing is decisive */
        fill_bf16(bufs[i], ne, 1000 + (uint64_t)i, i % PER_LAYER == 0 ? 1.0f : 0.25f);
        t[i].name = names[i];
        t[i].dtype = MOE_DTYPE_BF16;
        t[i].ndim = 2;
        t[i].data = bufs[i];
    }
    moe_ctx *ctx = tu_ctx();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    moe_status st = moe_safetensors_write(ctx, path, t, NT);
    if (st != MOE_OK)
        fail_msg("writing %s: %s", path, moe_ctx_last_error(ctx));
    moe_ctx_free(ctx);
    for (int i = 0; i < NT; i++)
        free(bufs[i]);
}

/* Writes hidden_states [T, W] (F32 or BF16) to `path`; returns the f32 values (caller frees). */
static float *make_input(const char *path, int64_t T, int64_t W, moe_dtype dt, uint64_t seed)
{
    size_t n = (size_t)(T * W);
    float *x = malloc(n * sizeof(float) + 1);
    uint16_t *xb = malloc(n * sizeof(uint16_t) + 1);
    assert_non_null(x);
    assert_non_null(xb);
    tu_fill_uniform(x, n, seed, -2.0f, 2.0f);
    if (dt == MOE_DTYPE_BF16)
        for (size_t i = 0; i < n; i++)
            xb[i] = to_bf16(x[i]);
    moe_tensor_out t;
    memset(&t, 0, sizeof t);
    t.name = "hidden_states";
    t.dtype = dt;
    t.ndim = 2;
    t.shape[0] = T;
    t.shape[1] = W;
    t.data = dt == MOE_DTYPE_BF16 ? (const void *)xb : (const void *)x;
    moe_ctx *ctx = tu_ctx();
    moe_status st = moe_safetensors_write(ctx, path, &t, 1);
    if (st != MOE_OK)
        fail_msg("writing %s: %s", path, moe_ctx_last_error(ctx));
    moe_ctx_free(ctx);
    if (dt == MOE_DTYPE_BF16) { /* the values the layer sees */
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)xb[i] << 16;
            memcpy(&x[i], &u, sizeof u);
        }
    }
    free(xb);
    return x;
}

/* ---- general ------------------------------------------------------------------------ */

static void test_help(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a1[] = {"help", NULL};
    run_moe(&r, a1);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "bench"));
    assert_non_null(strstr(r.out, "run"));
    result_free(&r);

    const char *a2[] = {"run", "--help", NULL};
    run_moe(&r, a2);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "--checkpoint"));
    result_free(&r);

    const char *a3[] = {"bench", "--help", NULL};
    run_moe(&r, a3);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "--tokens"));
    result_free(&r);

    const char *a4[] = {"version", NULL};
    run_moe(&r, a4);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, moe_version_string()));
    result_free(&r);

    const char *a5[] = {NULL};
    run_moe(&r, a5);
    expect(&r, 2, NULL);
    result_free(&r);
}

static void test_unknown(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a1[] = {"frobnicate", NULL};
    const char *e1[] = {"frobnicate", NULL};
    run_moe(&r, a1);
    expect(&r, 2, e1);
    result_free(&r);

    const char *a2[] = {"bench", "--frob", NULL};
    const char *e2[] = {"--frob", NULL};
    run_moe(&r, a2);
    expect(&r, 2, e2);
    result_free(&r);

    const char *a3[] = {"run", "--checkpoint", "x", "--layer", "0", "--input", "a",
                        "--output", "b", "--bogus", "1", NULL};
    const char *e3[] = {"--bogus", NULL};
    run_moe(&r, a3);
    expect(&r, 2, e3);
    result_free(&r);

    const char *a4[] = {"run", "--checkpoint", "x", "--layer", "0", NULL};
    const char *e4[] = {"--input", NULL};
    run_moe(&r, a4);
    expect(&r, 2, e4);
    result_free(&r);

    const char *a5[] = {"run", "--checkpoint", "x", "--layer", "1x", "--input", "a",
                        "--output", "b", NULL};
    const char *e5[] = {"--layer", "1x", NULL};
    run_moe(&r, a5);
    expect(&r, 2, e5);
    result_free(&r);
}

/* ---- bench options ------------------------------------------------------------------ */

static void test_bench_bad_numbers(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cases[][4] = {
        {"--tokens", "0", "--tokens", NULL},
        {"--tokens", "abc", "--tokens", NULL},
        {"--tokens", "1,,2", "--tokens", NULL},
        {"--tokens", "16,", "--tokens", NULL},
        {"--tokens", "-1", "--tokens", NULL},
        {"--tokens", "4x", "--tokens", NULL},
        {"--threads", "0", "--threads", NULL},
        {"--threads", "two", "--threads", NULL},
        {"--iters", "0", "--iters", NULL},
        {"--min-time", "nan", "--min-time", NULL},
        {"--min-time", "1s", "--min-time", NULL},
        {"--num-experts", "1e3", "--num-experts", NULL},
        {"--dtype", "f8", "--dtype", NULL},
        {"--mem-limit", "lots", "--mem-limit", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        const char *a[] = {"bench", cases[i][0], cases[i][1], NULL};
        const char *e[] = {cases[i][2], NULL};
        run_moe(&r, a);
        expect(&r, 2, e);
        result_free(&r);
    }
    cli_result r;
    const char *a[] = {"bench", "--tokens", NULL};
    const char *e[] = {"--tokens", NULL};
    run_moe(&r, a);
    expect(&r, 2, e);
    result_free(&r);
}

/* moe bench --ep: a placement list with an empty entry and a --load-out that cannot be
 * written are refused (exit 2, naming the option) before anything is measured. */
static void test_bench_par_bad_lists(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cases[][3] = {
        {"--placement", "contiguous,,balanced", "--placement 'contiguous,,balanced': an empty entry"},
        {"--placement", "contiguous,", "--placement 'contiguous,': an empty entry"},
        {"--placement", ",balanced", "--placement ',balanced': an empty entry"},
        {"--load-out", "/nonexistent-libmoe-dir/load.json", "--load-out /nonexistent-libmoe-dir/load.json: the folder "
                                                             "/nonexistent-libmoe-dir does not exist"},
        {"--load-out", "/", "--load-out /: exists and is not a regular file (a folder)"},
        {"--load-out", "", "--load-out: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        const char *a[] = {"bench", "--ep", "1", "--tokens", "1", "--iters", "1", cases[i][0], cases[i][1], NULL};
        const char *e[] = {cases[i][2], NULL};
        run_moe(&r, a);
        expect(&r, 2, e);
        assert_null(strstr(r.out, "median")); /* nothing measured */
        result_free(&r);
    }
}

static void test_bench_unknown_model(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a[] = {"bench", "--model", "nosuch", NULL};
    const char *e[] = {"nosuch", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3",
                       "granite-3.0-1b-a400m", NULL};
    run_moe(&r, a);
    expect(&r, 2, e);
    result_free(&r);

    const char *a2[] = {"bench", "--list-models", NULL};
    run_moe(&r, a2);
    expect(&r, 0, NULL);
    static const char *const models[] = {
        "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3.5-35b-a3b", "qwen3-next-80b-a3b",
        "qwen1.5-moe-a2.7b", "mixtral-8x7b", "deepseek-v3", "deepseek-v2-lite", "gpt-oss-20b",
        "gpt-oss-120b", "olmoe-1b-7b", "llama4-scout", "nemotron-3-nano-30b-a3b", "granite-3.0-1b-a400m"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (!strstr(r.out, models[i]))
            fail_msg("--list-models lacks %s:\n%s", models[i], r.out);
    result_free(&r);
}

static void test_bench_does_not_fit(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    /* 22.5 GB of bf16 experts: refused before anything is allocated, whatever the machine,
     * since --mem-limit caps the memory the bench may use. */
    cli_result r;
    const char *a[] = {"bench", "--model", "deepseek-v3", "--mem-limit", "16G", NULL};
    const char *e[] = {"does not fit", "--num-experts", NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    if (r.secs > 30.0)
        fail_msg("the refusal took %.1f s", r.secs);
    result_free(&r);
}

static void test_bench_json(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a[] = {"bench", "--model", "granite-3.0-1b-a400m", "--tokens", "1,3",
                       "--iters", "3", "--json", "--threads", "1", NULL};
    run_moe(&r, a);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "\"rows\""));
    json_error_t jerr;
    json_t *doc = json_loads(r.out, 0, &jerr);
    if (!doc)
        fail_msg("stdout is not JSON (line %d: %s):\n%s", jerr.line, jerr.text, r.out);
    json_t *rows = json_object_get(doc, "rows");
    assert_true(json_is_array(rows));
    assert_int_equal(json_array_size(rows), 2);
    static const int64_t tok[2] = {1, 3};
    for (size_t i = 0; i < 2; i++) {
        json_t *row = json_array_get(rows, i);
        assert_int_equal(json_integer_value(json_object_get(row, "tokens")), tok[i]);
        assert_int_equal(json_integer_value(json_object_get(row, "runs")), 3);
        assert_true(json_number_value(json_object_get(row, "median_ms")) > 0.0);
        assert_true(json_number_value(json_object_get(row, "best_ms")) <=
                    json_number_value(json_object_get(row, "median_ms")));
        /* the controlled router: T*K distinct experts (E = 32 > 3 * 8) */
        assert_true(json_number_value(json_object_get(row, "distinct_experts")) == 8.0 * (double)tok[i]);
        assert_int_equal(json_integer_value(json_object_get(row, "routing_mismatches")), 0);
    }
    json_t *layer = json_object_get(doc, "layer");
    assert_int_equal(json_integer_value(json_object_get(layer, "hidden_size")), 1024);
    assert_int_equal(json_integer_value(json_object_get(layer, "num_experts")), 32);
    /* the default compute mode, and its roof (VNNI only for int8-w8a8) */
    assert_string_equal(json_string_value(json_object_get(doc, "compute")), "f32");
    assert_string_equal(json_string_value(json_object_get(doc, "compute_roof")), "fma");
    json_decref(doc);
    result_free(&r);
}

/* JSON of `moe bench ARGS`, exit 0; fails the test otherwise. */
static json_t *bench_json(const char *const *args)
{
    cli_result r;
    run_moe(&r, args);
    expect(&r, 0, NULL);
    json_error_t jerr;
    json_t *doc = json_loads(r.out, 0, &jerr);
    if (!doc)
        fail_msg("stdout is not JSON (line %d: %s):\n%s", jerr.line, jerr.text, r.out);
    result_free(&r);
    return doc;
}

/* The Nemotron-3-Nano preset: non-gated relu2 experts and shared MLP read two matrices each
 * (up, down), so a forward's bytes and FLOPs count 2 H I per routed expert and 2 H I_s for the
 * shared one (bf16: 2 bytes a weight), not the gated layers' 3; the released
 * routed_scaling_factor 2.5 is the preset's. */
static void test_bench_nongated_preset(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    const char *a[] = {"bench", "--model", "nemotron-3-nano-30b-a3b", "--num-experts", "8", "--tokens", "1,3",
                       "--iters", "1", "--json", NULL};
    json_t *doc = bench_json(a);
    json_t *layer = json_object_get(doc, "layer");
    const double H = (double)json_integer_value(json_object_get(layer, "hidden_size"));
    const double I = (double)json_integer_value(json_object_get(layer, "moe_intermediate_size"));
    const double Is = (double)json_integer_value(json_object_get(layer, "shared_expert_intermediate_size"));
    const double E = (double)json_integer_value(json_object_get(layer, "num_experts"));
    const double K = (double)json_integer_value(json_object_get(layer, "top_k"));
    assert_true(H == 2688 && I == 1856 && Is == 3712 && E == 8 && K == 6);
    assert_true(json_number_value(json_object_get(layer, "routed_scaling_factor")) == 2.5);
    json_t *rows = json_object_get(doc, "rows");
    assert_int_equal(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *row = json_array_get(rows, i);
        const double T = (double)json_integer_value(json_object_get(row, "tokens"));
        const double n = json_number_value(json_object_get(row, "distinct_experts"));
        const double bytes = json_number_value(json_object_get(row, "bytes_per_forward"));
        const double flops = json_number_value(json_object_get(row, "flops_per_forward"));
        const double want_b = n * 2.0 * H * I * 2.0 + 2.0 * H * Is * 2.0;
        const double want_f = 2.0 * T * K * 2.0 * H * I + 2.0 * T * 2.0 * H * Is + 2.0 * T * E * H;
        if (fabs(bytes - want_b) > 1e-9 * want_b || fabs(flops - want_f) > 1e-9 * want_f)
            fail_msg("T %g: bytes %.0f (expected %.0f), flops %.0f (expected %.0f)", T, bytes, want_b, flops, want_f);
    }
    json_decref(doc);
    /* moe plan --model packs the same two matrices per expert: E 128 x 2 H I bf16, shared 2 H I_s */
    cli_result r;
    const char *p[] = {"plan", "--model", "nemotron-3-nano-30b-a3b", NULL};
    run_moe(&r, p);
    expect(&r, 0, NULL);
    char want[128];
    snprintf(want, sizeof want, " %.0f %14.0f ", 128.0 * 2.0 * H * I * 2.0, 2.0 * H * Is * 2.0);
    if (!strstr(r.out, want))
        fail_msg("moe plan --model nemotron-3-nano-30b-a3b lacks the bytes '%s':\n%s", want, r.out);
    result_free(&r);
}

/* The library's compute roof (moe_rank_report.compute_roof) for compute `c` on bf16 experts of
 * the bench's granite layer shape, on the table a ctx gets here (MOE_ISA as set). */
static const char *library_roof(moe_compute c)
{
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = 1024;
    d.moe_intermediate_size = 512;
    d.num_experts = 32;
    d.top_k = 8;
    d.weight_dtype = MOE_DTYPE_BF16;
    moe_plan_config pc;
    moe_plan_config_init(&pc);
    pc.compute = c;
    moe_rank_report r;
    assert_int_equal(moe_plan_report_for(ctx, &d, &pc, &r), MOE_OK);
    moe_ctx_free(ctx);
    return r.compute_roof; /* static */
}

/* bench --compute bf16: the JSON names the mode and the roof of the instructions the expert
 * GEMMs run: vdpbf16ps's ("bf16") where the table's pair GEMM is vdpbf16ps (avx512_bf16, on a
 * CPU where it is the faster form), else the FMA peak (vfmadd pairs, or the scalar emulation
 * under MOE_ISA=ref): the library's moe_rank_report.compute_roof. Each row's bound is DRAM or
 * that roof, its value the measured one; --roofline measures vdpbf16ps on avx512_bf16. */
static void test_bench_compute_bf16(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    const char *a[] = {"bench", "--model", "granite-3.0-1b-a400m", "--tokens", "1,256", "--iters", "1", "--json",
                       "--threads", "1", "--compute", "bf16", "--roofline", NULL};
    json_t *doc = bench_json(a);
    assert_string_equal(json_string_value(json_object_get(doc, "compute")), "bf16");
    const char *roof = json_string_value(json_object_get(doc, "compute_roof"));
    assert_string_equal(roof, library_roof(MOE_COMPUTE_BF16));
    const int vdp = strcmp(roof, "bf16") == 0;
    if (vdp)
        assert_string_equal(json_string_value(json_object_get(json_object_get(doc, "machine"), "isa")), "avx512_bf16");
    else
        assert_string_equal(roof, "fma");
    json_t *rf = json_object_get(doc, "roofline");
    const double bf16_peak = json_number_value(json_object_get(rf, "bf16_dp_gflops"));
    const double fma_peak = json_number_value(json_object_get(rf, "fma_f32_gflops"));
    const double dram = json_number_value(json_object_get(rf, "dram_read_gbs"));
    /* the loops measure vdpbf16ps exactly on the avx512_bf16 table */
    assert_true((bf16_peak > 0.0) == !strcmp(json_string_value(json_object_get(rf, "isa")), "avx512_bf16"));
    assert_string_equal(json_string_value(json_object_get(rf, "compute_roof")), roof);
    const double peak = json_number_value(json_object_get(rf, "compute_roof_value"));
    assert_true(peak == (vdp ? bf16_peak : fma_peak));
    json_t *rows = json_object_get(doc, "rows");
    assert_int_equal(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *row = json_array_get(rows, i);
        const char *b = json_string_value(json_object_get(row, "roof"));
        assert_non_null(b);
        const double v = json_number_value(json_object_get(row, "roof_value"));
        if (strcmp(b, "dram") == 0) {
            assert_true(v == dram);
            assert_string_equal(json_string_value(json_object_get(row, "roofline_bound")), "DRAM");
        } else {
            assert_string_equal(b, roof);
            assert_true(v == peak);
            assert_string_equal(json_string_value(json_object_get(row, "roofline_bound")), vdp ? "BF16" : "FMA");
        }
    }
    json_decref(doc);

    /* the scalar table: compute bf16 there is the emulation, against the FMA roof */
    setenv("MOE_ISA", "ref", 1);
    const char *b[] = {"bench", "--model", "granite-3.0-1b-a400m", "--tokens", "1", "--iters", "1", "--json",
                       "--threads", "1", "--compute", "bf16", NULL};
    doc = bench_json(b);
    unsetenv("MOE_ISA");
    assert_string_equal(json_string_value(json_object_get(doc, "compute")), "bf16");
    assert_string_equal(json_string_value(json_object_get(doc, "compute_roof")), "fma");
    assert_true(json_is_null(json_object_get(doc, "roofline")));
    json_decref(doc);
}

/* --compute: a bad value is refused naming the accepted ones, in every command that takes it;
 * compute bf16 with a scheme that computes in 8 bits is refused naming it. */
static void test_compute_refusals(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cases[][6] = {
        {"bench", "--compute", "bf17", NULL, NULL, "moe bench: --compute bf17: accepted values are f32"},
        {"bench", "--ep", "1", "--compute", "fp16", "moe bench: --compute fp16: accepted values are f32"},
        {"run", "--compute", "F32", NULL, NULL, "moe run: --compute F32: accepted values are f32"},
        {"plan", "--compute=", NULL, NULL, NULL, "moe plan: --compute : accepted values are f32"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        const char *a[] = {cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], NULL};
        const char *e[] = {cases[i][5], "and bf16", NULL};
        run_moe(&r, a);
        expect(&r, 2, e);
        assert_string_equal(r.out, "");
        result_free(&r);
    }
    cli_result r;
    const char *a[] = {"bench", "--quant", "int8-w8a8", "--compute", "bf16", "--tokens", "1", "--iters", "1", NULL};
    const char *e[] = {"moe bench: ", "compute bf16 with int8-w8a8", "compute f32", NULL};
    run_moe(&r, a);
    expect(&r, 2, e);
    result_free(&r);
    /* the help of every command that takes it lists it */
    static const char *const helps[][3] = {
        {"run", "--help", NULL}, {"bench", "--help", NULL}, {"bench", "--ep=1", "--help"}, {"plan", "--help", NULL}};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        const char *h[] = {helps[i][0], helps[i][1], helps[i][2], NULL};
        run_moe(&r, h);
        expect(&r, 0, NULL);
        if (!strstr(r.out, "--compute") || !strstr(r.out, "bf16"))
            fail_msg("moe %s %s: the help does not list --compute:\n%s", helps[i][0], helps[i][1], r.out);
        result_free(&r);
    }
}

/* moe bench --ep 1 --skew HOT:SHARE: each part as strict as the number options (no leading
 * space, no overflow or underflow), the value named; HOT reported as given and refused when it
 * is not below E or too few for SHARE (a token picks top_k = 8 distinct experts of
 * qwen3-30b-a3b's 128), never clamped; nothing on stdout, exit 2 (usage). */
static void test_skew_refusals(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cases[][2] = {
        {" 8:0.5", "moe bench: --skew HOT: ' 8' is not an integer"},
        {"8: 0.5", "moe bench: --skew SHARE: ' 0.5' is not a number"},
        {"8:1e-400", "moe bench: --skew SHARE: 1e-400 underflows"},
        {"8:1.5", "moe bench: --skew SHARE: 1.5 is out of range [0, 1]"},
        {"99999999999999999999:0.5", "moe bench: --skew HOT: 99999999999999999999 is out of range"},
        {"0:0.5", "moe bench: --skew HOT: 0 is out of range [1, "},
        {"129:0.5", "--skew 129:0.5: HOT = 129 must be below the 128 experts"},
        {"1:1", "--skew 1:1: 1 hot expert(s) can take at most 0.125 of the rows"},
        {"8:0.5:1", "--skew '8:0.5:1': expected HOT:SHARE"},
        {"8", "--skew '8': expected HOT:SHARE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        const char *a[] = {"bench", "--ep", "1", "--model", "qwen3-30b-a3b", "--skew", cases[i][0], "--tokens", "1",
                           "--iters", "1", NULL};
        const char *e[] = {cases[i][1], NULL};
        run_moe(&r, a);
        expect(&r, 2, e);
        assert_string_equal(r.out, "");
        result_free(&r);
    }
}

/* ---- moe run failures --------------------------------------------------------------- */

typedef struct run_fixture {
    char ck[512];
    char io[512];
    char in[700];
    char out[700];
} run_fixture;

static int run_setup(void **state)
{
    if (!moe_bin())
        return 0;
    run_fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    make_checkpoint(f->ck, sizeof f->ck);
    tu_tmpdir(f->io, sizeof f->io, "cli-run");
    snprintf(f->in, sizeof f->in, "%s/in.safetensors", f->io);
    snprintf(f->out, sizeof f->out, "%s/out/out.safetensors", f->io);
    char od[700];
    snprintf(od, sizeof od, "%s/out", f->io);
    mkdir(od, 0700);
    *state = f;
    return 0;
}

static int run_teardown(void **state)
{
    run_fixture *f = *state;
    if (f) {
        tu_rm_tree(f->ck);
        tu_rm_tree(f->io);
        free(f);
    }
    return 0;
}

static void expect_no_output(const run_fixture *f)
{
    if (access(f->out, F_OK) == 0)
        fail_msg("%s exists after a failed run", f->out);
    char od[700];
    snprintf(od, sizeof od, "%s/out", f->io);
    if (!dir_is_empty(od))
        fail_msg("%s holds files after a failed run", od);
}

static void test_run_missing_checkpoint(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 1));
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no-such-checkpoint", f->io);
    cli_result r;
    const char *a[] = {"run", "--checkpoint", missing, "--layer", "0", "--input", f->in,
                       "--output", f->out, NULL};
    const char *e[] = {"moe run: ", "no-such-checkpoint", NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    expect_no_output(f);
    result_free(&r);
}

static void test_run_no_config(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 1));
    char empty[700];
    snprintf(empty, sizeof empty, "%s/empty-ck", f->io);
    assert_int_equal(mkdir(empty, 0700), 0);
    cli_result r;
    const char *a[] = {"run", "--checkpoint", empty, "--layer", "0", "--input", f->in,
                       "--output", f->out, NULL};
    const char *e[] = {"moe run: ", "config.json", NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    expect_no_output(f);
    result_free(&r);
    rmdir(empty);
}

static void test_run_bad_width(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 3, CK_H - 1, MOE_DTYPE_F32, 2));
    cli_result r;
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in,
                       "--output", f->out, NULL};
    const char *e[] = {"moe run: ", "in.safetensors", "hidden_states", "31", "32", NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    expect_no_output(f);
    result_free(&r);
}

/* SIGINT while `moe run` writes its output: the process ends by the signal and the output
 * folder is left empty (no OUT, no OUT.tmp.XXXXXX). The input is large enough (2^20 tokens,
 * a 144 MiB output) that the write is seen under way. */
static void test_run_interrupt_leaves_nothing(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, (int64_t)1 << 20, CK_H, MOE_DTYPE_F32, 7));
    char od[700];
    snprintf(od, sizeof od, "%s/out", f->io);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        if (dn < 0 || dup2(dn, 1) < 0 || dup2(dn, 2) < 0)
            _exit(127);
        execl(moe_bin(), moe_bin(), "run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in,
              "--output", f->out, "--threads", "1", (char *)NULL);
        _exit(127);
    }
    /* poll the output folder until the write has started */
    int status = 0, seen = 0;
    const double t0 = now_s();
    while (!seen && now_s() - t0 < RUN_DEADLINE_S) {
        if (!dir_is_empty(od))
            seen = 1;
        else if (waitpid(pid, &status, WNOHANG) == pid)
            fail_msg("moe run ended (status 0x%x) before its output appeared", (unsigned)status);
        else
            usleep(200);
    }
    if (!seen) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("no output appeared in %s within %.0f s", od, RUN_DEADLINE_S);
    }
    assert_int_equal(kill(pid, SIGINT), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGINT)
        fail_msg("moe run did not end by SIGINT (status 0x%x)", (unsigned)status);
    expect_no_output(f);
}

/* --output in a folder that does not exist: the folder is named, before any work. */
static void test_run_output_folder_missing(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 1));
    char bad[800], dir[760];
    snprintf(dir, sizeof dir, "%s/nonexistent", f->io);
    snprintf(bad, sizeof bad, "%s/x.safetensors", dir);
    cli_result r;
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", bad, NULL};
    char want[800];
    snprintf(want, sizeof want, "folder %s does not exist", dir);
    const char *e[] = {"moe run: ", want, NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    assert_null(strstr(r.err, "temporary"));
    result_free(&r);
}

static void test_run_missing_tensor(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    /* a safetensors file without hidden_states */
    float v[4] = {1, 2, 3, 4};
    moe_tensor_out t;
    memset(&t, 0, sizeof t);
    t.name = "something_else";
    t.dtype = MOE_DTYPE_F32;
    t.ndim = 2;
    t.shape[0] = 1;
    t.shape[1] = 4;
    t.data = v;
    moe_ctx *ctx = tu_ctx();
    assert_int_equal(moe_safetensors_write(ctx, f->in, &t, 1), MOE_OK);
    moe_ctx_free(ctx);
    cli_result r;
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in,
                       "--output", f->out, NULL};
    const char *e[] = {"moe run: ", "hidden_states", NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    expect_no_output(f);
    result_free(&r);
}

static void test_run_layer_out_of_range(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 3));
    cli_result r;
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "7", "--input", f->in,
                       "--output", f->out, NULL};
    const char *e[] = {"moe run: ", "7", NULL};
    run_moe(&r, a);
    expect(&r, 1, e);
    if (!strstr(r.err, "layer") && !strstr(r.err, "Layer"))
        fail_msg("stderr does not name the layer:\n%s", r.err);
    expect_no_output(f);
    result_free(&r);
}

/* --output must not replace the input, a checkpoint file, or a non-regular file. */
static void test_run_refuses_outputs(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 5));
    struct stat before;
    assert_int_equal(stat(f->in, &before), 0);
    cli_result r;
    const char *a1[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", f->in, NULL};
    const char *e1[] = {"moe run: ", "is the input", NULL};
    run_moe(&r, a1);
    expect(&r, 1, e1);
    result_free(&r);
    struct stat after;
    assert_int_equal(stat(f->in, &after), 0);
    assert_true(before.st_ino == after.st_ino && before.st_size == after.st_size);

    char ckfile[700];
    snprintf(ckfile, sizeof ckfile, "%s/model.safetensors", f->ck);
    assert_int_equal(stat(ckfile, &before), 0);
    const char *a2[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", ckfile, NULL};
    const char *e2[] = {"moe run: ", "checkpoint's file", NULL};
    run_moe(&r, a2);
    expect(&r, 1, e2);
    result_free(&r);
    assert_int_equal(stat(ckfile, &after), 0);
    assert_true(before.st_ino == after.st_ino && before.st_size == after.st_size);

    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/fifo", f->io);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const char *a3[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", fifo, NULL};
    const char *e3[] = {"moe run: ", "not a regular file", "FIFO", NULL};
    run_moe(&r, a3);
    expect(&r, 1, e3);
    result_free(&r);
    struct stat sf;
    assert_int_equal(lstat(fifo, &sf), 0);
    assert_true(S_ISFIFO(sf.st_mode));
    unlink(fifo);

    /* a symlink is followed: the target is written and the link stays */
    char target[700], link_path[700];
    snprintf(target, sizeof target, "%s/out/target.safetensors", f->io);
    snprintf(link_path, sizeof link_path, "%s/link.safetensors", f->io);
    assert_int_equal(tu_write_file(target, "x", 1), 0);
    assert_int_equal(symlink(target, link_path), 0);
    const char *a4[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", link_path, NULL};
    run_moe(&r, a4);
    expect(&r, 0, NULL);
    result_free(&r);
    assert_int_equal(lstat(link_path, &sf), 0);
    assert_true(S_ISLNK(sf.st_mode));
    assert_int_equal(stat(target, &sf), 0);
    assert_true(sf.st_size > 100);
    unlink(link_path);
    unlink(target);
}

/* Issue 17: a FIFO as --input, as the checkpoint's config.json or as its model.safetensors
 * is refused (exit 1, the file and "is a FIFO" named), never opened for reading, which waits
 * for a writer forever: the run is killed and the test failed after 60 s if that regresses. */
static void test_run_refuses_fifo_inputs(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 6));
    char fifo[700], keep[700];
    snprintf(fifo, sizeof fifo, "%s/in-fifo.safetensors", f->io);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    cli_result r;
    const char *a1[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", fifo, "--output", f->out, NULL};
    const char *e1[] = {"moe run: ", fifo, "is a FIFO", "not a regular file", NULL};
    run_moe_within(&r, a1, 60);
    expect(&r, 1, e1);
    expect_no_output(f);
    result_free(&r);
    assert_int_equal(unlink(fifo), 0);

    static const char *const files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(fifo, sizeof fifo, "%s/%s", f->ck, files[i]);
        snprintf(keep, sizeof keep, "%s/keep-%s", f->io, files[i]);
        assert_int_equal(rename(fifo, keep), 0);
        assert_int_equal(mkfifo(fifo, 0600), 0);
        const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", f->out, NULL};
        const char *e[] = {"moe run: ", fifo, "is a FIFO", "not a regular file", NULL};
        run_moe_within(&r, a, 60);
        expect(&r, 1, e);
        expect_no_output(f);
        result_free(&r);
        assert_int_equal(unlink(fifo), 0);
        assert_int_equal(rename(keep, fifo), 0);
    }
}

/* moe env shows a misspelled knob with the right name and a bad value with what it accepts. */
static void test_env_command(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a[] = {"env", NULL};
    run_moe(&r, a);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "MOE_CHUNK_SIZE"));
    assert_non_null(strstr(r.out, "default"));
    result_free(&r);
    setenv("MOE_CHUNKSIZE", "4", 1);
    setenv("MOE_PERMUTE", "fast", 1);
    run_moe(&r, a);
    unsetenv("MOE_CHUNKSIZE");
    unsetenv("MOE_PERMUTE");
    expect(&r, 1, NULL);
    assert_non_null(strstr(r.out, "did you mean MOE_CHUNK_SIZE"));
    assert_non_null(strstr(r.out, "MOE_PERMUTE='fast' is not accepted: accepted values are auto, sort, onehot, packed"));
    result_free(&r);
    setenv("MOE_TOPK", "rowmax", 1);
    run_moe(&r, a);
    unsetenv("MOE_TOPK");
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "rowmax"));
    assert_non_null(strstr(r.out, "environment"));
    result_free(&r);
}

/* moe env marks a given value that cannot act ("(inert: why)" on its line, exit status 0) and
 * nothing when it can act (moe.h "Idle knobs"). */
static const char *line_of(const char *text, const char *start, char *buf, size_t len)
{
    const char *p = strstr(text, start);
    if (!p)
        fail_msg("no line starting %s in:\n%s", start, text);
    const char *nl = strchr(p, '\n');
    snprintf(buf, len, "%.*s", (int)(nl ? nl - p : (ptrdiff_t)strlen(p)), p);
    return buf;
}

static void test_env_inert(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    char line[1024];
    const char *a[] = {"env", NULL};
    setenv("MOE_ONEHOT_THRESHOLD", "9", 1);
    setenv("MOE_PERMUTE", "packed", 1);
    setenv("MOE_TP_REDUCE", "reduce_scatter", 1);
    setenv("MOE_SMALL_ALLREDUCE", "64", 1);
    run_moe(&r, a);
    expect(&r, 0, NULL);
    assert_non_null(strstr(line_of(r.out, "MOE_ONEHOT_THRESHOLD ", line, sizeof line),
                           " (inert: acts only when the permute knob is auto, and MOE_PERMUTE=packed)"));
    assert_non_null(strstr(line_of(r.out, "MOE_SMALL_ALLREDUCE ", line, sizeof line),
                           " (inert: acts only when the tp_reduce knob is allreduce"));
    assert_non_null(strstr(line_of(r.out, "MOE_TP_REDUCE ", line, sizeof line),
                           " (inert: acts only under tensor parallelism (parallel.tp_size > 1; the command line's --tp "
                           "> 1))"));
    assert_null(strstr(line_of(r.out, "MOE_PERMUTE ", line, sizeof line), "(inert"));
    result_free(&r);
    /* --json carries the same text */
    const char *aj[] = {"env", "--json", NULL};
    run_moe(&r, aj);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "\"inert\": \"acts only when the permute knob is auto, and MOE_PERMUTE=packed\""));
    result_free(&r);
    /* permute auto: the threshold acts, no mark */
    setenv("MOE_PERMUTE", "auto", 1);
    unsetenv("MOE_TP_REDUCE");
    unsetenv("MOE_SMALL_ALLREDUCE");
    run_moe(&r, a);
    unsetenv("MOE_ONEHOT_THRESHOLD");
    unsetenv("MOE_PERMUTE");
    expect(&r, 0, NULL);
    assert_null(strstr(r.out, "(inert"));
    result_free(&r);
}

/* moe plan: zero padding and exact bytes per rank for bf16 Qwen3.5 at TP 4 and 8; the fp8
 * block cut is stated. Bytes: E * 3 * H * (I / tp) * 2 = 256 * 3 * 2048 * 128 * 2. */
static void test_plan_command(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a4[] = {"plan", "--model", "qwen3.5-35b-a3b", "--tp", "4", NULL};
    run_moe(&r, a4);
    expect(&r, 0, NULL);
    char want[64];
    snprintf(want, sizeof want, "%lld", 256LL * 3 * 2048 * 128 * 2);
    assert_non_null(strstr(r.out, want));
    assert_null(strstr(r.out, "padding intermediate"));
    result_free(&r);
    const char *a8[] = {"plan", "--model", "qwen3.5-35b-a3b", "--tp", "8", NULL};
    run_moe(&r, a8);
    expect(&r, 0, NULL);
    snprintf(want, sizeof want, "%lld", 256LL * 3 * 2048 * 64 * 2);
    assert_non_null(strstr(r.out, want));
    result_free(&r);
    const char *af[] = {"plan", "--model", "qwen3.5-35b-a3b", "--tp", "8", "--quant", "fp8-block", NULL};
    run_moe(&r, af);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "WARNING: fp8-block scale cells cut by the TP split (I 64 per shard)"));
    result_free(&r);
    const char *bad[] = {"plan", "--model", "qwen3.5-35b-a3b", "--quant", "int3", NULL};
    const char *e[] = {"int3", "fp8-block", NULL};
    run_moe(&r, bad);
    expect(&r, 2, e);
    result_free(&r);

    /* quantized checkpoints (gpt-oss MXFP4, compressed-tensors int4 with zero points): the
     * scheme is named, and expert + scale bytes are what the library packs
     * (moe_weights_expert_bytes), codes = E * 3 * H * I / 2 */
    const char *qfx[] = {"gpt_oss_mxfp4", "qwen3_moe_ct_w4a16_zp"};
    const char *qname[] = {"weights mxfp4", "weights int4-g32-zp"};
    for (int f = 0; f < 2; f++) {
        char dir[1024];
        tu_data_path(dir, sizeof dir, qfx[f]);
        moe_ctx *ctx = tu_ctx();
        moe_checkpoint *ck = NULL;
        assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
        moe_layer_desc d;
        assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
        moe_plan *plan = NULL;
        assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
        moe_weights *w = NULL;
        assert_int_equal(moe_checkpoint_load_weights(ck, 0, plan, &w), MOE_OK);
        const long long codes = (long long)(d.num_experts * 3 * d.hidden_size * d.moe_intermediate_size / 2);
        const long long packed = (long long)moe_weights_expert_bytes(w);
        moe_weights_free(w);
        moe_plan_free(plan);
        moe_checkpoint_free(ck);
        moe_ctx_free(ctx);
        const char *am[] = {"plan", "--checkpoint", dir, NULL};
        run_moe(&r, am);
        expect(&r, 0, NULL);
        if (!strstr(r.out, qname[f]))
            fail_msg("moe plan %s: '%s' not in:\n%s", qfx[f], qname[f], r.out);
        char row[128];
        snprintf(row, sizeof row, " %lld              0 %14lld ", codes, packed - codes);
        if (!strstr(r.out, row))
            fail_msg("moe plan %s: no row with expert bytes %lld and scale bytes %lld (packed %lld):\n%s", qfx[f],
                     codes, packed - codes, packed, r.out);
        if (f == 0)
            result_free(&r);
    }
    result_free(&r);
}

/* moe plan --placement / --redundant / --load (issue 18): on the skewed load (128
 * experts, the hottest 8 take half the rows) the imbalance lines are the library's
 * (moe_placement_rank_rows), the redundancy is a WARNING line sized 8 experts' bf16 bytes
 * (3 * H * I * 2 each), a placement file is read, and bad arguments exit 2 naming them. */
static void test_plan_placement(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    char dir[1024], loadf[1100], plf[1100], shortf[1100];
    tu_tmpdir(dir, sizeof dir, "cli-placement");
    snprintf(loadf, sizeof loadf, "%s/load.json", dir);
    snprintf(plf, sizeof plf, "%s/rr.json", dir);
    snprintf(shortf, sizeof shortf, "%s/short.json", dir);
    moe_ctx *ctx = tu_ctx();
    int64_t load[128];
    for (int e = 0; e < 128; e++)
        load[e] = e < 8 ? 15000 : 1000;
    assert_int_equal(moe_load_write(ctx, loadf, load, 128), MOE_OK);
    assert_int_equal(moe_load_write(ctx, shortf, load, 3), MOE_OK);
    int32_t p2l[136], rn[2], c2l[128], crn[2];
    moe_placement bal, con, rr;
    assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 128, 2, 8, load, p2l, rn, &bal), MOE_OK);
    assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, 128, 2, 0, NULL, c2l, crn, &con), MOE_OK);
    int64_t rows[2];
    double ib, ic;
    assert_int_equal(moe_placement_rank_rows(ctx, &bal, load, rows, &ib), MOE_OK);
    assert_int_equal(moe_placement_rank_rows(ctx, &con, load, rows, &ic), MOE_OK);
    assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, 128, 2, 0, NULL, c2l, crn, &rr), MOE_OK);
    assert_int_equal(moe_placement_write(ctx, plf, &rr), MOE_OK);
    moe_ctx_free(ctx);

    cli_result r;
    const char *ab[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement", "balanced",
                        "--redundant", "8", "--load", loadf, NULL};
    run_moe(&r, ab);
    expect(&r, 0, NULL);
    char want[256];
    snprintf(want, sizeof want, ": %.3f with balanced; contiguous: %.3f", ib, ic);
    if (!strstr(r.out, want))
        fail_msg("'%s' not in:\n%s", want, r.out);
    assert_true(ib <= 1.15 && ic > 1.4);
    /* 8 replicas of 3 * 2048 * 768 bf16 values: 75497472 bytes */
    if (!strstr(r.out, "WARNING: 8 redundant experts (replicas) add expert weights: 75.5 MB over all ranks"))
        fail_msg("no redundancy WARNING in:\n%s", r.out);
    assert_non_null(strstr(r.out, "136 physical experts = 128 logical + 8 redundant on 2 EP ranks"));
    result_free(&r);

    const char *af[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement", plf, NULL};
    run_moe(&r, af);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "  0,2,4,6,8,"));
    assert_null(strstr(r.out, "redundant experts (replicas)"));
    result_free(&r);

    const char *e1[] = {"--placement balanced needs --load FILE", NULL};
    const char *b1[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement", "balanced", NULL};
    run_moe(&r, b1);
    expect(&r, 2, e1);
    result_free(&r);
    const char *e2[] = {"--redundant needs --placement balanced", NULL};
    const char *b2[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--redundant", "4", NULL};
    run_moe(&r, b2);
    expect(&r, 2, e2);
    result_free(&r);
    const char *e3[] = {"--load", "short.json", "num_logical_experts = 3", NULL};
    const char *b3[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--load", shortf, NULL};
    run_moe(&r, b3);
    expect(&r, 2, e3);
    assert_null(strstr(r.out, "plan:")); /* nothing printed before the error */
    result_free(&r);
    const char *e4[] = {"rr.json", "2 ranks", "--ep 4", NULL};
    const char *b4[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "4", "--placement", plf, NULL};
    run_moe(&r, b4);
    expect(&r, 2, e4);
    result_free(&r);
    /* empty values, a mistyped policy, and file-content errors (no policy hint on those) */
    char badpl[1100];
    snprintf(badpl, sizeof badpl, "%s/extra.json", dir);
    const char *extra = "{\"ep_size\": 2, \"num_logical_experts\": 128, \"ranks\": [[0], [1]], \"rank\": 1}";
    assert_int_equal(tu_write_file(badpl, extra, strlen(extra)), 0);
    static const char *const pcases[][3] = {
        {"--placement", "", "moe plan: --placement: an empty value; give a policy (contiguous, round_robin or balanced)"},
        {"--placement", "balance", "--placement balance: balance: not found; it is not a policy name either (did you "
                                   "mean balanced?)"},
        {"--placement", NULL, "moe plan: --placement: "},
        {"--load", "", "moe plan: --load: an empty value; give the path of a load file"},
    };
    for (size_t i = 0; i < sizeof pcases / sizeof pcases[0]; i++) {
        const char *bx[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement", "contiguous",
                            pcases[i][0], pcases[i][1] ? pcases[i][1] : badpl, NULL};
        const char *ex[] = {pcases[i][2], NULL};
        run_moe(&r, bx);
        expect(&r, 2, ex);
        if (!pcases[i][1] && (!strstr(r.err, "extra.json: unknown field \"rank\"") || strstr(r.err, "or give")))
            fail_msg("placement file error: %s", r.err);
        assert_string_equal(r.out, "");
        result_free(&r);
    }
    /* --placement-out writes the placement reported: read back, it is the policy's own */
    char outpl[1100];
    snprintf(outpl, sizeof outpl, "%s/out.json", dir);
    const char *bo[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement", "balanced", "--redundant", "8",
                        "--load", loadf, "--placement-out", outpl, NULL};
    const char *eo[] = {NULL};
    run_moe(&r, bo);
    expect(&r, 0, eo);
    assert_non_null(strstr(r.out, "placement balanced written to"));
    assert_non_null(strstr(r.out, "the table below is that contiguous split"));
    result_free(&r);
    moe_placement back;
    ctx = tu_ctx();
    assert_int_equal(moe_placement_read(ctx, outpl, &back), MOE_OK);
    moe_ctx_free(ctx);
    assert_int_equal(back.ep_size, bal.ep_size);
    assert_int_equal(back.num_physical_experts, bal.num_physical_experts);
    assert_memory_equal(back.rank_num_physical, bal.rank_num_physical, sizeof(int32_t) * 2);
    assert_memory_equal(back.physical_to_logical, bal.physical_to_logical,
                        sizeof(int32_t) * (size_t)bal.num_physical_experts);
    moe_placement_clear(&back);
    const char *bo2[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement-out", "/nonexistent-libmoe/p.json",
                         NULL};
    const char *eo2[] = {"--placement-out /nonexistent-libmoe/p.json: the folder /nonexistent-libmoe does not exist",
                         NULL};
    run_moe(&r, bo2);
    expect(&r, 2, eo2);
    assert_string_equal(r.out, "");
    result_free(&r);
    const char *e5[] = {"num_redundant_experts = 200", "[0, 128]", NULL};
    const char *b5[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--placement", "balanced",
                        "--redundant", "200", "--load", loadf, NULL};
    run_moe(&r, b5);
    expect(&r, 2, e5);
    result_free(&r);
}

/* moe run (one process, no TP) with MOE_TP_REDUCE set: one WARNING on stderr naming it, and
 * none without it. */
static void test_run_idle_tp_knob(void **state)
{
    run_fixture *f = *state;
    SKIP_WITHOUT_BIN();
    free(make_input(f->in, 3, CK_H, MOE_DTYPE_F32, 7));
    cli_result r;
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", f->out, NULL};
    const char *want = "MOE_TP_REDUCE=reduce_scatter has no effect: it acts only under tensor parallelism";
    setenv("MOE_TP_REDUCE", "reduce_scatter", 1);
    run_moe(&r, a);
    unsetenv("MOE_TP_REDUCE");
    expect(&r, 0, NULL);
    const char *p = strstr(r.err, want);
    if (!p || strstr(p + 1, want))
        fail_msg("expected the warning \"%s\" once on stderr:\n%s", want, r.err);
    result_free(&r);
    run_moe(&r, a);
    expect(&r, 0, NULL);
    assert_null(strstr(r.err, "has no effect"));
    result_free(&r);
}

/* moe run --placement takes a file: a policy name is refused (exit 2) with the moe plan
 * command that writes one, and nothing is written. */
static void test_run_placement_policy_name(void **state)
{
    run_fixture *f = *state;
    SKIP_WITHOUT_BIN();
    free(make_input(f->in, 3, CK_H, MOE_DTYPE_F32, 7));
    static const char *const names[] = {"balanced", "round_robin", "contiguous"};
    for (size_t i = 0; i < 3; i++) {
        cli_result r;
        const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", f->out,
                           "--placement", names[i], NULL};
        char want[256];
        snprintf(want, sizeof want, "--placement %s: moe run takes a placement file, not a policy name; write one "
                                    "with moe plan --checkpoint", names[i]);
        const char *e[] = {want, "--placement-out FILE", NULL};
        run_moe(&r, a);
        expect(&r, 2, e);
        if ((strstr(r.err, "--load LOAD") != NULL) != (i == 0))
            fail_msg("--load LOAD is named for balanced only: %s", r.err);
        expect_no_output(f);
        result_free(&r);
    }
}

/* ---- moe run success: bitwise equal to a direct execute --------------------------------- */

static void check_run_matches(run_fixture *f, moe_dtype in_dt, int64_t layer, int64_t T)
{
    float *x = make_input(f->in, T, CK_H, in_dt, 40 + (uint64_t)T);
    char lay[32];
    snprintf(lay, sizeof lay, "%lld", (long long)layer);
    cli_result r;
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", lay, "--input", f->in,
                       "--output", f->out, "--threads", "2", NULL};
    run_moe(&r, a);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.err, "qwen3_moe"));
    result_free(&r);

    /* the reference: the same checkpoint through the API */
    moe_ctx *ctx = tu_ctx();
    moe_checkpoint *ck = NULL;
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_layer_desc desc;
    if (moe_checkpoint_open(ctx, f->ck, &ck) != MOE_OK ||
        moe_checkpoint_layer_desc(ck, layer, &desc) != MOE_OK ||
        moe_plan_create(ctx, &desc, &plan) != MOE_OK ||
        moe_checkpoint_load_weights(ck, layer, plan, &w) != MOE_OK)
        fail_msg("reference setup: %s", moe_ctx_last_error(ctx));
    assert_int_equal(desc.hidden_size, CK_H);
    assert_int_equal(desc.top_k, CK_K);
    size_t ws_size = moe_plan_workspace_size(plan, T);
    void *ws = ws_size ? aligned_alloc(64, (ws_size + 63) / 64 * 64) : NULL;
    float *out = calloc((size_t)(T * CK_H), sizeof(float));
    int32_t *ids = calloc((size_t)(T * CK_K), sizeof(int32_t));
    float *tw = calloc((size_t)(T * CK_K), sizeof(float));
    uint16_t *xb = malloc((size_t)(T * CK_H) * sizeof(uint16_t));
    assert_non_null(out);
    assert_non_null(ids);
    assert_non_null(tw);
    assert_non_null(xb);
    for (int64_t i = 0; i < T * CK_H; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        xb[i] = (uint16_t)(u >> 16); /* exact: x holds bf16 values when in_dt is BF16 */
    }
    moe_exec_args ea;
    memset(&ea, 0, sizeof ea);
    ea.hidden_states = in_dt == MOE_DTYPE_BF16 ? (const void *)xb : (const void *)x;
    ea.hidden_dtype = in_dt;
    ea.n_tokens = T;
    ea.output = out;
    ea.topk_ids = ids;
    ea.topk_weights = tw;
    ea.workspace = ws;
    ea.workspace_size = ws_size;
    if (moe_plan_execute_ex(plan, w, &ea) != MOE_OK)
        fail_msg("reference execute: %s", moe_ctx_last_error(ctx));

    moe_safetensors *sf = NULL;
    if (moe_safetensors_open(ctx, f->out, &sf) != MOE_OK)
        fail_msg("reading %s: %s", f->out, moe_ctx_last_error(ctx));
    moe_tensor_info ti;
    assert_int_equal(moe_safetensors_get(sf, "output", &ti), MOE_OK);
    assert_int_equal(ti.dtype, MOE_DTYPE_F32);
    assert_int_equal(ti.ndim, 2);
    assert_int_equal(ti.shape[0], T);
    assert_int_equal(ti.shape[1], CK_H);
    assert_int_equal(ti.nbytes, (size_t)(T * CK_H) * sizeof(float));
    assert_memory_equal(ti.data, out, ti.nbytes);
    assert_int_equal(moe_safetensors_get(sf, "topk_ids", &ti), MOE_OK);
    assert_int_equal(ti.dtype, MOE_DTYPE_I32);
    assert_int_equal(ti.shape[1], CK_K);
    assert_memory_equal(ti.data, ids, (size_t)(T * CK_K) * sizeof(int32_t));
    assert_int_equal(moe_safetensors_get(sf, "topk_weights", &ti), MOE_OK);
    assert_int_equal(ti.dtype, MOE_DTYPE_F32);
    assert_memory_equal(ti.data, tw, (size_t)(T * CK_K) * sizeof(float));
    /* and the output is not trivially zero */
    assert_true(tu_max_abs(out, (size_t)(T * CK_H)) > 0.0);

    moe_safetensors_free(sf);
    free(xb);
    free(tw);
    free(ids);
    free(out);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
    free(x);
    unlink(f->out);
}

/* A flag given "=VALUE" is a usage error in every command (--force=no must not mean force). */
static void test_flag_takes_no_value(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cases[][5] = {
        {"env", "--json=1", NULL, NULL, "option --json takes no value"},
        {"quantize", "--force=no", NULL, NULL, "option --force takes no value"},
        {"bench", "--ep", "1", "--low-latency=0", "option --low-latency takes no value"},
        {"bench", "--json=0", NULL, NULL, "option --json takes no value"},
        {"bench", "--list-models=1", NULL, NULL, "option --list-models takes no value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        const char *a[] = {cases[i][0], cases[i][1], cases[i][2], cases[i][3], NULL};
        const char *e[] = {cases[i][4], NULL};
        run_moe(&r, a);
        expect(&r, 2, e);
        assert_string_equal(r.out, "");
        result_free(&r);
    }
}

/* The option errors every subcommand reports through its option table: the exact stderr and
 * exit 2, nothing on stdout; -h / --help: the command's usage on stdout, exit 0. */
static void test_option_errors(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cases[][5] = {
        {"run", "--layer", NULL, NULL, "moe run: option --layer needs a value (see 'moe run --help')\n"},
        {"run", "--checkpoint=", NULL, NULL, "moe run: --checkpoint: empty path\n"},
        {"run", "--threads", "4097", NULL, "moe run: --threads: 4097 is out of range [1, 4096]\n"},
        {"bench", "--iters", "0", NULL, "moe bench: --iters: 0 is out of range [1, 100000]\n"},
        {"bench", "--min-time", "1e9", NULL, "moe bench: --min-time: 1e9 is out of range [0.001, 3600]\n"},
        {"bench", "--mem-limit", "0", NULL, "moe bench: --mem-limit: must be more than 0\n"},
        {"bench", "--threads", "2", "--frob=1", "moe bench: unknown option '--frob' (see 'moe bench --help')\n"},
        {"bench", "--ep", "1", "--seed=-1", "moe bench: --seed: -1 is out of range [0, 1073741824]\n"},
        {"bench", "--ep", "1", "--dispatch-dtype=bf16",
         "moe bench: --dispatch-dtype: 'bf16' is not one of f32, fp8, int8\n"},
        {"plan", "--tp=x", NULL, NULL, "moe plan: --tp: 'x' is not an integer\n"},
        {"quantize", "--quant", NULL, NULL, "moe quantize: option --quant needs a value (see 'moe quantize --help')\n"},
        {"env", "stray", NULL, NULL, "moe env: unexpected argument 'stray' (see 'moe env --help')\n"},
        {"version", "stray", NULL, NULL, "moe version: unexpected argument 'stray' (see 'moe version --help')\n"},
        {"version", "--bogus=1", NULL, NULL, "moe version: unknown option '--bogus' (see 'moe version --help')\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        const char *a[] = {cases[i][0], cases[i][1], cases[i][2], cases[i][3], NULL};
        run_moe(&r, a);
        expect(&r, 2, NULL);
        assert_string_equal(r.err, cases[i][4]);
        assert_string_equal(r.out, "");
        result_free(&r);
    }
    static const char *const helps[][4] = {
        {"run", "-h", NULL, "usage: moe run "},
        {"bench", "--help", NULL, "usage: moe bench "},
        {"bench", "--ep=1", "-h", "usage: mpirun -np N*M moe bench "},
        {"plan", "-h", NULL, "usage: moe plan "},
        {"quantize", "--help", NULL, "usage: moe quantize "},
        {"env", "-h", NULL, "usage: moe env "},
        {"version", "--help", NULL, "usage: moe version\n"},
    };
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        cli_result r;
        const char *a[] = {helps[i][0], helps[i][1], helps[i][2], NULL};
        run_moe(&r, a);
        expect(&r, 0, NULL);
        if (strncmp(r.out, helps[i][3], strlen(helps[i][3])) != 0)
            fail_msg("moe %s %s: stdout does not start with \"%s\":\n%s", helps[i][0], helps[i][1], helps[i][3], r.out);
        assert_string_equal(r.err, "");
        result_free(&r);
    }
}

/* The f32 tensor `name` [rows, cols] of safetensors file `path` (a copy; the caller frees). */
static float *read_f32(const char *path, const char *name, int64_t rows, int64_t cols)
{
    moe_ctx *ctx = tu_ctx();
    moe_safetensors *sf = NULL;
    if (moe_safetensors_open(ctx, path, &sf) != MOE_OK)
        fail_msg("reading %s: %s", path, moe_ctx_last_error(ctx));
    moe_tensor_info ti;
    assert_int_equal(moe_safetensors_get(sf, name, &ti), MOE_OK);
    assert_int_equal(ti.dtype, MOE_DTYPE_F32);
    assert_int_equal(ti.ndim, 2);
    assert_int_equal(ti.shape[0], rows);
    assert_int_equal(ti.shape[1], cols);
    float *v = malloc(ti.nbytes);
    assert_non_null(v);
    memcpy(v, ti.data, ti.nbytes);
    moe_safetensors_free(sf);
    moe_ctx_free(ctx);
    return v;
}

/* moe run --compute bf16 on the bf16 fixture qwen3_moe_bf16 against --compute f32: the same
 * routing (f32 in both modes: ids and weights bit for bit), an output that differs, and by no
 * more than docs/numerics.md section 7 allows. The input and weights are bf16, so the bf16 mode
 * departs from the exact layer only by rounding h before the down projection and its f32 sums:
 * |bf16 - exact| <= 1.05 u P / 3 + 1e-5 max |expected| (u = 2^-8, P the fixture's bound_path,
 * as test_fixtures checks), and the f32 mode is within 1e-5 max |expected| of the exact layer
 * (HF in f32), so the two runs differ by at most 1.05 u P / 3 + 2e-5 max |expected|. */
static void test_run_compute_bf16(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    char fx[1024], in[1100], exp32[1100], exp16[1100], out32[720], out16[720];
    tu_data_path(fx, sizeof fx, "qwen3_moe_bf16");
    snprintf(in, sizeof in, "%s/input.safetensors", fx);
    snprintf(exp32, sizeof exp32, "%s/expected.safetensors", fx);
    snprintf(exp16, sizeof exp16, "%s/expected_bf16.safetensors", fx);
    snprintf(out32, sizeof out32, "%s/out/f32.safetensors", f->io);
    snprintf(out16, sizeof out16, "%s/out/bf16.safetensors", f->io);
    static const char *const modes[2] = {"f32", "bf16"};
    const char *outs[2] = {out32, out16};
    for (int m = 0; m < 2; m++) {
        cli_result r;
        const char *a[] = {"run", "--checkpoint", fx, "--layer", "0", "--input", in, "--output", outs[m],
                           "--threads", "2", "--compute", modes[m], NULL};
        run_moe(&r, a);
        expect(&r, 0, NULL);
        char want[32];
        snprintf(want, sizeof want, " compute %s ", modes[m]);
        if (!strstr(r.err, want))
            fail_msg("the summary line does not name the compute mode (\"%s\"):\n%s", want, r.err);
        result_free(&r);
    }
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, fx, 0, &d);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
    const int64_t H = d.hidden_size, K = d.top_k;
    moe_safetensors *sf = NULL;
    ctx = tu_ctx();
    assert_int_equal(moe_safetensors_open(ctx, in, &sf), MOE_OK);
    moe_tensor_info ti;
    assert_int_equal(moe_safetensors_get(sf, "hidden_states", &ti), MOE_OK);
    const int64_t T = ti.shape[0];
    moe_safetensors_free(sf);
    moe_ctx_free(ctx);

    float *y32 = read_f32(out32, "output", T, H), *y16 = read_f32(out16, "output", T, H);
    float *w32 = read_f32(out32, "topk_weights", T, K), *w16 = read_f32(out16, "topk_weights", T, K);
    float *hf = read_f32(exp32, "output", T, H), *P = read_f32(exp16, "bound_path", T, H);
    assert_memory_equal(w32, w16, (size_t)(T * K) * sizeof(float));
    const size_t n = (size_t)(T * H);
    const double u = 1.0 / 256.0, f32_abs = 1e-5 * tu_max_abs(hf, n);
    double worst = 0.0;
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)y16[i] - (double)y32[i]);
        const double bound = 1.05 * u * (double)P[i] / 3.0 + 2.0 * f32_abs;
        if (!(err <= bound))
            fail_msg("output[%zu]: |bf16 - f32| = %.4e > bound %.4e", i, err, bound);
        worst = fmax(worst, err / bound);
        differ += tu_f32_bits(y16[i]) != tu_f32_bits(y32[i]);
    }
    if (differ == 0)
        fail_msg("--compute bf16 wrote exactly the f32 output");
    print_message("compute bf16 vs f32: %zu of %zu elements differ, worst |diff| / bound %.3f, max |diff| %.3e u "
                  "max|out|\n", differ, n, worst, tu_max_abs_diff(y16, y32, n) / (u * tu_max_abs(y32, n)));
    free(y32);
    free(y16);
    free(w32);
    free(w16);
    free(hf);
    free(P);
    unlink(out32);
    unlink(out16);
}

/* Compute bf16 on a table without avx512_bf16 (MOE_ISA=avx2, MOE_ISA=ref): run and plan succeed,
 * with the same bits as the default table, and each says once which feature is missing. */
static void test_compute_bf16_without_avx512_bf16(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    char fx[1024], in[1100], base[720], out[720];
    tu_data_path(fx, sizeof fx, "qwen3_moe_bf16");
    snprintf(in, sizeof in, "%s/input.safetensors", fx);
    snprintf(base, sizeof base, "%s/out/auto.safetensors", f->io);
    snprintf(out, sizeof out, "%s/out/isa.safetensors", f->io);
    cli_result r;
    const char *a0[] = {"run", "--checkpoint", fx, "--layer", "0", "--input", in, "--output", base, "--compute", "bf16",
                        NULL};
    run_moe(&r, a0);
    expect(&r, 0, NULL);
    result_free(&r);
    static const char *const isas[] = {"avx2", "ref"};
    int ran = 0;
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!tu_table_ok(tu_table(isas[i])))
            continue;
        char want[128];
        snprintf(want, sizeof want, "compute bf16 on kernel table %s", isas[i]);
        setenv("MOE_ISA", isas[i], 1);
        const char *a[] = {"run", "--checkpoint", fx, "--layer", "0", "--input", in, "--output", out, "--compute",
                           "bf16", NULL};
        const char *e[] = {"warning: ", want, "avx512_bf16", NULL};
        run_moe(&r, a);
        expect(&r, 0, e);
        result_free(&r);
        const char *p[] = {"plan", "--checkpoint", fx, "--compute", "bf16", NULL};
        run_moe(&r, p);
        unsetenv("MOE_ISA");
        expect(&r, 0, NULL);
        if (!strstr(r.out, "WARNING: ") || !strstr(r.out, want) || !strstr(r.out, "avx512_bf16") ||
            !strstr(r.out, "compute bf16"))
            fail_msg("MOE_ISA=%s moe plan --compute bf16: no WARNING naming the missing avx512_bf16:\n%s", isas[i],
                     r.out);
        result_free(&r);
        char *x = slurp(base), *y = slurp(out);
        struct stat sb, so;
        assert_int_equal(stat(base, &sb), 0);
        assert_int_equal(stat(out, &so), 0);
        assert_true(sb.st_size == so.st_size);
        assert_memory_equal(x, y, (size_t)sb.st_size);
        free(x);
        free(y);
        unlink(out);
        ran++;
    }
    print_message("tables without avx512_bf16 checked: %d\n", ran);
    unlink(base);
}

static void test_run_matches_api_f32(void **state)
{
    SKIP_WITHOUT_BIN();
    check_run_matches(*state, MOE_DTYPE_F32, 0, 5);
}

static void test_run_matches_api_bf16(void **state)
{
    SKIP_WITHOUT_BIN();
    check_run_matches(*state, MOE_DTYPE_BF16, 1, 17);
}

/* `moe tune` on a tiny checkpoint writes a valid tuning file named for the shape, which `moe run`
 * (same output bits) and `moe plan` then pick up through MOE_TUNING_DIR; no output folder is a
 * usage error. */
static void test_tune_command(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    char tdir[512];
    tu_tmpdir(tdir, sizeof tdir, "cli-tune");
    unsetenv("MOE_TUNING_DIR");
    cli_result r;
    const char *a0[] = {"tune", "--checkpoint", f->ck, "--tokens", "1", "--threads", "1", NULL};
    run_moe(&r, a0);
    expect(&r, 2, (const char *const[]){"no output folder", "MOE_TUNING_DIR", NULL});
    result_free(&r);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/none", tdir);
    const char *a1[] = {"tune", "--checkpoint", f->ck, "--tokens", "1", "--output", missing, NULL};
    run_moe(&r, a1);
    expect(&r, 2, (const char *const[]){missing, "not an existing folder", NULL});
    result_free(&r);
    assert_int_equal(tu_dir_entries(tdir), 0);

    const char *a2[] = {"tune", "--checkpoint", f->ck, "--tokens", "1,5", "--iters", "3", "--threads", "1",
                        "--output", tdir, NULL};
    run_moe(&r, a2);
    expect(&r, 0, NULL);
    print_message("moe tune: %.2f s\n", r.secs); /* one thread: ~0.5 s on an idle machine */
    /* the user set no knob: the candidates the tuner tries must not read as idle user knobs
     * ("moe_options.onehot_threshold=256 has no effect ... permute=sort") */
    if (strstr(r.err, "has no effect") || strstr(r.out, "has no effect"))
        fail_msg("moe tune warns of an idle knob nobody set:\nstdout:\n%s\nstderr:\n%s", r.out, r.err);
    result_free(&r);
    assert_int_equal(tu_dir_entries(tdir), 1); /* no temporary left */

    /* the name the library looks up */
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 1;
    o.tuning_dir = "";
    moe_ctx *ctx = NULL;
    char err[512];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    moe_checkpoint *ck = NULL;
    moe_layer_desc d;
    moe_plan *plan = NULL;
    if (moe_checkpoint_open(ctx, f->ck, &ck) != MOE_OK || moe_checkpoint_layer_desc(ck, 0, &d) != MOE_OK ||
        moe_plan_create(ctx, &d, &plan) != MOE_OK)
        fail_msg("%s", moe_ctx_last_error(ctx));
    char name[1024], path[1600];
    assert_int_equal(moe_plan_tuning_name(plan, name, sizeof name), MOE_OK);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
    snprintf(path, sizeof path, "%s/%s", tdir, name);

    /* a full disk: the tuner's temporary (tools/tune.c: DIR/.NAME.tmpPID) made a symlink to
     * /dev/full before the child execs, so its pid is known: the errno is named, the old
     * file is kept and no temporary is left */
    if (access("/dev/full", W_OK) == 0) {
        int nb = tu_dir_entries(tdir);
        struct stat s0;
        assert_int_equal(stat(path, &s0), 0);
        char errp[700];
        snprintf(errp, sizeof errp, "%s/../tune-full-stderr.%ld", tdir, (long)getpid());
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            char tmp[1800];
            snprintf(tmp, sizeof tmp, "%s/.%s.tmp%ld", tdir, name, (long)getpid());
            int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600), dn = open("/dev/null", O_WRONLY);
            if (symlink("/dev/full", tmp) != 0 || fe < 0 || dn < 0 || dup2(dn, 1) < 0 || dup2(fe, 2) < 0)
                _exit(127);
            execl(moe_bin(), moe_bin(), "tune", "--checkpoint", f->ck, "--tokens", "1", "--iters", "2", "--threads",
                  "1", "--output", tdir, (char *)NULL);
            _exit(127);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        char *err = slurp(errp);
        unlink(errp);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 1 || !strstr(err, "writing failed: ") ||
            !strstr(err, strerror(ENOSPC)))
            fail_msg("moe tune on a full disk: status 0x%x, stderr:\n%s", (unsigned)status, err);
        free(err);
        assert_int_equal(tu_dir_entries(tdir), nb);
        struct stat s1;
        assert_int_equal(stat(path, &s1), 0);
        assert_int_equal(s1.st_size, s0.st_size);
    }
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        fail_msg("%s: %s", path, je.text);
    assert_int_equal(json_object_size(root), 3);
    const char *keys[] = {"1", "5"};
    for (int i = 0; i < 2; i++) {
        json_t *e = json_object_get(root, keys[i]);
        assert_non_null(e);
        assert_int_equal(json_object_size(e), 5);
        assert_true(json_integer_value(json_object_get(e, "chunk_size")) >= 1);
        const char *pm = json_string_value(json_object_get(e, "permute"));
        const char *tk = json_string_value(json_object_get(e, "topk"));
        assert_non_null(pm);
        assert_non_null(tk);
        assert_true(!strcmp(pm, "auto") || !strcmp(pm, "sort") || !strcmp(pm, "onehot") || !strcmp(pm, "packed"));
        assert_true(!strcmp(tk, "sort") || !strcmp(tk, "rowmax"));
        assert_true(json_is_integer(json_object_get(e, "onehot_threshold")));
        assert_true(json_is_integer(json_object_get(e, "lowtok_threshold")));
    }
    json_t *meta = json_object_get(root, "meta");
    assert_int_equal(json_integer_value(json_object_get(meta, "threads")), 1);
    assert_non_null(json_object_get(json_object_get(meta, "measured"), "5"));
    json_decref(root);

    /* moe run picks it up; the bits are those without it */
    float *x = make_input(f->in, 5, CK_H, MOE_DTYPE_F32, 77);
    free(x);
    char out2[700];
    snprintf(out2, sizeof out2, "%s/out/plain.safetensors", f->io);
    const char *a3[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", out2, "--threads",
                        "1", NULL};
    run_moe(&r, a3);
    expect(&r, 0, NULL);
    assert_null(strstr(r.err, "tuning file"));
    result_free(&r);
    assert_int_equal(setenv("MOE_TUNING_DIR", tdir, 1), 0);
    const char *a4[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", f->out,
                        "--threads", "1", NULL};
    run_moe(&r, a4);
    char want[1800];
    snprintf(want, sizeof want, "tuning file %s, entry 5 ", path);
    expect(&r, 0, (const char *const[]){want, NULL});
    assert_null(strstr(r.err, "has no effect"));
    result_free(&r);
    char *b1 = slurp(out2), *b2 = slurp(f->out);
    struct stat s1, s2;
    assert_int_equal(stat(out2, &s1), 0);
    assert_int_equal(stat(f->out, &s2), 0);
    assert_true(s1.st_size == s2.st_size && s1.st_size > 0);
    assert_memory_equal(b1, b2, (size_t)s1.st_size);
    free(b1);
    free(b2);
    unlink(out2);
    unlink(f->out);

    /* moe plan names the file and the entry each T runs */
    assert_int_equal(setenv("MOE_NUM_THREADS", "1", 1), 0);
    const char *a5[] = {"plan", "--checkpoint", f->ck, "--tokens", "1,4", NULL};
    run_moe(&r, a5);
    unsetenv("MOE_NUM_THREADS");
    unsetenv("MOE_TUNING_DIR");
    expect(&r, 0, NULL);
    snprintf(want, sizeof want, "tuning: %s", path);
    if (!strstr(r.out, want) || !strstr(r.out, "plan text: tuned=1:"))
        fail_msg("moe plan output lacks the tuning file or entries:\n%s", r.out);
    result_free(&r);
    tu_rm_tree(tdir);
}

/* ---- the front door (issue 19): did you mean, models, layers, keys, help, progress ---- */

/* One run: exit `code`, and stderr holding each of want[] (NULL-terminated). */
static void check_err(const char *const *args, int code, const char *const *want)
{
    cli_result r;
    run_moe(&r, args);
    expect(&r, code, want);
    result_free(&r);
}

/* Commands and every subcommand's options: the closest name is offered; nothing when none is
 * close. Exit 2 (bad command line). */
static void test_did_you_mean(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    const char *a1[] = {"--hlep", NULL};
    const char *e1[] = {"moe: unknown command '--hlep'; did you mean --help?", "usage: moe <command>", NULL};
    check_err(a1, 2, e1);
    const char *a2[] = {"benhc", NULL};
    const char *e2[] = {"unknown command 'benhc'; did you mean bench?", NULL};
    check_err(a2, 2, e2);
    const char *a3[] = {"help", "qunatize", NULL};
    const char *e3[] = {"moe help: unknown command 'qunatize'; did you mean quantize?", NULL};
    check_err(a3, 2, e3);
    static const char *const opts[][4] = {
        /* command, the misspelt option, its value (or NULL), the option meant */
        {"run", "--checkpont", "x", "--checkpoint"},
        {"run", "--ouptut", "x", "--output"},
        {"bench", "--tokns", "1", "--tokens"},
        {"bench", "--list-model", NULL, "--list-models"},
        {"plan", "--modle", "x", "--model"},
        {"plan", "--hepl", NULL, "--help"},
        {"quantize", "--forse", NULL, "--force"},
        {"env", "--jsno", NULL, "--json"},
        {"version", "--hlep", NULL, "--help"},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        const char *a[] = {opts[i][0], opts[i][1], opts[i][2], NULL};
        char want[160];
        snprintf(want, sizeof want, "moe %s: unknown option '%s'; did you mean %s? (see 'moe %s --help')", opts[i][0],
                 opts[i][1], opts[i][3], opts[i][0]);
        const char *e[] = {want, NULL};
        check_err(a, 2, e);
    }
    /* nothing close: no guess */
    cli_result r;
    const char *a4[] = {"frobnicate", NULL};
    run_moe(&r, a4);
    expect(&r, 2, NULL);
    assert_non_null(strstr(r.err, "unknown command 'frobnicate'"));
    assert_null(strstr(r.err, "did you mean"));
    result_free(&r);
    const char *a5[] = {"bench", "--zzzzzz", NULL};
    run_moe(&r, a5);
    expect(&r, 2, NULL);
    assert_non_null(strstr(r.err, "unknown option '--zzzzzz' (see 'moe bench --help')"));
    result_free(&r);
    /* family names (--family) too */
    char fx[1024];
    tu_data_path(fx, sizeof fx, "qwen3_moe_f32");
    const char *af[] = {"plan", "--checkpoint", fx, "--family", "qwen3_mo", NULL};
    const char *ef[] = {"unknown family 'qwen3_mo'; did you mean qwen3_moe? (moe_checkpoint_options.family, --family); "
                        "families: mixtral, ",
                        NULL};
    check_err(af, 1, ef);
    /* an empty family name is not an "empty path": named as a family name, the families listed */
    static const char *const fam_cmds[] = {"run", "plan", "bench", "tune"};
    for (int i = 0; i < 4; i++) {
        const char *ae[] = {fam_cmds[i], "--family", "", NULL};
        const char *ee[] = {"--family: empty family name; families: mixtral, qwen2_moe, ", "qwen3_next", NULL};
        run_moe(&r, ae);
        expect(&r, 2, ee);
        assert_null(strstr(r.err, "path"));
        result_free(&r);
    }
    /* MOE_* variables go through the same suggester: a far one gets no guess */
    setenv("MOE_ZQXWV", "1", 1);
    const char *a6[] = {"env", NULL};
    run_moe(&r, a6);
    unsetenv("MOE_ZQXWV");
    expect(&r, 1, NULL);
    assert_non_null(strstr(r.out, "MOE_ZQXWV"));
    assert_non_null(strstr(r.out, "unknown variable, ignored; no known variable is close to it"));
    result_free(&r);
}

/* An unknown model: plan and bench say the same (the closest name, every name, where to see
 * their shapes); plan --list-models is bench's table. */
static void test_unknown_model_alike(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cmds[] = {"plan", "bench"};
    for (int c = 0; c < 2; c++) {
        const char *a[] = {cmds[c], "--model", "qwen3.5-35b", NULL};
        char w1[128], w2[128];
        snprintf(w1, sizeof w1, "moe %s: --model qwen3.5-35b: unknown model; did you mean qwen3.5-35b-a3b?", cmds[c]);
        snprintf(w2, sizeof w2, "known models ('moe %s --list-models' shows their shapes): qwen3-30b-a3b, ", cmds[c]);
        const char *e[] = {w1, w2, "mixtral-8x7b", "granite-3.0-1b-a400m", NULL};
        check_err(a, 2, e);
    }
    const char *a3[] = {"plan", "--model", "nosuchmodel", NULL};
    cli_result r;
    run_moe(&r, a3);
    expect(&r, 2, NULL);
    assert_non_null(strstr(r.err, "--model nosuchmodel: unknown model\n"));
    result_free(&r);

    cli_result pl, bl;
    const char *ap[] = {"plan", "--list-models", NULL};
    const char *ab[] = {"bench", "--list-models", NULL};
    run_moe(&pl, ap);
    run_moe(&bl, ab);
    expect(&pl, 0, NULL);
    expect(&bl, 0, NULL);
    assert_non_null(strstr(pl.out, "qwen3.5-35b-a3b"));
    assert_string_equal(pl.out, bl.out);
    result_free(&pl);
    result_free(&bl);
    /* --layer belongs to a checkpoint */
    const char *a4[] = {"plan", "--model", "qwen3-30b-a3b", "--layer", "3", NULL};
    const char *e4[] = {"--layer needs --checkpoint", NULL};
    check_err(a4, 2, e4);
}

/* An unknown --quant: the closest scheme and the list each command accepts. */
static void test_unknown_scheme(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    const char *a1[] = {"quantize", "--checkpoint", "a", "--output", "b", "--quant", "int5", NULL};
    const char *e1[] = {"moe quantize: --quant int5: unknown scheme; accepted: fp8-tensor, fp8-channel, fp8-block, fp8-block-w8a8, "
                        "int8-channel, int8-w8a8, int4-g32, int4-g64, int4-g128, int4-g32-zp, int4-g64-zp, "
                        "int4-g128-zp, mxfp4\n",
                        NULL};
    check_err(a1, 2, e1);
    const char *a2[] = {"quantize", "--checkpoint", "a", "--output", "b", "--quant", "int4-g218", NULL};
    const char *e2[] = {"--quant int4-g218: unknown scheme; did you mean int4-g128? accepted: fp8-tensor, fp8-channel, fp8-block", NULL};
    check_err(a2, 2, e2);
    const char *a3[] = {"plan", "--model", "qwen3-30b-a3b", "--quant", "fp9-block", NULL};
    const char *e3[] = {"moe plan: --quant fp9-block: unknown scheme; did you mean fp8-block? accepted: bf16, f16, "
                        "f32, none, fp8-tensor, fp8-channel, fp8-block,",
                        NULL};
    check_err(a3, 2, e3);
    const char *a4[] = {"bench", "--quant", "mxfp5", NULL};
    const char *e4[] = {"moe bench: --quant mxfp5: unknown scheme; did you mean mxfp4? accepted: none, fp8-tensor,", NULL};
    check_err(a4, 2, e4);
}

/* --layer -1 (or past the end, or a dense layer): the checkpoint's own range and its MoE
 * layers, from run, plan and bench alike; exit 1. */
static void test_layer_range_named(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    free(make_input(f->in, 2, CK_H, MOE_DTYPE_F32, 3));
    const char *ar[] = {"run", "--checkpoint", f->ck, "--layer", "-1", "--input", f->in, "--output", f->out, NULL};
    const char *e[] = {"layer -1 out of range: num_hidden_layers is 2, valid layers are 0..1; MoE layers: 0..1 (all 2)",
                       NULL};
    check_err(ar, 1, e);
    expect_no_output(f);
    const char *ap[] = {"plan", "--checkpoint", f->ck, "--layer", "-1", NULL};
    check_err(ap, 1, e);
    const char *ab[] = {"bench", "--checkpoint", f->ck, "--layer", "-1", "--tokens", "1", NULL};
    check_err(ab, 1, e);
    const char *a2[] = {"plan", "--checkpoint", f->ck, "--layer", "2", NULL};
    const char *e2[] = {"layer 2 out of range", "MoE layers: 0..1 (all 2)", NULL};
    check_err(a2, 1, e2);
    char qout[700];
    snprintf(qout, sizeof qout, "%s/quantized", f->io);
    const char *aq[] = {"quantize", "--checkpoint", f->ck, "--output", qout, "--quant", "int8-channel", "--layers", "-1",
                        NULL};
    const char *eq[] = {"moe quantize: layer -1 is not an MoE layer of ", e[0], NULL};
    check_err(aq, 1, eq);
    assert_int_equal(access(qout, F_OK), -1); /* nothing written */
    /* a dense first layer (DeepSeek-V3's first_k_dense_replace): the MoE layers it has */
    char dir[1024];
    tu_data_path(dir, sizeof dir, "deepseek_v3_f32");
    const char *a3[] = {"plan", "--checkpoint", dir, "--layer", "-1", NULL};
    const char *e3[] = {"layer -1 out of range: num_hidden_layers is 2, valid layers are 0..1; MoE layers (1): 1", NULL};
    check_err(a3, 1, e3);
    const char *a4[] = {"plan", "--checkpoint", dir, "--layer", "0", NULL};
    const char *e4[] = {"layer 0 is a dense MLP layer", "MoE layers (1): 1", NULL};
    check_err(a4, 1, e4);
}

/* An input without hidden_states names the keys it holds and the closest. */
static void test_input_keys_named(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    float v[2 * CK_H];
    memset(v, 0, sizeof v);
    moe_tensor_out t[2];
    memset(t, 0, sizeof t);
    t[0].name = "hidden_state";
    t[1].name = "attention_mask";
    for (int i = 0; i < 2; i++) {
        t[i].dtype = MOE_DTYPE_F32;
        t[i].ndim = 2;
        t[i].shape[0] = 2;
        t[i].shape[1] = CK_H;
        t[i].data = v;
    }
    moe_ctx *ctx = tu_ctx();
    assert_int_equal(moe_safetensors_write(ctx, f->in, t, 2), MOE_OK);
    moe_ctx_free(ctx);
    const char *a[] = {"run", "--checkpoint", f->ck, "--layer", "0", "--input", f->in, "--output", f->out, NULL};
    const char *e[] = {"in.safetensors: tensor 'hidden_states' not found (did you mean 'hidden_state'?); the file holds 2 "
                       "tensors: ",
                       "'hidden_state'", "'attention_mask'", NULL};
    check_err(a, 1, e);
    expect_no_output(f);
}

/* A folder with PyTorch pickle weights only: say to save it as safetensors. */
static void test_pickle_checkpoint_hint(void **state)
{
    SKIP_WITHOUT_BIN();
    run_fixture *f = *state;
    char dir[512], path[700], cfg[700];
    tu_tmpdir(dir, sizeof dir, "cli-pickle");
    snprintf(cfg, sizeof cfg, "%s/config.json", f->ck);
    char *text = slurp(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
    free(text);
    snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
    assert_int_equal(tu_write_file(path, "PK", 2), 0);
    const char *a[] = {"plan", "--checkpoint", dir, NULL};
    const char *e[] = {"neither model.safetensors nor model.safetensors.index.json found; it holds pytorch_model.bin "
                       "(PyTorch pickle weights, which libmoe does not read): save the model as safetensors first",
                       "safe_serialization=True", NULL};
    check_err(a, 1, e);
    tu_rm_tree(dir);
}

/* Every help text fits in 100 columns, and moe --help keeps its phrases whole. */
static void test_help_layout(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    static const char *const cmds[] = {NULL, "run", "bench", "plan", "quantize", "env", "version"};
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        cli_result r;
        const char *a[] = {"help", cmds[c], NULL};
        run_moe(&r, a);
        expect(&r, 0, NULL);
        int line = 1;
        for (const char *p = r.out; *p; line++) {
            const char *nl = strchr(p, '\n');
            const size_t len = nl ? (size_t)(nl - p) : strlen(p);
            if (len > 100)
                fail_msg("moe help %s: line %d is %zu columns: %.*s", cmds[c] ? cmds[c] : "", line, len, (int)len, p);
            p += len + (nl ? 1 : 0);
        }
        if (!cmds[c]) {
            static const char *const phrases[] = {
                "(mxfp4 for gpt-oss)", "(moe run --help)", "(moe bench --help)", "(moe plan --help)",
                "(moe quantize --help)", "(moe env --help)", "checkpoint libmoe and vLLM load",
                "  quantize  convert a checkpoint's routed experts"};
            for (size_t i = 0; i < sizeof phrases / sizeof phrases[0]; i++)
                if (!strstr(r.out, phrases[i]))
                    fail_msg("moe help breaks \"%s\":\n%s", phrases[i], r.out);
        }
        result_free(&r);
    }
}

/* Progress is for a terminal: with stdout and stderr going to files (no tty) a bench that
 * takes over a second prints its table on stdout and nothing on stderr. */
static void test_bench_no_progress_without_tty(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    /* more iterations until the bench runs past the 1 s after which progress would show (a
     * fast machine does 3 in 0.7 s) */
    for (int iters = 3;; iters *= 2) {
        char it[16], row[32];
        snprintf(it, sizeof it, "%d", iters);
        snprintf(row, sizeof row, "\n     16 %5d ", iters);
        const char *a[] = {"bench", "--num-experts", "16", "--tokens", "1,16", "--iters", it, "--threads", "2", NULL};
        run_moe(&r, a);
        expect(&r, 0, NULL);
        assert_non_null(strstr(r.out, "median ms"));
        assert_non_null(strstr(r.out, row));
        if (r.err[0])
            fail_msg("moe bench wrote to a non-terminal stderr:\n%s", r.err);
        print_message("bench of %d iterations took %.1f s (progress starts after 1 s)\n", iters, r.secs);
        if (r.secs > 1.0 || iters >= 96)
            break;
        result_free(&r);
    }
    assert_true(r.secs > 1.0); /* long enough that progress would have shown */
    result_free(&r);
}

/* moe plan: a cost under 1% of a rank's expert bytes is INFO, not WARNING (docs/architecture.md
 * "The plan report"). Qwen3.5-35B-A3B at TP 4: the router 4 * 256 * 2048 = 2.1 MB beside
 * 256 * 3 * 2048 * 128 * 2 = 402.7 MB per rank (0.52%); Qwen3-30B-A3B at EP 2 x TP 2 in
 * int4-g128: 4 * 128 * 2048 = 1.0 MB beside 64 * 3 * 2048 * 192 / 2 = 37.7 MB of codes plus
 * scales per rank (above 2%). */
static void test_plan_small_costs_info(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    const char *a1[] = {"plan", "--model", "qwen3.5-35b-a3b", "--tp", "4", NULL};
    run_moe(&r, a1);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "INFO: router weight [E, H] f32 replicated on every rank; bytes per rank: 2.1 MB\n"));
    assert_null(strstr(r.out, "WARNING: router"));
    assert_non_null(strstr(r.out, "no cost of 1% or more of a rank's expert bytes, no fallback kernels\n"));
    result_free(&r);
    const char *a2[] = {"plan", "--model", "qwen3-30b-a3b", "--ep", "2", "--tp", "2", "--quant", "int4-g128", NULL};
    run_moe(&r, a2);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "WARNING: router weight [E, H] f32 replicated on every rank; bytes per rank: 1.0 MB\n"));
    assert_null(strstr(r.out, "INFO: router"));
    result_free(&r);
}

/* moe plan --checkpoint names the family row it read the checkpoint with, the routing it
 * gave and the experts' activation (the fixtures' meta.json: dots1_f32 sigmoid, not renormalized, 1.5, 4 groups keep 2 by
 * the top-2 sum, e_score_correction_bias, two ungated shared experts; mixtral_f32 softmax,
 * renormalized, no shared expert). */
static void test_plan_family_row(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    cli_result r;
    char fx[1024];
    tu_data_path(fx, sizeof fx, "dots1_f32");
    const char *a1[] = {"plan", "--checkpoint", fx, NULL};
    run_moe(&r, a1);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "family: dots1 (scoring sigmoid, renormalize no, routed_scaling_factor 1.5, groups 4 "
                                  "keep 2 by top-2 sum, selection bias; shared expert ungated)\n"));
    result_free(&r);
    tu_data_path(fx, sizeof fx, "mixtral_f32");
    const char *a2[] = {"plan", "--checkpoint", fx, NULL};
    run_moe(&r, a2);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "family: mixtral (scoring softmax, renormalize yes, routed_scaling_factor 1; shared "
                                  "expert none)\n"));
    assert_non_null(strstr(r.out, "\nexperts: swiglu (silu(g) * u)\n"));
    result_free(&r);
    /* the experts line: step3p7_f32 layer 1 clamps after the SiLU, routed limit 2.5, shared 4
     * (config swiglu_limits[1] / swiglu_limits_shared[1]); nemotron_h_f32 non-gated relu2 */
    tu_data_path(fx, sizeof fx, "step3p7_f32");
    const char *a3[] = {"plan", "--checkpoint", fx, "--layer", "1", NULL};
    run_moe(&r, a3);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "\nexperts: swiglu_postclamp (min(silu(g), L) * clamp(u, +-L), L 2.5); shared expert "
                                  "swiglu_postclamp (min(silu(g), L) * clamp(u, +-L), L 4)\n"));
    result_free(&r);
    tu_data_path(fx, sizeof fx, "nemotron_h_f32");
    const char *a4[] = {"plan", "--checkpoint", fx, "--layer", "1", NULL};
    run_moe(&r, a4);
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "\nexperts: relu2 (non-gated, relu(u)^2); shared expert relu2 (non-gated, "
                                  "relu(u)^2)\n"));
    result_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_family_row),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_unknown),
        cmocka_unit_test(test_bench_bad_numbers), cmocka_unit_test(test_bench_par_bad_lists),
        cmocka_unit_test(test_bench_unknown_model),
        cmocka_unit_test(test_bench_nongated_preset),
        cmocka_unit_test(test_bench_does_not_fit),
        cmocka_unit_test(test_bench_json),
        cmocka_unit_test(test_bench_compute_bf16),
        cmocka_unit_test(test_compute_refusals),
        cmocka_unit_test_setup_teardown(test_run_missing_checkpoint, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_no_config, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_bad_width, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_interrupt_leaves_nothing, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_output_folder_missing, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_missing_tensor, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_layer_out_of_range, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_matches_api_f32, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_matches_api_bf16, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_refuses_outputs, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_refuses_fifo_inputs, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_compute_bf16, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_compute_bf16_without_avx512_bf16, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_tune_command, run_setup, run_teardown),
        cmocka_unit_test(test_env_command),
        cmocka_unit_test(test_env_inert),
        cmocka_unit_test_setup_teardown(test_run_idle_tp_knob, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_run_placement_policy_name, run_setup, run_teardown),
        cmocka_unit_test(test_plan_command), cmocka_unit_test(test_plan_placement),
        cmocka_unit_test(test_flag_takes_no_value),
        cmocka_unit_test(test_option_errors),
        cmocka_unit_test(test_did_you_mean),
        cmocka_unit_test(test_unknown_model_alike),
        cmocka_unit_test(test_unknown_scheme),
        cmocka_unit_test_setup_teardown(test_layer_range_named, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_input_keys_named, run_setup, run_teardown),
        cmocka_unit_test_setup_teardown(test_pickle_checkpoint_hint, run_setup, run_teardown),
        cmocka_unit_test(test_help_layout),
        cmocka_unit_test(test_skew_refusals),
        cmocka_unit_test(test_bench_no_progress_without_tty),
        cmocka_unit_test(test_plan_small_costs_info),
    };
    return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
