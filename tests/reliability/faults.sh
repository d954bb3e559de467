#!/usr/bin/env bash
# Fault injection on whole training jobs through the CLI (ddp on 2 ranks):
# a rank SIGKILLed mid-training, a rank SIGSTOPped (comm_timeout), every
# rank SIGSTOPped past comm_timeout and resumed (the job must live on), the
# launcher SIGKILLed, SIGTERM and SIGINT to the launcher, a rank SIGKILLed
# while checkpoints are being written. For each: the job ends within its
# bound with a non-zero status and a message naming the rank; no process and
# no shared-memory segment of the job is left; the last checkpoint loads and
# a resume from it completes.
# docs/RELIABILITY.md's table comes from running this script 5 times.
# With strategy names as arguments (`faults.sh fsdp deepspeed_stage_2`):
# the rank-death scenarios under each sharded strategy instead, whose
# ranks spend the step in all-gathers and reduce-scatters.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
TIMEOUT=3
STRATEGY=ddp
job=(-c "$T/synth.yaml" --trainer.devices 2 --trainer.strategy ddp --trainer.max_epochs 100000
     --trainer.every_n_train_steps 20 --trainer.enable_progress_bar false --trainer.comm_timeout $TIMEOUT
     --trainer.num_sanity_val_steps 0 --data.init_args.num_samples 4096)

rank_pid() { # launcher pid, rank -> that rank's pid
  local c
  for c in $(pgrep -P "$1"); do
    if tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$c"; return; fi
  done
}

# start the job; wait until it has written a checkpoint (so there is one to resume from)
start_job() {
  before=$(latest 2>/dev/null || true)

  "$LK_BIN" fit "${job[@]}" >"$T/job.out" 2>"$T/job.err" &
  lpid=$!
  for _ in $(seq 1 3000); do
    d=$(latest 2>/dev/null || true)
    if [ -n "$d" ] && [ "$d" != "$before" ] && [ -s "$d/checkpoints/last.ckpt" ] && [ -n "$(rank_pid $lpid 1)" ]; then
      # the job's shared-memory segment is /dev/shm/lockstep-<job id>
      jobid=$(tr '\0' '\n' < "/proc/$(rank_pid $lpid 0)/environ" 2>/dev/null | sed -n 's/^LK_JOB_ID=//p' | tr -c 'A-Za-z0-9._\n-' '_')
      return 0
    fi
    sleep 0.01
  done
  return 1
}

# wait for the launcher; sets rc and secs (from the fault to the job's end)
finish_job() {
  wait "$lpid"; rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}

leftovers() { # prints what the job left behind, if anything
  # only this script's jobs (their config lives in $T): other checkouts may run this suite at the same time
  local kids; kids=$(pgrep -f "$T/synth.yaml.*comm_timeout $TIMEOUT" | grep -v "^$$\$" || true)
  [ -n "$kids" ] && echo "processes: $kids"
  # other tests may run beside this one: only this job's segment counts
  [ -n "${jobid:-}" ] && ls /dev/shm | grep -qxF "lockstep-$jobid" && echo "shm: lockstep-$jobid"
  true
}

resume_ok() { # the last checkpoint loads and training resumes from it
  "$LK_BIN" export --ckpt "$d/checkpoints/last.ckpt" --out "$T/x.st" >/dev/null 2>&1 &&
    "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.max_steps 1000000 --trainer.enable_progress_bar false \
      --ckpt_path "$d/checkpoints/last.ckpt" --trainer.devices 2 --trainer.strategy $STRATEGY --data.init_args.num_samples 4096 \
      >/dev/null 2>&1 || "$LK_BIN" fit -c "$T/synth.yaml" --trainer.enable_progress_bar false \
      --ckpt_path "$d/checkpoints/last.ckpt" --trainer.devices 2 --trainer.strategy $STRATEGY --data.init_args.num_samples 4096 \
      --trainer.max_epochs 100000 --trainer.max_time 2 >/dev/null 2>&1
}

scenario() { # name bound expected-rc-test message-pattern action...
  local name=$1 bound=$2 rccheck=$3 pat=$4; shift 4
  if ! start_job; then bad "$name: the job did not start"; kill -9 $lpid 2>/dev/null; return; fi
  t0=$(date +%s.%N)
  "$@"
  finish_job
  if [ -n "${net:-}" ]; then kill "$net" 2>/dev/null; wait "$net" 2>/dev/null; net=; fi
  sleep 0.3
  local left; left=$(leftovers)
  {
    check "$name: exit status ($rc) $rccheck" test "$rc" $rccheck
    check "$name: ended within ${bound}s (${secs}s)" awk -v s="$secs" -v b="$bound" 'BEGIN { exit !(s <= b) }'
    [ -n "$pat" ] && check "$name: message names it ('$pat')" grep -q -- "$pat" "$T/job.err"
    check "$name: the job's segment name is known" test -n "${jobid:-}"
    check "$name: nothing left behind ${left}" test -z "$left"
    check "$name: last checkpoint loads and resumes" resume_ok
  }
}

