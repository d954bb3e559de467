/* Private: the GPU side of the device layer, as the trainer, `lockstep env`
 * and the gpu tests see it — the cuda device kind (cuda.c), choosing GPUs
 * from trainer.devices and binding ranks to them (gpu_select.c), and NVML's
 * device stats (nvml.c). What trainer.accelerator asks for is train policy:
 * train/accelerator.h. Every function here exists in every build: without
 * CUDA they answer "no GPU" instead of being absent, so callers need no
 * #ifdef. */
#ifndef LK_DEVICE_GPU_H
#define LK_DEVICE_GPU_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "lockstep/device.h"

#define LK__GPU_MAX 64

/* ---- the cuda device (cuda.c) --------------------------------------------- */

/* Whether this library was built with the CUDA backend. Cannot fail. */
bool lk__cuda_built(void);
/* GPUs the CUDA runtime shows this process (CUDA_VISIBLE_DEVICES applies);
 * 0 in a build without CUDA and when no driver is loaded (the runtime's
 * error is kept for lk__cuda_why_none, never printed). The first call
 * initialises CUDA in this process: a process that forks ranks afterwards
 * must not call it first (CUDA state does not survive fork). */
int lk__cuda_visible(void);
/* Why lk__cuda_visible() is 0: "built without CUDA", "no CUDA device visible
 * (driver not loaded)", ... ; "" when GPUs are visible. */
const char *lk__cuda_why_none(void);
/* Registers the device kind "cuda" (number LK_CUDA) when at least one GPU is
 * visible; UNSUPPORTED naming why otherwise. Idempotent and thread-safe. The
 * registration is lazy rather than at library load for the fork reason above.
 * The device alone: lk__cuda_register (backend/builtin.h), the built-in
 * list's row, registers it with its backend, as everything else should. */
lk_status lk__cuda_device_register(void);

typedef struct lk__cuda_props {
    char name[256];
    int major, minor; /* compute capability */
    int multiprocessors;
    size_t mem_total, mem_free; /* bytes */
} lk__cuda_props;
/* Properties of visible GPU `index`; DEVICE/INVALID_ARGUMENT on failure. */
lk_status lk__cuda_props_get(int index, lk__cuda_props *out);

/* Page-locked host memory for staging host<->device copies (the loader's
 * next batch): copies from it run at full bus speed and may be asynchronous.
 * Without CUDA, ordinary aligned host memory. *ptr is NULL on failure. */
lk_status lk__cuda_host_alloc(size_t bytes, void **ptr);
void lk__cuda_host_free(void *ptr); /* NULL does nothing */

/* ---- one handle per device index, made on first use (lazy.c) -------------
 * The cuda device's compute streams: each is created by the first call
 * that needs it, from whichever thread that is (dp's replica threads and
 * the comm thread call in at once), exactly once, and then read without a
 * lock. Generic so that the once-per-index logic is tested on the host with
 * a fake `make` (tests/device/test_graph_cpu.c). */
typedef struct lk__lazy_table {
    pthread_mutex_t mu;          /* held only while a handle is being made */
    void *_Atomic slot[LK__GPU_MAX];
} lk__lazy_table;
#define LK__LAZY_TABLE_INIT {PTHREAD_MUTEX_INITIALIZER, {0}}
typedef lk_status (*lk__lazy_make)(void *ctx, int index, void **out);
/* The handle of `index`, made by make(ctx, index, &h) on the first call for
 * that index (under the table's lock: concurrent first calls make it once);
 * a failed make leaves the slot empty, so a later call tries again.
 * INVALID_ARGUMENT for an index outside [0, LK__GPU_MAX). */
lk_status lk__lazy_get(lk__lazy_table *t, int index, lk__lazy_make make, void *ctx, void **out);
/* The handle of `index` if it was made, else NULL; never makes one. */
void *lk__lazy_peek(lk__lazy_table *t, int index);

/* ---- the compute stream (cuda.c) -----------------------------------------
 * Every piece of device work for GPU `device` — the backend's kernels, its
 * cuBLASLt GEMMs and scratch, the device vtable's copies and memsets, the
 * stream NULL of lockstep/device.h's stream calls, NCCL's ordering events —
 * goes on one non-blocking stream per GPU, made on first use. Non-blocking
 * so that it never serialises with the legacy default stream (which other
 * libraries in the process may use) and so that it can be captured into a
 * CUDA graph, which the legacy stream cannot. cudaStream_t is
 * `struct CUstream_st *`; declared that way so this header needs no CUDA
 * header. Without CUDA: UNSUPPORTED, never capturing. */
struct CUstream_st;
lk_status lk__cuda_stream(int device, struct CUstream_st **out);
/* Whether `device`'s compute stream is being captured into a graph (no
 * stream yet: not capturing). */
bool lk__cuda_capturing(int device);
/* A call that cannot be captured (`what`: a read into host memory, a
 * cudaMalloc, a synchronize) was made while `device`'s compute stream was
 * being captured, or the runtime refused one with `e` (a
 * cudaErrorStreamCapture* code; 0 when found by lk__cuda_capturing): ends
 * the capture, keeping its graph from ever being launched (graph_end then
 * reports it), and returns the error saying the call is not allowed while
 * capturing. */
lk_status lk__cuda_capture_refuse(int device, const char *what, int e);

/* ---- choosing GPUs (gpu_select.c; pure functions, tested without a GPU) ---- */

/* Resolves trainer.devices as written — "N", "-1" (all), "auto" (all) or a
 * list "0,2" / "[0, 2]" — against `visible` GPUs into ids[0..*n). Errors
 * (INVALID_ARGUMENT) name what was asked and what is visible: an index that
 * does not exist, more GPUs than visible, none visible, a malformed spec. */
lk_status lk__gpu_select(const char *spec, int visible, int *ids, int cap, int *n);
/* The GPU a rank drives: ids[local_rank % n] would hide a launch error, so a
 * local_rank outside [0, n) is INVALID_USAGE naming both. */
lk_status lk__gpu_for_rank(const int *ids, int n, int local_rank, int *gpu);

/* ---- NVML device stats (nvml.c; libnvidia-ml.so.1 loaded at run time) ---- */

typedef struct lk__gpu_stats {
    char name[96];
    int utilization_pct;        /* GPU busy, last sample period; -1: not known */
    int mem_utilization_pct;    /* memory controller busy; -1: not known */
    size_t mem_used, mem_total; /* bytes; 0 when not known */
    int temperature_c;          /* -1: not known */
    double power_w;             /* -1: not known */
} lk__gpu_stats;
/* Whether NVML could be loaded and initialised (once per process; its
 * absence is no error: the driver ships it, a machine without a GPU has not).
 * `why` (may be NULL) receives the reason when it could not. */
bool lk__nvml_available(char *why, size_t size);
/* GPUs NVML sees (all of the machine's, CUDA_VISIBLE_DEVICES does not apply);
 * 0 when NVML is not available. */
int lk__nvml_count(void);
/* Stats of NVML device `index`; fields NVML cannot answer are left unknown.
 * DEVICE when NVML is not available or the index is out of range. */
lk_status lk__nvml_stats(int index, lk__gpu_stats *out);

#endif
