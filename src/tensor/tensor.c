/* Tensors: the caching storage pool, creation, refcounts, autorelease
 * scopes, views, copies/casts between dtypes, and printing. Views of tensors
 * that require grad record themselves on the tape (see src/autograd). */
#include "lockstep/tensor.h"
#include "tensor/tensor_impl.h"
/* Fills and casts are typed ops on the tensor's device (LK_OP_FILL,
 * LK_OP_COPY), so they run wherever its backend runs. */
#include "backend/backend_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ---- dtypes ------------------------------------------------------------- */

/* ---- storage pool ----------------------------------------------------------
 * Training repeats the same shapes every step, so freed storage is cached by
 * its device and exact (rounded) capacity and handed out again: after the
 * first step nothing reaches the device's allocator. Memory comes from the
 * device layer (lockstep/device.h). One mutex: the data-parallel strategy
 * runs several replicas on threads.
 *
 * Exact-size classes keep whatever shapes were ever used (a last short
 * batch, validation's batch), which a GPU's fixed memory cannot afford: when
 * a device says it is out of memory, the pool returns that device's cached
 * blocks to it and asks once more, as PyTorch's caching allocator does,
 * before the error reaches the caller.
 *
 * Which cached block a request gets: on the host the one freed last (LIFO:
 * its lines are likely still in cache). On a device that is not
 * host-addressable, the one at the lowest address, as PyTorch's CUDA
 * allocator breaks ties between blocks of one size: then the block a
 * request gets depends on which blocks are cached, not on the order they
 * came back in, so a step that allocates and frees the same sizes in the
 * same order gets the same pointers as the step before it (a CUDA graph
 * replays the pointers it recorded). With LIFO, blocks freed in the order
 * they were taken come back reversed, and the pointers repeat only every
 * 2 or 4 steps (sealed_graph_ready measures both). The class keeps such
 * blocks sorted, highest address first, so the pop below stays O(1). */

struct lk_storage {
    void *data;
    size_t cap;
    atomic_int refcount;
    bool owned; /* false: wraps caller memory */
    bool flat;  /* a flat buffer other tensors view (lk_tensor_mark_flat_buffer) */
    lk_device device;
};

#define POOL_CLASSES 512
typedef struct {
    lk_device device;
    size_t cap;
    lk_storage **items;
    int n, max;
    bool by_address; /* a device's class: items sorted by address, descending (the lowest is popped) */
} pool_class;

