#!/usr/bin/env bash
# Sharded checkpoint sets (trainer.state_dict_type: sharded, docs/CHECKPOINTS.md).
# A set saved by deepspeed_stage_2 on 2 ranks after 10 Adam steps holds the
# same state as the whole checkpoint of the same run: resumed from either for
# 10 more steps at worlds 1 (single, and deepspeed_stage_1 on one rank), 2,
# 3 and into ddp, the runs end equal bit for bit (the set's pieces are the
# same bytes the gather put in the whole file, and the resumed arithmetic is
# the same); at the saving world size and strategy the resume equals 20
# straight steps, bitwise. The consolidated export loads into a torch
# module by name (strict) and equals the whole checkpoint's tensors. A set
# with a shard missing, truncated, from another save, or without its index
# is refused naming the file, before anything is loaded.
source "$(dirname "$0")/sharded_lib.sh" # $T/z.yaml (the 697-parameter mlp), fit, same, run_json, last
Z2=(--trainer.devices 2 --trainer.strategy deepspeed_stage_2)

# the set, and the whole checkpoint of the same 10 steps
fit set "${Z2[@]}" --trainer.max_steps 10 --trainer.state_dict_type sharded
fit whole "${Z2[@]}" --trainer.max_steps 10
S="$T/set.ckpt"
check "the set: two shards, the trainer state and the index" test -f "$S/shard-00001-of-00002.safetensors" -a \
  -f "$S/shard-00002-of-00002.safetensors" -a -f "$S/trainer_state.safetensors" -a -f "$S/model.safetensors.index.json"
grep -q '"weight_map"' "$S/model.safetensors.index.json" && grep -q '"layers.0.weight": {"lo": 0, "hi": 281' \
  "$S/model.safetensors.index.json" && ok "the index: weight_map and each file's element ranges" \
  || bad "the index: weight_map and each file's element ranges"

# export -> torch: by name, strict, equal to the whole checkpoint's export
"$LK_BIN" export --ckpt "$S" --out "$T/weights.st" >/dev/null
check "export of the set: loads into torch by name (strict), weights and Adam state == the whole checkpoint's" \
  /usr/bin/python3 - "$T/weights.st" "$T/set.st" "$T/whole.st" <<'PY'
import json, struct, sys, torch
def read(p):  # safetensors by hand: the package may be absent
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    dt = {'F32': torch.float32, 'F64': torch.float64, 'I64': torch.int64, 'BF16': torch.bfloat16}
    return {k: torch.frombuffer(bytearray(d[v['data_offsets'][0]:v['data_offsets'][1]]), dtype=dt[v['dtype']]).reshape(v['shape'])
            for k, v in h.items() if k != '__metadata__'}
m = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 4))
m = torch.nn.ModuleDict({'layers': m})
w = read(sys.argv[1])
m.load_state_dict(w, strict=True)
s, f = read(sys.argv[2]), read(sys.argv[3])
assert set(s) == set(f), set(s) ^ set(f)
bad = [k for k in s if not torch.equal(s[k], f[k])]
assert not bad, bad
assert all(torch.equal(w[k], f[k]) for k in w)
PY

# resumed from the set and from the whole file: equal, bitwise, at every world size and strategy
for t in "single 1 single" "z1x1 1 deepspeed_stage_1" "z2x2 2 deepspeed_stage_2" "z2x3 3 deepspeed_stage_2" "ddp2 2 ddp"; do
  set -- $t
  fit "s_$1" --trainer.devices "$2" --trainer.strategy "$3" --ckpt_path "$S"
  fit "w_$1" --trainer.devices "$2" --trainer.strategy "$3" --ckpt_path "$T/whole.ckpt"
  check "set saved by stage 2 x2 resumes as $3 x$2: 10 more steps == from the whole checkpoint, bitwise" same "s_$1" "w_$1"
done
fit straight "${Z2[@]}"
check "stage 2 x2 resumed from its own set at step 10 == 20 straight steps, bitwise" same s_z2x2 straight
grep -q "written by 2 processes, this run has 3" "$T/s_z2x3.log" && ok "a set resumed at another world size says so" \
  || bad "a set resumed at another world size says so"

# fsdp and stage 3 (parameters sharded per unit): a set from fsdp x2 resumes as fsdp x3, stage 3 x2, ddp x2 and
# single == from the whole checkpoint of the same run; a stage-2 set resumes as fsdp; FSDPStrategy's spelling
fit fset --trainer.devices 2 --trainer.strategy fsdp --trainer.max_steps 10 \
  --trainer.strategy '{class_path: FSDPStrategy, init_args: {state_dict_type: sharded}}'
