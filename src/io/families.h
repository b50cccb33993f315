/* The family table (src/io/families.c): one row per moe_family that libmoe reads, holding
 * everything that differs between families as data: the architecture names, where
 * config.json keeps each field and what its config class defaults it to, the routing and
 * expert math, which layers are MoE, and the tensor names of every expert layout the family
 * may store. The readers of src/io walk a row; they never branch on the family. Adding a
 * family is a row (docs/adding-a-family.md). Not installed; not API. */
#ifndef MOE_IO_FAMILIES_H
#define MOE_IO_FAMILIES_H

#include "io/fields.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How config.json gives the routing weights' renormalization (moe_layer_desc.renormalize). */
typedef enum moe_fam_renorm {
    MOE_FAM_RENORM_NEVER = 0, /* the weights stay the scores */
    MOE_FAM_RENORM_ALWAYS,    /* the family's router always renormalizes */
    MOE_FAM_RENORM_FIELD,     /* a boolean field (norm_topk_prob); absent: the config class's default */
    MOE_FAM_RENORM_PNORM      /* a number field p (DBRX's moe_normalize_expert_weights): the weights
                                 are divided by their p-norm (moe_layer_desc.renormalize_p = p, > 0;
                                 1: the sum); null: not renormalized; absent: renormalize.p, the
                                 config class's default. 0, a negative p or another type is refused
                                 by name */
} moe_fam_renorm;

/* How the expert activation is chosen (moe_layer_desc.activation). */
typedef enum moe_fam_act {
    MOE_FAM_ACT_HIDDEN_ACT = 0, /* config `hidden_act` (absent: "silu") picks the gate function */
    MOE_FAM_ACT_CLAMPED_SWIGLU, /* always MOE_ACT_SWIGLU_OAI, alpha and limit from two fields
                                   (gpt-oss; hidden_act is not read) */
    MOE_FAM_ACT_SILU_ONLY,      /* the routed experts are always SiLU-gated and the shared
                                   expert follows hidden_act (Aria): SwiGLU, any other
                                   hidden_act refused by name */
    MOE_FAM_ACT_CLAMPED_SILU,   /* always MOE_ACT_SWIGLU_CLAMP, the limit from limit_field
                                   (GLM-5-Next); hidden_act must be silu (absent: silu), the
                                   function its shared expert applies where the routed experts
                                   call F.silu */
    MOE_FAM_ACT_SOFTCAPPED_SWIGLU, /* always MOE_ACT_SWIGLU_SOFTCAP, c_g from alpha_field
                                   (mlp_gate_softcap), c_u from limit_field (mlp_up_softcap),
                                   defaults alpha / limit; hidden_act is not read (Inkling2's
                                   experts hard-code the sigmoid) */
    MOE_FAM_ACT_CLAMPED_SILU_OWN_SHARED, /* routed MOE_ACT_SWIGLU_CLAMP (limit_field) and the
                                   shared expert its own activation from hidden_act
                                   (has_shared_activation: HY-V4's HYV4MLP applies
                                   ACT2FN[hidden_act] unclamped) */
    MOE_FAM_ACT_POSTCLAMP_LAYER_LISTS, /* Step-3.7: MOE_ACT_SWIGLU_POSTCLAMP with a limit per layer,
                                   limit_field the routed experts' list (swiglu_limits[L]),
                                   shared_limit_field the shared expert's (swiglu_limits_shared[L]);
                                   an absent list, a null or 0 entry, or a layer past the list's
                                   end: that expert is plain SwiGLU there (the modeling code's
                                   float("inf")); hidden_act must be silu / swish */
    MOE_FAM_ACT_NONGATED        /* non-gated experts, routed and shared (moe.h
                                   moe_activation_gated 0): the ACT2FN name of `field`
                                   (Nemotron-H's mlp_hidden_act; absent: its config class's
                                   "relu2") picks MOE_ACT_RELU ("relu"), MOE_ACT_RELU2
                                   ("relu2"), MOE_ACT_GELU ("gelu") or MOE_ACT_GELU_TANH
                                   ("gelu_new", "gelu_pytorch_tanh"); any other is refused */
} moe_fam_act;

