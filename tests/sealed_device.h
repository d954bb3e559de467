/* A device the host cannot read, for the tests: what a GPU is to the
 * library in the one way that matters for plumbing. Its memory is one large
 * mmap arena (reserved PROT_NONE, MAP_NORESERVE) that stays PROT_NONE except
 * while the device's own methods (alloc/free poisoning, memset, the three
 * copies) or its backend's ops run: then it is unsealed (read-write) under a
 * process-wide recursive mutex and sealed again before they return. Any
 * other host access of device memory is a SIGSEGV at the exact line (run
 * the test under `gdb -batch -ex run -ex bt` for the backtrace).
 *
 * Its backend takes every descriptor the CPU backend takes and runs it on
 * the CPU backend inside an unsealed section, so results are the CPU's bit
 * for bit. It poisons memory on alloc and free (0xFF bytes: NaN as f32) as
 * the debug device does, and counts copies in, out and within (and their
 * bytes), so tests can bound what a training step moves across the
 * boundary. Two devices (sealed:0, sealed:1) share the arena; nothing in the
 * library knows this file. */
#ifndef LK_TEST_SEALED_DEVICE_H
#define LK_TEST_SEALED_DEVICE_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend_impl.h"
#include "lockstep/device.h"

typedef struct {
    long allocs, frees, copies_in, copies_out, copies_within, memsets, ops, bad_frees;
    long copies_in_to[2];    /* copies in per device index: which of sealed:0, sealed:1 got data */
    long copies_out_from[2]; /* copies out per device index: which device a read waited for (dp) */
    size_t bytes_in, bytes_out, live_bytes;
} sealed_stats;

/* A first-fit free list over the arena: the tensor pool caches blocks, so
 * the device sees few allocations and a simple list is enough. */
typedef struct {
    size_t off, size;
} sealed_range;
enum { SEALED_MAX_RANGES = 1 << 14, SEALED_ALIGN = 256 };

static struct {
    char *base;
    size_t cap, bump; /* bump: the high-water mark of allocations */
    size_t top;       /* bump rounded up to whole MiB: only [base, base + top) is ever unsealed */
    sealed_range free_list[SEALED_MAX_RANGES];
    int nfree;
    sealed_range used[SEALED_MAX_RANGES];
    int nused;
    int depth; /* nesting of unsealed sections on the owning thread */
    pthread_mutex_t mu;
    bool ready;
} sealed_arena;
static sealed_stats sealed;
static pthread_once_t sealed_once = PTHREAD_ONCE_INIT;

