/* Causal multi-head self-attention on GPT-2's packed projections, two ways.
 * lk_causal_self_attention is one backend op (LK_OP_ATTENTION and its
 * backward, flash-attention style: no [T, T] matrix, the rows' logsumexp
 * kept, probabilities recomputed in the backward; dropout drawn from the
 * position, so no mask is stored either). lk_causal_self_attention_naive is
 * the composed reference: the scores of every head materialised as a
 * [B*H, T, T] tensor, a causal mask added, softmax, optional dropout, the
 * weighted sum of the values — each step an existing differentiable op. The
 * fused op is checked and measured against it (their dropout masks differ:
 * each draws its own). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

static const char *const op_name = "causal_self_attention";

static lk_status check_qkv(const lk_tensor *qkv, int n_head, float dropout_p) {
    if (qkv->ndim != 3 || n_head < 1 || qkv->shape[2] % (3 * (int64_t)n_head))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: qkv has %d dims (last %lld) and n_head %d: expected [B, T, 3C] with C divisible by n_head",
                        op_name, qkv->ndim, qkv->ndim ? (long long)qkv->shape[qkv->ndim - 1] : 0LL, n_head);
    if (!(dropout_p >= 0.0f && dropout_p < 1.0f))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: dropout probability %g is outside [0, 1)", op_name,
                        (double)dropout_p);
    return lk__check_float(op_name, qkv, "qkv");
}

static lk_tensor *heads(lk_tensor *qkv, int which, int64_t B, int64_t T, int64_t H, int64_t D) {
    /* qkv[..., which*C : (which+1)*C] as [B*H, T, D] */
    lk_tensor *s = lk_slice(qkv, 2, which * H * D, (which + 1) * H * D);
    lk_tensor *c = s ? lk_contiguous(s) : NULL;
    lk_tensor *r = c ? lk_reshape(c, 4, (int64_t[]){B, T, H, D}) : NULL;
    lk_tensor *t = r ? lk_transpose(r, 1, 2) : NULL;
    lk_tensor *tc = t ? lk_contiguous(t) : NULL;
    return tc ? lk_reshape(tc, 3, (int64_t[]){B * H, T, D}) : NULL;
}

lk_tensor *lk_causal_self_attention_naive(lk_tensor *qkv, int n_head, float dropout_p, bool training, lk_rng *rng) {
    LK_OP_CHECK_INPUTS(qkv);
    static const char *op = "causal_self_attention";
    if (check_qkv(qkv, n_head, dropout_p)) return NULL;
    int64_t B = qkv->shape[0], T = qkv->shape[1], H = n_head, D = qkv->shape[2] / 3 / H;
    lk_tensor *q = heads(qkv, 0, B, T, H, D), *k = heads(qkv, 1, B, T, H, D), *v = heads(qkv, 2, B, T, H, D);
    if (!q || !k || !v) return NULL;
    lk_tensor *kt = lk_transpose(k, 1, 2);
    lk_tensor *att = kt ? lk_matmul(q, kt) : NULL;
    att = att ? lk_mul_scalar(att, (float)(1.0 / sqrt((double)D))) : NULL;
    if (!att) return NULL;
    float *m = lk_malloc((size_t)(T * T) * sizeof *m);
    if (!m) return lk_error(LK_STATUS_OUT_OF_MEMORY, "%s: mask of %lld x %lld", op, (long long)T, (long long)T), NULL;
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) m[i * T + j] = j <= i ? 0.0f : -INFINITY;
    lk_tensor *host = lk_tensor_from_data(LK_F32, 2, (int64_t[]){T, T}, m);
    lk_free(m);
    lk_tensor *mask = host ? lk_tensor_to(host, qkv->device) : NULL;
    lk_tensor_release(host);
    if (!mask) return NULL;
    att = lk_add(att, mask);
    lk_tensor_release(mask);
    att = att ? lk_softmax(att, -1) : NULL;
    if (att && training && dropout_p > 0) att = lk_dropout(att, dropout_p, training, rng);
    lk_tensor *y = att ? lk_matmul(att, v) : NULL;
    y = y ? lk_reshape(y, 4, (int64_t[]){B, H, T, D}) : NULL;
    y = y ? lk_transpose(y, 1, 2) : NULL;
    y = y ? lk_contiguous(y) : NULL;
    return y ? lk_reshape(y, 3, (int64_t[]){B, T, H * D}) : NULL;
}

/* ---- the fused op ---------------------------------------------------------------- */

/* node: in[0] qkv; saved[0] qkv (contiguous), saved[1] lse; the output is
 * node->out; a.i[0..3] B, T, H, D; a.f[0] scale, a.f[1] thr, a.f[2]
 * keep_scale; rng: the key and counter the forward drew the mask from. */
