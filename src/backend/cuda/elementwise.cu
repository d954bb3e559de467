/* The CUDA backend's element-wise families over the shared kernel bodies
 * (backend/kernels/elementwise.h): unary and its backward, broadcast binary,
 * axpy, affine, sum-to-shape, dropout's mask-scale, strided copy (and its
 * accumulating form) and clamp; dropout's keep mask (one thread per Philox
 * block, the words the host's stream would give) and the i64 increment.
 * Every float family's operand is f32, bf16 or f16 on its own (copy: any
 * dtype); each element is widened, computed in f32 with the CPU's
 * statements and rounded once into the output's dtype, so the f32
 * results are the CPU backend's bits wherever the body is plain arithmetic
 * (transcendentals differ by CUDA's libdevice ulps). One thread per output
 * element, grid-stride; sum-to gives each destination element one thread
 * that adds its sources in the CPU's order, so it is deterministic and
 * matches the CPU's sums. */
#include <string.h>

#include "backend/cuda/common.cuh"

namespace {

struct dts {
    int t[4];
};

__global__ void k_unary(int fn, int64_t n, const void *x, void *y, float alpha, dts dt) {
    LK_CU_FOR(i, n) lk_cu_st(y, dt.t[1], i, lk_k_unary(fn, lk_cu_ld(x, dt.t[0], i), alpha));
}

/* The CPU's relu backward selects dy (no multiply: dy * 0 would turn an
 * infinite dy into NaN); the rest multiply by the derivative. x or y may be
 * NULL when the derivative does not read it (0 is passed, as on the CPU). */
__global__ void k_unary_backward(int fn, int64_t n, const void *x, const void *y, const void *dy, void *dx, float alpha,
                                 bool acc, dts dt) {
    LK_CU_FOR(i, n) {
        float xi = x ? lk_cu_ld(x, dt.t[0], i) : 0.0f, g = lk_cu_ld(dy, dt.t[2], i);
        if (fn == LK_UNARY_RELU) g = xi > 0.0f ? g : 0.0f;
        else g = g * lk_k_unary_grad(fn, xi, y ? lk_cu_ld(y, dt.t[1], i) : 0.0f, alpha);
        lk_cu_st(dx, dt.t[3], i, acc ? lk_cu_ld(dx, dt.t[3], i) + g : g);
    }
}

__global__ void k_binary(lk_binary_params p, int64_t n, const void *a, const void *b, void *out, dts dt) {
    LK_CU_FOR(i, n) {
        int64_t oa = 0, ob = 0, r = i;
        for (int k = p.ndim - 1; k >= 0; k--) {
            int64_t ix = r % p.shape[k];
            r /= p.shape[k];
            oa += ix * p.sa[k], ob += ix * p.sb[k];
        }
        lk_cu_st(out, dt.t[2], i, lk_k_binary(p.fn, lk_cu_ld(a, dt.t[0], oa), lk_cu_ld(b, dt.t[1], ob)));
    }
}

__global__ void k_axpy(int64_t n, float alpha, const void *x, void *y, dts dt) {
    LK_CU_FOR(i, n) {
        float xi = lk_cu_ld(x, dt.t[0], i), yi = lk_cu_ld(y, dt.t[1], i);
        lk_cu_st(y, dt.t[1], i, alpha == 1.0f ? yi + xi : yi + alpha * xi);
    }
}

/* live: NULL, or the op's per-step mul and add in device memory (a graph
 * replays with new values), read over the by-value ones. */
__global__ void k_affine(int64_t n, float mul, float add, bool has_add, const void *x, void *y, dts dt,
                         const lk_affine_live *live) {
    if (live) mul = live->mul, add = live->add;
    LK_CU_FOR(i, n) {
        float xi = lk_cu_ld(x, dt.t[0], i);
        lk_cu_st(y, dt.t[1], i, has_add ? xi * mul + add : xi * mul);
    }
}

/* Sum-to: dims are "kept" (dst stride != 0) or summed. Thread t owns the
 * kept multi-index t (row-major over the kept dims) and adds its sources in
 * src's row-major order, starting from dst's value; when the innermost dim
 * is summed, each innermost run is first summed from 0 in a register, as the
 * CPU does. */
struct sum_geom {
    int ndim, nkept, nsum; /* nsum: summed dims other than an innermost summed one */
    int kept[LK_MAX_DIMS], summed[LK_MAX_DIMS];
    int64_t shape[LK_MAX_DIMS], sd[LK_MAX_DIMS], ss[LK_MAX_DIMS]; /* ss: src's contiguous strides */
    bool inner_summed;
    int64_t inner, inner_ss, outer_summed; /* the innermost summed run, product of the other summed dims */
};

__global__ void k_sum_to(sum_geom g, int64_t n_dst, const void *src, void *dst, dts dt) {
    LK_CU_FOR(t, n_dst) {
        int64_t r = t, doff = 0, sbase = 0;
        for (int q = g.nkept - 1; q >= 0; q--) {
            int k = g.kept[q];
            int64_t ix = r % g.shape[k];
            r /= g.shape[k];
            doff += ix * g.sd[k], sbase += ix * g.ss[k];
        }
        float acc = lk_cu_ld(dst, dt.t[1], doff);
        for (int64_t o = 0; o < g.outer_summed; o++) {
            int64_t rr = o, soff = sbase;
            for (int q = g.nsum - 1; q >= 0; q--) {
                int k = g.summed[q];
                int64_t ix = rr % g.shape[k];
                rr /= g.shape[k];
                soff += ix * g.ss[k];
            }
            if (g.inner_summed) {
                float s = 0.0f;
                for (int64_t i = 0; i < g.inner; i++) s += lk_cu_ld(src, dt.t[0], soff + i * g.inner_ss);
                acc += s;
            } else {
                acc += lk_cu_ld(src, dt.t[0], soff);
            }
        }
        lk_cu_st(dst, dt.t[1], doff, acc);
    }
}

__global__ void k_mask_scale(int64_t n, const void *x, const uint8_t *m, void *y, float s, dts dt) {
    LK_CU_FOR(i, n) lk_cu_st(y, dt.t[2], i, lk_cu_ld(x, dt.t[0], i) * (m[i] ? s : 0.0f));
}

/* LK_OP_DROPOUT_MASK: thread b draws Philox block b (the shared body), and
 * the thread of block 0 also writes the head words the host still buffered.
 * live: NULL, or the stream's place (ctr, head, head_n) in device memory,
 * read over p's; the grid is then the largest any head_n needs (head_n 0)
 * and the block count follows the live head_n here. A head_n outside 0..3
 * (or past n) is clamped: a kernel cannot report it, and nothing is
 * written out of bounds. */
__global__ void k_dropout_mask(lk_dropout_mask_params p, int64_t nb, uint8_t *keep, const lk_dropout_mask_live *live) {
    if (live) {
        for (int i = 0; i < 4; i++) p.ctr[i] = live->ctr[i];
        for (int i = 0; i < 3; i++) p.head[i] = live->head[i];
        int h = live->head_n < 0 ? 0 : live->head_n > 3 ? 3 : live->head_n;
        p.head_n = h > p.n ? (int)p.n : h;
        nb = (p.n - p.head_n + 3) / 4;
    }
    LK_CU_FOR(b, nb > 0 ? nb : 1) {
        if (b == 0)
            for (int i = 0; i < p.head_n; i++) keep[i] = lk_k_keep(p.head[i], p.thr);
        if (b < nb) lk_k_dropout_mask_block(p.key, p.ctr, p.thr, b, keep + p.head_n, p.n - p.head_n);
    }
}

/* LK_OP_INCREMENT: x[i] += by, wrapping as the CPU's unsigned sum. */
__global__ void k_increment(int64_t n, int64_t by, int64_t *x) {
    LK_CU_FOR(i, n) x[i] = (int64_t)((uint64_t)x[i] + (uint64_t)by);
}

/* f32, or a bf16/f16 gradient widened, clamped in f32 and rounded once (as the CPU). */
__global__ void k_clamp(int64_t n, const void *x, void *y, int dt, float lo, float hi) {
    LK_CU_FOR(i, n) {
        float v = lk_cu_ld(x, dt, i);
        lk_cu_st(y, dt, i, v < lo ? lo : v > hi ? hi : v); /* NaN compares false: it stays */
    }
}

/* Element i (row-major over p.shape) of a strided copy: its source and
 * destination offsets. */
__device__ static inline void copy_offsets(const lk_copy_params &p, int64_t i, int64_t *os, int64_t *od) {
    int64_t s = 0, d = 0;
    for (int k = p.ndim - 1; k >= 0; k--) {
        int64_t ix = i % p.shape[k];
        i /= p.shape[k];
        s += ix * p.ss[k], d += ix * p.sd[k];
    }
    *os = s, *od = d;
}

/* Strided copy of es-byte elements (ACC: the f32 accumulating form, dst +=
 * src); `serial`: one thread walks every element in row-major order (a
 * destination that repeats elements, stride 0, where the CPU's order
 * decides the result). */
template <typename T, bool ACC>
__global__ void k_copy(lk_copy_params p, int64_t n, const T *src, T *dst, bool serial) {
    int64_t start = serial ? 0 : (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t step = serial ? 1 : (int64_t)gridDim.x * blockDim.x;
    if (serial && (blockIdx.x || threadIdx.x)) return;
    for (int64_t i = start; i < n; i += step) {
        int64_t os, od;
        copy_offsets(p, i, &os, &od);
        if (ACC) dst[od] += src[os];
        else dst[od] = src[os];
    }
}

/* A cast (lk_tensor_copy / lk_tensor_cast on the GPU) with copy.c's rules:
 * between f32, bf16 and f16 each element widened to f32 and rounded once;
 * between two integer dtypes the value converted as C converts it (i64 ->
 * i32 and -> u8 keep the low bits); otherwise through double, as the CPU's
 * load_f / store (an i64 -> f32 or f64 -> bf16 rounds twice there too, and
 * a float to an integer truncates toward zero; out of range or NaN that is
 * undefined in C, and the x86 CPU and the GPU give different integers).
 * `serial` as k_copy: a repeating destination gets the CPU's last write. */
__device__ static inline bool cast_is_int(int dt) { return dt == LK_I32 || dt == LK_I64 || dt == LK_U8; }

__device__ static inline double cast_load(const void *p, int dt, int64_t i) {
    switch (dt) {
    case LK_F64: return ((const double *)p)[i];
    case LK_I32: return ((const int32_t *)p)[i];
    case LK_I64: return (double)((const int64_t *)p)[i];
    case LK_U8: return ((const uint8_t *)p)[i];
    default: return lk_cu_ld(p, dt, i); /* f32, bf16, f16: exact in double */
    }
}

__device__ static inline int64_t cast_load_int(const void *p, int dt, int64_t i) {
    return dt == LK_I64 ? ((const int64_t *)p)[i] : dt == LK_I32 ? ((const int32_t *)p)[i] : ((const uint8_t *)p)[i];
}

__device__ static inline void cast_store(void *p, int dt, int64_t i, double v) {
    switch (dt) {
    case LK_F64: ((double *)p)[i] = v; break;
    case LK_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case LK_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case LK_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: lk_cu_st(p, dt, i, (float)v);
    }
}

__global__ void k_copy_cast(lk_copy_params p, int64_t n, const void *src, int sdt, void *dst, int ddt, bool serial) {
    int64_t start = serial ? 0 : (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t step = serial ? 1 : (int64_t)gridDim.x * blockDim.x;
    if (serial && (blockIdx.x || threadIdx.x)) return;
    bool halves = !cast_is_int(sdt) && sdt != LK_F64 && !cast_is_int(ddt) && ddt != LK_F64;
    bool ints = cast_is_int(sdt) && cast_is_int(ddt);
    for (int64_t i = start; i < n; i += step) {
        int64_t os, od;
        copy_offsets(p, i, &os, &od);
        if (halves) lk_cu_st(dst, ddt, od, lk_cu_ld(src, sdt, os));
        else if (!ints) cast_store(dst, ddt, od, cast_load(src, sdt, os));
        else {
            int64_t v = cast_load_int(src, sdt, os);
            if (ddt == LK_I64) ((int64_t *)dst)[od] = v;
            else if (ddt == LK_I32) ((int32_t *)dst)[od] = (int32_t)v;
            else ((uint8_t *)dst)[od] = (uint8_t)v;
        }
    }
}

/* LK_OP_FILL: `v` is the value already in the destination's dtype (the
 * CPU backend's conversion, done once on the host). */
template <typename T>
__global__ void k_fill(lk_fill_params p, int64_t n, T v, T *dst) {
    LK_CU_FOR(i, n) {
        int64_t od = 0, r = i;
        for (int k = p.ndim - 1; k >= 0; k--) {
            od += (r % p.shape[k]) * p.sd[k];
            r /= p.shape[k];
        }
        dst[od] = v;
    }
}

dts dtypes_of(const lk_op_desc *d) {
    dts t;
    for (int i = 0; i < 4; i++) t.t[i] = (int)d->dtype[i];
    return t;
}

int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int k = 0; k < ndim; k++) n *= shape[k];
    return n;
}

cudaError_t sum_to(const lk_op_desc *d, void *const *x) {
    const lk_sum_to_params *p = &d->sum_to;
    sum_geom g = {};
    g.ndim = p->ndim;
    int64_t s = 1, n_dst = 1;
    for (int k = p->ndim - 1; k >= 0; k--) {
        g.shape[k] = p->shape[k], g.sd[k] = p->sd[k], g.ss[k] = s;
        s *= p->shape[k];
    }
    if (s == 0) return cudaSuccess;
    /* the CPU sums an innermost run in a register when dst's innermost stride is 0 (also for a scalar) */
    g.inner_summed = p->ndim == 0 || p->sd[p->ndim - 1] == 0;
    g.inner = p->ndim ? p->shape[p->ndim - 1] : 1;
    g.inner_ss = 1;
    g.outer_summed = 1;
    int last = g.inner_summed && p->ndim ? p->ndim - 1 : p->ndim;
    for (int k = 0; k < p->ndim; k++) {
        if (p->sd[k] != 0) {
            g.kept[g.nkept++] = k;
            n_dst *= p->shape[k];
        } else if (k != last) {
            g.summed[g.nsum++] = k;
            g.outer_summed *= p->shape[k];
        }
    }
    k_sum_to<<<lk_cu_blocks(n_dst), LK_CU_THREADS, 0, lk_cu_stream()>>>(g, n_dst, x[0], x[1], dtypes_of(d));
    return cudaGetLastError();
}

cudaError_t copy(const lk_op_desc *d, void *const *x) {
    const lk_copy_params *p = &d->copy;
    int64_t n = numel_of(p->ndim, p->shape);
    if (n == 0) return cudaSuccess;
    bool serial = false; /* a destination stride of 0 over more than one element */
    for (int k = 0; k < p->ndim; k++) serial |= p->sd[k] == 0 && p->shape[k] > 1;
    unsigned blocks = serial ? 1 : lk_cu_blocks(n);
    if (p->accumulate) {
        k_copy<float, true><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, (const float *)x[0], (float *)x[1], serial);
        return cudaGetLastError();
    }
    if (d->dtype[0] != d->dtype[1]) {
        k_copy_cast<<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, x[0], (int)d->dtype[0], x[1], (int)d->dtype[1], serial);
        return cudaGetLastError();
    }
    switch (lk_dtype_size(d->dtype[0])) {
    case 1: k_copy<uint8_t, false><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, (const uint8_t *)x[0], (uint8_t *)x[1], serial); break;
    case 2: k_copy<uint16_t, false><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, (const uint16_t *)x[0], (uint16_t *)x[1], serial); break;
    case 4: k_copy<uint32_t, false><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, (const uint32_t *)x[0], (uint32_t *)x[1], serial); break;
    default: k_copy<uint64_t, false><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, (const uint64_t *)x[0], (uint64_t *)x[1], serial);
    }
    return cudaGetLastError();
}

