/* safetensors.h — private to the trainer (src/train): reading and writing
 * the safetensors format, the checkpoint file of lockstep and PyTorch's
 * common weight format.
 *
 * Format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * padded with spaces to a multiple of 8, then the data buffer; offsets are
 * relative to the buffer, tensors are row-major and little-endian, and the
 * buffer is exactly covered by the tensors (no gaps, no overlaps).
 *
 * The writer orders the data by element size, largest first, so that every
 * tensor lockstep writes is aligned to its element size in the file (and in
 * an mmap). Files from elsewhere may hold unaligned tensors: the reader's
 * copies handle that; raw pointers from lk_st_get may then be unaligned.
 *
 * Checksums: the writer stores the CRC-32C of every tensor's bytes (as they
 * are in the file) in "__metadata__", one string per tensor:
 *   "lk.crc32c.<tensor name>": "<8 lowercase hex digits>"
 * e.g. "lk.crc32c.layers.0.weight": "e3069283". Metadata is a map of
 * strings in the format, so every safetensors reader still reads the file
 * (and ignores the keys); lockstep's reader checks them at open, before a
 * pointer to the data is handed out, and refuses a file whose bytes changed
 * after it was written, naming the tensor. A file without any such key (an
 * older lockstep's, PyTorch's) opens unverified, with a note. The keys are
 * the reader's: they are not listed by lk_safetensors_meta*, and callers
 * cannot write them (the prefix is reserved).
 */
#ifndef LK_TRAIN_SAFETENSORS_H
#define LK_TRAIN_SAFETENSORS_H

#include "lockstep/core.h"
#include "lockstep/tensor.h"

/* The largest header the reader accepts (the reference implementation's limit). */
#define LK_ST_MAX_HEADER (100u << 20)
/* The most dimensions the reader accepts for one tensor. */
#define LK_ST_MAX_DIMS 64
/* The metadata key prefix of a tensor's checksum (see above). */
#define LK_ST_CRC_PREFIX "lk.crc32c."

/* CRC-32C (Castagnoli) of n bytes, continuing from `crc` (0 to start):
 * lk__crc32c(0, "123456789", 9) == 0xe3069283. Uses SSE4.2's crc32
 * instruction where the CPU has it (cpuid at run time), else a table;
 * _portable always takes the table (tests compare the two). */
uint32_t lk__crc32c(uint32_t crc, const void *data, size_t n);
uint32_t lk__crc32c_portable(uint32_t crc, const void *data, size_t n);
bool lk__crc32c_hardware(void);
/* The CRC-32C of A||B from crc1 = CRC(A), crc2 = CRC(B) and B's length:
 * pieces checksummed on several threads are joined with it. */
uint32_t lk__crc32c_combine(uint32_t crc1, uint32_t crc2, size_t len2);

/* ---- writing -------------------------------------------------------------- */

/* One tensor to write: either `tensor` (CPU, any strides, its dtype and
 * shape), or, when `tensor` is NULL, `dtype`, `ndim`, `shape` and `data`
 * (contiguous, row-major; may be NULL when the tensor is empty). All
 * pointers are borrowed for the duration of the call. */
typedef struct lk_st_entry {
    const char *name;
    const lk_tensor *tensor;
    lk_dtype dtype;
    int ndim;
    const int64_t *shape;
    const void *data;
} lk_st_entry;

typedef struct lk_st_meta {
    const char *key;
    const char *value;
} lk_st_meta;

/* Writes `entries`, the `meta` strings and every tensor's checksum to
 * `path` atomically: the bytes
 * go to "<path>.tmp.<pid>" in the same directory, which is fsync'ed and
 * renamed over `path`, then the directory is fsync'ed. On any failure the
 * temporary file is removed and whatever was at `path` before is left
 * untouched. Errors name the file and, for bad entries, the tensor
 * (duplicate or reserved names, tensors on a device, bad shapes). */
lk_status lk_safetensors_write(const char *path, const lk_st_entry *entries, int n, const lk_st_meta *meta,
                               int nmeta);

/* Test hook (SQLite-style fault injection): after `nbytes` more bytes have
 * been written by lk_safetensors_write, the next write fails with errno
 * `err` (ENOSPC for a full disk, EIO, ...), after a short write up to the
 * limit. nbytes < 0 disables the hook. Not thread-safe; tests only. */
