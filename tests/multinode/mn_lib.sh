# Shared by the multinode tests (test_multinode.sh, test_slurm.sh, test_hier_paths.sh).

# mn_cluster_up PREFIX: a 2-node cluster named PREFIX<pid> (LK_NETNS_ID) for this test, taken down (with $T)
# when the test exits; ends the test when it cannot come up. $CLUSTER is scripts/netns-cluster.sh.
mn_cluster_up() {
  export LK_NETNS_ID=$1$$
  export LK_ALLOW_OVERSUBSCRIBE=1 # 4 ranks on however few cores CI has
  trap 'mn_cleanup' EXIT
  trap 'exit 130' INT TERM HUP
  bash "$CLUSTER" up 2 >"$T/up.out" 2>&1
  check "the cluster is up: 2 nodes" grep -q "2 nodes" "$T/up.out"
  [ "$fail" = 0 ] || { cat "$T/up.out"; finish; exit 1; }
}
mn_cleanup() {
  local p
  for p in "${jobs_pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  bash "$CLUSTER" down >/dev/null 2>&1
  rm -rf "$T"
}
jobs_pids=()

# mn_probe LABEL BE PLACE LAUNCHER...: the probe (mn_probe.c) on backend BE under LAUNCHER (its arguments
# before the program), 4 ranks on 2 nodes placed PLACE (block: 0, 1 on node 0; roundrobin: 0, 2 on node 0):
# every rank right, each on its node with its local rank, and the 1 MiB all-reduce across node 0's link
mn_probe() {
  local label=$1 be=$2 place=$3 r n l before after rc
  shift 3
  before=$(bash "$CLUSTER" bytes 0 | awk '{ print $1 + $2 }')
  "$@" "$LK_MN_PROBE" "$be" >"$T/probe.out" 2>&1; rc=$?
  after=$(bash "$CLUSTER" bytes 0 | awk '{ print $1 + $2 }')
  check "$label $be: 4 ranks ran, the all-reduce is right on each (rc $rc)" \
    bash -c "[ $rc = 0 ] && [ \$(grep -c '^probe $be .* ok\$' '$T/probe.out') = 4 ]"
  for r in 0 1 2 3; do
    if [ "$place" = block ]; then n=$((r / 2)) l=$((r % 2)); else n=$((r % 2)) l=$((r / 2)); fi
    check "$label $be: rank $r on node $n (host $LK_NETNS_ID-node$n), local rank $l/2, 2 nodes" \
      grep -q "^probe $be rank $r/4 host $LK_NETNS_ID-node$n local $l/2 node $n/2 " "$T/probe.out"
  done
  check "$label $be: the all-reduce crossed the nodes' link (node 0's eth0: $((after - before)) bytes, expected >= 1 MiB)" \
    test $((after - before)) -ge 1048576
}

# A long training job for the fault cases: `fit -c MARKER` (a copy of $T/synth.yaml, so its ranks can be
# found by command line), a checkpoint every 20 steps under $T/NAME.
# mn_rank_pid MARKER VAR RANK: the pid of the job's rank RANK (VAR=RANK in its environment: OMPI_COMM_WORLD_RANK
# under mpirun, SLURM_PROCID under srun)
mn_rank_pid() {
  local p
  for p in $(pgrep -f -- "fit -c $1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "$2=$3" && { echo "$p"; return; }
  done
}
# mn_started NAME PID [MARKER VAR]: "yes" once the job of launcher PID wrote a checkpoint under $T/NAME (and,
# with MARKER and VAR, its rank 3 runs); empty if the launcher ended first or 30 s passed
mn_started() {
  local _
  for _ in $(seq 1 600); do
    if ls "$T/$1"/lightning_logs/version_*/checkpoints/last.ckpt >/dev/null 2>&1 &&
      { [ -z "${3:-}" ] || [ -n "$(mn_rank_pid "$3" "$4" 3)" ]; }; then
      echo yes; return
    fi
    kill -0 "$2" 2>/dev/null || return
    sleep 0.05
  done
}
# mn_wait_end PID BOUND T0: waits for launcher PID to end (BOUND + 10 s at most), then sets secs (since T0),
# alive ("yes" if it still ran, then killed) and rc (its exit status)
mn_wait_end() {
  local _
  for _ in $(seq 1 $((($2 + 10) * 20))); do kill -0 "$1" 2>/dev/null || break; sleep 0.05; done
  secs=$(awk -v a="$3" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  alive=""
  kill -0 "$1" 2>/dev/null && alive=yes
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null; rc=$?
}
# mn_kill_rank3 PID MARKER VAR BOUND: checks that the job's rank 3 runs on node 1, SIGKILLs it and waits for
# launcher PID (mn_wait_end: secs, alive, rc); r3 is its pid
mn_kill_rank3() {
  r3=$(mn_rank_pid "$2" "$3" 3)
  local host3 t0
  host3=$(nsenter -t "${r3:-1}" --uts hostname 2>/dev/null)
  check "kill: rank 3 runs on node 1 ($host3)" test "$host3" = "$LK_NETNS_ID-node1"
  t0=$(date +%s.%N)
  [ -n "$r3" ] && kill -KILL "$r3"
  mn_wait_end "$1" "$4" "$t0"
}
# mn_ended_in BOUND: the check that the job ended within BOUND s, non-zero (after mn_wait_end)
mn_ended_in() { awk -v s="$secs" -v b="$1" -v a="$alive" -v r="$rc" 'BEGIN { exit !(a == "" && s <= b && r != 0) }'; }

# close FILE_A FILE_B: prints the largest difference between two exports' f32 tensors, relative to each
# tensor's largest value; fails unless they hold the same names and it is <= 1e-4
close() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             d[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F32"}
a, b = load(sys.argv[1]), load(sys.argv[2])
worst = 0.0
for k in a:
    scale = max(1e-6, max(abs(x) for x in a[k]))
    worst = max(worst, max(abs(x - y) for x, y in zip(a[k], b[k])) / scale)
print("%d tensors, largest relative difference %.3g" % (len(a), worst))
sys.exit(0 if a.keys() == b.keys() and worst <= 1e-4 else 1)
PY
}

