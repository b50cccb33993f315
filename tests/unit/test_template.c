/* The template kernel folder (src/gemm/template, docs/adding-an-isa.md) is a correct starting
 * point: a table built the way the registry builds one (the reference entries, then the row's
 * init) gives the ref's bits, kernel by kernel (f32 / bf16 / f16 weights, partial panels, odd K,
 * panel sub-ranges, 1..9 rows, untouched memory around the call) and through whole layers
 * (standard and batched formats, a gated shared expert, odd widths, several chunks). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "gemm/template/template.h"
#include "quant/convert.h"
#include "quant/pack.h"
#include "testutil.h"

static moe_kernels table; /* ref entries + the template's */

static void build_table(void)
{
    moe_kernels_init_ref(&table);
    moe_kernels_init_template(&table, moe_cpu_features_get());
    table.name = "template";
}

/* W [N, K] in dtype dt, packed, against the ref kernel for every row count and panel range. */
static void check_kernel(moe_dtype dt, int64_t N, int64_t K, uint64_t seed)
{
    const size_t es = moe_dtype_size(dt);
    float *wf = malloc(sizeof(float) * (size_t)(N * K));
    unsigned char *w = malloc((size_t)(N * K) * es), *packed = malloc((size_t)(N * K) * es);
    tu_fill_uniform(wf, (size_t)(N * K), seed, -1.0f, 1.0f);
    for (int64_t i = 0; i < N * K; i++) {
        if (dt == MOE_DTYPE_F32)
            memcpy(w + 4 * i, &wf[i], 4);
        else {
            const uint16_t h = dt == MOE_DTYPE_BF16 ? moe_f32_to_bf16(wf[i]) : moe_f32_to_f16(wf[i]);
            memcpy(w + 2 * i, &h, 2);
        }
    }
    moe_pack_panels(packed, w, dt, N, K);
    const moe_pmat pm = {.data = packed, .dtype = dt, .n = N, .k = K, .q = NULL};
    enum { MB = 9 };
    float *xb = malloc(sizeof(float) * (size_t)(MB * K));
    tu_fill_uniform(xb, (size_t)(MB * K), seed + 1, -2.0f, 2.0f);
    const float *x[MB];
    for (int m = 0; m < MB; m++)
        x[m] = xb + m * K;
    const int64_t P = moe_pmat_panels(N), ldo = P * MOE_PANEL + 5;
    float *want = malloc(sizeof(float) * (size_t)(MB * ldo)), *got = malloc(sizeof(float) * (size_t)(MB * ldo));
    const moe_kernels *ref = tu_table("ref");
    const int64_t ranges[3][2] = {{0, P}, {P > 1 ? 1 : 0, P}, {0, P > 1 ? P - 1 : P}};
    for (int r = 0; r < 3; r++)
        for (int mb = 1; mb <= MB; mb++) {
            for (int64_t i = 0; i < MB * ldo; i++)
                want[i] = got[i] = -777.0f; /* sentinels: what the call must not write stays */
            moe_linear(ref, &pm, ranges[r][0], ranges[r][1], x, mb, want, ldo);
            moe_linear(&table, &pm, ranges[r][0], ranges[r][1], x, mb, got, ldo);
            if (!tu_same_bits(got, want, (size_t)(MB * ldo)))
                fail_msg("template %s N=%lld K=%lld panels [%lld, %lld) mb=%d differs from the ref",
                         moe_dtype_name(dt), (long long)N, (long long)K, (long long)ranges[r][0],
                         (long long)ranges[r][1], mb);
        }
    free(wf), free(w), free(packed), free(xb), free(want), free(got);
}

static void test_kernels_match_ref(void **state)
{
    (void)state;
    const moe_dtype dts[] = {MOE_DTYPE_F32, MOE_DTYPE_BF16, MOE_DTYPE_F16};
    const int64_t shapes[][2] = {{16, 8}, {17, 33}, {48, 1}, {100, 65}, {5, 7}};
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_kernel(dts[d], shapes[s][0], shapes[s][1], 31 * d + s);
}

/* A layer through the ref table and through the template table (injected into a ref ctx, as
 * the registry would hand it): the same bits. */
static void run(const moe_kernels *k, const moe_layer_desc *d, const moe_plan_config *cfg,
                const moe_weight_source *src, const float *x, int64_t T, float *out)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = "ref";
    o.num_threads = 2;
    o.chunk_size = 16;
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    if (k)
        ctx->kernels = k;
    tu_run_layer(ctx, d, cfg, src, x, T, out);
    moe_ctx_free(ctx);
}

static void test_layer_matches_ref(void **state)
{
    (void)state;
    const int64_t H = 33, I = 50, E = 6, K = 2, Is = 20, T = 41;
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = H, d.moe_intermediate_size = I, d.num_experts = E, d.top_k = K;
    d.renormalize = 1, d.weight_dtype = MOE_DTYPE_BF16;
    d.shared_expert_intermediate_size = Is, d.shared_expert_gated = 1;
    float *f = malloc(sizeof(float) * (size_t)(3 * E * I * H + 3 * Is * H + E * H + H));
    const size_t nf = (size_t)(3 * E * I * H + 3 * Is * H);
    tu_fill_uniform(f, nf + (size_t)(E * H + H), 9, -0.3f, 0.3f);
    uint16_t *b = malloc(sizeof(uint16_t) * nf); /* every expert matrix, then the shared expert, bf16 */
    for (size_t i = 0; i < nf; i++)
        b[i] = moe_f32_to_bf16(f[i]);
    const void *g[6], *u[6], *dn[6];
    for (int64_t e = 0; e < E; e++) {
        g[e] = b + (size_t)(3 * e) * (size_t)(I * H);
        u[e] = b + (size_t)(3 * e + 1) * (size_t)(I * H);
        dn[e] = b + (size_t)(3 * e + 2) * (size_t)(I * H);
    }
    const uint16_t *sh = b + (size_t)(3 * E * I * H);
    moe_weight_source src = {.router = f + nf, .router_dtype = MOE_DTYPE_F32, .gate_proj = g, .up_proj = u,
                             .down_proj = dn, .shared_gate_proj = sh, .shared_up_proj = sh + Is * H,
                             .shared_down_proj = sh + 2 * Is * H, .shared_expert_gate = f + nf + E * H};
    float *x = malloc(sizeof(float) * (size_t)(T * H));
    float *want = malloc(sizeof(float) * (size_t)(T * H)), *got = malloc(sizeof(float) * (size_t)(T * H));
    tu_fill_uniform(x, (size_t)(T * H), 77, -1.0f, 1.0f);
    for (int batched = 0; batched <= 1; batched++) {
        moe_plan_config cfg;
        moe_plan_config_init(&cfg);
        if (batched) {
            cfg.prepare_finalize = MOE_PF_LOCAL_BATCHED;
            cfg.experts = MOE_EXPERTS_BATCHED;
            cfg.batched_capacity = 12;
        }
        run(NULL, &d, &cfg, &src, x, T, want);
        run(&table, &d, &cfg, &src, x, T, got);
        if (!tu_same_bits(got, want, (size_t)(T * H)))
            fail_msg("template table layer (batched %d) differs from the ref table", batched);
    }
    free(f), free(b), free(x), free(want), free(got);
}

int main(void)
{
    build_table();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_match_ref),
        cmocka_unit_test(test_layer_matches_ref),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
