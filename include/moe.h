/*
 * libmoe: the fused Mixture-of-Experts layer of transformer LLM inference, in C11.
 *
 * This header is the whole public API and its specification. What is not here is not API.
 *
 * Pipeline (shapes use T tokens, H hidden_size, I moe_intermediate_size, E num_experts,
 * K top_k):
 *
 *   hidden_states[T,H] -> router_logits[T,E] -> topk_ids[T,K], topk_weights[T,K]
 *     -> rows grouped by expert -> w13 GEMM [2I,H] (+ bias), activation -> w2 GEMM [H,I]
 *     -> output[T,H] = routed_scaling_factor * sum_k topk_weights[t,k] * y[t,k]
 *                      (+ shared expert, optionally sigmoid-gated)
 *   (scoring, grouped top-k, biases, activations and the Llama-4 weight-on-input mode:
 *   "Layer description" below)
 *
 * Describe once, execute many: a moe_ctx holds the kernel table, threads, logging and the
 * last error; a moe_plan is a layer description compiled once; moe_weights are the expert
 * weights packed once; moe_plan_execute() runs one forward and never allocates.
 *
 * Conventions:
 *  - Every fallible call returns moe_status. Values are pinned and append-only.
 *  - On failure, moe_ctx_last_error() names the file, tensor, field or option at fault.
 *  - Every *_create / *_open has a *_free that accepts NULL.
 *  - The caller owns what it passes in; the library owns what it creates. Pointers passed
 *    to a function are borrowed for the duration of the call only, unless stated.
 *  - The library never calls exit() or abort().
 *
 * Numerics contract (docs/numerics.md has the full text):
 *  1. Accumulation in f32; outputs f32. Expert outputs stay f32 until the weighted sum.
 *  2. Top-k order: score descending, ties to the lower expert id. NaN ranks below every
 *     number; ids within a token are distinct and in [0, E) for every input.
 *  3. A token's output bits do not depend on T, on the other tokens in the batch, on the
 *     thread count or on the chunk size (batch invariance), for a given kernel table.
 *  4. routed_scaling_factor is applied once, in finalize; renormalization divides by
 *     (sum + 1e-20).
 */
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_VERSION_MAJOR 0
#define MOE_VERSION_MINOR 1
#define MOE_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define MOE_VERSION_NUMBER (MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH)

/* Run-time version of the library linked in (same encoding as MOE_VERSION_NUMBER). */
int moe_version_number(void);
/* Run-time version as "MAJOR.MINOR.PATCH". Static storage. */
const char *moe_version_string(void);

/* ---------------------------------------------------------------------------------------
 * Status codes. Pinned values, append-only.
 * ------------------------------------------------------------------------------------- */
typedef enum moe_status {
    MOE_OK = 0,
    MOE_EINVAL = 1,       /* bad argument or option value */
    MOE_ENOMEM = 2,       /* allocation failed, or a size would not fit in memory */
    MOE_EIO = 3,          /* open/read/write/mmap failed */
    MOE_EFORMAT = 4,      /* malformed file: safetensors header, JSON, truncated data */
    MOE_ENOTFOUND = 5,    /* a file, tensor or config field is missing */
    MOE_ESHAPE = 6,       /* a shape disagrees with the layer description or config */
    MOE_EDTYPE = 7,       /* a dtype is not accepted where it appears */
    MOE_EUNSUPPORTED = 8, /* valid input that libmoe does not handle (yet) */
    MOE_ERANGE = 9,       /* an index (layer, token count) out of range */
    MOE_EDENSE = 10,      /* the requested layer is a dense MLP layer, not an MoE layer */
    MOE_EWORKSPACE = 11,  /* workspace missing or smaller than moe_plan_workspace_size() */
    MOE_ETIMEOUT = 12,    /* parallel plans: a peer rank did not arrive within
                             moe_parallel_config.timeout_s (dead, hung or never called) */
    MOE_EMPI = 13,        /* parallel plans: an MPI call failed, or an earlier timeout left
                             the plan's communicator unusable */
    MOE_ECANCELED = 14    /* stopped because the caller's cancel flag was set (e.g. by a
                             signal handler: moe_quantize_options.cancel) */
} moe_status;

/* Static name of a status, e.g. "MOE_EFORMAT". Unknown values give "MOE_E?". */
const char *moe_status_name(moe_status s);

/* ---------------------------------------------------------------------------------------
 * Data types. Pinned values, append-only. Names follow safetensors ("F32", "BF16", ...).
 * ------------------------------------------------------------------------------------- */
typedef enum moe_dtype {
    MOE_DTYPE_F32 = 0,
    MOE_DTYPE_BF16 = 1,
    MOE_DTYPE_F16 = 2,
    MOE_DTYPE_I32 = 3,
    MOE_DTYPE_I64 = 4,
    MOE_DTYPE_F64 = 5,
    MOE_DTYPE_U8 = 6,
    MOE_DTYPE_I8 = 7,
    MOE_DTYPE_F8_E4M3 = 8,
    MOE_DTYPE_I16 = 9,
    MOE_DTYPE_BOOL = 10,
    MOE_DTYPE_COUNT = 11
} moe_dtype;

/* Bytes per element (0 for an unknown dtype). */
size_t moe_dtype_size(moe_dtype dt);
/* Safetensors name ("F32", "BF16", "F16", "I32", ...), or "?" for an unknown value. */
const char *moe_dtype_name(moe_dtype dt);

/* ---------------------------------------------------------------------------------------
 * Logging.
 * ------------------------------------------------------------------------------------- */
typedef enum moe_log_level {
    MOE_LOG_ERROR = 0,
    MOE_LOG_WARN = 1,
    MOE_LOG_INFO = 2,
    MOE_LOG_DEBUG = 3
} moe_log_level;

/* A log sink. `msg` is one line without the trailing newline, valid during the call. */
typedef void (*moe_log_fn)(moe_log_level level, const char *msg, void *user);

/* ---------------------------------------------------------------------------------------
 * Context.
 * ------------------------------------------------------------------------------------- */

/* Context options: every tuning knob (DESIGN.md section 5). Initialise with
 * moe_options_init(), then set fields. A field left at its "unset" value takes its default
 * from the environment variable named beside it, else the built-in default; explicit values
 * win over the environment. Every value is validated at moe_ctx_create (a bad one is
 * MOE_EINVAL naming the field or variable and what it accepts), and an unknown MOE_*
 * environment variable is logged at WARNING with the closest known name. No knob changes
 * the output bits (docs/numerics.md); each changes what runs (moe_exec_stats shows it).
 * String fields are borrowed for the duration of moe_ctx_create only. */
typedef struct moe_options {
    int num_threads;          /* >= 1; 0 = unset: MOE_NUM_THREADS, else OMP_NUM_THREADS, else cores */
    const char *isa;          /* NULL = unset: MOE_ISA = auto|ref|avx2|avx512; default auto (CPUID+XCR0) */
    int64_t chunk_size;       /* tokens per chunk (bounds the workspace); 0 = unset: MOE_CHUNK_SIZE; default 1024 */
    const char *permute;      /* NULL = unset: MOE_PERMUTE = auto|sort|onehot|packed; default auto */
    int64_t onehot_threshold; /* routed rows (T*K of a chunk) at or below which auto picks onehot;
                                 -1 = unset: MOE_ONEHOT_THRESHOLD; default 256 */
    const char *topk;         /* NULL = unset: MOE_TOPK = sort|rowmax; default sort */
    int64_t lowtok_threshold; /* rows per expert below which the few-token streaming path runs;
                                 -1 = unset: MOE_LOWTOK_THRESHOLD; default 4 */
    int64_t small_allreduce;  /* bytes; a TP chunk's all-reduce (Tc * H * 4 bytes) below this
                                 all-gathers the partials and every rank sums them; at or above,
                                 reduce-scatter + all-gather. The same bits either way ("Parallelism").
                                 -1 = unset: MOE_SMALL_ALLREDUCE; default 65536. No effect
                                 without TP. */
    const char *tp_reduce;    /* NULL = unset: MOE_TP_REDUCE = allreduce|reduce_scatter; default
                                 allreduce (every TP rank gets every output row);
                                 reduce_scatter: each TP rank gets its share of the rows
                                 (moe_plan_tp_rows). No effect without TP. */
    const char *tuning_dir;   /* NULL = unset: MOE_TUNING_DIR, an existing folder; default none.
                                 No tuning files are defined yet: recorded and reported only. */
    int log_level;            /* moe_log_level; -1 = unset: MOE_LOG_LEVEL = error|warn|info|debug; default warn */
    moe_log_fn log_fn;        /* NULL = stderr, prefixed "libmoe: LEVEL: " */
    void *log_user;           /* passed to log_fn */
} moe_options;

/* Fill `opts` with "unset" values. */
void moe_options_init(moe_options *opts);

/* Where a resolved knob's value came from. */
typedef enum moe_knob_source {
    MOE_KNOB_DEFAULT = 0,
    MOE_KNOB_ENV = 1, /* the environment variable */
    MOE_KNOB_API = 2  /* a moe_options field (the command line's flags set these) */
} moe_knob_source;

/* One knob, resolved. */
typedef struct moe_knob_info {
    const char *field;    /* moe_options field, e.g. "chunk_size" */
    const char *env;      /* environment variable, e.g. "MOE_CHUNK_SIZE" */
    const char *accepted; /* what it accepts, e.g. "integer >= 1 (tokens)" */
    const char *doc;      /* what it switches */
    char value[256];      /* resolved value in canonical text ("" for an unset path) */
    moe_knob_source source;
    char error[256];      /* non-empty when the given value is invalid */
} moe_knob_info;

/* Number of knobs (the rows of `moe env`). */
size_t moe_knob_count(void);
/* Resolve knob i (0 <= i < moe_knob_count()) from `opts` (may be NULL) and the environment,
 * as moe_ctx_create would, without failing: a bad value is described in out->error.
 * MOE_ERANGE for i out of range. */
