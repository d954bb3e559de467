lk_add_test(NAME sealed_train SOURCES sealed/test_sealed.c LABELS unit TIMEOUT 300)
