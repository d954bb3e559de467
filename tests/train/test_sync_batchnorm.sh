#!/usr/bin/env bash
# trainer.sync_batchnorm through `lockstep fit` on the cnn (two BatchNorm2d):
#  - ddp on 2 ranks with batch 8 ends 10 SGD steps with the weights and
#    running statistics of one process with batch 16 (the sampler gives
#    rank r positions r, r+2, ... of the same permutation, so the ranks'
#    batches together are the single run's), and ddp without it does not;
#  - ddp on 3 ranks with batch 4 over 52 samples (42 after the 0.8 train
#    split: 14 per rank, a last batch of 2 in each of the epochs the 10
#    steps cross) against one process with batch 12 (last batch 6);
#  - the first in bf16-mixed too (statistics in f32 from bf16 activations);
#  - with strategy dp: refused, naming the setting; with one process or a
#    model without BatchNorm: a warning, and the fit runs.
# Tolerance 1e-5 relative to 1 + |value| (measured 5e-8: the ranks sum
# their statistics in another order; tests/nn/test_sync_bn_train.c).
source "$(dirname "$0")/../cli/lib.sh"
export LK_ALLOW_OVERSUBSCRIBE=1
PY=${LK_PYTHON:-python3}
cat >"$T/cnn.yaml" <<YAML
seed_everything: 3
trainer: {max_steps: 10, max_epochs: 5, enable_progress_bar: false, enable_tensorboard: false,
          enable_model_summary: false, num_sanity_val_steps: 0, limit_val_batches: 0, sync_batchnorm: true}
model: {class_path: cnn, init_args: {image_size: 8, channels: [4, 4], hidden: 8, num_classes: 4}}
data: {class_path: synthetic, init_args: {num_samples: 160, input_shape: [1, 8, 8], num_classes: 4, batch_size: 8,
       num_workers: 0}}
optimizer: {name: sgd, lr: 0.1}
YAML
# fit NAME ARGS...: trains into $T/NAME and exports its last weights to $T/NAME.st
fit() {
  local n=$1; shift
  "$LK_BIN" fit -c "$T/cnn.yaml" --trainer.default_root_dir "$T/$n" "$@" >"$T/$n.log" 2>&1 &&
    "$LK_BIN" export --ckpt "$T/$n/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/$n.st" >/dev/null 2>&1 ||
    { echo "fit $n failed:"; tail -5 "$T/$n.log"; }
}
# diff A B: the largest |a - b| / (1 + |b|) over every tensor of two exported safetensors files
cat >"$T/diff.py" <<'PY'
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
assert a.keys() == b.keys() and any('running_var' in k for k in a), (sorted(a), sorted(b))
print(max(abs(x - y) / (1 + abs(y)) for k in a for x, y in zip(a[k], b[k])))
PY
d() { $PY "$T/diff.py" "$T/$1.st" "$T/$2.st"; }
small() { $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 1e-5 else 1)" "$1"; }
large() { $PY -c "import sys; sys.exit(0 if float(sys.argv[1]) > 1e-3 else 1)" "$1"; }

fit ddp2 --trainer.devices 2 --trainer.strategy ddp
fit one16 --trainer.devices 1 --data.init_args.batch_size 16
fit plain2 --trainer.devices 2 --trainer.strategy ddp --trainer.sync_batchnorm false
check "ddp x2 batch 8 logs the layers" grep -q "sync_batchnorm: 2 batch norm layers compute statistics over all 2 ranks" "$T/ddp2.log"
check "one process: sync_batchnorm is said to be a no-op" grep -q "warning: trainer.sync_batchnorm: strategy single has one data-parallel process" "$T/one16.log"
x=$(d ddp2 one16); check "ddp x2 batch 8 with sync_batchnorm == 1 process batch 16 ($x)" small "$x"
x=$(d plain2 one16); check "ddp x2 batch 8 without sync_batchnorm differs ($x)" large "$x"

# bf16-mixed: the activations bf16, the statistics f32 (f64 sums): the same match
fit ddp2h --trainer.devices 2 --trainer.strategy ddp --trainer.precision bf16-mixed
fit one16h --trainer.devices 1 --data.init_args.batch_size 16 --trainer.precision bf16-mixed
x=$(d ddp2h one16h); check "bf16-mixed: ddp x2 batch 8 with sync_batchnorm == 1 process batch 16 ($x)" small "$x"

fit ddp3 --trainer.devices 3 --trainer.strategy ddp --data.init_args.batch_size 4 --data.init_args.num_samples 52
fit one12 --trainer.devices 1 --data.init_args.batch_size 12 --data.init_args.num_samples 52
x=$(d ddp3 one12); check "ddp x3 batch 4, last batch 2 == 1 process batch 12, last batch 6 ($x)" small "$x"

expect_fail "strategy dp refused" 1 \
  "trainer.sync_batchnorm with strategy dp: dp's replicas are threads of one process" \
  "$LK_BIN" fit -c "$T/cnn.yaml" --trainer.default_root_dir "$T/dp" --trainer.devices 2 --trainer.strategy dp
cat >"$T/mlp.yaml" <<YAML
trainer: {max_steps: 2, enable_progress_bar: false, enable_tensorboard: false, num_sanity_val_steps: 0,
          limit_val_batches: 0, devices: 2, strategy: ddp, sync_batchnorm: true, default_root_dir: $T/mlp}
model: {class_path: mlp, init_args: {input_dim: 16, hidden: [8], num_classes: 4}}
data: {class_path: synthetic, init_args: {num_samples: 64, input_shape: [16], num_classes: 4, batch_size: 8, num_workers: 0}}
YAML
out=$("$LK_BIN" fit -c "$T/mlp.yaml" 2>&1); rc=$?
check "no BatchNorm: a warning, the fit runs (exit $rc)" bash -c '[ "$1" = 0 ] && grep -q "warning: trainer.sync_batchnorm: the model has no BatchNorm layer" <<<"$2"' _ "$rc" "$out"
finish