static struct {
    pthread_mutex_t mu;
    pool_class classes[POOL_CLASSES];
    int nclasses;
    lk_pool_stats stats;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t pool_release(const lk_device *dev);

static size_t round_cap(size_t n) {
    if (n <= 4096) return (n + 63) & ~(size_t)63;
    return (n + 4095) & ~(size_t)4095;
}

static lk_storage *storage_alloc(lk_device dev, size_t nbytes) {
    size_t cap = round_cap(nbytes ? nbytes : 1);
    pthread_mutex_lock(&pool.mu);
    for (int i = 0; i < pool.nclasses; i++) {
        pool_class *c = &pool.classes[i];
        if (c->cap == cap && c->n > 0 && lk_device_equal(c->device, dev)) {
            lk_storage *s = c->items[--c->n];
            pool.stats.hits++;
            pool.stats.bytes_cached -= cap;
            pool.stats.bytes_live += cap;
            if (pool.stats.bytes_live > pool.stats.bytes_live_peak) pool.stats.bytes_live_peak = pool.stats.bytes_live;
            pthread_mutex_unlock(&pool.mu);
            atomic_store(&s->refcount, 1);
            s->flat = false;
            return s;
        }
    }
    pool.stats.misses++;
    pthread_mutex_unlock(&pool.mu);
    lk_storage *s = lk_malloc(sizeof *s);
    if (!s) return NULL;
    lk_status st = lk_device_alloc(dev, cap, &s->data);
    if (st == LK_STATUS_OUT_OF_MEMORY && pool_release(&dev)) {
        st = lk_device_alloc(dev, cap, &s->data);
        if (st == LK_STATUS_OUT_OF_MEMORY) { /* the device's own message, once: it names the bytes asked and free */
            char again[512];
            snprintf(again, sizeof again, "%s", lk_last_error());
            lk_error(st, "%s (after the storage pool gave the device back every block it had cached)", again);
        } else if (!st) {
            lk_clear_error(); /* the retry worked: the first failure is no one's business */
        }
    }
    if (st) {
        lk_free(s);
        return NULL;
    }
    s->cap = cap;
    s->owned = true;
    s->flat = false;
    s->device = dev;
    atomic_store(&s->refcount, 1);
    pthread_mutex_lock(&pool.mu);
    pool.stats.bytes_live += cap;
    if (pool.stats.bytes_live > pool.stats.bytes_live_peak) pool.stats.bytes_live_peak = pool.stats.bytes_live;
    pthread_mutex_unlock(&pool.mu);
    return s;
}

static void storage_release(lk_storage *s) {
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
    if (!s->owned) {
        lk_free(s);
        return;
    }
    pthread_mutex_lock(&pool.mu);
    pool.stats.bytes_live -= s->cap;
    pool_class *c = NULL;
    for (int i = 0; i < pool.nclasses; i++)
        if (pool.classes[i].cap == s->cap && lk_device_equal(pool.classes[i].device, s->device)) c = &pool.classes[i];
    if (!c && pool.nclasses < POOL_CLASSES) {
        c = &pool.classes[pool.nclasses++];
        c->cap = s->cap;
        c->device = s->device;
        c->by_address = !lk_device_is_host(s->device);
    }
    if (c && c->n == c->max) (void)lk_vec_reserve(c->items, c->max, c->n + 1, 8); /* failing: the storage is freed below */
    if (c && c->n < c->max) {
        if (c->by_address) {
            int at = c->n;
            while (at > 0 && (uintptr_t)c->items[at - 1]->data < (uintptr_t)s->data) at--;
            memmove(&c->items[at + 1], &c->items[at], (size_t)(c->n - at) * sizeof *c->items);
            c->items[at] = s;
            c->n++;
        } else {
            c->items[c->n++] = s;
        }
        pool.stats.bytes_cached += s->cap;
        pthread_mutex_unlock(&pool.mu);
        return;
    }
    pthread_mutex_unlock(&pool.mu);
    lk_device_free(s->device, s->data, s->cap);
    lk_free(s);
}

lk_pool_stats lk_pool_get_stats(void) {
    pthread_mutex_lock(&pool.mu);
    lk_pool_stats st = pool.stats;
    pthread_mutex_unlock(&pool.mu);
    return st;
}

size_t lk_pool_reset_peak(void) {
    pthread_mutex_lock(&pool.mu);
    size_t live = pool.stats.bytes_live_peak = pool.stats.bytes_live;
    pthread_mutex_unlock(&pool.mu);
    return live;
}

/* Frees the cached blocks of one device (NULL: of every device); returns
 * how many bytes went back. */
static size_t pool_release(const lk_device *dev) {
    size_t freed = 0;
    pthread_mutex_lock(&pool.mu);
    for (int i = 0; i < pool.nclasses; i++) {
        pool_class *c = &pool.classes[i];
        if (dev && !lk_device_equal(c->device, *dev)) continue;
        for (int j = 0; j < c->n; j++) {
            lk_device_free(c->device, c->items[j]->data, c->cap);
            lk_free(c->items[j]);
        }
        freed += (size_t)c->n * c->cap;
        c->n = 0;
    }
    pool.stats.bytes_cached -= freed;
    if (dev && freed) pool.stats.oom_releases++;
    pthread_mutex_unlock(&pool.mu);
    return freed;
}

void lk_pool_trim(void) { (void)pool_release(NULL); }

void *lk__storage_data(const lk_storage *s) { return s->data; }
size_t lk__storage_cap(const lk_storage *s) { return s->cap; }

/* ---- tensor headers ------- */
static void set_contiguous_strides(lk_tensor *t);
/* ------------------------------------------------------- */

static pthread_mutex_t hdr_mu = PTHREAD_MUTEX_INITIALIZER;
static lk_tensor *hdr_free; /* free list linked through ->grad */

static lk_tensor *hdr_alloc(void) {
    pthread_mutex_lock(&hdr_mu);
    lk_tensor *t = hdr_free;
    if (t) hdr_free = t->grad;
    pthread_mutex_unlock(&hdr_mu);
    if (!t) t = lk_malloc(sizeof *t);
    if (t) memset(t, 0, sizeof *t);
    return t;
}

static void hdr_free_one(lk_tensor *t) {
    pthread_mutex_lock(&hdr_mu);
    t->grad = hdr_free;
    hdr_free = t;
    pthread_mutex_unlock(&hdr_mu);
}

static void set_contiguous_strides(lk_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

static lk_status check_shape(int ndim, const int64_t *shape, int64_t *numel) {
    if (ndim < 0 || ndim > LK_MAX_DIMS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tensor rank %d out of range (0..%d)", ndim, LK_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "negative size %lld in dimension %d", (long long)shape[i], i);
        if (shape[i] && n > INT64_MAX / shape[i])
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "tensor shape overflows int64");
        n *= shape[i];
    }
    *numel = n;
    return LK_STATUS_OK;
}

/* A zeroed header for a tensor of that dtype and shape (both checked), or
 * NULL with the error set; *numel its element count. */
static lk_tensor *new_header(lk_dtype dt, int ndim, const int64_t *shape, int64_t *numel) {
    if ((unsigned)dt >= LK_DTYPE_COUNT) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "invalid dtype %d", (int)dt);
        return NULL;
    }
    if (check_shape(ndim, shape, numel)) return NULL;
    return hdr_alloc();
}

