/* train_out: run.json — every documented key present with the right type,
 * NaN as null, errors recorded, atomic replacement, parsed back with cJSON. */
#include <cjson/cJSON.h>

#include "out_test.h"

static cJSON *parse_file(const char *path) {
    char *text = out_read_file(path, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(it) ? it->valuedouble : -12345;
}
static const char *str(const cJSON *o, const char *k) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}
static int is_null(const cJSON *o, const char *k) { return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, k)); }

static void full_run(void) {
    char root[256], path[512];
    out_tmpdir(root, sizeof root, "run");
    snprintf(path, sizeof path, "%s/run.json", root);
    lk_runinfo r = lk_runinfo_default();
    const char *names[] = {"train_loss", "val_loss", "epoch", "val_acc"};
    double vals[] = {0.0213, 0.0225, 9, NAN};
    r.command = "fit";
    r.n_metrics = 4;
    r.metric_names = names;
    r.metric_values = vals;
    r.best_monitor = "val_loss";
    r.best_score = 0.0221;
    r.best_path = "runs/lightning_logs/version_0/checkpoints/epoch=7-val_loss=0.022.ckpt";
    r.epochs = 10;
    r.global_step = 2150;
    r.samples_per_s = 51234.5;
    r.wall_s = 61.25;
    r.time_to_first_step_s = 0.125;
    r.world_size = 2;
    r.strategy = "ddp";
    r.accelerator = "cpu";
    r.git_revision = "abc1234-dirty";
    r.log_dir = "runs/lightning_logs/version_0";
    r.last_checkpoint = "runs/lightning_logs/version_0/checkpoints/last.ckpt";
    r.step_time = (lk_runinfo_times){1.5, 4.25, 8.5, 0.75, 0.5, 0.25};
    r.config_yaml = "trainer:\n  max_epochs: 10\n  name: \"quoted \\\" value\"\n";
    CHECK_OK(lk_runinfo_write(path, &r));
    cJSON *j = parse_file(path);
    CHECK(j != NULL);
    if (!j) return;
    CHECK(num(j, "schema_version") == 1);
    CHECK_STR(str(j, "command"), "fit");
    CHECK_STR(str(j, "status"), "ok");
    CHECK(is_null(j, "error"));
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "metrics");
    CHECK(num(m, "train_loss") == 0.0213 && num(m, "val_loss") == 0.0225 && num(m, "epoch") == 9);
    CHECK(is_null(m, "val_acc"));
    CHECK(cJSON_GetArraySize(m) == 4);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "best");
    CHECK_STR(str(b, "monitor"), "val_loss");
    CHECK(num(b, "score") == 0.0221);
    CHECK_STR(str(b, "path"), r.best_path);
    CHECK(num(j, "epochs") == 10 && num(j, "global_step") == 2150);
    CHECK(num(j, "samples_per_s") == 51234.5 && num(j, "wall_s") == 61.25 && num(j, "time_to_first_step_s") == 0.125);
    CHECK(num(j, "world_size") == 2);
    CHECK_STR(str(j, "strategy"), "ddp");
    CHECK_STR(str(j, "accelerator"), "cpu");
    CHECK_STR(str(j, "version"), LK_VERSION_STRING);
    CHECK_STR(str(j, "git_revision"), "abc1234-dirty");
    CHECK_STR(str(j, "log_dir"), r.log_dir);
    CHECK_STR(str(j, "last_checkpoint"), r.last_checkpoint);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "step_time");
    CHECK(num(t, "data_ms") == 1.5 && num(t, "forward_ms") == 4.25 && num(t, "backward_ms") == 8.5 &&
          num(t, "comm_exposed_ms") == 0.75 && num(t, "optimizer_ms") == 0.5 && num(t, "comm_wait_ms") == 0.25);
    CHECK_STR(str(j, "config"), r.config_yaml);
    cJSON_Delete(j);

    /* an error run replaces the file atomically; missing pieces are null */
    lk_runinfo e = lk_runinfo_default();
    e.command = "fit";
    e.status = "error";
    e.error = "[rank 1] data: cannot open /x.idx";
    e.samples_per_s = INFINITY;
    CHECK_OK(lk_runinfo_write(path, &e));
    j = parse_file(path);
    CHECK(j != NULL);
    CHECK_STR(str(j, "status"), "error");
    CHECK_STR(str(j, "error"), e.error);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "metrics")) == 0);
    b = cJSON_GetObjectItemCaseSensitive(j, "best");
    CHECK(is_null(b, "monitor") && is_null(b, "score") && is_null(b, "path"));
    CHECK(is_null(j, "samples_per_s") && is_null(j, "log_dir") && is_null(j, "last_checkpoint") && is_null(j, "config"));
    CHECK(num(j, "world_size") == 1);
    CHECK(str(j, "git_revision") || is_null(j, "git_revision")); /* the build's own revision */
    cJSON_Delete(j);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);
    out_rm_rf(root);
}

static void bad_input(void) {
    lk_runinfo r = lk_runinfo_default();
    CHECK_ERR(lk_runinfo_write("/proc/nope/run.json", &r), LK_STATUS_IO, "/proc/nope/run.json");
    CHECK_ERR(lk_runinfo_write("", &r), LK_STATUS_INVALID_ARGUMENT, "empty path");
    r.n_metrics = 2;
    CHECK_ERR(lk_runinfo_write("/tmp/x.json", &r), LK_STATUS_INVALID_ARGUMENT, "2 metrics");
    CHECK_ERR(lk_runinfo_write("/tmp/x.json", NULL), LK_STATUS_INVALID_ARGUMENT, "NULL");
}

/* Two-space indentation, one key per line, and clean failures when an
 * allocation fails anywhere. */
static void text_form(void) {
    lk_runinfo r = lk_runinfo_default();
    const char *names[] = {"x{\"a\":[1,2]}"};
    double v = 0.5;
    r.n_metrics = 1;
    r.metric_names = names;
    r.metric_values = &v;
    char *text = NULL;
    CHECK_OK(lk_runinfo_to_json(&r, &text));
    CHECK(text && strstr(text, "{\n  \"schema_version\": 1,\n  \"command\": null,\n  \"status\": \"ok\",\n"));
    CHECK(text && strstr(text, "  \"metrics\": {\n    \"x{\\\"a\\\":[1,2]}\": 0.5\n  },\n"));
    CHECK(text && text[strlen(text) - 1] == '\n');
    lk_free(text);
    int ok = 0;
    for (long n = 1; n < 50 && !ok; n++) {
        text = NULL;
        lk_alloc_fail_after(n);
        lk_status st = lk_runinfo_to_json(&r, &text);
        lk_alloc_fail_after(0);
        if (!st) ok = 1;
        else CHECK(text == NULL && st == LK_STATUS_OUT_OF_MEMORY);
        lk_free(text);
    }
    CHECK(ok);
}

LK_TEST_MAIN(LK_TEST_CASE(full_run), LK_TEST_CASE(text_form), LK_TEST_CASE(bad_input))
