# Shared by the pipeline tests (test_pipeline_{fit,dp,eval,resume,split_time}.sh):
# the cli test library, 4 ranks allowed on a 2-core machine, the mlp they
# train (16 -> 32 -> 24 -> 4: three Linear blocks, 640 samples in batches
# of 32, AdamW) written by write_mlp, run, a fit into $T/NAME (a script
# that also exports the checkpoint defines its own run after this), and
# near, the largest difference of two safetensors files' f32 tensors.
source "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
export LK_ALLOW_OVERSUBSCRIBE=1 # 4 ranks (3 stages) on a 2-core machine: slow, not wrong
# write_mlp [LIMIT_VAL_BATCHES [MAX_STEPS]]: $T/mlp.yaml (defaults 2 and 20)
write_mlp() {
  cat >"$T/mlp.yaml" <<YAML
seed_everything: 3
trainer:
  max_steps: ${2:-20}
  max_epochs: 10
  log_every_n_steps: 5
  enable_progress_bar: false
  enable_tensorboard: false
  num_sanity_val_steps: 0
  limit_val_batches: ${1:-2}
model:
  class_path: mlp
  init_args: {input_dim: 16, hidden: [32, 24], num_classes: 4}
data:
  class_path: synthetic
  init_args: {num_samples: 640, input_shape: [16], num_classes: 4, batch_size: 32, num_workers: 0}
optimizer:
  name: adamw
  lr: 0.01
YAML
}
# run NAME ARGS...: a fit of $T/mlp.yaml into $T/NAME, its log in $T/NAME.log; a failure is a failed check
run() {
  local name=$1; shift
  if ! "$LK_BIN" fit -c "$T/mlp.yaml" --trainer.default_root_dir "$T/$name" "$@" >"$T/$name.log" 2>&1; then
    bad "$name: the run failed: $(tail -3 "$T/$name.log")"; return 1
  fi
}
near() { # A B TOL: the largest difference between two safetensors files' f32 tensors (their names must agree)
  python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == '__metadata__' or v['dtype'] != 'F32': continue
        s, e = v['data_offsets']; out[k] = struct.unpack('<%df' % ((e - s) // 4), d[s:e])
    return out
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if sorted(a) != sorted(b): print('names differ'); sys.exit(1)
m = max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)
print('max |diff| %.3g' % m); sys.exit(0 if m <= tol else 1)
PY
}
