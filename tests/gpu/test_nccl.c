/* The nccl communicator. One rank (one GPU; NCCL refuses two ranks on one
 * GPU): creation through the id bootstrap, all_reduce (sum, avg, max) and
 * broadcast on device memory, all_gather, barrier, and a clean free. Two
 * ranks (two GPUs; skipped with fewer), each a process of its own exec'd
 * fresh (a process forked after CUDA started cannot use it): every
 * collective in every dtype NCCL takes against values computed here, a
 * buffer of several MiB, host memory through the backend's host
 * communicator, the order of a collective between the compute stream's
 * producer and consumer kernels, and the failure paths: a peer that never
 * comes ends in TIMEOUT within comm_timeout, lk_comm_abort from another
 * thread ends a collective in flight, and every later call fails fast;
 * point-to-point (ncclSend/ncclRecv after a header on the host
 * communicator) in every dtype, both ways, a mismatch named, and sends
 * crossed in NCCL's order ended at comm_timeout.
 * Runs on a GPU machine (label gpu) and on the fake GPU (fake_gpu_nccl:
 * tests/gpu/fake/fake_nccl.cpp), where the collectives run between the two
 * processes through shared memory in rounds of LK_FAKE_NCCL_SLOT bytes. */
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test.h"
#include "lk_test.h"

static bool nccl_built(void) {
    for (int i = 0; i < lk_comm_backend_count(); i++)
        if (!strcmp(lk_comm_backend_name_at(i), "nccl")) return true;
    printf("built without NCCL: nothing to test\n");
    return false;
}

static void one_rank(void) {
    if (!nccl_built()) return;
    lk_pg_info pg = {.rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1, .num_nodes = 1, .source = "none"};
    snprintf(pg.job_id, sizeof pg.job_id, "gpunccl-%d", (int)getpid());
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "nccl";
    cfg.pg = &pg;
    cfg.timeout_s = 60;
    lk_comm *c = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    if (!c) return;
    CHECK(!strcmp(lk_comm_backend(c), "nccl"));
    lk_device g = {LK_CUDA, 0};
    enum { N = 1000 };
    float h[N], back[N];
    for (int i = 0; i < N; i++) h[i] = (float)i - 500;
    void *d = NULL, *all = NULL;
    CHECK_OK(lk_device_alloc(g, sizeof h, &d));
    CHECK_OK(lk_device_alloc(g, sizeof h, &all));
    CHECK_OK(lk_device_copy(g, d, LK_DEVICE_CPU, h, sizeof h));
    CHECK_OK(lk_comm_all_reduce(c, d, N, LK_F32, LK_REDUCE_SUM));
    CHECK_OK(lk_comm_all_reduce(c, d, N, LK_F32, LK_REDUCE_AVG));
    CHECK_OK(lk_comm_all_reduce(c, d, N, LK_F32, LK_REDUCE_MAX));
    CHECK_OK(lk_comm_broadcast(c, d, N, LK_F32, 0));
    CHECK_OK(lk_comm_all_gather(c, d, all, N, LK_F32));
    CHECK_OK(lk_comm_barrier(c));
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, g, all, sizeof back));
    CHECK(memcmp(h, back, sizeof h) == 0); /* one rank: every collective is the identity */
    /* Host memory (the trainer's metrics, SyncBatchNorm's sums) goes through
     * the backend's host communicator, not NCCL, which cannot take it. */
    double hm[3] = {1.5, -2.0, 7.25};
    CHECK_OK(lk_comm_all_reduce(c, hm, 3, LK_F64, LK_REDUCE_SUM));
    CHECK(hm[0] == 1.5 && hm[1] == -2.0 && hm[2] == 7.25);
    int64_t flag = 3;
    CHECK_OK(lk_comm_broadcast(c, &flag, 1, LK_I64, 0));
    CHECK(flag == 3);
    /* A group (lk_comm_split): a fresh NCCL communicator over the split
     * host communicator, on the same GPU; a negative colour gives none. */
    lk_comm *grp = NULL, *none = (lk_comm *)1;
    CHECK_OK(lk_comm_split(c, 0, 0, &grp));
    CHECK(grp && !strcmp(lk_comm_backend(grp), "nccl") && lk_comm_world_size(grp) == 1);
    if (grp) CHECK_OK(lk_comm_all_reduce(grp, d, N, LK_F32, LK_REDUCE_SUM));
    lk_comm_free(grp);
    CHECK_OK(lk_comm_split(c, LK_COMM_NO_GROUP, 0, &none));
    CHECK(none == NULL);
    lk_device_free(g, d, sizeof h);
    lk_device_free(g, all, sizeof h);
    lk_comm_free(c);
}

