"""libmoe inside Hugging Face transformers models (transformers >= 5.0; written against 5.24).

Two integration modes, both running through one torch custom op, ``libmoe::experts``
(so a model works under torch.compile):

* ``import libmoe.transformers`` registers ``"libmoe"`` in transformers' ExpertsInterface:
  ``AutoModelForCausalLM.from_pretrained(dir, experts_implementation="libmoe")`` (or
  ``model.set_experts_implementation("libmoe")``) runs every experts module (the classes
  decorated with ``use_experts_implementation``) through libmoe. The model routes (its own
  router gives top_k_index / top_k_weights); libmoe runs the experts, packed lazily from the
  module's own parameters on its first call, honouring the decorator's layout flags
  (is_transposed, is_concatenated, has_bias) and the module's activation.
* ``patch(model, **options)`` replaces every sparse MoE block (router + experts + shared
  expert) of a loaded model with one libmoe layer, routed by libmoe's exact routing for the
  family (moe_family_layer_defaults and the model config), and returns how many it replaced.

Both free the original expert parameters once packed (each is replaced by an empty tensor of
its dtype), so resident expert memory is about 1x the packed bytes; ``memory_report(model)``
returns the bytes before and after (also logged at INFO on the "libmoe" logger).
Anything either mode cannot take raises a libmoe.Error subclass naming the class and what is
unsupported. docs/python.md describes both modes, the numerics and the thread settings.
"""
import itertools
import logging
from typing import Optional

import torch
from torch import nn

from transformers.integrations.moe import ExpertsInterface, _default_apply_gate

from .errors import InvalidArgumentError, UnsupportedError
from .layer import MoELayer

log = logging.getLogger("libmoe")

__all__ = ["patch", "pack", "release", "set_options", "memory_report", "experts_forward", "LibmoeSparseMoeBlock"]

# handle (int, baked into traced graphs as a constant) -> MoELayer. A module keeps its
# handle in `_libmoe_handle`; the layer lives as long as the process (a model's packed
# weights are freed with release(model)).
_LAYERS = {}
_next_handle = itertools.count(1)


def _register(layer):
    h = next(_next_handle)
    _LAYERS[h] = layer
    return h


# ---------------------------------------------------------------------------------------
# The custom op. hidden_states [T, H] f32/bf16 (CPU, contiguous); topk_ids [T, K] int32/int64
# and topk_weights [T, K] float (both or neither: neither = libmoe routes); handle: the layer.
# Returns a new [T, H] tensor of hidden_states' dtype.
# ---------------------------------------------------------------------------------------
@torch.library.custom_op("libmoe::experts", mutates_args=(), device_types="cpu")
def experts_op(hidden_states: torch.Tensor, topk_ids: Optional[torch.Tensor],
               topk_weights: Optional[torch.Tensor], handle: int) -> torch.Tensor:
    layer = _LAYERS.get(handle)
    if layer is None:
        raise InvalidArgumentError("MOE_EINVAL", "libmoe::experts: no libmoe layer has handle %d "
                                   "(released, or from another process)" % handle)
    return layer(hidden_states, topk_ids=topk_ids, topk_weights=topk_weights)


@experts_op.register_fake
def _experts_fake(hidden_states, topk_ids, topk_weights, handle):
    torch._check(hidden_states.dim() == 2, lambda: "libmoe::experts: hidden_states must be [T, H]")
    if topk_ids is not None:
        torch._check(topk_ids.dim() == 2 and topk_ids.shape[0] == hidden_states.shape[0],
                     lambda: "libmoe::experts: topk_ids must be [T, K]")
    return torch.empty_like(hidden_states, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------
# Mode 1: experts_implementation="libmoe"
# ---------------------------------------------------------------------------------------
_HIDDEN_ACT = {"silu": 0, "swish": 0, "gelu": 1, "gelu_pytorch_tanh": 2, "gelu_new": 2}
# non-gated experts (has_gate=False: h = act_fn(up_proj x)): the class of the module's act_fn
# (transformers/activations.py ACT2CLS) -> moe_activation (moe.h: MOE_ACT_RELU .. GELU_TANH)
_NONGATED_ACT = {"ReLU": 6, "ReLUSquaredActivation": 7, "GELUActivation": 8, "GELUTanh": 9,
                 "NewGELUActivation": 9}
_EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj", "gate_up_proj_bias", "up_proj_bias",
                  "down_proj_bias")


