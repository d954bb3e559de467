#!/usr/bin/env bash
# `lockstep bench train` with a cell that fails when it runs (a
# global_batch_size that 2 ranks of batch 16 cannot divide): the cell is
# shown as failed with its reason in the table, a note, the CSV's
# status/error columns and the charts' notes, never as 0 samples/s or 0%
# scaling; the ok cells still get their numbers and the recommendations.
# A device count above the machine's cores is said up front and its cells
# are not started (issue 48); the runs' temporary directory is removed,
# failed cells or not. --gpus is the same option as --devices.
. "$(dirname "$0")/lib.sh"
unset LK_ALLOW_OVERSUBSCRIBE
cores=$(getconf _NPROCESSORS_ONLN)
too_many=$(( cores + 1 ))
[ "$cores" -ge 2 ] || export LK_ALLOW_OVERSUBSCRIBE=1 # the failing cell needs 2 ranks
mkdir -p "$T/tmp"
out=$(TMPDIR="$T/tmp" LK_NUM_THREADS=1 "$LK_BIN" bench train --model mlp --strategies ddp --devices 1 2 --batch-sizes 16 \
  --steps 10 --csv "$T/bench.csv" --plot "$T/bench.svg" -- --trainer.global_batch_size 48 2>"$T/stderr"); rc=$?
echo "$out"
check "bench train exits 1 when a cell failed (exit $rc)" test "$rc" = 1
check "the 1-device cell is measured" grep -Eq '^mlp +ddp +32-true +1 +16 +[0-9]+ +100\.0%' <<<"$out"
check "the failed cell reads failed with a short reason and a note number" \
  grep -Eq "^mlp +ddp +32-true +2 +16 +failed +\[1\] trainer.global_batch_size 48" <<<"$out"
check "no cell reads 0 samples/s or 0% scaling" bash -c '! grep -Eq "^mlp .* 0 +0\.0%" <<<"$1"' _ "$out"
check "the note gives the run's own message" \
  grep -Eq "^\[1\] mlp ddp 32-true x2 batch 16 failed: trainer.global_batch_size 48 is not a multiple of batch_size 16 x 2 ranks = 32\$" <<<"$out"
check "the runs' temporary directory is removed although a cell failed" bash -c "! ls -d '$T'/tmp/lkbench.* 2>/dev/null"
check "the CSV adds status, error and precision after the issue's columns" \
  grep -qx 'model,strategy,devices,batch_size,samples_per_s,scaling_efficiency,data_ms,forward_ms,backward_ms,comm_exposed_ms,optimizer_ms,status,error,precision,step_peak_mb,bubble,bubble_theory' "$T/bench.csv"
check "the CSV's ok cell has its numbers and status ok" grep -Eq '^mlp,ddp,1,16,[0-9.]+,1\.0000,([0-9.]+,){5}ok,,32-true,[0-9.]+,,$' "$T/bench.csv"
check "the CSV's failed cell has empty numbers, status failed and the message" \
  grep -Eq "^mlp,ddp,2,16,,,,,,,,failed,\"trainer.global_batch_size 48 is not a multiple" "$T/bench.csv"
check "recommendations follow the table and leave the failed cell out" bash -c \
  'grep -q "^recommendations (from the measured cells above):" <<<"$1" && grep -q "^  - best for mlp on this machine: ddp, 1 device, batch 16: " <<<"$1" && grep -q "^  - 1 of 2 cells failed and are left out" <<<"$1"' _ "$out"
check "--plot writes the throughput and the scaling chart" test -s "$T/bench.svg" -a -s "$T/bench-scaling.svg"
check "both charts name the failed cell instead of drawing it" bash -c \
  "grep -q 'not shown: 1 failed cell' '$T/bench.svg' && grep -q 'not shown: 1 failed cell' '$T/bench-scaling.svg' && ! grep -q 'ddp x2 batch 16: [0-9,]* samples/s</title>' '$T/bench.svg'"
if command -v rsvg-convert >/dev/null; then # the charts are valid SVG: a renderer reads them
  check "the charts render" bash -c "rsvg-convert '$T/bench.svg' -o '$T/a.png' && rsvg-convert '$T/bench-scaling.svg' -o '$T/b.png'"
