/* The gradients between the backward pass and the optimizer step, once
 * the strategy has reduced them: clipping by value or by norm (which reads
 * nothing back). Their non-finite check rides on the step's one read
 * (step_checks.c). */
#include <string.h>

#include "train/train_impl.h"

void lk__clip_gradients(lk_trainer *tr) {
    if (tr->cfg.gradient_clip_val <= 0) return;
    if (!strcmp(tr->cfg.gradient_clip_algorithm, "value")) lk_clip_grad_value(tr->params, tr->cfg.gradient_clip_val);
    else lk_strategy_clip_grad_norm(tr->strat, tr->cfg.gradient_clip_val, 2.0); /* the norm over what the strategy shards */
}
