/* The device registry and dispatch: kinds by number (LK_CPU first, then
 * whatever registers), the process's default device, and the host defaults
 * for the vtable methods a host-addressable device leaves out, and the
 * graph-capture wrappers (device/graph.h), which name a kind without graph
 * methods instead of calling NULL. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device_impl.h"
#include "device/graph.h"

typedef struct {
    const lk_device_vtable *vt;
    void *ctx;
} entry;

static entry kinds[LK_DEVICE_KIND_MAX] = {[LK_CPU] = {&lk__device_cpu, NULL}};
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
/* kind and index packed, so threads read it in one load */
static atomic_int default_dev = 0;

/* The interceptor (device/graph.h; the step replayed as a graph,
 * backend/replay.c, installs itself at load) defers a step's work on a
 * device that can capture: before the host needs d, it is issued. */
int lk__device_intercept_open;
static const lk__device_interceptor *_Atomic icpt;
static bool has_backend[LK_DEVICE_KIND_MAX]; /* lk__device_note_backend */
static lk__device_provider _Atomic provider;

void lk__device_set_interceptor(const lk__device_interceptor *ic) { atomic_store(&icpt, ic); }
void lk__device_note_backend(lk_device_kind k, bool present) {
    if ((unsigned)k < LK_DEVICE_KIND_MAX) __atomic_store_n(&has_backend[k], present, __ATOMIC_RELEASE);
}
void lk__device_set_provider(lk__device_provider provide) { atomic_store(&provider, provide); }

static const lk__device_interceptor *interceptor(void) {
    return atomic_load_explicit(&icpt, memory_order_acquire);
}
#define REPLAY_ON() (__atomic_load_n(&lk__device_intercept_open, __ATOMIC_RELAXED) && interceptor())
#define REPLAY_SYNC(d)                                                                                                  \
    do {                                                                                                               \
        if (REPLAY_ON()) LK_TRY(interceptor()->sync(d));                                                               \
    } while (0)

lk_status lk_device_register(const lk_device_vtable *vt, void *ctx, lk_device_kind *kind) {
    if (!vt || !vt->name || !vt->alloc || !vt->free)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_device_register: a vtable with a name, alloc and free is required");
    if (!vt->host_addressable && (!vt->copy_to_host || !vt->copy_from_host || !vt->memset || !vt->copy))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "lk_device_register: device '%s' is not host-addressable, so it must provide memset and "
                        "all three copies",
                        vt->name);
    pthread_mutex_lock(&reg_mu);
    int free_slot = -1;
    for (int k = 0; k < LK_DEVICE_KIND_MAX; k++) {
        if (kinds[k].vt && !strcmp(kinds[k].vt->name, vt->name)) {
            pthread_mutex_unlock(&reg_mu);
            *kind = (lk_device_kind)k;
            return LK_STATUS_OK;
        }
        /* CUDA's number is kept for the CUDA device whether or not it is built */
        if (!kinds[k].vt && free_slot < 0 && (k != LK_CUDA || !strcmp(vt->name, "cuda"))) free_slot = k;
    }
    if (!strcmp(vt->name, "cuda")) free_slot = LK_CUDA;
    if (free_slot < 0) {
        pthread_mutex_unlock(&reg_mu);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_device_register: no room for device '%s' (%d kinds at most)",
                        vt->name, LK_DEVICE_KIND_MAX);
    }
    kinds[free_slot] = (entry){vt, ctx};
    pthread_mutex_unlock(&reg_mu);
    *kind = (lk_device_kind)free_slot;
    return LK_STATUS_OK;
}

static const entry *get(lk_device d) {
    if ((unsigned)d.kind >= LK_DEVICE_KIND_MAX || !kinds[d.kind].vt) return NULL;
    return &kinds[d.kind];
}

static lk_status unknown(lk_device d) {
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "device kind %d is not registered in this process", (int)d.kind);
}

