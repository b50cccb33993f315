/* The built-in placement policies (moe_placement_build) and the predicted rows per rank
 * (moe_placement_rank_rows): contiguous is today's split (moe_split_first / count), round-robin
 * puts e on rank e mod ep_size, balanced passes the placement rules (checked here, written
 * in this test from moe_parallel.h "Expert placement", not with moe_placement_check) and on
 * issue 18's target load (128 experts, the hottest 8 take half the rows, 8 redundant slots)
 * predicts max/mean <= 1.15 at 2, 3 and 4 ranks, computed here from the placement alone. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "parallel/parallel.h"
#include "testutil.h"

enum { EMAX = 256, PMAX = 2048, RMAX = 64 };

/* The placement rules of moe_parallel.h, asserted entry by entry; and the slot counts the
 * balanced policy promises (P / ep_size, one more on the first P % ep_size ranks). */
static void check_rules(const moe_placement *p, int64_t E, int ep, int64_t R, int balanced_slots)
{
    assert_int_equal(p->ep_size, ep);
    assert_int_equal(p->num_logical_experts, E);
    assert_int_equal(p->num_physical_experts, E + R);
    const int64_t P = E + R;
    int64_t sum = 0;
    for (int r = 0; r < ep; r++) {
        assert_true(p->rank_num_physical[r] >= 0);
        if (balanced_slots)
            assert_int_equal(p->rank_num_physical[r], P / ep + (r < P % ep ? 1 : 0));
        sum += p->rank_num_physical[r];
    }
    assert_int_equal(sum, P);
    static int held[EMAX];
    memset(held, 0, sizeof held);
    int64_t at = 0;
    for (int r = 0; r < ep; r++) {
        static int on_rank[EMAX];
        memset(on_rank, 0, sizeof on_rank);
        for (int32_t i = 0; i < p->rank_num_physical[r]; i++, at++) {
            const int32_t e = p->physical_to_logical[at];
            assert_true(e >= 0 && e < E);
            if (on_rank[e])
                fail_msg("rank %d holds logical expert %d twice (physical %lld)", r, e, (long long)at);
            on_rank[e] = 1;
            held[e]++;
        }
    }
    for (int64_t e = 0; e < E; e++)
        if (held[e] < 1)
            fail_msg("logical expert %lld is on no rank", (long long)e);
}

/* max/mean of the rows per rank, every replica taking an equal share of its expert's load
 * (in doubles: an independent check of moe_placement_rank_rows's integer split). */
static double predicted_imbalance(const moe_placement *p, const int64_t *load, double *rank_rows)
{
    const int64_t E = p->num_logical_experts;
    int reps[EMAX] = {0};
    for (int64_t i = 0; i < p->num_physical_experts; i++)
        reps[p->physical_to_logical[i]]++;
    double total = 0, max = 0;
    int64_t at = 0;
    for (int r = 0; r < p->ep_size; r++) {
        double rows = 0;
        for (int32_t i = 0; i < p->rank_num_physical[r]; i++, at++) {
            const int32_t e = p->physical_to_logical[at];
            rows += (double)load[e] / reps[e];
        }
        rank_rows[r] = rows;
        total += rows;
        if (rows > max)
            max = rows;
    }
    (void)E;
    return total > 0 ? max / (total / p->ep_size) : 1.0;
}

static void test_contiguous_is_todays_split(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    const int64_t Es[] = {6, 7, 64, 128, 129};
    for (size_t k = 0; k < sizeof Es / sizeof Es[0]; k++)
        for (int ep = 1; ep <= 6 && ep <= Es[k]; ep++) {
            int32_t p2l[PMAX], rn[RMAX];
            moe_placement p;
            assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, Es[k], ep, 0, NULL, p2l, rn, &p), MOE_OK);
            check_rules(&p, Es[k], ep, 0, 0);
            int64_t at = 0;
            for (int r = 0; r < ep; r++) {
                assert_int_equal(rn[r], moe_split_count(Es[k], ep, r));
                for (int32_t i = 0; i < rn[r]; i++, at++)
                    assert_int_equal(p2l[at], moe_split_first(Es[k], ep, r) + i);
            }
        }
    moe_ctx_free(ctx);
}

static void test_round_robin(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    for (int ep = 1; ep <= 5; ep++) {
        int32_t p2l[PMAX], rn[RMAX];
        moe_placement p;
        assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, 13, ep, 0, NULL, p2l, rn, &p), MOE_OK);
        check_rules(&p, 13, ep, 0, 0);
        int64_t at = 0;
        for (int r = 0; r < ep; r++) {
            int32_t prev = -1;
            for (int32_t i = 0; i < rn[r]; i++, at++) {
                assert_int_equal(p2l[at] % ep, r);
                assert_true(p2l[at] > prev);
                prev = p2l[at];
            }
        }
    }
    moe_ctx_free(ctx);
}

