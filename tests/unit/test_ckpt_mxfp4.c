/* gpt-oss MXFP4 checkpoints (the format openai/gpt-oss-20b / -120b ship in): per MoE layer
 * P.experts.gate_up_proj_blocks [E, 2I, H/32, 16] U8, gate_up_proj_scales [E, 2I, H/32] U8
 * (E8M0), down_proj_blocks [E, H, I/32, 16], down_proj_scales [E, H, I/32], bf16 biases, and
 * config.json quantization_config {quant_method: mxfp4}.
 *
 * The checkpoint path must give the output of an f32 plan on the weights dequantized here,
 * independently of the library, within TU_REASSOC_REL (testutil.h: the kernels scale after
 * each group's dot product): w[n][k] = e2m1(nibble) * 2^(scale - 127),
 * input k = 32 g + 2 b in the low nibble of byte b of group g and k + 1 in the high one, and
 * gate_up's rows interleaved (gate = even rows, up = odd rows), as transformers'
 * convert_moe_packed_tensors and GptOssExperts._apply_gate read them. Once on the committed
 * fixture gpt_oss_mxfp4 (whose output test_fixtures compares with transformers' GptOssMLP),
 * once on a checkpoint written here with random bytes (every nibble, both signs of zero).
 * Then the errors: blocks / scales of the wrong shape or dtype, a missing scales tensor, sizes
 * that are not multiples of 32, mxfp4 on another family; and a layer kept in bf16
 * (modules_to_not_convert) loads unquantized. */
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

/* e2m1 (OCP MX): bit 3 sign, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 */
static float e2m1_value(unsigned c)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (c & 8u) ? -mag[c & 7u] : mag[c & 7u];
}

/* Dequantize one expert's MXFP4 matrix: blocks [N, K/2] bytes, scales [N, K/32] -> w [N, K]. */
static void dequant(const uint8_t *blocks, const uint8_t *scales, int64_t N, int64_t K, float *w)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) {
            const uint8_t b = blocks[n * (K / 2) + k / 2];
            const unsigned nib = (k % 2 == 0) ? (b & 15u) : (b >> 4);
            w[n * K + k] = ldexpf(e2m1_value(nib), (int)scales[n * (K / 32) + k / 32] - 127);
        }
}

/* The layer as the checkpoint holds it (pointers into a mapped file or test buffers). */
typedef struct oss_layer {
    int64_t H, I, E, K;
    const void *router, *router_bias;     /* [E, H], [E] */
    moe_dtype router_dtype;               /* of router and router_bias */
    const void *gu_bias, *dn_bias;        /* [E, 2I] (interleaved), [E, H] */
    moe_dtype bias_dtype;
    const uint8_t *gu_blocks, *gu_scales; /* [E, 2I, H/32, 16], [E, 2I, H/32] */
    const uint8_t *dn_blocks, *dn_scales; /* [E, H, I/32, 16], [E, H, I/32] */
} oss_layer;

/* Run `d` on x [T, H] (dtype xdt): from the checkpoint `ck`, or from `src`. */
static void run_plan(moe_ctx *ctx, const moe_layer_desc *d, moe_checkpoint *ck, const moe_weight_source *src,
                     const void *x, moe_dtype xdt, int64_t T, float *out, int32_t *ids, float *wts)
{
    tu_run_layer_ex(ctx, d, NULL, ck, 0, src, x, xdt, T, out, ids, wts);
}

/* Open `dir`, check the description, run layer 0 on x [T, H] through the checkpoint and
 * through an f32 plan on the weights dequantized here; the two must agree within TU_REASSOC_REL. */
