/* The `single` strategy: one process, one replica, nothing to reduce. Its
 * step is the shared local step (strategy.c) with no hooks: forward,
 * backward, and the gradients are the batch's as they are. The flat
 * gradient buffer is private aligned memory. */
#include "strategy/strategy_impl.h"

const lk_strategy_vt lk__strategy_single = {
    .name = "single",
    .training_step = lk__strategy_local_step,
};
