"""libmoe.MoELayer: one MoE layer (plan + packed weights) called on numpy arrays or torch
tensors. Semantics are moe.h's (moe_plan_execute_ex); this module only checks and passes
pointers (zero-copy: __array_interface__ for numpy, data_ptr() for torch)."""
import ctypes as C
import operator
import sys

import numpy as np

from . import _capi as A
from .errors import make, Error, InvalidArgumentError, DtypeError, ShapeError


def _status_name(s):
    return A.lib.moe_status_name(s).decode()


def _is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _default_threads():
    t = sys.modules.get("torch")
    return t.get_num_threads() if t is not None else 0


class _Buf:
    """A host buffer's pointer and moe dtype, checked: C-contiguous, on the CPU, the dtype
    one of `allowed` (names "f32", "bf16", "f16", "i32"), the given shape."""

    _NP = {np.dtype(np.float32): ("f32", A.DT_F32), np.dtype(np.float16): ("f16", A.DT_F16),
           np.dtype(np.int32): ("i32", A.DT_I32)}

    def __init__(self, what, x, allowed, shape=None):
        if _is_torch(x):
            import torch
            if x.device.type != "cpu":
                raise InvalidArgumentError("MOE_EINVAL", "%s is on %s: libmoe runs on the CPU "
                                           "(move it with .cpu())" % (what, x.device))
            m = {torch.float32: ("f32", A.DT_F32), torch.bfloat16: ("bf16", A.DT_BF16),
                 torch.float16: ("f16", A.DT_F16), torch.int32: ("i32", A.DT_I32)}
            name, dt = m.get(x.dtype, (str(x.dtype), None))
            contig = x.is_contiguous()
            shp = tuple(x.shape)
            self.ptr = x.data_ptr()
        elif isinstance(x, np.ndarray):
            name, dt = self._NP.get(x.dtype, (str(x.dtype), None))
            contig = x.flags["C_CONTIGUOUS"]
            shp = x.shape
            self.ptr = x.__array_interface__["data"][0]
        else:
            raise InvalidArgumentError("MOE_EINVAL", "%s is a %s: pass a numpy array or a "
                                       "torch tensor" % (what, type(x).__name__))
        if name not in allowed:
            raise DtypeError("MOE_EDTYPE", "%s has dtype %s; expected %s"
                             % (what, name, " or ".join(allowed)))
        if shape is not None and shp != tuple(shape):
            raise ShapeError("MOE_ESHAPE", "%s has shape %s; expected %s"
                             % (what, list(shp), list(shape)))
        if not contig:
            raise InvalidArgumentError("MOE_EINVAL", "%s is not contiguous (call "
                                       ".contiguous() / np.ascontiguousarray)" % what)
        self.obj, self.name, self.dtype, self.shape = x, name, dt, shp


def _check_i32_range(ids):
    """int64 topk_ids are narrowed to int32 for libmoe: a value that does not fit would wrap to
    another expert id, so it is refused here, naming the token, the slot and the value."""
    a = np.asarray(ids)
    if a.size == 0:
        return
    bad = np.flatnonzero((a < np.iinfo(np.int32).min) | (a > np.iinfo(np.int32).max))
    if bad.size:
        t, k = np.unravel_index(bad[0], a.shape) if a.ndim == 2 else (bad[0], 0)
        raise InvalidArgumentError("MOE_EINVAL", "topk_ids[%d][%d] = %d does not fit int32 (libmoe expert ids are int32 "
                         "in [0, num_experts))" % (t, k, int(a.reshape(-1)[bad[0]])))


