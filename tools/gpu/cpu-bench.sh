#!/usr/bin/env bash
# Run on the GPU machine for its 16 CPU cores (its own device call: each
# part fits inside one call's 10 minutes), from the repo root, with
# .gpu-debs carried along. It builds this working tree CPU-only (CUDA off:
# these are CPU figures) and, for `ab`, the issue-18 base commit that
# fetch-debs.sh packed as .gpu-debs/base-src.tar.gz, then runs
#
#   ab       bench/ab base head --pairs 7 over issue 18's grid (autoencoder,
#            ddp and dp, 1 and 2 devices, batch 64 and 256, one core per
#            device): the "no speed lost" proof this 2-core VM cannot give
#   scaling  lockstep bench train: autoencoder and mlp, ddp and dp, 1 2 4 8
#            16 devices, batch 64 and 256, 3 repeats (one core per device)
#   threads  lockstep bench train: one device with 1 2 4 8 16 compute
#            threads, mlp and autoencoder at batch 256, in 32-true,
#            bf16-mixed and 16-mixed: whether the low-precision GEMMs' cut
#            rules (bf16 on AMX and bf16x3 stay on one core below 256
#            MFLOP; measured on 2-core VMs only, cpu_lowp.c) still let
#            bf16-mixed and 16-mixed beat 32-true with 16 cores behind a device
#
# Files in $OUT: cpu-bench.log (everything printed), ab.txt, scaling.csv,
# scaling.txt, threads.txt. Exit status: 2 when a build failed, else the benchmark's.
#
#   tools/gpu/cpu-bench.sh ab|scaling|threads
set -uo pipefail
OUT=${OUT:-/tmp/lk-gpu-out}
P=${LK_GPU_PREFIX:-/tmp/lk-prefix}
what=${1:-}
case "$what" in ab | scaling | threads) ;; *) echo "usage: tools/gpu/cpu-bench.sh ab|scaling|threads" >&2; exit 1 ;; esac
mkdir -p "$OUT"
exec > >(tee -a "$OUT/cpu-bench.log") 2>&1
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
T0=$(date +%s)
step "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
. "$(dirname "$0")/prefix.sh"

build() { # source tree, build dir
  [ -x "$2/lockstep" ] && return 0
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DLK_CUDA=OFF -DLK_TESTS=OFF >"$OUT/cpu-build.log" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target lockstep >>"$OUT/cpu-build.log" 2>&1 ||
    { tail -30 "$OUT/cpu-build.log"; echo "build of $1 failed"; exit 2; }
}
step "build this tree (build-cpu)"
build . build-cpu
head_bin=$PWD/build-cpu/lockstep

if [ "$what" = ab ]; then
  step "build the base commit"
  if [ ! -e .gpu-debs/base-src.tar.gz ]; then echo "no .gpu-debs/base-src.tar.gz: run tools/gpu/fetch-debs.sh here"; exit 2; fi
  rm -rf /tmp/lk-base-src && mkdir -p /tmp/lk-base-src && tar -xzf .gpu-debs/base-src.tar.gz -C /tmp/lk-base-src
  cat /tmp/lk-base-src/BASE_COMMIT 2>/dev/null
  build /tmp/lk-base-src /tmp/lk-base-src/build
  step "bench/ab base head, issue 18's grid"
  bench/ab /tmp/lk-base-src/build/lockstep "$head_bin" --pairs "${LK_AB_PAIRS:-7}" -- --model autoencoder \
    --strategies ddp dp --devices 1 2 --batch-sizes 64 256 --steps "${LK_AB_STEPS:-300}" | tee "$OUT/ab.txt"
  rc=${PIPESTATUS[0]}
elif [ "$what" = threads ]; then
  step "bench train: one device, 1-16 compute threads, three precisions"
  "$head_bin" env | grep -E "^cpu|GEMM" | tee "$OUT/threads.txt"
  rc=0
  for t in 1 2 4 8 16; do
    echo "-- LK_NUM_THREADS=$t" | tee -a "$OUT/threads.txt"
    LK_NUM_THREADS=$t "$head_bin" bench train --model mlp autoencoder --strategies ddp --devices 1 --batch-sizes 256 \
      --precision 32-true bf16-mixed 16-mixed --steps "${LK_THREADS_STEPS:-200}" --repeats 2 | grep "x the samples" |
      tee -a "$OUT/threads.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
else
  step "bench train scaling over 1-16 devices"
  LK_NUM_THREADS=1 "$head_bin" bench train --model autoencoder mlp --strategies ddp dp --devices 1 2 4 8 16 \
    --batch-sizes 64 256 --steps "${LK_SCALING_STEPS:-100}" --repeats 3 --csv "$OUT/scaling.csv" | tee "$OUT/scaling.txt"
  rc=${PIPESTATUS[0]}
fi
echo "cpu-bench $what done in $(( $(date +%s) - T0 )) s, exit $rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit "$rc"
