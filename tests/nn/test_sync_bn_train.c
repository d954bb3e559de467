/* SyncBatchNorm over a communicator (lk_layer_sync_batchnorm_reducer with
 * lk_comm_bn_reducer, what trainer.sync_batchnorm sets): forked ranks train 10 SGD steps, each on
 * its rows of a global batch, and end with the parameters, running
 * statistics and num_batches_tracked of one process training on the whole
 * batch — and with other parameters than the same ranks with plain
 * (per-rank) BatchNorm. Two networks: Linear -> BatchNorm1d -> ReLU ->
 * Linear, and Conv2d -> BatchNorm2d -> ReLU -> Conv2d 1x1.
 *
 *  - 2 ranks with 4 rows each against 1 process with 8: every rank's loss
 *    is the mean over its rows and the gradients are averaged over the
 *    ranks, as DDP does;
 *  - 3 ranks with 4 rows each, and a last step (the uneven last batch)
 *    where they hold 4, 3 and 1 rows: the rank with 1 row has a single
 *    value per channel, so only the reduced count makes its statistics
 *    right. The loss of a rank is its rows' squared errors over the global
 *    element count, and the gradients are summed over the ranks: exactly
 *    the whole batch's mean loss whatever the split.
 *
 * Tolerance: 1e-5 relative (to 1 + |value|). The ranks add their statistics
 * in another order than the one process (per rank in f32 planes, then in
 * f64 over ranks, the squares from each rank's own mean; the gradients
 * averaged in f32), a float ulp or two (~1e-7) per value and step; after 10
 * steps of lr 0.1 the largest difference measured is 1.1e-7 (printed),
 * so 1e-5 leaves room for another compiler's rounding while plain
 * BatchNorm, which differs by 1.5e-2 to 0.19, stays far outside. */
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"

enum { IN = 5, C = 3, K = 2, CI = 2, HW = 4, B = 4, STEPS = 10, MAXW = 3, MAXROWS = MAXW * B };
static const float LR = 0.1f, TOL = 1e-5f;

typedef struct {
    int world;
    bool weighted;       /* losses over the global count, gradients summed (uneven splits) */
    int last[MAXW];      /* rows per rank in the last step (0: B) */
} scenario;

/* SyncBatchNorm over comm, as the trainer sets it (NULL: off). */
static int sync_over(lk_layer *l, lk_comm *c) {
    lk_bn_reducer r;
    lk_comm_bn_reducer(c, &r);
    return lk_layer_sync_batchnorm_reducer(l, &r);
}

static lk_layer *make_net(bool conv) {
    lk_rng r;
    lk_rng_init(&r, 5, LK_RNG_INIT, 0, 0);
    lk_conv2d_params p = LK_CONV2D_DEFAULT;
    p.padding[0] = p.padding[1] = 1;
    lk_layer *v[4];
    if (conv) {
        v[0] = lk_conv2d_create(CI, C, 3, 3, p, true, &r);
        v[1] = lk_batch_norm2d_create(C, 1e-5f, 0.1f, true, true);
        v[3] = lk_conv2d_create(C, K, 1, 1, LK_CONV2D_DEFAULT, true, &r);
    } else {
        v[0] = lk_linear_create(IN, C, true, &r);
        v[1] = lk_batch_norm1d_create(C, 1e-5f, 0.1f, true, true);
        v[3] = lk_linear_create(C, K, true, &r);
    }
    v[2] = lk_relu_create();
    return lk_sequential_create(4, v);
}

static int64_t in_per_row(bool conv) { return conv ? CI * HW * HW : IN; }
static int64_t out_per_row(bool conv) { return conv ? K * HW * HW : K; }

/* The global batch of step s (the same in every process) and where rank r's rows start. */
static int rows_of(const scenario *sc, int s, int r) { return s == STEPS - 1 && sc->last[r] ? sc->last[r] : B; }
static void global_batch(bool conv, int s, int rows, float *x, float *t) {
    lk_rng g;
    lk_rng_init(&g, 100 + (uint64_t)s, LK_RNG_DATA, 0, 0);
    for (int64_t i = 0; i < rows * in_per_row(conv); i++) x[i] = 1.5f * lk_rng_normal(&g) + 0.7f;
    for (int64_t i = 0; i < rows * out_per_row(conv); i++) t[i] = lk_rng_normal(&g);
}

