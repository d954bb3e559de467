/* The trainer through its C API: numerical safety (a non-finite loss stops
 * the run naming the step; a non-finite gradient names the parameter),
 * Lightning's logging rules, and bad modules. */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"

static const lk_model_kv data_args[] = {{"num_samples", "320"}, {"input_shape", "[4]"}, {"num_classes", "2"},
                                        {"batch_size", "16"}, {"num_workers", "0"}};

typedef enum { MODE_NAN_LOSS, MODE_INF_GRAD, MODE_LOGGING, MODE_VAL_SEQ } mode;
static mode test_mode;
static const double *val_seq; /* MODE_VAL_SEQ: the value "val_seq" takes at each epoch's validation */
static void (*tweak)(lk_trainer_config *);

static lk_tensor *step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    lk_tensor *w = lk_layer_param(m->net, 0); /* Linear(4, 1).weight */
    lk_tensor *x = lk_batch_tensor(b, 0);
    lk_tensor *loss = lk_mean(lk_linear(x, w, NULL), NULL, 0, false);
    if (test_mode == MODE_NAN_LOSS && lk_trainer_global_step(tr) == 3) return lk_mul_scalar(loss, NAN);
    if (test_mode == MODE_INF_GRAD) {
        /* sqrt at 0: a finite loss whose gradient is infinite */
        lk_tensor *z = lk_mul_scalar(w, 0.0f);
        loss = lk_add(loss, lk_sum(lk_sqrt(lk_abs(z)), NULL, 0, false));
    }
    if (test_mode == MODE_LOGGING) {
        lk_log_metric(tr, "plain", (double)i, NULL);                                    /* step only */
        lk_log_metric(tr, "both", 1.0, &(lk_log_opts){.on_step = 1, .on_epoch = 1});     /* _step and _epoch */
        lk_log_metric(tr, "size", (double)b->size, &(lk_log_opts){.on_step = -1, .on_epoch = 1});
        /* an epoch mean whose bits depend on every batch's value and order */
        lk_log_metric(tr, "mean_i", 0.1 * (double)i + 1.0 / 3.0, &(lk_log_opts){.on_step = -1, .on_epoch = 1});
        lk_log_metric(tr, "max_i", (double)((i * 7) % 11), &(lk_log_opts){.on_step = -1, .on_epoch = 1, .reduce = LK_LOG_REDUCE_MAX});
    }
    return loss;
}

static lk_status val_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    if (test_mode == MODE_VAL_SEQ) return lk_log_metric(tr, "val_seq", val_seq[lk_trainer_current_epoch(tr)], NULL);
    /* a value equal to the batch index: the epoch mean is weighted by batch size */
    return lk_log_metric(tr, "val_idx", (double)i, NULL);
}

static const lk_module_vtable vt = {.training_step = step, .validation_step = val_step};

static const char *fit_ckpt_path; /* fit()'s ckpt_path (NULL: none) */
static lk_status fit(mode md, int64_t max_steps, lk_trainer **keep) {
    test_mode = md;
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.max_steps = max_steps;
    cfg.max_epochs = 1;
    cfg.enable_progress_bar = false;
    cfg.enable_checkpointing = false;
    cfg.enable_tensorboard = false;
    cfg.num_sanity_val_steps = 0;
    cfg.log_every_n_steps = 1;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_trainer_%d", (int)getpid());
    if (tweak) tweak(&cfg);
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    lk_module m = {.name = "probe", .vt = &vt, .net = lk_linear_create(4, 1, false, NULL)};
    lk_status st = lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm);
    if (!st) st = lk_trainer_create(&cfg, NULL, NULL, &tr);
    if (!st) st = lk_trainer_fit(tr, &m, dm, fit_ckpt_path);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    if (keep && tr) *keep = tr;
    else lk_trainer_free(tr);
    lk_datamodule_free(dm);
    lk_layer_free(m.net);
    if (st) lk_error(st, "%s", msg);
    return st;
}

static void nan_loss_names_the_step(void) {
    CHECK_ERR(fit(MODE_NAN_LOSS, 10, NULL), LK_STATUS_ABORTED, "the loss is nan at step 3");
}

static void inf_gradient_names_the_parameter(void) {
    CHECK_ERR(fit(MODE_INF_GRAD, 10, NULL), LK_STATUS_ABORTED, "non-finite gradient at step 0");
    CHECK(strstr(lk_last_error(), "parameter 'weight'") != NULL);
}

