/* Private to src/data: the dataset handle, dtype helpers shared by the
 * readers, and the temporary-file writer used by the idx/npy writers. */
#ifndef LK_DATA_INTERNAL_H
#define LK_DATA_INTERNAL_H

#include <stdatomic.h>
#include <stdio.h>

#include "lockstep/data.h"

struct lk_dataset {
    const lk_dataset_vtable *vt;
    void *ctx;
    int64_t len;
    int nfields;
    lk_field fields[LK_DATA_MAX_FIELDS];
    size_t scratch_bytes;
    atomic_int refcount;
};

/* Passes on a prefetch hint for sample `index` when the dataset takes one. */
static inline void lk__dataset_prefetch(const lk_dataset *ds, int64_t index) {
    if (ds->vt->prefetch) ds->vt->prefetch(ds->ctx, index);
}

/* Fills an lk_field; `name` NULL gives "x", "y", "f2", ... by position. */
void lk__field_init(lk_field *f, const char *name, int pos, lk_dtype dt, int ndim, const int64_t *shape);

/* n = product of shape, or -1 when it overflows int64 or a dim is negative. */
int64_t lk__shape_numel(int ndim, const int64_t *shape);
/* lk_dataset_mnist_create's lookup: the image and label files of `split`,
 * the directory they are in and the setting it came from
 * ("data.init_args.root" for a root given, "LK_DATA_ROOT", "default").
 * dir_used and from may be NULL. */
lk_status lk__mnist_locate(const char *root, const char *split, char *img, char *lab, size_t size, char *dir_used,
                           size_t dir_size, const char **from);
/* lk_dataset_mnist_create, also saying where the files were found. */
lk_status lk__dataset_mnist_create_from(const char *root, const char *split, lk_dataset **out, char *dir_used,
                                        size_t dir_size, const char **from);

/* lk_array_alloc without zeroing, for readers that fill every byte. */
lk_status lk__array_alloc_uninit(lk_array *a, lk_dtype dt, int ndim, const int64_t *shape);

/* Reads exactly n bytes or fails naming the file and how many bytes were
 * expected at which offset. */
lk_status lk__read_exact(FILE *f, const char *path, void *buf, size_t n, size_t offset);

/* Writes via "<path>.tmp.<pid>", fsyncs and renames; on failure removes the
 * temporary file and leaves `path` as it was. write_fn creates tmp_path. */
typedef lk_status (*lk__write_fn)(const char *tmp_path, const void *ctx);
lk_status lk__write_atomic(const char *path, lk__write_fn fn, const void *ctx);

/* Fails when a class label in `labels` (integer dtypes; others pass) is
 * negative or >= num_classes, naming `path`, the label and the sample:
 * a bad label file is reported when it is loaded, not by cross_entropy
 * steps later. num_classes <= 0 checks nothing. */
lk_status lk__labels_check(const lk_array *labels, int64_t num_classes, const char *path);

/* Fails at the first NaN or inf of a floating-point array (f32, f64, f16,
 * bf16; other dtypes pass), naming `path`, the element's flat index, its
 * index in every dimension and the value: checked once when a dataset is
 * opened, since a NaN input makes the loss nan at whatever step first reads
 * it, with no file named. A bit test over blocks the compiler vectorises;
 * the block holding a bad value is scanned again for the first one. */
lk_status lk__finite_check(const lk_array *a, const char *path);
/* The pieces, for a reader that checks each block as it reads it (while it
 * is in the cache): the first non-finite of n values (-1: none), and the
 * error for element `at` of `a` (OK when at < 0). */
int64_t lk__first_nonfinite(const void *data, int64_t n, lk_dtype dt);
lk_status lk__nonfinite_error(const lk_array *a, int64_t at, const char *path);

#endif
