"""numpy-only tests of the libmoe package: checkpoint fixtures (transformers-generated,
tests/fixtures) against their expected.safetensors within the f32 bound (1e-5 * max
|expected|, the bound of tests/unit/test_fixtures.c), the arrays constructor against the
checkpoint path, caller-given routing, and bad input raising libmoe.Error subclasses."""
import json

import numpy as np
import pytest

import libmoe
from conftest import FIXTURES, read_safetensors

F32_FIXTURES = sorted(p.name for p in FIXTURES.iterdir()
                      if (p / "expected.safetensors").exists() and p.name.endswith("_f32")
                      and (p / "model.safetensors").exists())


def load(name):
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    x = read_safetensors(FIXTURES / name / "input.safetensors")[meta["input_tensor"]]
    exp = read_safetensors(FIXTURES / name / "expected.safetensors")
    return meta, x, exp


@pytest.mark.parametrize("name", F32_FIXTURES)
def test_from_checkpoint_matches_transformers(name):
    meta, x, exp = load(name)
    layer = libmoe.MoELayer.from_checkpoint(FIXTURES / name, meta["layer"], num_threads=1,
                                            expert_set=meta.get("expert_set"))
    y = layer(x)
    assert y.dtype == np.float32 and y.shape == exp["output"].shape
    bound = 1e-5 * np.abs(exp["output"]).max()
    assert np.abs(y - exp["output"]).max() <= bound


def _stacked(name, layer=0):
    w = read_safetensors(FIXTURES / name / "model.safetensors")
    p = "model.layers.%d.mlp." % layer
    E = 1 + max(int(k[len(p + "experts."):].split(".")[0]) for k in w if k.startswith(p + "experts."))
    gu = np.stack([np.concatenate([w[p + "experts.%d.gate_proj.weight" % e],
                                   w[p + "experts.%d.up_proj.weight" % e]]) for e in range(E)])
    dn = np.stack([w[p + "experts.%d.down_proj.weight" % e] for e in range(E)])
    return w[p + "gate.weight"], np.ascontiguousarray(gu), np.ascontiguousarray(dn)


@pytest.mark.parametrize("name,family", [("qwen3_moe_f32", "qwen3_moe"), ("olmoe_f32", "olmoe")])
def test_arrays_constructor_equals_checkpoint(name, family):
    meta, x, exp = load(name)
    router, gu, dn = _stacked(name)
    ck = libmoe.MoELayer.from_checkpoint(FIXTURES / name, 0, num_threads=1)
    arr = libmoe.MoELayer(router, gu, dn, top_k=meta["K"], family=family,
                          desc={"renormalize": int(meta["renormalize"])}, num_threads=1)
    y = arr(x)
    assert np.array_equal(y, ck(x))  # same packed weights, same bits
    assert np.abs(y - exp["output"]).max() <= 1e-5 * np.abs(exp["output"]).max()
    # transposed layout ([E, H, 2I], [E, I, H]) packs to the same bits
    tr = libmoe.MoELayer(router, np.ascontiguousarray(gu.transpose(0, 2, 1)),
                         np.ascontiguousarray(dn.transpose(0, 2, 1)), top_k=meta["K"],
                         family=family, is_transposed=True,
                         desc={"renormalize": int(meta["renormalize"])}, num_threads=1)
    assert np.array_equal(tr(x), y)


