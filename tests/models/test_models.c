/* models: the registry (names, arg tables, errors with hints), parameter
 * names equal to the PyTorch equivalents', 50-step training runs whose loss
 * curves match PyTorch's to 1e-4 relative at every step (fixtures from
 * tools/gen_nn_fixtures.py), the same over flattened parameters, and a
 * state dict that loads into PyTorch with strict=True and gives the same
 * outputs (run only where /usr/bin/python3 can import torch). */
#include <sys/stat.h>
#include <unistd.h>

#include "nn/nn_fixtures.h"

static void registry(void) {
    int n = 0;
    const lk_model_info *m = lk_models(&n);
    CHECK(n == 5 && !strcmp(m[0].name, "autoencoder") && !strcmp(m[1].name, "mlp") && !strcmp(m[2].name, "cnn") &&
          !strcmp(m[3].name, "gpt") && !strcmp(m[4].name, "resnet"));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < m[i].n_args; k++) CHECK(m[i].args[k].name && m[i].args[k].default_value && m[i].args[k].help);
    CHECK(lk_model_find("autoencoder")->loss == LK_LOSS_MSE && lk_model_find("autoencoder")->target_is_input);
    CHECK(lk_model_find("cnn")->loss == LK_LOSS_CROSS_ENTROPY);
    lk_layer *l = NULL;
    CHECK_ERR(lk_model_create("vgg", NULL, 0, 0, &l), LK_STATUS_INVALID_ARGUMENT,
              "unknown model 'vgg' (registered models: autoencoder, mlp, cnn, gpt, resnet)");
    CHECK_ERR(lk_model_create("mlp", (lk_model_kv[]){{"hiden", "64"}}, 1, 0, &l), LK_STATUS_INVALID_ARGUMENT,
              "unknown argument 'hiden'; did you mean 'hidden'?");
    CHECK_ERR(lk_model_create("mlp", (lk_model_kv[]){{"dropout", "lots"}}, 1, 0, &l), LK_STATUS_INVALID_ARGUMENT,
              "dropout = 'lots': expected a number");
    CHECK_ERR(lk_model_create("mlp", (lk_model_kv[]){{"hidden", "64,x"}}, 1, 0, &l), LK_STATUS_INVALID_ARGUMENT,
              "hidden = '64,x'");
    CHECK_ERR(lk_model_create("cnn", (lk_model_kv[]){{"image_size", "30"}}, 1, 0, &l), LK_STATUS_INVALID_ARGUMENT,
              "multiple of 4");
    CHECK_ERR(lk_model_create("autoencoder", (lk_model_kv[]){{"final_activation", "relu"}}, 1, 0, &l),
              LK_STATUS_INVALID_ARGUMENT, "expected none or sigmoid");
    CHECK(l == NULL);
}

static void check_names(lk_layer *m, const char *const *want, int n) {
    lk_named_tensors sd = {0};
    CHECK_OK(lk_state_dict_get(m, &sd));
    CHECK_MSG(sd.n == n, "%d tensors, expected %d", sd.n, n);
    for (int i = 0; i < sd.n && i < n; i++) CHECK_MSG(!strcmp(sd.items[i].name, want[i]), "%d: %s, expected %s", i, sd.items[i].name, want[i]);
    lk_named_tensors_clear(&sd);
}

