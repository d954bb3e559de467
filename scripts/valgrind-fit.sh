#!/usr/bin/env bash
# One small `lockstep fit` under valgrind memcheck, once with the loops this
# CPU gets and once capped to the baseline copy (LK_CPU_ISA=baseline): zero
# errors and zero definite or indirect leaks, or this exits non-zero.
# Uses the normal Release build (build/, or $LK_BUILD; configured as `make`
# does when absent): it is compiled for a portable baseline with AVX2 and
# AVX-512 copies picked at run time, and valgrind's CPU has AVX2 but no
# AVX-512, so the AVX2 copies run. (Until the portable build, Release meant
# -march=native, which valgrind cannot decode on an AVX-512 machine, and
# this script kept a Debug build of its own.) A CUDA build is fine: a CPU
# fit never loads cuBLASLt. An LK_NATIVE=ON build is not: point LK_BUILD at
# a portable one.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${LK_BUILD:-build}
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
if grep -q '^LK_NATIVE:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "valgrind-fit: $build is an LK_NATIVE=ON build (-march=native); use a portable one (LK_BUILD=...)" >&2
  exit 2
fi
cmake --build "$build" -j "$(nproc)" --target lockstep >/dev/null
out=$(mktemp -d /tmp/lkvg.XXXXXX)
trap 'rm -rf "$out"' EXIT
for isa in auto baseline; do
  LK_CPU_ISA=$isa valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect -q \
    "$build/lockstep" fit --model.class_path mlp --model.init_args.input_dim 16 \
    --model.init_args.hidden '[32]' --model.init_args.num_classes 4 --data.class_path synthetic \
    --data.init_args.num_samples 256 --data.init_args.input_shape '[16]' --data.init_args.num_classes 4 \
    --data.init_args.num_workers 1 --trainer.max_epochs 2 --trainer.default_root_dir "$out/$isa" \
    --trainer.enable_progress_bar false
  echo "valgrind: a small fit ran with no memory errors and no leaks (lockstep's loops: $(grep -o '"cpu_isa":[^,]*' "$out/$isa"/lightning_logs/version_*/run.json))"
done
