/* The nccl communicator on one GPU, one rank (NCCL refuses two ranks on one
 * GPU): creation through the id bootstrap, all_reduce (sum, avg, max) and
 * broadcast on device memory, all_gather, barrier, and a clean free.
 * Multi-rank runs need a machine with several GPUs (docs/GPU.md). */
#include <unistd.h>

#include "gpu_test.h"
#include "lk_test.h"

static void one_rank(void) {
    bool built = false;
    for (int i = 0; i < lk_comm_backend_count(); i++) built |= !strcmp(lk_comm_backend_name_at(i), "nccl");
    if (!built) {
        printf("built without NCCL: nothing to test\n");
        return;
    }
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
    lk_device_free(g, d, sizeof h);
    lk_device_free(g, all, sizeof h);
    lk_comm_free(c);
}

int main(int argc, char **argv) {
    gpu_test_require();
    static const lk_t_case cases[] = {LK_TEST_CASE(one_rank)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
