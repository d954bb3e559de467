/* Autocast parity: one training step of each case run by lockstep under
 * lk_autocast_enter(LK_BF16) against PyTorch 1.13's torch.autocast("cpu",
 * bfloat16) and against a float64 reference, both written by
 * tools/gen_autocast_fixtures.py into tests/fixtures/autocast/; the same step
 * under LK_F16 against the float64 reference; the bf16 step through oneDNN
 * and through the f32 fallback against each other; and the f32 step outside
 * autocast, bit for bit, against a run that never entered a region.
 *
 * Inputs and parameters are the hash values of tests/nn/nn_fixtures.h (the
 * generator computes the same ones), so only results are stored. Every
 * comparison is the normalised error ||got - want||_2 / ||want||_2 of one
 * tensor (as ggml's test-backend-ops does), against the bounds below; each
 * case prints its errors (the table in docs/PRECISION.md comes from it).
 *
 *     test_autocast                    all cases
 *     test_autocast conv2d mlp         only those
 */
#include "backend/backend_impl.h"
#include "nn/nn_fixtures.h"

#define AC_DIR LK_SOURCE_DIR "/tests/fixtures/autocast"

/* ---- tolerances ----------------------------------------------------------------------
 * Rounding an f32 to bf16 (8 significant bits) costs a relative error of at
 * most u = 2^-9 ~ 2.0e-3; f16 (11 bits): u = 2^-12 ~ 2.4e-4 (normal values).
 * A GEMM over rounded operands accumulated in f32 computes
 * sum a_i(1+d_i) b_i(1+e_i): each product is off by at most 2u relative,
 * and with independent rounding errors the sum is off by ~ sqrt(2)u times
 * ||(a_i b_i)||_2, while the sum itself is ~ ||(a_i b_i)||_2 for
 * uncorrelated data — so one GEMM's normwise error is ~ 1.4u whatever K is
 * (it grows with K only through cancellation). A gradient passes through up
 * to 3 GEMMs (forward, dX of the layers above, dW) whose errors add,
 * ~ 4.2u, and the sums over the batch in dW and db cancel (another factor
 * ~2): a bound of 8u against float64 —
 *
 *   bf16 vs float64:        8 * 2^-9  = 1.6e-2   measured <= 5.4e-3 (but see ReLU below)
 *   f16 vs float64:         8 * 2^-12 = 2.0e-3   measured <= 8.8e-4
 *
 * Like torch.autocast, lockstep's matmul/linear outputs are bf16 tensors
 * (one more rounding of every such output and, in backward, of the
 * gradients between those ops; conv2d's too, and batch norm, pooling and
 * ReLU keep them, so the cnn's activations are bf16), but the
 * element-wise ops, the bias and the summation orders differ. The two runs'
 * errors are independent, so they differ by at most the sum of both bounds:
 *
 *   bf16 vs torch autocast: 16 * 2^-9 = 3.1e-2   measured <= 7.0e-3
 *
 * A ReLU whose input lies within rounding distance of 0 can switch sides:
 * in the mlp, sample 3's unit 31 of the first layer has -2.9e-4 in float64
 * (the layer's spread is 0.32) and > 0 after bf16 rounding — in torch and in
 * lockstep alike — which moves that unit's row of the first weight's
 * gradient by O(1): 12% of the whole tensor. That is the data sitting on a
 * kink, not an arithmetic error, so against float64 a tensor may also be
 * within TORCH_FACTOR times torch.autocast's own error for the same tensor
 * (from the fixtures): lockstep is never allowed to be much less accurate
 * than PyTorch's own mixed precision. The f16 steps here flip no ReLU.
 *
 * The single-op cases' loss sum(out * R) cancels; its error is measured
 * against sum |out_i R_i| instead of |loss| (see loss_err).
 *
 * oneDNN and the f32 fallback multiply the same rounded operands and
 * accumulate in f32, so they differ only in summation order: ~ sqrt(K) *
 * 2^-24 ~ 2e-6 for K = 784 (measured <= 1e-7); bound 2e-5.
 * The f32 step against float64 is the ordinary f32 parity: bound 1e-5. */
static const double TOL_BF16_REF = 8.0 / 512;
static const double TOL_F16_REF = 8.0 / 4096;
static const double TOL_BF16_TORCH = 16.0 / 512;
static const double TORCH_FACTOR = 1.25;
static const double TOL_PATHS = 2e-5;
static const double TOL_F32_REF = 1e-5;

/* ---- cases ----------------------------------------------------------------------------
 * Seeds and shapes repeat tools/gen_autocast_fixtures.py. */

typedef enum { C_LINEAR, C_CONV, C_MODEL } case_kind;

typedef struct {
    const char *name;
    case_kind kind;
    uint64_t seed;
    int xndim;
    int64_t xshape[4];
    int wndim;
    int64_t wshape[4];
    bool bias;
    lk_conv2d_params cp;
    const char *model;
    lk_model_kv args[4];
    int nargs;
} ac_case;

