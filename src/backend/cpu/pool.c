/* The CPU backend's 2-D pooling, f32 (bf16/f16 widened per chunk of planes): max (with the i32 index of each
 * window's maximum, for backward), avg and adaptive avg, forward and
 * backward, one plane at a time over the plane kernels of kernels/conv.h.
 * Max pooling's forward gives whole planes to the compute threads once the
 * input is about a megabyte. */
#include <math.h>

#include "backend/cpu/cpu_impl.h"

typedef struct {
    const lk_pool_params *g;
    const float *x;
    float *out;
    int *idx;
    int width;
} max_pool_job;

/* The 2x2, stride 2, unpadded window every window of which lies inside the
 * plane (the common max pool): one output row at a time, the four values of
 * each window read as two rows' even and odd columns, and PyTorch's loop
 * (row-major order; a value replaces the running maximum when greater or
 * NaN, so the first maximum and the last NaN win) spelled as four selects:
 * no branch and no inner loop per window, which the compiler vectorises
 * over the row (the plane kernel took ~10 ns per window on the cnn). The
 * same values and indices as lk_k_max_pool_plane, bit for bit
 * (backend_pool checks it). */
static bool max_pool_2x2(const lk_pool_params *g) {
    return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0 && 2 * g->OH <= g->H &&
           2 * g->OW <= g->W;
}

static void max_pool_2x2_plane(const float *restrict x, long W, long OH, long OW, float *restrict y,
                               int *restrict idx) {
    for (long oh = 0; oh < OH; oh++) {
        const float *r0 = x + 2 * oh * W, *r1 = r0 + W;
        float *yo = y + oh * OW;
        int *io = idx + oh * OW;
        int base = (int)(2 * oh * W);
        for (long ow = 0; ow < OW; ow++) {
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

static void max_pool_task(void *ctx, int t) {
    const max_pool_job *j = ctx;
    const lk_pool_params *g = j->g;
    long no = g->OH * g->OW, ni = g->H * g->W;
    int64_t c0, c1;
    lk__task_range(g->planes, t, j->width, 1, &c0, &c1);
    bool fast = max_pool_2x2(g);
    for (long c = c0; c < c1; c++)
        if (fast) max_pool_2x2_plane(j->x + c * ni, g->W, g->OH, g->OW, j->out + c * no, j->idx + c * no);
        else
            lk_k_max_pool_plane(j->x + c * ni, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->OH, g->OW,
                                j->out + c * no, j->idx + c * no);
}

static lk_status pool2d_f32(const lk_op_desc *d, void *const *x);

static size_t esize(lk_dtype t) { return t == LK_F32 || t == LK_I32 ? 4 : 2; }

/* bf16/f16 operands: chunks of whole planes (about a megabyte of f32 input
 * each) through widen.c, so the f32 scratch stays small; each plane's
 * window sums and maxima are f32, each output element rounded once. */
static lk_status pool2d_half(const lk_op_desc *d, void *const *x) {
    const lk_pool_params *g = &d->pool;
    long no = g->OH * g->OW, ni = g->H * g->W, big = d->op == LK_OP_POOL2D ? ni : no;
    long step = big > 0 && big < (1 << 18) ? (1 << 18) / big : 1;
    /* elements per plane of each operand, in its own dtype */
    long per[3] = {d->op == LK_OP_POOL2D ? ni : no, d->op == LK_OP_POOL2D ? no : no, d->op == LK_OP_POOL2D ? no : ni};
    for (long c = 0; c < g->planes; c += step) {
        lk_op_desc part = *d;
        part.pool.planes = g->planes - c < step ? g->planes - c : step;
        void *ops[3];
        for (int i = 0; i < 3; i++)
            ops[i] = x[i] ? (char *)x[i] + (size_t)(c * per[i]) * esize(d->dtype[i]) : NULL;
        LK_TRY(lk__cpu_run_widened(&part, ops, pool2d_f32));
    }
    return LK_STATUS_OK;
}

lk_status lk__cpu_pool2d(const lk_op_desc *d, void *const *x) {
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
            max_pool_job job = {g, xd, od, x[2], g->planes * ni >= (1 << 18) ? lk__parallel_width(g->planes) : 1};
            lk__parallel_run(job.width, max_pool_task, &job);
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
    const float *dy = x[0];
    const int *idx = x[1];
    float *dx = x[2];
    switch (g->kind) {
    case LK_POOL_MAX:
        for (long c = 0; c < g->planes; c++) lk_k_max_pool_backward_plane(dy + c * no, idx + c * no, no, dx + c * ni);
        break;
    case LK_POOL_AVG:
        for (long c = 0; c < g->planes; c++)
            lk_k_avg_pool_backward_plane(dy + c * no, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw,
                                         g->count_include_pad, g->OH, g->OW, dx + c * ni);
        break;
    case LK_POOL_ADAPTIVE_AVG:
        for (long c = 0; c < g->planes; c++)
            lk_k_adaptive_avg_backward_plane(dy + c * no, g->H, g->W, g->OH, g->OW, dx + c * ni);
        break;
    }
    return LK_STATUS_OK;
}
