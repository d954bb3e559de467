/* The cuda device kind: GPU memory through the CUDA runtime (cudaMalloc,
 * cudaMemcpyAsync, cudaMemsetAsync), each GPU's compute stream (gpu.h's
 * lk__cuda_stream: every kernel, GEMM, copy and memset of the GPU goes on
 * it), synchronisation, streams and events, graph capture of the compute
 * stream, pinned host staging buffers, and the GPUs' properties for
 * `lockstep env`. It fills the
 * device vtable of lockstep/device.h and registers as kind LK_CUDA, lazily
 * (lk__cuda_register) and only when the runtime shows a GPU. The tensor
 * layer's pool keyed by device caches the memory, so a repeated step calls
 * cudaMalloc nothing. The built-in list (backend/builtin.c) registers this
 * kind together with the cuda backend (backend/cuda/backend.c) that runs the
 * typed ops on this memory; this file names nothing of the backend.
 * Without LK_HAVE_CUDA this file is a stub that reports no GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/gpu.h"

#ifdef LK_HAVE_CUDA
#include <cuda_runtime_api.h>

bool lk__cuda_built(void) { return true; }

static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int visible;
static char why_none[256];

static void count_devices(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver, no device, a driver older than the runtime: all mean
         * "no GPU here". Kept for `lockstep env` and error messages, not
         * printed: CPU runs on GPU-less machines must stay quiet. */
        n = 0;
        if (e == cudaErrorNoDevice)
            snprintf(why_none, sizeof why_none, "no CUDA device visible (CUDA_VISIBLE_DEVICES=%s)",
                     getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
        else if (e == cudaErrorInsufficientDriver)
            snprintf(why_none, sizeof why_none, "no CUDA device visible (driver not loaded or older than CUDA %d.%d)",
                     CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
        else
            snprintf(why_none, sizeof why_none, "no CUDA device visible (%s)", cudaGetErrorString(e));
        cudaGetLastError(); /* empty the runtime's last-error slot so later calls start clean */
    } else if (n == 0) {
        snprintf(why_none, sizeof why_none, "no CUDA device visible");
    }
    visible = n;
}

int lk__cuda_visible(void) {
    pthread_once(&count_once, count_devices);
    return visible;
}

const char *lk__cuda_why_none(void) {
    lk__cuda_visible();
    return why_none;
}

/* Every method first makes `index` the calling thread's current device:
 * the runtime's current device is per thread, and the trainer's threads
 * (dp replicas, the comm thread) each call in. cudaSetDevice on the device
 * already current costs nothing measurable. */
static lk_status use(int index, const char *what) {
    cudaError_t e = cudaSetDevice(index);
    if (e != cudaSuccess)
        return lk_error(LK_STATUS_DEVICE, "cuda:%d: %s: cannot select the device: %s", index, what, cudaGetErrorString(e));
    return LK_STATUS_OK;
}

static lk_status fail(cudaError_t e, int index, const char *what, size_t bytes) {
    cudaGetLastError();
    return lk_error(LK_STATUS_DEVICE, "cuda:%d: %s of %zu bytes failed: %s", index, what, bytes, cudaGetErrorString(e));
}

static int cuda_count(void *ctx) { return (void)ctx, lk__cuda_visible(); }

/* ---- the compute stream and graph capture ------------------------------------
 * One non-blocking stream per GPU, made on first use from whichever thread
 * asks (lazy.c makes it once). It lives as long as the process: there is
 * no library teardown to destroy it in, and the driver releases it with
 * the context. Non-blocking: the legacy stream 0 cannot be captured into a
 * graph and serialises with every blocking stream; nothing here uses it,
 * so the order between the compute stream and every other stream (the
 * prefetch's copy stream, NCCL's, another GPU's) is the events that the
 * code below and comm_nccl.c record. */
static lk__lazy_table streams = LK__LAZY_TABLE_INIT;

