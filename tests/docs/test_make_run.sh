#!/usr/bin/env bash
# `make run` builds the lockstep program only, then runs: a fresh clone's first
# result does not wait for the test programs (issue 48: on main the whole tree
# was built first). `make test` still builds everything. Checked with make -n,
# which prints the commands without running them.
src=${LK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
fail=0
run=$(make -s -n -C "$src" run BUILD=/nonexistent/lk-build 2>&1)
build_line=$(grep -n 'cmake --build' <<<"$run" | head -1)
run_line=$(grep -n 'scripts/run.sh' <<<"$run" | head -1)
if grep -q -- '--target lockstep' <<<"$build_line" && [ "${build_line%%:*}" -lt "${run_line%%:*}" ]; then
  echo "ok   make run builds only the lockstep target before scripts/run.sh"
else
  echo "FAIL make run: expected 'cmake --build ... --target lockstep' before scripts/run.sh, got:"; echo "$run"; fail=1
fi
t=$(make -s -n -C "$src" test BUILD=/nonexistent/lk-build 2>&1)
if grep 'cmake --build' <<<"$t" | grep -qv -- '--target'; then
  echo "ok   make test builds every target"
else
  echo "FAIL make test: expected a full 'cmake --build', got:"; echo "$t"; fail=1
fi
exit $fail