static void check_bits(const char *dir, const oss_layer *L, const void *x, moe_dtype xdt, int64_t T)
{
    moe_ctx *ctx = tu_ctx();
    const int64_t H = L->H, I = L->I, E = L->E, K = L->K;
    moe_layer_desc d;
    moe_checkpoint *ck = tu_open_layer(ctx, dir, 0, &d);
    assert_int_equal(d.family, MOE_FAMILY_GPT_OSS);
    assert_int_equal(d.hidden_size, H);
    assert_int_equal(d.moe_intermediate_size, I);
    assert_int_equal(d.weight_dtype, L->router_dtype); /* no shared expert: the router's */
    const moe_qweight *qs[2] = {&d.quant.w13, &d.quant.w2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(qs[i]->dtype, MOE_QTYPE_MXFP4);
        assert_int_equal(qs[i]->scale, MOE_QSCALE_GROUP);
        assert_int_equal(qs[i]->group_size, 32);
        assert_int_equal(qs[i]->has_zero_point, 0);
    }
    assert_int_equal(d.quant.act, MOE_QACT_NONE);
    assert_string_equal(moe_quant_name(&d.quant), "mxfp4");

    float *out = malloc(sizeof(float) * (size_t)(T * H)), *ref = malloc(sizeof(float) * (size_t)(T * H));
    float *wts = malloc(sizeof(float) * (size_t)(T * K)), *rwts = malloc(sizeof(float) * (size_t)(T * K));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * K)), *rids = malloc(sizeof(int32_t) * (size_t)(T * K));
    run_plan(ctx, &d, ck, NULL, x, xdt, T, out, ids, wts);

    /* f32 plan on the dequantized weights: gate = even rows of gate_up, up = odd rows */
    float *gu = malloc(sizeof(float) * (size_t)(2 * I * H));        /* one expert [2I, H] */
    float *gate = malloc(sizeof(float) * (size_t)(E * I * H));     /* [E, I, H] */
    float *up = malloc(sizeof(float) * (size_t)(E * I * H));       /* [E, I, H] */
    float *down = malloc(sizeof(float) * (size_t)(E * H * I));     /* [E, H, I] */
    const void **gp = calloc((size_t)E, sizeof *gp), **up_p = calloc((size_t)E, sizeof *up_p);
    const void **dp = calloc((size_t)E, sizeof *dp);
    const void **gb = calloc((size_t)E, sizeof *gb), **ub = calloc((size_t)E, sizeof *ub);
    const void **db = calloc((size_t)E, sizeof *db);
    const size_t bs = moe_dtype_size(L->bias_dtype);
    for (int64_t e = 0; e < E; e++) {
        dequant(L->gu_blocks + e * 2 * I * (H / 2), L->gu_scales + e * 2 * I * (H / 32), 2 * I, H, gu);
        for (int64_t j = 0; j < I; j++) {
            memcpy(gate + (e * I + j) * H, gu + (2 * j) * H, sizeof(float) * (size_t)H);
            memcpy(up + (e * I + j) * H, gu + (2 * j + 1) * H, sizeof(float) * (size_t)H);
        }
        dequant(L->dn_blocks + e * H * (I / 2), L->dn_scales + e * H * (I / 32), H, I, down + e * H * I);
        gp[e] = gate + e * I * H;
        up_p[e] = up + e * I * H;
        dp[e] = down + e * H * I;
        gb[e] = (const uint8_t *)L->gu_bias + (size_t)(e * 2 * I) * bs;
        ub[e] = (const uint8_t *)gb[e] + bs;
        db[e] = (const uint8_t *)L->dn_bias + (size_t)(e * H) * bs;
    }
    moe_weight_source src;
    memset(&src, 0, sizeof src);
    src.router = L->router;
    src.router_dtype = L->router_dtype;
    src.router_bias = L->router_bias;
    src.router_bias_dtype = L->router_dtype;
    src.gate_proj = gp;
    src.up_proj = up_p;
    src.down_proj = dp;
    src.gate_bias = gb;
    src.up_bias = ub;
    src.down_bias = db;
    src.expert_bias_dtype = L->bias_dtype;
    src.gate_up_bias_stride = 2;
    moe_layer_desc d32 = d;
    memset(&d32.quant, 0, sizeof d32.quant);
    d32.weight_dtype = MOE_DTYPE_F32;
    run_plan(ctx, &d32, NULL, &src, x, xdt, T, ref, rids, rwts);
    tu_check_reassoc(dir, out, ref, (size_t)(T * H));
    assert_memory_equal(ids, rids, sizeof(int32_t) * (size_t)(T * K));
    assert_memory_equal(wts, rwts, sizeof(float) * (size_t)(T * K));
    assert_true(tu_max_abs(ref, (size_t)(T * H)) > 1e-3);

    /* a plan without the checkpoint's quantization is refused, naming the field */
    moe_plan *p32 = NULL;
    assert_int_equal(moe_plan_create(ctx, &d32, &p32), MOE_OK);
    moe_weights *w = NULL;
    expect_error(ctx, moe_checkpoint_load_weights(ck, 0, p32, &w), MOE_EINVAL, "quant.w13.dtype");
    assert_null(w);
    moe_plan_free(p32);

    free(gu), free(gate), free(up), free(down);
    free(gp), free(up_p), free(dp), free(gb), free(ub), free(db);
    free(out), free(ref), free(wts), free(rwts), free(ids), free(rids);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* A tensor of the fixture's model.safetensors, with the dtype and rank it must have. */
