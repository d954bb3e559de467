#!/usr/bin/env bash
# A Lightning config as Lightning writes it (issue 48): every flag whose
# default is None given as null, Lightning's flags lockstep has no key for
# (accepted at the values that mean what lockstep does, refused with a
# reason otherwise), all of a config's problems in one run, and
# val_check_interval / check_val_every_n_epoch counted as Lightning 2.x does.
source "$(dirname "$0")/lib.sh"
write_synth
q="--trainer.num_sanity_val_steps 0 --trainer.enable_progress_bar false"
# rows of metrics.csv that carry val_loss: one per validation
nval() { awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="val_loss") c=i} NR>1 && $c!="" {n++} END{print n+0}' "$(latest)/metrics.csv"; }

# --- null for every Trainer flag whose Lightning default is None, and the flags lockstep has no key for
cat > "$T/lightning.yaml" <<YAML
trainer:
  accelerator: auto
  strategy: auto
  devices: auto
  num_nodes: 1
  precision: 32-true
  logger: null
  callbacks: null
  fast_dev_run: false
  max_epochs: null
  min_epochs: null
  max_steps: 3
  min_steps: null
  max_time: null
  limit_train_batches: null
  limit_val_batches: null
  limit_test_batches: null
  limit_predict_batches: null
  overfit_batches: 0.0
  val_check_interval: null
  check_val_every_n_epoch: 1
  num_sanity_val_steps: null
  log_every_n_steps: null
  enable_checkpointing: null
  enable_progress_bar: null
  enable_model_summary: null
  accumulate_grad_batches: 1
  gradient_clip_val: null
  gradient_clip_algorithm: null
  deterministic: null
  benchmark: null
  inference_mode: true
  use_distributed_sampler: true
  profiler: null
  detect_anomaly: false
  barebones: false
  plugins: null
  sync_batchnorm: false
  reload_dataloaders_every_n_epochs: 0
  default_root_dir: $T/runs
YAML
out=$("$LK_BIN" fit -c "$T/synth.yaml" -c "$T/lightning.yaml" 2>&1)
check "a config with Lightning's defaults (null, benchmark, plugins, ...) trains" grep -q '"status":[[:space:]]*"ok"' "$(latest)/run.json"
check "max_epochs null with max_steps set: max_steps stops it" grep -q '"global_step":[[:space:]]*3,' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/lightning.yaml" --print_config >"$T/p1.yaml" 2>/dev/null
"$LK_BIN" fit -c "$T/p1.yaml" --print_config >"$T/p2.yaml" 2>/dev/null
check "--print_config of it feeds back unchanged" bash -c "test -s $T/p1.yaml && cmp -s $T/p1.yaml $T/p2.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs null --print_config >"$T/p3.yaml" 2>&1
check "max_epochs: null is accepted alone" grep -q "max_epochs: null" "$T/p3.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.benchmark true --trainer.detect_anomaly true --trainer.inference_mode false --trainer.reload_dataloaders_every_n_epochs 2 --trainer.max_epochs 1 $q >/dev/null 2>&1
check "benchmark, detect_anomaly, inference_mode, reload_dataloaders_every_n_epochs at other values are accepted" grep -q '"status":[[:space:]]*"ok"' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.overfit_batches 0.25 --trainer.max_epochs 1 $q >/dev/null 2>&1
check "overfit_batches as a fraction (0.25 of 13 batches -> 3 steps)" grep -q '"global_step":[[:space:]]*3,' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.deterministic warn --trainer.max_time 100 --trainer.max_epochs 1 $q >"$T/det.out" 2>&1
check "deterministic: warn warns where true refuses" bash -c "grep -q '\"status\":[[:space:]]*\"ok\"' $(latest)/run.json && grep -q 'trainer.deterministic is \"warn\"' $T/det.out"
# min_steps: early stopping may not stop before it (13 steps an epoch; patience 1 would stop after epoch 2)
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 50 --trainer.early_stopping_monitor val_loss --trainer.early_stopping_patience 1 --trainer.early_stopping_min_delta 10 --trainer.min_steps 60 $q >/dev/null 2>&1
check "min_steps 60 holds early stopping off until epoch 5" grep -q '"epochs":[[:space:]]*5,' "$(latest)/run.json"

# --- the refused ones say why, and every problem of the config comes in one run
cat > "$T/bad.yaml" <<YAML
trainer:
  min_epochs: nope
  barebones: true
  plugins: [SLURMEnvironment]
  use_distributed_sampler: false
  devices: 0
  min_stepz: 3
YAML
out=$("$LK_BIN" fit -c "$T/synth.yaml" -c "$T/bad.yaml" 2>&1); rc=$?
check "a config's problems are reported together (exit 2)" bash -c "test $rc = 2 && grep -q '6 problems in the trainer section' <<<\"\$0\"" "$out"
check "barebones: true says what to set instead" grep -q "trainer.barebones: true is not supported: .*logger: false" <<<"$out"
check "plugins says why" grep -q "trainer.plugins is not supported (only null): lockstep has no plugin classes" <<<"$out"
check "use_distributed_sampler: false says why" grep -q "trainer.use_distributed_sampler: false is not supported" <<<"$out"
check "devices: 0 is an error, as in Lightning" grep -q "trainer.devices: 0 selects no device" <<<"$out"
check "min_steps is a key: the typo suggests it, not max_steps" grep -q "unknown key 'trainer.min_stepz' (did you mean 'min_steps'?)" <<<"$out"
expect_fail "--trainer.devices 0 on the command line is an error" 2 "trainer.devices: 0 selects no device" \
  "$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 0

