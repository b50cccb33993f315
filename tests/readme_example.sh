#!/usr/bin/env bash
# The C API example in README.md must be examples/minimal.c verbatim, compile against the
# installed-style header and library, and run.
set -euo pipefail
src=$1; build=$2; extra=${3:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sed -n '/<!-- example:begin -->/,/<!-- example:end -->/p' "$src/README.md" | sed '1,2d;$d' | sed '$d' > "$tmp/readme.c"
if ! diff -u "$src/examples/minimal.c" "$tmp/readme.c"; then
  echo "README.md example differs from examples/minimal.c" >&2; exit 1
fi
cc -std=c11 -Wall -Wextra -Werror -I"$src/include" "$tmp/readme.c" "$build/libmoe.a" -fopenmp -ljansson -lxxhash -lm $extra -o "$tmp/example"
"$tmp/example" | tee "$tmp/out.txt"
grep -q '^MOE_OK out\[0\] = ' "$tmp/out.txt"
