/* Data modules for a user's own files, by class_path from the CLI:
 *   npy: inputs and targets as .npy arrays (x [N, ...], y [N] or [N, ...])
 *   csv: a numeric CSV, one sample per line; the label column by name or
 *        index, every other column a feature
 * each with train/val/test/predict splits: separate files, or val_split
 * carved from the training file (a seeded random split, as
 * random_split does). Inputs become f32 (times `scale` for npy); integer
 * targets become i64 class indices, float targets stay (regression).
 * predict runs on predict_x / predict_path, else the test file, else the
 * training file itself, in file order, so predictions.npy lines up with
 * the user's rows. Files are read in setup; every error names the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/data.h"
#include "lockstep/trainer.h"
#include "train/dm_files.h"

typedef struct {
    char x[LK_PARAM_STR], y[LK_PARAM_STR], val_x[LK_PARAM_STR], val_y[LK_PARAM_STR], test_x[LK_PARAM_STR],
        test_y[LK_PARAM_STR], predict_x[LK_PARAM_STR];
    char label[LK_PARAM_STR], task[LK_PARAM_STR];
    double val_split, scale;
    int64_t batch_size, num_workers, num_classes;
    int64_t random_crop_padding; /* npy: augmentation of the training inputs */
    double random_hflip;
} files_args;

#define F(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(files_args, field), def, lo, hi, choices, help}

const lk_param lk__dm_npy_params[LK__DM_NPY_NPARAMS] = {
    F("x", STRING, x, "", 1, 0, NULL, "training inputs, a .npy array [N, ...] (required)"),
    F("y", STRING, y, "", 1, 0, NULL, "training targets, a .npy array [N] (integers: classes) or [N, ...] (floats)"),
    F("val_x", STRING, val_x, "", 1, 0, NULL, "validation inputs (empty: val_split of x)"),
    F("val_y", STRING, val_y, "", 1, 0, NULL, "validation targets (with val_x)"),
    F("test_x", STRING, test_x, "", 1, 0, NULL, "test inputs (empty: no test set)"),
    F("test_y", STRING, test_y, "", 1, 0, NULL, "test targets (with test_x)"),
    F("predict_x", STRING, predict_x, "", 1, 0, NULL,
      "inputs to predict, in order (empty: test_x, else x; predictions.npy follows their order)"),
    F("val_split", FLOAT, val_split, "0.1", 0, 0.99, NULL, "fraction of x/y held out for validation when val_x is empty"),
    F("scale", FLOAT, scale, "1", 0, 1e30, NULL, "inputs are multiplied by this (e.g. 0.00392156862745098 for 0-255 pixels)"),
    F("batch_size", INT, batch_size, "32", 1, 1e7, NULL, "samples per batch on each rank"),
    F("num_workers", INT, num_workers, "0", 0, 256, NULL, "loader threads per rank"),
    F("random_crop_padding", INT, random_crop_padding, "0", 0, 1 << 20, NULL,
      "training inputs [N, ..., H, W] only: pad by this many zeros (after scale), then crop a random H x W window "
      "(torchvision's RandomCrop(size, padding)); 0: off"),
    F("random_hflip", FLOAT, random_hflip, "0", 0, 1, NULL, LK__DM_FLIP_HELP),
};

const lk_param lk__dm_csv_params[LK__DM_CSV_NPARAMS] = {
    F("path", STRING, x, "", 1, 0, NULL, "training CSV, one sample per line, a header optional (required)"),
    F("label", STRING, label, "", 1, 0, NULL,
      "the label column: its header name or 0-based index (empty: the last column); the other columns are features"),
    F("val_path", STRING, val_x, "", 1, 0, NULL, "validation CSV (empty: val_split of path)"),
    F("test_path", STRING, test_x, "", 1, 0, NULL, "test CSV (empty: no test set)"),
    F("predict_path", STRING, predict_x, "", 1, 0, NULL,
      "CSV to predict, in order (empty: test_path, else path), with the same columns"),
    F("val_split", FLOAT, val_split, "0.1", 0, 0.99, NULL, "fraction of path held out for validation when val_path is empty"),
    F("task", ENUM, task, "classification", 1, 0, "classification|regression",
      "classification: labels are class indices 0..num_classes-1; regression: float targets"),
    F("num_classes", INT, num_classes, "0", 0, 1e9, NULL, "classification: labels must be below this (0: unchecked)"),
    F("batch_size", INT, batch_size, "32", 1, 1e7, NULL, "samples per batch on each rank"),
    F("num_workers", INT, num_workers, "0", 0, 256, NULL, "loader threads per rank"),
    F("scale", FLOAT, scale, "1", 0, 1e30, NULL, "features are multiplied by this"),
};

