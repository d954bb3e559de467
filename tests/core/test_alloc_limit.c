/* core: the allocator's live-byte count, its peak and the memory limit
 * (lk_alloc_set_limit): every lk_ allocation counted from allocation to
 * free, an allocation past the limit refused with a message naming the
 * bytes, what they were for, what is live and the limit, nothing counted
 * for a refusal, and the count exact when threads allocate at once. */
#include <pthread.h>
#include <string.h>

#include "lk_test.h"

/* Live bytes now, relative to a baseline taken by the case (the test
 * harness itself allocates). */
static int64_t live_since(uint64_t base) { return (int64_t)lk_alloc_live_bytes() - (int64_t)base; }

static void counts_live_bytes(void) {
    uint64_t base = lk_alloc_live_bytes();
    void *a = lk_malloc(1000);
    CHECK(a != NULL);
    CHECK(live_since(base) >= 1000 && live_since(base) < 1000 + 64); /* the block's usable size */
    void *b = lk_aligned_alloc(LK_ALIGN, 4096);
    CHECK(b != NULL && live_since(base) >= 5096);
    void *c = lk_calloc(10, 100);
    CHECK(c != NULL && live_since(base) >= 6096);
    a = lk_realloc(a, 100000);
    CHECK(a != NULL && live_since(base) >= 105096);
    CHECK(lk_alloc_peak_bytes() >= base + 105096);
    lk_free(a);
    lk_aligned_free(b);
    lk_free(c);
    CHECK_MSG(live_since(base) == 0, "live bytes after freeing everything: %lld", (long long)live_since(base));
    lk_alloc_reset_peak();
    CHECK(lk_alloc_peak_bytes() == lk_alloc_live_bytes());
    /* memory lockstep holds without lk_malloc (a shared heap) counts too */
    CHECK_OK(lk__alloc_charge(1 << 20));
    CHECK(live_since(base) == 1 << 20);
    lk__alloc_uncharge(1 << 20);
    CHECK(live_since(base) == 0);
}

static void limit_refuses_and_names(void) {
    uint64_t base = lk_alloc_live_bytes();
    lk_alloc_set_limit(base + (1 << 20), "trainer.memory_limit_mb");
    CHECK(lk_alloc_limit() == base + (1 << 20));
    void *ok = lk_malloc(512 << 10); /* half of what is left */
    CHECK(ok != NULL);
    /* past the limit: refused, nothing counted, the message says it all */
    const char *was = lk__alloc_what("the flat gradient buffer");
    void *no = lk_aligned_alloc(LK_ALIGN, 600 << 10);
    lk__alloc_what(was);
    CHECK(no == NULL);
    CHECK(lk_last_status() == LK_STATUS_OUT_OF_MEMORY);
    const char *m = lk_last_error();
    CHECK_MSG(strstr(m, "allocating 614400 bytes for the flat gradient buffer") != NULL, "%s", m);
    CHECK_MSG(strstr(m, "memory limit") && strstr(m, "(trainer.memory_limit_mb)") && strstr(m, "bytes are live"), "%s", m);
    CHECK(live_since(base) < (512 << 10) + 8192); /* an mmapped block: its page counts */
    /* a caller that knows more restates it */
    CHECK(lk_malloc(600 << 10) == NULL);
    CHECK(lk__alloc_oom_for("a f32 tensor of shape [%d, %d]", 400, 384) == LK_STATUS_OUT_OF_MEMORY);
    CHECK_MSG(strstr(lk_last_error(), "allocating 614400 bytes for a f32 tensor of shape [400, 384]") != NULL, "%s",
              lk_last_error());
    /* every entry point is capped: calloc, realloc (p kept), the charge of a shared heap */
    CHECK(lk_calloc(600, 1024) == NULL);
    void *r = lk_realloc(ok, 2 << 20);
    CHECK(r == NULL);
    CHECK_ERR(lk__alloc_charge(2 << 20), LK_STATUS_OUT_OF_MEMORY, "memory limit");
    /* what fits still fits */
    void *small = lk_malloc(1000);
    CHECK(small != NULL);
    lk_free(small);
    lk_free(ok); /* realloc's failure left it as it was */
    lk_alloc_set_limit(0, NULL);
    void *big = lk_malloc(4 << 20); /* no limit: fine */
    CHECK(big != NULL);
    lk_free(big);
    CHECK(live_since(base) == 0);
}

/* Threads allocating and freeing at once, under a limit some of them hit:
 * the count comes back exactly to where it was, and the peak stays near the
 * limit (the add comes before the check, so two threads cannot share the
 * last bytes; the peak may still see another thread's refused add for the
 * moment before it is taken back, at most one block per thread). */
enum { THREADS = 4, ROUNDS = 2000 };
static void *churn(void *arg) {
    int *refused = arg;
    void *held[8] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int k = i % 8;
        if (held[k]) {
            lk_free(held[k]);
            held[k] = NULL;
        } else if (!(held[k] = lk_malloc((size_t)(1 + (i * 7919) % 65536)))) {
            (*refused)++;
        }
    }
    for (int k = 0; k < 8; k++) lk_free(held[k]);
    return NULL;
}

static void threads_count_exactly(void) {
    uint64_t base = lk_alloc_live_bytes();
    lk_alloc_reset_peak();
    lk_alloc_set_limit(base + 600000, NULL); /* tight enough that some allocations are refused */
    pthread_t th[THREADS];
    int refused[THREADS] = {0};
    for (int t = 0; t < THREADS; t++) CHECK(pthread_create(&th[t], NULL, churn, &refused[t]) == 0);
    int total = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        total += refused[t];
    }
    lk_alloc_set_limit(0, NULL);
    CHECK_MSG(live_since(base) == 0, "live bytes after the threads freed everything: %lld", (long long)live_since(base));
    CHECK_MSG(lk_alloc_peak_bytes() <= base + 600000 + THREADS * (65536 + 64), "peak %llu, limit %llu",
              (unsigned long long)lk_alloc_peak_bytes(), (unsigned long long)(base + 600000));
    (void)total; /* how many were refused depends on the interleaving: not asserted */
}

LK_TEST_MAIN(LK_TEST_CASE(counts_live_bytes), LK_TEST_CASE(limit_refuses_and_names), LK_TEST_CASE(threads_count_exactly))
