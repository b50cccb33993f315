/* Quantized experts (issue 5): exact format decoding (R13), int4 packing, dynamic activation
 * quantization (R14), plan validation, and every scheme through the whole MoE entry point
 * (R10) on every kernel table: weight-only schemes bit-identical to the f32 path on the
 * dequantized weights, including partial 128x128 blocks (R11, I = 192 and 80) and non-square
 * scale grids over a wide exponent range (R12); w8a8 int8 bit-identical across tables and
 * within its stated bound of the unquantized f32 layer. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "gemm/kernels.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

/* ---- R13: formats ---- */

static void test_e4m3_all_codes(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        float got = moe_e4m3_to_f32((uint8_t)b);
        int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) {
            assert_true(isnan(got));
            continue;
        }
        /* independent: in double, by the e4m3fn definition */
        double v = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, e - 7);
        if (s)
            v = -v;
        assert_true((double)got == v);
        assert_int_equal(signbit(got) != 0, s);
        assert_int_equal(moe_f32_to_e4m3(got), b); /* the encoder inverts it */
    }
    assert_true(moe_e4m3_to_f32(0x7e) == 448.0f && moe_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(moe_e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
}

static void test_e2m1_e8m0(void **state)
{
    (void)state;
    for (unsigned c = 0; c < 16; c++) {
        unsigned e = (c >> 1) & 3, m = c & 1;
        double v = e == 0 ? 0.5 * m : ldexp(1.0 + m / 2.0, (int)e - 1);
        if (c & 8)
            v = -v;
        assert_true((double)moe_e2m1_to_f32(c) == v);
        assert_int_equal(signbit(moe_e2m1_to_f32(c)) != 0, (c & 8) != 0);
        assert_int_equal(moe_f32_to_e2m1(moe_e2m1_to_f32(c)), c);
    }
    for (int e = 0; e < 255; e++)
        assert_true((double)moe_e8m0_to_f32((uint8_t)e) == ldexp(1.0, e - 127));
    assert_true(isnan(moe_e8m0_to_f32(255)));
}

static void test_int4_packing(void **state)
{
    (void)state;
    /* low nibble first: byte 0x21 holds k = 0 -> 1, k = 1 -> 2; signed 0xf = -1, 0x8 = -8 */
    moe_qweight qw = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_CHANNEL};
    uint8_t codes[2] = {0x21, 0x8f};
    float s = 0.5f, out[4];
    moe_quant_dequant_source(&qw, codes, &s, NULL, 1, 4, out);
    assert_true(out[0] == 0.5f && out[1] == 1.0f && out[2] == -0.5f && out[3] == -4.0f);
    /* zero points: w = (q - z) * s, q unsigned */
    moe_qweight qz = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 32, .has_zero_point = 1};
    uint8_t c2[16], z = 3;
    memset(c2, 0x00, sizeof c2);
    c2[0] = 0xf0;
    float s2 = 2.0f, o2[32];
    moe_quant_dequant_source(&qz, c2, &s2, &z, 1, 32, o2);
    assert_true(o2[0] == -6.0f && o2[1] == 24.0f && o2[2] == -6.0f);
}

static void test_act_quant(void **state)
{
    (void)state;
    float zero[40] = {0};
    float s = moe_qact_i8_scale(zero, 40);
    assert_true(s == 1.0f); /* R14: guarded */
    for (int k = 0; k < 40; k++)
        assert_int_equal(moe_qact_i8(zero[k], s), 0);
    float x[5] = {0.5f, -2.54f, 1.0f, NAN, -0.01f};
    s = moe_qact_i8_scale(x, 5);
    assert_true(s == 2.54f / 127.0f);
    assert_int_equal(moe_qact_i8(x[1], s), -127);
    assert_int_equal(moe_qact_i8(x[3], s), -127); /* NaN -> -127, defined */
}

/* ---- validation ---- */

static moe_status plan_with(moe_quant_config q, int64_t H, int64_t I, moe_ctx *ctx, char *msg)
{
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = H;
    d.moe_intermediate_size = I;
    d.num_experts = 4;
    d.top_k = 2;
    d.weight_dtype = MOE_DTYPE_F32;
    d.quant = q;
    moe_plan *p = NULL;
    moe_status st = moe_plan_create(ctx, &d, &p);
    snprintf(msg, 512, "%s", moe_ctx_last_error(ctx));
    moe_plan_free(p);
    return st;
}

static void test_validation(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char msg[512];
    moe_quant_config q;
    assert_int_equal(moe_quant_from_name("int8-w8a8", &q), MOE_OK);
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_OK);
    q.w13.scale = q.w2.scale = MOE_QSCALE_BLOCK; /* per-token + block weights */
    q.w13.block_n = q.w13.block_k = q.w2.block_n = q.w2.block_k = 128;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EINVAL);
    assert_non_null(strstr(msg, "TOKEN_GROUP"));
    assert_int_equal(moe_quant_from_name("int4-g64", &q), MOE_OK);
    q.w2.group_size = 48;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EINVAL);
    assert_non_null(strstr(msg, "quant.w2.group_size"));
    assert_int_equal(moe_quant_from_name("int4-g32", &q), MOE_OK);
    assert_int_equal(plan_with(q, 64, 33, ctx, msg), MOE_ESHAPE); /* odd K of w2 */
    assert_int_equal(moe_quant_from_name("mxfp4", &q), MOE_OK);
    q.w13.group_size = 64;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EINVAL);
    assert_int_equal(moe_quant_from_name("fp8-block", &q), MOE_OK);
    q.w13.has_zero_point = 1;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EINVAL);
    q.w13.has_zero_point = 0;
    q.w13.block_k = 0;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EINVAL);
    assert_non_null(strstr(msg, "block"));
    assert_int_equal(moe_quant_from_name("fp8-block", &q), MOE_OK);
    q.act = MOE_QACT_TOKEN_GROUP; /* fp8 w8a8 (test_f8a8.c): act_group_size must be block_k */
    q.act_group_size = 128;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_OK);
    q.act_group_size = 64;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EUNSUPPORTED);
    assert_non_null(strstr(msg, "act_group_size"));
    q.act = MOE_QACT_NONE;
    q.w2.dtype = MOE_QTYPE_NONE;
    assert_int_equal(plan_with(q, 64, 32, ctx, msg), MOE_EUNSUPPORTED);
    assert_int_equal(moe_quant_from_name("int4-g999", &q), MOE_EINVAL);
    moe_ctx_free(ctx);
}