/* ---- two ranks: what each process runs (LK_NCCL_TEST_ROLE) ---- */

static int rank_failed;
#define R_CHECK(rank, cond, ...)                                                              \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "[rank %d] FAIL %s:%d: %s: ", rank, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, " (last error: %s)\n", lk_last_error());                         \
            rank_failed = 1;                                                                  \
        }                                                                                     \
    } while (0)

static lk_comm *make_comm(int rank, const char *job, double timeout_s) {
    lk_pg_info pg = {.rank = rank, .world_size = 2, .local_rank = rank, .local_world_size = 2, .num_nodes = 1,
                     .source = "none"};
    snprintf(pg.job_id, sizeof pg.job_id, "%s", job);
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "nccl";
    cfg.pg = &pg;
    cfg.timeout_s = timeout_s;
    lk_comm *c = NULL;
    lk_status st = lk_comm_create(&cfg, &c);
    R_CHECK(rank, st == LK_STATUS_OK && c, "lk_comm_create(nccl) on rank %d", rank);
    return st ? NULL : c;
}

/* Rank r's value at i: small integers, exact in every dtype (u8: 0..10). */
static double val(int r, int64_t i, lk_dtype dt) {
    double v = (double)((i * 7 + r * 3) % 11);
    return dt == LK_U8 ? v : v - 5;
}

/* A tensor of n values f(i) in dtype dt on device dev. */
static lk_tensor *filled(lk_device dev, lk_dtype dt, int64_t n, int r, int64_t offset) {
    lk_tensor *h = lk_tensor_empty(LK_F64, 1, &n);
    if (!h) return NULL;
    for (int64_t i = 0; i < n; i++) ((double *)h->data)[i] = val(r, offset + i, dt);
    lk_tensor *c = lk_tensor_cast(h, dt);
    lk_tensor *d = c ? lk_tensor_to(c, dev) : NULL;
    lk_tensor_release(h), lk_tensor_release(c);
    return d;
}

/* t's values as f64 on the host (NULL on failure). */
static double *host_values(lk_tensor *t) {
    lk_tensor *h = lk_tensor_to(t, LK_DEVICE_CPU);
    lk_tensor *f = h ? lk_tensor_cast(h, LK_F64) : NULL;
    lk_tensor_release(h);
    if (!f) return NULL;
    double *v = malloc(sizeof(double) * (size_t)f->numel);
    if (v) memcpy(v, f->data, sizeof(double) * (size_t)f->numel);
    lk_tensor_release(f);
    return v;
}

static int count_bad(const double *got, int64_t n, double (*want)(int64_t, lk_dtype), lk_dtype dt, int64_t *first) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (!got || got[i] != want(i, dt)) {
            if (!bad) *first = i;
            bad++;
        }
    return bad;
}

static double want_sum(int64_t i, lk_dtype dt) { return val(0, i, dt) + val(1, i, dt); }
static double want_avg(int64_t i, lk_dtype dt) { return want_sum(i, dt) / 2; }
static double want_max(int64_t i, lk_dtype dt) { return fmax(val(0, i, dt), val(1, i, dt)); }
static double want_min(int64_t i, lk_dtype dt) { return fmin(val(0, i, dt), val(1, i, dt)); }
static double want_root1(int64_t i, lk_dtype dt) { return val(1, i, dt); }

