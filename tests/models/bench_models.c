/* Benchmark (a program, not a timed test): forward + backward + Adam step of
 * the built-in autoencoder and mlp at batch 64/128/256 on one core, in
 * samples/s, next to the machine bound for the same work: every GEMM of the
 * step timed alone with cblas_sgemm at its exact shape and transposes, plus
 * Adam's ~28 bytes per parameter at the measured memory bandwidth.
 *
 *   build/tests/test_bench_models            full table (~1 min)
 *   build/tests/test_bench_models --quick    one short iteration (ctest runs this)
 */
#include <cblas.h>

#include "models/bench_triad.h"
#include "nn/nn_fixtures.h"

/* Process CPU time: the machine is shared (other builds and tests run
 * beside this), and with one BLAS thread CPU time is the one-core cost
 * without the time spent descheduled. Wall-clock figures are printed too. */
static double now(void) { return lk_time_cpu(); }

typedef struct {
    int M, N, K;
    bool ta, tb;
} gemm_shape;

/* Seconds for the step's GEMMs: per Linear(in, out) at batch B: forward
 * X[B,in] W^T (NT), dW = dY^T X (TN), and dX = dY W (NN) except for the
 * first layer (its input needs no gradient). */
static double measure_gemms(const int64_t *w, int n_layers, int B, bool quick, double *flops) {
    gemm_shape s[64];
    int ns = 0;
    *flops = 0;
    for (int l = 0; l < n_layers; l++) {
        int in = (int)w[l], out = (int)w[l + 1];
        s[ns++] = (gemm_shape){B, out, in, false, true};
        s[ns++] = (gemm_shape){out, in, B, true, false};
        if (l > 0) s[ns++] = (gemm_shape){B, in, out, false, false};
    }
    size_t maxe = 0;
    for (int i = 0; i < ns; i++) {
        size_t e[3] = {(size_t)s[i].M * s[i].K, (size_t)s[i].K * s[i].N, (size_t)s[i].M * s[i].N};
        for (int k = 0; k < 3; k++) maxe = e[k] > maxe ? e[k] : maxe;
    }
    float *A = lk_aligned_alloc(64, maxe * 4), *Bm = lk_aligned_alloc(64, maxe * 4), *C = lk_aligned_alloc(64, maxe * 4);
    nn_hfill(A, (int64_t)maxe, 1, -1, 1);
    nn_hfill(Bm, (int64_t)maxe, 2, -1, 1);
    double best = 1e30;
    for (int r = 0; r < (quick ? 1 : 20); r++) {
        double t0 = now();
        for (int i = 0; i < ns; i++) {
            const gemm_shape *g = &s[i];
            cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->M, g->N, g->K,
                        1.0f, A, g->ta ? g->M : g->K, Bm, g->tb ? g->K : g->N, 0.0f, C, g->N);
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    for (int i = 0; i < ns; i++) *flops += 2.0 * s[i].M * s[i].N * s[i].K;
    lk_aligned_free(A), lk_aligned_free(Bm), lk_aligned_free(C);
    return best;
}

static void bench_model(const char *model, int B, double bw, bool quick) {
    lk_layer *m = NULL;
    if (lk_model_create(model, NULL, 0, 1, &m)) {
        fprintf(stderr, "%s\n", lk_last_error());
        return;
    }
    const lk_model_info *info = lk_model_find(model);
    lk_tensor *fp = NULL, *fg = NULL;
    lk_named_tensors ps = {0};
    CHECK_OK(lk_params_flatten(m, NULL, &fp, &fg));
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    lk_optim_config cfg = lk_adam_config_default();
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(&cfg, &ps, &o));
    int64_t P = lk_layer_num_parameters(m);
    /* widths of the Linear chain, in order */
    int64_t w[32];
    int nl = 0;
    for (int i = 0; i < ps.n; i++)
        if (ps.items[i].tensor->ndim == 2) {
            if (nl == 0) w[nl++] = ps.items[i].tensor->shape[1];
            w[nl++] = ps.items[i].tensor->shape[0];
        }
    lk_tensor *x = nn_htensor(5, 0, 1, LK_SHAPE(B, 784));
    lk_tensor *y = info->target_is_input ? NULL : nn_hlabels(6, B, 10);
    int iters = quick ? 1 : 0;
    double t_total = 0, t_wall = 0, loss_v = 0;
    int done = 0;
    for (int it = 0; quick ? it < 2 : (t_total < 1.5 || done < 10); it++) {
        double t0 = now(), w0 = lk_time_now();
        lk_scope_begin();
        lk_tensor *loss = lk_model_loss(info, lk_layer_forward(m, x), x, y);
        lk_optimizer_zero_grad(o, false);
        lk_status st = lk_backward(loss);
        if (!st) st = lk_optimizer_step(o);
        loss_v = loss ? lk_tensor_item(loss) : NAN;
        lk_scope_end();
        if (st) {
            fprintf(stderr, "%s: %s\n", model, lk_last_error());
            break;
        }
        double t = now() - t0, tw = lk_time_now() - w0;
        if (it >= 2 || quick) { /* two warm-up steps */
            t_total += t;
            t_wall += tw;
            done++;
        }
    }
    (void)iters;
    double flops;
    double t_gemm = measure_gemms(w, nl - 1, B, quick, &flops);
    double t_adam = 28.0 * (double)P / bw;
    double t_step = t_total / (done ? done : 1);
    double bound = t_gemm + t_adam;
    printf("%-12s %5d %12.0f %12.0f %7.1f%%   %8.2f %8.2f %8.3f  %7.2f  %10.0f\n", model, B, B / t_step, B / bound,
           100.0 * bound / t_step, t_step * 1e3, t_gemm * 1e3, t_adam * 1e3, flops / t_gemm * 1e-9,
           B / (t_wall / (done ? done : 1)));
    (void)loss_v;
    lk_tensor_release(x);
    lk_tensor_release(y);
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_layer_free(m);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    openblas_set_num_threads(1);
    double bw = bench_triad((size_t)8 << 20, quick ? 1 : 10);
    printf("one core, OpenBLAS %d thread(s); memory bandwidth (triad) %.1f GB/s\n", openblas_get_num_threads(), bw * 1e-9);
    printf("%-12s %5s %12s %12s %8s   %8s %8s %8s  %7s  %10s\n", "model", "batch", "samples/s", "bound/s", "of bound",
           "step ms", "gemm ms", "adam ms", "GFLOP/s", "wall smp/s");
    const char *models[] = {"autoencoder", "mlp"};
    int batches[] = {64, 128, 256};
    for (int mi = 0; mi < 2; mi++)
        for (int bi = 0; bi < (quick ? 1 : 3); bi++) bench_model(models[mi], batches[bi], bw, quick);
    return lk_t_failed_checks ? 1 : 0;
}
