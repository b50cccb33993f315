"""libmoe inside real transformers models (libmoe.transformers): tiny random models of seven
families (Nemotron-H's non-gated experts among them) built from their config classes
(tiny_models.py, seeded), stock (transformers' eager experts) against
experts_implementation="libmoe" and against patch().

- f32: greedy generate() of 32 tokens from fixed prompt ids gives the same ids; every MoE
  module's output (experts module, or whole block for patch) on the inputs the stock model
  gave it is within the f32 bound of docs/numerics.md (1e-5 * max |stock output|).
- bf16: each experts module within the first-order bf16 bound of tests/unit/test_fixtures.c
  (derivation in bf16_bound below); the model's logits along the stock greedy sequence within
  2 B of stock's, B = how far stock's own bf16 run is from the f32 run of the same (bf16)
  weights (docs/python.md "Numerics": libmoe's MoE rounds less than stock's, so libmoe's bf16
  model is within B of the f32 run too, and the triangle inequality gives 2 B).
- memory: the originals are freed, memory_report counts the packed bytes.
- the custom op under torch.library.opcheck and torch.compile; bad input raising libmoe.Error.
Label python (needs torch + transformers; skipped without them)."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import libmoe
import libmoe.transformers as lt
from tiny_models import FAMILIES, build

PROMPT = torch.tensor([[3, 17, 42, 99, 5, 64, 127, 8]])  # fixed prompt ids [1, 8]
NEW = 32
U = 2.0 ** -8  # bf16 unit roundoff (8 significant bits, round to nearest)
BLOCKS = tuple(lt._BLOCKS)


def greedy(model):
    with torch.no_grad():
        return model.generate(PROMPT, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)


def capture(model, seq):
    """Run `model` on seq and return, per MoE block name, (block input, block output,
    experts inputs (hidden, top_k_index, top_k_weights), experts output)."""
    got, hooks = {}, []
    for name, m in model.named_modules():
        if type(m).__name__ in BLOCKS:
            def blk(mod, args, out, name=name):
                got.setdefault(name, {})["block"] = (args[0].detach().clone(),
                                                     (out[0] if isinstance(out, tuple) else out).detach().clone())

            def exp(mod, args, out, name=name):
                got.setdefault(name, {})["experts"] = (tuple(a.detach().clone() for a in args),
                                                       out.detach().clone())
            hooks += [m.register_forward_hook(blk), m.experts.register_forward_hook(exp)]
    with torch.no_grad():
        model(seq)
    for h in hooks:
        h.remove()
    assert len(got) == 2, "expected 2 MoE blocks, found %d" % len(got)
    return got


def expert_weight_bytes(model, with_shared):
    """Bytes of the expert matrices (gate_up_proj, or up_proj when non-gated, and down_proj;
    the shared expert's projections when with_shared) of the stock model: what libmoe packs
    (w13 + w2 + shared)."""
    n = 0
    for m in model.modules():
        if type(m).__name__ in BLOCKS:
            gated = getattr(m.experts, "has_gate", True)  # Nemotron-H: up_proj alone
            ts = [m.experts.gate_up_proj if gated else m.experts.up_proj, m.experts.down_proj]
            for sh in ("shared_expert", "shared_experts"):
                if with_shared and hasattr(m, sh):
                    s = getattr(m, sh)
                    ts += [s.gate_proj.weight] if gated else []
                    ts += [s.up_proj.weight, s.down_proj.weight]
            n += sum(t.numel() * t.element_size() for t in ts)
    return n


@pytest.mark.parametrize("family", list(FAMILIES))
def test_f32_generate_and_layers(family):
    stock = build(family)
    seq = greedy(stock)
    assert seq.shape == (1, PROMPT.shape[1] + NEW)
    ref = capture(stock, seq)
    exp_mode = build(family, experts_implementation="libmoe")
    patched = build(family)
    assert lt.patch(patched) == 2
    assert torch.equal(greedy(exp_mode), seq), "experts_implementation='libmoe' generate differs"
    assert torch.equal(greedy(patched), seq), "patch() generate differs"
    for name, r in ref.items():
        (x, ids, w), y = r["experts"]
        got = exp_mode.get_submodule(name).experts(x, ids, w)
        assert float((got - y).abs().max()) <= 1e-5 * float(y.abs().max()), name
        xb, yb = r["block"]
        out = patched.get_submodule(name)(xb)
        out = out[0] if isinstance(out, tuple) else out
        assert float((out - yb).abs().max()) <= 1e-5 * float(yb.abs().max()), name
    # originals freed, packed bytes = the expert matrices' bytes (f32: the same dtype)
    for model, shared in ((exp_mode, False), (patched, True)):
        r = lt.memory_report(model)
        assert r["modules"] == 2 and r["remaining_original_bytes"] == 0
        assert r["packed_bytes"] == expert_weight_bytes(stock, shared)
        assert r["original_bytes"] >= r["packed_bytes"]


def bf16_bound(experts, x, ids, w, routing=None):
    """First-order bound on |libmoe - stock| for one bf16 experts call (same given routing),
    tests/unit/test_fixtures.c's derivation without its routing terms (the routing is the
    model's in both): stock rounds g and v, silu(g), silu(g) v (items 2-5: P), the down output,
    the weighted product and K - 1 adds of index_add_ (c_y = 1 + 1 + K - 1 times Q); libmoe
    adds its final rounding to bf16 (u |out| <= u Q) and its f32 error (1e-5 max |out|).
    In float64 from the bf16 values: P_tj = sum_k |w_k| sum_i |Wd_ji| |h_ki| (|kappa(g_ki)| + 3),
    Q_tj = sum_k |w_k| |y_kj|, kappa(g) = 1 + g (1 - sigmoid(g)). Silu experts, and
    Nemotron-H's non-gated relu2 ones (h = r^2, r = relu(u)): rounding u moves h by 2 u |h|,
    rounding h by u |h|, so their P term is |h_ki| 3 (stock's f32 weighted sum, which
    top_k_weights' dtype gives there, rounds less than the c_y counted)."""
    gated = getattr(experts, "has_gate", True)
    gu = (experts.gate_up_proj if gated else experts.up_proj).detach().double()
    wd = experts.down_proj.detach().double()
    I = wd.shape[-1]
    xd, wt = x.double(), w.double()
    T, K = ids.shape
    P = torch.zeros(T, x.shape[1], dtype=torch.float64)
    Q, exact = torch.zeros_like(P), torch.zeros_like(P)
    for k in range(K):
        e = ids[:, k]
        gv = torch.einsum("toh,th->to", gu[e], xd)  # [T, 2I] (non-gated: [T, I])
        if gated:
            g, v = gv[:, :I], gv[:, I:]
            sg = torch.sigmoid(g)
            h = g * sg * v  # [T, I]
            kappa = 1 + g * (1 - sg)
            amp = kappa.abs() + 3
        else:
            assert type(experts.act_fn).__name__ == "ReLUSquaredActivation"
            h = torch.relu(gv) ** 2  # [T, I]
            amp = 3.0
        W = wd[e]  # [T, H, I]
        y = torch.einsum("thi,ti->th", W, h)
        P += wt[:, k, None].abs() * torch.einsum("thi,ti->th", W.abs(), h.abs() * amp)
        Q += wt[:, k, None].abs() * y.abs()
        exact += wt[:, k, None] * y
    c_y = 1 + 1 + (K - 1)
    if routing is not None:  # [T, 1]: the routing terms (patch: the stock router rounds)
        c_y = c_y + routing
    return U * (P + (c_y + 1) * Q) * 1.05 + 1e-5 * float(exact.abs().max())


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gpt_oss"])
def test_bf16_experts_within_derived_bound(family):
    stock = build(family, dtype=torch.bfloat16)
    seq = greedy(stock)
    ref = capture(stock, seq)
    exp_mode = build(family, dtype=torch.bfloat16, experts_implementation="libmoe")
    worst = 0.0
    for name, r in ref.items():
        (x, ids, w), y = r["experts"]
        bound = bf16_bound(stock.get_submodule(name).experts, x, ids, w)
        got = exp_mode.get_submodule(name).experts(x, ids, w)
        assert got.dtype == torch.bfloat16
        err = (got.double() - y.double()).abs()
        worst = max(worst, float((err / bound).max()))
        assert bool((err <= bound).all()), "%s: worst err/bound %.3f" % (name, float((err / bound).max()))
    print("%s bf16 experts: worst err/bound %.3f" % (family, worst))


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "olmoe"])
def test_bf16_patch_blocks_within_derived_bound(family):
    """patch() in bf16, per block on the stock model's inputs: the bound of
    tests/unit/test_fixtures.c with its routing terms (2 L_t for the router logits rounded to
    bf16; Qwen3 / OLMoE cast the weights to bf16: 1 more), libmoe's final rounding and f32
    error, on the exact (float64) routing; tokens where the stock router flipped experts
    (routing_flips) are left out (no bound holds there; test_bf16_logits_near_stock checks
    them). Families without a shared expert (the bound has no shared-expert terms)."""
    import copy
    stock = build(family, dtype=torch.bfloat16)
    seq = greedy(stock)
    ref = capture(stock, seq)
    patched = build(family, dtype=torch.bfloat16)
    lt.patch(patched)
    cast = 0 if family == "mixtral" else 1
    worst, kept = 0.0, 0
    for name, r in ref.items():
        blk = stock.get_submodule(name)
        xb, yb = r["block"]  # [1, T, H]
        xb, yb = xb.reshape(-1, xb.shape[-1]), yb.reshape(-1, yb.shape[-1])
        (_, ids, _), _ = r["experts"]
        router = copy.deepcopy(blk.gate).double()
        with torch.no_grad():
            logits, w64, ids64 = router(xb.double())
        same = torch.tensor([set(a.tolist()) == set(b.tolist()) for a, b in zip(ids, ids64)])
        L = logits.abs().max(dim=-1, keepdim=True).values
        bound = bf16_bound(blk.experts, xb, ids64, w64, routing=2 * L + cast)
        out = patched.get_submodule(name)(xb)
        err = (out.double() - yb.double()).abs()
        ratio = (err / bound)[same]
        kept += int(same.sum())
        worst = max(worst, float(ratio.max()))
        assert bool((ratio <= 1).all()), "%s: worst err/bound %.3f" % (name, float(ratio.max()))
    print("%s bf16 patch blocks: worst err/bound %.3f over %d tokens" % (family, worst, kept))