lk_status lk_device_parse(const char *name, lk_device *out) { /* *out is left unchanged on failure */
    const char *colon = strchr(name, ':');
    size_t len = colon ? (size_t)(colon - name) : strlen(name);
    int index = 0;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || v < 0 || v > 1 << 20)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "device '%s': expected KIND or KIND:INDEX (e.g. cuda:1)", name);
        index = (int)v;
    }
    /* Some kinds register on first use, not at load (cuda: device/gpu.h says
     * why); naming one is such a use, and its failure says why there is none.
     * The built-in list (backend/builtin.c) knows them; this layer does not. */
    lk__device_provider provide = atomic_load(&provider);
    if (provide) {
        bool known_kind = false;
        for (int k = 0; k < LK_DEVICE_KIND_MAX && !known_kind; k++)
            known_kind = kinds[k].vt && strlen(kinds[k].vt->name) == len && !strncmp(kinds[k].vt->name, name, len);
        if (!known_kind) LK_TRY(provide(name, len));
    }
    char known[256] = "";
    for (int k = 0; k < LK_DEVICE_KIND_MAX; k++) {
        if (!kinds[k].vt) continue;
        if (strlen(kinds[k].vt->name) == len && !strncmp(kinds[k].vt->name, name, len)) {
            int n = lk_device_count((lk_device_kind)k);
            if (index >= n)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "device '%s': this process sees %d %s device%s", name, n,
                                kinds[k].vt->name, n == 1 ? "" : "s");
            *out = (lk_device){(lk_device_kind)k, index};
            return LK_STATUS_OK;
        }
        size_t kl = strlen(known);
        snprintf(known + kl, sizeof known - kl, "%s%s", kl ? ", " : "", kinds[k].vt->name);
    }
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown device '%s' (registered in this build: %s)", name, known);
}

const char *lk_device_str(lk_device d, char *buf, size_t size) {
    const entry *e = get(d);
    if (!e) snprintf(buf, size, "device%d:%d", (int)d.kind, d.index);
    else if (d.kind == LK_CPU) snprintf(buf, size, "%s", e->vt->name);
    else snprintf(buf, size, "%s:%d", e->vt->name, d.index);
    return buf;
}

bool lk_device_equal(lk_device a, lk_device b) { return a.kind == b.kind && a.index == b.index; }

bool lk_device_is_host(lk_device d) {
    const entry *e = get(d);
    return e && e->vt->host_addressable;
}

int lk_device_count(lk_device_kind kind) {
    const entry *e = get((lk_device){kind, 0});
    if (!e) return 0;
    return e->vt->count ? e->vt->count(e->ctx) : 1;
}

/* The constructors make tensors on the default device, and ops run where
 * their inputs are, so a device the CPU cannot address needs a backend of
 * its own before anything made there can be used. */
static lk_status check_default(lk_device d) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    if (!e->vt->host_addressable && (d.kind == LK_CPU || !__atomic_load_n(&has_backend[d.kind], __ATOMIC_ACQUIRE)))
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "device '%s' cannot be the default yet: no backend runs ops on its memory in this build "
                        "(it is not host-addressable and no backend is registered for its kind)",
                        e->vt->name);
    return LK_STATUS_OK;
}

/* A thread's own default (dp's replica threads, each on its device), as
 * CUDA's current device is per thread; -1: the process's. */
static _Thread_local int thread_dev = -1;

lk_status lk_device_set_thread_default(const lk_device *d) {
    if (!d) {
        thread_dev = -1;
        return LK_STATUS_OK;
    }
    LK_TRY(check_default(*d));
    thread_dev = (int)d->kind | d->index << 8;
    return LK_STATUS_OK;
}

lk_device lk_device_default(void) {
    int v = thread_dev >= 0 ? thread_dev : atomic_load_explicit(&default_dev, memory_order_relaxed);
    return (lk_device){(lk_device_kind)(v & 0xff), v >> 8};
}

lk_status lk_device_set_default(lk_device d) {
    LK_TRY(check_default(d));
    atomic_store(&default_dev, (int)d.kind | d.index << 8);
    return LK_STATUS_OK;
}

lk_status lk_device_alloc(lk_device d, size_t bytes, void **ptr) {
    const entry *e = get(d);
    *ptr = NULL;
    if (!e) return unknown(d);
    LK_TRY(e->vt->alloc(e->ctx, d.index, bytes, ptr));
    const lk__device_interceptor *ic = interceptor();
    if (e->vt->graph_begin && ic) ic->note_alloc(d, *ptr, bytes); /* what replay.c counts as device memory */
    return LK_STATUS_OK;
}

void lk_device_free(lk_device d, void *ptr, size_t bytes) {
    const entry *e = get(d);
    const lk__device_interceptor *ic = interceptor();
    if (ptr && e && e->vt->graph_begin && ic) ic->note_free(d, ptr, bytes); /* deferred work first; graphs dropped */
    if (ptr && e) e->vt->free(e->ctx, d.index, ptr, bytes);
}

