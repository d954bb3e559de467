/* SyncBatchNorm (trainer.sync_batchnorm): two forked ranks, each with half
 * of a batch and batch norm summed over the communicator, match one process
 * with the whole batch — outputs, running statistics, and (after averaging
 * over ranks, as DDP does) the gradients of the Linear before it and of the
 * batch norm's weight and bias; for BatchNorm2d the input gradient of a rank
 * is that of the sum of both ranks' losses, as in PyTorch. */
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"

enum { N = 8, IN = 5, C = 3, WORLD = 2, H = 3 };

static lk_status comm_sum(void *ctx, double *v, int n) { return lk_comm_all_reduce(ctx, v, (size_t)n, LK_F64, LK_REDUCE_SUM); }

static lk_layer *make_net(void) {
    lk_rng r;
    lk_rng_init(&r, 3, LK_RNG_INIT, 0, 0);
    lk_layer *v[2] = {lk_linear_create(IN, C, true, &r), lk_batch_norm1d_create(C, 1e-5f, 0.1f, true, true)};
    lk_layer *net = lk_sequential_create(2, v);
    /* weight and bias away from 1 and 0, so their gradients flow through both */
    float wv[C] = {1.5f, 0.5f, -1.0f}, bv[C] = {0.1f, -0.2f, 0.3f};
    memcpy(lk_layer_get_tensor(net, "1.weight")->data, wv, sizeof wv);
    memcpy(lk_layer_get_tensor(net, "1.bias")->data, bv, sizeof bv);
    return net;
}

static void batch(float *x, float *t, float *x2) {
    lk_rng r;
    lk_rng_init(&r, 11, LK_RNG_DATA, 0, 0);
    for (int i = 0; i < N * IN; i++) x[i] = 2.0f * lk_rng_normal(&r) + 0.5f;
    for (int i = 0; i < N * C; i++) t[i] = lk_rng_normal(&r);
    for (int i = 0; i < N * 2 * H * H; i++) x2[i] = lk_rng_normal(&r) * 3.0f - 1.0f;
}

/* Forward + backward of rows [r0, r0 + n): mse against t. Outputs land in y. */
static lk_status run(lk_layer *net, const float *x, const float *t, int r0, int n, float *y) {
    lk_scope_begin();
    lk_tensor *xt = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(n, IN), x + r0 * IN));
    lk_tensor *tt = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(n, C), t + r0 * C));
    lk_tensor *out = lk_layer_forward(net, xt);
    if (out) memcpy(y, out->data, sizeof(float) * (size_t)(n * C));
    lk_status st = lk_backward(lk_mse_loss(out, tt, LK_REDUCTION_MEAN));
    lk_scope_end();
    return st;
}

/* BatchNorm2d alone on [n, 2, H, H], rows [r0, r0 + n): loss sum(y * y * k), k a fixed weight per
 * element of the whole batch, so the whole batch's loss is the sum of the ranks'. Input gradient into dx. */
static lk_status run2d(lk_layer *bn, const float *x2, int r0, int n, float *dx) {
    enum { PER = 2 * H * H };
    float k[N * PER];
    for (int i = 0; i < N * PER; i++) k[i] = 0.05f + 0.1f * (float)(i % 7);
    lk_scope_begin();
    lk_tensor *xt = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(n, 2, H, H), x2 + r0 * PER));
    lk_tensor *kt = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(n, 2, H, H), k + r0 * PER));
    lk_tensor_set_requires_grad(xt, true);
    lk_tensor *y = lk_layer_forward(bn, xt);
    lk_status st = lk_backward(lk_sum(lk_mul(lk_mul(y, y), kt), NULL, 0, false));
    if (!st) memcpy(dx, xt->grad->data, sizeof(float) * (size_t)(n * PER));
    lk_scope_end();
    return st;
}

static int close_to(const char *what, int rank, const float *a, const float *b, int n, float tol) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= tol * (1.0f + fabsf(b[i])))) {
            if (bad++ < 3) fprintf(stderr, "rank %d: %s[%d] = %.8g, whole batch %.8g\n", rank, what, i, a[i], b[i]);
        }
    return bad;
}

