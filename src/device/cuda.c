/* The cuda device kind: GPU memory through the CUDA runtime (cudaMalloc,
 * cudaMemcpy, cudaMemset), synchronisation, streams and events, pinned host
 * staging buffers, and the GPUs' properties for `lockstep env`. It fills the
 * device vtable of lockstep/device.h and registers as kind LK_CUDA, lazily
 * (lk__cuda_register) and only when the runtime shows a GPU. The tensor
 * layer's pool keyed by device caches the memory, so a repeated step calls
 * cudaMalloc nothing. Registering the kind also registers the cuda backend
 * (backend/cuda/backend.c) that runs the typed ops on this memory.
 * Without LK_HAVE_CUDA this file is a stub that reports no GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/gpu.h"

#ifdef LK_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_impl.h"

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

static lk_status cuda_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx;
    *ptr = NULL;
    LK_TRY(use(index, "alloc"));
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
        return fail(e, index, "cudaMalloc", bytes);
    }
    return LK_STATUS_OK;
}

static void cuda_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)bytes;
    if (use(index, "free")) return; /* cannot report from free; the error stays as last error */
    cudaFree(ptr);
}

static lk_status cuda_memset(void *ctx, int index, void *ptr, int value, size_t bytes) {
    (void)ctx;
    LK_TRY(use(index, "memset"));
    cudaError_t e = cudaMemset(ptr, value, bytes);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, "cudaMemset", bytes);
}

/* cudaMemcpy runs on the legacy default stream: ordered after earlier work
 * on the device and complete when it returns, as the vtable asks. */
static lk_status copy_kind(int index, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                           const char *what) {
    LK_TRY(use(index, what));
    cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, what, bytes);
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

/* Between two GPUs: cudaMemcpyPeer, serialised with pending and later work
 * on both devices (as cudaMemcpy between two pointers of one device is),
 * so dp's sum on GPU 0 and replica k's next forward on GPU k see the bytes.
 * Peer access is enabled once per pair of GPUs that
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
    LK_TRY(use(dst_index, "peer copy"));
    cudaError_t e = cudaMemcpyPeer(dst, dst_index, src, src_index, bytes);
    if (e == cudaSuccess) return LK_STATUS_OK;
    cudaGetLastError();
    return lk_error(LK_STATUS_DEVICE, "cuda:%d: peer copy of %zu bytes from cuda:%d failed: %s", dst_index, bytes,
                    src_index, cudaGetErrorString(e));
}

static lk_status cuda_sync(void *ctx, int index) {
    (void)ctx;
    LK_TRY(use(index, "synchronize"));
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "cuda:%d: synchronize: %s (an earlier kernel or copy failed)", index,
                        cudaGetErrorString(e));
    }
    return LK_STATUS_OK;
}

/* lk_stream and lk_event are the runtime's own handles, cast: nothing to
 * wrap, so creating one allocates nothing on the host. */
static lk_status cuda_stream_create(void *ctx, int index, lk_stream **out) {
    (void)ctx;
    *out = NULL;
    LK_TRY(use(index, "stream_create"));
    cudaStream_t s;
    /* non-blocking: must not serialise with the legacy default stream the
     * copies use, or a communication stream could never overlap compute */
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
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) return fail(e, index, "cudaEventCreate", 0);
    e = cudaEventRecord(ev, (cudaStream_t)s);
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
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)ev, 0);
    return e == cudaSuccess ? LK_STATUS_OK : fail(e, index, "cudaStreamWaitEvent", 0);
}
static void cuda_event_free(void *ctx, int index, lk_event *ev) {
    (void)ctx, (void)index;
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

/* ---- prefetch: pinned host memory and asynchronous copies in ----------------
 * The trainer's batch prefetch (train/prefetch.c) copies the next batch on
 * a stream of its own (cuda_stream_create: non-blocking, so it does not
 * serialise with the legacy default stream every kernel and cudaMemcpy
 * runs on). Because it does not, nothing orders the two streams for it:
 * the prefetch records an event on the legacy stream and makes the copy
 * stream wait for it before writing device blocks that earlier steps'
 * kernels may still read, and records an event on the copy stream that the
 * legacy stream waits for (cudaStreamWaitEvent on stream 0) before the
 * step's first kernel reads the batch. cudaMemcpyAsync is asynchronous only
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
};

lk_status lk__cuda_register(void) {
    if (lk__cuda_visible() == 0)
        return lk_error(LK_STATUS_UNSUPPORTED, "device 'cuda': %s", lk__cuda_why_none());
    lk_device_kind k;
    LK_TRY(lk_device_register(&cuda_vt, NULL, &k));
    if (k != LK_CUDA) return lk_error(LK_STATUS_INTERNAL, "device 'cuda' registered as kind %d, not %d", (int)k, LK_CUDA);
    /* the kind's ops run on the cuda backend from now on (backend/cuda/backend.c) */
    return lk__backend_register(LK_CUDA, &lk__cuda_backend);
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
lk_status lk__cuda_register(void) {
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

#endif
