#include "testutil.h"
#include "gemm/kernels.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

char *tu_data_path(char *buf, size_t len, const char *rel)
{
    const char *d = getenv("LIBMOE_TEST_DATA");
    snprintf(buf, len, "%s/%s", d ? d : "tests/fixtures", rel);
    return buf;
}

char *tu_tmpdir(char *buf, size_t len, const char *tag)
{
    const char *d = getenv("LIBMOE_TEST_TMP");
    snprintf(buf, len, "%s/%s-XXXXXX", d ? d : "/tmp", tag);
    if (!mkdtemp(buf)) {
        fail_msg("mkdtemp %s failed", buf);
    }
    return buf;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void tu_fill_uniform(float *x, size_t n, uint64_t seed, float lo, float hi)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0);
        x[i] = (float)(lo + (hi - lo) * u);
    }
}

double tu_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d))
            return INFINITY;
        if (d > m)
            m = d;
    }
    return m;
}

double tu_max_abs(const float *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)a[i]) > m)
            m = fabs((double)a[i]);
    return m;
}

double tu_check_reassoc(const char *what, const float *got, const float *want, size_t n)
{
    const double rel = tu_max_abs_diff(got, want, n) / tu_max_abs(want, n);
    if (!(rel <= TU_REASSOC_REL))
        fail_msg("%s: %g of max |output| from the f32 path on the dequantized weights (bound %g)", what, rel,
                 TU_REASSOC_REL);
    return rel;
}

uint32_t tu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float tu_f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint64_t tu_xorshift(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

int tu_same_bits(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tu_f32_bits(a[i]) != tu_f32_bits(b[i]) && !(isnan(a[i]) && isnan(b[i])))
            return 0;
    return 1;
}

int tu_table_ok(const struct moe_kernels *t)
{
    return t != NULL;
}

size_t tu_tables(const struct moe_kernels **out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < moe_isa_rows() && n < max; i++)
        out[n++] = moe_isa_kernels(i);
    return n;
}

size_t tu_isa_names(const char **names, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < moe_isa_count() && n < max; i++) {
        moe_isa_info info;
        if (moe_isa_describe(i, &info) == MOE_OK)
            names[n++] = info.name;
    }
    return n;
}

const struct moe_kernels *tu_table(const char *name)
{
    const int i = moe_isa_find(name);
    return i < 0 ? NULL : moe_isa_kernels((size_t)i);
}

moe_checkpoint *tu_open_layer(moe_ctx *ctx, const char *dir, int64_t layer, moe_layer_desc *d)
{
    moe_checkpoint *ck = NULL;
    if (moe_checkpoint_open(ctx, dir, &ck) != MOE_OK)
        fail_msg("open %s: %s", dir, moe_ctx_last_error(ctx));
    if (moe_checkpoint_layer_desc(ck, layer, d) != MOE_OK)
        fail_msg("layer_desc %s layer %lld: %s", dir, (long long)layer, moe_ctx_last_error(ctx));
    return ck;
}

moe_status tu_load_layer_status(moe_ctx *ctx, const char *dir, int64_t layer)
{
    moe_checkpoint *ck = NULL;
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_layer_desc d;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK)
        st = moe_checkpoint_layer_desc(ck, layer, &d);
    if (st == MOE_OK)
        st = moe_plan_create(ctx, &d, &plan);
    if (st == MOE_OK)
        st = moe_checkpoint_load_weights(ck, layer, plan, &w);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    return st;
}

void tu_join(char *buf, size_t n, const char *a, const char *b)
{
    if ((size_t)snprintf(buf, n, "%s/%s", a, b) >= n)
        fail_msg("path too long: %s/%s", a, b);
}

int tu_dir_entries(const char *d)
{
    DIR *dd = opendir(d);
    if (!dd)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dd)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            n++;
    closedir(dd);
    return n;
}

static void tu_log_capture(moe_log_level level, const char *msg, void *user)
{
    tu_logcap *c = user;
    (void)level;
    size_t n = strlen(c->text);
    snprintf(c->text + n, sizeof c->text - n, "%s\n", msg);
}

moe_ctx *tu_ctx_logging(tu_logcap *cap, moe_log_level level)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 1;
    o.log_level = level;
    o.log_fn = tu_log_capture;
    o.log_user = cap;
    moe_ctx *ctx = NULL;
    char err[512];
    if (moe_ctx_create(&o, &ctx, err, sizeof err) != MOE_OK)
        fail_msg("moe_ctx_create: %s", err);
    return ctx;
}

int tu_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(data, 1, len, f);
    int rc = fclose(f);
    return (w == len && rc == 0) ? 0 : -1;
}

moe_ctx *tu_ctx(void)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = 1;
    moe_ctx *ctx = NULL;
    char err[512];
    moe_status st = moe_ctx_create(&o, &ctx, err, sizeof err);
    if (st != MOE_OK)
        fail_msg("moe_ctx_create: %s", err);
    return ctx;
}

void tu_check_error(moe_ctx *ctx, moe_status got, moe_status want, const char *const *subs)
{
    const char *msg = moe_ctx_last_error(ctx);
    if (got != want)
        fail_msg("status %s, want %s; message: %s", moe_status_name(got), moe_status_name(want), msg);
    for (size_t i = 0; subs[i]; i++)
        if (!strstr(msg, subs[i]))
            fail_msg("message \"%s\" lacks \"%s\"", msg, subs[i]);
}

void tu_rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            tu_rm_tree(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static char g_tmp_root[512];

int tu_group_tmp_setup(void **state)
{
    (void)state;
    tu_tmpdir(g_tmp_root, sizeof g_tmp_root, "libmoe-test");
    return setenv("LIBMOE_TEST_TMP", g_tmp_root, 1);
}

int tu_group_tmp_teardown(void **state)
{
    (void)state;
    tu_rm_tree(g_tmp_root);
    return 0;
}

void tu_run_layer_ex(moe_ctx *ctx, const moe_layer_desc *d, const moe_plan_config *cfg, moe_checkpoint *ck,
                     int64_t layer, const moe_weight_source *src, const void *x, moe_dtype xdt, int64_t T, float *out,
                     int32_t *ids, float *wts)
{
    moe_plan *plan = NULL;
    moe_weights *w = NULL;
    moe_status st = cfg ? moe_plan_create_ex(ctx, d, cfg, &plan) : moe_plan_create(ctx, d, &plan);
    if (st == MOE_OK)
        st = ck ? moe_checkpoint_load_weights(ck, layer, plan, &w) : moe_weights_create(plan, src, &w);
    if (st != MOE_OK)
        fail_msg("%s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    const size_t ws = moe_plan_workspace_size(plan, T);
    void *wsp = aligned_alloc(64, (ws + 63) / 64 * 64 + 64); /* workspace, 64-byte aligned */
    moe_exec_args a = {.hidden_states = x, .hidden_dtype = xdt, .n_tokens = T, .output = out,
                       .topk_ids = ids, .topk_weights = wts, .workspace = wsp, .workspace_size = ws};
    st = moe_plan_execute_ex(plan, w, &a);
    if (st != MOE_OK)
        fail_msg("%s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    free(wsp);
    moe_weights_free(w);
    moe_plan_free(plan);
}

void tu_run_layer(moe_ctx *ctx, const moe_layer_desc *d, const moe_plan_config *cfg, const moe_weight_source *src,
                  const float *x, int64_t T, float *out)
{
    tu_run_layer_ex(ctx, d, cfg, NULL, 0, src, x, MOE_DTYPE_F32, T, out, NULL, NULL);
}
