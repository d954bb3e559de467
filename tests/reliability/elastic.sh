#!/usr/bin/env bash
# Elastic restart: `lockstep launch --max-restarts 5` of a ddp job on 2 ranks
# whose ranks are SIGKILLed 5 times, each time a random rank at a random
# moment after the current attempt's first checkpoint. Every restart starts
# all ranks again with TORCHELASTIC_RESTART_COUNT = 1..5 and the trainer
# resumes from the newest last.ckpt by itself; the job exits 0 and its final
# weights and optimizer state equal an uninterrupted run's, bitwise. Then
# the same through `lockstep fit` (its own ranks) with LK_MAX_RESTARTS=1.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
KILLS=5
args=(-c "$T/synth.yaml" --trainer.devices 2 --trainer.strategy ddp --trainer.max_epochs 12
      --trainer.every_n_train_steps 3 --trainer.enable_progress_bar false --trainer.num_sanity_val_steps 0
      --data.init_args.num_samples 2048)
final_state() { "$LK_BIN" export --ckpt "$1/checkpoints/last.ckpt" --out "$2" --with-optimizer >/dev/null; }

# the reference: uninterrupted
"$LK_BIN" launch -n 2 --quiet -- "$LK_BIN" fit "${args[@]}" >"$T/ref.log" 2>&1
check "uninterrupted run succeeds" test $? = 0
final_state "$(latest)" "$T/ref.st"

attempt_rank_pid() { # launcher pid, attempt, rank -> pid
  local c e
  for c in $(pgrep -P "$1"); do
    e=$(tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null)
    if grep -qx "RANK=$3" <<<"$e" && grep -qx "TORCHELASTIC_RESTART_COUNT=$2" <<<"$e"; then echo "$c"; return; fi
  done
}

# the interrupted one (each step sleeps 20 ms, so every attempt lives long enough to be killed)
seed=${ELASTIC_SEED:-$RANDOM}
RANDOM=$seed
echo "random seed $seed (ELASTIC_SEED=$seed reproduces the choices)"
t_start=$(date +%s.%N)
LK_TEST_STEP_DELAY_MS=20 "$LK_BIN" launch -n 2 --max-restarts $KILLS -- "$LK_BIN" fit "${args[@]}" >"$T/job.out" 2>"$T/job.err" &
lpid=$!
killed=0
for attempt in $(seq 0 $((KILLS - 1))); do
  before=$(latest 2>/dev/null || true)
  pid=""
  for _ in $(seq 1 3000); do # this attempt's ranks are up and it has written a checkpoint
    d=$(latest 2>/dev/null || true)
    pid=$(attempt_rank_pid $lpid $attempt 1)
    [ -n "$pid" ] && [ -n "$d" ] && [ "$d" != "$before" ] && [ -s "$d/checkpoints/last.ckpt" ] && break
    pid=""
    sleep 0.01
  done
  [ -z "$pid" ] && break
  sleep "0.$((RANDOM % 40))" # 0..0.39 s later: mid-step, mid-checkpoint, anywhere
  r=$((RANDOM % 2))
  pid=$(attempt_rank_pid $lpid $attempt $r)
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null && killed=$((killed + 1)) && echo "attempt $attempt: killed rank $r (pid $pid)"
done
wait $lpid; rc=$?
secs=$(awk -v a="$t_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "interrupted job: ${secs}s wall, exit status $rc"
check "$KILLS ranks were killed ($killed)" test "$killed" = $KILLS
check "the job succeeded after them (exit status $rc)" test "$rc" = 0
check "the launcher restarted it $KILLS times" test "$(grep -c 'restarting all 2 rank(s)' "$T/job.err")" = $KILLS
check "every restart resumed from a checkpoint" test "$(cat "$T/job.out" "$T/job.err" | grep -c '^resumed from ')" = $KILLS
final_state "$(latest)" "$T/elastic.st"
check "final weights and optimizer state equal the uninterrupted run's, bitwise" cmp -s "$T/ref.st" "$T/elastic.st"
check "no temporary file of a killed writer is left" test -z "$(find "$T/runs" -name '*.tmp.*')"

# The same through `lockstep fit` launching its own ranks: LK_MAX_RESTARTS=1, one kill of rank 1.
before=$(latest)
LK_MAX_RESTARTS=1 LK_TEST_STEP_DELAY_MS=20 "$LK_BIN" fit "${args[@]}" >"$T/fit.out" 2>"$T/fit.err" &
fpid=$!
pid=""
for _ in $(seq 1 3000); do
  d=$(latest); pid=$(attempt_rank_pid $fpid 0 1)
  [ -n "$pid" ] && [ "$d" != "$before" ] && [ -s "$d/checkpoints/last.ckpt" ] && break
  pid=""; sleep 0.01
done
[ -n "$pid" ] && kill -KILL "$pid"
wait $fpid; rc=$?
check "fit with LK_MAX_RESTARTS=1: rank 1 was killed" test -n "$pid"
check "fit with LK_MAX_RESTARTS=1: restarted once and succeeded (exit status $rc)" \
  test "$rc" = 0 -a "$(grep -c 'restarting all 2 rank(s)' "$T/fit.err")" = 1
final_state "$(latest)" "$T/fit.st"
check "fit with LK_MAX_RESTARTS=1: final state equals the uninterrupted run's, bitwise" cmp -s "$T/ref.st" "$T/fit.st"
finish
