#!/usr/bin/env bash
# Run libFuzzer targets in turn, each for SECONDS, over a copy of its committed corpus
# (tests/fuzz/corpus/<target>) in BUILD/fuzz/corpus/<target>, so what a run finds stays in the
# build folder. A crash, leak, timeout or out-of-memory fails the run (exit 1) and leaves its
# input in BUILD/fuzz/artifacts/<target>/; the log of each target is BUILD/fuzz/<target>.log.
#   usage: tests/fuzz/run.sh BUILD SECONDS TARGET...
set -uo pipefail
build=$1 secs=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
# the largest input each target tries (bytes): its seeds with room to grow
declare -A max_len=([fuzz_safetensors]=16384 [fuzz_config_plan]=16384 [fuzz_model]=65536
                    [fuzz_index]=65536 [fuzz_input]=16384)
fail=0
for t in "$@"; do
  bin=$build/fuzz/$t
  [ -x "$bin" ] || { echo "fuzz: $bin not built" >&2; exit 1; }
  corpus=$build/fuzz/corpus/$t
  art=$build/fuzz/artifacts/$t
  mkdir -p "$corpus" "$art"
  cp -n "$src/corpus/$t"/* "$corpus"/
  log=$build/fuzz/$t.log
  echo "fuzz: $t for ${secs}s (corpus $corpus, log $log)"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin" -max_total_time="$secs" -max_len="${max_len[$t]:-65536}" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$art/" "$corpus" >"$log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc): see $log and $art/" >&2
    grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -5 >&2
    fail=1
  else
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$log" | tr '\n' ' '
    echo
  fi
done
exit $fail
