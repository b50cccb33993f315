/* Golden fixtures from Hugging Face transformers (tests/fixtures, made by gen_fixtures.py).
 *
 * Every folder of $LIBMOE_TEST_DATA holding a meta.json is one fixture: a Hugging Face
 * checkpoint written by save_pretrained, input.safetensors (hidden_states [T, H]) and the
 * outputs of transformers' own MoE block. Each is run through exactly the path `moe run`
 * takes:
 *
 *   moe_checkpoint_open -> moe_checkpoint_layer_desc -> moe_plan_create
 *     -> moe_checkpoint_load_weights -> moe_safetensors_open(input) -> moe_plan_execute_ex
 *
 * with the default kernel table and with MOE_ISA=ref, each with 1 and 2 threads (whose
 * outputs must be bit-identical: numerics contract 3), and compared with:
 *
 *  - expected.safetensors ("f32" class: the HF block in float32; for bf16 fixtures, on the
 *    bf16 weights and bf16 input widened exactly to f32):
 *      max |output - expected| <= 1e-5 * max |expected|,
 *      topk_ids exactly equal (the generator puts HF's ids in libmoe's top-k order),
 *      max |topk_weights - expected| <= 1e-6 * max |expected| (DeepSeek's routers report
 *      their weights times routed_scaling_factor: meta.json topk_weights_scale, applied to
 *      libmoe's before comparing).
 *    The description the checkpoint adapter gives is checked against meta.json too: family,
 *    sizes, scoring, renormalize, routed_scaling_factor, groups, biases, weight on input,
 *    activation, shared expert, quantization scheme (fields absent from the first fixtures'
 *    meta.json take those families' values). gpt_oss_mxfp4 is a gpt-oss checkpoint with
 *    MXFP4 experts; its expectation is the HF block in float32 on transformers' own
 *    dequantization of those experts, so the same f32 class applies.
 *  - expected_bf16.safetensors ("bf16" class: the HF block run entirely in torch.bfloat16),
 *    with the first-order bound derived below.
 *
 * Derivation of the bf16 bound. u = 2^-8 is bf16's unit roundoff (8 significant bits,
 * round to nearest even). On the CPU, torch computes every bf16 op in f32 and rounds its
 * result to bf16 once (matmuls accumulate in f32; their f32 error, ~H * 2^-24 relative, is
 * under 0.1% of u here and is covered by the 5% allowance below). The inputs (x, weights)
 * are bf16 values already, so are exact. The exact quantities are g = W_gate x,
 * v = W_up x, h = silu(g) * v, y_k = W_down h_k, out = sum_k w_k y_k. Along the path of one
 * token, the bf16 run rounds:
 *   1. the router logits l (F.linear in bf16): |dl_j| <= u |l_j| <= u L, L = max_j |l_j|.
 *      Softmax (in f32) and renormalization give d log w_k = dl_k - sum_j p_j dl_j, so
 *      |dw_k| <= 2 u L w_k;
 *   2. the gate projection g:  relative u, times silu's condition number
 *      kappa(g) = g silu'(g) / silu(g) = 1 + g (1 - sigmoid(g)) when it reaches h;
 *   3. the up projection v:    relative u;
 *   4. the activation silu(g): relative u;
 *   5. the product silu(g) v:  relative u;
 *      so each h_i carries a relative error of at most (|kappa(g_i)| + 3) u, and the down
 *      projection turns it into |dy_j| <= u sum_i |W_down,ji| |h_i| (|kappa(g_i)| + 3);
 *   6. the down projection's output y: relative u;
 *   7. Qwen only: the routing weight cast to bf16 (router_top_value.to(bf16)): relative u;
 *   8. the weighted product w_k y_k (Mixtral: cast back to bf16): relative u;
 *   9. the weighted sum (index_add_ into a bf16 zero tensor): the first add is exact, each
 *      of the other K - 1 rounds to within u of a partial sum, |partial| <= sum_k |w_k y_k|.
 * To first order, per element j of token t:
 *   |out_bf16 - out| <= u * [ P_tj + (c_y + 2 L_t) * Q_tj ],
 *   P_tj = sum_k w_k sum_i |W_down|_ji |h_ki| (|kappa(g_ki)| + 3)        (items 2-5)
 *   Q_tj = sum_k w_k |y_kj|                                             (items 1, 6-9)
 *   c_y  = 1 (down) + [1 Qwen weight cast] + 1 (weighted product) + (K - 1) (sum).
 * P and Q come with the fixture (bound_path, bound_terms in expected_bf16.safetensors,
 * computed in float64 by gen_fixtures.py); L_t from expected.safetensors' router_logits.
 * The bound is multiplied by 1.05 for second-order terms and the f32 accumulation, and
 * libmoe's own f32 error (the f32-class bound, 1e-5 * max |expected|) is added.
 * The topk_weights of the bf16 run obey |dw_k| <= u (2 L_t + [1 Qwen cast]) w_k (items 1, 7),
 * with the same 1.05 factor plus 1e-6 for libmoe's own f32 rounding.
 * Measured (libmoe against transformers 5.24.0, fixtures' VERSIONS.txt): the worst element
 * reaches 0.26 (qwen3_moe_bf16) and 0.25 (mixtral_bf16) of this bound for the output, 0.37
 * and 0.36 for the weights; relative to max |expected| the output errors are 2.39 u and
 * 2.54 u. The test prints these ratios on every run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "moe.h"
#include "testutil.h"

#define MAX_FIXTURES 128
#define BF16_U (1.0 / 256.0)

typedef struct fixture {
    char name[256];
    char dir[1400];
} fixture;

static fixture g_fixtures[MAX_FIXTURES];
static size_t g_n_fixtures;

/* The fixtures that must exist (gen_fixtures.py makes them); a missing one is a failure,
 * not a silently smaller test. */
