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
expect_fail "unknown schedule" 2 "pipeline schedule 'interleaved' is unknown" "$LK_BIN" pipeline-schedule --schedule interleaved
expect_fail "stages out of range" 2 "--stages '0': expected an integer in 1..4096" "$LK_BIN" pipeline-schedule --stages 0
expect_fail "unknown option" 2 "unknown option '--chunk'" "$LK_BIN" pipeline-schedule --chunk 3
finish
