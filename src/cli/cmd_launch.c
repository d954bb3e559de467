/* `lockstep launch -n N [options] -- command args...`: the torchrun-style
 * launcher (lk_launch) as a subcommand, with torchrun's --max-restarts.
 * Exits with the first failing rank's status (of the last attempt), 2 on a
 * usage error. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "lockstep.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lockstep launch -n N [options] -- command [args...]\n\n"
            "Starts N local processes of command with RANK, LOCAL_RANK, WORLD_SIZE,\n"
            "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and LK_JOB_ID set.\n"
            "Rank 0 keeps this terminal; other ranks' lines are prefixed \"[rank R] \".\n"
            "SIGINT/SIGTERM/SIGHUP/SIGUSR1 are forwarded; when a rank fails the others\n"
            "are stopped and its exit status is returned, or with --max-restarts K\n"
            "all ranks are started again (up to K times) with TORCHELASTIC_RESTART_COUNT\n"
            "set, and lockstep fit resumes from the last checkpoint.\n\n"
            "options:\n"
            "  -n, --nproc, --nproc-per-node N   number of processes (required)\n"
            "  --master-addr ADDR                default 127.0.0.1\n"
            "  --master-port PORT                default: a free port\n"
            "  --job-id ID                       names the shm segment (default: unique)\n"
            "  --max-restarts K                  restart the job up to K times after a rank fails\n"
            "                                    (default: LK_MAX_RESTARTS, else 0)\n"
            "  --prefix-all                      prefix rank 0's lines too\n"
            "  --quiet                           no launcher status lines\n");
}

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "lockstep launch: %s expects an integer in %d..%d, got '%s'\n", opt, lo, hi, v ? v : "(nothing)");
        return 0;
    }
    *out = (int)x;
    return 1;
}

int lk_cli_max_restarts_from_env(const char **from) {
    double v;
    bool set = lk_env_get_number("LK_MAX_RESTARTS", 0, 1000000, &v); /* lk_launch's range; else said once */
    if (from) *from = set ? "LK_MAX_RESTARTS" : "default";
    return set ? (int)v : 0;
}

int lk_cmd_launch(int argc, char **argv) {
    lk_launch_options opt = lk_launch_options_default();
    int n = 0, i = 1;
    bool restarts_given = false;
    for (; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--nproc") || !strcmp(a, "--nproc-per-node") || !strcmp(a, "--nproc_per_node")) {
            if (!parse_int(a, v, 1, 4096, &n)) return 2;
            i++;
        } else if (!strcmp(a, "--master-port") || !strcmp(a, "--master_port")) {
            if (!parse_int(a, v, 1, 65535, &opt.master_port)) return 2;
            i++;
        } else if (!strcmp(a, "--master-addr") || !strcmp(a, "--master_addr")) {
            if (!v) return fprintf(stderr, "lockstep launch: %s needs a value\n", a), 2;
            opt.master_addr = v;
            i++;
        } else if (!strcmp(a, "--job-id")) {
            if (!v) return fprintf(stderr, "lockstep launch: %s needs a value\n", a), 2;
            opt.job_id = v;
            i++;
        } else if (!strcmp(a, "--max-restarts") || !strcmp(a, "--max_restarts")) {
            if (!parse_int(a, v, 0, 1000000, &opt.max_restarts)) return 2;
            restarts_given = true;
            i++;
        } else if (!strcmp(a, "--prefix-all")) {
            opt.prefix_all = true;
        } else if (!strcmp(a, "--quiet")) {
            opt.quiet = true;
        } else if (a[0] == '-') {
            fprintf(stderr, "lockstep launch: unknown option '%s' (see lockstep launch --help)\n", a);
            return 2;
        } else {
            break; /* the command, without "--" */
        }
    }
    if (n < 1) {
        fprintf(stderr, "lockstep launch: -n N is required (number of processes)\n");
        usage(stderr);
        return 2;
    }
    if (i >= argc) {
        fprintf(stderr, "lockstep launch: no command given (expected: lockstep launch -n %d -- command args...)\n", n);
        return 2;
    }
    /* The flag wins over LK_MAX_RESTARTS, which wins over the default 0:
     * the rule every LK_* variable follows (lockstep fit reads it too). */
    const char *from = "--max-restarts";
    if (!restarts_given) opt.max_restarts = lk_cli_max_restarts_from_env(&from);
    if (opt.max_restarts > 0 && !opt.quiet)
        fprintf(stderr, "lockstep launch: up to %d restart%s (from %s)\n", opt.max_restarts,
                opt.max_restarts == 1 ? "" : "s", from);
    int code = 1;
    if (lk_launch(n, argv + i, &opt, &code)) {
        fprintf(stderr, "lockstep launch: %s\n", lk_last_error());
        return 1;
    }
    return code;
}
