/* Built-in modules and data modules: what the CLI's class_path names. The
 * modules wrap a registered model (src/models) with the steps and metrics
 * of its task; the data modules build Fashion-MNIST and synthetic splits. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data_internal.h"
#include "train/dm_files.h"
#include "train/train_impl.h"

/* ---- modules -------------------------------------------------------------------- */

#define PREVIEW 8 /* images in reconstructions.png */

typedef struct {
    const lk_model_info *info;
    lk_model_kv args[64]; /* copies, for replicate() */
    int n_args;
    uint64_t seed;
    float preview_x[PREVIEW * 784], preview_r[PREVIEW * 784];
    int preview_n;
} model_self;

/* The module contract's two halves: the network on the batch's input, and
 * the model's loss against the batch's targets (its input for an
 * autoencoder, its labels otherwise). */
static lk_tensor *builtin_forward(lk_module *m, const lk_batch *b) {
    return lk_layer_forward(m->net, lk_batch_tensor(b, 0));
}

/* The targets the loss compares with: the batch's field on the run's device. */
static lk_tensor *builtin_target(lk_module *m, const lk_batch *b) {
    model_self *s = m->self;
    return lk_batch_tensor(b, s->info->target_is_input ? 0 : 1);
}

static lk_tensor *builtin_loss(lk_module *m, lk_tensor *out, const lk_batch *b) {
    model_self *s = m->self;
    lk_tensor *x = lk_batch_tensor(b, 0);
    lk_tensor *y = s->info->target_is_input ? x : lk_batch_tensor(b, 1);
    return lk_model_loss(s->info, out, x, y); /* the model info's loss_fn, after the targets' checks */
}

/* The loss of batch b; the model's output and the targets into *out_logits
 * and *out_target when given. */
static lk_tensor *model_loss(lk_module *m, const lk_batch *b, lk_tensor **out_logits, lk_tensor **out_target) {
    lk_tensor *out = lk_module_forward(m, b);
    if (out_logits) *out_logits = out;
    if (out_target) *out_target = builtin_target(m, b);
    return lk_module_loss(m, out, b);
}

/* The default composition (module_steps.c), kept as this module's own slot:
 * code that wraps a module's training_step (the tests' probes) calls it. */
static lk_tensor *builtin_training_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    lk_tensor *loss = model_loss(m, b, NULL, NULL);
    if (loss && lk__log_loss(tr, "train_loss", loss, &(lk_log_opts){.prog_bar = true})) return NULL;
    return loss;
}

static lk_status eval_step(lk_module *m, const lk_batch *b, lk_trainer *tr, const char *prefix) {
    model_self *s = m->self;
    lk_tensor *out = NULL, *y = NULL;
    lk_tensor *loss = model_loss(m, b, &out, &y);
    if (!loss) return lk_last_status();
    char name[64];
    snprintf(name, sizeof name, "%s_loss", prefix);
    /* on a device the loss stays there until the loop's end (one read per
     * loop, not per batch); on the host it is logged now */
    LK_TRY(lk__log_tensor(tr, name, loss, &(lk_log_opts){.prog_bar = true, .sync_dist = true}));
    if (!s->info->target_is_input && out && out->ndim == 2) {
        snprintf(name, sizeof name, "%s_acc", prefix);
        /* The rows' hits counted by LK_OP_ACCURACY against the targets the
         * loss used, where they are: on a device kept there and read with
         * the loss at the loop's end, on the host logged now. */
        LK_TRY(lk__log_accuracy(tr, name, out, y, &(lk_log_opts){.prog_bar = true, .sync_dist = true}));
    }
    /* Keep the first test images and their reconstructions for the picture. */
    if (s->info->target_is_input && s->preview_n == 0 && out && out->numel / (out->shape[0] ? out->shape[0] : 1) == 784) {
        int n = (int)(b->size < PREVIEW ? b->size : PREVIEW);
        /* the inputs from the loader's (host) batch; the reconstructions in
         * one copy from wherever they are (a memcpy on the CPU) */
        memcpy(s->preview_x, b->field[0].data, (size_t)n * 784 * sizeof(float));
        lk_tensor *oc = lk_tensor_cast(out, LK_F32);
        if (oc) lk_device_copy(LK_DEVICE_CPU, s->preview_r, oc->device, oc->data, (size_t)n * 784 * sizeof(float));
        lk_tensor_release(oc);
        s->preview_n = n;
    }
    return LK_STATUS_OK;
}

