/*
 * libmoe: the fused Mixture-of-Experts layer of transformer LLM inference, in C11.
 *
 * moe.h is the one include of the public API and its specification; what is not in it or in
 * the headers it includes is not API. By concern:
 *   moe.h             status, dtypes, logging, context and knobs, layer description, plan,
 *                     weights, execute, plan report
 *   moe_quant.h       quantized expert weights: schemes, scale granularity, quantization
 *   moe_parallel.h    expert and tensor parallelism over MPI
 *   moe_checkpoint.h  safetensors files, Hugging Face checkpoints, moe quantize
 *   moe_bench.h       this machine's roofline
 *
 * Example: one Mixtral-style layer (8 experts, top-2) on 4 tokens, bf16 weights the caller
 * holds as E pointers per projection (examples/minimal.c is a complete program):
 *
 *   moe_ctx *ctx;                                   // kernel table, threads, knobs, last error
 *   moe_ctx_create(NULL, &ctx, NULL, 0);            // NULL options: defaults + MOE_* variables
 *   moe_layer_desc d;
 *   moe_layer_desc_init(&d);
 *   d.hidden_size = 4096; d.moe_intermediate_size = 14336; d.num_experts = 8; d.top_k = 2;
 *   d.renormalize = 1;                              // Mixtral renormalizes its top-k weights
 *   moe_plan *plan;
 *   moe_plan_create(ctx, &d, &plan);                // validated, compiled once
 *   moe_weight_source src = {.router = router, .router_dtype = MOE_DTYPE_BF16,
 *                            .gate_proj = w1, .up_proj = w3, .down_proj = w2};
 *   moe_weights *w;
 *   moe_weights_create(plan, &src, &w);             // packed once; src may be freed now
 *   size_t n = moe_plan_workspace_size(plan, 4);
 *   void *ws = aligned_alloc(64, (n + 63) / 64 * 64);
 *   moe_plan_execute(plan, w, x, 4, out, ws, n);    // x, out [4, 4096] f32; never allocates
 *   // every call returns a moe_status; on failure moe_ctx_last_error(ctx) says what is wrong
 *   free(ws); moe_weights_free(w); moe_plan_free(plan); moe_ctx_free(ctx);
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
 *    Messages and log lines hold no control bytes: those of names and values read from
 *    files or the environment appear escaped ("\x1b", "\n", C1 controls "\u009b").
 *  - Every *_create / *_open has a *_free that accepts NULL.
 *  - The caller owns what it passes in; the library owns what it creates. Pointers passed
 *    to a function are borrowed for the duration of the call only, unless stated.
 *  - The library never calls exit() or abort().
 *
 * Numerics contract (docs/numerics.md has the full text):
 *  1. Accumulation in f32; outputs f32 (or, with moe_exec_args.output_dtype BF16, the f32
 *     result rounded once to nearest even). Expert outputs stay f32 until the weighted sum.
 *  2. Top-k order: score descending, ties to the lower expert id. NaN ranks below every
 *     number; ids within a token are distinct and in [0, E) for every input.
 *  3. A token's output bits do not depend on T, on the other tokens in the batch, on the
 *     thread count or on the chunk size (batch invariance), for a given kernel table.
 *  4. routed_scaling_factor is applied once, in finalize; renormalization divides by
 *     (sum + renormalize_eps), 1e-20 unless the family's router says otherwise.
 */
#ifndef MOE_H
#define MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MOE_API marks the public functions: the only symbols libmoe.so exports (the library is
 * built with -fvisibility=hidden; tests/exports.sh checks the export list against these
 * headers). Define MOE_API before including to override (e.g. empty). */
#ifndef MOE_API
#if defined(__GNUC__) || defined(__clang__)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif
#endif

#define MOE_VERSION_MAJOR 0
#define MOE_VERSION_MINOR 1
#define MOE_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define MOE_VERSION_NUMBER (MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH)

/* Run-time version of the library linked in (same encoding as MOE_VERSION_NUMBER). */
MOE_API int moe_version_number(void);
/* Run-time version as "MAJOR.MINOR.PATCH". Static storage. */
MOE_API const char *moe_version_string(void);

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
MOE_API const char *moe_status_name(moe_status s);

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
    MOE_DTYPE_U16 = 11,
    MOE_DTYPE_U32 = 12,
    MOE_DTYPE_U64 = 13,
    MOE_DTYPE_F8_E5M2 = 14,
    MOE_DTYPE_COUNT = 15 /* every dtype of the safetensors format; libmoe computes with F32, BF16
                            and F16 weights and reads the others only where named (quantized
                            codes: F8_E4M3, I8, U8, I32); any other tensor is only validated */
} moe_dtype;

/* Bytes per element (0 for an unknown dtype). */
MOE_API size_t moe_dtype_size(moe_dtype dt);
/* Safetensors name ("F32", "BF16", "F16", "I32", ...), or "?" for an unknown value. */
MOE_API const char *moe_dtype_name(moe_dtype dt);

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

/* Packing progress (moe_options.pack_progress_fn): `done` of `total` bytes. */
typedef void (*moe_pack_progress_fn)(uint64_t done, uint64_t total, void *user);

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
    const char *isa;          /* NULL = unset: MOE_ISA = auto or a kernel registry row's name
                                 (moe_isa_describe lists them); default auto (CPUID+XCR0) */
    int64_t chunk_size;       /* tokens per chunk (bounds the workspace); 0 = unset: MOE_CHUNK_SIZE; default 1024 */
    const char *permute;      /* NULL = unset: MOE_PERMUTE = auto|sort|onehot|packed; default auto */
    int64_t onehot_threshold; /* routed rows (T*K of a chunk) at or below which auto picks onehot;
                                 -1 = unset: MOE_ONEHOT_THRESHOLD; default 256. No effect
                                 unless permute is auto ("Idle knobs") */
    const char *topk;         /* NULL = unset: MOE_TOPK = sort|rowmax; default sort */
    int64_t lowtok_threshold; /* rows per expert below which the few-token streaming path runs;
                                 -1 = unset: MOE_LOWTOK_THRESHOLD; default 4 */
    int64_t small_allreduce;  /* bytes; a TP chunk's all-reduce (Tc * H * 4 bytes) below this
                                 all-gathers the partials and every rank sums them; at or above,
                                 reduce-scatter + all-gather. The same bits either way (moe_parallel.h "Parallelism").
                                 -1 = unset: MOE_SMALL_ALLREDUCE; default 65536. No effect
                                 without TP or with tp_reduce reduce_scatter ("Idle knobs"). */
    const char *tp_reduce;    /* NULL = unset: MOE_TP_REDUCE = allreduce|reduce_scatter; default
                                 allreduce (every TP rank gets every output row);
                                 reduce_scatter: each TP rank gets its share of the rows
                                 (moe_plan_tp_rows). No effect without TP ("Idle knobs"). */
    const char *tuning_dir;   /* NULL = unset: MOE_TUNING_DIR, an existing folder of tuning files
                                 (docs/tuning.md; `moe tune` writes them); "" or default: none.
                                 Plan creation (single-process plans) reads the file named by
                                 moe_plan_tuning_name; an execute of T tokens then runs the entry
                                 of the nearest token count (ties: the smaller). The five knobs
                                 above that a file sets (chunk_size, permute, onehot_threshold,
                                 topk, lowtok_threshold) keep their value when set explicitly
                                 here or in the environment. A malformed file fails plan creation
                                 (MOE_EFORMAT naming the file and field); no file: INFO, the
                                 context's knobs. Output bits never change. */
    int log_level;            /* moe_log_level; -1 = unset: MOE_LOG_LEVEL = error|warn|info|debug; default warn */
    moe_log_fn log_fn;        /* NULL = stderr, prefixed "libmoe: LEVEL: "; called from the thread
                                 that logs (concurrent executes: several at once) */
    void *log_user;           /* passed to log_fn */
    /* Progress of moe_weights_create and so of moe_checkpoint_load_weights (whose reads of
     * the mmapped files happen while packing): called with the bytes of routed-expert
     * matrices packed so far (done) of this rank's total (total: their packed size, the
     * codes of moe_weights_expert_bytes without scales and shared expert), only from the
     * thread that called, with done never decreasing: first (0, total), then as matrices
     * complete, last (total, total) exactly once on success (not after a failure). NULL:
     * none. The callback must not call libmoe on this ctx. */
    moe_pack_progress_fn pack_progress_fn;
    void *pack_progress_user; /* passed to pack_progress_fn */
} moe_options;

/* Fill `opts` with "unset" values. */
MOE_API void moe_options_init(moe_options *opts);

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
    char inert[256];      /* non-empty when the value was given (API or environment) but cannot
                             act: why, e.g. "acts only when the permute knob is auto, and
                             MOE_PERMUTE=sort" (see "Idle knobs" below) */
} moe_knob_info;

/* Idle knobs: a knob given a value (API or environment) that cannot act in the configuration
 * is logged once at WARNING, naming the knob and why ("MOE_X=v has no effect: it acts only
 * ..."), and moe_knob_describe fills moe_knob_info.inert (moe env marks it). The cases:
 *  - onehot_threshold (MOE_ONEHOT_THRESHOLD) with permute sort, onehot or packed: only auto
 *    reads it; logged by moe_ctx_create;
 *  - small_allreduce (MOE_SMALL_ALLREDUCE) with tp_reduce reduce_scatter: only the allreduce
 *    algorithm reads it; logged by moe_ctx_create;
 *  - small_allreduce and tp_reduce in a plan with parallel.tp_size = 1 (no TP): logged by the
 *    first such moe_plan_create(_ex) on the ctx, once per ctx. moe_knob_describe, which has no
 *    plan, gives these two their condition ("acts only under tensor parallelism ...") when
 *    they are given;
 *  - tuning_dir (MOE_TUNING_DIR) in a plan with ep_size or tp_size above 1: tuning files
 *    apply to single-process plans only; logged by the first such plan, once per ctx.
 * Every other knob acts on every plan. */

