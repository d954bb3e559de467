lk_add_test(NAME config SOURCES config/test_config.c LABELS unit TIMEOUT 60)
