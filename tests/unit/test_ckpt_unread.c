/* Checkpoint tensors libmoe does not read, and reading a checkpoint as a named family
 * (moe_checkpoint_options: strict, family; moe run / plan / bench --strict, --family).
 *
 * Fixtures are made at test time from the transformers fixtures (tests/fixtures), in a
 * temporary folder:
 *  - qwen3_moe_f32 with a Qwen2-MoE style shared expert added (shared_expert.{gate,up,down}_proj
 *    and shared_expert_gate, random values): the qwen3_moe row reads no shared expert, so the
 *    four tensors are named in one WARNING (layer, count, names, a hint at --family), the
 *    output is bit-identical to the original fixture's (they are ignored, as warned), and
 *    strict refuses them (MOE_EFORMAT; `moe run --strict` exits 1 naming them, writing no
 *    output);
 *  - the same with four more unknown tensors under the block: the message lists six and says
 *    "and 2 more"; a tensor outside the block (self_attn) is never named;
 *  - qwen2_moe_f32 with shared_expert_intermediate_size set to 0: its shared expert is then
 *    unread, the hint names the config field;
 *  - qwen2_moe_sharded_f32 with one more shard holding an unknown tensor under layer 1's
 *    block and one under layer 10's, listed in weight_map: the first is found through the
 *    index, the second (another prefix) and the dense layer 0's MLP are not named;
 *  - qwen3_moe_f32 whose config.json names an architecture libmoe does not know (and lacks
 *    fields whose qwen3_moe defaults equal the fixture's values): refused without a family
 *    (the message points at --family); with family qwen3_moe it loads with a WARNING naming
 *    the architecture, the model_type, the family and each default assumed, and the output
 *    is bit-identical to the original fixture's; an unknown family is MOE_EINVAL listing the
 *    families; naming the family config.json already names warns nothing; naming another
 *    known family is allowed with the WARNING naming both, and that row reads config.json.
 *  - qwen3_moe_f32 whose config.json architecture, or a tensor name under the block, holds ESC,
 *    BEL, CR, LF or DEL: the error and every log line show them as escapes ("\x1b", "\n"),
 *    no raw control byte (terminal and log spoofing).
 *  - qwen3_moe_f32 with U8, U16, U32, U64, I8, I16, I64, F8_E5M2 and BOOL tensors outside the
 *    block: loads and runs bit-identical to the original; an expert weight stored as U32 or I32
 *    is MOE_EDTYPE naming the tensor.
 * Every fixture folder (every MoE layer, layer_desc and load_weights) loads under strict with
 * no WARNING: the loader's record of what it reads is complete for every layout and format
 * the fixtures hold. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/families.h"
#include "moe.h"
#include "testutil.h"

#define PFX "model.layers.0.mlp."
#define PFX1 "model.layers.1.mlp."

/* ---- fixture copies -------------------------------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        fail_msg("%s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out)
        fail_msg("%s: %s", to, strerror(errno));
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* A fresh temporary folder holding every regular file of fixture `name`; into dir [n]. */
static void copy_fixture(const char *name, char *dir, size_t n)
{
    char src[1024];
    tu_data_path(src, sizeof src, name);
    tu_tmpdir(dir, n, name);
    DIR *d = opendir(src);
    if (!d)
        fail_msg("%s: %s", src, strerror(errno));
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char a[2200], b[2200];
        struct stat st;
        tu_join(a, sizeof a, src, de->d_name);
        if (stat(a, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        tu_join(b, sizeof b, dir, de->d_name);
        copy_file(a, b);
    }
    closedir(d);
}

/* One tensor to add: [d0, d1], F32 filled uniform in [-1, 1) (or of another dtype, below). */
typedef struct extra_tensor {
    const char *name;
    int64_t d0, d1;
} extra_tensor;

/* Rewrite dir/<file> with every tensor it holds plus extras [n_extra] of dtypes [n_extra] (NULL:
 * all F32; another dtype than F32 holds pseudo-random bytes), tensor `retype` (if not NULL)
 * given dtype `as` instead of its own (same element size: its bytes kept). */
static void add_retyped(const char *dir, const char *file, const extra_tensor *extras, const moe_dtype *dtypes,
                        size_t n_extra, const char *retype, moe_dtype as)
{
    char path[2200];
    tu_join(path, sizeof path, dir, file);
    moe_ctx *ctx = tu_ctx();
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    const size_t n_old = moe_safetensors_count(f);
    moe_tensor_out *t = calloc(n_old + n_extra, sizeof *t); /* [n_old + n_extra] */
    float **bufs = calloc(n_extra ? n_extra : 1, sizeof *bufs); /* [n_extra] each [d0 * d1] */
    assert_non_null(t);
    assert_non_null(bufs);
    for (size_t i = 0; i < n_old; i++) {
        moe_tensor_info ti;
        assert_int_equal(moe_safetensors_at(f, i, &ti), MOE_OK);
        t[i] = (moe_tensor_out){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim, .data = ti.data};
        memcpy(t[i].shape, ti.shape, sizeof ti.shape);
        if (retype && strcmp(ti.name, retype) == 0) {
            assert_int_equal(moe_dtype_size(as), moe_dtype_size(ti.dtype));
            t[i].dtype = as;
        }
    }
    for (size_t j = 0; j < n_extra; j++) {
        const size_t numel = (size_t)(extras[j].d0 * extras[j].d1);
        const moe_dtype dt = dtypes ? dtypes[j] : MOE_DTYPE_F32;
        const size_t es = moe_dtype_size(dt);
        bufs[j] = malloc(numel * es + 8);
        assert_non_null(bufs[j]);
        if (dt == MOE_DTYPE_F32) {
            tu_fill_uniform(bufs[j], numel, 1000 + j, -1.0f, 1.0f);
        } else {
            uint64_t seed = 1000 + j;
            unsigned char *b = (unsigned char *)bufs[j];
            for (size_t k = 0; k < numel * es; k++)
                b[k] = (unsigned char)(tu_xorshift(&seed) >> 56);
            if (dt == MOE_DTYPE_BOOL)
                for (size_t k = 0; k < numel; k++)
                    b[k] &= 1;
        }
        t[n_old + j] = (moe_tensor_out){.name = extras[j].name, .dtype = dt, .ndim = 2,
                                        .shape = {extras[j].d0, extras[j].d1}, .data = bufs[j]};
    }
    /* written beside and renamed over the old file, whose mapping stays valid meanwhile */
    assert_int_equal(moe_safetensors_write(ctx, path, t, n_old + n_extra), MOE_OK);
    moe_safetensors_free(f);
    for (size_t j = 0; j < n_extra; j++)
        free(bufs[j]);
    free(bufs);
    free(t);
    moe_ctx_free(ctx);
}

static void add_tensors(const char *dir, const char *file, const extra_tensor *extras, size_t n_extra)
{
    add_retyped(dir, file, extras, NULL, n_extra, NULL, MOE_DTYPE_F32);
}

static json_t *load_json_file(const char *dir, const char *file)
{
    char path[2200];
    tu_join(path, sizeof path, dir, file);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j)
        fail_msg("%s: %s", path, e.text);
    return j;
}

static void save_json_file(json_t *j, const char *dir, const char *file)
{
    char path[2200];
    tu_join(path, sizeof path, dir, file);
    assert_int_equal(json_dump_file(j, path, JSON_INDENT(2)), 0);
    json_decref(j);
}

