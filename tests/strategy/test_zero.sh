#!/usr/bin/env bash
# ZeRO stages 1 and 2 (deepspeed_stage_1/2, src/strategy/zero.c) against ddp:
# on 2, 3 and 4 ranks, 20 Adam steps with clipping by norm, gradient
# accumulation and bf16-mixed, on an mlp of 697 parameters (a prime times a
# prime: no world size here divides it, so the last chunks are padded), must
# end with the same weights and the same Adam state as ddp, bit for bit.
# Why bitwise and not a tolerance: the gradients are averaged by the same
# shm reduction (all-reduce for stage 1, reduce-scatter per unit for stage
# 2, which is fsdp.c's with the parameters kept whole: both sum the ranks in
# rank order, then divide), Adam is element-wise so a chunk's update is the
# whole update's restricted to it, and stage 2's norm sums each parameter's
# squared norm over the chunks in double before the f32 total (the same f32
# value here). Also: 16-mixed (the loss scaler's
# overflow check over the chunks), clipping really engaged, exact resume at
# the same world size, DeepSpeedStrategy's class_path node with init_args
# stage, bf16-true, and the refusals (a stage 4 in bf16-true, join is a unit
# matter not reachable from the CLI).
source "$(dirname "$0")/sharded_lib.sh" # $T/z.yaml (the 697-parameter mlp), fit, same, run_json, last

if [ "${1:-}" = mpi ]; then
  # The same stage-2 run over the mpi communicator (3 ranks under mpirun):
  # equal to ddp over shm, bitwise (both sum the ranks in rank order).
  # Environment (from ctest): LK_MPIRUN, LK_MPIRUN_FLAGS.
  read -r -a flags <<<"${LK_MPIRUN_FLAGS:-}"
  X=(--trainer.gradient_clip_val 0.05 --trainer.accumulate_grad_batches 2 --trainer.precision bf16-mixed)
  fit ddp3 --trainer.devices 3 --trainer.strategy ddp "${X[@]}"
  rm -rf "$T/runs"
  timeout 120 "$LK_MPIRUN" "${flags[@]}" -np 3 -x LK_ALLOW_OVERSUBSCRIBE=1 -x LK_COMM_BACKEND=mpi "$LK_BIN" fit \
    -c "$T/z.yaml" --trainer.devices 3 --trainer.strategy deepspeed_stage_2 "${X[@]}" >"$T/mpi.log" 2>&1
  "$LK_BIN" export --ckpt "$(last)" --out "$T/mpi.st" \
    --with-optimizer >/dev/null 2>&1
  check "stage 2 x3 over mpi: it ran on the mpi communicator" grep -q '"comm_backend": "mpi"' \
    "$(run_json)"
  check "stage 2 x3 over mpi == ddp x3 over shm, bitwise" same mpi ddp3
  finish
  exit
fi

X=(--trainer.gradient_clip_val 0.05 --trainer.accumulate_grad_batches 2 --trainer.precision bf16-mixed)
for n in 2 3 4; do
  fit ddp$n --trainer.devices $n --trainer.strategy ddp "${X[@]}"
  for s in 1 2; do
    fit z$s.$n --trainer.devices $n --trainer.strategy deepspeed_stage_$s "${X[@]}"
    check "stage $s x$n (clip, accumulation, bf16-mixed, 697 parameters): weights and Adam state == ddp, bitwise" \
      same z$s.$n ddp$n
  done
