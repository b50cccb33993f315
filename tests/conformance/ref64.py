"""An independent float64 reference of one MoE layer of a Hugging Face checkpoint.

Written from the models' published semantics (../../../shared/MODELS.md, transformers'
modeling code), not from libmoe's sources, and using only numpy and the safetensors package:

  router_logits = x Wr^T                                  float64
  probs         = softmax(router_logits)                  float64
  topk_ids      = the K largest probs, score descending, ties to the lower expert id
  topk_weights  = probs[topk_ids], divided by (sum + 1e-20) when the family renormalizes
                  (Mixtral always; Qwen2/3-MoE when config norm_topk_prob)
  y_e(x)        = W_down (silu(W_gate x) * (W_up x)),   silu(v) = v / (1 + exp(-v))
  output        = sum_k topk_weights[k] * y_{topk_ids[k]}(x)
                  (+ sigmoid(w_sg . x) * y_shared(x) for Qwen2-MoE's gated shared expert)

The other families, from transformers 5.24's modeling code (the routing table of MODELS.md):

  DeepSeek-V2   softmax; topk_method greedy, or group_limited_greedy (groups of E/n_group,
                group score = max, keep topk_group groups, the rest masked); no
                renormalization; routed_scaling_factor; n_shared_experts * I shared, ungated
  DeepSeek-V3   s = sigmoid(l); choice = s + e_score_correction_bias; group score = sum of
                the two best choices; keep topk_group groups (others -inf); top-k on choice;
                weights = s (unbiased), / (sum + 1e-20) if norm_topk_prob; * scale; shared
  gpt-oss       l = x Wr^T + b; top-k on l; weights = softmax of the k; experts: gu = x W + b
                (gate = even columns, up = odd), gate = min(gate, limit), up = clamp(up,
                -limit, limit), h = (up + 1) * gate * sigmoid(alpha gate), y = h Wd + bd
  Llama-4       top-k on l; w = sigmoid(l); y = SwiGLU(w x), summed unweighted; + shared(x)
  OLMoE         softmax, renormalize if norm_topk_prob
  Granite-MoE   top-k on l, softmax of the k
  Qwen3.5-MoE   softmax, always renormalized, sigmoid-gated shared expert
  Qwen3-Next    as Qwen2-MoE with norm_topk_prob defaulting to true

Weights of any dtype (F32, BF16, F16) are widened exactly to float64, so the reference uses
the same rounded weights a bf16/f16 implementation sees. Tensor names: per-expert (what
transformers' save_pretrained writes), stacked (transformers' in-memory layout,
experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]; Granite input_linear /
output_linear), and the input-major [E, H, 2I] / [E, I, H] of Llama-4 and gpt-oss.
gpt-oss's MXFP4 experts (config quantization_config quant_method mxfp4; transformers'
integrations/mxfp4.py) are dequantized exactly to float64 (mxfp4_dequant):
experts.gate_up_proj_blocks [E, 2I, H/32, 16] U8 + _scales [E, 2I, H/32] U8 give the
output-major [E, 2I, H], gate = even rows, up = odd rows (the bf16 layout's columns);
experts.down_proj_blocks / _scales give [E, H, I].
"""

import json
import math
import os

import numpy as np
import safetensors

# safetensors dtype code -> (numpy storage dtype, widening function to float64)
_F64 = {
    "F64": (np.float64, lambda a: a.astype(np.float64)),
    "F32": (np.float32, lambda a: a.astype(np.float64)),
    "F16": (np.float16, lambda a: a.astype(np.float64)),
    "BF16": (np.uint16, lambda a: (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)),
    "I64": (np.int64, lambda a: a),
    "I32": (np.int32, lambda a: a),
    "U8": (np.uint8, lambda a: a),
}


def read_safetensors(path):
    """{name: (dtype_code, ndarray)}: float tensors widened exactly to float64, ints as is."""
    with open(path, "rb") as fh:
        raw = fh.read()
    out = {}
    for name, t in safetensors.deserialize(raw):
        code = t["dtype"]
        if code not in _F64:
            raise ValueError(f"{path}: tensor {name}: dtype {code} not handled by ref64")
        store, widen = _F64[code]
        a = np.frombuffer(bytes(t["data"]), dtype=np.dtype(store).newbyteorder("<"))
        out[name] = (code, widen(a).reshape(t["shape"]))
    return out