static void sealed_init_once(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&sealed_arena.mu, &a);
    pthread_mutexattr_destroy(&a);
    sealed_arena.cap = (size_t)4 << 30;
    void *p = mmap(NULL, sealed_arena.cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        sealed_arena.cap = (size_t)1 << 30; /* a smaller address space (ulimit -v) */
        p = mmap(NULL, sealed_arena.cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (p == MAP_FAILED) {
        perror("sealed device: mmap");
        abort();
    }
    sealed_arena.base = p;
    sealed_arena.ready = true;
}

/* Opens an unsealed section (the arena read-write); sections nest. */
static void sealed_open(void) {
    pthread_mutex_lock(&sealed_arena.mu);
    if (sealed_arena.depth++ == 0 && sealed_arena.top &&
        mprotect(sealed_arena.base, sealed_arena.top, PROT_READ | PROT_WRITE)) {
        perror("sealed device: mprotect rw");
        abort();
    }
}

static void sealed_close(void) {
    if (--sealed_arena.depth == 0 && sealed_arena.top && mprotect(sealed_arena.base, sealed_arena.top, PROT_NONE)) {
        perror("sealed device: mprotect none");
        abort();
    }
    pthread_mutex_unlock(&sealed_arena.mu);
}

static bool sealed_owns(const void *p, size_t bytes) {
    const char *c = p;
    return c >= sealed_arena.base && c + bytes <= sealed_arena.base + sealed_arena.bump;
}

static lk_status sealed_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx, (void)index;
    size_t need = (bytes + SEALED_ALIGN - 1) / SEALED_ALIGN * SEALED_ALIGN;
    if (!need) need = SEALED_ALIGN;
    *ptr = NULL;
    sealed_open();
    size_t off = SIZE_MAX;
    for (int i = 0; i < sealed_arena.nfree && off == SIZE_MAX; i++) {
        sealed_range *r = &sealed_arena.free_list[i];
        if (r->size < need) continue;
        off = r->off;
        r->off += need, r->size -= need;
        if (!r->size) sealed_arena.free_list[i] = sealed_arena.free_list[--sealed_arena.nfree];
    }
    if (off == SIZE_MAX && sealed_arena.bump + need <= sealed_arena.cap && sealed_arena.nused < SEALED_MAX_RANGES) {
        off = sealed_arena.bump;
        sealed_arena.bump += need;
        if (sealed_arena.bump > sealed_arena.top) { /* the new pages join the unsealed section now open */
            size_t mib = (size_t)1 << 20, top = (sealed_arena.bump + mib - 1) / mib * mib;
            if (top > sealed_arena.cap) top = sealed_arena.cap;
            if (mprotect(sealed_arena.base + sealed_arena.top, top - sealed_arena.top, PROT_READ | PROT_WRITE)) {
                perror("sealed device: mprotect grow");
                abort();
            }
            sealed_arena.top = top;
        }
    }
    if (off == SIZE_MAX || sealed_arena.nused == SEALED_MAX_RANGES) {
        size_t used = sealed_arena.bump;
        sealed_close();
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "sealed device: cannot allocate %zu bytes (%zu of %zu in use)", bytes,
                        used, sealed_arena.cap);
    }
    sealed_arena.used[sealed_arena.nused++] = (sealed_range){off, need};
    *ptr = sealed_arena.base + off;
    memset(*ptr, 0xff, need); /* poison: NaN as f32 */
    sealed.allocs++;
    sealed.live_bytes += bytes;
    sealed_close();
    return LK_STATUS_OK;
}

static void sealed_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index;
    sealed_open();
    size_t off = (size_t)((char *)ptr - sealed_arena.base);
    int found = -1;
    for (int i = 0; i < sealed_arena.nused && found < 0; i++)
        if (sealed_owns(ptr, 1) && sealed_arena.used[i].off == off) found = i;
    if (found < 0 || sealed_arena.nfree == SEALED_MAX_RANGES) {
        sealed.bad_frees += found < 0;
        sealed_close();
        return; /* not ours: leak rather than corrupt */
    }
    sealed_range r = sealed_arena.used[found];
    sealed_arena.used[found] = sealed_arena.used[--sealed_arena.nused];
    memset(sealed_arena.base + r.off, 0xff, r.size);
    sealed_arena.free_list[sealed_arena.nfree++] = r;
    sealed.frees++;
    sealed.live_bytes -= bytes;
    sealed_close();
}

static lk_status sealed_memset(void *ctx, int index, void *ptr, int value, size_t bytes) {
    (void)ctx, (void)index;
    sealed_open();
    sealed.memsets++;
    memset(ptr, value, bytes);
    sealed_close();
    return LK_STATUS_OK;
}

static lk_status sealed_to_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    sealed_open();
    sealed.copies_out++;
    if (index >= 0 && index < 2) sealed.copies_out_from[index]++;
    sealed.bytes_out += bytes;
    memcpy(dst, src, bytes);
    sealed_close();
    return LK_STATUS_OK;
}

static lk_status sealed_from_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    sealed_open();
    sealed.copies_in++;
    if (index >= 0 && index < 2) sealed.copies_in_to[index]++;
    sealed.bytes_in += bytes;
    memcpy(dst, src, bytes);
    sealed_close();
    return LK_STATUS_OK;
}

static lk_status sealed_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx, (void)index;
    sealed_open();
    sealed.copies_within++;
    memmove(dst, src, bytes);
    sealed_close();
    return LK_STATUS_OK;
}

static int sealed_count(void *ctx) {
    (void)ctx;
    const char *e = getenv("SEALED_DEVICES"); /* 1: ranks share sealed:0 (LK_ALLOW_OVERSUBSCRIBE) */
    return e && atoi(e) > 0 ? atoi(e) : 2;    /* sealed:0 and sealed:1, for dp */
}

