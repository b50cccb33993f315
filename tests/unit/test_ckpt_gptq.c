/* GPTQ (quant_method "gptq", AutoGPTQ / GPTQModel) and AWQ (quant_method "awq", AutoAWQ gemm)
 * checkpoints: the fixtures of tests/fixtures/gen_gptq_awq_fixture.py (random codes, scales
 * and zero points packed as the formats' published descriptions say) load as libmoe's int4
 * schemes and match the generator's reference: its own numpy unpacking of the stored words
 * (written from the same descriptions, independently of the packer) and a float64 MoE block
 * on those weights (an act-order layer: loaded as its exact f32 dequantization). Bound: the weight-only bound, TU_REASSOC_REL (1e-5) of max |output|.
 * Bad input (a wrong qweight shape, a g_idx entry out of range, bits 3, a missing qzeros, AWQ
 * gemv) is refused with a message naming the tensor or field. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "moe.h"
#include "io/safetensors.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

#define T 5
#define HMAX 128

/* Run layer 0 of checkpoint `dir` on x [T, H]: the output [T, H] (malloc'd). */
static float *run_ckpt(moe_ctx *ctx, const char *dir, const float *x, moe_layer_desc *d)
{
    moe_checkpoint *ck = NULL;
    if (moe_checkpoint_open(ctx, dir, &ck) != MOE_OK || moe_checkpoint_layer_desc(ck, 0, d) != MOE_OK)
        fail_msg("%s: %s", dir, moe_ctx_last_error(ctx));
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    if (moe_plan_create(ctx, d, &plan) != MOE_OK || moe_checkpoint_load_weights(ck, 0, plan, &w) != MOE_OK)
        fail_msg("%s: %s", dir, moe_ctx_last_error(ctx));
    size_t ws = moe_plan_workspace_size(plan, T);
    void *wk = malloc(ws ? ws : 1);
    float *out = malloc(sizeof(float) * (size_t)(T * d->hidden_size)); /* [T, H] */
    assert_int_equal(moe_plan_execute(plan, w, x, T, out, wk, ws), MOE_OK);
    free(wk);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    return out;
}

/* Tensor `name` of `dir`/`file` copied into buf (f32, at most n elements); returns elements. */
static size_t read_f32(moe_ctx *ctx, const char *dir, const char *file, const char *name, float *buf, size_t n)
{
    char p[700];
    tu_join(p, sizeof p, dir, file);
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
    moe_tensor_info t;
    assert_int_equal(moe_safetensors_get(f, name, &t), MOE_OK);
    assert_int_equal(t.dtype, MOE_DTYPE_F32);
    assert_true(t.nbytes <= n * sizeof(float));
    memcpy(buf, t.data, t.nbytes);
    moe_safetensors_free(f);
    return t.nbytes / sizeof(float);
}

