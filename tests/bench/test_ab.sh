# bench/ab's statistics and grid parsing, without building or timing
# anything: the 95% interval of a median (seeded, so fixed ratios give a
# fixed interval; none below 5 pairs) and --tool cpu's cells from a
# bench-train grid (the issue-18 default and one given after --).
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
       "[('mlp', 'ddp', '2', '256')]"
finish
