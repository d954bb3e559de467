/* The `image_folder` data module: torchvision's ImageFolder layout,
 * root/<class_name>/<file>.png|jpg|jpeg|bmp|gif, classes numbered in
 * sorted name order and files read in sorted order. Every image is decoded
 * once in setup by stb_image (compiled into this file, static, as image.c
 * does with the writer) to u8 [C, H, W], then served as f32 in [0, 1]
 * (normalize: mean 0.5, std 0.5 per channel on top) with the class index
 * as i64. All images must have one size (no resize here): the first one
 * sets it and a file of another size is an error naming both. Splits:
 * val_split of root (seeded) or val_root, test_root; predict runs on
 * test_root, else root, in that sorted order. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/data.h"
#include "lockstep/trainer.h"
#include "train/dm_files.h"

#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_MALLOC(sz) lk_malloc(sz)
#define STBI_REALLOC(p, sz) lk_realloc(p, sz)
#define STBI_FREE(p) lk_free(p)
#define STBI_ASSERT(x) LK_ASSERT(x)
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_ONLY_BMP
#define STBI_ONLY_GIF
#if defined(__GNUC__)
/* stb's unused decoders and declarations are reported at the end of the
 * file, so this one stays off for the whole (small) file, as in image.c */
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#endif
#include <stb/stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

typedef struct {
    char root[LK_PARAM_STR], val_root[LK_PARAM_STR], test_root[LK_PARAM_STR];
    double val_split;
    int64_t channels, batch_size, num_workers;
    bool normalize;
    int64_t random_crop_padding; /* augmentation of the training images */
    double random_hflip;
} images_args;

#define I(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(images_args, field), def, lo, hi, choices, help}

const lk_param lk__dm_images_params[LK__DM_IMAGES_NPARAMS] = {
    I("root", STRING, root, "", 1, 0, NULL, "training images: root/<class_name>/*.png|jpg (required)"),
    I("val_root", STRING, val_root, "", 1, 0, NULL, "validation images, same layout (empty: val_split of root)"),
    I("test_root", STRING, test_root, "", 1, 0, NULL, "test images, same layout (empty: no test set)"),
    I("val_split", FLOAT, val_split, "0.1", 0, 0.99, NULL, "fraction of root held out for validation when val_root is empty"),
    I("channels", INT, channels, "1", 1, 4, NULL, "1: grayscale, 3: RGB (every image is converted)"),
    I("normalize", BOOL, normalize, "false", 1, 0, NULL, "pixels to [-1, 1] (mean 0.5, std 0.5) instead of [0, 1]"),
    I("batch_size", INT, batch_size, "32", 1, 1e7, NULL, "samples per batch on each rank"),
    I("num_workers", INT, num_workers, "0", 0, 256, NULL, "loader threads per rank"),
    I("random_crop_padding", INT, random_crop_padding, "0", 0, 1 << 20, NULL, LK__DM_CROP_HELP),
    I("random_hflip", FLOAT, random_hflip, "0", 0, 1, NULL, LK__DM_FLIP_HELP),
};
_Static_assert(sizeof lk__dm_images_params / sizeof lk__dm_images_params[0] == LK__DM_IMAGES_NPARAMS, "table");

typedef struct {
    images_args a;
    uint64_t seed;
    lk__dm_splits sp;
    char **classes; /* the training root's class names, sorted: label i is classes[i] */
    int nclasses;
} images_self;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool is_image(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot) return false;
    static const char *const ext[] = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".PNG", ".JPG", ".JPEG"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++)
        if (!strcmp(dot, ext[i])) return true;
    return false;
}

/* The sorted entries of `dir` that are directories (want_dirs) or image
 * files; names are lk_strdup'd into a lk_malloc'd array. */
static lk_status list_dir(const char *dir, bool want_dirs, char ***out, int *n) {
    *out = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return lk_error(LK_STATUS_IO, "image_folder: cannot open directory %s", dir);
    int cap = 0;
    struct dirent *de;
    lk_status st = LK_STATUS_OK;
    while (!st && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        DIR *sub = opendir(path);
        bool is_dir = sub != NULL;
        if (sub) closedir(sub);
        if (want_dirs ? !is_dir : (is_dir || !is_image(de->d_name))) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = lk_realloc(*out, (size_t)cap * sizeof *grown);
            if (!grown) { st = LK_STATUS_OUT_OF_MEMORY; break; }
            *out = grown;
        }
        (*out)[(*n)++] = lk_strdup(de->d_name);
    }
    closedir(d);
    if (!st && *n) qsort(*out, (size_t)*n, sizeof **out, cmp_str);
    return st;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) lk_free(names[i]);
    lk_free(names);
}