/* Balanced on many loads (uniform, zero, random, skewed, one hot expert) and every redundant
 * count up to the limit for small sizes: the rules hold, the result is deterministic, and
 * rank_rows sums the load and agrees with the equal-share prediction within the rounding. */
static void test_balanced_rules(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    uint64_t rng = 12345;
    for (int shape = 0; shape < 5; shape++)
        for (int64_t E = 4; E <= 40; E += 9)
            for (int ep = 1; ep <= 5 && ep <= E; ep++) {
                int64_t load[EMAX];
                for (int64_t e = 0; e < E; e++)
                    load[e] = shape == 0   ? 100
                              : shape == 1 ? 0
                              : shape == 2 ? (int64_t)(tu_xorshift(&rng) % 1000)
                              : shape == 3 ? (e < 3 ? 5000 : 10 + e)
                                           : (e == E - 1 ? 100000 : 1);
                const int64_t rmax = E * (ep - 1);
                const int64_t Rs[] = {0, 1, 2, E / 2, rmax - 1, rmax};
                for (size_t k = 0; k < sizeof Rs / sizeof Rs[0]; k++) {
                    const int64_t R = Rs[k];
                    if (R < 0 || R > rmax)
                        continue;
                    int32_t p2l[PMAX], rn[RMAX], p2l_b[PMAX], rn_b[RMAX];
                    moe_placement p, pb;
                    moe_status st = moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, E, ep, R, load, p2l, rn, &p);
                    if (st != MOE_OK)
                        fail_msg("E %lld ep %d R %lld shape %d: %s", (long long)E, ep, (long long)R, shape,
                                 moe_ctx_last_error(ctx));
                    check_rules(&p, E, ep, R, 1);
                    assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, E, ep, R, load, p2l_b, rn_b, &pb),
                                     MOE_OK);
                    assert_memory_equal(p2l, p2l_b, sizeof(int32_t) * (size_t)(E + R));
                    assert_memory_equal(rn, rn_b, sizeof(int32_t) * (size_t)ep);
                    int64_t rows[RMAX], sum = 0, load_sum = 0;
                    double imb, pred[RMAX];
                    assert_int_equal(moe_placement_rank_rows(ctx, &p, load, rows, &imb), MOE_OK);
                    predicted_imbalance(&p, load, pred);
                    for (int r = 0; r < ep; r++) {
                        sum += rows[r];
                        /* the integer split differs from the equal share by < 1 row per replica */
                        assert_true(rows[r] > pred[r] - rn[r] - 1e-9 && rows[r] < pred[r] + rn[r] + 1e-9);
                    }
                    for (int64_t e = 0; e < E; e++)
                        load_sum += load[e];
                    assert_int_equal(sum, load_sum);
                }
            }
    moe_ctx_free(ctx);
}

/* The replicas go to the expert with the highest load per replica, ties to the lower id:
 * expert 5 has 4x and expert 9 has 2x the others' load, 3 redundant slots (worked below). */
static void test_balanced_replication_order(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    int64_t load[12];
    for (int e = 0; e < 12; e++)
        load[e] = 100;
    load[5] = 400;
    load[9] = 200;
    /* by hand from the rule: 400/1 -> e5 (2 copies, 200 each); 200/1 (e9) ties 400/2 (e5):
     * lower id e5 (3 copies, 133.3); then 200/1 (e9) -> e9 (2 copies) */
    int32_t p2l[16], rn[4];
    moe_placement p;
    assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 12, 4, 3, load, p2l, rn, &p), MOE_OK);
    check_rules(&p, 12, 4, 3, 1);
    int reps[12] = {0};
    for (int i = 0; i < 15; i++)
        reps[p2l[i]]++;
    for (int e = 0; e < 12; e++)
        assert_int_equal(reps[e], e == 5 ? 3 : e == 9 ? 2 : 1);
    moe_ctx_free(ctx);
}

/* Issue 18's target: 128 experts, the hottest 8 take half of the rows, the other 120 share
 * the rest evenly; 8 redundant slots. Hot experts at ids 0..7 (contiguous's worst case: all
 * on rank 0) and spread (every 16th id). */
