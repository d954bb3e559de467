/* lk_batch_norm_relu, the CPU's batch norm with the ReLU in its passes,
 * against what it replaces: lk_relu(lk_batch_norm(...)). Bit for bit —
 * the output, the running statistics, and the gradients of x, weight and
 * bias — for f32 activations and for bf16/f16 ones with f32 per-channel
 * vectors (the mixed precisions), in training and eval, on shapes with
 * kernel tails, 7x7 and 28x28 planes and one large enough to be cut across
 * the compute threads (run at 1 and 2 threads). Eval runs put exact zeros
 * in the batch norm's output (x = 0 where the bias is 0) so the ReLU's
 * mask at 0 is exercised. A 16-bit weight (bf16-true), which takes the two
 * ops, and the layers: a BatchNorm2d fused with lk_layer_batch_norm_fuse_relu
 * against an unfused BatchNorm2d + ReLU pair, forward and backward; and
 * lk_add_relu (a residual block's end) against lk_relu(lk_add(...)). */
#include "lk_test.h"
#include "lockstep/nn.h"

static uint64_t seed = 23;
static float draw(void) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 40) / (double)(1ull << 24)) * 4.0f - 1.5f;
}

static bool same_bits(const lk_tensor *a, const lk_tensor *b) {
    return a && b && a->dtype == b->dtype && a->numel == b->numel &&
           memcmp(a->data, b->data, lk_tensor_nbytes(a)) == 0;
}

typedef struct {
    lk_tensor *y, *dx, *dw, *db, *rm, *rv;
} run_out;

/* One forward and backward: loss = sum(y * r). */
static run_out run(bool fused, lk_tensor *x0, lk_tensor *w0, lk_tensor *b0, lk_tensor *rm0, lk_tensor *rv0,
                   lk_tensor *r, bool training) {
    run_out o = {0};
    lk_tensor *x = lk_tensor_clone(x0), *w = lk_tensor_clone(w0), *b = lk_tensor_clone(b0);
    o.rm = lk_tensor_clone(rm0), o.rv = lk_tensor_clone(rv0);
    lk_tensor_set_requires_grad(x, true), lk_tensor_set_requires_grad(w, true), lk_tensor_set_requires_grad(b, true);
    lk_scope_begin();
    lk_tensor *y = fused ? lk_batch_norm_relu(x, o.rm, o.rv, w, b, training, 0.1f, 1e-5f)
                         : lk_relu(lk_batch_norm(x, o.rm, o.rv, w, b, training, 0.1f, 1e-5f));
    lk_tensor *loss = y ? lk_sum(lk_mul(y, r), NULL, 0, false) : NULL;
    CHECK_MSG(loss != NULL, "%s", lk_last_error());
    if (loss) CHECK_OK(lk_backward(loss));
    o.y = y ? lk_tensor_clone(y) : NULL;
    lk_scope_end();
    o.dx = x->grad ? lk_tensor_clone(x->grad) : NULL;
    o.dw = w->grad ? lk_tensor_clone(w->grad) : NULL;
    o.db = b->grad ? lk_tensor_clone(b->grad) : NULL;
    lk_tensor_release(x), lk_tensor_release(w), lk_tensor_release(b);
    return o;
}

static void out_free(run_out *o) {
    lk_tensor *t[] = {o->y, o->dx, o->dw, o->db, o->rm, o->rv};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) lk_tensor_release(t[i]);
}