static lk_status builtin_validation_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    model_self *s = m->self;
    if (i == 0) s->preview_n = 0; /* the picture shows the latest validation */
    return eval_step(m, b, tr, "val");
}

static lk_status builtin_test_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    model_self *s = m->self;
    if (i == 0) s->preview_n = 0;
    return eval_step(m, b, tr, "test");
}

static lk_tensor *builtin_predict_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    return lk_module_forward(m, b); /* (a pipeline's stages may have run it: eval.c's replay) */
}

static lk_status builtin_on_stage_end(lk_module *m, lk_trainer *tr, const char *stage) {
    model_self *s = m->self;
    if (!s->info->target_is_input || s->preview_n == 0 || !lk_trainer_log_dir(tr)[0]) return LK_STATUS_OK;
    /* Undo the data module's normalisation only if it was applied: the
     * pictures show [0, 1] pixels; values outside are clamped. */
    char path[LK_PATH + 32];
    snprintf(path, sizeof path, "%s/reconstructions.png", lk_trainer_log_dir(tr));
    return lk_image_recon_png_labeled(path, s->preview_x, s->preview_r, s->preview_n, 28, 28, 3);
}

static void builtin_destroy(lk_module *m) {
    model_self *s = m->self;
    for (int i = 0; s && i < s->n_args; i++) {
        lk_free((char *)s->args[i].key);
        lk_free((char *)s->args[i].value);
    }
    lk_free(s);
}

static lk_status builtin_replicate(lk_module *m, lk_module **out) {
    model_self *s = m->self;
    return lk_module_create_builtin(s->info->name, s->args, s->n_args, s->seed, out);
}
/* The module's setup slot: a built-in model and data module whose samples do
 * not fit (mlp input_dim 1024 fed 28x28 images) is an error naming both
 * sides' settings once the data is set up, not a matmul shape error at the
 * first step. Another data module passes. (Defined with the data modules.) */
static lk_status builtin_setup(lk_module *m, lk_datamodule *dm, const char *stage);
static const lk_module_vtable builtin_vt_owned = {
    .training_step = builtin_training_step,
    .validation_step = builtin_validation_step,
    .test_step = builtin_test_step,
    .predict_step = builtin_predict_step,
    .on_stage_end = builtin_on_stage_end,
    .destroy = builtin_destroy,
    .replicate = builtin_replicate,
    .forward = builtin_forward,
    .loss = builtin_loss,
    .setup = builtin_setup,
};

/* Its steps take the net's output through lk_module_forward alone: a
 * pipeline may hand them an output its stages computed (eval.c). */
bool lk__module_forward_only_via_module(const lk_module *m) { return m && m->vt == &builtin_vt_owned; }


static char *kv_yaml(const char *section, const char *name, const lk_model_kv *args, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    /* save_hyperparameters() as Lightning writes hparams.yaml: the init args
     * as flat keys, the class under _class_path as LightningCLI records it
     * (the section is implied: the trainer merges model and data keys) */
    (void)section;
    fprintf(f, "_class_path: %s\n", name);
    for (int i = 0; i < n; i++) {
        int len = (int)strlen(args[i].value);
        while (len > 0 && args[i].value[len - 1] == ' ') len--; /* "[32] " as the flattened list reads */
        fprintf(f, "%s: %.*s\n", args[i].key, len, args[i].value);
    }
    fclose(f);
    char *out = lk_strdup(buf);
    free(buf);
    return out;
}

