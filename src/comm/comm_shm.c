/* The shm communicator: the processes of one node share one POSIX shared
 * memory segment per job. Local rank 0 creates it, the others attach with
 * retries until comm_timeout, and it is unlinked the moment every rank has
 * attached (so nothing can leak after that, whatever kills whom).
 *
 * This file is the vtable: init reads the tunables and runs the rendezvous
 * (shm_rdv.c), destroy leaves the group, abort and long work publish this
 * rank's state in its control slot. The segment's layout and the map of
 * the other files are in shm_impl.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "comm/shm_impl.h"

static void shm_destroy(lk_comm *c) {
    shm_comm *s = c->impl;
    if (!s) return;
    if (s->base) {
        shm_slot *me = slot_of(s, s->rank);
        if (atomic_load(&me->state) == ST_ATTACHED) {
            /* the reason first: a peer reads it once it sees ST_LEFT (seq_cst store below) */
            snprintf(me->reason, sizeof me->reason, "%s", c->leave_reason);
            atomic_store(&me->state, ST_LEFT);
        }
    }
    if (!s->unlinked && s->created) shm_unlink(s->name);
    lk__shm_unmap(s);
    lk__shm_release_claims(s); /* after the name is gone: the next job with this id may start now */
    pthread_mutex_destroy(&s->heap_mu);
    for (int i = 0; i < s->nblk; i++) lk__alloc_uncharge(s->blks[i].size); /* blocks never freed go with the segment */
    lk_free(s->blks);
    lk_free(s);
    c->impl = NULL;
}
lk_status lk__shm_init(lk_comm *c, const lk_comm_config *cfg) {
    (void)cfg;
    const lk_pg_info *pg = &c->pg;
    if (pg->world_size > MAXW)
        return lk_error(LK_STATUS_UNSUPPORTED, "shm backend: world size %d exceeds the maximum of %d", pg->world_size, MAXW);
    if (pg->local_world_size != pg->world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "shm backend: the job spans %d nodes (world %d, %d on this node); shm joins processes of one node "
                        "(use the mpi backend)",
                        pg->num_nodes, pg->world_size, pg->local_world_size);
    LK_TRY(lk__shm_check_master_addr(pg->master_addr));
    if (!c->job_id[0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "shm backend: no job id to name the shared segment: set LK_JOB_ID (or MASTER_PORT), or start "
                        "with 'lockstep launch'");
    shm_comm *s = lk_calloc(1, sizeof *s);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->rank = pg->rank;
    s->world = pg->world_size;
    s->fd = -1;
    s->claim_fd = s->nonce_fd = -1;
    s->nonce = lk__shm_parse_nonce(lk_env_get("LK_JOB_NONCE"));
    s->pause_mask = lk__shm_rdv_pause_mask();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->spin_ns = cores > 0 && pg->local_world_size > cores ? 0 : 20000;
    long small = lk_env_get_long("LK_COMM_SHM_SMALL", (long)SMALL_BYTES_DEFAULT);
    long slice = lk_env_get_long("LK_COMM_SHM_SLICE", (long)CHUNK_SHARED_DEFAULT);
    s->small_bytes = small >= 0 && (size_t)small <= STAGE_SLOT ? (size_t)small : SMALL_BYTES_DEFAULT;
    s->chunk_shared = slice >= 4096 ? (size_t)slice : CHUNK_SHARED_DEFAULT;
    pthread_mutex_init(&s->heap_mu, NULL);
    lk_comm_shm_segment_name(c->job_id, s->name, sizeof s->name);
    lk__shm_sock_base(s->name, s->sockbase, sizeof s->sockbase);
    lk__shm_describe_identity(c, s);
    c->impl = s;
    lk_status st = lk__shm_rendezvous(c, s);
    if (st) {
        /* A failed start leaves nothing behind; only the rank that made the
         * segment removes the name: a rank refused by another job must not
         * take that job's segment away. But when the maker died while the
         * job was starting, nobody else ever would (it unlinks on its own
         * failure, or once every rank attached; a group's segment has no
         * next job to replace it), so a rank that attached to that very
         * segment removes it: attaching took a live creator, so a dead one
         * now is this job's, and the name still meaning the segment we
         * mapped keeps a successor's alone. */
        if (s->created && !s->unlinked) shm_unlink(s->name);
        else if (!s->unlinked && s->hdr && s->hdr->creator_pid && !lk__pid_alive(s->hdr->creator_pid) &&
                 lk__shm_same_segment(s->name, s->fd))
            shm_unlink(s->name);
        s->unlinked = true;
        if (s->base) {
            shm_slot *me = slot_of(s, s->rank);
            /* an abort (the seal's) keeps its reason for the peers */
            int attached = ST_ATTACHED;
            if (atomic_load(&me->pid) == getpid()) atomic_compare_exchange_strong(&me->state, &attached, ST_LEFT);
        }
        lk__shm_unmap(s);
        lk__shm_release_claims(s);
        pthread_mutex_destroy(&s->heap_mu);
        lk_free(s);
        c->impl = NULL;
        return st;
    }
    return LK_STATUS_OK;
}

/* A group: a segment of its own, named after child->job_id (group.c made
 * the name unique in the job and equal on the group's ranks), joined by
 * the same rendezvous as the world's. */
static lk_status shm_split(lk_comm *parent, lk_comm *child, int colour, int key) {
    (void)parent, (void)colour, (void)key;
    if (!child) return LK_STATUS_OK;
    return lk__shm_init(child, NULL);
}

/* This rank announces long work: peers waiting on it read the slot. */
static void shm_long_work(lk_comm *c) {
    shm_comm *s = c->impl;
    if (!s || !s->base || c->long_root != s->rank) return;
    shm_slot *me = slot_of(s, s->rank);
    snprintf(me->work_what, sizeof me->work_what, "%s", c->long_what);
    snprintf(me->work_limit_name, sizeof me->work_limit_name, "%s", c->long_limit_name);
    atomic_store(&me->work_start_ns, c->long_start_ns);
    atomic_store(&me->work_limit_ns, (uint64_t)(c->long_limit_s * 1e9));
    atomic_store_explicit(&me->in_work, 1, memory_order_release);
}

static void shm_abort(lk_comm *c, const char *reason) {
    shm_comm *s = c->impl;
    if (!s || !s->base) return;
    shm_slot *me = slot_of(s, s->rank);
    snprintf(me->reason, sizeof me->reason, "%s", reason ? reason : "");
    atomic_store(&me->state, ST_ABORTED);
}

const lk__comm_vtable lk__comm_shm = {
    .name = "shm",
    .init = lk__shm_init,
    .destroy = shm_destroy,
    .run = lk__shm_run,
    .alloc_shared = lk__shm_alloc_shared,
    .free_shared = lk__shm_free_shared,
    .shared_offset = lk__shm_shared_offset,
    .shared_at = lk__shm_shared_at,
    .abort = shm_abort,
    .long_work = shm_long_work,
    .split = shm_split,
    .p2p_start = lk__shm_p2p_start,
    .p2p_progress = lk__shm_p2p_progress,
};
