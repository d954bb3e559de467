/* Philox4x32-10 and the streams built on it. The round function and
 * constants are those of Salmon et al. (SC'11); the known-answer vectors in
 * tests/core/test_rng.c come from the Random123 distribution. */
#include "lockstep/core.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

void lk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = mulhilo(PHILOX_M0, c0, &hi0);
        uint32_t lo1 = mulhilo(PHILOX_M1, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void lk_rng_init(lk_rng *r, uint64_t seed, uint32_t purpose, uint32_t a, uint32_t b) {
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32) ^ (purpose * 0x9E3779B9u);
    r->ctr[0] = 0;
    r->ctr[1] = 0;
    r->ctr[2] = a;
    r->ctr[3] = b;
    r->pos = 4;
    r->has_spare = 0;
    r->spare = 0;
}

uint32_t lk_rng_u32(lk_rng *r) {
    if (r->pos == 4) {
        lk_philox4x32_10(r->ctr, r->key, r->buf);
        if (++r->ctr[0] == 0) r->ctr[1]++;
        r->pos = 0;
    }
    return r->buf[r->pos++];
}

uint64_t lk_rng_u64(lk_rng *r) {
    uint64_t hi = lk_rng_u32(r);
    return (hi << 32) | lk_rng_u32(r);
}