static lk_status make_stream(void *ctx, int index, void **out) {
    (void)ctx;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) cudaGetLastError(), prev = -1;
    LK_TRY(use(index, "compute stream"));
    cudaStream_t s = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    /* a stream belongs to the device current at its creation; the caller's current device is put back */
    if (prev >= 0 && prev != index) cudaSetDevice(prev);
    if (e != cudaSuccess) return fail(e, index, "creating its compute stream (cudaStreamCreateWithFlags)", 0);
    *out = s;
    return LK_STATUS_OK;
}

lk_status lk__cuda_stream(int device, cudaStream_t *out) {
    void *h = NULL;
    lk_status st = lk__lazy_get(&streams, device, make_stream, NULL, &h);
    *out = (cudaStream_t)h;
    return st;
}

/* For the kernel files (common.cuh's lk_cu_stream): the current device's
 * stream. backend.c's run made it (lk__cuda_stream, which reports a
 * failure) before any launcher runs, so this finds it. NULL when it cannot
 * be made here (not reachable through the backend): each launcher checks
 * for that first (LK_CU_REQUIRE_STREAM) and fails, since a NULL stream
 * would be the legacy one. */
cudaStream_t lk__cuda_stream_current(void) {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) cudaGetLastError(), d = 0;
    void *h = lk__lazy_peek(&streams, d);
    if (h) return (cudaStream_t)h;
    cudaStream_t s = NULL;
    return lk__cuda_stream(d, &s) ? NULL : s;
}

/* Capture state per GPU. `thread_capture` is the GPU the calling thread is
 * capturing (-1: none): captures are cudaStreamCaptureModeThreadLocal, so
 * only the capturing thread's own synchronous calls are refused; another
 * thread (the loader, the comm thread) may still allocate. */
static _Thread_local int thread_capture = -1;
static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool active;      /* between graph_begin and graph_end */
    bool ended;       /* a refused call ended it early; graph_end reports why */
    char why[512];
} cap[LK__GPU_MAX];

bool lk__cuda_capturing(int device) { return device >= 0 && thread_capture == device; }

static void end_capture_now(int device) {
    cudaStream_t s = (cudaStream_t)lk__lazy_peek(&streams, device);
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (s && cudaStreamIsCapturing(s, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone) {
        cudaGraph_t g = NULL;
        /* ends an invalidated capture too (then with an error and no graph) */
        (void)cudaStreamEndCapture(s, &g);
        if (g) cudaGraphDestroy(g);
    }
    cudaGetLastError();
}

lk_status lk__cuda_capture_refuse(int device, const char *what, int e) {
    cudaGetLastError();
    /* Only the capturing thread ends the capture (a thread-local capture
     * must end on the thread that began it); a refusal the runtime reports
     * on another thread is just that thread's error. */
    bool ends = device >= 0 && device < LK__GPU_MAX && thread_capture == device;
    char msg[512];
    snprintf(msg, sizeof msg,
             "cuda:%d: %s is not allowed while capturing a graph (it needs the host to wait for work that is only "
             "being recorded%s%s)%s",
             device, what, e ? ": " : "", e ? cudaGetErrorString((cudaError_t)e) : "",
             ends ? "; the capture was ended" : "");
    if (ends) {
        end_capture_now(device);
        pthread_mutex_lock(&cap_mu);
        if (cap[device].active && !cap[device].ended) {
            cap[device].ended = true;
            snprintf(cap[device].why, sizeof cap[device].why, "%s", msg);
        }
        pthread_mutex_unlock(&cap_mu);
        thread_capture = -1;
    }
    return lk_error(LK_STATUS_INVALID_USAGE, "%s", msg);
}

/* Whether e is the runtime refusing a call because of a capture. */
static bool capture_error(cudaError_t e) {
    return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
           e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureWrongThread ||
           e == cudaErrorStreamCaptureUnmatched || e == cudaErrorStreamCaptureMerge ||
           e == cudaErrorStreamCaptureUnjoined || e == cudaErrorStreamCaptureIsolation;
}

/* fail(), but a capture refusal is said as one (and ends the capture). */
static lk_status fail_or_refused(cudaError_t e, int index, const char *what, size_t bytes) {
    if (capture_error(e)) return lk__cuda_capture_refuse(index, what, (int)e);
    return fail(e, index, what, bytes);
}

/* `index` current and its compute stream. */
static lk_status use_stream(int index, const char *what, cudaStream_t *s) {
    LK_TRY(use(index, what));
    return lk__cuda_stream(index, s);
}

static lk_status cuda_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx;
    *ptr = NULL;
    LK_TRY(use(index, "alloc"));
    /* cudaMalloc may synchronise the device: a capture cannot record it */
    if (lk__cuda_capturing(index)) {
        char what[96];
        snprintf(what, sizeof what, "an allocation of %zu bytes (cudaMalloc: the pool had no cached block)", bytes);
        return lk__cuda_capture_refuse(index, what, 0);
    }
    /* cudaMalloc aligns to 256 bytes, above the 64 the vtable promises. */
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        *ptr = NULL;
        return lk_error(LK_STATUS_OUT_OF_MEMORY,
                        "cuda:%d: out of device memory: asked for %zu bytes (%.2f GiB), %zu bytes (%.2f GiB) free of "
                        "%.2f GiB",
                        index, bytes, bytes / 1073741824.0, free_b, free_b / 1073741824.0, total_b / 1073741824.0);
    }
    if (e != cudaSuccess) {
        *ptr = NULL;
        return fail_or_refused(e, index, "cudaMalloc", bytes);
    }
    return LK_STATUS_OK;
}

