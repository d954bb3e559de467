/* Each op kind's parameter fields, by name, offset and size: what makes two
 * descriptors "the same op" (a recorded step replayed as a graph must issue
 * the same ops over the same shapes), compared field by field so padding
 * never counts and a difference can be named. Fields marked live are the
 * op's per-step values (see lk__op_live_size in backend_impl.h): they may
 * differ between two descriptors of one replayed op, because the backend
 * reads them at execution time from device memory when the descriptor's
 * `live` is set. */
#include <stddef.h>
#include <string.h>

#include "backend/backend_impl.h"

#define F(u, m) {#m, offsetof(lk_op_desc, u.m), sizeof(((lk_op_desc *)0)->u.m), false}
/* A per-step field: read from `live` when set (lk__op_live_fill's layout below). */
#define L(u, m) {#m, offsetof(lk_op_desc, u.m), sizeof(((lk_op_desc *)0)->u.m), true}
static const lk_op_field gemm_f[] = {F(gemm, trans_a), F(gemm, trans_b), F(gemm, M),   F(gemm, N),    F(gemm, K),
                               F(gemm, lda),     F(gemm, ldb),     F(gemm, ldc), F(gemm, alpha), F(gemm, beta)};
static const lk_op_field unary_f[] = {F(unary, fn), F(unary, n), F(unary, alpha), F(unary, acc)};
static const lk_op_field binary_f[] = {F(binary, fn), F(binary, ndim), F(binary, shape), F(binary, sa), F(binary, sb), F(binary, relu)};
static const lk_op_field axpy_f[] = {F(axpy, n), F(axpy, alpha)};
static const lk_op_field affine_f[] = {F(affine, n), L(affine, mul), L(affine, add), F(affine, has_add)};
static const lk_op_field sum_to_f[] = {F(sum_to, ndim), F(sum_to, shape), F(sum_to, sd)};
static const lk_op_field mask_scale_f[] = {F(mask_scale, n), F(mask_scale, scale)};
static const lk_op_field softmax_f[] = {F(softmax, outer), F(softmax, C), F(softmax, inner), F(softmax, log_out)};
static const lk_op_field loss_f[] = {F(loss, kind), F(loss, reduction), F(loss, n), F(loss, beta)};
static const lk_op_field bce_f[] = {F(bce, n), F(bce, reduction), F(bce, logits)};
static const lk_op_field xent_f[] = {F(xent, N),         F(xent, C),   F(xent, D),    F(xent, ignore_index),
                               F(xent, reduction), F(xent, eps), F(xent, norm), F(xent, W)};
static const lk_op_field layer_norm_f[] = {F(layer_norm, M), F(layer_norm, L), F(layer_norm, eps)};
static const lk_op_field batch_norm_f[] = {F(batch_norm, N),   F(batch_norm, C),        F(batch_norm, S),
                                     F(batch_norm, M),   F(batch_norm, eps),      F(batch_norm, momentum),
                                     F(batch_norm, training), F(batch_norm, stride), F(batch_norm, relu)};
/* step, lr and what OneCycle cycles (SGD's and RMSprop's momentum, Adam's
 * beta1) are per step; a scheduler changes nothing else. */
static const lk_op_field optim_f[] = {F(optim, rule),         F(optim, n),     L(optim, step),  L(optim, lr),
                                L(optim, momentum),     F(optim, dampening), F(optim, weight_decay),
                                L(optim, beta1),        F(optim, beta2), F(optim, eps),   F(optim, alpha),
                                F(optim, nesterov),     F(optim, maximize), F(optim, adamw)};
static const lk_op_field pool_f[] = {F(pool, kind), F(pool, planes), F(pool, H),  F(pool, W),  F(pool, OH),
                               F(pool, OW),   F(pool, kh),     F(pool, kw), F(pool, sh), F(pool, sw),
                               F(pool, ph),   F(pool, pw),     F(pool, count_include_pad)};
