# The data layer: file formats, datasets and transforms, sampler and loader
# (threads), failure injection.
lk_add_test(NAME data_formats SOURCES data/test_formats.c LABELS unit TIMEOUT 60)
lk_add_test(NAME data_dataset SOURCES data/test_dataset.c LABELS unit TIMEOUT 60)
lk_add_test(NAME data_loader SOURCES data/test_loader.c LABELS unit threads TIMEOUT 60)
lk_add_test(NAME data_faults SOURCES data/test_faults.c LABELS fault threads TIMEOUT 60)
lk_add_test(NAME data_download SOURCES data/test_download.c LABELS unit TIMEOUT 60)
# The loader benchmark is `lockstep bench data` (src/cli/cmd_bench_data.c).
if(LK_FUZZ)
  add_executable(fuzz_data_readers data/fuzz_readers.c)
  target_compile_options(fuzz_data_readers PRIVATE -fsanitize=fuzzer)
  target_link_options(fuzz_data_readers PRIVATE -fsanitize=fuzzer)
  target_link_libraries(fuzz_data_readers PRIVATE lockstep_static)
endif()
lk_add_test(NAME data_eval_sampler SOURCES data/test_eval_sampler.c LABELS unit TIMEOUT 30)
