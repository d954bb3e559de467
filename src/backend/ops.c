/* What every backend uses about an op descriptor, apart from the registry
 * (registry.c names the backends, so they must not need it): an op's arity
 * and name from ops.def, whether and how a 16-bit descriptor widens to f32,
 * each operand's extent, the descriptor as text for errors, and
 * lk_set_float32_matmul_precision's setting, which a backend with a faster
 * f32 GEMM asks per call. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"

int lk__op_arity(lk_op_kind op) {
    static const signed char arity[LK_OP_COUNT] = {
#define LK_OP(KIND, name, n, fields, cpu, cuda, widen) n,
#include "backend/ops.def"
#undef LK_OP
    };
    return (int)op >= 0 && op < LK_OP_COUNT ? arity[op] : 0;
}

const char *lk__op_name(lk_op_kind op) {
    static const char *const names[LK_OP_COUNT] = {
#define LK_OP(KIND, name, n, fields, cpu, cuda, widen) name,
#include "backend/ops.def"
#undef LK_OP
    };
    return (int)op >= 0 && op < LK_OP_COUNT ? names[op] : "?";
}

bool lk__op_widens(lk_op_kind op, int *keep_f32) {
    /* NO: -2, WIDEN(k): k (-1: every operand widens) */
#define NO (-2)
#define WIDEN(k) (k)
    static const signed char keep[LK_OP_COUNT] = {
#define LK_OP(KIND, name, n, fields, cpu, cuda, widen) widen,
#include "backend/ops.def"
#undef LK_OP
    };
#undef NO
#undef WIDEN
    int k = (int)op >= 0 && op < LK_OP_COUNT ? keep[op] : -2;
    if (keep_f32) *keep_f32 = k < 0 ? -1 : k;
    return k >= -1;
}

static bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

bool lk__op_has_half(const lk_op_desc *d) {
    for (int i = 0; i < lk__op_arity(d->op); i++)
        if (is_half(d->dtype[i])) return true;
    return false;
}

lk_op_desc lk__op_widened(const lk_op_desc *d) {
    lk_op_desc f = *d;
    for (int i = 0; i < lk__op_arity(d->op); i++)
        if (is_half(f.dtype[i])) f.dtype[i] = LK_F32;
    return f;
}

