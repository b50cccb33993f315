/* The layer description: its defaults and its validation (what moe_plan_create accepts),
 * shared by plan creation and the plan report; and the check of parallel.placement. */
#include "layer/layer.h"
#include "parallel/parallel.h"
#include "quant/format.h"
#include "route/route.h"

#include <math.h>
#include <string.h>

/* Largest sizes accepted: keep every product below 2^62 elements. */
#define MOE_MAX_DIM ((int64_t)1 << 24)

void moe_layer_desc_init(moe_layer_desc *d)
{
    memset(d, 0, sizeof *d);
    d->family = MOE_FAMILY_CUSTOM;
    d->scoring_func = MOE_SCORING_SOFTMAX;
    d->renormalize = 0;
    d->routed_scaling_factor = 1.0f;
    d->activation = MOE_ACT_SWIGLU;
    d->shared_expert_intermediate_size = 0;
    d->shared_expert_gated = 0;
    d->weight_dtype = MOE_DTYPE_BF16;
    d->group_score = MOE_GROUP_SCORE_MAX;
    d->swiglu_alpha = 1.702f;
    d->swiglu_limit = 7.0f;
    d->sparsemixer_jitter_eps = 0.01f;
    d->softcap_gate = 4.0f; /* Inkling2TextConfig's mlp_gate_softcap / mlp_up_softcap */
    d->softcap_up = 25.0f;
    d->has_shared_activation = 0;
    d->shared_activation = MOE_ACT_SWIGLU;
    d->has_output_norm = 0;
    d->output_norm_eps = 1e-6f; /* AXK1Config's rms_norm_eps */
    d->renormalize_eps = 1e-20f; /* numerics contract 4 */
    d->shared_expert_scale = 1.0f;
    d->num_identity_experts = 0;
    d->shared_swiglu_limit = 0.0f; /* the shared expert's limit is swiglu_limit */
    d->renormalize_p = 1.0f;       /* the plain sum (DbrxFFNConfig's moe_normalize_expert_weights) */
}

/* `act` (the field `field` of d: "activation" or "shared_activation") a moe_activation value,
 * with the constants it reads valid */
static moe_status check_activation(moe_ctx *ctx, const moe_layer_desc *d, moe_activation act, const char *field)
{
    if (!moe_activation_gated(act) && act != MOE_ACT_RELU && act != MOE_ACT_RELU2 && act != MOE_ACT_GELU &&
        act != MOE_ACT_GELU_TANH)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: %s = %d is not a moe_activation value", field,
                             (int)act);
    if ((act == MOE_ACT_SWIGLU_OAI || act == MOE_ACT_SWIGLU_CLAMP || act == MOE_ACT_SWIGLU_POSTCLAMP) &&
        !(d->swiglu_limit > 0.0f))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: swiglu_limit = %g, must be > 0", (double)d->swiglu_limit);
    if (act == MOE_ACT_SWIGLU_OAI && !isfinite(d->swiglu_alpha))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: swiglu_alpha = %g, must be finite",
                             (double)d->swiglu_alpha);
    if (act == MOE_ACT_SWIGLU_SOFTCAP) {
        if (!(d->softcap_gate > 0.0f) || isinf(d->softcap_gate))
            return moe_set_error(ctx, MOE_EINVAL, "layer description: softcap_gate = %g, must be finite and > 0 (%s %s)",
                                 (double)d->softcap_gate, field, "MOE_ACT_SWIGLU_SOFTCAP");
        if (!(d->softcap_up > 0.0f) || isinf(d->softcap_up))
            return moe_set_error(ctx, MOE_EINVAL, "layer description: softcap_up = %g, must be finite and > 0 (%s %s)",
                                 (double)d->softcap_up, field, "MOE_ACT_SWIGLU_SOFTCAP");
    }
    return MOE_OK;
}