static lk_status create_builtin(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, bool deferred,
                                lk_module **out) {
    *out = NULL;
    const lk_model_info *info = lk_model_find(name);
    if (!info) {
        int n;
        const lk_model_info *all = lk_models(&n);
        char list[512] = "";
        const char *names[64];
        for (int i = 0; i < n && i < 64; i++) {
            names[i] = all[i].name;
            strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, all[i].name, sizeof list - strlen(list) - 1);
        }
        const char *s = lk_suggest(name, names, n < 64 ? n : 64);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown model class_path '%s'%s%s%s; registered models: %s", name,
                        s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", list);
    }
    lk_layer *net;
    LK_TRY((deferred ? lk_model_create_deferred : lk_model_create)(name, args, n_args, seed, &net));
    lk_module *m = lk_calloc(1, sizeof *m);
    model_self *s = lk_calloc(1, sizeof *s);
    if (!m || !s) {
        lk_free(m);
        lk_free(s);
        lk_layer_free(net);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    s->info = info;
    s->seed = seed;
    for (int i = 0; i < n_args && i < 64; i++) {
        s->args[i].key = lk_strdup(args[i].key);
        s->args[i].value = lk_strdup(args[i].value);
        s->n_args = i + 1;
    }
    m->name = info->name;
    m->vt = &builtin_vt_owned;
    m->net = net;
    m->self = s;
    m->hparams_yaml = kv_yaml("model", name, args, n_args);
    *out = m;
    return LK_STATUS_OK;
}

lk_status lk_module_create_builtin(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                   lk_module **out) {
    return create_builtin(name, args, n_args, seed, false, out);
}

lk_status lk_module_create_builtin_deferred(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                            lk_module **out) {
    return create_builtin(name, args, n_args, seed, true, out);
}

/* ---- data modules ------------------------------------------------------------------ */

typedef struct {
    char root[LK_PARAM_STR];
    int64_t batch_size, num_workers, val_size;
    bool flatten, normalize;
    int64_t random_crop_padding; /* augmentation of the training split (fashion_mnist) */
    double random_hflip;
    /* synthetic */
    char task[LK_PARAM_STR];
    int64_t num_samples, num_classes, seed;
    lk_int_list input_shape;
} dm_args;

#define D(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(dm_args, field), def, lo, hi, choices, help}

static const lk_param fmnist_params[] = {
    D("root", STRING, root, "", 1, 0, NULL,
      "directory with the four Fashion-MNIST .gz files (empty: $LK_DATA_ROOT or /usr/share/datasets/fashion-mnist)"),
    D("batch_size", INT, batch_size, "256", 1, 1e7, NULL, "samples per batch on each rank"),
    D("num_workers", INT, num_workers, "2", 0, 256, NULL, "loader threads per rank (0: load inline)"),
    D("val_size", INT, val_size, "5000", 0, 59999, NULL, "validation samples carved from the 60,000 training images"),
    D("flatten", BOOL, flatten, "true", 1, 0, NULL, "images as [784] vectors (false: [1, 28, 28])"),
    D("normalize", BOOL, normalize, "false", 1, 0, NULL, "standardise with the training set's mean 0.2860 and std 0.3530"),
    D("random_crop_padding", INT, random_crop_padding, "0", 0, 14, NULL, LK__DM_CROP_HELP),
    D("random_hflip", FLOAT, random_hflip, "0", 0, 1, NULL, LK__DM_FLIP_HELP),
};

static const lk_param synth_params[] = {
    D("task", ENUM, task, "classification", 1, 0, "classification|regression|tokens",
      "what the targets are (tokens: i64 token ids x [T] = input_shape, vocab num_classes, y the next tokens)"),
    D("num_samples", INT, num_samples, "4096", 3, 1e10, NULL, "samples (split 80/10/10 into train/val/test)"),
    D("input_shape", INTS, input_shape, "[32]", 1, 1e7, NULL, "per-sample input shape"),
    D("num_classes", INT, num_classes, "4", 2, 1e6, NULL, "classes (classification) or outputs (regression)"),
    D("seed", INT, seed, "0", 0, 4294967295.0, NULL, "seed of the generated data"),
    D("batch_size", INT, batch_size, "64", 1, 1e7, NULL, "samples per batch on each rank"),
    D("num_workers", INT, num_workers, "0", 0, 256, NULL, "loader threads per rank"),
};

