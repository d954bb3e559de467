/* dist, multi-process: process groups and point-to-point on the shm
 * communicator (forked ranks). A 2 x 2 mesh all-reducing in its
 * data-parallel groups while its stages send to each other; a split of a
 * split and negative colours; async exchanges; and the failures, each
 * named per pair: a rank killed mid-send (the job ends within 5 s), a send
 * whose receive never comes (at a 1 s timeout), a receive of another size
 * and of another dtype (at once, on both ranks), argument errors, and a
 * group's segment maker killed inside the group's rendezvous (no segment
 * left in /dev/shm). */
#include <signal.h>

#include "comm/dist_util.h"
#include "comm/group_check.h"

static int mesh_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 30, &c)) {
        fprintf(stderr, "rank %d: %s\n", r, lk_last_error());
        return 1;
    }
    int errors = gc_mesh(c) + gc_exchange(c) + gc_split(c);
    lk_comm_free(c);
    return errors != 0;
}

static void mesh_2x2_and_splits(void) {
    du_map();
    int codes[DU_MAXW] = {0};
    int ok = du_run(4, mesh_rank, NULL, 90, codes, NULL);
    CHECK_MSG(ok == 4, "%d of 4 ranks passed (exit codes %d %d %d %d)", ok, codes[0], codes[1], codes[2], codes[3]);
    CHECK(!du_segment_exists(du_job));
}

/* ---- failures ---- */
enum { F_KILL, F_NO_RECV, F_SIZE, F_DTYPE };

static int fault_rank(int r, int W, void *arg) {
    int mode = (int)(intptr_t)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", mode == F_KILL ? 30 : 1.0, &c)) {
        snprintf(du->msg[r], sizeof du->msg[r], "%s", lk_last_error());
        return 1;
    }
    static float buf[1 << 20]; /* 4 MiB: several mailbox chunks */
    lk_status st = LK_STATUS_OK;
    if (mode == F_KILL) {
        /* Both sides loop until the kill (bounded by time, not by a count: a
         * fast machine moved 1000 x 4 MiB before the parent's 0.2 s sleep
         * ended, and the test then saw two clean exits). */
        double t0 = lk_time_now();
        if (r == 0) {
            du->ready[0] = 1;
            while (!st && lk_time_now() - t0 < 20) st = lk_comm_send(c, buf, 1 << 20, LK_F32, 1); /* killed inside */
        } else {
            while (!du->ready[0]) usleep(1000);
            while (!st && lk_time_now() - t0 < 20) st = lk_comm_recv(c, buf, 1 << 20, LK_F32, 0);
        }
    } else if (mode == F_NO_RECV) {
        if (r == 0) st = lk_comm_send(c, buf, 10, LK_F32, 1);
        else sleep(3); /* alive, but never receives */
    } else {
        lk_dtype dt = mode == F_DTYPE && r == 1 ? LK_I32 : LK_F32;
        size_t n = mode == F_SIZE && r == 1 ? 50 : 100;
        /* one good message first, so the mismatch is message #2 */
        st = r == 0 ? lk_comm_send(c, buf, 3, LK_F32, 1) : lk_comm_recv(c, buf, 3, LK_F32, 0);
        if (!st) st = r == 0 ? lk_comm_send(c, buf, 100, LK_F32, 1) : lk_comm_recv(c, buf, n, dt, 0);
    }
    du->status[r] = st;
    du->t[r] = lk_time_now();
    snprintf(du->msg[r], sizeof du->msg[r], "%s", st ? lk_last_error() : "");
    lk_comm_free(c);
    return st != 0;
}

static void killed_mid_send(void) {
    du_map();
    int pid[DU_MAXW], codes[DU_MAXW] = {0};
    du_start(2, fault_rank, (void *)(intptr_t)F_KILL, pid);
    while (!du->ready[0]) usleep(1000);
    usleep(200000);
    double t_kill = lk_time_now();
    kill(pid[0], SIGKILL);
    du_wait(2, pid, 20, codes);
    CHECK(codes[0] == 128 + SIGKILL);
    CHECK(codes[1] == 1);
    CHECK_MSG(du->status[1] == LK_STATUS_REMOTE, "rank 1: status %d: %s", du->status[1], du->msg[1]);
    CHECK_MSG(strstr(du->msg[1], "from rank 0") && strstr(du->msg[1], "rank 0 (pid") && strstr(du->msg[1], "died"),
              "rank 1's message: %s", du->msg[1]);
    CHECK_MSG(du->t[1] - t_kill < 5.0, "rank 1 noticed after %.2f s", du->t[1] - t_kill);
    printf("killed mid-send: rank 1 after %.2f s: %s\n", du->t[1] - t_kill, du->msg[1]);
}

