/* Parameter initialisers with torch.nn.init's semantics (fans, gains,
 * xavier/kaiming uniform and normal, constants), drawing from a Philox
 * stream so the values depend only on the stream's key. */
#include <math.h>
#include <string.h>

#include "lockstep/nn.h"
#include "tensor/tensor_impl.h"

static lk_status check_float(const char *fn, const lk_tensor *t) {
    if (!t) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: NULL tensor", fn);
    if (t->dtype != LK_F32 && t->dtype != LK_BF16 && t->dtype != LK_F16)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: tensor has dtype %s; initialisers write f32, bf16 or f16", fn,
                        lk_dtype_name(t->dtype));
    return LK_STATUS_OK;
}

static lk_status need_rng(const char *fn, const lk_rng *rng) {
    return rng ? LK_STATUS_OK : lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: NULL rng", fn);
}

lk_status lk_init_fans(const lk_tensor *t, int64_t *fan_in, int64_t *fan_out) {
    if (!t) return lk_error(LK_STATUS_INVALID_ARGUMENT, "init_fans: NULL tensor");
    if (t->ndim < 2) {
        char s[128];
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (shape %s)",
                        lk_shape_str(t, s, sizeof s));
    }
    int64_t rf = 1;
    for (int i = 2; i < t->ndim; i++) rf *= t->shape[i];
    if (fan_in) *fan_in = t->shape[1] * rf;
    if (fan_out) *fan_out = t->shape[0] * rf;
    return LK_STATUS_OK;
}

double lk_init_gain(const char *nl, double param) {
    if (!nl) return NAN;
    if (!strcmp(nl, "linear") || !strncmp(nl, "conv", 4) || !strcmp(nl, "sigmoid")) return 1.0;
    if (!strcmp(nl, "tanh")) return 5.0 / 3.0;
    if (!strcmp(nl, "relu")) return sqrt(2.0);
    if (!strcmp(nl, "leaky_relu")) return sqrt(2.0 / (1.0 + param * param));
    if (!strcmp(nl, "selu")) return 3.0 / 4.0;
    return NAN;
}

/* The values are drawn in f32 on the host. A tensor the CPU cannot address
 * directly in f32 (on a device, or bf16 / f16) gets them through a host f32
 * tensor of its shape, drawn in the same (logical) order, then one copy
 * that rounds to its dtype (to nearest even, as lk_tensor_cast): so a
 * parameter initialised after lk_layer_cast_parameters holds the bits of
 * one initialised before it. */
static bool direct(const lk_tensor *t) { return t->dtype == LK_F32 && lk_device_is_host(t->device); }

static lk_status store(lk_tensor *t, lk_tensor *h) {
    if (lk_device_equal(t->device, h->device) || t->dtype == LK_F32) return lk_tensor_copy(t, h);
    lk_tensor *c = lk_tensor_cast(h, t->dtype); /* round on the host, then the device copy */
    lk_status st = c ? lk_tensor_copy(t, c) : lk_last_status();
    lk_tensor_release(c);
    return st;
}

static lk_status through_host(lk_tensor *t, lk_rng *rng, double a, double b,
                              lk_status (*init)(lk_tensor *, lk_rng *, double, double)) {
    lk_tensor *h = lk__tensor_new_on(LK_DEVICE_CPU, LK_F32, t->ndim, t->shape);
    if (!h) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    lk_status st = init(h, rng, a, b);
    if (!st) st = store(t, h);
    lk_tensor_release(h);
    return st;
}

/* A tensor this process holds no data for (a model built deferred, before
 * lk_layer_materialize; another pipeline stage's parameter) is not
 * written: the stream advances past the values it would have taken, so
 * every tensor after it gets what it gets in the whole model. */

/* Writes through the logical index so strided views work too. */
lk_status lk_init_uniform(lk_tensor *t, lk_rng *rng, double lo, double hi) {
    LK_TRY(check_float("init_uniform", t));
    LK_TRY(need_rng("init_uniform", rng));
    if (!(lo <= hi)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "init_uniform: lo %g > hi %g", lo, hi);
    if (!lk_tensor_has_data(t)) {
        lk_rng_skip(rng, 2 * (uint64_t)t->numel); /* lk_rng_uniform_f64: two words */
        return LK_STATUS_OK;
    }
    if (!direct(t)) return through_host(t, rng, lo, hi, lk_init_uniform);
    float *d = t->data;
    for (int64_t i = 0; i < t->numel; i++) d[lk__elem_offset(t, i)] = (float)(lo + (hi - lo) * lk_rng_uniform_f64(rng));
    return LK_STATUS_OK;
}

