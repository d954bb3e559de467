/* Private to src/optim: what the schedulers need from the optimizer
 * (PyTorch keeps these as extra keys of each param_group). */
#ifndef LK_OPTIM_IMPL_H
#define LK_OPTIM_IMPL_H

#include "lockstep/optim.h"

/* group['initial_lr']: NAN until a scheduler sets it. */
double lk__optimizer_initial_lr(const lk_optimizer *o, int group);
void lk__optimizer_set_initial_lr(lk_optimizer *o, int group, double lr);

#endif
