/* The plan report (moe.h "Plan report": moe_plan_report, moe_plan_report_for,
 * moe_plan_path_for) against what it describes: the bytes moe_weights_create packs
 * (moe_weights_expert_bytes) for plain and every kind of quantized expert, the padding of the
 * packed layouts from their definitions (quant/layout.h), the TP shard refusals naming the
 * rank, the cost of a partial last panel on a table that hands it to the scalar kernel, the
 * compute roof each table's expert GEMMs run against, the path strings and the rank cap. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/avx512_bf16/avx512_bf16.h"
#include "gemm/kernels.h"
#include "moe.h"
#include "testutil.h"

static moe_ctx *ctx_on(const char *isa)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = isa;
    o.num_threads = 1;
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    return ctx;
}

/* A plan config of ep x tp ranks (rank 0, 0), compute f32. */
static const moe_plan_config *layout(int ep, int tp)
{
    static moe_plan_config c;
    moe_plan_config_init(&c);
    c.parallel.ep_size = ep;
    c.parallel.tp_size = tp;
    return &c;
}

static void desc_of(moe_layer_desc *d, int64_t H, int64_t I, int64_t E, int64_t Is, const char *quant)
{
    moe_layer_desc_init(d);
    d->hidden_size = H;
    d->moe_intermediate_size = I;
    d->num_experts = E;
    d->top_k = 2;
    d->renormalize = 1;
    d->weight_dtype = MOE_DTYPE_BF16;
    d->shared_expert_intermediate_size = Is;
    if (quant)
        assert_int_equal(moe_quant_from_name(quant, &d->quant), MOE_OK);
}

/* Packs the layer (random weights, quantized with moe_quantize_matrix when d is) and returns
 * moe_weights_expert_bytes. */
