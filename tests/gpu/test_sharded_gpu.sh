#!/usr/bin/env bash
# ZeRO stages 1-3 and fsdp on GPUs (issue 46): on the fake GPU's two, one
# rank per GPU over nccl (fake_gpu_sharded), each sharded strategy ends 20
# Adam steps with clipping and accumulation with ddp's weights and Adam
# state on the same GPUs, bitwise (the same reductions in the same order:
# the chunks' reduce-scatter sums what ddp's all-reduce sums), and with a
# parameter count no chunking divides (697). fsdp and stage 1 resumed
# from step 10 end as the uninterrupted runs, bitwise. Two ranks on one GPU talk over
# shm: stage 1 stages its gathers through the host and is ddp's bits
# there too; fsdp is refused there, naming nccl. A sharded checkpoint set
# is refused on a GPU, naming state_dict_type. cpu_offload (the *_offload
# names, trainer.fsdp_cpu_offload) keeps the chunks and the optimizer on
# the host: ddp's bits too, with 16-mixed's scaler, and resumes, from a
# sharded set as well. LK_BIN: the GPU build.
source "$LK_SOURCE_DIR/tests/strategy/sharded_lib.sh"
if ! "$LK_BIN" env | grep -qE "^gpus +: [0-9]+ visible to CUDA"; then
  echo "no CUDA device: skipped"; exit 77