def _gated(experts):
    """transformers' use_experts_implementation(has_gate=...): True (the default) for
    gate_up_proj experts, False for up_proj-only (non-gated) ones (Nemotron-H)."""
    return bool(getattr(experts, "has_gate", True))


def _w1_name(experts):
    return "gate_up_proj" if _gated(experts) else "up_proj"


def _param_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _free(module, names):
    """Replace each named parameter / buffer of `module` by an empty tensor of its dtype (the
    storage goes when nothing else holds it)."""
    for n in names:
        p = getattr(module, n, None)
        if isinstance(p, torch.Tensor) and p.numel():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def _activation(experts, cls):
    """(activation, swiglu_alpha, swiglu_limit) of an experts module, from its _apply_gate and
    its config's hidden_act (non-gated experts: the class of its act_fn); UnsupportedError
    naming what is not libmoe's."""
    if not _gated(experts):
        fn = getattr(experts, "act_fn", None)
        name = type(fn).__name__
        if name not in _NONGATED_ACT:
            raise UnsupportedError("MOE_EUNSUPPORTED", "%s: non-gated experts with act_fn %s; libmoe's "
                                   "non-gated activations are relu, relu2, gelu, gelu_pytorch_tanh / "
                                   "gelu_new (%s)" % (cls, name, ", ".join(_NONGATED_ACT)))
        return _NONGATED_ACT[name], 1.702, 7.0
    gate = getattr(type(experts), "_apply_gate", _default_apply_gate)
    if gate is not _default_apply_gate:
        # gpt-oss's clamped SwiGLU (GptOssExperts._apply_gate): interleaved gate/up,
        # min(g, limit), clamp(u, +-limit), (u + 1) * g * sigmoid(alpha g) = MOE_ACT_SWIGLU_OAI
        if cls.endswith("GptOssExperts") and hasattr(experts, "alpha") and hasattr(experts, "limit"):
            return 3, float(experts.alpha), float(experts.limit)
        raise UnsupportedError("MOE_EUNSUPPORTED", "%s: its own _apply_gate (a gating libmoe "
                               "does not know); libmoe runs silu/gelu/gelu_tanh gated experts "
                               "and gpt-oss's clamped SwiGLU" % cls)
    act = getattr(getattr(experts, "config", None), "hidden_act", "silu")
    if act not in _HIDDEN_ACT:
        raise UnsupportedError("MOE_EUNSUPPORTED", "%s: hidden_act %r; libmoe's expert "
                               "activations are %s" % (cls, act, ", ".join(_HIDDEN_ACT)))
    return _HIDDEN_ACT[act], 1.702, 7.0


def _check_experts(experts):
    cls = type(experts).__name__
    for flag, bad, what in (("has_post_expert_norm", True, "a post-expert norm"),
                            ("_is_expert_parallel", True, "transformers' expert parallelism")):
        if getattr(experts, flag, not bad) == bad:
            raise UnsupportedError("MOE_EUNSUPPORTED", "%s: %s is not supported by libmoe" % (cls, what))
    for n in (_w1_name(experts), "down_proj"):
        p = getattr(experts, n, None)
        if not isinstance(p, torch.Tensor):
            raise UnsupportedError("MOE_EUNSUPPORTED", "%s has no %s tensor (quantized or "
                                   "per-expert experts modules are not supported)" % (cls, n))
        if p.device.type != "cpu":
            raise InvalidArgumentError("MOE_EINVAL", "%s.%s is on %s: libmoe runs on the CPU "
                                       "(load the model with device_map='cpu')" % (cls, n, p.device))
        if p.numel() == 0:
            raise InvalidArgumentError("MOE_EINVAL", "%s.%s is empty (already freed by "
                                       "libmoe, or not loaded)" % (cls, n))
    return cls


def _stacked_args(experts):
    """MoELayer keyword arguments for an experts module's stacked tensors (non-gated experts:
    their up_proj [E, I, H] goes in as gate_up_proj, as MoELayer takes it)."""
    has_bias = bool(getattr(experts, "has_bias", False))
    w1 = _w1_name(experts)
    kw = dict(gate_up_proj=getattr(experts, w1).detach().contiguous(),
              down_proj=experts.down_proj.detach().contiguous(),
              is_transposed=bool(getattr(experts, "is_transposed", False)),
              is_concatenated=bool(getattr(experts, "is_concatenated", True)))
    if has_bias:
        kw["gate_up_proj_bias"] = getattr(experts, w1 + "_bias").detach().contiguous()
        kw["down_proj_bias"] = experts.down_proj_bias.detach().contiguous()
    return kw


