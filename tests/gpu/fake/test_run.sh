#!/usr/bin/env bash
# `make run`'s workflow with `--trainer.accelerator gpu`, on the fake GPU:
# examples/autoencoder.yaml (ddp, two ranks sharing the one GPU over shm:
# LK_ALLOW_OVERSUBSCRIBE=1) fits 40 steps, saves its checkpoint from device
# memory, draws reconstructions.png, then `lockstep test --ckpt_path last`
# loads it back onto the GPU; test_loss matches the CPU's same run within
# 1e-4 relative (cuBLASLt's summation order against OpenBLAS's).
source "$LK_SOURCE_DIR/tests/cli/lib.sh"
cfg="$LK_SOURCE_DIR/examples/autoencoder.yaml"
run() { # run BIN ROOT ACCEL: fit then test, printing test_loss
  local a=(--trainer.accelerator "$3" --trainer.enable_progress_bar false --trainer.default_root_dir "$2")
  LK_ALLOW_OVERSUBSCRIBE=1 "$1" fit -c "$cfg" --trainer.max_steps 40 "${a[@]}" >"$2.fit.out" 2>&1 || return 1
  LK_ALLOW_OVERSUBSCRIBE=1 "$1" test -c "$cfg" --ckpt_path last "${a[@]}" 2>&1 | tee "$2.test.out" | awk '$1 == "test_loss" { print $2 }'
}
cpu=$(run "$LK_CPU_BIN" "$T/cpu" cpu)
check "the CPU run gives a test_loss ($cpu)" [ -n "$cpu" ]
gpu=$(run "$LK_BIN" "$T/gpu" gpu)
check "the fake GPU run gives a test_loss ($gpu)" [ -n "$gpu" ]
[ -n "$gpu" ] || tail -20 "$T/gpu.fit.out" "$T/gpu.test.out"
check "test_loss within 1e-4 of the CPU's ($gpu against $cpu)" \
  awk -v a="$gpu" -v b="$cpu" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 1e-4 * b) }'
check "run.json says gpu" grep -qE '"accelerator": *"gpu"' "$T"/gpu/lightning_logs/version_0/run.json
check "the picture was drawn" [ -s "$T/gpu/lightning_logs/version_0/reconstructions.png" ]
finish
