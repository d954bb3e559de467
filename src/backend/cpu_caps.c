/* What the CPU can do, read with cpuid at run time (one binary serves every
 * machine): the instruction set level lockstep's own loops are dispatched
 * to (backend/isa.h), and the matrix hardware for low precision:
 * AVX512-BF16 (Cooper Lake, Zen 4/5), AVX512-FP16 and AMX-BF16/FP16
 * (Sapphire Rapids and later). oneDNN makes its own choice of kernels; the
 * latter is what `lockstep env`, run.json and the trainer's one-time notice
 * report.
 *
 * CMakeLists.txt compiles this file for plain x86-64 whatever the library's
 * baseline, so that the check below, which runs before main, cannot itself
 * use an instruction the CPU lacks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "backend/isa.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* The x86-64 levels (psABI): v2 = SSSE3, SSE4.1/4.2, POPCNT, CMPXCHG16B;
 * v3 = v2 + AVX, AVX2, FMA, F16C, BMI1/2, LZCNT, MOVBE; v4 = v3 +
 * AVX-512 F/BW/CD/DQ/VL. The AVX levels also need the OS to save the
 * registers (XCR0: YMM for v3, opmask and ZMM for v4). */
typedef struct {
    bool v2, v3, v4;
    lk_cpu_caps caps;
} cpu_info;

#if defined(__x86_64__) || defined(__i386__)
static unsigned long long xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* the intrinsic would need -mxsave */
    return (unsigned long long)hi << 32 | lo;
}
#endif

static cpu_info cpu_read(void) {
    cpu_info r = {0};
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d, max = (unsigned)__get_cpuid_max(0, NULL);
    if (max < 1) return r;
    __cpuid(1, a, b, c, d);
    bool ssse3 = c >> 9 & 1, cx16 = c >> 13 & 1, sse41 = c >> 19 & 1, sse42 = c >> 20 & 1, popcnt = c >> 23 & 1;
    bool fma = c >> 12 & 1, movbe = c >> 22 & 1, osxsave = c >> 27 & 1, avx = c >> 28 & 1, f16c = c >> 29 & 1;
    bool lzcnt = false;
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000001u) { /* int in clang's cpuid.h */
        __cpuid(0x80000001u, a, b, c, d);
        lzcnt = c >> 5 & 1;
    }
    unsigned long long x = osxsave ? xcr0() : 0;
    bool os_ymm = (x & 0x6) == 0x6, os_zmm = (x & 0xe6) == 0xe6;
    r.v2 = ssse3 && cx16 && sse41 && sse42 && popcnt;
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        bool bmi1 = b >> 3 & 1, bmi2 = b >> 8 & 1;
        r.caps.avx2 = b >> 5 & 1;
        r.caps.avx512f = b >> 16 & 1;
        bool dq = b >> 17 & 1, cd = b >> 28 & 1, bw = b >> 30 & 1, vl = b >> 31 & 1;
        r.caps.amx_bf16 = d >> 22 & 1;
        r.caps.avx512_fp16 = d >> 23 & 1;
        r.caps.amx_tile = d >> 24 & 1;
        r.v3 = r.v2 && avx && r.caps.avx2 && fma && f16c && bmi1 && bmi2 && lzcnt && movbe && os_ymm;
        r.v4 = r.v3 && r.caps.avx512f && dq && cd && bw && vl && os_zmm;
        __cpuid_count(7, 1, a, b, c, d);
        r.caps.avx512_bf16 = a >> 5 & 1;
        r.caps.amx_fp16 = a >> 21 & 1;
    }
#endif
    return r;
}

lk_cpu_caps lk__cpu_caps(void) { return cpu_read().caps; }

bool lk__cpu_native(lk_dtype dt) {
    lk_cpu_caps c = lk__cpu_caps();
    if (dt == LK_BF16) return c.avx512_bf16 || c.amx_bf16;
    if (dt == LK_F16) return c.avx512_fp16 || c.amx_fp16;
    return true;
}

