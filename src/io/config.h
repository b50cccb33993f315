/* config.json of a Hugging Face checkpoint, parsed through the family table
 * (src/io/config.c). Not installed; not API. */
#ifndef MOE_IO_CONFIG_H
#define MOE_IO_CONFIG_H

#include "io/ckpt_ct.h"
#include "io/families.h"

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

/* What config.json says of the model's MoE layers. */
typedef struct moe_ck_config {
    moe_ctx *ctx;               /* borrowed */
    const char *path;           /* the config.json read (borrowed), for messages */
    const char *prefix;         /* "", "text_config." or the row's config_path (static): where the
                                   decoder fields were read */
    const moe_fam_row *row;     /* the family */
    const moe_fam_expert_set *set; /* the expert set read (a row with sets: the one asked for, else
                                   its first), or NULL */
    char moe_prefix[160];       /* row->moe_object: prefix + "ffn_config.", how messages spell the
                                   MoE fields read there ("" when the row has none) */
    json_t *moe_empty;          /* row->moe_object absent or null: an empty object standing for it
                                   (owned; every field takes its default), else NULL */
    int64_t num_layers;         /* num_hidden_layers */
    /* Every MoE layer's description as config.json gives it: family, H, I, E, K, I_s and
     * gating, routing, activation (the raw n_group and topk_group: 0 or 1 mean no groups).
     * weight_dtype and quant are the tensors' to say (moe_checkpoint_layer_desc). */
    moe_layer_desc desc;

    /* quantization_config */
    int fp8;                    /* quant_method fp8 (block scales, or per-tensor) */
    int64_t fp8_bn, fp8_bk;     /* its weight_block_size [out, in]; 0, 0: per-tensor (weight_block_size
                                   absent or null: one scalar weight_scale_inv or weight_scale per matrix) */
    int mxfp4;                  /* quant_method mxfp4 (gpt-oss) */
    moe_ckq *ct;                /* quant_method compressed-tensors (src/io/ckpt_ct.c), or NULL */

    /* which layers are MoE: row->layers.rule over these */
    int64_t layer_first;        /* row->layers.first_field */
    int64_t layer_step;         /* row->layers.step_field */
    int64_t layer_last;         /* row->layers.last_field (-1 resolved to the last layer) */
    int64_t *layer_list;        /* [n_layer_list] row->layers.list_field */
    size_t n_layer_list;
    bool have_layer_list;       /* the list was given (not absent or null) */
    bool layer_list_from_step;  /* TYPES_ELSE_PREFIX: layer_list was made from the per-layer
                                   step list (row->layers.step_list), mlp_layer_types absent */

    /* per-layer limits (row->activation.rule MOE_FAM_ACT_POSTCLAMP_LAYER_LISTS; 0: no clamp) */
    float *limits, *limits_shared; /* [n_limits], [n_limits_shared] */
    size_t n_limits, n_limits_shared;
    /* MoE layers refused (row->refuse_layers): sorted layer indices */
    int64_t *refused_layers;    /* [n_refused_layers] */
    size_t n_refused_layers;
} moe_ck_config;

/* Parse config.json's object `root` (read from `path`, borrowed for c's life) into *c: the
 * family from `architectures` (or `model_type`), or the row named `family` when not NULL
 * (moe_checkpoint_options.family: a WARNING names both and the defaults assumed when config.json
 * names another family or none libmoe knows), the decoder fields where the row says
 * (text_config for multimodal wrappers), the routing and the quantization_config. `expert_set`
 * (moe_checkpoint_options.expert_set, or NULL: the row's first) picks the expert set of a row
 * with several (c->set; MOE_EINVAL naming the row's sets, or saying it has none). Errors
 * (the message names the file and the field): MOE_ENOTFOUND, MOE_EFORMAT, MOE_EUNSUPPORTED
 * (as moe_checkpoint_open says), MOE_EINVAL (no row named `family`), MOE_ENOMEM. Free with
 * moe_ck_config_free, also on error. */
moe_status moe_ck_config_parse(moe_ctx *ctx, const char *path, const json_t *root, const char *family,
                               const char *expert_set, moe_ck_config *c);
void moe_ck_config_free(moe_ck_config *c);

/* 1 if `layer` in [0, num_layers) holds an MoE block (moe_checkpoint_is_moe_layer), else 0. */
int moe_ck_config_is_moe_layer(const moe_ck_config *c, int64_t layer);
/* 1 if MoE layer `layer` is one of row->refuse_layers' (DeepSeek-V4's hash layers), else 0. */
int moe_ck_config_layer_refused(const moe_ck_config *c, int64_t layer);
/* The per-layer parts of layer `layer`'s description (Step-3.7's limits) into d, which holds
 * c->desc's routing and sizes. */
void moe_ck_config_layer_desc(const moe_ck_config *c, int64_t layer, moe_layer_desc *d);
/* Why `layer` (a dense one) is dense, in config.json's terms, into why [n]. */
void moe_ck_config_dense_reason(const moe_ck_config *c, int64_t layer, char *why, size_t n);

#endif
