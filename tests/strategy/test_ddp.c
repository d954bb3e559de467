/* DDP equivalence: N ranks with per-rank batch B train the same parameters as
 * one process with batch N*B on the same samples (mean-reduced loss), for any
 * bucket size; accumulation reduces once per optimizer step; a slow
 * communicator's time hides behind backward; bf16/fp16 gradients stay close
 * and halve the bytes. Ranks are forked children. */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "debug_backend.h"
#include "lk_test.h"

enum { IN = 13, HID = 32, OUT = 5, B = 6, STEPS = 20 };

typedef struct {
    lk_tensor *w1, *b1, *w2, *b2;
    lk_tensor *params[4];
    const char *names[4];
    lk_tensor *m[4], *v[4];
} net;

static void net_init(net *n) {
    lk_rng r;
    lk_rng_init(&r, 99, LK_RNG_INIT, 0, 0);
    n->w1 = lk_tensor_randn(&r, LK_SHAPE(HID, IN), 0, 0.3f);
    n->b1 = lk_tensor_randn(&r, LK_SHAPE(HID), 0, 0.1f);
    n->w2 = lk_tensor_randn(&r, LK_SHAPE(OUT, HID), 0, 0.3f);
    n->b2 = lk_tensor_randn(&r, LK_SHAPE(OUT), 0, 0.1f);
    lk_tensor *p[4] = {n->w1, n->b1, n->w2, n->b2};
    static const char *names[4] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    for (int i = 0; i < 4; i++) {
        n->params[i] = p[i];
        n->names[i] = names[i];
        lk_tensor_set_requires_grad(p[i], true);
        n->m[i] = lk_tensor_zeros(LK_F32, p[i]->ndim, p[i]->shape);
        n->v[i] = lk_tensor_zeros(LK_F32, p[i]->ndim, p[i]->shape);
    }
}

static void net_free(net *n) {
    for (int i = 0; i < 4; i++) {
        lk_tensor_release(n->params[i]);
        lk_tensor_release(n->m[i]);
        lk_tensor_release(n->v[i]);
    }
}

/* Adam with PyTorch's defaults, lr 1e-2 (the same in both runs). */
static void adam_step(net *n, int t) {
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float bc1 = 1 - powf(b1, (float)t), bc2 = 1 - powf(b2, (float)t);
    for (int i = 0; i < 4; i++) {
        float *p = n->params[i]->data, *g = n->params[i]->grad->data, *m = n->m[i]->data, *v = n->v[i]->data;
        for (int64_t k = 0; k < n->params[i]->numel; k++) {
            m[k] = b1 * m[k] + (1 - b1) * g[k];
            v[k] = b2 * v[k] + (1 - b2) * g[k] * g[k];
            p[k] -= lr * (m[k] / bc1) / (sqrtf(v[k] / bc2) + eps);
        }
    }
}

/* Sample i of the synthetic dataset (deterministic from its index). */
static void sample(int64_t i, float *x, float *y) {
    lk_rng r;
    lk_rng_init(&r, 5, LK_RNG_DATA, (uint32_t)i, 0);
    for (int k = 0; k < IN; k++) x[k] = lk_rng_normal(&r);
    for (int k = 0; k < OUT; k++) y[k] = sinf(x[k]) + 0.5f * x[k + 1];
}

/* One forward/backward on samples [first, first + count). */
static lk_status micro_step(net *n, int64_t first, int64_t count) {
    float xs[64 * IN], ys[64 * OUT];
    for (int64_t i = 0; i < count; i++) sample(first + i, xs + i * IN, ys + i * OUT);
    lk_scope_begin();
    lk_tensor *x = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(count, IN), xs));
    lk_tensor *y = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(count, OUT), ys));
    lk_tensor *loss = lk_mse_loss(lk_linear(lk_tanh(lk_linear(x, n->w1, n->b1)), n->w2, n->b2), y, LK_REDUCTION_MEAN);
    lk_status st = lk_backward(loss);
    lk_scope_end();
    return st;
}

/* A result file of this process's own (tests of other builds may run at
 * once and would share a fixed /tmp name); the names live until exit,
 * when the process that made them (not a forked rank) removes the files. */
static char tmp_names[32][96];
static int tmp_count, tmp_owner;

static void tmp_cleanup(void) {
    if (getpid() != tmp_owner) return;
    for (int i = 0; i < tmp_count; i++) unlink(tmp_names[i]);
}

