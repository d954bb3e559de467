#!/usr/bin/env bash
# `lockstep env` on any machine: the GPU lines say what CUDA and NVML see,
# or why there is nothing (no driver, a build without CUDA, no NVML), and
# the command still succeeds; a missing NVML library is not an error.
source "$LK_SOURCE_DIR/tests/cli/lib.sh"
out=$("$LK_BIN" env 2>&1); rc=$?
check "env succeeds" [ "$rc" = 0 ]
check "gpus line says what CUDA sees or why not" \
  grep -qE "^gpus +: ([0-9]+ visible to CUDA|no CUDA device visible|built without CUDA)" <<<"$out"
check "nvml line present" grep -q "^gpu stats (nvml)" <<<"$out"
out=$(LK_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 "$LK_BIN" env 2>&1); rc=$?
check "env without NVML still succeeds" [ "$rc" = 0 ]
check "missing NVML is reported, not fatal" grep -q "gpu stats (nvml): not available: NVML not found" <<<"$out"
check "LK_NVML_LIBRARY is listed" grep -q "LK_NVML_LIBRARY" <<<"$out"
finish
