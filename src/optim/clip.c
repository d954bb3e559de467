/* Gradient clipping with torch.nn.utils.clip_grad_norm_ / clip_grad_value_
 * semantics: the total norm over all gradients, the clip coefficient
 * max_norm / (total + 1e-6) clamped to 1 and computed in f32 as PyTorch does,
 * and non-finite norms passed through rather than rejected. Each
 * gradient's norm (LK_OP_NORM) and the scaling run on its device's backend.
 * As torch's clip_grad_norm_, nothing is read back unless the caller wants
 * the total norm: for p = 1, 2 and inf the coefficient is computed where the
 * gradients are (LK_OP_CLIP_COEF, LK_OP_SCALE_BY); with total_norm, or
 * another p, the norms are read and combined here (LK_OP_AFFINE scales).
 * Clipping by value is LK_OP_CLAMP. */
#include <math.h>

#include "backend/backend_impl.h"
#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"

static lk_status check_grad(const lk_named_tensor *it) {
    const lk_tensor *g = it->tensor->grad;
    if (g && ((g->dtype != LK_F32 && g->dtype != LK_BF16 && g->dtype != LK_F16) || !lk_tensor_is_contiguous(g)))
        return lk_error(LK_STATUS_UNSUPPORTED, "clip_grad: the gradient of '%s' must be contiguous f32, bf16 or f16 (got %s%s)",
                        it->name, lk_dtype_name(g->dtype), lk_tensor_is_contiguous(g) ? "" : ", strided");
    return LK_STATUS_OK;
}

/* Clipping by norm with no read, for p = 1, 2 or inf: each gradient's raw
 * norm (LK_OP_NORM) into slot j of an f64 array on `dev` (j counting the
 * gradients there are), the coefficient from them (LK_OP_CLIP_COEF: the
 * host arithmetic below, in the same order and precisions) into the slot
 * after them, then every gradient times it (LK_OP_SCALE_BY, which is
 * LK_OP_AFFINE's product). On the CPU the same ops run on host memory, so
 * there is one path and the bits are the host code's. */
static lk_status clip_where_the_grads_are(const lk_named_tensors *params, double max_norm, double p, lk_device dev) {
    int64_t m = 0;
    for (int i = 0; i < params->n; i++) m += params->items[i].tensor->grad != NULL;
    if (m == 0) return LK_STATUS_OK;
    lk_tensor *buf = lk__tensor_new_on(dev, LK_F64, 1, (int64_t[]){m + 1}); /* m norms, then the f32 coefficient */
    if (!buf) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    double *norms = buf->data;
    float *coef = (float *)(norms + m);
    lk_status st = LK_STATUS_OK;
    for (int i = 0, j = 0; !st && i < params->n; i++) {
        const lk_tensor *g = params->items[i].tensor->grad;
        if (!g) continue;
        lk_op_desc nd = {.op = LK_OP_NORM, .dtype = {g->dtype, LK_F64}};
        nd.norm = (lk_norm_params){g->numel, p};
        st = lk__backend_run(g->device, &nd, (void *[]){g->data, norms + j++});
    }
    lk_op_desc cd = {.op = LK_OP_CLIP_COEF, .dtype = {LK_F64, LK_F32}};
    cd.clip = (lk_clip_params){m, p, max_norm};
    if (!st) st = lk__backend_run(dev, &cd, (void *[]){norms, coef});
    for (int i = 0; !st && i < params->n; i++) {
        lk_tensor *g = params->items[i].tensor->grad;
        if (!g) continue;
        lk_op_desc sd = {.op = LK_OP_SCALE_BY, .dtype = {g->dtype, LK_F32, g->dtype}};
        sd.clip = (lk_clip_params){.n = g->numel};
        st = lk__backend_run(g->device, &sd, (void *[]){g->data, coef, g->data});
    }
    lk_tensor_release(buf);
    return st;
}