static lk_status sealed_copy_peer(void *ctx, int dst_index, void *dst, int src_index, const void *src, size_t bytes);

/* The methods every sealed kind shares: its memory and the plain copies. */
#define SEALED_MEMORY_METHODS                                                                                          \
    .host_addressable = false, .count = sealed_count, .alloc = sealed_alloc, .free = sealed_free,                     \
    .memset = sealed_memset, .copy_to_host = sealed_to_host, .copy_from_host = sealed_from_host, .copy = sealed_copy

static const lk_device_vtable sealed_vtable = {
    .name = "sealed",
    SEALED_MEMORY_METHODS,
    .copy_peer = sealed_copy_peer, /* the peer-copy block at the end */
};

/* ---- the backend: the CPU's, inside an unsealed section ---------------------- */

static bool sealed_be_supports(const lk_op_desc *d) { return lk__cpu_backend.supports(d); }

static lk_status sealed_be_run(const lk_op_desc *d, void *const *x) {
    sealed_open();
    /* A GPU kernel handed a host pointer faults or reads garbage: so is an
     * operand outside the arena here an error naming it. */
    int n = lk__op_arity(d->op);
    for (int i = 0; i < n; i++)
        if (x[i] && !sealed_owns(x[i], 1)) {
            char what[160];
            sealed_close();
            return lk_error(LK_STATUS_INTERNAL, "sealed backend: operand %d of %s is not device memory (%p)", i,
                            lk__op_desc_str(d, what, sizeof what), x[i]);
        }
    sealed.ops++;
    lk_status st = lk__cpu_backend.run(d, x);
    sealed_close();
    return st;
}

static const lk_backend sealed_backend = {.name = "sealed", .supports = sealed_be_supports, .run = sealed_be_run};

/* Registers the sealed device and its backend (once per process) and
 * returns sealed:index. */
static inline lk_device sealed_register(const lk_device_vtable *vt, int index) {
    pthread_once(&sealed_once, sealed_init_once);
    lk_device_kind k = LK_CPU;
    if (lk_device_register(vt, NULL, &k) || lk__backend_register(k, &sealed_backend)) {
        fprintf(stderr, "%s device: %s\n", vt->name, lk_last_error());
        abort();
    }
    return (lk_device){k, index};
}
static inline lk_device sealed_device(int index) { return sealed_register(&sealed_vtable, index); }

/* Copies the counters (taken under the arena's lock, so dp's threads do not tear them). */
static inline sealed_stats sealed_get_stats(void) {
    pthread_mutex_lock(&sealed_arena.mu);
    sealed_stats s = sealed;
    pthread_mutex_unlock(&sealed_arena.mu);
    return s;
}

/* ---- peer copies (sealed:0 <-> sealed:1, no host in between) ----------------- */

/* Counted apart from sealed_stats: a copy between the two sealed devices
 * that never leaves the arena, as cudaMemcpyPeer between two GPUs. */
typedef struct {
    long copies;
    size_t bytes;
} sealed_peer_stats;
static sealed_peer_stats sealed_peer;

static lk_status sealed_copy_peer(void *ctx, int dst_index, void *dst, int src_index, const void *src, size_t bytes) {
    (void)ctx;
    sealed_open();
    if (!sealed_owns(dst, bytes) || !sealed_owns(src, bytes)) { /* a host pointer given as device memory */
        sealed_close();
        return lk_error(LK_STATUS_INTERNAL, "sealed device: peer copy sealed:%d -> sealed:%d of %zu bytes: %s is not device memory",
                        src_index, dst_index, bytes, sealed_owns(src, bytes) ? "the destination" : "the source");
    }
    sealed_peer.copies++;
    sealed_peer.bytes += bytes;
    memmove(dst, src, bytes);
    sealed_close();
    return LK_STATUS_OK;
}

