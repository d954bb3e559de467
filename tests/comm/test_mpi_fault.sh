#!/usr/bin/env bash
# Faults under mpirun with the mpi backend. A failed job must end: after any
# communicator failure the process aborts the MPI job (MPI_Abort) instead of
# a collective MPI_Finalize that a stopped peer would block forever.
#  1. a desync: every rank fails, then the job is aborted (non-zero exit).
#  2. `lockstep fit` on 2 ranks, rank 1 SIGSTOPped while training: rank 0
#     times out after comm_timeout (3 s) and the whole job, the stopped rank
#     included, is gone within comm_timeout + 10 s.
#  3. the same, rank 1 SIGKILLed: mpirun ends the job (SIGTERM, then SIGKILL
#     a second later), and rank 0 first says which rank died and in which
#     collective (OpenMPI alone prints only its own notice).
#  4. point-to-point: a receive of another size (named by the receiver at
#     once) and a send whose receive never comes (at a 1 s timeout); the
#     failed communicators then end the job with MPI_Abort.
#  5. point-to-point: a rank SIGKILLed mid-send; the receiver names the
#     pair and the dead rank within 5 s, and mpirun ends the job.
#  6. a rank that dies inside lk_comm_split is named by the other.
# Environment (from ctest): LK_BIN, LK_MPIRUN, LK_MPIRUN_FLAGS, LK_TEST_DIST_MPI.
source "$(dirname "$0")/../cli/lib.sh"
read -r -a flags <<<"${LK_MPIRUN_FLAGS:-}"
TIMEOUT=3
BOUND=$((TIMEOUT + 10))

# runs "$@" with a hard deadline; sets rc and secs
run_bounded() { # deadline command...
  local deadline=$1; shift
  local t0; t0=$(date +%s.%N)
  timeout -s KILL "$deadline" "$@" >"$T/out" 2>&1; rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}

# 1. desync
run_bounded 60 "$LK_MPIRUN" "${flags[@]}" -np 2 "$LK_TEST_DIST_MPI" desync
check "desync: the job exits non-zero (rc $rc)" test "$rc" -ne 0
# Both ranks pass their checks and return 0 from main, so a non-zero job
# status can only come from the MPI_Abort at exit (MPI_Finalize would give 0).
# mpirun's "MPI_ABORT was invoked" text is not asserted: when both ranks
# abort at once, OpenMPI 4.1 sometimes loses it ("ORTE_ERROR_LOG: Data
# unpack would read past end of buffer in ... show_help.c"), 1 run in ~10
# under load here.
check "desync: ended by MPI_Abort, not a hang (${secs}s, rc $rc, both ranks passed)" \
  bash -c "[ '$rc' -ne 0 ] && [ \$(grep -c '^1 passed, 0 failed' '$T/out') = 2 ] && awk -v s='$secs' 'BEGIN { exit !(s < 30) }'"
check "desync: the checks passed on the ranks" grep -q "^ok   desync_under_mpirun" "$T/out"
check "desync: no check failed" bash -c "! grep -q '^FAIL' '$T/out'"

# 2. a stopped rank in `lockstep fit`
write_synth
marker="$T/synth.yaml"
"$LK_MPIRUN" "${flags[@]}" -np 2 -x LK_COMM_BACKEND=mpi "$LK_BIN" fit -c "$marker" --trainer.devices 2 \
  --trainer.strategy ddp --trainer.max_epochs 100000 --trainer.every_n_train_steps 20 \
  --trainer.enable_progress_bar false --trainer.comm_timeout $TIMEOUT --trainer.num_sanity_val_steps 0 \
  --data.init_args.num_samples 4096 >"$T/fit.out" 2>&1 &
mpid=$!

rank_pid() { # rank -> pid of that rank of this job
  local p
  for p in $(pgrep -f -- "$marker"); do
    [ "$p" = "$mpid" ] && continue
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then echo "$p"; return; fi
  done
}
started=""
for _ in $(seq 1 3000); do
  if ls "$T"/runs/lightning_logs/version_*/checkpoints/last.ckpt >/dev/null 2>&1 && [ -n "$(rank_pid 1)" ]; then
    started=yes; break
  fi
  kill -0 $mpid 2>/dev/null || break
  sleep 0.01
