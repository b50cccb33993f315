/* Expert placement as data (moe_parallel.h "Expert placement", docs/parallel.md): valid
 * placements pass moe_placement_check (contiguous, round robin, replicas, a rank holding no
 * expert), each rule's violation is MOE_EINVAL naming the entry, a placement file round-trips
 * through moe_placement_write / moe_placement_read, and a malformed file is MOE_EFORMAT (or
 * MOE_EINVAL for a well-formed but invalid placement) naming the file and the JSON path. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "testutil.h"

enum { E = 8, EP = 3, PMAX = E * EP };

/* A placement over caller arrays: rank_num_physical [EP], physical_to_logical [PMAX]. */
typedef struct pl {
    int32_t p2l[PMAX];
    int32_t counts[EP];
    moe_placement p;
} pl;

/* Fill `x` from per-rank lists given as counts and one flat list of logical ids. */
static void make(pl *x, int ep, const int32_t *counts, const int32_t *p2l)
{
    int32_t P = 0;
    for (int r = 0; r < ep; r++) {
        x->counts[r] = counts[r];
        P += counts[r];
    }
    memcpy(x->p2l, p2l, (size_t)P * sizeof *p2l);
    x->p.ep_size = ep;
    x->p.num_logical_experts = E;
    x->p.num_physical_experts = P;
    x->p.physical_to_logical = x->p2l;
    x->p.rank_num_physical = x->counts;
}

static void test_valid(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    pl x;
    /* contiguous: E / EP = 2 rem 2 -> 3, 3, 2 */
    make(&x, EP, (const int32_t[]){3, 3, 2}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    assert_int_equal(moe_placement_check(ctx, &x.p, E, EP), MOE_OK);
    /* round robin: e on rank e mod 3 */
    make(&x, EP, (const int32_t[]){3, 3, 2}, (const int32_t[]){0, 3, 6, 1, 4, 7, 2, 5});
    assert_int_equal(moe_placement_check(ctx, &x.p, E, EP), MOE_OK);
    /* replicas: expert 0 on every rank, expert 5 twice, rank 1 holding only the replica */
    make(&x, EP, (const int32_t[]){6, 1, 4}, (const int32_t[]){0, 1, 2, 3, 4, 5, 0, 0, 5, 6, 7});
    assert_int_equal(moe_placement_check(ctx, &x.p, E, EP), MOE_OK);
    /* a rank holding no expert */
    make(&x, EP, (const int32_t[]){4, 0, 4}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    assert_int_equal(moe_placement_check(ctx, &x.p, E, EP), MOE_OK);
    /* every expert on every rank (P = E * ep_size, the most) */
    int32_t all[PMAX];
    for (int i = 0; i < PMAX; i++)
        all[i] = i % E;
    make(&x, EP, (const int32_t[]){E, E, E}, all);
    assert_int_equal(moe_placement_check(ctx, &x.p, E, EP), MOE_OK);
    /* one rank: the identity */
    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    assert_int_equal(moe_placement_check(ctx, &x.p, E, 1), MOE_OK);
    moe_ctx_free(ctx);
}

static void test_errors(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    pl x;
    const int32_t contig[E] = {0, 1, 2, 3, 4, 5, 6, 7};
    make(&x, EP, (const int32_t[]){3, 3, 2}, contig);
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, 2), MOE_EINVAL, "ep_size = 3", "parallel.ep_size = 2");
    expect_error(ctx, moe_placement_check(ctx, &x.p, 9, EP), MOE_EINVAL, "num_logical_experts = 8",
                 "num_experts = 9");
    expect_error(ctx, moe_placement_check(ctx, NULL, E, EP), MOE_EINVAL, "NULL");

    /* rank count sum wrong: counts sum to 7, P = 8 */
    make(&x, EP, (const int32_t[]){3, 2, 2}, contig);
    x.p.num_physical_experts = E;
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "rank_num_physical sums to 7",
                 "num_physical_experts = 8");
    /* a negative count names the rank */
    make(&x, EP, (const int32_t[]){5, -1, 4}, contig);
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "rank_num_physical[1] = -1");
    /* P below E / above E * ep_size */
    make(&x, EP, (const int32_t[]){3, 2, 2}, contig);
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "num_physical_experts = 7");
    x.p.num_physical_experts = PMAX + 1;
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "num_physical_experts = 25", "= 24");
    /* logical id out of range names the physical expert */
    make(&x, EP, (const int32_t[]){3, 3, 2}, (const int32_t[]){0, 1, 2, 3, 8, 5, 6, 7});
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "physical expert 4",
                 "logical expert 8", "[0, 8)");
    make(&x, EP, (const int32_t[]){3, 3, 2}, (const int32_t[]){0, 1, 2, 3, 4, 5, -2, 7});
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "physical expert 6",
                 "logical expert -2");
    /* missing expert: 6 never held (7 twice, on different ranks) */
    make(&x, EP, (const int32_t[]){3, 3, 2}, (const int32_t[]){0, 1, 2, 3, 4, 5, 7, 7});
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "physical expert 7 (rank 2)",
                 "repeats logical expert 7");
    make(&x, EP, (const int32_t[]){3, 3, 3}, (const int32_t[]){0, 1, 2, 3, 4, 5, 7, 0, 1});
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "logical expert 6",
                 "held by no physical expert");
    /* duplicate on one rank names both physical experts and the rank */
    make(&x, EP, (const int32_t[]){4, 3, 2}, (const int32_t[]){0, 1, 2, 1, 3, 4, 5, 6, 7});
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "physical expert 3 (rank 0)",
                 "repeats logical expert 1", "already physical expert 1");
    /* the same logical expert on two ranks is a replica, not a duplicate */
    make(&x, EP, (const int32_t[]){4, 3, 2}, (const int32_t[]){0, 1, 2, 3, 3, 4, 5, 6, 7});
    assert_int_equal(moe_placement_check(ctx, &x.p, E, EP), MOE_OK);
    /* one rank: a permutation is refused, naming the first non-identity entry */
    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){0, 1, 3, 2, 4, 5, 6, 7});
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, 1), MOE_EINVAL, "identity", "physical expert 2",
                 "logical expert 3");
    /* NULL arrays */
    make(&x, EP, (const int32_t[]){3, 3, 2}, contig);
    x.p.physical_to_logical = NULL;
    expect_error(ctx, moe_placement_check(ctx, &x.p, E, EP), MOE_EINVAL, "physical_to_logical is NULL");
    /* ctx NULL: the status only */
    assert_int_equal(moe_placement_check(NULL, &x.p, E, EP), MOE_EINVAL);
    moe_ctx_free(ctx);
}

