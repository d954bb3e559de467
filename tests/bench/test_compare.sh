# bench/compare --precision and bench/pytorch/train.py --precision: refusals
# (no torch needed: both parse options before importing it), then a tiny
# 32-true + bf16-mixed run read the way a user reads it: a precision column
# in the table, issue 19's 1.5x target on bf16-mixed, the RSS comparison
# line, the CSV's old columns first and the new ones last, and both sides
# having run the precision asked for. Figures are not checked (no timing).
. "$(dirname "$0")/../cli/lib.sh"
SRC=${LK_SOURCE_DIR:-.}
PY=/usr/bin/python3
if [ ! -x "$PY" ]; then echo "skip: no $PY"; exit 77; fi

expect_fail "train.py refuses 16-mixed" 2 "supports only torch.bfloat16" \
  "$PY" "$SRC/bench/pytorch/train.py" --precision 16-mixed
expect_fail "train.py refuses an unknown precision" 2 "expected one of 32-true, bf16-mixed" \
  "$PY" "$SRC/bench/pytorch/train.py" --precision fp8
expect_fail "compare refuses 16-true" 2 "supports only torch.bfloat16" \
  "$SRC/bench/compare" --lockstep "$LK_BIN" --precision 16-true
expect_fail "compare refuses 16-mixed" 2 "supports only torch.bfloat16" \
  "$SRC/bench/compare" --lockstep "$LK_BIN" --precision 32-true 16-mixed
expect_fail "compare refuses an unknown precision" 2 "expected one or more of 32-true, bf16-mixed" \
  "$SRC/bench/compare" --lockstep "$LK_BIN" --precision bf17

missing=""
"$PY" -c "import torch, numpy" 2>/dev/null || missing="$missing python3-torch"
[ -x /usr/bin/time ] || missing="$missing time"
[ -e /usr/include/x86_64-linux-gnu/cblas.h ] || [ -e /usr/include/cblas.h ] ||
  ls /usr/include/*/cblas.h >/dev/null 2>&1 || missing="$missing libopenblas-dev"
if [ -n "$missing" ]; then
  finish || exit 1
  echo "skip: the end-to-end run needs:$missing"; exit 77
fi

out=$("$SRC/bench/compare" --lockstep "$LK_BIN" --models mlp --worlds 1 --batches 64 --pairs 1 --steps 10 \
  --bound-seconds 0.05 --precision 32-true bf16 bf16-true --csv "$T/c.csv" --json "$T/c.jsonl" 2>"$T/err")
rc=$?
if [ "$rc" = 0 ]; then ok "compare 32-true + bf16-mixed runs"; else bad "compare exit $rc: $(cat "$T/err")"; fi
echo "$out"
grep -q "precision 32-true bf16-mixed bf16-true" <<<"$out" && ok "header names the precisions" || bad "header"
grep -qE "^mlp +1 +64 +bf16-true +[0-9]+ +[0-9]+ .* 1\.50 " <<<"$out" && ok "bf16-true row, 1.5x target" ||
  bad "bf16-true row"
grep -qE "^mlp +1 +64 +32-true +[0-9]+ +[0-9]+ .* 1\.30 " <<<"$out" && ok "32-true row, issue 9 target" ||
  bad "32-true row"
grep -qE "^mlp +1 +64 +bf16-mixed +[0-9]+ +[0-9]+ .* 1\.50 " <<<"$out" && ok "bf16-mixed row, 1.5x target" ||
  bad "bf16-mixed row"
bfrow=$(grep -E '^mlp +1 +64 +bf16-mixed ' <<<"$out" | head -1)
[ -n "$bfrow" ] && ! grep -q "of bound" <<<"$bfrow" && ok "no f32-bound verdict on bf16-mixed" ||
  bad "bf16-mixed held to the f32 bound (or no row): $bfrow"
grep -qE "^mlp +1 +64  lockstep [0-9.]+ -> [0-9.]+ \([0-9.]+x, [-+][0-9.]+\); PyTorch " <<<"$out" &&
  ok "RSS bf16-mixed / 32-true line" || bad "RSS line"
grep -qE "^lockstep 32-true GEMMs: (openblas sgemm|onednn .+) \(the bound below times OpenBLAS's cblas_sgemm\)$" <<<"$out" &&
  ok "the header names lockstep's f32 GEMM path" || bad "f32 GEMM path line"
header=$(head -1 "$T/c.csv" | tr -d "\r")  # csv writes CRLF
case "$header" in
  model,world,batch,pairs_ok,pairs,lk_sps,pt_sps,ratio,*,precision,lk_gemm_path,pt_output_dtype,cpu)
    ok "CSV: old columns first, precision columns last" ;;
  *) bad "CSV header: $header" ;;
esac
[ "$(grep -cE ',32-true,(openblas sgemm|onednn [^,]*),float32,' "$T/c.csv")" = 1 ] && ok "CSV 32-true row" || bad "CSV 32-true row"
[ "$(grep -c ',bf16-mixed,.*,bfloat16,' "$T/c.csv")" = 1 ] && ok "CSV bf16-mixed row" || bad "CSV bf16-mixed row"
[ "$(grep -c ',bf16-true,.*,bfloat16,' "$T/c.csv")" = 1 ] && ok "CSV bf16-true row (PyTorch's outputs bf16)" ||
  bad "CSV bf16-true row"
[ "$(grep -c '"precision": "bf16-mixed"' "$T/c.jsonl")" = 3 ] && ok "JSON records carry the precision" ||
  bad "JSON precision"
grep -q '"framework": "pytorch".*"output_dtype": "bfloat16"' "$T/c.jsonl" && ok "PyTorch ran under autocast" ||
  bad "PyTorch output dtype"
finish
