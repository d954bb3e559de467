#!/usr/bin/env bash
# A Lightning-style config end to end: examples/lightning_style.yaml (callbacks
# and loggers as class_path lists, several ModelCheckpoints), logger: false,
# OnExceptionCheckpoint, Timer, fast_dev_run's one epoch, and the errors that
# name what lockstep accepts.
source "$(dirname "$0")/lib.sh"
declare -A steps lrn
write_synth
EX="$(dirname "$0")/../../examples/lightning_style.yaml"

# the example, with its relative save_dir under $T
(cd "$T" && "$LK_BIN" fit -c "$EX" --trainer.enable_progress_bar false >"$T/ex.out" 2>&1)
check "lightning_style.yaml runs" grep -q "best checkpoint:" "$T/ex.out"
d="$T/lightning_style_runs/synthetic_mlp/version_0"
check "CSVLogger and TensorBoardLogger share one version dir" bash -c "test -s $d/metrics.csv && ls $d/events.out.tfevents.* >/dev/null && ! test -e $T/lightning_style_runs/synthetic_mlp/version_1"
check "two ModelCheckpoints: top-2 by val_loss" test "$(ls "$d"/checkpoints/epoch=*-val_loss=*.ckpt | wc -l)" = 2
check "two ModelCheckpoints: top-1 by val_acc" test "$(ls "$d"/checkpoints/best-acc-*.ckpt | wc -l)" = 1
check "save_last: true writes last.ckpt" test -s "$d/checkpoints/last.ckpt"
check "DeviceStatsMonitor and LearningRateMonitor log" bash -c "head -1 $d/metrics.csv | grep -q device_stats/rss_mb && head -1 $d/metrics.csv | grep -q lr-AdamW"
check "run.json names the first ModelCheckpoint's monitor" grep -q '"monitor":[[:space:]]*"val_loss"' "$d/run.json"
check "config.yaml keeps the callbacks list" grep -q "class_path: lightning.pytorch.callbacks.EarlyStopping" "$d/config.yaml"
(cd "$T" && "$LK_BIN" fit -c "$d/config.yaml" --print_config >"$T/p1.yaml" && "$LK_BIN" fit -c "$T/p1.yaml" --print_config >"$T/p2.yaml")
check "config.yaml with callbacks feeds back unchanged" cmp -s "$T/p1.yaml" "$T/p2.yaml"
# A resume into a new version directory takes over no top-k (Lightning: the
# dirpath changed) and deletes none of version_0's files; each instance says so.
(cd "$T" && "$LK_BIN" fit -c "$d/config.yaml" --trainer.max_epochs 5 --ckpt_path "$d/checkpoints/last.ckpt" --trainer.enable_progress_bar false >"$T/resume1.out" 2>&1)
check "resume into version_1 keeps version_0's top-2 and top-1" bash -c "test \$(ls $d/checkpoints/epoch=*-val_loss=*.ckpt | wc -l) = 2 && test \$(ls $d/checkpoints/best-acc-*.ckpt | wc -l) = 1"
check "resume into version_1 says so for both instances" test "$(grep -c 'are not taken over (nor ever deleted)' "$T/resume1.out")" = 2
# Into the same version directory, each instance's top-k goes on: one more
# epoch still leaves exactly 2 val_loss files and 1 val_acc file there.
sed 's/^      name: synthetic_mlp$/      name: synthetic_mlp\n      version: 0/' "$d/config.yaml" >"$T/same.yaml"
(cd "$T" && "$LK_BIN" fit -c "$T/same.yaml" --trainer.max_epochs 6 --ckpt_path "$d/checkpoints/last.ckpt" --trainer.enable_progress_bar false >"$T/resume0.out" 2>&1)
n=$(ls "$d"/checkpoints/epoch=*-val_loss=*.ckpt 2>/dev/null | wc -l)
check "resume into the same directory restores each instance's top-k (2 val_loss files: $n)" bash -c "test $n = 2 && ls $d/checkpoints/epoch=5-*.ckpt && test \$(ls $d/checkpoints/best-acc-*.ckpt | wc -l) = 1 && ! grep -q 'not taken over' $T/resume0.out"
check "the resumed run saved a new best" bash -c "ls $T/lightning_style_runs/synthetic_mlp/version_1/checkpoints/epoch=4-val_loss=*.ckpt >/dev/null"

