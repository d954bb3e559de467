/* `lockstep pipeline-schedule --schedule 1f1b --stages 4 --chunks 8`: a
 * pipeline schedule's action list per stage, checked (complete, every
 * message matched, no deadlock with blocking sends), with the most
 * micro-batches each stage keeps alive and the bubble, in theory and in a
 * simulated timeline. Nothing trains: it is the schedule as data that the
 * pipeline strategy runs. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lockstep pipeline-schedule [--schedule gpipe|1f1b|interleaved_1f1b|forward] [--stages P]\n"
               "                                  [--chunks M] [--virtual-stages V]\n\n"
               "Prints each stage's actions under the schedule (default 1f1b, 4 stages, 8 micro-batches),\n"
               "checks them as a blocking transport would run them, and shows the micro-batches each stage\n"
               "keeps alive and the bubble: theory (p-1)/(m+p-1) and a simulated timeline. With\n"
               "interleaved_1f1b, --stages counts ranks and each holds V stages (default 2): the theory is\n"
               "then (p-1)/(vm+p-1).\n");
}

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "lockstep pipeline-schedule: error: %s '%s': expected an integer in %d..%d\n", opt, v, lo, hi);
        return 2;
    }
    *out = (int)x;
    return 0;
}

int lk_cmd_pipeline(int argc, char **argv) {
    const char *name = "1f1b";
    int stages = 4, chunks = 8, vstages = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char *v = NULL;
        const char *eq = strchr(a, '=');
        char key[64];
        if (eq && (size_t)(eq - a) < sizeof key) {
            memcpy(key, a, (size_t)(eq - a));
            key[eq - a] = 0;
            v = eq + 1;
            a = key;
        } else if (i + 1 < argc) {
            v = argv[i + 1];
        }
        bool known = !strcmp(a, "--schedule") || !strcmp(a, "--stages") || !strcmp(a, "--chunks") ||
                     !strcmp(a, "--virtual-stages");
        if (!known) {
            fprintf(stderr, "lockstep pipeline-schedule: error: unknown option '%s' (expected --schedule, --stages, "
                            "--chunks, --virtual-stages)\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "lockstep pipeline-schedule: error: %s needs a value\n", a);
            return 2;
        }
        if (!eq) i++;
        int rc = 0;
        if (!strcmp(a, "--schedule")) name = v;
        else if (!strcmp(a, "--stages")) rc = parse_int(a, v, 1, 4096, &stages);
        else if (!strcmp(a, "--virtual-stages")) rc = parse_int(a, v, 1, 64, &vstages);
        else rc = parse_int(a, v, 1, 65536, &chunks);
        if (rc) return rc;
    }
    lk_pipe_schedule *s;
    lk_status made = vstages ? lk_pipe_schedule_make_virtual(name, stages, vstages, chunks, &s)
                             : lk_pipe_schedule_make(name, stages, chunks, &s);
    if (made) {
        fprintf(stderr, "lockstep pipeline-schedule: error: %s\n", lk_last_error());
        return 2;
    }
    lk_status st = lk_pipe_schedule_print(s, stdout);
    lk_pipe_schedule_free(s);
    if (st) {
        fprintf(stderr, "lockstep pipeline-schedule: error: %s\n", lk_last_error());
        return 1;
    }
    return 0;
}
