/* The one allocator. Counts allocations (tests assert that the training
 * step allocates nothing in steady state) and can fail the Nth one, so
 * error paths are tested the way SQLite tests them. It also counts the
 * bytes live (and their peak) and can refuse an allocation that would pass
 * a cap (trainer.memory_limit_mb): a rank's memory made visible and bounded,
 * which is what sharded training is for. */
#include "lockstep/core.h"

#include <limits.h>
#include <malloc.h> /* malloc_usable_size: what free gives back, so lk_free needs no header */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define BIG_MIN (2 * HUGE_PAGE) /* lk_aligned_alloc's huge-page blocks: from here up */

static atomic_long fail_countdown;
static atomic_uint_fast64_t alloc_count;

void lk_alloc_fail_after(long n) { atomic_store(&fail_countdown, n); }
uint64_t lk_alloc_count(void) { return atomic_load(&alloc_count); }

static bool inject_failure(void) {
    long c = atomic_load(&fail_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &c, c - 1)) return c == 1;
    }
    return false;
}

/* ---- live bytes and the cap ------------------------------------------------
 * Each block counts its usable size (malloc_usable_size) from allocation to
 * free, so lk_free subtracts exactly what was added without a header in
 * front of the block (a header would shift every pointer and break code
 * that hands lk_ memory to free() or the reverse). The count is signed: a
 * pointer from libc's own malloc freed with lk_free lowers it rather than
 * wrapping it past the cap. One relaxed atomic add per call; the peak is a
 * compare-and-swap taken only when a new peak is reached. */
static atomic_int_fast64_t live_bytes;
static atomic_int_fast64_t peak_bytes;
static atomic_int_fast64_t limit_bytes; /* 0: no cap */
static _Atomic(const char *) limit_from = "lk_alloc_set_limit";
static _Thread_local const char *alloc_what; /* lk__alloc_what's label for this thread's allocations */
/* The last refusal on this thread, so a caller that knows more (a tensor's
 * shape) can restate it with lk__alloc_oom_for. */
static _Thread_local struct { bool set; size_t size; int64_t live, limit; } last_oom;