moe_status moe_knob_describe(const moe_options *opts, size_t i, moe_knob_info *out);
/* The i-th MOE_* environment variable that no knob reads (0-based), with the closest known
 * name. Returns 0 when there is no i-th such variable. name/suggestion are static or point
 * into the environment; valid until the environment changes. */
int moe_env_unknown(size_t i, const char **name, size_t *name_len, const char **suggestion);

typedef struct moe_ctx moe_ctx;

/* Create a context. `opts` may be NULL (all unset). Environment variables are read once,
 * here. Errors: MOE_EINVAL for a bad option or environment value (the message names the
 * variable and what it accepts; with out_err_msg non-NULL the message is also copied
 * there, since no ctx exists to hold it), MOE_ENOMEM. */
moe_status moe_ctx_create(const moe_options *opts, moe_ctx **out, char *out_err_msg,
                          size_t out_err_len);
void moe_ctx_free(moe_ctx *ctx);

/* The message of the last failed call made with this ctx (or on an object created from
 * it). Empty string when none. Valid until the next failing call on the same ctx. */
const char *moe_ctx_last_error(const moe_ctx *ctx);

/* Resolved settings. */
int moe_ctx_num_threads(const moe_ctx *ctx);
/* The resolved knobs in canonical text form: "key=value;" pairs in a fixed order, every knob
 * except the logging ones (which change no computation). Static per ctx. */
const char *moe_ctx_options_text(const moe_ctx *ctx);
/* XXH64 (seed 0) of moe_ctx_options_text(): the key of tuning files, compared across ranks. */
uint64_t moe_ctx_options_hash(const moe_ctx *ctx);
/* Name of the kernel table in use: "ref", "avx2" or "avx512". */
const char *moe_ctx_isa(const moe_ctx *ctx);

/* ---------------------------------------------------------------------------------------
 * Layer description.
 *
 * One token x [H] through one MoE layer, in this order (docs/numerics.md has the rounding,
 * and the NaN / Inf rules of every step):
 *
 *   l   = Wr x (+ b_r, has_router_bias)              router logits [E], f32
 *   s   = score(l)                                   scoring_func
 *   c   = s or l (per scoring_func) (+ b_s, has_selection_bias)   selection key [E]
 *   groups (n_group > 1): each group's score from c (group_score); the topk_group best
 *         groups are kept and c = -inf on every expert of the others
 *   ids = the K best experts by c: descending, ties to the lower id, NaN below every number
 *   w_k = the weight of ids[k] (scoring_func; never includes b_s);
 *         w_k = w_k / (sum_k w_k + 1e-20) with renormalize (sum in top-k order)
 *   y_k = expert_{ids[k]}(x), or expert_{ids[k]}(w_k * x) with apply_router_weight_on_input
 *   out = routed_scaling_factor * sum_k w_k y_k      (sum_k y_k with apply_router_weight_on_input)
 *         + g_sh * shared(x)                         g_sh = sigmoid(w_sg . x) if gated, else 1
 *
 * Each family, as its checkpoint adapter (moe_checkpoint_layer_desc) sets it, from the
 * config.json fields named (HF transformers 5.24's modeling code is the reference):
 *   Mixtral       softmax, renormalize always
 *   Qwen2/3-MoE   softmax, renormalize = norm_topk_prob; Qwen2: shared expert, gated
 *   Qwen3-Next    softmax, renormalize = norm_topk_prob; shared expert, gated
 *   Qwen3.5-MoE   softmax, renormalize always; shared expert, gated
 *   OLMoE         softmax, renormalize = norm_topk_prob
 *   DeepSeek-V2   softmax (scoring_func); topk_method "greedy", or "group_limited_greedy":
 *                 n_group, topk_group, group score max; no renormalize (transformers ignores
 *                 norm_topk_prob for V2); routed_scaling_factor; n_shared_experts * I shared,
 *                 ungated
 *   DeepSeek-V3   sigmoid; e_score_correction_bias; n_group, topk_group, group score top-2
 *                 sum; renormalize = norm_topk_prob; routed_scaling_factor; shared ungated
 *   gpt-oss       top-k softmax on l = Wr x + router bias; clamped SwiGLU with biases
 *   Llama-4       top-k sigmoid on l, weight applied to the expert input; shared, ungated
 *   Granite-MoE   top-k softmax on l
 * ------------------------------------------------------------------------------------- */

/* Router scoring: the scores, the selection key and the weights, from the logits l. */
typedef enum moe_scoring {
    /* s = softmax over the E logits in f32; select on s (+ b_s); w_k = s[ids[k]].
     * Mixtral, Qwen2/3-MoE, Qwen3-Next, Qwen3.5-MoE, OLMoE, DeepSeek-V2 (`scoring_func`
     * "softmax"). */
    MOE_SCORING_SOFTMAX = 0,
    /* s = sigmoid(l) = 1 / (1 + exp(-l)) elementwise; select on s (+ b_s); w_k = s[ids[k]].
     * DeepSeek-V3/R1, Kimi-K2 (`scoring_func` "sigmoid"). */
    MOE_SCORING_SIGMOID = 1,
    /* Top-k first, on the logits: select on l (+ b_s); w = softmax over the K selected logits
     * l[ids[0..K-1]] (max and sum in top-k order). Granite-MoE; gpt-oss (its l includes the
     * router bias). Equal in exact arithmetic to softmax + renormalize, but selects on the
     * logits as those models do. */
    MOE_SCORING_TOPK_SOFTMAX = 2,
    /* Top-k first, on the logits: select on l (+ b_s); w_k = sigmoid(l[ids[k]]). Llama-4
     * (with apply_router_weight_on_input). */
    MOE_SCORING_TOPK_SIGMOID = 3
} moe_scoring;

/* The score of a group of experts in group-limited selection (n_group > 1), from the
 * selection keys c of its members, ranked as top-k ranks them (NaN last). */
typedef enum moe_group_score {
    MOE_GROUP_SCORE_MAX = 0,     /* the best c: DeepSeek-V2 `topk_method` "group_limited_greedy" */
    MOE_GROUP_SCORE_TOP2_SUM = 1 /* best c + second best c (IEEE add; a group of one expert:
                                    its c): DeepSeek-V3 `topk_method` "noaux_tc" */
} moe_group_score;

/* Expert MLP activation. Every expert computes g = Wg x (+ b_g), u = Wu x (+ b_u) (I each),
 * h = act(g, u), y = Wd h (+ b_d). Config `hidden_act` picks the gate function (gpt-oss:
 * always MOE_ACT_SWIGLU_OAI). No family of ../shared/MODELS.md uses the GELU gates today
 * (every one has hidden_act "silu"); they are here for checkpoints that set them. */
typedef enum moe_activation {
    MOE_ACT_SWIGLU = 0,     /* h = silu(g) * u, silu(v) = v / (1 + exp(-v)); "silu", "swish" */
    MOE_ACT_GEGLU = 1,      /* h = gelu(g) * u, gelu(v) = (0.5 v) (1 + erf(v / sqrt(2))); "gelu" */
    MOE_ACT_GEGLU_TANH = 2, /* h = gelu_tanh(g) * u, gelu_tanh(v) =
                               (0.5 v) (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)));
                               "gelu_pytorch_tanh", "gelu_new" */
    MOE_ACT_SWIGLU_OAI = 3  /* gpt-oss (GptOssExperts._apply_gate): g' = min(g, limit),
                               u' = clamp(u, -limit, limit), h = (u' + 1) * (g' * sigmoid(alpha g')),
                               alpha = swiglu_alpha, limit = swiglu_limit. NaN stays NaN. */
} moe_activation;

