#!/usr/bin/env bash
# The whole GPU session in one device call. Run on the GPU machine, from the
# repo root, with .gpu-debs carried along (tools/gpu/README.md has the exact
# call). A session is lent 15 minutes of device time in all, the machine's
# start included, and one call runs at most 10: so this does everything in
# one call, most important first, and stops starting steps when its budget
# (default 540 s, leaving the call time to hand the files back) runs out.
# Every step has a cap of its own (a hung test cannot eat the session) and
# writes its results into $OUT as it goes, so a step cut short still leaves
# what it measured.
#
#   build    unpack the debs into a prefix (never into /), configure and
#            build build-gpu/ with CUDA; meanwhile, in the background and
#            niced, build-cpu/ (this tree, CUDA off) and the issue-18 base
#            commit (.gpu-debs/base-src.tar.gz) for the CPU steps
#   tests    nvidia-smi, `lockstep env`, `ctest -L gpu` (each test <= 120 s;
#            gpu_fit is the fit step's program, run there with its output)
#   ops      test_gpu_ops again for its per-descriptor lines: every op,
#            forward and backward, f32/bf16/f16, cuda backend vs cpu backend
#   gemm     cuBLASLt GEMM rates at the models' shapes (bench_gpu_gemm)
#   fit      mlp and autoencoder, 200 steps on cuda:0 against the CPU's curve
#   stats    a GPU fit with device_stats_monitor: NVML's utilization, memory,
#            temperature and power as logged in metrics.csv
#   ab       issue 18: bench/ab base vs this tree on the CPU cores, the
#            grid 2-core VMs cannot time (tools/gpu/cpu-bench.sh ab)
#   compare  bench/gpu-compare: lockstep vs PyTorch with CUDA, mlp and
#            autoencoder, batch 256 and 1024, 32-true and bf16-mixed,
#            lockstep with and without graph replay
#   memcheck compute-sanitizer's memcheck over test_gpu_ops (into gpu-ops.log)
#   scaling  lockstep bench train over 1-16 CPU devices (cpu-bench.sh scaling)
#   threads  one CPU device with 1-16 compute threads (cpu-bench.sh threads)
#   unit     ctest -L unit on this build (sanity of the build on this image)
#
#   tools/gpu/session.sh [--budget S] [--only STEP,...] [--skip STEP,...]
#
# A second call on the still-warm machine can run what the first had no
# time for: --only names those steps (the builds are kept; build always runs
# and is then a no-op). Files in $OUT (the device tool brings back 8 at
# most): session.log (everything printed, nvidia-smi, env, the fit and stats
# lines), build.log, ctest-gpu.log, gpu-ops.log, gemm.csv, gpu-compare.csv,
# ab.txt, scaling.csv. Exit status: 0 when every step that ran passed;
# 3 when the gpu tests were skipped (no GPU visible); 2 when the CUDA build
# failed; 1 when a step failed or ran out of its time.
set -uo pipefail
OUT=${OUT:-/tmp/lk-gpu-out}
P=${LK_GPU_PREFIX:-/tmp/lk-prefix}
BUILD=${LK_GPU_BUILD:-build-gpu}
budget=540
only=""
skip=""
while [ $# -gt 0 ]; do
  case "$1" in
  --budget) budget=$2; shift 2 ;;
  --only) only=",$2,"; shift 2 ;;
  --skip) skip=",$2,"; shift 2 ;;
  *) echo "usage: tools/gpu/session.sh [--budget S] [--only STEP,...] [--skip STEP,...]" >&2; exit 1 ;;
  esac
done
mkdir -p "$OUT"
log=$OUT/session.log
exec > >(tee -a "$log") 2>&1
T0=$(date +%s)
export LK_GPU_NESTED=1 OUT P BUILD # cpu-bench.sh: log through this script, the prefix already set up
step() { echo; echo "== $(date -u +%H:%M:%S) +$(($(date +%s) - T0))s $*"; }
left() { echo $((T0 + budget - $(date +%s))); }
summary=()
final=0
note() { # step, status, seconds
  summary+=("$(printf '%-8s %-28s %4ss' "$1" "$2" "$3")")
  case "$2" in ok | skipped* | partial* | SKIPPED*) ;; *) [ $final = 0 ] && final=1 ;; esac
}
wanted() { [[ ( -z $only || $only == *",$1,"* ) && $skip != *",$1,"* ]]; }

