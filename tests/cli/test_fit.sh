#!/usr/bin/env bash
# End-to-end through the CLI: fit -> validate -> test -> predict on synthetic
# data (single process and ddp on 2 ranks), the log directory contract,
# --print_config round trip, override precedence, and the loop limits.
source "$(dirname "$0")/lib.sh"
write_synth

# fit, single process
check "fit single" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.enable_progress_bar false
d=$(latest)
for f in metrics.csv hparams.yaml config.yaml run.json checkpoints/last.ckpt; do
  check "log dir has $f" test -s "$d/$f"
done
check "tensorboard event file" bash -c "ls $d/events.out.tfevents.* >/dev/null"
check "metrics.csv columns" bash -c "head -1 $d/metrics.csv | grep -q epoch && head -1 $d/metrics.csv | grep -q train_loss && head -1 $d/metrics.csv | grep -q val_loss && head -1 $d/metrics.csv | grep -q val_acc"
check "run.json status ok" grep -q '"status":[[:space:]]*"ok"' "$d/run.json"
for key in metrics best samples_per_s wall_s time_to_first_step_s world_size strategy comm_backend version log_dir last_checkpoint; do
  check "run.json has $key" grep -q "\"$key\"" "$d/run.json"
done
check "hparams.yaml names the model" grep -q "mlp" "$d/hparams.yaml"

