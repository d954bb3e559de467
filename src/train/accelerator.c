/* trainer.accelerator decided before anything starts, and the device each
 * rank (or dp replica) trains on: the trainer config resolved against this
 * build's GPUs with the device layer's pure choice (device/gpu_select.c).
 * Pure functions of their arguments apart from lk__accelerator_check and
 * lk__accelerator_device, so every error is tested without a GPU. */
#include <stdio.h>
#include <string.h>

#include "lockstep/strategy.h" /* the strategy registry: does it fork its ranks */
#include "device/gpu.h"
#include "train/accelerator.h"

const char *lk__devices_spec(const lk_trainer_config *cfg, char *buf, size_t size) {
    if (cfg->devices_spec[0]) snprintf(buf, size, "%s", cfg->devices_spec);
    else if (cfg->devices <= 0) snprintf(buf, size, "auto");
    else snprintf(buf, size, "%lld", (long long)cfg->devices);
    return buf;
}

lk_status lk__accelerator_resolve(const lk_trainer_config *cfg, bool cuda_built, int visible, lk__accel *out,
                                  int *ids, int *n) {
    int tmp[LK__GPU_MAX], ntmp;
    if (!ids) ids = tmp;
    if (!n) n = &ntmp;
    *n = 0;
    *out = LK__ACCEL_CPU;
    const char *a = cfg->accelerator;
    if (!strcmp(a, "cpu") || !strcmp(a, "auto") || !*a) return LK_STATUS_OK;
    if (strcmp(a, "gpu") && strcmp(a, "cuda")) {
        /* A device kind registered through the C API (Lightning's custom
         * accelerators by registry name): lk__accelerator_device places the
         * run on it. The cpu kind and cuda's number keep their own names. */
        lk_device d;
        if (!strchr(a, ':') && lk_device_parse(a, &d) == LK_STATUS_OK && d.kind != LK_CPU && d.kind != LK_CUDA) {
            *out = LK__ACCEL_DEVICE;
            return LK_STATUS_OK;
        }
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.accelerator '%s' is not one of cpu, gpu, cuda, auto", a);
    }
    char spec[LK_PARAM_STR + 8];
    lk__devices_spec(cfg, spec, sizeof spec);
    if (!cuda_built)
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "trainer.accelerator: '%s' needs the CUDA backend, which this build does not have "
                        "(trainer.devices=%s asked for; use cpu or auto, or configure with -DLK_CUDA=ON)",
                        a, spec);
    if (visible <= 0)
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "trainer.accelerator: '%s' with trainer.devices=%s, but this build's CUDA backend sees no CUDA "
                        "device (%s); use cpu or auto",
                        a, spec, lk__cuda_why_none()[0] ? lk__cuda_why_none() : "none visible");
    LK_TRY(lk__gpu_select(spec, visible, ids, LK__GPU_MAX, n));
    /* ddp_spawn forks its ranks from this process, which has initialised
     * CUDA by now (counting the GPUs does), and CUDA does not survive a
     * fork: PyTorch's answer is the same ("Cannot re-initialize CUDA in
     * forked subprocess"). ddp starts each rank as a new process. */
    const lk_strategy_info *si = lk_strategy_info_get(cfg->strategy);
    if (si && si->forks)
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "trainer.strategy '%s' forks its ranks, and CUDA does not survive a fork: use ddp on GPUs "
                        "(trainer.accelerator '%s', trainer.devices=%s)",
                        cfg->strategy, a, spec);
    *out = LK__ACCEL_GPU;
    return LK_STATUS_OK;
}

lk_status lk__accelerator_check(const lk_trainer_config *cfg) {
    bool gpu = !strcmp(cfg->accelerator, "gpu") || !strcmp(cfg->accelerator, "cuda");
    /* Counting GPUs initialises CUDA, which a process that will fork ranks
     * must not do first: only a GPU request pays for it. */
    int visible = gpu && lk__cuda_built() ? lk__cuda_visible() : 0;
    lk__accel acc;
    int ids[LK__GPU_MAX], n;
    return lk__accelerator_resolve(cfg, lk__cuda_built(), visible, &acc, ids, &n);
}

lk_status lk__accelerator_device(const lk_trainer_config *cfg, int slot, lk_device *out) {
    *out = LK_DEVICE_CPU;
    lk__accel acc;
    bool gpu = !strcmp(cfg->accelerator, "gpu") || !strcmp(cfg->accelerator, "cuda");
    int visible = gpu && lk__cuda_built() ? lk__cuda_visible() : 0;
    LK_TRY(lk__accelerator_resolve(cfg, lk__cuda_built(), visible, &acc, NULL, NULL));
    if (acc == LK__ACCEL_CPU) return LK_STATUS_OK;
    /* gpu and cuda are the kind "cuda"; any other name is a registered kind.
     * Either way the same selection: trainer.devices against the devices of
     * that kind, then this slot's (local rank, or dp replica) entry. */
    lk_device kind;
    LK_TRY(lk_device_parse(gpu ? "cuda" : cfg->accelerator, &kind));
    char spec[LK_PARAM_STR + 8];
    int ids[LK__GPU_MAX], n, id;
    LK_TRY(lk__gpu_select(lk__devices_spec(cfg, spec, sizeof spec), lk_device_count(kind.kind), ids, LK__GPU_MAX, &n));
    LK_TRY(lk__gpu_for_rank(ids, n, slot, &id));
    *out = (lk_device){kind.kind, id};
    return LK_STATUS_OK;
}
