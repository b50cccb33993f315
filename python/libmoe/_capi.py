"""ctypes bindings (ABI mode, no compiler) for the parts of include/moe.h the package uses.

The structs mirror moe.h field for field; moe.h is the specification of every field.
"""
import ctypes as C
import os
import pathlib

_here = pathlib.Path(__file__).resolve().parent


def _candidates():
    env = os.environ.get("LIBMOE_LIBRARY")
    if env:
        yield env  # explicit: used alone when set
        return
    for name in ("libmoe.so", "libmoe.so.0"):
        p = _here / "_lib" / name  # bundled by setup.py when build/libmoe.so existed at install
        if p.exists():
            yield str(p)
    repo_build = _here.parent.parent / "build" / "libmoe.so"  # running from the repository
    if repo_build.exists():
        yield str(repo_build)
    yield "libmoe.so.0"  # the system loader (ldconfig, LD_LIBRARY_PATH)
    yield "libmoe.so"


def _load():
    tried = []
    for c in _candidates():
        try:
            return C.CDLL(c)
        except OSError as e:
            tried.append("%s (%s)" % (c, e))
    raise ImportError(
        "libmoe: the shared library libmoe.so was not found; tried: " + "; ".join(tried)
        + ". Build it in the repository root with `make` (or `cmake -S . -B build && "
        "cmake --build build`), then reinstall with `pip install ./python`, or point "
        "LIBMOE_LIBRARY at the file.")


lib = _load()

i32, i64, f32, vp, cp, sz = C.c_int, C.c_int64, C.c_float, C.c_void_p, C.c_char_p, C.c_size_t

STATUS_NAMES = ["MOE_OK", "MOE_EINVAL", "MOE_ENOMEM", "MOE_EIO", "MOE_EFORMAT", "MOE_ENOTFOUND",
                "MOE_ESHAPE", "MOE_EDTYPE", "MOE_EUNSUPPORTED", "MOE_ERANGE", "MOE_EDENSE",
                "MOE_EWORKSPACE", "MOE_ETIMEOUT", "MOE_EMPI", "MOE_ECANCELED"]
DT_F32, DT_BF16, DT_F16, DT_I32 = 0, 1, 2, 3

LOG_FN = C.CFUNCTYPE(None, i32, cp, vp)


class Options(C.Structure):
    _fields_ = [("num_threads", i32), ("isa", cp), ("chunk_size", i64), ("permute", cp),
                ("onehot_threshold", i64), ("topk", cp), ("lowtok_threshold", i64),
                ("small_allreduce", i64), ("tp_reduce", cp), ("tuning_dir", cp),
                ("log_level", i32), ("log_fn", vp), ("log_user", vp),
                ("pack_progress_fn", vp), ("pack_progress_user", vp)]


class QWeight(C.Structure):
    _fields_ = [("dtype", i32), ("scale", i32), ("block_n", i64), ("block_k", i64),
                ("group_size", i64), ("has_zero_point", i32)]


class QuantConfig(C.Structure):
    _fields_ = [("w13", QWeight), ("w2", QWeight), ("act", i32), ("act_group_size", i64)]


class LayerDesc(C.Structure):
    _fields_ = [("family", i32), ("hidden_size", i64), ("moe_intermediate_size", i64),
                ("num_experts", i64), ("top_k", i64), ("scoring_func", i32),
                ("renormalize", i32), ("routed_scaling_factor", f32), ("activation", i32),
                ("shared_expert_intermediate_size", i64), ("shared_expert_gated", i32),
                ("weight_dtype", i32), ("n_group", i64), ("topk_group", i64),
                ("group_score", i32), ("has_selection_bias", i32), ("has_router_bias", i32),
                ("has_expert_bias", i32), ("apply_router_weight_on_input", i32),
                ("swiglu_alpha", f32), ("swiglu_limit", f32), ("quant", QuantConfig),
                ("sparsemixer_jitter_eps", f32), ("has_output_bias", i32),
                # MOE_ACT_SWIGLU_SOFTCAP's constants, the shared expert's activation
                ("softcap_gate", f32), ("softcap_up", f32), ("has_shared_activation", i32),
                ("shared_activation", i32),
                # the block's output RMSNorm (A.X-K1)
                ("has_output_norm", i32), ("output_norm_eps", f32),
                # the renormalization's epsilon (LFM2-MoE 1e-6), the shared
                # expert's scale (Cohere2-MoE's "average": 0.5)
                ("renormalize_eps", f32), ("shared_expert_scale", f32),
                # identity ("zero") experts (LongCat-Flash)
                ("num_identity_experts", i64),
                # the shared expert's own clamp limit (Step-3.7)
                ("shared_swiglu_limit", f32),
                # the renormalization's p-norm (DBRX's moe_normalize_expert_weights; 1: the sum)
                ("renormalize_p", f32),
                # Switch Transformers' top-1 expert capacity (0: none)
                ("expert_capacity", i64)]


