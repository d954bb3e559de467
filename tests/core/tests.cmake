lk_add_test(NAME core SOURCES core/test_core.c LABELS unit)
