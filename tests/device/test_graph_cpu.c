/* What of the cuda compute stream and graph capture runs without a GPU:
 * the graph wrappers (src/device/graph.h) on kinds without graph methods —
 * the cpu device, the tests' debug device, an unregistered kind — answer
 * with an error naming the device and nothing crashes; a kind with them is
 * dispatched to (a counting fake); and the per-device lazy table that makes
 * each GPU's compute stream once (src/device/lazy.c) makes one handle per
 * index under concurrent first calls, retries after a failed make, and
 * refuses an index out of range. In a CUDA build without a GPU it also
 * checks that the stream accessor fails cleanly. */
#include <pthread.h>
#include <stdatomic.h>

#include "debug_device.h"
#include "device/gpu.h"
#include "device/graph.h"
#include "lk_test.h"

static void cpu_cannot_capture(void) {
    CHECK(!lk__device_can_capture(LK_DEVICE_CPU));
    CHECK_ERR(lk__device_graph_begin(LK_DEVICE_CPU), LK_STATUS_UNSUPPORTED, "device 'cpu' cannot capture graphs");
    lk_graph *g = (lk_graph *)&g; /* must come back NULL */
    CHECK_ERR(lk__device_graph_end(LK_DEVICE_CPU, &g), LK_STATUS_UNSUPPORTED, "device 'cpu' cannot capture graphs");
    CHECK(g == NULL);
    CHECK_ERR(lk__device_graph_launch(LK_DEVICE_CPU, (lk_graph *)&g), LK_STATUS_UNSUPPORTED,
              "graph launch: device 'cpu' cannot capture graphs");
    lk__device_graph_free(LK_DEVICE_CPU, NULL);
    lk__device_graph_free(LK_DEVICE_CPU, (lk_graph *)&g); /* no method: nothing to free, nothing done */
    /* the debug device (host-addressable, no graph methods) and a kind nobody registered */
    lk_device d = dbg_device();
    CHECK_ERR(lk__device_graph_begin(d), LK_STATUS_UNSUPPORTED, "device 'debug:0' cannot capture graphs");
    lk_device none = {(lk_device_kind)(LK_DEVICE_KIND_MAX - 1), 0};
    CHECK_ERR(lk__device_graph_begin(none), LK_STATUS_INVALID_ARGUMENT, "is not registered");
    CHECK_ERR(lk__device_graph_end(none, &g), LK_STATUS_INVALID_ARGUMENT, "is not registered");
    /* the CPU still works after the refusals */
    lk_tensor *a = lk_tensor_full(LK_F32, 1, (int64_t[]){4}, 2.0);
    lk_tensor *b = a ? lk_mul(a, a) : NULL;
    CHECK(b && ((float *)b->data)[3] == 4.0f);
    lk_tensor_release(b), lk_tensor_release(a);
}

/* A kind with graph methods: the wrappers call them with its index. */
static int begun, ended, launched, freed;
static lk_status fake_begin(void *c, int i) { return (void)c, begun = 10 + i, LK_STATUS_OK; }
static lk_status fake_end(void *c, int i, lk_graph **out) {
    (void)c;
    ended = 10 + i;
    *out = (lk_graph *)&ended;
    return LK_STATUS_OK;
}
static lk_status fake_launch(void *c, int i, lk_graph *g) { return (void)c, launched = 10 + i + (g == (lk_graph *)&ended), LK_STATUS_OK; }
static void fake_free(void *c, int i, lk_graph *g) { (void)c, (void)g, freed = 10 + i; }

static void kind_with_graphs(void) {
    static const lk_device_vtable vt = {.name = "graphs", .host_addressable = true, .alloc = dbg_alloc, .free = dbg_free,
                                        .count = dbg_count, .graph_begin = fake_begin, .graph_end = fake_end,
                                        .graph_launch = fake_launch, .graph_free = fake_free};
    lk_device_kind k;
    CHECK_OK(lk_device_register(&vt, NULL, &k));
    lk_device d = {k, 1};
    CHECK(lk__device_can_capture(d));
    lk_graph *g = NULL;
    CHECK_OK(lk__device_graph_begin(d));
    CHECK_OK(lk__device_graph_end(d, &g));
    CHECK_OK(lk__device_graph_launch(d, g));
    CHECK_ERR(lk__device_graph_launch(d, NULL), LK_STATUS_INVALID_ARGUMENT, "no graph");
    lk__device_graph_free(d, g);
    CHECK(begun == 11 && ended == 11 && launched == 12 && freed == 11);
}