# run STEP CAP COMMAND...: COMMAND under min(CAP, what is left of the
# budget) seconds, SIGINT first (the benchmark scripts print what they
# have), SIGKILL 15 s later. A step with under 20 s left is not started.
step_rc= # the last step's exit status (empty: not run)
run() {
  local name=$1 cap=$2
  shift 2
  step_rc=
  wanted "$name" || return 0
  local l
  l=$(($(left) - 5))
  [ "$l" -lt "$cap" ] && cap=$l
  if [ "$cap" -lt 20 ]; then
    note "$name" "skipped: out of budget" 0
    return 0
  fi
  step "$name (at most ${cap}s)"
  local t=$(date +%s) rc
  export LK_STEP_SECONDS=$cap # the benchmarks stop starting pairs 20 s before it
  # a step is a program or one of the functions below (exported to the child bash)
  timeout --signal=INT --kill-after=15 "$cap" bash -c '"$@"' step "$@"
  rc=$?
  step_rc=$rc
  local dt=$(($(date +%s) - t))
  if [ $rc = 0 ]; then note "$name" ok "$dt"
  elif [ $rc = 3 ] && [ "$name" = tests ]; then note "$name" "SKIPPED: no GPU visible" "$dt"
  elif [ $rc = 4 ]; then note "$name" "partial: out of time" "$dt"
  elif [ $rc = 124 ] || [ $rc = 137 ]; then note "$name" "cut at its ${cap}s" "$dt"
  else note "$name" "failed (exit $rc)" "$dt"; fi
  return 0
}

step "machine"
uname -a
echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
(command -v nvcc && nvcc --version | tail -2) || echo "nvcc: not on PATH"
(command -v gcc && gcc --version | head -1) || echo "gcc: not on PATH"
command -v cmake && cmake --version | head -1
nvidia-smi 2>&1 | head -20 || echo "nvidia-smi failed"
python3 -c 'import torch; print("PyTorch", torch.__version__, "cuda available:", torch.cuda.is_available(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -1

# The .deb prefix, build paths and NCCL (shared with cpu-bench.sh).
. "$(dirname "$0")/prefix.sh"

# ---- build: CUDA in the foreground, the CPU builds behind it ----------------
step "build: $BUILD (-DLK_CUDA=ON) now; build-cpu and the base commit in the background"
cpu_build_pid=
if wanted ab || wanted scaling || wanted threads; then
  nice -n 10 tools/gpu/cpu-bench.sh build >"$OUT/cpu-build.log" 2>&1 &
  cpu_build_pid=$!
fi
tb=$(date +%s)
gen=()
keep=(-k) # keep going past a failed target: what built still runs (and at most 6 minutes: then the CPU steps)
command -v ninja >/dev/null && gen=(-G Ninja) keep=(-k 0)
build_rc=0
if [ ! -x "$BUILD/lockstep" ] || [ ! -x "$BUILD/tests/test_gpu_ops" ]; then
  # LK_WERROR=OFF: the image's gcc is not CI's (Debian 12's gcc 12), and a
  # warning new to it must not cost the one call; warnings are listed below.
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLK_CUDA=ON -DLK_WERROR=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${LK_GPU_CUDA_ARCH:-90}" >>"$OUT/build.log" 2>&1 &&
    timeout 360 cmake --build "$BUILD" -j "$(nproc)" -- "${keep[@]}" >>"$OUT/build.log" 2>&1 || build_rc=1
fi
grep -E "^-- (lockstep|  )" "$OUT/build.log" 2>/dev/null | tail -20
grep -E "(warning|error)[: ]" "$OUT/build.log" 2>/dev/null | grep -v "Building\|Linking" | head -20
# The GPU steps need the program and the gpu tests; a failed test-only target elsewhere does not stop them.
cuda_ok=1
for f in lockstep tests/test_gpu_ops tests/test_gpu_device tests/test_gpu_fit_sealed; do
  [ -x "$BUILD/$f" ] || { echo "not built: $BUILD/$f"; cuda_ok=0; }
done
if [ $build_rc = 0 ]; then note build ok $(($(date +%s) - tb))
elif [ $cuda_ok = 1 ]; then grep -E "^FAILED:|error:" "$OUT/build.log" | cut -c1-300 | head -20; note build "partial (build.log)" $(($(date +%s) - tb))
else tail -40 "$OUT/build.log"; note build "FAILED (build.log)" $(($(date +%s) - tb)); fi

