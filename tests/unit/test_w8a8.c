/* int8 w8a8 kernels and driver (docs/numerics.md section 5):
 *  - the row quantizer (kernel table entry quant_row[MOE_WF_W8A8]) of every table against the
 *    rule of moe.h as quant/quant.h writes it (moe_qact_i8_scale, moe_qact_i8), on row lengths
 *    around the 16-lane vectors, with NaN, +-inf, -0, subnormals, FLT_MAX and exact .5 ties;
 *    in place and with a multiplier (apply_router_weight_on_input);
 *  - the GEMM on quantized rows (linear_rows[MOE_WF_W8A8]) and linear[MOE_WF_W8A8] on f32
 *    rows, every table, against an independent int64 computation of the formula and bit for
 *    bit against the scalar (ref) linear[MOE_WF_W8A8], for row counts not multiple of 6,
 *    partial panels, K % 4 != 0, panel sub-ranges, K = 65536 at the extremes (the int32 limit
 *    of moe.h);
 *  - the whole layer: the grouped driver's quantize-once path against the per-item path (a
 *    table without linear_rows[MOE_WF_W8A8]) bit for bit, standard and batched formats,
 *    several chunks, apply_router_weight_on_input, 1 and 2 threads, NaN and inf tokens. */
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
#include "core/internal.h"
#include "gemm/kernels.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

/* The kernel registry's rows (tu_tables, filled by main), NULL where this CPU cannot run one. */
static const moe_kernels *tables[16];
static size_t n_tables;

/* The W8A8 entries of table k in the shape the checks below use: the row quantizer returning
 * the row's scale, and the GEMM on quantized rows with one scale per row. */
static float quant_row_i8(const moe_kernels *k, const float *x, int64_t n, const float *mul, uint8_t *dst)
{
    float s = 0.0f;
    k->quant_row[MOE_WF_W8A8](x, n, n, mul, dst, &s);
    return s;
}

static void linear_w8a8(const moe_kernels *k, const moe_pmat *w, int64_t p0, int64_t p1, const uint8_t *const *xq,
                        const float *sx, int mb, float *out, int64_t ldo, const void *pf, int64_t pf_bytes)
{
    const float **xs = malloc(sizeof(float *) * (size_t)mb); /* [mb] pointers to each row's scale */
    assert_non_null(xs);
    for (int m = 0; m < mb; m++)
        xs[m] = &sx[m];
    k->linear_rows[MOE_WF_W8A8](w, p0, p1, xq, xs, mb, out, ldo, pf, pf_bytes);
    free(xs);
}


/* ---- the row quantizer ---- */

/* Expected codes of v[0 .. n) by the rule (quant/quant.h), padded with 128 to n4. */
static float rule_codes(const float *v, int64_t n, uint8_t *q)
{
    const float s = moe_qact_i8_scale(v, n);
    int64_t k = 0;
    for (; k < n; k++)
        q[k] = (uint8_t)(moe_qact_i8(v[k], s) + 128);
    for (; k % 4; k++)
        q[k] = 128;
    return s;
}

static void check_row(const float *x, int64_t n, const char *what)
{
    const int64_t n4 = (n + 3) / 4 * 4;
    uint8_t *want = malloc((size_t)n4), *got = malloc((size_t)n4);
    float *v = malloc(sizeof(float) * (size_t)n), *buf = malloc(sizeof(float) * (size_t)(n + 1));
    const float mul = -0.37f;
    for (size_t t = 0; t < n_tables; t++) {
        if (!tu_table_ok(tables[t]))
            continue;
        /* plain */
        float sw = rule_codes(x, n, want);
        memset(got, 0xee, (size_t)n4);
        float sg = quant_row_i8(tables[t], x, n, NULL, got);
        if (tu_f32_bits(sg) != tu_f32_bits(sw) || memcmp(got, want, (size_t)n4) != 0)
            fail_msg("quant_row %s n=%lld (%s): scale %a vs %a or codes differ", tables[t]->name, (long long)n,
                     what, (double)sg, (double)sw);
        /* in place: the codes over the row's own floats */
        memcpy(buf, x, sizeof(float) * (size_t)n);
        sg = quant_row_i8(tables[t], buf, n, NULL, (uint8_t *)buf);
        if (tu_f32_bits(sg) != tu_f32_bits(sw) || memcmp(buf, want, (size_t)n4) != 0)
            fail_msg("quant_row %s n=%lld (%s) in place differs", tables[t]->name, (long long)n, what);
        /* with a multiplier: the rule on the rounded products */
        for (int64_t k = 0; k < n; k++)
            v[k] = mul * x[k];
        sw = rule_codes(v, n, want);
        sg = quant_row_i8(tables[t], x, n, &mul, got);
        if (tu_f32_bits(sg) != tu_f32_bits(sw) || memcmp(got, want, (size_t)n4) != 0)
            fail_msg("quant_row %s n=%lld (%s) with multiplier differs", tables[t]->name, (long long)n, what);
    }
    free(want), free(got), free(v), free(buf);
}

