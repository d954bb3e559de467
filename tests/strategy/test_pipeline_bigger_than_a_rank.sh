#!/usr/bin/env bash
# A model bigger than one rank's memory trains in stages: a GPT of 85 M
# parameters (325 MiB of f32 weights and buffers) under trainer.memory_limit_mb 300.
# `lockstep fit` builds the model deferred (nothing allocated), and each of
# the 4 pipeline ranks materialises only its stage (~82 MiB), so every
# rank's peak stays under the limit through 3 SGD steps; ddp, which starts
# from the whole model on every rank, is refused at the start with the
# model's size, the limit and the strategies that cut it.
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
  memory_limit_mb: 300
model:
  class_path: gpt
  init_args: {n_layer: 12, n_head: 12, n_embd: 768, block_size: 32, vocab_size: 256, dropout: 0.0, bias: false}
data:
  class_path: synthetic
  init_args: {task: tokens, num_samples: 64, input_shape: [32], num_classes: 256, batch_size: 4, num_workers: 0}
optimizer: {name: sgd, lr: 0.01}
YAML
LOG=$T/pipe.log
if "$LK_BIN" fit -c "$T/big.yaml" --trainer.default_root_dir "$T/pipe" --trainer.devices 4 \
  --trainer.strategy pipeline >"$LOG" 2>&1; then
  ok "gpt 85 M on 4 pipeline stages under a 300 MiB limit per rank: trained"
  whole=$(sed -n 's/.*the whole model \([0-9.]*\)).*/\1/p' "$LOG")
  check "the whole model ($whole MiB) is bigger than the limit" awk -v w="$whole" 'BEGIN { exit !(w > 300) }'
  check "each rank materialised its stage alone" grep -q "each materialised alone from the deferred model" "$LOG"
  peaks=$(sed -n 's/^  rank [0-9]*: .*; peak \([0-9.]*\), peak RSS.*/\1/p' "$LOG" | tr '\n' ' ')
  check "4 ranks' peaks ($peaks MiB) all under 300" awk -v p="$peaks" \
    'BEGIN { n = split(p, a, " "); if (n != 4) exit 1; for (i = 1; i <= n; i++) if (a[i] + 0 >= 300) exit 1 }'
  check "3 steps" grep -q "max_steps=3 reached" "$LOG"
else
  bad "gpt 85 M on 4 pipeline stages under a 300 MiB limit per rank: the run failed: $(tail -3 "$LOG")"
fi
# ddp under the same limit: refused before its first step, naming the model's size and the strategies that cut it
out=$("$LK_BIN" fit -c "$T/big.yaml" --trainer.default_root_dir "$T/ddp" --trainer.devices 2 --trainer.strategy ddp 2>&1 >/dev/null)
rc=$?
check "ddp under the same limit: exit 1 (got $rc)" test "$rc" = 1
for want in "strategy ddp starts from the whole model on each rank (" \
            "MiB of parameters and buffers), and it does not fit: materialize: storage for" \
            "this rank's memory limit of 314572800 bytes (trainer.memory_limit_mb)" \
            "; strategy pipeline or model_parallel builds each rank only its stage's blocks"; do
  check "ddp's error says: $want" grep -qF -- "$want" <<<"$out"
done
finish