static void cuda_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)bytes;
    if (use(index, "free")) return; /* cannot report from free; the error stays as last error */
    /* cudaFree synchronises the device, which a capture cannot record: the
     * capture ends here and graph_end reports it (free cannot) */
    if (lk__cuda_capturing(index)) (void)lk__cuda_capture_refuse(index, "a free of device memory (cudaFree)", 0);
    /* implicitly waits for the device, compute stream included: no kernel
     * still using the block can see it reused */
    cudaFree(ptr);
}

static lk_status cuda_memset(void *ctx, int index, void *ptr, int value, size_t bytes) {
    (void)ctx;
    cudaStream_t s;
    LK_TRY(use_stream(index, "memset", &s));
    /* on the compute stream, after the kernels that wrote before it and
     * before those that read after it; the host need not wait */
    cudaError_t e = cudaMemsetAsync(ptr, value, bytes, s);
    return e == cudaSuccess ? LK_STATUS_OK : fail_or_refused(e, index, "cudaMemsetAsync", bytes);
}

/* Copies on the compute stream, so they are ordered after the kernels
 * queued before them and before those queued after, as cudaMemcpy on the
 * legacy stream was. What the host sees when the call returns:
 *  - into host memory: the copy is complete (the stream is synchronised
 *    after it), since the caller reads the bytes at once;
 *  - from host memory: the source may be reused at once. For pageable
 *    memory cudaMemcpyAsync returns only after the bytes are staged out of
 *    the caller's buffer (the runtime's documented pageable behaviour); for
 *    pinned memory the DMA may still be reading it, so the stream is
 *    synchronised after the copy, as the vtable's "complete when they
 *    return" asks (the prefetch's asynchronous copies have their own path);
 *  - within the device: queued, complete in stream order (no host buffer
 *    is involved, so nothing for the host to wait for).
 * While the calling thread captures, the first two are refused: a graph
 * would replay them later, against host memory the caller owns now. */
static bool is_pinned(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}

static lk_status copy_kind(int index, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                           const char *what) {
    cudaStream_t s;
    LK_TRY(use_stream(index, what, &s));
    if (kind != cudaMemcpyDeviceToDevice && lk__cuda_capturing(index)) {
        char w[96];
        snprintf(w, sizeof w, "a %s of %zu bytes", what, bytes);
        return lk__cuda_capture_refuse(index, w, 0);
    }
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
    bool wait = kind == cudaMemcpyDeviceToHost || (kind == cudaMemcpyHostToDevice && is_pinned(src));
    if (e == cudaSuccess && wait) e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? LK_STATUS_OK : fail_or_refused(e, index, what, bytes);
}
static lk_status cuda_to_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return (void)ctx, copy_kind(index, dst, src, bytes, cudaMemcpyDeviceToHost, "copy to host");
}
static lk_status cuda_from_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return (void)ctx, copy_kind(index, dst, src, bytes, cudaMemcpyHostToDevice, "copy from host");
}
static lk_status cuda_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return (void)ctx, copy_kind(index, dst, src, bytes, cudaMemcpyDeviceToDevice, "device copy");
}

