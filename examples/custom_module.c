/* examples/custom_module.c — a complete lockstep program: a custom dataset,
 * data module, network and module (Lightning's LightningModule and
 * LightningDataModule), trained with DDP on 2 processes.
 *
 * The task: points in a square, classed by the ring around the centre they
 * fall in. Build and run (after `make install`):
 *
 *     cc custom_module.c $(pkg-config --cflags --libs lockstep) -o custom_module
 *     ./custom_module [root_dir]
 *
 * ./custom_module starts its 2 ranks itself (trainer.h, "Starting the
 * ranks"): this process launches the job and waits; each rank runs main
 * from the top and trains. `lockstep launch -n 2 -- ./custom_module` or
 * mpirun start the ranks the other way round, with the same result. */
#include <stdio.h>
#include <string.h>

#include <lockstep.h>

enum { RINGS = 3, HIDDEN = 32 };

/* ---- the data: a dataset computed from (seed, index), so any rank can
 * make any sample and nothing is stored ----------------------------------- */

static lk_status ring_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    lk_rng rng; /* keyed by (seed, index): the same sample on every rank, every epoch */
    lk_rng_init(&rng, *(const uint64_t *)ctx, LK_RNG_USER, (uint32_t)index, (uint32_t)(index >> 32));
    float *x = out[0]; /* a point in [-3, 3)^2 ... */
    x[0] = 6.0f * lk_rng_uniform(&rng) - 3.0f;
    x[1] = 6.0f * lk_rng_uniform(&rng) - 3.0f;
    float r2 = x[0] * x[0] + x[1] * x[1]; /* ... labelled by its ring: radius < 1, < 2, beyond */
    *(int64_t *)out[1] = r2 < 1.0f ? 0 : r2 < 4.0f ? 1 : 2;
    return LK_STATUS_OK;
}

static lk_status ring_dataset(uint64_t *seed, int64_t len, lk_dataset **out) {
    static const lk_dataset_vtable vt = {.kind = "rings", .get = ring_get};
    const lk_field fields[2] = {{.name = "x", .dtype = LK_F32, .ndim = 1, .shape = {2}},
                                {.name = "y", .dtype = LK_I64, .ndim = 0}};
    return lk_dataset_create(&vt, seed, len, 2, fields, 0, out);
}

typedef struct {
    uint64_t train_seed, val_seed;
    lk_dataset *train, *val;
} rings_data;

/* The datasets are made here, once: nothing to download or split per
 * stage, so the data module needs no setup() (Lightning's is optional too). */
static rings_data *rings_data_create(void) {
    rings_data *d = lk_calloc(1, sizeof *d);
    if (!d) return NULL;
    *d = (rings_data){.train_seed = 1, .val_seed = 2};
    if (ring_dataset(&d->train_seed, 4096, &d->train) || ring_dataset(&d->val_seed, 1024, &d->val)) {
        lk_dataset_free(d->train);
        lk_free(d);
        return NULL;
    }
    return d;
}

static lk_dataset *rings_dataset(lk_datamodule *dm, const char *split) {
    rings_data *d = dm->self;
    return !strcmp(split, "train") ? d->train : !strcmp(split, "val") ? d->val : NULL; /* no test set */
}

static void rings_destroy(lk_datamodule *dm) {
    rings_data *d = dm->self;
    if (!d) return;
    lk_dataset_free(d->train);
    lk_dataset_free(d->val);
    lk_free(d);
}

static const lk_datamodule_vtable rings_vt = {.dataset = rings_dataset, .destroy = rings_destroy};

/* ---- the network: a layer of our own (a residual block) in a Sequential -- */

static lk_tensor *residual_forward(lk_layer *self, lk_tensor *x) { /* x + fc2(tanh(fc1(x))) */
    lk_tensor *h = lk_tanh(lk_layer_forward(lk_layer_child(self, 0), x));
    return lk_add(x, lk_layer_forward(lk_layer_child(self, 1), h));
}

static lk_layer *residual_create(int64_t width, lk_rng *rng) {
    lk_layer *l = lk_layer_create("Residual", residual_forward, NULL, NULL);
    if (!l || lk_layer_add_child(l, "fc1", lk_linear_create(width, width, true, rng)) ||
        lk_layer_add_child(l, "fc2", lk_linear_create(width, width, true, rng))) {
        lk_layer_free(l);
        return NULL;
    }
    return l;
}

