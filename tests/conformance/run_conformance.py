#!/usr/bin/env python3
"""Conformance of `moe run` against an independent float64 reference (ref64.py).

For every case: write a random Hugging Face checkpoint (make_ckpt.py) and hidden states into
a temporary folder, run

    $LIBMOE_BIN run --checkpoint DIR --layer L --input IN --output OUT --threads N

with N = 1 and N = 3 (the two outputs must be bit-identical), and compare OUT's
output [T, H] F32, topk_ids [T, K] I32 and topk_weights [T, K] F32 with ref64:

    max |output - ref64|        <= 1e-5 * max |ref64|
    max |topk_weights - ref64|  <= 1e-5 * max |ref64 weights|
    topk_ids                    == ref64's exactly (score descending, ties to lower id)

The reference reads the same files, so for bf16/f16 weights (or bf16 hidden states) it uses
the same rounded values and the f32 bound applies. Random tokens whose top-k is ambiguous at
f32 precision (two of the first K+1 sorted probabilities closer than 1e-4) are redrawn, so
the ids comparison is exact; the tie cases are exact ties by construction.

Also checked: the golden fixtures (../fixtures, made by transformers): ref64 against
transformers' outputs (validates the reference) and `moe run` on each fixture; and that a
dense layer and an out-of-range layer are refused without writing OUT.

Prints one line per case and a final "N passed, M failed"; exits 1 on any failure.
Needs only numpy and safetensors. Usage: LIBMOE_BIN=build/moe python3 run_conformance.py
[-k SUBSTRING] [--keep]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import make_ckpt  # noqa: E402
import ref64  # noqa: E402

REL_TOL = 1e-5
MIN_PROB_GAP = 1e-4
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")


def C(name, family, H, I, E, K, T, **kw):
    return dict(name=name, family=family, H=H, I=I, E=E, K=K, T=T, **kw)


CASES = [
    # Mixtral: always renormalized.
    C("mixtral_f32_T7", "mixtral", 64, 48, 8, 2, 7, seed=1),
    C("mixtral_bf16_T1", "mixtral", 64, 32, 8, 2, 1, seed=2, dtype="bf16"),
    C("mixtral_f16_k1_T33", "mixtral", 48, 40, 3, 1, 33, seed=3, dtype="f16"),
    C("mixtral_f32_k_eq_e_sharded_T129", "mixtral", 32, 24, 4, 4, 129, seed=4, shards=2),
    C("mixtral_bf16_stacked_T33", "mixtral", 40, 20, 6, 2, 33, seed=5, dtype="bf16",
      layout="stacked"),
    C("mixtral_f32_3layers_L2_T15", "mixtral", 32, 16, 4, 2, 15, seed=6, layers=3, layer=2),
    # Qwen2-MoE: sigmoid-gated shared expert, norm_topk_prob off (as released) and on.
    C("qwen2_moe_f32_shared_T33", "qwen2_moe", 64, 32, 6, 2, 33, seed=11, shared=48),
    C("qwen2_moe_bf16_norm_sharded3_T7", "qwen2_moe", 48, 24, 8, 3, 7, seed=12, shared=40,
      dtype="bf16", norm=True, shards=3, layers=2, layer=1, mlp_only=[0], dense=[0]),
    C("qwen2_moe_f16_k_eq_e_T1", "qwen2_moe", 32, 16, 5, 5, 1, seed=13, shared=16,
      dtype="f16"),
    C("qwen2_moe_f32_stacked_T17", "qwen2_moe", 32, 17, 4, 2, 17, seed=14, shared=24,
      layout="stacked"),
    C("qwen2_moe_f32_no_shared_T16", "qwen2_moe", 32, 16, 4, 1, 16, seed=15, shared=0),
    # Qwen3-MoE.
    C("qwen3_moe_bf16_T129", "qwen3_moe", 96, 80, 16, 4, 129, seed=21, dtype="bf16",
      norm=True),
    C("qwen3_moe_f32_E60_norm_false_T33", "qwen3_moe", 64, 17, 60, 4, 33, seed=22),
    C("qwen3_moe_f32_most_experts_empty_T4", "qwen3_moe", 32, 16, 64, 2, 4, seed=23,
      norm=True, min_empty=56),
    C("qwen3_moe_f32_dead_experts_T33", "qwen3_moe", 32, 16, 8, 2, 33, seed=24, norm=True,
      dead=[3, 5], min_empty=2),
    C("qwen3_moe_f16_sparse_step_T17", "qwen3_moe", 33, 17, 3, 1, 17, seed=25, dtype="f16",
      layers=4, layer=1, sparse_step=2, mlp_only=[3], dense=[0, 2, 3]),
    C("qwen3_moe_f32_ties_zero_router_T7", "qwen3_moe", 32, 16, 6, 2, 7, seed=26,
      zero_router=True),
    C("qwen3_moe_f32_ties_zero_router_norm_T3", "qwen3_moe", 32, 16, 5, 3, 3, seed=27,
      zero_router=True, norm=True),
    C("qwen3_moe_bf16_stacked_sharded_T7", "qwen3_moe", 32, 16, 8, 2, 7, seed=28,
      dtype="bf16", layout="stacked", shards=2, norm=True),
    C("qwen3_moe_f32_num_local_experts_key_T5", "qwen3_moe", 32, 16, 8, 2, 5, seed=29,
      norm=True, experts_key="num_local_experts"),
    C("qwen3_moe_f32_bf16_input_T7", "qwen3_moe", 32, 16, 8, 2, 7, seed=30, norm=True,
      input_dtype="bf16"),
    C("qwen3_moe_bf16_bf16_input_T31", "qwen3_moe", 64, 48, 8, 8, 31, seed=31, norm=True,
      dtype="bf16", input_dtype="bf16"),
]


class CaseFailure(Exception):
    pass


def draw_input(case, params, rng):
    """hidden_states [T, H] ~ N(0, 1), with tokens of ambiguous top-k redrawn."""
    T, H, K = case["T"], case["H"], case["K"]
    bf16_in = case.get("input_dtype") == "bf16"
    x = np.zeros((T, H), dtype=np.float32)
    for t in range(T):
        for _ in range(1000):
            row = rng.standard_normal(H, dtype=np.float32)
            if case.get("dead"):
                row[0] = 1.0 + abs(row[0])  # x[0] > 0: the dead experts' logits are < -30
            if bf16_in:
                row = (make_ckpt.f32_to_bf16_bits(row).astype(np.uint32) << 16).view(np.float32)
            if case.get("zero_router"):
                break
            _, probs, _, _ = ref64.route(params, row[None].astype(np.float64))
            if ref64.routing_margin(probs, K)[0] >= MIN_PROB_GAP:
                break
        else:
            raise CaseFailure("no token with an unambiguous top-k in 1000 draws")
        x[t] = row
    return x


def run_cli(ckpt, layer, inp, out, threads, expect_ok=True, experts=None):
    moe_bin = os.environ["LIBMOE_BIN"]
    cmd = [moe_bin, "run", "--checkpoint", ckpt, "--layer", str(layer), "--input", inp,
           "--output", out, "--threads", str(threads)] + (["--experts", experts] if experts else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if expect_ok and p.returncode != 0:
        raise CaseFailure(f"`{' '.join(cmd)}` exited {p.returncode}: {p.stderr.strip()}")
    return p


def read_out(path, T, H, K):
    t = ref64.read_safetensors(path)
    for name, code, shape in (("output", "F32", (T, H)), ("topk_ids", "I32", (T, K)),
                              ("topk_weights", "F32", (T, K))):
        if name not in t:
            raise CaseFailure(f"{path}: tensor {name} missing")
        if t[name][0] != code or tuple(t[name][1].shape) != shape:
            raise CaseFailure(f"{path}: {name} is {t[name][0]} {list(t[name][1].shape)}, "
                              f"expected {code} {list(shape)}")
    return {k: t[k][1] for k in ("output", "topk_ids", "topk_weights")}


def raw_bytes(path):
    with open(path, "rb") as fh:
        return fh.read()


def compare(got, ref, what):
    """Returns a summary string; raises CaseFailure on a violated bound."""
    ids_ref = ref["topk_ids"].astype(np.int32)
    if not np.array_equal(got["topk_ids"], ids_ref):
        bad = np.argwhere(got["topk_ids"] != ids_ref)[0]
        raise CaseFailure(f"{what}: topk_ids[{bad[0]}] = {got['topk_ids'][bad[0]].tolist()}, "
                          f"reference {ids_ref[bad[0]].tolist()}")
    out_ref = ref["output"]
    mx = float(np.abs(out_ref).max())
    err = float(np.abs(got["output"].astype(np.float64) - out_ref).max())
    wmx = float(np.abs(ref["topk_weights"]).max())
    werr = float(np.abs(got["topk_weights"].astype(np.float64) - ref["topk_weights"]).max())
    if not np.all(np.isfinite(got["output"])):
        raise CaseFailure(f"{what}: output has non-finite values")
    if not err <= REL_TOL * mx:
        raise CaseFailure(f"{what}: max|output - ref| = {err:.3e} > {REL_TOL:g} * {mx:.3e}")
    if not werr <= REL_TOL * wmx:
        raise CaseFailure(f"{what}: max|topk_weights - ref| = {werr:.3e} > "
                          f"{REL_TOL:g} * {wmx:.3e}")
    return f"output err/max {err / mx:.2e}, weights err/max {werr / wmx:.2e}, ids equal"


def run_case(case, tmp):
    ckpt = os.path.join(tmp, "ckpt")
    layer = case.get("layer", 0)
    make_ckpt.make_checkpoint(
        ckpt, case["family"], case["H"], case["I"], case["E"], case["K"], seed=case["seed"],
        layers=case.get("layers", 1), dtype=case.get("dtype", "f32"),
        layout=case.get("layout", "per_expert"), shards=case.get("shards", 1),
        norm_topk_prob=case.get("norm", False), shared=case.get("shared", 0),
        sparse_step=case.get("sparse_step", 1), mlp_only=case.get("mlp_only", ()),
        dead_experts=case.get("dead", ()), zero_router=case.get("zero_router", False),
        experts_key=case.get("experts_key", "num_experts"))
    ck = ref64.Checkpoint(ckpt)
    params = ref64.layer_params(ck, layer)
    rng = np.random.default_rng(1000 + case["seed"])
    x = draw_input(case, params, rng)
    inp = os.path.join(tmp, "input.safetensors")
    make_ckpt.write_hidden_states(inp, x, case.get("input_dtype", "f32"))
    # The reference reads the input back from the file, like the CLI.
    xr = ref64.read_safetensors(inp)["hidden_states"][1]
    ref = ref64.moe_forward(params, xr)

    notes = []
    if "min_empty" in case:
        empty = case["E"] - len(np.unique(ref["topk_ids"]))
        if empty < case["min_empty"]:
            raise CaseFailure(f"case construction: only {empty} experts without tokens")
        notes.append(f"{empty} experts without tokens")
    if case.get("zero_router"):
        want = np.tile(np.arange(case["K"], dtype=np.int32), (case["T"], 1))
        if not np.array_equal(ref["topk_ids"], want):
            raise CaseFailure("reference does not pick 0..K-1 on all-equal logits")

    outs = {}
    for threads in (1, 3):
        out = os.path.join(tmp, f"out{threads}.safetensors")
        run_cli(ckpt, layer, inp, out, threads)
        outs[threads] = out
    if raw_bytes(outs[1]) != raw_bytes(outs[3]):
        got1 = read_out(outs[1], case["T"], case["H"], case["K"])
        got3 = read_out(outs[3], case["T"], case["H"], case["K"])
        if not all(np.array_equal(got1[k].view(np.uint8), got3[k].view(np.uint8))
                   for k in got1):
            raise CaseFailure("--threads 1 and --threads 3 give different bits")
    got = read_out(outs[1], case["T"], case["H"], case["K"])
    summary = compare(got, ref, "moe run")

    # Dense layers and a layer past the end are refused, and OUT is not written.
    for bad in list(case.get("dense", [])) + [case.get("layers", 1)]:
        out = os.path.join(tmp, f"refused{bad}.safetensors")
        p = run_cli(ckpt, bad, inp, out, 1, expect_ok=False)
        if p.returncode == 0 or os.path.exists(out):
            raise CaseFailure(f"layer {bad} (dense or out of range) was not refused "
                              f"(exit {p.returncode}, output written: {os.path.exists(out)})")
        notes.append(f"layer {bad} refused")
    return summary + ("; " + ", ".join(notes) if notes else "")


def fixture_dirs():
    if not os.path.isdir(FIXTURES):
        return []
    return sorted(d for d in os.listdir(FIXTURES)
                  if os.path.exists(os.path.join(FIXTURES, d, "meta.json")))


def run_fixture_ref(name):
    """ref64 against transformers' own f32-class output: validates the reference."""
    d = os.path.join(FIXTURES, name)
    meta = json.load(open(os.path.join(d, "meta.json")))
    x = ref64.read_safetensors(os.path.join(d, "input.safetensors"))["hidden_states"][1]
    ref = ref64.run_checkpoint(d, meta["layer"], x, meta.get("expert_set"))
    hf = {k: v[1] for k, v in ref64.read_safetensors(os.path.join(d, "expected.safetensors")).items()}
    lerr = np.abs(ref["router_logits"] - hf["router_logits"]).max()
    lmx = np.abs(ref["router_logits"]).max()
    if not lerr <= REL_TOL * lmx:
        raise CaseFailure(f"router_logits: ref64 vs transformers {lerr:.3e} > {REL_TOL:g} * {lmx:.3e}")
    # DeepSeek's routers report their weights times routed_scaling_factor
    ref = dict(ref, topk_weights=ref["topk_weights"] * meta.get("topk_weights_scale", 1.0))
    return compare({k: hf[k] for k in ("output", "topk_ids", "topk_weights")}, ref,
                   "transformers vs ref64")


