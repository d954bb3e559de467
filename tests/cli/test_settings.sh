#!/usr/bin/env bash
# One precedence rule for every LK_* variable that a config key or a flag can
# also set (issue 43): the key, when the config sets it, wins; else the
# variable; else the built-in default. For each such pair: the variable alone
# takes effect, the key beats the variable, and `lockstep env` and run.json
# say where the effective value came from. Variables without a key: the
# variable beats the default, and the source is said.
source "$(dirname "$0")/lib.sh"
write_synth
sed -i 's/max_epochs: 2/max_epochs: 1/; s/enable_progress_bar: true/enable_progress_bar: false/; s/enable_tensorboard: true/enable_tensorboard: false/' "$T/synth.yaml"
printf 'trainer:\n  comm_timeout: 7\n' > "$T/run.yaml"
unset LK_COMM_TIMEOUT LK_NUM_THREADS LK_DATA_ROOT LK_MAX_RESTARTS LK_LOG_LEVEL LK_COMM_BACKEND PL_GLOBAL_SEED
# setting NAME: the line `lockstep env` prints for it
setting() { grep -E "^  $1 +=" <<<"$2"; }
# settings_json RUN_JSON NAME: "value from" of run.json's settings.NAME
settings_json() {
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["settings"][sys.argv[2]]; print(s["value"], s["from"])' "$1" "$2"
}
fit_json() { # fit_json OUT_DIR ARGS...: a fit of $CFG (synth.yaml) into OUT_DIR; prints its run.json's path
  local dir=$1; shift
  "$LK_BIN" fit -c "${CFG:-$T/synth.yaml}" --trainer.default_root_dir "$dir" "$@" >"$dir.out" 2>&1 || { cat "$dir.out" >&2; return 1; }
  echo "$dir/lightning_logs/version_0/run.json"
}

# ---- comm_timeout: trainer.comm_timeout vs LK_COMM_TIMEOUT -------------------
out=$("$LK_BIN" env 2>&1)
check "comm_timeout alone: 120 (default)" grep -q "= 120 (default)$" <<<"$(setting comm_timeout "$out")"
out=$(LK_COMM_TIMEOUT=30 "$LK_BIN" env 2>&1)
check "LK_COMM_TIMEOUT alone takes effect, and lockstep env says so" \
  grep -q "= 30 (from LK_COMM_TIMEOUT)$" <<<"$(setting comm_timeout "$out")"
out=$(LK_COMM_TIMEOUT=30 "$LK_BIN" env -c "$T/run.yaml" 2>&1)
check "trainer.comm_timeout in a -c file beats LK_COMM_TIMEOUT, named with its place" \
  grep -q "= 7 (from trainer.comm_timeout in $T/run.yaml:2:17)$" <<<"$(setting comm_timeout "$out")"
out=$(LK_COMM_TIMEOUT=30 "$LK_BIN" env -c "$T/run.yaml" --trainer.comm_timeout 9 2>&1)
check "a --trainer.comm_timeout override beats both" \
  grep -q "= 9 (from --trainer.comm_timeout on the command line)$" <<<"$(setting comm_timeout "$out")"
out=$(LK_COMM_TIMEOUT=0 "$LK_BIN" env 2>&1)
check "LK_COMM_TIMEOUT outside the key's bounds is said and ignored" \
  bash -c 'grep -q "LK_COMM_TIMEOUT=0 is outside 0.1..1e+06: ignored, as if it were unset" <<<"$1" && grep -qE "^  comm_timeout +=  ?120 \(default\)$" <<<"$1"' _ "$out"
# run.json: the value the trainer gave the communicator (2 ranks: one is created)
j=$(LK_COMM_TIMEOUT=30 fit_json "$T/ct_env" --trainer.devices 2)
check "fit with LK_COMM_TIMEOUT alone: run.json says 30 from LK_COMM_TIMEOUT" \
  test "$(settings_json "$j" comm_timeout)" = "30 LK_COMM_TIMEOUT"
j=$(LK_COMM_TIMEOUT=30 fit_json "$T/ct_key" -c "$T/run.yaml")
check "fit with trainer.comm_timeout in run.yaml: the key wins, run.json names the file" \
  test "$(settings_json "$j" comm_timeout)" = "7 trainer.comm_timeout in $T/run.yaml:2:17"
j=$(fit_json "$T/ct_def")
check "fit with neither: run.json says 120 (default)" test "$(settings_json "$j" comm_timeout)" = "120 default"

# ---- data root: data.init_args.root vs LK_DATA_ROOT ---------------------------
# A tiny Fashion-MNIST layout (16 blank images per split), plain idx files
mkidx() { # mkidx DIR
  mkdir -p "$1"
  for s in train t10k; do
    { printf '\x00\x00\x08\x03\x00\x00\x00\x10\x00\x00\x00\x1c\x00\x00\x00\x1c'; head -c $((16 * 784)) /dev/zero; } > "$1/$s-images-idx3-ubyte"
    { printf '\x00\x00\x08\x01\x00\x00\x00\x10'; head -c 16 /dev/zero; } > "$1/$s-labels-idx1-ubyte"
  done
}
mkidx "$T/fm_env"
mkidx "$T/fm_key"
cat > "$T/fm.yaml" <<YAML
trainer:
  max_epochs: 1
  enable_progress_bar: false
  enable_tensorboard: false
model:
  class_path: mlp
  init_args:
    input_dim: 784
    hidden: [8]
    num_classes: 10
data:
  class_path: fashion_mnist
  init_args:
    val_size: 4
    batch_size: 4
    num_workers: 0
