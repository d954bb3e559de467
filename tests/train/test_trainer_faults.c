/* The trainer meeting faults of its own files and numbers, through the C
 * API: a full disk fails the checkpoint and run.json alike and the user
 * still sees the checkpoint's error (the first one); temporaries that a
 * killed writer left ("last.ckpt.tmp.<pid>") are removed at the next start,
 * while a live writer's are kept; a loss that is negative NaN is reported as
 * "nan", as docs/ERRORS.md says. */
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "io/safetensors.h"

static const lk_model_kv data_args[] = {{"num_samples", "320"}, {"input_shape", "[4]"}, {"num_classes", "2"},
                                        {"batch_size", "16"}, {"num_workers", "0"}};

typedef enum { MODE_PLAIN, MODE_BLOCK_RUNINFO, MODE_NEG_NAN } mode;
static mode test_mode;
static char root[256];

static lk_tensor *step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    (void)i;
    lk_tensor *w = lk_layer_param(m->net, 0);
    lk_tensor *loss = lk_mean(lk_linear(lk_batch_tensor(b, 0), w, NULL), NULL, 0, false);
    if (test_mode == MODE_BLOCK_RUNINFO && lk_trainer_global_step(tr) == 0) {
        /* run.json cannot be written either: its temporary name is taken by a directory */
        char p[2300];
        snprintf(p, sizeof p, "%s/run.json.tmp.%d", lk_trainer_log_dir(tr), (int)getpid());
        mkdir(p, 0755);
    }
    if (test_mode == MODE_NEG_NAN && lk_trainer_global_step(tr) == 3) return lk_mul_scalar(loss, -NAN);
    return loss;
}

static const lk_module_vtable vt = {.training_step = step};

static lk_status fit(mode md, bool checkpoints) {
    test_mode = md;
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.max_steps = 6;
    cfg.max_epochs = 1;
    cfg.enable_progress_bar = false;
    cfg.enable_checkpointing = checkpoints;
    cfg.every_n_train_steps = 2;
    cfg.enable_tensorboard = false;
    cfg.num_sanity_val_steps = 0;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", root);
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    lk_module m = {.name = "probe", .vt = &vt, .net = lk_linear_create(4, 1, false, NULL)};
    lk_status st = lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm);
    if (!st) st = lk_trainer_create(&cfg, NULL, NULL, &tr);
    if (!st) st = lk_trainer_fit(tr, &m, dm, NULL);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    lk_trainer_free(tr);
    lk_datamodule_free(dm);
    lk_layer_free(m.net);
    if (st) lk_error(st, "%s", msg);
    return st;
}

static void clean(void) {
    snprintf(root, sizeof root, "/tmp/lk_test_trainer_faults_%d", (int)getpid());
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", root);
    CHECK(system(rm) == 0);
}

static void disk_full_reports_the_first_error(void) {
    clean();
    lk__safetensors_fail_after(100, ENOSPC); /* the first checkpoint meets a full disk */
    CHECK_ERR(fit(MODE_BLOCK_RUNINFO, true), LK_STATUS_IO, "last.ckpt");
    lk__safetensors_fail_after(-1, 0);
    CHECK_MSG(strstr(lk_last_error(), "No space left on device") != NULL, "got: %s", lk_last_error());
    CHECK_MSG(strstr(lk_last_error(), "run.json") == NULL, "run.json's error replaced the checkpoint's: %s",
              lk_last_error());
    clean();
}

static bool exists(const char *p) { return access(p, F_OK) == 0; }

static void touch(const char *p) {
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) fputs("partial", f), fclose(f);
}

static void stale_temporaries_removed_at_start(void) {
    clean();
    pid_t dead = fork(); /* a pid that is certainly not running any more */
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char dir[512], ck[600], a[700], b[700], c[700], live[700], other[700];
    snprintf(dir, sizeof dir, "%s/lightning_logs/version_0", root);
    snprintf(ck, sizeof ck, "%s/checkpoints", dir);
    char mk[700];
    snprintf(mk, sizeof mk, "mkdir -p %s", ck);
    CHECK(system(mk) == 0);
    snprintf(a, sizeof a, "%s/last.ckpt.tmp.%d", ck, (int)dead);
    snprintf(b, sizeof b, "%s/epoch=0-step=4.ckpt.tmp.%d", ck, (int)dead);
    snprintf(c, sizeof c, "%s/run.json.tmp.%d", dir, (int)dead);
    snprintf(live, sizeof live, "%s/last.ckpt.tmp.%d", ck, (int)getppid()); /* a writer that is alive */
    snprintf(other, sizeof other, "%s/notes.tmp.txt", ck);                   /* not a temporary of ours */
    touch(a), touch(b), touch(c), touch(live), touch(other);
    CHECK_OK(fit(MODE_PLAIN, true));
    CHECK_MSG(!exists(a), "%s is still there", a);
    CHECK_MSG(!exists(b), "%s is still there", b);
    CHECK_MSG(!exists(c), "%s is still there", c);
    CHECK_MSG(exists(live), "a live writer's %s was removed", live);
    CHECK(exists(other));
    clean();
}

static void negative_nan_loss_reads_nan(void) {
    clean();
    CHECK_ERR(fit(MODE_NEG_NAN, false), LK_STATUS_ABORTED, "the loss is nan at step 3");
    clean();
}

LK_TEST_MAIN(LK_TEST_CASE(disk_full_reports_the_first_error), LK_TEST_CASE(stale_temporaries_removed_at_start),
             LK_TEST_CASE(negative_nan_loss_reads_nan))
