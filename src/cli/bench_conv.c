/* `lockstep bench ops --conv`: conv2d's two CPU paths, oneDNN's
 * convolutions and im2col + GEMM (LK_CONV), timed on the ResNet-20 (width
 * 8, 28x28) and cnn (32/64 channels) layer shapes, forward alone and
 * forward + backward (dX, dW and db, as a training step runs them), at
 * batch 64 and 256, on 1 and N compute threads, in f32 and, where oneDNN
 * runs bf16 on bf16 units, under bf16 autocast. The two paths alternate
 * (im2col, oneDNN, im2col, oneDNN) and each keeps its faster round, so a
 * shared machine's noise falls on both. A benchmark, never a test. */
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "cli/cli.h"
#include "lockstep.h"

typedef struct {
    lk_tensor *x, *w, *b, *gy;
    lk_conv2d_params p;
    lk_dtype autocast;
    bool backward;
} conv_bench;

static void conv_step(conv_bench *c) {
    lk_scope_begin();
    if (c->autocast != LK_F32) lk_autocast_enter(c->autocast);
    lk_tensor *y = lk_conv2d(c->x, c->w, c->b, c->p);
    if (c->autocast != LK_F32) lk_autocast_exit();
    if (!y) lk_panic("bench conv: %s", lk_last_error());
    if (c->backward && lk_backward_with(y, c->gy)) lk_panic("bench conv backward: %s", lk_last_error());
    lk_scope_end();
}

/* Median seconds of one call over 5 rounds of about budget/5 seconds. */
static double conv_time(conv_bench *c, double budget) {
    conv_step(c); /* warm-up: primitives, scratch */
    double t0 = lk_time_now();
    conv_step(c);
    double one = lk_time_now() - t0;
    int reps = one > 0 ? (int)(budget / 5 / one) : 10;
    if (reps < 2) reps = 2;
    double r[5];
    for (int k = 0; k < 5; k++) {
        t0 = lk_time_now();
        for (int i = 0; i < reps; i++) conv_step(c);
        r[k] = (lk_time_now() - t0) / reps;
    }
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && r[j] < r[j - 1]; j--) {
            double t = r[j];
            r[j] = r[j - 1], r[j - 1] = t;
        }
    return r[2];
}

