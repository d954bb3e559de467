/* The built-in callbacks the loops call, other than ModelCheckpoint
 * (checkpoint.c): EarlyStopping after each validation, and the monitors that
 * log with the step's metrics: LearningRateMonitor (per step or per epoch),
 * DeviceStatsMonitor (NVML's stats of the process's GPU, or CPU use and
 * resident memory) and the fp16 loss scale.
 * Each reads the trainer's state and either logs metrics or sets
 * tr->should_stop with a reason; none changes the training itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/gpu.h"
#include "train/train_impl.h"

lk_status lk__early_stopping_check(lk_trainer *tr, lk_es_state *es) {
    const lk_early_stopping_config *e = &es->c;
    const char *mon = e->monitor;
    if (!mon[0]) return LK_STATUS_OK;
    double v;
    if (!lk_trainer_metric(tr, mon, &v)) {
        if (!e->strict) return LK_STATUS_OK; /* Lightning's strict=False: skip the check */
        char names[1024];
        lk__metrics_available(tr, names, sizeof names);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "EarlyStopping: %s '%s' was never logged; logged metrics: %s",
                        es->c.strict && !strcmp(mon, tr->cfg.early_stopping_monitor) ? "trainer.early_stopping_monitor"
                                                                                   : "monitor",
                        mon, names);
    }
    bool max = !strcmp(e->mode, "max");
    double stop_at = e->stopping_threshold, diverge = e->divergence_threshold;
    if (!isnan(stop_at) && (max ? v >= stop_at : v <= stop_at)) {
        tr->should_stop = true;
        snprintf(tr->stop_reason, sizeof tr->stop_reason, "EarlyStopping: %s = %.6g reached the stopping threshold %g",
                 mon, v, stop_at);
        return LK_STATUS_OK;
    }
    if (!isnan(diverge) && (max ? v < diverge : v > diverge)) {
        tr->should_stop = true;
        snprintf(tr->stop_reason, sizeof tr->stop_reason,
                 "EarlyStopping: %s = %.6g is worse than the divergence threshold %g", mon, v, diverge);
        return LK_STATUS_OK;
    }
    if (!isfinite(v) && !e->check_finite) return LK_STATUS_OK;
    if (!isfinite(v)) {
        tr->should_stop = true;
        snprintf(tr->stop_reason, sizeof tr->stop_reason, "EarlyStopping: %s = %g is not finite", mon, v);
        return LK_STATUS_OK;
    }
    double delta = e->min_delta;
    bool better = es->wait < 0 || isnan(es->best) || (max ? v > es->best + delta : v < es->best - delta);
    if (better) {
        es->best = v;
        es->wait = 0;
    } else if (++es->wait >= e->patience && tr->epoch + 1 >= tr->cfg.min_epochs && tr->global_step >= tr->cfg.min_steps) {
        tr->should_stop = true;
        snprintf(tr->stop_reason, sizeof tr->stop_reason,
                 "EarlyStopping: %s did not improve by %g for %d checks (best %.6g)", mon, delta, es->wait,
                 es->best);
    }
    return LK_STATUS_OK;
}

int lk__nvml_index_for(int cuda_index, const char *visible) {
    if (!visible || !visible[0] || cuda_index < 0) return cuda_index;
    const char *p = visible;
    for (int k = 0; *p; k++) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || (*end && *end != ',')) return cuda_index; /* a UUID or MIG id: not an index */
        if (k == cuda_index) return (int)v;
        p = *end ? end + 1 : end;
    }
    return cuda_index;
}

int lk__gpu_stats_metrics(int device_id, const lk__gpu_stats *s, char name[][80], double *value) {
    int n = 0;
#define GPU_METRIC(known, key, v)                                                                    \
    if (known) {                                                                                     \
        snprintf(name[n], sizeof name[n], "device_stats/device_id: %d/%s", device_id, key);          \
        value[n++] = (v);                                                                            \
    }
    const double mb = 1024.0 * 1024.0; /* nvidia-smi's MB are MiB */
    GPU_METRIC(s->utilization_pct >= 0, "utilization.gpu (%)", s->utilization_pct)
    GPU_METRIC(s->mem_utilization_pct >= 0, "utilization.memory (%)", s->mem_utilization_pct)
    GPU_METRIC(s->mem_total > 0, "memory.used (MB)", (double)s->mem_used / mb)
    GPU_METRIC(s->mem_total > 0 && s->mem_used <= s->mem_total, "memory.free (MB)", (double)(s->mem_total - s->mem_used) / mb)
    GPU_METRIC(s->temperature_c >= 0, "temperature.gpu (\u00b0C)", s->temperature_c)
    GPU_METRIC(s->power_w >= 0, "power.draw (W)", s->power_w)
#undef GPU_METRIC
    return n;
}

/* The process's GPU (the default device, a cuda one) through NVML, as
 * Lightning's DeviceStatsMonitor on CUDA: false, logging nothing, when
 * there is none or NVML cannot answer (the CPU stats are logged instead). */