/* A fresh header over the whole of `s`, contiguous, one reference (s
 * NULL: a deferred tensor's, with no storage, on dev). */
static void fill_contiguous(lk_tensor *t, lk_device dev, lk_dtype dt, int ndim, const int64_t *shape, int64_t numel,
                            lk_storage *s) {
    t->dtype = dt;
    t->device = s ? s->device : dev;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    set_contiguous_strides(t);
    t->numel = numel;
    t->storage = s;
    t->data = s ? s->data : NULL;
    t->refcount = 1;
}

lk_tensor *lk__tensor_new_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape) {
    int64_t numel = 0;
    lk_tensor *t = new_header(dt, ndim, shape, &numel);
    if (!t) return NULL;
    t->storage = storage_alloc(dev, (size_t)numel * lk_dtype_size(dt));
    if (!t->storage) {
        hdr_free_one(t);
        if (lk_last_status() == LK_STATUS_OUT_OF_MEMORY) { /* a refusal by the memory limit names the tensor */
            char dims[160] = "";
            size_t at = 0;
            for (int i = 0; i < ndim && at < sizeof dims; i++)
                at += (size_t)snprintf(dims + at, sizeof dims - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
            lk__alloc_oom_for("a %s tensor of shape [%s]", lk_dtype_name(dt), dims);
        }
        return NULL;
    }
    fill_contiguous(t, dev, dt, ndim, shape, numel, t->storage);
    return t;
}

lk_tensor *lk__tensor_view(lk_tensor *base, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset) {
    if (lk__tensor_check_data(base, "view")) return NULL;
    lk_tensor *t = hdr_alloc();
    if (!t) return NULL;
    t->dtype = base->dtype;
    t->device = base->device;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= shape[i];
    }
    if (stride)
        for (int i = 0; i < ndim; i++) t->stride[i] = stride[i];
    else
        set_contiguous_strides(t);
    t->offset = offset;
    t->storage = base->storage;
    atomic_fetch_add(&base->storage->refcount, 1);
    t->data = (char *)base->storage->data + offset * (int64_t)lk_dtype_size(base->dtype);
    t->refcount = 1;
    return t;
}

/* ---- deferred initialisation ---------------------------------------------------
 * While a thread defers (a model built by lk_model_create_deferred), the
 * public constructors make tensors with a shape and no storage, as
 * PyTorch's meta device: the state of a dropped tensor (below), with its
 * fill value kept beside it, so lk__tensor_restore_storage gives it the
 * values its constructor (or a later lk_tensor_fill) meant. Ops, views and
 * copies of one are refused like a dropped tensor's; only the constructors
 * defer, so what an op makes from real tensors is real. */
static _Thread_local bool deferring;

bool lk__tensor_defer(bool on) {
    bool was = deferring;
    deferring = on;
    return was;
}

static lk_status dropped_note(const lk_tensor *t, const char *why, bool deferred, double fill);

static lk_tensor *deferred_new(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape, double fill) {
    int64_t numel = 0;
    lk_tensor *t = new_header(dt, ndim, shape, &numel);
    if (!t) return NULL;
    fill_contiguous(t, dev, dt, ndim, shape, numel, NULL);
    if (dropped_note(t, "it was made without storage (deferred initialisation: lk_layer_materialize gives the "
                     "model's tensors storage and values)", true, fill)) {
        hdr_free_one(t);
        return NULL;
    }
    return t;
}

/* The public constructors make their tensors on the default device (the
 * CPU unless set, as torch's default device); ops put their results on
 * their inputs' device through the _on forms. */
lk_tensor *lk_tensor_empty(lk_dtype dt, int ndim, const int64_t *shape) {
    if (deferring) return deferred_new(lk_device_default(), dt, ndim, shape, 0.0);
    return lk__tensor_new_on(lk_device_default(), dt, ndim, shape);
}

lk_tensor *lk__tensor_zeros_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape) {
    lk_tensor *t = lk__tensor_new_on(dev, dt, ndim, shape);
    if (t && lk_device_memset(t->device, t->data, 0, lk_tensor_nbytes(t))) {
        lk_tensor_release(t);
        return NULL;
    }
    return t;
}