def routing_flips(model, seq):
    """Tokens where the stock bf16 router chose other experts than exact arithmetic would on
    the same input: per MoE block, the block's router run in float64 (transformers' own
    router module, copied) against the top_k_index the bf16 run passed to its experts.
    Returns [(block, token, gap, allowed)]: gap = the float64 selection-key gap between the
    experts swapped, allowed = the most bf16's rounding of the router logits can move it
    (|dl| <= u |l| <= u L_t for each logit, so a swap needs gap <= 2 u L_t; sigmoid keys
    (DeepSeek-V3) move at most 1/4 of that)."""
    import copy
    ref = capture(model, seq)
    out = []
    for name, r in ref.items():
        blk = model.get_submodule(name)
        router = copy.deepcopy(getattr(blk, "gate", None) or blk.router).double()
        (x, ids, _), _ = r["experts"]
        with torch.no_grad():
            logits, _, exact_ids = router(x.double())
            key = logits
            if hasattr(router, "e_score_correction_bias"):
                key = logits.sigmoid() + router.e_score_correction_bias
        L = logits.abs().max(dim=-1).values
        for t in range(ids.shape[0]):
            a, b = set(ids[t].tolist()), set(exact_ids[t].tolist())
            if a != b:
                gap = float(key[t, sorted(b - a)].min() - key[t, sorted(a - b)].max())
                scale = 0.25 if hasattr(router, "e_score_correction_bias") else 1.0
                out.append((name, t, gap, scale * 2 * U * float(L[t])))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_logits_near_stock(family):
    """Along the stock bf16 greedy sequence: |logits - stock| <= 2 B (module docstring);
    patch() routes in f32, so where the stock bf16 router itself departed from exact routing
    (a near tie that bf16's rounding of the router logits flipped) no logits bound holds for
    patch(): each such flip must then be explained by that rounding (gap <= allowed)."""
    stock = build(family, dtype=torch.bfloat16)
    f32 = build(family, dtype=torch.bfloat16).float()  # the same (bf16-rounded) weights in f32
    seq = greedy(stock)
    exp_mode = build(family, dtype=torch.bfloat16, experts_implementation="libmoe")
    patched = build(family, dtype=torch.bfloat16)
    lt.patch(patched)
    flips = routing_flips(stock, seq)
    for name, t, gap, allowed in flips:
        assert gap <= allowed, "%s token %d: stock bf16 routing departs from exact by %.3g > %.3g" \
            % (name, t, gap, allowed)
    with torch.no_grad():
        ls = stock(seq).logits.double()
        B = float((ls - f32(seq).logits.double()).abs().max())
        for tag, m in (("experts", exp_mode), ("patch", patched)):
            d = float((m(seq).logits.double() - ls).abs().max())
            same = torch.equal(greedy(m), seq)
            print("%s bf16 %s: max|logits - stock| %.4f, 2B %.4f, stock routing flips %d, "
                  "generate same ids: %s" % (family, tag, d, 2 * B, len(flips), same))
            if tag == "experts" or not flips:
                assert d <= 2 * B, "%s %s: %.4f > 2B = %.4f" % (family, tag, d, 2 * B)