/* qwen3_moe_f32 (H 40) plus a shared expert of I_s 16 under its block, and `more` unknown
 * [1, 40] tensors "model.layers.0.mlp.unknown_<i>.weight", and one tensor outside the block. */
static void make_shared_extra(char *dir, size_t n, int more)
{
    copy_fixture("qwen3_moe_f32", dir, n);
    static const char *const unknown[] = {PFX "unknown_0.weight", PFX "unknown_1.weight", PFX "unknown_2.weight",
                                          PFX "unknown_3.weight"};
    extra_tensor x[9] = {
        {PFX "shared_expert.gate_proj.weight", 16, 40},
        {PFX "shared_expert.up_proj.weight", 16, 40},
        {PFX "shared_expert.down_proj.weight", 40, 16},
        {PFX "shared_expert_gate.weight", 1, 40},
        {"model.layers.0.self_attn.unknown_outside.weight", 1, 40},
    };
    assert_true(more <= 4);
    for (int i = 0; i < more; i++)
        x[5 + i] = (extra_tensor){unknown[i], 1, 40};
    add_tensors(dir, "model.safetensors", x, 5 + (size_t)more);
}

/* ---- running a layer ------------------------------------------------------------------- */

/* hidden_states of fixture `name`'s input.safetensors (F32 [T, H]) into a malloc'd *x. */
static float *fixture_input(const char *name, int64_t *T, int64_t *H)
{
    char dir[1024], path[2200];
    tu_data_path(dir, sizeof dir, name);
    tu_join(path, sizeof path, dir, "input.safetensors");
    moe_ctx *ctx = tu_ctx();
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    moe_tensor_info ti;
    assert_int_equal(moe_safetensors_get(f, "hidden_states", &ti), MOE_OK);
    assert_int_equal(ti.dtype, MOE_DTYPE_F32);
    assert_int_equal(ti.ndim, 2);
    *T = ti.shape[0];
    *H = ti.shape[1];
    float *x = malloc(ti.nbytes);
    assert_non_null(x);
    memcpy(x, ti.data, ti.nbytes);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
    return x;
}

/* Layer 0 of `dir` opened with `opt` (ctx's log captured by the caller), run on x [T, H]
 * into a malloc'd output [T, H]. */
