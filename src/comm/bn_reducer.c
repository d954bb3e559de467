/* SyncBatchNorm's reducer over a communicator (lk_comm_bn_reducer): the
 * batch norm op lives below the communicators (src/autograd), so it sums
 * its statistics through this function pointer, which the trainer (or a
 * test) makes over the data-parallel group. */
#include "lockstep/autograd.h"
#include "lockstep/dist.h"

static lk_status bn_sum(void *ctx, lk_device dev, double *vals, int n) {
    (void)dev; /* host memory, or the device's when the communicator reads it (device_memory) */
    return n > 0 ? lk_comm_all_reduce(ctx, vals, (size_t)n, LK_F64, LK_REDUCE_SUM) : LK_STATUS_OK;
}

void lk_comm_bn_reducer(lk_comm *c, lk_bn_reducer *out) {
    *out = (lk_bn_reducer){c ? bn_sum : NULL, c, lk_comm_reads_device(c)};
}
