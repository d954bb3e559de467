# dist: process group, communicators (self, shm, mpi), launcher, failure detection.
lk_add_test(NAME dist_unit SOURCES comm/test_dist_unit.c LABELS unit TIMEOUT 60)
lk_add_test(NAME dist_shm SOURCES comm/test_dist_shm.c LABELS multiproc threads TIMEOUT 120)
lk_add_test(NAME dist_fault SOURCES comm/test_dist_fault.c LABELS multiproc fault threads TIMEOUT 90)
# comm_timeout vs LK_COMM_TIMEOUT (a config key wins, then the variable, then
# 120) and the timeout message naming the source of the bound that ran out
lk_add_test(NAME comm_timeout_source SOURCES comm/test_timeout_source.c LABELS multiproc fault TIMEOUT 60)
# Two jobs with one job id / MASTER_PORT, their rendezvous steps forced into many interleavings.
lk_add_test(NAME dist_clash SOURCES comm/test_dist_clash.c LABELS multiproc fault TIMEOUT 240)
# Process groups (split, the 2 x 2 mesh) and point-to-point on shm, and their failures named per pair.
lk_add_test(NAME dist_group SOURCES comm/test_dist_group.c LABELS multiproc fault threads TIMEOUT 120)
lk_add_script_test(NAME dist_launch SCRIPT comm/test_launch.sh LABELS multiproc fault TIMEOUT 90)

# The mpi backend under mpirun (CI installs OpenMPI): 2 and 3 ranks, plus the
# shm backend picking its process group from OpenMPI's variables.
if(LK_HAVE_MPI)
  find_program(LK_MPIRUN NAMES mpirun mpiexec)
  if(LK_MPIRUN)
    add_executable(test_dist_mpi comm/test_dist_mpi.c)
    target_include_directories(test_dist_mpi PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(test_dist_mpi PRIVATE lockstep_static)
    target_compile_definitions(test_dist_mpi PRIVATE LK_HAVE_MPI=1)
    set(LK_MPIRUN_FLAGS --oversubscribe)
    execute_process(COMMAND id -u OUTPUT_VARIABLE LK_UID OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(LK_UID STREQUAL "0")
      list(APPEND LK_MPIRUN_FLAGS --allow-run-as-root)
    endif()
    # OpenMPI leaks by design at MPI_Finalize and trips ThreadSanitizer inside its own transports;
    # neither can be fixed here, so leak checking is off and its libraries' frames are suppressed.
    set(LK_MPI_TEST_ENV "ASAN_OPTIONS=detect_leaks=0"
        "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/comm/sanitizer_mpi.supp")
    foreach(np 2 3)
      add_test(NAME dist_mpi_np${np} COMMAND ${LK_MPIRUN} ${LK_MPIRUN_FLAGS} -np ${np} $<TARGET_FILE:test_dist_mpi> mpi)
      set_tests_properties(dist_mpi_np${np} PROPERTIES TIMEOUT 90 LABELS "multiproc;threads;mpi"
                           ENVIRONMENT "${LK_MPI_TEST_ENV}")
    endforeach()
    # Faults under mpirun: a desync and a SIGSTOPped rank of `lockstep fit` must end the whole MPI job (MPI_Abort).
    add_test(NAME dist_mpi_fault COMMAND bash ${PROJECT_SOURCE_DIR}/tests/comm/test_mpi_fault.sh
             WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
    string(REPLACE ";" " " LK_MPIRUN_FLAGS_STR "${LK_MPIRUN_FLAGS}")
    set_tests_properties(dist_mpi_fault PROPERTIES TIMEOUT 120 LABELS "multiproc;fault;mpi" RUN_SERIAL TRUE
                         ENVIRONMENT "${LK_MPI_TEST_ENV};LK_BIN=$<TARGET_FILE:lockstep>;LK_MPIRUN=${LK_MPIRUN};LK_MPIRUN_FLAGS=${LK_MPIRUN_FLAGS_STR};LK_TEST_DIST_MPI=$<TARGET_FILE:test_dist_mpi>")
    # Groups and point-to-point on the mpi backend: the 2 x 2 mesh (4 ranks, oversubscribed) etc.
    add_test(NAME dist_mpi_group COMMAND ${LK_MPIRUN} ${LK_MPIRUN_FLAGS} -np 4 $<TARGET_FILE:test_dist_mpi> group)
    set_tests_properties(dist_mpi_group PROPERTIES TIMEOUT 90 LABELS "multiproc;threads;mpi"
                         ENVIRONMENT "${LK_MPI_TEST_ENV}")
    add_test(NAME dist_mpi_env_shm COMMAND ${LK_MPIRUN} ${LK_MPIRUN_FLAGS} -np 2 $<TARGET_FILE:test_dist_mpi> shm)
    set_tests_properties(dist_mpi_env_shm PROPERTIES TIMEOUT 60 LABELS "multiproc;threads;mpi"
                         ENVIRONMENT "${LK_MPI_TEST_ENV}")
  endif()
endif()
