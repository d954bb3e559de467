/* The training step replayed as a graph (issue 21; docs/GPU.md, "The step
 * as a graph"). This file owns the deferred segment, the cache of captured
 * graphs and the flush; it knows no device kind: a kind gets it by
 * implementing the device vtable's graph methods.
 *
 * Inside a step a strategy opened (single's training step, on a device
 * that can capture, LK_GRAPHS not 0), the ops, memsets and copies within
 * that the step's thread issues on the step's device are appended to a
 * segment instead of being issued. The segment is issued when the host
 * needs the device (a read into host memory, a copy from it, a
 * synchronize, an event, a free of device memory, an op on another
 * non-host device or with an operand that is not device memory, an op
 * from another thread, the step's end):
 *  - the same items as a cached graph (op by op the same descriptor, the
 *    same operands; the same memsets and copies) -> that graph's live
 *    slots are filled and it is launched: one launch for the segment;
 *  - seen once before (its signature) -> captured now, then launched;
 *  - else issued item by item, exactly as without this file.
 * Why this is bit for bit the eager result: a graph runs the same kernels
 * over the same pointers in the same order, and the only values it does
 * not take from its own record are the live slots, filled from the current
 * descriptors (lk__op_live_fill) before each launch. A descriptor field
 * marked live that the kind does not read from a slot (lk__op_live_size 0)
 * counts like any other field: a step where it changes never matches. A
 * capture the device refuses ran nothing, so the segment then runs
 * eagerly and nobody sees an error. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/replay.h"
#include "device/graph.h"

enum {
    RP_GRAPHS = 8,    /* cached graphs (least recently used dropped) */
    RP_SEEN = 32,     /* signatures remembered from eager segments */
    RP_MAX_SEG = 8192, /* items deferred at most; more are issued first */
    RP_REFUSALS = 4    /* refused captures in a row after which none is tried until device memory is freed */
};

typedef enum { RP_OP, RP_MEMSET, RP_COPY } rp_kind;
typedef struct {
    rp_kind kind;
    lk_op_desc d;
    void *x[LK_OP_MAX_OPERANDS];
    void *dst;
    const void *src;
    int value;
    size_t bytes;
    size_t live_off, live_size; /* in the graph's slot buffer (ops only) */
} rp_item;

typedef struct {
    rp_item *v;
    int n, cap;
} rp_list;

typedef struct {
    bool used_slot;
    uint64_t sig;
    rp_list items; /* what was captured (its live fields as at the capture) */
    lk_graph *g;
    void *slot;   /* device memory the live ops read */
    void *mirror; /* its host image, filled before each launch */
    size_t slot_bytes;
    uint64_t last_use;
} rp_graph;

typedef struct {
    uintptr_t lo, hi;
    lk_device dev;
} rp_range;


static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu;
static struct {
    bool open;
    lk_device dev, last_dev;
    bool had_dev;
    pthread_t owner;
    const lk_backend *be;
    rp_list seg;
    uint64_t seen_full[RP_SEEN], seen_shape[RP_SEEN];
    int seen_next;
    rp_graph graphs[RP_GRAPHS];
    uint64_t clock;
    int refused; /* captures refused in a row */
    rp_range *ranges; /* device memory of capturing kinds, sorted by lo */
    int nranges, rcap;
    lk__replay_stats stats;
} R;
/* Set while this thread issues a segment or drops graphs: the device calls
 * it makes then go straight to the device. */
static _Thread_local bool in_flush;

static void init_once(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE); /* a flush's own device calls come back here */
    pthread_mutex_init(&mu, &a);
    pthread_mutexattr_destroy(&a);
}
static void lock(void) {
    pthread_once(&once, init_once);
    pthread_mutex_lock(&mu);
}
static void unlock(void) { pthread_mutex_unlock(&mu); }

/* ---- device memory of the capturing kinds ---------------------------------------- */

static int range_at(uintptr_t p) { /* the last range with lo <= p, or -1 */
    int lo = 0, hi = R.nranges - 1, at = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (R.ranges[mid].lo <= p) at = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    return at;
}

static bool is_device_mem(lk_device dev, const void *p) {
    int at = range_at((uintptr_t)p);
    return at >= 0 && (uintptr_t)p < R.ranges[at].hi && lk_device_equal(R.ranges[at].dev, dev);
}

