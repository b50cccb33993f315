/* moe_checkpoint_quantize / `moe quantize` and the compressed-tensors loader.
 *
 *  - synthetic: a bf16 Qwen3-MoE checkpoint written here (H = I = 128, E = 4, two layers) is
 *    quantized to every scheme; the loaded layer must give bit for bit the output of a plan
 *    built in memory on moe_quantize_matrix of the same weights (and, weight-only schemes,
 *    within TU_REASSOC_REL of an f32 plan on moe_quant_dequant_source of them),
 *    and stay within the scheme's stated bound (tests/unit/test_quant.c) of the unquantized
 *    layer. --layers 1 leaves layer 0 unquantized (bit-equal to the input checkpoint).
 *  - fixtures (transformers-made Qwen3-MoE, Mixtral bf16, DeepSeek-V3, sharded Qwen2-MoE):
 *    fp8-block, int8-channel, int8-w8a8: the quantized layer against a checkpoint in which the
 *    test replaced every expert weight by its dequantized f32 value (weight-only: within
 *    TU_REASSOC_REL, the kernels scaling after each group's dot product)
 *    and against the unquantized layer (bound); the shards and index of a sharded input.
 *  - qwen3_moe_ct_w4a16_zp: compressed by the compressed-tensors package itself
 *    (tests/fixtures/gen_ct_fixture.py): the loaded layer within TU_REASSOC_REL of an f32 plan
 *    on the package's own decompression (dequant.safetensors).
 *  - errors: existing output, --force, unknown scheme, mxfp4 on Qwen3, output = input or inside it,
 *    missing or corrupt input, int4 groups not dividing K, stacked layout, quantized input;
 *    nothing left behind; unsupported compressed-tensors fields named by the loader; the CLI's
 *    exit codes, messages and byte counts. */
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
#include <sys/wait.h>
#include <unistd.h>

#include "moe.h"
#include "quant/convert.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

enum { SH = 128, SI = 128, SE = 4, SK = 2, SL = 2, T = 13 };

/* ---- helpers ---- */

/* Run layer `layer` of checkpoint dir on x [T, H]: output [T, H] malloc'd; desc into *d. */
static float *run_ckpt(moe_ctx *ctx, const char *dir, int64_t layer, const float *x, moe_layer_desc *d)
{
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st != MOE_OK)
        fail_msg("open %s: %s", dir, moe_ctx_last_error(ctx));
    st = moe_checkpoint_layer_desc(ck, layer, d);
    if (st != MOE_OK)
        fail_msg("desc %s: %s", dir, moe_ctx_last_error(ctx));
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    if (moe_plan_create(ctx, d, &plan) != MOE_OK || moe_checkpoint_load_weights(ck, layer, plan, &w) != MOE_OK)
        fail_msg("%s layer %lld: %s", dir, (long long)layer, moe_ctx_last_error(ctx));
    size_t ws = moe_plan_workspace_size(plan, T);
    void *wk = malloc(ws ? ws : 1);
    float *out = malloc(sizeof(float) * (size_t)(T * d->hidden_size));
    assert_int_equal(moe_plan_execute(plan, w, x, T, out, wk, ws), MOE_OK);
    free(wk);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    return out;
}

/* Run a plan of desc d on source src. */
static float *run_src(moe_ctx *ctx, const moe_layer_desc *d, const moe_weight_source *src, const float *x)
{
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    if (moe_plan_create(ctx, d, &plan) != MOE_OK || moe_weights_create(plan, src, &w) != MOE_OK)
        fail_msg("plan: %s", moe_ctx_last_error(ctx));
    size_t ws = moe_plan_workspace_size(plan, T);
    void *wk = malloc(ws ? ws : 1);
    float *out = malloc(sizeof(float) * (size_t)(T * d->hidden_size));
    assert_int_equal(moe_plan_execute(plan, w, x, T, out, wk, ws), MOE_OK);
    free(wk);
    moe_weights_free(w);
    moe_plan_free(plan);
    return out;
}

/* vLLM's metric: mean |a - ref| / mean |ref|. */
static double mean_rel(const float *a, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += fabs((double)a[i] - (double)ref[i]);
        den += fabs((double)ref[i]);
    }
    return num / den;
}

/* The stated bounds of tests/unit/test_quant.c against the unquantized layer. */
static double bound_of(const char *scheme)
{
    if (!strcmp(scheme, "fp8-block"))
        return 0.06;
    if (!strcmp(scheme, "int8-channel"))
        return 0.015;
    if (!strcmp(scheme, "int8-w8a8"))
        return 0.02;
    return 0.16; /* int4 */
}

static moe_status quantize(moe_ctx *ctx, const char *in, const char *out, const char *scheme, const int64_t *layers,
                           size_t nl, int force, moe_quantize_stats *s)
{
    moe_quantize_options o = {.scheme = scheme, .layers = layers, .n_layers = nl, .force = force};
    return moe_checkpoint_quantize(ctx, in, out, &o, s);
}

/* ---- the synthetic checkpoint ---- */

typedef struct syn {
    uint16_t *router[SL];          /* [E, H] bf16 */
    uint16_t *w[SL][SE][3];        /* gate [I, H], up [I, H], down [H, I] bf16 */
} syn;

/* When syn_poison_on: element 5 of layer 0 expert 1's down_proj is syn_poison (a NaN or Inf). */
static int syn_poison_on;
static float syn_poison;

