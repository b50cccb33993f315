#!/usr/bin/env python3
"""Write the seed corpora of tests/fuzz/corpus/<target>/ from tests/fixtures (standard library
only; run from anywhere: python3 tests/fuzz/gen_corpus.py). Each seed is small (KiB): the fuzzers
grow their own corpora in build-fuzz, never here. A crash input that was fixed is added by hand
under its target's folder (README.md); this script leaves such files alone."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(HERE, "corpus")
SEP = b"\n#moe-fuzz-file#\n"  # fuzz_index.c: the parts of one input


def read_st(path):
    """(header dict without __metadata__, data bytes) of a safetensors file."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return h, b[8 + n:]


def tensor_bytes(h, data, name):
    a, b = h[name]["data_offsets"]
    return data[a:b]


def write_st(tensors, metadata=None):
    """bytes of a safetensors file of [(name, dtype, shape, raw bytes)], in order."""
    hdr, off, blobs = {}, 0, []
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    j = json.dumps(hdr, separators=(",", ":")).encode()
    j += b" " * (-len(j) % 8)
    return struct.pack("<Q", len(j)) + j + b"".join(blobs)


def f32_to_bf16(raw):
    """round-to-nearest-even bf16 of little-endian f32 bytes"""
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


def moe_tensors(fixture, bf16=False):
    """the MoE block tensors of layer 0 of a fixture's model.safetensors (router and experts)"""
    h, data = read_st(os.path.join(FIX, fixture, "model.safetensors"))
    out = []
    for name in sorted(h):
        if ".mlp." not in name:
            continue
        raw = tensor_bytes(h, data, name)
        dt = h[name]["dtype"]
        if bf16 and dt == "F32":
            raw, dt = f32_to_bf16(raw), "BF16"
        out.append((name, dt, h[name]["shape"], raw))
    return out


def put(target, name, blob):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)


def main():
    # fuzz_safetensors: a moe run input, a small mixed-dtype file, an empty header, metadata
    inp = open(os.path.join(FIX, "olmoe_gelu_f32", "input.safetensors"), "rb").read()
    put("fuzz_safetensors", "input_f32", inp)
    put("fuzz_safetensors", "mixed", write_st([
        ("a", "F32", [2, 3], bytes(range(24))),
        ("b", "BF16", [3], bytes(6)),
        ("c", "U8", [4, 1], b"\x01\x02\x03\x04"),
        ("d", "I32", [0], b""),
        ("e", "F8_E4M3", [2], b"\x38\xb8"),
        ("s", "F64", [], bytes(8)),
    ], metadata={"format": "pt"}))
    put("fuzz_safetensors", "empty", write_st([]))
    put("fuzz_safetensors", "router_experts0", write_st(moe_tensors("olmoe_gelu_f32")[:4]))

    # fuzz_config_plan: the config.json of each fixture the target reads beside (its ROWS)
    for fx in ["qwen3_moe_f32", "qwen3_moe_ct_w4a16_zp", "qwen2_moe_f32", "qwen2_moe_ct_w8a16_shared",
               "qwen3_5_moe_f32", "mixtral_f32", "olmoe_f32", "granitemoe_f32", "deepseek_v2_lite_f32",
               "deepseek_v3_f32", "llama4_f32", "gpt_oss_bf16", "gpt_oss_mxfp4", "qwen3_moe_sparse_step_f32"]:
        c = json.load(open(os.path.join(FIX, fx, "config.json")))
        put("fuzz_config_plan", fx, json.dumps(c, separators=(",", ":")).encode())

    # fuzz_model: olmoe_gelu_f32's MoE block (the target reads that fixture's config.json), f32 and bf16
    put("fuzz_model", "olmoe_gelu_f32", write_st(moe_tensors("olmoe_gelu_f32")))
    put("fuzz_model", "olmoe_gelu_bf16", write_st(moe_tensors("olmoe_gelu_f32", bf16=True)))

    # fuzz_index: index.json, then shard 1, shard 2 (fuzz_index.c: model-0000<k>.safetensors)
    ts = moe_tensors("olmoe_gelu_f32")
    halves = [ts[: len(ts) // 2], ts[len(ts) // 2:]]
    wm = {}
    for k, part in enumerate(halves, 1):
        for t in part:
            wm[t[0]] = "model-%05d.safetensors" % k
    index = json.dumps({"metadata": {"total_size": sum(len(t[3]) for t in ts)}, "weight_map": wm},
                       indent=1).encode()
    put("fuzz_index", "olmoe_gelu_2shards", SEP.join([index] + [write_st(p) for p in halves]))
    wm1 = {t[0]: "model-00001.safetensors" for t in ts}
    put("fuzz_index", "olmoe_gelu_1shard",
        SEP.join([json.dumps({"weight_map": wm1}).encode(), write_st(ts)]))

    # fuzz_input: hidden_states [T, 16] for olmoe_gelu_f32: f32 T=7, bf16 T=7, T=1, T=0
    h, data = read_st(os.path.join(FIX, "olmoe_gelu_f32", "input.safetensors"))
    x = tensor_bytes(h, data, "hidden_states")
    put("fuzz_input", "f32_t7", write_st([("hidden_states", "F32", [7, 16], x)]))
    put("fuzz_input", "bf16_t7", write_st([("hidden_states", "BF16", [7, 16], f32_to_bf16(x))]))
    put("fuzz_input", "f32_t1", write_st([("hidden_states", "F32", [1, 16], x[:64])]))
    put("fuzz_input", "f32_t0", write_st([("hidden_states", "F32", [0, 16], b"")]))


if __name__ == "__main__":
    main()
