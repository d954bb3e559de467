/* Private: graph capture through the device vtable (lockstep/device.h's
 * graph_* methods), for backend/replay.c, which captures a training step's
 * segments and replays them (docs/GPU.md, "The step as a graph"). A kind
 * without the methods (the cpu device) answers every call with an error
 * naming it; nothing is captured and nothing crashes. */
#ifndef LK_DEVICE_GRAPH_H
#define LK_DEVICE_GRAPH_H

#include "lockstep/device.h"

/* Whether d's kind can capture graphs (all four methods present). */
bool lk__device_can_capture(lk_device d);
/* Records the calling thread's work on d until lk__device_graph_end. */
lk_status lk__device_graph_begin(lk_device d);
/* The recorded work as a graph (*out NULL on failure). */
lk_status lk__device_graph_end(lk_device d, lk_graph **out);
/* Replays g on d's compute stream (asynchronous, ordered with d's ops). */
lk_status lk__device_graph_launch(lk_device d, lk_graph *g);
void lk__device_graph_free(lk_device d, lk_graph *g); /* NULL does nothing */

/* ---- the interceptor slot ----
 * One layer above may see the device layer's memsets, copies, host syncs,
 * allocations and frees before they are issued, and take (defer) some:
 * backend/replay.c, the step replayed as a graph, installs itself here at
 * load, so the device layer names nothing above it. Each hook has the
 * contract of the lk__replay_* function of the same name (backend/replay.h);
 * *taken says the call was deferred (its status is then OK), otherwise the
 * device layer issues the work itself. memset, copy and sync are called only
 * while lk__device_intercept_open is set (one relaxed load when it is not);
 * note_alloc and note_free for every block of a kind that can capture. */
typedef struct lk__device_interceptor {
    lk_status (*memset)(lk_device dev, void *ptr, int value, size_t bytes, bool *taken);
    lk_status (*copy)(lk_device dev, void *dst, const void *src, size_t bytes, bool *taken);
    lk_status (*sync)(lk_device dev);
    void (*note_alloc)(lk_device dev, void *ptr, size_t bytes);
    void (*note_free)(lk_device dev, void *ptr, size_t bytes);
} lk__device_interceptor;
/* Installs ic (static storage; NULL removes it). One slot: the last wins. */
void lk__device_set_interceptor(const lk__device_interceptor *ic);
/* Set by the interceptor while it may take work (any step open); read relaxed. */
extern int lk__device_intercept_open;

/* ---- what the layers above tell the device layer ---- */

/* The backend registry says that kind k has a backend of its own (or no
 * longer has one): a device the CPU cannot address may be the default only
 * then (lk_device_set_default). */
void lk__device_note_backend(lk_device_kind k, bool present);
/* Kinds registered on first use rather than at load (cuda: counting GPUs
 * initialises CUDA, which must not happen in a process that forks ranks
 * later): lk_device_parse of a name no kind has yet calls provide(name, len)
 * first, which registers the kind (device and backend) or fails saying why
 * there is none. Installed at load by the built-in list
 * (backend/builtin.c), so the device layer names no kind but the CPU. */
typedef lk_status (*lk__device_provider)(const char *name, size_t len);
void lk__device_set_provider(lk__device_provider provide);

#endif
