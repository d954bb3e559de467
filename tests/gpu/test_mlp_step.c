/* A probe for GPU training: one mlp step (linear, relu, linear,
 * cross-entropy, backward) with every tensor on cuda:0, against the same
 * step on the CPU — loss and every gradient. The cuda backend has kernels for
 * each descriptor this step issues (gpu_ops checks them one by one); what
 * this adds is the autograd layer around them: an op that still reads or
 * writes tensor memory from the host would crash here (device memory is not
 * host-addressable). The step runs in a child process so that such a crash
 * is reported as a failure naming the signal, not a lost test. The default
 * device stays the CPU: the tensors are moved, and the ops follow them, as a
 * torch user's code does.
 *
 * Tolerance: the GEMMs are cuBLASLt's (another summation order than
 * OpenBLAS, K <= 64): 1e-5 relative plus 1e-5 of the largest magnitude, as
 * gpu_ops' T_GEMM. */
#include <unistd.h>

#include "gpu_test.h"
#include "lk_test.h"

static const lk_device gpu0 = {LK_CUDA, 0};

enum { B = 64, IN = 20, HID = 32, OUT = 10, NPAR = 4 };

typedef struct {
    float loss;
    lk_tensor *grads[NPAR]; /* on the CPU */
} step_result;

/* The step on dev over copies of the CPU tensors params[] and x, target. */
static int step(lk_device dev, lk_tensor *const *params, lk_tensor *x, lk_tensor *target, step_result *r) {
    lk_tensor *p[NPAR], *xd = lk_tensor_to(x, dev), *td = lk_tensor_to(target, dev);
    for (int i = 0; i < NPAR; i++) {
        p[i] = lk_tensor_to(params[i], dev);
        if (!p[i]) return fprintf(stderr, "param %d to device: %s\n", i, lk_last_error()), 1;
        lk_tensor_set_requires_grad(p[i], true);
    }
    if (!xd || !td) return fprintf(stderr, "batch to device: %s\n", lk_last_error()), 1;
    lk_tensor *h = lk_relu(lk_linear(xd, p[0], p[1]));
    lk_tensor *loss = h ? lk_cross_entropy(lk_linear(h, p[2], p[3]), td, NULL) : NULL;
    if (!loss) return fprintf(stderr, "forward on the device: %s\n", lk_last_error()), 1;
    if (lk_backward(loss)) return fprintf(stderr, "backward on the device: %s\n", lk_last_error()), 1;
    if (!lk_device_equal(loss->device, dev)) return fprintf(stderr, "the loss is not on the step's device\n"), 1;
    if (lk_device_synchronize(dev)) return fprintf(stderr, "synchronize: %s\n", lk_last_error()), 1;
    lk_tensor *lh = lk_tensor_to(loss, LK_DEVICE_CPU);
    if (!lh) return fprintf(stderr, "loss to host: %s\n", lk_last_error()), 1;
    r->loss = ((float *)lh->data)[0];
    lk_tensor_release(lh);
    for (int i = 0; i < NPAR; i++) {
        if (!p[i]->grad) return fprintf(stderr, "param %d has no gradient\n", i), 1;
        r->grads[i] = lk_tensor_to(p[i]->grad, LK_DEVICE_CPU);
        if (!r->grads[i]) return fprintf(stderr, "gradient %d to host: %s\n", i, lk_last_error()), 1;
    }
    /* the graph and the device tensors are released with the process */
    return 0;
}

static int probe(void) {
    gpu_test_require();
    lk_rng rng;
    lk_rng_init(&rng, 7, 0, 0, 0);
    lk_tensor *params[NPAR] = {lk_tensor_randn(&rng, 2, (int64_t[]){HID, IN}, 0, 0.3f),
                               lk_tensor_randn(&rng, 1, (int64_t[]){HID}, 0, 0.1f),
                               lk_tensor_randn(&rng, 2, (int64_t[]){OUT, HID}, 0, 0.3f),
                               lk_tensor_randn(&rng, 1, (int64_t[]){OUT}, 0, 0.1f)};
    lk_tensor *x = lk_tensor_randn(&rng, 2, (int64_t[]){B, IN}, 0, 1);
    int64_t t[B];
    for (int i = 0; i < B; i++) t[i] = (i * 7 + 3) % OUT;
    lk_tensor *target = lk_tensor_from_data(LK_I64, 1, (int64_t[]){B}, t);
    step_result cpu = {0}, gpu = {0};
    if (step(LK_DEVICE_CPU, params, x, target, &cpu)) return 1;
    if (step(gpu0, params, x, target, &gpu)) return 1;
    printf("loss: cpu %.9g, gpu %.9g\n", cpu.loss, gpu.loss);
    CHECK_MSG(fabsf(gpu.loss - cpu.loss) <= 1e-5f * fabsf(cpu.loss), "loss gpu %.9g cpu %.9g", gpu.loss, cpu.loss);
    static const char *const names[NPAR] = {"w1", "b1", "w2", "b2"};
    for (int i = 0; i < NPAR; i++) {
        const float *c = cpu.grads[i]->data, *g = gpu.grads[i]->data;
        double maxref = 0;
        for (int64_t k = 0; k < cpu.grads[i]->numel; k++) maxref = fmax(maxref, fabs(c[k]));
        int64_t bad = -1;
        for (int64_t k = 0; k < cpu.grads[i]->numel && bad < 0; k++)
            if (!(fabs(g[k] - c[k]) <= 1e-5 * fabs(c[k]) + 1e-5 * maxref)) bad = k;
        CHECK_MSG(bad < 0, "grad %s[%lld]: gpu %.9g cpu %.9g", names[i], (long long)bad, bad < 0 ? 0 : g[bad],
                  bad < 0 ? 0 : c[bad]);
        if (bad < 0) printf("ok   grad %s (%lld elements)\n", names[i], (long long)cpu.grads[i]->numel);
    }
    return lk_t_failed_checks ? 1 : 0;
}

int main(void) { return gpu_test_in_child(probe, "the mlp step on cuda:0"); }
