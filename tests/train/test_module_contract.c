/* module_contract: a module that sets only forward and loss gets
 * training_step (their composition, logging train_loss), validation and test
 * steps (val_loss, test_loss) and predict_step (forward) for free, and
 * trains bitwise as the module that writes that composition as its own
 * training_step; a module that sets only training_step keeps working as
 * before; what a module lacks is named; the built-in modules set both
 * halves. */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"

static const lk_model_kv data_args[] = {{"num_samples", "96"}, {"input_shape", "[4]"}, {"num_classes", "2"},
                                        {"batch_size", "16"}, {"num_workers", "0"}};

static lk_tensor *fwd(lk_module *m, const lk_batch *b) { return lk_layer_forward(m->net, lk_batch_tensor(b, 0)); }
static lk_tensor *loss_of(lk_module *m, lk_tensor *out, const lk_batch *b) {
    return lk_cross_entropy(out, lk_batch_tensor(b, 1), NULL);
}
/* The same composition written by hand, as a module did before forward/loss. */
static lk_tensor *hand_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    lk_tensor *loss = loss_of(m, fwd(m, b), b);
    if (loss) lk_log_metric(tr, "train_loss", lk_tensor_item(loss), &(lk_log_opts){.prog_bar = true});
    return loss;
}

static const lk_module_vtable halves_vt = {.forward = fwd, .loss = loss_of};
static const lk_module_vtable step_only_vt = {.training_step = hand_step};
static const lk_module_vtable forward_only_vt = {.forward = fwd};

static lk_status make_trainer(lk_trainer **tr, const char *tag) {
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.max_epochs = 2;
    cfg.enable_progress_bar = false;
    cfg.enable_checkpointing = false;
    cfg.enable_tensorboard = false;
    cfg.enable_model_summary = false;
    cfg.log_every_n_steps = 1;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_module_contract_%d_%s", (int)getpid(), tag);
    return lk_trainer_create(&cfg, NULL, NULL, tr);
}

/* Fits m for two epochs; the final weights into w (8 + 2 values) and the
 * last train_loss into *loss. */
static void fit_one(lk_module *m, const char *tag, float w[10], double *loss, double *val) {
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm));
    CHECK_OK(make_trainer(&tr, tag));
    CHECK_OK(lk_trainer_fit(tr, m, dm, NULL));
    *loss = *val = NAN;
    CHECK(tr && lk_trainer_metric(tr, "train_loss", loss));
    if (m->vt->loss) CHECK_MSG(tr && lk_trainer_metric(tr, "val_loss", val), "%s: no val_loss logged", tag);
    for (int k = 0; k < 8; k++) w[k] = (float)lk_tensor_get(lk_layer_param(m->net, 0), k);
    for (int k = 0; k < 2; k++) w[8 + k] = (float)lk_tensor_get(lk_layer_param(m->net, 1), k);
    if (m->vt->loss) {
        double t = NAN;
        CHECK_OK(lk_trainer_test(tr, m, dm, NULL));
        CHECK_MSG(tr && lk_trainer_metric(tr, "test_loss", &t) && isfinite(t), "%s: test_loss %g", tag, t);
        CHECK_OK(lk_trainer_predict(tr, m, dm, NULL)); /* predict_step: the forward */
    }
    lk_trainer_free(tr);
    lk_datamodule_free(dm);
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_module_contract_%d_%s", (int)getpid(), tag);
    CHECK(system(rm) == 0);
}

static void forward_and_loss_train_as_the_composition(void) {
    lk_module a = {.name = "halves", .vt = &halves_vt, .net = lk_linear_create(4, 2, true, NULL)};
    lk_module b = {.name = "step_only", .vt = &step_only_vt, .net = lk_linear_create(4, 2, true, NULL)};
    float wa[10], wb[10];
    double la, lb, va, vb;
    fit_one(&a, "halves", wa, &la, &va);
    fit_one(&b, "step", wb, &lb, &vb);
    CHECK_MSG(memcmp(wa, wb, sizeof wa) == 0, "weights differ: %.9g vs %.9g", wa[0], wb[0]);
    CHECK_MSG(memcmp(&la, &lb, sizeof la) == 0, "train_loss %.17g vs %.17g", la, lb);
    CHECK(isfinite(va));
    lk_layer_free(a.net);
    lk_layer_free(b.net);
}

/* A call's status from the tensor it returned (NULL: the error it set). */
static lk_status status_of(const lk_tensor *t) { return t ? LK_STATUS_OK : lk_last_status(); }

static void what_a_module_lacks_is_named(void) {
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm));
    CHECK_OK(make_trainer(&tr, "errors"));
    lk_module f = {.name = "fwd", .vt = &forward_only_vt, .net = lk_linear_create(4, 2, true, NULL)};
    lk_module s = {.name = "step", .vt = &step_only_vt, .net = lk_linear_create(4, 2, true, NULL)};
    CHECK_ERR(lk_trainer_fit(tr, &f, dm, NULL), LK_STATUS_INVALID_ARGUMENT,
              "module 'fwd' has no training_step (and no forward and loss to compose one)");
    CHECK_ERR(lk_trainer_predict(tr, &s, dm, NULL), LK_STATUS_INVALID_ARGUMENT,
              "module 'step' has no predict_step (and no forward)");
    CHECK_ERR(status_of(lk_module_forward(&s, NULL)), LK_STATUS_INVALID_ARGUMENT, "module 'step' has no forward");
    CHECK_ERR(status_of(lk_module_loss(&f, NULL, NULL)), LK_STATUS_INVALID_ARGUMENT, "module 'fwd' has no loss");
    CHECK_ERR(status_of(lk_module_training_step(&f, NULL, 0, tr)), LK_STATUS_INVALID_ARGUMENT,
              "module 'fwd' has no training_step");
    CHECK_OK(lk_module_validation_step(&s, NULL, 0, tr)); /* no slot and no halves: nothing to do, as before */
    lk_layer_free(f.net);
    lk_layer_free(s.net);
    lk_trainer_free(tr);
    lk_datamodule_free(dm);
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_module_contract_%d_errors", (int)getpid());
    CHECK(system(rm) == 0);
}

static void builtin_modules_set_both_halves(void) {
    const char *names[] = {"autoencoder", "mlp", "cnn"};
    for (int i = 0; i < 3; i++) {
        lk_module *m = NULL;
        CHECK_OK(lk_module_create_builtin(names[i], NULL, 0, 1, &m));
        CHECK_MSG(m && m->vt->forward && m->vt->loss && m->vt->training_step, "%s: forward %d, loss %d", names[i],
                  m && m->vt->forward, m && m->vt->loss);
        lk_module_free(m);
    }
}

LK_TEST_MAIN(LK_TEST_CASE(forward_and_loss_train_as_the_composition), LK_TEST_CASE(what_a_module_lacks_is_named),
             LK_TEST_CASE(builtin_modules_set_both_halves))