bool lk__op_operand_extent(const lk_op_desc *d, int i, int64_t *count, int64_t *stride, bool *written) {
    *stride = 1;
    *written = false;
    switch (d->op) {
    case LK_OP_POOL2D: { /* x, y, idx */
        const lk_pool_params *g = &d->pool;
        *count = i == 0 ? (int64_t)g->planes * g->H * g->W : (int64_t)g->planes * g->OH * g->OW;
        *written = i >= 1;
        return true;
    }
    case LK_OP_POOL2D_BACKWARD: { /* dy, idx, dx */
        const lk_pool_params *g = &d->pool;
        *count = i == 2 ? (int64_t)g->planes * g->H * g->W : (int64_t)g->planes * g->OH * g->OW;
        *written = i == 2;
        return true;
    }
    case LK_OP_BATCH_NORM: { /* x, w, b, running_mean, running_var, y, stats */
        const lk_batch_norm_params *p = &d->batch_norm;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i == 0 || i == 5 ? ncs : i == 6 ? 2 * (int64_t)p->C : p->C;
        if (i >= 1 && i <= 4) *stride = p->stride[i - 1];
        *written = i >= 3;
        return true;
    }
    case LK_OP_BATCH_NORM_BACKWARD: { /* x, dy, stats, w, dx, dw, db, y (relu) */
        const lk_batch_norm_params *p = &d->batch_norm;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i <= 1 || i == 4 || i == 7 ? ncs : i == 2 ? 2 * (int64_t)p->C : p->C;
        *written = i >= 4 && i <= 6;
        return true;
    }
    case LK_OP_LAYER_NORM: { /* x, w, b, y, stats */
        const lk_layer_norm_params *p = &d->layer_norm;
        *count = i == 0 || i == 3 ? p->M * p->L : i == 4 ? 2 * p->M : p->L;
        *written = i >= 3;
        return true;
    }
    case LK_OP_LAYER_NORM_BACKWARD: { /* x, dy, stats, w, dx, dw, db */
        const lk_layer_norm_params *p = &d->layer_norm;
        *count = i <= 1 || i == 4 ? p->M * p->L : i == 2 ? 2 * p->M : p->L;
        *written = i >= 4;
        return true;
    }
    case LK_OP_BN_STATS: /* x, g, mean [C], out (f64) */
    case LK_OP_BN_APPLY: { /* x, g, coef [2C] or [4C], y */
        const lk_bn_split_params *p = &d->bn_split;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        bool apply = d->op == LK_OP_BN_APPLY;
        *count = i <= 1 || (apply && i == 3) ? ncs
                 : !apply ? (i == 3 && p->stat == LK_BN_MOMENTS ? 2 : 1) * (int64_t)p->C
                          : (p->backward ? 4 : 2) * (int64_t)p->C;
        *written = i == 3;
        return true;
    }
    case LK_OP_BN_FINISH: { /* sums [2C + 1], w, b, running_mean, running_var, stats [2C], coef [2C] */
        const lk_bn_finish_params *p = &d->bn_finish;
        int64_t C = p->C;
        *count = i == 0 ? 2 * C + 1 : i >= 5 ? 2 * C : C;
        if (i >= 1 && i <= 4) *stride = p->stride[i - 1];
        *written = i >= 3;
        return true;
    }
    case LK_OP_BN_FINISH_BACKWARD: { /* sums [4C], w, count [1], stats [2C], dw, db, coef [4C] */
        int64_t C = d->bn_finish.C;
        *count = i == 0 || i == 6 ? 4 * C : i == 2 ? 1 : i == 3 ? 2 * C : C;
        *written = i >= 4;
        return true;
    }
    case LK_OP_ATTENTION: /* qkv, y, lse */
    case LK_OP_ATTENTION_BACKWARD: { /* qkv, y, lse, dy, dqkv */
        const lk_attention_params *p = &d->attention;
        int64_t rows = p->B * p->T * p->H;
        *count = i == 0 || i == 4 ? 3 * rows * p->D : i == 2 ? rows : rows * p->D;
        *written = d->op == LK_OP_ATTENTION ? i >= 1 : i == 4;
        return true;
    }
    case LK_OP_EMBEDDING_BACKWARD: { /* g [n, D], idx, dw [V, D] */
        const lk_embedding_params *p = &d->embedding;
        *count = i == 0 ? p->n * p->D : i == 2 ? p->V * p->D : p->n;
        *written = i == 2;
        return true;
    }
    case LK_OP_BIAS_ADD: /* y [O, samples*P] (f32), b [O], out [samples, O, P] */
    case LK_OP_CHANNEL_SUM: { /* dy [samples, O, P], db [O] (f32) */
        const lk_bias_params *p = &d->bias;
        int64_t big = (int64_t)p->samples * p->O * p->P;
        bool sum = d->op == LK_OP_CHANNEL_SUM;
        *count = sum ? (i == 0 ? big : p->O) : i == 1 ? p->O : big;
        *written = sum ? i == 1 : i == 2;
        return true;
    }
    default: return false;
    }
}

const char *lk__unary_name(lk_unary_op fn) {
    static const char *const names[] = {"relu", "gelu_tanh", "gelu_exact", "tanh", "sigmoid", "exp", "log",
                                        "sqrt", "abs",       "leaky_relu", "elu",  "silu",    "neg"};
    _Static_assert(sizeof names / sizeof names[0] == LK_UNARY_COUNT, "a name per lk_unary_op");
    return (int)fn >= 0 && fn < LK_UNARY_COUNT ? names[fn] : "?";
}

const char *lk__binary_name(lk_binary_op fn) {
    static const char *const names[] = {"add", "sub", "mul", "div"};
    return (int)fn >= 0 && (int)fn < 4 ? names[fn] : "?";
}

/* "4x3" (or "scalar") into buf. */
static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t k = 0;
    buf[0] = 0;
    if (ndim == 0) snprintf(buf, size, "scalar");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? "x" : "", (long long)shape[i]);
    return buf;
}

