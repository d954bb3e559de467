/* The typed-op dispatcher: runs a descriptor on its device's backend (or
 * hands it to replay while a step is being captured), falls back to the CPU
 * backend for a host-addressable device whose own backend does not take the
 * descriptor (counted), says UNSUPPORTED naming the descriptor otherwise,
 * and builds the f32 descriptors the autograd ops call. Apart from the
 * registry (registry.c), which replay asks for a device's backend: so
 * replay and the registry do not need each other. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/replay.h"

static int64_t fallbacks;

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