def test_opcheck_and_compile():
    m = build("qwen3_moe")
    exp_mode = build("qwen3_moe", experts_implementation="libmoe")
    r = capture(m, PROMPT)
    name = next(iter(r))
    (x, ids, w), _ = r[name]["experts"]
    ex = exp_mode.get_submodule(name).experts
    ex(x, ids, w)  # packs
    h = ex._libmoe_handle
    torch.library.opcheck(torch.ops.libmoe.experts.default, (x, ids, w, h))
    torch.library.opcheck(torch.ops.libmoe.experts.default,
                          (x.bfloat16(), ids, w.bfloat16(), h))
    patched = build("qwen3_moe")
    lt.patch(patched)
    blk = patched.get_submodule(name)
    torch.library.opcheck(torch.ops.libmoe.experts.default, (x, None, None, blk._libmoe_handle))
    with torch.no_grad():
        eager = patched(PROMPT).logits
        compiled = torch.compile(patched, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(PROMPT).logits, eager)
        assert lt.pack(exp_mode) == 1  # the other layer; name's was packed above
        ce = torch.compile(exp_mode, backend="aot_eager", fullgraph=True)
        assert torch.equal(ce(PROMPT).logits, exp_mode(PROMPT).logits)


def test_memory_logged(caplog):
    import logging
    m = build("qwen2_moe")
    with caplog.at_level(logging.INFO, logger="libmoe"):
        lt.patch(m)
        rep = libmoe.memory_report(m)
    assert rep == lt.memory_report(m)
    assert "bytes before" in caplog.text and "memory_report" in caplog.text
    assert rep["remaining_original_bytes"] == 0
    assert all(p.numel() == 0 for b in m.modules() if isinstance(b, lt.LibmoeSparseMoeBlock)
               for p in b.parameters())
    assert lt.release(m) == 2
    with pytest.raises(libmoe.Error):
        m(PROMPT)