/* ---------------------------------------------------------------------------------------
 * Quantized experts (vLLM's FusedMoEQuantConfig). The routed experts' w13 (gate and up) and
 * w2 (down) may each hold quantized codes with scales; the router, biases and the shared
 * expert stay in weight_dtype. A weight element stands for
 *   w = v * s          (v the code's value: e4m3, int8, signed int4, e2m1; s its scale)
 *   w = (v - z) * s    (int4 with zero points: v the unsigned nibble 0..15, z in 0..15).
 * Weight-only kernels compute each scale group's dot product on the values v in f32 (one
 * fmaf per term, increasing k; zero points: minus z times the group's sum of x), then add it
 * times s with one fmaf per group: the same bits on every kernel table and batch, within f32
 * reassociation of the f32 path on the dequantized weights (docs/numerics.md section 5).
 *
 * Scale granularity, and the scale array the caller passes per expert and matrix
 * ([N, K] = the matrix's [out_features, in_features]: w13 gate and up [I, H], w2 [H, I]):
 *   MOE_QSCALE_TENSOR   one f32
 *   MOE_QSCALE_CHANNEL  [N] f32 (one per output feature)
 *   MOE_QSCALE_BLOCK    [ceil(N / block_n), ceil(K / block_k)] f32, row-major (vLLM's
 *                       [E, ceil(N/bn), ceil(K/bk)] per expert; DeepSeek-V3 / Qwen3-FP8
 *                       `weight_scale_inv`, which multiplies); partial trailing blocks use
 *                       the ceil-sized grid
 *   MOE_QSCALE_GROUP    [N, ceil(K / group_size)]: f32, or for MXFP4 u8 E8M0 exponents
 *                       (s = 2^(e - 127), e = 255 is NaN); zero points (INT4 only) have the
 *                       same shape, u8 values 0..15
 * Codes, row-major [N, K] per expert (strides unsupported): F8_E4M3 and I8 one byte per
 * element; INT4 and MXFP4 two per byte along K, low nibble = even k (K must be even),
 * [N, K/2] bytes (gpt-oss `*_blocks` [N, K/32, 16] is the same bytes).
 *
 * Accepted combinations (anything else is refused by moe_plan_create with a message naming
 * the field):
 *   F8_E4M3: TENSOR, CHANNEL or BLOCK scales; activations NONE (weight-only); or BLOCK
 *            scales with activations TOKEN_GROUP and act_group_size == block_k of w13 and of
 *            w2 ("fp8-block-w8a8", fp8 w8a8 as DeepSeek-V3 / Qwen3-FP8 run it; how the FP8
 *            block checkpoints' `activation_scheme: dynamic` is served; moe_checkpoint still
 *            loads them weight-only as fp8-block, pick fp8-block-w8a8 in the descriptor).
 *   I8:      TENSOR, CHANNEL, BLOCK or GROUP scales with activations NONE; or CHANNEL /
 *            TENSOR scales with activations TOKEN (w8a8: int8 x int8 -> int32, AVX512-VNNI).
 *            TOKEN activations with BLOCK weights are refused (they need per-token-group
 *            activations matching block_k, not implemented for int8).
 *   INT4:    GROUP scales, group_size 32, 64 or 128 (optional zero points), or CHANNEL;
 *            activations NONE.
 *   MXFP4:   GROUP scales with group_size 32, no zero points; activations NONE.
 *   block_n, block_k in [1, 2^20]; w13 and w2 are configured independently but must both be
 *   quantized or both NONE; TOKEN_GROUP with other weights, or with act_group_size !=
 *   block_k, is MOE_EUNSUPPORTED.
 * Under EP / TP ("Parallelism" below) the caller passes the whole layer's source arrays (the
 *   other EP ranks' experts may be NULL); each rank packs its experts and, under TP, the gate/up
 *   rows and down columns [i0, i0 + I_t) of each, cut from the source codes and scales. A block
 *   or group cut by a shard boundary keeps its scale on both shards; a shard that starts inside a
 *   cell and leaves it is re-expressed with cells of gcd(cell, i0 mod cell) (e.g. Qwen3-30B-A3B-
 *   FP8, I = 768 at tp_size 4: shards 1 and 3 keep the down scales per 64 columns), the cut
 *   cell's scale repeated; no code is padded and the repeated scale bytes are logged (INFO, and
 *   per rank by `moe plan`). The weights are the same, so EP output is bit-identical to one
 *   process and TP output matches it within the TP bound. INT4 / MXFP4 need an even I_t on
 *   every rank (two codes per byte along I): moe_weights_create fails with MOE_ESHAPE on a rank
 *   whose shard is odd. w8a8 (TOKEN) under TP quantizes the down projection's input per shard:
 *   the per-token scale is max |h| over the rank's I_t columns (as vLLM's TP does), so TP w8a8
 *   output is the sum of per-shard w8a8 partials, not within the TP bound of one process.
 *   fp8 w8a8 (TOKEN_GROUP) under TP needs every rank's shard of I to start on a multiple of
 *   w2's block_k (so the activation groups of h line up with the weight blocks; e.g. I = 768
 *   over tp_size 2 or 3, not 4 or 5); otherwise moe_plan_create fails with MOE_EUNSUPPORTED.
 *   The groups then lie inside one rank, so every code and group scale is the one-process
 *   value and TP fp8 w8a8 output matches one process within the TP bound (only the sums are
 *   reassociated; docs/numerics.md section 6, tested under mpirun). EP is unaffected.
 * Dynamic activation quantization (TOKEN, int8): per row r of the GEMM input (the token's
 * hidden state before w13; the activation output h before w2), a = max_k |x[r][k]| (NaN
 * ignored), s = a / 127, q = rint(clamp(x / s, -127, 127)) (a NaN quotient gives -127);
 * an all-zero row gets s = 1 and q = 0, so its GEMM output is exactly 0 (R14).
 * Dynamic activation quantization (TOKEN_GROUP, fp8; vLLM per_token_group_quant_fp8): per
 * row and per group g of act_group_size consecutive channels (the last one partial),
 * a = max |x| over the group (NaN ignored), s[g] = max(a, 1e-10) / 448, q = e4m3(clamp(x /
 * s[g], -448, 448)) round to nearest even (a NaN element gives the NaN code; an infinite one
 * makes the group's s infinite and its own q NaN: the token's outputs are NaN). The GEMM
 * (vLLM w8a8_block_fp8_matmul): y = +0, then per group g in increasing order
 * y = y + (part_g * s[g]) * s_w[n / block_n][g], part_g the fmaf chain in increasing k from +0
 * of dec(q_x[k]) * dec(q_w[n][k]) over the group (docs/numerics.md section 5).
 * ------------------------------------------------------------------------------------- */
typedef enum moe_qtype {
    MOE_QTYPE_NONE = 0,    /* weight_dtype, unquantized */
    MOE_QTYPE_F8_E4M3 = 1, /* e4m3fn: bias 7, no infinities, 0x7f / 0xff NaN, max 448 */
    MOE_QTYPE_I8 = 2,      /* int8, symmetric */
    MOE_QTYPE_INT4 = 3,    /* 4-bit, signed -8..7, or unsigned 0..15 with zero points */
    MOE_QTYPE_MXFP4 = 4    /* e2m1 (OCP MX), E8M0 scale per 32 along K (gpt-oss) */
} moe_qtype;

typedef enum moe_qscale {
    MOE_QSCALE_TENSOR = 0,
    MOE_QSCALE_CHANNEL = 1,
    MOE_QSCALE_BLOCK = 2,
    MOE_QSCALE_GROUP = 3
} moe_qscale;

typedef enum moe_qact {
    MOE_QACT_NONE = 0,       /* weight-only: f32 activations */
    MOE_QACT_TOKEN = 1,      /* dynamic, one scale per row (token) */
    MOE_QACT_TOKEN_GROUP = 2 /* dynamic, one scale per row per act_group_size channels */
} moe_qact;

typedef struct moe_qweight {
    moe_qtype dtype;         /* default NONE */
    moe_qscale scale;        /* granularity of the scales */
    int64_t block_n, block_k;/* MOE_QSCALE_BLOCK: block shape [out, in] (e.g. 128, 128) */
    int64_t group_size;      /* MOE_QSCALE_GROUP: elements along K per scale */
    int has_zero_point;      /* INT4 with GROUP scales: w = (q - z) * s (GPTQ / AWQ style) */
} moe_qweight;

typedef struct moe_quant_config {
    moe_qweight w13;         /* gate and up projections */
    moe_qweight w2;          /* down projection */
    moe_qact act;            /* activation quantization before each GEMM; default NONE */
    int64_t act_group_size;  /* MOE_QACT_TOKEN_GROUP: channels per scale (128) */
} moe_quant_config;

/* Static short name of a scheme for logs and the command line: "none", "fp8-tensor",
 * "fp8-channel", "fp8-block", "fp8-block-w8a8" (act TOKEN_GROUP, act_group_size 128),
 * "int8-channel", "int8-w8a8", "int4-g128", "int4-g128-zp",
 * "mxfp4", ... ("custom" for anything else). */
const char *moe_quant_name(const moe_quant_config *q);
/* Fill `q` with the named scheme (the names above; group sizes g32 g64 g128; "fp8-block"
 * is 128x128). MOE_EINVAL for an unknown name. */
moe_status moe_quant_from_name(const char *name, moe_quant_config *q);

/* Quantize one f32 matrix w [N, K] row-major (an expert's gate or up [I, H], down [H, I])
 * into the source format `qw` describes (codes, scales and zero points in the shapes above,
 * ready for moe_weight_source), as `moe quantize`-style tools and tests need it. Absmax per
 * scale cell: s = max|w| / qmax (448 e4m3, 127 int8, 7 int4; with zero points
 * s = (max - min) / 15 and z = rint(-min / s) clamped to 0..15; MXFP4 E8M0 exponent
 * floor(log2 max|w|) - 2 + 127 clamped to 0..254), s = 1 for an all-zero cell; codes round
 * to nearest even and saturate. moe_quantize_matrix_sizes gives the byte counts of the three
 * buffers (zero_bytes 0 without zero points). Both return MOE_EINVAL (nothing written) for a
 * qw that moe_plan_create would refuse whatever the activations (dtype NONE, N or K <= 0,
 * odd K for INT4 / MXFP4, block / group sizes < 1, zero points other than INT4 GROUP, MXFP4
 * without GROUP scales) and MOE_ENOMEM; w is not modified. */
moe_status moe_quantize_matrix_sizes(const moe_qweight *qw, int64_t N, int64_t K, size_t *code_bytes,
                                     size_t *scale_bytes, size_t *zero_bytes);
moe_status moe_quantize_matrix(const moe_qweight *qw, const float *w, int64_t N, int64_t K, void *codes,
                               void *scale, uint8_t *zero);

/* Model family the description came from. Informational; the fields below decide the math. */
typedef enum moe_family {
    MOE_FAMILY_CUSTOM = 0,
    MOE_FAMILY_MIXTRAL = 1,      /* MixtralForCausalLM */
    MOE_FAMILY_QWEN2_MOE = 2,    /* Qwen2MoeForCausalLM */
    MOE_FAMILY_QWEN3_MOE = 3,    /* Qwen3MoeForCausalLM */
    MOE_FAMILY_DEEPSEEK_V2 = 4,  /* DeepseekV2ForCausalLM */
    MOE_FAMILY_DEEPSEEK_V3 = 5,  /* DeepseekV3ForCausalLM (also Kimi-K2) */
    MOE_FAMILY_GPT_OSS = 6,      /* GptOssForCausalLM */
    MOE_FAMILY_LLAMA4 = 7,       /* Llama4ForConditionalGeneration, Llama4ForCausalLM */
    MOE_FAMILY_OLMOE = 8,        /* OlmoeForCausalLM */
    MOE_FAMILY_GRANITE_MOE = 9,  /* GraniteMoeForCausalLM */
    MOE_FAMILY_QWEN3_5_MOE = 10, /* Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeForCausalLM */
    MOE_FAMILY_QWEN3_NEXT = 11   /* Qwen3NextForCausalLM */
} moe_family;