static float *run_layer0(moe_ctx *ctx, const char *dir, const moe_checkpoint_options *opt, const float *x, int64_t T)
{
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open_opts(ctx, dir, opt, &ck);
    if (st != MOE_OK)
        fail_msg("%s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    moe_layer_desc d;
    if ((st = moe_checkpoint_layer_desc(ck, 0, &d)) != MOE_OK)
        fail_msg("%s: %s", moe_status_name(st), moe_ctx_last_error(ctx));
    float *out = malloc(sizeof(float) * (size_t)(T * d.hidden_size));
    assert_non_null(out);
    tu_run_layer_ex(ctx, &d, NULL, ck, 0, NULL, x, MOE_DTYPE_F32, T, out, NULL, NULL);
    moe_checkpoint_free(ck);
    return out;
}

static int count_of(const char *text, const char *sub)
{
    int n = 0;
    for (const char *p = strstr(text, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

/* ---- unread tensors: API ----------------------------------------------------------------- */

static const char *const SHARED_NAMES[4] = {PFX "shared_expert.gate_proj.weight", PFX "shared_expert.up_proj.weight",
                                           PFX "shared_expert.down_proj.weight", PFX "shared_expert_gate.weight"};

static void test_shared_expert_warned_and_ignored(void **state)
{
    (void)state;
    char dir[1024], orig[1024];
    make_shared_extra(dir, sizeof dir, 0);
    tu_data_path(orig, sizeof orig, "qwen3_moe_f32");
    int64_t T, H;
    float *x = fixture_input("qwen3_moe_f32", &T, &H);

    tu_logcap cap0 = {""}, cap1 = {""};
    moe_ctx *c0 = tu_ctx_logging(&cap0, MOE_LOG_WARN), *c1 = tu_ctx_logging(&cap1, MOE_LOG_WARN);
    float *want = run_layer0(c0, orig, NULL, x, T);
    float *got = run_layer0(c1, dir, NULL, x, T);
    assert_string_equal(cap0.text, ""); /* the original: nothing to say */
    /* one WARNING (layer_desc and load_weights both resolved the layer), naming all four */
    assert_int_equal(count_of(cap1.text, "not read"), 1);
    assert_non_null(strstr(cap1.text, "layer 0: 4 tensor(s) under '" PFX "' not read, ignored"));
    for (int i = 0; i < 4; i++)
        assert_non_null(strstr(cap1.text, SHARED_NAMES[i]));
    assert_non_null(strstr(cap1.text, "family qwen3_moe has no shared expert"));
    assert_non_null(strstr(cap1.text, "--family"));
    assert_null(strstr(cap1.text, "self_attn")); /* outside the block: not libmoe's */
    assert_null(strstr(cap1.text, "more"));
    /* ignored, as warned: the output is the original's, bit for bit */
    assert_true(tu_same_bits(got, want, (size_t)(T * H)));
    free(got);
    free(want);
    free(x);
    moe_ctx_free(c0);
    moe_ctx_free(c1);
}

static void test_shared_expert_strict(void **state)
{
    (void)state;
    char dir[1024];
    make_shared_extra(dir, sizeof dir, 0);
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint_options opt;
    moe_checkpoint_options_init(&opt);
    assert_int_equal(opt.strict, 0);
    assert_null(opt.family);
    opt.strict = 1;
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open_opts(ctx, dir, &opt, &ck), MOE_OK);
    moe_layer_desc d;
    moe_status st = moe_checkpoint_layer_desc(ck, 0, &d);
    expect_error(ctx, st, MOE_EFORMAT, "layer 0: 4 tensor(s) under '" PFX "' not read (refused: strict)",
                 SHARED_NAMES[0], SHARED_NAMES[1], SHARED_NAMES[2], SHARED_NAMES[3],
                 "family qwen3_moe has no shared expert");
    /* refused every time, not only the first */
    st = moe_checkpoint_layer_desc(ck, 0, &d);
    expect_error(ctx, st, MOE_EFORMAT, "refused: strict", SHARED_NAMES[0]);
    assert_null(strstr(cap.text, "not read")); /* an error, not a WARNING */

    /* load_weights refuses too (a plan from the description a lenient open gives) */
    moe_checkpoint *lenient = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &lenient), MOE_OK);
    assert_int_equal(moe_checkpoint_layer_desc(lenient, 0, &d), MOE_OK);
    moe_checkpoint_free(lenient);
    moe_plan *plan = NULL;
    assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
    moe_weights *w = NULL;
    st = moe_checkpoint_load_weights(ck, 0, plan, &w);
    expect_error(ctx, st, MOE_EFORMAT, "refused: strict", SHARED_NAMES[3]);
    assert_null(w);
    moe_plan_free(plan);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_many_unread_listed_with_more(void **state)
{
    (void)state;
    char dir[1024];
    make_shared_extra(dir, sizeof dir, 4);
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    /* header order: the four shared-expert tensors were written first, then unknown_0..3 */
    assert_non_null(strstr(cap.text, "8 tensor(s) under"));
    assert_non_null(strstr(cap.text, PFX "unknown_1.weight, and 2 more"));
    assert_null(strstr(cap.text, "unknown_2"));
    assert_null(strstr(cap.text, "self_attn"));
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_config_without_shared_expert(void **state)
{
    (void)state;
    char dir[1024];
    copy_fixture("qwen2_moe_f32", dir, sizeof dir);
    json_t *cfg = load_json_file(dir, "config.json");
    assert_true(json_integer_value(json_object_get(cfg, "shared_expert_intermediate_size")) > 0);
    json_object_set_new(cfg, "shared_expert_intermediate_size", json_integer(0));
    save_json_file(cfg, dir, "config.json");
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_int_equal(d.shared_expert_intermediate_size, 0);
    assert_non_null(strstr(cap.text, "4 tensor(s) under"));
    assert_non_null(strstr(cap.text, PFX "shared_expert.gate_proj.weight"));
    assert_non_null(strstr(cap.text, PFX "shared_expert_gate.weight"));
    assert_non_null(strstr(cap.text, "'shared_expert_intermediate_size' is 0 or absent"));
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_sharded_unread(void **state)
{
    (void)state;
    char dir[1024];
    copy_fixture("qwen2_moe_sharded_f32", dir, sizeof dir);
    json_t *ix = load_json_file(dir, "model.safetensors.index.json");
    json_t *wm = json_object_get(ix, "weight_map");
    assert_true(json_is_object(wm));
    /* layer 0 is dense here (its MLP's tensors are never named), layer 1 an MoE layer */
    assert_non_null(json_object_get(wm, "model.layers.0.mlp.gate_proj.weight"));
    assert_non_null(json_object_get(wm, PFX1 "gate.weight"));
    /* one more shard with a tensor under layer 1's block, and one under layer 10's, whose
     * name starts with the same characters but a different prefix */
    float v[4] = {1, 2, 3, 4};
    const moe_tensor_out t[2] = {
        {.name = PFX1 "experts.0.up_proj.bias", .dtype = MOE_DTYPE_F32, .ndim = 2, .shape = {1, 4}, .data = v},
        {.name = "model.layers.10.mlp.stray.weight", .dtype = MOE_DTYPE_F32, .ndim = 2, .shape = {1, 4}, .data = v},
    };
    char path[2200];
    tu_join(path, sizeof path, dir, "model-extra.safetensors");
    moe_ctx *wctx = tu_ctx();
    assert_int_equal(moe_safetensors_write(wctx, path, t, 2), MOE_OK);
    moe_ctx_free(wctx);
    json_object_set_new(wm, t[0].name, json_string("model-extra.safetensors"));
    json_object_set_new(wm, t[1].name, json_string("model-extra.safetensors"));
    save_json_file(ix, dir, "model.safetensors.index.json");

    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_EDENSE);
    assert_int_equal(moe_checkpoint_layer_desc(ck, 1, &d), MOE_OK);
    assert_non_null(strstr(cap.text, "layer 1: 1 tensor(s) under '" PFX1 "' not read, ignored: " PFX1
                                     "experts.0.up_proj.bias; family qwen2_moe does not read them"));
    assert_null(strstr(cap.text, "stray"));
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* Every fixture folder, every MoE layer, under strict: nothing refused, nothing warned. */
static void test_every_fixture_clean_under_strict(void **state)
{
    (void)state;
    char root[1024];
    tu_data_path(root, sizeof root, "");
    DIR *dd = opendir(root);
    assert_non_null(dd);
    struct dirent *de;
    int n_fixtures = 0, n_layers = 0;
    while ((de = readdir(dd)) != NULL) {
        char dir[2200], cfg[2300];
        tu_join(dir, sizeof dir, root, de->d_name);
        tu_join(cfg, sizeof cfg, dir, "config.json");
        if (de->d_name[0] == '.' || access(cfg, F_OK) != 0)
            continue;
        tu_logcap cap = {""};
        moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
        moe_checkpoint_options opt;
        moe_checkpoint_options_init(&opt);
        opt.strict = 1;
        moe_checkpoint *ck = NULL;
        moe_status st = moe_checkpoint_open_opts(ctx, dir, &opt, &ck);
        if (st != MOE_OK)
            fail_msg("%s: %s: %s", de->d_name, moe_status_name(st), moe_ctx_last_error(ctx));
        for (int64_t l = 0; l < moe_checkpoint_num_layers(ck); l++) {
            if (!moe_checkpoint_is_moe_layer(ck, l))
                continue;
            moe_layer_desc d;
            moe_plan *plan = NULL;
            moe_weights *w = NULL;
            if (moe_checkpoint_family(ck) == MOE_FAMILY_DEEPSEEK_V4 && l == 0) {
                /* its "hash_moe" layer (token-id routing) is refused by name, as run / load say */
                const char *const subs[] = {"layer 0", "'mlp_layer_types'[0] = \"hash_moe\"", "tid2eid[input_ids]",
                                            "in_topk_ids", "layer 1 is the first", NULL};
                tu_check_error(ctx, moe_checkpoint_layer_desc(ck, l, &d), MOE_EUNSUPPORTED, subs);
                /* and its weights, even into a plan of the score-routed layer's shape */
                assert_int_equal(moe_checkpoint_layer_desc(ck, 1, &d), MOE_OK);
                assert_int_equal(moe_plan_create(ctx, &d, &plan), MOE_OK);
                tu_check_error(ctx, moe_checkpoint_load_weights(ck, l, plan, &w), MOE_EUNSUPPORTED, subs);
                assert_null(w);
                moe_plan_free(plan);
                continue;
            }
            if ((st = moe_checkpoint_layer_desc(ck, l, &d)) == MOE_OK && (st = moe_plan_create(ctx, &d, &plan)) == MOE_OK)
                st = moe_checkpoint_load_weights(ck, l, plan, &w);
            if (st != MOE_OK)
                fail_msg("%s layer %lld: %s: %s", de->d_name, (long long)l, moe_status_name(st),
                         moe_ctx_last_error(ctx));
            moe_weights_free(w);
            moe_plan_free(plan);
            n_layers++;
        }
        if (strstr(cap.text, "not read"))
            fail_msg("%s: %s", de->d_name, cap.text);
        moe_checkpoint_free(ck);
        moe_ctx_free(ctx);
        n_fixtures++;
    }
    closedir(dd);
    print_message("%d fixtures, %d MoE layers: none refused under strict\n", n_fixtures, n_layers);
    assert_true(n_fixtures >= 27);
}

/* ---- naming the family: API -------------------------------------------------------------- */

/* qwen3_moe_f32 whose config.json names FooMoeForCausalLM / foo_moe, without the fields whose
 * qwen3_moe defaults are the fixture's values (decoder_sparse_step 1, mlp_only_layers [],
 * hidden_act silu); drop_norm also drops norm_topk_prob (true in the fixture, default false). */
static void make_unknown_arch(char *dir, size_t n, int drop_norm)
{
    copy_fixture("qwen3_moe_f32", dir, n);
    json_t *cfg = load_json_file(dir, "config.json");
    assert_int_equal(json_integer_value(json_object_get(cfg, "decoder_sparse_step")), 1);
    assert_int_equal(json_array_size(json_object_get(cfg, "mlp_only_layers")), 0);
    assert_string_equal(json_string_value(json_object_get(cfg, "hidden_act")), "silu");
    json_object_set_new(cfg, "architectures", json_pack("[s]", "FooMoeForCausalLM"));
    json_object_set_new(cfg, "model_type", json_string("foo_moe"));
    json_object_del(cfg, "decoder_sparse_step");
    json_object_del(cfg, "mlp_only_layers");
    json_object_del(cfg, "hidden_act");
    if (drop_norm)
        json_object_del(cfg, "norm_topk_prob");
    save_json_file(cfg, dir, "config.json");
}

static void test_family_for_unknown_architecture(void **state)
{
    (void)state;
    char dir[1024], orig[1024];
    make_unknown_arch(dir, sizeof dir, 0);
    tu_data_path(orig, sizeof orig, "qwen3_moe_f32");
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint *ck = NULL;
    /* without a family: refused, pointing at the option */
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    expect_error(ctx, st, MOE_EUNSUPPORTED, "architecture 'FooMoeForCausalLM' (model_type 'foo_moe') is not supported",
                 "--family NAME", "moe_checkpoint_options.family", "qwen3_moe");
    assert_null(ck);

    /* with it: a WARNING naming both and the defaults, and the original's output bit for bit */
    int64_t T, H;
    float *x = fixture_input("qwen3_moe_f32", &T, &H);
    moe_checkpoint_options opt;
    moe_checkpoint_options_init(&opt);
    opt.family = "qwen3_moe";
    float *got = run_layer0(ctx, dir, &opt, x, T);
    assert_int_equal(count_of(cap.text, "reading it as family"), 1);
    assert_non_null(strstr(cap.text, "names architecture 'FooMoeForCausalLM' (model_type 'foo_moe'), a family libmoe "
                                     "does not know; reading it as family qwen3_moe"));
    assert_non_null(strstr(cap.text, "taking family qwen3_moe's defaults: "));
    assert_non_null(strstr(cap.text, "decoder_sparse_step = 1"));
    assert_non_null(strstr(cap.text, "mlp_only_layers = none"));
    assert_non_null(strstr(cap.text, "hidden_act = \"silu\""));
    assert_null(strstr(cap.text, "norm_topk_prob")); /* given: not assumed */
    tu_logcap cap0 = {""};
    moe_ctx *c0 = tu_ctx_logging(&cap0, MOE_LOG_WARN);
    float *want = run_layer0(c0, orig, NULL, x, T);
    assert_true(tu_same_bits(got, want, (size_t)(T * H)));
    free(got);
    free(want);

    /* an architecture class names the row too */
    opt.family = "Qwen3MoeForCausalLM";
    assert_int_equal(moe_checkpoint_open_opts(ctx, dir, &opt, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_QWEN3_MOE);
    moe_checkpoint_free(ck);

    /* an unknown family: MOE_EINVAL listing them */
    opt.family = "qwen9_moe";
    st = moe_checkpoint_open_opts(ctx, dir, &opt, &ck);
    expect_error(ctx, st, MOE_EINVAL, "unknown family 'qwen9_moe'", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
                 "gpt_oss", "llama4", "qwen3_next");
    assert_null(ck);
    free(x);
    moe_ctx_free(c0);
    moe_ctx_free(ctx);
}

static void test_family_defaults_listed(void **state)
{
    (void)state;
    char dir[1024];
    make_unknown_arch(dir, sizeof dir, 1);
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint_options opt;
    moe_checkpoint_options_init(&opt);
    opt.family = "qwen3_moe";
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open_opts(ctx, dir, &opt, &ck), MOE_OK);
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, 0, &d), MOE_OK);
    assert_int_equal(d.renormalize, 0); /* Qwen3MoeConfig's default, now assumed and said */
    assert_non_null(strstr(cap.text, "norm_topk_prob = false"));
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_family_known_architecture(void **state)
{
    (void)state;
    char orig[1024];
    tu_data_path(orig, sizeof orig, "qwen3_moe_f32");
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_WARN);
    moe_checkpoint_options opt;
    moe_checkpoint_options_init(&opt);
    moe_checkpoint *ck = NULL;
    /* the family config.json names: nothing to warn */
    opt.family = "qwen3_moe";
    assert_int_equal(moe_checkpoint_open_opts(ctx, orig, &opt, &ck), MOE_OK);
    moe_checkpoint_free(ck);
    assert_string_equal(cap.text, "");
    /* another: allowed, the WARNING naming both; its row reads config.json (OLMoE's I is
     * intermediate_size, 8 here, so the experts' [12, 40] no longer fit) */
    opt.family = "olmoe";
    assert_int_equal(moe_checkpoint_open_opts(ctx, orig, &opt, &ck), MOE_OK);
    assert_int_equal(moe_checkpoint_family(ck), MOE_FAMILY_OLMOE);
    assert_non_null(strstr(cap.text, "names architecture 'Qwen3MoeForCausalLM' (model_type 'qwen3_moe'), family "
                                     "qwen3_moe; reading it as family olmoe, as asked"));
    assert_non_null(strstr(cap.text, "no config field was absent"));
    moe_layer_desc d;
    moe_status st = moe_checkpoint_layer_desc(ck, 0, &d);
    expect_error(ctx, st, MOE_ESHAPE, "expected [I, H] = [8, 40], found [12, 40]");
    moe_checkpoint_free(ck);
    /* and what the other row defaults is listed (Llama-4: its MoE-layer fields) */
    cap.text[0] = '\0';
    opt.family = "llama4";
    assert_int_equal(moe_checkpoint_open_opts(ctx, orig, &opt, &ck), MOE_OK);
    assert_non_null(strstr(cap.text, "reading it as family llama4"));
    assert_non_null(strstr(cap.text, "taking family llama4's defaults: interleave_moe_layer_step = 1, moe_layers = none"));
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

static void test_family_names(void **state)
{
    (void)state;
    char names[1024];
    moe_fam_row_names(names, sizeof names);
    for (int f = 1; f < 128; f++) { /* the values may leave gaps */
        const moe_fam_row *row = moe_fam_row_of((moe_family)f);
        if (!row)
            continue;
        assert_ptr_equal(moe_fam_by_name(row->name), row);
        assert_ptr_equal(moe_fam_by_name(row->names[0].arch), row);
        assert_ptr_equal(moe_fam_by_name(row->names[0].model_type), row);
        assert_non_null(strstr(names, row->name));
    }
    assert_null(moe_fam_by_name("custom"));
    assert_null(moe_fam_by_name(""));
}

/* ---- the command line ---------------------------------------------------------------------- */

typedef struct cli_run {
    int code;   /* exit status; -1 when it did not exit normally */
    char *out;  /* stdout, NUL-terminated */
    char *err;  /* stderr, NUL-terminated */
} cli_run;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)(n > 0 ? n : 0) + 1);
    assert_non_null(b);
    size_t got = n > 0 ? fread(b, 1, (size_t)n, f) : 0;
    b[got] = '\0';
    fclose(f);
    return b;
}

