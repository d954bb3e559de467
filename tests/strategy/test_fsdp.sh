#!/usr/bin/env bash
# fsdp and deepspeed_stage_3 (src/strategy/fsdp.c) against ddp: on 2, 3 and
# 4 ranks, 20 Adam steps with clipping by norm, gradient accumulation and
# bf16-mixed, on an mlp of 697 parameters (no world size here divides it:
# the last chunks are padded) and a 3-block GPT (tied wte/lm_head in the
# root, dropout, activation checkpointing), must end with the same weights
# and the same Adam state as ddp, bit for bit. Why bitwise: a unit's
# gathered parameters are the replica's values, the gradients are averaged
# by the same shm reduction in rank order (reduce-scatter per unit instead
# of all-reduce per bucket), Adam is element-wise, and the clipping norm
# sums each parameter's partial norms in double before the f32 total (the
# same value here). Also: every sharding strategy, the units' memory in
# run.json, exact resume at the same world size, resume across strategies
# and world sizes through the whole checkpoint, FSDPStrategy's class node,
# and the refusals.
source "$(dirname "$0")/sharded_lib.sh" # $T/z.yaml (the 697-parameter mlp), fit, same, run_json, last

X=(--trainer.gradient_clip_val 0.05 --trainer.accumulate_grad_batches 2 --trainer.precision bf16-mixed)
if [ "${1:-}" = mpi ]; then
  # The same fsdp run over the mpi communicator (3 ranks under mpirun; its prefetches and reduce-scatters
  # are the mpi thread's non-blocking collectives): equal to ddp over shm, bitwise.
  # Environment (from ctest): LK_MPIRUN, LK_MPIRUN_FLAGS.
  read -r -a flags <<<"${LK_MPIRUN_FLAGS:-}"
  fit ddp3 --trainer.devices 3 --trainer.strategy ddp "${X[@]}"
  for s in fsdp deepspeed_stage_3; do
    rm -rf "$T/runs"
    timeout 120 "$LK_MPIRUN" "${flags[@]}" -np 3 -x LK_ALLOW_OVERSUBSCRIBE=1 -x LK_COMM_BACKEND=mpi "$LK_BIN" fit \
      -c "$T/z.yaml" --trainer.devices 3 --trainer.strategy $s "${X[@]}" >"$T/mpi.log" 2>&1
    "$LK_BIN" export --ckpt "$(last)" --out "$T/mpi$s.st" \
      --with-optimizer >/dev/null 2>&1
    check "$s x3 over mpi: it ran on the mpi communicator" grep -q '"comm_backend": "mpi"' "$(run_json)"
    check "$s x3 over mpi == ddp x3 over shm, bitwise" same mpi$s ddp3
  done
  finish
  exit
fi
for n in 2 3 4; do
  fit ddp$n --trainer.devices $n --trainer.strategy ddp "${X[@]}"
  fit fsdp$n --trainer.devices $n --trainer.strategy fsdp "${X[@]}"
  check "fsdp x$n (clip, accumulation, bf16-mixed, 697 parameters): weights and Adam state == ddp, bitwise" same fsdp$n ddp$n
done
fit z3.3 --trainer.devices 3 --trainer.strategy deepspeed_stage_3 "${X[@]}"
check "deepspeed_stage_3 x3 == ddp, bitwise" same z3.3 ddp3
grep -q "deepspeed_stage_3 (lockstep's ZeRO-3" "$T/z3.3.log" && ok "the fit's opening line names lockstep's ZeRO-3" \
  || bad "the fit's opening line names lockstep's ZeRO-3"
# one node over shm: the gathers copy the peers' chunks in place (the equivalences above ran that way;
# the mpi run below, the all-gathers)
check "fsdp x3 over shm: its start-up line says the gathers read the peers' chunks in place" \
  grep -q "FULL_SHARD over 3 ranks: .*; gathers read the peers' chunks in place" "$T/fsdp3.log"
# LK_SHARD_INLINE=0: every unit's reduce-scatter on the communication thread as its backward ends (the default
# defers the small ones to the backward's end, on this thread): the same reductions, the same bits
export LK_SHARD_INLINE=0
fit fsdpasync2 --trainer.devices 2 --trainer.strategy fsdp "${X[@]}"
unset LK_SHARD_INLINE
check "fsdp x2 with LK_SHARD_INLINE=0 (each reduction on the communication thread) == ddp, bitwise" same fsdpasync2 ddp2
# and their units' whole gradients were reduced in place from the ring in the segment (no memory limit set)
check "fsdp x3 over shm: its start-up line says the whole gradients are reduced in place from the ring" \
  grep -q "; whole gradients reduced in place from a [0-9.]* MiB ring in shared memory" "$T/fsdp3.log"
