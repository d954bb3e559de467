/* dist: two jobs on one host with the same identity (issue 43). Two
 * `lockstep launch --job-id X` jobs (their ranks share LK_JOB_ID=X, each job
 * its own LK_JOB_NONCE, as the launcher sets them), and two jobs started by
 * hand with the same MASTER_PORT and no LK_JOB_ID, each of W ranks, are
 * started together; every rank stops itself before each step of the shm
 * rendezvous (LK_COMM_TEST_RDV_PAUSE=all: claim, open, slot, publish, wait,
 * seal, done) and this process decides which stopped rank runs its next
 * step: in random orders, and with one rank held at one step while the
 * others run, for every rank and step. Each rank that gets a communicator
 * all-reduces a count of its job's ranks, so a rank that paired with the
 * other job sees it. In every interleaving:
 *  - no collective completes between ranks of different jobs;
 *  - something fails with the clear error (what clashed, the segment, the
 *    holder's pid, what to change) and nothing hangs;
 *  - launched jobs: the job whose rank 0 claimed the id first completes and
 *    the other fails (its failed rank's launcher stops its other ranks,
 *    emulated here as lk_launch does it);
 *  - jobs by hand: each job completes whole or fails whole, at most one
 *    completes, and every rank ends on its own. Here the interleavings are
 *    those of ranks that all began their claim before any rank's seal
 *    (started together: the guarantee comm_shm.c states).
 * (Unless the schedule kept one job's rank 0 from its claim until the other
 * job was over: the two never held the id at once, and both may complete.)
 * And a second job started after the first is up fails at once, naming the
 * first's pid, while the first runs on. No segment name is left behind. */
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "lk_test.h"

#define CL_MAXP 8
#define CL_STEPS 7 /* claim, open, slot, publish, wait, seal, done */
#define CL_SEAL 5

typedef struct {
    lk_status status[CL_MAXP]; /* lk_comm_create's */
    char msg[CL_MAXP][1024];   /* its error, or the first collective's */
    int64_t counts[CL_MAXP][2]; /* the all-reduced ranks per job (-1: not reached) */
    int done[CL_MAXP];          /* collectives completed */
    char job_id[CL_MAXP][96];   /* the identity each rank derived */
    double held[CL_MAXP][2];    /* from lk_comm_create's return to lk_comm_free: the id is held throughout */
    volatile int stop;          /* late_second_job: the first job may finish */
} cl_shared;