/* Between two GPUs: cudaMemcpyPeerAsync on the destination's compute
 * stream, ordered by events with both GPUs' compute streams (cudaMemcpyPeer
 * would serialise only with their legacy streams, which nothing uses now):
 * the copy waits for the work queued on the source's stream (the producer
 * of src), and the source's stream waits for the copy before its later
 * work (which may overwrite src); the destination's later work follows it
 * on its own stream. So dp's sum on GPU 0 and replica k's next forward on
 * GPU k see the bytes. Peer access is enabled once per pair of GPUs that
 * cudaDeviceCanAccessPeer says can (both directions: dp copies gradients
 * to GPU 0 and parameters back): then the copy is one DMA over NVLink or
 * PCIe P2P. Without it (no P2P path, or enabling failed) the runtime still
 * copies, staged through host memory by the driver, so the answer is only
 * a speed, never an error. */
static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char peer_tried[LK__GPU_MAX][LK__GPU_MAX];

static void enable_peer(int a, int b) {
    if (a == b || a < 0 || b < 0 || a >= LK__GPU_MAX || b >= LK__GPU_MAX) return;
    pthread_mutex_lock(&peer_mu);
    if (!peer_tried[a][b]) {
        peer_tried[a][b] = peer_tried[b][a] = 1;
        int ab = 0, ba = 0;
        if (cudaDeviceCanAccessPeer(&ab, a, b) != cudaSuccess) ab = 0;
        if (cudaDeviceCanAccessPeer(&ba, b, a) != cudaSuccess) ba = 0;
        /* cudaErrorPeerAccessAlreadyEnabled (another library did it) is fine */
        if (ab && cudaSetDevice(a) == cudaSuccess) (void)cudaDeviceEnablePeerAccess(b, 0);
        if (ba && cudaSetDevice(b) == cudaSuccess) (void)cudaDeviceEnablePeerAccess(a, 0);
        cudaGetLastError();
    }
    pthread_mutex_unlock(&peer_mu);
}

static lk_status cuda_copy_peer(void *ctx, int dst_index, void *dst, int src_index, const void *src, size_t bytes) {
    (void)ctx;
    enable_peer(dst_index, src_index);
    if (lk__cuda_capturing(dst_index) || lk__cuda_capturing(src_index))
        return lk__cuda_capture_refuse(lk__cuda_capturing(dst_index) ? dst_index : src_index, "a copy between GPUs", 0);
    cudaStream_t ss, sd;
    cudaEvent_t produced = NULL, copied = NULL;
    LK_TRY(use_stream(src_index, "peer copy", &ss));
    LK_TRY(lk__cuda_stream(dst_index, &sd));
    /* an event belongs to the device current at its creation and is recorded on that device's stream */
    cudaError_t e = cudaEventCreateWithFlags(&produced, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(produced, ss);
    if (e == cudaSuccess) e = cudaSetDevice(dst_index);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(sd, produced, 0);
    if (e == cudaSuccess) e = cudaMemcpyPeerAsync(dst, dst_index, src, src_index, bytes, sd);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&copied, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(copied, sd);
    if (e == cudaSuccess) e = cudaSetDevice(src_index);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(ss, copied, 0);
    /* destroying an event a stream still waits for is allowed: its resources go once it completes */
    if (produced) cudaEventDestroy(produced);
    if (copied) cudaEventDestroy(copied);
    if (e == cudaSuccess) e = cudaSetDevice(dst_index);
    if (e == cudaSuccess) return LK_STATUS_OK;
    cudaGetLastError();
    return lk_error(LK_STATUS_DEVICE, "cuda:%d: peer copy of %zu bytes from cuda:%d failed: %s", dst_index, bytes,
                    src_index, cudaGetErrorString(e));
}

static lk_status cuda_sync(void *ctx, int index) {
    (void)ctx;
    LK_TRY(use(index, "synchronize"));
    if (lk__cuda_capturing(index)) return lk__cuda_capture_refuse(index, "synchronize", 0);
    /* every stream of the device: the compute stream, the prefetch's and NCCL's */
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        if (capture_error(e)) return lk__cuda_capture_refuse(index, "synchronize", (int)e);
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "cuda:%d: synchronize: %s (an earlier kernel or copy failed)", index,
                        cudaGetErrorString(e));
    }
    return LK_STATUS_OK;
}