# validate / test / predict from the last checkpoint
check "validate last" "$LK_BIN" validate -c "$T/synth.yaml" --ckpt_path last --trainer.enable_progress_bar false
out=$("$LK_BIN" test -c "$T/synth.yaml" --ckpt_path last --trainer.enable_progress_bar false 2>&1)
check "test prints test_loss" grep -q "test_loss" <<<"$out"
check "test prints test_acc" grep -q "test_acc" <<<"$out"
check "predict writes predictions" "$LK_BIN" predict -c "$T/synth.yaml" --ckpt_path last --trainer.enable_progress_bar false
pred1="$(latest)/predictions.npy"
check "predictions.npy has every test sample, shape in the header" grep -q "'shape': (51, 4)" "$pred1"
# ddp predict gathers every rank's rows on rank 0, in dataset order, each
# sample once: the same file as one process (2 ranks: shards of 26 + 25; 4
# ranks: 13 + 13 + 13 + 12). Bit for bit where the BLAS computes a row the
# same wherever it sits in the batch (OpenBLAS's AVX-512 kernels); its
# Haswell/Zen kernels round a row by its position, so elsewhere the same
# header and values to 1e-5 of their scale (a row out of order is off by O(1)).
same_predictions() {
  cmp -s "$1" "$2" && return 0
  python3 -c "
import struct, sys
def load(p):  # .npy v1: magic, version, header length, header; then '<f4' values
    b = open(p, 'rb').read(); n = 10 + int.from_bytes(b[8:10], 'little')
    return b[:n], struct.unpack('<%df' % ((len(b) - n) // 4), b[n:])
(ha, a), (hb, b) = load('$1'), load('$2')
d = max(abs(x - y) for x, y in zip(a, b)) / max(max(abs(x) for x in a), 1e-30) if ha == hb and len(a) == len(b) else 1e9
print('not bitwise (the BLAS rounds a row by its place in the batch): max difference', d, 'of the scale')
sys.exit(not d < 1e-5)"
}
for w in 2 4; do
  out=$(LK_ALLOW_OVERSUBSCRIBE=1 "$LK_BIN" predict -c "$T/synth.yaml" --trainer.devices $w --ckpt_path last --trainer.enable_progress_bar false 2>&1)
  check "ddp predict on $w ranks says where the 51 rows went" grep -q "predictions: 51 x 4 f32 in .*predictions.npy" <<<"$out"
  check "ddp predict on $w ranks == one process" same_predictions "$pred1" "$(latest)/predictions.npy"
  check "ddp predict on $w ranks writes no per-rank files" bash -c "! ls $(latest)/predictions.rank* 2>/dev/null"
done

# ddp on 2 ranks, relaunched by the CLI itself
check "fit ddp 2 ranks" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.strategy ddp --trainer.enable_progress_bar false
d=$(latest)
check "ddp run.json world_size 2" grep -q '"world_size":[[:space:]]*2' "$d/run.json"
check "ddp run.json names its communicator (shm on one node)" grep -q '"comm_backend":[[:space:]]*"shm"' "$d/run.json"
check "ddp test on 2 ranks" "$LK_BIN" test -c "$T/synth.yaml" --trainer.devices 2 --ckpt_path last --trainer.enable_progress_bar false

# --print_config feeds back unchanged; overrides beat files, later files beat earlier ones
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 3 --print_config > "$T/printed.yaml"
"$LK_BIN" fit -c "$T/printed.yaml" --print_config > "$T/printed2.yaml"
check "print_config round trip" cmp -s "$T/printed.yaml" "$T/printed2.yaml"
check "override beats file" grep -q "max_epochs: 3" "$T/printed.yaml"
printf 'trainer:\n  max_epochs: 9\n' > "$T/later.yaml"
check "later file beats earlier" bash -c "'$LK_BIN' fit -c '$T/synth.yaml' -c '$T/later.yaml' --print_config | grep -q 'max_epochs: 9'"
check "override beats later file" bash -c "'$LK_BIN' fit -c '$T/synth.yaml' -c '$T/later.yaml' --trainer.max_epochs=4 --print_config | grep -q 'max_epochs: 4'"

# loop limits, read back from run.json and metrics.csv
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_steps 5 --trainer.enable_progress_bar false >/dev/null 2>&1
check "max_steps stops at 5" grep -q '"global_step":[[:space:]]*5,' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.limit_train_batches 3 --trainer.max_epochs 2 --trainer.enable_progress_bar false >/dev/null 2>&1
check "limit_train_batches 3 x 2 epochs" grep -q '"global_step":[[:space:]]*6,' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.limit_train_batches 1 --trainer.max_epochs 2 --trainer.enable_progress_bar false >/dev/null 2>&1
check "limit_train_batches 1 (an int) is one batch per epoch, as in Lightning" grep -q '"global_step":[[:space:]]*2,' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.limit_train_batches 0.5 --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
check "limit_train_batches 0.5 (13 batches of 32 -> 6)" grep -q '"global_step":[[:space:]]*6,' "$(latest)/run.json"
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.fast_dev_run 1 --trainer.enable_progress_bar false 2>&1)
check "fast_dev_run writes no logs" bash -c "! grep -q 'logs:' <<<\"\$0\"" "$out"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1000000 --trainer.max_time 1 --trainer.enable_progress_bar false >/dev/null 2>&1
check "max_time stops early" bash -c "grep -q '\"status\":[[:space:]]*\"ok\"' $(latest)/run.json && ! grep -q '\"epochs\":[[:space:]]*1000000' $(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.val_check_interval 4 --trainer.num_sanity_val_steps 0 --trainer.enable_progress_bar false >/dev/null 2>&1
n=$(cut -d, -f1- "$(latest)/metrics.csv" | awk -F, 'NR==1{for(i=1;i<=NF;i++) if($i=="val_loss") c=i} NR>1 && $c!="" {n++} END{print n+0}')
check "val_check_interval 4 validates 3 times in 13 batches ($n)" test "$n" = 3
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 50 --trainer.early_stopping_monitor val_loss --trainer.early_stopping_patience 1 --trainer.early_stopping_min_delta 10 --trainer.enable_progress_bar false >/dev/null 2>&1
# the first check sets the best, the second fails to beat it by 10: stop after 2 epochs (Lightning's count)
check "early stopping stops after patience" grep -q '"epochs":[[:space:]]*2,' "$(latest)/run.json"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 50 --trainer.early_stopping_monitor val_acc --trainer.early_stopping_mode max --trainer.early_stopping_stopping_threshold 0.5 --trainer.enable_progress_bar false >/dev/null 2>&1
check "early stopping at a threshold stops after the first epoch" grep -q '"epochs":[[:space:]]*1,' "$(latest)/run.json"
# A monitored ModelCheckpoint with no validation value at the time it runs
# (Lightning skips top-k, keeps last.ckpt): stopped inside the first epoch,
# validation every 2nd epoch of 1, validation turned off.
for extra in "--trainer.max_steps 5" "--trainer.check_val_every_n_epoch 2 --trainer.max_epochs 1" "--trainer.limit_val_batches 0 --trainer.max_epochs 1"; do
  out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.monitor val_acc --trainer.monitor_mode max $extra --trainer.enable_progress_bar false 2>&1)
  check "monitor without a validation value ($extra) succeeds" grep -q '"status":[[:space:]]*"ok"' "$(latest)/run.json"
  check "monitor without a validation value ($extra) saves last.ckpt" test -s "$(latest)/checkpoints/last.ckpt"
  check "monitor without a validation value ($extra) says why no top-k" grep -q "has no value at step .* saving last.ckpt only" <<<"$out"
