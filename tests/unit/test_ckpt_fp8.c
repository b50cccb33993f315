/* FP8 block checkpoints (DeepSeek-V3 / Qwen3-*-FP8 style): a tiny Qwen3-MoE checkpoint written
 * here with config.json quantization_config {quant_method fp8, fmt e4m3, activation_scheme
 * dynamic, weight_block_size [bn, bk]}, F8_E4M3 expert weights and F32 weight_scale_inv block
 * scales (made by moe_quantize_matrix from random f32 weights; I = 80, so 128x128 blocks are
 * partial). The checkpoint path must give the output of an f32 plan on the weights dequantized
 * here (w = e4m3(code) * scale_inv[o / bn][i / bk]) within TU_REASSOC_REL (testutil.h). Then the errors: a scale grid
 * of the wrong shape (MOE_ESHAPE naming tensor, expected, found) and an fp8 shared expert
 * (MOE_EUNSUPPORTED). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

enum { H = 64, I = 80, E = 4, K = 2, IS = 32, T = 7 };
enum { M_OK, M_BAD_SHAPE, M_FP8_SHARED, M_GPTQ };

/* e4m3fn: sign, 4-bit exponent (bias 7), 3-bit mantissa; exponent 0 subnormal m/8 * 2^-6;
 * 0x7f / 0xff NaN, no infinities. */
static float e4m3_value(uint8_t c)
{
    const int s = c >> 7, ex = (c >> 3) & 15, m = c & 7;
    float v;
    if (ex == 15 && m == 7)
        return NAN;
    if (ex == 0)
        v = ldexpf((float)m / 8.0f, -6);
    else
        v = ldexpf(1.0f + (float)m / 8.0f, ex - 7);
    return s ? -v : v;
}

typedef struct fp8_layer {
    float *router;              /* [E, H] */
    float *deq[E][3];           /* dequantized gate [I, H], up [I, H], down [H, I] */
    uint8_t *codes[E][3];
    float *scales[E][3];
    int64_t gr[3], gc[3];       /* scale grid per matrix */
    /* the shared expert (Qwen2-MoE layout, I_s = IS), quantized the same way */
    float *sdeq[3];             /* dequantized gate [IS, H], up [IS, H], down [H, IS] */
    uint8_t *scodes[3];
    float *sscales[3];
} fp8_layer;

/* Quantize a random f32 [N, Kd] (rows and columns of different magnitude) to fp8 blocks and
 * write the test's own dequantization (e4m3_value * s) into *deq. */
static void quant_matrix(const moe_qweight *qw, int64_t N, int64_t Kd, uint64_t seed, uint8_t **codes, float **scales,
                         float **deq)
{
    float *w = malloc(sizeof(float) * (size_t)(N * Kd));
    tu_fill_uniform(w, (size_t)(N * Kd), seed, -0.5f, 0.5f);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < Kd; k++)
            w[n * Kd + k] *= ldexpf(1.0f, (int)((n / 16 + k / 24) % 5) - 2);
    size_t cb, sb, zb;
    assert_int_equal(moe_quantize_matrix_sizes(qw, N, Kd, &cb, &sb, &zb), MOE_OK);
    *codes = malloc(cb);
    *scales = malloc(sb);
    assert_int_equal(moe_quantize_matrix(qw, w, N, Kd, *codes, *scales, NULL), MOE_OK);
    const int64_t gc = (Kd + qw->block_k - 1) / qw->block_k;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < Kd; k++)
            w[n * Kd + k] = e4m3_value((*codes)[n * Kd + k]) * (*scales)[(n / qw->block_n) * gc + k / qw->block_k];
    *deq = w;
}

