#!/usr/bin/env bash
# The launcher end to end: variables and output prefixes, exit status of the
# first failing rank, stopping the others, SIGKILL of a rank in the middle of
# a real all-reduce job, SIGTERM forwarding, SIGKILL of the launcher itself.
# --max-restarts (torchrun's elastic restart). Two jobs with one job id or
# MASTER_PORT. After each: no process of the job and no /dev/shm segment
# remain.
set -u
BIN=${LK_BIN:?LK_BIN must point to the lockstep binary}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() { # check "what" condition...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}
no_segment() { [ ! -e "/dev/shm/lockstep-$1" ]; }
gone() { # all pids gone (zombies of others do not count)
  for p in "$@"; do
    if kill -0 "$p" 2>/dev/null && [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" != Z ]; then return 1; fi
  done
  return 0
}
children_of() { pgrep -P "$1" | tr '\n' ' '; }

# 1. variables, prefixes, success
out=$("$BIN" launch -n 3 --master-port 29777 --job-id lt-vars-$$ -- sh -c \
  'echo "r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE p=$MASTER_PORT a=$MASTER_ADDR j=$LK_JOB_ID"' 2>&1)
rc=$?
check "launch succeeds" [ $rc = 0 ]
check "rank 0 unprefixed" grep -qx "r=0 w=3 l=0 lw=3 p=29777 a=127.0.0.1 j=lt-vars-$$" <<<"$out"
check "rank 2 prefixed" grep -qx "\[rank 2\] r=2 w=3 l=2 lw=3 p=29777 a=127.0.0.1 j=lt-vars-$$" <<<"$out"

# 2. exit status of the failing rank; usage errors
"$BIN" launch -n 2 --quiet -- sh -c 'exit $((RANK * 5))'
check "exit status of the failing rank" [ $? = 5 ]
"$BIN" launch -n 0 -- true 2>/dev/null
check "bad -n is a usage error" [ $? = 2 ]
"$BIN" launch -n 2 2>/dev/null
check "missing command is a usage error" [ $? = 2 ]
"$BIN" launch -n 1 -- /nonexistent/program 2>"$tmp/err"
check "exec failure reported" [ $? = 127 ]
check "exec failure names the program" grep -q "/nonexistent/program" "$tmp/err"

# 3. one rank fails, the others (sleeping) are stopped
start=$(date +%s.%N)
"$BIN" launch -n 3 -- sh -c 'if [ "$RANK" = 1 ]; then exit 7; fi; exec sleep 60' 2>"$tmp/err"
rc=$?
el=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN{printf "%.2f", a-b}')
check "failing rank's status (7)" [ $rc = 7 ]
check "others stopped within 10 s ($el s)" awk -v e="$el" 'BEGIN{exit !(e < 10)}'
check "launcher names the failing rank" grep -q "rank 1 (pid [0-9]*) exited with status 7" "$tmp/err"

# 4. SIGKILL of one rank in the middle of a long all-reduce (a real shm job)
job=lt-kill-$$
"$BIN" launch -n 2 --job-id $job -- "$BIN" bench comm --worker shm --min 32M --max 32M --iters 100000 \
  --out "$tmp/bench.csv" >"$tmp/out" 2>"$tmp/err" &
lpid=$!
kids=""
for i in $(seq 1 100); do kids=$(children_of $lpid); [ "$(wc -w <<<"$kids")" = 2 ] && break; sleep 0.05; done
sleep 2.0 # well inside the all-reduce loop
victim=$(awk '{print $2}' <<<"$kids")
start=$(date +%s.%N)
kill -9 "$victim"
wait $lpid
rc=$?
el=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN{printf "%.2f", a-b}')
check "job fails after SIGKILL of a rank (rc $rc)" [ $rc != 0 ]
check "job ends within 10 s ($el s)" awk -v e="$el" 'BEGIN{exit !(e < 10)}'
check "survivor names the dead rank and pid" grep -q "rank 1 (pid $victim) died" "$tmp/err"
check "survivor names the collective" grep -qE "(all_reduce|broadcast|barrier) #[0-9]+" "$tmp/err"
check "no process left" gone $kids
check "no segment left" no_segment $job

# 5. SIGTERM to the launcher is forwarded
job=lt-term-$$
"$BIN" launch -n 2 --job-id $job -- sleep 60 2>/dev/null &
lpid=$!
for i in $(seq 1 100); do kids=$(children_of $lpid); [ "$(wc -w <<<"$kids")" = 2 ] && break; sleep 0.05; done
kill -TERM $lpid
wait $lpid
rc=$?
check "SIGTERM forwarded, exit 143 (got $rc)" [ $rc = 143 ]
check "children gone after SIGTERM" gone $kids

# 6. SIGKILL of the launcher: children die with it (PR_SET_PDEATHSIG)
"$BIN" launch -n 2 -- sleep 60 &
lpid=$!
for i in $(seq 1 100); do kids=$(children_of $lpid); [ "$(wc -w <<<"$kids")" = 2 ] && break; sleep 0.05; done
kill -9 $lpid
wait $lpid 2>/dev/null
sleep 0.3
check "children die with the launcher" gone $kids

# 7. a real job: 2 ranks of bench comm, success, no segment
job=lt-ok-$$
"$BIN" launch -n 2 --quiet --job-id $job -- "$BIN" bench comm --worker shm --min 4K --max 1M --time 0.01 --out "$tmp/ok.csv"
check "bench worker job succeeds" [ $? = 0 ]
check "bench worker wrote rows" [ "$(grep -c '^shm' "$tmp/ok.csv")" -ge 4 ]
check "no segment after success" no_segment $job

# 8. bench comm --touch: the whole command, buffers rewritten before each call; a bad value is refused
out=$("$BIN" bench comm --backend shm --min 256K --max 1M --time 0.01 --repeat 1 --touch 1 --csv "$tmp/touch.csv" 2>&1)
check "bench comm --touch 1 runs and says so" grep -q "every buffer rewritten before each call" <<<"$out"
check "bench comm --touch 1 writes both shm rows per size" [ "$(grep -c '^shm' "$tmp/touch.csv")" = 4 ]
"$BIN" bench comm --touch 2 >/dev/null 2>"$tmp/touch.err"
check "bench comm --touch 2 is refused with exit 2" [ $? = 2 ]
# 8b. bench comm --op sendrecv: the ping-pong rows (8 B, x4 steps, and --max itself)
out=$("$BIN" bench comm --op sendrecv --backend shm --max 4K --time 0.01 --repeat 1 --csv "$tmp/pp.csv" 2>&1)
check "bench comm --op sendrecv runs and says so" grep -q "send/recv ping-pong, 2 ranks, 8..4096 bytes" <<<"$out"
check "bench comm --op sendrecv writes a shm-sendrecv row per size (8 32 128 512 2K 4K)" \
  [ "$(grep -c '^shm-sendrecv,2,' "$tmp/pp.csv")" = 6 ]
"$BIN" bench comm --op bogus >/dev/null 2>"$tmp/op.err"
check "bench comm --op bogus is refused with exit 2" [ $? = 2 ]
check "... saying what it expects" grep -q "touch expects 0 or 1, got '2'" "$tmp/touch.err"

# 9. --max-restarts: a failing rank restarts every rank with TORCHELASTIC_RESTART_COUNT 1, 2, ...;
#    restarts run out with the last attempt's status; a signal to the launcher is never restarted
job=lt-elastic-$$
"$BIN" launch -n 2 --max-restarts 3 --job-id $job -- sh -c \
  'echo "c=$TORCHELASTIC_RESTART_COUNT m=$TORCHELASTIC_MAX_RESTARTS j=$LK_JOB_ID"; [ "$TORCHELASTIC_RESTART_COUNT" -ge 2 ] || exit 3' \
  >"$tmp/el.out" 2>"$tmp/el.err"
rc=$?
check "restarted job succeeds on its 3rd attempt (rc $rc)" [ $rc = 0 ]
check "attempts see TORCHELASTIC_RESTART_COUNT 0, 1, 2" [ "$(grep -o '^c=[0-9]' "$tmp/el.out" | sort -u | tr '\n' ' ')" = "c=0 c=1 c=2 " ]
check "... and TORCHELASTIC_MAX_RESTARTS 3" grep -q "^c=2 m=3 j=$job-r2$" "$tmp/el.out"
check "the launcher says it restarts, twice" [ "$(grep -c 'restarting all 2 rank(s) (restart [12] of 3' "$tmp/el.err")" = 2 ]
check "no segment of any attempt left" no_segment $job && no_segment $job-r1 && no_segment $job-r2
"$BIN" launch -n 2 --max-restarts 1 --quiet -- sh -c 'exit 3' 2>"$tmp/el2.err"
rc=$?
check "restarts run out: the last attempt's status (rc $rc)" [ $rc = 3 ]
check "... after exactly 1 restart" [ "$(grep -c 'restarting all' "$tmp/el2.err")" = 1 ]
"$BIN" launch -n 2 --max-restarts 2 -- sleep 60 2>"$tmp/el3.err" &
lpid=$!
for i in $(seq 1 100); do kids=$(children_of $lpid); [ "$(wc -w <<<"$kids")" = 2 ] && break; sleep 0.05; done
kill -TERM $lpid
wait $lpid
rc=$?
check "SIGTERM to a --max-restarts launcher ends it (rc $rc), no restart" [ $rc = 143 ] && ! grep -q restarting "$tmp/el3.err"
"$BIN" launch -n 2 --max-restarts -1 -- true 2>/dev/null
check "--max-restarts -1 is a usage error" [ $? = 2 ]

# 10. two launches with the same --job-id started together (issue 43): exactly one job runs, the
#     other fails at once saying what clashed and what to change, and its launcher leaves the
#     winner's segment alone (the winner would then time out: both would fail). 5 trials.
job=lt-clash-$$
clash_ok=0; clash_msg=0
for trial in 1 2 3 4 5; do
  for j in a b; do
    "$BIN" launch -n 2 --quiet --job-id $job -- "$BIN" bench comm --worker shm --min 4K --max 64K --time 0.1 \
      --out "$tmp/clash-$j.csv" >"$tmp/clash-$j.out" 2>"$tmp/clash-$j.err" &
    eval "pid_$j=\$!"
  done
  wait $pid_a; rc_a=$?
  wait $pid_b; rc_b=$?
  if { [ $rc_a = 0 ] && [ $rc_b != 0 ]; } || { [ $rc_a != 0 ] && [ $rc_b = 0 ]; }; then clash_ok=$((clash_ok + 1)); fi
  loser=b; [ $rc_a != 0 ] && loser=a
  grep -q "job id '$job' is already in use on this host: pid [0-9]* holds it" "$tmp/clash-$loser.err" &&
    grep -q "start one of the jobs with another --job-id" "$tmp/clash-$loser.err" && clash_msg=$((clash_msg + 1))
  [ $trial = 1 ] && grep -m1 "already in use" "$tmp/clash-$loser.err" | sed 's/^/     /'
done
check "same --job-id twice: exactly one job completed in each of 5 trials ($clash_ok)" [ $clash_ok = 5 ]
check "... and the other named the clash, the holder's pid and --job-id ($clash_msg)" [ $clash_msg = 5 ]
check "... and no segment was left" no_segment $job

# 11. the same for two jobs started by hand with one MASTER_PORT and no LK_JOB_ID: never both
#     complete, a rank names the clash and MASTER_PORT, every rank ends by itself well before
#     comm_timeout (started together, both jobs usually fail: see docs/RELIABILITY.md).
port=$((20000 + $$ % 20000))
start=$(date +%s.%N)
pids=""
for j in a b; do
  for r in 0 1; do
    env -u LK_JOB_ID -u LK_JOB_NONCE RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port LK_COMM_TIMEOUT=20 "$BIN" bench comm --worker shm --min 4K --max 64K --time 0.1 \
      --out "$tmp/hand-$j.csv" >/dev/null 2>"$tmp/hand-$j$r.err" &
    pids="$pids $!"
  done
done
codes=""
for p in $pids; do wait $p; codes="$codes$?"; done
el=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN{printf "%.2f", a-b}')
check "same MASTER_PORT by hand: not both jobs completed (exit codes $codes)" [ "$codes" != 0000 ]
check "... a rank named the clash and MASTER_PORT" \
  grep -q "(derived from MASTER_PORT=$port).*give one of the jobs another MASTER_PORT" "$tmp"/hand-*.err
check "... every rank ended within 10 s ($el s)" awk -v e="$el" 'BEGIN{exit !(e < 10)}'
grep -h -m1 "MASTER_PORT=$port" "$tmp"/hand-*.err | head -1 | sed 's/^/     /'

[ $fail = 0 ] && echo "all launcher checks passed"
exit $fail
