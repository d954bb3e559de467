lk_add_test(NAME device SOURCES device/test_device.c LABELS unit TIMEOUT 60)
# Out of device memory: the pool gives a refusing device its cache back and
# retries; a fit that does not fit fails cleanly and the next one trains.
lk_add_test(NAME device_oom SOURCES device/test_pool_oom.c LABELS unit TIMEOUT 120)