static void send_without_receive(void) {
    du_map();
    int codes[DU_MAXW] = {0};
    du_run(2, fault_rank, (void *)(intptr_t)F_NO_RECV, 20, codes, NULL);
    CHECK_MSG(du->status[0] == LK_STATUS_TIMEOUT, "rank 0: status %d: %s", du->status[0], du->msg[0]);
    CHECK_MSG(strstr(du->msg[0], "send #1 from rank 0 to rank 1 (f32 x 10) timed out") &&
                  strstr(du->msg[0], "has not posted recv #1 from rank 0"),
              "rank 0's message: %s", du->msg[0]);
    printf("send without receive: %s\n", du->msg[0]);
}

static void receive_mismatch(void) {
    du_map();
    int codes[DU_MAXW] = {0};
    du_run(2, fault_rank, (void *)(intptr_t)F_SIZE, 20, codes, NULL);
    const char *want = "point-to-point mismatch (desync) on the pair rank 0 -> rank 1, message #2: rank 0 sends f32 x 100 "
                       "(400 bytes), rank 1 receives f32 x 50 (200 bytes)";
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(du->status[r] == LK_STATUS_INVALID_USAGE, "rank %d: status %d: %s", r, du->status[r], du->msg[r]);
        CHECK_MSG(strstr(du->msg[r], want), "rank %d's message: %s", r, du->msg[r]);
    }
    printf("size mismatch: %s\n", du->msg[1]);
    du_run(2, fault_rank, (void *)(intptr_t)F_DTYPE, 20, codes, NULL);
    want = "message #2: rank 0 sends f32 x 100 (400 bytes), rank 1 receives i32 x 100 (400 bytes)";
    for (int r = 0; r < 2; r++) {
        CHECK_MSG(du->status[r] == LK_STATUS_INVALID_USAGE, "rank %d: status %d: %s", r, du->status[r], du->msg[r]);
        CHECK_MSG(strstr(du->msg[r], want), "rank %d's message: %s", r, du->msg[r]);
    }
    /* at once, not at the 1 s timeout */
    CHECK_MSG(du->t[0] > 0 && du->t[1] > 0, "times");
}

/* Ranks 2 and 3 form group 1, whose segment rank 2 makes. Both stop in the
 * group's rendezvous (LK_COMM_TEST_RDV_PAUSE, set after the world
 * communicator exists, so only the group's stops): rank 2 with its slot
 * taken but before it counts itself attached (publish), rank 3 once it
 * has attached and is about to wait for rank 2 (wait). The parent kills
 * rank 2 there and lets rank 3 go on. */
static int group_rdv_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c, *g = NULL;
    if (du_comm(r, W, "shm", 10, &c)) {
        snprintf(du->msg[r], sizeof du->msg[r], "%s", lk_last_error());
        return 1;
    }
    if (r >= 2) setenv("LK_COMM_TEST_RDV_PAUSE", r == 2 ? "publish" : "wait", 1);
    lk_status st = lk_comm_split(c, r / 2, r, &g);
    du->status[r] = st;
    snprintf(du->msg[r], sizeof du->msg[r], "%s", st ? lk_last_error() : "");
    lk_comm_free(g);
    lk_comm_free(c);
    return st != 0;
}

/* A group's maker dies inside the group's rendezvous, after its peer
 * attached: the peer fails naming it and removes the segment, which no one
 * else would (the maker removes it on its own failure or once all attached,
 * and no next job replaces a group's). No /dev/shm entry of the job is left. */
