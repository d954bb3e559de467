#!/usr/bin/env bash
# `lockstep test` and `lockstep predict` under model_parallel and pipeline
# run the batches through the stages, forwards only (stage 0 -> last, the
# last stage's outputs sent to every stage), as validation inside fit
# does, not the whole model on every rank; each batch whole (one
# micro-batch), since matrix products of 8 rows round differently from
# single's of 32 (up to 1e-6 in these logits). From one checkpoint of
# single's (the mlp, 20 steps): the test metrics printed are single's, and
# predictions.npy is single's file byte for byte, at 2 stages (model_parallel
# and pipeline), 3 stages gpipe and 2 stages x 2 replicas (the test set
# sharded over the replicas, gathered in dataset order: its predictions
# are ddp's on 2 ranks byte for byte, which differ from single's by the
# rows each batch holds, up to 1.4e-6; its printed metrics are single's).
source "$(dirname "$0")/pipe_lib.sh"
write_mlp 2
run single || { finish; exit; }
CK="$T/single/lightning_logs/version_0/checkpoints/last.ckpt"
# ev CMD NAME ARGS...: `lockstep CMD` of the checkpoint into $T/CMD-NAME, its log in $T/CMD-NAME.log
ev() {
  local cmd=$1 name=$2; shift 2
  if ! "$LK_BIN" "$cmd" -c "$T/mlp.yaml" --ckpt_path "$CK" --trainer.default_root_dir "$T/$cmd-$name" "$@" \
    >"$T/$cmd-$name.log" 2>&1; then
    bad "$cmd $name: the run failed: $(tail -3 "$T/$cmd-$name.log")"; return 1
  fi
}
# the metric table `lockstep test` prints (rank 0)
metrics() { sed -n '/^Test metric/,$p' "$T/test-$1.log" | grep -E '^test_'; }
pred() { echo "$T/predict-$1/lightning_logs/version_0/predictions.npy"; }
ev test single && ev predict single && ev predict ddp2 --trainer.devices 2 --trainer.strategy ddp
check "single: a test metric table" test -n "$(metrics single)"
check "single: predictions written" test -s "$(pred single)"
for c in "mp2|model_parallel, 2 stages|2|single|--trainer.devices 2 --trainer.strategy model_parallel" \
         "pp2|pipeline, 2 stages|2|single|--trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4" \
         "pp3|pipeline, 3 stages gpipe|3|single|--trainer.devices 3 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.pipeline.schedule gpipe" \
         "il2|pipeline, 2 ranks x 2 stages interleaved|4|single|--trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.pipeline.schedule interleaved_1f1b" \
         "dp4|pipeline, 2 stages x 2 replicas|2|ddp2|--trainer.devices 4 --trainer.strategy pipeline --trainer.pipeline.stages 2 --trainer.pipeline.chunks 2"; do
  IFS='|' read -r name what np ref args <<<"$c"
  p=${what%%,*}
  # shellcheck disable=SC2086
  ev test $name $args && check "$what: test metrics == single's ($(metrics $name | tr -s ' ' | tr '\n' ' '))" \
    test "$(metrics $name)" = "$(metrics single)"
  check "$what: test ran forward-only through the stages" \
    grep -q "$p: test and predict run forward-only through the $np stages, each batch whole" "$T/test-$name.log"
  # shellcheck disable=SC2086
  ev predict $name $args && check "$what: predictions.npy == $ref's, byte for byte" cmp -s "$(pred $name)" "$(pred $ref)"
done
finish
