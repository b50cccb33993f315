/* Model presets of `moe bench`: real MoE layer shapes (../shared/MODELS.md). */
#ifndef MOE_TOOLS_MODELS_H
#define MOE_TOOLS_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "moe.h"

typedef struct cli_model {
    const char *name;    /* --model value */
    const char *display; /* the model's own name */
    const char *arch;    /* the real model_type */
    moe_family family;   /* the library family the layer is benched as */
    int64_t hidden_size, intermediate_size, num_experts, top_k;
    int64_t shared_intermediate_size; /* 0: none */
    int shared_gated;
    int renormalize;
    float routed_scaling_factor;
    /* NULL when the library computes exactly this family's layer; else what differs. */
    const char *differs;
} cli_model;

extern const cli_model cli_models[];
extern const size_t cli_num_models;

/* The preset named `name`, or NULL. */
const cli_model *cli_model_find(const char *name);

#endif