static const void *fixture_tensor(moe_safetensors *f, const char *name, moe_dtype dt, int ndim)
{
    moe_tensor_info ti;
    if (moe_safetensors_get(f, name, &ti) != MOE_OK)
        fail_msg("fixture gpt_oss_mxfp4: tensor %s missing", name);
    assert_int_equal(ti.dtype, dt);
    assert_int_equal(ti.ndim, ndim);
    return ti.data;
}

/* The committed fixture (generated by gen_fixtures.py from transformers' GptOssMLP). */
static void test_fixture_bits(void **state)
{
    (void)state;
    char dir[1024], path[1200];
    tu_data_path(dir, sizeof dir, "gpt_oss_mxfp4");
    moe_ctx *ctx = tu_ctx();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    moe_safetensors *f = NULL;
    if (moe_safetensors_open(ctx, path, &f) != MOE_OK)
        fail_msg("%s: %s", path, moe_ctx_last_error(ctx));
    const char *p = "model.layers.0.mlp.";
    char name[256];
    oss_layer L = {.H = 96, .I = 64, .E = 8, .K = 4, .router_dtype = MOE_DTYPE_BF16, .bias_dtype = MOE_DTYPE_BF16};
#define FX(field, suffix, dt, nd)                                     \
    snprintf(name, sizeof name, "%s%s", p, suffix);                   \
    L.field = fixture_tensor(f, name, dt, nd)
    FX(router, "router.weight", MOE_DTYPE_BF16, 2);
    FX(router_bias, "router.bias", MOE_DTYPE_BF16, 1);
    FX(gu_bias, "experts.gate_up_proj_bias", MOE_DTYPE_BF16, 2);
    FX(dn_bias, "experts.down_proj_bias", MOE_DTYPE_BF16, 2);
    FX(gu_blocks, "experts.gate_up_proj_blocks", MOE_DTYPE_U8, 4);
    FX(gu_scales, "experts.gate_up_proj_scales", MOE_DTYPE_U8, 3);
    FX(dn_blocks, "experts.down_proj_blocks", MOE_DTYPE_U8, 4);
    FX(dn_scales, "experts.down_proj_scales", MOE_DTYPE_U8, 3);
#undef FX
    snprintf(path, sizeof path, "%s/input.safetensors", dir);
    moe_safetensors *in = NULL;
    if (moe_safetensors_open(ctx, path, &in) != MOE_OK)
        fail_msg("%s: %s", path, moe_ctx_last_error(ctx));
    moe_tensor_info xi;
    assert_int_equal(moe_safetensors_get(in, "hidden_states", &xi), MOE_OK);
    assert_int_equal(xi.dtype, MOE_DTYPE_BF16);
    assert_int_equal(xi.shape[1], L.H);
    void *x = malloc(xi.nbytes); /* aligned copy of [T, H] bf16 */
    memcpy(x, xi.data, xi.nbytes);
    check_bits(dir, &L, x, MOE_DTYPE_BF16, xi.shape[0]);
    free(x);
    moe_safetensors_free(in);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
}

/* ---- checkpoints written here ------------------------------------------------------------ */

enum { SH = 64, SI = 96, SE = 4, SK = 2, ST = 9 };

enum {
    M_OK,            /* a valid MXFP4 checkpoint */
    M_BLOCKS_SHAPE,  /* gate_up_proj_blocks [E, 2I, H/32, 8] */
    M_SCALES_SHAPE,  /* down_proj_scales [E, I/32, H] (transposed) */
    M_SCALES_MISSING,/* no down_proj_scales */
    M_BLOCKS_DTYPE,  /* gate_up_proj_blocks I8 */
    M_ODD_SIZE,      /* config intermediate_size 80, not a multiple of 32 */
    M_BF16_LAYER,    /* quantization_config mxfp4, but the layer kept in bf16 (gate_up_proj) */
    M_QWEN           /* quant_method mxfp4 on a Qwen3-MoE config */
};

