/* Kernel bodies of the optimizer updates: one element of SGD (momentum,
 * dampening, nesterov, weight decay, maximize), Adam / AdamW (amsgrad) and
 * RMSprop (centered, momentum) with torch.optim 1.13's single-tensor
 * formulas — each statement one PyTorch op, scalars rounded to f32 once
 * (lk__optim_*_consts in backend_impl.h), no contraction. A step takes the
 * parameter and gradient as f32 (a 16-bit one widened by the caller),
 * updates the state in place and returns the new parameter. The CPU
 * backend's loops (cpu/optim.c) and the CUDA kernels (cuda/optim.cu) both
 * run these. Part of backend/kernels.h. */
#ifndef LK_KERNELS_OPTIM_H
#define LK_KERNELS_OPTIM_H

typedef struct lk_k_sgd {
    float wd, mom, damp1, neg_lr;
    bool has_wd, has_mom, nest, maxi, first;
} lk_k_sgd;

/* buf: the momentum buffer's element (read only when has_mom). */
LK_KERNEL float lk_k_sgd_step(const lk_k_sgd *c, float p, float g, float *buf) {
    float d = c->maxi ? -g : g;
    if (c->has_wd) d = d + c->wd * p;
    if (c->has_mom) {
        float b;
        if (c->first) b = d;
        else {
            b = *buf * c->mom;
            b = b + c->damp1 * d;
        }
        *buf = b;
        d = c->nest ? d + c->mom * b : b;
    }
    return p + c->neg_lr * d;
}

/* x / b correctly rounded, as a multiply and two FMAs given rb = 1/b
 * rounded to f32: q = x rb is within an ulp of x / b, the FMA gives its
 * remainder x - q b exactly, and q + (x - q b) rb rounds to x / b itself
 * (Markstein's theorem; tests/backend/test_optim_bits.c checks it against
 * the division for every significand of x). For x / b in f32's normal
 * range, as Adam's sqrt(v) / sqrt(1 - beta2^t) is; x = 0, inf or NaN take
 * x rb, the quotient exactly (the correction would turn inf into NaN). On
 * the CPU a division costs the divider's throughput, the FMAs do not. */
LK_KERNEL float lk_k_div_by(float x, float b, float rb) {
    float q = x * rb;
    float q1 = fmaf(fmaf(-q, b, x), rb, q);
    return x != 0.0f && isfinite(x) ? q1 : q;
}

typedef struct lk_k_adam {
    float b1, b2, omb1, omb2, bc2s, rbc2s, eps, neg_step, wd, decay; /* rbc2s: 1 / bc2s, rounded */
    bool maxi, l2, dec, amsgrad;
} lk_k_adam;

/* m, v: the moments' elements; vmax: max_exp_avg_sq's (read only with amsgrad). */
LK_KERNEL float lk_k_adam_step(const lk_k_adam *c, float p, float g, float *m, float *v, float *vmax) {
    float gi = c->maxi ? -g : g;
    float pi = p;
    if (c->dec) pi = pi * c->decay;
    if (c->l2) gi = gi + c->wd * pi;
    float mi = *m * c->b1;
    mi = mi + c->omb1 * gi;
    float vi = *v * c->b2;
    vi = vi + (c->omb2 * gi) * gi;
    *m = mi;
    *v = vi;
    float vd = vi;
    if (c->amsgrad) {
        vd = *vmax > vi ? *vmax : vi;
        *vmax = vd;
    }
    float denom = lk_k_div_by(sqrtf(vd), c->bc2s, c->rbc2s) + c->eps; /* sqrt(v) / bc2s, the same bits */
    return pi + (c->neg_step * mi) / denom;
}

typedef struct lk_k_rmsprop {
    float a, oma, eps, wd, mom, neg_lr;
    bool has_wd, maxi, centered, has_mom;
} lk_k_rmsprop;

/* sq: square_avg's element; buf: the momentum buffer's (read only with
 * has_mom); gavg: grad_avg's (read only when centered). */
