#!/usr/bin/env bash
# The main job behind `make run`: fit the autoencoder on Fashion-MNIST with
# DDP on 2 CPU processes, then test the last checkpoint, then say where the
# checkpoint, the logs and the picture are.
set -euo pipefail
build=${1:-build}
shift || true
cfg=examples/autoencoder.yaml
echo "== lockstep fit -c $cfg $*"
"$build/lockstep" fit -c "$cfg" "$@"
echo
echo "== lockstep test -c $cfg --ckpt_path last $*"
"$build/lockstep" test -c "$cfg" --ckpt_path last "$@"
