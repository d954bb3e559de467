# The library's objects use no instruction above what they may assume
# (src/backend/isa.h): the objects compiled for the baseline hold no VEX or
# EVEX instruction (AVX, AVX2, FMA, F16C, BMI1/2 and AVX-512 are all encoded
# so), nor LZCNT or MOVBE, when the baseline is x86-64-v2 or the compiler's
# default; with an x86-64-v3 baseline, and in the avx2 copies, no EVEX
# (AVX-512). Only the avx512 copies may hold AVX-512. Read from the
# instructions' bytes (objdump -d): in 64-bit code an instruction whose
# opcode starts with c4/c5 is VEX-encoded, with 62 EVEX-encoded.
#   test_isa_objects.sh OBJECT_DIR BASELINE   (BASELINE: x86-64-v2, x86-64-v3, x86-64-v4, x86-64)
. "$(dirname "$0")/../cli/lib.sh"
dir=$1 baseline=$2
command -v objdump >/dev/null || { echo "skip: no objdump"; exit 77; }
# worst OBJECT: the highest encoding class of its instructions, as
# "evex", "vex", "v3" (LZCNT or MOVBE) or "none", with the first such instruction
worst() {
  objdump -d --no-addresses --insn-width=16 "$1" 2>/dev/null | awk -F'\t' '
    NF >= 3 && $2 ~ /^[0-9a-f][0-9a-f] / {
      n = split($2, b, " "); k = 1
      while (k <= n && b[k] ~ /^(66|67|f0|f2|f3|2e|3e|26|36|64|65|4[0-9a-f])$/) k++
      c = b[k] == "62" ? 3 : (b[k] == "c4" || b[k] == "c5") ? 2 : ($3 ~ /^(lzcnt|movbe)/) ? 1 : 0
      if (c > cls) { cls = c; insn = $3 }
    }
    END { name[0] = "none"; name[1] = "v3"; name[2] = "vex"; name[3] = "evex"; printf "%s %s\n", name[cls + 0], insn }'
}
rank() { case $1 in none) echo 0 ;; v3) echo 1 ;; vex) echo 2 ;; evex) echo 3 ;; esac; }
case $baseline in
  x86-64-v4) base_max=3 ;;
  x86-64-v3) base_max=2 ;;
  *) base_max=0 ;;
esac
objs=$(find "$dir" -name '*.o' | sort)
[ -n "$objs" ] || { echo "no objects under $dir"; exit 1; }
nbase=0 ncopy=0 avx512_seen=0
for o in $objs; do
  read -r cls insn <<<"$(worst "$o")"
  r=$(rank "$cls")
  case $o in
    */isa/avx512/*) ncopy=$((ncopy + 1)); [ "$r" = 3 ] && avx512_seen=1; continue ;;
    */isa/avx2/*) ncopy=$((ncopy + 1)); max=2 ;;
    *) nbase=$((nbase + 1)); max=$base_max ;;
  esac
  [ "$r" -le "$max" ] || bad "${o#$dir/} ($baseline build) holds a $cls instruction: $insn"
done
check "$nbase baseline objects and $ncopy copies read" test "$nbase" -gt 0
# the audit can see AVX-512 at all: some avx512 copy holds it (when any was built)
if find "$dir" -path '*/isa/avx512/*' -name '*.o' | grep -q .; then
  check "the avx512 copies hold AVX-512 instructions (the audit sees them)" test "$avx512_seen" = 1
fi
finish
