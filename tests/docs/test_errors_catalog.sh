#!/usr/bin/env bash
# Walks docs/ERRORS.md: every entry must name a test file that exists and
# asserts the entry's message (the first backquoted text of the row).
src=${LK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
pass=0
fail=0
while IFS= read -r line; do
  case "$line" in '| '*'| `tests/'*) ;; *) continue ;; esac
  msg=$(sed -E 's/^\|[^|]*\| [^`]*`([^`]*)`.*/\1/' <<<"$line" | sed 's/\\|/|/g')
  test=$(sed -E 's/.*\| `(tests\/[^`]*)` \|$/\1/' <<<"$line")
  if [ ! -f "$src/$test" ]; then
    echo "FAIL no test file $test for: $msg"; fail=$((fail + 1))
  elif grep -qF -- "$msg" "$src/$test"; then
    pass=$((pass + 1))
  else
    echo "FAIL $test does not assert: $msg"; fail=$((fail + 1))
  fi
done < "$src/docs/ERRORS.md"
[ "$pass" -gt 20 ] || { echo "FAIL only $pass entries found"; fail=$((fail + 1)); }
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