/* Number of knobs (the rows of `moe env`). */
MOE_API size_t moe_knob_count(void);
/* Resolve knob i (0 <= i < moe_knob_count()) from `opts` (may be NULL) and the environment,
 * as moe_ctx_create would, without failing: a bad value is described in out->error, an idle
 * one in out->inert.
 * MOE_ERANGE for i out of range. */
MOE_API moe_status moe_knob_describe(const moe_options *opts, size_t i, moe_knob_info *out);
/* The i-th MOE_* environment variable that no knob reads (0-based), with the closest known
 * name (moe_suggest), or *suggestion = NULL when no known name is close. Returns 0 when there
 * is no i-th such variable. name/suggestion are static or point into the environment; valid
 * until the environment changes. */
MOE_API int moe_env_unknown(size_t i, const char **name, size_t *name_len, const char **suggestion);

/* "Did you mean": of candidates[0, n) (NUL-terminated names; NULL entries are skipped), the one
 * closest to word[0, word_len) (need not be NUL-terminated), or NULL when none is close.
 * Closeness is the optimal string alignment distance (insertions, deletions, substitutions
 * and swaps of two neighbouring characters, each one edit; letters compared without case);
 * a candidate is close when it is at most max(1, L / 3) edits away, L being the word's
 * length without leading dashes, or when the word (of 3 or more such characters) begins it,
 * which counts as one edit. The first of equally close candidates wins. Words or candidates
 * longer than 63 characters are never close. The returned pointer is candidates[k]. Used
 * for unknown MOE_* variables here and for commands, options, model, scheme and family
 * names by the `moe` tool. */
MOE_API const char *moe_suggest(const char *word, size_t word_len, const char *const *candidates, size_t n);

typedef struct moe_ctx moe_ctx;

/* Create a context. `opts` may be NULL (all unset). Environment variables are read once,
 * here. Errors: MOE_EINVAL for a bad option or environment value (the message names the
 * variable and what it accepts; with out_err_msg non-NULL the message is also copied
 * there, since no ctx exists to hold it), MOE_ENOMEM. */
MOE_API moe_status moe_ctx_create(const moe_options *opts, moe_ctx **out, char *out_err_msg,
                          size_t out_err_len);
MOE_API void moe_ctx_free(moe_ctx *ctx);

/* The message of the calling thread's last failed call made with this ctx (or on an object
 * created from it: plan, weights, checkpoint), "" when this thread has had none on it. Like
 * errno, the last error is per thread: threads sharing a ctx (concurrent executes on one plan)
 * each read their own message, never another's or a mix; a successful call leaves it as it
 * was. Single-threaded use is unchanged. A thread keeps the messages of the 8 contexts it
 * last failed on (a 9th replaces the least recently failed, which then reads ""). A ctx
 * created after another was freed, even at the same address, starts with "" on every thread.
 * The pointer is into the calling thread's storage: valid in that thread until its next
 * failing call on this ctx, or until the thread exits; copy it to pass it to another thread. */
MOE_API const char *moe_ctx_last_error(const moe_ctx *ctx);

/* Resolved settings. */
MOE_API int moe_ctx_num_threads(const moe_ctx *ctx);
/* The resolved knobs in canonical text form: "key=value;" pairs in a fixed order, every knob
 * except the logging ones (which change no computation). Static per ctx. */
MOE_API const char *moe_ctx_options_text(const moe_ctx *ctx);
/* XXH64 (seed 0) of moe_ctx_options_text(), compared across ranks. */
MOE_API uint64_t moe_ctx_options_hash(const moe_ctx *ctx);
/* Name of the kernel table in use: a row of the kernel registry (moe_isa_count), e.g. "ref",
 * "avx2", "avx512". */
MOE_API const char *moe_ctx_isa(const moe_ctx *ctx);

/* The kernel registry: one row per kernel table, in order of preference (MOE_ISA=auto takes
 * the last row this machine runs). MOE_ISA accepts "auto" and every row's name. */
typedef struct moe_isa_info {
    const char *name;         /* static: MOE_ISA's value, e.g. "avx512" */
    const char *requires;     /* static: what the row needs, e.g. "AVX-512 F/BW/VL/DQ" */
    int runnable;             /* 1 when this CPU and OS run it (CPUID and XCR0) */
    char capabilities[128];   /* sub-ISA features the table uses here ("fma f16c avx512 vnni"),
                                 "" when none or not runnable */
    char notes[160];          /* what the table chose on this CPU when it was built and why (e.g.
                                 the form of compute bf16's pair GEMM, measured: same bits
                                 either way), "" when nothing */
} moe_isa_info;

/* Number of rows of the kernel registry. */
MOE_API size_t moe_isa_count(void);
/* Row i (0 <= i < moe_isa_count()). MOE_ERANGE for i out of range, MOE_EINVAL for NULL out. */
MOE_API moe_status moe_isa_describe(size_t i, moe_isa_info *out);

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
 *         w_k = w_k / (sum_k w_k + renormalize_eps) with renormalize (sum in top-k order;
 *         renormalize_eps 1e-20 by default; the sum is the p-norm with renormalize_p != 1)
 *   capacity (expert_capacity C > 0, top-1): per sequence, in token order, expert e keeps
 *         its first C tokens; a later token's slot is empty (id -1, no y, no term)
 *   y_k = expert_{ids[k]}(x), or expert_{ids[k]}(w_k * x) with apply_router_weight_on_input
 *   out = routed_scaling_factor * sum_k w_k y_k      (sum_k y_k with apply_router_weight_on_input)
 *         + g_sh * shared(x)                         g_sh = sigmoid(w_sg . x) if gated, else 1;
 *                                                    times shared_expert_scale (default 1)
 *         (+ b_o, has_output_bias)                   JetMoE's block bias [H]
 *   out = w_n * rmsnorm(out) (has_output_norm)        A.X-K1's post_mlp_layernorm [H]
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
 *   Kolibri1      top-k sigmoid on l with a selection bias (l + b_s); renormalize =
 *                 norm_topk_prob; shared, ungated
 *   Laguna, AFMoE sigmoid + selection bias, renormalize always; routed_scaling_factor from
 *                 moe_routed_scaling_factor / route_scale; shared, ungated
 *   MiniMax-M3    sigmoid + selection bias, renormalize always; routed_scaling_factor; the
 *                 clamped SwiGLU (swiglu_alpha, swiglu_limit) in the routed and shared experts
 *   Phi-MoE       sparsemixer on l (two rounds of masked softmax), router_jitter_noise
 *   JetMoE        top-k softmax on l; output bias [H]
 *   Inkling2      sigmoid + selection bias, no groups, renormalize always, route_scale;
 *                 MOE_ACT_SWIGLU_SOFTCAP experts (mlp_gate_softcap, mlp_up_softcap), no shared
 *   HY-V4         DeepSeek-V3's router (n_group 1); MOE_ACT_SWIGLU_CLAMP routed experts, the
 *                 shared expert plain SwiGLU (has_shared_activation, shared_activation)
 *   A.X-K1        DeepSeek-V3's block, then an output RMSNorm (has_output_norm, rms_norm_eps)
 *   LFM2-MoE      sigmoid (+ selection bias when use_expert_bias), renormalize = norm_topk_prob
 *                 dividing by (sum + 1e-6) (renormalize_eps), routed_scaling_factor
 *   Cohere2-MoE   top-k on l, then softmax of the k (expert_selection_fn "softmax") or sigmoid
 *                 (+ renormalize = norm_topk_prob, no epsilon); shared experts "average":
 *                 routed_scaling_factor = shared_expert_scale = 0.5, "sum": both 1
 *   LongCat-Flash softmax over E + zero_expert_num, selection bias, no renormalize,
 *                 routed_scaling_factor; ids >= E identity experts (num_identity_experts): w * x
 *   DeepSeek-V4   sqrt(softplus(l)) + e_score_correction_bias, no groups, renormalize always,
 *                 routed_scaling_factor; MOE_ACT_SWIGLU_CLAMP routed and shared (= I) experts
 *   Step-3.7      MiniMax-M3's router; MOE_ACT_SWIGLU_POSTCLAMP with per-layer limits
 *                 (swiglu_limits[L], swiglu_limits_shared[L]: shared_swiglu_limit)
 *   DeepSeek-OCR-2, Unlimited-OCR  DeepSeek-V2's block (their text decoders' copies of it)
 *   Mistral-Large-4  Mistral-4's router (softmax, top-2-sum groups), renormalize always
 *   DBRX          softmax; renormalize unless ffn_config.moe_normalize_expert_weights is null,
 *                 dividing by its p-norm (renormalize_p = that p, default 1: the sum)
 * ------------------------------------------------------------------------------------- */