class Checkpoint:
    """A Hugging Face folder: config.json + model.safetensors, or the shards listed in
    model.safetensors.index.json."""

    def __init__(self, d):
        self.dir = d
        with open(os.path.join(d, "config.json")) as fh:
            self.config = json.load(fh)
        idx = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        self.tensors = {}
        self.dtypes = {}
        for fn in files:
            for name, (code, arr) in read_safetensors(os.path.join(d, fn)).items():
                if name in self.tensors:
                    raise ValueError(f"{d}: tensor {name} appears in two files")
                self.tensors[name] = arr
                self.dtypes[name] = code
        self.family = family_of(self.config)

    def get(self, name):
        if name not in self.tensors:
            raise KeyError(f"{self.dir}: tensor {name} not found")
        return self.tensors[name]

    def has(self, name):
        return name in self.tensors


_FAMILIES = {
    "MixtralForCausalLM": "mixtral", "mixtral": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe", "qwen2_moe": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "qwen3_moe": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek_v2", "deepseek_v2": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "deepseek_v3": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss", "gpt_oss": "gpt_oss",
    "Llama4ForConditionalGeneration": "llama4", "llama4": "llama4",
    "Llama4ForCausalLM": "llama4", "llama4_text": "llama4",
    "OlmoeForCausalLM": "olmoe", "olmoe": "olmoe",
    "GraniteMoeForCausalLM": "granitemoe", "granitemoe": "granitemoe",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe", "qwen3_5_moe": "qwen3_5_moe",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe", "qwen3_5_moe_text": "qwen3_5_moe",
    "Qwen3NextForCausalLM": "qwen3_next", "qwen3_next": "qwen3_next",
    "Glm4MoeForCausalLM": "glm4_moe", "glm4_moe": "glm4_moe",
    "Dots1ForCausalLM": "dots1", "dots1": "dots1",
    "MiniMaxForCausalLM": "minimax", "minimax": "minimax",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe", "qwen3_vl_moe": "qwen3_vl_moe",
    "FlexOlmoForCausalLM": "flex_olmo", "flex_olmo": "flex_olmo",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite", "glm4_moe_lite": "glm4_moe_lite",
    "DeepseekV32ForCausalLM": "deepseek_v32", "deepseek_v32": "deepseek_v32",
    "ExaoneMoeForCausalLM": "exaone_moe", "exaone_moe": "exaone_moe",
    "MiMoV2FlashForCausalLM": "mimo_v2_flash", "mimo_v2_flash": "mimo_v2_flash",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa", "glm_moe_dsa": "glm_moe_dsa",
    "SolarOpenForCausalLM": "solar_open", "solar_open": "solar_open",
    "Glm4vMoeForConditionalGeneration": "glm4v_moe", "glm4v_moe": "glm4v_moe",
    "KimiLinearForCausalLM": "kimi_linear", "kimi_linear": "kimi_linear",
    "BailingHybridForCausalLM": "bailing_hybrid", "bailing_hybrid": "bailing_hybrid",
    "MiniMaxM2ForCausalLM": "minimax_m2", "minimax_m2": "minimax_m2",
    "HYV3ForCausalLM": "hy_v3", "hy_v3": "hy_v3",
    "AXK2ForCausalLM": "axk2", "axk2": "axk2",
    "Glm5NextForConditionalGeneration": "glm5_next", "glm5_next": "glm5_next",
}


def family_of(cfg):
    arch = (cfg.get("architectures") or [""])[0]
    mt = cfg.get("model_type", "")
    if arch in _FAMILIES:
        return _FAMILIES[arch]
    if mt in _FAMILIES:
        return _FAMILIES[mt]
    raise ValueError(f"unsupported architecture {arch!r} / model_type {mt!r}")


def text_config(cfg, family):
    """The decoder's fields: text_config for the multimodal wrappers."""
    if family in ("llama4", "qwen3_5_moe", "qwen3_vl_moe", "glm4v_moe", "glm5_next") and isinstance(
            cfg.get("text_config"), dict):
        return cfg["text_config"]
    return cfg