static inline sealed_peer_stats sealed_get_peer_stats(void) {
    pthread_mutex_lock(&sealed_arena.mu);
    sealed_peer_stats s = sealed_peer;
    pthread_mutex_unlock(&sealed_arena.mu);
    return s;
}
/* ==== prefetch: a sealed device whose streams defer their work ================
 * Kind "sealed_async": the sealed device (same arena, backend and counters)
 * plus what the trainer's batch prefetch uses — a copy stream, events,
 * asynchronous copies in, pinned host memory. A copy queued on a stream is
 * only queued: it runs (reading the host source then, as a DMA would) when
 * an event recorded after it is waited for on the default stream or
 * synchronised on the host, when the device synchronises, or when its
 * stream is freed. So an op that reads a batch whose event nobody waited
 * for reads the block's old contents (NaN poison when fresh), and host
 * memory reused before its copy ran is copied as it is then: both show up
 * as wrong bits, not as luck. Its default stream (ops and the synchronous
 * copies) runs at once, so an event recorded there is complete when
 * recorded. Counted in sealed_async_stats. */
enum { SEALED_QMAX = 1024, SEALED_MAX_STREAMS = 8 };
typedef struct {
    long copies_async, host_allocs, host_frees, waits_default, waits_stream, event_syncs, flushed, pending_max;
    long copies_async_to[2]; /* per device index (dp: each replica's slice onto its device) */
    size_t bytes_async;
} sealed_async_counts;
static sealed_async_counts sealed_async_stats;

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    long seq; /* position in its stream: 1, 2, ... */
} sealed_qop;
typedef struct { /* what an lk_stream of this kind points to */
    bool live;
    sealed_qop q[SEALED_QMAX];
    int head, n; /* pending: q[head .. head + n) mod SEALED_QMAX */
    long queued, done;
} sealed_qstream;
static sealed_qstream sealed_streams[SEALED_MAX_STREAMS];
typedef struct { /* what an lk_event of this kind points to */
    int stream; /* -1: the default stream (complete when recorded) */
    long seq;
} sealed_qevent;

/* Runs stream s's queued copies up to position seq (under the arena's lock). */
static void sealed_flush(sealed_qstream *s, long seq) {
    sealed_open();
    while (s->n && s->q[s->head].seq <= seq) {
        sealed_qop *op = &s->q[s->head];
        memcpy(op->dst, op->src, op->bytes);
        s->done = op->seq;
        s->head = (s->head + 1) % SEALED_QMAX;
        s->n--;
        sealed_async_stats.flushed++;
    }
    sealed_close();
}

static lk_status sealed_stream_create(void *ctx, int index, lk_stream **out) {
    (void)ctx, (void)index;
    *out = NULL;
    sealed_open();
    for (int i = 0; i < SEALED_MAX_STREAMS && !*out; i++)
        if (!sealed_streams[i].live) {
            memset(&sealed_streams[i], 0, sizeof sealed_streams[i]);
            sealed_streams[i].live = true;
            *out = (lk_stream *)&sealed_streams[i];
        }
    sealed_close();
    return *out ? LK_STATUS_OK : lk_error(LK_STATUS_OUT_OF_MEMORY, "sealed_async: %d streams at most", SEALED_MAX_STREAMS);
}

static void sealed_stream_free(void *ctx, int index, lk_stream *s) {
    (void)ctx, (void)index;
    sealed_qstream *q = (sealed_qstream *)s;
    sealed_flush(q, q->queued); /* as cudaStreamDestroy: queued work still completes */
    q->live = false;
}

static lk_status sealed_from_host_async(void *ctx, int index, lk_stream *stream, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    sealed_qstream *s = (sealed_qstream *)stream;
    sealed_open();
    if (!sealed_owns(dst, bytes) || s->n == SEALED_QMAX) {
        sealed_close();
        return lk_error(LK_STATUS_INTERNAL, "sealed_async: async copy of %zu bytes to %p: %s", bytes, dst,
                        s->n == SEALED_QMAX ? "the stream's queue is full" : "not device memory");
    }
    s->q[(s->head + s->n) % SEALED_QMAX] = (sealed_qop){dst, src, bytes, ++s->queued};
    s->n++;
    if (s->n > sealed_async_stats.pending_max) sealed_async_stats.pending_max = s->n;
    sealed_async_stats.copies_async++;
    if (index >= 0 && index < 2) sealed_async_stats.copies_async_to[index]++;
    sealed_async_stats.bytes_async += bytes;
    sealed_close();
    return LK_STATUS_OK;
}