static void killed_in_group_rendezvous(void) {
    du_map();
    int pid[DU_MAXW], codes[DU_MAXW] = {0};
    du_start(4, group_rdv_rank, NULL, pid);
    bool stopped[DU_MAXW] = {false};
    double t_end = lk_time_now() + 20;
    while (!(stopped[2] && stopped[3]) && lk_time_now() < t_end) { /* both paused where they should be */
        for (int r = 2; r < 4; r++) {
            int st;
            if (!stopped[r] && waitpid(pid[r], &st, WNOHANG | WUNTRACED) == pid[r] && WIFSTOPPED(st)) stopped[r] = true;
        }
        usleep(1000);
    }
    CHECK_MSG(stopped[2] && stopped[3], "ranks 2 and 3 did not both stop in the group's rendezvous (%d %d)", stopped[2],
              stopped[3]);
    kill(pid[2], SIGKILL);
    kill(pid[3], SIGCONT);
    du_wait(4, pid, 30, codes);
    CHECK(codes[2] == 128 + SIGKILL);
    CHECK_MSG(du->status[3] == LK_STATUS_REMOTE && strstr(du->msg[3], "rendezvous: rank 0 (pid") &&
                  strstr(du->msg[3], "died while the job was starting"),
              "rank 3: status %d: %s", du->status[3], du->msg[3]);
    for (int r = 0; r < 2; r++) CHECK_MSG(codes[r] == 1, "rank %d: exit %d (%s)", r, codes[r], du->msg[r]);
    char job[160];
    static const char *const sfx[] = {"", ".g1.c0", ".g1.c1"};
    for (int k = 0; k < 3; k++) {
        snprintf(job, sizeof job, "%s%s", du_job, sfx[k]);
        CHECK_MSG(!du_segment_exists(job), "/dev/shm still holds the segment of %s", job);
    }
    printf("killed in the group rendezvous: rank 3: %s\n", du->msg[3]);
}

static int args_rank(int r, int W, void *arg) {
    (void)arg;
    lk_comm *c;
    if (du_comm(r, W, "shm", 10, &c)) return 1;
    int errors = 0;
    float x = 0;
    lk_work *w = (lk_work *)1;
    if (lk_comm_send(c, &x, 1, LK_F32, r) != LK_STATUS_INVALID_ARGUMENT || !strstr(lk_last_error(), "is not another rank"))
        errors++;
    if (lk_comm_recv(c, &x, 1, LK_F32, 5) != LK_STATUS_INVALID_ARGUMENT) errors++;
    if (lk_comm_send_async(c, NULL, 1, LK_F32, 1 - r, &w) != LK_STATUS_INVALID_ARGUMENT || w) errors++;
    if (lk_comm_recv(c, &x, 1, (lk_dtype)99, 1 - r) != LK_STATUS_INVALID_ARGUMENT) errors++;
    lk_comm_mesh_2d mesh;
    if (lk_comm_mesh_2d_create(c, 3, 1, &mesh) != LK_STATUS_INVALID_ARGUMENT || mesh.dp) errors++;
    /* ranks that disagree on the shape are told so, every one */
    if (lk_comm_mesh_2d_create(c, r ? 2 : 1, r ? 1 : 2, &mesh) != LK_STATUS_INVALID_ARGUMENT ||
        !strstr(lk_last_error(), "asked for different meshes"))
        errors++;
    /* still healthy: argument errors do not abort */
    if (lk_comm_barrier(c)) errors++;
    if (errors) fprintf(stderr, "rank %d: %d argument checks failed; last: %s\n", r, errors, lk_last_error());
    lk_comm_free(c);
    return errors != 0;
}

static void argument_errors(void) {
    du_map();
    CHECK(du_run(2, args_rank, NULL, 30, NULL, NULL) == 2);
    /* world 1: the self backend splits into itself; it has no peer to send to */
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "self";
    lk_comm *c = NULL, *g = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    CHECK_OK(lk_comm_split(c, 3, 0, &g));
    CHECK(g && lk_comm_world_size(g) == 1 && !strcmp(lk_comm_backend(g), "self"));
    lk_comm *none = (lk_comm *)1;
    CHECK_OK(lk_comm_split(c, -1, 0, &none));
    CHECK(none == NULL);
    float x = 0;
    CHECK_ERR(lk_comm_send(c, &x, 1, LK_F32, 0), LK_STATUS_UNSUPPORTED, "no point-to-point");
    lk_comm_mesh_2d mesh;
    CHECK_OK(lk_comm_mesh_2d_create(c, 1, 1, &mesh));
    CHECK(mesh.dp && mesh.pp && mesh.dp_rank == 0 && mesh.pp_rank == 0);
    lk_comm_mesh_2d_free(&mesh);
    lk_comm_free(g);
    lk_comm_free(c);
}

LK_TEST_MAIN(LK_TEST_CASE(mesh_2x2_and_splits), LK_TEST_CASE(killed_mid_send), LK_TEST_CASE(send_without_receive),
             LK_TEST_CASE(receive_mismatch), LK_TEST_CASE(argument_errors), LK_TEST_CASE(killed_in_group_rendezvous))