/* Every image under root/<class>/ as one dataset {x: u8 [C, H, W], y: i64}, unconverted. */
static lk_status load_root(images_self *s, const char *root, const char *key, lk_dataset **out) {
    *out = NULL;
    char **cls = NULL;
    int ncls = 0;
    LK_TRY(list_dir(root, true, &cls, &ncls));
    if (!ncls) {
        lk_free(cls);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.%s %s has no class directories (expected "
                        "%s/<class_name>/*.png|jpg, as torchvision's ImageFolder)", key, root, root);
    }
    lk_status st = LK_STATUS_OK;
    if (!s->classes) { /* the training root names the classes */
        s->classes = cls, s->nclasses = ncls;
    } else { /* another split must use the same classes (labels are indices into them) */
        for (int i = 0; !st && i < ncls; i++)
            if (!bsearch(&cls[i], s->classes, (size_t)s->nclasses, sizeof *cls, cmp_str))
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.%s %s has class '%s', which the training "
                              "root %s does not have", key, root, cls[i], s->a.root);
    }
    int C = (int)s->a.channels, H = 0, W = 0;
    unsigned char *px = NULL;
    int64_t *labels = NULL, n = 0, cap = 0;
    for (int c = 0; !st && c < ncls; c++) {
        char dir[800];
        snprintf(dir, sizeof dir, "%s/%s", root, cls[c]);
        char **files = NULL;
        int nf = 0;
        st = list_dir(dir, false, &files, &nf);
        int64_t label = (char **)bsearch(&cls[c], s->classes, (size_t)s->nclasses, sizeof *cls, cmp_str) - s->classes;
        for (int f = 0; !st && f < nf; f++) {
            char path[1200];
            snprintf(path, sizeof path, "%s/%s", dir, files[f]);
            int w, h, got;
            unsigned char *img = stbi_load(path, &w, &h, &got, C);
            if (!img) {
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "image_folder: cannot decode %s: %s", path,
                              stbi_failure_reason());
                break;
            }
            if (!H) H = h, W = w;
            if (h != H || w != W) {
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "image_folder: %s is %dx%d but the images before it are "
                              "%dx%d; every image must have one size (resize them first)", path, w, h, W, H);
            } else if (n == cap) {
                cap = cap ? 2 * cap : 64;
                unsigned char *p2 = lk_realloc(px, (size_t)cap * (size_t)(C * H * W));
                int64_t *l2 = p2 ? lk_realloc(labels, (size_t)cap * sizeof *l2) : NULL;
                if (p2) px = p2;
                if (l2) labels = l2;
                if (!p2 || !l2) st = LK_STATUS_OUT_OF_MEMORY;
            }
            if (!st) { /* stb gives [H, W, C]: the models take [C, H, W] */
                unsigned char *dst = px + (size_t)n * (size_t)(C * H * W);
                for (int k = 0; k < C; k++)
                    for (int i = 0; i < H * W; i++) dst[(size_t)k * (size_t)(H * W) + (size_t)i] = img[(size_t)i * (size_t)C + (size_t)k];
                labels[n++] = label;
            }
            stbi_image_free(img);
        }
        free_names(files, nf);
    }
    if (cls != s->classes) free_names(cls, ncls);
    if (!st && !n) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.%s %s: no .png/.jpg/.bmp/.gif file "
                                 "in its class directories", key, root);
    lk_array arr[2];
    memset(arr, 0, sizeof arr);
    lk_dataset *raw = NULL;
    if (!st) { /* copied into lockstep's arrays, which the dataset owns */
        int64_t xs[4] = {n, C, H, W}, ys[1] = {n};
        st = lk_array_alloc(&arr[0], LK_U8, 4, xs);
        if (!st) st = lk_array_alloc(&arr[1], LK_I64, 1, ys);
        if (!st) {
            memcpy(arr[0].data, px, (size_t)n * (size_t)(C * H * W));
            memcpy(arr[1].data, labels, (size_t)n * sizeof *labels);
            st = lk_dataset_from_arrays(2, arr, (const char *const[]){"x", "y"}, false, &raw);
        }
        if (st) lk_array_release(&arr[0]), lk_array_release(&arr[1]);
    }
    lk_free(px);
    lk_free(labels);
    if (!st) *out = raw;
    return st;
}

