/* The backend registry and the typed-op dispatcher: which backend runs a
 * device kind's ops, the fallback of a host-addressable device to the CPU
 * backend for descriptors its own backend does not take (counted), the
 * UNSUPPORTED error that names the descriptor, and the descriptor builders
 * the autograd ops call. Dispatch happens once per op call. What the
 * backends themselves use (an op's arity and name, its widened form, the
 * descriptor as text, the f32 matmul precision) is ops.c: this file names
 * the backends, so they must not need it. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/builtin.h"
#include "backend/gemm_path.h"
#include "backend/replay.h"
#ifdef LK_HAVE_CUDA
#include "backend/cuda/gemm.h"
#endif

static const lk_backend *registry[LK_DEVICE_KIND_MAX];
static int64_t fallbacks;

lk_status lk__backend_register(lk_device_kind kind, const lk_backend *be) {
    if ((int)kind <= LK_CPU || (int)kind >= LK_DEVICE_KIND_MAX)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "lk__backend_register: device kind %d out of range (1..%d; kind 0 is the CPU's own backend)",
                        (int)kind, LK_DEVICE_KIND_MAX - 1);
    if (be && (!be->name || !be->supports || !be->run))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "lk__backend_register: the backend for kind %d lacks a name, supports() or run()", (int)kind);
    __atomic_store_n(&registry[kind], be, __ATOMIC_RELEASE);
    lk__device_note_backend(kind, be != NULL); /* for the device layer's check of a default device */
    return LK_STATUS_OK;
}

lk_status lk__builtin_register(const char *name, size_t len) {
    for (int i = 0; i < lk__builtin_count; i++) {
        const lk__builtin_kind *b = &lk__builtin_kinds[i];
        if (strlen(b->name) != len || strncmp(b->name, name, len)) continue;
        LK_TRY(b->register_device());
        return b->backend ? lk__backend_register(b->kind, b->backend) : LK_STATUS_OK;
    }
    return LK_STATUS_OK;
}

lk_status lk__cuda_register(void) { return lk__builtin_register("cuda", 4); }

/* The built-in kinds that register on first use (backend/builtin.c) are
 * known to the device layer from load on; here, since every program that
 * runs an op links this file. */
__attribute__((constructor)) static void install_builtins(void) { lk__device_set_provider(lk__builtin_register); }

const lk_backend *lk__backend(lk_device dev) {
    const lk_backend *be = NULL;
    if ((int)dev.kind > LK_CPU && (int)dev.kind < LK_DEVICE_KIND_MAX)
        be = __atomic_load_n(&registry[dev.kind], __ATOMIC_ACQUIRE);
    return be ? be : &lk__cpu_backend;
}

const char *lk__backend_gemm_path(lk_device_kind kind, lk_dtype dt) {
    if (kind == LK_CUDA) {
#ifdef LK_HAVE_CUDA
        return lk__cuda_gemm_path(dt);
#else
        return NULL;
#endif
    }
    return lk__cpu_gemm_path(dt, LK_F32);
}

int64_t lk__backend_fallbacks(void) { return __atomic_load_n(&fallbacks, __ATOMIC_RELAXED); }

lk_status lk__backend_run(lk_device dev, const lk_op_desc *d, void *const *operands) {
    const lk_backend *be = lk__backend(dev);
    if (__atomic_load_n(&lk__device_intercept_open, __ATOMIC_RELAXED)) { /* inside a step replayed as a graph (replay.c) */
        bool taken;
        lk_status st = lk__replay_op(dev, be, d, operands, &taken);
        if (st || taken) return st;
    }
    if (be->supports(d)) return be->run(d, operands);
    /* The CPU kernels can read a host-addressable device's memory, so a
     * descriptor its backend lacks still runs, on the CPU backend. */
    bool host = lk_device_is_host(dev);
    if (be != &lk__cpu_backend && host && lk__cpu_backend.supports(d)) {
        __atomic_fetch_add(&fallbacks, 1, __ATOMIC_RELAXED);
        return lk__cpu_backend.run(d, operands);
    }
    char what[160], dv[32];
    lk_device_str(dev, dv, sizeof dv);
    if (be != &lk__cpu_backend && !host)
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "the %s backend has no %s, and device %s is not host-addressable, so the CPU backend cannot "
                        "run it there",
                        be->name, lk__op_desc_str(d, what, sizeof what), dv);
    if (be != &lk__cpu_backend)
        return lk_error(LK_STATUS_UNSUPPORTED, "the %s backend has no %s (device %s), and neither has the cpu backend",
                        be->name, lk__op_desc_str(d, what, sizeof what), dv);
    return lk_error(LK_STATUS_UNSUPPORTED, "the %s backend has no %s (device %s)", be->name,
                    lk__op_desc_str(d, what, sizeof what), dv);
}

