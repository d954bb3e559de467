/* The launcher: starts N local ranks of one command with the torchrun
 * variables set, relays their output line by line (rank 0 untouched, the
 * others prefixed "[rank R] "), forwards SIGINT/SIGTERM/SIGHUP/SIGUSR1, and
 * when one rank fails stops the others (a moment to report, then SIGTERM,
 * then SIGKILL) and returns that rank's exit code, or with max_restarts
 * starts all ranks again (torchrun's elastic restart). Children run in their own
 * process groups (so a signal reaches a rank's whole tree and the terminal's
 * Ctrl-C is not delivered twice) and die with the launcher
 * (PR_SET_PDEATHSIG). The job's shm segment name is removed at the end,
 * whatever happened, unless it belongs to another live job with the same id.
 * Each attempt's ranks get LK_JOB_NONCE, a random number of that attempt: a
 * rank joins only a segment its own attempt's rank 0 made, so two launches
 * with the same --job-id never pair up (comm_shm.c). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "lockstep/dist.h"

extern char **environ;

lk_launch_options lk_launch_options_default(void) {
    lk_launch_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.master_addr = "127.0.0.1";
    o.term_delay_s = 2.0;
    o.kill_grace_s = 3.0;
    return o;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 29500;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 29500;
    if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len)) port = ntohs(a.sin_port);
    close(fd);
    return port;
}

typedef struct {
    int pid;
    bool running;
    int code; /* exit code, or 128+signal */
    int fd[2]; /* stdout, stderr pipes (-1: inherited or closed) */
    char *line[2];
    size_t len[2], cap[2];
} child;

/* Writes one line of rank r to out, prefixed unless it already names its rank. */
static void emit(int r, bool prefix, FILE *out, const char *s, size_t n) {
    char tag[32];
    int t = snprintf(tag, sizeof tag, "[rank %d]", r);
    if (prefix && !(n >= (size_t)t && !memcmp(s, tag, (size_t)t))) fprintf(out, "[rank %d] ", r);
    fwrite(s, 1, n, out);
    if (!n || s[n - 1] != '\n') fputc('\n', out);
    fflush(out);
}

static void pump(child *ch, int r, int stream, bool prefix) {
    char buf[65536];
    ssize_t n = read(ch->fd[stream], buf, sizeof buf);
    FILE *out = stream ? stderr : stdout;
    if (n <= 0) {
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
        if (ch->len[stream]) emit(r, prefix, out, ch->line[stream], ch->len[stream]);
        ch->len[stream] = 0;
        close(ch->fd[stream]);
        ch->fd[stream] = -1;
        return;
    }
    size_t start = 0;
    for (size_t i = 0; i < (size_t)n; i++) {
        if (buf[i] != '\n') continue;
        if (ch->len[stream]) { /* complete a pending partial line */
            size_t need = ch->len[stream] + i - start + 1;
            if (need > ch->cap[stream]) {
                char *p = lk_realloc(ch->line[stream], need);
                if (!p) continue;
                ch->line[stream] = p;
                ch->cap[stream] = need;
            }
            memcpy(ch->line[stream] + ch->len[stream], buf + start, i - start + 1);
            emit(r, prefix, out, ch->line[stream], need);
            ch->len[stream] = 0;
        } else {
            emit(r, prefix, out, buf + start, i - start + 1);
        }
        start = i + 1;
    }
    if (start < (size_t)n) { /* keep the partial line for later */
        size_t need = ch->len[stream] + (size_t)n - start;
        if (need > ch->cap[stream]) {
            char *p = lk_realloc(ch->line[stream], need * 2);
            if (!p) return;
            ch->line[stream] = p;
            ch->cap[stream] = need * 2;
        }
        memcpy(ch->line[stream] + ch->len[stream], buf + start, (size_t)n - start);
        ch->len[stream] = need;
        if (need > (1u << 20)) { /* a runaway line: emit what we have */
            emit(r, prefix, out, ch->line[stream], need);
            ch->len[stream] = 0;
        }
    }
}

static bool is_ours(const char *e) {
    static const char *names[] = {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=", "NODE_RANK=",
                                  "MASTER_ADDR=", "MASTER_PORT=", "LK_JOB_ID=", "LK_JOB_NONCE=", "ROLE_RANK=", "ROLE_WORLD_SIZE=",
                                  "TORCHELASTIC_RESTART_COUNT=", "TORCHELASTIC_MAX_RESTARTS="};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strncmp(e, names[i], strlen(names[i]))) return true;
    return false;
}

