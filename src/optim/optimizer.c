/* SGD, Adam, AdamW and RMSprop with torch.optim 1.13's single-tensor formulas,
 * defaults and argument checks; parameter groups; zero_grad; optimizer
 * state by name. Each group's state lives in one contiguous allocation and
 * the update is one fused loop per group — over the whole flat range when
 * the parameters and gradients are contiguous (lk_params_flatten). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"


typedef struct {
    lk_tensor *p; /* retained */
    char *name;
    int64_t off;  /* into the group's state arrays */
    int64_t step; /* PyTorch's state['step']; 0: no state yet */
    bool no_decay; /* lk_optimizer_no_weight_decay: updated with weight_decay 0 */
} opt_param;

typedef struct {
    lk_optim_config cfg; /* lr, weight_decay, momentum/betas may differ per group */
    lk_dtype dt;         /* the parameters' and gradients' dtype (f32, or bf16/f16: *-true precisions) */
    double initial_lr;   /* NAN until a scheduler sets it */
    opt_param *ps;
    int n;
    int64_t numel;
    float *state; /* n_state arrays of numel floats, back to back, on dev */
    int n_state;
    lk_device dev; /* where the parameters (and so the state) live */
    /* Sharded update (lk__optimizer_shard): this process updates elements
     * [lo, hi) of the group; state is shared memory it does not own, and
     * only the state's owner writes it when a checkpoint is loaded. */
    int64_t lo, hi;
    bool state_shared, state_writer;
    /* The state's layout: element i of array k at state[k * sstride + i - sbase].
     * The whole group (0, numel) unless a ZeRO strategy keeps only its chunk
     * (lk__optimizer_state_layout). */
    int64_t sbase, sstride;
    bool any_no_decay; /* some parameter is exempt from weight decay: ranges split at its bounds */
} opt_group;

struct lk_optimizer {
    lk_optim_config defaults;
    opt_group *groups;
    int n_groups;
};

/* ---- configs ----------------------------------------------------------------------- */