static bool log_gpu_stats(lk_trainer *tr, const lk_log_opts *o, lk_status *st) {
    lk_device dev = lk_device_default();
    if (dev.kind != LK_CUDA) return false;
    lk__gpu_stats s;
    int nvml = lk__nvml_index_for(dev.index, getenv("CUDA_VISIBLE_DEVICES"));
    if (lk__nvml_stats(nvml, &s)) {
        lk_clear_error();
        return false;
    }
    char name[LK__GPU_METRICS][80];
    double value[LK__GPU_METRICS];
    int n = lk__gpu_stats_metrics(dev.index, &s, name, value);
    *st = LK_STATUS_OK;
    for (int k = 0; k < n && !*st; k++) *st = lk_log_metric(tr, name[k], value[k], o);
    return true;
}

/* DeviceStatsMonitor: the GPU's NVML stats when training on one, else this
 * process's CPU utilisation since the last call and its resident memory,
 * with the largest RSS of any rank (one all-reduce, run on every rank
 * whichever it logs, so that ranks that differ cannot deadlock). */
lk_status lk__log_device_stats(lk_trainer *tr) {
    if (!tr->cfg.device_stats_monitor) return LK_STATUS_OK;
    double now = lk_time_now(), cpu = lk_time_cpu();
    double util = tr->stats_wall > 0 && now > tr->stats_wall ? 100.0 * (cpu - tr->stats_cpu) / (now - tr->stats_wall) : 0;
    tr->stats_wall = now;
    tr->stats_cpu = cpu;
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    double rss = (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0), rss_max = rss;
    if (tr->world > 1) LK_TRY(lk_comm_all_reduce(tr->comm, &rss_max, 1, LK_F64, LK_REDUCE_MAX));
    const char *st = tr->stage;
    tr->stage = "train";
    lk_log_opts o = {.on_step = 1, .on_epoch = -1};
    lk_status s = LK_STATUS_OK;
    if (!log_gpu_stats(tr, &o, &s)) {
        s = lk_log_metric(tr, "device_stats/cpu_percent", util, &o);
        if (!s) s = lk_log_metric(tr, "device_stats/rss_mb", rss, &o);
        if (!s && tr->world > 1) s = lk_log_metric(tr, "device_stats/rss_mb_max_rank", rss_max, &o);
    }
    tr->stage = st;
    return s;
}

/* LearningRateMonitor.logging_interval: true when lr-* is logged per epoch
 * (at the epoch start, into the epoch's row) rather than per logged step. */
static bool lr_per_epoch(const lk_trainer *tr) {
    const char *iv = tr->cfg.lr_logging_interval;
    if (!strcmp(iv, "epoch")) return true;
    /* null: Lightning logs a scheduler's lr when it steps */
    return !strcmp(iv, "null") && tr->sched && !strcmp(tr->opt.interval, "epoch");
}

lk_status lk__log_lr(lk_trainer *tr) {
    if (!tr->optim) return LK_STATUS_OK;
    if (lr_per_epoch(tr)) return LK_STATUS_OK;
    char name[64];
    snprintf(name, sizeof name, "lr-%s", !strcmp(tr->opt.name, "adamw") ? "AdamW" : !strcmp(tr->opt.name, "sgd") ? "SGD"
                                         : !strcmp(tr->opt.name, "rmsprop") ? "RMSprop" : "Adam");
    const char *st = tr->stage;
    tr->stage = "train";
    lk_status s = lk_log_metric(tr, name, lk_optimizer_get_lr(tr->optim, 0), &(lk_log_opts){.on_step = 1, .on_epoch = -1});
    tr->stage = st;
    return s;
}

/* The per-epoch form: logged once as the epoch starts, written with the
 * epoch's row under the same name. */
lk_status lk__log_lr_epoch(lk_trainer *tr) {
    if (!tr->optim || !lr_per_epoch(tr)) return LK_STATUS_OK;
    char name[64];
    snprintf(name, sizeof name, "lr-%s", !strcmp(tr->opt.name, "adamw") ? "AdamW" : !strcmp(tr->opt.name, "sgd") ? "SGD"
                                         : !strcmp(tr->opt.name, "rmsprop") ? "RMSprop" : "Adam");
    const char *st = tr->stage;
    tr->stage = "train";
    lk_status s = lk_log_metric(tr, name, lk_optimizer_get_lr(tr->optim, 0), &(lk_log_opts){.on_step = -1, .on_epoch = 1});
    tr->stage = st;
    return s;
}

/* precision 16-mixed: the loss scale after this step's update. */
lk_status lk__log_scale(lk_trainer *tr) {
    if (!tr->scaler) return LK_STATUS_OK;
    const char *st = tr->stage;
    tr->stage = "train";
    lk_status s = lk_log_metric(tr, "scaler/scale", lk_grad_scaler_scale(tr->scaler),
                                &(lk_log_opts){.on_step = 1, .on_epoch = -1});
    tr->stage = st;
    return s;
}