# logger: false -> no metrics.csv; config.yaml, run.json and checkpoints/ in default_root_dir
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.logger false --trainer.default_root_dir "$T/nolog" --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
check "logger: false writes no metrics" bash -c "! test -e $T/nolog/lightning_logs && ! test -e $T/nolog/metrics.csv"
check "logger: false puts checkpoints and config.yaml in default_root_dir" bash -c "test -s $T/nolog/checkpoints/last.ckpt && test -s $T/nolog/config.yaml"

# OnExceptionCheckpoint: a monitor that is never logged fails fit; the state is saved first
cat > "$T/exc.yaml" <<YAML
trainer:
  callbacks:
    - class_path: ModelCheckpoint
      init_args: {monitor: no_such_metric}
    - class_path: lightning.pytorch.callbacks.OnExceptionCheckpoint
      init_args: {dirpath: $T/crash}
YAML
expect_fail "a ModelCheckpoint monitor that is never logged fails" 1 "ModelCheckpoint: monitor 'no_such_metric' was never logged" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/exc.yaml" --trainer.enable_progress_bar false
check "OnExceptionCheckpoint wrote crash/on_exception.ckpt" test -s "$T/crash/on_exception.ckpt"

# Timer with a duration string stops training like max_time
printf 'trainer:\n  callbacks:\n    - class_path: Timer\n      init_args: {duration: "00:00:00:01"}\n' > "$T/timer.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/timer.yaml" --trainer.max_epochs 1000000 --trainer.enable_progress_bar false >/dev/null 2>&1
check "Timer duration stops training" bash -c "grep -q '\"status\":[[:space:]]*\"ok\"' $(latest)/run.json && ! grep -q '\"epochs\":[[:space:]]*1000000' $(latest)/run.json"

# Timer.interval: "step" looks at the time after every step, "epoch" only after a whole epoch (13 steps here)
for iv in step epoch; do
  printf "trainer:\n  callbacks:\n    - class_path: Timer\n      init_args: {duration: {milliseconds: 1}, interval: $iv}\n" > "$T/timer_$iv.yaml"
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/timer_$iv.yaml" --trainer.enable_progress_bar false >/dev/null 2>&1
  steps[$iv]=$(sed -n 's/.*"global_step":[[:space:]]*\([0-9]*\).*/\1/p' "$(latest)/run.json")
done
check "Timer interval step stops after the first step (${steps[step]})" test "${steps[step]}" = 1
check "Timer interval epoch finishes the epoch first (${steps[epoch]})" test "${steps[epoch]}" = 13

# LearningRateMonitor.logging_interval: rows of metrics.csv that carry lr-Adam
lr_rows() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "lr-Adam") c = i; next } c && $c != "" { n++ } END { print n + 0 }' "$1"; }
for iv in step epoch; do
  printf "trainer:\n  callbacks:\n    - class_path: LearningRateMonitor\n      init_args: {logging_interval: $iv}\n" > "$T/lrm_$iv.yaml"
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/lrm_$iv.yaml" --trainer.enable_progress_bar false >/dev/null 2>&1
  lrn[$iv]=$(lr_rows "$(latest)/metrics.csv")
done
check "LearningRateMonitor step logs lr-Adam every 2nd of 26 steps (${lrn[step]} rows)" test "${lrn[step]}" = 13
check "LearningRateMonitor epoch logs lr-Adam once per epoch (${lrn[epoch]} rows)" test "${lrn[epoch]}" = 2
printf 'trainer:\n  callbacks:\n    - class_path: LearningRateMonitor\nlr_scheduler:\n  class_path: StepLR\n  init_args: {step_size: 1}\n' > "$T/lrm_null.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/lrm_null.yaml" --trainer.enable_progress_bar false >/dev/null 2>&1
n=$(lr_rows "$(latest)/metrics.csv")
check "LearningRateMonitor null follows an epoch scheduler ($n rows)" test "$n" = 2