def test_identity_experts_arrays_equal_checkpoint():
    """LongCat-Flash: router [E + Z, H] and selection bias [E + Z] beside down_proj [E, H, I];
    gate_up_proj as transformers' LongcatFlashExperts holds it, [E + Z, 2I, H] (the identity
    slots never read), or [E, 2I, H]: the checkpoint's bits either way, ids >= E reported."""
    name = "longcat_flash_f32"
    meta, x, exp = load(name)
    w = read_safetensors(FIXTURES / name / "model.safetensors")
    p, E, Z = "model.layers.0.mlp.", meta["E"], meta["num_identity_experts"]
    gu = np.ascontiguousarray(np.stack([np.concatenate([w[p + "experts.%d.gate_proj.weight" % e],
                                                        w[p + "experts.%d.up_proj.weight" % e]])
                                        for e in range(E + Z)]))
    dn = np.ascontiguousarray(np.stack([w[p + "experts.%d.down_proj.weight" % e] for e in range(E)]))
    router, bias = w[p + "router.classifier.weight"], w[p + "router.e_score_correction_bias"]
    assert router.shape[0] == E + Z
    ck = libmoe.MoELayer.from_checkpoint(FIXTURES / name, 0, num_threads=1)
    cfg = json.loads((FIXTURES / name / "config.json").read_text())
    kw = dict(top_k=meta["K"], family="longcat_flash", selection_bias=bias,
              desc={"routed_scaling_factor": cfg["routed_scaling_factor"]}, num_threads=1)
    full = libmoe.MoELayer(router, gu, dn, **kw)
    routed = libmoe.MoELayer(router, np.ascontiguousarray(gu[:E]), dn, **kw)
    y = full(x)
    assert np.array_equal(y, ck(x)) and np.array_equal(routed(x), y)
    assert np.abs(y - exp["output"]).max() <= 1e-5 * np.abs(exp["output"]).max()
    ids = exp["topk_ids"]
    assert (ids >= E).any()  # the fixture picks identity experts; given routing takes them
    # transformers' weights include the scale; libmoe's are the scores (the scale in the combine)
    yg = full(x, topk_ids=ids, topk_weights=exp["topk_weights"] / np.float32(cfg["routed_scaling_factor"]))
    assert np.abs(yg - exp["output"]).max() <= 1e-5 * np.abs(exp["output"]).max()


def test_nongated_arrays_equal_checkpoint():
    """Nemotron-H's non-gated experts from arrays: gate_up_proj is the experts' up_proj
    [E, I, H] (transposed: [E, H, I]), the shared expert up / down only; the checkpoint's bits,
    within the f32 bound of transformers' block. A shared_gate_proj for a non-gated shared
    expert, or a gated [E, 2I, H] tensor beside down_proj [E, H, I], is an error naming it."""
    name = "nemotron_h_f32"
    meta, x, exp = load(name)
    w = read_safetensors(FIXTURES / name / "model.safetensors")
    p, E = "backbone.layers.%d.mixer." % meta["layer"], meta["E"]
    up = np.ascontiguousarray(np.stack([w[p + "experts.%d.up_proj.weight" % e] for e in range(E)]))
    dn = np.ascontiguousarray(np.stack([w[p + "experts.%d.down_proj.weight" % e] for e in range(E)]))
    kw = dict(top_k=meta["K"], family="nemotron_h", selection_bias=w[p + "gate.e_score_correction_bias"],
              shared_up_proj=w[p + "shared_experts.up_proj.weight"],
              shared_down_proj=w[p + "shared_experts.down_proj.weight"],
              desc={"routed_scaling_factor": meta["routed_scaling_factor"], "n_group": meta["n_group"],
                    "topk_group": meta["topk_group"], "renormalize": int(meta["renormalize"])},
              num_threads=1)
    arr = libmoe.MoELayer(w[p + "gate.weight"], up, dn, **kw)
    ck = libmoe.MoELayer.from_checkpoint(FIXTURES / name, meta["layer"], num_threads=1)
    y = arr(x)
    assert np.array_equal(y, ck(x))
    assert np.abs(y - exp["output"]).max() <= 1e-5 * np.abs(exp["output"]).max()
    tr = libmoe.MoELayer(w[p + "gate.weight"], np.ascontiguousarray(up.transpose(0, 2, 1)),
                         np.ascontiguousarray(dn.transpose(0, 2, 1)), is_transposed=True, **kw)
    assert np.array_equal(tr(x), y)
    with pytest.raises(libmoe.InvalidArgumentError, match="shared_gate_proj.*non-gated"):
        libmoe.MoELayer(w[p + "gate.weight"], up, dn, shared_gate_proj=kw["shared_up_proj"], **kw)
    # gated-layout [E, 2I, H]: read as I' = 2I up outputs, which down_proj [E, H, I] contradicts
    with pytest.raises(libmoe.ShapeError, match=r"down_proj has shape \[8, 32, 12\]; expected \[8, 32, 24\]"):
        libmoe.MoELayer(w[p + "gate.weight"], np.concatenate([up, up], axis=1), dn, **kw)


