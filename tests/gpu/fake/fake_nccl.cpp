/* NCCL for the fake GPU: the calls src/comm/comm_nccl.c makes, implemented
 * between processes on one host, so that the nccl communicator runs end to
 * end in every CI run: the unique id's bootstrap, non-blocking init, the
 * collectives on device memory queued on a stream, the events that order
 * them after their producer and their consumers after them, completion
 * and the async error polled against the deadline, finalize, and abort.
 * Test-only: the fake GPU programs link it instead of libnccl.
 *
 * How: the unique id names a POSIX shared-memory segment that each rank
 * maps at init. A collective is queued on its stream as polled work of
 * the fake runtime (fake.h): when the stream runs it, each rank copies
 * its part into its slot of the segment, the ranks meet at a phase
 * counter, each computes its own result from all the slots (reductions
 * in rank order 0, 1, ..., n-1: the same bits on every rank, through the
 * library's own lk__reduce), and they meet again before the slots are
 * reused. Buffers larger than a slot go in rounds.
 *
 * What it models, strictly:
 *  - Asynchrony: a collective is queued, not run; it runs when the host
 *    waits for its stream, and waits there for peers that have not
 *    arrived, as the GPU's kernel would: the stream's later work, and
 *    every stream that waits for it through an event, wait too.
 *  - Non-blocking communicators (config->blocking = 0): init returns
 *    ncclInProgress and ncclCommGetAsyncError says so until every rank has
 *    joined.
 *  - Peers that never come: nothing times out here. A collective whose
 *    peer died or went elsewhere waits until ncclCommAbort, as NCCL on one
 *    node does: the library's own deadline must end it. A rank's abort does
 *    not release its peers either.
 *  - Its checks, each an error with the reason in ncclGetLastError: an id
 *    that is not this fake's; a rank, rank count or duplicate GPU that
 *    NCCL refuses ("one rank per GPU"); buffers that are not device
 *    memory of the communicator's GPU, or shorter than the count; a
 *    stream of another GPU; an unsupported type or op; a collective in
 *    a capture (not modelled); a call after abort or destroy.
 *  - ncclSend/ncclRecv: through a mailbox per ordered pair, in chunks of
 *    LK_FAKE_NCCL_SLOT; each blocks its stream until the peer's matching
 *    call has moved the whole message (so a send queued before a receive
 *    on both ranks waits forever, as on NCCL); a receive of another size
 *    than its send is an async error (NCCL would hang or corrupt).
 *  - ncclGroupStart/ncclGroupEnd around sends and receives: the calls
 *    in between are queued at the outermost end as one piece of stream
 *    work that moves them side by side (NCCL fuses a group into one
 *    launch), each ordered pair's messages in call order; it completes
 *    when all have. Collectives inside a group, and a group's calls on
 *    several streams or communicators, are refused (not modelled).
 * What it does not model: speed, NCCL's own algorithms and their rounding
 * (every reduction here is in rank order), several communicators sharing
 * one stream's order across processes, and anything across nodes.
 *
 * Environment: LK_FAKE_NCCL_SLOT (bytes per rank per round, default
 * 1 MiB: small, so that gradient buckets go in several rounds);
 * LK_FAKE_NCCL_FAIL=id makes ncclGetUniqueId fail (a driver or network
 * failure at start, for the tests of how every rank then ends). */
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fake.h"

#include "lockstep/dist.h"

/* The library's own reduction (src/comm/reduce.c): srcs in rank order. */
extern "C" void lk__reduce(void *dst, const void *const *srcs, int n, size_t count, lk_dtype dt, lk_reduce_op op,
                           int avg_div);