#define CONV(s, p, g) .cp = {{s, s}, {p, p}, {1, 1}, g}
static const ac_case CASES[] = {
    {"linear", C_LINEAR, 1100, 2, {16, 96}, 2, {48, 96}, .bias = true},
    {"conv2d", C_CONV, 1200, 4, {4, 3, 10, 10}, 4, {8, 3, 3, 3}, .bias = true, CONV(1, 1, 1)},
    {"conv2d_1x1", C_CONV, 1300, 4, {2, 16, 6, 6}, 4, {8, 16, 1, 1}, .bias = true, CONV(1, 0, 1)},
    {"conv2d_groups", C_CONV, 1400, 4, {3, 4, 9, 9}, 4, {6, 2, 3, 3}, .bias = false, CONV(2, 0, 2)},
    {"mlp", C_MODEL, 1500, 2, {16, 784}, .model = "mlp",
     .args = {{"input_dim", "784"}, {"hidden", "64,32"}, {"num_classes", "10"}}, .nargs = 3},
    {"autoencoder", C_MODEL, 1600, 2, {8, 784}, .model = "autoencoder",
     .args = {{"input_dim", "784"}, {"hidden", "32,16"}, {"latent_dim", "8"}}, .nargs = 3},
    {"cnn", C_MODEL, 1700, 4, {6, 1, 8, 8}, .model = "cnn",
     .args = {{"image_size", "8"}, {"channels", "4,8"}, {"hidden", "16"}, {"num_classes", "10"}}, .nargs = 4},
};

#define MAX_T 16

/* One step's results, all owned: the output, the loss, and the gradients by
 * the fixtures' names ("x", "weight", "bias", or the model's parameter names). */
typedef struct {
    lk_tensor *out;
    double loss;
    double loss_abs; /* single-op cases: sum |out_i R_i|, the scale of the loss's rounding error */
    int n;
    char name[MAX_T][48];
    lk_tensor *grad[MAX_T];
} step;

static void step_free(step *s) {
    lk_tensor_release(s->out);
    for (int i = 0; i < s->n; i++) lk_tensor_release(s->grad[i]);
    memset(s, 0, sizeof *s);
}

static void step_keep(step *s, const char *name, lk_tensor *g) {
    CHECK_MSG(g != NULL, "%s: no gradient", name);
    if (!g || s->n == MAX_T) return;
    snprintf(s->name[s->n], sizeof s->name[0], "%s", name);
    s->grad[s->n++] = lk_tensor_clone(g);
}

/* How a step enters autocast. */
typedef enum {
    R_NONE,      /* no autocast call at all */
    R_REGION,    /* forward and loss inside lk_autocast_enter(dt), backward after the exit (as torch advises) */
    R_ALL,       /* backward inside the region too */
    R_BWD,       /* forward outside, only backward inside the region */
    R_NESTED_F32 /* forward inside a bf16 region's inner LK_F32 region: f32 again */
} region;

/* Runs one forward + loss + backward of case c; dt is the region's dtype. */
static bool run_step(const ac_case *c, region how, lk_dtype dt, step *s) {
    memset(s, 0, sizeof *s);
    lk_tensor *x = nn_htensor(c->seed, c->kind == C_MODEL ? 0.0 : -1.0, 1.0, c->xndim, c->xshape);
    lk_tensor *w = NULL, *b = NULL, *y = NULL;
    lk_layer *m = NULL;
    bool ok = false;
    const lk_model_info *info = NULL;
    if (c->kind == C_MODEL) {
        CHECK_OK(lk_model_create(c->model, c->args, c->nargs, 0, &m));
        if (!m) goto out;
        nn_set_hash_weights(m, c->seed + 10);
        info = lk_model_find(c->model);
        if (!info->target_is_input) y = nn_hlabels(c->seed + 1, c->xshape[0], 10);
    } else {
        int64_t fan = 1;
        for (int d = 1; d < c->wndim; d++) fan *= c->wshape[d];
        double bound = 1.0 / sqrt((double)fan);
        w = nn_htensor(c->seed + 10, -bound, bound, c->wndim, c->wshape);
        if (c->bias) b = nn_htensor(c->seed + 11, -bound, bound, 1, c->wshape);
        lk_tensor_set_requires_grad(x, true);
        lk_tensor_set_requires_grad(w, true);
        if (b) lk_tensor_set_requires_grad(b, true);
    }
    lk_scope_begin();
    if (how == R_REGION || how == R_ALL) lk_autocast_enter(dt);
    if (how == R_NESTED_F32) lk_autocast_enter(LK_BF16), lk_autocast_enter(LK_F32);
    lk_tensor *out = c->kind == C_LINEAR ? lk_linear(x, w, b)
                     : c->kind == C_CONV ? lk_conv2d(x, w, b, c->cp)
                                         : lk_layer_forward(m, x);
    lk_tensor *loss = NULL, *seed_grad = NULL;
    if (out && c->kind == C_MODEL) loss = lk_model_loss(info, out, x, y);
    if (how == R_NESTED_F32) lk_autocast_exit(), lk_autocast_exit();
    if (how == R_REGION) lk_autocast_exit();
    if (how == R_BWD) lk_autocast_enter(dt);
    ok = out && (c->kind != C_MODEL || loss);
    CHECK_MSG(ok, "%s: forward: %s", c->name, lk_last_error());
    if (ok && c->kind != C_MODEL) { /* loss = sum(out * R): dY = R */
        lk_tensor *R = nn_htensor(c->seed + 1, -1.0, 1.0, out->ndim, out->shape);
        double sum = 0, abs_sum = 0;
        lk_tensor *of = lk_tensor_cast(out, LK_F32); /* bf16/f16 under autocast, as torch's */
        for (int64_t i = 0; of && i < out->numel; i++) {
            double t = (double)((float *)of->data)[i] * ((float *)R->data)[i];
            sum += t, abs_sum += fabs(t);
        }
        lk_tensor_release(of);
        s->loss = sum;
        s->loss_abs = abs_sum;
        seed_grad = R;
        CHECK_OK(lk_backward_with(out, R));
    } else if (ok) {
        s->loss = lk_tensor_get(loss, 0);
        CHECK_OK(lk_backward(loss));
    }
    if (how == R_ALL || how == R_BWD) lk_autocast_exit();
    if (ok) s->out = lk_tensor_clone(out);
    lk_tensor_release(seed_grad);
    lk_scope_end();
    if (!ok) goto out;
    if (c->kind != C_MODEL) {
        step_keep(s, "x", x->grad);
        step_keep(s, "weight", w->grad);
        if (b) step_keep(s, "bias", b->grad);
    } else {
        lk_named_tensors ps = {0};
        CHECK_OK(lk_layer_named_parameters(m, &ps));
        for (int k = 0; k < ps.n; k++) step_keep(s, ps.items[k].name, ps.items[k].tensor->grad);
        lk_named_tensors_clear(&ps);
    }
out:
    lk_tensor_release(x);
    lk_tensor_release(w);
    lk_tensor_release(b);
    lk_tensor_release(y);
    lk_layer_free(m);
    return ok && s->out;
}

