/* lk_trainer_fit and its loop: the parameters and the optimizer set up,
 * resume, the epochs of strategy steps with gradient accumulation,
 * clipping, the optimizer and scheduler, validation inside the epoch,
 * checkpoints, early stopping and the agreed stop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/config.h"
#include "lockstep/models.h"
#include "backend/backend_impl.h"
#include "optim/optim_impl.h"
#include "device/gpu.h"
#include "train/prefetch.h"
#include "tensor/tensor_impl.h"
#include "train/train_impl.h"

static bool is_rank0(const lk_trainer *tr) { return tr->rank == 0; }

/* trainer.sync_batchnorm: every BatchNorm layer computes its training
 * statistics over the ranks that see different data, the strategy's
 * data-parallel group (lk_strategy_dp_comm: the world for ddp, a stage's
 * peers for a pipeline), one all-reduce per layer each way
 * (lk_comm_bn_reducer, lk_layer_sync_batchnorm_reducer). Lightning converts the model to
 * SyncBatchNorm under every strategy: with one process that computes what
 * BatchNorm does, so here a group of one is said and left as it is; dp's
 * replicas are threads of one process that lockstep cannot sync (Lightning
 * 1.x's dp ran them unsynced): refused rather than silently per replica.
 * A model without BatchNorm is a warning, as Lightning's (not a failure). */
static lk_status setup_sync_batchnorm(lk_trainer *tr, lk_module *m) {
    int dp = lk_strategy_dp_size(tr->strat);
    const char *name = lk_strategy_name(tr->strat);
    if (!strcmp(name, "dp"))
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "trainer.sync_batchnorm with strategy dp: dp's replicas are threads of one process fed "
                        "slices of one batch, and their batch norm statistics cannot be synchronised; use strategy "
                        "ddp (one process per device), or set trainer.sync_batchnorm to false");
    lk_bn_reducer r;
    lk_comm_bn_reducer(dp > 1 ? lk_strategy_dp_comm(tr->strat) : NULL, &r);
    int k = lk_layer_sync_batchnorm_reducer(m->net, &r);
    if (k == 0)
        lk_warn0("trainer.sync_batchnorm: the model has no BatchNorm layer, nothing to synchronise (it trains as "
                 "without sync_batchnorm)");
    else if (dp == 1)
        lk_warn0("trainer.sync_batchnorm: strategy %s has one data-parallel process, whose batch norm statistics "
                 "are already those of the whole batch: nothing to synchronise", name);
    else
        lk_log0("sync_batchnorm: %d batch norm layer%s compute statistics over all %d ranks", k, k == 1 ? "" : "s", dp);
    return LK_STATUS_OK;
}

/* A pipeline split by measured time profiles its blocks on the first
 * training batch (as the model brings it to its first block); the loader
 * restarts at the first epoch afterwards, so the data order is the same. */
static lk_status profile_blocks(lk_trainer *tr, lk_loader *train) {
    const lk_batch *b = NULL;
    lk_status st = lk_loader_start(train, 0, 0);
    if (!st) st = lk_loader_next(train, &b);
    if (!st && !b) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.pipeline.split time: no training batch to profile");
    lk_scope_begin();
    lk_tensor *x = st ? NULL : lk_model_blocks_input(tr->module->net, lk_batch_tensor(b, 0));
    if (!st && !x) st = lk_last_status();
    /* a collective: every rank takes part, a failed one with no input */
    lk_tensor *none = x ? NULL : lk_tensor_empty(LK_F32, 0, NULL);
    lk_status ps = x || none ? lk_strategy_profile_blocks(tr->strat, x ? x : none) : LK_STATUS_OUT_OF_MEMORY;
    lk_tensor_release(none);
    lk_scope_end();
    return st ? st : ps;
}

/* The module wrapped by the strategy, which decides the parameter layout
 * (which parameters this rank holds, in which flat buffers: tr->params is
 * its list), then the optimizer and scheduler over them (optim_factory.c). */
