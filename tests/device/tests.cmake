lk_add_test(NAME device SOURCES device/test_device.c LABELS unit TIMEOUT 60)
