/* The CLI's data modules for a user's own files (dm_files.c): `npy`
 * (arrays of inputs and targets) and `csv` (a label column, the other
 * columns features). builtin.c lists them in its data-module table and
 * hands their construction here. */
#ifndef LK_TRAIN_DM_FILES_H
#define LK_TRAIN_DM_FILES_H

#include "lockstep/trainer.h"

#define LK__DM_NPY_NPARAMS 13
#define LK__DM_CSV_NPARAMS 11
extern const lk_param lk__dm_npy_params[LK__DM_NPY_NPARAMS];
extern const lk_param lk__dm_csv_params[LK__DM_CSV_NPARAMS];

/* image_folder (dm_images.c): root/<class_name>/ of .png or .jpg files, as torchvision's ImageFolder. */
/* The four splits a file data module serves (dm_files.c, dm_images.c). */
typedef struct lk__dm_splits {
    lk_dataset *train, *val, *test, *predict;
} lk__dm_splits;
/* train and val from the full set (borrowed; what it keeps is retained):
 * a fraction val_split > 0 of it cut at random with the seed (an error names
 * `src` and the `noun` counted when either part would be empty), else all of
 * it for training and no validation set. */
lk_status lk__dm_splits_cut(lk__dm_splits *sp, lk_dataset *full, double val_split, uint64_t seed, const char *src,
                            const char *noun);
/* The split by its data module name ("train", "val", "test", "predict"). */
lk_dataset *lk__dm_splits_get(const lk__dm_splits *sp, const char *split);
void lk__dm_splits_free(lk__dm_splits *sp);

/* Augmentation of a training split's inputs (field 0, samples [..., H, W]),
 * drawn per (seed, epoch, sample) so any worker count sees the same
 * images: a random crop of the same size after `pad` zeros on every side
 * (torchvision's RandomCrop(size, padding)), then a left-right mirror with
 * probability `flip` (RandomHorizontalFlip(p)). *train is replaced; pad 0
 * and flip 0 leave it as it is. A module applies it to the raw pixels,
 * before scaling, so the padding is black. An error names the init arg
 * and the sample shape when the inputs are not images. */
lk_status lk__dm_augment(lk_dataset **train, int64_t pad, double flip, uint64_t seed);
#define LK__DM_CROP_HELP                                                                                               \
    "training inputs only: pad by this many black pixels, then crop a random window of the image's size "             \
    "(torchvision's RandomCrop(size, padding)); 0: off"
#define LK__DM_FLIP_HELP                                                                                               \
    "training inputs only: mirror left-right with this probability (torchvision's RandomHorizontalFlip(p)); 0: off"

#define LK__DM_IMAGES_NPARAMS 10
extern const lk_param lk__dm_images_params[LK__DM_IMAGES_NPARAMS];
lk_status lk__dm_images_create(const lk_model_kv *args, int n_args, uint64_t seed, lk_datamodule **out);

/* True when `name` is one of this file's data modules. */
bool lk__dm_files_has(const char *name);
/* Builds data module `name` from its init_args; nothing is read before
 * setup (which names the file and what is wrong with it). */
lk_status lk__dm_files_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                              lk_datamodule **out);

#endif