static void logging_rules(void) {
    lk_trainer *tr = NULL;
    CHECK_OK(fit(MODE_LOGGING, 100, &tr));
    if (!tr) return;
    double v;
    /* 256 training samples (80% of 320) in batches of 16: 16 batches, indices 0..15 */
    CHECK(lk_trainer_metric(tr, "plain", &v) && v == 15.0);
    CHECK(lk_trainer_metric(tr, "both", &v) && v == 1.0);
    CHECK(lk_trainer_metric(tr, "size", &v) && v == 16.0);
    /* 32 validation samples: batches 0 and 1 of 16 -> weighted mean 0.5 */
    CHECK(lk_trainer_metric(tr, "val_idx", &v) && fabs(v - 0.5) < 1e-12);
    char path[2200];
    snprintf(path, sizeof path, "%s/metrics.csv", lk_trainer_log_dir(tr));
    FILE *f = fopen(path, "r");
    char header[512] = "";
    if (f) {
        CHECK(fgets(header, sizeof header, f) != NULL);
        fclose(f);
    }
    CHECK_MSG(strstr(header, "both_step") && strstr(header, "both_epoch") && strstr(header, "plain") &&
                  strstr(header, "size") && !strstr(header, "size_step") && strstr(header, "val_idx"),
              "header: %s", header);
    lk_trainer_free(tr);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_trainer_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

/* EarlyStopping against a metric whose value per epoch the test chooses. */
static int es_patience;
static const char *es_mode;
static void es_config(lk_trainer_config *c) {
    c->max_epochs = 6;
    c->max_steps = -1;
    c->limit_train_batches = (lk_count_or_fraction){.value = 1, .is_count = true};
    snprintf(c->early_stopping_monitor, sizeof c->early_stopping_monitor, "val_seq");
    snprintf(c->early_stopping_mode, sizeof c->early_stopping_mode, "%s", es_mode);
    c->early_stopping_patience = es_patience;
}

static int64_t es_epochs(const double *seq, const char *md, int patience) {
    val_seq = seq, es_mode = md, es_patience = patience, tweak = es_config;
    lk_trainer *tr = NULL;
    lk_status st = fit(MODE_VAL_SEQ, -1, &tr);
    tweak = NULL;
    CHECK_MSG(!st, "%s", lk_last_error());
    int64_t steps = tr ? lk_trainer_global_step(tr) : -1; /* one batch per epoch: steps == epochs run */
    lk_trainer_free(tr);
    return steps;
}

static void early_stopping_modes(void) {
    /* A falling val metric improves at every check: min mode never stops
     * (the bug: the best started at 0, so nothing above 0 ever improved). */
    static const double falling[] = {1.186, 0.997, 0.831, 0.7, 0.6, 0.5};
    CHECK_MSG(es_epochs(falling, "min", 2) == 6, "min mode stopped a falling metric early");
    /* A plateau after the first check: patience 2 stops after checks 2 and 3. */
    static const double flat[] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    CHECK_MSG(es_epochs(flat, "min", 2) == 3, "min mode on a plateau: wanted 3 epochs");
    /* max mode with negative values: -3 < -2 < -1 improve, then stalls */
    static const double rising[] = {-3, -2, -1, -1, -1, -1};
    CHECK_MSG(es_epochs(rising, "max", 2) == 5, "max mode: wanted 5 epochs");
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_trainer_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

/* A run stopped inside an epoch (max_steps here; a signal takes the same
 * path) and resumed from last.ckpt logs the rows an uninterrupted run
 * logs, the stopped epoch's means from every batch, bit for bit, and no
 * partial row of its own. */
static char resume_root[128];
static void resume_config(lk_trainer_config *c) {
    c->max_epochs = 2;
    c->enable_checkpointing = true;
    c->log_every_n_steps = 3;
    snprintf(c->default_root_dir, sizeof c->default_root_dir, "%s", resume_root);
}

static char *slurp_rows(const char *dir, int skip_header) {
    char path[2300];
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[3][65536];
    static int k;
    char *out = buf[k++ % 3];
    size_t n = 0;
    char line[4096];
    for (int no = 0; fgets(line, sizeof line, f); no++)
        if (no >= skip_header) n += (size_t)snprintf(out + n, sizeof buf[0] - n, "%s", line);
    out[n] = 0;
    fclose(f);
    return out;
}

static void resume_inside_epoch_logs_exact_rows(void) {
    snprintf(resume_root, sizeof resume_root, "/tmp/lk_test_trainer_resume_%d", (int)getpid());
    tweak = resume_config;
    lk_trainer *tr = NULL;
    double full_mean = 0, full_max = 0, mean = 1, mx = 1;
    char full_dir[2048] = "", stop_dir[2048] = "", res_dir[2048] = "";
    CHECK_OK(fit(MODE_LOGGING, -1, &tr));
    if (tr) {
        CHECK(lk_trainer_metric(tr, "mean_i", &full_mean) && lk_trainer_metric(tr, "max_i", &full_max));
        snprintf(full_dir, sizeof full_dir, "%s", lk_trainer_log_dir(tr));
        lk_trainer_free(tr), tr = NULL;
    }
    /* 16 batches an epoch: step 21 is batch 5 of epoch 1 */
    CHECK_OK(fit(MODE_LOGGING, 21, &tr));
    if (tr) {
        snprintf(stop_dir, sizeof stop_dir, "%s", lk_trainer_log_dir(tr));
        lk_trainer_free(tr), tr = NULL;
    }
    char last[2200];
    snprintf(last, sizeof last, "%s/checkpoints/last.ckpt", stop_dir);
    fit_ckpt_path = last;
    CHECK_OK(fit(MODE_LOGGING, -1, &tr));
    fit_ckpt_path = NULL;
    if (tr) {
        CHECK(lk_trainer_metric(tr, "mean_i", &mean) && lk_trainer_metric(tr, "max_i", &mx));
        snprintf(res_dir, sizeof res_dir, "%s", lk_trainer_log_dir(tr));
        CHECK(lk_trainer_global_step(tr) == 32);
        lk_trainer_free(tr), tr = NULL;
    }
    tweak = NULL;
    CHECK_MSG(memcmp(&mean, &full_mean, sizeof mean) == 0, "mean_i %.17g, uninterrupted %.17g", mean, full_mean);
    CHECK_MSG(mx == full_max, "max_i %g, uninterrupted %g", mx, full_max);
    /* the stopped run's rows followed by the resumed run's are the uninterrupted run's */
    char *full = slurp_rows(full_dir, 0), *a = slurp_rows(stop_dir, 0), *b = slurp_rows(res_dir, 1);
    CHECK(full && a && b);
    if (full && a && b) {
        char both[131072];
        snprintf(both, sizeof both, "%s%s", a, b);
        CHECK_MSG(!strcmp(both, full), "rows differ:\n--- uninterrupted\n%s--- stopped + resumed\n%s", full, both);
    }
    char rm[160];
    snprintf(rm, sizeof rm, "rm -rf %s", resume_root);
    CHECK(system(rm) == 0);
}

static void bad_modules(void) {
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.enable_progress_bar = false;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    lk_datamodule *dm = NULL;
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm));
    static const lk_module_vtable empty = {0};
    lk_module m = {.name = "empty", .vt = &empty, .net = lk_linear_create(4, 1, false, NULL)};
    CHECK_ERR(lk_trainer_fit(tr, &m, dm, NULL), LK_STATUS_INVALID_ARGUMENT, "module 'empty' has no training_step");
    CHECK_ERR(lk_trainer_fit(tr, NULL, dm, NULL), LK_STATUS_INVALID_ARGUMENT, "a module with a network is required");
    lk_layer_free(m.net);
    lk_trainer_free(tr);
    lk_datamodule_free(dm);
    /* Started alone with devices=2, the trainer is the job's launcher (its
     * fit would start the ranks: tests/capi/test_self_launch.c does). */
    cfg.devices = 2;
    tr = NULL;
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    CHECK(tr && lk_trainer_is_launcher(tr) && lk_trainer_rank(tr) == -1 && lk_trainer_world_size(tr) == 2);
    lk_trainer_free(tr);
    /* No launcher here can start ranks on other nodes, and 'single' is one process. */
    cfg.devices = 1;
    cfg.num_nodes = 2;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_USAGE, "needs 2 processes");
    cfg.devices = 2;
    cfg.num_nodes = 1;
    snprintf(cfg.strategy, sizeof cfg.strategy, "single");
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_USAGE, "needs 2 processes");
}

