/* A fake GPU: the part of the CUDA runtime API that lockstep calls
 * (src/device/cuda.c, the files of src/backend/cuda/, src/comm/comm_nccl.c and the
 * kernel files), implemented on the host, so that the library's CUDA code
 * runs end to end in every CI run: the cuda device, the backend's
 * dispatch, the launchers (the kernels themselves come from the host
 * emulation, tests/gpu/emu/), cuBLASLt's use (fake_cublaslt.cpp), dp's peer
 * copies, the prefetch's streams and events, and graph capture and replay.
 * Test-only: the fake test programs link it instead of libcudart.
 *
 * What it models, strictly, because each is a way the code could be wrong
 * on a real GPU that a CPU run would never show:
 *  - Device memory the host cannot touch: every cudaMalloc/cudaMallocAsync
 *    block is its own mapping, PROT_NONE except while queued work runs. A
 *    host read or write of device memory is a SIGSEGV, reported with the
 *    block it hit.
 *  - Asynchrony, adversarially: queued work runs as late as the program
 *    allows, only when the host synchronises with it (a stream or event
 *    synchronisation, a copy into pageable host memory, cudaFree) and
 *    only as far as that needs. Work on a stream that nothing waits for
 *    stays queued, so a missing event between two streams (a copy stream
 *    and the compute stream, two GPUs' streams) or a host read without a
 *    synchronisation gives wrong numbers or stale bytes, not luck.
 *  - Host memory kinds: pinned memory (cudaHostAlloc) is read and written
 *    when the copy runs; pageable memory is staged at the call (into the
 *    device) or waited for (out of it), as the runtime documents.
 *  - Stream capture (cudaStreamBeginCapture, thread-local mode): work on a
 *    capturing stream is recorded, not run; another stream joins the
 *    capture by waiting for an event recorded in it and must join back
 *    before the end; the calls a capture cannot record (cudaMalloc,
 *    cudaFree, synchronisations, copies with pageable memory, waiting for
 *    work outside the capture) are refused with the runtime's error codes
 *    and invalidate the capture. A graph's launch replays the recorded
 *    work in order; memory a capture allocated belongs to the graph.
 *  - Work that waits for another process (fake_nccl.cpp's collectives,
 *    through lk_fake_enqueue_poll): it stays at its stream's front until
 *    its step says it is done; an event query then says "not ready", and a
 *    blocking call (a synchronisation, cudaFree) waits as the real one
 *    would, as long as it takes.
 *  - Errors as the runtime keeps them: a per-thread last error.
 *  - The legacy stream (NULL) is refused everywhere: lockstep never uses
 *    it (a graph cannot capture it), so any use is a bug.
 * What it does not model: timing, concurrency between streams (queued
 * work runs one op at a time), the GPU's memory model, launch limits, and
 * NCCL beyond what fake_nccl.cpp models.
 *
 * Environment: LK_FAKE_GPUS (GPUs, default 2), LK_FAKE_GPU_MEM (bytes per
 * GPU, default 8 GiB; mappings are reserved, not committed),
 * CUDA_VISIBLE_DEVICES (as the runtime reads it: a list hides the rest,
 * empty hides all). LK_FAKE_GPU_TRACE=1 prints every queued op when it
 * runs; LK_FAKE_GPU_PROTECT=0 leaves device memory readable (faster, and
 * blind to host accesses). */
#include <cuda_runtime_api.h>
#include <stdarg.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fake.h"

/* The kernel files see these types through the emulation's header
 * (tests/gpu/emu/cuda_runtime.h), which cannot include the runtime's: its
 * copy of the attribute struct must have the runtime's size, since
 * cudaPointerGetAttributes writes all of it. */
static_assert(sizeof(struct cudaPointerAttributes) == 2 * sizeof(int) + 2 * sizeof(void *) + 8 * sizeof(long),
              "cudaPointerAttributes changed: update tests/gpu/emu/cuda_runtime.h's copy");