/* ---- comparisons ------------------------------------------------------------------------ */

/* ||a - b||_2 / ||b||_2 in double (b's norm floored so an all-zero b needs a ~0 a). */
static double nerr(const lk_tensor *a, const lk_tensor *b) {
    if (!a || !b || a->numel != b->numel) return INFINITY;
    double d2 = 0, b2 = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = lk_tensor_get(a, i), y = lk_tensor_get(b, i);
        d2 += (x - y) * (x - y);
        b2 += y * y;
    }
    return isnan(d2) ? INFINITY : sqrt(d2) / sqrt(b2 > 1e-60 ? b2 : 1e-60);
}

/* A gradient that is zero in exact arithmetic (its float64 reference `ref`
 * is |x| < 1e-12: the cnn's conv biases, which a training batch norm
 * removes) has no relative error; the difference of a and b, both rounding
 * noise, is measured as max |a - b| against the loss's scale max(|loss|, 1)
 * instead. Otherwise nerr(a, b). */
static double gerr(const lk_tensor *a, const lk_tensor *b, const lk_tensor *ref, double loss) {
    double mr = 0, md = 0;
    for (int64_t i = 0; ref && i < ref->numel; i++) mr = fmax(mr, fabs(lk_tensor_get(ref, i)));
    if (!a || !b || !ref || a->numel != b->numel || mr >= 1e-12) return nerr(a, b);
    for (int64_t i = 0; i < a->numel; i++) md = fmax(md, fabs(lk_tensor_get(a, i) - lk_tensor_get(b, i)));
    return md / fmax(fabs(loss), 1.0);
}

static lk_tensor *fixture(const ac_case *c, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s.npy", AC_DIR, c->name, file);
    lk_tensor *t = NULL;
    CHECK_MSG(lk_npy_load(path, &t) == LK_STATUS_OK, "%s: %s", c->name, lk_last_error());
    return t;
}

/* A failed comparison prints the first elements that differ by more than
 * tol of the tensor's RMS, with both values, and the largest difference. */
static void report(const char *what, const lk_tensor *got, const lk_tensor *want, double e, double tol) {
    if (e <= tol) return;
    double rms = 0, md = 0;
    int64_t at = 0;
    for (int64_t i = 0; got && want && i < want->numel && i < got->numel; i++) {
        double d = fabs(lk_tensor_get(got, i) - lk_tensor_get(want, i));
        rms += lk_tensor_get(want, i) * lk_tensor_get(want, i);
        if (d > md) md = d, at = i;
    }
    rms = want && want->numel ? sqrt(rms / (double)want->numel) : 0;
    int shown = 0;
    for (int64_t i = 0; got && want && i < want->numel && i < got->numel && shown < 3; i++) {
        double x = lk_tensor_get(got, i), y = lk_tensor_get(want, i);
        if (fabs(x - y) > tol * rms) fprintf(stderr, "  %s[%lld]: got %.9g want %.9g\n", what, (long long)i, x, y), shown++;
    }
    fprintf(stderr, "  %s: largest difference %.3g at [%lld]\n", what, md, (long long)at);
    CHECK_MSG(false, "%s: normalised error %.3g > %.3g", what, e, tol);
}

/* The loss's error: relative for the models' losses (means of positive
 * terms), relative to sum |out_i R_i| for sum(out * R), whose terms cancel. */
static double loss_err(const step *got, double want) {
    double scale = got->loss_abs > 0 ? got->loss_abs : fabs(want);
    return fabs(got->loss - want) / (scale > 1e-300 ? scale : 1e-300);
}

/* got's out, loss and gradients against the fixture files prefix{out,loss,grad_*}
 * (prefix "" : torch autocast, "ref_": float64). Returns the largest error.
 * With tol > 0 each tensor must be within max(tol, torch_factor * the
 * torch autocast run's own error against float64 for that tensor) —
 * torch_factor 0: within tol. */
