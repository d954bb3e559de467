/* The CPU backend: the reference every other backend is tested against. It
 * answers supports() for each op family and hands run() to that family's
 * file (gemm.c, elementwise.c, softmax.c, loss.c; the bf16/f16 GEMMs in
 * ../cpu_lowp.c), to the file's copy for this CPU's instruction set
 * (LK_ISA_PICK, backend/isa.h). This file is compiled for the baseline
 * only: no loop over a tensor's elements belongs here. */
#include "backend/cpu/cpu_impl.h"

static bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

/* The families widen.c runs in bf16/f16 (ops.def's WIDEN; embedding's
 * forward is a plain row copy in any float dtype). */
static bool widens(lk_op_kind op) { return lk__op_widens(op, NULL); }

static bool cpu_supports(const lk_op_desc *d) {
    if (widens(d->op) && lk__op_has_half(d)) { /* as the f32 descriptor, each operand f32, bf16 or f16 */
        lk_op_desc f = lk__op_widened(d);
        return cpu_supports(&f);
    }
    switch (d->op) {
    case LK_OP_GEMM: {
        lk_dtype a = d->dtype[0], b = d->dtype[1], c = d->dtype[2];
        if (a == LK_F32) return b == LK_F32 && c == LK_F32;
        return is_half(a) && b == a && (c == LK_F32 || c == a);
    }
    case LK_OP_UNARY:
    case LK_OP_UNARY_BACKWARD:
    case LK_OP_BINARY:
    case LK_OP_AXPY:
    case LK_OP_AFFINE:
    case LK_OP_SUM_TO: return lk__cpu_elementwise_supports(d);
    case LK_OP_LOSS:
    case LK_OP_LOSS_BACKWARD: /* x (and dx) f32, bf16 or f16 alike, target f32 or 16-bit, the rest f32 */
        if (d->dtype[0] != LK_F32 && !is_half(d->dtype[0])) return false;
        if (d->dtype[1] != LK_F32 && !is_half(d->dtype[1])) return false;
        if (d->dtype[2] != LK_F32 || (d->op == LK_OP_LOSS_BACKWARD && d->dtype[3] != d->dtype[0])) return false;
        return (unsigned)d->loss.kind <= LK_PLOSS_SMOOTH_L1 && d->loss.reduction >= 0 && d->loss.reduction <= 2;
    case LK_OP_OPTIM_UPDATE: /* parameters and gradients f32, bf16 or f16 (one dtype), state f32 */
        return (d->dtype[0] == LK_F32 || d->dtype[0] == LK_BF16 || d->dtype[0] == LK_F16) && d->dtype[1] == d->dtype[0] &&
               d->dtype[2] == LK_F32 && d->dtype[3] == LK_F32 && d->dtype[4] == LK_F32;
    case LK_OP_SOFTMAX:
    case LK_OP_SOFTMAX_BACKWARD:
    case LK_OP_LAYER_NORM:
    case LK_OP_LAYER_NORM_BACKWARD:
    case LK_OP_BATCH_NORM:
    case LK_OP_BATCH_NORM_BACKWARD:
    case LK_OP_BCE:
    case LK_OP_BCE_BACKWARD: { /* f32 only for now */
        for (int i = 0; i < lk__op_arity(d->op); i++)
            if (d->dtype[i] != LK_F32) return false;
        if (d->op == LK_OP_BCE || d->op == LK_OP_BCE_BACKWARD) return d->bce.reduction >= 0 && d->bce.reduction <= 2;
        return true;
    }
    case LK_OP_POOL2D: /* f32 data, i32 indices (max only) */
        return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 &&
               (d->pool.kind != LK_POOL_MAX || d->dtype[2] == LK_I32) && (unsigned)d->pool.kind <= LK_POOL_ADAPTIVE_AVG;
    case LK_OP_POOL2D_BACKWARD:
        return d->dtype[0] == LK_F32 && d->dtype[2] == LK_F32 &&
               (d->pool.kind != LK_POOL_MAX || d->dtype[1] == LK_I32) && (unsigned)d->pool.kind <= LK_POOL_ADAPTIVE_AVG;
    case LK_OP_XENT:
    case LK_OP_XENT_BACKWARD:
    case LK_OP_NLL:
    case LK_OP_NLL_BACKWARD: return lk__cpu_xent_supports(d);
    case LK_OP_MASK_SCALE: /* f32, or bf16/f16 in and out (dropout of a 16-bit activation under autocast) */
        return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == LK_U8 && d->dtype[2] == d->dtype[0];
    case LK_OP_IM2COL: /* f32 -> f32, or bf16/f16 -> the same */
        return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == d->dtype[0];
    case LK_OP_BIAS_ADD: /* f32 sums, a bias and an output of any float dtype */
        return d->dtype[0] == LK_F32 && (d->dtype[1] == LK_F32 || is_half(d->dtype[1])) &&
               (d->dtype[2] == LK_F32 || is_half(d->dtype[2]));
    case LK_OP_CHANNEL_SUM: /* dY f32 or 16-bit, db f32 */
        return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == LK_F32;
    case LK_OP_ATTENTION:
    case LK_OP_ATTENTION_BACKWARD: /* f32 (16-bit operands widen: ops.def), heads up to LK_ATTENTION_MAX_D wide */
        for (int i = 0; i < lk__op_arity(d->op); i++)
            if (d->dtype[i] != LK_F32) return false;
        return d->attention.D >= 1 && d->attention.D <= LK_ATTENTION_MAX_D && d->attention.thr >= 0 &&
               d->attention.thr <= 16777216.0f;
    case LK_OP_COL2IM: /* f32 only */
        for (int i = 0; i < lk__op_arity(d->op); i++)
            if (d->dtype[i] != LK_F32) return false;
        return true;
    case LK_OP_NORM: return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == LK_F64 && d->norm.p > 0;
    case LK_OP_NONFINITE: return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == LK_I64;
    case LK_OP_UNSCALE: return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 && d->dtype[2] == LK_I64;
    case LK_OP_CLAMP: return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == d->dtype[0];
    case LK_OP_COPY: /* any dtypes lk_dtype_size knows; accumulate f32 only */
        return lk_dtype_size(d->dtype[0]) && lk_dtype_size(d->dtype[1]) && (unsigned)d->copy.ndim <= LK_MAX_DIMS &&
               (!d->copy.accumulate || (d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32));
    case LK_OP_FILL: return lk_dtype_size(d->dtype[0]) && (unsigned)d->fill.ndim <= LK_MAX_DIMS;
    case LK_OP_BN_STATS:
        return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 && d->dtype[2] == LK_F32 && d->dtype[3] == LK_F64 &&
               (unsigned)d->bn_split.stat <= LK_BN_MOMENTS;
    case LK_OP_BN_APPLY:
        return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 && d->dtype[2] == LK_F32 && d->dtype[3] == LK_F32;
    case LK_OP_BN_FINISH: /* 16-bit w, b, running statistics widen (ops.def) */
        for (int i = 1; i < 7; i++)
            if (d->dtype[i] != LK_F32 && !is_half(d->dtype[i])) return false;
        return d->dtype[0] == LK_F64 && d->bn_finish.C >= 0;
    case LK_OP_BN_FINISH_BACKWARD:
        for (int i = 0; i < 7; i++)
            if (d->dtype[i] != (i == 0 || i == 2 ? LK_F64 : LK_F32)) return false;
        return d->bn_finish.C >= 0;
    case LK_OP_CLIP_COEF:
        return d->dtype[0] == LK_F64 && d->dtype[1] == LK_F32 && d->clip.n >= 0 &&
               (d->clip.p == 1.0 || d->clip.p == 2.0 || (isinf(d->clip.p) && d->clip.p > 0));
    case LK_OP_SCALE_BY:
        return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) && d->dtype[1] == LK_F32 && d->dtype[2] == d->dtype[0];
    case LK_OP_EMBEDDING:
    case LK_OP_EMBEDDING_BACKWARD:
        return (d->op == LK_OP_EMBEDDING ? d->dtype[0] == LK_F32 || is_half(d->dtype[0]) : d->dtype[0] == LK_F32) &&
               (d->dtype[1] == LK_I32 || d->dtype[1] == LK_I64) && d->dtype[2] == d->dtype[0];
    case LK_OP_ACCURACY: /* 16-bit logits read by the kernel itself (no widening pass) */
        return (d->dtype[0] == LK_F32 || is_half(d->dtype[0])) &&
               (d->dtype[1] == LK_I64 || d->dtype[1] == LK_I32 || d->dtype[1] == LK_U8) && d->dtype[2] == LK_F64 &&
               d->accuracy.N >= 0 && d->accuracy.C >= 0;
    case LK_OP_DROPOUT_MASK: /* a live head_n is checked where it is read (cpu_run) */
        return d->dtype[0] == LK_U8 && d->dropout_mask.n >= 0 &&
               (d->live || (d->dropout_mask.head_n >= 0 && d->dropout_mask.head_n <= 3 &&
                            d->dropout_mask.head_n <= d->dropout_mask.n));
    case LK_OP_INCREMENT: return d->dtype[0] == LK_I64 && d->increment.n >= 0;
    default: break; /* a kind without a rule here is not taken */
    }
    return false;
}

