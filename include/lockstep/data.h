/* lockstep/data.h — datasets, transforms, the distributed sampler and the
 * prefetching loader: everything between files on disk and the host buffers
 * a training step reads.
 *
 * A dataset is a list of samples; each sample has one or more named fields
 * ("x", "y") with a fixed dtype and per-sample shape. Datasets come from
 * files users already have (idx/idx.gz as in MNIST, npy, csv, token files
 * as written by llm.c or nanoGPT), from memory, or are synthetic; they are
 * composed without copying (subset, random split, field selection, map
 * through a transform). The loader cuts an epoch into batches using the
 * distributed sampler — a permutation seeded by (seed, epoch), identical on
 * every rank, sharded by rank — and fills them ahead of the training step on
 * worker threads. Batch contents depend only on (seed, epoch, rank, world
 * size, batch size), never on the number of workers or on timing.
 *
 *     lk_dataset *train = NULL;
 *     lk_loader *loader = NULL;
 *     LK_TRY(lk_dataset_idx_pair_create("train-images-idx3-ubyte.gz",
 *                                       "train-labels-idx1-ubyte.gz", &train));
 *     lk_loader_config cfg = lk_loader_config_default();
 *     cfg.batch_size = 128;
 *     cfg.rank = rank;
 *     cfg.world_size = world;
 *     lk_status st = lk_loader_create(train, &cfg, &loader); // holds a reference
 *     lk_dataset_free(train);
 *     for (uint64_t epoch = 0; !st && epoch < 10; epoch++) {
 *         const lk_batch *b;
 *         st = lk_loader_start(loader, epoch, 0);
 *         while (!st && !(st = lk_loader_next(loader, &b)) && b) {
 *             // b->field[0]: u8 [B, 28, 28]; b->field[1]: u8 [B]
 *         }
 *     }
 *     lk_loader_free(loader);
 *     return st;  // a failed read names the file, batch and sample
 *
 * Threading: datasets are immutable once created, so any number of threads
 * may read samples at once. A loader is driven by one thread.
 */
#ifndef LOCKSTEP_DATA_H
#define LOCKSTEP_DATA_H

#include "lockstep/core.h"
#include "lockstep/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LK_DATA_MAX_FIELDS 8
#define LK_DATA_NAME_MAX 32

/* ------------------------------------------------------------------------
 * Arrays: a dense, row-major host array (a whole file, or one field of a
 * batch). Readers return arrays whose `data` the caller owns and releases
 * with lk_array_release().
 * ---------------------------------------------------------------------- */
typedef struct lk_array {
    lk_dtype dtype;
    int ndim;
    int64_t shape[LK_MAX_DIMS];
    void *data; /* LK_ALIGN-aligned when allocated by lockstep */
} lk_array;

/* Bytes of one element of `dt` (0 for an unknown dtype); works without the
 * tensor layer. */
size_t lk_data_dtype_size(lk_dtype dt);
/* Elements in `a` (product of the shape; 1 for ndim 0). */
int64_t lk_array_numel(const lk_array *a);
size_t lk_array_nbytes(const lk_array *a);
/* Allocates zeroed data for `a`'s dtype and shape. On failure a->data is NULL. */
lk_status lk_array_alloc(lk_array *a, lk_dtype dt, int ndim, const int64_t *shape);
/* Frees data allocated by lockstep and sets it to NULL; NULL data does nothing. */
void lk_array_release(lk_array *a);
/* "[60000, 28, 28]" into buf; returns buf. */
char *lk_data_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* ------------------------------------------------------------------------
 * File formats. Every reader names the file, the offset or line, the value
 * and what was expected when the input is bad; truncated files say how many
 * bytes were expected. On failure *out is left empty (data NULL).
 * ---------------------------------------------------------------------- */

/* idx (LeCun's MNIST format), plain or gzip-compressed (detected from the
 * bytes, not the name). u8 and f32/f64/i32 keep their type; i8 and i16
 * widen to i32. */
lk_status lk_idx_read(const char *path, lk_array *out);
/* Writes u8, i32, f32 or f64 as idx; gzip when the path ends in ".gz".
 * Written to a temporary file and renamed, so readers never see half. */
lk_status lk_idx_write(const char *path, const lk_array *a);