static const lk_op_field im2col_f[] = {F(im2col, samples), F(im2col, C),  F(im2col, H),  F(im2col, W),  F(im2col, kh),
                                 F(im2col, kw),      F(im2col, sh), F(im2col, sw), F(im2col, ph), F(im2col, pw),
                                 F(im2col, dh),      F(im2col, dw), F(im2col, OH), F(im2col, OW), F(im2col, ldc)};
static const lk_op_field bias_f[] = {F(bias, samples), F(bias, O), F(bias, P)};
static const lk_op_field norm_f[] = {F(norm, n), F(norm, p)};
static const lk_op_field nonfinite_f[] = {F(nonfinite, n), F(nonfinite, mul)};
/* unscale's mul is 1 / the loss scale (nonfinite reads no mul) */
static const lk_op_field unscale_f[] = {F(nonfinite, n), L(nonfinite, mul)};
static const lk_op_field clamp_f[] = {F(clamp, n), F(clamp, lo), F(clamp, hi)};
static const lk_op_field embedding_f[] = {F(embedding, n), F(embedding, V), F(embedding, D)};
static const lk_op_field copy_f[] = {F(copy, ndim), F(copy, shape), F(copy, ss), F(copy, sd), F(copy, accumulate)};
static const lk_op_field fill_f[] = {F(fill, ndim), F(fill, shape), F(fill, sd), F(fill, value)};
static const lk_op_field bn_split_f[] = {F(bn_split, N), F(bn_split, C), F(bn_split, S), F(bn_split, stat), F(bn_split, backward)};
static const lk_op_field bn_finish_f[] = {F(bn_finish, C), F(bn_finish, eps), F(bn_finish, momentum), F(bn_finish, stride)};
static const lk_op_field bn_finish_bwd_f[] = {F(bn_finish, C)};
static const lk_op_field accuracy_f[] = {F(accuracy, N), F(accuracy, C)};
static const lk_op_field dropout_mask_f[] = {F(dropout_mask, n),    F(dropout_mask, key),    L(dropout_mask, ctr),
                                       L(dropout_mask, head), L(dropout_mask, head_n), F(dropout_mask, thr)};
/* ctr moves every step, but is not live: a replayed step whose mask moved
 * differs from its recording and is not replayed (kernels read no `live`). */
static const lk_op_field attention_f[] = {F(attention, B),     F(attention, T),          F(attention, H),
                                          F(attention, D),     F(attention, scale),      F(attention, thr),
                                          F(attention, keep_scale), F(attention, key), F(attention, ctr)};
static const lk_op_field increment_f[] = {F(increment, n), F(increment, by)};
static const lk_op_field clip_f[] = {F(clip, n), F(clip, p), F(clip, max_norm)};
#undef F
#undef L

#define OPI(name, arr) {name, arr, (int)(sizeof arr / sizeof arr[0])}
/* Which parameter block each op reads: ops.def's `fields` column. */
static const lk_op_info ops[LK_OP_COUNT] = {
#define LK_OP(KIND, name, arity, fields, cpu, cuda, widen) [LK_OP_##KIND] = OPI(name, fields),
#include "backend/ops.def"
#undef LK_OP
};
#undef OPI

const lk_op_info *lk__op_info(lk_op_kind op) {
    return op >= 0 && op < LK_OP_COUNT && ops[op].name ? &ops[op] : NULL;
}

bool lk__op_desc_same(const lk_op_desc *a, const lk_op_desc *b, bool but_live) {
    if (a->op != b->op) return false;
    int arity = lk__op_arity(a->op);
    for (int i = 0; i < arity; i++)
        if (a->dtype[i] != b->dtype[i]) return false;
    const lk_op_info *oi = lk__op_info(a->op);
    if (!oi) return false;
    for (int f = 0; f < oi->n; f++) {
        const lk_op_field *fl = &oi->f[f];
        if (but_live && fl->live) continue;
        if (memcmp((const char *)a + fl->off, (const char *)b + fl->off, fl->size)) return false;
    }
    return true;
}

