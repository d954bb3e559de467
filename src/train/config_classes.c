/* The forms of a Lightning config value that are more than a scalar:
 * durations (max_time, a DDPStrategy timeout: "DD:HH:MM:SS", seconds or a
 * timedelta map) and trainer.callbacks and trainer.logger as Lightning
 * writes them: lists of
 * class_path entries (ModelCheckpoint, EarlyStopping, LearningRateMonitor,
 * CSVLogger, TensorBoardLogger, ...), each class's init_args table, the
 * Lightning classes lockstep does not have and what to use instead, and
 * how an entry lands in lk_trainer_config. trainer_config.c calls in here
 * for those two keys; the flat keys' tables and the rest of the trainer
 * section stay there. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/config.h"
#include "lockstep/trainer.h"
#include "train/trainer_config_impl.h"

/* An INVALID_ARGUMENT error that starts with the node's FILE:LINE:COL. */
lk_status lk__cfg_at(const lk_config_node *n, const char *fmt, ...) {
    char w[512], msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s", lk_config_node_where(n, w, sizeof w), msg);
}


/* "00:01:30:00", "90" (seconds) or {days: 1, hours: 2, ...} (Python's
 * timedelta arguments) -> seconds. */
lk_status lk__cfg_parse_duration(const lk_config_node *n, const char *what, double *out) {
    return lk__cfg_parse_duration_hms(n, what, false, out);
}

/* As parse_duration; hms: "H:MM:SS" too (str(timedelta), a DDPStrategy timeout). */
lk_status lk__cfg_parse_duration_hms(const lk_config_node *n, const char *what, bool hms, double *out) {
    *out = 0;
    if (!n || lk_config_node_is_null(n)) return LK_STATUS_OK;
    if (lk_config_node_type(n) == LK_CONFIG_MAP) {
        static const struct { const char *key; double s; } unit[] = {
            {"weeks", 604800}, {"days", 86400}, {"hours", 3600}, {"minutes", 60}, {"seconds", 1},
            {"milliseconds", 1e-3}, {"microseconds", 1e-6}};
        const char *names[7];
        for (int k = 0; k < 7; k++) names[k] = unit[k].key;
        for (int i = 0; i < lk_config_node_count(n); i++) {
            const lk_config_node *c = lk_config_node_child(n, i);
            const char *key = lk_config_node_key(c), *text = lk_config_node_text(c);
            int k = 0;
            while (k < 7 && strcmp(key, unit[k].key)) k++;
            if (k == 7) {
                const char *s = lk_suggest(key, names, 7);
                return lk__cfg_at(c, "%s: unknown key '%s'%s%s%s (expected weeks, days, hours, minutes, seconds, milliseconds, "
                          "microseconds)", what, key, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
            }
            char *end;
            double v = text ? strtod(text, &end) : 0;
            if (!text || end == text || *end || !(v >= 0) || isinf(v))
                return lk__cfg_at(c, "%s.%s: expected a non-negative number, got '%s'", what, key, text ? text : "(a collection)");
            *out += v * unit[k].s;
        }
        return LK_STATUS_OK;
    }
    const char *t = lk_config_node_text(n);
    if (!t) return lk__cfg_at(n, "%s: expected \"DD:HH:MM:SS\", a number of seconds or {days, hours, minutes, seconds}", what);
    double part[4] = {0};
    int np = 0;
    const char *p = t;
    for (;;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || np == 4 || !(v >= 0) || isinf(v)) { np = -1; break; }
        part[np++] = v;
        if (*end == ':') p = end + 1;
        else if (!*end) break;
        else { np = -1; break; }
    }
    if (np == 3 && !hms) np = -1; /* Lightning's max_time takes four fields only */
    if (np != 1 && np != 3 && np != 4)
        return lk__cfg_at(n, "%s: expected \"DD:HH:MM:SS\" (Lightning's max_time form), %sa number of seconds or "
                  "{days, hours, minutes, seconds}, got '%s'", what,
                  hms ? "\"H:MM:SS\" (a timedelta as LightningCLI prints it), " : "", t);
    *out = np == 1 ? part[0]
           : np == 3 ? part[0] * 3600 + part[1] * 60 + part[2]
                     : part[0] * 86400 + part[1] * 3600 + part[2] * 60 + part[3];
    return LK_STATUS_OK;
}