static void test_quant_row(void **state)
{
    (void)state;
    /* hand-checked points of the rule: absmax 127 -> s = 1; ties to even; NaN -> -127 */
    {
        const float x[6] = {127.0f, 2.5f, 3.5f, -2.5f, NAN, -0.0f};
        uint8_t q[8];
        for (size_t t = 0; t < n_tables; t++) {
            if (!tu_table_ok(tables[t]))
                continue;
            assert_true(quant_row_i8(tables[t], x, 6, NULL, q) == 1.0f);
            const int want[8] = {127, 2, 4, -2, -127, 0, 0, 0};
            for (int k = 0; k < 8; k++)
                assert_int_equal((int)q[k] - 128, want[k]);
        }
    }
    const int64_t lens[] = {1, 2, 3, 4, 5, 15, 16, 17, 31, 32, 33, 100, 1027};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        float *x = malloc(sizeof(float) * (size_t)n);
        for (int c = 0; c < 9; c++) {
            tu_fill_uniform(x, (size_t)n, 100 + (uint64_t)(n * 10 + c), -3.0f, 3.0f);
            const char *what = "uniform";
            switch (c) {
            case 1: memset(x, 0, sizeof(float) * (size_t)n), what = "all zero (R14)"; break;
            case 2: x[n / 2] = NAN, what = "one NaN"; break;
            case 3: x[n - 1] = INFINITY, what = "+inf"; break;
            case 4: x[0] = -INFINITY, x[n - 1] = NAN, what = "-inf and NaN"; break;
            case 5:
                for (int64_t k = 0; k < n; k++)
                    x[k] = (k % 3) ? 1e-40f * (float)(k % 7) : -0.0f; /* subnormals and -0 */
                what = "subnormals";
                break;
            case 6: x[n / 3] = FLT_MAX, x[0] = -FLT_MAX, what = "FLT_MAX"; break;
            case 7:
                for (int64_t k = 0; k < n; k++)
                    x[k] = NAN;
                what = "all NaN";
                break;
            case 8: /* exact ties: absmax 127 gives s = 1, elements k + 0.5 */
                for (int64_t k = 0; k < n; k++)
                    x[k] = (float)((k % 40) - 20) + 0.5f;
                x[0] = 127.0f;
                what = "ties";
                break;
            default: break;
            }
            check_row(x, n, what);
        }
        free(x);
    }
}

/* ---- the GEMM ---- */

typedef struct qmatrix {
    int64_t N, K;
    int8_t *w;        /* [N, K] codes, row-major */
    float *sw;        /* [N] */
    uint8_t *packed;  /* moe_quant_pack output */
    float *dscale;
    int32_t *comp;
    struct moe_qmat q;
    moe_pmat pm;
} qmatrix;

static void qmatrix_init(qmatrix *m, int64_t N, int64_t K, int extreme, uint64_t seed)
{
    moe_qweight qw = {.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_CHANNEL};
    m->N = N, m->K = K;
    m->w = malloc((size_t)(N * K));
    m->sw = malloc(sizeof(float) * (size_t)N);
    uint64_t r = seed;
    for (int64_t i = 0; i < N * K; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        m->w[i] = extreme ? (int8_t)(i % 2 ? -128 : 127) : (int8_t)((int)(r >> 56) - 128);
    }
    if (extreme == 2)
        memset(m->w, 0x80, (size_t)(N * K)); /* every weight -128 */
    tu_fill_uniform(m->sw, (size_t)N, seed + 1, 1e-3f, 2e-2f);
    const int kind = moe_quant_kind(&qw, MOE_QACT_TOKEN);
    assert_int_equal(kind, MOE_WF_W8A8);
    m->packed = aligned_alloc(64, (moe_quant_packed_bytes(kind, N, K) + 63) / 64 * 64);
    m->dscale = malloc(sizeof(float) * (size_t)N);
    m->comp = malloc(sizeof(int32_t) * (size_t)N);
    moe_quant_pack(&qw, MOE_QACT_TOKEN, m->w, m->sw, NULL, N, K, m->packed, m->dscale, NULL, m->comp);
    m->q = (struct moe_qmat){.kind = kind, .gk = K, .ng = 1, .scale = m->dscale, .zero = NULL, .comp = m->comp};
    m->pm = (moe_pmat){.data = m->packed, .dtype = MOE_DTYPE_F32, .n = N, .k = K, .q = &m->q};
}

