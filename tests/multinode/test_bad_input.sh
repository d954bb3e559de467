#!/usr/bin/env bash
# Bad multi-node launches, each a clear error within a bounded time (never
# a hang). Part 1 needs no root: torchrun-style variables read by lockstep's
# own rendezvous (src/comm/pg.c, shm_rdv.c). Part 2 runs in a 2-node
# namespace cluster (scripts/netns-cluster.sh) where mpirun and its rsh agent
# own the failure; skipped there ("skipped: why") without root, namespaces or
# mpirun, after part 1 ran.
#  - an unreachable master address: MASTER_ADDR a non-routable address, a
#    name that does not resolve, and (in the cluster) another node's address;
#  - a port in use: a second job with the same MASTER_PORT while the first
#    holds it (the port names the job; OpenMPI picks its own free ports);
#  - two ranks claiming the same rank (RANK=1 twice);
#  - a host file naming an unknown node (mpirun through the rsh agent);
#  - num_nodes that differs between the nodes' command lines (both products
#    equal to the world size, and one that is not).
# Environment (from ctest): LK_BIN, LK_SOURCE_DIR, LK_MPIRUN, LK_MN_PROBE.
source "$(dirname "$0")/../cli/lib.sh"
CLUSTER="$LK_SOURCE_DIR/scripts/netns-cluster.sh"
export LK_ALLOW_OVERSUBSCRIBE=1
write_synth
P=$((30000 + ($$ % 5000) * 4)) # MASTER_PORTs P..P+3: they name shm jobs, so another run of this test on the host does not meet this one
BOUND=10 # seconds any of these may take (comm_timeout is 5 where it matters)
args=(fit -c "$T/synth.yaml" --trainer.strategy ddp --trainer.enable_progress_bar false --trainer.comm_timeout 5
      --trainer.default_root_dir "$T/runs")

# timed NAME EXPECTED_TEXT OUTFILE CMD...: CMD fails (non-zero) within BOUND s
# and its output holds EXPECTED_TEXT
timed() {
  local name=$1 want=$2 out=$3; shift 3
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout -s KILL $((BOUND + 20)) "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs; secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  check "$name: fails (rc $rc) within ${BOUND}s (${secs}s)" \
    awk -v s="$secs" -v b="$BOUND" -v r="$rc" 'BEGIN { exit !(r != 0 && s <= b) }'
  check "$name: says '$want'" grep -qF -- "$want" "$out"
  grep -m1 -F -- "$want" "$out" | cut -c1-300 | sed 's/^/     /'
}

# --- part 1: lockstep's env rendezvous (no root) -----------------------------
# env2 RANK ADDR PORT: the torchrun-style variables of one rank of a 2-rank job
env2() { echo env RANK=$1 WORLD_SIZE=2 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=$2 MASTER_PORT=$3; }
timed "non-routable MASTER_ADDR" "MASTER_ADDR='10.255.255.1' is not an address of this host" "$T/addr.out" \
  $(env2 0 10.255.255.1 $P) "$LK_BIN" "${args[@]}" --trainer.devices 2
timed "unresolvable MASTER_ADDR" "MASTER_ADDR='no-such-node.invalid' does not resolve" "$T/addr2.out" \
  $(env2 0 no-such-node.invalid $P) "$LK_BIN" "${args[@]}" --trainer.devices 2

# a port in use: job A's rank 0 holds MASTER_PORT $((P + 1)) (waiting for its rank 1)
$(env2 0 127.0.0.1 $((P + 1))) "$LK_BIN" "${args[@]}" --trainer.devices 2 >"$T/a.out" 2>&1 &
apid=$!
for _ in $(seq 1 100); do grep -q . /proc/$apid/net/unix 2>/dev/null && [ -n "$(ls /dev/shm | grep p$((P + 1)))" ] && break; sleep 0.05; done
timed "MASTER_PORT in use by another job" "(derived from MASTER_PORT=$((P + 1))) is already in use on this host: pid $apid holds it" \
  "$T/port.out" $(env2 0 127.0.0.1 $((P + 1))) "$LK_BIN" "${args[@]}" --trainer.devices 2
kill -KILL $apid 2>/dev/null; wait $apid 2>/dev/null

# two ranks claiming rank 1 of a 3-rank job: the second fails at once, the
# job (missing its rank 2) ends at comm_timeout naming the missing rank
env3() { echo env RANK=$1 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((P + 2)); }
$(env3 0) "$LK_BIN" "${args[@]}" --trainer.devices 3 >"$T/d0.out" 2>&1 &
d0=$!
$(env3 1) "$LK_BIN" "${args[@]}" --trainer.devices 3 >"$T/d1.out" 2>&1 &
d1=$!
for _ in $(seq 1 100); do [ -n "$(ls /dev/shm | grep p$((P + 2)))" ] && break; sleep 0.05; done
sleep 0.3
timed "RANK=1 given to two processes" "two processes were given rank 1 (RANK, SLURM_PROCID or PMI_RANK set alike)" \
  "$T/dup.out" $(env3 1) "$LK_BIN" "${args[@]}" --trainer.devices 3