/* NumPy .npy versions 1-3, little- or big-endian, C order; dtypes
 * f4 f8 f2 i1 i2 i4 i8 u1 u2 u4 b1 (f2 reads as f16; i1/i2/u2 widen to
 * i32, u4 to i64, b1 to u8). Fortran order is refused with a hint. */
lk_status lk_npy_read(const char *path, lk_array *out);
/* Writes a version-1.0 little-endian .npy (temporary file + rename). */
lk_status lk_npy_write(const char *path, const lk_array *a);

/* Numeric CSV: one sample per line; `label_column` (or the column named
 * `label_name` when the header has one) becomes the target. */
typedef struct lk_csv_config {
    char delimiter;         /* ',' */
    int header;             /* 1: first line is a header, 0: no header, -1: detect (default) */
    int label_column;       /* 0-based; -1 counts from the end (default -1: the last column);
                               LK_CSV_NO_LABEL: every column is a feature */
    const char *label_name; /* overrides label_column when set (needs a header) */
    lk_dtype label_dtype;   /* LK_I64 (classes, default), LK_I32 or LK_F32 (regression) */
    int64_t num_classes;    /* > 0: lk_dataset_csv_create fails on a label outside [0, num_classes) (0: unchecked) */
} lk_csv_config;
#define LK_CSV_NO_LABEL (-1000000)
lk_csv_config lk_csv_config_default(void);
/* Features as f32 [N, C]; labels (when there is a label column) as
 * label_dtype [N]. `labels` may be NULL only with LK_CSV_NO_LABEL. */
lk_status lk_csv_read(const char *path, const lk_csv_config *cfg, lk_array *features, lk_array *labels);

/* ------------------------------------------------------------------------
 * Datasets.
 * ---------------------------------------------------------------------- */
typedef struct lk_dataset lk_dataset;

/* One field of a sample: name, dtype and per-sample shape (no batch dim). */
typedef struct lk_field {
    char name[LK_DATA_NAME_MAX];
    lk_dtype dtype;
    int ndim;
    int64_t shape[LK_MAX_DIMS];
} lk_field;

/* Bytes of one sample of `f`. */
size_t lk_field_nbytes(const lk_field *f);

/* The interface a custom dataset implements (the built-in ones use it too). */
typedef struct lk_dataset_vtable {
    const char *kind; /* "idx", "npy", "subset", ... for messages */
    /* Writes sample `index` (0 <= index < len): field f into out[f], which
     * holds lk_field_nbytes(&fields[f]) bytes. `epoch` keys random
     * transforms; `scratch` holds the scratch_bytes given at creation.
     * Called from several threads at once: must not mutate `ctx`. */
    lk_status (*get)(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out);
    /* (optional) frees ctx when the dataset's last reference goes. */
    void (*free)(void *ctx);
    /* (optional) a hint that sample `index` will be read soon: start
     * loading where it lies (a software prefetch of an in-memory row, a
     * source's prefetch for a derived dataset). Must not block or fail.
     * The loader hints a few samples ahead of the one it reads, so a
     * random-order batch gather overlaps its memory latencies. */
    void (*prefetch)(void *ctx, int64_t index);
} lk_dataset_vtable;

/* Wraps a custom dataset. `vt` must outlive the dataset (a static table);
 * the dataset owns `ctx` from the call on (vt->free releases it, even on
 * failure). */
lk_status lk_dataset_create(const lk_dataset_vtable *vt, void *ctx, int64_t len, int nfields,
                            const lk_field *fields, size_t scratch_bytes, lk_dataset **out);
/* Datasets are reference counted: derived datasets (subset, map, ...) hold
 * a reference to their source, so handles may be freed in any order. */
lk_dataset *lk_dataset_retain(lk_dataset *ds);
void lk_dataset_free(lk_dataset *ds); /* drops one reference; NULL does nothing */

int64_t lk_dataset_len(const lk_dataset *ds);
int lk_dataset_nfields(const lk_dataset *ds);
const lk_field *lk_dataset_field(const lk_dataset *ds, int f); /* NULL when out of range */
/* Index of the field called `name`, or -1. */
int lk_dataset_field_index(const lk_dataset *ds, const char *name);
const char *lk_dataset_kind(const lk_dataset *ds);
size_t lk_dataset_scratch_bytes(const lk_dataset *ds);
/* Reads one sample into out[f] (see the vtable's get). Allocates scratch
 * when the dataset needs it; the loader avoids that with per-worker scratch. */
