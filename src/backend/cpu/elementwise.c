/* The CPU backend's element-wise families: unary, unary backward, binary
 * with broadcast strides, axpy, affine (the scalar ops), sum-to-shape
 * (the reduction of a broadcast gradient), and dropout's mask and scaling.
 * The all-f32 loops are the ones the
 * autograd ops ran before the descriptors (same bits): the hot functions get
 * loops of their own so GCC vectorises them, the rest call the kernel bodies
 * of kernels.h. A descriptor with bf16 or f16 operands widens each operand
 * to an f32 scratch copy, runs the same f32 loop and rounds each output
 * element once (round to nearest even, lockstep/dtype.h): what a native
 * half-precision kernel that computes in f32 would produce. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"
#include "lockstep/dtype.h"

static void unary_f32(lk_unary_op op, int64_t n, const float *restrict x, float *restrict y, float alpha) {
    switch (op) { /* the hot ones get loops of their own, so they vectorise */
    case LK_UNARY_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        return;
    case LK_UNARY_NEG:
        for (int64_t i = 0; i < n; i++) y[i] = -x[i];
        return;
    case LK_UNARY_GELU_EXACT: /* blocks of 8: a fixed trip count vectorises at -O2 */
        for (int64_t i = 0; i < n - n % 8; i += 8)
            for (int l = 0; l < 8; l++) y[i + l] = x[i + l] * lk_k_normal_cdf(x[i + l]);
        for (int64_t i = n - n % 8; i < n; i++) y[i] = x[i] * lk_k_normal_cdf(x[i]);
        return;
    default:
        for (int64_t i = 0; i < n; i++) y[i] = lk_k_unary(op, x[i], alpha);
    }
}

static void unary_backward_f32(lk_unary_op op, int64_t n, const float *restrict x, const float *restrict y,
                               const float *restrict dy, float *restrict dx, float alpha, bool acc) {
    if (op == LK_UNARY_RELU) {
        if (acc)
            for (int64_t i = 0; i < n; i++) dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
        else
            for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
        return;
    }
    if (op == LK_UNARY_GELU_EXACT && x) { /* blocks of 8, as the forward; lk_k_unary_grad's formula */
        if (acc)
            for (int64_t i = 0; i < n - n % 8; i += 8)
                for (int l = 0; l < 8; l++) {
                    float v = x[i + l], pdf, cdf = lk_k_normal_cdf_pdf(v, &pdf);
                    dx[i + l] += dy[i + l] * (cdf + v * pdf);
                }
        else
            for (int64_t i = 0; i < n - n % 8; i += 8)
                for (int l = 0; l < 8; l++) {
                    float v = x[i + l], pdf, cdf = lk_k_normal_cdf_pdf(v, &pdf);
                    dx[i + l] = dy[i + l] * (cdf + v * pdf);
                }
        for (int64_t i = n - n % 8; i < n; i++) {
            float g = dy[i] * lk_k_unary_grad(LK_UNARY_GELU_EXACT, x[i], 0.0f, alpha);
            dx[i] = acc ? dx[i] + g : g;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float g = dy[i] * lk_k_unary_grad(op, x ? x[i] : 0.0f, y ? y[i] : 0.0f, alpha);
        dx[i] = acc ? dx[i] + g : g;
    }
}

/* Walks out's shape; the innermost dimension runs as a flat loop with the
 * inputs' own strides (1 or 0 in the common cases, which vectorise). */
static void binary_f32(lk_binary_op op, int ndim, const int64_t *shape, const float *a, const int64_t *sa,
                       const float *b, const int64_t *sb, float *out, bool relu) {
    if (ndim == 0) {
        out[0] = lk_k_binary(op, a[0], b[0]);
        if (relu) out[0] = out[0] > 0.0f ? out[0] : 0.0f;
        return;
    }
    int64_t inner = shape[ndim - 1], ia = sa[ndim - 1], ib = sb[ndim - 1];
    int64_t outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    int64_t idx[LK_MAX_DIMS] = {0};
    int64_t oa = 0, ob = 0;
    for (int64_t o = 0; o < outer; o++) {
        const float *pa = a + oa, *pb = b + ob;
        float *po = out + o * inner;
        if (ia == 1 && ib == 1) {
            switch (op) {
            case LK_BINARY_ADD: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] + pb[i]; break;
            case LK_BINARY_SUB: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] - pb[i]; break;
            case LK_BINARY_MUL: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] * pb[i]; break;
            case LK_BINARY_DIV: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] / pb[i]; break;
            }
        } else {
            for (int64_t i = 0; i < inner; i++) po[i] = lk_k_binary(op, pa[i * ia], pb[i * ib]);
        }
        /* the fused ReLU on the row just written, in cache (lk_binary_params.relu) */
        if (relu)
            for (int64_t i = 0; i < inner; i++) po[i] = po[i] > 0.0f ? po[i] : 0.0f;
        /* advance the outer multi-index */
        for (int d = ndim - 2; d >= 0; d--) {
            idx[d]++;
            oa += sa[d];
            ob += sb[d];
            if (idx[d] < shape[d]) break;
            oa -= sa[d] * shape[d];
            ob -= sb[d] * shape[d];
            idx[d] = 0;
        }
    }
}