/* Router scoring: the scores, the selection key and the weights, from the logits l. */
typedef enum moe_scoring {
    /* s = softmax over the E logits in f32; select on s (+ b_s); w_k = s[ids[k]].
     * Mixtral, Qwen2/3-MoE, Qwen3-Next, Qwen3.5-MoE, OLMoE, DeepSeek-V2 (`scoring_func`
     * "softmax"). */
    MOE_SCORING_SOFTMAX = 0,
    /* s = sigmoid(l) = 1 / (1 + exp(-l)) elementwise; select on s (+ b_s); w_k = s[ids[k]].
     * DeepSeek-V3/R1, Kimi-K2 (`scoring_func` "sigmoid"); MiniMax-M2, Hunyuan-V3 (no groups). */
    MOE_SCORING_SIGMOID = 1,
    /* Top-k first, on the logits: select on l (+ b_s); w = softmax over the K selected logits
     * l[ids[0..K-1]] (max and sum in top-k order). Granite-MoE; gpt-oss (its l includes the
     * router bias). Equal in exact arithmetic to softmax + renormalize, but selects on the
     * logits as those models do. */
    MOE_SCORING_TOPK_SOFTMAX = 2,
    /* Top-k first, on the logits: select on l (+ b_s); w_k = sigmoid(l[ids[k]]). Llama-4
     * (with apply_router_weight_on_input). */
    MOE_SCORING_TOPK_SIGMOID = 3,
    /* Phi-3.5-MoE's sparsemixer at inference (transformers 5.24 phimoe/modeling_phimoe.py
     * `sparsemixer`, training = False; arXiv 2409.12136), on the logits, top_k = 2 only (the
     * function always returns two experts), no groups, no selection bias. With
     * eps = sparsemixer_jitter_eps (config `router_jitter_noise`) and thr = 2 eps in f32, for
     * k = 0, 1: ids[k] = the best logit not yet selected (descending, lower id first, NaN
     * last), m = l[ids[k]]; expert e is masked when e was selected before or
     * (m - l[e]) / max(|l[e]|, m) > thr (NaN compares false: kept); w_k = softmax of the
     * unmasked logits (masked ones -inf), at ids[k]. Jitter and Gumbel sampling are training
     * only. renormalize (off in Phi-MoE) would divide the two weights by their sum. */
    MOE_SCORING_SPARSEMIXER = 4,
    /* s = sqrt(softplus(l)) elementwise, in f32: softplus(l) = log1p(exp(-|l|)) + max(l, 0)
     * (log1pf, expf, fmaxf, sqrtf; the form that neither overflows nor loses the small
     * values: equal in exact arithmetic to log(1 + exp(l))); select on s (+ b_s), groups as
     * configured; w_k = s[ids[k]]. DeepSeek-V4 (transformers 5.24
     * deepseek_v4/modeling_deepseek_v4.py DeepseekV4TopKRouter, `scoring_func`
     * "sqrtsoftplus": activations.py SqrtSoftplusActivation, F.softplus(l).sqrt()).
     * NaN stays NaN (then ranked last, as the other scorings' NaN); l = +inf: s = +inf;
     * l = -inf: s = +0; s >= 0 otherwise, and s > 0 for l > -104 (softplus underflows
     * below). */
    MOE_SCORING_SQRTSOFTPLUS = 5
} moe_scoring;

/* The score of a group of experts in group-limited selection (n_group > 1), from the
 * selection keys c of its members, ranked as top-k ranks them (NaN last). */
typedef enum moe_group_score {
    MOE_GROUP_SCORE_MAX = 0,     /* the best c: DeepSeek-V2 `topk_method` "group_limited_greedy" */
    MOE_GROUP_SCORE_TOP2_SUM = 1 /* best c + second best c (IEEE add; a group of one expert:
                                    its c): DeepSeek-V3 `topk_method` "noaux_tc" */
} moe_group_score;

/* Expert MLP activation. A gated expert (values 0 .. 5 and 10) computes g = Wg x (+ b_g),
 * u = Wu x (+ b_u) (I each), h = act(g, u), y = Wd h (+ b_d); a non-gated one (6 .. 9) has no
 * Wg: h = act(u). Config `hidden_act` picks the gate function (gpt-oss:
 * always MOE_ACT_SWIGLU_OAI). No family of ../shared/MODELS.md uses the GELU gates today
 * (every one has hidden_act "silu"); they are here for checkpoints that set them. */
typedef enum moe_activation {
    MOE_ACT_SWIGLU = 0,     /* h = silu(g) * u, silu(v) = v / (1 + exp(-v)); "silu", "swish" */
    MOE_ACT_GEGLU = 1,      /* h = gelu(g) * u, gelu(v) = (0.5 v) (1 + erf(v / sqrt(2))); "gelu" */
    MOE_ACT_GEGLU_TANH = 2, /* h = gelu_tanh(g) * u, gelu_tanh(v) =
                               (0.5 v) (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)));
                               "gelu_pytorch_tanh", "gelu_new" */
    MOE_ACT_SWIGLU_OAI = 3, /* gpt-oss (GptOssExperts._apply_gate): g' = min(g, limit),
                               u' = clamp(u, -limit, limit), h = (u' + 1) * (g' * sigmoid(alpha g')),
                               alpha = swiglu_alpha, limit = swiglu_limit. NaN stays NaN. */
    MOE_ACT_SWIGLU_CLAMP = 4, /* GLM-5-Next (Glm5NextTextExperts._apply_gate, and its shared expert
                               Glm5NextTextMLP): g' = min(g, limit), u' = clamp(u, -limit, limit),
                               h = silu(g') * u' (no alpha, no + 1), limit = swiglu_limit; the
                               routed and the shared expert alike. NaN stays NaN. */
    MOE_ACT_SWIGLU_SOFTCAP = 5, /* Inkling2 (transformers 5.24 inkling2/modeling_inkling2.py
                               Inkling2SoftcappedSwiGLU, the routed experts; Inkling2Loop's is the
                               same): h = (cap(g, c_g) * sigmoid(g)) * cap(u, c_u),
                               cap(v, c) = tanh(v / c) * c, sigmoid(v) = 1 / (1 + exp(-v)) of the
                               raw gate (not silu, not of the capped gate), in f32;
                               c_g = softcap_gate (config `mlp_gate_softcap`, 4),
                               c_u = softcap_up (`mlp_up_softcap`, 25), each finite and > 0.
                               NaN stays NaN; +-inf in g or u gives a finite h (the caps bound
                               it: |h| <= c_g c_u). */
    /* Non-gated experts (values 6 .. 9): the expert has no gate projection; it computes
     * u = W1 x (+ b_1) (I), h = act(u), y = W2 h (+ b_2). W1 is passed as the expert's up_proj
     * (moe_weight_source: gate_proj, gate_bias, gate_scale, gate_zero are not read and may be
     * NULL), W2 as its down_proj; libmoe packs no gate matrix and holds no gate memory. The
     * shared expert follows the same rule with its own activation (shared_activation when
     * has_shared_activation, else `activation`): non-gated, shared_gate_proj is not read. */
    MOE_ACT_RELU = 6,       /* h = max(u, 0) (NaN stays NaN); hidden_act "relu" */
    MOE_ACT_RELU2 = 7,      /* h = r * r, r = max(u, 0) (one f32 product; NaN stays NaN): Nemotron-H's
                               "relu2" (transformers 5.24 activations.py ReLUSquaredActivation) */
    MOE_ACT_GELU = 8,       /* h = (0.5 u) (1 + erf(u / sqrt(2))): "gelu" on a non-gated expert */
    MOE_ACT_GELU_TANH = 9,  /* h = (0.5 u) (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))): "gelu_new",
                               "gelu_pytorch_tanh" on a non-gated expert */
    /* a gated activation again (10: numbered after the non-gated ones) */
    MOE_ACT_SWIGLU_POSTCLAMP = 10 /* Step-3.7 (transformers 5.24 step3p7/modeling_step3p7.py
                               Step3p7Experts._apply_gate, the routed experts, and Step3p7MLP.forward,
                               the shared expert): the clamp AFTER the activation,
                               h = min(silu(g), limit) * clamp(u, -limit, limit),
                               silu(v) = v / (1 + exp(-v)) of the raw gate, in f32; limit =
                               swiglu_limit (the shared expert's: shared_swiglu_limit when set),
                               > 0, +inf allowed (no clamp: h = silu(g) * u). min and clamp keep
                               NaN (torch.clamp); g = +inf: silu = +inf, min gives limit; g = -inf:
                               silu = NaN (-inf / inf; torch's g * sigmoid(g) is NaN too). Unlike
                               MOE_ACT_SWIGLU_CLAMP (min(g, limit) before the silu) the gate's
                               silu may reach limit (for g >= limit + small) and negative gates
                               are not clamped (silu >= -0.279 there). */
} moe_activation;

/* 1 for the gated activations (MOE_ACT_SWIGLU .. MOE_ACT_SWIGLU_SOFTCAP and
 * MOE_ACT_SWIGLU_POSTCLAMP: the expert has a gate and an up projection), 0 for the non-gated
 * ones (MOE_ACT_RELU .. MOE_ACT_GELU_TANH: W1 passed as up_proj, no gate) and for a value out
 * of range. */
MOE_API int moe_activation_gated(moe_activation a);

#include "moe_quant.h"

