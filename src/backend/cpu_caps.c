/* What the CPU's own matrix hardware can do for low precision, read with
 * cpuid at run time (one binary serves every machine): AVX512-BF16 (Cooper
 * Lake, Zen 4/5), AVX512-FP16 and AMX-BF16/FP16 (Sapphire Rapids and later).
 * oneDNN makes its own choice of kernels; this is what `lockstep env`,
 * run.json and the trainer's one-time notice report. */
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

lk_cpu_caps lk__cpu_caps(void) {
    lk_cpu_caps c = {0};
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, cx, d;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        c.avx2 = b >> 5 & 1;
        c.avx512f = b >> 16 & 1;
        c.amx_bf16 = d >> 22 & 1;
        c.avx512_fp16 = d >> 23 & 1;
        c.amx_tile = d >> 24 & 1;
        __cpuid_count(7, 1, a, b, cx, d);
        c.avx512_bf16 = a >> 5 & 1;
        c.amx_fp16 = a >> 21 & 1;
    }
#endif
    return c;
}

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