static double compare_fixture(const ac_case *c, const char *label, const step *got, const char *prefix, double tol,
                              double torch_factor) {
    char file[96], what[160];
    double worst = 0;
    printf("  %-13s %-8s", c->name, label);
    for (int i = -2; i < got->n; i++) {
        const lk_tensor *g;
        lk_tensor *loss = NULL;
        if (i == -2) snprintf(file, sizeof file, "%sout", prefix), g = got->out;
        else if (i == -1) {
            snprintf(file, sizeof file, "%sloss", prefix);
            loss = lk_tensor_empty(LK_F64, 1, (int64_t[]){1});
            ((double *)loss->data)[0] = got->loss;
            g = loss;
        } else
            snprintf(file, sizeof file, "%sgrad_%s", prefix, got->name[i]), g = got->grad[i];
        lk_tensor *want = fixture(c, file);
        char rfile[96];
        snprintf(rfile, sizeof rfile, "ref_%s", file + strlen(prefix));
        lk_tensor *ref = i >= 0 ? fixture(c, rfile) : NULL;
        double e = i == -1 && want ? loss_err(got, lk_tensor_get(want, 0)) : gerr(g, want, ref, got->loss);
        snprintf(what, sizeof what, "%s %s: %s", c->name, label, file);
        double bound = tol;
        if (torch_factor > 0) { /* the same tensor from torch.autocast against float64 */
            lk_tensor *pt = fixture(c, file + strlen(prefix));
            double e_pt = gerr(pt, want, ref, got->loss);
            if (i == -1 && pt && want) { /* the loss: torch's value against float64's, on the same scale */
                step tmp = *got;
                tmp.loss = lk_tensor_get(pt, 0);
                e_pt = loss_err(&tmp, lk_tensor_get(want, 0));
            }
            if (torch_factor * e_pt > bound) bound = torch_factor * e_pt;
            lk_tensor_release(pt);
        }
        if (tol > 0) report(what, g, want, e, bound);
        printf(" %s=%.2e", i == -2 ? "out" : i == -1 ? "loss" : got->name[i], e);
        if (e > worst) worst = e;
        lk_tensor_release(want);
        lk_tensor_release(ref);
        lk_tensor_release(loss);
    }
    printf("  (max %.2e)\n", worst);
    return worst;
}

/* Two steps of the same case: bitwise equal (tol 0) or within tol. */
static void compare_steps(const ac_case *c, const char *label, const step *a, const step *b, double tol) {
    char what[160];
    double worst = 0;
    for (int i = -2; i < a->n && i < b->n; i++) {
        const lk_tensor *x = i == -2 ? a->out : i == -1 ? NULL : a->grad[i];
        const lk_tensor *y = i == -2 ? b->out : i == -1 ? NULL : b->grad[i];
        snprintf(what, sizeof what, "%s %s: %s", c->name, label, i == -2 ? "out" : i == -1 ? "loss" : a->name[i]);
        if (i == -1) {
            CHECK_MSG(tol > 0 || a->loss == b->loss, "%s: %.17g vs %.17g", what, a->loss, b->loss);
            continue;
        }
        if (tol == 0) {
            bool same = x && y && x->numel == y->numel && !memcmp(x->data, y->data, lk_tensor_nbytes(x));
            CHECK_MSG(same, "%s: not bitwise equal (normalised difference %.3g)", what, nerr(x, y));
        } else {
            double e = nerr(x, y);
            report(what, x, y, e, tol);
            if (e > worst) worst = e;
        }
    }
    CHECK_MSG(a->n == b->n, "%s %s: %d vs %d gradients", c->name, label, a->n, b->n);
    if (tol > 0) printf("  %-13s %-8s max %.2e\n", c->name, label, worst);
}

/* ---- the test ------------------------------------------------------------------------- */

static void run_case(const ac_case *c) {
    static bool said;
    if (!said) printf("bf16 GEMMs: %s; f16 GEMMs: %s\n", lk__cpu_gemm_path(LK_BF16, LK_F32), lk__cpu_gemm_path(LK_F16, LK_F32));
    said = true;
    step f32 = {0}, bf16 = {0}, f16 = {0}, f32_after = {0}, f32_nested = {0}, bf16_fb = {0};
    /* first, before this case enters any region: the plain f32 step */
    if (!run_step(c, R_NONE, LK_F32, &f32)) goto done;
    compare_fixture(c, "f32/ref", &f32, "ref_", TOL_F32_REF, 0);
    /* bf16 against torch.autocast and against float64 */
    if (!run_step(c, R_REGION, LK_BF16, &bf16)) goto done;
    /* linear and conv2d are on the lower list: their output is bf16, as torch's */
    CHECK_MSG(c->kind == C_MODEL || bf16.out->dtype == LK_BF16, "%s: the output under bf16 autocast is %s", c->name,
              lk_dtype_name(bf16.out->dtype));
    compare_fixture(c, "bf16/pt", &bf16, "", TOL_BF16_TORCH, 0);
    compare_fixture(c, "bf16/ref", &bf16, "ref_", TOL_BF16_REF, TORCH_FACTOR);
    /* and the region took effect: the output and the first weight's gradient
     * moved by about u = 2^-9 (at least u/8) from the f32 step's */
    double moved_out = nerr(bf16.out, f32.out), moved_w = nerr(bf16.grad[c->kind == C_MODEL ? 0 : 1], f32.grad[c->kind == C_MODEL ? 0 : 1]);
    CHECK_MSG(moved_out > 1.0 / 4096 && moved_w > 1.0 / 4096,
              "%s: the bf16 step is the f32 one (normalised differences: out %.3g, weight gradient %.3g)", c->name,
              moved_out, moved_w);
    /* the f32 fallback multiplies the same rounded operands */
    lk__cpu_lowp_use_dnnl(false);
    bool fb_ok = run_step(c, R_REGION, LK_BF16, &bf16_fb);
    lk__cpu_lowp_use_dnnl(true);
    if (fb_ok) compare_steps(c, "dnnl/fb", &bf16, &bf16_fb, TOL_PATHS);
    /* f16 against float64 */
    if (!run_step(c, R_REGION, LK_F16, &f16)) goto done;
    compare_fixture(c, "f16/ref", &f16, "ref_", TOL_F16_REF, 0);
    /* the torch fixture's own distance from float64, for the record */
    printf("  %-13s (torch bf16 vs float64, for comparison:)\n", c->name);
    {
        step pt = {.n = bf16.n, .out = fixture(c, "out"), .loss_abs = bf16.loss_abs};
        lk_tensor *l = fixture(c, "loss");
        pt.loss = l ? lk_tensor_get(l, 0) : 0;
        lk_tensor_release(l);
        for (int i = 0; i < bf16.n; i++) {
            char f[96];
            snprintf(f, sizeof f, "grad_%s", bf16.name[i]);
            snprintf(pt.name[i], sizeof pt.name[i], "%s", bf16.name[i]);
            pt.grad[i] = fixture(c, f);
        }
        compare_fixture(c, "pt/ref", &pt, "ref_", 0, 0);
        step_free(&pt);
    }
    /* outside autocast, and in an LK_F32 region nested in a bf16 one: f32, bit for bit */
    if (run_step(c, R_NONE, LK_F32, &f32_after)) compare_steps(c, "f32 after", &f32, &f32_after, 0);
    if (run_step(c, R_NESTED_F32, LK_F32, &f32_nested)) compare_steps(c, "f32 nested", &f32, &f32_nested, 0);
done:
    step_free(&f32);
    step_free(&bf16);
    step_free(&bf16_fb);
    step_free(&f16);
    step_free(&f32_after);
    step_free(&f32_nested);
}