/* Which decoder layers hold an MoE block, from the fields of moe_fam_row.layers. */
typedef enum moe_fam_layers {
    MOE_FAM_LAYERS_EVERY = 0,       /* every layer */
    MOE_FAM_LAYERS_SPARSE_STEP,     /* not listed in list_field and (layer + 1) % step_field == 0 */
    MOE_FAM_LAYERS_DENSE_PREFIX,    /* layer >= first_field and layer % step_field == 0 */
    MOE_FAM_LAYERS_LISTED_ELSE_STEP, /* listed in list_field when it is given, else
                                       (layer + 1) % step_field == 0 */
    MOE_FAM_LAYERS_TYPES_ELSE_PREFIX, /* list_field (mlp_layer_types) [L] == "sparse" when it is
                                        given (every entry "dense" or "sparse"), else layer >=
                                        first_field (first_default when the row has no
                                        first_field or config.json lacks it) and, when the row
                                        has a step_field, layer % step == 0 (A.X-K2's
                                        moe_layer_freq) */
    MOE_FAM_LAYERS_PERIOD_OFFSET,    /* layer % step_field == first_field (the offset, < the
                                        period), and more than one expert (Jamba:
                                        expert_layer_period / expert_layer_offset; one expert is
                                        its dense MLP) */
    MOE_FAM_LAYERS_INTERVAL_RANGE,   /* (layer + 1) % step_field == 0 and first_field <= layer
                                        <= last_field (-1 or absent: the last layer): ERNIE-4.5's
                                        moe_layer_interval / start_index / end_index */
    MOE_FAM_LAYERS_BLOCK_TYPES       /* list_field (Nemotron-H's layers_block_type, one string per
                                        layer) [L] == "moe"; the list's length is the layer count
                                        (num_hidden_layers is not read). Without it, the legacy
                                        pattern_field string (hybrid_override_pattern, one
                                        character per layer) [L] == 'E'; without either, the
                                        config class's default list (list_default: its MoE
                                        layers, of n_layers_default layers) */
} moe_fam_layers;

/* How config.json gives I_s, the shared expert's intermediate size (0: none). */
typedef enum moe_fam_shared_size {
    MOE_FAM_SHARED_NONE = 0, /* no shared expert */
    MOE_FAM_SHARED_FIELD,    /* I_s = the field (required unless the row's field_optional) */
    MOE_FAM_SHARED_COUNT,    /* I_s = the field (a count of shared experts) * I; absent: the config
                                class's count, null: none */
    MOE_FAM_SHARED_SAME_AS_I, /* I_s = I (one shared expert as wide as a routed one) */
    MOE_FAM_SHARED_FIELD_TIMES_COUNT /* I_s = the size field (absent: field_default) times
                                count_field (absent: count_default; null: no shared expert):
                                Dots3NoteTextMoE's shared_experts_intermediate_size *
                                n_shared_experts */
} moe_fam_shared_size;

/* One architecture class of config.json `architectures`[0] and the `model_type` it writes. */
typedef struct moe_fam_name {
    const char *arch;
    const char *model_type;
} moe_fam_name;

/* A stacked output-major expert layout under the block prefix P: P<gate_up> [E, 2I, H] (each
 * expert's gate rows, then its up rows; or interleaved) and P<down> [E, H, I]. */
typedef struct moe_fam_stacked {
    const char *gate_up;
    const char *down;
    bool interleaved;                      /* gate = the even rows of gate_up, up = the odd ones
                                              (Inkling2's saved w13_weight, which its conversion
                                              mapping de-interleaves with Interleave(dim=1)) */
    const char *up;                        /* set: gate_up names the gate stack alone, P<gate_up>
                                              [E, I, H], and this the up stack P<up> [E, I, H]
                                              (Step-3.7's saved moe.gate_proj / moe.up_proj
                                              .weight, which its conversion mapping concatenates) */
    bool flat;                             /* with up: the experts concatenated along the rows of
                                              2-D tensors (DBRX's DbrxExpertGLU w1 / v1 / w2): P<gate_up>
                                              and P<up> [E I, H], expert e's [I, H] output-major block
                                              at rows e I .. (e + 1) I, and P<down> [E I, H] whose block
                                              e is [I, H] INPUT-major (y = h @ w2_e: down_e is its
                                              transpose, read through strides, never copied). No
                                              quantized checkpoint is read in this layout (refused by
                                              name) */
} moe_fam_stacked;

