#!/usr/bin/env bash
# Bad input through the CLI: a clear message (file, line, key, value,
# expected, a suggestion) and a non-zero exit, before anything trains.
source "$(dirname "$0")/lib.sh"
write_synth
printf 'trainer:\n  max_epochs: [1\n' > "$T/broken.yaml"
expect_fail "malformed YAML names file and line" 2 "broken.yaml:3:1: invalid YAML" "$LK_BIN" fit -c "$T/broken.yaml"
expect_fail "an endless config file is refused, not read until memory runs out" 2 "config file '/dev/zero' is larger than 64 MiB" timeout 60 "$LK_BIN" fit -c /dev/zero
printf 'trainer:\n  max_epoch: 3\n' > "$T/typo.yaml"
expect_fail "unknown key suggests the nearest" 2 "did you mean 'max_epochs'" "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/typo.yaml"
expect_fail "unknown key names file:line" 2 "typo.yaml:2" "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/typo.yaml"
expect_fail "wrong type" 2 "trainer.max_epochs: expected an integer, got 'many'" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs many
expect_fail "out of range" 2 "expected a value in" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.accumulate_grad_batches 0
expect_fail "optimizer.step_size past int's range is refused, not cut" 2 "optimizer.step_size: expected a value in [0, 2.14748e+09], got '5000000000'" "$LK_BIN" fit -c "$T/synth.yaml" --optimizer.step_size 5000000000
expect_fail "a comm hook of the other 16-bit dtype under a *-true precision names both" 2 "trainer.ddp_comm_hook fp16_compress sends f16 gradients, but under trainer.precision bf16-true the gradients are bf16" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 2 --trainer.precision bf16-true --trainer.ddp_comm_hook fp16_compress
expect_fail "bad enum" 2 "one of auto|single|ddp|ddp_spawn" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.strategy dpp
expect_fail "unknown model lists the registered ones" 2 "registered models: " "$LK_BIN" fit -c "$T/synth.yaml" --model.class_path vgg
expect_fail "unknown data module" 2 "unknown data class_path 'mnist_fashion'" "$LK_BIN" fit -c "$T/synth.yaml" --data.class_path mnist_fashion
expect_fail "unknown top-level key" 2 "did you mean 'trainer'" "$LK_BIN" fit -c "$T/synth.yaml" --trainr.max_epochs 1
expect_fail "missing config file" 2 "nope.yaml" "$LK_BIN" fit -c "$T/nope.yaml"
expect_fail "monitor never logged lists logged metrics" 1 "logged metrics: " "$LK_BIN" fit -c "$T/synth.yaml" --trainer.monitor val_los --trainer.max_epochs 1 --trainer.enable_progress_bar false
expect_fail "ckpt_path that does not exist" 1 "cannot read" "$LK_BIN" test -c "$T/synth.yaml" --ckpt_path "$T/none.ckpt"
expect_fail "gpu without the CUDA backend" 1 "CUDA backend" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.accelerator gpu
expect_fail "unexpected argument" 2 "unexpected argument" "$LK_BIN" fit -c "$T/synth.yaml" stray
expect_fail "more devices than cores" 2 "more than the" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.devices 4096
expect_fail "dp on several nodes" 1 "one node" "$LK_BIN" fit -c "$T/synth.yaml" --trainer.strategy dp --trainer.num_nodes 2
# init_args of the model and the data module point at their place in the file, as trainer keys do
printf 'data:\n  init_args:\n    batch_size: "abc"\n' > "$T/data_type.yaml"
expect_fail "data.init_args type error names file:line:col" 2 "data_type.yaml:3:17: data.init_args.batch_size: expected an integer, got 'abc'" "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/data_type.yaml"
printf 'data:\n  init_args:\n    num_workers: [1]\n' > "$T/data_seq.yaml"
expect_fail "a list for data.init_args.num_workers names file:line:col" 2 "data_seq.yaml:3:18: data.init_args.num_workers: expected an integer" "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/data_seq.yaml"
printf 'model:\n  init_args:\n    dropout: lots\n' > "$T/model_type.yaml"
expect_fail "model.init_args type error names file:line:col" 2 "model_type.yaml:3:14: model mlp: dropout = 'lots': expected a number" "$LK_BIN" fit -c "$T/synth.yaml" -c "$T/model_type.yaml"
out=$("$LK_BIN" fit --help)
check "--help lists trainer keys with defaults" grep -q -- "--trainer.max_epochs" <<<"$out"
check "--help lists models" grep -q "autoencoder" <<<"$out"
# LK_F32_GEMM: auto (the default) is oneDNN exactly on an AMX-class CPU
# (oneDNN's isa avx512_core_amx), an explicit choice wins, and an unknown
# value is named and takes the automatic choice
auto=$("$LK_BIN" env 2>&1 | grep "^32-true GEMM")
if "$LK_BIN" env 2>&1 | grep -q "^bf16-mixed GEMM : onednn .*(cpu isa avx512_core_amx)"; then want="onednn"; else want="openblas sgemm"; fi
check "LK_F32_GEMM=auto: $want on this CPU ($auto)" grep -q "^32-true GEMM    : $want" <<<"$auto"
check "LK_F32_GEMM=auto is the default" bash -c '[ "$1" = "$(LK_F32_GEMM=auto "$2" env 2>&1 | grep "^32-true GEMM")" ]' _ "$auto" "$LK_BIN"
check "LK_F32_GEMM=openblas takes OpenBLAS" bash -c 'LK_F32_GEMM=openblas "$1" env 2>&1 | grep -q "^32-true GEMM    : openblas sgemm"' _ "$LK_BIN"
out=$(LK_F32_GEMM=mkl "$LK_BIN" env 2>&1)
check "an unknown LK_F32_GEMM is named and takes the automatic choice" \
  bash -c 'grep -q "LK_F32_GEMM=mkl is none of auto, onednn, openblas: f32 GEMMs take the automatic choice" <<<"$1" && [ "$(grep "^32-true GEMM" <<<"$1")" = "$2" ]' _ "$out" "$auto"
