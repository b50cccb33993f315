#!/usr/bin/env bash
# `moe run` and `moe bench` under mpirun: --ep output bit-identical to one process, --tp within
# the f32 bound (and reduce_scatter bit-identical to allreduce), TP x EP on 4 ranks, and the
# per-rank resident bytes printed.
#   run_cli.sh MOE TEST_MPI FIXTURES TMPDIR MPIEXEC [mpiexec options ...]
set -euo pipefail
moe=$1; cmpr=$2; fx=$3/qwen2_moe_f32; tmp=$(mktemp -d "$4/run_cli-XXXXXX"); shift 4
mpi=("$@")
trap 'rm -rf "$tmp"' EXIT
run() { "$@" --checkpoint "$fx" --layer 0 --input "$fx/input.safetensors" --threads 1; }
run "$moe" run --output "$tmp/one.safetensors"
run "${mpi[@]}" -np 2 "$moe" run --ep 2 --output "$tmp/ep2.safetensors" | tee "$tmp/ep2.log"
grep -q "rank 1 (ep_rank 1, tp_rank 0): experts 3..5 (3 of 6)" "$tmp/ep2.log"
"$cmpr" compare "$tmp/one.safetensors" "$tmp/ep2.safetensors" 0
run "${mpi[@]}" -np 2 "$moe" run --tp 2 --output "$tmp/tp2.safetensors"
"$cmpr" compare "$tmp/one.safetensors" "$tmp/tp2.safetensors" 1e-5
MOE_TP_REDUCE=reduce_scatter run "${mpi[@]}" -x MOE_TP_REDUCE -np 2 "$moe" run --tp 2 --output "$tmp/tp2rs.safetensors"
"$cmpr" compare "$tmp/tp2.safetensors" "$tmp/tp2rs.safetensors" 0
run "${mpi[@]}" -np 4 "$moe" run --ep 2 --tp 2 --output "$tmp/ep2tp2.safetensors"
"$cmpr" compare "$tmp/one.safetensors" "$tmp/ep2tp2.safetensors" 1e-5
# a placement file (issue 18): round robin, and replicas (expert 0 and 3 on both ranks, rank 1 holding
# 4 physical experts): bit-identical to one process; a file for another --ep is a usage error
echo '{"ep_size": 2, "num_logical_experts": 6, "ranks": [[0, 2, 4], [1, 3, 5]]}' > "$tmp/rr.json"
echo '{"ep_size": 2, "num_logical_experts": 6, "ranks": [[0, 1, 2, 3], [0, 3, 4, 5]]}' > "$tmp/rep.json"
run "${mpi[@]}" -np 2 "$moe" run --ep 2 --placement "$tmp/rr.json" --output "$tmp/rr.safetensors" | tee "$tmp/rr.log"
grep -q "rank 1 (ep_rank 1, tp_rank 0): 3 experts of placement (3 of 6)" "$tmp/rr.log"
"$cmpr" compare "$tmp/one.safetensors" "$tmp/rr.safetensors" 0
run "${mpi[@]}" -np 2 "$moe" run --ep 2 --placement "$tmp/rep.json" --output "$tmp/rep.safetensors"
"$cmpr" compare "$tmp/one.safetensors" "$tmp/rep.safetensors" 0
echo '{"ep_size": 3, "num_logical_experts": 6, "ranks": [[0, 1], [2, 3], [4, 5]]}' > "$tmp/ep3.json"
if run "${mpi[@]}" -np 2 "$moe" run --ep 2 --placement "$tmp/ep3.json" --output "$tmp/bad.safetensors" 2>"$tmp/bad.log"; then
  echo "run_cli.sh: a placement for 3 ranks ran on --ep 2"; exit 1
fi
grep -q "the file places 6 logical experts on 3 ranks" "$tmp/bad.log"
test ! -e "$tmp/bad.safetensors"
# a wrong rank count is a usage error, not a hang
if "${mpi[@]}" -np 2 "$moe" run --ep 3 --checkpoint "$fx" --layer 0 --input "$fx/input.safetensors" \
     --output "$tmp/bad.safetensors" 2>"$tmp/bad.log"; then
  echo "run_cli.sh: --ep 3 on 2 ranks succeeded"; exit 1
fi
grep -q "launch with mpirun -np 3" "$tmp/bad.log"
# every rank fails with the same message: printed once, by rank 0, without a rank prefix, and
# the job ends with MPI_Finalize and the status (no MPI_Abort)
test "$(grep -c "launch with mpirun -np 3" "$tmp/bad.log")" = 1
if grep -q "MPI_ABORT\|\[rank \|^rank " "$tmp/bad.log"; then
  echo "run_cli.sh: --ep 3 on 2 ranks: per-rank copies or MPI_Abort noise:"; cat "$tmp/bad.log"; exit 1