/* Static name of a family (its config `model_type`): "custom", "mixtral", "qwen2_moe",
 * "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4", "olmoe", "granitemoe",
 * "qwen3_5_moe", "qwen3_next"; "?" for an unknown value. */
const char *moe_family_name(moe_family f);

/* One MoE layer. Initialise with moe_layer_desc_init(), then set the fields. */
typedef struct moe_layer_desc {
    moe_family family;
    int64_t hidden_size;           /* H, config `hidden_size` */
    int64_t moe_intermediate_size; /* I per expert, config `moe_intermediate_size`
                                      (Mixtral, OLMoE, Granite, gpt-oss, Llama-4:
                                      `intermediate_size`) */
    int64_t num_experts;           /* E, config `num_experts` / `num_local_experts` /
                                      `n_routed_experts` */
    int64_t top_k;                 /* K, config `num_experts_per_tok`; 1 <= K <= E */
    moe_scoring scoring_func;      /* default softmax */
    int renormalize;               /* divide the K weights by (sum + 1e-20): Mixtral and
                                      Qwen3.5 always; Qwen2/3-MoE, Qwen3-Next, OLMoE,
                                      DeepSeek-V3 config `norm_topk_prob` */
    float routed_scaling_factor;   /* multiplies the routed sum once in finalize; default 1;
                                      DeepSeek config `routed_scaling_factor` */
    moe_activation activation;     /* default SwiGLU */
    int64_t shared_expert_intermediate_size; /* I_s, 0 = no shared expert. Qwen2-MoE,
                                      Qwen3-Next, Qwen3.5: `shared_expert_intermediate_size`;
                                      DeepSeek: `n_shared_experts` * `moe_intermediate_size`;
                                      Llama-4: `intermediate_size` */
    int shared_expert_gated;       /* 1: shared output times sigmoid(w_sg . x) (Qwen2-MoE,
                                      Qwen3-Next, Qwen3.5); 0: added as is (DeepSeek, Llama-4) */
    moe_dtype weight_dtype;        /* expert and shared-expert weights: F32, BF16 or F16 */

    /* Group-limited selection (DeepSeek): n_group groups of E / n_group consecutive experts
     * (config `n_group`); 0 or 1 = off. When on: E % n_group == 0,
     * 1 <= topk_group <= n_group, and topk_group * (E / n_group) >= top_k. Groups are ranked
     * by group_score like experts (descending, lower group first, NaN last); the experts of
     * the groups not kept get c = -inf (transformers' masked_fill(-inf); DeepSeek-V2 fills
     * 0.0 over softmax scores, which selects the same experts unless a kept score is 0). */
    int64_t n_group;
    int64_t topk_group;            /* groups kept, config `topk_group` */
    moe_group_score group_score;   /* default MOE_GROUP_SCORE_MAX */
    int has_selection_bias;        /* add b_s [E] to the selection key only (DeepSeek-V3
                                      `mlp.gate.e_score_correction_bias`); the weights stay
                                      the unbiased scores. moe_weight_source.selection_bias */
    int has_router_bias;           /* l = Wr x + b_r (gpt-oss `mlp.router.bias`): added in
                                      f32 after the dot product, and reported in l; caller-
                                      supplied router_logits are taken as complete (not
                                      biased again). moe_weight_source.router_bias */
    int has_expert_bias;           /* per-expert b_g, b_u [I] and b_d [H] (gpt-oss
                                      `gate_up_proj_bias`, `down_proj_bias`), each added in
                                      f32 after its dot product. Not for the shared expert. */
    int apply_router_weight_on_input; /* Llama-4: y_k = expert(w_k * x) (the product rounded
                                      to f32 per element, before the gate/up projections),
                                      and the combine sums the y_k unweighted, so the weight
                                      is applied exactly once. The shared expert gets x. */
    float swiglu_alpha;            /* MOE_ACT_SWIGLU_OAI: config `swiglu_alpha`, default 1.702 */
    float swiglu_limit;            /* MOE_ACT_SWIGLU_OAI: config `swiglu_limit`, default 7;
                                      must be > 0 */
    moe_quant_config quant;        /* quantized routed experts ("Quantized experts" above);
                                      default all NONE: experts in weight_dtype */
} moe_layer_desc;

/* Defaults: family custom, softmax, renormalize 0, routed_scaling_factor 1, SwiGLU, no
 * shared expert, weight_dtype BF16, no groups (group score max), no biases, weights applied
 * to the output, swiglu_alpha 1.702, swiglu_limit 7; sizes 0 (must be set). */
void moe_layer_desc_init(moe_layer_desc *desc);

/* ---------------------------------------------------------------------------------------
 * Plan: a layer description compiled once.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_plan moe_plan;

/* Validate `desc` and compile a plan on `ctx` (borrowed: it must outlive the plan).
 * Errors: MOE_EINVAL naming the bad field (sizes <= 0, K > E, non-finite or <= 0
 * routed_scaling_factor), MOE_EDTYPE (weight dtype not F32/BF16/F16), MOE_EUNSUPPORTED
 * (sigmoid scoring, not yet implemented), MOE_ENOMEM. */
moe_status moe_plan_create(moe_ctx *ctx, const moe_layer_desc *desc, moe_plan **out);
void moe_plan_free(moe_plan *plan);

/* The modular kernel (DESIGN.md section 6, vLLM's FusedMoEPrepareAndFinalize /
 * FusedMoEPermuteExpertsUnpermute split). A plan composes a prepare/finalize and an experts
 * implementation; each declares the activation format it produces or consumes. */
typedef enum moe_act_format {
    MOE_FORMAT_STANDARD = 0, /* rows [T*K, H] grouped by expert, with offsets [E+1] */
    MOE_FORMAT_BATCHED = 1   /* [E, capacity, H] slots with per-expert counts [E]: the
                                low-latency expert-parallel layout */
} moe_act_format;

typedef enum moe_prepare_finalize_kind {
    MOE_PF_LOCAL = 0,         /* one process; produces the standard format */
    MOE_PF_LOCAL_BATCHED = 1, /* one process; produces the batched format */
    MOE_PF_EP_ALLTOALL = 2,   /* expert parallel over MPI_Alltoallv; the standard format
                                 (high throughput). Needs parallel.ep_size > 1 */
    MOE_PF_EP_BATCHED = 3     /* expert parallel, low latency: one MPI_Alltoall of fixed-size
                                 slot blocks; the batched format. Needs parallel.ep_size > 1 */
} moe_prepare_finalize_kind;

typedef enum moe_experts_kind {
    MOE_EXPERTS_GROUPED = 0, /* grouped GEMM over the standard format */
    MOE_EXPERTS_BATCHED = 1  /* per-expert GEMM over the batched format */
} moe_experts_kind;