/* ---- the whole layer ---- */

typedef struct qlayer {
    moe_layer_desc desc;     /* quantized */
    moe_layer_desc fdesc;    /* the same layer, f32 experts */
    int64_t H, I, E;
    float *router;           /* [E, H] */
    float **orig;            /* E*3: unquantized f32 gate, up, down */
    float **deq;             /* E*3: dequantized f32 */
    void **codes, **scales;  /* E*3 */
    uint8_t **zeros;         /* E*3 */
    float *sg, *su, *sd;     /* shared [Is, H], [Is, H], [H, Is] */
} qlayer;

/* Identity experts of the next qlayer_init (num_identity_experts; the router [E + Z, H]). */
static int64_t g_Z;
/* Applied to both descriptions of every qlayer when set (test_v4step_quant: other routing and
 * activation modes over the same quantized weights). */
static void (*g_desc_edit)(moe_layer_desc *d);
/* The layers' expert activation (test_nongated_quant sets a non-gated one: the gate arrays of
 * the source are then left NULL). */
static moe_activation g_act = MOE_ACT_SWIGLU;

/* Optional spread: each weight of row n, column k scaled by 2^(((n / 37) * 7 + (k / 29) * 5) % 41 - 20)
 * so block scales cover 2^-20 .. 2^20 (R12). */
static void qlayer_init(qlayer *L, const moe_quant_config *q, int64_t H, int64_t I, int64_t E, int64_t K,
                        int64_t Is, int spread, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    moe_layer_desc_init(&L->fdesc);
    L->fdesc.hidden_size = H;
    L->fdesc.moe_intermediate_size = I;
    L->fdesc.num_experts = E;
    L->fdesc.top_k = K;
    L->fdesc.renormalize = 1;
    L->fdesc.weight_dtype = MOE_DTYPE_F32;
    L->fdesc.shared_expert_intermediate_size = Is;
    L->fdesc.activation = g_act;
    L->fdesc.num_identity_experts = g_Z;
    if (g_desc_edit)
        g_desc_edit(&L->fdesc);
    L->desc = L->fdesc;
    L->desc.quant = *q;
    L->H = H, L->I = I, L->E = E;
    L->router = malloc(sizeof(float) * (size_t)((E + g_Z) * H));
    tu_fill_uniform(L->router, (size_t)((E + g_Z) * H), seed, -0.3f, 0.3f);
    L->orig = calloc((size_t)(3 * E), sizeof(float *));
    L->deq = calloc((size_t)(3 * E), sizeof(float *));
    L->codes = calloc((size_t)(3 * E), sizeof(void *));
    L->scales = calloc((size_t)(3 * E), sizeof(void *));
    L->zeros = calloc((size_t)(3 * E), sizeof(uint8_t *));
    for (int64_t i = 0; i < 3 * E; i++) {
        const int mat = (int)(i % 3);
        const int64_t N = mat == 2 ? H : I, Kd = mat == 2 ? I : H;
        const moe_qweight *qw = mat == 2 ? &q->w2 : &q->w13;
        float a = 1.0f / sqrtf((float)Kd);
        L->orig[i] = malloc(sizeof(float) * (size_t)(N * Kd));
        tu_fill_uniform(L->orig[i], (size_t)(N * Kd), seed + 11 + (uint64_t)i, -a, a);
        if (spread)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < Kd; k++)
                    L->orig[i][n * Kd + k] *= ldexpf(1.0f, (int)(((n / 37) * 7 + (k / 29) * 5) % 41) - 20);
        size_t cb, sb, zb;
        moe_quant_source_sizes(qw, N, Kd, &cb, &sb, &zb);
        L->codes[i] = malloc(cb);
        L->scales[i] = malloc(sb);
        L->zeros[i] = zb ? malloc(zb) : NULL;
        moe_quant_quantize_source(qw, L->orig[i], N, Kd, L->codes[i], L->scales[i], L->zeros[i]);
        L->deq[i] = malloc(sizeof(float) * (size_t)(N * Kd));
        moe_quant_dequant_source(qw, L->codes[i], L->scales[i], L->zeros[i], N, Kd, L->deq[i]);
    }
    if (Is > 0) {
        L->sg = malloc(sizeof(float) * (size_t)(Is * H));
        L->su = malloc(sizeof(float) * (size_t)(Is * H));
        L->sd = malloc(sizeof(float) * (size_t)(Is * H));
        tu_fill_uniform(L->sg, (size_t)(Is * H), seed + 3, -0.1f, 0.1f);
        tu_fill_uniform(L->su, (size_t)(Is * H), seed + 4, -0.1f, 0.1f);
        tu_fill_uniform(L->sd, (size_t)(Is * H), seed + 5, -0.1f, 0.1f);
    }
}

static void qlayer_free(qlayer *L)
{
    for (int64_t i = 0; i < 3 * L->E; i++) {
        free(L->orig[i]);
        free(L->deq[i]);
        free(L->codes[i]);
        free(L->scales[i]);
        free(L->zeros[i]);
    }
    free(L->orig);
    free(L->deq);
    free(L->codes);
    free(L->scales);
    free(L->zeros);
    free(L->router);
    free(L->sg);
    free(L->su);
    free(L->sd);
}

/* The pointer arrays of a moe_weight_source over L's matrices ([E] each). */
typedef struct qsource {
    const void **g, **u, **dn, **gs, **us, **ds;
    const uint8_t **gz, **uz, **dz;
    moe_weight_source src;
} qsource;