typedef struct moe_fam_row moe_fam_row;

#define MOE_FAM_MAX_CHOICES 3 /* values of a string config field a row maps */

/* One value of a config string field that picks the scoring (Cohere2-MoE's
 * expert_selection_fn): the moe_scoring it is, and whether the row's renormalize field applies
 * with it (false: never renormalized, as Cohere2MoeTopKRouter's softmax branch). */
typedef struct moe_fam_scoring_choice {
    const char *value;
    moe_scoring scoring;
    bool renormalize_field;
} moe_fam_scoring_choice;

/* One value of a config string field that says how the shared expert joins the routed sum
 * (Cohere2-MoE's shared_expert_combination_strategy): out = routed_scale * routed_scaling_factor
 * * routed + shared_scale * shared (moe_layer_desc.routed_scaling_factor, .shared_expert_scale),
 * applied only when there is a shared expert. */
typedef struct moe_fam_combine_choice {
    const char *value;
    double routed_scale;
    double shared_scale;
} moe_fam_combine_choice;

/* A family's own routing fields beyond what the row says (DeepSeek: scoring_func and
 * topk_method, whose values are checked, and the expert groups they ask for): validate them
 * and set *n_group and *topk_group (they arrive holding the row's defaults). */
typedef moe_status (*moe_fam_routing_hook)(const moe_cfg_fields *f, const moe_fam_row *row, int64_t *n_group,
                                           int64_t *topk_group);

#define MOE_FAM_MAX_NAMES 2    /* architecture classes per family */
#define MOE_FAM_MAX_PREFIXES 4 /* block prefix candidates per family */
#define MOE_FAM_MAX_ROUTERS 2  /* router name candidates per family */
#define MOE_FAM_MAX_STACKED 2  /* stacked output-major layouts per family */
#define MOE_FAM_MAX_REFUSE 2   /* refused config values per family */
#define MOE_FAM_MAX_LIST_DEFAULT 4 /* entries of a layer list's class default */
#define MOE_FAM_MAX_PARTS 4    /* block_parts per family */

/* A config.json field whose non-zero value (true, or a number != 0) asks for maths the row
 * does not compute (Laguna's moe_router_logit_softcapping): such a config is refused by name,
 * the field, its value and `what` in the message. Absent, null, false or 0 is read as the row
 * says. */
typedef struct moe_fam_refuse {
    const char *field;
    const char *what;                      /* what the value turns on, for the message */
} moe_fam_refuse;
#define MOE_FAM_MAX_ALIASES 4  /* config field aliases per family */

#define MOE_FAM_MAX_SETS 2     /* expert sets of a modality-isolated block */

/* One set of routed experts of a block that holds several, each with its own router, selection
 * bias and experts, chosen per token by modality (ERNIE-4.5-VL's Ernie4_5_VLMoeMoeBlock: text_moe
 * for text tokens, vision_moe for image / video tokens, the shared experts for both). libmoe's
 * layer is one set: moe_checkpoint_options.expert_set names which (NULL: the row's first). The
 * set's fields replace the row's router, the selection bias's row, I and the expert numbering;
 * every other field is the row's. */
typedef struct moe_fam_expert_set {
    const char *name;                      /* "text", "vision": what expert_set names */
    const char *router;                    /* P<router>, instead of the row's router[] */
    bool router_transposed;                /* saved [H, E] (input-major; ERNIE-4.5-VL's released
                                              mlp.gate.weight, which transformers' conversion
                                              mapping transposes on load and back on save): read
                                              once into an [E, H] copy at load */
    int64_t selection_bias_row;            /* the selection bias is saved [n, E], one row per set
                                              (moe_statics.e_score_correction_bias [2, E]); this
                                              set's row */
    int64_t intermediate_index;            /* intermediate_field is a list, one I per set
                                              (moe_intermediate_size [text, vision]); I is this
                                              entry (absent field: the row's intermediate_list) */
    int64_t shared_intermediate_index;     /* MOE_FAM_SHARED_COUNT: I_s = count * this entry of the
                                              list (the shared experts are the text I's:
                                              moe_intermediate_size[0] * moe_num_shared_experts) */
    int64_t expert_offset;                 /* the set's expert e is saved as experts.<e +
                                              expert_offset * E> (per-expert layout; the vision
                                              experts follow the text ones: E..2E-1) */
} moe_fam_expert_set;

