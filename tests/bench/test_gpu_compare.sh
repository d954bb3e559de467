# bench/gpu-compare's bookkeeping without a GPU: a fake `lockstep` (writes
# the run.json a fit writes) and a fake python (prints train.py's JSON line,
# or fails) stand in for the two sides. Checks --deadline (a generous one
# runs every pair, exit 0; a short one the pairs that fit, exit 4; a spent
# one none, exit 1), the CSV
# written per cell, and that lockstep's figure stays in the table when the
# PyTorch side fails (exit 1).
. "$(dirname "$0")/../cli/lib.sh"
SRC=${LK_SOURCE_DIR:-.}
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then echo "skip: no $PY"; exit 77; fi
cat >"$T/lockstep" <<'FAKE'
#!/bin/sh
while [ $# -gt 1 ]; do [ "$1" = --trainer.default_root_dir ] && root=$2; shift; done
sleep "${FAKE_SLEEP:-0}"
mkdir -p "$root/lightning_logs/version_0"
echo '{"status": "ok", "samples_per_s": 3000.0}' >"$root/lightning_logs/version_0/run.json"
FAKE
cat >"$T/python" <<FAKE
#!/bin/sh
case "\$*" in *import*) echo "fake GPU 0.0"; exit 0 ;; esac
[ -e "$T/pt-fails" ] && exit 1
echo '{"samples_per_s": 2000.0}'
FAKE
chmod +x "$T/lockstep" "$T/python"
gc() { "$PY" "$SRC/bench/gpu-compare" --lockstep "$T/lockstep" --python "$T/python" --models mlp --batches 256 \
  --precision 32-true bf16-mixed --pairs 2 --steps 10 --csv "$T/gc.csv" "$@" 2>&1; }

out=$(gc --deadline 60); rc=$?
check "a deadline that holds every pair runs them all (exit $rc)" test $rc = 0
check "... lockstep / PyTorch per pair and median" grep -q "| mlp | 256 | 32-true | 3000 | 2000 | 1.50 1.50 | 1.50 |" <<<"$out"
check "... the CSV has both cells" test "$(grep -c '^mlp,256,' "$T/gc.csv")" = 2
out=$(FAKE_SLEEP=1 gc --deadline 1.5); rc=$?
check "a deadline that holds one pair of a second runs that one and exits 4 (exit $rc)" test $rc = 4
check "... its cell with the pair that ran" grep -q "| mlp | 256 | 32-true | 3000 | 2000 | 1.50 | 1.50 |" <<<"$out"
check "... the other cell reported not run" grep -q "mlp-b256-bf16-mixed: not run (--deadline 1.5 s)" <<<"$out"
out=$(gc --deadline 0); rc=$?
check "a spent deadline runs no cell: nothing measured, exit 1 (exit $rc)" test $rc = 1
check "... saying so" grep -q "no cell ran (--deadline 0 s)" <<<"$out"
touch "$T/pt-fails"
out=$(gc); rc=$?
check "a failed PyTorch side exits 1 (exit $rc)" test $rc = 1
check "... and keeps lockstep's samples/s in the table" grep -q "| mlp | 256 | 32-true | 3000 | failed | - | failed |" <<<"$out"
finish