static size_t packed_bytes(moe_ctx *ctx, const moe_layer_desc *d, moe_compute compute)
{
    const int64_t H = d->hidden_size, I = d->moe_intermediate_size, E = d->num_experts;
    const int64_t Is = d->shared_expert_intermediate_size;
    const int quant = d->quant.w13.dtype != MOE_QTYPE_NONE;
    void **mats = calloc((size_t)(3 * E), sizeof(void *));   /* [E][3]: codes, or bf16 [N, K] */
    void **scales = calloc((size_t)(3 * E), sizeof(void *)); /* [E][3]: the scheme's scale grid */
    uint8_t **zeros = calloc((size_t)(3 * E), sizeof(uint8_t *));
    float *wf = malloc(sizeof(float) * (size_t)(I * H));          /* one matrix [N, K] f32 */
    float *router = malloc(sizeof(float) * (size_t)(E * H));      /* [E, H] */
    const size_t es = moe_dtype_size(d->weight_dtype);             /* plain weights: bf16 or f32 */
    uint8_t *shared = calloc((size_t)(3 * Is * H + 1), es);        /* gate, up [Is, H], down [H, Is] */
    tu_fill_uniform(router, (size_t)(E * H), 1, -0.5f, 0.5f);
    for (int64_t i = 0; i < 3 * E; i++) {
        const int mat = (int)(i % 3);
        const int64_t N = mat == 2 ? H : I, K = mat == 2 ? I : H;
        tu_fill_uniform(wf, (size_t)(N * K), 10 + (uint64_t)i, -0.2f, 0.2f);
        if (quant) {
            const moe_qweight *qw = mat == 2 ? &d->quant.w2 : &d->quant.w13;
            size_t cb, sb, zb;
            assert_int_equal(moe_quantize_matrix_sizes(qw, N, K, &cb, &sb, &zb), MOE_OK);
            mats[i] = malloc(cb);
            scales[i] = malloc(sb);
            zeros[i] = zb ? malloc(zb) : NULL;
            assert_int_equal(moe_quantize_matrix(qw, wf, N, K, mats[i], scales[i], zeros[i]), MOE_OK);
        } else if (d->weight_dtype == MOE_DTYPE_F32) {
            mats[i] = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] f32 */
            memcpy(mats[i], wf, sizeof(float) * (size_t)(N * K));
        } else {
            uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(N * K)); /* [N, K] bf16 (truncated f32) */
            for (int64_t j = 0; j < N * K; j++)
                b[j] = (uint16_t)(tu_f32_bits(wf[j]) >> 16);
            mats[i] = b;
        }
    }
    const void **g = calloc((size_t)E, sizeof(void *)), **u = calloc((size_t)E, sizeof(void *));
    const void **dn = calloc((size_t)E, sizeof(void *)), **gs = calloc((size_t)E, sizeof(void *));
    const void **us = calloc((size_t)E, sizeof(void *)), **ds = calloc((size_t)E, sizeof(void *));
    const uint8_t **gz = calloc((size_t)E, sizeof(void *)), **uz = calloc((size_t)E, sizeof(void *));
    const uint8_t **dz = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        g[e] = mats[3 * e], u[e] = mats[3 * e + 1], dn[e] = mats[3 * e + 2];
        gs[e] = scales[3 * e], us[e] = scales[3 * e + 1], ds[e] = scales[3 * e + 2];
        gz[e] = zeros[3 * e], uz[e] = zeros[3 * e + 1], dz[e] = zeros[3 * e + 2];
    }
    moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = g, .up_proj = u,
                             .down_proj = dn};
    if (quant) {
        src.gate_scale = gs, src.up_scale = us, src.down_scale = ds;
        if (d->quant.w13.has_zero_point)
            src.gate_zero = gz, src.up_zero = uz, src.down_zero = dz;
    }
    if (Is) {
        src.shared_gate_proj = shared;
        src.shared_up_proj = shared + (size_t)(Is * H) * es;
        src.shared_down_proj = shared + (size_t)(2 * Is * H) * es;
    }
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.compute = compute;
    assert_int_equal(moe_plan_create_ex(ctx, d, &cfg, &plan), MOE_OK);
    if (moe_weights_create(plan, &src, &w) != MOE_OK)
        fail_msg("moe_weights_create: %s", moe_ctx_last_error(ctx));
    const size_t bytes = moe_weights_expert_bytes(w);
    moe_rank_report r;
    assert_int_equal(moe_plan_report(plan, &r), MOE_OK);
    if (r.code_bytes + r.scale_bytes + r.shared_bytes != bytes)
        fail_msg("%s, %s weights, compute %s: the report says %llu code + %llu scale + %llu shared bytes, the "
                 "builder packed %zu",
                 d->quant.w13.dtype != MOE_QTYPE_NONE ? moe_quant_name(&d->quant) : "plain", moe_dtype_name(d->weight_dtype),
                 moe_compute_name(compute), (unsigned long long)r.code_bytes, (unsigned long long)r.scale_bytes,
                 (unsigned long long)r.shared_bytes, bytes);
    /* the layer in one process: the same bytes (one rank), and what a decode token reads */
    assert_int_equal(r.layer_bytes, r.code_bytes + r.shared_bytes);
    assert_int_equal(r.total_bytes, bytes);
    moe_weights_free(w);
    moe_plan_free(plan);
    for (int64_t i = 0; i < 3 * E; i++)
        free(mats[i]), free(scales[i]), free(zeros[i]);
    free(mats), free(scales), free(zeros), free(wf), free(router), free(shared);
    free(g), free(u), free(dn), free(gs), free(us), free(ds), free(gz), free(uz), free(dz);
    return bytes;
}

static const moe_cost *find_cost(const moe_rank_report *r, const char *kind)
{
    for (size_t i = 0; i < r->n_costs; i++)
        if (strcmp(r->costs[i].kind, kind) == 0)
            return &r->costs[i];
    return NULL;
}

/* code + scale + shared bytes of the report are what the builder packs, for plain experts and
 * every quantized format (per-channel, per-token w8a8, 4-bit with and without zero points,
 * fp8 blocks, fp8 w8a8, mxfp4), with odd shapes. */