_MLP_TYPES = ("glm4_moe_lite", "deepseek_v32", "exaone_moe", "mimo_v2_flash")
# DeepSeek-V3's router maths (sigmoid, e_score_correction_bias, top-2-sum groups) under other names
_V3_LIKE = ("glm4_moe", "dots1") + _MLP_TYPES
# More of them (their modeling files: GlmMoeDsaTopkRouter, SolarOpenTopkRouter,
# Glm4vMoeTextTopkRouter, KimiLinearTopkRouter, BailingHybridTopkRouter; MiniMaxM2TopKRouter and
# HYV3TopKRouter without groups, always dividing by the top-k sum); _TYPES_A: MoE layers by
# mlp_layer_types, the config classes filling an absent list from first_k_dense_replace (GLM-5:
# 3, Kimi-Linear: 1, Bailing: 2) or, Hunyuan-V3, with one dense layer first.
_FAM_A = ("glm_moe_dsa", "solar_open", "glm4v_moe", "kimi_linear", "bailing_hybrid", "minimax_m2", "hy_v3",
          "axk2", "glm5_next")
_TYPES_A = {"glm_moe_dsa": 3, "kimi_linear": 1, "bailing_hybrid": 2, "hy_v3": 1, "axk2": 1, "glm5_next": 3}
# config.json names that their config classes' attribute_map writes (Kimi-Linear, Bailing)
_KIMI_NAMES = ("kimi_linear", "bailing_hybrid")


def is_moe_layer(cfg, family, layer):
    if family in ("mixtral", "gpt_oss", "olmoe", "granitemoe", "qwen3_5_moe", "minimax", "flex_olmo"):
        return True
    if family in ("solar_open", "minimax_m2"):
        return True
    if family in _TYPES_A:
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        first = None if family in ("hy_v3", "glm5_next") else cfg.get("first_k_dense_replace")
        # AXK2Config also steps by moe_layer_freq (default 1)
        freq = int(_get(cfg, "moe_layer_freq", 1)) if family == "axk2" else 1
        return layer >= (_TYPES_A[family] if first is None else int(first)) and layer % freq == 0
    if family == "glm4v_moe":  # Glm4vMoeTextDecoderLayer: layer_idx >= first_k_dense_replace (1)
        return layer >= int(_get(cfg, "first_k_dense_replace", 1))
    if family in _MLP_TYPES:
        # their DecoderLayers: MoE where config.mlp_layer_types[layer] == "sparse"; the config
        # classes fill an absent list with dense layers first (first_k_dense_replace, or 1)
        types = cfg.get("mlp_layer_types")
        if types is not None:
            return types[layer] == "sparse"
        first = cfg.get("first_k_dense_replace")
        return layer >= ({"deepseek_v32": 3}.get(family, 1) if first is None else int(first))
    if family in ("deepseek_v2", "deepseek_v3", "glm4_moe", "dots1"):
        # Glm4MoeDecoderLayer / Dots1DecoderLayer: layer_idx >= first_k_dense_replace (1 / 0)
        first = cfg.get("first_k_dense_replace")
        first = {"deepseek_v3": 3, "glm4_moe": 1}.get(family, 0) if first is None else int(first)
        return layer >= first and layer % int(cfg.get("moe_layer_freq") or 1) == 0
    if family == "llama4":
        if cfg.get("moe_layers") is not None:
            return layer in cfg["moe_layers"]
        return (layer + 1) % int(cfg.get("interleave_moe_layer_step") or 1) == 0
    if layer in (cfg.get("mlp_only_layers") or []):
        return False
    return (layer + 1) % int(cfg.get("decoder_sparse_step", 1)) == 0


def _get(cfg, key, default):
    v = cfg.get(key)
    return default if v is None else v


