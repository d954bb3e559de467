#!/usr/bin/env bash
# `lockstep bench train` with a cell that cannot run (more devices than this
# machine has cores): the cell is shown as failed with its reason in the
# table, a note, the CSV's status/error columns and the charts' notes, never
# as 0 samples/s or 0% scaling; the ok cells still get their numbers and the
# recommendations. --gpus is the same option as --devices.
. "$(dirname "$0")/lib.sh"
unset LK_ALLOW_OVERSUBSCRIBE
too_many=$(( $(getconf _NPROCESSORS_ONLN) + 1 ))
out=$(LK_NUM_THREADS=1 "$LK_BIN" bench train --model mlp --strategies ddp --devices 1 "$too_many" --batch-sizes 16 \
  --steps 10 --csv "$T/bench.csv" --plot "$T/bench.svg" 2>"$T/stderr"); rc=$?
echo "$out"
check "bench train exits 1 when a cell failed (exit $rc)" test "$rc" = 1
check "the 1-device cell is measured" grep -Eq '^mlp +ddp +32-true +1 +16 +[0-9]+ +100\.0%' <<<"$out"
check "the failed cell reads failed with a short reason and a note number" \
  grep -Eq "^mlp +ddp +32-true +$too_many +16 +failed +\[1\] more devices than cores\$" <<<"$out"
check "no cell reads 0 samples/s or 0% scaling" bash -c '! grep -Eq "^mlp .* 0 +0\.0%" <<<"$1"' _ "$out"
check "the note gives the run's own message and its log" \
  grep -Eq "^\[1\] mlp ddp 32-true x$too_many batch 16 failed: trainer.devices=$too_many is more than the [0-9]+ CPU cores available on this machine .*\(log: /tmp/.*\.log\)\$" <<<"$out"
check "the note's log file exists" test -s "$(grep -o '(log: [^)]*' <<<"$out" | cut -c7-)"
check "the CSV adds status, error and precision after the issue's columns" \
  grep -qx 'model,strategy,devices,batch_size,samples_per_s,scaling_efficiency,data_ms,forward_ms,backward_ms,comm_exposed_ms,optimizer_ms,status,error,precision,step_peak_mb' "$T/bench.csv"
check "the CSV's ok cell has its numbers and status ok" grep -Eq '^mlp,ddp,1,16,[0-9.]+,1\.0000,([0-9.]+,){5}ok,,32-true,[0-9.]+$' "$T/bench.csv"
check "the CSV's failed cell has empty numbers, status failed and the message" \
  grep -Eq "^mlp,ddp,$too_many,16,,,,,,,,failed,\"trainer.devices=$too_many is more than the [0-9]+ CPU cores" "$T/bench.csv"
check "recommendations follow the table and leave the failed cell out" bash -c \
  'grep -q "^recommendations (from the measured cells above):" <<<"$1" && grep -q "^  - best for mlp on this machine: ddp, 1 device, batch 16: " <<<"$1" && grep -q "^  - 1 of 2 cells failed and are left out" <<<"$1"' _ "$out"
check "--plot writes the throughput and the scaling chart" test -s "$T/bench.svg" -a -s "$T/bench-scaling.svg"
check "both charts name the failed cell instead of drawing it" bash -c \
  "grep -q 'not shown: 1 failed cell' '$T/bench.svg' && grep -q 'not shown: 1 failed cell' '$T/bench-scaling.svg' && ! grep -q 'ddp x$too_many batch 16: [0-9,]* samples/s</title>' '$T/bench.svg'"
if command -v rsvg-convert >/dev/null; then # the charts are valid SVG: a renderer reads them
  check "the charts render" bash -c "rsvg-convert '$T/bench.svg' -o '$T/a.png' && rsvg-convert '$T/bench-scaling.svg' -o '$T/b.png'"
fi
check "stderr names the failed cell and its reason" grep -q "mlp ddp 32-true x$too_many batch 16 failed: trainer.devices" "$T/stderr"
# --gpus is parsed as --devices (the usage error comes after the lists are read)
expect_fail "--gpus is accepted as --devices" 2 "an empty list, or --steps under 10" "$LK_BIN" bench train --gpus 1 2 --steps 5
# counts are whole numbers >= 1, checked before anything runs (a device count of 'x' used to run 0 devices)
expect_fail "--devices x is refused" 2 "--devices 'x' is not a whole number from 1 to" "$LK_BIN" bench train --devices 1 x
expect_fail "--batch-sizes 0 is refused" 2 "--batch-sizes '0' is not a whole number from 1 to" "$LK_BIN" bench train --batch-sizes 0
expect_fail "--steps 2x is refused" 2 "--steps '2x' is not a whole number from 1 to" "$LK_BIN" bench train --steps 2x
check "--help names --gpus" bash -c "'$LK_BIN' bench train --help | grep -q -- --gpus"
rm -rf "$(grep -o '(log: [^)]*' <<<"$out" | cut -c7- | xargs dirname)"
finish