kill_rank() { kill -"$1" "$(rank_pid $lpid "$2")"; }
kill_launcher() { kill -"$1" "$lpid"; }
cont_all() { pkill -CONT -f "$T/synth.yaml.*comm_timeout $TIMEOUT" || true; }
# The safety net that continues a stopped rank if the job failed to end it
# must not outlive its scenario: fired later, its SIGCONT can reach the next
# scenario's job between the suspend's two SIGSTOPs, so that one rank runs
# on while the other stays stopped and times out waiting for it — the shape
# of a flake seen in CI (rank 0 gone before its SIGCONT, "timed out" in the
# log). scenario() kills it once its job has ended.
stop_rank1() { kill -STOP "$(rank_pid $lpid 1)"; (sleep $((TIMEOUT + 6)); cont_all) & net=$!; }

if [ $# -gt 0 ]; then
  base_job=("${job[@]}")
  for STRATEGY in "$@"; do
    job=("${base_job[@]}" --trainer.strategy "$STRATEGY")
    scenario "$STRATEGY: SIGKILL of rank 1 while training" 5 "-ne 0" "rank 1" kill_rank KILL 1
    scenario "$STRATEGY: SIGKILL of rank 0 while training" 5 "-ne 0" "rank 0" kill_rank KILL 0
    scenario "$STRATEGY: SIGSTOP of rank 1 (comm_timeout ${TIMEOUT}s)" $((TIMEOUT + 6)) "-ne 0" "did not arrive" stop_rank1
  done
  finish
  exit
fi

scenario "SIGKILL of rank 1 while training" 5 "-ne 0" "rank 1" kill_rank KILL 1
# a stopped rank cannot take SIGTERM: the launcher's term delay (2 s) and kill grace (3 s) follow the timeout
scenario "SIGSTOP of rank 1 (comm_timeout ${TIMEOUT}s)" $((TIMEOUT + 6)) "-ne 0" "did not arrive" stop_rank1
# Suspending the whole job: every rank stopped for comm_timeout + 2 s (rank 1
# 50 ms before rank 0, so rank 0 is waiting for it), continued (rank 0 first,
# as a scheduler signals one process at a time), then the job must still
# train: it ends only by our SIGTERM (143).
# The ranks' states (/proc/PID/stat: T = stopped) just after the stops and
# just before the SIGCONT go into $T/suspend.states: if this scenario ever
# fails again, the log says whether both ranks really stayed stopped.
pstate() { local s; s=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1); echo "${s:-gone}"; }
suspend_all() {
  local r0 r1; r0=$(rank_pid $lpid 0); r1=$(rank_pid $lpid 1)
  kill -STOP "$r1"; sleep 0.05; kill -STOP "$r0"
  sleep 0.2; echo "stopped: rank 0 $(pstate "$r0"), rank 1 $(pstate "$r1")" >"$T/suspend.states"
  sleep $((TIMEOUT + 2)); echo "before SIGCONT: rank 0 $(pstate "$r0"), rank 1 $(pstate "$r1")" >>"$T/suspend.states"
  kill -CONT "$r0"; sleep 0.1; kill -CONT "$r1"
  sleep 2; kill -0 "$r0" "$r1" 2>/dev/null && kill -TERM "$lpid"
}
scenario "SIGSTOP of every rank for $((TIMEOUT + 2))s, then SIGCONT" $((TIMEOUT + 14)) "-eq 143" "" suspend_all
if ! grep -q 'timed out' "$T/job.err"; then ok "suspend: no rank timed out after the resume"
else
  bad "suspend: no rank timed out after the resume"
  sed 's/^/     /' "$T/suspend.states" "$T/job.err"
fi
scenario "SIGKILL of the launcher" 5 "-eq 137" "" kill_launcher KILL
scenario "SIGTERM to the launcher" 10 "-eq 143" "" kill_launcher TERM
scenario "SIGINT to the launcher" 10 "-eq 130" "" kill_launcher INT
checkpoint_storm() { # rank 0 dies while checkpoints are written every step
  kill -KILL "$(rank_pid $lpid 0)"
}
job+=(--trainer.every_n_train_steps 1)
scenario "SIGKILL of rank 0 while writing checkpoints" 5 "-ne 0" "rank 0" checkpoint_storm

finish
