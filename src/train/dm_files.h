/* The CLI's data modules for a user's own files (dm_files.c): `npy`
 * (arrays of inputs and targets) and `csv` (a label column, the other
 * columns features). builtin.c lists them in its data-module table and
 * hands their construction here. */
#ifndef LK_TRAIN_DM_FILES_H
#define LK_TRAIN_DM_FILES_H

#include "lockstep/trainer.h"

#define LK__DM_NPY_NPARAMS 11
#define LK__DM_CSV_NPARAMS 11
extern const lk_param lk__dm_npy_params[LK__DM_NPY_NPARAMS];
extern const lk_param lk__dm_csv_params[LK__DM_CSV_NPARAMS];

/* image_folder (dm_images.c): root/<class_name>/ of .png or .jpg files, as torchvision's ImageFolder. */
#define LK__DM_IMAGES_NPARAMS 8
extern const lk_param lk__dm_images_params[LK__DM_IMAGES_NPARAMS];
lk_status lk__dm_images_create(const lk_model_kv *args, int n_args, uint64_t seed, lk_datamodule **out);

/* True when `name` is one of this file's data modules. */
bool lk__dm_files_has(const char *name);
/* Builds data module `name` from its init_args; nothing is read before
 * setup (which names the file and what is wrong with it). */
lk_status lk__dm_files_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                              lk_datamodule **out);

#endif
