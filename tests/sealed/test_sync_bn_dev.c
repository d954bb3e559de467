/* SyncBatchNorm over a communicator on a device the host may not read
 * (sealed:<rank>), two forked ranks, one forward and backward of
 * Conv2d -> BatchNorm2d -> ReLU -> Conv2d 1x1 each:
 *  - over the device-reading test communicator (tests/sealed_comm.h,
 *    nccl's shape): the batch norm hands it its device buffer, one f64
 *    all-reduce of device memory in the forward and one in the backward,
 *    no host collective, and no copy between the device and the host in
 *    the whole forward and backward (the per-channel finish runs on the
 *    device: LK_OP_BN_FINISH);
 *  - over shm (host memory only): the sums travel through a host copy, out
 *    and back once per pass, the device-reading communicator sees nothing;
 * and both give the bits of the same ranks on the CPU over shm: output,
 * running statistics, every gradient. */
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"
#include "sealed_comm.h"

enum { N = 3, CI = 2, C = 3, K = 2, HW = 5, WORLD = 2 };

/* SyncBatchNorm over comm, as the trainer sets it (NULL: off). */
static int sync_over(lk_layer *l, lk_comm *c) {
    lk_bn_reducer r;
    lk_comm_bn_reducer(c, &r);
    return lk_layer_sync_batchnorm_reducer(l, &r);
}

static lk_layer *make_net(void) {
    lk_rng r;
    lk_rng_init(&r, 7, LK_RNG_INIT, 0, 0);
    lk_conv2d_params p = LK_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    lk_layer *v[4] = {lk_conv2d_create(CI, C, 3, 3, p, true, &r), lk_batch_norm2d_create(C, 1e-5f, 0.1f, true, true),
                      lk_relu_create(), lk_conv2d_create(C, K, 1, 1, LK_CONV2D_DEFAULT, true, &r)};
    return lk_sequential_create(4, v);
}

/* What a run leaves: the output and the state and gradients, on the host. */
enum { MAXV = 4096 };
typedef struct {
    float v[MAXV];
    int n;
    long fwd_dev, fwd_host, bwd_dev, bwd_host; /* the device-reading communicator's collectives */
    long fwd_out, fwd_in, bwd_out, bwd_in; /* the device's copies to and from the host */
    unsigned dtypes;
} result;

static void keep(result *res, lk_tensor *t) {
    lk_tensor *h = t ? lk_tensor_to(t, LK_DEVICE_CPU) : NULL;
    lk_tensor *f = h ? lk_tensor_cast(h, LK_F32) : NULL;
    for (int64_t i = 0; f && i < f->numel && res->n < MAXV; i++) res->v[res->n++] = ((float *)f->data)[i];
    if (!f) res->n = -1000000;
    lk_tensor_release(h);
    lk_tensor_release(f);
}

static int run(lk_device dev, lk_comm *comm, int rank, result *res) {
    *res = (result){.n = 0};
    lk_layer *net = make_net();
    if (!net || lk_layer_to(net, dev)) return fprintf(stderr, "net: %s\n", lk_last_error()), 1;
    if (sync_over(net, comm) != 1) return fprintf(stderr, "no batch norm set\n"), 1;
    float x[N * CI * HW * HW], t[N * K * HW * HW];
    lk_rng g;
    lk_rng_init(&g, 21 + (uint64_t)rank, LK_RNG_DATA, 0, 0);
    for (int i = 0; i < N * CI * HW * HW; i++) x[i] = 2.0f * lk_rng_normal(&g) - 0.5f;
    for (int i = 0; i < N * K * HW * HW; i++) t[i] = lk_rng_normal(&g);
    lk_scope_begin();
    lk_tensor *xh = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(N, CI, HW, HW), x));
    lk_tensor *th = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(N, K, HW, HW), t));
    lk_tensor *xd = lk_scope_adopt(lk_tensor_to(xh, dev)), *td = lk_scope_adopt(lk_tensor_to(th, dev));
    int rc = 0;
    if (lk_device_set_thread_default(&dev)) rc = 1;
    sealed_comm_stats s0 = sealed_comm_get_stats();
    sealed_stats c0 = sealed_get_stats();
    lk_tensor *y = rc ? NULL : lk_layer_forward(net, xd);
    sealed_comm_stats s1 = sealed_comm_get_stats();
    sealed_stats c1 = sealed_get_stats();
    lk_status st = y ? lk_backward(lk_mse_loss(y, td, LK_REDUCTION_MEAN)) : lk_last_status();
    sealed_comm_stats s2 = sealed_comm_get_stats();
    sealed_stats c2 = sealed_get_stats();
    /* less the test communicator's own copies to its host stand-ins (nccl reads the device buffer itself) */
    res->fwd_out = c1.copies_out - c0.copies_out - (s1.stand_in_out - s0.stand_in_out);
    res->fwd_in = c1.copies_in - c0.copies_in - (s1.stand_in_in - s0.stand_in_in);
    res->bwd_out = c2.copies_out - c1.copies_out - (s2.stand_in_out - s1.stand_in_out);
    res->bwd_in = c2.copies_in - c1.copies_in - (s2.stand_in_in - s1.stand_in_in);
    lk_device_set_thread_default(NULL);
    if (st) rc = (fprintf(stderr, "rank %d: %s\n", rank, lk_last_error()), 1);
    res->fwd_dev = s1.dev_all_reduce - s0.dev_all_reduce, res->fwd_host = s1.host_colls - s0.host_colls;
    res->bwd_dev = s2.dev_all_reduce - s1.dev_all_reduce, res->bwd_host = s2.host_colls - s1.host_colls;
    res->dtypes = s2.dev_all_reduce_dtypes;
    if (!rc) {
        keep(res, y);
        lk_named_tensors sd = {0};
        if (lk_state_dict_get(net, &sd)) rc = 1;
        for (int i = 0; !rc && i < sd.n; i++) {
            lk_tensor *tt = sd.items[i].tensor;
            if (tt->dtype == LK_F32) keep(res, tt);
            if (tt->grad) keep(res, tt->grad);
        }
        lk_named_tensors_clear(&sd);
    }
    lk_scope_end();
    lk_layer_free(net);
    return rc;
}

