/* Per-sample transforms and the mapped dataset that applies them. A
 * pipeline is a list of ops; attaching it to a field (lk_dataset_map)
 * walks the ops once over the field's dtype and shape, so a bad pipeline
 * fails there, naming the op and the shape, rather than in a worker mid
 * epoch. Reading a sample then costs no allocation: the source writes the
 * field into the caller's scratch and the ops ping-pong between two
 * scratch buffers sized at attach time. Random ops draw, in op order, from
 * one Philox stream keyed by (seed, epoch, sample index). */
#include "data/data_internal.h"

#include <math.h>
#include <string.h>

#define MAX_CHANNELS 64

typedef enum { OP_CAST, OP_SCALE, OP_NORMALIZE, OP_RESHAPE, OP_HFLIP, OP_CROP, OP_NOISE, OP_CLAMP } op_kind;
static const char *const op_names[] = {"cast", "scale", "normalize", "reshape", "random_hflip", "random_crop",
                                       "gaussian_noise", "clamp"};

typedef struct {
    op_kind kind;
    lk_dtype dtype;                     /* cast */
    float a, b;                         /* scale: mul, add; clamp: lo, hi; hflip: p; noise: std */
    int n;                              /* normalize: channels; reshape: ndim */
    float mean[MAX_CHANNELS], inv_std[MAX_CHANNELS];
    int64_t shape[LK_MAX_DIMS];         /* reshape; crop: h, w, pad in [0..2] */
} op;

struct lk_transform {
    int nops, cap;
    op *ops;
};

lk_status lk_transform_create(lk_transform **out) {
    *out = lk_calloc(1, sizeof **out);
    return *out ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
}

void lk_transform_free(lk_transform *t) {
    if (!t) return;
    lk_free(t->ops);
    lk_free(t);
}

static lk_status push(lk_transform *t, const op *o) {
    if (t->nops == t->cap && lk_vec_reserve(t->ops, t->cap, t->nops + 1, 4))
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "transform: out of memory adding '%s'", op_names[o->kind]);
    t->ops[t->nops++] = *o;
    return LK_STATUS_OK;
}

lk_status lk_transform_cast(lk_transform *t, lk_dtype dt) {
    if (dt != LK_F32 && dt != LK_F64 && dt != LK_I32 && dt != LK_I64 && dt != LK_U8)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform cast: dtype %d, expected f32, f64, i32, i64 or u8", (int)dt);
    return push(t, &(op){.kind = OP_CAST, .dtype = dt});
}

lk_status lk_transform_scale(lk_transform *t, float mul, float add) {
    if (!isfinite(mul) || !isfinite(add))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform scale: mul %g, add %g must be finite", (double)mul,
                        (double)add);
    return push(t, &(op){.kind = OP_SCALE, .a = mul, .b = add});
}

lk_status lk_transform_normalize(lk_transform *t, int n, const float *mean, const float *std) {
    if (n < 1 || n > MAX_CHANNELS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform normalize: %d channels, expected 1..%d", n, MAX_CHANNELS);
    op o = {.kind = OP_NORMALIZE, .n = n};
    for (int c = 0; c < n; c++) {
        if (!(std[c] > 0) || !isfinite(std[c]) || !isfinite(mean[c]))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform normalize: channel %d has mean %g, std %g; expected "
                            "finite values and std > 0", c, (double)mean[c], (double)std[c]);
        o.mean[c] = mean[c];
        o.inv_std[c] = 1.0f / std[c];
    }
    return push(t, &o);
}

lk_status lk_transform_reshape(lk_transform *t, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > LK_MAX_DIMS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform reshape: %d dims, expected 0..%d", ndim, LK_MAX_DIMS);
    op o = {.kind = OP_RESHAPE, .n = ndim};
    int infer = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < -1 || (shape[i] == -1 && ++infer > 1))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform reshape: dim %d is %lld; expected >= 0, or -1 once",
                            i, (long long)shape[i]);
        o.shape[i] = shape[i];
    }
    return push(t, &o);
}

lk_status lk_transform_random_hflip(lk_transform *t, float p) {
    if (!(p >= 0 && p <= 1))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform random_hflip: p = %g, expected 0..1", (double)p);
    return push(t, &(op){.kind = OP_HFLIP, .a = p});
}