static lk_status setup_params(lk_trainer *tr, int64_t steps_per_epoch, lk_loader *train) {
    if (lk_strategy_wrapped(tr->strat)) /* the strategy holds the module of an earlier fit on this trainer */
        return lk_error(LK_STATUS_INVALID_USAGE, "fit: call lk_trainer_fit once per trainer (create another to fit again)");
    if (lk_strategy_needs_blocks(tr->strat)) { /* model_parallel, pipeline: stages of the model's blocks */
        int nb = 0;
        const lk_named_layer *blocks = NULL;
        if (lk_model_blocks(tr->module->net, &nb, &blocks))
            return lk_error(lk_last_status(), "strategy %s cuts the model into stages of blocks: %s", lk_strategy_name(tr->strat),
                            lk_last_error());
        LK_TRY(lk_strategy_set_blocks(tr->strat, blocks, nb));
        if (lk_strategy_wants_block_profile(tr->strat)) LK_TRY(profile_blocks(tr, train));
    }
    LK_TRY(lk_strategy_wrap(tr->strat, tr->module->net));

    return lk__optim_setup(tr, steps_per_epoch);
}

/* Every rank agrees whether to stop (max_time, a signal), with one tiny
 * all-reduce per step only when something could make ranks disagree.
 * Over the world, not the data-parallel group: every rank runs this loop
 * and its collectives, so a group (a pipeline stage) that stopped alone
 * would leave the others waiting in theirs.
 * `check_time` false leaves max_time to the epoch end (Timer(interval="epoch")). */
static lk_status agree_stop(lk_trainer *tr, bool check_time, bool *stop) {
    int32_t local = 0;
    if (lk__stop_signal()) local = 2;
    else if (check_time && tr->cfg.max_time > 0 && lk_time_now() - tr->t_fit_start >= tr->cfg.max_time) local = 1;
    if (tr->world > 1) LK_TRY(lk_comm_all_reduce(tr->comm, &local, 1, LK_I32, LK_REDUCE_MAX));
    if (local == 2) snprintf(tr->stop_reason, sizeof tr->stop_reason, "stopped by a signal");
    else if (local == 1) snprintf(tr->stop_reason, sizeof tr->stop_reason, "max_time (%gs) reached", tr->cfg.max_time);
    *stop = local != 0;
    return LK_STATUS_OK;
}

/* ---- validation inside fit ------------------------------------------------------ */

/* EarlyStopping decides on epoch metrics, which are reduced over the
 * data-parallel group: the ranks of one group decide alike, but a strategy
 * with several groups (each pipeline stage its own) may see them decide
 * differently, and a group that stopped alone would leave the others
 * waiting in their next collective. Any group's stop stops every rank, as
 * Lightning's reduce_boolean_decision(all=False). With one group (single,
 * ddp, dp) every rank already decided alike: no collective. */
static lk_status agree_early_stop(lk_trainer *tr) {
    if (lk_strategy_dp_size(tr->strat) >= tr->world) return LK_STATUS_OK;
    double v = tr->should_stop ? 1 : 0;
    LK_TRY(lk_strategy_reduce(tr->strat, &v, 1, LK_REDUCE_MAX));
    if (v != 0 && !tr->should_stop) {
        tr->should_stop = true;
        snprintf(tr->stop_reason, sizeof tr->stop_reason, "EarlyStopping: another data-parallel group's monitor stopped the run");
    }
    return LK_STATUS_OK;
}

static lk_status validate_now(lk_trainer *tr, lk_loader *val, int64_t limit) {
    if (!val || limit == 0) return LK_STATUS_OK;
    LK_TRY(lk__run_eval(tr, val, "val", limit, 0, "Validation"));
    tr->val_ran = true;
    LK_TRY(lk__metrics_log_epoch(tr, "val"));
    if (tr->sched && !strcmp(tr->opt.scheduler, "plateau")) {
        double v;
        if (!lk_trainer_metric(tr, tr->opt.monitor, &v))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lr_scheduler plateau: monitor '%s' was never logged",
                            tr->opt.monitor);
        LK_TRY(lk_scheduler_step_metric(tr->sched, v));
    }
    for (int j = 0; j < tr->nes; j++) LK_TRY(lk__early_stopping_check(tr, &tr->es[j]));
    if (tr->nes) LK_TRY(agree_early_stop(tr));
    return LK_STATUS_OK;
}

