#!/usr/bin/env bash
# Install what building and testing libmoe needs on a Debian machine, only where missing.
# Run as root (or with sudo available). Idempotent: a machine that has everything is left alone.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libjansson-dev libcmocka-dev libxxhash-dev libomp-dev
      openmpi-bin libopenmpi-dev python3 python3-numpy python3-pip
      clang libclang-rt-dev) # the fuzz build (make fuzz): clang and its libFuzzer / sanitizer runtimes
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The float64 conformance test reads safetensors from Python, and the Python package's numpy
# tests (python_numpy) run under pytest: numpy + safetensors + pytest only (never torch; the
# library itself never uses Python).
PY=${PYTHON:-python3}
if ! "$PY" -c 'import numpy, safetensors, pytest' 2>/dev/null; then
  echo "install-deps: installing Python packages numpy, safetensors, pytest" >&2
  "$PY" -m pip install -q numpy safetensors pytest 2>/dev/null ||
    "$PY" -m pip install -q --break-system-packages numpy safetensors pytest
fi