def test_bad_input():
    m = build("qwen3_moe", experts_implementation="libmoe")
    ex = m.model.layers[0].mlp.experts
    x = torch.randn(5, 64)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 0]])
    w = torch.full((5, 2), 0.5)
    with pytest.raises(libmoe.InvalidArgumentError, match="meta"):
        ex(torch.empty(5, 64, device="meta"), ids, w)  # stands in for a CUDA tensor
    y = ex(x, ids, w)
    assert y.shape == (5, 64)
    with pytest.raises(libmoe.InvalidArgumentError, match="meta"):
        ex(torch.empty(5, 64, device="meta"), ids, w)
    bad = ids.clone()
    bad[2, 1] = 8  # out of [0, E)
    with pytest.raises(libmoe.InvalidArgumentError, match="token 2"):
        ex(x, bad, w)
    bad = ids.clone()
    bad[3, 1] = bad[3, 0]  # repeated in a row
    with pytest.raises(libmoe.InvalidArgumentError, match="token 3"):
        ex(x, bad, w)
    h = ex._libmoe_handle
    with pytest.raises(libmoe.DtypeError):
        torch.ops.libmoe.experts(x.double(), ids, w, h)
    with pytest.raises(libmoe.InvalidArgumentError, match="not contiguous"):
        torch.ops.libmoe.experts(torch.randn(64, 5).t(), ids, w, h)
    with pytest.raises(libmoe.ShapeError):
        torch.ops.libmoe.experts(torch.randn(5, 32), ids, w, h)
    with pytest.raises(libmoe.InvalidArgumentError, match="handle"):
        torch.ops.libmoe.experts(x, ids, w, 10 ** 9)
    # a float16 model: libmoe takes f32 / bf16 activations
    m16 = build("mixtral", dtype=torch.float16, experts_implementation="libmoe")
    with pytest.raises(libmoe.DtypeError, match="float16|f16"):
        with torch.no_grad():
            m16(PROMPT)
    # a C error (moe_plan_create: swiglu_limit must be > 0) surfaces with libmoe's message
    g = build("gpt_oss", experts_implementation="libmoe")
    g.model.layers[0].mlp.experts.limit = -1.0
    with pytest.raises(libmoe.InvalidArgumentError) as e:
        with torch.no_grad():
            g(PROMPT)
    assert "swiglu_limit" in e.value.message