static void syn_make(syn *s, const char *dir)
{
    json_t *cfg = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:[], s:s, s:i, s:i, s:i, s:i}",
                            "architectures", "Qwen3MoeForCausalLM", "model_type", "qwen3_moe", "hidden_size", SH,
                            "moe_intermediate_size", SI, "intermediate_size", 64, "num_experts", SE,
                            "num_experts_per_tok", SK, "num_hidden_layers", SL, "norm_topk_prob", 1,
                            "decoder_sparse_step", 1, "mlp_only_layers", "hidden_act", "silu", "num_attention_heads", 1,
                            "num_key_value_heads", 1, "head_dim", 8, "vocab_size", 8);
    char p[512];
    tu_join(p, sizeof p, dir, "config.json");
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
    tu_join(p, sizeof p, dir, "tokenizer.json");
    assert_int_equal(tu_write_file(p, "{}", 2), 0);
    moe_tensor_out t[SL * (1 + 3 * SE) + 1];
    static char names[SL * (1 + 3 * SE) + 1][96];
    size_t n = 0;
    float *tmp = malloc(sizeof(float) * SH * SI);
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int l = 0; l < SL; l++) {
        s->router[l] = malloc(2 * SE * SH);
        tu_fill_uniform(tmp, SE * SH, 5 + (uint64_t)l, -1.0f, 1.0f);
        for (int i = 0; i < SE * SH; i++)
            s->router[l][i] = moe_f32_to_bf16(tmp[i]);
        snprintf(names[n], sizeof names[n], "model.layers.%d.mlp.gate.weight", l);
        t[n++] = (moe_tensor_out){.name = names[n - 1], .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {SE, SH},
                                  .data = s->router[l]};
        for (int e = 0; e < SE; e++)
            for (int m = 0; m < 3; m++) {
                const int64_t N = m == 2 ? SH : SI, K = m == 2 ? SI : SH;
                tu_fill_uniform(tmp, (size_t)(N * K), 100 + (uint64_t)(l * 40 + e * 3 + m), -0.5f, 0.5f);
                s->w[l][e][m] = malloc(2 * (size_t)(N * K));
                for (int64_t i = 0; i < N * K; i++) /* rows of different magnitude: the scales differ */
                    s->w[l][e][m][i] = moe_f32_to_bf16(tmp[i] * ldexpf(1.0f, (int)((i / K) / 16 % 5) - 2));
                if (syn_poison_on && l == 0 && e == 1 && m == 2)
                    s->w[l][e][m][5] = moe_f32_to_bf16(syn_poison);
                snprintf(names[n], sizeof names[n], "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[m]);
                t[n++] = (moe_tensor_out){.name = names[n - 1], .dtype = MOE_DTYPE_BF16, .ndim = 2,
                                          .shape = {N, K}, .data = s->w[l][e][m]};
            }
    }
    snprintf(names[n], sizeof names[n], "model.embed_tokens.weight");
    t[n++] = (moe_tensor_out){.name = names[n - 1], .dtype = MOE_DTYPE_BF16, .ndim = 2, .shape = {8, SH},
                              .data = s->w[0][0][0]}; /* [8, H] of the first expert matrix */
    free(tmp);
    moe_ctx *ctx = tu_ctx();
    tu_join(p, sizeof p, dir, "model.safetensors");
    assert_int_equal(moe_safetensors_write(ctx, p, t, n), MOE_OK);
    moe_ctx_free(ctx);
}

static void syn_free(syn *s)
{
    for (int l = 0; l < SL; l++) {
        free(s->router[l]);
        for (int e = 0; e < SE; e++)
            for (int m = 0; m < 3; m++)
                free(s->w[l][e][m]);
    }
}

/* Layer l of the synthetic checkpoint quantized in memory (mode 0: the scheme's source; mode
 * 1: f32 on moe_quant_dequant_source of it), run on x. */
static float *syn_oracle(moe_ctx *ctx, const syn *s, int l, const moe_quant_config *q, int mode, const float *x)
{
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.family = MOE_FAMILY_QWEN3_MOE;
    d.hidden_size = SH, d.moe_intermediate_size = SI, d.num_experts = SE, d.top_k = SK, d.renormalize = 1;
    d.weight_dtype = mode ? MOE_DTYPE_F32 : MOE_DTYPE_BF16;
    if (!mode)
        d.quant = *q;
    void *codes[SE][3], *scale[SE][3];
    uint8_t *zero[SE][3];
    float *deq[SE][3];
    const void *ptr[3][SE], *sp[3][SE];
    const uint8_t *zp[3][SE];
    float *w = malloc(sizeof(float) * SH * SI);
    for (int e = 0; e < SE; e++)
        for (int m = 0; m < 3; m++) {
            const int64_t N = m == 2 ? SH : SI, K = m == 2 ? SI : SH;
            for (int64_t i = 0; i < N * K; i++)
                w[i] = moe_bf16_to_f32(s->w[l][e][m][i]);
            size_t cb, sb, zb;
            assert_int_equal(moe_quantize_matrix_sizes(&q->w13, N, K, &cb, &sb, &zb), MOE_OK);
            codes[e][m] = malloc(cb), scale[e][m] = malloc(sb), zero[e][m] = malloc(zb ? zb : 1);
            assert_int_equal(moe_quantize_matrix(&q->w13, w, N, K, codes[e][m], scale[e][m], zero[e][m]), MOE_OK);
            deq[e][m] = malloc(sizeof(float) * (size_t)(N * K));
            moe_quant_dequant_source(&q->w13, codes[e][m], scale[e][m], zero[e][m], N, K, deq[e][m]);
            ptr[m][e] = mode ? (const void *)deq[e][m] : codes[e][m];
            sp[m][e] = scale[e][m];
            zp[m][e] = zero[e][m];
        }
    free(w);
    float *router = malloc(sizeof(float) * SE * SH);
    for (int i = 0; i < SE * SH; i++)
        router[i] = moe_bf16_to_f32(s->router[l][i]);
    moe_weight_source src = {0};
    src.router = s->router[l];
    src.router_dtype = MOE_DTYPE_BF16;
    src.gate_proj = ptr[0], src.up_proj = ptr[1], src.down_proj = ptr[2];
    if (!mode) {
        src.gate_scale = sp[0], src.up_scale = sp[1], src.down_scale = sp[2];
        if (q->w13.has_zero_point)
            src.gate_zero = zp[0], src.up_zero = zp[1], src.down_zero = zp[2];
    }
    float *out = run_src(ctx, &d, &src, x);
    for (int e = 0; e < SE; e++)
        for (int m = 0; m < 3; m++)
            free(codes[e][m]), free(scale[e][m]), free(zero[e][m]), free(deq[e][m]);
    free(router);
    return out;
}

