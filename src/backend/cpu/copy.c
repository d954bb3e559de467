/* The CPU backend's strided copies and casts (LK_OP_COPY) and fills
 * (LK_OP_FILL), any dtype. A same-dtype copy moves bits unchanged.
 * Adjacent dimensions that are contiguous in both source and destination
 * are merged first, so a contiguous copy is one memcpy (a contiguous f32 <->
 * bf16/f16 cast one bulk conversion) and a concat's slab is one memcpy per
 * outer index; what stays strided in the innermost dimension is copied
 * element by element. The accumulating form (f32) adds instead, in the
 * same walk. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

static bool is_int(lk_dtype dt) { return dt == LK_I32 || dt == LK_I64 || dt == LK_U8; }

static double load_f(lk_dtype dt, const char *p) {
    switch (dt) {
    case LK_F32: return *(const float *)p;
    case LK_F64: return *(const double *)p;
    case LK_BF16: return lk_bf16_to_f32(*(const uint16_t *)p);
    case LK_F16: return lk_f16_to_f32(*(const uint16_t *)p);
    case LK_I32: return *(const int32_t *)p;
    case LK_I64: return (double)*(const int64_t *)p;
    case LK_U8: return *(const uint8_t *)p;
    default: return 0;
    }
}

/* A float to an integer: C leaves a value outside the integer's range
 * undefined; here it saturates, and NaN gives 0 (a fill of 1e300 into an
 * f64 scalar used to compute such a cast on the way). */
static int64_t f_to_i64(double v) { return v != v ? 0 : v >= 0x1p63 ? INT64_MAX : v <= -0x1p63 ? INT64_MIN : (int64_t)v; }
static int32_t f_to_i32(double v) { return v != v ? 0 : v >= 0x1p31 ? INT32_MAX : v <= -0x1p31 ? INT32_MIN : (int32_t)v; }
static uint8_t f_to_u8(double v) { return v != v || v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v; }

static int64_t load_i(lk_dtype dt, const char *p) {
    switch (dt) {
    case LK_I32: return *(const int32_t *)p;
    case LK_I64: return *(const int64_t *)p;
    case LK_U8: return *(const uint8_t *)p;
    default: return f_to_i64(load_f(dt, p));
    }
}

static void store(lk_dtype dt, char *p, double v, int64_t iv, bool integer) {
    switch (dt) {
    case LK_F32: *(float *)p = integer ? (float)iv : (float)v; break;
    case LK_F64: *(double *)p = integer ? (double)iv : v; break;
    case LK_BF16: *(uint16_t *)p = lk_f32_to_bf16(integer ? (float)iv : (float)v); break;
    case LK_F16: *(uint16_t *)p = lk_f32_to_f16(integer ? (float)iv : (float)v); break;
    case LK_I32: *(int32_t *)p = integer ? (int32_t)iv : f_to_i32(v); break;
    case LK_I64: *(int64_t *)p = integer ? iv : f_to_i64(v); break;
    case LK_U8: *(uint8_t *)p = integer ? (uint8_t)iv : f_to_u8(v); break;
    default: break;
    }
}

/* n elements from s (dtype sdt, stride iss) to t (ddt, stride isd). */
static void cast_run(lk_dtype sdt, const char *s, int64_t iss, lk_dtype ddt, char *t, int64_t isd, int64_t n) {
    bool sh = sdt == LK_BF16 || sdt == LK_F16, dh = ddt == LK_BF16 || ddt == LK_F16;
    if (iss == 1 && isd == 1 && sdt == LK_F32 && dh) return lk_f32_to_half_n(ddt, (uint16_t *)t, (const float *)s, (size_t)n);
    if (iss == 1 && isd == 1 && sh && ddt == LK_F32) return lk_half_to_f32_n(sdt, (float *)t, (const uint16_t *)s, (size_t)n);
    size_t ss = lk_dtype_size(sdt), ds = lk_dtype_size(ddt);
    bool integer = is_int(sdt) && is_int(ddt);
    for (int64_t i = 0; i < n; i++) {
        const char *a = s + i * iss * (int64_t)ss;
        store(ddt, t + i * isd * (int64_t)ds, integer ? 0 : load_f(sdt, a), integer ? load_i(sdt, a) : 0, integer);
    }
}

/* Merges dimension k into k+1 wherever both sides step over k exactly as
 * over a whole run of k+1; drops size-1 dimensions. Returns the new rank. */
static int merge_dims(const lk_copy_params *p, int64_t *shape, int64_t *ss, int64_t *sd) {
    int nd = 0;
    for (int k = 0; k < p->ndim; k++) {
        if (p->shape[k] == 1) continue;
        if (nd > 0 && ss[nd - 1] == p->ss[k] * p->shape[k] && sd[nd - 1] == p->sd[k] * p->shape[k]) {
            shape[nd - 1] *= p->shape[k];
            ss[nd - 1] = p->ss[k];
            sd[nd - 1] = p->sd[k];
            continue;
        }
        shape[nd] = p->shape[k], ss[nd] = p->ss[k], sd[nd] = p->sd[k];
        nd++;
    }
    return nd;
}

