#!/usr/bin/env bash
# The autoencoder fitted across 2 namespace nodes x 2 ranks (hier, as auto
# picks) at one link rate, with each strategy given, 20 steps of 1024
# samples; prints samples/s and run.json's per-step phases (the steps after
# the 5th) with the machine's load. Needs root (scripts/netns-cluster.sh).
# usage: bench/multinode/fit_shaped.sh RATE [STRATEGY...]
#   STRATEGY: ddp, fsdp (FULL_SHARD), hybrid (fsdp HYBRID_SHARD); default all three
# LK_MN_MPIRUN_ARGS: more mpirun arguments (e.g. "-x LK_COMM_BACKEND", exported).
# LK_FIT_STEPS: steps (default 20); LK_FIT_OUT: where the runs go (default /tmp/lk-mn-fit)
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
rate=${1:?usage: fit_shaped.sh RATE [STRATEGY...]}; shift
strats=("$@"); [ ${#strats[@]} -gt 0 ] || strats=(ddp fsdp hybrid)
out=${LK_FIT_OUT:-/tmp/lk-mn-fit}
export LK_NETNS_ID=lkfit$$
S="$here/scripts/netns-cluster.sh"
mkdir -p "$out"
trap 'bash "$S" down >/dev/null 2>&1' EXIT
trap 'exit 130' INT TERM HUP
bash "$S" up 2 --rate "$rate" >/dev/null || exit 1
printf '%-8s %-10s %10s %8s %8s %8s %8s  %s\n' rate strategy samples/s fwd_ms bwd_ms comm_ms opt_ms load
for st in "${strats[@]}"; do
  args=(--trainer.strategy ddp)
  case $st in
    fsdp) args=(--trainer.strategy fsdp --trainer.fsdp_sharding_strategy FULL_SHARD) ;;
    hybrid) args=(--trainer.strategy fsdp --trainer.fsdp_sharding_strategy HYBRID_SHARD) ;;
  esac
  dir="$out/$rate-$st-$(date +%H%M%S)"
  read -r -a more <<<"${LK_MN_MPIRUN_ARGS:-}"
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  timeout 900 bash "$S" mpirun -np 4 --map-by ppr:2:node -x LK_ALLOW_OVERSUBSCRIBE=1 "${more[@]}" "$here/build/lockstep" fit \
    -c "$here/examples/autoencoder.yaml" --trainer.devices 2 --trainer.num_nodes 2 --trainer.max_epochs 1 \
    --trainer.limit_train_batches "${LK_FIT_STEPS:-20}" --trainer.enable_progress_bar false \
    --trainer.default_root_dir "$dir" "${args[@]}" >"$dir.log" 2>&1 || { echo "fit: $st at $rate failed (see $dir.log)"; continue; }
  load="$load / $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 - "$dir" "$rate" "$st" "$load" <<'PY'
import glob, json, sys
d, rate, st, load = sys.argv[1:]
j = json.load(open(sorted(glob.glob(d + "/**/run.json", recursive=True))[-1]))
t = j["step_time"]
f = lambda v: "%8.1f" % v if v is not None else "%8s" % "-"
print("%-8s %-10s %10.1f %s %s %s %s  %s (%s)" % (rate, st, j["samples_per_s"], f(t["forward_ms"]), f(t["backward_ms"]),
      f(t["comm_exposed_ms"]), f(t["optimizer_ms"]), load, j["comm_backend"]))
PY
done
