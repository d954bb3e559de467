lk_add_test(NAME trainer_api SOURCES train/test_trainer.c LABELS unit TIMEOUT 120)