enum { N2 = 1000 };
static int g_rank; /* for the want_* of the per-rank collectives */
static double want_gather(int64_t i, lk_dtype dt) { return val((int)(i / N2), i % N2, dt); }
static double want_scatter(int64_t i, lk_dtype dt) { return want_sum(g_rank * N2 + i, dt); }

/* Each collective in each dtype NCCL takes, against the values computed
 * here (sums, averages of small integers: exact in every dtype). */
static int role_collectives(int rank) {
    lk_device g = {LK_CUDA, rank}; /* nccl binds local rank r to GPU r */
    lk_comm *c = make_comm(rank, getenv("LK_NCCL_TEST_JOB"), 60);
    if (!c) return 1;
    g_rank = rank;
    static const lk_dtype dts[] = {LK_F32, LK_F64, LK_BF16, LK_F16, LK_I32, LK_I64, LK_U8};
    struct {
        const char *name;
        lk_reduce_op op;
        double (*want)(int64_t, lk_dtype);
        bool float_only;
    } reds[] = {{"sum", LK_REDUCE_SUM, want_sum, false}, {"avg", LK_REDUCE_AVG, want_avg, true},
                {"max", LK_REDUCE_MAX, want_max, false}, {"min", LK_REDUCE_MIN, want_min, false}};
    int64_t n = N2, n2 = 2 * N2, first = 0;
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        lk_dtype dt = dts[k];
        const char *dn = lk_dtype_name(dt);
        bool is_float = dt == LK_F32 || dt == LK_F64 || dt == LK_BF16 || dt == LK_F16;
        for (size_t o = 0; o < sizeof reds / sizeof reds[0]; o++) {
            if (reds[o].float_only && !is_float) continue;
            lk_tensor *t = filled(g, dt, n, rank, 0);
            R_CHECK(rank, t, "%s buffer", dn);
            if (!t) continue;
            R_CHECK(rank, !lk_comm_all_reduce(c, t->data, (size_t)n, dt, reds[o].op), "all_reduce %s %s", reds[o].name, dn);
            double *v = host_values(t);
            int bad = count_bad(v, n, reds[o].want, dt, &first);
            R_CHECK(rank, !bad, "all_reduce %s %s: %d of %lld wrong, first at %lld: %g (want %g)", reds[o].name, dn, bad,
                    (long long)n, (long long)first, v ? v[first] : NAN, reds[o].want(first, dt));
            free(v), lk_tensor_release(t);
        }
        lk_tensor *t = filled(g, dt, n, rank, 0);
        R_CHECK(rank, t && !lk_comm_broadcast(c, t->data, (size_t)n, dt, 1), "broadcast from rank 1 %s", dn);
        double *v = t ? host_values(t) : NULL;
        R_CHECK(rank, !count_bad(v, n, want_root1, dt, &first), "broadcast %s: rank 1's values, first wrong at %lld", dn,
                (long long)first);
        free(v), lk_tensor_release(t);
        lk_tensor *send = filled(g, dt, n, rank, 0), *recv = filled(g, dt, n2, 0, 0);
        R_CHECK(rank, send && recv && !lk_comm_all_gather(c, send->data, recv->data, (size_t)n, dt), "all_gather %s", dn);
        v = recv ? host_values(recv) : NULL;
        R_CHECK(rank, !count_bad(v, n2, want_gather, dt, &first), "all_gather %s: first wrong at %lld", dn, (long long)first);
        free(v), lk_tensor_release(send), lk_tensor_release(recv);
        send = filled(g, dt, n2, rank, 0), recv = filled(g, dt, n, 0, 0);
        R_CHECK(rank, send && recv && !lk_comm_reduce_scatter(c, send->data, recv->data, (size_t)n, dt, LK_REDUCE_SUM),
                "reduce_scatter %s", dn);
        v = recv ? host_values(recv) : NULL;
        R_CHECK(rank, !count_bad(v, n, want_scatter, dt, &first), "reduce_scatter %s: block %d, first wrong at %lld", dn,
                rank, (long long)first);
        free(v), lk_tensor_release(send), lk_tensor_release(recv);
    }
    /* Several MiB: more than one round of any staging NCCL (or the fake) does. */
    int64_t big = 3 << 20;
    lk_tensor *t = filled(g, LK_F32, big, rank, 0);
    R_CHECK(rank, t && !lk_comm_all_reduce(c, t->data, (size_t)big, LK_F32, LK_REDUCE_SUM), "all_reduce of 12 MiB");
    double *v = t ? host_values(t) : NULL;
    int bad = count_bad(v, big, want_sum, LK_F32, &first);
    R_CHECK(rank, !bad, "all_reduce of 12 MiB: %d wrong, first at %lld", bad, (long long)first);
    free(v), lk_tensor_release(t);
    /* Order: the compute stream's kernel writes the buffer, the collective
     * reads it, the next kernel reads the result; only the events between
     * the two streams order them (nothing here synchronises). */
    lk_tensor *x = filled(g, LK_F32, n, rank, 0);
    lk_tensor *y = x ? lk_mul_scalar(x, 2.0f) : NULL; /* on x's GPU: ops follow their inputs */
    R_CHECK(rank, y && !lk_comm_all_reduce(c, y->data, (size_t)n, LK_F32, LK_REDUCE_SUM), "all_reduce between kernels");
    lk_tensor *z = y ? lk_add_scalar(y, 1.0f) : NULL;
    v = z ? host_values(z) : NULL;
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += !v || v[i] != 2 * want_sum(i, LK_F32) + 1;
    R_CHECK(rank, !bad, "kernel, all_reduce, kernel: %d of %lld wrong (the collective did not wait for its producer, or "
            "its consumer did not wait for it)", bad, (long long)n);
    free(v), lk_tensor_release(x), lk_tensor_release(y), lk_tensor_release(z);
    R_CHECK(rank, !lk_comm_barrier(c), "barrier");
    /* Host memory: through the backend's host communicator. */
    double hm[2] = {rank + 0.5, -rank};
    R_CHECK(rank, !lk_comm_all_reduce(c, hm, 2, LK_F64, LK_REDUCE_SUM) && hm[0] == 2.0 && hm[1] == -1.0,
            "host all_reduce: %g %g", hm[0], hm[1]);
    int64_t flag = rank ? 42 : 0;
    R_CHECK(rank, !lk_comm_broadcast(c, &flag, 1, LK_I64, 1) && flag == 42, "host broadcast from rank 1: %lld",
            (long long)flag);
    lk_comm_free(c);
    return rank_failed;
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank 1 never joins rank 0's collective: rank 0 must end with TIMEOUT
 * within its comm_timeout (2 s), then fail fast, then free cleanly. */
