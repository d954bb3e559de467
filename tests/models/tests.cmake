lk_add_test(NAME models SOURCES models/test_models.c LABELS unit parity TIMEOUT 120)
