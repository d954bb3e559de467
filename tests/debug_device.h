/* A second device for the tests: host memory behind the device vtable, so
 * the CPU kernels run on it unchanged, with checks a real device would not
 * make. It poisons memory on alloc and free (0xFF bytes: NaN as f32), so a
 * kernel that reads storage it did not write, or a use after free, shows up
 * as NaN; it counts allocations, frees, bytes live and every copy in or out;
 * and it refuses to free a pointer it did not hand out. Proof that the next
 * device is a new file: nothing in the library knows this one. */
#ifndef LK_TEST_DEBUG_DEVICE_H
#define LK_TEST_DEBUG_DEVICE_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/device.h"

typedef struct {
    long allocs, frees, copies_in, copies_out, copies_within, bad_frees;
    size_t live_bytes;
} dbg_stats;

static dbg_stats dbg;
static pthread_mutex_t dbg_mu = PTHREAD_MUTEX_INITIALIZER;
enum { DBG_MAX = 1 << 14 };
static void *dbg_ptrs[DBG_MAX];

static lk_status dbg_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx, (void)index;
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    if (!*ptr) return lk_error(LK_STATUS_OUT_OF_MEMORY, "debug: cannot allocate %zu bytes", bytes);
    memset(*ptr, 0xff, bytes);
    if (getenv("LK_DEBUG_DEVICE_TRACE")) fprintf(stderr, "debug: alloc %zu -> %p\n", bytes, *ptr);
    pthread_mutex_lock(&dbg_mu);
    dbg.allocs++;
    dbg.live_bytes += bytes;
    for (int i = 0; i < DBG_MAX; i++)
        if (!dbg_ptrs[i]) {
            dbg_ptrs[i] = *ptr;
            break;
        }
    pthread_mutex_unlock(&dbg_mu);
    return LK_STATUS_OK;
}

static void dbg_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index;
    pthread_mutex_lock(&dbg_mu);
    int found = -1;
    for (int i = 0; i < DBG_MAX && found < 0; i++)
        if (dbg_ptrs[i] == ptr) found = i;
    if (found < 0) {
        dbg.bad_frees++;
        pthread_mutex_unlock(&dbg_mu);
        return; /* not ours: leak rather than corrupt */
    }
    dbg_ptrs[found] = NULL;
    dbg.frees++;
    dbg.live_bytes -= bytes;
    pthread_mutex_unlock(&dbg_mu);
    memset(ptr, 0xff, bytes);
    lk_aligned_free(ptr);
}

static lk_status dbg_to_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx, (void)index;
    __atomic_fetch_add(&dbg.copies_out, 1, __ATOMIC_RELAXED);
    memcpy(dst, src, bytes);
    return LK_STATUS_OK;
}

static lk_status dbg_from_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx, (void)index;
    __atomic_fetch_add(&dbg.copies_in, 1, __ATOMIC_RELAXED);
    memcpy(dst, src, bytes);
    return LK_STATUS_OK;
}

static lk_status dbg_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx, (void)index;
    __atomic_fetch_add(&dbg.copies_within, 1, __ATOMIC_RELAXED);
    memmove(dst, src, bytes);
    return LK_STATUS_OK;
}

static int dbg_count(void *ctx) {
    (void)ctx;
    return 2; /* two "debug" devices, so index checks are exercised */
}

static const lk_device_vtable dbg_vtable = {
    .name = "debug",
    .host_addressable = true,
    .count = dbg_count,
    .alloc = dbg_alloc,
    .free = dbg_free,
    .copy_to_host = dbg_to_host,
    .copy_from_host = dbg_from_host,
    .copy = dbg_copy,
};

/* Registers the debug device (once per process) and returns it as device 0. */
static lk_device dbg_device(void) {
    lk_device_kind k = LK_CPU;
    if (lk_device_register(&dbg_vtable, NULL, &k)) {
        fprintf(stderr, "debug device: %s\n", lk_last_error());
        abort();
    }
    return (lk_device){k, 0};
}

#endif
