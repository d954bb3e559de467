#!/usr/bin/env bash
# Multi-node on one machine: a 2-node cluster of namespaces
# (scripts/netns-cluster.sh: own network, host name and /dev/shm per node),
# mpirun across it with the rsh agent, then
#  1. the process group (mpi and hier backends): with ranks dealt round-robin over the nodes
#     (--map-by node), each rank's node / local rank / local world size as
#     the mpi communicator works them out from the host names; a 1 MiB
#     all-reduce across the nodes is right and went over the nodes' links
#     (bytes counted on node 0's eth0);
#  2. `lockstep fit` ddp on the mpi backend, 2 nodes x 2 ranks, ends with
#     the same parameters, bit for bit, as 4 ranks of mpirun on one node
#     (the same MPI reduction, so the same order of additions); on the
#     hier backend (shm in a node, mpi between node leaders; what auto
#     picks for a job across nodes) it ends within 1e-4 of that;
#  2b. two ranks on two hosts (2 x 1, mpi) swap a large buffer in eager-sized
#     messages and end bitwise as with MPI's own all-reduce; a hier job's raw
#     MPI_Allreduce rows end within seconds, and a raw loop past --raw-limit
#     ends the job with a message;
#  3. a rank on node 1 SIGKILLed mid-run: the whole job ends within
#     comm_timeout + 10 s, non-zero, and some line names rank 3;
#  3b. node 1's link cut mid-run (ip link set eth0 down): the job ends within
#     comm_timeout + 10 s, a rank names node 1 and its rank, nothing is left;
#  4. nothing is left: no process of the jobs, no namespace, no /dev/shm
#     entry of the cluster's nodes on this machine.
# Skipped (exit 77, "skipped: why") without root, namespaces or mpirun.
# Environment (from ctest): LK_BIN, LK_SOURCE_DIR, LK_MPIRUN, LK_MN_PROBE.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/mn_lib.sh" # close, mn_*
CLUSTER="$LK_SOURCE_DIR/scripts/netns-cluster.sh"
[ -n "${LK_MPIRUN:-}" ] && [ -x "${LK_MN_PROBE:-}" ] || { echo "skipped: lockstep was built without MPI or mpirun was not found"; exit 77; }
why=$(bash "$CLUSTER" check) || { echo "${why:-skipped: netns-cluster.sh check failed}"; exit 77; }

TIMEOUT=5
BOUND=$((TIMEOUT + 10))
mn_cluster_up lkt
mpirun_nodes() { timeout -s KILL 90 bash "$CLUSTER" mpirun "$@"; }

# 1. process group and the network, on the flat mpi backend and on hier
f0=$fail
for be in mpi hier; do
  # round-robin: even ranks on node 0, odd ranks on node 1
  mn_probe probe $be roundrobin mpirun_nodes -np 4 --map-by node
  check "probe $be: no shm segment of the nodes appeared in this machine's /dev/shm" \
    bash -c "! ls /dev/shm | grep -q -- '$LK_NETNS_ID-node'"
  [ "$fail" = "$f0" ] || sed 's/^/     probe: /' "$T/probe.out" >&2
done

# 2. a 2 x 2 fit, bitwise against 4 ranks on one node
f0=$fail
write_synth
fitargs=(fit -c "$T/synth.yaml" --trainer.strategy ddp --trainer.enable_progress_bar false --trainer.comm_timeout 30)
"$LK_MPIRUN" ${LK_MPIRUN_FLAGS:-} -np 4 -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" "${fitargs[@]}" --trainer.devices 4 --trainer.default_root_dir "$T/one" >"$T/one.out" 2>&1
rc1=$?
mpirun_nodes -np 4 --map-by ppr:2:node -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" "${fitargs[@]}" --trainer.devices 2 --trainer.num_nodes 2 --trainer.default_root_dir "$T/two" >"$T/two.out" 2>&1
rc2=$?
"$LK_BIN" export --ckpt "$T/one/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/one.st" --with-optimizer >/dev/null 2>&1
"$LK_BIN" export --ckpt "$T/two/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/two.st" --with-optimizer >/dev/null 2>&1
check "fit: 4 ranks on one node and 2 nodes x 2 ranks both trained (rc $rc1, $rc2)" \
  bash -c "[ $rc1 = 0 ] && [ $rc2 = 0 ] && [ -s '$T/one.st' ] && [ -s '$T/two.st' ]"