static void linear(void) { run_case(&CASES[0]); }
static void conv2d(void) { run_case(&CASES[1]); }
static void conv2d_1x1(void) { run_case(&CASES[2]); }
static void conv2d_groups(void) { run_case(&CASES[3]); }
static void mlp(void) { run_case(&CASES[4]); }
static void autoencoder(void) { run_case(&CASES[5]); }
static void cnn(void) { run_case(&CASES[6]); }

/* The autocast dtype is taken when an op runs forward and kept in its node:
 * backward multiplies as forward did wherever the region closes, and a
 * forward outside any region gives f32 gradients even when backward runs
 * inside one. Each op case: conv2d's paths (3x3 chunked, 1x1, grouped) and
 * linear. */
static void dtype_kept_in_node(void) {
    for (int k = 0; k < 4; k++) {
        const ac_case *c = &CASES[k];
        step plain = {0}, fwd = {0}, all = {0}, bwd = {0};
        bool ok = run_step(c, R_NONE, LK_F32, &plain) && run_step(c, R_REGION, LK_BF16, &fwd) &&
                  run_step(c, R_ALL, LK_BF16, &all) && run_step(c, R_BWD, LK_BF16, &bwd);
        CHECK(ok);
        if (ok) {
            compare_steps(c, "fwd vs all", &fwd, &all, 0);
            compare_steps(c, "bwd vs f32", &bwd, &plain, 0);
            double e = nerr(fwd.grad[1], plain.grad[1]);
            CHECK_MSG(e > 1e-4, "%s: the bf16 weight gradient is the f32 one (normalised difference %.3g)", c->name, e);
        }
        CHECK(lk_autocast_dtype() == LK_F32);
        step_free(&plain);
        step_free(&fwd);
        step_free(&all);
        step_free(&bwd);
    }
}

/* A conv2d GEMM that fails under autocast (here: the f32 fallback cannot
 * allocate its widened operands, on whichever task's thread) fails the op
 * with OUT_OF_MEMORY instead of returning an output some chunks never
 * wrote. Fails the Nth allocation for N = 1, 2, ... until the forward
 * succeeds; each success must equal the unfailed output bit for bit. */
static void conv2d_gemm_failure(void) {
    const ac_case *c = &CASES[1];
    lk__cpu_lowp_use_dnnl(false);
    int64_t fan = 27;
    lk_tensor *x = nn_htensor(c->seed, -1.0, 1.0, c->xndim, c->xshape);
    lk_tensor *w = nn_htensor(c->seed + 10, -1.0 / sqrt((double)fan), 1.0 / sqrt((double)fan), c->wndim, c->wshape);
    lk_autocast_enter(LK_BF16);
    lk_tensor *want = lk_conv2d(x, w, NULL, c->cp);
    CHECK(want != NULL);
    int failures = 0;
    /* the pool hands the scratch of the last forward to the next one: run
     * the negated input just before each try, so a chunk the failed GEMM
     * left unwritten cannot hold the right values by chance */
    lk_tensor *xneg = lk_tensor_clone(x);
    for (int64_t i = 0; xneg && i < xneg->numel; i++) ((float *)xneg->data)[i] = -((float *)xneg->data)[i];
    for (long n = 1; want && xneg && n < 1000; n++) {
        lk_tensor_release(lk_conv2d(xneg, w, NULL, c->cp));
        lk_clear_error();
        lk_alloc_fail_after(n);
        lk_tensor *got = lk_conv2d(x, w, NULL, c->cp);
        lk_alloc_fail_after(0);
        if (!got) {
            failures++;
            CHECK_MSG(lk_last_status() == LK_STATUS_OUT_OF_MEMORY, "N = %ld: %s", n, lk_last_error());
            continue;
        }
        CHECK_MSG(!memcmp(got->data, want->data, lk_tensor_nbytes(want)), "N = %ld: a wrong output", n);
        lk_tensor_release(got);
        break; /* N is past every allocation the forward makes */
    }
    CHECK(failures > 0);
    lk_autocast_exit();
    lk__cpu_lowp_use_dnnl(true);
    lk_tensor_release(want);
    lk_tensor_release(xneg);
    lk_tensor_release(x);
    lk_tensor_release(w);
}

