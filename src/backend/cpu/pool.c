/* The CPU backend's 2-D pooling, f32 (bf16/f16 widened per chunk of planes): max (with the i32 index of each
 * window's maximum, for backward), avg and adaptive avg, forward and
 * backward, one plane at a time over the plane kernels of kernels/conv.h.
 * Max pooling's forward, every backward and the 16-bit path give ranges of
 * whole planes to the compute threads once the input is about a megabyte. */
#include <math.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"

/* The 2x2, stride 2, unpadded window every window of which lies inside the
 * plane (the common max pool): one output row at a time, the four values of
 * each window read as two rows' even and odd columns, and PyTorch's loop
 * (row-major order; a value replaces the running maximum when greater or
 * NaN, so the first maximum and the last NaN win) spelled as four selects:
 * no branch and no inner loop per window (the plane kernel took ~10 ns per
 * window on the cnn); on AVX-512 16 windows at a time (below). The
 * same values and indices as lk_k_max_pool_plane, bit for bit
 * (backend_pool checks it). */
static bool max_pool_2x2(const lk_pool_params *g) {
    return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 && 2 * g->OH <= g->H &&
           2 * g->OW <= g->W;
}

#ifdef __AVX512F__
/* 16 windows of one output row: the row pair's 32 values of each input row
 * split into even and odd columns, then the four selects on whole vectors
 * (the scalar loop below, lane by lane). `n` < 16 masks the row's tail; the
 * masked-off lanes read nothing. ~2.5-5 ns per window took the cnn's rows of
 * 14 and 7 windows before: GCC did not vectorise the scalar loop over the
 * stride-2 loads. */
static void max_pool_2x2_16(const float *r0, const float *r1, long W, int base, long n, float *yo, int *io) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                  odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __mmask16 out = n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
    long in = 2 * n; /* values of each input row */
    __mmask16 lo = in >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << in) - 1),
              hi = in >= 32 ? (__mmask16)0xffff : in > 16 ? (__mmask16)((1u << (in - 16)) - 1) : 0;
    __m512 a0 = _mm512_maskz_loadu_ps(lo, r0), a1 = _mm512_maskz_loadu_ps(hi, r0 + 16);
    __m512 c0 = _mm512_maskz_loadu_ps(lo, r1), c1 = _mm512_maskz_loadu_ps(hi, r1 + 16);
    __m512 v[4] = {_mm512_permutex2var_ps(a0, even, a1), _mm512_permutex2var_ps(a0, odd, a1),
                   _mm512_permutex2var_ps(c0, even, c1), _mm512_permutex2var_ps(c0, odd, c1)};
    __m512i k = _mm512_add_epi32(_mm512_set1_epi32(base), _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8,
                                                                                               9, 10, 11, 12, 13, 14, 15), 1));
    const int off[4] = {0, 1, (int)W, (int)W + 1};
    __m512 m = _mm512_set1_ps(-INFINITY);
    __m512i mi = k;
    for (int j = 0; j < 4; j++) { /* greater, or NaN: the first maximum and the last NaN win */
        __mmask16 t = _mm512_cmp_ps_mask(v[j], m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v[j], v[j], _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(m, t, v[j]);
        mi = _mm512_mask_mov_epi32(mi, t, _mm512_add_epi32(k, _mm512_set1_epi32(off[j])));
    }
    _mm512_mask_storeu_ps(yo, out, m);
    _mm512_mask_storeu_epi32(io, out, mi);
}
#endif

static void max_pool_2x2_plane(const float *restrict x, long W, long OH, long OW, float *restrict y,
                               int *restrict idx) {
    for (long oh = 0; oh < OH; oh++) {
        const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
        float *yo = y + oh * OW;
        int *io = idx + oh * OW;
        int base = (int)(2 * oh * W);
        long ow = 0;
#ifdef __AVX512F__
        for (; ow < OW; ow += 16)
            max_pool_2x2_16(r0 + 2 * ow, r1 + 2 * ow, W, base + (int)(2 * ow), OW - ow, yo + ow, io + ow);
#endif
        for (; ow < OW; ow++) {
            float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
            int k = base + (int)(2 * ow);
            float m = -INFINITY;
            int mi = k;
            bool t = a > m || a != a;
            m = t ? a : m;
            t = b > m || b != b;
            m = t ? b : m, mi = t ? k + 1 : mi;
            t = c > m || c != c;
            m = t ? c : m, mi = t ? k + (int)W : mi;
            t = d > m || d != d;
            m = t ? d : m, mi = t ? k + (int)W + 1 : mi;
            yo[ow] = m;
            io[ow] = mi;
        }
    }
}

/* A range of planes on one compute thread: max pooling's forward, or any
 * pooling's backward (each plane's dx is its own). */
typedef struct {
    const lk_pool_params *g;
    bool forward;
    const float *in; /* x, or dy */
    float *out;      /* y, or dx */
    int *idx;        /* written forward, read backward */
    int width;
} pool_job;