static void qmatrix_free(qmatrix *m)
{
    free(m->w), free(m->sw), free(m->packed), free(m->dscale), free(m->comp);
}

/* x: mb rows of K floats; panels [p0, p1). Every table's linear[W8A8] and quant_row[W8A8] +
 * linear_rows[W8A8] against the independent int64 formula (finite scales) and each other. */
static void check_gemm(const qmatrix *m, const float *x, int mb, int64_t p0, int64_t p1)
{
    const int64_t K = m->K, K4 = (K + 3) / 4 * 4;
    const int64_t n0 = p0 * 16, n1 = p1 * 16 < m->N ? p1 * 16 : m->N, nn = n1 - n0, ldo = nn + 3;
    const float **xr = malloc(sizeof(float *) * (size_t)mb);
    const uint8_t **xq = malloc(sizeof(uint8_t *) * (size_t)mb);
    uint8_t *codes = malloc((size_t)(mb * K4));
    float *sx = malloc(sizeof(float) * (size_t)mb);
    float *want = malloc(sizeof(float) * (size_t)(mb * ldo)), *got = malloc(sizeof(float) * (size_t)(mb * ldo));
    /* independent: the rule per row, int64 sums, ((float)acc * s_x) * s_w */
    for (int m2 = 0; m2 < mb; m2++) {
        xr[m2] = x + m2 * K;
        const float s = moe_qact_i8_scale(xr[m2], K);
        for (int64_t n = n0; n < n1; n++) {
            int64_t acc = 0;
            for (int64_t k = 0; k < K; k++)
                acc += (int64_t)moe_qact_i8(xr[m2][k], s) * m->w[n * K + k];
            assert_true(acc >= INT32_MIN && acc <= INT32_MAX);
            want[m2 * ldo + (n - n0)] = ((float)acc * s) * m->sw[n];
        }
    }
    for (size_t t = 0; t < n_tables; t++) {
        if (!tu_table_ok(tables[t]))
            continue;
        for (int path = 0; path < 2; path++) {
            memset(got, 0, sizeof(float) * (size_t)(mb * ldo));
            if (path == 0) {
                moe_linear(tables[t], &m->pm, p0, p1, xr, mb, got, ldo);
            } else {
                for (int m2 = 0; m2 < mb; m2++) {
                    sx[m2] = quant_row_i8(tables[t], xr[m2], K, NULL, codes + m2 * K4);
                    xq[m2] = codes + m2 * K4;
                }
                /* prefetch hint: the matrix itself (must not change anything) */
                linear_w8a8(tables[t], &m->pm, p0, p1, xq, sx, mb, got, ldo, m->packed, m->N * K4);
            }
            for (int m2 = 0; m2 < mb; m2++)
                for (int64_t n = 0; n < nn; n++) {
                    const float w = want[m2 * ldo + n], g = got[m2 * ldo + n];
                    if (tu_f32_bits(w) != tu_f32_bits(g) && !(isnan(w) && isnan(g)))
                        fail_msg("%s %s N=%lld K=%lld mb=%d panels [%lld,%lld): row %d col %lld: %a vs %a",
                                 tables[t]->name, path ? "linear_rows[W8A8]" : "linear[W8A8]", (long long)m->N,
                                 (long long)K, mb, (long long)p0, (long long)p1, m2, (long long)(n0 + n),
                                 (double)g, (double)w);
                }
        }
    }
    free(xr), free(xq), free(codes), free(sx), free(want), free(got);
}