/* which: 0 quantized, 1 f32 dequantized, 2 f32 original. */
static void qsource_init(qsource *S, const qlayer *L, int which)
{
    const int64_t E = L->E;
    S->g = calloc((size_t)E, sizeof(void *)), S->u = calloc((size_t)E, sizeof(void *));
    S->dn = calloc((size_t)E, sizeof(void *));
    S->gs = calloc((size_t)E, sizeof(void *)), S->us = calloc((size_t)E, sizeof(void *));
    S->ds = calloc((size_t)E, sizeof(void *));
    S->gz = calloc((size_t)E, sizeof(void *)), S->uz = calloc((size_t)E, sizeof(void *));
    S->dz = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        void *const *m = which == 0 ? L->codes : which == 1 ? (void *const *)L->deq : (void *const *)L->orig;
        S->g[e] = m[3 * e], S->u[e] = m[3 * e + 1], S->dn[e] = m[3 * e + 2];
        S->gs[e] = L->scales[3 * e], S->us[e] = L->scales[3 * e + 1], S->ds[e] = L->scales[3 * e + 2];
        S->gz[e] = L->zeros[3 * e], S->uz[e] = L->zeros[3 * e + 1], S->dz[e] = L->zeros[3 * e + 2];
    }
    moe_weight_source src = {.router = L->router, .router_dtype = MOE_DTYPE_F32, .gate_proj = S->g,
                             .up_proj = S->u, .down_proj = S->dn, .shared_gate_proj = L->sg,
                             .shared_up_proj = L->su, .shared_down_proj = L->sd};
    if (which == 0) {
        src.gate_scale = S->gs, src.up_scale = S->us, src.down_scale = S->ds;
        src.gate_zero = S->gz, src.up_zero = S->uz, src.down_zero = S->dz;
    }
    if (!moe_activation_gated(g_act)) { /* non-gated: W1 is up_proj; no gate array is read */
        src.gate_proj = NULL, src.gate_scale = NULL, src.gate_zero = NULL;
        src.shared_gate_proj = NULL;
    }
    S->src = src;
}

static void qsource_free(qsource *S)
{
    free(S->g), free(S->u), free(S->dn), free(S->gs), free(S->us), free(S->ds), free(S->gz), free(S->uz),
        free(S->dz);
}

/* which: 0 quantized, 1 f32 dequantized, 2 f32 original. */
static void run(const qlayer *L, int which, const char *isa, int threads, const float *x, int64_t T, float *out)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = isa;
    o.num_threads = threads;
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    qsource S;
    qsource_init(&S, L, which);
    tu_run_layer(ctx, which == 0 ? &L->desc : &L->fdesc, NULL, &S.src, x, T, out);
    moe_ctx_free(ctx);
    qsource_free(&S);
}

static const char *isas[16]; /* the kernel registry's rows (tu_isa_names, filled by main) */
static size_t n_isas;

static int isa_ok(const char *isa)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = isa;
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    int ok = moe_ctx_create(&o, &ctx, err, sizeof err) == MOE_OK;
    moe_ctx_free(ctx);
    return ok;
}

/* vLLM's metric (tests/kernels/quantization/test_block_fp8.py): mean |a - ref| / mean |ref|;
 * the max-based one (max |a - ref| / max |ref|) is printed beside it. */
static double last_max_rel;
static double rel_to_max(const float *a, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += fabs((double)a[i] - (double)ref[i]);
        den += fabs((double)ref[i]);
    }
    last_max_rel = tu_max_abs_diff(a, ref, n) / tu_max_abs(ref, n);
    return num / den;
}

/* Weight-only scheme: every table, 1 and 2 threads, bit-identical to the ref table's plan (the
 * contract of docs/numerics.md section 5); the ref plan within TU_REASSOC_REL of max |output|
 * of the f32 plan on the dequantized weights (the same sums with the scale applied per weight
 * instead of per group; a misread code, scale or zero point is off by far more); returns the
 * error against the unquantized original. */
static double last_deq_rel;
static double check_weight_only(const moe_quant_config *q, int64_t H, int64_t I, int64_t Is, int spread)
{
    const int64_t E = 6, K = 2, T = 37;
    qlayer L;
    qlayer_init(&L, q, H, I, E, K, Is, spread, 1234 + (uint64_t)I);
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 77, -1.0f, 1.0f);
    float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H)),
          *deq = malloc(sizeof(float) * (size_t)(T * H)), *orig = malloc(sizeof(float) * (size_t)(T * H));
    run(&L, 0, "ref", 1, x, T, want);
    run(&L, 1, "ref", 1, x, T, deq);
    last_deq_rel = tu_max_abs_diff(want, deq, (size_t)(T * H)) / tu_max_abs(deq, (size_t)(T * H));
    if (!(last_deq_rel <= TU_REASSOC_REL))
        fail_msg("%s H=%lld I=%lld: %g of max |output| from f32 on the dequantized weights (bound %g)",
                 moe_quant_name(q), (long long)H, (long long)I, last_deq_rel, TU_REASSOC_REL);
    for (size_t a = 0; a < n_isas; a++) {
        if (!isa_ok(isas[a]))
            continue;
        for (int th = 1; th <= 2; th++) {
            run(&L, 0, isas[a], th, x, T, got);
            if (memcmp(got, want, sizeof(float) * (size_t)(T * H)) != 0)
                fail_msg("%s H=%lld I=%lld isa %s threads %d: not bit-identical to the ref table (max diff %g)",
                         moe_quant_name(q), (long long)H, (long long)I, isas[a], th,
                         tu_max_abs_diff(got, want, (size_t)(T * H)));
        }
    }
    run(&L, 2, "ref", 1, x, T, orig);
    double err = rel_to_max(want, orig, (size_t)(T * H));
    free(x), free(want), free(got), free(deq), free(orig);
    qlayer_free(&L);
    return err;
}

static void test_weight_only_exact(void **state)
{
    (void)state;
    static const char *const names[] = {"fp8-tensor", "fp8-channel", "fp8-block", "int8-channel", "int4-g32",
                                        "int4-g64", "int4-g128", "int4-g32-zp", "int4-g128-zp", "mxfp4"};
    /* stated bounds against the unquantized layer (relative to max |output|) */
    static const double bound[] = {0.06, 0.06, 0.06, 0.015, 0.16, 0.16, 0.16, 0.16, 0.16, 0.3};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name(names[i], &q), MOE_OK);
        for (int s = 0; s < 2; s++) {
            const int64_t I = s == 0 ? 192 : 80; /* R11: partial trailing 128-blocks */
            double err = check_weight_only(&q, 160, I, s == 0 ? 48 : 0, 0);
            printf("  %-13s I=%3lld: tables bit-identical; vs f32 on the dequantized weights %.2g of max; vs "
                   "unquantized: mean-rel %.4f (bound %.3f), max-rel %.4f\n",
                   names[i], (long long)I, last_deq_rel, err, bound[i], last_max_rel);
            assert_true(err <= bound[i]);
        }
    }
}

/* Identity experts (LongCat-Flash) with quantized routed experts: the quantized plan on every
 * table bit-identical to the ref table and within TU_REASSOC_REL of the f32 plan on the
 * dequantized weights (check_weight_only), with Z = 4 identity experts beside E = 6. */
