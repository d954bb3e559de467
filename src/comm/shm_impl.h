/* Private to the shm communicator's files (comm_shm.c and shm_*.c): the
 * segment's layout (header, control slots, staging, heaps), the per-process
 * state, and the functions each file offers the others.
 *
 * Segment: header | one control slot per rank (progress tick, pid, state,
 * the collective in flight) | two staging slots per rank | one mailbox
 * control block per ordered pair of ranks | one heap per rank
 * (lk_comm_alloc_shared) | one mailbox data slot per ordered pair. Pages
 * up to the heaps are reserved at creation; a heap's when it is allocated,
 * a data slot's at the pair's first send.
 *
 * Files, one concern each:
 *   comm_shm.c     the vtable: init (tunables, then the rendezvous), destroy, abort, long work
 *   shm_rdv.c      the rendezvous: who may join (claims, nonce, seal) and the MASTER_ADDR check
 *   shm_segment.c  the segment: its name, layout, creation, attaching, removal
 *   shm_wait.c     waiting and liveness: sync points, dead peers, timeouts and their messages
 *   shm_coll.c     the collectives' algorithms and the desync check
 *   shm_heap.c     the per-rank shared heaps (lk_comm_alloc_shared)
 *   shm_p2p.c      point-to-point through the per-pair mailboxes, and split
 */
#ifndef LK_COMM_SHM_IMPL_H
#define LK_COMM_SHM_IMPL_H

#include <stdalign.h>
#include <sys/socket.h>

#include "comm/comm_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define MAXW 256                   /* ranks per segment */
#define LINE 128                   /* two cache lines: adjacent-line prefetch must not couple ranks */
#define SHM_MAGIC 0x35304d48534b4cULL /* "LKSHM05": version 6 added the mailboxes */
#define STAGE_SLOT ((size_t)1 << 20)  /* bytes per staging slot; two per rank */
#define SMALL_BYTES_DEFAULT ((size_t)64 << 10)   /* single-step all_reduce up to this; LK_COMM_SHM_SMALL */
#define CHUNK_SHARED_DEFAULT ((size_t)16 << 10) /* in-segment all_reduce: bytes reduced, then written to every rank, at a time; LK_COMM_SHM_SLICE */
#define CHECK_NS 100000000ull            /* liveness/abort checks every 100 ms while waiting */

enum { ST_EMPTY = 0, ST_ATTACHED = 1, ST_ABORTED = 2, ST_LEFT = 3 };

typedef struct {
    _Atomic uint64_t magic; /* set last by the creator */
    uint32_t version;
    int32_t world;
    int32_t creator_pid;
    int32_t pad;
    uint64_t total, slots_off, slot_bytes, stage_off, stage_bytes, heap_off, heap_bytes;
    _Atomic int32_t attached;
    uint64_t small_bytes, chunk_shared; /* the creator's tunables: every rank must run the same algorithm */
    char job_id[96];
    /* The creator's LK_JOB_NONCE (0: none). Added in version 5 after the old
     * fields, so an older segment reads as 0 and the magic could stay. */
    uint64_t nonce;
    /* Version 6: the mailboxes (shm_p2p.c). */
    uint64_t mbox_off, mbox_bytes; /* control blocks: W * W of mbox_bytes */
    uint64_t mdata_off, mdata_slot; /* data slots: W * W of mdata_slot bytes, after the heaps */
} shm_header;

/* The header of one message as one side posted it. */
typedef struct {
    uint64_t seq, count;
    int32_t dt, pad;
} shm_msghdr;

/* The mailbox of the ordered pair src -> dst. Each counter has one writer;
 * the other side only reads it. Headers are double-buffered by the parity
 * of the sequence number: a side may post message n + 1 while the other
 * still reads n's header, never n + 2 (n + 1 cannot start before n is done). */
typedef struct {
    alignas(LINE) _Atomic uint64_t send_seq; /* src: the last message posted */
    _Atomic uint64_t written;                 /* src: chunks written into the slot, over the pair's life */
    shm_msghdr send_hdr[2];
    alignas(LINE) _Atomic uint64_t recv_seq; /* dst: the last receive posted */
    _Atomic uint64_t consumed;                /* dst: chunks read out of the slot, over the pair's life */
    shm_msghdr recv_hdr[2];
} shm_mbox;

typedef struct {
    uint64_t seq;
    int32_t kind, dt, op, root;
    uint64_t count;
    int64_t off; /* offset of the buffer peers read in place, or -1 */
} shm_info;

typedef struct {
    alignas(LINE) _Atomic uint64_t tick;
    alignas(LINE) _Atomic int32_t pid;
    _Atomic int32_t state;
    int32_t world;
    _Atomic uint64_t seq_done;
    _Atomic uint64_t active_ns;
    _Atomic int32_t in_coll;
    _Atomic int32_t cpu; /* the core this rank last arrived from */
    _Atomic int32_t cur; /* which info[] describes the collective in flight */
    /* lk_comm_long_work announced by this rank: busy with work_what since
     * work_start_ns, allowed work_limit_ns; cleared when it enters its next
     * collective. in_work is stored last (release) and read first. */
    _Atomic int32_t in_work;
    _Atomic uint64_t work_start_ns, work_limit_ns;
    char work_what[256];
    char work_limit_name[64];
    /* What this rank called, indexed by the parity of the entry tick: a rank
     * may publish its next collective while a peer still checks this one. */
    alignas(LINE) shm_info info[2];
    alignas(LINE) char reason[512];
} shm_slot;

typedef struct {
    size_t off, size;
} blk;

