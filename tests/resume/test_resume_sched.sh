#!/usr/bin/env bash
# Exact resume with learning-rate schedulers: a run stopped inside an epoch
# (SIGTERM, SIGUSR1 and the requeued job's automatic resume, max_steps)
# and resumed ends with bitwise the same weights, optimizer and scheduler
# state as an uninterrupted run, and the stopped run's metrics rows
# followed by the resumed run's are the uninterrupted run's: no partial
# epoch row, none twice. Schedulers stepped per epoch (cosine, StepLR), per
# step (cosine) and by a monitored metric (ReduceLROnPlateau), with a
# validation in the middle of each epoch (val_check_interval 0.5) and step
# checkpoints; single process, and ddp on 2 ranks for cosine.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
common=(--trainer.max_epochs 3 --trainer.every_n_train_steps 5 --trainer.enable_progress_bar false
        --trainer.val_check_interval 0.5 --trainer.log_every_n_steps 3 --trainer.num_sanity_val_steps 0
        --trainer.enable_tensorboard false --data.init_args.num_samples 1024)

final_state() { "$LK_BIN" export --ckpt "$1/checkpoints/last.ckpt" --out "$2" --with-optimizer >/dev/null; }

# rows A B...: metrics.csv rows of run A against those of B, C... in turn
# (each file's columns are its own: rows are compared as name=value sets)
same_rows() {
  python3 - "$@" <<'PY'
import csv, sys
def rows(paths):
    return [tuple(sorted((k, v) for k, v in r.items() if v != "")) for p in paths for r in csv.DictReader(open(p))]
a, b = rows(sys.argv[1:2]), rows(sys.argv[2:])
if a != b:
    for i, (x, y) in enumerate(zip(a + [()] * len(b), b + [()] * len(a))):
        if x != y:
            print(f"row {i}: uninterrupted {x}\n       stopped+resumed {y}", file=sys.stderr); break
    sys.exit(1)
PY
}

# wait_ckpt DIR_BEFORE: the new run's directory once its first step checkpoint exists
wait_ckpt() {
  local d=""
  for _ in $(seq 1 6000); do
    d=$(latest)
    [ "$d" != "$1" ] && [ -s "$d/checkpoints/last.ckpt" ] && break
    sleep 0.005
  done
  echo "$d"
}

run_case() {
  local name=$1; shift
  local extra=("$@")
  "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" >"$T/$name.full.log" 2>&1
  local full; full=$(latest); final_state "$full" "$T/$name.full.st"

  # max_steps: inside an epoch after a step checkpoint, on the batch a
  # validation is due after (the resume runs it first), on an epoch's last
  # batch (that epoch ends in full); then the same config resumed
  for ms in $ms_list; do
    "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" --trainer.max_steps $ms >"$T/$name.ms.log" 2>&1
    local a; a=$(latest)
    "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" --ckpt_path "$a/checkpoints/last.ckpt" >"$T/$name.ms2.log" 2>&1
    local b; b=$(latest); final_state "$b" "$T/$name.ms.st"
    check "$name/max_steps $ms: resumed == uninterrupted, bitwise" cmp -s "$T/$name.full.st" "$T/$name.ms.st"
    check "$name/max_steps $ms: metrics rows == uninterrupted" same_rows "$full/metrics.csv" "$a/metrics.csv" "$b/metrics.csv"
  done

  # a signal at a time the test does not choose (each step sleeps 20 ms)
  for sig in TERM USR1; do
    local before; before=$(latest) wait_more=0.5
    [ "$sig" = USR1 ] && wait_more=0.8 # (into the second epoch)
    LK_TEST_STEP_DELAY_MS=20 setsid "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" >"$T/$name.$sig.log" 2>&1 &
    local pid=$!
    local a; a=$(wait_ckpt "$before")
    sleep "$wait_more"
    kill -s "$sig" -- "-$pid" 2>/dev/null
    wait "$pid"
    if [ "$sig" = TERM ]; then
      "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" --ckpt_path "$a/checkpoints/last.ckpt" >"$T/$name.$sig.2.log" 2>&1
    else # the requeued job resumes from its last checkpoint by itself
      SLURM_RESTART_COUNT=1 "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${extra[@]}" >"$T/$name.$sig.2.log" 2>&1
      check "$name/$sig: the requeued job resumed" grep -q "resumed from" "$T/$name.$sig.2.log"
    fi
    local b; b=$(latest)
    local rows=("$a/metrics.csv" "$b/metrics.csv")
    # under load the signal can land after the job finished: nothing is left to resume
    if ! [ -s "$b/checkpoints/last.ckpt" ]; then b=$a; rows=("$a/metrics.csv"); fi
    # a stop that lands after the last step's rows were logged leaves the
    # resume nothing to log, so it writes no metrics.csv (as Lightning's
    # CSVLogger); the rows of both runs still have to equal the full run's
    if ! [ -e "$b/metrics.csv" ]; then rows=("$a/metrics.csv"); fi
    final_state "$b" "$T/$name.$sig.st"
    local at; at=$(grep -o "at epoch [0-9]*, step [0-9]*, batch [0-9]*" "$T/$name.$sig.2.log")
    check "$name/$sig (resumed ${at:-: nothing left}): resumed == uninterrupted, bitwise" cmp -s "$T/$name.full.st" "$T/$name.$sig.st"
    check "$name/$sig: metrics rows == uninterrupted" same_rows "$full/metrics.csv" "${rows[@]}"
  done
}

ms_list="29 39 52" # 26 batches an epoch, validation after 13 and 26
run_case cosine --optimizer.scheduler cosine
run_case steplr --optimizer.scheduler step --optimizer.step_size 1 --optimizer.gamma 0.5
run_case cosine-per-step --optimizer.scheduler cosine --optimizer.interval step --optimizer.step_size 60
run_case plateau --optimizer.scheduler plateau --optimizer.monitor val_loss --optimizer.patience 0
ms_list="16 18 26" # 13 batches an epoch on each rank, validation after 6, 12 and 13
run_case ddp2-cosine --optimizer.scheduler cosine --trainer.devices 2 --trainer.strategy ddp
finish