namespace {

constexpr int kMaxGpus = 16;

struct Capture;

/* One unit of queued work. A wait op carries the (stream, position) its
 * event stood for when the wait was queued. */
struct Op {
    std::string what;
    std::function<void()> fn;
    std::function<bool()> poll; /* instead of fn: work that may have to wait (a collective waiting for its peers) */
    bool started = false;
    struct Stream *wait_stream = nullptr;
    uint64_t wait_pos = 0;
};

struct Stream {
    int device = 0;
    std::deque<Op> q;
    uint64_t issued = 0, done = 0; /* ops queued / run since creation */
    bool destroyed = false;
    std::shared_ptr<Capture> cap;  /* the capture this stream records into */
    uint64_t cap_ops = 0;          /* ops recorded into cap by this stream */
    uint64_t cap_observed = 0;     /* how many of them the capture's origin waited for */
};

struct Event {
    int device = 0;
    Stream *stream = nullptr; /* where last recorded outside a capture */
    uint64_t pos = 0;         /* ...and the stream's position then */
    std::shared_ptr<Capture> cap; /* where last recorded inside a capture */
    Stream *cap_stream = nullptr;
    uint64_t cap_ops = 0;
};

struct Block {
    char *base;
    size_t size, mapped;
    int device;
    bool device_mem; /* false: pinned host memory */
};

struct Graph {
    std::vector<Op> nodes;
    std::vector<std::shared_ptr<void>> owned; /* memory the capture allocated */
};

struct Capture {
    Stream *origin;
    pthread_t thread;
    bool invalid = false;
    std::string why;
    std::shared_ptr<Graph> g = std::make_shared<Graph>();
    std::vector<Stream *> joined;
};

std::recursive_mutex G; /* every call: the fake is one device queue, run by whoever waits */
std::map<uintptr_t, Block> blocks; /* by base address */
/* never destroyed: a destroyed stream stays known (a stale handle is
 * recognised), and the leak checker, which runs after static destructors,
 * must still reach every stream from here */
std::vector<Stream *> &streams = *new std::vector<Stream *>;
size_t used[kMaxGpus];
size_t capacity = (size_t)8 << 30;
int ngpus = -1;
int visible_map[kMaxGpus]; /* runtime index -> fake GPU */
bool peer_enabled[kMaxGpus][kMaxGpus];
int running = 0; /* nesting of queued work running: device memory is accessible while > 0 */
bool trace = false;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current = 0;
thread_local std::shared_ptr<Capture> thread_cap; /* the capture this thread began */

cudaError_t set_err(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

/* One line on stderr saying why a call was refused or what failed. */
__attribute__((format(printf, 1, 2))) void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fake GPU: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

bool protect = true;
void protect_all(int prot) {
    if (!protect) return;
    for (auto &kv : blocks)
        if (kv.second.device_mem && mprotect(kv.second.base, kv.second.mapped, prot) != 0) {
            perror("fake GPU: mprotect");
            abort();
        }
}

/* The SIGSEGV handler: a host access of device memory names the block. */
struct sigaction prev_segv;
void on_segv(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (auto &kv : blocks) {
        const Block &b = kv.second;
        if (b.device_mem && a >= kv.first && a < kv.first + b.mapped) {
            char msg[256];
            int n = snprintf(msg, sizeof msg,
                             "fake GPU: the host touched device memory at %p: byte %zu of a %zu-byte block of "
                             "cuda:%d (a host read or write of GPU memory: an illegal access on a real GPU)\n",
                             si->si_addr, (size_t)(a - kv.first), b.size, b.device);
            if (write(2, msg, (size_t)n) < 0) {
            }
            break;
        }
    }
    sigaction(SIGSEGV, &prev_segv, NULL);
    (void)sig, (void)uc; /* returning re-runs the access under the previous handler */
}

void init_locked() {
    if (ngpus >= 0) return;
    const char *n = getenv("LK_FAKE_GPUS");
    int total = n && *n ? atoi(n) : 2;
    if (total < 0) total = 0;
    if (total > kMaxGpus) total = kMaxGpus;
    const char *m = getenv("LK_FAKE_GPU_MEM");
    if (m && *m) capacity = strtoull(m, NULL, 0);
    trace = getenv("LK_FAKE_GPU_TRACE") && atoi(getenv("LK_FAKE_GPU_TRACE"));
    protect = !getenv("LK_FAKE_GPU_PROTECT") || atoi(getenv("LK_FAKE_GPU_PROTECT"));
    ngpus = 0;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) {
        for (int i = 0; i < total; i++) visible_map[ngpus++] = i;
    } else { /* the runtime stops at the first entry that is not a valid index */
        const char *p = vis;
        while (*p && ngpus < kMaxGpus) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= total) break;
            visible_map[ngpus++] = (int)v;
            p = *end == ',' ? end + 1 : end;
            if (*end != ',') break;
        }
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, &prev_segv);
}