static void test_fixtures_match(void **state)
{
    (void)state;
    static const struct {
        const char *fx, *scheme;
    } cases[] = {
        {"qwen3_moe_gptq_sym_g128", "int4-g128"},  /* sym: signed codes (z = 8), no zero points */
        {"qwen3_moe_gptq_asym_g32", "int4-g32-zp"},/* v1 qzeros + 1 */
        {"qwen3_moe_gptq_gm1", "int4-channel"},    /* group_size -1, sym: CHANNEL */
        {"qwen3_moe_awq_g128", "int4-g128-zp"},
        {"mixtral_awq_g64", "int4-g64-zp"},        /* Mixtral's w1 / w3 / w2 under block_sparse_moe */
        /* desc_act, shuffled g_idx, asym, gptq_v2: the exact f32 dequantization */
        {"qwen3_moe_gptq_actorder_g64", "none"},
        /* a GPTQ shared expert, dequantized to f32 at load; routed int4 g64 with v1 zeros */
        {"qwen2_moe_gptq_shared_g64", "int4-g64-zp"},
        {"qwen3_moe_gptq_int8_g128", "int8-g128"}, /* bits 8, sym: I8 GROUP 128 */
    };
    moe_ctx *ctx = tu_ctx();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[600];
        tu_data_path(dir, sizeof dir, cases[i].fx);
        float x[T * HMAX], want[T * HMAX];
        const size_t nx = read_f32(ctx, dir, "input.safetensors", "hidden_states", x, T * HMAX);
        const size_t ny = read_f32(ctx, dir, "expected.safetensors", "output", want, T * HMAX);
        moe_layer_desc d;
        float *got = run_ckpt(ctx, dir, x, &d);
        assert_int_equal(nx, (size_t)(T * d.hidden_size));
        assert_int_equal(ny, nx);
        moe_quant_config q;
        if (strcmp(cases[i].scheme, "none") == 0) {
            memset(&q, 0, sizeof q);
            assert_int_equal(d.weight_dtype, MOE_DTYPE_F32);
        } else if (strcmp(cases[i].scheme, "int8-g128") == 0) { /* no preset name: I8, GROUP 128 */
            memset(&q, 0, sizeof q);
            q.w13 = (moe_qweight){.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_GROUP, .group_size = 128};
            q.w2 = q.w13;
        } else if (strcmp(cases[i].scheme, "int4-channel") == 0) { /* no preset name: INT4, CHANNEL scales */
            memset(&q, 0, sizeof q);
            q.w13 = (moe_qweight){.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_CHANNEL};
            q.w2 = q.w13;
        } else
            assert_int_equal(moe_quant_from_name(cases[i].scheme, &q), MOE_OK);
        if (!moe_quant_equal(&d.quant, &q))
            fail_msg("%s: loaded as %s, expected %s", cases[i].fx, moe_quant_name(&d.quant), cases[i].scheme);
        printf("  %s (%s): %.3g of max from the numpy dequantization's f64 block\n", cases[i].fx, cases[i].scheme,
               tu_check_reassoc(cases[i].fx, got, want, ny));
        free(got);
    }
    moe_ctx_free(ctx);
}

/* ---- bad input: copies of a fixture with one thing changed ---- */

/* Copy fixture `fx` into dst; `key` (if not NULL) of quantization_config set to val (consumed);
 * tensor `drop` left out; tensor `reshape` given shape [a, b] (same bytes); I32 tensor `poke`
 * element 0 set to poke_v. */
