#!/bin/sh
# Build bench/ggml_moe.c (ggml's MoE expert FFN under libmoe bench's memory conditions)
# against a ggml built from source outside this repository (see bench/README.md).
#
#   GGML_SRC    ggml source tree, for the headers      (default /tmp/ggml-src)
#   GGML_BUILD  its CMake build dir, libraries in src/ (default /tmp/ggml-build)
#   OUT         the program                            (default build/ggml_moe)
#   CC          the C compiler                         (default cc)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
GGML_SRC=${GGML_SRC:-/tmp/ggml-src}
GGML_BUILD=${GGML_BUILD:-/tmp/ggml-build}
OUT=${OUT:-$here/../build/ggml_moe}
CC=${CC:-cc}
for f in "$GGML_SRC/include/ggml.h" "$GGML_SRC/include/ggml-cpu.h" \
         "$GGML_BUILD/src/libggml.so" "$GGML_BUILD/src/libggml-base.so" \
         "$GGML_BUILD/src/libggml-cpu.so"; do
    if [ ! -e "$f" ]; then
        echo "build_ggml_harness.sh: $f not found (build ggml first: bench/README.md)" >&2
        exit 1
    fi
done
mkdir -p "$(dirname "$OUT")"
$CC -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra \
    -I"$GGML_SRC/include" "$here/ggml_moe.c" -o "$OUT" \
    -L"$GGML_BUILD/src" -Wl,-rpath,"$GGML_BUILD/src" -lggml -lggml-base -lggml-cpu -lm
echo "$OUT"
