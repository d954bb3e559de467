/* bf16-true and 16-true against PyTorch 1.13: one training step of the mlp
 * and the autoencoder with their parameters cast to bf16 (f16) by
 * lk_layer_cast_parameters and the forward under autocast of that dtype —
 * what the trainer does for trainer.precision bf16-true / 16-true — compared
 * with the same step of torch's module.to(torch.bfloat16) (Lightning's
 * HalfPrecision plugin) and with float64 from the same rounded parameters
 * and inputs. Fixtures: tests/fixtures/true16, written by
 * /usr/bin/python3 tools/gen_true16_fixtures.py (same seeds and shapes as
 * the autocast fixtures' mlp and autoencoder cases).
 *
 * Errors are normwise, ||got - want|| / ||want||, over the output and every
 * gradient; the loss relative. Where the two sides differ by design: torch
 * computes cross-entropy / the squared error on bf16 tensors, lockstep
 * widens them to f32 (the autocast policy's fp32 list), so lockstep is the
 * closer of the two to float64. Tolerances (docs/PARITY.md): against
 * float64 8 u (bf16: u = 2^-9; f16: 2^-12), against torch 16 u. */
#include "nn/nn_fixtures.h"

#define T16_DIR LK_SOURCE_DIR "/tests/fixtures/true16"

static const double U_BF16 = 1.0 / 512, U_F16 = 1.0 / 4096;

typedef struct {
    const char *name, *model;
    uint64_t seed;
    int64_t batch, dim;
    lk_model_kv args[3];
} t16_case;

static const t16_case CASES[] = {
    {"mlp", "mlp", 1500, 16, 784, {{"input_dim", "784"}, {"hidden", "64,32"}, {"num_classes", "10"}}},
    {"autoencoder", "autoencoder", 1600, 8, 784, {{"input_dim", "784"}, {"hidden", "32,16"}, {"latent_dim", "8"}}},
};

static double nerr(const lk_tensor *a, const lk_tensor *b) {
    if (!a || !b || a->numel != b->numel) return INFINITY;
    double d2 = 0, b2 = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = lk_tensor_get(a, i), y = lk_tensor_get(b, i);
        d2 += (x - y) * (x - y), b2 += y * y;
    }
    return isnan(d2) ? INFINITY : sqrt(d2) / sqrt(b2 > 1e-60 ? b2 : 1e-60);
}

static lk_tensor *fixture(const t16_case *c, const char *prefix, const char *file) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s%s.npy", T16_DIR, c->name, prefix, file);
    lk_tensor *t = NULL;
    CHECK_MSG(lk_npy_load(path, &t) == LK_STATUS_OK, "%s: %s", c->name, lk_last_error());
    return t;
}

/* One step in dt; compares with the fixtures under `prefix` to tol; returns
 * the largest error. */
