"""Tiny random transformers models of the MoE families libmoe.transformers takes, built from
their config classes (seeded), for python/tests/test_transformers.py and bench/."""
import torch

# model_type -> (config class name, causal-LM class name, config kwargs). Sizes are small
# but keep every routing feature of the family on (shared experts, groups, biases).
_COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(moe_intermediate_size=32, intermediate_size=96, num_experts=8,
                       num_experts_per_tok=2, norm_topk_prob=True, head_dim=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, head_dim=16)),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(moe_intermediate_size=32, intermediate_size=96, n_routed_experts=16,
                         num_experts_per_tok=4, n_group=4, topk_group=2, n_shared_experts=1,
                         routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=0,
                         q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                         v_head_dim=16, num_key_value_heads=4)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                     head_dim=16, sliding_window=16)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(moe_intermediate_size=32, intermediate_size=96, num_experts=8,
                       num_experts_per_tok=2, shared_expert_intermediate_size=48,
                       norm_topk_prob=False)),
    # non-gated relu2 experts and shared MLP (has_gate=False), DeepSeek-V3's grouped sigmoid
    # router; the layer count is len(layers_block_type): attention then MoE, twice
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   dict(layers_block_type=["attention", "moe", "attention", "moe"],
                        num_hidden_layers=None, moe_intermediate_size=32, intermediate_size=96,
                        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                        moe_shared_expert_intermediate_size=48, norm_topk_prob=True,
                        routed_scaling_factor=2.5, mlp_hidden_act="relu2", head_dim=16,
                        mamba_num_heads=2, mamba_head_dim=8, ssm_state_size=8, n_groups=1)),
}


def build(family, seed=0, dtype=torch.float32, experts_implementation="eager", **over):
    import transformers
    cfg_name, model_name, kw = FAMILIES[family]
    kw = dict(_COMMON, **kw)
    kw.update(over)
    kw = {k: v for k, v in kw.items() if v is not None}  # None: the config class derives it
    cfg = getattr(transformers, cfg_name)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg)
    # The router and e_score_correction_bias start at zeros / constants in some families'
    # init: give every parameter and buffer seeded normal values so routing is not degenerate.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if p.is_floating_point() and "inv_freq" not in name and "rotary" not in name:
                if name.endswith("norm.weight") or "layernorm" in name:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
    model = model.to(dtype).eval()
    model.set_experts_implementation(experts_implementation)
    # generate() runs its full length (no end-of-sequence stop in a random model)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