LK_KERNEL float lk_k_rmsprop_step(const lk_k_rmsprop *c, float p, float g, float *sq, float *buf, float *gavg) {
    float gi = c->maxi ? -g : g;
    if (c->has_wd) gi = gi + c->wd * p; /* grad.add(param, alpha=weight_decay) */
    float s = *sq * c->a;               /* square_avg.mul_(alpha) */
    s = s + (c->oma * gi) * gi;         /* .addcmul_(grad, grad, value=1 - alpha) */
    *sq = s;
    float avg;
    if (c->centered) {
        float ga = *gavg * c->a;             /* grad_avg.mul_(alpha) */
        ga = ga + c->oma * gi;               /* .add_(grad, alpha=1 - alpha) */
        *gavg = ga;
        avg = sqrtf(s + (-1.0f * ga) * ga);  /* square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_() */
    } else {
        avg = sqrtf(s);
    }
    avg = avg + c->eps; /* .add_(eps) */
    if (c->has_mom) {
        float b = *buf * c->mom; /* buf.mul_(momentum) */
        b = b + gi / avg;        /* .addcdiv_(grad, avg) */
        *buf = b;
        return p + c->neg_lr * b; /* param.add_(buf, alpha=-lr) */
    }
    return p + c->neg_lr * (gi / avg); /* param.addcdiv_(grad, avg, value=-lr) */
}

/* The constants of an update read from a descriptor's live block (computed
 * on the host by lk__op_live_fill, which leaves the state arrays' flags
 * false), with those flags from the operands, as the by-value path has them. */
LK_KERNEL lk_k_adam lk_k_adam_live(const lk_k_adam *live, bool amsgrad) {
    lk_k_adam k = *live;
    k.amsgrad = amsgrad;
    return k;
}
LK_KERNEL lk_k_rmsprop lk_k_rmsprop_live(const lk_k_rmsprop *live, bool has_mom, bool centered) {
    lk_k_rmsprop k = *live;
    k.has_mom = has_mom;
    k.centered = centered;
    return k;
}

/* torch.nn.utils.clip_grad_norm_'s total norm from n gradients' raw norms
 * (LK_OP_NORM's: max |x| for p = inf, sum |x|^p otherwise), in PyTorch's
 * order and precisions: each gradient's norm rounded to f32, their p-th
 * powers summed in double in parameter order (p = 2: the f32 norm squared,
 * exact in double, as pow(gn, 2) is), the total rounded to f32; a NaN norm
 * stays NaN. Any p > 0 on the host (lk_clip_grad_norm); a device runs only
 * p = 1, 2 and inf, whose arithmetic has no pow a GPU would round otherwise. */
LK_KERNEL float lk_k_clip_total(const double *norms, int64_t n, double p) {
    bool inf = isinf(p);
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double s = norms[i];
        if (inf) {
            if (s > acc || isnan(s)) acc = isnan(acc) ? acc : s;
        } else {
            float gn = (float)(p == 2.0 ? sqrt(s) : p == 1.0 ? s : pow(s, 1.0 / p));
            acc += p == 2.0 ? (double)gn * (double)gn : p == 1.0 ? (double)gn : pow((double)gn, p);
        }
    }
    return inf ? (float)acc : (float)(p == 1.0 ? acc : p == 2.0 ? sqrt(acc) : pow(acc, 1.0 / p));
}

/* The clip coefficient of a total norm: max_norm / (total + 1e-6) in f32,
 * clamped to 1 (clamp(max=1) keeps NaN: NaN norms give NaN gradients). */
LK_KERNEL float lk_k_clip_coef_of(float total, double max_norm) {
    float coef = (float)max_norm / (total + 1e-6f);
    return coef > 1.0f ? 1.0f : coef;
}

/* LK_OP_CLIP_COEF: the coefficient from n gradients' raw norms. */
LK_KERNEL float lk_k_clip_coef(const double *norms, int64_t n, double p, double max_norm) {
    return lk_k_clip_coef_of(lk_k_clip_total(norms, n, p), max_norm);
}

#endif
