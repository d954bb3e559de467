#!/usr/bin/env bash
# SLURM for real on the namespace cluster (scripts/netns-cluster.sh
# slurm-up: Debian's slurm-wlm, munged with a key of its own, slurmctld on
# node 0, slurmd on each of 2 nodes), and jobs launched the ways users do:
#  1. `srun --mpi=pmix` starts the ranks (Debian's SLURM has the PMIx
#     plugin; OpenMPI's MPI_Init finds the job through it): the probe
#     (mpi and hier backends) sees each rank on its node, block by block,
#     and a 1 MiB all-reduce crosses node 0's link;
#  2. `lockstep fit` ddp, 2 nodes x 2 ranks, on the mpi backend: under
#     `srun --mpi=pmix`, under `sbatch --wait` with mpirun inside the
#     allocation, and under `salloc` with mpirun: each ends with the
#     parameters and optimizer state of 4 ranks of mpirun on one node, bit
#     for bit; under srun on the auto backend (hier across nodes) it trains
#     and matches to 1e-4;
#  3. a rank on node 1 SIGKILLed mid-run under srun: the job ends within
#     comm_timeout + 10 s, non-zero, srun naming the node and the task, no
#     rank left; 3b. node 1's link cut under srun: the job ends within
#     comm_timeout + 10 s, a rank names node 1 and its ranks, and node 1's
#     ranks (whose MPI_Abort cannot reach srun) end by themselves;
#  4. nothing is left after the cluster goes down: no slurmctld, slurmd or
#     munged of it.
# Skipped (exit 77, "skipped: why") without root, namespaces, mpirun or
# SLURM's daemons (Debian: slurmd slurmctld slurm-client munge).
# Environment (from ctest): LK_BIN, LK_SOURCE_DIR, LK_MPIRUN, LK_MN_PROBE.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/mn_lib.sh" # close, mn_*
CLUSTER="$LK_SOURCE_DIR/scripts/netns-cluster.sh"
[ -n "${LK_MPIRUN:-}" ] && [ -x "${LK_MN_PROBE:-}" ] || { echo "skipped: lockstep was built without MPI or mpirun was not found"; exit 77; }
why=$(bash "$CLUSTER" slurm-check) || { echo "${why:-skipped: netns-cluster.sh slurm-check failed}"; exit 77; }

mn_cluster_up lks
# The daemons need what a container may not give (a cgroup hierarchy slurmd accepts): a machine where they
# do not start skips, with what they said.
if ! bash "$CLUSTER" slurm-up >"$T/slurm-up.out" 2>&1; then
  echo "skipped: SLURM's daemons did not start on this machine's namespaces: $(tail -4 "$T/slurm-up.out" | tr '\n' ' ')"
  exit 77
fi
check "SLURM on the cluster: slurmctld on node 0, slurmd on 2 nodes, all idle" grep -q "slurmd on 2 nodes" "$T/slurm-up.out"
# SLURM itself must start a PMIx step here (no lockstep in it): where it cannot, the machine lacks what
# SLURM needs, and the test skips with SLURM's words
if ! timeout -s KILL 60 bash "$CLUSTER" slurm srun -N 2 --ntasks-per-node 2 --mpi=pmix true >"$T/srun-true.out" 2>&1; then
  echo "skipped: srun --mpi=pmix cannot start a step on this machine's namespaces: $(tail -3 "$T/srun-true.out" | tr '\n' ' ')"
  exit 77
fi
sl() { timeout -s KILL 90 bash "$CLUSTER" slurm "$@"; }
MPI_NET=(--mca btl self,vader,tcp --mca btl_tcp_if_include 10.250.0.0/24 --mca oob_tcp_if_include 10.250.0.0/24)

# 1. srun --mpi=pmix: ranks placed block by block (0, 1 on node 0; 2, 3 on node 1)
f0=$fail
for be in mpi hier; do
  mn_probe "srun probe" $be block sl srun -N 2 --ntasks-per-node 2 --mpi=pmix
  [ "$fail" = "$f0" ] || sed 's/^/     probe: /' "$T/probe.out" >&2
