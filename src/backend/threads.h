/* Compute threads per rank (parallel.c): the default share of the CPUs and
 * LK_NUM_THREADS, for the trainer, `lockstep env` and run.json. */
#ifndef LK_BACKEND_THREADS_H
#define LK_BACKEND_THREADS_H

/* CPUs this process may run on (its affinity mask; the online count
 * without one). */
int lk__cpus_available(void);
/* The trainer's default: `local` ranks share this node's CPUs, each gets
 * an equal part (at least 1). LK_NUM_THREADS, when set to a usable value,
 * wins, capped at that part (said once). */
void lk__threads_for_ranks(int local);
/* The count lk__threads_for_ranks(local) would give, changing nothing;
 * *from is "LK_NUM_THREADS" or "default". */
int lk__threads_preview(int local, const char **from);
/* Where the current count came from: "LK_NUM_THREADS" or "default" (the
 * trainer's share, or a program's lk_set_num_threads, which the variable
 * overrides). */
const char *lk__num_threads_from(void);

#endif