/* ---------------------------------------------------------------------------------------
 * Parallelism: expert (EP) and tensor (TP) parallelism over MPI (DESIGN.md section 7).
 *
 * A parallel plan spans ep_size * tp_size MPI processes ("ranks"). Every rank creates the
 * plan from the same description, knobs and composition, with its own coordinates
 * (ep_rank, tp_rank), and packs only its own share of the weights.
 *
 *  - EP: experts are placed contiguously. EP rank r holds E / ep_size experts, plus one when
 *    r < E % ep_size (128 experts on 6 ranks: 22,22,21,21,21,21), global ids
 *    [first_r, first_r + count_r); moe_plan_expert_map() gives the global -> local map. Each
 *    EP rank brings its own tokens (n_tokens may differ per rank: data-parallel attention
 *    feeding EP is the normal case). A rank routes its tokens (the router is replicated),
 *    sends each (token, k) row and the local id of expert ids[t][k] to the rank that holds
 *    it, runs its experts on the rows it receives (grouped by local expert, stable), sends
 *    the expert outputs back and combines them locally in top-k order. Each row's expert
 *    output is computed by the same kernel in the same order as in one process and the
 *    combine order is unchanged, so with dispatch_dtype F32 the output is bit-identical to
 *    one process (numerics contract 3 holds across ep_size). An expert id outside every
 *    rank's range is an error (MOE_EINVAL on every rank), never dropped.
 *  - TP: every expert's intermediate dimension is split: tp_rank t holds the columns
 *    [i0_t, i0_t + I_t) of the gate/up rows and down columns, I_t = I / tp_size plus one when
 *    t < I % tp_size (an uneven split, no padding), and the same split of the shared
 *    expert's I_s (b_g, b_u follow the split; b_d is added by tp_rank 0 only). Each rank
 *    computes the partial layer output over its columns (routed sum and shared expert, the
 *    same combine), and the ranks of a TP group sum the partials deterministically: every
 *    element as ((p_0 + p_1) + p_2) + ... in tp_rank order, the same expression on every rank
 *    and for both all-reduce algorithms, so TP output is bit-for-bit reproducible run to run
 *    and identical on every rank of the group. The split changes the order of the down
 *    projection's sum, so TP output matches one process within the f32 bound
 *    (max |tp - one| <= 1e-5 max |one|; tests/mpi), not bit for bit. Knobs:
 *      MOE_SMALL_ALLREDUCE: below this many bytes per chunk (Tc * H * 4) the partials are
 *        all-gathered and summed by every rank; at or above, each rank sums one contiguous
 *        slice of the elements (reduce-scatter) and the slices are all-gathered;
 *      MOE_TP_REDUCE=reduce_scatter: output sharded over tokens. tp_rank t receives the
 *        rows [r0_t, r0_t + n_t) of the execute's T tokens, n_t = T / tp_size plus one when
 *        t < T % tp_size (r0_t the sum of the earlier n), written at their own place in
 *        output[T, H]; the other rows of output are not written. moe_plan_tp_rows() gives
 *        the range. topk_ids and topk_weights are written in full on every rank.
 *  - TP x EP: rank (ep_rank, tp_rank) holds the experts of ep_rank at I shard tp_rank. The
 *    dispatch runs among the ranks with the same tp_rank, the TP sum among the ranks with the
 *    same ep_rank (a TP group shares its tokens).
 *  - Shared expert (R17): under EP every rank runs it for its own tokens; under TP it is split
 *    like the experts and summed by the reduction: it is added exactly once.
 *
 * Plan creation is collective over `comm`: the ranks exchange moe_plan_hash() and
 * moe_plan_text() (description, knobs and composition, without the coordinates) and their
 * coordinates. A mismatch fails on every rank with MOE_EINVAL naming the first differing
 * key and both values (rank 0's and the differing rank's), as do duplicate or out-of-range
 * coordinates and a communicator whose size is not ep_size * tp_size. Every collective is
 * nonblocking and polled against timeout_s: a rank that never arrives, hangs or dies gives
 * MOE_ETIMEOUT on the others instead of a hang.
 *
 * moe_plan_execute_ex on a parallel plan is collective over the plan's ranks:
 *  - every rank calls it the same number of times, in the same order, never concurrently on
 *    one plan; also with n_tokens = 0 (hidden_states and output may then be NULL): the
 *    rank still runs its experts for its peers;
 *  - the ranks of a TP group pass the same tokens (hidden_states, router_logits, n_tokens);
 *  - the workspace must be moe_plan_workspace_size(plan, M) bytes where M >= the most tokens
 *    ANY rank passes to that execute (it sizes the rows received from peers);
 *  - a rank whose arguments are invalid, or whose workspace is too small for the chunk its
 *    peers use, fails and makes every rank fail (the message names the rank), before any
 *    data moves; a peer that dies or stops calling gives MOE_ETIMEOUT within timeout_s, an
 *    MPI failure MOE_EMPI. Collectives cannot be cancelled: after MOE_ETIMEOUT or MOE_EMPI
 *    the plan is unusable (every later execute fails with MOE_EMPI) and the usual recovery
 *    is MPI_Abort by the application (the library never calls it).
 * The caller initializes MPI (MPI_Init, or MPI_Init_thread with at least
 * MPI_THREAD_FUNNELED: libmoe calls MPI only from the thread that calls it) before creating a
 * parallel plan and finalizes it only after freeing the plan. Without MPI (CMake option
 * MOE_WITH_MPI=OFF, moe_mpi_available() = 0) the same symbols exist and only
 * ep_size = tp_size = 1 works; anything else is MOE_EUNSUPPORTED naming the option.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_parallel_config {
    int ep_size;    /* expert-parallel ranks, 1 <= ep_size <= E; default 1 */
    int ep_rank;    /* this rank's EP coordinate in [0, ep_size); -1 = from the rank r in
                       comm: r / tp_size. Default 0 */
    int tp_size;    /* tensor-parallel ranks, 1 <= tp_size <= I (and <= I_s with a shared
                       expert); default 1 */
    int tp_rank;    /* in [0, tp_size); -1 = from comm: r % tp_size (TP ranks adjacent, as
                       vLLM places them). Default 0 */
    int dp_size;    /* informational (vLLM's data-parallel attention ranks feeding EP: each
                       brings its own tokens, which EP already allows); >= 1, default 1 */
    int dp_rank;    /* in [0, dp_size); default 0 */
    void *comm;     /* pointer to an MPI_Comm holding exactly the ep_size * tp_size ranks
                       (borrowed during moe_plan_create_ex, which duplicates it); NULL =
                       MPI_COMM_WORLD */
    int low_latency;/* 1: the batched format (MOE_PF_EP_BATCHED when ep_size > 1, else
                       MOE_PF_LOCAL_BATCHED, with MOE_EXPERTS_BATCHED), whatever
                       prepare_finalize and experts say. Instead of a count exchange plus
                       MPI_Alltoallv, one MPI_Alltoall of fixed-size blocks each way: per
                       destination cap * min(K, ceil(E / ep_size)) row slots, cap = the
                       execute's longest chunk; the receiver runs the experts on batched
                       slots [E_local, ep_size * cap]. Chunks are cut to batched_capacity
                       tokens, so neither a block nor an expert's slots can overflow (an
                       overflow would fail every rank; no row is ever dropped). Fewer
                       collectives, more bytes (the whole block is sent). Default 0 */
    moe_dtype dispatch_dtype; /* the activations sent by the EP dispatch: F32 (default,
                       exact, bit-identical to one process); F8_E4M3 (e4m3fn, per-row
                       scale max|x| / 448: each element rounded to 4 significant bits,
                       relative error <= 2^-4, elements below max|x| * 2^-9 / 448 flushed
                       toward 0) or I8 (per-row scale max|x| / 127: absolute error <= max|x|
                       / 254 per element) cut the dispatched bytes about 4x. Lossy: on
                       random layers (H = 256, tests/mpi "quant") the layer output moves by
                       3.2% (F8_E4M3) and 0.41% (I8) of max |output| (asserted below 5% and
                       1%), against 0 for F32; routing is unaffected (it precedes the
                       dispatch); a row holding Inf or NaN becomes NaN. Expert outputs always
                       return in f32. Needs ep_size > 1 */
    double timeout_s;  /* seconds a collective may wait for the peers before MOE_ETIMEOUT;
                          > 0, default 300 (a peer still packing weights is indistinguishable
                          from a dead one: allow for the slowest load) */
} moe_parallel_config;

/* 1 when libmoe was built with MPI (CMake option MOE_WITH_MPI), else 0. */
int moe_mpi_available(void);

typedef struct moe_plan_config {
    moe_prepare_finalize_kind prepare_finalize; /* default MOE_PF_LOCAL; with ep_size > 1 the
                                 local kinds become the EP kind of the same format
                                 (MOE_PF_LOCAL -> MOE_PF_EP_ALLTOALL, MOE_PF_LOCAL_BATCHED ->
                                 MOE_PF_EP_BATCHED) */
    moe_experts_kind experts;                   /* default MOE_EXPERTS_GROUPED */
    int64_t batched_capacity; /* batched format: token slots per expert (per source rank under
                                 EP); chunks are cut to it so no row is ever dropped; default 64 */
    moe_parallel_config parallel; /* default: one process (sizes 1, ranks 0) */
} moe_plan_config;

void moe_plan_config_init(moe_plan_config *cfg);

/* moe_plan_create with a chosen composition. Errors as moe_plan_create, plus MOE_EINVAL when
 * the prepare/finalize and experts formats differ (the message names both), for a
 * capacity < 1, or for a bad parallel field (named); for parallel plans, the errors of the
 * collective check above (MOE_EINVAL, MOE_ETIMEOUT, MOE_EMPI) and MOE_EUNSUPPORTED without
 * MPI. cfg may be NULL (defaults). */
moe_status moe_plan_create_ex(moe_ctx *ctx, const moe_layer_desc *desc, const moe_plan_config *cfg,
                              moe_plan **out);

/* The parallel configuration of the plan, resolved (ranks of -1 replaced by the derived
 * coordinates; comm is NULL). Valid while the plan lives. */
const moe_parallel_config *moe_plan_parallel(const moe_plan *plan);

/* Fill out [E] (the description's num_experts) with the local id of each global expert id on
 * this rank, or -1 when another EP rank holds it. One process: the identity.
 * Errors: MOE_EINVAL (NULL argument). */
moe_status moe_plan_expert_map(const moe_plan *plan, int32_t *out);

/* The rows [*begin, *end) of an execute of n_tokens tokens whose output this rank writes:
 * its tp_rank's share under MOE_TP_REDUCE=reduce_scatter with tp_size > 1, else [0, n_tokens). */
void moe_plan_tp_rows(const moe_plan *plan, int64_t n_tokens, int64_t *begin, int64_t *end);

/* The description the plan was compiled from. */
const moe_layer_desc *moe_plan_desc(const moe_plan *plan);

/* Canonical text of the plan: the ctx's resolved knobs (moe_ctx_options_text) followed by
 * the layer description and composition as "key=value;" pairs. Valid while the plan lives. */
const char *moe_plan_text(const moe_plan *plan);
/* XXH64 (seed 0) of moe_plan_text(): compared across ranks, keys tuning files. */
uint64_t moe_plan_hash(const moe_plan *plan);

/* Bytes of workspace moe_plan_execute() needs for up to `max_tokens` tokens. The experts
 * stage runs in chunks of at most chunk_size tokens, so this is bounded whatever
 * max_tokens is. 0 for max_tokens <= 0. Parallel plans: max_tokens bounds the tokens of every
 * rank's execute (the rows received from the peers need room), and the size includes the
 * send and receive buffers of the dispatch and the TP reduction. */
size_t moe_plan_workspace_size(const moe_plan *plan, int64_t max_tokens);

/* ---------------------------------------------------------------------------------------
 * Weights: packed once into the kernel layout. Weights stay in their dtype (F32, BF16,
 * F16) and are converted to f32 in the inner loop.
 * ------------------------------------------------------------------------------------- */

/* Where the weights of one layer are, as the caller has them. Matrices are in
 * desc->weight_dtype unless stated, and by default row-major [out_features, in_features]
 * (the nn.Linear layout). Experts are given as arrays of E pointers, so per-expert tensors
 * (Mixtral, Qwen, DeepSeek, OLMoE) and stacked ones ([E, 2I, H]: pointer e = base + e * 2I * H
 * elements; Granite, Qwen3.5) are both described without copying; so are input-major stacked
 * tensors, through the strides below, which moe_weights_create transposes while packing.
 * A zero-initialised struct means: row-major experts, no biases, F32 bias dtypes. */
