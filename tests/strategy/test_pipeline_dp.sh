#!/usr/bin/env bash
# pipeline x data parallel through `lockstep fit`: 4 devices as 2 stages x 2
# replicas (trainer.pipeline.stages 2), the mlp on synthetic data, 20 AdamW
# steps. Each replica is a whole pipeline fed its own shard of the data and
# the replicas of a stage average their gradients once per optimizer step
# (in buckets, as ddp's, each started as the last micro-batch's backward
# completes it: with small buckets the bits are the same),
# so the run is ddp on 2 ranks accumulating the same micro-batches: bitwise
# (1f1b and gpipe; with accumulation on top of the micro-batches too). Against
# single on the same global batch (a mean of 32 rows against two means of
# four means of 4 rows): within 1e-6 (measured 6.0e-8; with accumulation
# 6.7e-7, checked at 2e-6). Clipping by the norm over every stage's averaged
# gradient: within 1e-6 of single clipped (measured 1.2e-7). Validation runs
# the whole model on every rank, each stage's blocks broadcast to it first
# (the stages keep only their own blocks current between evaluations): its
# loss is ddp's within 1e-6 (stale blocks would give another loss
# altogether). run.json has the measured bubble beside the theory's; the
# trace profiler draws each rank's schedule. A stage count that does not divide the devices, or more
# stages than blocks, is refused before training.
source "$(dirname "$0")/pipe_lib.sh"
write_mlp 2
run() { # NAME ARGS...: fit, then the checkpoint's weights as $T/NAME.st
  local name=$1; shift
  if ! "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
  "$LK_BIN" export --ckpt "$T/$name/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$name.st" >/dev/null
}
val_loss() { # NAME: the last val_loss the run logged
  python3 -c "import csv,sys; r=[x['val_loss'] for x in csv.DictReader(open(sys.argv[1])) if x.get('val_loss')]; print(r[-1])" \
    "$T/$1/lightning_logs/version_0/metrics.csv"
}
close() { python3 -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - float(sys.argv[2])) <= float(sys.argv[3]) else 1)" "$@"; }
pdp=(--trainer.devices 4 --trainer.strategy pipeline --trainer.pipeline.stages 2 --trainer.pipeline.chunks 4)
run single
run ddp --trainer.devices 2 --trainer.strategy ddp --data.init_args.batch_size 16
run ddp_acc --trainer.devices 2 --trainer.strategy ddp --data.init_args.batch_size 4 --trainer.accumulate_grad_batches 4
run pdp "${pdp[@]}" --data.init_args.batch_size 16 &&
  check "the opening line names the replicas" grep -q "pipeline: 2 stages (.*) x 2 data-parallel replicas: \[layers.0" "$T/pdp.log"
check "pipeline 2 stages x 2 replicas, 1f1b: bitwise ddp on 2 ranks accumulating the same micro-batches (4 x 4)" \
  cmp -s "$T/ddp_acc.st" "$T/pdp.st"
check "pipeline 2 x 2: within 1e-6 of single on the global batch of 32 ($(near "$T/single.st" "$T/pdp.st" 1))" \
  near "$T/single.st" "$T/pdp.st" 1e-6
run pdp_gpipe "${pdp[@]}" --trainer.pipeline.schedule gpipe --data.init_args.batch_size 16 &&
  check "pipeline 2 x 2, gpipe: bitwise 1f1b" cmp -s "$T/pdp.st" "$T/pdp_gpipe.st"
# interleaved 1F1B x 2 replicas: each rank holds stages k and k + 2; the
# buckets (104 bytes: one or two parameters each) are started as each of
# its stages' last backward completes them, and the bits stay 1f1b's
run pdp_il "${pdp[@]}" --trainer.pipeline.schedule interleaved_1f1b --data.init_args.batch_size 16 &&
  check "pipeline 2 x 2, interleaved_1f1b: bitwise 1f1b" cmp -s "$T/pdp.st" "$T/pdp_il.st"
run pdp_ilbk "${pdp[@]}" --trainer.pipeline.schedule interleaved_1f1b --data.init_args.batch_size 16 \
  --trainer.bucket_cap_mb 0.0001 &&
  check "pipeline 2 x 2, interleaved_1f1b, 104-byte buckets: bitwise 1f1b" cmp -s "$T/pdp.st" "$T/pdp_ilbk.st"
check "run.json: interleaved, 2 stages per rank, the theory (p-1)/(vm+p-1) = 1/9" python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))['pipeline']
sys.exit(0 if p['stages_per_rank'] == 2 and abs(p['bubble_theory'] - 1 / 9) < 1e-12 else 1)" \
  "$T/pdp_il/lightning_logs/version_0/run.json"