static void test_synthetic_schemes(void **state)
{
    (void)state;
    static const char *const schemes[] = {"fp8-block", "int8-channel", "int8-w8a8",   "int4-g32",   "int4-g64",
                                          "int4-g128", "int4-g32-zp",  "int4-g64-zp", "int4-g128-zp"};
    char root[512], in[600], out[600];
    tu_tmpdir(root, sizeof root, "quantize_syn");
    tu_join(in, sizeof in, root, "in");
    assert_int_equal(mkdir(in, 0755), 0);
    syn s;
    syn_make(&s, in);
    moe_ctx *ctx = tu_ctx();
    float x[T * SH];
    tu_fill_uniform(x, T * SH, 77, -1.0f, 1.0f);
    moe_layer_desc d;
    float *orig[SL];
    for (int l = 0; l < SL; l++)
        orig[l] = run_ckpt(ctx, in, l, x, &d);
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name(schemes[i], &q), MOE_OK);
        tu_join(out, sizeof out, root, schemes[i]);
        moe_quantize_stats st;
        if (quantize(ctx, in, out, schemes[i], NULL, 0, 0, &st) != MOE_OK)
            fail_msg("%s: %s", schemes[i], moe_ctx_last_error(ctx));
        assert_int_equal(st.expert_tensors, SL * SE * 3);
        assert_int_equal(st.input_expert_bytes, (uint64_t)SL * SE * 3 * SH * SI * 2);
        assert_int_equal(st.shards, 1);
        assert_true(st.copied_files >= 1); /* tokenizer.json */
        char p[700];
        tu_join(p, sizeof p, out, "tokenizer.json");
        assert_int_equal(access(p, F_OK), 0);
        for (int l = 0; l < SL; l++) {
            float *got = run_ckpt(ctx, out, l, x, &d);
            assert_true(moe_quant_equal(&d.quant, &q));
            float *want = syn_oracle(ctx, &s, l, &q, 0, x);
            if (memcmp(got, want, sizeof x) != 0)
                fail_msg("%s layer %d: not bit-equal to the in-memory quantized plan (max diff %g)", schemes[i], l,
                         tu_max_abs_diff(got, want, T * SH));
            if (q.act == MOE_QACT_NONE) {
                float *deq = syn_oracle(ctx, &s, l, &q, 1, x);
                char what[64];
                snprintf(what, sizeof what, "%s layer %d", schemes[i], l);
                tu_check_reassoc(what, got, deq, T * SH);
                free(deq);
            }
            double err = mean_rel(got, orig[l], T * SH);
            printf("  %-13s layer %d: bit-equal to the in-memory plan; vs unquantized mean-rel %.4f (bound %.3f); "
                   "expert bytes %llu -> codes %llu + scales %llu + zeros %llu\n",
                   schemes[i], l, err, bound_of(schemes[i]), (unsigned long long)st.input_expert_bytes,
                   (unsigned long long)st.output_code_bytes, (unsigned long long)st.output_scale_bytes,
                   (unsigned long long)st.output_zero_bytes);
            assert_true(err <= bound_of(schemes[i]));
            free(want);
            free(got);
        }
    }
    /* --layers 1: layer 0 stays bf16 (bit-equal to the input), layer 1 quantized */
    tu_join(out, sizeof out, root, "partial");
    const int64_t one = 1;
    moe_quantize_stats st;
    assert_int_equal(quantize(ctx, in, out, "int4-g64-zp", &one, 1, 0, &st), MOE_OK);
    assert_int_equal(st.expert_tensors, SE * 3);
    float *l0 = run_ckpt(ctx, out, 0, x, &d);
    assert_int_equal(d.quant.w13.dtype, MOE_QTYPE_NONE);
    assert_memory_equal(l0, orig[0], sizeof x);
    free(l0);
    moe_quant_config q;
    moe_quant_from_name("int4-g64-zp", &q);
    float *l1 = run_ckpt(ctx, out, 1, x, &d);
    float *want = syn_oracle(ctx, &s, 1, &q, 0, x);
    assert_true(moe_quant_equal(&d.quant, &q));
    assert_memory_equal(l1, want, sizeof x);
    free(l1), free(want);
    /* a layer that is not there */
    const int64_t bad = 7;
    tu_join(out, sizeof out, root, "bad_layer");
    expect_error(ctx, quantize(ctx, in, out, "int8-channel", &bad, 1, 0, NULL), MOE_ERANGE, "layer 7");
    expect_error(ctx, quantize(ctx, in, out, "fp8-block", &one, 1, 0, NULL), MOE_EINVAL, "--layers");
    assert_int_equal(access(out, F_OK), -1);
    for (int l = 0; l < SL; l++)
        free(orig[l]);
    syn_free(&s);
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* ---- the transformers fixtures ---- */

/* Copy checkpoint `in` to `out` with every expert linear replaced by its dequantized f32 value
 * (moe_quantize_matrix + moe_quant_dequant_source), and without quantization_config. */
static int is_expert_linear(const moe_tensor_info *t)
{
    const char *x = strstr(t->name, ".experts.");
    size_t n = strlen(t->name);
    return x && x[9] >= '0' && x[9] <= '9' && n > 7 && !strcmp(t->name + n - 7, ".weight") && t->ndim == 2;
}

static void write_dequant_copy(moe_ctx *ctx, const char *in, const char *out, const moe_qweight *qw)
{
    assert_int_equal(mkdir(out, 0755), 0);
    DIR *d = opendir(in);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        size_t nl = strlen(n);
        char ip[700], op[700];
        tu_join(ip, sizeof ip, in, n);
        tu_join(op, sizeof op, out, n);
        if (!strcmp(n, "config.json") || !strcmp(n, "model.safetensors.index.json")) {
            json_t *j = json_load_file(ip, 0, NULL);
            assert_non_null(j);
            json_object_del(j, "quantization_config");
            assert_int_equal(json_dump_file(j, op, 0), 0);
            json_decref(j);
            continue;
        }
        if (nl < 12 || strcmp(n + nl - 12, ".safetensors") || strncmp(n, "model", 5))
            continue;
        moe_safetensors *f = NULL;
        assert_int_equal(moe_safetensors_open(ctx, ip, &f), MOE_OK);
        size_t cnt = moe_safetensors_count(f);
        moe_tensor_out *t = calloc(cnt, sizeof *t);
        void **bufs = calloc(cnt, sizeof *bufs);
        for (size_t i = 0; i < cnt; i++) {
            moe_tensor_info ti;
            assert_int_equal(moe_safetensors_at(f, i, &ti), MOE_OK);
            t[i] = (moe_tensor_out){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim, .data = ti.data};
            memcpy(t[i].shape, ti.shape, sizeof t[i].shape);
            if (!is_expert_linear(&ti))
                continue;
            const int64_t N = ti.shape[0], K = ti.shape[1];
            float *w = malloc(sizeof(float) * (size_t)(N * K)), *dq = malloc(sizeof(float) * (size_t)(N * K));
            for (int64_t k = 0; k < N * K; k++) {
                uint16_t h;
                if (ti.dtype == MOE_DTYPE_F32) {
                    memcpy(&w[k], (const char *)ti.data + 4 * k, 4);
                } else {
                    memcpy(&h, (const char *)ti.data + 2 * k, 2);
                    w[k] = moe_bf16_to_f32(h);
                }
            }
            size_t cb, sb, zb;
            assert_int_equal(moe_quantize_matrix_sizes(qw, N, K, &cb, &sb, &zb), MOE_OK);
            void *c = malloc(cb), *sc = malloc(sb);
            uint8_t *z = malloc(zb ? zb : 1);
            assert_int_equal(moe_quantize_matrix(qw, w, N, K, c, sc, z), MOE_OK);
            moe_quant_dequant_source(qw, c, sc, z, N, K, dq);
            free(c), free(sc), free(z), free(w);
            t[i].dtype = MOE_DTYPE_F32;
            t[i].data = bufs[i] = dq;
        }
        assert_int_equal(moe_safetensors_write(ctx, op, t, cnt), MOE_OK);
        for (size_t i = 0; i < cnt; i++)
            free(bufs[i]);
        free(bufs), free(t);
        moe_safetensors_free(f);
    }
    closedir(d);
}

