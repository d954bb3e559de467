/* Learning-rate schedulers, transcribed from torch.optim.lr_scheduler 1.13:
 * the same recursive get_lr forms (lr_t from the group's current lr), the
 * same closed forms where PyTorch uses them (SequentialLR's milestone
 * restarts), the same initial step at construction, and OneCycleLR's
 * momentum cycling through the optimizer. State is a handful of counters
 * and the scalar hyperparameters, saved and loaded by torch's names. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim/optim_impl.h"

typedef enum { S_STEP, S_MULTISTEP, S_EXP, S_COSINE, S_LINEAR, S_SEQUENTIAL, S_ONECYCLE, S_PLATEAU } sched_kind;

static const char *const kind_names[] = {"StepLR",       "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
                                         "LinearLR",     "SequentialLR", "OneCycleLR",   "ReduceLROnPlateau"};

#define MAX_GROUPS_STATE 64

struct lk_scheduler {
    sched_kind kind;
    lk_optimizer *o;
    int n_groups;
    double *base_lrs, *last_lr, *scratch;
    double last_epoch, step_count; /* doubles so state I/O is uniform; always integral */
    /* parameters */
    int step_size, t_max, total_iters;
    double gamma, eta_min, start_factor, end_factor;
    int *milestones, n_milestones;
    lk_scheduler **children;
    int n_children;
    lk_one_cycle_config oc;
    double oc_initial, oc_max, oc_min;
    lk_plateau_config pl;
    double best, num_bad, cooldown_counter;
};

static lk_scheduler *sched_alloc(lk_optimizer *o, sched_kind k) {
    lk_scheduler *s = lk_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->kind = k;
    s->o = o;
    s->n_groups = lk_optimizer_num_groups(o);
    s->base_lrs = lk_calloc((size_t)s->n_groups * 3, sizeof(double));
    if (!s->base_lrs) {
        lk_free(s);
        return NULL;
    }
    s->last_lr = s->base_lrs + s->n_groups;
    s->scratch = s->last_lr + s->n_groups;
    s->last_epoch = -1;
    return s;
}

void lk_scheduler_free(lk_scheduler *s) {
    if (!s) return;
    for (int i = 0; i < s->n_children; i++) lk_scheduler_free(s->children[i]);
    lk_free(s->children);
    lk_free(s->milestones);
    lk_free(s->base_lrs);
    lk_free(s);
}

const char *lk_scheduler_name(const lk_scheduler *s) { return s ? kind_names[s->kind] : "(null)"; }

double lk_scheduler_last_lr(const lk_scheduler *s, int group) {
    return s && group >= 0 && group < s->n_groups ? s->last_lr[group] : NAN;
}

static double pymod(double a, double m) {
    double r = fmod(a, m);
    return r < 0 ? r + m : r;
}

