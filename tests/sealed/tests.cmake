lk_add_test(NAME sealed_train SOURCES sealed/test_sealed.c LABELS unit TIMEOUT 300)
lk_add_test(NAME sealed_ddp SOURCES sealed/test_sealed_ddp.c LABELS unit multiproc TIMEOUT 300)