/* lk_stream and lk_event are the runtime's own handles, cast: nothing to
 * wrap, so creating one allocates nothing on the host. A NULL lk_stream is
 * the GPU's compute stream (never the legacy stream 0). */
static lk_status stream_or_compute(int index, lk_stream *s, cudaStream_t *out) {
    if (s) {
        *out = (cudaStream_t)s;
        return LK_STATUS_OK;
    }
    return lk__cuda_stream(index, out);
}

static lk_status cuda_stream_create(void *ctx, int index, lk_stream **out) {
    (void)ctx;
    *out = NULL;
    LK_TRY(use(index, "stream_create"));
    cudaStream_t s;
    /* non-blocking, as the compute stream: a blocking stream would
     * serialise with the legacy stream that other libraries may use */
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return fail(e, index, "cudaStreamCreate", 0);
    *out = (lk_stream *)s;
    return LK_STATUS_OK;
}
static void cuda_stream_free(void *ctx, int index, lk_stream *s) {
    (void)ctx;
    if (s && !use(index, "stream_free")) cudaStreamDestroy((cudaStream_t)s);
}
static lk_status cuda_event_record(void *ctx, int index, lk_stream *s, lk_event **out) {
    (void)ctx;
    *out = NULL;
    LK_TRY(use(index, "event_record"));
    cudaStream_t cs;
    LK_TRY(stream_or_compute(index, s, &cs));
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return fail(e, index, "cudaEventCreate", 0);
    e = cudaEventRecord(ev, cs);
    if (e != cudaSuccess) {
        cudaEventDestroy(ev);
        return fail(e, index, "cudaEventRecord", 0);
    }
    *out = (lk_event *)ev;
    return LK_STATUS_OK;
}
static lk_status cuda_event_wait(void *ctx, int index, lk_stream *s, lk_event *ev) {
    (void)ctx;
    LK_TRY(use(index, "event_wait"));
    cudaStream_t cs;
    LK_TRY(stream_or_compute(index, s, &cs));
    cudaError_t e = cudaStreamWaitEvent(cs, (cudaEvent_t)ev, 0);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, "cudaStreamWaitEvent", 0);
}
static void cuda_event_free(void *ctx, int index, lk_event *ev) {
    (void)ctx, (void)index;
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

/* ---- prefetch: pinned host memory and asynchronous copies in ----------------
 * The trainer's batch prefetch (train/prefetch.c) copies the next batch on
 * a stream of its own (cuda_stream_create: non-blocking, as the compute
 * stream every kernel and copy runs on). Nothing orders the two streams
 * but events: the prefetch records an event on stream NULL (the compute
 * stream) and makes the copy stream wait for it before writing device
 * blocks that earlier steps' kernels may still read, and records an event
 * on the copy stream that the compute stream waits for (event_wait on
 * NULL) before the step's first kernel reads the batch. cudaMemcpyAsync is asynchronous only
 * from pinned memory (from pageable memory it stages through a driver
 * buffer first), hence the loader's buffers from host_alloc. */
static lk_status cuda_host_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx, (void)index; /* portable pinned memory serves every GPU of the process */
    return lk__cuda_host_alloc(bytes, ptr);
}
static void cuda_host_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index, (void)bytes;
    lk__cuda_host_free(ptr);
}
static lk_status cuda_from_host_async(void *ctx, int index, lk_stream *s, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    LK_TRY(use(index, "async copy from host"));
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)s);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, "async copy from host", bytes);
}
static lk_status cuda_event_sync(void *ctx, int index, lk_event *ev) {
    (void)ctx;
    LK_TRY(use(index, "event_synchronize"));
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, "cudaEventSynchronize (an earlier copy failed)", 0);
}