lk_status lk_dataset_get(const lk_dataset *ds, int64_t index, uint64_t epoch, void *const *out);

/* Arrays as fields: every array's shape[0] is the sample count. The
 * dataset takes the arrays' data (which lockstep allocated: lk_array_alloc
 * or a reader; the caller's arrays are emptied) unless `borrow`, in which
 * case the data must outlive the dataset. `names` may be
 * NULL ("x", "y", "f2", ...). On failure the arrays are left untouched. */
lk_status lk_dataset_from_arrays(int nfields, lk_array *arrays, const char *const *names, bool borrow,
                                 lk_dataset **out);

/* An in-memory copy of every sample of `src` (same fields, names and
 * order; epoch 0 for samples that depend on it): for datasets whose samples
 * cost more to compute than a step does to consume them. Rows are computed
 * by up to `threads` threads (the caller's included); the result does not
 * depend on how many. */
#define LK_MATERIALIZE_MAX_THREADS 64
lk_status lk_dataset_materialize(lk_dataset *src, int threads, lk_dataset **out);

/* Samples of an idx image file and an idx label file ("x": u8 [28, 28],
 * "y": u8 []), checking that the counts agree. */
lk_status lk_dataset_idx_pair_create(const char *images_path, const char *labels_path, lk_dataset **out);
/* Fashion-MNIST / MNIST laid out as the original files
 * (train-images-idx3-ubyte[.gz], ...; split "train" or "test") under `root`;
 * both declare 10 classes, so a label outside [0, 10) fails here, naming the
 * label file and the sample;
 * root NULL (or "") searches $LK_DATA_ROOT, $LK_DATA_ROOT/fashion-mnist and
 * /usr/share/datasets/fashion-mnist. When the files are in none of them
 * the error lists every path tried; a place that exists but cannot be
 * read (no permission, not a directory) ends the search with that cause. */
lk_status lk_dataset_mnist_create(const char *root, const char *split, lk_dataset **out);
/* Downloads the four MNIST-layout files (train/t10k images/labels, .gz)
 * from `base_url` (NULL: Fashion-MNIST's canonical address) into `root`,
 * skipping files already there: a prepare step for lk_data_prepare. */
#define LK_FASHION_MNIST_URL "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
lk_status lk_data_mnist_download(const char *root, const char *base_url, long timeout_s);
/* npy files as fields (y_path may be NULL): shape[0] is the sample count. */
lk_status lk_dataset_npy_create(const char *x_path, const char *y_path, lk_dataset **out);
/* CSV as "x": f32 [C] and (with a label column) "y": label_dtype []. */
lk_status lk_dataset_csv_create(const char *path, const lk_csv_config *cfg, lk_dataset **out);

/* Token streams for language models: a file of u16 tokens, either llm.c's
 * format (a 256 x i32 header: magic 20240520, version 1, token count) or
 * raw (nanoGPT's train.bin), detected from the header. The file is mapped,
 * not read. Sample i is "x" = tokens[i*stride, i*stride + T) and "y" the
 * same window shifted by one, as `dtype` (LK_I32 or LK_I64). */
typedef struct lk_tokens_config {
    int64_t seq_len; /* T; required */
    int64_t stride;  /* 0: seq_len (non-overlapping windows) */
    lk_dtype dtype;  /* LK_I64 (default) or LK_I32 */
    int64_t vocab_size; /* > 0: every token is checked against it when the file is opened */
    int64_t samples;    /* > 0: random windows: that many samples, sample i of epoch e starting at a
                           position drawn from (seed, e, i) (stride is then unused); 0: strided windows */
    uint64_t seed;      /* keys the random windows */
} lk_tokens_config;
lk_tokens_config lk_tokens_config_default(void);
lk_status lk_dataset_tokens_create(const char *path, const lk_tokens_config *cfg, lk_dataset **out);
/* Checks a token file's header and size; its token count and largest token
 * (-1 when empty) into the pointers that are not NULL. */
lk_status lk_tokens_file_info(const char *path, int64_t *ntokens, int *largest);
/* Writes n u16 tokens in llm.c's format (1 KiB header: magic 20240520,
 * version 1, count), to a temporary file renamed into place. */
lk_status lk_tokens_write(const char *path, const uint16_t *tokens, int64_t n);

