#!/usr/bin/env python3
"""Peer comparison for libmoe's MoE layer: measures, side by side in one run, on the same
shapes (the Qwen3-30B-A3B MoE layer: H 2048, I 768, E 128, K 8) and the same thread count:

  libmoe  `moe bench --json` (whole layer: router, top-k, permute, gate/up, SwiGLU, down,
          combine), per weight dtype; for bf16 weights in both compute modes (`--compute f32`,
          f32 activations; `--compute bf16`, activations rounded to bf16 with f32 accumulation:
          what torch's bf16 module computes).
  ggml    MUL_MAT_ID through `test-backend-ops perf -o MUL_MAT_ID`, the qwen3-30b-a3b cases
          (m 768, k 2048, 128 experts, 8 used, n tokens): ONE projection (gate-shaped).
  ggml layer  bench/ggml_moe.c (build with bench/build_ggml_harness.sh): ggml's whole expert
          FFN (mul_mat_id gate and up, swiglu, mul_mat_id down, routing-weight mul, sum over
          the K experts) through ggml_graph_compute, with libmoe bench's memory conditions:
          round-robin walk over all 128 experts, rotated weight copies, so decode reads DRAM.
  torch   transformers' Qwen3MoeSparseMoeBlock on CPU, with experts_implementation "eager"
          (the per-expert Python loop with index_add_) and "grouped_mm" (transformers 5's
          default for a loaded model), bf16 and f32 weights, torch.set_num_threads(N).

and prints, per weight dtype and token count T, GFLOP/s and the ratios libmoe / peer (for
bf16 weights: libmoe f32 and libmoe bf16 each against torch eager and grouped_mm in bf16, and
libmoe bf16 / libmoe f32).

What is compared (FLOPs are counted the same way everywhere: 2 per multiply-add):
  - libmoe vs torch: the same whole layer, FLOPs 2*T*K*3*H*I + 2*T*E*H (router) over the
    median wall time; the ratio is a speed ratio on identical work. With bf16 weights torch
    runs in bf16 (activations bf16 too): libmoe's compute bf16 does the same arithmetic,
    its compute f32 more (f32 activations).
  - libmoe bf16 / libmoe f32: the two compute modes on the same weights (bf16), a speed
    ratio (> 1: compute bf16 faster).
  - libmoe vs ggml: libmoe's whole-layer GFLOP/s against ggml's per-projection GFLOP/s
    (2*m*n*k*8 over its mean time). Both are expert GEMM throughput; libmoe's figure also
    pays for the router, top-k, permutation, SwiGLU, the down projection and the combine, so
    the ratio understates libmoe.
  - Memory: libmoe's bench walks round-robin through all 128 experts and rotates layer copies
    so that decode reads DRAM; torch gets a ring of distinct random inputs (random routing
    over 1.2-2.4 GB of experts); ggml repeats ONE graph with fixed ids, so its n = 1 case
    re-reads the same 8 experts every run (25 MB f16, 50 MB f32): served partly from the
    last-level cache when that is >= ~32 MB. The script prints ggml's implied GB/s at n = 1
    next to the DRAM bandwidth libmoe measured, so this shows.
    The "ggml layer" column has no such reuse: it walks the experts like libmoe's bench;
    libmoe / ggml layer is a speed ratio (ggml layer ms over libmoe ms; libmoe's time also
    includes the router and top-k, which the ggml graph is given as inputs).

Needs: a built libmoe (`build/moe`), a built ggml test-backend-ops (see bench/README.md),
torch and transformers (`pip install torch transformers`) in the Python given by
--torch-python. Not part of `make test`. Run from anywhere:

  python3 bench/peers.py --threads 2 --torch-python /tmp/venv/fx/bin/python
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

H, I, E, K = 2048, 768, 128, 8
GGML_DTYPE = {"bf16": "bf16", "f16": "f16", "f32": "f32", "q8_0": "q8_0", "q4_0": "q4_0"}
# Quantized comparisons: libmoe quantizes generated bf16 experts (`moe bench --quant`); ggml's
# q8_0 is int8 codes with an f16 scale per 32 weights and runs with activations quantized to
# q8_0 (int8 dot products), which libmoe's int8-w8a8 matches in kind (int8 x int8 -> int32,
# per-channel weight and per-token activation scales); q4_0 (4-bit, f16 scale per 32,
# activations q8_0) is set beside libmoe's int4-g32 weight-only. torch is not run for these.
LIBMOE_QUANT = {"q8_0": "int8-w8a8", "q4_0": "int4-g32"}
TORCH_DTYPES = ("bf16", "f32")
# libmoe's compute modes (moe bench --compute) and the result key of each; compute bf16 runs
# on the weight dtypes where it is what a bf16 model computes (bf16 weights kept as they are;
# f32/f16 weights would be rounded to bf16, the quantized schemes keep 8-bit or scalar paths).
LIBMOE_KEY = {"f32": "libmoe", "bf16": "libmoe_bf16"}
COMPUTE_BF16_DTYPES = ("bf16",)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def layer_flops(t):
    return 2.0 * t * K * 3 * H * I + 2.0 * t * E * H


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def cpu_idle_fraction(seconds=1.0):
    """Fraction of all CPUs' time idle over `seconds` (from /proc/stat); None when unknown."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + (v[4] if len(v) > 4 else 0), sum(v)
    try:
        i0, t0 = snap()
        time.sleep(seconds)
        i1, t1 = snap()
    except OSError:
        return None
    return (i1 - i0) / (t1 - t0) if t1 > t0 else None