static const char *P(const char *name) {
    if (!tmp_count) tmp_owner = (int)getpid(), atexit(tmp_cleanup);
    char path[96];
    snprintf(path, sizeof path, "/tmp/%d-%s", tmp_owner, name);
    for (int i = 0; i < tmp_count; i++)
        if (!strcmp(tmp_names[i], path)) return tmp_names[i];
    if (tmp_count == 32) lk_panic("test_ddp: more than 32 result files");
    return strcpy(tmp_names[tmp_count++], path);
}

typedef struct {
    int world;
    double bucket_mb;
    int accum; /* micro-batches per optimizer step */
    const char *out_path;
    lk_dtype comm_dtype; /* LK_F32 (0) unless a test compresses */
    const lk_optim_config *optim; /* non-NULL: the library's optimizer (train_optim) instead of adam_step */
    bool shared;                  /* ... with shared_params */
    bool on_debug_device;         /* parameters and activations on the tests' debug device */
} run_cfg;

static int train_optim(const run_cfg *rc, lk_comm *comm);
/* on_debug_device runs also register the debug backend (debug_backend.h) */
static bool with_debug_backend;

/* Trains and writes the parameters (rank 0) to out_path. Returns 0 on success. */
static int train(const run_cfg *rc, lk_comm *comm, uint64_t *allreduces) {
    if (rc->optim) return train_optim(rc, comm);
    if (rc->on_debug_device && lk_device_set_default(dbg_device())) {
        fprintf(stderr, "debug device: %s\n", lk_last_error());
        return 1;
    }
    if (rc->on_debug_device && with_debug_backend) dbg_backend_device();
    net n;
    net_init(&n);
    lk_strategy_config sc = lk_strategy_config_default();
    sc.comm = comm;
    lk_ddp_options ddp = lk_ddp_options_default();
    ddp.bucket_cap_mb = rc->bucket_mb;
    ddp.comm_dtype = rc->comm_dtype;
    sc.ddp = &ddp;
    lk_strategy *s = NULL;
    if (lk_strategy_create(&sc, &s) || lk_strategy_setup(s, n.params, n.names, 4, NULL, 0)) {
        fprintf(stderr, "setup: %s\n", lk_last_error());
        return 1;
    }
    int rank = lk_strategy_rank(s), world = lk_strategy_world_size(s);
    /* ddp's data-parallel group is the communicator's world (single's: this process) */
    if (lk_strategy_dp_size(s) != world || lk_strategy_dp_rank(s) != rank || lk_strategy_dp_comm(s) != comm) {
        fprintf(stderr, "dp group: size %d rank %d, world %d rank %d\n", lk_strategy_dp_size(s), lk_strategy_dp_rank(s),
                world, rank);
        return 1;
    }
    int64_t per_rank = (int64_t)B * (rc->world / world) / rc->accum; /* single run: the whole global batch */
    for (int t = 1; t <= STEPS; t++) {
        for (int a = 0; a < rc->accum; a++) {
            int64_t first = ((int64_t)(t - 1) * rc->world * B) + (int64_t)a * per_rank * world + (int64_t)rank * per_rank;
            lk_strategy_begin_backward(s, a == rc->accum - 1);
            if (micro_step(&n, first, per_rank) || lk_strategy_finish_backward(s)) {
                fprintf(stderr, "step %d: %s\n", t, lk_last_error());
                return 1;
            }
        }
        if (rc->accum > 1) /* mean over micro-batches, as Lightning scales the loss */
            for (int i = 0; i < 4; i++) {
                float *g = n.params[i]->grad->data;
                for (int64_t k = 0; k < n.params[i]->numel; k++) g[k] /= (float)rc->accum;
            }
        adam_step(&n, t);
        lk_strategy_zero_grad(s);
    }
    if (allreduces) *allreduces = rc->comm_dtype == LK_F32 ? lk_strategy_get_stats(s).allreduce_calls
                                                           : lk_strategy_get_stats(s).bytes_reduced;
    if (rank == 0) {
        FILE *f = fopen(rc->out_path, "wb");
        for (int i = 0; i < 4; i++) fwrite(n.params[i]->data, 4, (size_t)n.params[i]->numel, f);
        fclose(f);
    }
    lk_strategy_free(s);
    net_free(&n);
    if (rc->on_debug_device && with_debug_backend && dbg_backend_ran(LK_OP_GEMM) == 0) {
        fprintf(stderr, "rank %d: the debug backend ran no GEMM\n", rank);
        return 1;
    }
    return 0;
}

