#!/usr/bin/env bash
# lockstep.pc's Libs.private names the CUDA runtime and NCCL only in a build
# whose library uses them (issue 48): the build's own file against the
# symbols liblockstep.a leaves undefined, and a configure without CUDA
# (a fresh build directory, configured only) names neither.
# Usage: test_pc.sh <build dir> <source dir>
source "$(dirname "$0")/../cli/lib.sh"
BUILD=$1
SRC=$2
libs=$(sed -n 's/^Libs.private: //p' "$BUILD/lockstep.pc")
echo "Libs.private: $libs"
undef=$(nm -u "$BUILD/liblockstep.a" 2>/dev/null)
for pair in cudart:cuda nccl:nccl; do
  lib=${pair%%:*} sym=${pair##*:}
  if grep -qE "^ +U ${sym}[A-Z]" <<<"$undef"; then
    check "the library calls ${sym}*: Libs.private names -l$lib" grep -qw -- "-l$lib" <<<"$libs"
  else
    check "the library calls no ${sym}*: Libs.private does not name -l$lib" bash -c "! grep -qw -- '-l$lib' <<<'$libs'"
  fi
done
check "-ldl is named in every build (NVML is dlopened)" grep -qw -- "-ldl" <<<"$libs"
if cmake -S "$SRC" -B "$T/nocuda" -DLK_CUDA=OFF >"$T/cfg.log" 2>&1; then
  l2=$(sed -n 's/^Libs.private: //p' "$T/nocuda/lockstep.pc")
  check "a build configured with LK_CUDA=OFF names no CUDA library ($l2)" \
    bash -c "! grep -qwE -- '-l(cudart|nccl|cublasLt)' <<<'$l2'"
else
  bad "cmake -DLK_CUDA=OFF failed: $(tail -5 "$T/cfg.log")"
fi
# NCCL turned off after a configure that found it: the cached NCCL_LIB is not named
if cmake -S "$SRC" -B "$T/nonccl" -DLK_NCCL=OFF -DNCCL_LIB=/nonexistent/libnccl.so >"$T/cfg2.log" 2>&1; then
  l3=$(sed -n 's/^Libs.private: //p' "$T/nonccl/lockstep.pc")
  check "LK_NCCL=OFF with a cached NCCL_LIB names no -lnccl ($l3)" bash -c "! grep -qw -- '-lnccl' <<<'$l3'"
else
  bad "cmake -DLK_NCCL=OFF failed: $(tail -5 "$T/cfg2.log")"
fi
finish
