/* lk_log and Lightning's aggregation rules: a metric logged in a step is
 * kept per step (on_step) and/or averaged over the epoch weighted by batch
 * size (on_epoch); when both, it appears as name_step and name_epoch.
 * Epoch aggregates are reduced across ranks as weighted sums, so a
 * validation metric is exactly the mean over every sample of the split. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "tensor/tensor_impl.h"
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

/* The metric `name` with the attributes lk_log_metric gives it for `opts`
 * in the current stage (created on first use); NULL when out of memory. */
static lk_metric *metric_for_log(lk_trainer *tr, const char *name, const lk_log_opts *opts) {
    bool train = tr->stage && !strcmp(tr->stage, "train");
    lk_log_opts o = opts ? *opts : (lk_log_opts){0};
    bool on_step = o.on_step == 0 ? train : o.on_step > 0;
    bool on_epoch = o.on_epoch == 0 ? !train : o.on_epoch > 0;
    if (!train) on_step = false; /* Lightning: eval metrics are epoch-level */
    lk_metric *m = lk__metric_get(tr, name, true);
    if (!m) return NULL;
    m->stage = tr->stage;
    m->prog_bar = o.prog_bar;
    m->on_step = on_step;
    m->on_epoch = on_epoch;
    m->sync_dist = o.sync_dist;
    m->reduce = o.reduce;
    m->logger = !o.no_logger;
    return m;
}

/* One value into m's epoch aggregate, weighted by its batch's size. */
static void epoch_add(lk_metric *m, double value, int64_t batch_size) {
    double w = batch_size > 0 ? (double)batch_size : 1.0;
    switch (m->reduce) {
    case LK_LOG_REDUCE_MEAN: m->epoch_sum += value * w, m->epoch_weight += w; break;
    case LK_LOG_REDUCE_SUM: m->epoch_sum += value, m->epoch_weight = 1; break;
    case LK_LOG_REDUCE_MAX: m->epoch_ext = m->epoch_any ? fmax(m->epoch_ext, value) : value; break;
    case LK_LOG_REDUCE_MIN: m->epoch_ext = m->epoch_any ? fmin(m->epoch_ext, value) : value; break;
    }
    m->epoch_any = true;
}

static lk_status check_name(const char *name) {
    if (strlen(name) >= LK_METRIC_NAME - 8)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_metric: metric name '%.40s...' is too long", name);
    return LK_STATUS_OK;
}

lk_status lk_log_metric(lk_trainer *tr, const char *name, double value, const lk_log_opts *opts) {
    if (!tr || !name || !*name) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_metric: a trainer and a metric name are required");
    LK_TRY(check_name(name));
    lk_metric *m = metric_for_log(tr, name, opts);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    if (m->on_step) {
        m->step_value = value;
        m->step_fresh = true;
        m->value = value;
        m->has_value = true;
    }
    if (m->on_epoch) epoch_add(m, value, tr->cur_batch_size);
    return LK_STATUS_OK;
}

lk_status lk__log_loss(lk_trainer *tr, const char *name, const lk_tensor *loss, const lk_log_opts *opts) {
    bool defer = tr && loss && name && !lk_device_is_host(loss->device) && tr->stage && !strcmp(tr->stage, "train");
    /* dp's replica k >= 1 logs into a scratch trainer (no strategy) whose
     * metrics are discarded: on a device its loss is not read for it */
    if (defer && !tr->strat) return check_name(name);
    if (!defer) return lk_log_metric(tr, name, lk_tensor_item(loss), opts);
    LK_TRY(check_name(name));
    tr->pending_loss.armed = true;
    snprintf(tr->pending_loss.name, sizeof tr->pending_loss.name, "%s", name);
    tr->pending_loss.opts = opts ? *opts : (lk_log_opts){0};
    tr->pending_loss.batch_size = tr->cur_batch_size;
    return LK_STATUS_OK;
}

