/* Placeholder until this subcommand is built (see the open issues). */
#include "cli/cli.h"

int lk_cmd_bench_data(int argc, char **argv) {
    (void)argc;
    fprintf(stderr, "lockstep %s: not built yet\n", argv[0]);
    return 1;
}