/* Tokenizers: text <-> token ids. "bytes": each byte is a token (vocabulary
 * 256, no files). "gpt2": GPT-2's byte-level BPE from its vocab.json and
 * merges.txt (the pre-tokenisation pattern, the byte-to-unicode map, merges
 * by rank; read from the files, no network). Immutable once created, so
 * threads may share one. */
typedef struct lk_tokenizer lk_tokenizer;
lk_status lk_tokenizer_bytes_create(lk_tokenizer **out);
/* Errors name the file and the entry (a malformed merge line, a vocabulary
 * missing one of the 256 byte symbols, an id given twice). */
lk_status lk_tokenizer_gpt2_create(const char *vocab_json, const char *merges_txt, lk_tokenizer **out);
void lk_tokenizer_free(lk_tokenizer *t); /* NULL does nothing */
/* The largest id + 1 (bytes: 256). */
int64_t lk_tokenizer_vocab_size(const lk_tokenizer *t);
const char *lk_tokenizer_kind(const lk_tokenizer *t); /* "bytes" or "gpt2" */
/* *tokens (lk_malloc'd; the caller lk_frees it) gets the n ids of text[0..len). */
lk_status lk_tokenizer_encode(const lk_tokenizer *t, const char *text, size_t len, int32_t **tokens, int64_t *n);
/* *text (lk_malloc'd, NUL-terminated; *len bytes without the NUL) gets the
 * bytes of the tokens; an id outside the vocabulary is an error naming it. */
lk_status lk_tokenizer_decode(const lk_tokenizer *t, const int32_t *tokens, int64_t n, char **text, size_t *len);

/* Synthetic data computed from (seed, index) on demand (no memory), so any
 * rank can produce any sample. classification: "x" f32 [dim] drawn around
 * one of `classes` random centres (spread `noise`), "y" i64 class;
 * regression: "x" ~ N(0, 1)^dim, "y" f32 [out_dim] = W x + b + noise;
 * images: "x" f32 [1, h, w] smooth blobs in [0, 1], "y" i64 class. */
typedef enum { LK_SYNTH_CLASSIFICATION, LK_SYNTH_REGRESSION, LK_SYNTH_IMAGES } lk_synth_kind;
typedef struct lk_synthetic_config {
    lk_synth_kind kind;
    int64_t len;     /* samples (default 1024) */
    int64_t dim;     /* features (default 16); images: h = w = dim */
    int64_t classes; /* classification, images (default 4) */
    int64_t out_dim; /* regression (default 1) */
    float noise;     /* default 0.1 */
    uint64_t seed;
} lk_synthetic_config;
lk_synthetic_config lk_synthetic_config_default(void);
lk_status lk_dataset_synthetic_create(const lk_synthetic_config *cfg, lk_dataset **out);

/* ---- composition (the result holds a reference to `src`) ---------------- */

/* Samples src[indices[i]]; indices are copied and checked. */
lk_status lk_dataset_subset(lk_dataset *src, const int64_t *indices, int64_t n, lk_dataset **out);
/* Samples src[start, end). */
lk_status lk_dataset_range(lk_dataset *src, int64_t start, int64_t end, lk_dataset **out);
/* Splits a permutation keyed by `seed` into `nparts` disjoint subsets.
 * `sizes` are sample counts summing to len, or fractions summing to 1
 * (the remainder of rounding goes to the first parts, as in PyTorch). */
lk_status lk_dataset_random_split(lk_dataset *src, int nparts, const double *sizes, uint64_t seed,
                                  lk_dataset **outs);
/* The samples of srcs[0], then srcs[1], ... (PyTorch's ConcatDataset);
 * every source must have the same fields (dtype and shape; names from the
 * first). */
lk_status lk_dataset_concat(int n, lk_dataset *const *srcs, lk_dataset **out);
/* Picks, reorders or repeats fields: out field i = src field src_fields[i],
 * renamed names[i] when names is not NULL (an autoencoder reads ("x", "x")). */
lk_status lk_dataset_select(lk_dataset *src, int nfields, const int *src_fields, const char *const *names,
                            lk_dataset **out);

/* ------------------------------------------------------------------------
 * Transforms: a pipeline applied to one field of every sample as it is
 * read. Random ops draw from the Philox stream keyed by (seed, epoch,
 * sample index), so they are reproducible whatever the worker count, and
 * two fields mapped with the same seed see the same draws (paired flips
 * stay paired). Shapes are checked when the pipeline is attached.
 * ---------------------------------------------------------------------- */
