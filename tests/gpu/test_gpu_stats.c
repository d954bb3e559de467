/* DeviceStatsMonitor's GPU metrics without a GPU: the names and values
 * lk__log_device_stats logs from one GPU's NVML stats (Lightning's GPU stats
 * names, per device id; the fields NVML could not answer left out), and the
 * NVML index of a CUDA device under CUDA_VISIBLE_DEVICES. The NVML call
 * itself is gpu_nvml's (label gpu). */
#include "device/gpu.h"
#include "lk_test.h"
#include "train/train_impl.h"

static void every_field(void) {
    lk__gpu_stats s = {.utilization_pct = 87, .mem_utilization_pct = 40, .mem_used = (size_t)3 << 30,
                       .mem_total = (size_t)80 << 30, .temperature_c = 61, .power_w = 312.5};
    char name[LK__GPU_METRICS][80];
    double v[LK__GPU_METRICS];
    int n = lk__gpu_stats_metrics(1, &s, name, v);
    CHECK(n == 6);
    static const char *const want[] = {"device_stats/device_id: 1/utilization.gpu (%)",
                                       "device_stats/device_id: 1/utilization.memory (%)",
                                       "device_stats/device_id: 1/memory.used (MB)",
                                       "device_stats/device_id: 1/memory.free (MB)",
                                       "device_stats/device_id: 1/temperature.gpu (\xc2\xb0" "C)",
                                       "device_stats/device_id: 1/power.draw (W)"};
    static const double wantv[] = {87, 40, 3072, 77 * 1024, 61, 312.5};
    for (int k = 0; k < n && k < 6; k++) {
        CHECK_MSG(!strcmp(name[k], want[k]), "metric %d: '%s', expected '%s'", k, name[k], want[k]);
        CHECK_MSG(v[k] == wantv[k], "%s = %g, expected %g", name[k], v[k], wantv[k]);
    }
}

/* What NVML did not answer (lk__nvml_stats' -1 and 0) is not logged as a value. */
static void unknown_fields_left_out(void) {
    lk__gpu_stats s = {.utilization_pct = 5, .mem_utilization_pct = -1, .mem_used = 0, .mem_total = 0,
                       .temperature_c = -1, .power_w = -1};
    char name[LK__GPU_METRICS][80];
    double v[LK__GPU_METRICS];
    CHECK(lk__gpu_stats_metrics(0, &s, name, v) == 1);
    CHECK(!strcmp(name[0], "device_stats/device_id: 0/utilization.gpu (%)") && v[0] == 5);
}

static void nvml_index(void) {
    CHECK(lk__nvml_index_for(0, NULL) == 0);
    CHECK(lk__nvml_index_for(1, "") == 1);
    CHECK(lk__nvml_index_for(1, "3,5") == 5);
    CHECK(lk__nvml_index_for(0, "3,5") == 3);
    CHECK(lk__nvml_index_for(2, "3,5") == 2);                 /* past the list: CUDA would not see it */
    CHECK(lk__nvml_index_for(1, "GPU-8f3a,GPU-77c1") == 1);   /* UUIDs: no index to map */
    CHECK(lk__nvml_index_for(1, "MIG-1/2/3") == 1);
}

LK_TEST_MAIN(LK_TEST_CASE(every_field), LK_TEST_CASE(unknown_fields_left_out), LK_TEST_CASE(nvml_index))