YAML
out=$(LK_DATA_ROOT="$T/fm_env" "$LK_BIN" env 2>&1)
check "LK_DATA_ROOT alone: lockstep env says so" grep -q "= $T/fm_env (from LK_DATA_ROOT" <<<"$(setting data_root "$out")"
out=$(LK_DATA_ROOT="$T/fm_env" "$LK_BIN" env --data.init_args.root "$T/fm_key" 2>&1)
check "data.init_args.root beats LK_DATA_ROOT in lockstep env" \
  grep -q "= $T/fm_key (from --data.init_args.root on the command line)$" <<<"$(setting data_root "$out")"
check "neither: the Debian package's directory (default)" \
  grep -q "= /usr/share/datasets/fashion-mnist (default" <<<"$(setting data_root "$("$LK_BIN" env 2>&1)")"
j=$(LK_DATA_ROOT="$T/fm_env" CFG="$T/fm.yaml" fit_json "$T/dr_env")
check "fit with LK_DATA_ROOT alone reads there, run.json says so" \
  test "$(settings_json "$j" data_root)" = "$T/fm_env LK_DATA_ROOT"
j=$(LK_DATA_ROOT="$T/fm_env" CFG="$T/fm.yaml" fit_json "$T/dr_key" --data.init_args.root "$T/fm_key")
check "fit with data.init_args.root and LK_DATA_ROOT: the key wins, run.json says so" \
  test "$(settings_json "$j" data_root)" = "$T/fm_key data.init_args.root"

# ---- max restarts: lockstep launch --max-restarts vs LK_MAX_RESTARTS ----------
check "LK_MAX_RESTARTS alone: lockstep env says so" \
  grep -q "= 2 (from LK_MAX_RESTARTS" <<<"$(setting max_restarts "$(LK_MAX_RESTARTS=2 "$LK_BIN" env 2>&1)")"
out=$(LK_MAX_RESTARTS=1 "$LK_BIN" launch -n 1 -- sh -c 'echo "m=$TORCHELASTIC_MAX_RESTARTS"' 2>"$T/l1.err")
check "lockstep launch takes LK_MAX_RESTARTS without --max-restarts, and says where from" \
  bash -c '[ "$1" = m=1 ] && grep -q "up to 1 restart (from LK_MAX_RESTARTS)" "$2"' _ "$out" "$T/l1.err"
out=$(LK_MAX_RESTARTS=3 "$LK_BIN" launch -n 1 --max-restarts 0 -- sh -c 'echo "m=$TORCHELASTIC_MAX_RESTARTS"' 2>/dev/null)
check "--max-restarts beats LK_MAX_RESTARTS" test "$out" = m=0

# ---- seed: seed_everything vs PL_GLOBAL_SEED ---------------------------------
grep -v seed_everything "$T/synth.yaml" > "$T/noseed.yaml"
check "PL_GLOBAL_SEED alone is the seed" \
  bash -c "PL_GLOBAL_SEED=11 '$LK_BIN' fit -c '$T/noseed.yaml' --print_config 2>/dev/null | grep -q '^seed_everything: 11\$'"
check "--seed_everything beats PL_GLOBAL_SEED" \
  bash -c "PL_GLOBAL_SEED=11 '$LK_BIN' fit -c '$T/noseed.yaml' --seed_everything 5 --print_config 2>/dev/null | grep -q '^seed_everything: 5\$'"

# ---- variables without a key: the variable beats the default, the source is said
check "LK_NUM_THREADS=1: lockstep env says so" \
  grep -q "= 1 (from LK_NUM_THREADS)$" <<<"$(setting num_threads "$(LK_NUM_THREADS=1 "$LK_BIN" env 2>&1)")"
check "no LK_NUM_THREADS: a rank's share of the CPUs (default)" \
  grep -q "(default; a rank's share: $(nproc) CPUs\? this process may use / 1 rank on this node)" \
  <<<"$(setting num_threads "$("$LK_BIN" env 2>&1)")"
j=$(LK_NUM_THREADS=1 fit_json "$T/nt_env")
check "fit with LK_NUM_THREADS=1: run.json says 1 from LK_NUM_THREADS" test "$(settings_json "$j" num_threads)" = "1 LK_NUM_THREADS"
check "... and the other settings' defaults" \
  bash -c 'test "$(python3 -c "import json,sys; s=json.load(open(sys.argv[1]))[\"settings\"]; print(s[\"log_level\"][\"from\"], s[\"comm_backend\"][\"from\"])" "$1")" = "default default"' _ "$j"
check "LK_LOG_LEVEL=warn: lockstep env says so" \
  grep -q "= warn (from LK_LOG_LEVEL)$" <<<"$(setting log_level "$(LK_LOG_LEVEL=warn "$LK_BIN" env 2>&1)")"
check "LK_COMM_BACKEND=shm: lockstep env says so" \
  grep -q "= shm (from LK_COMM_BACKEND)$" <<<"$(setting comm_backend "$(LK_COMM_BACKEND=shm "$LK_BIN" env 2>&1)")"
j=$(LK_LOG_LEVEL=warn LK_COMM_BACKEND=shm fit_json "$T/lv_env" --trainer.devices 2)
check "fit with LK_LOG_LEVEL and LK_COMM_BACKEND: run.json names both" \
  test "$(settings_json "$j" log_level) $(settings_json "$j" comm_backend)" = "warn LK_LOG_LEVEL shm LK_COMM_BACKEND"
out=$(LK_LOG_LEVEL=loud "$LK_BIN" env 2>&1)
check "an unknown LK_LOG_LEVEL is said and ignored" \
  bash -c 'grep -q "LK_LOG_LEVEL=loud is none of debug, info, warn, error, off: ignored" <<<"$1" && grep -qE "^  log_level +=  ?info \(default\)$" <<<"$1"' _ "$out"
finish