typedef struct synth {
    float router[SE * SH], router_bias[SE];
    float gu_bias[SE * 2 * SI], dn_bias[SE * SH];
    uint8_t gu_blocks[SE * 2 * SI * SH / 2], gu_scales[SE * 2 * SI * SH / 32];
    uint8_t dn_blocks[SE * SH * SI / 2], dn_scales[SE * SH * SI / 32];
    float gu_bf[SE * SH * 2 * SI], dn_bf[SE * SI * SH]; /* M_BF16_LAYER's gate_up_proj, down_proj */
} synth;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void synth_make(synth *S)
{
    tu_fill_uniform(S->router, SE * SH, 31, -1.0f, 1.0f);
    tu_fill_uniform(S->router_bias, SE, 32, -0.5f, 0.5f);
    tu_fill_uniform(S->gu_bias, SE * 2 * SI, 33, -0.5f, 0.5f);
    tu_fill_uniform(S->dn_bias, SE * SH, 34, -0.5f, 0.5f);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    /* every byte value (so every nibble, -0 included) and exponents 2^-8 .. 2^-2 */
    for (size_t i = 0; i < sizeof S->gu_blocks; i++)
        S->gu_blocks[i] = (uint8_t)rng_next(&s);
    for (size_t i = 0; i < sizeof S->dn_blocks; i++)
        S->dn_blocks[i] = (uint8_t)rng_next(&s);
    for (size_t i = 0; i < sizeof S->gu_scales; i++)
        S->gu_scales[i] = (uint8_t)(119 + rng_next(&s) % 7);
    for (size_t i = 0; i < sizeof S->dn_scales; i++)
        S->dn_scales[i] = (uint8_t)(119 + rng_next(&s) % 7);
    memset(S->gu_bf, 0, sizeof S->gu_bf);
    memset(S->dn_bf, 0, sizeof S->dn_bf);
}

/* The tensors of one checkpoint, named under layer 0's prefix. */
typedef struct tlist {
    char names[16][128];
    moe_tensor_out t[16];
    size_t n;
} tlist;

static void tl_add(tlist *tl, const char *suffix, moe_dtype dt, const void *data, int ndim, const int64_t *shape)
{
    assert_true(tl->n < 16);
    snprintf(tl->names[tl->n], sizeof tl->names[tl->n], "model.layers.0.mlp.%s", suffix);
    moe_tensor_out *t = &tl->t[tl->n++];
    memset(t, 0, sizeof *t);
    t->name = tl->names[tl->n - 1];
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
}

static void write_synth(moe_ctx *ctx, const synth *S, int mode, char *dir, size_t len)
{
    tu_tmpdir(dir, len, "mxfp4");
    char cfg[1024], path[700];
    if (mode == M_QWEN)
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"hidden_size\": %d, \"moe_intermediate_size\": %d,"
                 " \"num_experts\": %d, \"num_experts_per_tok\": %d, \"num_hidden_layers\": 1,"
                 " \"quantization_config\": {\"quant_method\": \"mxfp4\"}}",
                 SH, SI, SE, SK);
    else
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"hidden_size\": %d,"
                 " \"intermediate_size\": %d, \"num_local_experts\": %d, \"num_experts_per_tok\": %d,"
                 " \"num_hidden_layers\": 1, \"swiglu_limit\": 7.0,"
                 " \"quantization_config\": {\"modules_to_not_convert\": [\"model.layers.*.self_attn\","
                 " \"model.layers.*.mlp.router\", \"model.embed_tokens\", \"lm_head\"], \"quant_method\": \"mxfp4\"}}",
                 SH, mode == M_ODD_SIZE ? 80 : SI, SE, SK);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(tu_write_file(path, cfg, strlen(cfg)), 0);

    tlist tl = {.n = 0};
    tl_add(&tl, "router.weight", MOE_DTYPE_F32, S->router, 2, (int64_t[]){SE, SH});
    tl_add(&tl, "router.bias", MOE_DTYPE_F32, S->router_bias, 1, (int64_t[]){SE});
    tl_add(&tl, "experts.gate_up_proj_bias", MOE_DTYPE_F32, S->gu_bias, 2, (int64_t[]){SE, 2 * SI});
    tl_add(&tl, "experts.down_proj_bias", MOE_DTYPE_F32, S->dn_bias, 2, (int64_t[]){SE, SH});
    if (mode == M_BF16_LAYER) {
        tl_add(&tl, "experts.gate_up_proj", MOE_DTYPE_F32, S->gu_bf, 3, (int64_t[]){SE, SH, 2 * SI});
        tl_add(&tl, "experts.down_proj", MOE_DTYPE_F32, S->dn_bf, 3, (int64_t[]){SE, SI, SH});
    } else if (mode != M_QWEN) { /* (Qwen: the config is refused when opened) */
        tl_add(&tl, "experts.gate_up_proj_blocks", mode == M_BLOCKS_DTYPE ? MOE_DTYPE_I8 : MOE_DTYPE_U8,
               S->gu_blocks, 4, (int64_t[]){SE, 2 * SI, SH / 32, mode == M_BLOCKS_SHAPE ? 8 : 16});
        tl_add(&tl, "experts.gate_up_proj_scales", MOE_DTYPE_U8, S->gu_scales, 3, (int64_t[]){SE, 2 * SI, SH / 32});
        tl_add(&tl, "experts.down_proj_blocks", MOE_DTYPE_U8, S->dn_blocks, 4, (int64_t[]){SE, SH, SI / 32, 16});
        if (mode == M_SCALES_SHAPE) /* transposed */
            tl_add(&tl, "experts.down_proj_scales", MOE_DTYPE_U8, S->dn_scales, 3, (int64_t[]){SE, SI / 32, SH});
        else if (mode != M_SCALES_MISSING)
            tl_add(&tl, "experts.down_proj_scales", MOE_DTYPE_U8, S->dn_scales, 3, (int64_t[]){SE, SH, SI / 32});
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(moe_safetensors_write(ctx, path, tl.t, tl.n), MOE_OK);
}