bool valid_stream(cudaStream_t s) {
    Stream *p = (Stream *)s;
    for (Stream *q : streams)
        if (q == p) return !p->destroyed;
    return false;
}

const Block *find_block(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return nullptr;
    --it;
    const Block &b = it->second;
    if (a >= it->first && a + n <= it->first + b.size && a + (n ? n : 1) > a) return &b;
    return nullptr;
}

bool is_dev(const void *p, size_t n) {
    const Block *b = find_block(p, n);
    return b && b->device_mem;
}
bool is_pinned(const void *p, size_t n) {
    const Block *b = find_block(p, n);
    return b && !b->device_mem;
}

bool run_until(Stream *s, uint64_t pos);

/* Runs the front op of s; false when it cannot complete yet: it waits for
 * a stream that is itself held up, or it is polled work (fake_nccl.cpp's
 * collectives) whose peers have not arrived. It then stays at the front. */
bool run_one(Stream *s) {
    Op &front = s->q.front();
    if (front.wait_stream && !run_until(front.wait_stream, front.wait_pos)) return false;
    front.wait_stream = nullptr;
    if (trace && !front.started)
        fprintf(stderr, "fake GPU: cuda:%d stream %p runs %s\n", s->device, (void *)s, front.what.c_str());
    front.started = true;
    if (front.poll) {
        if (!front.poll()) return false;
        s->q.pop_front();
    } else {
        Op op = std::move(front);
        s->q.pop_front();
        if (op.fn) op.fn();
    }
    s->done++;
    return true;
}

int depth = 0;
/* Runs s up to position pos, as far as it can: true when it got there.
 * Device memory is accessible while queued work runs: opened once by the
 * outermost run (one mprotect per block), closed when it ends. */
bool run_until(Stream *s, uint64_t pos) {
    if (s->done >= pos || s->q.empty()) return true;
    if (++depth > 10000) {
        fprintf(stderr, "fake GPU: streams wait for each other in a cycle (a deadlock on a real GPU)\n");
        abort();
    }
    if (running++ == 0) protect_all(PROT_READ | PROT_WRITE);
    bool ok = true;
    while (ok && s->done < pos && !s->q.empty()) ok = run_one(s);
    if (--running == 0) protect_all(PROT_NONE);
    depth--;
    return ok;
}

/* Runs the streams of one GPU (dev >= 0) or all of them as far as they
 * can go: true when every queue is empty. */
bool run_streams(int dev) {
    bool idle = true;
    for (Stream *s : streams)
        if ((dev < 0 || s->device == dev) && !run_until(s, s->issued)) idle = false;
    return idle;
}

/* What a blocking call does: runs queued work until `done` holds. Only
 * polled work can hold it up, and that waits for other processes (a
 * peer's collective), never for this one, so holding G while waiting
 * cannot deadlock; it waits as long as the real call would (forever, if a
 * peer never comes: the library's own timeout must never let it). */