/* ---- fit ------------------------------------------------------------------------- */

/* A checkpoint written inside the epoch, after `done` of its batches: it
 * resumes at the next one, with the validation due after batch done - 1
 * when `val_due` (it has not run yet). */
static lk_status ckpt_inside_epoch(lk_trainer *tr, int64_t done, bool val_due, lk_status (*write)(lk_trainer *)) {
    int64_t saved = tr->resume_batch;
    tr->resume_batch = done;
    tr->val_pending = val_due;
    lk_status st = write(tr);
    tr->resume_batch = saved;
    tr->val_pending = false;
    return st;
}

static lk_status fit_loop(lk_trainer *tr, lk_loader *train, lk_loader *val, int64_t n_train, int64_t n_val) {
    lk_module *m = tr->module;
    const lk_trainer_config *c = &tr->cfg;
    int64_t accum = tr->accum;
    int64_t val_every = c->val_check_interval.is_count ? (int64_t)c->val_check_interval.value
                                                       : (int64_t)floor(c->val_check_interval.value * (double)n_train);
    if (val_every < 1) val_every = 1;
    lk_layer_train(m->net, true);
    tr->stage = "train";
    bool stop = false;
    bool epoch_timer = !strcmp(c->time_check_interval, "epoch"); /* Timer(interval="epoch") */
    for (; !stop && !tr->should_stop && (c->max_epochs < 0 || tr->epoch < c->max_epochs); tr->epoch++) {
        if (!tr->epoch_restored) { /* a resumed epoch's sums so far came with its checkpoint */
            lk__metrics_reset_epoch(tr, "train");
            LK_TRY(lk__log_lr_epoch(tr));
        }
        tr->epoch_restored = false;
        LK_TRY(lk_loader_start(train, (uint64_t)tr->epoch, tr->resume_batch));
        if (tr->pf) LK_TRY(lk__prefetch_begin(tr->pf, train, n_train - tr->resume_batch));
        if (tr->progress) lk_progress_begin_epoch(tr->progress, tr->epoch, c->max_epochs, n_train);
        /* check_val_every_n_epoch null (0): Lightning counts val_check_interval
         * in training batches across epochs (its total_batch_idx), every
         * epoch being n_train batches long */
        bool by_total = c->check_val_every_n_epoch == 0;
        bool validate_epoch = by_total || ((tr->epoch + 1) % c->check_val_every_n_epoch) == 0;
        bool int_interval = c->val_check_interval.is_count;
        int64_t first_idx = by_total ? tr->epoch * n_train : 0; /* the counter at the epoch's batch 0 */
        if (tr->val_pending) { /* the validation due after the batch the checkpoint was written at */
            tr->val_pending = false;
            LK_TRY(validate_now(tr, val, n_val));
            LK_TRY(ckpt_inside_epoch(tr, tr->resume_batch, false, lk__ckpt_callback));
            tr->stage = "train";
        }
        /* Stopped (a signal, max_time, max_steps) with batches of the epoch
         * done: its end (row, validation, scheduler, epoch checkpoint) is
         * left to the resume, and last.ckpt resumes at the next batch. Only
         * max_steps on the epoch's last batch ends the epoch here: that is
         * where training ends. */
        bool defer_end = false;
        for (int64_t i = tr->resume_batch; i < n_train; i++) {
            double t0 = lk_time_now();
            const lk_batch *b;
            LK_TRY(tr->pf ? lk__prefetch_next(tr->pf, &b) : lk_loader_next(train, &b));
            if (!b) break;
            double t1 = lk_time_now();
            tr->batch_idx = i;
            tr->cur_batch_size = b->size;
            bool sync = ((i + 1) % accum == 0) || i + 1 == n_train;
            tr->step_t0 = t0, tr->step_t1 = t1;
            lk_step_args sa = {.batch = b, .batch_idx = i, .sync = sync, .loss_mul = 1.0f / (float)accum,
                               .loss_scale = lk_grad_scaler_scale(tr->scaler), .autocast = tr->autocast};
            lk_step_result sr;
            size_t live0 = lk_pool_reset_peak();
            lk_status step_st = lk_strategy_training_step(tr->strat, &sa, &sr);
            lk__host_shadow_clear(); /* the batch's host memory may be refilled from here on */
            LK_TRY(step_st);
            bool skip = false;
            if (!sync) LK_TRY(lk__step_checks(tr, false, &sr.loss, &skip)); /* the loss alone: no gradient is final */
            if (tr->global_step >= 1) { /* the first step also makes the optimizer's state and caches */
                size_t peak = lk_pool_get_stats().bytes_live_peak - live0;
                if (peak > tr->step_peak_bytes) tr->step_peak_bytes = peak;
            }
            if (sync) tr->sum_comm_wait += lk_strategy_get_stats(tr->strat).comm_straggler_last_s;
            tr->sum_data += t1 - t0;
            tr->sum_fwd += sr.t_fwd;
            tr->sum_bwd += sr.t_bwd;
            tr->sum_comm += sr.t_comm;
            tr->samples_seen += b->size;
            if (sync) {
                double t5 = lk_time_now();
                lk__optimizer_prewake(tr->optim);
                LK_TRY(lk__fault_grad_overflow(tr)); /* LK_TEST_GRAD_OVERFLOW */
                /* the step's one read: the loss with the gradients' checks */
                LK_TRY(lk__step_checks(tr, true, &sr.loss, &skip));
                if (!skip) lk__clip_gradients(tr);
                /* the step unless skipped, then the strategy's part (shard sync, dp's copy out) and zero_grad */
                LK_TRY(lk_strategy_optimizer_step(tr->strat, tr->optim, skip));
                if (tr->scaler) LK_TRY(lk_grad_scaler_update(tr->scaler, skip));
                { /* the shards' sync is communication: booked there, not as optimizer time */
                    lk_strategy_stats ss = lk_strategy_get_stats(tr->strat);
                    tr->sum_comm += ss.step_sync_last_s;
                    tr->sum_comm_wait += ss.step_straggler_last_s;
                    t5 += ss.step_sync_last_s;
                }
                if (tr->sched && !strcmp(tr->opt.interval, "step") && strcmp(tr->opt.scheduler, "plateau"))
                    LK_TRY(lk_scheduler_step(tr->sched));
                tr->sum_opt += lk_time_now() - t5;
                lk__prof_optimizer(tr->prof, t5, lk_time_now());
                lk__fault_step_delay(tr); /* LK_TEST_STEP_DELAY_MS: tests that signal a run mid-way need it to last */
                tr->timed_steps++;
                tr->global_step++;
                if (tr->global_step == 1) tr->t_first_step = lk_time_now();
                /* Throughput counts from the 5th step on: the first ones warm
                 * caches, the storage pool and the BLAS threads. */
                if (tr->global_step == 5) {
                    tr->t_steady = lk_time_now();
                    tr->samples_steady = tr->samples_seen;
                    tr->sum_at_steady[0] = tr->sum_data, tr->sum_at_steady[1] = tr->sum_fwd;
                    tr->sum_at_steady[2] = tr->sum_bwd, tr->sum_at_steady[3] = tr->sum_comm;
                    tr->sum_at_steady[4] = tr->sum_opt, tr->sum_at_steady[5] = tr->sum_comm_wait;
                }
                if (tr->global_step % c->log_every_n_steps == 0) {
                    LK_TRY(lk__log_lr(tr));
                    LK_TRY(lk__log_scale(tr));
                    LK_TRY(lk__log_device_stats(tr));
                    if (tr->logger) LK_TRY(lk__metrics_log_step(tr));
                }
                /* Lightning 2.x validates after batch_idx when (batch_idx + 1) %
                 * val_check_batch == 0, val_check_batch being N for an integer and
                 * floor(f x batches) for a fraction f: a fraction's multiple that
                 * is the epoch's last batch validates at the epoch end (below),
                 * and the last batch does not validate otherwise. */
                bool val_due = validate_epoch && (first_idx + i + 1) % val_every == 0 && (int_interval || i + 1 < n_train);
                if (lk__ckpt_due_steps(tr) && i + 1 < n_train)
                    LK_TRY(ckpt_inside_epoch(tr, i + 1, val_due, lk__ckpt_callback_last));
                bool max_steps = c->max_steps >= 0 && tr->global_step >= c->max_steps;
                if (max_steps) {
                    stop = true;
                    snprintf(tr->stop_reason, sizeof tr->stop_reason, "max_steps=%lld reached", (long long)c->max_steps);
                }
                bool agreed;
                LK_TRY(agree_stop(tr, !epoch_timer, &agreed));
                stop = stop || agreed;
                if (stop && (agreed || i + 1 < n_train)) {
                    defer_end = true;
                    LK_TRY(ckpt_inside_epoch(tr, i + 1, val_due, lk__ckpt_callback_stop));
                }
            }
            if (tr->progress) {
                const char *names[16];
                double vals[16];
                int k = lk__metrics_prog_bar(tr, names, vals, 16);
                lk_progress_update(tr->progress, i + 1, names, vals, k);
            }
            if (validate_epoch && (first_idx + i + 1) % val_every == 0 && (int_interval || i + 1 < n_train) && !defer_end) {
                LK_TRY(validate_now(tr, val, n_val));
                LK_TRY(ckpt_inside_epoch(tr, i + 1, false, lk__ckpt_callback));
                tr->stage = "train";
            }
            if (stop || tr->should_stop) break;
        }
        if (defer_end) {
            LK_TRY(lk__prefetch_end(tr->pf));
            tr->resume_batch = 0;
            break; /* (the epoch counter stays: the resume finishes this epoch) */
        }
        LK_TRY(lk__prefetch_end(tr->pf)); /* no copy in flight once the loader restarts */
        tr->resume_batch = 0;
        LK_TRY(lk__metrics_end_epoch(tr, "train"));
        if (tr->logger) LK_TRY(lk__metrics_log_epoch(tr, "train"));
        if (tr->progress) {
            const char *names[16];
            double vals[16];
            int k = lk__metrics_prog_bar(tr, names, vals, 16);
            lk_progress_end_epoch(tr->progress, names, vals, k);
        }
        if (validate_epoch && !c->val_check_interval.is_count && (first_idx + n_train) % val_every == 0)
            LK_TRY(validate_now(tr, val, n_val));
        if (tr->sched && !strcmp(tr->opt.interval, "epoch") && strcmp(tr->opt.scheduler, "plateau"))
            LK_TRY(lk_scheduler_step(tr->sched));
        tr->stage = "train";
        tr->at_epoch_end = true; /* checkpoints written now resume at the next epoch */
        lk_status st = lk__ckpt_callback(tr);
        tr->at_epoch_end = false;
        LK_TRY(st);
        if (epoch_timer && !stop) LK_TRY(agree_stop(tr, true, &stop)); /* the whole epoch ran: now the time */
    }
    return LK_STATUS_OK;
}

