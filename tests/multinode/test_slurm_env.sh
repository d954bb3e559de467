#!/usr/bin/env bash
# SLURM's variables without SLURM: each rank of a 2-node x 2-task step as
# srun would set them (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
# SLURM_NODEID, SLURM_NNODES, SLURM_NTASKS_PER_NODE "2(x2)", SLURM_JOB_ID,
# SLURM_STEP_ID), read by `lockstep env`: rank, local rank, node and the job
# id every rank shares. Then bad launches, each a clear error at once: a
# rank past the task count, a node past the node count, and a fit whose
# devices x num_nodes disagrees with the step's task count.
source "$(dirname "$0")/../cli/lib.sh"
slurm() { # procid localid nodeid command...
  local p=$1 l=$2 n=$3; shift 3
  env -i PATH="$PATH" HOME="$T" SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_NTASKS=4 SLURM_NNODES=2 \
    SLURM_NTASKS_PER_NODE="2(x2)" SLURM_PROCID=$p SLURM_LOCALID=$l SLURM_NODEID=$n "$@"
}
for r in 0 1 2 3; do
  out=$(slurm $r $((r % 2)) $((r / 2)) "$LK_BIN" env 2>&1)
  check "rank $r: rank $r/4, local rank $((r % 2))/2, node $((r / 2))/2 from SLURM, job slurm-4242.0" \
    grep -q "rank $r/4, local rank $((r % 2))/2, node $((r / 2))/2 (slurm), job slurm-4242.0" <<<"$out"
done
# `lockstep env` reports a bad process group and carries on listing the rest
check "a task id past SLURM_NTASKS is named" \
  grep -qF "INVALID: rank 4 is out of range for world size 4 (slurm variables; expected 0..3)" <<<"$(slurm 4 0 1 "$LK_BIN" env 2>&1)"
check "a node id past SLURM_NNODES is named" \
  grep -qF "INVALID: node rank 2 is out of range for 2 nodes (slurm variables)" <<<"$(slurm 3 1 2 "$LK_BIN" env 2>&1)"
write_synth
t0=$(date +%s)
expect_fail "num_nodes=3 x devices=2 in a 4-task step" 1 "but trainer.devices=2 x num_nodes=3 = 6" \
  slurm 0 0 0 timeout -s KILL 30 "$LK_BIN" fit -c "$T/synth.yaml" --trainer.strategy ddp --trainer.devices 2 \
  --trainer.num_nodes 3
check "the mismatch is reported at once, not after a rendezvous timeout ($(( $(date +%s) - t0 )) s)" \
  test $(( $(date +%s) - t0 )) -le 10
finish