/* ---- callbacks and loggers by class_path ------------------------------------------ */

#define CK(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_checkpoint_config, field), def, lo, hi, choices, help}
static const lk_param checkpoint_params[] = {
    CK("dirpath", STRING, dirpath, "", 1, 0, NULL, "directory for the files (null: <log_dir>/checkpoints)"),
    CK("filename", STRING, filename, "{epoch}-{step}", 1, 0, NULL, "file name template, e.g. {epoch}-{val_loss:.3f}"),
    CK("monitor", STRING, monitor, "", 1, 0, NULL, "metric that ranks checkpoints (null: the newest rank first)"),
    CK("verbose", BOOL, verbose, "false", 1, 0, NULL, "say when a checkpoint is written"),
    CK("save_last", BOOL, save_last, "false", 1, 0, NULL, "also keep last.ckpt"),
    CK("save_top_k", INT, save_top_k, "1", -1, 1e6, NULL, "best checkpoints kept (-1: all, 0: none)"),
    CK("mode", ENUM, mode, "min", 1, 0, "min|max", "lower or higher is better"),
    CK("auto_insert_metric_name", BOOL, auto_insert_metric_name, "true", 1, 0, NULL,
       "{epoch} becomes epoch=3 (false: 3)"),
    CK("every_n_train_steps", INT, every_n_train_steps, "0", 0, 1e15, NULL, "also save every N optimizer steps (0: off)"),
    CK("every_n_epochs", INT, every_n_epochs, "1", 0, 1e15, NULL, "save at the end of every Nth epoch (0: never)"),
    CK("save_weights_only", BOOL, save_weights_only, "false", 1, 0, NULL,
       "top-k files hold the model's weights only, no optimizer state (last.ckpt stays complete for resuming)"),
    CK("save_on_train_epoch_end", BOOL, save_on_train_epoch_end, "false", 1, 0, NULL,
       "accepted; lockstep saves after each validation and at the epoch end either way"),
    CK("enable_version_counter", BOOL, enable_version_counter, "true", 1, 0, NULL,
       "accepted; the file names carry the epoch and step"),
    CK("train_time_interval", STRING, train_time_interval, "", 1, 0, NULL,
       "only null: lockstep saves by every_n_train_steps and every_n_epochs"),
};

#define ES(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_early_stopping_config, field), def, lo, hi, choices, help}
static const lk_param early_stopping_params[] = {
    ES("monitor", STRING, monitor, "", 1, 0, NULL, "metric to watch (required)"),
    ES("min_delta", FLOAT, min_delta, "0", 0, 1e30, NULL, "smallest change that counts as an improvement"),
    ES("patience", INT, patience, "3", 0, 1e9, NULL, "checks without improvement before stopping"),
    ES("verbose", BOOL, verbose, "false", 1, 0, NULL, "say why training stopped"),
    ES("mode", ENUM, mode, "min", 1, 0, "min|max", "lower or higher is better"),
    ES("strict", BOOL, strict, "true", 1, 0, NULL, "a monitor that was never logged is an error (false: skip)"),
    ES("check_finite", BOOL, check_finite, "true", 1, 0, NULL, "stop when the monitor becomes NaN or infinite"),
    ES("stopping_threshold", FLOAT, stopping_threshold, ".nan", 1, 0, NULL, "stop once the monitor is this good"),
    ES("divergence_threshold", FLOAT, divergence_threshold, ".nan", 1, 0, NULL, "stop once it is worse than this"),
    ES("check_on_train_epoch_end", BOOL, check_on_train_epoch_end, "false", 1, 0, NULL,
       "accepted; lockstep checks after each validation (null: Lightning's choice, the same)"),
    ES("log_rank_zero_only", BOOL, log_rank_zero_only, "false", 1, 0, NULL,
       "accepted; the stop is agreed over the ranks and said on rank 0"),
};

/* Arguments that configure something the trainer already does: parsed (so
 * typos and bad values are caught) into scratch structs. */