template <class F> void block(F done) {
    while (!done()) usleep(20);
}
void sync_stream(Stream *s) {
    block([s] { return run_until(s, s->issued); });
}
void run_device(int dev) {
    block([dev] { return run_streams(dev); });
}
void run_all() {
    block([] { return run_streams(-1); });
}

/* A call the calling thread's capture cannot record: refused, and the
 * capture invalidated (as the runtime does in thread-local mode). */
bool refused_in_capture(const char *what) {
    if (!thread_cap) return false;
    if (!thread_cap->invalid) thread_cap->invalid = true, thread_cap->why = what;
    say("%s refused: the calling thread is capturing a graph (capture invalidated)", what);
    set_err(cudaErrorStreamCaptureUnsupported);
    return true;
}

/* The legacy stream (NULL) and streams that do not exist are refused,
 * saying which call used them. */
cudaError_t check_stream(cudaStream_t st, const char *what) {
    if (!st) {
        say("%s on the legacy stream (NULL): lockstep must use its own streams", what);
        return set_err(cudaErrorInvalidResourceHandle);
    }
    if (!valid_stream(st)) {
        say("%s on a stream that does not exist (destroyed, or not a stream)", what);
        return set_err(cudaErrorInvalidResourceHandle);
    }
    return cudaSuccess;
}

/* Queues op on s, or records it when s captures. */
cudaError_t enqueue(cudaStream_t st, Op op) {
    if (cudaError_t bad = check_stream(st, op.what.c_str())) return bad;
    Stream *s = (Stream *)st;
    if (s->cap) {
        if (s->cap->invalid) return set_err(cudaErrorStreamCaptureInvalidated);
        if (op.poll) {
            say("%s in a capture: not modelled by the fake GPU", op.what.c_str());
            return set_err(cudaErrorStreamCaptureUnsupported);
        }
        s->cap->g->nodes.push_back(std::move(op));
        s->cap_ops++;
        return cudaSuccess;
    }
    s->q.push_back(std::move(op));
    s->issued++;
    return cudaSuccess;
}

cudaError_t enqueue(cudaStream_t st, const char *what, std::function<void()> fn) {
    Op op;
    op.what = what;
    op.fn = std::move(fn);
    return enqueue(st, std::move(op));
}

void *map_block(size_t bytes, int device, bool device_mem) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t mapped = (bytes + page - 1) / page * page;
    if (!mapped) mapped = page;
    int prot = device_mem && running == 0 && protect ? PROT_NONE : PROT_READ | PROT_WRITE;
    void *p = mmap(NULL, mapped, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    blocks[(uintptr_t)p] = Block{(char *)p, bytes ? bytes : 1, mapped, device, device_mem};
    if (device_mem) used[device] += mapped;
    return p;
}

void unmap_block(void *p) {
    auto it = blocks.find((uintptr_t)p);
    if (it == blocks.end()) return;
    if (it->second.device_mem) used[it->second.device] -= it->second.mapped;
    munmap(it->second.base, it->second.mapped);
    blocks.erase(it);
}

} // namespace

/* ---- fake.h ---- */
int lk_fake_enqueue(void *s, const char *what, std::function<void()> fn) {
    std::lock_guard<std::recursive_mutex> l(G);
    return (int)enqueue((cudaStream_t)s, what, std::move(fn));
}

int lk_fake_enqueue_poll(void *s, const char *what, std::function<bool()> step) {
    std::lock_guard<std::recursive_mutex> l(G);
    Op op;
    op.what = what;
    op.poll = std::move(step);
    return (int)enqueue((cudaStream_t)s, std::move(op));
}

bool lk_fake_progress(void *st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!valid_stream((cudaStream_t)st)) return true;
    Stream *s = (Stream *)st;
    return run_until(s, s->issued);
}

int lk_fake_stream_gpu(void *st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!st || !valid_stream((cudaStream_t)st)) return -1;
    return visible_map[((Stream *)st)->device];
}

