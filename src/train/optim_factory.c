/* The optimizer factory: builds the run's optimizer, the fp16 loss scaler
 * and the learning-rate scheduler from the trainer's lk_optim_settings (the
 * model's configure_optimizers as YAML: names and hyperparameters) once the
 * parameters are set up. The names are matched here; the config's
 * parameter table (trainer_config.c) limits the scheduler to these names,
 * and "none" (or any other) builds no scheduler. */
#include <string.h>

#include "optim/optim_impl.h" /* lk__optimizer_defer_state */
#include "train/train_impl.h"

/* The tensors of the Embedding layers of l's tree. */
static lk_status embedding_weights(const lk_layer *l, lk_named_tensors *out) {
    if (!strcmp(l->type, "Embedding"))
        for (int i = 0; i < l->params.n; i++) LK_TRY(lk_named_tensors_append(out, "e", l->params.items[i].tensor));
    for (int c = 0; c < l->n_children; c++) LK_TRY(embedding_weights(l->children[c].layer, out));
    return LK_STATUS_OK;
}

/* optimizer.weight_decay_params: the parameters weight decay skips, as
 * lk_optimizer_no_weight_decay (one group kept). */
static lk_status exempt_from_decay(lk_trainer *tr) {
    const char *mode = tr->opt.weight_decay_params;
    if (!mode[0] || !strcmp(mode, "all")) return LK_STATUS_OK;
    lk_named_tensors emb = {0};
    lk_status st = !strcmp(mode, "matrices_no_embeddings") && tr->module && tr->module->net
                       ? embedding_weights(tr->module->net, &emb)
                       : LK_STATUS_OK;
    int n = 0;
    for (int i = 0; !st && i < tr->params->n; i++) {
        const lk_named_tensor *p = &tr->params->items[i];
        bool skip = p->tensor->ndim < 2;
        for (int k = 0; !skip && k < emb.n; k++) skip = emb.items[k].tensor == p->tensor;
        if (skip && !(st = lk_optimizer_no_weight_decay(tr->optim, p->name))) n++;
    }
    lk_named_tensors_clear(&emb);
    if (!st) lk_log0("optimizer.weight_decay_params %s: weight decay on %d of %d parameters", mode, tr->params->n - n,
                     tr->params->n);
    return st;
}

/* optimizer.warmup_steps N: LinearLR from 1/(N+1) to 1 over N steps, then
 * the configured scheduler (SequentialLR with milestone N) — nanoGPT's
 * lr * (it + 1) / (N + 1) during the warm-up. */
static lk_status add_warmup(lk_trainer *tr) {
    const lk_optim_settings *o = &tr->opt;
    if (!strcmp(o->scheduler, "plateau") || !strcmp(o->scheduler, "onecycle"))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "optimizer.warmup_steps %lld with scheduler %s: %s (use cosine, linear, step, ... or none)",
                        (long long)o->warmup_steps, o->scheduler,
                        !strcmp(o->scheduler, "onecycle") ? "onecycle warms up itself (pct_start)"
                                                          : "ReduceLROnPlateau cannot follow a warm-up (torch's SequentialLR refuses it too)");
    if (o->warmup_steps > 2147483646)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer.warmup_steps %lld: too many", (long long)o->warmup_steps);
    int w = (int)o->warmup_steps;
    lk_scheduler *after = tr->sched, *warm = NULL;
    tr->sched = NULL;
    lk_status st = lk_linear_lr_create(tr->optim, 1.0 / (w + 1.0), 1.0, w, &warm);
    if (st) {
        lk_scheduler_free(after);
        return st;
    }
    if (!after) {
        tr->sched = warm;
        return LK_STATUS_OK;
    }
    return lk_sequential_lr_create(tr->optim, (lk_scheduler *[]){warm, after}, 2, &w, &tr->sched);
}

