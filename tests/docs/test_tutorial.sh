#!/usr/bin/env bash
# docs/TUTORIAL.md's commands, run as written (issue 48): the fenced blocks
# marked `sh test` (and `sh test-numpy` when a python3 with numpy is found),
# in order, as one script in an empty directory with the built lockstep
# first on PATH. A command that fails fails the test, naming the block.
source "$(dirname "$0")/../cli/lib.sh"
src=${LK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
doc=$src/docs/TUTORIAL.md
export PATH="$(cd "$(dirname "$LK_BIN")" && pwd):$PATH"
numpy=0
for py in python3 /usr/bin/python3; do
  if "$py" -c 'import numpy' 2>/dev/null; then
    numpy=1
    [ "$py" = python3 ] || export PATH="/usr/bin:$PATH" # the tutorial says python3
    break
  fi
done
[ "$numpy" = 1 ] || echo "note: no python3 with numpy: the npy block is skipped"
# each marked block becomes a function; run in order, stopping at the first failure
awk -v numpy="$numpy" '
  /^```sh test(-numpy)?$/ { n++; run = ($0 == "```sh test" || numpy == 1); if (run) { printf "block_%d() {\nset -e\n", n }; inblk = 1; next }
  inblk && /^```$/ { if (run) { printf "}\nblocks+=(%d)\n", n }; inblk = 0; next }
  inblk && run { print }' "$doc" > "$T/tutorial.sh"
nblocks=$(grep -c '^```sh test' "$doc")
check "the tutorial has blocks to run ($nblocks)" test "$nblocks" -ge 6
cd "$T" || exit 1
blocks=()
source "$T/tutorial.sh"
for b in "${blocks[@]}"; do
  if (block_$b) >"$T/block_$b.out" 2>&1; then ok "block $b"
  else bad "block $b failed: $(tail -5 "$T/block_$b.out")"; break; fi
  # a block's cd carries over, as in a shell the reader types into
  [ "$b" = 1 ] && cd tutorial
done
d=$T/tutorial
check "section 3: the Lightning config wrote two top-k checkpoints" \
  bash -c "test \$(ls $d/logs/lightning_logs/version_0/checkpoints/epoch=*.ckpt | wc -l) = 2"
check "section 5: ddp ran 2 ranks" grep -q '"world_size": *2' "$d/ddp_runs/lightning_logs/version_0/run.json"
check "section 6: predictions.npy written" bash -c "ls $d/ddp_runs/lightning_logs/version_*/predictions.npy >/dev/null"
# the pages the tutorial points to, and the diagrams ARCHITECTURE.md links, are there
check "TROUBLESHOOTING.md links the catalogue ERRORS.md" grep -q '(ERRORS.md)' "$src/docs/TROUBLESHOOTING.md"
for svg in layers ddp-step; do
  check "docs/$svg.svg is linked from ARCHITECTURE.md and is well-formed XML" bash -c \
    "grep -q '($svg.svg)' '$src/docs/ARCHITECTURE.md' && python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' '$src/docs/$svg.svg'"
done
# docs/BENCHMARKS.md's figures of record each name the HISTORY.md section that holds their table
while IFS= read -r sec; do
  grep -q "^#.* $sec" "$src/bench/results/HISTORY.md" || bad "BENCHMARKS.md cites HISTORY.md section '$sec', which is not there"
done < <(awk -F'|' '/^\| / && NF > 6 && $(NF-1) !~ /HISTORY.md section|---/ { s = $(NF-1); gsub(/^ +| +$/, "", s); print s }' "$src/docs/BENCHMARKS.md")
check "BENCHMARKS.md's rows cite sections of bench/results/HISTORY.md" grep -q 'HISTORY.md section' "$src/docs/BENCHMARKS.md"
finish
