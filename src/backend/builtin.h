/* Private: the built-in device kinds and their backends, in one list
 * (builtin.c; registry.c registers a row on first use). The device layer
 * names no kind but the CPU; this list, above both the device and the
 * backend layer, names each built-in kind's device and backend together. */
#ifndef LK_BACKEND_BUILTIN_H
#define LK_BACKEND_BUILTIN_H

#include "backend/backend_impl.h"

typedef struct lk__builtin_kind {
    const char *name;                 /* as lk_device_parse takes it */
    lk_device_kind kind;              /* the number it must get */
    lk_status (*register_device)(void); /* registers the device kind (or says why there is none) */
    const lk_backend *backend;        /* its ops; NULL: the CPU backend */
} lk__builtin_kind;

extern const lk__builtin_kind lk__builtin_kinds[];
extern const int lk__builtin_count;

/* Registers the built-in kind of that name, device then backend
 * (idempotent, thread-safe); OK for a name that is no built-in kind. The
 * device layer's provider for kinds registered on first use
 * (lk__device_set_provider; registry.c installs it at load). */
lk_status lk__builtin_register(const char *name, size_t len);

/* Registers the device kind "cuda" (number LK_CUDA) and its backend when at
 * least one GPU is visible; UNSUPPORTED naming why otherwise (a build
 * without CUDA: "this build has no CUDA backend"). Lazy rather than at load:
 * counting GPUs initialises CUDA, which must not happen in a process that
 * forks ranks later. */
lk_status lk__cuda_register(void);

#endif
