#!/usr/bin/env bash
# Exact resume: a run killed with SIGKILL (all ranks) or stopped by SIGTERM,
# then resumed from last.ckpt, ends with bitwise the same weights and
# optimizer state as an uninterrupted run; two runs with the same seed are
# bitwise identical. Single process and ddp on 2 ranks, in 32-true and in
# 16-mixed (with the fp16 loss scaler); ddp on 2 ranks in bf16-true.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
common=(--trainer.max_epochs 4 --trainer.every_n_train_steps 3 --trainer.enable_progress_bar false
        --data.init_args.num_samples 2048 --trainer.num_sanity_val_steps 0)

final_state() { # run dir -> exported weights + optimizer state
  "$LK_BIN" export --ckpt "$1/checkpoints/last.ckpt" --out "$2" --with-optimizer >/dev/null
}

run_case() {
  local name=$1; shift
  local extra=("$@")
  # uninterrupted, twice: same seed, same bits
  "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" >/dev/null 2>&1
  local a; a=$(latest); final_state "$a" "$T/$name.a.st"
  "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" >/dev/null 2>&1
  final_state "$(latest)" "$T/$name.a2.st"
  check "$name: two runs with one seed are bitwise equal" cmp -s "$T/$name.a.st" "$T/$name.a2.st"
  check "$name: metrics.csv identical across runs" cmp -s "$a/metrics.csv" "$(latest)/metrics.csv"

  for sig in KILL TERM; do
    # interrupted: wait for the first mid-run checkpoint, then signal the whole job
    local before; before=$(latest)
    # (each step sleeps 20 ms, so a fast machine cannot finish before the signal lands)
    LK_TEST_STEP_DELAY_MS=20 setsid "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" >"$T/$name.$sig.log" 2>&1 &
    local pid=$!
    local d=""
    for _ in $(seq 1 6000); do   # up to 30 s on a loaded machine
      d=$(latest)
      [ "$d" != "$before" ] && [ -s "$d/checkpoints/last.ckpt" ] && break
      sleep 0.005
    done
    kill -s "$sig" -- "-$pid" 2>/dev/null
    wait "$pid"; local rc=$?
    if [ "$sig" = TERM ]; then
      check "$name: SIGTERM exits 143 (got $rc)" test "$rc" = 143
    fi
    local resumed_from="$d/checkpoints/last.ckpt"
    check "$name/$sig: last.ckpt survived" test -s "$resumed_from"
    "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" --ckpt_path "$resumed_from" >"$T/$name.$sig.resume.log" 2>&1
    check "$name/$sig: resume ran" grep -q "resumed from" "$T/$name.$sig.resume.log"
    local r; r=$(latest)
    # Under load the signal can land after the job finished: then the resumed
    # run has nothing left to train, and the killed run's own last checkpoint
    # is the final state.
    [ -s "$r/checkpoints/last.ckpt" ] || r=$d
    final_state "$r" "$T/$name.$sig.st"
    check "$name/$sig: resumed run is bitwise equal to the uninterrupted one" cmp -s "$T/$name.a.st" "$T/$name.$sig.st"
  done
}

run_case single
run_case ddp2 --trainer.devices 2 --trainer.strategy ddp
# On one node the ranks share one copy of the parameters and optimizer state
# (each updating its half, restored above by one writer): the same bits as
# a replica per rank.
check "ddp2: the resumed run shared its parameters" grep -q "share one copy of the parameters" "$T/ddp2.KILL.resume.log"
"$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.devices 2 --trainer.strategy ddp \
  --trainer.ddp_shared_params false >"$T/ddp2.replicas.log" 2>&1
check "ddp2: ddp_shared_params false keeps replicas" bash -c "! grep -q 'share one copy' '$T/ddp2.replicas.log'"
final_state "$(latest)" "$T/ddp2.replicas.st"
check "ddp2: shared parameters == replicas, bitwise (weights and optimizer state)" cmp -s "$T/ddp2.a.st" "$T/ddp2.replicas.st"
# ... with clipping by the global norm and accumulation, and on 3 ranks
# (shards cut unevenly, inside a parameter)
for case in "2 --trainer.gradient_clip_val 0.05 --trainer.accumulate_grad_batches 2" "3"; do
  set -- $case; n=$1; shift
  for shared in true false; do
    "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.max_epochs 1 --trainer.devices "$n" \
      --trainer.strategy ddp --trainer.ddp_shared_params $shared "$@" >"$T/sh.$n.$shared.log" 2>&1
    final_state "$(latest)" "$T/sh.$n.$shared.st"
  done
  check "ddp$n $*: shared parameters == replicas, bitwise" cmp -s "$T/sh.$n.true.st" "$T/sh.$n.false.st"
done
# precision 16-mixed: the loss scaler's state (scale, growth tracker) is in
# last.ckpt and resume stays bitwise. With growth_interval 2 the scale has
# grown by the first mid-run checkpoint (step 3, the earliest the run is
# signalled) and later real fp16 overflows halve it and skip steps, on
# both sides of the interruption.
fp16=(--trainer.precision 16-mixed --trainer.grad_scaler_init_scale 1024 --trainer.grad_scaler_growth_interval 2)
"$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${fp16[@]}" --trainer.max_steps 3 >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/fp16.step3.st" --with-optimizer >/dev/null
check "fp16: the scale has changed by step 3 (2048 in last.ckpt)" python3 -c "
import json, struct, sys
b = open('$T/fp16.step3.st', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
s, e = h['grad_scaler.scale']['data_offsets']; sys.exit(struct.unpack('<d', b[8 + n + s:8 + n + e])[0] != 2048.0)"
run_case fp16 "${fp16[@]}"
check "fp16: real overflows skipped steps (Adam took fewer than the run's 208 optimizer steps)" python3 -c "
import json, struct, sys
b = open('$T/fp16.a.st', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
s, e = h['optimizer.state.layers.0.weight.step']['data_offsets']; k = struct.unpack('<q', b[8 + n + s:8 + n + e])[0]
print('Adam steps:', k); sys.exit(not 100 < k < 208)"
run_case fp16_ddp2 "${fp16[@]}" --trainer.devices 2 --trainer.strategy ddp
# precision bf16-true: bf16 parameters and gradients (averaged in f32), f32
# optimizer state, the ranks sharing one bf16 copy; resume stays bitwise.
run_case bf16true_ddp2 --trainer.precision bf16-true --trainer.devices 2 --trainer.strategy ddp
finish
