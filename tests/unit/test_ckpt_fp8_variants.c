/* FP8 per-tensor and compressed-tensors FP8 checkpoints (issue 15 item 4). Fixtures
 * (tests/fixtures/gen_fp8_fixture.py, numpy only, from qwen3_moe_f32: H 40, I 12, E 6, top_k 2,
 * T 17):
 *   qwen3_moe_fp8_tensor      HF quant_method fp8, weight_block_size null, weight_scale_inv []
 *   qwen3_moe_ct_fp8_tensor   compressed-tensors float-quantized, strategy tensor, weight-only
 *   qwen3_moe_ct_fp8_channel  compressed-tensors FP8_DYNAMIC: channel weights [N, 1] + dynamic
 *                             per-token FP8 activations (served weight-only, WARNING)
 * each with expected.safetensors: a float64 numpy forward of the Qwen3-MoE block on the
 * generator's own e4m3 dequantization (the codes decoded from the format's definition).
 *
 * Checked here:
 *  - each loads as fp8-tensor / fp8-channel (desc.quant), and on every kernel table this CPU
 *    runs the layer output matches expected within 1e-5 of max |expected| (the weight-only
 *    bound), bit-identical across tables;
 *  - the WARNING for dynamic per-token activations;
 *  - qwen2_moe_ct_fp8_channel_shared (from qwen2_moe_f32: H 32, I 12, I_s 20, E 6): the FP8
 *    shared expert too (dequantized at load), the same bound;
 *  - compressed-tensors static FP8 activations (qwen3_moe_ct_fp8_static, and with per-expert
 *    clipping scales _static_pe / _static_channel): loaded as fp8-tensor-static /
 *    fp8-channel-static, against the generator's static forward (test_ct_fp8_static_per_expert);
 *  - bad input, each error naming the field or tensor: static input activations (input_scale),
 *    num_bits 4 float weights, an unknown strategy, quant_method fbgemm_fp8, float weights in pack-quantized, a wrong
 *    weight_scale shape (ct tensor [2], ct channel [N, 2], HF per-tensor [2]), a missing HF
 *    per-tensor scale, both weight_scale and weight_scale_inv;
 *  - moe_checkpoint_quantize --quant fp8-tensor / fp8-channel on qwen3_moe_f32 writes exactly
 *    the tensors (names, dtypes, shapes, bytes) of the generator's independent quantization
 *    (qwen3_moe_ct_fp8_tensor / _channel), and the output loads as that scheme. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "quant/quant.h" /* moe_quant_equal */
#include "testutil.h"

enum { H = 40, I = 12, E = 6, K = 2, T = 17 };
#define PFX "model.layers.0.mlp."

enum { MAXN = 17 * 40 }; /* the largest T * H of the fixtures */

/* tensor `name` of file `dir`/`file` copied into out (n floats; n = 0: any size up to MAXN,
 * returned) */
static size_t read_f32(moe_ctx *ctx, const char *dir, const char *file, const char *name, float *out, size_t n)
{
    char p[700];
    tu_join(p, sizeof p, dir, file);
    moe_safetensors *f;
    assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
    moe_tensor_info t;
    assert_int_equal(moe_safetensors_get(f, name, &t), MOE_OK);
    assert_int_equal(t.dtype, MOE_DTYPE_F32);
    if (n)
        assert_int_equal(t.nbytes, n * sizeof(float));
    assert_true(t.nbytes <= MAXN * sizeof(float));
    memcpy(out, t.data, t.nbytes);
    moe_safetensors_free(f);
    return t.nbytes / sizeof(float);
}

static moe_ctx *ctx_isa(const char *isa)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 1;
    o.isa = isa;
    moe_ctx *ctx = NULL;
    char err[512] = "";
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        return NULL;
    return ctx;
}