def _record(module, layer, before, what):
    module._libmoe_handle = _register(layer)
    module._libmoe_bytes = (before, layer.expert_bytes)
    log.info("libmoe: %s packed: expert parameters %d bytes before, %d bytes packed "
             "(originals freed)", what, before, layer.expert_bytes)


@torch.compiler.disable
def _build_experts(experts, top_k, options):
    cls = _check_experts(experts)
    act, alpha, limit = _activation(experts, cls)
    kw = _stacked_args(experts)
    gu = kw["gate_up_proj"]
    E = gu.shape[0]
    H = gu.shape[1] if kw["is_transposed"] else gu.shape[2]
    # Routing is given on every call (moe_exec_args.in_topk_ids), so the router is never run;
    # moe_weights_create still takes one: zeros [E, H] f32 (E * H * 4 bytes, not counted as
    # expert bytes). routed_scaling_factor stays 1: transformers' routers return weights
    # with it already applied (moe.h, in_topk_weights). The shared expert, when the block
    # has one, stays the model's (transformers runs it outside the experts module).
    router = torch.zeros(E, H, dtype=torch.float32)
    before = _param_bytes([getattr(experts, n, None) for n in _EXPERT_PARAMS])
    layer = MoELayer(router, top_k=top_k, family="custom",
                     desc={"activation": act, "swiglu_alpha": alpha, "swiglu_limit": limit},
                     **kw, **options)
    del kw, gu
    _free(experts, _EXPERT_PARAMS)
    _record(experts, layer, before, cls)
    return experts._libmoe_handle


# options for the lazily built layers of experts_implementation="libmoe" (moe_options
# fields); set_options() changes them for modules not yet packed.
_EXPERTS_OPTIONS = {}


def set_options(**options):
    """moe_options fields (num_threads, isa, chunk_size, ...) for the experts modules that
    experts_implementation="libmoe" packs from now on (docs/python.md)."""
    _EXPERTS_OPTIONS.clear()
    _EXPERTS_OPTIONS.update(options)


def _check_device(module, x):
    if x.device.type != "cpu":
        raise InvalidArgumentError("MOE_EINVAL", "%s: hidden_states is on %s: libmoe runs on the "
                                   "CPU (move the model and inputs with .cpu())"
                                   % (type(module).__name__, x.device))


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts interface (integrations/moe.py): hidden_states [T, H],
    top_k_index [T, K] int64, top_k_weights [T, K] -> [T, H] of hidden_states' dtype."""
    _check_device(self, hidden_states)
    h = self.__dict__.get("_libmoe_handle")
    if h is None:
        h = _build_experts(self, int(top_k_index.shape[-1]), dict(_EXPERTS_OPTIONS))
    return torch.ops.libmoe.experts(hidden_states.contiguous(), top_k_index, top_k_weights, h)


ExpertsInterface.register("libmoe", experts_forward)


