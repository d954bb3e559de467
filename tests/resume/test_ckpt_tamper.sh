#!/usr/bin/env bash
# A checkpoint is a file a user hands us: whatever its metadata and state
# tensors hold, resuming from it either works or stops before the first
# step with an error naming the file, the key, the value and what was
# expected. Before, a negative epoch looped for ever, a step count at the
# int64 limit overflowed, and a NaN learning rate surfaced as "the loss is
# nan" steps later. Also: ModelCheckpoint never deletes a file the
# checkpoint's top-k list names outside this run's checkpoint directory
# (resuming into a new version directory used to delete the old run's best
# checkpoint), and the scheduler's hyperparameters come from the
# checkpoint as torch's load_state_dict takes them (a cosine schedule
# resumed with more epochs used to stay at lr 0).
source "$(dirname "$0")/../cli/lib.sh"
write_synth
edit="$(dirname "$0")/ckpt_edit.py"
q=(--trainer.enable_progress_bar false --trainer.num_sanity_val_steps 0)
a=(-c "$T/synth.yaml" "${q[@]}" --trainer.precision 16-mixed --optimizer.scheduler cosine
   --trainer.monitor val_loss --trainer.early_stopping_monitor val_loss --trainer.default_root_dir "$T/a")
"$LK_BIN" fit "${a[@]}" --trainer.max_epochs 1 >"$T/a.log" 2>&1
base="$T/a/lightning_logs/version_0/checkpoints/last.ckpt"
check "base checkpoint written" test -f "$base"

# edit EXPECTED-MESSAGE EDIT...: resuming from the edited copy fails with it
n=0
bad_ckpt() {
  local msg=$1; shift
  n=$((n + 1))
  local c="$T/c$n.ckpt"
  /usr/bin/python3 "$edit" "$base" "$c" "$@" || { bad "ckpt_edit $*"; return; }
  expect_fail "$* -> ${msg//@/<file>}" 1 "${msg//@/$c}" timeout 60 "$LK_BIN" fit "${a[@]}" --trainer.max_epochs 2 --ckpt_path "$c"
}
bad_ckpt "checkpoint @: metadata 'epoch' is '-1', expected an integer from 0 to 9007199254740992" meta:epoch=-1
bad_ckpt "checkpoint @: metadata 'epoch' is '-9223372036854775808'" meta:epoch=-9223372036854775808
bad_ckpt "checkpoint @: metadata 'global_step' is '9223372036854775807'" meta:global_step=9223372036854775807
bad_ckpt "checkpoint @: metadata 'batch_in_epoch' is 'abc'" meta:batch_in_epoch=abc
bad_ckpt "metadata 'batch_in_epoch' is '2147483648', expected an integer from 0 to 2147483647" \
  meta:batch_in_epoch=2147483648
bad_ckpt "checkpoint @: metadata 'world_size' is '0', expected an integer from 1 to" meta:world_size=0
bad_ckpt "checkpoint @: metadata 'early_stopping_wait' is '-2147483649'" meta:early_stopping_wait=-2147483649
bad_ckpt "checkpoint @: metadata 'best_score' is 'x', expected a number, nan or inf" meta:best_score=x
bad_ckpt "checkpoint @: metadata 'top_k' line 1 is 'garbage', expected a finite score, a tab and a path" meta:top_k=garbage
bad_ckpt "checkpoint @ has format_version '2'; this lockstep" meta:format_version=2
bad_ckpt "checkpoint @: optimizer_state_load: param_groups.0.lr is nan, expected a finite value >= 0" \
  f64:optimizer.param_groups.0.lr=nan
bad_ckpt "param_groups.0.beta2 is 1, expected a value in [0, 1)" f64:optimizer.param_groups.0.beta2=1
bad_ckpt "state.layers.0.weight.step is -1, expected a whole number from 0 to 2^53" \
  i64:optimizer.state.layers.0.weight.step=-1
bad_ckpt "checkpoint @: scheduler_state_load (CosineAnnealingLR): last_epoch is nan, expected a whole number" \
  f64:lr_scheduler.last_epoch=nan
bad_ckpt "T_max is 0.5, expected a whole number from 1 to 2^31-1" f64:lr_scheduler.T_max=0.5
bad_ckpt "grad_scaler_state_load: growth_interval is 9.22337e+18, expected a whole number from 1 to 2^53" \
  i64:grad_scaler.growth_interval=9223372036854775807
out=$("$LK_BIN" fit "${a[@]}" --trainer.max_epochs 2 --ckpt_path "$T/c1.ckpt" 2>&1)
check "the rank is named once" test "$(grep -o '\[rank 0\]' <<<"$out" | wc -l)" -le 1

# The scheduler's T_max comes from the checkpoint, as torch's: the cosine
# of T_max 1 is periodic, lr 0 in the second epoch and the base lr in the third.
out=$("$LK_BIN" fit "${a[@]}" --trainer.max_epochs 3 --ckpt_path "$base" 2>&1); rc=$?
check "untouched checkpoint resumes (exit $rc)" test "$rc" = 0
check "T_max kept from the checkpoint, said" \
  grep -qF "lr_scheduler: CosineAnnealingLR T_max is 1 in the checkpoint and 3 in this run: the checkpoint's is kept" <<<"$out"
lrs=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "lr-Adam") c = i; next }
               $c != "" { print $1 ":" $c }' "$T/a/lightning_logs/version_1/metrics.csv" | sort -u | tr '\n' ' ')
check "lr per epoch as torch's periodic cosine (got: $lrs)" test "$lrs" = "1:0 2:0.01 "