static int role_timeout(int rank) {
    lk_device g = {LK_CUDA, rank};
    lk_comm *c = make_comm(rank, getenv("LK_NCCL_TEST_JOB"), 2);
    if (!c) return 1;
    if (rank == 1) {
        sleep(5); /* busy elsewhere, then gone */
        lk_comm_free(c);
        return rank_failed;
    }
    lk_tensor *t = filled(g, LK_F32, 1000, rank, 0);
    double t0 = seconds();
    lk_status st = t ? lk_comm_all_reduce(c, t->data, 1000, LK_F32, LK_REDUCE_SUM) : LK_STATUS_OK;
    double took = seconds() - t0;
    R_CHECK(rank, st == LK_STATUS_TIMEOUT, "all_reduce without its peer: status %d, want TIMEOUT", (int)st);
    R_CHECK(rank, strstr(lk_last_error(), "comm_timeout"), "the error names comm_timeout");
    R_CHECK(rank, took > 1.5 && took < 4.5, "it took %.1f s, comm_timeout is 2 s", took);
    printf("[rank 0] TIMEOUT after %.1f s: %s\n", took, lk_last_error());
    t0 = seconds();
    st = lk_comm_all_reduce(c, t->data, 1000, LK_F32, LK_REDUCE_SUM);
    R_CHECK(rank, st != LK_STATUS_OK && seconds() - t0 < 1, "the next collective fails fast: status %d in %.1f s", (int)st,
            seconds() - t0);
    lk_tensor_release(t);
    lk_comm_free(c);
    return rank_failed;
}

