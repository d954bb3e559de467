/* The fit harness the sealed-device tests share (test_sealed.c,
 * test_prefetch.c, test_syncs.c): one run spec and one run result, the
 * trainer configuration they all train with (seed 3, logging every step,
 * no progress bar, tensorboard, summary or sanity validation), sh_fit()
 * that builds the builtin model and synthetic data, fits, optionally tests
 * and predicts, and copies the parameters to the host; the probe that
 * records the devices' counters at the start of every training_step;
 * sh_same_bits() comparing two runs bit for bit; and the temp root's
 * cleanup. Static functions only, like tests/sealed_device.h, so each test
 * binary has its own copy and its own state.
 *
 * What only one test needs comes in through the spec: a datamodule hook
 * (prefetch's failing training set), a step hook around the module's
 * training_step (syncs' op hook), and switches for the sealed test's extra
 * checks. The including file defines setup(), which fills sh_root and
 * creates its device; sh_fit calls it when a case runs alone. */
#ifndef LK_TESTS_SEALED_HARNESS_H
#define LK_TESTS_SEALED_HARNESS_H

#include <unistd.h>

#include "lk_test.h"
#include "lockstep/strategy.h"
#include "lockstep/trainer.h"
#include "sealed_device.h"

static const lk_model_kv sh_mlp_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}, {"dropout", "0.25"}};
static const lk_model_kv sh_cnn_args[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "4"}};
static const lk_model_kv sh_mlp_nodrop_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}, {"dropout", "0"}};
static const lk_model_kv sh_ae_args[] = {{"input_dim", "16"}, {"hidden", "[12, 8]"}, {"latent_dim", "4"}};

enum { MAX_STEPS = 64 };
typedef struct run_out run_out;

typedef struct {
    const char *model, *accelerator; /* model: mlp, cnn or autoencoder */
    const char *precision;           /* NULL: 32-true */
    const char *strategy;            /* NULL: single */
    int devices;                     /* 0: 1 */
    int64_t max_steps, max_epochs;   /* max_epochs 0: 5 */
    const char *num_samples;         /* NULL: 640 (flat, 20 batches of 32) or 320 (cnn, 20 of 16) */
    const char *workers;             /* data.num_workers (NULL: "0") */
    lk_count_or_fraction limit;      /* limit_train_batches; value 0: all */
    int64_t accum;                   /* accumulate_grad_batches (0: 1) */
    double clip;                     /* trainer.gradient_clip_val (0: none) */
    const char *overflow;            /* LK_TEST_GRAD_OVERFLOW (an inf gradient at RANK:STEP), or NULL */
    bool no_checkpointing;           /* enable_checkpointing false */
    const char *resume;              /* a checkpoint to resume from, or NULL */
    char *last;                      /* where the last checkpoint's path goes (1024 bytes), or NULL */
    lk_status expect;                /* the fit's status */
    bool test_after;                 /* lk_trainer_test and lk_trainer_predict after the fit */
    bool accuracy;                   /* read val_acc and test_acc too */
    bool move_back;                  /* check the default device was put back and move the module to the host */
    bool probe;                      /* record the counters at the start of every training_step */
    bool probe_by_call;              /* index them by training_step call, not by global step */
    /* probe: called before (after = false) and after the module's training_step */
    void (*step_hook)(run_out *o, int64_t k, bool after);
    /* replaces m->vt before the fit (after the probe's; the module is freed after the fit) */
    void (*module_hook)(lk_module *m);
    /* replaces dm->vt before the fit (the harness puts the original back) */
    void (*datamodule_hook)(lk_datamodule *dm);
    int64_t fail_at; /* for prefetch's datamodule hook: > 0, the training set's get() fails at this call */
    const char *optimizer; /* NULL: the trainer's default (adam); "sgd" with momentum 0.9 */
    bool no_dropout;       /* mlp: dropout 0 */
} run_spec;