fi
ngpu=$("$LK_BIN" env | sed -nE 's/^gpus +: ([0-9]+) visible to CUDA.*/\1/p')
X=(--trainer.accelerator gpu --trainer.devices 2 --trainer.gradient_clip_val 0.5 --trainer.accumulate_grad_batches 2)
if [ "${ngpu:-0}" -ge 2 ]; then
  fit ddp "${X[@]}" --trainer.strategy ddp
  check "ddp x2 GPUs ran over nccl" grep -qE '"comm_backend": *"nccl"' "$(run_json)"
  for s in deepspeed_stage_1 deepspeed_stage_2 deepspeed_stage_3 fsdp; do
    fit $s "${X[@]}" --trainer.strategy $s
    check "$s x2 GPUs (nccl; clip, accumulation, 697 parameters): weights and Adam state == ddp, bitwise" same $s ddp
  done
  for sh in SHARD_GRAD_OP NO_SHARD; do
    fit $sh "${X[@]}" --trainer.strategy fsdp --trainer.fsdp_sharding_strategy $sh
    check "fsdp $sh x2 GPUs == ddp, bitwise" same $sh ddp
  done
  # resume: 10 steps, then on to 20 from that checkpoint
  fit half "${X[@]}" --trainer.strategy fsdp --trainer.max_steps 10
  fit resumed "${X[@]}" --trainer.strategy fsdp --ckpt_path "$T/half.ckpt"
  check "fsdp x2 GPUs resumed at step 10 == the uninterrupted run, bitwise" same resumed fsdp
  fit half1 "${X[@]}" --trainer.strategy deepspeed_stage_1 --trainer.max_steps 10
  fit resumed1 "${X[@]}" --trainer.strategy deepspeed_stage_1 --ckpt_path "$T/half1.ckpt"
  check "deepspeed_stage_1 x2 GPUs resumed at step 10 == the uninterrupted run, bitwise" same resumed1 deepspeed_stage_1
  # cpu_offload: the chunks and the optimizer on the host, the same arithmetic (the CPU's optimizer kernels are the GPU's)
  for s in deepspeed_stage_2_offload deepspeed_stage_3_offload fsdp_cpu_offload; do
    fit $s "${X[@]}" --trainer.strategy $s
    check "$s x2 GPUs == ddp, bitwise" same $s ddp
  done
  check "the log says what cpu_offload moved" grep -q "; cpu_offload: master chunks, their gradients and the optimizer state in host memory, the optimizer on the CPU" "$T/fsdp_cpu_offload.log"
  # DeepSpeedStrategy's offload_optimizer, as Lightning's config takes it; stage 1 does not offload: refused, named
  sed '/^trainer:/a\  strategy: {class_path: DeepSpeedStrategy, init_args: {stage: 2, offload_optimizer: true}}' "$T/z.yaml" >"$T/ds.yaml"
  CFG="$T/ds.yaml" fit dsoff "${X[@]}"
  check "DeepSpeedStrategy stage 2 with offload_optimizer: offloaded, == ddp bitwise" \
    bash -c "grep -q '; cpu_offload: master chunks' '$T/dsoff.log' && cmp -s '$T/dsoff.st' '$T/ddp.st'"
  sed 's/stage: 2, offload/stage: 1, offload/' "$T/ds.yaml" >"$T/ds1.yaml"
  CFG="$T/ds1.yaml" fit ds1off "${X[@]}"
  check "stage 1 with offload_optimizer on a GPU is refused, named" \
    grep -q "strategy 'deepspeed_stage_1' with the optimizer offloaded to the CPU (offload_optimizer, trainer.fsdp_cpu_offload) is not built on cuda:0" "$T/ds1off.log"
  fit ddp16 "${X[@]}" --trainer.strategy ddp --trainer.precision 16-mixed
  fit off16 "${X[@]}" --trainer.strategy fsdp --trainer.fsdp_cpu_offload true --trainer.precision 16-mixed
  check "fsdp with cpu_offload x2 GPUs, 16-mixed (the loss scaler over host gradients) == ddp, bitwise" same off16 ddp16
  fit offhalf "${X[@]}" --trainer.strategy fsdp_cpu_offload --trainer.max_steps 10
  fit offresumed "${X[@]}" --trainer.strategy fsdp_cpu_offload --ckpt_path "$T/offhalf.ckpt"
  check "fsdp with cpu_offload resumed at step 10 == the uninterrupted run, bitwise" same offresumed fsdp_cpu_offload
  # offload's chunks are host memory: a sharded checkpoint set is written as on the CPU, and resumes
  fit offset "${X[@]}" --trainer.strategy fsdp_cpu_offload --trainer.max_steps 10 --trainer.state_dict_type sharded
  fit offsetresumed "${X[@]}" --trainer.strategy fsdp_cpu_offload --ckpt_path "$T/offset.ckpt"
  check "fsdp with cpu_offload: a sharded checkpoint set at step 10, resumed == the uninterrupted run, bitwise" \
    same offsetresumed fsdp_cpu_offload
  # model_parallel (issue 47): two stages on two GPUs over nccl == one GPU, bitwise (pipeline: test_pipeline_gpu.sh)
  M=(--trainer.accelerator gpu --trainer.accumulate_grad_batches 2)
  fit one "${M[@]}" --trainer.devices 1 --trainer.strategy single
  fit mp "${M[@]}" --trainer.devices 2 --trainer.strategy model_parallel
  check "model_parallel on 2 GPUs (nccl) == single on one GPU, bitwise" same mp one
  fit set "${X[@]}" --trainer.strategy fsdp --trainer.state_dict_type sharded
  check "a sharded checkpoint set on a GPU is refused, naming state_dict_type" \
    grep -q "a sharded checkpoint set (state_dict_type: sharded) is written from host memory only for now" "$T/set.log"
else # one GPU: two ranks on it, shm between them (LK_ALLOW_OVERSUBSCRIBE: rank i on GPU i % visible)
  export LK_ALLOW_OVERSUBSCRIBE=1
  fit ddp "${X[@]}" --trainer.strategy ddp
  check "ddp x2 ranks on one GPU ran over shm" grep -qE '"comm_backend": *"shm"' "$(run_json)"
  fit deepspeed_stage_1 "${X[@]}" --trainer.strategy deepspeed_stage_1
  check "deepspeed_stage_1 x2 ranks on one GPU (shm: gathers through the host) == ddp, bitwise" same deepspeed_stage_1 ddp
  fit fsdp "${X[@]}" --trainer.strategy fsdp
  check "fsdp on one GPU over shm is refused, naming nccl" \
    grep -q "strategy 'fsdp' on cuda:0 needs a communicator that reads device memory (nccl: one rank per GPU); this one (shm)" "$T/fsdp.log"
fi
finish