static void layer_make(fp8_layer *L, int64_t bn, int64_t bk)
{
    const moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_BLOCK, .block_n = bn, .block_k = bk};
    L->router = malloc(sizeof(float) * E * H);
    tu_fill_uniform(L->router, E * H, 11, -1.0f, 1.0f);
    for (int m = 0; m < 3; m++) {
        const int64_t N = m == 2 ? H : I, Kd = m == 2 ? I : H;
        L->gr[m] = (N + bn - 1) / bn;
        L->gc[m] = (Kd + bk - 1) / bk;
    }
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            const int64_t N = m == 2 ? H : I, Kd = m == 2 ? I : H;
            float *w = malloc(sizeof(float) * (size_t)(N * Kd));
            tu_fill_uniform(w, (size_t)(N * Kd), 100 + (uint64_t)(3 * e + m), -0.5f, 0.5f);
            /* rows of different magnitude so the block scales differ */
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < Kd; k++)
                    w[n * Kd + k] *= ldexpf(1.0f, (int)((n / 16 + k / 24) % 5) - 2);
            size_t cb, sb, zb;
            assert_int_equal(moe_quantize_matrix_sizes(&qw, N, Kd, &cb, &sb, &zb), MOE_OK);
            assert_int_equal(cb, (size_t)(N * Kd));
            assert_int_equal(sb, sizeof(float) * (size_t)(L->gr[m] * L->gc[m]));
            L->codes[e][m] = malloc(cb);
            L->scales[e][m] = malloc(sb);
            assert_int_equal(moe_quantize_matrix(&qw, w, N, Kd, L->codes[e][m], L->scales[e][m], NULL), MOE_OK);
            L->deq[e][m] = w; /* overwritten with the dequantized values */
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < Kd; k++)
                    w[n * Kd + k] = e4m3_value(L->codes[e][m][n * Kd + k]) *
                                    L->scales[e][m][(n / bn) * L->gc[m] + k / bk];
        }
    for (int m = 0; m < 3; m++)
        quant_matrix(&qw, m == 2 ? H : IS, m == 2 ? IS : H, 900 + (uint64_t)m, &L->scodes[m], &L->sscales[m],
                     &L->sdeq[m]);
}

static void layer_free(fp8_layer *L)
{
    free(L->router);
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            free(L->deq[e][m]);
            free(L->codes[e][m]);
            free(L->scales[e][m]);
        }
    for (int m = 0; m < 3; m++) {
        free(L->sdeq[m]);
        free(L->scodes[m]);
        free(L->sscales[m]);
    }
}

/* Write the checkpoint into a fresh folder `dir`. */
static void write_ckpt(moe_ctx *ctx, const fp8_layer *L, int64_t bn, int64_t bk, int mode, char *dir, size_t len)
{
    tu_tmpdir(dir, len, "fp8");
    char cfg[1024], path[700];
    const int q2 = mode == M_FP8_SHARED;
    int n = snprintf(cfg, sizeof cfg,
                     "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d,"
                     " \"moe_intermediate_size\": %d, \"num_experts\": %d, \"num_experts_per_tok\": %d,"
                     " \"num_hidden_layers\": 1, \"norm_topk_prob\": true, \"hidden_act\": \"silu\",",
                     q2 ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM", q2 ? "qwen2_moe" : "qwen3_moe", H, I, E, K);
    if (q2)
        n += snprintf(cfg + n, sizeof cfg - (size_t)n, " \"shared_expert_intermediate_size\": %d,", IS);
    snprintf(cfg + n, sizeof cfg - (size_t)n,
             " \"quantization_config\": {\"quant_method\": \"%s\", \"fmt\": \"e4m3\","
             " \"activation_scheme\": \"dynamic\", \"weight_block_size\": [%lld, %lld]}}",
             mode == M_GPTQ ? "bitsandbytes" : "fp8", (long long)bn, (long long)bk);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, cfg, strlen(cfg)), 0);

    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    moe_tensor_out t[64];
    char names[64][128];
    size_t nt = 0;
    static const float norm[4] = {1, 1, 1, 1};
    t[nt] = (moe_tensor_out){.name = "model.norm.weight", .dtype = MOE_DTYPE_F32, .ndim = 1, .shape = {4},
                             .data = norm};
    nt++;
    t[nt] = (moe_tensor_out){.name = "model.layers.0.mlp.gate.weight", .dtype = MOE_DTYPE_F32, .ndim = 2,
                             .shape = {E, H}, .data = L->router};
    nt++;
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            const int64_t N = m == 2 ? H : I, Kd = m == 2 ? I : H;
            snprintf(names[nt], sizeof names[nt], "model.layers.0.mlp.experts.%d.%s.weight", e, proj[m]);
            t[nt] = (moe_tensor_out){.name = names[nt], .dtype = MOE_DTYPE_F8_E4M3, .ndim = 2, .shape = {N, Kd},
                                     .data = L->codes[e][m]};
            nt++;
            snprintf(names[nt], sizeof names[nt], "model.layers.0.mlp.experts.%d.%s.weight_scale_inv", e, proj[m]);
            t[nt] = (moe_tensor_out){.name = names[nt], .dtype = MOE_DTYPE_F32, .ndim = 2,
                                     .shape = {L->gr[m], L->gc[m]}, .data = L->scales[e][m]};
            if (mode == M_BAD_SHAPE && e == 1 && m == 2) /* the transposed grid, one row short */
                t[nt].shape[0] = L->gr[m] + 1, t[nt].shape[1] = 1;
            nt++;
        }
    if (q2) {
        /* the shared expert in fp8 too, with its own block scales (DeepSeek-V3 FP8 does this) */
        for (int m = 0; m < 3; m++) {
            const int64_t N = m == 2 ? H : IS, Kd = m == 2 ? IS : H;
            snprintf(names[nt], sizeof names[nt], "model.layers.0.mlp.shared_expert.%s.weight", proj[m]);
            t[nt] = (moe_tensor_out){.name = names[nt], .dtype = MOE_DTYPE_F8_E4M3, .ndim = 2, .shape = {N, Kd},
                                     .data = L->scodes[m]};
            nt++;
            snprintf(names[nt], sizeof names[nt], "model.layers.0.mlp.shared_expert.%s.weight_scale_inv", proj[m]);
            t[nt] = (moe_tensor_out){.name = names[nt], .dtype = MOE_DTYPE_F32, .ndim = 2,
                                     .shape = {(N + bn - 1) / bn, (Kd + bk - 1) / bk}, .data = L->sscales[m]};
            nt++;
        }
        snprintf(names[nt], sizeof names[nt], "model.layers.0.mlp.shared_expert_gate.weight");
        t[nt] = (moe_tensor_out){.name = names[nt], .dtype = MOE_DTYPE_F32, .ndim = 2, .shape = {1, H},
                                 .data = L->router};
        nt++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(moe_safetensors_write(ctx, path, t, nt), MOE_OK);
}

