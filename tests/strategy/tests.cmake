lk_add_test(NAME strategy_ddp SOURCES strategy/test_ddp.c LABELS multiproc threads TIMEOUT 180)
lk_add_test(NAME strategy_dp SOURCES strategy/test_dp.c LABELS unit threads TIMEOUT 120)
lk_add_test(NAME strategy_step SOURCES strategy/test_step.c LABELS unit threads TIMEOUT 60)
lk_add_test(NAME strategy_layout SOURCES strategy/test_layout.c LABELS unit TIMEOUT 60)
# The overlap check times backward against a slowed communicator: alone, it
# measures the strategy rather than the other tests' load.
set_tests_properties(strategy_ddp PROPERTIES RUN_SERIAL TRUE)
# ZeRO stages 1 and 2 against ddp on 2, 3 and 4 ranks: bitwise, with clipping, accumulation, bf16-mixed,
# 16-mixed, a parameter count no world size divides, exact resume, the class node and the refusals.
lk_add_script_test(NAME strategy_zero SCRIPT strategy/test_zero.sh LABELS multiproc TIMEOUT 300)
if(LK_HAVE_MPI AND LK_MPIRUN)
  string(REPLACE ";" " " LK_ZERO_MPIRUN_FLAGS "${LK_MPIRUN_FLAGS}")
  add_test(NAME strategy_zero_mpi COMMAND bash ${PROJECT_SOURCE_DIR}/tests/strategy/test_zero.sh mpi
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(strategy_zero_mpi PROPERTIES TIMEOUT 180 LABELS "multiproc;mpi"
                       ENVIRONMENT "${LK_MPI_TEST_ENV};LK_BIN=$<TARGET_FILE:lockstep>;LK_MPIRUN=${LK_MPIRUN};LK_MPIRUN_FLAGS=${LK_ZERO_MPIRUN_FLAGS}")
endif()