typedef struct {
    uint8_t *base;
    size_t total;
    shm_header *hdr;
    int rank, world;
    uint64_t tick;      /* my progress; equal on all ranks between collectives */
    uint64_t stage_ctr; /* staging uses so far; equal on all ranks */
    int cur;            /* info[] index of the collective in flight */
    char name[256];
    bool unlinked;
    size_t small_bytes, chunk_shared; /* tunables: rank 0's, from the header */
    uint64_t spin_ns;           /* spin this long before yielding: 0 when ranks outnumber cores */
    int fd;                     /* kept open to reserve heap pages (posix_fallocate) */
    bool pid_visible[256];      /* peers' pids mean something here (same pid namespace) */
    pthread_mutex_t heap_mu;
    blk *blks;
    int nblk, cap;
    /* Rendezvous: who may join (see the top of the file). */
    uint64_t nonce;        /* LK_JOB_NONCE: this rank's launch; 0 when started without lockstep launch */
    int claim_fd;          /* held while the communicator lives: "<name>" (rank 0) or "<name>/rank<k>"; -1 */
    int nonce_fd;          /* rank 0 of a launch: "<name>#<nonce>"; -1 */
    bool created;          /* rank 0 made the segment under the name, so it removes the name */
    unsigned pause_mask;   /* LK_COMM_TEST_RDV_PAUSE: steps that stop this process */
    char sockbase[96];     /* abstract socket names are sockbase + a suffix */
    char ident[200];       /* the identity as messages name it */
    char remedy[160];      /* what to do when two jobs share it */
    bool mdata_ready[MAXW]; /* this rank's data slot to each peer is reserved (posix_fallocate) */
} shm_comm;

static inline shm_slot *slot_of(shm_comm *s, int k) {
    return (shm_slot *)(s->base + s->hdr->slots_off + (size_t)k * s->hdr->slot_bytes);
}
static inline uint8_t *stage_of(shm_comm *s, int k, uint64_t use) {
    return s->base + s->hdr->stage_off + (size_t)k * s->hdr->stage_bytes + (use & 1) * STAGE_SLOT;
}
static inline shm_mbox *mbox_of(shm_comm *s, int src, int dst) {
    return (shm_mbox *)(s->base + s->hdr->mbox_off + ((size_t)src * (size_t)s->world + (size_t)dst) * s->hdr->mbox_bytes);
}
static inline uint8_t *mdata_of(shm_comm *s, int src, int dst) {
    return s->base + s->hdr->mdata_off + ((size_t)src * (size_t)s->world + (size_t)dst) * s->hdr->mdata_slot;
}
static inline uint8_t *heap_of(shm_comm *s, int k) { return s->base + s->hdr->heap_off + (size_t)k * s->hdr->heap_bytes; }

/* ---- shm_wait.c: waiting and liveness ---- */
void lk__shm_sleep_ms(int ms);
/* "all_reduce #7 (f32 x 1024, sum)" for what a rank published. */
void lk__shm_describe_info(shm_info *sl, char *buf, size_t size);
/* Fails with REMOTE when peer k is dead, aborted or gone; OK while it may still come. */
lk_status lk__shm_check_peer(lk_comm *c, shm_comm *s, int k, const char *what);
/* Publishes the next tick and waits until every peer reaches it, bounded
 * by comm_timeout (or a peer's announced long work) and checking liveness. */
lk_status lk__shm_sync_all(lk_comm *c, shm_comm *s, const lk__coll *op);

/* ---- shm_coll.c: the collectives ---- */
lk_status lk__shm_run(lk_comm *c, const lk__coll *op);

/* ---- shm_heap.c: lk_comm_alloc_shared ---- */
lk_status lk__shm_alloc_shared(lk_comm *c, size_t bytes, void **ptr);
void lk__shm_free_shared(lk_comm *c, void *ptr);
int64_t lk__shm_shared_offset(lk_comm *c, const void *p);
void *lk__shm_shared_at(lk_comm *c, int k, int64_t off);

/* ---- shm_p2p.c: point-to-point ---- */
lk_status lk__shm_p2p_start(lk_comm *c, lk__p2p *op);
lk_status lk__shm_p2p_progress(lk_comm *c, lk__p2p *op, bool *done);
/* comm_shm.c's init, which a group (comm_shm.c's split) runs too. */
lk_status lk__shm_init(lk_comm *c, const lk_comm_config *cfg);

/* ---- shm_segment.c: the segment ---- */
/* Rank 0: a fresh segment (a stale one is replaced); fills s->base/hdr/fd. */
lk_status lk__shm_create_segment(lk_comm *c, shm_comm *s);
/* Other ranks: waits (until deadline) for rank 0's segment of this launch
 * and maps it. While it is not there, between_tries (NULL: none) runs every
 * 20 ms and its error ends the wait (the rendezvous's check that no other
 * job holds the id). */
lk_status lk__shm_attach_segment(lk_comm *c, shm_comm *s, uint64_t deadline, lk_status (*between_tries)(shm_comm *s));
/* Whether the name still refers to the object opened as fd. */
bool lk__shm_same_segment(const char *name, int fd);
void lk__shm_unmap(shm_comm *s);
/* "; its ranks: 0 = pid N, ..." of the segment now under the name, for messages ("" if none). */
void lk__shm_segment_pids(const char *name, char *buf, size_t size);

/* ---- shm_rdv.c: the rendezvous ---- */
lk_status lk__shm_check_master_addr(const char *addr);
lk_status lk__shm_rendezvous(lk_comm *c, shm_comm *s);
void lk__shm_release_claims(shm_comm *s);
void lk__shm_describe_identity(const lk_comm *c, shm_comm *s);
uint64_t lk__shm_parse_nonce(const char *v);
unsigned lk__shm_rdv_pause_mask(void);
void lk__shm_sock_base(const char *segname, char *buf, size_t size);

#endif
