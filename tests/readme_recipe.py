#!/usr/bin/env python3
"""README "Against transformers" as written, on the fixtures (captured from transformers' own
MoE blocks): every row of docs/families.md's block table against the fixtures' meta.json
(model class, block class) and the module the fixture generator hooked; the
capture snippet is valid Python that hooks the module the table names; the compare snippet,
run as written after `moe run` on each float32 fixture, reports under 1e-5.

Needs numpy and safetensors (as conformance_f64); LIBMOE_BIN is the moe executable."""
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout


SRC = os.environ.get("LIBMOE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("LIBMOE_BIN")
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def between(text, tag):
    m = re.search(rf"<!-- {tag}:begin -->\n(.*?)<!-- {tag}:end -->", text, re.S)
    if not m:
        sys.exit(f"no <!-- {tag}:begin --> ... <!-- {tag}:end --> block")
    return m.group(1)


def code(block):
    m = re.search(r"```\w*\n(.*?)```", block, re.S)
    return m.group(1)


def block_module(layer, family):
    """The module name of layer `layer`'s MoE block as tests/fixtures/gen_fixtures.py reaches it
    (its decoder_layers and moe_block, run on a stand-in model that records the attribute path;
    the generator itself needs torch and transformers)."""
    import ast
    gen = os.path.join(SRC, "tests", "fixtures", "gen_fixtures.py")
    tree = ast.parse(open(gen).read())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("decoder_layers", "moe_block")]
    ns = {}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), gen, "exec"), ns)

    class Path:
        def __init__(self, parts):
            self.parts = parts

        def __getattr__(self, name):
            return Path(self.parts + [name])

        def __getitem__(self, i):
            return Path(self.parts + [str(i)])

    return ".".join(ns["moe_block"](Path([]), layer, family).parts)


readme = open(os.path.join(SRC, "README.md")).read()
families = open(os.path.join(SRC, "docs", "families.md")).read()

# the block table: family -> (model class, module with ".L.", block class)
table = {}
for line in between(families, "blocks").splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 4 and cells[0] not in ("family",) and not cells[0].startswith("-"):
        table[cells[0]] = tuple(cells[1:])
print(f"block table: {len(table)} families")

# every fixture's family has its row, and the row is what the fixture was captured from
checked = set()
for meta_path in sorted(glob.glob(os.path.join(SRC, "tests", "fixtures", "*", "meta.json"))):
    meta = json.load(open(meta_path))
    fam, layer = meta["family"], meta["layer"]
    if fam not in table:
        fail(f"{meta['name']}: family {fam} has no row in docs/families.md's block table")
        continue
    model_class, module, block_class = table[fam]
    if model_class != meta["hf_class"]:
        fail(f"{meta['name']}: table says model class {model_class}, the fixture was built with {meta['hf_class']}")
    if block_class != meta["block_class"]:
        fail(f"{meta['name']}: table says block class {block_class}, the fixture's block is {meta['block_class']}")
    want = block_module(layer, fam)
    if module.replace(".L.", f".{layer}.") != want:
        fail(f"{meta['name']}: table says module {module}, the fixture generator hooked {want}")
    checked.add(fam)
print(f"rows checked against fixtures: {sorted(checked)}")
unchecked = sorted(set(table) - checked)
if unchecked:
    fail(f"rows without a fixture: {unchecked} (every row of the block table has one)")

# the capture snippet: valid Python that hooks the module named by the table for most families
capture = code(between(readme, "recipe-capture"))
compile(capture, "README capture snippet", "exec")
for needle in ('get_submodule(f"model.layers.{L}.mlp")', "register_forward_hook(hook, with_kwargs=True)",
               'reshape(-1, H)', '{"hidden_states": saved["hidden_states"]}', '"in.safetensors"',
               '"expected.safetensors"'):
    if needle not in capture:
        fail(f"capture snippet lacks {needle}")

# the compare snippet as written, after moe run, on every float32 fixture
compare = code(between(readme, "recipe-compare"))
if not BIN or not os.access(BIN, os.X_OK):
    sys.exit("LIBMOE_BIN is not set to the moe executable")
ran = 0
for meta_path in sorted(glob.glob(os.path.join(SRC, "tests", "fixtures", "*", "meta.json"))):
    meta = json.load(open(meta_path))
    if meta["weight_dtype"] != "F32":
        continue
    ckdir = os.path.dirname(meta_path)
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(ckdir, "input.safetensors"), os.path.join(tmp, "in.safetensors"))
        shutil.copy(os.path.join(ckdir, "expected.safetensors"), os.path.join(tmp, "expected.safetensors"))
        r = subprocess.run([BIN, "run", "--checkpoint", ckdir, "--layer", str(meta["layer"]), "--input",
                            "in.safetensors", "--output", "out.safetensors", "--threads", "2"]
                           + (["--experts", meta["expert_set"]] if meta.get("expert_set") else []),
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{meta['name']}: moe run exited {r.returncode}: {r.stderr.strip()}")
            continue
        here = os.getcwd()
        out = io.StringIO()
        try:
            os.chdir(tmp)
            with redirect_stdout(out):
                exec(compile(compare, "README compare snippet", "exec"), {})
        finally:
            os.chdir(here)
        m = re.search(r"= ([0-9.eE+-]+)\s*$", out.getvalue())
        if not m:
            fail(f"{meta['name']}: the compare snippet printed {out.getvalue()!r}")
            continue
        rel = float(m.group(1))
        print(f"{meta['name']}: {out.getvalue().strip()}")
        if not rel < 1e-5:
            fail(f"{meta['name']}: {rel} is not below 1e-5")
        ran += 1
if ran < 10:
    fail(f"only {ran} float32 fixtures compared")

print(f"{ran} fixtures compared; {len(failures)} failed")
sys.exit(1 if failures else 0)