typedef struct lk_transform lk_transform;
lk_status lk_transform_create(lk_transform **out);
void lk_transform_free(lk_transform *t);
/* Convert to another dtype (f32, f64, i32, i64, u8; floats to ints truncate). */
lk_status lk_transform_cast(lk_transform *t, lk_dtype dt);
/* x * mul + add (floating fields). */
lk_status lk_transform_scale(lk_transform *t, float mul, float add);
/* (x - mean[c]) / std[c] per channel c (dim 0 of a [C, ...] sample); n = 1
 * applies one mean/std to every element. */
lk_status lk_transform_normalize(lk_transform *t, int n, const float *mean, const float *std);
/* Same data, new per-sample shape (one dim may be -1). */
lk_status lk_transform_reshape(lk_transform *t, int ndim, const int64_t *shape);
/* Mirrors the last dim with probability p. */
lk_status lk_transform_random_hflip(lk_transform *t, float p);
/* Pads the last two dims by `pad` zeros on every side, then crops a random
 * h x w window (torchvision's RandomCrop(size, padding)). */
lk_status lk_transform_random_crop(lk_transform *t, int64_t h, int64_t w, int64_t pad);
/* Adds N(0, std^2) noise (denoising autoencoders). */
lk_status lk_transform_gaussian_noise(lk_transform *t, float std);
/* Clamps to [lo, hi]. */
lk_status lk_transform_clamp(lk_transform *t, float lo, float hi);

/* A dataset whose field `field` passes through `t` (copied: `t` may be
 * freed after). */
lk_status lk_dataset_map(lk_dataset *src, int field, const lk_transform *t, uint64_t seed, lk_dataset **out);

/* ------------------------------------------------------------------------
 * The distributed sampler: every rank computes the same permutation of
 * [0, n) from (seed, epoch) and takes every world_size-th index from
 * `rank` on. Without drop_last the permutation is padded by repeating its
 * start so every rank gets ceil(n / world) samples (as PyTorch's
 * DistributedSampler; note that the padding repeats samples, which skews
 * validation metrics slightly); with drop_last the tail is cut instead.
 * ---------------------------------------------------------------------- */
typedef struct lk_sampler_config {
    int64_t len; /* dataset length */
    int rank, world_size;
    bool shuffle;
    bool drop_last;
    uint64_t seed;
    bool no_pad; /* evaluation mode: neither pad nor cut; rank r takes positions
                    r, r + W, ... < len, so shards differ by at most one sample
                    and every sample is seen exactly once over all ranks */
} lk_sampler_config;
typedef struct lk_sampler lk_sampler;
lk_status lk_sampler_create(const lk_sampler_config *cfg, lk_sampler **out);
void lk_sampler_free(lk_sampler *s);
/* Recomputes the permutation for `epoch` (allocates nothing). */
void lk_sampler_set_epoch(lk_sampler *s, uint64_t epoch);
/* This rank's samples per epoch. */
int64_t lk_sampler_len(const lk_sampler *s);
/* This rank's indices for the current epoch (owned by the sampler). */
const int64_t *lk_sampler_indices(const lk_sampler *s);

/* ------------------------------------------------------------------------
 * The loader.
 * ---------------------------------------------------------------------- */

/* A batch: field f is fields[f] of the dataset with a leading batch dim.
 * Owned by the loader; valid until the next lk_loader_next/start/free
 * (with lk_loader_config.hold = h: until h more lk_loader_next calls). */
typedef struct lk_batch {
    int64_t index; /* batch number within the epoch */
    int64_t size;  /* samples (the last batch may be short) */
    uint64_t epoch;
    int nfields;
    lk_array field[LK_DATA_MAX_FIELDS];
    const int64_t *sample_index; /* [size] dataset indices of the samples */
} lk_batch;

/* Allocator for batch buffers: the CUDA backend passes one that returns
 * pinned host memory, so copies to the device are asynchronous. */
typedef void *(*lk_host_alloc_fn)(void *ctx, size_t bytes);
typedef void (*lk_host_free_fn)(void *ctx, void *p);