/* Model family the description came from. Informational; the fields below decide the math.
 * Each value but custom is one row of libmoe's family table (src/io/families.c): how its
 * checkpoints are read (moe_checkpoint.h) and its routing defaults
 * (moe_family_layer_defaults); docs/adding-a-family.md lists what a new value takes. */
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
    MOE_FAMILY_QWEN3_NEXT = 11,  /* Qwen3NextForCausalLM */
    MOE_FAMILY_GLM4_MOE = 12,    /* Glm4MoeForCausalLM (GLM-4.5 / 4.6): DeepSeek-V3's routing */
    MOE_FAMILY_DOTS1 = 13,       /* Dots1ForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_MINIMAX = 14,     /* MiniMaxForCausalLM: Mixtral's routing */
    MOE_FAMILY_QWEN3_VL_MOE = 15, /* Qwen3VLMoeForConditionalGeneration (text MoE) */
    MOE_FAMILY_FLEX_OLMO = 16,    /* FlexOlmoForCausalLM: OLMoE's routing */
    MOE_FAMILY_GLM4_MOE_LITE = 17, /* Glm4MoeLiteForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_DEEPSEEK_V32 = 18,  /* DeepseekV32ForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_EXAONE_MOE = 19,    /* ExaoneMoeForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_MIMO_V2_FLASH = 20, /* MiMoV2FlashForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_LAGUNA = 21,        /* LagunaForCausalLM: sigmoid + correction bias, renormalized */
    MOE_FAMILY_KOLIBRI1 = 22,      /* Kolibri1ForCausalLM: top-k sigmoid on the biased logits */
    MOE_FAMILY_BEAM = 23,          /* BeamForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_MINIMAX_M3_VL = 24, /* MiniMaxM3SparseForConditionalGeneration (text MoE): sigmoid + bias,
                                      clamped SwiGLU */
    MOE_FAMILY_AFMOE = 25,         /* AfmoeForCausalLM: sigmoid + expert_bias, renormalized */
    MOE_FAMILY_FLINT = 26,         /* FlintForCausalLM: sigmoid top-k, norm_topk_prob */
    MOE_FAMILY_GRANITEMOE_SWA = 27, /* GraniteMoeSWAForCausalLM: Granite-MoE's routing */
    MOE_FAMILY_LARA_MINI = 28,     /* LaraMiniForCausalLM: softmax, norm_topk_prob */
    MOE_FAMILY_QWEN4_EXP = 29,     /* Qwen4ExpForConditionalGeneration, Qwen4ExpForCausalLM (text MoE) */
    MOE_FAMILY_PHIMOE = 30,        /* PhimoeForCausalLM (Phi-3.5-MoE): sparsemixer routing */
    MOE_FAMILY_JETMOE = 31,        /* JetMoeForCausalLM: Granite-MoE's routing + output bias */
    MOE_FAMILY_OPENAI_PRIVACY_FILTER = 32, /* OpenAIPrivacyFilterForTokenClassification: gpt-oss's
                                      block, gate/up as halves */
    MOE_FAMILY_QWEN3_OMNI_MOE = 33, /* Qwen3OmniMoeForConditionalGeneration,
                                       Qwen3OmniMoeThinkerForConditionalGeneration (the thinker's
                                       text MoE): Qwen3-MoE's routing */
    MOE_FAMILY_GRANITE_MOE_SHARED = 34, /* GraniteMoeSharedForCausalLM: Granite-MoE's routing, plus
                                           the decoder layer's shared MLP */
    MOE_FAMILY_GRANITE_MOE_HYBRID = 35, /* GraniteMoeHybridForCausalLM (Granite 4.0; its Mamba
                                           layers are not the block): as granitemoeshared */
    MOE_FAMILY_HUNYUAN_V1_MOE = 36,     /* HunYuanMoEV1ForCausalLM: Mixtral's routing plus an
                                           ungated shared MLP */
    MOE_FAMILY_MELLUM = 37,             /* MellumForCausalLM: Qwen3-MoE's routing */
    MOE_FAMILY_JAMBA = 38,              /* JambaForCausalLM: softmax top-k, not renormalized */
    MOE_FAMILY_MISTRAL4 = 39,           /* Mistral4ForCausalLM: softmax scores, DeepSeek-V3's
                                           top-2-sum groups (no bias), scaled, shared experts */
    MOE_FAMILY_ARIA = 40,               /* AriaForConditionalGeneration, AriaTextForCausalLM:
                                           Granite-MoE's routing, shared experts */
    MOE_FAMILY_ERNIE4_5_MOE = 41,       /* Ernie4_5_MoeForCausalLM: softmax selected with a
                                           correction bias, renormalized, shared experts */
    MOE_FAMILY_GLM_MOE_DSA = 42,   /* GlmMoeDsaForCausalLM (GLM-5): DeepSeek-V3's routing */
    MOE_FAMILY_SOLAR_OPEN = 43,    /* SolarOpenForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_GLM4V_MOE = 44,     /* Glm4vMoeForConditionalGeneration (GLM-4.5V text MoE): DeepSeek-V3's routing */
    MOE_FAMILY_KIMI_LINEAR = 45,   /* KimiLinearForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_BAILING_HYBRID = 46, /* BailingHybridForCausalLM: DeepSeek-V3's routing */
    MOE_FAMILY_MINIMAX_M2 = 47,    /* MiniMaxM2ForCausalLM: sigmoid + correction bias, no groups */
    MOE_FAMILY_HY_V3 = 48,         /* HYV3ForCausalLM: sigmoid + correction bias, no groups */
    MOE_FAMILY_AXK2 = 49,          /* AXK2ForCausalLM (A.X-K2): DeepSeek-V3's routing, no groups */
    MOE_FAMILY_GLM5_NEXT = 50,      /* Glm5NextForConditionalGeneration (text MoE): DeepSeek-V3's
                                      routing, MOE_ACT_SWIGLU_CLAMP experts */
    MOE_FAMILY_INKLING2 = 51,      /* Inkling2ForConditionalGeneration (text MoE): sigmoid + bias, no
                                      groups, renormalized, MOE_ACT_SWIGLU_SOFTCAP experts */
    MOE_FAMILY_INKLING2_LOOP = 52, /* Inkling2LoopForConditionalGeneration: Inkling2's block */
    MOE_FAMILY_HY_V4 = 53,         /* HYV4ForCausalLM: Glm4Moe's routing, MOE_ACT_SWIGLU_CLAMP routed
                                      experts, a plain SwiGLU shared expert (has_shared_activation) */
    MOE_FAMILY_HY_V4_VL = 54,      /* HYV4VLForConditionalGeneration (text MoE): HY-V4's block */
    MOE_FAMILY_AXK1 = 55,          /* AXK1ForCausalLM (A.X-K1): DeepSeek-V3's block + an output RMSNorm
                                      (has_output_norm) */
    MOE_FAMILY_LFM2_MOE = 56,      /* Lfm2MoeForCausalLM: sigmoid (+ expert_bias when use_expert_bias),
                                      renormalized by (sum + 1e-6) (renormalize_eps) */
    MOE_FAMILY_COHERE2_MOE = 57,   /* Cohere2MoeForCausalLM: top-k on the logits, then softmax of the k
                                      or sigmoid (expert_selection_fn); shared experts averaged or
                                      summed (shared_expert_scale) */
    MOE_FAMILY_LONGCAT_FLASH = 58, /* LongcatFlashForCausalLM: softmax over E + zero_expert_num, the
                                      correction bias for the choice, not renormalized, scaled; ids
                                      >= E are identity experts (num_identity_experts) */
    MOE_FAMILY_DEEPSEEK_V4 = 59,   /* DeepseekV4ForCausalLM: MOE_SCORING_SQRTSOFTPLUS + correction bias,
                                      renormalized, MOE_ACT_SWIGLU_CLAMP experts and shared expert;
                                      its "hash_moe" layers are refused (token-id routing) */
    MOE_FAMILY_STEP3P7 = 60,       /* Step3p7ForConditionalGeneration (text MoE): MiniMax-M3's router,
                                      MOE_ACT_SWIGLU_POSTCLAMP experts with per-layer limits */
    MOE_FAMILY_DEEPSEEK_OCR2 = 61, /* DeepseekOcr2ForConditionalGeneration (text MoE): DeepSeek-V2's
                                      router and ungated shared experts */
    MOE_FAMILY_UNLIMITED_OCR = 62, /* UnlimitedOcrForConditionalGeneration (text MoE): DeepSeek-OCR-2's
                                      block */
    MOE_FAMILY_MISTRAL_LARGE4 = 63, /* MistralLarge4ForConditionalGeneration (text MoE): Mistral-4's
                                      router in f32, always renormalized; saved in Mistral's names */
    MOE_FAMILY_NEMOTRON_H = 64,    /* NemotronHForCausalLM (transformers 5.24 nemotron_h NemotronHMoE):
                                      DeepSeek-V3's router (groups default 1, scaling default 1),
                                      non-gated experts and shared MLP (MOE_ACT_RELU2 from
                                      mlp_hidden_act "relu2"); MoE layers layers_block_type "moe" */
    MOE_FAMILY_DBRX = 65,          /* DbrxForCausalLM (transformers 5.24 dbrx DbrxFFN): softmax top-k
                                      divided by the p-norm ffn_config.moe_normalize_expert_weights
                                      (renormalize_p; null: not renormalized), SwiGLU experts; the
                                      MoE fields in config ffn_config; every layer */
    MOE_FAMILY_ERNIE4_5_VL_MOE = 66 /* Ernie4_5_VLMoeForConditionalGeneration (transformers 5.24
                                      ernie4_5_vl_moe Ernie4_5_VLMoeMoeBlock): ERNIE-4.5-MoE's router
                                      per modality; the text experts (default) or, with
                                      moe_checkpoint_options.expert_set "vision", the vision ones,
                                      each with the shared experts */,
    MOE_FAMILY_DOTS3_NOTE = 67      /* Dots3NoteForConditionalGeneration / Dots3NoteForCausalLM
                                      (transformers 5.24 dots3_note Dots3NoteTextMoE, its text
                                      decoder): DeepSeek-V3's router (sigmoid + correction bias,
                                      top-2-sum groups, norm_topk_prob, routed_scaling_factor), a
                                      shared expert shared_experts_intermediate_size *
                                      n_shared_experts wide */
} moe_family;

