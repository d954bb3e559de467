/* Private: what trainer.accelerator and trainer.devices ask for, decided
 * for the trainer (trainer.c, run.c, step.c) and `lockstep fit`'s early
 * check (cli). Train policy: it reads the trainer config and asks the
 * strategy registry whether a strategy forks, so it lives here rather than
 * in the device layer, whose pure GPU choice (lk__gpu_select,
 * lk__gpu_for_rank in device/gpu.h) it uses. */
#ifndef LK_TRAIN_ACCELERATOR_H
#define LK_TRAIN_ACCELERATOR_H

#include <stdbool.h>
#include <stddef.h>

#include "lockstep/device.h"
#include "lockstep/trainer.h"

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

#endif