void lk__replay_note_alloc(lk_device dev, void *ptr, size_t bytes) {
    if (!ptr) return;
    lock();
    if (R.nranges == R.rcap) {
        int cap = R.rcap ? 2 * R.rcap : 256;
        rp_range *n = realloc(R.ranges, (size_t)cap * sizeof *n);
        if (!n) { /* untracked memory is only ever "not device memory": its ops run at the call */
            unlock();
            return;
        }
        R.ranges = n, R.rcap = cap;
    }
    int at = range_at((uintptr_t)ptr) + 1;
    memmove(&R.ranges[at + 1], &R.ranges[at], (size_t)(R.nranges - at) * sizeof *R.ranges);
    R.ranges[at] = (rp_range){(uintptr_t)ptr, (uintptr_t)ptr + (bytes ? bytes : 1), dev};
    R.nranges++;
    unlock();
}

/* ---- signatures and comparison ----------------------------------------------------- */

static uint64_t mix(uint64_t h, const void *p, size_t n) { /* FNV-1a */
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* shape: no parameter field at all (the same ops over the same memory,
 * whatever their values: what tells a per-step value that no live slot
 * carries yet from a different segment); otherwise every field but those
 * a live slot carries. */
static uint64_t item_sig(uint64_t h, const rp_item *it, bool shape) {
    h = mix(h, &it->kind, sizeof it->kind);
    if (it->kind == RP_MEMSET) {
        h = mix(h, &it->dst, sizeof it->dst), h = mix(h, &it->value, sizeof it->value);
        return mix(h, &it->bytes, sizeof it->bytes);
    }
    if (it->kind == RP_COPY) {
        h = mix(h, &it->dst, sizeof it->dst), h = mix(h, &it->src, sizeof it->src);
        return mix(h, &it->bytes, sizeof it->bytes);
    }
    const lk_op_desc *d = &it->d;
    int arity = lk__op_arity(d->op);
    h = mix(h, &d->op, sizeof d->op);
    h = mix(h, d->dtype, (size_t)arity * sizeof d->dtype[0]);
    h = mix(h, it->x, (size_t)arity * sizeof it->x[0]);
    const lk_op_info *oi = lk__op_info(d->op);
    bool slot = lk__op_live_size(d) > 0;
    for (int f = 0; oi && f < oi->n; f++) {
        if (shape || (oi->f[f].live && slot)) continue;
        h = mix(h, (const char *)d + oi->f[f].off, oi->f[f].size);
    }
    return h;
}

static uint64_t seg_sig(const rp_list *s, bool shape) {
    uint64_t h = 0xcbf29ce484222325ull;
    h = mix(h, &s->n, sizeof s->n);
    for (int i = 0; i < s->n; i++) h = item_sig(h, &s->v[i], shape);
    return h;
}

static bool same_item(const rp_item *a, const rp_item *b) {
    if (a->kind != b->kind) return false;
    if (a->kind == RP_MEMSET) return a->dst == b->dst && a->value == b->value && a->bytes == b->bytes;
    if (a->kind == RP_COPY) return a->dst == b->dst && a->src == b->src && a->bytes == b->bytes;
    if (!lk__op_desc_same(&a->d, &b->d, lk__op_live_size(&b->d) > 0)) return false;
    return !memcmp(a->x, b->x, (size_t)lk__op_arity(a->d.op) * sizeof a->x[0]);
}

static bool same_items(const rp_list *a, const rp_list *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++)
        if (!same_item(&a->v[i], &b->v[i])) return false;
    return true;
}

/* ---- issuing ---------------------------------------------------------------------- */

static lk_status issue(const rp_item *it, const void *live) {
    if (it->kind == RP_MEMSET) return lk_device_memset(R.dev, it->dst, it->value, it->bytes);
    if (it->kind == RP_COPY) return lk_device_copy(R.dev, it->dst, R.dev, it->src, it->bytes);
    lk_op_desc d = it->d;
    d.live = live;
    return R.be->run(&d, it->x);
}

static lk_status issue_eager(const rp_list *s) {
    R.stats.segments_eager++;
    R.stats.eager_items += s->n;
    for (int i = 0; i < s->n; i++) LK_TRY(issue(&s->v[i], NULL));
    return LK_STATUS_OK;
}