/* ---- validation/test metrics kept on the device ----------------------------------
 * A value logged by lk__log_tensor / lk__log_accuracy on a device the host
 * cannot read goes into slot k of a device array of doubles (a device-side
 * copy or the accuracy op: no read), and its metric, batch size and divisor
 * into entry k here. lk__metrics_end_epoch reads all slots in one copy and
 * adds them to their metrics in entry order with the same doubles
 * lk_log_metric would have added per batch, so the aggregate has the same
 * bits. The array doubles when full and stays for the run, so a repeated
 * loop allocates nothing. */
typedef struct {
    int metric;         /* index in tr->metrics */
    int64_t batch_size; /* the epoch weight */
    int64_t rows;       /* accuracy: value = slot / rows (0 rows: 0); -1: value = slot */
} deferred_entry;

struct lk__deferred {
    lk_device dev;
    double *slots; /* device memory, [cap] */
    double *host;  /* [cap]: where the one read lands */
    int64_t cap;
    deferred_entry *e; /* [cap] */
    int64_t n;
};

static lk_status deferred_flush(lk_trainer *tr);

void lk__metrics_deferred_free(lk_trainer *tr) {
    lk__deferred *q = tr->deferred;
    if (!q) return;
    lk_device_free(q->dev, q->slots, (size_t)q->cap * sizeof(double));
    lk_free(q->host);
    lk_free(q->e);
    lk_free(q);
    tr->deferred = NULL;
}

/* Whether a value computed from tensor t can wait on t's device: an eval
 * loop's epoch metric on a device other than the host (the host reads its
 * values now, as lk_log_metric). dp's evaluation runs on device 0 alone
 * (run_eval: the module's own step over the whole batch), so its values
 * wait there as a single device's do. */
static bool can_defer(const lk_trainer *tr, const lk_tensor *t, const lk_log_opts *opts) {
    if (!t || lk_device_is_host(t->device)) return false;
    if (!tr->stage || !strcmp(tr->stage, "train")) return false;
    return !opts || opts->on_epoch >= 0;
}

/* Makes room for one more slot on dev (a loop on another device than the
 * last one's starts a new array) and returns its index in *k. */
static lk_status deferred_reserve(lk_trainer *tr, lk_device dev, int64_t *k) {
    lk__deferred *q = tr->deferred;
    if (q && !lk_device_equal(q->dev, dev)) { /* rare: what waits is read now, and the array moves */
        LK_TRY(deferred_flush(tr));
        lk__metrics_deferred_free(tr);
        q = NULL;
    }
    if (!q) {
        q = lk_calloc(1, sizeof *q);
        if (!q) return LK_STATUS_OUT_OF_MEMORY;
        q->dev = dev;
        tr->deferred = q;
    }
    if (q->n == q->cap) {
        int64_t cap = q->cap ? 2 * q->cap : 64;
        double *slots = NULL, *host = lk_malloc((size_t)cap * sizeof(double));
        deferred_entry *e = lk_malloc((size_t)cap * sizeof *e);
        lk_status st = host && e ? lk_device_alloc(dev, (size_t)cap * sizeof(double), (void **)&slots) : LK_STATUS_OUT_OF_MEMORY;
        /* the slots written so far move within the device (no read) */
        if (!st && q->n) st = lk_device_copy(dev, slots, dev, q->slots, (size_t)q->n * sizeof(double));
        if (st) {
            if (slots) lk_device_free(dev, slots, (size_t)cap * sizeof(double));
            lk_free(host);
            lk_free(e);
            return st;
        }
        if (q->n) memcpy(e, q->e, (size_t)q->n * sizeof *e);
        lk_device_free(dev, q->slots, (size_t)q->cap * sizeof(double));
        lk_free(q->host);
        lk_free(q->e);
        q->slots = slots, q->host = host, q->e = e, q->cap = cap;
    }
    *k = q->n;
    return LK_STATUS_OK;
}

/* Reads the waiting slots in one copy and adds them to their metrics in
 * the order they were logged. Nothing to do when none waits. */