const char *lk__op_desc_str(const lk_op_desc *d, char *buf, size_t size) {
#define DT(i) lk_dtype_name(d->dtype[i])
    char sh[96];
    switch (d->op) {
    case LK_OP_GEMM:
        snprintf(buf, size, "gemm %s x %s -> %s (%c%c, %lldx%lldx%lld)", DT(0), DT(1), DT(2),
                 d->gemm.trans_a ? 'T' : 'N', d->gemm.trans_b ? 'T' : 'N', (long long)d->gemm.M,
                 (long long)d->gemm.N, (long long)d->gemm.K);
        return buf;
    case LK_OP_UNARY:
        snprintf(buf, size, "unary %s %s -> %s (%lld)", lk__unary_name(d->unary.fn), DT(0), DT(1),
                 (long long)d->unary.n);
        return buf;
    case LK_OP_UNARY_BACKWARD:
        snprintf(buf, size, "unary_backward %s x %s, y %s, dy %s -> dx %s (%lld)", lk__unary_name(d->unary.fn), DT(0),
                 DT(1), DT(2), DT(3), (long long)d->unary.n);
        return buf;
    case LK_OP_BINARY:
        snprintf(buf, size, "binary %s %s, %s -> %s (%s)", lk__binary_name(d->binary.fn), DT(0), DT(1), DT(2),
                 shape_str(d->binary.ndim, d->binary.shape, sh, sizeof sh));
        return buf;
    case LK_OP_AXPY:
        snprintf(buf, size, "axpy %s -> %s (%lld)", DT(0), DT(1), (long long)d->axpy.n);
        return buf;
    case LK_OP_AFFINE:
        snprintf(buf, size, "affine %s -> %s (%lld)", DT(0), DT(1), (long long)d->affine.n);
        return buf;
    case LK_OP_SUM_TO:
        snprintf(buf, size, "sum_to %s -> %s (%s)", DT(0), DT(1),
                 shape_str(d->sum_to.ndim, d->sum_to.shape, sh, sizeof sh));
        return buf;
    case LK_OP_SOFTMAX:
    case LK_OP_SOFTMAX_BACKWARD:
        snprintf(buf, size, "%s%s %s%s%s -> %s (%lldx%lldx%lld)", d->softmax.log_out ? "log_softmax" : "softmax",
                 d->op == LK_OP_SOFTMAX ? "" : "_backward", DT(0), d->op == LK_OP_SOFTMAX ? "" : ", ",
                 d->op == LK_OP_SOFTMAX ? "" : DT(1), d->op == LK_OP_SOFTMAX ? DT(1) : DT(2),
                 (long long)d->softmax.outer, (long long)d->softmax.C, (long long)d->softmax.inner);
        return buf;
    case LK_OP_LOSS:
    case LK_OP_LOSS_BACKWARD: {
        static const char *const kinds[] = {"mse", "l1", "smooth_l1"}, *const reds[] = {"mean", "sum", "none"};
        unsigned k = (unsigned)d->loss.kind, r = (unsigned)d->loss.reduction;
        snprintf(buf, size, "%s%s %s, %s%s%s -> %s (%lld, %s)", k < 3 ? kinds[k] : "?",
                 d->op == LK_OP_LOSS ? "_loss" : "_loss_backward", DT(0), DT(1), d->op == LK_OP_LOSS ? "" : ", ",
                 d->op == LK_OP_LOSS ? "" : DT(2), d->op == LK_OP_LOSS ? DT(2) : DT(3), (long long)d->loss.n,
                 r < 3 ? reds[r] : "?");
        return buf;
    }
    case LK_OP_LAYER_NORM:
        snprintf(buf, size, "layer_norm x %s, w %s, b %s -> %s (%lld rows of %lld)", DT(0), DT(1), DT(2), DT(3),
                 (long long)d->layer_norm.M, (long long)d->layer_norm.L);
        return buf;
    case LK_OP_LAYER_NORM_BACKWARD:
        snprintf(buf, size, "layer_norm_backward x %s, dy %s, w %s -> dx %s, dw %s, db %s (%lld rows of %lld)", DT(0),
                 DT(1), DT(3), DT(4), DT(5), DT(6), (long long)d->layer_norm.M, (long long)d->layer_norm.L);
        return buf;
    case LK_OP_OPTIM_UPDATE: {
        static const char *const rules[] = {"sgd", "adam", "rmsprop"};
        unsigned r = (unsigned)d->optim.rule;
        snprintf(buf, size, "optim_update %s%s p %s, g %s, state %s (%lld)", r < 3 ? rules[r] : "?",
                 d->optim.adamw ? "w" : "", DT(0), DT(1), DT(2), (long long)d->optim.n);
        return buf;
    }
    case LK_OP_POOL2D:
    case LK_OP_POOL2D_BACKWARD: {
        static const char *const kinds[] = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"};
        unsigned k = (unsigned)d->pool.kind;
        bool fwd = d->op == LK_OP_POOL2D;
        snprintf(buf, size, "%s%s %s -> %s (%ld planes, %ldx%ld -> %ldx%ld)", k < 3 ? kinds[k] : "?",
                 fwd ? "" : "_backward", DT(0), DT(fwd ? 1 : 2), d->pool.planes, d->pool.H, d->pool.W,
                 d->pool.OH, d->pool.OW);
        return buf;
    }
    case LK_OP_BCE:
    case LK_OP_BCE_BACKWARD: {
        static const char *const reds[] = {"mean", "sum", "none"};
        unsigned r = (unsigned)d->bce.reduction;
        snprintf(buf, size, "bce%s%s x %s, target %s (%lld, %s)", d->bce.logits ? "_with_logits" : "",
                 d->op == LK_OP_BCE ? "" : "_backward", DT(0), DT(1), (long long)d->bce.n, r < 3 ? reds[r] : "?");
        return buf;
    }
    case LK_OP_XENT:
    case LK_OP_XENT_BACKWARD:
    case LK_OP_NLL:
    case LK_OP_NLL_BACKWARD: {
        static const char *const names[] = {"cross_entropy", "cross_entropy_backward", "nll_loss", "nll_loss_backward"};
        snprintf(buf, size, "%s x %s, target %s (%lldx%lldx%lld)", names[d->op - LK_OP_XENT],
                 DT(d->op == LK_OP_NLL_BACKWARD ? 2 : 0), DT(d->op == LK_OP_NLL_BACKWARD ? 0 : 1),
                 (long long)d->xent.N, (long long)d->xent.C, (long long)d->xent.D);
        return buf;
    }
    case LK_OP_BATCH_NORM:
    case LK_OP_BATCH_NORM_BACKWARD:
        snprintf(buf, size, "batch_norm%s%s%s x %s (%ldx%ldx%ld)", d->op == LK_OP_BATCH_NORM ? "" : "_backward",
                 d->batch_norm.relu ? "+relu" : "", d->batch_norm.training ? "" : " eval", DT(0), d->batch_norm.N, d->batch_norm.C, d->batch_norm.S);
        return buf;
    case LK_OP_MASK_SCALE:
        snprintf(buf, size, "mask_scale %s, mask %s -> %s (%lld)", DT(0), DT(1), DT(2), (long long)d->mask_scale.n);
        return buf;
    case LK_OP_IM2COL:
    case LK_OP_COL2IM: {
        const lk_im2col_params *g = &d->im2col;
        snprintf(buf, size, "%s %s -> %s (%ldx%ldx%ldx%ld, kernel %ldx%ld -> %ldx%ld)",
                 d->op == LK_OP_IM2COL ? "im2col" : "col2im", DT(0), DT(1), g->samples, g->C, g->H, g->W, g->kh,
                 g->kw, g->OH, g->OW);
        return buf;
    }
    case LK_OP_BIAS_ADD:
        snprintf(buf, size, "bias_add %s, b %s -> %s (%ldx%ldx%ld)", DT(0), DT(1), DT(2), d->bias.samples, d->bias.O,
                 d->bias.P);
        return buf;
    case LK_OP_CHANNEL_SUM:
        snprintf(buf, size, "channel_sum %s -> %s (%ldx%ldx%ld)", DT(0), DT(1), d->bias.samples, d->bias.O,
                 d->bias.P);
        return buf;
    case LK_OP_NORM:
        snprintf(buf, size, "norm p=%g %s -> %s (%lld)", d->norm.p, DT(0), DT(1), (long long)d->norm.n);
        return buf;
    case LK_OP_NONFINITE:
        snprintf(buf, size, "nonfinite %s -> index %s (%lld)", DT(0), DT(1), (long long)d->nonfinite.n);
        return buf;
    case LK_OP_UNSCALE:
        snprintf(buf, size, "unscale %s -> %s, count %s (%lld)", DT(0), DT(1), DT(2), (long long)d->nonfinite.n);
        return buf;
    case LK_OP_CLAMP:
        snprintf(buf, size, "clamp [%g, %g] %s -> %s (%lld)", (double)d->clamp.lo, (double)d->clamp.hi, DT(0), DT(1),
                 (long long)d->clamp.n);
        return buf;
    case LK_OP_EMBEDDING:
    case LK_OP_EMBEDDING_BACKWARD:
        snprintf(buf, size, "embedding%s %s, idx %s -> %s (%lld of %lldx%lld)",
                 d->op == LK_OP_EMBEDDING ? "" : "_backward", DT(0), DT(1), DT(2), (long long)d->embedding.n,
                 (long long)d->embedding.V, (long long)d->embedding.D);
        return buf;
    case LK_OP_BN_STATS: {
        static const char *const stats[] = {"sum", "sqdev", "grad", "moments"};
        unsigned k = (unsigned)d->bn_split.stat;
        snprintf(buf, size, "bn_stats %s x %s -> %s (%ldx%ldx%ld)", k < 4 ? stats[k] : "?", DT(0), DT(3),
                 d->bn_split.N, d->bn_split.C, d->bn_split.S);
        return buf;
    }
    case LK_OP_BN_APPLY:
        snprintf(buf, size, "bn_apply%s x %s -> %s (%ldx%ldx%ld)", d->bn_split.backward ? " backward" : "", DT(0),
                 DT(3), d->bn_split.N, d->bn_split.C, d->bn_split.S);
        return buf;
    case LK_OP_BN_FINISH:
        snprintf(buf, size, "bn_finish sums %s, w %s, b %s, running %s/%s -> %s (C=%ld)", DT(0), DT(1), DT(2), DT(3),
                 DT(4), DT(5), d->bn_finish.C);
        return buf;
    case LK_OP_BN_FINISH_BACKWARD:
        snprintf(buf, size, "bn_finish_backward sums %s, w %s -> %s (C=%ld)", DT(0), DT(1), DT(6), d->bn_finish.C);
        return buf;
    case LK_OP_CLIP_COEF:
        snprintf(buf, size, "clip_coef p=%g max_norm=%g %s -> %s (%lld)", d->clip.p, d->clip.max_norm, DT(0), DT(1),
                 (long long)d->clip.n);
        return buf;
    case LK_OP_SCALE_BY:
        snprintf(buf, size, "scale_by %s x %s -> %s (%lld)", DT(0), DT(1), DT(2), (long long)d->clip.n);
        return buf;
    case LK_OP_COPY: {
        char sh[96];
        snprintf(buf, size, "copy%s %s -> %s (%s)", d->copy.accumulate ? " accumulate" : "", DT(0), DT(1), shape_str(d->copy.ndim, d->copy.shape, sh, sizeof sh));
        return buf;
    }
    case LK_OP_FILL: {
        char sh[96];
        snprintf(buf, size, "fill %s (%s) with %g", DT(0), shape_str(d->fill.ndim, d->fill.shape, sh, sizeof sh), d->fill.value);
        return buf;
    }
    case LK_OP_ACCURACY:
        snprintf(buf, size, "accuracy %s, target %s -> %s (%lldx%lld)", DT(0), DT(1), DT(2), (long long)d->accuracy.N,
                 (long long)d->accuracy.C);
        return buf;
    case LK_OP_DROPOUT_MASK:
        snprintf(buf, size, "dropout_mask -> %s (%lld, p %g)", DT(0), (long long)d->dropout_mask.n,
                 (double)d->dropout_mask.thr / 16777216.0);
        return buf;
    case LK_OP_INCREMENT:
        snprintf(buf, size, "increment %s by %lld (%lld)", DT(0), (long long)d->increment.by, (long long)d->increment.n);
        return buf;
    default: break; /* a kind without words of its own: its name and dtypes */
    }
    int arity = lk__op_arity(d->op);
    if (!arity) {
        snprintf(buf, size, "op %d", (int)d->op);
        return buf;
    }
    size_t k = (size_t)snprintf(buf, size, "%s", lk__op_name(d->op));
    for (int i = 0; i < arity && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? ", " : " ", DT(i));
#undef DT
    return buf;
}

/* lk_set_float32_matmul_precision: 0 highest, 1 high, 2 medium. A backend
 * whose f32 GEMMs have a faster, less exact mode (cuda: TF32) asks
 * lk__f32_matmul_reduced() per GEMM. */
static _Atomic int f32_matmul = 0;
static const char *const f32_matmul_names[] = {"highest", "high", "medium"};

lk_status lk__f32_matmul_parse(const char *what, const char *precision, int *level) {
    for (int i = 0; i < 3; i++)
        if (precision && !strcmp(precision, f32_matmul_names[i])) {
            if (level) *level = i;
            return LK_STATUS_OK;
        }
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s '%s': expected highest, high or medium", what,
                    precision ? precision : "(null)");
}
lk_status lk_set_float32_matmul_precision(const char *precision) {
    int level;
    LK_TRY(lk__f32_matmul_parse("float32_matmul_precision", precision, &level));
    atomic_store(&f32_matmul, level);
    return LK_STATUS_OK;
}
const char *lk_float32_matmul_precision(void) { return f32_matmul_names[atomic_load(&f32_matmul)]; }
bool lk__f32_matmul_reduced(void) { return atomic_load(&f32_matmul) != 0; }
