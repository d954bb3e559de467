#!/usr/bin/env bash
# A tiny GPT on the tokens data module's Bible default, end to end: local
# rank 0 prepares the token files while rank 1 waits (ddp on 2 processes),
# exact resume with random training windows, and lockstep generate (seeded,
# written to the run directory, the prompt checked against the model's
# vocabulary, a checkpoint of another shape refused). Skips when the build
# has no `gpt` model or the bible-kjv packages are absent.
source "$(dirname "$0")/lib.sh"
LK=$LK_BIN
if ! "$LK" fit --help | grep -q "^  gpt "; then echo "SKIP: no gpt model in this build"; exit 0; fi
if [ ! -x /usr/bin/bible ]; then echo "SKIP: /usr/bin/bible absent (scripts/deps.sh installs bible-kjv)"; exit 0; fi
export LK_DATA_ROOT=$T/data LK_ALLOW_OVERSUBSCRIBE=1
quiet() { "$@" >"$T/last.log" 2>&1 || { cat "$T/last.log"; return 1; }; }
cat > "$T/gpt.yaml" <<YAML
seed_everything: 3
trainer:
  default_root_dir: $T/runs
  devices: 2
  strategy: ddp
  max_steps: 6
  val_check_interval: 6
  limit_val_batches: 2
  log_every_n_steps: 2
  enable_progress_bar: false
model:
  class_path: gpt
  init_args: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, vocab_size: 256, bias: false}
data:
  class_path: tokens
  init_args: {block_size: 16, batch_size: 4, num_workers: 0, samples_per_epoch: 48}
optimizer:
  name: adamw
  lr: 0.01
YAML
check "fit on the Bible default, 2 ranks" quiet "$LK" fit -c "$T/gpt.yaml"
check "rank 0 prepared the Bible once" test -s "$T/data/bible-kjv/train.bin" -a -s "$T/data/bible-kjv/val.bin" -a -s "$T/data/bible-kjv/meta.json"
ck=$(ls "$T"/runs/lightning_logs/version_0/checkpoints/last.ckpt 2>/dev/null)
check "a last checkpoint" test -n "$ck"

# exact resume: 3 steps, then 3 more from the checkpoint = 6 straight (bitwise)
mkdir -p "$T/r"
check "fit 3 steps" quiet "$LK" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/r" --trainer.max_steps 3 --trainer.val_check_interval 3
check "resume to 6" quiet "$LK" fit -c "$T/gpt.yaml" --trainer.default_root_dir "$T/r" --ckpt_path last
"$LK" export --ckpt "$ck" --out "$T/a.safetensors" >/dev/null
"$LK" export --ckpt "$(ls -d "$T"/r/lightning_logs/version_* | sort -t_ -k3 -n | tail -1)/checkpoints/last.ckpt" --out "$T/b.safetensors" >/dev/null
check "resumed weights bitwise equal" cmp -s "$T/a.safetensors" "$T/b.safetensors"

# generate
G=("$LK" generate -c "$T/gpt.yaml" --prompt "And God said" --max_new_tokens 40 --seed 5)
"${G[@]}" >"$T/o1.txt" 2>/dev/null
"${G[@]}" >"$T/o2.txt" 2>/dev/null
"${G[@]}" --seed 6 >"$T/o3.txt" 2>/dev/null
check "generate prints the prompt and 40 bytes" test "$(wc -c <"$T/o1.txt")" -ge 52
check "the same seed, the same text" cmp -s "$T/o1.txt" "$T/o2.txt"
check "generated.txt in the run directory" test -s "$T/runs/lightning_logs/version_0/generated.txt"
check "another seed, another text" bash -c "! cmp -s '$T/o1.txt' '$T/o3.txt'"
# the Bible is ASCII, so a 128-token model trains on it; a prompt byte >= 128 is refused
check "fit a 128-token model" quiet "$LK" fit -c "$T/gpt.yaml" --model.init_args.vocab_size 128 --trainer.devices 1 \
  --trainer.max_steps 1 --trainer.default_root_dir "$T/v128"
expect_fail "generate: prompt bytes outside the vocabulary" 1 "prompt token 0 is 195, outside the model's vocabulary of 128" \
  "$LK" generate -c "$T/gpt.yaml" --model.init_args.vocab_size 128 --trainer.default_root_dir "$T/v128" --prompt "$(printf '\xc3\xa9')"
expect_fail "generate: checkpoint of another shape" 1 "does not fit the model" "${G[@]}" --model.init_args.n_embd 32
finish
