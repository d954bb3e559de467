/* The lockstep program: subcommands over the library. */
#include <stdio.h>
#include <string.h>

#include "lockstep.h"

#ifndef LK_GIT_REV
#define LK_GIT_REV "unknown"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: lockstep <command> [options]\n"
            "\n"
            "commands:\n"
            "  bench ops     GEMM and MLP throughput against raw cblas_sgemm\n"
            "  --version     print the version\n"
            "  --help        this text\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("lockstep %s (%s)\n", LK_VERSION_STRING, LK_GIT_REV);
        return 0;
    }
    fprintf(stderr, "lockstep: unknown command '%s' (try 'lockstep --help')\n", argv[1]);
    return 2;
}