static void variant(moe_ctx *ctx, const char *fx, const char *dst, const char *key, json_t *val, const char *drop,
                    const char *reshape, int64_t a, int64_t b, const char *poke, int32_t poke_v)
{
    char src[600], p[800];
    tu_data_path(src, sizeof src, fx);
    mkdir(dst, 0755);
    tu_join(p, sizeof p, src, "config.json");
    json_t *cfg = json_load_file(p, 0, NULL);
    assert_non_null(cfg);
    if (key)
        json_object_set_new(json_object_get(cfg, "quantization_config"), key, val);
    tu_join(p, sizeof p, dst, "config.json");
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
    moe_safetensors *m = NULL;
    tu_join(p, sizeof p, src, "model.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &m), MOE_OK);
    const size_t cnt = moe_safetensors_count(m);
    moe_tensor_out *t = calloc(cnt, sizeof *t); /* [cnt] */
    int32_t *poked = NULL;
    size_t n = 0;
    for (size_t i = 0; i < cnt; i++) {
        moe_tensor_info ti;
        moe_safetensors_at(m, i, &ti);
        if (drop && strcmp(ti.name, drop) == 0)
            continue;
        t[n] = (moe_tensor_out){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim, .data = ti.data};
        memcpy(t[n].shape, ti.shape, sizeof ti.shape);
        if (reshape && strcmp(ti.name, reshape) == 0) {
            assert_true(a * b * 4 == (int64_t)ti.nbytes);
            t[n].shape[0] = a;
            t[n].shape[1] = b;
        }
        if (poke && strcmp(ti.name, poke) == 0) {
            poked = malloc(ti.nbytes); /* the tensor's I32 elements */
            memcpy(poked, ti.data, ti.nbytes);
            poked[0] = poke_v;
            t[n].data = poked;
        }
        n++;
    }
    tu_join(p, sizeof p, dst, "model.safetensors");
    assert_int_equal(moe_safetensors_write(ctx, p, t, n), MOE_OK);
    free(poked);
    free(t);
    moe_safetensors_free(m);
}

/* Open dst and describe layer 0: the status. */
static moe_status open_desc(moe_ctx *ctx, const char *dir)
{
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    moe_layer_desc d;
    if (st == MOE_OK)
        st = moe_checkpoint_layer_desc(ck, 0, &d);
    moe_checkpoint_free(ck);
    return st;
}

static void test_bad_input(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char root[512], d[700];
    tu_tmpdir(root, sizeof root, "gptq_bad");
    const char *e0 = "model.layers.0.mlp.experts.1.up_proj.";
    char nm[200];

    /* qweight [H/8, I] = [16, 64] stored as [32, 32] */
    tu_join(d, sizeof d, root, "qweight_shape");
    snprintf(nm, sizeof nm, "%sqweight", e0);
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, NULL, NULL, NULL, nm, 32, 32, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_ESHAPE, nm, "[32, 32]", "[16, 64]");

    /* g_idx entry 0 = 9 of 4 groups */
    tu_join(d, sizeof d, root, "g_idx_range");
    snprintf(nm, sizeof nm, "%sg_idx", e0);
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, NULL, NULL, NULL, NULL, 0, 0, nm, 9);
    expect_error(ctx, open_desc(ctx, d), MOE_EFORMAT, nm, "entry 0 = 9", "[0, 4)");

    /* bits given as a string: a type error naming what was found */
    tu_join(d, sizeof d, root, "bits_str");
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, "bits", json_string("4"), NULL, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_EFORMAT, "quantization_config.bits' must be an integer",
                 "found a string (\"4\")");
    tu_join(d, sizeof d, root, "sym_str");
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, "sym", json_string("false"), NULL, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_EFORMAT, "quantization_config.sym' must be true or false",
                 "found a string (\"false\")");
    /* checkpoint_format in upper case loads (transformers' GPTQConfig lowercases it) */
    tu_join(d, sizeof d, root, "fmt_upper");
    variant(ctx, "qwen3_moe_gptq_sym_g128", d, "checkpoint_format", json_string("GPTQ"), NULL, NULL, 0, 0, NULL, 0);
    assert_int_equal(tu_load_layer_status(ctx, d, 0), MOE_OK);

    /* bits 3 */
    tu_join(d, sizeof d, root, "bits3");
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, "bits", json_integer(3), NULL, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_EUNSUPPORTED, "quantization_config.bits' = 3", "GPTQ int4");

    /* asymmetric without qzeros */
    tu_join(d, sizeof d, root, "no_qzeros");
    snprintf(nm, sizeof nm, "%sqzeros", e0);
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, NULL, NULL, nm, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_ENOTFOUND, nm);

    /* desc_act true (act-order) with one linear's g_idx missing: refused, never groups k / g guessed */
    tu_join(d, sizeof d, root, "actorder_no_g_idx");
    snprintf(nm, sizeof nm, "%sg_idx", e0);
    variant(ctx, "qwen3_moe_gptq_actorder_g64", d, NULL, NULL, nm, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_ENOTFOUND, nm, "desc_act is true");

    /* AWQ gemv */
    tu_join(d, sizeof d, root, "awq_gemv");
    variant(ctx, "qwen3_moe_awq_g128", d, "version", json_string("gemv"), NULL, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_EUNSUPPORTED, "quantization_config.version' = gemv", "\"gemm\"");

    /* a GPTQ marlin checkpoint_format */
    tu_join(d, sizeof d, root, "marlin");
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, "checkpoint_format", json_string("marlin"), NULL, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_EUNSUPPORTED, "checkpoint_format' = marlin", "gptq_v2");

    /* group_size 16 */
    tu_join(d, sizeof d, root, "g16");
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, "group_size", json_integer(16), NULL, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_EUNSUPPORTED, "group_size' = 16", "multiple of 32");

    /* v1 qzeros word 0 all 15s: zero point 16 */
    tu_join(d, sizeof d, root, "v1_z16");
    snprintf(nm, sizeof nm, "%sqzeros", e0);
    variant(ctx, "qwen3_moe_gptq_asym_g32", d, NULL, NULL, NULL, NULL, 0, 0, nm, -1);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, d, &ck), MOE_OK);
    moe_layer_desc dd;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &dd), MOE_OK); /* describe reads no values */
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create(ctx, &dd, &plan), MOE_OK);
    expect_error(ctx, moe_checkpoint_load_weights(ck, 0, plan, &w), MOE_EFORMAT, "qzeros", "zero point 16");
    moe_plan_free(plan);
    moe_checkpoint_free(ck);

    /* scales that are zero, NaN or negative: refused at load (describe reads no values), naming the
     * tensor and the first [group, out] entry; the int4 group, the AWQ and the act-order (f32)
     * paths alike. The I32 poke writes the first two F16 scales. */
    const struct {
        const char *fx, *proj;
        int32_t v;
        const char *entry;
    } sc[] = {
        {"qwen3_moe_gptq_sym_g128", "experts.2.down_proj", 0, "entry [0, 0] = 0 is zero"},
        {"qwen3_moe_awq_g128", "experts.0.gate_proj", -1, "entry [0, 0] = nan is NaN"},
        {"qwen3_moe_gptq_actorder_g64", "experts.3.up_proj", (int32_t)0xBC00BC00u, "entry [0, 0] = -1 is negative"},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        char sd[64];
        snprintf(sd, sizeof sd, "scales_%zu", i);
        tu_join(d, sizeof d, root, sd);
        snprintf(nm, sizeof nm, "model.layers.0.mlp.%s.scales", sc[i].proj);
        variant(ctx, sc[i].fx, d, NULL, NULL, NULL, NULL, 0, 0, nm, sc[i].v);
        assert_int_equal(open_desc(ctx, d), MOE_OK);
        char want[300];
        snprintf(want, sizeof want, "tensor '%s': %s", nm, sc[i].entry);
        expect_error(ctx, tu_load_layer_status(ctx, d, 0), MOE_EFORMAT, want, "2 of its", "finite and positive");
    }

    /* the first expert's qweight missing: named as '<prefix>.qweight' (what a GPTQ linear
     * stores), not as the float '.weight' of an unquantized layer */
    tu_join(d, sizeof d, root, "no_qweight");
    snprintf(nm, sizeof nm, "model.layers.0.mlp.experts.0.gate_proj.qweight");
    variant(ctx, "qwen3_moe_gptq_sym_g128", d, NULL, NULL, nm, NULL, 0, 0, NULL, 0);
    expect_error(ctx, open_desc(ctx, d), MOE_ENOTFOUND, "tensor 'model.layers.0.mlp.experts.0.gate_proj.qweight' not found",
                 "quant_method gptq");

    tu_rm_tree(root);
    moe_ctx_free(ctx);
}

/* desc_act with a shuffled g_idx: the layer loads as its exact f32 dequantization, logged (INFO)
 * with the tensor, the first act-order entry and the bytes (docs/checkpoints.md). */
static void test_act_order_logged(void **state)
{
    (void)state;
    tu_logcap cap = {0};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_INFO);
    char dir[600];
    tu_data_path(dir, sizeof dir, "qwen3_moe_gptq_actorder_g64");
    float x[T * HMAX];
    read_f32(ctx, dir, "input.safetensors", "hidden_states", x, T * HMAX);
    moe_layer_desc d;
    free(run_ckpt(ctx, dir, x, &d));
    assert_non_null(strstr(cap.text, "experts.0.gate_proj.g_idx': act-order (desc_act) groups"));
    assert_non_null(strstr(cap.text, "dequantized exactly to f32"));
    /* 4 experts x 3 x 64 x 128 weights: 4 bytes each instead of half a byte */
    assert_non_null(strstr(cap.text, "393216 bytes instead of 49152"));
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_act_order_logged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
