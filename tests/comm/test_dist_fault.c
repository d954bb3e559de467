/* dist, failures: a rank SIGKILLed in the middle of a long all-reduce, a
 * rank SIGSTOPped (comm_timeout), ranks issuing different collectives
 * (desync), a rank that never comes, leaves or aborts, WORLD_SIZE that does
 * not match the processes, two processes with the same rank. Every survivor
 * must fail with the right status and a message naming the rank, pid and
 * collective, in time; no process and no /dev/shm segment may remain.
 * And what must not fail: the whole job suspended longer than comm_timeout
 * and resumed, rank 0's announced long work (a checkpoint write) longer
 * than comm_timeout, a stale segment of zeros left under the job's name. */
#include <fcntl.h>

#include "coll_check.h"

static void record(int r, lk_status st) {
    du->status[r] = st;
    du->t[r] = lk_time_now();
    snprintf(du->msg[r], sizeof du->msg[r], "%s", lk_last_error());
}

/* Loops big in-segment all-reduces until one fails (the kill comes mid-flight). */
static int long_all_reduce_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 30, &c)) return record(r, lk_last_status()), 1;
    float *buf;
    size_t n = 4u << 20;
    if (lk_comm_alloc_shared(c, n * sizeof(float), (void **)&buf)) return 1;
    lk_status st = LK_STATUS_OK;
    for (int i = 0; i < 100000 && !st; i++) {
        st = lk_comm_all_reduce(c, buf, n, LK_F32, LK_REDUCE_SUM);
        du->ready[r] = i + 1;
    }
    record(r, st);
    lk_status again = lk_comm_barrier(c); /* after a failure: fast, ABORTED */
    lk_comm_free(c);
    if (again != LK_STATUS_ABORTED) return fprintf(stderr, "after failure: %s\n", lk_status_str(again)), 1;
    return st == LK_STATUS_OK; /* 0: failed as it should, then failed fast */
}

static bool wait_ready(int W, int skip, double timeout) {
    double end = lk_time_now() + timeout;
    for (;;) {
        bool all = true;
        for (int r = 0; r < W; r++) all = all && (r == skip || du->ready[r] >= 2);
        if (all) return true;
        if (lk_time_now() > end) return false;
        usleep(1000);
    }
}

static void sigkill_mid_all_reduce(void) {
    du_map();
    const int W = 3, victim = 1;
    int pid[DU_MAXW], codes[DU_MAXW];
    du_start(W, long_all_reduce_rank, NULL, pid);
    CHECK(wait_ready(W, -1, 20));
    usleep(50000);
    double t_kill = lk_time_now();
    kill(pid[victim], SIGKILL);
    du_wait(W, pid, 15, codes);
    char pidstr[32];
    snprintf(pidstr, sizeof pidstr, "pid %d", pid[victim]);
    for (int r = 0; r < W; r++) {
        if (r == victim) {
            CHECK(codes[r] == 128 + SIGKILL);
            continue;
        }
        CHECK_MSG(codes[r] == 0, "rank %d exit %d", r, codes[r]);
        CHECK_MSG(du->status[r] == LK_STATUS_REMOTE, "rank %d: %s: %s", r, lk_status_str(du->status[r]), du->msg[r]);
        CHECK_MSG(strstr(du->msg[r], "rank 1") && strstr(du->msg[r], pidstr) && strstr(du->msg[r], "all_reduce"),
                  "rank %d message: %s", r, du->msg[r]);
        CHECK_MSG(du->t[r] - t_kill < 5.0, "rank %d noticed after %.2f s", r, du->t[r] - t_kill);
    }
    printf("     kill noticed in %.3f s: %s\n", du->t[0] - t_kill, du->msg[0]);
    CHECK(!du_segment_exists(du_job));
}

static int barrier_loop_rank(int r, int W, void *arg) {
    double timeout = *(double *)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", timeout, &c)) return record(r, lk_last_status()), 1;
    lk_status st = LK_STATUS_OK;
    float x = 1;
    for (int i = 0; i < 10000000 && !st; i++) {
        st = i % 2 ? lk_comm_barrier(c) : lk_comm_all_reduce(c, &x, 1, LK_F32, LK_REDUCE_MAX);
        du->ready[r] = i + 1;
    }
    record(r, st);
    lk_comm_free(c);
    return 3;
}