static void test_bytes_match_the_builder(void **state)
{
    (void)state;
    static const struct {
        const char *quant;
        int64_t H, I, Is;
        moe_dtype dt;       /* plain weights' dtype */
        moe_compute compute;
    } cases[] = {
        {NULL, 66, 40, 24, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"int8-channel", 66, 40, 0, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"int8-w8a8", 66, 41, 0, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"int4-g32", 64, 42, 24, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"int4-g32-zp", 96, 34, 0, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"fp8-block", 200, 136, 0, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"fp8-block-w8a8", 256, 128, 0, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {"mxfp4", 64, 38, 0, MOE_DTYPE_BF16, MOE_COMPUTE_F32},
        {NULL, 66, 40, 24, MOE_DTYPE_F32, MOE_COMPUTE_F32},
        /* compute bf16: plain weights (and the shared expert) packed as bf16 pairs, odd K padded */
        {NULL, 65, 41, 23, MOE_DTYPE_BF16, MOE_COMPUTE_BF16},
        {NULL, 65, 41, 23, MOE_DTYPE_F32, MOE_COMPUTE_BF16},
        {"int4-g32", 64, 42, 24, MOE_DTYPE_BF16, MOE_COMPUTE_BF16},
    };
    moe_ctx *ctx = ctx_on("auto");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        moe_layer_desc d;
        desc_of(&d, cases[c].H, cases[c].I, 4, cases[c].Is, cases[c].quant);
        d.weight_dtype = cases[c].dt;
        assert_true(packed_bytes(ctx, &d, cases[c].compute) > 0);
    }
    moe_ctx_free(ctx);
}

/* Padding from the layouts' definitions: W8A8 rounds each matrix's K up to 4 (quant/layout.h
 * MOE_WF_W8A8), summed over gate, up [I, H] and down [H, I] of every expert; the plain and
 * weight-only 8-bit layouts pad nothing, nor do the 4-bit ones in a layer. */
static void test_padding(void **state)
{
    (void)state;
    moe_ctx *ctx = ctx_on("auto");
    const int64_t H = 66, I = 41, E = 4;
    moe_layer_desc d;
    desc_of(&d, H, I, E, 0, "int8-w8a8");
    moe_rank_report r;
    assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r), MOE_OK);
    const int64_t K4h = (H + 3) / 4 * 4, K4i = (I + 3) / 4 * 4;
    assert_int_equal(r.padding_bytes, (uint64_t)(E * (2 * I * (K4h - H) + H * (K4i - I))));
    const moe_cost *c = find_cost(&r, "padding");
    assert_non_null(c);
    assert_true(c->bytes == (double)r.padding_bytes);

    desc_of(&d, H, I, E, 0, "int8-channel");
    assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r), MOE_OK);
    assert_int_equal(r.padding_bytes, 0);
    assert_null(find_cost(&r, "padding"));

    desc_of(&d, H, I, E, 0, NULL);
    assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r), MOE_OK);
    assert_int_equal(r.padding_bytes, 0);

    /* 4-bit: K even for both matrices means N (the other's K) is even too, so a last panel is
     * never of odd width and nothing is padded */
    desc_of(&d, 64, 42, E, 0, "int4-g32");
    assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r), MOE_OK);
    assert_int_equal(r.padding_bytes, 0);
    moe_ctx_free(ctx);
}

/* A TP layout that some rank cannot pack is refused by both report calls, naming that rank. */
static void test_tp_shard_refusals(void **state)
{
    (void)state;
    moe_ctx *ctx = ctx_on("auto");
    moe_layer_desc d;
    desc_of(&d, 64, 40, 4, 0, "int4-g32"); /* I = 40 over 3: shards 14, 13, 13 */
    moe_rank_report r;
    const char *subs[] = {"int4-g32", "TP rank 1's shard", "13 columns", NULL};
    tu_check_error(ctx, moe_plan_report_for(ctx, &d, layout(1, 3), &r),
                   MOE_ESHAPE, subs);
    /* asking for rank 0, whose own shard is even, is refused too: the layout is */
    tu_check_error(ctx,
                   moe_plan_report_for(ctx, &d, layout(1, 3), &r),
                   MOE_ESHAPE, subs);
    desc_of(&d, 256, 384, 4, 0, "fp8-block-w8a8"); /* I = 384 over 2: rank 1 starts at 192, inside a 128 block */
    const char *subs8[] = {"TP rank 1's shard", "starts at column 192", NULL};
    tu_check_error(ctx, moe_plan_report_for(ctx, &d, layout(1, 2), &r),
                   MOE_EUNSUPPORTED, subs8);
    /* even shards pass */
    desc_of(&d, 64, 40, 4, 0, "int4-g32");
    assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 2), &r), MOE_OK);
    moe_ctx_free(ctx);
}

