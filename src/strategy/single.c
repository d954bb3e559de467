/* The `single` strategy: one process, one replica, nothing to reduce. Its
 * step is the shared local step (strategy.c) with no hooks: forward,
 * backward, and the gradients are the batch's as they are. The flat
 * gradient buffer is private aligned memory. On a device that can capture
 * graphs the step is also where the step's work is deferred and replayed
 * as graphs (backend/replay.c; LK_GRAPHS=0 turns it off): the step opens
 * here and ends after the optimizer step and zero_grad
 * (lk_strategy_optimizer_step), or here for a micro-batch that does not
 * step. ddp and dp do not opt in: ddp's shm staging reads through the
 * host and dp runs its replicas on threads. */
#include "backend/replay.h"
#include "strategy/strategy_impl.h"

static lk_status single_step(lk_strategy *s, const lk_step_args *a, lk_step_result *r) {
    LK_TRY(lk__replay_step_begin(s->cfg.device));
    lk_status st = lk__strategy_local_step(s, a, r);
    if (st || !a->sync) { /* no optimizer step follows to end it */
        lk_status end = lk__replay_step_end();
        if (!st) st = end;
    }
    return st;
}

/* The fit is over (or failed mid-step): nothing stays deferred. */
static void single_detach(lk_strategy *s) {
    (void)s;
    (void)lk__replay_step_end();
    lk__replay_stats r = lk__replay_get_stats(); /* since the process started */
    if (r.steps)
        lk_log_debug("graphs: %lld steps deferred %lld items: %lld graphs captured, %lld launched, %lld segments "
                     "issued eagerly (%lld items; %lld of those segments differ from an earlier one only in per-step values), "
                     "%lld captures refused",
                     (long long)r.steps, (long long)r.deferred, (long long)r.captures, (long long)r.launches,
                     (long long)r.segments_eager, (long long)r.eager_items, (long long)r.mismatches,
                     (long long)r.capture_failures);
}

const lk_strategy_vt lk__strategy_single = {
    .name = "single",
    .training_step = single_step,
    .detach = single_detach,
};