/* One family. A NULL name means "none": the field is not read, the tensor not looked up, the
 * layout not used. Fields are named as config.json names them; tensor names are relative to
 * the block prefix P. */
struct moe_fam_row {
    moe_family family;
    const char *name;                      /* moe_family_name(family) */
    moe_fam_name names[MOE_FAM_MAX_NAMES]; /* what selects the family: architectures[0] first,
                                              else model_type (in table order) */
    bool text_config;                      /* a multimodal wrapper: the decoder's fields are in
                                              config `text_config` when that is an object */
    const char *config_path;               /* a wrapper nested deeper: the dotted path of the
                                              object holding the decoder's fields, with a trailing
                                              dot ("thinker_config.text_config."), tried first;
                                              when it does not lead to an object, text_config
                                              applies (NULL: text_config only) */
    const char *moe_object;                /* the key of an object inside the decoder's object that
                                              holds the MoE block's fields (DBRX's "ffn_config"): I, E,
                                              K, the renormalize field, the activation and `refuse` are
                                              read there (messages spell them "ffn_config.<field>");
                                              hidden_size, the layer count, the layer rule and
                                              quantization_config from the decoder's object. Absent or
                                              null: the sub-config class's defaults (an empty object);
                                              not an object: MOE_EFORMAT. NULL: one object */

    /* ---- sizes ---- */
    const char *intermediate_field;        /* I: "moe_intermediate_size" or "intermediate_size" */
    const char *experts_field;             /* E ... */
    const char *experts_alias;             /* ... or this when experts_field is absent */
    int64_t experts_min;                   /* 0: a config may have no experts (no MoE layer) */
    const char *top_k_field;               /* K: NULL = "num_experts_per_tok"; else this field, or
                                              top_k_alias when it is absent (Hunyuan's moe_topk) */
    const char *top_k_alias;               /* the alias of top_k_field: NULL = "num_experts_per_tok"
                                              (Kimi-Linear: num_experts_per_token, then
                                              num_experts_per_tok) */
    int64_t intermediate_default;          /* the config class's I, E and K when the field is absent
                                              (DbrxFFNConfig: 3584, 4, 1; with a default E the alias
                                              is not read); 0: the field is required */
    int64_t experts_default, top_k_default;
    bool per_layer_lists;                  /* E and K may be per-layer lists (Hunyuan): read when
                                              every entry is equal, else refused by name */
    const char *aliases[MOE_FAM_MAX_ALIASES][2]; /* {field, alias}: a config field the row reads
                                              under `field` is read from `alias` when `field` is
                                              absent (the config class's attribute_map: Kimi-
                                              Linear's moe_renormalize / norm_topk_prob) */
    struct {
        moe_fam_shared_size rule;
        const char *field;                 /* FIELD, COUNT */
        int64_t count_default;             /* COUNT: the config class's default count */
        bool gated;                        /* out += sigmoid(w_sg . x) * shared(x) when I_s > 0 */
        const char *module;                /* P<module>.{gate,up,down}_proj.weight */
        const char *gate;                  /* P<gate>.weight [1, H] when gated */
        const char *prefix;                /* instead of P, this ("%L" = the layer): a shared MLP
                                              beside the block in the decoder layer (Granite's
                                              "model.layers.%L.", module "shared_mlp"); NULL: P */
        const char *fused_gate_up;         /* instead of {gate,up}_proj: <module>.<fused_gate_up>
                                              .weight [2 I_s, H], the gate's rows then the up's
                                              (Granite's input_linear), ... */
        const char *fused_down;            /* ... and <module>.<fused_down>.weight [H, I_s]
                                              (output_linear); both or neither; float only */
        bool field_optional;               /* FIELD: absent is not an error but ... */
        int64_t field_default;             /* ... the config class's I_s (0: none) */
        const char *gate_proj;             /* the gate projection's name instead of gate_proj
                                              (HY-V4 saves HYV4MLP.gate_proj as linear_gate: its
                                              conversion mapping's rename reversed); NULL: gate_proj */
        struct {                           /* how the shared output joins the routed sum, a config
                                              string (NULL field: added as is); absent or null:
                                              dflt; a value not listed is refused by name */
            const char *field;             /* Cohere2-MoE: "shared_expert_combination_strategy" */
            const char *dflt;
            moe_fam_combine_choice choices[MOE_FAM_MAX_CHOICES];
        } combine;
        const char *up_proj, *down_proj;   /* likewise (DeepSeek-V4 saves shared_experts.w3 / .w2);
                                              NULL: up_proj, down_proj */
        const char *count_field;           /* FIELD_TIMES_COUNT: the count ("n_shared_experts") */
    } shared;

