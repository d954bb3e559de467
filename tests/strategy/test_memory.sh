#!/usr/bin/env bash
# Memory per rank (issue 46, item 5): the model state each rank reports in
# run.json against lockstep's own ZeRO formulas, and the per-rank memory
# limit (trainer.memory_limit_mb / LK_MEMORY_LIMIT_MB) enforced by the
# allocator.
#
# The formulas, for P f32 parameters, f32 gradients, Adam's 2 f32 state
# arrays, N ranks and chunks of c = ceil(P / N) elements rounded up to 16
# (deepspeed_stage_1 pads its flat parameter buffer to c * N, each chunk on
# a cache line); stage 2, stage 3 and fsdp cut
# each unit u (the mlp's two Linear layers: 561 and 136 parameters) into
# chunks of c_u = ceil(P_u / N), each stored padded to r_u = c_u rounded up
# to 16 elements:
#   single, ddp:          parameters 4P,          gradients 4P,      optimizer state 8P       (16P)
#   deepspeed_stage_1:    parameters 4cN,         gradients 4P,      optimizer state 8c       (~ 8P + 8P/N)
#   deepspeed_stage_2:    parameters 4 sum c_u N, gradients 4 sum r_u, optimizer state 8 sum c_u (~ 4P + 12P/N)
#   deepspeed_stage_3, fsdp: parameters 4 sum r_u, gradients 4 sum r_u, optimizer state 8 sum c_u (~ 16P/N),
#                         plus the units gathered at once during a step (reported apart, > 0)
# (the ZeRO paper's 4 Psi + 12 Psi/N is mixed precision's: 2+2 bytes of
# fp16 parameters and gradients, 12 of fp32 master copy and moments; lockstep
# trains f32 parameters with no separate master copy, so K = 8 and what is
# replicated is 8 bytes).
# N = 1 runs the single strategy (one process has nothing to shard).
#
# The limit: an mlp of 2,105,348 parameters (1023 -> 2048 -> 4; the f32
# Adam state alone is 16,842,784 bytes) under 40 MiB per rank. Replicated
# (ddp, with or without shared parameters) its state does not fit, and the
# fit stops on every rank, naming the allocation, its purpose, the live
# bytes and the limit, with no segment or process left; sharded over 2 ranks
# (deepspeed_stage_2) the same model trains under the same limit, every
# rank's peak below it. The peaks this was sized by (counted bytes, 1 thread
# per rank): ddp 42.0 MiB per rank without shared parameters, 57.5 on rank 0
# with them; deepspeed_stage_2 38.0, deepspeed_stage_1 34.0.
source "$(dirname "$0")/../cli/lib.sh"
export LK_ALLOW_OVERSUBSCRIBE=1 # 4 ranks on a 2-core CI machine: slow, not wrong
export LK_NUM_THREADS=1         # per-thread buffers do not move the peaks with the machine's core count
unset LK_MEMORY_LIMIT_MB
model() { # model FILE INPUT HIDDEN: the config
  cat > "$1" <<YAML
seed_everything: 7
trainer:
  default_root_dir: $T/runs
  max_steps: 3
  enable_progress_bar: false
  num_sanity_val_steps: 0
  enable_model_summary: false
  enable_checkpointing: false
  limit_val_batches: 0
model:
  class_path: mlp
  init_args:
    input_dim: $2
    hidden: [$3]
    num_classes: 4
data:
  class_path: synthetic
  init_args:
    num_samples: 128
    input_shape: [$2]
    num_classes: 4
    batch_size: 16
optimizer:
  name: adam
  lr: 0.001
YAML
}
model "$T/small.yaml" 16 33 # 697 parameters: a prime times a prime, no N here divides it
model "$T/big.yaml" 1023 2048

# 1. the reported model state against the formulas, N = 1, 2, 4
for n in 1 2 4; do
  for s in ddp deepspeed_stage_1 deepspeed_stage_2 fsdp; do
    rm -rf "$T/runs"
    if ! timeout 120 "$LK_BIN" fit -c "$T/small.yaml" --trainer.devices $n --trainer.strategy $s >"$T/f.log" 2>&1; then
      bad "$s x$n: fit failed: $(tail -3 "$T/f.log")"
      continue
    fi
    got=$(python3 - "$(latest)/run.json" $n $s <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[2]); s = sys.argv[3]