moe_status moe_plan_check_desc(moe_ctx *ctx, const moe_layer_desc *d)
{
    struct {
        const char *name;
        int64_t v;
    } sizes[] = {{"hidden_size", d->hidden_size},
                 {"moe_intermediate_size", d->moe_intermediate_size},
                 {"num_experts", d->num_experts},
                 {"top_k", d->top_k}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (sizes[i].v <= 0 || sizes[i].v > MOE_MAX_DIM)
            return moe_set_error(ctx, MOE_EINVAL, "layer description: %s = %lld, must be in [1, %lld]",
                                 sizes[i].name, (long long)sizes[i].v, (long long)MOE_MAX_DIM);
    }
    if (d->num_identity_experts < 0 || d->num_identity_experts > MOE_MAX_DIM)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: num_identity_experts = %lld, must be in [0, %lld]",
                             (long long)d->num_identity_experts, (long long)MOE_MAX_DIM);
    if (d->num_identity_experts == 0 && d->top_k > d->num_experts)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: top_k = %lld exceeds num_experts = %lld",
                             (long long)d->top_k, (long long)d->num_experts);
    if (d->top_k > moe_route_width(d))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: top_k = %lld exceeds num_experts + num_identity_experts = %lld",
                             (long long)d->top_k, (long long)moe_route_width(d));
    if (d->shared_expert_intermediate_size < 0 || d->shared_expert_intermediate_size > MOE_MAX_DIM)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: shared_expert_intermediate_size = %lld, must be in [0, %lld]",
                             (long long)d->shared_expert_intermediate_size, (long long)MOE_MAX_DIM);
    if (d->shared_expert_gated && d->shared_expert_intermediate_size == 0)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: shared_expert_gated set without a shared expert "
                             "(shared_expert_intermediate_size = 0)");
    if (!(d->renormalize_eps >= 0.0f) || isinf(d->renormalize_eps))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: renormalize_eps = %g, must be finite and >= 0",
                             (double)d->renormalize_eps);
    if (d->renormalize && !(d->renormalize_p > 0.0f)) /* NaN fails too; +inf is max |w| */
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: renormalize_p = %g, must be > 0 (1: the sum, +inf: the max) with "
                             "renormalize (moe_layer_desc_init sets 1)",
                             (double)d->renormalize_p);
    if (d->expert_capacity < 0 || d->expert_capacity > INT32_MAX)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: expert_capacity = %lld, must be in [0, %d] (0: none)",
                             (long long)d->expert_capacity, INT32_MAX);
    if (d->expert_capacity > 0 && d->top_k != 1)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: expert_capacity = %lld with top_k = %lld: the capacity rule is Switch "
                             "Transformers' top-1 one (top_k must be 1)",
                             (long long)d->expert_capacity, (long long)d->top_k);
    if (d->expert_capacity > 0 && d->num_identity_experts > 0)
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: expert_capacity = %lld with num_identity_experts = %lld: no family "
                             "combines them and libmoe does not",
                             (long long)d->expert_capacity, (long long)d->num_identity_experts);
    if (d->shared_expert_intermediate_size > 0 &&
        (!(d->shared_expert_scale > 0.0f) || isinf(d->shared_expert_scale)))
        return moe_set_error(ctx, MOE_EINVAL,
                             "layer description: shared_expert_scale = %g, must be finite and > 0 with a shared expert "
                             "(moe_layer_desc_init sets 1)",
                             (double)d->shared_expert_scale);
    if (!(d->routed_scaling_factor > 0.0f) || isinf(d->routed_scaling_factor))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: routed_scaling_factor = %g, must be finite and > 0",
                             (double)d->routed_scaling_factor);
    if (d->scoring_func != MOE_SCORING_SOFTMAX && d->scoring_func != MOE_SCORING_SIGMOID &&
        d->scoring_func != MOE_SCORING_TOPK_SOFTMAX && d->scoring_func != MOE_SCORING_TOPK_SIGMOID &&
        d->scoring_func != MOE_SCORING_SPARSEMIXER && d->scoring_func != MOE_SCORING_SQRTSOFTPLUS)
        return moe_set_error(ctx, MOE_EINVAL, "layer description: scoring_func = %d is not a moe_scoring value",
                             (int)d->scoring_func);
    {
        moe_status ast = check_activation(ctx, d, d->activation, "activation");
        if (ast != MOE_OK)
            return ast;
        if (!(d->shared_swiglu_limit >= 0.0f))
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: shared_swiglu_limit = %g, must be 0 (swiglu_limit) or > 0",
                                 (double)d->shared_swiglu_limit);
        if (d->shared_swiglu_limit > 0.0f && d->shared_expert_intermediate_size == 0)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: shared_swiglu_limit set without a shared expert "
                                 "(shared_expert_intermediate_size = 0)");
        if (d->has_shared_activation && d->shared_expert_intermediate_size == 0)
            return moe_set_error(ctx, MOE_EINVAL,
                                 "layer description: has_shared_activation set without a shared expert "
                                 "(shared_expert_intermediate_size = 0)");
        if (d->has_shared_activation && (ast = check_activation(ctx, d, d->shared_activation, "shared_activation")) != MOE_OK)
            return ast;
    }
    if (d->has_output_norm && (!(d->output_norm_eps >= 0.0f) || isinf(d->output_norm_eps)))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: output_norm_eps = %g, must be finite and >= 0",
                             (double)d->output_norm_eps);
    {
        moe_status rst = moe_route_check_desc(ctx, d);
        if (rst != MOE_OK)
            return rst;
    }
    if (d->weight_dtype != MOE_DTYPE_F32 && d->weight_dtype != MOE_DTYPE_BF16 &&
        d->weight_dtype != MOE_DTYPE_F16)
        return moe_set_error(ctx, MOE_EDTYPE, "layer description: weight_dtype %s, expected F32, BF16 or F16",
                             moe_dtype_name(d->weight_dtype));
    {
        moe_status qst = moe_quant_validate(ctx, d); /* desc->quant (src/quant) */
        if (qst != MOE_OK)
            return qst;
    }
    /* the packed weights must be addressable */
    size_t bytes = 0;
    if (!moe_mul_size((size_t)d->num_experts, (size_t)(3 * d->moe_intermediate_size), &bytes) ||
        !moe_mul_size(bytes, (size_t)d->hidden_size * moe_dtype_size(d->weight_dtype), &bytes))
        return moe_set_error(ctx, MOE_EINVAL, "layer description: expert weights exceed the address space");
    return MOE_OK;
}

/* parallel.placement (moe_parallel.h "Expert placement"): NULL or valid for the layer and
 * ep_size (moe_placement_check, the message prefixed with the field). Every valid placement
 * runs: the weights pack each rank's physical experts and the EP dispatch follows it. */
moe_status moe_plan_check_placement(moe_ctx *ctx, const moe_layer_desc *d, const moe_parallel_config *par)
{
    const moe_placement *pl = par->placement;
    if (!pl)
        return MOE_OK;
    const moe_status st = moe_placement_check(ctx, pl, d->num_experts, par->ep_size);
    if (st != MOE_OK)
        return moe_set_error(ctx, st, "plan config: parallel.%s", moe_ctx_last_error(ctx));
    return MOE_OK;
}