static void test_identity_quant(void **state)
{
    (void)state;
    static const char *const names[] = {"fp8-block", "int8-channel", "int4-g32-zp", "mxfp4"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name(names[i], &q), MOE_OK);
        g_Z = 4;
        double err = check_weight_only(&q, 160, 80, 48, 0);
        g_Z = 0;
        printf("  %-13s + 4 identity experts: tables bit-identical; vs f32 on the dequantized weights %.2g of max; "
               "vs unquantized max-rel %.4f\n", names[i], last_deq_rel, last_max_rel);
        (void)err;
    }
}

/* DeepSeek-V4's and Step-3.7's modes over quantized experts: DeepSeek-V4's sqrtsoftplus scores with
 * Step-3.7's clamp after the SiLU in the routed experts (limit 0.3: it binds on these weights)
 * (g and u have a std of about 0.33 on these weights: the clamps bind on a good share of them)
 * and a shared expert clamped before it at its own limit (shared_swiglu_limit 0.02): every
 * table and thread count bit-identical to the ref table's plan, the ref plan within
 * TU_REASSOC_REL of f32 on the dequantized weights (check_weight_only), and the stated bounds of
 * test_weight_only_exact against the unquantized layer. */
static void v4step_modes(moe_layer_desc *d)
{
    d->scoring_func = MOE_SCORING_SQRTSOFTPLUS;
    d->routed_scaling_factor = 1.5f;
    d->activation = MOE_ACT_SWIGLU_POSTCLAMP;
    d->swiglu_limit = 0.3f;
    d->has_shared_activation = 1;
    d->shared_activation = MOE_ACT_SWIGLU_CLAMP;
    d->shared_swiglu_limit = 0.02f;
}

static void test_v4step_quant(void **state)
{
    (void)state;
    static const char *const names[] = {"fp8-block", "int8-channel", "int4-g32-zp", "mxfp4"};
    static const double bound[] = {0.06, 0.015, 0.16, 0.3};
    g_desc_edit = v4step_modes;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name(names[i], &q), MOE_OK);
        double err = check_weight_only(&q, 160, 192, 48, 0);
        printf("  v4step modes %-13s: tables bit-identical; vs f32 on the dequantized weights %.2g of max; vs "
               "unquantized: mean-rel %.4f (bound %.3f)\n", names[i], last_deq_rel, err, bound[i]);
        assert_true(err <= bound[i]);
    }
    g_desc_edit = NULL;
}

/* Non-gated experts (MOE_ACT_RELU2, MOE_ACT_GELU_TANH; W1 as up_proj, the gate arrays NULL) under
 * every weight-only scheme and both w8a8 schemes: every table bit-identical to the ref table's
 * plan, and within the stated bounds of f32 on the dequantized / unquantized weights. */
static void test_nongated_quant(void **state)
{
    (void)state;
    static const char *const names[] = {"fp8-tensor", "fp8-block", "int8-channel", "int4-g32", "int4-g128-zp", "mxfp4"};
    static const double bound[] = {0.06, 0.06, 0.015, 0.16, 0.16, 0.3};
    for (int a = 0; a < 2; a++) {
        g_act = a == 0 ? MOE_ACT_RELU2 : MOE_ACT_GELU_TANH;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            moe_quant_config q;
            assert_int_equal(moe_quant_from_name(names[i], &q), MOE_OK);
            double err = check_weight_only(&q, 160, 80, a == 0 ? 48 : 0, 0);
            printf("  non-gated act %d %-13s: tables bit-identical; vs f32 on the dequantized weights %.2g of max; "
                   "vs unquantized: mean-rel %.4f (bound %.3f)\n",
                   (int)g_act, names[i], last_deq_rel, err, bound[i]);
            assert_true(err <= bound[i]);
        }
        /* the schemes' stated bounds against the unquantized layer: test_w8a8_int8 (0.02),
         * test_f8a8.c test_error_vs_f32 (0.10) */
        static const char *const w8[] = {"int8-w8a8", "fp8-block-w8a8"};
        static const double w8_bound[] = {0.02, 0.10};
        for (int s = 0; s < 2; s++) {
            moe_quant_config q;
            assert_int_equal(moe_quant_from_name(w8[s], &q), MOE_OK);
            const int64_t H = 256, I = 128, T = 29;
            qlayer L;
            qlayer_init(&L, &q, H, I, 6, 2, 0, 0, 600 + (uint64_t)s);
            float *x = malloc(sizeof(float) * (size_t)(T * H));
            tu_fill_uniform(x, (size_t)(T * H), 79, -1.0f, 1.0f);
            float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H)),
                  *orig = malloc(sizeof(float) * (size_t)(T * H));
            run(&L, 0, "ref", 1, x, T, want);
            for (size_t t = 0; t < n_isas; t++) {
                if (!isa_ok(isas[t]))
                    continue;
                for (int th = 1; th <= 2; th++) {
                    run(&L, 0, isas[t], th, x, T, got);
                    if (memcmp(got, want, sizeof(float) * (size_t)(T * H)) != 0)
                        fail_msg("non-gated %s isa %s threads %d differs from ref (max %g)", w8[s], isas[t], th,
                                 tu_max_abs_diff(got, want, (size_t)(T * H)));
                }
            }
            run(&L, 2, "ref", 1, x, T, orig);
            double err = rel_to_max(want, orig, (size_t)(T * H));
            printf("  non-gated act %d %s: tables bit-identical; vs unquantized: mean-rel %.4f (bound %.2f)\n",
                   (int)g_act, w8[s], err, w8_bound[s]);
            assert_true(err <= w8_bound[s]);
            free(x), free(want), free(got), free(orig);
            qlayer_free(&L);
        }
    }
    g_act = MOE_ACT_SWIGLU;
}

/* R12: non-square block grids and scales over 2^-20 .. 2^20; each dequantized element within
 * the e4m3 rounding of its original (a misaddressed scale is off by powers of two). */