done

# 2. the fit, launched three ways, against 4 ranks of mpirun on one node
f0=$fail
write_synth
fitargs=(fit -c "$T/synth.yaml" --trainer.strategy ddp --trainer.enable_progress_bar false --trainer.comm_timeout 30)
nodes=(--trainer.devices 2 --trainer.num_nodes 2)
"$LK_MPIRUN" ${LK_MPIRUN_FLAGS:-} -np 4 -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" "${fitargs[@]}" --trainer.devices 4 --trainer.default_root_dir "$T/one" >"$T/one.out" 2>&1
check "fit: 4 ranks of mpirun on one node (rc $?)" test -s "$T/one/lightning_logs/version_0/checkpoints/last.ckpt"
"$LK_BIN" export --ckpt "$T/one/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/one.st" --with-optimizer >/dev/null 2>&1
# trained NAME WHAT: NAME's run trained, and its weights and optimizer state are one's, bit for bit
trained() {
  local ck=$T/$1/lightning_logs/version_0/checkpoints/last.ckpt
  if [ ! -s "$ck" ]; then bad "$2: no checkpoint ($(tail -3 "$T/$1.out" 2>/dev/null | tr '\n' ' '))"; return; fi
  "$LK_BIN" export --ckpt "$ck" --out "$T/$1.st" --with-optimizer >/dev/null 2>&1
  check "$2: 2 nodes x 2 ranks end with one node's weights and optimizer state, bit for bit" cmp -s "$T/one.st" "$T/$1.st"
}
sl srun -N 2 --ntasks-per-node 2 --mpi=pmix env LK_COMM_BACKEND=mpi \
  "$LK_BIN" "${fitargs[@]}" "${nodes[@]}" --trainer.default_root_dir "$T/srun" >"$T/srun.out" 2>&1
trained srun "srun --mpi=pmix"
check "srun --mpi=pmix: the fit ran on the mpi communicator" \
  grep -q '"comm_backend": "mpi"' "$T/srun/lightning_logs/version_0/run.json"
flags=(--oversubscribe "${MPI_NET[@]}")
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
cat >"$T/job.sh" <<JOB
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node 2
#SBATCH -o $T/sbatch.out
mpirun ${flags[*]} -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \\
  $LK_BIN ${fitargs[*]} ${nodes[*]} --trainer.default_root_dir $T/sbatch
JOB
sl sbatch --wait "$T/job.sh" >"$T/sbatch.submit" 2>&1
check "sbatch --wait: the job ran ($(cat "$T/sbatch.submit"))" grep -q "Submitted batch job" "$T/sbatch.submit"
trained sbatch "sbatch with mpirun inside the allocation"
sl salloc -N 2 --ntasks-per-node 2 mpirun "${flags[@]}" -x LK_COMM_BACKEND=mpi -x LK_ALLOW_OVERSUBSCRIBE \
  "$LK_BIN" "${fitargs[@]}" "${nodes[@]}" --trainer.default_root_dir "$T/salloc" >"$T/salloc.out" 2>&1
trained salloc "salloc with mpirun"
sl srun -N 2 --ntasks-per-node 2 --mpi=pmix \
  "$LK_BIN" "${fitargs[@]}" "${nodes[@]}" --trainer.default_root_dir "$T/hier" >"$T/hier.out" 2>&1
check "srun on the auto backend: hier across the nodes" \
  grep -q '"comm_backend": *"hier"' "$T/hier/lightning_logs/version_0/run.json"
"$LK_BIN" export --ckpt "$T/hier/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/hier.st" >/dev/null 2>&1
"$LK_BIN" export --ckpt "$T/one/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/flat.st" >/dev/null 2>&1
cmpout=$(close "$T/flat.st" "$T/hier.st")
check "srun hier: the weights match one node's to 1e-4 ($cmpout)" test $? = 0
[ "$fail" = "$f0" ] || for f in srun sbatch salloc hier; do sed "s/^/     $f: /" "$T/$f.out" 2>/dev/null | tail -8; done >&2