# LK_CPU_ISA: baseline lowers lockstep's loops to the baseline copy; an
# unknown value is named and ignored (the CPU's own level runs)
cpu_loops=$("$LK_BIN" env 2>&1 | grep "^cpu loops")
check "LK_CPU_ISA=baseline: env says the baseline copy runs" \
  bash -c 'LK_CPU_ISA=baseline "$1" env 2>&1 | grep -q "^cpu loops       : baseline "' _ "$LK_BIN"
out=$(LK_CPU_ISA=sse9 "$LK_BIN" env 2>&1)
check "an unknown LK_CPU_ISA is named and ignored" \
  bash -c 'grep -q "LK_CPU_ISA=sse9 is none of auto, avx512, avx2, baseline: ignored" <<<"$1" && [ "$(grep "^cpu loops" <<<"$1")" = "$2" ]' _ "$out" "$cpu_loops"
# A numeric LK_* variable that is not a number is said once, not silently replaced by its default
out=$(LK_NUM_THREADS=four LK_COMM_TIMEOUT=soon "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 \
  --trainer.devices 2 --trainer.enable_progress_bar false 2>&1)
check "LK_NUM_THREADS=four is named once" \
  test "$(grep -c "LK_NUM_THREADS='four' is not an integer: ignored, as if it were unset" <<<"$out")" = 1
check "LK_COMM_TIMEOUT=soon is named" grep -q "LK_COMM_TIMEOUT='soon' is not a finite number: ignored" <<<"$out"
# LK_NUM_THREADS beyond the CPUs a rank may use is capped at its share, said
# once with the value asked, the value used and the cores available (it was
# once silently cut to 64 and ran 5.8x slower than the default); 0 and
# negative values are said and ignored
cpus=$(nproc) # the affinity mask, as lockstep counts them
for devices in 1 2; do
  share=$((cpus / devices)); [ "$share" -ge 1 ] || share=1; [ "$share" -le 64 ] || share=64
  ranks=$([ "$devices" = 1 ] && echo "1 rank" || echo "$devices ranks")
  out=$(LK_NUM_THREADS=100000 "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.devices $devices \
    --trainer.enable_progress_bar false --trainer.default_root_dir "$T/nt$devices" 2>&1)
  check "LK_NUM_THREADS=100000 on $devices rank(s): said once, with what was asked, used and available" \
    test "$(grep -c "LK_NUM_THREADS=100000 asks for more compute threads than the $share cores\? available to this rank ($cpus CPUs\? this process may run on, $ranks on this node): using $share$" <<<"$out")" = 1
  check "... and the run used $share thread(s)" test "$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["settings"]["num_threads"]; print(s["value"], s["from"])' "$T/nt$devices/lightning_logs/version_0/run.json")" = "$share LK_NUM_THREADS"
done
for v in 0 -3; do
  out=$(LK_NUM_THREADS=$v "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_epochs 1 --trainer.devices 2 \
    --trainer.enable_progress_bar false --trainer.default_root_dir "$T/nz" 2>&1)
  check "LK_NUM_THREADS=$v is said once and ignored" \
    test "$(grep -c "LK_NUM_THREADS=$v is not a positive number of threads: ignored, as if it were unset" <<<"$out")" = 1
done
# A data directory that exists but cannot be read says why (EACCES), not "not
# found ... install dataset-fashion-mnist"; a missing one keeps that hint.
# Root reads everything: the run drops to nobody (setpriv) to be refused.
mkdir -p "$T/pub/data" && chmod 755 "$T" && chmod 777 "$T/pub"
printf 'trainer:\n  max_epochs: 1\n  default_root_dir: %s/pub/runs\nmodel:\n  class_path: mlp\ndata:\n  class_path: fashion_mnist\n' "$T" > "$T/pub/fm.yaml"
chmod 644 "$T/pub/fm.yaml"
chmod 000 "$T/pub/data"
as_user=()
if [ "$(id -u)" = 0 ]; then as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
if [ ${#as_user[@]} -gt 0 ] && ! "${as_user[@]}" test -x "$LK_BIN" 2>/dev/null; then
  echo "skip unreadable data directory: running as root and cannot drop to nobody with setpriv (or nobody cannot run $LK_BIN)"
else
  expect_fail "an unreadable data.init_args.root names the directory and EACCES" 1 \
    "mnist train split: cannot read $T/pub/data: Permission denied (from data.init_args.root)" \
    "${as_user[@]}" "$LK_BIN" fit -c "$T/pub/fm.yaml" --data.init_args.root "$T/pub/data"
  expect_fail "an unreadable LK_DATA_ROOT: the same, naming the variable" 1 \
    "cannot read $T/pub/data: Permission denied (from LK_DATA_ROOT)" \
    "${as_user[@]}" env LK_DATA_ROOT="$T/pub/data" "$LK_BIN" fit -c "$T/pub/fm.yaml"
  out=$("${as_user[@]}" "$LK_BIN" fit -c "$T/pub/fm.yaml" --data.init_args.root "$T/pub/data" 2>&1)
  check "... and no install hint for it" bash -c '! grep -q "install dataset-fashion-mnist" <<<"$1"' _ "$out"
fi
chmod 755 "$T/pub/data"
expect_fail "a data root that is a file: Not a directory" 1 "cannot read $T/pub/fm.yaml: Not a directory" \
  "$LK_BIN" fit -c "$T/pub/fm.yaml" --data.init_args.root "$T/pub/fm.yaml"
expect_fail "a missing data directory keeps the install hint" 1 "install dataset-fashion-mnist" \
  "$LK_BIN" fit -c "$T/pub/fm.yaml" --data.init_args.root "$T/pub/none"
finish