lk_status lk_clip_grad_norm(const lk_named_tensors *params, double max_norm, double norm_type, double *total_norm) {
    if (total_norm) *total_norm = 0.0;
    if (!params) return lk_error(LK_STATUS_INVALID_ARGUMENT, "clip_grad_norm: NULL parameter list");
    if (!(norm_type > 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "clip_grad_norm: norm_type must be > 0 (or INFINITY), got %g", norm_type);
    if (isnan(max_norm)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "clip_grad_norm: max_norm is NaN");
    bool inf_norm = isinf(norm_type);
    lk_device dev = LK_DEVICE_CPU;
    for (int i = 0; i < params->n; i++) {
        LK_TRY(check_grad(&params->items[i]));
        if (params->items[i].tensor->grad) dev = params->items[i].tensor->grad->device;
    }
    /* Without total_norm wanted (the trainer's case), nothing is read: the
     * norms, the coefficient and the scaling stay where the gradients are. */
    if (!total_norm && (inf_norm || norm_type == 1.0 || norm_type == 2.0))
        return clip_where_the_grads_are(params, max_norm, inf_norm ? INFINITY : norm_type, dev);
    /* Every gradient's norm into one array where the gradients are, read
     * back with one copy; then combined on the host in PyTorch's order. */
    double small[32] = {0}, *norms = params->n <= 32 ? small : lk_calloc((size_t)params->n + 1, sizeof *norms);
    if (!norms) return LK_STATUS_OUT_OF_MEMORY;
    lk__scalars ns;
    lk_status st = lk__scalars_begin(&ns, dev, LK_F64, params->n, norms);
    for (int i = 0; !st && i < params->n; i++) {
        const lk_tensor *g = params->items[i].tensor->grad;
        if (!g) continue;
        /* inf: this gradient's max |x|; p: its sum of |x|^p (the root is taken here) */
        lk_op_desc nd = {.op = LK_OP_NORM, .dtype = {g->dtype, LK_F64}};
        nd.norm = (lk_norm_params){g->numel, inf_norm ? INFINITY : norm_type};
        st = lk__backend_run(g->device, &nd, (void *[]){g->data, lk__scalars_at(&ns, i)});
    }
    if (lk__scalars_end(&ns) && !st) st = lk_last_status();
    if (st) {
        if (norms != small) lk_free(norms);
        return st;
    }
    /* combined in PyTorch's order and precisions by the kernel body the
     * device path runs (kernels/optim.h), over the gradients there are */
    int64_t m = 0;
    for (int i = 0; i < params->n; i++)
        if (params->items[i].tensor->grad) norms[m++] = norms[i];
    float total = m ? lk_k_clip_total(norms, m, inf_norm ? INFINITY : norm_type) : 0.0f;
    if (norms != small) lk_free(norms);
    if (m == 0) return LK_STATUS_OK;
    if (total_norm) *total_norm = total;
    float coef = lk_k_clip_coef_of(total, max_norm);
    for (int i = 0; i < params->n; i++) {
        lk_tensor *g = params->items[i].tensor->grad;
        if (g) LK_TRY(lk__affine(g->device, g->dtype, g->numel, coef, 0.0f, false, g->data, g->data));
    }
    return LK_STATUS_OK;
}

lk_status lk_clip_grad_value(const lk_named_tensors *params, double clip_value) {
    if (!params) return lk_error(LK_STATUS_INVALID_ARGUMENT, "clip_grad_value: NULL parameter list");
    if (!(clip_value >= 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "clip_grad_value: clip_value must be >= 0, got %g", clip_value);
    float c = (float)clip_value;
    for (int i = 0; i < params->n; i++) {
        LK_TRY(check_grad(&params->items[i]));
        lk_tensor *g = params->items[i].tensor->grad;
        if (!g) continue;
        lk_op_desc d = {.op = LK_OP_CLAMP, .dtype = {g->dtype, g->dtype}};
        d.clamp = (lk_clamp_params){g->numel, -c, c};
        LK_TRY(lk__backend_run(g->device, &d, (void *[]){g->data, g->data}));
    }
    return LK_STATUS_OK;
}
