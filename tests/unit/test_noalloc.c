/* moe.h promises that moe_plan_execute never allocates. This test binary interposes malloc,
 * calloc, realloc, aligned_alloc, posix_memalign and memalign (forwarding to glibc's
 * __libc_* entries) and counts the calls made while an execute runs, after one warm-up execute
 * of the same shape (OpenMP creates its thread pool and work-share structures on first use).
 * Layers: plain bf16 / f16 / f32 experts, every quantization scheme (the quantized-activation
 * ones on their quantize-once path and, with I = 1 or H = 1, on the per-work-item path), shared
 * experts, biases, the Llama-4 weight-on-input mode, bf16 hidden states, several chunks, the
 * standard and batched formats; on every kernel table this CPU runs. Skipped under
 * AddressSanitizer, which owns the allocator. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <malloc.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define NOALLOC_SANITIZED 1
#else
#define NOALLOC_SANITIZED 0
#endif

#if !NOALLOC_SANITIZED
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_int counting; /* 1 while an execute under test runs */
static atomic_long calls;   /* allocations seen while counting */

static void seen(void)
{
    if (atomic_load(&counting))
        atomic_fetch_add(&calls, 1);
}

void *malloc(size_t n)
{
    seen();
    return __libc_malloc(n);
}

void *calloc(size_t a, size_t b)
{
    seen();
    return __libc_calloc(a, b);
}

void *realloc(void *p, size_t n)
{
    seen();
    return __libc_realloc(p, n);
}

void *aligned_alloc(size_t al, size_t n)
{
    seen();
    return __libc_memalign(al, n);
}

void *memalign(size_t al, size_t n)
{
    seen();
    return __libc_memalign(al, n);
}