/* Static name of a family: "custom" for MOE_FAMILY_CUSTOM, else its row's name, the config
 * `model_type` of its first architecture ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3",
 * "gpt_oss", ...: docs/families.md "Supported" lists every one); "?" for a value without a row.
 * The values are dense from 1 to the last enumerator. */
MOE_API const char *moe_family_name(moe_family f);

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
    float swiglu_limit;            /* MOE_ACT_SWIGLU_OAI, MOE_ACT_SWIGLU_CLAMP: config
                                      `swiglu_limit`, default 7 (GLM-5-Next's config: 10);
                                      must be > 0 */
    moe_quant_config quant;        /* quantized routed experts (moe_quant.h "Quantized experts");
                                      default all NONE: experts in weight_dtype */
    float sparsemixer_jitter_eps;  /* MOE_SCORING_SPARSEMIXER: the mask threshold's eps, config
                                      `router_jitter_noise` (Phi-MoE; PhimoeConfig default
                                      0.01); finite and >= 0; read by no other mode */
    int has_output_bias;           /* out += b_o [H] after the routed sum, its scaling and the
                                      shared expert, one f32 add per element: JetMoE's
                                      JetMoeMoE `bias` (layer_output + self.bias, transformers
                                      5.24 jetmoe/modeling_jetmoe.py). moe_weight_source.output_bias */

    /* ---- the softcapped SwiGLU's constants and a shared-expert activation of
     * its own (appended: the fields above keep their offsets) ---- */
    float softcap_gate;            /* MOE_ACT_SWIGLU_SOFTCAP: c_g, config `mlp_gate_softcap`
                                      (Inkling2TextConfig default 4); finite and > 0; read by no
                                      other mode; default 4 */
    float softcap_up;              /* MOE_ACT_SWIGLU_SOFTCAP: c_u, config `mlp_up_softcap`
                                      (default 25); finite and > 0; default 25 */
    int has_shared_activation;     /* 0 (default): the shared expert applies `activation`, as
                                      the routed ones do; 1: it applies shared_activation (with
                                      the same swiglu_alpha / swiglu_limit / softcap_* fields).
                                      HY-V4 (transformers 5.24 hy_v4/modeling_hy_v4.py): routed
                                      HYV4Experts MOE_ACT_SWIGLU_CLAMP, shared HYV4MLP plain
                                      SwiGLU. Needs a shared expert (MOE_EINVAL without one). */
    moe_activation shared_activation; /* the shared expert's, when has_shared_activation;
                                      a moe_activation value (MOE_EINVAL naming the field) */
    int has_output_norm;           /* the block's output RMSNorm, last (after the routed sum, its
                                      scaling, the shared expert and the output bias), per token
                                      in f32: ss = sum_k y_k^2 (fmaf, k ascending), r = 1 /
                                      sqrtf(ss / H + eps), out_k = w_n[k] * (y_k * r). A.X-K1
                                      (transformers 5.24 axk1/modeling_axk1.py AXK1MoE.forward:
                                      post_mlp_layernorm, AXK1RMSNorm). moe_weight_source.output_norm */
    float output_norm_eps;         /* eps of has_output_norm: config `rms_norm_eps` (AXK1Config
                                      default 1e-6); finite and >= 0; default 1e-6 */

    /* ---- router knobs (appended: the fields above keep their offsets) ---- */
    float renormalize_eps;         /* with renormalize, w_k = w_k / (sum + renormalize_eps), the
                                      sum and the add in f32; finite and >= 0 (MOE_EINVAL naming
                                      the field); default 1e-20 (Mixtral, Qwen, DeepSeek-V3 ...).
                                      LFM2-MoE: 1e-6 (transformers 5.24 lfm2_moe/modeling_lfm2_moe.py
                                      Lfm2MoeTopKRouter: routing_weights / (sum + 1e-6)); Cohere2-MoE
                                      sigmoid: 0 (cohere2_moe/modeling_cohere2_moe.py
                                      Cohere2MoeTopKRouter divides by the sum alone) */
    float shared_expert_scale;     /* the shared expert's output is multiplied by this (after its
                                      gate, one f32 product per token: g_sh * scale, then times
                                      shared(x)); finite and > 0 when there is a shared expert
                                      (MOE_EINVAL naming the field); default 1. Cohere2-MoE's
                                      shared_expert_combination_strategy "average" ((routed +
                                      shared) / 2, Cohere2MoeSparseMoeBlock.forward) is 0.5 with
                                      routed_scaling_factor 0.5: halving is exact in f32, so
                                      0.5 r + 0.5 s == (r + s) / 2 bit for bit (no subnormals) */
    /* ---- identity ("zero") experts (appended: the fields above keep their offsets) ---- */
    int64_t num_identity_experts;  /* Z, default 0. The router scores E + Z experts: the router
                                      weight is [E + Z, H], router_bias / selection_bias [E + Z],
                                      caller router_logits [T, E + Z], and scoring, selection and
                                      top-k run over all E + Z; 1 <= K <= E + Z. A selected id in
                                      [E, E + Z) is an identity expert: its term is w * x (the
                                      block's f32 input row), added in the combine in top-k order
                                      with the same f32 operations as a routed term (acc += w * y),
                                      before routed_scaling_factor; such rows never enter the
                                      permutation, the grouped GEMM or the EP dispatch, and hold no
                                      weights (never placed). topk_ids may hold ids >= E;
                                      expert_load counts only ids < E. LongCat-Flash (transformers
                                      5.24 longcat_flash/modeling_longcat_flash.py
                                      LongcatFlashTopkRouter, LongcatFlashExperts.forward
                                      `identity_expert`): config `zero_expert_num`. In [0, 2^24].
                                      Every routing field reads the E + Z experts as one range
                                      (n_group divides E + Z); with apply_router_weight_on_input
                                      the term is the same w * x; caller-given in_topk_ids may
                                      be in [0, E + Z). */
    /* ---- the shared expert's own clamp (appended: the fields above keep their offsets) ---- */
    float shared_swiglu_limit;     /* the shared expert's limit for MOE_ACT_SWIGLU_OAI /
                                      MOE_ACT_SWIGLU_CLAMP / MOE_ACT_SWIGLU_POSTCLAMP (its
                                      `activation`, or shared_activation with
                                      has_shared_activation); 0 (default): swiglu_limit, as the
                                      routed experts; else > 0 (+inf allowed), MOE_EINVAL naming
                                      the field otherwise. Step-3.7 (transformers 5.24
                                      step3p7/modeling_step3p7.py Step3p7MLP: config
                                      `swiglu_limits_shared[L]`, the routed `swiglu_limits[L]`) */
    /* ---- the renormalization's p-norm (appended: the fields above keep their offsets) ---- */
    float renormalize_p;           /* with renormalize, the K weights are divided by their p-norm
                                      N_p plus renormalize_eps: w_k = w_k / (N_p + renormalize_eps),
                                      one f32 add and one f32 division. p = 1 (default): N_1 = the
                                      plain f32 sum in top-k order, the renormalization every other
                                      family has (the same operations, bit for bit; the weights of
                                      every scoring are >= 0, so the sum is |w|'s). p = +inf: N =
                                      max_k |w_k| (exact). Any other finite p > 0: N_p = (sum_k
                                      |w_k|^p)^(1/p) computed in double (pow, k in top-k order),
                                      then rounded once to f32. Must be > 0 (+inf allowed) when
                                      renormalize is set (MOE_EINVAL naming the field; 0, < 0 and
                                      NaN are refused); not read otherwise. DBRX (transformers 5.24
                                      dbrx/modeling_dbrx.py DbrxFFN.route_tokens_to_experts: w /
                                      torch.norm(w, p = moe_normalize_expert_weights), no epsilon:
                                      N_p >= max_k w_k >= 1/E, so the default 1e-20 leaves N_p
                                      unchanged in f32) */
    /* ---- expert capacity (appended: the fields above keep their offsets) ---- */
    int64_t expert_capacity;       /* 0 (default): every routed slot runs. C > 0: the Switch
                                      Transformer's top-1 capacity (Fedus et al. 2021, "Switch
                                      Transformers", section 2.2; transformers 5.24
                                      switch_transformers/modeling_switch_transformers.py
                                      SwitchTransformersTop1Router: token_priority = cumsum of
                                      the one-hot choice along the sequence, kept while <=
                                      expert_capacity, in eval mode too; config
                                      `expert_capacity`, default 64). Within one sequence
                                      (moe_exec_args.sequence_lengths), in token order, the
                                      tokens routed to expert e after its first C are dropped:
                                      that slot runs no expert and adds nothing (its routed term
                                      is +0, not 0 * y), topk_ids reports it as -1 and
                                      topk_weights as 0; the shared expert and the output bias
                                      / norm still apply. The count restarts at each sequence
                                      and crosses chunks, threads and EP dispatch unchanged; a
                                      token's output depends on the tokens before it in its own
                                      sequence and on nothing else (docs/numerics.md "Expert
                                      capacity"). Needs top_k 1 (Switch routes top-1) and no
                                      identity experts; in [0, 2^31) (MOE_EINVAL naming the
                                      field). Caller-given routing (in_topk_ids) is used as
                                      given: no capacity is applied to it */
} moe_layer_desc;

