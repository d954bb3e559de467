lk_add_test(NAME backend_gemm SOURCES backend/test_gemm.c LABELS unit parity TIMEOUT 120)
lk_add_test(NAME backend_elementwise SOURCES backend/test_elementwise.c LABELS unit parity)
lk_add_test(NAME backend_conv SOURCES backend/test_conv.c LABELS unit parity)
lk_add_test(NAME backend_grad_utils SOURCES backend/test_grad_utils.c LABELS unit parity)
