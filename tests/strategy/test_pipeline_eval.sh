#!/usr/bin/env bash
# Validation inside fit under model_parallel and pipeline runs as a
# forward-only schedule over the stages (micro-batches flow stage 0 -> last,
# the last stage's outputs go to every stage, each rank's module step
# computes the loss and accuracy on them), not the whole model on every rank
# after a broadcast of every stage's blocks. The mlp, 20 steps, validated
# after 16: model_parallel's val_loss is single's bitwise (one micro-batch:
# the same arithmetic); pipeline on 2 and 3 stages (4 micro-batches) and on
# 2 stages x 2 replicas within 1e-7 of single (its weights differ from
# single's by the micro-batches' sums, 9e-8) and equal to each other
# (their weights are bitwise the same). Validation every 5 steps (stale
# blocks on every rank in between) does not change the weights.
source "$(dirname "$0")/pipe_lib.sh"
write_mlp 2
# the val_loss logged at step 16 (metrics.csv: the column named val_loss)
val() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "val_loss") c = i; next } $3 == 16 && $c != "" { print $c }' \
  "$T/$1/lightning_logs/version_0/metrics.csv"; }
close() { python3 -c "import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t else 1)" "$1" "$2" "$3"; }
run single
run mp2 --trainer.devices 2 --trainer.strategy model_parallel &&
  check "model_parallel: val_loss bitwise single's ($(val mp2) / $(val single))" test "$(val mp2)" = "$(val single)"
check "model_parallel: evaluation ran forward-only through the stages" \
  grep -q "model_parallel: evaluation runs forward-only through the 2 stages (1 micro-batch per batch)" "$T/mp2.log"
run pp2 --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 &&
  check "pipeline 2 stages: val_loss within 1e-7 of single's ($(val pp2) / $(val single))" close "$(val pp2)" "$(val single)" 1e-7
check "pipeline: evaluation ran forward-only through the stages" \
  grep -q "pipeline: evaluation runs forward-only through the 2 stages (4 micro-batches per batch)" "$T/pp2.log"
run pp3 --trainer.devices 3 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.pipeline.schedule gpipe &&
  check "pipeline 3 stages gpipe: val_loss the same as 2 stages' ($(val pp3))" test "$(val pp3)" = "$(val pp2)"
run il2 --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.pipeline.schedule interleaved_1f1b &&
  check "pipeline interleaved_1f1b (2 ranks x 2 stages): val_loss the same as 2 stages' ($(val il2))" test "$(val il2)" = "$(val pp2)"
check "interleaved: evaluation ran forward-only through the 4 stages" \
  grep -q "pipeline: evaluation runs forward-only through the 4 stages" "$T/il2.log"
run dp4 --trainer.devices 4 --trainer.strategy pipeline --trainer.pipeline.stages 2 --trainer.pipeline.chunks 2 \
  --data.init_args.batch_size 16 &&
  check "pipeline 2 stages x 2 replicas: val_loss within 1e-7 of single's ($(val dp4))" close "$(val dp4)" "$(val single)" 1e-7
# validating often (every 5 steps) leaves training as it was
run pp2v --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.val_check_interval 5 &&
  for r in pp2 pp2v; do "$LK_BIN" export --ckpt "$T/$r/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$r.st" >/dev/null; done &&
  check "pipeline validated every 5 steps: the same weights" cmp -s "$T/pp2.st" "$T/pp2v.st"
finish
