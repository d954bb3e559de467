#!/usr/bin/env bash
# lockstep prepare (bytes round trip, a handmade GPT-2 BPE vocabulary, bad
# input), the tokens data module through the CLI (--print_config, its
# errors before training) and lockstep generate's errors and checkpoint
# resolution (a model that maps tokens to logits arrives with the GPT).
source "$(dirname "$0")/lib.sh"
LK=$LK_BIN

# ---- prepare: bytes ---------------------------------------------------------------
printf 'In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void. \xc3\xa9\n%.0s' {1..20} > "$T/in.txt"
out=$("$LK" prepare --input "$T/in.txt" --out "$T/bytes" --val_fraction 0.25 2>&1)
check "prepare bytes prints counts" grep -q "tokens (bytes, vocabulary 256)" <<<"$out"
# train.bin + val.bin (after their 1024-byte headers) are the input's bytes, little-endian u16
check "prepare bytes round trip" /usr/bin/python3 - "$T" <<'PY'
import struct, sys
t = sys.argv[1]
raw = open(f"{t}/in.txt", "rb").read()
toks = []
for name in ("train", "val"):
    b = open(f"{t}/bytes/{name}.bin", "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    assert magic == 20240520 and version == 1 and len(b) == 1024 + 2 * n, (name, magic, version, n, len(b))
    toks += struct.unpack(f"<{n}H", b[1024:])
assert bytes(toks) == raw, "tokens differ from the text"
assert abs(len(raw) * 0.25 - struct.unpack("<3i", open(f"{t}/bytes/val.bin", "rb").read()[:12])[2]) <= 2
PY
check "prepare writes meta.json" grep -q '"tokenizer":[[:space:]]*"bytes"' "$T/bytes/meta.json"

# ---- prepare: GPT-2 BPE on a handmade vocabulary -------------------------------------
/usr/bin/python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
# GPT-2's bytes_to_unicode
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
m = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {m[b]: b for b in range(256)}
vocab.update({"th": 256, "the": 257, "\u0120the": 258})
json.dump(vocab, open(f"{t}/vocab.json", "w"))
open(f"{t}/merges.txt", "w").write("#version: 0.2\nt h\nth e\n\u0120 the\n")
open(f"{t}/bpe.txt", "w").write("the cat the the")
PY
out=$("$LK" prepare --input "$T/bpe.txt" --out "$T/bpe" --val_fraction 0 --tokenizer gpt2 --vocab "$T/vocab.json" --merges "$T/merges.txt" 2>&1)
# "the" " cat" " the" " the" -> the, Ġ c a t, Ġthe, Ġthe = 257 32 99 97 116 258 258
check "prepare gpt2 counts" grep -q "15 bytes -> 7 tokens (gpt2, vocabulary 259)" <<<"$out"
check "prepare gpt2 tokens" /usr/bin/python3 -c "
import struct; b = open('$T/bpe/train.bin', 'rb').read(); n = struct.unpack('<3i', b[:12])[2]
assert list(struct.unpack(f'<{n}H', b[1024:])) == [257, 32, 99, 97, 116, 258, 258], struct.unpack(f'<{n}H', b[1024:])"

# ---- prepare: bad input ---------------------------------------------------------------
expect_fail "prepare needs input and out" 2 "--input FILE and --out DIR are required" "$LK" prepare --out "$T/x"
expect_fail "prepare unknown tokenizer" 2 "--tokenizer 'bpe': expected bytes or gpt2" "$LK" prepare --input "$T/in.txt" --out "$T/x" --tokenizer bpe
expect_fail "prepare gpt2 needs files" 2 "--tokenizer gpt2 needs --vocab vocab.json and --merges merges.txt" "$LK" prepare --input "$T/in.txt" --out "$T/x" --tokenizer gpt2
expect_fail "prepare val_fraction" 2 "--val_fraction '1.5': expected a number in [0, 1)" "$LK" prepare --input "$T/in.txt" --out "$T/x" --val_fraction 1.5
: > "$T/empty.txt"
expect_fail "prepare empty input" 1 "is empty: nothing to tokenize" "$LK" prepare --input "$T/empty.txt" --out "$T/x"
expect_fail "prepare missing input" 1 "cannot read --input $T/nothere.txt" "$LK" prepare --input "$T/nothere.txt" --out "$T/x"

# ---- the tokens data module in a config --------------------------------------------------
cat > "$T/tok.yaml" <<YAML
trainer:
  default_root_dir: $T/runs
model:
  class_path: mlp
data:
  class_path: tokens
  init_args:
    root: $T/bytes
    block_size: 16
YAML
out=$("$LK" fit -c "$T/tok.yaml" --print_config 2>&1)
check "tokens data module in --print_config" grep -q "samples_per_epoch: 0" <<<"$out"
check "tokens data module in --help" grep -q "tokens .*King James Bible" <<<"$("$LK" fit --help)"
expect_fail "tokens: unknown key" 2 "block_size" "$LK" fit -c "$T/tok.yaml" --data.init_args.block_sise 8
expect_fail "tokens: missing root" 1 "cannot read training token file $T/none/train.bin: No such file or directory (named by data.init_args.root)" \
  "$LK" fit -c "$T/tok.yaml" --data.init_args.root "$T/none"
expect_fail "tokens: block_size longer than the data" 1 "needs 1001 per window (block_size + 1)" \
  "$LK" fit -c "$T/tok.yaml" --data.init_args.block_size 1000
expect_fail "tokens: vocabulary" 1 "holds token 195, outside a vocabulary of 128 (data.init_args.vocab_size)" \
  "$LK" fit -c "$T/tok.yaml" --data.init_args.vocab_size 128

# ---- generate ------------------------------------------------------------------------------
G=("$LK" generate -c "$T/tok.yaml")
expect_fail "generate: prompt required" 2 "--prompt TEXT is required" "${G[@]}"
expect_fail "generate: empty prompt" 2 "--prompt is empty" "${G[@]}" --prompt ""
expect_fail "generate: max_new_tokens" 2 "--max_new_tokens 0, expected >= 1" "${G[@]}" --prompt hi --max_new_tokens 0
expect_fail "generate: temperature" 2 "--temperature 0, expected > 0" "${G[@]}" --prompt hi --temperature 0
expect_fail "generate: top_k" 2 "--top_k -3, expected >= 0" "${G[@]}" --prompt hi --top_k -3
expect_fail "generate: tokenizer" 2 "--tokenizer 'x': expected bytes or gpt2" "${G[@]}" --prompt hi --tokenizer x
expect_fail "generate: config errors too" 2 "unknown top-level key 'mdoel'" "${G[@]}" --prompt hi --mdoel.x 1
expect_fail "generate: no run yet" 1 "--ckpt_path last: found no $T/runs/lightning_logs/version_*/checkpoints/last.ckpt" "${G[@]}" --prompt hi
expect_fail "generate: unreadable checkpoint" 1 "--ckpt_path: cannot read '$T/no.ckpt'" "${G[@]}" --prompt hi --ckpt_path "$T/no.ckpt"
# a checkpoint of another model: every mismatch named before anything runs
write_synth
"$LK" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.limit_train_batches 1 --trainer.limit_val_batches 1 >/dev/null 2>&1
ck=$(ls "$T"/runs/lightning_logs/version_*/checkpoints/last.ckpt 2>/dev/null | head -1)
check "a checkpoint to load" test -n "$ck"
expect_fail "generate: checkpoint of another shape" 1 "does not fit the model" "${G[@]}" --prompt hi --ckpt_path last
# the same mlp loads, then is refused: it does not map tokens to logits [1, t, V]
expect_fail "generate: model without token logits" 1 "generate" "$LK" generate -c "$T/synth.yaml" --prompt hi --ckpt_path last
finish
