#!/usr/bin/env bash
# `lockstep bench ops` runs to the end at a tiny time budget and prints each
# of its tables, the optimizer's and the MLP step's with a row per thread count.
# A benchmark, never a timed test: only the shape of the output is checked.
. "$(dirname "$0")/lib.sh"
out=$(LK_NUM_THREADS=2 "$LK_BIN" bench ops --seconds 0.01 2>"$T/stderr"); rc=$?
echo "$out"
check "bench ops exits 0 (exit $rc)" test "$rc" = 0
check "the f32 GEMM table has its MLP layer row" grep -Eq '^256x784x512 +MLP layer 1 \(x @ W\) +[0-9.]+ +[0-9.]+' <<<"$out"
check "the low-precision table names the bf16 path" grep -q '^low-precision GEMMs (C in f32): bf16 path: ' <<<"$out"
check "the optimizer table has its header" grep -q '^optimizer update, AdamW in f32' <<<"$out"
for n in 235146 16384; do
  for t in 1 2; do
    check "the optimizer table has $n parameters on $t threads" \
      grep -Eq "^$n +$t +[0-9.]+ +[0-9.]+ +[0-9.]+\$" <<<"$out"
  done
done
check "the MLP step table has its header" grep -Eq '^MLP 784-512-256-64, batch 256, forward\+backward \([0-9]+ MFLOP\):' <<<"$out"
for p in 32-true bf16-mixed; do
  for t in 1 2; do
    check "the MLP step table has $p on $t threads" grep -Eq "^$p +$t +[0-9.]+ +[0-9.]+ +[0-9]+\$" <<<"$out"
  done
done
check "--help names the optimizer table" bash -c "'$LK_BIN' bench ops --help | grep -q 'optimizer'"
expect_fail "an unknown option is refused" 2 "unknown option '--nope'" "$LK_BIN" bench ops --nope
finish