lk_tensor *lk_tensor_zeros(lk_dtype dt, int ndim, const int64_t *shape) {
    if (deferring) return deferred_new(lk_device_default(), dt, ndim, shape, 0.0);
    return lk__tensor_zeros_on(lk_device_default(), dt, ndim, shape);
}

lk_tensor *lk__tensor_full_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape, double value) {
    lk_tensor *t = lk__tensor_new_on(dev, dt, ndim, shape);
    if (t && lk_tensor_fill(t, value)) {
        lk_tensor_release(t);
        return NULL;
    }
    return t;
}

lk_tensor *lk_tensor_full(lk_dtype dt, int ndim, const int64_t *shape, double value) {
    if (deferring) return deferred_new(lk_device_default(), dt, ndim, shape, value);
    return lk__tensor_full_on(lk_device_default(), dt, ndim, shape, value);
}

lk_tensor *lk_tensor_from_data(lk_dtype dt, int ndim, const int64_t *shape, const void *data) {
    lk_tensor *t = lk__tensor_new_on(lk_device_default(), dt, ndim, shape); /* values: never deferred */
    if (t && t->numel && lk_device_copy(t->device, t->data, LK_DEVICE_CPU, data, lk_tensor_nbytes(t))) {
        lk_tensor_release(t);
        return NULL;
    }
    return t;
}

lk_tensor *lk_tensor_wrap(lk_dtype dt, int ndim, const int64_t *shape, void *data) {
    return lk__tensor_wrap_on(LK_DEVICE_CPU, dt, ndim, shape, data);
}

lk_tensor *lk__tensor_wrap_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape, void *data) {
    int64_t numel = 0;
    if (check_shape(ndim, shape, &numel)) return NULL;
    lk_storage *s = lk_malloc(sizeof *s);
    if (!s) return NULL;
    s->data = data;
    s->cap = (size_t)numel * lk_dtype_size(dt);
    s->owned = false;
    s->flat = false;
    s->device = dev;
    atomic_store(&s->refcount, 1);
    lk_tensor *t = hdr_alloc();
    if (!t) {
        lk_free(s);
        return NULL;
    }
    fill_contiguous(t, dev, dt, ndim, shape, numel, s);
    return t;
}

bool lk__tensor_rebasable(const lk_tensor *t) {
    return t && t->refcount == 1 && t->storage && !t->storage->owned && !t->storage->flat && t->offset == 0 &&
           atomic_load(&t->storage->refcount) == 1;
}

void lk__tensor_rebase(lk_tensor *t, void *data) {
    t->storage->data = data;
    t->data = data;
}

lk_tensor *lk_tensor_scalar(float v) { return lk_tensor_from_data(LK_F32, 0, NULL, &v); }

/* Random values are drawn on the host (the one generator stream, whatever
 * the device) and copied once to a default device the CPU cannot address. */
static lk_tensor *random_tensor(lk_rng *rng, int ndim, const int64_t *shape, bool normal, float a, float b) {
    lk_device dev = lk_device_default();
    bool host = lk_device_is_host(dev);
    lk_tensor *h = lk__tensor_new_on(host ? dev : LK_DEVICE_CPU, LK_F32, ndim, shape);
    if (!h) return NULL;
    float *d = h->data;
    for (int64_t i = 0; i < h->numel; i++)
        d[i] = normal ? a + b * lk_rng_normal(rng) : a + (b - a) * lk_rng_uniform(rng);
    if (host) return h;
    lk_tensor *t = lk_tensor_to(h, dev);
    lk_tensor_release(h);
    return t;
}

lk_tensor *lk_tensor_rand(lk_rng *rng, int ndim, const int64_t *shape, float lo, float hi) {
    return random_tensor(rng, ndim, shape, false, lo, hi);
}

lk_tensor *lk_tensor_randn(lk_rng *rng, int ndim, const int64_t *shape, float mean, float std) {
    return random_tensor(rng, ndim, shape, true, mean, std);
}

/* ---- lifetime ------------------------------------------------------------------ */

lk_tensor *lk_tensor_retain(lk_tensor *t) {
    if (t) __atomic_fetch_add(&t->refcount, 1, __ATOMIC_RELAXED);
    return t;
}

static void dropped_forget(const lk_tensor *t);

void lk_tensor_release(lk_tensor *t) {
    if (!t || __atomic_fetch_sub(&t->refcount, 1, __ATOMIC_ACQ_REL) != 1) return;
    if (!t->storage) dropped_forget(t);
    storage_release(t->storage);
    lk_tensor_release(t->grad);
    lk_free(t->name);
    hdr_free_one(t);
}

/* ---- inspection ----------------------------------------------------------------- */

