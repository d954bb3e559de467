/* One handle per device index, made on first use (device/gpu.h's
 * lk__lazy_table): the cuda device's compute streams. The fast path is one
 * acquire load, since every kernel launch asks for its stream; the first
 * call for an index takes the table's lock and checks again, so threads
 * racing to it make the handle once. Plain C, built everywhere, so the
 * logic is tested on machines without a GPU. */
#include <stdatomic.h>

#include "device/gpu.h"

lk_status lk__lazy_get(lk__lazy_table *t, int index, lk__lazy_make make, void *ctx, void **out) {
    *out = NULL;
    if (index < 0 || index >= LK__GPU_MAX)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "device index %d out of range (0..%d)", index, LK__GPU_MAX - 1);
    void *h = atomic_load_explicit(&t->slot[index], memory_order_acquire);
    if (h) {
        *out = h;
        return LK_STATUS_OK;
    }
    pthread_mutex_lock(&t->mu);
    lk_status st = LK_STATUS_OK;
    h = atomic_load_explicit(&t->slot[index], memory_order_relaxed); /* another thread may have made it meanwhile */
    if (!h) {
        st = make(ctx, index, &h);
        if (st) h = NULL; /* left empty: a later call tries again */
        else if (!h) st = lk_error(LK_STATUS_INTERNAL, "device %d: its handle was made as NULL", index);
        else atomic_store_explicit(&t->slot[index], h, memory_order_release);
    }
    pthread_mutex_unlock(&t->mu);
    *out = h;
    return st;
}

void *lk__lazy_peek(lk__lazy_table *t, int index) {
    if (index < 0 || index >= LK__GPU_MAX) return NULL;
    return atomic_load_explicit(&t->slot[index], memory_order_acquire);
}