/* A table that runs a partial last panel on the scalar kernel (tail_ref) reports it as a
 * fallback: no memory (bytes -1), its share of the layer's FLOPs from the shapes. */
static void test_tail_fallback(void **state)
{
    (void)state;
    const char *isas[16];
    const size_t n = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (!tu_table_ok(tu_table(isas[i])))
            continue;
        moe_ctx *ctx = ctx_on(isas[i]);
        const int64_t H = 64, I = 100, E = 8, K = 2;
        moe_layer_desc d;
        desc_of(&d, H, I, E, 0, NULL);
        moe_rank_report r;
        assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r),
                         MOE_OK);
        const moe_cost *c = find_cost(&r, "fallback");
        if (c) { /* this table hands partial panels to the ref kernel */
            const double ex = 2.0 * K * 3.0 * H * I, all = ex + 2.0 * E * H;
            const double share = ex / all * (2.0 * (I % 16) * H + (H % 16) * I) / (3.0 * I * H);
            assert_true(c->bytes == -1.0);
            assert_true(c->flop_share > 0.999999 * share && c->flop_share < 1.000001 * share);
            /* compute, however small its share: never lowered to INFO (MOE_REPORT_SMALL_FRACTION is for memory) */
            assert_int_equal(c->level, MOE_LOG_WARN);
            seen++;
        }
        /* I a multiple of 16: no tail on any table */
        desc_of(&d, H, 96, E, 0, NULL);
        assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r),
                         MOE_OK);
        assert_null(find_cost(&r, "fallback"));
        moe_ctx_free(ctx);
    }
    print_message("tables reporting a partial-panel fallback: %d\n", seen);
}

/* Compute bf16's cost on each table (docs/numerics.md section 7; moe.h moe_compute): the ref
 * table's scalar emulation, a vector table without avx512_bf16 (the vfmadd form, about the f32
 * mode's speed), a format the table has no bf16 kernel for (the scalar entries): each a
 * "fallback" WARNING with the routed experts' share of the FLOPs, naming what is missing; none
 * on a table with vdpbf16ps and a bf16 kernel for the format; none in compute f32. */
static void test_bf16_costs(void **state)
{
    (void)state;
    const char *isas[16];
    const size_t n = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    static const struct {
        const char *quant; /* NULL: plain bf16 weights */
        moe_wfmt fmt;      /* the routed format under compute bf16 */
        const char *name;  /* as the message names it */
    } cases[] = {{NULL, MOE_WF_BF16P, "bf16"}, {"int8-channel", MOE_WF_I8, "int8-channel"}, {"int4-g32", MOE_WF_I4, "int4-g32"}};
    int checked = 0;
    for (size_t i = 0; i < n; i++) {
        const moe_kernels *k = tu_table(isas[i]);
        if (!tu_table_ok(k))
            continue;
        moe_ctx *ctx = ctx_on(isas[i]);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            moe_layer_desc d;
            desc_of(&d, 64, 96, 8, 0, cases[c].quant);
            moe_plan_config cfg;
            moe_plan_config_init(&cfg);
            moe_rank_report r;
            assert_int_equal(moe_plan_report_for(ctx, &d, &cfg, &r), MOE_OK);
            assert_null(find_cost(&r, "fallback"));
            cfg.compute = MOE_COMPUTE_BF16;
            assert_int_equal(moe_plan_report_for(ctx, &d, &cfg, &r), MOE_OK);
            const moe_cost *cost = find_cost(&r, "fallback");
            const int vector = k->native_bf16 >> cases[c].fmt & 1u, dp = (k->caps & MOE_CAP_AVX512_BF16) != 0;
            const char *want = NULL;
            if (strcmp(k->name, "ref") == 0)
                want = "the scalar emulation of vdpbf16ps";
            else if (!vector)
                want = "no bf16 kernel for";
            else if (!dp)
                want = "which has no avx512_bf16";
            if (!want) {
                if (cost)
                    fail_msg("table %s, %s: unexpected cost: %s", k->name, cases[c].name, cost->what);
            } else {
                if (!cost)
                    fail_msg("table %s, %s: no fallback cost (want \"%s\")", k->name, cases[c].name, want);
                if (!strstr(cost->what, want) || !strstr(cost->what, cases[c].name) || !strstr(cost->what, k->name))
                    fail_msg("table %s, %s: the cost says \"%s\", want \"%s\" and the names", k->name, cases[c].name,
                             cost->what, want);
                if (!vector && !dp && !strstr(cost->what, "no avx512_bf16"))
                    fail_msg("table %s: the cost does not name the missing avx512_bf16: %s", k->name, cost->what);
                assert_true(cost->bytes == -1.0);
                assert_true(cost->flop_share > 0.5 && cost->flop_share <= 1.0);
            }
            checked++;
        }
        moe_ctx_free(ctx);
    }
    print_message("%d table x format reports checked in compute bf16\n", checked);
}

