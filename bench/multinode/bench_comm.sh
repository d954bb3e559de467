#!/usr/bin/env bash
# `lockstep bench comm` across 2 namespace nodes x 2 ranks, hier and flat
# mpi, unshaped and shaped, then the alpha-beta fit of each
# (bench/multinode/alpha_beta.py). Needs root (scripts/netns-cluster.sh).
# usage: bench/multinode/bench_comm.sh [OUTDIR] [RATES...]   (default: none 1gbit 200mbit 100mbit)
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/lk-mn-bench}; shift || true
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(none 1gbit 200mbit 100mbit)
export LK_NETNS_ID=lkbench$$
S="$here/scripts/netns-cluster.sh"
mkdir -p "$out"
trap 'bash "$S" down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM HUP
bash "$S" up 2 || exit 1
for rate in "${rates[@]}"; do
  bash "$S" shape "$rate" || exit 1
  for w in hier mpi; do
    timeout 600 bash "$S" mpirun -np 4 --map-by ppr:2:node "$here/build/lockstep" bench comm --worker $w \
      --min 4096 --max 16M --time 0.3 --repeat 3 --iters 0 --touch 0 --out "$out/f-$rate-$w.csv" \
      >"$out/f-$rate-$w.log" 2>&1 || echo "bench: $w at $rate failed (see $out/f-$rate-$w.log)"
  done
done
python3 "$here/bench/multinode/alpha_beta.py" "$out"/f-*.csv