fi
check "stderr names the failed cell and its reason" grep -q "mlp ddp 32-true x2 batch 16 failed: trainer.global_batch_size" "$T/stderr"
# a pipeline cell's measured bubble and its schedule's theory ((p-1)/(m+p-1) = 1/5 for p 2, m 4): in the
# table, the CSV and a recommendation; a cell without stages shows none
# (and `pipeline:interleaved_1f1b`, a schedule named in the strategy: 2 stages per rank, theory 1/9)
out=$(TMPDIR="$T/tmp" LK_NUM_THREADS=1 "$LK_BIN" bench train --model mlp --strategies pipeline pipeline:interleaved_1f1b \
  --devices 1 2 --batch-sizes 32 --steps 10 --csv "$T/pipe.csv" -- --trainer.pipeline.chunks 4 2>"$T/stderr3"); rc=$?
check "pipeline cells run (exit $rc)" test "$rc" = 0
check "the table gives the pipeline x2 cell's bubble against 20.0%" grep -Eq '^mlp +pipeline +32-true +2 +32 .* [0-9.]+/20\.0% ' <<<"$out"
check "the 1-device cell has no bubble" grep -Eq '^mlp +pipeline +32-true +1 +32 .* - +$' <<<"$out"
check "the CSV has the bubble and the theory" grep -Eq '^mlp,pipeline,2,32,.*,ok,,32-true,[0-9.]*,0\.[0-9]{4},0\.2000$' "$T/pipe.csv"
check "a recommendation names the bubble" grep -q "^  - pipeline's bubble (stages idle) against its schedule's theory: x2 batch 32 " <<<"$out"
check "the interleaved schedule's x2 cell, against its own theory 11.1%" \
  grep -Eq '^mlp +pipeline:interleaved_1f1b +32-true +2 +32 .* [0-9.]+/11\.1% ' <<<"$out"
check "the CSV names the schedule" grep -Eq '^mlp,pipeline:interleaved_1f1b,2,32,.*,ok,,32-true,[0-9.]*,0\.[0-9]{4},0\.1111$' "$T/pipe.csv"
# more devices than cores: said before anything runs, those cells not started, the others measured
unset LK_ALLOW_OVERSUBSCRIBE
out=$(TMPDIR="$T/tmp" LK_NUM_THREADS=1 "$LK_BIN" bench train --model mlp --strategies ddp independent --devices 1 "$too_many" \
  --batch-sizes 16 --steps 10 2>"$T/stderr2"); rc=$?
check "more devices than cores: exit 0, the cells that fit are measured (exit $rc)" bash -c \
  "test $rc = 0 && grep -Eq '^mlp +ddp +32-true +1 +16 +[0-9]+ ' <<<\"\$0\"" "$out"
check "more devices than cores is said up front, before the table" bash -c \
  "head -1 <<<\"\$0\" | grep -q 'bench train: --devices $too_many is more than the $cores CPU cores of this machine: its cells are skipped'" "$out"
check "no cell of $too_many devices is started" bash -c "! grep -Eq '^mlp +[a-z]+ +32-true +$too_many ' <<<\"\$0\" && ! grep -q 'x$too_many' '$T/stderr2'" "$out"
check "1-device cells of two strategies measure the noise, and the recommendations say it" \
  grep -q "^  - noise: cells this run measured twice .* differed by up to [0-9.]*%" <<<"$out"
check "no temporary directory is left behind" bash -c "! ls -d '$T'/tmp/lkbench.* 2>/dev/null"
expect_fail "only device counts above the cores is an error" 2 "no device count given fits the $cores CPU cores" \
  "$LK_BIN" bench train --model mlp --devices "$too_many" --batch-sizes 16 --steps 10
expect_fail "--gpus is accepted as --devices" 2 "an empty list, or --steps under 10" "$LK_BIN" bench train --gpus 1 2 --steps 5
# counts are whole numbers >= 1, checked before anything runs (a device count of 'x' used to run 0 devices)
expect_fail "--devices x is refused" 2 "--devices 'x' is not a whole number from 1 to" "$LK_BIN" bench train --devices 1 x
expect_fail "--batch-sizes 0 is refused" 2 "--batch-sizes '0' is not a whole number from 1 to" "$LK_BIN" bench train --batch-sizes 0
expect_fail "--steps 2x is refused" 2 "--steps '2x' is not a whole number from 1 to" "$LK_BIN" bench train --steps 2x
check "--help names --gpus" bash -c "'$LK_BIN' bench train --help | grep -q -- --gpus"
finish