static void test_fixtures(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"qwen3_moe_f32", "mixtral_bf16", "deepseek_v3_f32", "qwen2_moe_sharded_f32"};
    static const char *const schemes[] = {"fp8-block", "int8-channel", "int8-w8a8"};
    moe_ctx *ctx = tu_ctx();
    char root[512];
    tu_tmpdir(root, sizeof root, "quantize_fix");
    for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
        char in[600];
        tu_data_path(in, sizeof in, fixtures[f]);
        moe_checkpoint *ck = NULL;
        assert_int_equal(moe_checkpoint_open(ctx, in, &ck), MOE_OK);
        int64_t layer = 0;
        while (!moe_checkpoint_is_moe_layer(ck, layer))
            layer++;
        moe_layer_desc d0;
        assert_int_equal(moe_checkpoint_layer_desc(ck, layer, &d0), MOE_OK);
        moe_checkpoint_free(ck);
        float *x = malloc(sizeof(float) * (size_t)(T * d0.hidden_size));
        tu_fill_uniform(x, (size_t)(T * d0.hidden_size), 3, -1.0f, 1.0f);
        float *orig = run_ckpt(ctx, in, layer, x, &d0);
        const size_t n = (size_t)(T * d0.hidden_size);
        for (size_t s = 0; s < sizeof schemes / sizeof schemes[0]; s++) {
            char out[800], deq[800];
            snprintf(out, sizeof out, "%s/%s-%s", root, fixtures[f], schemes[s]);
            moe_quantize_stats st;
            if (quantize(ctx, in, out, schemes[s], NULL, 0, 0, &st) != MOE_OK)
                fail_msg("%s %s: %s", fixtures[f], schemes[s], moe_ctx_last_error(ctx));
            moe_quant_config q;
            moe_quant_from_name(schemes[s], &q);
            moe_layer_desc d;
            float *got = run_ckpt(ctx, out, layer, x, &d);
            assert_true(moe_quant_equal(&d.quant, &q));
            double err = mean_rel(got, orig, n);
            printf("  %-22s %-13s layer %lld: vs unquantized mean-rel %.4f (bound %.3f)", fixtures[f], schemes[s],
                   (long long)layer, err, bound_of(schemes[s]));
            assert_true(err <= bound_of(schemes[s]));
            if (q.act == MOE_QACT_NONE) {
                snprintf(deq, sizeof deq, "%s/%s-%s-deq", root, fixtures[f], schemes[s]);
                write_dequant_copy(ctx, in, deq, &q.w13);
                float *want = run_ckpt(ctx, deq, layer, x, &d);
                char what[128];
                snprintf(what, sizeof what, "%s %s", fixtures[f], schemes[s]);
                printf("; vs f32 on the dequantized weights %.2g of max", tu_check_reassoc(what, got, want, n));
                free(want);
            }
            printf("\n");
            if (strstr(fixtures[f], "sharded")) {
                assert_int_equal(st.shards, 2);
                char p[900];
                tu_join(p, sizeof p, out, "model.safetensors.index.json");
                json_t *ix = json_load_file(p, 0, NULL);
                assert_non_null(ix);
                json_t *wm = json_object_get(ix, "weight_map");
                const char *k;
                json_t *v;
                int scales = 0;
                json_object_foreach(wm, k, v) {
                    char sp[1000];
                    tu_join(sp, sizeof sp, out, json_string_value(v));
                    moe_safetensors *sf = NULL;
                    assert_int_equal(moe_safetensors_open(ctx, sp, &sf), MOE_OK);
                    moe_tensor_info ti;
                    assert_int_equal(moe_safetensors_get(sf, k, &ti), MOE_OK);
                    moe_safetensors_free(sf);
                    scales += strstr(k, "weight_scale") != NULL;
                }
                assert_true(scales > 0);
                json_decref(ix);
            }
            free(got);
        }
        free(orig);
        free(x);
    }
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* ---- the fixture compressed by compressed-tensors itself ---- */

