/* A Lightning config's trainer section through lk_trainer_config_apply:
 * trainer.callbacks and trainer.logger as class_path lists (short and full
 * names, several ModelCheckpoints), the value forms Lightning accepts
 * (devices, max_time, fast_dev_run, strategy aliases, the strategy as a
 * {class_path, init_args} node), and the errors for
 * unknown classes and arguments (FILE:LINE, the accepted names). */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/config.h"
#include "lockstep/trainer.h"

/* Applies `yaml`'s trainer section to a default config. */
static lk_status apply(const char *yaml, lk_trainer_config *t) {
    lk_config *c = lk_config_create();
    lk_status st = lk_trainer_config_default(t);
    if (!st) st = lk_config_load_string(c, yaml, strlen(yaml), "test.yaml");
    if (!st) st = lk_trainer_config_apply(lk_config_get(c, "trainer"), t);
    lk_config_free(c);
    return st;
}

static void test_callbacks_list(void) {
    lk_trainer_config t;
    CHECK_OK(apply("trainer:\n"
                   "  callbacks:\n"
                   "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
                   "      init_args:\n"
                   "        monitor: val_loss\n"
                   "        save_top_k: 3\n"
                   "        filename: '{epoch}-{val_loss:.4f}'\n"
                   "    - class_path: pytorch_lightning.callbacks.ModelCheckpoint\n"
                   "      init_args: {monitor: val_acc, mode: max, dirpath: best, save_last: true, every_n_epochs: 2}\n"
                   "    - class_path: EarlyStopping\n"
                   "      init_args: {monitor: val_loss, patience: 7, min_delta: 0.01, strict: false}\n"
                   "    - class_path: lightning.pytorch.callbacks.Timer\n"
                   "      init_args: {duration: {hours: 1, minutes: 30}}\n"
                   "    - class_path: DeviceStatsMonitor\n"
                   "    - {class_path: LearningRateMonitor, init_args: {logging_interval: step}}\n"
                   "    - {class_path: ModelSummary, init_args: {max_depth: 2}}\n"
                   "    - {class_path: OnExceptionCheckpoint, init_args: {dirpath: crash}}\n",
                   &t));
    CHECK(t.n_checkpoints == 2);
    CHECK(!strcmp(t.checkpoints[0].monitor, "val_loss") && t.checkpoints[0].save_top_k == 3);
    CHECK(!strcmp(t.checkpoints[0].filename, "{epoch}-{val_loss:.4f}") && !strcmp(t.checkpoints[0].mode, "min"));
    CHECK(!t.checkpoints[0].save_last && t.checkpoints[0].every_n_epochs == 1); /* Lightning's defaults */
    CHECK(!strcmp(t.checkpoints[1].mode, "max") && !strcmp(t.checkpoints[1].dirpath, "best"));
    CHECK(t.checkpoints[1].save_last && t.checkpoints[1].every_n_epochs == 2);
    CHECK(!strcmp(t.checkpoints[1].filename, "{epoch}-{step}"));
    CHECK(t.n_early_stopping == 1 && t.early_stopping[0].patience == 7 && !t.early_stopping[0].strict);
    CHECK(isnan(t.early_stopping[0].stopping_threshold) && t.early_stopping[0].check_finite);
    CHECK_NEAR(t.max_time, 5400.0, 1e-9);
    CHECK(t.device_stats_monitor);
    CHECK(!strcmp(t.on_exception_ckpt, "crash/on_exception.ckpt"));
    /* the flat keys are untouched: they are shorthands for one more instance */
    CHECK(t.monitor[0] == 0 && !t.logger_set);
}