static void run_plan(moe_ctx *ctx, const moe_layer_desc *d, moe_checkpoint *ck, const moe_weight_source *src,
                     const float *x, float *out, int32_t *ids, float *wts)
{
    tu_run_layer_ex(ctx, d, NULL, ck, 0, src, x, MOE_DTYPE_F32, T, out, ids, wts);
}

/* The f32 source of L's dequantized weights (router, routed experts through gp/up/dp [E], and
 * the shared expert's, used when the description has one). */
static void deq_source(const fp8_layer *L, const void **gp, const void **up, const void **dp, moe_weight_source *src)
{
    for (int e = 0; e < E; e++)
        gp[e] = L->deq[e][0], up[e] = L->deq[e][1], dp[e] = L->deq[e][2];
    memset(src, 0, sizeof *src);
    src->router = L->router;
    src->router_dtype = MOE_DTYPE_F32;
    src->gate_proj = gp;
    src->up_proj = up;
    src->down_proj = dp;
    src->shared_gate_proj = L->sdeq[0];
    src->shared_up_proj = L->sdeq[1];
    src->shared_down_proj = L->sdeq[2];
}

static void check_blocks(int64_t bn, int64_t bk)
{
    moe_ctx *ctx = tu_ctx();
    fp8_layer L;
    layer_make(&L, bn, bk);
    char dir[512];
    write_ckpt(ctx, &L, bn, bk, M_OK, dir, sizeof dir);
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    assert_int_equal(d.family, MOE_FAMILY_QWEN3_MOE);
    assert_int_equal(d.weight_dtype, MOE_DTYPE_F32); /* no shared expert: the router's */
    const moe_qweight *qs[2] = {&d.quant.w13, &d.quant.w2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(qs[i]->dtype, MOE_QTYPE_F8_E4M3);
        assert_int_equal(qs[i]->scale, MOE_QSCALE_BLOCK);
        assert_int_equal(qs[i]->block_n, bn);
        assert_int_equal(qs[i]->block_k, bk);
    }
    assert_int_equal(d.quant.act, MOE_QACT_NONE);

    float x[T * H];
    tu_fill_uniform(x, T * H, 5, -1.5f, 1.5f);
    float out[T * H], ref[T * H], wts[T * K], rwts[T * K];
    int32_t ids[T * K], rids[T * K];
    run_plan(ctx, &d, ck, NULL, x, out, ids, wts);

    /* f32 plan on the dequantized weights */
    const void *gp[E], *up[E], *dp[E];
    moe_weight_source src;
    deq_source(&L, gp, up, dp, &src);
    moe_layer_desc d32 = d;
    memset(&d32.quant, 0, sizeof d32.quant);
    d32.weight_dtype = MOE_DTYPE_F32;
    run_plan(ctx, &d32, NULL, &src, x, ref, rids, rwts);
    char what[64];
    snprintf(what, sizeof what, "fp8 block %lldx%lld", (long long)bn, (long long)bk);
    tu_check_reassoc(what, out, ref, T * H);
    assert_memory_equal(ids, rids, sizeof ids);
    assert_memory_equal(wts, rwts, sizeof wts);
    assert_true(tu_max_abs(ref, T * H) > 1e-3);

    /* a plan without the checkpoint's quantization is refused, naming the field */
    moe_plan *p32 = NULL;
    assert_int_equal(moe_plan_create(ctx, &d32, &p32), MOE_OK);
    moe_weights *w = NULL;
    expect_error(ctx, moe_checkpoint_load_weights(ck, 0, p32, &w), MOE_EINVAL, "quant.w13.dtype");
    assert_null(w);
    moe_plan_free(p32);

    moe_checkpoint_free(ck);
    tu_rm_tree(dir);
    layer_free(&L);
    moe_ctx_free(ctx);
}