void lk_alloc_set_limit(uint64_t bytes, const char *from) {
    atomic_store(&limit_from, from && *from ? from : "lk_alloc_set_limit");
    atomic_store(&limit_bytes, bytes > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)bytes);
}
uint64_t lk_alloc_limit(void) { return (uint64_t)atomic_load(&limit_bytes); }
uint64_t lk_alloc_live_bytes(void) {
    int64_t v = atomic_load_explicit(&live_bytes, memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}
uint64_t lk_alloc_peak_bytes(void) {
    int64_t v = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}
void lk_alloc_reset_peak(void) { atomic_store(&peak_bytes, atomic_load(&live_bytes)); }

const char *lk__alloc_what(const char *what) {
    const char *prev = alloc_what;
    alloc_what = what;
    return prev;
}

static void note_peak(int64_t now) {
    int64_t p = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
    while (now > p && !atomic_compare_exchange_weak_explicit(&peak_bytes, &p, now, memory_order_relaxed,
                                                             memory_order_relaxed)) {
    }
}

static void adjust(int64_t delta) {
    int64_t now = atomic_fetch_add_explicit(&live_bytes, delta, memory_order_relaxed) + delta;
    if (delta > 0) note_peak(now);
}

/* The error of a refusal, from last_oom and the label (what) if any. */
static void cap_error(const char *what) {
    lk_error(LK_STATUS_OUT_OF_MEMORY,
             "out of memory: allocating %zu bytes%s%s would pass this rank's memory limit of %lld bytes (%s): "
             "%lld bytes are live", last_oom.size, what ? " for " : "", what ? what : "", (long long)last_oom.limit,
             atomic_load(&limit_from), (long long)last_oom.live);
}

/* Adds `n` bytes to the live count, or refuses (false, the error set) when
 * they would pass the cap. The add comes first, so two threads racing for
 * the last bytes cannot both get them. */
static bool charge(size_t n) {
    int64_t lim = atomic_load_explicit(&limit_bytes, memory_order_relaxed);
    int64_t d = n > (size_t)INT64_MAX ? INT64_MAX : (int64_t)n;
    int64_t now = atomic_fetch_add_explicit(&live_bytes, d, memory_order_relaxed) + d;
    if (lim > 0 && now > lim) {
        atomic_fetch_sub_explicit(&live_bytes, d, memory_order_relaxed);
        last_oom.set = true;
        last_oom.size = n;
        last_oom.live = now - d;
        last_oom.limit = lim;
        cap_error(alloc_what);
        return false;
    }
    note_peak(now);
    if (last_oom.set) last_oom.set = false; /* lk__alloc_oom_for restates the latest failure only */
    return true;
}

lk_status lk__alloc_charge(size_t bytes) { return charge(bytes) ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY; }
void lk__alloc_uncharge(size_t bytes) { adjust(-(int64_t)bytes); }

lk_status lk__alloc_oom_for(const char *fmt, ...) {
    if (!last_oom.set || lk_last_status() != LK_STATUS_OUT_OF_MEMORY) return lk_last_status();
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    cap_error(what);
    return LK_STATUS_OUT_OF_MEMORY;
}

static void *oom(size_t size) {
    last_oom.set = false; /* the system's refusal, not the cap's */
    if (alloc_what) lk_error(LK_STATUS_OUT_OF_MEMORY, "out of memory allocating %zu bytes for %s", size, alloc_what);
    else lk_error(LK_STATUS_OUT_OF_MEMORY, "out of memory allocating %zu bytes", size);
    return NULL;
}

bool lk__alloc_refused(void) { return last_oom.set && lk_last_status() == LK_STATUS_OUT_OF_MEMORY; }

/* Large aligned blocks (lk_aligned_alloc's 2 MiB-aligned ones) may come
 * from an mmap whose usable size runs up to the alignment past the bytes
 * asked for (glibc keeps the slack of an mmapped memalign chunk): counted by
 * usable size, one 8 MiB buffer would count as up to 10. They are few, so
 * their asked size is kept here, by address, and counted instead. A full
 * table only means a block counted by its usable size. */
#define BIG_BLOCKS 256
static struct { void *p; size_t size; } big[BIG_BLOCKS];
static pthread_mutex_t big_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int big_n; /* entries in use: lk_free skips the lock while 0 */

static bool big_put(void *p, size_t size) {
    bool put = false;
    pthread_mutex_lock(&big_mu);
    for (int i = 0; i < BIG_BLOCKS && !put; i++)
        if (!big[i].p) {
            big[i].p = p;
            big[i].size = size;
            atomic_fetch_add(&big_n, 1);
            put = true;
        }
    pthread_mutex_unlock(&big_mu);
    return put;
}

/* The bytes block p counts for (its entry removed), or its usable size. */
static size_t counted_size(void *p) {
    size_t u = malloc_usable_size(p);
    if (u < BIG_MIN || atomic_load_explicit(&big_n, memory_order_relaxed) == 0) return u;
    pthread_mutex_lock(&big_mu);
    for (int i = 0; i < BIG_BLOCKS; i++)
        if (big[i].p == p) {
            u = big[i].size;
            big[i].p = NULL;
            atomic_fetch_sub(&big_n, 1);
            break;
        }
    pthread_mutex_unlock(&big_mu);
    return u;
}

/* After a block of `asked` bytes (charged) came back as p: count its real
 * size instead. */
static void *settle(void *p, size_t asked) {
    adjust((int64_t)malloc_usable_size(p) - (int64_t)asked);
    return p;
}

void *lk_malloc(size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (inject_failure()) return oom(size);
    if (!charge(size)) return NULL;
    void *p = malloc(size ? size : 1);
    if (!p) {
        lk__alloc_uncharge(size);
        return oom(size);
    }
    return settle(p, size);
}

void *lk_calloc(size_t n, size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (size && n > SIZE_MAX / size) return oom(SIZE_MAX);
    if (inject_failure()) return oom(n * size);
    if (!charge(n * size)) return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        lk__alloc_uncharge(n * size);
        return oom(n * size);
    }
    return settle(p, n * size);
}

void *lk_realloc(void *p, size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (inject_failure()) return oom(size);
    size_t old = p ? counted_size(p) : 0, grow = size > old ? size - old : 0;
    if (grow && !charge(grow)) return NULL; /* p stays as it was, as realloc's failure leaves it */
    void *q = realloc(p, size ? size : 1);
    if (!q) {
        lk__alloc_uncharge(grow);
        if (old >= BIG_MIN) big_put(p, old); /* p stays, and so does its entry */
        return oom(size);
    }
    adjust((int64_t)malloc_usable_size(q) - (int64_t)old - (int64_t)grow);
    return q;
}

void lk_free(void *p) {
    if (!p) return;
    adjust(-(int64_t)counted_size(p));
    free(p);
}