const char *lk__cpu_caps_str(char *buf, size_t size) {
    lk_cpu_caps c = lk__cpu_caps();
    snprintf(buf, size, "avx2 %s, avx512f %s, avx512_bf16 %s, avx512_fp16 %s, amx_bf16 %s, amx_fp16 %s",
             c.avx2 ? "yes" : "no", c.avx512f ? "yes" : "no", c.avx512_bf16 ? "yes" : "no",
             c.avx512_fp16 ? "yes" : "no", c.amx_bf16 && c.amx_tile ? "yes" : "no", c.amx_fp16 ? "yes" : "no");
    return buf;
}

/* ---- the dispatch level (backend/isa.h) ---------------------------------- */

int lk__cpu_isa_level = -1;

static const char *const level_names[] = {"baseline", "avx2", "avx512"};

const char *lk__cpu_isa_name(lk_isa_level level) {
    return (unsigned)level <= LK_ISA_AVX512 ? level_names[level] : "?";
}

/* The best level the CPU has of those this build has copies for, lowered to
 * LK_CPU_ISA; a value that names no level is warned about and ignored (as
 * LK_F32_GEMM's is). Racing first calls compute the same value. */
lk_isa_level lk__cpu_isa_init(void) {
    cpu_info c = cpu_read();
    int level = LK_ISA_BASELINE;
#if LK_ISA_AVX2_BUILT
    if (c.v3) level = LK_ISA_AVX2;
#endif
#if LK_ISA_AVX512_BUILT
    if (c.v4) level = LK_ISA_AVX512;
#endif
    (void)c;
    const char *v = lk_env_get("LK_CPU_ISA");
    if (v && strcmp(v, "auto")) {
        int cap = -1;
        for (int k = 0; k <= LK_ISA_AVX512; k++)
            if (!strcmp(v, level_names[k])) cap = k;
        if (cap < 0)
            lk_warn0("LK_CPU_ISA=%s is none of auto, avx512, avx2, baseline: ignored (lockstep's loops run %s)", v,
                     level_names[level]);
        else if (cap < level)
            level = cap;
    }
#if !LK_ISA_AVX2_BUILT
    if (level == LK_ISA_AVX2) level = LK_ISA_BASELINE; /* capped to avx2 on a v3 build: its baseline is that */
#endif
    __atomic_store_n(&lk__cpu_isa_level, level, __ATOMIC_RELAXED);
    return (lk_isa_level)level;
}

#ifndef LK_ISA_BUILD_BASE
#define LK_ISA_BUILD_BASE "compiler default" /* built outside CMakeLists.txt (fuzz/) */
#endif
const char *lk__cpu_isa_build(void) {
    return LK_ISA_BUILD_BASE
#if LK_ISA_AVX2_BUILT && LK_ISA_AVX512_BUILT
        " + avx2, avx512 copies"
#elif LK_ISA_AVX512_BUILT
        " + avx512 copies"
#elif LK_ISA_AVX2_BUILT
        " + avx2 copies"
#else
        ", no copies"
#endif
        ;
}

/* A library built for x86-64-v3 on a CPU without AVX2 would die of SIGILL
 * somewhere; say instead what it needs, before main (LK_X86_LEVEL: the
 * level the library's baseline flags assume, 2 = x86-64-v2, 3 = v3, 4 =
 * v4; unset for a native or non-x86 build). */
#if defined(LK_X86_LEVEL) && (defined(__x86_64__) || defined(__i386__))
__attribute__((constructor)) static void check_baseline(void) {
    cpu_info c = cpu_read();
    bool ok = LK_X86_LEVEL <= 2 ? c.v2 : LK_X86_LEVEL == 3 ? c.v3 : c.v4;
    if (ok) return;
    char msg[320];
    int n = snprintf(msg, sizeof msg,
                     "lockstep: this build needs an x86-64-v%d CPU (%s) and this one is not: rebuild with "
                     "-DLK_X86_BASELINE=x86-64-v2 (or LK_NATIVE=ON)\n",
                     LK_X86_LEVEL,
                     LK_X86_LEVEL <= 2   ? "SSE4.2, POPCNT"
                     : LK_X86_LEVEL == 3 ? "AVX2, FMA, F16C, BMI2"
                                            : "AVX-512 F/BW/CD/DQ/VL");
    if (n > 0 && write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1) < 0) n = 0;
    _exit(70); /* EX_SOFTWARE-like: not a crash, and no atexit handler of a half-started program */
}
#endif
