/* The evaluation loops: one pass of validation_step or test_step over a
 * loader (also fit's validation and sanity check), and the validate and
 * test commands. */
#include <stdio.h>
#include <string.h>

#include "train/prefetch.h"
#include "train/train_impl.h"

static bool is_rank0(const lk_trainer *tr) { return tr->rank == 0; }

/* A pipeline's test and predict run through its stages, forwards only, as
 * its validation inside fit does: the strategy cut into stages and wrapped
 * here when no fit on this trainer did (a collective, as fit's), and its
 * step callbacks attached for the run (run_cleanup detaches them, as after
 * a fit). Other strategies, and modules whose steps may run their net
 * directly, are left as they are: their whole model runs on every rank. */
lk_status lk__eval_pipeline_setup(lk_trainer *tr) {
    if (!lk_strategy_needs_blocks(tr->strat)) return LK_STATUS_OK;
    if (!lk__module_forward_only_via_module(tr->module)) { /* whole on every rank: a deferred model too */
        tr->stage_only = false;
        return lk_layer_materialize(tr->module->net);
    }
    if (!lk_strategy_wrapped(tr->strat)) {
        int nb = 0;
        const lk_named_layer *blocks = NULL;
        if (lk_model_blocks(tr->module->net, &nb, &blocks))
            return lk_error(lk_last_status(), "strategy %s cuts the model into stages of blocks: %s",
                            lk_strategy_name(tr->strat), lk_last_error());
        LK_TRY(lk_strategy_set_blocks(tr->strat, blocks, nb));
        /* (trainer.pipeline.split time: no training batch to profile here; wrap says so and
         * balances by parameter count, which changes no output, only the cut) */
        LK_TRY(lk_strategy_wrap(tr->strat, tr->module->net));
    }
    if (lk_strategy_evals_forward(tr->strat)) return LK_STATUS_OK;
    lk_step_fn fn = lk__step_fn(tr);
    return lk_strategy_attach(tr->strat, &fn);
}

lk_status lk__run_eval(lk_trainer *tr, lk_loader *loader, const char *stage, int64_t limit, uint64_t epoch,
                          const char *title) {
    lk_module *m = tr->module;
    /* A pipeline inside fit runs the batches through its stages, forwards
     * only, and the module's step takes the output from there; otherwise
     * (a module whose steps may run its net directly, or no fit) its stages
     * updated only their own blocks: the whole model runs here, refreshed. */
    bool piped = lk_strategy_evals_forward(tr->strat) && lk__module_forward_only_via_module(m);
    if (!piped) LK_TRY(lk_strategy_sync_model(tr->strat));
    const char *saved_stage = tr->stage;
    tr->stage = stage;
    lk__metrics_reset_epoch(tr, stage);
    int64_t n = lk_loader_len(loader);
    if (limit >= 0 && limit < n) n = limit;
    /* Every rank runs the same number of batches (uneven shards: the
     * metric reduction weighs each batch by its size): the most over the
     * world, a bound for every data-parallel group, so that ranks of
     * different groups (pipeline stages, which pass batches between them)
     * run the same loop too. */
    int64_t n_all = n;
    if (tr->world > 1) {
        double v = (double)n;
        LK_TRY(lk_strategy_reduce(tr->strat, &v, 1, LK_REDUCE_MAX));
        n_all = (int64_t)v;
    }
    lk_layer_train(m->net, false);
    bool prev = lk_set_grad_enabled(false);
    lk_status st = lk_loader_start(loader, epoch, 0);
    lk__prefetch *pf = NULL;
    if (!st) st = lk__eval_prefetcher(tr, &pf);
    if (!st && pf) st = lk__prefetch_begin(pf, loader, n);
    if (tr->progress) lk_progress_begin_eval(tr->progress, title, n);
    for (int64_t i = 0; i < n_all && !st; i++) {
        const lk_batch *b = NULL;
        if (i < n) {
            st = pf ? lk__prefetch_next(pf, &b) : lk_loader_next(loader, &b);
            if (st) break;
        }
        if (!b) continue;
        tr->cur_batch_size = b->size;
        tr->batch_idx = i;
        lk_scope_begin();
        lk_autocast_enter(tr->autocast); /* evaluation runs in the precision it trains in, as Lightning's */
        lk_tensor *out = NULL; /* the stages' output, which the step's lk_module_forward answers */
        /* test: each batch whole through the stages, so its metrics are single's bits */
        if (piped) st = lk_strategy_eval_forward(tr->strat, b, strcmp(stage, "val") != 0, &out);
        lk__module_forward_replay(out);
        if (!st && !strcmp(stage, "test")) st = lk_module_test_step(m, b, i, tr);
        else if (!st) st = lk_module_validation_step(m, b, i, tr);
        lk__module_forward_replay(NULL);
        lk_tensor_release(out);
        lk_autocast_exit();
        lk_scope_end();
        if (tr->progress) lk_progress_update_eval(tr->progress, i + 1);
    }
    lk_status end = lk__prefetch_end(pf); /* no copy in flight when the loader restarts or goes */
    if (!st) st = end;
    lk_set_grad_enabled(prev);
    lk_layer_train(m->net, true);
    if (!st) st = lk__metrics_end_epoch(tr, stage);
    if (!st && tr->progress) {
        const char *names[32];
        double vals[32];
        int k = 0;
        for (int i = 0; i < tr->nmetrics && k < 32; i++)
            if (tr->metrics[i].stage == stage && tr->metrics[i].has_value && tr->metrics[i].on_epoch) {
                names[k] = tr->metrics[i].name;
                vals[k++] = tr->metrics[i].value;
            }
        lk_progress_end_eval(tr->progress, names, vals, k);
    }
    tr->stage = saved_stage;
    return st;
}

