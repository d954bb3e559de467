/* Which instruction set lockstep's own CPU loops run, chosen at run time.
 *
 * The library is compiled for a portable baseline (x86-64: LK_X86_BASELINE
 * in CMakeLists.txt, x86-64-v2 unless set; -march=native only with
 * LK_NATIVE=ON), so it runs on any CPU of that level. The files that hold
 * the hot loops (LK_ISA_SOURCES in CMakeLists.txt: the CPU backend's op
 * families, the bulk 16-bit conversions, the communicators' reductions) are
 * compiled again for each level above the baseline (AVX2 = x86-64-v3,
 * AVX-512 = x86-64-v4), from a generated file that defines LK_ISA_SUFFIX
 * (_avx2, _avx512) and includes the source: each copy's exported functions
 * are named through LK_ISA(), declared through LK_ISA_DECLARE and called
 * through LK_ISA_PICK, which takes the copy for lk__cpu_isa(): the best
 * level that this CPU and its OS support, lowered by LK_CPU_ISA (auto,
 * avx512, avx2, baseline) to run a weaker CPU's code here.
 *
 * Every copy computes the same bits: the code is ISO C (no FMA
 * contraction, -std=c11 makes GCC leave a*b+c alone), never reassociated
 * (no -ffast-math), and the hand-written vector paths (`#ifdef __AVX512F__`
 * inside those files, true in the AVX-512 copy) give their scalar loop's
 * results. So the choice never shows in a result, ranks on different CPUs
 * agree, and the test isa_levels checks it bit for bit. */
#ifndef LK_BACKEND_ISA_H
#define LK_BACKEND_ISA_H

typedef enum { LK_ISA_BASELINE = 0, LK_ISA_AVX2 = 1, LK_ISA_AVX512 = 2 } lk_isa_level;

/* cpu_caps.c. The level is read once (cpuid, xgetbv, LK_CPU_ISA) and kept. */
extern int lk__cpu_isa_level; /* -1 until the first call */
lk_isa_level lk__cpu_isa_init(void);
static inline lk_isa_level lk__cpu_isa(void) {
    int v = __atomic_load_n(&lk__cpu_isa_level, __ATOMIC_RELAXED);
    return v >= 0 ? (lk_isa_level)v : lk__cpu_isa_init();
}
/* The level's name ("baseline", "avx2", "avx512"). */
const char *lk__cpu_isa_name(lk_isa_level level);
/* What this build compiled: "x86-64-v2 + avx2, avx512 copies", "native, no copies". */
const char *lk__cpu_isa_build(void);

/* LK_ISA_AVX2_BUILT / LK_ISA_AVX512_BUILT (compile definitions of the
 * library's objects): whether the copies exist in this build. */
#ifndef LK_ISA_SUFFIX
#define LK_ISA_SUFFIX /* the baseline copy keeps the plain names */
#endif
#define LK__ISA_CAT2(a, b) a##b
#define LK__ISA_CAT(a, b) LK__ISA_CAT2(a, b)
/* The name of this file's copy of fn: fn, fn_avx2 or fn_avx512. */
#define LK_ISA(fn) LK__ISA_CAT(fn, LK_ISA_SUFFIX)

#if LK_ISA_AVX2_BUILT
#define LK__ISA_DECL_AVX2(ret, fn, params) ret fn##_avx2 params;
#define LK__ISA_PICK_AVX2(fn) lk__cpu_isa() >= LK_ISA_AVX2 ? fn##_avx2:
#else
#define LK__ISA_DECL_AVX2(ret, fn, params)
#define LK__ISA_PICK_AVX2(fn)
#endif
#if LK_ISA_AVX512_BUILT
#define LK__ISA_DECL_AVX512(ret, fn, params) ret fn##_avx512 params;
#define LK__ISA_PICK_AVX512(fn) lk__cpu_isa() >= LK_ISA_AVX512 ? fn##_avx512:
#else
#define LK__ISA_DECL_AVX512(ret, fn, params)
#define LK__ISA_PICK_AVX512(fn)
#endif

/* Declares fn and each built copy: LK_ISA_DECLARE(void, f, (int a, float *b)); */
#define LK_ISA_DECLARE(ret, fn, params) LK__ISA_DECL_AVX512(ret, fn, params) LK__ISA_DECL_AVX2(ret, fn, params) ret fn params
/* The copy of fn to call here: LK_ISA_PICK(f)(a, b). */
#define LK_ISA_PICK(fn) (LK__ISA_PICK_AVX512(fn) LK__ISA_PICK_AVX2(fn) fn)

/* In the baseline copy only (a file's functions that have no loop to speed
 * up: supports() predicates, dispatchers). */
#ifndef LK_ISA_VARIANT
#define LK_ISA_VARIANT 0
#endif

#endif