lk_status lk_device_memset(lk_device d, void *ptr, int value, size_t bytes) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    if (REPLAY_ON()) {
        bool taken;
        lk_status st = interceptor()->memset(d, ptr, value, bytes, &taken);
        if (st || taken) return st;
    }
    if (e->vt->memset) return e->vt->memset(e->ctx, d.index, ptr, value, bytes);
    memset(ptr, value, bytes);
    return LK_STATUS_OK;
}

lk_status lk_device_copy(lk_device dst_dev, void *dst, lk_device src_dev, const void *src, size_t bytes) {
    const entry *de = get(dst_dev), *se = get(src_dev);
    if (!de) return unknown(dst_dev);
    if (!se) return unknown(src_dev);
    if (!bytes) return LK_STATUS_OK;
    if (REPLAY_ON()) {
        bool taken = false;
        const lk__device_interceptor *ic = interceptor();
        lk_status st = lk_device_equal(dst_dev, src_dev) && de->vt->copy ? ic->copy(dst_dev, dst, src, bytes, &taken)
                                                                          : ic->sync(dst_dev);
        if (!st && !taken && !lk_device_equal(dst_dev, src_dev)) st = ic->sync(src_dev);
        if (st || taken) return st;
    }
    if (lk_device_equal(dst_dev, src_dev) && de->vt->copy) return de->vt->copy(de->ctx, dst_dev.index, dst, src, bytes);
    bool dst_host = dst_dev.kind == LK_CPU, src_host = src_dev.kind == LK_CPU;
    /* One side is the CPU: the other device's own copy (or memcpy when it
     * leaves that out, which only host-addressable devices may). */
    if (src_host && !dst_host && de->vt->copy_from_host)
        return de->vt->copy_from_host(de->ctx, dst_dev.index, dst, src, bytes);
    if (dst_host && !src_host && se->vt->copy_to_host)
        return se->vt->copy_to_host(se->ctx, src_dev.index, dst, src, bytes);
    if (de->vt->host_addressable && se->vt->host_addressable) {
        memcpy(dst, src, bytes);
        return LK_STATUS_OK;
    }
    /* Two devices of one kind: directly, where the kind can (dp's replicas on GPUs). */
    if (dst_dev.kind == src_dev.kind && de->vt->copy_peer)
        return de->vt->copy_peer(de->ctx, dst_dev.index, dst, src_dev.index, src, bytes);
    /* Two devices, neither the host: through a host buffer. */
    void *tmp = lk_aligned_alloc(LK_ALIGN, bytes);
    if (!tmp) return lk_error(LK_STATUS_OUT_OF_MEMORY, "device copy: no host buffer of %zu bytes", bytes);
    lk_status st = lk_device_copy(LK_DEVICE_CPU, tmp, src_dev, src, bytes);
    if (!st) st = lk_device_copy(dst_dev, dst, LK_DEVICE_CPU, tmp, bytes);
    lk_aligned_free(tmp);
    return st;
}

lk_status lk_device_synchronize(lk_device d) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    REPLAY_SYNC(d);
    return e->vt->synchronize ? e->vt->synchronize(e->ctx, d.index) : LK_STATUS_OK;
}

/* ---- prefetch: pinned host memory, asynchronous copies, streams and events ----
 * The dispatch for the trainer's batch prefetch (lockstep/device.h says
 * what each call promises). A kind gets the asynchronous path only when it
 * has every piece of it — a stream, events to order the stream against the
 * default one, and an asynchronous copy — since an asynchronous copy the
 * consumer cannot wait for would be a race; otherwise it gets no stream and
 * every call is the synchronous equivalent. */

static bool has_async(const entry *e) {
    const lk_device_vtable *v = e->vt;
    return v->stream_create && v->stream_free && v->event_record && v->event_wait && v->event_free &&
           v->copy_from_host_async;
}

