/*
 * libmoe: the fused Mixture-of-Experts layer of transformer LLM inference, in C11.
 *
 * This header is the whole public API and its specification. What is not here is not API.
 *
 * Pipeline (shapes use T tokens, H hidden_size, I moe_intermediate_size, E num_experts,
 * K top_k):
 *
 *   hidden_states[T,H] -> router_logits[T,E] -> topk_ids[T,K], topk_weights[T,K]
 *     -> rows grouped by expert -> w13 GEMM [2I,H], SwiGLU -> w2 GEMM [H,I]
 *     -> output[T,H] = routed_scaling_factor * sum_k topk_weights[t,k] * y[t,k]
 *                      (+ shared expert, optionally sigmoid-gated)
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
    MOE_EWORKSPACE = 11   /* workspace missing or smaller than moe_plan_workspace_size() */
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

/* Context options. Initialise with moe_options_init(), then set fields. A field left at
 * its "unset" value takes its default from the environment variable named beside it, else
 * the built-in default. Explicit values win over the environment. */
typedef struct moe_options {
    int num_threads;        /* >= 1; 0 = unset: MOE_NUM_THREADS, else OMP_NUM_THREADS, else cores */
    int log_level;          /* moe_log_level; -1 = unset: MOE_LOG_LEVEL (error|warn|info|debug), else warn */
    moe_log_fn log_fn;      /* NULL = stderr, prefixed "libmoe: LEVEL: " */
    void *log_user;         /* passed to log_fn */
    const char *isa;        /* NULL = unset: MOE_ISA (auto|ref|avx2|avx512), else auto */
    int64_t chunk_size;     /* tokens per chunk of the experts stage; 0 = unset: MOE_CHUNK_SIZE, else 8192 */
} moe_options;

/* Fill `opts` with "unset" values. */
void moe_options_init(moe_options *opts);

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
/* Name of the kernel table in use: "ref", "avx2" or "avx512". */
const char *moe_ctx_isa(const moe_ctx *ctx);

/* ---------------------------------------------------------------------------------------
 * Layer description.
 * ------------------------------------------------------------------------------------- */

/* Router scoring function (the config field `scoring_func`; softmax for Mixtral, Qwen). */
typedef enum moe_scoring {
    MOE_SCORING_SOFTMAX = 0, /* softmax over the E router logits, in f32 */
    MOE_SCORING_SIGMOID = 1  /* elementwise sigmoid (DeepSeek-V3); not yet supported */
} moe_scoring;

/* Expert MLP activation. */
typedef enum moe_activation {
    MOE_ACT_SWIGLU = 0 /* y = W2 (silu(Wg x) * (Wu x)), silu(v) = v / (1 + exp(-v)) */
} moe_activation;

/* Model family the description came from. Informational; the fields below decide the math. */
typedef enum moe_family {
    MOE_FAMILY_CUSTOM = 0,
    MOE_FAMILY_MIXTRAL = 1,   /* MixtralForCausalLM */
    MOE_FAMILY_QWEN2_MOE = 2, /* Qwen2MoeForCausalLM */
    MOE_FAMILY_QWEN3_MOE = 3  /* Qwen3MoeForCausalLM */
} moe_family;

/* Static name of a family: "custom", "mixtral", "qwen2_moe", "qwen3_moe". */
const char *moe_family_name(moe_family f);

/* One MoE layer. Initialise with moe_layer_desc_init(), then set the fields. */
typedef struct moe_layer_desc {
    moe_family family;
    int64_t hidden_size;           /* H, config `hidden_size` */
    int64_t moe_intermediate_size; /* I per expert, config `moe_intermediate_size`
                                      (Mixtral: `intermediate_size`) */
    int64_t num_experts;           /* E, config `num_experts` / `num_local_experts` */
    int64_t top_k;                 /* K, config `num_experts_per_tok`; 1 <= K <= E */
    moe_scoring scoring_func;      /* default softmax */
    int renormalize;               /* divide the K weights by (sum + 1e-20): Mixtral always,
                                      Qwen2/3-MoE config `norm_topk_prob` */
    float routed_scaling_factor;   /* multiplies the routed sum once in finalize; default 1 */
    moe_activation activation;     /* default SwiGLU */
    int64_t shared_expert_intermediate_size; /* 0 = no shared expert; Qwen2-MoE
                                      `shared_expert_intermediate_size` */
    int shared_expert_gated;       /* 1: shared output times sigmoid(w_sg . x) (Qwen2-MoE) */
    moe_dtype weight_dtype;        /* expert and shared-expert weights: F32, BF16 or F16 */
} moe_layer_desc;

/* Defaults: family custom, softmax, renormalize 0, routed_scaling_factor 1, SwiGLU, no
 * shared expert, weight_dtype BF16; sizes 0 (must be set). */
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

/* The description the plan was compiled from. */
const moe_layer_desc *moe_plan_desc(const moe_plan *plan);

/* Bytes of workspace moe_plan_execute() needs for up to `max_tokens` tokens. The experts
 * stage runs in chunks of at most chunk_size tokens, so this is bounded whatever
 * max_tokens is. 0 for max_tokens <= 0. */
size_t moe_plan_workspace_size(const moe_plan *plan, int64_t max_tokens);