fi
"${mpi[@]}" -np 2 "$moe" bench --ep 2 --num-experts 8 --tokens 1,8 --iters 2 --threads 1 | tee "$tmp/bench.log"
# 4 experts x 3 x 2048 x 768 bf16 = 37748736 bytes resident on each rank
grep -q "rank 1 (ep_rank 1, tp_rank 0): physical experts 4..7 (4 of 8), I shard 768 of 768, resident expert bytes 37748736" \
  "$tmp/bench.log"
grep -Eq "^ +8 " "$tmp/bench.log"
# expert load (issue 18): --skew sends about SHARE of the rows to experts 0..HOT-1, each T
# prints the rows per EP rank and the imbalance, --load-out writes the gathered load, which
# moe plan --load reads
"${mpi[@]}" -np 2 "$moe" bench --ep 2 --num-experts 16 --tokens 8 --iters 2 --threads 1 --skew 4:0.5 \
  --load-out "$tmp/load.json" | tee "$tmp/skew.log"
grep -q "rows per EP rank per forward: " "$tmp/skew.log"
grep -q "imbalance (max/mean)" "$tmp/skew.log"
# 2 timed forwards x 2 ranks x 8 tokens x K 8 = 256 rows, half of them on experts 0..3
python3 - "$tmp/load.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
l = d["load"]
assert d["num_logical_experts"] == 16 and len(l) == 16, d
assert sum(l) == 2 * 2 * 8 * 8, l
assert sum(l[:4]) == sum(l) // 2, l
PY
# placements side by side in one run: contiguous, then balanced (2 redundant) on the load of its warm-up
"${mpi[@]}" -np 2 "$moe" bench --ep 2 --num-experts 16 --tokens 8 --iters 2 --threads 1 --skew 4:0.5 \
  --placement contiguous,balanced --redundant 2 | tee "$tmp/pl.log"
grep -q "expert placement balanced: 18 physical experts = 16 logical + 2 redundant" "$tmp/pl.log"
grep -q "placements side by side" "$tmp/pl.log"
grep -Eq "^ +8 balanced " "$tmp/pl.log"
# the plan moved in place after the timed forwards (moe_plan_rebalance): per rank kept / packed /
# dropped (contiguous 8 + 8 -> balanced 9 + 9 keeps at most 8 per rank and drops what it packs over
# that), then the forwards again
"${mpi[@]}" -np 2 "$moe" bench --ep 2 --num-experts 16 --tokens 8 --iters 2 --threads 1 --skew 4:0.5 \
  --rebalance balanced --redundant 2 | tee "$tmp/rb.log"
grep -q "rebalance in place: contiguous -> balanced (18 physical experts = 16 logical + 2 redundant" "$tmp/rb.log"
python3 - "$tmp/rb.log" <<'PY'
import re, sys
rows = re.findall(r"rank (\d) \(ep_rank \d, tp_rank 0\): (\d+) experts kept, (\d+) packed, (\d+) dropped; (\d+) bytes packed",
                  open(sys.argv[1]).read())
assert len(rows) == 2, rows
for r, kept, packed, dropped, nbytes in rows:
    kept, packed, dropped, nbytes = int(kept), int(packed), int(dropped), int(nbytes)
    assert kept + dropped == 8 and kept + packed == 9, rows  # 8 held before, 9 after
    assert packed == 0 or nbytes % packed == 0, rows
PY
grep -q "T 8: forward .* ms after the rebalance to balanced" "$tmp/rb.log"
if "$moe" bench --ep 1 --rebalance balanced 2>"$tmp/badrb.log"; then
  echo "run_cli.sh: --rebalance with --ep 1 accepted"; exit 1
fi
grep -q "needs --ep > 1" "$tmp/badrb.log"
if "$moe" bench --ep 1 --placement balanced 2>"$tmp/badpl.log"; then
  echo "run_cli.sh: --placement balanced without a load accepted"; exit 1
fi
grep -q "needs the load" "$tmp/badpl.log"
if "$moe" bench --ep 1 --skew 8 2>"$tmp/badskew.log"; then
  echo "run_cli.sh: --skew 8 accepted"; exit 1
fi
grep -q "expected HOT:SHARE" "$tmp/badskew.log"
echo "run_cli.sh: OK"