float lk_rng_uniform(lk_rng *r) { return (float)(lk_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double lk_rng_uniform_f64(lk_rng *r) { return (double)(lk_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

float lk_rng_normal(lk_rng *r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    /* u1 in (0, 1] so log() is finite. */
    double u1 = 1.0 - lk_rng_uniform_f64(r);
    double u2 = lk_rng_uniform_f64(r);
    double rad = sqrt(-2.0 * log(u1));
    double th = 6.283185307179586 * u2;
    r->spare = (float)(rad * sin(th));
    r->has_spare = 1;
    return (float)(rad * cos(th));
}

/* The counter is 64 bits in (ctr[0], ctr[1]); ctr[2..3] are the stream's
 * coordinates and never move. */
static void ctr_add(lk_rng *r, uint64_t blocks) {
    uint64_t c = (((uint64_t)r->ctr[1] << 32) | r->ctr[0]) + blocks;
    r->ctr[0] = (uint32_t)c;
    r->ctr[1] = (uint32_t)(c >> 32);
}

void lk_rng_skip(lk_rng *r, uint64_t n) {
    for (; n && r->pos < 4; n--) r->pos++; /* the rest of the current block */
    ctr_add(r, n / 4);
    if (n % 4) { /* into the next block: generate it, as lk_rng_u32 would have */
        lk_philox4x32_10(r->ctr, r->key, r->buf);
        ctr_add(r, 1);
        r->pos = (int)(n % 4);
    }
}

void lk_rng_skip_normal(lk_rng *r, uint64_t n) {
    if (n && r->has_spare) r->has_spare = 0, n--;
    lk_rng_skip(r, n / 2 * 4); /* each pair: two lk_rng_uniform_f64, four words */
    if (n % 2) (void)lk_rng_normal(r); /* the last pair leaves its second value as the spare */
}

bool lk_rng_bernoulli(lk_rng *r, float p) { return lk_rng_uniform(r) < p; }

uint32_t lk_rng_below(lk_rng *r, uint32_t n) {
    if (n <= 1) return 0;
    /* Lemire's multiply-shift with rejection: unbiased. */
    uint64_t m = (uint64_t)lk_rng_u32(r) * n;
    uint32_t l = (uint32_t)m;
    if (l < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (l < t) {
            m = (uint64_t)lk_rng_u32(r) * n;
            l = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

void lk_rng_shuffle_i64(lk_rng *r, int64_t *idx, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (i + 1 <= (int64_t)UINT32_MAX) ? (int64_t)lk_rng_below(r, (uint32_t)(i + 1))
                                                   : (int64_t)(lk_rng_u64(r) % (uint64_t)(i + 1));
        int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* Bulk normals for data: Box-Muller in f32 with polynomial log and sincos,
 * written as straight-line loops over a block of independent Philox
 * counters so the compiler vectorises them. About 20x the scalar
 * lk_rng_normal (which pays libm's double log, sin and cos per pair);
 * accurate to a few f32 ulps, which is all synthetic data and noise
 * augmentation need. Deterministic: no libm, no data-dependent branches. */
#define FILL_LANES 64

static inline float fast_log(float x) { /* x in (0, 1] */
    union { float f; uint32_t u; } b = {x};
    /* x = m * 2^e with m in [sqrt(1/2), sqrt(2)) */
    int32_t e = (int32_t)((b.u + 0x004AFB0Du) >> 23) - 127; /* 0x004AFB0D: 0x3F800000 - bits(sqrt(1/2)) */
    b.u -= (uint32_t)e << 23;
    float s = (b.f - 1.0f) / (b.f + 1.0f), s2 = s * s; /* log m = 2 atanh(s), |s| < 0.1716 */
    float p = 1.0f / 9 + s2 * (1.0f / 11);
    p = 1.0f / 7 + s2 * p;
    p = 1.0f / 5 + s2 * p;
    p = 1.0f / 3 + s2 * p;
    p = 1.0f + s2 * p;
    return 2.0f * s * p + (float)e * 0.69314718056f;
}

void lk_rng_fill_normal(lk_rng *r, float *x, int64_t n, float mean, float std) {
    if (!x) { /* advance only: one counter block per four values, as below */
        ctr_add(r, n > 0 ? ((uint64_t)n + 3) / 4 : 0);
        r->pos = 4;
        r->has_spare = 0;
        return;
    }
    uint32_t w[4][FILL_LANES];
    while (n > 0) {
        int64_t blocks = (n + 3) / 4 < FILL_LANES ? (n + 3) / 4 : FILL_LANES;
        uint32_t c0[FILL_LANES], c1[FILL_LANES], c2[FILL_LANES], c3[FILL_LANES];
        for (int j = 0; j < FILL_LANES; j++) {
            uint64_t ctr = (((uint64_t)r->ctr[1] << 32) | r->ctr[0]) + (uint64_t)j;
            c0[j] = (uint32_t)ctr;
            c1[j] = (uint32_t)(ctr >> 32);
            c2[j] = r->ctr[2];
            c3[j] = r->ctr[3];
        }
        uint32_t k0 = r->key[0], k1 = r->key[1];
        for (int round = 0; round < 10; round++) {
            for (int j = 0; j < FILL_LANES; j++) {
                uint64_t p0 = (uint64_t)PHILOX_M0 * c0[j], p1 = (uint64_t)PHILOX_M1 * c2[j];
                uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
                c0[j] = n0;
                c1[j] = (uint32_t)p1;
                c2[j] = n2;
                c3[j] = (uint32_t)p0;
            }
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        for (int j = 0; j < FILL_LANES; j++) {
            w[0][j] = c0[j];
            w[1][j] = c1[j];
            w[2][j] = c2[j];
            w[3][j] = c3[j];
        }
        ctr_add(r, (uint64_t)blocks);
        /* Each block's 4 words make 2 pairs: (w0, w1) and (w2, w3). */
        float out[4][FILL_LANES];
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < FILL_LANES; j++) {
                float u1 = (float)((w[2 * h][j] >> 8) + 1) * (1.0f / 16777216.0f); /* (0, 1] */
                float v = (float)(w[2 * h + 1][j] >> 8) * (4.0f / 16777216.0f);     /* 4 u2 in [0, 4) */
                float rad = sqrtf(-2.0f * fast_log(u1));
                int q = (int)(v + 0.5f);
                float a = (v - (float)q) * 1.57079632679f, a2 = a * a; /* |a| <= pi/4 */
                float sn = a * (1.0f + a2 * (-1.0f / 6 + a2 * (1.0f / 120 + a2 * (-1.0f / 5040 + a2 * (1.0f / 362880)))));
                float cs = 1.0f + a2 * (-0.5f + a2 * (1.0f / 24 + a2 * (-1.0f / 720 + a2 * (1.0f / 40320))));
                /* theta = q pi/2 + a: rotate (cos a, sin a) by q quarter turns */
                float c = (q & 1) ? -sn : cs, s = (q & 1) ? cs : sn;
                float sign = (q & 2) ? -1.0f : 1.0f;
                out[2 * h][j] = rad * c * sign;
                out[2 * h + 1][j] = rad * s * sign;
            }
        int64_t take = n < 4 * blocks ? n : 4 * blocks;
        for (int64_t i = 0; i < take; i++) x[i] = mean + std * out[i & 3][i >> 2];
        x += take;
        n -= take;
    }
    r->pos = 4; /* the words of any partly used block are not reused */
    r->has_spare = 0;
}