static cl_shared *sh;

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static bool segment_exists(const char *job) {
    char name[256], path[300];
    lk_comm_shm_segment_name(job, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* Waits for the n processes up to deadline_s (then SIGKILLs them); exit codes, 128+signal if killed. */
static void wait_all(int n, const int *pid, double deadline_s, int *codes) {
    double end = lk_time_now() + deadline_s;
    bool reaped[CL_MAXP] = {false};
    for (int left = n; left > 0;) {
        for (int i = 0; i < n; i++) {
            int st;
            if (reaped[i] || waitpid(pid[i], &st, WNOHANG) != pid[i]) continue;
            codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            reaped[i] = true;
            left--;
        }
        if (left && lk_time_now() > end) {
            for (int i = 0; i < n; i++)
                if (!reaped[i]) kill(pid[i], SIGKILL);
            end = 1e300;
        }
        if (left) usleep(1000);
    }
}

typedef struct {
    bool launched; /* LK_JOB_ID + a nonce per job, else MASTER_PORT only */
    int world;
    int port;
    char job[64];
    bool pause;
    bool loop; /* keep doing collectives until sh->stop */
} cl_cfg;

static int cl_rank(int idx, const cl_cfg *cf) {
    int job = idx / cf->world, rank = idx % cf->world;
    char buf[64];
    static const char *const clear[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                                        "LK_JOB_ID", "LK_JOB_NONCE", "TORCHELASTIC_RUN_ID", "LK_COMM_TEST_RDV_PAUSE"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; i++) unsetenv(clear[i]);
    snprintf(buf, sizeof buf, "%d", rank);
    setenv("RANK", buf, 1);
    setenv("LOCAL_RANK", buf, 1);
    snprintf(buf, sizeof buf, "%d", cf->world);
    setenv("WORLD_SIZE", buf, 1);
    setenv("LOCAL_WORLD_SIZE", buf, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(buf, sizeof buf, "%d", cf->port);
    setenv("MASTER_PORT", buf, 1);
    if (cf->launched) {
        setenv("LK_JOB_ID", cf->job, 1);
        snprintf(buf, sizeof buf, "%016llx", (unsigned long long)mix64((uint64_t)cf->port * 2 + (uint64_t)job));
        setenv("LK_JOB_NONCE", buf, 1);
    }
    if (cf->pause) setenv("LK_COMM_TEST_RDV_PAUSE", "all", 1);
    lk_pg_info pg;
    if (!lk_pg_info_from_env(&pg)) snprintf(sh->job_id[idx], sizeof sh->job_id[idx], "%s", pg.job_id);
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = "shm";
    cfg.timeout_s = 10;
    cfg.shared_bytes = 1u << 20;
    lk_comm *c = NULL;
    lk_status st = lk_comm_create(&cfg, &c);
    sh->status[idx] = st;
    sh->held[idx][0] = lk_time_now();
    if (st) {
        snprintf(sh->msg[idx], sizeof sh->msg[idx], "%s", lk_last_error());
        return 1;
    }
    int64_t tag[2] = {job == 0, job == 1};
    st = lk_comm_all_reduce(c, tag, 2, LK_I64, LK_REDUCE_SUM);
    if (!st) {
        sh->counts[idx][0] = tag[0];
        sh->counts[idx][1] = tag[1];
        sh->done[idx]++;
    }
    /* Two more collectives; with loop, until the all-reduced stop flag says
     * so (every rank leaves after the same collective). */
    for (int i = 0; !st && (cf->loop || i < 2); i++) {
        float stop = (float)sh->stop;
        st = i % 2 ? lk_comm_barrier(c) : lk_comm_all_reduce(c, &stop, 1, LK_F32, LK_REDUCE_MAX);
        if (!st) sh->done[idx]++;
        if (!st && !(i % 2) && stop > 0) break; /* every rank saw the stop in the same all-reduce */
        if (cf->loop) usleep(1000);
    }
    if (st) snprintf(sh->msg[idx], sizeof sh->msg[idx], "%s", lk_last_error());
    sh->held[idx][1] = lk_time_now();
    lk_comm_free(c);
    return st ? 1 : 0;
}

/* ------------------------------------------------------------------------
 * The scheduler: the ranks stop themselves before each step; this process
 * continues one at a time and gives it 10 ms to reach its next stop (a rank
 * that waits for others meanwhile keeps running and stops when it can).
 * ---------------------------------------------------------------------- */
enum { PR_RUN, PR_STOP, PR_EXIT };

typedef struct {
    int pid, state, stops, code;
    bool killed; /* by the emulated launcher */
} cl_proc;

typedef struct {
    uint64_t seed;
    int victim, vstep; /* hold rank `victim` before step vstep while others can run (-1: none) */
    bool started_together; /* no seal before every rank has begun its claim */
} cl_sched;

typedef struct {
    int n;
    cl_proc p[CL_MAXP];
    double t_start, t_end;
    bool hung;
} cl_run;

static uint64_t rng_next(uint64_t *s) { return mix64((*s)++); }

static bool reap(cl_run *r, const cl_cfg *cf, double *last_event) {
    bool any = false;
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG | WUNTRACED)) > 0) {
        for (int i = 0; i < r->n; i++) {
            if (r->p[i].pid != pid) continue;
            any = true;
            if (WIFSTOPPED(st)) {
                r->p[i].state = PR_STOP;
                r->p[i].stops++;
            } else if (WIFEXITED(st) || WIFSIGNALED(st)) {
                r->p[i].state = PR_EXIT;
                r->p[i].code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            }
        }
    }
    if (any) *last_event = lk_time_now();
    /* lk_launch: the first failing rank ends its job's other ranks. */
    for (int i = 0; cf->launched && i < r->n; i++) {
        if (r->p[i].state != PR_EXIT || !r->p[i].code || r->p[i].killed) continue;
        int job = i / cf->world;
        for (int j = job * cf->world; j < (job + 1) * cf->world; j++)
            if (r->p[j].state != PR_EXIT && !r->p[j].killed) {
                kill(r->p[j].pid, SIGKILL);
                kill(r->p[j].pid, SIGCONT);
                r->p[j].killed = true;
            }
    }
    return any;
}

