#!/usr/bin/env bash
# A virtual environment for the Python package's torch / transformers tests (ctest label
# python, `make test-python`): the versions tests/fixtures/VERSIONS.txt pins, from PyPI.
#   scripts/install-python-test-deps.sh [VENV]      (default build/venv-python, ignored by git)
# torch's default PyPI wheel (with CUDA libraries) is about 3 GB; set TORCH_INDEX_URL (e.g.
# https://download.pytorch.org/whl/cpu) for the CPU-only wheel of the same version. Idempotent:
# a venv that already has the pinned versions is left alone. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-build/venv-python}
PY=${PYTHON:-python3}
PINS=(torch==2.15.0 transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6 accelerate==1.15.0 pytest)
have() {
  "$VENV/bin/python" - <<'PYEOF' 2>/dev/null
import importlib.metadata as m, sys
want = {"torch": "2.15.0", "transformers": "5.24.0", "safetensors": "0.8.0", "numpy": "2.4.6",
        "accelerate": "1.15.0"}
ok = all(m.version(k).split("+")[0] == v for k, v in want.items())
m.version("pytest")
sys.exit(0 if ok else 1)
PYEOF
}
if [ -x "$VENV/bin/python" ] && have; then
  echo "$VENV/bin/python"
  exit 0
fi
if ! "$PY" -m venv --help >/dev/null 2>&1; then
  echo "install-python-test-deps: $PY has no venv module (Debian: apt-get install python3-venv)" >&2
  exit 1
fi
echo "install-python-test-deps: creating $VENV with ${PINS[*]} (torch is large: ~3 GB from PyPI)" >&2
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "$VENV/bin/python" -m pip install -q torch==2.15.0 --index-url "$TORCH_INDEX_URL" >&2
fi
"$VENV/bin/python" -m pip install -q "${PINS[@]}" >&2
have || { echo "install-python-test-deps: $VENV lacks the pinned versions after installing" >&2; exit 1; }
echo "$VENV/bin/python"