/* One step on rows [r0, r0 + n) of a global batch of `total` rows: forward, loss, backward. */
static lk_status step(lk_layer *net, bool conv, const float *x, const float *t, int r0, int n, int total,
                      bool weighted) {
    int64_t pi = in_per_row(conv), po = out_per_row(conv);
    lk_scope_begin();
    lk_tensor *xt = conv ? lk_tensor_from_data(LK_F32, LK_SHAPE(n, CI, HW, HW), x + r0 * pi)
                         : lk_tensor_from_data(LK_F32, LK_SHAPE(n, IN), x + r0 * pi);
    lk_tensor *tt = conv ? lk_tensor_from_data(LK_F32, LK_SHAPE(n, K, HW, HW), t + r0 * po)
                         : lk_tensor_from_data(LK_F32, LK_SHAPE(n, K), t + r0 * po);
    lk_scope_adopt(xt), lk_scope_adopt(tt);
    lk_tensor *y = lk_layer_forward(net, xt), *loss;
    if (weighted) loss = lk_mul_scalar(lk_mse_loss(y, tt, LK_REDUCTION_SUM), 1.0f / (float)(total * po));
    else loss = lk_mse_loss(y, tt, LK_REDUCTION_MEAN);
    lk_status st = loss ? lk_backward(loss) : lk_last_status();
    lk_scope_end();
    return st;
}

/* p -= LR * g over every parameter (gradients combined over the ranks first when comm). */
static lk_status sgd(lk_layer *net, lk_comm *comm, bool weighted) {
    lk_named_tensors ps = {0};
    lk_status st = lk_layer_named_parameters(net, &ps);
    for (int i = 0; !st && i < ps.n; i++) {
        lk_tensor *p = ps.items[i].tensor, *g = p->grad;
        if (!g) {
            st = lk_error(LK_STATUS_INTERNAL, "%s has no gradient", ps.items[i].name);
            break;
        }
        if (comm) st = lk_comm_all_reduce(comm, g->data, (size_t)g->numel, LK_F32, weighted ? LK_REDUCE_SUM : LK_REDUCE_AVG);
        float *pd = p->data, *gd = g->data;
        for (int64_t k = 0; !st && k < p->numel; k++) pd[k] -= LR * gd[k];
    }
    lk_named_tensors_clear(&ps);
    lk_layer_zero_grad(net, true);
    return st;
}

/* Trains net 10 steps: rank `rank` of sc->world (comm NULL: the whole batch in this process). */
static lk_status train(lk_layer *net, bool conv, const scenario *sc, int rank, lk_comm *comm) {
    float x[MAXROWS * CI * HW * HW], t[MAXROWS * K * HW * HW];
    for (int s = 0; s < STEPS; s++) {
        int total = 0, r0 = 0;
        for (int r = 0; r < sc->world; r++) {
            if (r == rank) r0 = total;
            total += rows_of(sc, s, r);
        }
        global_batch(conv, s, total, x, t);
        lk_status st = comm || rank >= 0 ? step(net, conv, x, t, r0, rows_of(sc, s, rank), total, sc->weighted)
                                         : step(net, conv, x, t, 0, total, total, sc->weighted);
        if (!st) st = sgd(net, comm, sc->weighted);
        if (st) return st;
    }
    return LK_STATUS_OK;
}

/* Largest |a - b| / (1 + |b|) over the state (parameters and buffers). */
static double state_diff(lk_layer *a, lk_layer *b, char *worst, size_t wn) {
    lk_named_tensors sa = {0}, sb = {0};
    double d = 0;
    if (lk_state_dict_get(a, &sa) || lk_state_dict_get(b, &sb) || sa.n != sb.n) d = INFINITY;
    for (int i = 0; isfinite(d) && i < sa.n; i++) {
        lk_tensor *x = sa.items[i].tensor, *y = sb.items[i].tensor;
        for (int64_t k = 0; k < x->numel; k++) {
            double u = x->dtype == LK_I64 ? (double)((int64_t *)x->data)[k] : ((float *)x->data)[k];
            double v = y->dtype == LK_I64 ? (double)((int64_t *)y->data)[k] : ((float *)y->data)[k];
            double e = fabs(u - v) / (1.0 + fabs(v));
            if (!(e <= d)) {
                d = e;
                snprintf(worst, wn, "%s[%lld]: %.9g vs %.9g", sa.items[i].name, (long long)k, u, v);
            }
        }
    }
    lk_named_tensors_clear(&sa);
    lk_named_tensors_clear(&sb);
    return d;
}