def _prefix(ck, fam, layer):
    """The MoE block's tensor prefix: the first candidate that holds the router."""
    cands = {
        "mixtral": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "qwen3_5_moe": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "llama4": [f"language_model.model.layers.{layer}.feed_forward.",
                   f"model.language_model.layers.{layer}.feed_forward.",
                   f"model.layers.{layer}.feed_forward."],
        "granitemoe": [f"model.layers.{layer}.block_sparse_moe."],
        "minimax": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "qwen3_vl_moe": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "glm4v_moe": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        "glm5_next": [f"model.language_model.layers.{layer}.mlp.", f"model.layers.{layer}.mlp."],
        # transformers' conversion mappings save these under Mixtral's old block name
        "kimi_linear": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
        "minimax_m2": [f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."],
    }.get(fam, [f"model.layers.{layer}.mlp."])
    routers = {"gpt_oss": ["router.weight"], "llama4": ["router.weight"],
               "granitemoe": ["router.layer.weight", "router.weight"],
               "hy_v3": ["router.gate.weight", "gate.weight"]}.get(fam, ["gate.weight"])
    for c in cands:
        for r in routers:
            if ck.has(c + r):
                return c, c + r
    return cands[0], cands[0] + routers[0]


def layer_params(ck, layer):
    """Sizes, routing settings and float64 weights of MoE layer `layer`."""
    fam = ck.family
    if fam not in ("mixtral", "qwen2_moe", "qwen3_moe"):
        return layer_params_new(ck, layer)
    cfg = ck.config
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    if not is_moe_layer(cfg, fam, layer):
        raise ValueError(f"layer {layer} is a dense layer")
    p = {"family": fam, "H": int(cfg["hidden_size"]), "K": int(cfg["num_experts_per_tok"])}
    if fam == "mixtral":
        p["E"] = int(cfg["num_local_experts"])
        p["I"] = int(cfg["intermediate_size"])
        p["renormalize"] = True
    else:
        # transformers >= 5 writes num_local_experts for Qwen3-MoE; released configs have
        # num_experts.
        p["E"] = int(cfg["num_experts"] if "num_experts" in cfg else cfg["num_local_experts"])
        p["I"] = int(cfg["moe_intermediate_size"])
        p["renormalize"] = bool(cfg.get("norm_topk_prob", False))
    E, I, H = p["E"], p["I"], p["H"]

    pre = f"model.layers.{layer}."
    moe = pre + ("block_sparse_moe." if fam == "mixtral" else "mlp.")
    if fam == "mixtral" and not ck.has(moe + "gate.weight") and ck.has(pre + "mlp.gate.weight"):
        moe = pre + "mlp."  # transformers' in-memory (stacked) naming of Mixtral
    p["router"] = ck.get(moe + "gate.weight")
    stacked = moe + "experts.gate_up_proj"
    if ck.has(stacked):
        gu = ck.get(stacked)
        p["w_gate"], p["w_up"] = gu[:, :I, :], gu[:, I:, :]
        p["w_down"] = ck.get(moe + "experts.down_proj")
    else:
        g, u, dn = ("w1", "w3", "w2") if fam == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        p["w_gate"] = np.stack([ck.get(f"{moe}experts.{e}.{g}.weight") for e in range(E)])
        p["w_up"] = np.stack([ck.get(f"{moe}experts.{e}.{u}.weight") for e in range(E)])
        p["w_down"] = np.stack([ck.get(f"{moe}experts.{e}.{dn}.weight") for e in range(E)])
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)),
                     ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")
    p["Is"] = 0
    if fam == "qwen2_moe" and int(cfg.get("shared_expert_intermediate_size", 0)) > 0:
        p["Is"] = int(cfg["shared_expert_intermediate_size"])
        s = moe + "shared_expert."
        p["s_gate"] = ck.get(s + "gate_proj.weight")
        p["s_up"] = ck.get(s + "up_proj.weight")
        p["s_down"] = ck.get(s + "down_proj.weight")
        p["s_expert_gate"] = ck.get(moe + "shared_expert_gate.weight")  # [1, H]
    return p


