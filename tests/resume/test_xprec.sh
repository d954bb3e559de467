#!/usr/bin/env bash
# Checkpoints across precisions: every precision keeps f32 parameters and
# optimizer state, so a checkpoint written in one of 32-true, bf16-mixed,
# 16-mixed resumes in each other one, continues from its step, and says in
# one line what it saved and what it runs in; 16-mixed's grad_scaler.* state
# is ignored with a note under a precision without a scaler, and a scaler
# resumed from a checkpoint without one starts from its settings. test and
# predict load a checkpoint of another precision too (docs/PRECISION.md,
# "Checkpoints across precisions").
source "$(dirname "$0")/../cli/lib.sh"
write_synth
N=3
quiet=(--trainer.enable_progress_bar false --trainer.num_sanity_val_steps 0)
precs=(32-true bf16-mixed 16-mixed)

for p in "${precs[@]}"; do
  for q in "${precs[@]}"; do
    [ "$p" = "$q" ] && continue
    root="$T/runs-$p-$q"
    "$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$root" \
      --trainer.precision "$p" --trainer.max_steps $N >"$T/$p-$q.fit.log" 2>&1
    check "$p: fit $N steps" grep -q "\"global_step\":[[:space:]]*$N," "$root"/lightning_logs/version_0/run.json
    out=$("$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$root" --ckpt_path last \
      --trainer.precision "$q" --trainer.max_steps $((2 * N)) 2>&1); rc=$?
    check "$p -> $q: resume exits 0 (got $rc)" test "$rc" = 0
    check "$p -> $q: resumed at step $N" grep -q "resumed from .* step $N," <<<"$out"
    check "$p -> $q: says the precisions" grep -q "was saved in precision $p, this run uses $q" <<<"$out"
    r="$root/lightning_logs/version_1/run.json"
    check "$p -> $q: run.json global_step $((2 * N))" grep -q "\"global_step\":[[:space:]]*$((2 * N))," "$r"
    check "$p -> $q: run.json records precision $q" grep -q "\"precision\":[[:space:]]*\"$q\"" "$r"
    check "$p -> $q: run.json status ok" grep -q '"status":[[:space:]]*"ok"' "$r"
    if [ "$p" = 16-mixed ]; then
      check "$p -> $q: scaler state ignored, said once" \
        test "$(grep -c "(16-mixed's loss scaler) is ignored: precision $q has no loss scaler" <<<"$out")" = 1
    fi
    if [ "$q" = 16-mixed ]; then
      check "$p -> $q: scaler starts from its settings" \
        grep -q "has no loss scaler state: the scaler starts from trainer.grad_scaler_init_scale (65536)" <<<"$out"
    fi
  done
done

# The same precision resumes without a precision note (and 16-mixed keeps its scaler state silently).
root="$T/runs-same"
"$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$root" --trainer.precision 16-mixed \
  --trainer.max_steps $N >/dev/null 2>&1
out=$("$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$root" --ckpt_path last \
  --trainer.precision 16 --trainer.max_steps $((2 * N)) 2>&1)
check "16-mixed -> 16: resumed at step $N" grep -q "resumed from .* step $N," <<<"$out"
check "16-mixed -> 16: no precision or scaler note" bash -c '! grep -q "saved in precision\|loss scaler" <<<"$1"' _ "$out"
# As Lightning's Trainer: the alias is warned about once and recorded under the name it stands for
check "16: warned as Lightning's older name" \
  test "$(grep -c "trainer.precision 16 is Lightning's older name for 16-mixed: it runs 16-mixed" <<<"$out")" = 1
check "16: run.json records 16-mixed" grep -q '"precision":[[:space:]]*"16-mixed"' "$root/lightning_logs/version_1/run.json"

# ddp on 2 ranks: 16-mixed -> bf16-mixed, every note from rank 0 only, once
root="$T/runs-ddp"
ddp=(--trainer.devices 2 --trainer.strategy ddp)
"$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" "${ddp[@]}" --trainer.default_root_dir "$root" \
  --trainer.precision 16-mixed --trainer.max_steps $N >/dev/null 2>&1
out=$("$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" "${ddp[@]}" --trainer.default_root_dir "$root" --ckpt_path last \
  --trainer.precision bf16-mixed --trainer.max_steps $((2 * N)) 2>&1); rc=$?
check "ddp 16-mixed -> bf16-mixed: exits 0 (got $rc)" test "$rc" = 0
check "ddp 16-mixed -> bf16-mixed: run.json global_step $((2 * N))" \
  grep -q "\"global_step\":[[:space:]]*$((2 * N))," "$root"/lightning_logs/version_1/run.json
check "ddp: precision note once" test "$(grep -c "this run uses bf16-mixed" <<<"$out")" = 1
check "ddp: scaler note once" test "$(grep -c "is ignored: precision bf16-mixed has no loss scaler" <<<"$out")" = 1

# The *-true precisions: their checkpoints hold the weights in bf16/f16 (the
# optimizer state in f32), and a resume in another precision casts them and
# says how, in one line.
dtype_of() { # checkpoint, tensor -> its safetensors dtype
  python3 -c "
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
print(h[sys.argv[2]]['dtype'])" "$1" "$2"
}
for pqm in "bf16-true 32-true the bf16 weights are widened to f32 (exact)" \
           "32-true bf16-true the f32 weights are rounded to bf16" \
           "16-true bf16-true the f16 weights are converted to bf16 (rounded)" \
           "bf16-mixed 16-true the f32 weights are rounded to f16"; do
  set -- $pqm; p=$1; q=$2; shift 2; msg="$*"
  root="$T/runs-$p-$q"
  "$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$root" \
    --trainer.precision "$p" --trainer.max_steps $N >"$T/$p-$q.fit.log" 2>&1
  ck="$root"/lightning_logs/version_0/checkpoints/last.ckpt
  want=F32; [ "$p" = bf16-true ] && want=BF16; [ "$p" = 16-true ] && want=F16
  check "$p: last.ckpt holds the weights in $want" test "$(dtype_of "$ck" layers.0.weight)" = "$want"
  check "$p: and the optimizer state in F32" test "$(dtype_of "$ck" optimizer.state.layers.0.weight.exp_avg)" = F32
  out=$("$LK_BIN" fit -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$root" --ckpt_path last \
    --trainer.precision "$q" --trainer.max_steps $((2 * N)) 2>&1); rc=$?
  check "$p -> $q: resume exits 0 (got $rc)" test "$rc" = 0
  check "$p -> $q: resumed at step $N" grep -q "resumed from .* step $N," <<<"$out"
  check "$p -> $q: says how the weights are cast" \
    grep -q "was saved in precision $p, this run uses $q: $msg, the f32 optimizer state as it is" <<<"$out"
  want=F32; [ "$q" = bf16-true ] && want=BF16; [ "$q" = 16-true ] && want=F16
  check "$p -> $q: the resumed run's last.ckpt holds $want weights" \
    test "$(dtype_of "$root"/lightning_logs/version_1/checkpoints/last.ckpt layers.0.weight)" = "$want"
  check "$p -> $q: no loss scaler note (16-true has none)" bash -c '! grep -q "loss scaler" <<<"$1"' _ "$out"
done

# test and predict of a checkpoint saved in another precision
for pq in "16-mixed 32-true" "32-true bf16-mixed" "bf16-mixed 16-mixed" "bf16-true 32-true" "32-true bf16-true"; do
  set -- $pq; p=$1; q=$2
  ck="$T/runs-$p-$q/lightning_logs/version_0/checkpoints/last.ckpt"
  out=$("$LK_BIN" test -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$T/eval-$p-$q" \
    --trainer.precision "$q" --ckpt_path "$ck" 2>&1); rc=$?
  check "test: $p checkpoint under $q exits 0 (got $rc)" test "$rc" = 0
  check "test: $p checkpoint under $q prints test_acc" grep -q "test_acc" <<<"$out"
  check "test: $p checkpoint under $q says the precisions" grep -q "was saved in precision $p, this run uses $q" <<<"$out"
  check "test: no scaler note (nothing to resume)" bash -c '! grep -q "loss scaler" <<<"$1"' _ "$out"
  out=$("$LK_BIN" predict -c "$T/synth.yaml" "${quiet[@]}" --trainer.default_root_dir "$T/pred-$p-$q" \
    --trainer.precision "$q" --ckpt_path "$ck" 2>&1); rc=$?
  check "predict: $p checkpoint under $q exits 0 (got $rc)" test "$rc" = 0
  check "predict: $p checkpoint under $q writes every row" grep -q "'shape': (51, 4)" \
    "$T/pred-$p-$q"/lightning_logs/version_0/predictions.npy
  check "predict: $p checkpoint under $q says the precisions" grep -q "was saved in precision $p, this run uses $q" <<<"$out"
done
finish