struct run_out {
    float *params; /* concatenated, on the host (caller frees) */
    int64_t n, param_bytes;
    double loss, val_loss, val_acc, test_loss, test_acc; /* NAN when not logged */
    float pred[4];       /* test_after: the first prediction row (4 logits) */
    long test_async;     /* test_after: async copies made by test and predict */
    sealed_stats before, after;
    sealed_async_counts abefore, aafter;
    sealed_peer_stats peer_before, peer_after; /* copies between sealed:0 and sealed:1 */
    /* probe: at the start of step k's training_step */
    uint64_t misses[MAX_STEPS]; /* the tensor pool's */
    sealed_stats at[MAX_STEPS];
    sealed_async_counts aat[MAX_STEPS];
    int64_t steps_seen;
    char err[1024]; /* the fit's error, "" when it succeeded */
};

static char sh_root[256];
static void setup(void);

/* The probe: the built-in module's training_step, after a look at the counters. */
static const lk_module_vtable *sh_base_vt;
static run_out *sh_probe_out;
static const run_spec *sh_probe_spec;
static lk_trainer *sh_fit_tr; /* the fit's trainer: dp's replicas k >= 1 run the step on scratch trainers of their own */
static inline lk_tensor *sh_probe_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    run_out *o = sh_probe_out;
    if (tr != sh_fit_tr) return sh_base_vt->training_step(m, b, i, tr); /* a dp replica, on its own thread */
    /* by call: a resumed or accumulating fit counts the calls it made */
    int64_t k = sh_probe_spec->probe_by_call ? o->steps_seen : lk_trainer_global_step(tr);
    if (k < MAX_STEPS) {
        o->misses[k] = lk_pool_get_stats().misses;
        o->at[k] = sealed_get_stats(), o->aat[k] = sealed_async_get_stats();
    }
    if (sh_probe_spec->probe_by_call || k < MAX_STEPS) o->steps_seen = k + 1;
    if (sh_probe_spec->step_hook) sh_probe_spec->step_hook(o, k, false);
    lk_tensor *loss = sh_base_vt->training_step(m, b, i, tr);
    if (sh_probe_spec->step_hook) sh_probe_spec->step_hook(o, k, true);
    return loss;
}

static inline double metric(lk_trainer *tr, const char *name) {
    double v = NAN;
    return lk_trainer_metric(tr, name, &v) ? v : NAN;
}

/* The trainer configuration every sealed test trains with. */
static inline void sh_config(lk_trainer_config *cfg, const run_spec *s) {
    CHECK_OK(lk_trainer_config_default(cfg));
    snprintf(cfg->accelerator, sizeof cfg->accelerator, "%s", s->accelerator);
    snprintf(cfg->strategy, sizeof cfg->strategy, "%s", s->strategy ? s->strategy : "single");
    snprintf(cfg->precision, sizeof cfg->precision, "%s", s->precision ? s->precision : "32-true");
    cfg->devices = s->devices ? s->devices : 1;
    cfg->max_steps = s->max_steps;
    cfg->max_epochs = s->max_epochs ? s->max_epochs : 5;
    if (s->limit.value > 0) cfg->limit_train_batches = s->limit;
    if (s->accum) cfg->accumulate_grad_batches = s->accum;
    cfg->enable_checkpointing = !s->no_checkpointing;
    cfg->enable_progress_bar = false;
    cfg->enable_tensorboard = false;
    cfg->enable_model_summary = false;
    cfg->num_sanity_val_steps = 0;
    cfg->log_every_n_steps = 1;
    cfg->seed = 3;
    cfg->gradient_clip_val = s->clip;
    snprintf(cfg->default_root_dir, sizeof cfg->default_root_dir, "%s", sh_root);
}

