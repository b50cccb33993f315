/* Expert capacity (moe.h expert_capacity, Switch Transformers' top-1 capacity) and empty
 * routed slots (-1): the production path through the public API against src/ref's
 * moe_ref_forward_seq (the cumsum-per-expert formulation), bit for bit, over chunk sizes,
 * threads, permute methods and the batched format; the contract that a token's output depends
 * on its own sequence only; the argument and description errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "ref/ref.h"
#include "testutil.h"

enum { H = 16, I = 8, E = 4, T = 29, C = 3 };

/* A tiny f32 top-1 layer (softmax, no renormalization: Switch's router) with non-gated ReLU
 * experts, weights small deterministic values. */
typedef struct layer {
    moe_layer_desc d;
    float router[E * H];             /* [E, H] */
    float u[E][I * H], dn[E][H * I]; /* up [I, H], down [H, I] per expert */
    const void *up[E], *dp[E];
    moe_weight_source src;
} layer;

static void layer_init(layer *L, int64_t capacity)
{
    memset(L, 0, sizeof *L);
    moe_layer_desc_init(&L->d);
    L->d.hidden_size = H;
    L->d.moe_intermediate_size = I;
    L->d.num_experts = E;
    L->d.top_k = 1;
    L->d.activation = MOE_ACT_RELU;
    L->d.weight_dtype = MOE_DTYPE_F32;
    L->d.expert_capacity = capacity;
    /* a router that favours expert 1, so it overflows */
    tu_fill_uniform(L->router, E * H, 3, -1, 1);
    for (int k = 0; k < H; k++)
        L->router[1 * H + k] += 0.4f;
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(L->u[e], I * H, 50 + (uint64_t)e, -0.5f, 0.5f);
        tu_fill_uniform(L->dn[e], H * I, 90 + (uint64_t)e, -0.5f, 0.5f);
        L->up[e] = L->u[e];
        L->dp[e] = L->dn[e];
    }
    L->src.router = L->router;
    L->src.router_dtype = MOE_DTYPE_F32;
    L->src.up_proj = L->up;
    L->src.down_proj = L->dp;
}

static moe_ctx *ctx_with(int threads, int64_t chunk, const char *permute)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = threads;
    o.chunk_size = chunk;
    o.permute = permute;
    moe_ctx *ctx = NULL;
    char err[256] = "";
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        fail_msg("moe_ctx_create: %s", err);
    return ctx;
}

/* One execute of L on x [n, H] with the given sequences (NULL: none) and routing (NULL: libmoe's);
 * returns the status, out [n, H], ids / wts [n]. */
static moe_status run(moe_ctx *ctx, const layer *L, const moe_plan_config *cfg, const float *x, int64_t n,
                      const int64_t *lens, int64_t n_seq, const int32_t *in_ids, const float *in_w, float *out,
                      int32_t *ids, float *wts)
{
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create_ex(ctx, &L->d, cfg, &plan), MOE_OK);
    assert_int_equal(moe_weights_create(plan, &L->src, &w), MOE_OK);
    size_t wsz = moe_plan_workspace_size(plan, n);
    void *ws = malloc(wsz + 1);
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = MOE_DTYPE_F32, .n_tokens = n, .output = out,
                       .topk_ids = ids, .topk_weights = wts, .workspace = ws, .workspace_size = wsz,
                       .in_topk_ids = in_ids, .in_topk_weights = in_w, .sequence_lengths = lens,
                       .n_sequences = n_seq};
    moe_status st = moe_plan_execute_ex(plan, w, &a);
    free(ws);
    moe_weights_free(w);
    moe_plan_free(plan);
    return st;
}

/* sequences of the T tokens: 7, 0 (empty), 12, 10 */
static const int64_t LENS[] = {7, 0, 12, 10};
enum { NSEQ = 4 };

/* Production equals src/ref bit for bit (outputs, ids, weights) under every chunk size,
 * thread count, permute method and the batched format; tokens are dropped, a dropped token's
 * output is +0 exactly and its id -1, weight 0; a kept token's output equals the plan without
 * capacity. */