    /* ---- routing and expert math (moe.h "Layer description") ---- */
    moe_scoring scoring;
    struct {
        moe_fam_renorm rule;
        const char *field;                 /* FIELD: "norm_topk_prob"; PNORM: the p field
                                              ("moe_normalize_expert_weights"); NEVER: a field the
                                              routing hook reads only to warn that it is ignored */
        bool dflt;                         /* FIELD: the config class's default */
        bool has_eps;                      /* the router divides by (sum + eps), not libmoe's
                                              sum + 1e-20 (moe_layer_desc.renormalize_eps): */
        double eps;                        /* LFM2-MoE 1e-6; Cohere2-MoE 0 (the sum alone) */
        double p;                          /* PNORM: the config class's p (DbrxFFNConfig: 1.0) */
    } renormalize;
    struct {                               /* the scoring is a config string (NULL field: the
                                              row's `scoring`); absent or null: dflt; a value not
                                              listed is refused by name */
        const char *field;                 /* Cohere2-MoE: "expert_selection_fn" */
        const char *dflt;
        moe_fam_scoring_choice choices[MOE_FAM_MAX_CHOICES];
    } scoring_by;
    struct {
        const char *field;                 /* "routed_scaling_factor"; NULL: the factor is 1 */
        double dflt;                       /* the config class's default */
    } routed_scaling;
    struct {
        const char *n_group_field;         /* the routing hook reads these, */
        const char *topk_group_field;
        int64_t n_group, topk_group;       /* with these defaults (0: no group-limited selection) */
        moe_group_score score;
    } groups;
    struct {
        const char *field;                 /* MOE_SCORING_SPARSEMIXER: "router_jitter_noise" */
        double dflt;                       /* the config class's default */
    } sparsemixer_eps;                     /* moe_layer_desc.sparsemixer_jitter_eps */
    const char *router[MOE_FAM_MAX_ROUTERS]; /* P<router> [E, H]: candidates, in order */
    const char *router_bias;               /* P<router_bias> [E]: has_router_bias */
    const char *selection_bias;            /* P<selection_bias> [E]: has_selection_bias. A bias
                                              name holding "%L" is the full name of layer L's
                                              tensor, not relative to P (Kolibri1 saves it
                                              beside the block: model.layers.%L.moe.router.
                                              expert_bias); moe_fam_tensor_name spells both */
    struct {                               /* a boolean config field that turns the selection
                                              bias on (NULL: it is on whenever the row names one):
                                              false reads no bias tensor */
        const char *field;                 /* LFM2-MoE: "use_expert_bias" */
        bool dflt;                         /* the config class's default */
    } selection_bias_on;
    const char *output_bias;               /* P<output_bias> [H], added to the block output:
                                              has_output_bias (JetMoE "bias") */
    const char *output_norm;               /* the block's output RMSNorm weight [H]: has_output_norm
                                              (A.X-K1); a name holding "%L" is the full name of
                                              layer L's tensor, as for the biases */
    struct {
        const char *field;                 /* its eps: "rms_norm_eps" */
        double dflt;                       /* the config class's default */
    } output_norm_eps;
    bool weight_on_input;                  /* apply_router_weight_on_input */
    struct {
        moe_fam_act rule;
        const char *alpha_field, *limit_field; /* CLAMPED_SWIGLU: swiglu_alpha, swiglu_limit;
                                                  CLAMPED_SILU: swiglu_limit */
        double alpha, limit;               /* their defaults */
        const char *field;                 /* HIDDEN_ACT: the ACT2FN name's field; NULL: "hidden_act"
                                              (JetMoE: "activation_function") */
        const char *key;                   /* HIDDEN_ACT: `field` is an object and the ACT2FN name
                                              is its `key` (DBRX's ffn_act_fn {"name": "silu"}; its
                                              other keys are not read, as DbrxExpertGLU's
                                              ACT2FN[name]); the object absent or null, or the key
                                              absent: "silu" */
        const char *shared_limit_field;    /* POSTCLAMP_LAYER_LISTS: the shared expert's list */
    } activation;
    moe_fam_routing_hook routing_hook;     /* or NULL */
    moe_fam_refuse refuse[MOE_FAM_MAX_REFUSE]; /* config values refused by name (field NULL: none) */
    const char *renorm_min_field;          /* the router divides by max(sum, this field) (ERNIE's
                                              moe_norm_min, default renorm_min): equal to libmoe's
                                              sum + 1e-20 when it is <= 1/E (a top-k sum is >= 1/E);
                                              a larger value is refused by name */
    double renorm_min;
    struct {                               /* a boolean config field (absent: false) that, true,
                                              asks for math libmoe does not compute: refused,
                                              naming `what` (Hunyuan-V3's mlp_bias) */
        const char *field;
        const char *what;
    } refuse_true;