static const lk_datamodule_info datamodules[] = {
    {"fashion_mnist", "Fashion-MNIST from the Debian package dataset-fashion-mnist", fmnist_params,
     (int)(sizeof fmnist_params / sizeof fmnist_params[0])},
    {"synthetic", "generated classification or regression data (Philox, from a seed)", synth_params,
     (int)(sizeof synth_params / sizeof synth_params[0])},
    {"npy", "your .npy arrays: inputs x [N, ...] and targets y", lk__dm_npy_params, LK__DM_NPY_NPARAMS},
    {"csv", "your numeric CSV: a label column by name or index, the others features", lk__dm_csv_params,
     LK__DM_CSV_NPARAMS},
    {"image_folder", "your images: root/<class_name>/*.png|jpg, as torchvision's ImageFolder", lk__dm_images_params,
     LK__DM_IMAGES_NPARAMS},
    {"tokens", LK__DM_TOKENS_HELP, lk__dm_tokens_params, LK__DM_TOKENS_NPARAMS}, /* dm_tokens.c */
};

const lk_datamodule_info *lk_datamodules(int *count) {
    *count = (int)(sizeof datamodules / sizeof datamodules[0]);
    return datamodules;
}

static const lk_datamodule_vtable dm_vt;

typedef struct {
    dm_args a;
    int kind; /* 0 fashion_mnist, 1 synthetic */
    uint64_t seed;
    lk_dataset *train, *val, *test;
    char data_dir[LK_PATH]; /* fashion_mnist: the directory the files came from, once set up */
    const char *data_from;  /* and the setting that named it: data.init_args.root, LK_DATA_ROOT or default */
} dm_self;

/* Fashion-MNIST's u8 [28, 28] images and u8 labels as the models take
 * them: f32 pixels in [0, 1] (standardised when asked), flat or
 * [1, 28, 28], and i64 labels. Each split is converted after the training
 * file is cut and its training part augmented, so the crop's padding is
 * black, as torchvision's transforms act on the image before ToTensor. */
static lk_status fmnist_convert(dm_self *s, lk_dataset *raw, lk_dataset **out) {
    lk_dataset *mapped = NULL;
    lk_transform *t = NULL;
    lk_status st = lk_transform_create(&t);
    if (!st) st = lk_transform_cast(t, LK_F32);
    if (!st) st = lk_transform_scale(t, 1.0f / 255.0f, 0.0f);
    if (!st && s->a.normalize) st = lk_transform_normalize(t, 1, (float[]){0.2860f}, (float[]){0.3530f});
    if (!st) st = s->a.flatten ? lk_transform_reshape(t, 1, (int64_t[]){784}) : lk_transform_reshape(t, 3, (int64_t[]){1, 28, 28});
    if (!st) st = lk_dataset_map(raw, 0, t, s->seed, &mapped);
    lk_transform_free(t);
    lk_transform *ty = NULL;
    if (!st) st = lk_transform_create(&ty);
    if (!st) st = lk_transform_cast(ty, LK_I64);
    if (!st) st = lk_dataset_map(mapped, 1, ty, s->seed, out);
    lk_transform_free(ty);
    lk_dataset_free(mapped);
    return st;
}

/* One file's images (lk_dataset_mnist_create refuses an idx header of
 * another geometry than 28x28, naming the file). */
static lk_status fmnist_raw(dm_self *s, const char *split, lk_dataset **out) {
    return lk__dataset_mnist_create_from(s->a.root, split, out, s->data_dir, sizeof s->data_dir, &s->data_from);
}