/* Point-to-point: device memory by ncclSend/ncclRecv after a header on
 * the host communicator, host memory on the host communicator. Each dtype
 * both ways (rank 0 -> 1, then 1 -> 0) against the values computed here, a
 * message larger than any staging round, an empty one, async sends and
 * receives, an exchange ordered as NCCL needs it (one side receives
 * first), a message between a producer and a consumer kernel, and a
 * double array in host memory. */
static int role_p2p(int rank) {
    lk_device g = {LK_CUDA, rank};
    lk_comm *c = make_comm(rank, getenv("LK_NCCL_TEST_JOB"), 60);
    if (!c) return 1;
    int peer = 1 - rank;
    static const lk_dtype dts[] = {LK_F32, LK_F64, LK_BF16, LK_F16, LK_I32, LK_I64, LK_U8};
    int64_t first = 0;
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        lk_dtype dt = dts[k];
        for (int from = 0; from < 2; from++) {
            lk_tensor *t = filled(g, dt, N2, rank == from ? from : 9, 0);
            R_CHECK(rank, t, "buffer");
            if (!t) continue;
            lk_status st = rank == from ? lk_comm_send(c, t->data, N2, dt, peer) : lk_comm_recv(c, t->data, N2, dt, peer);
            R_CHECK(rank, !st, "%s %s from rank %d", rank == from ? "send" : "recv", lk_dtype_name(dt), from);
            if (rank != from) {
                double *v = host_values(t);
                int bad = 0;
                for (int64_t i = 0; i < N2; i++)
                    if (!v || v[i] != val(from, i, dt)) bad += !bad ? (first = i, 1) : 1;
                R_CHECK(rank, !bad, "recv %s from rank %d: %d of %d wrong, first at %lld", lk_dtype_name(dt), from, bad,
                        N2, (long long)first);
                free(v);
            }
            lk_tensor_release(t);
        }
    }
    /* 3 Mi floats (several staging rounds), and an empty message */
    int64_t big = 3 << 20;
    lk_tensor *t = filled(g, LK_F32, big, rank == 0 ? 0 : 9, 0);
    R_CHECK(rank, t && !(rank == 0 ? lk_comm_send(c, t->data, (size_t)big, LK_F32, 1) : lk_comm_recv(c, t->data, (size_t)big, LK_F32, 0)),
            "12 MiB message");
    if (rank == 1) {
        double *v = t ? host_values(t) : NULL;
        int bad = 0;
        for (int64_t i = 0; i < big; i++) bad += !v || v[i] != val(0, i, LK_F32);
        R_CHECK(rank, !bad, "12 MiB message: %d wrong", bad);
        free(v);
    }
    R_CHECK(rank, t && !(rank == 0 ? lk_comm_send(c, t->data, 0, LK_F32, 1) : lk_comm_recv(c, t->data, 0, LK_F32, 0)),
            "empty message");
    lk_tensor_release(t);
    /* An exchange, async, ordered: rank 0 sends first, rank 1 receives first */
    lk_tensor *out = filled(g, LK_F32, N2, rank, 0), *in = filled(g, LK_F32, N2, 9, 0);
    lk_work *ws = NULL, *wr = NULL;
    if (rank == 0) {
        R_CHECK(rank, out && in && !lk_comm_send_async(c, out->data, N2, LK_F32, 1, &ws), "send_async");
        R_CHECK(rank, in && !lk_comm_recv_async(c, in->data, N2, LK_F32, 1, &wr), "recv_async");
    } else {
        R_CHECK(rank, out && in && !lk_comm_recv_async(c, in->data, N2, LK_F32, 0, &wr), "recv_async");
        R_CHECK(rank, out && !lk_comm_send_async(c, out->data, N2, LK_F32, 0, &ws), "send_async");
    }
    R_CHECK(rank, ws && !lk_work_wait(ws), "exchange: send");
    R_CHECK(rank, wr && !lk_work_wait(wr), "exchange: recv");
    lk_work_free(ws), lk_work_free(wr);
    double *v = in ? host_values(in) : NULL;
    int bad = 0;
    for (int64_t i = 0; i < N2; i++) bad += !v || v[i] != val(peer, i, LK_F32);
    R_CHECK(rank, !bad, "exchange: %d of %d wrong", bad, N2);
    free(v), lk_tensor_release(out), lk_tensor_release(in);
    /* Order: a kernel writes the buffer, the send reads it; the receive
     * writes its buffer, a kernel reads it (only events order them). */
    lk_tensor *x = filled(g, LK_F32, N2, rank, 0);
    lk_tensor *y = x ? lk_mul_scalar(x, 2.0f) : NULL;
    R_CHECK(rank, y && !(rank == 0 ? lk_comm_send(c, y->data, N2, LK_F32, 1) : lk_comm_recv(c, y->data, N2, LK_F32, 0)),
            "message between kernels");
    lk_tensor *z = y ? lk_add_scalar(y, 1.0f) : NULL;
    if (rank == 1) {
        v = z ? host_values(z) : NULL;
        bad = 0;
        for (int64_t i = 0; i < N2; i++) bad += !v || v[i] != 2 * val(0, i, LK_F32) + 1;
        R_CHECK(rank, !bad, "kernel, send/recv, kernel: %d of %d wrong", bad, N2);
        free(v);
    }
    lk_tensor_release(x), lk_tensor_release(y), lk_tensor_release(z);
    /* Host memory: the host communicator's point-to-point */
    double hm[3] = {rank + 0.25, 2.0 * rank, -1.0};
    R_CHECK(rank, !(rank == 1 ? lk_comm_send(c, hm, 3, LK_F64, 0) : lk_comm_recv(c, hm, 3, LK_F64, 1)), "host message");
    if (rank == 0) R_CHECK(rank, hm[0] == 1.25 && hm[1] == 2.0 && hm[2] == -1.0, "host message: %g %g %g", hm[0], hm[1], hm[2]);
    lk_comm_free(c);
    return rank_failed;
}

