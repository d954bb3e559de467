# Shared by the pipeline tests (test_pipeline_{fit,dp,eval,resume,split_time}.sh):
# the cli test library, 4 ranks allowed on a 2-core machine, the mlp they
# train (16 -> 32 -> 24 -> 4: three Linear blocks, 640 samples in batches
# of 32, AdamW) written by write_mlp, and run, a fit into $T/NAME (a script
# that also exports the checkpoint defines its own run after this).
source "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
export LK_ALLOW_OVERSUBSCRIBE=1 # 4 ranks (3 stages) on a 2-core machine: slow, not wrong
# write_mlp [LIMIT_VAL_BATCHES [MAX_STEPS]]: $T/mlp.yaml (defaults 2 and 20)
write_mlp() {
  cat >"$T/mlp.yaml" <<YAML
seed_everything: 3
trainer:
  max_steps: ${2:-20}
  max_epochs: 10
  log_every_n_steps: 5
  enable_progress_bar: false
  enable_tensorboard: false
  num_sanity_val_steps: 0
  limit_val_batches: ${1:-2}
model:
  class_path: mlp
  init_args: {input_dim: 16, hidden: [32, 24], num_classes: 4}
data:
  class_path: synthetic
  init_args: {num_samples: 640, input_shape: [16], num_classes: 4, batch_size: 32, num_workers: 0}
optimizer:
  name: adamw
  lr: 0.01
YAML
}
# run NAME ARGS...: a fit of $T/mlp.yaml into $T/NAME, its log in $T/NAME.log; a failure is a failed check
run() {
  local name=$1; shift
  if ! "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
}