# ModelSummary(max_depth) drives the summary printed at fit start
printf 'trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelSummary\n      init_args: {max_depth: 2}\n' > "$T/summary.yaml"
out=$("$LK_BIN" fit -c "$T/synth.yaml" -c "$T/summary.yaml" --trainer.max_steps 1 --trainer.enable_progress_bar false 2>&1)
check "ModelSummary max_depth 2 shows the layers inside" grep -q "layers.0 | Linear" <<<"$out"
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_steps 1 --trainer.enable_progress_bar false 2>&1)
check "without it the summary stops at depth 1" bash -c "grep -q '| layers ' <<<\"\$0\" && ! grep -q 'layers.0' <<<\"\$0\"" "$out"
expect_fail "ModelSummary with enable_model_summary false is refused" 2 "ModelSummary is listed but trainer.enable_model_summary is false" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/summary.yaml" --trainer.enable_model_summary false

# ModelCheckpoint save_weights_only: the top-k file holds the weights (no optimizer.*), last.ckpt stays complete
printf 'trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n      init_args: {monitor: val_loss, save_weights_only: true, save_last: true, save_on_train_epoch_end: true}\n' > "$T/wo.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/wo.yaml" --trainer.enable_progress_bar false >/dev/null 2>&1
wo=$(ls "$(latest)"/checkpoints/epoch=*.ckpt | head -1)
check "save_weights_only: the top-k file has weights and no optimizer state" bash -c "head -c 8192 '$wo' | grep -aq 'layers.0.weight' && ! head -c 8192 '$wo' | grep -aq 'optimizer\.'"
check "save_weights_only: last.ckpt keeps the optimizer state" bash -c "head -c 8192 '$(latest)/checkpoints/last.ckpt' | grep -aq 'optimizer\.'"
check "a weights-only checkpoint tests" "$LK_BIN" test -c "$T/synth.yaml" --ckpt_path "$wo" --trainer.enable_progress_bar false
expect_fail "fit cannot resume from a weights-only checkpoint" 1 "was saved with ModelCheckpoint save_weights_only: true and holds no optimizer state" \
  "$LK_BIN" fit -c "$T/synth.yaml" --ckpt_path "$wo" --trainer.enable_progress_bar false

# fast_dev_run: N batches of ONE epoch (Lightning), also written as true
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.fast_dev_run 2 --trainer.max_epochs 5 2>&1)
check "fast_dev_run 2 runs one epoch" bash -c "grep -q 'epoch 1/' <<<\"\$0\" && ! grep -q 'epoch 2/' <<<\"\$0\"" "$out"
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.fast_dev_run true --trainer.max_epochs 5 2>&1)
check "fast_dev_run true runs one batch" bash -c "grep -q 'done 1 steps' <<<\"\$0\"" "$out"

# value forms on the command line
check "devices [0, 1] and a strategy alias" bash -c "'$LK_BIN' fit -c '$T/synth.yaml' --trainer.devices '[0, 1]' --trainer.strategy ddp_find_unused_parameters_true --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1 && grep -q '\"world_size\":[[:space:]]*2' \$(ls -d $T/runs/lightning_logs/version_* | sort -t_ -k3 -n | tail -1)/run.json"

# errors name what lockstep accepts
printf 'trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.RichProgressBar\n' > "$T/bad.yaml"
expect_fail "a Lightning callback lockstep lacks names the equivalent" 2 "lockstep has no RichProgressBar; use trainer.enable_progress_bar" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/bad.yaml"
printf 'trainer:\n  callbacks:\n    - class_path: EarlyStopping\n      init_args: {monitor: val_loss, patiense: 2}\n' > "$T/bad2.yaml"
expect_fail "an unknown init_args key names file:line and the accepted keys" 2 "bad2.yaml:4:" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/bad2.yaml"
expect_fail "an unknown init_args key suggests the right one" 2 "unknown key 'patiense' for EarlyStopping (did you mean 'patience'?) (accepted: monitor, min_delta, patience" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/bad2.yaml"
# seeds: one wins visibly, and config.yaml records the seed that ran
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.seed 5 --print_config 2>&1)
check "--trainer.seed on the command line beats seed_everything from a file, with a warning" \
  bash -c "grep -q '^seed_everything: 5' <<<\"\$0\" && grep -q '^  seed: 5' <<<\"\$0\" && grep -q 'seed 5 from --trainer.seed (command line) wins over seed_everything: 7' <<<\"\$0\"" "$out"