lk_status lk_init_normal(lk_tensor *t, lk_rng *rng, double mean, double std) {
    LK_TRY(check_float("init_normal", t));
    LK_TRY(need_rng("init_normal", rng));
    if (!(std >= 0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "init_normal: std must be >= 0, got %g", std);
    if (!lk_tensor_has_data(t)) {
        lk_rng_skip_normal(rng, (uint64_t)t->numel);
        return LK_STATUS_OK;
    }
    if (!direct(t)) return through_host(t, rng, mean, std, lk_init_normal);
    float *d = t->data;
    for (int64_t i = 0; i < t->numel; i++) d[lk__elem_offset(t, i)] = (float)(mean + std * lk_rng_normal(rng));
    return LK_STATUS_OK;
}

lk_status lk_init_normal_bulk(lk_tensor *t, lk_rng *rng, double mean, double std) {
    LK_TRY(check_float("init_normal_bulk", t));
    LK_TRY(need_rng("init_normal_bulk", rng));
    if (!(std >= 0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "init_normal_bulk: std must be >= 0, got %g", std);
    if (!lk_tensor_has_data(t)) {
        lk_rng_fill_normal(rng, NULL, t->numel, 0.0f, 1.0f);
        return LK_STATUS_OK;
    }
    if (direct(t) && lk_tensor_is_contiguous(t)) {
        lk_rng_fill_normal(rng, t->data, t->numel, (float)mean, (float)std);
        return LK_STATUS_OK;
    }
    return through_host(t, rng, mean, std, lk_init_normal_bulk);
}

lk_status lk_init_constant(lk_tensor *t, double value) {
    LK_TRY(check_float("init_constant", t));
    if (!lk_tensor_has_data(t) && !lk__tensor_is_deferred(t, NULL)) return LK_STATUS_OK; /* another stage's */
    return lk_tensor_fill(t, value); /* a deferred tensor keeps the value for its storage to come */
}
lk_status lk_init_zeros(lk_tensor *t) { return lk_init_constant(t, 0.0); }
lk_status lk_init_ones(lk_tensor *t) { return lk_init_constant(t, 1.0); }

static lk_status xavier_std(const char *fn, const lk_tensor *t, double gain, double *std) {
    int64_t fi, fo;
    LK_TRY(check_float(fn, t));
    LK_TRY(lk_init_fans(t, &fi, &fo));
    if (fi + fo == 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: the tensor has no elements", fn);
    *std = gain * sqrt(2.0 / (double)(fi + fo));
    return LK_STATUS_OK;
}

lk_status lk_init_xavier_uniform(lk_tensor *t, lk_rng *rng, double gain) {
    double std = 0;
    LK_TRY(xavier_std("init_xavier_uniform", t, gain, &std));
    double a = sqrt(3.0) * std;
    return lk_init_uniform(t, rng, -a, a);
}

lk_status lk_init_xavier_normal(lk_tensor *t, lk_rng *rng, double gain) {
    double std = 0;
    LK_TRY(xavier_std("init_xavier_normal", t, gain, &std));
    return lk_init_normal(t, rng, 0.0, std);
}

static lk_status kaiming_std(const char *fn, const lk_tensor *t, double a, lk_fan_mode mode, const char *nl,
                             double *std) {
    int64_t fi, fo;
    LK_TRY(check_float(fn, t));
    LK_TRY(lk_init_fans(t, &fi, &fo));
    int64_t fan = mode == LK_FAN_IN ? fi : fo;
    if (fan == 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: initializing a zero-element tensor", fn);
    double gain = lk_init_gain(nl ? nl : "leaky_relu", a);
    if (isnan(gain)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: unsupported nonlinearity '%s'", fn, nl);
    *std = gain / sqrt((double)fan);
    return LK_STATUS_OK;
}

lk_status lk_init_kaiming_uniform(lk_tensor *t, lk_rng *rng, double a, lk_fan_mode mode, const char *nonlinearity) {
    double std = 0;
    LK_TRY(kaiming_std("init_kaiming_uniform", t, a, mode, nonlinearity, &std));
    double bound = sqrt(3.0) * std;
    return lk_init_uniform(t, rng, -bound, bound);
}

lk_status lk_init_kaiming_normal(lk_tensor *t, lk_rng *rng, double a, lk_fan_mode mode, const char *nonlinearity) {
    double std = 0;
    LK_TRY(kaiming_std("init_kaiming_normal", t, a, mode, nonlinearity, &std));
    return lk_init_normal(t, rng, 0.0, std);
}
