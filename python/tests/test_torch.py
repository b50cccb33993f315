"""torch tensors through libmoe.MoELayer: f32 and bf16 zero-copy calls, bad tensors.
Skipped when torch is not installed."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import libmoe
from conftest import FIXTURES, read_safetensors


def test_torch_f32_and_bf16():
    name = "qwen3_moe_f32"
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    x = read_safetensors(FIXTURES / name / "input.safetensors")["hidden_states"]
    exp = read_safetensors(FIXTURES / name / "expected.safetensors")
    layer = libmoe.MoELayer.from_checkpoint(FIXTURES / name, 0, num_threads=1)
    y = layer(torch.from_numpy(x))
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32
    assert np.array_equal(y.numpy(), layer(x))
    xb = torch.from_numpy(x).to(torch.bfloat16)
    yb = layer(xb)
    assert yb.dtype == torch.bfloat16
    # bf16 out is the f32 result on the bf16-rounded input, rounded to nearest even (moe.h)
    ref = layer(xb.to(torch.float32)).to(torch.bfloat16)
    assert torch.equal(yb, ref)
    ids = torch.from_numpy(exp["topk_ids"]).to(torch.int64)
    w = torch.from_numpy(exp["topk_weights"])
    yg = layer(torch.from_numpy(x), topk_ids=ids, topk_weights=w)  # int64 ids converted
    assert float((yg - torch.from_numpy(exp["output"])).abs().max()) <= \
        1e-5 * float(np.abs(exp["output"]).max())
    with pytest.raises(libmoe.InvalidArgumentError, match="not contiguous"):
        layer(torch.from_numpy(np.concatenate([x, x]))[::2])
    with pytest.raises(libmoe.DtypeError):
        layer(torch.from_numpy(x).double())
    with pytest.raises(libmoe.InvalidArgumentError, match="meta"):
        layer(torch.empty(x.shape, device="meta"))