lk_status lk_transform_random_crop(lk_transform *t, int64_t h, int64_t w, int64_t pad) {
    if (h < 1 || w < 1 || pad < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform random_crop: %lld x %lld with padding %lld; expected "
                        "sizes >= 1 and padding >= 0", (long long)h, (long long)w, (long long)pad);
    return push(t, &(op){.kind = OP_CROP, .shape = {h, w, pad}});
}

lk_status lk_transform_gaussian_noise(lk_transform *t, float std) {
    if (!(std >= 0) || !isfinite(std))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform gaussian_noise: std %g, expected >= 0", (double)std);
    return push(t, &(op){.kind = OP_NOISE, .a = std});
}

lk_status lk_transform_clamp(lk_transform *t, float lo, float hi) {
    if (!(lo <= hi)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform clamp: lo %g > hi %g", (double)lo, (double)hi);
    return push(t, &(op){.kind = OP_CLAMP, .a = lo, .b = hi});
}

/* ---- the mapped dataset --------------------------------------------------- */

typedef struct {
    lk_dataset *src;
    int field;
    int nops;
    op *ops;
    lk_field in[64 + 1]; /* field before op i (in[nops] is the result); sized at attach */
    size_t src_scratch, buf_bytes;
    uint64_t seed;
} map_ctx;

#define MAX_OPS 64

static double load(const void *p, lk_dtype dt, int64_t i) {
    switch (dt) {
    case LK_F32: return ((const float *)p)[i];
    case LK_F64: return ((const double *)p)[i];
    case LK_I32: return ((const int32_t *)p)[i];
    case LK_I64: return (double)((const int64_t *)p)[i];
    case LK_U8: return ((const uint8_t *)p)[i];
    default: return 0;
    }
}

static void store(void *p, lk_dtype dt, int64_t i, double v) {
    switch (dt) {
    case LK_F32: ((float *)p)[i] = (float)v; break;
    case LK_F64: ((double *)p)[i] = v; break;
    case LK_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case LK_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case LK_U8: ((uint8_t *)p)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    default: break;
    }
}

/* Applies op `o` to `src` (described by `in`); writes `dst` (described by
 * `outf`) and returns true, or works in place and returns false. */
static bool apply(const op *o, const lk_field *in, const lk_field *outf, void *src, void *dst, lk_rng *r) {
    int64_t n = lk__shape_numel(in->ndim, in->shape);
    size_t es = lk_data_dtype_size(in->dtype);
    switch (o->kind) {
    case OP_CAST:
        if (in->dtype == LK_U8 && o->dtype == LK_F32) { /* the common case, kept tight */
            const uint8_t *s = src;
            float *d = dst;
            for (int64_t i = 0; i < n; i++) d[i] = (float)s[i];
        } else {
            for (int64_t i = 0; i < n; i++) store(dst, o->dtype, i, load(src, in->dtype, i));
        }
        return true;
    case OP_SCALE: {
        float *x = src;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] * o->a + o->b;
        return false;
    }
    case OP_NORMALIZE: {
        float *x = src;
        int64_t per = o->n == 1 ? n : n / in->shape[0];
        for (int c = 0; c < o->n; c++)
            for (int64_t i = 0; i < per; i++) x[c * per + i] = (x[c * per + i] - o->mean[c]) * o->inv_std[c];
        return false;
    }
    case OP_RESHAPE: return false;
    case OP_HFLIP: {
        if (!lk_rng_bernoulli(r, o->a)) return false;
        int64_t w = in->shape[in->ndim - 1], rows = w ? n / w : 0;
        /* Typed swaps: a memcpy per element of runtime size costs 5x more. */
#define LK__FLIP_ROWS(T)                                               \
    for (int64_t row = 0; row < rows; row++) {                         \
        T *p = (T *)src + row * w;                                     \
        for (int64_t a = 0, b = w - 1; a < b; a++, b--) {              \
            T t_ = p[a];                                               \
            p[a] = p[b];                                               \
            p[b] = t_;                                                 \
        }                                                              \
    }
        if (es == 1) LK__FLIP_ROWS(uint8_t)
        else if (es == 2) LK__FLIP_ROWS(uint16_t)
        else if (es == 4) LK__FLIP_ROWS(uint32_t)
        else LK__FLIP_ROWS(uint64_t)
#undef LK__FLIP_ROWS
        return false;
    }
    case OP_CROP: {
        int64_t h = o->shape[0], w = o->shape[1], pad = o->shape[2];
        int64_t H = in->shape[in->ndim - 2], W = in->shape[in->ndim - 1];
        int64_t oy = lk_rng_below(r, (uint32_t)(H + 2 * pad - h + 1)) - pad;
        int64_t ox = lk_rng_below(r, (uint32_t)(W + 2 * pad - w + 1)) - pad;
        int64_t planes = (H * W != 0) ? n / (H * W) : 0;
        (void)outf;
        for (int64_t pl = 0; pl < planes; pl++) {
            const uint8_t *s = (const uint8_t *)src + (size_t)(pl * H * W) * es;
            uint8_t *d = (uint8_t *)dst + (size_t)(pl * h * w) * es;
            for (int64_t i = 0; i < h; i++) {
                int64_t y = oy + i;
                uint8_t *drow = d + (size_t)(i * w) * es;
                if (y < 0 || y >= H) {
                    memset(drow, 0, (size_t)w * es);
                    continue;
                }
                int64_t x0 = ox < 0 ? -ox : 0, x1 = W - ox < w ? W - ox : w; /* valid [x0, x1) */
                if (x0 > w) x0 = w;
                if (x1 < x0) x1 = x0;
                memset(drow, 0, (size_t)x0 * es);
                memcpy(drow + x0 * es, s + (size_t)(y * W + ox + x0) * es, (size_t)(x1 - x0) * es);
                memset(drow + x1 * es, 0, (size_t)(w - x1) * es);
            }
        }
        return true;
    }
    case OP_NOISE: {
        float *x = src, z[256];
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            lk_rng_fill_normal(r, z, m, 0.0f, o->a);
            for (int64_t k = 0; k < m; k++) x[i + k] += z[k];
        }
        return false;
    }
    case OP_CLAMP: {
        float *x = src;
        for (int64_t i = 0; i < n; i++) x[i] = x[i] < o->a ? o->a : x[i] > o->b ? o->b : x[i];
        return false;
    }
    }
    return false;
}