def wait_idle(args, what):
    """Wait (up to --wait-idle seconds) until the machine is idle before measuring `what`.
    Returns the idle fraction seen last."""
    start = time.time()
    last_log = start - 60
    while True:
        idle = cpu_idle_fraction()
        if idle is None or idle >= args.idle_threshold or time.time() >= start + args.wait_idle:
            break
        if time.time() - last_log >= 15:
            last_log = time.time()
            log(f"  waiting for an idle machine before {what}: {100 * idle:.0f}% idle")
    if idle is not None and idle < args.idle_threshold:
        log(f"  measuring {what} on a busy machine: {100 * idle:.0f}% idle")
    return idle


# ---- torch worker (runs in the Python that has torch) ----------------------------------------

def torch_worker(args):
    import torch
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    import transformers

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    tokens = [int(x) for x in args.tokens.split(",")]
    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads(), "results": []}
    tdt = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    with torch.inference_mode():
        base = None
        for impl in args.impls.split(","):
            cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                                 num_experts_per_tok=K, norm_topk_prob=True, hidden_act="silu",
                                 experts_implementation=impl)
            blk = Qwen3MoeSparseMoeBlock(cfg)
            if base is None:  # same weights for every implementation
                bh, bi = 1.0 / H ** 0.5, 1.0 / I ** 0.5
                blk.experts.gate_up_proj.uniform_(-bh, bh)
                blk.experts.down_proj.uniform_(-bi, bi)
                blk.gate.weight.normal_(0.0, 1.0)  # random routing: experts vary per token
                blk = blk.to(tdt)
                base = blk.state_dict()
            else:
                blk = blk.to(tdt)
                blk.load_state_dict(base)
            blk.eval()
            for t in tokens:
                ring = max(4, min(64, 4096 // t))
                xs = [torch.randn(1, t, H).to(tdt) for _ in range(ring)]
                blk(xs[0])  # warm-up
                times = []
                start = time.perf_counter()
                r = 1
                while (len(times) < 3 or time.perf_counter() - start < args.min_time) and \
                        len(times) < 50:
                    t0 = time.perf_counter()
                    blk(xs[r % ring])
                    times.append(time.perf_counter() - t0)
                    r += 1
                med = statistics.median(times)
                out["results"].append({"impl": impl, "dtype": args.dtype, "tokens": t,
                                       "runs": len(times), "median_ms": med * 1e3,
                                       "best_ms": min(times) * 1e3,
                                       "gflops": layer_flops(t) / med * 1e-9})
                log(f"  torch {impl} {args.dtype} T={t}: {med * 1e3:.2f} ms")
            del blk
    print(json.dumps(out))


def run_torch(args, dtype):
    cmd = [args.torch_python, os.path.abspath(__file__), "--torch-worker", "--dtype", dtype,
           "--threads", str(args.threads), "--tokens", args.tokens,
           "--min-time", str(args.min_time), "--impls", args.torch_impls]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in p.stderr.splitlines():
        if line.startswith("  torch "):
            log(line)
    if p.returncode != 0:
        tail = "\n".join(p.stderr.strip().splitlines()[-5:])
        log(f"torch ({dtype}) failed; install with `{args.torch_python} -m pip install torch "
            f"transformers`?\n{tail}")
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- ggml --------------------------------------------------------------------------------------

GGML_LINE = re.compile(
    r"MUL_MAT_ID\((?P<params>[^)]*)\):\s+(?P<runs>\d+) runs -\s+(?P<us>[\d.]+) us/run -\s+"
    r"(?P<flop>[\d.]+) (?P<unit>[KMGT]?)FLOP/run")
UNIT = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def run_ggml(args, dtype):
    ns = "|".join(args.tokens.split(","))
    regex = (f"type_a={GGML_DTYPE[dtype]},type_b=f32,n_mats={E},n_used={K},b=0,m={I},"
             f"n=({ns}),k={H}$")
    cmd = [args.ggml, "perf", "-o", "MUL_MAT_ID", "-b", "CPU", "-p", regex]
    hc = os.cpu_count()
    if args.threads != hc:
        # test-backend-ops runs std::thread::hardware_concurrency() threads, which ignores
        # the affinity mask: pinning keeps it on N cores, but oversubscribed.
        cmd = ["taskset", "-c", f"0-{args.threads - 1}"] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", p.stdout)
    res = {}
    for m in GGML_LINE.finditer(text):
        n = int(re.search(r"\bn=(\d+)", m.group("params")).group(1))
        flop = float(m.group("flop")) * UNIT[m.group("unit")]
        us = float(m.group("us"))
        res[n] = {"runs": int(m.group("runs")), "us_per_run": us,
                  "gflops": flop / us * 1e-3, "params": m.group("params")}
        log(f"  ggml {dtype} n={n}: {us:.1f} us/run, {flop / us * 1e-3:.1f} GFLOP/s")
    if not res:
        log(f"ggml: no {dtype} MUL_MAT_ID case matched (unpatched test-backend-ops has no bf16 "
            f"qwen3-30b-a3b case; see bench/README.md)")
    return res


# ---- ggml layer (bench/ggml_moe.c) ---------------------------------------------------------------

def run_ggml_layer(args, dtype):
    cmd = [args.ggml_layer, "--dtype", GGML_DTYPE[dtype], "--tokens", args.tokens,
           "--threads", str(args.threads), "--min-time", str(args.min_time)]
    if dtype == "q4_0" and args.ggml_layer_repack:
        cmd.append("--repack")  # llama.cpp's default on AVX2: q4_0 re-laid out as q4_0_8x8
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        log(f"ggml layer ({dtype}) failed: {p.stderr.strip()[-400:]}")
        return None
    rows = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    header = [x for x in p.stderr.splitlines() if x.startswith("ggml_moe:")]
    for r in rows:
        log(f"  ggml layer {dtype} T={r['T']}: {r['median_ms']:.2f} ms, "
            f"{r['gflops']:.1f} GFLOP/s, {r['gbps']:.1f} GB/s ({r['copies']} weight copies)")
    return {"rows": rows, "header": header[-1] if header else ""}


# ---- libmoe ------------------------------------------------------------------------------------

def run_libmoe(args, dtype, compute="f32"):
    cmd = [args.moe, "bench", "--json", "--tokens", args.tokens, "--threads", str(args.threads),
           "--min-time", str(args.min_time), "--compute", compute]
    if dtype in LIBMOE_QUANT:
        cmd += ["--dtype", "bf16", "--quant", LIBMOE_QUANT[dtype]]
    else:
        cmd += ["--dtype", dtype]
    if args.roofline:
        cmd.append("--roofline")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        log(f"libmoe ({dtype}, compute {compute}) failed: {p.stderr.strip()[-400:]}")
        return None
    for line in p.stderr.splitlines():  # e.g. compute bf16 on a table without avx512_bf16
        if "warning:" in line:
            log(f"  libmoe {dtype} compute {compute}: {line.strip()}")
    doc = json.loads(p.stdout)
    for r in doc["rows"]:
        log(f"  libmoe {dtype} compute {compute} T={r['tokens']}: {r['median_ms']:.2f} ms, "
            f"{r['gflops']:.1f} GFLOP/s, {r['gbps']:.1f} GB/s")
    return doc


# ---- report ------------------------------------------------------------------------------------

def fmt(v, spec=".1f"):
    return "n/a" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    """max/min - 1 over the runs, or None with fewer than 2 values."""
    xs = [x for x in xs if x is not None and x > 0]
    return max(xs) / min(xs) - 1.0 if len(xs) > 1 else None


def aggregate_libmoe(runs, dtype, key):
    """Per-T medians of one libmoe compute mode (result key `key`) over the repeated runs."""
    lm = {}
    for res in runs:
        doc = res[dtype].get(key)
        for row in (doc or {}).get("rows", []):
            lm.setdefault(row["tokens"], []).append(row)
    agg = {}
    for t, rows in lm.items():
        bounds = [x.get("roofline_bound") for x in rows]
        bound = max(set(bounds), key=bounds.count)  # the majority (ridges vary run to run)
        agg[t] = {"median_ms": med(x["median_ms"] for x in rows),
                  "gflops": med(x["gflops"] for x in rows),
                  "gbps": med(x["gbps"] for x in rows),
                  "bound": bound,
                  # the fractions of runs that classed the row under the same bound
                  "fraction": med(x.get("roofline_fraction") for x in rows
                                  if x.get("roofline_bound") == bound),
                  "spread": spread([x["gflops"] for x in rows])}
    return agg


def aggregate(runs, dtype):
    """Per-cell medians over the repeated runs of one weight dtype."""
    gg, th, gl = {}, {}, {}
    for res in runs:
        r = res[dtype]
        for row in (r.get("ggml_layer") or {}).get("rows", []):
            gl.setdefault(row["T"], []).append(row)
        for n, g in (r["ggml"] or {}).items():
            gg.setdefault(int(n), []).append(g)
        for row in (r["torch"] or {}).get("results", []):
            th.setdefault((row["impl"], row["tokens"]), []).append(row)
    agg = {key: aggregate_libmoe(runs, dtype, key) for key in LIBMOE_KEY.values()}
    agg.update({"ggml": {}, "torch": {}, "ggml_layer": {}})
    for t, rows in gl.items():
        agg["ggml_layer"][t] = {"median_ms": med(x["median_ms"] for x in rows),
                                "gflops": med(x["gflops"] for x in rows),
                                "gbps": med(x["gbps"] for x in rows),
                                "copies": rows[0]["copies"],
                                "spread": spread([x["gflops"] for x in rows])}
    for n, rows in gg.items():
        agg["ggml"][n] = {"us_per_run": med(x["us_per_run"] for x in rows),
                          "gflops": med(x["gflops"] for x in rows),
                          "spread": spread([x["gflops"] for x in rows])}
    for k, rows in th.items():
        agg["torch"][k] = {"median_ms": med(x["median_ms"] for x in rows),
                           "gflops": med(x["gflops"] for x in rows),
                           "spread": spread([x["gflops"] for x in rows])}
    rfs = [res[dtype][key]["roofline"] for res in runs for key in LIBMOE_KEY.values()
           if res[dtype].get(key) and res[dtype][key].get("roofline")]
    agg["dram_gbs"] = med(x["dram_read_gbs"] for x in rfs)
    return agg


def report(args, runs):
    tokens = [int(x) for x in args.tokens.split(",")]
    lines = []
    impls = args.torch_impls.split(",") if args.torch_python else []
    for dtype in args.dtypes.split(","):
        a = aggregate(runs, dtype)
        gg, th, gl = a["ggml"], a["torch"], a["ggml_layer"]
        # libmoe's compute modes measured for this dtype, f32 first; the ggml columns compare
        # the first one (compute f32 unless only bf16 ran)
        modes = [c for c in LIBMOE_KEY if a[LIBMOE_KEY[c]]] or ["f32"]
        two = len(modes) > 1
        name = {c: f"libmoe {c}" if two else "libmoe" for c in modes}
        lm = a[LIBMOE_KEY[modes[0]]]
        head, sep = "| T |", "|---:|"
        for c in modes:
            head += f" {name[c]} ms | {name[c]} GFLOP/s | {name[c]} / roofline |"
            sep += "---:|---:|---:|"
        if two:
            head += " libmoe bf16 / libmoe f32 (speed) |"
            sep += "---:|"
        head += f" ggml GFLOP/s (1 proj) | {name[modes[0]]}/ggml |"
        sep += "---:|---:|"
        if gl:
            head += (" ggml layer (rotating experts) ms | ggml layer GB/s | "
                     f"{name[modes[0]]} / ggml layer (speed) |")
            sep += "---:|---:|---:|"
        for impl in impls:
            head += f" torch {impl} ms |" + "".join(f" {name[c]}/torch {impl} |" for c in modes)
            sep += "---:|" * (1 + len(modes))
        what = (f"libmoe {LIBMOE_QUANT[dtype]} vs ggml type_a={dtype}; torch not run"
                if dtype in LIBMOE_QUANT else
                f"ggml type_a={dtype}{'' if dtype in TORCH_DTYPES else '; torch not run for f16'}")
        if two:
            what += (f"; libmoe in compute f32 and compute bf16"
                     f"{f', torch in {dtype}' if dtype in TORCH_DTYPES else ''}")
        lines.append(f"\n{dtype.upper()} weights ({what})"
                     f"{f', median of {len(runs)} runs' if len(runs) > 1 else ''}\n")
        lines.append(head)
        lines.append(sep)
        sp = {**{name[c]: [] for c in modes}, "ggml": [], "ggml layer": [], "torch": []}
        for t in tokens:
            rs = {c: a[LIBMOE_KEY[c]].get(t) for c in modes}
            gfs = {c: rs[c]["gflops"] if rs[c] else None for c in modes}
            r, g = lm.get(t), gg.get(t)
            lg = r["gflops"] if r else None
            gf = g["gflops"] if g else None
            sp["ggml"].append(g["spread"] if g else None)
            line = f"| {t} |"
            for c in modes:
                rc = rs[c]
                sp[name[c]].append(rc["spread"] if rc else None)
                frac = (f"{rc['fraction']:.2f} {rc['bound']}" if rc and rc["fraction"] is not None
                        else "n/a")
                line += f" {fmt(rc['median_ms'] if rc else None, '.2f')} | {fmt(gfs[c])} | {frac} |"
            if two:
                line += f" {fmt(ratio(gfs['bf16'], gfs['f32']), '.2f')} |"
            line += f" {fmt(gf)} | {fmt(ratio(lg, gf), '.2f')} |"
            if gl:
                q = gl.get(t)
                sp["ggml layer"].append(q["spread"] if q else None)
                line += (f" {fmt(q['median_ms'] if q else None, '.2f')} | "
                         f"{fmt(q['gbps'] if q else None)} | "
                         f"{fmt(ratio(q['median_ms'] if q else None, r['median_ms'] if r else None), '.2f')} |")
            for impl in impls:
                tr = th.get((impl, t)) if dtype in TORCH_DTYPES else None
                if tr:
                    sp["torch"].append(tr["spread"])
                line += f" {fmt(tr['median_ms'] if tr else None, '.2f')} |"
                for c in modes:
                    line += f" {fmt(ratio(gfs[c], tr['gflops'] if tr else None), '.2f')} |"
            lines.append(line)
        if len(runs) > 1:
            parts = []
            for tool, v in sp.items():
                v = [x for x in v if x is not None]
                if v:
                    parts.append(f"{tool} {100 * statistics.median(v):.0f}% median, "
                                 f"{100 * max(v):.0f}% worst")
            lines.append("\nrun-to-run spread of GFLOP/s (max/min - 1 per cell): " +
                         "; ".join(parts) + ".")
        if 1 in gg and dtype not in LIBMOE_QUANT:
            b = 8 * I * H * (2 if dtype != "f32" else 4)
            gbs = b / (gg[1]["us_per_run"] * 1e-6) * 1e-9
            dram = f"; libmoe's measured DRAM read bandwidth: {a['dram_gbs']:.1f} GB/s" \
                if a["dram_gbs"] else ""
            lines.append(f"\nggml n=1 re-reads the same 8 experts' {b / 1e6:.0f} MB every run: "
                         f"{gbs:.1f} GB/s{dram}.")
        if gl:
            cps = sorted({q["copies"] for q in gl.values()})
            rp = any(row.get("repack") for res in runs
                     for row in ((res[dtype].get("ggml_layer") or {}).get("rows", [])))
            lines.append(f"\nggml layer: bench/ggml_moe.c, the whole expert FFN, experts walked "
                         f"round-robin as in libmoe's bench, {'/'.join(map(str, cps))} weight "
                         f"cop{'y' if cps == [1] else 'ies'} rotated"
                         f"{', weights in CPU_REPACK (q4_0_8x8)' if rp else ''}; "
                         f"libmoe / ggml layer = ggml "
                         f"layer ms / libmoe ms (> 1: libmoe faster).")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tokens", default="1,8,32,128,512")
    ap.add_argument("--dtypes", default="bf16,f16,f32",
                    help="weight dtypes: bf16 (ggml needs the patched bf16 cases), f16, f32; "
                         "quantized: q8_0 (libmoe int8-w8a8 vs ggml q8_0), q4_0 (libmoe "
                         "int4-g32 vs ggml q4_0)")
    ap.add_argument("--moe", default=os.path.join(REPO, "build", "moe"),
                    help="the libmoe command (default: build/moe of this checkout)")
    ap.add_argument("--ggml", default="/tmp/ggml-build/bin/test-backend-ops",
                    help="ggml's test-backend-ops binary; '' to skip ggml")
    ap.add_argument("--ggml-layer", default=os.path.join(REPO, "build", "ggml_moe"),
                    help="bench/ggml_moe.c's program (bench/build_ggml_harness.sh); '' to skip")
    ap.add_argument("--no-ggml-layer-repack", dest="ggml_layer_repack", action="store_false",
                    help="q4_0: keep ggml's plain q4_0 layout instead of the CPU_REPACK buffer "
                         "type (q4_0_8x8 on AVX2) that llama.cpp uses by default")
    ap.add_argument("--torch-python", default=sys.executable,
                    help="a Python with torch and transformers; '' to skip torch")
    ap.add_argument("--torch-impls", default="eager,grouped_mm",
                    help="transformers experts_implementation values to time")
    ap.add_argument("--computes", default="f32,bf16",
                    help="libmoe's compute modes (moe bench --compute): f32 for every dtype, bf16 "
                         "for bf16 weights (what torch's bf16 module computes); default both")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per row (each tool)")
    ap.add_argument("--no-roofline", dest="roofline", action="store_false",
                    help="do not pass --roofline to moe bench")
    ap.add_argument("--wait-idle", type=float, default=120.0,
                    help="before each tool's run, wait up to this many seconds for the CPUs to "
                         "be --idle-threshold idle (shared machines); 0 to not wait")
    ap.add_argument("--idle-threshold", type=float, default=0.9,
                    help="idle fraction of all CPUs over 1 s that counts as idle (default 0.9)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run everything N times and report per-cell medians and spread")
    ap.add_argument("--json", help="also write all raw results to this file")
    ap.add_argument("--from-json", metavar="FILE",
                    help="measure nothing: print the report of a --json file again")
    # internal: the torch worker
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--impls", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker:
        torch_worker(args)
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            doc = json.load(f)
        args.threads = doc["threads"]
        for k in ("tokens", "dtypes", "torch_impls", "computes"):
            if k in doc:
                setattr(args, k, doc[k])
        print_report(args, doc["runs"], doc["started"])
        return 0
    if not os.access(args.moe, os.X_OK):
        ap.error(f"--moe {args.moe}: not an executable (build libmoe first: make)")
    if args.ggml and not os.access(args.ggml, os.X_OK):
        log(f"--ggml {args.ggml}: not found; ggml skipped (bench/README.md says how to build it)")
        args.ggml = ""
    if args.ggml_layer and not os.access(args.ggml_layer, os.X_OK):
        log(f"--ggml-layer {args.ggml_layer}: not found; ggml layer skipped (build it with "
            f"bench/build_ggml_harness.sh)")
        args.ggml_layer = ""
    computes = args.computes.split(",")
    bad = [c for c in computes if c not in LIBMOE_KEY]
    if bad or not computes:
        ap.error(f"--computes {args.computes}: accepted values are f32 and bf16 (comma-separated)")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    runs = []
    for rep in range(args.repeat):
        results = {}
        # One weight dtype at a time, every tool in turn, so that they share the machine's
        # state.
        for dtype in args.dtypes.split(","):
            results[dtype] = {"libmoe": None, "libmoe_bf16": None, "ggml": None,
                              "ggml_layer": None, "torch": None, "idle": {}}
            tools = []
            for c in computes:
                if c == "f32" or dtype in COMPUTE_BF16_DTYPES:
                    tools.append((LIBMOE_KEY[c], lambda a, d, c=c: run_libmoe(a, d, c)))
            if args.ggml_layer:
                tools.append(("ggml_layer", run_ggml_layer))
            if args.ggml:
                tools.append(("ggml", run_ggml))
            if args.torch_python and dtype in TORCH_DTYPES:
                tools.append(("torch", run_torch))
            for name, fn in tools:
                log(f"[run {rep + 1}/{args.repeat}, {dtype}] {name}...")
                results[dtype]["idle"][name] = wait_idle(args, f"{name} {dtype}")
                results[dtype][name] = fn(args, dtype)
        runs.append(results)
    print_report(args, runs, started)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"started": started, "threads": args.threads, "tokens": args.tokens,
                       "dtypes": args.dtypes, "torch_impls": args.torch_impls,
                       "computes": args.computes, "runs": runs}, f, indent=1)
    return 0


