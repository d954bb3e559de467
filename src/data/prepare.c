/* Preparing data once per node: local rank 0 runs the (download, unpack)
 * step while the others wait in the communicator's status reduction, which
 * doubles as the barrier and tells every rank whether it worked, so no rank
 * starts reading a half-written file or waits forever for one that never
 * comes. Also the download stub for builds without libcurl. */
#include "data/data_internal.h"

#include <string.h>

lk_status lk_data_prepare(int local_rank, lk_prepare_fn prepare, void *ctx, lk_status_reduce_fn reduce,
                          void *reduce_ctx) {
    if (local_rank < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "data prepare: local rank %d, expected >= 0", local_rank);
    lk_status mine = LK_STATUS_OK;
    if (local_rank == 0 && prepare) mine = prepare(ctx);
    if (!reduce) return mine;
    /* Keep rank 0's own message: the reduction may overwrite the error. */
    char msg[1024] = "";
    if (mine) snprintf(msg, sizeof msg, "%s", lk_last_error());
    int all = (int)mine;
    lk_status st = reduce(reduce_ctx, &all);
    if (st) return st; /* the collective itself failed and said why */
    if (mine) return lk_error(mine, "%s", msg[0] == '[' && strstr(msg, "] ") ? strstr(msg, "] ") + 2 : msg);
    if (all)
        return lk_error(LK_STATUS_REMOTE, "data prepare failed on another rank (%s); see its log for the reason",
                        lk_status_str((lk_status)all));
    return LK_STATUS_OK;
}

#ifndef LK_HAVE_CURL
lk_status lk_data_download(const char *url, const char *dest, long timeout_s) {
    (void)timeout_s;
    return lk_error(LK_STATUS_UNSUPPORTED,
                    "cannot download %s to %s: lockstep was built without libcurl (install libcurl4-openssl-dev and "
                    "rebuild, or place the file there yourself)",
                    url, dest);
}
#endif