/* synthetic task tokens (for token models, `bench train --model gpt`): one
 * stream of uniform token ids in [0, num_classes) from (seed, LK_RNG_DATA);
 * sample i is x = stream[i*T, (i+1)*T) and y the same window one token on,
 * as a token file's windows; split 80/10/10 like the other tasks. */
static lk_status synth_tokens(dm_self *s) {
    int64_t T = s->a.input_shape.v[0], n = s->a.num_samples;
    for (int i = 1; i < s->a.input_shape.n; i++) T *= s->a.input_shape.v[i];
    lk_array a[2] = {{0}, {0}};
    LK_TRY(lk_array_alloc(&a[0], LK_I64, 2, (int64_t[]){n, T}));
    lk_status st = lk_array_alloc(&a[1], LK_I64, 2, (int64_t[]){n, T});
    if (st) {
        lk_array_release(&a[0]);
        return st;
    }
    lk_rng rng;
    lk_rng_init(&rng, (uint64_t)s->a.seed, LK_RNG_DATA, 0, 0);
    int64_t *x = a[0].data, *y = a[1].data, prev = lk_rng_below(&rng, (uint32_t)s->a.num_classes);
    for (int64_t k = 0; k < n * T; k++) {
        int64_t next = lk_rng_below(&rng, (uint32_t)s->a.num_classes);
        x[k] = prev;
        y[k] = next;
        prev = next;
    }
    lk_dataset *full = NULL, *parts[3] = {NULL, NULL, NULL};
    st = lk_dataset_from_arrays(2, a, NULL, false, &full);
    if (st) {
        lk_array_release(&a[0]);
        lk_array_release(&a[1]);
        return st;
    }
    st = lk_dataset_random_split(full, 3, (double[]){0.8, 0.1, 0.1}, s->seed, parts);
    lk_dataset_free(full);
    LK_TRY(st);
    s->train = parts[0];
    s->val = parts[1];
    s->test = parts[2];
    return LK_STATUS_OK;
}

static lk_status dm_setup(lk_datamodule *dm, const char *stage) {
    dm_self *s = dm->self;
    if (s->train || s->test) return LK_STATUS_OK; /* once */
    if (s->kind == 0) {
        lk_dataset *raw = NULL, *parts[2] = {NULL, NULL};
        LK_TRY(fmnist_raw(s, "train", &raw));
        double sizes[2] = {(double)(lk_dataset_len(raw) - s->a.val_size), (double)s->a.val_size};
        lk_status st = s->a.val_size > 0 ? lk_dataset_random_split(raw, 2, sizes, s->seed, parts) : LK_STATUS_OK;
        if (s->a.val_size == 0) parts[0] = lk_dataset_retain(raw);
        lk_dataset_free(raw);
        if (!st) st = lk__dm_augment(&parts[0], s->a.random_crop_padding, s->a.random_hflip, s->seed);
        if (!st) st = fmnist_convert(s, parts[0], &s->train);
        if (!st && parts[1]) st = fmnist_convert(s, parts[1], &s->val);
        lk_dataset_free(parts[0]);
        lk_dataset_free(parts[1]);
        if (!st) st = fmnist_raw(s, "test", &raw);
        if (!st) st = fmnist_convert(s, raw, &s->test);
        lk_dataset_free(raw);
        return st;
    }
    if (!strcmp(s->a.task, "tokens")) return synth_tokens(s);
    lk_synthetic_config sc = lk_synthetic_config_default();
    sc.kind = !strcmp(s->a.task, "regression") ? LK_SYNTH_REGRESSION : LK_SYNTH_CLASSIFICATION;
    sc.len = s->a.num_samples;
    sc.dim = s->a.input_shape.n ? s->a.input_shape.v[0] : 32;
    for (int i = 1; i < s->a.input_shape.n; i++) sc.dim *= s->a.input_shape.v[i];
    sc.classes = s->a.num_classes;
    sc.out_dim = s->a.num_classes;
    sc.seed = (uint64_t)s->a.seed;
    lk_dataset *full = NULL, *parts[3] = {NULL, NULL, NULL};
    LK_TRY(lk_dataset_synthetic_create(&sc, &full));
    /* Generated samples are computed on demand from (seed, index), which
     * costs more than a small model's step: draw them once into memory. */
    lk_dataset *mem = NULL;
    lk_status st = lk_dataset_materialize(full, lk_get_num_threads(), &mem);
    lk_dataset_free(full);
    full = mem;
    if (s->a.input_shape.n > 1) { /* [C, H, W] inputs for convolutional models */
        lk_transform *t = NULL;
        lk_dataset *shaped = NULL;
        st = lk_transform_create(&t);
        if (!st) st = lk_transform_reshape(t, s->a.input_shape.n, s->a.input_shape.v);
        if (!st) st = lk_dataset_map(full, 0, t, s->seed, &shaped);
        lk_transform_free(t);
        lk_dataset_free(full);
        full = shaped;
    }
    if (!st) st = lk_dataset_random_split(full, 3, (double[]){0.8, 0.1, 0.1}, s->seed, parts);
    lk_dataset_free(full);
    LK_TRY(st);
    s->train = parts[0];
    s->val = parts[1];
    s->test = parts[2];
    return LK_STATUS_OK;
}

