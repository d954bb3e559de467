lk_add_script_test(NAME reliability_faults SCRIPT reliability/faults.sh LABELS multiproc fault TIMEOUT 300)
set_tests_properties(reliability_faults PROPERTIES RUN_SERIAL TRUE)
# The rank-death scenarios under the sharded strategies (their steps are all-gathers and reduce-scatters).
lk_add_script_test(NAME reliability_faults_sharded SCRIPT reliability/faults.sh ARGS fsdp deepspeed_stage_2
                   LABELS multiproc fault TIMEOUT 300)
set_tests_properties(reliability_faults_sharded PROPERTIES RUN_SERIAL TRUE)
lk_add_script_test(NAME reliability_train_faults SCRIPT reliability/train_faults.sh LABELS multiproc fault TIMEOUT 300)
lk_add_script_test(NAME reliability_elastic SCRIPT reliability/elastic.sh LABELS multiproc fault TIMEOUT 300)