/* A receive of another count than its send: the receiver names both sides
 * at once, before any NCCL call; the sender, whose ncclSend finds no
 * receive, fails at comm_timeout (2 s). */
static int role_p2p_mismatch(int rank) {
    lk_device g = {LK_CUDA, rank};
    lk_comm *c = make_comm(rank, getenv("LK_NCCL_TEST_JOB"), 2);
    if (!c) return 1;
    lk_tensor *t = filled(g, LK_F32, 100, rank, 0);
    double t0 = seconds();
    lk_status st = !t ? LK_STATUS_OK : rank == 0 ? lk_comm_send(c, t->data, 100, LK_F32, 1) : lk_comm_recv(c, t->data, 50, LK_F32, 0);
    double took = seconds() - t0;
    if (rank == 1) {
        R_CHECK(rank, st == LK_STATUS_INVALID_USAGE &&
                          strstr(lk_last_error(), "point-to-point mismatch (desync) on the pair rank 0 -> rank 1, message #1: "
                                                  "rank 0 sends f32 x 100 (400 bytes), rank 1 receives f32 x 50 (200 bytes)"),
                "the receiver names the mismatch: status %d", (int)st);
        R_CHECK(rank, took < 1.5, "the receiver took %.1f s", took);
        printf("[rank 1] after %.2f s: %s\n", took, lk_last_error());
        sleep(3); /* alive while rank 0 times out */
    } else {
        R_CHECK(rank, st == LK_STATUS_TIMEOUT && strstr(lk_last_error(), "send #1 from rank 0 to rank 1 (f32 x 100) did not complete"),
                "the sender times out: status %d", (int)st);
        R_CHECK(rank, took > 1.5 && took < 10, "the sender took %.1f s, comm_timeout is 2 s", took);
        printf("[rank 0] after %.1f s: %s\n", took, lk_last_error());
    }
    lk_tensor_release(t);
    lk_comm_free(c);
    return rank_failed;
}