fit fwhole --trainer.devices 2 --trainer.strategy fsdp --trainer.max_steps 10
check "FSDPStrategy {state_dict_type: sharded} x2 writes a set of two shards" \
  test -f "$T/fset.ckpt/shard-00002-of-00002.safetensors" -a -f "$T/fset.ckpt/model.safetensors.index.json"
# by name: a set's export lists the tensors shard by shard
same_by_name() {
  [ -s "$T/$1.st" ] && [ -s "$T/$2.st" ] && /usr/bin/python3 - "$T/$1.st" "$T/$2.st" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: (v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]])
            for k, v in h.items() if k != '__metadata__'}
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b else 1)
PY
}
check "the fsdp set's export == the fsdp whole checkpoint's, by name, bitwise" same_by_name fset fwhole
for t in "f3 3 fsdp" "z3 2 deepspeed_stage_3" "fddp 2 ddp" "fsingle 1 single"; do
  set -- $t
  fit "s_$1" --trainer.devices "$2" --trainer.strategy "$3" --ckpt_path "$T/fset.ckpt"
  fit "w_$1" --trainer.devices "$2" --trainer.strategy "$3" --ckpt_path "$T/fwhole.ckpt"
  check "set saved by fsdp x2 resumes as $3 x$2: 10 more steps == from the whole checkpoint, bitwise" same "s_$1" "w_$1"
done
fit s_z2f --trainer.devices 3 --trainer.strategy fsdp --ckpt_path "$S"
fit w_z2f --trainer.devices 3 --trainer.strategy fsdp --ckpt_path "$T/whole.ckpt"
check "set saved by stage 2 x2 resumes as fsdp x3 == from the whole checkpoint, bitwise" same s_z2f w_z2f

# a set resumed into a set at another world size (DeepSpeedStrategy's init_args spelling), consolidated == the same from the whole file
cat > "$T/node.yaml" <<YAML
trainer:
  strategy:
    class_path: DeepSpeedStrategy
    init_args: {stage: 2, state_dict_type: sharded}
YAML
fit s3 -c "$T/node.yaml" --trainer.devices 3 --ckpt_path "$S"
check "DeepSpeedStrategy {state_dict_type: sharded} on 3 ranks writes three shards" \
  test -f "$T/s3.ckpt/shard-00003-of-00003.safetensors"
check "a set from 2 ranks resumed on 3 and saved as a set of 3 == the whole-file run, by name" \
  /usr/bin/python3 - "$T/s3.st" "$T/w_z2x3.st" <<'PY'
