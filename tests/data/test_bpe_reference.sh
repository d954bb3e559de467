#!/usr/bin/env bash
# lockstep's GPT-2 BPE against a Python reference of GPT-2's encoder
# (tools/bpe_reference.py, with the `regex` module's \p{L} and \p{N}): merges
# learned from a slice of the King James Bible, then a larger slice and a
# Unicode sample (accents, other scripts' digits, CJK, ligatures,
# contractions, runs of whitespace, pieces of hundreds of bytes) encoded both ways must give the same ids.
# Skips when python3 has no `regex` module or the Bible package is absent.
source "$(dirname "$0")/../cli/lib.sh"
PY=$(command -v python3)
if ! "$PY" -c "import regex" 2>/dev/null; then echo "SKIP: python3 has no regex module"; exit 0; fi
if [ ! -x /usr/bin/bible ]; then echo "SKIP: /usr/bin/bible absent (scripts/deps.sh installs bible-kjv)"; exit 0; fi
REF=$LK_SOURCE_DIR/tools/bpe_reference.py
/usr/bin/bible -l0 Gen1:1-Rev22:21 | head -c 300000 > "$T/text.txt"
check "merges learned" "$PY" "$REF" learn "$T" "$T/text.txt" 60000 300
check "prepare gpt2" "$LK_BIN" prepare --input "$T/text.txt" --out "$T/kjv" --tokenizer gpt2 --vocab "$T/vocab.json" --merges "$T/merges.txt" --val_fraction 0
check "the Bible: ids as the reference" "$PY" "$REF" check "$T" "$T/text.txt" "$T/kjv/train.bin"
printf "H\xc3\xa9llo w\xc3\xb6rld! It's 2024: na\xc3\xafve caf\xc3\xa9\xe2\x80\x94\xc3\x80\xc3\x89 123,456.78  \t\n\n  x's 'S don't  \xe2\x80\x99q\xe2\x80\x99 \xe4\xb8\xad\xe6\x96\x87 \xd9\xa1\xd9\xa2 \xe2\x85\xab \xc2\xbd \xef\xac\x81\r\n\xe2\x82\xac100  end " > "$T/u.txt"
# pieces longer than any buffer: one 360-letter word, 300 dashes, 200 spaces
printf ' %.0s' 1 >> "$T/u.txt"; printf 'the%.0s' {1..120} >> "$T/u.txt"; printf '%.0s-' {1..300} >> "$T/u.txt"
printf '%.0s ' {1..200} >> "$T/u.txt"; echo x >> "$T/u.txt"
check "prepare gpt2 (Unicode)" "$LK_BIN" prepare --input "$T/u.txt" --out "$T/u" --tokenizer gpt2 --vocab "$T/vocab.json" --merges "$T/merges.txt" --val_fraction 0
check "Unicode: ids as the reference" "$PY" "$REF" check "$T" "$T/u.txt" "$T/u/train.bin"
finish