static void sigstop_times_out(void) {
    du_map();
    const int W = 3, victim = 2;
    double timeout = 1.5;
    int pid[DU_MAXW], codes[DU_MAXW];
    du_start(W, barrier_loop_rank, &timeout, pid);
    CHECK(wait_ready(W, -1, 20));
    double t_stop = lk_time_now();
    kill(pid[victim], SIGSTOP);
    /* survivors must give up on their own; then clean up the stopped one */
    double end = lk_time_now() + 10;
    while ((!du->status[0] || !du->status[1]) && lk_time_now() < end) usleep(5000);
    kill(pid[victim], SIGKILL);
    kill(pid[victim], SIGCONT);
    du_wait(W, pid, 10, codes);
    for (int r = 0; r < W; r++) {
        if (r == victim) continue;
        CHECK_MSG(du->status[r] == LK_STATUS_TIMEOUT, "rank %d: %s: %s", r, lk_status_str(du->status[r]), du->msg[r]);
        CHECK_MSG(strstr(du->msg[r], "rank 2") && strstr(du->msg[r], "stopped") &&
                      (strstr(du->msg[r], "barrier #") || strstr(du->msg[r], "all_reduce #")) && strstr(du->msg[r], "did not arrive"),
                  "rank %d message: %s", r, du->msg[r]);
        double dt = du->t[r] - t_stop;
        CHECK_MSG(dt > timeout - 0.2 && dt < timeout + 3, "rank %d gave up after %.2f s (timeout %.1f)", r, dt, timeout);
    }
    printf("     stop: %s\n", du->msg[0]);
    CHECK(!du_segment_exists(du_job));
}

typedef struct {
    lk_dtype dt[2];
    size_t count[2];
    int kind[2]; /* 0 all_reduce, 1 broadcast, 2 barrier */
    bool shared;
} desync_case;

static int desync_rank(int r, int W, void *arg) {
    const desync_case *d = arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 10, &c)) return record(r, lk_last_status()), 1;
    void *buf = NULL;
    size_t bytes = d->count[r] * lk_dtype_size(d->dt[r]);
    if (d->shared) lk_comm_alloc_shared(c, bytes, &buf);
    else buf = lk_calloc(1, bytes + 8);
    lk_status st = lk_comm_barrier(c); /* a good one first */
    if (!st) {
        if (d->kind[r] == 0) st = lk_comm_all_reduce(c, buf, d->count[r], d->dt[r], LK_REDUCE_SUM);
        else if (d->kind[r] == 1) st = lk_comm_broadcast(c, buf, d->count[r], d->dt[r], 0);
        else st = lk_comm_barrier(c);
    }
    record(r, st);
    lk_status again = lk_comm_all_reduce(c, buf, 1, LK_F32, LK_REDUCE_SUM);
    if (st && again != LK_STATUS_ABORTED) fprintf(stderr, "after desync: %s\n", lk_status_str(again));
    if (d->shared) lk_comm_free_shared(c, buf);
    else lk_free(buf);
    lk_comm_free(c);
    return 0;
}

static void desync_detected(void) {
    du_map();
    const desync_case cases[] = {
        {{LK_F32, LK_F32}, {1024, 1023}, {0, 0}, false},
        {{LK_F32, LK_F64}, {16, 16}, {0, 0}, false},
        {{LK_F32, LK_F32}, {1u << 20, (1u << 20) + 16}, {0, 0}, true},
        {{LK_F32, LK_F32}, {100, 100}, {1, 0}, false},
        {{LK_F32, LK_F32}, {100, 0}, {0, 2}, false},
    };
    const char *need[][2] = {{"f32 x 1024", "f32 x 1023"}, {"f32 x 16", "f64 x 16"}, {"x 1048576", "x 1048592"},
                             {"rank 0 called broadcast", "rank 1 called all_reduce"}, {"all_reduce #2", "barrier #2"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(du, 0, sizeof *du);
        double t0 = lk_time_now();
        CHECK(du_run(2, desync_rank, (void *)&cases[i], 20, NULL, NULL) == 2);
        for (int r = 0; r < 2; r++) {
            CHECK_MSG(du->status[r] == LK_STATUS_INVALID_USAGE || du->status[r] == LK_STATUS_REMOTE, "case %zu rank %d: %s: %s",
                      i, r, lk_status_str(du->status[r]), du->msg[r]);
            CHECK_MSG(strstr(du->msg[r], "desync") && strstr(du->msg[r], need[i][0]) && strstr(du->msg[r], need[i][1]),
                      "case %zu rank %d: %s", i, r, du->msg[r]);
        }
        CHECK(lk_time_now() - t0 < 5);
        CHECK(!du_segment_exists(du_job));
    }
    printf("     desync: %s\n", du->msg[0]);
}

/* Rank 1 misbehaves in the way arg says while rank 0 waits in a barrier. */
static int lonely_rank(int r, int W, void *arg) {
    int mode = *(int *)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 1.0, &c)) return record(r, lk_last_status()), 1;
    if (r == 0) {
        record(0, lk_comm_barrier(c));
    } else if (mode == 0) {
        usleep(1800000); /* never calls it (the rank-0-only evaluation bug) */
    } else if (mode == 1) {
        /* leaves at once */
    } else {
        lk_comm_abort(c, "loss is NaN at step 7");
        usleep(500000);
    }
    lk_comm_free(c);
    return 0;
}

