# Shared by the sharded strategies' tests (test_zero.sh, test_fsdp.sh,
# test_ckpt_shards.sh): the cli test library, the 697-parameter mlp config
# (16 -> 33 -> 4: a prime times a prime, so no world size here divides it and
# the last chunks are padded) in $T/z.yaml, and the fit helpers.
source "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
export LK_ALLOW_OVERSUBSCRIBE=1 # 4 ranks on a 2-core CI machine: slow, not wrong
cat > "$T/z.yaml" <<YAML
seed_everything: 7
trainer:
  default_root_dir: $T/runs
  max_steps: 20
  enable_progress_bar: false
  num_sanity_val_steps: 0
  enable_model_summary: false
model:
  class_path: mlp
  init_args:
    input_dim: 16
    hidden: [33]
    num_classes: 4
data:
  class_path: synthetic
  init_args:
    num_samples: 2048
    input_shape: [16]
    num_classes: 4
    batch_size: 24
optimizer:
  name: adam
  lr: 0.01
YAML
run_dir() { ls -d "$T"/runs/lightning_logs/version_*; }
run_json() { echo "$(run_dir)/run.json"; }
last() { echo "$(run_dir)/checkpoints/last.ckpt"; }
# fit NAME ARGS...: a fit of $CFG (default $T/z.yaml) whose last checkpoint (file or set) goes to
# $T/NAME.ckpt, exported with the optimizer state to $T/NAME.st; its log in $T/NAME.log
fit() {
  local name=$1; shift
  rm -rf "$T/runs" "$T/$name.ckpt"
  if timeout 120 "$LK_BIN" fit -c "${CFG:-$T/z.yaml}" "$@" >"$T/$name.log" 2>&1; then
    mv "$(last)" "$T/$name.ckpt"
    "$LK_BIN" export --ckpt "$T/$name.ckpt" --out "$T/$name.st" --with-optimizer >/dev/null
  else
    echo "  $name failed:"; tail -5 "$T/$name.log"; rm -f "$T/$name.st"
  fi
}
# same A B: the two fits' exports are the same bytes
same() { [ -s "$T/$1.st" ] && cmp -s "$T/$1.st" "$T/$2.st"; }