static void default_architectures(void) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create("autoencoder", NULL, 0, 1, &m));
    const char *ae[] = {"encoder.0.weight", "encoder.0.bias", "encoder.2.weight", "encoder.2.bias", "encoder.4.weight",
                        "encoder.4.bias",   "decoder.0.weight", "decoder.0.bias", "decoder.2.weight", "decoder.2.bias",
                        "decoder.4.weight", "decoder.4.bias"};
    check_names(m, ae, 12);
    CHECK(lk_layer_get_tensor(m, "encoder.0.weight")->shape[0] == 512 && lk_layer_get_tensor(m, "encoder.0.weight")->shape[1] == 784);
    CHECK(lk_layer_get_tensor(m, "decoder.4.weight")->shape[0] == 784);
    CHECK(lk_layer_num_parameters(m) == 2 * (784 * 512 + 512 * 256 + 256 * 64) + 512 + 256 + 64 + 256 + 512 + 784);
    lk_layer_free(m);
    CHECK_OK(lk_model_create("mlp", (lk_model_kv[]){{"dropout", "0.2"}}, 1, 1, &m));
    const char *mlp[] = {"layers.0.weight", "layers.0.bias", "layers.3.weight", "layers.3.bias", "layers.6.weight", "layers.6.bias"};
    check_names(m, mlp, 6);
    lk_layer_free(m);
    CHECK_OK(lk_model_create("cnn", NULL, 0, 1, &m));
    const char *cnn[] = {"conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                         "bn1.num_batches_tracked", "conv2.weight", "conv2.bias", "bn2.weight", "bn2.bias",
                         "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked", "fc1.weight", "fc1.bias",
                         "fc2.weight", "fc2.bias"};
    check_names(m, cnn, 18);
    CHECK(lk_layer_get_tensor(m, "fc1.weight")->shape[1] == 64 * 7 * 7);
    /* same seed, same weights; another seed, other weights */
    lk_layer *m2 = NULL, *m3 = NULL;
    CHECK_OK(lk_model_create("cnn", NULL, 0, 1, &m2));
    CHECK_OK(lk_model_create("cnn", NULL, 0, 2, &m3));
    CHECK(nn_rel_err(lk_layer_get_tensor(m, "fc1.weight"), lk_layer_get_tensor(m2, "fc1.weight")) == 0);
    CHECK(nn_rel_err(lk_layer_get_tensor(m, "fc1.weight"), lk_layer_get_tensor(m3, "fc1.weight")) > 0);
    lk_layer_free(m);
    lk_layer_free(m2);
    lk_layer_free(m3);
}

/* ---- training runs: TRAIN_RUNS of gen_nn_fixtures.py ------------------------------------------ */

typedef struct {
    const char *name, *model;
    lk_model_kv args[4];
    int n_args, batch, steps, in_dim, classes;
    lk_optim_kind opt;
    double lr, momentum;
} train_run;

static const train_run runs[] = {
    {"autoencoder_small", "autoencoder", {{"input_dim", "64"}, {"hidden", "32,16"}, {"latent_dim", "8"}}, 3, 8, 50, 64, 0,
     LK_OPTIM_ADAM, 1e-3, 0},
    {"autoencoder_sigmoid", "autoencoder",
     {{"input_dim", "64"}, {"hidden", "32"}, {"latent_dim", "8"}, {"final_activation", "sigmoid"}}, 4, 8, 50, 64, 0,
     LK_OPTIM_SGD, 0.5, 0.9},
    {"autoencoder_default", "autoencoder", {{0}}, 0, 4, 50, 784, 0, LK_OPTIM_ADAM, 1e-3, 0},
    {"mlp_small", "mlp", {{"input_dim", "64"}, {"hidden", "32,16"}, {"num_classes", "10"}}, 3, 8, 50, 64, 10, LK_OPTIM_SGD,
     0.1, 0.9},
    {"mlp_default", "mlp", {{0}}, 0, 4, 50, 784, 10, LK_OPTIM_ADAMW, 1e-3, 0},
    {"cnn_small", "cnn", {{"image_size", "8"}, {"channels", "4,8"}, {"hidden", "16"}}, 3, 4, 20, 64, 10, LK_OPTIM_ADAM,
     1e-3, 0},
};

