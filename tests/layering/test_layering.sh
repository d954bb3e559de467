#!/usr/bin/env bash
# The layering test: tools/check_layers.py on the tree (clean but for the
# known violations of known_violations.txt, each still occurring), then the
# checker shown failing where it must — an upward include and a cycle
# planted in a mini-tree and in a copy of the real tree, and a stale
# allowlist entry — and the paths of docs/ARCHITECTURE.md's "Where a new
# thing goes" table checked to exist.
set -u
root=${LK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
check="python3 $root/tools/check_layers.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
expect() { # expect FILE TEXT...: each TEXT appears in FILE
    local f=$1
    shift
    for t in "$@"; do
        grep -qF -- "$t" "$f" || { bad "expected '$t' in:"; cat "$f"; }
    done
}

# 1. the tree as it is
if $check --root "$root" >"$tmp/real.txt" 2>&1; then ok "the tree: $(tail -1 "$tmp/real.txt")"
else bad "the tree has layering violations:"; cat "$tmp/real.txt"; fi

# 2. a mini-tree: layer low below layer high; low.c includes high's header
# (upward) and calls high_fn, high.c calls low_fn (a cycle); mid.c and
# mid2.c call each other inside one layer (a cycle too)
m=$tmp/mini
mkdir -p "$m/docs" "$m/src/low" "$m/src/high" "$m/include/lockstep"
printf 'low src/low include/lockstep/low.h\nhigh src/high\n' >"$m/docs/layers.txt"
printf 'int low_fn(void);\n' >"$m/include/lockstep/low.h"
printf 'int high_fn(void);\n' >"$m/src/high/high.h"
printf '/* low */\n#include "lockstep/low.h"\n#include "high/high.h"\nint low_fn(void) { return high_fn(); }\n' >"$m/src/low/low.c"
printf '#include <lockstep/low.h>\n#include "high/high.h"\nint high_fn(void) { return low_fn() + 1; }\n' >"$m/src/high/high.c"
printf 'int mid2(void);\nint mid1(void) { return mid2(); }\n' >"$m/src/high/mid1.c"
printf 'int mid1(void);\nint mid2(void) { return mid1(); }\n' >"$m/src/high/mid2.c"
if $check --root "$m" >"$tmp/mini.txt" 2>&1; then bad "the mini-tree's planted violations passed"; cat "$tmp/mini.txt"
else
    expect "$tmp/mini.txt" 'src/low/low.c:3: #include "high/high.h" points up a layer' 'src/low/low.c is in layer low' \
        'src/high/high.h is in layer high' 'src/low/low.c:4: uses high_fn, defined in src/high/high.c:3' \
        'files that need each other (2 in the loop): src/high/high.c:3 uses low_fn (src/low/low.c); src/low/low.c:4 uses high_fn (src/high/high.c)' \
        'src/high/mid1.c:1 uses mid2 (src/high/mid2.c); src/high/mid2.c:1 uses mid1 (src/high/mid1.c)'
    ok "the mini-tree: upward include, upward use and both cycles reported"
fi
# the keys the allowlist takes, and an allowlist that lists them all passes
$check --root "$m" --list | grep -v '^    ' >"$m/allow.txt"
expect "$m/allow.txt" 'upward-include src/low/low.c -> src/high/high.h' 'cycle src/high/high.c src/low/low.c' \
    'cycle src/high/mid1.c src/high/mid2.c'
if $check --root "$m" --allow "$m/allow.txt" >/dev/null 2>&1; then ok "the mini-tree with its violations listed passes"
else bad "the mini-tree with every violation listed still fails"; fi
# a file in no layer
mkdir -p "$m/src/stray" && printf 'int stray;\n' >"$m/src/stray/s.c"
$check --root "$m" --allow "$m/allow.txt" >"$tmp/stray.txt" 2>&1 && bad "a file in no layer passed"
expect "$tmp/stray.txt" 'src/stray/s.c: in no layer of docs/layers.txt'

# 3. a copy of the real tree with an upward include planted in core, and a
# stale allowlist entry
c=$tmp/copy
mkdir -p "$c/docs" "$c/tests/layering"
cp -r "$root/src" "$root/include" "$c/"
cp "$root/docs/layers.txt" "$c/docs/"
cp "$root/tests/layering/known_violations.txt" "$c/tests/layering/"
sed -i '0,/^#include/s//#include "train\/train_impl.h"\n#include/' "$c/src/core/alloc.c"
line=$(grep -n 'train/train_impl.h' "$c/src/core/alloc.c" | cut -d: -f1)
if $check --root "$c" >"$tmp/copy.txt" 2>&1; then bad "an upward include planted in src/core/alloc.c passed"
else
    expect "$tmp/copy.txt" "src/core/alloc.c:$line: #include \"train/train_impl.h\" points up a layer" \
        'src/core/alloc.c is in layer core' 'src/train/train_impl.h is in layer train above it'
    ok "the copy: the planted include reported at src/core/alloc.c:$line"
fi
cp "$root/src/core/alloc.c" "$c/src/core/alloc.c"
echo 'cycle src/core/alloc.c src/core/rng.c # a planted stale entry' >>"$c/tests/layering/known_violations.txt"
if $check --root "$c" >"$tmp/stale.txt" 2>&1; then bad "a stale allowlist entry passed"
else expect "$tmp/stale.txt" '"cycle src/core/alloc.c src/core/rng.c" no longer occurs'; ok "a stale entry reported"; fi

# 4. every path the "Where a new thing goes" table names exists (a <name>
# stands for any file there)
awk '/^## Where a new thing goes/{on=1; next} /^## /{on=0} on' "$root/docs/ARCHITECTURE.md" >"$tmp/where.md"
[ -s "$tmp/where.md" ] || bad 'docs/ARCHITECTURE.md has no "Where a new thing goes" section'
n=0
for p in $(grep -o '`[^`]*`' "$tmp/where.md" | tr -d '`' | grep -E '^(src|include|tests|tools|docs)/' | sed 's/[(),:;].*//' | sort -u); do
    n=$((n + 1))
    pat=$(echo "$p" | sed -E 's/<[^>]*>/*/g')
    # shellcheck disable=SC2086
    compgen -G "$root/$pat" >/dev/null || bad "docs/ARCHITECTURE.md's where-things-go table names $p, which does not exist"
done
[ "$n" -ge 5 ] && ok "the where-things-go table: $n paths exist" || bad "the where-things-go table names only $n paths"

[ "$fails" = 0 ] && echo "layering: all checks passed" || echo "layering: $fails check(s) failed"
exit $((fails > 0))
