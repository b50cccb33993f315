/* TP shards of quantized source matrices (src/quant/quant.c moe_quant_slice_source, used by
 * the weight builder src/layer/weights.c under tensor parallelism): for every scheme and for shard boundaries
 * that cut a block or group (R11: a 128x128 block cut at 64, a [16, 16] block cut at 12, int4
 * groups of 32 cut at an odd column), the dequantized slice equals the slice of the
 * dequantized whole matrix bit for bit, and the re-expressed cell sizes are the expected ones. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "quant/format.h"
#include "quant/quant.h"
#include "testutil.h"

/* One case: a [N, K] source quantized from wide-range random values; the slice rows
 * [n0, n0 + Ns), columns [k0, k0 + Ks). want_bn / want_bk / want_g: expected re-expressed
 * block_n, block_k (BLOCK) or group_size (GROUP); 0 = not checked. */
static void slice_case(const moe_qweight *qw, int64_t N, int64_t K, int64_t n0, int64_t Ns, int64_t k0, int64_t Ks,
                       int64_t want_bn, int64_t want_bk, int64_t want_g)
{
    float *w = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] */
    tu_fill_uniform(w, (size_t)(N * K), (uint64_t)(N * 131 + K * 7 + n0 + k0), -1.0f, 1.0f);
    /* R12: magnitudes over a wide exponent range so that a misaddressed scale shows */
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++)
            w[n * K + k] = ldexpf(w[n * K + k], (int)((n * 5 + k / 3) % 13) - 6);
    size_t cb, sb, zb;
    moe_quant_source_sizes(qw, N, K, &cb, &sb, &zb);
    void *codes = malloc(cb), *scale = malloc(sb);
    uint8_t *zero = zb ? malloc(zb) : NULL;
    assert_int_equal(moe_quant_quantize_source(qw, w, N, K, codes, scale, zero), 0);
    float *full = malloc(sizeof(float) * (size_t)(N * K)); /* [N, K] dequantized */
    moe_quant_dequant_source(qw, codes, scale, zero, N, K, full);

    moe_qweight sq;
    assert_int_equal(moe_quant_slice_qweight(qw, n0, Ns, k0, Ks, &sq), 0);
    if (want_bn)
        assert_int_equal(sq.block_n, want_bn);
    if (want_bk)
        assert_int_equal(sq.block_k, want_bk);
    if (want_g)
        assert_int_equal(sq.group_size, want_g);
    size_t scb, ssb, szb;
    moe_quant_source_sizes(&sq, Ns, Ks, &scb, &ssb, &szb);
    void *scodes = malloc(scb), *sscale = malloc(ssb);
    uint8_t *szero = szb ? malloc(szb) : NULL;
    moe_quant_slice_source(qw, codes, scale, zero, N, K, n0, k0, &sq, Ns, Ks, scodes, sscale, szero);
    float *got = malloc(sizeof(float) * (size_t)(Ns * Ks)); /* [Ns, Ks] */
    moe_quant_dequant_source(&sq, scodes, sscale, szero, Ns, Ks, got);
    for (int64_t n = 0; n < Ns; n++)
        for (int64_t k = 0; k < Ks; k++) {
            float a = got[n * Ks + k], b = full[(n0 + n) * K + k0 + k];
            if (memcmp(&a, &b, sizeof a) != 0)
                fail_msg("dtype %d scale %d: slice rows %lld+%lld cols %lld+%lld of [%lld, %lld]: element (%lld, %lld) "
                         "%.9g, whole matrix %.9g",
                         (int)qw->dtype, (int)qw->scale, (long long)n0, (long long)Ns, (long long)k0, (long long)Ks,
                         (long long)N, (long long)K, (long long)n, (long long)k, (double)a, (double)b);
        }
    free(w);
    free(codes);
    free(scale);
    free(zero);
    free(full);
    free(scodes);
    free(sscale);
    free(szero);
    free(got);
}

