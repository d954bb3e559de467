# Host-side GPU logic, run everywhere (no GPU needed).
lk_add_test(NAME gpu_select SOURCES gpu/test_gpu_select.c LABELS unit TIMEOUT 60)

# The `gpu` label: tests that need a CUDA device. Each exits 77 (ctest's
# skip) printing "no CUDA device" when none is visible, so CI and GPU-less
# machines report them as skipped, never as passed. tools/gpu/session.sh
# runs them on a GPU machine with `ctest -L gpu`.
if(LK_HAVE_CUDA)
  foreach(t gpu_device gpu_gemm gpu_nvml gpu_nccl gpu_ops gpu_mlp_step gpu_sync_bn)
    string(REPLACE "gpu_" "" src ${t})
    lk_add_test(NAME ${t} SOURCES gpu/test_${src}.c LABELS gpu TIMEOUT 300)
    set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
  endforeach()
endif()
# DeviceStatsMonitor's GPU metric names and values from NVML's stats, and the
# NVML index under CUDA_VISIBLE_DEVICES: no GPU.
lk_add_test(NAME gpu_stats_metrics SOURCES gpu/test_gpu_stats.c LABELS unit TIMEOUT 60)
# The NCCL id bootstrap through a fake transport: bytes only, no GPU.
lk_add_test(NAME nccl_bootstrap SOURCES gpu/test_nccl_bootstrap.c LABELS unit TIMEOUT 60)
# `lockstep env`'s GPU lines, on every machine.
lk_add_script_test(NAME gpu_env SCRIPT gpu/test_env.sh LABELS unit TIMEOUT 60)
# cuBLASLt is dlopened on the first GPU GEMM, not linked: that it loads, with
# every entry point, needs the toolkit but no GPU.
if(LK_HAVE_CUDA)
  add_test(NAME gpu_cublaslt_load COMMAND test_gpu_gemm --load)
  set_tests_properties(gpu_cublaslt_load PROPERTIES LABELS unit TIMEOUT 60 PASS_REGULAR_EXPRESSION "every entry point")
