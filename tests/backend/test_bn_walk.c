/* The CPU backend's f32 batch norm (cpu/norm.c), which walks each task's
 * channels sample by sample so that every pass streams memory, against the
 * walk it replaced — one channel at a time, its planes at a stride of C
 * planes — written here over the same plane kernels (kernels/conv.h). Each
 * channel's plane sums are added in double in sample order either way, so
 * the two must agree bit for bit: outputs, batch and running statistics,
 * dx, dw and db, in training and eval, with and without the fused ReLU, on
 * shapes with kernel tails, 7x7 and 28x28 planes, and one large enough to
 * be cut across compute threads (run at 1 and 2 threads). The plane sums
 * run as vector adds where the compiler has vector types: each plane's sum
 * must still be the 8-lane scalar order, which the last case checks on its
 * own. */
#include <math.h>

#include "backend/backend_impl.h"
#include "backend/kernels.h"
#include "lk_test.h"

static uint64_t seed = 11;
static float draw(void) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 40) / (double)(1ull << 24)) * 4.0f - 1.5f;
}

/* The channel walk: forward into y, st ([mean, invstd] x C), rm, rv. */
static void ref_forward(const lk_batch_norm_params *p, const float *x, const float *w, const float *b, float *rm,
                        float *rv, float *y, float *st) {
    long N = p->N, C = p->C, S = p->S;
    double M = p->M;
    for (long c = 0; c < C; c++) {
        if (p->training) {
            double s = 0, q = 0;
            for (long i = 0; i < N; i++) s += lk_k_plane_sum(x + (i * C + c) * S, S);
            float m = (float)(s / M);
            for (long i = 0; i < N; i++) q += lk_k_plane_sqdev(x + (i * C + c) * S, S, m);
            st[c] = m;
            st[C + c] = (float)(1.0 / sqrt(q / M + (double)p->eps));
            rm[c] = (1.0f - p->momentum) * rm[c] + p->momentum * m;
            rv[c] = (1.0f - p->momentum) * rv[c] + p->momentum * (float)(q / (M - 1));
        } else {
            st[c] = rm[c];
            st[C + c] = (float)(1.0 / sqrt((double)rv[c] + (double)p->eps));
        }
        float scale = st[C + c] * w[c], shift = b[c] - st[c] * scale;
        for (long i = 0; i < N; i++) lk_k_plane_affine(x + (i * C + c) * S, S, scale, shift, y + (i * C + c) * S);
    }
}

static void ref_backward(const lk_batch_norm_params *p, const float *x, const float *g, const float *st,
                         const float *w, float *dx, float *dw, float *db) {
    long N = p->N, C = p->C, S = p->S;
    for (long c = 0; c < C; c++) {
        double sg = 0, sgx = 0;
        for (long i = 0; i < N; i++) {
            float a = 0.0f, q = 0.0f;
            lk_k_bn_backward_sums(g + (i * C + c) * S, x + (i * C + c) * S, S, st[c], &a, &q);
            sg += a, sgx += q;
        }
        float is = st[C + c], k1 = w[c] * is, k0 = 0.0f, k2 = 0.0f;
        db[c] = (float)sg;
        dw[c] = (float)(sgx * is);
        if (p->training) {
            k0 = (float)(-(double)k1 * sg / p->M);
            k2 = (float)(-(double)k1 * is * is * sgx / p->M);
        }
        for (long i = 0; i < N; i++)
            lk_k_bn_backward_plane(g + (i * C + c) * S, x + (i * C + c) * S, S, st[c], k0, k1, k2,
                                   dx + (i * C + c) * S);
    }
}

static int differ(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) != 0; }

/* the fused ReLU of the reference: y = max(0, y); the backward's g masked where y is not > 0 */
static void ref_relu(float *y, const float *g, float *gm, size_t n) {
    for (size_t i = 0; i < n; i++) {
        y[i] = y[i] > 0.0f ? y[i] : 0.0f;
        gm[i] = y[i] > 0.0f ? g[i] : 0.0f;
    }
}