/* get_lr(): the recursive forms. Writes s->scratch. */
static lk_status get_lr(lk_scheduler *s) {
    double e = s->last_epoch;
    for (int g = 0; g < s->n_groups; g++) {
        double lr = lk_optimizer_get_lr(s->o, g), base = s->base_lrs[g], v = lr;
        switch (s->kind) {
        case S_STEP:
            if (e != 0 && pymod(e, s->step_size) == 0) v = lr * s->gamma;
            break;
        case S_MULTISTEP: {
            int count = 0;
            for (int i = 0; i < s->n_milestones; i++) count += s->milestones[i] == (int)e;
            if (count) v = lr * pow(s->gamma, count);
            break;
        }
        case S_EXP:
            if (e != 0) v = lr * s->gamma;
            break;
        case S_COSINE: {
            double T = s->t_max, em = s->eta_min;
            if (e == 0) v = lr;
            else if (s->step_count == 1 && e > 0) v = em + (base - em) * (1 + cos(e * M_PI / T)) / 2;
            else if (pymod(e - 1 - T, 2 * T) == 0) v = lr + (base - em) * (1 - cos(M_PI / T)) / 2;
            else v = (1 + cos(M_PI * e / T)) / (1 + cos(M_PI * (e - 1) / T)) * (lr - em) + em;
            break;
        }
        case S_LINEAR:
            if (e == 0) v = lr * s->start_factor;
            else if (e > s->total_iters) v = lr;
            else
                v = lr * (1. + (s->end_factor - s->start_factor) /
                                   (s->total_iters * s->start_factor + (e - 1) * (s->end_factor - s->start_factor)));
            break;
        case S_ONECYCLE: {
            const lk_one_cycle_config *c = &s->oc;
            double T = c->total_steps;
            if (e > T)
                return lk_error(LK_STATUS_INVALID_USAGE,
                                "OneCycleLR: tried to step %.0f times; the specified number of total steps is %d", e,
                                c->total_steps);
            /* phases: end_step, start/end lr, start/end momentum */
            double ph[3][5];
            int np;
            if (c->three_phase) {
                double p0[5] = {c->pct_start * T - 1, s->oc_initial, s->oc_max, c->max_momentum, c->base_momentum};
                double p1[5] = {2 * c->pct_start * T - 2, s->oc_max, s->oc_initial, c->base_momentum, c->max_momentum};
                double p2[5] = {T - 1, s->oc_initial, s->oc_min, c->max_momentum, c->max_momentum};
                memcpy(ph[0], p0, sizeof p0), memcpy(ph[1], p1, sizeof p1), memcpy(ph[2], p2, sizeof p2);
                np = 3;
            } else {
                double p0[5] = {c->pct_start * T - 1, s->oc_initial, s->oc_max, c->max_momentum, c->base_momentum};
                double p1[5] = {T - 1, s->oc_max, s->oc_min, c->base_momentum, c->max_momentum};
                memcpy(ph[0], p0, sizeof p0), memcpy(ph[1], p1, sizeof p1);
                np = 2;
            }
            double start = 0, mom = NAN;
            for (int i = 0; i < np; i++) {
                double end = ph[i][0];
                if (e <= end || i == np - 1) {
                    double pct = (e - start) / (end - start);
                    if (c->anneal_linear) {
                        v = (ph[i][2] - ph[i][1]) * pct + ph[i][1];
                        mom = (ph[i][4] - ph[i][3]) * pct + ph[i][3];
                    } else {
                        double co = cos(M_PI * pct) + 1;
                        v = ph[i][2] + (ph[i][1] - ph[i][2]) / 2.0 * co;
                        mom = ph[i][4] + (ph[i][3] - ph[i][4]) / 2.0 * co;
                    }
                    break;
                }
                start = end;
            }
            if (c->cycle_momentum) LK_TRY(lk_optimizer_set_momentum(s->o, g, mom));
            break;
        }
        default:
            return lk_error(LK_STATUS_INTERNAL, "scheduler %s has no get_lr", kind_names[s->kind]);
        }
        s->scratch[g] = v;
    }
    return LK_STATUS_OK;
}

static bool has_closed_form(const lk_scheduler *s) {
    return s->kind == S_STEP || s->kind == S_MULTISTEP || s->kind == S_EXP || s->kind == S_COSINE || s->kind == S_LINEAR;
}

static void closed_form(lk_scheduler *s) {
    double e = s->last_epoch;
    for (int g = 0; g < s->n_groups; g++) {
        double b = s->base_lrs[g], v = b;
        switch (s->kind) {
        case S_STEP: v = b * pow(s->gamma, floor(e / s->step_size)); break;
        case S_MULTISTEP: {
            int c = 0;
            for (int i = 0; i < s->n_milestones; i++) c += s->milestones[i] <= e;
            v = b * pow(s->gamma, c);
            break;
        }
        case S_EXP: v = b * pow(s->gamma, e); break;
        case S_COSINE: v = s->eta_min + (b - s->eta_min) * (1 + cos(M_PI * e / s->t_max)) / 2; break;
        case S_LINEAR:
            v = b * (s->start_factor + (s->end_factor - s->start_factor) * fmin(s->total_iters, e) / s->total_iters);
            break;
        default: break;
        }
        s->scratch[g] = v;
    }
}