static bool allowed(const cl_run *r, const cl_sched *sc, int i) {
    if (!sc->started_together || r->p[i].stops != CL_SEAL + 1) return true;
    for (int j = 0; j < r->n; j++)
        if (r->p[j].state != PR_EXIT && r->p[j].stops < 2) return false; /* someone has not made its claim */
    return true;
}

/* Whether the step a rank stopped before can wait on other ranks: the
 * joiner's open (for the segment), wait (for the peers), and after done
 * the collectives. The others run to the next stop in microseconds. */
static bool may_block(int stops) { return stops == 2 || stops == 5 || stops == 7; }

static void run_schedule(const cl_cfg *cf, const cl_sched *sc, cl_run *r) {
    memset(sh, 0, sizeof *sh);
    memset(r, 0, sizeof *r);
    r->n = 2 * cf->world;
    for (int i = 0; i < r->n; i++) sh->counts[i][0] = sh->counts[i][1] = -1;
    uint64_t rng = sc->seed * 0x9e3779b97f4a7c15ull + 1;
    fflush(stdout);
    fflush(stderr);
    r->t_start = lk_time_now();
    for (int i = 0; i < r->n; i++) {
        int pid = fork();
        if (pid == 0) {
            lk_t_case_failed = 0;
            int rc = cl_rank(i, cf);
            fflush(stdout);
            fflush(stderr);
            exit(rc);
        }
        r->p[i].pid = pid;
        r->p[i].state = PR_RUN;
    }
    double last_event = lk_time_now(), deadline = lk_time_now() + 30;
    /* Started together: every rank is at its first stop before any runs a step. */
    for (int ready = 0; ready < r->n && lk_time_now() < deadline;) {
        reap(r, cf, &last_event);
        ready = 0;
        for (int i = 0; i < r->n; i++) ready += r->p[i].state != PR_RUN;
        if (ready < r->n) usleep(200);
    }
    for (;;) {
        reap(r, cf, &last_event);
        int live = 0;
        for (int i = 0; i < r->n; i++) live += r->p[i].state != PR_EXIT;
        if (!live) break;
        if (lk_time_now() > deadline) {
            r->hung = true;
            for (int i = 0; i < r->n; i++)
                if (r->p[i].state != PR_EXIT) {
                    kill(r->p[i].pid, SIGKILL);
                    kill(r->p[i].pid, SIGCONT);
                }
            deadline = 1e300;
            continue;
        }
        int cand[CL_MAXP], nc = 0, held = -1;
        for (int i = 0; i < r->n; i++) {
            if (r->p[i].state != PR_STOP || r->p[i].killed || !allowed(r, sc, i)) continue;
            if (i == sc->victim && r->p[i].stops == sc->vstep + 1) held = i;
            else cand[nc++] = i;
        }
        /* The held rank goes on only when nothing else can: the others are
         * done, or waiting (no stop or exit for 20 ms). */
        if (!nc && held >= 0 && lk_time_now() - last_event > 0.02) cand[nc++] = held;
        if (!nc) {
            usleep(300);
            continue;
        }
        int pick = cand[rng_next(&rng) % (uint64_t)nc];
        r->p[pick].state = PR_RUN;
        kill(r->p[pick].pid, SIGCONT);
        /* A step that cannot block gets all the time it needs (a loaded
         * machine may not run it for a while): its effects all happen
         * before the next choice. One that may block gets 10 ms. */
        double until = lk_time_now() + (may_block(r->p[pick].stops) ? 0.01 : 5.0);
        while (r->p[pick].state == PR_RUN && lk_time_now() < until) {
            if (!reap(r, cf, &last_event)) usleep(200);
        }
    }
    r->t_end = lk_time_now();
}