static int rank_main(const scenario *sc, int rank, lk_comm *comm) {
    int bad = 0;
    for (int conv = 0; conv < 2; conv++) {
        const char *what = conv ? "BatchNorm2d" : "BatchNorm1d";
        lk_layer *ref = make_net(conv), *sync = make_net(conv), *plain = make_net(conv);
        if (sync_over(sync, comm) != 1) return fprintf(stderr, "no batch norm set\n"), 1;
        if (train(ref, conv, sc, -1, NULL)) return fprintf(stderr, "%s whole batch: %s\n", what, lk_last_error()), 1;
        if (train(sync, conv, sc, rank, comm)) return fprintf(stderr, "rank %d %s sync: %s\n", rank, what, lk_last_error()), 1;
        char w1[160] = "", w2[160] = "";
        double d_sync = state_diff(sync, ref, w1, sizeof w1);
        /* plain BatchNorm: per-rank statistics (its rank of 1 row cannot train in the uneven step: not run there) */
        bool uneven_one = false;
        for (int r = 0; r < sc->world; r++) uneven_one |= sc->last[r] == 1;
        double d_plain = 1;
        if (!uneven_one) {
            if (train(plain, conv, sc, rank, comm)) return fprintf(stderr, "rank %d %s plain: %s\n", rank, what, lk_last_error()), 1;
            d_plain = state_diff(plain, ref, w2, sizeof w2);
        }
        if (rank == 0 && uneven_one)
            printf("%d ranks (last batch 4/3/1 rows), %s: sync against the whole batch %.3g (%s)\n", sc->world, what,
                   d_sync, w1);
        else if (rank == 0)
            printf("%d ranks, %s: sync against the whole batch %.3g (%s); plain BatchNorm %.3g\n", sc->world, what,
                   d_sync, w1, d_plain);
        if (!(d_sync <= TOL)) bad++, fprintf(stderr, "rank %d %s: sync differs from the whole batch by %.3g: %s\n", rank, what, d_sync, w1);
        if (!(d_plain > 1e-3)) bad++, fprintf(stderr, "rank %d %s: plain BatchNorm is as close (%.3g): %s\n", rank, what, d_plain, w2);
        lk_layer_free(ref), lk_layer_free(sync), lk_layer_free(plain);
    }
    return bad ? 1 : 0;
}

static int run_world(const scenario *sc) {
    char job[64];
    snprintf(job, sizeof job, "lktest-syncbn-train-%d-%d", sc->world, (int)getpid());
    pid_t pids[MAXW];
    fflush(stdout); /* the children would print it again */
    for (int r = 0; r < sc->world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char buf[16];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", sc->world);
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
            int rc = rank_main(sc, r, comm);
            lk_comm_free(comm);
            fflush(stdout);
            _exit(rc);
        }
    }
    int failed = 0;
    for (int r = 0; r < sc->world; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

static void two_ranks_match_double_batch(void) {
    scenario sc = {2, false, {0}};
    int failed = run_world(&sc);
    CHECK_MSG(failed == 0, "%d of 2 ranks differ from one process with the double batch", failed);
}

static void three_ranks_uneven_last_batch(void) {
    scenario sc = {3, true, {4, 3, 1}};
    int failed = run_world(&sc);
    CHECK_MSG(failed == 0, "%d of 3 ranks differ from one process with the whole batch", failed);
}

static void three_ranks_even(void) {
    scenario sc = {3, true, {0}};
    int failed = run_world(&sc);
    CHECK_MSG(failed == 0, "%d of 3 ranks differ from one process with the whole batch (even)", failed);
}

LK_TEST_MAIN(LK_TEST_CASE(two_ranks_match_double_batch), LK_TEST_CASE(three_ranks_uneven_last_batch),
             LK_TEST_CASE(three_ranks_even))