/* trainer.float32_matmul_precision: checked, set for the trainer's life
 * (process-wide, as torch's), put back when it is freed. */
static void float32_matmul_precision(void) {
    CHECK(!strcmp(lk_float32_matmul_precision(), "highest"));
    CHECK_ERR(lk_set_float32_matmul_precision("fast"), LK_STATUS_INVALID_ARGUMENT, "expected highest, high or medium");
    CHECK(!strcmp(lk_float32_matmul_precision(), "highest"));
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    CHECK(!strcmp(cfg.float32_matmul_precision, "highest"));
    snprintf(cfg.float32_matmul_precision, sizeof cfg.float32_matmul_precision, "tf32");
    lk_trainer *tr = NULL;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_ARGUMENT,
              "trainer.float32_matmul_precision 'tf32': expected highest, high or medium");
    snprintf(cfg.float32_matmul_precision, sizeof cfg.float32_matmul_precision, "high");
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    CHECK(!strcmp(lk_float32_matmul_precision(), "high"));
    lk_trainer_free(tr);
    CHECK(!strcmp(lk_float32_matmul_precision(), "highest"));
}

LK_TEST_MAIN(LK_TEST_CASE(nan_loss_names_the_step), LK_TEST_CASE(inf_gradient_names_the_parameter),
             LK_TEST_CASE(logging_rules), LK_TEST_CASE(early_stopping_modes),
             LK_TEST_CASE(resume_inside_epoch_logs_exact_rows),
             LK_TEST_CASE(bad_modules), LK_TEST_CASE(float32_matmul_precision))