/* test_after: the first row of predictions.npy (the header's length at byte 8, the data after it). */
static inline void sh_read_prediction(lk_trainer *tr, float pred[4]) {
    char path[2200];
    snprintf(path, sizeof path, "%s/predictions.npy", lk_trainer_log_dir(tr));
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    size_t hl = got > 10 ? (size_t)(unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8 : 0;
    CHECK_MSG(got >= 10 + hl + 4 * sizeof(float), "%s: no predictions", path);
    if (got >= 10 + hl + 4 * sizeof(float)) memcpy(pred, buf + 10 + hl, 4 * sizeof(float));
}

/* Moving the trained module back to the host is one call; it then reads directly. */
static inline void sh_move_back(lk_module *m, const lk_named_tensors *ps, const float *params) {
    CHECK_OK(lk_layer_to(m->net, LK_DEVICE_CPU));
    int64_t k = 0;
    for (int i = 0; i < ps->n; i++) {
        lk_tensor *p = ps->items[i].tensor;
        CHECK(p->device.kind == LK_CPU && (!p->grad || p->grad->device.kind == LK_CPU));
        if (p->device.kind == LK_CPU)
            CHECK_MSG(!memcmp(params + k, p->data, (size_t)p->numel * sizeof(float)), "%s moved back differs",
                      ps->items[i].name);
        k += p->numel;
    }
}

static inline run_out sh_fit(run_spec s) {
    run_out o = {.loss = NAN, .val_loss = NAN, .val_acc = NAN, .test_loss = NAN, .test_acc = NAN};
    if (!sh_root[0]) setup(); /* a case run alone */
    lk_trainer_config cfg;
    sh_config(&cfg, &s);
    if (s.overflow) setenv("LK_TEST_GRAD_OVERFLOW", s.overflow, 1);
    bool cnn = !strcmp(s.model, "cnn"), ae = !strcmp(s.model, "autoencoder");
    const char *ns = s.num_samples ? s.num_samples : cnn ? "320" : "640";
    const lk_model_kv data[] = {{"num_samples", ns}, {"input_shape", cnn ? "[1, 8, 8]" : "[16]"}, {"num_classes", "4"},
                                {"batch_size", cnn ? "16" : "32"}, {"num_workers", s.workers ? s.workers : "0"}};
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin(s.model, cnn ? sh_cnn_args : ae ? sh_ae_args : s.no_dropout ? sh_mlp_nodrop_args : sh_mlp_args,
                                      ae ? 3 : 4, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data, 5, 3, &dm));
    lk_optim_settings os;
    CHECK_OK(lk_optim_settings_default(&os));
    if (s.optimizer) {
        snprintf(os.name, sizeof os.name, "%s", s.optimizer);
        if (!strcmp(s.optimizer, "sgd")) os.lr = 0.05, os.momentum = 0.9;
    }
    CHECK_OK(lk_trainer_create(&cfg, s.optimizer ? &os : NULL, NULL, &tr));
    unsetenv("LK_TEST_GRAD_OVERFLOW");
    static lk_module_vtable probe_vt;
    const lk_datamodule_vtable *dm_vt = dm ? dm->vt : NULL;
    if (m && dm && tr) {
        if (s.probe) {
            sh_base_vt = m->vt;
            probe_vt = *m->vt;
            probe_vt.training_step = sh_probe_step;
            m->vt = &probe_vt;
            sh_probe_out = &o;
            sh_probe_spec = &s;
        }
        sh_fit_tr = tr;
        if (s.module_hook) s.module_hook(m);
        if (s.datamodule_hook) s.datamodule_hook(dm);
        o.before = sealed_get_stats(), o.abefore = sealed_async_get_stats(), o.peer_before = sealed_get_peer_stats();
        lk_status st = lk_trainer_fit(tr, m, dm, s.resume);
        o.after = sealed_get_stats(), o.aafter = sealed_async_get_stats(), o.peer_after = sealed_get_peer_stats();
        snprintf(o.err, sizeof o.err, "%s", st ? lk_last_error() : "");
        CHECK_MSG(st == s.expect, "%s on %s: fit returned %d (%s), expected %d", s.model, s.accelerator, (int)st, o.err,
                  (int)s.expect);
        if (s.last) snprintf(s.last, 1024, "%s", lk_trainer_last_checkpoint(tr));
        o.loss = metric(tr, "train_loss");
        o.val_loss = metric(tr, "val_loss");
        if (s.accuracy) o.val_acc = metric(tr, "val_acc");
        if (s.test_after && !st) { /* the module stays on the device after fit: test and predict run there */
            long a0 = sealed_async_get_stats().copies_async;
            CHECK_OK(lk_trainer_test(tr, m, dm, NULL));
            o.test_loss = metric(tr, "test_loss");
            if (s.accuracy) o.test_acc = metric(tr, "test_acc");
            CHECK_OK(lk_trainer_predict(tr, m, dm, NULL));
            o.test_async = sealed_async_get_stats().copies_async - a0;
            sh_read_prediction(tr, o.pred);
        }
        if (s.move_back) CHECK(lk_device_equal(lk_device_default(), LK_DEVICE_CPU)); /* the run put the default back */
        lk_named_tensors ps = {0};
        CHECK_OK(lk_layer_named_parameters(m->net, &ps));
        for (int i = 0; i < ps.n; i++) o.n += ps.items[i].tensor->numel;
        o.param_bytes = o.n * (int64_t)sizeof(float);
        o.params = calloc((size_t)o.n + 1, sizeof(float));
        for (int64_t i = 0, k = 0; i < ps.n; k += ps.items[i].tensor->numel, i++) { /* one copy per parameter, wherever it lives */
            lk_tensor *h = lk_tensor_to(ps.items[i].tensor, LK_DEVICE_CPU);
            CHECK(h && h->dtype == LK_F32);
            if (h) memcpy(o.params + k, h->data, (size_t)h->numel * sizeof(float));
            lk_tensor_release(h);
        }
        if (s.move_back && strcmp(s.accelerator, "cpu") && lk_trainer_rank(tr) == 0) sh_move_back(m, &ps, o.params);
        lk_named_tensors_clear(&ps);
        if (s.probe) m->vt = sh_base_vt;
        dm->vt = dm_vt;
    }
    sh_probe_out = NULL;
    sh_probe_spec = NULL;
    sh_fit_tr = NULL;
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return o;
}