static void test_gemm_shapes(void **state)
{
    (void)state;
    /* N: full and partial panels (18: a 2-wide last panel; 100: 4); K % 4 = 0..3 */
    const int64_t shapes[][2] = {{16, 4}, {18, 5}, {7, 1}, {33, 3}, {64, 130}, {80, 2048}, {100, 1027}, {200, 66}};
    const int mbs[] = {1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 47, 48, 50};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        qmatrix m;
        qmatrix_init(&m, shapes[s][0], shapes[s][1], 0, 900 + s);
        const int64_t K = m.K, np = moe_pmat_panels(m.N);
        float *x = malloc(sizeof(float) * (size_t)(50 * K));
        tu_fill_uniform(x, (size_t)(50 * K), 31 + s, -2.0f, 2.0f);
        memset(x + 3 * K, 0, sizeof(float) * (size_t)K); /* row 3: all zero, output exactly 0 */
        x[7 * K + K / 2] = NAN;                          /* row 7: a NaN element (-127) */
        for (size_t i = 0; i < sizeof mbs / sizeof mbs[0]; i++) {
            if (K > 1000 && mbs[i] > 13 && mbs[i] != 48)
                continue; /* keep the scalar oracle cheap */
            check_gemm(&m, x, mbs[i], 0, np);
            if (np > 2)
                check_gemm(&m, x, mbs[i], 1, np - 1); /* a panel sub-range */
            if (np > 5)
                check_gemm(&m, x, mbs[i], 5, np); /* more than 4 panels, ending partial */
        }
        free(x);
        qmatrix_free(&m);
    }
}

/* K = 65536, the largest moe.h allows: the extreme sums stay exact. */
static void test_gemm_int32_limit(void **state)
{
    (void)state;
    const int64_t K = 65536;
    for (int ext = 1; ext <= 2; ext++) {
        qmatrix m;
        qmatrix_init(&m, 16, K, ext, 77);
        float *x = malloc(sizeof(float) * (size_t)(2 * K));
        for (int64_t k = 0; k < K; k++) {
            x[k] = 1.0f;                           /* q = 127 everywhere: u8 255 */
            x[K + k] = (k % 2) ? -1.0f : 1.0f;     /* +-127 */
        }
        check_gemm(&m, x, 2, 0, 1);
        free(x);
        qmatrix_free(&m);
    }
}

/* ---- the whole layer: quantize-once driver vs the per-item path ---- */

typedef struct wlayer {
    moe_layer_desc desc;
    float *router;            /* [E, H] */
    int8_t **codes;           /* E*3 */
    float **scales;           /* E*3 */
} wlayer;

static void wlayer_init(wlayer *L, int64_t H, int64_t I, int64_t E, int64_t K, int on_input, uint64_t seed)
{
    moe_layer_desc_init(&L->desc);
    L->desc.hidden_size = H;
    L->desc.moe_intermediate_size = I;
    L->desc.num_experts = E;
    L->desc.top_k = K;
    L->desc.renormalize = 1;
    L->desc.weight_dtype = MOE_DTYPE_F32;
    L->desc.apply_router_weight_on_input = on_input;
    assert_int_equal(moe_quant_from_name("int8-w8a8", &L->desc.quant), MOE_OK);
    L->router = malloc(sizeof(float) * (size_t)(E * H));
    tu_fill_uniform(L->router, (size_t)(E * H), seed, -0.3f, 0.3f);
    L->codes = calloc((size_t)(3 * E), sizeof(int8_t *));
    L->scales = calloc((size_t)(3 * E), sizeof(float *));
    for (int64_t i = 0; i < 3 * E; i++) {
        const int64_t N = i % 3 == 2 ? H : I, Kd = i % 3 == 2 ? I : H;
        float *f = malloc(sizeof(float) * (size_t)(N * Kd));
        const float a = 1.0f / sqrtf((float)Kd);
        tu_fill_uniform(f, (size_t)(N * Kd), seed + 5 + (uint64_t)i, -a, a);
        size_t cb, sb, zb;
        moe_quant_source_sizes(&L->desc.quant.w13, N, Kd, &cb, &sb, &zb);
        L->codes[i] = malloc(cb);
        L->scales[i] = malloc(sb);
        assert_int_equal(moe_quant_quantize_source(&L->desc.quant.w13, f, N, Kd, L->codes[i], L->scales[i], NULL),
                         0);
        free(f);
    }
}