/* ---- 16-bit activations (torch.autocast's op lists) --------------------------------- */

/* Under autocast the GEMMs return the region's dtype, element-wise ops and
 * dropout keep their input's, softmax/losses widen to f32; gradients have
 * their tensor's dtype (f32 master weights: f32; a bf16 leaf: bf16). Each
 * value is checked against the same arithmetic done by hand in f32 and
 * rounded once. */
static void activation_dtypes(void) {
    for (int k = 0; k < 2; k++) {
        lk_dtype dt = k ? LK_F16 : LK_BF16;
        lk_tensor *x = nn_htensor(901, -1.0, 1.0, 2, (int64_t[]){6, 16});
        lk_tensor *w = nn_htensor(902, -0.25, 0.25, 2, (int64_t[]){8, 16});
        lk_tensor *b = nn_htensor(903, -0.25, 0.25, 1, (int64_t[]){8});
        lk_tensor *w2 = nn_htensor(904, -0.3, 0.3, 2, (int64_t[]){5, 8});
        lk_tensor *y = nn_hlabels(905, 6, 5);
        lk_tensor_set_requires_grad(x, true);
        lk_tensor_set_requires_grad(w, true);
        lk_tensor_set_requires_grad(b, true);
        lk_tensor_set_requires_grad(w2, true);
        lk_rng rng;
        lk_rng_init(&rng, 7, LK_RNG_DROPOUT, 0, 0);
        lk_scope_begin();
        lk_autocast_enter(dt);
        lk_tensor *h = lk_linear(x, w, b);
        lk_tensor *r = lk_relu(h);
        lk_tensor *d = lk_dropout(r, 0.5f, true, &rng);
        lk_tensor *o = lk_linear(d, w2, NULL);
        lk_tensor *sg = lk_sigmoid(o);
        lk_tensor *sum = lk_add(o, sg);       /* 16-bit + 16-bit: 16-bit */
        lk_tensor *mix = lk_add(sum, sum);    /* still 16-bit */
        lk_tensor *loss = lk_cross_entropy(mix, y, NULL);
        lk_autocast_exit();
        CHECK_MSG(loss != NULL, "%s", lk_last_error());
        if (loss) {
            CHECK(h->dtype == dt && r->dtype == dt && d->dtype == dt && o->dtype == dt && sg->dtype == dt);
            CHECK(sum->dtype == dt && mix->dtype == dt);
            CHECK_MSG(loss->dtype == LK_F32, "cross_entropy of a 16-bit input: %s", lk_dtype_name(loss->dtype));
            /* h = round(round(x) round(w)^T + round(b)) — oneDNN adds the rounded bias before the one rounding */
            lk_tensor *xr = lk_tensor_cast(x, dt), *wr = lk_tensor_cast(w, dt), *br = lk_tensor_cast(b, dt);
            double maxd = 0;
            for (int64_t i = 0; i < 6; i++)
                for (int64_t j = 0; j < 8; j++) {
                    double acc = lk_tensor_get(br, j);
                    for (int64_t q = 0; q < 16; q++) acc += lk_tensor_get(xr, i * 16 + q) * lk_tensor_get(wr, j * 16 + q);
                    double got = lk_tensor_get(h, i * 8 + j), rel = fabs(got - acc) / (fabs(acc) + 1e-3);
                    if (rel > maxd) maxd = rel;
                    /* relu of the 16-bit value is exact; dropout's x2 is exact too */
                    CHECK(lk_tensor_get(r, i * 8 + j) == (got > 0 ? got : 0));
                    double dv = lk_tensor_get(d, i * 8 + j);
                    CHECK(dv == 0 || dv == 2 * lk_tensor_get(r, i * 8 + j));
                }
            CHECK_MSG(maxd <= (dt == LK_BF16 ? 0x1p-8 : 0x1p-11), "%s linear: relative error %.3g", lk_dtype_name(dt), maxd);
            lk_tensor_release(xr);
            lk_tensor_release(wr);
            lk_tensor_release(br);
            CHECK_OK(lk_backward(loss));
            CHECK(x->grad && x->grad->dtype == LK_F32 && w->grad && w->grad->dtype == LK_F32);
            CHECK(b->grad && b->grad->dtype == LK_F32 && w2->grad && w2->grad->dtype == LK_F32);
        }
        lk_scope_end();
        lk_tensor *ts[] = {x, w, b, w2, y};
        for (int i = 0; i < 5; i++) lk_tensor_release(ts[i]);
    }
    /* a 16-bit leaf gets a 16-bit gradient; f32 + bf16 promotes to f32 and
     * the f32 gradient reaching the bf16 input is rounded once */
    lk_tensor *a32 = nn_htensor(911, -1.0, 1.0, 1, (int64_t[]){7});
    lk_tensor *a = lk_tensor_cast(a32, LK_BF16);
    lk_tensor_release(a32);
    lk_tensor *f = nn_htensor(912, -1.0, 1.0, 1, (int64_t[]){7});
    lk_tensor_set_requires_grad(a, true);
    lk_tensor_set_requires_grad(f, true);
    lk_scope_begin();
    lk_autocast_enter(LK_BF16);
    lk_tensor *m = lk_mul(a, f);
    lk_tensor *l = m ? lk_sum(m, NULL, 0, false) : NULL;
    lk_autocast_exit();
    CHECK_MSG(l != NULL, "%s", lk_last_error());
    if (l) {
        CHECK_MSG(m->dtype == LK_F32, "bf16 * f32: %s (torch promotes to f32)", lk_dtype_name(m->dtype));
        CHECK_OK(lk_backward(l));
        CHECK(a->grad && a->grad->dtype == LK_BF16 && f->grad && f->grad->dtype == LK_F32);
        for (int64_t i = 0; a->grad && i < 7; i++) {
            float want = lk_bf16_bits_to_f32(lk_f32_to_bf16_bits((float)lk_tensor_get(f, i)));
            CHECK(lk_tensor_get(a->grad, i) == want);
            CHECK(lk_tensor_get(f->grad, i) == lk_tensor_get(a, i));
        }
    }
    lk_scope_end();
    lk_tensor_release(a);
    lk_tensor_release(f);
    CHECK(lk_autocast_dtype() == LK_F32);
}