/* _LRScheduler.step(epoch=None or epoch). */
static lk_status base_step(lk_scheduler *s, bool has_epoch, double epoch) {
    s->step_count++;
    if (!has_epoch) {
        s->last_epoch++;
        LK_TRY(get_lr(s));
    } else {
        s->last_epoch = epoch;
        if (has_closed_form(s)) closed_form(s);
        else LK_TRY(get_lr(s));
    }
    for (int g = 0; g < s->n_groups; g++) {
        LK_TRY(lk_optimizer_set_lr(s->o, g, s->scratch[g]));
        s->last_lr[g] = s->scratch[g];
    }
    return LK_STATUS_OK;
}

/* _LRScheduler.__init__ with last_epoch = -1: initial_lr, base_lrs, initial step. */
static lk_status base_init(lk_scheduler *s) {
    for (int g = 0; g < s->n_groups; g++) {
        if (isnan(lk__optimizer_initial_lr(s->o, g))) lk__optimizer_set_initial_lr(s->o, g, lk_optimizer_get_lr(s->o, g));
        s->base_lrs[g] = lk__optimizer_initial_lr(s->o, g);
    }
    s->last_epoch = -1;
    s->step_count = 0;
    return base_step(s, false, 0);
}

static lk_status finish(lk_scheduler *s, lk_scheduler **out) {
    lk_status st = base_init(s);
    if (st) {
        lk_scheduler_free(s);
        return st;
    }
    *out = s;
    return LK_STATUS_OK;
}

#define BEGIN(kind)                                                                                   \
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: NULL out", kind_names[kind]);         \
    *out = NULL;                                                                                      \
    if (!o || lk_optimizer_num_groups(o) == 0)                                                        \
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: NULL or empty optimizer", kind_names[kind]);

lk_status lk_step_lr_create(lk_optimizer *o, int step_size, double gamma, lk_scheduler **out) {
    BEGIN(S_STEP);
    if (step_size <= 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "StepLR: step_size must be positive, got %d", step_size);
    lk_scheduler *s = sched_alloc(o, S_STEP);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->step_size = step_size;
    s->gamma = gamma;
    return finish(s, out);
}