int posix_memalign(void **out, size_t al, size_t n)
{
    seen();
    void *p = __libc_memalign(al, n);
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

void free(void *p)
{
    __libc_free(p);
}
#endif

typedef struct layer_case {
    const char *name;
    int64_t H, I, E, K, Is;
    const char *quant;  /* scheme name, or NULL: plain weights of dt */
    moe_dtype dt;
    int on_input, biases, batched;
} layer_case;

static void fill(float *x, size_t n, uint64_t seed, float amp)
{
    tu_fill_uniform(x, n, seed, -amp, amp);
}

/* One case on one table: warm up, then count the allocations of a second execute. */
static long allocations(const layer_case *c, const char *isa)
{
    moe_options o;
    moe_options_init(&o);
    o.isa = isa;
    o.num_threads = 2;
    o.chunk_size = 24; /* T = 53 runs three chunks */
    o.log_level = MOE_LOG_ERROR;
    moe_ctx *ctx = NULL;
    char err[256];
    assert_int_equal(moe_ctx_create(&o, &ctx, err, sizeof err), MOE_OK);
    moe_layer_desc d;
    moe_layer_desc_init(&d);
    d.hidden_size = c->H;
    d.moe_intermediate_size = c->I;
    d.num_experts = c->E;
    d.top_k = c->K;
    d.renormalize = 1;
    d.weight_dtype = c->dt;
    d.shared_expert_intermediate_size = c->Is;
    d.shared_expert_gated = c->Is > 0;
    d.apply_router_weight_on_input = c->on_input;
    if (c->on_input)
        d.scoring_func = MOE_SCORING_TOPK_SIGMOID;
    d.has_expert_bias = c->biases;
    d.has_router_bias = c->biases;
    if (c->quant)
        assert_int_equal(moe_quant_from_name(c->quant, &d.quant), MOE_OK);
    const int64_t H = c->H, I = c->I, E = c->E;
    const size_t es = moe_dtype_size(c->dt);
    /* weights: [E][3] matrices (codes + scales when quantized), router [E, H] f32 */
    void **mats = calloc((size_t)(3 * E), sizeof(void *)), **scales = calloc((size_t)(3 * E), sizeof(void *));
    uint8_t **zeros = calloc((size_t)(3 * E), sizeof(uint8_t *));
    float *router = malloc(sizeof(float) * (size_t)(E * H)), *wf = malloc(sizeof(float) * (size_t)(I * H));
    float *bias = malloc(sizeof(float) * (size_t)(2 * I + H + E));
    fill(router, (size_t)(E * H), 1, 0.5f);
    fill(bias, (size_t)(2 * I + H + E), 2, 0.1f);
    for (int64_t i = 0; i < 3 * E; i++) {
        const int mat = (int)(i % 3);
        const int64_t N = mat == 2 ? H : I, K = mat == 2 ? I : H;
        fill(wf, (size_t)(N * K), 10 + (uint64_t)i, 0.2f);
        if (c->quant) {
            const moe_qweight *qw = mat == 2 ? &d.quant.w2 : &d.quant.w13;
            size_t cb, sb, zb;
            assert_int_equal(moe_quantize_matrix_sizes(qw, N, K, &cb, &sb, &zb), MOE_OK);
            mats[i] = malloc(cb);
            scales[i] = malloc(sb);
            zeros[i] = zb ? malloc(zb) : NULL;
            assert_int_equal(moe_quantize_matrix(qw, wf, N, K, mats[i], scales[i], zeros[i]), MOE_OK);
        } else {
            mats[i] = malloc((size_t)(N * K) * es);
            for (int64_t j = 0; j < N * K; j++) {
                if (c->dt == MOE_DTYPE_F32)
                    memcpy((char *)mats[i] + j * 4, &wf[j], 4);
                else {
                    uint16_t h = 0; /* bf16 / f16 bits of a value both hold exactly: a multiple of 2^-10 */
                    const float v = nearbyintf(wf[j] * 1024.0f) / 1024.0f;
                    uint32_t u;
                    memcpy(&u, &v, 4);
                    if (c->dt == MOE_DTYPE_BF16)
                        h = (uint16_t)(u >> 16);
                    else {
                        _Float16 f = (_Float16)v;
                        memcpy(&h, &f, 2);
                    }
                    memcpy((char *)mats[i] + j * 2, &h, 2);
                }
            }
        }
    }
    const void **g = calloc((size_t)E, sizeof(void *)), **u = calloc((size_t)E, sizeof(void *));
    const void **dn = calloc((size_t)E, sizeof(void *)), **gs = calloc((size_t)E, sizeof(void *));
    const void **us = calloc((size_t)E, sizeof(void *)), **ds = calloc((size_t)E, sizeof(void *));
    const uint8_t **gz = calloc((size_t)E, sizeof(void *)), **uz = calloc((size_t)E, sizeof(void *));
    const uint8_t **dz = calloc((size_t)E, sizeof(void *));
    const void **gb = calloc((size_t)E, sizeof(void *)), **ub = calloc((size_t)E, sizeof(void *));
    const void **db = calloc((size_t)E, sizeof(void *));
    for (int64_t e = 0; e < E; e++) {
        g[e] = mats[3 * e], u[e] = mats[3 * e + 1], dn[e] = mats[3 * e + 2];
        gs[e] = scales[3 * e], us[e] = scales[3 * e + 1], ds[e] = scales[3 * e + 2];
        gz[e] = zeros[3 * e], uz[e] = zeros[3 * e + 1], dz[e] = zeros[3 * e + 2];
        gb[e] = bias, ub[e] = bias + I, db[e] = bias + 2 * I;
    }
    moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = g, .up_proj = u,
                             .down_proj = dn};
    if (c->quant) {
        src.gate_scale = gs, src.up_scale = us, src.down_scale = ds;
        if (d.quant.w13.has_zero_point)
            src.gate_zero = gz, src.up_zero = uz, src.down_zero = dz;
    }
    float in_scales[64]; /* static FP8: [E] w13 then [E] w2 input scales (E <= 32 here) */
    assert_true(2 * E <= 64);
    for (int64_t e = 0; e < 2 * E; e++)
        in_scales[e] = (0.5f + 0.05f * (float)e) / 448.0f;
    if (c->quant && d.quant.act == MOE_QACT_STATIC)
        src.w13_input_scale = in_scales, src.w2_input_scale = in_scales + E;
    if (c->biases) {
        src.gate_bias = gb, src.up_bias = ub, src.down_bias = db, src.expert_bias_dtype = MOE_DTYPE_F32;
        src.router_bias = bias + 2 * I + H, src.router_bias_dtype = MOE_DTYPE_F32;
    }
    float *shared = NULL;
    if (c->Is) {
        shared = malloc((size_t)(3 * c->Is * H + H) * es);
        memset(shared, 0, (size_t)(3 * c->Is * H + H) * es);
        src.shared_gate_proj = shared;
        src.shared_up_proj = (char *)shared + (size_t)(c->Is * H) * es;
        src.shared_down_proj = (char *)shared + (size_t)(2 * c->Is * H) * es;
        src.shared_expert_gate = router; /* [1, H] f32: the router's first row */
    }
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    if (c->batched) {
        cfg.prepare_finalize = MOE_PF_LOCAL_BATCHED;
        cfg.experts = MOE_EXPERTS_BATCHED;
        cfg.batched_capacity = 16;
    }
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create_ex(ctx, &d, &cfg, &plan), MOE_OK);
    if (moe_weights_create(plan, &src, &w) != MOE_OK)
        fail_msg("%s on %s: %s", c->name, isa, moe_ctx_last_error(ctx));
    enum { T = 53 };
    float *x = malloc(sizeof(float) * (size_t)(T * H)), *out = malloc(sizeof(float) * (size_t)(T * H));
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(T * H)); /* [T, H] bf16 */
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * c->K));
    float *wts = malloc(sizeof(float) * (size_t)(T * c->K));
    fill(x, (size_t)(T * H), 3, 1.0f);
    for (int64_t i = 0; i < T * H; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        xb[i] = (uint16_t)(bits >> 16);
    }
    const size_t ws = moe_plan_workspace_size(plan, T);
    void *wsp = aligned_alloc(64, (ws + 63) / 64 * 64);
    long n = 0;
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        moe_exec_args a = {.hidden_states = bf16 ? (const void *)xb : (const void *)x,
                           .hidden_dtype = bf16 ? MOE_DTYPE_BF16 : MOE_DTYPE_F32, .n_tokens = T, .output = out,
                           .topk_ids = ids, .topk_weights = wts, .workspace = wsp, .workspace_size = ws};
        assert_int_equal(moe_plan_execute_ex(plan, w, &a), MOE_OK); /* warm-up */
