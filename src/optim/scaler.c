/* The dynamic loss scaler for fp16 training, with torch.cuda.amp.GradScaler's
 * semantics (PyTorch 1.13): the loss is multiplied by the scale before
 * backward so that small gradients survive the f16 GEMMs; unscale multiplies
 * every gradient by the f32 reciprocal of the scale and notes, in the same
 * pass, whether any gradient element is inf or NaN; update halves the scale
 * after such a step (whose optimizer step the caller skips) and doubles it
 * after growth_interval clean steps in a row. The scale is an f32 as
 * PyTorch's _scale tensor is, and update follows _amp_update_scale_'s
 * arithmetic (f32 scale times a double factor, rounded back to f32), so the
 * sequence of scales is PyTorch's bit for bit. The scaler never looks at
 * ranks: a caller that trains over several must reduce found_inf itself. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"

struct lk_grad_scaler {
    lk_grad_scaler_config c;
    float scale;             /* PyTorch's _scale (an f32 tensor there) */
    int64_t growth_tracker;  /* clean steps since the last change of the scale */
    bool unscaled;           /* unscale ran since the last update (PyTorch's OptState.UNSCALED) */
};

lk_grad_scaler_config lk_grad_scaler_config_default(void) {
    return (lk_grad_scaler_config){.init_scale = 65536.0, .growth_factor = 2.0, .backoff_factor = 0.5,
                                   .growth_interval = 2000, .enabled = true};
}

/* PyTorch's constructor checks, with its words; init_scale is unchecked
 * there, but a scale that is not a positive finite f32 can only produce
 * garbage, so it is refused here. */
static lk_status check_config(const lk_grad_scaler_config *c, const char *where) {
    if (!(c->init_scale > 0.0) || !isfinite((float)c->init_scale))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: init_scale must be a positive finite float32, got %g", where,
                        c->init_scale);
    if (!(c->growth_factor > 1.0) || !isfinite(c->growth_factor))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: the growth factor must be > 1.0, got %g", where, c->growth_factor);
    if (!(c->backoff_factor < 1.0) || !(c->backoff_factor > 0.0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: the backoff factor must be < 1.0 (and > 0), got %g", where,
                        c->backoff_factor);
    if (c->growth_interval <= 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: growth_interval must be a positive integer, got %lld", where,
                        (long long)c->growth_interval);
    return LK_STATUS_OK;
}

lk_status lk_grad_scaler_create(const lk_grad_scaler_config *cfg, lk_grad_scaler **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_create: NULL output");
    *out = NULL;
    if (!cfg) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_create: NULL config");
    if (cfg->enabled) LK_TRY(check_config(cfg, "GradScaler"));
    lk_grad_scaler *s = lk_calloc(1, sizeof *s);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->c = *cfg;
    s->scale = (float)cfg->init_scale;
    *out = s;
    return LK_STATUS_OK;
}

void lk_grad_scaler_free(lk_grad_scaler *s) { lk_free(s); }

float lk_grad_scaler_scale(const lk_grad_scaler *s) { return s && s->c.enabled ? s->scale : 1.0f; }

int64_t lk_grad_scaler_growth_tracker(const lk_grad_scaler *s) { return s ? s->growth_tracker : 0; }

bool lk_grad_scaler_is_enabled(const lk_grad_scaler *s) { return s && s->c.enabled; }

lk_status lk__grad_scaler_unscale_into(lk_grad_scaler *s, const lk_named_tensors *params, void *counts) {
    if (!s->c.enabled) return LK_STATUS_OK;
    if (s->unscaled)
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "grad_scaler_unscale: unscale has already been called since the last update (once per step: "
                        "unscale, step or skip, then update)");
    for (int i = 0; i < params->n; i++) {
        const lk_tensor *g = params->items[i].tensor->grad;
        if (g && (g->dtype != LK_F32 || !lk_tensor_is_contiguous(g)))
            return lk_error(LK_STATUS_UNSUPPORTED, "grad_scaler_unscale: the gradient of '%s' must be contiguous f32 (is %s)",
                            params->items[i].name, lk_dtype_name(g->dtype));
    }
    /* PyTorch: inv_scale = self._scale.double().reciprocal().float(). */
    float inv = (float)(1.0 / (double)s->scale);
    for (int i = 0; i < params->n; i++) {
        lk_tensor *g = params->items[i].tensor->grad;
        if (!g) continue;
        /* one pass: each element checked (before it is scaled, as PyTorch
         * checks) and multiplied by inv, in place */
        lk_op_desc d = {.op = LK_OP_UNSCALE, .dtype = {LK_F32, LK_F32, LK_I64}};
        d.nonfinite = (lk_nonfinite_params){g->numel, inv};
        LK_TRY(lk__backend_run(g->device, &d, (void *[]){g->data, g->data, (int64_t *)counts + i}));
    }
    s->unscaled = true;
    return LK_STATUS_OK;
}

