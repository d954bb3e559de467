/* Private: the GPU side of the device layer, as the trainer, `lockstep env`
 * and the gpu tests see it — the cuda device kind (cuda.c), choosing GPUs
 * from trainer.devices and binding ranks to them (gpu_select.c), and NVML's
 * device stats (nvml.c). Every function here exists in every build: without
 * CUDA they answer "no GPU" instead of being absent, so callers need no
 * #ifdef. */
#ifndef LK_DEVICE_GPU_H
#define LK_DEVICE_GPU_H

#include <stdbool.h>
#include <stddef.h>

#include "lockstep/device.h"
#include "lockstep/trainer.h"

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
 * registration is lazy rather than at library load for the fork reason above. */
lk_status lk__cuda_register(void);

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

/* ---- choosing GPUs (gpu_select.c; pure functions, tested without a GPU) ---- */

#define LK__GPU_MAX 64
/* Resolves trainer.devices as written — "N", "-1" (all), "auto" (all) or a
 * list "0,2" / "[0, 2]" — against `visible` GPUs into ids[0..*n). Errors
 * (INVALID_ARGUMENT) name what was asked and what is visible: an index that
 * does not exist, more GPUs than visible, none visible, a malformed spec. */
lk_status lk__gpu_select(const char *spec, int visible, int *ids, int cap, int *n);
/* The GPU a rank drives: ids[local_rank % n] would hide a launch error, so a
 * local_rank outside [0, n) is INVALID_USAGE naming both. */
lk_status lk__gpu_for_rank(const int *ids, int n, int local_rank, int *gpu);
/* trainer.devices as text for lk__gpu_select: cfg->devices_spec when the
 * config gave a list or -1, else the number ("auto" for 0). */
const char *lk__devices_spec(const lk_trainer_config *cfg, char *buf, size_t size);

/* What trainer.accelerator asks for, decided before anything starts. */
typedef enum {
    LK__ACCEL_CPU,
    LK__ACCEL_GPU,
    LK__ACCEL_DEVICE /* a device kind registered through the C API, named by trainer.accelerator */
} lk__accel;
/* Pure: decides from the config, whether CUDA is built and how many GPUs
 * are visible. "cpu" -> CPU; "auto" -> CPU (until GPU training has run on
 * a GPU in this project's tests it keeps the CPU even with a GPU visible);
 * "gpu"/"cuda" -> the GPU ids chosen by trainer.devices, or an error naming
 * what was asked and what is visible (and ddp_spawn, which forks after
 * CUDA is initialised, refused). `ids`/`n` may be NULL. */
lk_status lk__accelerator_resolve(const lk_trainer_config *cfg, bool cuda_built, int visible, lk__accel *out,
                                  int *ids, int *n);
/* The trainer's check at creation: lk__accelerator_resolve against this
 * process's build and GPUs (queried only when a GPU is asked for). */
lk_status lk__accelerator_check(const lk_trainer_config *cfg);
/* The device a run trains on: the CPU for cpu/auto; for gpu/cuda or a
 * registered kind's name, trainer.devices resolved against that kind's
 * count (lk__gpu_select) and the entry of `slot` (the local rank; dp's
 * replica index). Everything after this is the same code for every kind. */
lk_status lk__accelerator_device(const lk_trainer_config *cfg, int slot, lk_device *out);

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
