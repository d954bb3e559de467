/* The backend registry: which backend runs a device kind's ops (the CPU
 * backend when none is registered), the built-in kinds registered on first
 * use (builtin.c), and each kind's GEMM path. The dispatcher that runs a
 * descriptor on the backend is dispatch.c (dispatch happens once per op
 * call). What the backends themselves use (an op's arity and name, its
 * widened form, the descriptor as text, the f32 matmul precision) is ops.c:
 * this file names the backends, so they must not need it. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/builtin.h"
#include "backend/gemm_path.h"
#include "device/graph.h" /* the device layer: which kinds have a backend, and its provider slot */
#ifdef LK_HAVE_CUDA
#include "backend/cuda/gemm.h"
#endif

static const lk_backend *registry[LK_DEVICE_KIND_MAX];

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