/* Forks `world` ranks running train(); returns the number that failed. */
static int run_ranks(const run_cfg *rc, uint64_t *allreduces_rank0) {
    char job[64];
    snprintf(job, sizeof job, "lktest-ddp-%d-%d", (int)getpid(), rand() % 100000);
    int fds[2];
    if (pipe(fds)) return rc->world;
    pid_t pids[8];
    for (int r = 0; r < rc->world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(fds[0]);
            char buf[32];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", rc->world);
            setenv("WORLD_SIZE", buf, 1);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", "29511", 1);
            setenv("LK_JOB_ID", job, 1);
            lk_comm_config cc = lk_comm_config_default();
            cc.timeout_s = 20;
            lk_comm *comm = NULL;
            if (lk_comm_create(&cc, &comm)) {
                fprintf(stderr, "rank %d: comm: %s\n", r, lk_last_error());
                _exit(1);
            }
            uint64_t calls = 0;
            int rc2 = train(rc, comm, &calls);
            if (r == 0) {
                ssize_t w = write(fds[1], &calls, sizeof calls);
                (void)w;
            }
            lk_comm_free(comm);
            _exit(rc2);
        }
    }
    close(fds[1]);
    int failed = 0;
    for (int r = 0; r < rc->world; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    uint64_t calls = 0;
    ssize_t rd = read(fds[0], &calls, sizeof calls);
    (void)rd;
    close(fds[0]);
    if (allreduces_rank0) *allreduces_rank0 = calls;
    return failed;
}

static int load(const char *path, float *buf, int n) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int k = (int)fread(buf, 4, (size_t)n, f);
    fclose(f);
    return k;
}

enum { NP = HID * IN + HID + OUT * HID + OUT };

/* Relative error of the parameter vector, ||a - b|| / ||b|| (the gradients'
 * summation order differs: one mean over N*B samples vs a mean of N per-rank
 * means, so the results agree to f32 rounding, amplified a little by Adam). */