def run_fixture_cli(name, tmp):
    d = os.path.join(FIXTURES, name)
    meta = json.load(open(os.path.join(d, "meta.json")))
    inp = os.path.join(d, "input.safetensors")
    x = ref64.read_safetensors(inp)["hidden_states"][1]
    ref = ref64.run_checkpoint(d, meta["layer"], x, meta.get("expert_set"))
    out = os.path.join(tmp, "out.safetensors")
    run_cli(d, meta["layer"], inp, out, 2, experts=meta.get("expert_set"))
    return compare(read_out(out, meta["T"], meta["H"], meta["K"]), ref, "moe run")


def no_fixtures(tmp):
    raise CaseFailure(f"no fixtures under {FIXTURES}")


def main():
    ap = argparse.ArgumentParser(description="libmoe conformance against a float64 reference")
    ap.add_argument("-k", default="", help="run only cases whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    a = ap.parse_args()
    if not os.environ.get("LIBMOE_BIN"):
        print("LIBMOE_BIN is not set: it must name the `moe` executable", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    if not os.access(os.environ["LIBMOE_BIN"], os.X_OK):
        print(f"LIBMOE_BIN={os.environ['LIBMOE_BIN']} is not an executable", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1

    jobs = [(c["name"], lambda tmp, c=c: run_case(c, tmp)) for c in CASES]
    names = fixture_dirs()
    if not names:
        jobs.append(("fixtures_present", no_fixtures))
    for n in names:
        jobs.append((f"fixture_ref64:{n}", lambda tmp, n=n: run_fixture_ref(n)))
        jobs.append((f"fixture_cli:{n}", lambda tmp, n=n: run_fixture_cli(n, tmp)))

    passed = failed = 0
    for name, fn in jobs:
        if a.k and a.k not in name:
            continue
        tmp = tempfile.mkdtemp(prefix="moe-conf-")
        try:
            msg = fn(tmp)
            print(f"PASS {name}: {msg}", flush=True)
            passed += 1
        except CaseFailure as e:
            print(f"FAIL {name}: {e}", flush=True)
            failed += 1
        except Exception:  # a crash in the harness is a failure too, with its traceback
            print(f"FAIL {name}: exception\n{traceback.format_exc()}", flush=True)
            failed += 1
        finally:
            if a.keep:
                print(f"     kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