def switch_numpy(x, router, up, down, capacity, lens):
    """Switch Transformers' sparse MLP in float64 numpy, written from the paper / the 5.24
    SwitchTransformersTop1Router description: softmax, argmax, weight = the max probability,
    per sequence a token is kept while the cumsum of its expert's one-hot <= capacity, a
    dropped token's output 0; experts relu(x up^T) down^T."""
    x64 = x.astype(np.float64)
    logits = x64 @ router.astype(np.float64).T                   # [T, E]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids, w = p.argmax(axis=1), p.max(axis=1)                    # [T], [T]
    onehot = np.eye(router.shape[0], dtype=np.int64)[ids]       # [T, E]
    keep = np.zeros(len(ids), dtype=bool)
    s0 = 0
    for n in lens:
        prio = np.cumsum(onehot[s0:s0 + n], axis=0)             # [n, E]
        keep[s0:s0 + n] = (prio * onehot[s0:s0 + n]).sum(axis=1) <= capacity
        s0 += n
    out = np.zeros_like(x64)
    for t in np.flatnonzero(keep):
        e = ids[t]
        h = np.maximum(up[e].astype(np.float64) @ x64[t], 0.0)
        out[t] = w[t] * (down[e].astype(np.float64) @ h)
    return out, np.where(keep, ids, -1)


def test_expert_capacity_arrays():
    """A Switch-like layer from arrays (top-1 softmax, relu experts, desc expert_capacity 2):
    with sequence_lengths it matches the float64 numpy Switch block within the f32 bound, drops
    tokens, and each sequence alone gives the same bits; without boundaries a call longer than
    the capacity is refused naming sequence_lengths; the dropped slots given back as topk_ids
    -1 give the same output."""
    rng = np.random.default_rng(7)
    T, H, I, E = 24, 16, 8, 4
    x = rng.uniform(-1, 1, (T, H)).astype(np.float32)
    router = rng.uniform(-1, 1, (E, H)).astype(np.float32)
    router[1] += 0.3  # expert 1 favoured where sum(x) > 0
    up = rng.uniform(-0.5, 0.5, (E, I, H)).astype(np.float32)
    down = rng.uniform(-0.5, 0.5, (E, H, I)).astype(np.float32)
    layer = libmoe.MoELayer(router, up, down, top_k=1,
                            desc={"activation": 6, "expert_capacity": 2, "renormalize": 0}, num_threads=2)
    assert "expert_capacity=2;" in layer.plan_text
    lens = [10, 0, 14]
    y = layer(x, sequence_lengths=lens)
    want, kept_ids = switch_numpy(x, router, up, down, 2, lens)
    assert (kept_ids == -1).sum() >= 3
    assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max()
    assert np.all(y[kept_ids == -1] == 0.0)
    assert np.array_equal(layer(x[10:], sequence_lengths=[14]), y[10:])
    with pytest.raises(libmoe.InvalidArgumentError, match="give sequence_lengths"):
        layer(x)
    with pytest.raises(libmoe.InvalidArgumentError, match="sum to 23 over 2 sequences"):
        layer(x, sequence_lengths=[10, 13])
    ids = kept_ids.astype(np.int32).reshape(T, 1)
    p = np.exp(x.astype(np.float64) @ router.T.astype(np.float64))
    wts = np.where(kept_ids == -1, 0.0, (p.max(axis=1) / p.sum(axis=1))).astype(np.float32).reshape(T, 1)
    yg = layer(x, topk_ids=ids, topk_weights=wts)
    assert np.all(yg[kept_ids == -1] == 0.0)
    assert np.abs(yg - want).max() <= 1e-5 * np.abs(want).max()


def test_given_routing_equals_routed():
    meta, x, exp = load("qwen3_moe_f32")
    layer = libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", 0, num_threads=1)
    ids, wts = exp["topk_ids"], exp["topk_weights"]
    y = layer(x, topk_ids=ids, topk_weights=wts)
    assert np.abs(y - exp["output"]).max() <= 1e-5 * np.abs(exp["output"]).max()
    y64 = layer(x, topk_ids=ids.astype(np.int64), topk_weights=wts)  # int64 accepted
    assert np.array_equal(y, y64)


@pytest.mark.parametrize("bad", ["0", 0.0, 1.5, True, None, 1 << 64])
def test_from_checkpoint_layer_must_be_an_integer(bad):
    # int() would turn "0" and 1.5 into layers 0 and 1; the layer is refused as given
    with pytest.raises(libmoe.InvalidArgumentError, match="layer"):
        libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", bad, num_threads=1)
    # a numpy integer is an integer
    assert libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", np.int64(0), num_threads=1) is not None


