#!/usr/bin/env bash
# model_parallel and pipeline through `lockstep fit` against single (mlp on
# synthetic data, 20 optimizer steps, the same global batch):
# model_parallel on 2 stages ends with bitwise single's weights (one micro-batch: the same arithmetic, the stages' blocks
# run one after the other); pipeline on 2 and 3 stages, gpipe and 1f1b, ends
# bitwise equal to single accumulating the same micro-batches (batch 8 x 4:
# each micro-batch's mean loss times 1/4, gradients summed in micro-batch
# order, as the pipeline does), and within 1e-5 of single on the whole batch
# (the mean over 32 rows against four means over 8); with accumulation,
# clipping by the norm over every stage and bf16-mixed the same. Bad input
# is refused before training: a split naming no block, more stages than
# blocks, chunks that do not divide the batch size, an unknown schedule; an
# epoch's short last batch is cut into unequal micro-batches, weighted; the
# autoencoder fed unflattened images flattens them on the first stage. A tiny gpt
# (its embedding tied to its head across the first and last stage) the same.
source "$(dirname "$0")/pipe_lib.sh"
write_mlp 2
run() { # NAME ARGS...: fit, then the checkpoint's weights as $T/NAME.st (a stage's optimizer state stays on its rank)
  local name=$1; shift
  if ! "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
  "$LK_BIN" export --ckpt "$T/$name/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$name.st" >/dev/null
}
run single
run single_acc --data.init_args.batch_size 8 --trainer.accumulate_grad_batches 4
run mp2 --trainer.devices 2 --trainer.strategy model_parallel &&
  check "model_parallel 2 stages: bitwise single" cmp -s "$T/single.st" "$T/mp2.st"
check "model_parallel: the stages balanced by parameter count" \
  grep -q "model_parallel: 2 stages (balanced by parameter count" "$T/mp2.log"
for s in gpipe 1f1b; do
  for p in 2 3; do
    run "pp$p$s" --trainer.devices $p --trainer.strategy pipeline --trainer.pipeline.schedule $s --trainer.pipeline.chunks 4 &&
      check "pipeline $p stages $s 4 chunks: bitwise single accumulating 4 x 8" cmp -s "$T/single_acc.st" "$T/pp$p$s.st"
  done
done
# interleaved 1F1B: each rank holds two stages (k and k + p), the same
# arithmetic in another order: bitwise single accumulating the micro-batches
run ppil2 --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b \
  --trainer.pipeline.chunks 4 &&
  check "pipeline interleaved_1f1b, 2 ranks x 2 stages, 4 chunks: bitwise single accumulating 4 x 8" \
    cmp -s "$T/single_acc.st" "$T/ppil2.st"
check "interleaved_1f1b: 4 stages, 2 per rank, in the split's line" \
  grep -q "pipeline: 4 stages (balanced by parameter count; schedule interleaved_1f1b, 4 micro-batches), 2 per rank" "$T/ppil2.log"
run ppil2clip --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b \
  --trainer.pipeline.chunks 4 --trainer.gradient_clip_val 0.05 &&
  run pp2clip --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.gradient_clip_val 0.05 &&
  check "interleaved_1f1b clipped at 0.05: bitwise 1f1b clipped (the norm over every stage)" cmp -s "$T/pp2clip.st" "$T/ppil2clip.st"
run single_acc_bf16 --data.init_args.batch_size 8 --trainer.accumulate_grad_batches 4 --trainer.precision bf16-mixed
run ppil2bf16 --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b \
  --trainer.pipeline.chunks 4 --trainer.precision bf16-mixed &&
  check "interleaved_1f1b bf16-mixed: bitwise single accumulating 4 x 8" cmp -s "$T/single_acc_bf16.st" "$T/ppil2bf16.st"
# three ranks, two stages each, on a deeper mlp (7 blocks), 3 chunks of 8
run single_acc3 --model.init_args.hidden '[32, 24, 16]' --data.init_args.num_samples 480 --data.init_args.batch_size 8 \
  --trainer.accumulate_grad_batches 3
run ppil3 --model.init_args.hidden '[32, 24, 16]' --data.init_args.num_samples 480 --data.init_args.batch_size 24 \
  --trainer.devices 3 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.chunks 3 &&
  check "pipeline interleaved_1f1b, 3 ranks x 2 stages: bitwise single accumulating 3 x 8" cmp -s "$T/single_acc3.st" "$T/ppil3.st"