lk_status LK_ISA(lk__cpu_copy)(const lk_op_desc *d, void *const *x) {
    const lk_copy_params *p = &d->copy;
    size_t es = lk_dtype_size(d->dtype[0]);
    bool cast = d->dtype[0] != d->dtype[1];
    const char *src = x[0];
    char *dst = x[1];
    for (int k = 0; k < p->ndim; k++)
        if (p->shape[k] == 0) return LK_STATUS_OK;
    int64_t shape[LK_MAX_DIMS], ss[LK_MAX_DIMS], sd[LK_MAX_DIMS];
    int nd = merge_dims(p, shape, ss, sd);
    if (nd == 0) { /* a scalar, or all sizes 1 */
        if (p->accumulate) *(float *)dst += *(const float *)src;
        else if (cast) cast_run(d->dtype[0], src, 1, d->dtype[1], dst, 1, 1);
        else memcpy(dst, src, es);
        return LK_STATUS_OK;
    }
    size_t ed = lk_dtype_size(d->dtype[1]);
    int64_t inner = shape[nd - 1], iss = ss[nd - 1], isd = sd[nd - 1], outer = 1;
    for (int k = 0; k < nd - 1; k++) outer *= shape[k];
    int64_t idx[LK_MAX_DIMS] = {0}, os = 0, od = 0;
    for (int64_t o = 0; o < outer; o++) {
        const char *s = src + os * (int64_t)es;
        char *t = dst + od * (int64_t)ed;
        if (cast) cast_run(d->dtype[0], s, iss, d->dtype[1], t, isd, inner);
        else if (p->accumulate) { /* f32 (supports): one add per element, row-major order */
            const float *fs = (const float *)s;
            float *ft = (float *)t;
            if (iss == 1 && isd == 1)
                for (int64_t i = 0; i < inner; i++) ft[i] += fs[i];
            else
                for (int64_t i = 0; i < inner; i++) ft[i * isd] += fs[i * iss];
        } else if (iss == 1 && isd == 1) memcpy(t, s, (size_t)inner * es);
        else if (es == 4)
            for (int64_t i = 0; i < inner; i++) memcpy(t + i * isd * 4, s + i * iss * 4, 4);
        else
            for (int64_t i = 0; i < inner; i++) memcpy(t + i * isd * (int64_t)es, s + i * iss * (int64_t)es, es);
        for (int k = nd - 2; k >= 0; k--) { /* the next outer multi-index, last dim fastest */
            os += ss[k], od += sd[k];
            if (++idx[k] < shape[k]) break;
            os -= ss[k] * shape[k], od -= sd[k] * shape[k];
            idx[k] = 0;
        }
    }
    return LK_STATUS_OK;
}

/* A contiguous fill, cut like the optimizer's flat update: after a step,
 * each thread zeroes the gradients it has just read (lk_strategy_zero_grad). */
typedef struct {
    char *dst;
    const char *one; /* the value in dst's dtype */
    size_t es;
    int64_t n;
    int width;
} fill_job;

static void fill_task(void *ctx, int t) {
    const fill_job *j = ctx;
    int64_t a, b;
    lk__task_range(j->n, t, j->width, 16, &a, &b);
    char *p = j->dst + a * (int64_t)j->es;
    static const char zero[8];
    if (!memcmp(j->one, zero, j->es)) {
        memset(p, 0, (size_t)(b - a) * j->es);
    } else if (j->es == 4) { /* a loop the compiler vectorises */
        uint32_t v, *f = (uint32_t *)p;
        memcpy(&v, j->one, 4);
        for (int64_t i = 0; i < b - a; i++) f[i] = v;
    } else {
        for (int64_t i = 0; i < b - a; i++) memcpy(p + i * (int64_t)j->es, j->one, j->es);
    }
}

lk_status LK_ISA(lk__cpu_fill)(const lk_op_desc *d, void *const *x) {
    const lk_fill_params *p = &d->fill;
    lk_dtype dt = d->dtype[0];
    size_t es = lk_dtype_size(dt);
    int64_t n = 1;
    bool contiguous = true;
    for (int k = p->ndim - 1; k >= 0; k--) {
        if (p->shape[k] != 1 && p->sd[k] != n) contiguous = false;
        n *= p->shape[k];
    }
    if (n == 0) return LK_STATUS_OK;
    char one[8];
    store(dt, one, p->value, 0, false); /* the value in dst's dtype, once */
    char *dst = x[0];
    if (contiguous) { /* the common case (zeroed gradients, new tensors): cut across the compute threads */
        fill_job j = {dst, one, es, n, lk__parallel_stream_width(n)};
        lk__parallel_run(j.width, fill_task, &j);
        return LK_STATUS_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0, r = i;
        if (contiguous) off = i;
        else
            for (int k = p->ndim - 1; k >= 0; k--) {
                off += (r % p->shape[k]) * p->sd[k];
                r /= p->shape[k];
            }
        memcpy(dst + off * (int64_t)es, one, es);
    }
    return LK_STATUS_OK;
}
