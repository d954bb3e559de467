/* Adam's update divides sqrt(v) by the step's constant sqrt(1 - beta2^t)
 * through its reciprocal: a multiply and two FMAs (kernels/optim.h's
 * lk_k_div_by), not the divider. The parity tolerance against
 * PyTorch would let a last-bit change through, so this pins the bits:
 * lk_k_div_by equals the division for every significand of x against the
 * constants Adam meets, and the CPU backend's update (one vectorised loop
 * per setting of maximize, L2 or decoupled decay, and amsgrad) writes, bit for
 * bit, what torch 1.13's formula with true divisions writes, over steps
 * whose constants differ, f32 and bf16 parameters, and a length that is
 * not a multiple of the vector width. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "lk_test.h"

static uint32_t seed = 2026;
static uint32_t next(void) { return seed = seed * 1664525u + 1013904223u, seed >> 8; }
static float unit(void) { return (float)(next() & 0xffffff) / 16777216.0f; } /* [0, 1) */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* sqrt(1 - beta2^t) rounded to f32, as lk__optim_adam_consts makes it. */
static float bc2s_of(double beta2, int64_t t) { return (float)sqrt(1.0 - pow(beta2, (double)t)); }

static void div_by_every_significand(void) {
    const struct {
        double beta2;
        int64_t t;
    } steps[] = {{0.999, 1}, {0.999, 2}, {0.999, 3}, {0.999, 10}, {0.999, 100}, {0.999, 1000}, {0.999, 5000},
                 {0.99, 1},  {0.99, 7},  {0.95, 3},  {0.9999, 1}, {0.9999, 40000}};
    float bs[16];
    int nb = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) bs[nb++] = bc2s_of(steps[i].beta2, steps[i].t);
    bs[nb++] = of_bits(0x3f7fffff); /* significand all ones */
    bs[nb++] = of_bits(0x3f000001); /* just above a power of two */
    bs[nb++] = 1.0f;                /* Adam's late steps: exact */
    for (int j = 0; j < nb; j++) {
        float b = bs[j], rb = 1.0f / b;
        long bad = 0;
        uint32_t first = 0;
        for (uint32_t k = 0; k < (1u << 23); k++) { /* every x in [1, 2): x / b scales with x's exponent */
            float x = of_bits(0x3f800000u | k);
            if (bits(lk_k_div_by(x, b, rb)) != bits(x / b) && !bad++) first = k;
        }
        CHECK_MSG(bad == 0, "b = %a: %ld of 2^23 significands differ from x / b (first x = %a)", (double)b, bad,
                  (double)of_bits(0x3f800000u | first));
        /* the ends of Adam's range (sqrt of the smallest and largest v) and the specials */
        const float xs[] = {0.0f, -0.0f, INFINITY, NAN, -NAN, 0x1p-75f, 0x1.fffffep-75f, 0x1p63f, 0x1.fffffep63f,
                            sqrtf(FLT_TRUE_MIN), sqrtf(FLT_MAX), 3.0f, 1e-20f};
        for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
            CHECK_MSG(bits(lk_k_div_by(xs[i], b, rb)) == bits(xs[i] / b), "b = %a, x = %a: %a, x / b = %a", (double)b,
                      (double)xs[i], (double)lk_k_div_by(xs[i], b, rb), (double)(xs[i] / b));
    }
}

/* torch.optim.Adam / AdamW 1.13, single tensor, with the divisions as
 * written there: the reference the CPU backend's bits must equal. A copy of
 * kernels/optim.h's body on purpose, the one line that differs being the
 * point: a shared body would check the kernel against itself. */
static float torch_adam(const lk_k_adam *c, float p, float g, float *m, float *v, float *vmax) {
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
    float denom = sqrtf(vd) / c->bc2s + c->eps;
    return pi + (c->neg_step * mi) / denom;
}

enum { N = 1000 + 13 };