/* How many times this job was restarted: torchrun's (and `lockstep launch
 * --max-restarts`') TORCHELASTIC_RESTART_COUNT or SLURM's requeue count. */
static long restart_count(const char **which) {
    static const char *const vars[] = {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"};
    long best = 0;
    *which = vars[0];
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        long x = v && *v ? strtol(v, NULL, 10) : 0;
        if (x > best) best = x, *which = vars[i];
    }
    return best;
}

lk_status lk_trainer_fit(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "fit");
    const lk_trainer_config *c = &tr->cfg;
    tr->t_fit_start = lk_time_now();
    lk_loader *train = NULL, *val = NULL;
    lk__sig_state sigs;
    lk__signals_install(&sigs);
    lk_status st = lk__begin_run(tr, m, dm, "fit");
    lk_dataset *train_ds = st ? NULL : dm->vt->dataset(dm, "train");
    lk_dataset *val_ds = st ? NULL : dm->vt->dataset(dm, "val");
    if (!st && !train_ds) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data module '%s' has no training set", dm->name);
    if (!st && !m->vt->training_step && !(m->vt->forward && m->vt->loss))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no training_step (and no forward and loss to compose one)", m->name);
    if (!st) st = lk__make_loader(tr, train_ds, true, &train);
    if (!st && lk__prefetching(tr)) st = lk__fit_prefetcher(tr);
    bool overfit = c->overfit_batches.value > 0;
    if (!st && (val_ds || overfit)) st = lk__make_loader(tr, overfit ? train_ds : val_ds, false, &val);
    int64_t n_train = 0, n_val = 0;
    if (!st) {
        n_train = lk__limit_batches(c->limit_train_batches, lk_loader_len(train));
        n_val = val ? lk__limit_batches(c->limit_val_batches, lk_loader_len(val)) : 0;
        if (overfit) n_train = n_val = lk__limit_batches(c->overfit_batches, lk_loader_len(train)); /* int or fraction */
        if (c->fast_dev_run) {
            n_train = c->fast_dev_run < n_train ? c->fast_dev_run : n_train;
            n_val = c->fast_dev_run < n_val ? c->fast_dev_run : n_val;
        }
        tr->accum = c->accumulate_grad_batches;
        if (c->global_batch_size > 0) { /* over the ranks that see different data */
            int dp = lk_strategy_dp_size(tr->strat);
            int64_t per = dm->batch_size * dp;
            if (c->global_batch_size % per)
                st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                              "trainer.global_batch_size %lld is not a multiple of batch_size %lld x %d ranks = %lld",
                              (long long)c->global_batch_size, (long long)dm->batch_size, dp, (long long)per);
            else tr->accum = c->global_batch_size / per;
        }
        if (n_train == 0 && !st) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "no training batches (limit_train_batches=%g)", c->limit_train_batches.value);
        /* Lightning's fit loop raises this too: such an interval never comes
         * within an epoch. Not with validation off (no validation batches:
         * limit_val_batches 0 or no val set), where no interval matters and
         * the message's own advice would not help. */
        if (!st && n_val > 0 && c->val_check_interval.is_count && c->check_val_every_n_epoch > 0 &&
            !c->fast_dev_run && (int64_t)c->val_check_interval.value > n_train)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "trainer.val_check_interval (%lld) must be less than or equal to the number of training "
                          "batches per epoch (%lld): set trainer.check_val_every_n_epoch to null to validate every "
                          "%lld batches across epochs, or trainer.limit_val_batches to 0 to turn validation off",
                          (long long)c->val_check_interval.value, (long long)n_train,
                          (long long)c->val_check_interval.value);
    }
    if (!st) st = setup_params(tr, n_train / (tr->accum ? tr->accum : 1) + 1, train);
    if (!st) st = lk__prof_create(tr);
    if (!st && c->sync_batchnorm) st = setup_sync_batchnorm(tr, m);
    if (!st) {
        int k = 0;
        st = lk__activation_checkpointing(c, m->net, &k);
        if (!st && k) lk_log0("activation_checkpointing: %d layer%s recomputed in the backward", k, k == 1 ? "" : "s");
    }
    if (!st) {
        lk_step_fn fn = lk__step_fn(tr);
        st = lk_strategy_attach(tr->strat, &fn);
    }
    if (!st && is_rank0(tr)) { /* temporaries of writers killed before their rename (a full-size last.ckpt.tmp.<pid>) */
        char root[LK_PATH + 32];
        snprintf(root, sizeof root, "%s/lightning_logs", c->default_root_dir[0] ? c->default_root_dir : ".");
        int removed = lk__out_remove_stale_tmp(root);
        if (removed) lk_log0("removed %d stale temporary file%s of dead writers under %s", removed, removed > 1 ? "s" : "", root);
    }
    const char *restart_var = NULL;
    long restarts = restart_count(&restart_var);
    if (!st && (!ckpt_path || !*ckpt_path) && restarts > 0) {
        /* A restarted job (launch --max-restarts, a requeued SLURM job)
         * resumes from its last checkpoint by itself, as Lightning's
         * auto-requeue does; with none written yet it starts over. */
        char path[LK_PATH];
        if (lk__ckpt_resolve(tr, "last", path, sizeof path) == LK_STATUS_OK) ckpt_path = "last";
        else lk_clear_error();
        lk_log0("%s=%ld: %s", restart_var, restarts,
                ckpt_path ? "a restarted job: resuming from the last checkpoint"
                          : "a restarted job, but no last.ckpt was written yet: training from the start");
    }
    if (!st && ckpt_path && *ckpt_path) {
        char path[LK_PATH];
        st = lk__ckpt_resolve(tr, ckpt_path, path, sizeof path);
        if (!st) st = lk__ckpt_load(tr, path, true);
        if (!st) lk_log0("resumed from %s at epoch %lld, step %lld, batch %lld", path, (long long)tr->epoch,
                         (long long)tr->global_step, (long long)tr->resume_batch);
    }
    if (!st) st = lk__open_outputs(tr, true);
    if (!st && tr->progress) { /* token models (i64/i32 [T] samples): tokens/s beside it/s */
        const lk_field *x = lk_dataset_field(train_ds, 0);
        if (x && x->ndim == 1 && (x->dtype == LK_I64 || x->dtype == LK_I32))
            lk_progress_set_tokens(tr->progress, (double)x->shape[0] * (double)dm->batch_size *
                                                     (double)lk_strategy_dp_size(tr->strat));
    }
    if (!st) lk__ckpt_adopt(tr); /* the resumed top-k, now that the checkpoint directory is known */
    if (!st && is_rank0(tr)) {
        lk_log0("lockstep %s: fit %s on %d process%s (%s), %lld parameters, %lld train / %lld val batches per epoch%s",
                LK_VERSION_STRING, m->name, tr->world, tr->world > 1 ? "es" : "",
                lk_strategy_summary(tr->strat),
                (long long)lk_layer_num_parameters(m->net), (long long)n_train, (long long)n_val,
                tr->accum > 1 ? " (accumulating gradients)" : "");
        if (tr->log_dir[0]) lk_log0("logs: %s", tr->log_dir);
        if (tr->autocast != LK_F32) {
            /* said once: a precision whose GEMMs cannot run natively here
             * (no instructions for it, or none that oneDNN uses) still
             * trains correctly, but through f32 and so not faster */
            const char *dt = lk_dtype_name(tr->autocast), *path = lk__train_gemm_path(tr);
            if (tr->dev.kind == LK_CUDA)
                lk_log0("precision %s: matrix products in %s on the GPU (%s)", c->precision, dt, path);
            else if (lk__cpu_gemm_native(tr->autocast))
                lk_log0("precision %s: matrix products in %s on this CPU's own units (%s)", c->precision, dt, path);
            else
                lk_log0("precision %s: no %s matrix product runs natively here; they run through %s (correct, "
                        "not faster than 32-true)",
                        c->precision, dt, path);
        }
        lk__cuda_props gp;
        if (tr->dev.kind == LK_CUDA && tr->autocast == LK_F32 && tr->param_dtype == LK_F32 &&
            !lk__f32_matmul_reduced() && !lk__cuda_props_get(tr->dev.index, &gp) && gp.major >= 8)
            /* as Lightning's hint on a GPU with tensor cores */
            lk_log0("%s has TF32 tensor cores: trainer.float32_matmul_precision high lets 32-true's matrix products "
                    "use them (faster, with a 10-bit mantissa), as torch.set_float32_matmul_precision('high') does",
                    gp.name);
        if (c->enable_model_summary && c->model_summary_max_depth != 0) {
            char *table = NULL;
            if (lk_model_summary(m->net, (int)c->model_summary_max_depth, &table) == LK_STATUS_OK) {
                printf("\n%s\n", table);
                fflush(stdout);
            } else {
                lk_log_warn("model summary: %s", lk_last_error()); /* a table is not worth failing the fit */
            }
            lk_free(table);
        }
    }
    /* Sanity check: a few validation batches before training (not logged). */
    if (!st && val && c->num_sanity_val_steps != 0 && !ckpt_path && !c->fast_dev_run) {
        int64_t k = c->num_sanity_val_steps < 0 ? n_val : (c->num_sanity_val_steps < n_val ? c->num_sanity_val_steps : n_val);
        if (k > 0) st = lk__run_eval(tr, val, "val", k, 0, "Sanity Checking");
        for (int i = 0; i < tr->nmetrics; i++)
            if (tr->metrics[i].stage && !strcmp(tr->metrics[i].stage, "val")) tr->metrics[i].has_value = false, tr->metrics[i].epoch_any = false;
    }
    double t_train = lk_time_now();
    /* fast_dev_run: N batches of one epoch, as Lightning's (max_epochs=1) */
    if (c->fast_dev_run) tr->cfg.max_epochs = 1;
    if (!st) st = fit_loop(tr, train, val, n_train, n_val);
    /* The model leaves fit whole on every rank (a pipeline's stages updated
     * only their own blocks), as the caller built it. One built stage-only
     * (deferred) stays in stages: the whole of it need not fit one
     * process. Evaluation after fit runs through the stages, or makes it
     * whole itself when it must (eval.c). */
    if (!st && !tr->stage_only) st = lk_strategy_sync_model(tr->strat);
    if (st && c->on_exception_ckpt[0] && lk_strategy_wrapped(tr->strat) && lk_strategy_writes_checkpoint(tr->strat) &&
        lk_strategy_state_dict_collective(tr->strat))
        /* its gather needs every rank, and the others may be gone: waiting for them would hang the failure */
        lk_log_warn("OnExceptionCheckpoint: not written: strategy %s gathers the state dict from every rank, which "
                    "cannot be waited for after a failure", lk_strategy_name(tr->strat));
    else if (st && c->on_exception_ckpt[0] && lk_strategy_wrapped(tr->strat) && lk_strategy_writes_checkpoint(tr->strat)) {
        /* OnExceptionCheckpoint: the state as it was when fit failed (rank 0
         * alone: the other ranks may be gone, so no barrier). */
        char msg[2048], dir[LK_PARAM_STR];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        snprintf(dir, sizeof dir, "%s", c->on_exception_ckpt);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        lk_status s2 = slash ? lk_file_mkdirs(dir) : LK_STATUS_OK;
        if (!s2) s2 = lk__ckpt_save(tr, c->on_exception_ckpt);
        if (s2) lk_log_warn("OnExceptionCheckpoint: could not write %s: %s", c->on_exception_ckpt, lk_last_error());
        else lk_log0("OnExceptionCheckpoint: saved %s", c->on_exception_ckpt);
        const char *m = msg; /* lk_error adds the rank prefix again */
        if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
        lk_error(st, "%s", m);
    }
    tr->t_train_end = lk_time_now();
    tr->train_time = tr->t_train_end - t_train;
    if (!st) lk__memory_collect(tr); /* collective: after a fit every rank finished */
    if (!st && tr->stop_reason[0]) lk_log0("%s", tr->stop_reason);
    if (!st && lk__stop_signal()) st = lk_error(LK_STATUS_ABORTED, "stopped by signal %d after writing last.ckpt", lk__stop_signal());
    /* The run's error, before run.json, the logger or cleanup (which may
     * fail on the same full disk) can replace it. */
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    if (!st && is_rank0(tr) && m->vt->on_stage_end) {
        lk_status s2 = m->vt->on_stage_end(m, tr, "fit");
        if (s2) lk_log_warn("on_stage_end: %s", lk_last_error());
    }
    lk__print_profile(tr);
    if (!st) st = lk__prof_finish(tr);
    lk__write_runinfo(tr, "fit", st);
    if (tr->logger) lk_logger_finalize(tr->logger, st ? "failed" : "success");
    lk__prefetch_free(tr->pf); /* before its loader: its copies read the loader's memory */
    tr->pf = NULL;
    lk_loader_free(train);
    lk_loader_free(val);
    if (c->sync_batchnorm && m) lk_layer_sync_batchnorm_reducer(m->net, NULL); /* the module outlives this trainer's comm */
    if (m) lk_layer_checkpoint_clear(m->net); /* and this trainer's activation_checkpointing */
    lk_status saved = st;
    /* Peers still waiting for this rank (it failed alone: a non-finite loss,
     * a bad file) then say why it left rather than suspect a desync. */
    if (saved && tr->comm) lk_comm_set_leave_reason(tr->comm, msg[0] == '[' && strchr(msg, ']') ? strchr(msg, ']') + 2 : msg);
    lk__run_cleanup(tr);
    lk__signals_restore(&sigs);
    if (saved) lk_error(saved, "%s", msg[0] == '[' ? strchr(msg, ']') + 2 : msg);
    return saved;
}
