/* A user's own program as a multi-process job. When lk_trainer_create sees
 * devices x num_nodes > 1 in a process that no launcher started (no RANK,
 * WORLD_SIZE, MPI or SLURM variables), the trainer becomes the job's
 * launcher instead of a rank: its first run (fit, validate, test or
 * predict) executes this same program again — /proc/self/exe with the argv
 * it was started with — once per rank through lk_launch (the code behind
 * `lockstep fit` and `lockstep launch`), waits for every rank and returns
 * the job's status. The ranks run the user's main from the top with the
 * rendezvous variables set, so they take the ordinary path. Lightning's
 * subprocess launcher keeps the parent as rank 0; here the parent stays out
 * of the job so every rank is the same program started the same way, and
 * output relaying, signal forwarding and stopping the job when one rank
 * fails are exactly those of `lockstep fit`. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train/train_impl.h"

/* The job runs once per process: whichever launcher trainer runs first
 * starts it, and every later run of any launcher trainer in this process
 * (the user's main calling test after fit, say) was already carried out by
 * the ranks, so it returns the same outcome. Per process, not per trainer,
 * because the ranks replay the whole main, every trainer in it included. */
static struct {
    bool ran;
    lk_status st;
    char msg[1024];
} job;

/* argv of this process as the kernel kept it: NUL-separated strings.
 * On success *argv (NULL-terminated) and *buf are the caller's to lk_free. */
static lk_status read_cmdline(char ***argv, char **buf) {
    *argv = NULL;
    *buf = NULL;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return lk_error(LK_STATUS_IO, "trainer: cannot read /proc/self/cmdline to start the ranks: %s "
                                      "(start them with `lockstep launch -n N -- ./program` instead)", strerror(errno));
    size_t len = 0, cap = 4096;
    char *b = lk_malloc(cap + 1);
    lk_status st = b ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    while (!st) {
        if (len == cap) {
            char *nb = lk_realloc(b, cap * 2 + 1);
            if (!nb) {
                st = LK_STATUS_OUT_OF_MEMORY;
                break;
            }
            b = nb;
            cap *= 2;
        }
        ssize_t n = read(fd, b + len, cap - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) st = lk_error(LK_STATUS_IO, "trainer: reading /proc/self/cmdline failed: %s", strerror(errno));
        if (n <= 0) break;
        len += (size_t)n;
    }
    close(fd);
    if (!st && len == 0) st = lk_error(LK_STATUS_IO, "trainer: /proc/self/cmdline is empty: cannot start the ranks");
    int argc = 0;
    for (size_t i = 0; !st && i < len; i++) argc += b[i] == '\0';
    if (!st && b[len - 1] != '\0') { /* a program that rewrote its argv area may leave no final NUL */
        b[len++] = '\0';
        argc++;
    }
    char **av = st ? NULL : lk_calloc((size_t)argc + 1, sizeof *av);
    if (!st && !av) st = LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        lk_free(b);
        return st;
    }
    for (size_t i = 0, k = 0; i < len; i += strlen(b + i) + 1) av[k++] = b + i;
    *argv = av;
    *buf = b;
    return LK_STATUS_OK;
}

lk_status lk__self_launch(lk_trainer *tr, const char *command) {
    if (job.ran) return job.st ? lk_error(job.st, "%s", job.msg) : LK_STATUS_OK;
    char **argv = NULL, *buf = NULL;
    LK_TRY(read_cmdline(&argv, &buf));
    lk_launch_options lo = lk_launch_options_default();
    lo.quiet = true; /* the failing rank prints its own error; ours below names the exit status */
    lo.exec_path = "/proc/self/exe";
    int code = 0;
    lk_status st = lk_launch(tr->launcher, argv, &lo, &code);
    if (!st && code != 0)
        st = lk_error(LK_STATUS_REMOTE,
                      "lk_trainer_%s: the job of %d ranks (trainer.devices=%lld, each a copy of '%s' started by this "
                      "process) failed: the first failing rank %s %d (its own error is printed above)",
                      command, tr->launcher, (long long)tr->cfg.devices, argv[0],
                      code > 128 ? "was killed by signal" : "exited with status", code > 128 ? code - 128 : code);
    lk_free(argv);
    lk_free(buf);
    job.ran = true;
    job.st = st;
    snprintf(job.msg, sizeof job.msg, "%s", st ? lk_last_error() : "");
    return st;
}

bool lk_trainer_is_launcher(const lk_trainer *tr) { return tr && tr->launcher > 0; }
