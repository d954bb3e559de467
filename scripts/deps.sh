#!/usr/bin/env bash
# Installs the Debian packages lockstep needs, only those missing, and says
# which. `scripts/deps.sh --check` only reports (exit 1 when something is
# missing). Set LK_DEPS_EXTRA="python3-torch" to add packages (benchmarks and
# fixture generation use PyTorch; the build and tests do not).
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libopenblas-dev      # GEMM on the CPU
  libdnnl-dev          # bf16/f16 GEMMs on the CPU's matrix units (oneDNN)
  libyaml-dev          # configs
  zlib1g-dev           # idx.gz datasets
  libcjson-dev         # safetensors headers, run.json
  libstb-dev           # PNG pictures
  libcurl4-openssl-dev # rank-0 dataset downloads
  libopenmpi-dev openmpi-bin  # the mpi communicator
  dataset-fashion-mnist       # the default dataset
  bible-kjv bible-kjv-text    # the language models' default text (the King James Bible, `bible`)
  python3              # the local HTTP server in the download tests
  python3-numpy        # tests cross-check our .npy and safetensors files with numpy
  procps               # pgrep in the fault-injection tests
)
# shellcheck disable=SC2206
pkgs+=(${LK_DEPS_EXTRA:-})

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  echo "missing Debian packages: ${missing[*]}"
  exit 1
fi

echo "lockstep: installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "lockstep: need root (or sudo) to run apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists yet.
if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] || [ "${LK_APT_UPDATE:-0}" = 1 ]; then
  $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
