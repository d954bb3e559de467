# bench/compare and bench/pytorch/train.py (Python): their option checks, and
# one tiny end-to-end run in both precisions where PyTorch, /usr/bin/time and
# OpenBLAS are installed (skipped otherwise: they are not build dependencies).
lk_add_script_test(NAME bench_compare SCRIPT bench/test_compare.sh LABELS multiproc TIMEOUT 300)
set_tests_properties(bench_compare PROPERTIES SKIP_RETURN_CODE 77)
# bench/ab's bootstrap interval and --tool cpu's grid parsing (no build, no timing).
lk_add_script_test(NAME bench_ab SCRIPT bench/test_ab.sh LABELS unit TIMEOUT 60)
set_tests_properties(bench_ab PROPERTIES SKIP_RETURN_CODE 77)
# bench/gpu-compare's --deadline, per-cell CSV and a failed side, with fake
# programs for lockstep and PyTorch (no GPU, no timing).
lk_add_script_test(NAME bench_gpu_compare SCRIPT bench/test_gpu_compare.sh LABELS unit TIMEOUT 60)
set_tests_properties(bench_gpu_compare PROPERTIES SKIP_RETURN_CODE 77)