cudaError_t fill(const lk_op_desc *d, void *const *x) {
    const lk_fill_params *p = &d->fill;
    int64_t n = numel_of(p->ndim, p->shape);
    if (n == 0) return cudaSuccess;
    /* the value in dst's dtype, converted as the CPU converts it: a
     * one-element f64 -> dtype cast run by the CPU backend on the host */
    double v = p->value;
    uint64_t bits = 0;
    lk_op_desc c = {};
    c.op = LK_OP_COPY;
    c.dtype[0] = LK_F64, c.dtype[1] = d->dtype[0];
    void *ops[2] = {&v, &bits};
    if (lk__cpu_backend.run(&c, ops)) return cudaErrorInvalidValue;
    unsigned blocks = lk_cu_blocks(n);
    switch (lk_dtype_size(d->dtype[0])) {
    case 1: k_fill<uint8_t><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, (uint8_t)bits, (uint8_t *)x[0]); break;
    case 2: {
        uint16_t h;
        memcpy(&h, &bits, 2);
        k_fill<uint16_t><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, h, (uint16_t *)x[0]);
        break;
    }
    case 4: {
        uint32_t w;
        memcpy(&w, &bits, 4);
        k_fill<uint32_t><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, w, (uint32_t *)x[0]);
        break;
    }
    default: k_fill<uint64_t><<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, n, bits, (uint64_t *)x[0]);
    }
    return cudaGetLastError();
}

} // namespace