static bool clear_error(const char *m, const cl_cfg *cf, const char *segname) {
    bool what = strstr(m, "already in use") || strstr(m, "already held") || strstr(m, "also wanted rank");
    bool remedy = cf->launched ? strstr(m, "another --job-id") != NULL : strstr(m, "another MASTER_PORT") != NULL;
    bool ident = cf->launched ? strstr(m, cf->job) != NULL : strstr(m, "MASTER_PORT=") != NULL;
    return what && remedy && ident && strstr(m, segname) && strstr(m, "pid ");
}

typedef struct {
    int runs, one_won, both_failed;
    double worst;
    /* how ranks were refused, over all runs: the id held at the claim, a
     * segment of another launch, the id held by another launch's rank 0
     * while waiting, a notice found at the seal, a mixed set of ranks in one
     * segment stopped by the seal */
    int at_claim, foreign_segment, foreign_holder, at_seal, mixed_sealed;
    int apart; /* schedules in which one job ended before the other's rank 0 claimed */
} cl_stats;

/* Whether the seal's message lists the segment's ranks from both jobs. */
static bool lists_both_jobs(const char *m, const cl_run *r, int W) {
    const char *p = strstr(m, "its ranks: ");
    bool job[2] = {false, false};
    while (p && (p = strstr(p, "pid ")) != NULL) {
        int pid = atoi(p + 4);
        for (int i = 0; i < r->n; i++)
            if (r->p[i].pid == pid) job[i / W] = true;
        p += 4;
    }
    return job[0] && job[1];
}

static char why[2048];
static size_t why_len;

static void bad(const char *fmt, ...) {
    if (why_len >= sizeof why - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why + why_len, sizeof why - why_len, fmt, ap);
    va_end(ap);
    if (n > 0) why_len += (size_t)n < sizeof why - why_len ? (size_t)n : sizeof why - 1 - why_len;
}