gpu_skipped=0
if [ $cuda_ok = 1 ]; then
  gpu_tests() {
    "$BUILD/lockstep" env 2>&1 | sed -n '/^cpu/,/^process group/p'
    (cd "$BUILD" && ctest -L '^gpu$' -E '^gpu_fit$' --output-on-failure --timeout 120) >"$OUT/ctest-gpu.log" 2>&1
    local rc=$?
    tail -30 "$OUT/ctest-gpu.log"
    if grep -q "(Skipped)" "$OUT/ctest-gpu.log"; then
      echo "WARNING: gpu tests were SKIPPED: no CUDA device visible to this process:"
      "$BUILD/tests/test_gpu_device" 2>&1 | head -3
      return 3
    fi
    return $rc
  }
  # ctest keeps a passing test's output to itself: the per-descriptor lines go to gpu-ops.log
  gpu_ops() {
    "$BUILD/tests/test_gpu_ops" >"$OUT/gpu-ops.log" 2>&1
    local rc=$?
    echo "gpu_ops exit $rc"
    grep -v "^ok" "$OUT/gpu-ops.log" | head -40
    return $rc
  }
  gemm() {
    "$BUILD/tests/bench_gpu_gemm" >"$OUT/gemm.csv" && (column -s, -t <"$OUT/gemm.csv" 2>/dev/null || cat "$OUT/gemm.csv")
  }
  stats() { # Lightning's DeviceStatsMonitor on the GPU: what NVML said while a fit ran
    local d=/tmp/lk-stats
    rm -rf "$d"
    "$BUILD/lockstep" fit --model.class_path mlp --data.class_path synthetic --data.init_args.num_samples 65536 \
      --data.init_args.input_shape '[784]' --data.init_args.num_classes 10 --data.init_args.batch_size 1024 --trainer.accelerator gpu \
      --trainer.devices 1 --trainer.max_steps 600 --trainer.max_epochs 100 --trainer.limit_val_batches 0 \
      --trainer.num_sanity_val_steps 0 --trainer.log_every_n_steps 50 --trainer.device_stats_monitor true \
      --trainer.enable_progress_bar false --trainer.enable_checkpointing false --trainer.default_root_dir "$d" || return 1
    python3 - "$d" <<'EOF'
import csv, glob, sys
rows = list(csv.DictReader(open(glob.glob(sys.argv[1] + "/lightning_logs/version_*/metrics.csv")[0])))
keys = [k for k in rows[0] if k.startswith("device_stats/")]
print("metrics.csv, %d rows; the device_stats columns of the last 4 rows that have them:" % len(rows))
for r in [r for r in rows if any(r[k] for k in keys)][-4:]:
    print("  step %s: %s" % (r.get("step"), ", ".join("%s=%s" % (k.split("/")[-1], r[k]) for k in keys if r[k])))
if not any("utilization.gpu" in k for k in keys):
    sys.exit("no utilization.gpu column: NVML gave no GPU stats (lockstep env's 'gpu stats' line says why)")
EOF
  }
  export -f gpu_tests gpu_ops gemm stats
  run tests 180 gpu_tests
  [ "$step_rc" = 3 ] && gpu_skipped=1
  if [ $gpu_skipped = 0 ]; then
    run ops 60 gpu_ops
    run gemm 45 gemm
    run fit 90 "$BUILD/tests/test_gpu_fit_sealed"
    run stats 45 stats
  fi
fi

# ---- the CPU cores: issue 18's A/B first (it needs the builds behind) --------
if [ -n "$cpu_build_pid" ]; then
  wait "$cpu_build_pid"
  rc=$?
  cat "$OUT/cpu-build.log" >>"$OUT/build.log"
  rm -f "$OUT/cpu-build.log"
  [ $rc = 0 ] || { echo "CPU builds failed (build.log)"; note cpu-build "FAILED (build.log)" 0; }
fi
run ab 150 tools/gpu/cpu-bench.sh ab
if [ $cuda_ok = 1 ] && [ $gpu_skipped = 0 ]; then
  compare() {
    bench/gpu-compare --lockstep "$BUILD/lockstep" --pairs 2 --eager-too --deadline $((LK_STEP_SECONDS - 20)) \
      --csv "$OUT/gpu-compare.csv"
  }
  export -f compare
  run compare 170 compare
fi
# compute-sanitizer's memcheck over the op-by-op test: an out-of-bounds
# access or a failed launch named by kernel and address (after the figures:
# it runs the kernels 10-100x slower). Its report goes to gpu-ops.log.
memcheck() {
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$cs" ] || { echo "compute-sanitizer: not found"; return 1; }
  echo "== compute-sanitizer --tool memcheck test_gpu_ops" >>"$OUT/gpu-ops.log"
  "$cs" --tool memcheck --error-exitcode 9 --print-limit 20 "$BUILD/tests/test_gpu_ops" >>"$OUT/gpu-ops.log" 2>&1
  local rc=$?
  grep -E "^=========|ERROR SUMMARY" "$OUT/gpu-ops.log" | head -30
  return $rc
}
export -f memcheck
[ $cuda_ok = 1 ] && [ $gpu_skipped = 0 ] && run memcheck 90 memcheck
run scaling 150 tools/gpu/cpu-bench.sh scaling
run threads 100 tools/gpu/cpu-bench.sh threads
unit() { cd "$BUILD" && ctest -L '^unit$' -j "$(nproc)" --timeout 60 >>"$OUT/ctest-gpu.log" 2>&1; }
export -f unit
[ $cuda_ok = 1 ] && run unit 90 unit

step "summary ($(($(date +%s) - T0)) s of a ${budget}s budget)"
printf '%s\n' "${summary[@]}"
[ $gpu_skipped = 1 ] && final=3
[ $cuda_ok = 0 ] && final=2
echo "session done, exit $final; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $final
