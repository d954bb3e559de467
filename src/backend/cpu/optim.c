/* The CPU backend's optimizer updates (LK_OP_OPTIM_UPDATE), f32 or 16-bit
 * parameters with f32 state: SGD with
 * momentum/nesterov, Adam/AdamW (amsgrad) and RMSprop, one fused loop per
 * call over a contiguous range, with torch.optim 1.13's single-tensor
 * formulas. The caller (src/optim/optimizer.c) cuts a group into ranges for
 * its threads; any cut gives the same bits. */
#include <math.h>

#include "backend/cpu/cpu_impl.h"

/* One fused loop per rule over the kernels/optim.h bodies. Written scalar:
 * -O3 vectorises each loop (the constants' flags are loop invariant; ISO C
 * mode: no FMA contraction; -fno-math-errno: sqrtf is one instruction). */
static void sgd_update(float *restrict p, const float *restrict g, float *restrict buf, int64_t n,
                       const lk_op_desc *d) {
    const lk_k_sgd k = lk__optim_sgd_consts_of(d);
    float none = 0.0f;
    for (int64_t i = 0; i < n; i++) p[i] = lk_k_sgd_step(&k, p[i], g[i], k.has_mom ? &buf[i] : &none);
}

/* One loop per setting of maximize, L2 and decoupled decay (and amsgrad's
 * or not), each with the flags as constants: with the selects left in, GCC
 * leaves the loop scalar rather than unswitch a body this size. Every loop
 * runs the same kernel body, so the setting changes nothing else. */
#define ADAM_LOOP(MAXI, L2, DEC)                                                                              \
    case (MAXI) * 4 + (L2) * 2 + (DEC): {                                                                     \
        lk_k_adam kc = k;                                                                                     \
        kc.maxi = MAXI, kc.l2 = L2, kc.dec = DEC;                                                             \
        if (kc.amsgrad)                                                                                       \
            for (int64_t i = 0; i < n; i++) p[i] = lk_k_adam_step(&kc, p[i], g[i], &m[i], &v[i], &vmax[i]);   \
        else                                                                                                  \
            for (int64_t i = 0; i < n; i++) p[i] = lk_k_adam_step(&kc, p[i], g[i], &m[i], &v[i], &none);      \
    } break

static void adam_update(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                        float *restrict vmax, int64_t n, const lk_op_desc *d) {
    const lk_k_adam k = lk__optim_adam_consts_of(d, vmax != NULL);
    float none = 0.0f;
    switch (k.maxi * 4 + k.l2 * 2 + k.dec) {
        ADAM_LOOP(0, 0, 0);
        ADAM_LOOP(0, 0, 1);
        ADAM_LOOP(0, 1, 0);
        ADAM_LOOP(0, 1, 1);
        ADAM_LOOP(1, 0, 0);
        ADAM_LOOP(1, 0, 1);
        ADAM_LOOP(1, 1, 0);
        ADAM_LOOP(1, 1, 1);
    }
}
#undef ADAM_LOOP

/* torch.optim.RMSprop (1.13, single tensor). State arrays: square_avg,
 * then momentum_buffer when momentum > 0, then grad_avg when centered. */
static void rmsprop_update(float *restrict p, const float *restrict g, float *restrict sq, float *restrict buf,
                           float *restrict gavg, int64_t n, const lk_op_desc *d) {
    const lk_k_rmsprop k = lk__optim_rmsprop_consts_of(d, buf != NULL, gavg != NULL);
    float none = 0.0f;
    for (int64_t i = 0; i < n; i++)
        p[i] = lk_k_rmsprop_step(&k, p[i], g[i], &sq[i], k.has_mom ? &buf[i] : &none, k.centered ? &gavg[i] : &none);
}

/* The constants come from d's live block when it has one (lk__optim_*_consts_of). */
static void update_f32(const lk_op_desc *d, float *p, const float *g, float *s0, float *s1, float *s2, int64_t n) {
    switch (d->optim.rule) {
    case LK_OPTIM_RULE_SGD: sgd_update(p, g, s0, n, d); break;
    case LK_OPTIM_RULE_ADAM: adam_update(p, g, s0, s1, s2, n, d); break;
    case LK_OPTIM_RULE_RMSPROP: rmsprop_update(p, g, s0, s1, s2, n, d); break;
    }
}

#define CHUNK 512 /* 16-bit parameters: widened a chunk at a time, on the stack */

lk_status LK_ISA(lk__cpu_optim_update)(const lk_op_desc *d, void *const *x) {
    const lk_optim_params *c = &d->optim;
    if (c->rule != LK_OPTIM_RULE_SGD && c->rule != LK_OPTIM_RULE_ADAM && c->rule != LK_OPTIM_RULE_RMSPROP)
        return lk_error(LK_STATUS_INTERNAL, "cpu backend: optimizer rule %d", (int)c->rule);
    float *s0 = x[2], *s1 = x[3], *s2 = x[4];
    if (d->dtype[0] == LK_F32) {
        update_f32(d, x[0], x[1], s0, s1, s2, c->n);
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
        update_f32(d, p, g, s0 ? s0 + i : NULL, s1 ? s1 + i : NULL, s2 ? s2 + i : NULL, m);
        lk_f32_to_half_n(d->dtype[0], p16 + i, p, (size_t)m);
    }
    return LK_STATUS_OK;
}