# an epoch's short last batch on 3 ranks: 484 samples give 16 batches of 24 and one of 4 rows for
# training, 4 micro-batches (fewer than the 6 chunks, not a multiple of 3 ranks), where the 1F1B
# orders would wait on each other: that batch runs every forward first, and the run stays single's
run single_il3short --model.init_args.hidden '[32, 24, 16]' --data.init_args.num_samples 484 --data.init_args.batch_size 24
run ppil3short --model.init_args.hidden '[32, 24, 16]' --data.init_args.num_samples 484 --data.init_args.batch_size 24 \
  --trainer.devices 3 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.chunks 6 &&
  check "interleaved_1f1b, 3 ranks, a short last batch of 4 rows in 6 chunks: single's weights within 1e-6 ($(near "$T/single_il3short.st" "$T/ppil3short.st" 1))" \
    near "$T/single_il3short.st" "$T/ppil3short.st" 1e-6
run ppilnode --trainer.devices 2 \
  --trainer.strategy '{class_path: PipelineStrategy, init_args: {chunks: 4, schedule: interleaved_1f1b, virtual_stages: 2}}' &&
  check "PipelineStrategy's init_args (interleaved_1f1b, virtual_stages 2) == trainer.pipeline's keys, bitwise" \
    cmp -s "$T/ppil2.st" "$T/ppilnode.st"
expect_fail "interleaved: chunks not a multiple of the ranks" 1 \
  "schedule interleaved_1f1b needs trainer.pipeline.chunks to be a multiple of the 2 stages' ranks" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/bi1" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.chunks 3
expect_fail "interleaved: more stages than blocks" 1 \
  "6 stages (2 ranks x trainer.pipeline.virtual_stages 3) but the model has only 5 blocks to cut: use fewer" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/bi2" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.virtual_stages 3
expect_fail "virtual stages without interleaved_1f1b" 1 \
  "trainer.pipeline.virtual_stages = 2 needs schedule interleaved_1f1b (schedule 1f1b runs one stage per rank)" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/bi3" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.virtual_stages 2
# an epoch's short last batch: 5 rows cut 2+1+1+1, 3 rows (fewer than the
# chunks) as 3 micro-batches, each loss weighted by its rows: the batch's
# mean as single takes it (646 and 643 samples give 16 batches of 32 and
# one of 5 and of 3 for training)
# the strategy's config node takes the same keys (PipelineStrategy, lockstep's own class name)
run ppnode --trainer.devices 2 \
  --trainer.strategy '{class_path: PipelineStrategy, init_args: {chunks: 4, schedule: gpipe}}' &&
  check "PipelineStrategy's init_args (chunks 4, schedule gpipe) == trainer.pipeline's keys, bitwise" \
    cmp -s "$T/pp2gpipe.st" "$T/ppnode.st"
check "PipelineStrategy's init_args reach the schedule" grep -q "schedule gpipe, 4 micro-batches" "$T/ppnode.log"
expect_fail "PipelineStrategy: an unknown argument is named with the ones it takes" 2 \
  "unknown argument 'chunkz' for PipelineStrategy (did you mean 'chunks'?) (PipelineStrategy takes chunks, schedule, split, stages, virtual_stages)" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.devices 2 --trainer.strategy '{class_path: PipelineStrategy, init_args: {chunkz: 4}}'
expect_fail "PipelineStrategy: an argument given null is named" 2 \
  "trainer.strategy.init_args.chunks: expected a value, got null" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.devices 2 --trainer.strategy '{class_path: PipelineStrategy, init_args: {chunks: null}}'
for n in 646 643; do
  run "short$n" --data.init_args.num_samples $n &&
    run "pshort$n" --data.init_args.num_samples $n --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 &&
    check "pipeline with a short last batch ($n samples): single's weights within 1e-6 ($(near "$T/short$n.st" "$T/pshort$n.st" 1e-6))" \
      near "$T/short$n.st" "$T/pshort$n.st" 1e-6
done
# (resuming a pipeline's checkpoint: test_pipeline_resume.sh) testing its weights works
check "a pipeline's checkpoint tests on 2 stages" "$LK_BIN" test -c "$T/mlp.yaml" --trainer.default_root_dir "$T/pp2gpipe" \
  --trainer.devices 2 --trainer.strategy pipeline --ckpt_path "$T/pp2gpipe/lightning_logs/version_0/checkpoints/last.ckpt"
