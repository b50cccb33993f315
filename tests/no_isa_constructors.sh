#!/bin/sh
# Every object file given (the moe_avx2 / moe_avx512 objects, compiled with -mavx2 / -mavx512f)
# must have no constructors (.init_array / .ctors sections): a constructor runs at load on
# every CPU, before the kernel table is chosen, so one compiled for AVX-512 kills every
# program that links libmoe with SIGILL on an AVX2-only CPU (and under valgrind).
status=0
for o in "$@"; do
  if readelf -S -W "$o" | grep -Eq '\.(init_array|ctors)'; then
    echo "FAIL: $o has a constructor section (.init_array / .ctors); move the initialization to a file compiled without ISA flags" >&2
    status=1
  fi
done
[ "$#" -gt 0 ] || { echo "FAIL: no object files given" >&2; exit 1; }
[ "$status" -eq 0 ] && echo "checked $# ISA object files: no constructors"
exit $status