/* $LIBMOE_BIN args... (NULL-terminated), stdout and stderr captured. */
static cli_run run_moe(const char *const *args)
{
    const char *bin = getenv("LIBMOE_BIN");
    assert_non_null(bin);
    char dir[1024], outp[1200], errp[1200];
    tu_tmpdir(dir, sizeof dir, "cli");
    snprintf(outp, sizeof outp, "%s/stdout", dir);
    snprintf(errp, sizeof errp, "%s/stderr", dir);
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)bin;
    while (args[n - 1] && n < 31) {
        argv[n] = (char *)args[n - 1];
        n++;
    }
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0)
            _exit(127);
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        assert_int_equal(errno, EINTR);
    cli_run r = {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(outp), slurp(errp)};
    unlink(outp);
    unlink(errp);
    rmdir(dir);
    return r;
}

/* `moe run` layer 0 of ckdir on qwen3_moe_f32's input into out, with up to three more
 * arguments (NULL for none). */
static cli_run moe_run(const char *ckdir, const char *out, const char *a1, const char *a2, const char *a3)
{
    char in[1200], d[1024];
    tu_data_path(d, sizeof d, "qwen3_moe_f32");
    tu_join(in, sizeof in, d, "input.safetensors");
    unlink(out);
    const char *args[] = {"run", "--checkpoint", ckdir, "--layer", "0", "--input", in, "--output", out, "--threads",
                          "1", a1, a2, a3, NULL};
    return run_moe(args);
}

