lk_add_test(NAME backend_gemm SOURCES backend/test_gemm.c LABELS unit parity TIMEOUT 120)
lk_add_test(NAME backend_gemm_own SOURCES backend/test_gemm_own.c LABELS unit parity TIMEOUT 120)
lk_add_test(NAME backend_elementwise SOURCES backend/test_elementwise.c LABELS unit parity)
lk_add_test(NAME backend_conv SOURCES backend/test_conv.c LABELS unit parity)
lk_add_test(NAME backend_grad_utils SOURCES backend/test_grad_utils.c LABELS unit parity)
lk_add_test(NAME backend_copy SOURCES backend/test_copy.c LABELS unit parity threads)
lk_add_test(NAME backend_bn_split SOURCES backend/test_bn_split.c LABELS unit parity)
lk_add_test(NAME backend_bn_half SOURCES backend/test_bn_half.c LABELS unit parity)
# batch norm's sample-by-sample walk against the channel walk it replaced, bit for bit (issue 49)
lk_add_test(NAME backend_bn_walk SOURCES backend/test_bn_walk.c LABELS unit parity threads)
lk_add_test(NAME backend_accuracy SOURCES backend/test_accuracy.c LABELS unit parity)
lk_add_test(NAME backend_live SOURCES backend/test_live.c LABELS unit parity)
lk_add_test(NAME backend_loss SOURCES backend/test_loss.c LABELS unit parity)
lk_add_test(NAME backend_pool SOURCES backend/test_pool.c LABELS unit parity)
lk_add_test(NAME backend_optim_bits SOURCES backend/test_optim_bits.c LABELS unit parity)
# Run-time instruction-set dispatch (src/backend/isa.h): every level this CPU
# can run gives the same checkpoint bits (isa_levels), and no object holds an
# instruction above what it may assume (isa_objects: objdump; x86 builds with
# copies only, not LK_NATIVE).
lk_add_script_test(NAME isa_levels SCRIPT backend/test_isa_levels.sh LABELS unit multiproc TIMEOUT 300)
set_tests_properties(isa_levels PROPERTIES SKIP_RETURN_CODE 77)
if(LK_X86 AND NOT LK_NATIVE)
  lk_add_script_test(NAME isa_objects SCRIPT backend/test_isa_objects.sh LABELS unit TIMEOUT 120
                     ARGS ${PROJECT_BINARY_DIR}/CMakeFiles/lockstep_obj.dir
                          $<IF:$<CONFIG:Release>,${LK_X86_BASELINE},x86-64>)
  set_tests_properties(isa_objects PROPERTIES SKIP_RETURN_CODE 77)
endif()
# The backend tests again on the baseline copies (LK_CPU_ISA=baseline: what a
# CPU with nothing above the build's baseline runs), against the same
# references; the plain runs above take the best copy this CPU has.
foreach(t gemm elementwise conv grad_utils copy bn_split bn_half bn_walk accuracy live loss pool optim_bits)
  add_test(NAME backend_${t}_baseline COMMAND test_backend_${t} WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  get_test_property(backend_${t} LABELS labels)
  set_tests_properties(backend_${t}_baseline PROPERTIES ENVIRONMENT LK_CPU_ISA=baseline LABELS "${labels}" TIMEOUT 120)
endforeach()
# The one op table's test on the backends every build has (tests/gpu/test_ops.c
# built without CUDA): every case of its table (a case per row of
# src/backend/ops.def, or it fails naming the kind) on the CPU backend's copy
# for each instruction set below this CPU's best and on the debug backend,
# against the CPU backend. gpu_ops/gpu_ops_emu run the same table on cuda.
lk_add_test(NAME backend_ops SOURCES gpu/test_ops.c LABELS unit parity TIMEOUT 120)
target_compile_definitions(test_backend_ops PRIVATE LK_OPS_ALL_BACKENDS=1)