/* u8 [C, H, W] pixels to f32 in [0, 1] or, normalised, [-1, 1]; done per
 * split after the training images are augmented on their raw pixels. */
static lk_status images_convert(images_self *s, lk_dataset *raw, lk_dataset **out) {
    lk_transform *t = NULL;
    lk_status st = lk_transform_create(&t);
    if (!st) st = lk_transform_cast(t, LK_F32);
    if (!st) st = s->a.normalize ? lk_transform_scale(t, 2.0f / 255.0f, -1.0f) : lk_transform_scale(t, 1.0f / 255.0f, 0.0f);
    if (!st) st = lk_dataset_map(raw, 0, t, s->seed, out);
    lk_transform_free(t);
    return st;
}

static lk_status images_setup(lk_datamodule *dm, const char *stage) {
    images_self *s = dm->self;
    (void)stage;
    if (s->sp.train) return LK_STATUS_OK; /* once */
    if (!s->a.root[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.root is required (root/<class_name>/*.png)");
    lk_dataset *full = NULL;
    LK_TRY(load_root(s, s->a.root, "root", &full));
    lk__dm_splits raw = {0};
    lk_status st = LK_STATUS_OK;
    if (s->a.val_root[0]) {
        raw.train = lk_dataset_retain(full);
        st = load_root(s, s->a.val_root, "val_root", &raw.val);
    } else {
        st = lk__dm_splits_cut(&raw, full, s->a.val_split, s->seed, s->a.root, "image");
    }
    if (!st && s->a.test_root[0]) st = load_root(s, s->a.test_root, "test_root", &raw.test);
    if (!st) st = lk__dm_augment(&raw.train, s->a.random_crop_padding, s->a.random_hflip, s->seed);
    if (!st) st = images_convert(s, raw.train, &s->sp.train);
    if (!st && raw.val) st = images_convert(s, raw.val, &s->sp.val);
    if (!st && raw.test) st = images_convert(s, raw.test, &s->sp.test);
    if (!st) /* the test images, else every image of root, in sorted order */
        st = s->sp.test ? (s->sp.predict = lk_dataset_retain(s->sp.test), LK_STATUS_OK)
                        : images_convert(s, full, &s->sp.predict);
    lk__dm_splits_free(&raw);
    lk_dataset_free(full);
    return st;
}

static lk_dataset *images_dataset(lk_datamodule *dm, const char *split) {
    return lk__dm_splits_get(&((images_self *)dm->self)->sp, split);
}

static void images_destroy(lk_datamodule *dm) {
    images_self *s = dm->self;
    if (!s) return;
    lk__dm_splits_free(&s->sp);
    free_names(s->classes, s->nclasses);
    lk_free(s);
}

static const lk_datamodule_vtable images_vt = {
    .prepare_data = NULL, .setup = images_setup, .dataset = images_dataset, .destroy = images_destroy};

lk_status lk__dm_images_create(const lk_model_kv *args, int n_args, uint64_t seed, lk_datamodule **out) {
    *out = NULL;
    images_self *s = lk_calloc(1, sizeof *s);
    lk_datamodule *dm = lk_calloc(1, sizeof *dm);
    if (!s || !dm) {
        lk_free(s);
        lk_free(dm);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    dm->self = s;
    dm->vt = &images_vt;
    dm->name = "image_folder";
    s->seed = seed;
    lk_status st = lk_params_defaults(lk__dm_images_params, LK__DM_IMAGES_NPARAMS, &s->a);
    for (int i = 0; !st && i < n_args; i++)
        st = lk_params_set(lk__dm_images_params, LK__DM_IMAGES_NPARAMS, &s->a, "data.init_args", args[i].key,
                           args[i].value);
    if (!st && s->a.channels == 2)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data.init_args.channels: expected 1 (grayscale), 3 (RGB) or 4 (RGBA)");
    if (st) {
        lk_datamodule_free(dm);
        return st;
    }
    dm->batch_size = s->a.batch_size;
    dm->num_workers = (int)s->a.num_workers;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        fprintf(f, "_class_path: image_folder\n");
        for (int i = 0; i < n_args; i++) fprintf(f, "%s: %s\n", args[i].key, args[i].value);
        fclose(f);
        dm->hparams_yaml = lk_strdup(buf);
        free(buf);
    }
    *out = dm;
    return LK_STATUS_OK;
}