# --- val_check_interval as Lightning 2.x counts it: after batch_idx when (batch_idx + 1) % N == 0,
# N = floor(f x 13) for a fraction, so the epoch's last batch validates only when it is a multiple
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.val_check_interval 0.5 $q >/dev/null 2>&1
n=$(nval); check "val_check_interval 0.5 with 13 batches validates twice (after 6 and 12; $n)" test "$n" = 2
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.val_check_interval 0.25 $q >/dev/null 2>&1
n=$(nval); check "val_check_interval 0.25 with 13 batches validates 4 times (3, 6, 9, 12; $n)" test "$n" = 4
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 2 --trainer.val_check_interval 1.0 $q >/dev/null 2>&1
n=$(nval); check "val_check_interval 1.0 validates once an epoch ($n)" test "$n" = 2
expect_fail "an integer val_check_interval above the epoch's batches is an error naming both" 1 \
  "trainer.val_check_interval (20) must be less than or equal to the number of training batches per epoch (13)" \
  "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.val_check_interval 20 $q
# with validation off no interval matters: the same run trains (the error's own advice works)
check "val_check_interval 20 with limit_val_batches 0 trains" \
  "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.val_check_interval 20 --trainer.limit_val_batches 0 $q
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 2 --trainer.val_check_interval 5 --trainer.check_val_every_n_epoch null $q >/dev/null 2>&1
n=$(nval); check "check_val_every_n_epoch null: every 5 batches across 2 epochs of 13 (5, 10, 15, 20, 25; $n)" test "$n" = 5
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 3 --trainer.val_check_interval 20 --trainer.check_val_every_n_epoch null $q >/dev/null 2>&1
n=$(nval); check "check_val_every_n_epoch null: 20 batches, longer than an epoch, over 39 batches ($n)" test "$n" = 1
expect_fail "check_val_every_n_epoch null with a fraction is an error" 2 "trainer.check_val_every_n_epoch is null" \
  "$LK_BIN" fit -c "$T/synth.yaml" --trainer.val_check_interval 0.5 --trainer.check_val_every_n_epoch null

# --- num_nodes > 1 started by `lockstep fit` says what a multi-node job needs (not "run it through lockstep fit")
for d in 1 2; do
  expect_fail "num_nodes 2 x devices $d names mpirun/srun" 1 "a job on several nodes needs a launcher on every node" \
    "$LK_BIN" fit -c "$T/synth.yaml" --trainer.num_nodes 2 --trainer.devices $d
done
check "num_nodes' message does not send the user back to lockstep fit" bash -c "! \"$LK_BIN\" fit -c $T/synth.yaml --trainer.num_nodes 2 2>&1 | grep -q 'run it through'"

# --- ckpt_path best in a new process: the best file the newest fit recorded in run.json
rm -rf "$T/runs"
expect_fail "ckpt_path best with no fit recorded says so" 1 "ckpt_path: 'best' found no best checkpoint" \
  "$LK_BIN" test -c "$T/synth.yaml" --ckpt_path best
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.monitor val_loss $q >/dev/null 2>&1
best=$(sed -n 's/.*"path":[[:space:]]*"\([^"]*\)".*/\1/p' "$(latest)/run.json" | head -1)
check "predict --ckpt_path best runs" bash -c "\"$LK_BIN\" predict -c $T/synth.yaml --ckpt_path best --trainer.enable_progress_bar false 2>&1 | grep -q 'predictions: '"
for cmd in validate test; do
  out=$("$LK_BIN" $cmd -c "$T/synth.yaml" --ckpt_path best --trainer.enable_progress_bar false 2>&1)
  check "$cmd --ckpt_path best loads the recorded best ($best)" bash -c "test -n '$best' && grep -qF 'checkpoint:      $best' <<<\"\$0\"" "$out"
done

# --- hparams.yaml flat as Lightning's save_hyperparameters writes it, and TensorBoard's HParams tab
rm -rf "$T/runs"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 $q >/dev/null 2>&1
d=$(latest)
check "hparams.yaml is flat: the model's init args at the top level" bash -c "grep -qx 'input_dim: 16' $d/hparams.yaml && grep -qx 'hidden: \[32\]' $d/hparams.yaml && ! grep -q '^model:' $d/hparams.yaml"
check "hparams.yaml names the class as LightningCLI does (_class_path) and merges the data module's args" bash -c "grep -qx '_class_path: mlp' $d/hparams.yaml && grep -qx 'batch_size: 32' $d/hparams.yaml"
if [ -x /usr/bin/python3 ]; then
  tb=$(/usr/bin/python3 "$(dirname "$0")/../../tools/tb_read.py" "$d"/events.out.tfevents.*)
  check "TensorBoard: hp_metric -1 at step 0 (Lightning's default_hp_metric)" grep -qP '^0\thp_metric\t-1$' <<<"$tb"
  check "TensorBoard: the hparams plugin's experiment lists the hparams and hp_metric" grep -qP '^0\t_hparams_/experiment\texperiment:.*input_dim:3,.*;metrics:hp_metric$' <<<"$tb"
  check "TensorBoard: the session start carries the values" grep -qP '^0\t_hparams_/session_start_info\tsession_start:_class_path=mlp,input_dim=16,hidden=\[32\],' <<<"$tb"
  check "TensorBoard: the session end says success" grep -qP '^0\t_hparams_/session_end_info\tsession_end:status=1$' <<<"$tb"
fi

finish
