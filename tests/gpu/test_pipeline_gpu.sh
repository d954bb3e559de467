#!/usr/bin/env bash
# pipeline on GPUs (issue 47): two stages on two GPUs, one rank each, the
# activations and gradients in device memory over nccl, each COMM action's
# messages one NCCL group (ncclGroupStart/End: 1F1B's stages send and
# receive at once, which NCCL's calls run one after another otherwise;
# the fake NCCL runs a group's calls side by side as NCCL does, and lone
# calls strictly in order, so the deadlock the refusal used to avoid would
# show here). gpipe, 1f1b and interleaved_1f1b (4 micro-batches of 6 rows, 20 Adam steps)
# end with the weights and Adam state of single on one GPU accumulating the
# same micro-batches (batch 6, accumulate 4), bitwise, as on the CPU; with
# accumulation 2 on top the same; 2 stages x 2 replicas on four GPUs (the
# replicas' all-reduce over nccl too) the same. Validation inside fit runs
# forward-only through the stages; `lockstep test` and `predict` from a
# checkpoint give single's metrics and predictions.npy byte for byte.
# Two ranks on one GPU (shm, no device memory reads) are refused, named.
# LK_BIN: the GPU build.
source "$LK_SOURCE_DIR/tests/strategy/sharded_lib.sh"
if ! "$LK_BIN" env | grep -qE "^gpus +: [0-9]+ visible to CUDA"; then
  echo "no CUDA device: skipped"; exit 77
fi
ngpu=$("$LK_BIN" env | sed -nE 's/^gpus +: ([0-9]+) visible to CUDA.*/\1/p')
if [ "${ngpu:-0}" -lt 2 ]; then
  export LK_ALLOW_OVERSUBSCRIBE=1
  fit shm --trainer.accelerator gpu --trainer.devices 2 --trainer.strategy pipeline
  check "pipeline on one GPU over shm is refused, naming nccl" \
    grep -q "strategy pipeline on cuda:0 needs a communicator that reads device memory (nccl: one rank per GPU)" "$T/shm.log"
  finish; exit
fi
G=(--trainer.accelerator gpu --trainer.max_steps 20 --trainer.limit_val_batches 2 --trainer.val_check_interval 10)
fit one "${G[@]}" --trainer.devices 1 --trainer.strategy single --data.init_args.batch_size 6 \
  --trainer.accumulate_grad_batches 4
for s in gpipe 1f1b; do
  fit "pp$s" "${G[@]}" --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule $s \
    --trainer.pipeline.chunks 4
  check "pipeline $s on 2 GPUs (nccl, 4 micro-batches): weights and Adam state == single on one GPU accumulating them, bitwise" \
    same "pp$s" one
done
check "pipeline on GPUs ran over nccl" grep -qE '"comm_backend": *"nccl"' "$(run_json)"
# interleaved 1F1B: a deeper mlp (16-33-17-4: 5 blocks) in 4 stages, 2 per GPU; a COMM then sends an
# activation and a gradient to the same peer and receives both from it, one NCCL group
D=(--model.init_args.hidden '[33, 17]')
fit one_d "${G[@]}" "${D[@]}" --trainer.devices 1 --trainer.strategy single --data.init_args.batch_size 6 \
  --trainer.accumulate_grad_batches 4
fit ppil "${G[@]}" "${D[@]}" --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b \
  --trainer.pipeline.chunks 4
check "pipeline interleaved_1f1b on 2 GPUs (4 stages, 2 per GPU, nccl): weights and Adam state == single on one GPU accumulating them, bitwise" \
  same ppil one_d
check "validation ran forward-only through the stages" \
  grep -q "pipeline: evaluation runs forward-only through the 2 stages (4 micro-batches per batch)" "$T/pp1f1b.log"
fit one2 "${G[@]}" --trainer.devices 1 --trainer.strategy single --data.init_args.batch_size 6 \
  --trainer.accumulate_grad_batches 8
fit ppacc "${G[@]}" --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 \
  --trainer.accumulate_grad_batches 2
check "pipeline 1f1b on 2 GPUs accumulating 2 batches == single accumulating 8 micro-batches, bitwise" same ppacc one2
if [ "$ngpu" -ge 4 ]; then
  fit ddp2 "${G[@]}" --trainer.devices 2 --trainer.strategy ddp --data.init_args.batch_size 6 \
    --trainer.accumulate_grad_batches 4
  fit pp4 "${G[@]}" --trainer.devices 4 --trainer.strategy pipeline --trainer.pipeline.stages 2 --trainer.pipeline.chunks 4 \
    --trainer.bucket_cap_mb 0.0001
  check "pipeline 2 stages x 2 replicas on 4 GPUs (the replicas' buckets over nccl) == ddp on 2 GPUs accumulating the same micro-batches, bitwise" same pp4 ddp2
fi
# test and predict from single's checkpoint: through the stages, each batch whole
ev() { # CMD NAME ARGS...
  local cmd=$1 name=$2; shift 2
  timeout 120 "$LK_BIN" "$cmd" -c "$T/z.yaml" --ckpt_path "$T/one.ckpt" --trainer.accelerator gpu \
    --trainer.default_root_dir "$T/$cmd-$name" "$@" >"$T/$cmd-$name.log" 2>&1 || echo "  $cmd $name failed: $(tail -3 "$T/$cmd-$name.log")"
}
metrics() { sed -n '/^Test metric/,$p' "$T/test-$1.log" | grep -E '^test_'; }
pred() { echo "$T/predict-$1/lightning_logs/version_0/predictions.npy"; }
for r in "single|--trainer.devices 1 --trainer.strategy single" \
         "pp|--trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4"; do
  IFS='|' read -r name args <<<"$r"
  # shellcheck disable=SC2086
  ev test $name $args; ev predict $name $args
done
check "test on 2 GPUs through the stages: metrics == single's ($(metrics pp | tr -s ' ' | tr '\n' ' '))" \
  bash -c "[ -n \"\$1\" ] && [ \"\$1\" = \"\$2\" ]" _ "$(metrics pp)" "$(metrics single)"
check "test ran forward-only through the stages" \
  grep -q "pipeline: test and predict run forward-only through the 2 stages, each batch whole" "$T/test-pp.log"
check "predict on 2 GPUs through the stages: predictions.npy == single's, byte for byte" \
  bash -c "[ -s \"\$1\" ] && cmp -s \"\$1\" \"\$2\"" _ "$(pred pp)" "$(pred single)"
finish
