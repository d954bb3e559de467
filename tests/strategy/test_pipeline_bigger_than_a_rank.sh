#!/usr/bin/env bash
# A model bigger than one rank's memory trains in stages or shards: a GPT
# of 85 M parameters (325 MiB of f32 weights and buffers) under
# trainer.memory_limit_mb 310. `lockstep fit` builds the model deferred
# (nothing allocated); each of 4 pipeline ranks materialises only its stage
# (~82 MiB), and fsdp on 4 ranks one unit at a time, keeping its chunk, so
# every rank's peak stays under the limit through 3 SGD steps. ddp, which
# starts from the whole model on every rank, is refused at the start with
# the model's size, the limit and the strategies that cut it.
source "$(dirname "$0")/pipe_lib.sh"
cat >"$T/big.yaml" <<YAML
seed_everything: 5
trainer:
  max_steps: 3
  enable_progress_bar: false
  enable_tensorboard: false
  enable_model_summary: false
  enable_checkpointing: false
  num_sanity_val_steps: 0
  limit_val_batches: 0
  memory_limit_mb: 310
model:
  class_path: gpt
  init_args: {n_layer: 12, n_head: 12, n_embd: 768, block_size: 32, vocab_size: 256, dropout: 0.0, bias: false}
data:
  class_path: synthetic
  init_args: {task: tokens, num_samples: 64, input_shape: [32], num_classes: 256, batch_size: 1, num_workers: 0}
optimizer: {name: sgd, lr: 0.01}
YAML
# trained NAME STRATEGY LINE ARGS...: a 4-rank fit under the limit, its start-up LINE, every rank's peak under 310 MiB
trained() {
  local name=$1 strategy=$2 line=$3 log=$T/$1.log
  shift 3
  if ! "$LK_BIN" fit -c "$T/big.yaml" --trainer.default_root_dir "$T/$name" --trainer.devices 4 \
    --trainer.strategy "$strategy" "$@" >"$log" 2>&1; then
    bad "gpt 85 M under $strategy on 4 ranks, 310 MiB each: the run failed: $(tail -3 "$log")"; return
  fi
  ok "gpt 85 M under $strategy on 4 ranks, 310 MiB each: trained"
  check "$strategy: $line" grep -q "$line" "$log"
  local peaks
  peaks=$(sed -n 's/^  rank [0-9]*: .*; peak \([0-9.]*\), peak RSS.*/\1/p' "$log" | tr '\n' ' ')
  check "$strategy: 4 ranks' peaks ($peaks MiB) all under 310" awk -v p="$peaks" \
    'BEGIN { n = split(p, a, " "); if (n != 4) exit 1; for (i = 1; i <= n; i++) if (a[i] + 0 >= 310) exit 1 }'
  check "$strategy: 3 steps" grep -q "max_steps=3 reached" "$log"
}
# (the pipeline's 4 micro-batches need a batch of 4 rows; fsdp's activations fit beside its gathered units at 1)
trained pipe pipeline "each materialised alone from the deferred model" --data.init_args.batch_size 4
whole=$(sed -n 's/.*the whole model \([0-9.]*\)).*/\1/p' "$T/pipe.log")
check "the whole model ($whole MiB) is bigger than the limit" awk -v w="$whole" 'BEGIN { exit !(w > 310) }'
trained fsdp fsdp "FULL_SHARD over 4 ranks"
# ddp under the same limit: refused before its first step, naming the model's size and the strategies that cut or shard it
out=$("$LK_BIN" fit -c "$T/big.yaml" --trainer.default_root_dir "$T/ddp" --trainer.devices 2 --trainer.strategy ddp 2>&1 >/dev/null)
rc=$?
check "ddp under the same limit: exit 1 (got $rc)" test "$rc" = 1
for want in "strategy ddp starts from the whole model on each rank (" \
            "MiB of parameters and buffers), and it does not fit: materialize: storage for" \
            "this rank's memory limit of 325058560 bytes (trainer.memory_limit_mb)" \
            "; strategies pipeline and model_parallel build each rank only its stage's blocks, fsdp and deepspeed_stage_3 only its shards"; do
  check "ddp's error says: $want" grep -qF -- "$want" <<<"$out"
done
finish