static void test_block_grids_wide_scales(void **state)
{
    (void)state;
    const int64_t shapes[][2] = {{64, 128}, {128, 32}, {48, 80}};
    for (size_t s = 0; s < 3; s++) {
        moe_quant_config q;
        assert_int_equal(moe_quant_from_name("fp8-block", &q), MOE_OK);
        q.w13.block_n = q.w2.block_n = shapes[s][0];
        q.w13.block_k = q.w2.block_k = shapes[s][1];
        qlayer L;
        const int64_t H = 200, I = 144;
        qlayer_init(&L, &q, H, I, 3, 2, 0, 1, 99 + s);
        for (int64_t i = 0; i < 3 * L.E; i++) {
            const int64_t N = i % 3 == 2 ? H : I, Kd = i % 3 == 2 ? I : H;
            const moe_qweight *qw = i % 3 == 2 ? &q.w2 : &q.w13;
            const int64_t gc = (Kd + qw->block_k - 1) / qw->block_k;
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < Kd; k++) {
                    float o = L.orig[i][n * Kd + k], d = L.deq[i][n * Kd + k];
                    float sc = ((const float *)L.scales[i])[(n / qw->block_n) * gc + k / qw->block_k];
                    /* e4m3: relative 2^-4 for normals, absolute s * 2^-10 for subnormals */
                    if (!(fabsf(d - o) <= 0.0625f * fabsf(o) + sc * 0x1p-10f))
                        fail_msg("block [%lld,%lld] matrix %lld (%lld,%lld): %g vs %g", (long long)shapes[s][0],
                                 (long long)shapes[s][1], (long long)i, (long long)n, (long long)k, (double)d,
                                 (double)o);
                }
        }
        qlayer_free(&L);
        check_weight_only(&q, 200, 144, 0, 1); /* and the kernels */
    }
}

/* w8a8 int8: every table the same bits; within the stated bound of the unquantized layer;
 * an all-zero token gives exactly 0 (R14). */
static void test_w8a8_int8(void **state)
{
    (void)state;
    moe_quant_config q;
    assert_int_equal(moe_quant_from_name("int8-w8a8", &q), MOE_OK);
    const int64_t sizes[][2] = {{160, 192}, {256, 80}, {130, 18}}; /* K not a multiple of 4 too */
    for (size_t s = 0; s < 3; s++) {
        const int64_t H = sizes[s][0], I = sizes[s][1], T = 41;
        qlayer L;
        qlayer_init(&L, &q, H, I, 8, 2, 0, 0, 555 + s);
        float *x = malloc(sizeof(float) * (size_t)(T * H));
        tu_fill_uniform(x, (size_t)(T * H), 78, -1.0f, 1.0f);
        memset(x + 5 * H, 0, sizeof(float) * (size_t)H); /* token 5: all zero */
        float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H)),
              *orig = malloc(sizeof(float) * (size_t)(T * H));
        run(&L, 0, "ref", 1, x, T, want);
        for (size_t a = 0; a < n_isas; a++) {
            if (!isa_ok(isas[a]))
                continue;
            for (int th = 1; th <= 2; th++) {
                run(&L, 0, isas[a], th, x, T, got);
                if (memcmp(got, want, sizeof(float) * (size_t)(T * H)) != 0)
                    fail_msg("int8-w8a8 isa %s threads %d differs from ref (max %g)", isas[a], th,
                             tu_max_abs_diff(got, want, (size_t)(T * H)));
            }
        }
        for (int64_t h = 0; h < H; h++)
            assert_true(want[5 * H + h] == 0.0f);
        run(&L, 2, "ref", 1, x, T, orig);
        double err = rel_to_max(want, orig, (size_t)(T * H));
        printf("  int8-w8a8 H=%lld I=%lld: tables bit-identical; vs unquantized: mean-rel %.4f (bound 0.02), "
               "max-rel %.4f\n",
               (long long)H, (long long)I, err, last_max_rel);
        assert_true(err <= 0.02);
        free(x), free(want), free(got), free(orig);
        qlayer_free(&L);
    }
}

/* The public moe_quantize_matrix: the bytes of the internal quantizer, known values, and
 * MOE_EINVAL for what the plan would refuse. */
static void test_quantize_matrix_public(void **state)
{
    (void)state;
    moe_quant_config q;
    assert_int_equal(moe_quant_from_name("int4-g32-zp", &q), MOE_OK);
    enum { N = 3, K = 64 };
    float w[N * K];
    for (int i = 0; i < N * K; i++)
        w[i] = (float)((i * 37) % 29 - 14) * 0.25f;
    size_t cb, sb, zb;
    assert_int_equal(moe_quantize_matrix_sizes(&q.w13, N, K, &cb, &sb, &zb), MOE_OK);
    assert_int_equal(cb, N * K / 2);
    assert_int_equal(sb, N * 2 * 4);
    assert_int_equal(zb, N * 2);
    uint8_t c1[N * K / 2], c2[N * K / 2], z1[N * 2], z2[N * 2];
    float s1[N * 2], s2[N * 2];
    assert_int_equal(moe_quantize_matrix(&q.w13, w, N, K, c1, s1, z1), MOE_OK);
    assert_int_equal(moe_quant_quantize_source(&q.w13, w, N, K, c2, s2, z2), 0);
    assert_memory_equal(c1, c2, sizeof c1);
    assert_memory_equal(s1, s2, sizeof s1);
    assert_memory_equal(z1, z2, sizeof z1);
    /* int8 per channel: row 0 of an exact ramp -127..127 gets s = 1 and codes = values */
    assert_int_equal(moe_quant_from_name("int8-channel", &q), MOE_OK);
    float r[2 * 255];
    for (int k = 0; k < 255; k++)
        r[k] = r[255 + k] = (float)(k - 127);
    r[255] = 254.0f; /* row 1: max 254 -> s = 2 */
    int8_t codes[2 * 255];
    float sc[2];
    assert_int_equal(moe_quantize_matrix(&q.w13, r, 2, 255, codes, sc, NULL), MOE_OK);
    assert_true(sc[0] == 1.0f && sc[1] == 2.0f);
    assert_int_equal(codes[0], -127);
    assert_int_equal(codes[254], 127);
    assert_int_equal(codes[255], 127);
    assert_int_equal(codes[256], -63); /* -126 / 2 = -63 */
    /* refused */
    moe_qweight bad = q.w13;
    bad.dtype = MOE_QTYPE_NONE;
    assert_int_equal(moe_quantize_matrix_sizes(&bad, 2, 4, &cb, &sb, &zb), MOE_EINVAL);
    assert_int_equal(moe_quant_from_name("mxfp4", &q), MOE_OK);
    assert_int_equal(moe_quantize_matrix_sizes(&q.w13, 2, 63, &cb, &sb, &zb), MOE_EINVAL); /* odd K */
    bad = q.w13;
    bad.has_zero_point = 1;
    assert_int_equal(moe_quantize_matrix(&bad, w, 2, 64, c1, s1, z1), MOE_EINVAL);
    assert_int_equal(moe_quant_from_name("fp8-block", &q), MOE_OK);
    q.w13.block_k = 0;
    assert_int_equal(moe_quantize_matrix(&q.w13, w, 2, 64, c1, s1, NULL), MOE_EINVAL);
}