/* ---- graph capture of the compute stream ----
 * cudaStreamCaptureModeThreadLocal: the capturing thread's own unsafe
 * calls are refused by the runtime (and by the checks above first, with a
 * sentence); other threads are not affected. The graph is instantiated at
 * graph_end and only the executable kept (it does not need the graph). */
static lk_status cuda_graph_begin(void *ctx, int index) {
    (void)ctx;
    cudaStream_t s;
    LK_TRY(use_stream(index, "graph capture", &s));
    if (index >= LK__GPU_MAX) return lk_error(LK_STATUS_INVALID_ARGUMENT, "cuda:%d: graph capture: index out of range", index);
    if (thread_capture >= 0)
        return lk_error(LK_STATUS_INVALID_USAGE, "cuda:%d: graph capture: this thread is already capturing cuda:%d",
                        index, thread_capture);
    pthread_mutex_lock(&cap_mu);
    bool busy = cap[index].active;
    if (!busy) cap[index].active = true, cap[index].ended = false, cap[index].why[0] = 0;
    pthread_mutex_unlock(&cap_mu);
    if (busy) return lk_error(LK_STATUS_INVALID_USAGE, "cuda:%d: graph capture: another capture of this device is in progress", index);
    cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        pthread_mutex_lock(&cap_mu);
        cap[index].active = false;
        pthread_mutex_unlock(&cap_mu);
        return fail(e, index, "cudaStreamBeginCapture", 0);
    }
    thread_capture = index;
    return LK_STATUS_OK;
}

static lk_status cuda_graph_end(void *ctx, int index, lk_graph **out) {
    (void)ctx;
    *out = NULL;
    if (index < 0 || index >= LK__GPU_MAX) return lk_error(LK_STATUS_INVALID_ARGUMENT, "cuda:%d: graph capture: index out of range", index);
    pthread_mutex_lock(&cap_mu);
    bool active = cap[index].active, ended = cap[index].ended;
    char why[512];
    snprintf(why, sizeof why, "%s", cap[index].why);
    cap[index].active = cap[index].ended = false;
    pthread_mutex_unlock(&cap_mu);
    if (!active) return lk_error(LK_STATUS_INVALID_USAGE, "cuda:%d: graph capture end: no capture of this device in progress", index);
    if (thread_capture == index) thread_capture = -1;
    if (ended) return lk_error(LK_STATUS_INVALID_USAGE, "cuda:%d: graph capture failed, no graph: %s", index, why);
    cudaStream_t s;
    LK_TRY(use_stream(index, "graph capture end", &s));
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (e != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        end_capture_now(index); /* whatever happened, the stream leaves capture mode */
        return fail(e, index, "cudaStreamEndCapture (the capture was invalidated)", 0);
    }
    cudaGraphExec_t x = NULL;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) return fail(e, index, "cudaGraphInstantiate", 0);
    *out = (lk_graph *)x;
    return LK_STATUS_OK;
}

static lk_status cuda_graph_launch(void *ctx, int index, lk_graph *g) {
    (void)ctx;
    cudaStream_t s;
    LK_TRY(use_stream(index, "graph launch", &s));
    if (lk__cuda_capturing(index))
        return lk_error(LK_STATUS_INVALID_USAGE, "cuda:%d: graph launch while this thread is capturing the device", index);
    cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)g, s);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, "cudaGraphLaunch", 0);
}

static void cuda_graph_free(void *ctx, int index, lk_graph *g) {
    (void)ctx;
    if (g && !use(index, "graph free")) cudaGraphExecDestroy((cudaGraphExec_t)g);
}

