/* SyncBatchNorm over a communicator against PyTorch 1.13
 * (tools/gen_syncbn_fixtures.py writes tests/fixtures/syncbn/: BatchNorm on
 * the whole batch, which is what torch's SyncBatchNorm computes over the
 * ranks' batches together). Forked ranks hold rows 4/4 (2 ranks) and 4/3/1
 * (3 ranks: the rank of one row has a single value per channel) of the
 * fixture's batch, with BatchNorm1d on [8, 5] and BatchNorm2d on
 * [8, 3, 4, 4] whose mean (6) is large next to its deviation (0.5); one
 * training forward and backward of sum(y * k) each: a rank's output and
 * input gradient are torch's rows, the weight and bias gradients summed
 * over the ranks torch's (the whole loss's), the running statistics torch's
 * on every rank. Tolerance 1e-5 relative to 1 + |value|: f32 sums in another
 * order than torch's (measured: 1.2e-6, printed per rank). */
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"
#include "npy.h"

#define SB_DIR LK_SOURCE_DIR "/tests/fixtures/syncbn"
enum { MAXW = 3 };

/* SyncBatchNorm over comm, as the trainer sets it (NULL: off). */
static int sync_over(lk_layer *l, lk_comm *c) {
    lk_bn_reducer r;
    lk_comm_bn_reducer(c, &r);
    return lk_layer_sync_batchnorm_reducer(l, &r);
}

static lk_tensor *fx(const char *prefix, const char *name) {
    char path[512];
    snprintf(path, sizeof path, SB_DIR "/%s.%s.npy", prefix, name);
    lk_tensor *t = NULL;
    if (lk_npy_load(path, &t)) fprintf(stderr, "fixture %s: %s\n", path, lk_last_error());
    return t;
}

/* Largest |a - b| / (1 + |b|) over n floats. */
static double diff(const float *a, const float *b, int64_t n) {
    double d = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (1.0 + fabs((double)b[i]));
        if (!(e <= d)) d = e;
    }
    return d;
}

static int check(const char *what, int rank, double d, double *worst) {
    if (d > *worst || isnan(d)) *worst = d;
    if (d <= 1e-5) return 0;
    fprintf(stderr, "rank %d: %s differs from torch by %.3g\n", rank, what, d);
    return 1;
}