static void train_one(const train_run *r, bool flat) {
    char fx[128];
    snprintf(fx, sizeof fx, "train.%s.loss", r->name);
    lk_tensor *want = nn_fixture(fx);
    lk_layer *m = NULL;
    lk_optimizer *o = NULL;
    lk_tensor *fp = NULL, *fg = NULL;
    lk_named_tensors ps = {0};
    CHECK_OK(lk_model_create(r->model, r->args, r->n_args, 0, &m));
    if (!m || !want) goto done;
    const lk_model_info *info = lk_model_find(r->model);
    nn_set_hash_weights(m, 500);
    if (flat) CHECK_OK(lk_params_flatten(m, NULL, &fp, &fg));
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    lk_optim_config cfg = r->opt == LK_OPTIM_SGD ? lk_sgd_config_default()
                          : r->opt == LK_OPTIM_ADAM ? lk_adam_config_default() : lk_adamw_config_default();
    cfg.lr = r->lr;
    cfg.momentum = r->momentum;
    CHECK_OK(lk_optimizer_create(&cfg, &ps, &o));
    double worst = 0;
    int worst_at = -1;
    for (int step = 0; step < r->steps && o; step++) {
        lk_tensor *x = nn_htensor(7000 + (uint64_t)step, 0.0, 1.0, LK_SHAPE(r->batch, r->in_dim));
        lk_tensor *y = r->classes ? nn_hlabels(8000 + (uint64_t)step, r->batch, r->classes) : NULL;
        lk_scope_begin();
        lk_tensor *out = lk_layer_forward(m, x);
        lk_tensor *loss = lk_model_loss(info, out, x, y);
        if (!loss && nn_unimplemented()) {
            printf("SKIP train %s: %s\n", r->name, lk_last_error());
            lk_clear_error();
            lk_scope_end();
            lk_tensor_release(x);
            lk_tensor_release(y);
            goto done;
        }
        lk_optimizer_zero_grad(o, false);
        CHECK_OK(lk_backward(loss));
        CHECK_OK(lk_optimizer_step(o));
        double got = loss ? lk_tensor_item(loss) : NAN, w = lk_tensor_get(want, step);
        double e = fabs(got - w) / fabs(w);
        if (!(e <= worst)) worst = e, worst_at = step;
        lk_scope_end();
        lk_tensor_release(x);
        lk_tensor_release(y);
    }
    /* 1e-4: the bound; f32 GEMMs in another summation order than
     * PyTorch's differ by ~1e-7 per op, and 50 optimizer steps amplify that
     * far less than this. */
    CHECK_MSG(worst <= 1e-4, "train %s%s: loss relative error %.3g at step %d", r->name, flat ? " (flat)" : "", worst, worst_at);
    printf("     train %-20s%s: %d steps, worst loss relative error %.2g\n", r->name, flat ? " flat" : "     ", r->steps, worst);
done:
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_layer_free(m);
    lk_tensor_release(want);
}

static void training_parity(void) {
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) train_one(&runs[i], false);
}

static void training_parity_flat(void) {
    train_one(&runs[0], true);
    train_one(&runs[3], true);
    train_one(&runs[5], true);
}

/* ---- a lockstep state dict in PyTorch ---------------------------------------------------- */

static bool torch_available(void) {
    if (access("/usr/bin/python3", X_OK) != 0) return false;
    return system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
}

/* Trains a few steps, writes the state dict, input and eval output under
 * a new temporary directory and appends "DIR MODEL 'KWARGS'" to cmd. */
static void torch_strict_load_one(const char *model, const lk_model_kv *args, int n_args, const char *kwargs_json,
                                  int in_dim, int classes, char *cmd, size_t cmd_size, char dirs[][32]) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create(model, args, n_args, 1234, &m));
    if (!m) return;
    /* a few training steps so BatchNorm's running statistics and counters move */
    lk_named_tensors ps = {0}, sd = {0};
    lk_layer_named_parameters(m, &ps);
    lk_optim_config cfg = lk_adam_config_default();
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(&cfg, &ps, &o));
    const lk_model_info *info = lk_model_find(model);
    for (int step = 0; step < 3 && o; step++) {
        lk_tensor *x = nn_htensor(100 + (uint64_t)step, 0, 1, LK_SHAPE(4, in_dim));
        lk_tensor *y = classes ? nn_hlabels(200 + (uint64_t)step, 4, classes) : NULL;
        lk_scope_begin();
        lk_optimizer_zero_grad(o, false);
        CHECK_OK(lk_backward(lk_model_loss(info, lk_layer_forward(m, x), x, y)));
        CHECK_OK(lk_optimizer_step(o));
        lk_scope_end();
        lk_tensor_release(x);
        lk_tensor_release(y);
    }
    char *dir = dirs[0], path[600];
    snprintf(dir, 32, "/tmp/lk_nn_sd_XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(lk_state_dict_get(m, &sd));
    snprintf(path, sizeof path, "%s/names.txt", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    for (int i = 0; f && i < sd.n; i++) {
        fprintf(f, "%s\n", sd.items[i].name);
        snprintf(path, sizeof path, "%s/%d.npy", dir, i);
        CHECK_OK(lk_npy_save(path, sd.items[i].tensor));
    }
    if (f) fclose(f);
    lk_layer_train(m, false);
    lk_tensor *x = nn_htensor(999, 0, 1, LK_SHAPE(3, in_dim));
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(m, x);
    CHECK(y != NULL);
    snprintf(path, sizeof path, "%s/x.npy", dir);
    CHECK_OK(lk_npy_save(path, x));
    snprintf(path, sizeof path, "%s/y.npy", dir);
    if (y) CHECK_OK(lk_npy_save(path, y));
    lk_scope_end();
    size_t len = strlen(cmd);
    snprintf(cmd + len, cmd_size - len, " %s %s '%s'", dir, model, kwargs_json);
    lk_tensor_release(x);
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&sd);
    lk_layer_free(m);
}