bool lk_tensor_is_contiguous(const lk_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool lk_tensor_same_shape(const lk_tensor *a, const lk_tensor *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

char *lk_shape_str(const lk_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

size_t lk_tensor_nbytes(const lk_tensor *t) { return (size_t)t->numel * lk_dtype_size(t->dtype); }

int64_t lk__elem_offset(const lk_tensor *t, int64_t i) {
    int64_t off = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t n = t->shape[d];
        off += (i % n) * t->stride[d];
        i /= n;
    }
    return off;
}

double lk_tensor_get(const lk_tensor *t, int64_t i) {
    if (lk__tensor_check_data(t, "lk_tensor_get")) return NAN;
    size_t es = lk_dtype_size(t->dtype);
    const char *p = (const char *)t->data + lk__elem_offset(t, i) * (int64_t)es;
    char raw[8];
    if (!lk_device_is_host(t->device)) { /* the element's bytes to the host first */
        if (lk_device_copy(LK_DEVICE_CPU, raw, t->device, p, es)) return NAN;
        p = raw;
    }
    double v = NAN; /* one element cast to f64 by the CPU backend's LK_OP_COPY */
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {t->dtype, LK_F64}};
    if (lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){(void *)p, &v})) return NAN;
    return v;
}

float lk_tensor_item(const lk_tensor *t) { return t && t->numel >= 1 ? (float)lk_tensor_get(t, 0) : NAN; }

void lk_tensor_print(const lk_tensor *t, const char *label, int max_elems) {
    char sh[128];
    printf("%s: %s %s", label ? label : "tensor", lk_dtype_name(t->dtype), lk_shape_str(t, sh, sizeof sh));
    printf(" {");
    int64_t n = t->numel < max_elems ? t->numel : max_elems;
    for (int64_t i = 0; i < n; i++) printf("%s%.6g", i ? ", " : "", lk_tensor_get(t, i));
    printf("%s}\n", n < t->numel ? ", ..." : "");
}

lk_status lk_tensor_set_name(lk_tensor *t, const char *name) {
    char *n = lk_strdup(name);
    if (!n) return LK_STATUS_OUT_OF_MEMORY;
    lk_free(t->name);
    t->name = n;
    return LK_STATUS_OK;
}

/* ---- copies and casts --------------------------------------------------------- */

lk_status lk_tensor_copy(lk_tensor *dst, const lk_tensor *src) {
    LK_TRY(lk__tensor_check_data(dst, "copy (destination)"));
    LK_TRY(lk__tensor_check_data(src, "copy (source)"));
    if (dst->numel != src->numel || (dst->ndim != src->ndim && dst->numel != 1)) {
        char a[128], b[128];
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "copy: destination shape %s does not match source shape %s",
                        lk_shape_str(dst, a, sizeof a), lk_shape_str(src, b, sizeof b));
    }
    bool dc = lk_tensor_is_contiguous(dst), sc = lk_tensor_is_contiguous(src);
    if (!dst->numel) return LK_STATUS_OK;
    if (dst->dtype == src->dtype && dc && sc) {
        if (dst->data == src->data) return LK_STATUS_OK;
        if (lk_device_is_host(dst->device) && lk_device_is_host(src->device)) { /* may overlap */
            memmove(dst->data, src->data, lk_tensor_nbytes(dst));
            return LK_STATUS_OK;
        }
        return lk_device_copy(dst->device, dst->data, src->device, src->data, lk_tensor_nbytes(dst));
    }
    if (!lk_device_equal(dst->device, src->device))
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "copy: a %s%s tensor into a %s%s one on another device: cast (or make contiguous) on one "
                        "device first, then copy", lk_dtype_name(src->dtype), sc ? "" : " strided",
                        lk_dtype_name(dst->dtype), dc ? "" : " strided");
    /* One descriptor walks both tensors in dst's shape; a copy between two
     * shapes of one size is element i to element i, as 1-d runs. */
    bool same_shape = dst->ndim == src->ndim;
    for (int k = 0; same_shape && k < dst->ndim; k++) same_shape = dst->shape[k] == src->shape[k];
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {src->dtype, dst->dtype}};
    if (same_shape && dst->numel != 1) {
        d.copy.ndim = dst->ndim;
        for (int k = 0; k < dst->ndim; k++)
            d.copy.shape[k] = dst->shape[k], d.copy.ss[k] = src->stride[k], d.copy.sd[k] = dst->stride[k];
        return lk__backend_run(dst->device, &d, (void *[]){src->data, dst->data});
    }
    d.copy.ndim = dst->numel == 1 ? 0 : 1;
    d.copy.shape[0] = dst->numel, d.copy.ss[0] = 1, d.copy.sd[0] = 1;
    if (sc && dc) return lk__backend_run(dst->device, &d, (void *[]){src->data, dst->data});
    /* Shapes differ and a side is strided: through contiguous copies. */
    lk_tensor *s = sc ? NULL : lk__tensor_new_on(src->device, src->dtype, src->ndim, src->shape);
    lk_tensor *t = dc ? NULL : lk__tensor_new_on(dst->device, dst->dtype, dst->ndim, dst->shape);
    lk_status st = (!sc && !s) || (!dc && !t) ? LK_STATUS_OUT_OF_MEMORY : LK_STATUS_OK;
    if (!st && s) st = lk_tensor_copy(s, src);
    if (!st) st = lk__backend_run(dst->device, &d, (void *[]){s ? s->data : src->data, t ? t->data : dst->data});
    if (!st && t) st = lk_tensor_copy(dst, t);
    lk_tensor_release(s);
    lk_tensor_release(t);
    return st;
}

