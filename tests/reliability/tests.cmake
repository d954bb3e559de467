lk_add_script_test(NAME reliability_faults SCRIPT reliability/faults.sh LABELS multiproc fault TIMEOUT 300)