static void test_ct_package_fixture(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char in[600], root[512], deq[700], p[800];
    tu_data_path(in, sizeof in, "qwen3_moe_ct_w4a16_zp");
    tu_tmpdir(root, sizeof root, "quantize_ct");
    /* the reference checkpoint: config without quantization_config, the package's
     * decompressed experts in f32, the rest as it is */
    tu_join(deq, sizeof deq, root, "deq");
    assert_int_equal(mkdir(deq, 0755), 0);
    tu_join(p, sizeof p, in, "config.json");
    json_t *cfg = json_load_file(p, 0, NULL);
    assert_non_null(cfg);
    json_object_del(cfg, "quantization_config");
    tu_join(p, sizeof p, deq, "config.json");
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    json_decref(cfg);
    moe_safetensors *m = NULL, *dq = NULL;
    tu_join(p, sizeof p, in, "model.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &m), MOE_OK);
    tu_join(p, sizeof p, in, "dequant.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &dq), MOE_OK);
    moe_tensor_out t[64];
    size_t n = 0;
    for (size_t i = 0; i < moe_safetensors_count(m); i++) {
        moe_tensor_info ti;
        moe_safetensors_at(m, i, &ti);
        if (strstr(ti.name, ".experts."))
            continue;
        t[n] = (moe_tensor_out){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim, .data = ti.data};
        memcpy(t[n++].shape, ti.shape, sizeof ti.shape);
    }
    for (size_t i = 0; i < moe_safetensors_count(dq); i++) {
        moe_tensor_info ti;
        moe_safetensors_at(dq, i, &ti);
        t[n] = (moe_tensor_out){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim, .data = ti.data};
        memcpy(t[n++].shape, ti.shape, sizeof ti.shape);
    }
    assert_int_equal(n, 2 + 12);
    tu_join(p, sizeof p, deq, "model.safetensors");
    assert_int_equal(moe_safetensors_write(ctx, p, t, n), MOE_OK);
    moe_safetensors_free(m);
    moe_safetensors_free(dq);

    moe_safetensors *xf = NULL;
    tu_join(p, sizeof p, in, "input.safetensors");
    assert_int_equal(moe_safetensors_open(ctx, p, &xf), MOE_OK);
    moe_tensor_info xi;
    assert_int_equal(moe_safetensors_get(xf, "hidden_states", &xi), MOE_OK);
    float x[T * 64];
    assert_int_equal(xi.shape[1], 64);
    assert_true(xi.shape[0] <= T);
    memset(x, 0, sizeof x);
    memcpy(x, xi.data, xi.nbytes);
    moe_safetensors_free(xf);
    moe_layer_desc d;
    float *got = run_ckpt(ctx, in, 0, x, &d);
    moe_quant_config q;
    moe_quant_from_name("int4-g32-zp", &q);
    assert_true(moe_quant_equal(&d.quant, &q));
    float *want = run_ckpt(ctx, deq, 0, x, &d);
    printf("  compressed-tensors int4-g32-zp (bf16 scales): %.2g of max from f32 on the package's decompression\n",
           tu_check_reassoc("compressed-tensors fixture", got, want, T * 64));
    free(got), free(want);
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* ---- errors ---- */

/* Write a copy of checkpoint config `dir`/config.json with group_0 field `path` (dotted,
 * under config_groups.group_0) set to `val` (consumed), open it, expect `want` naming `field`. */
static void expect_ct_refusal(moe_ctx *ctx, const char *dir, const char *sub, const char *key, json_t *val,
                              const char *field)
{
    char p[800];
    tu_join(p, sizeof p, dir, "config.json");
    json_t *cfg = json_load_file(p, 0, NULL);
    assert_non_null(cfg);
    json_t *g = json_object_get(json_object_get(json_object_get(cfg, "quantization_config"), "config_groups"),
                                "group_0");
    json_t *obj = sub ? json_object_get(g, sub) : g;
    if (!json_is_object(obj)) {
        obj = json_pack("{s:i, s:s, s:b, s:s, s:b}", "num_bits", 8, "type", "int", "symmetric", 1, "strategy", "token",
                        "dynamic", 1);
        json_object_set_new(g, sub, obj);
    }
    json_t *old = json_deep_copy(cfg);
    json_object_set_new(obj, key, val);
    assert_int_equal(json_dump_file(cfg, p, 0), 0);
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    moe_layer_desc d;
    if (st == MOE_OK) {
        st = moe_checkpoint_layer_desc(ck, 0, &d);
        moe_checkpoint_free(ck);
    }
    expect_error(ctx, st, MOE_EUNSUPPORTED, field);
    assert_int_equal(json_dump_file(old, p, 0), 0);
    json_decref(old);
    json_decref(cfg);
}

/* A NaN or Inf expert weight is refused (int codes cannot hold it: a NaN would become 0 and an
 * Inf would make its scale cell NaN) naming the tensor and [n, k], for every scheme; nothing
 * is left behind. */
static void test_nonfinite_weight(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char root[512], in[600], out[700];
    tu_tmpdir(root, sizeof root, "quantize_nonfinite");
    const float vals[2] = {NAN, INFINITY};
    for (int v = 0; v < 2; v++) {
        tu_join(in, sizeof in, root, v ? "in_inf" : "in_nan");
        assert_int_equal(mkdir(in, 0755), 0);
        syn s;
        syn_poison_on = 1, syn_poison = vals[v];
        syn_make(&s, in);
        syn_poison_on = 0;
        syn_free(&s);
        const int before = tu_dir_entries(root);
        static const char *const schemes[] = {"int8-channel", "int4-g32-zp", "fp8-block", "int8-w8a8"};
        for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++) {
            tu_join(out, sizeof out, root, "o");
            expect_error(ctx, quantize(ctx, in, out, schemes[i], NULL, 0, 0, NULL), MOE_EINVAL,
                         "model.layers.0.mlp.experts.1.down_proj.weight", "1 non-finite", "[n, k] = [0, 5]",
                         schemes[i]);
            assert_int_equal(tu_dir_entries(root), before);
        }
    }
    tu_rm_tree(root);
    moe_ctx_free(ctx);
}

static void test_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char root[512], in[600], out[700], p[800];
    tu_tmpdir(root, sizeof root, "quantize_err");
    tu_data_path(in, sizeof in, "qwen3_moe_f32");
    const int before = tu_dir_entries(root);

    tu_join(out, sizeof out, root, "o");
    expect_error(ctx, quantize(ctx, in, out, "int3", NULL, 0, 0, NULL), MOE_EINVAL, "unknown", "int3");
    expect_error(ctx, quantize(ctx, in, out, "mxfp4", NULL, 0, 0, NULL), MOE_EUNSUPPORTED, "mxfp4",
                 "written for gpt_oss only", "for qwen3_moe use int4-g32");
    expect_error(ctx, quantize(ctx, in, in, "int8-channel", NULL, 0, 0, NULL), MOE_EINVAL, "input");
    tu_join(p, sizeof p, in, "sub");
    expect_error(ctx, quantize(ctx, in, p, "int8-channel", NULL, 0, 1, NULL), MOE_EINVAL, "inside");
    expect_error(ctx, quantize(ctx, "/nonexistent/ckpt", out, "int8-channel", NULL, 0, 0, NULL), MOE_ENOTFOUND,
                 "/nonexistent/ckpt");
    /* K = 40 or 12 is not a multiple of 128 */
    expect_error(ctx, quantize(ctx, in, out, "int4-g128", NULL, 0, 0, NULL), MOE_ESHAPE, "group size 128");
    char stacked[600];
    tu_data_path(stacked, sizeof stacked, "qwen3_moe_stacked_f32");
    expect_error(ctx, quantize(ctx, stacked, out, "int8-channel", NULL, 0, 0, NULL), MOE_EUNSUPPORTED, "stacked");
    /* a family whose row has neither the per-expert nor the input-major layout (granitemoe):
     * refused up front, naming its stacked tensors and the rows that can be written */
    char granite[600];
    tu_data_path(granite, sizeof granite, "granitemoe_f32");
    expect_error(ctx, quantize(ctx, granite, out, "int8-channel", NULL, 0, 0, NULL), MOE_EUNSUPPORTED,
                 "granitemoe stores its experts stacked (input_linear.weight / output_linear.weight)",
                 "writes gpt_oss, llama4 and the per-expert layout");
    /* input-major experts with biases and no MXFP4 layout (openai_privacy_filter): refused up
     * front, naming the biases (no quantized format carries them) */
    char opf[600];
    tu_data_path(opf, sizeof opf, "openai_privacy_filter_f32");
    expect_error(ctx, quantize(ctx, opf, out, "int8-channel", NULL, 0, 0, NULL), MOE_EUNSUPPORTED,
                 "openai_privacy_filter's experts have biases (experts.gate_up_proj_bias, experts.down_proj_bias)",
                 "writes gpt_oss, llama4 and the per-expert layout");
    /* an input-major layout under other names than the ones the writer rewrites (Aria's
     * experts.fc1.weight / fc2.weight): refused up front the same way */
    char aria[600];
    tu_data_path(aria, sizeof aria, "aria_f32");
    expect_error(ctx, quantize(ctx, aria, out, "int8-channel", NULL, 0, 0, NULL), MOE_EUNSUPPORTED,
                 "aria stores its experts input-major (experts.fc1.weight / experts.fc2.weight)",
                 "writes gpt_oss, llama4 and the per-expert layout");
    char ct[600];
    tu_data_path(ct, sizeof ct, "qwen3_moe_ct_w4a16_zp");
    expect_error(ctx, quantize(ctx, ct, out, "int8-channel", NULL, 0, 0, NULL), MOE_EUNSUPPORTED, "already quantized");
    assert_int_equal(tu_dir_entries(root), before); /* nothing left behind */

    /* the cancel flag (what `moe quantize` sets on SIGINT / SIGTERM / SIGHUP): MOE_ECANCELED,
     * no output and no temporary folder */
    volatile int cancel = 1;
    moe_quantize_options oc = {.scheme = "int8-channel", .cancel = &cancel};
    moe_quantize_stats sc;
    expect_error(ctx, moe_checkpoint_quantize(ctx, in, out, &oc, &sc), MOE_ECANCELED, "interrupted");
    assert_int_equal(tu_dir_entries(root), before);
    assert_string_equal(moe_status_name(MOE_ECANCELED), "MOE_ECANCELED");
    cancel = 0;
    assert_int_equal(moe_checkpoint_quantize(ctx, in, out, &oc, &sc), MOE_OK);
    tu_rm_tree(out);
    assert_int_equal(tu_dir_entries(root), before);

    /* a corrupt input: nothing at the output, no temporary folder */
    char bad[700];
    tu_join(bad, sizeof bad, root, "bad");
    assert_int_equal(mkdir(bad, 0755), 0);
    char src[800];
    tu_join(src, sizeof src, in, "config.json");
    FILE *fi = fopen(src, "rb");
    char buf[8192];
    size_t nb = fread(buf, 1, sizeof buf, fi);
    fclose(fi);
    tu_join(p, sizeof p, bad, "config.json");
    assert_int_equal(tu_write_file(p, buf, nb), 0);
    tu_join(p, sizeof p, bad, "model.safetensors");
    assert_int_equal(tu_write_file(p, "\x10\0\0\0\0\0\0\0{\"a\":", 13), 0);
    const int with_bad = tu_dir_entries(root);
    expect_error(ctx, quantize(ctx, bad, out, "int8-channel", NULL, 0, 0, NULL), MOE_EFORMAT, "model.safetensors");
    assert_int_equal(tu_dir_entries(root), with_bad);

    /* an existing non-empty output: refused, untouched; force replaces it (it looks like a
     * checkpoint: test_lib_force_refusals has the folders it does not replace) */
    assert_int_equal(mkdir(out, 0755), 0);
    tu_join(p, sizeof p, out, "config.json");
    assert_int_equal(tu_write_file(p, "x", 1), 0);
    tu_join(p, sizeof p, out, "keep.json");
    assert_int_equal(tu_write_file(p, "x", 1), 0);
    expect_error(ctx, quantize(ctx, in, out, "int8-channel", NULL, 0, 0, NULL), MOE_EINVAL, "not empty", "--force");
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(tu_dir_entries(root), with_bad + 1);
    assert_int_equal(quantize(ctx, in, out, "int8-channel", NULL, 0, 1, NULL), MOE_OK);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(tu_dir_entries(root), with_bad + 1);
    /* the published folder has mkdir's mode (0777 less the umask), not mkdtemp's 0700 */
    {
        const mode_t um = umask(0);
        umask(um);
        struct stat so;
        assert_int_equal(stat(out, &so), 0);
        assert_int_equal(so.st_mode & 0777, 0777 & ~um);
    }
    /* a symbolic link at the output (to an empty folder, or dangling) is refused before any
     * work, and left as it is */
    {
        char target[800], link_p[800];
        tu_join(target, sizeof target, root, "lt");
        tu_join(link_p, sizeof link_p, root, "ln");
        assert_int_equal(mkdir(target, 0755), 0);
        assert_int_equal(symlink(target, link_p), 0);
        const int with_link = tu_dir_entries(root);
        expect_error(ctx, quantize(ctx, in, link_p, "int8-channel", NULL, 0, 1, NULL), MOE_EINVAL, "symbolic link");
        assert_int_equal(tu_dir_entries(root), with_link);
        assert_int_equal(tu_dir_entries(target), 0);
        assert_int_equal(unlink(link_p), 0);
        assert_int_equal(symlink("/nonexistent/moe_q_target", link_p), 0);
        expect_error(ctx, quantize(ctx, in, link_p, "int8-channel", NULL, 0, 0, NULL), MOE_EINVAL, "symbolic link");
        assert_int_equal(tu_dir_entries(root), with_link);
        assert_int_equal(unlink(link_p), 0);
        assert_int_equal(rmdir(target), 0);
    }
    /* an empty existing output is fine without --force */
    char empty[700];
    tu_join(empty, sizeof empty, root, "empty");
    assert_int_equal(mkdir(empty, 0755), 0);
    assert_int_equal(quantize(ctx, in, empty, "int4-g32", NULL, 0, 0, NULL), MOE_ESHAPE);
    assert_int_equal(tu_dir_entries(empty), 0);

    /* the loader names what it refuses (on the int8-channel output written above) */
    expect_ct_refusal(ctx, out, "weights", "type", json_string("float"), "weights.type");
    expect_ct_refusal(ctx, out, "weights", "num_bits", json_integer(2), "weights.num_bits");
    expect_ct_refusal(ctx, out, "weights", "actorder", json_string("group"), "weights.actorder");
    expect_ct_refusal(ctx, out, "weights", "strategy", json_string("tensor"), "weights.strategy");
    expect_ct_refusal(ctx, out, "weights", "symmetric", json_false(), "weights.symmetric");
    expect_ct_refusal(ctx, out, "input_activations", "dynamic", json_false(), "input_activations.dynamic");
    expect_ct_refusal(ctx, out, NULL, "output_activations", json_pack("{s:i}", "num_bits", 8), "output_activations");
    expect_ct_refusal(ctx, out, NULL, "format", json_string("float-quantized"), "format");
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* ---- the command line ---- */

/* The folder run_cli's child runs in (NULL: this process's). */
static const char *cli_cwd;

/* Run `moe quantize ARGS...`: exit code; stdout and stderr into out / err. */
static int run_cli(char *out, size_t no, char *err, size_t ne, const char *const *args)
{
    const char *bin = getenv("LIBMOE_BIN");
    if (!bin)
        fail_msg("LIBMOE_BIN is not set");
    char tmpl_o[] = "/tmp/moe_q_outXXXXXX", tmpl_e[] = "/tmp/moe_q_errXXXXXX";
    int fo = mkstemp(tmpl_o), fe = mkstemp(tmpl_e);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fo, 1);
        dup2(fe, 2);
        if (cli_cwd && chdir(cli_cwd) != 0)
            _exit(126);
        const char *argv[16] = {bin, "quantize"};
        int i = 0;
        for (; args[i]; i++)
            argv[2 + i] = args[i];
        argv[2 + i] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ssize_t r;
    lseek(fo, 0, SEEK_SET);
    r = read(fo, out, no - 1);
    out[r > 0 ? r : 0] = '\0';
    lseek(fe, 0, SEEK_SET);
    r = read(fe, err, ne - 1);
    err[r > 0 ? r : 0] = '\0';
    close(fo), close(fe);
    unlink(tmpl_o), unlink(tmpl_e);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_cli(void **state)
{
    (void)state;
    char root[512], in[600], out[700], o[8192], e[4096];
    tu_tmpdir(root, sizeof root, "quantize_cli");
    tu_data_path(in, sizeof in, "qwen3_moe_f32");
    tu_join(out, sizeof out, root, "q");
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e, (const char *const[]){"--help", NULL}), 0);
    assert_non_null(strstr(o, "usage: moe quantize"));
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e, (const char *const[]){"--checkpoint", in, NULL}), 2);
    assert_non_null(strstr(e, "--output"));
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int5", NULL}),
                     2);
    assert_non_null(strstr(e, "int5"));
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int8-channel",
                                                   "--layers", "0,0", NULL}),
                     2);
    assert_non_null(strstr(e, "layer 0 is listed twice"));
    /* a bad --layers list is a usage error naming the option, before anything is read or
     * written: empty items and lists included (the shared cli_parse_i64_list) */
    static const char *const bad_layers[] = {"0,,1", "0,", ",0", "", ",", "x", "0;1", "0x1", "1.5"};
    for (size_t i = 0; i < sizeof bad_layers / sizeof bad_layers[0]; i++) {
        int rc = run_cli(o, sizeof o, e, sizeof e,
                         (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int8-channel",
                                               "--layers", bad_layers[i], NULL});
        if (rc != 2 || !strstr(e, "moe quantize: --layers: "))
            fail_msg("--layers '%s': exit %d (want 2), stderr:\n%s", bad_layers[i], rc, e);
        assert_string_equal(o, "");
    }
    /* a layer number outside the checkpoint is its config's to refuse: the range and the MoE
     * layers it has (exit 1, nothing written), as moe run / plan / bench --layer */
    static const char *const far_layers[] = {"-1", "4294967296", "0,1"};
    for (size_t i = 0; i < sizeof far_layers / sizeof far_layers[0]; i++) {
        int rc = run_cli(o, sizeof o, e, sizeof e,
                         (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int8-channel",
                                               "--layers", far_layers[i], NULL});
        if (rc != 1 || !strstr(e, "out of range: num_hidden_layers is 1, valid layers are 0..0; MoE layers: 0..0 (all 1)"))
            fail_msg("--layers '%s': exit %d (want 1), stderr:\n%s", far_layers[i], rc, e);
        assert_int_equal(access(out, F_OK), -1);
    }
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "mxfp4", NULL}),
                     1);
    assert_non_null(strstr(e, "mxfp4"));
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", in, "--quant", "int8-w8a8", NULL}),
                     1);
    assert_non_null(strstr(e, "input"));
    assert_int_equal(tu_dir_entries(root), 0);
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int8-w8a8", NULL}),
                     0);
    /* 18 expert linears of [12, 40] / [40, 12] f32: 34560 bytes in */
    assert_non_null(strstr(o, "input expert bytes: 34560"));
    assert_non_null(strstr(o, "output expert bytes:"));
    assert_non_null(strstr(o, "scale bytes:"));
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int8-w8a8", NULL}),
                     1);
    assert_non_null(strstr(e, "--force"));
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "fp8-block",
                                                   "--force", NULL}),
                     0);
    assert_int_equal(tu_dir_entries(root), 1);
    tu_rm_tree(root);
}