lk_tensor *lk_tensor_cast(const lk_tensor *t, lk_dtype dt) {
    if (!t) return NULL;
    double fill;
    if (lk__tensor_is_deferred(t, &fill)) return deferred_new(t->device, dt, t->ndim, t->shape, fill);
    /* on t's device, as torch's t.to(dtype) and clone(): not the default
     * device, which would make a cast of a CPU tensor under a GPU default a
     * cross-device cast (refused), and a clone a silent move */
    lk_tensor *r = lk__tensor_new_on(t->device, dt, t->ndim, t->shape);
    if (r && lk_tensor_copy(r, t)) {
        lk_tensor_release(r);
        return NULL;
    }
    return r;
}

lk_tensor *lk_tensor_to(const lk_tensor *t, lk_device dev) {
    double fill;
    if (t && lk__tensor_is_deferred(t, &fill)) return deferred_new(dev, t->dtype, t->ndim, t->shape, fill);
    if (!t || lk__tensor_check_data(t, "lk_tensor_to")) return NULL;
    const lk_tensor *src = t;
    lk_tensor *tmp = NULL;
    if (!lk_tensor_is_contiguous(t)) { /* gather the view on its own device first (its backend's strided copy) */
        src = tmp = lk__tensor_new_on(t->device, t->dtype, t->ndim, t->shape);
        if (!tmp || lk_tensor_copy(tmp, t)) {
            lk_tensor_release(tmp);
            return NULL;
        }
    }
    lk_tensor *r = lk__tensor_new_on(dev, t->dtype, t->ndim, t->shape);
    if (r && lk_device_copy(dev, r->data, src->device, src->data, lk_tensor_nbytes(r))) {
        lk_tensor_release(r);
        r = NULL;
    }
    lk_tensor_release(tmp);
    return r;
}

lk_tensor *lk_tensor_clone(const lk_tensor *t) { return lk_tensor_cast(t, t ? t->dtype : LK_F32); }

lk_status lk__tensor_own_storage(lk_tensor *t) {
    lk_tensor *r = lk_tensor_clone(t);
    if (!r) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    lk_storage *old = t->storage; /* r is contiguous over all of its own storage: t takes it, r the old one */
    t->storage = r->storage, r->storage = old;
    t->data = r->data;
    t->offset = 0;
    set_contiguous_strides(t);
    lk_tensor_release(r);
    return LK_STATUS_OK;
}

lk_status lk__tensor_rehome(lk_tensor *t, lk_tensor *base, int64_t offset, bool copy_values) {
    lk_tensor *r = lk__tensor_view(base, t->ndim, t->shape, NULL, base->offset + offset);
    if (!r) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    if (copy_values && lk_tensor_copy(r, t)) {
        lk_tensor_release(r);
        return lk_last_status();
    }
    lk_storage *old = t->storage; /* as own_storage: t takes the view's storage, the view the old one */
    t->storage = r->storage, r->storage = old;
    t->device = r->device;
    t->data = r->data;
    t->offset = r->offset;
    set_contiguous_strides(t);
    lk_tensor_release(r);
    return LK_STATUS_OK;
}

lk_status lk__tensor_move_to(lk_tensor *t, lk_device dev) {
    if (lk_device_equal(t->device, dev)) return LK_STATUS_OK;
    if (!t->storage) { /* no values to move: it gets its storage on dev when restored */
        t->device = dev;
        return LK_STATUS_OK;
    }
    lk_tensor *r = lk_tensor_to(t, dev);
    if (!r) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    lk_storage *old = t->storage; /* as own_storage: t takes r's storage, r the old one */
    t->storage = r->storage, r->storage = old;
    t->device = dev;
    t->data = r->data;
    t->offset = 0;
    set_contiguous_strides(t);
    lk_tensor_release(r);
    return LK_STATUS_OK;
}

