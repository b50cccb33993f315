#!/usr/bin/env bash
# The C API example in README.md must be examples/minimal.c verbatim, and the README's link
# lines must work as written: the in-tree line (build/libmoe.a; `mpi` dropped for a build
# without MPI, as the README says), and the installed line (cmake --install, libmoe.pc).
# Usage: readme_example.sh SRC BUILD mpi|nompi [EXTRA_CFLAGS]
set -euo pipefail
src=$1; build=$2; mpi=$3; extra=${4:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sed -n '/<!-- example:begin -->/,/<!-- example:end -->/p' "$src/README.md" | sed '1,2d;$d' | sed '$d' > "$tmp/readme.c"
if ! diff -u "$src/examples/minimal.c" "$tmp/readme.c"; then
  echo "README.md example differs from examples/minimal.c" >&2; exit 1
fi

# the link lines: the commands of the sh block between <!-- link:begin --> and <!-- link:end -->
sed -n '/<!-- link:begin -->/,/<!-- link:end -->/p' "$src/README.md" | grep '^cc ' > "$tmp/lines"
tree_line=$(grep -- 'build/libmoe.a' "$tmp/lines") || { echo "README.md: no in-tree link line" >&2; exit 1; }
inst_line=$(grep -- 'pkg-config --cflags --libs libmoe' "$tmp/lines") || { echo "README.md: no installed link line" >&2; exit 1; }
if [ "$mpi" = nompi ]; then
  tree_line=${tree_line/ mpi)/)}
fi
echo "in the tree: $tree_line"
# the README's layout: app.c beside include/ and build/
mkdir "$tmp/app"
cp "$tmp/readme.c" "$tmp/app/app.c"
ln -s "$src/include" "$tmp/app/include"
ln -s "$build" "$tmp/app/build"
(cd "$tmp/app" && eval "$tree_line $extra" && ./app | tee out.txt && grep -q '^MOE_OK out\[0\] = ' out.txt)

# installed into a scratch prefix
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pcdir=$(dirname "$(find "$tmp/prefix" -name libmoe.pc | head -1)")
echo "installed: $inst_line"
(cd "$tmp/app" && rm -f app && export PKG_CONFIG_PATH="$pcdir" && eval "$inst_line $extra" &&
   LD_LIBRARY_PATH="$pcdir/.." ./app | tee out2.txt && grep -q '^MOE_OK out\[0\] = ' out2.txt)

# the labels `make test` runs, as the README lists them ("`make test` runs every label: ...")
if [ -f "$build/CTestTestfile.cmake" ]; then
  # the README describes the default build: without MPI there is no mpi label to list
  mapfile -t labels < <( (cd "$build" && ctest --print-labels | sed -n 's/^  *//p' | grep -v '^All Labels:';
                          if [ "$mpi" = nompi ]; then echo mpi; fi) | sort -u)
  para=$(awk '/^`make test` runs every label:/{on=1} on&&/^$/{exit} on' "$src/README.md")
  [ -n "$para" ] || { echo "README.md: no '\`make test\` runs every label:' paragraph" >&2; exit 1; }
  listed=$(grep -o '`[a-z]*` (' <<<"$para" | tr -d '`( ' | sort | tr '\n' ' ')
  have="${labels[*]} "
  if [ "$listed" != "$have" ]; then
    echo "README.md lists the labels '$listed'; ctest has '$have'" >&2; exit 1
  fi
  echo "labels: $have"
fi