/* Both ranks send before they receive (async): NCCL runs each rank's
 * send, then its receive, each blocking until the peer's matching call
 * runs, so neither receive ever runs. Both ranks end at comm_timeout (2 s)
 * with an error naming the pair, never a hang. */
static int role_p2p_crossed(int rank) {
    lk_device g = {LK_CUDA, rank};
    lk_comm *c = make_comm(rank, getenv("LK_NCCL_TEST_JOB"), 2);
    if (!c) return 1;
    lk_tensor *out = filled(g, LK_F32, 100, rank, 0), *in = filled(g, LK_F32, 100, 9, 0);
    lk_work *ws = NULL, *wr = NULL;
    double t0 = seconds();
    R_CHECK(rank, out && in && !lk_comm_send_async(c, out->data, 100, LK_F32, 1 - rank, &ws), "send_async");
    R_CHECK(rank, in && !lk_comm_recv_async(c, in->data, 100, LK_F32, 1 - rank, &wr), "recv_async");
    lk_status s1 = ws ? lk_work_wait(ws) : LK_STATUS_OK, s2 = wr ? lk_work_wait(wr) : LK_STATUS_OK;
    double took = seconds() - t0;
    R_CHECK(rank, s1 == LK_STATUS_TIMEOUT || s2 == LK_STATUS_TIMEOUT || s1 == LK_STATUS_ABORTED,
            "crossed sends: status %d / %d, want a TIMEOUT", (int)s1, (int)s2);
    R_CHECK(rank, strstr(lk_last_error(), "did not complete within 2 s") || strstr(lk_last_error(), "communicator already failed"),
            "the error says the timeout");
    R_CHECK(rank, took > 1.5 && took < 10, "it took %.1f s, comm_timeout is 2 s", took);
    printf("[rank %d] crossed sends ended after %.1f s: %s\n", rank, took, lk_last_error());
    lk_work_free(ws), lk_work_free(wr);
    lk_tensor_release(out), lk_tensor_release(in);
    lk_comm_free(c);
    return rank_failed;
}

static void *abort_later(void *c) {
    usleep(500 * 1000);
    lk_comm_abort(c, "the test aborts it");
    return NULL;
}

/* lk_comm_abort from another thread while rank 0 waits in a collective
 * that rank 1 never joins: ABORTED long before the 60 s timeout. */
static int role_abort(int rank) {
    lk_device g = {LK_CUDA, rank};
    lk_comm *c = make_comm(rank, getenv("LK_NCCL_TEST_JOB"), 60);
    if (!c) return 1;
    if (rank == 1) {
        sleep(3);
        lk_comm_free(c);
        return rank_failed;
    }
    lk_tensor *t = filled(g, LK_F32, 1000, rank, 0);
    pthread_t th;
    pthread_create(&th, NULL, abort_later, c);
    double t0 = seconds();
    lk_status st = t ? lk_comm_all_reduce(c, t->data, 1000, LK_F32, LK_REDUCE_SUM) : LK_STATUS_OK;
    double took = seconds() - t0;
    pthread_join(th, NULL);
    R_CHECK(rank, st == LK_STATUS_ABORTED, "all_reduce aborted from another thread: status %d, want ABORTED", (int)st);
    R_CHECK(rank, took < 10, "it took %.1f s", took);
    printf("[rank 0] ABORTED after %.1f s: %s\n", took, lk_last_error());
    lk_tensor_release(t);
    lk_comm_free(c);
    return rank_failed;
}

/* ---- two ranks: the parent ---- */

/* Runs role in two processes, ranks 0 and 1, each exec'd fresh; kills them
 * after deadline_s. True when both exit 0. */