# 3. a rank on node 1 killed mid-run under srun: the job ends within comm_timeout + 10 s, named
f0=$fail
TIMEOUT=5
BOUND=$((TIMEOUT + 10))
# long_job NAME: the fault cases' job under srun (mpi backend), in the background: $spid
long_job() {
  cp "$T/synth.yaml" "$T/$1.yaml"
  sl srun -N 2 --ntasks-per-node 2 --mpi=pmix env LK_COMM_BACKEND=mpi \
    "$LK_BIN" fit -c "$T/$1.yaml" --trainer.strategy ddp "${nodes[@]}" --trainer.max_epochs 100000 \
    --trainer.every_n_train_steps 20 --trainer.enable_progress_bar false --trainer.comm_timeout $TIMEOUT \
    --trainer.num_sanity_val_steps 0 --data.init_args.num_samples 4096 --trainer.default_root_dir "$T/$1" \
    >"$T/$1.out" 2>&1 &
  spid=$!
  jobs_pids+=("$spid")
}
# ranks_left MARKER: the job's ranks still running after up to 10 s (node 1's end by themselves), killed
ranks_left() {
  local _ p
  for _ in $(seq 1 200); do [ -z "$(pgrep -f -- "fit -c $1")" ] && break; sleep 0.05; done
  left=$(pgrep -f -- "fit -c $1" | tr '\n' ' ')
  for p in $left; do kill -KILL "$p" 2>/dev/null; done
}
long_job kill
check "kill: the 2 x 2 job started training under srun (a checkpoint was written)" \
  test -n "$(mn_started kill $spid "$T/kill.yaml" SLURM_PROCID)"
mn_kill_rank3 $spid "$T/kill.yaml" SLURM_PROCID $BOUND
ranks_left "$T/kill.yaml"
check "kill: the job ended within comm_timeout + 10 s = ${BOUND}s (${secs}s), exit status non-zero ($rc)" mn_ended_in $BOUND
check "kill: srun names the node and the task (task 3 on $LK_NETNS_ID-node1)" \
  grep -qE "$LK_NETNS_ID-node1: task 3: Killed" "$T/kill.out"
check "kill: no rank of the job left${left:+ (pids $left)}" test -z "$left"
[ "$fail" = "$f0" ] || sed 's/^/     kill: /' "$T/kill.out" | tail -15 >&2

# 3b. node 1's link cut mid-run under srun: the job ends within comm_timeout + 10 s (SLURM gives the lost
# step up 5 s after its cancel: the bed's KillWait), a rank names node 1 and its ranks, and node 1's ranks,
# whose MPI_Abort cannot reach srun, end by themselves within seconds
f0=$fail
long_job cut
check "cut: the 2 x 2 job started training under srun" test -n "$(mn_started cut $spid "$T/cut.yaml" SLURM_PROCID)"
t0=$(date +%s.%N)
ip -n "$LK_NETNS_ID-n1" link set eth0 down
mn_wait_end $spid $BOUND "$t0"
ranks_left "$T/cut.yaml"
check "cut: the job ended within comm_timeout + 10 s = ${BOUND}s (${secs}s), exit status non-zero ($rc)" mn_ended_in $BOUND
check "cut: a rank names node 1 and its ranks" grep -q "rank 2, 3 on $LK_NETNS_ID-node1" "$T/cut.out"
check "cut: no rank left on either node within 10 s more${left:+ (pids $left)}" test -z "$left"
[ "$fail" = "$f0" ] || sed 's/^/     cut: /' "$T/cut.out" | tail -15 >&2

# 4. nothing left
bash "$CLUSTER" down >/dev/null 2>&1
sleep 0.5
left=""
for p in $(pgrep -x 'slurmctld|slurmd|slurmstepd|munged'); do
  tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q "/run/lk-netns/$LK_NETNS_ID/" && left="$left $p"
done
check "down: no slurmctld, slurmd or munged of the cluster left${left:+ (pids$left)}" test -z "$left"
check "down: no namespace of the cluster left" bash -c "! ip netns list | grep -q '^$LK_NETNS_ID-'"
finish