import json, struct, sys
def read(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v['data_offsets'][0]:v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert set(a) == set(b) and all(a[k] == b[k] for k in a), sorted(k for k in a if a.get(k) != b.get(k))
PY

# buffers (a ResNet's BatchNorm statistics) live whole in the trainer state and are in the index's weight_map
sed -n '/^model:/q;p' "$T/z.yaml" >"$T/r.yaml" # z.yaml's trainer section
cat >> "$T/r.yaml" <<YAML
model:
  class_path: resnet
  init_args: {depth: 20, width: 4, in_channels: 1, image_size: 8, num_classes: 4}
data:
  class_path: synthetic
  init_args: {num_samples: 64, input_shape: [1, 8, 8], num_classes: 4, batch_size: 8}
YAML
CFG="$T/r.yaml" fit rset "${Z2[@]}" --trainer.max_steps 3 --trainer.state_dict_type sharded
CFG="$T/r.yaml" fit rwhole "${Z2[@]}" --trainer.max_steps 3
check "resnet (BatchNorm buffers): the set's export == the whole checkpoint's, by name; buffers in weight_map" \
  /usr/bin/python3 - "$T/rset.st" "$T/rwhole.st" "$T/rset.ckpt/model.safetensors.index.json" <<'PY'
import json, struct, sys
def read(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v['data_offsets'][0]:v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert set(a) == set(b) and all(a[k] == b[k] for k in a), sorted(k for k in a if a.get(k) != b.get(k))
assert json.load(open(sys.argv[3]))['weight_map']['bn1.running_mean'] == 'trainer_state.safetensors'
PY

# a replica strategy has nothing to shard: one file, said once
rm -rf "$T/runs"
timeout 60 "$LK_BIN" fit -c "$T/z.yaml" --trainer.max_steps 2 --trainer.state_dict_type sharded >"$T/single.log" 2>&1
check "single with state_dict_type sharded writes the one file and says why" bash -c \
  "test -f '$(echo "$T")/runs/lightning_logs/version_0/checkpoints/last.ckpt' && grep -q 'holds every parameter whole on each rank, so its checkpoints stay one file' '$T/single.log'"

# refusals, each naming the file, before anything is loaded
fit other "${Z2[@]}" --trainer.max_steps 40 --trainer.state_dict_type sharded # two saves: the second swapped in
check "a set saved twice in a run is whole, with no temporary sets left" \
  test "$(ls "$T/other.ckpt" | wc -l)" = 4 -a -z "$(ls -A "$T/runs/lightning_logs/version_0/checkpoints")"
# top-k sets: the ones that fall out of the best 2 are removed with their files
rm -rf "$T/runs"
timeout 120 "$LK_BIN" fit -c "$T/z.yaml" --trainer.max_steps -1 --trainer.max_epochs 4 --trainer.limit_train_batches 5 \
  "${Z2[@]}" --trainer.state_dict_type sharded --trainer.monitor val_loss --trainer.save_top_k 2 >"$T/topk.log" 2>&1
check "top-k 2 of 4 epochs as sets: two epoch sets and last.ckpt remain, each whole" test \
  "$(cd "$T/runs/lightning_logs/version_0/checkpoints" && ls -A | wc -l) $(ls "$T"/runs/lightning_logs/version_0/checkpoints/*/model.safetensors.index.json | wc -l)" = "3 3"
# a crash inside a save (LK_TEST_SHARD_CRASH: rank 1 after staging its shard, rank 0 with the new set built but not
# swapped in) leaves the previous set (epoch 0's, step 35) whole under its name, loadable
for r in 1 0; do
  rm -rf "$T/runs"
  LK_TEST_SHARD_CRASH=$r:40 timeout 60 "$LK_BIN" fit -c "$T/z.yaml" --trainer.max_steps 40 "${Z2[@]}" \
    --trainer.state_dict_type sharded >"$T/crash$r.log" 2>&1
  c="$(last)"
  check "rank $r ended inside the save at step 40: last.ckpt is still step 35's set, whole, and exports" bash -c "
    grep -q 'LK_TEST_SHARD_CRASH: rank $r ends itself' '$T/crash$r.log' &&
    /usr/bin/python3 -c \"import json,struct,sys; b=open(sys.argv[1],'rb').read(); n=struct.unpack('<Q',b[:8])[0]
assert json.loads(b[8:8+n])['__metadata__']['global_step'] == '35'\" '$c/trainer_state.safetensors' &&
    '$LK_BIN' export --ckpt '$c' --out '$T/crash$r.st' >/dev/null"
done
R=(timeout 60 "$LK_BIN" fit -c "$T/z.yaml" --trainer.max_steps 12 --ckpt_path)
cp -r "$S" "$T/miss"; rm "$T/miss/shard-00002-of-00002.safetensors"
expect_fail "a set with a shard missing is refused, naming it" 1 \
  "shard file shard-00002-of-00002.safetensors is missing (expected shard 2 of 2" "${R[@]}" "$T/miss"
cp -r "$S" "$T/foreign"; cp "$T/other.ckpt/shard-00002-of-00002.safetensors" "$T/foreign/"
expect_fail "a shard from another save is refused, naming it" 1 \
  "shard file shard-00002-of-00002.safetensors belongs to another checkpoint set" "${R[@]}" "$T/foreign"
cp -r "$S" "$T/trunc"; truncate -s 100 "$T/trunc/shard-00001-of-00002.safetensors"
expect_fail "a truncated shard is refused, naming it" 1 \
  "shard file shard-00001-of-00002.safetensors cannot be read (truncated or corrupt?)" "${R[@]}" "$T/trunc"
cp -r "$S" "$T/noindex"; rm "$T/noindex/model.safetensors.index.json"
expect_fail "a set without its index (a save that did not finish) is refused" 1 \
  "model.safetensors.index.json is missing" "${R[@]}" "$T/noindex"
expect_fail "export of a set with a shard missing fails naming it" 1 "shard file shard-00002-of-00002.safetensors is missing" \
  "$LK_BIN" export --ckpt "$T/miss" --out "$T/x.st"
finish
