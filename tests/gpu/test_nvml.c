/* NVML device stats on a GPU machine: the library loads, sees at least the
 * GPUs CUDA sees, and each answers memory, utilization and temperature in
 * plausible ranges (power may be unsupported on some boards). */
#include "gpu_test.h"
#include "lk_test.h"

static void stats(void) {
    char why[256];
    CHECK_MSG(lk__nvml_available(why, sizeof why), "NVML not available on a GPU machine: %s", why);
    int n = lk__nvml_count();
    CHECK_MSG(n >= lk__cuda_visible(), "NVML sees %d GPUs, CUDA %d", n, lk__cuda_visible());
    for (int i = 0; i < n; i++) {
        lk__gpu_stats s;
        CHECK_OK(lk__nvml_stats(i, &s));
        printf("GPU %d: %s util %d%% mem-util %d%% mem %.2f/%.2f GiB temp %d C power %.1f W\n", i, s.name,
               s.utilization_pct, s.mem_utilization_pct, s.mem_used / 1073741824.0, s.mem_total / 1073741824.0,
               s.temperature_c, s.power_w);
        CHECK(s.name[0]);
        CHECK(s.mem_total > 0 && s.mem_used <= s.mem_total);
        CHECK(s.utilization_pct >= 0 && s.utilization_pct <= 100);
        CHECK(s.temperature_c > 0 && s.temperature_c < 120);
    }
    lk__gpu_stats s;
    CHECK_ERR(lk__nvml_stats(n, &s), LK_STATUS_DEVICE, "no index");
}

int main(int argc, char **argv) {
    gpu_test_require();
    static const lk_t_case cases[] = {LK_TEST_CASE(stats)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
