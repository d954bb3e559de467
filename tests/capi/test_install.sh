#!/usr/bin/env bash
# `make install` as a user does it: cmake --install into a fresh prefix,
# then examples/custom_module.c built against the installed tree with
# pkg-config alone — once against liblockstep.so, once against liblockstep.a
# (pkg-config --static) — and run on 2 ranks. A program that includes only
# <lockstep.h> must compile cleanly in strict C11 (every public header,
# trainer.h included, reachable from the umbrella).
# Usage: test_install.sh <build dir> <C compiler>
source "$(dirname "$0")/../cli/lib.sh"
BUILD=$1
CC=${2:-cc}
P=$T/prefix
check "cmake --install" cmake --install "$BUILD" --prefix "$P"
pc=$(find "$P" -name lockstep.pc | head -1)
libdir=$(dirname "$(dirname "$pc")")
check "installed lockstep.pc" test -f "$pc"
check "installed the lockstep program" test -x "$P/bin/lockstep"
check "installed liblockstep.a and .so" test -f "$libdir/liblockstep.a" -a -e "$libdir/liblockstep.so"
check "installed the headers" test -f "$P/include/lockstep.h" -a -f "$P/include/lockstep/trainer.h"
export PKG_CONFIG_PATH=$(dirname "$pc")
check "pkg-config knows lockstep" pkg-config --exists lockstep
echo "cflags: $(pkg-config --cflags lockstep)"
echo "libs: $(pkg-config --libs lockstep)"
echo "static libs: $(pkg-config --static --libs lockstep)"

cat > "$T/umbrella.c" <<'C'
#include <lockstep.h>
int main(void) {
    lk_trainer_config cfg; /* trainer.h */
    lk_tensor *t = lk_tensor_zeros(LK_F32, 1, (int64_t[]){2}); /* tensor.h */
    lk_launch_options lo = lk_launch_options_default(); /* dist.h */
    int ok = !lk_trainer_config_default(&cfg) && t && lo.struct_size > 0;
    lk_tensor_release(t);
    return ok ? 0 : 1;
}
C
check "<lockstep.h> alone compiles (-std=c11 -Wall -Wextra -Werror)" \
  $CC -std=c11 -Wall -Wextra -Werror "$T/umbrella.c" $(pkg-config --cflags --libs lockstep) -o "$T/umbrella"
check "and runs" env LD_LIBRARY_PATH="$libdir" "$T/umbrella"

ran() { # ran NAME OUT: both ranks of the example reported and rank 0 validated
  grep -q '^rank 0 of 2: ' <<<"$2" && grep -q '^\[rank 1\] rank 1 of 2: ' <<<"$2" && grep -q '^val_acc ' <<<"$2"
}
check "cc custom_module.c \$(pkg-config --cflags --libs lockstep)" \
  $CC "$LK_SOURCE_DIR/examples/custom_module.c" $(pkg-config --cflags --libs lockstep) -o "$T/shared_prog"
out=$(LD_LIBRARY_PATH="$libdir" "$T/shared_prog" "$T/run_shared" 2>&1); rc=$?
echo "$out"
check "the shared build runs on 2 ranks" test "$rc" = 0
check "the shared build trained on both ranks" ran shared "$out"

static_libs=$(pkg-config --static --libs lockstep)
check "cc custom_module.c against liblockstep.a with pkg-config --static" \
  $CC "$LK_SOURCE_DIR/examples/custom_module.c" $(pkg-config --cflags lockstep) ${static_libs/-llockstep/-l:liblockstep.a} \
  -o "$T/static_prog"
check "the static build does not need liblockstep.so" bash -c "! ldd '$T/static_prog' | grep -q liblockstep"
out=$("$T/static_prog" "$T/run_static" 2>&1); rc=$?
echo "$out"
check "the static build runs on 2 ranks" test "$rc" = 0
check "the static build trained on both ranks" ran static "$out"
finish
