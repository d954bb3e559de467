/* The CPU backend's optimizer updates (LK_OP_OPTIM_UPDATE), f32 or 16-bit
 * parameters with f32 state: SGD with
 * momentum/nesterov, Adam/AdamW (amsgrad) and RMSprop, one fused loop per
 * call over a contiguous range, with torch.optim 1.13's single-tensor
 * formulas. The caller (src/optim/optimizer.c) cuts a group into ranges for
 * its threads; any cut gives the same bits. */
#include <math.h>

#include "backend/cpu/cpu_impl.h"

/* Scalars are rounded to f32 once, as PyTorch's CPU kernels do for a
 * Python-float operand of an f32 tensor op; each statement is one PyTorch op. */
static void sgd_update(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                       const lk_optim_params *c, bool first) {
    const float wd = (float)c->weight_decay, mom = (float)c->momentum, damp1 = (float)(1.0 - c->dampening);
    const float neg_lr = (float)(-c->lr);
    const bool has_wd = c->weight_decay != 0.0, has_mom = c->momentum != 0.0, nest = c->nesterov, maxi = c->maximize;
    /* Written branchy and scalar: -O3 vectorises it (the flags are loop
     * invariant), 16 lanes where AVX-512 is there. */
    for (int64_t i = 0; i < n; i++) {
        float d = maxi ? -g[i] : g[i];
        if (has_wd) d = d + wd * p[i];
        if (has_mom) {
            float b;
            if (first) b = d;
            else {
                b = buf[i] * mom;
                b = b + damp1 * d;
            }
            buf[i] = b;
            d = nest ? d + mom * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

static void adam_update(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                        float *restrict vmax, int64_t n, const lk_optim_params *c, int64_t step) {
    const double bc1 = 1.0 - pow(c->beta1, (double)step), bc2 = 1.0 - pow(c->beta2, (double)step);
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, omb1 = (float)(1.0 - c->beta1), omb2 = (float)(1.0 - c->beta2);
    const float bc2s = (float)sqrt(bc2), eps = (float)c->eps, neg_step = (float)(-(c->lr / bc1));
    const bool adamw = c->adamw, maxi = c->maximize;
    const bool l2 = !adamw && c->weight_decay != 0.0;
    const float wd = (float)c->weight_decay, decay = (float)(1.0 - c->lr * c->weight_decay);
    const bool dec = adamw && decay != 1.0f;
    /* Each statement is one PyTorch op (ISO C mode: no FMA contraction); -O3
     * vectorises the loop (with -fno-math-errno, sqrtf is one instruction). */
    for (int64_t i = 0; i < n; i++) {
        float gi = maxi ? -g[i] : g[i];
        float pi = p[i];
        if (dec) pi = pi * decay;
        if (l2) gi = gi + wd * pi;
        float mi = m[i] * b1;
        mi = mi + omb1 * gi;
        float vi = v[i] * b2;
        vi = vi + (omb2 * gi) * gi;
        m[i] = mi;
        v[i] = vi;
        float vd = vi;
        if (vmax) {
            vd = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vd;
        }
        float denom = sqrtf(vd) / bc2s + eps;
        p[i] = pi + (neg_step * mi) / denom;
    }
}

/* torch.optim.RMSprop (1.13, single tensor). State arrays: square_avg,
 * then momentum_buffer when momentum > 0, then grad_avg when centered. */
static void rmsprop_update(float *restrict p, const float *restrict g, float *restrict sq, float *restrict buf,
                           float *restrict gavg, int64_t n, const lk_optim_params *c) {
    const float a = (float)c->alpha, oma = (float)(1.0 - c->alpha), eps = (float)c->eps, wd = (float)c->weight_decay;
    const float mom = (float)c->momentum, neg_lr = (float)(-c->lr);
    const bool has_wd = c->weight_decay != 0.0, maxi = c->maximize;
    for (int64_t i = 0; i < n; i++) {
        float gi = maxi ? -g[i] : g[i];
        if (has_wd) gi = gi + wd * p[i];         /* grad.add(param, alpha=weight_decay) */
        float s = sq[i] * a;                     /* square_avg.mul_(alpha) */
        s = s + (oma * gi) * gi;                 /* .addcmul_(grad, grad, value=1 - alpha) */
        sq[i] = s;
        float avg;
        if (gavg) {
            float ga = gavg[i] * a;              /* grad_avg.mul_(alpha) */
            ga = ga + oma * gi;                  /* .add_(grad, alpha=1 - alpha) */
            gavg[i] = ga;
            avg = sqrtf(s + (-1.0f * ga) * ga);  /* square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_() */
        } else {
            avg = sqrtf(s);
        }
        avg = avg + eps;                         /* .add_(eps) */
        if (buf) {
            float b = buf[i] * mom;              /* buf.mul_(momentum) */
            b = b + gi / avg;                    /* .addcdiv_(grad, avg) */
            buf[i] = b;
            p[i] = p[i] + neg_lr * b;            /* param.add_(buf, alpha=-lr) */
        } else {
            p[i] = p[i] + neg_lr * (gi / avg);   /* param.addcdiv_(grad, avg, value=-lr) */
        }
    }
}

static void update_f32(const lk_optim_params *c, float *p, const float *g, float *s0, float *s1, float *s2, int64_t n) {
    switch (c->rule) {
    case LK_OPTIM_RULE_SGD: sgd_update(p, g, s0, n, c, c->step == 1); break;
    case LK_OPTIM_RULE_ADAM: adam_update(p, g, s0, s1, s2, n, c, c->step); break;
    case LK_OPTIM_RULE_RMSPROP: rmsprop_update(p, g, s0, s1, s2, n, c); break;
    }
}

#define CHUNK 512 /* 16-bit parameters: widened a chunk at a time, on the stack */

lk_status lk__cpu_optim_update(const lk_op_desc *d, void *const *x) {
    const lk_optim_params *c = &d->optim;
    if (c->rule != LK_OPTIM_RULE_SGD && c->rule != LK_OPTIM_RULE_ADAM && c->rule != LK_OPTIM_RULE_RMSPROP)
        return lk_error(LK_STATUS_INTERNAL, "cpu backend: optimizer rule %d", (int)c->rule);
    float *s0 = x[2], *s1 = x[3], *s2 = x[4];
    if (d->dtype[0] == LK_F32) {
        update_f32(c, x[0], x[1], s0, s1, s2, c->n);
        return LK_STATUS_OK;
    }
    /* bf16/f16 parameters and gradients (the *-true precisions), f32 state:
     * each element widened, updated in f32 with the f32 formulas and the
     * parameter rounded once (to nearest even), so the only loss against an
     * f32 update is that one rounding; torch's bf16 update rounds after every
     * op of the formula. */
    uint16_t *p16 = x[0];
    const uint16_t *g16 = x[1];
    float p[CHUNK], g[CHUNK];
    for (int64_t i = 0; i < c->n; i += CHUNK) {
        int64_t m = c->n - i < CHUNK ? c->n - i : CHUNK;
        lk_half_to_f32_n(d->dtype[0], p, p16 + i, (size_t)m);
        lk_half_to_f32_n(d->dtype[1], g, g16 + i, (size_t)m);
        update_f32(c, p, g, s0 ? s0 + i : NULL, s1 ? s1 + i : NULL, s2 ? s2 + i : NULL, m);
        lk_f32_to_half_n(d->dtype[0], p16 + i, p, (size_t)m);
    }
    return LK_STATUS_OK;
}
