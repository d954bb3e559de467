/* A user's program that starts its own ranks (trainer.h, "Starting the
 * ranks"). Run alone with devices=2, its trainer is a launcher: fit runs this
 * program again as 2 ranks and returns the job's status; the ranks append
 * what they did to a log the launcher then reads. Usage:
 *   test_capi_self_launch ok    both ranks fit and validate; later calls in
 *                               the launcher start nothing
 *   test_capi_self_launch fail  rank 1 fails in its second step: fit in the
 *                               launcher returns LK_STATUS_REMOTE naming the
 *                               exit status, and so does the next call
 * The launcher passes the log's directory to the ranks in the environment
 * (argv must stay what it was: the ranks get the same). */
#include <stdlib.h>
#include <unistd.h>

#include "lk_test.h"

static const lk_model_kv data_args[] = {{"num_samples", "256"}, {"input_shape", "[4]"}, {"num_classes", "2"},
                                        {"batch_size", "16"}, {"num_workers", "0"}};
static bool fail_mode;

static lk_tensor *training_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    if (fail_mode && lk_trainer_rank(tr) == 1 && i == 1) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "rank 1 fails on purpose");
        return NULL;
    }
    return lk_cross_entropy(lk_layer_forward(m->net, lk_batch_tensor(b, 0)), lk_batch_tensor(b, 1), NULL);
}

static lk_status validation_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    lk_tensor *loss = lk_cross_entropy(lk_layer_forward(m->net, lk_batch_tensor(b, 0)), lk_batch_tensor(b, 1), NULL);
    return loss ? lk_log_metric(tr, "val_loss", lk_tensor_item(loss), NULL) : lk_last_status();
}

static const lk_module_vtable vt = {.training_step = training_step, .validation_step = validation_step};

/* One line per rank and call: "<call> <rank> <world> <pid> <status>". */
static void note(const char *call, lk_trainer *tr, lk_status st) {
    char path[512];
    snprintf(path, sizeof path, "%s/ranks.log", getenv("CAPI_TEST_DIR"));
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d %d %d %d\n", call, lk_trainer_rank(tr), lk_trainer_world_size(tr), (int)getpid(), (int)st);
    fclose(f);
}

static int count_lines(const char *dir, const char *prefix) {
    char path[512], line[256];
    snprintf(path, sizeof path, "%s/ranks.log", dir);
    FILE *f = fopen(path, "r");
    int n = 0;
    while (f && fgets(line, sizeof line, f)) n += !strncmp(line, prefix, strlen(prefix));
    if (f) fclose(f);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "ok") && strcmp(argv[1], "fail"))) {
        fprintf(stderr, "usage: %s ok|fail\n", argv[0]);
        return 2;
    }
    fail_mode = !strcmp(argv[1], "fail");
    bool alone = !getenv("RANK");
    char dir[] = "/tmp/lk_capi_XXXXXX";
    if (alone) { /* the launcher-to-be: the ranks inherit the environment */
        CHECK(mkdtemp(dir) != NULL);
        setenv("CAPI_TEST_DIR", dir, 1);
    }
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.devices = 2;
    snprintf(cfg.strategy, sizeof cfg.strategy, "ddp");
    cfg.max_epochs = 1;
    cfg.enable_progress_bar = false;
    cfg.enable_checkpointing = false;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", getenv("CAPI_TEST_DIR"));
    lk_datamodule *dm = NULL;
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm));
    lk_module m = {.name = "tiny", .vt = &vt, .net = lk_linear_create(4, 2, true, NULL)};
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    if (!tr || !dm) return 1;

    if (!lk_trainer_is_launcher(tr)) { /* a rank: the ordinary path */
        CHECK(!alone);
        lk_status st = lk_trainer_fit(tr, &m, dm, NULL);
        note("fit", tr, st);
        if (!st) {
            st = lk_trainer_validate(tr, &m, dm, NULL);
            note("validate", tr, st);
        }
        if (st) fprintf(stderr, "%s\n", lk_last_error());
        lk_trainer_free(tr);
        lk_layer_free(m.net);
        lk_datamodule_free(dm);
        return st || lk_t_failed_checks ? 1 : 0;
    }

    CHECK(alone);
    CHECK(lk_trainer_rank(tr) == -1);
    CHECK(lk_trainer_world_size(tr) == 2);
    if (!fail_mode) {
        CHECK_OK(lk_trainer_fit(tr, &m, dm, NULL));
        CHECK_MSG(count_lines(dir, "fit ") == 2 && count_lines(dir, "validate ") == 2, "fit %d, validate %d lines",
                  count_lines(dir, "fit "), count_lines(dir, "validate "));
        CHECK(count_lines(dir, "fit 0 2 ") == 1 && count_lines(dir, "fit 1 2 ") == 1);
        /* The ranks already ran main to the end: nothing starts again. */
        CHECK_OK(lk_trainer_validate(tr, &m, dm, NULL));
        CHECK(count_lines(dir, "fit ") == 2 && count_lines(dir, "validate ") == 2);
        double v;
        CHECK(!lk_trainer_metric(tr, "val_loss", &v)); /* the ranks have the metrics, not the launcher */
    } else {
        CHECK_ERR(lk_trainer_fit(tr, &m, dm, NULL), LK_STATUS_REMOTE, "the first failing rank exited with status 1");
        CHECK(strstr(lk_last_error(), "test_capi_self_launch") != NULL); /* names the program */
        CHECK_MSG(count_lines(dir, "fit 1 2 ") == 1 && count_lines(dir, "validate ") == 0, "fit 1: %d, validate: %d",
                  count_lines(dir, "fit 1 2 "), count_lines(dir, "validate "));
        CHECK_ERR(lk_trainer_test(tr, &m, dm, NULL), LK_STATUS_REMOTE, "the first failing rank exited with status 1");
        CHECK(count_lines(dir, "fit 1 2 ") == 1);
    }
    lk_trainer_free(tr);
    lk_layer_free(m.net);
    lk_datamodule_free(dm);
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    CHECK(system(rm) == 0);
    printf("%s: %s\n", argv[1], lk_t_failed_checks ? "FAILED" : "ok");
    return lk_t_failed_checks ? 1 : 0;
}