    struct {                               /* identity ("zero") experts (moe_layer_desc
                                              num_identity_experts, LongCat-Flash): Z = `field`
                                              (absent: dflt, the config class's; null: 0); the
                                              router and its biases are [E + Z] */
        const char *field;                 /* "zero_expert_num"; NULL: none */
        int64_t dflt;
        const char *type_field;            /* a string field that must be type_value when present
                                              ("zero_expert_type" = "identity"): any other value is
                                              refused by name */
        const char *type_value;
    } identity;
    const char *num_layers_field;          /* the decoder's layer count: NULL = "num_hidden_layers"
                                              (LongCat-Flash saves "num_layers": its
                                              num_hidden_layers is a property, 2 * num_layers
                                              attention sublayers) */
    struct {                               /* MoE layers libmoe cannot route, by a per-layer string
                                              list (DeepSeek-V4's mlp_layer_types "hash_moe": the
                                              experts chosen by token id). Such a layer is an MoE
                                              layer (moe_checkpoint_is_moe_layer) whose description
                                              and weights are refused, naming the layer, the value
                                              and `what`. Every entry must be `value` or `other`. */
        const char *field;                 /* "mlp_layer_types" */
        const char *value, *other;         /* "hash_moe", "moe" */
        const char *count_field;           /* absent list: layers < this field are `value` ... */
        int64_t count_default;             /* ... (default: DeepseekV4Config's 3) */
        const char *what;                  /* for the message */
    } refuse_layers;

