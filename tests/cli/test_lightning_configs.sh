#!/usr/bin/env bash
# The README's promise as a test (issue 48): LightningCLI configs as
# Lightning 2.x writes them (tests/cli/lightning_configs: --print_config of
# 2.0 and 2.5 with every Trainer flag at its default, and config.yaml files
# in the styles of public projects) train with only the model's and the data
# module's class_path changed; docs/LIGHTNING.md's flag table covers every
# Trainer flag those files carry; the arguments lockstep cannot give a
# meaning are refused saying why.
source "$(dirname "$0")/lib.sh"
CFG="$(cd "$(dirname "$0")/lightning_configs" && pwd)"
DOC="$(cd "$(dirname "$0")/../.." && pwd)/docs/LIGHTNING.md"
cd "$T" || exit 1
export PL_GLOBAL_SEED=5 # seed_everything: true draws a seed; this one, so the accuracy check is the same each run
q="--trainer.enable_progress_bar false"
field() { /usr/bin/env python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# the user's data: 16 features, 4 classes from the signs of the first two (awk, no Python needed)
awk 'BEGIN { srand(3); printf "f0"; for (i = 1; i < 16; i++) printf ",f%d", i; print ",label";
  for (n = 0; n < 400; n++) { for (i = 0; i < 16; i++) { v[i] = rand() * 2 - 1; printf "%s%.5f", i ? "," : "", v[i] }
  print "," (v[0] > 0) + 2 * (v[1] > 0) } }' > train.csv

# only the class_path lines change: the user's classes become lockstep's mlp and csv
swap() { sed -e 's/^\(  class_path: \)my_project\.models\.[A-Za-z]*$/\1mlp/' \
             -e 's/^\(  class_path: \)my_project\.data\.[A-Za-z]*$/\1csv/' "$1"; }