static int one_case(const char *p, int world, const int *rows, int rank, lk_comm *comm, double *worst) {
    lk_tensor *x = fx(p, "x"), *k = fx(p, "k"), *y = fx(p, "y"), *dx = fx(p, "dx"), *gw = fx(p, "g.weight"),
              *gb = fx(p, "g.bias"), *rm = fx(p, "s.running_mean"), *rv = fx(p, "s.running_var");
    if (!x || !k || !y || !dx || !gw || !gb || !rm || !rv) return 1;
    int64_t C = x->shape[1], per = x->numel / x->shape[0];
    lk_layer *bn = x->ndim == 4 ? lk_batch_norm2d_create(C, 1e-5f, 0.1f, true, true)
                                : lk_batch_norm1d_create(C, 1e-5f, 0.1f, true, true);
    static const char *const init[] = {"weight", "bias", "running_mean", "running_var"};
    for (int i = 0; i < 4; i++) {
        char n[32];
        snprintf(n, sizeof n, "w.%s", init[i]);
        lk_tensor *w = fx(p, n);
        if (!w) return 1;
        memcpy(lk_layer_get_tensor(bn, init[i])->data, w->data, (size_t)C * sizeof(float));
        lk_tensor_release(w);
    }
    if (sync_over(bn, comm) != 1) return fprintf(stderr, "no batch norm set\n"), 1;
    int r0 = 0;
    for (int r = 0; r < rank; r++) r0 += rows[r];
    int n = rows[rank], bad = 0;
    (void)world;
    int64_t shape[4] = {n, x->shape[1], x->ndim == 4 ? x->shape[2] : 1, x->ndim == 4 ? x->shape[3] : 1};
    lk_scope_begin();
    lk_tensor *xr = lk_scope_adopt(lk_tensor_from_data(LK_F32, x->ndim, shape, (float *)x->data + r0 * per));
    lk_tensor *kr = lk_scope_adopt(lk_tensor_from_data(LK_F32, x->ndim, shape, (float *)k->data + r0 * per));
    lk_tensor_set_requires_grad(xr, true);
    lk_tensor *yr = lk_layer_forward(bn, xr);
    lk_status st = yr ? lk_backward(lk_sum(lk_mul(yr, kr), NULL, 0, false)) : lk_last_status();
    if (st) bad = (fprintf(stderr, "rank %d %s: %s\n", rank, p, lk_last_error()), 1);
    if (!bad) {
        char what[64];
        snprintf(what, sizeof what, "%s output", p);
        bad += check(what, rank, diff(yr->data, (float *)y->data + r0 * per, n * per), worst);
        snprintf(what, sizeof what, "%s input gradient", p);
        bad += check(what, rank, diff(xr->grad->data, (float *)dx->data + r0 * per, n * per), worst);
        lk_tensor *w = lk_layer_get_tensor(bn, "weight"), *b = lk_layer_get_tensor(bn, "bias");
        if (lk_comm_all_reduce(comm, w->grad->data, (size_t)C, LK_F32, LK_REDUCE_SUM) ||
            lk_comm_all_reduce(comm, b->grad->data, (size_t)C, LK_F32, LK_REDUCE_SUM))
            return fprintf(stderr, "all_reduce: %s\n", lk_last_error()), 1;
        snprintf(what, sizeof what, "%s weight gradient (summed)", p);
        bad += check(what, rank, diff(w->grad->data, gw->data, C), worst);
        snprintf(what, sizeof what, "%s bias gradient (summed)", p);
        bad += check(what, rank, diff(b->grad->data, gb->data, C), worst);
        snprintf(what, sizeof what, "%s running_mean", p);
        bad += check(what, rank, diff(lk_layer_get_tensor(bn, "running_mean")->data, rm->data, C), worst);
        snprintf(what, sizeof what, "%s running_var", p);
        bad += check(what, rank, diff(lk_layer_get_tensor(bn, "running_var")->data, rv->data, C), worst);
    }
    lk_scope_end();
    lk_layer_free(bn);
    lk_tensor *all[] = {x, k, y, dx, gw, gb, rm, rv};
    for (int i = 0; i < 8; i++) lk_tensor_release(all[i]);
    return bad;
}

static int run_world(int world, const int *rows) {
    char job[64];
    snprintf(job, sizeof job, "lktest-syncbn-torch-%d-%d", world, (int)getpid());
    pid_t pids[MAXW];
    fflush(stdout); /* the children would print it again */
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", world);
            setenv("WORLD_SIZE", buf, 1);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            setenv("LK_JOB_ID", job, 1);
            lk_comm_config cc = lk_comm_config_default();
            cc.timeout_s = 30; /* a rank that fails alone leaves the others a bounded wait */
            lk_comm *comm = NULL;
            if (lk_comm_create(&cc, &comm)) {
                fprintf(stderr, "rank %d: comm: %s\n", r, lk_last_error());
                _exit(1);
            }
            double worst = 0;
            int bad = one_case("bn1d", world, rows, r, comm, &worst) + one_case("bn2d", world, rows, r, comm, &worst);
            if (!bad) printf("rank %d of %d: largest difference from torch %.3g\n", r, world, worst);
            lk_comm_free(comm);
            fflush(stdout);
            _exit(bad ? 1 : 0);
        }
    }
    int failed = 0;
    for (int r = 0; r < world; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

static void two_ranks_even(void) {
    int failed = run_world(2, (const int[]){4, 4});
    CHECK_MSG(failed == 0, "%d of 2 ranks differ from torch", failed);
}

static void three_ranks_4_3_1(void) {
    int failed = run_world(3, (const int[]){4, 3, 1});
    CHECK_MSG(failed == 0, "%d of 3 ranks differ from torch", failed);
}

LK_TEST_MAIN(LK_TEST_CASE(two_ranks_even), LK_TEST_CASE(three_ranks_4_3_1))
