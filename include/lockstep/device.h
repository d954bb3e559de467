/* lockstep/device.h — where tensor memory lives.
 *
 * A device kind (cpu, cuda, ...) is one vtable — alloc, free, memset, copies
 * to and from the host, synchronize, and optional streams and events —
 * registered by name. The tensor layer allocates every storage through it
 * (its caching pool is keyed by device and size), so a new kind of device is
 * one new file that fills a vtable and registers it; nothing above the tensor
 * layer changes. The CPU device is always registered, as kind LK_CPU.
 *
 *     static const lk_device_vtable my_vt = {.name = "mydev", .alloc = ..., .free = ...};
 *     lk_device_kind k;
 *     lk_device_register(&my_vt, ctx, &k);
 *     lk_device_set_default((lk_device){k, 0});   // constructors make tensors there
 *
 * Host-addressable devices (cpu, the tests' debug device, pinned or managed
 * memory) can be read by the CPU kernels directly; the others are only
 * reached through copies and their own backend.
 */
#ifndef LOCKSTEP_DEVICE_H
#define LOCKSTEP_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "lockstep/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kinds the library knows by number; registered devices get numbers after
 * them, up to LK_DEVICE_KIND_MAX. */
typedef enum { LK_CPU = 0, LK_CUDA = 1, LK_DEVICE_KIND_MAX = 8 } lk_device_kind;
typedef struct lk_device {
    lk_device_kind kind;
    int index; /* which device of that kind (GPU 0, 1, ...); 0 on the CPU */
} lk_device;
#define LK_DEVICE_CPU ((lk_device){LK_CPU, 0})

typedef struct lk_stream lk_stream; /* opaque, per device kind */
typedef struct lk_event lk_event;
typedef struct lk_graph lk_graph; /* opaque: captured device work, replayable */

/* One device kind. Every method gets the `ctx` given at registration and
 * the device index. Methods marked (optional) may be NULL: the dispatcher
 * supplies the default named there. */
typedef struct lk_device_vtable {
    const char *name;      /* "cpu", "cuda", "debug": how users and messages name it */
    bool host_addressable; /* the CPU may read and write its memory directly */
    /* Devices of this kind visible to this process (optional: 1). */
    int (*count)(void *ctx);
    /* `bytes` of memory aligned to at least 64 bytes, or an error naming the
     * bytes asked for and what is free. */
    lk_status (*alloc)(void *ctx, int index, size_t bytes, void **ptr);
    void (*free)(void *ctx, int index, void *ptr, size_t bytes);
    /* (optional on host-addressable devices: memset) */
    lk_status (*memset)(void *ctx, int index, void *ptr, int value, size_t bytes);
    /* Copies between this device's memory and host memory (optional on
     * host-addressable devices: memcpy). Ordered after earlier work on the
     * device (its compute stream) and before later work. When they return,
     * a copy to host is complete and a copy from host no longer needs
     * host_src (its device side may still be queued: later work on the
     * device, and every stream ordered after it by an event, sees it). */
    lk_status (*copy_to_host)(void *ctx, int index, void *host_dst, const void *src, size_t bytes);
    lk_status (*copy_from_host)(void *ctx, int index, void *dst, const void *host_src, size_t bytes);
    /* Within the device (optional on host-addressable devices: memcpy). */
    lk_status (*copy)(void *ctx, int index, void *dst, const void *src, size_t bytes);
    /* Waits for all work queued on the device (optional: nothing to wait for). */
    lk_status (*synchronize)(void *ctx, int index);
    /* (optional) streams and events: work queued on one stream runs in order;
     * an event recorded on one stream can be waited for on another. A NULL
     * stream passed to event_record / event_wait is the device's own
     * compute stream: the one its backend's ops, memsets and copies run on
     * (cuda: one non-blocking stream per GPU, not the legacy stream 0). */
    lk_status (*stream_create)(void *ctx, int index, lk_stream **out);
    void (*stream_free)(void *ctx, int index, lk_stream *s);
    lk_status (*event_record)(void *ctx, int index, lk_stream *s, lk_event **out);
    lk_status (*event_wait)(void *ctx, int index, lk_stream *s, lk_event *e);
    void (*event_free)(void *ctx, int index, lk_event *e);

    /* ---- peer copies ---- */
    /* (optional) Copies between two devices of this kind, src_index's
     * memory to dst_index's, without the host (CUDA: cudaMemcpyPeer, over
     * NVLink or PCIe P2P). Ordered after earlier work on both devices, as
     * `copy` is. NULL: lk_device_copy stages through a host buffer. */
    lk_status (*copy_peer)(void *ctx, int dst_index, void *dst, int src_index, const void *src, size_t bytes);

    /* ---- prefetch: pinned host memory and asynchronous copies in (all optional) ---- */
    /* Host memory the device copies from asynchronously (cuda: pinned),
     * aligned to at least 64 bytes (optional: lk_aligned_alloc). */
    lk_status (*host_alloc)(void *ctx, int index, size_t bytes, void **ptr);
    void (*host_free)(void *ctx, int index, void *ptr, size_t bytes);
    /* A copy from host memory queued on stream `s` (optional: the
     * synchronous copy_from_host). Returns once queued: `host_src` must stay
     * unchanged, and `dst` unread, until an event recorded on `s` after it
     * has completed. */
    lk_status (*copy_from_host_async)(void *ctx, int index, lk_stream *s, void *dst, const void *host_src, size_t bytes);
    /* Blocks the calling thread until the work before event `e` is done
     * (optional: synchronize, which waits for everything). */
    lk_status (*event_synchronize)(void *ctx, int index, lk_event *e);

    /* ---- graph capture (all optional; NULL on the cpu device) ---- */
    /* Starts recording, instead of running, the work the calling thread
     * queues on device `index` (its ops, copies within the device, memsets)
     * until graph_end. A call that needs the host to wait for the device
     * meanwhile (a copy into host memory, an allocation the pool cannot
     * serve from its cache, synchronize) fails with an error saying it is
     * not allowed while capturing, and ends the capture (graph_end then
     * fails too); the device keeps working. */
    lk_status (*graph_begin)(void *ctx, int index);
    /* Ends the capture into *out (NULL on failure, with the capture ended). */
    lk_status (*graph_end)(void *ctx, int index, lk_graph **out);
    /* Queues the recorded work again, with the same arguments and the same
     * pointers, on the device's compute stream (asynchronous, as the ops). */
    lk_status (*graph_launch)(void *ctx, int index, lk_graph *g);
    void (*graph_free)(void *ctx, int index, lk_graph *g);
} lk_device_vtable;

