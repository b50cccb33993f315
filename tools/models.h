/* Model presets of `moe bench`: real MoE layer shapes (../shared/MODELS.md). */
#ifndef MOE_TOOLS_MODELS_H
#define MOE_TOOLS_MODELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "moe.h"

/* One preset, resolved: the shape and names from tools/models.c's table, the routing and
 * expert math from its family (moe_family_layer_defaults). */
typedef struct cli_model {
    const char *name;    /* --model value */
    const char *display; /* the model's own name */
    const char *arch;    /* the real model_type */
    moe_family family;   /* the library family the layer is benched as */
    int64_t hidden_size, intermediate_size, num_experts, top_k;
    int64_t shared_intermediate_size; /* 0: none */
    int shared_gated;               /* the family's rule */
    int renormalize;                /* the family's default, or the released config's
                                       norm_topk_prob where that differs */
    float routed_scaling_factor;    /* the family's default */
    /* NULL when the library computes exactly this family's layer; else what differs. */
    const char *differs;
    /* The routing and expert math (moe.h "Layer description"), the family's; see
     * cli_model_routing. */
    moe_scoring scoring;
    int64_t n_group, topk_group;   /* 0: no group-limited selection */
    moe_group_score group_score;
    moe_activation activation;
    int weight_on_input;           /* apply_router_weight_on_input (Llama-4) */
} cli_model;

/* The presets [cli_num_models], resolved on the first call. Static storage. */
const cli_model *cli_model_table(void);
extern const size_t cli_num_models;

/* The preset named `name`, or NULL. */
const cli_model *cli_model_find(const char *name);

/* The presets as a table (name, model, H, I, E, K, shared, BF16 layer bytes, routing) on f:
 * `moe bench --list-models` and `moe plan --list-models`. */
void cli_model_list(FILE *f);

/* Report an unknown --model NAME for command `cmd` on stderr: the closest preset name
 * (moe_suggest) and every preset's name. Returns CLI_USAGE. */
int cli_model_unknown(const char *cmd, const char *name);

/* Set d's scoring_func, n_group, topk_group, group_score, activation and
 * apply_router_weight_on_input from preset m, for d->num_experts experts (possibly
 * overridden). Returns NULL, or a note when the preset's groups do not fit that E and the
 * layer is benched without them. */
const char *cli_model_routing(const cli_model *m, moe_layer_desc *d);

/* "softmax", "sigmoid", "topk_softmax", "topk_sigmoid" (d->scoring_func), followed, for
 * group-limited selection, by "+groups" and, with the weight on the expert input, by
 * "+weight_on_input". Static storage. */
const char *cli_scoring_name(const moe_layer_desc *d);

#endif