static void torch_strict_load(void) {
    if (!torch_available()) {
        printf("SKIP torch_strict_load: /usr/bin/python3 cannot import torch (install python3-torch)\n");
        return;
    }
    char cmd[4096], dirs[3][32];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/models/torch_load_check.py", LK_SOURCE_DIR);
    torch_strict_load_one("autoencoder", (lk_model_kv[]){{"hidden", "64,32"}, {"latent_dim", "8"}}, 2,
                          "{\"hidden\": [64, 32], \"latent_dim\": 8}", 784, 0, cmd, sizeof cmd, &dirs[0]);
    torch_strict_load_one("mlp", (lk_model_kv[]){{"hidden", "32"}, {"dropout", "0.5"}}, 2,
                          "{\"hidden\": [32], \"dropout\": 0.5}", 784, 10, cmd, sizeof cmd, &dirs[1]);
    torch_strict_load_one("cnn", (lk_model_kv[]){{"channels", "4,8"}, {"hidden", "16"}}, 2,
                          "{\"channels\": [4, 8], \"hidden\": 16}", 784, 10, cmd, sizeof cmd, &dirs[2]);
    fflush(stdout);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "PyTorch strict load / output check failed (rc %d); files kept in %s %s %s", rc, dirs[0], dirs[1],
              dirs[2]);
    for (int i = 0; rc == 0 && i < 3; i++) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", dirs[i]);
        CHECK(system(cmd) == 0);
    }
}

/* SQLite-style: fail the Nth allocation for N = 1, 2, ... until the call
 * succeeds; every failure must be a clean error (ASan checks for leaks). */
static void allocation_failures(void) {
    int n_fail = 0;
    for (long n = 1; n < 5000; n++) {
        lk_layer *m = NULL;
        lk_tensor *fp = NULL, *fg = NULL;
        lk_optimizer *o = NULL;
        lk_named_tensors ps = {0};
        lk_clear_error();
        lk_alloc_fail_after(n);
        lk_status st = lk_model_create("cnn", (lk_model_kv[]){{"channels", "2,3"}, {"hidden", "4"}}, 2, 1, &m);
        if (!st) st = lk_params_flatten(m, NULL, &fp, &fg);
        if (!st) st = lk_layer_named_parameters(m, &ps);
        lk_optim_config cfg = lk_adam_config_default();
        if (!st) st = lk_optimizer_create(&cfg, &ps, &o);
        lk_alloc_fail_after(0);
        if (st) {
            n_fail++;
            CHECK_MSG(st == LK_STATUS_OUT_OF_MEMORY,
                      "allocation %ld: status %s: %s", n, lk_status_str(st), lk_last_error());
        }
        lk_optimizer_free(o);
        lk_named_tensors_clear(&ps);
        lk_tensor_release(fp);
        lk_tensor_release(fg);
        lk_layer_free(m);
        if (!st) break;
    }
    CHECK(n_fail > 20);
}

LK_TEST_MAIN(LK_TEST_CASE(registry), LK_TEST_CASE(allocation_failures), LK_TEST_CASE(default_architectures), LK_TEST_CASE(training_parity),
             LK_TEST_CASE(training_parity_flat), LK_TEST_CASE(torch_strict_load))