static int check(lk_dtype dt, lk_dtype vt, long N, long C, long S, bool training) {
    size_t n = (size_t)(N * C * S);
    float *xf = malloc(n * 4), *rf = malloc(n * 4), w[64], b[64], rm[64], rv[64];
    CHECK(C <= 64 && xf && rf);
    for (size_t i = 0; i < n; i++) xf[i] = draw() + 0.25f, rf[i] = draw();
    for (long c = 0; c < C; c++) {
        w[c] = 0.5f + 0.1f * (float)c, b[c] = c == 0 ? 0.0f : 0.25f * (float)c - 1.0f;
        rm[c] = c == 0 ? 0.0f : 0.1f * (float)c, rv[c] = 1.0f + 0.05f * (float)c;
    }
    for (size_t i = 0; i < n; i += 3) xf[i] = 0.0f; /* channel 0 in eval: bn(x) exactly 0 there */
    int64_t shape[3] = {N, C, S}, cs[1] = {C};
    lk_tensor *xs = lk_tensor_from_data(LK_F32, 3, shape, xf), *rs = lk_tensor_from_data(LK_F32, 3, shape, rf);
    lk_tensor *x = lk_tensor_cast(xs, dt), *r = lk_tensor_cast(rs, dt);
    lk_tensor *ws = lk_tensor_from_data(LK_F32, 1, cs, w), *bs = lk_tensor_from_data(LK_F32, 1, cs, b);
    lk_tensor *wt = lk_tensor_cast(ws, vt), *bt = lk_tensor_cast(bs, vt);
    lk_tensor *rmt = lk_tensor_from_data(LK_F32, 1, cs, rm), *rvt = lk_tensor_from_data(LK_F32, 1, cs, rv);
    run_out a = run(false, x, wt, bt, rmt, rvt, r, training), f = run(true, x, wt, bt, rmt, rvt, r, training);
    const char *what = !same_bits(a.y, f.y)                              ? "y"
                       : !same_bits(a.dx, f.dx)                          ? "dx"
                       : !same_bits(a.dw, f.dw) || !same_bits(a.db, f.db) ? "dw or db"
                       : !same_bits(a.rm, f.rm) || !same_bits(a.rv, f.rv) ? "running statistics"
                                                                          : NULL;
    CHECK_MSG(!what, "%s x, %s vectors [%ld, %ld, %ld] %s at %d threads: %s of batch_norm_relu differs from relu(batch_norm)",
              lk_dtype_name(dt), lk_dtype_name(vt), N, C, S, training ? "training" : "eval", lk_get_num_threads(),
              what ? what : "");
    /* the ReLU did something: some outputs are 0, some not (beyond the 6-element case) */
    int zeros = 0;
    for (int64_t i = 0; a.y && i < a.y->numel; i++) zeros += lk_tensor_get(a.y, i) == 0.0;
    CHECK(n < 64 || (a.y && zeros > 0 && zeros < a.y->numel));
    out_free(&a), out_free(&f);
    lk_tensor *t[] = {xs, rs, x, r, ws, bs, wt, bt, rmt, rvt};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) lk_tensor_release(t[i]);
    free(xf), free(rf);
    return 1;
}

static void matches_relu_of_batch_norm(void) {
    static const long shapes[][3] = {{3, 5, 37}, {2, 3, 1}, {16, 32, 49}, {16, 8, 784}, {8, 4, 8300}};
    static const lk_dtype dts[] = {LK_F32, LK_BF16, LK_F16};
    int cases = 0;
    for (int threads = 1; threads <= 2; threads++) {
        lk_set_num_threads(threads);
        for (size_t d = 0; d < 3; d++)
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                for (int tr = 0; tr < 2; tr++) cases += check(dts[d], LK_F32, shapes[i][0], shapes[i][1], shapes[i][2], tr);
    }
    /* bf16-true: 16-bit weight and bias, the two ops */
    for (int tr = 0; tr < 2; tr++) cases += check(LK_BF16, LK_BF16, 4, 6, 49, tr);
    printf("%d batch_norm_relu cases checked bit for bit against relu(batch_norm)\n", cases);
}

/* A BatchNorm2d fused with its ReLU against the unfused pair, same parameters. */
static void fused_layer_matches_the_pair(void) {
    lk_layer *bn[2] = {lk_batch_norm2d_create(6, 1e-5f, 0.1f, true, true), lk_batch_norm2d_create(6, 1e-5f, 0.1f, true, true)};
    lk_layer *relu[2] = {lk_relu_create(), lk_relu_create()};
    CHECK(bn[0] && bn[1] && relu[0] && relu[1]);
    CHECK_OK(lk_layer_batch_norm_fuse_relu(bn[1], relu[1]));
    /* the wrong layers are refused, naming what was given */
    CHECK(lk_layer_batch_norm_fuse_relu(relu[0], NULL) == LK_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(lk_last_error(), "expected a BatchNorm") != NULL);
    CHECK(lk_layer_batch_norm_fuse_relu(bn[0], bn[0]) == LK_STATUS_INVALID_ARGUMENT);
    int64_t shape[4] = {4, 6, 5, 5};
    float xf[4 * 6 * 25];
    for (int i = 0; i < 4 * 6 * 25; i++) xf[i] = draw();
    lk_tensor *x0 = lk_tensor_from_data(LK_F32, 4, shape, xf);
    lk_tensor *y[2] = {0}, *dx[2] = {0};
    for (int k = 0; k < 2; k++) {
        lk_tensor *w = lk_layer_param(bn[k], 0), *b = lk_layer_param(bn[k], 1);
        for (int c = 0; c < 6; c++) {
            ((float *)w->data)[c] = 0.5f + 0.1f * (float)c;
            ((float *)b->data)[c] = 0.2f * (float)c - 0.5f;
        }
        lk_tensor *x = lk_tensor_clone(x0);
        lk_tensor_set_requires_grad(x, true);
        lk_scope_begin();
        lk_tensor *out = lk_layer_forward(relu[k], lk_layer_forward(bn[k], x));
        lk_tensor *loss = out ? lk_sum(lk_mul(out, out), NULL, 0, false) : NULL;
        CHECK_MSG(loss != NULL, "%s", lk_last_error());
        if (loss) CHECK_OK(lk_backward(loss));
        y[k] = out ? lk_tensor_clone(out) : NULL;
        lk_scope_end();
        dx[k] = x->grad ? lk_tensor_clone(x->grad) : NULL;
        lk_tensor_release(x);
    }
    CHECK(same_bits(y[0], y[1]) && same_bits(dx[0], dx[1]));
    for (int p = 0; p < 2; p++) {
        lk_tensor *g0 = lk_layer_param(bn[0], p)->grad, *g1 = lk_layer_param(bn[1], p)->grad;
        CHECK(same_bits(g0, g1));
    }
    for (int p = 0; p < 2; p++) CHECK(same_bits(lk_layer_buffer(bn[0], p), lk_layer_buffer(bn[1], p)));
    for (int k = 0; k < 2; k++) {
        lk_tensor_release(y[k]), lk_tensor_release(dx[k]);
        lk_layer_free(bn[k]), lk_layer_free(relu[k]);
    }
    lk_tensor_release(x0);
}

