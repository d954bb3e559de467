# The fake GPU (tests/gpu/fake/): the library's own C objects — the cuda
# device, the backend's dispatch and launchers' callers, cuBLASLt's use —
# linked with a host implementation of the CUDA runtime (fake_cudart.cpp),
# the kernel files' host emulation (emu_sources, from tests/gpu/tests.cmake,
# built here with their real names, their launches queued on the fake's
# streams), a fake cuBLASLt (lt.cmake) and an NCCL between processes
# (fake_nccl.cpp). The gpu
# tests then run against it in every CI run, as fake_<name>: what they
# check on a GPU, checked here for everything but the GPU itself.
# Included from tests/gpu/tests.cmake inside if(LK_HAVE_CUDA AND Python3_FOUND).
set(LK_FAKE_DIR ${PROJECT_SOURCE_DIR}/tests/gpu/fake)

# The kernels: emulated, launched through the fake runtime.
add_library(lk_fakegpu_kernels OBJECT ${emu_sources})
target_include_directories(lk_fakegpu_kernels BEFORE PRIVATE ${PROJECT_SOURCE_DIR}/tests/gpu/emu
                           ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
target_compile_definitions(lk_fakegpu_kernels PRIVATE LK_FAKE_GPU=1 LK_CU_THREADS=32 LK_CU_MAX_BLOCKS=2 RED_BLOCKS=3
                           _GNU_SOURCE LK_HAVE_CUDA=1)
set_target_properties(lk_fakegpu_kernels PROPERTIES CXX_STANDARD 17)

# The runtime and NCCL stand-ins, with the real headers for the exact ABI.
add_library(lk_fakegpu_rt OBJECT ${LK_FAKE_DIR}/fake_cudart.cpp ${LK_FAKE_DIR}/fake_nccl.cpp)
target_include_directories(lk_fakegpu_rt PRIVATE ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_INCLUDE_DIR}
                           ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/include)
set_target_properties(lk_fakegpu_rt PROPERTIES CXX_STANDARD 17)
target_compile_options(lk_fakegpu_rt PRIVATE -Wall -Wextra $<$<BOOL:${LK_WERROR}>:-Werror>)

# The library as the fake GPU programs link it: without libcudart and NCCL.
set(LK_FAKE_LINK ${LK_LINK})
list(REMOVE_ITEM LK_FAKE_LINK CUDA::cudart ${NCCL_LIB})
add_library(lockstep_fakegpu STATIC $<TARGET_OBJECTS:lockstep_obj> $<TARGET_OBJECTS:lk_fakegpu_kernels>
            $<TARGET_OBJECTS:lk_fakegpu_rt>)
target_include_directories(lockstep_fakegpu PUBLIC ${PROJECT_SOURCE_DIR}/include)
target_compile_definitions(lockstep_fakegpu PUBLIC _GNU_SOURCE LK_HAVE_CUDA=1)
target_link_libraries(lockstep_fakegpu PUBLIC ${LK_FAKE_LINK} Threads::Threads ${CMAKE_DL_LIBS})
set_target_properties(lockstep_fakegpu PROPERTIES LINKER_LANGUAGE CXX)

include(${LK_FAKE_DIR}/lt.cmake)

