/* lk_log and Lightning's aggregation rules: a metric logged in a step is
 * kept per step (on_step) and/or averaged over the epoch weighted by batch
 * size (on_epoch); when both, it appears as name_step and name_epoch.
 * Epoch aggregates are reduced across ranks as weighted sums, so a
 * validation metric is exactly the mean over every sample of the split. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "train/train_impl.h"

lk_metric *lk__metric_get(lk_trainer *tr, const char *name, bool create) {
    for (int i = 0; i < tr->nmetrics; i++)
        if (!strcmp(tr->metrics[i].name, name)) return &tr->metrics[i];
    if (!create) return NULL;
    if (tr->nmetrics == tr->cap_metrics && lk_vec_reserve(tr->metrics, tr->cap_metrics, tr->nmetrics + 1, 16))
        return NULL;
    lk_metric *m = &tr->metrics[tr->nmetrics++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

lk_status lk_log_metric(lk_trainer *tr, const char *name, double value, const lk_log_opts *opts) {
    if (!tr || !name || !*name) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_metric: a trainer and a metric name are required");
    if (strlen(name) >= LK_METRIC_NAME - 8)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_metric: metric name '%.40s...' is too long", name);
    bool train = tr->stage && !strcmp(tr->stage, "train");
    lk_log_opts o = opts ? *opts : (lk_log_opts){0};
    bool on_step = o.on_step == 0 ? train : o.on_step > 0;
    bool on_epoch = o.on_epoch == 0 ? !train : o.on_epoch > 0;
    if (!train) on_step = false; /* Lightning: eval metrics are epoch-level */
    lk_metric *m = lk__metric_get(tr, name, true);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    m->stage = tr->stage;
    m->prog_bar = o.prog_bar;
    m->on_step = on_step;
    m->on_epoch = on_epoch;
    m->sync_dist = o.sync_dist;
    m->reduce = o.reduce;
    m->logger = !o.no_logger;
    if (on_step) {
        m->step_value = value;
        m->step_fresh = true;
        m->value = value;
        m->has_value = true;
    }
    if (on_epoch) {
        double w = tr->cur_batch_size > 0 ? (double)tr->cur_batch_size : 1.0;
        switch (o.reduce) {
        case LK_LOG_REDUCE_MEAN: m->epoch_sum += value * w, m->epoch_weight += w; break;
        case LK_LOG_REDUCE_SUM: m->epoch_sum += value, m->epoch_weight = 1; break;
        case LK_LOG_REDUCE_MAX: m->epoch_ext = m->epoch_any ? fmax(m->epoch_ext, value) : value; break;
        case LK_LOG_REDUCE_MIN: m->epoch_ext = m->epoch_any ? fmin(m->epoch_ext, value) : value; break;
        }
        m->epoch_any = true;
    }
    return LK_STATUS_OK;
}

lk_status lk__log_loss(lk_trainer *tr, const char *name, const lk_tensor *loss, const lk_log_opts *opts) {
    /* dp reads each replica's loss itself and checks their weighted mean, and
     * a dp replica's scratch trainer has no strategy: both log the value now */
    bool defer = tr && loss && name && !lk_device_is_host(loss->device) && tr->strat && !tr->dp_devices &&
                 tr->stage && !strcmp(tr->stage, "train");
    if (!defer) return lk_log_metric(tr, name, lk_tensor_item(loss), opts);
    if (strlen(name) >= LK_METRIC_NAME - 8)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_metric: metric name '%.40s...' is too long", name);
    tr->pending_loss.armed = true;
    snprintf(tr->pending_loss.name, sizeof tr->pending_loss.name, "%s", name);
    tr->pending_loss.opts = opts ? *opts : (lk_log_opts){0};
    tr->pending_loss.batch_size = tr->cur_batch_size;
    return LK_STATUS_OK;
}

void lk__metrics_reset_epoch(lk_trainer *tr, const char *stage) {
    for (int i = 0; i < tr->nmetrics; i++) {
        lk_metric *m = &tr->metrics[i];
        if (stage && m->stage && strcmp(m->stage, stage)) continue;
        m->epoch_sum = m->epoch_weight = m->epoch_ext = 0;
        m->epoch_any = false;
        m->step_fresh = false;
    }
}

static bool in_stage(const lk_metric *m, const char *stage) {
    return !stage || (m->stage && !strcmp(m->stage, stage));
}