/* compute_roof on every runnable table: "bf16" exactly where compute bf16's bf16 experts run
 * vdpbf16ps (a table with avx512_bf16 whose pair GEMM is not the avx512 row's vfmadd form: the
 * avx512_bf16 row keeps that form on CPUs where vdpbf16ps is slower, as its notes say), "vnni"
 * for int8-w8a8 on a table with the VNNI kernel, "fma" for everything else: compute f32,
 * compute bf16 on vfmadd pairs or the scalar emulation, and a weight-only format with no bf16
 * kernel (the scalar entries); int4 in compute bf16 "bf16" on the avx512_bf16 row's vdpbf16ps
 * kernel. */
static void test_compute_roof(void **state)
{
    (void)state;
    const char *isas[16];
    const size_t n = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    const moe_kernels *fma_form = tu_table("avx512"); /* the vfmadd form of the pair GEMM */
    int bf16_tables = 0;
    for (size_t i = 0; i < n; i++) {
        const moe_kernels *t = tu_table(isas[i]);
        if (!tu_table_ok(t))
            continue;
        moe_ctx *ctx = ctx_on(isas[i]);
        moe_plan_config bf = *layout(1, 1);
        bf.compute = MOE_COMPUTE_BF16;
        moe_layer_desc d;
        moe_rank_report r;
        desc_of(&d, 64, 96, 8, 32, NULL);
        assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r), MOE_OK);
        assert_string_equal(r.compute_roof, "fma");
        assert_int_equal(moe_plan_report_for(ctx, &d, &bf, &r), MOE_OK);
        const int vdp = (t->caps & MOE_CAP_AVX512_BF16) && tu_table_ok(fma_form) &&
                        t->bf16_rows[MOE_WF_BF16P] != fma_form->bf16_rows[MOE_WF_BF16P];
        if (vdp != (strstr(t->notes, "pair GEMM: vdpbf16ps") != NULL) && (t->caps & MOE_CAP_AVX512_BF16))
            fail_msg("table %s: its notes (\"%s\") and its pair GEMM disagree", t->name, t->notes);
        assert_string_equal(r.compute_roof, vdp ? "bf16" : "fma");
        bf16_tables += vdp;
        desc_of(&d, 64, 96, 8, 0, "int4-g32");
        assert_int_equal(moe_plan_report_for(ctx, &d, &bf, &r), MOE_OK);
        /* int4 runs vdpbf16ps exactly where the table has the avx512_bf16 int4 kernel */
        assert_string_equal(r.compute_roof,
                            t->bf16_rows[MOE_WF_I4] == moe_ukr_qbf16_i4_rows_avx512_bf16_6x64 ? "bf16" : "fma");
        desc_of(&d, 64, 96, 8, 0, "int8-w8a8");
        assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 1), &r), MOE_OK);
        assert_string_equal(r.compute_roof, (t->caps & MOE_CAP_VNNI) ? "vnni" : "fma");
        moe_ctx_free(ctx);
    }
    print_message("tables whose compute bf16 runs vdpbf16ps: %d\n", bf16_tables);
}