/* Copies the regular file `from` to `to`. */
static void copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    assert_non_null(f);
    FILE *g = fopen(to, "wb");
    assert_non_null(g);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        assert_int_equal(fwrite(buf, 1, n, g), n);
    fclose(f);
    assert_int_equal(fclose(g), 0);
}

static void touch(const char *dir, const char *name)
{
    char p[800];
    tu_join(p, sizeof p, dir, name);
    assert_int_equal(tu_write_file(p, "{}\n", 3), 0);
}

/* moe_quantize_options.force in the library (not only the command line) replaces out_dir only
 * when it looks like a checkpoint: a folder without config.json, or with a foreign file, is
 * MOE_EINVAL naming the reason and left as it was; a folder of checkpoint files is replaced. */
static void test_lib_force_refusals(void **state)
{
    (void)state;
    char root[512], in[600], out[700], p[800];
    tu_tmpdir(root, sizeof root, "quantize_libforce");
    tu_data_path(in, sizeof in, "qwen3_moe_f32");
    tu_join(out, sizeof out, root, "home");
    assert_int_equal(mkdir(out, 0700), 0);
    touch(out, "notes.txt");
    moe_ctx *ctx = tu_ctx();
    moe_quantize_options o = {.scheme = "int8-channel", .force = 1};
    expect_error(ctx, moe_checkpoint_quantize(ctx, in, out, &o, NULL), MOE_EINVAL, "force:",
                 "does not look like a checkpoint (no config.json)");
    touch(out, "config.json");
    expect_error(ctx, moe_checkpoint_quantize(ctx, in, out, &o, NULL), MOE_EINVAL,
                 "holds 'notes.txt', which is not a checkpoint file");
    tu_join(p, sizeof p, out, "notes.txt");
    assert_int_equal(access(p, F_OK), 0); /* untouched */
    o.force = 0;
    expect_error(ctx, moe_checkpoint_quantize(ctx, in, out, &o, NULL), MOE_EINVAL, "exists and is not empty");
    assert_int_equal(unlink(p), 0);
    touch(out, "model.safetensors.index.json");
    o.force = 1;
    if (moe_checkpoint_quantize(ctx, in, out, &o, NULL) != MOE_OK)
        fail_msg("a checkpoint-like folder: %s", moe_ctx_last_error(ctx));
    tu_join(p, sizeof p, out, "model.safetensors.index.json");
    assert_int_not_equal(access(p, F_OK), 0); /* replaced by the new output */
    moe_ctx_free(ctx);
    tu_rm_tree(root);
}

