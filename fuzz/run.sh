#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for N seconds.
#   fuzz/run.sh [SECONDS=60] [TARGET...]
# New interesting inputs go to $LK_FUZZ_BUILD/corpus-<target>/ (the committed
# seeds in fuzz/corpus/<target>/ are only read); a crash leaves its input in
# $LK_FUZZ_BUILD/<target>-crash-* and makes this script exit non-zero.
# Needs clang and its libFuzzer runtime (Debian: libclang-rt-14-dev).
set -euo pipefail
secs=${1:-60}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
build=${LK_FUZZ_BUILD:-$root/build-fuzz}
targets=${*:-fuzz_safetensors fuzz_config fuzz_data_readers fuzz_resume}
CC=${CC:-clang} cmake -S "$root/fuzz" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target $targets >/dev/null
for t in $targets; do
  mkdir -p "$build/corpus-$t"
  echo "== $t: ${secs}s"
  "$build/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/$t-" "$build/corpus-$t" "$root/fuzz/corpus/$t"
done
echo "fuzz: no findings"