PP = C.POINTER(vp)


class WeightSource(C.Structure):
    _fields_ = [("router", vp), ("router_dtype", i32), ("gate_proj", PP), ("up_proj", PP),
                ("down_proj", PP), ("shared_gate_proj", vp), ("shared_up_proj", vp),
                ("shared_down_proj", vp), ("shared_expert_gate", vp),
                ("gate_up_stride_out", i64), ("gate_up_stride_in", i64),
                ("down_stride_out", i64), ("down_stride_in", i64),
                ("router_bias", vp), ("router_bias_dtype", i32),
                ("selection_bias", vp), ("selection_bias_dtype", i32),
                ("gate_bias", PP), ("up_bias", PP), ("down_bias", PP),
                ("expert_bias_dtype", i32), ("gate_up_bias_stride", i64),
                ("gate_scale", PP), ("up_scale", PP), ("down_scale", PP),
                ("gate_zero", PP), ("up_zero", PP), ("down_zero", PP),
                ("output_bias", vp), ("output_bias_dtype", i32),
                ("w13_input_scale", vp), ("w2_input_scale", vp),
                ("output_norm", vp), ("output_norm_dtype", i32)]


class StackedExperts(C.Structure):
    _fields_ = [("gate_up_proj", vp), ("down_proj", vp), ("gate_up_proj_bias", vp),
                ("down_proj_bias", vp), ("is_transposed", i32), ("is_concatenated", i32),
                ("has_bias", i32), ("bias_dtype", i32)]


class ExecArgs(C.Structure):
    _fields_ = [("hidden_states", vp), ("hidden_dtype", i32), ("n_tokens", i64),
                ("router_logits", vp), ("output", vp), ("topk_ids", vp), ("topk_weights", vp),
                ("workspace", vp), ("workspace_size", sz), ("stats", vp),
                ("in_topk_ids", vp), ("in_topk_weights", vp), ("output_dtype", i32),
                ("expert_load", vp),
                # sequence boundaries for expert_capacity: int64 [n_sequences]
                ("sequence_lengths", vp), ("n_sequences", i64)]


def _sig(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


R = C.POINTER
_sig("moe_options_init", None, R(Options))
_sig("moe_ctx_create", i32, R(Options), R(vp), C.c_char_p, sz)
_sig("moe_ctx_free", None, vp)
_sig("moe_ctx_last_error", cp, vp)
_sig("moe_ctx_num_threads", i32, vp)
_sig("moe_status_name", cp, i32)
_sig("moe_layer_desc_init", None, R(LayerDesc))
_sig("moe_family_name", cp, i32)
# moe_family value of every family name the library has a row for (moe.h: the values are dense
# from 1; "?" for a value without a row), read from the library so it never lags moe.h
FAMILIES = {"custom": 0}
for _v in range(1, 256):
    _n = lib.moe_family_name(_v)
    if _n and _n != b"?":
        FAMILIES[_n.decode()] = _v
_sig("moe_family_layer_defaults", i32, i32, R(LayerDesc))
_sig("moe_activation_gated", i32, i32)
_sig("moe_plan_create", i32, vp, R(LayerDesc), R(vp))
_sig("moe_plan_free", None, vp)
_sig("moe_plan_workspace_size", sz, vp, i64)
_sig("moe_plan_text", cp, vp)
_sig("moe_weights_create", i32, vp, R(WeightSource), R(vp))
_sig("moe_weights_free", None, vp)
_sig("moe_weights_expert_bytes", sz, vp)
_sig("moe_weight_source_from_stacked", i32, R(LayerDesc), R(StackedExperts), R(vp), sz,
     R(WeightSource), C.c_char_p, sz)
_sig("moe_plan_execute_ex", i32, vp, vp, R(ExecArgs))
_sig("moe_checkpoint_open", i32, vp, cp, R(vp))


class CheckpointOptions(C.Structure):
    """moe_checkpoint.h moe_checkpoint_options."""
    _fields_ = [("strict", C.c_int), ("family", cp), ("expert_set", cp)]


_sig("moe_checkpoint_open_opts", i32, vp, cp, R(CheckpointOptions), R(vp))
_sig("moe_checkpoint_free", None, vp)
_sig("moe_checkpoint_num_layers", i64, vp)
_sig("moe_checkpoint_layer_desc", i32, vp, i64, R(LayerDesc))
_sig("moe_checkpoint_load_weights", i32, vp, i64, vp, R(vp))
