/* Which code runs conv2d on the CPU backend (backend_impl.h says what each
 * choice means). One setting per process, read once: a run's convolutions
 * never switch path with timing, so its bits repeat. */
#include <string.h>

#include "backend/backend_impl.h"

static int conv_path = -1; /* -1: LK_CONV not read yet */

int lk__cpu_conv_path(void) {
    int p = __atomic_load_n(&conv_path, __ATOMIC_RELAXED);
    if (p < 0) {
        const char *v = lk_env_get("LK_CONV");
        p = LK__CONV_AUTO;
        if (v && !strcmp(v, "onednn")) p = LK__CONV_ONEDNN;
        else if (v && !strcmp(v, "im2col")) p = LK__CONV_IM2COL;
        else if (v && *v && strcmp(v, "auto"))
            lk_log_warn("LK_CONV=%s is none of auto, onednn, im2col: convolutions take the automatic choice", v);
        __atomic_store_n(&conv_path, p, __ATOMIC_RELAXED);
    }
    return p;
}

void lk__cpu_conv_use(int path) { __atomic_store_n(&conv_path, path, __ATOMIC_RELAXED); }

static bool allow_ref;
static int64_t dnnl_runs;

int64_t lk__cpu_conv_dnnl_runs(void) { return __atomic_load_n(&dnnl_runs, __ATOMIC_RELAXED); }

void lk__cpu_conv_allow_ref(bool on) { __atomic_store_n(&allow_ref, on, __ATOMIC_RELAXED); }

lk_status lk__cpu_conv_dnnl(int kind, const lk__dnnl_conv_shape *s, const void *a, const void *b, void *c, void *bias) {
#ifdef LK_HAVE_DNNL
    int p = lk__cpu_conv_path();
    if (p == LK__CONV_IM2COL) return LK_STATUS_UNSUPPORTED;
    /* bf16 where its GEMMs run on bf16 units (LK_ONEDNN=0 turns both off);
     * elsewhere im2col widens to f32 as the GEMMs do */
    bool ref = p == LK__CONV_ONEDNN && __atomic_load_n(&allow_ref, __ATOMIC_RELAXED);
    if (s->mul == LK_BF16 && !ref && !(lk__cpu_lowp_dnnl_on() && lk__dnnl_native(LK_BF16))) return LK_STATUS_UNSUPPORTED;
    /* auto leaves three kinds of layer to im2col, as measured (`lockstep bench
     * ops --conv`, tests/models/bench_convnets.c --layers, docs/BENCHMARKS.md):
     * fewer than 8 input channels per group (a stem on 1-channel images:
     * oneDNN's backward-weights there ran 2-4x slower than im2col's one
     * GEMM); fewer output channels per group than a block of oneDNN's
     * layout (8 outputs on AVX-512 are padded to 16, every kernel then does
     * twice the work: ResNet-20 width 8's 8 -> 8 3x3 layers on 28x28 ran
     * 1.8x slower than im2col, while its 8 -> 16 stride-2 layer ran 1.45x
     * faster); and 1x1 kernels (a projection shortcut: no faster either way,
     * and the reorders to and from blocked layouts are pure extra traffic). */
    if (p == LK__CONV_AUTO &&
        (s->C / s->G < 8 || s->O / s->G < lk__dnnl_f32_block() || (s->kh == 1 && s->kw == 1)))
        return LK_STATUS_UNSUPPORTED;
    lk_status st = lk__dnnl_conv(kind, s, ref ? 2 : p == LK__CONV_ONEDNN, a, b, c, bias);
    if (!st) __atomic_fetch_add(&dnnl_runs, 1, __ATOMIC_RELAXED);
    return st;
#else
    (void)kind, (void)s, (void)a, (void)b, (void)c, (void)bias;
    return LK_STATUS_UNSUPPORTED;
#endif
}

const char *lk__cpu_conv_dnnl_impl(int kind, const lk__dnnl_conv_shape *s) {
#ifdef LK_HAVE_DNNL
    return lk__dnnl_conv_impl(kind, s, 1);
#else
    (void)kind, (void)s;
    return NULL;
#endif
}
