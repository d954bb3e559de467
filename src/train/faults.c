/* The fault hooks the tests use to drive a run into its failure paths, each
 * from an LK_TEST_* variable read once when the trainer is made: a slow
 * step (LK_TEST_STEP_DELAY_MS: a run that lasts long enough to be
 * signalled), an infinite gradient on one rank (LK_TEST_GRAD_OVERFLOW=
 * RANK:STEP) and a NaN loss on one rank (LK_TEST_LOSS_NAN=RANK:STEP).
 * Unset, each does nothing. */
#include <math.h>
#include <stdio.h>
#include <time.h>

#include "train/train_impl.h"

/* RANK:STEP from `name` into *rank and *step (*rank -1: unset or unreadable). */
static void rank_step(const char *name, int *rank, int64_t *step) {
    const char *v = lk_env_get(name);
    long long s;
    *rank = -1;
    if (v && sscanf(v, "%d:%lld", rank, &s) == 2) *step = s;
    else *rank = -1;
}

void lk__faults_init(lk_trainer *tr) {
    tr->test_step_delay_ms = lk_env_get_long("LK_TEST_STEP_DELAY_MS", 0);
    rank_step("LK_TEST_GRAD_OVERFLOW", &tr->test_overflow_rank, &tr->test_overflow_step);
    rank_step("LK_TEST_LOSS_NAN", &tr->test_nan_rank, &tr->test_nan_step);
}

lk_status lk__fault_grad_overflow(lk_trainer *tr) {
    /* one rank only, after the all-reduce: only the reduced flag skips everywhere */
    if (tr->rank != tr->test_overflow_rank || tr->global_step != tr->test_overflow_step || !tr->params->n ||
        !tr->params->items[0].tensor->grad)
        return LK_STATUS_OK;
    static const float inf = INFINITY; /* written where the gradient lives */
    lk_tensor *g = tr->params->items[0].tensor->grad;
    return lk_device_copy(g->device, g->data, LK_DEVICE_CPU, &inf, sizeof inf);
}

void lk__fault_step_delay(const lk_trainer *tr) {
    if (tr->test_step_delay_ms > 0)
        nanosleep(&(struct timespec){tr->test_step_delay_ms / 1000, (tr->test_step_delay_ms % 1000) * 1000000L}, NULL);
}

double lk__fault_loss(const lk_trainer *tr, double loss) {
    return tr->rank == tr->test_nan_rank && tr->global_step == tr->test_nan_step ? NAN : loss;
}