static void test_round_trip(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512], path[600];
    assert_non_null(tu_tmpdir(dir, sizeof dir, "placement"));
    tu_join(path, sizeof path, dir, "placement.json");
    pl x;
    make(&x, EP, (const int32_t[]){6, 0, 5}, (const int32_t[]){0, 1, 2, 3, 4, 5, 0, 5, 6, 7, 3});
    assert_int_equal(moe_placement_write(ctx, path, &x.p), MOE_OK);
    moe_placement y;
    assert_int_equal(moe_placement_read(ctx, path, &y), MOE_OK);
    assert_int_equal(y.ep_size, EP);
    assert_int_equal(y.num_logical_experts, E);
    assert_int_equal(y.num_physical_experts, 11);
    assert_memory_equal(y.rank_num_physical, x.counts, EP * sizeof(int32_t));
    assert_memory_equal(y.physical_to_logical, x.p2l, 11 * sizeof(int32_t));
    /* writing over an existing file replaces it; no temporary file is left */
    assert_int_equal(moe_placement_write(ctx, path, &y), MOE_OK);
    assert_int_equal(tu_dir_entries(dir), 1);
    moe_placement_clear(&y);
    assert_null(y.physical_to_logical);
    assert_null(y.rank_num_physical);
    moe_placement_clear(&y); /* twice is harmless */
    /* an invalid placement is not written */
    x.p2l[6] = 9;
    expect_error(ctx, moe_placement_write(ctx, path, &x.p), MOE_EINVAL, path, "not written",
                 "physical expert 6");
    assert_int_equal(moe_placement_read(ctx, path, &y), MOE_OK); /* the old file is intact */
    assert_int_equal(y.physical_to_logical[6], 0);
    moe_placement_clear(&y);
    moe_ctx_free(ctx);
}