# One byte changed in each tensor in turn (weights, optimizer, scheduler and
# loss scaler state): refused before the first step, the file and the tensor named.
nt=0
runs=$(ls -d "$T"/a/lightning_logs/version_* | wc -l)
while IFS= read -r name; do
  nt=$((nt + 1))
  c="$T/flip$nt.ckpt"
  /usr/bin/python3 "$edit" "$base" "$c" "flip:$name" || { bad "ckpt_edit flip:$name"; continue; }
  expect_fail "a byte of '$name' changed" 1 "$c: tensor '$name' fails its crc32c check (stored " \
    timeout 60 "$LK_BIN" fit "${a[@]}" --trainer.max_epochs 2 --ckpt_path "$c"
done < <(/usr/bin/python3 "$edit" --list "$base")
check "every tensor of the checkpoint tried ($nt)" test "$nt" -ge 10
check "no run started from a damaged checkpoint" test "$(ls -d "$T"/a/lightning_logs/version_* | wc -l)" = "$runs"
expect_fail "lockstep export names the damaged tensor" 1 "$T/flip1.ckpt: tensor '$(/usr/bin/python3 "$edit" --list "$base" | head -1)' fails its crc32c check" \
  "$LK_BIN" export --ckpt "$T/flip1.ckpt" --out "$T/flip1.safetensors"
check "and writes nothing" test ! -e "$T/flip1.safetensors"

# Top-k across directories (32-true, no scheduler: the loss keeps falling).
b=(-c "$T/synth.yaml" "${q[@]}" --trainer.monitor val_loss --trainer.save_top_k 1)
"$LK_BIN" fit "${b[@]}" --trainer.default_root_dir "$T/b" --trainer.max_epochs 1 >"$T/b.log" 2>&1
old=$(ls "$T"/b/lightning_logs/version_0/checkpoints/epoch=*.ckpt)
out=$("$LK_BIN" fit "${b[@]}" --trainer.default_root_dir "$T/b" --trainer.max_epochs 3 --ckpt_path last 2>&1)
check "the old run's best checkpoint survives a resume into version_1" test -f "$old"
check "said why its top-k is not taken over" grep -qF "are not taken over (nor ever deleted), only its best path $old" <<<"$out"
check "the new run keeps its own best" test "$(ls "$T"/b/lightning_logs/version_1/checkpoints/epoch=*.ckpt | wc -l)" = 1

# The same directory (logger false): top-k goes on, replacing its own file.
"$LK_BIN" fit "${b[@]}" --trainer.logger false --trainer.default_root_dir "$T/s" --trainer.max_epochs 1 >"$T/s.log" 2>&1
first=$(ls "$T"/s/checkpoints/epoch=*.ckpt)
out=$("$LK_BIN" fit "${b[@]}" --trainer.logger false --trainer.default_root_dir "$T/s" --trainer.max_epochs 3 \
  --ckpt_path "$T/s/checkpoints/last.ckpt" 2>&1)
check "same directory: no warning" bash -c "! grep -q 'not taken over' <<<\"\$0\"" "$out"
check "same directory: the better epoch replaced the first" bash -c "test ! -f '$first' && ls '$T'/s/checkpoints/epoch=2-*.ckpt"

# A top-k list naming a file elsewhere, even with this run's dirpath: never deleted.
echo precious >"$T/victim.ckpt"
/usr/bin/python3 "$edit" "$T/s/checkpoints/last.ckpt" "$T/forged.ckpt" \
  "meta:top_k=1e30	$T/victim.ckpt" "meta:best_score=1e30" "meta:dirpath=$T/s/checkpoints"
out=$("$LK_BIN" fit "${b[@]}" --trainer.logger false --trainer.default_root_dir "$T/s" --trainer.max_epochs 4 \
  --ckpt_path "$T/forged.ckpt" 2>&1); rc=$?
check "forged top-k: resumes (exit $rc)" test "$rc" = 0
check "forged top-k: the file it names survives" grep -q precious "$T/victim.ckpt"
check "forged top-k: said" grep -qF "not taken over (nor ever deleted)" <<<"$out"

# A checkpoint from before the checksums (none in its metadata) resumes, with a note, once.
/usr/bin/python3 "$edit" "$base" "$T/old.ckpt" strip-crc
out=$("$LK_BIN" fit "${a[@]}" --trainer.default_root_dir "$T/old" --trainer.max_epochs 2 --ckpt_path "$T/old.ckpt" 2>&1); rc=$?
check "a checkpoint without checksums resumes (exit $rc)" test "$rc" = 0
check "with the note, once" test "$(grep -cF "note: $T/old.ckpt has no tensor checksums (written by a lockstep before they existed, or by another tool): its tensor data is loaded without a corruption check" <<<"$out")" = 1
# What lockstep writes now carries them (the resumed run's last.ckpt, an export of it), each verified.
new="$T/old/lightning_logs/version_0/checkpoints/last.ckpt"
check "the resumed run's checkpoint has a checksum per tensor" \
  /usr/bin/python3 -c 'import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
names = [k for k in h if k != "__metadata__"]
assert names and all("lk.crc32c." + k in h["__metadata__"] for k in names), names' "$new"
check "export of it" "$LK_BIN" export --ckpt "$new" --out "$T/new.safetensors"
out=$("$LK_BIN" export --ckpt "$T/new.safetensors" --out "$T/new2.safetensors" 2>&1); rc=$?
check "the export is verified when read (exit $rc, no note)" bash -c "[ $rc = 0 ] && ! grep -q 'no tensor checksums' <<<\"\$0\"" "$out"
finish
