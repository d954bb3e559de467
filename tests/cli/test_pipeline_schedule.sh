#!/usr/bin/env bash
# `lockstep pipeline-schedule`: the schedule as data, printed and checked
# (docs/PIPELINE.md shows this output).
source "$(dirname "$0")/lib.sh"
out=$("$LK_BIN" pipeline-schedule --schedule 1f1b --stages 4 --chunks 8)
check "1f1b 4x8: checked" grep -q "check: complete, every message matched, no deadlock" <<<"$out"
check "1f1b 4x8: stage 0's steady state posts its send and receive together" grep -q "^stage 0: F0 >a0 F1 >a1 F2 >a2 F3 \[>a3 <g0\] B0" <<<"$out"
check "1f1b 4x8: last stage" grep -q "^stage 3: <a0 F0 B0 \[>g0 <a1\] F1 B1" <<<"$out"
check "1f1b 4x8: at most p - stage micro-batches alive" grep -q "per stage: 4 3 2 1$" <<<"$out"
check "1f1b 4x8: bubble 27.3% in theory and simulated" grep -q "theory (p-1)/(m+p-1) = 27.3%; simulated .*: 27.3%" <<<"$out"
out=$("$LK_BIN" pipeline-schedule --schedule=gpipe --stages=2 --chunks=4)
check "gpipe 2x4: every micro-batch alive" grep -q "per stage: 4 4$" <<<"$out"
check "gpipe 2x4: bubble 20%" grep -q "= 20.0%; simulated .*: 20.0%" <<<"$out"
out=$("$LK_BIN" pipeline-schedule --schedule forward --stages 2 --chunks 2)
check "forward: no backward, no step" grep -q "^stage 1: <a0 F0 <a1 F1$" <<<"$out"
out=$("$LK_BIN" pipeline-schedule --schedule interleaved_1f1b --stages 2 --chunks 4)
check "interleaved_1f1b 2x4: 2 stages per rank by default" grep -q "2 ranks x 2 stages each (rank k holds stages k, k+2, ...)" <<<"$out"
check "interleaved_1f1b 2x4: rank 1 runs stage 1 then stage 3 of micro-batch 0" grep -q "^rank 1: <a0s1 F0s1 \[>a0s1 <a1s1\] F1s1" <<<"$out"
check "interleaved_1f1b 2x4: checked" grep -q "check: complete, every message matched, no deadlock" <<<"$out"
check "interleaved_1f1b 2x4: bubble (p-1)/(vm+p-1) = 11.1% in theory and simulated" grep -q "theory (p-1)/(vm+p-1) = 11.1%; simulated .*: 11.1%" <<<"$out"
out=$("$LK_BIN" pipeline-schedule --schedule interleaved_1f1b --stages 4 --chunks 8 --virtual-stages 3)
check "interleaved_1f1b 4x8, 3 stages per rank: bubble 3/27 = 11.1%, rank 0 keeps 15 micro-batch-stages" \
  bash -c 'grep -q "= 11.1%; simulated .*: 11.1%" <<<"$1" && grep -q "per rank: 15 13 11 9$" <<<"$1"' _ "$out"
expect_fail "virtual stages with 1f1b" 2 "pipeline schedule 1f1b runs one stage per rank, not 2" \
  "$LK_BIN" pipeline-schedule --schedule 1f1b --virtual-stages 2
expect_fail "unknown schedule" 2 "pipeline schedule 'interleaved' is unknown" "$LK_BIN" pipeline-schedule --schedule interleaved
expect_fail "stages out of range" 2 "--stages '0': expected an integer in 1..4096" "$LK_BIN" pipeline-schedule --stages 0
expect_fail "unknown option" 2 "unknown option '--chunk' (expected --schedule, --stages, --chunks, --virtual-stages)" "$LK_BIN" pipeline-schedule --chunk 3
finish
