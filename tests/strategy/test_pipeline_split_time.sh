#!/usr/bin/env bash
# trainer.pipeline.split time: rank 0 times one forward and backward of each
# block on a micro-batch of the first batch, every rank takes the same
# contiguous split with the smallest slowest stage. The profile leaves no
# trace: the run is bitwise the run with that split named (mlp, 2 stages;
# 2 stages x 2 replicas, where the split is broadcast to every rank); the
# autoencoder is cut inside its encoder and decoder (finer cut points than
# its two blocks). Which split the times give is not checked (timings vary).
source "$(dirname "$0")/pipe_lib.sh"
write_mlp 0 10
run() { # NAME CONFIG ARGS...
  local name=$1 cfg=$2; shift 2
  if ! "$LK_BIN" fit -c "$cfg" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
  "$LK_BIN" export --ckpt "$T/$name/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$name.st" >/dev/null
}
# the first block of stage 2.. as the split line names them: "[layers.3 .. layers.4: "
firsts() { grep -o '\[[^] :]*' "$1" | tail -n +2 | tr -d '[' | paste -sd, -; }
for layout in "2" "4 --trainer.pipeline.stages 2"; do
  # shellcheck disable=SC2086
  set -- --trainer.devices $layout --trainer.strategy pipeline --trainer.pipeline.chunks 4
  tag=${layout%% *}
  run "time$tag" "$T/mlp.yaml" "$@" --trainer.pipeline.split time || continue
  check "$tag devices: the split line says by measured time, with each stage's ms" \
    grep -q "pipeline: 2 stages (split by measured time.*ms\] \[.* ms\]" "$T/time$tag.log"
  grep 'split by measured time' "$T/time$tag.log" | head -1 | sed 's/^[^:]*: [^:]*://' >"$T/line$tag"
  split=$(firsts "$T/line$tag")
  run "named$tag" "$T/mlp.yaml" "$@" --trainer.pipeline.split "$split" &&
    check "$tag devices: split by time ($split) is bitwise that split named" cmp -s "$T/time$tag.st" "$T/named$tag.st"
done
cat >"$T/ae.yaml" <<YAML
seed_everything: 3
trainer: {max_steps: 2, enable_progress_bar: false, enable_tensorboard: false, num_sanity_val_steps: 0, limit_val_batches: 0}
model: {class_path: autoencoder, init_args: {input_dim: 64, hidden: [48, 32], latent_dim: 16}}
data:
  class_path: synthetic
  init_args: {task: regression, num_samples: 64, input_shape: [1, 8, 8], batch_size: 16, num_workers: 0}
YAML
run ae_time "$T/ae.yaml" --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.split time &&
  check "autoencoder split by time: cut among its layers (encoder.N / decoder.N)" \
    grep -Eq "split by measured time.*\[encoder\.0 \.\. (en|de)coder\.[0-9]+: .* \[(en|de)coder\.[0-9]+" "$T/ae_time.log"
check "split parameters names the default" bash -c "'$LK_BIN' fit -c '$T/mlp.yaml' --trainer.default_root_dir '$T/par' \
  --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.split parameters 2>&1 | grep -q 'balanced by parameter count'"
finish