# the same over the mpi communicator, where mpirun is installed
if command -v mpirun >/dev/null && "$LK_BIN" env 2>/dev/null | grep -q "comm backends.* mpi"; then
  mflags=(--oversubscribe)
  [ "$(id -u)" = 0 ] && mflags+=(--allow-run-as-root)
  # OpenMPI leaks in its own plugins: leak checks off for these ranks, as for the mpi tests
  if timeout 120 mpirun "${mflags[@]}" -np 2 -x LK_COMM_BACKEND=mpi -x ASAN_OPTIONS=detect_leaks=0 "$LK_BIN" fit -c "$T/mlp.yaml" \
    --trainer.default_root_dir "$T/mpi" --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 \
    >"$T/mpi.log" 2>&1; then
    "$LK_BIN" export --ckpt "$T/mpi/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/mpi.st" >/dev/null
    check "pipeline 2 stages 1f1b over mpi: bitwise single accumulating 4 x 8" cmp -s "$T/single_acc.st" "$T/mpi.st"
  else bad "pipeline over mpi failed: $(tail -3 "$T/mpi.log")"; fi
  if timeout 120 mpirun "${mflags[@]}" -np 2 -x LK_COMM_BACKEND=mpi -x ASAN_OPTIONS=detect_leaks=0 "$LK_BIN" fit -c "$T/mlp.yaml" \
    --trainer.default_root_dir "$T/mpiil" --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 \
    --trainer.pipeline.schedule interleaved_1f1b >"$T/mpiil.log" 2>&1; then
    "$LK_BIN" export --ckpt "$T/mpiil/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/mpiil.st" >/dev/null
    check "pipeline interleaved_1f1b over mpi (2 ranks x 2 stages): bitwise single accumulating 4 x 8" \
      cmp -s "$T/single_acc.st" "$T/mpiil.st"
  else bad "pipeline interleaved_1f1b over mpi failed: $(tail -3 "$T/mpiil.log")"; fi
else echo "skip: no mpirun or no mpi backend"; fi
check "pipeline 2 stages 1f1b: within 1e-5 of single on the whole batch ($(near "$T/single.st" "$T/pp21f1b.st" 1))" \
  near "$T/single.st" "$T/pp21f1b.st" 1e-5
# accumulation on top of the micro-batches: 2 batches of 2 x 8 per step
run single_acc2 --data.init_args.batch_size 8 --trainer.accumulate_grad_batches 4 --trainer.max_steps 10
run pp_acc --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 2 --data.init_args.batch_size 16 \
  --trainer.accumulate_grad_batches 2 --trainer.max_steps 10 &&
  check "pipeline 2 stages, 2 chunks x accumulate 2: bitwise single accumulating 4 x 8" cmp -s "$T/single_acc2.st" "$T/pp_acc.st"
# clipping: the norm over both stages' gradients (summed in f64 per stage; single sums otherwise)
run single_clip --trainer.gradient_clip_val 0.05
run mp_clip --trainer.devices 2 --trainer.strategy model_parallel --trainer.gradient_clip_val 0.05 &&
  check "model_parallel clipped at 0.05: within 1e-5 of single ($(near "$T/single_clip.st" "$T/mp_clip.st" 1))" \
    near "$T/single_clip.st" "$T/mp_clip.st" 1e-5
check "clipping at 0.05 changed the run" bash -c "! cmp -s '$T/single.st' '$T/single_clip.st'"
run single_bf16 --trainer.precision bf16-mixed
run mp_bf16 --trainer.devices 2 --trainer.strategy model_parallel --trainer.precision bf16-mixed &&
  check "model_parallel bf16-mixed: bitwise single" cmp -s "$T/single_bf16.st" "$T/mp_bf16.st"
# a tiny gpt: its token embedding is tied to the head, so the first and the
# last stage each hold it and its gradient's parts are summed between them
# before the step (model_parallel: the same bits; pipeline: the parts summed
# over the micro-batches first, then added, where single adds them per
# micro-batch: 3.5e-6 measured after 20 AdamW steps)
cat >"$T/gpt.yaml" <<YAML
seed_everything: 5
trainer: {max_steps: 20, max_epochs: 10, enable_progress_bar: false, enable_tensorboard: false, num_sanity_val_steps: 0, limit_val_batches: 2}
model:
  class_path: GPT
  init_args: {n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 32, dropout: 0.0}