for sh in SHARD_GRAD_OP NO_SHARD HYBRID_SHARD; do
  fit $sh --trainer.devices 3 --trainer.strategy fsdp --trainer.fsdp_sharding_strategy $sh "${X[@]}"
  check "fsdp $sh x3 == ddp, bitwise (HYBRID_SHARD on one node is FULL_SHARD)" same $sh ddp3
done
fit bysize --trainer.devices 2 --trainer.strategy fsdp --trainer.fsdp_min_num_params 100 "${X[@]}"
check "fsdp x2 wrapped by size (min_num_params 100) == ddp, bitwise" same bysize ddp2
fit noprefetch --trainer.devices 2 --trainer.strategy fsdp --trainer.fsdp_forward_prefetch false \
  --trainer.fsdp_backward_prefetch false "${X[@]}"
check "fsdp x2 without prefetch == ddp, bitwise" same noprefetch ddp2

# the model state per rank: 4 ranks, the mlp's units (layers.0: 16x33+33 = 561, layers.2: 33x4+4 = 136) in
# chunks of 141 and 34 (each padded to 16 elements: 144 + 48 = 192 floats), Adam's two arrays of them
fit mem4 --trainer.devices 4 --trainer.strategy fsdp
got=$(python3 -c "
import json, sys; m = json.load(open(sys.argv[1]))['model_state_bytes']
print(m['parameters'], m['gradients'], m['optimizer_state'], m['gathered'] > 0)" "$(run_json)")
check "fsdp x4 run.json model_state_bytes: chunks of each unit, gathered units reported ($got)" \
  test "$got" = "768 768 1400 True"

# 16-mixed: the loss scaler's overflow check agreed over the chunks
for s in ddp fsdp; do fit f16$s --trainer.devices 3 --trainer.strategy $s --trainer.precision 16-mixed \
  --trainer.gradient_clip_val 0.05; done
check "fsdp x3, 16-mixed + clipping == ddp, bitwise" same f16fsdp f16ddp

# validation inside the fit, test and predict (forwards without a backward: each unit gathered and given
# back around its forward) give ddp's numbers
for s in ddp fsdp; do
  rm -rf "$T/ev$s"
  timeout 120 "$LK_BIN" fit -c "$T/z.yaml" --trainer.devices 2 --trainer.strategy $s --trainer.max_steps 30 \
    --trainer.val_check_interval 10 --trainer.default_root_dir "$T/ev$s" >"$T/ev$s.log" 2>&1
  c=$T/ev$s/lightning_logs/version_0/checkpoints/last.ckpt
  grep -v "^$" "$T/ev$s/lightning_logs/version_0/metrics.csv" >"$T/ev$s.val" # epoch, step, val_acc, val_loss
  timeout 60 "$LK_BIN" test -c "$T/z.yaml" --trainer.devices 2 --trainer.strategy $s --ckpt_path "$c" \
    --trainer.default_root_dir "$T/ev$s" 2>&1 | grep test_loss >"$T/ev$s.test"
  timeout 60 "$LK_BIN" predict -c "$T/z.yaml" --trainer.devices 2 --trainer.strategy $s --ckpt_path "$c" \
    --trainer.default_root_dir "$T/ev$s" >/dev/null 2>&1
done
check "fsdp x2: validation metrics inside the fit == ddp's ($(tail -1 "$T/evfsdp.val"))" cmp -s "$T/evfsdp.val" "$T/evddp.val"
check "fsdp x2: test_loss == ddp's ($(cat "$T/evfsdp.test"))" bash -c "[ -s '$T/evfsdp.test' ] && cmp -s '$T/evfsdp.test' '$T/evddp.test'"
check "fsdp x2: predictions == ddp's, bitwise" cmp -s "$(ls "$T"/evfsdp/lightning_logs/version_*/predictions.npy)" \
  "$(ls "$T"/evddp/lightning_logs/version_*/predictions.npy)"

# the *-true precisions: bf16 or f16 chunks, gathered and reduce-scattered in that dtype
for p in bf16-true 16-true; do
  for s in ddp fsdp; do fit $p$s --trainer.devices 3 --trainer.strategy $s --trainer.precision $p \
    --trainer.gradient_clip_val 0.05 --trainer.accumulate_grad_batches 2; done
  check "fsdp x3, $p + clipping + accumulation == ddp, bitwise" same ${p}fsdp ${p}ddp
done

# Lightning's class node: FSDPStrategy with its init_args
cat > "$T/node.yaml" <<YAML
trainer:
  strategy:
    class_path: lightning.pytorch.strategies.FSDPStrategy
    init_args:
      sharding_strategy: SHARD_GRAD_OP
      auto_wrap_policy: [torch.nn.Linear]
      cpu_offload: false
      limit_all_gathers: true
      backward_prefetch: BACKWARD_PRE
      state_dict_type: full
YAML
fit node --trainer.devices 2 -c "$T/node.yaml" "${X[@]}"
check "FSDPStrategy {SHARD_GRAD_OP, auto_wrap_policy [Linear]} runs fsdp and == ddp, bitwise" same node ddp2
check "DeepSpeedStrategy {stage: 3} runs deepspeed_stage_3" bash -c "timeout 120 '$LK_BIN' fit -c '$T/z.yaml' \
  --trainer.devices 2 --trainer.max_steps 2 --trainer.default_root_dir '$T/n3' \
  --trainer.strategy '{class_path: DeepSpeedStrategy, init_args: {stage: 3}}' 2>&1 | grep -q 'on 2 processes (deepspeed_stage_3'"

# exact resume at the same world size: 10 steps, then 10 more from the checkpoint == 20 straight
rm -rf "$T/half"
timeout 120 "$LK_BIN" fit -c "$T/z.yaml" --trainer.devices 3 --trainer.strategy fsdp --trainer.max_steps 10 \
  --trainer.default_root_dir "$T/half" >"$T/half.log" 2>&1
c="$T/half/lightning_logs/version_0/checkpoints/last.ckpt"
fit resumed --trainer.devices 3 --trainer.strategy fsdp --ckpt_path "$c"
fit straight --trainer.devices 3 --trainer.strategy fsdp
check "fsdp x3: resumed at step 10 == 20 straight steps, bitwise (units and optimizer chunks gathered into the checkpoint)" \
  same resumed straight
# the checkpoint is the ordinary whole one, under the net's names: it resumes under ddp at another world
# size, and a ddp checkpoint resumes under fsdp
fit from_fsdp --trainer.devices 2 --trainer.strategy ddp --ckpt_path "$c"
fit from_fsdp2 --trainer.devices 2 --trainer.strategy fsdp --ckpt_path "$c"
check "an fsdp checkpoint from 3 ranks resumes as fsdp on 2 ranks == as ddp on 2 ranks, bitwise" same from_fsdp2 from_fsdp
fit from_single --trainer.devices 1 --trainer.strategy single --ckpt_path "$c"
check "an fsdp checkpoint from 3 ranks resumes on one process" test -s "$T/from_single.st"

# a GPT: transformer blocks as units, wte tied to lm_head (in the root), dropout, activation checkpointing
if "$LK_BIN" fit --help | grep -q "^  gpt "; then
  mkdir -p "$T/tok"
  cat "$(dirname "$0")"/../../docs/*.md >"$T/text.txt"
  "$LK_BIN" prepare --input "$T/text.txt" --out "$T/tok" >/dev/null
  cat > "$T/g.yaml" <<YAML
seed_everything: 3
trainer:
  default_root_dir: $T/runs
  max_steps: 8
  enable_progress_bar: false
  num_sanity_val_steps: 0
  enable_model_summary: false
  limit_val_batches: 2
model:
  class_path: gpt
  init_args: {n_layer: 3, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 256, bias: true, dropout: 0.1}
data:
  class_path: tokens
  init_args: {root: $T/tok, block_size: 16, batch_size: 4, num_workers: 0, samples_per_epoch: 480}
optimizer:
  name: adamw
  lr: 0.01
YAML
  export CFG=$T/g.yaml
  G=(--trainer.devices 2 --trainer.gradient_clip_val 0.5 --trainer.accumulate_grad_batches 2)
  fit gddp "${G[@]}" --trainer.strategy ddp
  fit gfsdp "${G[@]}" --trainer.strategy fsdp --trainer.activation_checkpointing true
  check "gpt x2 under fsdp (blocks as units, tied wte in the root, activation checkpointing) == ddp, bitwise" same gfsdp gddp
fi

# refusals
expect_fail "an auto_wrap_policy naming no layer is refused" 1 "auto_wrap_policy 'Conv2d' names no layer of this model" \
  timeout 60 "$LK_BIN" fit -c "$T/z.yaml" --trainer.devices 2 --trainer.strategy fsdp --trainer.fsdp_auto_wrap_policy Conv2d
expect_fail "FSDPStrategy's mixed_precision is refused with the key to use" 2 "set trainer.precision instead" \
  timeout 60 "$LK_BIN" fit -c "$T/z.yaml" --trainer.devices 2 \
  --trainer.strategy '{class_path: FSDPStrategy, init_args: {mixed_precision: {param_dtype: bf16}}}'
finish