done
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.monitor val_nope --trainer.max_epochs 1 --trainer.enable_progress_bar false 2>&1)
check "monitor never logged after validation is an error listing the logged metrics" grep -q "trainer.monitor 'val_nope' was never logged; logged metrics: .*val_acc" <<<"$out"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.device_stats_monitor true --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
check "DeviceStatsMonitor logs cpu and rss" bash -c "head -1 $(latest)/metrics.csv | grep -q 'device_stats/cpu_percent' && head -1 $(latest)/metrics.csv | grep -q 'device_stats/rss_mb'"
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.global_batch_size 64 --trainer.limit_train_batches 4 --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
check "global_batch_size 64 with batch 32 accumulates 2 micro-batches (4 batches -> 2 steps)" grep -q '"global_step":[[:space:]]*2,' "$(latest)/run.json"
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.global_batch_size 100 --trainer.enable_progress_bar false 2>&1)
check "global_batch_size that does not divide is an error" grep -q "not a multiple of batch_size 32" <<<"$out"
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.accumulate_grad_batches 2 --trainer.scale_lr linear --trainer.max_epochs 1 --trainer.enable_progress_bar false 2>&1)
check "scale_lr linear is logged with its factors" grep -q "lr 0.01 x 2 ranks x 2 accumulation = 0.04" <<<"$out"
# ddp_spawn forks the ranks instead of executing the program again: same result, bit for bit
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.strategy ddp --trainer.enable_progress_bar false >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/ddp.st" --with-optimizer >/dev/null
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.strategy ddp_spawn --trainer.enable_progress_bar false >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/spawn.st" --with-optimizer >/dev/null
check "ddp_spawn (fork) trains exactly what ddp (exec) trains" cmp -s "$T/ddp.st" "$T/spawn.st"
# bf16 gradient compression: trains (a finite loss, a checkpoint) and is not bitwise the exact run
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.ddp_comm_hook bf16_compress --trainer.enable_progress_bar false >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/bf16.st" --with-optimizer >/dev/null
check "ddp_comm_hook bf16_compress trains, rounding the gradients" bash -c "grep -q '\"status\":[[:space:]]*\"ok\"' '$(latest)/run.json' && test -s '$T/bf16.st' && ! cmp -s '$T/ddp.st' '$T/bf16.st'"
# trainer.strategy as Lightning's {class_path, init_args} node: the same run as the flat keys, bit for bit
printf 'trainer:\n  strategy:\n    class_path: lightning.pytorch.strategies.DDPStrategy\n    init_args: {ddp_comm_hook: bf16_compress, find_unused_parameters: true}\n' >"$T/strategy_node.yaml"
out=$("$LK_BIN" fit -c "$T/synth.yaml" -c "$T/strategy_node.yaml" --print_config 2>&1)
check "--print_config shows the strategy node" bash -c "grep -q 'class_path: lightning.pytorch.strategies.DDPStrategy' <<<'$out' && grep -q 'ddp_comm_hook: bf16_compress' <<<'$out'"
"$LK_BIN" fit -c "$T/synth.yaml" -c "$T/strategy_node.yaml" --trainer.devices 2 --trainer.enable_progress_bar false >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/node.st" --with-optimizer >/dev/null
check "strategy {class_path: DDPStrategy, init_args} trains what the flat keys train" cmp -s "$T/bf16.st" "$T/node.st"
printf 'trainer:\n  strategy:\n    class_path: DDPStrategy\n    init_args: {bucket_cap: 1}\n' >"$T/strategy_bad.yaml"
out=$("$LK_BIN" fit -c "$T/synth.yaml" -c "$T/strategy_bad.yaml" 2>&1)
check "an unknown strategy init_arg is named with a hint" grep -q "unknown argument 'bucket_cap' for DDPStrategy (did you mean 'bucket_cap_mb'?)" <<<"$out"
# The *-true precisions: parameters in bf16/f16 under every strategy; dp's
# replicas are cast too; 16-true has no loss scaler (as Lightning's); the
# summary counts 2 bytes a parameter.
for sp in "bf16-true single 1" "bf16-true dp 2" "16-true ddp 2"; do
  set -- $sp
  out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.precision $1 --trainer.strategy $2 --trainer.devices $3 \
    --trainer.gradient_clip_val 0.5 --trainer.accumulate_grad_batches 2 --trainer.max_epochs 1 \
    --trainer.enable_progress_bar false 2>&1); rc=$?
  check "precision $1 trains under $2 on $3 device(s) with clipping and accumulation (rc $rc)" \
    bash -c "[ $rc = 0 ] && grep -q '\"status\":[[:space:]]*\"ok\"' '$(latest)/run.json' && grep -q '\"precision\":[[:space:]]*\"$1\"' '$(latest)/run.json'"
  check "precision $1 ($2): the summary counts 2 bytes a parameter" grep -q "^0.001     Total estimated model params size (MB)" <<<"$out"
  check "precision $1 ($2): no loss scaler" bash -c '! grep -qi "scaler" <<<"$1"' _ "$out"
