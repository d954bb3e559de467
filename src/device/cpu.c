/* The CPU device: 64-byte aligned host memory. Every other vtable method is
 * left to the dispatcher's host defaults (memset, memcpy, nothing to wait for). */
#include <stdio.h>

#include "device/device_impl.h"

static lk_status cpu_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx, (void)index;
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    if (!*ptr && lk__alloc_refused()) return LK_STATUS_OUT_OF_MEMORY; /* the memory limit's message says more */
    if (!*ptr) return lk_error(LK_STATUS_OUT_OF_MEMORY, "cpu: cannot allocate %zu bytes of host memory", bytes);
    return LK_STATUS_OK;
}

static void cpu_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index, (void)bytes;
    lk_aligned_free(ptr);
}

const lk_device_vtable lk__device_cpu = {
    .name = "cpu",
    .host_addressable = true,
    .alloc = cpu_alloc,
    .free = cpu_free,
};
