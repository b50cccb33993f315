/* moe_checkpoint_quantize on the stacked expert layouts (gpt-oss, Llama-4).
 *
 *  - gpt-oss bf16 -> mxfp4: a bf16 gpt-oss checkpoint written here (H = 64, I = 32, E = 4,
 *    two layers; experts.gate_up_proj [E, H, 2I] interleaved, down_proj [E, I, H], biases) is
 *    quantized. The written *_blocks / *_scales must be byte for byte what this test's own MX
 *    quantizer gives (shared exponent floor(log2(amax)) - 2, e2m1 round to nearest even,
 *    saturating; row n = column n of the bf16 tensor, as transformers' convert_moe_packed_tensors
 *    reads them back); the config must be the released {quant_method: mxfp4,
 *    modules_to_not_convert}; the loaded layer must match an f32 plan on the weights decoded
 *    here within 1e-5 of its largest output (the 4-bit kernels apply the group scale after
 *    the group's dot product). --layers 1 keeps layer 0 in bf16 (named in
 *    modules_to_not_convert, bit-equal to the input).
 *  - tests/fixtures/gpt_oss_bf16_to_mxfp4 (transformers-made, gen_mxfp4_quant_fixture.py): the
 *    written blocks decoded here equal transformers' convert_moe_packed_tensors of a numpy OCP
 *    MX quantization of the same weights, and the loaded layer gives transformers' GptOssMLP
 *    output on them within 1e-5 of its largest magnitude.
 *  - Llama-4 (stacked, gate | up halves) -> int8-channel, int4-g32, fp8-block: written per
 *    expert (experts.<e>.{gate,up,down}_proj.*, llm-compressor's layout); the loaded layer
 *    against an f32 plan on the written codes decoded here (within TU_REASSOC_REL of the
 *    largest output: the kernels apply each scale after its group's dot product); --layers 3 keeps layer 1 stacked bf16 (listed in
 *    `ignore`, bit-equal to the input).
 *  - errors: gpt-oss with a non-mxfp4 scheme, mxfp4 on Llama-4, mxfp4 with I not a multiple
 *    of 32 (transformers' gpt_oss_bf16 fixture), the cancel flag: each leaves nothing behind. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe.h"
#include "quant/convert.h"
#include "testutil.h"

enum { T = 11 };

static moe_status quantize_checked(moe_ctx *ctx, const char *in, const char *out, const char *scheme)
{
    moe_quantize_options o = {.scheme = scheme};
    return moe_checkpoint_quantize(ctx, in, out, &o, NULL);
}

static float bf(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 [n] of uniform values in [lo, hi), row r (of `cols` elements) scaled by 2^(r % 5 - 2). */
static uint16_t *bf16_fill(size_t n, size_t cols, uint64_t seed, float lo, float hi)
{
    float *t = malloc(sizeof(float) * n);
    uint16_t *o = malloc(2 * n);
    tu_fill_uniform(t, n, seed, lo, hi);
    for (size_t i = 0; i < n; i++)
        o[i] = moe_f32_to_bf16(t[i] * ldexpf(1.0f, (int)((i / cols) % 5) - 2));
    free(t);
    return o;
}

/* ---- this test's own MX (OCP) quantizer and decoder ---- */

static float e2m1_value(unsigned c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (c & 8u) ? -mag[c & 7u] : mag[c & 7u];
}

/* |v| -> e2m1 magnitude code, round to nearest even, saturating at 6. */
static unsigned e2m1_code(float a)
{
    if (a >= 6.0f)
        return 7;
    if (a < 2.0f)
        return (unsigned)nearbyintf(a * 2.0f); /* 0, 0.5, ..., 2: codes 0..4 */
    if (a < 4.0f)
        return (unsigned)nearbyintf(a) + 2u;   /* 2, 3, 4: codes 4..6 */
    return nearbyintf(a / 2.0f) == 2.0f ? 6u : 7u; /* 4 or 6 */
}

/* One matrix w [N, K] (K % 32 == 0) -> codes [N, K/2] (low nibble = even k), E8M0 [N, K/32]. */
static void mx_quantize(const float *w, int64_t N, int64_t K, uint8_t *codes, uint8_t *scales)
{
    memset(codes, 0, (size_t)(N * K / 2));
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < K / 32; g++) {
            float amax = 0.0f;
            for (int k = 0; k < 32; k++)
                amax = fmaxf(amax, fabsf(w[n * K + g * 32 + k]));
            int be = 0;
            if (amax > 0.0f) {
                int ex;
                (void)frexpf(amax, &ex); /* amax = m 2^ex, m in [0.5, 1): floor(log2 amax) = ex - 1 */
                be = ex - 1 - 2 + 127;
                be = be < 0 ? 0 : (be > 254 ? 254 : be);
            }
            scales[n * (K / 32) + g] = (uint8_t)be;
            for (int k = 0; k < 32; k++) {
                const float v = w[n * K + g * 32 + k] / ldexpf(1.0f, be - 127);
                const unsigned c = (signbit(v) ? 8u : 0u) | e2m1_code(fabsf(v));
                const int64_t kk = g * 32 + k;
                codes[n * (K / 2) + kk / 2] |= (uint8_t)((kk & 1) ? c << 4 : c);
            }
        }
}

static void mx_decode(const uint8_t *codes, const uint8_t *scales, int64_t N, int64_t K, float *w)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            const uint8_t b = codes[n * (K / 2) + k / 2];
            w[n * K + k] = ldexpf(e2m1_value((k & 1) ? b >> 4 : b & 15u), (int)scales[n * (K / 32) + k / 32] - 127);
        }
}