static double max_rel_diff(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void ddp_equals_single(void) {
    static float ref[NP], got[NP], other[NP];
    for (int world = 2; world <= 4; world++) {
        run_cfg single = {world, 25, 1, P("lk_ddp_single.bin"), LK_F32, NULL, false, false};
        CHECK(train(&single, NULL, NULL) == 0);
        CHECK(load(single.out_path, ref, NP) == NP);
        run_cfg ddp = {world, 25, 1, P("lk_ddp_ranks.bin"), LK_F32, NULL, false, false};
        CHECK_MSG(run_ranks(&ddp, NULL) == 0, "world %d: a rank failed", world);
        CHECK(load(ddp.out_path, got, NP) == NP);
        double d = max_rel_diff(got, ref, NP);
        printf("world %d: relative error ||ddp - single|| / ||single|| after %d Adam steps: %.3g\n", world, STEPS, d);
        CHECK_MSG(d <= 1e-5, "world %d: %.3g", world, d);
        /* many tiny buckets and one huge bucket give identical results */
        run_cfg tiny = {world, 1e-4, 1, P("lk_ddp_tiny.bin"), LK_F32, NULL, false, false};
        CHECK(run_ranks(&tiny, NULL) == 0);
        CHECK(load(tiny.out_path, other, NP) == NP);
        CHECK_MSG(memcmp(other, got, sizeof got) == 0, "world %d: tiny buckets differ", world);
        run_cfg huge = {world, 1000, 1, P("lk_ddp_huge.bin"), LK_F32, NULL, false, false};
        CHECK(run_ranks(&huge, NULL) == 0);
        CHECK(load(huge.out_path, other, NP) == NP);
        CHECK_MSG(memcmp(other, got, sizeof got) == 0, "world %d: one bucket differs", world);
        /* the same ranks with every tensor on another device: the device layer changes no bit */
        run_cfg dev = {world, 25, 1, P("lk_ddp_debugdev.bin"), LK_F32, NULL, false, true};
        CHECK(run_ranks(&dev, NULL) == 0);
        CHECK(load(dev.out_path, other, NP) == NP);
        CHECK_MSG(memcmp(other, got, sizeof got) == 0, "world %d: ddp on the debug device differs from the cpu", world);
        /* ... and with the debug backend's reference loops running the ops: its
         * plain-order GEMM sums differ from OpenBLAS's in the last bits, so
         * this compares as the single-process check does */
        with_debug_backend = true;
        run_cfg dbe = {world, 25, 1, P("lk_ddp_debugbe.bin"), LK_F32, NULL, false, true};
        CHECK(run_ranks(&dbe, NULL) == 0);
        with_debug_backend = false;
        CHECK(load(dbe.out_path, other, NP) == NP);
        double db = max_rel_diff(other, got, NP);
        printf("world %d: ddp on the debug backend vs the cpu backend: relative difference %.3g (%s)\n", world, db,
               memcmp(other, got, sizeof got) ? "not bitwise equal" : "bitwise equal");
        CHECK_MSG(db <= 1e-5, "world %d: ddp on the debug backend differs from the cpu backend by %.3g", world, db);
    }
}

static void accumulation_reduces_once_per_step(void) {
    static float ref[NP], got[NP];
    /* accumulate 3 micro-batches of B/3 on each of 2 ranks == batch 2B on one process */
    run_cfg single = {2, 25, 1, P("lk_acc_single.bin"), LK_F32, NULL, false, false};
    CHECK(train(&single, NULL, NULL) == 0);
    CHECK(load(single.out_path, ref, NP) == NP);
    run_cfg acc = {2, 1e-6, 3, P("lk_acc_ddp.bin"), LK_F32, NULL, false, false}; /* one bucket per parameter */
    uint64_t calls = 0;
    CHECK(run_ranks(&acc, &calls) == 0);
    CHECK(load(acc.out_path, got, NP) == NP);
    double d = max_rel_diff(got, ref, NP);
    printf("accumulate 3 x 2 ranks vs single: relative error %.3g, %llu all-reduces\n", d,
           (unsigned long long)calls);
    CHECK_MSG(d <= 1e-5, "%.3g", d);
    /* one bucket per parameter: 4 all-reduces per optimizer step, none in no_sync passes */
    CHECK_MSG(calls == 4 * STEPS, "expected %d all-reduces, got %llu", 4 * STEPS, (unsigned long long)calls);
}

/* bf16/fp16 compression: the gradients travel as 16-bit values (half the
 * bytes), so training stays close to single-process training but not equal
 * to f32 rounding; the rounding is per element, so the bucket layout does
 * not change a bit of it. */
static void compressed_gradients(void) {
    static float ref[NP], got[NP], other[NP];
    run_cfg single = {2, 25, 1, P("lk_cmp_single.bin"), LK_F32, NULL, false, false};
    CHECK(train(&single, NULL, NULL) == 0);
    CHECK(load(single.out_path, ref, NP) == NP);
    const lk_dtype dts[2] = {LK_BF16, LK_F16};
    const double tol[2] = {1e-2, 1e-3}; /* 8 and 11 significant bits */
    for (int k = 0; k < 2; k++) {
        run_cfg one = {2, 25, 1, P("lk_cmp_one.bin"), dts[k], NULL, false, false};
        uint64_t bytes = 0;
        CHECK(run_ranks(&one, &bytes) == 0);
        CHECK(load(one.out_path, got, NP) == NP);
        double d = max_rel_diff(got, ref, NP);
        printf("%s gradients, 2 ranks vs single: relative error %.3g, %llu bytes reduced per rank\n", lk_dtype_name(dts[k]),
               d, (unsigned long long)bytes);
        CHECK_MSG(d > 0 && d <= tol[k], "%s: %.3g", lk_dtype_name(dts[k]), d);
        CHECK_MSG(bytes == (uint64_t)NP * 2 * STEPS, "%s: %llu bytes, expected %d", lk_dtype_name(dts[k]),
                  (unsigned long long)bytes, NP * 2 * STEPS);
        run_cfg tiny = {2, 1e-4, 1, P("lk_cmp_tiny.bin"), dts[k], NULL, false, false}; /* async buckets, then the inline last one */
        CHECK(run_ranks(&tiny, NULL) == 0);
        CHECK(load(tiny.out_path, other, NP) == NP);
        CHECK_MSG(memcmp(other, got, sizeof got) == 0, "%s: tiny buckets differ from one bucket", lk_dtype_name(dts[k]));
    }
}

/* The library's optimizer over DDP, with parameters either replicated or
 * shared (one copy in the segment, each rank updating its shard, here
 * through the optimizer's per-parameter path: the tensors wrap the buffer
 * one by one). Rank 0 writes the parameters after lk_strategy_free, which
 * gives each parameter its own memory back, then the optimizer state. */
static int train_optim(const run_cfg *rc, lk_comm *comm) {
    net n;
    net_init(&n);
    lk_strategy_config sc = lk_strategy_config_default();
    sc.comm = comm;
    lk_ddp_options ddp = lk_ddp_options_default();
    ddp.shared_params = rc->shared;
    sc.ddp = &ddp;
    lk_strategy *s = NULL;
    lk_tensor *pbuf_t = NULL;
    bool copy = true;
    if (lk_strategy_create(&sc, &s) || lk_strategy_param_buffer(s, NP, &pbuf_t, &copy)) {
        fprintf(stderr, "create: %s\n", lk_last_error());
        return 1;
    }
    float *pbuf = pbuf_t ? pbuf_t->data : NULL;
    if (rc->shared != (pbuf != NULL)) {
        fprintf(stderr, "shared_params %d but param_buffer %p\n", rc->shared, (void *)pbuf);
        return 1;
    }
    int64_t off = 0;
    for (int i = 0; pbuf && i < 4; i++) { /* the parameters move into the shared buffer; rank 0's values */
        lk_tensor *p = n.params[i], *w = lk_tensor_wrap(LK_F32, p->ndim, p->shape, pbuf + off);
        if (copy) memcpy(w->data, p->data, (size_t)p->numel * sizeof(float));
        lk_tensor_set_requires_grad(w, true);
        lk_tensor_release(p);
        n.params[i] = w;
        off += w->numel;
    }
    n.w1 = n.params[0], n.b1 = n.params[1], n.w2 = n.params[2], n.b2 = n.params[3];
    lk_named_tensors nt = {0};
    for (int i = 0; i < 4; i++) lk_named_tensors_append(&nt, n.names[i], n.params[i]);
    lk_optimizer *o = NULL;
    if (lk_strategy_setup(s, n.params, n.names, 4, NULL, 0) || lk_optimizer_create(rc->optim, &nt, &o)) {
        fprintf(stderr, "setup: %s\n", lk_last_error());
        return 1;
    }
    if (pbuf) { /* shared parameters with an unsharded optimizer are refused before any step */
        lk_strategy_begin_backward(s, true);
        if (lk_strategy_finish_backward(s) != LK_STATUS_INVALID_USAGE || !strstr(lk_last_error(), "no optimizer is sharded over them")) {
            fprintf(stderr, "an unsharded optimizer over shared parameters was not refused\n");
            return 1;
        }
    }
    if (lk_strategy_shard_optimizer(s, o)) {
        fprintf(stderr, "setup: %s\n", lk_last_error());
        return 1;
    }
    int rank = lk_strategy_rank(s), world = lk_strategy_world_size(s);
    for (int t = 1; t <= STEPS; t++) {
        lk_strategy_begin_backward(s, true);
        if (micro_step(&n, (int64_t)(t - 1) * world * B + (int64_t)rank * B, B) || lk_strategy_finish_backward(s) ||
            lk_optimizer_step(o) || lk_strategy_after_step(s)) {
            fprintf(stderr, "step %d: %s\n", t, lk_last_error());
            return 1;
        }
        lk_strategy_zero_grad(s);
    }
    int rc2 = 0;
    if (rc->shared && (lk_strategy_join(s) != LK_STATUS_UNSUPPORTED || !strstr(lk_last_error(), "need replicated parameters"))) {
        fprintf(stderr, "join with shared parameters was not refused\n");
        rc2 = 1;
    }
    lk_named_tensors state = {0};
    if (lk_optimizer_state_get(o, &state)) rc2 = 1;
    lk_strategy_free(s); /* the shared copy goes: parameters keep their values in memory of their own */
    for (int i = 0; i < 4 && pbuf; i++)
        if ((float *)n.params[i]->data >= pbuf && (float *)n.params[i]->data < pbuf + NP) rc2 = 1;
    if (rank == 0) {
        FILE *f = fopen(rc->out_path, "wb");
        for (int i = 0; i < 4; i++) fwrite(n.params[i]->data, 4, (size_t)n.params[i]->numel, f);
        for (int i = 0; i < state.n; i++)
            fwrite(state.items[i].tensor->data, lk_dtype_size(state.items[i].tensor->dtype), (size_t)state.items[i].tensor->numel, f);
        fclose(f);
    }
    lk_named_tensors_clear(&state);
    lk_named_tensors_clear(&nt);
    lk_optimizer_free(o);
    net_free(&n);
    return rc2;
}

/* Shared parameters change where the update runs, not a bit of its result:
 * the same parameters and optimizer state as replicas, for Adam, AMSGrad
 * and SGD with and without momentum (no state), for 2-4 ranks (3 cuts the
 * shards unevenly, some inside a parameter). */
static void shared_params_equal_replicas(void) {
    enum { NS = NP * 4 + 64 }; /* parameters + up to 3 state arrays + step scalars */
    static float rep[NS], got[NS];
    lk_optim_config cfgs[4] = {lk_adam_config_default(), lk_adam_config_default(), lk_sgd_config_default(),
                               lk_sgd_config_default()};
    cfgs[1].amsgrad = true, cfgs[1].weight_decay = 0.01;
    cfgs[2].momentum = 0.9, cfgs[2].nesterov = true;
    const char *what[4] = {"adam", "amsgrad+l2", "sgd nesterov", "sgd plain"};
    int same = 0;
    for (int world = 2; world <= 4; world++)
        for (int k = 0; k < 4; k++) {
            run_cfg a = {world, 1e-4, 1, P("lk_shared_rep.bin"), LK_F32, &cfgs[k], false, false};
            run_cfg b = {world, 1e-4, 1, P("lk_shared_one.bin"), LK_F32, &cfgs[k], true, false};
            CHECK_MSG(run_ranks(&a, NULL) == 0, "world %d %s: replicated run failed", world, what[k]);
            CHECK_MSG(run_ranks(&b, NULL) == 0, "world %d %s: shared run failed", world, what[k]);
            int na = load(a.out_path, rep, NS), nb = load(b.out_path, got, NS);
            CHECK_MSG(na > NP && na == nb, "world %d %s: %d vs %d floats written", world, what[k], na, nb);
            CHECK_MSG(memcmp(rep, got, (size_t)na * 4) == 0, "world %d %s: shared parameters differ from replicas",
                      world, what[k]);
            same += na > NP && na == nb && !memcmp(rep, got, (size_t)na * 4);
        }
    printf("shared parameters == replicas, bitwise: %d of 12 cases (worlds 2-4 x adam/amsgrad/sgd/plain sgd)\n", same);
}

static void bad_config(void) {
    lk_strategy_config sc = lk_strategy_config_default();
    lk_strategy *s;
    sc.name = "dpp";
    CHECK_ERR(lk_strategy_create(&sc, &s), LK_STATUS_INVALID_ARGUMENT, "unknown strategy 'dpp' (did you mean 'ddp'?)");
    sc.name = "ddp";
    CHECK_ERR(lk_strategy_create(&sc, &s), LK_STATUS_INVALID_ARGUMENT, "needs a communicator");
    sc.name = "single";
    lk_ddp_options ddp = lk_ddp_options_default();
    ddp.comm_dtype = LK_I32;
    sc.ddp = &ddp;
    CHECK_ERR(lk_strategy_create(&sc, &s), LK_STATUS_INVALID_ARGUMENT, "gradients travel as f32, bf16 or f16, not i32");
}

/* Uneven inputs: rank r has 3 + 2r steps. With join the job finishes and the
 * replicas stay identical; without it the mismatch is reported, not a hang. */
/* A forked rank's net, communicator and ddp strategy (default config).
 * Returns 0, or 2 when any of them cannot be made. */
static int open_rank(net *n, double timeout_s, lk_comm **comm, lk_strategy **s) {
    net_init(n);
    lk_comm_config cc = lk_comm_config_default();
    cc.timeout_s = timeout_s;
    *comm = NULL;
    *s = NULL;
    if (lk_comm_create(&cc, comm)) return 2;
    lk_strategy_config sc = lk_strategy_config_default();
    sc.comm = *comm;
    if (lk_strategy_create(&sc, s) || lk_strategy_setup(*s, n->params, n->names, 4, NULL, 0)) return 2;
    return 0;
}

static int uneven_rank(int rank, int world, bool join) {
    net n;
    lk_comm *comm;
    lk_strategy *s;
    int rc = open_rank(&n, 5, &comm, &s);
    int steps = 3 + 2 * rank;
    for (int t = 1; !rc && t <= steps; t++) {
        bool done;
        if (join && lk_strategy_join_step(s, true, &done)) rc = 3;
        lk_strategy_begin_backward(s, true);
        if (!rc && (micro_step(&n, (int64_t)(t * world + rank) * B, B) || lk_strategy_finish_backward(s))) rc = 4;
        if (!rc) {
            adam_step(&n, t);
            lk_strategy_zero_grad(s);
        }
    }
    if (!rc && join && lk_strategy_join(s)) rc = 5;
    if (!rc && !join) { /* the ranks with fewer steps move on to a barrier */
        if (lk_comm_barrier(comm)) rc = 6;
    }
    if (rc >= 4) fprintf(stderr, "rank %d: %s\n", rank, lk_last_error());
    /* rank 0 reports a checksum of its parameters on stdout for the parent */
    if (!rc) {
        double sum = 0;
        for (int i = 0; i < 4; i++)
            for (int64_t k = 0; k < n.params[i]->numel; k++) sum += ((float *)n.params[i]->data)[k] * (double)(k % 7 + 1);
        printf("checksum rank %d %.17g\n", rank, sum);
        fflush(stdout);
    }
    lk_strategy_free(s);
    lk_comm_free(comm);
    net_free(&n);
    return rc;
}

static int run_uneven(int world, bool join, char *out, size_t outsz) {
    char job[64];
    snprintf(job, sizeof job, "lktest-join-%d-%d", (int)getpid(), join);
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pids[4];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            dup2(fds[1], 1);
            close(fds[0]);
            char buf[32];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            snprintf(buf, sizeof buf, "%d", world);
            setenv("WORLD_SIZE", buf, 1);
            setenv("LOCAL_WORLD_SIZE", buf, 1);
            setenv("LK_JOB_ID", job, 1);
            _exit(uneven_rank(r, world, join));
        }
    }
    close(fds[1]);
    size_t k = 0;
    ssize_t got;
    while (k + 1 < outsz && (got = read(fds[0], out + k, outsz - 1 - k)) > 0) k += (size_t)got;
    out[k] = 0;
    close(fds[0]);
    int failed = 0;
    for (int r = 0; r < world; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

static void uneven_inputs_join(void) {
    char out[4096];
    CHECK_MSG(run_uneven(3, true, out, sizeof out) == 0, "join: a rank failed");
    /* every replica ends with the same parameters */
    double c[3] = {0};
    int seen = 0;
    for (int r = 0; r < 3; r++) {
        char key[32];
        snprintf(key, sizeof key, "checksum rank %d ", r);
        char *p = strstr(out, key);
        if (p) c[r] = strtod(p + strlen(key), NULL), seen++;
    }
    CHECK(seen == 3 && c[0] == c[1] && c[1] == c[2]);
    /* without join the ranks that ran out are told, nobody hangs */
    CHECK_MSG(run_uneven(2, false, out, sizeof out) > 0, "without join the mismatch went unnoticed");
}

/* Overlap: every bucket but the last starts its all-reduce during
 * backward, as soon as its gradients are complete, so the communication
 * runs behind the remaining backward compute. What decides the test is
 * that order (the bucket all-reduces issued when lk_backward returns), not
 * a duration: with a communicator slowed to 25 ms per collective the
 * exposed wait is printed beside the communication time, as a figure,
 * because a loaded machine can stretch either. */
static int overlap_rank(int rank) {
    enum { L = 4, D = 768, N = 512 };
    lk_rng rng;
    lk_rng_init(&rng, 3, LK_RNG_INIT, 0, 0);
    lk_tensor *w[L], *params[L];
    const char *names[L] = {"0.weight", "1.weight", "2.weight", "3.weight"};
    for (int i = 0; i < L; i++) {
        w[i] = lk_tensor_randn(&rng, LK_SHAPE(D, D), 0, 0.03f);
        lk_tensor_set_requires_grad(w[i], true);
        params[i] = w[i];
    }
    lk_tensor *x = lk_tensor_randn(&rng, LK_SHAPE(N, D), 0, 1);
    lk_comm_config cc = lk_comm_config_default();
    cc.timeout_s = 20;
    lk_comm *comm = NULL;
    if (lk_comm_create(&cc, &comm)) return 2;
    lk_strategy_config sc = lk_strategy_config_default();
    sc.comm = comm;
    lk_ddp_options ddp = lk_ddp_options_default();
    ddp.bucket_cap_mb = (double)D * D * 4 / (1024.0 * 1024.0); /* one layer per bucket */
    sc.ddp = &ddp;
    lk_strategy *s = NULL;
    int rc = 0;
    if (lk_strategy_create(&sc, &s) || lk_strategy_setup(s, params, names, L, NULL, 0)) rc = 3;
    double exposed = 0, backward = 0;
    const int steps = 3;
    for (int t = 0; !rc && t < steps; t++) {
        uint64_t issued0 = lk_strategy_get_stats(s).allreduce_calls;
        lk_scope_begin();
        lk_tensor *h = x;
        for (int i = 0; i < L; i++) h = lk_tanh(lk_linear(h, w[i], NULL));
        lk_tensor *loss = lk_mean(lk_mul(h, h), NULL, 0, false);
        lk_strategy_begin_backward(s, true);
        double t0 = lk_time_now();
        if (lk_backward(loss)) rc = 4;
        double t1 = lk_time_now();
        /* L - 1 buckets started inside backward, the last one left to finish_backward */
        uint64_t during = lk_strategy_get_stats(s).allreduce_calls - issued0;
        if (!rc && during != L - 1) {
            fprintf(stderr, "rank %d step %d: %llu of %d bucket all-reduces started during backward (expected %d)\n",
                    rank, t, (unsigned long long)during, L, L - 1);
            rc = 7;
        }
        if (!rc && lk_strategy_finish_backward(s)) rc = 5;
        if (!rc && lk_strategy_get_stats(s).allreduce_calls - issued0 != L) rc = 9;
        double t2 = lk_time_now();
        lk_scope_end();
        if (t > 0) { /* the first step warms up */
            backward += t1 - t0;
            exposed += t2 - t1;
        }
        lk_strategy_zero_grad(s);
    }
    /* A rank that finishes backward early also waits for its peer; the
     * step's exposed communication is what the last rank to finish waits:
     * the smallest wait over the ranks. */
    if (!rc && lk_comm_all_reduce(comm, &exposed, 1, LK_F64, LK_REDUCE_MIN)) rc = 8;
    lk_strategy_stats st = lk_strategy_get_stats(s);
    double comm_time = 0.025 * L * (steps - 1); /* the injected delay alone */
    if (rank == 0)
        printf("overlap: %d buckets, backward %.1f ms/step, communication >= %.1f ms/step, exposed %.1f ms/step\n",
               st.buckets, 1e3 * backward / (steps - 1), 1e3 * comm_time / (steps - 1), 1e3 * exposed / (steps - 1));
    fflush(stdout);
    if (!rc && st.buckets != L) rc = 6;
    if (rc) fprintf(stderr, "rank %d: overlap rc %d: %s\n", rank, rc, lk_last_error());
    lk_strategy_free(s);
    lk_comm_free(comm);
    for (int i = 0; i < L; i++) lk_tensor_release(w[i]);
    lk_tensor_release(x);
    return rc;
}

/* Forks two ranks running fn; returns how many failed. delay_ms (or NULL)
 * slows every collective (LK_COMM_TEST_DELAY_MS). */
static int run_pair(const char *name, int (*fn)(int rank), const char *delay_ms) {
    char job[64];
    snprintf(job, sizeof job, "lktest-%s-%d", name, (int)getpid());
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char buf[8];
            snprintf(buf, sizeof buf, "%d", r);
            setenv("RANK", buf, 1);
            setenv("LOCAL_RANK", buf, 1);
            setenv("WORLD_SIZE", "2", 1);
            setenv("LOCAL_WORLD_SIZE", "2", 1);
            setenv("LK_JOB_ID", job, 1);
            if (delay_ms) setenv("LK_COMM_TEST_DELAY_MS", delay_ms, 1);
            lk_set_num_threads(1);
            _exit(fn(r));
        }
    }
    int failed = 0;
    for (int r = 0; r < 2; r++) {
        int status;
        waitpid(pids[r], &status, 0);
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    return failed;
}