/* ---- the packed layouts, kernel by kernel ---- */

static uint64_t kq_state;
static unsigned kq_rand(void) /* splitmix64, deterministic */
{
    uint64_t z = (kq_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (unsigned)((z ^ (z >> 31)) >> 32);
}

/* One matrix [N, K] of random codes (every code value, e4m3 subnormals and -0 included; NaN
 * codes only when nan_codes) and random scales 2^(scale_lo .. scale_hi) (f32) or E8M0 bytes,
 * packed by moe_quant_pack; then for mb = 1 .. 9 rows and two panel ranges: the ref table's kernel
 * within the a-priori rounding bound of the exact value sum_k x[k] (v[k] - z) s (below), and
 * the avx2 and avx512 tables' kernels (where the CPU has them) equal to the ref bit for
 * bit, lanes past a narrow panel and rows past mb untouched.
 * Returns moe_qmat.f8h of the packed matrix.
 *
 * The exact value is summed in double from the code values v - z (moe_quant_dequant_source with
 * every scale 1) and the scales s (with every code the dtype's code of 1 and zero points 0).
 * The kernels' contract (docs/numerics.md section 5) rounds each of the group's gk fmaf, the
 * zero-point fmaf and the ng scale fmaf once, each error at most 2^-24 of a partial sum whose
 * magnitude is at most A = sum_k |x[k]| (|v[k]| + |z|) s, plus 2^-150 per rounding in the f32
 * subnormal range: |ref - exact| <= (gk + ng + 4) 2^-24 A (1 + 2^-20) + (K + ng + 4) 2^-149. */
static int avx2_calls; /* avx2 kernel calls checked by check_packed_kernels */
static int check_packed_kernels(const moe_qweight *qw, int64_t N, int64_t K, int nan_codes, int scale_lo,
                                int scale_hi)
{
    const int avx512 = isa_ok("avx512"), avx2 = isa_ok("avx2");
    size_t cb, sb, zb;
    moe_quant_source_sizes(qw, N, K, &cb, &sb, &zb);
    uint8_t *codes = malloc(cb), *zero = zb ? malloc(zb) : NULL;
    unsigned char *scale = malloc(sb);
    for (size_t i = 0; i < cb; i++) {
        codes[i] = (uint8_t)kq_rand();
        if (qw->dtype == MOE_QTYPE_F8_E4M3 && !nan_codes && (codes[i] & 0x7f) == 0x7f)
            codes[i] ^= 0x01; /* 0x7e / 0xfe: +-448 */
    }
    if (qw->dtype == MOE_QTYPE_F8_E4M3 && nan_codes)
        for (int64_t n = 0; n < N; n += 3) /* at most one NaN per output feature */
            codes[n * K + (n * 7) % K] = (n & 1) ? 0xff : 0x7f;
    for (size_t i = 0; i < zb; i++)
        zero[i] = (uint8_t)(kq_rand() & 15u);
    if (qw->dtype == MOE_QTYPE_MXFP4) {
        for (size_t i = 0; i < sb; i++)
            scale[i] = (uint8_t)(127 + scale_lo + (int)(kq_rand() % (unsigned)(scale_hi - scale_lo + 1)));
    } else {
        for (size_t i = 0; i < sb / 4; i++) {
            float s = ldexpf(1.0f + (float)(kq_rand() & 0xffff) / 65536.0f,
                             scale_lo + (int)(kq_rand() % (unsigned)(scale_hi - scale_lo + 1)));
            memcpy(scale + 4 * i, &s, 4);
        }
    }
    const int kind = moe_quant_kind(qw, MOE_QACT_NONE);
    const int64_t gk = moe_quant_gk(qw, K), ng = (K + gk - 1) / gk;
    uint8_t *packed = malloc(moe_quant_packed_bytes(kind, N, K) + 1);
    float *ps = malloc(sizeof(float) * (size_t)(N * ng)), *pz = zb ? malloc(sizeof(float) * (size_t)(N * ng)) : NULL;
    const int f8h = moe_quant_pack(qw, MOE_QACT_NONE, codes, scale, zero, N, K, packed, ps, pz, NULL);
    struct moe_qmat qm = {.kind = kind, .f8h = f8h, .gk = gk, .ng = ng, .scale = ps, .zero = pz};
    moe_pmat w = {.data = packed, .dtype = MOE_DTYPE_U8, .n = N, .k = K, .q = &qm};

    /* the exact code values and scales, from sources with every scale 1 / every code 1 */
    unsigned char *scale1 = malloc(sb), *codes1 = malloc(cb);
    uint8_t *zero0 = zb ? calloc(zb, 1) : NULL;
    for (size_t i = 0; i < sb; i += qw->dtype == MOE_QTYPE_MXFP4 ? 1 : 4) {
        if (qw->dtype == MOE_QTYPE_MXFP4)
            scale1[i] = 127; /* E8M0 2^0 */
        else
            memcpy(scale1 + i, &(float){1.0f}, 4);
    }
    /* the code of 1: e4m3 0x38, int8 1, int4 nibble 1 (twice per byte), e2m1 code 2 */
    const uint8_t one = qw->dtype == MOE_QTYPE_F8_E4M3 ? 0x38
                        : qw->dtype == MOE_QTYPE_I8    ? 0x01
                        : qw->dtype == MOE_QTYPE_MXFP4 ? 0x22
                                                       : 0x11;
    memset(codes1, one, cb);
    float *val = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] v - z (exact) */
    float *sca = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] s of each element */
    float *zv = malloc(sizeof(float) * (size_t)(N * K));  /* [N, K] -z (zero points), else 0 */
    moe_quant_dequant_source(qw, codes, scale1, zero, N, K, val);
    moe_quant_dequant_source(qw, codes1, scale, zero0, N, K, sca);
    if (zb) {
        memset(codes1, 0, cb); /* code 0 -> 0 - z */
        moe_quant_dequant_source(qw, codes1, scale1, zero, N, K, zv);
    } else {
        memset(zv, 0, sizeof(float) * (size_t)(N * K));
    }
    enum { MB = 9 };
    float *xb = malloc(sizeof(float) * (size_t)(MB * K)); /* [MB, K] */
    tu_fill_uniform(xb, (size_t)(MB * K), kq_rand(), -2.0f, 2.0f);
    const float *x[MB];
    for (int m = 0; m < MB; m++)
        x[m] = xb + m * K;
    const int64_t P = moe_pmat_panels(N), ldo = P * MOE_PANEL;
    float *ref = malloc(sizeof(float) * (size_t)(MB * ldo)), *got = malloc(sizeof(float) * (size_t)(MB * ldo));
    /* [MB, ldo] each */
    const int64_t ranges[2][2] = {{0, P}, {P > 1 ? 1 : 0, P}};
    for (int r = 0; r < 2; r++) {
        const int64_t p0 = ranges[r][0], p1 = ranges[r][1];
        for (int mb = 1; mb <= MB; mb++) {
            for (int64_t i = 0; i < MB * ldo; i++)
                ref[i] = got[i] = 12345.0f; /* sentinel */
            moe_linear(tu_table("ref"), &w, p0, p1, x, mb, ref, ldo);
            for (int m = 0; m < MB; m++)
                for (int64_t i = 0; i < ldo; i++) {
                    const int64_t n = p0 * MOE_PANEL + i;
                    const float r = ref[m * ldo + i];
                    if (m >= mb || n >= N) { /* untouched */
                        if (r != 12345.0f)
                            fail_msg("ref wrote row %d column %lld outside the call", m, (long long)n);
                        continue;
                    }
                    double exact = 0.0, A = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        const double v = val[n * K + k], sk = sca[n * K + k];
                        exact += (double)x[m][k] * v * sk;
                        A += fabs((double)x[m][k]) * (fabs(v) + 2.0 * fabs((double)zv[n * K + k])) * fabs(sk);
                    }
                    const double bound = (double)(gk + ng + 4) * 0x1p-24 * A * (1.0 + 0x1p-20) +
                                         (double)(K + ng + 4) * 0x1p-149;
                    int ok;
                    if (isnan(exact))
                        ok = isnan(r);
                    else if (fabs(exact) - bound > FLT_MAX)
                        ok = isinf(r) && (r > 0) == (exact > 0);
                    else
                        ok = fabs((double)r - exact) <= bound;
                    if (!ok)
                        fail_msg("dtype %d N=%lld K=%lld gk=%lld f8h=%d mb=%d p0=%lld: ref[%d][%lld] = %.9g, exact "
                                 "%.17g, bound %.3g",
                                 (int)qw->dtype, (long long)N, (long long)K, (long long)gk, f8h, mb, (long long)p0,
                                 m, (long long)n, r, exact, bound);
                }
            if (avx2) { /* sentinels kept: lanes past the call must stay untouched */
                for (int64_t i = 0; i < MB * ldo; i++)
                    got[i] = 12345.0f;
                moe_linear(tu_table("avx2"), &w, p0, p1, x, mb, got, ldo);
                if (memcmp(got, ref, sizeof(float) * (size_t)(MB * ldo)) != 0)
                    fail_msg("dtype %d N=%lld K=%lld gk=%lld f8h=%d mb=%d p0=%lld: avx2 differs from ref (max %g)",
                             (int)qw->dtype, (long long)N, (long long)K, (long long)gk, f8h, mb, (long long)p0,
                             tu_max_abs_diff(got, ref, (size_t)(MB * ldo)));
                avx2_calls++;
            }
            if (avx512) {
                for (int64_t i = 0; i < MB * ldo; i++)
                    got[i] = 12345.0f;
                moe_linear(tu_table("avx512"), &w, p0, p1, x, mb, got, ldo);
                if (memcmp(got, ref, sizeof(float) * (size_t)(MB * ldo)) != 0)
                    fail_msg("dtype %d N=%lld K=%lld gk=%lld f8h=%d mb=%d p0=%lld: avx512 differs from ref (max %g)",
                             (int)qw->dtype, (long long)N, (long long)K, (long long)gk, f8h, mb, (long long)p0,
                             tu_max_abs_diff(got, ref, (size_t)(MB * ldo)));
            }
        }
    }
    free(codes), free(zero), free(scale), free(packed), free(ps), free(pz), free(xb), free(ref), free(got);
    free(scale1), free(codes1), free(zero0), free(val), free(sca), free(zv);
    return f8h;
}

