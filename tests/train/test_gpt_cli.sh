#!/usr/bin/env bash
# The gpt through `lockstep fit` on the synthetic data module's tokens
# (nothing to download): ddp on 2 ranks with activation checkpointing ends
# with bitwise the weights and optimizer state of the run without it
# (dropout on, nanoGPT's AdamW groups, warm-up + cosine per step, clipping),
# one-group AdamW decay keeps ddp's shared parameters; a run resumed from a
# mid-run checkpoint ends with bitwise the weights of the run straight
# through; a wrong block_size against the data is refused before training.
source "$(dirname "$0")/../cli/lib.sh"
cat >"$T/gpt.yaml" <<YAML
seed_everything: 5
trainer:
  max_steps: 12
  max_epochs: 10
  log_every_n_steps: 4
  enable_progress_bar: false
  enable_tensorboard: false
  num_sanity_val_steps: 0
  limit_val_batches: 2
  gradient_clip_val: 1.0
model:
  class_path: GPT
  init_args: {n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 32, dropout: 0.1}
data:
  class_path: synthetic
  init_args: {task: tokens, num_samples: 400, input_shape: [16], num_classes: 32, batch_size: 4}
optimizer:
  name: adamw
  lr: 0.003
  weight_decay: 0.1
  weight_decay_params: matrices
  warmup_steps: 3
  scheduler: cosine
  interval: step
  step_size: 9
YAML
n=0
same() { # NAME ARGS...: with and without activation checkpointing, the same bits
  local name=$1; shift
  n=$((n + 1))
  local rc=0
  "$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/p$n" "$@" >"$T/p$n.log" 2>&1 || rc=1
  "$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/c$n" "$@" --trainer.activation_checkpointing true \
    >"$T/c$n.log" 2>&1 || rc=1
  if [ $rc != 0 ]; then bad "$name: a run failed: $(tail -3 "$T/p$n.log" "$T/c$n.log")"; return; fi
  "$LK_BIN" export --ckpt "$T/p$n/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/p$n.st" --with-optimizer >/dev/null
  "$LK_BIN" export --ckpt "$T/c$n/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/c$n.st" --with-optimizer >/dev/null
  check "$name: checkpointed run bitwise equal ($(grep -o 'activation_checkpointing: [0-9]* layers*' "$T/c$n.log"))" \
    cmp -s "$T/p$n.st" "$T/c$n.st"
}
same "gpt ddp 2" --trainer.devices 2 --trainer.strategy ddp
check "gpt ddp 2: one AdamW group with exemptions" grep -q "weight decay on 10 of 28 parameters" "$T/p1.log"
check "gpt ddp 2: the ranks still share one copy of the parameters" grep -q "share one copy of the parameters" "$T/p1.log"
check "gpt ddp 2: the blocks are the checkpointed units" grep -q "activation_checkpointing: 2 layers" "$T/c1.log"
same "gpt bf16-mixed accumulate 2" --trainer.precision bf16-mixed --trainer.accumulate_grad_batches 2

# exact resume: 12 steps straight, or 6 then 6 from the step-6 checkpoint (T_max fixed by step_size:
# otherwise the cosine would span each run's own max_steps)
"$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/full" --trainer.enable_progress_bar true >"$T/full.log" 2>&1
# 4 samples x 16 tokens a step: the progress lines show tokens/s beside it/s
check "gpt: the progress bar shows tokens/s" grep -qE "it/s, [0-9.]+k? tok/s" "$T/full.log"
"$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/half" --trainer.max_steps 6 >"$T/half.log" 2>&1
"$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/half" \
  --ckpt_path "$T/half/lightning_logs/version_0/checkpoints/last.ckpt" >"$T/resume.log" 2>&1
last=$(ls -d "$T"/half/lightning_logs/version_* | sort -t_ -k3 -n | tail -1)
"$LK_BIN" export --ckpt "$T/full/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/full.st" --with-optimizer >/dev/null
"$LK_BIN" export --ckpt "$last/checkpoints/last.ckpt" --out "$T/resumed.st" --with-optimizer >/dev/null
check "gpt resumed at step 6: bitwise the straight run" cmp -s "$T/full.st" "$T/resumed.st"

expect_fail "gpt: data longer than block_size refused before training" 1 \
  "model gpt takes token sequences [T] with T <= 8" \
  "$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/bad" --model.init_args.block_size 8
expect_fail "warm-up before ReduceLROnPlateau refused" 1 \
  "optimizer.warmup_steps 3 with scheduler plateau: ReduceLROnPlateau cannot follow a warm-up" \
  "$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/bad2" --optimizer.scheduler plateau
finish