static void fill(float *p, float *g, float *s, int n) {
    for (int i = 0; i < n; i++) {
        p[i] = 2.0f * unit() - 1.0f;
        float mag = powf(10.0f, -12.0f * unit()); /* gradients from 1 down to 1e-12 */
        g[i] = (next() & 1 ? mag : -mag) * unit();
        s[i] = 0.1f * (2.0f * unit() - 1.0f);            /* exp_avg */
        s[N + i] = g[i] * g[i] * (1.0f + unit());         /* exp_avg_sq >= 0 */
        s[2 * N + i] = s[N + i] * (next() & 1 ? 2.0f : 0.5f); /* max_exp_avg_sq */
    }
    /* zeros of both signs, a tiny and a huge gradient, an infinite one */
    g[0] = 0.0f, g[1] = -0.0f, g[2] = 1e-30f, g[3] = 1e18f, g[4] = INFINITY;
    s[N + 5] = 0.0f, s[5] = 0.0f;
}

static void adam_matches_division(void) {
    const int64_t ts[] = {1, 2, 3, 57, 5000};
    for (int flags = 0; flags < 12; flags++) {
        /* weight decay: none, L2 (Adam) or decoupled (AdamW); the two never together */
        bool maxi = flags & 1, ams = flags & 2, l2 = flags / 4 == 1, dec = flags / 4 == 2;
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
                static float p[N], g[N], s[3 * N], rp[N], rs[3 * N];
                static uint16_t p16[N], g16[N];
                fill(p, g, s, N);
                lk_optim_params o = {.rule = LK_OPTIM_RULE_ADAM, .n = N, .step = ts[ti], .lr = 1e-3, .beta1 = 0.9,
                                     .beta2 = 0.999, .eps = 1e-8, .maximize = maxi};
                if (l2 || dec) o.weight_decay = 0.01, o.adamw = dec;
                lk_dtype dt = bf16 ? LK_BF16 : LK_F32;
                if (bf16) {
                    lk_f32_to_half_n(LK_BF16, p16, p, N), lk_f32_to_half_n(LK_BF16, g16, g, N);
                    lk_half_to_f32_n(LK_BF16, p, p16, N), lk_half_to_f32_n(LK_BF16, g, g16, N);
                }
                memcpy(rp, p, sizeof p);
                memcpy(rs, s, sizeof s);
                lk_op_desc d = {.op = LK_OP_OPTIM_UPDATE, .dtype = {dt, dt, LK_F32, LK_F32, LK_F32}, .optim = o};
                void *x[] = {bf16 ? (void *)p16 : p, bf16 ? (void *)g16 : g, s, s + N, ams ? s + 2 * N : NULL};
                CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, x));
                const lk_k_adam k = lk__optim_adam_consts(&o, ams);
                float none = 0.0f;
                long bad = 0;
                int first = -1;
                for (int i = 0; i < N; i++) {
                    float want = torch_adam(&k, rp[i], g[i], &rs[i], &rs[N + i], ams ? &rs[2 * N + i] : &none);
                    uint32_t got = bf16 ? bits(lk_bf16_to_f32(p16[i])) : bits(p[i]);
                    uint32_t exp = bf16 ? bits(lk_bf16_to_f32(lk_f32_to_bf16(want))) : bits(want);
                    bool same = got == exp && bits(s[i]) == bits(rs[i]) && bits(s[N + i]) == bits(rs[N + i]) &&
                                (!ams || bits(s[2 * N + i]) == bits(rs[2 * N + i]));
                    if (!same && !bad++) first = i;
                }
                CHECK_MSG(bad == 0, "adam maximize %d l2 %d decoupled %d amsgrad %d %s step %lld: %ld of %d elements differ "
                          "from torch's formula with divisions (first at %d)",
                          maxi, l2, dec, ams, bf16 ? "bf16" : "f32", (long long)ts[ti], bad, N, first);
            }
    }
}

LK_TEST_MAIN(LK_TEST_CASE(div_by_every_significand), LK_TEST_CASE(adam_matches_division))