typedef struct moe_weight_source {
    const void *router;            /* [E, H], dtype router_dtype. Required. */
    moe_dtype router_dtype;        /* F32, BF16 or F16 */
    const void *const *gate_proj;  /* E pointers, each [I, H] (Mixtral w1) */
    const void *const *up_proj;    /* E pointers, each [I, H] (Mixtral w3) */
    const void *const *down_proj;  /* E pointers, each [H, I] (Mixtral w2) */
    const void *shared_gate_proj;  /* [I_s, H] or NULL when there is no shared expert */
    const void *shared_up_proj;    /* [I_s, H] */
    const void *shared_down_proj;  /* [H, I_s] */
    const void *shared_expert_gate;/* [1, H], dtype router_dtype; when shared_expert_gated */

    /* Expert layouts, in elements. Element (o, i) (output feature o < I, input i < H) of
     * gate_proj[e] and up_proj[e] is at p[o * gate_up_stride_out + i * gate_up_stride_in];
     * element (o, i) (o < H, i < I) of down_proj[e] at p[o * down_stride_out +
     * i * down_stride_in]. Both strides 0 = row-major ((H, 1) and (I, 1)); otherwise both
     * must be >= 1. Examples, base = the stacked tensor, e = expert:
     *  - Llama-4 gate_up_proj [E, H, 2I], gate = columns [0, I): gate_proj[e] = base + e*H*2I,
     *    up_proj[e] = gate_proj[e] + I, strides (1, 2I); down_proj [E, I, H]: strides (1, H);
     *  - gpt-oss gate_up_proj [E, H, 2I] with gate/up interleaved (gate = even columns):
     *    up_proj[e] = gate_proj[e] + 1, strides (2, 2I); down_proj [E, I, H]: (1, H).
     * The shared expert is always row-major. */
    int64_t gate_up_stride_out, gate_up_stride_in;
    int64_t down_stride_out, down_stride_in;
    /* Biases, converted exactly to f32 at pack time. */
    const void *router_bias;       /* [E] when desc->has_router_bias (gpt-oss router.bias) */
    moe_dtype router_bias_dtype;   /* F32, BF16 or F16 */
    const void *selection_bias;    /* [E] when desc->has_selection_bias (DeepSeek-V3
                                      e_score_correction_bias, F32 in checkpoints) */
    moe_dtype selection_bias_dtype;/* F32, BF16 or F16 */
    const void *const *gate_bias;  /* E pointers when desc->has_expert_bias: b_g of expert e,
                                      element j at p[j * gate_up_bias_stride], j < I */
    const void *const *up_bias;    /* E pointers, b_u, the same stride */
    const void *const *down_bias;  /* E pointers, b_d, [H] contiguous */
    moe_dtype expert_bias_dtype;   /* F32, BF16 or F16 */
    int64_t gate_up_bias_stride;   /* 0 = 1 (contiguous); gpt-oss's interleaved
                                      gate_up_proj_bias [E, 2I]: gate_bias[e] = base + e*2I,
                                      up_bias[e] = gate_bias[e] + 1, stride 2 */
    /* Quantized experts (desc->quant, see "Quantized experts"): gate_proj / up_proj /
     * down_proj then point at the codes, row-major, and these at the scales (and zero
     * points) of each expert, in the shapes given there. NULL when desc->quant is NONE. */
    const void *const *gate_scale; /* E pointers */
    const void *const *up_scale;   /* E pointers */
    const void *const *down_scale; /* E pointers */
    const uint8_t *const *gate_zero; /* E pointers, INT4 with has_zero_point only */
    const uint8_t *const *up_zero;
    const uint8_t *const *down_zero;
} moe_weight_source;

typedef struct moe_weights moe_weights;

/* Pack the weights described by `src` for `plan` (borrowed: it must outlive the weights).
 * Copies what this rank needs; `src` may be freed afterwards. Parallel plans pack only the
 * rank's share: under EP the local experts (src still indexes experts by global id; the
 * pointers of the other ranks' experts are not read and may be NULL), under TP the rank's
 * I shard of every local expert and of the shared expert (src still describes the whole
 * matrices). The router (and its biases) is replicated on every rank. The pointers in `src` need no alignment
 * (tensors mmapped from a safetensors file may sit at odd addresses). Packed layout: per
 * expert gate [I, H] and up [I, H] (w13), and down [H, I] (w2), each in panels of 16 output
 * features, K-contiguous, at their true size (no padding), whatever the source strides
 * (input-major and interleaved layouts are transposed here, once); the router and every
 * bias as f32.
 * Errors (recorded on the plan's ctx): MOE_EINVAL naming the NULL pointer (a bias the
 * description asks for included) or a bad stride, MOE_EDTYPE, MOE_ENOMEM. */
moe_status moe_weights_create(const moe_plan *plan, const moe_weight_source *src,
                              moe_weights **out);
void moe_weights_free(moe_weights *w);
/* Bytes of packed expert weights resident on this rank (w13 + w2 + shared: the local experts
 * and the rank's I shard under EP / TP), not counting the router. */
size_t moe_weights_expert_bytes(const moe_weights *w);

/* ---------------------------------------------------------------------------------------
 * Execute.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_exec_args {
    const void *hidden_states;  /* [T, H], dtype hidden_dtype */
    moe_dtype hidden_dtype;     /* F32 or BF16 */
    int64_t n_tokens;           /* T >= 0; T = 0 returns at once, nothing written */
    const float *router_logits; /* [T, E] f32, or NULL: computed from the router weight
                                   (and router bias). Caller-supplied logits are complete:
                                   no router bias is added to them */
    float *output;              /* [T, H] f32, written (MOE_TP_REDUCE=reduce_scatter under
                                   TP: only this rank's rows, moe_plan_tp_rows) */
    int32_t *topk_ids;          /* [T, K] or NULL; written in top-k order */
    float *topk_weights;        /* [T, K] or NULL; the routing weights after
                                   renormalization, before routed_scaling_factor */
    void *workspace;            /* moe_plan_workspace_size(plan, n_tokens) bytes (parallel
                                   plans: for the most tokens any rank passes), 64-byte
                                   aligned is best; may be NULL when that size is 0 */
    size_t workspace_size;      /* bytes available at workspace */
    struct moe_exec_stats *stats; /* optional: what ran (see below), or NULL */
} moe_exec_args;

/* What one moe_plan_execute_ex call ran: the knobs' effect made observable. Names are
 * static strings. */
typedef struct moe_exec_stats {
    const char *isa;              /* kernel table: "ref", "avx2", "avx512" */
    const char *prepare_finalize; /* "local", "local_batched", "ep_alltoall", "ep_batched" */
    const char *experts;          /* "grouped" or "batched" */
    const char *topk;             /* "sort" or "rowmax" */
    const char *permute;          /* method of the last chunk: "sort", "onehot", "packed" */
    int threads;
    int64_t chunks;               /* chunks the tokens were cut into */
    int64_t chunk_tokens;         /* tokens per chunk (the last may hold fewer) */
    int64_t permute_sort, permute_onehot, permute_packed; /* chunks per permute method */
    int64_t gemm_groups;          /* expert groups on the tiled GEMM path (over all chunks) */
    int64_t lowtok_groups;        /* expert groups on the few-token streaming path */
    int64_t skipped_groups;       /* experts with no rows, skipped */
    /* Parallel plans (0 otherwise). Seconds are wall time on this rank, waiting included;
     * bytes are those this rank sent to other ranks (its own rows excluded). */
    double dispatch_seconds;      /* EP: pack the rows, exchange counts and rows, group the
                                     received rows by local expert */
    double combine_seconds;       /* EP: return the expert outputs, weighted sum */
    double tp_reduce_seconds;     /* TP: the sum of the partial outputs */
    int64_t dispatch_bytes, combine_bytes, tp_reduce_bytes;
    int64_t received_rows;        /* EP: (token, k) rows this rank's experts ran, all sources */
    int64_t max_tokens;           /* the most tokens any rank passed to this execute */
} moe_exec_stats;

/* Run one forward of the layer. Never allocates. Thread-safe for distinct workspaces and
 * outputs on the same plan and weights (a parallel plan: one execute at a time, and it is
 * collective over the plan's ranks; see "Parallelism").
 * NaN/Inf handling: router scores and selection keys that are NaN rank below every number,
 * and group-limited selection always keeps topk_group groups, so selection gives K distinct
 * ids in [0, E) for every input (docs/numerics.md section 3); the output then follows IEEE
 * arithmetic on the selected experts.
 * Errors: MOE_EINVAL (NULL pointer, n_tokens < 0, weights packed for another plan or
 * shard), MOE_EDTYPE (hidden_dtype), MOE_EWORKSPACE; parallel plans also MOE_ETIMEOUT,
 * MOE_EMPI, and any of these reported by a peer (the message names the rank). */
moe_status moe_plan_execute_ex(const moe_plan *plan, const moe_weights *weights,
                               const moe_exec_args *args);

/* Shorthand: f32 hidden_states [T,H] in, f32 output [T,H] out, router computed. */
moe_status moe_plan_execute(const moe_plan *plan, const moe_weights *weights, const float *x,
                            int64_t n_tokens, float *out, void *workspace,
                            size_t workspace_size);

/* ---------------------------------------------------------------------------------------
 * Safetensors files (https://github.com/huggingface/safetensors format): read by mmap
 * after validating the whole header against the file size; written atomically.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_safetensors moe_safetensors;

#define MOE_MAX_DIMS 8

typedef struct moe_tensor_info {
    const char *name;              /* valid while the file is open */
    moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    const void *data;              /* mmap'd, read-only, valid while the file is open */
    size_t nbytes;
} moe_tensor_info;

/* Open and validate: 8-byte little-endian header length within the file, header valid JSON
 * object, every tensor with a known dtype, shape of non-negative ints, data_offsets
 * [begin, end] inside the data section with end - begin = numel * dtype size, and no two
 * tensors overlapping. Errors (message names the file and the tensor or field): MOE_ENOTFOUND
 * (no such file), MOE_EIO, MOE_EFORMAT, MOE_EDTYPE, MOE_ENOMEM.
 * Safetensors does not promise aligned tensor data: moe_tensor_info.data may be unaligned for
 * its dtype (read it with memcpy, or copy it, before using it as a typed array). */
