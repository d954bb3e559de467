lk_add_test(NAME optim SOURCES optim/test_optim.c LABELS unit parity threads TIMEOUT 60)
lk_add_test(NAME optim_rmsprop SOURCES optim/test_rmsprop.c LABELS unit TIMEOUT 60)
lk_add_test(NAME optim_scaler SOURCES optim/test_scaler.c LABELS unit parity TIMEOUT 60)