static float *read_output(const char *path, size_t *n)
{
    moe_ctx *ctx = tu_ctx();
    moe_safetensors *f = NULL;
    assert_int_equal(moe_safetensors_open(ctx, path, &f), MOE_OK);
    moe_tensor_info ti;
    assert_int_equal(moe_safetensors_get(f, "output", &ti), MOE_OK);
    float *y = malloc(ti.nbytes);
    assert_non_null(y);
    memcpy(y, ti.data, ti.nbytes);
    *n = ti.nbytes / sizeof(float);
    moe_safetensors_free(f);
    moe_ctx_free(ctx);
    return y;
}

#define SKIP_WITHOUT_BIN()                                                                \
    do {                                                                                  \
        const char *b_ = getenv("LIBMOE_BIN");                                            \
        if (!b_ || access(b_, X_OK) != 0) {                                               \
            print_message("LIBMOE_BIN is not set to an executable: skipped\n");              \
            skip();                                                                       \
        }                                                                                 \
    } while (0)

static void test_cli_strict(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    char dir[1024], orig[1024], tmp[1024], out_orig[1200], out_x[1200];
    make_shared_extra(dir, sizeof dir, 0);
    tu_data_path(orig, sizeof orig, "qwen3_moe_f32");
    tu_tmpdir(tmp, sizeof tmp, "out");
    tu_join(out_orig, sizeof out_orig, tmp, "orig.safetensors");
    tu_join(out_x, sizeof out_x, tmp, "extra.safetensors");

    /* the original, strict: runs, says nothing of unread tensors */
    cli_run r = moe_run(orig, out_orig, "--strict", NULL, NULL);
    assert_int_equal(r.code, 0);
    assert_null(strstr(r.err, "not read"));
    free(r.out);
    free(r.err);
    /* the extra shared expert: a warning naming them, exit 0, the same output */
    r = moe_run(dir, out_x, NULL, NULL, NULL);
    assert_int_equal(r.code, 0);
    assert_int_equal(count_of(r.err, "libmoe: warning: "), 1);
    assert_non_null(strstr(r.err, "4 tensor(s) under '" PFX "' not read, ignored"));
    for (int i = 0; i < 4; i++)
        assert_non_null(strstr(r.err, SHARED_NAMES[i]));
    free(r.out);
    free(r.err);
    size_t n0, n1;
    float *y0 = read_output(out_orig, &n0), *y1 = read_output(out_x, &n1);
    assert_int_equal(n0, n1);
    assert_true(tu_same_bits(y0, y1, n0));
    free(y0);
    free(y1);
    /* --strict: exit 1 naming them, no output file */
    r = moe_run(dir, out_x, "--strict", NULL, NULL);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "moe run: "));
    assert_non_null(strstr(r.err, "not read (refused: strict)"));
    for (int i = 0; i < 4; i++)
        assert_non_null(strstr(r.err, SHARED_NAMES[i]));
    assert_int_not_equal(access(out_x, F_OK), 0);
    free(r.out);
    free(r.err);
    /* plan and bench --checkpoint --strict: exit 1 too; without --checkpoint: a usage error */
    const char *plan[] = {"plan", "--checkpoint", dir, "--strict", NULL};
    r = run_moe(plan);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "moe plan: "));
    assert_non_null(strstr(r.err, SHARED_NAMES[0]));
    free(r.out);
    free(r.err);
    const char *bench[] = {"bench", "--checkpoint", dir, "--strict", "--tokens", "1", "--iters", "1", NULL};
    r = run_moe(bench);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, SHARED_NAMES[0]));
    free(r.out);
    free(r.err);
    const char *bench_no_ck[] = {"bench", "--strict", "--tokens", "1", NULL};
    r = run_moe(bench_no_ck);
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--strict needs --checkpoint"));
    free(r.out);
    free(r.err);
    const char *plan_no_ck[] = {"plan", "--model", "qwen3-30b-a3b", "--family", "qwen3_moe", NULL};
    r = run_moe(plan_no_ck);
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "--family needs --checkpoint"));
    free(r.out);
    free(r.err);
    unlink(out_orig);
    rmdir(tmp);
}

static void test_cli_family(void **state)
{
    (void)state;
    SKIP_WITHOUT_BIN();
    char dir[1024], orig[1024], tmp[1024], out_orig[1200], out_x[1200];
    make_unknown_arch(dir, sizeof dir, 0);
    tu_data_path(orig, sizeof orig, "qwen3_moe_f32");
    tu_tmpdir(tmp, sizeof tmp, "out");
    tu_join(out_orig, sizeof out_orig, tmp, "orig.safetensors");
    tu_join(out_x, sizeof out_x, tmp, "foo.safetensors");

    cli_run r = moe_run(dir, out_x, NULL, NULL, NULL);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "architecture 'FooMoeForCausalLM' (model_type 'foo_moe') is not supported"));
    assert_non_null(strstr(r.err, "--family NAME"));
    assert_int_not_equal(access(out_x, F_OK), 0);
    free(r.out);
    free(r.err);

    r = moe_run(dir, out_x, "--family", "qwen3_moe", NULL);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.err, "libmoe: warning: "));
    assert_non_null(strstr(r.err, "'FooMoeForCausalLM' (model_type 'foo_moe')"));
    assert_non_null(strstr(r.err, "reading it as family qwen3_moe"));
    assert_non_null(strstr(r.err, "decoder_sparse_step = 1"));
    free(r.out);
    free(r.err);
    r = moe_run(orig, out_orig, NULL, NULL, NULL);
    assert_int_equal(r.code, 0);
    free(r.out);
    free(r.err);
    size_t n0, n1;
    float *y0 = read_output(out_orig, &n0), *y1 = read_output(out_x, &n1);
    assert_int_equal(n0, n1);
    assert_true(tu_same_bits(y0, y1, n0));
    free(y0);
    free(y1);

    r = moe_run(dir, out_x, "--family", "nope", NULL);
    assert_int_equal(r.code, 1);
    assert_non_null(strstr(r.err, "unknown family 'nope'"));
    assert_non_null(strstr(r.err, "families: mixtral, qwen2_moe, qwen3_moe"));
    free(r.out);
    free(r.err);
    r = moe_run(dir, out_x, "--family=", NULL, NULL);
    assert_int_equal(r.code, 2);
    free(r.out);
    free(r.err);

    /* the options are in the help of each command that reads a checkpoint */
    static const char *const cmds[] = {"run", "plan", "bench"};
    for (int c = 0; c < 3; c++) {
        const char *help[] = {"help", cmds[c], NULL};
        r = run_moe(help);
        assert_int_equal(r.code, 0);
        assert_non_null(strstr(r.out, "--strict"));
        assert_non_null(strstr(r.out, "--family NAME"));
        free(r.out);
        free(r.err);
    }
    unlink(out_orig);
    unlink(out_x);
    rmdir(tmp);
}

