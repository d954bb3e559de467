#!/usr/bin/env bash
# `lockstep bench comm` across 2 namespace nodes x 2 ranks, hier and flat
# mpi, unshaped and shaped, then the alpha-beta fit of each
# (bench/multinode/alpha_beta.py). Needs root (scripts/netns-cluster.sh).
# usage: bench/multinode/bench_comm.sh [OUTDIR] [RATES...]   (default: none 1gbit 200mbit 100mbit)
# LK_MN_BENCH_WORKERS: the backends to run (default "hier mpi"); each job
#   also writes OpenMPI's own MPI_Allreduce rows ("raw").
# LK_MN_BENCH_YIELD=1 (the default) runs every rank with OpenMPI's
#   mpi_yield_when_idle=1: the bed's 4 ranks share 2 cores, and without it
#   OpenMPI's blocking calls busy-poll and wait for each other's time slices
#   (40-180 ms a call), which measures the scheduler, not the algorithm.
#   0 leaves OpenMPI's default.
# LK_MN_BENCH_SIZES: "--min A --max B" (default 4096 to 16M).
# LK_MN_MPIRUN_ARGS: more mpirun arguments (e.g. "-x LK_COMM_HIER_CHUNK",
#   with the variable exported).
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/lk-mn-bench}; shift || true
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(none 1gbit 200mbit 100mbit)
read -r -a workers <<<"${LK_MN_BENCH_WORKERS:-hier mpi}"
read -r -a sizes <<<"${LK_MN_BENCH_SIZES:---min 4096 --max 16M}"
extra=()
[ "${LK_MN_BENCH_YIELD:-1}" = 1 ] && extra+=(--mca mpi_yield_when_idle 1)
read -r -a more <<<"${LK_MN_MPIRUN_ARGS:-}"
extra+=("${more[@]}")
export LK_NETNS_ID=lkbench$$
S="$here/scripts/netns-cluster.sh"
mkdir -p "$out"
trap 'bash "$S" down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM HUP
bash "$S" up 2 || exit 1
{ date -u; uptime; } >"$out/load-start.txt"
for rate in "${rates[@]}"; do
  bash "$S" shape "$rate" || exit 1
  for w in "${workers[@]}"; do
    echo "$(date -u +%T) $rate $w: $(uptime | sed 's/.*load/load/')" >>"$out/load.txt"
    timeout 600 bash "$S" mpirun -np 4 --map-by ppr:2:node "${extra[@]}" "$here/build/lockstep" bench comm --worker $w \
      "${sizes[@]}" --time 0.3 --repeat 3 --iters 0 --touch 0 --out "$out/f-$rate-$w.csv" \
      >"$out/f-$rate-$w.log" 2>&1 || echo "bench: $w at $rate failed (see $out/f-$rate-$w.log)"
  done
done
{ date -u; uptime; } >"$out/load-end.txt"
python3 "$here/bench/multinode/alpha_beta.py" "$out"/f-*.csv