static void pool_task(void *ctx, int t) {
    const pool_job *j = ctx;
    const lk_pool_params *g = j->g;
    long no = g->OH * g->OW, ni = g->H * g->W;
    int64_t c0, c1;
    lk__task_range(g->planes, t, j->width, 1, &c0, &c1);
    bool fast = max_pool_2x2(g);
    for (long c = c0; c < c1; c++) {
        if (j->forward) {
            if (fast) max_pool_2x2_plane(j->in + c * ni, g->W, g->OH, g->OW, j->out + c * no, j->idx + c * no);
            else
                lk_k_max_pool_plane(j->in + c * ni, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->OH,
                                    g->OW, j->out + c * no, j->idx + c * no);
            continue;
        }
        const float *dy = j->in + c * no;
        float *dx = j->out + c * ni;
        switch (g->kind) {
        case LK_POOL_MAX: lk_k_max_pool_backward_plane(dy, j->idx + c * no, no, dx); break;
        case LK_POOL_AVG:
            lk_k_avg_pool_backward_plane(dy, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                                         g->count_include_pad, g->OH, g->OW, dx);
            break;
        case LK_POOL_ADAPTIVE_AVG: lk_k_adaptive_avg_backward_plane(dy, g->H, g->W, g->OH, g->OW, dx); break;
        }
    }
}

static lk_status pool2d_f32(const lk_op_desc *d, void *const *x);

static size_t esize(lk_dtype t) { return t == LK_F32 || t == LK_I32 ? 4 : 2; }

/* bf16/f16 operands: chunks of whole planes through widen.c, about 128 KB of
 * f32 input-sized plane each, so the widened copies stay in the core's L2
 * (chunks of a megabyte made the bf16 cnn's pooling slower than f32's:
 * 2.34 against 1.77 ms forward, 5.83 against 3.61 ms backward, at
 * [256, 32, 28, 28] on one core); each plane's window sums and maxima are
 * f32, each output element rounded once. An input of about a megabyte or
 * more gives ranges of planes to the compute threads, each chunking its own
 * range with its own scratch. */
typedef struct {
    const lk_op_desc *d;
    void *const *x;
    long step, per[3];
    int width;
    lk_status st[LK__PARALLEL_MAX];
} pool_half_job;

static void pool_half_task(void *ctx, int t) {
    pool_half_job *j = ctx;
    const lk_op_desc *d = j->d;
    int64_t p0, p1;
    lk__task_range(d->pool.planes, t, j->width, 1, &p0, &p1);
    lk_status st = LK_STATUS_OK;
    for (int64_t c = p0; c < p1 && !st; c += j->step) {
        lk_op_desc part = *d;
        part.pool.planes = p1 - c < j->step ? p1 - c : j->step;
        void *ops[3];
        for (int i = 0; i < 3; i++)
            ops[i] = j->x[i] ? (char *)j->x[i] + (size_t)(c * j->per[i]) * esize(d->dtype[i]) : NULL;
        st = lk__cpu_run_widened(&part, ops, pool2d_f32);
    }
    j->st[t] = st;
}

static lk_status pool2d_half(const lk_op_desc *d, void *const *x) {
    const lk_pool_params *g = &d->pool;
    long no = g->OH * g->OW, ni = g->H * g->W;
    bool fwd = d->op == LK_OP_POOL2D;
    pool_half_job job = {d, x, ni > 0 && ni < (1 << 15) ? (1 << 15) / ni : 1,
                         /* elements per plane of each operand, in its own dtype */
                         {fwd ? ni : no, no, fwd ? no : ni},
                         g->planes * ni >= (1 << 18) ? lk__parallel_width(g->planes) : 1, {0}};
    lk__parallel_run(job.width, pool_half_task, &job);
    for (int t = 0; t < job.width; t++)
        if (job.st[t]) return lk_error(job.st[t], "cpu backend: 16-bit pooling of %ld planes of %ldx%ld failed (%s)",
                                       g->planes, g->H, g->W, lk_status_str(job.st[t]));
    return LK_STATUS_OK;
}

lk_status LK_ISA(lk__cpu_pool2d)(const lk_op_desc *d, void *const *x) {
    return lk__op_has_half(d) ? pool2d_half(d, x) : pool2d_f32(d, x);
}

static lk_status pool2d_f32(const lk_op_desc *d, void *const *x) {
    const lk_pool_params *g = &d->pool;
    long no = g->OH * g->OW, ni = g->H * g->W;
    if (d->op == LK_OP_POOL2D) {
        const float *xd = x[0];
        float *od = x[1];
        switch (g->kind) {
        case LK_POOL_MAX: {
            pool_job job = {g, true, xd, od, x[2], g->planes * ni >= (1 << 18) ? lk__parallel_width(g->planes) : 1};
            lk__parallel_run(job.width, pool_task, &job);
            break;
        }
        case LK_POOL_AVG:
            for (long c = 0; c < g->planes; c++)
                lk_k_avg_pool_plane(xd + c * ni, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                                    g->count_include_pad, g->OH, g->OW, od + c * no);
            break;
        case LK_POOL_ADAPTIVE_AVG:
            for (long c = 0; c < g->planes; c++)
                lk_k_adaptive_avg_plane(xd + c * ni, g->H, g->W, g->OH, g->OW, od + c * no);
            break;
        }
        return LK_STATUS_OK;
    }
    pool_job job = {g, false, x[0], x[2], x[1], g->planes * ni >= (1 << 18) ? lk__parallel_width(g->planes) : 1};
    lk__parallel_run(job.width, pool_task, &job);
    return LK_STATUS_OK;
}
