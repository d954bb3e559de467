/* Cost of the trainer's output calls (not a test): per-call time of CSV and
 * TensorBoard log_metrics (5 metrics) and of a throttled progress update.
 *   build: see tests/train_out/tests.cmake (target bench_train_out)
 *   run:   bench_train_out [calls]                                        */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/loggers.h"

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) { return remove(path); }

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 20000;
    char root[] = "/tmp/lk_out_bench_XXXXXX";
    if (!mkdtemp(root)) return 1;
    const char *names[] = {"train_loss", "epoch", "lr-Adam", "val_loss", "grad_norm"};
    double vals[] = {0.25, 1, 1e-3, 0.3, 2.5};
    lk_logger *csv = NULL, *tb = NULL;
    if (lk_csv_logger_create(root, NULL, -1, &csv) || lk_tb_logger_create(lk_logger_log_dir(csv), &tb)) {
        fprintf(stderr, "%s\n", lk_last_error());
        return 1;
    }
    double t0 = lk_time_now();
    for (int i = 0; i < calls; i++) {
        vals[0] = 1.0 / (i + 1);
        if (lk_logger_log_metrics(csv, i, names, vals, 5)) return 1;
    }
    if (lk_logger_finalize(csv, "success")) return 1;
    double t1 = lk_time_now();
    for (int i = 0; i < calls; i++) {
        vals[0] = 1.0 / (i + 1);
        if (lk_logger_log_metrics(tb, i, names, vals, 5)) return 1;
    }
    if (lk_logger_finalize(tb, "success")) return 1;
    double t2 = lk_time_now();
    FILE *devnull = fopen("/dev/null", "w");
    lk_progress_options o = lk_progress_options_default();
    o.out = devnull;
    o.mode = LK_PROGRESS_BAR;
    lk_progress *p = NULL;
    if (lk_progress_create(&o, &p)) return 1;
    lk_progress_begin_epoch(p, 0, 1, calls);
    for (int i = 1; i <= calls; i++) lk_progress_update(p, i, names, vals, 2);
    lk_progress_end_epoch(p, NULL, NULL, 0);
    double t3 = lk_time_now();
    lk_progress_free(p);
    fclose(devnull);
    printf("calls: %d (5 metrics each)\n", calls);
    printf("csv log_metrics (appended every 10 rows):         %8.2f us/call\n", 1e6 * (t1 - t0) / calls);
    printf("tensorboard log_metrics (fflush per call):        %8.2f us/call\n", 1e6 * (t2 - t1) / calls);
    printf("progress update (bar, throttled to 10/s):         %8.3f us/call\n", 1e6 * (t3 - t2) / calls);
    lk_logger_free(csv);
    lk_logger_free(tb);
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