lk_status lk__optim_setup(lk_trainer *tr, int64_t steps_per_epoch) {
    lk_optim_config oc;
    LK_TRY(lk_optim_config_for(tr->opt.name, &oc));
    oc.lr = tr->opt.lr;
    oc.weight_decay = tr->opt.weight_decay;
    if (!strcmp(tr->opt.name, "sgd")) {
        oc.momentum = tr->opt.momentum;
        oc.dampening = tr->opt.dampening;
        oc.nesterov = tr->opt.nesterov;
    } else if (!strcmp(tr->opt.name, "rmsprop")) {
        oc.momentum = tr->opt.momentum;
        oc.alpha = tr->opt.alpha;
        oc.eps = tr->opt.eps;
        oc.centered = tr->opt.centered;
    } else {
        oc.beta1 = tr->opt.beta1;
        oc.beta2 = tr->opt.beta2;
        oc.eps = tr->opt.eps;
        oc.amsgrad = tr->opt.amsgrad;
    }
    if (!strcmp(tr->cfg.scale_lr, "linear")) { /* by the data-parallel ranks: the global batch grows with them */
        int dp = lk_strategy_dp_size(tr->strat);
        double f = (double)dp * (double)tr->accum;
        lk_log0("scale_lr: linear scaling rule: lr %g x %d ranks x %lld accumulation = %g", oc.lr, dp,
                (long long)tr->accum, oc.lr * f);
        oc.lr *= f;
    }
    /* ZeRO keeps only its chunk of the state: none is made whole first */
    bool defer = lk__optimizer_defer_state(lk__strategy_chunks_optimizer_state(tr->strat));
    lk_status cst = lk_optimizer_create(&oc, tr->params, &tr->optim); /* over the parameters this rank holds */
    lk__optimizer_defer_state(defer);
    LK_TRY(cst);
    LK_TRY(exempt_from_decay(tr));
    LK_TRY(lk_strategy_shard_optimizer(tr->strat, tr->optim));
    /* fp16's narrow range needs the loss scaler; bf16's does not, and 16-true
     * has none (as Lightning: torch's GradScaler refuses f16 gradients) */
    if (tr->autocast == LK_F16 && tr->param_dtype == LK_F32) {
        lk_grad_scaler_config gc = lk_grad_scaler_config_default();
        gc.init_scale = tr->cfg.grad_scaler_init_scale;
        gc.growth_factor = tr->cfg.grad_scaler_growth_factor;
        gc.backoff_factor = tr->cfg.grad_scaler_backoff_factor;
        gc.growth_interval = tr->cfg.grad_scaler_growth_interval;
        if (lk_grad_scaler_create(&gc, &tr->scaler))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.precision %s: trainer.grad_scaler_*: %s", tr->cfg.precision,
                            lk_last_error());
    }
    if (lk_strategy_shares_params(tr->strat))
        lk_log0("ddp: the %d ranks share one copy of the parameters and optimizer state, each updating 1/%d of it "
                "(trainer.ddp_shared_params)", tr->world, tr->world);
    const lk_optim_settings *o = &tr->opt;
    bool per_step = !strcmp(o->interval, "step");
    int64_t horizon = per_step ? (tr->cfg.max_steps > 0 ? tr->cfg.max_steps : steps_per_epoch * (tr->cfg.max_epochs > 0 ? tr->cfg.max_epochs : 1))
                               : (tr->cfg.max_epochs > 0 ? tr->cfg.max_epochs : 1);
    if (!strcmp(o->scheduler, "step"))
        LK_TRY(lk_step_lr_create(tr->optim, (int)(o->step_size > 0 ? o->step_size : 1), o->gamma, &tr->sched));
    else if (!strcmp(o->scheduler, "multistep")) {
        int ms[LK_PARAM_LIST_MAX];
        for (int i = 0; i < o->milestones.n; i++) ms[i] = (int)o->milestones.v[i];
        LK_TRY(lk_multistep_lr_create(tr->optim, ms, o->milestones.n, o->gamma, &tr->sched));
    } else if (!strcmp(o->scheduler, "exponential"))
        LK_TRY(lk_exponential_lr_create(tr->optim, o->gamma, &tr->sched));
    else if (!strcmp(o->scheduler, "cosine")) /* after a warm-up: over the steps left */
        LK_TRY(lk_cosine_annealing_lr_create(tr->optim,
                                             (int)(o->step_size > 0 ? o->step_size
                                                                    : (horizon - o->warmup_steps > 1 ? horizon - o->warmup_steps : 1)),
                                             o->eta_min, &tr->sched));
    else if (!strcmp(o->scheduler, "linear"))
        LK_TRY(lk_linear_lr_create(tr->optim, o->start_factor, o->end_factor,
                                   (int)(o->step_size > 0 ? o->step_size : horizon), &tr->sched));
    else if (!strcmp(o->scheduler, "onecycle")) {
        /* torch's OneCycleLR: total_steps, else epochs x steps_per_epoch; lockstep's default: the run */
        int64_t total = o->total_steps > 0 ? o->total_steps
                        : o->epochs > 0 && o->steps_per_epoch > 0 ? o->epochs * o->steps_per_epoch
                                                                   : horizon;
        if (total > 2147483647)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "OneCycleLR: %lld total steps is too many", (long long)total);
        lk_one_cycle_config c = {.max_lr = o->max_lr > 0 ? o->max_lr : 10 * oc.lr, .total_steps = (int)total,
                                 .pct_start = o->pct_start, .anneal_linear = !strcmp(o->anneal_strategy, "linear"),
                                 .cycle_momentum = o->cycle_momentum, .base_momentum = o->base_momentum,
                                 .max_momentum = o->max_momentum, .div_factor = o->div_factor,
                                 .final_div_factor = o->final_div_factor, .three_phase = o->three_phase};
        LK_TRY(lk_one_cycle_lr_create(tr->optim, &c, &tr->sched));
    } else if (!strcmp(o->scheduler, "plateau")) {
        lk_plateau_config c = {.factor = o->factor, .patience = (int)o->patience, .threshold = o->threshold,
                               .mode_max = !strcmp(o->mode, "max"), .threshold_abs = !strcmp(o->threshold_mode, "abs"),
                               .cooldown = (int)o->cooldown, .min_lr = o->min_lr,
                               .eps = o->plateau_eps > 0 ? o->plateau_eps : 1e-8};
        LK_TRY(lk_reduce_lr_on_plateau_create(tr->optim, &c, &tr->sched));
    }
    if (o->warmup_steps > 0) LK_TRY(add_warmup(tr));
    return LK_STATUS_OK;
}