typedef struct {
    char logging_interval[LK_PARAM_STR];
    bool log_momentum, log_weight_decay;
    char duration[LK_PARAM_STR], interval[LK_PARAM_STR]; /* Timer (duration is read by hand) */
    bool verbose;
    char cpu_stats[LK_PARAM_STR];
    int64_t max_depth;
    char dirpath[LK_PARAM_STR], filename[LK_PARAM_STR];
} scratch_args;
#define SA(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(scratch_args, field), def, lo, hi, choices, help}
static const lk_param lr_monitor_params[] = {
    SA("logging_interval", ENUM, logging_interval, "null", 1, 0, "null|step|epoch",
       "step: lr-<Optimizer> every log_every_n_steps steps; epoch: once per epoch; null: as the scheduler steps"),
    SA("log_momentum", BOOL, log_momentum, "false", 1, 0, NULL, "accepted; only the learning rate is logged"),
    SA("log_weight_decay", BOOL, log_weight_decay, "false", 1, 0, NULL, "accepted; only the learning rate is logged"),
};
static const lk_param device_stats_params[] = {
    SA("cpu_stats", ENUM, cpu_stats, "null", 1, 0, "null|true|false", "CPU utilisation and resident memory are logged"),
};
static const lk_param timer_params[] = {
    SA("duration", STRING, duration, "", 1, 0, NULL, "\"DD:HH:MM:SS\" or {days, hours, minutes, seconds}: sets max_time"),
    SA("interval", ENUM, interval, "step", 1, 0, "step|epoch", "check the time after every step or after each epoch"),
    SA("verbose", BOOL, verbose, "true", 1, 0, NULL, "say when time is up"),
};
static const lk_param summary_params[] = {
    SA("max_depth", INT, max_depth, "1", -1, 1e6, NULL, "layers shown in the model summary"),
};
static const lk_param on_exception_params[] = {
    SA("dirpath", STRING, dirpath, "", 1, 0, NULL, "directory of the checkpoint written when fit fails (required)"),
    SA("filename", STRING, filename, "on_exception", 1, 0, NULL, "its name, without .ckpt"),
};

enum { CB_CHECKPOINT, CB_EARLY_STOPPING, CB_LR_MONITOR, CB_DEVICE_STATS, CB_TIMER, CB_SUMMARY, CB_ON_EXCEPTION };
#define NP(t) (int)(sizeof t / sizeof t[0])
static const lk_callback_info callback_infos[] = { /* in the order of the enum above */
    {"ModelCheckpoint", checkpoint_params, NP(checkpoint_params), "top-k and last checkpoints (several allowed)"},
    {"EarlyStopping", early_stopping_params, NP(early_stopping_params), "stop when a metric stops improving"},
    {"LearningRateMonitor", lr_monitor_params, NP(lr_monitor_params), "when lr-<Optimizer> is logged (without it: every log_every_n_steps steps)"},
    {"DeviceStatsMonitor", device_stats_params, NP(device_stats_params), "trainer.device_stats_monitor: true"},
    {"Timer", timer_params, NP(timer_params), "stop after a duration (trainer.max_time)"},
    {"ModelSummary", summary_params, NP(summary_params), "the model summary printed before fit"},
    {"OnExceptionCheckpoint", on_exception_params, NP(on_exception_params), "save a checkpoint when fit fails"},
};

const lk_callback_info *lk_callback_infos(int *count) {
    *count = NP(callback_infos);
    return callback_infos;
}

typedef struct {
    lk_logger_config c;
    char version[LK_PARAM_STR];
    char prefix[LK_PARAM_STR];
    int64_t flush_logs_every_n_steps;
    bool log_graph, default_hp_metric;
    char sub_dir[LK_PARAM_STR];
} logger_args;
#define LA(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(logger_args, field), def, lo, hi, choices, help}
static const lk_param csv_logger_params[] = {
    LA("save_dir", STRING, c.save_dir, "", 1, 0, NULL, "root directory (null: trainer.default_root_dir)"),
    LA("name", STRING, c.name, "lightning_logs", 1, 0, NULL, "experiment directory under save_dir"),
    LA("version", STRING, version, "", 1, 0, NULL, "version number (null: the next free version_N)"),
    LA("prefix", STRING, prefix, "", 1, 0, NULL, "accepted; must be empty"),
    LA("flush_logs_every_n_steps", INT, flush_logs_every_n_steps, "100", 1, 1e12, NULL, "accepted (lockstep flushes per epoch)"),
};
static const lk_param tb_logger_params[] = {
    LA("save_dir", STRING, c.save_dir, "", 1, 0, NULL, "root directory (null: trainer.default_root_dir)"),
    LA("name", STRING, c.name, "lightning_logs", 1, 0, NULL, "experiment directory under save_dir"),
    LA("version", STRING, version, "", 1, 0, NULL, "version number (null: the next free version_N)"),
    LA("prefix", STRING, prefix, "", 1, 0, NULL, "accepted; must be empty"),
    LA("log_graph", BOOL, log_graph, "false", 1, 0, NULL, "accepted; lockstep writes no graph"),
    LA("default_hp_metric", BOOL, default_hp_metric, "true", 1, 0, NULL, "accepted"),
    LA("sub_dir", STRING, sub_dir, "", 1, 0, NULL, "only null: the event files go in the version directory"),
};
static const lk_callback_info logger_infos[] = {
    {"CSVLogger", csv_logger_params, NP(csv_logger_params), "metrics.csv and hparams.yaml"},
    {"TensorBoardLogger", tb_logger_params, NP(tb_logger_params), "TensorBoard event files and hparams.yaml"},
};

