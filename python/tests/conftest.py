import json
import os
import pathlib
import struct
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))  # the source tree's package when not installed
FIXTURES = pathlib.Path(os.environ.get("LIBMOE_TEST_DATA", ROOT / "tests" / "fixtures"))


def read_safetensors(path):
    """The safetensors format (8-byte LE header length, JSON header, data) read with numpy:
    an independent reader, not libmoe's. F32 / I32 / BF16 (widened exactly to f32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        raw = data[b:e]
        if v["dtype"] == "F32":
            a = np.frombuffer(raw, np.float32)
        elif v["dtype"] == "I32":
            a = np.frombuffer(raw, np.int32)
        elif v["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[k] = a.reshape(v["shape"]).copy()
    return out


@pytest.fixture
def fixtures():
    return FIXTURES
