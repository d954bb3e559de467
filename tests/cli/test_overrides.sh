#!/usr/bin/env bash
# Overrides as LightningCLI's parser (jsonargparse) reads them: a section with
# a class_path takes --section.key as short for --section.init_args.key (on
# da0f19d `--optimizer.lr 0.5` was set beside the class_path and silently not
# used), --trainer.callbacks.KEY names the last callback, --trainer.callbacks.N.KEY
# the N-th, and --trainer.callbacks+=NAME appends one.
source "$(dirname "$0")/lib.sh"
EX="$(dirname "$0")/../../examples/lightning_style.yaml"
pc() { (cd "$T" && "$LK_BIN" fit -c "$EX" "$@" --print_config); }
# the value under `section:` -> `init_args:` -> `key:` in --print_config's YAML
val() { awk -v s="$1:" -v k="    $2:" '$0 == s {in_s = 1; next} /^[^ ]/ {in_s = 0} in_s && index($0, k) == 1 {sub(/^ *[^:]*: */, ""); print; exit}'; }

pc --optimizer.lr 0.5 --lr_scheduler.gamma 0.9 >"$T/p.yaml" 2>&1
check "--optimizer.lr sets optimizer.init_args.lr" test "$(val optimizer lr <"$T/p.yaml")" = 0.5
check "--lr_scheduler.gamma sets lr_scheduler.init_args.gamma" test "$(val lr_scheduler gamma <"$T/p.yaml")" = 0.9
check "no stray optimizer.lr beside the class_path" bash -c "! grep -q '^  lr:' $T/p.yaml && ! grep -q '^  gamma:' $T/p.yaml"
expect_fail "--optimizer.lr -0.01 is checked like init_args.lr" 2 "optimizer.init_args.lr: expected a value in [0, 1e+06], got '-0.01'" \
  pc --optimizer.lr -0.01
pc --model.hidden '[64]' --data.batch_size 8 >"$T/m.yaml" 2>&1
check "--model.hidden sets model.init_args.hidden" test "$(val model hidden <"$T/m.yaml")" = "[64]"
check "--data.batch_size sets data.init_args.batch_size" test "$(val data batch_size <"$T/m.yaml")" = 8
expect_fail "--model.KEY with a wrong name says which" 2 "model mlp: unknown argument 'hiden'; did you mean 'hidden'?" pc --model.hiden 3
# a class_path typed after its argument still takes it
pc --optimizer.momentum 0.7 --optimizer.class_path torch.optim.SGD >"$T/b.yaml" 2>&1
check "--optimizer.momentum before --optimizer.class_path SGD is SGD's argument" test "$(val optimizer momentum <"$T/b.yaml")" = 0.7
# the override takes effect in training, not only in the printed config: lr 0.5, StepLR(2, 0.9)
(cd "$T" && "$LK_BIN" fit -c "$EX" --optimizer.lr 0.5 --lr_scheduler.gamma 0.9 --trainer.max_epochs 3 \
   --trainer.callbacks '[]' --trainer.logger '{class_path: CSVLogger, init_args: {save_dir: runs}}' \
   --trainer.enable_progress_bar false >"$T/fit.out" 2>&1)
m=$(ls "$T"/runs/*/version_0/metrics.csv 2>/dev/null | head -1)
lrs=$(python3 - "$m" <<'PY' 2>/dev/null
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
col = [c for c in rows[0] if c.startswith("lr")]
print(" ".join(sorted({r[col[0]] for r in rows if r[col[0]]}, key=float, reverse=True)) if col else "")
PY
)
check "trained with lr 0.5, then 0.45 after StepLR's 2 epochs (got: $lrs)" bash -c "grep -q . <<<'$lrs' && test '$(echo "$lrs" | cut -d' ' -f1)' = 0.5 && echo '$lrs' | grep -q '0.45'"

# callbacks: the last one, by index, appended
pc --trainer.callbacks.2.patience 9 >"$T/c.yaml" 2>&1
check "--trainer.callbacks.2.patience sets the third callback's init_args.patience" grep -q "patience: 9" "$T/c.yaml"
pc --trainer.callbacks+=EarlyStopping --trainer.callbacks.monitor val_acc --trainer.callbacks.patience 7 >"$T/a.yaml" 2>&1
check "--trainer.callbacks+=EarlyStopping appends, .monitor/.patience go to it" \
  bash -c "grep -q 'class_path: EarlyStopping' $T/a.yaml && grep -q 'patience: 7' $T/a.yaml && test \$(grep -c 'class_path:.*EarlyStopping' $T/a.yaml) = 2"
expect_fail "--trainer.callbacks.KEY goes to the last callback (ModelSummary here)" 2 "unknown key 'patience' for ModelSummary" \
  pc --trainer.callbacks.patience 7
expect_fail "an index past the list is named" 2 "'trainer.callbacks' has 6 elements, no index 9" pc --trainer.callbacks.9.patience 1
expect_fail "a Lightning callback with no equivalent says to remove it" 2 \
  "lockstep has no StochasticWeightAveraging yet, and nothing else does its job: remove the entry" \
  pc --trainer.callbacks+=StochasticWeightAveraging
finish