def layer_params_new(ck, layer):
    """layer_params for the families after Mixtral / Qwen2/3-MoE."""
    fam = ck.family
    cfg = text_config(ck.config, fam)
    nl = int(cfg["num_hidden_layers"])
    if not 0 <= layer < nl:
        raise IndexError(f"layer {layer} outside [0, {nl})")
    if not is_moe_layer(cfg, fam, layer):
        raise ValueError(f"layer {layer} is a dense layer")
    H = int(cfg["hidden_size"])
    K = int(cfg["num_experts_per_token"] if fam in _KIMI_NAMES and "num_experts_per_token" in cfg
            else cfg["num_experts_per_tok"])
    v3 = fam == "deepseek_v3" or fam in _V3_LIKE  # sigmoid + e_score_correction_bias
    if fam in _FAM_A:
        E = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts"))
        I = int(cfg["intermediate_size" if fam == "minimax_m2" else "moe_intermediate_size"])
    elif fam in ("deepseek_v2", "deepseek_v3") + _V3_LIKE:
        E = int(cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts"))
        I = int(cfg["moe_intermediate_size"])
    elif fam in ("qwen3_5_moe", "qwen3_next", "qwen3_vl_moe"):
        E = int(cfg.get("num_experts") or cfg.get("num_local_experts"))
        I = int(cfg["moe_intermediate_size"])
    else:
        E = int(cfg.get("num_local_experts") or cfg.get("num_experts"))
        I = int(cfg["intermediate_size"])
    p = {"family": fam, "H": H, "K": K, "E": E, "I": I, "scoring": "softmax", "renormalize": False,
         "scale": 1.0, "n_group": 1, "topk_group": 1, "group_score": "max", "sel_bias": None,
         "router_bias": None, "act": "swiglu", "on_input": False, "Is": 0, "shared_gated": False,
         "biases": None}
    if fam in _FAM_A:
        if fam in ("minimax_m2", "hy_v3"):  # no groups; always w / (sum w + 1e-20)
            p.update(scoring="sigmoid", renormalize=True,
                     scale=float(_get(cfg, "router_scaling_factor", 2.826)) if fam == "hy_v3" else 1.0)
        else:
            kimi = fam in _KIMI_NAMES
            g, k = (8, 4) if fam == "bailing_hybrid" else (1, 1)
            if fam == "axk2" and _get(cfg, "n_group", 1) > 1:
                raise ValueError("A.X-K2 with expert groups (its 0.0-filled group mask) is not modelled here")
            scale0 = {"glm_moe_dsa": 2.5, "kimi_linear": 2.446, "bailing_hybrid": 2.5, "axk2": 2.5,
                      "glm5_next": 2.5}.get(fam, 1.0)
            # Kimi / Bailing: their own names, else the attribute_map ones
            p.update(scoring="sigmoid",
                     renormalize=bool(_get(cfg, "moe_renormalize", _get(cfg, "norm_topk_prob", True)) if kimi
                                      else _get(cfg, "norm_topk_prob", True)),
                     scale=float(_get(cfg, "routed_scaling_factor", scale0)),
                     n_group=int(_get(cfg, "num_expert_group", _get(cfg, "n_group", g)) if kimi
                                 else _get(cfg, "n_group", g)),
                     topk_group=int(_get(cfg, "topk_group", k)), group_score="top2_sum")
    elif fam == "deepseek_v3":
        p.update(scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", True)),
                 scale=float(_get(cfg, "routed_scaling_factor", 2.5)), n_group=int(_get(cfg, "n_group", 8)),
                 topk_group=int(_get(cfg, "topk_group", 4)), group_score="top2_sum")
    elif fam in _V3_LIKE:
        # Glm4MoeTopkRouter and its copies: DeepSeek-V3's maths; the config classes' defaults
        # (n_group / topk_group 1, 8 / 4 for V3.2; routed_scaling_factor; norm_topk_prob true but
        # for dots1)
        g, k = (8, 4) if fam == "deepseek_v32" else (1, 1)
        scale0 = {"glm4_moe_lite": 1.8, "deepseek_v32": 2.5, "exaone_moe": 2.5}.get(fam, 1.0)
        p.update(scoring="sigmoid", renormalize=bool(_get(cfg, "norm_topk_prob", fam != "dots1")),
                 scale=float(_get(cfg, "routed_scaling_factor", scale0)), n_group=int(_get(cfg, "n_group", g)),
                 topk_group=int(_get(cfg, "topk_group", k)), group_score="top2_sum")
    elif fam in ("minimax", "qwen3_vl_moe"):
        p["renormalize"] = True  # their TopKRouters divide by the top-k sum unconditionally
    elif fam == "deepseek_v2":
        p["scale"] = float(_get(cfg, "routed_scaling_factor", 1.0))
        if _get(cfg, "topk_method", "greedy") == "group_limited_greedy":
            p.update(n_group=int(cfg["n_group"]), topk_group=int(cfg["topk_group"]))
    elif fam in ("gpt_oss", "granitemoe"):
        p["scoring"] = "topk_softmax"
    elif fam == "llama4":
        p.update(scoring="topk_sigmoid", on_input=True)
    elif fam in ("olmoe", "qwen3_next", "flex_olmo"):  # FlexOlmoTopKRouter: as OLMoE's
        p["renormalize"] = bool(_get(cfg, "norm_topk_prob", fam == "qwen3_next"))
    elif fam == "qwen3_5_moe":
        p["renormalize"] = True
    if fam == "glm5_next":
        # Glm5NextTextExperts._apply_gate and Glm5NextTextMLP: silu(min(g, L)) * clamp(u, -L, L)
        p.update(act="swiglu_clamp", limit=float(_get(cfg, "swiglu_limit", 10.0)))
    elif fam == "gpt_oss":
        p.update(act="swiglu_oai", alpha=float(_get(cfg, "swiglu_alpha", 1.702)),
                 limit=float(_get(cfg, "swiglu_limit", 7.0)))
    else:
        p["act"] = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh",
                    "gelu_new": "geglu_tanh"}[_get(cfg, "hidden_act", "silu")]

    moe, router_name = _prefix(ck, fam, layer)
    p["router"] = ck.get(router_name)
    if fam == "gpt_oss":
        p["router_bias"] = ck.get(moe + "router.bias")
    if v3 or fam in _FAM_A:  # K-EXAONE's checkpoints keep it beside the router, not under it
        bias = moe + ("e_score_correction_bias" if fam in ("exaone_moe", "minimax_m2") else
                      "expert_bias" if fam == "hy_v3" else "gate.expert_bias" if fam == "bailing_hybrid"
                      else "gate.e_score_correction_bias")
        p["sel_bias"] = ck.get(bias)
    if fam == "gpt_oss" and ck.has(moe + "experts.gate_up_proj_blocks"):
        gu = mxfp4_dequant(ck.get(moe + "experts.gate_up_proj_blocks"),
                           ck.get(moe + "experts.gate_up_proj_scales"))   # [E, 2I, H]
        p["w_gate"], p["w_up"] = gu[:, 0::2, :], gu[:, 1::2, :]
        p["w_down"] = mxfp4_dequant(ck.get(moe + "experts.down_proj_blocks"),
                                    ck.get(moe + "experts.down_proj_scales"))  # [E, H, I]
        b = ck.get(moe + "experts.gate_up_proj_bias")     # [E, 2I]
        p["biases"] = (b[:, 0::2], b[:, 1::2], ck.get(moe + "experts.down_proj_bias"))
    elif fam in ("gpt_oss", "llama4"):
        gu = ck.get(moe + "experts.gate_up_proj")            # [E, H, 2I]
        dn = ck.get(moe + "experts.down_proj")                # [E, I, H]
        if fam == "gpt_oss":
            p["w_gate"] = np.transpose(gu[:, :, 0::2], (0, 2, 1))
            p["w_up"] = np.transpose(gu[:, :, 1::2], (0, 2, 1))
            b = ck.get(moe + "experts.gate_up_proj_bias")     # [E, 2I]
            p["biases"] = (b[:, 0::2], b[:, 1::2], ck.get(moe + "experts.down_proj_bias"))
        else:
            p["w_gate"] = np.transpose(gu[:, :, :I], (0, 2, 1))
            p["w_up"] = np.transpose(gu[:, :, I:], (0, 2, 1))
        p["w_down"] = np.transpose(dn, (0, 2, 1))
    elif ck.has(moe + "experts.gate_up_proj") or ck.has(moe + "input_linear.weight"):
        inl = ck.has(moe + "input_linear.weight") and not ck.has(moe + "experts.gate_up_proj")
        gu = ck.get(moe + ("input_linear.weight" if inl else "experts.gate_up_proj"))
        p["w_gate"], p["w_up"] = gu[:, :I, :], gu[:, I:, :]
        p["w_down"] = ck.get(moe + ("output_linear.weight" if inl else "experts.down_proj"))
    else:
        g, u, dn = (("w1", "w3", "w2") if fam in ("minimax", "kimi_linear", "minimax_m2")
                    else ("gate_proj", "up_proj", "down_proj"))
        p["w_gate"] = np.stack([ck.get(f"{moe}experts.{e}.{g}.weight") for e in range(E)])
        p["w_up"] = np.stack([ck.get(f"{moe}experts.{e}.{u}.weight") for e in range(E)])
        p["w_down"] = np.stack([ck.get(f"{moe}experts.{e}.{dn}.weight") for e in range(E)])
    for k, shape in (("router", (E, H)), ("w_gate", (E, I, H)), ("w_up", (E, I, H)),
                     ("w_down", (E, H, I))):
        if tuple(p[k].shape) != shape:
            raise ValueError(f"layer {layer}: {k} has shape {p[k].shape}, expected {shape}")

    if fam in _FAM_A:
        key = "num_shared_experts" if fam in _KIMI_NAMES + ("hy_v3",) else "n_shared_experts"
        ns = 0 if fam == "minimax_m2" else cfg.get(key, cfg.get("n_shared_experts", 1) if fam in _KIMI_NAMES else 1)
        p["Is"] = int(ns or 0) * I
        s = moe + ("shared_mlp." if fam == "hy_v3" else "shared_experts.")
    elif fam in ("deepseek_v2", "deepseek_v3") + _V3_LIKE:
        key = "num_shared_experts" if fam == "exaone_moe" else "n_shared_experts"
        ns = cfg.get(key, {"deepseek_v2": 2, "dots1": 0, "mimo_v2_flash": 0}.get(fam, 1))
        p["Is"] = int(ns or 0) * I
        s = moe + "shared_experts."
    elif fam == "llama4":
        p["Is"], s = I, moe + "shared_expert."
    elif fam in ("qwen3_5_moe", "qwen3_next"):
        p["Is"], s = int(cfg.get("shared_expert_intermediate_size") or 0), moe + "shared_expert."
        p["shared_gated"] = True
    if p["Is"]:
        p["s_gate"] = ck.get(s + "gate_proj.weight")
        p["s_up"] = ck.get(s + "up_proj.weight")
        p["s_down"] = ck.get(s + "down_proj.weight")
        if p["shared_gated"]:
            p["s_expert_gate"] = ck.get(moe + "shared_expert_gate.weight")  # [1, H]
    return p