static lk_status deferred_flush(lk_trainer *tr) {
    lk__deferred *q = tr->deferred;
    if (!q || q->n == 0) return LK_STATUS_OK;
    int64_t n = q->n;
    q->n = 0;
    LK_TRY(lk_device_copy(LK_DEVICE_CPU, q->host, q->dev, q->slots, (size_t)n * sizeof(double)));
    for (int64_t k = 0; k < n; k++) {
        const deferred_entry *e = &q->e[k];
        /* rows < 0: the value itself; accuracy: hits / rows, the host's division */
        double v = e->rows < 0 ? q->host[k] : e->rows ? q->host[k] / (double)e->rows : 0;
        epoch_add(&tr->metrics[e->metric], v, e->batch_size);
    }
    return LK_STATUS_OK;
}

/* The metric and entry of a deferred value whose slot the caller fills
 * (*slot: device memory); *slot is NULL when the metric is not kept per
 * epoch (nothing to fill). */
static lk_status deferred_begin(lk_trainer *tr, const char *name, lk_device dev, int64_t rows, const lk_log_opts *opts,
                                double **slot) {
    *slot = NULL;
    LK_TRY(check_name(name));
    int64_t k;
    LK_TRY(deferred_reserve(tr, dev, &k));
    lk_metric *m = metric_for_log(tr, name, opts);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    if (!m->on_epoch) return LK_STATUS_OK;
    lk__deferred *q = tr->deferred;
    q->e[k] = (deferred_entry){(int)(m - tr->metrics), tr->cur_batch_size, rows};
    *slot = q->slots + k;
    return LK_STATUS_OK;
}

lk_status lk__log_tensor(lk_trainer *tr, const char *name, const lk_tensor *t, const lk_log_opts *opts) {
    /* a float scalar widens exactly to the double slot; lk_tensor_item's f32
     * rounding would change an f64 value, so that one is read now */
    bool fl = t && t->numel == 1 && (t->dtype == LK_F32 || t->dtype == LK_BF16 || t->dtype == LK_F16);
    if (!tr || !name || !*name || !fl || !can_defer(tr, t, opts)) return lk_log_metric(tr, name, lk_tensor_item(t), opts);
    double *slot;
    LK_TRY(deferred_begin(tr, name, t->device, -1, opts, &slot));
    if (!slot) return LK_STATUS_OK;
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {t->dtype, LK_F64}};
    d.copy = (lk_copy_params){.ndim = 1, .shape = {1}, .ss = {1}, .sd = {1}};
    void *ops[2] = {t->data, slot};
    LK_TRY(lk__backend_run(t->device, &d, ops));
    tr->deferred->n++;
    return LK_STATUS_OK;
}

/* The hit count of contiguous logits and targets into *hits (device memory
 * on their device, or host memory when that is the host). */
static lk_status count_hits(const lk_tensor *logits, const lk_tensor *target, double *hits) {
    lk_op_desc d = {.op = LK_OP_ACCURACY, .dtype = {logits->dtype, target->dtype, LK_F64}};
    d.accuracy = (lk_accuracy_params){logits->shape[0], logits->shape[1]};
    void *ops[3] = {logits->data, target->data, hits};
    return lk__backend_run(logits->device, &d, ops);
}

lk_status lk__log_accuracy(lk_trainer *tr, const char *name, const lk_tensor *logits_in, const lk_tensor *target_in,
                           const lk_log_opts *opts) {
    if (!tr || !name || !*name || !logits_in || !target_in || logits_in->ndim != 2 ||
        target_in->numel != logits_in->shape[0] || !lk_device_equal(logits_in->device, target_in->device))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk__log_accuracy: '%s' needs [N, C] logits and [N] targets on one device",
                        name ? name : "");
    int64_t n = logits_in->shape[0];
    lk_device dev = logits_in->device;
    /* the op reads contiguous rows; a strided view is copied on its device first */
    lk_tensor *logits = lk_tensor_is_contiguous(logits_in) ? lk_tensor_retain((lk_tensor *)logits_in) : lk_tensor_clone(logits_in);
    lk_tensor *target = lk_tensor_is_contiguous(target_in) ? lk_tensor_retain((lk_tensor *)target_in) : lk_tensor_clone(target_in);
    lk_status st = logits && target ? LK_STATUS_OK : lk_last_status();
    if (!st && can_defer(tr, logits, opts)) {
        double *slot = NULL;
        st = deferred_begin(tr, name, dev, n, opts, &slot);
        if (!st && slot) st = count_hits(logits, target, slot);
        if (!st && slot) tr->deferred->n++;
    } else if (!st) { /* read now: the count alone, one double (a pooled tensor on dev) */
        lk_tensor *h = lk__tensor_new_on(dev, LK_F64, 1, (int64_t[]){1});
        st = h ? count_hits(logits, target, h->data) : lk_last_status();
        double hits = st ? 0 : lk_tensor_get(h, 0);
        lk_tensor_release(h);
        if (!st) st = lk_log_metric(tr, name, n ? hits / (double)n : 0, opts);
    }
    lk_tensor_release(logits);
    lk_tensor_release(target);
    return st;
}

