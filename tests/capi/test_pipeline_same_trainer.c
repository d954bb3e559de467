/* A pipeline trained and then evaluated through the C API on one trainer
 * (trainer.h's "fit, then test" in one program): after lk_trainer_fit the
 * same trainer validates, tests and predicts through its stages with the
 * weights fit left there (ckpt_path NULL), and the test metrics and the
 * predictions equal those of the same calls from fit's last checkpoint
 * ("last", loaded into the stages) bit for bit. Run alone, the trainer is
 * a launcher (devices 2): the ranks run main again and report through a
 * file; the launcher checks what they wrote. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lk_test.h"

static const lk_model_kv model_args[] = {{"input_dim", "12"}, {"hidden", "16,8"}, {"num_classes", "5"}};
static const lk_model_kv data_args[] = {{"num_samples", "200"}, {"input_shape", "[12]"}, {"num_classes", "5"},
                                        {"batch_size", "16"}, {"num_workers", "0"}};

/* The bytes of a file (NULL if it cannot be read); *n its size. */
static char *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)*n + 1);
    if (b && fread(b, 1, (size_t)*n, f) != (size_t)*n) free(b), b = NULL;
    fclose(f);
    return b;
}

static void report(const char *dir, const char *line) {
    char path[512];
    snprintf(path, sizeof path, "%s/ranks.log", dir);
    FILE *f = fopen(path, "a");
    if (f) fprintf(f, "%s\n", line), fclose(f);
}

/* A rank: fit, then validate, test and predict on the same trainer, from
 * its live weights and then from the last checkpoint. */
static int rank_main(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *dir) {
    int r = lk_trainer_rank(tr);
    char line[512], pred[2][1024];
    double t[2] = {0, 0};
    lk_status st = lk_trainer_fit(tr, m, dm, NULL);
    if (!st) st = lk_trainer_validate(tr, m, dm, NULL);
    for (int k = 0; k < 2 && !st; k++) { /* 0: the weights fit left; 1: the last checkpoint */
        const char *ck = k ? "last" : NULL;
        st = lk_trainer_test(tr, m, dm, ck);
        if (!st && r == 0 && !lk_trainer_metric(tr, "test_loss", &t[k])) st = LK_STATUS_INTERNAL;
        if (!st) st = lk_trainer_predict(tr, m, dm, ck);
        snprintf(pred[k], sizeof pred[k], "%s/predictions.npy", lk_trainer_log_dir(tr));
        if (!st && r == 0) { /* each call its own version directory: keep the file */
            char keep[1100];
            snprintf(keep, sizeof keep, "%s/pred%d.npy", dir, k);
            if (rename(pred[k], keep)) st = LK_STATUS_IO;
        }
    }
    snprintf(line, sizeof line, "rank %d status %d test_loss %a %a", r, (int)st, t[0], t[1]);
    report(dir, line);
    if (st) fprintf(stderr, "rank %d: %s\n", r, lk_last_error());
    return st ? 1 : 0;
}

int main(void) {
    bool alone = !getenv("RANK");
    char dir[] = "/tmp/lk_capi_pipe_XXXXXX";
    if (alone) {
        CHECK(mkdtemp(dir) != NULL);
        setenv("CAPI_TEST_DIR", dir, 1);
    }
    const char *d = getenv("CAPI_TEST_DIR");
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.devices = 2;
    snprintf(cfg.strategy, sizeof cfg.strategy, "pipeline");
    cfg.pipeline_chunks = 2;
    cfg.max_epochs = -1;
    cfg.max_steps = 12;
    cfg.enable_progress_bar = false;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", d);
    lk_datamodule *dm = NULL;
    lk_module *m = NULL;
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm));
    CHECK_OK(lk_module_create_builtin("mlp", model_args, 3, 1, &m));
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    if (!tr || !dm || !m) return 1;
    if (!lk_trainer_is_launcher(tr)) {
        int rc = rank_main(tr, m, dm, d);
        lk_trainer_free(tr);
        lk_module_free(m);
        lk_datamodule_free(dm);
        return rc || lk_t_failed_checks ? 1 : 0;
    }
    CHECK_OK(lk_trainer_fit(tr, m, dm, NULL)); /* the whole job: every rank ran main to its end */
    char path[600], line[256];
    snprintf(path, sizeof path, "%s/ranks.log", d);
    FILE *f = fopen(path, "r");
    int ranks = 0;
    double t0 = 0, t1 = 0;
    while (f && fgets(line, sizeof line, f)) {
        int r, st;
        double a, b;
        char sa[64], sb[64];
        if (sscanf(line, "rank %d status %d test_loss %63s %63s", &r, &st, sa, sb) != 4) continue;
        a = strtod(sa, NULL), b = strtod(sb, NULL);
        CHECK_MSG(st == 0, "rank %d: status %d", r, st);
        if (r == 0) t0 = a, t1 = b;
        ranks++;
    }
    if (f) fclose(f);
    CHECK_MSG(ranks == 2, "%d ranks reported", ranks);
    CHECK_MSG(t0 > 0 && isfinite(t0), "test_loss after fit: %g", t0);
    CHECK_MSG(t0 == t1, "test_loss on fit's weights %a, from the last checkpoint %a", t0, t1);
    long n0 = 0, n1 = 0;
    char p0[600], p1[600];
    snprintf(p0, sizeof p0, "%s/pred0.npy", d);
    snprintf(p1, sizeof p1, "%s/pred1.npy", d);
    char *a = slurp(p0, &n0), *b = slurp(p1, &n1);
    CHECK_MSG(a && b && n0 > 128 && n0 == n1 && !memcmp(a, b, (size_t)n0),
              "predictions on fit's weights (%ld bytes) and from the last checkpoint (%ld bytes) differ", n0, n1);
    free(a), free(b);
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", d);
    CHECK(system(rm) == 0);
    printf("pipeline fit, then validate / test / predict on the same trainer: %s\n", lk_t_failed_checks ? "FAILED" : "ok");
    return lk_t_failed_checks ? 1 : 0;
}
