/* The CPU backend's causal self-attention (LK_OP_ATTENTION, _BACKWARD), f32:
 * the row bodies of kernels/attention.h spread over the thread pool. Row i
 * costs i + 1 key visits, so tasks take rows round-robin (task t: rows t,
 * t + width, ...) rather than in blocks, which keeps the triangle's work
 * even; every row is one task's alone, so the bits do not depend on the
 * width. The backward first computes the rows' D_i = dy_i . y_i once, then
 * dq by rows and dk, dv by key columns. */
#include "backend/cpu/cpu_impl.h"

typedef struct {
    const lk_attention_params *p;
    const float *qkv, *y, *lse, *dy, *delta;
    float *out, *lse_out, *dqkv, *delta_out;
    int pass; /* 0 forward, 1 delta, 2 dq, 3 dk dv */
    int width;
} attn_job;

static void attn_task(void *ctx, int task) {
    const attn_job *j = ctx;
    const lk_attention_params *p = j->p;
    int64_t rows = p->B * p->H * p->T;
    for (int64_t r = task; r < rows; r += j->width) {
        /* r = (b H + h) T + i: one head's rows together (its K and V stay in cache) */
        int64_t i = r % p->T, bh = r / p->T, b = bh / p->H, h = bh % p->H;
        switch (j->pass) {
        case 0:
            lk_k_attn_forward_row(j->qkv, j->out, j->lse_out, p->T, p->H, p->D, p->scale, p->key, p->ctr, p->thr,
                                  p->keep_scale, b, h, i);
            break;
        case 1: j->delta_out[r] = lk_k_attn_delta(j->y, j->dy, p->T, p->H, p->D, b, h, i); break;
        case 2:
            lk_k_attn_dq_row(j->qkv, j->y, j->lse, j->dy, j->dqkv, p->T, p->H, p->D, p->scale, p->key, p->ctr, p->thr,
                             p->keep_scale, b, h, i);
            break;
        default:
            lk_k_attn_dkv_col(j->qkv, j->y, j->lse, j->dy, j->delta, j->dqkv, p->T, p->H, p->D, p->scale, p->key,
                              p->ctr, p->thr, p->keep_scale, b, h, i);
        }
    }
}

lk_status LK_ISA(lk__cpu_attention)(const lk_op_desc *d, void *const *x) {
    const lk_attention_params *p = &d->attention;
    int64_t rows = p->B * p->H * p->T;
    if (rows == 0) return LK_STATUS_OK;
    /* a row's work is about T D multiply-adds: split only what pays for the wake-up */
    int width = rows * p->T * p->D >= (1 << 15) ? lk__parallel_width(rows) : 1;
    attn_job j = {.p = p, .qkv = x[0], .width = width};
    if (d->op == LK_OP_ATTENTION) {
        j.out = x[1], j.lse_out = x[2], j.pass = 0;
        lk__parallel_run(width, attn_task, &j);
        return LK_STATUS_OK;
    }
    float *delta = lk_malloc((size_t)rows * sizeof *delta);
    if (!delta) return lk_error(LK_STATUS_OUT_OF_MEMORY, "cpu backend: attention backward: %lld row terms", (long long)rows);
    j.y = x[1], j.lse = x[2], j.dy = x[3], j.dqkv = x[4], j.delta_out = delta, j.delta = delta;
    for (int pass = 1; pass <= 3; pass++) {
        j.pass = pass;
        lk__parallel_run(width, attn_task, &j);
    }
    lk_free(delta);
    return LK_STATUS_OK;
}
