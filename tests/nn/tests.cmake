lk_add_test(NAME nn_layers SOURCES nn/test_layers.c LABELS unit parity TIMEOUT 60)
