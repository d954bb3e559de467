#!/usr/bin/env bash
# The fp16 loss scaler in training (precision 16-mixed). LK_TEST_GRAD_OVERFLOW
# makes ONE rank's gradient +inf after the all-reduce, so only the reduced
# overflow flag can make the other rank skip too: a run where rank 1
# overflows must equal, bit for bit, one where rank 0 does (weights, Adam
# state, scaler state), with the step skipped (Adam's step count one short),
# the scale halved at that step and grown again after growth_interval clean
# steps. Also: a real fp16 overflow (a huge initial scale) halves the scale
# every step without aborting, dp and the shared-parameters ddp agree, 32-true
# still aborts on a non-finite gradient, bf16-mixed has no scaler.
source "$(dirname "$0")/../cli/lib.sh"
write_synth
common=(--trainer.max_epochs 1 --trainer.enable_progress_bar false --trainer.num_sanity_val_steps 0
        --trainer.log_every_n_steps 1 --trainer.precision 16-mixed --trainer.grad_scaler_init_scale 1024
        --trainer.grad_scaler_growth_interval 3)

state() { "$LK_BIN" export --ckpt "$1/checkpoints/last.ckpt" --out "$2" --with-optimizer >/dev/null; }
# scales NAME RUN_DIR: the scaler/scale column of metrics.csv, space separated
scales() { python3 -c "
import csv, sys
print(' '.join(r['scaler/scale'] for r in csv.DictReader(open(sys.argv[1])) if r.get('scaler/scale')))" "$1/metrics.csv"; }
# tensor FILE NAME: a scalar of an exported safetensors file, printed
tensor() { python3 -c "
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
v = h.get(sys.argv[2])
if v is None: print('absent'); sys.exit()
s, e = v['data_offsets']; raw = b[8 + n + s:8 + n + e]
print({'I64': lambda r: struct.unpack('<q', r)[0], 'F64': lambda r: struct.unpack('<d', r)[0],
       'F32': lambda r: struct.unpack('<f', r)[0]}[v['dtype']](raw[:8 if v['dtype'] != 'F32' else 4]))" "$1" "$2"; }

ddp=(--trainer.devices 2 --trainer.strategy ddp)
# 7 optimizer steps (the synthetic set keeps some samples for validation); the
# overflow at step index 2: scales after each step 1024 1024 512 512 512 1024 1024
want="1024 1024 512 512 512 1024 1024"
for r in 1 0; do
  LK_TEST_GRAD_OVERFLOW=$r:2 "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${ddp[@]}" --trainer.ddp_shared_params false \
    >"$T/ov$r.log" 2>&1
  check "ddp2 replicas, overflow on rank $r: the run finishes" grep -q "last checkpoint" "$T/ov$r.log"
  d=$(latest); state "$d" "$T/ov$r.st"
  got=$(scales "$d")
  check "ddp2, overflow on rank $r: scale halves at the overflow, grows after 3 clean steps ($got)" test "$got" = "$want"
done
check "ddp2: an overflow on rank 1 == one on rank 0, bitwise (both ranks skipped the same step)" cmp -s "$T/ov1.st" "$T/ov0.st"
check "ddp2: the skipped step is not an Adam step (6 of 7)" test "$(tensor "$T/ov1.st" optimizer.state.layers.0.weight.step)" = 6
check "ddp2: scaler state in the checkpoint: scale" test "$(tensor "$T/ov1.st" grad_scaler.scale)" = 1024.0
check "ddp2: scaler state in the checkpoint: _growth_tracker" test "$(tensor "$T/ov1.st" grad_scaler._growth_tracker)" = 1
check "ddp2: scaler state in the checkpoint: growth_interval" test "$(tensor "$T/ov1.st" grad_scaler.growth_interval)" = 3

# shared parameters: each rank updates half of one copy; a one-rank skip would tear it
LK_TEST_GRAD_OVERFLOW=1:2 "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${ddp[@]}" >"$T/sh.log" 2>&1
check "ddp2 shared parameters: they were shared" grep -q "share one copy of the parameters" "$T/sh.log"
state "$(latest)" "$T/sh.st"
check "ddp2 shared parameters, overflow on rank 1 == replicas, bitwise" cmp -s "$T/sh.st" "$T/ov1.st"

# without the overflow the run differs (the skip above was real)
"$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" "${ddp[@]}" >/dev/null 2>&1
state "$(latest)" "$T/clean.st"
check "ddp2: a run without the overflow differs" bash -c "! cmp -s '$T/clean.st' '$T/ov1.st'"
check "ddp2: ... and takes 7 Adam steps" test "$(tensor "$T/clean.st" optimizer.state.layers.0.weight.step)" = 7
check "ddp2: ... its scale grew twice" test "$(scales "$(latest)")" = "1024 1024 2048 2048 2048 4096 4096"

# dp (one process, replicas on threads; every batch is a step: 13)
LK_TEST_GRAD_OVERFLOW=0:2 "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.devices 2 --trainer.strategy dp \
  >"$T/dp.log" 2>&1
d=$(latest)
check "dp: the run finishes" grep -q "last checkpoint" "$T/dp.log"
state "$d" "$T/dp.st"
check "dp, overflow at step 2: the scale halves, then grows ($(scales "$d"))" test "$(scales "$d")" = "1024 1024 512 512 512 1024 1024 1024 2048 2048 2048 4096 4096"
check "dp: the skipped step is not an Adam step (12 of 13)" test "$(tensor "$T/dp.st" optimizer.state.layers.0.weight.step)" = 12

# A real overflow: with an initial scale of 2^40 the f16 copies of the
# gradients in the GEMMs overflow; every such step halves the scale and is
# skipped, and the run goes on.
"$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.grad_scaler_init_scale 1099511627776 >"$T/big.log" 2>&1
d=$(latest)
check "huge initial scale: the run finishes (an fp16 overflow is no error)" grep -q "last checkpoint" "$T/big.log"
check "huge initial scale: it halves at the first steps" \
  bash -c "scales_got='$(scales "$d")'; [[ \"\$scales_got\" == '549755813888 274877906944 137438953472 '* ]]"

# 32-true still stops at a non-finite gradient; bf16-mixed has no scaler
expect_fail "32-true: a non-finite gradient still aborts" 1 "non-finite gradient at step 2" \
  env LK_TEST_GRAD_OVERFLOW=0:2 "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.precision 32-true
"$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.precision bf16-mixed >/dev/null 2>&1
d=$(latest); state "$d" "$T/bf16.st"
check "bf16-mixed: no scaler in the checkpoint" test "$(tensor "$T/bf16.st" grad_scaler.scale)" = absent
check "bf16-mixed: no scaler/scale metric" bash -c "! head -1 '$d/metrics.csv' | grep -q scaler/scale"
check "export without --with-optimizer leaves the scaler out (torch loads it strict)" \
  bash -c "'$LK_BIN' export --ckpt '$(latest)/../version_0/checkpoints/last.ckpt' --out '$T/w.st' >/dev/null && \
           python3 -c \"import sys; sys.exit(b'grad_scaler' in open('$T/w.st','rb').read())\""

expect_fail "grad_scaler_growth_factor 1 is refused with PyTorch's words" 1 "the growth factor must be > 1.0, got 1" \
  "$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.grad_scaler_growth_factor 1
finish