static void test_packed_kernels(void **state)
{
    (void)state;
    kq_state = 2026;
    /* N: one narrow panel, 4 full + a narrow one (tiles of 4 and of 1 panel, masked tail), 5 full */
    const int64_t Ns[] = {7, 16 * 4 + 5, 80};
    for (size_t a = 0; a < 3; a++) {
        const int64_t N = Ns[a];
        /* 4-bit: K % 8 = 0, 2, 4, 6; groups that do not divide K; per-channel with a tail */
        const int64_t K4s[] = {128, 66, 36, 102};
        for (size_t b = 0; b < 4; b++) {
            const int64_t K = K4s[b];
            moe_qweight i4 = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
            check_packed_kernels(&i4, N, K, 0, -12, 12);
            i4.has_zero_point = 1;
            i4.group_size = 64;
            check_packed_kernels(&i4, N, K, 0, -12, 12);
            moe_qweight i4c = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_CHANNEL};
            check_packed_kernels(&i4c, N, K, 0, -3, 3);
            moe_qweight fp4 = {.dtype = MOE_QTYPE_MXFP4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
            check_packed_kernels(&fp4, N, K, 0, -20, 20);
            /* groups of 6 and 10 (a TP slice's gcd granularity, moe_quant_slice_qweight): groups
             * that start inside a body word */
            moe_qweight i4s = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 6};
            check_packed_kernels(&i4s, N, K, 0, -12, 12);
            i4s.has_zero_point = 1;
            i4s.group_size = 10;
            check_packed_kernels(&i4s, N, K, 0, -12, 12);
        }
        /* byte codes: K odd; blocks of odd length (the 2-k fp8 steps cross no block end) */
        const int64_t K8s[] = {37, 128, 70};
        for (size_t b = 0; b < 3; b++) {
            const int64_t K = K8s[b];
            moe_qweight i8 = {.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_CHANNEL};
            check_packed_kernels(&i8, N, K, 0, -8, 8);
            moe_qweight f8 = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_BLOCK, .block_n = 16, .block_k = 5};
            assert_int_equal(check_packed_kernels(&f8, N, K, 0, -30, 30), 1); /* the f16 decode */
            f8.block_n = 7, f8.block_k = 128;
            /* scales down to 2^-140 (f32 subnormal) and up to 2^119 (s * 256 < 2^128): f16 decode */
            assert_int_equal(check_packed_kernels(&f8, N, K, 0, -140, 119), 1);
            /* s * 256 overflows: the exact e4m3 decode */
            assert_int_equal(check_packed_kernels(&f8, N, K, 0, 120, 127), 0);
            /* NaN codes 0x7f / 0xff: the exact e4m3 decode */
            moe_qweight f8c = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_CHANNEL};
            assert_int_equal(check_packed_kernels(&f8c, N, K, 1, -4, 4), 0);
            assert_int_equal(check_packed_kernels(&f8c, N, K, 0, -4, 4), 1);
        }
    }
    /* zero points with more than 256 groups (groups of 2, a TP slice's granularity): the avx2
     * kernel sums x over two windows of groups (256 and 45), y carried in out between them */
    moe_qweight i4g2 = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 2, .has_zero_point = 1};
    check_packed_kernels(&i4g2, 21, 602, 0, -12, 12);
    if (isa_ok("avx2")) /* the avx2 kernel was really compared, not skipped */
        assert_true(avx2_calls > 0);
    else
        print_message("CPU without AVX2 + FMA: the avx2 quantized kernels not checked\n");
}