def test_unsupported_raise_naming_class():
    import transformers
    from torch import nn
    cfg = transformers.GraniteMoeConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        num_local_experts=8, num_experts_per_tok=2,
                                        intermediate_size=32)
    gm = transformers.GraniteMoeForCausalLM(cfg)
    with pytest.raises(libmoe.UnsupportedError, match="GraniteMoeMoE"):
        lt.patch(gm)
    with pytest.raises(libmoe.UnsupportedError, match="no sparse MoE block"):
        lt.patch(build_dense())

    # an experts module with a gating libmoe does not know
    from transformers.integrations.moe import use_experts_implementation

    @use_experts_implementation
    class OddExperts(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.num_experts = 4
            self.gate_up_proj = nn.Parameter(torch.randn(4, 16, 8))
            self.down_proj = nn.Parameter(torch.randn(4, 8, 8))

        def _apply_gate(self, gu):
            return gu[..., :8] * gu[..., 8:]

    cfg = transformers.PretrainedConfig()
    cfg._experts_implementation = "libmoe"
    odd = OddExperts(cfg)
    with pytest.raises(libmoe.UnsupportedError, match="OddExperts"):
        odd(torch.randn(2, 8), torch.tensor([[0, 1], [2, 3]]), torch.ones(2, 2))
    assert odd.gate_up_proj.numel() == 4 * 16 * 8  # nothing freed on a refusal

    # non-gated experts with an activation libmoe has no non-gated form of (tanh)
    nh = build("nemotron_h", experts_implementation="libmoe")
    ex = nh.model.layers[1].mixer.experts
    ex.act_fn = nn.Tanh()
    with pytest.raises(libmoe.UnsupportedError, match="NemotronHExperts.*Tanh"):
        with torch.no_grad():
            nh(PROMPT)
    assert ex.up_proj.numel() > 0  # nothing freed on a refusal
    # Nemotron-H's latent projections (moe_latent_size) are refused by patch(), naming them
    nl = build("nemotron_h", moe_latent_size=16)
    with pytest.raises(libmoe.UnsupportedError, match="NemotronHMoE.*fc1_latent_proj"):
        lt.patch(nl)


def build_dense():
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(cfg)


def test_library_not_found_message():
    env = dict(os.environ, LIBMOE_LIBRARY="/nonexistent/libmoe.so")
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import libmoe"
                        % os.path.join(here, "..")], env=env, capture_output=True, text=True)
    assert p.returncode == 1  # an ImportError, not a crash
    assert "ImportError" in p.stderr and "/nonexistent/libmoe.so" in p.stderr
    assert "LIBMOE_LIBRARY" in p.stderr and "make" in p.stderr