static void test_slice_block(void **state)
{
    (void)state;
    moe_qweight qw = {.dtype = MOE_QTYPE_F8_E4M3, .scale = MOE_QSCALE_BLOCK, .block_n = 128, .block_k = 128};
    /* R11: Qwen3-30B-A3B-FP8 at TP 4 (I = 768 -> 192 per shard), scaled down in H: the gate/up
     * rows of shard 1 [192, 384) and shard 3 [576, 768), the down columns of the same */
    slice_case(&qw, 768, 80, 192, 192, 0, 80, 64, 128, 0);
    slice_case(&qw, 768, 80, 576, 192, 0, 80, 64, 128, 0);
    slice_case(&qw, 48, 768, 0, 48, 192, 192, 128, 64, 0);
    slice_case(&qw, 48, 768, 0, 48, 384, 192, 128, 128, 0); /* starts on a boundary: unchanged */
    /* I = 384 at TP 2 -> 192: shard 1 starts mid block */
    slice_case(&qw, 40, 384, 0, 40, 192, 192, 128, 64, 0);
    /* a shard inside one block keeps the block */
    slice_case(&qw, 40, 384, 0, 40, 130, 100, 128, 128, 0);
    /* small blocks [16, 16] with I = 24 at TP 2: shard 1 starts at 12 -> cells of 4 */
    qw.block_n = 16;
    qw.block_k = 16;
    slice_case(&qw, 24, 40, 12, 12, 0, 40, 4, 16, 0);
    slice_case(&qw, 40, 24, 0, 40, 12, 12, 16, 4, 0);
    /* non-square blocks, uneven shard */
    qw.block_n = 8;
    qw.block_k = 24;
    slice_case(&qw, 30, 70, 11, 10, 33, 37, 1, 3, 0);
    /* int8 with blocks */
    qw.dtype = MOE_QTYPE_I8;
    slice_case(&qw, 30, 70, 10, 20, 36, 34, 2, 12, 0);
}

static void test_slice_channel_tensor(void **state)
{
    (void)state;
    moe_qweight qw = {.dtype = MOE_QTYPE_I8, .scale = MOE_QSCALE_CHANNEL};
    slice_case(&qw, 42, 40, 21, 21, 0, 40, 0, 0, 0);
    slice_case(&qw, 40, 42, 0, 40, 21, 21, 0, 0, 0);
    qw.dtype = MOE_QTYPE_F8_E4M3;
    qw.scale = MOE_QSCALE_TENSOR;
    slice_case(&qw, 42, 40, 7, 20, 3, 30, 0, 0, 0);
    qw.dtype = MOE_QTYPE_INT4;
    qw.scale = MOE_QSCALE_CHANNEL;
    slice_case(&qw, 40, 42, 0, 40, 21, 20, 0, 0, 0); /* odd k0: the nibble pairs are re-paired */
}

static void test_slice_group(void **state)
{
    (void)state;
    moe_qweight qw = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 32};
    slice_case(&qw, 40, 128, 0, 40, 64, 64, 0, 0, 32);  /* on a boundary */
    slice_case(&qw, 40, 128, 0, 40, 48, 80, 0, 0, 16);  /* cut: gcd(32, 48) */
    slice_case(&qw, 40, 128, 0, 40, 33, 60, 0, 0, 1);   /* odd start: single columns, re-paired */
    slice_case(&qw, 24, 64, 5, 12, 0, 64, 0, 0, 32);    /* rows only */
    qw.has_zero_point = 1;
    slice_case(&qw, 40, 128, 0, 40, 48, 80, 0, 0, 16);
    slice_case(&qw, 40, 128, 0, 40, 33, 60, 0, 0, 1);
    qw.has_zero_point = 0;
    qw.dtype = MOE_QTYPE_MXFP4;
    slice_case(&qw, 40, 128, 0, 40, 64, 64, 0, 0, 32);
    slice_case(&qw, 40, 128, 0, 40, 16, 112, 0, 0, 16);
    qw.dtype = MOE_QTYPE_I8;
    qw.group_size = 24;
    slice_case(&qw, 20, 100, 0, 20, 50, 50, 0, 0, 2);
}

static void test_slice_refused(void **state)
{
    (void)state;
    moe_qweight qw = {.dtype = MOE_QTYPE_INT4, .scale = MOE_QSCALE_GROUP, .group_size = 32}, sq;
    assert_int_equal(moe_quant_slice_qweight(&qw, 0, 40, 32, 31, &sq), -1); /* odd width of 4-bit codes */
    qw.dtype = MOE_QTYPE_MXFP4;
    assert_int_equal(moe_quant_slice_qweight(&qw, 0, 40, 32, 15, &sq), -1);
    qw.dtype = MOE_QTYPE_I8;
    assert_int_equal(moe_quant_slice_qweight(&qw, 0, 40, 32, 31, &sq), 0); /* bytes: any width */
    assert_int_equal(moe_quant_slice_qweight(&qw, 0, 0, 0, 8, &sq), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice_block),
        cmocka_unit_test(test_slice_channel_tensor),
        cmocka_unit_test(test_slice_group),
        cmocka_unit_test(test_slice_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