data:
  class_path: synthetic
  init_args: {task: tokens, num_samples: 400, input_shape: [16], num_classes: 32, batch_size: 8, num_workers: 0}
optimizer: {name: adamw, lr: 0.003}
YAML
gpt() { # NAME ARGS...
  local name=$1; shift
  if ! "$LK_BIN" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
  "$LK_BIN" export --ckpt "$T/$name/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$name.st" >/dev/null
}
gpt gpt_single
gpt gpt_acc --data.init_args.batch_size 2 --trainer.accumulate_grad_batches 4
gpt gpt_mp2 --trainer.devices 2 --trainer.strategy model_parallel &&
  check "gpt model_parallel 2 stages (wte tied across them): bitwise single" cmp -s "$T/gpt_single.st" "$T/gpt_mp2.st"
gpt gpt_pp2 --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4
gpt gpt_il2 --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.chunks 4 &&
  check "gpt interleaved_1f1b (embedding on stage 0 of rank 0, head on stage 3 of rank 1, tied): bitwise 1f1b on 2 stages" \
    cmp -s "$T/gpt_pp2.st" "$T/gpt_il2.st"
# activation checkpointing inside the stages (each block's forward recomputed in its backward): the same bits
gpt gpt_pp2_ac --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.activation_checkpointing true &&
  check "gpt pipeline 1f1b with activation checkpointing: bitwise without" cmp -s "$T/gpt_pp2.st" "$T/gpt_pp2_ac.st"
gpt gpt_il2_ac --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.schedule interleaved_1f1b \
  --trainer.pipeline.chunks 4 --trainer.activation_checkpointing true &&
  check "gpt pipeline interleaved_1f1b with activation checkpointing: bitwise without" cmp -s "$T/gpt_il2.st" "$T/gpt_il2_ac.st"
check "activation checkpointing engaged in the stages" grep -q "activation_checkpointing: 2 layers recomputed in the backward" "$T/gpt_il2_ac.log"
gpt gpt_pp3 --trainer.devices 3 --trainer.strategy pipeline --trainer.pipeline.chunks 4 &&
  check "gpt pipeline 3 stages 1f1b: within 1e-5 of single accumulating 4 x 2 ($(near "$T/gpt_acc.st" "$T/gpt_pp3.st" 1))" \
    near "$T/gpt_acc.st" "$T/gpt_pp3.st" 1e-5
check "gpt pipeline 3 stages: within 1e-5 of single ($(near "$T/gpt_single.st" "$T/gpt_pp3.st" 1))" \
  near "$T/gpt_single.st" "$T/gpt_pp3.st" 1e-5
# an explicit split: the autoencoder's encoder | decoder, the seeds' example
cat >"$T/ae.yaml" <<YAML
seed_everything: 3
trainer: {max_steps: 4, enable_progress_bar: false, enable_tensorboard: false, num_sanity_val_steps: 0, limit_val_batches: 1}
model:
  class_path: autoencoder
data:
  class_path: synthetic
  init_args: {task: regression, num_samples: 64, input_shape: [784], batch_size: 16, num_workers: 0}
YAML
if "$LK_BIN" fit -c "$T/ae.yaml" --trainer.default_root_dir "$T/ae" --trainer.devices 2 --trainer.strategy model_parallel \
  --trainer.pipeline.split decoder >"$T/ae.log" 2>&1; then
  check "autoencoder split encoder | decoder" grep -q "\[encoder: .*\] \[decoder: " "$T/ae.log"
else bad "autoencoder model_parallel failed: $(tail -3 "$T/ae.log")"; fi
# images fed to the autoencoder unflattened ([1, 28, 28]): the first stage
# runs the model's own flatten before its first block (it once fed the
# images to the first Linear and failed); model_parallel bitwise single (one
# thread each: the GEMMs' sums then have one order), pipeline near it
sed 's/input_shape: \[784\]/input_shape: [1, 28, 28]/' "$T/ae.yaml" >"$T/ae_img.yaml"
ae_img() { # NAME ARGS...
  local name=$1; shift
  if ! LK_NUM_THREADS=1 "$LK_BIN" fit -c "$T/ae_img.yaml" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
  "$LK_BIN" export --ckpt "$T/$name/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$name.st" >/dev/null
}
ae_img ae_img_single
ae_img ae_img_mp --trainer.devices 2 --trainer.strategy model_parallel &&
  check "autoencoder on [1, 28, 28] images, model_parallel: bitwise single" cmp -s "$T/ae_img_single.st" "$T/ae_img_mp.st"