for f in "$CFG"/*.yaml; do
  n=$(basename "$f" .yaml)
  mkdir -p "$n" && swap "$f" > "$n/config.yaml" && cp train.csv "$n/"
  changed=$(diff "$f" "$n/config.yaml" | grep -c '^>')
  check "$n: only the two class_path lines differ ($changed)" test "$changed" = 2
  (cd "$n" && "$LK_BIN" fit -c config.yaml --trainer.max_epochs 15 $q >fit.out 2>&1)
  r=$(find "$n" -name run.json | head -1)
  if [ -z "$r" ]; then bad "$n: fit wrote no run.json: $(tail -3 "$n/fit.out")"; continue; fi
  check "$n: fit trains ($(field "$r" 'd["status"]'))" test "$(field "$r" 'd["status"]')" = ok
  acc=$(field "$r" 'd["metrics"]["val_acc"]')
  check "$n: the model learned (val_acc $acc > 0.45; chance is 0.25)" awk -v a="$acc" 'BEGIN { exit !(a > 0.45) }'
  (cd "$n" && "$LK_BIN" fit -c config.yaml --print_config >p1.yaml 2>/dev/null && "$LK_BIN" fit -c p1.yaml --print_config >p2.yaml 2>/dev/null)
  check "$n: --print_config feeds back unchanged" bash -c "test -s $n/p1.yaml && cmp -s $n/p1.yaml $n/p2.yaml"
done

# what each file's own settings must have done
d=callbacks_loggers/logs/tabular/version_0
check "callbacks_loggers: TensorBoardLogger and CSVLogger share one version directory" \
  bash -c "test -s $d/metrics.csv && ls $d/events.out.tfevents.* >/dev/null"
check "callbacks_loggers: {epoch:02d} pads as Python does (epoch=07-...)" bash -c "test \$(ls $d/checkpoints/ | grep -c '^epoch=[0-9][0-9]-val_loss=') = 2"
check "callbacks_loggers: save_top_k 2 keeps two, save_last writes last.ckpt" \
  bash -c "test \$(ls $d/checkpoints/epoch=*.ckpt | wc -l) = 2 && test -s $d/checkpoints/last.ckpt"
check "callbacks_loggers: ReduceLROnPlateau and LearningRateMonitor log lr-AdamW" bash -c "head -1 $d/metrics.csv | grep -q lr-AdamW"
r=$(find ddp_sgd -name run.json | head -1)
check "ddp_sgd: devices 2 ran 2 ranks" test "$(field "$r" 'd["world_size"]')" = 2
check "ddp_sgd: DDPStrategy's timeout 0:30:00 is the comm_timeout" \
  test "$(field "$r" 'd["settings"]["comm_timeout"]["value"]')" = 1800
check "ddp_sgd: every_n_train_steps 4 saved at steps 4, 8, 12 ... (on an epoch's last batch too)" \
  bash -c "ls ddp_sgd/tb_logs/ddp_run/version_0/checkpoints/step-step=4.ckpt ddp_sgd/tb_logs/ddp_run/version_0/checkpoints/step-step=36.ckpt >/dev/null"
(cd print_config_2.5 && "$LK_BIN" fit -c config.yaml --trainer.max_epochs 1 --trainer.enable_autolog_hparams false \
  --trainer.default_root_dir off $q >off.out 2>&1)
check "enable_autolog_hparams false: hparams.yaml is {} (Lightning's CSVLogger writes it empty)" \
  bash -c "test \"\$(cat print_config_2.5/off/lightning_logs/version_0/hparams.yaml)\" = '{}'"

# OneCycleLR with every torch argument as LightningCLI writes it (None for total_steps): the
# lr of each epoch is torch's, and the momentum cycles (torch's default cycle_momentum true)
cat > oc.yaml <<'YAML'
trainer:
  callbacks:
  - class_path: lightning.pytorch.callbacks.LearningRateMonitor
    init_args: {logging_interval: epoch}
optimizer:
  class_path: torch.optim.Adam
  init_args: {lr: 0.001}
lr_scheduler:
  class_path: torch.optim.lr_scheduler.OneCycleLR
  init_args:
    max_lr: 0.1
    total_steps: null
    epochs: 6
    steps_per_epoch: 1
    pct_start: 0.3
    anneal_strategy: cos
    cycle_momentum: true
    base_momentum: 0.85
    max_momentum: 0.95
    div_factor: 25.0
    final_div_factor: 10000.0
    three_phase: false
    last_epoch: -1
    verbose: false
YAML
(cd print_config_2.0 && "$LK_BIN" fit -c config.yaml -c ../oc.yaml --trainer.max_epochs 6 --trainer.default_root_dir oc $q >oc.out 2>&1)
lrs=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "lr-Adam") c = i; next } c && $c != "" { printf "%.12g ", $c }' \
  print_config_2.0/oc/lightning_logs/version_0/metrics.csv)
# torch 1.13's OneCycleLR(max_lr=0.1, epochs=6, steps_per_epoch=1) on Adam, printed with %.12g
want="0.004 0.0994415435451 0.081174565395 0.0462637102667 0.0133477530189 4e-07 "
check "OneCycleLR's full torch arguments give torch's lr per epoch ($lrs)" test "$lrs" = "$want"

# the Trainer flag table lists every flag the print_config files carry
for f in "$CFG"/print_config_*.yaml; do
  for k in $(awk '/^trainer:/ { t = 1; next } /^[^ ]/ { t = 0 } t && /^  [a-z_]+:/ { sub(":.*", ""); print $1 }' "$f"); do
    grep -q "^| \`$k\` |" "$DOC" || bad "docs/LIGHTNING.md's table has no row for trainer.$k ($(basename "$f"))"
  done
done
rows=$(grep -c '^| `[a-z_]*` | ' "$DOC")
check "docs/LIGHTNING.md's table covers the print_config flags ($rows rows)" test "$rows" -ge 41

# what lockstep refuses says why
b=print_config_2.5/config.yaml
expect_fail "model_registry names what to do instead" 2 "trainer.model_registry is not supported (only null): lockstep uploads no model" \
  "$LK_BIN" fit -c $b --trainer.model_registry my-model
printf 'optimizer:\n  init_args:\n    maximize: true\n' > max.yaml
expect_fail "maximize: true says why" 2 "optimizer.init_args.maximize: true is not supported (only false)" \
  "$LK_BIN" fit -c $b -c max.yaml
printf 'lr_scheduler:\n  init_args:\n    last_epoch: 4\n' > le.yaml
expect_fail "last_epoch other than -1 points to ckpt_path" 2 "use ckpt_path" "$LK_BIN" fit -c $b -c le.yaml
printf 'trainer:\n  callbacks:\n  - class_path: ModelCheckpoint\n    init_args:\n      train_time_interval: "0:10:00"\n' > tti.yaml
expect_fail "ModelCheckpoint train_time_interval says what to use" 2 "train_time_interval is not supported (only null)" \
  "$LK_BIN" fit -c $b -c tti.yaml
printf 'trainer:\n  strategy:\n    class_path: DDPStrategy\n    init_args:\n      process_group_backend: gloo\n' > pgb.yaml
expect_fail "a DDPStrategy argument set away from None is refused" 2 "unknown argument 'process_group_backend' for DDPStrategy" \
  "$LK_BIN" fit -c $b -c pgb.yaml
finish