const lk_callback_info *lk_logger_infos(int *count) {
    *count = NP(logger_infos);
    return logger_infos;
}

/* Lightning classes lockstep does not have, and what to use instead (NULL:
 * nothing does that job here yet). */
static const struct {
    const char *name, *instead;
} not_here[] = {
    {"TQDMProgressBar", "trainer.enable_progress_bar (lockstep draws its own progress)"},
    {"RichProgressBar", "trainer.enable_progress_bar (lockstep draws its own progress)"},
    {"RichModelSummary", "ModelSummary"},
    {"GradientAccumulationScheduler", "trainer.accumulate_grad_batches (a constant)"},
    {"StochasticWeightAveraging", NULL},
    {"LearningRateFinder", "a fixed optimizer.init_args.lr"},
    {"BatchSizeFinder", "a fixed data.init_args.batch_size"},
    {"ThroughputMonitor", "run.json, which records samples_per_s"},
    {"WandbLogger", "CSVLogger or TensorBoardLogger"},
    {"MLFlowLogger", "CSVLogger or TensorBoardLogger"},
    {"CometLogger", "CSVLogger or TensorBoardLogger"},
    {"NeptuneLogger", "CSVLogger or TensorBoardLogger"},
};


static void join_names(const lk_param *t, int n, char *buf, size_t size) {
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(buf, i ? ", " : "", size - strlen(buf) - 1);
        strncat(buf, t[i].name, size - strlen(buf) - 1);
    }
}