static lk_status cpu_run(const lk_op_desc *d, void *const *x);

/* ops.def's HERE(fn) rows: the ops with no loop worth an instruction-set copy. */
static lk_status cpu_gemm(const lk_op_desc *d, void *const *x) {
    if (d->dtype[0] != LK_F32) return lk__cpu_gemm_lowp(d, x[0], x[1], x[2]);
    return lk__cpu_gemm_f32(d, x[0], x[1], x[2]);
}

static lk_status cpu_increment(const lk_op_desc *d, void *const *x) {
    int64_t *v = x[0];
    for (int64_t i = 0; i < d->increment.n; i++) v[i] = (int64_t)((uint64_t)v[i] + (uint64_t)d->increment.by);
    return LK_STATUS_OK;
}

static lk_status cpu_clip_coef(const lk_op_desc *d, void *const *x) {
    *(float *)x[1] = lk_k_clip_coef(x[0], d->clip.n, d->clip.p, d->clip.max_norm);
    return LK_STATUS_OK;
}

static lk_status cpu_scale_by(const lk_op_desc *d, void *const *x) {
    /* LK_OP_AFFINE itself, so the bits are the host-computed coefficient's */
    lk_op_desc a = {.op = LK_OP_AFFINE, .dtype = {d->dtype[0], d->dtype[2]}};
    a.affine = (lk_affine_params){d->clip.n, *(const float *)x[1], 0.0f, false};
    return cpu_run(&a, (void *[]){x[0], x[2]});
}

