/* Choosing GPUs: trainer.devices in Lightning's forms (N, -1, auto, a list)
 * resolved against the GPUs visible, trainer.accelerator decided before
 * anything starts, and each rank bound to its GPU. Pure functions of their
 * arguments apart from lk__accelerator_check, so every error is tested on
 * machines without a GPU. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/strategy.h" /* the strategy registry: does it fork its ranks */
#include "device/gpu.h"

lk_status lk__gpu_select(const char *spec, int visible, int *ids, int cap, int *n) {
    *n = 0;
    if (!spec || !*spec) spec = "auto";
    if (visible <= 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.devices=%s asks for GPUs, but no CUDA device is visible",
                        spec);
    if (!strcmp(spec, "auto") || !strcmp(spec, "-1") || !strcmp(spec, "0")) { /* every visible GPU */
        if (visible > cap)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.devices=%s: %d GPUs visible, at most %d supported",
                            spec, visible, cap);
        for (int i = 0; i < visible; i++) ids[i] = i;
        *n = visible;
        return LK_STATUS_OK;
    }
    /* A list "0,2" or "[0, 2]"; a single number without a comma is a count. */
    bool list = strchr(spec, ',') || strchr(spec, '[');
    const char *p = spec;
    while (isspace((unsigned char)*p) || *p == '[') p++;
    int count = 0;
    while (*p && *p != ']') {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "trainer.devices=%s: expected a number of GPUs, -1, auto or a list of GPU indices", spec);
        if (!list) {
            while (isspace((unsigned char)*end)) end++;
            if (*end)
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "trainer.devices=%s: expected a number of GPUs, -1, auto or a list of GPU indices", spec);
            /* LK_ALLOW_OVERSUBSCRIBE=1, as for CPU cores: more ranks than
             * GPUs, rank i on GPU i % visible (they talk over shm then: NCCL
             * takes one rank per GPU). How one GPU tests ddp's staging. */
            if (v > visible && !lk_env_get_long("LK_ALLOW_OVERSUBSCRIBE", 0))
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "trainer.devices=%ld asks for more GPUs than the %d visible (CUDA_VISIBLE_DEVICES=%s; "
                                "LK_ALLOW_OVERSUBSCRIBE=1 shares them between ranks)",
                                v, visible, getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
            if (v > cap)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.devices=%ld: at most %d GPUs supported", v, cap);
            for (int i = 0; i < (int)v; i++) ids[i] = i % visible;
            *n = (int)v;
            return LK_STATUS_OK;
        }
        if (v >= visible)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "trainer.devices=%s names GPU %ld, but only %d GPU%s visible (indices 0..%d)", spec, v,
                            visible, visible == 1 ? " is" : "s are", visible - 1);
        for (int q = 0; q < count; q++)
            if (ids[q] == v) return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.devices=%s names GPU %ld twice", spec, v);
        if (count == cap)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.devices=%s: at most %d GPUs supported", spec, cap);
        ids[count++] = (int)v;
        p = end;
        while (isspace((unsigned char)*p) || *p == ',') p++;
    }
    if (!count) return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.devices=%s selects no GPU", spec);
    *n = count;
    return LK_STATUS_OK;
}

lk_status lk__gpu_for_rank(const int *ids, int n, int local_rank, int *gpu) {
    if (local_rank < 0 || local_rank >= n)
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "local rank %d has no GPU: trainer.devices selects %d per node (the launcher started more "
                        "processes on this node than GPUs were chosen)",
                        local_rank, n);
    *gpu = ids[local_rank];
    return LK_STATUS_OK;
}

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