done
# model state per rank in run.json: 697 parameters in two units (layers.0: 561, layers.2: 136), Adam (2 f32
# arrays), 4 ranks: whole parameters padded to 564 + 136 = 700 elements, gradient chunks of 141 and 34 (each
# padded to 16 elements: 192 floats), Adam's state of 175 elements
state_bytes() { python3 -c "
import json, sys; m = json.load(open(sys.argv[1]))['model_state_bytes']
print(m['parameters'], m['gradients'], m['optimizer_state'])" "$(run_json)"; }
got=$(state_bytes)
check "stage 2 x4 run.json model_state_bytes: whole padded parameters, gradient and Adam chunks ($got)" \
  test "$got" = "2800 768 1400"
grep -q "deepspeed_stage_2 (lockstep's ZeRO-2" "$T/z2.4.log" && ok "the fit's opening line names lockstep's ZeRO-2" \
  || bad "the fit's opening line names lockstep's ZeRO-2"
# the asynchronous schedule (every unit's reduce-scatter handed to the communication thread as its backward
# ends, LK_SHARD_INLINE=0) reduces the same blocks in the same order: the same bits
export LK_SHARD_INLINE=0
fit z2async.2 --trainer.devices 2 --trainer.strategy deepspeed_stage_2 "${X[@]}"
unset LK_SHARD_INLINE
check "stage 2 x2 with LK_SHARD_INLINE=0 (each reduction on the communication thread) == ddp, bitwise" \
  same z2async.2 ddp2

# on one node over shm both stages keep one shared copy of the parameters by default (each rank writes its
# chunk in place, no all-gather); with ddp_shared_params false each rank keeps a replica and the chunks are
# all-gathered: the same bits either way
for s in 1 2; do
  fit rep$s --trainer.devices 3 --trainer.strategy deepspeed_stage_$s --trainer.ddp_shared_params false "${X[@]}"
  check "stage $s x3 with replicas (ddp_shared_params false) == ddp, bitwise" same rep$s ddp3
done
grep -q "deepspeed_stage_1: the 3 ranks share one copy of the parameters" "$T/z1.3.log" \
  && ok "stage 1 x3 says it shares one copy of the parameters" || bad "stage 1 x3 says it shares one copy of the parameters"
check "stage 2 x3 says it keeps one copy of the whole parameters on the node" \
  grep -q "parameters whole (one copy on the node, chunks written in place), over 3 ranks" "$T/z2.3.log"
check "stage 2 x3 with replicas says nothing of one copy" bash -c "! grep -q 'one copy on the node' '$T/rep2.log'"

# clipping was engaged (otherwise the test above would not test it)
fit z2noclip --trainer.devices 2 --trainer.strategy deepspeed_stage_2 --trainer.accumulate_grad_batches 2 \
  --trainer.precision bf16-mixed
check "stage 2 x2: without clipping the weights differ (clipping was engaged)" bash -c "! cmp -s '$T/z2noclip.st' '$T/z2.2.st'"

# 16-mixed: the loss scaler's overflow check agreed over the chunks
for s in ddp deepspeed_stage_2; do fit f16$s --trainer.devices 3 --trainer.strategy $s --trainer.precision 16-mixed \
  --trainer.gradient_clip_val 0.05; done
check "stage 2 x3, 16-mixed + clipping == ddp, bitwise" same f16deepspeed_stage_2 f16ddp

# Lightning's class node: DeepSpeedStrategy with init_args.stage
cat > "$T/node.yaml" <<YAML
trainer:
  strategy:
    class_path: lightning.pytorch.strategies.DeepSpeedStrategy
    init_args: {stage: 1, overlap_comm: true}
YAML
rm -rf "$T/runs"
timeout 120 "$LK_BIN" fit -c "$T/z.yaml" -c "$T/node.yaml" --trainer.devices 2 --trainer.max_steps 2 >"$T/node.log" 2>&1
check "DeepSpeedStrategy {stage: 1} runs deepspeed_stage_1" grep -q "on 2 processes (deepspeed_stage_1" "$T/node.log"

# exact resume at the same world size: 10 steps, then 10 more from the checkpoint == 20 straight
rm -rf "$T/half"
timeout 120 "$LK_BIN" fit -c "$T/z.yaml" --trainer.devices 3 --trainer.strategy deepspeed_stage_2 --trainer.max_steps 10 \
  --trainer.default_root_dir "$T/half" >"$T/half.log" 2>&1
fit resumed --trainer.devices 3 --trainer.strategy deepspeed_stage_2 \
  --ckpt_path "$T/half/lightning_logs/version_0/checkpoints/last.ckpt"
fit straight --trainer.devices 3 --trainer.strategy deepspeed_stage_2
check "stage 2 x3: resumed at step 10 == 20 straight steps, bitwise (optimizer chunks gathered into the checkpoint)" \
  same resumed straight

# the checkpoint is the ordinary whole one: saved by stage 2 on 3 ranks (above, step 10), it resumes at
# other world sizes and strategies; stage 1 x2 and ddp x2 from it end equal, bitwise
c="$T/half/lightning_logs/version_0/checkpoints/last.ckpt"
fit from_z1 --trainer.devices 2 --trainer.strategy deepspeed_stage_1 --ckpt_path "$c"
fit from_ddp --trainer.devices 2 --trainer.strategy ddp --ckpt_path "$c"
check "a stage-2 checkpoint from 3 ranks resumes as stage 1 on 2 ranks == as ddp on 2 ranks, bitwise" same from_z1 from_ddp
fit from_single --trainer.devices 1 --trainer.strategy single --ckpt_path "$c"
check "a stage-2 checkpoint from 3 ranks resumes on one process" test -s "$T/from_single.st"

# refusals
expect_fail "a stage that does not exist is refused" 2 "expected 1, 2 or 3, got '4'" \
  timeout 60 "$LK_BIN" fit -c "$T/z.yaml" --trainer.devices 2 \
  --trainer.strategy '{class_path: DeepSpeedStrategy, init_args: {stage: 4}}'
for s in ddp deepspeed_stage_2; do fit bt$s --trainer.devices 2 --trainer.strategy $s --trainer.precision bf16-true \
  --trainer.gradient_clip_val 0.05; done
check "stage 2 x2, bf16-true + clipping == ddp, bitwise (bf16 chunks reduce-scattered in bf16)" same btdeepspeed_stage_2 btddp
finish