static void test_capacity_matches_ref(void **state)
{
    (void)state;
    layer L;
    layer_init(&L, C);
    float x[T * H];
    tu_fill_uniform(x, T * H, 11, -1, 1);
    float ref[T * H], rw[T];
    int32_t rid[T];
    assert_int_equal(moe_ref_forward_seq(&L.d, &L.src, MOE_COMPUTE_F32, x, T, NULL, NULL, NULL, LENS, NSEQ, ref, rid,
                                         rw),
                     MOE_OK);
    /* the reference drops tokens, and never more than C per expert per sequence are kept */
    int dropped = 0;
    int64_t s0 = 0;
    for (int s = 0; s < NSEQ; s++) {
        int kept[E] = {0};
        for (int64_t t = s0; t < s0 + LENS[s]; t++) {
            if (rid[t] == -1) {
                dropped++;
                assert_true(rw[t] == 0.0f);
                for (int k = 0; k < H; k++)
                    assert_true(ref[t * H + k] == 0.0f && !signbit(ref[t * H + k]));
            } else {
                kept[rid[t]]++;
            }
        }
        for (int e = 0; e < E; e++)
            assert_true(kept[e] <= C);
        s0 += LENS[s];
    }
    assert_true(dropped >= 3);

    /* the same layer without capacity: kept tokens have the same bits */
    layer U;
    layer_init(&U, 0);
    float uref[T * H];
    int32_t uid[T];
    float uw[T];
    assert_int_equal(moe_ref_forward(&U.d, &U.src, x, T, NULL, uref, uid, uw), MOE_OK);
    for (int t = 0; t < T; t++)
        if (rid[t] != -1) {
            assert_int_equal(rid[t], uid[t]);
            assert_memory_equal(ref + t * H, uref + t * H, sizeof(float) * H);
        } else {
            assert_true(uid[t] >= 0 && uw[t] > 0.0f); /* it was routed: the drop is the capacity's */
        }

    const int threads[] = {1, 2};
    const int64_t chunks[] = {1024, 5, 1};
    const char *permutes[] = {"sort", "onehot", "packed"};
    for (int ti = 0; ti < 2; ti++)
        for (int ci = 0; ci < 3; ci++)
            for (int pi = 0; pi < 3; pi++)
                for (int batched = 0; batched < 2; batched++) {
                    moe_ctx *ctx = ctx_with(threads[ti], chunks[ci], permutes[pi]);
                    moe_plan_config cfg;
                    moe_plan_config_init(&cfg);
                    if (batched) {
                        cfg.prepare_finalize = MOE_PF_LOCAL_BATCHED;
                        cfg.experts = MOE_EXPERTS_BATCHED;
                    }
                    float out[T * H], w[T];
                    int32_t id[T];
                    moe_status st = run(ctx, &L, &cfg, x, T, LENS, NSEQ, NULL, NULL, out, id, w);
                    if (st != MOE_OK)
                        fail_msg("threads %d chunk %lld permute %s batched %d: %s: %s", threads[ti],
                                 (long long)chunks[ci], permutes[pi], batched, moe_status_name(st),
                                 moe_ctx_last_error(ctx));
                    assert_memory_equal(id, rid, sizeof id);
                    assert_memory_equal(w, rw, sizeof w);
                    assert_memory_equal(out, ref, sizeof out);
                    moe_ctx_free(ctx);
                }
}

/* A sequence's outputs are the same bits alone, at the end of a batch of other sequences, or
 * as a decode step's sequences of 1 (where nothing is dropped): the count never crosses a
 * sequence boundary. */