/* ---- storage given back ------------------------------------------------------
 * A tensor whose storage a strategy gave back (a pipeline stage's copy of
 * another stage's parameter) keeps its header, shape and identity (the
 * layers' slots and the net's names still reach it) with storage and data
 * NULL: the one state no constructor makes. Why it was dropped is kept
 * beside it, in a list keyed by the header, so that any access can say
 * which tensor and why instead of reading through a NULL pointer. */
static struct {
    pthread_mutex_t mu;
    struct dropped {
        const lk_tensor *t;
        char why[384];
        bool deferred; /* made without storage (deferred initialisation), not given back */
        double fill;   /* a deferred tensor's values once restored */
    } *items;
    int n, max;
} dropped = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* t's entry, or NULL (dropped.mu held). */
static struct dropped *dropped_find(const lk_tensor *t) {
    for (int i = 0; i < dropped.n; i++)
        if (dropped.items[i].t == t) return &dropped.items[i];
    return NULL;
}

/* t's entry, made or updated (a deferred tensor a strategy then gives to
 * another stage keeps its entry with the new why). */
static lk_status dropped_note(const lk_tensor *t, const char *why, bool deferred, double fill) {
    pthread_mutex_lock(&dropped.mu);
    struct dropped *d = dropped_find(t);
    if (!d && (dropped.n < dropped.max || !lk_vec_reserve(dropped.items, dropped.max, dropped.n + 1, 16)))
        d = &dropped.items[dropped.n++];
    if (d) {
        d->t = t;
        snprintf(d->why, sizeof d->why, "%s", why ? why : "its storage was given back");
        d->deferred = deferred;
        d->fill = fill;
    }
    pthread_mutex_unlock(&dropped.mu);
    return d ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
}

bool lk__tensor_is_deferred(const lk_tensor *t, double *fill) {
    if (!t || t->storage) return false;
    pthread_mutex_lock(&dropped.mu);
    const struct dropped *d = dropped_find(t);
    bool yes = d && d->deferred;
    if (yes && fill) *fill = d->fill;
    pthread_mutex_unlock(&dropped.mu);
    return yes;
}

/* A deferred tensor's fill value becomes `value` (lk_tensor_fill on one). */
static bool deferred_fill(const lk_tensor *t, double value) {
    pthread_mutex_lock(&dropped.mu);
    struct dropped *d = dropped_find(t);
    bool yes = d && d->deferred;
    if (yes) d->fill = value;
    pthread_mutex_unlock(&dropped.mu);
    return yes;
}

static void dropped_forget(const lk_tensor *t) {
    pthread_mutex_lock(&dropped.mu);
    struct dropped *d = dropped_find(t);
    if (d) *d = dropped.items[--dropped.n];
    pthread_mutex_unlock(&dropped.mu);
}

lk_status lk__tensor_drop_storage(lk_tensor *t, const char *why) {
    if (!t->storage && !lk__tensor_is_deferred(t, NULL)) return LK_STATUS_OK;
    LK_TRY(dropped_note(t, why, false, 0.0));
    if (!t->storage) return LK_STATUS_OK; /* deferred: it never had any, and now is another's */
    storage_release(t->storage);
    t->storage = NULL;
    t->data = NULL;
    t->offset = 0;
    set_contiguous_strides(t);
    return LK_STATUS_OK;
}

lk_status lk__tensor_restore_storage(lk_tensor *t) {
    if (t->storage) return LK_STATUS_OK;
    double fill = 0.0;
    (void)lk__tensor_is_deferred(t, &fill);
    lk_tensor *r = fill != 0.0 ? lk__tensor_full_on(t->device, t->dtype, t->ndim, t->shape, fill)
                               : lk__tensor_zeros_on(t->device, t->dtype, t->ndim, t->shape);
    if (!r) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    dropped_forget(t);
    t->storage = r->storage, r->storage = NULL; /* r's header goes, its storage stays with t */
    t->data = r->data;
    t->offset = 0;
    set_contiguous_strides(t);
    hdr_free_one(r);
    return LK_STATUS_OK;
}

bool lk_tensor_has_data(const lk_tensor *t) { return t && t->storage; }

void lk__tensor_hide(lk_tensor *t, lk__hidden *h) {
    h->storage = t->storage, h->data = t->data, h->offset = t->offset;
    memcpy(h->stride, t->stride, sizeof h->stride);
    t->storage = NULL, t->data = NULL;
}

void lk__tensor_unhide(lk_tensor *t, const lk__hidden *h) {
    t->storage = h->storage, t->data = h->data, t->offset = h->offset;
    memcpy(t->stride, h->stride, sizeof t->stride);
}