static void test_target_distribution(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    enum { NE = 128, HOT = 8 };
    const int64_t total = 240000; /* hot: 120000 / 8 = 15000 each; cold: 120000 / 120 = 1000 */
    for (int spread = 0; spread < 2; spread++) {
        int64_t load[NE];
        for (int e = 0; e < NE; e++)
            load[e] = (total / 2) / (NE - HOT);
        for (int h = 0; h < HOT; h++)
            load[spread ? h * 16 + 3 : h] = (total / 2) / HOT;
        for (int ep = 2; ep <= 4; ep++) {
            int32_t p2l[NE + HOT], rn[4], c2l[NE], crn[4];
            moe_placement bal, con;
            double rows[4], crows[4];
            assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, NE, ep, HOT, load, p2l, rn, &bal), MOE_OK);
            check_rules(&bal, NE, ep, HOT, 1);
            assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, NE, ep, 0, NULL, c2l, crn, &con), MOE_OK);
            const double ib = predicted_imbalance(&bal, load, rows);
            const double ic = predicted_imbalance(&con, load, crows);
            double lib_b, lib_c;
            int64_t ir[4];
            assert_int_equal(moe_placement_rank_rows(ctx, &bal, load, ir, &lib_b), MOE_OK);
            assert_int_equal(moe_placement_rank_rows(ctx, &con, load, ir, &lib_c), MOE_OK);
            print_message("hot experts %s, ep_size %d: max/mean rows contiguous %.4f, balanced (8 redundant) %.4f "
                          "(rank_rows: %.4f, %.4f)\n",
                          spread ? "3, 19, 35, ..." : "0..7", ep, ic, ib, lib_c, lib_b);
            assert_true(ib <= 1.15);
            assert_true(ib <= ic + 1e-12);
            assert_true(lib_b <= ib + 1e-3 && lib_b >= ib - 1e-3);
            assert_true(lib_c <= ic + 1e-3 && lib_c >= ic - 1e-3);
        }
    }
    moe_ctx_free(ctx);
}

static void test_bad_input(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    int64_t load[20];
    for (int e = 0; e < 20; e++)
        load[e] = 10;
    int32_t p2l[64], rn[21];
    moe_placement p;
    load[17] = -3;
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 20, 2, 2, load, p2l, rn, &p), MOE_EINVAL,
                 "load[17] = -3", "counts must be in [0, 2^40]");
    load[17] = 10;
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 20, 2, 21, load, p2l, rn, &p), MOE_EINVAL,
                 "num_redundant_experts = 21", "[0, 20]");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 20, 2, -1, load, p2l, rn, &p), MOE_EINVAL,
                 "num_redundant_experts = -1");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, 20, 2, 1, NULL, p2l, rn, &p), MOE_EINVAL,
                 "num_redundant_experts = 1", "contiguous");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_ROUND_ROBIN, 20, 2, 3, NULL, p2l, rn, &p), MOE_EINVAL,
                 "round_robin");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 20, 0, 0, load, p2l, rn, &p), MOE_EINVAL,
                 "ep_size = 0");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 20, 21, 0, load, p2l, rn, &p), MOE_EINVAL,
                 "ep_size = 21", "num_experts (20)");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_BALANCED, 20, 2, 0, NULL, p2l, rn, &p), MOE_EINVAL,
                 "balanced needs load");
    expect_error(ctx, moe_placement_build(ctx, (moe_placement_policy)7, 20, 2, 0, load, p2l, rn, &p), MOE_EINVAL,
                 "policy = 7");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, 0, 1, 0, NULL, p2l, rn, &p), MOE_EINVAL,
                 "num_experts = 0");
    expect_error(ctx, moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, 20, 2, 0, NULL, NULL, rn, &p), MOE_EINVAL,
                 "physical_to_logical is NULL");

    /* rank_rows: a negative load, a logical id out of range, a missing logical expert */
    assert_int_equal(moe_placement_build(ctx, MOE_PLACEMENT_CONTIGUOUS, 20, 2, 0, NULL, p2l, rn, &p), MOE_OK);
    int64_t rows[2];
    double imb;
    load[4] = -1;
    expect_error(ctx, moe_placement_rank_rows(ctx, &p, load, rows, &imb), MOE_EINVAL, "load[4] = -1");
    load[4] = 10;
    p2l[3] = 20;
    expect_error(ctx, moe_placement_rank_rows(ctx, &p, load, rows, &imb), MOE_EINVAL, "physical expert 3",
                 "logical expert 20");
    p2l[3] = 4;
    expect_error(ctx, moe_placement_rank_rows(ctx, &p, load, rows, &imb), MOE_EINVAL, "logical expert 3 has no");
    p2l[3] = 3;
    assert_int_equal(moe_placement_rank_rows(ctx, &p, load, rows, &imb), MOE_OK);
    assert_int_equal(rows[0], 100);
    assert_int_equal(rows[1], 100);
    assert_true(imb == 1.0);
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contiguous_is_todays_split), cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_balanced_rules),             cmocka_unit_test(test_balanced_replication_order),
        cmocka_unit_test(test_target_distribution),        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
