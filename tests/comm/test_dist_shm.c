/* dist, multi-process: the shm communicator with 1..4 forked ranks — every
 * collective x dtype x op x size against the double reference, all-reduce
 * bits identical across ranks, across in-segment and private buffers and
 * across runs; async collectives overlapping compute and ordered with
 * blocking ones; the shared heap's limits. */
#include "coll_check.h"

static int matrix_rank(int r, int W, void *arg) {
    bool big = arg != NULL;
    lk_comm *c;
    if (du_comm(r, W, "shm", 30, &c)) {
        fprintf(stderr, "rank %d: %s\n", r, lk_last_error());
        return 1;
    }
    int n = 0;
    int errors = cc_check_all(c, 1234, big, du->hash[r], &n);
    du->nhash[r] = n;
    lk_comm_free(c);
    return errors != 0;
}

static void check_hashes(int W, const char *what) {
    for (int r = 1; r < W; r++) {
        CHECK_MSG(du->nhash[r] == du->nhash[0], "%s: rank %d recorded %d results, rank 0 %d", what, r, du->nhash[r], du->nhash[0]);
        for (int i = 0; i < du->nhash[0]; i++)
            if (du->hash[r][i] != du->hash[0][i]) {
                CHECK_MSG(0, "%s: all_reduce result %d differs between rank 0 and rank %d", what, i, r);
                break;
            }
    }
    /* results come in (private, in-segment) pairs of the same data: same bits */
    for (int i = 0; i + 1 < du->nhash[0]; i += 2)
        if (du->hash[0][i] != du->hash[0][i + 1]) {
            CHECK_MSG(0, "%s: all_reduce result %d differs between private and in-segment buffers", what, i / 2);
            break;
        }
}

static void collectives_world_1_to_4(void) {
    du_map();
    for (int W = 1; W <= 4; W++) {
        int codes[DU_MAXW];
        memset(du, 0, sizeof *du);
        int ok = du_run(W, matrix_rank, W == 2 || W == 3 ? (void *)1 : NULL, 60, codes, NULL);
        CHECK_MSG(ok == W, "world %d: %d of %d ranks passed", W, ok, W);
        check_hashes(W, "matrix");
        CHECK(!du_segment_exists(du_job));
    }
}

static void bitwise_identical_across_runs(void) {
    du_map();
    static uint64_t first[DU_NRES];
    int n1 = 0;
    for (int run = 0; run < 2; run++) {
        memset(du, 0, sizeof *du);
        int ok = du_run(3, matrix_rank, NULL, 60, NULL, NULL);
        CHECK(ok == 3);
        check_hashes(3, "rerun");
        if (run == 0) {
            n1 = du->nhash[0];
            memcpy(first, du->hash[0], sizeof first);
        } else {
            CHECK(n1 == du->nhash[0] && n1 > 100);
            CHECK_MSG(!memcmp(first, du->hash[0], sizeof(uint64_t) * (size_t)n1), "a rerun gave different all_reduce bits");
        }
    }
}

/* Rank 1 starts late, so rank 0's async works cannot finish before it
 * arrives: the issuing thread must be free to compute meanwhile. */
static int async_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 30, &c)) return fprintf(stderr, "%s\n", lk_last_error()), 1;
    enum { NB = 6, N = 1 << 18 };
    float *b[NB];
    lk_work *w[NB];
    int fail = 0;
    for (int i = 0; i < NB; i++) {
        if (lk_comm_alloc_shared(c, N * sizeof(float), (void **)&b[i])) return 1;
        for (int j = 0; j < N; j++) b[i][j] = (float)(r + 1) * (float)(i + 1);
    }
    if (r == 1) usleep(600000);
    double t0 = lk_time_now();
    for (int i = 0; i < NB; i++)
        if (lk_comm_all_reduce_async(c, b[i], N, LK_F32, i % 2 ? LK_REDUCE_SUM : LK_REDUCE_MAX, &w[i])) fail = 1;
    double issue = lk_time_now() - t0;
    bool done = true;
    lk_work_test(w[NB - 1], &done);
    if (r == 0 && done) fprintf(stderr, "async: last work finished before the peer arrived\n"), fail = 1;
    if (issue > 0.4) fprintf(stderr, "async: issuing took %.3f s (blocked?)\n", issue), fail = 1;
    /* "compute" while gradients travel */
    volatile double acc = 0;
    for (int k = 0; k < 2000000; k++) acc += k * 1e-9;
    if (!(acc > 0)) fail = 1;
    /* a blocking collective queues behind the async ones */
    int32_t x = r + 1;
    if (lk_comm_all_reduce(c, &x, 1, LK_I32, LK_REDUCE_SUM)) fail = 1;
    if (x != W * (W + 1) / 2) fprintf(stderr, "blocking after async: %d\n", x), fail = 1;
    for (int i = 0; i < NB; i++) {
        lk_work_test(w[i], &done);
        if (!done) fprintf(stderr, "work %d not done after a later blocking collective\n", i), fail = 1;
        if (lk_work_wait(w[i])) fprintf(stderr, "work %d: %s\n", i, lk_last_error()), fail = 1;
        float want = i % 2 ? (float)(i + 1) * (float)(W * (W + 1) / 2) : (float)W * (float)(i + 1);
        for (int j = 0; j < N; j += 997)
            if (b[i][j] != want) {
                fprintf(stderr, "work %d element %d = %g, expected %g\n", i, j, b[i][j], want);
                fail = 1;
                break;
            }
        lk_work_free(w[i]);
        lk_comm_free_shared(c, b[i]);
    }
    /* async on private memory, other kinds */
    int32_t g[4] = {0}, me = r * 10;
    lk_work *wg, *wb;
    if (lk_comm_all_gather_async(c, &me, g, 1, LK_I32, &wg) || lk_comm_barrier_async(c, &wb)) fail = 1;
    if (lk_work_wait(wg) || lk_work_wait(wb)) fail = 1;
    for (int k = 0; k < W; k++) fail |= g[k] != k * 10;
    lk_work_free(wg);
    lk_work_free(wb);
    /* work freed without waiting: lk_work_free waits */
    lk_work *wf;
    if (lk_comm_barrier_async(c, &wf)) fail = 1;
    lk_work_free(wf);
    lk_comm_free(c);
    return fail;
}