namespace {

constexpr int kMaxRanks = 64;
constexpr char kIdMagic[] = "lockstep-fake-nccl:";

/* The segment every rank maps. */
struct Shared {
    std::atomic<int> nranks;              /* set by the first rank to map it */
    std::atomic<int> joined;              /* ranks that have mapped it */
    std::atomic<int> gpu[kMaxRanks];      /* each rank's GPU, + 1 (0: not yet) */
    std::atomic<uint64_t> phase[kMaxRanks]; /* each rank's progress through the collectives' meetings */
};

size_t slot_bytes() {
    static size_t b = 0;
    if (!b) {
        const char *e = getenv("LK_FAKE_NCCL_SLOT");
        b = e && *e ? strtoull(e, NULL, 0) : (size_t)1 << 20;
        if (b < 64) b = 64;
        b = (b + 63) / 64 * 64;
    }
    return b;
}

struct Comm {
    Shared *sh = nullptr;
    size_t map_bytes = 0;
    std::string name;
    int rank = 0, nranks = 0;
    int gpu = -1, cuda_index = 0; /* the GPU as the fake numbers it, and as this process's runtime does */
    bool blocking = true;
    uint64_t phase = 0; /* this rank's meetings so far (advanced in stream order) */
    /* Atomic: the stream's work runs on whichever thread waits for it
     * (under the fake runtime's lock), while the communicator is polled
     * and aborted from the library's thread (outside it). */
    std::atomic<ncclResult_t> state{ncclSuccess};
    std::atomic<bool> aborted{false}, finalizing{false};
    std::atomic<int> pending{0}; /* queued collectives not yet complete */
    std::set<void *> streams;       /* where they were queued: what finalize flushes */
    std::string last;               /* the reason of the last error */
    char *slot(int r) { return (char *)(sh + 1) + (size_t)r * slot_bytes(); }
    /* The mailbox of the ordered pair src -> dst (ncclSend/ncclRecv), after the slots. */
    struct Mbox *mbox(int src, int dst);
    ~Comm() {
        if (sh) munmap(sh, map_bytes);
    }
};

/* One ordered pair's mailbox: one chunk of up to slot_bytes() at a time;
 * posted counts the chunks the sender put, taken those the receiver took. */
struct Mbox {
    std::atomic<uint64_t> posted, taken;
    uint64_t total, chunk; /* the message's bytes (the receiver checks its own), this chunk's */
    char pad[32];
    char *data() { return (char *)(this + 1); }
};
static_assert(sizeof(Mbox) == 64, "the mailbox header is one cache line");

size_t mbox_bytes() { return sizeof(Mbox) + slot_bytes(); }

Mbox *Comm::mbox(int src, int dst) {
    return (Mbox *)((char *)(sh + 1) + (size_t)nranks * slot_bytes() + (size_t)(src * nranks + dst) * mbox_bytes());
}

std::string global_last;

/* An open group (ncclGroupStart's depth, this thread's as NCCL's is) and
 * the sends and receives called inside it, queued at its end. */
thread_local int group_depth = 0;
thread_local std::vector<std::shared_ptr<struct P2p>> group_ops;
thread_local cudaStream_t group_stream = nullptr;
thread_local std::string group_error;

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    global_last = buf;
    fprintf(stderr, "fake NCCL: %s\n", buf);
    return r;
}

/* Joined: every rank mapped the segment; then each checks NCCL's rule of
 * one rank per GPU, as NCCL's init does. */
void check_joined(Comm *c) {
    if (c->state != ncclInProgress || c->finalizing) return;
    if (c->sh->joined.load() < c->nranks) return;
    for (int r = 0; r < c->nranks; r++)
        for (int q = r + 1; q < c->nranks; q++)
            if (c->sh->gpu[r].load() == c->sh->gpu[q].load()) {
                c->state = ncclInvalidUsage;
                c->last = "Duplicate GPU detected: rank " + std::to_string(r) + " and rank " + std::to_string(q) +
                          " both on GPU " + std::to_string(c->sh->gpu[r].load() - 1);
                fail(ncclInvalidUsage, "%s", c->last.c_str());
                return;
            }
    c->state = ncclSuccess;
}

