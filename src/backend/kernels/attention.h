/* Kernel bodies of causal self-attention (LK_OP_ATTENTION, _BACKWARD; see
 * lk_attention_params in backend_impl.h): one query row, or one key column,
 * per call, so a CPU task or a GPU thread owns whole rows and no two write
 * the same element (no atomics, the same bits at any thread count). Part of
 * backend/kernels.h (include that).
 *
 * Layout: qkv [B, T, 3, H, D] as GPT-2's c_attn writes it, row (b, t) of
 * 3C floats (C = H D) holding q, k, v; y and dy [B, T, H, D]; lse [B, H, T].
 * The forward is the online softmax of flash attention: a running max m and
 * sum l, the accumulator rescaled when m grows, lse = m + log l kept. The
 * backward recomputes P_ij = exp(s_ij - lse_i) and uses the row term
 * D_i = dy_i . y_i (which equals sum_j P_ij dP_ij, dropout included), in
 * two passes: dq by query rows, dk and dv by key columns. */
#ifndef LK_KERNELS_ATTENTION_SECTION
#define LK_KERNELS_ATTENTION_SECTION

#define LK_K_ATTN_MAX_D 256

/* The keep factor of probability (bh, i, j): keep_scale, or 0 where
 * dropout drops it; 1 without dropout (thr == 0). */
LK_KERNEL float lk_k_attn_keep(const uint32_t key[2], const uint32_t ctr[4], float thr, float keep_scale, int64_t T,
                               int64_t bh, int64_t i, int64_t j) {
    if (!(thr > 0.0f)) return 1.0f;
    uint64_t e = ((uint64_t)bh * (uint64_t)T + (uint64_t)i) * (uint64_t)T + (uint64_t)j;
    uint64_t c = ((uint64_t)ctr[1] << 32 | ctr[0]) + (e >> 2);
    uint32_t cb[4] = {(uint32_t)c, (uint32_t)(c >> 32), ctr[2], ctr[3]}, w[4];
    lk_k_philox4x32_10(cb, key, w);
    return lk_k_keep(w[e & 3], thr) ? keep_scale : 0.0f;
}

/* y row (b, i) of head h and its lse. */
LK_KERNEL void lk_k_attn_forward_row(const float *qkv, float *y, float *lse, int64_t T, int64_t H, int64_t D,
                                     float scale, const uint32_t key[2], const uint32_t ctr[4], float thr,
                                     float keep_scale, int64_t b, int64_t h, int64_t i) {
    int64_t C = H * D, bh = b * H + h;
    const float *q = qkv + (b * T + i) * 3 * C + h * D;
    const float *k0 = qkv + b * T * 3 * C + C + h * D;
    float acc[LK_K_ATTN_MAX_D];
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = 0; j <= i; j++) {
        const float *k = k0 + j * 3 * C, *v = k + C;
        float s = lk_k_dot8(q, k, (long)D) * scale;
        if (s > m) { /* the running max grows: what was summed so far shrinks by exp(m - s) */
            float c = lk_k_expf(m - s);
            l *= c;
            for (int64_t d = 0; d < D; d++) acc[d] *= c;
            m = s;
        }
        float e = lk_k_expf(s - m);
        l += e;
        float w = e * lk_k_attn_keep(key, ctr, thr, keep_scale, T, bh, i, j);
        if (w != 0.0f)
            for (int64_t d = 0; d < D; d++) acc[d] += w * v[d];
    }
    float *yr = y + (b * T + i) * C + h * D;
    float inv = 1.0f / l;
    for (int64_t d = 0; d < D; d++) yr[d] = acc[d] * inv;
    lse[bh * T + i] = m + logf(l);
}

/* D_i = dy_i . y_i for row (b, i) of head h. */
LK_KERNEL float lk_k_attn_delta(const float *y, const float *dy, int64_t T, int64_t H, int64_t D, int64_t b, int64_t h,
                                int64_t i) {
    int64_t off = (b * T + i) * H * D + h * D;
    return lk_k_dot8(dy + off, y + off, (long)D);
}

/* dq of row (b, i), head h, into dqkv's q part (written, not added). */
LK_KERNEL void lk_k_attn_dq_row(const float *qkv, const float *y, const float *lse, const float *dy, float *dqkv,
                                int64_t T, int64_t H, int64_t D, float scale, const uint32_t key[2],
                                const uint32_t ctr[4], float thr, float keep_scale, int64_t b, int64_t h, int64_t i) {
    int64_t C = H * D, bh = b * H + h;
    const float *q = qkv + (b * T + i) * 3 * C + h * D;
    const float *k0 = qkv + b * T * 3 * C + C + h * D;
    const float *g = dy + (b * T + i) * C + h * D;
    float Di = lk_k_attn_delta(y, dy, T, H, D, b, h, i), L = lse[bh * T + i];
    float acc[LK_K_ATTN_MAX_D];
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    for (int64_t j = 0; j <= i; j++) {
        const float *k = k0 + j * 3 * C, *v = k + C;
        float p = lk_k_expf(lk_k_dot8(q, k, (long)D) * scale - L);
        float z = lk_k_attn_keep(key, ctr, thr, keep_scale, T, bh, i, j);
        float ds = p * (lk_k_dot8(g, v, (long)D) * z - Di);
        for (int64_t d = 0; d < D; d++) acc[d] += ds * k[d];
    }
    float *dq = dqkv + (b * T + i) * 3 * C + h * D;
    for (int64_t d = 0; d < D; d++) dq[d] = acc[d] * scale;
}

/* dk and dv of key column (b, j), head h, into dqkv's k and v parts. delta:
 * the rows' D_i as [B, H, T], or NULL to compute each here (the GPU). */
LK_KERNEL void lk_k_attn_dkv_col(const float *qkv, const float *y, const float *lse, const float *dy,
                                 const float *delta, float *dqkv, int64_t T, int64_t H, int64_t D, float scale,
                                 const uint32_t key[2], const uint32_t ctr[4], float thr, float keep_scale, int64_t b,
                                 int64_t h, int64_t j) {
    int64_t C = H * D, bh = b * H + h;
    const float *k = qkv + (b * T + j) * 3 * C + C + h * D, *v = k + C;
    float ak[LK_K_ATTN_MAX_D], av[LK_K_ATTN_MAX_D];
    for (int64_t d = 0; d < D; d++) ak[d] = av[d] = 0.0f;
    for (int64_t i = j; i < T; i++) {
        const float *q = qkv + (b * T + i) * 3 * C + h * D;
        const float *g = dy + (b * T + i) * C + h * D;
        float p = lk_k_expf(lk_k_dot8(q, k, (long)D) * scale - lse[bh * T + i]);
        float z = lk_k_attn_keep(key, ctr, thr, keep_scale, T, bh, i, j);
        float Di = delta ? delta[bh * T + i] : lk_k_attn_delta(y, dy, T, H, D, b, h, i);
        float pz = p * z, ds = p * (lk_k_dot8(g, v, (long)D) * z - Di);
        for (int64_t d = 0; d < D; d++) {
            av[d] += pz * g[d];
            ak[d] += ds * q[d];
        }
    }
    float *dk = dqkv + (b * T + j) * 3 * C + C + h * D, *dv = dk + C;
    for (int64_t d = 0; d < D; d++) {
        dk[d] = ak[d] * scale;
        dv[d] = av[d];
    }
}

#endif