/* The live blocks, one layout per kind (backend_impl.h's lk_*_live): what
 * the kernels read, so a device reads the block as it is. An optimizer
 * update's block is its constants, computed here in the same double
 * arithmetic as the eager path, never on a device. */
size_t lk__op_live_size(const lk_op_desc *d) {
    switch (d->op) {
    case LK_OP_AFFINE: return sizeof(lk_affine_live);
    case LK_OP_UNSCALE: return sizeof(lk_unscale_live);
    case LK_OP_DROPOUT_MASK: return sizeof(lk_dropout_mask_live);
    case LK_OP_OPTIM_UPDATE:
        switch (d->optim.rule) {
        case LK_OPTIM_RULE_SGD: return sizeof(lk_k_sgd);
        case LK_OPTIM_RULE_ADAM: return sizeof(lk_k_adam);
        case LK_OPTIM_RULE_RMSPROP: return sizeof(lk_k_rmsprop);
        }
        return 0;
    default: return 0;
    }
}

void lk__op_live_fill(const lk_op_desc *d, void *out) {
    switch (d->op) {
    case LK_OP_AFFINE: {
        const lk_affine_live v = {d->affine.mul, d->affine.add};
        memcpy(out, &v, sizeof v);
        break;
    }
    case LK_OP_UNSCALE: {
        const lk_unscale_live v = {d->nonfinite.mul};
        memcpy(out, &v, sizeof v);
        break;
    }
    case LK_OP_DROPOUT_MASK: {
        lk_dropout_mask_live v;
        memset(&v, 0, sizeof v);
        memcpy(v.ctr, d->dropout_mask.ctr, sizeof v.ctr);
        memcpy(v.head, d->dropout_mask.head, sizeof v.head);
        v.head_n = d->dropout_mask.head_n;
        memcpy(out, &v, sizeof v);
        break;
    }
    case LK_OP_OPTIM_UPDATE: {
        /* the state arrays' flags false: the operands say (lk_k_*_live); the
         * union zeroed first so its unused bytes are defined */
        lk_optim_live v;
        memset(&v, 0, sizeof v);
        switch (d->optim.rule) {
        case LK_OPTIM_RULE_SGD: v.sgd = lk__optim_sgd_consts(&d->optim); break;
        case LK_OPTIM_RULE_ADAM: v.adam = lk__optim_adam_consts(&d->optim, false); break;
        case LK_OPTIM_RULE_RMSPROP: v.rmsprop = lk__optim_rmsprop_consts(&d->optim, false, false); break;
        }
        memcpy(out, &v, lk__op_live_size(d));
        break;
    }
    default: break;
    }
}

const lk_op_desc *lk__op_live_apply(const lk_op_desc *d, lk_op_desc *tmp) {
    if (!d->live) return d;
    switch (d->op) {
    case LK_OP_AFFINE: {
        lk_affine_live v;
        memcpy(&v, d->live, sizeof v);
        *tmp = *d;
        tmp->affine.mul = v.mul, tmp->affine.add = v.add;
        return tmp;
    }
    case LK_OP_UNSCALE: {
        lk_unscale_live v;
        memcpy(&v, d->live, sizeof v);
        *tmp = *d;
        tmp->nonfinite.mul = v.mul;
        return tmp;
    }
    case LK_OP_DROPOUT_MASK: {
        lk_dropout_mask_live v;
        memcpy(&v, d->live, sizeof v);
        *tmp = *d;
        memcpy(tmp->dropout_mask.ctr, v.ctr, sizeof v.ctr);
        memcpy(tmp->dropout_mask.head, v.head, sizeof v.head);
        tmp->dropout_mask.head_n = v.head_n;
        return tmp;
    }
    default: return d; /* the optimizer reads its block itself; other kinds have none */
    }
}
