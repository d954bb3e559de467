/* The lockstep program's subcommands. Each lives in its own cmd_*.c file and
 * returns the process exit status (0 ok, 1 failure, 2 usage error). */
#ifndef LK_CLI_H
#define LK_CLI_H

#include <stdio.h>

#include "lockstep.h"
#include "lockstep/config.h"

typedef int (*lk_cmd_fn)(int argc, char **argv); /* argv[0] is the subcommand */

int lk_cmd_fit(int argc, char **argv);      /* fit|validate|test|predict: cmd_trainer.c */
int lk_cmd_launch(int argc, char **argv);   /* cmd_launch.c */
int lk_cmd_env(int argc, char **argv);      /* cmd_env.c */
int lk_cmd_export(int argc, char **argv);   /* cmd_export.c */
int lk_cmd_prepare(int argc, char **argv);  /* cmd_prepare.c */
int lk_cmd_generate(int argc, char **argv); /* cmd_generate.c */
int lk_cmd_pipeline(int argc, char **argv); /* cmd_pipeline.c: pipeline-schedule */
/* cmd_trainer.c, for cmd_generate.c: the config's module and data module as
 * fit builds them, the seed that runs and trainer.default_root_dir ("."
 * when empty). On failure both are NULL. */
lk_status lk_cli_build_from_config(lk_config *cfg, lk_module **module, lk_datamodule **dm, int64_t *seed,
                                   char *root_dir, size_t size);
int lk_cmd_bench_ops(int argc, char **argv);   /* cmd_bench_ops.c */
void lk__bench_conv_table(double budget);      /* bench_conv.c: bench ops --conv */
int lk_cmd_bench_comm(int argc, char **argv);  /* cmd_bench_comm.c */
int lk_cmd_bench_data(int argc, char **argv);  /* cmd_bench_data.c */
int lk_cmd_bench_train(int argc, char **argv); /* cmd_bench_train.c */

/* LK_MAX_RESTARTS for a launcher whose command line did not say
 * --max-restarts (the flag wins over the variable, which wins over 0);
 * *from is "LK_MAX_RESTARTS" or "default". cmd_launch.c. */
int lk_cli_max_restarts_from_env(const char **from);

#endif