static double check_step(const t16_case *c, lk_dtype dt, const char *prefix, double tol) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create(c->model, c->args, 3, 0, &m));
    if (!m) return INFINITY;
    nn_set_hash_weights(m, c->seed + 10);
    CHECK_OK(lk_layer_cast_parameters(m, dt));
    const lk_model_info *info = lk_model_find(c->model);
    lk_tensor *x = nn_htensor(c->seed, 0.0, 1.0, 2, (int64_t[]){c->batch, c->dim});
    lk_tensor *y = info->target_is_input ? NULL : nn_hlabels(c->seed + 1, c->batch, 10);
    double worst = 0;
    lk_scope_begin();
    lk_autocast_enter(dt);
    lk_tensor *out = lk_layer_forward(m, x), *loss = out ? lk_model_loss(info, out, x, y) : NULL;
    lk_autocast_exit();
    CHECK_MSG(loss != NULL, "%s in %s: %s", c->name, lk_dtype_name(dt), lk_last_error());
    if (loss) {
        CHECK_OK(lk_backward(loss));
        CHECK(out->dtype == dt); /* the output in the parameters' dtype, as torch's */
        lk_tensor *want = fixture(c, prefix, "out");
        double e = nerr(out, want);
        CHECK_MSG(e <= tol, "%s %s vs %sout: %.3g > %.3g", c->name, lk_dtype_name(dt), prefix, e, tol);
        worst = fmax(worst, e);
        lk_tensor_release(want);
        want = fixture(c, prefix, "loss");
        double wl = want ? lk_tensor_get(want, 0) : NAN, el = fabs(lk_tensor_get(loss, 0) - wl) / fabs(wl);
        CHECK_MSG(el <= tol, "%s %s vs %sloss: %.3g > %.3g", c->name, lk_dtype_name(dt), prefix, el, tol);
        worst = fmax(worst, el);
        lk_tensor_release(want);
        lk_named_tensors ps = {0};
        CHECK_OK(lk_layer_named_parameters(m, &ps));
        for (int k = 0; k < ps.n; k++) {
            lk_tensor *g = ps.items[k].tensor->grad;
            CHECK_MSG(g && g->dtype == dt, "%s: the gradient of %s is not %s", c->name, ps.items[k].name, lk_dtype_name(dt));
            char file[96];
            snprintf(file, sizeof file, "grad_%s", ps.items[k].name);
            want = fixture(c, prefix, file);
            e = nerr(g, want);
            CHECK_MSG(e <= tol, "%s %s vs %s%s: %.3g > %.3g", c->name, lk_dtype_name(dt), prefix, file, e, tol);
            worst = fmax(worst, e);
            lk_tensor_release(want);
        }
        lk_named_tensors_clear(&ps);
    }
    lk_scope_end();
    lk_tensor_release(x);
    lk_tensor_release(y);
    lk_layer_free(m);
    return worst;
}

static void run_case(const t16_case *c) {
    double bf_ref = check_step(c, LK_BF16, "ref_", 8 * U_BF16);
    double bf_torch = check_step(c, LK_BF16, "", 16 * U_BF16);
    double f16_ref = check_step(c, LK_F16, "ref16_", 8 * U_F16);
    /* torch's own bf16 step against float64: lockstep must be no worse than 1.25x of it */
    double torch_ref = 0;
    {
        char path[512];
        lk_layer *m = NULL;
        lk_model_create(c->model, c->args, 3, 0, &m);
        lk_named_tensors ps = {0};
        if (m) lk_layer_named_parameters(m, &ps);
        const char *files[32] = {"out"};
        char names[32][96];
        int nf = 1;
        for (int k = 0; k < ps.n && nf < 32; k++, nf++) {
            snprintf(names[nf], sizeof names[nf], "grad_%s", ps.items[k].name);
            files[nf] = names[nf];
        }
        for (int i = 0; i < nf; i++) {
            snprintf(path, sizeof path, "%s/%s/%s.npy", T16_DIR, c->name, files[i]);
            lk_tensor *a = NULL, *b = NULL;
            if (lk_npy_load(path, &a) == LK_STATUS_OK) {
                snprintf(path, sizeof path, "%s/%s/ref_%s.npy", T16_DIR, c->name, files[i]);
                if (lk_npy_load(path, &b) == LK_STATUS_OK) torch_ref = fmax(torch_ref, nerr(a, b));
            }
            lk_tensor_release(a);
            lk_tensor_release(b);
        }
        lk_named_tensors_clear(&ps);
        lk_layer_free(m);
    }
    printf("%-12s bf16-true vs float64 %.2e (torch bf16 vs float64 %.2e), vs torch %.2e; 16-true vs float64 %.2e\n",
           c->name, bf_ref, torch_ref, bf_torch, f16_ref);
    CHECK_MSG(bf_ref <= 1.25 * torch_ref + U_BF16, "%s: lockstep's bf16-true step (%.3g) is further from float64 than "
              "torch's (%.3g)", c->name, bf_ref, torch_ref);
}

static void mlp(void) { run_case(&CASES[0]); }
static void autoencoder(void) { run_case(&CASES[1]); }

LK_TEST_MAIN(LK_TEST_CASE(mlp), LK_TEST_CASE(autoencoder))