printf 'trainer:\n  seed: 5\n' > "$T/seed5.yaml"
expect_fail "seed_everything and trainer.seed from files that disagree are an error" 2 "seed_everything: 7 (" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/seed5.yaml" --print_config
out=$("$LK_BIN" fit -c "$T/synth.yaml" --seed_everything true --print_config 2>&1)
s=$(sed -n 's/^seed_everything: \([0-9]*\)$/\1/p' <<<"$out")
check "seed_everything: true draws a seed and records it ($s)" bash -c "[ -n '$s' ] && grep -q '^  seed: $s\$' <<<\"\$0\"" "$out"
sed '/^seed_everything/d' "$T/synth.yaml" > "$T/noseed.yaml"
check "PL_GLOBAL_SEED is the seed when the config sets none" bash -c "PL_GLOBAL_SEED=11 '$LK_BIN' fit -c '$T/noseed.yaml' --print_config 2>/dev/null | grep -q '^seed_everything: 11\$'"

# overrides beat files wherever they stand; templates need no extra quoting
check "an override before -c still wins" bash -c "'$LK_BIN' fit --trainer.max_epochs 3 -c '$T/synth.yaml' --print_config | grep -q '^  max_epochs: 3\$'"
check "a filename template on the command line is a string" bash -c "'$LK_BIN' fit -c '$T/synth.yaml' --trainer.checkpoint_filename {epoch}-{val_loss:.4f} --print_config | grep -q 'checkpoint_filename: \"{epoch}-{val_loss:.4f}\"'"

# --print_config=skip_null drops nulls and feeds back
printf 'ckpt_path: null\n' > "$T/null.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/null.yaml" --print_config=skip_null > "$T/sk.yaml" 2>&1
check "--print_config=skip_null drops null keys" bash -c "! grep -q 'ckpt_path' '$T/sk.yaml' && grep -q 'max_epochs' '$T/sk.yaml'"
expect_fail "--print_config=comments is refused" 2 "lockstep understands --print_config and --print_config=skip_null" \
  "$LK_BIN" fit -c "$T/synth.yaml" --print_config=comments

# optimizer / lr_scheduler with PyTorch's argument names
printf 'optimizer:\n  class_path: torch.optim.Adam\n  init_args: {lr: 0.01, betas: [0.8, 0.99]}\nlr_scheduler:\n  class_path: torch.optim.lr_scheduler.CosineAnnealingLR\n  init_args: {T_max: 4, eta_min: 0.0001}\n' > "$T/torch.yaml"
check "Adam betas and CosineAnnealingLR T_max are accepted" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/torch.yaml" --trainer.max_epochs 1 --trainer.enable_progress_bar false
printf 'optimizer:\n  class_path: torch.optim.Adam\n  init_args: {betas: [0.8]}\n' > "$T/badbetas.yaml"
expect_fail "betas must be two numbers" 2 "optimizer.init_args.betas: expected two numbers" \
  "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/badbetas.yaml"
printf 'optimizer:\n  class_path: torch.optim.RMSprop\n  init_args: {lr: 0.001, alpha: 0.9, momentum: 0.5, centered: true}\n' > "$T/rmsprop.yaml"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/rmsprop.yaml" --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
check "torch.optim.RMSprop trains and logs lr-RMSprop" bash -c "grep -q '\"status\":[[:space:]]*\"ok\"' $(latest)/run.json && head -1 $(latest)/metrics.csv | grep -q lr-RMSprop"

# ddp_spawn says what it does
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.strategy ddp_spawn --trainer.max_steps 1 --trainer.enable_progress_bar false 2>&1)
check "ddp_spawn says the ranks are forked and train as ddp" grep -q "strategy ddp_spawn: the 2 ranks are forked from this process" <<<"$out"
finish