t0=$(date +%s)
for _ in $(seq 1 $((BOUND * 20))); do kill -0 $d0 2>/dev/null || kill -0 $d1 2>/dev/null || break; sleep 0.05; done
alive=""
for p in $d0 $d1; do kill -0 $p 2>/dev/null && alive="$alive $p"; kill -KILL $p 2>/dev/null; done
wait $d0 $d1 2>/dev/null
check "RANK=1 twice: the job's other ranks end at comm_timeout (left:${alive:- none}, $(( $(date +%s) - t0 )) s)" test -z "$alive"
check "RANK=1 twice: rank 0 names the rank that never came (missing ... 2)" grep -qE "missing ranks? ([0-9]+, )*2" "$T/d0.out"
grep -m1 -E "missing ranks?" "$T/d0.out" | cut -c1-300 | sed 's/^/     /'

# --- part 2: mpirun across a 2-node namespace cluster --------------------------
[ -n "${LK_MPIRUN:-}" ] || { echo "skipped (part 2): lockstep was built without MPI or mpirun was not found"; finish; exit $?; }
if ! why=$(bash "$CLUSTER" check); then echo "${why:-skipped: netns-cluster.sh check failed} (part 2)"; finish; exit $?; fi
export LK_NETNS_ID=lkb$$
cleanup() { bash "$CLUSTER" down >/dev/null 2>&1; rm -rf "$T"; }
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
bash "$CLUSTER" up 2 >"$T/up.out" 2>&1 || { cat "$T/up.out"; fail=$((fail + 1)); finish; exit 1; }

# MASTER_ADDR of another node (reachable, but the env rendezvous is one node's)
timed "MASTER_ADDR of another node" "MASTER_ADDR='10.250.0.2' is not an address of this host" "$T/addr3.out" \
  bash "$CLUSTER" exec 0 env RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.250.0.2 MASTER_PORT=$((P + 3)) "$LK_BIN" "${args[@]}" --trainer.devices 2

# a host file naming a node that is not there
printf '%s slots=2\nnosuchnode slots=2\n' "$LK_NETNS_ID-node0" >"$T/hosts.bad"
timed "host file with an unknown node" "unknown node 'nosuchnode'" "$T/hf.out" \
  bash "$CLUSTER" mpirun --hostfile "$T/hosts.bad" -np 4 --map-by ppr:2:node "$LK_BIN" "${args[@]}" --trainer.devices 2 --trainer.num_nodes 2
check "host file with an unknown node: mpirun says it could not start its daemons" grep -q "unable to reliably start one or more daemons" "$T/hf.out"

# num_nodes differing between the nodes, devices x num_nodes = 4 on both:
# node 1's ranks are refused with the placement named; mpirun ends node 0's
h0=$LK_NETNS_ID-node0 h1=$LK_NETNS_ID-node1
timed "num_nodes 2 on node 0, 4 on node 1" "trainer.num_nodes=4 x devices=1 does not match where the launcher put the 4 ranks: 2 node(s), 2 rank(s) on this one" \
  "$T/nn.out" bash "$CLUSTER" mpirun -x LK_ALLOW_OVERSUBSCRIBE \
  -np 2 --host "$h0:2" "$LK_BIN" "${args[@]}" --trainer.devices 2 --trainer.num_nodes 2 : \
  -np 2 --host "$h1:2" "$LK_BIN" "${args[@]}" --trainer.devices 1 --trainer.num_nodes 4
check "num_nodes 2 / 4: the message names node 1's host" grep -q "on host '$h1', node 1" "$T/nn.out"
# and num_nodes 3 on node 1: devices x num_nodes is not the world size there
timed "num_nodes 2 on node 0, 3 on node 1" "but trainer.devices=2 x num_nodes=3 = 6" \
  "$T/nn3.out" bash "$CLUSTER" mpirun -x LK_ALLOW_OVERSUBSCRIBE \
  -np 2 --host "$h0:2" "$LK_BIN" "${args[@]}" --trainer.devices 2 --trainer.num_nodes 2 : \
  -np 2 --host "$h1:2" "$LK_BIN" "${args[@]}" --trainer.devices 2 --trainer.num_nodes 3
left=$(pgrep -f -- "$T/synth.yaml" | tr '\n' ' ')
check "no process of these jobs left (${left:-none})" test -z "$left"
for k in 0 1; do
  shm=$(bash "$CLUSTER" exec $k ls /dev/shm 2>&1 | tr '\n' ' ')
  check "node $k's /dev/shm is empty (${shm:-empty})" test -z "$shm"
done
finish
