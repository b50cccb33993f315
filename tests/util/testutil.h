/* Helpers shared by the C tests. */
#ifndef MOE_TESTUTIL_H
#define MOE_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

/* $LIBMOE_TEST_DATA/<rel> (fixtures folder) into buf. Returns buf. */
char *tu_data_path(char *buf, size_t len, const char *rel);
/* A fresh empty directory under $LIBMOE_TEST_TMP (or /tmp) whose name starts with `tag`. */
char *tu_tmpdir(char *buf, size_t len, const char *tag);
/* Deterministic uniform floats in [lo, hi) from a 64-bit seed (splitmix64). */
void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi);
/* Weight-only quantized layers against the f32 layer on the dequantized weights: the kernels
 * apply each scale after its group's dot product (docs/numerics.md section 5), an f32
 * reassociation of the same sums, so outputs agree to a few f32 ulps of the largest terms (the
 * tests measure 1e-7 .. 1e-6 of max |output|); a misread code, scale or zero point is off by
 * orders of magnitude more. Bound on max |a - b| / max |b|. */
#define TU_REASSOC_REL 1e-5
/* Fail (naming `what`) unless max |got - want| <= TU_REASSOC_REL * max |want| (NaN fails);
 * returns the ratio. */
double tu_check_reassoc(const char *what, const float *got, const float *want, size_t n);
/* max_i |a_i - b_i| and max_i |b_i| */
double tu_max_abs_diff(const float *a, const float *b, size_t n);
double tu_max_abs(const float *a, size_t n);
/* Write a file with the given bytes; returns 0 on success. */
int tu_write_file(const char *path, const void *data, size_t len);
/* Fail unless `got` == `want` and ctx's last error message contains every string of the
 * NULL-terminated list `subs`. expect_error(ctx, got, want, "a", "b") builds the list. */
void tu_check_error(moe_ctx *ctx, moe_status got, moe_status want, const char *const *subs);
#define expect_error(ctx, got, want, ...) \
    tu_check_error((ctx), (got), (want), (const char *const[]){__VA_ARGS__, NULL})
/* The bits of f. */
uint32_t tu_f32_bits(float f);
/* The float of bits u. */
float tu_f32_of(uint32_t u);
/* The next value of a xorshift64 generator (13, 7, 17) whose state is *state (nonzero). */
uint64_t tu_xorshift(uint64_t *state);
/* 1 when a[i] and b[i] have the same bits for every i < n, NaN == NaN whatever its payload. */
int tu_same_bits(const float *a, const float *b, size_t n);
/* The kernel registry (src/gemm/kernels.h), row by row: out[i] = row i's table, or NULL when
 * this CPU cannot run it; returns the number of rows (at most max). */
struct moe_kernels;
size_t tu_tables(const struct moe_kernels **out, size_t max);
/* The names of the kernel registry's rows (moe_isa_count / moe_isa_describe), runnable here or
 * not (a ctx for one this CPU lacks fails with "does not support"); returns their count. */
size_t tu_isa_names(const char **names, size_t max);
/* The table of the row named `name`, or NULL (no such row, or not runnable here). */
const struct moe_kernels *tu_table(const char *name);
/* 1 when kernel table t (from tu_tables / tu_table) can run on this CPU (t non-NULL). */
int tu_table_ok(const struct moe_kernels *t);
/* moe_checkpoint_open(dir) and moe_checkpoint_layer_desc(layer) into *d; fails the test with
 * the library's message on error. */
moe_checkpoint *tu_open_layer(moe_ctx *ctx, const char *dir, int64_t layer, moe_layer_desc *d);
/* moe_checkpoint_open(dir), moe_checkpoint_layer_desc(layer), moe_plan_create and
 * moe_checkpoint_load_weights: the first status that is not MOE_OK (the message stays in ctx),
 * else MOE_OK; everything created is freed. */
moe_status tu_load_layer_status(moe_ctx *ctx, const char *dir, int64_t layer);
/* buf = a "/" b; fails the test when it does not fit. */
void tu_join(char *buf, size_t n, const char *a, const char *b);
/* Number of entries of folder d (without . and ..); -1 if it cannot be opened. */
int tu_dir_entries(const char *d);
/* Log lines captured by tu_ctx_logging's context, each followed by a newline (truncated at
 * the buffer's end). */
typedef struct tu_logcap {
    char text[8192];
} tu_logcap;
/* A one-thread context at log level `level` whose messages are appended to cap->text. */
moe_ctx *tu_ctx_logging(tu_logcap *cap, moe_log_level level);
/* Remove folder `dir` and everything below it (tests leave no temp files behind). */
void tu_rm_tree(const char *dir);
/* cmocka group setup/teardown: every test's temporary folders (tu_tmpdir) go under one fresh
 * root, removed with everything in it when the group ends. */
int tu_group_tmp_setup(void **state);
int tu_group_tmp_teardown(void **state);
/* A context with defaults and one thread; fails the test on error. */
moe_ctx *tu_ctx(void);
/* One forward of the layer d (plan config cfg, or NULL for the defaults) on weights src:
 * x [T, H] f32 -> out [T, H]; fails the test, naming the status and message, on error. */
void tu_run_layer(moe_ctx *ctx, const moe_layer_desc *d, const moe_plan_config *cfg, const moe_weight_source *src,
                  const float *x, int64_t T, float *out);
/* The same with the weights of checkpoint layer `layer` when ck is set (else src), hidden
 * states x [T, H] of dtype xdt, and topk_ids / topk_weights [T, K] (each may be NULL). */
void tu_run_layer_ex(moe_ctx *ctx, const moe_layer_desc *d, const moe_plan_config *cfg, moe_checkpoint *ck,
                     int64_t layer, const moe_weight_source *src, const void *x, moe_dtype xdt, int64_t T, float *out,
                     int32_t *ids, float *wts);

#endif