static void axpy_f32(int64_t n, float alpha, const float *restrict x, float *restrict y) {
    if (alpha == 1.0f)
        for (int64_t i = 0; i < n; i++) y[i] += x[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

/* x and y may be the same array (in-place scaling), hence no restrict. The
 * two forms are kept apart because x * m + 0 turns -0 into +0, which the
 * scalar ops do (as PyTorch's add of a scalar does) and a plain scaling must
 * not. */
static void affine_f32(int64_t n, float mul, float add, bool has_add, const float *x, float *y) {
    if (has_add)
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * mul + add;
    else
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * mul;
}

/* dst[off(i)] += src[i], src contiguous over `shape`, off() from dst's
 * strides sd (0 on the summed dims); an innermost summed dim is added up in
 * a register first, in order. */
static void sum_to_f32(int ndim, const int64_t *shape, const float *src, const int64_t *sd, float *dst) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    int64_t inner = ndim ? shape[ndim - 1] : 1, inner_s = ndim ? sd[ndim - 1] : 0;
    int64_t idx[LK_MAX_DIMS] = {0}, off = 0;
    for (int64_t o = 0; o < numel / (inner ? inner : 1); o++) {
        const float *ps = src + o * inner;
        if (inner_s == 0) {
            float s = 0;
            for (int64_t i = 0; i < inner; i++) s += ps[i];
            dst[off] += s;
        } else {
            for (int64_t i = 0; i < inner; i++) dst[off + i] += ps[i];
        }
        for (int d = ndim - 2; d >= 0; d--) {
            idx[d]++;
            off += sd[d];
            if (idx[d] < shape[d]) break;
            off -= sd[d] * shape[d];
            idx[d] = 0;
        }
    }
}

#if !LK_ISA_VARIANT /* the baseline copy answers supports() */
static bool elem_dtype(lk_dtype t) { return t == LK_F32 || t == LK_BF16 || t == LK_F16; }

bool lk__cpu_elementwise_supports(const lk_op_desc *d) {
    int n = lk__op_arity(d->op);
    for (int i = 0; i < n; i++)
        if (!elem_dtype(d->dtype[i])) return false;
    switch (d->op) {
    case LK_OP_UNARY:
    case LK_OP_UNARY_BACKWARD: return d->unary.fn >= 0 && d->unary.fn < LK_UNARY_COUNT;
    case LK_OP_BINARY: return d->binary.ndim >= 0 && d->binary.ndim <= LK_MAX_DIMS;
    case LK_OP_SUM_TO: return d->sum_to.ndim >= 0 && d->sum_to.ndim <= LK_MAX_DIMS;
    case LK_OP_AXPY:
    case LK_OP_AFFINE: return true;
    default: return false;
    }
}
#endif

/* ---- bf16 / f16 operands ------------------------------------------------------ */

/* The elements an operand spans: 1 + sum (shape - 1) * stride (0 when empty). */
static int64_t span(int ndim, const int64_t *shape, const int64_t *st) {
    int64_t s = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) return 0;
        s += (shape[d] - 1) * st[d];
    }
    return s;
}

/* Operand i as f32: itself when it is f32, else a scratch copy (widened when
 * `load`; an output that is only written needs no load). */
typedef struct {
    float *buf[4];
} scratch;