    /* ---- which layers are MoE ---- */
    struct {
        moe_fam_layers rule;
        const char *first_field;           /* DENSE_PREFIX: the first MoE layer */
        int64_t first_default;
        const char *step_field;            /* every step-th layer (DENSE_PREFIX without one:
                                              every layer from the first) */
        int64_t step_default;
        const char *list_field;            /* SPARSE_STEP: the dense layers; LISTED_ELSE_STEP: the
                                              MoE layers; TYPES_ELSE_PREFIX: "dense" / "sparse"
                                              per layer */
        int64_t list_default[MOE_FAM_MAX_LIST_DEFAULT]; /* SPARSE_STEP, LISTED_ELSE_STEP: the
                                              config class's list when list_field is absent or
                                              null (FlintConfig's mlp_only_layers [0, 1]) ... */
        int n_list_default;                /* ... of this many entries (0: an empty list) */
        const char *last_field;            /* INTERVAL_RANGE: the last MoE layer (-1: the last) */
        bool list_required;                /* TYPES_ELSE_PREFIX: list_field must be given (the
                                              decoder layer indexes it and the config class has no
                                              default: DeepseekOcr2TextDecoderLayer); absent or null
                                              is refused by name, not read as the prefix rule */
        const char *pattern_field;         /* BLOCK_TYPES: the legacy one-character-per-layer string */
        int64_t n_layers_default;          /* BLOCK_TYPES: the layers of the class's default list */
        bool step_list;                    /* TYPES_ELSE_PREFIX: step_field may also be a list, one
                                              entry per layer, a layer at or past first_field being
                                              MoE where its entry is true / non-zero (Dots3Note's
                                              legacy moe_layer_freq: bool(moe_layer_freq[i])); the
                                              list must cover every layer */
    } layers;

    /* ---- a modality-isolated block: several expert sets, one read (moe_fam_expert_set) ---- */
    moe_fam_expert_set sets[MOE_FAM_MAX_SETS]; /* name NULL: none (the row's router and I) */
    int64_t intermediate_list[MOE_FAM_MAX_SETS]; /* the config class's intermediate_field list
                                              when absent or null (Ernie4_5_VLMoeTextConfig:
                                              [1536, 512]) */
    const char *float_only;                /* set: quantized checkpoints (any quantization_config)
                                              are refused with this reason */

    /* ---- tensors of layer L ---- */
    const char *prefixes[MOE_FAM_MAX_PREFIXES]; /* P candidates, "%L" = the layer; the first
                                                   that holds a router is the block */
    const char *block_parts[MOE_FAM_MAX_PARTS]; /* when P is the whole decoder layer (Mistral-
                                                   Large-4's layers.L., its attention beside the
                                                   block): the block's own names under P ("gate.",
                                                   "experts.", "shared_experts."), the only ones
                                                   the unread-tensor check looks at; NULL: all of P */
    struct {
        const char *proj[3];               /* P experts.<e>.<proj[j]>.weight (j = gate, up, down:
                                              [I, H], [I, H], [H, I]); also fp8 and
                                              compressed-tensors. proj[0] NULL with proj[1] set:
                                              non-gated experts (no gate tensor; the row's
                                              activation rule is MOE_FAM_ACT_NONGATED); proj[1]
                                              NULL: no per-expert layout */
        bool quantized_only;               /* read only in fp8 / compressed-tensors checkpoints
                                              that lack input_major.gate_up */
    } per_expert;
    moe_fam_stacked stacked[MOE_FAM_MAX_STACKED]; /* output-major: the first whose gate_up is
                                                     present is read; without per_expert, the
                                                     last is read (its absence reported) */
    struct {
        const char *gate_up;               /* [E, H, 2I] */
        const char *down;                  /* [E, I, H] */
        bool interleaved;                  /* gate = the even columns of gate_up, up = the odd
                                              ones; else gate = the first I columns */
        const char *gate_up_bias;          /* [E, 2I], split like gate_up's columns:
                                              has_expert_bias */
        const char *down_bias;             /* [E, H] */
    } input_major;
    struct {                               /* input_major's weights as MXFP4 blocks (its biases
                                              stay as they are): docs/checkpoints.md "MXFP4" */
        const char *gate_up_blocks;        /* U8 [E, 2I, H/32, 16] */
        const char *gate_up_scales;        /* U8 [E, 2I, H/32] */
        const char *down_blocks;           /* U8 [E, H, I/32, 16] */
        const char *down_scales;           /* U8 [E, H, I/32] */
    } mxfp4;
};

/* The row's expert set named `name` (NULL: its first), or NULL when it has none of that name
 * (a row without sets has none). */
const moe_fam_expert_set *moe_fam_expert_set_of(const moe_fam_row *row, const char *name);
/* How many expert sets `row` has (0: one block, the row's own router and I). */
int64_t moe_fam_num_expert_sets(const moe_fam_row *row);
/* "text, vision": the names of the row's expert sets into out [n] ("" when it has none). */
const char *moe_fam_expert_set_names(const moe_fam_row *row, char *out, size_t n);

