lk_add_test(NAME strategy_ddp SOURCES strategy/test_ddp.c LABELS multiproc threads TIMEOUT 180)