/* ---- control characters from files ------------------------------------------------------ */

/* No byte of text [n] is a control byte (< 0x20 or 0x7f) except the '\n' ending each line of a
 * tu_logcap (allow_lf). */
static void assert_no_controls(const char *text, int allow_lf)
{
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        if ((*p < 0x20 || *p == 0x7f) && !(allow_lf && *p == '\n' && (p[1] == '\0' || p[1] >= 0x20)))
            fail_msg("control byte 0x%02x at offset %d in: %s", *p, (int)(p - (const unsigned char *)text), text);
}

/* A config.json architecture and a tensor name holding ESC, BEL, CR, LF (terminal and log
 * spoofing) reach the error and the WARNING as visible escapes, never as raw bytes. */
static void test_control_chars_escaped(void **state)
{
    (void)state;
    char dir[1024];
    copy_fixture("qwen3_moe_f32", dir, sizeof dir);
    json_t *cfg = load_json_file(dir, "config.json");
    json_object_set_new(cfg, "architectures", json_pack("[s]", "X\x1b[2J\rmoe run: success\n\x7f"));
    json_object_del(cfg, "model_type"); /* else model_type decides the family */
    save_json_file(cfg, dir, "config.json");
    tu_logcap cap = {""};
    moe_ctx *ctx = tu_ctx_logging(&cap, MOE_LOG_DEBUG);
    moe_checkpoint *ck = NULL;
    assert_int_equal(moe_checkpoint_open(ctx, dir, &ck), MOE_EUNSUPPORTED);
    assert_null(ck);
    const char *msg = moe_ctx_last_error(ctx);
    printf("  error: %s\n", msg);
    assert_non_null(strstr(msg, "X\\x1b[2J\\rmoe run: success\\n\\x7f"));
    assert_no_controls(msg, 0);
    assert_no_controls(cap.text, 1); /* the DEBUG line of the error too */
    assert_non_null(strstr(cap.text, "\\x1b[2J"));
    moe_ctx_free(ctx);

    /* a tensor under the MoE block, unread: its name in the WARNING */
    copy_fixture("qwen3_moe_f32", dir, sizeof dir);
    const extra_tensor evil = {PFX "evil\x1b[31mRED\a\n\rfake: ok", 1, 40};
    add_tensors(dir, "model.safetensors", &evil, 1);
    tu_logcap cap1 = {""};
    ctx = tu_ctx_logging(&cap1, MOE_LOG_WARN);
    int64_t T, H;
    float *x = fixture_input("qwen3_moe_f32", &T, &H);
    float *out = run_layer0(ctx, dir, NULL, x, T);
    printf("  log: %s", cap1.text);
    assert_non_null(strstr(cap1.text, PFX "evil\\x1b[31mRED\\x07\\n\\rfake: ok"));
    assert_no_controls(cap1.text, 1);
    free(out);
    free(x);
    moe_ctx_free(ctx);
}

/* ---- dtypes libmoe does not compute with ------------------------------------------------ */

/* Real checkpoints hold U8 / U16 / U32 / U64 / I8 / I16 / I64 / F8_E5M2 / BOOL tensors outside
 * the MoE block (masks, position ids, step counters): validated like any other (offsets and
 * byte sizes), never refused; the output is bit-identical to the original fixture's. The same
 * dtype on a tensor libmoe reads as a weight is MOE_EDTYPE naming the tensor and both dtypes. */
static void test_other_dtypes_outside_block(void **state)
{
    (void)state;
    char dir[1024], orig[1024];
    copy_fixture("qwen3_moe_f32", dir, sizeof dir);
    const extra_tensor x[] = {
        {"model.norm.weight_u64", 2, 40},          {"model.norm.mask_bool", 3, 5},
        {"model.position_ids", 1, 7},              {"model.layers.0.self_attn.k_e5m2", 4, 40},
        {"model.layers.0.self_attn.u16", 2, 3},    {"model.layers.1.self_attn.u32", 2, 3},
        {"model.layers.1.self_attn.u8", 1, 9},     {"model.layers.1.self_attn.i8", 1, 9},
        {"model.layers.1.self_attn.i16", 1, 9},
    };
    const moe_dtype xd[] = {MOE_DTYPE_U64, MOE_DTYPE_BOOL, MOE_DTYPE_I64, MOE_DTYPE_F8_E5M2, MOE_DTYPE_U16,
                            MOE_DTYPE_U32, MOE_DTYPE_U8,   MOE_DTYPE_I8,  MOE_DTYPE_I16};
    const size_t nx = sizeof x / sizeof x[0];
    add_retyped(dir, "model.safetensors", x, xd, nx, NULL, MOE_DTYPE_F32);
    tu_data_path(orig, sizeof orig, "qwen3_moe_f32");
    int64_t T, H;
    float *in = fixture_input("qwen3_moe_f32", &T, &H);
    tu_logcap cap0 = {""}, cap1 = {""};
    moe_ctx *c0 = tu_ctx_logging(&cap0, MOE_LOG_WARN), *c1 = tu_ctx_logging(&cap1, MOE_LOG_WARN);
    float *want = run_layer0(c0, orig, NULL, in, T);
    float *got = run_layer0(c1, dir, NULL, in, T);
    assert_true(tu_same_bits(got, want, (size_t)(T * H)));
    assert_string_equal(cap1.text, ""); /* outside the block: nothing to say */
    free(got);
    free(want);

    /* the same dtypes on an expert weight: refused, naming the tensor */
    static const moe_dtype as[] = {MOE_DTYPE_U32, MOE_DTYPE_I32, MOE_DTYPE_U32};
    static const char *const which[] = {PFX "experts.1.up_proj.weight", PFX "experts.1.up_proj.weight",
                                        PFX "experts.0.gate_proj.weight"};
    for (size_t i = 0; i < sizeof as / sizeof as[0]; i++) {
        copy_fixture("qwen3_moe_f32", dir, sizeof dir);
        add_retyped(dir, "model.safetensors", x, xd, nx, which[i], as[i]);
        /* refused where libmoe first reads the tensor as a weight (open validates every MoE layer) */
        moe_checkpoint *ck = NULL;
        moe_plan *p = NULL;
        moe_weights *w = NULL;
        moe_layer_desc d;
        moe_status st = moe_checkpoint_open(c1, dir, &ck);
        if (st == MOE_OK)
            st = moe_checkpoint_layer_desc(ck, 0, &d);
        if (st == MOE_OK)
            assert_int_equal(moe_plan_create(c1, &d, &p), MOE_OK);
        if (st == MOE_OK)
            st = moe_checkpoint_load_weights(ck, 0, p, &w);
        const char *msg = moe_ctx_last_error(c1);
        printf("  %s expert weight: %s\n", moe_dtype_name(as[i]), msg);
        assert_int_equal(st, MOE_EDTYPE);
        assert_null(w);
        assert_non_null(strstr(msg, which[i]));
        assert_non_null(strstr(msg, moe_dtype_name(as[i])));
        assert_non_null(strstr(msg, "F32"));
        moe_plan_free(p);
        moe_checkpoint_free(ck);
    }
    free(in);
    moe_ctx_free(c0);
    moe_ctx_free(c1);
}

/* ---- Step-3.7's per-layer limits and DeepSeek-V4's config checks ---------- */

/* step3p7_f32 with text_config edited by `edit` (NULL: as generated); the status of layer
 * `layer`'s description, into *d. */
