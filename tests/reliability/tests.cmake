lk_add_script_test(NAME reliability_faults SCRIPT reliability/faults.sh LABELS multiproc fault TIMEOUT 300)
set_tests_properties(reliability_faults PROPERTIES RUN_SERIAL TRUE)
lk_add_script_test(NAME reliability_train_faults SCRIPT reliability/train_faults.sh LABELS multiproc fault TIMEOUT 300)
lk_add_script_test(NAME reliability_elastic SCRIPT reliability/elastic.sh LABELS multiproc fault TIMEOUT 300)