/* The reason for 16-bit activations: a step's tensor memory. A 4-layer
 * ReLU mlp whose activations dominate (batch 512, width 128): the peak of
 * live tensor bytes over forward + backward under bf16 is at most 0.6x the
 * f32 one (measured 0.58x): the activations halve, the master weights are
 * rounded for each GEMM in panels, never kept, and the f32 batch's rounded
 * copy is kept for backward (0.52x when it was rounded again instead). It
 * was 1.35x when GEMM outputs were f32 and linear kept a bf16 copy of its
 * input besides. */
static size_t mlp_step_peak(lk_dtype dt, lk_tensor *const *ws, lk_tensor *x, lk_tensor *y) {
    size_t live0 = lk_pool_reset_peak();
    lk_scope_begin();
    lk_autocast_enter(dt);
    lk_tensor *h = x;
    for (int i = 0; i < 4; i++) {
        h = lk_linear(h, ws[i], NULL);
        if (i < 3) h = lk_relu(h);
    }
    lk_tensor *loss = lk_cross_entropy(h, y, NULL);
    lk_autocast_exit();
    CHECK_MSG(loss != NULL, "%s", lk_last_error());
    if (loss) CHECK_OK(lk_backward(loss));
    lk_scope_end();
    return lk_pool_get_stats().bytes_live_peak - live0;
}

static void activation_memory(void) {
    lk_tensor *x = nn_htensor(921, -1.0, 1.0, 2, (int64_t[]){512, 128});
    lk_tensor *y = nn_hlabels(922, 512, 10);
    lk_tensor *ws[4];
    for (int i = 0; i < 4; i++) {
        ws[i] = nn_htensor(930 + (uint64_t)i, -0.1, 0.1, 2, (int64_t[]){i == 3 ? 10 : 128, 128});
        lk_tensor_set_requires_grad(ws[i], true);
    }
    mlp_step_peak(LK_F32, ws, x, y); /* first step: the weights' gradients are made */
    size_t f32 = mlp_step_peak(LK_F32, ws, x, y), bf16 = mlp_step_peak(LK_BF16, ws, x, y);
    printf("  activation_memory: step peak f32 %zu bytes, bf16 %zu bytes (%.2fx)\n", f32, bf16, (double)bf16 / (double)f32);
    CHECK_MSG(bf16 * 10 <= f32 * 6, "bf16 step peak %zu bytes vs f32 %zu: not about half", bf16, f32);
    for (int i = 0; i < 4; i++) lk_tensor_release(ws[i]);
    lk_tensor_release(x);
    lk_tensor_release(y);
}

/* The same for a cnn step (conv -> batch norm -> relu -> max pool, twice,
 * then a linear): conv2d returns bf16 and batch norm, relu and pooling keep
 * it, so the step's tensor memory about halves too. (The backend's f32
 * scratch for widening, a few MB per thread at most, is not pool memory;
 * docs/BENCHMARKS.md.) */
static size_t cnn_step_peak(lk_dtype dt, lk_tensor *const *p, lk_tensor *const *stats, lk_tensor *x, lk_tensor *y) {
    size_t live0 = lk_pool_reset_peak();
    lk_scope_begin();
    lk_autocast_enter(dt);
    lk_tensor *h = x;
    for (int i = 0; i < 2; i++) {
        h = lk_conv2d(h, p[3 * i], NULL, (lk_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1});
        h = lk_batch_norm(h, stats[2 * i], stats[2 * i + 1], p[3 * i + 1], p[3 * i + 2], true, 0.1f, 1e-5f);
        h = lk_max_pool2d(lk_relu(h), (lk_pool2d_params){{2, 2}, {2, 2}, {0, 0}, true, false});
    }
    lk_tensor *loss = lk_cross_entropy(lk_linear(lk_flatten(h, 1, -1), p[6], NULL), y, NULL);
    lk_autocast_exit();
    CHECK_MSG(loss != NULL, "%s", lk_last_error());
    if (loss) CHECK_OK(lk_backward(loss));
    lk_scope_end();
    return lk_pool_get_stats().bytes_live_peak - live0;
}