static lk_status sealed_event_record(void *ctx, int index, lk_stream *stream, lk_event **out) {
    (void)ctx, (void)index;
    sealed_qstream *s = (sealed_qstream *)stream;
    sealed_qevent *e = malloc(sizeof *e);
    if (!e) return LK_STATUS_OUT_OF_MEMORY;
    sealed_open();
    *e = s ? (sealed_qevent){(int)(s - sealed_streams), s->queued} : (sealed_qevent){-1, 0};
    sealed_close();
    *out = (lk_event *)e;
    return LK_STATUS_OK;
}

/* Work queued on s after this waits for e: on the default stream, which
 * runs at once, that means e's copies run now; a stream waiting for an
 * event of the default stream has nothing to wait for. */
static lk_status sealed_event_wait(void *ctx, int index, lk_stream *s, lk_event *ev) {
    (void)ctx, (void)index;
    const sealed_qevent *e = (const sealed_qevent *)ev;
    sealed_open();
    if (s) sealed_async_stats.waits_stream++;
    else sealed_async_stats.waits_default++;
    if (!s && e->stream >= 0 && sealed_streams[e->stream].live) sealed_flush(&sealed_streams[e->stream], e->seq);
    sealed_close();
    return LK_STATUS_OK;
}

static lk_status sealed_event_sync(void *ctx, int index, lk_event *ev) {
    (void)ctx, (void)index;
    const sealed_qevent *e = (const sealed_qevent *)ev;
    sealed_open();
    sealed_async_stats.event_syncs++;
    if (e->stream >= 0 && sealed_streams[e->stream].live) sealed_flush(&sealed_streams[e->stream], e->seq);
    sealed_close();
    return LK_STATUS_OK;
}

static void sealed_event_free(void *ctx, int index, lk_event *e) {
    (void)ctx, (void)index;
    free(e);
}

static lk_status sealed_async_sync(void *ctx, int index) {
    (void)ctx, (void)index;
    for (int i = 0; i < SEALED_MAX_STREAMS; i++)
        if (sealed_streams[i].live) sealed_flush(&sealed_streams[i], sealed_streams[i].queued);
    return LK_STATUS_OK;
}

static lk_status sealed_host_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx, (void)index;
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    if (!*ptr) return LK_STATUS_OUT_OF_MEMORY;
    sealed_open();
    sealed_async_stats.host_allocs++;
    sealed_close();
    return LK_STATUS_OK;
}

static void sealed_host_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index, (void)bytes;
    lk_aligned_free(ptr);
    sealed_open();
    sealed_async_stats.host_frees++;
    sealed_close();
}

static const lk_device_vtable sealed_async_vtable = {
    .name = "sealed_async",
    SEALED_MEMORY_METHODS,
    .synchronize = sealed_async_sync,
    .stream_create = sealed_stream_create,
    .stream_free = sealed_stream_free,
    .event_record = sealed_event_record,
    .event_wait = sealed_event_wait,
    .event_free = sealed_event_free,
    .host_alloc = sealed_host_alloc,
    .host_free = sealed_host_free,
    .copy_from_host_async = sealed_from_host_async,
    .event_synchronize = sealed_event_sync,
    .copy_peer = sealed_copy_peer, /* dp: gradients and parameters between the replicas without the host */
};

/* Registers sealed_async (once per process) and returns sealed_async:index. */
static inline lk_device sealed_async_device(int index) { return sealed_register(&sealed_async_vtable, index); }

static inline sealed_async_counts sealed_async_get_stats(void) {
    pthread_mutex_lock(&sealed_arena.mu);
    sealed_async_counts s = sealed_async_stats;
    pthread_mutex_unlock(&sealed_arena.mu);
    return s;
}
/* ==== end of prefetch's block ================================================= */

/* ==== graph capture: a sealed device that captures as cuda does ==============
 * Kind "sealed_graph": the sealed device (same arena, backend and counters)
 * plus the vtable's graph methods. Between graph_begin and graph_end every
 * op, memset and copy within is recorded instead of run; a launch replays
 * the record through the sealed backend. As cuda.c does, a capture refuses
 * what it cannot record — an allocation, a free, a copy to or from the
 * host, a synchronize, an op with an operand outside the arena — with "...
 * is not allowed while capturing a graph; the capture was ended", drops
 * what it recorded, and graph_end reports the reason again. The tests
 * capture from one thread (the state is process-wide). sealed_graph_counts
 * counts captures, launches and refusals; sealed_graph_refuse_next > 0
 * makes that many of the next captures refuse their first recorded item
 * (a runtime refusing a capture), for the fallback tests. */
