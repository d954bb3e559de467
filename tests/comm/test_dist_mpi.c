/* dist under mpirun: argv[1] = "mpi" runs the collective matrix on the mpi
 * backend (checked against the double reference; all-reduce bits compared
 * across ranks through MPI itself); "desync" makes the ranks disagree, which
 * must fail on every rank and then abort the MPI job at exit (run by
 * test_mpi_fault.sh, which expects the abort); "shm" checks that the shm
 * backend finds its process group and job id in OpenMPI's variables;
 * "group" (4 ranks) runs group_check.h's mesh, exchange and split checks on
 * the mpi backend; "p2pfault" (2 ranks, run by test_mpi_fault.sh) a send
 * whose receive never comes and a receive of another size, each named;
 * "p2pkill" (2 ranks, run by test_mpi_fault.sh) a rank killed mid-send;
 * "splitkill" (2 ranks, the same) a rank that dies inside lk_comm_split. */
#include <signal.h>
#include <time.h>

#include "coll_check.h"
#include "comm/group_check.h"

static const char *backend = "mpi";

static void matrix_under_mpirun(void) {
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = backend;
    cfg.timeout_s = 30;
    cfg.shared_bytes = 64u << 20;
    lk_comm *c = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    if (!c) return;
    int W = lk_comm_world_size(c), r = lk_comm_rank(c);
    CHECK(W >= 2 && !strcmp(lk_comm_backend(c), backend));
    static uint64_t h[DU_NRES], all[DU_NRES];
    int n = 0;
    CHECK(cc_check_all(c, 99, true, h, &n) == 0);
    /* bits identical on every rank: compare against rank 0's hashes */
    memcpy(all, h, sizeof h);
    CHECK_OK(lk_comm_broadcast(c, all, (size_t)n, LK_I64, 0));
    CHECK_MSG(!memcmp(all, h, sizeof(uint64_t) * (size_t)n), "rank %d: all_reduce bits differ from rank 0's", r);
    /* async */
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)(r + i);
    lk_work *w = NULL;
    CHECK_OK(lk_comm_all_reduce_async(c, v, 1000, LK_F32, LK_REDUCE_SUM, &w));
    CHECK_OK(lk_work_wait(w));
    lk_work_free(w);
    CHECK(v[5] == (float)(W * 5 + W * (W - 1) / 2));
    lk_comm_free(c);
}

static void desync_under_mpirun(void) {
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "mpi";
    cfg.timeout_s = 30;
    lk_comm *c = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    if (!c) return;
    int r = lk_comm_rank(c);
    /* different counts */
    float d[8] = {0};
    CHECK_ERR(lk_comm_all_reduce(c, d, r == 0 ? 8 : 7, LK_F32, LK_REDUCE_SUM), LK_STATUS_INVALID_USAGE, "desync");
    CHECK_ERR(lk_comm_barrier(c), LK_STATUS_ABORTED, "already failed");
    lk_comm_free(c);
}

static lk_comm *mpi_comm_for_test(double timeout) {
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "mpi";
    cfg.timeout_s = timeout;
    lk_comm *c = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    return c;
}

static void groups_under_mpirun(void) {
    lk_comm *c = mpi_comm_for_test(30);
    if (!c) return;
    CHECK(lk_comm_world_size(c) == 4);
    CHECK(gc_mesh(c) == 0);
    CHECK(gc_exchange(c) == 0);
    CHECK(gc_split(c) == 0);
    lk_comm_free(c);
}

/* Each failure ends the communicator, so each gets its own. */
static void p2p_faults_under_mpirun(void) {
    lk_comm *c = mpi_comm_for_test(1.0);
    if (!c) return;
    int r = lk_comm_rank(c);
    float buf[100] = {0};
    /* a receive of another size: the receiver names both sides at once */
    if (r == 0) (void)lk_comm_send(c, buf, 100, LK_F32, 1); /* eager: may complete before rank 1 looks */
    else
        CHECK_ERR(lk_comm_recv(c, buf, 50, LK_F32, 0), LK_STATUS_INVALID_USAGE,
                  "on the pair rank 0 -> rank 1, message #1: rank 0 sends f32 x 100 (400 bytes), rank 1 receives f32 x 50");
    lk_comm_free(c);
    c = mpi_comm_for_test(1.0);
    if (!c) return;
    /* a send whose receive never comes: rank 1 only sleeps past the timeout */
    if (r == 0)
        CHECK_ERR(lk_comm_send(c, buf, 10, LK_F32, 1), LK_STATUS_TIMEOUT,
                  "send #1 from rank 0 to rank 1 (f32 x 10) timed out after");
    else
        sleep(2);
    lk_comm_free(c);
    /* The first rank to exit aborts the job (its communicators failed), which
     * can kill the other before lk_t_run prints its summary: so each rank
     * prints its checks' result here, and the barrier after it means both
     * lines are out before either rank exits (the script reads these). */
    c = mpi_comm_for_test(30);
    printf("p2pfault: rank %d: %d failed checks\n", r, lk_t_failed_checks + !c);
    fflush(stdout);
    if (c) CHECK_OK(lk_comm_barrier(c));
    lk_comm_free(c);
}