static lk_status map_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const map_ctx *c = ctx;
    char *bufs[2] = {(char *)scratch + c->src_scratch, (char *)scratch + c->src_scratch + c->buf_bytes};
    void *src_out[LK_DATA_MAX_FIELDS];
    for (int f = 0; f < c->src->nfields; f++) src_out[f] = out[f];
    src_out[c->field] = bufs[0];
    LK_TRY(c->src->vt->get(c->src->ctx, index, epoch, scratch, src_out));
    lk_rng r;
    /* Index high bits go into the seed: counters carry only 2 x 32 bits. */
    lk_rng_init(&r, c->seed ^ (((uint64_t)index >> 32) * 0x9E3779B97F4A7C15ull), LK_RNG_AUGMENT, (uint32_t)epoch,
                (uint32_t)index);
    int cur = 0;
    for (int i = 0; i < c->nops; i++)
        if (apply(&c->ops[i], &c->in[i], &c->in[i + 1], bufs[cur], bufs[1 - cur], &r)) cur = 1 - cur;
    memcpy(out[c->field], bufs[cur], lk_field_nbytes(&c->in[c->nops]));
    return LK_STATUS_OK;
}

static void map_free(void *ctx) {
    map_ctx *c = ctx;
    lk_dataset_free(c->src);
    lk_free(c->ops);
    lk_free(c);
}

static void map_prefetch(void *ctx, int64_t index) { lk__dataset_prefetch(((const map_ctx *)ctx)->src, index); }

static const lk_dataset_vtable map_vt = {"map", map_get, map_free, map_prefetch};

