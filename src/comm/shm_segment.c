/* shm: the segment. Its name (from the job id), its layout, rank 0
 * creating it (replacing a stale one a dead job left), the other ranks
 * attaching to their launch's segment only, and the pids of its ranks for
 * messages. Who may join at all is shm_rdv.c's concern. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "comm/shm_impl.h"

/* ------------------------------------------------------------------------
 * Helpers shared with the launcher.
 * ---------------------------------------------------------------------- */
void lk_comm_shm_segment_name(const char *job_id, char *buf, size_t size) {
    char clean[200];
    size_t n = 0;
    for (const char *p = job_id ? job_id : ""; *p && n < sizeof clean - 1; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
        clean[n++] = ok ? ch : '_';
    }
    clean[n] = 0;
    snprintf(buf, size, "/lockstep-%s", clean);
}

static void layout(int W, size_t heap, shm_header *h) {
    const size_t page = 4096;
    h->slots_off = page;
    h->slot_bytes = sizeof(shm_slot);
    h->stage_off = (h->slots_off + (size_t)W * h->slot_bytes + page - 1) / page * page;
    h->stage_bytes = 2 * STAGE_SLOT;
    h->mbox_off = h->stage_off + (size_t)W * h->stage_bytes;
    h->mbox_bytes = sizeof(shm_mbox);
    h->heap_off = (h->mbox_off + (size_t)W * (size_t)W * h->mbox_bytes + page - 1) / page * page;
    h->heap_bytes = (heap + page - 1) / page * page;
    h->mdata_off = h->heap_off + (size_t)W * h->heap_bytes;
    /* Two chunks per slot (one written while the other is read): 1 MiB, or
     * less when the pairs are many, so that the slots stay near 64 MiB. */
    size_t slot = (size_t)1 << 20;
    while (slot > ((size_t)16 << 10) && (size_t)W * (size_t)W * slot > ((size_t)64 << 20)) slot /= 2;
    h->mdata_slot = slot;
    h->total = h->mdata_off + (size_t)W * (size_t)W * slot;
}