static void overlap_with_a_slow_communicator(void) {
    int failed = run_pair("overlap", overlap_rank, "25");
    CHECK_MSG(failed == 0, "%d rank(s) failed the overlap check", failed);
}

/* A straggler: rank 1 reaches the gradient all-reduce 100 ms after rank 0
 * in every step. Rank 0's exposed communication is then mostly waiting for
 * it, and the strategy says so (comm_straggler_*); rank 1 waits for no one. */
static int straggler_rank(int rank) {
    net n;
    lk_comm *comm;
    lk_strategy *s;
    int rc = open_rank(&n, 20, &comm, &s);
    for (int t = 0; !rc && t < 3; t++) {
        lk_strategy_begin_backward(s, true);
        if (micro_step(&n, 0, B)) rc = 4;
        if (rank == 1) nanosleep(&(struct timespec){0, 100 * 1000000L}, NULL);
        if (!rc && lk_strategy_finish_backward(s)) rc = 5;
        lk_strategy_stats st = lk_strategy_get_stats(s);
        if (!rc && rank == 0 && !(st.comm_straggler_last_s >= 0.05 && st.comm_straggler_last_s <= st.comm_wait_last_s)) rc = 6;
        if (!rc && rank == 1 && !(st.comm_straggler_last_s < 0.05)) rc = 7;
        if (rc >= 6)
            fprintf(stderr, "rank %d step %d: waited %.1f ms for the last rank of %.1f ms exposed\n", rank, t,
                    1e3 * st.comm_straggler_last_s, 1e3 * st.comm_wait_last_s);
        lk_strategy_zero_grad(s);
    }
    if (rc && rc < 6) fprintf(stderr, "rank %d: straggler rc %d: %s\n", rank, rc, lk_last_error());
    lk_strategy_free(s);
    lk_comm_free(comm);
    net_free(&n);
    return rc;
}

static void stragglers_are_measured(void) {
    int failed = run_pair("straggler", straggler_rank, NULL);
    CHECK_MSG(failed == 0, "%d rank(s) failed the straggler check", failed);
}

LK_TEST_MAIN(LK_TEST_CASE(overlap_with_a_slow_communicator), LK_TEST_CASE(uneven_inputs_join), LK_TEST_CASE(ddp_equals_single), LK_TEST_CASE(accumulation_reduces_once_per_step), LK_TEST_CASE(compressed_gradients), LK_TEST_CASE(shared_params_equal_replicas), LK_TEST_CASE(stragglers_are_measured), LK_TEST_CASE(bad_config))