static void check_fixture(const char *fxname, const char *scheme)
{
    char dir[600];
    tu_data_path(dir, sizeof dir, fxname);
    static float x[MAXN], want[MAXN], out[MAXN], first[MAXN];
    moe_ctx *c0 = tu_ctx();
    const size_t nx = read_f32(c0, dir, "input.safetensors", "hidden_states", x, 0);
    read_f32(c0, dir, "expected.safetensors", "output", want, nx);
    moe_ctx_free(c0);
    const char *isas[16];
    size_t n = tu_isa_names(isas, 16);
    int ran = 0;
    for (size_t i = 0; i < n; i++) {
        moe_ctx *ctx = ctx_isa(isas[i]);
        if (!ctx)
            continue; /* a table this CPU lacks */
        moe_layer_desc d;
        moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name(scheme, &q), MOE_OK);
        if (!moe_quant_equal(&d.quant, &q))
            fail_msg("%s: loaded as %s, expected %s", fxname, moe_quant_name(&d.quant), scheme);
        const int64_t Tx = (int64_t)nx / d.hidden_size; /* the fixture's tokens */
        tu_run_layer_ex(ctx, &d, NULL, ck, 0, NULL, x, MOE_DTYPE_F32, Tx, out, NULL, NULL);
        const double err = tu_max_abs_diff(out, want, nx), mx = tu_max_abs(want, nx);
        print_message("%s isa %s: max |out - ref| = %.3g (%.3g of max |ref| %.3g)\n", fxname, isas[i], err, err / mx,
                      mx);
        if (!(err <= 1e-5 * mx))
            fail_msg("%s isa %s: max |out - ref| %.3g > 1e-5 * max |ref| %.3g", fxname, isas[i], err, mx);
        if (ran++ == 0)
            memcpy(first, out, sizeof out);
        else if (!tu_same_bits(out, first, nx))
            fail_msg("%s isa %s: output bits differ from the first table's", fxname, isas[i]);
        moe_checkpoint_free(ck);
        moe_ctx_free(ctx);
    }
    assert_true(ran >= 1);
}

static void test_hf_fp8_tensor(void **s)
{
    (void)s;
    check_fixture("qwen3_moe_fp8_tensor", "fp8-tensor");
}

static void test_ct_fp8_tensor(void **s)
{
    (void)s;
    check_fixture("qwen3_moe_ct_fp8_tensor", "fp8-tensor");
}