static void graph_free(rp_graph *g) {
    lk__device_graph_free(R.dev, g->g);
    if (g->slot) lk_device_free(R.dev, g->slot, g->slot_bytes);
    lk_aligned_free(g->mirror);
    free(g->items.v);
    *g = (rp_graph){0};
    R.stats.cached--;
}

static void drop_all(void) {
    bool was = in_flush;
    in_flush = true; /* the slots' frees come back through note_free */
    for (int i = 0; i < RP_GRAPHS; i++)
        if (R.graphs[i].used_slot) graph_free(&R.graphs[i]);
    in_flush = was;
    R.refused = 0;
    R.stats.drops++;
}

/* The live values of the segment's ops into g's slots: the host image
 * first, then one copy into device memory, issued before the launch. The
 * image is pageable memory on purpose: a copy from it returns once the
 * runtime has staged the bytes, where one from pinned memory would wait
 * for the stream (cuda.c's copy_from_host). */
static lk_status fill_and_launch(rp_graph *g, const rp_list *s) {
    if (g->slot_bytes) {
        for (int i = 0; i < s->n; i++)
            if (g->items.v[i].live_size) lk__op_live_fill(&s->v[i].d, (char *)g->mirror + g->items.v[i].live_off);
        LK_TRY(lk_device_copy(R.dev, g->slot, LK_DEVICE_CPU, g->mirror, g->slot_bytes));
    }
    g->last_use = ++R.clock;
    R.stats.launches++;
    return lk__device_graph_launch(R.dev, g->g);
}

/* Captures s into a free (or the least recently used) cache entry; false
 * when the device refused (nothing ran; the error is cleared). */
static rp_graph *capture(const rp_list *s, uint64_t sig) {
    rp_graph *g = NULL;
    for (int i = 0; i < RP_GRAPHS && !g; i++)
        if (!R.graphs[i].used_slot) g = &R.graphs[i];
    if (!g) {
        g = &R.graphs[0];
        for (int i = 1; i < RP_GRAPHS; i++)
            if (R.graphs[i].last_use < g->last_use) g = &R.graphs[i];
        graph_free(g);
    }
    rp_graph n = {.used_slot = true, .sig = sig};
    n.items.v = malloc((size_t)s->n * sizeof *n.items.v);
    if (!n.items.v) return NULL;
    memcpy(n.items.v, s->v, (size_t)s->n * sizeof *s->v);
    n.items.n = n.items.cap = s->n;
    for (int i = 0; i < s->n; i++) { /* the slot layout: each live op's values, 16-byte aligned */
        rp_item *it = &n.items.v[i];
        it->live_off = n.slot_bytes;
        it->live_size = it->kind == RP_OP ? lk__op_live_size(&it->d) : 0;
        n.slot_bytes += (it->live_size + 15) / 16 * 16;
    }
    lk_status st = LK_STATUS_OK;
    if (n.slot_bytes) { /* before the capture: an allocation inside it is refused */
        st = lk_device_alloc(R.dev, n.slot_bytes, &n.slot);
        if (!st && !(n.mirror = lk_aligned_alloc(LK_ALIGN, n.slot_bytes))) st = LK_STATUS_OUT_OF_MEMORY;
    }
    if (!st) st = lk__device_graph_begin(R.dev);
    if (!st) {
        for (int i = 0; i < s->n && !st; i++)
            st = issue(&n.items.v[i], n.items.v[i].live_size ? (char *)n.slot + n.items.v[i].live_off : NULL);
        lk_status end = lk__device_graph_end(R.dev, &n.g); /* after a refusal: the reason again, no graph */
        if (!st) st = end;
    }
    if (st || !n.g) {
        lk_log_debug("replay: capture of a %d-item segment on the step's device refused: %s", s->n, lk_last_error());
        lk_clear_error();
        R.stats.capture_failures++;
        R.refused++;
        lk__device_graph_free(R.dev, n.g);
        if (n.slot) lk_device_free(R.dev, n.slot, n.slot_bytes);
        lk_aligned_free(n.mirror);
        free(n.items.v);
        return NULL;
    }
    *g = n;
    R.refused = 0;
    R.stats.captures++;
    R.stats.cached++;
    return g;
}

static bool seen(const uint64_t *set, uint64_t sig) {
    for (int i = 0; i < RP_SEEN; i++)
        if (set[i] == sig) return true;
    return false;
}