typedef enum { SEALED_REC_OP, SEALED_REC_MEMSET, SEALED_REC_COPY } sealed_rec_kind;
typedef struct {
    sealed_rec_kind kind;
    lk_op_desc d;
    void *x[LK_OP_MAX_OPERANDS];
    void *dst;
    const void *src;
    int value;
    size_t bytes;
} sealed_rec_item;
struct lk_graph { /* the fake's graph: what was recorded */
    int n, cap;
    sealed_rec_item *items;
};
typedef struct {
    long begins, captures, launches, refusals, items_launched;
} sealed_graph_counts;
static sealed_graph_counts sealed_graph_stats;
static int sealed_graph_refuse_next;
static lk_graph *sealed_recording; /* non-NULL while capturing */
static bool sealed_rec_active;      /* between graph_begin and graph_end */
static char sealed_rec_why[256];    /* why an early refusal ended the capture */

static void sealed_rec_drop(lk_graph *g) {
    if (g) free(g->items);
    free(g);
}

static lk_status sealed_rec_refuse(const char *what) {
    snprintf(sealed_rec_why, sizeof sealed_rec_why, "sealed_graph:0: %s is not allowed while capturing a graph; the capture was ended", what);
    sealed_rec_drop(sealed_recording);
    sealed_recording = NULL;
    sealed_graph_stats.refusals++;
    return lk_error(LK_STATUS_INVALID_USAGE, "%s", sealed_rec_why);
}

static lk_status sealed_rec_push(sealed_rec_item it) {
    if (sealed_graph_refuse_next > 0) {
        sealed_graph_refuse_next--;
        return sealed_rec_refuse("a call the test refuses (sealed_graph_refuse_next)");
    }
    if (sealed_recording->n == sealed_recording->cap) {
        int cap = sealed_recording->cap ? 2 * sealed_recording->cap : 64;
        sealed_rec_item *p = realloc(sealed_recording->items, (size_t)cap * sizeof *p);
        if (!p) return lk_error(LK_STATUS_OUT_OF_MEMORY, "graph record: no memory");
        sealed_recording->items = p, sealed_recording->cap = cap;
    }
    sealed_recording->items[sealed_recording->n++] = it;
    return LK_STATUS_OK;
}