done
check "stall: the job started training (a checkpoint was written)" test -n "$started"
r1=$(rank_pid 1)
t0=$(date +%s.%N)
[ -n "$r1" ] && kill -STOP "$r1"
# wait for mpirun, at most BOUND + 20 s, then clean up whatever is left
for _ in $(seq 1 $(((BOUND + 20) * 20))); do kill -0 $mpid 2>/dev/null || break; sleep 0.05; done
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
alive=""
kill -0 $mpid 2>/dev/null && alive=yes
left=$(pgrep -f -- "$marker" | tr '\n' ' ')
for p in $left $mpid; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
wait $mpid 2>/dev/null; rc=$?
check "stall: mpirun ended within comm_timeout + 10 s = ${BOUND}s (${secs}s)" \
  awk -v s="$secs" -v b="$BOUND" -v a="$alive" 'BEGIN { exit !(a == "" && s <= b) }'
check "stall: exit status non-zero ($rc)" test "$rc" -ne 0
check "stall: rank 0 says the collective timed out" grep -q "in MPI; some rank did not arrive" "$T/fit.out"
check "stall: no process of the job left (${left:-none})" test -z "$left"
grep -m1 "timed out after" "$T/fit.out" | sed 's/^/     /'
echo "     job ended ${secs}s after SIGSTOP of rank 1"
[ "$fail" = 0 ] || sed "s/^/     fit: /" "$T/fit.out" >&2

# 3. a killed rank in `lockstep fit`
rm -rf "$T/runs"
"$LK_MPIRUN" "${flags[@]}" -np 2 -x LK_COMM_BACKEND=mpi "$LK_BIN" fit -c "$marker" --trainer.devices 2 \
  --trainer.strategy ddp --trainer.max_epochs 100000 --trainer.every_n_train_steps 20 \
  --trainer.enable_progress_bar false --trainer.comm_timeout 30 --trainer.num_sanity_val_steps 0 \
  --data.init_args.num_samples 4096 >"$T/kill.out" 2>&1 &
mpid=$!
started=""
for _ in $(seq 1 3000); do
  if ls "$T"/runs/lightning_logs/version_*/checkpoints/last.ckpt >/dev/null 2>&1 && [ -n "$(rank_pid 1)" ]; then
    started=yes; break
  fi
  kill -0 $mpid 2>/dev/null || break
  sleep 0.01
done
check "kill: the job started training" test -n "$started"
r1=$(rank_pid 1)
t0=$(date +%s.%N)
[ -n "$r1" ] && kill -KILL "$r1"
for _ in $(seq 1 400); do kill -0 $mpid 2>/dev/null || break; sleep 0.05; done
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
left=$(pgrep -f -- "$marker" | tr '\n' ' ')
for p in $left $mpid; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
wait $mpid 2>/dev/null; rc=$?
check "kill: mpirun ended within 10 s (${secs}s), exit status non-zero ($rc)" \
  awk -v s="$secs" -v r="$rc" 'BEGIN { exit !(s <= 10 && r != 0) }'
check "kill: rank 0 names the dead rank, its pid and the collective" \
  grep -qE "\[rank 0\] (all_reduce|broadcast|barrier|all_gather) #[0-9]+ .*failed: rank 1 \(pid $r1\) died" "$T/kill.out"
grep -m1 "died" "$T/kill.out" | sed 's/^/     /'
[ "$fail" = 0 ] || sed "s/^/     kill: /" "$T/kill.out" >&2

# 4. point-to-point faults
run_bounded 60 "$LK_MPIRUN" "${flags[@]}" -np 2 "$LK_TEST_DIST_MPI" p2pfault
check "p2p: both ranks' checks passed (${secs}s, rc $rc)" \
  bash -c "[ \$(grep -c '^p2pfault: rank [01]: 0 failed checks' '$T/out') = 2 ] && awk -v s='$secs' 'BEGIN { exit !(s < 30) }'"