lk_status lk_multistep_lr_create(lk_optimizer *o, const int *milestones, int n, double gamma, lk_scheduler **out) {
    BEGIN(S_MULTISTEP);
    if (n < 0 || (n > 0 && !milestones)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "MultiStepLR: %d milestones but no array", n);
    lk_scheduler *s = sched_alloc(o, S_MULTISTEP);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->milestones = lk_malloc((size_t)(n ? n : 1) * sizeof(int));
    if (!s->milestones) {
        lk_scheduler_free(s);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    if (n) memcpy(s->milestones, milestones, (size_t)n * sizeof(int));
    s->n_milestones = n;
    s->gamma = gamma;
    return finish(s, out);
}

lk_status lk_exponential_lr_create(lk_optimizer *o, double gamma, lk_scheduler **out) {
    BEGIN(S_EXP);
    lk_scheduler *s = sched_alloc(o, S_EXP);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->gamma = gamma;
    return finish(s, out);
}

lk_status lk_cosine_annealing_lr_create(lk_optimizer *o, int t_max, double eta_min, lk_scheduler **out) {
    BEGIN(S_COSINE);
    if (t_max <= 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "CosineAnnealingLR: T_max must be positive, got %d", t_max);
    lk_scheduler *s = sched_alloc(o, S_COSINE);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->t_max = t_max;
    s->eta_min = eta_min;
    return finish(s, out);
}

lk_status lk_linear_lr_create(lk_optimizer *o, double start_factor, double end_factor, int total_iters, lk_scheduler **out) {
    BEGIN(S_LINEAR);
    if (!(start_factor > 0.0 && start_factor <= 1.0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "LinearLR: starting multiplicative factor expected to be greater than 0 and less or equal to 1, got %g",
                        start_factor);
    if (!(end_factor >= 0.0 && end_factor <= 1.0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "LinearLR: ending multiplicative factor expected to be between 0 and 1, got %g",
                        end_factor);
    if (total_iters <= 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "LinearLR: total_iters must be positive, got %d", total_iters);
    lk_scheduler *s = sched_alloc(o, S_LINEAR);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->start_factor = start_factor;
    s->end_factor = end_factor;
    s->total_iters = total_iters;
    return finish(s, out);
}

lk_status lk_sequential_lr_create(lk_optimizer *o, lk_scheduler **schedulers, int n, const int *milestones, lk_scheduler **out) {
    lk_status st = LK_STATUS_OK;
    if (!out) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "SequentialLR: NULL out");
    else *out = NULL;
    if (!st && (!o || n < 1 || !schedulers))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "SequentialLR: needs an optimizer and at least one scheduler (got %d)", n);
    for (int i = 0; !st && i < n; i++) {
        if (!schedulers[i]) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "SequentialLR: scheduler %d is NULL", i);
        else if (schedulers[i]->o != o)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "SequentialLR: expects all schedulers to belong to the same optimizer, but scheduler %d does not", i);
        else if (schedulers[i]->kind == S_PLATEAU || schedulers[i]->kind == S_SEQUENTIAL)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "SequentialLR: scheduler %d is a %s, which cannot be chained", i,
                          kind_names[schedulers[i]->kind]);
    }
    for (int i = 1; !st && i < n - 1; i++)
        if (milestones[i] < milestones[i - 1])
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "SequentialLR: milestones must be increasing");
    lk_scheduler *s = st ? NULL : sched_alloc(o, S_SEQUENTIAL);
    if (!st && !s) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) {
        s->children = lk_malloc((size_t)n * sizeof *s->children);
        s->milestones = lk_malloc((size_t)n * sizeof(int));
        if (!s->children || !s->milestones) st = LK_STATUS_OUT_OF_MEMORY;
    }
    if (st) {
        lk_scheduler_free(s);
        for (int i = 0; schedulers && i < n; i++) lk_scheduler_free(schedulers[i]);
        return st;
    }
    memcpy(s->children, schedulers, (size_t)n * sizeof *s->children);
    s->n_children = n;
    if (n > 1) memcpy(s->milestones, milestones, (size_t)(n - 1) * sizeof(int));
    s->n_milestones = n - 1;
    s->last_epoch = 0;
    /* Reset to the initial lrs, undo the children's initial steps, redo the first one's. */
    for (int g = 0; g < s->n_groups; g++) {
        double il = lk__optimizer_initial_lr(o, g);
        s->base_lrs[g] = il;
        if (!isnan(il)) lk_optimizer_set_lr(o, g, il);
    }
    for (int i = 0; i < n; i++) s->children[i]->last_epoch -= 1;
    lk_scheduler *c0 = s->children[0];
    c0->step_count = 0;
    st = base_step(c0, false, 0);
    if (st) {
        lk_scheduler_free(s);
        return st;
    }
    memcpy(s->last_lr, c0->last_lr, (size_t)s->n_groups * sizeof(double));
    *out = s;
    return LK_STATUS_OK;
}

lk_one_cycle_config lk_one_cycle_config_default(double max_lr, int total_steps) {
    return (lk_one_cycle_config){.max_lr = max_lr, .total_steps = total_steps, .pct_start = 0.3, .cycle_momentum = true,
                                 .base_momentum = 0.85, .max_momentum = 0.95, .div_factor = 25.0, .final_div_factor = 1e4};
}

lk_status lk_one_cycle_lr_create(lk_optimizer *o, const lk_one_cycle_config *cfg, lk_scheduler **out) {
    BEGIN(S_ONECYCLE);
    if (!cfg) return lk_error(LK_STATUS_INVALID_ARGUMENT, "OneCycleLR: NULL config");
    if (cfg->total_steps <= 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "OneCycleLR: expected positive integer total_steps, but got %d", cfg->total_steps);
    if (!(cfg->pct_start >= 0 && cfg->pct_start <= 1))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "OneCycleLR: expected float between 0 and 1 pct_start, but got %g", cfg->pct_start);
    if (!(cfg->max_lr >= 0) || !(cfg->div_factor > 0) || !(cfg->final_div_factor > 0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "OneCycleLR: max_lr %g must be >= 0, div_factor %g and final_div_factor %g > 0",
                        cfg->max_lr, cfg->div_factor, cfg->final_div_factor);
    if (cfg->cycle_momentum && lk_optimizer_config(o, 0)->kind == LK_OPTIM_SGD && lk_optimizer_get_momentum(o, 0) == 0.0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "OneCycleLR: cycle_momentum needs an SGD optimizer created with momentum > 0 (or set cycle_momentum false)");
    lk_scheduler *s = sched_alloc(o, S_ONECYCLE);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->oc = *cfg;
    s->oc_max = cfg->max_lr;
    s->oc_initial = cfg->max_lr / cfg->div_factor;
    s->oc_min = s->oc_initial / cfg->final_div_factor;
    lk_status st = LK_STATUS_OK;
    for (int g = 0; g < s->n_groups && !st; g++) {
        lk__optimizer_set_initial_lr(o, g, s->oc_initial);
        if (cfg->cycle_momentum) st = lk_optimizer_set_momentum(o, g, cfg->max_momentum);
    }
    if (st) {
        lk_scheduler_free(s);
        return st;
    }
    return finish(s, out);
}