/* Checks one run; returns false (and says why) when it broke a promise. */
static bool check_run(const cl_cfg *cf, const cl_sched *sc, const cl_run *r, cl_stats *stats) {
    const int W = cf->world;
    why[0] = 0;
    why_len = 0;
#define BAD(...) bad(__VA_ARGS__)
    if (r->hung) BAD("a rank did not end within 30 s; ");
    int ok_ranks[2] = {0, 0}, clear = 0;
    const char *id = "";
    for (int i = 0; i < r->n; i++)
        if (!id[0]) id = sh->job_id[i];
    char segname[256];
    lk_comm_shm_segment_name(id, segname, sizeof segname);
    for (int i = 0; i < r->n; i++) {
        int job = i / W;
        if (sh->job_id[i][0] && strcmp(sh->job_id[i], id)) BAD("rank %d derived job id '%s', another '%s'; ", i, sh->job_id[i], id);
        if (sh->counts[i][0] >= 0 && (sh->counts[i][job] != W || sh->counts[i][1 - job] != 0))
            BAD("MIXED: job %c rank %d all-reduced %lld ranks of job A and %lld of job B; ", 'A' + job, i % W,
                (long long)sh->counts[i][0], (long long)sh->counts[i][1]);
        if (r->p[i].code == 0) {
            ok_ranks[job]++;
            if (sh->done[i] < 3) BAD("job %c rank %d exited 0 after %d collectives; ", 'A' + job, i % W, sh->done[i]);
        } else if (!r->p[i].killed && !sh->msg[i][0]) {
            BAD("job %c rank %d exited %d without a message; ", 'A' + job, i % W, r->p[i].code);
        }
        if (sh->status[i] && clear_error(sh->msg[i], cf, segname)) clear++;
        const char *m = sh->status[i] ? sh->msg[i] : "";
        stats->at_claim += strstr(m, "holds it (rank 0") || strstr(m, "already held on this host");
        stats->foreign_segment += strstr(m, "belongs to another job") != NULL;
        stats->foreign_holder += strstr(m, "not rank 0 of this rank's launch") != NULL;
        stats->at_seal += strstr(m, "also wanted rank") != NULL;
        stats->mixed_sealed += strstr(m, "also wanted rank") && lists_both_jobs(m, r, W);
        if (!cf->launched && r->p[i].killed) BAD("job %c rank %d had to be killed; ", 'A' + job, i % W);
    }
    for (int j = 0; j < 2; j++)
        if (ok_ranks[j] && ok_ranks[j] != W) BAD("job %c: only %d of %d ranks completed; ", 'A' + j, ok_ranks[j], W);
    int won = (ok_ranks[0] == W) + (ok_ranks[1] == W);
    /* The schedule may keep one job's rank 0 stopped before its claim until
     * the other job is over: then both may run, one after the other (as two
     * torchruns would), but their ranks 0 must never have held the id at
     * the same time. */
    bool apart = won == 2;
    if (apart && !(sh->held[0][1] < sh->held[W][0] || sh->held[W][1] < sh->held[0][0]))
        BAD("both jobs completed, and their ranks 0 held the id at the same time; ");
    if (!apart && !clear) BAD("no rank failed with the clear error; ");
    if (!apart && cf->launched && won != 1) BAD("%d jobs completed, expected exactly one (the first to claim the id); ", won);
    stats->apart += apart;
    if (id[0] && segment_exists(id)) BAD("the segment name %s was left behind; ", segname);
    double secs = r->t_end - r->t_start;
    if (secs > 8) BAD("the run took %.1f s (a rank waited for a timeout); ", secs);
    stats->runs++;
    stats->one_won += won == 1;
    stats->both_failed += won == 0;
    if (secs > stats->worst) stats->worst = secs;
    if (!why_len) return true;
    fprintf(stderr, "schedule seed %llu, victim %d held at step %d: %s\n", (unsigned long long)sc->seed, sc->victim, sc->vstep,
            why);
    for (int i = 0; i < r->n; i++)
        fprintf(stderr, "   job %c rank %d pid %d: exit %d%s, stops %d, create %s, done %d: %s\n", 'A' + i / W, i % W,
                r->p[i].pid, r->p[i].code, r->p[i].killed ? " (killed by the launcher)" : "", r->p[i].stops,
                lk_status_str(sh->status[i]), sh->done[i], sh->msg[i]);
    shm_unlink(segname);
    return false;
#undef BAD
}

static int port_base;

static void interleavings(bool launched) {
    if (!sh) {
        sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(sh != MAP_FAILED);
    }
    if (!port_base) port_base = 20000 + (int)(getpid() % 20000);
    cl_stats stats = {0};
    int bad = 0;
    char example[1024] = "";
    for (int world = 2; world <= 3; world++) {
        /* every rank held at every step while the others run, then random orders */
        int nsched = world == 2 ? 2 * world * CL_STEPS + 100 : 40;
        for (int k = 0; k < nsched; k++) {
            cl_cfg cf = {.launched = launched, .world = world, .port = port_base++, .pause = true};
            snprintf(cf.job, sizeof cf.job, "clash%d-%d", (int)getpid(), cf.port);
            cl_sched sc = {.seed = (uint64_t)cf.port, .victim = -1, .vstep = -1, .started_together = !launched};
            if (world == 2 && k < 2 * world * CL_STEPS) {
                sc.victim = k / CL_STEPS;
                sc.vstep = k % CL_STEPS;
            }
            cl_run r;
            run_schedule(&cf, &sc, &r);
            if (!check_run(&cf, &sc, &r, &stats)) bad++;
            for (int i = 0; i < r.n && !example[0]; i++)
                if (sh->status[i] && strstr(sh->msg[i], "already")) snprintf(example, sizeof example, "%s", sh->msg[i]);
        }
    }
    CHECK_MSG(bad == 0, "%d of %d interleavings broke a promise (above)", bad, stats.runs);
    printf("     %d interleavings: one job completed in %d, both failed in %d, one after the other in %d, slowest %.2f s\n",
           stats.runs, stats.one_won, stats.both_failed, stats.apart, stats.worst);
    printf("     ranks refused: %d at the claim, %d by another launch's segment, %d by another launch's rank 0 while "
           "waiting, %d at the seal (%d of them in a segment holding ranks of both jobs)\n",
           stats.at_claim, stats.foreign_segment, stats.foreign_holder, stats.at_seal, stats.mixed_sealed);
    if (launched) CHECK(stats.at_claim && stats.foreign_segment && stats.foreign_holder);
    else CHECK(stats.at_claim && stats.at_seal && stats.mixed_sealed); /* the interleavings reached every refusal */
    printf("     %s\n", example);
}