bool lk__builtin_data_root(const lk_datamodule *dm, const char **dir, const char **from) {
    if (!dm || dm->vt != &dm_vt) return false;
    const dm_self *s = dm->self;
    if (s->kind != 0 || !s->data_from) return false;
    *dir = s->data_dir;
    *from = s->data_from;
    return true;
}

static lk_dataset *dm_dataset(lk_datamodule *dm, const char *split) {
    dm_self *s = dm->self;
    if (!strcmp(split, "train")) return s->train;
    if (!strcmp(split, "val")) return s->val;
    if (!strcmp(split, "test") || !strcmp(split, "predict")) return s->test;
    return NULL;
}

static void dm_destroy(lk_datamodule *dm) {
    dm_self *s = dm->self;
    if (!s) return;
    lk_dataset_free(s->train);
    lk_dataset_free(s->val);
    lk_dataset_free(s->test);
    lk_free(s);
}

static const lk_datamodule_vtable dm_vt = {
    .prepare_data = NULL, .setup = dm_setup, .dataset = dm_dataset, .destroy = dm_destroy};

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
}

static lk_status builtin_setup(lk_module *m, lk_datamodule *dm, const char *stage) {
    if (m && m->vt == &builtin_vt_owned && lk__dm_is_tokens(dm)) /* vocab_size, block_size: dm_tokens.c */
        return lk__dm_tokens_check_model(((const model_self *)m->self)->info, ((const model_self *)m->self)->args,
                                         ((const model_self *)m->self)->n_args, dm);
    if (!m || !dm || m->vt != &builtin_vt_owned || dm->vt != &dm_vt) return LK_STATUS_OK;
    const model_self *ms = m->self;
    const dm_self *ds = dm->self;
    const char *split = !strcmp(stage, "fit") ? "train" : !strcmp(stage, "validate") ? "val" : stage;
    lk_dataset *d = dm_dataset(dm, split);
    const lk_field *x = d ? lk_dataset_field(d, 0) : NULL;
    if (!x) return LK_STATUS_OK;
    int ndim;
    int64_t want[3], n = 1, wn = 1;
    char why[128];
    LK_TRY(lk_model_input_shape(ms->info->name, ms->args, ms->n_args, &ndim, want, why, sizeof why));
    if (ndim == 0) return LK_STATUS_OK; /* a model that does not declare its input */
    for (int i = 0; i < x->ndim; i++) n *= x->shape[i];
    for (int i = 0; i < ndim; i++) wn *= want[i];
    /* mlp and autoencoder flatten any sample; cnn takes [C, H, W] or one flat row */
    bool fits = n == wn && (ndim == 1 || x->ndim == 1 || x->ndim == ndim);
    if (ms->info->tokens) { /* token ids: a sequence of at most the model's length */
        if (x->ndim == 1 && n <= wn) return LK_STATUS_OK;
        char gs[96];
        shape_str(x->ndim, x->shape, gs, sizeof gs);
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model %s takes token sequences [T] with T <= %lld (%s), but data %s gives samples of %s",
                        ms->info->name, (long long)wn, why, dm->name, gs);
    }
    for (int i = 0; fits && ndim == 3 && x->ndim == 3 && i < 3; i++) fits = x->shape[i] == want[i];
    if (fits) return LK_STATUS_OK;
    char ws[96], gs[96], src[LK_PARAM_STR + 96], hint[160] = "";
    shape_str(ndim, want, ws, sizeof ws);
    shape_str(x->ndim, x->shape, gs, sizeof gs);
    if (ds->kind == 0)
        snprintf(src, sizeof src, "28x28 images, flatten %s", ds->a.flatten ? "true" : "false");
    else {
        char is[96];
        shape_str(ds->a.input_shape.n, ds->a.input_shape.v, is, sizeof is);
        snprintf(src, sizeof src, "input_shape %s", is);
    }
    if (ndim == 1) snprintf(hint, sizeof hint, " (model.init_args.input_dim: %lld fits the data)", (long long)n);
    else if (x->ndim == 3 && x->shape[1] == x->shape[2] && x->shape[1] % 4 == 0)
        snprintf(hint, sizeof hint, " (model.init_args in_channels: %lld and image_size: %lld fit the data)",
                 (long long)x->shape[0], (long long)x->shape[1]);
    return lk_error(LK_STATUS_INVALID_ARGUMENT,
                    "model %s expects samples of %s (%s), but data %s gives %s (%s)%s", ms->info->name, ws, why,
                    dm->name, gs, src, hint);
}