/* --force replaces an existing OUT only when it looks like a checkpoint and holds neither the
 * current folder nor IN; each refusal (exit 1) names its reason and leaves OUT as it was. */
static void test_cli_force_refusals(void **state)
{
    (void)state;
    char root[512], in[600], out[700], p[800], o[8192], e[4096];
    tu_tmpdir(root, sizeof root, "quantize_force");
    tu_data_path(in, sizeof in, "qwen3_moe_f32");
    tu_join(out, sizeof out, root, "p2");
    assert_int_equal(mkdir(out, 0700), 0);
    const char *const args[] = {"--checkpoint", in, "--output", out, "--quant", "int8-channel", "--force", NULL};

    /* the tester's case: OUT holds an unrelated file and the current folder */
    char inner[800];
    tu_join(inner, sizeof inner, out, "inner");
    assert_int_equal(mkdir(inner, 0700), 0);
    touch(out, "keep.txt");
    touch(out, "config.json");
    cli_cwd = inner;
    int rc = run_cli(o, sizeof o, e, sizeof e, args);
    cli_cwd = NULL;
    if (rc != 1 || !strstr(e, "holds the current folder") || !strstr(e, inner))
        fail_msg("cwd inside OUT: exit %d, stderr:\n%s", rc, e);
    tu_join(p, sizeof p, out, "keep.txt");
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(access(inner, F_OK), 0);

    /* a foreign file (the first by name is named), then a foreign folder */
    rc = run_cli(o, sizeof o, e, sizeof e, args);
    if (rc != 1 || !strstr(e, "holds 'inner', which is not a checkpoint file"))
        fail_msg("foreign folder: exit %d, stderr:\n%s", rc, e);
    assert_int_equal(rmdir(inner), 0);
    rc = run_cli(o, sizeof o, e, sizeof e, args);
    if (rc != 1 || !strstr(e, "holds 'keep.txt', which is not a checkpoint file"))
        fail_msg("foreign file: exit %d, stderr:\n%s", rc, e);
    assert_int_equal(access(p, F_OK), 0);

    /* no config.json */
    assert_int_equal(unlink(p), 0);
    tu_join(p, sizeof p, out, "config.json");
    assert_int_equal(unlink(p), 0);
    touch(out, "model.safetensors.index.json");
    rc = run_cli(o, sizeof o, e, sizeof e, args);
    if (rc != 1 || !strstr(e, "does not look like a checkpoint (no config.json)"))
        fail_msg("no config.json: exit %d, stderr:\n%s", rc, e);
    tu_join(p, sizeof p, out, "model.safetensors.index.json");
    assert_int_equal(access(p, F_OK), 0);
    assert_int_equal(unlink(p), 0);

    /* OUT holds the --checkpoint folder (a copy of the fixture inside it) */
    char ck[800], a[900], b[900];
    tu_join(ck, sizeof ck, out, "ck");
    assert_int_equal(mkdir(ck, 0700), 0);
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        tu_join(a, sizeof a, in, files[i]);
        tu_join(b, sizeof b, ck, files[i]);
        copy_file(a, b);
    }
    touch(out, "config.json");
    const char *const args_ck[] = {"--checkpoint", ck, "--output", out, "--quant", "int8-channel", "--force", NULL};
    rc = run_cli(o, sizeof o, e, sizeof e, args_ck);
    if (rc != 1 || !strstr(e, "the output is the input checkpoint") || !strstr(e, "or holds it"))
        fail_msg("IN inside OUT: exit %d, stderr:\n%s", rc, e);
    tu_join(b, sizeof b, ck, "model.safetensors");
    assert_int_equal(access(b, F_OK), 0);
    tu_rm_tree(ck);

    /* a previous moe quantize output, with the files a checkpoint carries, is replaced */
    tu_rm_tree(out);
    assert_int_equal(run_cli(o, sizeof o, e, sizeof e,
                             (const char *const[]){"--checkpoint", in, "--output", out, "--quant", "int8-w8a8", NULL}),
                     0);
    static const char *const extra[] = {"README.md", "LICENSE", "tokenizer.json", "merges.txt", "vocab.txt",
                                        "tokenizer.model", "chat_template.jinja", "modeling_x.py"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        touch(out, extra[i]);
    rc = run_cli(o, sizeof o, e, sizeof e, args);
    if (rc != 0)
        fail_msg("replacing a quantize output: exit %d, stderr:\n%s", rc, e);
    tu_join(p, sizeof p, out, "README.md"); /* the old folder's own file is gone */
    assert_int_equal(access(p, F_OK), -1);
    tu_join(p, sizeof p, out, "config.json");
    char buf[8192] = "";
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
    fclose(f);
    assert_non_null(strstr(buf, "pack-quantized")); /* int8-channel's, not int8-w8a8's */
    assert_int_equal(tu_dir_entries(root), 1);
    tu_rm_tree(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_schemes),
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_ct_package_fixture),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_nonfinite_weight),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_cli_force_refusals),
        cmocka_unit_test(test_lib_force_refusals),
    };
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