static void missing_left_aborted(void) {
    du_map();
    const char *need[3][3] = {{"barrier #1", "rank 1", "not in a collective"},
                              {"barrier #1", "rank 1", "left the communicator"},
                              {"barrier #1", "rank 1", "loss is NaN at step 7"}};
    const lk_status want[3] = {LK_STATUS_TIMEOUT, LK_STATUS_REMOTE, LK_STATUS_REMOTE};
    for (int mode = 0; mode < 3; mode++) {
        memset(du, 0, sizeof *du);
        CHECK(du_run(2, lonely_rank, &mode, 20, NULL, NULL) == 2);
        CHECK_MSG(du->status[0] == want[mode], "mode %d: %s: %s", mode, lk_status_str(du->status[0]), du->msg[0]);
        for (int k = 0; k < 3; k++) CHECK_MSG(strstr(du->msg[0], need[mode][k]), "mode %d: %s", mode, du->msg[0]);
        CHECK(!du_segment_exists(du_job));
        printf("     %s\n", du->msg[0]);
    }
}

/* WORLD_SIZE problems: too few processes, disagreeing sizes, duplicate ranks. */
static int world_rank(int r, int W, void *arg) {
    int mode = *(int *)arg;
    int rank = r, world = W;
    if (mode == 0) world = 3;          /* 2 processes think the world has 3 */
    else if (mode == 1) world = r + 2; /* rank 0 says 2, rank 1 says 3 */
    else rank = 0;                     /* both claim rank 0 */
    lk_comm *c = NULL;
    lk_status st = du_comm(rank, world, "shm", 1.0, &c);
    record(r, st);
    lk_comm_free(c);
    return 0;
}

static void world_size_mismatch(void) {
    du_map();
    int mode = 0;
    double t0 = lk_time_now();
    CHECK(du_run(2, world_rank, &mode, 20, NULL, NULL) == 2);
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(du->status[r] == LK_STATUS_TIMEOUT && strstr(du->msg[r], "2 of 3 ranks attached") &&
                      strstr(du->msg[r], "missing rank 2") && strstr(du->msg[r], "WORLD_SIZE"),
                  "rank %d: %s", r, du->msg[r]);
    }
    CHECK(lk_time_now() - t0 < 4);
    CHECK(!du_segment_exists(du_job));
    printf("     %s\n", du->msg[0]);

    mode = 1;
    memset(du, 0, sizeof *du);
    CHECK(du_run(2, world_rank, &mode, 20, NULL, NULL) == 2);
    bool named = strstr(du->msg[1], "WORLD_SIZE mismatch") && strstr(du->msg[1], "world size 3") && strstr(du->msg[1], "size 2");
    CHECK_MSG(du->status[1] == LK_STATUS_INVALID_ARGUMENT && named, "rank 1: %s", du->msg[1]);
    CHECK_MSG(du->status[0] == LK_STATUS_TIMEOUT, "rank 0: %s", du->msg[0]);
    CHECK(!du_segment_exists(du_job));

    mode = 2;
    memset(du, 0, sizeof *du);
    CHECK(du_run(2, world_rank, &mode, 20, NULL, NULL) == 2);
    int dup = 0;
    for (int r = 0; r < 2; r++) dup += strstr(du->msg[r], "already") != NULL;
    CHECK_MSG(dup >= 1 && du->status[0] && du->status[1], "duplicate rank: %s | %s", du->msg[0], du->msg[1]);
    CHECK(!du_segment_exists(du_job));
}