/* e4m3fn (bias 7, no infinities) -> f32. */
static float e4m3_value(uint8_t c)
{
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v = e == 0 ? ldexpf((float)m / 8.0f, -6) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

/* ---- checkpoints ---- */

static const void *get(moe_safetensors *f, const char *name, moe_dtype dt, int ndim, const int64_t *shape)
{
    moe_tensor_info t;
    if (moe_safetensors_get(f, name, &t) != MOE_OK)
        fail_msg("tensor %s missing", name);
    assert_int_equal(t.dtype, dt);
    assert_int_equal(t.ndim, ndim);
    for (int i = 0; i < ndim; i++)
        if (t.shape[i] != shape[i])
            fail_msg("%s: dim %d is %lld, expected %lld", name, i, (long long)t.shape[i], (long long)shape[i]);
    return t.data;
}

static int has(moe_safetensors *f, const char *name)
{
    moe_tensor_info t;
    return moe_safetensors_get(f, name, &t) == MOE_OK;
}

/* config.json of fixture `fx` with the given integer fields of `sub` ("" = the root) replaced. */
static void write_config(const char *fx, const char *dir, const char *sub, const char *const *keys,
                         const int64_t *vals, int n)
{
    char p[1024];
    tu_data_path(p, sizeof p, fx);
    strcat(p, "/config.json");
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je);
    assert_non_null(cfg);
    json_t *c = *sub ? json_object_get(cfg, sub) : cfg;
    for (int i = 0; i < n; i++)
        json_object_set_new(c, keys[i], json_integer(vals[i]));
    if (!*sub && json_object_get(c, "layer_types")) {
        json_t *lt = json_array();
        for (int i = 0; i < json_integer_value(json_object_get(c, "num_hidden_layers")); i++)
            json_array_append_new(lt, json_string(i % 2 ? "full_attention" : "sliding_attention"));
        json_object_set_new(c, "layer_types", lt);
    }
    tu_join(p, sizeof p, dir, "config.json");
    assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(1)), 0);
    json_decref(cfg);
}

/* gpt-oss: H = 64, I = 32, E = 4, K = 2, two layers, all bf16. */
enum { GH = 64, GI = 32, GE = 4, GK = 2, GL = 2 };

typedef struct oss {
    uint16_t *router[GL], *rbias[GL];  /* [E, H], [E] */
    uint16_t *gu[GL], *gub[GL];        /* [E, H, 2I] interleaved, [E, 2I] */
    uint16_t *dn[GL], *dnb[GL];        /* [E, I, H], [E, H] */
} oss;

static void oss_make(oss *m, const char *dir)
{
    static const char *const keys[] = {"hidden_size", "intermediate_size", "num_local_experts", "num_experts_per_tok",
                                       "num_hidden_layers"};
    const int64_t vals[] = {GH, GI, GE, GK, GL};
    write_config("gpt_oss_bf16", dir, "", keys, vals, 5);
    static char names[GL * 6][96];
    moe_tensor_out t[GL * 6];
    size_t n = 0;
    for (int l = 0; l < GL; l++) {
        const uint64_t s = 1000 + 10 * (uint64_t)l;
        m->router[l] = bf16_fill(GE * GH, GH, s, -1.0f, 1.0f);
        m->rbias[l] = bf16_fill(GE, GE, s + 1, -0.5f, 0.5f);
        m->gu[l] = bf16_fill((size_t)GE * GH * 2 * GI, 2 * GI, s + 2, -0.5f, 0.5f);
        m->gub[l] = bf16_fill(GE * 2 * GI, 2 * GI, s + 3, -0.2f, 0.2f);
        m->dn[l] = bf16_fill((size_t)GE * GI * GH, GH, s + 4, -0.5f, 0.5f);
        m->dnb[l] = bf16_fill(GE * GH, GH, s + 5, -0.2f, 0.2f);
        struct {
            const char *suf;
            void *d;
            int nd;
            int64_t sh[3];
        } x[6] = {{"router.weight", m->router[l], 2, {GE, GH}},
                  {"router.bias", m->rbias[l], 1, {GE}},
                  {"experts.gate_up_proj", m->gu[l], 3, {GE, GH, 2 * GI}},
                  {"experts.gate_up_proj_bias", m->gub[l], 2, {GE, 2 * GI}},
                  {"experts.down_proj", m->dn[l], 3, {GE, GI, GH}},
                  {"experts.down_proj_bias", m->dnb[l], 2, {GE, GH}}};
        for (int i = 0; i < 6; i++) {
            snprintf(names[n], sizeof names[n], "model.layers.%d.mlp.%s", l, x[i].suf);
            t[n] = (moe_tensor_out){.name = names[n], .dtype = MOE_DTYPE_BF16, .ndim = x[i].nd, .data = x[i].d};
            memcpy(t[n].shape, x[i].sh, sizeof x[i].sh);
            n++;
        }
    }
    char p[1024];
    tu_join(p, sizeof p, dir, "model.safetensors");
    moe_ctx *ctx = tu_ctx();
    assert_int_equal(moe_safetensors_write(ctx, p, t, n), MOE_OK);
    moe_ctx_free(ctx);
}

static void oss_free(oss *m)
{
    for (int l = 0; l < GL; l++) {
        free(m->router[l]), free(m->rbias[l]), free(m->gu[l]), free(m->gub[l]), free(m->dn[l]), free(m->dnb[l]);
    }
}

/* Run checkpoint dir's layer `layer` and compare with an f32 plan on gate [E][I, H], up, down
 * [E][H, I] (f32) and the bf16 router / biases of m: within tol * max|ref| (0: bit for bit). */