check "p2p: the job was aborted, not finalized (rc $rc)" test "$rc" -ne 0
[ "$fail" = 0 ] || sed "s/^/     p2p: /" "$T/out" >&2
# 5. point-to-point: rank 0 SIGKILLed while it sends to rank 1, which is
#    receiving: rank 1 names the pair and the dead rank within 5 s of the
#    kill, and mpirun ends the job.
"$LK_MPIRUN" "${flags[@]}" -np 2 "$LK_TEST_DIST_MPI" p2pkill >"$T/p2pkill.out" 2>&1 &
mpid=$!
started=""
for _ in $(seq 1 3000); do # until rank 1 has received 20 messages, at most 30 s
  grep -q "^p2pkill: traffic flowing" "$T/p2pkill.out" 2>/dev/null && { started=yes; break; }
  kill -0 $mpid 2>/dev/null || break
  sleep 0.01
done
check "p2p kill: the ranks were exchanging messages" test -n "$started"
r0=""
for p in $(pgrep -f -- "$LK_TEST_DIST_MPI p2pkill"); do
  [ "$p" = "$mpid" ] && continue
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && r0=$p
done
t_kill=$(date +%s.%N)
[ -n "$r0" ] && kill -KILL "$r0"
for _ in $(seq 1 400); do kill -0 $mpid 2>/dev/null || break; sleep 0.05; done
secs=$(awk -v a="$t_kill" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
left=$(pgrep -f -- "$LK_TEST_DIST_MPI p2pkill" | tr '\n' ' ')
for p in $left $mpid; do kill -KILL "$p" 2>/dev/null; done
wait $mpid 2>/dev/null; rc=$?
line=$(grep -m1 "^p2pkill: rank 1 failed at" "$T/p2pkill.out")
t_fail=$(awk '{ print $6 }' <<<"$line" | tr -d ':')
check "p2p kill: rank 1 names the pair and the dead rank (pid ${r0:-?})" \
  grep -qE "recv #[0-9]+ by rank 1 from rank 0 .*failed: rank 0 \(pid ${r0:-x}\) died" "$T/p2pkill.out"
check "p2p kill: rank 1 failed within 5 s of the kill" \
  awk -v a="$t_kill" -v b="${t_fail:-0}" 'BEGIN { exit !(b > 0 && b - a <= 5) }'
check "p2p kill: rank 1's checks passed" grep -q "^1 passed, 0 failed" "$T/p2pkill.out"
check "p2p kill: mpirun ended within 20 s (${secs}s), exit status non-zero ($rc), nothing left (${left:-none})" \
  awk -v s="$secs" -v r="$rc" -v l="$left" 'BEGIN { exit !(s <= 20 && r != 0 && l == "") }'
[ -n "$line" ] && echo "     $line (killed at $t_kill)"
[ "$fail" = 0 ] || sed "s/^/     p2pkill: /" "$T/p2pkill.out" >&2
# 6. lk_comm_split: rank 1 dies after the ranks agreed on the groups, just
#    before MPI_Comm_split (LK_COMM_TEST_SPLIT_KILL): rank 0 names it within
#    5 s instead of blocking in MPI_Comm_split (holding the MPI lock) until
#    mpirun kills it without a word.
run_bounded 60 "$LK_MPIRUN" "${flags[@]}" -np 2 -x LK_COMM_TEST_SPLIT_KILL=1 "$LK_TEST_DIST_MPI" splitkill
check "split kill: rank 0 names the dead rank within 5 s (job ${secs}s, rc $rc)" \
  bash -c "grep -q '^1 passed, 0 failed' '$T/out' && grep -q '^splitkill: rank 0 after' '$T/out' && [ '$rc' -ne 0 ]"
grep -m1 "^splitkill:" "$T/out" | sed 's/^/     /'
[ "$fail" = 0 ] || sed "s/^/     splitkill: /" "$T/out" >&2
finish
