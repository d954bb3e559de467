#!/usr/bin/env bash
# Resuming a pipeline's checkpoint (mlp on synthetic data, AdamW, 20 steps
# against 10 + 10): a pipeline's checkpoint is one consolidated file (rank 0
# gathers every stage's weights and, by parameter name, every stage's
# optimizer state), so resuming it at the same layout is bitwise the
# uninterrupted run — weights and optimizer state, on 2 stages (1f1b, 4
# micro-batches) and on 2 stages x 2 replicas; the file is the one single
# writes, so single resumes a model_parallel checkpoint (and model_parallel
# a single one) bitwise, and ddp resumes it too (its data order differs). A checkpoint of another
# model shape is refused, named.
source "$(dirname "$0")/pipe_lib.sh"
write_mlp 0
ck() { echo "$T/$1/lightning_logs/version_0/checkpoints/last.ckpt"; }
# same A B [PREFIX]: every tensor of two checkpoints (weights and the
# optimizer's state; the lr scheduler's and counters' too) byte for byte
same() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v['data_offsets'][0]:v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
if sorted(a) != sorted(b):
    print('names differ:', sorted(set(a) ^ set(b))[:6]); sys.exit(1)
diff = [k for k in a if a[k] != b[k]]
if diff: print('differ:', diff[:6]); sys.exit(1)
if not any(k.startswith('optimizer.state.') and k.endswith('exp_avg_sq') for k in a):
    print('no optimizer state in the file'); sys.exit(1)
PY
}
PP=(--trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4)
run pp20 "${PP[@]}"
run pp10 "${PP[@]}" --trainer.max_steps 10 &&
  run pp10r "${PP[@]}" --ckpt_path "$(ck pp10)" &&
  check "pipeline 2 stages 1f1b: 10 + 10 steps resumed equal 20 (weights and optimizer state, bitwise)" \
    same "$(ck pp20)" "$(ck pp10r)"
check "pipeline: the file holds stage 1's optimizer state (its last layer's)" \
  bash -c "python3 -c \"import json,struct,sys; b=open(sys.argv[1],'rb').read(); h=json.loads(b[8:8+struct.unpack('<Q',b[:8])[0]]); sys.exit(0 if 'optimizer.state.layers.4.weight.exp_avg' in h else 1)\" '$(ck pp10)'"
# interleaved 1F1B (each rank two stages): its checkpoint is the same consolidated file, so it
# resumes at its own layout and under 1f1b alike (the two are bitwise the same arithmetic)
IL=(--trainer.devices 2 --trainer.strategy pipeline --trainer.pipeline.chunks 4 --trainer.pipeline.schedule interleaved_1f1b)
run il10 "${IL[@]}" --trainer.max_steps 10 &&
  run il10r "${IL[@]}" --ckpt_path "$(ck il10)" &&
  check "pipeline interleaved_1f1b: 10 + 10 steps resumed equal 1f1b's 20 (bitwise)" same "$(ck pp20)" "$(ck il10r)"
run il_pp "${PP[@]}" --ckpt_path "$(ck il10)" &&
  check "1f1b resumes an interleaved_1f1b checkpoint: bitwise its 20" same "$(ck pp20)" "$(ck il_pp)"
D4=(--trainer.devices 4 --trainer.strategy pipeline --trainer.pipeline.stages 2 --trainer.pipeline.chunks 2)
run dp20 "${D4[@]}"
run dp10 "${D4[@]}" --trainer.max_steps 10 &&
  run dp10r "${D4[@]}" --ckpt_path "$(ck dp10)" &&
  check "pipeline 2 stages x 2 replicas: 10 + 10 steps resumed equal 20 (bitwise)" same "$(ck dp20)" "$(ck dp10r)"
# model_parallel is single's arithmetic: its checkpoint and single's are interchangeable
MP=(--trainer.devices 2 --trainer.strategy model_parallel)
run single20
run mp10 "${MP[@]}" --trainer.max_steps 10 &&
  run mp_single "${PP[@]:0:0}" --ckpt_path "$(ck mp10)" &&
  check "single resumes a model_parallel checkpoint: bitwise single's 20 steps" same "$(ck single20)" "$(ck mp_single)"
run single10 --trainer.max_steps 10 &&
  run single_mp "${MP[@]}" --ckpt_path "$(ck single10)" &&
  check "model_parallel resumes single's checkpoint: bitwise single's 20 steps" same "$(ck single20)" "$(ck single_mp)"
# ddp on 2 ranks reads other batches (the data order differs, said), but resumes the state
run mp_ddp --trainer.devices 2 --trainer.strategy ddp --ckpt_path "$(ck mp10)" &&
  check "ddp resumes a model_parallel checkpoint to step 20, saying the data order differs" \
    bash -c "grep -q 'the data order differs' '$T/mp_ddp.log' && python3 -c \"import json,struct,sys; b=open(sys.argv[1],'rb').read(); h=json.loads(b[8:8+struct.unpack('<Q',b[:8])[0]]); sys.exit(0 if h['__metadata__']['global_step'] == '20' else 1)\" '$(ck mp_ddp)'"
# bad input: another model shape (hidden 32, 16 against 32, 24)
expect_fail "a checkpoint of another model shape is refused, named" 1 \
  "does not fit the model (3 problems): 'layers.2.weight' has shape [24, 32], the model expects [16, 32]" \
  "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/bad" "${PP[@]}" \
  --model.init_args.hidden '[32, 16]' --ckpt_path "$(ck pp10)"
finish