/* validate / test share one shape. */
static lk_status eval_command(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path,
                              const char *command, const char *stage, const char *split, lk_count_or_fraction limit_frac,
                              const char *title) {
    lk_loader *loader = NULL;
    tr->t_fit_start = lk_time_now();
    lk_status st = lk__begin_run(tr, m, dm, !strcmp(command, "validate") ? "validate" : "test");
    lk_dataset *ds = st ? NULL : dm->vt->dataset(dm, split);
    if (!st && !ds) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data module '%s' has no %s set", dm->name, split);
    if (!st) st = lk__eval_pipeline_setup(tr); /* before the checkpoint: the stages read it whole, as fit's */
    if (!st && ckpt_path && *ckpt_path) {
        char path[LK_PATH];
        st = lk__ckpt_resolve(tr, ckpt_path, path, sizeof path);
        if (!st) st = lk__ckpt_load(tr, path, false);
        if (!st) snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s", path); /* the checkpoint evaluated */
    }
    if (!st) st = lk__make_loader(tr, ds, false, &loader);
    if (!st && !tr->log_dir[0]) st = lk__open_outputs(tr, true);
    else if (!st && is_rank0(tr) && !tr->progress && tr->cfg.enable_progress_bar) {
        lk_progress_options po = lk_progress_options_default();
        st = lk_progress_create(&po, &tr->progress);
    }
    if (!st) {
        int64_t n = lk__limit_batches(limit_frac, lk_loader_len(loader));
        if (tr->cfg.fast_dev_run && tr->cfg.fast_dev_run < n) n = tr->cfg.fast_dev_run;
        st = lk__run_eval(tr, loader, stage, n, 0, title);
    }
    if (!st) st = lk__metrics_log_epoch(tr, stage);
    if (!st && is_rank0(tr)) {
        printf("\n%-24s %s\n", !strcmp(stage, "test") ? "Test metric" : "Validate metric", "DataLoader 0");
        for (int i = 0; i < tr->nmetrics; i++)
            if (tr->metrics[i].stage && !strcmp(tr->metrics[i].stage, stage) && tr->metrics[i].has_value)
                printf("%-24s %.6g\n", tr->metrics[i].name, tr->metrics[i].value);
        fflush(stdout);
    }
    if (!st && m->vt->on_stage_end && is_rank0(tr)) {
        lk_status s2 = m->vt->on_stage_end(m, tr, stage);
        if (s2) lk_log_warn("on_stage_end: %s", lk_last_error());
    }
    lk__write_runinfo(tr, command, st);
    if (tr->logger) lk_logger_flush(tr->logger);
    lk_loader_free(loader);
    lk__run_end_on_device(tr);
    return st;
}

lk_status lk_trainer_validate(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "validate");
    return eval_command(tr, m, dm, ckpt_path, "validate", "val", "val", tr->cfg.limit_val_batches, "Validation");
}

lk_status lk_trainer_test(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "test");
    return eval_command(tr, m, dm, ckpt_path, "test", "test", "test", tr->cfg.limit_test_batches, "Testing");
}
