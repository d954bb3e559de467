/* The CPU backend's softmax family: softmax and log-softmax over the middle
 * axis of a contiguous [outer, C, inner] tensor, forward and backward, f32.
 * Rows (inner == 1) take the lane-blocked row kernels of kernels.h; other
 * axes the column forms, with `inner` floats of scratch per array. */
#include "backend/cpu/cpu_impl.h"

lk_status LK_ISA(lk__cpu_softmax)(const lk_op_desc *d, void *const *x) {
    const lk_softmax_params *p = &d->softmax;
    int log_out = p->log_out;
    float *scratch = NULL;
    if (p->inner > 1 && p->C > 0 && !(scratch = lk_malloc(2 * (size_t)p->inner * sizeof *scratch)))
        return lk_last_status();
    if (d->op == LK_OP_SOFTMAX) {
        const float *xd = x[0];
        float *od = x[1];
        if (p->inner == 1) {
            for (int64_t o = 0; o < p->outer; o++) lk_k_softmax_row(xd + o * p->C, od + o * p->C, p->C, log_out);
        } else if (p->C > 0 && p->inner > 1) {
            int64_t blk = p->C * p->inner;
            for (int64_t o = 0; o < p->outer; o++)
                lk_k_softmax_cols(xd + o * blk, od + o * blk, p->C, p->inner, scratch, scratch + p->inner, log_out);
        }
    } else {
        const float *yd = x[0], *gd = x[1];
        float *dd = x[2];
        int64_t C = p->C, inner = p->inner;
        if (inner == 1) {
            for (int64_t o = 0; o < p->outer; o++)
                lk_k_softmax_backward_row(yd + o * C, gd + o * C, dd + o * C, C, log_out);
        } else if (C > 0 && inner > 1) {
            for (int64_t o = 0; o < p->outer; o++)
                lk_k_softmax_backward_cols(yd + o * C * inner, gd + o * C * inner, dd + o * C * inner, C, inner,
                                           scratch, log_out);
        }
    }
    lk_free(scratch);
    return LK_STATUS_OK;
}