/* ---- the lazy table ---- */

static atomic_int makes[LK__GPU_MAX];
static atomic_int fail_next;
static lk_status fake_make(void *ctx, int index, void **out) {
    (void)ctx;
    if (atomic_exchange(&fail_next, 0)) return lk_error(LK_STATUS_DEVICE, "fake: cannot make handle %d", index);
    atomic_fetch_add(&makes[index], 1);
    struct timespec ts = {0, 200000}; /* widen the window in which other threads race to the same index */
    nanosleep(&ts, NULL);
    *out = (void *)(uintptr_t)(0x1000 + index);
    return LK_STATUS_OK;
}

static lk__lazy_table table = LK__LAZY_TABLE_INIT;
enum { THREADS = 8, INDICES = 16 };
static void *got[THREADS][INDICES];

static void *racer(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int r = 0; r < INDICES; r++) {
        int i = (r + t) % INDICES; /* threads start at different indices and meet on each */
        if (lk__lazy_get(&table, i, fake_make, NULL, &got[t][i])) got[t][i] = NULL;
    }
    return NULL;
}

static void lazy_once_per_index(void) {
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) CHECK(pthread_create(&th[t], NULL, racer, (void *)(intptr_t)t) == 0);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int i = 0; i < INDICES; i++) {
        CHECK_MSG(atomic_load(&makes[i]) == 1, "index %d made %d times", i, atomic_load(&makes[i]));
        for (int t = 0; t < THREADS; t++)
            CHECK_MSG(got[t][i] == (void *)(uintptr_t)(0x1000 + i), "thread %d index %d got %p", t, i, got[t][i]);
        CHECK(lk__lazy_peek(&table, i) == (void *)(uintptr_t)(0x1000 + i));
    }
    /* a failed make leaves the slot empty; the next call makes it */
    void *h = (void *)1;
    atomic_store(&fail_next, 1);
    CHECK(lk__lazy_peek(&table, 40) == NULL);
    CHECK_ERR(lk__lazy_get(&table, 40, fake_make, NULL, &h), LK_STATUS_DEVICE, "cannot make handle 40");
    CHECK(h == NULL && lk__lazy_peek(&table, 40) == NULL);
    CHECK_OK(lk__lazy_get(&table, 40, fake_make, NULL, &h));
    CHECK(h == (void *)(uintptr_t)0x1028 && atomic_load(&makes[40]) == 1);
    CHECK_ERR(lk__lazy_get(&table, LK__GPU_MAX, fake_make, NULL, &h), LK_STATUS_INVALID_ARGUMENT, "out of range");
    CHECK_ERR(lk__lazy_get(&table, -1, fake_make, NULL, &h), LK_STATUS_INVALID_ARGUMENT, "out of range");
    CHECK(lk__lazy_peek(&table, -1) == NULL && lk__lazy_peek(&table, LK__GPU_MAX) == NULL);
}

/* Without a GPU (this machine, CI), asking for a compute stream is an
 * error, not a crash, and nothing is capturing. */
static void no_gpu_stream(void) {
    if (lk__cuda_visible() > 0) {
        printf("  (a GPU is visible: gpu_graph covers the stream there)\n");
        return;
    }
    struct CUstream_st *s = (struct CUstream_st *)&s;
    lk_status st = lk__cuda_stream(0, &s);
    CHECK(st != LK_STATUS_OK && s == NULL);
    CHECK(!lk__cuda_capturing(0));
}

int main(int argc, char **argv) {
    static const lk_t_case cases[] = {LK_TEST_CASE(cpu_cannot_capture), LK_TEST_CASE(kind_with_graphs),
                                      LK_TEST_CASE(lazy_once_per_index), LK_TEST_CASE(no_gpu_stream)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