check "fit: 2 nodes x 2 ranks end with the same weights and optimizer state, bit for bit" cmp -s "$T/one.st" "$T/two.st"
[ "$fail" = "$f0" ] || { sed 's/^/     one: /' "$T/one.out" | tail -20; sed 's/^/     two: /' "$T/two.out" | tail -20; } >&2
# the same fit on the hierarchical all-reduce: its order of additions is
# (rank 0 + rank 1) + (rank 2 + rank 3), which OpenMPI's 4-rank all-reduce
# of small buffers happens to share (the difference is 0 here), but nothing
# promises that: checked to a relative 1e-4 of each tensor's largest value
mpirun_nodes -np 4 --map-by ppr:2:node -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" "${fitargs[@]}" --trainer.devices 2 --trainer.num_nodes 2 --trainer.default_root_dir "$T/hier" >"$T/hier.out" 2>&1
rc3=$?
"$LK_BIN" export --ckpt "$T/hier/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/hier.st" >/dev/null 2>&1
"$LK_BIN" export --ckpt "$T/two/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/flat.st" >/dev/null 2>&1
check "fit hier: 2 nodes x 2 ranks trained, on the hier backend that auto picks across nodes (rc $rc3)" \
  bash -c "[ $rc3 = 0 ] && [ -s '$T/hier.st' ] && grep -q '\"comm_backend\": *\"hier\"' '$T'/hier/lightning_logs/version_0/run.json"
cmpout=$(close "$T/flat.st" "$T/hier.st")
check "fit hier: the weights match the flat mpi fit's to 1e-4 ($cmpout)" test $? = 0
# fsdp's HYBRID_SHARD across the nodes: each node's 2 ranks shard (a shard group split by node), the nodes
# replicate (their chunks' gradients all-reduced across); averaged twice (in the node, then across), so
# the weights match the flat ddp fit's to a relative 1e-4, not bitwise
mpirun_nodes -np 4 --map-by ppr:2:node -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" "${fitargs[@]}" --trainer.devices 2 --trainer.num_nodes 2 --trainer.strategy fsdp \
  --trainer.fsdp_sharding_strategy HYBRID_SHARD --trainer.default_root_dir "$T/hybrid" >"$T/hybrid.out" 2>&1
rc4=$?
"$LK_BIN" export --ckpt "$T/hybrid/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/hybrid.st" >/dev/null 2>&1
check "fsdp HYBRID_SHARD: 2 nodes x 2 ranks trained, sharded over each node's 2 ranks (rc $rc4)" \
  bash -c "[ $rc4 = 0 ] && grep -q 'HYBRID_SHARD over 2 ranks' '$T/hybrid.out'"
cmpout=$(close "$T/flat.st" "$T/hybrid.st")
check "fsdp HYBRID_SHARD: the weights match the flat ddp fit's to 1e-4 ($cmpout)" test $? = 0
[ "$fail" = "$f0" ] || sed 's/^/     hybrid: /' "$T/hybrid.out" | tail -20 >&2
[ "$fail" = "$f0" ] || sed 's/^/     hier: /' "$T/hier.out" | tail -20 >&2

# 2b. the leaders' swap and the raw MPI_Allreduce across nodes
f0=$fail
# 2c. two ranks on two hosts all-reduce a large f32 buffer by swapping it in
# eager-sized messages, both directions at once (comm_mpi.c, pair_all_reduce;
# also hier's leaders): a 2 x 1 fit whose one bucket (43,012 parameters,
# 172 KB) takes that path ends with the same bits as with MPI's own
# all-reduce (LK_COMM_MPI_PAIR_CHUNK=0): one addition per element either way
pairargs=(fit -c "$T/synth.yaml" --trainer.strategy ddp --trainer.enable_progress_bar false --trainer.comm_timeout 30
  --trainer.devices 1 --trainer.num_nodes 2 --model.init_args.hidden "[2048]" --trainer.max_epochs 1)
for ch in 32768 0; do
  LK_COMM_MPI_PAIR_CHUNK=$ch mpirun_nodes -np 2 --map-by ppr:1:node -x LK_COMM_MPI_PAIR_CHUNK -x LK_ALLOW_OVERSUBSCRIBE \
    "$LK_BIN" "${pairargs[@]}" --trainer.default_root_dir "$T/pair$ch" >"$T/pair$ch.out" 2>&1
  echo $? >"$T/pair$ch.rc"
  "$LK_BIN" export --ckpt "$T/pair$ch/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/pair$ch.st" \
    --with-optimizer >/dev/null 2>&1