lk_status lk_grad_scaler_unscale(lk_grad_scaler *s, const lk_named_tensors *params, bool *found_inf) {
    if (found_inf) *found_inf = false;
    if (!s || !params || !found_inf) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_unscale: NULL argument");
    if (!s->c.enabled) return LK_STATUS_OK;
    /* one count per gradient, where the gradients are; read back at once */
    lk_device dev = LK_DEVICE_CPU;
    for (int i = 0; i < params->n; i++)
        if (params->items[i].tensor->grad) dev = params->items[i].tensor->grad->device;
    int64_t small[32] = {0}, *count = params->n <= 32 ? small : lk_calloc((size_t)params->n + 1, sizeof *count);
    if (!count) return LK_STATUS_OUT_OF_MEMORY;
    lk__scalars cs;
    lk_status st = lk__scalars_begin(&cs, dev, LK_I64, params->n, count);
    bool was = s->unscaled;
    if (!st) st = lk__grad_scaler_unscale_into(s, params, lk__scalars_at(&cs, 0));
    if (lk__scalars_end(&cs) && !st) st = lk_last_status();
    bool inf = false;
    for (int i = 0; !st && i < params->n; i++) inf |= params->items[i].tensor->grad && count[i] > 0; /* the slots written */
    if (count != small) lk_free(count);
    if (st) s->unscaled = was; /* a failed unscale is not one */
    LK_TRY(st);
    *found_inf = inf;
    return LK_STATUS_OK;
}

lk_status lk_grad_scaler_update(lk_grad_scaler *s, bool found_inf) {
    if (!s) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_update: NULL scaler");
    if (!s->c.enabled) return LK_STATUS_OK;
    /* _amp_update_scale_: the factor is a double, the product is rounded
     * to the f32 scale; a growth that would overflow f32 is not taken (the
     * tracker still resets). */
    if (found_inf) {
        s->scale = (float)((double)s->scale * s->c.backoff_factor);
        s->growth_tracker = 0;
    } else if (s->growth_tracker + 1 == s->c.growth_interval) {
        float grown = (float)((double)s->scale * s->c.growth_factor);
        if (isfinite(grown)) s->scale = grown;
        s->growth_tracker = 0;
    } else {
        s->growth_tracker++;
    }
    s->unscaled = false;
    return LK_STATUS_OK;
}

/* ---- state: GradScaler.state_dict()'s keys ---------------------------------- */

static const char *const state_keys[5] = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                                          "_growth_tracker"};

lk_status lk_grad_scaler_state_get(const lk_grad_scaler *s, lk_named_tensors *out) {
    if (!s || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_state_get: NULL argument");
    if (!s->c.enabled) return LK_STATUS_OK; /* PyTorch: a disabled scaler's state_dict is empty */
    double v[5] = {(double)s->scale, s->c.growth_factor, s->c.backoff_factor, (double)s->c.growth_interval,
                   (double)s->growth_tracker};
    for (int i = 0; i < 5; i++) {
        lk_dtype dt = i >= 3 ? LK_I64 : LK_F64; /* PyTorch keeps the last two as ints */
        lk_tensor *t = lk_tensor_full(dt, 0, NULL, v[i]);
        lk_status st = t ? lk_named_tensors_append(out, state_keys[i], t) : lk_last_status();
        lk_tensor_release(t);
        LK_TRY(st);
    }
    return LK_STATUS_OK;
}

lk_status lk_grad_scaler_state_load(lk_grad_scaler *s, const lk_named_tensors *state) {
    if (!s || !state) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_state_load: NULL argument");
    if (!s->c.enabled) return LK_STATUS_OK;
    if (state->n == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "grad_scaler_state_load: the source state is empty, possibly because it was saved from a disabled "
                        "scaler");
    double v[5];
    char bad[512] = "";
    size_t len = 0;
    int nb = 0;
    for (int i = 0; i < 5; i++) {
        const lk_tensor *t = lk_named_tensors_find(state, state_keys[i]);
        if (!t || t->numel != 1) {
            len += (size_t)snprintf(bad + len, sizeof bad - len, "%smissing %s", nb++ ? ", " : "", state_keys[i]);
            continue;
        }
        v[i] = lk_tensor_get(t, 0);
    }
    for (int k = 0; k < state->n; k++) {
        bool known = false;
        for (int i = 0; i < 5 && !known; i++) known = !strcmp(state->items[k].name, state_keys[i]);
        if (!known && len < sizeof bad - 80)
            len += (size_t)snprintf(bad + len, sizeof bad - len, "%sunexpected %s", nb++ ? ", " : "", state->items[k].name);
    }
    if (nb) return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_state_load: %s", bad);
    if (!(v[3] >= 1 && v[3] <= 0x1p53 && v[3] == floor(v[3]))) /* before the cast, which would be undefined */
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "grad_scaler_state_load: growth_interval is %g, expected a whole number from 1 to 2^53", v[3]);
    lk_grad_scaler_config c = s->c;
    c.init_scale = v[0];
    c.growth_factor = v[1];
    c.backoff_factor = v[2];
    c.growth_interval = (int64_t)v[3];
    LK_TRY(check_config(&c, "grad_scaler_state_load"));
    if (!(v[4] >= 0) || v[4] >= (double)c.growth_interval)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "grad_scaler_state_load: _growth_tracker %g is not in [0, growth_interval %lld)",
                        v[4], (long long)c.growth_interval);
    /* init_scale stays the configured one (PyTorch's _init_scale is not in
     * the state either); everything that evolves comes from the state. */
    s->c.growth_factor = c.growth_factor;
    s->c.backoff_factor = c.backoff_factor;
    s->c.growth_interval = c.growth_interval;
    s->scale = (float)v[0];
    s->growth_tracker = (int64_t)v[4];
    s->unscaled = false;
    return LK_STATUS_OK;
}
