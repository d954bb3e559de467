/* Private to src/comm and its tests: the NCCL unique-id bootstrap, written
 * over a byte-broadcast transport so it is tested without a GPU or NCCL
 * (a fake transport in tests/gpu/test_nccl_bootstrap.c; the nccl backend
 * passes its host communicator, shm or mpi). */
#ifndef LK_COMM_NCCL_BOOT_H
#define LK_COMM_NCCL_BOOT_H

#include <stddef.h>

#include "lockstep/core.h"

#define LK__NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct lk__nccl_transport {
    void *ctx;
    /* Every rank calls it with the same `bytes`; afterwards every rank's
     * buf holds root's bytes. Bounded by the transport's own timeout. */
    lk_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root);
} lk__nccl_transport;

/* Makes an id on rank 0 (ncclGetUniqueId in the real backend). */
typedef lk_status (*lk__nccl_id_fn)(void *ctx, unsigned char id[LK__NCCL_ID_BYTES]);

/* Rank 0 calls make_id and broadcasts the id with a header (magic, its
 * status and message); every other rank receives it into `id`. When rank 0
 * cannot make an id it still broadcasts, so the others fail at once with
 * REMOTE quoting rank 0's message instead of waiting out a timeout; bytes
 * that are not a bootstrap record (a peer on another backend or version)
 * are INVALID_USAGE; a failed broadcast is returned with the rank named. */
lk_status lk__nccl_bootstrap(const lk__nccl_transport *t, int rank, lk__nccl_id_fn make_id, void *id_ctx,
                             unsigned char id[LK__NCCL_ID_BYTES]);

#endif