done
check "pair: 2 nodes x 1 rank trained with the swap and with MPI's all-reduce (rc $(cat "$T/pair32768.rc"), $(cat "$T/pair0.rc"))" \
  bash -c "[ \$(cat '$T/pair32768.rc') = 0 ] && [ \$(cat '$T/pair0.rc') = 0 ] && [ -s '$T/pair32768.st' ] && [ -s '$T/pair0.st' ]"
check "pair: the swap in eager-sized messages gives the same weights and optimizer state, bit for bit" \
  cmp -s "$T/pair32768.st" "$T/pair0.st"
[ "$fail" = "$f0" ] || sed 's/^/     pair: /' "$T/pair32768.out" | tail -20 >&2
# 2d. the raw MPI_Allreduce rows of a hier job: OpenMPI's blocking calls
# poll without yielding, so with 4 ranks on few cores one call takes tens
# of ms at any size; its loop was once sized from hier's (sub-millisecond)
# time and ran for minutes. Now sized from its own time: the job ends
# within seconds with both rows per size.
f0=$fail
t0=$(date +%s.%N)
mpirun_nodes -np 4 --map-by ppr:2:node -x LK_ALLOW_OVERSUBSCRIBE "$LK_BIN" bench comm --worker hier \
  --min 64K --max 256K --time 0.05 --repeat 1 --touch 0 --out "$T/raw.csv" >"$T/raw.out" 2>&1
rc=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check "raw: bench comm --worker hier with raw MPI_Allreduce rows ended in ${secs}s (bound 60), rc $rc" \
  awk -v s="$secs" -v r="$rc" 'BEGIN { exit !(r == 0 && s <= 60) }'
for b in 65536 262144; do
  check "raw: rows hier and MPI_Allreduce at $b bytes" \
    bash -c "grep -q '^hier,4,$b,' '$T/raw.csv' && grep -q '^MPI_Allreduce,4,$b,' '$T/raw.csv'"
done
# 2e. a raw loop past its bound (--raw-limit; default comm_timeout) ends its
# rank with a message instead of blocking in MPI, and mpirun ends the job
t0=$(date +%s.%N)
mpirun_nodes -np 4 --map-by ppr:2:node -x LK_ALLOW_OVERSUBSCRIBE "$LK_BIN" bench comm --worker hier \
  --min 1M --max 1M --iters 5 --repeat 1 --touch 0 --raw-limit 0.001 --out "$T/rawlim.csv" >"$T/rawlim.out" 2>&1
rc=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check "raw limit: the job ended non-zero in ${secs}s (bound 60), rc $rc" \
  awk -v s="$secs" -v r="$rc" 'BEGIN { exit !(r != 0 && s <= 60) }'
check "raw limit: a rank says its raw loop did not finish within 0.001 s" \
  grep -q "bench comm: raw MPI_Allreduce (1048576 bytes x 5 calls) did not finish within 0.001 s on rank" "$T/rawlim.out"
grep -m1 "did not finish within" "$T/rawlim.out" | sed 's/^/     /'
[ "$fail" = "$f0" ] || { sed 's/^/     raw: /' "$T/raw.out" | tail -20; sed 's/^/     rawlim: /' "$T/rawlim.out" | tail -20; } >&2

# 3. a rank on node 1 killed mid-run
f0=$fail
cp "$T/synth.yaml" "$T/kill.yaml"
marker="$T/kill.yaml"
bash "$CLUSTER" mpirun -np 4 --map-by ppr:2:node -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" fit -c "$marker" --trainer.strategy ddp --trainer.devices 2 --trainer.num_nodes 2 \
  --trainer.max_epochs 100000 --trainer.every_n_train_steps 20 --trainer.enable_progress_bar false \
  --trainer.comm_timeout $TIMEOUT --trainer.num_sanity_val_steps 0 --data.init_args.num_samples 4096 \
  --trainer.default_root_dir "$T/kill" >"$T/kill.out" 2>&1 &
mpid=$!
jobs_pids+=("$mpid")
check "kill: the 2 x 2 job started training (a checkpoint was written)" \
  test -n "$(mn_started kill $mpid "$marker" OMPI_COMM_WORLD_RANK)"
mn_kill_rank3 $mpid "$marker" OMPI_COMM_WORLD_RANK $BOUND
left=$(pgrep -f -- "fit -c $marker" | tr '\n' ' ')
for p in $left; do kill -KILL "$p" 2>/dev/null; done
check "kill: the job ended within comm_timeout + 10 s = ${BOUND}s (${secs}s), exit status non-zero ($rc)" mn_ended_in $BOUND
check "kill: the output names rank 3" grep -qE "rank 3 \(pid ${r3:-x}\) died|process rank 3 with PID ${r3:-x}" "$T/kill.out"
check "kill: no process of the job left (${left:-none})" test -z "$left"
grep -m2 -E "rank 3 \(pid|process rank 3" "$T/kill.out" | sed 's/^/     /'
[ "$fail" = "$f0" ] || sed 's/^/     kill: /' "$T/kill.out" | tail -30 >&2