static lk_status as_f32(const lk_op_desc *d, void *const *x, int i, int64_t n, bool load, scratch *s, float **out) {
    if (!x[i] || d->dtype[i] == LK_F32) {
        *out = x[i];
        return LK_STATUS_OK;
    }
    s->buf[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!s->buf[i])
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "cpu backend: no memory to widen %lld %s elements to f32",
                        (long long)n, lk_dtype_name(d->dtype[i]));
    /* the bulk conversion (F16C / AVX-512): f16's scalar one branches per
     * element, and a 16-mixed linear's bias gradient (an f16 dY of 65K
     * elements widened whole) spent 10% of an mlp step in it */
    if (load) lk_half_to_f32_n(d->dtype[i], s->buf[i], x[i], (size_t)n);
    *out = s->buf[i];
    return LK_STATUS_OK;
}

/* The ops over n contiguous elements (unary and its backward, axpy,
 * affine, a dense binary op) run in blocks: each 16-bit operand's block
 * widened into a stack buffer (an f32 one used in place), the f32 kernel,
 * the output block rounded back — no heap scratch and cache-resident, with
 * the same bits as widening whole arrays (each element is computed on its
 * own). A dense f32 binary op runs here too, as one flat array: walked by
 * its shape, a residual add of [64, 8, 28, 28] ran as 14336 rows of 28 (of
 * 7 at 7x7), at 16 GB/s in ResNet-20's step, and a fused ReLU's pass over
 * each block just written stays in L1. */
enum { LOWP_BLOCK = 1024 };

static void run_blocked(const lk_op_desc *d, void *const *x) {
    int arity = lk__op_arity(d->op);
    int64_t n = d->op == LK_OP_AXPY ? d->axpy.n : d->op == LK_OP_AFFINE ? d->affine.n : d->unary.n;
    if (d->op == LK_OP_BINARY) { /* dense (binary_dense): one flat run */
        n = 1;
        for (int k = 0; k < d->binary.ndim; k++) n *= d->binary.shape[k];
    }
    int out = d->op == LK_OP_UNARY_BACKWARD ? 3 : d->op == LK_OP_BINARY ? 2 : 1;
    const int64_t one = 1;
    bool out_read = d->op == LK_OP_AXPY || (d->op == LK_OP_UNARY_BACKWARD && d->unary.acc);
    float buf[4][LOWP_BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += LOWP_BLOCK) {
        int64_t m = n - i0 < LOWP_BLOCK ? n - i0 : LOWP_BLOCK;
        float *w[4] = {NULL};
        for (int k = 0; k < arity; k++) {
            if (!x[k]) continue;
            if (d->dtype[k] == LK_F32) {
                w[k] = (float *)x[k] + i0;
                continue;
            }
            w[k] = buf[k];
            if (k != out || out_read) lk_half_to_f32_n(d->dtype[k], buf[k], (const uint16_t *)x[k] + i0, (size_t)m);
        }
        switch (d->op) {
        case LK_OP_UNARY: unary_f32(d->unary.fn, m, w[0], w[1], d->unary.alpha); break;
        case LK_OP_UNARY_BACKWARD:
            unary_backward_f32(d->unary.fn, m, w[0], w[1], w[2], w[3], d->unary.alpha, d->unary.acc);
            break;
        case LK_OP_AXPY: axpy_f32(m, d->axpy.alpha, w[0], w[1]); break;
        case LK_OP_AFFINE: affine_f32(m, d->affine.mul, d->affine.add, d->affine.has_add, w[0], w[1]); break;
        case LK_OP_BINARY: binary_f32(d->binary.fn, 1, &m, w[0], &one, w[1], &one, w[2], d->binary.relu); break;
        default: break;
        }
        if (d->dtype[out] != LK_F32) lk_f32_to_half_n(d->dtype[out], (uint16_t *)x[out] + i0, buf[out], (size_t)m);
    }
}

/* Whether both inputs of a binary op are laid out as its dense row-major
 * output (no broadcast, no transposition): then element i of each is
 * element i of the arrays. */
static bool binary_dense(const lk_binary_params *b) {
    int64_t st = 1;
    for (int k = b->ndim - 1; k >= 0; k--) {
        if (b->shape[k] != 1 && (b->sa[k] != st || b->sb[k] != st)) return false;
        st *= b->shape[k];
    }
    return true;
}