/* A rank killed mid-send (2 ranks, run by test_mpi_fault.sh, which
 * SIGKILLs rank 0 once "p2pkill: traffic flowing" is printed): rank 0 sends
 * 1 MiB messages to rank 1 until it is killed (at most 60 s: bounded by
 * time, not by a count that a fast machine finishes before the kill), and
 * rank 1, receiving, must fail naming the pair and the dead rank. Rank 1
 * ignores mpirun's SIGTERM (SIGKILL follows a second later) so that it can
 * report; it prints the wall clock time of the failure for the script to
 * compare with the kill's. */
static void p2p_kill_under_mpirun(void) {
    lk_comm *c = mpi_comm_for_test(10.0);
    if (!c) return;
    int r = lk_comm_rank(c);
    enum { N = 1 << 18 };
    static float buf[N];
    double t0 = lk_time_now();
    if (r == 0) {
        while (lk_time_now() - t0 < 60 && !lk_comm_send(c, buf, N, LK_F32, 1)) {
        }
        CHECK_MSG(false, "rank 0 was not killed within 60 s: %s", lk_last_error());
        lk_comm_free(c);
        return;
    }
    signal(SIGTERM, SIG_IGN);
    lk_status st = LK_STATUS_OK;
    for (long k = 0; !st && lk_time_now() - t0 < 60; k++) {
        st = lk_comm_recv(c, buf, N, LK_F32, 0);
        if (k == 20) printf("p2pkill: traffic flowing\n"), fflush(stdout);
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    CHECK_MSG(st == LK_STATUS_REMOTE, "rank 1: status %d: %s", st, st ? lk_last_error() : "no failure within 60 s");
    CHECK_MSG(st && strstr(lk_last_error(), "from rank 0") && strstr(lk_last_error(), "rank 0 (pid") &&
                  strstr(lk_last_error(), "died"),
              "rank 1's message: %s", lk_last_error());
    printf("p2pkill: rank 1 failed at %lld.%09ld: %s\n", (long long)now.tv_sec, now.tv_nsec, lk_last_error());
    fflush(stdout);
    lk_comm_free(c);
}

/* A rank that dies inside lk_comm_split, after the ranks agreed on the
 * groups and before MPI_Comm_split (LK_COMM_TEST_SPLIT_KILL=1, set by
 * test_mpi_fault.sh; 2 ranks): rank 0 must fail naming it, not sit in the
 * blocking MPI_Comm_split until mpirun kills it. Rank 0 ignores mpirun's
 * SIGTERM so that it can report. */
static void split_kill_under_mpirun(void) {
    lk_comm *c = mpi_comm_for_test(10.0);
    if (!c) return;
    if (lk_comm_rank(c) == 0) signal(SIGTERM, SIG_IGN);
    lk_comm *g = NULL;
    double t0 = lk_time_now();
    CHECK_ERR(lk_comm_split(c, 0, 0, &g), LK_STATUS_REMOTE, "rank 1 (pid");
    CHECK_MSG(strstr(lk_last_error(), "lk_comm_split (the ranks' arrival before MPI_Comm_split) failed") &&
                  strstr(lk_last_error(), "died"),
              "rank 0's message: %s", lk_last_error());
    CHECK_MSG(lk_time_now() - t0 < 5, "rank 0 noticed after %.2f s", lk_time_now() - t0);
    printf("splitkill: rank 0 after %.2f s: %s\n", lk_time_now() - t0, lk_last_error());
    fflush(stdout);
    lk_comm_free(g);
    lk_comm_free(c);
}

int main(int argc, char **argv) {
    if (argc > 1) backend = argv[1];
    if (!strcmp(backend, "group")) {
        static const lk_t_case cases[] = {LK_TEST_CASE(groups_under_mpirun)};
        return lk_t_run(cases, 1, 1, argv);
    }
    if (!strcmp(backend, "p2pfault")) {
        static const lk_t_case cases[] = {LK_TEST_CASE(p2p_faults_under_mpirun)};
        return lk_t_run(cases, 1, 1, argv);
    }
    if (!strcmp(backend, "p2pkill")) {
        static const lk_t_case cases[] = {LK_TEST_CASE(p2p_kill_under_mpirun)};
        return lk_t_run(cases, 1, 1, argv);
    }
    if (!strcmp(backend, "splitkill")) {
        static const lk_t_case cases[] = {LK_TEST_CASE(split_kill_under_mpirun)};
        return lk_t_run(cases, 1, 1, argv);
    }
    if (!strcmp(backend, "desync")) {
        static const lk_t_case cases[] = {LK_TEST_CASE(desync_under_mpirun)};
        return lk_t_run(cases, 1, 1, argv);
    }
    if (!strcmp(backend, "shm")) {
        lk_pg_info pg;
        if (lk_pg_info_from_env(&pg) || strcmp(pg.source, "openmpi") || !pg.job_id[0]) {
            fprintf(stderr, "process group from OpenMPI: %s (%s, job '%s')\n", lk_last_error(), pg.source, pg.job_id);
            return 1;
        }
    }
    static const lk_t_case cases[] = {LK_TEST_CASE(matrix_under_mpirun)};
    return lk_t_run(cases, 1, 1, argv);
}
