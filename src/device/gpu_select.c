/* Choosing GPUs: trainer.devices in Lightning's forms (N, -1, auto, a list)
 * resolved against the GPUs visible, and each rank bound to its GPU. Pure
 * functions of their arguments, so every error is tested on machines
 * without a GPU. trainer.accelerator's decision, which reads the trainer
 * config and the strategy registry, is train policy: src/train/accelerator.c. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