void lk__metrics_reset_epoch(lk_trainer *tr, const char *stage) {
    if (tr->deferred) tr->deferred->n = 0; /* a failed loop's leftovers */
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
    LK_TRY(deferred_flush(tr)); /* the device-kept values first: they are part of the sums */
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
    if (tr->strat && lk_strategy_dp_size(tr->strat) > 1) { /* over the ranks that saw different data */
        st = lk_strategy_dp_reduce(tr->strat, sum, 2 * n, LK_REDUCE_SUM);
        if (!st) st = lk_strategy_dp_reduce(tr->strat, mx, n, LK_REDUCE_MAX);
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

lk_status lk_trainer_get_metric(const lk_trainer *tr, const char *name, double *value) {
    if (!tr || !name || !value)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_trainer_get_metric: trainer, name and value are required");
    if (lk_trainer_metric(tr, name, value)) return LK_STATUS_OK;
    char names[1024];
    lk__metrics_available(tr, names, sizeof names);
    /* the rank as lk_trainer_rank says it, read here: trainer.c uses this file, not the other way */
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "metric '%s' has no value on rank %d; logged metrics: %s", name,
                    tr->launcher ? -1 : tr->rank, names);
}

lk_status lk_log_accuracy(lk_trainer *tr, const char *name, const lk_tensor *logits, const lk_tensor *target,
                          const lk_log_opts *opts) {
    if (!tr || !name || !*name || !logits || !target)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_accuracy: trainer, name, logits and target are required");
    if (logits->ndim != 2 || target->numel != logits->shape[0] || !lk_device_equal(logits->device, target->device))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_accuracy: '%s' needs logits [N, C] and class indices [N] on "
                        "one device, got logits of %d dims (%lld rows) and %lld targets", name, logits->ndim,
                        (long long)(logits->ndim ? logits->shape[0] : 0), (long long)target->numel);
    return lk__log_accuracy(tr, name, logits, target, opts);
}

/* ---- the metrics in a checkpoint ------------------------------------------------ */

/* Flags of one metric in the checkpoint's "metrics" lines. */
enum { MF_PROG_BAR = 1, MF_ON_STEP = 2, MF_ON_EPOCH = 4, MF_SYNC_DIST = 8, MF_LOGGER = 16, MF_HAS_VALUE = 32 };

/* A name that would break the tab- and line-separated text is not kept
 * (a metric row in CSV would break on it too). */
static bool storable(const lk_metric *m) { return m->stage && !strpbrk(m->name, "\t\n\r"); }

