#!/usr/bin/env bash
# Trainer and launcher faults that users meet through the CLI:
# - SIGHUP (a closed terminal or ssh session) stops a run like SIGTERM: the
#   step finishes, last.ckpt is written, the message says so, exit 129;
# - SIGUSR1 (SLURM's preemption warning, sent to the launcher) does the same
#   on every rank (exit 138), and the requeued job (SLURM_RESTART_COUNT=1)
#   resumes from that checkpoint by itself;
# - a rank's error line names its rank once ("[rank 1] lockstep fit: error:");
# - the closing "logs:" line names a file or directory that exists, also on a
#   run too short to have written metrics.csv;
# - a NaN loss on one rank of two ends the job at once, and the other rank's
#   error quotes that rank's.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
base=(-c "$T/synth.yaml" --trainer.enable_progress_bar false --trainer.num_sanity_val_steps 0
      --trainer.max_epochs 1000 --trainer.every_n_train_steps 2 --data.init_args.num_samples 4096)

# start_run OUT ERR ARGS...: starts a fit in the background (pid in $job), waits for its first checkpoint
start_run() {
  local out=$1 err=$2; shift 2
  before=$(latest 2>/dev/null || true)
  LK_TEST_STEP_DELAY_MS=20 "$LK_BIN" fit "${base[@]}" "$@" >"$out" 2>"$err" &
  job=$!
  for _ in $(seq 1 3000); do
    d=$(latest 2>/dev/null || true)
    if [ -n "$d" ] && [ "$d" != "$before" ] && [ -s "$d/checkpoints/last.ckpt" ]; then return 0; fi
    sleep 0.01
  done
  return 1
}

# 1. SIGHUP to a single-process run
if start_run "$T/hup.out" "$T/hup.err"; then
  kill -HUP "$job"; wait "$job"; rc=$?
  check "SIGHUP: exit status 129 (got $rc)" test "$rc" = 129
  check "SIGHUP: says it stopped after writing last.ckpt" grep -q "stopped by signal 1 after writing last.ckpt" "$T/hup.err"
  check "SIGHUP: last.ckpt is there" test -s "$d/checkpoints/last.ckpt"
else bad "SIGHUP: the run did not start"; kill -9 "$job" 2>/dev/null; fi

# 2. SIGUSR1 to the launcher of a ddp run (lockstep fit launches its own 2 ranks)
if start_run "$T/usr1.out" "$T/usr1.err" --trainer.devices 2 --trainer.strategy ddp; then
  kill -USR1 "$job"; wait "$job"; rc=$?
  check "SIGUSR1: exit status 138 (got $rc)" test "$rc" = 138
  check "SIGUSR1: rank 0 says it stopped after writing last.ckpt" grep -q "^lockstep fit: error: \[rank 0\] stopped by signal 10 after writing last.ckpt" "$T/usr1.err"
  check "SIGUSR1: rank 1 too" grep -q "^\[rank 1\] lockstep fit: error: stopped by signal 10" "$T/usr1.err"
  preempted=$d
  # the requeued job: same command, SLURM_RESTART_COUNT=1, no --ckpt_path
  SLURM_RESTART_COUNT=1 "$LK_BIN" fit "${base[@]}" --trainer.devices 2 --trainer.strategy ddp --trainer.max_epochs 1 \
    >"$T/requeue.out" 2>"$T/requeue.err"
  rc=$?
  check "requeued job: exits 0 (got $rc)" test "$rc" = 0
  check "requeued job: resumes from the preempted run's last.ckpt" grep -q "resumed from $preempted/checkpoints/last.ckpt" "$T/requeue.out" "$T/requeue.err"
else bad "SIGUSR1: the run did not start"; kill -9 "$job" 2>/dev/null; fi

# 3. a rank's error names its rank once
"$LK_BIN" fit "${base[@]}" --trainer.devices 2 --trainer.strategy ddp --ckpt_path "$T/none.ckpt" >/dev/null 2>"$T/prefix.err"
check "rank 1's error starts with its rank" grep -q "^\[rank 1\] lockstep fit: error: ckpt_path: cannot read" "$T/prefix.err"
check "no line names its rank twice" bash -c "! grep -q '\[rank \([0-9]*\)\].*\[rank \1\]' '$T/prefix.err'"

# 4. "logs:" names what exists (20 steps, metrics written every 50, no validation: no metrics.csv)
"$LK_BIN" fit "${base[@]}" --trainer.max_epochs 1 --trainer.max_steps 20 --trainer.log_every_n_steps 50 \
  --trainer.limit_val_batches 0 >"$T/logs.out" 2>&1
logs=$(sed -n 's/^logs: *//p' "$T/logs.out" | tail -1)
check "the logs line is printed ($logs)" test -n "$logs"
check "the logs line names something that exists" test -e "$logs"

# 5. one rank's loss is NaN (LK_TEST_LOSS_NAN=RANK:STEP) while the other's is
#    finite: the job ends at once, that rank names the step, and the other
#    rank names that rank and quotes its error instead of suspecting a
#    desync; no rank is left running
for r in 0 1; do
  o=$((1 - r))
  s0=$(date +%s.%N)
  LK_TEST_LOSS_NAN=$r:3 timeout 60 "$LK_BIN" fit "${base[@]}" --trainer.max_epochs 1 --trainer.devices 2 \
    --trainer.strategy ddp --trainer.comm_timeout 30 >/dev/null 2>"$T/nan$r.err"
  rc=$?
  secs=$(awk -v a="$s0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  check "nan on rank $r: the job fails (exit $rc), not by timeout" test "$rc" -ne 0 -a "$rc" -ne 124
  check "nan on rank $r: ended in ${secs}s, well inside comm_timeout (30 s)" awk -v s="$secs" 'BEGIN { exit !(s < 20) }'
  check "nan on rank $r: it names the step" grep -q "the loss is nan at step 3" "$T/nan$r.err"
  check "nan on rank $r: rank $o quotes it" \
    grep -q "\[rank $o\].*rank $r (pid [0-9]*) stopped after [0-9]* collectives, on an error of its own: the loss is nan at step 3" "$T/nan$r.err"
done
left=$(pgrep -f "$T/synth.yaml" || true)
check "nan on one rank: no rank left running ($left)" test -z "$left"

finish