static lk_status sealed_rec_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    *ptr = NULL;
    return sealed_recording ? sealed_rec_refuse("an allocation (the pool had no cached block)") : sealed_alloc(ctx, index, bytes, ptr);
}
static void sealed_rec_free(void *ctx, int index, void *ptr, size_t bytes) {
    if (sealed_recording) (void)sealed_rec_refuse("a free of device memory");
    sealed_free(ctx, index, ptr, bytes);
}
static lk_status sealed_rec_memset(void *ctx, int index, void *ptr, int value, size_t bytes) {
    if (sealed_recording) return sealed_rec_push((sealed_rec_item){.kind = SEALED_REC_MEMSET, .dst = ptr, .value = value, .bytes = bytes});
    return sealed_memset(ctx, index, ptr, value, bytes);
}
static lk_status sealed_rec_to_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return sealed_recording ? sealed_rec_refuse("a copy to host") : sealed_to_host(ctx, index, dst, src, bytes);
}
static lk_status sealed_rec_from_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return sealed_recording ? sealed_rec_refuse("a copy from host") : sealed_from_host(ctx, index, dst, src, bytes);
}
static lk_status sealed_rec_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    if (sealed_recording) return sealed_rec_push((sealed_rec_item){.kind = SEALED_REC_COPY, .dst = dst, .src = src, .bytes = bytes});
    return sealed_copy(ctx, index, dst, src, bytes);
}
static lk_status sealed_rec_sync(void *ctx, int index) {
    (void)ctx, (void)index;
    return sealed_recording ? sealed_rec_refuse("synchronize") : LK_STATUS_OK;
}
static lk_status sealed_rec_begin(void *ctx, int index) {
    (void)ctx, (void)index;
    if (sealed_rec_active) return lk_error(LK_STATUS_INVALID_USAGE, "sealed_graph:0: already capturing");
    sealed_recording = calloc(1, sizeof *sealed_recording);
    sealed_rec_active = sealed_recording != NULL, sealed_rec_why[0] = 0;
    sealed_graph_stats.begins++;
    return sealed_recording ? LK_STATUS_OK : lk_error(LK_STATUS_OUT_OF_MEMORY, "graph record: no memory");
}
static lk_status sealed_rec_end(void *ctx, int index, lk_graph **out) {
    (void)ctx, (void)index;
    *out = NULL;
    if (!sealed_rec_active) return lk_error(LK_STATUS_INVALID_USAGE, "sealed_graph:0: graph capture end: no capture in progress");
    sealed_rec_active = false;
    if (!sealed_recording) return lk_error(LK_STATUS_INVALID_USAGE, "sealed_graph:0: graph capture failed, no graph: %s", sealed_rec_why);
    *out = sealed_recording;
    sealed_recording = NULL;
    sealed_graph_stats.captures++;
    return LK_STATUS_OK;
}
static lk_status sealed_rec_launch(void *ctx, int index, lk_graph *g) {
    sealed_graph_stats.launches++;
    for (int i = 0; i < g->n; i++) {
        const sealed_rec_item *it = &g->items[i];
        lk_status st = it->kind == SEALED_REC_OP       ? sealed_be_run(&it->d, it->x)
                       : it->kind == SEALED_REC_MEMSET ? sealed_memset(ctx, index, it->dst, it->value, it->bytes)
                                                       : sealed_copy(ctx, index, it->dst, it->src, it->bytes);
        if (st) return st;
        sealed_graph_stats.items_launched++;
    }
    return LK_STATUS_OK;
}
static void sealed_rec_graph_free(void *ctx, int index, lk_graph *g) {
    (void)ctx, (void)index;
    sealed_rec_drop(g);
}

static const lk_device_vtable sealed_graph_vtable = {
    .name = "sealed_graph",
    .host_addressable = false,
    .count = sealed_count,
    .alloc = sealed_rec_alloc,
    .free = sealed_rec_free,
    .memset = sealed_rec_memset,
    .copy_to_host = sealed_rec_to_host,
    .copy_from_host = sealed_rec_from_host,
    .copy = sealed_rec_copy,
    .synchronize = sealed_rec_sync,
    .graph_begin = sealed_rec_begin,
    .graph_end = sealed_rec_end,
    .graph_launch = sealed_rec_launch,
    .graph_free = sealed_rec_graph_free,
};

static lk_status sealed_rec_be_run(const lk_op_desc *d, void *const *x) {
    if (!sealed_recording) return sealed_be_run(d, x);
    sealed_rec_item it = {.kind = SEALED_REC_OP, .d = *d};
    for (int i = 0; i < lk__op_arity(d->op); i++) {
        if (x[i] && !sealed_owns(x[i], 1)) return sealed_rec_refuse("an op with an operand in host memory (a read into host memory)");
        it.x[i] = x[i];
    }
    return sealed_rec_push(it);
}
static const lk_backend sealed_graph_backend = {.name = "sealed_graph", .supports = sealed_be_supports, .run = sealed_rec_be_run};

/* Registers sealed_graph (once per process) and returns sealed_graph:index. */
static inline lk_device sealed_register_capturing(int index) {
    pthread_once(&sealed_once, sealed_init_once);
    lk_device_kind k = LK_CPU;
    if (lk_device_register(&sealed_graph_vtable, NULL, &k) || lk__backend_register(k, &sealed_graph_backend)) {
        fprintf(stderr, "sealed_graph device: %s\n", lk_last_error());
        abort();
    }
    return (lk_device){k, index};
}

static inline sealed_graph_counts sealed_graph_get_stats(void) {
    pthread_mutex_lock(&sealed_arena.mu);
    sealed_graph_counts s = sealed_graph_stats;
    pthread_mutex_unlock(&sealed_arena.mu);
    return s;
}
/* ==== end of graph capture's block ============================================ */

#endif
