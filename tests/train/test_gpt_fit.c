/* gpt_fit: a tiny gpt trained through the library API (lk_trainer_fit, the
 * built-in module, a token file read by lk_dataset_tokens_create) with the
 * trainer features that compose with it. Activation checkpointing of the
 * Blocks ends with bitwise the weights of the run that keeps every
 * activation, with dropout on: single 32-true; bf16-mixed with gradient
 * accumulation and clipping; dp on 2 replicas. 16-mixed and bf16-true
 * train to a finite loss below the first one. */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"

static char token_path[256];

/* 6000 u16 tokens of vocab 32 in nanoGPT's raw format, with structure a
 * model can learn (a slowly drifting pattern). */
static void write_tokens(void) {
    snprintf(token_path, sizeof token_path, "/tmp/lk_test_gpt_fit_%d.bin", (int)getpid());
    FILE *f = fopen(token_path, "wb");
    CHECK(f != NULL);
    for (int i = 0; f && i < 6000; i++) {
        uint16_t t = (uint16_t)((i * 7 + i / 13) % 32);
        fwrite(&t, sizeof t, 1, f);
    }
    if (f) fclose(f);
}

typedef struct {
    lk_dataset *train, *val;
} token_dm;

static lk_status dm_setup(lk_datamodule *dm, const char *stage) {
    (void)dm, (void)stage;
    return LK_STATUS_OK;
}
static lk_dataset *dm_dataset(lk_datamodule *dm, const char *split) {
    token_dm *d = dm->self;
    return !strcmp(split, "train") ? d->train : d->val;
}
static void dm_destroy(lk_datamodule *dm) {
    token_dm *d = dm->self;
    lk_dataset_free(d->train);
    lk_dataset_free(d->val);
    lk_free(d);
}
static const lk_datamodule_vtable dm_vt = {.setup = dm_setup, .dataset = dm_dataset, .destroy = dm_destroy};

static lk_datamodule *token_datamodule(void) {
    lk_datamodule *dm = lk_calloc(1, sizeof *dm);
    token_dm *d = lk_calloc(1, sizeof *d);
    lk_tokens_config tc = lk_tokens_config_default();
    tc.seq_len = 16;
    tc.vocab_size = 32;
    CHECK_OK(lk_dataset_tokens_create(token_path, &tc, &d->train));
    tc.stride = 37; /* other windows for validation */
    CHECK_OK(lk_dataset_tokens_create(token_path, &tc, &d->val));
    *dm = (lk_datamodule){.name = "tokens", .vt = &dm_vt, .self = d, .batch_size = 4, .num_workers = 0};
    return dm;
}

static const lk_model_kv gpt_args[] = {{"n_layer", "2"},     {"n_head", "2"},      {"n_embd", "16"},
                                       {"block_size", "16"}, {"vocab_size", "32"}, {"dropout", "0.1"}};

typedef struct {
    const char *precision, *strategy;
    int devices, accumulate;
    double clip;
    bool checkpointing;
    const char *wd_params; /* optimizer.weight_decay_params (NULL: all) */
    int warmup;            /* optimizer.warmup_steps, with a per-step cosine */
} run_opts;

/* Fits 8 optimizer steps; the weights after it (f32 copies, state-dict
 * order) into *out, the first and last train_loss into loss[0], loss[1]. */
static void fit(const run_opts *o, lk_named_tensors *out, double loss[2]) {
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.max_steps = 8;
    cfg.max_epochs = 10;
    cfg.enable_progress_bar = !strcmp(o->precision, "bf16-true"); /* one run shows its lines: it/s and tok/s */
    cfg.enable_checkpointing = false;
    cfg.enable_tensorboard = false;
    cfg.num_sanity_val_steps = 0;
    cfg.log_every_n_steps = 1;
    cfg.limit_val_batches = (lk_count_or_fraction){.value = 2, .is_count = true};
    cfg.seed = 3;
    snprintf(cfg.precision, sizeof cfg.precision, "%s", o->precision);
    snprintf(cfg.strategy, sizeof cfg.strategy, "%s", o->strategy ? o->strategy : "auto");
    cfg.devices = o->devices ? o->devices : 1;
    cfg.accumulate_grad_batches = o->accumulate ? o->accumulate : 1;
    cfg.gradient_clip_val = o->clip;
    cfg.activation_checkpointing = o->checkpointing;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_gpt_fit_%d", (int)getpid());
    lk_optim_settings opt;
    CHECK_OK(lk_optim_settings_default(&opt));
    snprintf(opt.name, sizeof opt.name, "adamw");
    opt.lr = 3e-3;
    opt.weight_decay = 0.1;
    if (o->wd_params) snprintf(opt.weight_decay_params, sizeof opt.weight_decay_params, "%s", o->wd_params);
    if (o->warmup) {
        opt.warmup_steps = o->warmup;
        snprintf(opt.scheduler, sizeof opt.scheduler, "cosine");
        snprintf(opt.interval, sizeof opt.interval, "step");
    }
    lk_datamodule *dm = token_datamodule();
    lk_module *m = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin("gpt", gpt_args, 6, 3, &m));
    CHECK_OK(lk_trainer_create(&cfg, &opt, NULL, &tr));
    if (m && tr) {
        CHECK_MSG(lk_trainer_fit(tr, m, dm, NULL) == LK_STATUS_OK, "fit %s %s x%d: %s", o->precision,
                  o->strategy ? o->strategy : "auto", (int)cfg.devices, lk_last_error());
        CHECK(lk_trainer_metric(tr, "train_loss", &loss[1]));
        lk_named_tensors sd = {0};
        CHECK_OK(lk_state_dict_get(m->net, &sd));
        for (int i = 0; i < sd.n; i++) {
            lk_tensor *c = lk_tensor_cast(sd.items[i].tensor, LK_F32);
            CHECK_OK(lk_named_tensors_append(out, sd.items[i].name, c));
            lk_tensor_release(c);
        }
        lk_named_tensors_clear(&sd);
    }
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_gpt_fit_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