# fake_<name>: a gpu test's program, linked with the fake GPU. The
# executable exports its symbols: the fake cuBLASLt (a dlopened library)
# queues its work through the fake runtime's lk_fake_enqueue.
set(LK_FAKE_LIB ${CMAKE_CURRENT_BINARY_DIR}/fakegpu-lib) # where lt.cmake puts the fake libcublasLt
set(LK_FAKE_ENV "LK_FAKE_GPUS=2;LD_LIBRARY_PATH=${LK_FAKE_LIB}")
function(lk_add_fake_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;ARGS;LABELS;ENV" ${ARGN})
  add_executable(fake_${T_NAME} ${T_SOURCES})
  target_include_directories(fake_${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src
                             ${CBLAS_INCLUDE_DIR})
  target_compile_definitions(fake_${T_NAME} PRIVATE LK_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                             LK_BUILD_DIR="${PROJECT_BINARY_DIR}" LK_HAVE_CUDA=1)
  target_link_libraries(fake_${T_NAME} PRIVATE lockstep_fakegpu)
  add_dependencies(fake_${T_NAME} lk_fake_cublaslt)
  set_target_properties(fake_${T_NAME} PROPERTIES LINKER_LANGUAGE CXX ENABLE_EXPORTS ON)
  add_test(NAME fake_${T_NAME} COMMAND fake_${T_NAME} ${T_ARGS} WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(fake_${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "unit;fakegpu;${T_LABELS}" ENVIRONMENT "${LK_FAKE_ENV};${T_ENV}")
endfunction()

lk_add_fake_test(NAME gpu_device SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_device.c TIMEOUT 120)
lk_add_fake_test(NAME gpu_gemm SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_gemm.c TIMEOUT 300)
lk_add_fake_test(NAME gpu_ops SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_ops.c TIMEOUT 300)
lk_add_fake_test(NAME gpu_mlp_step SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_mlp_step.c TIMEOUT 300)
lk_add_fake_test(NAME gpu_graph SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_graph.c TIMEOUT 300)
# The long ones (whole fits: minutes on the emulated kernels) are nosan:
# the sanitizer builds run the ops, graph and step programs above.
lk_add_fake_test(NAME gpu_fit SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_fit.c TIMEOUT 900 LABELS nosan)
lk_add_fake_test(NAME gpu_replay SOURCES ${PROJECT_SOURCE_DIR}/tests/sealed/test_replay.c TIMEOUT 900 ARGS --gpu LABELS nosan)
# nccl between two processes (fake_nccl.cpp), staging in rounds of 4 KiB so
# that every collective of the test takes several
lk_add_fake_test(NAME gpu_nccl SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_nccl.c TIMEOUT 600 LABELS multiproc threads
                 ENV LK_FAKE_NCCL_SLOT=4096)
lk_add_fake_test(NAME gpu_sync_bn SOURCES ${PROJECT_SOURCE_DIR}/tests/gpu/test_sync_bn.c TIMEOUT 300)

# The program itself on the fake GPU, for the gpu script tests: ddp's two
# ranks (two processes, each its own fake GPU, shm between them) and dp
# over two fake GPUs in one process (peer copies and their events).
add_executable(lockstep_fakegpu_cli ${LK_CLI_SOURCES})
target_include_directories(lockstep_fakegpu_cli PRIVATE ${PROJECT_SOURCE_DIR}/src ${CBLAS_INCLUDE_DIR})
target_compile_definitions(lockstep_fakegpu_cli PRIVATE LK_GIT_REV="${LK_GIT_REV}")
target_link_libraries(lockstep_fakegpu_cli PRIVATE lockstep_fakegpu)
set_target_properties(lockstep_fakegpu_cli PROPERTIES LINKER_LANGUAGE CXX ENABLE_EXPORTS ON OUTPUT_NAME lockstep-fakegpu)
add_dependencies(lockstep_fakegpu_cli lk_fake_cublaslt)
# name strategy GPUs communicator: ddp's two ranks on one GPU talk over shm;
# on two GPUs, one rank each, over nccl (fake_nccl.cpp, in rounds of 256
# bytes so that every bucket takes many); dp has no communicator.
foreach(t "ddp_two;ddp;1;shm" "ddp_nccl;ddp;2;nccl" "dp_two;dp;2;")
  list(GET t 0 name)
  list(GET t 1 s)
  list(GET t 2 gpus)
  list(GET t 3 comm)
  add_test(NAME fake_gpu_${name} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/test_ddp_one_gpu.sh
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  # threads: under ThreadSanitizer too (dp's replica threads, the loader's
  # and the prefetch's, all calling into the cuda device)
  set_tests_properties(fake_gpu_${name} PROPERTIES LABELS "unit;fakegpu;multiproc;nosan;threads" TIMEOUT 600
                       ENVIRONMENT "LK_FAKE_GPUS=${gpus};LD_LIBRARY_PATH=${LK_FAKE_LIB};LK_TEST_STRATEGY=${s};LK_TEST_COMM=${comm};LK_FAKE_NCCL_SLOT=256;LK_BIN=$<TARGET_FILE:lockstep_fakegpu_cli>;LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endforeach()
# SyncBatchNorm over nccl on the fake GPU's two: device buffers all-reduced, one CPU process's batch 16 matched.
add_test(NAME fake_gpu_sync_bn_ddp COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/test_sync_bn_ddp.sh WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(fake_gpu_sync_bn_ddp PROPERTIES LABELS "unit;fakegpu;multiproc;nosan" TIMEOUT 300
                     ENVIRONMENT "LK_FAKE_GPUS=2;LD_LIBRARY_PATH=${LK_FAKE_LIB};LK_FAKE_NCCL_SLOT=256;LK_BIN=$<TARGET_FILE:lockstep_fakegpu_cli>;LK_CPU_BIN=$<TARGET_FILE:lockstep>;LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
add_test(NAME fake_gpu_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/fake/test_cli.sh WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(fake_gpu_cli PROPERTIES LABELS "unit;fakegpu;multiproc" TIMEOUT 300
                     ENVIRONMENT "${LK_FAKE_ENV};LK_BIN=$<TARGET_FILE:lockstep_fakegpu_cli>;LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
add_test(NAME fake_gpu_run COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/fake/test_run.sh WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(fake_gpu_run PROPERTIES LABELS "unit;fakegpu;multiproc;nosan" TIMEOUT 300
                     ENVIRONMENT "LK_FAKE_GPUS=1;LD_LIBRARY_PATH=${LK_FAKE_LIB};LK_BIN=$<TARGET_FILE:lockstep_fakegpu_cli>;LK_CPU_BIN=$<TARGET_FILE:lockstep>;LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
# pipeline on GPUs (issue 47): gpipe and 1f1b on two fake GPUs over nccl (each COMM action one NCCL group)
# bitwise single on one accumulating the same micro-batches, 2 x 2 on four bitwise ddp, test and predict through
# the stages; on one fake GPU (two ranks, shm) the refusal.
foreach(t "pipeline;4" "pipeline_shm;1")
  list(GET t 0 name)
  list(GET t 1 gpus)
  add_test(NAME fake_gpu_${name} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/test_pipeline_gpu.sh WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(fake_gpu_${name} PROPERTIES LABELS "unit;fakegpu;multiproc;nosan" TIMEOUT 300
                       ENVIRONMENT "LK_FAKE_GPUS=${gpus};LD_LIBRARY_PATH=${LK_FAKE_LIB};LK_FAKE_NCCL_SLOT=256;LK_BIN=$<TARGET_FILE:lockstep_fakegpu_cli>;LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endforeach()
# ZeRO stages 1-3 and fsdp on GPUs (issue 46): on the fake GPU's two over nccl against ddp there, bitwise, and
# resume; on one fake GPU (two ranks, shm) stage 1 against ddp and fsdp's refusal.
foreach(t "sharded;2" "sharded_shm;1")
  list(GET t 0 name)
  list(GET t 1 gpus)
  add_test(NAME fake_gpu_${name} COMMAND bash ${PROJECT_SOURCE_DIR}/tests/gpu/test_sharded_gpu.sh WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(fake_gpu_${name} PROPERTIES LABELS "unit;fakegpu;multiproc;nosan" TIMEOUT 600
                       ENVIRONMENT "LK_FAKE_GPUS=${gpus};LD_LIBRARY_PATH=${LK_FAKE_LIB};LK_FAKE_NCCL_SLOT=256;LK_BIN=$<TARGET_FILE:lockstep_fakegpu_cli>;LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endforeach()
