/* Causal multi-head self-attention on GPT-2's packed projections. This is
 * the composed reference: the scores of every head materialised as a
 * [B*H, T, T] tensor, a causal mask added, softmax, optional dropout on the
 * probabilities, then the weighted sum of the values — each step an
 * existing differentiable op, so its backward is theirs. It is what the
 * fused op is checked and measured against. */
#include <math.h>
#include <stdio.h>

#include "autograd/autograd_impl.h"

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
    if (qkv->ndim != 3 || n_head < 1 || qkv->shape[2] % (3 * (int64_t)n_head))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: qkv has %d dims (last %lld) and n_head %d: expected [B, T, 3C] with C divisible by n_head",
                        op, qkv->ndim, qkv->ndim ? (long long)qkv->shape[qkv->ndim - 1] : 0LL, n_head),
               NULL;
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

lk_tensor *lk_causal_self_attention(lk_tensor *qkv, int n_head, float dropout_p, bool training, lk_rng *rng) {
    return lk_causal_self_attention_naive(qkv, n_head, dropout_p, training, rng);
}