bool met(Comm *c, uint64_t target) {
    for (int spin = 0; spin < 200; spin++) {
        bool all = true;
        for (int r = 0; r < c->nranks && all; r++) all = c->sh->phase[r].load(std::memory_order_acquire) >= target;
        if (all) return true;
        sched_yield();
    }
    return false;
}

enum Kind { ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER };

/* One collective's progress, as the stream runs it round by round. */
struct Coll {
    std::shared_ptr<Comm> c;
    Kind kind;
    const char *send;
    char *recv;
    size_t count, el;
    lk_dtype dt;
    lk_reduce_op op;
    int root;
    size_t done = 0, m = 0; /* elements finished, and in this round */
    int stage = 0;
    uint64_t target = 0;

    size_t per_round() const {
        size_t b = slot_bytes() / el;
        return kind == REDUCE_SCATTER ? b / (size_t)c->nranks : b;
    }
    void arrive() {
        target = ++c->phase;
        c->sh->phase[c->rank].store(target, std::memory_order_release);
    }
    void put() { /* this rank's part of the round into its slot */
        char *mine = c->slot(c->rank);
        size_t o = done * el, b = m * el;
        switch (kind) {
        case ALL_REDUCE:
        case ALL_GATHER: memcpy(mine, send + o, b); break;
        case BROADCAST:
            if (c->rank == root) memcpy(mine, send + o, b);
            break;
        case REDUCE_SCATTER:
            for (int r = 0; r < c->nranks; r++) memcpy(mine + (size_t)r * b, send + (size_t)r * count * el + o, b);
            break;
        }
    }
    void take() { /* this rank's result of the round, from every slot */
        size_t o = done * el, b = m * el;
        const void *src[kMaxRanks];
        switch (kind) {
        case ALL_REDUCE:
            for (int r = 0; r < c->nranks; r++) src[r] = c->slot(r);
            lk__reduce(recv + o, src, c->nranks, m, dt, op, c->nranks);
            break;
        case BROADCAST: memcpy(recv + o, c->slot(root), b); break;
        case ALL_GATHER:
            for (int r = 0; r < c->nranks; r++) memcpy(recv + (size_t)r * count * el + o, c->slot(r), b);
            break;
        case REDUCE_SCATTER:
            for (int r = 0; r < c->nranks; r++) src[r] = c->slot(r) + (size_t)c->rank * b;
            lk__reduce(recv + o, src, c->nranks, m, dt, op, c->nranks);
            break;
        }
    }
    /* The polled step: true when the collective is complete (or can never
     * complete: aborted). */
    bool step() {
        for (;;) {
            if (c->aborted) return true; /* the kernel is killed; the buffer is undefined */
            if (stage == 0) {
                if (done >= count) {
                    c->pending--;
                    return true;
                }
                m = count - done < per_round() ? count - done : per_round();
                put();
                arrive();
                stage = 1;
            }
            if (stage == 1) {
                if (!met(c.get(), target)) return false;
                take();
                arrive(); /* read: the slots may be reused */
                stage = 2;
            }
            if (!met(c.get(), target)) return false;
            done += m;
            stage = 0;
        }
    }
};

bool lk_type(ncclDataType_t t, lk_dtype *dt) {
    switch (t) {
    case ncclFloat32: *dt = LK_F32; return true;
    case ncclFloat64: *dt = LK_F64; return true;
    case ncclFloat16: *dt = LK_F16; return true;
    case ncclBfloat16: *dt = LK_BF16; return true;
    case ncclInt32: *dt = LK_I32; return true;
    case ncclInt64: *dt = LK_I64; return true;
    case ncclUint8: *dt = LK_U8; return true;
    default: return false;
    }
}