lk_status lk__metrics_gather(lk_trainer *tr) {
    lk_free(tr->ckpt_rows);
    tr->ckpt_rows = NULL;
    tr->ckpt_rows_n = 0;
    LK_TRY(deferred_flush(tr)); /* (eval loops only: none waits inside a training epoch) */
    int n = tr->nmetrics, w = tr->world > 1 ? tr->world : 1;
    if (n == 0) return LK_STATUS_OK;
    if ((int64_t)w * n * 4 > INT32_MAX)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint: %d metrics on %d ranks are too many to keep", n, w);
    double *rows = lk_calloc((size_t)w * (size_t)n * 4, sizeof *rows);
    if (!rows) return LK_STATUS_OUT_OF_MEMORY;
    double *mine = rows + (size_t)(w > 1 ? tr->rank : 0) * (size_t)n * 4;
    for (int i = 0; i < n; i++) {
        const lk_metric *m = &tr->metrics[i];
        if (!m->stage || strcmp(m->stage, "train")) continue;
        mine[4 * i] = m->epoch_sum, mine[4 * i + 1] = m->epoch_weight;
        mine[4 * i + 2] = m->epoch_ext, mine[4 * i + 3] = m->epoch_any;
    }
    /* An all-gather as a sum: every other rank adds exact zeros to a row.
     * Over the world, not the data-parallel group: the one writer keeps
     * every rank's own sums, and each group reduces its rows over itself
     * when the resumed epoch ends. */
    lk_status st = w > 1 ? lk_strategy_reduce(tr->strat, rows, w * n * 4, LK_REDUCE_SUM) : LK_STATUS_OK;
    if (st) {
        lk_free(rows);
        return st;
    }
    tr->ckpt_rows = rows;
    tr->ckpt_rows_n = n;
    return LK_STATUS_OK;
}

char *lk__metrics_state(const lk_trainer *tr) {
    int w = tr->world > 1 ? tr->world : 1;
    size_t cap = 1;
    for (int i = 0; i < tr->nmetrics; i++) cap += strlen(tr->metrics[i].name) + 64 + (size_t)w * 4 * 26;
    char *s = lk_malloc(cap), *p = s;
    if (!s) return NULL;
    *p = 0;
    for (int i = 0; i < tr->nmetrics; i++) {
        const lk_metric *m = &tr->metrics[i];
        if (!storable(m)) continue;
        int flags = (m->prog_bar ? MF_PROG_BAR : 0) | (m->on_step ? MF_ON_STEP : 0) | (m->on_epoch ? MF_ON_EPOCH : 0) |
                    (m->sync_dist ? MF_SYNC_DIST : 0) | (m->logger ? MF_LOGGER : 0) | (m->has_value ? MF_HAS_VALUE : 0);
        p += snprintf(p, cap - (size_t)(p - s), "%s%s\t%s\t%d\t%d\t%.17g\t", p == s ? "" : "\n", m->name, m->stage,
                      flags, (int)m->reduce, m->has_value ? m->value : NAN);
        if (tr->ckpt_rows && i < tr->ckpt_rows_n && !strcmp(m->stage, "train"))
            for (int r = 0; r < w; r++) {
                const double *x = tr->ckpt_rows + ((size_t)r * (size_t)tr->ckpt_rows_n + (size_t)i) * 4;
                p += snprintf(p, cap - (size_t)(p - s), "%s%.17g %.17g %.17g %d", r ? ";" : "", x[0], x[1], x[2],
                              x[3] != 0);
            }
    }
    return s;
}

/* One parsed line of the "metrics" text. */
typedef struct {
    char name[LK_METRIC_NAME];
    const char *stage;
    int flags, reduce;
    double value;
    const char *rows; /* inside the text; NULL: none */
} saved_metric;

static bool parse_double(const char **p, double *out) {
    if (isspace((unsigned char)**p)) return false; /* strtod would skip a line's end */
    char *end;
    *out = strtod(*p, &end);
    if (end == *p) return false;
    *p = end;
    return true;
}