static bool two_processes(const char *role, double deadline_s) {
    char job[64];
    snprintf(job, sizeof job, "gpunccl2-%d-%s", (int)getpid(), role);
    fflush(stdout), fflush(stderr);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            char rs[8];
            snprintf(rs, sizeof rs, "%d", r);
            setenv("LK_NCCL_TEST_ROLE", role, 1), setenv("LK_NCCL_TEST_RANK", rs, 1), setenv("LK_NCCL_TEST_JOB", job, 1);
            char *args[] = {"test_nccl", NULL};
            execv("/proc/self/exe", args);
            perror("execv /proc/self/exe");
            _exit(127);
        }
    }
    int status[2] = {0, 0}, left = 2;
    bool done[2] = {false, false};
    double t0 = seconds();
    while (left > 0 && seconds() - t0 < deadline_s) {
        for (int r = 0; r < 2; r++)
            if (!done[r] && waitpid(pid[r], &status[r], WNOHANG) == pid[r]) done[r] = true, left--;
        usleep(20 * 1000);
    }
    bool ok = true;
    for (int r = 0; r < 2; r++) {
        if (!done[r]) {
            fprintf(stderr, "%s: rank %d still running after %.0f s: a hang (killed)\n", role, r, deadline_s);
            kill(pid[r], SIGKILL), waitpid(pid[r], NULL, 0);
            ok = false;
        } else if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
            fprintf(stderr, "%s: rank %d ended with %s %d\n", role, r, WIFEXITED(status[r]) ? "exit" : "signal",
                    WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]));
            ok = false;
        }
    }
    return ok;
}

static bool two_gpus(void) {
    if (lk__cuda_visible() >= 2) return true;
    printf("two ranks need two GPUs, %d visible: skipped\n", lk__cuda_visible());
    return false;
}

static void two_ranks(void) {
    if (nccl_built() && two_gpus()) CHECK(two_processes("collectives", 300));
}
static void two_ranks_timeout(void) {
    if (nccl_built() && two_gpus()) CHECK(two_processes("timeout", 60));
}
static void two_ranks_abort(void) {
    if (nccl_built() && two_gpus()) CHECK(two_processes("abort", 60));
}
static void two_ranks_p2p(void) {
    if (nccl_built() && two_gpus()) CHECK(two_processes("p2p", 300));
}
static void two_ranks_p2p_mismatch(void) {
    if (nccl_built() && two_gpus()) CHECK(two_processes("p2p_mismatch", 60));
}
static void two_ranks_p2p_crossed(void) {
    if (nccl_built() && two_gpus()) CHECK(two_processes("p2p_crossed", 60));
}

int main(int argc, char **argv) {
    const char *role = getenv("LK_NCCL_TEST_ROLE");
    if (role) { /* a rank of two_processes */
        if (lk__cuda_register()) return fprintf(stderr, "cuda device did not register: %s\n", lk_last_error()), 1;
        int rank = atoi(getenv("LK_NCCL_TEST_RANK"));
        if (!strcmp(role, "collectives")) return role_collectives(rank);
        if (!strcmp(role, "timeout")) return role_timeout(rank);
        if (!strcmp(role, "abort")) return role_abort(rank);
        if (!strcmp(role, "p2p")) return role_p2p(rank);
        if (!strcmp(role, "p2p_mismatch")) return role_p2p_mismatch(rank);
        if (!strcmp(role, "p2p_crossed")) return role_p2p_crossed(rank);
        return fprintf(stderr, "unknown role %s\n", role), 1;
    }
    gpu_test_require();
    static const lk_t_case cases[] = {LK_TEST_CASE(one_rank), LK_TEST_CASE(two_ranks), LK_TEST_CASE(two_ranks_timeout),
                                      LK_TEST_CASE(two_ranks_abort), LK_TEST_CASE(two_ranks_p2p),
                                      LK_TEST_CASE(two_ranks_p2p_mismatch), LK_TEST_CASE(two_ranks_p2p_crossed)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