void lk__shm_unmap(shm_comm *s) {
    if (s->base) munmap(s->base, s->total);
    s->base = NULL;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

/* The pids of the ranks attached to the segment now under the name, for
 * messages ("" when there is none). */
void lk__shm_segment_pids(const char *name, char *buf, size_t size) {
    buf[0] = 0;
    int fd = shm_open(name, O_RDONLY, 0600);
    if (fd < 0) return;
    struct stat st;
    shm_header *h = NULL;
    size_t map = 0; /* the header page and the control slots, not the heaps */
    if (!fstat(fd, &st) && (size_t)st.st_size >= 4096) {
        map = (size_t)st.st_size < 4096 + MAXW * sizeof(shm_slot) ? (size_t)st.st_size : 4096 + MAXW * sizeof(shm_slot);
        h = mmap(NULL, map, PROT_READ, MAP_SHARED, fd, 0);
        if (h == MAP_FAILED) h = NULL;
    }
    if (h && atomic_load(&h->magic) == SHM_MAGIC && h->world > 0 && h->world <= MAXW &&
        h->slots_off + (uint64_t)h->world * h->slot_bytes <= (uint64_t)map) {
        size_t len = (size_t)snprintf(buf, size, "; its ranks: ");
        int n = 0;
        for (int k = 0; k < h->world && len + 40 < size; k++) {
            const shm_slot *sl = (const shm_slot *)((const uint8_t *)h + h->slots_off + (size_t)k * h->slot_bytes);
            int pid = atomic_load(&((shm_slot *)sl)->pid);
            if (pid) len += (size_t)snprintf(buf + len, size - len, "%s%d = pid %d", n++ ? ", " : "", k, pid);
        }
        if (!n) buf[0] = 0;
    }
    if (h) munmap(h, map);
    close(fd);
}

/* Creator (rank 0): a fresh segment; a stale one left by a dead job is replaced. */
lk_status lk__shm_create_segment(lk_comm *c, shm_comm *s) {
    shm_header want = {0};
    layout(s->world, c->shared_bytes, &want);
    for (int attempt = 0;; attempt++) {
        int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno == EEXIST && attempt < 100) {
            int ofd = shm_open(s->name, O_RDWR, 0600);
            int owner = 0;
            if (ofd >= 0) {
                struct stat st;
                if (!fstat(ofd, &st) && (size_t)st.st_size >= sizeof(shm_header)) {
                    shm_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, ofd, 0);
                    if (h != MAP_FAILED) {
                        owner = h->creator_pid;
                        munmap(h, sizeof *h);
                    }
                }
                close(ofd);
            }
            if (!owner && attempt < 50) { /* its creator is still writing the header */
                lk__shm_sleep_ms(2);
                continue;
            }
            /* We hold the id's claim, so a live creator is a job we cannot
             * see claims of (another network namespace sharing /dev/shm). */
            if (owner && lk__pid_alive(owner) && owner != getpid()) {
                char pids[400];
                lk__shm_segment_pids(s->name, pids, sizeof pids);
                return lk_error(LK_STATUS_INVALID_USAGE,
                                "rendezvous: %s is already in use on this host: shm segment %s belongs to a live job "
                                "(creator pid %d%s); two jobs cannot share it: %s, or stop the other job",
                                s->ident, s->name, owner, pids, s->remedy);
            }
            shm_unlink(s->name); /* stale: its creator is gone */
            continue;
        }
        if (fd < 0) return lk_error(LK_STATUS_IO, "shm_open(%s) failed: %s", s->name, strerror(errno));
        if (ftruncate(fd, (off_t)want.total)) {
            int e = errno;
            close(fd);
            shm_unlink(s->name);
            return lk_error(LK_STATUS_IO, "ftruncate(%s, %zu) failed: %s", s->name, (size_t)want.total, strerror(e));
        }
        /* Reserve the control and staging pages now: a full /dev/shm must be an
         * error here, not a SIGBUS in the middle of a collective. */
        int rc = posix_fallocate(fd, 0, (off_t)want.heap_off);
        if (rc) {
            close(fd);
            shm_unlink(s->name);
            return lk_error(LK_STATUS_OUT_OF_MEMORY, "cannot reserve %zu bytes in /dev/shm for %s: %s (is /dev/shm too small?)",
                            (size_t)want.heap_off, s->name, strerror(rc));
        }
        void *p = mmap(NULL, want.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            shm_unlink(s->name);
            return lk_error(LK_STATUS_IO, "mmap(%s, %zu bytes) failed: %s", s->name, (size_t)want.total, strerror(errno));
        }
        s->base = p;
        s->total = want.total;
        s->hdr = p;
        s->fd = fd;
        s->created = true;
        shm_header *h = s->hdr;
        h->version = 6;
        h->nonce = s->nonce;
        h->world = s->world;
        h->creator_pid = getpid();
        h->total = want.total;
        h->slots_off = want.slots_off;
        h->slot_bytes = want.slot_bytes;
        h->stage_off = want.stage_off;
        h->stage_bytes = want.stage_bytes;
        h->heap_off = want.heap_off;
        h->heap_bytes = want.heap_bytes;
        h->mbox_off = want.mbox_off;
        h->mbox_bytes = want.mbox_bytes;
        h->mdata_off = want.mdata_off;
        h->mdata_slot = want.mdata_slot;
        h->small_bytes = s->small_bytes;
        h->chunk_shared = s->chunk_shared;
        snprintf(h->job_id, sizeof h->job_id, "%s", c->job_id);
        atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
        return LK_STATUS_OK;
    }
}

/* Whether the name still refers to the object we opened as fd: rank 0
 * replaces a stale segment by unlinking it and creating a new one under the
 * same name, and a mapping of the old one would never see its header. */
