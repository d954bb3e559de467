/* The stop signals of a run: SIGINT, SIGTERM, SIGHUP and SIGUSR1 are
 * caught for the length of a fit (installed at its start, the previous
 * handlers restored at its end) and only recorded; the loop reads the
 * record at each optimizer step, agrees with the other ranks to stop,
 * saves last.ckpt and returns. Nothing else is done in the handler, which
 * may run at any instruction. */
#include <signal.h>
#include <string.h>

#include "train/train_impl.h"

/* SIGINT/SIGTERM/SIGHUP/SIGUSR1: finish the step, save last.ckpt, stop.
 * SIGHUP is a closed terminal or ssh session; SIGUSR1 is SLURM's (and
 * Lightning's) preemption warning before the kill. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

int lk__stop_signal(void) { return (int)stop_signal; }

void lk__signals_install(lk__sig_state *s) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    sigaction(SIGINT, &sa, &s->old_int);
    sigaction(SIGTERM, &sa, &s->old_term);
    sigaction(SIGHUP, &sa, &s->old_hup);
    sigaction(SIGUSR1, &sa, &s->old_usr1);
}

void lk__signals_restore(lk__sig_state *s) {
    sigaction(SIGINT, &s->old_int, NULL);
    sigaction(SIGTERM, &s->old_term, NULL);
    sigaction(SIGHUP, &s->old_hup, NULL);
    sigaction(SIGUSR1, &s->old_usr1, NULL);
}