_Static_assert(sizeof lk__dm_npy_params / sizeof lk__dm_npy_params[0] == LK__DM_NPY_NPARAMS, "npy table");
_Static_assert(sizeof lk__dm_csv_params / sizeof lk__dm_csv_params[0] == LK__DM_CSV_NPARAMS, "csv table");

typedef struct {
    files_args a;
    bool csv;
    uint64_t seed;
    lk__dm_splits sp;
} files_self;

bool lk__dm_files_has(const char *name) { return name && (!strcmp(name, "npy") || !strcmp(name, "csv")); }

/* Field `f` of src cast to `dt` (and scaled when mul != 1); src is released. */
static lk_status cast_field(lk_dataset **ds, int f, lk_dtype dt, double mul, uint64_t seed) {
    const lk_field *fl = lk_dataset_field(*ds, f);
    if (!fl || (fl->dtype == dt && mul == 1)) return LK_STATUS_OK;
    lk_transform *t = NULL;
    lk_dataset *out = NULL;
    lk_status st = lk_transform_create(&t);
    if (!st) st = lk_transform_cast(t, dt);
    if (!st && mul != 1) st = lk_transform_scale(t, (float)mul, 0.0f);
    if (!st) st = lk_dataset_map(*ds, f, t, seed, &out);
    lk_transform_free(t);
    if (st) return st;
    lk_dataset_free(*ds);
    *ds = out;
    return LK_STATUS_OK;
}

/* One split's dataset from its files (y may be empty: inputs only). */
static lk_status open_split(files_self *s, const char *x, const char *y, const char *what, lk_dataset **out) {
    *out = NULL;
    lk_dataset *ds = NULL;
    if (s->csv) {
        lk_csv_config cc = lk_csv_config_default();
        char *end;
        long col = strtol(s->a.label, &end, 10);
        if (!s->a.label[0]) cc.label_column = -1;
        else if (end != s->a.label && !*end) cc.label_column = (int)col;
        else cc.label_name = s->a.label;
        cc.label_dtype = !strcmp(s->a.task, "regression") ? LK_F32 : LK_I64;
        cc.num_classes = s->a.num_classes;
        LK_TRY(lk_dataset_csv_create(x, &cc, &ds));
    } else {
        LK_TRY(lk_dataset_npy_create(x, y && *y ? y : NULL, &ds));
    }
    /* models take f32 inputs; integer targets are class indices (cross entropy's i64) */
    lk_status st = cast_field(&ds, 0, LK_F32, s->a.scale, s->seed);
    const lk_field *yf = st ? NULL : lk_dataset_field(ds, 1);
    if (yf && yf->dtype != LK_F32 && yf->dtype != LK_F64 && yf->dtype != LK_F16 && yf->dtype != LK_BF16)
        st = cast_field(&ds, 1, LK_I64, 1, s->seed);
    else if (yf && yf->dtype != LK_F32)
        st = cast_field(&ds, 1, LK_F32, 1, s->seed);
    if (st) {
        lk_dataset_free(ds);
        return lk_error(st, "data %s (%s): %s", s->csv ? "csv" : "npy", what, lk_last_error());
    }
    *out = ds;
    return LK_STATUS_OK;
}

