#!/usr/bin/env bash
# One small `lockstep fit` under valgrind memcheck: zero errors and zero
# definite or indirect leaks, or this exits non-zero. Uses a Debug build
# without -march=native (valgrind does not decode AVX-512), and without
# CUDA: a CPU fit never calls it, and cuBLASLt's load-time initialiser
# dlopens with an RPATH that valgrind flags inside ld.so (not our code).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=Debug -DLK_TESTS=OFF -DLK_CUDA=OFF >/dev/null
cmake --build build-valgrind -j "$(nproc)" --target lockstep >/dev/null
out=$(mktemp -d /tmp/lkvg.XXXXXX)
trap 'rm -rf "$out"' EXIT
valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect \
  --show-leak-kinds=definite,indirect -q \
  build-valgrind/lockstep fit --model.class_path mlp --model.init_args.input_dim 16 \
  --model.init_args.hidden '[32]' --model.init_args.num_classes 4 --data.class_path synthetic \
  --data.init_args.num_samples 256 --data.init_args.input_shape '[16]' --data.init_args.num_classes 4 \
  --data.init_args.num_workers 1 --trainer.max_epochs 2 --trainer.default_root_dir "$out" \
  --trainer.enable_progress_bar false
echo "valgrind: a small fit ran with no memory errors and no leaks"
