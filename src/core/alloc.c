/* The one allocator. Counts allocations (tests assert that the training
 * step allocates nothing in steady state) and can fail the Nth one, so
 * error paths are tested the way SQLite tests them. */
#include "lockstep/core.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

static void *oom(size_t size) {
    lk_error(LK_STATUS_OUT_OF_MEMORY, "out of memory allocating %zu bytes", size);
    return NULL;
}

void *lk_malloc(size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (inject_failure()) return oom(size);
    void *p = malloc(size ? size : 1);
    return p ? p : oom(size);
}

void *lk_calloc(size_t n, size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (size && n > SIZE_MAX / size) return oom(SIZE_MAX);
    if (inject_failure()) return oom(n * size);
    void *p = calloc(n ? n : 1, size ? size : 1);
    return p ? p : oom(n * size);
}

void *lk_realloc(void *p, size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (inject_failure()) return oom(size);
    void *q = realloc(p, size ? size : 1);
    return q ? q : oom(size);
}

void lk_free(void *p) { free(p); }

/* Large blocks (datasets in memory, tensor pools, gradient buffers) start
 * on a 2 MiB boundary and ask for transparent huge pages: on a VM a page
 * fault costs microseconds, and first-touching 60 MB in 4 KiB pages was a
 * third of a small run's time to first step. Only advice: where THP is off
 * nothing changes. */
#define HUGE_PAGE ((size_t)2 << 20)

void *lk_aligned_alloc(size_t align, size_t size) {
    atomic_fetch_add(&alloc_count, 1);
    if (inject_failure()) return oom(size);
    void *p = NULL;
    bool huge = size >= 2 * HUGE_PAGE;
    if (posix_memalign(&p, huge && align < HUGE_PAGE ? HUGE_PAGE : align, size ? size : align) != 0) return oom(size);
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(p, size & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    return p;
}

void lk_aligned_free(void *p) { free(p); }

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