/* Defaults: family custom, softmax, renormalize 0, routed_scaling_factor 1, SwiGLU, no
 * shared expert, weight_dtype BF16, no groups (group score max), no biases, weights applied
 * to the output, swiglu_alpha 1.702, swiglu_limit 7, sparsemixer_jitter_eps 0.01, no output
 * bias, softcap_gate 4, softcap_up 25, the shared expert applying `activation`
 * (has_shared_activation 0, shared_activation SwiGLU), no output norm (eps 1e-6), no identity
 * experts (num_identity_experts 0), shared_swiglu_limit 0 (the shared expert's limit is
 * swiglu_limit), renormalize_p 1 (the plain sum); sizes 0
 * (must be set). */
MOE_API void moe_layer_desc_init(moe_layer_desc *desc);

/* ---------------------------------------------------------------------------------------
 * Plan: a layer description compiled once.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_plan moe_plan;

/* Validate `desc` and compile a plan on `ctx` (borrowed: it must outlive the plan).
 * Errors: MOE_EINVAL naming the bad field (sizes <= 0, K > E, non-finite or <= 0
 * routed_scaling_factor, an enum value out of range, group settings that cannot keep top_k
 * experts), MOE_EDTYPE (weight dtype not F32/BF16/F16), MOE_EUNSUPPORTED (a quantization
 * combination libmoe does not compute, named: moe_quant.h), MOE_ENOMEM. */
MOE_API moe_status moe_plan_create(moe_ctx *ctx, const moe_layer_desc *desc, moe_plan **out);
MOE_API void moe_plan_free(moe_plan *plan);

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

#include "moe_parallel.h"

/* The arithmetic of the expert GEMMs (routed and shared experts). It changes the output, so
 * it is part of the plan (moe_plan_text, moe_plan_hash), never a knob. Routing (router GEMM,
 * scores, top-k, routing weights), biases, activations and the combine are f32 in both modes.
 *  - MOE_COMPUTE_F32 (default): f32 activations, one fused multiply-add per term in increasing
 *    k (docs/numerics.md section 2).
 *  - MOE_COMPUTE_BF16: what a bf16 transformers model (and vLLM, SGLang, KTransformers on
 *    bf16 weights) computes: the hidden states entering gate/up and the activation output
 *    entering down are rounded to bf16 (round to nearest even, as torch's f32 -> bf16; NaN
 *    stays NaN, +-Inf stays +-Inf), products are accumulated in f32 in the pair order of
 *    x86's vdpbf16ps with bf16 denormals read as zero and f32 denormal results flushed to zero
 *    (docs/numerics.md section 7: the exact rule, and the bounds against the f32 mode and
 *    transformers). Weights: bf16 as they are; f32 and f16 weights are rounded to bf16 once
 *    at packing (nearest even; logged at INFO with the bytes saved); the weight-only quantized
 *    formats keep their codes (every code value is exact in bf16) and scales. The
 *    quantized-activation schemes (int8-w8a8, fp8-block-w8a8) compute in 8 bits already:
 *    MOE_EUNSUPPORTED with compute bf16. On a kernel table without avx512_bf16 the mode runs
 *    with the same bits on that table's own kernels or the scalar ones, with one WARNING
 *    naming the missing feature and the cost. */
typedef enum moe_compute {
    MOE_COMPUTE_F32 = 0,
    MOE_COMPUTE_BF16 = 1
} moe_compute;

/* "f32", "bf16", or "?" for a value out of range. */
MOE_API const char *moe_compute_name(moe_compute c);
/* MOE_OK and *out for "f32" / "bf16"; MOE_EINVAL otherwise. */
MOE_API moe_status moe_compute_from_name(const char *name, moe_compute *out);

typedef struct moe_plan_config {
    moe_prepare_finalize_kind prepare_finalize; /* default MOE_PF_LOCAL; with ep_size > 1 the
                                 local kinds become the EP kind of the same format
                                 (MOE_PF_LOCAL -> MOE_PF_EP_ALLTOALL, MOE_PF_LOCAL_BATCHED ->
                                 MOE_PF_EP_BATCHED) */
    moe_experts_kind experts;                   /* default MOE_EXPERTS_GROUPED */
    int64_t batched_capacity; /* batched format: token slots per expert (per source rank under
                                 EP); chunks are cut to it so no row is ever dropped; default 64 */
    moe_parallel_config parallel; /* default: one process (sizes 1, ranks 0) */
    moe_compute compute;          /* default MOE_COMPUTE_F32; the plan text gains
                                     "compute=bf16;" in bf16 mode (f32 plans keep their text
                                     and hash) */
} moe_plan_config;

MOE_API void moe_plan_config_init(moe_plan_config *cfg);

/* moe_plan_create with a chosen composition. Errors as moe_plan_create, plus MOE_EINVAL when
 * the prepare/finalize and experts formats differ (the message names both), for a
 * capacity < 1, a compute value out of range, or for a bad parallel field (named);
 * MOE_EUNSUPPORTED for compute bf16 with a quantized-activation scheme; for parallel plans, the errors of the
 * collective check (moe_parallel.h: MOE_EINVAL, MOE_ETIMEOUT, MOE_EMPI) and MOE_EUNSUPPORTED without
 * MPI. cfg may be NULL (defaults). */
MOE_API moe_status moe_plan_create_ex(moe_ctx *ctx, const moe_layer_desc *desc, const moe_plan_config *cfg,
                              moe_plan **out);

/* The plan's compute mode (moe_plan_config.compute; MOE_COMPUTE_F32 for moe_plan_create). */
MOE_API moe_compute moe_plan_compute(const moe_plan *plan);

/* The description the plan was compiled from. */
MOE_API const moe_layer_desc *moe_plan_desc(const moe_plan *plan);

/* Canonical text of the plan: the ctx's resolved knobs (moe_ctx_options_text) followed by
 * the layer description and composition as "key=value;" pairs; with a tuning folder
 * (moe_options.tuning_dir) it ends "tuning_file=PATH;tuned=T:chunk_size/permute/
 * onehot_threshold/topk/lowtok_threshold,...;" (the entries as they run, explicit knobs
 * applied) or "tuning_file=none;" (docs/tuning.md). Valid while the plan lives. */
MOE_API const char *moe_plan_text(const moe_plan *plan);
/* XXH64 (seed 0) of moe_plan_text(): compared across ranks. */
MOE_API uint64_t moe_plan_hash(const moe_plan *plan);

/* Bytes of workspace moe_plan_execute() needs for up to `max_tokens` tokens. The experts
 * stage runs in chunks of at most chunk_size tokens, so this is bounded whatever
 * max_tokens is; with a tuning file, the longest chunk of any entry an execute of at most
 * max_tokens tokens can select, so the size serves every n_tokens <= max_tokens. 0 for
 * max_tokens <= 0. Parallel plans: max_tokens bounds the tokens of every
 * rank's execute (the rows received from the peers need room), and the size includes the
 * send and receive buffers of the dispatch and the TP reduction. */
MOE_API size_t moe_plan_workspace_size(const moe_plan *plan, int64_t max_tokens);

/* ---------------------------------------------------------------------------------------
 * Plan report: what a layer costs on one rank before anything is packed, and every cost
 * nobody asked for (padding, duplicated memory, fallback kernels), computed by the same rules
 * moe_weights_create and the kernel tables follow (`moe plan` prints it).
 * ------------------------------------------------------------------------------------- */
#define MOE_REPORT_MAX_COSTS 8
/* A memory cost below this fraction of the expert bytes a rank holds (code + scale + shared
 * bytes, on the rank holding the fewest) is small: the report gives it level MOE_LOG_INFO,
 * and `moe plan` prints it as an INFO line rather than a WARNING (a 2 MB replicated router
 * beside 1.6 GB of experts per rank). */
#define MOE_REPORT_SMALL_FRACTION 0.01

/* One cost nobody asked for. */
typedef struct moe_cost {
    const char *kind;  /* static: "replicated", "duplicated", "padding", "fallback" */
    double bytes;      /* its memory on the worst rank, in bytes; -1 when it is not memory (a
                          fallback kernel: compute) */
    double flop_share; /* the share of the layer's FLOPs it runs slower (fallback), else 0 */
    char what[400];    /* one sentence saying what and why (the WARNING line, without size) */
    int level;         /* moe_log_level: MOE_LOG_INFO for memory (bytes >= 0) below
                          MOE_REPORT_SMALL_FRACTION of the expert bytes on the rank holding
                          the fewest; else MOE_LOG_WARN (every fallback kernel) */
} moe_cost;