/* Collectives until the parent sets du->stop; the ranks agree on when to
 * stop through the all-reduce itself, so none leaves while another waits.
 * Rank 1 "computes" 100 ms before each, so rank 0 is nearly always waiting. */
static int until_stopped_rank(int r, int W, void *arg) {
    double timeout = *(double *)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", timeout, &c)) return record(r, lk_last_status()), 1;
    lk_status st = LK_STATUS_OK;
    float stop = 0;
    for (int i = 0; !st && stop == 0; i++) {
        if (r == 1) usleep(100000);
        stop = (float)du->stop;
        st = i % 2 ? lk_comm_barrier(c) : lk_comm_all_reduce(c, &stop, 1, LK_F32, LK_REDUCE_MAX);
        if (i % 2) stop = 0;
        du->ready[r] = i + 1;
    }
    record(r, st);
    lk_comm_free(c);
    return st != LK_STATUS_OK;
}

/* Ctrl-Z / a scheduler's suspend: every rank stopped for longer than
 * comm_timeout, then continued (rank 0 first, rank 1 0.1 s later, as
 * signals reach a job one process at a time). Nobody could make progress
 * while all were stopped, so nobody is late. */
static void suspend_whole_job(void) {
    du_map();
    const int W = 2;
    double timeout = 1.0;
    int pid[DU_MAXW], codes[DU_MAXW];
    du_start(W, until_stopped_rank, &timeout, pid);
    CHECK(wait_ready(W, -1, 20));
    for (int r = 0; r < W; r++) kill(pid[r], SIGSTOP);
    usleep(2500000); /* 2.5 x comm_timeout */
    int before = du->ready[0];
    kill(pid[0], SIGCONT);
    usleep(100000);
    kill(pid[1], SIGCONT);
    double end = lk_time_now() + 10;
    while (du->ready[0] < before + 10 && !du->status[0] && !du->status[1] && lk_time_now() < end) usleep(5000);
    du->stop = 1;
    du_wait(W, pid, 15, codes);
    for (int r = 0; r < W; r++)
        CHECK_MSG(codes[r] == 0 && du->status[r] == LK_STATUS_OK, "rank %d (exit %d) after suspend/resume: %s: %s", r, codes[r],
                  lk_status_str(du->status[r]), du->msg[r]);
    printf("     resumed after a 2.5 s suspend of every rank (comm_timeout 1 s): %d collectives after CONT\n",
           du->ready[0] - before);
    CHECK(!du_segment_exists(du_job));
}

typedef struct {
    double timeout, limit;
    int work_ms;  /* rank 0's work between the announcement and its collective */
    int late_ms;  /* rank 1 arrives this late (a stall of another rank during the work) */
} long_work_case;

static int long_work_rank(int r, int W, void *arg) {
    const long_work_case *lw = arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", lw->timeout, &c)) return record(r, lk_last_status()), 1;
    lk_status st = lk_comm_barrier(c);
    if (!st)
        st = lk_comm_long_work(c, 0, r == 0 ? "checkpoint write to runs/v0/checkpoints" : "checkpoint write",
                               "trainer.checkpoint_timeout", lw->limit);
    if (!st && r == 0) usleep((useconds_t)lw->work_ms * 1000);
    if (!st && r == 1) usleep((useconds_t)lw->late_ms * 1000);
    double t0 = lk_time_now();
    int32_t code = 0;
    if (!st) st = lk_comm_all_reduce(c, &code, 1, LK_I32, LK_REDUCE_MAX);
    record(r, st);
    du->t[r] = lk_time_now() - t0;
    if (!st) st = lk_comm_barrier(c); /* the bound is gone after the one collective */
    lk_comm_free(c);
    return 0;
}

/* A checkpoint write longer than comm_timeout is waited for up to its own
 * limit, and a timeout then names the write and the setting; a different
 * rank's stall during the write still fails at comm_timeout. */
