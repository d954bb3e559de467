#!/usr/bin/env bash
# The collectives that cross the nodes, on a 2-node namespace cluster
# (scripts/netns-cluster.sh), checked by tests/multinode/mn_coll.c on every
# rank (values whose sums depend on the order of additions):
#  1. hier, 2 nodes x 2 ranks laid out node by node (--map-by ppr:2:node):
#     the all-reduce pipelined in chunks (LK_COMM_HIER_CHUNK) is bitwise the
#     unchunked one and the hierarchical order (a0 + a1) + (a2 + a3); the
#     all-gather and reduce-scatter go through the node leaders, exact /
#     bitwise as with whole-buffer steps and OpenMPI's collectives of two,
#     and the reduce-scatter's block is bitwise the all-reduce's;
#  2. hier, ranks dealt round-robin (--map-by node): all-gather and
#     reduce-scatter fall back to flat on world, still right;
#  3. mpi, 2 nodes x 1 rank: the two-host swap's all-gather and
#     reduce-scatter, bitwise as OpenMPI's own (LK_COMM_MPI_PAIR_CHUNK=0).
# Skipped (exit 77, "skipped: why") without root, namespaces or mpirun.
# Environment (from ctest): LK_BIN, LK_SOURCE_DIR, LK_MPIRUN, LK_MN_COLL.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/mn_lib.sh" # mn_cluster_up
CLUSTER="$LK_SOURCE_DIR/scripts/netns-cluster.sh"
[ -n "${LK_MPIRUN:-}" ] && [ -x "${LK_MN_COLL:-}" ] || { echo "skipped: lockstep was built without MPI or mpirun was not found"; exit 77; }
why=$(bash "$CLUSTER" check) || { echo "${why:-skipped: netns-cluster.sh check failed}"; exit 77; }

mn_cluster_up lkh
# mpi_yield_when_idle: 4 ranks on CI's few cores
coll() { timeout -s KILL 60 bash "$CLUSTER" mpirun --mca mpi_yield_when_idle 1 "$@"; }

for run in "hier 4 ppr:2:node blocked" "hier 4 node roundrobin" "mpi 2 ppr:1:node pair"; do
  read -r be np map what <<<"$run"
  f0=$fail
  coll -np "$np" --map-by "$map" "$LK_MN_COLL" "$be" "$what" >"$T/$what.out" 2>&1; rc=$?
  check "$be $what ($np ranks, --map-by $map): every rank's all-reduce, all-gather and reduce-scatter right and bitwise as the reference (rc $rc)" \
    bash -c "[ $rc = 0 ] && [ \$(grep -c '^coll $be rank .* ok\$' '$T/$what.out') = $np ]"
  [ "$fail" = "$f0" ] || sed 's/^/     coll: /' "$T/$what.out" >&2
done

bash "$CLUSTER" down >/dev/null 2>&1
check "nothing of the cluster is left" bash -c "! ip netns list | grep -q '^$LK_NETNS_ID-'"
finish