bool lk_op(ncclRedOp_t o, lk_reduce_op *op) {
    switch (o) {
    case ncclSum: *op = LK_REDUCE_SUM; return true;
    case ncclAvg: *op = LK_REDUCE_AVG; return true;
    case ncclMax: *op = LK_REDUCE_MAX; return true;
    case ncclMin: *op = LK_REDUCE_MIN; return true;
    default: return false;
    }
}

} // namespace

struct ncclComm {
    std::shared_ptr<Comm> c; /* queued collectives hold it too: a destroyed communicator's memory outlives them */
};

namespace {

ncclResult_t enqueue(Kind kind, const char *name, const void *send, void *recv, size_t count, ncclDataType_t t,
                     ncclRedOp_t o, int root, ncclComm_t comm, cudaStream_t st) {
    if (!comm || !comm->c) return fail(ncclInvalidArgument, "%s: no communicator", name);
    Comm *c = comm->c.get();
    if (group_depth > 0) return fail(ncclInvalidUsage, "%s on rank %d: a collective inside a group (not modelled)", name, c->rank);
    if (c->aborted) return fail(ncclInvalidUsage, "%s on rank %d: the communicator was aborted", name, c->rank);
    if (c->state != ncclSuccess)
        return fail(ncclInvalidUsage, "%s on rank %d: the communicator is not ready (state %d)", name, c->rank,
                    (int)c->state.load());
    lk_dtype dt;
    lk_reduce_op op = LK_REDUCE_SUM;
    if (!lk_type(t, &dt)) return fail(ncclInvalidArgument, "%s: data type %d is not modelled", name, (int)t);
    if ((kind == ALL_REDUCE || kind == REDUCE_SCATTER) && !lk_op(o, &op))
        return fail(ncclInvalidArgument, "%s: reduction %d is not modelled", name, (int)o);
    if (root < 0 || root >= c->nranks) return fail(ncclInvalidArgument, "%s: root %d of %d ranks", name, root, c->nranks);
    size_t el = lk_dtype_size(dt);
    size_t send_n = kind == REDUCE_SCATTER ? count * (size_t)c->nranks : count;
    size_t recv_n = kind == ALL_GATHER ? count * (size_t)c->nranks : count;
    bool send_used = kind != BROADCAST || c->rank == root;
    int dev = -1;
    if (count && send_used && (!lk_fake_is_device(send, send_n * el, &dev) || dev != c->cuda_index))
        return fail(ncclInvalidArgument, "%s on rank %d: the send buffer %p (%zu bytes) is not device memory of the "
                    "communicator's GPU", name, c->rank, send, send_n * el);
    if (count && (!lk_fake_is_device(recv, recv_n * el, &dev) || dev != c->cuda_index))
        return fail(ncclInvalidArgument, "%s on rank %d: the receive buffer %p (%zu bytes) is not device memory of "
                    "the communicator's GPU", name, c->rank, recv, recv_n * el);
    if (lk_fake_stream_gpu(st) != c->gpu)
        return fail(ncclInvalidArgument, "%s on rank %d: the stream is not a stream of the communicator's GPU %d",
                    name, c->rank, c->gpu);
    auto k = std::make_shared<Coll>();
    k->c = comm->c, k->kind = kind, k->send = (const char *)send, k->recv = (char *)recv, k->count = count;
    k->el = el, k->dt = dt, k->op = op, k->root = root;
    if (lk_fake_enqueue_poll(st, name, [k] { return k->step(); }) != 0)
        return fail(ncclInvalidUsage, "%s on rank %d: the fake runtime refused to queue it (in a capture?)", name,
                    c->rank);
    c->pending++;
    c->streams.insert(st);
    return ncclSuccess;
}

/* One ncclSend or ncclRecv, as its stream runs it: blocking for the
 * stream (as NCCL's kernel is) until the peer's matching call has moved
 * every chunk through the pair's mailbox. */
struct P2p {
    std::shared_ptr<Comm> c;
    bool send;
    int peer;
    char *buf;
    size_t bytes, done = 0;
    bool posted = false; /* send: a chunk is in the mailbox, not yet taken */
    bool moved = false;  /* at least one chunk (a message of 0 bytes is one empty chunk) */
    uint64_t mark = 0;