def pack(model, **options):
    """Pack now every experts module of `model` that experts_implementation="libmoe" would
    pack on its first call (so no packing happens inside a torch.compile trace or a timed
    run); top_k from the config's num_experts_per_tok. `options`: moe_options fields.
    Returns the number of modules packed."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = 0
    for m in model.modules():
        if hasattr(m, "has_gate") and hasattr(m, _w1_name(m)) and \
                m.__dict__.get("_libmoe_handle") is None:
            if getattr(m.config, "_experts_implementation", None) != "libmoe":
                raise InvalidArgumentError("MOE_EINVAL", "pack: %s runs experts_implementation=%r;"
                                           " load the model with experts_implementation='libmoe'"
                                           % (type(m).__name__, m.config._experts_implementation))
            _build_experts(m, int(cfg.num_experts_per_tok), dict(_EXPERTS_OPTIONS, **options))
            n += 1
    return n


# ---------------------------------------------------------------------------------------
# Mode 2: patch(model)
# ---------------------------------------------------------------------------------------
# Sparse MoE block classes (transformers 5.24 modeling files) -> how libmoe takes them:
# family (moe_family_layer_defaults), the router and experts attribute names, the shared
# expert attribute (an MLP with gate_proj / up_proj / down_proj) and its gate, and whether
# forward returns (hidden_states, router_scores) (gpt-oss).
_BLOCKS = {
    "MixtralSparseMoeBlock": dict(family="mixtral", router="gate"),
    "Qwen2MoeSparseMoeBlock": dict(family="qwen2_moe", router="gate", shared="shared_expert",
                                   shared_gate="shared_expert_gate"),
    "Qwen3MoeSparseMoeBlock": dict(family="qwen3_moe", router="gate"),
    "OlmoeSparseMoeBlock": dict(family="olmoe", router="gate"),
    "DeepseekV3MoE": dict(family="deepseek_v3", router="gate", shared="shared_experts"),
    "GptOssMLP": dict(family="gpt_oss", router="router", returns_scores=True),
    # non-gated experts and shared MLP (NemotronHMLP: up_proj, down_proj); the block adds the
    # shared output to the experts' (moe_latent_size, the fc1 / fc2 latent projections, refused)
    "NemotronHMoE": dict(family="nemotron_h", router="gate", shared="shared_experts"),
}


def _routing_desc(family, cfg, router):
    """moe_layer_desc overrides from the model config (the fields moe.h's family list names)."""
    d = {}
    if family in ("qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "nemotron_h"):
        d["renormalize"] = int(bool(getattr(cfg, "norm_topk_prob", False)))
    if family in ("deepseek_v3", "nemotron_h"):
        d["routed_scaling_factor"] = float(cfg.routed_scaling_factor)
        n_group = int(getattr(cfg, "n_group", 1) or 1)
        d["n_group"], d["topk_group"] = n_group, int(getattr(cfg, "topk_group", 1) or 1)
    if family == "gpt_oss":
        d["swiglu_alpha"] = float(getattr(cfg, "swiglu_alpha", 1.702))
        d["swiglu_limit"] = float(getattr(cfg, "swiglu_limit", 7.0))
    return d


class LibmoeSparseMoeBlock(nn.Module):
    """A sparse MoE block replaced by patch(): the whole block (router, experts, shared
    expert) is one libmoe layer. forward(hidden_states [..., H]) -> [..., H] (gpt-oss:
    (hidden_states, None); the router scores are not materialized)."""

    def __init__(self, handle, original_class, returns_scores):
        super().__init__()
        self._libmoe_handle = handle
        self.original_class = original_class
        self.returns_scores = returns_scores

    def forward(self, hidden_states):
        _check_device(self, hidden_states)
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1]).contiguous()
        y = torch.ops.libmoe.experts(x, None, None, self._libmoe_handle).view(shape)
        return (y, None) if self.returns_scores else y

    def extra_repr(self):
        return "libmoe layer %d (was %s)" % (self._libmoe_handle, self.original_class)


def _t(x):
    return None if x is None else x.detach().contiguous()


def _patch_block(block, spec, cfg, options):
    cls = type(block).__name__
    family = spec["family"]
    experts = block.experts
    _check_experts(experts)
    act, alpha, limit = _activation(experts, type(experts).__name__)
    router = getattr(block, spec["router"])
    kw = _stacked_args(experts)
    top_k = int(getattr(router, "top_k", getattr(cfg, "num_experts_per_tok", 0)))
    desc = _routing_desc(family, cfg, router)
    desc["activation"] = act
    if act == 3:
        desc["swiglu_alpha"], desc["swiglu_limit"] = alpha, limit
    if getattr(router, "bias", None) is not None:
        kw["router_bias"] = _t(router.bias)
    if getattr(router, "e_score_correction_bias", None) is not None:
        kw["selection_bias"] = _t(router.e_score_correction_bias)
    if getattr(router, "weight", None) is None or router.weight.numel() == 0:
        raise UnsupportedError("MOE_EUNSUPPORTED", "%s: its router %s has no weight"
                               % (cls, type(router).__name__))
    for n in ("fc1_latent_proj", "fc2_latent_proj"):
        if not isinstance(getattr(block, n, nn.Identity()), nn.Identity):
            raise UnsupportedError("MOE_EUNSUPPORTED", "%s: %s (moe_latent_size: the experts run in a "
                                   "latent space) is not supported by libmoe" % (cls, n))
    sh = spec.get("shared")
    tensors = [router.weight, getattr(router, "bias", None)] + \
        [getattr(experts, n, None) for n in _EXPERT_PARAMS]
    if sh:
        mlp = getattr(block, sh)
        for n in (("gate_proj", "up_proj", "down_proj") if _gated(experts) else ("up_proj", "down_proj")):
            lin = getattr(mlp, n)
            if getattr(lin, "bias", None) is not None:
                raise UnsupportedError("MOE_EUNSUPPORTED", "%s: shared expert %s has a bias" % (cls, n))
            kw["shared_" + n] = _t(lin.weight)
            tensors.append(lin.weight)
        if spec.get("shared_gate"):
            g = getattr(block, spec["shared_gate"])
            kw["shared_expert_gate"] = _t(g.weight)
            tensors.append(g.weight)
    before = _param_bytes(tensors)
    layer = MoELayer(_t(router.weight), top_k=top_k, family=family, desc=desc, **kw, **options)
    del kw
    for m in block.modules():
        _free(m, [n for n, _ in m.named_parameters(recurse=False)] +
              [n for n, _ in m.named_buffers(recurse=False)])
    new = LibmoeSparseMoeBlock(0, cls, bool(spec.get("returns_scores")))
    _record(new, layer, before, cls)
    return new


