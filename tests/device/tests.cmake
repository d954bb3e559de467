lk_add_test(NAME device SOURCES device/test_device.c LABELS unit TIMEOUT 60)
# Out of device memory: the pool gives a refusing device its cache back and
# retries; a fit that does not fit fails cleanly and the next one trains.
lk_add_test(NAME device_oom SOURCES device/test_pool_oom.c LABELS unit TIMEOUT 120)
# Graph capture's wrappers on kinds without graph methods (cpu: a clear
# error, no crash), dispatch to a kind with them, and the once-per-index
# table that makes each GPU's compute stream: no GPU needed.
lk_add_test(NAME device_graph_cpu SOURCES device/test_graph_cpu.c LABELS unit TIMEOUT 60)