/* The short class name of entry `i` of a class_path list, and its init_args. */
static lk_status read_entry(const lk_config_node *e, const char *what, const lk_callback_info *infos, int ninfos,
                            int *index, const lk_config_node **init_args) {
    const lk_config_node *cp = e;
    *init_args = NULL;
    if (lk_config_node_type(e) == LK_CONFIG_MAP) {
        for (int i = 0; i < lk_config_node_count(e); i++) {
            const lk_config_node *c = lk_config_node_child(e, i);
            const char *key = lk_config_node_key(c);
            if (!strcmp(key, "class_path") || !strcmp(key, "init_args")) continue;
            return lk__cfg_at(c, "%s: unknown key '%s' (an entry has class_path and init_args; the class's arguments go "
                      "under init_args)", what, key);
        }
        cp = lk_config_node_get(e, "class_path");
        *init_args = lk_config_node_get(e, "init_args");
        if (!cp) return lk__cfg_at(e, "%s: class_path is required (one of the names below)", what);
    }
    const char *full = lk_config_node_text(cp);
    if (!full || lk_config_node_is_null(cp))
        return lk__cfg_at(cp, "%s.class_path: expected a class name such as %s", what, infos[0].name);
    /* lightning.pytorch.callbacks.ModelCheckpoint, pytorch_lightning.loggers.CSVLogger -> the last part */
    const char *name = strrchr(full, '.');
    name = name ? name + 1 : full;
    for (int k = 0; k < ninfos; k++)
        if (!strcmp(name, infos[k].name)) {
            *index = k;
            if (*init_args && !lk_config_node_is_null(*init_args) && lk_config_node_type(*init_args) != LK_CONFIG_MAP)
                return lk__cfg_at(*init_args, "%s.init_args: expected a mapping of %s's arguments", what, name);
            return LK_STATUS_OK;
        }
    char list[512] = "";
    const char *names[16];
    for (int k = 0; k < ninfos; k++) {
        names[k] = infos[k].name;
        strncat(list, k ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, infos[k].name, sizeof list - strlen(list) - 1);
    }
    for (size_t k = 0; k < sizeof not_here / sizeof not_here[0]; k++)
        if (!strcmp(name, not_here[k].name))
            return not_here[k].instead
                       ? lk__cfg_at(cp, "%s.class_path: lockstep has no %s; use %s instead (lockstep accepts %s)", what, name,
                            not_here[k].instead, list)
                       : lk__cfg_at(cp, "%s.class_path: lockstep has no %s yet, and nothing else does its job: remove the entry "
                            "(lockstep accepts %s)", what, name, list);
    const char *s = lk_suggest(name, names, ninfos);
    return lk__cfg_at(cp, "%s.class_path: unknown class '%s'%s%s%s (lockstep accepts %s, optionally with a module path such as "
              "lightning.pytorch.callbacks.)", what, full, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", list);
}

/* init_args of class `info` into obj; unknown keys name the accepted ones. */
static lk_status apply_init_args(const lk_callback_info *info, const lk_config_node *ia, void *obj, const char *what,
                                 const char *const *skip, int nskip) {
    LK_TRY(lk_params_defaults(info->params, info->n_params, obj));
    for (int i = 0; i < lk_config_node_count(ia); i++) {
        const lk_config_node *c = lk_config_node_child(ia, i);
        const char *key = lk_config_node_key(c);
        if (lk_params_find(info->params, info->n_params, key)) continue;
        const char *names[32];
        for (int k = 0; k < info->n_params && k < 32; k++) names[k] = info->params[k].name;
        const char *s = lk_suggest(key, names, info->n_params < 32 ? info->n_params : 32);
        char list[1024];
        join_names(info->params, info->n_params, list, sizeof list);
        return lk__cfg_at(c, "%s.init_args: unknown key '%s' for %s%s%s%s (accepted: %s)", what, key, info->name,
                  s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", list);
    }
    /* null is Lightning's None, which for every argument here means the
     * table's default (LightningCLI's config.yaml writes them all) */
    const char *keep[64];
    int nkeep = 0;
    for (int i = 0; i < nskip && nkeep < 64; i++) keep[nkeep++] = skip[i];
    for (int i = 0; i < lk_config_node_count(ia) && nkeep < 64; i++)
        if (lk_config_node_is_null(lk_config_node_child(ia, i))) keep[nkeep++] = lk_config_node_key(lk_config_node_child(ia, i));
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s.init_args", what);
    return lk_config_apply_params_except(ia, info->params, info->n_params, obj, prefix, keep, nkeep);
}

lk_status lk__cfg_apply_callback(const lk_config_node *e, const char *what, lk_trainer_config *cfg) {
    int k = 0;
    const lk_config_node *ia;
    LK_TRY(read_entry(e, what, callback_infos, NP(callback_infos), &k, &ia));
    const lk_callback_info *info = &callback_infos[k];
    scratch_args sa;
    memset(&sa, 0, sizeof sa);
    switch (k) {
    case CB_CHECKPOINT: {
        if (cfg->n_checkpoints == LK_MAX_CALLBACKS)
            return lk__cfg_at(e, "%s: at most %d ModelCheckpoint callbacks", what, LK_MAX_CALLBACKS);
        lk_checkpoint_config *c = &cfg->checkpoints[cfg->n_checkpoints];
        LK_TRY(apply_init_args(info, ia, c, what, NULL, 0));
        if (!c->filename[0]) snprintf(c->filename, sizeof c->filename, "{epoch}-{step}");
        if (c->train_time_interval[0])
            return lk__cfg_at(lk_config_node_get(ia, "train_time_interval"), "%s.init_args.train_time_interval is not supported "
                      "(only null): lockstep saves by steps and epochs; use every_n_train_steps or every_n_epochs", what);
        cfg->n_checkpoints++;
        return LK_STATUS_OK;
    }
    case CB_EARLY_STOPPING: {
        if (cfg->n_early_stopping == LK_MAX_CALLBACKS)
            return lk__cfg_at(e, "%s: at most %d EarlyStopping callbacks", what, LK_MAX_CALLBACKS);
        lk_early_stopping_config *c = &cfg->early_stopping[cfg->n_early_stopping];
        LK_TRY(apply_init_args(info, ia, c, what, NULL, 0));
        if (!c->monitor[0]) return lk__cfg_at(ia ? ia : e, "%s: EarlyStopping needs init_args.monitor (the metric to watch)", what);
        cfg->n_early_stopping++;
        return LK_STATUS_OK;
    }
    case CB_TIMER: {
        static const char *const skip[] = {"duration"};
        LK_TRY(apply_init_args(info, ia, &sa, what, skip, 1));
        double sec;
        char w[160];
        snprintf(w, sizeof w, "%s.init_args.duration", what);
        LK_TRY(lk__cfg_parse_duration(lk_config_node_get(ia, "duration"), w, &sec));
        if (sec > 0 && (cfg->max_time <= 0 || sec < cfg->max_time)) cfg->max_time = sec;
        snprintf(cfg->time_check_interval, sizeof cfg->time_check_interval, "%.15s", sa.interval);
        return LK_STATUS_OK;
    }
    case CB_LR_MONITOR:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        snprintf(cfg->lr_logging_interval, sizeof cfg->lr_logging_interval, "%.15s", sa.logging_interval);
        return LK_STATUS_OK;
    case CB_SUMMARY:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        /* Lightning refuses the pair too: the callback would print what the flag turned off */
        if (!cfg->enable_model_summary)
            return lk__cfg_at(e, "%s: ModelSummary is listed but trainer.enable_model_summary is false (remove one of them)",
                      what);
        cfg->model_summary_max_depth = sa.max_depth;
        return LK_STATUS_OK;
    case CB_DEVICE_STATS:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        cfg->device_stats_monitor = true;
        return LK_STATUS_OK;
    case CB_ON_EXCEPTION:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        if (!sa.dirpath[0]) return lk__cfg_at(ia ? ia : e, "%s: OnExceptionCheckpoint needs init_args.dirpath", what);
        char path[2 * LK_PARAM_STR + 8];
        snprintf(path, sizeof path, "%s/%s.ckpt", sa.dirpath, sa.filename);
        if (strlen(path) >= sizeof cfg->on_exception_ckpt)
            return lk__cfg_at(ia, "%s: OnExceptionCheckpoint dirpath + filename is longer than %d bytes", what, LK_PARAM_STR - 1);
        memcpy(cfg->on_exception_ckpt, path, strlen(path) + 1);
        return LK_STATUS_OK;
    default:
        return apply_init_args(info, ia, &sa, what, NULL, 0);
    }
}

lk_status lk__cfg_apply_logger(const lk_config_node *e, const char *what, lk_trainer_config *cfg) {
    int k = 0;
    const lk_config_node *ia;
    LK_TRY(read_entry(e, what, logger_infos, NP(logger_infos), &k, &ia));
    if (cfg->n_loggers == LK_MAX_CALLBACKS) return lk__cfg_at(e, "%s: at most %d loggers", what, LK_MAX_CALLBACKS);
    logger_args la;
    memset(&la, 0, sizeof la);
    LK_TRY(apply_init_args(&logger_infos[k], ia, &la, what, NULL, 0));
    if (la.prefix[0]) return lk__cfg_at(ia, "%s.init_args.prefix: lockstep writes metric names without a prefix", what);
    if (la.sub_dir[0])
        return lk__cfg_at(lk_config_node_get(ia, "sub_dir"), "%s.init_args.sub_dir is not supported (only null): the event "
                  "files go in the version directory, beside metrics.csv", what);
    la.c.version = -1;
    if (la.version[0]) {
        char *end;
        const char *v = la.version;
        if (!strncmp(v, "version_", 8)) v += 8;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || x < 0)
            return lk__cfg_at(lk_config_node_get(ia, "version"), "%s.init_args.version: expected a number or version_N, got '%s'",
                      what, la.version);
        la.c.version = x;
    }
    snprintf(la.c.kind, sizeof la.c.kind, "%s", k == 0 ? "csv" : "tensorboard");
    if (!la.c.name[0]) snprintf(la.c.name, sizeof la.c.name, "lightning_logs");
    cfg->loggers[cfg->n_loggers++] = la.c;
    cfg->logger_set = true;
    return LK_STATUS_OK;
}
