# multinode: a cluster of network/UTS/mount namespaces on this machine
# (scripts/netns-cluster.sh) and mpirun across it. Needs root, namespaces and
# mpirun; prints "skipped: why" (exit 77) where any is missing, so it is
# registered everywhere and skips cleanly in a container without CAP_NET_ADMIN.
set(LK_MN_ENV "LK_BIN=$<TARGET_FILE:lockstep>" "LK_SOURCE_DIR=${PROJECT_SOURCE_DIR}" "ASAN_OPTIONS=detect_leaks=0"
    "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/comm/sanitizer_mpi.supp")
if(LK_HAVE_MPI AND LK_MPIRUN)
  add_executable(mn_probe multinode/mn_probe.c)
  target_include_directories(mn_probe PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(mn_probe PRIVATE lockstep_static)
  add_executable(mn_coll multinode/mn_coll.c)
  target_include_directories(mn_coll PRIVATE ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(mn_coll PRIVATE lockstep_static m)
  list(APPEND LK_MN_ENV "LK_MPIRUN=${LK_MPIRUN}" "LK_MPIRUN_FLAGS=${LK_MPIRUN_FLAGS_STR}" "LK_MN_PROBE=$<TARGET_FILE:mn_probe>"
       "LK_MN_COLL=$<TARGET_FILE:mn_coll>")
endif()
add_test(NAME multinode_mpirun COMMAND bash ${PROJECT_SOURCE_DIR}/tests/multinode/test_multinode.sh
         WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(multinode_mpirun PROPERTIES TIMEOUT 120 LABELS "multinode;multiproc;fault;mpi" SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE ENVIRONMENT "${LK_MN_ENV}")
# SLURM's daemons on the namespace cluster (slurmctld, a slurmd per node, munged): srun --mpi=pmix, sbatch and
# salloc with mpirun, each 2 nodes x 2 ranks bitwise 4 ranks on one node. Skipped without slurm-wlm installed.
add_test(NAME multinode_slurm COMMAND bash ${PROJECT_SOURCE_DIR}/tests/multinode/test_slurm.sh
         WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(multinode_slurm PROPERTIES TIMEOUT 180 LABELS "multinode;multiproc;mpi" SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE ENVIRONMENT "${LK_MN_ENV}")
# SLURM's variables, faked (no daemons): rank, node and job id per rank, and bad launches named at once.
lk_add_script_test(NAME multinode_slurm_env SCRIPT multinode/test_slurm_env.sh LABELS multinode unit TIMEOUT 60)
# Bad multi-node launches, each a clear error within 10 s: MASTER_ADDR unreachable, MASTER_PORT in use, RANK
# given twice (no root needed), then in a 2-node cluster a host file naming an unknown node and num_nodes that
# differs between nodes (that part skipped without root, namespaces or mpirun).
add_test(NAME multinode_bad_input COMMAND bash ${PROJECT_SOURCE_DIR}/tests/multinode/test_bad_input.sh
         WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(multinode_bad_input PROPERTIES TIMEOUT 120 LABELS "multinode;multiproc;mpi" RUN_SERIAL TRUE
                     ENVIRONMENT "${LK_MN_ENV}")
# The collectives across nodes: hier's pipelined all-reduce, its all-gather and reduce-scatter through the node
# leaders (and their flat fallback for ranks dealt round-robin), the two-host swap's all-gather and
# reduce-scatter: right and bitwise as the unpipelined / OpenMPI reference (about 10 s; skipped like the above).
add_test(NAME multinode_hier_paths COMMAND bash ${PROJECT_SOURCE_DIR}/tests/multinode/test_hier_paths.sh
         WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(multinode_hier_paths PROPERTIES TIMEOUT 120 LABELS "multinode;multiproc;mpi" SKIP_RETURN_CODE 77
                     RUN_SERIAL TRUE ENVIRONMENT "${LK_MN_ENV}")
