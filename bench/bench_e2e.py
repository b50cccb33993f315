#!/usr/bin/env python3
"""End-to-end tokens/s and resident memory of a transformers model with and without libmoe
(a script, not a test; docs/python.md has the table it gave on this machine).

The model: Qwen3-30B-A3B's shapes (hidden_size 2048, moe_intermediate_size 768, 128 experts,
top-8 renormalized, 32 query / 4 key-value heads of 128, vocab 151936) cut to 2 layers, random
bf16 weights (seeded), ~2.4 GB of experts. Each mode runs in its own process (clean RSS):

  eager       transformers' eager experts loop            experts_implementation="eager"
  grouped_mm  transformers' grouped_mm experts            experts_implementation="grouped_mm"
  experts     libmoe runs the experts, the model routes   experts_implementation="libmoe"
  patch       libmoe runs the whole sparse MoE block      libmoe.transformers.patch(model)

Measured per mode: prefill of --prefill tokens (one forward, logits of the last position
only, as generate() asks), then --decode greedy decode steps on the KV cache; tokens/s of
each, the share of time inside the MoE blocks, RSS (VmRSS, VmHWM) after packing, and the
bytes of expert weights resident (stock: the parameters; libmoe: memory_report's packed
bytes). --matrix runs the thread study of docs/python.md instead (the modes given under each
OMP_WAIT_POLICY of --policies, torch threads x libmoe threads of --threads, --rounds times).

  python3 bench/bench_e2e.py                 # the four modes
  python3 bench/bench_e2e.py --matrix --modes patch --policies passive,active,unset
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def rss():
    st = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            st[k] = int(v.split()[0]) * 1024
    return st


def build(layers, seed):
    import torch
    import transformers
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=4096,
        tie_word_embeddings=False)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = transformers.Qwen3MoeForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:  # N(0, 0.02) as the config's initializer_range, drawn in chunks
                flat = p.view(-1)
                for i in range(0, flat.numel(), 1 << 24):
                    n = min(1 << 24, flat.numel() - i)
                    flat[i:i + n] = (0.02 * torch.randn(n, generator=g)).to(p.dtype)
    # meta init left the rotary buffers empty: a fresh rotary module (inv_freq in f32, as
    # from_pretrained keeps it)
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg)
    return model.eval()


def run_mode(a):
    import torch
    torch.set_num_threads(a.torch_threads)
    sys.path.insert(0, str(ROOT / "python"))
    model = build(a.layers, a.seed)
    opts = {"num_threads": a.libmoe_threads} if a.libmoe_threads else {}
    import libmoe.transformers as lt
    if a.mode in ("eager", "grouped_mm"):
        model.set_experts_implementation(a.mode)
        expert_bytes = sum(m.gate_up_proj.numel() * 2 + m.down_proj.numel() * 2
                           for m in model.modules() if hasattr(m, "gate_up_proj"))
    elif a.mode == "experts":
        model.set_experts_implementation("libmoe")
        lt.pack(model, **opts)
        expert_bytes = lt.memory_report(model)["packed_bytes"]
    else:
        lt.patch(model, **opts)
        expert_bytes = lt.memory_report(model)["packed_bytes"]
    mem = rss()
    blocks = [m for m in model.modules()
              if type(m).__name__ in ("Qwen3MoeSparseMoeBlock", "LibmoeSparseMoeBlock")]
    moe_t = [0.0]

    def pre(mod, args):
        mod._t0 = time.perf_counter()

    def post(mod, args, out):
        moe_t[0] += time.perf_counter() - mod._t0
    for b in blocks:
        b.register_forward_pre_hook(pre)
        b.register_forward_hook(post)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 151936, (1, a.prefill), generator=g)
    res = {"mode": a.mode, "torch_threads": torch.get_num_threads(),
           "libmoe_threads": a.libmoe_threads or torch.get_num_threads(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}
    with torch.no_grad():
        best_pf, pf_moe = None, None
        for _ in range(a.reps):
            moe_t[0] = 0.0
            t0 = time.perf_counter()
            out = model(ids, use_cache=True, logits_to_keep=1)
            dt = time.perf_counter() - t0
            if best_pf is None or dt < best_pf:
                best_pf, pf_moe = dt, moe_t[0]
        cache = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        moe_t[0] = 0.0
        out = model(tok, past_key_values=cache, use_cache=True)  # warm-up step
        tok = out.logits[:, -1:].argmax(-1)
        moe_t[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(a.decode):
            out = model(tok, past_key_values=out.past_key_values, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
        dec = time.perf_counter() - t0
    res.update(prefill_tok_s=a.prefill / best_pf, prefill_moe_share=pf_moe / best_pf,
               decode_tok_s=a.decode / dec, decode_moe_share=moe_t[0] / dec,
               rss_bytes=mem["VmRSS"], hwm_bytes=mem["VmHWM"], expert_bytes=expert_bytes)
    print("RESULT " + json.dumps(res), flush=True)


def child(a, mode, env=None, **over):
    args = [sys.executable, __file__, "--child", "--mode", mode, "--layers", str(a.layers),
            "--prefill", str(a.prefill), "--decode", str(a.decode), "--reps", str(a.reps)]
    for k, v in over.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    p = subprocess.run(args, env=dict(os.environ, **(env or {})), capture_output=True, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    sys.stderr.write(p.stderr[-3000:])
    raise SystemExit("bench_e2e: mode %s failed (exit %d)" % (mode, p.returncode))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="eager,grouped_mm,experts,patch")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2, help="prefill repetitions (best kept)")
    ap.add_argument("--matrix", action="store_true", help="the thread study")
    ap.add_argument("--policies", default="passive,active",
                    help="--matrix: OMP_WAIT_POLICY values ('unset': not set)")
    ap.add_argument("--threads", default="1,2", help="--matrix: torch and libmoe thread counts")
    ap.add_argument("--rounds", type=int, default=1, help="--matrix: repetitions of the grid")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-threads", type=int, default=0)
    ap.add_argument("--libmoe-threads", type=int, default=0)
    a = ap.parse_args()
    if a.child:
        import torch
        a.torch_threads = a.torch_threads or torch.get_num_threads()
        return run_mode(a)
    rows = []
    if a.matrix:
        # rounds outermost, so a change in the machine's load shows in every configuration
        hdr = "| round | mode | OMP_WAIT_POLICY | torch threads | libmoe threads | prefill tok/s | decode tok/s |"
        print(hdr + "\n|---|---|---|---|---|---|---|")
        threads = [int(t) for t in a.threads.split(",")]
        for rnd in range(1, a.rounds + 1):
            for mode in a.modes.split(","):
                for wp in a.policies.split(","):
                    for tt in threads:
                        for lt_ in threads:
                            env = {"OMP_WAIT_POLICY": wp} if wp != "unset" else {}
                            r = child(a, mode, env, torch_threads=tt, libmoe_threads=lt_)
                            print("| %d | %s | %s | %d | %d | %.1f | %.2f |" % (
                                rnd, mode, wp, tt, lt_, r["prefill_tok_s"], r["decode_tok_s"]),
                                flush=True)
        return
    print("OMP_WAIT_POLICY=%s; MoE s / rest s: seconds inside the MoE blocks and outside them "
          "(the rest is the same work in every mode)" % os.environ.get("OMP_WAIT_POLICY", "unset"))
    print("| mode | prefill tok/s | prefill MoE s / rest s | decode tok/s | decode MoE ms / rest ms "
          "per token | RSS GB | peak RSS GB | expert GB |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in a.modes.split(","):
        r = child(a, mode)
        rows.append(r)
        pf, dc = a.prefill / r["prefill_tok_s"], 1000.0 / r["decode_tok_s"]
        print("| %s | %.1f | %.2f / %.2f | %.2f | %.0f / %.0f | %.2f | %.2f | %.2f |" % (
            mode, r["prefill_tok_s"], pf * r["prefill_moe_share"], pf * (1 - r["prefill_moe_share"]),
            r["decode_tok_s"], dc * r["decode_moe_share"], dc * (1 - r["decode_moe_share"]),
            r["rss_bytes"] / 1e9, r["hwm_bytes"] / 1e9, r["expert_bytes"] / 1e9), flush=True)


if __name__ == "__main__":
    main()
