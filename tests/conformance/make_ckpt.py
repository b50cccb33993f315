"""Random Hugging Face-layout MoE checkpoints, written with numpy and safetensors only (no
torch), for the conformance tests.

make_checkpoint(dir, family, H, I, E, K, ...) writes dir/config.json (the fields the released
Mixtral / Qwen1.5-MoE / Qwen3-MoE configs carry) and the tensors of every layer: router and
experts (+ Qwen2-MoE's gated shared expert) for MoE layers, a dense MLP for dense ones, and
some unrelated tensors (embeddings, norms, attention output) a loader must ignore. Options:

  dtype          "f32" | "bf16" | "f16": every tensor's dtype (as in released checkpoints)
  layout         "per_expert" (what save_pretrained writes) | "stacked" (transformers >= 5
                 in-memory names: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I];
                 Mixtral's block_sparse_moe. prefix becomes mlp.)
  shards         1: model.safetensors; n > 1: model-0000i-of-0000n.safetensors + index.json,
                 tensors dealt round-robin so every layer spans several shards
  dead_experts   router rows that make these experts lose every token whose hidden state has
                 x[0] > 0 (row = -30 e_0); run_conformance draws such inputs for these cases
  zero_router    all router rows 0: every logit is exactly 0, so top-k is decided by ties
  experts_key    "num_experts" (released Qwen configs) or "num_local_experts" (what
                 transformers >= 5 writes for Qwen3-MoE)

Weights are N(0, 1/fan_in), router rows N(0, (router_gain / sqrt(H))^2), drawn from
numpy.random.default_rng(seed) in f32 and rounded to the checkpoint dtype (round to nearest
even); the reference reads them back from the files, so it uses the rounded values.
"""

import json
import os

import numpy as np
import safetensors
import safetensors.numpy