endif()
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
# The cuda backend's kernels run on the CPU: each src/backend/cuda/*.cu turned
# into C++ for a host emulation of the CUDA runtime (tests/gpu/emu/: blocks
# one after another, a block's threads as host threads) and compared with
# the CPU backend over gpu_ops' table. Catches indexing and arithmetic bugs
# in kernels that have never run on a GPU; says nothing about the GPU itself.
find_package(Python3 COMPONENTS Interpreter)
if(LK_HAVE_CUDA AND Python3_FOUND)
  enable_language(CXX)
  set(emu_sources "")
  foreach(cu elementwise rows optim conv widen)
    set(in ${PROJECT_SOURCE_DIR}/src/backend/cuda/${cu}.cu)
    set(out ${CMAKE_CURRENT_BINARY_DIR}/emu/${cu}.cpp)
    add_custom_command(OUTPUT ${out}
                       COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/emu
                       COMMAND Python3::Interpreter ${PROJECT_SOURCE_DIR}/tests/gpu/emu/cu2cpp.py ${in} ${out}
                       DEPENDS ${in} ${PROJECT_SOURCE_DIR}/tests/gpu/emu/cu2cpp.py VERBATIM)
    list(APPEND emu_sources ${out})
  endforeach()
  add_executable(test_gpu_ops_emu gpu/test_ops.c ${emu_sources})
  target_include_directories(test_gpu_ops_emu BEFORE PRIVATE ${PROJECT_SOURCE_DIR}/tests/gpu/emu
                             ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(test_gpu_ops_emu PRIVATE LK_GPU_OPS_EMU=1 LK_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                             lk__cuda_elementwise=lk__emu_elementwise lk__cuda_rows=lk__emu_rows
                             lk__cuda_optim=lk__emu_optim lk__cuda_conv=lk__emu_conv
                             lk__cuda_widened=lk__emu_widened LK_CU_THREADS=32 LK_CU_MAX_BLOCKS=3 RED_BLOCKS=5)
  set(emu_flags -ffp-contract=off -Drestrict=__restrict -Wall -Wno-unused-function $<$<BOOL:${LK_WERROR}>:-Werror>)
  if(LK_SANITIZE STREQUAL "address") # the kernels' indexing under ASan: the point of running them here
    list(APPEND emu_flags -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  endif()
  set_source_files_properties(${emu_sources} PROPERTIES COMPILE_OPTIONS "${emu_flags}")
  set_target_properties(test_gpu_ops_emu PROPERTIES CXX_STANDARD 17 LINKER_LANGUAGE CXX)
  target_link_libraries(test_gpu_ops_emu PRIVATE lockstep_static Threads::Threads)
  add_test(NAME gpu_ops_emu COMMAND test_gpu_ops_emu)
  set_tests_properties(gpu_ops_emu PROPERTIES LABELS unit TIMEOUT 300)
endif()
# Issue 21's fit check: the mlp and the autoencoder, 200 steps on cuda:0
# against the CPU's loss curve (label gpu). gpu_fit_sealed runs the same
# program on the tests' sealed device, so that every CI run checks the test.
lk_add_test(NAME gpu_fit_sealed SOURCES gpu/test_fit.c LABELS unit TIMEOUT 600 ARGS --sealed)
if(LK_HAVE_CUDA)
  add_test(NAME gpu_fit COMMAND test_gpu_fit_sealed WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(gpu_fit PROPERTIES LABELS gpu TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()
# Issue 21: graph capture of a training step through the device vtable —
# K replays equal K eager steps bit for bit, a read into host memory while
# capturing is refused and ends the capture (label gpu). gpu_graph_sealed
# runs the same cases on a fake that captures as the cuda device does
# (tests/sealed_device.h plus recording graph methods), in every CI run.
lk_add_test(NAME gpu_graph_sealed SOURCES gpu/test_graph.c LABELS unit TIMEOUT 120 ARGS --sealed)
if(LK_HAVE_CUDA)
  add_test(NAME gpu_graph COMMAND test_gpu_graph_sealed)
  set_tests_properties(gpu_graph PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
# Issue 21: two ddp ranks on one GPU (LK_ALLOW_OVERSUBSCRIBE, shm staging
# through host memory) train as two CPU ranks do (label gpu). The _cpu form
# runs the same script with both sides on the CPU, where they must agree
# exactly: every CI run checks the script's own comparison.
lk_add_script_test(NAME gpu_ddp_one_gpu_cpu SCRIPT gpu/test_ddp_one_gpu.sh LABELS unit multiproc TIMEOUT 300)
set_property(TEST gpu_ddp_one_gpu_cpu APPEND PROPERTY ENVIRONMENT LK_TEST_ACCEL=cpu LK_TEST_COMM=shm)
if(LK_HAVE_CUDA)
  lk_add_script_test(NAME gpu_ddp_one_gpu SCRIPT gpu/test_ddp_one_gpu.sh LABELS gpu TIMEOUT 600)
  set_tests_properties(gpu_ddp_one_gpu PROPERTIES SKIP_RETURN_CODE 77)
endif()
# Issue 46: ZeRO stages 1-3 and fsdp on GPUs against ddp on them, bitwise
# (two GPUs over nccl; one GPU: two ranks over shm). fake_gpu_sharded and
# fake_gpu_sharded_shm run it on the fake GPU in every CI run.
if(LK_HAVE_CUDA)
  lk_add_script_test(NAME gpu_sharded SCRIPT gpu/test_sharded_gpu.sh LABELS gpu TIMEOUT 600)
  set_tests_properties(gpu_sharded PROPERTIES SKIP_RETURN_CODE 77)
endif()
# Issue 47: pipeline on GPUs over nccl against single (and ddp) on them, bitwise; fake_gpu_pipeline and
# fake_gpu_pipeline_shm run it on the fake GPU in every CI run.
if(LK_HAVE_CUDA)
  lk_add_script_test(NAME gpu_pipeline SCRIPT gpu/test_pipeline_gpu.sh LABELS gpu TIMEOUT 600)
  set_tests_properties(gpu_pipeline PROPERTIES SKIP_RETURN_CODE 77)
endif()
# The gpu tests on the fake GPU (tests/gpu/fake/: a host CUDA runtime over
# the emulated kernels and a fake cuBLASLt), in every CI run.
if(LK_HAVE_CUDA AND Python3_FOUND)
  include(${PROJECT_SOURCE_DIR}/tests/gpu/fake/fake.cmake)
endif()
