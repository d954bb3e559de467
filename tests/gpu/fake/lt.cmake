# The fake GPU's cuBLASLt (fake_cublaslt.cpp): a shared library named as the
# real one's soname, libcublasLt.so.<CUBLAS_VER_MAJOR>, in its own directory,
# so that gemm.c's dlopen finds it first when the fake tests' LD_LIBRARY_PATH
# names that directory. It includes the toolkit's headers only (exact
# signatures and enums) and links no CUDA library; fake.h's functions stay
# undefined, resolved from the test executable (ENABLE_EXPORTS) at dlopen.
# Included from tests/gpu/tests.cmake inside if(LK_HAVE_CUDA).
enable_language(CXX)
set(lk_fake_dir ${CMAKE_CURRENT_LIST_DIR})
# gemm.c dlopens "libcublasLt.so." CUBLAS_VER_MAJOR from cublas_api.h: the
# file is named from the same header, whatever the toolkit's own major says.
find_file(LK_CUBLAS_API_H cublas_api.h HINTS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
file(STRINGS ${LK_CUBLAS_API_H} lk_cublas_major REGEX "^#define CUBLAS_VER_MAJOR ")
string(REGEX REPLACE "^#define CUBLAS_VER_MAJOR +([0-9]+).*" "\\1" lk_cublas_major "${lk_cublas_major}")
if(NOT lk_cublas_major MATCHES "^[0-9]+$")
  message(FATAL_ERROR "tests/gpu/fake/lt.cmake: no CUBLAS_VER_MAJOR in ${LK_CUBLAS_API_H}")
endif()
if(NOT lk_cublas_major STREQUAL "${CUDAToolkit_VERSION_MAJOR}")
  message(STATUS "fake cuBLASLt: cuBLAS major ${lk_cublas_major} differs from the toolkit's ${CUDAToolkit_VERSION_MAJOR}; named after cuBLAS's, as gemm.c loads it")
endif()
set(lk_fake_cxx_flags -Wall -Wextra $<$<BOOL:${LK_WERROR}>:-Werror> -ffp-contract=off)
if(LK_SANITIZE STREQUAL "address")
  list(APPEND lk_fake_cxx_flags -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
endif()

add_library(lk_fake_cublaslt SHARED ${lk_fake_dir}/fake_cublaslt.cpp)
target_include_directories(lk_fake_cublaslt PRIVATE ${lk_fake_dir} ${CUDAToolkit_INCLUDE_DIRS})
target_compile_options(lk_fake_cublaslt PRIVATE ${lk_fake_cxx_flags})
set_target_properties(lk_fake_cublaslt PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                      OUTPUT_NAME cublasLt PREFIX lib SUFFIX ".so.${lk_cublas_major}" NO_SONAME ON
                      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/fakegpu-lib)

# Its unit test, over a stub of the fake runtime (stub_runtime.cpp); it
# dlopens the library by name, as gemm.c does, and does not link it.
add_executable(test_fake_cublaslt ${lk_fake_dir}/test_fake_cublaslt.cpp ${lk_fake_dir}/stub_runtime.cpp)
target_include_directories(test_fake_cublaslt PRIVATE ${lk_fake_dir} ${CUDAToolkit_INCLUDE_DIRS})
target_compile_options(test_fake_cublaslt PRIVATE ${lk_fake_cxx_flags})
target_link_libraries(test_fake_cublaslt PRIVATE ${CMAKE_DL_LIBS})
set_target_properties(test_fake_cublaslt PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON ENABLE_EXPORTS ON)
add_dependencies(test_fake_cublaslt lk_fake_cublaslt)
add_test(NAME fake_cublaslt COMMAND test_fake_cublaslt)
set_tests_properties(fake_cublaslt PROPERTIES LABELS unit TIMEOUT 60
                     ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_CURRENT_BINARY_DIR}/fakegpu-lib")