static inline bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Compares and frees both runs' parameters. A metric neither run logged is
 * NAN in both (the same bits), and steps_seen is 0 in both without a probe. */
static inline void same_bits(const char *what, run_out *a, run_out *b) {
    CHECK_MSG(a->params && b->params && a->n == b->n && a->n > 0, "%s: no parameters", what);
    if (a->params && b->params && a->n == b->n) {
        int64_t diff = 0;
        for (int64_t i = 0; i < a->n; i++) diff += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "%s: %lld of %lld parameters differ", what, (long long)diff, (long long)a->n);
    }
    CHECK_MSG(same_double(a->loss, b->loss) && !isnan(a->loss), "%s: train_loss %.9g vs %.9g", what, a->loss, b->loss);
    CHECK_MSG(same_double(a->val_loss, b->val_loss), "%s: val_loss %.9g vs %.9g", what, a->val_loss, b->val_loss);
    CHECK_MSG(same_double(a->val_acc, b->val_acc), "%s: val_acc %.9g vs %.9g", what, a->val_acc, b->val_acc);
    CHECK_MSG(same_double(a->test_loss, b->test_loss) && same_double(a->test_acc, b->test_acc),
              "%s: test_loss %.9g vs %.9g, test_acc %.9g vs %.9g", what, a->test_loss, b->test_loss, a->test_acc, b->test_acc);
    CHECK_MSG(!memcmp(a->pred, b->pred, sizeof a->pred), "%s: predictions %g vs %g", what, a->pred[0], b->pred[0]);
    CHECK_MSG(a->steps_seen == b->steps_seen, "%s: %lld vs %lld training steps", what, (long long)a->steps_seen,
              (long long)b->steps_seen);
    free(a->params);
    free(b->params);
    a->params = b->params = NULL;
}

/* The setup() of each test: the temp root named after the test and the process. */
static inline void sh_root_init(const char *name) { snprintf(sh_root, sizeof sh_root, "/tmp/lk_test_%s_%d", name, (int)getpid()); }

static void cleanup(void) {
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", sh_root);
    CHECK(system(rm) == 0);
}

#endif