static void test_sequences_independent(void **state)
{
    (void)state;
    layer L;
    layer_init(&L, C);
    float x[T * H];
    tu_fill_uniform(x, T * H, 11, -1, 1);
    moe_ctx *ctx = ctx_with(2, 4, NULL);
    float all[T * H], w[T];
    int32_t id[T];
    assert_int_equal(run(ctx, &L, NULL, x, T, LENS, NSEQ, NULL, NULL, all, id, w), MOE_OK);
    /* the last sequence (tokens 19..28) alone */
    const int64_t last = LENS[3], at = T - LENS[3];
    float one[10 * H], w1[10];
    int32_t id1[10];
    assert_int_equal(run(ctx, &L, NULL, x + at * H, last, &last, 1, NULL, NULL, one, id1, w1), MOE_OK);
    assert_memory_equal(one, all + at * H, sizeof one);
    assert_memory_equal(id1, id + at, sizeof id1);
    /* every token its own sequence: nothing is dropped, outputs are the uncapped plan's */
    int64_t ones[T];
    for (int t = 0; t < T; t++)
        ones[t] = 1;
    layer U;
    layer_init(&U, 0);
    float dec[T * H], unc[T * H];
    assert_int_equal(run(ctx, &L, NULL, x, T, ones, T, NULL, NULL, dec, id, w), MOE_OK);
    assert_int_equal(run(ctx, &U, NULL, x, T, NULL, 0, NULL, NULL, unc, NULL, NULL), MOE_OK);
    for (int t = 0; t < T; t++)
        assert_true(id[t] >= 0);
    assert_memory_equal(dec, unc, sizeof dec);
    /* at most C tokens need no boundaries (none can be dropped) */
    float few[C * H];
    assert_int_equal(run(ctx, &L, NULL, x, C, NULL, 0, NULL, NULL, few, NULL, NULL), MOE_OK);
    assert_memory_equal(few, unc, sizeof few);
    moe_ctx_free(ctx);
}

/* The routing an execute reports (ids -1 for its drops) given back as in_topk_ids gives the
 * same bits; -1 is an empty slot in any plan, top_k 2 included, as src/ref computes it. */
static void test_empty_slots_given(void **state)
{
    (void)state;
    layer L;
    layer_init(&L, C);
    float x[T * H];
    tu_fill_uniform(x, T * H, 11, -1, 1);
    moe_ctx *ctx = ctx_with(2, 6, NULL);
    float out[T * H], w[T], again[T * H];
    int32_t id[T];
    assert_int_equal(run(ctx, &L, NULL, x, T, LENS, NSEQ, NULL, NULL, out, id, w), MOE_OK);
    assert_int_equal(run(ctx, &L, NULL, x, T, NULL, 0, id, w, again, NULL, NULL), MOE_OK);
    assert_memory_equal(again, out, sizeof out);

    /* top_k 2 without capacity: some slots -1 (first, second, both) */
    layer K2;
    layer_init(&K2, 0);
    K2.d.top_k = 2;
    int32_t gid[T * 2];
    float gw[T * 2];
    for (int t = 0; t < T; t++) {
        gid[2 * t] = t % 3 == 0 ? -1 : t % E;
        gid[2 * t + 1] = t % 5 == 0 ? -1 : (t + 1) % E;
        gw[2 * t] = 0.25f + 0.01f * (float)t;
        gw[2 * t + 1] = 0.5f;
    }
    float ref[T * H], o2[T * H];
    assert_int_equal(moe_ref_forward_given(&K2.d, &K2.src, MOE_COMPUTE_F32, x, T, NULL, gid, gw, ref, NULL, NULL),
                     MOE_OK);
    const char *permutes[] = {"sort", "onehot", "packed"};
    for (int pi = 0; pi < 3; pi++) {
        moe_ctx *c2 = ctx_with(1, 7, permutes[pi]);
        assert_int_equal(run(c2, &K2, NULL, x, T, NULL, 0, gid, gw, o2, NULL, NULL), MOE_OK);
        assert_memory_equal(o2, ref, sizeof o2);
        moe_ctx_free(c2);
    }
    /* token 0 and 15 have both slots empty: +0 */
    for (int k = 0; k < H; k++)
        assert_true(o2[0 * H + k] == 0.0f && !signbit(o2[0 * H + k]) && o2[15 * H + k] == 0.0f);
    /* -2 is not an empty slot */
    gid[3] = -2;
    assert_int_equal(run(ctx, &K2, NULL, x, T, NULL, 0, gid, gw, o2, NULL, NULL), MOE_EINVAL);
    assert_non_null(strstr(moe_ctx_last_error(ctx), "in_topk_ids[1][1] = -2"));
    moe_ctx_free(ctx);
}