/* ---------------------------------------------------------------------------------------
 * Weights: packed once into the kernel layout. Weights stay in their dtype (F32, BF16,
 * F16) and are converted to f32 in the inner loop.
 * ------------------------------------------------------------------------------------- */

/* Where the weights of one layer are, as the caller has them. All matrices are row-major
 * [out_features, in_features] (the nn.Linear layout), in desc->weight_dtype unless stated.
 * Experts are given as arrays of E pointers, so per-expert tensors (Mixtral, Qwen) and
 * stacked ones ([E, 2I, H]: pointer e = base + e * 2I * H elements) are both described
 * without copying. */
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
} moe_weight_source;

typedef struct moe_weights moe_weights;

/* Pack the weights described by `src` for `plan` (borrowed: it must outlive the weights).
 * Copies everything; `src` may be freed afterwards. The pointers in `src` need no alignment
 * (tensors mmapped from a safetensors file may sit at odd addresses). Packed layout: per
 * expert gate [I, H] and up [I, H] (w13), and down [H, I] (w2), each in panels of 16 output
 * features, K-contiguous, at their true size (no padding); the router as f32.
 * Errors (recorded on the plan's ctx): MOE_EINVAL naming the NULL pointer, MOE_EDTYPE,
 * MOE_ENOMEM. */
moe_status moe_weights_create(const moe_plan *plan, const moe_weight_source *src,
                              moe_weights **out);
void moe_weights_free(moe_weights *w);
/* Bytes of packed expert weights (w13 + w2 + shared), not counting the router. */
size_t moe_weights_expert_bytes(const moe_weights *w);

/* ---------------------------------------------------------------------------------------
 * Execute.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_exec_args {
    const void *hidden_states;  /* [T, H], dtype hidden_dtype */
    moe_dtype hidden_dtype;     /* F32 or BF16 */
    int64_t n_tokens;           /* T >= 0; T = 0 returns at once, nothing written */
    const float *router_logits; /* [T, E] f32, or NULL: computed from the router weight */
    float *output;              /* [T, H] f32, written */
    int32_t *topk_ids;          /* [T, K] or NULL; written in top-k order */
    float *topk_weights;        /* [T, K] or NULL; the routing weights after
                                   renormalization, before routed_scaling_factor */
    void *workspace;            /* moe_plan_workspace_size(plan, n_tokens) bytes, 64-byte
                                   aligned is best; may be NULL when that size is 0 */
    size_t workspace_size;      /* bytes available at workspace */
} moe_exec_args;

/* Run one forward of the layer. Never allocates. Thread-safe for distinct workspaces and
 * outputs on the same plan and weights.
 * NaN/Inf handling: router scores that are NaN rank below every number (selection still
 * gives K distinct ids); the output then follows IEEE arithmetic on the selected experts.
 * Errors: MOE_EINVAL (NULL pointer, n_tokens < 0, weights packed for another plan),
 * MOE_EDTYPE (hidden_dtype), MOE_EWORKSPACE. */
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
 * listed in model.safetensors.index.json. Families: Mixtral, Qwen2-MoE, Qwen3-MoE.
 * ------------------------------------------------------------------------------------- */
typedef struct moe_checkpoint moe_checkpoint;

/* Open `dir`: parse config.json, detect the family from `architectures` (or `model_type`),
 * open and validate every safetensors file. Errors: MOE_ENOTFOUND (config.json, a shard, a
 * config field), MOE_EFORMAT (bad JSON or safetensors), MOE_EUNSUPPORTED (unknown
 * architecture, named), MOE_EIO, MOE_ENOMEM. */
moe_status moe_checkpoint_open(moe_ctx *ctx, const char *dir, moe_checkpoint **out);
void moe_checkpoint_free(moe_checkpoint *ck);

moe_family moe_checkpoint_family(const moe_checkpoint *ck);
/* config `num_hidden_layers`. */
int64_t moe_checkpoint_num_layers(const moe_checkpoint *ck);
/* 1 if layer `layer` is an MoE layer (Qwen2/3: not in mlp_only_layers and
 * (layer + 1) % decoder_sparse_step == 0; Mixtral: every layer), else 0. */
int moe_checkpoint_is_moe_layer(const moe_checkpoint *ck, int64_t layer);

/* The layer description of MoE layer `layer`, from config.json and the tensors' dtype.
 * Errors: MOE_ERANGE (layer outside [0, num_hidden_layers)), MOE_EDENSE (a dense layer),
 * MOE_ENOTFOUND (a tensor), MOE_EDTYPE / MOE_ESHAPE (a tensor disagreeing with config.json
 * or with the other experts; the message names tensor, expected and found). */
moe_status moe_checkpoint_layer_desc(moe_checkpoint *ck, int64_t layer, moe_layer_desc *out);

/* Pack layer `layer`'s weights for `plan` (which must have been created from the
 * description moe_checkpoint_layer_desc() gave). Same errors as moe_checkpoint_layer_desc
 * plus those of moe_weights_create. The checkpoint may be freed afterwards. */
moe_status moe_checkpoint_load_weights(moe_checkpoint *ck, int64_t layer, const moe_plan *plan,
                                       moe_weights **out);

#ifdef __cplusplus
}
#endif

#endif /* MOE_H */
