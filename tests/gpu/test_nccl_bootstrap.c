/* The NCCL unique-id bootstrap without a GPU: bytes from rank 0 to every
 * rank through a fake transport (ranks run one after another; the fake
 * keeps rank 0's bytes), rank 0 failing to make an id (peers fail at once
 * quoting it), a failing transport, bytes that are not a bootstrap record,
 * and the real path: two processes broadcasting through the shm
 * communicator. With NCCL built, asking for the nccl backend on a machine
 * without a GPU is a clear error. */
#include <sys/wait.h>
#include <unistd.h>

#include "comm/nccl_boot.h"
#include "device/gpu.h"
#include "lk_test.h"

typedef struct {
    int rank;        /* the rank calling now */
    unsigned char stored[1024];
    size_t len;
    int fail_rank;   /* this rank's broadcast fails (-1: none) */
    bool corrupt;    /* receivers get the first byte flipped */
    int makes;       /* make_id calls */
    bool make_fails;
} fake;

static lk_status fake_bcast(void *ctx, void *buf, size_t bytes, int root) {
    fake *f = ctx;
    if (f->rank == f->fail_rank) return lk_error(LK_STATUS_TIMEOUT, "fake: no answer from rank %d within 1 s", root);
    if (f->rank == root) {
        memcpy(f->stored, buf, bytes);
        f->len = bytes;
    } else {
        if (f->len != bytes) return lk_error(LK_STATUS_INTERNAL, "fake: %zu bytes asked, %zu sent", bytes, f->len);
        memcpy(buf, f->stored, bytes);
        if (f->corrupt) ((unsigned char *)buf)[0] ^= 0xff;
    }
    return LK_STATUS_OK;
}

static lk_status fake_make(void *ctx, unsigned char id[LK__NCCL_ID_BYTES]) {
    fake *f = ctx;
    f->makes++;
    if (f->make_fails) return lk_error(LK_STATUS_DEVICE, "ncclGetUniqueId: unhandled system error (fake)");
    for (int i = 0; i < LK__NCCL_ID_BYTES; i++) id[i] = (unsigned char)(i * 31 + 7);
    return LK_STATUS_OK;
}

static void all_ranks_get_rank0s_id(void) {
    fake f = {.fail_rank = -1};
    lk__nccl_transport t = {&f, fake_bcast};
    unsigned char ids[4][LK__NCCL_ID_BYTES];
    memset(ids, 0, sizeof ids);
    for (int r = 0; r < 4; r++) {
        f.rank = r;
        CHECK_OK(lk__nccl_bootstrap(&t, r, fake_make, &f, ids[r]));
    }
    CHECK(f.makes == 1); /* only rank 0 makes an id */
    for (int r = 1; r < 4; r++) CHECK(memcmp(ids[0], ids[r], LK__NCCL_ID_BYTES) == 0);
    CHECK(ids[0][1] == 38);
}

static void rank0_failure_reaches_peers(void) {
    fake f = {.fail_rank = -1, .make_fails = true};
    lk__nccl_transport t = {&f, fake_bcast};
    unsigned char id[LK__NCCL_ID_BYTES];
    f.rank = 0;
    CHECK_ERR(lk__nccl_bootstrap(&t, 0, fake_make, &f, id), LK_STATUS_DEVICE,
              "rank 0 could not create the NCCL unique id: ncclGetUniqueId: unhandled system error");
    f.rank = 1;
    CHECK_ERR(lk__nccl_bootstrap(&t, 1, fake_make, &f, id), LK_STATUS_REMOTE,
              "NCCL id bootstrap: rank 0 could not create the NCCL unique id: ncclGetUniqueId: unhandled system error");
}

static void transport_failure_and_garbage(void) {
    fake f = {.fail_rank = 2};
    lk__nccl_transport t = {&f, fake_bcast};
    unsigned char id[LK__NCCL_ID_BYTES];
    f.rank = 0;
    CHECK_OK(lk__nccl_bootstrap(&t, 0, fake_make, &f, id));
    f.rank = 2;
    CHECK_ERR(lk__nccl_bootstrap(&t, 2, fake_make, &f, id), LK_STATUS_TIMEOUT,
              "NCCL id bootstrap: broadcast from rank 0 failed on rank 2: fake: no answer from rank 0");
    f.rank = 1;
    f.corrupt = true;
    CHECK_ERR(lk__nccl_bootstrap(&t, 1, fake_make, &f, id), LK_STATUS_INVALID_USAGE, "that are not an NCCL id record");
}

/* The real transport: two processes, the shm communicator's broadcast. */
static lk_status comm_bcast(void *ctx, void *buf, size_t bytes, int root) {
    return lk_comm_broadcast(ctx, buf, bytes, LK_U8, root);
}

static int boot_rank(int rank, const char *job, unsigned char id[LK__NCCL_ID_BYTES]) {
    lk_pg_info pg = {.rank = rank, .world_size = 2, .local_rank = rank, .local_world_size = 2, .num_nodes = 1,
                     .source = "none"};
    snprintf(pg.job_id, sizeof pg.job_id, "%s", job);
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "shm";
    cfg.pg = &pg;
    cfg.timeout_s = 20;
    cfg.shared_bytes = 1 << 20;
    lk_comm *c = NULL;
    if (lk_comm_create(&cfg, &c)) return fprintf(stderr, "rank %d: %s\n", rank, lk_last_error()), 1;
    fake f = {.fail_rank = -1};
    lk__nccl_transport t = {c, comm_bcast};
    lk_status st = lk__nccl_bootstrap(&t, rank, fake_make, &f, id);
    if (st) fprintf(stderr, "rank %d: %s\n", rank, lk_last_error());
    lk_comm_free(c);
    return st ? 1 : 0;
}

static void through_shm(void) {
    char job[64];
    snprintf(job, sizeof job, "ncclboot-%d", (int)getpid());
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        unsigned char id[LK__NCCL_ID_BYTES];
        int rc = boot_rank(1, job, id);
        if (!rc && write(fd[1], id, sizeof id) != (ssize_t)sizeof id) rc = 1;
        _exit(rc);
    }
    close(fd[1]);
    unsigned char id0[LK__NCCL_ID_BYTES], id1[LK__NCCL_ID_BYTES];
    CHECK(boot_rank(0, job, id0) == 0);
    CHECK(read(fd[0], id1, sizeof id1) == (ssize_t)sizeof id1);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(memcmp(id0, id1, sizeof id0) == 0);
}

static void nccl_needs_a_gpu(void) {
    bool built = false;
    for (int i = 0; i < lk_comm_backend_count(); i++) built |= !strcmp(lk_comm_backend_name_at(i), "nccl");
    if (!built || lk__cuda_visible() > 0) {
        printf("%s: the no-GPU refusal is not testable here, skipped\n", built ? "a GPU is visible" : "built without NCCL");
        return;
    }
    lk_pg_info pg = {.rank = 0, .world_size = 1, .local_rank = 0, .local_world_size = 1, .num_nodes = 1, .source = "none"};
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "nccl";
    cfg.pg = &pg;
    lk_comm *c = (lk_comm *)1;
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_UNSUPPORTED, "backend 'nccl' needs a CUDA device on every rank");
    CHECK(c == NULL);
}

LK_TEST_MAIN(LK_TEST_CASE(all_ranks_get_rank0s_id), LK_TEST_CASE(rank0_failure_reaches_peers),
             LK_TEST_CASE(transport_failure_and_garbage), LK_TEST_CASE(through_shm), LK_TEST_CASE(nccl_needs_a_gpu))
