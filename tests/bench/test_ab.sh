# bench/ab's statistics and grid parsing, without building or timing
# anything: the 95% interval of a median (seeded, so fixed ratios give a
# fixed interval; none below 5 pairs) and --tool cpu's cells from a
# bench-train grid (the issue-18 default and one given after --, with its
# precisions).
. "$(dirname "$0")/../cli/lib.sh"
SRC=${LK_SOURCE_DIR:-.}
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then echo "skip: no $PY"; exit 77; fi
ab() { "$PY" -c "
import importlib.util
from importlib.machinery import SourceFileLoader
loader = SourceFileLoader('ab', '$SRC/bench/ab')
ab = importlib.util.module_from_spec(importlib.util.spec_from_loader('ab', loader))
loader.exec_module(ab)
$1"; }

check "no interval below 5 pairs" test "$(ab 'print(ab.median_ci([1.0, 0.9, 1.1, 1.0]))')" = "(None, None)"
ci=$(ab 'lo, hi = ab.median_ci([1.0, 0.98, 1.02, 0.97, 1.01, 1.03, 0.99, 1.0, 0.96, 1.04]); print(lo, hi)')
check "the interval of 10 ratios around 1.0 holds the median ($ci)" \
  awk -v s="$ci" 'BEGIN { split(s, a, " "); exit !(a[1] <= 1.0 && 1.0 <= a[2] && a[1] >= 0.96 && a[2] <= 1.04) }'
check "the interval is the same on a second call (seeded)" \
  test "$(ab 'print(ab.median_ci([1.0, 0.98, 1.02, 0.97, 1.01, 1.03, 0.99, 1.0, 0.96, 1.04]))')" = \
       "$(ab 'print(ab.median_ci([1.0, 0.98, 1.02, 0.97, 1.01, 1.03, 0.99, 1.0, 0.96, 1.04]))')"
check "the default grid has issue 18's 8 cells" test "$(ab 'print(len(ab.grid_cells([])))')" = 8
check "a grid after -- gives its own cells" \
  test "$(ab "print(ab.grid_cells(['--model', 'mlp', '--strategies', 'ddp', '--devices', '2', '--batch-sizes', '256', '--steps', '9']))")" = \
       "[('mlp', 'ddp', '2', '256', None)]"
check "--precision after -- is part of each cell" \
  test "$(ab "print(ab.grid_cells(['--model', 'mlp', '--batch-sizes', '256', '--precision', '32-true', 'bf16-mixed']))")" = \
       "[('mlp', 'ddp', '1', '256', '32-true'), ('mlp', 'ddp', '1', '256', 'bf16-mixed')]"
# --deadline with two fake binaries that answer `bench train --csv F` at
# once: a generous deadline runs every pair (exit 0), a spent one none
# (exit 4, a table of 0 pairs), so a GPU session's cut step keeps its table.
tmp=$T # lib.sh's, removed on exit
for side in base head; do
  sps=$([ $side = base ] && echo 1000 || echo 1100)
  cat >"$tmp/$side" <<FAKE
#!/bin/sh
while [ \$# -gt 1 ]; do [ "\$1" = --csv ] && out=\$2; shift; done
printf 'model,strategy,devices,batch_size,samples_per_s,status\nmlp,ddp,1,64,$sps,ok\n' >"\$out"
FAKE
  chmod +x "$tmp/$side"
done
out=$("$PY" "$SRC/bench/ab" "$tmp/base" "$tmp/head" --pairs 3 --deadline 60 2>&1)
rc=$?
check "a deadline that holds every pair runs them all (exit $rc)" test $rc = 0
check "... and prints their ratios" grep -q "| mlp ddp 1 x batch 64 | 1.100 1.100 1.100 | 1.100 |" <<<"$out"
out=$("$PY" "$SRC/bench/ab" "$tmp/base" "$tmp/head" --pairs 3 --deadline 0 2>&1)
rc=$?
check "a spent deadline runs no pair and exits 4 (exit $rc)" test $rc = 4
check "... saying so" grep -q "stopping after 0 of 3 pairs" <<<"$out"
finish