lk_status lk__tensor_check_data(const lk_tensor *t, const char *what) {
    if (!t || t->storage) return LK_STATUS_OK;
    char why[384] = "its storage was given back", sh[128];
    pthread_mutex_lock(&dropped.mu);
    const struct dropped *d = dropped_find(t);
    if (d) snprintf(why, sizeof why, "%s", d->why);
    pthread_mutex_unlock(&dropped.mu);
    return lk_error(LK_STATUS_INVALID_USAGE, "%s: %s%s%s %s holds no data on this rank: %s", what,
                    t->name ? "tensor '" : "a tensor", t->name ? t->name : "", t->name ? "'" : "",
                    lk_shape_str(t, sh, sizeof sh), why);
}

lk_status lk__scalars_begin(lk__scalars *s, lk_device dev, lk_dtype dt, int64_t n, void *host) {
    *s = (lk__scalars){NULL, host, lk_dtype_size(dt)};
    if (lk_device_is_host(dev)) return LK_STATUS_OK;
    s->dev = lk__tensor_new_on(dev, dt, 1, (int64_t[]){n > 0 ? n : 1});
    return s->dev ? LK_STATUS_OK : lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
}

void *lk__scalars_at(const lk__scalars *s, int64_t i) {
    return (char *)(s->dev ? s->dev->data : s->host) + i * (int64_t)s->elem;
}

lk_status lk__scalars_end(lk__scalars *s) {
    if (!s->dev) return LK_STATUS_OK;
    lk_status st = lk_device_copy(LK_DEVICE_CPU, s->host, s->dev->device, s->dev->data, lk_tensor_nbytes(s->dev));
    lk_tensor_release(s->dev);
    s->dev = NULL;
    return st;
}

lk_status lk_tensor_fill(lk_tensor *t, double value) {
    if (!t) return lk_error(LK_STATUS_INVALID_ARGUMENT, "fill: NULL tensor");
    if (!t->storage) return deferred_fill(t, value) ? LK_STATUS_OK : lk__tensor_check_data(t, "fill");
    lk_op_desc d = {.op = LK_OP_FILL, .dtype = {t->dtype}};
    d.fill.ndim = t->ndim;
    d.fill.value = value;
    for (int k = 0; k < t->ndim; k++) d.fill.shape[k] = t->shape[k], d.fill.sd[k] = t->stride[k];
    return lk__backend_run(t->device, &d, (void *[]){t->data});
}

void lk_tensor_mark_flat_buffer(lk_tensor *t) {
    if (t && t->storage) t->storage->flat = true;
}

bool lk_tensor_in_flat_buffer(const lk_tensor *t) { return t && t->storage && t->storage->flat; }

/* ---- host shadows (lk__host_shadow_set) ---------------------------------------- */

enum { SHADOW_MAX = 8 };
typedef struct {
    lk_tensor *dev; /* retained */
    const void *host, *owner;
    int field;
} host_shadow;
static _Thread_local host_shadow shadows[SHADOW_MAX];
static _Thread_local bool shadows_on;

void lk__host_shadow_clear(void) {
    for (int k = 0; k < SHADOW_MAX; k++) {
        lk_tensor_release(shadows[k].dev);
        shadows[k] = (host_shadow){0};
    }
}

void lk__host_shadows_on(bool on) {
    if (!on) lk__host_shadow_clear();
    shadows_on = on;
}

void lk__host_shadow_set(lk_tensor *dev, const void *host, const void *owner, int field) {
    if (!shadows_on || !dev || !host || lk_device_is_host(dev->device)) return;
    int slot = -1;
    for (int k = 0; k < SHADOW_MAX; k++) {
        if (shadows[k].dev && shadows[k].owner != owner) { /* another batch's: its host memory may be reused */
            lk__host_shadow_clear();
            slot = 0;
            break;
        }
        if (slot < 0 && (!shadows[k].dev || shadows[k].field == field)) slot = k;
    }
    if (slot < 0) return; /* full: the check reads the device instead */
    lk_tensor_release(shadows[slot].dev);
    shadows[slot] = (host_shadow){lk_tensor_retain(dev), host, owner, field};
}

lk_tensor *lk__tensor_host_shadow(const lk_tensor *t) {
    for (int k = 0; k < SHADOW_MAX; k++) {
        const lk_tensor *d = shadows[k].dev;
        if (d && d->data == t->data && d->dtype == t->dtype && lk_device_equal(d->device, t->device) &&
            d->numel == t->numel && lk_tensor_is_contiguous(t))
            return lk_tensor_wrap(t->dtype, t->ndim, t->shape, (void *)shadows[k].host);
    }
    return NULL;
}