class MoELayer:
    """One MoE layer packed by libmoe.

    Build with MoELayer.from_checkpoint(path, layer) or MoELayer(...) from arrays; call on
    hidden_states [T, H] (numpy f32, torch f32 or bf16) to get the layer output [T, H] of
    the same kind and dtype. Errors raise libmoe.Error subclasses.

    Options (**options) are moe_options fields (moe.h): num_threads (default
    torch.get_num_threads() when torch is imported, else libmoe's default), isa, chunk_size,
    permute, topk, lowtok_threshold, onehot_threshold, tuning_dir, log_level.
    """

    def __init__(self, router, gate_up_proj, down_proj, *, top_k, family="custom",
                 is_transposed=False, is_concatenated=True, gate_up_proj_bias=None,
                 down_proj_bias=None, router_bias=None, selection_bias=None,
                 shared_gate_proj=None, shared_up_proj=None, shared_down_proj=None,
                 shared_expert_gate=None, desc=None, **options):
        """From arrays, in transformers' stacked layout (moe_stacked_experts in moe.h):
        router [E, H]; gate_up_proj [E, 2I, H] (is_transposed: [E, H, 2I]), gate then up
        halves (is_concatenated) or interleaved; down_proj [E, H, I] (is_transposed:
        [E, I, H]); optional gate_up_proj_bias [E, 2I], down_proj_bias [E, H] (gpt-oss),
        router_bias [E], selection_bias [E] (DeepSeek-V3), shared expert [I_s, H], [I_s, H],
        [H, I_s] and shared_expert_gate [1, H]. Experts f32, bf16 or f16 (one dtype);
        router f32/bf16/f16. `family` (moe_family_name) sets the routing defaults
        (moe_family_layer_defaults); `desc` is a dict of moe_layer_desc fields that override
        them (renormalize, scoring_func, routed_scaling_factor, n_group, ...). The arrays
        are copied while packing and may be freed afterwards.
        Non-gated experts (the activation, from `family` or desc["activation"], is one of
        moe.h's non-gated ones, relu / relu2 / gelu / gelu_tanh: Nemotron-H's
        NemotronHExperts, transformers' has_gate=False): gate_up_proj is the experts'
        up_proj alone, [E, I, H] (is_transposed: [E, H, I]), its bias [E, I]; a shared
        expert is non-gated too: shared_up_proj [I_s, H] and shared_down_proj [H, I_s],
        no shared_gate_proj.
        Identity experts (LongCat-Flash, moe.h num_identity_experts): a router [E + Z, H] with
        down_proj [E, H, I] gives Z = its extra rows; gate_up_proj may then be [E, 2I, H] or
        transformers' LongcatFlashExperts [E + Z, 2I, H] (the last Z never read); router_bias
        and selection_bias are [E + Z]; topk ids >= E are identity terms w * x."""
        self._open(options)
        ok = False
        try:
            r = _Buf("router", router, ("f32", "bf16", "f16"))
            if len(r.shape) != 2:
                raise ShapeError("MOE_ESHAPE", "router has shape %s; expected [E, H]" % list(r.shape))
            ER, H = r.shape  # E + Z router rows
            dn0 = _Buf("down_proj", down_proj, ("f32", "bf16", "f16"))
            E = dn0.shape[0] if len(dn0.shape) == 3 else ER
            Z = ER - E  # identity experts: the router's rows beyond down_proj's experts
            if Z < 0:
                raise ShapeError("MOE_ESHAPE", "router has %d rows, fewer than down_proj's %d experts" % (ER, E))
            d = A.LayerDesc()
            A.lib.moe_layer_desc_init(C.byref(d))
            fam = A.FAMILIES.get(family)
            if fam is None:
                raise InvalidArgumentError("MOE_EINVAL", "family %r is unknown; one of %s"
                                           % (family, ", ".join(A.FAMILIES)))
            if fam:
                self._check(A.lib.moe_family_layer_defaults(fam, C.byref(d)))
            # gated experts (gate_up_proj [E, 2I, H]) or non-gated (up_proj alone, [E, I, H]):
            # the family's activation unless desc sets one
            act = (desc or {}).get("activation", d.activation)
            gated = bool(A.lib.moe_activation_gated(int(act)))
            w1 = "2I" if gated else "I"
            gu = _Buf("gate_up_proj", gate_up_proj, ("f32", "bf16", "f16"))
            if len(gu.shape) != 3 or gu.shape[0] not in (E, ER):
                raise ShapeError("MOE_ESHAPE", "gate_up_proj has shape %s; expected [E=%d, %s, H]%s"
                                 % (list(gu.shape), E, w1, "" if gated else
                                    " (non-gated experts: their up_proj)"))
            EG = gu.shape[0]
            n_w1 = gu.shape[2] if is_transposed else gu.shape[1]
            I = n_w1 // 2 if gated else n_w1
            if (gated and n_w1 % 2) or I == 0:
                raise ShapeError("MOE_ESHAPE", "gate_up_proj's output dimension %d is not %s"
                                 % (n_w1, w1))
            gshape = (EG, H, n_w1) if is_transposed else (EG, n_w1, H)
            dshape = (E, I, H) if is_transposed else (E, H, I)
            gu = _Buf("gate_up_proj", gate_up_proj, ("f32", "bf16", "f16"), gshape)
            dn = _Buf("down_proj", down_proj, (gu.name,), dshape)
            d.hidden_size, d.moe_intermediate_size, d.num_experts, d.top_k = H, I, E, top_k
            d.weight_dtype = gu.dtype
            if shared_up_proj is not None:
                d.shared_expert_intermediate_size = _Buf(
                    "shared_up_proj", shared_up_proj, (gu.name,)).shape[0]
            elif shared_gate_proj is not None or shared_down_proj is not None:
                raise InvalidArgumentError("MOE_EINVAL", "a shared expert needs shared_up_proj "
                                           "(and shared_down_proj%s)" % (", shared_gate_proj" if gated else ""))
            d.num_identity_experts = Z  # the router's shape decides (LongCat's default 256 is a config's)
            d.has_router_bias = int(router_bias is not None)
            d.has_selection_bias = int(selection_bias is not None)
            d.has_expert_bias = int(gate_up_proj_bias is not None)
            d.shared_expert_gated = int(shared_expert_gate is not None)
            for k, v in (desc or {}).items():
                if not hasattr(d, k):
                    raise InvalidArgumentError("MOE_EINVAL", "desc has no field %r" % k)
                setattr(d, k, v)
            self._plan_from(d)
            src = A.WeightSource()
            src.router, src.router_dtype = r.ptr, r.dtype
            st = A.StackedExperts()
            st.gate_up_proj, st.down_proj = gu.ptr, dn.ptr
            st.is_transposed, st.is_concatenated = int(is_transposed), int(is_concatenated)
            keep = [r, gu, dn]
            if gate_up_proj_bias is not None:
                b1 = _Buf("gate_up_proj_bias", gate_up_proj_bias, ("f32", "bf16", "f16"), (E, n_w1))
                b2 = _Buf("down_proj_bias", down_proj_bias, (b1.name,), (E, H))
                st.gate_up_proj_bias, st.down_proj_bias = b1.ptr, b2.ptr
                st.has_bias, st.bias_dtype = 1, b1.dtype
                keep += [b1, b2]
            ptrs = (C.c_void_p * (6 * E))()
            err = C.create_string_buffer(512)
            s = A.lib.moe_weight_source_from_stacked(C.byref(d), C.byref(st), ptrs, 6 * E,
                                                     C.byref(src), err, 512)
            if s:
                raise make(_status_name(s), err.value.decode(errors="replace"))
            for name, x, shape in (("router_bias", router_bias, (ER,)),
                                   ("selection_bias", selection_bias, (ER,))):
                if x is not None:
                    b = _Buf(name, x, ("f32", "bf16", "f16"), shape)
                    setattr(src, name, b.ptr)
                    setattr(src, name + "_dtype", b.dtype)
                    keep.append(b)
            if shared_up_proj is not None:
                Is = d.shared_expert_intermediate_size
                sh_gated = bool(A.lib.moe_activation_gated(int(
                    d.shared_activation if d.has_shared_activation else d.activation)))
                parts = ((("shared_gate_proj", shared_gate_proj, (Is, H)),) if sh_gated else ()) + \
                    (("shared_up_proj", shared_up_proj, (Is, H)),
                     ("shared_down_proj", shared_down_proj, (H, Is)))
                if not sh_gated and shared_gate_proj is not None:
                    raise InvalidArgumentError("MOE_EINVAL", "shared_gate_proj is given but the shared "
                                               "expert's activation is non-gated (it has no gate)")
                for name, x, shape in parts:
                    if x is None:
                        raise InvalidArgumentError("MOE_EINVAL", "%s is missing" % name)
                    b = _Buf(name, x, (gu.name,), shape)
                    setattr(src, name, b.ptr)
                    keep.append(b)
            if shared_expert_gate is not None:
                b = _Buf("shared_expert_gate", shared_expert_gate, (r.name,), (1, H))
                src.shared_expert_gate = b.ptr
                keep.append(b)
            w = C.c_void_p()
            self._check(A.lib.moe_weights_create(self._plan, C.byref(src), C.byref(w)))
            self._weights = w
            ok = True
        finally:
            if not ok:
                self.close()

    @classmethod
    def from_checkpoint(cls, path, layer, *, expert_set=None, **options):
        """Layer `layer` of the Hugging Face checkpoint folder `path` (config.json +
        safetensors; moe_checkpoint_open). `expert_set` (moe_checkpoint_options.expert_set):
        the expert set of a block with one per token modality (ernie4_5_vl_moe: "text", the
        default, or "vision"); None: the family's first. Errors: those of moe_checkpoint_open,
        moe_checkpoint_layer_desc (RangeError, DenseLayerError, ...) and
        moe_checkpoint_load_weights, as libmoe.Error subclasses; a `layer` that is not an
        integer (a str, a float, a bool) is InvalidArgumentError, not silently converted."""
        if isinstance(layer, bool):
            raise InvalidArgumentError("MOE_EINVAL", "layer must be an integer, got bool %r" % layer)
        try:
            layer = operator.index(layer)
        except TypeError:
            raise InvalidArgumentError(
                "MOE_EINVAL", "layer must be an integer, got %s %r" % (type(layer).__name__, layer)) from None
        if not -(1 << 63) <= layer < (1 << 63):
            raise InvalidArgumentError("MOE_EINVAL", "layer %d does not fit in int64" % layer)
        self = cls.__new__(cls)
        self._open(options)
        ok = False
        ck = C.c_void_p()
        try:
            opt = A.CheckpointOptions(0, None, None if expert_set is None else str(expert_set).encode())
            self._check(A.lib.moe_checkpoint_open_opts(self._ctx, str(path).encode(), C.byref(opt), C.byref(ck)))
            d = A.LayerDesc()
            self._check(A.lib.moe_checkpoint_layer_desc(ck, int(layer), C.byref(d)))
            self._plan_from(d)
            w = C.c_void_p()
            self._check(A.lib.moe_checkpoint_load_weights(ck, int(layer), self._plan, C.byref(w)))
            self._weights = w
            ok = True
        finally:
            if ck.value:
                A.lib.moe_checkpoint_free(ck)
            if not ok:
                self.close()
        return self

    # --- internals -------------------------------------------------------------------
    def _open(self, options):
        self._ctx = self._plan = self._weights = None
        self._ws = None
        o = A.Options()
        A.lib.moe_options_init(C.byref(o))
        options = dict(options)
        options.setdefault("num_threads", _default_threads())
        self._keep_opts = []
        for k, v in options.items():
            if k in ("log_fn", "log_user") or not hasattr(o, k):
                raise InvalidArgumentError("MOE_EINVAL", "unknown option %r" % k)
            if isinstance(v, str):
                v = v.encode()
                self._keep_opts.append(v)
            setattr(o, k, v)
        ctx = C.c_void_p()
        err = C.create_string_buffer(512)
        s = A.lib.moe_ctx_create(C.byref(o), C.byref(ctx), err, 512)
        if s:
            raise make(_status_name(s), err.value.decode(errors="replace"))
        self._ctx = ctx

    def _check(self, s):
        if s:
            msg = A.lib.moe_ctx_last_error(self._ctx) or b""
            raise make(_status_name(s), msg.decode(errors="replace"))

    def _plan_from(self, d):
        p = C.c_void_p()
        self._check(A.lib.moe_plan_create(self._ctx, C.byref(d), C.byref(p)))
        self._plan = p
        self.hidden_size, self.num_experts, self.top_k = d.hidden_size, d.num_experts, d.top_k
        self.moe_intermediate_size = d.moe_intermediate_size

    def close(self):
        """Free the packed weights, plan and context (also done at garbage collection)."""
        if getattr(self, "_weights", None):
            A.lib.moe_weights_free(self._weights)
        if getattr(self, "_plan", None):
            A.lib.moe_plan_free(self._plan)
        if getattr(self, "_ctx", None):
            A.lib.moe_ctx_free(self._ctx)
        self._ctx = self._plan = self._weights = None

    __del__ = close

    @property
    def expert_bytes(self):
        """Bytes of packed expert weights (moe_weights_expert_bytes)."""
        return A.lib.moe_weights_expert_bytes(self._weights)

    @property
    def plan_text(self):
        return A.lib.moe_plan_text(self._plan).decode()

    @property
    def num_threads(self):
        return A.lib.moe_ctx_num_threads(self._ctx)

    def __call__(self, hidden_states, topk_ids=None, topk_weights=None, sequence_lengths=None):
        """hidden_states [T, H]: numpy float32, or a CPU torch tensor float32 / bfloat16,
        C-contiguous. topk_ids [T, K] (int32, or int64 converted) and topk_weights [T, K]
        (float32, other floats converted), both or neither: caller-given routing (moe.h
        moe_exec_args.in_topk_ids; ids in [0, E + Z) or -1, an empty slot, and distinct per
        token, else InvalidArgumentError naming token and slot). sequence_lengths: the T tokens
        as consecutive sequences of these lengths (ints >= 0 summing to T; moe.h
        moe_exec_args.sequence_lengths), where a layer with an expert capacity
        (switch_transformers' expert_capacity) counts each expert's tokens; [S] * B for
        transformers' [B, S, H] batch. Needed by such a layer when T exceeds its capacity;
        read by no other. Returns [T, H] of hidden_states' kind and dtype, a new array."""
        if self._plan is None:
            raise InvalidArgumentError("MOE_EINVAL", "the layer is closed")
        x = _Buf("hidden_states", hidden_states, ("f32", "bf16"))
        if len(x.shape) != 2 or x.shape[1] != self.hidden_size:
            raise ShapeError("MOE_ESHAPE", "hidden_states has shape %s; expected [T, H=%d]"
                             % (list(x.shape), self.hidden_size))
        T = x.shape[0]
        if _is_torch(hidden_states):
            import torch
            out = torch.empty((T, self.hidden_size), dtype=hidden_states.dtype)
            optr = out.data_ptr()
        else:
            out = np.empty((T, self.hidden_size), dtype=np.float32)
            optr = out.__array_interface__["data"][0]
        a = A.ExecArgs()
        a.hidden_states, a.hidden_dtype, a.n_tokens = x.ptr, x.dtype, T
        a.output, a.output_dtype = optr, x.dtype
        if (topk_ids is None) != (topk_weights is None):
            raise InvalidArgumentError("MOE_EINVAL", "pass topk_ids and topk_weights together")
        keep = []
        if sequence_lengths is not None:
            lens = np.ascontiguousarray(np.asarray(sequence_lengths, dtype=np.int64).reshape(-1))
            a.sequence_lengths, a.n_sequences = lens.ctypes.data, lens.size
            keep.append(lens)
        if topk_ids is not None:
            ids, wts = self._routing(topk_ids, topk_weights, T)
            a.in_topk_ids, a.in_topk_weights = ids.ptr, wts.ptr
            keep += [ids, wts]
        need = A.lib.moe_plan_workspace_size(self._plan, T)
        if self._ws is None or self._ws.nbytes < need:
            self._ws = np.empty(max(need, 64), dtype=np.uint8)
        a.workspace, a.workspace_size = self._ws.ctypes.data, self._ws.nbytes
        self._check(A.lib.moe_plan_execute_ex(self._plan, self._weights, C.byref(a)))
        return out

    def _routing(self, ids, wts, T):
        shape = (T, self.top_k)
        if _is_torch(ids):
            import torch
            if ids.device.type == "cpu" and ids.dtype == torch.int64:
                _check_i32_range(ids.numpy() if not ids.requires_grad else ids.detach().numpy())
                ids = ids.to(torch.int32)
            if wts.device.type == "cpu" and wts.dtype in (torch.bfloat16, torch.float16,
                                                          torch.float64):
                wts = wts.to(torch.float32)
            ids, wts = ids.contiguous() if ids.device.type == "cpu" else ids, \
                wts.contiguous() if wts.device.type == "cpu" else wts
        else:
            ids, wts = np.asarray(ids), np.asarray(wts)
            if ids.dtype == np.int64:
                _check_i32_range(ids)
                ids = ids.astype(np.int32)
            if wts.dtype in (np.float16, np.float64):
                wts = wts.astype(np.float32)
        return (_Buf("topk_ids", ids, ("i32",), shape),
                _Buf("topk_weights", wts, ("f32",), shape))