/* One line (up to its end) into *m; false when it is not one. */
static bool parse_line(const char *line, const char *eol, long long world, saved_metric *m) {
    const char *tab = memchr(line, '\t', (size_t)(eol - line));
    if (!tab || tab == line || tab - line >= LK_METRIC_NAME - 8) return false;
    memcpy(m->name, line, (size_t)(tab - line));
    m->name[tab - line] = 0;
    const char *p = tab + 1;
    static const char *const stages[] = {"train", "val", "test"};
    m->stage = NULL;
    for (int k = 0; k < 3 && !m->stage; k++) {
        size_t len = strlen(stages[k]);
        if ((size_t)(eol - p) > len && !strncmp(p, stages[k], len) && p[len] == '\t') m->stage = stages[k], p += len + 1;
    }
    if (!m->stage) return false;
    char *end;
    long flags = strtol(p, &end, 10);
    if (end == p || *end != '\t' || flags < 0 || flags > 63) return false;
    p = end + 1;
    long reduce = strtol(p, &end, 10);
    if (end == p || *end != '\t' || reduce < LK_LOG_REDUCE_MEAN || reduce > LK_LOG_REDUCE_MIN) return false;
    p = end + 1;
    if (!parse_double(&p, &m->value) || *p != '\t') return false;
    m->flags = (int)flags, m->reduce = (int)reduce;
    p++;
    m->rows = p < eol ? p : NULL;
    if (m->rows && strcmp(m->stage, "train")) return false;
    for (long long r = 0; m->rows && r < world; r++) { /* "sum weight ext any" per rank, ';' between */
        double x[3];
        for (int k = 0; k < 3; k++) {
            if (!parse_double(&p, &x[k]) || *p != ' ') return false;
            p++;
        }
        if ((*p != '0' && *p != '1') || p + 1 > eol) return false;
        p++;
        if (r + 1 < world && *p++ != ';') return false;
    }
    return p == eol;
}

lk_status lk__metrics_restore(lk_trainer *tr, const char *path, const char *text, long long world) {
    bool rows = false;
    for (int pass = 0; pass < 2; pass++) { /* the whole text checked before anything changes */
        const char *line = text;
        for (int no = 1; *line; no++) {
            const char *eol = strchr(line, '\n');
            if (!eol) eol = line + strlen(line);
            saved_metric s;
            if (!parse_line(line, eol, world, &s))
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "checkpoint %s: metadata 'metrics' line %d is '%.60s%s', expected name, stage "
                                "(train/val/test), flags, reduction, value and, inside an epoch, %lld rank sum%s",
                                path, no, line, eol - line > 60 ? "..." : "", world, world > 1 ? "s" : "");
            rows = rows || s.rows;
            if (pass == 1) {
                lk_metric *m = lk__metric_get(tr, s.name, true);
                if (!m) return LK_STATUS_OUT_OF_MEMORY;
                m->stage = s.stage;
                m->prog_bar = s.flags & MF_PROG_BAR, m->on_step = s.flags & MF_ON_STEP;
                m->on_epoch = s.flags & MF_ON_EPOCH, m->sync_dist = s.flags & MF_SYNC_DIST;
                m->logger = s.flags & MF_LOGGER, m->has_value = s.flags & MF_HAS_VALUE;
                m->reduce = (lk_log_reduce)s.reduce;
                m->value = s.value;
                m->epoch_sum = m->epoch_weight = m->epoch_ext = 0;
                m->epoch_any = false;
                /* This rank's own sums when the world is the one that wrote
                 * them; in another world rank 0 carries them all (the order
                 * of the additions differs, the sums are the same). */
                const char *p = s.rows;
                for (long long r = 0; p && r < world; r++) {
                    double x[3] = {0, 0, 0}; /* (parsed in the first pass) */
                    for (int k = 0; k < 3; k++) parse_double(&p, &x[k]), p++;
                    bool any = *p == '1';
                    p += 2;
                    bool take = world == tr->world ? r == tr->rank : tr->rank == 0;
                    if (!take || !any) continue;
                    bool first = !m->epoch_any;
                    m->epoch_sum += x[0], m->epoch_weight = m->reduce == LK_LOG_REDUCE_SUM ? 1 : m->epoch_weight + x[1];
                    m->epoch_ext = first ? x[2] : m->reduce == LK_LOG_REDUCE_MIN ? fmin(m->epoch_ext, x[2]) : fmax(m->epoch_ext, x[2]);
                    m->epoch_any = true;
                }
            }
            line = *eol ? eol + 1 : eol;
        }
    }
    tr->epoch_restored = rows;
    return LK_STATUS_OK;
}
