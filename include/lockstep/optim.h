/* lockstep/optim.h — optimizers (SGD, Adam, AdamW), learning-rate
 * schedulers, gradient clipping and the fp16 loss scaler, with PyTorch
 * 1.13's formulas, defaults and argument checks, so a run matches
 * torch.optim step for step.
 *
 *     lk_named_tensors params = {0};
 *     lk_layer_named_parameters(model, &params);
 *     lk_optim_config cfg = lk_adam_config_default();
 *     cfg.lr = 1e-3;
 *     lk_optimizer *opt;
 *     if (lk_optimizer_create(&cfg, &params, &opt)) fprintf(stderr, "%s\n", lk_last_error());
 *     lk_named_tensors_clear(&params);          // the optimizer keeps its own references
 *     ... loss = ...; lk_backward(loss); lk_optimizer_step(opt); lk_optimizer_zero_grad(opt, false);
 *     lk_optimizer_free(opt);
 *
 * Memory: every parameter group keeps its optimizer state (momentum buffer,
 * exp_avg, exp_avg_sq, max_exp_avg_sq) in one contiguous allocation, and
 * each step runs one fused loop per group; when the group's parameters and
 * gradients are contiguous in memory (lk_params_flatten) that loop covers
 * the whole flat range at once.
 *
 * Parameters need f32 contiguous data and, to be updated, an f32 contiguous
 * gradient; a parameter whose .grad is NULL is skipped (as in PyTorch).
 */
#ifndef LOCKSTEP_OPTIM_H
#define LOCKSTEP_OPTIM_H

#include "lockstep/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ========================================================================
 * Optimizers
 * ====================================================================== */

typedef enum { LK_OPTIM_SGD, LK_OPTIM_ADAM, LK_OPTIM_ADAMW, LK_OPTIM_RMSPROP } lk_optim_kind;

