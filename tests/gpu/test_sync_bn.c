/* A probe for SyncBatchNorm on a GPU: its forward and backward (BN_STATS,
 * the all-reduce, BN_APPLY, both ways) with every tensor on cuda:0, against
 * the same on the CPU — output, running statistics, and the input, weight
 * and bias gradients — for an f32 and a bf16 (autocast) input. The
 * all-reduce is a fake one of two identical ranks (every sum doubled), so
 * the count over ranks differs from this process's. ops_norm.c keeps the
 * per-channel values between the passes in device buffers and finishes
 * them on the device (BN_FINISH); the caller's function sums host doubles,
 * so the sums are staged through the host; a host read of device memory
 * would crash, so the run is in a child process and a signal is reported
 * as a failure. The kernels are the CPU's bodies (gpu_ops checks them one by
 * one); tolerance 1e-5 relative plus 1e-6 of the largest magnitude, 16-bit
 * results one bf16 ulp more.
 *
 * Runs only with a CUDA device (label gpu); has never run on one yet. */
#include <unistd.h>

#include "gpu_test.h"
#include "lk_test.h"

static const lk_device gpu0 = {LK_CUDA, 0};

enum { N = 6, C = 4, H = 5, W = 3, OUTS = 6 };

static lk_status two_ranks(void *ctx, double *v, int n) {
    (void)ctx;
    for (int i = 0; i < n; i++) v[i] *= 2.0;
    return LK_STATUS_OK;
}

/* y, running_mean, running_var, dx, dw, db on the CPU (f32) */
typedef struct {
    lk_tensor *t[OUTS];
} result;

static lk_tensor *to_cpu_f32(lk_tensor *t) {
    lk_tensor *h = t ? lk_tensor_to(t, LK_DEVICE_CPU) : NULL;
    lk_tensor *f = h ? lk_tensor_cast(h, LK_F32) : NULL;
    lk_tensor_release(h);
    return f;
}

static int run(lk_device dev, lk_dtype xt, lk_tensor *const *in, result *r) {
    if (lk_device_set_default(dev)) return fprintf(stderr, "set default: %s\n", lk_last_error()), 1;
    /* in: x, k (the loss weights), w, b, running_mean, running_var (f32, on the CPU) */
    lk_tensor *h[6], *d[6];
    for (int i = 0; i < 6; i++) {
        h[i] = i < 2 ? lk_tensor_cast(in[i], xt) : lk_tensor_clone(in[i]);
        d[i] = h[i] ? lk_tensor_to(h[i], dev) : NULL;
        if (!d[i]) return fprintf(stderr, "operand %d to %s: %s\n", i, dev.kind == LK_CUDA ? "cuda:0" : "cpu", lk_last_error()), 1;
    }
    lk_tensor_set_requires_grad(d[0], true), lk_tensor_set_requires_grad(d[2], true), lk_tensor_set_requires_grad(d[3], true);
    lk_tensor *y = lk_batch_norm_sync(d[0], d[4], d[5], d[2], d[3], true, 0.1f, 1e-5f, two_ranks, NULL);
    if (!y) return fprintf(stderr, "forward: %s\n", lk_last_error()), 1;
    if (lk_backward(lk_sum(lk_mul(y, d[1]), NULL, 0, false))) return fprintf(stderr, "backward: %s\n", lk_last_error()), 1;
    if (lk_device_synchronize(dev)) return fprintf(stderr, "synchronize: %s\n", lk_last_error()), 1;
    lk_device_set_default(LK_DEVICE_CPU);
    lk_tensor *outs[OUTS] = {y, d[4], d[5], d[0]->grad, d[2]->grad, d[3]->grad};
    for (int i = 0; i < OUTS; i++)
        if (!(r->t[i] = to_cpu_f32(outs[i]))) return fprintf(stderr, "result %d to the host: %s\n", i, lk_last_error()), 1;
    return 0; /* the device tensors go with the process */
}

static int probe(void) {
    gpu_test_require();
    lk_rng rng;
    lk_rng_init(&rng, 9, 0, 0, 0);
    lk_tensor *in[6] = {lk_tensor_randn(&rng, 4, (int64_t[]){N, C, H, W}, 0.3f, 2.0f),
                        lk_tensor_randn(&rng, 4, (int64_t[]){N, C, H, W}, 0, 1),
                        lk_tensor_randn(&rng, 1, (int64_t[]){C}, 1, 0.2f),
                        lk_tensor_randn(&rng, 1, (int64_t[]){C}, 0, 0.2f),
                        lk_tensor_randn(&rng, 1, (int64_t[]){C}, 0, 0.1f),
                        lk_tensor_randn(&rng, 1, (int64_t[]){C}, 1, 0.1f)};
    float *rv = in[5]->data;
    for (int c = 0; c < C; c++) rv[c] = fabsf(rv[c]) + 0.5f;
    static const char *const names[OUTS] = {"y", "running_mean", "running_var", "dx", "dw", "db"};
    static const lk_dtype xts[2] = {LK_F32, LK_BF16};
    for (int k = 0; k < 2; k++) {
        result cpu = {{0}}, gpu = {{0}};
        if (run(LK_DEVICE_CPU, xts[k], in, &cpu) || run(gpu0, xts[k], in, &gpu)) return 1;
        for (int i = 0; i < OUTS; i++) {
            const float *c = cpu.t[i]->data, *g = gpu.t[i]->data;
            double maxref = 0, rtol = 1e-5 + (xts[k] == LK_BF16 && (i == 0 || i == 3) ? 1.0 / 128 : 0);
            for (int64_t e = 0; e < cpu.t[i]->numel; e++) maxref = fmax(maxref, fabs(c[e]));
            int64_t bad = -1;
            for (int64_t e = 0; e < cpu.t[i]->numel && bad < 0; e++)
                if (!(fabs(g[e] - c[e]) <= rtol * fabs(c[e]) + 1e-6 * maxref)) bad = e;
            CHECK_MSG(bad < 0, "x %s: %s[%lld]: gpu %.9g cpu %.9g", lk_dtype_name(xts[k]), names[i], (long long)bad,
                      bad < 0 ? 0 : g[bad], bad < 0 ? 0 : c[bad]);
            if (bad < 0) printf("ok   x %s: %s (%lld elements)\n", lk_dtype_name(xts[k]), names[i], (long long)cpu.t[i]->numel);
        }
    }
    return lk_t_failed_checks ? 1 : 0;
}

int main(void) { return gpu_test_in_child(probe, "SyncBatchNorm on cuda:0"); }