/* Write `text` to dir/name and read it expecting `want` with every string of subs. */
static void bad(moe_ctx *ctx, const char *dir, const char *text, moe_status want, const char *const *subs)
{
    char path[600];
    tu_join(path, sizeof path, dir, "p.json");
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
    moe_placement y;
    memset(&y, 0x5a, sizeof y);
    tu_check_error(ctx, moe_placement_read(ctx, path, &y), want, subs);
    assert_null(y.physical_to_logical); /* cleared on failure */
    assert_null(y.rank_num_physical);
}
#define BAD(text, want, ...) bad(ctx, dir, (text), (want), (const char *const[]){"p.json", __VA_ARGS__, NULL})

static void test_malformed(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    char dir[512];
    assert_non_null(tu_tmpdir(dir, sizeof dir, "placement_bad"));
    BAD("{\"ep_size\": 2, ", MOE_EFORMAT, "not valid JSON");
    BAD("[1, 2]", MOE_EFORMAT, "must be a JSON object", "an array");
    BAD("{\"num_logical_experts\": 4, \"ranks\": [[0, 1], [2, 3]]}", MOE_EFORMAT, "ep_size must be an integer",
        "absent");
    BAD("{\"ep_size\": \"2\", \"num_logical_experts\": 4, \"ranks\": [[0, 1], [2, 3]]}", MOE_EFORMAT,
        "ep_size must be an integer", "a string");
    BAD("{\"ep_size\": 0, \"num_logical_experts\": 4, \"ranks\": []}", MOE_EFORMAT, "ep_size = 0");
    BAD("{\"ep_size\": 2, \"ranks\": [[0, 1], [2, 3]]}", MOE_EFORMAT, "num_logical_experts must be an integer");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4}", MOE_EFORMAT, "ranks must be an array", "absent");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1, 2, 3]]}", MOE_EFORMAT,
        "ranks has 1 entries", "ep_size = 2");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1], 2]}", MOE_EFORMAT, "ranks[1] must be an array",
        "an integer");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1], [2, 3.0]]}", MOE_EFORMAT,
        "ranks[1][1] must be an integer", "a real number");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1], [2, 4]]}", MOE_EINVAL, "ranks[1][1] = 4",
        "physical expert 3", "[0, 4)");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1, 0], [2, 3]]}", MOE_EINVAL,
        "physical expert 2 (rank 0) repeats logical expert 0");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1], [2]]}", MOE_EINVAL, "num_physical_experts = 3");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1, 2], [2, 1]]}", MOE_EINVAL,
        "logical expert 3 is held by no physical expert");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 2, \"ranks\": [[0, 1, 0, 1, 0], [1]]}", MOE_EINVAL,
        "over 4 physical experts");
    BAD("{\"ep_size\": 2, \"num_logical_experts\": 4, \"ranks\": [[0, 1], [2, 3]], \"rank\": 1}", MOE_EFORMAT,
        "unknown field \"rank\"");
    BAD("{\"ep_size\": 1, \"num_logical_experts\": 2, \"ranks\": [[1, 0]]}", MOE_EINVAL, "identity");
    char path[600];
    tu_join(path, sizeof path, dir, "absent.json");
    moe_placement y;
    expect_error(ctx, moe_placement_read(ctx, path, &y), MOE_ENOTFOUND, "absent.json");
    expect_error(ctx, moe_placement_read(ctx, dir, &y), MOE_EIO, "directory");
    moe_ctx_free(ctx);
}

/* A small f32 layer for the plan tests: no shared expert. */
enum { H = 16, I = 12, K = 2 };
static float router[E * H], gw[E][I * H], uw[E][I * H], dw[E][H * I];
static const void *gp[E], *up[E], *dp[E];