typedef struct lk_loader_config {
    int64_t batch_size; /* 1 */
    bool shuffle;       /* true */
    bool drop_last;     /* drop this rank's short last batch (false) */
    bool shard_drop_last; /* sampler: cut the tail rather than pad (false) */
    bool no_pad;        /* sampler evaluation mode: every sample exactly once, uneven shards (false) */
    uint64_t seed;      /* 0 */
    int rank, world_size; /* 0, 1 */
    int num_workers;    /* worker threads; 0 reads on the caller's thread (default 2) */
    int prefetch;       /* batches each worker may have ready ahead (2) */
    lk_host_alloc_fn alloc; /* NULL: lk_aligned_alloc */
    lk_host_free_fn free;
    void *alloc_ctx;
    /* Batches the caller holds at once (1): lk_loader_next releases the
     * batch taken `hold` calls before, so with 2 the previous batch stays
     * valid while the next is taken (the trainer's device prefetch copies
     * batch i + 1 while step i may still read batch i's host memory). */
    int hold;
} lk_loader_config;
lk_loader_config lk_loader_config_default(void);

typedef struct lk_loader lk_loader;
/* The loader holds a reference to `ds` and allocates every buffer here, so
 * iterating allocates nothing. Starts no thread until lk_loader_start. */
lk_status lk_loader_create(lk_dataset *ds, const lk_loader_config *cfg, lk_loader **out);
/* Stops the workers (waiting for the samples they are reading) and frees. */
void lk_loader_free(lk_loader *l);
/* Batches per epoch on this rank. */
int64_t lk_loader_len(const lk_loader *l);
/* Begins `epoch` at batch `start_batch` (resume mid-epoch: batch k of an
 * epoch is the same whether or not the epoch started at 0). */
lk_status lk_loader_start(lk_loader *l, uint64_t epoch, int64_t start_batch);
/* The next batch in order, or *out = NULL at the end of the epoch. A failed
 * read is returned here with its message and the batch named; the epoch
 * then stays failed until the next lk_loader_start. */
lk_status lk_loader_next(lk_loader *l, const lk_batch **out);
/* Seconds the caller spent waiting in lk_loader_next since the last start
 * (a data-bound training loop shows it here). */
double lk_loader_wait_seconds(const lk_loader *l);

/* ------------------------------------------------------------------------
 * Preparing data once: downloads and unpacking run on one rank per node
 * while the others wait, then everyone learns whether it worked.
 * ---------------------------------------------------------------------- */
typedef lk_status (*lk_prepare_fn)(void *ctx);
/* A collective the communicator provides: every rank passes its status;
 * each receives the largest (a barrier that also carries failure). */
typedef lk_status (*lk_status_reduce_fn)(void *ctx, int *status_inout);
/* Runs `prepare` on local rank 0 only, then calls `reduce` on every rank
 * (when not NULL). Ranks other than 0 return LK_STATUS_REMOTE when local
 * rank 0 failed; rank 0 returns its own error. */
lk_status lk_data_prepare(int local_rank, lk_prepare_fn prepare, void *ctx, lk_status_reduce_fn reduce,
                          void *reduce_ctx);

/* Downloads `url` to `dest` (temporary file + rename, so a half download is
 * never mistaken for data). A non-2xx answer is an error naming it.
 * `timeout_s` bounds the whole transfer (0: 300 s). Returns UNSUPPORTED
 * when lockstep was built without libcurl. */
lk_status lk_data_download(const char *url, const char *dest, long timeout_s);
/* The rank-0 download a prepare step wants: does nothing when `dest` exists
 * and matches `sha256_hex` (64 hex digits, or NULL: no check); otherwise
 * downloads into "<dest>.part", verifies the SHA-256 and renames it into
 * place. A checksum mismatch or a transfer that breaks off is an error, and
 * nothing is left at `dest` or in the .part file. */
lk_status lk_data_fetch(const char *url, const char *dest, const char *sha256_hex, long timeout_s);

/* SHA-256 (FIPS 180-4). */
typedef struct lk_sha256 {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t n;
} lk_sha256;
void lk_sha256_init(lk_sha256 *s);
void lk_sha256_update(lk_sha256 *s, const void *data, size_t len);
void lk_sha256_final(lk_sha256 *s, char hex[65]);
lk_status lk_sha256_file(const char *path, char hex[65]);

#ifdef __cplusplus
}
#endif
#endif