# 3b. the link of node 1 cut mid-run (its eth0 down): every rank waits in
# vain, node 0's ranks time out at comm_timeout and name node 1 and its
# rank, the rsh agent (ssh's ServerAliveInterval, scripts/netns-cluster.sh)
# ends node 1's session, so mpirun ends; nothing is left on either node.
f0=$fail
CUT_TIMEOUT=3
ALIVE="1 6" # the agent gives up after 6 s: after comm_timeout, so lockstep's message comes first
CUT_BOUND=$((CUT_TIMEOUT + 10))
cp "$T/synth.yaml" "$T/cut.yaml"
LK_NETNS_ALIVE="$ALIVE" bash "$CLUSTER" mpirun -np 4 --map-by ppr:2:node -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" fit -c "$T/cut.yaml" --trainer.strategy ddp --trainer.devices 2 --trainer.num_nodes 2 \
  --trainer.max_epochs 100000 --trainer.every_n_train_steps 20 --trainer.enable_progress_bar false \
  --trainer.comm_timeout $CUT_TIMEOUT --trainer.num_sanity_val_steps 0 --data.init_args.num_samples 4096 \
  --trainer.default_root_dir "$T/cut" >"$T/cut.out" 2>&1 &
mpid=$!
jobs_pids+=("$mpid")
check "cut: the 2 x 2 job (hier, as auto picks) started training (a checkpoint was written)" \
  test -n "$(mn_started cut $mpid)"
t0=$(date +%s.%N)
ip -n "$LK_NETNS_ID-n1" link set eth0 down
mn_wait_end $mpid $CUT_BOUND "$t0"
check "cut: the job ended within comm_timeout + 10 s = ${CUT_BOUND}s (${secs}s), exit status non-zero ($rc)" \
  mn_ended_in $CUT_BOUND
check "cut: a rank names node 1 and its rank (timed out ... look at the other node: rank 2 on $LK_NETNS_ID-node1)" \
  grep -qE "timed out after [0-9.]+ s .*in MPI; some rank did not arrive: the ranks on this host \($LK_NETNS_ID-node0\) are alive, so look at the other node: rank 2(, 3)? on $LK_NETNS_ID-node1" "$T/cut.out"
check "cut: the rsh agent ended node 1's session and stopped mpirun (node 1 ... has not answered)" \
  bash -c "grep -q 'node 1 ($LK_NETNS_ID-node1, 10.250.0.2) has not answered' '$T/cut.out' && grep -q 'stopping mpirun' '$T/cut.out'"
for _ in $(seq 1 60); do pgrep -f -- "fit -c $T/cut.yaml|orted.*$LK_NETNS_ID|netns-cluster.sh rsh" >/dev/null || break; sleep 0.05; done
left=$(pgrep -f -- "fit -c $T/cut.yaml|orted.*$LK_NETNS_ID|netns-cluster.sh rsh" | tr '\n' ' ')
check "cut: no process of the job left on any node: rank, orted, rsh agent (${left:-none})" test -z "$left"
for p in $left; do kill -KILL "$p" 2>/dev/null; done
for k in 0 1; do
  shm=$(bash "$CLUSTER" exec $k ls /dev/shm 2>&1 | tr '\n' ' ')
  check "cut: node $k's /dev/shm is empty (${shm:-empty})" test -z "$shm"
done
grep -m1 -E "some rank did not arrive: the ranks" "$T/cut.out" | sed 's/^/     /'
[ "$fail" = "$f0" ] || sed 's/^/     cut: /' "$T/cut.out" | tail -30 >&2

# 4. teardown leaves nothing
bash "$CLUSTER" down >/dev/null 2>&1
check "down: no namespace of the cluster left" bash -c "! ip netns list | grep -q '^$LK_NETNS_ID-'"
no_procs() { ! pgrep -f -- "$T/" >/dev/null; }
check "down: no process of the test's jobs left" no_procs
check "down: no /dev/shm entry of the cluster's nodes here" bash -c "! ls /dev/shm | grep -q -- '$LK_NETNS_ID'"
check "down: the cluster's state is gone" test ! -e "/run/lk-netns/$LK_NETNS_ID"
finish