static void launched_jobs_same_job_id(void) { interleavings(true); }
static void jobs_by_hand_same_master_port(void) { interleavings(false); }

/* The first job is up and running collectives; a second one with the same
 * identity starts (no pauses): every rank of it fails at once naming the
 * first job's pid, and the first runs on to a clean end. */
static void late_second_job(void) {
    for (int launched = 1; launched >= 0; launched--) {
        cl_cfg cf = {.launched = launched, .world = 2, .port = port_base++, .loop = true};
        snprintf(cf.job, sizeof cf.job, "clash%d-%d", (int)getpid(), cf.port);
        memset(sh, 0, sizeof *sh);
        int pid[CL_MAXP];
        fflush(stdout);
        fflush(stderr);
        for (int i = 0; i < 2 * cf.world; i++) {
            if (i == cf.world) { /* job B starts once job A has done collectives */
                double end = lk_time_now() + 10;
                while ((sh->done[0] < 5 || sh->done[1] < 5) && lk_time_now() < end) usleep(1000);
            }
            pid[i] = fork();
            if (pid[i] == 0) exit(cl_rank(i, &cf));
        }
        int codes[CL_MAXP];
        double t0 = lk_time_now();
        int pidb[2] = {pid[2], pid[3]}, codesb[2];
        wait_all(2, pidb, 10, codesb);
        double secs = lk_time_now() - t0;
        int before = sh->done[0];
        usleep(100000);
        CHECK_MSG(sh->done[0] > before, "job A stopped doing collectives after job B failed");
        sh->stop = 1;
        int pida[2] = {pid[0], pid[1]};
        wait_all(2, pida, 10, codes);
        char segname[256], pidstr[2][32];
        lk_comm_shm_segment_name(sh->job_id[0], segname, sizeof segname);
        for (int r = 0; r < 2; r++) snprintf(pidstr[r], sizeof pidstr[r], "pid %d", pid[r]);
        for (int r = 0; r < 2; r++) {
            CHECK_MSG(codes[r] == 0 && !sh->status[r], "%s job A rank %d: exit %d: %s", launched ? "launched" : "by hand", r,
                      codes[r], sh->msg[r]);
            CHECK_MSG(codesb[r] == 1 && sh->status[2 + r] == LK_STATUS_INVALID_USAGE, "%s job B rank %d: exit %d: %s",
                      launched ? "launched" : "by hand", r, codesb[r], sh->msg[2 + r]);
        }
        CHECK_MSG(secs < 1.0, "job B took %.2f s to fail", secs);
        /* rank 0 names job A's rank 0; by hand, rank 1 names job A's rank 1 */
        CHECK_MSG(clear_error(sh->msg[2], &cf, segname) && strstr(sh->msg[2], pidstr[0]), "job B rank 0: %s", sh->msg[2]);
        CHECK_MSG(clear_error(sh->msg[3], &cf, segname) && strstr(sh->msg[3], pidstr[launched ? 0 : 1]), "job B rank 1: %s",
                  sh->msg[3]);
        CHECK(!segment_exists(sh->job_id[0]));
        printf("     %s: the second job failed %.3f s after it started\n", launched ? "launched" : "by hand", secs);
        printf("     %s, rank 0: %s\n", launched ? "launched" : "by hand", sh->msg[2]);
        printf("     %s, rank 1: %s\n", launched ? "launched" : "by hand", sh->msg[3]);
    }
}

LK_TEST_MAIN(LK_TEST_CASE(launched_jobs_same_job_id), LK_TEST_CASE(jobs_by_hand_same_master_port),
             LK_TEST_CASE(late_second_job))
