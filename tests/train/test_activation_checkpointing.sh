#!/usr/bin/env bash
# trainer.activation_checkpointing: a run that recomputes its blocks in the
# backward ends with bitwise the weights and optimizer state of the run that
# keeps every activation — the mlp with dropout (the masks replayed from
# the counter-based streams), the cnn (batch norm's running statistics
# updated once, not again by the recompute) and the autoencoder; single,
# ddp on 2 ranks and dp on 2 replicas; 32-true, bf16-mixed, 16-mixed and
# bf16-true; gradient accumulation; the FSDP-style policy by class names.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
common=(--trainer.max_epochs 1 --trainer.enable_progress_bar false --trainer.num_sanity_val_steps 0
        --trainer.enable_tensorboard false --data.init_args.num_samples 256)
mlp=(-c "$T/synth.yaml" --model.init_args.hidden "[32, 24]" --model.init_args.dropout 0.25)
# the cnn and the autoencoder: the same data and trainer, their own model section
model_cfg() { # NAME CLASS INIT_ARGS-YAML-LINES [INPUT_SHAPE]
  sed '/^model:/,/^data:/{/^data:/!d}' "$T/synth.yaml" | sed "s/^data:/model:\n  class_path: $2\n  init_args:\n$3\ndata:/" \
    | sed "s/input_shape: \[16\]/input_shape: ${4:-[16]}/" >"$T/$1.yaml"
}
model_cfg cnn cnn "    image_size: 8\n    channels: [4, 6]\n    hidden: 16\n    num_classes: 4" "[1, 8, 8]"
model_cfg ae autoencoder "    input_dim: 16\n    hidden: [12]\n    latent_dim: 4"
cnn=(-c "$T/cnn.yaml")
ae=(-c "$T/ae.yaml")

n=0
# same NAME ARGS...: with and without activation checkpointing, the same bits
same() {
  local name=$1; shift
  n=$((n + 1))
  local rc=0
  "$LK_BIN" fit "${common[@]}" --trainer.default_root_dir "$T/p$n" "$@" >"$T/p$n.log" 2>&1 || rc=1
  "$LK_BIN" fit "${common[@]}" --trainer.default_root_dir "$T/c$n" "$@" --trainer.activation_checkpointing true \
    >"$T/c$n.log" 2>&1 || rc=1
  if [ $rc != 0 ]; then bad "$name: a run failed: $(tail -3 "$T/p$n.log" "$T/c$n.log")"; return; fi
  "$LK_BIN" export --ckpt "$T/p$n/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/p$n.st" --with-optimizer >/dev/null
  "$LK_BIN" export --ckpt "$T/c$n/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/c$n.st" --with-optimizer >/dev/null
  check "$name: checkpointed run bitwise equal ($(grep -o 'activation_checkpointing: [0-9]* layers*' "$T/c$n.log"))" \
    cmp -s "$T/p$n.st" "$T/c$n.st"
}
same "mlp dropout single" "${mlp[@]}"
same "mlp dropout ddp 2" "${mlp[@]}" --trainer.devices 2 --trainer.strategy ddp
same "mlp dropout dp 2" "${mlp[@]}" --trainer.devices 2 --trainer.strategy dp
same "mlp dropout bf16-mixed accumulate 2" "${mlp[@]}" --trainer.precision bf16-mixed --trainer.accumulate_grad_batches 2
same "mlp dropout 16-mixed ddp 2" "${mlp[@]}" --trainer.precision 16-mixed --trainer.devices 2 --trainer.strategy ddp
same "mlp dropout bf16-true" "${mlp[@]}" --trainer.precision bf16-true
same "cnn single" "${cnn[@]}"
same "cnn ddp 2" "${cnn[@]}" --trainer.devices 2 --trainer.strategy ddp
same "cnn bf16-mixed dp 2" "${cnn[@]}" --trainer.precision bf16-mixed --trainer.devices 2 --trainer.strategy dp
same "autoencoder single" "${ae[@]}"
same "autoencoder policy [Linear]" "${ae[@]}" --trainer.activation_checkpointing_policy Linear
same "mlp policy Sequential" "${mlp[@]}" --trainer.activation_checkpointing_policy Sequential

expect_fail "unknown class named with the model's classes" 1 \
  "trainer.activation_checkpointing_policy: no layer of class 'Conv2d' in the model (its layer classes: MLP, Sequential, Linear, ReLU, Dropout)" \
  "$LK_BIN" fit "${common[@]}" "${mlp[@]}" --trainer.default_root_dir "$T/bad" --trainer.activation_checkpointing_policy "Linear, Conv2d"
expect_fail "sync_batchnorm refused" 1 "trainer.activation_checkpointing with trainer.sync_batchnorm" \
  "$LK_BIN" fit "${common[@]}" "${cnn[@]}" --trainer.default_root_dir "$T/bad2" --trainer.activation_checkpointing true \
  --trainer.sync_batchnorm true --trainer.devices 2 --trainer.strategy ddp
finish