/* Random bytes: every e2m1 code, -0 included, in both nibbles; several exponents. */
static void test_synthetic_bits(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    synth *S = malloc(sizeof *S);
    synth_make(S);
    char dir[512];
    write_synth(ctx, S, M_OK, dir, sizeof dir);
    oss_layer L = {.H = SH, .I = SI, .E = SE, .K = SK, .router = S->router, .router_bias = S->router_bias,
                   .router_dtype = MOE_DTYPE_F32, .gu_bias = S->gu_bias, .dn_bias = S->dn_bias,
                   .bias_dtype = MOE_DTYPE_F32, .gu_blocks = S->gu_blocks, .gu_scales = S->gu_scales,
                   .dn_blocks = S->dn_blocks, .dn_scales = S->dn_scales};
    float x[ST * SH];
    tu_fill_uniform(x, ST * SH, 35, -2.0f, 2.0f);
    check_bits(dir, &L, x, MOE_DTYPE_F32, ST);
    tu_rm_tree(dir);
    free(S);
    moe_ctx_free(ctx);
}

/* Open `dir` and return the status of open + layer_desc(0). */
static moe_status open_desc(moe_ctx *ctx, const char *dir, moe_layer_desc *d)
{
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK) {
        st = moe_checkpoint_layer_desc(ck, 0, d);
        moe_checkpoint_free(ck);
    }
    return st;
}

static void test_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    synth *S = malloc(sizeof *S);
    synth_make(S);
    char dir[512];
    moe_layer_desc d;

    /* H = 64, I = 96, E = 4: gate_up_proj_blocks must be [4, 192, 2, 16] */
    write_synth(ctx, S, M_BLOCKS_SHAPE, dir, sizeof dir);
    expect_error(ctx, open_desc(ctx, dir, &d), MOE_ESHAPE, "model.layers.0.mlp.experts.gate_up_proj_blocks",
                 "[E, 2I, H/32, 16] = [4, 192, 2, 16]", "found [4, 192, 2, 8]");
    tu_rm_tree(dir);

    write_synth(ctx, S, M_SCALES_SHAPE, dir, sizeof dir);
    expect_error(ctx, open_desc(ctx, dir, &d), MOE_ESHAPE, "model.layers.0.mlp.experts.down_proj_scales",
                 "[E, H, I/32] = [4, 64, 3]", "found [4, 3, 64]");
    tu_rm_tree(dir);

    write_synth(ctx, S, M_SCALES_MISSING, dir, sizeof dir);
    expect_error(ctx, open_desc(ctx, dir, &d), MOE_ENOTFOUND, "model.layers.0.mlp.experts.down_proj_scales");
    tu_rm_tree(dir);

    write_synth(ctx, S, M_BLOCKS_DTYPE, dir, sizeof dir);
    expect_error(ctx, open_desc(ctx, dir, &d), MOE_EDTYPE, "model.layers.0.mlp.experts.gate_up_proj_blocks",
                 "expected U8", "found I8");
    tu_rm_tree(dir);

    /* intermediate_size 80: no [E, 2I, H/32, 16] / [E, H, I/32, 16] layout holds it */
    write_synth(ctx, S, M_ODD_SIZE, dir, sizeof dir);
    expect_error(ctx, open_desc(ctx, dir, &d), MOE_EFORMAT, "gate_up_proj_blocks", "intermediate_size (80)",
                 "multiples of 32");
    tu_rm_tree(dir);

    write_synth(ctx, S, M_QWEN, dir, sizeof dir);
    /* the families named are the rows with an MXFP4 layout (families.c), this one by its row */
    expect_error(ctx, open_desc(ctx, dir, &d), MOE_EUNSUPPORTED, "quantization_config.quant_method", "mxfp4",
                 "read for gpt_oss (GptOssForCausalLM) only, not qwen");
    tu_rm_tree(dir);

    /* a layer kept in bf16 (modules_to_not_convert) reads as the bf16 layout, unquantized */
    write_synth(ctx, S, M_BF16_LAYER, dir, sizeof dir);
    assert_int_equal(open_desc(ctx, dir, &d), MOE_OK);
    assert_int_equal(d.quant.w13.dtype, MOE_QTYPE_NONE);
    assert_int_equal(d.quant.w2.dtype, MOE_QTYPE_NONE);
    assert_int_equal(d.weight_dtype, MOE_DTYPE_F32);
    tu_rm_tree(dir);

    free(S);
    moe_ctx_free(ctx);
}