/* Bad sequences and descriptions are refused by name, before anything is written. */
static void test_capacity_errors(void **state)
{
    (void)state;
    layer L;
    layer_init(&L, C);
    float x[T * H], out[T * H];
    tu_fill_uniform(x, T * H, 11, -1, 1);
    moe_ctx *ctx = ctx_with(1, 0, NULL);
    struct {
        const int64_t *lens;
        int64_t n;
        const char *msg;
    } bad[] = {
        {NULL, 0, "without sequence boundaries: give sequence_lengths"},
        {NULL, 2, "n_sequences = 2 but sequence_lengths is NULL"},
        {LENS, 0, "n_sequences = 0 (>= 1)"},
        {LENS, 3, "sum to 19 over 3 sequences, n_tokens = 29"},
        {(const int64_t[]){30}, 1, "sequence_lengths[0] = 30 runs past the tokens"},
        {(const int64_t[]){5, -1, 25}, 3, "sequence_lengths[1] = -1 is negative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (int k = 0; k < T * H; k++)
            out[k] = 7.0f;
        assert_int_equal(run(ctx, &L, NULL, x, T, bad[i].lens, bad[i].n, NULL, NULL, out, NULL, NULL), MOE_EINVAL);
        if (!strstr(moe_ctx_last_error(ctx), bad[i].msg))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, moe_ctx_last_error(ctx), bad[i].msg);
        for (int k = 0; k < T * H; k++)
            assert_true(out[k] == 7.0f);
    }
    /* a plan without capacity does not read them */
    layer U;
    layer_init(&U, 0);
    assert_int_equal(run(ctx, &U, NULL, x, T, NULL, 5, NULL, NULL, out, NULL, NULL), MOE_OK);

    struct {
        int64_t cap, k, z;
        const char *msg;
    } bd[] = {
        {-1, 1, 0, "expert_capacity = -1, must be in [0, 2147483647]"},
        {(int64_t)1 << 31, 1, 0, "expert_capacity = 2147483648"},
        {2, 2, 0, "expert_capacity = 2 with top_k = 2"},
        {2, 1, 1, "expert_capacity = 2 with num_identity_experts = 1"},
    };
    for (size_t i = 0; i < sizeof bd / sizeof bd[0]; i++) {
        layer B;
        layer_init(&B, bd[i].cap);
        B.d.top_k = bd[i].k;
        B.d.num_identity_experts = bd[i].z;
        moe_plan *p = NULL;
        assert_int_equal(moe_plan_create(ctx, &B.d, &p), MOE_EINVAL);
        assert_null(p);
        if (!strstr(moe_ctx_last_error(ctx), bd[i].msg))
            fail_msg("desc case %zu: \"%s\" lacks \"%s\"", i, moe_ctx_last_error(ctx), bd[i].msg);
    }
    /* the plan text names the capacity; without it the text is unchanged */
    moe_plan *p = NULL, *q = NULL;
    assert_int_equal(moe_plan_create(ctx, &L.d, &p), MOE_OK);
    assert_int_equal(moe_plan_create(ctx, &U.d, &q), MOE_OK);
    assert_non_null(strstr(moe_plan_text(p), "expert_capacity=3;"));
    assert_null(strstr(moe_plan_text(q), "expert_capacity"));
    moe_plan_free(p);
    moe_plan_free(q);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_matches_ref),
        cmocka_unit_test(test_sequences_independent),
        cmocka_unit_test(test_empty_slots_given),
        cmocka_unit_test(test_capacity_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
