#!/usr/bin/env bash
# examples/custom_module.c as a user runs it: started alone it launches its
# own 2 ranks (devices: 2, strategy: ddp) and both train; started by
# `lockstep launch -n 2` it is a rank directly, with the same result.
# Usage: test_example.sh <custom_module binary>
source "$(dirname "$0")/../cli/lib.sh"
EX=$1

# trained OUT: both ranks report the same step count and a train loss that
# fell to under a quarter of its first value; rank 0 a validation accuracy.
trained() {
  local out=$1
  awk '/^(\[rank 1\] )?rank [01] of 2: /{
         sub(/^\[rank 1\] /, ""); seen[$2] = 1; steps[$2] = $5
         if (!($9 < $7 / 4)) bad = 1
       }
       /^val_acc /{ acc = $2 }
       END { exit !(seen[0] && seen[1] && steps[0] == steps[1] && steps[0] > 0 && !bad && acc > 0.9) }' <<<"$out"
}

out=$("$EX" "$T/alone" 2>&1); rc=$?
echo "$out"
check "started alone: exit 0" test "$rc" = 0
check "started alone: both ranks trained, val_acc > 0.9" trained "$out"
check "started alone: rank 0 wrote the logs" test -f "$T/alone/lightning_logs/version_0/metrics.csv"
check "started alone: no rank ran in the launcher (one log dir)" test ! -e "$T/alone/lightning_logs/version_1"

out=$("$LK_BIN" launch -n 2 -- "$EX" "$T/launched" 2>&1); rc=$?
echo "$out"
check "under lockstep launch: exit 0" test "$rc" = 0
check "under lockstep launch: both ranks trained" trained "$out"
finish