/* The field after op `o`, or an error naming the op and the input. */
static lk_status infer(const op *o, int i, const lk_field *in, lk_field *out, const char *fname) {
    *out = *in;
    char sb[160];
    lk_data_shape_str(in->ndim, in->shape, sb, sizeof sb);
    bool needs_f32 = o->kind == OP_SCALE || o->kind == OP_NORMALIZE || o->kind == OP_NOISE || o->kind == OP_CLAMP;
    if (needs_f32 && in->dtype != LK_F32)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "transform op %d (%s) on field '%s': needs f32 data, the field is dtype %d here; add "
                        "cast(f32) first",
                        i, op_names[o->kind], fname, (int)in->dtype);
    if (o->kind == OP_CAST && !lk_data_dtype_size(in->dtype))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform op %d (cast) on field '%s': bad dtype", i, fname);
    if (o->kind == OP_CAST && (in->dtype == LK_F16 || in->dtype == LK_BF16))
        return lk_error(LK_STATUS_UNSUPPORTED, "transform op %d (cast) on field '%s': f16/bf16 sources are not supported",
                        i, fname);
    int64_t n = lk__shape_numel(in->ndim, in->shape);
    switch (o->kind) {
    case OP_CAST: out->dtype = o->dtype; break;
    case OP_NORMALIZE:
        if (o->n > 1 && (in->ndim < 1 || in->shape[0] != o->n))
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "transform op %d (normalize) on field '%s': %d means/stds but the sample shape is %s; "
                            "expected [%d, ...] (channels first) or one mean/std",
                            i, fname, o->n, sb, o->n);
        break;
    case OP_RESHAPE: {
        int64_t known = 1;
        int inf = -1;
        for (int d = 0; d < o->n; d++) {
            if (o->shape[d] == -1) inf = d;
            else known *= o->shape[d];
        }
        out->ndim = o->n;
        for (int d = 0; d < o->n; d++) out->shape[d] = o->shape[d];
        if (inf >= 0 && known > 0 && n % known == 0) out->shape[inf] = n / known;
        if (lk__shape_numel(out->ndim, out->shape) != n || (inf >= 0 && known == 0)) {
            char ob[160];
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "transform op %d (reshape) on field '%s': cannot view %s (%lld elements) as %s", i, fname,
                            sb, (long long)n, lk_data_shape_str(o->n, o->shape, ob, sizeof ob));
        }
        break;
    }
    case OP_HFLIP:
        if (in->ndim < 1)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "transform op %d (random_hflip) on field '%s': scalar samples",
                            i, fname);
        break;
    case OP_CROP: {
        int64_t h = o->shape[0], w = o->shape[1], pad = o->shape[2];
        if (in->ndim < 2 || in->shape[in->ndim - 2] + 2 * pad < h || in->shape[in->ndim - 1] + 2 * pad < w ||
            in->shape[in->ndim - 2] + 2 * pad - h >= (int64_t)UINT32_MAX)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "transform op %d (random_crop %lldx%lld, padding %lld) on field '%s': sample shape %s; "
                            "expected [..., H, W] with H + 2*pad >= %lld and W + 2*pad >= %lld",
                            i, (long long)h, (long long)w, (long long)pad, fname, sb, (long long)h, (long long)w);
        out->shape[in->ndim - 2] = h;
        out->shape[in->ndim - 1] = w;
        break;
    }
    default: break;
    }
    return LK_STATUS_OK;
}

lk_status lk_dataset_map(lk_dataset *src, int field, const lk_transform *t, uint64_t seed, lk_dataset **out) {
    *out = NULL;
    if (field < 0 || field >= src->nfields)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "map over '%s': field %d does not exist (it has %d)",
                        lk_dataset_kind(src), field, src->nfields);
    if (t->nops > MAX_OPS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "map: %d transform ops, at most %d", t->nops, MAX_OPS);
    map_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    c->ops = lk_malloc((size_t)(t->nops ? t->nops : 1) * sizeof *c->ops);
    if (!c->ops) {
        lk_free(c);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    if (t->nops) memcpy(c->ops, t->ops, (size_t)t->nops * sizeof *c->ops);
    c->nops = t->nops;
    c->field = field;
    c->seed = seed;
    c->in[0] = src->fields[field];
    size_t maxb = lk_field_nbytes(&c->in[0]);
    for (int i = 0; i < t->nops; i++) {
        lk_status st = infer(&t->ops[i], i, &c->in[i], &c->in[i + 1], src->fields[field].name);
        if (st) {
            lk_free(c->ops);
            lk_free(c);
            return st;
        }
        size_t b = lk_field_nbytes(&c->in[i + 1]);
        if (b > maxb) maxb = b;
    }
    c->src_scratch = (src->scratch_bytes + LK_ALIGN - 1) & ~(size_t)(LK_ALIGN - 1);
    c->buf_bytes = maxb ? (maxb + LK_ALIGN - 1) & ~(size_t)(LK_ALIGN - 1) : LK_ALIGN; /* never NULL scratch */
    c->src = lk_dataset_retain(src);
    lk_field fields[LK_DATA_MAX_FIELDS];
    memcpy(fields, src->fields, (size_t)src->nfields * sizeof *fields);
    fields[field] = c->in[c->nops];
    return lk_dataset_create(&map_vt, c, src->len, src->nfields, fields, c->src_scratch + 2 * c->buf_bytes, out);
}
