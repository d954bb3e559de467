/* NVML device stats: utilization, memory used/total, temperature and power
 * per GPU, for `lockstep env` and the device stats monitor. NVML ships with
 * the driver, not the toolkit, so libnvidia-ml.so.1 is opened at run time
 * with dlopen and its absence is no error: every build has this file and a
 * machine without a driver simply has no stats. The few NVML declarations
 * used are written out here (types and signatures from NVML's public API
 * reference) so the build needs no nvml.h. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "device/gpu.h"

typedef void *nvml_device;
typedef struct {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvml_utilization;
typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvml_memory;
enum { NVML_OK = 0, NVML_TEMPERATURE_GPU = 0 };

static struct {
    void *lib;
    bool ok;
    char why[256];
    int (*init)(void);
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, nvml_device *);
    int (*name)(nvml_device, char *, unsigned int);
    int (*util)(nvml_device, nvml_utilization *);
    int (*mem)(nvml_device, nvml_memory *);
    int (*temp)(nvml_device, int, unsigned int *);
    int (*power)(nvml_device, unsigned int *);
    const char *(*err)(int);
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void *sym(const char *name) { return dlsym(nv.lib, name); }

static void load(void) {
    const char *path = lk_env_get("LK_NVML_LIBRARY"); /* tests point it at a missing file */
    nv.lib = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nv.lib) {
        const char *e = dlerror();
        snprintf(nv.why, sizeof nv.why, "NVML not found (it ships with the NVIDIA driver): %s",
                 e ? e : (path && *path ? path : "libnvidia-ml.so.1"));
        return;
    }
    /* The _v2 entry points are the ones current drivers export for these. */
    *(void **)&nv.init = sym("nvmlInit_v2");
    *(void **)&nv.count = sym("nvmlDeviceGetCount_v2");
    *(void **)&nv.handle = sym("nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nv.name = sym("nvmlDeviceGetName");
    *(void **)&nv.util = sym("nvmlDeviceGetUtilizationRates");
    *(void **)&nv.mem = sym("nvmlDeviceGetMemoryInfo");
    *(void **)&nv.temp = sym("nvmlDeviceGetTemperature");
    *(void **)&nv.power = sym("nvmlDeviceGetPowerUsage");
    *(void **)&nv.err = sym("nvmlErrorString");
    if (!nv.init || !nv.count || !nv.handle) {
        snprintf(nv.why, sizeof nv.why, "NVML library lacks nvmlInit_v2/nvmlDeviceGetCount_v2 (driver too old)");
        return;
    }
    int r = nv.init();
    if (r != NVML_OK) {
        snprintf(nv.why, sizeof nv.why, "NVML did not initialise: %s", nv.err ? nv.err(r) : "error");
        return;
    }
    nv.ok = true;
}

bool lk__nvml_available(char *why, size_t size) {
    pthread_once(&nv_once, load);
    if (why && size) snprintf(why, size, "%s", nv.ok ? "" : nv.why);
    return nv.ok;
}

int lk__nvml_count(void) {
    unsigned int n = 0;
    if (!lk__nvml_available(NULL, 0) || nv.count(&n) != NVML_OK) return 0;
    return (int)n;
}

lk_status lk__nvml_stats(int index, lk__gpu_stats *out) {
    memset(out, 0, sizeof *out);
    out->utilization_pct = out->mem_utilization_pct = out->temperature_c = -1;
    out->power_w = -1;
    char why[256];
    if (!lk__nvml_available(why, sizeof why)) return lk_error(LK_STATUS_DEVICE, "gpu stats: %s", why);
    int n = lk__nvml_count();
    if (index < 0 || index >= n)
        return lk_error(LK_STATUS_DEVICE, "gpu stats: NVML sees %d GPU%s, no index %d", n, n == 1 ? "" : "s", index);
    nvml_device d;
    int r = nv.handle((unsigned)index, &d);
    if (r != NVML_OK) return lk_error(LK_STATUS_DEVICE, "gpu stats: GPU %d: %s", index, nv.err ? nv.err(r) : "error");
    /* Each query may be unsupported on some boards (power on many consumer
     * cards): that field stays unknown, the others still count. */
    if (nv.name && nv.name(d, out->name, sizeof out->name) != NVML_OK) out->name[0] = 0;
    nvml_utilization u;
    if (nv.util && nv.util(d, &u) == NVML_OK) out->utilization_pct = (int)u.gpu, out->mem_utilization_pct = (int)u.memory;
    nvml_memory m;
    if (nv.mem && nv.mem(d, &m) == NVML_OK) out->mem_used = (size_t)m.used, out->mem_total = (size_t)m.total;
    unsigned int t, mw;
    if (nv.temp && nv.temp(d, NVML_TEMPERATURE_GPU, &t) == NVML_OK) out->temperature_c = (int)t;
    if (nv.power && nv.power(d, &mw) == NVML_OK) out->power_w = mw / 1000.0;
    return LK_STATUS_OK;
}