/* ---- the module: the steps ---------------------------------------------- */

typedef struct {
    double first_loss, last_loss; /* this rank's, to show that it learned */
} rings_model;

static lk_tensor *training_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr) {
    lk_tensor *logits = lk_layer_forward(m->net, lk_batch_tensor(b, 0));
    lk_tensor *loss = lk_cross_entropy(logits, lk_batch_tensor(b, 1), NULL);
    if (!loss || lk_log_metric(tr, "train_loss", lk_tensor_item(loss), &(lk_log_opts){.prog_bar = true})) return NULL;
    rings_model *s = m->self;
    if (lk_trainer_global_step(tr) == 0) s->first_loss = lk_tensor_item(loss);
    s->last_loss = lk_tensor_item(loss);
    return loss;
}

static lk_status validation_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr) {
    lk_tensor *logits = lk_layer_forward(m->net, lk_batch_tensor(b, 0));
    lk_tensor *loss = lk_cross_entropy(logits, lk_batch_tensor(b, 1), NULL);
    if (!loss) return lk_last_status();
    /* sync_dist: the epoch value is the mean over every rank's shard */
    lk_log_opts o = {.prog_bar = true, .sync_dist = true};
    if (lk_log_metric(tr, "val_loss", lk_tensor_item(loss), &o)) return lk_last_status();
    return lk_log_accuracy(tr, "val_acc", logits, lk_batch_tensor(b, 1), &o); /* top-1 of logits [B, RINGS] */
}

static void destroy(lk_module *m) { lk_free(m->self); } /* lk_module_free frees the net and m */

static const lk_module_vtable rings_module_vt = {
    .training_step = training_step, .validation_step = validation_step, .destroy = destroy};

/* Lightning's configure_optimizers, as data: the trainer builds them. */
static void configure_optimizers(lk_optim_settings *o) {
    lk_optim_settings_default(o);
    snprintf(o->name, sizeof o->name, "adam");
    o->lr = 0.01;
    snprintf(o->scheduler, sizeof o->scheduler, "cosine");
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv) {
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.devices = 2;
    snprintf(cfg.strategy, sizeof cfg.strategy, "ddp");
    cfg.max_epochs = 4;
    cfg.seed = 7;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", argc > 1 ? argv[1] : ".");
    lk_optim_settings optim;
    configure_optimizers(&optim);

    /* The module and data module own what they are given (freed below). */
    lk_rng init;
    lk_rng_init(&init, (uint64_t)cfg.seed, LK_RNG_INIT, 0, 0); /* the same weights on every rank */
    lk_layer *layers[] = {lk_linear_create(2, HIDDEN, true, &init), residual_create(HIDDEN, &init),
                          residual_create(HIDDEN, &init), lk_linear_create(HIDDEN, RINGS, true, &init)};
    /* The constructors take what they are given, on failure too: no cleanup here. */
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_status st = lk_module_create("rings", &rings_module_vt, lk_sequential_create(4, layers),
                                    lk_calloc(1, sizeof(rings_model)), &m);
    if (!st) st = lk_datamodule_create("rings", &rings_vt, rings_data_create(), 64, &dm);
    if (!st && (!m->self || !dm->self)) st = lk_error(LK_STATUS_OUT_OF_MEMORY, "rings: out of memory");

    lk_trainer *tr = NULL;
    if (!st) st = lk_trainer_create(&cfg, &optim, NULL, &tr);
    /* Started alone, this process is the launcher: fit runs the whole job
     * (every rank runs this main) and returns its status. */
    if (!st) st = lk_trainer_fit(tr, m, dm, NULL);

    if (!st && !lk_trainer_is_launcher(tr)) {
        rings_model *s = m->self;
        printf("rank %d of %d: %lld steps, train_loss %.4f -> %.4f\n", lk_trainer_rank(tr), lk_trainer_world_size(tr),
               (long long)lk_trainer_global_step(tr), s->first_loss, s->last_loss);
        double acc;
        if (lk_trainer_rank(tr) == 0 && !(st = lk_trainer_get_metric(tr, "val_acc", &acc)))
            printf("val_acc %.3f; logs in %s\n", acc, lk_trainer_log_dir(tr));
    }
    if (st) fprintf(stderr, "custom_module: %s\n", lk_last_error());
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return st ? 1 : 0;
}