static const char *const k_required[] = {
    "mixtral_f32", "qwen2_moe_f32", "qwen3_moe_f32", "qwen3_moe_norm_false_f32",
    "qwen3_moe_sparse_step_f32", "qwen2_moe_sharded_f32", "mixtral_k1_f32",
    "qwen3_moe_k_eq_e_f32", "qwen3_moe_empty_expert_f32", "qwen3_moe_bf16", "mixtral_bf16",
    "qwen3_moe_stacked_f32", "deepseek_v3_f32", "deepseek_v2_lite_f32", "deepseek_v2_grouped_f32",
    "gpt_oss_bf16", "llama4_f32", "olmoe_f32", "granitemoe_f32", "qwen3_5_moe_f32",
    "olmoe_gelu_f32", "olmoe_gelu_tanh_f32", "gpt_oss_mxfp4",
    "glm4_moe_f32", "dots1_f32", "minimax_f32", "qwen3_vl_moe_f32", "flex_olmo_f32",
    "glm4_moe_lite_f32", "deepseek_v32_f32", "exaone_moe_f32", "mimo_v2_flash_f32",
    "laguna_f32", "kolibri1_f32", "beam_f32", "minimax_m3_vl_f32", "afmoe_f32", "flint_f32", "granitemoe_swa_f32",
    "lara_mini_f32", "qwen4_exp_f32",
    "phimoe_f32", "jetmoe_f32", "openai_privacy_filter_f32",
    "qwen3_next_f32", "qwen3_omni_moe_f32", "granitemoeshared_f32", "granitemoehybrid_f32",
    "hunyuan_v1_moe_f32", "mellum_f32", "jamba_f32", "mistral4_f32", "aria_f32",
    "ernie4_5_moe_f32",
    "glm_moe_dsa_f32", "solar_open_f32", "glm4v_moe_f32", "kimi_linear_f32", "bailing_hybrid_f32",
    "minimax_m2_f32", "hy_v3_f32", "axk2_f32", "glm5_next_f32",
    "lfm2_moe_f32", "lfm2_moe_nobias_f32", "cohere2_moe_f32", "cohere2_moe_sigmoid_f32",
    "longcat_flash_f32",
    "deepseek_v4_f32", "step3p7_f32",
    "mistral_large4_f32", "deepseek_ocr2_f32", "unlimited_ocr_f32",
    "nemotron_h_f32",
    "dbrx_f32", "dbrx_p2_f32",
    "ernie4_5_vl_moe_f32", "ernie4_5_vl_moe_vision_f32",
    "dots3_note_f32",
};

/* ---- small helpers -------------------------------------------------------------------- */

static json_t *load_meta(const fixture *fx)
{
    char path[1600];
    snprintf(path, sizeof path, "%s/meta.json", fx->dir);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    if (!m)
        fail_msg("%s: %s (line %d)", path, je.text, je.line);
    return m;
}

static int64_t meta_int(const json_t *m, const char *key)
{
    json_t *v = json_object_get(m, key);
    if (!json_is_integer(v))
        fail_msg("meta.json: integer field '%s' missing", key);
    return (int64_t)json_integer_value(v);
}

static const char *meta_str(const json_t *m, const char *key)
{
    json_t *v = json_object_get(m, key);
    if (!json_is_string(v))
        fail_msg("meta.json: string field '%s' missing", key);
    return json_string_value(v);
}

/* The family whose moe_family_name is s: every named value after custom (all are below 256;
 * there may be gaps), so a new family needs no edit here. */
static moe_family family_of(const char *s)
{
    for (int f = MOE_FAMILY_CUSTOM + 1; f < 256; f++)
        if (!strcmp(s, moe_family_name((moe_family)f)))
            return (moe_family)f;
    fail_msg("meta.json: unknown family %s", s);
    return MOE_FAMILY_CUSTOM;
}

/* Optional meta.json fields (the fixtures of the first families predate them): a missing one
 * takes the value those families have. */
static int64_t meta_int_or(const json_t *m, const char *key, int64_t dflt)
{
    json_t *v = json_object_get(m, key);
    return v ? (int64_t)json_integer_value(v) : dflt;
}

static double meta_num_or(const json_t *m, const char *key, double dflt)
{
    json_t *v = json_object_get(m, key);
    return v ? json_number_value(v) : dflt;
}

static int meta_bool_or(const json_t *m, const char *key, int dflt)
{
    json_t *v = json_object_get(m, key);
    return v ? json_is_true(v) : dflt;
}