static const char *sig_name(int sig) {
    switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGHUP: return "SIGHUP";
    case SIGFPE: return "SIGFPE";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal";
    }
}

static void signal_all(child *ch, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (ch[r].running) {
            if (kill(-ch[r].pid, sig) != 0) kill(ch[r].pid, sig); /* group gone already: the child itself */
        }
}

/* 16 hex digits no other launch on this host will pick: the kernel's
 * random bytes, or (if it has none to give) clock, pid and address mixed. */
static void make_nonce(char *buf, size_t size) {
    uint64_t x = 0;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) {
        x = lk_time_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)buf;
        x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ull;
    }
    snprintf(buf, size, "%016llx", (unsigned long long)(x ? x : 1));
}

/* One attempt: starts the ranks, relays their output, handles signals and
 * failures, reaps every rank. *signalled is the signal the launcher got (0:
 * none), *failed_rank the first rank that failed (-1: none). */
#define NKV 11
static lk_status launch_once(int nprocs, char *const argv[], const lk_launch_options *opt, const char *job_base,
                             int attempt, int sfd, const sigset_t *old, int *exit_code, int *signalled, int *failed_rank) {
    *exit_code = 1;
    *signalled = 0;
    *failed_rank = -1;
    char job[128], port[16], nbuf[16], rcount[16], rmax[16], nonce[24];
    /* a fresh job id (so a fresh shm segment) and port per attempt: nothing of the failed attempt is reused */
    if (attempt) snprintf(job, sizeof job, "%s-r%d", job_base, attempt);
    else snprintf(job, sizeof job, "%s", job_base);
    snprintf(port, sizeof port, "%d", opt->master_port > 0 ? opt->master_port : free_port());
    snprintf(nbuf, sizeof nbuf, "%d", nprocs);
    snprintf(rcount, sizeof rcount, "%d", attempt);
    snprintf(rmax, sizeof rmax, "%d", opt->max_restarts);
    make_nonce(nonce, sizeof nonce);

    /* Environment per rank, built before fork (the child only execs). */
    int nenv = 0;
    while (environ[nenv]) nenv++;
    const int extra = NKV + 2;
    char **envs = lk_calloc((size_t)nprocs * (size_t)(nenv + extra + 1), sizeof(char *));
    char *strs = lk_malloc((size_t)nprocs * NKV * 160);
    child *ch = lk_calloc((size_t)nprocs, sizeof *ch);
    if (!envs || !strs || !ch) {
        lk_free(envs);
        lk_free(strs);
        lk_free(ch);
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "lk_launch: out of memory for %d ranks' environments", nprocs);
    }
    for (int r = 0; r < nprocs; r++) {
        char **e = envs + (size_t)r * (size_t)(nenv + extra + 1);
        char *s = strs + (size_t)r * NKV * 160;
        int k = 0;
        for (int i = 0; i < nenv; i++)
            if (!is_ours(environ[i])) e[k++] = environ[i];
        const char *kv[NKV][2] = {{"RANK", NULL}, {"LOCAL_RANK", NULL}, {"WORLD_SIZE", nbuf}, {"LOCAL_WORLD_SIZE", nbuf},
                                  {"GROUP_RANK", "0"}, {"MASTER_ADDR", opt->master_addr}, {"MASTER_PORT", port},
                                  {"LK_JOB_ID", job}, {"LK_JOB_NONCE", nonce}, {"TORCHELASTIC_RESTART_COUNT", rcount},
                                  {"TORCHELASTIC_MAX_RESTARTS", rmax}};
        char rb[16];
        snprintf(rb, sizeof rb, "%d", r);
        kv[0][1] = kv[1][1] = rb;
        for (int j = 0; j < NKV; j++) {
            snprintf(s + j * 160, 160, "%s=%s", kv[j][0], kv[j][1]);
            e[k++] = s + j * 160;
        }
        e[k] = NULL;
        ch[r].fd[0] = ch[r].fd[1] = -1;
    }

    lk_status st = LK_STATUS_OK;
    fflush(stdout);
    fflush(stderr);
    pid_t self = getpid();
    int started = 0;
    for (int r = 0; r < nprocs; r++) {
        int p[2][2] = {{-1, -1}, {-1, -1}};
        bool prefix = r != 0 || opt->prefix_all;
        if (prefix && (pipe2(p[0], O_CLOEXEC) || pipe2(p[1], O_CLOEXEC))) {
            st = lk_error(LK_STATUS_IO, "lk_launch: pipe failed: %s", strerror(errno));
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            st = lk_error(LK_STATUS_INTERNAL, "lk_launch: fork of rank %d failed: %s", r, strerror(errno));
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++)
                    if (p[i][j] >= 0) close(p[i][j]);
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != self) _exit(128 + SIGKILL); /* the launcher died before we got here */
            setpgid(0, 0);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            signal(SIGHUP, SIG_DFL);
            signal(SIGPIPE, SIG_DFL);
            pthread_sigmask(SIG_SETMASK, old, NULL);
            if (prefix) {
                dup2(p[0][1], 1);
                dup2(p[1][1], 2);
            }
            if (opt->child_main) { /* ddp_spawn: this fork is the rank */
                environ = envs + (size_t)r * (size_t)(nenv + extra + 1);
                int code = opt->child_main(opt->child_ctx);
                fflush(stdout);
                fflush(stderr);
                _exit(code);
            }
            execvpe(opt->exec_path ? opt->exec_path : argv[0], argv, envs + (size_t)r * (size_t)(nenv + extra + 1));
            char msg[512];
            int n = snprintf(msg, sizeof msg, "lockstep launch: cannot run '%s' for rank %d: %s\n", argv[0], r, strerror(errno));
            if (write(2, msg, (size_t)n) < 0) _exit(127);
            _exit(127);
        }
        setpgid(pid, pid);
        ch[r].pid = pid;
        ch[r].running = true;
        started++;
        if (prefix) {
            close(p[0][1]);
            close(p[1][1]);
            ch[r].fd[0] = p[0][0];
            ch[r].fd[1] = p[1][0];
        }
    }

    int first_fail = -1, fail_code = 0, got_signal = 0, running = started;
    double term_at = 0, kill_at = 0;
    bool term_sent = false, kill_sent = false;
    if (st) { /* a fork failed: stop what started */
        signal_all(ch, started, SIGKILL);
        first_fail = 0;
        fail_code = 1;
    }
    struct pollfd *pf = lk_calloc((size_t)(2 * nprocs + 1), sizeof *pf);
    int *who = lk_calloc((size_t)(2 * nprocs + 1), sizeof *who);
    double drain_until = 0;
    while (pf && who) {
        double now = lk_time_now();
        if (running == 0) {
            if (drain_until == 0) drain_until = now + 0.5; /* grandchildren may hold the pipes: bounded drain */
            if (now >= drain_until) break;
        }
        if (first_fail >= 0 || got_signal) {
            if (!term_sent && term_at > 0 && now >= term_at) {
                signal_all(ch, nprocs, SIGTERM);
                term_sent = true;
                kill_at = now + opt->kill_grace_s;
            }
            if (!kill_sent && kill_at > 0 && now >= kill_at) {
                signal_all(ch, nprocs, SIGKILL);
                kill_sent = true;
            }
        }
        int n = 0;
        pf[n].fd = sfd;
        pf[n].events = POLLIN;
        who[n++] = -1;
        for (int r = 0; r < nprocs; r++)
            for (int k = 0; k < 2; k++)
                if (ch[r].fd[k] >= 0) {
                    pf[n].fd = ch[r].fd[k];
                    pf[n].events = POLLIN;
                    who[n++] = r * 2 + k;
                }
        if (running == 0 && n == 1) break;
        int timeout_ms = 100;
        if (poll(pf, (nfds_t)n, timeout_ms) < 0 && errno != EINTR) break;
        for (int i = 1; i < n; i++)
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR)) pump(&ch[who[i] / 2], who[i] / 2, who[i] % 2, true);
        if (!(pf[0].revents & POLLIN)) continue;
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            int sig = (int)si.ssi_signo;
            if (sig == SIGCHLD) continue;
            if (got_signal) { /* second signal: no more patience */
                signal_all(ch, nprocs, SIGKILL);
                kill_sent = true;
                continue;
            }
            got_signal = sig;
            if (!opt->quiet) fprintf(stderr, "lockstep launch: got %s, forwarding to %d rank(s)\n", sig_name(sig), running);
            signal_all(ch, nprocs, sig);
            term_sent = true;
            kill_at = lk_time_now() + opt->term_delay_s + opt->kill_grace_s;
        }
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            int r = 0;
            while (r < nprocs && ch[r].pid != pid) r++;
            if (r == nprocs) continue;
            ch[r].running = false;
            running--;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
            ch[r].code = code;
            if (code != 0 && first_fail < 0 && !(got_signal && !term_at)) {
                first_fail = r;
                fail_code = code;
                if (!opt->quiet) {
                    if (WIFSIGNALED(status))
                        fprintf(stderr, "lockstep launch: rank %d (pid %d) was killed by signal %d (%s)", r, (int)pid,
                                WTERMSIG(status), sig_name(WTERMSIG(status)));
                    else fprintf(stderr, "lockstep launch: rank %d (pid %d) exited with status %d", r, (int)pid, code);
                    fprintf(stderr, running ? "; stopping the other %d rank(s)\n" : "\n", running);
                }
                if (!term_sent) term_at = lk_time_now() + opt->term_delay_s;
            } else if (code != 0 && first_fail < 0) {
                first_fail = r;
                fail_code = code;
            }
        }
    }
    lk_free(pf);
    lk_free(who);
    /* Whatever is left (only on an internal error above) is killed and reaped. */
    for (int r = 0; r < nprocs; r++) {
        if (ch[r].running) {
            kill(-ch[r].pid, SIGKILL);
            kill(ch[r].pid, SIGKILL);
            waitpid(ch[r].pid, NULL, 0);
            ch[r].running = false;
        }
        for (int k = 0; k < 2; k++) {
            if (ch[r].fd[k] >= 0) {
                if (ch[r].len[k]) emit(r, true, k ? stderr : stdout, ch[r].line[k], ch[r].len[k]);
                close(ch[r].fd[k]);
            }
            lk_free(ch[r].line[k]);
        }
    }
    if (first_fail >= 0) *exit_code = fail_code;
    else if (got_signal) *exit_code = 128 + got_signal;
    else *exit_code = 0;
    *signalled = got_signal;
    *failed_rank = first_fail;
    lk__shm_cleanup(job, lk__job_nonce(nonce)); /* normally gone already; a crash during startup could leave it */
    lk_free(envs);
    lk_free(strs);
    lk_free(ch);
    return st;
}