static void test_ct_fp8_channel_dynamic(void **s)
{
    (void)s;
    check_fixture("qwen3_moe_ct_fp8_channel", "fp8-channel");
    /* the dynamic per-token activations are served weight-only, and said so */
    tu_logcap cap = {0};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    char dir[600];
    tu_data_path(dir, sizeof dir, "qwen3_moe_ct_fp8_channel");
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    if (!strstr(cap.text, "dynamic per-token FP8: served weight-only (fp8-channel) with f32 activations"))
        fail_msg("no WARNING for the dynamic activations:\n%s", cap.text);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* ---- bad input: a copy of fixture `src` in a temp folder, config.json and tensors edited ---- */

typedef struct edit {
    const char *tensor;   /* tensor to change (or drop: ndim < 0), NULL none */
    int ndim;             /* new shape (its data: zeros of the new size, scale 1.0f) */
    int64_t shape[2];
    const char *add;      /* a tensor to add, F32 [] value 1, or NULL */
    int poke;             /* 1: `tensor` keeps its shape, its F32 element `at` set to `value` */
    int64_t at;
    float value;
} edit;

/* The copy's folder into dir; cfg_edit(root) edits config.json's object. */
static void make_copy(const char *src, char *dir, size_t n, void (*cfg_edit)(json_t *), const edit *ed)
{
    moe_ctx *ctx = tu_ctx();
    char sdir[600], p[700];
    tu_data_path(sdir, sizeof sdir, src);
    tu_tmpdir(dir, n, "fp8v");
    tu_join(p, sizeof p, sdir, "config.json");
    json_t *root = json_load_file(p, 0, NULL);
    assert_non_null(root);
    if (cfg_edit)
        cfg_edit(root);
    tu_join(p, sizeof p, dir, "config.json");
    assert_int_equal(json_dump_file(root, p, JSON_INDENT(1)), 0);
    json_decref(root);
    tu_join(p, sizeof p, sdir, "model.safetensors");
    moe_safetensors *f;
    assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
    const size_t cnt = moe_safetensors_count(f);
    moe_tensor_out *o = calloc(cnt + 1, sizeof *o); /* [cnt + 1] */
    static float ones[128]; /* [128] f32: the largest edited tensor ([40, 2]) */
    static float poked[128]; /* [128] f32: a poked scale tensor (at most [40, 1]) */
    for (int i = 0; i < 128; i++)
        ones[i] = 1.0f;
    size_t m = 0;
    for (size_t i = 0; i < cnt; i++) {
        moe_tensor_info t;
        assert_int_equal(moe_safetensors_at(f, i, &t), MOE_OK);
        o[m] = (moe_tensor_out){.name = t.name, .dtype = t.dtype, .ndim = t.ndim, .data = t.data};
        memcpy(o[m].shape, t.shape, sizeof t.shape);
        if (ed && ed->poke && strcmp(t.name, ed->tensor) == 0) {
            assert_int_equal(t.dtype, MOE_DTYPE_F32);
            assert_true((size_t)ed->at < t.nbytes / 4 && t.nbytes <= sizeof poked);
            memcpy(poked, t.data, t.nbytes);
            poked[ed->at] = ed->value;
            o[m++].data = poked;
            continue;
        }
        if (ed && ed->tensor && strcmp(t.name, ed->tensor) == 0) {
            if (ed->ndim < 0)
                continue;
            o[m].ndim = ed->ndim;
            o[m].shape[0] = ed->shape[0], o[m].shape[1] = ed->shape[1];
            o[m].data = ones;
        }
        m++;
    }
    if (ed && ed->add)
        o[m++] = (moe_tensor_out){.name = ed->add, .dtype = MOE_DTYPE_F32, .ndim = 0, .data = ones};
    tu_join(p, sizeof p, dir, "model.safetensors");
    assert_int_equal(moe_safetensors_write(ctx, p, o, m), MOE_OK);
    free(o);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
}

static json_t *group0(json_t *root)
{
    return json_object_get(json_object_get(json_object_get(root, "quantization_config"), "config_groups"), "group_0");
}

static void cfg_static_acts(json_t *root)
{
    json_object_set_new(group0(root), "input_activations",
                        json_pack("{s:i, s:s, s:b, s:s, s:b}", "num_bits", 8, "type", "float", "symmetric", 1,
                                  "strategy", "tensor", "dynamic", 0));
}

static void cfg_static_token(json_t *root)
{
    json_object_set_new(json_object_get(group0(root), "input_activations"), "strategy", json_string("token"));
}

static void cfg_nb_str(json_t *root)
{
    json_object_set_new(json_object_get(group0(root), "weights"), "num_bits", json_string("8"));
}

static void cfg_sym_str(json_t *root)
{
    json_object_set_new(json_object_get(group0(root), "weights"), "symmetric", json_string("true"));
}

static void cfg_nb4(json_t *root)
{
    json_object_set_new(json_object_get(group0(root), "weights"), "num_bits", json_integer(4));
}

static void cfg_strategy(json_t *root)
{
    json_object_set_new(json_object_get(group0(root), "weights"), "strategy", json_string("diagonal"));
}

/* transformers' FbgemmFp8Config (per-channel weight_scale [N, 1] + input_scale_ub): not read */
static void cfg_fbgemm(json_t *root)
{
    json_object_set_new(root, "quantization_config",
                        json_pack("{s:s, s:f, s:[s]}", "quant_method", "fbgemm_fp8", "activation_scale_ub", 1200.0,
                                  "modules_to_not_convert", "lm_head"));
}

static void cfg_packed(json_t *root)
{
    json_object_set_new(group0(root), "format", json_string("pack-quantized"));
}

/* open the copy and describe layer 0: the status and the message's substrings */
static void expect_open(const char *dir, moe_status want, const char *a, const char *b)
{
    moe_ctx *ctx = tu_ctx();
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        moe_layer_desc d;
        st = moe_checkpoint_layer_desc(ck, 0, &d);
    }
    expect_error(ctx, st, want, a, b);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_ct_fp8_shared(void **s)
{
    (void)s;
    check_fixture("qwen2_moe_ct_fp8_channel_shared", "fp8-channel");
    /* the FP8 shared expert is dequantized at load: weight_dtype F32 */
    moe_ctx *ctx = tu_ctx();
    char dir[600];
    tu_data_path(dir, sizeof dir, "qwen2_moe_ct_fp8_channel_shared");
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    assert_int_equal(d.shared_expert_intermediate_size, 20);
    assert_int_equal(d.weight_dtype, MOE_DTYPE_F32);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_bad_config(void **s)
{
    (void)s;
    char dir[600];
    /* static activations on a checkpoint without input_scale tensors: the first one named */
    make_copy("qwen3_moe_ct_fp8_tensor", dir, sizeof dir, cfg_static_acts, NULL);
    expect_open(dir, MOE_ENOTFOUND, "tensor '" PFX "experts.0.gate_proj.input_scale' not found",
                "static FP8 (dynamic false, strategy tensor)");
    make_copy("qwen3_moe_ct_fp8_static", dir, sizeof dir, cfg_static_token, NULL);
    expect_open(dir, MOE_EUNSUPPORTED, "group_0.input_activations.strategy' = token with dynamic false",
                "strategy tensor (one input_scale per linear) only");
    make_copy("qwen3_moe_ct_fp8_tensor", dir, sizeof dir, cfg_nb_str, NULL);
    expect_open(dir, MOE_EFORMAT, "group_0.weights.num_bits' must be an integer", "found a string (\"8\")");
    make_copy("qwen3_moe_ct_fp8_tensor", dir, sizeof dir, cfg_sym_str, NULL);
    expect_open(dir, MOE_EFORMAT, "group_0.weights.symmetric' must be true or false", "found a string (\"true\")");
    make_copy("qwen3_moe_ct_fp8_tensor", dir, sizeof dir, cfg_nb4, NULL);
    expect_open(dir, MOE_EUNSUPPORTED, "config_groups.group_0.weights.num_bits' = 4 with type float",
                "NVFP4");
    make_copy("qwen3_moe_ct_fp8_channel", dir, sizeof dir, cfg_strategy, NULL);
    expect_open(dir, MOE_EUNSUPPORTED, "config_groups.group_0.weights.strategy' = diagonal",
                "only tensor and channel FP8");
    make_copy("qwen3_moe_fp8_tensor", dir, sizeof dir, cfg_fbgemm, NULL);
    expect_open(dir, MOE_EUNSUPPORTED, "quantization_config.quant_method", "fbgemm_fp8");
    make_copy("qwen3_moe_ct_fp8_tensor", dir, sizeof dir, cfg_packed, NULL);
    expect_open(dir, MOE_EUNSUPPORTED, "config_groups.group_0.format' = pack-quantized with field",
                "float-quantized");
}

static void test_bad_tensors(void **s)
{
    (void)s;
    char dir[600];
    const edit ct_tensor = {.tensor = PFX "experts.2.up_proj.weight_scale", .ndim = 1, .shape = {2, 0}};
    make_copy("qwen3_moe_ct_fp8_tensor", dir, sizeof dir, NULL, &ct_tensor);
    expect_open(dir, MOE_ESHAPE, "'" PFX "experts.2.up_proj.weight_scale': shape [2]", "strategy tensor");
    const edit ct_channel = {.tensor = PFX "experts.1.down_proj.weight_scale", .ndim = 2, .shape = {H, 2}};
    make_copy("qwen3_moe_ct_fp8_channel", dir, sizeof dir, NULL, &ct_channel);
    expect_open(dir, MOE_ESHAPE, "'" PFX "experts.1.down_proj.weight_scale': shape [40, 2]", "expected [40, 1]");
    const edit hf_shape = {.tensor = PFX "experts.0.gate_proj.weight_scale_inv", .ndim = 1, .shape = {2, 0}};
    make_copy("qwen3_moe_fp8_tensor", dir, sizeof dir, NULL, &hf_shape);
    expect_open(dir, MOE_ESHAPE, "'" PFX "experts.0.gate_proj.weight_scale_inv': FP8 per-tensor scale shape [2]",
                "expected [] or [1]");
    const edit hf_missing = {.tensor = PFX "experts.3.down_proj.weight_scale_inv", .ndim = -1};
    make_copy("qwen3_moe_fp8_tensor", dir, sizeof dir, NULL, &hf_missing);
    expect_open(dir, MOE_ENOTFOUND, "'" PFX "experts.3.down_proj.weight_scale_inv' (or", "is missing");
    const edit hf_both = {.add = PFX "experts.4.up_proj.weight_scale"};
    make_copy("qwen3_moe_fp8_tensor", dir, sizeof dir, NULL, &hf_both);
    expect_open(dir, MOE_EFORMAT, PFX "experts.4.up_proj.weight_scale' are both present", "one scale");
}

/* The layer output of fixture dir on table isa (NULL: the default ctx): loaded as the checkpoint
 * says (weight_only 0), or run weight-only through a plan with quant.act NONE (1). */
static void run_fixture(const char *dir, const char *isa, int weight_only, const float *x, size_t nx, float *out,
                        moe_layer_desc *dout)
{
    moe_ctx *ctx = isa ? ctx_isa(isa) : tu_ctx();
    assert_non_null(ctx);
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    if (dout)
        *dout = d;
    if (weight_only)
        d.quant.act = MOE_QACT_NONE;
    tu_run_layer_ex(ctx, &d, NULL, ck, 0, NULL, x, MOE_DTYPE_F32, (int64_t)nx / d.hidden_size, out, NULL, NULL);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* compressed-tensors FP8 with static per-tensor activations (input_scale per linear; fixture
 * qwen3_moe_ct_fp8_static, scales calibrated max |x| / 448 per expert): loads as
 * fp8-tensor-static with no WARNING (INFO names the scheme and each projection's input_scale
 * range, and the maxima vLLM would apply, computed here from the file's tensors); a plan with
 * quant.act NONE runs it weight-only, matching the weight-only forward (expected.safetensors)
 * within 1e-5 of max as before; the static output's distance to the forward with vLLM's
 * max-over-experts scales (expected_fp8_act) is printed, for the record. A missing, misshapen or
 * zero input_scale is refused naming it. */
static void test_ct_fp8_static(void **s)
{
    (void)s;
    char dir[600], p[700];
    tu_data_path(dir, sizeof dir, "qwen3_moe_ct_fp8_static");
    tu_logcap cap = {0};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_INFO);
    /* the maxima over the experts, from the file */
    tu_join(p, sizeof p, dir, "model.safetensors");
    moe_safetensors *f;
    assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
    float mx13 = 0, mx2 = 0;
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) {
            static const char *const pr[3] = {"gate_proj", "up_proj", "down_proj"};
            char nm[200];
            snprintf(nm, sizeof nm, PFX "experts.%d.%s.input_scale", e, pr[j]);
            moe_tensor_info t;
            assert_int_equal(moe_safetensors_get(f, nm, &t), MOE_OK);
            float v;
            memcpy(&v, t.data, 4);
            assert_true(v > 0);
            float *m = j < 2 ? &mx13 : &mx2;
            if (v > *m)
                *m = v;
        }
    moe_safetensors_free(f);
    assert_int_equal(tu_load_layer_status(ctx, dir, 0), MOE_OK);
    char want[300];
    snprintf(want, sizeof want, "vLLM would quantize the w13 input with %g and the w2 input with %g", (double)mx13,
             (double)mx2);
    const char *subs[] = {"input_activations static per-tensor FP8", "served as fp8-tensor-static",
                          PFX "experts: static FP8 input_scale applied per expert", want};
    for (size_t i = 0; i < 4; i++)
        if (!strstr(cap.text, subs[i]))
            fail_msg("log lacks \"%s\":\n%s", subs[i], cap.text);
    if (strstr(cap.text, "NOT applied") || strstr(cap.text, "WARN"))
        fail_msg("a static FP8 checkpoint logs no WARNING and applies its scales:\n%s", cap.text);
    moe_ctx_free(ctx);
    static float x[MAXN], act[MAXN], wo[MAXN], out[MAXN], wonly[MAXN];
    ctx = tu_ctx();
    const size_t nx = read_f32(ctx, dir, "input.safetensors", "hidden_states", x, 0);
    read_f32(ctx, dir, "expected_fp8_act.safetensors", "output", act, nx);
    read_f32(ctx, dir, "expected.safetensors", "output", wo, nx);
    moe_ctx_free(ctx);
    moe_layer_desc d;
    run_fixture(dir, NULL, 0, x, nx, out, &d);
    assert_string_equal(moe_quant_name(&d.quant), "fp8-tensor-static");
    /* weight-only on request: the old path and bound */
    tu_logcap cap2 = {0};
    ctx = tu_ctx_logging(&cap2, MOE_LOG_INFO);
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    d.quant.act = MOE_QACT_NONE;
    tu_run_layer_ex(ctx, &d, NULL, ck, 0, NULL, x, MOE_DTYPE_F32, (int64_t)nx / d.hidden_size, wonly, NULL, NULL);
    moe_checkpoint_free(ck);
    if (!strstr(cap2.text, "run weight-only as the plan asks (quant.act NONE)"))
        fail_msg("log lacks the weight-only choice:\n%s", cap2.text);
    moe_ctx_free(ctx);
    const double ew = tu_max_abs_diff(wonly, wo, nx), mw = tu_max_abs(wo, nx);
    print_message("qwen3_moe_ct_fp8_static weight-only (quant.act NONE): max |out - weight-only ref| = %.3g of max "
                  "(bound 1e-5)\n",
                  ew / mw);
    assert_true(ew <= 1e-5 * mw);
    print_message("qwen3_moe_ct_fp8_static static (per expert): %.3g of max from vLLM's max-over-experts forward, "
                  "%.3g from the weight-only forward\n",
                  tu_max_abs_diff(out, act, nx) / tu_max_abs(act, nx), tu_max_abs_diff(out, wo, nx) / mw);
    /* bad input_scale tensors */
    char bad[600];
    const edit drop = {.tensor = PFX "experts.4.down_proj.input_scale", .ndim = -1};
    make_copy("qwen3_moe_ct_fp8_static", bad, sizeof bad, NULL, &drop);
    expect_open(bad, MOE_ENOTFOUND, "tensor '" PFX "experts.4.down_proj.input_scale' not found", "static FP8");
    const edit shape = {.tensor = PFX "experts.1.up_proj.input_scale", .ndim = 1, .shape = {2, 0}};
    make_copy("qwen3_moe_ct_fp8_static", bad, sizeof bad, NULL, &shape);
    expect_open(bad, MOE_ESHAPE, "'" PFX "experts.1.up_proj.input_scale': shape [2]", "one input scale per linear");
    const edit zero = {.tensor = PFX "experts.2.gate_proj.input_scale", .poke = 1, .value = 0.0f};
    make_copy("qwen3_moe_ct_fp8_static", bad, sizeof bad, NULL, &zero);
    ctx = tu_ctx();
    expect_error(ctx, tu_load_layer_status(ctx, bad, 0), MOE_EFORMAT,
                 "tensor '" PFX "experts.2.gate_proj.input_scale': entry [0] = 0 is zero", "static FP8 input_scale");
    moe_ctx_free(ctx);
}

/* compressed-tensors FP8 static activations with per-expert input scales that clip (fixtures
 * qwen3_moe_ct_fp8_static_pe: per-tensor weights, qwen3_moe_ct_fp8_static_channel: per-channel;
 * gen_fp8_fixture.py). expected.safetensors is an independent float64 forward that quantizes x
 * and h exactly as moe_quant.h's rule says (f32 quotient, e4m3 nearest even, clamp at 448),
 * each expert with its own scales; the generator asserts that some x elements saturate and that
 * every h element sits farther from an e4m3 rounding midpoint than f32 evaluation can move it.
 * So libmoe's codes are the reference's codes, and the output differs only by f32 rounding of
 * the dot products (each at most (K + 2) 2^-24 of its sum of |terms|, K <= 40), of the router
 * and of the combine: stated bound 1e-5 of max |expected|, the weight-only fixtures' bound for
 * the same reason. On every table: within it, and bit-identical across tables. Printed for
 * contrast: weight-only (quant.act NONE) against its own forward (expected_weight_only, the old
 * bound 1e-5) and against the static forward. Then gate_proj's input_scale of expert 1 lowered
 * below up_proj's: a WARNING naming the experts and the cost, and the output bit-identical (the
 * larger, up_proj's, quantizes the shared input). */
static void test_ct_fp8_static_per_expert(void **s)
{
    (void)s;
    static const char *const fx[2] = {"qwen3_moe_ct_fp8_static_pe", "qwen3_moe_ct_fp8_static_channel"};
    static const char *const scheme[2] = {"fp8-tensor-static", "fp8-channel-static"};
    static float x[MAXN], want[MAXN], wref[MAXN], out[MAXN], first[MAXN], wonly[MAXN];
    for (int v = 0; v < 2; v++) {
        char dir[600];
        tu_data_path(dir, sizeof dir, fx[v]);
        moe_ctx *c0 = tu_ctx();
        const size_t nx = read_f32(c0, dir, "input.safetensors", "hidden_states", x, 0);
        read_f32(c0, dir, "expected.safetensors", "output", want, nx);
        read_f32(c0, dir, "expected_weight_only.safetensors", "output", wref, nx);
        moe_ctx_free(c0);
        const double mx = tu_max_abs(want, nx);
        const char *isas[16];
        size_t n = tu_isa_names(isas, 16);
        int ran = 0;
        for (size_t i = 0; i < n; i++) {
            moe_ctx *probe = ctx_isa(isas[i]);
            if (!probe)
                continue; /* a table this CPU lacks */
            moe_ctx_free(probe);
            moe_layer_desc d;
            run_fixture(dir, isas[i], 0, x, nx, out, &d);
            assert_string_equal(moe_quant_name(&d.quant), scheme[v]);
            const double err = tu_max_abs_diff(out, want, nx);
            print_message("%s isa %s: max |out - static ref| = %.3g (%.3g of max |ref| %.3g; bound 1e-5)\n", fx[v],
                          isas[i], err, err / mx, mx);
            if (!(err <= 1e-5 * mx))
                fail_msg("%s isa %s: max |out - ref| %.3g > 1e-5 * max |ref| %.3g", fx[v], isas[i], err, mx);
            if (ran++ == 0)
                memcpy(first, out, sizeof out);
            else if (!tu_same_bits(out, first, nx))
                fail_msg("%s isa %s: output bits differ from the first table's", fx[v], isas[i]);
        }
        assert_true(ran >= 1);
        run_fixture(dir, NULL, 1, x, nx, wonly, NULL);
        const double ew = tu_max_abs_diff(wonly, wref, nx), mw = tu_max_abs(wref, nx);
        print_message("%s for contrast: weight-only (quant.act NONE) vs its float64 forward %.3g of max (bound 1e-5); "
                      "vs the static forward %.3g of max; static output vs the weight-only forward %.3g of max\n",
                      fx[v], ew / mw, tu_max_abs_diff(wonly, want, nx) / mx, tu_max_abs_diff(first, wref, nx) / mw);
        assert_true(ew <= 1e-5 * mw);
        assert_true(tu_max_abs_diff(first, wref, nx) > 1e-5 * mw); /* the activations' quantization shows */
    }
    /* gate_proj's input_scale of expert 1 below up_proj's: the larger applies, WARNING */
    char dir[600], p[700], bad[600];
    tu_data_path(dir, sizeof dir, fx[0]);
    tu_join(p, sizeof p, dir, "model.safetensors");
    moe_ctx *ctx = tu_ctx();
    moe_safetensors *f;
    assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
    moe_tensor_info t;
    assert_int_equal(moe_safetensors_get(f, PFX "experts.1.up_proj.input_scale", &t), MOE_OK);
    float up1;
    memcpy(&up1, t.data, 4);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
    const edit lower = {.tensor = PFX "experts.1.gate_proj.input_scale", .poke = 1, .value = up1 * 0.5f};
    make_copy(fx[0], bad, sizeof bad, NULL, &lower);
    tu_logcap cap = {0};
    ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    assert_int_equal(tu_load_layer_status(ctx, bad, 0), MOE_OK);
    char w1[200];
    snprintf(w1, sizeof w1, "differ in 1 experts (the first: expert 1, %g and %g)", (double)(up1 * 0.5f), (double)up1);
    const char *subs[] = {"gate_proj.input_scale and up_proj.input_scale", w1, "quantized once with the larger",
                          "2x coarser"};
    for (size_t i = 0; i < 4; i++)
        if (!strstr(cap.text, subs[i]))
            fail_msg("log lacks \"%s\":\n%s", subs[i], cap.text);
    moe_ctx_free(ctx);
    moe_ctx *c0 = tu_ctx();
    const size_t nx = read_f32(c0, dir, "input.safetensors", "hidden_states", x, 0);
    moe_ctx_free(c0);
    run_fixture(dir, NULL, 0, x, nx, first, NULL);
    run_fixture(bad, NULL, 0, x, nx, out, NULL);
    if (!tu_same_bits(out, first, nx))
        fail_msg("gate_proj's smaller input_scale changed the output: the larger (up_proj's) must apply");
    tu_rm_tree(bad);
}

/* weight_scale (compressed-tensors) / weight_scale_inv (HF per-tensor) values that are NaN,
 * infinite, zero or negative: refused with MOE_EFORMAT naming the tensor and the entry (the HF
 * per-tensor scalar when the layer is described; the compressed-tensors scales at load, where
 * their values are read) */
static void test_bad_scale_values(void **s)
{
    (void)s;
    char dir[600];
    const struct {
        const char *fx;
        edit ed;
        int at_load;
        const char *want;
    } cases[] = {
        {"qwen3_moe_fp8_tensor", {.tensor = PFX "experts.3.up_proj.weight_scale_inv", .poke = 1, .value = 0.0f}, 0,
         "tensor '" PFX "experts.3.up_proj.weight_scale_inv': entry [0] = 0 is zero"},
        {"qwen3_moe_fp8_tensor", {.tensor = PFX "experts.0.down_proj.weight_scale_inv", .poke = 1, .value = INFINITY},
         0, "tensor '" PFX "experts.0.down_proj.weight_scale_inv': entry [0] = inf is infinite"},
        {"qwen3_moe_ct_fp8_tensor", {.tensor = PFX "experts.5.gate_proj.weight_scale", .poke = 1, .value = NAN}, 1,
         "tensor '" PFX "experts.5.gate_proj.weight_scale': entry [0] = nan is NaN"},
        {"qwen3_moe_ct_fp8_channel",
         {.tensor = PFX "experts.2.down_proj.weight_scale", .poke = 1, .at = 7, .value = -0.5f}, 1,
         "tensor '" PFX "experts.2.down_proj.weight_scale': entry [7, 0] = -0.5 is negative"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        make_copy(cases[i].fx, dir, sizeof dir, NULL, &cases[i].ed);
        moe_ctx *ctx = tu_ctx();
        if (cases[i].at_load) {
            moe_checkpoint *ck = NULL;
            moe_layer_desc d;
            assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
            assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
            moe_checkpoint_free(ck);
        }
        expect_error(ctx, tu_load_layer_status(ctx, dir, 0), MOE_EFORMAT, cases[i].want, "finite and positive");
        moe_ctx_free(ctx);
        tu_rm_tree(dir);
    }
}

/* every tensor of a/model.safetensors has the name, dtype, shape and bytes of b's, and back */
static void same_tensors(const char *a, const char *b)
{
    moe_ctx *ctx = tu_ctx();
    char pa[700], pb[700];
    tu_join(pa, sizeof pa, a, "model.safetensors");
    tu_join(pb, sizeof pb, b, "model.safetensors");
    moe_safetensors *fa, *fb;
    assert_int_equal(moe_safetensors_open(ctx, pa, &fa), MOE_OK);
    assert_int_equal(moe_safetensors_open(ctx, pb, &fb), MOE_OK);
    assert_int_equal(moe_safetensors_count(fa), moe_safetensors_count(fb));
    for (size_t i = 0; i < moe_safetensors_count(fa); i++) {
        moe_tensor_info ta, tb;
        assert_int_equal(moe_safetensors_at(fa, i, &ta), MOE_OK);
        if (moe_safetensors_get(fb, ta.name, &tb) != MOE_OK)
            fail_msg("%s: tensor '%s' not in %s", pa, ta.name, pb);
        assert_int_equal(ta.dtype, tb.dtype);
        assert_int_equal(ta.ndim, tb.ndim);
        for (int d = 0; d < ta.ndim; d++)
            assert_int_equal(ta.shape[d], tb.shape[d]);
        assert_int_equal(ta.nbytes, tb.nbytes);
        if (memcmp(ta.data, tb.data, ta.nbytes) != 0)
            fail_msg("tensor '%s': bytes differ from the generator's", ta.name);
    }
    moe_safetensors_free(fa);
    moe_safetensors_free(fb);
    moe_ctx_free(ctx);
}

static void test_quantize_writes_ct_fp8(void **s)
{
    (void)s;
    static const char *const schemes[2][2] = {{"fp8-tensor", "qwen3_moe_ct_fp8_tensor"},
                                              {"fp8-channel", "qwen3_moe_ct_fp8_channel"}};
    for (int i = 0; i < 2; i++) {
        moe_ctx *ctx = tu_ctx();
        char in[600], fx[600], root[600], out[700];
        tu_data_path(in, sizeof in, "qwen3_moe_f32");
        tu_data_path(fx, sizeof fx, schemes[i][1]);
        tu_tmpdir(root, sizeof root, "fp8q");
        tu_join(out, sizeof out, root, "out");
        moe_quantize_options o = {.scheme = schemes[i][0]};
        moe_quantize_stats st;
        if (moe_checkpoint_quantize(ctx, in, out, &o, &st) != MOE_OK)
            fail_msg("quantize %s: %s", schemes[i][0], moe_ctx_last_error(ctx));
        assert_int_equal(st.expert_tensors, 3 * E);
        same_tensors(out, fx);
        moe_layer_desc d;
        moe_checkpoint *ck = tu_open_layer(ctx, out, 0, &d);
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name(schemes[i][0], &q), MOE_OK);
        assert_true(moe_quant_equal(&d.quant, &q));
        moe_checkpoint_free(ck);
        moe_ctx_free(ctx);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_fp8_tensor),         cmocka_unit_test(test_ct_fp8_tensor),
        cmocka_unit_test(test_ct_fp8_channel_dynamic), cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_bad_tensors),           cmocka_unit_test(test_quantize_writes_ct_fp8),
        cmocka_unit_test(test_ct_fp8_shared),         cmocka_unit_test(test_bad_scale_values),
        cmocka_unit_test(test_ct_fp8_static),         cmocka_unit_test(test_ct_fp8_static_per_expert),
    };
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