/* Large blocks (datasets in memory, tensor pools, gradient buffers) start
 * on a 2 MiB boundary and ask for transparent huge pages: on a VM a page
 * fault costs microseconds, and first-touching 60 MB in 4 KiB pages was a
 * third of a small run's time to first step. Only advice: where THP is off
 * nothing changes. */

void *lk_aligned_alloc(size_t align, size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (inject_failure()) return oom(size);
    if (!charge(size)) return NULL;
    void *p = NULL;
    bool huge = size >= 2 * HUGE_PAGE;
    if (posix_memalign(&p, huge && align < HUGE_PAGE ? HUGE_PAGE : align, size ? size : align) != 0) {
        lk__alloc_uncharge(size);
        return oom(size);
    }
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(p, size & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    if (huge && big_put(p, size)) return p; /* counted as asked (big[]) */
    return settle(p, size);
}

void lk_aligned_free(void *p) { lk_free(p); }

char *lk_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = lk_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- arena ------------------------------------------------------------ */

typedef struct arena_block {
    struct arena_block *next;
    size_t size, used;
    _Alignas(LK_ALIGN) unsigned char data[];
} arena_block;

struct lk_arena {
    arena_block *head, *cur;
    size_t block_size;
};

lk_arena *lk_arena_create(size_t block_size) {
    lk_arena *a = lk_calloc(1, sizeof *a);
    if (!a) return NULL;
    a->block_size = block_size ? block_size : (1u << 20);
    return a;
}

void *lk_arena_alloc(lk_arena *a, size_t size) {
    size = (size + LK_ALIGN - 1) & ~(size_t)(LK_ALIGN - 1);
    arena_block *b = a->cur;
    while (b && b->used + size > b->size) b = b->next; /* reuse blocks kept by reset */
    if (!b) {
        size_t bs = size > a->block_size ? size : a->block_size;
        b = lk_aligned_alloc(LK_ALIGN, sizeof *b + bs);
        if (!b) return NULL;
        b->size = bs;
        b->used = 0;
        b->next = NULL;
        if (!a->head) a->head = b;
        else {
            arena_block *t = a->head;
            while (t->next) t = t->next;
            t->next = b;
        }
    }
    a->cur = b;
    void *p = b->data + b->used;
    b->used += size;
    return p;
}

void lk_arena_reset(lk_arena *a) {
    for (arena_block *b = a->head; b; b = b->next) b->used = 0;
    a->cur = a->head;
}

size_t lk_arena_used(const lk_arena *a) {
    size_t n = 0;
    for (arena_block *b = a->head; b; b = b->next) n += b->used;
    return n;
}

void lk_arena_free(lk_arena *a) {
    if (!a) return;
    arena_block *b = a->head;
    while (b) {
        arena_block *n = b->next;
        lk_aligned_free(b);
        b = n;
    }
    lk_free(a);
}

/* Growable arrays (lk_vec_reserve). One lk_realloc per growth, as the
 * hand-written loops this replaced did, so allocation counts and the Nth
 * allocation a test fails stay where they were. */
static lk_status vec_grow(void *pitems, size_t cap, size_t need, size_t elem, size_t first, size_t max,
                          size_t *out_cap) {
    size_t nc = cap ? cap : (first ? first : 1);
    while (nc < need) {
        if (nc > max / 2) return lk_error(LK_STATUS_OUT_OF_MEMORY, "growable array: %zu elements is too many", need);
        nc *= 2;
    }
    if (nc > max || (elem && nc > SIZE_MAX / elem))
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "growable array: %zu elements of %zu bytes is too many", nc, elem);
    /* memcpy, not a cast to void **: the caller's pointer has its own type */
    void *old;
    memcpy(&old, pitems, sizeof old);
    void *p = lk_realloc(old, nc * elem);
    if (!p) return lk_last_status();
    memcpy(pitems, &p, sizeof p);
    *out_cap = nc;
    return LK_STATUS_OK;
}

lk_status lk__vec_reserve_int(void *pitems, int *cap, size_t need, size_t elem, size_t first) {
    if (need <= (size_t)(*cap > 0 ? *cap : 0)) return LK_STATUS_OK;
    size_t nc = 0;
    lk_status st = vec_grow(pitems, (size_t)(*cap > 0 ? *cap : 0), need, elem, first, (size_t)INT_MAX, &nc);
    if (!st) *cap = (int)nc;
    return st;
}

lk_status lk__vec_reserve_size(void *pitems, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return LK_STATUS_OK;
    return vec_grow(pitems, *cap, need, elem, first, SIZE_MAX, cap);
}