static void long_work_own_bound(void) {
    du_map();
    long_work_case ok = {0.5, 10, 1500, 0};
    CHECK(du_run(2, long_work_rank, &ok, 20, NULL, NULL) == 2);
    for (int r = 0; r < 2; r++)
        CHECK_MSG(du->status[r] == LK_STATUS_OK, "a 1.5 s write, comm_timeout 0.5 s, limit 10 s: rank %d: %s: %s", r,
                  lk_status_str(du->status[r]), du->msg[r]);
    CHECK(!du_segment_exists(du_job));

    memset(du, 0, sizeof *du);
    long_work_case over = {0.5, 1.0, 3000, 0};
    CHECK(du_run(2, long_work_rank, &over, 20, NULL, NULL) == 2);
    CHECK_MSG(du->status[1] == LK_STATUS_TIMEOUT && strstr(du->msg[1], "checkpoint write to runs/v0/checkpoints") &&
                  strstr(du->msg[1], "took longer than trainer.checkpoint_timeout") && strstr(du->msg[1], "rank 0") &&
                  !strstr(du->msg[1], "not in a collective"),
              "rank 1: %s: %s", lk_status_str(du->status[1]), du->msg[1]);
    CHECK_MSG(du->t[1] > 0.9 && du->t[1] < 2.5, "rank 1 gave up after %.2f s (limit 1 s)", du->t[1]);
    printf("     %s\n", du->msg[1]);
    CHECK(!du_segment_exists(du_job));

    memset(du, 0, sizeof *du);
    long_work_case stall = {0.5, 10, 100, 3000};
    CHECK(du_run(2, long_work_rank, &stall, 20, NULL, NULL) == 2);
    CHECK_MSG(du->status[0] == LK_STATUS_TIMEOUT && strstr(du->msg[0], "comm_timeout") && strstr(du->msg[0], "rank 1"),
              "rank 0: %s: %s", lk_status_str(du->status[0]), du->msg[0]);
    CHECK_MSG(du->t[0] < 2.0, "rank 0 gave up on the stalled rank 1 after %.2f s (comm_timeout 0.5 s)", du->t[0]);
    CHECK(!du_segment_exists(du_job));
}

/* A leftover /dev/shm/lockstep-<job> of zeros (no lockstep header). */
static int stale_rank(int r, int W, void *arg) {
    int mode = *(int *)arg;
    if (r == 0) {
        if (mode == 1) return 0; /* rank 0 never comes */
        usleep(300000);           /* rank 1 finds the stale file first */
    }
    double t0 = lk_time_now();
    lk_comm *c = NULL;
    lk_status st = du_comm(r, W, "shm", mode == 1 ? 1.0 : 5.0, &c);
    if (!st) st = lk_comm_barrier(c);
    record(r, st);
    du->t[r] = lk_time_now() - t0;
    lk_comm_free(c);
    return 0;
}

static void stale_segment_of_zeros(void) {
    for (int mode = 0; mode < 2; mode++) {
        du_map();
        static int n;
        snprintf(du_job, sizeof du_job, "stale%d-%d", (int)getpid(), ++n);
        char name[256];
        lk_comm_shm_segment_name(du_job, name, sizeof name);
        int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
        close(fd);
        /* du_start names a fresh job: give the ranks this one instead */
        int pid[DU_MAXW], codes[DU_MAXW];
        char keep[96];
        snprintf(keep, sizeof keep, "%s", du_job);
        fflush(stdout);
        for (int r = 0; r < 2; r++) {
            pid[r] = fork();
            if (pid[r] == 0) {
                snprintf(du_job, sizeof du_job, "%s", keep);
                exit(stale_rank(r, 2, &mode));
            }
        }
        du_wait(2, pid, 15, codes);
        if (mode == 0) {
            for (int r = 0; r < 2; r++)
                CHECK_MSG(du->status[r] == LK_STATUS_OK && du->t[r] < 3.0, "rank %d after %.2f s: %s: %s", r, du->t[r],
                          lk_status_str(du->status[r]), du->msg[r]);
            printf("     rank 1 joined %.2f s after finding a stale segment of zeros\n", du->t[1]);
        } else {
            CHECK_MSG(du->status[1] == LK_STATUS_TIMEOUT && strstr(du->msg[1], "but has no lockstep header") &&
                          strstr(du->msg[1], "remove it") && !strstr(du->msg[1], "WORLD_SIZE"),
                      "rank 1: %s: %s", lk_status_str(du->status[1]), du->msg[1]);
            printf("     %s\n", du->msg[1]);
        }
        shm_unlink(name);
    }
}

LK_TEST_MAIN(LK_TEST_CASE(suspend_whole_job), LK_TEST_CASE(long_work_own_bound), LK_TEST_CASE(stale_segment_of_zeros),
             LK_TEST_CASE(sigkill_mid_all_reduce), LK_TEST_CASE(sigstop_times_out), LK_TEST_CASE(desync_detected),
             LK_TEST_CASE(missing_left_aborted), LK_TEST_CASE(world_size_mismatch))