/* One config for all kinds; fields a kind does not use are ignored. */
typedef struct lk_optim_config {
    lk_optim_kind kind;
    double lr;           /* SGD: 0.01 here (PyTorch makes it required); Adam(W): 1e-3; RMSprop: 1e-2 */
    double weight_decay; /* SGD/Adam: 0 (L2 added to the gradient); AdamW: 1e-2 (decoupled) */
    bool maximize;       /* false */
    /* SGD, RMSprop */
    double momentum;  /* 0 */
    double dampening; /* 0 */
    bool nesterov;    /* false; needs momentum > 0 and dampening = 0 */
    /* Adam, AdamW */
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-8 (also RMSprop's) */
    bool amsgrad;        /* false */
    /* RMSprop */
    double alpha;  /* 0.99: smoothing of the squared-gradient average */
    bool centered; /* false; true divides by the gradient's estimated variance */
} lk_optim_config;

lk_optim_config lk_sgd_config_default(void);
lk_optim_config lk_adam_config_default(void);
lk_optim_config lk_adamw_config_default(void);
lk_optim_config lk_rmsprop_config_default(void);
/* "sgd", "adam", "adamw", "rmsprop" (case-insensitive) -> that kind's defaults. */
lk_status lk_optim_config_for(const char *name, lk_optim_config *out);
/* PyTorch's checks: "Invalid learning rate: -0.1", betas in [0, 1), eps >= 0,
 * weight_decay >= 0, momentum >= 0, nesterov needs momentum > 0 and zero
 * dampening. INVALID_ARGUMENT with that message. */
lk_status lk_optim_config_validate(const lk_optim_config *cfg);

typedef struct lk_optimizer lk_optimizer;

/* Creates an optimizer over `params` as its first parameter group (names
 * are used for state save/load; the optimizer retains the tensors). */
lk_status lk_optimizer_create(const lk_optim_config *cfg, const lk_named_tensors *params, lk_optimizer **out);
/* Adds a group with its own lr and weight_decay (NAN: the optimizer's
 * defaults). A parameter may be in one group only. */
lk_status lk_optimizer_add_param_group(lk_optimizer *o, const lk_named_tensors *params, double lr, double weight_decay);
void lk_optimizer_free(lk_optimizer *o);
/* Exempts the parameter `name` (of any group) from weight decay: it is
 * updated with weight_decay 0 while the rest of its group decays. That is
 * nanoGPT's second parameter group (biases and LayerNorm weights) without
 * a second group, so a flat group stays one range and DDP's shared-parameter
 * sharding (one group) still applies; the bits are those of a second group
 * with weight_decay 0. INVALID_ARGUMENT for a name the optimizer lacks. */
lk_status lk_optimizer_no_weight_decay(lk_optimizer *o, const char *name);

/* One update of every parameter that has a gradient. */
lk_status lk_optimizer_step(lk_optimizer *o);
/* Zeroes every gradient, or drops it with set_to_none (PyTorch 1.13's
 * default is false). Gradients inside a flat buffer (lk_params_flatten,
 * DDP buckets) are always zeroed, never dropped: the views must stay. */
void lk_optimizer_zero_grad(lk_optimizer *o, bool set_to_none);

int lk_optimizer_num_groups(const lk_optimizer *o);
const lk_optim_config *lk_optimizer_config(const lk_optimizer *o, int group);
double lk_optimizer_get_lr(const lk_optimizer *o, int group);
lk_status lk_optimizer_set_lr(lk_optimizer *o, int group, double lr);
/* The momentum a scheduler may cycle: SGD's momentum or Adam's beta1. */
double lk_optimizer_get_momentum(const lk_optimizer *o, int group);
lk_status lk_optimizer_set_momentum(lk_optimizer *o, int group, double momentum);

/* State by name, appended to `out`: "param_groups.<g>.lr" (and
 * .weight_decay, .momentum, .beta1, .beta2, f64 scalars), "state.<param
 * name>.step" (i64 scalar), ".exp_avg", ".exp_avg_sq", ".max_exp_avg_sq",
 * ".momentum_buffer" (f32, parameter-shaped) for parameters that have state.
 * The tensors are copies the caller owns through the list. */
lk_status lk_optimizer_state_get(const lk_optimizer *o, lk_named_tensors *out);
/* Restores what state_get wrote (same groups and parameter names). Unknown
 * names, wrong shapes or group counts are one INVALID_ARGUMENT error listing
 * them; on error nothing has changed. */
lk_status lk_optimizer_state_load(lk_optimizer *o, const lk_named_tensors *state);

/* ========================================================================
 * Gradient clipping (torch.nn.utils), over the .grad of `params`
 * ====================================================================== */

/* Scales every gradient by min(1, max_norm / (total + 1e-6)) where total is
 * the norm_type-norm of all gradients together (INFINITY: max |g|). Returns
 * the total norm in *total_norm (may be NULL). A NaN or infinite total is
 * not an error (error_if_nonfinite=False): the gradients are scaled as
 * PyTorch does, which turns them into NaN or zero. */
lk_status lk_clip_grad_norm(const lk_named_tensors *params, double max_norm, double norm_type, double *total_norm);
/* Clamps every gradient element to [-clip_value, clip_value]. */
lk_status lk_clip_grad_value(const lk_named_tensors *params, double clip_value);

/* ========================================================================
 * Dynamic loss scaling for fp16 (torch.cuda.amp.GradScaler, 1.13)
 *
 * Per optimizer step: multiply the loss by lk_grad_scaler_scale() before
 * backward; once the gradients are final (reduced across ranks), call
 * lk_grad_scaler_unscale, reduce found_inf across ranks (MAX) if there are
 * several, clip and step only when it is false, then lk_grad_scaler_update
 * with the reduced flag. The scale halves after an overflow and doubles
 * after growth_interval clean steps in a row.
 * ====================================================================== */

typedef struct lk_grad_scaler lk_grad_scaler;

typedef struct lk_grad_scaler_config {
    double init_scale;       /* 65536 (2^16) */
    double growth_factor;    /* 2; must be > 1 */
    double backoff_factor;   /* 0.5; must be in (0, 1) */
    int64_t growth_interval; /* 2000 clean steps before a growth; > 0 */
    bool enabled;            /* true; false: scale 1, unscale and update do nothing */
} lk_grad_scaler_config;
lk_grad_scaler_config lk_grad_scaler_config_default(void);

/* PyTorch's argument checks (INVALID_ARGUMENT, with its words); on error
 * *out is NULL. */
lk_status lk_grad_scaler_create(const lk_grad_scaler_config *cfg, lk_grad_scaler **out);
void lk_grad_scaler_free(lk_grad_scaler *s);
/* The loss multiplier (1 when disabled). */
float lk_grad_scaler_scale(const lk_grad_scaler *s);
int64_t lk_grad_scaler_growth_tracker(const lk_grad_scaler *s);
bool lk_grad_scaler_is_enabled(const lk_grad_scaler *s);
/* Multiplies every .grad of `params` (f32 contiguous; NULL grads skipped)
 * by the f32 reciprocal of the scale and sets *found_inf when any element
 * was inf or NaN before (all gradients are unscaled either way). Once per
 * step: a second call before update is INVALID_USAGE. */
lk_status lk_grad_scaler_unscale(lk_grad_scaler *s, const lk_named_tensors *params, bool *found_inf);
/* found_inf: scale *= backoff_factor, the growth tracker resets; otherwise
 * the tracker counts the step, and at growth_interval scale *= growth_factor
 * (kept when that would overflow f32) and the tracker resets. */
lk_status lk_grad_scaler_update(lk_grad_scaler *s, bool found_inf);
/* GradScaler.state_dict()'s keys, appended to `out`: "scale",
 * "growth_factor", "backoff_factor" (f64 scalars), "growth_interval",
 * "_growth_tracker" (i64 scalars); nothing when disabled. load restores
 * them (the configured init_scale stays); a missing, unknown or invalid
 * entry is one INVALID_ARGUMENT error and changes nothing. */
lk_status lk_grad_scaler_state_get(const lk_grad_scaler *s, lk_named_tensors *out);
lk_status lk_grad_scaler_state_load(lk_grad_scaler *s, const lk_named_tensors *state);

/* ========================================================================
 * Learning-rate schedulers (torch.optim.lr_scheduler, 1.13)
 *
 * Creating a scheduler performs PyTorch's initial step (the lr of epoch 0
 * is set at once). Call lk_scheduler_step after each optimizer step or each
 * epoch (the trainer decides); ReduceLROnPlateau takes a metric instead.
 * Like PyTorch, the updates are recursive (lr_t from lr_{t-1}), so they
 * compose with other changes of the lr.
 * ====================================================================== */

typedef struct lk_scheduler lk_scheduler;

lk_status lk_step_lr_create(lk_optimizer *o, int step_size, double gamma, lk_scheduler **out);
lk_status lk_multistep_lr_create(lk_optimizer *o, const int *milestones, int n_milestones, double gamma,
                                 lk_scheduler **out);
lk_status lk_exponential_lr_create(lk_optimizer *o, double gamma, lk_scheduler **out);
lk_status lk_cosine_annealing_lr_create(lk_optimizer *o, int t_max, double eta_min, lk_scheduler **out);
/* PyTorch defaults: start_factor 1/3, end_factor 1, total_iters 5. */
lk_status lk_linear_lr_create(lk_optimizer *o, double start_factor, double end_factor, int total_iters,
                              lk_scheduler **out);
/* Takes ownership of the n schedulers (even on failure); all must drive `o`.
 * n_milestones must be n - 1. */
lk_status lk_sequential_lr_create(lk_optimizer *o, lk_scheduler **schedulers, int n, const int *milestones,
                                  lk_scheduler **out);

typedef struct lk_one_cycle_config {
    double max_lr;          /* required */
    int total_steps;        /* required */
    double pct_start;       /* 0.3 */
    bool anneal_linear;     /* false: cosine */
    bool cycle_momentum;    /* true */
    double base_momentum;   /* 0.85 */
    double max_momentum;    /* 0.95 */
    double div_factor;      /* 25 */
    double final_div_factor; /* 1e4 */
    bool three_phase;       /* false */
} lk_one_cycle_config;
lk_one_cycle_config lk_one_cycle_config_default(double max_lr, int total_steps);
lk_status lk_one_cycle_lr_create(lk_optimizer *o, const lk_one_cycle_config *cfg, lk_scheduler **out);

typedef struct lk_plateau_config {
    bool mode_max;        /* false: "min" */
    double factor;        /* 0.1; must be < 1 */
    int patience;         /* 10 */
    double threshold;     /* 1e-4 */
    bool threshold_abs;   /* false: "rel" */
    int cooldown;         /* 0 */
    double min_lr;        /* 0 (all groups) */
    double eps;           /* 1e-8 */
} lk_plateau_config;
lk_plateau_config lk_plateau_config_default(void);
lk_status lk_reduce_lr_on_plateau_create(lk_optimizer *o, const lk_plateau_config *cfg, lk_scheduler **out);

/* Advances one step (INVALID_USAGE for ReduceLROnPlateau). */
lk_status lk_scheduler_step(lk_scheduler *s);
/* ReduceLROnPlateau's step with the monitored metric (others ignore it and step). */
lk_status lk_scheduler_step_metric(lk_scheduler *s, double metric);
/* The lr of group g set by the last step. */
double lk_scheduler_last_lr(const lk_scheduler *s, int group);
const char *lk_scheduler_name(const lk_scheduler *s);
/* Counters by name ("last_epoch", "step_count", "best", "num_bad_epochs",
 * "cooldown_counter", "last_lr.<g>", "s<i>.<...>" for SequentialLR's
 * children) and, under torch's names, the hyperparameters ("T_max",
 * "eta_min", "step_size", "gamma", "start_factor", "end_factor",
 * "total_iters", "total_steps") as f64 scalars. Load checks every value,
 * restores them (same kind and structure) and, as torch's
 * load_state_dict, lets the saved hyperparameters replace the
 * scheduler's own (saying so where they differ); a state without them
 * keeps the scheduler's. */
lk_status lk_scheduler_state_get(const lk_scheduler *s, lk_named_tensors *out);
lk_status lk_scheduler_state_load(lk_scheduler *s, const lk_named_tensors *state);
void lk_scheduler_free(lk_scheduler *s);

#ifdef __cplusplus
}
#endif
#endif
