lk_add_test(NAME optim SOURCES optim/test_optim.c LABELS unit parity threads TIMEOUT 60)