static lk_status run_lowp(const lk_op_desc *d, void *const *x) {
    if (d->op == LK_OP_UNARY || d->op == LK_OP_UNARY_BACKWARD || d->op == LK_OP_AXPY || d->op == LK_OP_AFFINE) {
        run_blocked(d, x);
        return LK_STATUS_OK;
    }
    /* a dense binary op too: a 16-bit residual add of a bf16-mixed ResNet
     * widened whole arrays into malloc'd scratch, and the fresh pages'
     * faults and zeroing were 7% of the step; the same f32 operation per
     * element, so the same bits */
    if (d->op == LK_OP_BINARY && binary_dense(&d->binary)) {
        run_blocked(d, x);
        return LK_STATUS_OK;
    }
    scratch s = {{NULL}};
    float *w[4] = {NULL};
    int64_t n[4] = {0};
    int out = 1; /* the operand written */
    bool out_read = false;
    switch (d->op) {
    case LK_OP_UNARY: n[0] = n[1] = d->unary.n; break;
    case LK_OP_UNARY_BACKWARD:
        n[0] = n[1] = n[2] = n[3] = d->unary.n, out = 3, out_read = d->unary.acc;
        break;
    case LK_OP_BINARY: {
        const lk_binary_params *b = &d->binary;
        int64_t numel = 1;
        for (int k = 0; k < b->ndim; k++) numel *= b->shape[k];
        n[0] = span(b->ndim, b->shape, b->sa), n[1] = span(b->ndim, b->shape, b->sb), n[2] = numel;
        out = 2;
        break;
    }
    case LK_OP_AXPY: n[0] = n[1] = d->axpy.n, out_read = true; break;
    case LK_OP_AFFINE: n[0] = n[1] = d->affine.n; break;
    case LK_OP_SUM_TO: {
        const lk_sum_to_params *p = &d->sum_to;
        int64_t numel = 1;
        for (int k = 0; k < p->ndim; k++) numel *= p->shape[k];
        n[0] = numel, n[1] = numel ? span(p->ndim, p->shape, p->sd) : 0, out_read = true;
        break;
    }
    default: return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d is not element-wise", (int)d->op);
    }
    lk_status st = LK_STATUS_OK;
    int arity = lk__op_arity(d->op);
    for (int i = 0; i < arity && !st; i++) st = as_f32(d, x, i, n[i], i != out || out_read, &s, &w[i]);
    if (!st) {
        switch (d->op) {
        case LK_OP_UNARY: unary_f32(d->unary.fn, d->unary.n, w[0], w[1], d->unary.alpha); break;
        case LK_OP_UNARY_BACKWARD:
            unary_backward_f32(d->unary.fn, d->unary.n, w[0], w[1], w[2], w[3], d->unary.alpha, d->unary.acc);
            break;
        case LK_OP_BINARY:
            binary_f32(d->binary.fn, d->binary.ndim, d->binary.shape, w[0], d->binary.sa, w[1], d->binary.sb, w[2],
                       d->binary.relu);
            break;
        case LK_OP_AXPY: axpy_f32(d->axpy.n, d->axpy.alpha, w[0], w[1]); break;
        case LK_OP_AFFINE:
            affine_f32(d->affine.n, d->affine.mul, d->affine.add, d->affine.has_add, w[0], w[1]);
            break;
        case LK_OP_SUM_TO: sum_to_f32(d->sum_to.ndim, d->sum_to.shape, w[0], d->sum_to.sd, w[1]); break;
        default: break;
        }
        if (s.buf[out]) lk_f32_to_half_n(d->dtype[out], x[out], s.buf[out], (size_t)n[out]);
    }
    for (int i = 0; i < 4; i++) free(s.buf[i]);
    return st;
}

/* ReLU and its backward with every operand in one 16-bit dtype, on the
 * bits: max(x, 0) of a bf16/f16 value is that value or +0, so the widen,
 * f32 loop and rounding of run_lowp give exactly these bits: x itself when
 * 0 < x <= +inf (as bits: 0 < h <= top), else +0; backward passes dy where
 * x > 0 (a NaN dy quieted, as rounding its f32 widening does). One pass
 * instead of three: a bf16-mixed mlp step's ReLUs cost a third as much. */