typedef struct moe_rank_report {
    /* the layer */
    const char *kernel_table;     /* static: the ctx's table */
    const char *compute_roof;     /* static: the compute peak of moe_roofline (moe_bench.h) that
                                     the instructions of the routed experts' GEMMs run against
                                     on this table: "bf16" (compute bf16 on vdpbf16ps:
                                     bf16_dp_gflops), "vnni" (int8-w8a8 on vpdpbusd:
                                     vnni_int8_gops), "fma" (fma_f32_gflops: everything else,
                                     compute bf16 on two vfmadds per pair (no avx512_bf16, or
                                     the avx512_bf16 table where vdpbf16ps is the slower form:
                                     moe_isa_info.notes) or on the scalar entries included;
                                     those run far below it) */
    const char *experts_format;   /* static: the routed experts' weights: "bf16", "f16", "f32",
                                     or the quantization scheme ("int4-g128", "custom", ...) */
    int quantized;                /* routed experts quantized (desc.quant) */
    int code_bits;                /* bits per routed-expert weight as packed (32, 16, 8 or 4) */
    double flops_per_token;       /* 2 K 3 H I + 2 3 H I_s + 2 E H (router) */
    double decode_bytes_per_token;/* routed weight bytes of K experts (codes only) + shared */
    uint64_t layer_bytes;         /* the layer's expert and shared weights in one process
                                     (quantized: codes without scales) */
    uint64_t total_bytes;         /* all ranks together: codes, scales and shared experts */
    /* this rank (ep_rank, tp_rank) */
    int ep_rank, tp_rank;
    int64_t expert_first, n_experts; /* physical experts [first, first + n) of the placement
                                        (moe_parallel.h "Expert placement"); with the
                                        contiguous one also the global expert ids */
    int64_t i_first, i_cols;         /* I columns [first, first + cols) of every expert */
    int64_t shared_i_first, shared_i_cols; /* the shared expert's I_s columns */
    uint64_t code_bytes;          /* routed experts as packed (quantized: the codes) */
    uint64_t scale_bytes;         /* quantized: their f32 scales, zero points, w8a8 sums */
    uint64_t dup_scale_bytes;     /* of scale_bytes: held twice over the TP ranks (a scale cell
                                     cut by the shard boundary, or repeated by a finer cell) */
    uint64_t shared_bytes;        /* the shared expert's shard */
    uint64_t router_bytes;        /* the router [E, H] f32 (replicated on every rank) */
    uint64_t padding_bytes;       /* of code_bytes: zeros the packed layout adds (int8 w8a8: K
                                     rounded up to 4; 4-bit: an odd last panel's tail nibble);
                                     0 for the plain formats (partial tiles are masked) */
    int64_t w2_scale_cell;        /* quantized: the down projection's scale cell along I, and */
    int64_t w2_scale_cell_kept;   /* the cell this shard keeps it in (smaller when the shard
                                     starts inside a cell and leaves it), else 0 */
    /* every cost nobody asked for, over all ranks of the layout */
    size_t n_costs;
    moe_cost costs[MOE_REPORT_MAX_COSTS];
} moe_rank_report;

/* The report of `plan` for its own rank. code_bytes + scale_bytes + shared_bytes is what
 * moe_weights_expert_bytes reports once packed. Errors: MOE_EINVAL (NULL argument);
 * quantized experts under TP, when some rank's shard cannot be packed (the error recorded on
 * the plan's ctx names that TP rank): MOE_ESHAPE (a 4-bit shard of odd width),
 * MOE_EUNSUPPORTED (an fp8 w8a8 shard starting inside a k-block). */
MOE_API moe_status moe_plan_report(const moe_plan *plan, moe_rank_report *out);

/* The same for any rank of an EP x TP layout, without MPI and without creating the plan:
 * desc on ctx's kernel table, cfg->parallel's ep_size / tp_size and the rank's ep_rank /
 * tp_rank, and cfg->compute (the other fields ignored). Errors: those of moe_plan_create's
 * validation of desc (recorded on ctx); MOE_EINVAL for sizes, ranks or compute out of range
 * (named; ep_size * tp_size at most 2^20); MOE_EUNSUPPORTED for compute bf16 with a
 * quantized-activation scheme; and the TP shard errors of moe_plan_report. */
MOE_API moe_status moe_plan_report_for(moe_ctx *ctx, const moe_layer_desc *desc, const moe_plan_config *cfg,
                               moe_rank_report *out);

/* What an execute of n_tokens (>= 1) tokens runs on `plan`. */
typedef struct moe_plan_path {
    int64_t chunk_tokens;         /* tokens per chunk */
    int64_t chunks;
    double rows_per_expert;       /* mean routed rows per expert in a full chunk (Tc K / E) */
    const char *permute;          /* static: the method MOE_PERMUTE (or the tuning entry) picks for a
                                     full chunk */
    const char *experts_path;     /* static: exactly "tiled GEMM", or "few-token streaming" when
                                     rows_per_expert is below lowtok_threshold */
    size_t workspace_bytes;       /* moe_plan_workspace_size(plan, n_tokens) */
    int64_t tuned_tokens;         /* the tuning file entry an execute of n_tokens runs (its token
                                     count; docs/tuning.md), 0: the context's knobs */
    const char *topk;             /* static: "sort" or "rowmax" */
    int64_t lowtok_threshold;     /* the one that execute runs with */
} moe_plan_path;

/* Errors: MOE_EINVAL (NULL argument, n_tokens < 1). */
MOE_API moe_status moe_plan_path_for(const moe_plan *plan, int64_t n_tokens, moe_plan_path *out);

/* The name of the tuning file for plan's layer shape and machine (docs/tuning.md), without a
 * folder: "E=<num_experts>,N=<moe_intermediate_size>,K=<hidden_size>,top_k=<top_k>
 * [,shared_N=<shared_expert_intermediate_size>],format=<bf16|f16|f32|quant scheme>,
 * compute=<f32|bf16>,device_name=<CPU model name, sanitized>,threads=<threads>.json" (one line,
 * no spaces). Errors: MOE_EINVAL (NULL), MOE_ERANGE (len too short; the bytes needed in the
 * message). */
MOE_API moe_status moe_plan_tuning_name(const moe_plan *plan, char *out, size_t len);

/* The path of the tuning file plan creation read, or "" when none (no MOE_TUNING_DIR, no file
 * for this shape, a parallel plan). Valid while the plan lives. */
MOE_API const char *moe_plan_tuning_file(const moe_plan *plan);

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
    const void *const *gate_proj;  /* E pointers, each [I, H] (Mixtral w1); not read (may be NULL,
                                      as gate_bias, gate_scale, gate_zero) for a non-gated
                                      activation (moe_activation_gated 0) */
    const void *const *up_proj;    /* E pointers, each [I, H] (Mixtral w3); non-gated experts:
                                      W1 (Nemotron-H `experts.up_proj`, Switch `wi`) */
    const void *const *down_proj;  /* E pointers, each [H, I] (Mixtral w2) */
    const void *shared_gate_proj;  /* [I_s, H] or NULL when there is no shared expert or its
                                      activation is non-gated (then W1 is shared_up_proj) */
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
    /* Quantized experts (desc->quant, see moe_quant.h "Quantized experts"): gate_proj / up_proj /
     * down_proj then point at the codes, row-major, and these at the scales (and zero
     * points) of each expert, in the shapes given there. NULL when desc->quant is NONE. */
    const void *const *gate_scale; /* E pointers */
    const void *const *up_scale;   /* E pointers */
    const void *const *down_scale; /* E pointers */
    const uint8_t *const *gate_zero; /* E pointers, INT4 with has_zero_point only */
    const uint8_t *const *up_zero;
    const uint8_t *const *down_zero;
    const void *output_bias;       /* [H] when desc->has_output_bias (JetMoE mlp.bias), converted
                                      exactly to f32 at pack time */
    moe_dtype output_bias_dtype;   /* F32, BF16 or F16 */
    /* Static FP8 activations (desc->quant.act = MOE_QACT_STATIC, moe_quant.h "Static activation
     * quantization"), branch fp8static: */
    const float *w13_input_scale;  /* [E] f32: expert e's input scale of gate_proj and up_proj
                                      (compressed-tensors `<expert>.gate_proj.input_scale`, equal
                                      to up_proj's), finite and > 0; NULL otherwise */
    const float *w2_input_scale;   /* [E] f32: expert e's input scale of down_proj
                                      (`<expert>.down_proj.input_scale`), finite and > 0 */
    /* appended: the fields above keep their offsets */
    const void *output_norm;       /* [H] when desc->has_output_norm (A.X-K1 post_mlp_layernorm
                                      weight), converted to f32 at weights creation */
    moe_dtype output_norm_dtype;   /* F32, BF16 or F16 */
} moe_weight_source;

/* The routed experts as transformers holds them: one stacked tensor per projection, the
 * layout its `use_experts_implementation` decorator flags describe (transformers
 * integrations/moe.py; every experts module since 5.0: Mixtral, Qwen2/3-MoE, OLMoE,
 * DeepSeek-V2/V3 use the defaults, gpt-oss is_concatenated 0, is_transposed 1, has_bias 1).
 * Shapes with E num_experts, H hidden_size, I moe_intermediate_size; tensors contiguous,
 * in desc->weight_dtype (biases in bias_dtype). */
typedef struct moe_stacked_experts {
    const void *gate_up_proj;      /* [E, 2I, H] (nn.Linear layout), or [E, H, 2I] when is_transposed.
                                      Non-gated experts (moe_activation_gated(desc->activation) 0;
                                      transformers' has_gate=False, Nemotron-H's experts.up_proj):
                                      up_proj alone, [E, I, H] or [E, H, I] */
    const void *down_proj;         /* [E, H, I], or [E, I, H] when is_transposed */
    const void *gate_up_proj_bias; /* [E, 2I] ([E, I] non-gated) when has_bias, else ignored */
    const void *down_proj_bias;    /* [E, H] when has_bias, else ignored */
    int is_transposed;             /* 1: input-major ([E, in, out]); both projections */
    int is_concatenated;           /* 1: the 2I outputs are gate [0, I) then up [I, 2I) (the
                                      default; torch chunk(2)); 0: interleaved, gate = even,
                                      up = odd outputs (gpt-oss [..., ::2], [..., 1::2]).
                                      Not read for non-gated experts */
    int has_bias;                  /* per-expert biases (gpt-oss); needs desc->has_expert_bias */
    moe_dtype bias_dtype;          /* F32, BF16 or F16 */
} moe_stacked_experts;

/* Pointers moe_weight_source_from_stacked stores in caller storage for E experts. */
#define MOE_STACKED_POINTERS(E) ((size_t)(E) * 6)