lk_plateau_config lk_plateau_config_default(void) {
    return (lk_plateau_config){.factor = 0.1, .patience = 10, .threshold = 1e-4, .eps = 1e-8};
}

lk_status lk_reduce_lr_on_plateau_create(lk_optimizer *o, const lk_plateau_config *cfg, lk_scheduler **out) {
    BEGIN(S_PLATEAU);
    if (!cfg) return lk_error(LK_STATUS_INVALID_ARGUMENT, "ReduceLROnPlateau: NULL config");
    if (!(cfg->factor < 1.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "ReduceLROnPlateau: Factor should be < 1.0 (got %g)", cfg->factor);
    if (cfg->patience < 0 || cfg->cooldown < 0 || !(cfg->min_lr >= 0) || !(cfg->threshold >= 0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "ReduceLROnPlateau: patience %d, cooldown %d, min_lr %g and threshold %g must be >= 0", cfg->patience,
                        cfg->cooldown, cfg->min_lr, cfg->threshold);
    lk_scheduler *s = sched_alloc(o, S_PLATEAU);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->pl = *cfg;
    s->last_epoch = 0;
    s->best = cfg->mode_max ? -INFINITY : INFINITY;
    for (int g = 0; g < s->n_groups; g++) s->last_lr[g] = s->base_lrs[g] = lk_optimizer_get_lr(o, g);
    *out = s;
    return LK_STATUS_OK;
}

static bool plateau_better(const lk_scheduler *s, double a) {
    const lk_plateau_config *c = &s->pl;
    if (!c->mode_max) return c->threshold_abs ? a < s->best - c->threshold : a < s->best * (1.0 - c->threshold);
    return c->threshold_abs ? a > s->best + c->threshold : a > s->best * (c->threshold + 1.0);
}

static lk_status plateau_step(lk_scheduler *s, double metric) {
    s->last_epoch += 1;
    if (plateau_better(s, metric)) {
        s->best = metric;
        s->num_bad = 0;
    } else {
        s->num_bad += 1;
    }
    if (s->cooldown_counter > 0) {
        s->cooldown_counter -= 1;
        s->num_bad = 0;
    }
    if (s->num_bad > s->pl.patience) {
        for (int g = 0; g < s->n_groups; g++) {
            double old = lk_optimizer_get_lr(s->o, g), nl = fmax(old * s->pl.factor, s->pl.min_lr);
            if (old - nl > s->pl.eps) LK_TRY(lk_optimizer_set_lr(s->o, g, nl));
        }
        s->cooldown_counter = s->pl.cooldown;
        s->num_bad = 0;
    }
    for (int g = 0; g < s->n_groups; g++) s->last_lr[g] = lk_optimizer_get_lr(s->o, g);
    return LK_STATUS_OK;
}

static lk_status sequential_step(lk_scheduler *s) {
    s->last_epoch += 1;
    int idx = 0;
    while (idx < s->n_milestones && s->milestones[idx] <= s->last_epoch) idx++; /* bisect_right */
    lk_scheduler *c = s->children[idx];
    if (idx > 0 && s->milestones[idx - 1] == s->last_epoch) LK_TRY(base_step(c, true, 0));
    else LK_TRY(base_step(c, false, 0));
    memcpy(s->last_lr, c->last_lr, (size_t)s->n_groups * sizeof(double));
    return LK_STATUS_OK;
}

lk_status lk_scheduler_step(lk_scheduler *s) {
    if (!s) return lk_error(LK_STATUS_INVALID_ARGUMENT, "scheduler_step: NULL scheduler");
    if (s->kind == S_PLATEAU)
        return lk_error(LK_STATUS_INVALID_USAGE, "ReduceLROnPlateau steps on a metric: use lk_scheduler_step_metric");
    if (s->kind == S_SEQUENTIAL) return sequential_step(s);
    return base_step(s, false, 0);
}

lk_status lk_scheduler_step_metric(lk_scheduler *s, double metric) {
    if (!s) return lk_error(LK_STATUS_INVALID_ARGUMENT, "scheduler_step: NULL scheduler");
    if (s->kind == S_PLATEAU) return plateau_step(s, metric);
    return lk_scheduler_step(s);
}

/* ---- state ------------------------------------------------------------------------------------- */

/* A state entry: a counter (required on load) or, as torch's state_dict
 * also holds them, a hyperparameter (optional on load: checkpoints written
 * before they were saved keep this run's). */
typedef enum { K_COUNT, K_EPOCH, K_LR, K_BEST, K_HYPER_INT, K_HYPER_START, K_HYPER_FACTOR, K_HYPER_NONNEG } field_kind;

typedef struct {
    char name[64];
    double *v; /* or */
    int *iv;
    field_kind kind;
} field;

static int fields(lk_scheduler *s, const char *prefix, field *f, int max) {
    int n = 0;
#define F(nm, ptr, k)                                                    \
    if (n < max) {                                                       \
        snprintf(f[n].name, sizeof f[n].name, "%s%s", prefix, nm);       \
        f[n].v = (ptr), f[n].iv = NULL, f[n++].kind = (k);               \
    }
#define FI(nm, ptr)                                                      \
    if (n < max) {                                                       \
        snprintf(f[n].name, sizeof f[n].name, "%s%s", prefix, nm);       \
        f[n].v = NULL, f[n].iv = (ptr), f[n++].kind = K_HYPER_INT;       \
    }
    F("last_epoch", &s->last_epoch, K_EPOCH);
    F("step_count", &s->step_count, K_COUNT);
    if (s->kind == S_PLATEAU) {
        F("best", &s->best, K_BEST);
        F("num_bad_epochs", &s->num_bad, K_COUNT);
        F("cooldown_counter", &s->cooldown_counter, K_COUNT);
    }
    for (int g = 0; g < s->n_groups && g < MAX_GROUPS_STATE; g++) {
        char nm[32];
        snprintf(nm, sizeof nm, "last_lr.%d", g);
        F(nm, &s->last_lr[g], K_LR);
        snprintf(nm, sizeof nm, "base_lr.%d", g);
        F(nm, &s->base_lrs[g], K_LR);
    }
    /* torch's names for them */
    switch (s->kind) {
    case S_STEP: FI("step_size", &s->step_size); F("gamma", &s->gamma, K_HYPER_NONNEG); break;
    case S_MULTISTEP:
    case S_EXP: F("gamma", &s->gamma, K_HYPER_NONNEG); break;
    case S_COSINE: FI("T_max", &s->t_max); F("eta_min", &s->eta_min, K_HYPER_NONNEG); break;
    case S_LINEAR:
        F("start_factor", &s->start_factor, K_HYPER_START);
        F("end_factor", &s->end_factor, K_HYPER_FACTOR);
        FI("total_iters", &s->total_iters);
        break;
    case S_ONECYCLE: FI("total_steps", &s->oc.total_steps); break;
    default: break;
    }
#undef F
#undef FI
    for (int i = 0; i < s->n_children; i++) {
        char p[64];
        snprintf(p, sizeof p, "%ss%d.", prefix, i);
        n += fields(s->children[i], p, f + n, max - n);
    }
    return n;
}

#define MAX_FIELDS 1024

static bool is_hyper(field_kind k) { return k >= K_HYPER_INT; }
static double field_get(const field *f) { return f->iv ? (double)*f->iv : *f->v; }

/* What a value of this kind may be; NULL when v is one. */
static const char *field_bad(field_kind k, double v) {
    switch (k) {
    case K_EPOCH: return v >= -1 && v <= 0x1p53 && v == floor(v) ? NULL : "a whole number from -1 to 2^53";
    case K_COUNT: return v >= 0 && v <= 0x1p53 && v == floor(v) ? NULL : "a whole number from 0 to 2^53";
    case K_LR: return isfinite(v) && v >= 0 ? NULL : "a finite learning rate >= 0";
    case K_BEST: return !isnan(v) ? NULL : "a number or +-inf";
    case K_HYPER_INT: return v >= 1 && v <= 2147483647.0 && v == floor(v) ? NULL : "a whole number from 1 to 2^31-1";
    case K_HYPER_START: return v > 0 && v <= 1 ? NULL : "a value in (0, 1]"; /* LinearLR divides by it */
    case K_HYPER_FACTOR: return v >= 0 && v <= 1 ? NULL : "a value in [0, 1]";
    case K_HYPER_NONNEG: return isfinite(v) && v >= 0 ? NULL : "a finite value >= 0";
    }
    return NULL;
}

lk_status lk_scheduler_state_get(const lk_scheduler *s, lk_named_tensors *out) {
    if (!s || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "scheduler_state_get: NULL argument");
    field *f = lk_malloc(MAX_FIELDS * sizeof *f);
    if (!f) return LK_STATUS_OUT_OF_MEMORY;
    int n = fields((lk_scheduler *)s, "", f, MAX_FIELDS);
    lk_status st = LK_STATUS_OK;
    for (int i = 0; i < n && !st; i++) {
        lk_tensor *t = lk_tensor_full(LK_F64, 0, NULL, field_get(&f[i]));
        st = t ? lk_named_tensors_append(out, f[i].name, t) : lk_last_status();
        lk_tensor_release(t);
    }
    lk_free(f);
    return st;
}

lk_status lk_scheduler_state_load(lk_scheduler *s, const lk_named_tensors *state) {
    if (!s || !state) return lk_error(LK_STATUS_INVALID_ARGUMENT, "scheduler_state_load: NULL argument");
    field *f = lk_malloc(MAX_FIELDS * sizeof *f);
    if (!f) return LK_STATUS_OUT_OF_MEMORY;
    int n = fields(s, "", f, MAX_FIELDS);
    char bad[1024] = "";
    int nb = 0;
#define BAD(...) lk__list_add(bad, sizeof bad, &nb, ", ", __VA_ARGS__)
    for (int i = 0; i < n; i++) {
        const lk_tensor *t = lk_named_tensors_find(state, f[i].name);
        if (!t && is_hyper(f[i].kind)) continue;
        if (!t || t->numel != 1) {
            BAD("%s %s", t ? "non-scalar" : "missing", f[i].name);
            continue;
        }
        double v = lk_tensor_get(t, 0);
        const char *want = field_bad(f[i].kind, v);
        if (want) BAD("%s is %g, expected %s", f[i].name, v, want);
    }
    for (int k = 0; k < state->n; k++) {
        bool known = false;
        for (int i = 0; i < n && !known; i++) known = !strcmp(state->items[k].name, f[i].name);
        if (!known) BAD("unexpected %s", state->items[k].name);
    }
#undef BAD
    if (nb) {
        lk_free(f);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "scheduler_state_load (%s): %s", kind_names[s->kind], bad);
    }
    for (int i = 0; i < n; i++) {
        const lk_tensor *t = lk_named_tensors_find(state, f[i].name);
        if (!t) continue;
        double v = lk_tensor_get(t, 0), was = field_get(&f[i]);
        /* As torch's load_state_dict: the saved hyperparameters replace the
         * ones this scheduler was made with; said, because a run resumed
         * with another max_epochs may expect its own horizon. */
        if (is_hyper(f[i].kind) && v != was)
            lk_log0("lr_scheduler: %s %s is %g in the checkpoint and %g in this run: the checkpoint's is kept (as "
                    "PyTorch's load_state_dict does)", kind_names[s->kind], f[i].name, v, was);
        if (f[i].iv) *f[i].iv = (int)v;
        else *f[i].v = v;
    }
    lk_free(f);
    return LK_STATUS_OK;
}
