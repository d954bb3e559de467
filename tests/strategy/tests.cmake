lk_add_test(NAME strategy_ddp SOURCES strategy/test_ddp.c LABELS multiproc threads TIMEOUT 180)
lk_add_test(NAME strategy_dp SOURCES strategy/test_dp.c LABELS unit threads TIMEOUT 120)
