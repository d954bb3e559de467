lk_add_test(NAME nn_layers SOURCES nn/test_layers.c LABELS unit parity TIMEOUT 60)
lk_add_test(NAME nn_sync_batchnorm SOURCES nn/test_sync_bn.c LABELS multiproc TIMEOUT 60)
lk_add_test(NAME nn_sync_batchnorm_train SOURCES nn/test_sync_bn_train.c LABELS multiproc TIMEOUT 60)
lk_add_test(NAME nn_sync_batchnorm_torch SOURCES nn/test_sync_bn_torch.c LABELS multiproc parity TIMEOUT 60)