static moe_status step_desc(const char *fixture, void (*edit)(json_t *cfg), int64_t layer, moe_layer_desc *d,
                            moe_ctx *ctx)
{
    char dir[1024];
    copy_fixture(fixture, dir, sizeof dir);
    if (edit) {
        json_t *root = load_json_file(dir, "config.json");
        json_t *tc = json_object_get(root, "text_config");
        edit(json_is_object(tc) ? tc : root);
        save_json_file(root, dir, "config.json");
    }
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open(ctx, dir, &ck);
    if (st == MOE_OK)
        st = moe_checkpoint_layer_desc(ck, layer, d);
    if (st == MOE_OK) { /* and it loads and runs into a plan of that description */
        moe_plan *plan = NULL;
        moe_weights *w = NULL;
        assert_int_equal(moe_plan_create(ctx, d, &plan), MOE_OK);
        assert_int_equal(moe_checkpoint_load_weights(ck, layer, plan, &w), MOE_OK);
        moe_weights_free(w);
        moe_plan_free(plan);
    }
    moe_checkpoint_free(ck);
    return st;
}

static void no_limits(json_t *c)
{
    json_object_del(c, "swiglu_limits");
}
static void null_shared_limits(json_t *c)
{
    json_object_set_new(c, "swiglu_limits_shared", json_null());
}
static void negative_limit(json_t *c)
{
    json_array_set_new(json_object_get(c, "swiglu_limits"), 1, json_real(-2.0));
}
static void string_limit(json_t *c)
{
    json_array_set_new(json_object_get(c, "swiglu_limits"), 1, json_string("7"));
}
static void biased(json_t *c)
{
    json_object_set_new(c, "mlp_bias", json_true());
}
static void gelu(json_t *c)
{
    json_object_set_new(c, "hidden_act", json_string("gelu"));
}

/* Step3p7SparseMoeBlock's limits per layer (swiglu_limits[L] routed, swiglu_limits_shared[L]
 * shared; None / 0 / absent: plain SwiGLU there): step3p7_f32 layer 1 clamps both (2.5 and 4),
 * layer 2 only the shared expert (3); mlp_bias, a negative or non-number limit and a non-silu
 * hidden_act are refused by name. */
static void test_step3p7_layers(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    assert_int_equal(step_desc("step3p7_f32", NULL, 1, &d, ctx), MOE_OK);
    assert_int_equal(d.activation, MOE_ACT_SWIGLU_POSTCLAMP);
    assert_true(d.swiglu_limit == 2.5f && d.shared_swiglu_limit == 4.0f && !d.has_shared_activation);
    assert_int_equal(d.shared_expert_intermediate_size, 16);
    assert_true(d.routed_scaling_factor == 1.5f && d.renormalize && d.has_selection_bias);
    assert_int_equal(step_desc("step3p7_f32", NULL, 2, &d, ctx), MOE_OK);
    assert_int_equal(d.activation, MOE_ACT_SWIGLU);
    assert_true(d.has_shared_activation && d.shared_activation == MOE_ACT_SWIGLU_POSTCLAMP);
    assert_true(d.shared_swiglu_limit == 3.0f);
    /* no routed list: layer 1's routed experts plain, its shared expert still clamped at 4 */
    assert_int_equal(step_desc("step3p7_f32", no_limits, 1, &d, ctx), MOE_OK);
    assert_true(d.activation == MOE_ACT_SWIGLU && d.has_shared_activation &&
                d.shared_activation == MOE_ACT_SWIGLU_POSTCLAMP && d.shared_swiglu_limit == 4.0f);
    /* no shared list: the shared expert plain beside the clamped routed ones */
    assert_int_equal(step_desc("step3p7_f32", null_shared_limits, 1, &d, ctx), MOE_OK);
    assert_true(d.activation == MOE_ACT_SWIGLU_POSTCLAMP && d.swiglu_limit == 2.5f && d.has_shared_activation &&
                d.shared_activation == MOE_ACT_SWIGLU && d.shared_swiglu_limit == 0.0f);
    tu_check_error(ctx, step_desc("step3p7_f32", negative_limit, 1, &d, ctx), MOE_EFORMAT,
                   (const char *const[]){"'text_config.swiglu_limits'[1] = -2", "0 or null: no clamp", NULL});
    tu_check_error(ctx, step_desc("step3p7_f32", string_limit, 1, &d, ctx), MOE_EFORMAT,
                   (const char *const[]){"'text_config.swiglu_limits'[1] must be a number or null", NULL});
    tu_check_error(ctx, step_desc("step3p7_f32", biased, 1, &d, ctx), MOE_EUNSUPPORTED,
                   (const char *const[]){"'text_config.mlp_bias' is true", "Step3p7MLP's biased", NULL});
    tu_check_error(ctx, step_desc("step3p7_f32", gelu, 1, &d, ctx), MOE_EUNSUPPORTED,
                   (const char *const[]){"'text_config.hidden_act' = \"gelu\"", "MOE_ACT_SWIGLU_POSTCLAMP", NULL});
    moe_ctx_free(ctx);
}

static void v4_sigmoid(json_t *c)
{
    json_object_set_new(c, "scoring_func", json_string("sigmoid"));
}
static void v4_types_absent_one(json_t *c)
{
    json_object_del(c, "mlp_layer_types");
    json_object_set_new(c, "num_hash_layers", json_integer(1));
}
static void v4_types_absent(json_t *c)
{
    json_object_del(c, "mlp_layer_types");
}
static void v4_types_bad(json_t *c)
{
    json_array_set_new(json_object_get(c, "mlp_layer_types"), 1, json_string("sparse"));
}

/* DeepseekV4Config: scoring_func other than sqrtsoftplus, mlp_bias and an unknown
 * mlp_layer_types value are refused by name; without mlp_layer_types the first num_hash_layers
 * (default 3) layers are the hash ones, refused with the first score-routed layer named (or
 * none). */
static void test_deepseek_v4_config(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    assert_int_equal(step_desc("deepseek_v4_f32", NULL, 1, &d, ctx), MOE_OK);
    assert_true(d.scoring_func == MOE_SCORING_SQRTSOFTPLUS && d.activation == MOE_ACT_SWIGLU_CLAMP &&
                d.swiglu_limit == 3.0f && d.renormalize && d.has_selection_bias && d.n_group == 0 &&
                d.shared_expert_intermediate_size == d.moe_intermediate_size && d.routed_scaling_factor == 2.0f);
    tu_check_error(ctx, step_desc("deepseek_v4_f32", v4_sigmoid, 1, &d, ctx), MOE_EUNSUPPORTED,
                   (const char *const[]){"'scoring_func' = \"sigmoid\"", "sqrtsoftplus", NULL});
    tu_check_error(ctx, step_desc("deepseek_v4_f32", biased, 1, &d, ctx), MOE_EUNSUPPORTED,
                   (const char *const[]){"'mlp_bias' is true", "DeepseekV4MLP", NULL});
    tu_check_error(ctx, step_desc("deepseek_v4_f32", v4_types_bad, 1, &d, ctx), MOE_EFORMAT,
                   (const char *const[]){"'mlp_layer_types'[1] = \"sparse\"", "\"hash_moe\" or \"moe\"", NULL});
    assert_int_equal(step_desc("deepseek_v4_f32", v4_types_absent_one, 1, &d, ctx), MOE_OK);
    tu_check_error(ctx, step_desc("deepseek_v4_f32", v4_types_absent_one, 0, &d, ctx), MOE_EUNSUPPORTED,
                   (const char *const[]){"layer 0", "hash_moe", "layer 1 is the first", NULL});
    tu_check_error(ctx, step_desc("deepseek_v4_f32", v4_types_absent, 1, &d, ctx), MOE_EUNSUPPORTED,
                   (const char *const[]){"layer 1", "hash_moe", "no layer of this model is score-routed", NULL});
    moe_ctx_free(ctx);
}