static void small_layer(moe_layer_desc *d, moe_weight_source *src)
{
    moe_layer_desc_init(d);
    d->hidden_size = H;
    d->moe_intermediate_size = I;
    d->num_experts = E;
    d->top_k = K;
    d->weight_dtype = MOE_DTYPE_F32;
    tu_fill_uniform(router, E * H, 1, -1, 1);
    for (int e = 0; e < E; e++) {
        tu_fill_uniform(gw[e], I * H, 10 + (uint64_t)e, -0.3f, 0.3f);
        tu_fill_uniform(uw[e], I * H, 40 + (uint64_t)e, -0.3f, 0.3f);
        tu_fill_uniform(dw[e], H * I, 70 + (uint64_t)e, -0.3f, 0.3f);
        gp[e] = gw[e];
        up[e] = uw[e];
        dp[e] = dw[e];
    }
    *src = (moe_weight_source){.router = router, .router_dtype = MOE_DTYPE_F32, .gate_proj = gp, .up_proj = up,
                               .down_proj = dp};
}

/* Plan creation: an identity placement is the plan without one (same text and hash); the
 * plan's placement is the contiguous one; an invalid placement is MOE_EINVAL naming the field
 * and the entry; a valid non-contiguous one is MOE_EUNSUPPORTED naming the entry (only the
 * contiguous placement runs so far). */
static void test_plan(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_weight_source src;
    small_layer(&d, &src);
    moe_plan *ref = NULL, *p = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &ref), MOE_OK);
    const moe_placement *rp = moe_plan_placement(ref);
    assert_non_null(rp);
    assert_int_equal(rp->ep_size, 1);
    assert_int_equal(rp->num_logical_experts, E);
    assert_int_equal(rp->num_physical_experts, E);
    assert_int_equal(rp->rank_num_physical[0], E);
    for (int e = 0; e < E; e++)
        assert_int_equal(rp->physical_to_logical[e], e);
    assert_ptr_equal(moe_plan_parallel(ref)->placement, rp);

    pl x;
    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    moe_plan_config c;
    moe_plan_config_init(&c);
    c.parallel.placement = &x.p;
    assert_int_equal(moe_plan_create_ex(ctx, &d, &c, &p), MOE_OK);
    assert_string_equal(moe_plan_text(p), moe_plan_text(ref));
    assert_true(moe_plan_hash(p) == moe_plan_hash(ref));
    assert_ptr_not_equal(moe_plan_placement(p)->physical_to_logical, x.p2l); /* the plan's copy */
    moe_plan_free(p);

    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 9});
    p = NULL;
    expect_error(ctx, moe_plan_create_ex(ctx, &d, &c, &p), MOE_EINVAL, "plan config: parallel.placement",
                 "physical expert 7", "logical expert 9");
    assert_null(p);
    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){1, 0, 2, 3, 4, 5, 6, 7});
    expect_error(ctx, moe_plan_create_ex(ctx, &d, &c, &p), MOE_EINVAL, "identity", "physical expert 0");
    make(&x, 2, (const int32_t[]){4, 4}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect_error(ctx, moe_plan_create_ex(ctx, &d, &c, &p), MOE_EINVAL, "placement: ep_size = 2",
                 "parallel.ep_size = 1");
    /* ep_size 2 (rank 0 given): round robin and replicas are valid; the report follows the
     * placement (rank 0's physical experts and their bytes; the contiguous rank's as reference) */
    c.parallel.ep_size = 2;
    c.parallel.ep_rank = 0;
    moe_rank_report *rr = malloc(sizeof *rr), *rc = malloc(sizeof *rc);
    assert_non_null(rr);
    assert_non_null(rc);
    make(&x, 2, (const int32_t[]){4, 4}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7}); /* = contiguous */
    assert_int_equal(moe_plan_report_for(ctx, &d, &c, rc), MOE_OK);
    assert_int_equal(rc->n_experts, 4);
    make(&x, 2, (const int32_t[]){4, 4}, (const int32_t[]){0, 2, 4, 6, 1, 3, 5, 7});
    assert_int_equal(moe_plan_report_for(ctx, &d, &c, rr), MOE_OK);
    assert_int_equal(rr->n_experts, 4);
    assert_true(rr->code_bytes == rc->code_bytes);
    make(&x, 2, (const int32_t[]){5, 4}, (const int32_t[]){0, 1, 2, 3, 4, 4, 5, 6, 7}); /* logical 4 twice */
    assert_int_equal(moe_plan_report_for(ctx, &d, &c, rr), MOE_OK);
    assert_int_equal(rr->n_experts, 5);
    assert_true(rr->code_bytes * 4 == rc->code_bytes * 5); /* a replica is packed in full */
    c.parallel.ep_rank = 1;
    assert_int_equal(moe_plan_report_for(ctx, &d, &c, rr), MOE_OK);
    assert_int_equal(rr->n_experts, 4);
    assert_int_equal(rr->expert_first, 5); /* physical experts 5..8 */
    c.parallel.ep_rank = 0;
    free(rr);
    free(rc);
    make(&x, 2, (const int32_t[]){4, 6}, (const int32_t[]){0, 1, 2, 3, 4, 5, 4, 6, 7, 0});
    expect_error(ctx, moe_plan_create_ex(ctx, &d, &c, &p), MOE_EINVAL, "physical expert 6 (rank 1)",
                 "repeats logical expert 4", "already physical expert 4");
    assert_null(p);
    moe_plan_free(ref);
    moe_ctx_free(ctx);
}