static void cnn_activation_memory(void) {
    lk_tensor *x = nn_htensor(951, 0.0, 1.0, 4, (int64_t[]){64, 1, 16, 16}), *y = nn_hlabels(952, 64, 10);
    lk_tensor *p[7] = {nn_htensor(953, -0.3, 0.3, 4, (int64_t[]){8, 1, 3, 3}),
                       lk_tensor_full(LK_F32, 1, (int64_t[]){8}, 1.0f),
                       lk_tensor_zeros(LK_F32, 1, (int64_t[]){8}),
                       nn_htensor(954, -0.1, 0.1, 4, (int64_t[]){16, 8, 3, 3}),
                       lk_tensor_full(LK_F32, 1, (int64_t[]){16}, 1.0f),
                       lk_tensor_zeros(LK_F32, 1, (int64_t[]){16}),
                       nn_htensor(955, -0.05, 0.05, 2, (int64_t[]){10, 16 * 4 * 4})};
    lk_tensor *stats[4] = {lk_tensor_zeros(LK_F32, 1, (int64_t[]){8}), lk_tensor_full(LK_F32, 1, (int64_t[]){8}, 1.0f),
                           lk_tensor_zeros(LK_F32, 1, (int64_t[]){16}), lk_tensor_full(LK_F32, 1, (int64_t[]){16}, 1.0f)};
    for (int i = 0; i < 7; i++) lk_tensor_set_requires_grad(p[i], true);
    cnn_step_peak(LK_F32, p, stats, x, y); /* first step: the parameters' gradients are made */
    size_t f32 = cnn_step_peak(LK_F32, p, stats, x, y), bf16 = cnn_step_peak(LK_BF16, p, stats, x, y);
    printf("  cnn_activation_memory: step peak f32 %zu bytes, bf16 %zu bytes (%.2fx)\n", f32, bf16,
           (double)bf16 / (double)f32);
    CHECK_MSG(bf16 * 10 <= f32 * 6, "cnn bf16 step peak %zu bytes vs f32 %zu: not about half", bf16, f32);
    for (int i = 0; i < 7; i++) lk_tensor_release(p[i]);
    for (int i = 0; i < 4; i++) lk_tensor_release(stats[i]);
    lk_tensor_release(x);
    lk_tensor_release(y);
}

/* 16-bit element-wise ops and losses compute in f32 on the widened values
 * and round once: over several backend blocks (3000 elements) a bf16 relu /
 * sigmoid equal the f32 ops run on the widened tensors, rounded, bit for
 * bit; mse_loss of the bf16 result equals the f32 kernel's on its widened
 * values exactly; backward gives a 16-bit gradient. */
static void half_ops_match_f32(void) {
    for (int k = 0; k < 2; k++) {
        lk_dtype dt = k ? LK_F16 : LK_BF16;
        lk_tensor *x32 = nn_htensor(941, -2.0, 2.0, 2, (int64_t[]){3, 1000});
        lk_tensor *t32 = nn_htensor(942, -1.0, 1.0, 2, (int64_t[]){3, 1000});
        lk_tensor *xh = lk_tensor_cast(x32, dt), *xw = lk_tensor_cast(xh, LK_F32); /* xw: the widened values */
        lk_tensor_set_requires_grad(xh, true);
        lk_tensor_set_requires_grad(xw, true);
        lk_scope_begin();
        lk_tensor *yh = lk_sigmoid(lk_relu(xh)), *yw = lk_sigmoid(lk_relu(xw));
        lk_tensor *lh = lk_mse_loss(yh, t32, LK_REDUCTION_MEAN);
        lk_tensor *yr = lk_tensor_cast(yw, dt); /* the f32 output rounded: what the 16-bit chain must give... */
        lk_tensor *yrw = lk_tensor_cast(yr, LK_F32);
        lk_tensor *lw = lk_mse_loss(yrw, t32, LK_REDUCTION_MEAN); /* ...and its loss, by the f32 kernel */
        lk_tensor_release(yrw);
        CHECK_MSG(lh && lw, "%s", lk_last_error());
        if (lh && lw) {
            CHECK(yh->dtype == dt && lh->dtype == LK_F32);
            CHECK_MSG(!memcmp(yh->data, yr->data, lk_tensor_nbytes(yr)), "%s relu+sigmoid differ from f32 rounded", lk_dtype_name(dt));
            CHECK_MSG(lk_tensor_get(lh, 0) == lk_tensor_get(lw, 0), "%s mse: %.9g vs %.9g", lk_dtype_name(dt),
                      lk_tensor_get(lh, 0), lk_tensor_get(lw, 0));
            CHECK_OK(lk_backward(lh));
            CHECK(xh->grad && xh->grad->dtype == dt);
        }
        lk_scope_end();
        lk_tensor *ts[] = {x32, t32, xh, xw, yr};
        for (int i = 0; i < 5; i++) lk_tensor_release(ts[i]);
    }
}

LK_TEST_MAIN(LK_TEST_CASE(linear), LK_TEST_CASE(conv2d), LK_TEST_CASE(conv2d_1x1), LK_TEST_CASE(conv2d_groups),
             LK_TEST_CASE(mlp), LK_TEST_CASE(autoencoder), LK_TEST_CASE(cnn), LK_TEST_CASE(dtype_kept_in_node),
             LK_TEST_CASE(conv2d_gemm_failure), LK_TEST_CASE(activation_dtypes), LK_TEST_CASE(activation_memory),
             LK_TEST_CASE(cnn_activation_memory), LK_TEST_CASE(half_ops_match_f32))