static void test_callback_errors(void) {
    lk_trainer_config t;
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: ModelCheckpiont\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "test.yaml:3:");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: ModelCheckpiont\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "trainer.callbacks[0].class_path: unknown class 'ModelCheckpiont' (did you mean 'ModelCheckpoint'?)");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: my.pkg.MyCallback\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "lockstep accepts ModelCheckpoint, EarlyStopping, LearningRateMonitor");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n      init_args:\n        save_topk: 2\n",
                    &t),
              LK_STATUS_INVALID_ARGUMENT, "test.yaml:5:");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n      init_args:\n        save_topk: 2\n",
                    &t),
              LK_STATUS_INVALID_ARGUMENT, "unknown key 'save_topk' for ModelCheckpoint (did you mean 'save_top_k'?) "
                                          "(accepted: dirpath, filename, monitor,");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n      monitor: val_loss\n", &t),
              LK_STATUS_INVALID_ARGUMENT, "go under init_args");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: EarlyStopping\n      init_args: {mode: max}\n", &t),
              LK_STATUS_INVALID_ARGUMENT, "EarlyStopping needs init_args.monitor");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: EarlyStopping\n      init_args: {monitor: a, mode: up}\n",
                    &t),
              LK_STATUS_INVALID_ARGUMENT, "mode: expected one of min|max, got 'up'");
    CHECK_ERR(apply("trainer:\n  callbacks:\n    - class_path: TQDMProgressBar\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "lockstep has no TQDMProgressBar; use trainer.enable_progress_bar");
    CHECK_ERR(apply("trainer:\n  callbacks: 3\n", &t), LK_STATUS_INVALID_ARGUMENT, "expected a list");
}

static void test_loggers(void) {
    lk_trainer_config t;
    CHECK_OK(apply("trainer:\n  logger: false\n", &t));
    CHECK(t.logger_set && t.n_loggers == 0);
    CHECK_OK(apply("trainer:\n  logger: true\n", &t));
    CHECK(!t.logger_set);
    CHECK_OK(apply("trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.TensorBoardLogger\n"
                   "    init_args: {save_dir: tb, version: 3}\n", &t));
    CHECK(t.logger_set && t.n_loggers == 1 && !strcmp(t.loggers[0].kind, "tensorboard"));
    CHECK(!strcmp(t.loggers[0].save_dir, "tb") && !strcmp(t.loggers[0].name, "lightning_logs") && t.loggers[0].version == 3);
    CHECK_OK(apply("trainer:\n  logger:\n    - {class_path: CSVLogger, init_args: {save_dir: logs, name: exp}}\n"
                   "    - class_path: TensorBoardLogger\n", &t));
    CHECK(t.n_loggers == 2 && !strcmp(t.loggers[0].kind, "csv") && !strcmp(t.loggers[0].name, "exp"));
    CHECK(t.loggers[0].version == -1 && !strcmp(t.loggers[1].kind, "tensorboard"));
    CHECK_ERR(apply("trainer:\n  logger:\n    class_path: WandbLogger\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "lockstep has no WandbLogger; use CSVLogger or TensorBoardLogger");
    CHECK_ERR(apply("trainer:\n  logger:\n    class_path: CSVLogger\n    init_args: {version: abc}\n", &t),
              LK_STATUS_INVALID_ARGUMENT, "expected a number or version_N");
}

static void test_value_forms(void) {
    lk_trainer_config t;
    CHECK_OK(apply("trainer:\n  devices: [0, 1, 3]\n", &t));
    CHECK(t.devices == 3);
    CHECK_OK(apply("trainer:\n  devices: auto\n", &t));
    CHECK(t.devices == 0);
    CHECK_OK(apply("trainer:\n  devices: \"0,1\"\n", &t));
    CHECK(t.devices == 2);
    CHECK_OK(apply("trainer:\n  devices: -1\n", &t));
    CHECK(t.devices == sysconf(_SC_NPROCESSORS_ONLN));
    CHECK_OK(apply("trainer:\n  devices: 2\n", &t));
    CHECK(t.devices == 2);
    CHECK_ERR(apply("trainer:\n  devices: [0, 0]\n", &t), LK_STATUS_INVALID_ARGUMENT, "index 0 is listed twice");
    CHECK_ERR(apply("trainer:\n  devices: -2\n", &t), LK_STATUS_INVALID_ARGUMENT, "test.yaml:2:");
    CHECK_OK(apply("trainer:\n  max_time: \"01:02:03:04\"\n", &t));
    CHECK_NEAR(t.max_time, 86400 + 2 * 3600 + 3 * 60 + 4, 1e-9);
    CHECK_OK(apply("trainer:\n  max_time: {days: 1, seconds: 30}\n", &t));
    CHECK_NEAR(t.max_time, 86430, 1e-9);
    CHECK_OK(apply("trainer:\n  max_time: 90\n", &t));
    CHECK_NEAR(t.max_time, 90, 1e-9);
    CHECK_OK(apply("trainer:\n  max_time: null\n", &t));
    CHECK(t.max_time == 0);
    CHECK_ERR(apply("trainer:\n  max_time: {hour: 1}\n", &t), LK_STATUS_INVALID_ARGUMENT, "did you mean 'hours'");
    CHECK_ERR(apply("trainer:\n  max_time: \"1:2:3\"\n", &t), LK_STATUS_INVALID_ARGUMENT, "expected \"DD:HH:MM:SS\" (Lightning's max_time form)");
    CHECK_OK(apply("trainer:\n  fast_dev_run: true\n", &t));
    CHECK(t.fast_dev_run == 1);
    CHECK_OK(apply("trainer:\n  fast_dev_run: 5\n", &t));
    CHECK(t.fast_dev_run == 5);
    CHECK_OK(apply("trainer:\n  fast_dev_run: false\n", &t));
    CHECK(t.fast_dev_run == 0);
    CHECK_OK(apply("trainer:\n  strategy: ddp_find_unused_parameters_true\n", &t));
    CHECK(!strcmp(t.strategy, "ddp"));
    CHECK_ERR(apply("trainer:\n  strategy: dpp\n", &t), LK_STATUS_INVALID_ARGUMENT, "expected one of auto|single|ddp");
    /* the plain table keys still go through the table */
    CHECK_ERR(apply("trainer:\n  max_epoch: 3\n", &t), LK_STATUS_INVALID_ARGUMENT, "did you mean 'max_epochs'");
}

/* trainer.strategy as {class_path, init_args}: the class names the
 * strategy, init_args set its options (over the flat keys); unknown
 * classes and arguments are errors with the place and a hint. */
static void test_strategy_node(void) {
    lk_trainer_config t;
    CHECK_OK(apply("trainer:\n"
                   "  bucket_cap_mb: 7\n"
                   "  strategy:\n"
                   "    class_path: lightning.pytorch.strategies.DDPStrategy\n"
                   "    init_args:\n"
                   "      bucket_cap_mb: 2.5\n"
                   "      find_unused_parameters: true\n"
                   "      ddp_comm_hook: bf16_compress\n"
                   "      broadcast_buffers: false\n"
                   "      shared_params: false\n",
                   &t));
    CHECK(!strcmp(t.strategy, "ddp") && t.bucket_cap_mb == 2.5 && !strcmp(t.ddp_comm_hook, "bf16_compress"));
    CHECK(!t.ddp_broadcast_buffers && !t.ddp_shared_params);
    CHECK_OK(apply("trainer:\n  strategy:\n    class_path: DDPStrategy\n    init_args: {start_method: spawn}\n", &t));
    CHECK(!strcmp(t.strategy, "ddp_spawn"));
    CHECK_OK(apply("trainer:\n  strategy: {class_path: DataParallelStrategy}\n", &t));
    CHECK(!strcmp(t.strategy, "dp") && t.ddp_broadcast_buffers && t.bucket_cap_mb == 25);
    CHECK_OK(apply("trainer:\n  strategy: SingleDeviceStrategy\n", &t)); /* a class name as a plain value */
    CHECK(!strcmp(t.strategy, "single"));
    CHECK_OK(apply("trainer:\n  strategy: ddp_find_unused_parameters_true\n", &t));
    CHECK(!strcmp(t.strategy, "ddp"));
    CHECK_ERR(apply("trainer:\n  strategy:\n    class_path: DDPStrategy\n    init_args:\n      bucket_cap: 5\n", &t),
              LK_STATUS_INVALID_ARGUMENT,
              "test.yaml:5:19: trainer.strategy.init_args: unknown argument 'bucket_cap' for DDPStrategy (did you mean "
              "'bucket_cap_mb'?)");
    CHECK_ERR(apply("trainer:\n  strategy:\n    class_path: DDPStrategy\n    init_args: {static_graph: maybe}\n", &t),
              LK_STATUS_INVALID_ARGUMENT, "static_graph: expected true or false, got 'maybe'");
    CHECK_ERR(apply("trainer:\n  strategy:\n    class_path: DDPStrategy\n    init_args: {bucket_cap_mb: -1}\n", &t),
              LK_STATUS_INVALID_ARGUMENT, "trainer.strategy.init_args.bucket_cap_mb:");
    CHECK_ERR(apply("trainer:\n  strategy:\n    class_path: DataParallelStrategy\n    init_args: {bucket_cap_mb: 5}\n", &t),
              LK_STATUS_INVALID_ARGUMENT, "unknown argument 'bucket_cap_mb' for DataParallelStrategy (DataParallelStrategy takes none)");
    CHECK_ERR(apply("trainer:\n  strategy:\n    class_path: DDPStrategi\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "test.yaml:3:17: trainer.strategy.class_path: unknown class 'DDPStrategi' (did you mean 'DDPStrategy'?)");
    CHECK_ERR(apply("trainer:\n  strategy:\n    name: ddp\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "trainer.strategy: unknown key 'name' (a strategy node has class_path and init_args)");
    CHECK_ERR(apply("trainer:\n  strategy:\n    init_args: {}\n", &t), LK_STATUS_INVALID_ARGUMENT,
              "trainer.strategy.class_path: expected a class name (one of DDPStrategy, DDPSpawnStrategy");
}

LK_TEST_MAIN(LK_TEST_CASE(test_callbacks_list), LK_TEST_CASE(test_callback_errors), LK_TEST_CASE(test_loggers),
             LK_TEST_CASE(test_value_forms), LK_TEST_CASE(test_strategy_node))
