#!/usr/bin/env bash
# Run on a development machine with a package registry (Debian/Ubuntu,
# amd64): downloads, without installing, the .deb files of the build
# dependencies (scripts/deps.sh) that a bare CUDA image lacks, into
# .gpu-debs/ (git-ignored). tools/gpu/session.sh unpacks them on the GPU
# machine, which reaches no registry. Carry .gpu-debs in the device call.
#
# Chosen for the CUDA image (nvcc, gcc, cmake, ninja, python3 — no -dev
# libraries): OpenBLAS and what it loads (libgfortran5, libquadmath0),
# libyaml, cJSON, zlib, stb (PNG writer), pkgconf, and oneDNN with what it
# loads (libgomp1, ocl-icd-libopencl1), without which the host's bf16 and
# f16 CPU figures would take the f32 fallback. Left out because the build
# does without them: OpenMPI (no mpi communicator), libcurl (no dataset
# downloads).
# It also packs the issue-18 base commit (LK_AB_BASE, default ae767dc: the
# tree before the milestone-2 reshaping) as base-src.tar.gz, which
# tools/gpu/cpu-bench.sh builds there for its A/B run (the device machine
# gets the working tree without the git history).
# Usage: tools/gpu/fetch-debs.sh [DIR]   (default: .gpu-debs in the repo root)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$root/.gpu-debs}
pkgs=(
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev
  libgfortran5 libquadmath0
  libyaml-dev libyaml-0-2
  libcjson-dev libcjson1
  zlib1g-dev zlib1g
  libstb-dev libstb0
  pkgconf pkgconf-bin libpkgconf3
  libdnnl-dev libdnnl2 ocl-icd-libopencl1 libgomp1
)
# The image is x86-64 (device README); ask for amd64 whatever this machine is.
arch=amd64
if [ "$(dpkg --print-architecture)" != "$arch" ]; then
  echo "fetch-debs: this machine is $(dpkg --print-architecture); the GPU machine is $arch" >&2
  exit 1
fi
mkdir -p "$dir"
cd "$dir"
rm -f ./*.deb
if ! apt-get download "${pkgs[@]}" 2>/tmp/fetch-debs.err; then
  echo "fetch-debs: apt-get download failed; trying after apt-get update" >&2
  cat /tmp/fetch-debs.err >&2
  apt-get update -q >/dev/null && apt-get download "${pkgs[@]}"
fi
# Epochs appear as "%3a" in the names; keep names plain for the transfer.
for f in ./*%3a*.deb; do [ -e "$f" ] && mv "$f" "${f//%3a/_}"; done
base=${LK_AB_BASE:-ae767dc}
tmp=$(mktemp -d)
git -C "$root" archive "$base" | tar -x -C "$tmp"
git -C "$root" log -1 --format='base commit: %h %ad %s' "$base" >"$tmp/BASE_COMMIT"
tar -czf base-src.tar.gz -C "$tmp" .
rm -rf "$tmp"
n=$(ls ./*.deb | wc -l)
size=$(du -sm . | cut -f1)
echo "fetch-debs: $n packages, ${size} MiB in $dir"
if [ "$size" -gt 40 ]; then
  echo "fetch-debs: more than 40 MiB; the device call carries at most 64 MiB with the working tree" >&2
  exit 1
fi