static void test_fp8_block_128(void **state)
{
    (void)state;
    check_blocks(128, 128); /* I = 80, H = 64: one partial block per matrix */
}

static void test_fp8_block_small(void **state)
{
    (void)state;
    check_blocks(32, 48); /* several blocks, partial ones at the ends of both axes */
}

static void test_fp8_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    fp8_layer L;
    layer_make(&L, 32, 48);
    char dir[512];
    moe_checkpoint *ck = NULL;
    moe_layer_desc d;

    /* down_proj [H, I] = [64, 80] with [32, 48] blocks: grid [2, 2]; written [3, 1] */
    write_ckpt(ctx, &L, 32, 48, M_BAD_SHAPE, dir, sizeof dir);
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    expect_error(ctx, moe_checkpoint_layer_desc(ck, 0, &d), MOE_ESHAPE,
                 "model.layers.0.mlp.experts.1.down_proj.weight_scale_inv", "expected", "[2, 2]", "found [3, 1]");
    moe_checkpoint_free(ck);
    tu_rm_tree(dir);

    /* a quantization method libmoe does not read (bitsandbytes; M_GPTQ named it before GPTQ was read): refused when the checkpoint is opened,
     * not later as a missing tensor */
    write_ckpt(ctx, &L, 32, 48, M_GPTQ, dir, sizeof dir);
    expect_error(ctx, moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED, "quantization_config.quant_method",
                 "'bitsandbytes'", "mxfp4 (gpt_oss)", "compressed-tensors", "gptq (int4 / int8) and awq (int4)");
    assert_null(ck);
    tu_rm_tree(dir);

    layer_free(&L);
    moe_ctx_free(ctx);
}

/* An FP8 shared expert (Qwen2-MoE layout, gated): dequantized to f32 at load, so the layer is
 * bit-identical to an f32 plan on the test's own dequantization of every fp8 weight. */
static void test_fp8_shared_expert(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    fp8_layer L;
    layer_make(&L, 32, 48);
    char dir[512];
    write_ckpt(ctx, &L, 32, 48, M_FP8_SHARED, dir, sizeof dir);
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    assert_int_equal(d.shared_expert_intermediate_size, IS);
    assert_int_equal(d.weight_dtype, MOE_DTYPE_F32); /* the dequantized shared expert's */
    assert_int_equal(d.quant.w13.dtype, MOE_QTYPE_F8_E4M3);
    float x[T * H];
    tu_fill_uniform(x, T * H, 6, -1.5f, 1.5f);
    float out[T * H], ref[T * H], wts[T * K], rwts[T * K];
    int32_t ids[T * K], rids[T * K];
    run_plan(ctx, &d, ck, NULL, x, out, ids, wts);

    const void *gp[E], *up[E], *dp[E];
    moe_weight_source src;
    deq_source(&L, gp, up, dp, &src);
    src.shared_expert_gate = L.router; /* the checkpoint's [1, H]: the router's first row */
    moe_layer_desc d32 = d;
    memset(&d32.quant, 0, sizeof d32.quant);
    run_plan(ctx, &d32, NULL, &src, x, ref, rids, rwts);
    tu_check_reassoc("fp8 shared expert", out, ref, T * H);
    assert_memory_equal(ids, rids, sizeof ids);
    assert_true(tu_max_abs(ref, T * H) > 1e-3);
    moe_checkpoint_free(ck);
    tu_rm_tree(dir);
    layer_free(&L);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_block_128),
        cmocka_unit_test(test_fp8_block_small),
        cmocka_unit_test(test_fp8_errors),
        cmocka_unit_test(test_fp8_shared_expert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