static lk_status issue_segment(const rp_list *s, bool may_graph) {
    if (!may_graph) return issue_eager(s);
    uint64_t full = seg_sig(s, false);
    for (int i = 0; i < RP_GRAPHS; i++) {
        rp_graph *g = &R.graphs[i];
        if (g->used_slot && g->sig == full && same_items(&g->items, s)) return fill_and_launch(g, s);
    }
    /* A device that keeps refusing (each try costs a capture and then the
     * eager issue) is left alone until memory is freed. */
    if (R.refused < RP_REFUSALS && seen(R.seen_full, full)) {
        rp_graph *g = capture(s, full);
        if (g) return fill_and_launch(g, s);
        return issue_eager(s);
    }
    uint64_t shape = seg_sig(s, true);
    /* The same ops over the same memory as a segment seen before, but a
     * value differs that no live slot carries (Adam's step before
     * lk__op_live_size knows it): eager, counted. */
    if (seen(R.seen_shape, shape)) R.stats.mismatches++;
    R.seen_full[R.seen_next] = full, R.seen_shape[R.seen_next] = shape;
    R.seen_next = (R.seen_next + 1) % RP_SEEN;
    return issue_eager(s);
}

/* Issues the segment (under the lock). may_graph false: eagerly (another
 * thread flushes the step's work: a capture is the capturing thread's). */
static lk_status flush(bool may_graph) {
    if (!R.seg.n) return LK_STATUS_OK;
    in_flush = true;
    lk_status st = issue_segment(&R.seg, may_graph);
    in_flush = false;
    R.seg.n = 0;
    return st;
}

static bool mine(void) { return pthread_equal(R.owner, pthread_self()); }

/* ---- the step ----------------------------------------------------------------------- */

lk_status lk__replay_step_begin(lk_device dev) {
    LK_TRY(lk__replay_step_end());
    /* LK_GRAPHS read as every LK_* number is (lk_env_get_long) */
    if (!lk__device_can_capture(dev) || lk_env_get_long("LK_GRAPHS", 1) == 0) return LK_STATUS_OK;
    lock();
    if (R.had_dev && !lk_device_equal(R.last_dev, dev) && R.stats.cached) drop_all(); /* their pointers are the old device's */
    R.dev = R.last_dev = dev, R.had_dev = true;
    R.be = lk__backend(dev);
    R.owner = pthread_self();
    R.open = true;
    R.stats.steps++;
    __atomic_store_n(&lk__device_intercept_open, 1, __ATOMIC_RELEASE);
    unlock();
    return LK_STATUS_OK;
}

lk_status lk__replay_step_end(void) {
    if (!__atomic_load_n(&lk__device_intercept_open, __ATOMIC_ACQUIRE)) return LK_STATUS_OK;
    lock();
    lk_status st = R.open ? flush(mine()) : LK_STATUS_OK;
    R.open = false;
    __atomic_store_n(&lk__device_intercept_open, 0, __ATOMIC_RELEASE);
    unlock();
    return st;
}

/* ---- the hooks ---------------------------------------------------------------------- */

static lk_status append(rp_item it, bool *taken) {
    if (R.seg.n == RP_MAX_SEG) LK_TRY(flush(true));
    if (R.seg.n == R.seg.cap) {
        int cap = R.seg.cap ? 2 * R.seg.cap : 128;
        rp_item *v = realloc(R.seg.v, (size_t)cap * sizeof *v);
        if (!v) return LK_STATUS_OK; /* not taken: issued at the call after a flush below */
        R.seg.v = v, R.seg.cap = cap;
    }
    R.seg.v[R.seg.n++] = it;
    R.stats.deferred++;
    *taken = true;
    return LK_STATUS_OK;
}

/* Whether a call on dev from this thread may be deferred; if not, what
 * is deferred is issued first when the call could touch it. */
static lk_status gate(lk_device dev, bool *defer) {
    *defer = false;
    if (!R.open || in_flush) return LK_STATUS_OK;
    if (!lk_device_equal(dev, R.dev)) return flush(mine()); /* another device's work might meet the step's (peer) */
    if (!mine()) return flush(false); /* another thread: never reordered with the step's work */
    *defer = true;
    return LK_STATUS_OK;
}