def f32_to_bf16_bits(a):
    """Round-to-nearest-even f32 -> bf16, as uint16 storage."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    nan = np.isnan(a)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    r[nan] = 0x7FC0
    return r


def to_storage(a, dtype):
    """f32 array -> (safetensors dtype code, storage ndarray)."""
    if dtype == "f32":
        return "F32", np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "f16":
        return "F16", np.ascontiguousarray(a, dtype=np.float16)
    if dtype == "bf16":
        return "BF16", f32_to_bf16_bits(a)
    raise ValueError(dtype)


def save_tensors(path, tensors):
    """tensors: {name: (dtype code, storage ndarray)}. Written by the safetensors package:
    numpy's own dtypes through safetensors.numpy.save_file, BF16 (which numpy lacks)
    through safetensors.serialize_file with raw uint16 storage."""
    if all(code != "BF16" for code, _ in tensors.values()):
        safetensors.numpy.save_file({k: v for k, (_, v) in tensors.items()}, path,
                                    metadata={"format": "pt"})
        return
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I32": "int32"}
    keep = {k: np.ascontiguousarray(v) for k, (_, v) in tensors.items()}
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        spec = {k: safetensors.TensorSpec(dtype=names[tensors[k][0]], shape=list(v.shape),
                                          data_ptr=v.ctypes.data, data_len=v.nbytes)
                for k, v in keep.items()}
    else:  # older releases take {"dtype", "shape", "data"} dicts
        spec = {k: {"dtype": names[tensors[k][0]], "shape": list(v.shape), "data": v.tobytes()}
                for k, v in keep.items()}
    safetensors.serialize_file(spec, path, metadata={"format": "pt"})


def is_moe_layer(family, layer, sparse_step, mlp_only):
    if family == "mixtral":
        return True
    return layer not in mlp_only and (layer + 1) % sparse_step == 0


def config_for(family, H, I, E, K, layers, norm_topk_prob, shared, sparse_step, mlp_only,
               dense_intermediate, dtype, experts_key):
    torch_dtype = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[dtype]
    c = {
        "hidden_size": H,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_experts_per_tok": K,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "vocab_size": 4,
        "max_position_embeddings": 4096,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
        "transformers_version": "4.51.0",
        "use_cache": True,
    }
    if family == "mixtral":
        c.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                 intermediate_size=I, num_local_experts=E, router_aux_loss_coef=0.02,
                 output_router_logits=False, sliding_window=None)
    else:
        c.update(architectures=["Qwen2MoeForCausalLM" if family == "qwen2_moe"
                                else "Qwen3MoeForCausalLM"],
                 model_type=family, intermediate_size=dense_intermediate,
                 moe_intermediate_size=I, norm_topk_prob=norm_topk_prob,
                 decoder_sparse_step=sparse_step, mlp_only_layers=list(mlp_only),
                 router_aux_loss_coef=0.001, output_router_logits=False)
        c[experts_key] = E
        if family == "qwen2_moe":
            c["shared_expert_intermediate_size"] = shared
        else:
            c["head_dim"] = max(1, H // 4)
    return c


def make_checkpoint(out_dir, family, H, I, E, K, *, seed=0, layers=1, dtype="f32",
                    layout="per_expert", shards=1, norm_topk_prob=False, shared=0,
                    sparse_step=1, mlp_only=(), dense_intermediate=8, dead_experts=(),
                    zero_router=False, router_gain=2.0, experts_key="num_experts"):
    """Write the checkpoint folder; returns the config dict."""
    assert family in ("mixtral", "qwen2_moe", "qwen3_moe")
    assert 1 <= K <= E
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)

    def mat(rows, cols, std=None):
        s = (1.0 / np.sqrt(cols)) if std is None else std
        return (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(s))

    tensors = {}  # name -> f32 array, in a fixed order

    def put(name, a):
        tensors[name] = a

    put("model.embed_tokens.weight", mat(4, H))
    for L in range(layers):
        pre = f"model.layers.{L}."
        put(pre + "input_layernorm.weight", np.ones(H, dtype=np.float32))
        put(pre + "post_attention_layernorm.weight", np.ones(H, dtype=np.float32))
        put(pre + "self_attn.o_proj.weight", mat(H, H))
        if not is_moe_layer(family, L, sparse_step, mlp_only):
            put(pre + "mlp.gate_proj.weight", mat(dense_intermediate, H))
            put(pre + "mlp.up_proj.weight", mat(dense_intermediate, H))
            put(pre + "mlp.down_proj.weight", mat(H, dense_intermediate))
            continue
        if family == "mixtral":
            moe = pre + ("block_sparse_moe." if layout == "per_expert" else "mlp.")
            names = ("w1", "w3", "w2")
        else:
            moe = pre + "mlp."
            names = ("gate_proj", "up_proj", "down_proj")
        router = mat(E, H, router_gain / np.sqrt(H))
        if zero_router:
            router[:] = 0.0
        for e in dead_experts:
            router[e] = 0.0
            router[e, 0] = -30.0
        put(moe + "gate.weight", router)
        wg = [mat(I, H) for _ in range(E)]
        wu = [mat(I, H) for _ in range(E)]
        wd = [mat(H, I) for _ in range(E)]
        if layout == "per_expert":
            for e in range(E):
                put(f"{moe}experts.{e}.{names[0]}.weight", wg[e])
                put(f"{moe}experts.{e}.{names[1]}.weight", wu[e])
                put(f"{moe}experts.{e}.{names[2]}.weight", wd[e])
        elif layout == "stacked":
            put(moe + "experts.gate_up_proj",
                np.stack([np.concatenate([wg[e], wu[e]]) for e in range(E)]))
            put(moe + "experts.down_proj", np.stack(wd))
        else:
            raise ValueError(layout)
        if family == "qwen2_moe" and shared:
            put(moe + "shared_expert.gate_proj.weight", mat(shared, H))
            put(moe + "shared_expert.up_proj.weight", mat(shared, H))
            put(moe + "shared_expert.down_proj.weight", mat(H, shared))
            put(moe + "shared_expert_gate.weight", mat(1, H))
    put("model.norm.weight", np.ones(H, dtype=np.float32))
    put("lm_head.weight", mat(4, H))

    stored = {k: to_storage(v, dtype) for k, v in tensors.items()}
    if shards <= 1:
        save_tensors(os.path.join(out_dir, "model.safetensors"), stored)
    else:
        files = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        parts = [dict() for _ in range(shards)]
        weight_map = {}
        for i, (k, v) in enumerate(stored.items()):
            parts[i % shards][k] = v
            weight_map[k] = files[i % shards]
        for fn, part in zip(files, parts):
            save_tensors(os.path.join(out_dir, fn), part)
        total = sum(v.nbytes for _, v in stored.values())
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as fh:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": dict(sorted(weight_map.items()))}, fh, indent=2)

    cfg = config_for(family, H, I, E, K, layers, norm_topk_prob, shared, sparse_step, mlp_only,
                     dense_intermediate, dtype, experts_key)
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    return cfg


def write_hidden_states(path, x, dtype="f32"):
    """input.safetensors with hidden_states [T, H] (F32, or BF16 rounded to nearest even)."""
    save_tensors(path, {"hidden_states": to_storage(np.asarray(x, dtype=np.float32), dtype)})