/* One-process rebalance: to the identity a no-op success (every expert kept, nothing packed,
 * bytes_resident = moe_weights_expert_bytes, the output bits unchanged); anything else
 * MOE_EINVAL naming the entry, the weights untouched. */
static void test_rebalance_one_process(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    moe_weight_source src;
    small_layer(&d, &src);
    moe_plan *p = NULL;
    moe_weights *w = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &p), MOE_OK);
    assert_int_equal(moe_weights_create(p, &src, &w), MOE_OK);
    enum { T = 5 };
    float xin[T * H], y0[T * H], y1[T * H];
    tu_fill_uniform(xin, T * H, 7, -1, 1);
    size_t wsb = moe_plan_workspace_size(p, T);
    void *ws = malloc(wsb ? wsb : 1);
    assert_non_null(ws);
    assert_int_equal(moe_plan_execute(p, w, xin, T, y0, ws, wsb), MOE_OK);

    pl x;
    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    moe_rebalance_report rep;
    memset(&rep, 0xff, sizeof rep);
    assert_int_equal(moe_plan_rebalance(p, w, &x.p, &src, &rep), MOE_OK);
    assert_int_equal(rep.experts_kept, E);
    assert_int_equal(rep.experts_packed, 0);
    assert_int_equal(rep.experts_freed, 0);
    assert_int_equal(rep.bytes_packed, 0);
    assert_int_equal(rep.bytes_resident, moe_weights_expert_bytes(w));
    assert_true(rep.seconds >= 0);
    assert_int_equal(moe_plan_rebalance(p, w, &x.p, &src, NULL), MOE_OK);

    make(&x, 1, (const int32_t[]){E}, (const int32_t[]){0, 1, 2, 3, 4, 5, 7, 6});
    expect_error(ctx, moe_plan_rebalance(p, w, &x.p, &src, &rep), MOE_EINVAL, "moe_plan_rebalance",
                 "identity", "physical expert 6");
    make(&x, 2, (const int32_t[]){4, 4}, (const int32_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    expect_error(ctx, moe_plan_rebalance(p, w, &x.p, &src, &rep), MOE_EINVAL, "ep_size = 2");
    expect_error(ctx, moe_plan_rebalance(p, w, NULL, &src, &rep), MOE_EINVAL, "next is NULL");

    assert_int_equal(moe_plan_execute(p, w, xin, T, y1, ws, wsb), MOE_OK);
    assert_true(tu_same_bits(y0, y1, T * H));
    free(ws);
    moe_weights_free(w);
    moe_plan_free(p);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_rebalance_one_process),
    };
    return cmocka_run_group_tests_name("placement", tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