int lk_fake_current_gpu(void) {
    std::lock_guard<std::recursive_mutex> l(G);
    init_locked();
    return visible_map[current];
}

bool lk_fake_is_device(const void *p, size_t n, int *device) {
    std::lock_guard<std::recursive_mutex> l(G);
    const Block *b = find_block(p, n);
    if (!b || !b->device_mem) return false;
    if (device) *device = b->device;
    return true;
}

/* ---- the runtime ---- */
extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
    std::lock_guard<std::recursive_mutex> l(G);
    init_locked();
    *count = ngpus;
    return ngpus ? cudaSuccess : set_err(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    std::lock_guard<std::recursive_mutex> l(G);
    init_locked();
    if (device < 0 || device >= ngpus) return set_err(cudaErrorInvalidDevice);
    current = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = current;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (fake GPU)";
    case cudaErrorMemoryAllocation: return "out of memory (fake GPU)";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (fake GPU)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (fake GPU)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle (fake GPU)";
    case cudaErrorNotReady: return "device not ready (fake GPU)";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing (fake GPU)";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture (fake GPU)";
    case cudaErrorStreamCaptureUnjoined: return "capture was not joined back to the origin stream (fake GPU)";
    case cudaErrorStreamCaptureIsolation: return "dependency on uncaptured work (fake GPU)";
    case cudaErrorStreamCaptureUnmatched: return "capture end on a stream that did not begin it (fake GPU)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (fake GPU)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (fake GPU)";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled (fake GPU)";
    default: return "error (fake GPU)";
    }
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> l(G);
    *p = NULL;
    if (refused_in_capture("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
    if (used[current] + bytes > capacity) return set_err(cudaErrorMemoryAllocation);
    *p = map_block(bytes, current, true);
    return *p ? cudaSuccess : set_err(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *p) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (refused_in_capture("cudaFree")) return cudaErrorStreamCaptureUnsupported;
    if (!p) return cudaSuccess;
    if (!is_dev(p, 1) || !blocks.count((uintptr_t)p)) {
        say("cudaFree of %p: not the start of a device block", p);
        return set_err(cudaErrorInvalidValue);
    }
    run_all(); /* cudaFree waits for the device */
    unmap_block(p);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    *p = NULL;
    if (!st || !valid_stream(st)) return set_err(cudaErrorInvalidResourceHandle);
    Stream *s = (Stream *)st;
    if (used[s->device] + bytes > capacity) return set_err(cudaErrorMemoryAllocation);
    *p = map_block(bytes, s->device, true);
    if (!*p) return set_err(cudaErrorMemoryAllocation);
    if (s->cap) { /* a graph's allocation node: the memory belongs to the graph */
        void *q = *p;
        s->cap->g->owned.push_back(std::shared_ptr<void>(q, [](void *x) {
            std::lock_guard<std::recursive_mutex> l2(G);
            unmap_block(x);
        }));
    }
    return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *p, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!p) return cudaSuccess;
    if (!blocks.count((uintptr_t)p) || !is_dev(p, 1)) return set_err(cudaErrorInvalidValue);
    Stream *s = (Stream *)st;
    if (st && valid_stream(st) && s->cap) {
        for (auto &o : s->cap->g->owned)
            if (o.get() == p) { /* freed inside the graph: a free node, nothing to run */
                s->cap_ops++;
                return cudaSuccess;
            }
        /* freeing memory allocated outside the capture inside it: the graph would free it at every launch */
        s->cap->invalid = true, s->cap->why = "cudaFreeAsync of memory allocated outside the capture";
        return set_err(cudaErrorStreamCaptureUnsupported);
    }
    return enqueue(st, "cudaFreeAsync", [p] { unmap_block(p); });
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> l(G);
    (void)flags;
    *p = map_block(bytes, -1, false);
    return *p ? cudaSuccess : set_err(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!p) return cudaSuccess;
    if (!blocks.count((uintptr_t)p) || is_dev(p, 1)) return set_err(cudaErrorInvalidValue);
    run_all(); /* pending copies may still read it */
    unmap_block(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    std::lock_guard<std::recursive_mutex> l(G);
    *total = capacity;
    *free_b = capacity - used[current];
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    std::lock_guard<std::recursive_mutex> l(G);
    memset(a, 0, sizeof *a);
    const Block *b = find_block(p, 1);
    if (b && b->device_mem) {
        a->type = cudaMemoryTypeDevice, a->device = b->device, a->devicePointer = (void *)p;
    } else if (b) {
        a->type = cudaMemoryTypeHost, a->device = current, a->devicePointer = (void *)p, a->hostPointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeUnregistered, a->device = -2;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (n == 0) return cudaSuccess;
    bool dd = is_dev(dst, n), sd = is_dev(src, n);
    bool dp = is_pinned(dst, n), sp = is_pinned(src, n);
    if (kind == cudaMemcpyDefault) kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                             : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    bool ok = (kind == cudaMemcpyHostToDevice && dd && !sd) || (kind == cudaMemcpyDeviceToHost && sd && !dd) ||
              (kind == cudaMemcpyDeviceToDevice && sd && dd);
    if (!ok) {
        say("cudaMemcpyAsync: the kind does not match the pointers (or a range leaves its device block)");
        return set_err(cudaErrorInvalidValue);
    }
    bool pageable = (kind == cudaMemcpyHostToDevice && !sp) || (kind == cudaMemcpyDeviceToHost && !dp);
    Stream *s = (Stream *)st;
    if (pageable && st && valid_stream(st) && s->cap) {
        s->cap->invalid = true, s->cap->why = "a copy with pageable host memory";
        say("cudaMemcpyAsync with pageable host memory in a capture: refused (capture invalidated)");
        return set_err(cudaErrorStreamCaptureUnsupported);
    }
    Op op;
    op.what = kind == cudaMemcpyHostToDevice ? "copy host to device" : kind == cudaMemcpyDeviceToHost ? "copy device to host" : "copy device to device";
    if (kind == cudaMemcpyHostToDevice && pageable) { /* staged now: the caller may reuse src at once */
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        op.fn = [dst, staged] { memcpy(dst, staged->data(), staged->size()); };
    } else {
        op.fn = [dst, src, n] { memcpy(dst, src, n); };
    }
    cudaError_t e = enqueue(st, std::move(op));
    if (e == cudaSuccess && kind == cudaMemcpyDeviceToHost && pageable) { /* returns once the bytes are there */
        sync_stream(s);
    }
    return e;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (n == 0) return cudaSuccess;
    if (!is_dev(p, n)) {
        say("cudaMemsetAsync: not (all) device memory");
        return set_err(cudaErrorInvalidValue);
    }
    return enqueue(st, "memset", [p, v, n] { memset(p, v, n); });
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (n == 0) return cudaSuccess;
    int a = -1, b = -1;
    const Block *x = find_block(dst, n), *y = find_block(src, n);
    if (x && x->device_mem) a = x->device;
    if (y && y->device_mem) b = y->device;
    if (a != dd || b != sd) {
        say("cudaMemcpyPeerAsync: a pointer is not device memory of the GPU named");
        return set_err(cudaErrorInvalidValue);
    }
    return enqueue(st, "peer copy", [dst, src, n] { memcpy(dst, src, n); });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> l(G);
    (void)flags;
    Stream *s = new Stream;
    s->device = current;
    streams.push_back(s);
    *out = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!st || !valid_stream(st)) return set_err(cudaErrorInvalidResourceHandle);
    Stream *s = (Stream *)st;
    sync_stream(s); /* its queued work still completes */
    s->destroyed = true;       /* kept, so a stale handle is recognised */
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!st || !valid_stream(st)) return set_err(cudaErrorInvalidResourceHandle);
    if (refused_in_capture("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
    Stream *s = (Stream *)st;
    if (s->cap) return set_err(cudaErrorStreamCaptureUnsupported);
    sync_stream(s);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (refused_in_capture("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
    run_device(current);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> l(G);
    (void)flags;
    Event *ev = new Event;
    ev->device = current;
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> l(G);
    delete (Event *)e; /* a queued wait holds the position, not the event */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (cudaError_t bad = check_stream(st, "cudaEventRecord")) return bad;
    Event *ev = (Event *)e;
    Stream *s = (Stream *)st;
    if (ev->device != s->device) {
        say("cudaEventRecord: the event and the stream belong to different GPUs");
        return set_err(cudaErrorInvalidResourceHandle);
    }
    if (s->cap) {
        ev->cap = s->cap, ev->cap_stream = s, ev->cap_ops = s->cap_ops;
        ev->stream = nullptr;
    } else {
        ev->cap = nullptr;
        ev->stream = s, ev->pos = s->issued;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> l(G);
    (void)flags;
    if (cudaError_t bad = check_stream(st, "cudaStreamWaitEvent")) return bad;
    Stream *s = (Stream *)st;
    Event *ev = (Event *)e;
    if (ev->cap) { /* an event of a capture: s joins it (or, already in it, orders within the graph) */
        if (s->cap && s->cap != ev->cap) return set_err(cudaErrorStreamCaptureMerge);
        if (!s->cap) {
            s->cap = ev->cap, s->cap_ops = 0, s->cap_observed = 0;
            ev->cap->joined.push_back(s);
        }
        if (ev->cap_stream != s && s == ev->cap->origin && ev->cap_stream->cap == ev->cap)
            ev->cap_stream->cap_observed = ev->cap_ops > ev->cap_stream->cap_observed ? ev->cap_ops : ev->cap_stream->cap_observed;
        return cudaSuccess; /* the graph's one list already orders it */
    }
    if (s->cap) { /* capturing, waiting for work outside the capture */
        if (!ev->stream || ev->stream->done >= ev->pos) return cudaSuccess; /* already complete: no dependency */
        s->cap->invalid = true, s->cap->why = "a wait for work outside the capture";
        say("cudaStreamWaitEvent: a capturing stream waits for uncaptured work (capture invalidated)");
        return set_err(cudaErrorStreamCaptureIsolation);
    }
    if (!ev->stream) return cudaSuccess; /* never recorded: nothing to wait for */
    Op op;
    op.what = "event wait";
    op.wait_stream = ev->stream, op.wait_pos = ev->pos;
    return enqueue(st, std::move(op));
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (refused_in_capture("cudaEventSynchronize")) return cudaErrorStreamCaptureUnsupported;
    Event *ev = (Event *)e;
    if (ev->cap) return set_err(cudaErrorStreamCaptureUnsupported);
    if (ev->stream) {
        Stream *s = ev->stream;
        uint64_t pos = ev->pos;
        block([s, pos] { return run_until(s, pos); });
    }
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> l(G);
    Event *ev = (Event *)e;
    if (ev->cap) return set_err(cudaErrorStreamCaptureUnsupported);
    if (ev->stream && ev->stream->done < ev->pos) {
        /* not yet: says so once, and makes progress, so a polling loop ends */
        run_until(ev->stream, ev->pos);
        return cudaErrorNotReady;
    }
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    (void)a, (void)b;
    *ms = 0.001f; /* no timing here */
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int a, int b) {
    std::lock_guard<std::recursive_mutex> l(G);
    init_locked();
    if (a < 0 || b < 0 || a >= ngpus || b >= ngpus) return set_err(cudaErrorInvalidDevice);
    *can = a != b;
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
    std::lock_guard<std::recursive_mutex> l(G);
    (void)flags;
    if (peer < 0 || peer >= ngpus || peer == current) return set_err(cudaErrorInvalidDevice);
    if (peer_enabled[current][peer]) return set_err(cudaErrorPeerAccessAlreadyEnabled);
    peer_enabled[current][peer] = true;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    std::lock_guard<std::recursive_mutex> l(G);
    init_locked();
    if (device < 0 || device >= ngpus) return set_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "lockstep fake GPU %d", visible_map[device]);
    p->major = 9, p->minor = 0, p->multiProcessorCount = 2;
    p->totalGlobalMem = capacity;
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, enum cudaStreamCaptureMode mode) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!st || !valid_stream(st)) return set_err(cudaErrorInvalidResourceHandle);
    if (mode != cudaStreamCaptureModeThreadLocal) {
        say("cudaStreamBeginCapture: the fake models thread-local capture only");
        return set_err(cudaErrorInvalidValue);
    }
    Stream *s = (Stream *)st;
    if (s->cap) return set_err(cudaErrorIllegalState);
    if (thread_cap) return set_err(cudaErrorIllegalState);
    auto c = std::make_shared<Capture>();
    c->origin = s;
    c->thread = pthread_self();
    s->cap = c, s->cap_ops = 0, s->cap_observed = 0;
    thread_cap = c;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, enum cudaStreamCaptureStatus *out) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!st || !valid_stream(st)) return set_err(cudaErrorInvalidResourceHandle);
    Stream *s = (Stream *)st;
    *out = !s->cap ? cudaStreamCaptureStatusNone
                   : s->cap->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *g) {
    std::lock_guard<std::recursive_mutex> l(G);
    *g = NULL;
    if (!st || !valid_stream(st)) return set_err(cudaErrorInvalidResourceHandle);
    Stream *s = (Stream *)st;
    std::shared_ptr<Capture> c = s->cap;
    if (!c) return set_err(cudaErrorIllegalState);
    if (c->origin != s) return set_err(cudaErrorStreamCaptureUnmatched);
    if (!pthread_equal(c->thread, pthread_self())) return set_err(cudaErrorStreamCaptureWrongThread);
    bool unjoined = false;
    for (Stream *j : c->joined)
        if (j->cap == c && j->cap_ops > j->cap_observed) unjoined = true;
    for (Stream *j : c->joined)
        if (j->cap == c) j->cap = nullptr;
    s->cap = nullptr;
    if (thread_cap == c) thread_cap = nullptr;
    if (c->invalid) return set_err(cudaErrorStreamCaptureInvalidated);
    if (unjoined) {
        say("cudaStreamEndCapture: a stream that joined the capture did not join back to its origin");
        return set_err(cudaErrorStreamCaptureUnjoined);
    }
    *g = (cudaGraph_t) new std::shared_ptr<Graph>(c->g);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
    std::lock_guard<std::recursive_mutex> l(G);
    (void)flags;
    if (!g) return set_err(cudaErrorInvalidValue);
    *x = (cudaGraphExec_t) new std::shared_ptr<Graph>(*(std::shared_ptr<Graph> *)g);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    std::lock_guard<std::recursive_mutex> l(G);
    delete (std::shared_ptr<Graph> *)g;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    std::lock_guard<std::recursive_mutex> l(G);
    run_all(); /* a launch still queued keeps its graph */
    delete (std::shared_ptr<Graph> *)x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t st) {
    std::lock_guard<std::recursive_mutex> l(G);
    if (!x) return set_err(cudaErrorInvalidValue);
    if (st && valid_stream(st) && ((Stream *)st)->cap) {
        say("cudaGraphLaunch into a capturing stream: not modelled");
        return set_err(cudaErrorStreamCaptureUnsupported);
    }
    std::shared_ptr<Graph> g = *(std::shared_ptr<Graph> *)x;
    Op op;
    op.what = "graph launch";
    op.fn = [g] {
        for (Op &n : g->nodes) {
            if (trace) fprintf(stderr, "fake GPU:   graph node %s\n", n.what.c_str());
            if (n.fn) n.fn();
        }
    };
    return enqueue(st, std::move(op));
}

} // extern "C"