void lk__bench_conv_table(double budget) {
    static const struct {
        const char *what;
        int C, H, O, k, s, pad;
        bool bias;
    } shapes[] = {
        {"resnet conv1 (stem)", 1, 28, 8, 3, 1, 1, false},
        {"resnet layer1 3x3", 8, 28, 8, 3, 1, 1, false},
        {"resnet layer2.0.conv1 /2", 8, 28, 16, 3, 2, 1, false},
        {"resnet layer2.0.downsample", 8, 28, 16, 1, 2, 0, false},
        {"resnet layer2 3x3", 16, 14, 16, 3, 1, 1, false},
        {"resnet layer3.0.conv1 /2", 16, 14, 32, 3, 2, 1, false},
        {"resnet layer3.0.downsample", 16, 14, 32, 1, 2, 0, false},
        {"resnet layer3 3x3", 32, 7, 32, 3, 1, 1, false},
        {"cnn conv1", 1, 28, 32, 3, 1, 1, true},
        {"cnn conv2", 32, 14, 64, 3, 1, 1, true},
    };
    static const int batches[] = {64, 256};
    int threads = lk_get_num_threads();
    bool bf16 = lk__cpu_lowp_dnnl_on() && lk__cpu_gemm_native(LK_BF16); /* oneDNN's own bf16 code here */
    printf("\nconv2d, im2col + GEMM vs oneDNN (ms per call, median of 5 rounds; fwd: forward, f+b: forward + "
           "backward for dX, dW, db)%s\n",
           bf16 ? "" : "; bf16: this CPU has no bf16 units for oneDNN, f32 only");
    printf("%-28s %-10s %5s %3s %9s %9s %9s %9s %7s %7s  %s\n", "layer (C->O, HxW, k/s)", "dtype", "batch", "thr",
           "fwd i2c", "fwd dnnl", "f+b i2c", "f+b dnnl", "fwd x", "f+b x", "oneDNN impl (fwd/bwd-d/bwd-w)");
    lk_rng rng;
    lk_rng_init(&rng, 3, LK_RNG_USER, 0, 0);
    int prev_path = lk__cpu_conv_path();
    for (int dt = 0; dt < (bf16 ? 2 : 1); dt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int bi = 0; bi < 2; bi++)
                for (int th = 1; th <= threads; th = th < threads ? threads : th + 1) {
                    lk_set_num_threads(th);
                    int N = batches[bi], C = shapes[s].C, H = shapes[s].H, O = shapes[s].O, k = shapes[s].k;
                    conv_bench c = {0};
                    c.p = (lk_conv2d_params){{shapes[s].s, shapes[s].s}, {shapes[s].pad, shapes[s].pad}, {1, 1}, 1};
                    c.autocast = dt ? LK_BF16 : LK_F32;
                    c.x = lk_tensor_randn(&rng, LK_SHAPE(N, C, H, H), 0, 1);
                    c.w = lk_tensor_randn(&rng, LK_SHAPE(O, C, k, k), 0, 0.1f);
                    c.b = shapes[s].bias ? lk_tensor_zeros(LK_F32, LK_SHAPE(O)) : NULL;
                    lk_tensor_set_requires_grad(c.x, C > 1); /* the stem's input is data: no dX */
                    lk_tensor_set_requires_grad(c.w, true);
                    if (c.b) lk_tensor_set_requires_grad(c.b, true);
                    int OH = (H + 2 * shapes[s].pad - k) / shapes[s].s + 1;
                    c.gy = lk_tensor_randn(&rng, LK_SHAPE(N, O, OH, OH), 0, 1);
                    if (dt) {
                        lk_tensor *g16 = lk_tensor_cast(c.gy, LK_BF16);
                        lk_tensor_release(c.gy);
                        c.gy = g16;
                    }
                    double t[2][2]; /* [fwd, f+b][im2col, onednn] */
                    for (int b = 0; b < 2; b++) {
                        c.backward = b;
                        double best[2] = {1e30, 1e30};
                        for (int round = 0; round < 2; round++)
                            for (int path = 0; path < 2; path++) {
                                lk__cpu_conv_use(path ? LK__CONV_ONEDNN : LK__CONV_IM2COL);
                                double v = conv_time(&c, budget / 4);
                                if (v < best[path]) best[path] = v;
                            }
                        t[b][0] = best[0], t[b][1] = best[1];
                    }
                    char impl[160];
                    lk__dnnl_conv_shape ds;
                    memset(&ds, 0, sizeof ds);
                    int n0 = N / th; /* a task's samples */
                    ds.N = n0, ds.C = C, ds.H = ds.W = H, ds.O = O, ds.kh = ds.kw = k, ds.OH = ds.OW = OH;
                    ds.sh = ds.sw = shapes[s].s, ds.ph = ds.pw = shapes[s].pad, ds.dh = ds.dw = 1, ds.G = 1;
                    ds.mul = dt ? LK_BF16 : LK_F32;
                    ds.bias_dt = ds.mul;
                    const char *name[3];
                    for (int kind = 0; kind < 3; kind++) {
                        ds.dt[0] = ds.dt[1] = ds.dt[2] = ds.mul;
                        if (kind) ds.dt[2] = LK_F32;
                        ds.bias = kind != LK__DNNL_CONV_BWD_DATA && shapes[s].bias;
                        if (kind == LK__DNNL_CONV_FWD) ds.bias_dt = ds.mul;
                        name[kind] = lk__cpu_conv_dnnl_impl(kind, &ds);
                    }
                    snprintf(impl, sizeof impl, "%s / %s / %s", name[0] ? name[0] : "-", name[1] ? name[1] : "-",
                             name[2] ? name[2] : "-");
                    char what[64];
                    snprintf(what, sizeof what, "%s", shapes[s].what);
                    printf("%-28s %-10s %5d %3d %9.3f %9.3f %9.3f %9.3f %6.2fx %6.2fx  %s\n", what,
                           dt ? "bf16-mixed" : "f32", N, th, t[0][0] * 1e3, t[0][1] * 1e3, t[1][0] * 1e3,
                           t[1][1] * 1e3, t[0][0] / t[0][1], t[1][0] / t[1][1], impl);
                    fflush(stdout);
                    lk_tensor_release(c.x);
                    lk_tensor_release(c.w);
                    lk_tensor_release(c.b);
                    lk_tensor_release(c.gy);
                    lk_set_num_threads(threads);
                }
    lk__cpu_conv_use(prev_path);
}
