#!/usr/bin/env bash
# The GPU machine's 16 CPU cores, from the repo root, with .gpu-debs carried
# along. tools/gpu/session.sh runs each part inside its one device call; on
# its own, each part fits a call's 10 minutes. It builds this working tree
# CPU-only (CUDA off: these are CPU figures) and, for `ab`, the issue-18
# base commit that fetch-debs.sh packed as .gpu-debs/base-src.tar.gz, then runs
#
#   build    the two builds only (session.sh starts this behind its CUDA build)
#   ab       bench/ab base head over issue 18's grid (autoencoder, ddp and
#            dp, 1 and 2 devices, batch 64 and 256, one core per device):
#            the "no speed lost" proof this 2-core VM cannot give; as many
#            pairs as fit LK_AB_SECONDS (default: session.sh's step time less
#            20 s, else 140), up to LK_AB_PAIRS (7)
#   scaling  lockstep bench train: autoencoder and mlp, ddp and dp, 1 2 4 8
#            16 devices (those up to the core count), batch 64 and 256 (one
#            core per device)
#   threads  lockstep bench train: one device with 1 2 4 8 16 compute
#            threads, mlp and autoencoder at batch 256, in 32-true,
#            bf16-mixed and 16-mixed: whether the low-precision GEMMs' cut
#            rules (bf16 on AMX and bf16x3 stay on one core below 256
#            MFLOP; measured on 2-core VMs only, cpu_lowp.c) still let
#            bf16-mixed and 16-mixed beat 32-true with 16 cores behind a device
#
# Files in $OUT: ab.txt, scaling.csv, and on its own cpu-bench.log
# (everything printed; under session.sh that goes to its session.log).
# Exit status: 2 when a build failed, else the benchmark's.
#
#   tools/gpu/cpu-bench.sh build|ab|scaling|threads
set -uo pipefail
OUT=${OUT:-/tmp/lk-gpu-out}
P=${LK_GPU_PREFIX:-/tmp/lk-prefix}
what=${1:-}
case "$what" in build | ab | scaling | threads) ;; *) echo "usage: tools/gpu/cpu-bench.sh build|ab|scaling|threads" >&2; exit 1 ;; esac
mkdir -p "$OUT"
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
T0=$(date +%s)
if [ -z "${LK_GPU_NESTED:-}" ]; then # under session.sh: its log, its prefix
  exec > >(tee -a "$OUT/cpu-bench.log") 2>&1
  step "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
  . "$(dirname "$0")/prefix.sh"
fi

build() { # source tree, build dir
  [ -x "$2/lockstep" ] && return 0
  local l=/tmp/lk-cpu-build-$(echo "$2" | tr / _).log t=$(date +%s)
  # LK_WERROR=OFF: the image's compiler is not CI's, and a new warning must not cost the session
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DLK_CUDA=OFF -DLK_TESTS=OFF -DLK_WERROR=OFF >"$l" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target lockstep >>"$l" 2>&1 ||
    { tail -30 "$l"; echo "build of $1 failed"; exit 2; }
  echo "built $1 in $2 ($(($(date +%s) - t)) s)"
}
base=/tmp/lk-base-src
build . build-cpu
head_bin=$PWD/build-cpu/lockstep
if [ "$what" = build ] || [ "$what" = ab ]; then
  if [ ! -x $base/build/lockstep ]; then
    if [ ! -e .gpu-debs/base-src.tar.gz ]; then echo "no .gpu-debs/base-src.tar.gz: run tools/gpu/fetch-debs.sh here"; exit 2; fi
    rm -rf $base && mkdir -p $base && tar -xzf .gpu-debs/base-src.tar.gz -C $base
  fi
  cat $base/BASE_COMMIT 2>/dev/null
  build $base $base/build
fi

rc=0
if [ "$what" = ab ]; then
  step "bench/ab base head, issue 18's grid"
  python3 bench/ab $base/build/lockstep "$head_bin" --pairs "${LK_AB_PAIRS:-7}" --deadline "${LK_AB_SECONDS:-$((${LK_STEP_SECONDS:-160} - 20))}" -- \
    --model autoencoder --strategies ddp dp --devices 1 2 --batch-sizes 64 256 --steps "${LK_AB_STEPS:-200}" | tee -i "$OUT/ab.txt"
  rc=${PIPESTATUS[0]}
elif [ "$what" = threads ]; then
  step "bench train: one device, 1-16 compute threads, three precisions"
  "$head_bin" env | grep -E "^cpu|GEMM"
  for t in 1 2 4 8 16; do
    echo "-- LK_NUM_THREADS=$t"
    LK_NUM_THREADS=$t "$head_bin" bench train --model mlp autoencoder --strategies ddp --devices 1 --batch-sizes 256 \
      --precision 32-true bf16-mixed 16-mixed --steps "${LK_THREADS_STEPS:-100}" --repeats 1 | grep "x the samples"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
elif [ "$what" = scaling ]; then
  devs=$(for d in 1 2 4 8 16; do [ "$d" -le "$(nproc)" ] && echo $d; done | tr '\n' ' ')
  step "bench train scaling over $devs devices"
  LK_NUM_THREADS=1 "$head_bin" bench train --model autoencoder mlp --strategies ddp dp --devices $devs \
    --batch-sizes 64 256 --steps "${LK_SCALING_STEPS:-100}" --repeats "${LK_SCALING_REPEATS:-1}" --csv "$OUT/scaling.csv"
  rc=$?
fi
echo "cpu-bench $what done in $(( $(date +%s) - T0 )) s, exit $rc"
exit "$rc"