static bool relu16(const lk_op_desc *d, void *const *x) {
    lk_dtype t = d->dtype[0];
    if (d->unary.fn != LK_UNARY_RELU || (t != LK_BF16 && t != LK_F16) || !x[0]) return false;
    const uint16_t top = t == LK_BF16 ? 0x7f80 : 0x7c00; /* +inf */
    const uint16_t *a = x[0];
    int64_t n = d->unary.n;
    if (d->op == LK_OP_UNARY) {
        if (d->dtype[1] != t) return false;
        uint16_t *y = x[1]; /* may be a itself */
        for (int64_t i = 0; i < n; i++) y[i] = (uint16_t)(a[i] - 1u) < top ? a[i] : 0;
        return true;
    }
    if (d->unary.acc || d->dtype[2] != t || d->dtype[3] != t) return false;
    const uint16_t *dy = x[2];
    uint16_t *dx = x[3];
    for (int64_t i = 0; i < n; i++) {
        uint16_t g = dy[i], q = t == LK_BF16 ? (uint16_t)(g | 0x40) : (uint16_t)((g & 0x8000) | 0x7e00);
        g = (uint16_t)(g & 0x7fff) > top ? q : g;
        dx[i] = (uint16_t)(a[i] - 1u) < top ? g : 0;
    }
    return true;
}

/* LK_OP_MASK_SCALE (dropout's y = x * (mask ? scale : 0)): f32, or a 16-bit
 * x and y widened a block at a time, scaled in f32 and rounded once. */
static lk_status mask_scale(const lk_op_desc *d, void *const *x) {
    const float *xd = x[0];
    const uint8_t *m = x[1];
    float *y = x[2], s = d->mask_scale.scale;
    if (d->dtype[0] != LK_F32) {
        const uint16_t *xh = x[0];
        uint16_t *yh = x[2];
        enum { B = 256 }; /* a block widened and rounded through the bulk conversions */
        float v[B];
        for (int64_t i0 = 0; i0 < d->mask_scale.n; i0 += B) {
            int64_t n = d->mask_scale.n - i0 < B ? d->mask_scale.n - i0 : B;
            lk_half_to_f32_n(d->dtype[0], v, xh + i0, (size_t)n);
            for (int64_t i = 0; i < n; i++) v[i] = v[i] * (m[i0 + i] ? s : 0.0f);
            lk_f32_to_half_n(d->dtype[0], yh + i0, v, (size_t)n);
        }
        return LK_STATUS_OK;
    }
    for (int64_t i = 0; i < d->mask_scale.n; i++) y[i] = xd[i] * (m[i] ? s : 0.0f);
    return LK_STATUS_OK;
}

/* LK_OP_DROPOUT_MASK: the head words, then every Philox block in one call
 * of the shared body (its x8 groups: the speed of the host draw it replaced). */
static lk_status dropout_mask(const lk_dropout_mask_params *p, uint8_t *keep) {
    for (int i = 0; i < p->head_n; i++) keep[i] = lk_k_keep(p->head[i], p->thr);
    lk_k_dropout_mask_blocks(p->key, p->ctr, p->thr, keep + p->head_n, p->n - p->head_n);
    return LK_STATUS_OK;
}

lk_status LK_ISA(lk__cpu_elementwise)(const lk_op_desc *d, void *const *x) {
    if (d->op == LK_OP_MASK_SCALE) return mask_scale(d, x);
    if (d->op == LK_OP_DROPOUT_MASK) return dropout_mask(&d->dropout_mask, x[0]);
    int arity = lk__op_arity(d->op);
    for (int i = 0; i < arity; i++)
        if (d->dtype[i] != LK_F32) {
            if ((d->op == LK_OP_UNARY || d->op == LK_OP_UNARY_BACKWARD) && relu16(d, x)) return LK_STATUS_OK;
            return run_lowp(d, x);
        }
    switch (d->op) {
    case LK_OP_UNARY: unary_f32(d->unary.fn, d->unary.n, x[0], x[1], d->unary.alpha); break;
    case LK_OP_UNARY_BACKWARD:
        unary_backward_f32(d->unary.fn, d->unary.n, x[0], x[1], x[2], x[3], d->unary.alpha, d->unary.acc);
        break;
    case LK_OP_BINARY:
        if (binary_dense(&d->binary)) run_blocked(d, x);
        else
            binary_f32(d->binary.fn, d->binary.ndim, d->binary.shape, x[0], d->binary.sa, x[1], d->binary.sb, x[2],
                       d->binary.relu);
        break;
    case LK_OP_AXPY: axpy_f32(d->axpy.n, d->axpy.alpha, x[0], x[1]); break;
    case LK_OP_AFFINE: affine_f32(d->affine.n, d->affine.mul, d->affine.add, d->affine.has_add, x[0], x[1]); break;
    case LK_OP_SUM_TO: sum_to_f32(d->sum_to.ndim, d->sum_to.shape, x[0], d->sum_to.sd, x[1]); break;
    default: return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d is not element-wise", (int)d->op);
    }
    return LK_STATUS_OK;
}