# e2m1 values by 4-bit code (OCP MX: bit 3 the sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6)
_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_dequant(blocks, scales):
    """gpt-oss MXFP4: blocks [E, N, K/32, 16] uint8, scales [E, N, K/32] uint8 (E8M0) ->
    w [E, N, K] float64, w[e, n, 32 g + j] = e2m1(code j of group g) * 2^(scale[e, n, g] - 127),
    code 2b in the low nibble of byte b, code 2b + 1 in the high nibble. Exact in float64."""
    E, N, G, B = blocks.shape
    if B != 16 or tuple(scales.shape) != (E, N, G):
        raise ValueError(f"MXFP4 blocks {blocks.shape} / scales {scales.shape}: expected [E, N, G, 16] / [E, N, G]")
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(E, N, G, 32)
    w = _E2M1[codes] * np.exp2(scales.astype(np.float64) - 127.0)[..., None]
    return w.reshape(E, N, G * 32)


def silu(v):
    return v / (1.0 + np.exp(-v))


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def expert(p, x, e):
    """x [n, H] -> [n, H] through expert e, with the family's activation and biases."""
    g, u = x @ p["w_gate"][e].T, x @ p["w_up"][e].T
    if p.get("biases") is not None:
        g, u = g + p["biases"][0][e], u + p["biases"][1][e]
    if p.get("act") == "swiglu_oai":
        lim, alpha = p["limit"], p["alpha"]
        g = np.minimum(g, lim)
        u = np.clip(u, -lim, lim)
        h = (u + 1.0) * (g * sigmoid(alpha * g))
    elif p.get("act") == "swiglu_clamp":
        lim = p["limit"]
        h = silu(np.minimum(g, lim)) * np.clip(u, -lim, lim)
    elif p.get("act") == "geglu":
        h = 0.5 * g * (1.0 + np.vectorize(math.erf)(g / math.sqrt(2.0))) * u
    elif p.get("act") == "geglu_tanh":
        h = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3))) * u
    else:
        h = silu(g) * u
    y = h @ p["w_down"][e].T
    if p.get("biases") is not None:
        y = y + p["biases"][2][e]
    return y