static void async_overlaps_compute(void) {
    du_map();
    for (int W = 2; W <= 3; W++) {
        int ok = du_run(W, async_rank, NULL, 30, NULL, NULL);
        CHECK_MSG(ok == W, "world %d: %d ranks passed", W, ok);
    }
}

static int heap_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 30, &c)) return 1;
    int fail = 0;
    void *a = NULL, *b = NULL, *d = NULL;
    if (lk_comm_alloc_shared(c, 40u << 20, &a) || lk_comm_alloc_shared(c, 20u << 20, &b)) fail = 1;
    lk_status st = lk_comm_alloc_shared(c, 10u << 20, &d); /* 64 MB heap: does not fit */
    if (st != LK_STATUS_OUT_OF_MEMORY || !strstr(lk_last_error(), "shared heap")) fprintf(stderr, "oom: %s\n", lk_last_error()), fail = 1;
    lk_comm_free_shared(c, a);
    if (lk_comm_alloc_shared(c, 30u << 20, &d)) fail = 1; /* fits in the hole */
    if (d != a) fail = 1;
    lk_comm_free_shared(c, b);
    lk_comm_free_shared(c, d);
    lk_comm_free(c);
    return fail;
}

/* lk_comm_alloc_common: one block every rank maps (in rank 0's heap), not a
 * copy per rank: what rank 0 writes, the others read, and back. */
static int common_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 30, &c)) return 1;
    int fail = 0;
    int32_t *mine = NULL, *common = NULL;
    bool owner = false;
    if (lk_comm_alloc_shared(c, 4096, (void **)&mine)) fail = 1; /* rank 0's heap is not empty: offsets differ */
    if (lk_comm_alloc_common(c, (size_t)W * sizeof(int32_t), (void **)&common, &owner)) fail = 1;
    if (fail || owner != (r == 0) || ((uintptr_t)common % 64)) fail = 1;
    else {
        if (r == 0) common[0] = 1234;
        if (lk_comm_barrier(c) || common[0] != 1234) fail = 1;
        common[r] = r == 0 ? 1234 : 100 + r; /* every rank writes its own slot */
        if (lk_comm_barrier(c)) fail = 1;
        for (int k = 1; k < W; k++) fail |= common[k] != 100 + k;
        if (lk_comm_barrier(c)) fail = 1; /* everyone is done reading before the owner frees */
    }
    /* lk_comm_peer_blocks: every rank's own block (at different offsets in
     * their heaps: rank 0's holds the common one too), read in place */
    void *peers[4] = {NULL};
    bool all = false;
    if (!fail && (lk_comm_peer_blocks(c, mine, peers, &all) || !all || peers[r] != mine)) fail = 1;
    if (!fail) {
        mine[0] = 500 + r;
        if (lk_comm_barrier(c)) fail = 1;
        for (int k = 0; k < W && !fail; k++) fail |= ((int32_t *)peers[k])[0] != 500 + k;
        if (lk_comm_barrier(c)) fail = 1;
    }
    /* one rank without a block: no rank reads in place */
    all = true;
    if (!fail && (lk_comm_peer_blocks(c, r == W - 1 ? NULL : mine, peers, &all) || all)) fail = 1;
    if (owner) lk_comm_free_shared(c, common);
    lk_comm_free_shared(c, mine);
    lk_comm_free(c);
    return fail;
}

static void shared_heap(void) {
    du_map();
    CHECK(du_run(2, heap_rank, NULL, 30, NULL, NULL) == 2);
    for (int W = 2; W <= 3; W++) CHECK_MSG(du_run(W, common_rank, NULL, 30, NULL, NULL) == W, "common memory, world %d", W);
    /* where ranks map no common memory, every rank is told so alike */
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "self";
    lk_comm *c = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    void *p = (void *)1;
    bool owner;
    CHECK_ERR(lk_comm_alloc_common(c, 64, &p, &owner), LK_STATUS_UNSUPPORTED, "the self backend has no memory every rank maps");
    CHECK(p == NULL);
    void *peer = NULL;
    bool all = true;
    CHECK_OK(lk_comm_peer_blocks(c, (void *)&owner, &peer, &all)); /* no shared memory: none read in place */
    CHECK(!all && peer == NULL);
    CHECK_ERR(lk_comm_peer_blocks(c, NULL, NULL, &all), LK_STATUS_INVALID_ARGUMENT, "lk_comm_peer_blocks: NULL argument");
    lk_comm_free(c);
}

LK_TEST_MAIN(LK_TEST_CASE(collectives_world_1_to_4), LK_TEST_CASE(bitwise_identical_across_runs),
             LK_TEST_CASE(async_overlaps_compute), LK_TEST_CASE(shared_heap))