done
# LK_F32_GEMM=onednn: 32-true's GEMMs through oneDNN train the same model as
# OpenBLAS's to f32 rounding (other summation order), and run.json names the path
LK_F32_GEMM=openblas "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/blas.st" >/dev/null
LK_F32_GEMM=onednn "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.enable_progress_bar false >/dev/null 2>&1
"$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/dnnl.st" >/dev/null
if "$LK_BIN" env | grep -q "^bf16-mixed GEMM : onednn"; then
  check "LK_F32_GEMM=onednn: run.json names the oneDNN path" grep -q '"gemm_path":[[:space:]]*"onednn' "$(latest)/run.json"
  check "LK_F32_GEMM=onednn trains the weights OpenBLAS does, to 1e-4" python3 -c "
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); out = {}
    for k, v in h.items():
        if k == '__metadata__' or v['dtype'] != 'F32': continue
        s, e = v['data_offsets']; out[k] = struct.unpack('<%df' % ((e - s) // 4), b[8 + n + s:8 + n + e])
    return out
a, b = load('$T/blas.st'), load('$T/dnnl.st')
num = sum((x - y) ** 2 for k in a for x, y in zip(a[k], b[k])); den = sum(x * x for k in a for x in a[k])
print('relative difference', (num / den) ** 0.5); sys.exit(not (num / den) ** 0.5 < 1e-4)"
fi
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.ddp_comm_hook fp16_compress --trainer.max_steps 1 --trainer.enable_progress_bar false 2>&1)
check "ddp_comm_hook on one process says it has no effect" grep -q "ddp_comm_hook fp16_compress has no effect: the strategy is single on 1 process" <<<"$out"
# bench train: a row of cells per device count, the independent ceiling, medians of repeats, CSV
out=$("$LK_BIN" bench train --model mlp --strategies independent ddp --devices 1 2 --batch-sizes 16 --steps 10 --repeats 2 --csv "$T/bench.csv" 2>&1)
check "bench train runs independent and ddp cells ($(wc -l <"$T/bench.csv" 2>/dev/null) CSV lines)" \
  bash -c "[ \$(wc -l <'$T/bench.csv') = 5 ] && grep -q '^mlp,independent,2,16,' '$T/bench.csv' && grep -q '^mlp,ddp,2,16,' '$T/bench.csv'"
# (here-strings, not echo '$out': the recommendations under the table hold apostrophes)
check "bench train prints the range of the paired scaling ratios" grep -Eq '^mlp +ddp +32-true +2 .* [0-9.]+-[0-9.]+%$' <<<"$out"
# (the steal column, then bubble/th: "-" for a strategy without stages, then the range)
check "bench train prints the hypervisor's steal per cell and for the whole run" bash -c \
  'grep -Eq "^mlp +ddp +32-true +2 .* [0-9.]+% +- +[0-9.]+-[0-9.]+%\$" <<<"$1" && grep -q "^hypervisor steal over the whole benchmark: [0-9.]*%" <<<"$1"' _ "$out"
expect_fail "bench train rejects --repeats 0" 2 "--repeats '0' is not a whole number from 1 to 15" "$LK_BIN" bench train --repeats 0
expect_fail "bench train passes what follows -- to fit (an unknown key fails the cell)" 1 "mlp ddp 32-true x1 batch 16 failed" \
  "$LK_BIN" bench train --model mlp --strategies ddp --devices 1 --batch-sizes 16 --steps 10 -- --trainer.no_such_key 1
finish