def swiglu(x, wg, wu, wd):
    """x [n, H] -> [n, H]: W_down (silu(W_gate x) * (W_up x))."""
    return (silu(x @ wg.T) * (x @ wu.T)) @ wd.T


def softmax(l):
    m = l.max(axis=-1, keepdims=True)
    e = np.exp(l - m)
    return e / e.sum(axis=-1, keepdims=True)


def topk_lower_id(scores, K):
    """Per row, the K largest scores in descending order, ties to the lower index."""
    # A stable sort of -scores keeps equal scores in index order.
    return np.argsort(-scores, axis=-1, kind="stable")[:, :K]


def route(p, x):
    """-> (logits [T, E], the selection key [T, E] after group masking ("probs" for the
    softmax families), ids [T, K], weights [T, K] before routed_scaling_factor)."""
    logits = x @ p["router"].T  # [T, E]
    if p.get("router_bias") is not None:
        logits = logits + p["router_bias"]
    scoring = p.get("scoring", "softmax")
    if scoring == "softmax":
        scores = softmax(logits)
    elif scoring == "sigmoid":
        scores = sigmoid(logits)
    else:
        scores = logits                       # top-k first, on the logits
    key = scores if p.get("sel_bias") is None else scores + p["sel_bias"]
    G = p.get("n_group", 1)
    if G > 1:
        T, E = key.shape
        kg = key.reshape(T, G, E // G)
        if p["group_score"] == "top2_sum":
            srt = -np.sort(-kg, axis=-1)
            gs = srt[:, :, 0] + srt[:, :, 1]
        else:
            gs = kg.max(axis=-1)
        kept = topk_lower_id(gs, p["topk_group"])
        mask = np.zeros((T, G), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=-1)
        key = np.where(np.repeat(mask, E // G, axis=-1), key, -np.inf)
    ids = topk_lower_id(key, p["K"])
    if scoring == "topk_softmax":
        w = softmax(np.take_along_axis(logits, ids, axis=-1))
    elif scoring == "topk_sigmoid":
        w = sigmoid(np.take_along_axis(logits, ids, axis=-1))
    else:
        w = np.take_along_axis(scores, ids, axis=-1)
    if p["renormalize"]:
        w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
    return logits, key, ids, w


def moe_forward(p, x):
    """x [T, H] (any float dtype, widened to float64) -> dict of float64/int arrays."""
    x = np.asarray(x, dtype=np.float64)
    logits, probs, ids, w = route(p, x)
    T, H = x.shape
    out = np.zeros((T, H))
    for e in range(p["E"]):
        rows, ks = np.nonzero(ids == e)
        if rows.size == 0:
            continue
        if p.get("on_input"):  # Llama-4: the weight scales the expert input, once
            np.add.at(out, rows, expert(p, w[rows, ks][:, None] * x[rows], e))
        else:
            np.add.at(out, rows, w[rows, ks][:, None] * expert(p, x[rows], e))
    out *= p.get("scale", 1.0)
    if p["Is"]:
        gate = 1.0
        if p.get("shared_gated", p.get("family") == "qwen2_moe"):
            gate = 1.0 / (1.0 + np.exp(-(x @ p["s_expert_gate"].T)))  # [T, 1]
        if p.get("act") == "swiglu_clamp":  # GLM-5-Next's shared expert clamps as its routed ones
            lim = p["limit"]
            g, u = x @ p["s_gate"].T, x @ p["s_up"].T
            out += gate * ((silu(np.minimum(g, lim)) * np.clip(u, -lim, lim)) @ p["s_down"].T)
        else:
            out += gate * swiglu(x, p["s_gate"], p["s_up"], p["s_down"])
    return {"output": out, "topk_ids": ids.astype(np.int32), "topk_weights": w,
            "router_logits": logits, "probs": probs}


def routing_margin(probs, K):
    """Smallest gap between consecutive sorted probabilities among the first min(K+1, E) of
    each row: a top-k is reproducible in f32 only where this is well above f32 rounding."""
    s = -np.sort(-probs, axis=-1)
    n = min(K + 1, s.shape[-1])
    if n < 2:
        return np.full(s.shape[0], np.inf)
    return (s[:, : n - 1] - s[:, 1:n]).min(axis=-1)


def run_checkpoint(ckpt_dir, layer, hidden_states):
    ck = Checkpoint(ckpt_dir)
    return moe_forward(layer_params(ck, layer), hidden_states)