def patch(model, **options):
    """Replace every sparse MoE block of `model` (a transformers PreTrainedModel on the CPU)
    with a LibmoeSparseMoeBlock: router, experts and shared expert in one libmoe layer
    (family routing defaults + the config's norm_topk_prob, routed_scaling_factor, n_group,
    topk_group, swiglu_alpha / swiglu_limit; the router's bias and e_score_correction_bias).
    `options` are moe_options fields (num_threads defaults to torch.get_num_threads()).
    Returns the number of blocks replaced. A module holding an experts module that is not a
    block libmoe knows raises UnsupportedError naming its class (nothing is skipped); the
    blocks replaced before the error stay replaced."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        raise InvalidArgumentError("MOE_EINVAL", "patch: %s has no config (pass a transformers "
                                   "model)" % type(model).__name__)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    todo = []
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if cls in _BLOCKS:
            todo.append((name, mod, _BLOCKS[cls]))
        elif any(n == "experts" or n.endswith(".experts") for n, _ in mod.named_children()) \
                and not any(name.startswith(t + ".") or name == t for t, _, _ in todo):
            raise UnsupportedError("MOE_EUNSUPPORTED", "patch: %s (%s) is a MoE block libmoe "
                                   "does not take; supported: %s" % (cls, name or "<model>",
                                                                     ", ".join(_BLOCKS)))
    if not todo:
        raise UnsupportedError("MOE_EUNSUPPORTED", "patch: %s has no sparse MoE block libmoe "
                               "knows (supported: %s)" % (type(model).__name__, ", ".join(_BLOCKS)))
    for name, mod, spec in todo:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, _patch_block(mod, spec, cfg, options))
    return len(todo)


def memory_report(model):
    """Bytes of the MoE layers libmoe packed in `model` (either mode): a dict with modules
    (count), original_bytes (the expert parameters before packing; patch(): router, experts
    and shared expert), packed_bytes (moe_weights_expert_bytes: w13 + w2 + shared), and
    remaining_original_bytes (what the packed modules still hold of the originals: 0 once
    freed). Modules not yet packed (experts_implementation="libmoe" packs on first call)
    are not counted."""
    r = {"modules": 0, "original_bytes": 0, "packed_bytes": 0, "remaining_original_bytes": 0}
    for m in model.modules():
        b = m.__dict__.get("_libmoe_bytes")
        if b is None:
            continue
        r["modules"] += 1
        r["original_bytes"] += b[0]
        r["packed_bytes"] += b[1]
        r["remaining_original_bytes"] += _param_bytes(list(m.parameters()) + list(m.buffers()))
    log.info("libmoe: memory_report: %d modules, %d bytes of original expert weights, %d bytes "
             "packed, %d original bytes still resident", r["modules"], r["original_bytes"],
             r["packed_bytes"], r["remaining_original_bytes"])
    return r


def release(model):
    """Free the packed libmoe layers of `model` (its libmoe modules stop working)."""
    n = 0
    for m in model.modules():
        h = m.__dict__.get("_libmoe_handle")
        if h:
            m._libmoe_handle = 0  # no layer: a later call raises InvalidArgumentError
            lay = _LAYERS.pop(h, None)
            if lay is not None:
                lay.close()
                n += 1
    return n