static void check(long N, long C, long S, bool training, bool relu) {
    size_t n = (size_t)(N * C * S);
    float *x = calloc(n, 4), *g = calloc(n, 4), *gm = calloc(n, 4), *y[2] = {calloc(n, 4), calloc(n, 4)},
          *dx[2] = {calloc(n, 4), calloc(n, 4)};
    float w[64], b[64], rm[2][64], rv[2][64], st[2][128] = {{0}}, dw[2][64], db[2][64];
    CHECK(C <= 64 && x && g && gm && y[0] && y[1] && dx[0] && dx[1]);
    for (size_t i = 0; i < n; i++) x[i] = draw() + 0.5f, g[i] = draw() * 1e-2f;
    for (long c = 0; c < C; c++) {
        w[c] = 0.5f + 0.1f * (float)c, b[c] = 0.25f * (float)c - 1.0f;
        for (int k = 0; k < 2; k++) rm[k][c] = 0.1f * (float)c, rv[k][c] = 1.0f + 0.05f * (float)c;
    }
    lk_batch_norm_params p = {N, C, S, (double)(N * S), 1e-5f, 0.1f, training, {1, 1, 1, 1}, relu};
    lk_op_desc f = {.op = LK_OP_BATCH_NORM, .dtype = {LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32}};
    f.batch_norm = p;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &f, (void *[]){x, w, b, rm[0], rv[0], y[0], st[0]}));
    lk_op_desc d = {.op = LK_OP_BATCH_NORM_BACKWARD,
                    .dtype = {LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32}};
    d.batch_norm = p;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){x, g, st[0], w, dx[0], dw[0], db[0], y[0]}));
    ref_forward(&p, x, w, b, rm[1], rv[1], y[1], st[1]);
    if (relu) ref_relu(y[1], g, gm, n);
    ref_backward(&p, x, relu ? gm : g, st[1], w, dx[1], dw[1], db[1]);
    const char *what = differ(y[0], y[1], n)                                                  ? "y"
                       : differ(dx[0], dx[1], n)                                              ? "dx"
                       : differ(st[0], st[1], 2 * (size_t)C)                                  ? "batch statistics"
                       : differ(rm[0], rm[1], (size_t)C) || differ(rv[0], rv[1], (size_t)C) ? "running statistics"
                       : differ(dw[0], dw[1], (size_t)C) || differ(db[0], db[1], (size_t)C) ? "dw or db"
                                                                                              : NULL;
    CHECK_MSG(!what, "f32 [%ld, %ld, %ld] %s%s at %d threads: %s differs from the channel walk", N, C, S,
              training ? "training" : "eval", relu ? " + relu" : "", lk_get_num_threads(), what);
    free(x), free(g), free(gm), free(y[0]), free(y[1]), free(dx[0]), free(dx[1]);
}

static void matches_the_channel_walk(void) {
    static const long shapes[][3] = {{3, 5, 37}, {2, 3, 1}, {16, 32, 49}, {16, 8, 784}, {8, 4, 8300}};
    int cases = 0;
    for (int threads = 1; threads <= 2; threads++) {
        lk_set_num_threads(threads);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int tr = 0; tr < 2; tr++)
                for (int relu = 0; relu < 2; relu++) check(shapes[i][0], shapes[i][1], shapes[i][2], tr, relu), cases++;
    }
    printf("%d f32 batch-norm cases checked bit for bit against the channel walk\n", cases);
}

/* The plane kernels' sums, however a host compiler runs them (kernels/conv.h
 * sums in vectors where it can), against the 8-lane order written out. */
static void plane_sums_keep_the_lane_order(void) {
    float x[203], g[203];
    for (int i = 0; i < 203; i++) x[i] = draw() * 3.0f + 0.7f, g[i] = draw();
    for (long S = 0; S <= 203; S += 7) {
        float a[8] = {0}, q[8] = {0}, ga[8] = {0}, gq[8] = {0}, ts = 0, tq = 0, tg = 0, tgq = 0, m = 0.3f;
        long i = 0;
        for (; i + 8 <= S; i += 8)
            for (int k = 0; k < 8; k++) {
                a[k] += x[i + k];
                q[k] += (x[i + k] - m) * (x[i + k] - m);
                ga[k] += g[i + k];
                gq[k] += g[i + k] * (x[i + k] - m);
            }
        for (; i < S; i++) ts += x[i], tq += (x[i] - m) * (x[i] - m), tg += g[i], tgq += g[i] * (x[i] - m);
        float s0 = 0, s1 = 0;
        lk_k_bn_backward_sums(g, x, S, m, &s0, &s1);
        CHECK(lk_k_plane_sum(x, S) == ts + ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
        CHECK(lk_k_plane_sqdev(x, S, m) == tq + ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7])));
        CHECK(s0 == tg + ((ga[0] + ga[1]) + (ga[2] + ga[3])) + ((ga[4] + ga[5]) + (ga[6] + ga[7])));
        CHECK(s1 == tgq + ((gq[0] + gq[1]) + (gq[2] + gq[3])) + ((gq[4] + gq[5]) + (gq[6] + gq[7])));
    }
}

LK_TEST_MAIN(LK_TEST_CASE(matches_the_channel_walk), LK_TEST_CASE(plane_sums_keep_the_lane_order))