#if !NOALLOC_SANITIZED
        atomic_store(&calls, 0);
        atomic_store(&counting, 1);
#endif
        moe_status st = moe_plan_execute_ex(plan, w, &a);
#if !NOALLOC_SANITIZED
        atomic_store(&counting, 0);
        n += atomic_load(&calls);
#endif
        assert_int_equal(st, MOE_OK);
    }
    free(x), free(out), free(xb), free(ids), free(wts), free(wsp), free(shared);
    for (int64_t i = 0; i < 3 * E; i++)
        free(mats[i]), free(scales[i]), free(zeros[i]);
    free(mats), free(scales), free(zeros), free(router), free(wf), free(bias);
    free(g), free(u), free(dn), free(gs), free(us), free(ds), free(gz), free(uz), free(dz), free(gb), free(ub), free(db);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
    return n;
}

static void test_execute_never_allocates(void **state)
{
    (void)state;
    if (NOALLOC_SANITIZED) {
        print_message("AddressSanitizer owns the allocator: the interposed counters are not used\n");
        skip();
    }
    static const layer_case cases[] = {
        {"bf16", 96, 80, 8, 2, 0, NULL, MOE_DTYPE_BF16, 0, 0, 0},
        {"bf16 batched, shared gated", 96, 80, 8, 2, 48, NULL, MOE_DTYPE_BF16, 0, 0, 1},
        {"f16 odd widths, biases", 33, 17, 6, 3, 0, NULL, MOE_DTYPE_F16, 0, 1, 0},
        {"f32 weight on input", 64, 48, 4, 1, 32, NULL, MOE_DTYPE_F32, 1, 0, 0},
        {"fp8-block", 160, 192, 8, 2, 0, "fp8-block", MOE_DTYPE_BF16, 0, 0, 0},
        {"fp8-block-w8a8", 256, 256, 8, 2, 0, "fp8-block-w8a8", MOE_DTYPE_BF16, 0, 0, 0},
        {"fp8-block-w8a8 I = 1 (per item)", 128, 1, 4, 2, 0, "fp8-block-w8a8", MOE_DTYPE_BF16, 0, 0, 0},
        {"fp8-channel-static", 96, 80, 8, 2, 0, "fp8-channel-static", MOE_DTYPE_BF16, 0, 0, 0},
        {"fp8-block-static weight on input", 256, 130, 4, 2, 0, "fp8-block-static", MOE_DTYPE_BF16, 1, 0, 0},
        {"int8-channel", 96, 80, 8, 2, 0, "int8-channel", MOE_DTYPE_BF16, 0, 0, 0},
        {"int8-w8a8", 96, 83, 8, 2, 0, "int8-w8a8", MOE_DTYPE_BF16, 0, 0, 0},
        {"int8-w8a8 weight on input", 64, 64, 4, 1, 0, "int8-w8a8", MOE_DTYPE_BF16, 1, 0, 0},
        {"int8-w8a8 I = 1 (per item)", 37, 1, 6, 2, 0, "int8-w8a8", MOE_DTYPE_BF16, 0, 0, 0},
        {"int8-w8a8 H = 1 (per item)", 1, 64, 6, 2, 0, "int8-w8a8", MOE_DTYPE_BF16, 0, 0, 1},
        {"int4-g32", 128, 96, 8, 2, 0, "int4-g32", MOE_DTYPE_BF16, 0, 0, 0},
        {"int4-g64-zp", 192, 70, 8, 2, 0, "int4-g64-zp", MOE_DTYPE_BF16, 0, 0, 0},
        {"mxfp4", 128, 64, 8, 4, 0, "mxfp4", MOE_DTYPE_BF16, 0, 1, 0},
    };
    const char *isas[16]; /* every row of the kernel registry this CPU runs */
    const size_t n_isas = tu_isa_names(isas, sizeof isas / sizeof isas[0]);
    int ran = 0;
    for (size_t i = 0; i < n_isas; i++) {
        if (!tu_table_ok(tu_table(isas[i])))
            continue;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const long n = allocations(&cases[c], isas[i]);
            if (n != 0)
                fail_msg("%s on table %s: moe_plan_execute_ex allocated %ld times", cases[c].name, isas[i], n);
            ran++;
        }
    }
    assert_true(ran >= (int)(sizeof cases / sizeof cases[0]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_execute_never_allocates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
