# The trainer's output pieces: loggers, progress, run.json, PNG grids.
lk_add_test(NAME train_out_csv SOURCES train_out/test_csv.c LABELS unit TIMEOUT 60)
lk_add_test(NAME train_out_tb SOURCES train_out/test_tb.c LABELS unit TIMEOUT 60)
lk_add_test(NAME train_out_progress SOURCES train_out/test_progress.c LABELS unit TIMEOUT 60)
lk_add_test(NAME train_out_runinfo SOURCES train_out/test_runinfo.c LABELS unit TIMEOUT 60)
# Decodes the PNGs with Debian's libstb (stb_image), independent of the writer
# (which compiles stb_image_write into src/train/image.c).
find_library(LK_STB_LIB NAMES stb)
if(LK_STB_LIB)
  lk_add_test(NAME train_out_image SOURCES train_out/test_image.c LABELS unit TIMEOUT 60)
  target_link_libraries(test_train_out_image PRIVATE ${LK_STB_LIB})
else()
  message(STATUS "  libstb not found: train_out_image test not built")
endif()
# Not a test: the per-call cost of the output calls (numbers in the report).
add_executable(bench_train_out train_out/bench_out.c)
target_include_directories(bench_train_out PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(bench_train_out PRIVATE lockstep_static)
