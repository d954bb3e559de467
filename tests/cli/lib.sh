# Helpers for the CLI end-to-end tests (sourced). LK_BIN is the lockstep
# binary (set by ctest); every test works in its own temporary directory.
set -u
LK_BIN=${LK_BIN:-build/lockstep}
T=$(mktemp -d /tmp/lktest.XXXXXX)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
# check NAME COMMAND...: the command must succeed
check() { local n=$1; shift; if "$@"; then ok "$n"; else bad "$n"; fi; }
# expect_fail NAME CODE PATTERN COMMAND...: must exit CODE and print PATTERN on stderr
expect_fail() {
  local n=$1 code=$2 pat=$3; shift 3
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  if [ "$rc" = "$code" ] && grep -qF -- "$pat" <<<"$out"; then ok "$n"
  else bad "$n (exit $rc, wanted $code; stderr: $out)"; fi
}
finish() { echo "$pass passed, $fail failed"; [ "$fail" = 0 ]; }
# A small synthetic classification config.
write_synth() {
  cat > "$T/synth.yaml" <<YAML
seed_everything: 7
trainer:
  default_root_dir: $T/runs
  max_epochs: 2
  log_every_n_steps: 2
  enable_progress_bar: true
  enable_tensorboard: true
model:
  class_path: mlp
  init_args:
    input_dim: 16
    hidden: [32]
    num_classes: 4
data:
  class_path: synthetic
  init_args:
    num_samples: 512
    input_shape: [16]
    num_classes: 4
    batch_size: 32
optimizer:
  name: adam
  lr: 0.01
YAML
}
latest() { ls -d "$T"/runs/lightning_logs/version_* | sort -t_ -k3 -n | tail -1; }