/* ernie4_5_vl_moe_f32 with its config.json edited by `edit` (the root object; NULL: as
 * generated), read with expert set `set` (NULL: the default): the status of layer `layer`'s
 * description into *d, the set read into *read_set; a description that succeeds is loaded too. */
static moe_status ernie_vl_desc(const char *fixture, void (*edit)(json_t *root), const char *set, int64_t layer,
                                moe_layer_desc *d, const char **read_set, moe_ctx *ctx)
{
    char dir[1024];
    copy_fixture(fixture, dir, sizeof dir);
    if (edit) {
        json_t *root = load_json_file(dir, "config.json");
        edit(root);
        save_json_file(root, dir, "config.json");
    }
    moe_checkpoint_options opt;
    moe_checkpoint_options_init(&opt);
    opt.strict = 1; /* the set not read is not an unread tensor */
    opt.expert_set = set;
    moe_checkpoint *ck = NULL;
    moe_status st = moe_checkpoint_open_opts(ctx, dir, &opt, &ck);
    if (st == MOE_OK) {
        *read_set = moe_checkpoint_expert_set(ck);
        st = moe_checkpoint_layer_desc(ck, layer, d);
    }
    if (st == MOE_OK) {
        moe_plan *plan = NULL;
        moe_weights *w = NULL;
        assert_int_equal(moe_plan_create(ctx, d, &plan), MOE_OK);
        st = moe_checkpoint_load_weights(ck, layer, plan, &w);
        moe_weights_free(w);
        moe_plan_free(plan);
    }
    moe_checkpoint_free(ck);
    return st;
}

static void vl_i_number(json_t *root)
{
    json_object_set_new(json_object_get(root, "text_config"), "moe_intermediate_size", json_integer(8));
}
static void vl_i_absent(json_t *root)
{
    json_object_del(json_object_get(root, "text_config"), "moe_intermediate_size");
}
static void vl_types_absent(json_t *root)
{
    json_object_del(json_object_get(root, "text_config"), "mlp_layer_types");
}
static void vl_quantized(json_t *root)
{
    json_object_set_new(root, "quantization_config", json_pack("{s:s, s:[i, i]}", "quant_method", "fp8",
                                                               "weight_block_size", 128, 128));
}
static void vl_shared_two(json_t *root)
{
    json_object_set_new(json_object_get(root, "text_config"), "moe_num_shared_experts", json_integer(2));
}

/* ERNIE-4.5-VL's expert sets: text by default (I = moe_intermediate_size[0]), vision on request
 * (I = [1]), the shared experts [0] * moe_num_shared_experts in both; an unknown set, a set asked
 * of a family with one, a number or a short list for moe_intermediate_size and a quantized
 * checkpoint are refused by name; absent moe_intermediate_size is the class's [1536, 512] (which
 * the tensors then contradict), absent mlp_layer_types every layer but the first. */
static void test_ernie_vl_sets(void **state)
{
    (void)state;
    moe_ctx *ctx = tu_ctx();
    moe_layer_desc d;
    const char *set = NULL;
    assert_int_equal(ernie_vl_desc("ernie4_5_vl_moe_f32", NULL, NULL, 1, &d, &set, ctx), MOE_OK);
    assert_string_equal(set, "text");
    assert_true(d.family == MOE_FAMILY_ERNIE4_5_VL_MOE && d.moe_intermediate_size == 8 && d.num_experts == 6 &&
                d.top_k == 2 && d.shared_expert_intermediate_size == 8 && d.has_selection_bias && d.renormalize &&
                d.scoring_func == MOE_SCORING_SOFTMAX && !d.shared_expert_gated);
    assert_int_equal(ernie_vl_desc("ernie4_5_vl_moe_f32", NULL, "vision", 1, &d, &set, ctx), MOE_OK);
    assert_string_equal(set, "vision");
    assert_true(d.moe_intermediate_size == 6 && d.shared_expert_intermediate_size == 8);
    expect_error(ctx, ernie_vl_desc("ernie4_5_vl_moe_f32", NULL, "audio", 1, &d, &set, ctx), MOE_EINVAL,
                 "unknown expert set 'audio'", "ernie4_5_vl_moe", "text, vision");
    expect_error(ctx, ernie_vl_desc("ernie4_5_moe_f32", NULL, "vision", 2, &d, &set, ctx), MOE_EINVAL,
                 "expert set 'vision'", "family ernie4_5_moe's MoE block has one set of experts");
    expect_error(ctx, ernie_vl_desc("ernie4_5_vl_moe_f32", vl_i_number, NULL, 1, &d, &set, ctx), MOE_EFORMAT,
                 "'text_config.moe_intermediate_size' must be a list", "(text, vision)", "found an integer");
    expect_error(ctx, ernie_vl_desc("ernie4_5_vl_moe_f32", vl_i_absent, "vision", 1, &d, &set, ctx), MOE_ESHAPE,
                 "experts.6.gate_proj.weight", "512");
    expect_error(ctx, ernie_vl_desc("ernie4_5_vl_moe_f32", vl_quantized, NULL, 1, &d, &set, ctx),
                 MOE_EUNSUPPORTED, "'quantization_config' (quant_method fp8)", "f32 / bf16 / f16 checkpoints only");
    /* the shared experts' size follows moe_num_shared_experts * moe_intermediate_size[0]: 2 * 8
     * disagrees with the saved [8, H] */
    expect_error(ctx, ernie_vl_desc("ernie4_5_vl_moe_f32", vl_shared_two, "vision", 1, &d, &set, ctx), MOE_ESHAPE,
                 "shared_experts", "16");
    assert_int_equal(ernie_vl_desc("ernie4_5_vl_moe_f32", vl_types_absent, NULL, 1, &d, &set, ctx), MOE_OK);
    expect_error(ctx, ernie_vl_desc("ernie4_5_vl_moe_f32", vl_types_absent, NULL, 0, &d, &set, ctx), MOE_EDENSE,
                 "layer 0 is a dense MLP layer");
    moe_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_expert_warned_and_ignored),
        cmocka_unit_test(test_shared_expert_strict),
        cmocka_unit_test(test_many_unread_listed_with_more),
        cmocka_unit_test(test_config_without_shared_expert),
        cmocka_unit_test(test_sharded_unread),
        cmocka_unit_test(test_every_fixture_clean_under_strict),
        cmocka_unit_test(test_family_for_unknown_architecture),
        cmocka_unit_test(test_family_defaults_listed),
        cmocka_unit_test(test_family_known_architecture),
        cmocka_unit_test(test_family_names),
        cmocka_unit_test(test_cli_strict),
        cmocka_unit_test(test_cli_family),
        cmocka_unit_test(test_control_chars_escaped),
        cmocka_unit_test(test_other_dtypes_outside_block),
        cmocka_unit_test(test_step3p7_layers),
        cmocka_unit_test(test_deepseek_v4_config),
        cmocka_unit_test(test_ernie_vl_sets),
    };
    return cmocka_run_group_tests(tests, tu_group_tmp_setup, tu_group_tmp_teardown);
}