P = 697
c = -(-(-(-P // n)) // 16) * 16
cu = [-(-pu // n) for pu in (561, 136)]
ru = [-(-x // 16) * 16 for x in cu]
gathered = n > 1 and s == "fsdp"
if n == 1 or s == "ddp":
    want = [4 * P, 4 * P, 8 * P]
elif s == "deepspeed_stage_1":
    want = [4 * c * n, 4 * P, 8 * c]
elif s == "deepspeed_stage_2":
    want = [4 * sum(cu) * n, 4 * sum(ru), 8 * sum(cu)]
else:
    want = [4 * sum(ru), 4 * sum(ru), 8 * sum(cu)]
rows = r["memory"]["ranks"]
bad = []
if len(rows) != n: bad.append("%d rows for %d ranks" % (len(rows), n))
for row in rows:
    got = [row["parameters"], row["gradients"], row["optimizer_state"]]
    if got != want or (row["gathered"] > 0) != gathered:
        bad.append("rank %d: %s + gathered %s, want %s" % (row["rank"], got, row["gathered"], want))
    if not (row["max_rss_bytes"] > 0 and row["alloc_peak_bytes"] > 0): bad.append("rank %d: peaks %s" % (row["rank"], row))
    if s != "ddp" and row["alloc_peak_bytes"] < sum(want): bad.append("rank %d: allocator peak %d below the model state %d" % (row["rank"], row["alloc_peak_bytes"], sum(want)))
ms = r["model_state_bytes"]
if [ms["parameters"], ms["gradients"], ms["optimizer_state"]] != want: bad.append("model_state_bytes %s" % ms)
if r["memory"]["limit_bytes"] is not None: bad.append("a limit with none set")
print("; ".join(bad) if bad else "ok %s" % want)
PY
)
    check "$s x$n: each rank's parameters + gradients + optimizer state = lockstep's formula ($got)" test "${got%% *}" = ok
  done
done
grep -q "rank 3: model state" "$T/f.log" && ok "the fit's closing summary has a line per rank" \
  || bad "the fit's closing summary has a line per rank: $(grep -A5 'memory per rank' "$T/f.log")"

# 2. the limit: ddp's replicated Adam state does not fit 40 MiB, on any rank
limit_msg="allocating 16842784 bytes for the optimizer state would pass this rank's memory limit of 41943040 bytes"
capped() { # capped NAME ARGS...: a 2-rank fit of the big mlp under the limit; its status in $T/NAME.rc
  local name=$1; shift
  rm -rf "$T/runs"
  # the fit's own pid names its job's segment (/dev/shm/lockstep-lk<pid>-...): bash writes it, then becomes the fit
  timeout 60 bash -c 'echo $$ >"$0"; exec "$@"' "$T/$name.pid" "$LK_BIN" fit -c "$T/big.yaml" --trainer.devices 2 "$@" \
    >"$T/$name.log" 2>&1
  echo $? >"$T/$name.rc"
}
no_segment() { ! ls /dev/shm 2>/dev/null | grep -q "^lockstep-lk$(cat "$T/$1.pid")-"; }
for v in shared unshared; do
  capped ddp_$v --trainer.strategy ddp --trainer.memory_limit_mb 40 --trainer.ddp_shared_params $([ $v = shared ] && echo true || echo false)
  rc=$(cat "$T/ddp_$v.rc")
  check "ddp ($v parameters) under 40 MiB: fails, not killed or timed out (exit $rc)" test "$rc" = 1
  check "ddp ($v parameters): rank 0's error names the bytes, the optimizer state, the limit and its key" \
    grep -qF "error: [rank 0] out of memory: $limit_msg (trainer.memory_limit_mb): " "$T/ddp_$v.log"
  check "ddp ($v parameters): rank 1 says why it stopped too" grep -q "^\[rank 1\] lockstep fit: error: .*out of memory" "$T/ddp_$v.log"
  check "ddp ($v parameters): no shared-memory segment left" no_segment ddp_$v
done
check "no rank process left" bash -c "! pgrep -f '[l]ockstep fit -c $T/big.yaml' >/dev/null"
# the variable, when the config does not set the key
rm -rf "$T/runs"
LK_MEMORY_LIMIT_MB=40 timeout 60 "$LK_BIN" fit -c "$T/big.yaml" --trainer.devices 2 --trainer.strategy ddp \
  --trainer.ddp_shared_params false >"$T/env.log" 2>&1
check "LK_MEMORY_LIMIT_MB=40: the same error, naming the variable" \
  grep -qF "$limit_msg (LK_MEMORY_LIMIT_MB)" "$T/env.log"

# 3. deepspeed_stage_1 on 2 ranks trains the same model under the same limit (its one layer is one unit: stage 2
#    and fsdp hold that unit's whole gradient beside their chunks, so they need the deeper model below)
capped z2 --trainer.strategy deepspeed_stage_1 --trainer.memory_limit_mb 40
check "deepspeed_stage_1 under 40 MiB: trains ($(tail -1 "$T/z2.log"))" test "$(cat "$T/z2.rc")" = 0
got=$(python3 - "$(latest)/run.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["memory"]
bad = [] if m["limit_bytes"] == 41943040 and m["limit_from"] == "trainer.memory_limit_mb" else ["limit %s" % m]
for row in m["ranks"]:
    if not 0 < row["alloc_peak_bytes"] <= 41943040: bad.append("rank %d peak %s" % (row["rank"], row["alloc_peak_bytes"]))
    if row["optimizer_state"] != 8 * (-(-2105348 // 2 // 16) * 16): bad.append("rank %d optimizer state %s" % (row["rank"], row["optimizer_state"]))
print("; ".join(bad) if bad else "ok " + ", ".join("rank %d peak %.1f MiB" % (r["rank"], r["alloc_peak_bytes"] / 2**20) for r in m["ranks"]))
PY
)
check "deepspeed_stage_1 under 40 MiB: run.json has the limit, each rank's peak under it and half the Adam state (its chunk on a cache line) ($got)" \
  test "${got%% *}" = ok
check "deepspeed_stage_1: the closing summary names the limit" grep -q "limit 40.0 MiB per rank (trainer.memory_limit_mb)" "$T/z2.log"

# fsdp past the limit: the refusal names what its mappings were to hold (a unit's whole gradients)
rm -rf "$T/runs"
timeout 60 "$LK_BIN" fit -c "$T/big.yaml" --trainer.devices 2 --trainer.strategy fsdp --trainer.memory_limit_mb 30 \
  >"$T/fsdp_cap.log" 2>&1
check "fsdp x2 under 30 MiB: stops, naming the unit whose whole gradients would pass the limit" \
  grep -q "out of memory: allocating 8388608 bytes for the whole gradients of unit 'layers.0' would pass this rank's memory limit of 31457280 bytes" "$T/fsdp_cap.log"

# 3b. fsdp: a deeper mlp (512 -> 4 x 1024 -> 4: P = 3,681,284 in five units, 16P = 56 MiB) under 48 MiB per rank:
#    ddp stops; fsdp trains on 2 and 4 ranks, its gathered units charged to the rank. Peaks this was sized by
#    (counted bytes, 1 thread per rank): ddp 56.6 MiB per rank (98.7 on rank 0 with shared parameters),
#    deepspeed_stage_2 51.3, fsdp x2 45.3, fsdp x4 31.7.
model "$T/deep.yaml" 512 "1024, 1024, 1024, 1024"
rm -rf "$T/runs"
timeout 120 "$LK_BIN" fit -c "$T/deep.yaml" --trainer.devices 2 --trainer.strategy ddp --trainer.ddp_shared_params false \
  --trainer.memory_limit_mb 48 >"$T/deep_ddp.log" 2>&1
check "deep mlp, ddp x2 under 48 MiB: stops with the memory limit's error" \
  grep -q "error: \[rank [01]\] out of memory: .*would pass this rank's memory limit of 50331648 bytes" "$T/deep_ddp.log"
for n in 2 4; do
  rm -rf "$T/runs"
  timeout 120 "$LK_BIN" fit -c "$T/deep.yaml" --trainer.devices $n --trainer.strategy fsdp --trainer.memory_limit_mb 48 \
    >"$T/fsdp$n.log" 2>&1
  check "deep mlp, fsdp x$n under 48 MiB: trains ($(tail -1 "$T/fsdp$n.log"))" test $? = 0
  got=$(python3 - "$(latest)/run.json" $n <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["memory"]; n = int(sys.argv[2])
bad = []
for row in m["ranks"]:
    if not 0 < row["alloc_peak_bytes"] <= 50331648: bad.append("rank %d peak %s" % (row["rank"], row["alloc_peak_bytes"]))
    if not row["gathered"] > 0: bad.append("rank %d gathered %s" % (row["rank"], row["gathered"]))
    if row["parameters"] > 4 * 3681284 // n + 4096: bad.append("rank %d parameters %s" % (row["rank"], row["parameters"]))
print("; ".join(bad) if bad else "ok " + ", ".join("rank %d peak %.1f MiB" % (r["rank"], r["alloc_peak_bytes"] / 2**20) for r in m["ranks"]))
PY
)
  check "deep mlp, fsdp x$n under 48 MiB: each rank's peak under it, 1/$n of the parameters, gathered units reported ($got)" \
    test "${got%% *}" = ok
done

# 4. a bad value is refused, naming the key
expect_fail "trainer.memory_limit_mb -1 is refused" 2 "trainer.memory_limit_mb: expected a value in [0, 1e+09], got '-1'" \
  "$LK_BIN" fit -c "$T/small.yaml" --trainer.memory_limit_mb -1
finish
