# Host-side GPU logic, run everywhere (no GPU needed).
lk_add_test(NAME gpu_select SOURCES gpu/test_gpu_select.c LABELS unit TIMEOUT 60)

# The `gpu` label: tests that need a CUDA device. Each exits 77 (ctest's
# skip) printing "no CUDA device" when none is visible, so CI and GPU-less
# machines report them as skipped, never as passed. tools/gpu/session.sh
# runs them on a GPU machine with `ctest -L gpu`.
if(LK_HAVE_CUDA)
  foreach(t gpu_device gpu_gemm gpu_nvml gpu_nccl gpu_ops)
    string(REPLACE "gpu_" "" src ${t})
    lk_add_test(NAME ${t} SOURCES gpu/test_${src}.c LABELS gpu TIMEOUT 300)
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
endif()
# The NCCL id bootstrap through a fake transport: bytes only, no GPU.
lk_add_test(NAME nccl_bootstrap SOURCES gpu/test_nccl_bootstrap.c LABELS unit TIMEOUT 60)
# `lockstep env`'s GPU lines, on every machine.
lk_add_script_test(NAME gpu_env SCRIPT gpu/test_env.sh LABELS unit TIMEOUT 60)
# GEMM rates on a GPU (not a test; tools/gpu/session.sh runs it).
if(LK_HAVE_CUDA)
  add_executable(bench_gpu_gemm gpu/bench_gemm.c)
  target_include_directories(bench_gpu_gemm PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(bench_gpu_gemm PRIVATE lockstep_static)
endif()
# accelerator: gpu through `lockstep fit` without a GPU: one error before launch.
lk_add_script_test(NAME gpu_cli SCRIPT gpu/test_cli.sh LABELS unit TIMEOUT 60)
set_tests_properties(gpu_cli PROPERTIES SKIP_RETURN_CODE 77)
# The gpu_ops case table without a GPU: every descriptor valid, run by the
# CPU backend and taken by the cuda backend's supports() (no CUDA call).
if(LK_HAVE_CUDA)
  add_test(NAME gpu_ops_table COMMAND test_gpu_ops --table)
  set_tests_properties(gpu_ops_table PROPERTIES LABELS unit TIMEOUT 120)
endif()
