/* shm: the per-rank shared heaps behind lk_comm_alloc_shared. Each rank
 * allocates from its own region of the segment (first fit, 256-byte
 * granules); the block list is private to the process. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "comm/shm_impl.h"

/* ------------------------------------------------------------------------
 * Shared heap: each rank allocates from its own region; the block list is
 * private to the process (only the owner allocates there).
 * ---------------------------------------------------------------------- */
lk_status lk__shm_alloc_shared(lk_comm *c, size_t bytes, void **ptr) {
    shm_comm *s = c->impl;
    size_t size = (bytes ? bytes : 1) + 255;
    size &= ~(size_t)255;
    /* the rank's own memory as much as its malloc'd blocks: counted (and
     * capped, trainer.memory_limit_mb) for the rank that allocates it */
    LK_TRY(lk__alloc_charge(size));
    pthread_mutex_lock(&s->heap_mu);
    size_t cap = s->hdr->heap_bytes, at = 0;
    int i = 0;
    for (; i < s->nblk; i++) {
        if (s->blks[i].off - at >= size) break;
        at = s->blks[i].off + s->blks[i].size;
    }
    if (cap - at < size || at > cap) {
        size_t used = 0;
        for (int j = 0; j < s->nblk; j++) used += s->blks[j].size;
        pthread_mutex_unlock(&s->heap_mu);
        lk__alloc_uncharge(size);
        return lk_error(LK_STATUS_OUT_OF_MEMORY,
                        "lk_comm_alloc_shared: %zu bytes do not fit in rank %d's shared heap (%zu of %zu bytes in use); "
                        "raise lk_comm_config.shared_bytes or LK_COMM_SHM_BYTES",
                        bytes, s->rank, used, cap);
    }
    if (s->nblk == s->cap && lk_vec_reserve(s->blks, s->cap, s->nblk + 1, 16)) {
        pthread_mutex_unlock(&s->heap_mu);
        lk__alloc_uncharge(size);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    memmove(s->blks + i + 1, s->blks + i, (size_t)(s->nblk - i) * sizeof *s->blks);
    s->blks[i] = (blk){at, size};
    s->nblk++;
    pthread_mutex_unlock(&s->heap_mu);
    uint8_t *p = heap_of(s, s->rank) + at;
    int rc = s->fd >= 0 ? posix_fallocate(s->fd, (off_t)(p - s->base), (off_t)size) : 0;
    if (rc) {
        lk__shm_free_shared(c, p); /* uncharges it */
        return lk_error(LK_STATUS_OUT_OF_MEMORY,
                        "lk_comm_alloc_shared: cannot reserve %zu bytes in /dev/shm: %s (is /dev/shm too small? "
                        "df -h /dev/shm)",
                        bytes, strerror(rc));
    }
    memset(p, 0, bytes);
    *ptr = p;
    return LK_STATUS_OK;
}

void lk__shm_free_shared(lk_comm *c, void *ptr) {
    shm_comm *s = c->impl;
    size_t off = (size_t)((uint8_t *)ptr - heap_of(s, s->rank));
    pthread_mutex_lock(&s->heap_mu);
    for (int i = 0; i < s->nblk; i++)
        if (s->blks[i].off == off) {
            lk__alloc_uncharge(s->blks[i].size);
            memmove(s->blks + i, s->blks + i + 1, (size_t)(s->nblk - i - 1) * sizeof *s->blks);
            s->nblk--;
            break;
        }
    pthread_mutex_unlock(&s->heap_mu);
}

int64_t lk__shm_shared_offset(lk_comm *c, const void *p) {
    shm_comm *s = c->impl;
    return (int64_t)((const uint8_t *)p - heap_of(s, s->rank));
}

void *lk__shm_shared_at(lk_comm *c, int k, int64_t off) { return heap_of(c->impl, k) + off; }
