lk_add_test(NAME config SOURCES config/test_config.c LABELS unit TIMEOUT 60)
lk_add_test(NAME config_lightning SOURCES config/test_lightning_config.c LABELS unit TIMEOUT 60)