    bool finish() {
        c->pending--;
        return true;
    }
    bool step() {
        for (;;) {
            if (c->aborted) return true;
            if (moved && done >= bytes) return finish();
            if (send) {
                Mbox *mb = c->mbox(c->rank, peer);
                if (!posted) {
                    if (mb->taken.load(std::memory_order_acquire) != mb->posted.load(std::memory_order_acquire)) return false;
                    size_t n = bytes - done < slot_bytes() ? bytes - done : slot_bytes();
                    memcpy(mb->data(), buf + done, n);
                    mb->total = bytes, mb->chunk = n;
                    mark = mb->posted.load() + 1;
                    mb->posted.store(mark, std::memory_order_release);
                    posted = true;
                }
                if (mb->taken.load(std::memory_order_acquire) < mark) return false;
                done += mb->chunk, posted = false, moved = true;
            } else {
                Mbox *mb = c->mbox(peer, c->rank);
                uint64_t t = mb->taken.load(std::memory_order_acquire);
                if (mb->posted.load(std::memory_order_acquire) <= t) return false;
                if (mb->total != bytes) { /* NCCL would hang or corrupt; the fake names it */
                    c->last = "ncclRecv on rank " + std::to_string(c->rank) + " from rank " + std::to_string(peer) + ": " +
                              std::to_string(bytes) + " bytes, but the matching ncclSend has " + std::to_string(mb->total);
                    fail(ncclInvalidUsage, "%s", c->last.c_str());
                    c->state = ncclInvalidUsage;
                    return finish();
                }
                memcpy(buf + done, mb->data(), mb->chunk);
                done += mb->chunk, moved = true;
                mb->taken.store(t + 1, std::memory_order_release);
            }
        }
    }
};


/* A group's calls as one piece of stream work: every member steps in
 * turn; of the messages of one ordered pair and direction only the
 * oldest unfinished one does (they share the pair's mailbox). */
struct P2pGroup {
    std::vector<std::shared_ptr<P2p>> ops;
    std::vector<bool> done;
    bool step() {
        bool all = true;
        for (size_t i = 0; i < ops.size(); i++) {
            if (done[i]) continue;
            bool older = false;
            for (size_t j = 0; j < i && !older; j++)
                older = !done[j] && ops[j]->send == ops[i]->send && ops[j]->peer == ops[i]->peer && ops[j]->c == ops[i]->c;
            if (older) {
                all = false;
                continue;
            }
            done[i] = ops[i]->step();
            all = all && done[i];
        }
        return all;
    }
};

ncclResult_t enqueue_p2p(bool send, const char *name, void *buf, size_t count, ncclDataType_t t, int peer,
                         ncclComm_t comm, cudaStream_t st) {
    if (!comm || !comm->c) return fail(ncclInvalidArgument, "%s: no communicator", name);
    Comm *c = comm->c.get();
    if (c->aborted) return fail(ncclInvalidUsage, "%s on rank %d: the communicator was aborted", name, c->rank);
    if (c->state != ncclSuccess)
        return fail(ncclInvalidUsage, "%s on rank %d: the communicator is not ready (state %d)", name, c->rank,
                    (int)c->state.load());
    lk_dtype dt;
    if (!lk_type(t, &dt)) return fail(ncclInvalidArgument, "%s: data type %d is not modelled", name, (int)t);
    if (peer < 0 || peer >= c->nranks || peer == c->rank)
        return fail(ncclInvalidArgument, "%s on rank %d: peer %d of %d ranks", name, c->rank, peer, c->nranks);
    size_t b = count * lk_dtype_size(dt);
    int dev = -1;
    if (count && (!lk_fake_is_device(buf, b, &dev) || dev != c->cuda_index))
        return fail(ncclInvalidArgument, "%s on rank %d: the buffer %p (%zu bytes) is not device memory of the "
                    "communicator's GPU", name, c->rank, buf, b);
    if (lk_fake_stream_gpu(st) != c->gpu)
        return fail(ncclInvalidArgument, "%s on rank %d: the stream is not a stream of the communicator's GPU %d",
                    name, c->rank, c->gpu);
    auto k = std::make_shared<P2p>();
    k->c = comm->c, k->send = send, k->peer = peer, k->buf = (char *)buf, k->bytes = b;
    if (group_depth > 0) { /* queued at the group's end */
        if (!group_ops.empty() && (group_stream != st || group_ops[0]->c != comm->c)) {
            group_error = std::string(name) + ": a group's calls on several streams or communicators (not modelled)";
            return fail(ncclInvalidUsage, "%s on rank %d: %s", name, c->rank, group_error.c_str());
        }
        group_stream = st;
        group_ops.push_back(k);
        c->pending++;
        c->streams.insert(st);
        return ncclSuccess;
    }
    if (lk_fake_enqueue_poll(st, name, [k] { return k->step(); }) != 0)
        return fail(ncclInvalidUsage, "%s on rank %d: the fake runtime refused to queue it (in a capture?)", name,
                    c->rank);
    c->pending++;
    c->streams.insert(st);
    return ncclSuccess;
}

} // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static std::atomic<unsigned> n{0};
    const char *f = getenv("LK_FAKE_NCCL_FAIL");
    if (f && !strcmp(f, "id")) return fail(ncclSystemError, "ncclGetUniqueId: failed on purpose (LK_FAKE_NCCL_FAIL=id)");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s/lkfakenccl-%d-%u-%ld", kIdMagic, (int)getpid(), n++,
             (long)ts.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    *out = NULL;
    if (strncmp(id.internal, kIdMagic, strlen(kIdMagic)) != 0 || !memchr(id.internal, 0, sizeof id.internal))
        return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is not one ncclGetUniqueId made");
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks (at most %d here)", rank, nranks,
                    kMaxRanks);
    int cur = 0;
    cudaGetDevice(&cur);
    int gpu = lk_fake_current_gpu();
    auto c = std::make_shared<Comm>();
    c->name = id.internal + strlen(kIdMagic);
    c->rank = rank, c->nranks = nranks, c->gpu = gpu, c->cuda_index = cur;
    c->blocking = !config || config->blocking != 0;
    int fd = shm_open(c->name.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) return fail(ncclSystemError, "ncclCommInitRank: shm_open %s: %s", c->name.c_str(), strerror(errno));
    c->map_bytes = sizeof(Shared) + (size_t)nranks * slot_bytes() + (size_t)nranks * (size_t)nranks * mbox_bytes();
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)c->map_bytes) == 0) p = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return fail(ncclSystemError, "ncclCommInitRank: mapping %s: %s", c->name.c_str(), strerror(errno));
    c->sh = (Shared *)p;
    int expected = 0;
    if (!c->sh->nranks.compare_exchange_strong(expected, nranks) && expected != nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d says %d ranks, another rank said %d", rank, nranks,
                    expected);
    int was = 0;
    if (!c->sh->gpu[rank].compare_exchange_strong(was, gpu + 1))
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d joined twice", rank);
    if (c->sh->joined.fetch_add(1) + 1 == nranks) shm_unlink(c->name.c_str()); /* all mapped it: the name can go */
    c->state = ncclInProgress;
    if (c->blocking) {
        while (c->state == ncclInProgress) check_joined(c.get()), usleep(c->state == ncclInProgress ? 100 : 0);
        if (c->state != ncclSuccess) return c->state;
    }
    *out = new ncclComm{c};
    return c->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    return ncclCommInitRankConfig(comm, nranks, id, rank, NULL);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *e) {
    if (!comm || !comm->c) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: no communicator");
    Comm *c = comm->c.get();
    check_joined(c);
    if (c->finalizing && c->state == ncclInProgress) { /* finalize flushes what was issued */
        for (void *s : c->streams) lk_fake_progress(s);
        if (c->pending == 0) c->state = ncclSuccess;
    }
    *e = c->state;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    if (!comm || !comm->c) return fail(ncclInvalidArgument, "ncclCommFinalize: no communicator");
    Comm *c = comm->c.get();
    if (c->aborted || c->state != ncclSuccess)
        return fail(ncclInvalidUsage, "ncclCommFinalize on rank %d: the communicator is not in a state to finalize",
                    c->rank);
    c->finalizing = true;
    c->state = ncclInProgress;
    if (c->blocking) {
        ncclResult_t e;
        do ncclCommGetAsyncError(comm, &e), usleep(e == ncclInProgress ? 100 : 0);
        while (e == ncclInProgress);
        return e;
    }
    return ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->c && comm->c->pending && !comm->c->aborted)
        fail(ncclInvalidUsage, "ncclCommDestroy on rank %d with %d collectives outstanding (finalize first)",
             comm->c->rank, comm->c->pending.load());
    if (comm->c) comm->c->aborted = true; /* anything still queued ends */
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    if (comm->c) {
        comm->c->aborted = true, comm->c->last = "aborted (ncclCommAbort)";
        shm_unlink(comm->c->name.c_str()); /* a peer that never joined left the name behind */
    }
    delete comm; /* as NCCL: abort frees the communicator */
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (fake NCCL)";
    case ncclSystemError: return "unhandled system error (fake NCCL)";
    case ncclInternalError: return "internal error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument (fake NCCL)";
    case ncclInvalidUsage: return "invalid usage (fake NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (fake NCCL)";
    case ncclInProgress: return "NCCL operation in progress (fake NCCL)";
    default: return "unknown result code (fake NCCL)";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    if (comm && comm->c && !comm->c->last.empty()) return comm->c->last.c_str();
    return global_last.c_str();
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t st) {
    return enqueue(ALL_REDUCE, "ncclAllReduce", s, r, n, t, op, 0, c, st);
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st) {
    return enqueue(REDUCE_SCATTER, "ncclReduceScatter", s, r, n, t, op, 0, c, st);
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    return enqueue(ALL_GATHER, "ncclAllGather", s, r, n, t, ncclSum, 0, c, st);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) {
    return enqueue(BROADCAST, "ncclBroadcast", s, r, n, t, ncclSum, root, c, st);
}
ncclResult_t ncclGroupStart(void) {
    if (group_depth++ == 0) group_ops.clear(), group_stream = nullptr, group_error.clear();
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    std::vector<std::shared_ptr<P2p>> ops;
    ops.swap(group_ops);
    if (ops.empty()) return ncclSuccess;
    if (!group_error.empty()) { /* a call inside failed: nothing of the group runs */
        for (auto &k : ops) k->c->pending--;
        return fail(ncclInvalidUsage, "ncclGroupEnd: %s", group_error.c_str());
    }
    auto g = std::make_shared<P2pGroup>();
    g->ops = ops;
    g->done.assign(ops.size(), false);
    if (lk_fake_enqueue_poll(group_stream, "ncclGroupEnd", [g] { return g->step(); }) != 0) {
        for (auto &k : ops) k->c->pending--;
        return fail(ncclInvalidUsage, "ncclGroupEnd on rank %d: the fake runtime refused to queue it (in a capture?)",
                    ops[0]->c->rank);
    }
    return ncclSuccess;
}
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    return enqueue_p2p(true, "ncclSend", const_cast<void *>(s), n, t, peer, c, st);
}
ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    return enqueue_p2p(false, "ncclRecv", r, n, t, peer, c, st);
}

} // extern "C"