/* E8M0 scale byte 255 is NaN: loaded with a WARNING naming the tensor and the count, and the
 * output follows the maths: a NaN scale in row n of expert 2's down_proj makes output column n
 * NaN exactly for the tokens routed to expert 2 (the gate_up NaN of expert 1 is only counted:
 * the swiglu clamp's NaN handling is not what is tested here). */
static void test_nan_scales(void **state)
{
    (void)state;
    tu_logcap cap = {0};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    synth *S = malloc(sizeof *S);
    synth_make(S);
    const int n_col = 5;
    S->gu_scales[1 * 2 * SI * (SH / 32) + 7] = 255;                  /* expert 1, gate_up [2I, H/32] */
    S->dn_scales[2 * SH * (SI / 32) + n_col * (SI / 32) + 1] = 255;  /* expert 2, row 5, group 1 */
    S->dn_scales[2 * SH * (SI / 32) + n_col * (SI / 32) + 2] = 255;  /* the same row, group 2 */
    char dir[512];
    write_synth(ctx, S, M_OK, dir, sizeof dir);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_null(strstr(cap.text, "(NaN)")); /* describing reads no scale */
    float x[ST * SH], out[ST * SH], wts[ST * SK];
    int32_t ids[ST * SK];
    tu_fill_uniform(x, ST * SH, 36, -2.0f, 2.0f);
    tu_run_layer_ex(ctx, &d, NULL, ck, 0, NULL, x, MOE_DTYPE_F32, ST, out, ids, wts);
    char want[2][200];
    snprintf(want[0], sizeof want[0], "tensor 'model.layers.0.mlp.experts.gate_up_proj_scales': 1 of %d E8M0 scales "
             "are 255 (NaN)", SE * 2 * SI * (SH / 32));
    snprintf(want[1], sizeof want[1], "tensor 'model.layers.0.mlp.experts.down_proj_scales': 2 of %d E8M0 scales are "
             "255 (NaN)", SE * SH * (SI / 32));
    for (int i = 0; i < 2; i++)
        if (!strstr(cap.text, want[i]))
            fail_msg("log lacks \"%s\":\n%s", want[i], cap.text);
    int with2 = 0, without = 0;
    for (int t = 0; t < ST; t++) {
        int has1 = 0, has2 = 0;
        for (int k = 0; k < SK; k++)
            has1 |= ids[t * SK + k] == 1, has2 |= ids[t * SK + k] == 2;
        if (has1)
            continue;
        with2 += has2, without += !has2;
        for (int h = 0; h < SH; h++)
            if (isnan(out[t * SH + h]) != (has2 && h == n_col))
                fail_msg("token %d (expert 2 %s), column %d: %g", t, has2 ? "routed" : "not routed", h,
                         (double)out[t * SH + h]);
    }
    assert_true(with2 > 0 && without > 0);
    moe_checkpoint_free(ck);
    tu_rm_tree(dir);
    free(S);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_bits),
        cmocka_unit_test(test_synthetic_bits),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_nan_scales),
    };
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
