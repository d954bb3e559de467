#!/usr/bin/env bash
# The profilers and the model summary through the CLI: `advanced` prints
# per-op times; `trace` on 2 ddp ranks writes one trace.json (valid JSON,
# a pid per rank, forward/backward/optimizer spans and per-bucket all-reduce
# spans on their own track, only the first profiler_trace_steps steps);
# the model summary is printed by default and not with
# enable_model_summary false.
. "$(dirname "$0")/lib.sh"
write_synth
export LK_ALLOW_OVERSUBSCRIBE=1
common=(--trainer.max_epochs 1 --trainer.enable_progress_bar false --trainer.enable_tensorboard false)

out=$("$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.profiler advanced 2>&1)
check "advanced: per-op table" grep -q "per-op times" <<<"$out"
check "advanced: a backward row" grep -Eq "^  linear \(backward\) +[0-9]+ " <<<"$out"
check "summary printed by default" grep -q "Trainable params" <<<"$out"
check "summary row of the mlp" grep -Eq "^0 \| layers \| Sequential \| 676 +\| train$" <<<"$out"

out=$("$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.enable_model_summary false 2>&1)
check "enable_model_summary false" bash -c '! grep -q "Trainable params" <<<"$1"' _ "$out"

# Buckets of 100 bytes: the mlp's gradients make three, two of them reduced on the communication thread.
"$LK_BIN" fit -c "$T/synth.yaml" "${common[@]}" --trainer.devices 2 --trainer.strategy ddp --trainer.profiler trace \
  --trainer.profiler_trace_steps 3 --trainer.bucket_cap_mb 0.0001 >"$T/out.txt" 2>&1
check "trace: fit on 2 ranks" grep -q "trace.json" "$T/out.txt"
d=$(latest)
check "trace.json is valid JSON with both ranks and every span" python3 - "$d/trace.json" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
spans = [e for e in ev if e["ph"] == "X"]
for pid in (0, 1):
    names = {e["name"] for e in spans if e["pid"] == pid}
    for want in ("forward", "backward", "optimizer", "linear", "linear backward"):
        assert want in names, (pid, want, sorted(names))
    comm = [e for e in spans if e["pid"] == pid and e["cat"] == "comm"]
    assert comm and all(e["tid"] == 1 and e["name"].startswith("all_reduce bucket ") for e in comm), comm
    assert {e["args"]["thread"] for e in comm} == {"comm", "main"}, comm
    meta = [e for e in ev if e["ph"] == "M" and e["pid"] == pid and e["name"] == "process_name"]
    assert meta and meta[0]["args"]["name"] == "rank %d" % pid, meta
assert max(e["args"]["step"] for e in spans) == 2, "recorded beyond profiler_trace_steps"
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
PY

# sync_batchnorm on the cnn's two batch norm layers, 2 ranks (the numerics: tests/nn/test_sync_bn.c)
cat > "$T/cnn.yaml" <<YAML
trainer: {default_root_dir: $T/cnnruns, max_steps: 2, enable_progress_bar: false, enable_tensorboard: false,
          num_sanity_val_steps: 0, limit_val_batches: 1, devices: 2, strategy: ddp, sync_batchnorm: true}
model: {class_path: cnn, init_args: {image_size: 8, channels: [4, 4], hidden: 8}}
data: {class_path: synthetic, init_args: {num_samples: 64, input_shape: [1, 8, 8], num_classes: 10, batch_size: 8}}
YAML
out=$("$LK_BIN" fit -c "$T/cnn.yaml" 2>&1)
check "sync_batchnorm: 2 layers over 2 ranks" grep -q "sync_batchnorm: 2 batch norm layers compute statistics over all 2 ranks" <<<"$out" || echo "$out" | tail -5
finish