lk_status lk_launch(int nprocs, char *const argv[], const lk_launch_options *opt_in, int *exit_code) {
    if (exit_code) *exit_code = 1;
    if (nprocs < 1 || nprocs > 4096)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_launch: number of processes %d is out of range (expected 1..4096)", nprocs);
    if (!argv || !argv[0] || !argv[0][0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_launch: no command given (expected: launch -n N -- command args...)");
    lk_launch_options opt = lk_launch_options_default();
    if (opt_in) memcpy(&opt, opt_in, opt_in->struct_size < sizeof opt ? opt_in->struct_size : sizeof opt);
    if (!opt.master_addr) opt.master_addr = "127.0.0.1";
    if (opt.max_restarts < 0 || opt.max_restarts > 1000000)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_launch: max_restarts %d is out of range (expected 0..1000000)",
                        opt.max_restarts);

    char job[96];
    if (opt.job_id && *opt.job_id) snprintf(job, sizeof job, "%s", opt.job_id);
    else snprintf(job, sizeof job, "lk%d-%llx", (int)getpid(), (unsigned long long)(lk_time_ns() & 0xffffffffffull));

    /* Signals are taken through a signalfd for the whole job, restarts
     * included, so one arriving between two attempts is not lost. */
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &mask, &old);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    lk_status st = LK_STATUS_OK;
    if (sfd < 0) st = lk_error(LK_STATUS_INTERNAL, "lk_launch: signalfd failed: %s", strerror(errno));
    int code = 1;
    for (int attempt = 0; !st; attempt++) {
        int sig = 0, failed = -1;
        double t0 = lk_time_now();
        st = launch_once(nprocs, argv, &opt, job, attempt, sfd, &old, &code, &sig, &failed);
        /* torchrun's --max-restarts: a rank failure (not a signal the
         * launcher was sent) restarts every rank; the job resumes from its
         * last checkpoint because TORCHELASTIC_RESTART_COUNT > 0. */
        if (st || code == 0 || sig || failed < 0 || attempt >= opt.max_restarts) break;
        fprintf(stderr, "lockstep launch: rank %d failed (exit status %d) after %.1f s; restarting all %d rank(s) "
                "(restart %d of %d, TORCHELASTIC_RESTART_COUNT=%d)\n", failed, code, lk_time_now() - t0, nprocs,
                attempt + 1, opt.max_restarts, attempt + 1);
        fflush(stderr);
    }
    if (exit_code) *exit_code = code;
    if (sfd >= 0) close(sfd);
    /* Drain signals still pending for us before unblocking (SIGCHLD is harmless, the rest were handled). */
    {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&mask, NULL, &zero) > 0) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return st;
}
