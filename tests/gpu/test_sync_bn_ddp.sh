#!/usr/bin/env bash
# trainer.sync_batchnorm on GPUs over nccl (the fake GPU's two, with its
# NCCL between processes: fake_gpu_sync_bn_ddp): the cnn's two BatchNorm2d
# all-reduce their statistics as device buffers (nccl reads device memory),
# and ddp on 2 GPUs with batch 8 ends 10 SGD steps with the weights and
# running statistics of one CPU process with batch 16. Tolerance 1e-4
# relative to 1 + |value|: the GPU's GEMMs sum in cuBLASLt's order (the
# fake's: measured 4e-8). LK_BIN: the GPU build, LK_CPU_BIN: the CPU one.
source "$LK_SOURCE_DIR/tests/cli/lib.sh"
if ! "$LK_BIN" env | grep -qE "^gpus +: [0-9]+ visible to CUDA"; then
  echo "no CUDA device: skipped"; exit 77
fi
cat >"$T/cnn.yaml" <<YAML
seed_everything: 3
trainer: {max_steps: 10, max_epochs: 5, enable_progress_bar: false, enable_tensorboard: false,
          enable_model_summary: false, num_sanity_val_steps: 0, limit_val_batches: 0, sync_batchnorm: true}
model: {class_path: cnn, init_args: {image_size: 8, channels: [4, 4], hidden: 8, num_classes: 4}}
data: {class_path: synthetic, init_args: {num_samples: 160, input_shape: [1, 8, 8], num_classes: 4, batch_size: 8,
       num_workers: 0}}
optimizer: {name: sgd, lr: 0.1}
YAML
"$LK_BIN" fit -c "$T/cnn.yaml" --trainer.accelerator gpu --trainer.devices 2 --trainer.strategy ddp \
  --trainer.default_root_dir "$T/gpu" >"$T/gpu.log" 2>&1 || tail -5 "$T/gpu.log"
"$LK_CPU_BIN" fit -c "$T/cnn.yaml" --trainer.devices 1 --data.init_args.batch_size 16 \
  --trainer.default_root_dir "$T/cpu" >"$T/cpu.log" 2>&1 || tail -5 "$T/cpu.log"
check "the ranks talked over nccl" grep -qE '"comm_backend": *"nccl"' "$T"/gpu/lightning_logs/version_0/run.json
check "2 batch norm layers synced" grep -q "sync_batchnorm: 2 batch norm layers compute statistics over all 2 ranks" "$T/gpu.log"
for r in gpu cpu; do
  "$LK_CPU_BIN" export --ckpt "$T/$r/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$r.st" >/dev/null 2>&1
done
x=$(python3 - "$T/gpu.st" "$T/cpu.st" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h, base, out = json.loads(b[8:8 + n]), 8 + n, {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']
        f = {'F32': 'f', 'I64': 'q'}[v['dtype']]
        out[k] = struct.unpack('<%d%s' % ((e - s) // struct.calcsize(f), f), b[base + s:base + e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys() and any('running_var' in k for k in a)
print(max(abs(x - y) / (1 + abs(y)) for k in a for x, y in zip(a[k], b[k])))
PY
)
check "ddp x2 GPUs batch 8 with sync_batchnorm == 1 CPU process batch 16 ($x)" \
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 1e-4 else 1)" "${x:-nan}"
finish