# the replicas' all-reduce in buckets started during the last backward: with 104-byte buckets stage 0's
# gradients go in 2 (its Linear's bias, then its weight), and the bits stay ddp's
run pdp_bk "${pdp[@]}" --data.init_args.batch_size 16 --trainer.bucket_cap_mb 0.0001 &&
  check "pipeline 2 x 2, 104-byte buckets: bitwise ddp accumulating the same micro-batches" cmp -s "$T/ddp_acc.st" "$T/pdp_bk.st"
check "the buckets are said" grep -q "pipeline: each stage's replicas average its gradients in buckets (stage 0: 2 of up to 0.0001 MB" "$T/pdp_bk.log"
check "run.json: the measured bubble beside the theory (p 2, m 4: 0.2): each of the 4 ranks', their mean, the first stage's" python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))['pipeline']
r = p['bubble_per_rank']
ok = p['stages'] == 2 and p['chunks'] == 4 and abs(p['bubble_theory'] - 0.2) < 1e-12 and 0 <= p['bubble'] <= 1
ok = ok and len(r) == 4 and all(0 <= b <= 1 for b in r) and abs(p['bubble'] - sum(r) / 4) < 1e-12 and p['bubble_first_stage'] == r[0]
sys.exit(0 if ok else 1)" \
  "$T/pdp/lightning_logs/version_0/run.json"
v1=$(val_loss pdp) v2=$(val_loss ddp)
check "validation runs the stages' current blocks: val_loss $v1 is ddp's $v2 within 1e-6" close "$v1" "$v2" 1e-6
# the trace profiler: a "pipeline schedule" track per rank with every micro-batch's forward, backward and messages
run pdp_trace "${pdp[@]}" --data.init_args.batch_size 16 --trainer.profiler trace --trainer.max_steps 3 &&
  check "trace.json: each of the 4 ranks' schedule track has forward 0-3, backward 0-3 and messages" python3 - \
    "$T/pdp_trace/lightning_logs/version_0/trace.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d['traceEvents'] if isinstance(d, dict) else d
ok = True
for rank in range(4):
    names = {e['name'] for e in ev if e.get('pid') == rank and e.get('cat') == 'pipeline'}
    need = {'forward %d' % c for c in range(4)} | {'backward %d' % c for c in range(4)} | {'optimizer step'}
    ok = ok and need <= names and any(n.startswith('messages') for n in names)
sys.exit(0 if ok else 1)
PY
# accumulation on top of the micro-batches: 2 batches of 4 x 2 rows per replica per step
run ddp_acc8 --trainer.devices 2 --trainer.strategy ddp --data.init_args.batch_size 2 --trainer.accumulate_grad_batches 8
run pdp_acc "${pdp[@]}" --data.init_args.batch_size 8 --trainer.accumulate_grad_batches 2 &&
  check "pipeline 2 x 2, 4 chunks x accumulate 2: bitwise ddp accumulating 8 x 2" cmp -s "$T/ddp_acc8.st" "$T/pdp_acc.st"
check "pipeline 2 x 2 with accumulation: within 2e-6 of single ($(near "$T/single.st" "$T/pdp_acc.st" 1))" \
  near "$T/single.st" "$T/pdp_acc.st" 2e-6
# clipping: the norm over every stage of the replicas' averaged gradients
run single_clip --trainer.gradient_clip_val 0.05
run pdp_clip "${pdp[@]}" --data.init_args.batch_size 16 --trainer.gradient_clip_val 0.05 &&
  check "pipeline 2 x 2 clipped at 0.05: within 1e-6 of single clipped ($(near "$T/single_clip.st" "$T/pdp_clip.st" 1))" \
    near "$T/single_clip.st" "$T/pdp_clip.st" 1e-6
check "clipping at 0.05 changed the run" bash -c "! cmp -s '$T/single.st' '$T/single_clip.st'"
expect_fail "stages that do not divide the devices" 1 "trainer.pipeline.stages = 3 does not divide the 4 devices" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/b1" --trainer.devices 4 --trainer.strategy pipeline \
  --trainer.pipeline.stages 3
expect_fail "more stages than blocks, with replicas" 1 "2 stages (trainer.pipeline.stages) but the model has only 1 block to cut" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/b2" --trainer.devices 4 --trainer.strategy pipeline \
  --trainer.pipeline.stages 2 --model.init_args.hidden '[]'
finish
