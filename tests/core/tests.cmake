lk_add_test(NAME core SOURCES core/test_core.c LABELS unit)
lk_add_test(NAME core_fileio_vec SOURCES core/test_fileio_vec.c LABELS unit)
lk_add_test(NAME core_alloc_limit SOURCES core/test_alloc_limit.c LABELS unit)