static void test_path_and_limits(void **state)
{
    (void)state;
    moe_ctx *ctx = ctx_on("auto");
    moe_layer_desc d;
    desc_of(&d, 64, 32, 64, 0, NULL);
    moe_plan *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    moe_plan_path path;
    assert_int_equal(moe_plan_path_for(p, 1, &path), MOE_OK); /* 2 rows over 64 experts */
    assert_string_equal(path.experts_path, "few-token streaming");
    assert_int_equal(path.chunks, 1);
    assert_int_equal(path.workspace_bytes, moe_plan_workspace_size(p, 1));
    assert_int_equal(moe_plan_path_for(p, 4096, &path), MOE_OK);
    assert_string_equal(path.experts_path, "tiled GEMM");
    assert_int_equal(moe_plan_path_for(p, 0, &path), MOE_EINVAL);
    assert_int_equal(moe_plan_path_for(p, 1, NULL), MOE_EINVAL);
    moe_plan_free(p);
    /* 2^21 ranks: refused before any work */
    desc_of(&d, 64, 512, 8192, 0, NULL);
    moe_rank_report r;
    const char *subs[] = {"ep_size * tp_size", NULL};
    tu_check_error(ctx, moe_plan_report_for(ctx, &d, layout(8192, 256), &r),
                   MOE_EINVAL, subs);
    moe_ctx_free(ctx);
}

/* A memory cost under MOE_REPORT_SMALL_FRACTION (1%) of the expert bytes on the rank holding
 * the fewest is INFO, at or above it WARNING, and a fallback kernel is always WARNING. The
 * router [E, H] f32 replicated at TP 2 is 4 * 8 * 64 = 2048 bytes; each rank holds
 * E * 3 * H * (I / 2) * 2 bytes of bf16 experts: I = 132 gives 202752 (2048 is 1.01%, WARNING),
 * I = 136 gives 208896 (0.98%, INFO). A fallback kernel stays WARNING (test_tail_fallback). */
static void test_small_costs_are_info(void **state)
{
    (void)state;
    moe_ctx *ctx = ctx_on("auto");
    const int64_t H = 64, E = 8;
    static const struct {
        int64_t I;
        int level;
    } cases[] = {{132, MOE_LOG_WARN}, {136, MOE_LOG_INFO}, {4096, MOE_LOG_INFO}, {16, MOE_LOG_WARN}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        moe_layer_desc d;
        desc_of(&d, H, cases[c].I, E, 0, NULL);
        moe_rank_report r;
        assert_int_equal(moe_plan_report_for(ctx, &d, layout(1, 2), &r), MOE_OK);
        const double rank_bytes = (double)(E * 3 * H * (cases[c].I / 2) * 2);
        assert_true((double)(r.code_bytes + r.scale_bytes + r.shared_bytes) == rank_bytes);
        const moe_cost *router = find_cost(&r, "replicated");
        assert_non_null(router);
        assert_true(router->bytes == 4.0 * (double)(E * H));
        /* the rule, from the bytes: and so the side of the threshold each case is on */
        const int want = router->bytes < MOE_REPORT_SMALL_FRACTION * rank_bytes ? MOE_LOG_INFO : MOE_LOG_WARN;
        assert_int_equal(want, cases[c].level);
        if (router->level != want)
            fail_msg("I %lld: router %.0f B beside %.0f B of experts per rank: level %d, want %d", (long long)cases[c].I,
                     router->bytes, rank_bytes, router->level, want);
    }
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes_match_the_builder), cmocka_unit_test(test_padding),
        cmocka_unit_test(test_tp_shard_refusals),       cmocka_unit_test(test_tail_fallback),
        cmocka_unit_test(test_path_and_limits),         cmocka_unit_test(test_bf16_costs),
        cmocka_unit_test(test_compute_roof),            cmocka_unit_test(test_small_costs_are_info),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
