lk_add_test(NAME trainer_api SOURCES train/test_trainer.c LABELS unit TIMEOUT 120)
lk_add_test(NAME trainer_weights SOURCES train/test_weights.c LABELS unit parity TIMEOUT 60)
lk_add_test(NAME trainer_faults SOURCES train/test_trainer_faults.c LABELS unit fault TIMEOUT 120)
lk_add_test(NAME train_summary SOURCES train/test_summary.c LABELS unit TIMEOUT 60)