moe_status moe_safetensors_open(moe_ctx *ctx, const char *path, moe_safetensors **out);
void moe_safetensors_free(moe_safetensors *f);
size_t moe_safetensors_count(const moe_safetensors *f);
/* i-th tensor in header order. MOE_ERANGE when i >= count. */
moe_status moe_safetensors_at(const moe_safetensors *f, size_t i, moe_tensor_info *out);
/* Tensor by name. MOE_ENOTFOUND (message names file and tensor) when absent. */
moe_status moe_safetensors_get(moe_safetensors *f, const char *name, moe_tensor_info *out);

/* A tensor to write. */
typedef struct moe_tensor_out {
    const char *name;
    moe_dtype dtype;
    int ndim;
    int64_t shape[MOE_MAX_DIMS];
    const void *data; /* numel * dtype size bytes */
} moe_tensor_out;

/* Write `n` tensors to `path` atomically: a temporary file beside it, renamed over `path`
 * only once complete, so a failure leaves nothing at `path`. Errors: MOE_EINVAL, MOE_EIO. */
moe_status moe_safetensors_write(moe_ctx *ctx, const char *path, const moe_tensor_out *tensors,
                                 size_t n);

/* ---------------------------------------------------------------------------------------
 * Hugging Face checkpoints: a folder with config.json and model.safetensors, or shards
 * listed in model.safetensors.index.json. Families: every moe_family but custom
 * (src/io/checkpoint.c lists the tensor names and layouts read). Multimodal wrappers
 * (Llama4ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration) are read through
 * their config's text_config. gpt-oss MXFP4 checkpoints as released (config
 * `quantization_config` {quant_method mxfp4, modules_to_not_convert}; per layer
 * experts.gate_up_proj_blocks U8 [E, 2I, H/32, 16] + gate_up_proj_scales U8 [E, 2I, H/32],
 * down_proj_blocks [E, H, I/32, 16] + down_proj_scales [E, H, I/32]: e2m1 codes, low nibble
 * = even input, E8M0 exponents w = e2m1 * 2^(s - 127), as transformers' integrations/mxfp4.py
 * dequantizes them; gate = the even rows of gate_up, up = the odd rows; bf16 biases) give
 * desc.quant MXFP4 GROUP 32 weight-only for w13 and w2 and weight_dtype the router's; H and I
 * must be multiples of 32. A layer whose experts were kept in bf16 loads unquantized.
 * Scale bytes 255 (NaN) load as they are (the rows using them compute NaN), with a WARNING
 * from moe_checkpoint_load_weights naming the tensor and the count (local experts only).
 * moe_checkpoint_load_weights copies the interleaved gate/up rows apart (the local experts'
 * gate_up blocks and scales, logged at INFO with the byte count, freed once packed); down is
 * read in place. FP8 block checkpoints (config `quantization_config` {quant_method fp8,
 * fmt e4m3, weight_block_size [bn, bk]}; per-expert layout: F8_E4M3 `weight` and F32
 * `weight_scale_inv` [ceil(out/bn), ceil(in/bk)], a multiplier) give desc.quant fp8 e4m3 BLOCK
 * [bn, bk] weight-only for w13 and w2 (the dynamic activation scheme runs with f32
 * activations); weight_dtype is then the shared expert's dtype, or the router's without one.
 * An fp8 shared expert (DeepSeek-V3's FP8 checkpoints quantize it too: the same `weight` +
 * `weight_scale_inv` pair) is dequantized at load to f32 (w = q * s, one f32 multiply) and
 * runs as an f32 shared expert (weight_dtype F32; 4 bytes per weight resident instead of 1,
 * logged at INFO with the byte count); a shared expert with
 * only some projections in fp8 is MOE_EDTYPE. fp8 in a stacked expert layout is
 * MOE_EUNSUPPORTED.
 * compressed-tensors checkpoints (int4 / int8 experts, llm-compressor's format): see
 * "Quantized checkpoints" below.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_checkpoint moe_checkpoint;

/* Open `dir`: parse config.json, detect the family from `architectures` (or `model_type`),
 * open and validate every safetensors file. Errors: MOE_ENOTFOUND (config.json, a shard, a
 * config field), MOE_EFORMAT (bad JSON or safetensors, a config value out of range),
 * MOE_EUNSUPPORTED (unknown architecture, named; or a config value libmoe does not compute:
 * hidden_act, DeepSeek scoring_func / topk_method, a quantization_config.quant_method other
 * than fp8, mxfp4 and compressed-tensors, e.g. gptq, awq, bitsandbytes), MOE_EIO, MOE_ENOMEM. */
moe_status moe_checkpoint_open(moe_ctx *ctx, const char *dir, moe_checkpoint **out);
void moe_checkpoint_free(moe_checkpoint *ck);

moe_family moe_checkpoint_family(const moe_checkpoint *ck);
/* config `num_hidden_layers`. */
int64_t moe_checkpoint_num_layers(const moe_checkpoint *ck);
/* 1 if layer `layer` is an MoE layer, else 0. Qwen2/3-MoE, Qwen3-Next: not in
 * mlp_only_layers and (layer + 1) % decoder_sparse_step == 0; DeepSeek-V2/V3: layer >=
 * first_k_dense_replace and layer % moe_layer_freq == 0 (the published code's rule;
 * transformers, which has no moe_layer_freq, agrees for the released value 1); Llama-4:
 * listed in moe_layers, else (layer + 1) % interleave_moe_layer_step == 0; Mixtral, OLMoE,
 * Granite-MoE, gpt-oss, Qwen3.5-MoE: every layer. No layer is MoE when the expert count is 0. */
int moe_checkpoint_is_moe_layer(const moe_checkpoint *ck, int64_t layer);

/* The layer description of MoE layer `layer`, from config.json and the tensors' dtype (the
 * family table in "Layer description" says which field sets what).
 * Errors: MOE_ERANGE (layer outside [0, num_hidden_layers)), MOE_EDENSE (a dense layer; the
 * message names the config field that makes it dense), MOE_ENOTFOUND (a tensor),
 * MOE_EDTYPE / MOE_ESHAPE (a tensor disagreeing with config.json or with the other experts;
 * the message names tensor, expected and found; FP8 checkpoints: every weight_scale_inv too,
 * F32 on the ceil grid; MXFP4 checkpoints: every *_blocks / *_scales U8 in the shapes above),
 * MOE_EFORMAT (MXFP4 with H or I not a multiple of 32, or *_blocks without quantization_config
 * mxfp4; a compressed-tensors shared expert inconsistent with itself or config.json, see
 * "Quantized checkpoints"), MOE_EUNSUPPORTED (quant_method mxfp4 on a family other than gpt-oss, from
 * moe_checkpoint_open). */
moe_status moe_checkpoint_layer_desc(moe_checkpoint *ck, int64_t layer, moe_layer_desc *out);

/* Pack layer `layer`'s weights for `plan` (which must have been created from the
 * description moe_checkpoint_layer_desc() gave). Same errors as moe_checkpoint_layer_desc
 * plus those of moe_weights_create. The checkpoint may be freed afterwards. A parallel plan
 * packs only its rank's share (moe_weights_create): under EP only the local experts'
 * tensors are looked up and read (per-expert tensors of other ranks are not touched;
 * stacked tensors are read only in the local experts' slices, the files being mapped). */
moe_status moe_checkpoint_load_weights(moe_checkpoint *ck, int64_t layer, const moe_plan *plan,
                                       moe_weights **out);