/* Weights packed for one plan, executed with a plan of the same layer description but another
 * quantization config (f32 vs int8, int8 vs int4, int4 group 128 vs 64) or compute mode:
 * MOE_EINVAL naming the quantization (compute), never an execute with the weights' scheme. */
static void test_weights_for_other_plan(void **state)
{
    (void)state;
    const int64_t H = 256, I = 128, T = 5;
    moe_quant_config q8, q4, q4g64;
    assert_int_equal(moe_quant_from_name("int8-channel", &q8), MOE_OK);
    assert_int_equal(moe_quant_from_name("int4-g128", &q4), MOE_OK);
    assert_int_equal(moe_quant_from_name("int4-g64", &q4g64), MOE_OK);
    const moe_quant_config *qs[3] = {&q8, &q4, &q4g64};
    qlayer L[3];
    for (int i = 0; i < 3; i++)
        qlayer_init(&L[i], qs[i], H, I, 4, 2, 0, 0, 901 + (uint64_t)i);
    moe_options o;
    moe_options_init(&o);
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    /* plans: 0 f32 experts, 1 int8-channel, 2 int4-g128, 3 int4-g64, 4 f32 experts computing in bf16 */
    moe_plan *p[5] = {0};
    moe_weights *w[5] = {0};
    qsource S[5];
    assert_int_equal(moe_plan_create(ctx, &L[0].fdesc, &p[0]), MOE_OK);
    qsource_init(&S[0], &L[0], 2);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(moe_plan_create(ctx, &L[i].desc, &p[1 + i]), MOE_OK);
        qsource_init(&S[1 + i], &L[i], 0);
    }
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.compute = MOE_COMPUTE_BF16;
    assert_int_equal(moe_plan_create_ex(ctx, &L[0].fdesc, &cfg, &p[4]), MOE_OK);
    qsource_init(&S[4], &L[0], 2);
    for (int i = 0; i < 5; i++)
        assert_int_equal(moe_weights_create(p[i], &S[i].src, &w[i]), MOE_OK);
    float *x = malloc(sizeof(float) * (size_t)(T * H)), *out = malloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 77, -1.0f, 1.0f);
    size_t ws_size = 0;
    for (int i = 0; i < 5; i++) {
        size_t n = moe_plan_workspace_size(p[i], T);
        ws_size = n > ws_size ? n : ws_size;
    }
    void *ws = malloc(ws_size);
    for (int i = 0; i < 5; i++) {
        /* its own weights run */
        assert_int_equal(moe_plan_execute(p[i], w[i], x, T, out, ws, ws_size), MOE_OK);
        for (int j = 0; j < 5; j++) {
            if (j == i)
                continue;
            memset(out, 0x7f, sizeof(float) * (size_t)(T * H));
            moe_status st = moe_plan_execute(p[i], w[j], x, T, out, ws, ws_size);
            const char *msg = moe_ctx_last_error(ctx);
            if (st != MOE_EINVAL)
                fail_msg("plan %d ran weights packed for plan %d (status %d)", i, j, (int)st);
            const char *want = (i == 0 && j == 4) || (i == 4 && j == 0) ? "compute" : "quantization";
            if (!strstr(msg, want))
                fail_msg("plan %d, weights of plan %d: message does not name the %s: %s", i, j, want, msg);
            printf("  plan %d, weights of plan %d: %s\n", i, j, msg);
            /* nothing written */
            for (int64_t k = 0; k < T * H; k++) {
                uint32_t b;
                memcpy(&b, &out[k], 4);
                assert_int_equal(b, 0x7f7f7f7fu);
            }
        }
    }
    for (int i = 0; i < 5; i++) {
        moe_weights_free(w[i]);
        moe_plan_free(p[i]);
        qsource_free(&S[i]);
    }
    for (int i = 0; i < 3; i++)
        qlayer_free(&L[i]);
    free(x), free(out), free(ws);
    moe_ctx_free(ctx);
}

int main(void)
{
    n_isas = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_all_codes),        cmocka_unit_test(test_e2m1_e8m0),
        cmocka_unit_test(test_int4_packing),          cmocka_unit_test(test_act_quant),
        cmocka_unit_test(test_validation),            cmocka_unit_test(test_weight_only_exact), cmocka_unit_test(test_identity_quant),
        cmocka_unit_test(test_validation),            cmocka_unit_test(test_weight_only_exact),
        cmocka_unit_test(test_v4step_quant),
        cmocka_unit_test(test_block_grids_wide_scales), cmocka_unit_test(test_w8a8_int8), cmocka_unit_test(test_quantize_matrix_public),
        cmocka_unit_test(test_block_grids_wide_scales), cmocka_unit_test(test_w8a8_int8), cmocka_unit_test(test_nongated_quant), cmocka_unit_test(test_quantize_matrix_public),
        cmocka_unit_test(test_packed_kernels),        cmocka_unit_test(test_weights_for_other_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