bool lk__shm_same_segment(const char *name, int fd) {
    struct stat mine, now;
    int nfd = shm_open(name, O_RDONLY, 0600);
    if (nfd < 0) return false;
    bool same = !fstat(fd, &mine) && !fstat(nfd, &now) && mine.st_ino == now.st_ino && mine.st_dev == now.st_dev;
    close(nfd);
    return same;
}

lk_status lk__shm_attach_segment(lk_comm *c, shm_comm *s, uint64_t deadline, lk_status (*between_tries)(shm_comm *s)) {
    char why[700] = "not created yet";
    uint64_t next_probe = 0;
    while (lk_time_ns() < deadline) {
        if (between_tries && lk_time_ns() >= next_probe) {
            LK_TRY(between_tries(s));
            next_probe = lk_time_ns() + 20000000ull; /* each probe queues a connection on the holder */
        }
        int fd = shm_open(s->name, O_RDWR, 0600);
        if (fd < 0) {
            lk__shm_sleep_ms(2);
            continue;
        }
        struct stat st;
        if (fstat(fd, &st) || (size_t)st.st_size < sizeof(shm_header)) {
            if (!fstat(fd, &st))
                snprintf(why, sizeof why, "it exists with %lld bytes, less than lockstep's %zu-byte header: being created, or "
                         "a stale file rank 0 has not replaced", (long long)st.st_size, sizeof(shm_header));
            close(fd);
            lk__shm_sleep_ms(1);
            continue;
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return lk_error(LK_STATUS_IO, "mmap(%s) failed: %s", s->name, strerror(errno));
        }
        shm_header *h = p;
        /* Wait for the creator to finish the header, but only while the name
         * still means this file: a stale one is replaced, not completed. */
        bool replaced = false;
        for (int i = 1; atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC && lk_time_ns() < deadline; i++) {
            lk__shm_sleep_ms(1);
            if (i % 20 == 0 && !lk__shm_same_segment(s->name, fd)) {
                replaced = true;
                break;
            }
        }
        uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
        if (replaced || magic != SHM_MAGIC || h->total != (uint64_t)st.st_size || !lk__pid_alive(h->creator_pid)) {
            if (replaced) snprintf(why, sizeof why, "a stale file was there and has been replaced");
            else if (magic != SHM_MAGIC)
                snprintf(why, sizeof why,
                         "/dev/shm%.256s exists (%lld bytes) but has no lockstep header (magic 0x%016llx, expected 0x%016llx); "
                         "rank 0 never replaced it: a leftover of another program or version? remove it",
                         s->name, (long long)st.st_size, (unsigned long long)magic, (unsigned long long)SHM_MAGIC);
            else snprintf(why, sizeof why, "stale: its creator pid %d is gone", h->creator_pid);
            munmap(p, (size_t)st.st_size); /* stale or foreign: wait for the real one */
            close(fd);
            lk__shm_sleep_ms(5);
            continue;
        }
        if (h->nonce != s->nonce) {
            /* A live job's segment, not our launch's: never take a slot in it. */
            int owner = h->creator_pid;
            const char *how = !h->nonce ? ", started without 'lockstep launch'"
                              : s->nonce ? ", started by another 'lockstep launch'"
                                         : ", started by 'lockstep launch'";
            char pids[400];
            munmap(p, (size_t)st.st_size);
            close(fd);
            lk__shm_segment_pids(s->name, pids, sizeof pids);
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "rendezvous: %s is already in use on this host: shm segment %s belongs to another job (its rank "
                            "0 is pid %d%s%s); two jobs cannot share it: %s, or stop the other job",
                            s->ident, s->name, owner, how, pids, s->remedy);
        }
        s->base = p;
        s->total = (size_t)st.st_size;
        s->hdr = h;
        s->fd = fd;
        return LK_STATUS_OK;
    }
    return lk_error(LK_STATUS_TIMEOUT,
                    "rendezvous: rank %d waited %.1f s for local rank 0 to create shm segment %s (%s); is rank 0 running, "
                    "with the same LK_JOB_ID/MASTER_PORT?",
                    s->rank, c->timeout_s, s->name, why);
}
