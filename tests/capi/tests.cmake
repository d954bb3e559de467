# capi: the C API as a user embeds it — the umbrella header, make install +
# lockstep.pc, examples/custom_module.c on 2 ranks, and a program that starts
# its own ranks (trainer.h, "Starting the ranks").
lk_add_test(NAME capi_self_launch SOURCES capi/test_self_launch.c LABELS multiproc ARGS ok TIMEOUT 120)
add_test(NAME capi_self_launch_fail COMMAND test_capi_self_launch fail WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(capi_self_launch_fail PROPERTIES TIMEOUT 120 LABELS "multiproc;fault")
# issue 47: a pipeline fit, then validate / test / predict on the same trainer
lk_add_test(NAME capi_pipeline_same_trainer SOURCES capi/test_pipeline_same_trainer.c LABELS multiproc TIMEOUT 120)
lk_add_script_test(NAME capi_example SCRIPT capi/test_example.sh LABELS multiproc TIMEOUT 180
                   ARGS $<TARGET_FILE:custom_module>)
# The installed library carries the build's sanitizer flags, which a plain
# compile against it lacks: not run under the sanitizers.
lk_add_script_test(NAME capi_install SCRIPT capi/test_install.sh LABELS multiproc nosan TIMEOUT 300
                   ARGS ${PROJECT_BINARY_DIR} ${CMAKE_C_COMPILER})
# issue 48: Libs.private names CUDA libraries only in a build that uses them
lk_add_script_test(NAME capi_pc SCRIPT capi/test_pc.sh LABELS unit nosan TIMEOUT 120
                   ARGS ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
# issue 48: lk_module_create / lk_datamodule_create, setup() optional,
# lk_trainer_get_metric (lk_status), lk_log_accuracy
lk_add_test(NAME capi_c_api SOURCES capi/test_c_api.c LABELS unit TIMEOUT 60)
