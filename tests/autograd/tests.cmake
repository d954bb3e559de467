lk_add_test(NAME autograd_basic SOURCES autograd/test_basic.c LABELS unit gradcheck)
