/* train_out: the logger interface, Lightning's version directories, the
 * CSVLogger's metrics.csv (sorted header, empty cells, header rewrites,
 * number formatting) and hparams.yaml, the fan-out list, and clean failures
 * under injected allocation failures. */
#include <sys/stat.h>

#include "out_test.h"

static void version_dirs(void) {
    char root[256], dir[LK_LOG_DIR_MAX], want[512];
    out_tmpdir(root, sizeof root, "ver");
    int v = -2;
    CHECK_OK(lk_log_dir_resolve(root, NULL, -1, dir, sizeof dir, &v));
    snprintf(want, sizeof want, "%s/lightning_logs/version_0", root);
    CHECK_STR(dir, want);
    CHECK(v == 0);
    CHECK_OK(lk_log_dir_resolve(root, NULL, -1, dir, sizeof dir, &v));
    CHECK(v == 1);
    /* gaps count from the largest; files and odd names do not count */
    snprintf(want, sizeof want, "%s/lightning_logs/version_7", root);
    CHECK(mkdir(want, 0777) == 0);
    snprintf(want, sizeof want, "%s/lightning_logs/version_20", root);
    FILE *f = fopen(want, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(want, sizeof want, "%s/lightning_logs/version_x", root);
    CHECK(mkdir(want, 0777) == 0);
    CHECK_OK(lk_log_dir_resolve(root, NULL, -1, dir, sizeof dir, &v));
    CHECK(v == 8);
    /* an explicit version is used as is, also when it exists */
    CHECK_OK(lk_log_dir_resolve(root, "lightning_logs", 3, dir, sizeof dir, &v));
    snprintf(want, sizeof want, "%s/lightning_logs/version_3", root);
    CHECK_STR(dir, want);
    CHECK_OK(lk_log_dir_resolve(root, "lightning_logs", 3, dir, sizeof dir, &v));
    CHECK(v == 3);
    /* name "" drops the level, as in Lightning; missing roots are created */
    snprintf(want, sizeof want, "%s/a/b", root);
    CHECK_OK(lk_log_dir_resolve(want, "", -1, dir, sizeof dir, &v));
    snprintf(want, sizeof want, "%s/a/b/version_0", root);
    CHECK_STR(dir, want);
    /* trailing slashes do not double */
    snprintf(want, sizeof want, "%s/c//", root);
    CHECK_OK(lk_log_dir_resolve(want, NULL, -1, dir, sizeof dir, &v));
    snprintf(want, sizeof want, "%s/c/lightning_logs/version_0", root);
    CHECK_STR(dir, want);
    /* errors name the path */
    snprintf(want, sizeof want, "%s/lightning_logs/version_20", root);
    CHECK_ERR(lk_log_dir_resolve(want, NULL, -1, dir, sizeof dir, &v), LK_STATUS_IO, "version_20");
    CHECK_ERR(lk_log_dir_resolve(root, "x/y", -1, dir, sizeof dir, &v), LK_STATUS_INVALID_ARGUMENT, "x/y");
    char small[8];
    CHECK_ERR(lk_log_dir_resolve(root, NULL, -1, small, sizeof small, &v), LK_STATUS_INVALID_ARGUMENT, "does not fit");
    out_rm_rf(root);
}

static void metrics_layout(void) {
    char root[256], path[LK_LOG_DIR_MAX + 64];
    out_tmpdir(root, sizeof root, "csv");
    lk_logger *lg = NULL;
    CHECK_OK(lk_csv_logger_create(root, NULL, -1, &lg));
    if (!lg) return;
    CHECK(lk_logger_version(lg) == 0);
    snprintf(path, sizeof path, "%s/lightning_logs/version_0", root);
    CHECK_STR(lk_logger_log_dir(lg), path);
    const char *n1[] = {"train_loss", "epoch"};
    double v1[] = {0.5, 0};
    CHECK_OK(lk_logger_log_metrics(lg, 0, n1, v1, 2));
    double v2[] = {0.25, 0};
    CHECK_OK(lk_logger_log_metrics(lg, 1, n1, v2, 2));
    const char *n3[] = {"val_loss", "epoch", "step"}; /* "step" is the step argument's */
    double v3[] = {0.75, 0, 99};
    CHECK_OK(lk_logger_log_metrics(lg, 1, n3, v3, 3));
    snprintf(path, sizeof path, "%s/metrics.csv", lk_logger_log_dir(lg));
    CHECK(access(path, F_OK) != 0); /* buffered until flush, as in Lightning */
    CHECK_OK(lk_logger_flush(lg));
    char *text = out_read_file(path, NULL);
    CHECK_STR(text, "epoch,step,train_loss,val_loss\n0,0,0.5,\n0,1,0.25,\n0,1,,0.75\n");
    free(text);
    /* same header: appended */
    double v4[] = {0.125, 1};
    CHECK_OK(lk_logger_log_metrics(lg, 2, n1, v4, 2));
    CHECK_OK(lk_logger_flush(lg));
    text = out_read_file(path, NULL);
    CHECK_STR(text, "epoch,step,train_loss,val_loss\n0,0,0.5,\n0,1,0.25,\n0,1,,0.75\n1,2,0.125,\n");
    free(text);
    /* a new column: the file is rewritten with the full header */
    const char *n5[] = {"lr-Adam", "a,\"b\"", "val_acc"};
    double v5[] = {0.001, 2, 0.875};
    CHECK_OK(lk_logger_log_metrics(lg, 3, n5, v5, 3));
    CHECK_OK(lk_logger_flush(lg));
    text = out_read_file(path, NULL);
    CHECK_STR(text, "\"a,\"\"b\"\"\",epoch,lr-Adam,step,train_loss,val_acc,val_loss\n"
                    ",0,,0,0.5,,\n,0,,1,0.25,,\n,0,,1,,,0.75\n,1,,2,0.125,,\n2,,0.001,3,,0.875,\n");
    free(text);
    /* ...and again, reading the quoted header back */
    const char *n6[] = {"zeta"};
    double v6[] = {-1.5};
    CHECK_OK(lk_logger_log_metrics(lg, 4, n6, v6, 1));
    CHECK_OK(lk_logger_log_hyperparams(lg, "model:\n  lr: 0.001"));
    CHECK_OK(lk_logger_finalize(lg, "success"));
    text = out_read_file(path, NULL);
    CHECK_STR(text, "\"a,\"\"b\"\"\",epoch,lr-Adam,step,train_loss,val_acc,val_loss,zeta\n"
                    ",0,,0,0.5,,,\n,0,,1,0.25,,,\n,0,,1,,,0.75,\n,1,,2,0.125,,,\n2,,0.001,3,,0.875,,\n"
                    ",,,4,,,,-1.5\n");
    free(text);
    snprintf(path, sizeof path, "%s/hparams.yaml", lk_logger_log_dir(lg));
    text = out_read_file(path, NULL);
    CHECK_STR(text, "model:\n  lr: 0.001\n");
    free(text);
    CHECK_ERR(lk_logger_log_metrics(lg, 5, n6, v6, 1), LK_STATUS_INVALID_USAGE, "already finalized");
    lk_logger_free(lg);
    lk_logger_free(NULL);
    out_rm_rf(root);
}

/* Values read back as the same double, with Python's spellings. */
static void number_format(void) {
    char root[256], path[LK_LOG_DIR_MAX + 64];
    out_tmpdir(root, sizeof root, "num");
    lk_logger *lg = NULL;
    CHECK_OK(lk_csv_logger_create_in(root, &lg));
    if (!lg) return;
    const char *names[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    double vals[] = {0.1, (double)0.1f, 1e-5, NAN, 3.0, 1e20, -INFINITY, 10, 1.0 / 3.0};
    CHECK_OK(lk_logger_log_metrics(lg, 7, names, vals, 9));
    CHECK_OK(lk_logger_finalize(lg, "success"));
    snprintf(path, sizeof path, "%s/metrics.csv", root);
    char *text = out_read_file(path, NULL);
    CHECK_STR(text, "a,b,c,d,e,f,g,h,i,step\n0.1,0.10000000149011612,1e-05,nan,3,1e+20,-inf,10,0.3333333333333333,7\n");
    free(text);
    snprintf(path, sizeof path, "%s/hparams.yaml", root);
    text = out_read_file(path, NULL);
    CHECK_STR(text, "{}\n"); /* never logged: Lightning writes an empty mapping */
    free(text);
    lk_logger_free(lg);
    out_rm_rf(root);
}

static void flush_every(void) {
    char root[256], path[LK_LOG_DIR_MAX + 64];
    out_tmpdir(root, sizeof root, "every");
    lk_logger *lg = NULL;
    CHECK_OK(lk_csv_logger_create_in(root, &lg));
    if (!lg) return;
    lk_csv_logger_set_flush_every(lg, 2);
    snprintf(path, sizeof path, "%s/metrics.csv", root);
    const char *n[] = {"x"};
    for (int i = 0; i < 5; i++) {
        double v = i;
        CHECK_OK(lk_logger_log_metrics(lg, i, n, &v, 1));
        char *text = out_read_file(path, NULL);
        int lines = 0;
        for (char *p = text; p && *p; p++) lines += *p == '\n';
        int flushed = (i + 1) / 2 * 2;
        CHECK_MSG(lines == (flushed > 0 ? flushed + 1 : 0), "after %d rows: %d lines", i + 1, lines);
        free(text);
    }
    lk_logger_free(lg); /* without finalize: the last row is lost, by contract */
    char *text = out_read_file(path, NULL);
    CHECK_STR(text, "step,x\n0,0\n1,1\n2,2\n3,3\n");
    free(text);
    out_rm_rf(root);
}

/* A logger that always fails, to test the list's fan-out. */
static int broken_calls;
static lk_status broken_hp(lk_logger *lg, const char *y) { broken_calls++; return lk_error(LK_STATUS_IO, "disk on fire"); }
static lk_status broken_m(lk_logger *lg, int64_t s, const char *const *n, const double *v, int k) {
    broken_calls++;
    return lk_error(LK_STATUS_IO, "disk on fire");
}
static lk_status broken_fin(lk_logger *lg, const char *s) { broken_calls++; return LK_STATUS_OK; }
static void broken_destroy(lk_logger *lg) { lk_free(lg); }
static const lk_logger_vtable broken_vt = {"broken", broken_hp, broken_m, NULL, broken_fin, broken_destroy};

static void list_fanout(void) {
    char root[256], path[LK_LOG_DIR_MAX + 64];
    out_tmpdir(root, sizeof root, "list");
    lk_logger *list = NULL, *a = NULL, *b = NULL;
    CHECK_OK(lk_logger_list_create(&list));
    CHECK_STR(lk_logger_log_dir(list), "");
    CHECK_OK(lk_csv_logger_create(root, "one", -1, &a));
    lk_logger *broken = lk_calloc(1, sizeof *broken);
    broken->vt = &broken_vt;
    CHECK_OK(lk_csv_logger_create(root, "two", 5, &b));
    CHECK_OK(lk_logger_list_add(list, a));
    CHECK_OK(lk_logger_list_add(list, broken));
    CHECK_OK(lk_logger_list_add(list, b));
    CHECK(lk_logger_list_count(list) == 3);
    snprintf(path, sizeof path, "%s/one/version_0", root);
    CHECK_STR(lk_logger_log_dir(list), path);
    CHECK(lk_logger_version(list) == 0);
    const char *n[] = {"loss"};
    double v = 2.5;
    CHECK_ERR(lk_logger_log_metrics(list, 3, n, &v, 1), LK_STATUS_IO, "broken logger: disk on fire");
    CHECK_ERR(lk_logger_log_hyperparams_kv(list, n, (const char *const[]){"1"}, 1), LK_STATUS_IO, "broken");
    CHECK_OK(lk_logger_finalize(list, "success"));
    CHECK(broken_calls == 3);
    /* the healthy loggers got everything */
    snprintf(path, sizeof path, "%s/two/version_5/metrics.csv", root);
    char *text = out_read_file(path, NULL);
    CHECK_STR(text, "loss,step\n2.5,3\n");
    free(text);
    snprintf(path, sizeof path, "%s/one/version_0/hparams.yaml", root);
    text = out_read_file(path, NULL);
    CHECK_STR(text, "loss: 1\n");
    free(text);
    CHECK_ERR(lk_logger_list_add(list, NULL), LK_STATUS_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(lk_logger_list_add(NULL, NULL), LK_STATUS_INVALID_ARGUMENT, "not a logger list");
    lk_logger_free(list);
    out_rm_rf(root);
}

static void bad_input(void) {
    char root[256], path[512];
    out_tmpdir(root, sizeof root, "bad");
    snprintf(path, sizeof path, "%s/file", root);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    lk_logger *lg = NULL;
    CHECK_ERR(lk_csv_logger_create(path, NULL, -1, &lg), LK_STATUS_IO, path);
    CHECK(lg == NULL);
    CHECK_ERR(lk_csv_logger_create_in("", &lg), LK_STATUS_INVALID_ARGUMENT, "empty");
    CHECK_OK(lk_csv_logger_create_in(root, &lg));
    const char *n[] = {""};
    double v = 1;
    CHECK_ERR(lk_logger_log_metrics(lg, 0, n, &v, 1), LK_STATUS_INVALID_ARGUMENT, "empty name");
    const char *nl[] = {"a\nb"};
    CHECK_ERR(lk_logger_log_metrics(lg, 0, nl, &v, 1), LK_STATUS_INVALID_ARGUMENT, "control character");
    CHECK_ERR(lk_logger_log_metrics(lg, 0, NULL, &v, 1), LK_STATUS_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(lk_logger_log_metrics(NULL, 0, n, &v, 1), LK_STATUS_INVALID_ARGUMENT, "NULL");
    /* the log directory vanishes: a clean I/O error naming the file, no row lost in memory */
    const char *m[] = {"x"};
    CHECK_OK(lk_logger_log_metrics(lg, 0, m, &v, 1));
    char dir[LK_LOG_DIR_MAX];
    snprintf(dir, sizeof dir, "%s", lk_logger_log_dir(lg));
    out_rm_rf(root);
    CHECK_ERR(lk_logger_flush(lg), LK_STATUS_IO, "metrics.csv");
    CHECK(mkdir(root, 0777) == 0);
    CHECK_OK(lk_logger_flush(lg));
    snprintf(path, sizeof path, "%s/metrics.csv", root);
    char *text = out_read_file(path, NULL);
    CHECK_STR(text, "step,x\n0,1\n");
    free(text);
    lk_logger_free(lg);
    out_rm_rf(root);
}

/* Fail the Nth allocation for N = 1, 2, ... : every failure is a clean
 * error, nothing leaks (ASan) and a retry without failures succeeds. */
static void alloc_failures(void) {
    char root[256];
    out_tmpdir(root, sizeof root, "oom");
    int succeeded = 0;
    for (long n = 1; n < 400 && !succeeded; n++) {
        lk_logger *list = NULL, *csv = NULL, *tb = NULL;
        lk_alloc_fail_after(n);
        lk_status st = lk_logger_list_create(&list);
        if (!st) st = lk_csv_logger_create(root, NULL, -1, &csv);
        if (!st) st = lk_logger_list_add(list, csv);
        if (!st) st = lk_tb_logger_create(lk_logger_log_dir(csv), &tb);
        if (!st) st = lk_logger_list_add(list, tb);
        const char *names[] = {"a", "b", "c"};
        double vals[] = {1, 2, 3};
        for (int i = 0; !st && i < 3; i++) st = lk_logger_log_metrics(list, i, names + i, vals + i, 3 - i);
        if (!st) st = lk_logger_log_hyperparams(list, "a: 1\n");
        if (!st) st = lk_logger_finalize(list, "success");
        lk_alloc_fail_after(0);
        if (st) CHECK_MSG(lk_last_error()[0] != 0, "failure %ld without a message", n);
        else succeeded = 1;
        if (!list) lk_logger_free(csv);
        lk_logger_free(list);
    }
    CHECK(succeeded);
    out_rm_rf(root);
}

LK_TEST_MAIN(LK_TEST_CASE(version_dirs), LK_TEST_CASE(metrics_layout), LK_TEST_CASE(number_format),
             LK_TEST_CASE(flush_every), LK_TEST_CASE(list_fanout), LK_TEST_CASE(bad_input),
             LK_TEST_CASE(alloc_failures))
