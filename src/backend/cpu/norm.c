/* The CPU backend's layer norm, f32: the row kernels of kernels/rows.h over
 * M rows, forward (keeping each row's mean and rstd when asked) and the
 * fused backward (dx, and dw/db accumulated). */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

lk_status lk__cpu_layer_norm(const lk_op_desc *d, void *const *x) {
    int64_t M = d->layer_norm.M, L = d->layer_norm.L;
    if (d->op == LK_OP_LAYER_NORM) {
        const float *xd = x[0], *wd = x[1], *bd = x[2];
        float *od = x[3], *sd = x[4];
        if (L > 0)
            for (int64_t r = 0; r < M; r++) {
                float mean, rstd;
                lk_k_layer_norm_row(xd + r * L, od + r * L, L, wd, bd, d->layer_norm.eps, &mean, &rstd);
                if (sd) {
                    sd[2 * r] = mean;
                    sd[2 * r + 1] = rstd;
                }
            }
        return LK_STATUS_OK;
    }
    const float *xd = x[0], *gd = x[1], *sd = x[2], *wd = x[3];
    float *dx = x[4], *dw = x[5], *db = x[6], *dy = NULL;
    if (dx && wd && L > 0 && !(dy = lk_malloc((size_t)L * sizeof *dy))) return lk_last_status();
    for (int64_t r = 0; r < M; r++) {
        const float *xr = xd + r * L, *gr = gd + r * L;
        float mean = sd[2 * r], rstd = sd[2 * r + 1];
        if (dx) {
            const float *dyr = gr;
            if (wd) {
                memcpy(dy, gr, (size_t)L * sizeof *dy);
                lk_k_mul8(dy, wd, L);
                dyr = dy;
            }
            lk_k_layer_norm_backward_row(xr, dyr, mean, rstd, L, dx + r * L);
        }
        if (dw || db) lk_k_layer_norm_param_grad_row(xr, gr, mean, rstd, L, dw, db);
    }
    lk_free(dy);
    return LK_STATUS_OK;
}