/* ---- f32 descriptor builders ----------------------------------------------------- */

lk_status lk__unary_f32(lk_device dev, lk_unary_op fn, int64_t n, const float *x, float *y, float alpha) {
    lk_op_desc d = {.op = LK_OP_UNARY, .dtype = {LK_F32, LK_F32}};
    d.unary = (lk_unary_params){fn, n, alpha, false};
    return lk__backend_run(dev, &d, (void *[]){(void *)x, y});
}

lk_status lk__unary_backward_f32(lk_device dev, lk_unary_op fn, int64_t n, const float *x, const float *y,
                                 const float *dy, float *dx, float alpha, bool acc) {
    lk_op_desc d = {.op = LK_OP_UNARY_BACKWARD, .dtype = {LK_F32, LK_F32, LK_F32, LK_F32}};
    d.unary = (lk_unary_params){fn, n, alpha, acc};
    return lk__backend_run(dev, &d, (void *[]){(void *)x, (void *)y, (void *)dy, dx});
}

lk_status lk__binary_f32(lk_device dev, lk_binary_op fn, int ndim, const int64_t *shape, const float *a,
                         const int64_t *sa, const float *b, const int64_t *sb, float *out) {
    lk_op_desc d = {.op = LK_OP_BINARY, .dtype = {LK_F32, LK_F32, LK_F32}};
    d.binary.fn = fn;
    d.binary.ndim = ndim;
    for (int i = 0; i < ndim; i++) d.binary.shape[i] = shape[i], d.binary.sa[i] = sa[i], d.binary.sb[i] = sb[i];
    return lk__backend_run(dev, &d, (void *[]){(void *)a, (void *)b, out});
}

lk_status lk__axpy(lk_device dev, lk_dtype dt, int64_t n, float alpha, const void *x, void *y) {
    lk_op_desc d = {.op = LK_OP_AXPY, .dtype = {dt, dt}};
    d.axpy = (lk_axpy_params){n, alpha};
    return lk__backend_run(dev, &d, (void *[]){(void *)x, y});
}

lk_status lk__axpy_f32(lk_device dev, int64_t n, float alpha, const float *x, float *y) {
    return lk__axpy(dev, LK_F32, n, alpha, x, y);
}

lk_status lk__affine(lk_device dev, lk_dtype dt, int64_t n, float mul, float add, bool has_add, const void *x, void *y) {
    lk_op_desc d = {.op = LK_OP_AFFINE, .dtype = {dt, dt}};
    d.affine = (lk_affine_params){n, mul, add, has_add};
    return lk__backend_run(dev, &d, (void *[]){(void *)x, y});
}

lk_status lk__affine_f32(lk_device dev, int64_t n, float mul, float add, bool has_add, const float *x, float *y) {
    return lk__affine(dev, LK_F32, n, mul, add, has_add, x, y);
}

lk_status lk__sum_to_f32(lk_device dev, int ndim, const int64_t *shape, const float *src, const int64_t *sd,
                         float *dst) {
    lk_op_desc d = {.op = LK_OP_SUM_TO, .dtype = {LK_F32, LK_F32}};
    d.sum_to.ndim = ndim;
    for (int i = 0; i < ndim; i++) d.sum_to.shape[i] = shape[i], d.sum_to.sd[i] = sd[i];
    return lk__backend_run(dev, &d, (void *[]){(void *)src, dst});
}