ae_img ae_img_pp --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 &&
  check "autoencoder on [1, 28, 28] images, pipeline 4 chunks: within 1e-5 of single ($(near "$T/ae_img_single.st" "$T/ae_img_pp.st" 1))" \
    near "$T/ae_img_single.st" "$T/ae_img_pp.st" 1e-5
ae_img ae_img_il --trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 \
  --trainer.pipeline.schedule interleaved_1f1b &&
  check "autoencoder interleaved_1f1b (4 stages cut inside encoder and decoder, 2 per rank): bitwise 1f1b's encoder | decoder" \
    cmp -s "$T/ae_img_pp.st" "$T/ae_img_il.st"
# split by measured time into 4 interleaved stages: the profile cuts the Sequentials' children
if "$LK_BIN" fit -c "$T/ae.yaml" --trainer.default_root_dir "$T/ae_il_time" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.split time >"$T/ae_il_time.log" 2>&1; then
  check "autoencoder interleaved, split by measured time into 4 stages" \
    grep -q "pipeline: 4 stages (split by measured time; schedule interleaved_1f1b, 4 micro-batches), 2 per rank" "$T/ae_il_time.log"
else bad "autoencoder interleaved split by time failed: $(tail -3 "$T/ae_il_time.log")"; fi
# a named split of the blocks inside them (fewer blocks than stages: the Sequentials are cut inside)
if "$LK_BIN" fit -c "$T/ae.yaml" --trainer.default_root_dir "$T/ae_il_named" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.schedule interleaved_1f1b --trainer.pipeline.split encoder.2,decoder.0,decoder.4 >"$T/ae_il_named.log" 2>&1; then
  check "autoencoder interleaved, split named inside its halves" \
    grep -q "\[encoder.0 .. encoder.1: .*\] \[encoder.2 .. encoder.4: .*\] \[decoder.0 .. decoder.3: .*\] \[decoder.4: " "$T/ae_il_named.log"
else bad "autoencoder interleaved with a named split failed: $(tail -3 "$T/ae_il_named.log")"; fi
# bad input, before any step
expect_fail "a split naming no block" 1 "trainer.pipeline.split names 'decodr', which is no block of the model (its blocks: encoder, decoder)" \
  "$LK_BIN" fit -c "$T/ae.yaml" --trainer.default_root_dir "$T/b1" --trainer.devices 2 --trainer.strategy model_parallel \
  --trainer.pipeline.split decodr
expect_fail "a stage of parameter-free blocks is named" 1 "strategy pipeline: stage 1 of 3 (layers.1) holds no parameters: every stage needs a block with parameters" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/b3" --trainer.devices 3 --trainer.strategy pipeline \
  --trainer.pipeline.split layers.1,layers.2
expect_fail "more stages than blocks" 1 "6 stages (one per process) but the model has only 5 blocks" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/b2" --trainer.devices 6 --trainer.strategy pipeline
# fewer blocks than stages: the autoencoder's encoder and decoder (Sequentials) are cut inside
ae_img ae_pp3 --trainer.devices 3 --trainer.strategy pipeline --trainer.pipeline.chunks 4 &&
  check "autoencoder on 3 stages: its encoder and decoder cut inside (by parameters)" \
    grep -q "pipeline: 3 stages (balanced by parameter count; schedule 1f1b, 4 micro-batches): \[encoder.0: 401920 params\]" "$T/ae_pp3.log"
expect_fail "chunks that do not divide the batch" 1 "do not divide into trainer.pipeline.chunks = 5 equal micro-batches" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/b3" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.chunks 5
expect_fail "an unknown schedule" 2 "trainer.pipeline.schedule: trainer.pipeline_schedule: expected one of gpipe|1f1b|interleaved_1f1b, got '1f2b'" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/b4" --trainer.devices 2 --trainer.strategy pipeline \
  --trainer.pipeline.schedule 1f2b
finish