/* ---------------------------------------------------------------------------------------
 * Quantized checkpoints: moe_checkpoint_quantize (`moe quantize`) converts the routed experts
 * of a bf16 / f16 / f32 checkpoint in the per-expert layout (<P>experts.<e>.<proj>.weight:
 * Mixtral, Qwen2/3-MoE, Qwen3-Next, OLMoE, DeepSeek-V2/V3), or gpt-oss / Llama-4 (stacked,
 * below) with moe_quantize_matrix and
 * writes a checkpoint that moe_checkpoint_open loads (docs/quantize.md has the layouts):
 *  - "fp8-block": the Hugging Face FP8 layout above (weight F8_E4M3 [N, K] + weight_scale_inv
 *    F32 [ceil(N/128), ceil(K/128)]; quantization_config {quant_method fp8, fmt e4m3,
 *    activation_scheme dynamic, weight_block_size [128, 128], ignored_layers and
 *    modules_to_not_convert: every other 2-D weight's module}). Every MoE layer.
 *  - "int8-channel", "int4-g32|g64|g128[-zp]": compressed-tensors "pack-quantized" (the format
 *    llm-compressor writes and vLLM loads): weight_packed I32 [N, ceil(K * b / 32)] (codes
 *    stored q + 2^(b-1), the lowest bits the lowest k), weight_scale F32 [N, 1] or
 *    [N, K / g], weight_shape I64 [2] = [N, K], with zero points weight_zero_point I32
 *    [ceil(N / 8), K / g] (packed along N the same way); int4 groups need K % g == 0 (as
 *    compressed-tensors and vLLM do).
 *  - "int8-w8a8": compressed-tensors "int-quantized": weight I8 [N, K], weight_scale F32
 *    [N, 1], input_activations dynamic symmetric int8 per token.
 *  - "mxfp4" (gpt-oss only): the released openai/gpt-oss layout the gpt-oss MXFP4 loader reads
 *    (P.experts.gate_up_proj_blocks U8 [E, 2I, H/32, 16] + _scales U8 E8M0 [E, 2I, H/32],
 *    down_proj_blocks [E, H, I/32, 16] + _scales [E, H, I/32], row n = column n of the bf16
 *    tensor; biases kept; quantization_config {quant_method mxfp4, modules_to_not_convert}),
 *    rounded by moe_quantize_matrix's OCP MX rule. H and I multiples of 32.
 * Stacked inputs: gpt-oss is written as mxfp4 only (other schemes MOE_EUNSUPPORTED); Llama-4's
 * experts.gate_up_proj [E, H, 2I] / down_proj [E, I, H] are written per expert
 * (P.experts.<e>.{gate,up,down}_proj.*, llm-compressor's layout, read back by the loader); mxfp4
 * on any family but gpt-oss is MOE_EUNSUPPORTED.
 * compressed-tensors quantization_config: {quant_method "compressed-tensors", format,
 * quantization_status "compressed", config_groups {group_0 {targets ["Linear"], weights
 * {num_bits, type "int", symmetric, strategy channel|group, group_size, dynamic false},
 * input_activations, output_activations null, format}}, ignore: every other 2-D weight's
 * module}. Scales are written in f32 (vLLM casts them to its parameter dtype).
 * Everything else (attention, router, norms, shared experts, embeddings, other files) is
 * copied unchanged; sharded inputs give shards of the same names and a new index. Memory:
 * one expert tensor in f32 at a time plus the quantized tensors of the shard being written.
 * A NaN or Inf expert weight is refused (MOE_EINVAL naming the tensor and its first [n, k]):
 * int / e2m1 codes cannot hold it (a NaN would become 0, an Inf would make its scale cell NaN).
 * The output appears complete or not at all (written in a temporary folder beside it, then
 * renamed into place).
 * Loading (moe_checkpoint_open / moe_checkpoint_layer_desc / moe_checkpoint_load_weights):
 * compressed-tensors checkpoints with one scheme for the routed experts: int weights of 4 bits
 * (channel, or group 32/64/128, symmetric or with zero points) or 8 bits (channel or group,
 * symmetric), formats pack-quantized / int-quantized / naive-quantized, input_activations
 * null (weight-only) or dynamic symmetric int8 per token (w8a8 -> quant.act TOKEN, int8
 * channel weights only); scales F32, BF16 or F16 (NaN, infinite, zero or negative values load
 * as they are, with a WARNING naming the first such tensor and the counts); weight_shape an integer vector
 * I64 (as compressed-tensors writes it) or I32 [2], anything else MOE_EFORMAT. Anything else (float types, other
 * num_bits, static activations, actorder "group" (g_idx), tensor / block strategies, sparsity,
 * several different groups) is MOE_EUNSUPPORTED naming the field. A layer whose experts keep a
 * float `weight` (left out by --layers) loads unquantized. int4 codes are converted to the
 * source layout in a temporary copy per layer (logged with its size).
 * A quantized shared expert (llm-compressor quantizes shared_expert(s).{gate,up,down}_proj
 * with the routed experts unless `ignore` lists them) is validated like the routed experts,
 * dequantized at load to f32 ((v - z) * s or v * s, one f32 multiply) and runs as an f32
 * shared expert: weight_dtype F32, 4 bytes per weight resident instead of 0.5 (int4) or 1
 * (int8), logged with the byte count (at INFO; at WARNING for w8a8, whose shared expert then
 * runs with f32 activations). The tensors decide whether it is
 * quantized: a float `weight` loads in its dtype (a shared expert in `ignore`). MOE_EFORMAT,
 * naming the tensor, when they disagree with each other or with config.json: a compressed
 * linear missing one of its tensors (weight_packed without weight_scale, ...), some
 * projections quantized and some not, a float `weight` beside compressed tensors, or quantized
 * tensors for a module that `ignore` lists (exact name or "re:" pattern, matched as
 * compressed-tensors does: Python re.match, evaluated as a POSIX extended regex) or that no
 * config group targets. A float shared expert that config.json says is quantized loads with a
 * WARNING. A quantized shared_expert_gate is MOE_EUNSUPPORTED (it runs in the router's dtype).
 * ------------------------------------------------------------------------------------- */

/* Progress lines of moe_checkpoint_quantize (one per shard, one at the end). */
typedef void (*moe_progress_fn)(const char *msg, void *user);

typedef struct moe_quantize_options {
    const char *scheme;        /* moe_quant_from_name name: fp8-block, int8-channel, int8-w8a8,
                                  int4-g32/g64/g128, int4-g32/g64/g128-zp, mxfp4 (gpt-oss) */
    const int64_t *layers;     /* [n_layers] MoE layers to quantize; NULL or 0 = all
                                  (fp8-block: all only) */
    size_t n_layers;
    int force;                 /* 1: replace an existing non-empty out_dir */
    moe_progress_fn progress;  /* or NULL */
    void *progress_user;
    const volatile int *cancel;/* or NULL: when *cancel becomes nonzero (a signal handler may set
                                  it; a volatile sig_atomic_t is an int on the platforms libmoe
                                  builds for) the conversion stops before the next tensor,
                                  removes its temporary folder and returns MOE_ECANCELED */
} moe_quantize_options;

typedef struct moe_quantize_stats {
    int64_t expert_tensors;        /* expert linears quantized */
    uint64_t input_expert_bytes;   /* their bytes in the input */
    uint64_t output_code_bytes;    /* codes written (weight / weight_packed) */
    uint64_t output_scale_bytes;   /* scales (and weight_shape) written */
    uint64_t output_zero_bytes;    /* zero points written */
    uint64_t other_bytes;          /* tensors copied unchanged */
    int shards;                    /* safetensors files written */
    int copied_files;              /* other files copied */
} moe_quantize_stats;

/* Quantize `in_dir` into `out_dir` (above). Errors: MOE_EINVAL (unknown scheme, out_dir the
 * input, inside it or holding it, out_dir existing and not empty without force, a parent
 * folder that does not exist), MOE_EUNSUPPORTED (mxfp4 on a family other than gpt-oss, gpt-oss
 * with another scheme, fp8-tensor / fp8-channel, an already quantized input, Granite / other
 * stacked expert layouts), MOE_ERANGE (a layer that is not an MoE layer), MOE_ESHAPE (int4
 * groups not dividing K, mxfp4 with H or I not a multiple of 32), MOE_ECANCELED (opt->cancel set), those of
 * moe_checkpoint_open, MOE_EIO, MOE_ENOMEM. On error nothing is left at out_dir (an existing
 * one is untouched) nor beside it (a process killed outright leaves its temporary folder
 * `.OUT.tmp.XXXXXX`, which the next call for the same out_dir names in a WARNING). stats
 * may be NULL. */
moe_status moe_checkpoint_quantize(moe_ctx *ctx, const char *in_dir, const char *out_dir,
                                   const moe_quantize_options *opt, moe_quantize_stats *stats);

/* ---------------------------------------------------------------------------------------
 * Roofline: this machine's limits, measured (used by `moe bench --roofline`).
 * ------------------------------------------------------------------------------------- */

/* Units are decimal: 1 GB/s = 1e9 bytes per second, 1 GFLOP/s = 1e9 floating-point
 * operations per second (a fused multiply-add counts 2), 1 GOP/s = 1e9 integer operations
 * per second (an int8 multiply-accumulate counts 2). */
typedef struct moe_roofline {
    double dram_read_gbs;       /* DRAM read bandwidth, GB/s, all `threads` together */
    double fma_f32_gflops;      /* f32 fused multiply-add peak, GFLOP/s, all threads */
    double vnni_int8_gops;      /* int8 dot-product (vpdpbusd) peak, GOP/s; 0 without
                                   AVX512-VNNI (CPU, or loops not avx512) */
    double ridge_flop_per_byte; /* fma_f32_gflops / dram_read_gbs: below this arithmetic
                                   intensity (FLOP per weight byte) a kernel is bound by
                                   DRAM, above it by the FMA peak */
    int threads;                /* threads the loops ran on (the ctx's thread count) */
    const char *isa;            /* static: ISA of the FMA and VNNI loops, "avx512",
                                   "avx2" or "scalar" */
    size_t dram_buffer_bytes;   /* bytes the bandwidth loop streamed over per pass */
    size_t llc_bytes;           /* last-level cache per sysfs (0: unknown) */
    double seconds;             /* wall time of the whole measurement */
} moe_roofline;

/* Measure this machine's roofline with ctx's thread count (OpenMP), in about 1 to 3 s.
 * Nothing is cached: every call measures again, so run it on an otherwise idle machine.
 *  - dram_read_gbs: a read-only streaming sum (vector loads, integer adds) over a buffer of
 *    4 x max(LLC from sysfs, 260 MiB) (about 1 GiB; less, down to 64 MiB, when
 *    MemAvailable is short), split into one contiguous slice per thread, written first by
 *    the thread that reads it, in ordinary pages like the packed weights; the best of 8
 *    passes (a pass ends when the slowest thread ends) = buffer bytes / wall time. Other
 *    processes' memory traffic or CPU use lowers it.
 *  - fma_f32_gflops: every thread runs 12 independent register-resident chains of vector
 *    FMAs (zmm for avx512, ymm for avx2) - enough to cover FMA latency x throughput on
 *    current x86 cores - for about 0.06 s; 2 x lanes x FMAs over the thread's own CPU
 *    time (CLOCK_THREAD_CPUTIME_ID: FMA units are per core, so time-sharing a core with
 *    another process does not lower it), summed over the threads; best of 5.
 *  - vnni_int8_gops: the same with vpdpbusd on zmm (64 u8 x s8 products each, counted 2
 *    ops per product), when CPUID leaf 7 ECX bit 11 (AVX512-VNNI) is set and the loops
 *    run avx512 (below); else 0.
 * The loops use the ISA of ctx's kernel table (avx512 or avx2); for the "ref" table, the
 * widest this CPU and OS support, or portable scalar C without AVX2.
 * Errors: MOE_EINVAL (NULL ctx or out), MOE_ENOMEM (the buffer, size named). */
moe_status moe_roofline_measure(moe_ctx *ctx, moe_roofline *out);

#ifdef __cplusplus
}
#endif

#endif /* MOE_H */