static void oss_compare(const char *dir, const oss *m, int layer, const float *gate, const float *up,
                        const float *down, double tol, moe_qtype want)
{
    moe_ctx *ctx = tu_ctx();
    moe_checkpoint *ck = NULL;
    if (moe_checkpoint_open(ctx, dir, &ck) != MOE_OK)
        fail_msg("open %s: %s", dir, moe_ctx_last_error(ctx));
    moe_layer_desc d;
    if (moe_checkpoint_layer_desc(ck, layer, &d) != MOE_OK)
        fail_msg("desc: %s", moe_ctx_last_error(ctx));
    assert_int_equal(d.quant.w13.dtype, want);
    assert_int_equal(d.quant.w2.dtype, want);
    float x[T * GH];
    tu_fill_uniform(x, T * GH, 77, -1.0f, 1.0f);
    float out[T * GH], ref[T * GH], wts[T * GK], rwts[T * GK];
    int32_t ids[T * GK], rids[T * GK];
    tu_run_layer_ex(ctx, &d, NULL, ck, layer, NULL, x, MOE_DTYPE_F32, T, out, ids, wts);
    const void *gp[GE], *upp[GE], *dp[GE], *gb[GE], *ub[GE], *db[GE];
    for (int e = 0; e < GE; e++) {
        gp[e] = gate + (size_t)e * GI * GH;
        upp[e] = up + (size_t)e * GI * GH;
        dp[e] = down + (size_t)e * GH * GI;
        gb[e] = m->gub[layer] + e * 2 * GI;
        ub[e] = m->gub[layer] + e * 2 * GI + 1;
        db[e] = m->dnb[layer] + e * GH;
    }
    moe_weight_source src;
    memset(&src, 0, sizeof src);
    src.router = m->router[layer];
    src.router_dtype = MOE_DTYPE_BF16;
    src.router_bias = m->rbias[layer];
    src.router_bias_dtype = MOE_DTYPE_BF16;
    src.gate_proj = gp, src.up_proj = upp, src.down_proj = dp;
    src.gate_bias = gb, src.up_bias = ub, src.down_bias = db;
    src.expert_bias_dtype = MOE_DTYPE_BF16;
    src.gate_up_bias_stride = 2;
    moe_layer_desc d32 = d;
    memset(&d32.quant, 0, sizeof d32.quant);
    d32.weight_dtype = MOE_DTYPE_F32;
    tu_run_layer_ex(ctx, &d32, NULL, NULL, 0, &src, x, MOE_DTYPE_F32, T, ref, rids, rwts);
    assert_memory_equal(ids, rids, sizeof ids);
    const double mx = tu_max_abs(ref, T * GH), diff = tu_max_abs_diff(out, ref, T * GH);
    assert_true(mx > 1e-3);
    if (tol == 0.0 ? memcmp(out, ref, sizeof out) != 0 : diff > tol * mx)
        fail_msg("%s layer %d: max |diff| %g, max |ref| %g, tolerance %g relative", dir, layer, diff, mx, tol);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_gpt_oss_mxfp4(void **state)
{
    (void)state;
    char root[512], in[700], out[700], p[800];
    tu_tmpdir(root, sizeof root, "quantize_oss");
    tu_join(in, sizeof in, root, "in");
    assert_int_equal(mkdir(in, 0755), 0);
    oss m;
    oss_make(&m, in);
    moe_ctx *ctx = tu_ctx();
    tu_join(out, sizeof out, root, "q");
    moe_quantize_options o = {.scheme = "mxfp4"};
    moe_quantize_stats s;
    if (moe_checkpoint_quantize(ctx, in, out, &o, &s) != MOE_OK)
        fail_msg("quantize: %s", moe_ctx_last_error(ctx));
    assert_int_equal(s.expert_tensors, GL * 3 * GE);
    assert_int_equal(s.output_code_bytes, (uint64_t)GL * GE * (2 * GI * GH / 2 + GH * GI / 2));
    assert_int_equal(s.output_scale_bytes, (uint64_t)GL * GE * (2 * GI * GH / 32 + GH * GI / 32));

    /* config: the released Mxfp4Config */
    tu_join(p, sizeof p, out, "config.json");
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je);
    json_t *want = json_pack("{s:[s,s,s,s], s:s}", "modules_to_not_convert", "model.layers.*.self_attn",
                             "model.layers.*.mlp.router", "model.embed_tokens", "lm_head", "quant_method", "mxfp4");
    assert_true(json_equal(json_object_get(cfg, "quantization_config"), want));
    json_decref(want);
    json_decref(cfg);

    /* the tensors, against this test's quantizer; decoded for the f32 reference */
    tu_join(p, sizeof p, out, "model.safetensors");
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
    float *wt = malloc(sizeof(float) * 2 * GI * GH);                    /* one expert [N, K] */
    uint8_t *codes = malloc(2 * GI * GH / 2), *sc = malloc(2 * GI * GH / 32);
    float *gate = malloc(sizeof(float) * GE * GI * GH), *up = malloc(sizeof(float) * GE * GI * GH); /* [E, I, H] */
    float *down = malloc(sizeof(float) * GE * GH * GI);                                              /* [E, H, I] */
    float *deq = malloc(sizeof(float) * 2 * GI * GH);
    for (int l = 0; l < GL; l++) {
        char name[160];
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", l);
        assert_false(has(f, name));
        const int64_t gbs[4] = {GE, 2 * GI, GH / 32, 16}, gss[3] = {GE, 2 * GI, GH / 32};
        const int64_t dbs[4] = {GE, GH, GI / 32, 16}, dss[3] = {GE, GH, GI / 32};
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_blocks", l);
        const uint8_t *gub = get(f, name, MOE_DTYPE_U8, 4, gbs);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_scales", l);
        const uint8_t *gus = get(f, name, MOE_DTYPE_U8, 3, gss);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_blocks", l);
        const uint8_t *dnb = get(f, name, MOE_DTYPE_U8, 4, dbs);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj_scales", l);
        const uint8_t *dns = get(f, name, MOE_DTYPE_U8, 3, dss);
        const int64_t bsh[2] = {GE, 2 * GI};
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj_bias", l);
        assert_memory_equal(get(f, name, MOE_DTYPE_BF16, 2, bsh), m.gub[l], 2 * GE * 2 * GI);
        for (int e = 0; e < GE; e++) {
            /* gate_up: row n = column n of [H, 2I] */
            for (int n = 0; n < 2 * GI; n++)
                for (int k = 0; k < GH; k++)
                    wt[n * GH + k] = bf(m.gu[l][((size_t)e * GH + k) * 2 * GI + n]);
            mx_quantize(wt, 2 * GI, GH, codes, sc);
            assert_memory_equal(gub + (size_t)e * 2 * GI * GH / 2, codes, 2 * GI * GH / 2);
            assert_memory_equal(gus + (size_t)e * 2 * GI * GH / 32, sc, 2 * GI * GH / 32);
            mx_decode(codes, sc, 2 * GI, GH, deq);
            for (int i = 0; i < GI; i++) {
                memcpy(gate + ((size_t)e * GI + i) * GH, deq + (2 * i) * GH, sizeof(float) * GH);
                memcpy(up + ((size_t)e * GI + i) * GH, deq + (2 * i + 1) * GH, sizeof(float) * GH);
            }
            for (int n = 0; n < GH; n++)
                for (int k = 0; k < GI; k++)
                    wt[n * GI + k] = bf(m.dn[l][((size_t)e * GI + k) * GH + n]);
            mx_quantize(wt, GH, GI, codes, sc);
            assert_memory_equal(dnb + (size_t)e * GH * GI / 2, codes, GH * GI / 2);
            assert_memory_equal(dns + (size_t)e * GH * GI / 32, sc, GH * GI / 32);
            mx_decode(codes, sc, GH, GI, down + (size_t)e * GH * GI);
        }
        oss_compare(out, &m, l, gate, up, down, 1e-5, MOE_QTYPE_MXFP4);
    }
    moe_safetensors_free(f);

    /* --layers 1: layer 0 stays bf16 (named in modules_to_not_convert), bit-equal to the input */
    char out1[700];
    tu_join(out1, sizeof out1, root, "q1");
    const int64_t only1[1] = {1};
    moe_quantize_options o1 = {.scheme = "mxfp4", .layers = only1, .n_layers = 1};
    if (moe_checkpoint_quantize(ctx, in, out1, &o1, NULL) != MOE_OK)
        fail_msg("quantize --layers 1: %s", moe_ctx_last_error(ctx));
    tu_join(p, sizeof p, out1, "config.json");
    cfg = json_load_file(p, 0, &je);
    const json_t *keep = json_object_get(json_object_get(cfg, "quantization_config"), "modules_to_not_convert");
    assert_int_equal(json_array_size(keep), 5);
    assert_string_equal(json_string_value(json_array_get(keep, 4)), "model.layers.0.mlp.experts");
    json_decref(cfg);
    for (int e = 0; e < GE; e++) {
        for (int i = 0; i < GI; i++)
            for (int k = 0; k < GH; k++) {
                gate[((size_t)e * GI + i) * GH + k] = bf(m.gu[0][((size_t)e * GH + k) * 2 * GI + 2 * i]);
                up[((size_t)e * GI + i) * GH + k] = bf(m.gu[0][((size_t)e * GH + k) * 2 * GI + 2 * i + 1]);
            }
        for (int n = 0; n < GH; n++)
            for (int k = 0; k < GI; k++)
                down[((size_t)e * GH + n) * GI + k] = bf(m.dn[0][((size_t)e * GI + k) * GH + n]);
    }
    oss_compare(out1, &m, 0, gate, up, down, 0.0, MOE_QTYPE_NONE);

    /* errors: another scheme on gpt-oss; I = 16 (transformers' fixture) is not a multiple of
     * 32; the cancel flag. Nothing is left behind. */
    const int before = tu_dir_entries(root);
    char fx[700], bad[700];
    tu_join(bad, sizeof bad, root, "bad");
    expect_error(ctx, quantize_checked(ctx, in, bad, "int4-g32"), MOE_EUNSUPPORTED,
                 "gpt_oss experts are written as MXFP4 only", "experts.gate_up_proj_blocks / experts.gate_up_proj_scales",
                 "no gpt_oss checkpoint format with expert biases");
    tu_data_path(fx, sizeof fx, "gpt_oss_bf16");
    expect_error(ctx, quantize_checked(ctx, fx, bad, "mxfp4"), MOE_ESHAPE, "multiple of 32");
    volatile int cancel = 1;
    moe_quantize_options oc = {.scheme = "mxfp4", .cancel = &cancel};
    expect_error(ctx, moe_checkpoint_quantize(ctx, in, bad, &oc, NULL), MOE_ECANCELED, "interrupted");
    assert_int_equal(tu_dir_entries(root), before);

    free(wt), free(codes), free(sc), free(gate), free(up), free(down), free(deq);
    oss_free(&m);
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* Llama-4: transformers' llama4_f32 config with H = 64, I = 32, E = 8, four layers of which 1
 * and 3 are MoE (interleave step 2), each with a shared expert of I_s = I; all bf16. */
enum { LH = 64, LI = 32, LE = 8 };
#define LP "language_model.model.layers.1.feed_forward."
#define LP3 "language_model.model.layers.3.feed_forward."

typedef struct l4 {
    uint16_t *router, *gu, *dn, *sg, *su, *sd; /* [E, H], [E, H, 2I], [E, I, H], [I, H], [I, H], [H, I] */
} l4;

static void l4_make(l4 *m, const char *dir)
{
    static const char *const keys[] = {"hidden_size", "intermediate_size", "num_hidden_layers"};
    const int64_t vals[] = {LH, LI, 4};
    write_config("llama4_f32", dir, "text_config", keys, vals, 3);
    char p[1024];
    tu_join(p, sizeof p, dir, "config.json");
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je), *tc = json_object_get(cfg, "text_config");
    json_object_set_new(tc, "moe_layers", json_pack("[i, i]", 1, 3));
    json_object_set_new(tc, "layer_types", json_pack("[s, s, s, s]", "chunked_attention", "chunked_attention",
                                                     "chunked_attention", "full_attention"));
    json_object_set_new(tc, "no_rope_layers", json_pack("[i, i, i, i]", 1, 1, 1, 0));
    assert_int_equal(json_dump_file(cfg, p, JSON_INDENT(1)), 0);
    json_decref(cfg);
    m->router = bf16_fill(LE * LH, LH, 501, -1.0f, 1.0f);
    m->gu = bf16_fill((size_t)LE * LH * 2 * LI, 2 * LI, 502, -0.5f, 0.5f);
    m->dn = bf16_fill((size_t)LE * LI * LH, LH, 503, -0.5f, 0.5f);
    m->sg = bf16_fill(LI * LH, LH, 504, -0.5f, 0.5f);
    m->su = bf16_fill(LI * LH, LH, 505, -0.5f, 0.5f);
    m->sd = bf16_fill(LH * LI, LI, 506, -0.5f, 0.5f);
    /* layer 3: the same tensors (its own names) */
    moe_tensor_out t[12] = {
        {.name = LP "router.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LE, LH}, .data = m->router},
        {.name = LP "experts.gate_up_proj", .dtype = MOE_DTYPE_BF16, .ndim = 3, .shape = {LE, LH, 2 * LI}, .data = m->gu},
        {.name = LP "experts.down_proj", .dtype = MOE_DTYPE_BF16, .ndim = 3, .shape = {LE, LI, LH}, .data = m->dn},
        {.name = LP "shared_expert.gate_proj.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LI, LH}, .data = m->sg},
        {.name = LP "shared_expert.up_proj.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LI, LH}, .data = m->su},
        {.name = LP "shared_expert.down_proj.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LH, LI}, .data = m->sd},
        {.name = LP3 "router.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LE, LH}, .data = m->router},
        {.name = LP3 "experts.gate_up_proj", .dtype = MOE_DTYPE_BF16, .ndim = 3, .shape = {LE, LH, 2 * LI}, .data = m->gu},
        {.name = LP3 "experts.down_proj", .dtype = MOE_DTYPE_BF16, .ndim = 3, .shape = {LE, LI, LH}, .data = m->dn},
        {.name = LP3 "shared_expert.gate_proj.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LI, LH}, .data = m->sg},
        {.name = LP3 "shared_expert.up_proj.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LI, LH}, .data = m->su},
        {.name = LP3 "shared_expert.down_proj.weight", .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {LH, LI}, .data = m->sd},
    };
    tu_join(p, sizeof p, dir, "model.safetensors");
    moe_ctx *ctx = tu_ctx();
    assert_int_equal(moe_safetensors_write(ctx, p, t, 12), MOE_OK);
    moe_ctx_free(ctx);
}

/* Decode the written expert linear `base` ([N, K]) of `scheme` into w [N, K] (this test's
 * decoders of the compressed-tensors / HF FP8 layouts, see docs/quantize.md). */
static void l4_decode(moe_safetensors *f, const char *scheme, const char *base, int64_t N, int64_t K, float *w)
{
    char name[256];
    if (!strcmp(scheme, "fp8-block")) {
        const int64_t sh[2] = {N, K}, ss[2] = {(N + 127) / 128, (K + 127) / 128};
        snprintf(name, sizeof name, "%s.weight", base);
        const uint8_t *q = get(f, name, MOE_DTYPE_F8_E4M3, 2, sh);
        snprintf(name, sizeof name, "%s.weight_scale_inv", base);
        const float *s = get(f, name, MOE_DTYPE_F32, 2, ss);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++)
                w[n * K + k] = e4m3_value(q[n * K + k]) * s[(n / 128) * ss[1] + k / 128];
        return;
    }
    const int bits = !strcmp(scheme, "int8-channel") ? 8 : 4;
    const int64_t G = bits == 8 ? 1 : K / 32, words = K * bits / 32;
    const int64_t sh[2] = {N, words}, ss[2] = {N, G}, ws[1] = {2};
    snprintf(name, sizeof name, "%s.weight_packed", base);
    const uint8_t *q = get(f, name, MOE_DTYPE_I32, 2, sh);
    snprintf(name, sizeof name, "%s.weight_scale", base);
    const float *s = get(f, name, MOE_DTYPE_F32, 2, ss);
    snprintf(name, sizeof name, "%s.weight_shape", base);
    const int64_t *shape = get(f, name, MOE_DTYPE_I64, 1, ws);
    assert_int_equal(shape[0], N);
    assert_int_equal(shape[1], K);
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            int v;
            if (bits == 8) {
                v = (int)q[n * words * 4 + k] - 128; /* stored q + 128 */
            } else {
                const uint8_t b = q[n * words * 4 + k / 2];
                v = (int)((k & 1) ? b >> 4 : b & 15u) - 8; /* stored q + 8 */
            }
            w[n * K + k] = (float)v * s[n * G + (bits == 8 ? 0 : k / 32)];
        }
}

static void test_llama4(void **state)
{
    (void)state;
    char root[512], in[700], out[700], p[800];
    tu_tmpdir(root, sizeof root, "quantize_l4");
    tu_join(in, sizeof in, root, "in");
    assert_int_equal(mkdir(in, 0755), 0);
    l4 m;
    l4_make(&m, in);
    moe_ctx *ctx = tu_ctx();
    static const char *const schemes[] = {"int8-channel", "int4-g32", "fp8-block"};
    float *gate = malloc(sizeof(float) * LE * LI * LH), *up = malloc(sizeof(float) * LE * LI * LH); /* [E, I, H] */
    float *down = malloc(sizeof(float) * LE * LH * LI);                                              /* [E, H, I] */
    float *sh = malloc(sizeof(float) * 3 * LI * LH); /* the shared expert in f32 (exact) */
    for (int i = 0; i < LI * LH; i++) {
        sh[i] = bf(m.sg[i]);
        sh[LI * LH + i] = bf(m.su[i]);
        sh[2 * LI * LH + i] = bf(m.sd[i]);
    }
    for (size_t si = 0; si < sizeof schemes / sizeof schemes[0]; si++) {
        tu_join(out, sizeof out, root, schemes[si]);
        moe_quantize_stats s;
        moe_quantize_options o = {.scheme = schemes[si]};
        if (moe_checkpoint_quantize(ctx, in, out, &o, &s) != MOE_OK)
            fail_msg("quantize %s: %s", schemes[si], moe_ctx_last_error(ctx));
        assert_int_equal(s.expert_tensors, 2 * 3 * LE);
        tu_join(p, sizeof p, out, "model.safetensors");
        moe_safetensors *f = NULL;
        assert_int_equal(moe_safetensors_open(ctx, p, &f), MOE_OK);
        assert_false(has(f, LP "experts.gate_up_proj"));
        assert_false(has(f, LP "experts.down_proj"));
        char base[200];
        for (int e = 0; e < LE; e++) {
            snprintf(base, sizeof base, LP "experts.%d.gate_proj", e);
            l4_decode(f, schemes[si], base, LI, LH, gate + (size_t)e * LI * LH);
            snprintf(base, sizeof base, LP "experts.%d.up_proj", e);
            l4_decode(f, schemes[si], base, LI, LH, up + (size_t)e * LI * LH);
            snprintf(base, sizeof base, LP "experts.%d.down_proj", e);
            l4_decode(f, schemes[si], base, LH, LI, down + (size_t)e * LH * LI);
            /* the decoded weights are the input's, up to the scheme's rounding: gate = the first
             * I columns of gate_up [H, 2I], up the next I */
            for (int i = 0; i < LI; i++)
                for (int k = 0; k < LH; k++) {
                    const float g0 = bf(m.gu[((size_t)e * LH + k) * 2 * LI + i]);
                    const float u0 = bf(m.gu[((size_t)e * LH + k) * 2 * LI + LI + i]);
                    assert_true(fabsf(gate[((size_t)e * LI + i) * LH + k] - g0) <= 0.15f * 2.0f);
                    assert_true(fabsf(up[((size_t)e * LI + i) * LH + k] - u0) <= 0.15f * 2.0f);
                }
        }
        moe_safetensors_free(f);

        moe_checkpoint *ck = NULL;
        if (moe_checkpoint_open(ctx, out, &ck) != MOE_OK)
            fail_msg("open %s: %s", out, moe_ctx_last_error(ctx));
        moe_layer_desc d;
        if (moe_checkpoint_layer_desc(ck, 1, &d) != MOE_OK)
            fail_msg("desc %s: %s", out, moe_ctx_last_error(ctx));
        assert_int_equal(d.family, MOE_FAMILY_LLAMA4);
        assert_int_not_equal(d.quant.w13.dtype, MOE_QTYPE_NONE);
        float x[T * LH], o1[T * LH], ref[T * LH];
        tu_fill_uniform(x, T * LH, 99, -1.0f, 1.0f);
        int32_t ids[T * 8], rids[T * 8];
        float wts[T * 8], rwts[T * 8];
        tu_run_layer_ex(ctx, &d, NULL, ck, 1, NULL, x, MOE_DTYPE_F32, T, o1, ids, wts);
        const void *gp[LE], *upp[LE], *dp[LE];
        for (int e = 0; e < LE; e++) {
            gp[e] = gate + (size_t)e * LI * LH;
            upp[e] = up + (size_t)e * LI * LH;
            dp[e] = down + (size_t)e * LH * LI;
        }
        moe_weight_source src;
        memset(&src, 0, sizeof src);
        src.router = m.router;
        src.router_dtype = MOE_DTYPE_BF16;
        src.gate_proj = gp, src.up_proj = upp, src.down_proj = dp;
        src.shared_gate_proj = sh, src.shared_up_proj = sh + LI * LH, src.shared_down_proj = sh + 2 * LI * LH;
        moe_layer_desc d32 = d;
        memset(&d32.quant, 0, sizeof d32.quant);
        d32.weight_dtype = MOE_DTYPE_F32;
        tu_run_layer_ex(ctx, &d32, NULL, NULL, 0, &src, x, MOE_DTYPE_F32, T, ref, rids, rwts);
        assert_memory_equal(ids, rids, sizeof(int32_t) * (size_t)(T * d.top_k));
        const double mx = tu_max_abs(ref, T * LH), diff = tu_max_abs_diff(o1, ref, T * LH);
        assert_true(mx > 1e-3);
        if (!(diff <= TU_REASSOC_REL * mx)) /* weight-only: the kernels scale after each group */
            fail_msg("llama4 %s: max |diff| %g, max |ref| %g", schemes[si], diff, mx);
        moe_checkpoint_free(ck);
    }
    /* --layers 3 (int4-g32): layer 1 keeps its stacked bf16 experts, listed in `ignore`, and
     * loads unquantized, bit-equal to the input's layer 1 */
    {
        tu_join(out, sizeof out, root, "l3");
        const int64_t only3[1] = {3};
        moe_quantize_options o3 = {.scheme = "int4-g32", .layers = only3, .n_layers = 1};
        if (moe_checkpoint_quantize(ctx, in, out, &o3, NULL) != MOE_OK)
            fail_msg("quantize --layers 3: %s", moe_ctx_last_error(ctx));
        tu_join(p, sizeof p, out, "config.json");
        json_error_t je;
        json_t *cfg = json_load_file(p, 0, &je);
        const json_t *ign = json_object_get(json_object_get(cfg, "quantization_config"), "ignore");
        int listed = 0;
        for (size_t i = 0; i < json_array_size(ign); i++)
            listed |= !strcmp(json_string_value(json_array_get(ign, i)), LP "experts");
        assert_true(listed);
        json_decref(cfg);
        float x[T * LH], a[T * LH], b[T * LH];
        tu_fill_uniform(x, T * LH, 98, -1.0f, 1.0f);
        const char *dirs[2] = {in, out};
        float *outs[2] = {a, b};
        for (int i = 0; i < 2; i++) {
            moe_checkpoint *ck = NULL;
            moe_layer_desc d;
            if (moe_checkpoint_open(ctx, dirs[i], &ck) != MOE_OK || moe_checkpoint_layer_desc(ck, 1, &d) != MOE_OK)
                fail_msg("%s: %s", dirs[i], moe_ctx_last_error(ctx));
            assert_int_equal(d.quant.w13.dtype, MOE_QTYPE_NONE);
            tu_run_layer_ex(ctx, &d, NULL, ck, 1, NULL, x, MOE_DTYPE_F32, T, outs[i], NULL, NULL);
            moe_layer_desc d3;
            assert_int_equal(moe_checkpoint_layer_desc(ck, 3, &d3), MOE_OK);
            assert_int_equal(d3.quant.w13.dtype, i == 0 ? MOE_QTYPE_NONE : MOE_QTYPE_INT4);
            moe_checkpoint_free(ck);
        }
        assert_memory_equal(a, b, sizeof a);
    }
    /* mxfp4 is gpt-oss's format only: refused, nothing left */
    const int before = tu_dir_entries(root);
    tu_join(out, sizeof out, root, "mx");
    expect_error(ctx, quantize_checked(ctx, in, out, "mxfp4"), MOE_EUNSUPPORTED, "gpt_oss only", "int4-g32");
    assert_int_equal(tu_dir_entries(root), before);
    free(gate), free(up), free(down), free(sh);
    free(m.router), free(m.gu), free(m.dn), free(m.sg), free(m.su), free(m.sd);
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* tests/fixtures/gpt_oss_bf16_to_mxfp4 (gen_mxfp4_quant_fixture.py): a bf16 gpt-oss checkpoint
 * saved by transformers, with transformers' convert_moe_packed_tensors of a numpy OCP MX
 * quantization of its experts and GptOssMLP's float32 output on those weights. The written
 * blocks, decoded here, must equal transformers' dequantized experts bit for bit (the codes
 * may differ only in the sign of zero and the exponent of an all-zero group), and the loaded
 * checkpoint must give transformers' output within 1e-5 of its largest magnitude. */
static void test_gpt_oss_transformers(void **state)
{
    (void)state;
    char fx[700], root[512], out[700], p[1024];
    tu_data_path(fx, sizeof fx, "gpt_oss_bf16_to_mxfp4");
    tu_tmpdir(root, sizeof root, "quantize_oss_hf");
    tu_join(out, sizeof out, root, "q");
    moe_ctx *ctx = tu_ctx();
    if (quantize_checked(ctx, fx, out, "mxfp4") != MOE_OK)
        fail_msg("quantize: %s", moe_ctx_last_error(ctx));
    enum { H = 64, I = 32, E = 4, K = 2, TT = 12 };
    moe_safetensors *w = NULL, *r = NULL, *xin = NULL, *ex = NULL;
    tu_join(p, sizeof p, out, "model.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &w), MOE_OK);
    tu_join(p, sizeof p, fx, "mxfp4_ref.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &r), MOE_OK);
    float *deq = malloc(sizeof(float) * 2 * I * H); /* one expert [N, K] */
    for (int j = 0; j < 2; j++) {
        const int64_t N = j == 0 ? 2 * I : H, Kin = j == 0 ? H : I;
        const char *proj = j == 0 ? "gate_up_proj" : "down_proj";
        char name[160];
        const int64_t bs[4] = {E, N, Kin / 32, 16}, ss[3] = {E, N, Kin / 32}, hs[3] = {E, Kin, N};
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%s_blocks", proj);
        const uint8_t *b = get(w, name, MOE_DTYPE_U8, 4, bs);
        snprintf(name, sizeof name, "model.layers.0.mlp.experts.%s_scales", proj);
        const uint8_t *sc = get(w, name, MOE_DTYPE_U8, 3, ss);
        const float *hf = get(r, proj, MOE_DTYPE_F32, 3, hs); /* transformers' [E, K, N] */
        for (int e = 0; e < E; e++) {
            mx_decode(b + (size_t)e * N * Kin / 2, sc + (size_t)e * N * Kin / 32, N, Kin, deq);
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < Kin; k++)
                    if (deq[n * Kin + k] != hf[((size_t)e * Kin + k) * N + n])
                        fail_msg("%s expert %d [n %lld, k %lld]: written %g, transformers %g", proj, e, (long long)n,
                                 (long long)k, deq[n * Kin + k], hf[((size_t)e * Kin + k) * N + n]);
        }
    }
    free(deq);
    tu_join(p, sizeof p, fx, "input.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &xin), MOE_OK);
    tu_join(p, sizeof p, fx, "expected.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &ex), MOE_OK);
    const int64_t xs[2] = {TT, H}, ks[2] = {TT, K};
    const uint16_t *x = get(xin, "hidden_states", MOE_DTYPE_BF16, 2, xs);
    const float *want = get(ex, "output", MOE_DTYPE_F32, 2, xs);
    const int32_t *want_ids = get(ex, "topk_ids", MOE_DTYPE_I32, 2, ks);
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, out, 0, &d);
    assert_string_equal(moe_quant_name(&d.quant), "mxfp4");
    float got[TT * H], wts[TT * K];
    int32_t ids[TT * K];
    tu_run_layer_ex(ctx, &d, NULL, ck, 0, NULL, x, MOE_DTYPE_BF16, TT, got, ids, wts);
    /* the same experts, in any order within a token */
    for (int t = 0; t < TT; t++)
        for (int a = 0; a < K; a++) {
            int found = 0;
            for (int b2 = 0; b2 < K; b2++)
                found |= ids[t * K + a] == want_ids[t * K + b2];
            assert_true(found);
        }
    const double mx = tu_max_abs(want, TT * H), diff = tu_max_abs_diff(got, want, TT * H);
    printf("  gpt_oss_bf16_to_mxfp4: |libmoe - transformers| / max = %.3e (bound 1e-5)\n", diff / mx);
    if (diff > 1e-5 * mx)
        fail_msg("output differs from transformers by %g (max |expected| %g)", diff, mx);
    moe_checkpoint_free(ck);
    moe_safetensors_free(w), moe_safetensors_free(r), moe_safetensors_free(xin), moe_safetensors_free(ex);
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* tests/fixtures/nemotron_h_f32: non-gated experts (up_proj, down_proj, no gate_proj) are not a
 * layout moe quantize writes or src/io reads quantized: refused by name, nothing written. */
static void test_nongated_refused(void **state)
{
    (void)state;
    char fx[700], root[512], out[700];
    tu_data_path(fx, sizeof fx, "nemotron_h_f32");
    tu_tmpdir(root, sizeof root, "quantize_nongated");
    tu_join(out, sizeof out, root, "q");
    moe_ctx *ctx = tu_ctx();
    static const char *const schemes[] = {"int8-channel", "fp8-block", "int4-g128"};
    for (int i = 0; i < 3; i++) {
        expect_error(ctx, quantize_checked(ctx, fx, out, schemes[i]), MOE_EUNSUPPORTED, "nemotron_h",
                     "non-gated", "moe_layer_desc.quant");
        struct stat st;
        assert_true(stat(out, &st) != 0);
    }
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* tests/fixtures/dbrx_f32: DBRX's fused [E I, H] experts (experts.mlp.w1 / v1 / w2) are not a layout
 * moe quantize writes: refused by name, nothing written. */
static void test_dbrx_refused(void **state)
{
    (void)state;
    char fx[700], root[512], out[700];
    tu_data_path(fx, sizeof fx, "dbrx_f32");
    tu_tmpdir(root, sizeof root, "quantize_dbrx");
    tu_join(out, sizeof out, root, "q");
    moe_ctx *ctx = tu_ctx();
    static const char *const schemes[] = {"int8-channel", "fp8-block", "int4-g128"};
    for (int i = 0; i < 3; i++) {
        expect_error(ctx, quantize_checked(ctx, fx, out, schemes[i]), MOE_EUNSUPPORTED, "dbrx stores its experts",
                     "experts.mlp.w1", "per-expert layout");
        struct stat st;
        assert_true(stat(out, &st) != 0);
    }
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* tests/fixtures/ernie4_5_vl_moe_f32: libmoe reads no quantized ERNIE-4.5-VL checkpoint (the
 * vision experts are saved at E..2E-1, which the quantized readers do not number), so moe
 * quantize writes none: refused by name, nothing written. */
static void test_ernie_vl_refused(void **state)
{
    (void)state;
    char fx[700], root[512], out[700];
    tu_data_path(fx, sizeof fx, "ernie4_5_vl_moe_f32");
    tu_tmpdir(root, sizeof root, "quantize_ernie_vl");
    tu_join(out, sizeof out, root, "q");
    moe_ctx *ctx = tu_ctx();
    static const char *const schemes[] = {"int8-channel", "fp8-block", "int4-g128"};
    for (int i = 0; i < 3; i++) {
        expect_error(ctx, quantize_checked(ctx, fx, out, schemes[i]), MOE_EUNSUPPORTED, "ernie4_5_vl_moe",
                     "E..2E-1", "moe_layer_desc.quant");
        struct stat st;
        assert_true(stat(out, &st) != 0);
    }
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ernie_vl_refused),
        cmocka_unit_test(test_gpt_oss_mxfp4),
        cmocka_unit_test(test_gpt_oss_transformers),
        cmocka_unit_test(test_llama4),
        cmocka_unit_test(test_nongated_refused),
        cmocka_unit_test(test_dbrx_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