/* lk_add_relu against lk_relu(lk_add(...)): output and both gradients, a
 * same-shape add (the residual block's) and a broadcast one, with exact
 * zeros in the sum (b = -a at every 5th element). */
static void add_relu_matches_relu_of_add(void) {
    static const lk_dtype dts[] = {LK_F32, LK_BF16, LK_F16};
    int cases = 0;
    for (size_t d = 0; d < 3; d++)
        for (int bc = 0; bc < 2; bc++) {
            int64_t sa[4] = {4, 3, 9, 11}, sb[4] = {4, 3, 9, bc ? 1 : 11};
            int64_t na = 4 * 3 * 9 * 11, nb = bc ? 4 * 3 * 9 : na;
            float *af = malloc((size_t)na * 4), *bf = malloc((size_t)nb * 4), *rf = malloc((size_t)na * 4);
            for (int64_t i = 0; i < na; i++) af[i] = draw(), rf[i] = draw();
            for (int64_t i = 0; i < nb; i++) bf[i] = bc ? draw() : (i % 5 ? draw() : -af[i]);
            lk_tensor *as = lk_tensor_from_data(LK_F32, 4, sa, af), *bs = lk_tensor_from_data(LK_F32, 4, sb, bf);
            lk_tensor *rs = lk_tensor_from_data(LK_F32, 4, sa, rf);
            lk_tensor *a0 = lk_tensor_cast(as, dts[d]), *b0 = lk_tensor_cast(bs, dts[d]), *r = lk_tensor_cast(rs, dts[d]);
            lk_tensor *y[2] = {0}, *da[2] = {0}, *db[2] = {0};
            for (int k = 0; k < 2; k++) {
                lk_tensor *a = lk_tensor_clone(a0), *b = lk_tensor_clone(b0);
                lk_tensor_set_requires_grad(a, true), lk_tensor_set_requires_grad(b, true);
                lk_scope_begin();
                lk_tensor *out = k ? lk_add_relu(a, b) : lk_relu(lk_add(a, b));
                lk_tensor *loss = out ? lk_sum(lk_mul(out, r), NULL, 0, false) : NULL;
                CHECK_MSG(loss != NULL, "%s", lk_last_error());
                if (loss) CHECK_OK(lk_backward(loss));
                y[k] = out ? lk_tensor_clone(out) : NULL;
                lk_scope_end();
                da[k] = a->grad ? lk_tensor_clone(a->grad) : NULL;
                db[k] = b->grad ? lk_tensor_clone(b->grad) : NULL;
                lk_tensor_release(a), lk_tensor_release(b);
            }
            CHECK_MSG(same_bits(y[0], y[1]) && same_bits(da[0], da[1]) && same_bits(db[0], db[1]),
                      "%s add_relu%s: differs from relu(add)", lk_dtype_name(dts[d]), bc ? " (broadcast)" : "");
            int zeros = 0;
            for (int64_t i = 0; y[0] && i < y[0]->numel; i++) zeros += lk_tensor_get(y[0], i) == 0.0;
            CHECK(y[0] && zeros > 0 && zeros < y[0]->numel);
            lk_tensor *t[] = {as, bs, rs, a0, b0, r, y[0], y[1], da[0], da[1], db[0], db[1]};
            for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) lk_tensor_release(t[i]);
            free(af), free(bf), free(rf);
            cases++;
        }
    printf("%d add_relu cases checked bit for bit against relu(add)\n", cases);
}

LK_TEST_MAIN(LK_TEST_CASE(matches_relu_of_batch_norm), LK_TEST_CASE(fused_layer_matches_the_pair),
             LK_TEST_CASE(add_relu_matches_relu_of_add))