extern "C" int lk__cuda_elementwise(const lk_op_desc *d, void *const *x) {
    LK_CU_REQUIRE_STREAM();
    dts dt = dtypes_of(d);
    switch (d->op) {
    case LK_OP_UNARY: {
        int64_t n = d->unary.n;
        if (n > 0) k_unary<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->unary.fn, n, x[0], x[1], d->unary.alpha, dt);
        break;
    }
    case LK_OP_UNARY_BACKWARD: {
        int64_t n = d->unary.n;
        if (n > 0)
            k_unary_backward<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->unary.fn, n, x[0], x[1], x[2], x[3],
                                                                  d->unary.alpha, d->unary.acc, dt);
        break;
    }
    case LK_OP_BINARY: {
        int64_t n = numel_of(d->binary.ndim, d->binary.shape);
        if (n > 0) k_binary<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->binary, n, x[0], x[1], x[2], dt);
        break;
    }
    case LK_OP_AXPY:
        if (d->axpy.n > 0) k_axpy<<<lk_cu_blocks(d->axpy.n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->axpy.n, d->axpy.alpha, x[0], x[1], dt);
        break;
    case LK_OP_AFFINE:
        if (d->affine.n > 0)
            k_affine<<<lk_cu_blocks(d->affine.n), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->affine.n, d->affine.mul, d->affine.add, d->affine.has_add, x[0], x[1], dt, (const lk_affine_live *)d->live);
        break;
    case LK_OP_SUM_TO: return (int)sum_to(d, x);
    case LK_OP_MASK_SCALE:
        if (d->mask_scale.n > 0)
            k_mask_scale<<<lk_cu_blocks(d->mask_scale.n), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->mask_scale.n, x[0], (const uint8_t *)x[1], x[2], d->mask_scale.scale, dt);
        break;
    case LK_OP_CLAMP:
        if (d->clamp.n > 0)
            k_clamp<<<lk_cu_blocks(d->clamp.n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->clamp.n, x[0], x[1], (int)d->dtype[0],
                                                                 d->clamp.lo, d->clamp.hi);
        break;
    case LK_OP_COPY: return (int)copy(d, x);
    case LK_OP_FILL: return (int)fill(d, x);
    case LK_OP_DROPOUT_MASK: {
        const lk_dropout_mask_params *p = &d->dropout_mask;
        /* with `live`, a geometry no live field changes: head_n 0's, the most blocks */
        int64_t nb = (p->n - (d->live ? 0 : p->head_n) + 3) / 4;
        if (p->n > 0)
            k_dropout_mask<<<lk_cu_blocks(nb), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, nb, (uint8_t *)x[0],
                                                                           (const lk_dropout_mask_live *)d->live);
        break;
    }
    case LK_OP_INCREMENT:
        if (d->increment.n > 0)
            k_increment<<<lk_cu_blocks(d->increment.n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->increment.n, d->increment.by, (int64_t *)x[0]);
        break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
