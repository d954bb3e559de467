/* The CUDA backend's optimizer updates (LK_OP_OPTIM_UPDATE), f32 or 16-bit
 * parameters and gradients with f32 state: SGD with
 * momentum / nesterov, Adam / AdamW (amsgrad) and RMSprop, one thread per
 * parameter, with the statements of the CPU backend's src/backend/cpu/optim.c
 * (torch.optim 1.13's single-tensor formulas, each statement one PyTorch op,
 * no contraction) and the scalars rounded to f32 on the host exactly as
 * there. Those loops live in the CPU backend rather than backend/kernels/,
 * so they are written twice: tests/gpu/test_ops.c compares the two element
 * by element. */
#include "backend/cuda/common.cuh"

namespace {

struct sgd_k {
    float wd, mom, damp1, neg_lr;
    bool has_wd, has_mom, nest, maxi, first;
};

/* p and g are f32, or bf16/f16 (one dtype, pdt: the *-true precisions):
 * each element widened, updated with the f32 statements and the parameter
 * rounded once, as the CPU's 16-bit path; the state is f32. */
__global__ void k_sgd(int64_t n, void *p, const void *g, int pdt, float *buf, sgd_k c) {
    LK_CU_FOR(i, n) {
        float pv = lk_cu_ld(p, pdt, i), gv = lk_cu_ld(g, pdt, i);
        float d = c.maxi ? -gv : gv;
        if (c.has_wd) d = d + c.wd * pv;
        if (c.has_mom) {
            float b;
            if (c.first) b = d;
            else {
                b = buf[i] * c.mom;
                b = b + c.damp1 * d;
            }
            buf[i] = b;
            d = c.nest ? d + c.mom * b : b;
        }
        lk_cu_st(p, pdt, i, pv + c.neg_lr * d);
    }
}

struct adam_k {
    float b1, b2, omb1, omb2, bc2s, eps, neg_step, wd, decay;
    bool maxi, l2, dec;
};

__global__ void k_adam(int64_t n, void *p, const void *g, int pdt, float *m, float *v, float *vmax, adam_k c) {
    LK_CU_FOR(i, n) {
        float gv = lk_cu_ld(g, pdt, i);
        float gi = c.maxi ? -gv : gv;
        float pi = lk_cu_ld(p, pdt, i);
        if (c.dec) pi = pi * c.decay;
        if (c.l2) gi = gi + c.wd * pi;
        float mi = m[i] * c.b1;
        mi = mi + c.omb1 * gi;
        float vi = v[i] * c.b2;
        vi = vi + (c.omb2 * gi) * gi;
        m[i] = mi;
        v[i] = vi;
        float vd = vi;
        if (vmax) {
            vd = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vd;
        }
        float denom = sqrtf(vd) / c.bc2s + c.eps;
        lk_cu_st(p, pdt, i, pi + (c.neg_step * mi) / denom);
    }
}

struct rms_k {
    float a, oma, eps, wd, mom, neg_lr;
    bool has_wd, maxi;
};

__global__ void k_rmsprop(int64_t n, void *p, const void *g, int pdt, float *sq, float *buf, float *gavg, rms_k c) {
    LK_CU_FOR(i, n) {
        float pv = lk_cu_ld(p, pdt, i), gv = lk_cu_ld(g, pdt, i);
        float gi = c.maxi ? -gv : gv;
        if (c.has_wd) gi = gi + c.wd * pv;
        float s = sq[i] * c.a;
        s = s + (c.oma * gi) * gi;
        sq[i] = s;
        float avg;
        if (gavg) {
            float ga = gavg[i] * c.a;
            ga = ga + c.oma * gi;
            gavg[i] = ga;
            avg = sqrtf(s + (-1.0f * ga) * ga);
        } else {
            avg = sqrtf(s);
        }
        avg = avg + c.eps;
        if (buf) {
            float b = buf[i] * c.mom;
            b = b + gi / avg;
            buf[i] = b;
            lk_cu_st(p, pdt, i, pv + c.neg_lr * b);
        } else {
            lk_cu_st(p, pdt, i, pv + c.neg_lr * (gi / avg));
        }
    }
}

} // namespace

extern "C" int lk__cuda_optim(const lk_op_desc *d, void *const *x) {
    const lk_optim_params *c = &d->optim;
    void *p = x[0];
    const void *g = x[1];
    float *s0 = (float *)x[2], *s1 = (float *)x[3], *s2 = (float *)x[4];
    int pdt = (int)d->dtype[0];
    int64_t n = c->n;
    if (n <= 0) return 0;
    unsigned blocks = lk_cu_blocks(n);
    switch (c->rule) {
    case LK_OPTIM_RULE_SGD: {
        sgd_k k = {(float)c->weight_decay, (float)c->momentum, (float)(1.0 - c->dampening), (float)(-c->lr),
                   c->weight_decay != 0.0, c->momentum != 0.0, c->nesterov, c->maximize, c->step == 1};
        k_sgd<<<blocks, LK_CU_THREADS>>>(n, p, g, pdt, s0, k);
        break;
    }
    case LK_OPTIM_RULE_ADAM: {
        const double bc1 = 1.0 - pow(c->beta1, (double)c->step), bc2 = 1.0 - pow(c->beta2, (double)c->step);
        adam_k k;
        k.b1 = (float)c->beta1, k.b2 = (float)c->beta2, k.omb1 = (float)(1.0 - c->beta1);
        k.omb2 = (float)(1.0 - c->beta2), k.bc2s = (float)sqrt(bc2), k.eps = (float)c->eps;
        k.neg_step = (float)(-(c->lr / bc1)), k.wd = (float)c->weight_decay;
        k.decay = (float)(1.0 - c->lr * c->weight_decay);
        k.maxi = c->maximize, k.l2 = !c->adamw && c->weight_decay != 0.0, k.dec = c->adamw && k.decay != 1.0f;
        k_adam<<<blocks, LK_CU_THREADS>>>(n, p, g, pdt, s0, s1, s2, k);
        break;
    }
    case LK_OPTIM_RULE_RMSPROP: {
        rms_k k = {(float)c->alpha, (float)(1.0 - c->alpha), (float)c->eps, (float)c->weight_decay,
                   (float)c->momentum, (float)(-c->lr), c->weight_decay != 0.0, c->maximize};
        k_rmsprop<<<blocks, LK_CU_THREADS>>>(n, p, g, pdt, s0, s1, s2, k);
        break;
    }
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}