static int same(const char *what, int rank, const result *a, const result *b) {
    if (a->n <= 0 || a->n != b->n) return fprintf(stderr, "rank %d %s: %d values, the CPU's %d\n", rank, what, a->n, b->n), 1;
    for (int i = 0; i < a->n; i++)
        if (memcmp(&a->v[i], &b->v[i], sizeof(float)))
            return fprintf(stderr, "rank %d %s: value %d is %.9g, on the CPU %.9g\n", rank, what, i, a->v[i], b->v[i]), 1;
    return 0;
}

static lk_comm *open_comm(const char *backend, const char *job) {
    lk_comm_config cc = lk_comm_config_default();
    cc.backend = backend;
    cc.job_id = job;
    cc.timeout_s = 30; /* a rank that fails alone leaves the other a bounded wait */
    lk_comm *c = NULL;
    if (lk_comm_create(&cc, &c)) fprintf(stderr, "%s communicator: %s\n", backend, lk_last_error());
    return c;
}

static int rank_main(int rank, const char *job) {
    sealed_comm_register();
    char j1[128], j2[128];
    snprintf(j1, sizeof j1, "%s-shm", job);
    snprintf(j2, sizeof j2, "%s-dev", job);
    lk_comm *shm = open_comm("shm", j1), *devc = open_comm("sealed_nccl", j2);
    if (!shm || !devc) return 1;
    static result cpu, on_dev, staged;
    lk_device sd = sealed_device(rank);
    int bad = run(LK_DEVICE_CPU, shm, rank, &cpu) || run(sd, devc, rank, &on_dev) || run(sd, shm, rank, &staged);
    if (!bad) {
        bad += same("sealed over the device-reading communicator", rank, &on_dev, &cpu);
        bad += same("sealed over shm (staged)", rank, &staged, &cpu);
        if (on_dev.fwd_dev != 1 || on_dev.fwd_host != 0 || on_dev.bwd_dev != 1 || on_dev.bwd_host != 0)
            bad++, fprintf(stderr, "rank %d: forward %ld device all-reduces and %ld host collectives, backward %ld and %ld "
                           "(expected 1 and 0 each way)\n", rank, on_dev.fwd_dev, on_dev.fwd_host, on_dev.bwd_dev,
                           on_dev.bwd_host);
        if (on_dev.fwd_out || on_dev.fwd_in || on_dev.bwd_out || on_dev.bwd_in)
            bad++, fprintf(stderr, "rank %d: over the device-reading communicator the forward copied %ld times to the "
                           "host and %ld to the device, the backward %ld and %ld (expected none)\n", rank, on_dev.fwd_out,
                           on_dev.fwd_in, on_dev.bwd_out, on_dev.bwd_in);
        if (staged.fwd_out != 1 || staged.fwd_in != 1 || staged.bwd_out != 1 || staged.bwd_in != 1)
            bad++, fprintf(stderr, "rank %d: staged over shm the forward copied %ld times to the host and %ld to the "
                           "device, the backward %ld and %ld (expected 1 each: the sums out and back)\n", rank,
                           staged.fwd_out, staged.fwd_in, staged.bwd_out, staged.bwd_in);
        if (on_dev.dtypes != 1u << LK_F64) bad++, fprintf(stderr, "rank %d: device all-reduce dtypes 0x%x\n", rank, on_dev.dtypes);
        if (staged.fwd_dev || staged.fwd_host || staged.bwd_dev || staged.bwd_host)
            bad++, fprintf(stderr, "rank %d: the staged run used the device-reading communicator\n", rank);
        if (rank == 0 && !bad)
            printf("ok   sealed:%d over a device-reading communicator: 1 f64 all-reduce of device memory forward, 1 "
                   "backward, no copy to or from the host; staged over shm: the sums out and back once per pass; "
                   "both the CPU's bits (%d values)\n", rank, cpu.n);
    }
    lk_comm_free(devc);
    lk_comm_free(shm);
    return bad ? 1 : 0;
}

static void device_buffers_one_collective_each_way(void) {
    char job[64];
    snprintf(job, sizeof job, "lktest-syncbn-dev-%d", (int)getpid());
    pid_t pids[WORLD];
    fflush(stdout); /* the children would print it again */
    for (int r = 0; r < WORLD; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", WORLD);
            setenv("WORLD_SIZE", buf, 1);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            setenv("LK_JOB_ID", job, 1);
            int rc = rank_main(r, job);
            fflush(stdout);
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < WORLD; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CHECK_MSG(failed == 0, "%d of %d ranks failed", failed, WORLD);
}

LK_TEST_MAIN(LK_TEST_CASE(device_buffers_one_collective_each_way))