lk_status lk_datamodule_create_builtin(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                       lk_datamodule **out) {
    *out = NULL;
    if (lk__dm_files_has(name)) return lk__dm_files_create(name, args, n_args, seed, out); /* the user's files */
    if (!strcmp(name, "image_folder")) return lk__dm_images_create(args, n_args, seed, out);
    int n, kind = -1;
    const lk_datamodule_info *all = lk_datamodules(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(all[i].name, name)) kind = i;
    if (kind < 0) {
        const char *names[16];
        char list[256] = ""; /* the table's names: a row added there is listed here */
        for (int i = 0; i < n && i < 16; i++) {
            names[i] = all[i].name;
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", all[i].name);
        }
        const char *s = lk_suggest(name, names, n < 16 ? n : 16);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown data class_path '%s'%s%s%s; registered data modules: %s",
                        name, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", list);
    }
    if (!strcmp(name, "tokens")) return lk__dm_tokens_create(args, n_args, seed, out); /* dm_tokens.c */
    dm_self *s = lk_calloc(1, sizeof *s);
    lk_datamodule *dm = lk_calloc(1, sizeof *dm);
    if (!s || !dm) {
        lk_free(s);
        lk_free(dm);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    dm->self = s;
    dm->vt = &dm_vt;
    dm->name = all[kind].name;
    s->kind = kind;
    s->seed = seed;
    lk_status st = lk_params_defaults(all[kind].params, all[kind].n_params, &s->a);
    for (int i = 0; !st && i < n_args; i++)
        st = lk_params_set(all[kind].params, all[kind].n_params, &s->a, "data.init_args", args[i].key, args[i].value);
    if (st) {
        lk_datamodule_free(dm);
        return st;
    }
    dm->batch_size = s->a.batch_size;
    dm->num_workers = (int)s->a.num_workers;
    dm->hparams_yaml = kv_yaml("data", name, args, n_args);
    *out = dm;
    return LK_STATUS_OK;
}
