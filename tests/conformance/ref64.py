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

Weights of any dtype (F32, BF16, F16) are widened exactly to float64, so the reference uses
the same rounded weights a bf16/f16 implementation sees. Tensor names: per-expert (what
transformers' save_pretrained writes) and stacked (transformers' in-memory layout,
experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]).
"""

import json
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


def family_of(cfg):
    arch = (cfg.get("architectures") or [""])[0]
    mt = cfg.get("model_type", "")
    if arch == "MixtralForCausalLM" or mt == "mixtral":
        return "mixtral"
    if arch == "Qwen2MoeForCausalLM" or mt == "qwen2_moe":
        return "qwen2_moe"
    if arch == "Qwen3MoeForCausalLM" or mt == "qwen3_moe":
        return "qwen3_moe"
    raise ValueError(f"unsupported architecture {arch!r} / model_type {mt!r}")


def is_moe_layer(cfg, family, layer):
    if family == "mixtral":
        return True
    if layer in (cfg.get("mlp_only_layers") or []):
        return False
    return (layer + 1) % int(cfg.get("decoder_sparse_step", 1)) == 0


def layer_params(ck, layer):
    """Sizes, routing settings and float64 weights of MoE layer `layer`."""
    cfg, fam = ck.config, ck.family
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


def silu(v):
    return v / (1.0 + np.exp(-v))


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
    logits = x @ p["router"].T  # [T, E]
    probs = softmax(logits)
    ids = topk_lower_id(probs, p["K"])
    w = np.take_along_axis(probs, ids, axis=-1)
    if p["renormalize"]:
        w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
    return logits, probs, ids, w


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
        y = swiglu(x[rows], p["w_gate"][e], p["w_up"][e], p["w_down"][e])
        np.add.at(out, rows, w[rows, ks][:, None] * y)
    if p["Is"]:
        gate = 1.0 / (1.0 + np.exp(-(x @ p["s_expert_gate"].T)))  # [T, 1]
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
