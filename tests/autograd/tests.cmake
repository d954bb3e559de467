lk_add_test(NAME autograd_basic SOURCES autograd/test_basic.c LABELS unit gradcheck)
lk_add_test(NAME autograd_conv SOURCES autograd/test_conv.c LABELS unit gradcheck threads)
lk_add_test(NAME autograd_ops_a SOURCES autograd/test_ops_a.c LABELS unit gradcheck)
lk_add_test(NAME autograd_graphs SOURCES autograd/test_graphs.c LABELS unit gradcheck)