lk_status lk__replay_op(lk_device dev, const lk_backend *be, const lk_op_desc *d, void *const *x, bool *taken) {
    *taken = false;
    if (lk_device_is_host(dev)) return LK_STATUS_OK; /* host memory never meets the step's; no lock (the CPU's worker threads) */
    lock();
    bool defer;
    lk_status st = gate(dev, &defer);
    /* An op the backend does not take errors at the call, as without this file. */
    if (!st && defer && be == R.be && be->supports(d)) {
        rp_item it = {.kind = RP_OP, .d = *d};
        it.d.live = NULL;
        int arity = lk__op_arity(d->op);
        bool device_only = d->live == NULL;
        for (int i = 0; i < arity; i++) {
            it.x[i] = x[i];
            if (x[i] && !is_device_mem(dev, x[i])) device_only = false;
        }
        if (device_only) st = append(it, taken);
        if (!st && !*taken) { /* a host operand: the host reads or wrote it around this call */
            R.stats.passthrough++;
            st = flush(true);
        }
    }
    unlock();
    return st;
}

lk_status lk__replay_memset(lk_device dev, void *ptr, int value, size_t bytes, bool *taken) {
    *taken = false;
    if (lk_device_is_host(dev)) return LK_STATUS_OK; /* host memory never meets the step's; no lock (the CPU's worker threads) */
    lock();
    bool defer;
    lk_status st = gate(dev, &defer);
    if (!st && defer) {
        if (is_device_mem(dev, ptr)) st = append((rp_item){.kind = RP_MEMSET, .dst = ptr, .value = value, .bytes = bytes}, taken);
        if (!st && !*taken) R.stats.passthrough++, st = flush(true);
    }
    unlock();
    return st;
}

lk_status lk__replay_copy(lk_device dev, void *dst, const void *src, size_t bytes, bool *taken) {
    *taken = false;
    if (lk_device_is_host(dev)) return LK_STATUS_OK; /* host memory never meets the step's; no lock (the CPU's worker threads) */
    lock();
    bool defer;
    lk_status st = gate(dev, &defer);
    if (!st && defer) {
        if (is_device_mem(dev, dst) && is_device_mem(dev, src))
            st = append((rp_item){.kind = RP_COPY, .dst = dst, .src = src, .bytes = bytes}, taken);
        if (!st && !*taken) R.stats.passthrough++, st = flush(true);
    }
    unlock();
    return st;
}

lk_status lk__replay_sync(lk_device dev) {
    lock();
    lk_status st = LK_STATUS_OK;
    if (R.open && !in_flush && R.seg.n && lk_device_equal(dev, R.dev)) st = flush(mine());
    unlock();
    return st;
}

void lk__replay_note_free(lk_device dev, void *ptr, size_t bytes) {
    (void)bytes;
    lock();
    if (!in_flush) {
        if (R.open && R.seg.n && lk_device_equal(dev, R.dev)) {
            lk_status st = flush(mine());
            /* A free has no status to return: the error stays the thread's
             * last, and the step's next check of a status reports it. */
            if (st) lk_log_debug("replay: issuing the step's work before a free failed: %s", lk_last_error());
        }
        if (R.stats.cached && R.had_dev && lk_device_equal(dev, R.last_dev)) drop_all();
        /* and what was seen: its pointers may name other memory from now on */
        memset(R.seen_full, 0, sizeof R.seen_full), memset(R.seen_shape, 0, sizeof R.seen_shape);
        R.refused = 0;
    }
    int at = range_at((uintptr_t)ptr);
    if (at >= 0 && R.ranges[at].lo == (uintptr_t)ptr) {
        memmove(&R.ranges[at], &R.ranges[at + 1], (size_t)(R.nranges - at - 1) * sizeof *R.ranges);
        R.nranges--;
    }
    unlock();
}

lk__replay_stats lk__replay_get_stats(void) {
    lock();
    lk__replay_stats s = R.stats;
    unlock();
    return s;
}

/* The device layer's interceptor slot (device/graph.h), filled at load so
 * that every block a capturing kind allocates is noted, as when device.c
 * called these functions by name. Any program that runs an op links this
 * file (registry.c calls lk__replay_op); one that runs none opens no step. */
static const lk__device_interceptor interceptor = {
    .memset = lk__replay_memset,
    .copy = lk__replay_copy,
    .sync = lk__replay_sync,
    .note_alloc = lk__replay_note_alloc,
    .note_free = lk__replay_note_free,
};
__attribute__((constructor)) static void install_interceptor(void) { lk__device_set_interceptor(&interceptor); }
