#!/usr/bin/env bash
# Run on the GPU machine, from the repo root, with .gpu-debs carried along
# (tools/gpu/README.md has the exact device call). It unpacks the .deb files
# into a prefix (never into /), points the build at it, configures with
# CUDA, builds, and runs: nvidia-smi, the `gpu` ctest label, the cuda
# backend's op-by-op comparison (gpu-ops.log), the unit tests, `lockstep env`
# and the GEMM rate table. Everything lands in $OUT (at most
# 8 files: the device tool brings back no more). Exit status: that of the gpu
# tests; 3 when they were skipped (no GPU visible); 2 when the build failed.
#
#   tools/gpu/session.sh [--quick|--bench]
#     --quick: gpu tests only, no unit tests
#     --bench: (a second call, the build kept) bench/gpu-compare only: lockstep
#              against PyTorch with CUDA, mlp and autoencoder, batch 256 and
#              1024, 32-true and bf16-mixed, lockstep with and without the
#              step replayed as graphs (gpu-compare.txt, gpu-compare.csv)
set -uo pipefail
OUT=${OUT:-/tmp/lk-gpu-out}
P=${LK_GPU_PREFIX:-/tmp/lk-prefix}
BUILD=${LK_GPU_BUILD:-build-gpu}
quick=0
bench=0
[ "${1:-}" = "--quick" ] && quick=1
[ "${1:-}" = "--bench" ] && bench=1
mkdir -p "$OUT"
log=$OUT/session.log
exec > >(tee -a "$log") 2>&1
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }
T0=$(date +%s)

step "machine"
uname -a; nproc; (command -v nvcc && nvcc --version | tail -2) || echo "nvcc: not on PATH"
command -v cmake && cmake --version | head -1
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed (see nvidia-smi.txt)"
head -20 "$OUT/nvidia-smi.txt"

# The .deb prefix, build paths and NCCL (shared with cpu-bench.sh).
. "$(dirname "$0")/prefix.sh"


step "configure ($BUILD, -DLK_CUDA=ON)"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLK_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${LK_GPU_CUDA_ARCH:-90}" \
  >"$OUT/build.log" 2>&1
rc=$?
grep -E "^-- (lockstep|  )" "$OUT/build.log"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; echo "configure failed"; exit 2; fi

step "build"
cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1
rc=$?
grep -E "warning|error" "$OUT/build.log" | head -20
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; echo "build failed"; exit 2; fi
echo "built in $(( $(date +%s) - T0 )) s"

if [ $bench = 1 ]; then
  step "bench/gpu-compare (lockstep vs PyTorch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null))"
  # 2 pairs of 3 runs per cell (graphs, LK_GRAPHS=0, PyTorch): 48 runs, as 3 pairs of 2 were, inside one call's 10 minutes
  bench/gpu-compare --lockstep "$BUILD/lockstep" --pairs 2 --eager-too --csv "$OUT/gpu-compare.csv" | tee "$OUT/gpu-compare.txt"
  rc=${PIPESTATUS[0]}
  echo "session --bench done in $(( $(date +%s) - T0 )) s; exit $rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  exit "$rc"
fi

step "lockstep env"
"$BUILD/lockstep" env >"$OUT/env.txt" 2>&1
sed -n '/^gpus/,/^process group/p' "$OUT/env.txt"

step "ctest -L gpu"
(cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) >"$OUT/ctest-gpu.log" 2>&1
gpu_rc=$?
tail -30 "$OUT/ctest-gpu.log"
if grep -q "(Skipped)" "$OUT/ctest-gpu.log"; then
  echo "WARNING: gpu tests were SKIPPED: no CUDA device visible to this process ($BUILD/tests/test_gpu_device says why):"
  "$BUILD/tests/test_gpu_device" 2>&1 | head -3
fi

step "cuda backend vs cpu backend, descriptor by descriptor (gpu_ops)"
# ctest keeps a passing test's output to itself: the per-descriptor lines go to gpu-ops.log
if [ -x "$BUILD/tests/test_gpu_ops" ]; then
  "$BUILD/tests/test_gpu_ops" >"$OUT/gpu-ops.log" 2>&1
  echo "gpu_ops exit $?"; grep -v "^ok" "$OUT/gpu-ops.log" | head -40
fi

step "GEMM rates (cuBLASLt)"
if [ -x "$BUILD/tests/bench_gpu_gemm" ]; then
  "$BUILD/tests/bench_gpu_gemm" >"$OUT/gemm.csv" 2>>"$log"
  column -s, -t <"$OUT/gemm.csv" 2>/dev/null || cat "$OUT/gemm.csv"
fi

step "fit check (gpu_fit: 200 steps on cuda:0 against the CPU's loss curve)"
if [ -x "$BUILD/tests/test_gpu_fit_sealed" ]; then
  "$BUILD/tests/test_gpu_fit_sealed" >"$OUT/gpu-fit.log" 2>&1
  echo "gpu_fit exit $?"; cat "$OUT/gpu-fit.log"
fi

if [ $quick = 0 ]; then
  step "unit tests (sanity of this build on this machine)"
  (cd "$BUILD" && ctest -L unit -j "$(nproc)" --timeout 120) >>"$OUT/ctest-gpu.log" 2>&1 \
    && echo "unit tests: passed" || { echo "unit tests: FAILED"; grep -E "\(Failed\)|\*\*\*" "$OUT/ctest-gpu.log" | head; }
fi
# Skipped gpu tests on the GPU machine mean no GPU was seen: not a success.
[ $gpu_rc = 0 ] && grep -q "(Skipped)" "$OUT/ctest-gpu.log" && gpu_rc=3
echo "session done in $(( $(date +%s) - T0 )) s; gpu tests exit $gpu_rc; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $gpu_rc
