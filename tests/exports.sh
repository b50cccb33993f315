#!/usr/bin/env bash
# libmoe.so exports exactly the functions declared MOE_API in include/*.h: every dynamic
# export (nm -D --defined-only) must be such a declaration, and every declaration exported.
# Usage: exports.sh SRC LIBMOE_SO
set -euo pipefail
src=$1; so=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the declared names: "MOE_API <type> <name>(" at the start of a line
cat "$src"/include/*.h | sed -n 's/^MOE_API [^(]*[ *]\(moe_[A-Za-z0-9_]*\)[ ]*(.*/\1/p' | sort -u > "$tmp/declared"
# the exports (linker-defined markers excluded: they are no code of libmoe)
nm -D --defined-only "$so" | awk '{print $NF}' | sed 's/@.*//' |
  grep -v -x -E '_init|_fini|_edata|_end|__bss_start' | sort -u > "$tmp/exported"
[ -s "$tmp/declared" ] || { echo "no MOE_API declarations found in $src/include" >&2; exit 1; }
bad=0
if extra=$(comm -13 "$tmp/declared" "$tmp/exported") && [ -n "$extra" ]; then
  echo "libmoe.so exports symbols not declared MOE_API in include/*.h:" >&2; echo "$extra" >&2; bad=1
fi
if missing=$(comm -23 "$tmp/declared" "$tmp/exported") && [ -n "$missing" ]; then
  echo "declared MOE_API in include/*.h but not exported by libmoe.so:" >&2; echo "$missing" >&2; bad=1
fi
# every public function declaration carries MOE_API (a declaration without it would be hidden)
if plain=$(grep -n -E '^(const )?[a-z_0-9]+ \**moe_[a-z0-9_]+\(' "$src"/include/*.h) && [ -n "$plain" ]; then
  echo "public declarations without MOE_API:" >&2; echo "$plain" >&2; bad=1
fi
[ $bad = 0 ] && echo "libmoe.so exports the $(wc -l < "$tmp/exported") MOE_API functions of include/*.h, nothing else"
exit $bad