static lk_status files_setup(lk_datamodule *dm, const char *stage) {
    files_self *s = dm->self;
    (void)stage;
    if (s->sp.train) return LK_STATUS_OK; /* once */
    const files_args *a = &s->a;
    const char *xk = s->csv ? "path" : "x";
    if (!a->x[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.%s is required (the training %s)", xk,
                                  s->csv ? "CSV file" : "inputs .npy file");
    if (!s->csv && !a->y[0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.y is required with x (the training targets .npy)");
    if (!s->csv && !!a->val_x[0] != !!a->val_y[0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.val_x and val_y go together (one of them is empty)");
    if (!s->csv && !!a->test_x[0] != !!a->test_y[0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.test_x and test_y go together (one of them is empty)");
    lk_dataset *full = NULL;
    LK_TRY(open_split(s, a->x, a->y, xk, &full));
    lk_status st = LK_STATUS_OK;
    if (a->val_x[0]) {
        s->sp.train = lk_dataset_retain(full);
        st = open_split(s, a->val_x, a->val_y, s->csv ? "val_path" : "val_x", &s->sp.val);
    } else {
        st = lk__dm_splits_cut(&s->sp, full, a->val_split, s->seed, a->x, "sample");
    }
    if (!st && !s->csv) st = lk__dm_augment(&s->sp.train, a->random_crop_padding, a->random_hflip, s->seed);
    if (!st && a->test_x[0]) st = open_split(s, a->test_x, a->test_y, s->csv ? "test_path" : "test_x", &s->sp.test);
    if (!st && a->predict_x[0]) st = open_split(s, a->predict_x, NULL, s->csv ? "predict_path" : "predict_x", &s->sp.predict);
    if (!st && !s->sp.predict) s->sp.predict = lk_dataset_retain(s->sp.test ? s->sp.test : full); /* in file order */
    lk_dataset_free(full);
    return st;
}

static lk_dataset *files_dataset(lk_datamodule *dm, const char *split) {
    return lk__dm_splits_get(&((files_self *)dm->self)->sp, split);
}

static void files_destroy(lk_datamodule *dm) {
    files_self *s = dm->self;
    if (!s) return;
    lk__dm_splits_free(&s->sp);
    lk_free(s);
}

static const lk_datamodule_vtable files_vt = {
    .prepare_data = NULL, .setup = files_setup, .dataset = files_dataset, .destroy = files_destroy};

lk_status lk__dm_files_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                              lk_datamodule **out) {
    *out = NULL;
    bool csv = !strcmp(name, "csv");
    const lk_param *p = csv ? lk__dm_csv_params : lk__dm_npy_params;
    int np = csv ? LK__DM_CSV_NPARAMS : LK__DM_NPY_NPARAMS;
    files_self *s = lk_calloc(1, sizeof *s);
    lk_datamodule *dm = lk_calloc(1, sizeof *dm);
    if (!s || !dm) {
        lk_free(s);
        lk_free(dm);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    dm->self = s;
    dm->vt = &files_vt;
    dm->name = csv ? "csv" : "npy";
    s->csv = csv;
    s->seed = seed;
    lk_status st = lk_params_defaults(p, np, &s->a);
    for (int i = 0; !st && i < n_args; i++)
        st = lk_params_set(p, np, &s->a, "data.init_args", args[i].key, args[i].value);
    if (st) {
        lk_datamodule_free(dm);
        return st;
    }
    dm->batch_size = s->a.batch_size;
    dm->num_workers = (int)s->a.num_workers;
    /* hparams.yaml's flat keys, as the other data modules write them */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        fprintf(f, "_class_path: %s\n", dm->name);
        for (int i = 0; i < n_args; i++) fprintf(f, "%s: %s\n", args[i].key, args[i].value);
        fclose(f);
        dm->hparams_yaml = lk_strdup(buf);
        free(buf);
    }
    *out = dm;
    return LK_STATUS_OK;
}

lk_status lk__dm_splits_cut(lk__dm_splits *sp, lk_dataset *full, double val_split, uint64_t seed, const char *src,
                            const char *noun) {
    if (!(val_split > 0)) {
        sp->train = lk_dataset_retain(full);
        return LK_STATUS_OK;
    }
    int64_t n = lk_dataset_len(full), nval = (int64_t)((double)n * val_split);
    if (nval < 1 || nval >= n)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.val_split %g of %lld %ss in %s leaves no %s %s",
                        val_split, (long long)n, noun, src, nval < 1 ? "validation" : "training", noun);
    lk_dataset *parts[2] = {NULL, NULL};
    lk_status st = lk_dataset_random_split(full, 2, (double[]){(double)(n - nval), (double)nval}, seed, parts);
    sp->train = parts[0], sp->val = parts[1];
    return st;
}

lk_status lk__dm_augment(lk_dataset **train, int64_t pad, double flip, uint64_t seed) {
    if (pad <= 0 && !(flip > 0)) return LK_STATUS_OK;
    const lk_field *x = lk_dataset_field(*train, 0);
    if (!x || x->ndim < 2) {
        char sb[160];
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.%s: the training inputs are %s per sample; "
                        "a crop and a flip need images [H, W] or [C, H, W]", pad > 0 ? "random_crop_padding" :
                        "random_hflip", x ? lk_data_shape_str(x->ndim, x->shape, sb, sizeof sb) : "absent");
    }
    lk_transform *t = NULL;
    lk_dataset *out = NULL;
    lk_status st = lk_transform_create(&t);
    if (!st && pad > 0) st = lk_transform_random_crop(t, x->shape[x->ndim - 2], x->shape[x->ndim - 1], pad);
    if (!st && flip > 0) st = lk_transform_random_hflip(t, (float)flip);
    if (!st) st = lk_dataset_map(*train, 0, t, seed, &out);
    lk_transform_free(t);
    if (st) return st;
    lk_dataset_free(*train);
    *train = out;
    return LK_STATUS_OK;
}

lk_dataset *lk__dm_splits_get(const lk__dm_splits *sp, const char *split) {
    if (!strcmp(split, "train")) return sp->train;
    if (!strcmp(split, "val")) return sp->val;
    if (!strcmp(split, "test")) return sp->test;
    if (!strcmp(split, "predict")) return sp->predict;
    return NULL;
}

void lk__dm_splits_free(lk__dm_splits *sp) {
    lk_dataset_free(sp->train);
    lk_dataset_free(sp->val);
    lk_dataset_free(sp->test);
    lk_dataset_free(sp->predict);
    *sp = (lk__dm_splits){0};
}