@pytest.fixture(scope="module")
def layer():
    return libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", 0, num_threads=1)


def test_errors(layer):
    meta, x, exp = load("qwen3_moe_f32")
    with pytest.raises(libmoe.DtypeError) as e:
        layer(x.astype(np.float64))
    assert e.value.status == "MOE_EDTYPE" and "float64" in e.value.message
    with pytest.raises(libmoe.ShapeError):
        layer(x[:, :5].copy())
    with pytest.raises(libmoe.InvalidArgumentError, match="not contiguous"):
        layer(np.concatenate([x, x])[::2])  # [T, H], every other row
    with pytest.raises(libmoe.InvalidArgumentError):
        layer(x.tolist())
    ids = exp["topk_ids"].copy()
    ids[3, 1] = meta["E"]
    with pytest.raises(libmoe.InvalidArgumentError) as e:
        layer(x, topk_ids=ids, topk_weights=exp["topk_weights"])
    assert e.value.status == "MOE_EINVAL" and "token 3" in e.value.message
    ids = exp["topk_ids"].copy()
    ids[2, 1] = ids[2, 0]
    with pytest.raises(libmoe.InvalidArgumentError, match="token 2"):
        layer(x, topk_ids=ids, topk_weights=exp["topk_weights"])
    with pytest.raises(libmoe.InvalidArgumentError, match="together"):
        layer(x, topk_ids=exp["topk_ids"])
    ids = exp["topk_ids"].astype(np.int64)
    ids[4, 1] = 2**32 + int(ids[4, 1])  # would wrap to the same int32 id: refused, not narrowed
    with pytest.raises(libmoe.InvalidArgumentError, match=r"topk_ids\[4\]\[1\] = 42949672"):
        layer(x, topk_ids=ids, topk_weights=exp["topk_weights"])
    with pytest.raises(libmoe.RangeError) as e:
        libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", 7)
    assert e.value.status == "MOE_ERANGE" and e.value.message
    with pytest.raises(libmoe.NotFoundError):
        libmoe.MoELayer.from_checkpoint(FIXTURES / "no_such_dir", 0)
    with pytest.raises(libmoe.InvalidArgumentError, match="unknown option"):
        libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", 0, bogus=1)
    with pytest.raises(libmoe.InvalidArgumentError) as e:
        libmoe.MoELayer.from_checkpoint(FIXTURES / "qwen3_moe_f32", 0, permute="nope")
    assert "nope" in e.value.message
    assert np.array_equal(layer(x[:0].copy()), np.empty((0, meta["H"]), np.float32))


# The ctypes mirrors (python/libmoe/_capi.py) against the C layout as the compiler gives it
# (tests/util/abi_layout.c, built by CMake; ctest's python_numpy sets LIBMOE_ABI_LAYOUT): the
# same size, the same fields in the same order at the same offsets. Run outside ctest without
# the program, it is skipped.
def test_ctypes_mirrors_match_c():
    import ctypes
    import os
    import subprocess

    prog = os.environ.get("LIBMOE_ABI_LAYOUT")
    if not prog:
        pytest.skip("LIBMOE_ABI_LAYOUT (the abi_layout program of the build) is not set")
    c = json.loads(subprocess.run([prog], check=True, capture_output=True, text=True).stdout)
    from libmoe import _capi

    mirrors = {"moe_options": _capi.Options, "moe_qweight": _capi.QWeight,
               "moe_quant_config": _capi.QuantConfig, "moe_layer_desc": _capi.LayerDesc,
               "moe_weight_source": _capi.WeightSource, "moe_stacked_experts": _capi.StackedExperts,
               "moe_exec_args": _capi.ExecArgs, "moe_checkpoint_options": _capi.CheckpointOptions}
    assert sorted(c) == sorted(mirrors)
    for name, cls in mirrors.items():
        py = [(f[0], getattr(cls, f[0]).offset) for f in cls._fields_]
        want = [tuple(f) for f in c[name]["fields"]]
        assert py == want, f"{name}: ctypes fields {py} != C {want}"
        assert ctypes.sizeof(cls) == c[name]["size"], \
            f"{name}: ctypes.sizeof {ctypes.sizeof(cls)} != C sizeof {c[name]['size']}"
