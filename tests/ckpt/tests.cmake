lk_add_test(NAME ckpt_safetensors SOURCES ckpt/test_safetensors.c LABELS unit fault TIMEOUT 60)
# PyTorch cross-check: only where Debian's python3 (with python3-torch) is installed.
if(EXISTS /usr/bin/python3)
  lk_add_test(NAME ckpt_safetensors_python SOURCES ckpt/test_st_python.c LABELS unit parity TIMEOUT 120)
endif()
# Benchmark program (not a test): build/tests/bench_safetensors [DIR] [MB]
add_executable(bench_safetensors ckpt/bench_safetensors.c)
target_include_directories(bench_safetensors PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(bench_safetensors PRIVATE lockstep_static)
# The committed fuzz corpora (seeds and regression inputs) replayed through the
# fuzz targets' entry points without libFuzzer.
lk_add_test(NAME fuzz_replay_safetensors SOURCES ../fuzz/fuzz_safetensors.c ../fuzz/replay.c LABELS unit TIMEOUT 60
            ARGS ${PROJECT_SOURCE_DIR}/fuzz/corpus/fuzz_safetensors)
lk_add_test(NAME fuzz_replay_config SOURCES ../fuzz/fuzz_config.c ../fuzz/replay.c LABELS unit TIMEOUT 60
            ARGS ${PROJECT_SOURCE_DIR}/fuzz/corpus/fuzz_config)
