#!/usr/bin/env bash
# A dead or absent rank must end an MPI job with an error in bounded time, never hang.
#   kill_rank.sh MODE SECONDS MPIEXEC [mpiexec options ...] -- TEST_MPI
# MODE kill: rank 1 raises SIGKILL before an execute; pass when mpirun exits non-zero within
#   SECONDS and either rank 0 reported the failed execute (MOE_ETIMEOUT / MOE_EMPI) or mpirun
#   reported the killed rank and ended the job.
# MODE survivor: the same, with OpenMPI told not to end the job when a rank dies
#   (--mca orte_abort_on_non_zero_status 0), so the survivor's own timeout must fire: pass when
#   rank 0 reports MOE_ETIMEOUT within SECONDS (that mpirun may then wait forever for its dead
#   rank, so the script ends the mpirun it started once the survivor has spoken).
# MODE late: rank 1 arrives after the others' timeout_s; pass when rank 0 reported
#   MOE_ETIMEOUT from moe_plan_create_ex and the job ended non-zero within SECONDS.
set -u
mode=$1; limit=$2; shift 2
cmd=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmd+=("$1"); shift; done
shift
prog=$1
fail() { echo "kill_rank.sh $mode: FAIL: $*"; exit 1; }
if [ "$mode" = survivor ]; then
  log=$(mktemp)
  SECONDS=0
  "${cmd[@]}" --mca orte_abort_on_non_zero_status 0 "$prog" kill >"$log" 2>&1 &
  pid=$!
  found=0
  while [ $SECONDS -le "$limit" ]; do
    if grep -q '\[rank 0\] execute after a peer died: MOE_ETIMEOUT' "$log"; then found=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null
  for _ in 1 2 3 4 5; do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  cat "$log"
  rm -f "$log"
  [ $found -eq 1 ] || fail "rank 0 did not report MOE_ETIMEOUT within ${limit} s"
  echo "kill_rank.sh $mode: rank 0 reported MOE_ETIMEOUT after about $SECONDS s: OK"
  exit 0
fi
SECONDS=0
out=$(timeout -k 5 $((limit * 2)) "${cmd[@]}" "$prog" "$mode" 2>&1)
rc=$?
elapsed=$SECONDS
printf '%s\n' "$out"
echo "kill_rank.sh $mode: mpirun exit status $rc after ${elapsed} s (limit ${limit} s)"
# timeout(1) gives 124 (or 137 after its KILL); mpirun itself may exit 137 for a rank killed by signal 9
{ [ $rc -eq 124 ] || [ "$elapsed" -ge $((limit * 2)) ]; } && fail "the job hung (killed by timeout)"
[ $rc -eq 0 ] && fail "mpirun exited 0 although a rank died or timed out"
[ "$elapsed" -gt "$limit" ] && fail "took longer than ${limit} s"
case $mode in
kill)
  printf '%s\n' "$out" | grep -Eq '\[rank 0\] execute after a peer died: MOE_E(TIMEOUT|MPI)|signal 9|[Kk]illed' ||
    fail "neither rank 0's error nor mpirun's report of the killed rank was printed" ;;
late)
  printf '%s\n' "$out" | grep -q '\[rank 0\] plan creation with a late peer: MOE_ETIMEOUT' ||
    fail "rank 0 did not report MOE_ETIMEOUT" ;;
*) fail "unknown mode" ;;
esac
echo "kill_rank.sh $mode: OK"
