/* The CPU backend's strided copy (LK_OP_COPY), any dtype: bits move
 * unchanged. Adjacent dimensions that are contiguous in both source and
 * destination are merged first, so a contiguous copy is one memcpy and a
 * concat's slab is one memcpy per outer index; what stays strided in the
 * innermost dimension is copied element by element at its size. The
 * accumulating form (f32) adds instead, in the same walk. Between two
 * different float dtypes it casts (widen, round once): the convolution's
 * autocast rounding of its f32 columns is one. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

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

/* A cast between float dtypes (f32, bf16, f16), each element widened to f32
 * and rounded once to nearest even: the walk of the copy below, one element
 * at a time. */
static float load_any(lk_dtype t, const char *p, int64_t i) {
    if (t == LK_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == LK_BF16 ? lk_bf16_bits_to_f32(h) : lk_f16_bits_to_f32(h);
}

static void store_any(lk_dtype t, char *p, int64_t i, float v) {
    if (t == LK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == LK_BF16 ? lk_f32_to_bf16_bits(v) : lk_f32_to_f16_bits(v);
}

static lk_status cast_copy(const lk_op_desc *d, void *const *x) {
    const lk_copy_params *p = &d->copy;
    lk_dtype st = d->dtype[0], dt = d->dtype[1];
    int64_t shape[LK_MAX_DIMS], ss[LK_MAX_DIMS], sd[LK_MAX_DIMS];
    for (int k = 0; k < p->ndim; k++)
        if (p->shape[k] == 0) return LK_STATUS_OK;
    int nd = merge_dims(p, shape, ss, sd);
    if (nd == 0) {
        store_any(dt, x[1], 0, load_any(st, x[0], 0));
        return LK_STATUS_OK;
    }
    int64_t inner = shape[nd - 1], iss = ss[nd - 1], isd = sd[nd - 1], outer = 1;
    for (int k = 0; k < nd - 1; k++) outer *= shape[k];
    int64_t idx[LK_MAX_DIMS] = {0}, os = 0, od = 0;
    for (int64_t o = 0; o < outer; o++) {
        if (iss == 1 && isd == 1 && st == LK_F32) /* the common case: a contiguous run rounded to 16 bits */
            lk_f32_to_half_n(dt, (uint16_t *)x[1] + od, (const float *)x[0] + os, (size_t)inner);
        else if (iss == 1 && isd == 1 && dt == LK_F32)
            lk_half_to_f32_n(st, (float *)x[1] + od, (const uint16_t *)x[0] + os, (size_t)inner);
        else
            for (int64_t i = 0; i < inner; i++) store_any(dt, x[1], od + i * isd, load_any(st, x[0], os + i * iss));
        for (int k = nd - 2; k >= 0; k--) {
            os += ss[k], od += sd[k];
            if (++idx[k] < shape[k]) break;
            os -= ss[k] * shape[k], od -= sd[k] * shape[k];
            idx[k] = 0;
        }
    }
    return LK_STATUS_OK;
}

lk_status lk__cpu_copy(const lk_op_desc *d, void *const *x) {
    if (d->dtype[0] != d->dtype[1]) return cast_copy(d, x);
    const lk_copy_params *p = &d->copy;
    size_t es = lk_dtype_size(d->dtype[0]);
    const char *src = x[0];
    char *dst = x[1];
    for (int k = 0; k < p->ndim; k++)
        if (p->shape[k] == 0) return LK_STATUS_OK;
    int64_t shape[LK_MAX_DIMS], ss[LK_MAX_DIMS], sd[LK_MAX_DIMS];
    int nd = merge_dims(p, shape, ss, sd);
    if (nd == 0) { /* a scalar, or all sizes 1 */
        if (p->accumulate) *(float *)dst += *(const float *)src;
        else memcpy(dst, src, es);
        return LK_STATUS_OK;
    }
    int64_t inner = shape[nd - 1], iss = ss[nd - 1], isd = sd[nd - 1], outer = 1;
    for (int k = 0; k < nd - 1; k++) outer *= shape[k];
    int64_t idx[LK_MAX_DIMS] = {0}, os = 0, od = 0;
    for (int64_t o = 0; o < outer; o++) {
        const char *s = src + os * (int64_t)es;
        char *t = dst + od * (int64_t)es;
        if (p->accumulate) { /* f32 (supports): one add per element, row-major order */
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
