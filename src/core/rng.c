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