lk_optim_config lk_sgd_config_default(void) {
    return (lk_optim_config){.kind = LK_OPTIM_SGD, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}
lk_optim_config lk_adam_config_default(void) {
    return (lk_optim_config){.kind = LK_OPTIM_ADAM, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}
lk_optim_config lk_adamw_config_default(void) {
    lk_optim_config c = lk_adam_config_default();
    c.kind = LK_OPTIM_ADAMW;
    c.weight_decay = 1e-2;
    return c;
}

lk_optim_config lk_rmsprop_config_default(void) {
    return (lk_optim_config){.kind = LK_OPTIM_RMSPROP, .lr = 1e-2, .alpha = 0.99, .eps = 1e-8, .beta1 = 0.9, .beta2 = 0.999};
}

lk_status lk_optim_config_for(const char *name, lk_optim_config *out) {
    char low[16] = {0};
    for (size_t i = 0; name && name[i] && i < sizeof low - 1; i++) low[i] = (char)tolower((unsigned char)name[i]);
    if (!strcmp(low, "sgd")) *out = lk_sgd_config_default();
    else if (!strcmp(low, "adam")) *out = lk_adam_config_default();
    else if (!strcmp(low, "adamw")) *out = lk_adamw_config_default();
    else if (!strcmp(low, "rmsprop")) *out = lk_rmsprop_config_default();
    else return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown optimizer '%s' (expected sgd, adam, adamw or rmsprop)",
                         name ? name : "(null)");
    return LK_STATUS_OK;
}

static const char *kind_name(lk_optim_kind k) {
    return k == LK_OPTIM_SGD ? "SGD" : k == LK_OPTIM_ADAM ? "Adam" : k == LK_OPTIM_ADAMW ? "AdamW"
           : k == LK_OPTIM_RMSPROP ? "RMSprop" : "?";
}

lk_status lk_optim_config_validate(const lk_optim_config *c) {
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer config is NULL");
    const char *k = kind_name(c->kind);
    if ((unsigned)c->kind > LK_OPTIM_RMSPROP) return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown optimizer kind %d", (int)c->kind);
    if (!(c->lr >= 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: Invalid learning rate: %g (must be >= 0)", k, c->lr);
    if (!(c->weight_decay >= 0.0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: Invalid weight_decay value: %g (must be >= 0)", k, c->weight_decay);
    if (c->kind == LK_OPTIM_RMSPROP) { /* torch.optim.RMSprop's checks */
        if (!(c->eps >= 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "RMSprop: Invalid epsilon value: %g", c->eps);
        if (!(c->momentum >= 0.0))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "RMSprop: Invalid momentum value: %g", c->momentum);
        if (!(c->alpha >= 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "RMSprop: Invalid alpha value: %g", c->alpha);
    } else if (c->kind == LK_OPTIM_SGD) {
        if (!(c->momentum >= 0.0))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "SGD: Invalid momentum value: %g (must be >= 0)", c->momentum);
        if (c->nesterov && (c->momentum <= 0.0 || c->dampening != 0.0))
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "SGD: Nesterov momentum requires a momentum and zero dampening (got momentum %g, dampening %g)",
                            c->momentum, c->dampening);
        if (!isfinite(c->dampening)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "SGD: dampening %g is not finite", c->dampening);
    } else {
        if (!(c->eps >= 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: Invalid epsilon value: %g (must be >= 0)", k, c->eps);
        if (!(c->beta1 >= 0.0 && c->beta1 < 1.0))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: Invalid beta parameter at index 0: %g (must be in [0, 1))", k,
                            c->beta1);
        if (!(c->beta2 >= 0.0 && c->beta2 < 1.0))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: Invalid beta parameter at index 1: %g (must be in [0, 1))", k,
                            c->beta2);
    }
    return LK_STATUS_OK;
}

/* ---- creation ------------------------------------------------------------------------ */

static int state_arrays(const lk_optim_config *c) {
    if (c->kind == LK_OPTIM_SGD) return c->momentum != 0.0 ? 1 : 0;
    if (c->kind == LK_OPTIM_RMSPROP) return 1 + (c->momentum > 0.0) + c->centered;
    return c->amsgrad ? 3 : 2;
}

/* lk__optimizer_defer_state: groups created now get no state memory (a
 * ZeRO strategy gives them their chunk's with lk__optimizer_shard_chunk). */
static _Thread_local bool defer_state;

bool lk__optimizer_defer_state(bool defer) {
    bool was = defer_state;
    defer_state = defer;
    return was;
}

/* The state's bytes as allocated on g->dev (never 0: a device allocation of 0 bytes is not portable). */
static size_t state_alloc_bytes(const opt_group *g) {
    size_t bytes = (size_t)g->n_state * (size_t)g->numel * sizeof(float);
    return bytes ? bytes : LK_ALIGN;
}

/* The state's own memory, next to the parameters (the update runs there). */
static void state_free(opt_group *g) {
    if (!g->state_shared && g->state) lk_device_free(g->dev, g->state, state_alloc_bytes(g));
    g->state = NULL;
}

static void group_clear(opt_group *g) {
    for (int i = 0; i < g->n; i++) {
        lk_tensor_release(g->ps[i].p);
        lk_free(g->ps[i].name);
    }
    lk_free(g->ps);
    state_free(g);
}

void lk_optimizer_free(lk_optimizer *o) {
    if (!o) return;
    for (int i = 0; i < o->n_groups; i++) group_clear(&o->groups[i]);
    lk_free(o->groups);
    lk_free(o);
}

static bool owned_by(const lk_optimizer *o, const lk_tensor *t) {
    for (int g = 0; g < o->n_groups; g++)
        for (int i = 0; i < o->groups[g].n; i++)
            if (o->groups[g].ps[i].p == t) return true;
    return false;
}

lk_status lk_optimizer_add_param_group(lk_optimizer *o, const lk_named_tensors *params, double lr, double weight_decay) {
    if (!o || !params) return lk_error(LK_STATUS_INVALID_ARGUMENT, "add_param_group: NULL argument");
    lk_optim_config cfg = o->defaults;
    if (!isnan(lr)) cfg.lr = lr;
    if (!isnan(weight_decay)) cfg.weight_decay = weight_decay;
    LK_TRY(lk_optim_config_validate(&cfg));
    if (params->n == 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: optimizer got an empty parameter list", kind_name(cfg.kind));
    for (int i = 0; i < params->n; i++) {
        lk_tensor *t = params->items[i].tensor;
        lk_dtype dt0 = params->items[0].tensor->dtype;
        if ((t->dtype != LK_F32 && t->dtype != LK_BF16 && t->dtype != LK_F16) || !lk_tensor_is_contiguous(t))
            return lk_error(LK_STATUS_UNSUPPORTED, "%s: parameter '%s' must be contiguous f32, bf16 or f16 (got %s%s)",
                            kind_name(cfg.kind), params->items[i].name, lk_dtype_name(t->dtype),
                            lk_tensor_is_contiguous(t) ? "" : ", strided");
        if (t->dtype != dt0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: parameter '%s' is %s but '%s' is %s: one group updates "
                            "parameters of one dtype (add a group per dtype)", kind_name(cfg.kind), params->items[i].name,
                            lk_dtype_name(t->dtype), params->items[0].name, lk_dtype_name(dt0));
        for (int j = 0; j < i; j++)
            if (params->items[j].tensor == t)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: parameter '%s' appears twice in the group", kind_name(cfg.kind),
                                params->items[i].name);
        if (owned_by(o, t))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: some parameters appear in more than one parameter group ('%s')",
                            kind_name(cfg.kind), params->items[i].name);
    }
    opt_group g = {.cfg = cfg, .dt = params->items[0].tensor->dtype, .initial_lr = NAN, .n = params->n,
                   .n_state = state_arrays(&cfg), .state_writer = true, .dev = params->items[0].tensor->device};
    opt_group *ng = lk_realloc(o->groups, (size_t)(o->n_groups + 1) * sizeof *ng);
    if (!ng) return LK_STATUS_OUT_OF_MEMORY;
    o->groups = ng;
    g.ps = lk_calloc((size_t)g.n, sizeof *g.ps);
    if (!g.ps) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < g.n; i++) {
        g.ps[i].p = lk_tensor_retain(params->items[i].tensor);
        g.ps[i].name = lk_strdup(params->items[i].name);
        g.ps[i].off = g.numel;
        g.numel += params->items[i].tensor->numel;
        g.hi = g.numel;
        g.sstride = g.numel;
        if (!g.ps[i].name) {
            group_clear(&g);
            return LK_STATUS_OUT_OF_MEMORY;
        }
    }
    if (g.n_state && !defer_state) {
        void *mem = NULL;
        const char *was = lk__alloc_what("the optimizer state"); /* named by an error of the memory limit */
        lk_status st = lk_device_alloc(g.dev, state_alloc_bytes(&g), &mem);
        lk__alloc_what(was);
        g.state = mem;
        if (!st) st = lk_device_memset(g.dev, g.state, 0, (size_t)g.n_state * (size_t)g.numel * sizeof(float));
        if (st) {
            group_clear(&g);
            return st;
        }
    }
    o->groups[o->n_groups++] = g;
    return LK_STATUS_OK;
}

lk_status lk_optimizer_create(const lk_optim_config *cfg, const lk_named_tensors *params, lk_optimizer **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_create: NULL out");
    *out = NULL;
    LK_TRY(lk_optim_config_validate(cfg));
    lk_optimizer *o = lk_calloc(1, sizeof *o);
    if (!o) return LK_STATUS_OUT_OF_MEMORY;
    o->defaults = *cfg;
    lk_status st = lk_optimizer_add_param_group(o, params, NAN, NAN);
    if (st) {
        lk_optimizer_free(o);
        return st;
    }
    *out = o;
    return LK_STATUS_OK;
}

/* One update over elements [off, off + n) of the group, as a typed op on the
 * parameters' device (the loops: src/backend/cpu/optim.c). p and gr point at
 * the range's first element (of g->dt); the state is always f32. */
static lk_status run_range_wd(opt_group *g, lk_device dev, void *p, const void *gr, int64_t off, int64_t n,
                              int64_t step, double weight_decay);

/* The update of elements [off, off + n): one op, or with parameters exempt
 * from weight decay one op per run of parameters that decay alike (the
 * update is element-wise, so the cut changes no bits). */
static lk_status run_range(opt_group *g, lk_device dev, void *p, const void *gr, int64_t off, int64_t n,
                           int64_t step) {
    if (!g->any_no_decay) return run_range_wd(g, dev, p, gr, off, n, step, g->cfg.weight_decay);
    size_t es = lk_dtype_size(g->dt);
    int64_t end = off + n, a = off;
    while (a < end) {
        /* the parameter holding element a, and how far parameters decaying like it go */
        int i = 0;
        while (i + 1 < g->n && g->ps[i + 1].off <= a) i++;
        bool nd = g->ps[i].no_decay;
        int64_t b = g->ps[i].off + g->ps[i].p->numel;
        for (int k = i + 1; k < g->n && g->ps[k].no_decay == nd && b < end; k++) b = g->ps[k].off + g->ps[k].p->numel;
        if (b > end) b = end;
        LK_TRY(run_range_wd(g, dev, (char *)p + (a - off) * es, (const char *)gr + (a - off) * es, a, b - a, step,
                            nd ? 0.0 : g->cfg.weight_decay));
        a = b;
    }
    return LK_STATUS_OK;
}

static lk_status run_range_wd(opt_group *g, lk_device dev, void *p, const void *gr, int64_t off, int64_t n,
                              int64_t step, double weight_decay) {
    const lk_optim_config *c = &g->cfg;
    int64_t at = off - g->sbase; /* the range's first element in the state arrays (a ZeRO chunk starts at sbase) */
    float *s0 = g->state ? g->state + at : NULL, *s1 = NULL, *s2 = NULL;
    lk_optim_rule rule = LK_OPTIM_RULE_ADAM;
    if (c->kind == LK_OPTIM_SGD) {
        rule = LK_OPTIM_RULE_SGD;
    } else if (c->kind == LK_OPTIM_RMSPROP) {
        int k = 1;
        rule = LK_OPTIM_RULE_RMSPROP;
        s1 = c->momentum > 0.0 ? g->state + (k++) * g->sstride + at : NULL;
        s2 = c->centered ? g->state + k * g->sstride + at : NULL;
    } else {
        s1 = g->state + g->sstride + at;
        s2 = g->n_state > 2 ? g->state + 2 * g->sstride + at : NULL;
    }
    lk_op_desc d = {.op = LK_OP_OPTIM_UPDATE, .dtype = {g->dt, g->dt, LK_F32, LK_F32, LK_F32}};
    d.optim = (lk_optim_params){rule,          n,         step,    c->lr,    c->momentum,
                                c->dampening,  weight_decay,    c->beta1, c->beta2, c->eps,
                                c->alpha,      c->nesterov,     c->maximize, c->kind == LK_OPTIM_ADAMW};
    return lk__backend_run(dev, &d, (void *[]){p, (void *)gr, s0, s1, s2});
}

/* The group's parameters and gradients are each one contiguous range. */
static bool group_is_flat(const opt_group *g) {
    for (int i = 0; i < g->n; i++) {
        const lk_tensor *p = g->ps[i].p, *gr = p->grad;
        if (!gr || gr->dtype != g->dt || !lk_tensor_is_contiguous(gr) || g->ps[i].step != g->ps[0].step) return false;
        if (i == 0) continue;
        const lk_tensor *q = g->ps[i - 1].p;
        if (p->storage != q->storage || (char *)p->data != (char *)q->data + lk_tensor_nbytes(q)) return false;
        if (gr->storage != q->grad->storage || (char *)gr->data != (char *)q->grad->data + lk_tensor_nbytes(q))
            return false;
    }
    return true;
}

/* A flat group's update is element-wise: cut into ranges (multiples of 16
 * elements, so every vector loop sees whole vectors) for the cores this
 * process owns. Bitwise the same for any cut. */
typedef struct {
    opt_group *g;
    lk_device dev;
    char *p;
    const char *gr;
    int64_t lo, n, step; /* elements [lo, lo + n) of the group */
    int width;
    lk_status st[LK__PARALLEL_MAX]; /* per task: its message is on its own thread */
} flat_job;

static void flat_task(void *ctx, int t) {
    flat_job *j = ctx;
    int64_t a, b;
    lk__task_range(j->n, t, j->width, 16, &a, &b);
    a += j->lo, b += j->lo;
    size_t es = lk_dtype_size(j->g->dt);
    if (b > a) j->st[t] = run_range(j->g, j->dev, j->p + a * es, j->gr + a * es, a, b - a, j->step);
}

/* How many compute threads a flat group's update is cut across: the rule
 * the gradients' zeroing after it follows (LK_OP_FILL). */
static int flat_width(const opt_group *g) {
    return lk_device_is_host(g->ps[0].p->device) ? lk__parallel_stream_width(g->hi - g->lo)
                                                 : 1; /* a device runs the whole range as one op */
}

void lk__optimizer_prewake(const lk_optimizer *o) {
    for (int gi = 0; o && gi < o->n_groups; gi++)
        if (o->groups[gi].n > 1 && group_is_flat(&o->groups[gi]) && flat_width(&o->groups[gi]) > 1) {
            lk__parallel_prewake();
            return;
        }
}

lk_status lk_optimizer_step(lk_optimizer *o) {
    if (!o) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_step: NULL optimizer");
    for (int gi = 0; gi < o->n_groups; gi++) {
        opt_group *g = &o->groups[gi];
        for (int i = 0; i < g->n; i++) {
            const lk_tensor *p = g->ps[i].p, *gr = p->grad;
            if (gr && (gr->dtype != g->dt || !lk_tensor_is_contiguous(gr) || gr->numel != p->numel))
                return lk_error(LK_STATUS_UNSUPPORTED, "%s: the gradient of '%s' must be contiguous %s of the parameter's "
                                "size (got %s%s)", kind_name(g->cfg.kind), g->ps[i].name, lk_dtype_name(g->dt),
                                lk_dtype_name(gr->dtype), lk_tensor_is_contiguous(gr) ? "" : ", strided");
        }
        if (g->n > 1 && group_is_flat(g)) {
            int64_t step = ++g->ps[0].step;
            for (int i = 1; i < g->n; i++) g->ps[i].step = step;
            int64_t n = g->hi - g->lo;
            flat_job job = {g, g->ps[0].p->device, g->ps[0].p->data, g->ps[0].p->grad->data, g->lo, n, step,
                            flat_width(g), {0}};
            lk__parallel_run(job.width, flat_task, &job);
            for (int t = 0; t < job.width; t++)
                if (job.st[t])
                    return t ? lk_error(job.st[t], "%s: the update of group %d failed on a compute thread",
                                        kind_name(g->cfg.kind), gi)
                             : job.st[t];
            continue;
        }
        for (int i = 0; i < g->n; i++) {
            lk_tensor *p = g->ps[i].p;
            if (!p->grad) continue;
            int64_t step = ++g->ps[i].step; /* counted on every rank, so each holds the whole state's steps */
            int64_t off = g->ps[i].off;
            int64_t a = g->lo > off ? g->lo - off : 0, b = g->hi < off + p->numel ? g->hi - off : p->numel;
            size_t es = lk_dtype_size(g->dt);
            if (b > a)
                LK_TRY(run_range(g, p->device, (char *)p->data + a * es, (char *)p->grad->data + a * es, off + a, b - a, step));
        }
    }
    return LK_STATUS_OK;
}

void lk_optimizer_zero_grad(lk_optimizer *o, bool set_to_none) {
    if (!o) return;
    for (int gi = 0; gi < o->n_groups; gi++) {
        opt_group *g = &o->groups[gi];
        if (g->n > 1 && group_is_flat(g)) {
            lk_tensor *gr = g->ps[0].p->grad;
            lk_device_memset(gr->device, gr->data, 0, (size_t)g->numel * lk_dtype_size(g->dt));
            continue;
        }
        for (int i = 0; i < g->n; i++) {
            lk_tensor *p = g->ps[i].p;
            if (!p->grad) continue;
            lk_tensor_zero_grad(p, set_to_none && !lk_tensor_in_flat_buffer(p->grad));
        }
    }
}

/* ---- groups ---------------------------------------------------------------------------------- */

lk_status lk_optimizer_no_weight_decay(lk_optimizer *o, const char *name) {
    if (!o || !name) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_no_weight_decay: NULL %s", o ? "name" : "optimizer");
    for (int gi = 0; gi < o->n_groups; gi++)
        for (int i = 0; i < o->groups[gi].n; i++)
            if (!strcmp(o->groups[gi].ps[i].name, name)) {
                o->groups[gi].ps[i].no_decay = true;
                o->groups[gi].any_no_decay = true;
                return LK_STATUS_OK;
            }
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_no_weight_decay: the optimizer has no parameter '%s'", name);
}

int lk_optimizer_num_groups(const lk_optimizer *o) { return o ? o->n_groups : 0; }

static opt_group *grp(const lk_optimizer *o, int g) { return o && g >= 0 && g < o->n_groups ? &o->groups[g] : NULL; }

const lk_optim_config *lk_optimizer_config(const lk_optimizer *o, int group) {
    opt_group *g = grp(o, group);
    return g ? &g->cfg : NULL;
}

double lk_optimizer_get_lr(const lk_optimizer *o, int group) {
    opt_group *g = grp(o, group);
    return g ? g->cfg.lr : NAN;
}

lk_status lk_optimizer_set_lr(lk_optimizer *o, int group, double lr) {
    opt_group *g = grp(o, group);
    if (!g) return lk_error(LK_STATUS_INVALID_ARGUMENT, "set_lr: no parameter group %d", group);
    if (!(lr >= 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "set_lr: Invalid learning rate: %g", lr);
    g->cfg.lr = lr;
    return LK_STATUS_OK;
}

double lk_optimizer_get_momentum(const lk_optimizer *o, int group) {
    opt_group *g = grp(o, group);
    return !g ? NAN : g->cfg.kind == LK_OPTIM_SGD || g->cfg.kind == LK_OPTIM_RMSPROP ? g->cfg.momentum : g->cfg.beta1;
}

lk_status lk_optimizer_set_momentum(lk_optimizer *o, int group, double momentum) {
    opt_group *g = grp(o, group);
    if (!g) return lk_error(LK_STATUS_INVALID_ARGUMENT, "set_momentum: no parameter group %d", group);
    lk_optim_config c = g->cfg;
    if (c.kind == LK_OPTIM_SGD || c.kind == LK_OPTIM_RMSPROP) {
        /* The momentum buffer must exist from the start to switch momentum on later. */
        if ((c.momentum != 0.0) != (momentum != 0.0))
            return lk_error(LK_STATUS_INVALID_USAGE, "set_momentum: %s momentum can change but not between zero and non-zero "
                            "(%g -> %g)", kind_name(c.kind), c.momentum, momentum);
        c.momentum = momentum;
    } else {
        c.beta1 = momentum;
    }
    LK_TRY(lk_optim_config_validate(&c));
    g->cfg = c;
    return LK_STATUS_OK;
}

double lk__optimizer_initial_lr(const lk_optimizer *o, int group) {
    opt_group *g = grp(o, group);
    return g ? g->initial_lr : NAN;
}

void lk__optimizer_set_initial_lr(lk_optimizer *o, int group, double lr) {
    opt_group *g = grp(o, group);
    if (g) g->initial_lr = lr;
}

/* ---- state ---------------------------------------------------------------------------------------- */

static const char *const state_names[2][3] = {{"momentum_buffer", NULL, NULL}, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}};

/* PyTorch's name of state array s of a group with config c. */
static const char *state_name(const lk_optim_config *c, int s) {
    if (c->kind == LK_OPTIM_RMSPROP) {
        if (s == 0) return "square_avg";
        if (s == 1 && c->momentum > 0.0) return "momentum_buffer";
        return "grad_avg";
    }
    return state_names[c->kind != LK_OPTIM_SGD][s];
}

static lk_status put_scalar(lk_named_tensors *out, const char *name, lk_dtype dt, double v) {
    lk_tensor *t = lk_tensor_full(dt, 0, NULL, v);
    if (!t) return lk_last_status();
    lk_status st = lk_named_tensors_append(out, name, t);
    lk_tensor_release(t);
    return st;
}

lk_status lk_optimizer_state_get(const lk_optimizer *o, lk_named_tensors *out) {
    return lk__optimizer_state_get_ex(o, out, true);
}

float *lk__optimizer_state_of(const lk_optimizer *o, const lk_tensor *p, int k) {
    if (!o || !o->n_groups) return NULL;
    const opt_group *g = &o->groups[0];
    if (k < 0 || k >= g->n_state || !g->state) return NULL;
    for (int i = 0; i < g->n; i++)
        if (g->ps[i].p == p) return g->state + k * g->sstride + (g->ps[i].off - g->sbase);
    return NULL;
}

int lk__optimizer_state_arrays(const lk_optimizer *o) { return o && o->n_groups ? o->groups[0].n_state : 0; }

const char *lk__optimizer_state_array_name(const lk_optimizer *o, int k) {
    return o && o->n_groups && k >= 0 && k < o->groups[0].n_state ? state_name(&o->groups[0].cfg, k) : NULL;
}

lk_status lk__optimizer_state_get_ex(const lk_optimizer *o, lk_named_tensors *out, bool arrays) {
    if (!o || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_state_get: NULL argument");
    char name[600];
    for (int gi = 0; gi < o->n_groups; gi++) {
        const opt_group *g = &o->groups[gi];
        const lk_optim_config *c = &g->cfg;
        snprintf(name, sizeof name, "param_groups.%d.lr", gi);
        LK_TRY(put_scalar(out, name, LK_F64, c->lr));
        snprintf(name, sizeof name, "param_groups.%d.weight_decay", gi);
        LK_TRY(put_scalar(out, name, LK_F64, c->weight_decay));
        if (c->kind == LK_OPTIM_SGD || c->kind == LK_OPTIM_RMSPROP) {
            snprintf(name, sizeof name, "param_groups.%d.momentum", gi);
            LK_TRY(put_scalar(out, name, LK_F64, c->momentum));
        }
        if (c->kind == LK_OPTIM_RMSPROP) {
            snprintf(name, sizeof name, "param_groups.%d.alpha", gi);
            LK_TRY(put_scalar(out, name, LK_F64, c->alpha));
        } else if (c->kind != LK_OPTIM_SGD) {
            snprintf(name, sizeof name, "param_groups.%d.beta1", gi);
            LK_TRY(put_scalar(out, name, LK_F64, c->beta1));
            snprintf(name, sizeof name, "param_groups.%d.beta2", gi);
            LK_TRY(put_scalar(out, name, LK_F64, c->beta2));
        }
        if (!isnan(g->initial_lr)) {
            snprintf(name, sizeof name, "param_groups.%d.initial_lr", gi);
            LK_TRY(put_scalar(out, name, LK_F64, g->initial_lr));
        }
        if (arrays && g->n_state && g->sstride != g->numel)
            return lk_error(LK_STATUS_INVALID_USAGE, "optimizer state_get: this rank holds only elements [%lld, %lld) of "
                            "the state (a ZeRO strategy): gather it through lk_strategy_state_dict first",
                            (long long)g->sbase, (long long)(g->sbase + g->sstride));
        for (int i = 0; i < g->n; i++) {
            const opt_param *op = &g->ps[i];
            if (op->step == 0) continue; /* PyTorch creates state lazily */
            snprintf(name, sizeof name, "state.%s.step", op->name);
            LK_TRY(put_scalar(out, name, LK_I64, (double)op->step));
            for (int s = 0; arrays && s < g->n_state; s++) {
                snprintf(name, sizeof name, "state.%s.%s", op->name, state_name(c, s));
                float *src = g->state + s * g->numel + op->off;
                lk_tensor *t = NULL;
                if (lk_device_is_host(g->dev)) {
                    t = lk_tensor_from_data(LK_F32, op->p->ndim, op->p->shape, src);
                } else { /* a copy where the state is (a checkpoint copies it to the host) */
                    lk_tensor *w = lk__tensor_wrap_on(g->dev, LK_F32, op->p->ndim, op->p->shape, src);
                    t = lk_tensor_to(w, g->dev);
                    lk_tensor_release(w);
                }
                if (!t) return lk_last_status();
                lk_status st = lk_named_tensors_append(out, name, t);
                lk_tensor_release(t);
                LK_TRY(st);
            }
        }
    }
    return LK_STATUS_OK;
}

/* Finds "state.<param>.<field>" → (group, param index, field index; -1 for step). */
static bool parse_state_name(const lk_optimizer *o, const char *name, int *gi, int *pi, int *field) {
    if (strncmp(name, "state.", 6)) return false;
    const char *rest = name + 6;
    const char *dot = strrchr(rest, '.');
    if (!dot) return false;
    size_t plen = (size_t)(dot - rest);
    for (int g = 0; g < o->n_groups; g++) {
        const opt_group *gr = &o->groups[g];
        for (int i = 0; i < gr->n; i++) {
            if (strlen(gr->ps[i].name) != plen || strncmp(gr->ps[i].name, rest, plen)) continue;
            if (!strcmp(dot + 1, "step")) {
                *gi = g, *pi = i, *field = -1;
                return true;
            }
            for (int s = 0; s < gr->n_state; s++)
                if (!strcmp(dot + 1, state_name(&gr->cfg, s))) {
                    *gi = g, *pi = i, *field = s;
                    return true;
                }
            return false;
        }
    }
    return false;
}

lk_status lk_optimizer_state_load(lk_optimizer *o, const lk_named_tensors *state) {
    if (!o || !state) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_state_load: NULL argument");
    char problems[1500] = "";
    int nprob = 0;
#define PROBLEM(...) lk__list_add(problems, sizeof problems, &nprob, "; ", __VA_ARGS__)
    /* Pass 1: validate everything. */
    for (int k = 0; k < state->n; k++) {
        const char *nm = state->items[k].name;
        const lk_tensor *t = state->items[k].tensor;
        if (!strncmp(nm, "param_groups.", 13)) {
            char *end;
            long g = strtol(nm + 13, &end, 10);
            if (end == nm + 13 || *end != '.' || g < 0 || g >= o->n_groups) PROBLEM("%s: no such parameter group (have %d)", nm, o->n_groups);
            else if (t->numel != 1) PROBLEM("%s: expected a scalar", nm);
            else {
                const char *f = end + 1;
                double v = lk_tensor_get(t, 0);
                bool beta = !strcmp(f, "beta1") || !strcmp(f, "beta2");
                if (strcmp(f, "lr") && strcmp(f, "weight_decay") && strcmp(f, "momentum") && !beta &&
                    strcmp(f, "initial_lr") && strcmp(f, "alpha"))
                    PROBLEM("%s: unknown group field", nm);
                else if (beta ? !(v >= 0.0 && v < 1.0) : !(isfinite(v) && v >= 0.0))
                    PROBLEM("%s is %g, expected %s", nm, v, beta ? "a value in [0, 1)" : "a finite value >= 0");
            }
            continue;
        }
        int gi, pi, field;
        if (!parse_state_name(o, nm, &gi, &pi, &field)) {
            PROBLEM("%s: no parameter or state field of that name in this %s optimizer", nm, kind_name(o->defaults.kind));
            continue;
        }
        const lk_tensor *p = o->groups[gi].ps[pi].p;
        char s1[128], s2[128];
        if (field < 0 ? t->numel != 1 : !lk_tensor_same_shape(p, t))
            PROBLEM("%s: shape %s, expected %s", nm, lk_shape_str(t, s1, sizeof s1),
                    field < 0 ? "[] (scalar)" : lk_shape_str(p, s2, sizeof s2));
        else if (field < 0) { /* a count a step is added to, exact in a double */
            double v = lk_tensor_get(t, 0);
            if (!(v >= 0.0 && v <= 0x1p53 && v == floor(v)))
                PROBLEM("%s is %g, expected a whole number from 0 to 2^53", nm, v);
        }
    }
    if (nprob) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer_state_load: %s", problems);
#undef PROBLEM
    /* Pass 2: apply. Parameters without state in the dict start fresh. */
    for (int g = 0; g < o->n_groups; g++) {
        opt_group *gr = &o->groups[g];
        for (int i = 0; i < gr->n; i++) gr->ps[i].step = 0;
        if (gr->state && gr->state_writer)
            LK_TRY(lk_device_memset(gr->dev, gr->state, 0, (size_t)gr->n_state * (size_t)gr->sstride * sizeof(float)));
    }
    for (int k = 0; k < state->n; k++) {
        const char *nm = state->items[k].name;
        lk_tensor *t = state->items[k].tensor;
        if (!strncmp(nm, "param_groups.", 13)) {
            char *end;
            long g = strtol(nm + 13, &end, 10);
            lk_optim_config *c = &o->groups[g].cfg;
            double v = lk_tensor_get(t, 0);
            const char *f = end + 1;
            if (!strcmp(f, "lr")) c->lr = v;
            else if (!strcmp(f, "weight_decay")) c->weight_decay = v;
            else if (!strcmp(f, "momentum") && c->kind == LK_OPTIM_SGD) c->momentum = v;
            else if (!strcmp(f, "alpha") && c->kind == LK_OPTIM_RMSPROP) c->alpha = v;
            else if (!strcmp(f, "beta1")) c->beta1 = v;
            else if (!strcmp(f, "beta2")) c->beta2 = v;
            else if (!strcmp(f, "initial_lr")) o->groups[g].initial_lr = v;
            continue;
        }
        int gi, pi, field;
        parse_state_name(o, nm, &gi, &pi, &field);
        opt_group *gr = &o->groups[gi];
        if (field < 0) {
            gr->ps[pi].step = (int64_t)lk_tensor_get(t, 0);
        } else if (gr->state_writer && gr->sstride != gr->numel) {
            return lk_error(LK_STATUS_INVALID_USAGE, "optimizer_state_load: this rank holds only a chunk of the state "
                            "(a ZeRO strategy): lk_strategy_state_dict_loaded makes it whole first");
        } else if (gr->state_writer) {
            lk_tensor *dst = lk__tensor_wrap_on(gr->dev, LK_F32, gr->ps[pi].p->ndim, gr->ps[pi].p->shape,
                                                gr->state + field * gr->numel + gr->ps[pi].off);
            if (!dst) return lk_last_status();
            lk_status st = lk_tensor_copy(dst, t);
            lk_tensor_release(dst);
            LK_TRY(st);
        }
    }
    return LK_STATUS_OK;
}

/* ---- sharded update ------------------------------------------------------------------------- */

int64_t lk__optimizer_state_floats(const lk_optimizer *o) {
    return o && o->n_groups == 1 ? (int64_t)o->groups[0].n_state * o->groups[0].numel : -1;
}

lk_status lk__optimizer_state_layout(lk_optimizer *o, float *state, int64_t base, int64_t stride) {
    if (!o || o->n_groups != 1) return lk_error(LK_STATUS_UNSUPPORTED, "a sharded optimizer state needs exactly one parameter group");
    opt_group *g = &o->groups[0];
    if (!g->state_shared) return lk_error(LK_STATUS_INVALID_USAGE, "optimizer state layout: shard the update first (lk__optimizer_shard)");
    if (!(0 <= base && base <= g->lo && g->hi <= base + stride))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer state layout [%lld, +%lld) does not cover the update's [%lld, %lld)",
                        (long long)base, (long long)stride, (long long)g->lo, (long long)g->hi);
    if (g->n_state) g->state = state;
    g->sbase = base;
    g->sstride = stride;
    return LK_STATUS_OK;
}

static lk_status shard_check(lk_optimizer *o, int64_t lo, int64_t hi) {
    if (!o || o->n_groups != 1)
        return lk_error(LK_STATUS_UNSUPPORTED, "a sharded optimizer update needs exactly one parameter group (this one has %d)",
                        o ? o->n_groups : 0);
    const opt_group *g = &o->groups[0];
    if (!(0 <= lo && lo <= hi && hi <= g->numel))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer shard [%lld, %lld) is outside the group's %lld elements",
                        (long long)lo, (long long)hi, (long long)g->numel);
    for (int i = 1; i < g->n; i++) { /* the elements are numbered as they lie in memory */
        const lk_tensor *p = g->ps[i].p, *q = g->ps[i - 1].p;
        if ((char *)p->data != (char *)q->data + lk_tensor_nbytes(q))
            return lk_error(LK_STATUS_UNSUPPORTED, "a sharded optimizer update needs the parameters back to back in "
                            "memory ('%s' does not follow '%s')", g->ps[i].name, g->ps[i - 1].name);
    }
    return LK_STATUS_OK;
}

lk_status lk__optimizer_shard_chunk(lk_optimizer *o, int64_t lo, int64_t hi, float *chunk, int64_t stride) {
    LK_TRY(shard_check(o, lo, hi));
    opt_group *g = &o->groups[0];
    if (g->n_state) {
        if (!chunk) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer shard: no state memory for %d state arrays", g->n_state);
        if (stride < hi - lo)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer shard: a chunk of %lld elements cannot hold [%lld, %lld)",
                            (long long)stride, (long long)lo, (long long)hi);
        for (int k = 0; k < g->n_state; k++) { /* the chunk is memory of the parameters' device, as the state */
            float *to = chunk + (int64_t)k * stride;
            size_t bytes = (size_t)(hi - lo) * sizeof(float);
            if (g->state) LK_TRY(lk_device_copy(g->dev, to, g->dev, g->state + (int64_t)k * g->numel + lo, bytes));
            else LK_TRY(lk_device_memset(g->dev, to, 0, bytes)); /* deferred: the state a new optimizer starts from */
        }
        state_free(g);
        g->state = chunk;
        g->state_shared = true;
        g->sbase = lo;
        g->sstride = stride;
    }
    g->state_writer = true;
    g->lo = lo;
    g->hi = hi;
    return LK_STATUS_OK;
}

lk_status lk__optimizer_shard(lk_optimizer *o, int64_t lo, int64_t hi, float *state, bool owner) {
    LK_TRY(shard_check(o, lo, hi));
    opt_group *g = &o->groups[0];
    if (g->n_state) {
        if (!state) return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer shard: no state memory for %d state arrays", g->n_state);
        if (owner) memcpy(state, g->state, (size_t)g->n_state * (size_t)g->numel * sizeof(float));
        state_free(g);
        g->state = state;
        g->state_shared = true;
    }
    g->state_writer = owner;
    g->lo = lo;
    g->hi = hi;
    return LK_STATUS_OK;
}