void lk__safetensors_fail_after(long long nbytes, int err);

/* ---- reading ---------------------------------------------------------------- */

/* An mmap'ed, fully validated file. The mapping keeps the opened file's
 * bytes even when a newer checkpoint is renamed over its path (the writer
 * never modifies a file in place); truncating the file in place while it is
 * open is not supported (the kernel would raise SIGBUS on access). */
typedef struct lk_st_file lk_st_file;

/* What the reader knows about one tensor. Pointers belong to the file and
 * live until lk_safetensors_close. `dtype` is -1 for safetensors dtypes
 * lockstep tensors cannot hold (BOOL, I8, I16, U16, U32, U64, F8_*); such
 * tensors can still be listed and read raw. */
typedef struct lk_st_info {
    const char *name;
    const char *dtype_name; /* as in the file: "F32", "BF16", ... */
    int dtype;              /* lk_dtype, or -1 */
    size_t elem_size;       /* bytes per element */
    int ndim;
    const int64_t *shape;
    int64_t numel;
    const void *data; /* nbytes of raw little-endian data, possibly unaligned */
    size_t nbytes;
    bool has_crc32c; /* the file holds its checksum (then verified at open) */
    uint32_t crc32c;
} lk_st_info;

/* Opens and validates `path`: header length within the file, JSON that is
 * an object of tensor entries (dtype, shape, data_offsets) plus an optional
 * "__metadata__" object of strings, known dtypes, shape × element size ==
 * the offsets' span, offsets inside the buffer without overlaps or gaps,
 * the buffer fully covered, unique names; then the checksums: each names a
 * tensor of the file and is 8 hex digits, all tensors have one or none
 * does, and every tensor's bytes match its own ("FILE: tensor 'w' fails its
 * crc32c check (stored ..., computed ...): the file is corrupt ..."). Every
 * error names the file and, where there is one, the tensor. *out is NULL on
 * failure. A file with tensors but no checksums opens with a note, logged
 * once per path in a process. */
lk_status lk_safetensors_open(const char *path, lk_st_file **out);
/* The same for a file image in memory (`data` is borrowed and must outlive
 * the handle); `name` stands for the path in messages. Checksums are
 * verified alike; an unverified image is not noted (no file to name). */
lk_status lk_safetensors_open_memory(const void *data, size_t size, const char *name, lk_st_file **out);
void lk_safetensors_close(lk_st_file *f); /* NULL does nothing */

const char *lk_safetensors_path(const lk_st_file *f);
/* How many tensors were verified against their checksum at open: all of
 * them, or 0 for a file without checksums. */
int lk_safetensors_verified(const lk_st_file *f);
/* Tensors in file (data offset) order. */
int lk_safetensors_count(const lk_st_file *f);
const lk_st_info *lk_safetensors_at(const lk_st_file *f, int i);
/* NULL when absent (no error set). */
const lk_st_info *lk_safetensors_find(const lk_st_file *f, const char *name);
/* Like find, but a missing tensor is an INVALID_ARGUMENT error naming the
 * file and the tensor (and the nearest name in the file). */
lk_status lk_safetensors_get(const lk_st_file *f, const char *name, const lk_st_info **out);

/* Copies tensor `name` into `dst` (CPU, any strides). The shapes must be
 * equal ("tensor 'w' in FILE has shape [512, 784], the model expects
 * [256, 784]"); the dtypes may differ between lockstep's float types (the
 * value is converted, rounding to nearest even), otherwise they must match. */
lk_status lk_safetensors_read_into(const lk_st_file *f, const char *name, lk_tensor *dst);

/* Metadata strings: value of `key` or NULL; and iteration in file order. */
const char *lk_safetensors_meta(const lk_st_file *f, const char *key);
int lk_safetensors_meta_count(const lk_st_file *f);
const char *lk_safetensors_meta_key(const lk_st_file *f, int i);
const char *lk_safetensors_meta_value(const lk_st_file *f, int i);

/* "F32" for LK_F32 and so on. */
const char *lk_safetensors_dtype_name(lk_dtype dt);

#endif