static const lk_device_vtable cuda_vt = {
    .name = "cuda",
    .host_addressable = false,
    .count = cuda_count,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memset = cuda_memset,
    .copy_to_host = cuda_to_host,
    .copy_from_host = cuda_from_host,
    .copy = cuda_copy,
    .synchronize = cuda_sync,
    .stream_create = cuda_stream_create,
    .stream_free = cuda_stream_free,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_free = cuda_event_free,
    .copy_peer = cuda_copy_peer,
    .host_alloc = cuda_host_alloc, /* prefetch */
    .host_free = cuda_host_free,
    .copy_from_host_async = cuda_from_host_async,
    .event_synchronize = cuda_event_sync,
    .graph_begin = cuda_graph_begin, /* graph capture */
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
};

lk_status lk__cuda_device_register(void) {
    if (lk__cuda_visible() == 0)
        return lk_error(LK_STATUS_UNSUPPORTED, "device 'cuda': %s", lk__cuda_why_none());
    lk_device_kind k;
    LK_TRY(lk_device_register(&cuda_vt, NULL, &k));
    if (k != LK_CUDA) return lk_error(LK_STATUS_INTERNAL, "device 'cuda' registered as kind %d, not %d", (int)k, LK_CUDA);
    return LK_STATUS_OK; /* its backend: the built-in list's lk__cuda_register (backend/builtin.c) */
}

lk_status lk__cuda_props_get(int index, lk__cuda_props *out) {
    memset(out, 0, sizeof *out);
    int n = lk__cuda_visible();
    if (index < 0 || index >= n)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "cuda:%d: this process sees %d CUDA device%s", index, n, n == 1 ? "" : "s");
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, index);
    if (e != cudaSuccess) return fail(e, index, "cudaGetDeviceProperties", 0);
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->major = p.major;
    out->minor = p.minor;
    out->multiprocessors = p.multiProcessorCount;
    out->mem_total = p.totalGlobalMem;
    LK_TRY(use(index, "memory info"));
    if (cudaMemGetInfo(&out->mem_free, &out->mem_total) != cudaSuccess) cudaGetLastError();
    return LK_STATUS_OK;
}

lk_status lk__cuda_host_alloc(size_t bytes, void **ptr) {
    *ptr = NULL;
    if (lk__cuda_visible() == 0) { /* pinning needs a driver; plain memory then */
        *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
        return *ptr ? LK_STATUS_OK : lk_error(LK_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
    }
    cudaError_t e = cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *ptr = NULL;
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "cannot pin %zu bytes of host memory for staging: %s", bytes,
                        cudaGetErrorString(e));
    }
    return LK_STATUS_OK;
}

void lk__cuda_host_free(void *ptr) {
    if (!ptr) return;
    if (lk__cuda_visible() == 0) lk_aligned_free(ptr);
    else cudaFreeHost(ptr);
}

#else /* !LK_HAVE_CUDA */

bool lk__cuda_built(void) { return false; }
int lk__cuda_visible(void) { return 0; }
const char *lk__cuda_why_none(void) { return "built without CUDA"; }
lk_status lk__cuda_device_register(void) {
    return lk_error(LK_STATUS_UNSUPPORTED, "device 'cuda': this build has no CUDA backend (configure with -DLK_CUDA=ON)");
}
lk_status lk__cuda_props_get(int index, lk__cuda_props *out) {
    memset(out, 0, sizeof *out);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "cuda:%d: this build has no CUDA backend", index);
}
lk_status lk__cuda_host_alloc(size_t bytes, void **ptr) {
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    return *ptr ? LK_STATUS_OK : lk_error(LK_STATUS_OUT_OF_MEMORY, "cannot allocate %zu bytes of host memory", bytes);
}
void lk__cuda_host_free(void *ptr) { lk_aligned_free(ptr); }
lk_status lk__cuda_stream(int device, struct CUstream_st **out) {
    *out = NULL;
    return lk_error(LK_STATUS_UNSUPPORTED, "cuda:%d: this build has no CUDA backend", device);
}
bool lk__cuda_capturing(int device) { return (void)device, false; }
lk_status lk__cuda_capture_refuse(int device, const char *what, int e) {
    (void)e;
    return lk_error(LK_STATUS_INVALID_USAGE, "cuda:%d: %s is not allowed while capturing a graph", device, what);
}

#endif
