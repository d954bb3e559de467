/* The CUDA backend's optimizer updates (LK_OP_OPTIM_UPDATE), f32 or 16-bit
 * parameters and gradients with f32 state: SGD with momentum / nesterov,
 * Adam / AdamW (amsgrad) and RMSprop, one thread per parameter over the
 * kernels/optim.h bodies the CPU backend runs too, with the scalars built
 * by the same lk__optim_*_consts. A 16-bit parameter is widened, updated
 * and rounded once, as on the CPU. Also clipping by norm's two steps after
 * the norms (LK_OP_CLIP_COEF, LK_OP_SCALE_BY), so the coefficient never
 * leaves the GPU. */
#include "backend/cuda/common.cuh"

namespace {

/* live: NULL, or the update's constants in device memory (lk_optim_live,
 * computed on the host by lk__op_live_fill), read over c; which state
 * arrays exist (Adam's amsgrad, RMSprop's momentum buffer and grad_avg)
 * stays c's, the operands'. */
__global__ void k_sgd(int64_t n, void *p, const void *g, int pdt, float *buf, lk_k_sgd c, const lk_k_sgd *live) {
    if (live) c = *live;
    LK_CU_FOR(i, n) {
        float none = 0.0f;
        lk_cu_st(p, pdt, i, lk_k_sgd_step(&c, lk_cu_ld(p, pdt, i), lk_cu_ld(g, pdt, i), c.has_mom ? &buf[i] : &none));
    }
}

__global__ void k_adam(int64_t n, void *p, const void *g, int pdt, float *m, float *v, float *vmax, lk_k_adam c,
                       const lk_k_adam *live) {
    if (live) c = lk_k_adam_live(live, c.amsgrad);
    LK_CU_FOR(i, n) {
        float none = 0.0f;
        lk_cu_st(p, pdt, i,
                 lk_k_adam_step(&c, lk_cu_ld(p, pdt, i), lk_cu_ld(g, pdt, i), &m[i], &v[i], c.amsgrad ? &vmax[i] : &none));
    }
}

__global__ void k_rmsprop(int64_t n, void *p, const void *g, int pdt, float *sq, float *buf, float *gavg, lk_k_rmsprop c,
                          const lk_k_rmsprop *live) {
    if (live) c = lk_k_rmsprop_live(live, c.has_mom, c.centered);
    LK_CU_FOR(i, n) {
        float none = 0.0f;
        lk_cu_st(p, pdt, i,
                 lk_k_rmsprop_step(&c, lk_cu_ld(p, pdt, i), lk_cu_ld(g, pdt, i), &sq[i], c.has_mom ? &buf[i] : &none,
                                   c.centered ? &gavg[i] : &none));
    }
}

/* clip_grad_norm_ without a read: the coefficient by one thread (n
 * gradients' norms, clip.c's order), then every gradient scaled by it as
 * k_affine scales (widened, one f32 product, rounded once). */
__global__ void k_clip_coef(int64_t n, double p, double max_norm, const double *norms, float *coef) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *coef = lk_k_clip_coef(norms, n, p, max_norm);
}

__global__ void k_scale_by(int64_t n, const void *x, const float *coef, void *y, int dt) {
    LK_CU_FOR(i, n) lk_cu_st(y, dt, i, lk_cu_ld(x, dt, i) * *coef);
}

int clip_launch(const lk_op_desc *d, void *const *x) {
    if (d->op == LK_OP_CLIP_COEF) {
        k_clip_coef<<<1, 1, 0, lk_cu_stream()>>>(d->clip.n, d->clip.p, d->clip.max_norm, (const double *)x[0], (float *)x[1]);
    } else if (d->clip.n > 0) {
        k_scale_by<<<lk_cu_blocks(d->clip.n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->clip.n, x[0], (const float *)x[1], x[2],
                                                               (int)d->dtype[0]);
    }
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int lk__cuda_optim(const lk_op_desc *d, void *const *x) {
    LK_CU_REQUIRE_STREAM();
    if (d->op == LK_OP_CLIP_COEF || d->op == LK_OP_SCALE_BY) return clip_launch(d, x);
    const lk_optim_params *c = &d->optim;
    void *p = x[0];
    const void *g = x[1];
    float *s0 = (float *)x[2], *s1 = (float *)x[3], *s2 = (float *)x[4];
    int pdt = (int)d->dtype[0];
    int64_t n = c->n;
    if (n <= 0) return 0;
    unsigned blocks = lk_cu_blocks(n);
    /* with `live` the by-value constants matter only for the state arrays' flags */
    const lk_optim_live *live = (const lk_optim_live *)d->live;
    switch (c->rule) {
    case LK_OPTIM_RULE_SGD:
        k_sgd<<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(n, p, g, pdt, s0, lk__optim_sgd_consts(c), live ? &live->sgd : NULL);
        break;
    case LK_OPTIM_RULE_ADAM:
        k_adam<<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(n, p, g, pdt, s0, s1, s2, lk__optim_adam_consts(c, s2 != NULL),
                                                             live ? &live->adam : NULL);
        break;
    case LK_OPTIM_RULE_RMSPROP:
        k_rmsprop<<<blocks, LK_CU_THREADS, 0, lk_cu_stream()>>>(n, p, g, pdt, s0, s1, s2,
                                                                lk__optim_rmsprop_consts(c, s1 != NULL, s2 != NULL),
                                                                live ? &live->rmsprop : NULL);
        break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