/* with and without checkpointing: the same bits */
static void same_bits(run_opts o, const char *what) {
    lk_named_tensors a = {0}, b = {0};
    double la[2] = {NAN, NAN}, lb[2] = {NAN, NAN};
    o.checkpointing = false;
    fit(&o, &a, la);
    o.checkpointing = true;
    fit(&o, &b, lb);
    CHECK_MSG(a.n > 0 && a.n == b.n, "%s: %d and %d tensors", what, a.n, b.n);
    int differ = 0;
    for (int i = 0; i < a.n && i < b.n; i++)
        if (a.items[i].tensor->numel != b.items[i].tensor->numel ||
            memcmp(a.items[i].tensor->data, b.items[i].tensor->data, (size_t)a.items[i].tensor->numel * 4)) {
            if (!differ++) fprintf(stderr, "  %s: %s differs\n", what, a.items[i].name);
        }
    CHECK_MSG(differ == 0, "%s: %d tensors differ with activation checkpointing", what, differ);
    CHECK_MSG(la[1] == lb[1] && isfinite(la[1]), "%s: train_loss %.9g vs %.9g", what, la[1], lb[1]);
    printf("%-40s train_loss %.6f, weights bitwise equal with checkpointing\n", what, la[1]);
    lk_named_tensors_clear(&a);
    lk_named_tensors_clear(&b);
}

static void checkpointing_single(void) { same_bits((run_opts){.precision = "32-true"}, "32-true single"); }
static void checkpointing_bf16_accumulate_clip(void) {
    same_bits((run_opts){.precision = "bf16-mixed", .accumulate = 2, .clip = 1.0}, "bf16-mixed accumulate 2 clip 1.0");
}
static void checkpointing_dp(void) {
    same_bits((run_opts){.precision = "32-true", .strategy = "dp", .devices = 2}, "32-true dp x2");
}

static void other_precisions(void) {
    const char *ps[] = {"16-mixed", "bf16-true"};
    for (int i = 0; i < 2; i++) {
        lk_named_tensors w = {0};
        double l[2] = {NAN, NAN};
        fit(&(run_opts){.precision = ps[i]}, &w, l);
        CHECK_MSG(isfinite(l[1]) && l[1] < log(32.0), "%s: train_loss %.6g (chance: %.4g)", ps[i], l[1], log(32.0));
        printf("%-40s train_loss %.6f\n", ps[i], l[1]);
        lk_named_tensors_clear(&w);
    }
}

/* nanoGPT's AdamW groups and its warm-up + cosine: train, and differ from
 * decaying everything; checkpointing still bitwise under them */
static void adamw_groups_warmup_cosine(void) {
    lk_named_tensors all = {0}, mat = {0}, noemb = {0};
    double l[2];
    fit(&(run_opts){.precision = "32-true", .warmup = 3}, &all, l);
    fit(&(run_opts){.precision = "32-true", .warmup = 3, .wd_params = "matrices"}, &mat, l);
    CHECK_MSG(isfinite(l[1]) && l[1] < log(32.0), "matrices: train_loss %.6g", l[1]);
    fit(&(run_opts){.precision = "32-true", .warmup = 3, .wd_params = "matrices_no_embeddings"}, &noemb, l);
    CHECK_MSG(isfinite(l[1]) && l[1] < log(32.0), "matrices_no_embeddings: train_loss %.6g", l[1]);
    /* a bias decays under all only; wte under all and matrices only */
    lk_tensor *b0 = lk_named_tensors_find(&all, "transformer.h.0.attn.c_attn.bias");
    lk_tensor *b1 = lk_named_tensors_find(&mat, "transformer.h.0.attn.c_attn.bias");
    lk_tensor *e1 = lk_named_tensors_find(&mat, "transformer.wte.weight");
    lk_tensor *e2 = lk_named_tensors_find(&noemb, "transformer.wte.weight");
    CHECK(b0 && b1 && memcmp(b0->data, b1->data, (size_t)b0->numel * 4));
    CHECK(e1 && e2 && memcmp(e1->data, e2->data, (size_t)e1->numel * 4));
    lk_named_tensors_clear(&all);
    lk_named_tensors_clear(&mat);
    lk_named_tensors_clear(&noemb);
    same_bits((run_opts){.precision = "32-true", .warmup = 3, .wd_params = "matrices"}, "32-true nanoGPT groups, warm-up");
}

static void setup(void) { write_tokens(); }
static void teardown(void) { unlink(token_path); }

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(checkpointing_single), LK_TEST_CASE(checkpointing_bf16_accumulate_clip),
             LK_TEST_CASE(checkpointing_dp), LK_TEST_CASE(other_precisions), LK_TEST_CASE(adamw_groups_warmup_cosine),
             LK_TEST_CASE(teardown))