def print_report(args, runs, started):
    print(f"peers.py: Qwen3-30B-A3B MoE layer (H {H}, I {I}, E {E}, K {K}), {args.threads} "
          f"threads, started {started}")
    all_res = [r for res in runs for r in res.values()]
    docs = [r[key] for r in all_res for key in LIBMOE_KEY.values() if r.get(key)]
    if docs:
        m = docs[0]["machine"]
        print(f"libmoe {docs[0]['libmoe_version']}, kernel table {m['isa']}")
        roofs = sorted({(d.get("compute", "f32"), d.get("compute_roof", "fma")) for d in docs})
        if any(c != "f32" for c, _ in roofs):
            print("libmoe compute roofs (the peak of the instructions the expert GEMMs ran): " +
                  ", ".join(f"compute {c} -> {r}" for c, r in roofs))
        rfs = [d["roofline"] for d in docs if d.get("roofline")]
        if rfs:
            def rng(k):
                v = [x[k] for x in rfs if k in x]
                if not v:
                    return "n/a"
                return (f"{statistics.median(v):.1f} (range {min(v):.1f}-{max(v):.1f})"
                        if len(v) > 1 else f"{v[0]:.1f}")
            print(f"roofline (median of {len(rfs)} measurements, one per libmoe run): DRAM read "
                  f"{rng('dram_read_gbs')} GB/s, f32 FMA {rng('fma_f32_gflops')} GFLOP/s, "
                  f"VNNI int8 {rng('vnni_int8_gops')} GOP/s, bf16 vdpbf16ps "
                  f"{rng('bf16_dp_gflops')} GFLOP/s")
    th = next((r["torch"] for r in all_res if r["torch"]), None)
    if th:
        print(f"torch {th['torch']}, transformers {th['transformers']}, "
              f"{th['threads']} threads")
    print(report(args, runs))


if __name__ == "__main__":
    sys.exit(main())
