/* The lockstep program: a table of subcommands over the library. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "lockstep.h"

#ifndef LK_GIT_REV
#define LK_GIT_REV "unknown"
#endif

typedef struct {
    const char *name;
    lk_cmd_fn fn;
    const char *help;
} cmd;

static const cmd commands[] = {
    {"fit", lk_cmd_fit, "train a model (lockstep fit -c config.yaml)"},
    {"validate", lk_cmd_fit, "run the validation loop"},
    {"test", lk_cmd_fit, "run the test loop"},
    {"predict", lk_cmd_fit, "run the predict loop"},
    {"launch", lk_cmd_launch, "start N local processes: lockstep launch -n N -- CMD..."},
    {"env", lk_cmd_env, "print the detected hardware, process group and backends"},
    {"export", lk_cmd_export, "write a checkpoint's weights as safetensors"},
    {"prepare", lk_cmd_prepare, "text into token files: lockstep prepare --input FILE.txt --out DIR"},
    {"generate", lk_cmd_generate, "sample text from a trained language model (lockstep generate -c CONFIG --prompt ...)"},
    {"pipeline-schedule", lk_cmd_pipeline, "print and check a pipeline schedule (--schedule 1f1b --stages 4 --chunks 8)"},
};

static const cmd bench_commands[] = {
    {"ops", lk_cmd_bench_ops, "GEMM and MLP throughput against raw cblas_sgemm"},
    {"comm", lk_cmd_bench_comm, "collective latency and bandwidth per backend"},
    {"data", lk_cmd_bench_data, "data loader throughput"},
    {"train", lk_cmd_bench_train, "training throughput per strategy, devices, batch size"},
};

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

static void usage(FILE *f) {
    fprintf(f, "usage: lockstep <command> [options]\n\ncommands:\n");
    for (int i = 0; i < COUNT(commands); i++) fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    for (int i = 0; i < COUNT(bench_commands); i++)
        fprintf(f, "  bench %-6s %s\n", bench_commands[i].name, bench_commands[i].help);
    fprintf(f, "  --version    print the version\n  --help       this text\n\n"
               "'lockstep <command> --help' describes each command's options.\n");
}

static const cmd *find(const cmd *table, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
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
    if (!strcmp(argv[1], "bench")) {
        const cmd *c = argc > 2 ? find(bench_commands, COUNT(bench_commands), argv[2]) : NULL;
        if (!c) {
            fprintf(stderr, "lockstep bench: expected one of ops, comm, data, train%s%s\n",
                    argc > 2 ? "; got " : "", argc > 2 ? argv[2] : "");
            return 2;
        }
        return c->fn(argc - 2, argv + 2);
    }
    const cmd *c = find(commands, COUNT(commands), argv[1]);
    if (!c) {
        fprintf(stderr, "lockstep: unknown command '%s' (try 'lockstep --help')\n", argv[1]);
        return 2;
    }
    return c->fn(argc - 1, argv + 1);
}
