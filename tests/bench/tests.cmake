# bench/compare and bench/pytorch/train.py (Python): their option checks, and
# one tiny end-to-end run in both precisions where PyTorch, /usr/bin/time and
# OpenBLAS are installed (skipped otherwise: they are not build dependencies).
lk_add_script_test(NAME bench_compare SCRIPT bench/test_compare.sh LABELS multiproc TIMEOUT 300)
set_tests_properties(bench_compare PROPERTIES SKIP_RETURN_CODE 77)