lk_status lk_device_host_alloc(lk_device d, size_t bytes, void **ptr) {
    const entry *e = get(d);
    *ptr = NULL;
    if (!e) return unknown(d);
    if (e->vt->host_alloc && e->vt->host_free) return e->vt->host_alloc(e->ctx, d.index, bytes, ptr);
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    if (!*ptr && lk__alloc_refused()) return LK_STATUS_OUT_OF_MEMORY; /* the memory limit's message says more */
    return *ptr ? LK_STATUS_OK : lk_error(LK_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
}

void lk_device_host_free(lk_device d, void *ptr, size_t bytes) {
    const entry *e = get(d);
    if (!ptr) return;
    /* the same test as the alloc, so each pointer goes back where it came from */
    if (e && e->vt->host_alloc && e->vt->host_free) e->vt->host_free(e->ctx, d.index, ptr, bytes);
    else lk_aligned_free(ptr);
}

lk_status lk_device_stream_create(lk_device d, lk_stream **out) {
    const entry *e = get(d);
    *out = NULL;
    if (!e) return unknown(d);
    return has_async(e) ? e->vt->stream_create(e->ctx, d.index, out) : LK_STATUS_OK;
}

void lk_device_stream_free(lk_device d, lk_stream *s) {
    const entry *e = get(d);
    if (s && e && e->vt->stream_free) e->vt->stream_free(e->ctx, d.index, s);
}

lk_status lk_device_copy_async(lk_device d, lk_stream *s, void *dst, const void *host_src, size_t bytes) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    if (!bytes) return LK_STATUS_OK;
    REPLAY_SYNC(d);
    if (s && has_async(e)) return e->vt->copy_from_host_async(e->ctx, d.index, s, dst, host_src, bytes);
    return lk_device_copy(d, dst, LK_DEVICE_CPU, host_src, bytes);
}

lk_status lk_device_event_record(lk_device d, lk_stream *s, lk_event **out) {
    const entry *e = get(d);
    *out = NULL;
    if (!e) return unknown(d);
    REPLAY_SYNC(d); /* the event follows the step's work issued so far */
    return e->vt->event_record && e->vt->event_wait && e->vt->event_free ? e->vt->event_record(e->ctx, d.index, s, out)
                                                                          : LK_STATUS_OK;
}

lk_status lk_device_event_wait(lk_device d, lk_stream *s, lk_event *ev) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    REPLAY_SYNC(d);
    return ev ? e->vt->event_wait(e->ctx, d.index, s, ev) : LK_STATUS_OK;
}

lk_status lk_device_event_synchronize(lk_device d, lk_event *ev) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    if (!ev) return LK_STATUS_OK;
    REPLAY_SYNC(d);
    if (e->vt->event_synchronize) return e->vt->event_synchronize(e->ctx, d.index, ev);
    return lk_device_synchronize(d);
}

void lk_device_event_free(lk_device d, lk_event *ev) {
    const entry *e = get(d);
    if (ev && e && e->vt->event_free) e->vt->event_free(e->ctx, d.index, ev);
}

/* ---- graph capture ----
 * Thin: the kind does the work (cuda.c); here only the error for a kind
 * that has no graphs, so that a caller on the cpu device gets a sentence
 * instead of a NULL call. */

static bool has_graphs(const entry *e) {
    const lk_device_vtable *v = e->vt;
    return v->graph_begin && v->graph_end && v->graph_launch && v->graph_free;
}

static lk_status no_graphs(const entry *e, lk_device d, const char *what) {
    char name[32];
    return lk_error(LK_STATUS_UNSUPPORTED, "%s: device '%s' cannot capture graphs (its kind '%s' has no graph methods)",
                    what, lk_device_str(d, name, sizeof name), e->vt->name);
}

bool lk__device_can_capture(lk_device d) {
    const entry *e = get(d);
    return e && has_graphs(e);
}

lk_status lk__device_graph_begin(lk_device d) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    if (!has_graphs(e)) return no_graphs(e, d, "graph capture");
    return e->vt->graph_begin(e->ctx, d.index);
}

lk_status lk__device_graph_end(lk_device d, lk_graph **out) {
    const entry *e = get(d);
    *out = NULL;
    if (!e) return unknown(d);
    if (!has_graphs(e)) return no_graphs(e, d, "graph capture end");
    return e->vt->graph_end(e->ctx, d.index, out);
}

lk_status lk__device_graph_launch(lk_device d, lk_graph *g) {
    const entry *e = get(d);
    if (!e) return unknown(d);
    if (!has_graphs(e)) return no_graphs(e, d, "graph launch");
    if (!g) return lk_error(LK_STATUS_INVALID_ARGUMENT, "graph launch: no graph (NULL)");
    return e->vt->graph_launch(e->ctx, d.index, g);
}

void lk__device_graph_free(lk_device d, lk_graph *g) {
    const entry *e = get(d);
    if (g && e && e->vt->graph_free) e->vt->graph_free(e->ctx, d.index, g);
}