static void wlayer_free(wlayer *L)
{
    for (int64_t i = 0; i < 3 * L->desc.num_experts; i++)
        free(L->codes[i]), free(L->scales[i]);
    free(L->codes), free(L->scales), free(L->router);
}

/* table: the ctx's kernels replaced by it (a copy without linear_rows[W8A8] runs the per-item path). */
static void run_layer(const wlayer *L, const moe_kernels *table, int threads, int batched, int64_t chunk,
                      const float *x, int64_t T, float *out)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = "ref";
    o.num_threads = threads;
    o.chunk_size = chunk;
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    ctx->kernels = table;
    const int64_t E = L->desc.num_experts;
    const void **p[3], **s[3];
    for (int j = 0; j < 3; j++) {
        p[j] = calloc((size_t)E, sizeof(void *));
        s[j] = calloc((size_t)E, sizeof(void *));
        for (int64_t e = 0; e < E; e++)
            p[j][e] = L->codes[3 * e + j], s[j][e] = L->scales[3 * e + j];
    }
    moe_weight_source src = {.router = L->router, .router_dtype = MOE_DTYPE_F32, .gate_proj = p[0],
                             .up_proj = p[1], .down_proj = p[2], .gate_scale = s[0], .up_scale = s[1],
                             .down_scale = s[2]};
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    if (batched) {
        cfg.prepare_finalize = MOE_PF_LOCAL_BATCHED;
        cfg.experts = MOE_EXPERTS_BATCHED;
        cfg.batched_capacity = 8;
    }
    tu_run_layer(ctx, &L->desc, &cfg, &src, x, T, out);
    moe_ctx_free(ctx);
    for (int j = 0; j < 3; j++)
        free(p[j]), free(s[j]);
}

static void test_layer_quantize_once(void **state)
{
    (void)state;
    /* {H, I}: partial panels, H % 4 != 0, I % 4 != 0; I = 1 takes the per-item path (no room
     * for the in-place h codes) and must agree too */
    const int64_t sizes[][2] = {{130, 18}, {64, 80}, {37, 1}, {2, 5}};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t H = sizes[si][0], I = sizes[si][1], E = 6, K = 2, T = 47;
        for (int on_input = 0; on_input <= 1; on_input++) {
            wlayer L;
            wlayer_init(&L, H, I, E, K, on_input, 4242 + si);
            float *x = malloc(sizeof(float) * (size_t)(T * H));
            tu_fill_uniform(x, (size_t)(T * H), 5 + si, -1.0f, 1.0f);
            memset(x + 4 * H, 0, sizeof(float) * (size_t)H); /* token 4: zero (R14) */
            x[9 * H + H / 2] = NAN;                          /* token 9: a NaN element */
            x[11 * H] = INFINITY;                            /* token 11: +inf */
            float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H));
            for (size_t t = 0; t < n_tables; t++) {
                if (!tu_table_ok(tables[t]))
                    continue;
                moe_kernels per_item = *tables[t];
                per_item.linear_rows[MOE_WF_W8A8] = NULL;
                per_item.quant_row[MOE_WF_W8A8] = NULL;
                for (int batched = 0; batched <= 1; batched++)
                    for (int64_t chunk = 16; chunk <= 64; chunk += 48) { /* 3 chunks, then 1 */
                        run_layer(&L, &per_item, 1, batched, chunk, x, T, want);
                        for (int th = 1; th <= 2; th++) {
                            run_layer(&L, tables[t], th, batched, chunk, x, T, got);
                            if (!tu_same_bits(got, want, (size_t)(T * H)))
                                fail_msg("layer H=%lld I=%lld on_input %d %s batched %d chunk %lld threads %d: "
                                         "quantize-once differs from the per-item path",
                                         (long long)H, (long long)I, on_input, tables[t]->name, batched,
                                         (long long)chunk, th);
                        }
                    }
                for (int64_t h = 0; h < H; h++)
                    assert_true(want[4 * H + h] == 0.0f);
            }
            free(x), free(want), free(got);
            wlayer_free(&L);
        }
    }
}

int main(void)
{
    n_tables = tu_tables(tables, sizeof tables / sizeof tables[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quant_row),
        cmocka_unit_test(test_gemm_shapes),
        cmocka_unit_test(test_gemm_int32_limit),
        cmocka_unit_test(test_layer_quantize_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