/* Fill the routed-expert fields of `src` (gate_proj, up_proj, down_proj, their strides and,
 * with has_bias, gate_bias, up_bias, down_bias, expert_bias_dtype, gate_up_bias_stride; gate_proj
 * and gate_bias NULL for non-gated experts, whose W1 is up_proj) from
 * the stacked tensors `st`, without copying: the per-expert pointer arrays are written into
 * `ptrs`, caller storage of n_ptrs >= MOE_STACKED_POINTERS(desc->num_experts) entries that
 * must outlive every use of src (moe_weights_create copies the weights and keeps nothing).
 * Every other field of src (router, shared expert, router and selection biases) is left as it
 * was. moe_weights_create then packs exactly the weights the row-major per-expert
 * description of the same values packs (the same bits; layouts are transposed once, while
 * packing). Errors: MOE_EINVAL naming a NULL pointer or a too short ptrs (the count needed),
 * has_bias without desc->has_expert_bias or the converse, MOE_EDTYPE (bias_dtype),
 * MOE_EUNSUPPORTED (quantized desc: stacked codes are not described here). The message goes
 * to `err` (err_len bytes, may be NULL), since no ctx is involved. */
MOE_API moe_status moe_weight_source_from_stacked(const moe_layer_desc *desc, const moe_stacked_experts *st,
                                          const void **ptrs, size_t n_ptrs, moe_weight_source *src,
                                          char *err, size_t err_len);

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
 * description asks for included) or a bad stride, MOE_EDTYPE, MOE_ENOMEM (an allocation
 * failed, or, checked before allocating anything, the bytes to pack exceed the memory this
 * process can still take: MemAvailable, the memory cgroup's limit, RLIMIT_AS, RLIMIT_DATA;
 * the message gives both sizes and which bound; docs/checkpoints.md "Memory"). */
MOE_API moe_status moe_weights_create(const moe_plan *plan, const moe_weight_source *src,
                              moe_weights **out);
MOE_API void moe_weights_free(moe_weights *w);
/* Bytes of packed expert weights resident on this rank (w13 + w2 + shared: the local experts
 * and the rank's I shard under EP / TP), not counting the router. */
MOE_API size_t moe_weights_expert_bytes(const moe_weights *w);

/* ---------------------------------------------------------------------------------------
 * Execute.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_exec_args {
    const void *hidden_states;  /* [T, H], dtype hidden_dtype */
    moe_dtype hidden_dtype;     /* F32 or BF16 */
    int64_t n_tokens;           /* T >= 0; T = 0 returns at once, nothing written */
    const float *router_logits; /* [T, E] f32 ([T, E + Z] with num_identity_experts Z), or
                                   NULL: computed from the router weight
                                   (and router bias). Caller-supplied logits are complete:
                                   no router bias is added to them */
    void *output;               /* [T, H] in output_dtype (f32 by default), written
                                   (MOE_TP_REDUCE=reduce_scatter under TP: only this rank's
                                   rows, moe_plan_tp_rows) */
    int32_t *topk_ids;          /* [T, K] or NULL; written in top-k order; an id >= E is an
                                   identity expert (num_identity_experts); -1 an empty slot
                                   (dropped by expert_capacity, or given as -1) */
    float *topk_weights;        /* [T, K] or NULL; the routing weights after
                                   renormalization, before routed_scaling_factor (0 for a
                                   slot dropped by expert_capacity) */
    void *workspace;            /* moe_plan_workspace_size(plan, n_tokens) bytes (parallel
                                   plans: for the most tokens any rank passes), 64-byte
                                   aligned is best; may be NULL when that size is 0 */
    size_t workspace_size;      /* bytes available at workspace */
    struct moe_exec_stats *stats; /* optional: what ran (see below), or NULL */

    /* Caller-given routing ("experts only": what transformers' experts modules
     * (use_experts_implementation: forward(hidden_states, top_k_index, top_k_weights)) and
     * engines' fused-experts ops pass). Both NULL (a zeroed struct): libmoe routes. Both set:
     * the router is not run (no router GEMM, scoring, selection bias, groups or
     * renormalization); token t's experts are in_topk_ids[t][0..K) and their weights
     * in_topk_weights[t][0..K), used exactly as given, in the given slot order (the combine
     * sums in slot order). Everything after routing is the plan's as described: the
     * shared expert (if the description has one) is still added, apply_router_weight_on_input
     * still scales the expert input, and routed_scaling_factor is still applied once in
     * finalize. transformers' routers return weights with routed_scaling_factor already in
     * them (DeepseekV3TopkRouter / DeepseekV3MoE.route_tokens_to_experts multiply it in
     * before calling the experts; Qwen/Mixtral/OLMoE/gpt-oss have none): a plan fed those
     * weights must have routed_scaling_factor 1 (and no shared expert, which transformers
     * runs outside the experts module). Given the ids and weights this execute's routed path
     * writes to topk_ids / topk_weights, the output is bit-identical to that routed path.
     * Under EP each rank passes the routing of its own tokens (routing precedes dispatch);
     * under TP every rank of a TP group passes the same ids and weights, as it passes the
     * same hidden_states. Validated before anything runs: every id in [0, E) or -1 (an empty
     * slot: no expert runs and it adds nothing, as a slot dropped by expert_capacity, which
     * topk_ids reports as -1), and the experts of a token distinct, else MOE_EINVAL naming
     * the token and slot; one of the two NULL, or
     * router_logits also set, MOE_EINVAL. Weights are not checked (NaN or Inf follow IEEE
     * arithmetic through the combine). topk_ids / topk_weights, when set, receive copies. */
    const int32_t *in_topk_ids;     /* [T, K] i32, or NULL; ids in [0, E + Z) (Z identity experts) or -1 */
    const float *in_topk_weights;   /* [T, K] f32, or NULL */
    /* F32 (0: the default) or BF16: output then holds [T, H] bf16 (uint16_t bits), each the
     * f32 result rounded to nearest even (NaN stays NaN, quieted; torch's f32 -> bf16
     * cast). The f32 result is computed exactly as for F32 output and then rounded, so the
     * bf16 output equals rounding the F32 output. Other dtypes: MOE_EDTYPE. */
    moe_dtype output_dtype;
    int64_t *expert_load;       /* [E] or NULL (identity experts' rows are not counted):
                                   expert load, accumulated. Adds to entry e
                                   the number of this rank's (token, k) rows routed to
                                   logical expert e by this execute (the caller zeroes it to
                                   reset; sum over ranks: moe_plan_gather_load). Counted
                                   after routing, before any dispatch; untouched on error */
    /* Sequence boundaries, read only by a plan with expert_capacity > 0 (which counts each
     * expert's tokens per sequence). sequence_lengths [n_sequences] i64: the T tokens are
     * n_sequences consecutive sequences of these lengths, each >= 0, summing to n_tokens
     * (MOE_EINVAL naming the entry otherwise). transformers' [B, S, H] batch of a Switch
     * block is B sequences of S (padding included, as it counts them); a decode step of B
     * sequences is B sequences of 1 (no token is ever dropped). NULL (n_sequences 0): when
     * n_tokens <= expert_capacity no token can be dropped and none is; a longer call without
     * boundaries is refused (MOE_EINVAL saying to give them), never guessed. Under EP each
     * rank gives its own tokens' sequences; under TP the ranks of a group give the same. */
    const int64_t *sequence_lengths;
    int64_t n_sequences;
} moe_exec_args;

/* What one moe_plan_execute_ex call ran: the knobs' effect made observable. Names are
 * static strings. */
typedef struct moe_exec_stats {
    const char *isa;              /* kernel table: its registry row's name (moe_isa_describe) */
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
    int64_t received_rows;        /* EP: (token, k) rows this rank's experts ran, all sources
                                     (identity experts' rows are never sent) */
    int64_t max_tokens;           /* the most tokens any rank passed to this execute */
    int64_t tuned_tokens;         /* the token count of the tuning file entry this execute ran
                                     (moe_plan_tuning_file), 0: the context's knobs */
} moe_exec_stats;

/* Run one forward of the layer. Never allocates. Thread-safe for distinct workspaces and
 * outputs on the same plan and weights (a parallel plan: one execute at a time, and it is
 * collective over the plan's ranks; see moe_parallel.h "Parallelism"); a failing execute's
 * message goes to the calling thread's last error (moe_ctx_last_error), and the ctx's log_fn
 * may then be called from several threads at once.
 * NaN/Inf handling: router scores and selection keys that are NaN rank below every number,
 * and group-limited selection always keeps topk_group groups, so selection gives K distinct
 * ids in [0, E) for every input (docs/numerics.md section 3); the output then follows IEEE
 * arithmetic on the selected experts.
 * Errors: MOE_EINVAL (NULL pointer, n_tokens < 0, weights packed for another plan: another
 * layer description, quantization config or compute mode, named; or for another shard;
 * caller-given routing: an id out of [0, E) or repeated within a token, naming token and
 * slot), MOE_EDTYPE (hidden_dtype, output_dtype), MOE_EWORKSPACE; parallel plans also MOE_ETIMEOUT,
 * MOE_EMPI, and any of these reported by a peer (the message names the rank). */
MOE_API moe_status moe_plan_execute_ex(const moe_plan *plan, const moe_weights *weights,
                               const moe_exec_args *args);

/* Shorthand: f32 hidden_states [T,H] in, f32 output [T,H] out, router computed. */
MOE_API moe_status moe_plan_execute(const moe_plan *plan, const moe_weights *weights, const float *x,
                            int64_t n_tokens, float *out, void *workspace,
                            size_t workspace_size);

#include "moe_checkpoint.h"
#include "moe_bench.h"


#ifdef __cplusplus
}
#endif

#endif /* MOE_H */