static const char *meta_str_or(const json_t *m, const char *key, const char *dflt)
{
    json_t *v = json_object_get(m, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

/* meta.json's activation names (gen_fixtures.py routing_meta) as moe_activation values */
/* moe_checkpoint_open with the fixture's expert set (meta.json expert_set: ERNIE-4.5-VL's "text"
 * or "vision"; absent: the family's only one), checked to be the set the checkpoint reads. */
static moe_status open_fixture(moe_ctx *ctx, const fixture *fx, const json_t *meta, moe_checkpoint **ck)
{
    moe_checkpoint_options opt;
    moe_checkpoint_options_init(&opt);
    opt.expert_set = meta_str_or(meta, "expert_set", NULL);
    moe_status st = moe_checkpoint_open_opts(ctx, fx->dir, &opt, ck);
    if (st == MOE_OK && opt.expert_set)
        assert_string_equal(moe_checkpoint_expert_set(*ck), opt.expert_set);
    if (st == MOE_OK && !opt.expert_set)
        assert_null(moe_checkpoint_expert_set(*ck));
    return st;
}

static moe_activation act_of(const char *act)
{
    return !strcmp(act, "swiglu_oai")       ? MOE_ACT_SWIGLU_OAI
           : !strcmp(act, "swiglu_clamp")   ? MOE_ACT_SWIGLU_CLAMP
           : !strcmp(act, "swiglu_softcap") ? MOE_ACT_SWIGLU_SOFTCAP
           : !strcmp(act, "swiglu_postclamp") ? MOE_ACT_SWIGLU_POSTCLAMP
           : !strcmp(act, "geglu")          ? MOE_ACT_GEGLU
           : !strcmp(act, "geglu_tanh")     ? MOE_ACT_GEGLU_TANH
           : !strcmp(act, "relu")           ? MOE_ACT_RELU
           : !strcmp(act, "relu2")          ? MOE_ACT_RELU2
           : !strcmp(act, "gelu")           ? MOE_ACT_GELU
           : !strcmp(act, "gelu_tanh")      ? MOE_ACT_GELU_TANH
                                            : MOE_ACT_SWIGLU;
}

static moe_ctx *make_ctx(int threads, const char *isa)
{
    moe_options o;
    moe_options_init(&o);
    o.num_threads = threads;
    o.isa = isa;
    moe_ctx *ctx = NULL;
    char err[512] = "";
    moe_status st = moe_ctx_create(&o, &ctx, err, sizeof err);
    if (st != MOE_OK)
        fail_msg("moe_ctx_create(threads %d, isa %s): %s: %s", threads, isa ? isa : "auto",
                 moe_status_name(st), err);
    return ctx;
}

#define CHECK_OK(ctx, call, what)                                                              \
    do {                                                                                       \
        moe_status st_ = (call);                                                               \
        if (st_ != MOE_OK)                                                                     \
            fail_msg("%s: %s: %s: %s", fx->name, what, moe_status_name(st_),                  \
                     moe_ctx_last_error(ctx));                                                 \
    } while (0)

/* A tensor of an open safetensors file, checked for dtype and shape, copied to `dst`
 * (malloc'd, aligned copy: mapped data need not be aligned for its dtype). */
static void *get_tensor(moe_safetensors *f, const char *file, const char *name, moe_dtype dt,
                        int64_t d0, int64_t d1)
{
    moe_tensor_info ti;
    moe_status st = moe_safetensors_get(f, name, &ti);
    if (st != MOE_OK)
        fail_msg("%s: tensor %s: %s", file, name, moe_status_name(st));
    if (ti.dtype != dt || ti.ndim != 2 || ti.shape[0] != d0 || ti.shape[1] != d1)
        fail_msg("%s: tensor %s is %s rank %d [%lld, %lld]; expected %s [%lld, %lld]", file, name,
                 moe_dtype_name(ti.dtype), ti.ndim, (long long)ti.shape[0],
                 ti.ndim > 1 ? (long long)ti.shape[1] : -1LL, moe_dtype_name(dt), (long long)d0,
                 (long long)d1);
    void *p = aligned_alloc(64, (ti.nbytes + 63) / 64 * 64 + 64);
    assert_non_null(p);
    memcpy(p, ti.data, ti.nbytes);
    return p;
}

/* ---- one run through the `moe run` path ----------------------------------------------- */

typedef struct run_result {
    float *out;      /* [T, H] */
    int32_t *ids;    /* [T, K] */
    float *weights;  /* [T, K] */
    int64_t T, H, K;
} run_result;

static void run_result_free(run_result *r)
{
    free(r->out);
    free(r->ids);
    free(r->weights);
    memset(r, 0, sizeof *r);
}

static void run_fixture(const fixture *fx, const json_t *meta, int threads, const char *isa, moe_compute compute,
                        run_result *res)
{
    const int64_t layer = meta_int(meta, "layer");
    moe_ctx *ctx = make_ctx(threads, isa);
    assert_int_equal(moe_ctx_num_threads(ctx), threads);

    moe_checkpoint *ck = NULL;
    CHECK_OK(ctx, open_fixture(ctx, fx, meta, &ck), "moe_checkpoint_open");
    assert_int_equal(moe_checkpoint_family(ck), family_of(meta_str(meta, "family")));
    assert_int_equal(moe_checkpoint_num_layers(ck), meta_int(meta, "num_layers"));

    moe_layer_desc desc;
    CHECK_OK(ctx, moe_checkpoint_layer_desc(ck, layer, &desc), "moe_checkpoint_layer_desc");
    /* The description must be what config.json and the tensors say. */
    assert_int_equal(desc.family, family_of(meta_str(meta, "family")));
    assert_int_equal(desc.hidden_size, meta_int(meta, "H"));
    assert_int_equal(desc.moe_intermediate_size, meta_int(meta, "I"));
    assert_int_equal(desc.num_experts, meta_int(meta, "E"));
    assert_int_equal(desc.top_k, meta_int(meta, "K"));
    const char *scoring = meta_str_or(meta, "scoring", "softmax");
    assert_int_equal(desc.scoring_func, !strcmp(scoring, "sigmoid")        ? MOE_SCORING_SIGMOID
                                        : !strcmp(scoring, "topk_softmax") ? MOE_SCORING_TOPK_SOFTMAX
                                        : !strcmp(scoring, "topk_sigmoid") ? MOE_SCORING_TOPK_SIGMOID
                                        : !strcmp(scoring, "sparsemixer")  ? MOE_SCORING_SPARSEMIXER
                                        : !strcmp(scoring, "sqrtsoftplus") ? MOE_SCORING_SQRTSOFTPLUS
                                                                           : MOE_SCORING_SOFTMAX);
    if (desc.scoring_func == MOE_SCORING_SPARSEMIXER)
        assert_true(desc.sparsemixer_jitter_eps == (float)meta_num_or(meta, "sparsemixer_jitter_eps", 0.01));
    assert_int_equal(!!desc.renormalize, json_is_true(json_object_get(meta, "renormalize")));
    assert_true(desc.routed_scaling_factor == (float)meta_num_or(meta, "routed_scaling_factor", 1.0));
    if (desc.renormalize) /* LFM2-MoE 1e-6, Cohere2-MoE's sigmoid 0, else 1e-20 */
        assert_true(desc.renormalize_eps == (float)meta_num_or(meta, "renormalize_eps", 1e-20));
    if (desc.renormalize) /* DBRX's moe_normalize_expert_weights (2.0 in dbrx_p2_f32), else the sum */
        assert_true(desc.renormalize_p == (float)meta_num_or(meta, "renormalize_p", 1.0));
    if (desc.shared_expert_intermediate_size > 0) /* Cohere2-MoE's "average": 0.5 */
        assert_true(desc.shared_expert_scale == (float)meta_num_or(meta, "shared_expert_scale", 1.0));
    assert_int_equal(desc.shared_expert_intermediate_size,
                     meta_int(meta, "shared_expert_intermediate_size"));
    assert_int_equal(!!desc.shared_expert_gated,
                     meta_bool_or(meta, "shared_expert_gated", meta_int(meta, "shared_expert_intermediate_size") > 0));
    assert_int_equal(desc.n_group, meta_int_or(meta, "n_group", 0));
    assert_int_equal(desc.topk_group, meta_int_or(meta, "topk_group", 0));
    if (desc.n_group > 1)
        assert_int_equal(desc.group_score, !strcmp(meta_str_or(meta, "group_score", ""), "top2_sum")
                                               ? MOE_GROUP_SCORE_TOP2_SUM
                                               : MOE_GROUP_SCORE_MAX);
    assert_int_equal(!!desc.has_selection_bias, meta_bool_or(meta, "has_selection_bias", 0));
    assert_int_equal(!!desc.has_router_bias, meta_bool_or(meta, "has_router_bias", 0));
    assert_int_equal(!!desc.has_expert_bias, meta_bool_or(meta, "has_expert_bias", 0));
    assert_int_equal(!!desc.apply_router_weight_on_input, meta_bool_or(meta, "apply_router_weight_on_input", 0));
    assert_int_equal(!!desc.has_output_bias, meta_bool_or(meta, "has_output_bias", 0));
    assert_int_equal(!!desc.has_output_norm, meta_bool_or(meta, "has_output_norm", 0)); /* A.X-K1 */
    assert_int_equal(desc.num_identity_experts, meta_int_or(meta, "num_identity_experts", 0)); /* LongCat-Flash */
    if (desc.has_output_norm)
        assert_true(desc.output_norm_eps == (float)meta_num_or(meta, "output_norm_eps", NAN));
    const char *act = meta_str_or(meta, "activation", "swiglu");
    assert_int_equal(desc.activation, act_of(act));
    if (desc.activation == MOE_ACT_SWIGLU_SOFTCAP) { /* Inkling2: the two softcaps, as the config gives them */
        assert_true(desc.softcap_gate == (float)meta_num_or(meta, "softcap_gate", NAN));
        assert_true(desc.softcap_up == (float)meta_num_or(meta, "softcap_up", NAN));
    }
    /* HY-V4: the shared expert's own activation */
    const char *sh_act = meta_str_or(meta, "shared_activation", NULL);
    assert_int_equal(!!desc.has_shared_activation, sh_act != NULL);
    if (sh_act)
        assert_int_equal(desc.shared_activation, act_of(sh_act));
    /* the clamp limits the config gives (DeepSeek-V4's swiglu_limit, Step-3.7's per-layer lists) */
    if (json_is_number(json_object_get(meta, "swiglu_limit")))
        assert_true(desc.swiglu_limit == (float)meta_num_or(meta, "swiglu_limit", NAN));
    assert_true(desc.shared_swiglu_limit == (float)meta_num_or(meta, "shared_swiglu_limit", 0.0));
    /* quantized experts (gpt_oss_mxfp4): the scheme the checkpoint's tensors give */
    assert_string_equal(moe_quant_name(&desc.quant), meta_str_or(meta, "quant", "none"));
    const char *wdt = meta_str(meta, "weight_dtype");
    assert_int_equal(desc.weight_dtype, !strcmp(wdt, "BF16") ? MOE_DTYPE_BF16 : MOE_DTYPE_F32);

    moe_plan *plan = NULL;
    moe_plan_config cfg;
    moe_plan_config_init(&cfg);
    cfg.compute = compute;
    CHECK_OK(ctx, moe_plan_create_ex(ctx, &desc, &cfg, &plan), "moe_plan_create_ex");
    moe_weights *w = NULL;
    CHECK_OK(ctx, moe_checkpoint_load_weights(ck, layer, plan, &w), "moe_checkpoint_load_weights");
    moe_checkpoint_free(ck);

    char in_path[1600];
    snprintf(in_path, sizeof in_path, "%s/input.safetensors", fx->dir);
    moe_safetensors *in = NULL;
    CHECK_OK(ctx, moe_safetensors_open(ctx, in_path, &in), "moe_safetensors_open(input)");
    const int64_t T = meta_int(meta, "T"), H = desc.hidden_size, K = desc.top_k;
    const moe_dtype xdt = !strcmp(meta_str(meta, "input_dtype"), "BF16") ? MOE_DTYPE_BF16
                                                                         : MOE_DTYPE_F32;
    void *x = get_tensor(in, in_path, meta_str(meta, "input_tensor"), xdt, T, H);
    moe_safetensors_free(in);

    res->T = T;
    res->H = H;
    res->K = K;
    res->out = malloc((size_t)(T * H) * sizeof(float));
    res->ids = malloc((size_t)(T * K) * sizeof(int32_t));
    res->weights = malloc((size_t)(T * K) * sizeof(float));
    assert_non_null(res->out);
    assert_non_null(res->ids);
    assert_non_null(res->weights);
    /* Poison, so anything left unwritten shows. */
    for (int64_t i = 0; i < T * H; i++)
        res->out[i] = NAN;
    memset(res->ids, 0xff, (size_t)(T * K) * sizeof(int32_t));
    for (int64_t i = 0; i < T * K; i++)
        res->weights[i] = NAN;

    size_t ws_size = moe_plan_workspace_size(plan, T);
    void *ws = ws_size ? aligned_alloc(64, (ws_size + 63) / 64 * 64) : NULL;
    if (ws_size)
        assert_non_null(ws);

    moe_exec_args a;
    memset(&a, 0, sizeof a);
    a.hidden_states = x;
    a.hidden_dtype = xdt;
    a.n_tokens = T;
    a.router_logits = NULL;
    a.output = res->out;
    a.topk_ids = res->ids;
    a.topk_weights = res->weights;
    a.workspace = ws;
    a.workspace_size = ws_size;
    CHECK_OK(ctx, moe_plan_execute_ex(plan, w, &a), "moe_plan_execute_ex");

    free(ws);
    free(x);
    moe_weights_free(w);
    moe_plan_free(plan);
    moe_ctx_free(ctx);
}

/* Dense layers are refused with MOE_EDENSE, MoE layers are reported as such, and a layer
 * past the end is MOE_ERANGE. */
static void check_layers(const fixture *fx, const json_t *meta)
{
    moe_ctx *ctx = make_ctx(1, NULL);
    moe_checkpoint *ck = NULL;
    CHECK_OK(ctx, open_fixture(ctx, fx, meta, &ck), "moe_checkpoint_open");
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(meta, "dense_layers"), i, v) {
        int64_t l = (int64_t)json_integer_value(v);
        assert_int_equal(moe_checkpoint_is_moe_layer(ck, l), 0);
        moe_layer_desc d;
        moe_status st = moe_checkpoint_layer_desc(ck, l, &d);
        if (st != MOE_EDENSE)
            fail_msg("%s: dense layer %lld gave %s, expected MOE_EDENSE", fx->name,
                     (long long)l, moe_status_name(st));
        assert_true(strlen(moe_ctx_last_error(ctx)) > 0);
        printf("  %s: dense layer %lld refused: %s\n", fx->name, (long long)l,
               moe_ctx_last_error(ctx));
    }
    json_array_foreach(json_object_get(meta, "moe_layers"), i, v) {
        assert_int_equal(moe_checkpoint_is_moe_layer(ck, (int64_t)json_integer_value(v)), 1);
    }
    moe_layer_desc d;
    assert_int_equal(moe_checkpoint_layer_desc(ck, meta_int(meta, "num_layers"), &d), MOE_ERANGE);
    assert_int_equal(moe_checkpoint_layer_desc(ck, -1, &d), MOE_ERANGE);
    moe_checkpoint_free(ck);
    moe_ctx_free(ctx);
}

/* ---- comparisons ---------------------------------------------------------------------- */

typedef struct expected {
    moe_safetensors *f;
    moe_ctx *ctx;
    float *out, *weights, *logits, *bpath, *bterms;
    int32_t *ids;
} expected;

static void expected_load(expected *e, const fixture *fx, const char *file, int64_t T, int64_t H,
                          int64_t K, int64_t E, int with_bounds)
{
    memset(e, 0, sizeof *e);
    char path[1600];
    snprintf(path, sizeof path, "%s/%s", fx->dir, file);
    e->ctx = make_ctx(1, NULL);
    moe_status st = moe_safetensors_open(e->ctx, path, &e->f);
    if (st != MOE_OK)
        fail_msg("%s: %s", path, moe_ctx_last_error(e->ctx));
    e->out = get_tensor(e->f, path, "output", MOE_DTYPE_F32, T, H);
    e->ids = get_tensor(e->f, path, "topk_ids", MOE_DTYPE_I32, T, K);
    e->weights = get_tensor(e->f, path, "topk_weights", MOE_DTYPE_F32, T, K);
    e->logits = get_tensor(e->f, path, "router_logits", MOE_DTYPE_F32, T, E);
    if (with_bounds) {
        e->bpath = get_tensor(e->f, path, "bound_path", MOE_DTYPE_F32, T, H);
        e->bterms = get_tensor(e->f, path, "bound_terms", MOE_DTYPE_F32, T, H);
    }
}

static void expected_free(expected *e)
{
    free(e->out);
    free(e->ids);
    free(e->weights);
    free(e->logits);
    free(e->bpath);
    free(e->bterms);
    moe_safetensors_free(e->f);
    moe_ctx_free(e->ctx);
}

static void check_ids(const fixture *fx, const char *tag, const run_result *r, const int32_t *ids)
{
    for (int64_t t = 0; t < r->T; t++)
        for (int64_t k = 0; k < r->K; k++)
            if (r->ids[t * r->K + k] != ids[t * r->K + k])
                fail_msg("%s %s: topk_ids[%lld][%lld] = %d, HF has %d", fx->name, tag,
                         (long long)t, (long long)k, r->ids[t * r->K + k], ids[t * r->K + k]);
}

/* f32 class: bounds relative to the largest expected magnitude. wscale: what the HF router
 * multiplied its weights by (DeepSeek's routed_scaling_factor; libmoe reports them before it,
 * and the comparison multiplies libmoe's by it). */
static void check_f32(const fixture *fx, const char *tag, const run_result *r, const expected *e, float wscale)
{
    const size_t n = (size_t)(r->T * r->H), nk = (size_t)(r->T * r->K);
    double err = tu_max_abs_diff(r->out, e->out, n), mx = tu_max_abs(e->out, n);
    float *ws = malloc(sizeof(float) * nk);
    assert_non_null(ws);
    for (size_t i = 0; i < nk; i++)
        ws[i] = r->weights[i] * wscale;
    double werr = tu_max_abs_diff(ws, e->weights, nk), wmx = tu_max_abs(e->weights, nk);
    free(ws);
    printf("  %-28s %-14s f32 : output err/max %.3e (bound 1e-5), weights err/max %.3e "
           "(bound 1e-6)\n", fx->name, tag, err / mx, werr / wmx);
    check_ids(fx, tag, r, e->ids);
    if (!(err <= 1e-5 * mx))
        fail_msg("%s %s: max |output - HF| = %.3e > 1e-5 * max |HF| = %.3e", fx->name, tag, err,
                 1e-5 * mx);
    if (!(werr <= 1e-6 * wmx))
        fail_msg("%s %s: max |topk_weights - HF| = %.3e > 1e-6 * max = %.3e", fx->name, tag,
                 werr, 1e-6 * wmx);
}

/* bf16 class: the componentwise first-order bound of the header comment. */
static void check_bf16(const fixture *fx, const char *tag, const run_result *r,
                       const expected *e16, const expected *e32, moe_family fam, int64_t E)
{
    const int64_t T = r->T, H = r->H, K = r->K;
    const double slack = 1.05;
    const int qwen = fam != MOE_FAMILY_MIXTRAL;
    const double c_y = 1.0 + (qwen ? 1.0 : 0.0) + 1.0 + (double)(K - 1);
    const double f32_abs = 1e-5 * tu_max_abs(e16->out, (size_t)(T * H));
    double worst = 0.0, worst_w = 0.0;
    double err_max = 0.0, mx = tu_max_abs(e16->out, (size_t)(T * H));
    check_ids(fx, tag, r, e16->ids);
    for (int64_t t = 0; t < T; t++) {
        /* L_t = max_j |l_tj| from the f32 router logits (all E of them). */
        double L = 0.0;
        for (int64_t j = 0; j < E; j++)
            L = fmax(L, fabs((double)e32->logits[t * E + j]));
        for (int64_t j = 0; j < H; j++) {
            size_t i = (size_t)(t * H + j);
            double err = fabs((double)r->out[i] - (double)e16->out[i]);
            double b = slack * BF16_U *
                           ((double)e16->bpath[i] + (c_y + 2.0 * L) * (double)e16->bterms[i]) +
                       f32_abs;
            if (!(err <= b))
                fail_msg("%s %s: output[%lld][%lld]: |libmoe - HF bf16| = %.4e > bound %.4e",
                         fx->name, tag, (long long)t, (long long)j, err, b);
            worst = fmax(worst, err / b);
            err_max = fmax(err_max, err);
        }
        for (int64_t k = 0; k < K; k++) {
            size_t i = (size_t)(t * K + k);
            double err = fabs((double)r->weights[i] - (double)e16->weights[i]);
            double b = slack * BF16_U * (2.0 * L + (qwen ? 1.0 : 0.0)) * fabs((double)r->weights[i])
                       + 1e-6;
            if (!(err <= b))
                fail_msg("%s %s: topk_weights[%lld][%lld]: |libmoe - HF bf16| = %.4e > %.4e",
                         fx->name, tag, (long long)t, (long long)k, err, b);
            worst_w = fmax(worst_w, err / b);
        }
    }
    printf("  %-28s %-14s bf16: output worst err/bound %.3f, err/(u max|HF|) %.3f; "
           "weights worst err/bound %.3f\n", fx->name, tag, worst, err_max / (BF16_U * mx),
           worst_w);
}

/* Compute bf16 (moe.h MOE_COMPUTE_BF16) on a bf16 fixture. Its input and weights are bf16
 * already, so libmoe's bf16 mode departs from the exact layer only by rounding each h to bf16
 * before the down projection (relative at most u, u = 2^-8 as above) and by its f32
 * accumulation: |out_libmoe - out| <= u sum_k w_k sum_i |W_down|_ji |h_ki| + f32 <= u P_tj / 3
 * + f32, since P's factor |kappa| + 3 is at least 3. Against the f32 class (the exact layer to
 * f32 accuracy) that is the whole bound, with the 1.05 allowance; against the HF bf16 run it
 * adds to the bf16 class's bound (both runs depart from the same exact layer). Routing is f32
 * in both modes: ids and weights must equal the f32 class's as in check_f32. */
static void check_compute_bf16(const fixture *fx, const char *tag, const run_result *r, const expected *e16,
                               const expected *e32, moe_family fam, int64_t E)
{
    const int64_t T = r->T, H = r->H, K = r->K;
    const double slack = 1.05;
    const int qwen = fam != MOE_FAMILY_MIXTRAL;
    const double c_y = 1.0 + (qwen ? 1.0 : 0.0) + 1.0 + (double)(K - 1);
    const double f32_abs = 1e-5 * tu_max_abs(e32->out, (size_t)(T * H));
    double worst32 = 0.0, worst16 = 0.0;
    check_ids(fx, tag, r, e32->ids);
    for (int64_t t = 0; t < T; t++) {
        double L = 0.0;
        for (int64_t j = 0; j < E; j++)
            L = fmax(L, fabs((double)e32->logits[t * E + j]));
        for (int64_t j = 0; j < H; j++) {
            const size_t i = (size_t)(t * H + j);
            const double own = slack * BF16_U * (double)e16->bpath[i] / 3.0 + f32_abs;
            const double hf = slack * BF16_U * ((double)e16->bpath[i] + (c_y + 2.0 * L) * (double)e16->bterms[i]);
            const double err32 = fabs((double)r->out[i] - (double)e32->out[i]);
            const double err16 = fabs((double)r->out[i] - (double)e16->out[i]);
            if (!(err32 <= own))
                fail_msg("%s %s compute bf16: output[%lld][%lld]: |libmoe - HF f32| = %.4e > bound %.4e", fx->name,
                         tag, (long long)t, (long long)j, err32, own);
            if (!(err16 <= own + hf))
                fail_msg("%s %s compute bf16: output[%lld][%lld]: |libmoe - HF bf16| = %.4e > bound %.4e", fx->name,
                         tag, (long long)t, (long long)j, err16, own + hf);
            worst32 = fmax(worst32, err32 / own);
            worst16 = fmax(worst16, err16 / (own + hf));
        }
    }
    printf("  %-28s %-14s compute bf16: worst err/bound %.3f against HF f32, %.3f against HF bf16\n", fx->name, tag,
           worst32, worst16);
}

static int bits_equal(const run_result *a, const run_result *b)
{
    size_t n = (size_t)(a->T * a->H), nk = (size_t)(a->T * a->K);
    return !memcmp(a->out, b->out, n * sizeof(float)) &&
           !memcmp(a->ids, b->ids, nk * sizeof(int32_t)) &&
           !memcmp(a->weights, b->weights, nk * sizeof(float));
}

/* ---- the tests ------------------------------------------------------------------------ */

static void test_fixture(void **state)
{
    const fixture *fx = (const fixture *)*state;
    json_t *meta = load_meta(fx);
    /* E: the router's width, E + the identity experts (LongCat-Flash's router_logits [T, E + Z]) */
    const int64_t T = meta_int(meta, "T"), H = meta_int(meta, "H"), K = meta_int(meta, "K"),
                  E = meta_int(meta, "E") + meta_int_or(meta, "num_identity_experts", 0);
    const moe_family fam = family_of(meta_str(meta, "family"));

    check_layers(fx, meta);

    /* The default table and the scalar reference, 1 and 2 threads each. */
    static const char *const isas[] = {NULL, "ref"};
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        run_result r1, r2;
        run_fixture(fx, meta, 1, isas[ii], MOE_COMPUTE_F32, &r1);
        run_fixture(fx, meta, 2, isas[ii], MOE_COMPUTE_F32, &r2);
        char tag[64];
        snprintf(tag, sizeof tag, "isa=%s", isas[ii] ? isas[ii] : "auto");
        if (!bits_equal(&r1, &r2))
            fail_msg("%s %s: 1 and 2 threads give different bits", fx->name, tag);

        size_t i;
        json_t *ex;
        expected e32;
        expected_load(&e32, fx, "expected.safetensors", T, H, K, E, 0);
        json_array_foreach(json_object_get(meta, "expectations"), i, ex) {
            const char *file = json_string_value(json_object_get(ex, "file"));
            const char *cls = json_string_value(json_object_get(ex, "class"));
            assert_non_null(file);
            assert_non_null(cls);
            if (!strcmp(cls, "f32")) {
                expected e;
                expected_load(&e, fx, file, T, H, K, E, 0);
                check_f32(fx, tag, &r1, &e, (float)meta_num_or(meta, "topk_weights_scale", 1.0));
                expected_free(&e);
            } else if (!strcmp(cls, "bf16")) {
                expected e;
                expected_load(&e, fx, file, T, H, K, E, 1);
                check_bf16(fx, tag, &r1, &e, &e32, fam, E);
                expected_free(&e);
            } else {
                fail_msg("%s: unknown tolerance class %s", fx->name, cls);
            }
        }
        /* compute bf16, on the fixtures HF also ran in bf16 */
        json_array_foreach(json_object_get(meta, "expectations"), i, ex) {
            const char *cls = json_string_value(json_object_get(ex, "class"));
            if (strcmp(cls, "bf16") != 0)
                continue;
            run_result b1, b2;
            run_fixture(fx, meta, 1, isas[ii], MOE_COMPUTE_BF16, &b1);
            run_fixture(fx, meta, 2, isas[ii], MOE_COMPUTE_BF16, &b2);
            if (!bits_equal(&b1, &b2))
                fail_msg("%s %s compute bf16: 1 and 2 threads give different bits", fx->name, tag);
            expected e;
            expected_load(&e, fx, json_string_value(json_object_get(ex, "file")), T, H, K, E, 1);
            check_compute_bf16(fx, tag, &b1, &e, &e32, fam, E);
            expected_free(&e);
            run_result_free(&b1);
            run_result_free(&b2);
        }
        expected_free(&e32);
        run_result_free(&r1);
        run_result_free(&r2);
    }
    json_decref(meta);
}