static lk_status cpu_run(const lk_op_desc *d, void *const *x) {
    /* per-step values from `live` (host memory on the CPU) over the
     * descriptor's; the optimizer reads its constants itself (cpu/optim.c) */
    lk_op_desc tmp;
    d = lk__op_live_apply(d, &tmp);
    if (d->live && d->op == LK_OP_DROPOUT_MASK &&
        (d->dropout_mask.head_n < 0 || d->dropout_mask.head_n > 3 || d->dropout_mask.head_n > d->dropout_mask.n))
        return lk_error(LK_STATUS_INTERNAL, "cpu backend: dropout_mask's live head_n is %d (expected 0..3, at most n = %lld)",
                        d->dropout_mask.head_n, (long long)d->dropout_mask.n);
    if (widens(d->op) && lk__op_has_half(d)) switch (d->op) {
        case LK_OP_POOL2D:
        case LK_OP_POOL2D_BACKWARD: return LK_ISA_PICK(lk__cpu_pool2d)(d, x);
        case LK_OP_BATCH_NORM:
        case LK_OP_BATCH_NORM_BACKWARD:
            return lk__cpu_bn_native_half(d, x) ? LK_ISA_PICK(lk__cpu_batch_norm)(d, x) : lk__cpu_bn_half(d, x, cpu_run);
        case LK_OP_LAYER_NORM:
        case LK_OP_LAYER_NORM_BACKWARD: return lk__cpu_ln_half(d, x, cpu_run);
        default: return lk__cpu_run_widened(d, x, cpu_run);
        }
    switch (d->op) { /* ops.def's cpu column */
#define ISA(family) LK_ISA_PICK(lk__cpu_##family)
#define HERE(fn) cpu_##fn
#define LK_OP(KIND, name, arity, fields, cpu, cuda, widen) \
    case LK_OP_##KIND: return cpu(d, x);
#include "backend/ops.def"
#undef LK_OP
#undef ISA
#undef HERE
    default: break;
    }
    return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d", (int)d->op);
}

const lk_backend lk__cpu_backend = {
    .name = "cpu",
    .supports = cpu_supports,
    .run = cpu_run,
};
