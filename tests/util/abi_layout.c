/* The layout of the public structs that python/libmoe/_capi.py mirrors with ctypes, as this
 * compiler lays them out: one JSON object on stdout, {"<struct>": {"size": sizeof, "fields":
 * [["<field>", offsetof], ...]}}, the fields in declaration order. Built only for the tests:
 * python/tests/test_numpy.py (test_ctypes_mirrors_match_c, run by ctest's python_numpy with
 * LIBMOE_ABI_LAYOUT naming this program) compares every mirror's ctypes.sizeof, field names
 * and offsets with it, so a field added to moe.h without its mirror fails there instead of the
 * library writing past a Python struct. A field added here must be added to the header's
 * struct first (the compiler checks the names); a field of the header missing here is caught
 * by the size, or by the mirror's extra field. Uses only the public headers. */
#include <stddef.h>
#include <stdio.h>

#include "moe.h"
#include "moe_checkpoint.h"
#include "moe_quant.h"

#define FIELD(s, f, first) printf("%s[\"%s\", %zu]", (first) ? "" : ", ", #f, offsetof(s, f))

int main(void)
{
    printf("{");
    printf("\"moe_options\": {\"size\": %zu, \"fields\": [", sizeof(moe_options));
    FIELD(moe_options, num_threads, 1);
    FIELD(moe_options, isa, 0);
    FIELD(moe_options, chunk_size, 0);
    FIELD(moe_options, permute, 0);
    FIELD(moe_options, onehot_threshold, 0);
    FIELD(moe_options, topk, 0);
    FIELD(moe_options, lowtok_threshold, 0);
    FIELD(moe_options, small_allreduce, 0);
    FIELD(moe_options, tp_reduce, 0);
    FIELD(moe_options, tuning_dir, 0);
    FIELD(moe_options, log_level, 0);
    FIELD(moe_options, log_fn, 0);
    FIELD(moe_options, log_user, 0);
    FIELD(moe_options, pack_progress_fn, 0);
    FIELD(moe_options, pack_progress_user, 0);
    printf("]}");
    printf(", \"moe_qweight\": {\"size\": %zu, \"fields\": [", sizeof(moe_qweight));
    FIELD(moe_qweight, dtype, 1);
    FIELD(moe_qweight, scale, 0);
    FIELD(moe_qweight, block_n, 0);
    FIELD(moe_qweight, block_k, 0);
    FIELD(moe_qweight, group_size, 0);
    FIELD(moe_qweight, has_zero_point, 0);
    printf("]}");
    printf(", \"moe_quant_config\": {\"size\": %zu, \"fields\": [", sizeof(moe_quant_config));
    FIELD(moe_quant_config, w13, 1);
    FIELD(moe_quant_config, w2, 0);
    FIELD(moe_quant_config, act, 0);
    FIELD(moe_quant_config, act_group_size, 0);
    printf("]}");
    printf(", \"moe_layer_desc\": {\"size\": %zu, \"fields\": [", sizeof(moe_layer_desc));
    FIELD(moe_layer_desc, family, 1);
    FIELD(moe_layer_desc, hidden_size, 0);
    FIELD(moe_layer_desc, moe_intermediate_size, 0);
    FIELD(moe_layer_desc, num_experts, 0);
    FIELD(moe_layer_desc, top_k, 0);
    FIELD(moe_layer_desc, scoring_func, 0);
    FIELD(moe_layer_desc, renormalize, 0);
    FIELD(moe_layer_desc, routed_scaling_factor, 0);
    FIELD(moe_layer_desc, activation, 0);
    FIELD(moe_layer_desc, shared_expert_intermediate_size, 0);
    FIELD(moe_layer_desc, shared_expert_gated, 0);
    FIELD(moe_layer_desc, weight_dtype, 0);
    FIELD(moe_layer_desc, n_group, 0);
    FIELD(moe_layer_desc, topk_group, 0);
    FIELD(moe_layer_desc, group_score, 0);
    FIELD(moe_layer_desc, has_selection_bias, 0);
    FIELD(moe_layer_desc, has_router_bias, 0);
    FIELD(moe_layer_desc, has_expert_bias, 0);
    FIELD(moe_layer_desc, apply_router_weight_on_input, 0);
    FIELD(moe_layer_desc, swiglu_alpha, 0);
    FIELD(moe_layer_desc, swiglu_limit, 0);
    FIELD(moe_layer_desc, quant, 0);
    FIELD(moe_layer_desc, sparsemixer_jitter_eps, 0);
    FIELD(moe_layer_desc, has_output_bias, 0);
    FIELD(moe_layer_desc, softcap_gate, 0);
    FIELD(moe_layer_desc, softcap_up, 0);
    FIELD(moe_layer_desc, has_shared_activation, 0);
    FIELD(moe_layer_desc, shared_activation, 0);
    FIELD(moe_layer_desc, has_output_norm, 0);
    FIELD(moe_layer_desc, output_norm_eps, 0);
    FIELD(moe_layer_desc, renormalize_eps, 0);
    FIELD(moe_layer_desc, shared_expert_scale, 0);
    FIELD(moe_layer_desc, num_identity_experts, 0);
    FIELD(moe_layer_desc, shared_swiglu_limit, 0);
    FIELD(moe_layer_desc, renormalize_p, 0);
    FIELD(moe_layer_desc, expert_capacity, 0);
    printf("]}");
    printf(", \"moe_weight_source\": {\"size\": %zu, \"fields\": [", sizeof(moe_weight_source));
    FIELD(moe_weight_source, router, 1);
    FIELD(moe_weight_source, router_dtype, 0);
    FIELD(moe_weight_source, gate_proj, 0);
    FIELD(moe_weight_source, up_proj, 0);
    FIELD(moe_weight_source, down_proj, 0);
    FIELD(moe_weight_source, shared_gate_proj, 0);
    FIELD(moe_weight_source, shared_up_proj, 0);
    FIELD(moe_weight_source, shared_down_proj, 0);
    FIELD(moe_weight_source, shared_expert_gate, 0);
    FIELD(moe_weight_source, gate_up_stride_out, 0);
    FIELD(moe_weight_source, gate_up_stride_in, 0);
    FIELD(moe_weight_source, down_stride_out, 0);
    FIELD(moe_weight_source, down_stride_in, 0);
    FIELD(moe_weight_source, router_bias, 0);
    FIELD(moe_weight_source, router_bias_dtype, 0);
    FIELD(moe_weight_source, selection_bias, 0);
    FIELD(moe_weight_source, selection_bias_dtype, 0);
    FIELD(moe_weight_source, gate_bias, 0);
    FIELD(moe_weight_source, up_bias, 0);
    FIELD(moe_weight_source, down_bias, 0);
    FIELD(moe_weight_source, expert_bias_dtype, 0);
    FIELD(moe_weight_source, gate_up_bias_stride, 0);
    FIELD(moe_weight_source, gate_scale, 0);
    FIELD(moe_weight_source, up_scale, 0);
    FIELD(moe_weight_source, down_scale, 0);
    FIELD(moe_weight_source, gate_zero, 0);
    FIELD(moe_weight_source, up_zero, 0);
    FIELD(moe_weight_source, down_zero, 0);
    FIELD(moe_weight_source, output_bias, 0);
    FIELD(moe_weight_source, output_bias_dtype, 0);
    FIELD(moe_weight_source, w13_input_scale, 0);
    FIELD(moe_weight_source, w2_input_scale, 0);
    FIELD(moe_weight_source, output_norm, 0);
    FIELD(moe_weight_source, output_norm_dtype, 0);
    printf("]}");
    printf(", \"moe_stacked_experts\": {\"size\": %zu, \"fields\": [", sizeof(moe_stacked_experts));
    FIELD(moe_stacked_experts, gate_up_proj, 1);
    FIELD(moe_stacked_experts, down_proj, 0);
    FIELD(moe_stacked_experts, gate_up_proj_bias, 0);
    FIELD(moe_stacked_experts, down_proj_bias, 0);
    FIELD(moe_stacked_experts, is_transposed, 0);
    FIELD(moe_stacked_experts, is_concatenated, 0);
    FIELD(moe_stacked_experts, has_bias, 0);
    FIELD(moe_stacked_experts, bias_dtype, 0);
    printf("]}");
    printf(", \"moe_exec_args\": {\"size\": %zu, \"fields\": [", sizeof(moe_exec_args));
    FIELD(moe_exec_args, hidden_states, 1);
    FIELD(moe_exec_args, hidden_dtype, 0);
    FIELD(moe_exec_args, n_tokens, 0);
    FIELD(moe_exec_args, router_logits, 0);
    FIELD(moe_exec_args, output, 0);
    FIELD(moe_exec_args, topk_ids, 0);
    FIELD(moe_exec_args, topk_weights, 0);
    FIELD(moe_exec_args, workspace, 0);
    FIELD(moe_exec_args, workspace_size, 0);
    FIELD(moe_exec_args, stats, 0);
    FIELD(moe_exec_args, in_topk_ids, 0);
    FIELD(moe_exec_args, in_topk_weights, 0);
    FIELD(moe_exec_args, output_dtype, 0);
    FIELD(moe_exec_args, expert_load, 0);
    FIELD(moe_exec_args, sequence_lengths, 0);
    FIELD(moe_exec_args, n_sequences, 0);
    printf("]}");
    printf(", \"moe_checkpoint_options\": {\"size\": %zu, \"fields\": [", sizeof(moe_checkpoint_options));
    FIELD(moe_checkpoint_options, strict, 1);
    FIELD(moe_checkpoint_options, family, 0);
    FIELD(moe_checkpoint_options, expert_set, 0);
    printf("]}");
    printf("}\n");
    return 0;
}