static int cmp_fixture(const void *a, const void *b)
{
    return strcmp(((const fixture *)a)->name, ((const fixture *)b)->name);
}

/* Every folder of $LIBMOE_TEST_DATA with a meta.json. */
static void discover(void)
{
    char root[1024];
    tu_data_path(root, sizeof root, "");
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/')
        root[--rl] = '\0';
    DIR *d = opendir(root);
    if (!d) {
        fprintf(stderr, "test_fixtures: cannot open LIBMOE_TEST_DATA folder %s\n", root);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char meta[1400];
        struct stat sb;
        snprintf(meta, sizeof meta, "%s/%s/meta.json", root, de->d_name);
        if (stat(meta, &sb) != 0)
            continue;
        if (g_n_fixtures == MAX_FIXTURES) {
            fprintf(stderr, "test_fixtures: more than %d fixtures\n", MAX_FIXTURES);
            break;
        }
        fixture *fx = &g_fixtures[g_n_fixtures++];
        snprintf(fx->name, sizeof fx->name, "%s", de->d_name);
        snprintf(fx->dir, sizeof fx->dir, "%s/%s", root, de->d_name);
    }
    closedir(d);
    qsort(g_fixtures, g_n_fixtures, sizeof g_fixtures[0], cmp_fixture);
}

static void test_required_fixtures_present(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof k_required / sizeof k_required[0]; i++) {
        int found = 0;
        for (size_t j = 0; j < g_n_fixtures; j++)
            found |= !strcmp(g_fixtures[j].name, k_required[i]);
        if (!found)
            fail_msg("fixture %s missing from LIBMOE_TEST_DATA (run tests/fixtures/gen_fixtures.py)",
                     k_required[i]);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    discover();
    struct CMUnitTest tests[MAX_FIXTURES + 1];
    size_t n = 0;
    tests[n++] = (struct CMUnitTest){"required_fixtures_present", test_required_fixtures_present,
                                     NULL, NULL, NULL};
    for (size_t i = 0; i < g_n_fixtures; i++)
        tests[n++] = (struct CMUnitTest){g_fixtures[i].name, test_fixture, NULL, NULL,
                                         &g_fixtures[i]};
    return _cmocka_run_group_tests("fixtures", tests, n, NULL, NULL);
}