/* Registers a device kind (the vtable and ctx are borrowed for the life of
 * the process) and returns its number. A second registration of the same
 * name returns the first one's number. Thread-safe. */
lk_status lk_device_register(const lk_device_vtable *vt, void *ctx, lk_device_kind *kind);
/* "cpu", "cuda:1", "debug" -> a device; an unknown name lists the registered ones. */
lk_status lk_device_parse(const char *name, lk_device *out);
/* "cpu", "cuda:1" into buf; returns buf. */
const char *lk_device_str(lk_device d, char *buf, size_t size);
bool lk_device_equal(lk_device a, lk_device b);
bool lk_device_is_host(lk_device d); /* host-addressable memory */
int lk_device_count(lk_device_kind kind);

/* The device the constructors (lk_tensor_empty, _zeros, _full, _from_data,
 * _rand, _randn) make new tensors on: one for the process, the CPU until
 * set (the trainer sets it from trainer.accelerator for a run). Ops do not
 * use it: they run on their inputs' device and put their results there, as
 * torch's do; an op given tensors of two devices (other than two the CPU
 * can address) fails with INVALID_ARGUMENT naming both. */
lk_device lk_device_default(void);
/* A device the CPU cannot address can be the default only once a backend
 * for its kind is registered (no op could use the tensors made there
 * otherwise): UNSUPPORTED otherwise. */
lk_status lk_device_set_default(lk_device d);
/* This thread's default instead of the process's (NULL: the process's
 * again), as CUDA's current device is per thread: dp drives one device per
 * thread. The same condition as lk_device_set_default. */
lk_status lk_device_set_thread_default(const lk_device *d);

/* Memory (the tensor layer's pool is the usual way in; these are for it and
 * for buffers outside tensors). */
lk_status lk_device_alloc(lk_device d, size_t bytes, void **ptr);
void lk_device_free(lk_device d, void *ptr, size_t bytes); /* NULL does nothing */
lk_status lk_device_memset(lk_device d, void *ptr, int value, size_t bytes);
/* Copies `bytes` from src (on src_dev) to dst (on dst_dev): the device's
 * own copy within one device, its copy_peer between two devices of one
 * kind that has one; between other devices that are not the host it goes
 * through a host buffer. */
lk_status lk_device_copy(lk_device dst_dev, void *dst, lk_device src_dev, const void *src, size_t bytes);
lk_status lk_device_synchronize(lk_device d);

/* ---- prefetch: pinned host memory, asynchronous copies, streams and events ----
 *
 * The trainer stages the next batch on the training device while the
 * current one computes: the loader's buffers come from lk_device_host_alloc
 * (pinned on cuda, so the copy is a DMA the CPU does not wait for), the
 * copies go on a stream of their own, and the step's ops, which run on the
 * device's compute stream (stream NULL everywhere below; on cuda a
 * non-blocking stream per GPU, not the legacy stream 0), wait for an event
 * recorded after them. A kind without streams, events or
 * asynchronous copies gets a NULL stream from lk_device_stream_create and
 * then every call below is synchronous: correct, only not overlapped. */

/* `bytes` of host memory the device copies from fastest, aligned to
 * LK_ALIGN (plain aligned memory on kinds without their own); *ptr is NULL
 * on failure. Free it with lk_device_host_free on the same device. */
lk_status lk_device_host_alloc(lk_device d, size_t bytes, void **ptr);
void lk_device_host_free(lk_device d, void *ptr, size_t bytes); /* NULL does nothing */
/* A stream for copies, or *out = NULL (not an error) when the kind lacks
 * streams, events or asynchronous copies. */
lk_status lk_device_stream_create(lk_device d, lk_stream **out);
void lk_device_stream_free(lk_device d, lk_stream *s); /* NULL does nothing */
/* host_src -> dst (memory of d) queued on stream s; NULL s: a synchronous
 * copy, complete on return. With a stream, host_src must stay unchanged and
 * dst unused until an event recorded on s after it completed. */
lk_status lk_device_copy_async(lk_device d, lk_stream *s, void *dst, const void *host_src, size_t bytes);
/* An event marking the work queued on s so far (s NULL: the device's
 * compute stream, where its ops run); *out = NULL when the kind has no events, and the calls below
 * then do nothing, since all its work was synchronous. */
lk_status lk_device_event_record(lk_device d, lk_stream *s, lk_event **out);
/* Work queued on s (NULL: the compute stream) after this call waits for e. */
lk_status lk_device_event_wait(lk_device d, lk_stream *s, lk_event *e);
/* The calling thread waits until the work before e is done. */
lk_status lk_device_event_synchronize(lk_device d, lk_event *e);
void lk_device_event_free(lk_device d, lk_event *e); /* NULL does nothing */

#ifdef __cplusplus
}
#endif
#endif
