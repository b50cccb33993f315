#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build examples/minimal.c against it twice:
# through pkg-config (libmoe.pc) and through find_package(libmoe) (libmoe::moe), and run both.
# Usage: install_package.sh SRC BUILD
set -euo pipefail
src=$1; build=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pc=$(find "$tmp/prefix" -name libmoe.pc | head -1)
[ -n "$pc" ] || { echo "cmake --install put no libmoe.pc under the prefix" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
cfg=$(find "$tmp/prefix" -name libmoeConfig.cmake | head -1)
[ -n "$cfg" ] || { echo "cmake --install put no libmoeConfig.cmake under the prefix" >&2; exit 1; }
[ -f "$(dirname "$cfg")/libmoeConfigVersion.cmake" ] || { echo "no libmoeConfigVersion.cmake" >&2; exit 1; }

# pkg-config
(cd "$tmp" && PKG_CONFIG_PATH="$(dirname "$pc")" &&
   export PKG_CONFIG_PATH && cc -std=c11 -o app_pc "$src/examples/minimal.c" $(pkg-config --cflags --libs libmoe) &&
   LD_LIBRARY_PATH="$libdir" ./app_pc | tee out_pc.txt && grep -q '^MOE_OK out\[0\] = ' out_pc.txt)

# find_package(libmoe), a version request included
mkdir "$tmp/proj"
cat > "$tmp/proj/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(app LANGUAGES C)
find_package(libmoe 0.1 REQUIRED)
add_executable(app "$src/examples/minimal.c")
target_link_libraries(app PRIVATE libmoe::moe)
CM
cmake -S "$tmp/proj" -B "$tmp/proj/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/proj/build" >/dev/null
(cd "$tmp/proj/build" && ./app | tee out_cm.txt && grep -q '^MOE_OK out\[0\] = ' out_cm.txt)
# the binaries found the installed libmoe.so (RPATH from the package, or the pc's libdir)
diff "$tmp/out_pc.txt" "$tmp/proj/build/out_cm.txt"
echo "installed package builds examples/minimal.c through pkg-config and find_package(libmoe)"