static lk_op_desc attention_desc(lk_op_kind kind, const int64_t *i, const float *f, const lk_rng *rng) {
    lk_op_desc d = {.op = kind};
    lk_attention_params *p = &d.attention;
    p->B = i[0], p->T = i[1], p->H = i[2], p->D = i[3];
    p->scale = f[0], p->thr = f[1], p->keep_scale = f[2];
    memcpy(p->key, rng->key, sizeof p->key);
    memcpy(p->ctr, rng->ctr, sizeof p->ctr);
    return d;
}

static void attention_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *qkv = n->saved[0], *lse = n->saved[1], *y = n->out;
    lk_tensor *dqkv = lk__tensor_new_on(qkv->device, qkv->dtype, qkv->ndim, qkv->shape);
    if (!dqkv) return;
    lk_op_desc d = attention_desc(LK_OP_ATTENTION_BACKWARD, n->a.i, n->a.f, &n->rng);
    d.dtype[0] = qkv->dtype, d.dtype[1] = y->dtype, d.dtype[2] = LK_F32, d.dtype[3] = g->dtype, d.dtype[4] = qkv->dtype;
    if (lk__backend_run(qkv->device, &d, (void *[]){qkv->data, y->data, lse->data, g->data, dqkv->data})) {
        lk_tensor_release(dqkv);
        return;
    }
    lk__accum_move(n->in[0], dqkv);
}

/* Moves rng past the n draws the op's mask used: whole Philox blocks from
 * its counter (words left in its buffer are dropped; the stream stays a
 * pure function of where it started). */
static void advance(lk_rng *rng, int64_t n) {
    uint64_t c = ((uint64_t)rng->ctr[1] << 32 | rng->ctr[0]) + (uint64_t)((n + 3) / 4);
    rng->ctr[0] = (uint32_t)c, rng->ctr[1] = (uint32_t)(c >> 32);
    rng->pos = 4;
}

lk_tensor *lk_causal_self_attention(lk_tensor *qkv, int n_head, float dropout_p, bool training, lk_rng *rng) {
    LK_OP_CHECK_INPUTS(qkv);
    if (check_qkv(qkv, n_head, dropout_p)) return NULL;
    int64_t B = qkv->shape[0], T = qkv->shape[1], H = n_head, C = qkv->shape[2] / 3, D = C / H;
    if (D > LK_ATTENTION_MAX_D)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: heads of %lld (n_embd %lld / n_head %d); at most %d are supported",
                        op_name, (long long)D, (long long)C, n_head, LK_ATTENTION_MAX_D),
               NULL;
    bool drop = training && dropout_p > 0.0f;
    if (drop && !rng)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: training with dropout %g needs an rng stream (lk_rng_init(&r, seed, LK_RNG_DROPOUT, ...))",
                        op_name, (double)dropout_p),
               NULL;
    lk_dtype odt = lk__autocast_dtype_for(LK_CAST_SAME, qkv->dtype);
    lk_tensor *xc = lk__contig_keep(qkv);
    if (xc && xc->dtype != odt) { /* an f32 qkv inside a 16-bit autocast region stays f32 (CAST_SAME): never here */
        lk_tensor_release(xc);
        xc = NULL;
        lk_error(LK_STATUS_INTERNAL, "%s: autocast asked for %s from %s", op_name, lk_dtype_name(odt),
                 lk_dtype_name(qkv->dtype));
    }
    lk_tensor *y = xc ? lk__tensor_new_on(qkv->device, odt, 3, (int64_t[]){B, T, C}) : NULL;
    lk_tensor *lse = y ? lk__tensor_new_on(qkv->device, LK_F32, 3, (int64_t[]){B, H, T}) : NULL;
    int64_t ai[4] = {B, T, H, D};
    float af[3] = {(float)(1.0 / sqrt((double)D)), drop ? dropout_p * 16777216.0f : 0.0f,
                   drop ? (float)(1.0 / (1.0 - (double)dropout_p)) : 1.0f};
    lk_rng stream;
    memset(&stream, 0, sizeof stream);
    if (drop) stream = *rng;
    lk_status st = lse ? LK_STATUS_OK : lk_last_status();
    if (!st) {
        lk_op_desc d = attention_desc(LK_OP_ATTENTION, ai, af, &stream);
        d.dtype[0] = xc->dtype, d.dtype[1] = odt, d.dtype[2] = LK_F32;
        st = lk__backend_run(qkv->device, &d, (void *[]){xc->data, y->data, lse->data});
    }
    if (!st && drop) advance(rng, B * H * T * T);
    if (st) {
        lk_tensor_release(xc);
        lk_tensor_release(y);
        lk_tensor_release(lse);
        return NULL;
    }
    lk_node *n = lk__record(op_name, attention_backward, y, 1, &qkv);
    if (n) {
        memcpy(n->a.i, ai, sizeof ai);
        memcpy(n->a.f, af, sizeof af);
        n->rng = stream;
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(lse);
    }
    lk_tensor_release(xc);
    lk_tensor_release(lse);
    return lk__op_result(y);
}