lk_status lk__metrics_end_epoch(lk_trainer *tr, const char *stage) {
    /* Every rank logs the same metrics in the same order (the same code ran),
     * so one all-reduce per kind covers them all. A rank with no batch in
     * this loop contributes zero weight. */
    int n = tr->nmetrics;
    if (n == 0) return LK_STATUS_OK;
    double *sum = lk_calloc((size_t)(3 * n), sizeof *sum);
    if (!sum) return LK_STATUS_OUT_OF_MEMORY;
    double *mx = sum + 2 * n;
    for (int i = 0; i < n; i++) {
        lk_metric *m = &tr->metrics[i];
        mx[i] = -INFINITY;
        if (!in_stage(m, stage)) continue;
        sum[2 * i] = m->epoch_sum;
        sum[2 * i + 1] = m->epoch_weight;
        mx[i] = m->epoch_any ? (m->reduce == LK_LOG_REDUCE_MIN ? -m->epoch_ext : m->epoch_ext) : -INFINITY;
    }
    lk_status st = LK_STATUS_OK;
    if (tr->strat && tr->world > 1) {
        st = lk_strategy_reduce(tr->strat, sum, 2 * n, LK_REDUCE_SUM);
        if (!st) st = lk_strategy_reduce(tr->strat, mx, n, LK_REDUCE_MAX);
    }
    for (int i = 0; i < n && !st; i++) {
        lk_metric *m = &tr->metrics[i];
        if (!in_stage(m, stage)) continue;
        bool any = m->epoch_any || sum[2 * i + 1] > 0 || mx[i] > -INFINITY;
        if (!m->on_epoch || !any) continue;
        switch (m->reduce) {
        case LK_LOG_REDUCE_MEAN: m->value = sum[2 * i + 1] > 0 ? sum[2 * i] / sum[2 * i + 1] : NAN; break;
        case LK_LOG_REDUCE_SUM: m->value = sum[2 * i]; break;
        case LK_LOG_REDUCE_MAX: m->value = mx[i]; break;
        case LK_LOG_REDUCE_MIN: m->value = -mx[i]; break;
        }
        m->has_value = true;
        m->epoch_any = true; /* mark "has an epoch value to log" */
    }
    lk_free(sum);
    return st;
}

static lk_status log_rows(lk_trainer *tr, const char **names, double *vals, int k) {
    if (!tr->logger || k == 0) return LK_STATUS_OK;
    names[k] = "epoch";
    vals[k] = (double)tr->epoch;
    return lk_logger_log_metrics(tr->logger, tr->global_step, names, vals, k + 1);
}

lk_status lk__metrics_log_step(lk_trainer *tr) {
    const char *names[128];
    char buf[128][LK_METRIC_NAME + 8];
    double vals[128];
    int k = 0;
    for (int i = 0; i < tr->nmetrics && k < 127; i++) {
        lk_metric *m = &tr->metrics[i];
        if (!m->step_fresh || !m->logger) continue;
        m->step_fresh = false;
        snprintf(buf[k], sizeof buf[k], "%s%s", m->name, m->on_epoch ? "_step" : "");
        names[k] = buf[k];
        vals[k++] = m->step_value;
    }
    return log_rows(tr, names, vals, k);
}

lk_status lk__metrics_log_epoch(lk_trainer *tr, const char *stage) {
    const char *names[128];
    char buf[128][LK_METRIC_NAME + 8];
    double vals[128];
    int k = 0;
    for (int i = 0; i < tr->nmetrics && k < 127; i++) {
        lk_metric *m = &tr->metrics[i];
        if (!m->on_epoch || !m->epoch_any || !m->logger) continue;
        if (!in_stage(m, stage)) continue;
        m->epoch_any = false;
        snprintf(buf[k], sizeof buf[k], "%s%s", m->name, m->on_step ? "_epoch" : "");
        names[k] = buf[k];
        vals[k++] = m->value;
    }
    return log_rows(tr, names, vals, k);
}

int lk__metrics_prog_bar(lk_trainer *tr, const char **names, double *values, int max) {
    int k = 0;
    for (int i = 0; i < tr->nmetrics && k < max; i++) {
        lk_metric *m = &tr->metrics[i];
        if (!m->prog_bar || !m->has_value) continue;
        names[k] = m->name;
        values[k++] = m->value;
    }
    return k;
}

void lk__metrics_available(const lk_trainer *tr, char *out, size_t size) {
    size_t k = 0;
    out[0] = 0;
    for (int i = 0; i < tr->nmetrics && k + 1 < size; i++)
        if (tr->metrics[i].has_value)
            k += (size_t)snprintf(out + k, size - k, "%s%s", k ? ", " : "", tr->metrics[i].name);
    if (!out[0]) snprintf(out, size, "(none)");
}

bool lk_trainer_metric(const lk_trainer *tr, const char *name, double *value) {
    for (int i = 0; i < tr->nmetrics; i++)
        if (!strcmp(tr->metrics[i].name, name) && tr->metrics[i].has_value) {
            *value = tr->metrics[i].value;
            return true;
        }
    return false;
}