/* The row of `family`, or NULL (MOE_FAMILY_CUSTOM, an unknown value). */
const moe_fam_row *moe_fam_row_of(moe_family family);
/* The row with architecture class `arch`, or NULL. */
const moe_fam_row *moe_fam_by_arch(const char *arch);
/* The row with config model_type `model_type`, or NULL. */
const moe_fam_row *moe_fam_by_model_type(const char *model_type);
/* The row named `name`: its moe_family_name, or one of its architecture classes or
 * model_types; NULL when none is. */
const moe_fam_row *moe_fam_by_name(const char *name);
/* The row name closest to `word` (moe_suggest: a misspelt --family), or NULL. */
const char *moe_fam_suggest(const char *word);
/* "mixtral, qwen2_moe, ..." (every row's name, in table order) into out [n]; returns out. */
const char *moe_fam_row_names(char *out, size_t n);

/* Which rows store a layout, for messages that name the families a rule applies to. */
typedef enum moe_fam_layout {
    MOE_FAM_HAS_MXFP4,      /* mxfp4.gate_up_blocks: MXFP4 checkpoints are read (and written) */
    MOE_FAM_HAS_INPUT_MAJOR, /* input_major.gate_up: stacked input-major experts */
    MOE_FAM_QUANTIZE_INPUT_MAJOR /* input_major.gate_up named experts.gate_up_proj (with
                                    experts.down_proj), without expert biases or with an MXFP4
                                    layout: the input-major tensors moe quantize rewrites
                                    (gpt-oss, Llama-4; not Aria's experts.fc1.weight, not the
                                    privacy filter's biased halves) */
} moe_fam_layout;

/* The names (moe_family_name) of the rows that store `layout`, in table order, joined by sep,
 * each followed by " (Arch)" of its first architecture class when archs, into out [n]
 * (truncated to fit); "no family" when no row does. Returns out. */
const char *moe_fam_names_with(moe_fam_layout layout, const char *sep, bool archs, char *out, size_t n);

/* true when the row's input-major layout is named experts.gate_up_proj / experts.down_proj, the
 * stacked tensors moe quantize recognizes, and has no expert biases unless the row also has an
 * MXFP4 layout, which carries them (MOE_FAM_QUANTIZE_INPUT_MAJOR). */
bool moe_fam_quantize_input_major(const moe_fam_row *row);
/* true when the row's experts are read from a flat layout (moe_fam_stacked.flat: DBRX), which no
 * quantized checkpoint format has. */
bool moe_fam_flat_experts(const moe_fam_row *row);
/* Block prefix candidate i (< MOE_FAM_MAX_PREFIXES) of layer `layer` into out [n]: false when
 * the row has no candidate i (or it does not fit). */
bool moe_fam_prefix(const moe_fam_row *row, int i, int64_t layer, char *out, size_t n);
/* A name pattern ("%L" = the layer, at most once) of layer `layer` into out [n]: false when it
 * does not fit. */
bool moe_fam_pattern(const char *pat, int64_t layer, char *out, size_t n);

/* The name of layer `layer`'s tensor `name` of the row (a router_bias / selection_bias): a name
 * holding "%L" is expanded as a prefix pattern is, any other follows the block prefix
 * `prefix`. Into out [n]; false when it does not fit. */
bool moe_fam_tensor_name(const char *name, const char *prefix, int64_t layer, char *out, size_t n);

/* The row's scoring_by / shared.combine choice named `value`, or NULL when it lists none. */
const moe_fam_scoring_choice *moe_fam_scoring_choice_of(const moe_fam_row *row, const char *value);
const moe_fam_combine_choice *moe_fam_combine_choice_of(const moe_fam_row *row, const char *value);

/* Set the routing and expert-math fields of d from the row, as its config class defaults
 * them (moe_family_layer_defaults, moe_checkpoint.h, says which). Sizes stay; d->family is
 * set. */
void moe_fam_layer_defaults(const moe_fam_row *row, moe_layer_desc *d);

#endif