static int rank_main(int rank, lk_comm *comm) {
    float x[N * IN], t[N * C], x2[N * 2 * H * H], y_ref[N * C], y[N * C];
    batch(x, t, x2);
    int half = N / WORLD, r0 = rank * half, bad = 0;
    /* the whole batch in this process, no sync */
    lk_layer *ref = make_net(), *net = make_net();
    if (run(ref, x, t, 0, N, y_ref)) return fprintf(stderr, "ref: %s\n", lk_last_error()), 1;
    if (lk_layer_sync_batchnorm(net, comm_sum, comm) != 1) return fprintf(stderr, "no batch norm set\n"), 1;
    if (run(net, x, t, r0, half, y)) return fprintf(stderr, "rank %d: %s\n", rank, lk_last_error()), 1;
    bad += close_to("output", rank, y, y_ref + r0 * C, half * C, 1e-5f);
    const char *names[] = {"0.weight", "0.bias", "1.weight", "1.bias"};
    for (int i = 0; i < 4; i++) {
        lk_tensor *g = lk_layer_get_tensor(net, names[i])->grad, *gr = lk_layer_get_tensor(ref, names[i])->grad;
        /* DDP's average of the ranks' gradients: the loss of each is the mean over its half */
        if (lk_comm_all_reduce(comm, g->data, (size_t)g->numel, LK_F32, LK_REDUCE_AVG)) return 1;
        bad += close_to(names[i], rank, g->data, gr->data, (int)g->numel, 1e-4f);
    }
    const char *bufs[] = {"1.running_mean", "1.running_var"};
    for (int i = 0; i < 2; i++)
        bad += close_to(bufs[i], rank, lk_layer_get_tensor(net, bufs[i])->data, lk_layer_get_tensor(ref, bufs[i])->data,
                        C, 1e-5f);
    lk_layer_free(ref);
    lk_layer_free(net);

    /* BatchNorm2d: the input gradient of a rank is d(L_0 + L_1)/dx there */
    float dx_ref[N * 2 * H * H], dx[N * 2 * H * H];
    lk_layer *bn_ref = lk_batch_norm2d_create(2, 1e-5f, 0.1f, true, true), *bn = lk_batch_norm2d_create(2, 1e-5f, 0.1f, true, true);
    lk_layer_sync_batchnorm(bn, comm_sum, comm);
    if (run2d(bn_ref, x2, 0, N, dx_ref) || run2d(bn, x2, r0, half, dx))
        return fprintf(stderr, "rank %d 2d: %s\n", rank, lk_last_error()), 1;
    bad += close_to("2d input grad", rank, dx, dx_ref + r0 * 2 * H * H, half * 2 * H * H, 1e-4f);
    lk_layer_free(bn_ref);
    lk_layer_free(bn);
    return bad ? 1 : 0;
}

static void split_batch_matches_whole(void) {
    char job[64];
    snprintf(job, sizeof job, "lktest-syncbn-%d", (int)getpid());
    pid_t pids[WORLD];
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
            lk_comm_config cc = lk_comm_config_default();
            cc.timeout_s = 30;
            lk_comm *comm = NULL;
            if (lk_comm_create(&cc, &comm)) {
                fprintf(stderr, "rank %d: comm: %s\n", r, lk_last_error());
                _exit(1);
            }
            int rc = rank_main(r, comm);
            lk_comm_free(comm);
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < WORLD; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CHECK_MSG(failed == 0, "%d of %d ranks differ from the whole batch", failed, WORLD);
}

/* The check that the ranks hold more than one value per channel, which
 * reads the reduced count back only on a rank that holds at most one
 * itself: alone with one sample it is an error naming the count, and the
 * running statistics are left as they were; with a peer holding three
 * more the same sample normalises (over the count of four). */
static lk_status alone(void *ctx, double *v, int n) { return (void)ctx, (void)v, (void)n, LK_STATUS_OK; }
static lk_status with_peer(void *ctx, double *v, int n) {
    (void)ctx;
    for (int i = 0; i < n - 1; i++) v[i] += 1.0 + i; /* the peer's sums (any; the sums of squares stay large enough) */
    v[n - 1] += 3.0; /* and its count */
    return LK_STATUS_OK;
}
static void one_value_per_channel(void) {
    float xv[C] = {0.5f, -1.0f, 2.0f}, ones[C] = {1, 1, 1}, zeros[C] = {0, 0, 0};
    lk_tensor *x = lk_tensor_from_data(LK_F32, LK_SHAPE(1, C), xv);
    lk_tensor *rm = lk_tensor_from_data(LK_F32, LK_SHAPE(C), zeros), *rv = lk_tensor_from_data(LK_F32, LK_SHAPE(C), ones);
    CHECK(lk_batch_norm_sync(x, rm, rv, NULL, NULL, true, 0.1f, 1e-5f, alone, NULL) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "expected more than 1 value per channel over all ranks when training, got 1"),
              "error: %s", lk_last_error());
    CHECK(!memcmp(rm->data, zeros, sizeof zeros) && !memcmp(rv->data, ones, sizeof ones));
    lk_tensor *y = lk_batch_norm_sync(x, rm, rv, NULL, NULL, true, 0.1f, 1e-5f, with_peer, NULL);
    CHECK_MSG(y != NULL, "with a peer: %s", lk_last_error());
    CHECK(memcmp(rm->data, zeros, sizeof zeros) != 0);
    lk_tensor_release(y);
    lk_tensor_release(x);
    lk_tensor_release(rm);
    lk_tensor_release(rv);
}

LK_TEST_MAIN(LK_TEST_CASE(split_batch_matches_whole), LK_TEST_CASE(one_value_per_channel))
