/* shm: the rendezvous.
 *
 * Who may join (the job's identity is its job id, so its segment name):
 * two jobs started on one host with the same LK_JOB_ID or MASTER_PORT must
 * never pair up, whatever order their ranks run in. The claims are abstract
 * unix sockets named after the segment (bind is atomic and exclusive, the
 * kernel releases it when the process dies, nothing is left in any file
 * system): rank 0 holds "<name>" for the communicator's life, so a second
 * job's rank 0 fails at once, naming the holder's pid (SO_PEERCRED).
 *  - Ranks of one `lockstep launch` share LK_JOB_NONCE, a random number the
 *    launcher makes per attempt. Rank 0 writes it into the header and also
 *    holds "<name>#<nonce>"; a joiner attaches only to a segment with its
 *    own nonce, and fails at once when "<name>" is held by a rank 0 that is
 *    not its launch's (its "#<nonce>" is not held). So the first job to
 *    claim the id wins and no rank of the other can enter it: this holds in
 *    every interleaving.
 *  - Ranks started without the launcher (RANK/WORLD_SIZE/MASTER_PORT) share
 *    nothing the other job could not have, so rank k (k > 0) also holds
 *    "<name>/rank<k>", and whoever finds a rank's name held fails at once
 *    and leaves a connection queued on the holder's socket. After every rank
 *    has attached, each checks its queue (the "seal"): a queued connection
 *    means a second process wanted its rank while the job formed, so the
 *    job's ranks may come from two jobs, and it aborts before any
 *    collective, which needs every rank. Guarantee: a set of ranks stops
 *    before its first collective as soon as one of its members finds a
 *    notice at its seal, that is, when the other job's process for that
 *    rank made its claim before that seal. So ranks of two jobs can only
 *    complete a collective together if every one of their rivals claimed
 *    after the rank it rivals had sealed, which is indistinguishable from
 *    one job formed and a second started later; two jobs started together
 *    (every claim before any seal) never mix, and both fail. A job started
 *    after the first one sealed fails at once and the first runs on (as a
 *    second torchrun fails to bind MASTER_PORT).
 * The steps (claim, open, slot, publish, wait, seal, done) can each stop the
 * process (LK_COMM_TEST_RDV_PAUSE) so tests force every interleaving. */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "comm/shm_impl.h"

/* ------------------------------------------------------------------------
 * Rendezvous.
 * ---------------------------------------------------------------------- */

/* The shm backend joins the processes of one node: a MASTER_ADDR that does
 * not resolve, or resolves to another host, is a launch mistake. */
lk_status lk__shm_check_master_addr(const char *addr) {
    if (!addr || !*addr) return LK_STATUS_OK;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(addr, NULL, &hints, &res);
    if (rc)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "MASTER_ADDR='%s' does not resolve (%s); expected this host's name or address",
                        addr, gai_strerror(rc));
    bool local = false;
    struct ifaddrs *ifs = NULL;
    getifaddrs(&ifs);
    for (struct addrinfo *a = res; a && !local; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            uint32_t ip = ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr);
            if ((ip >> 24) == 127 || ip == 0) local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == ((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr)
                    local = true;
        } else if (a->ai_family == AF_INET6) {
            const struct in6_addr *ip6 = &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            if (IN6_IS_ADDR_LOOPBACK(ip6)) local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
                    !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, ip6, sizeof *ip6))
                    local = true;
        }
    }
    if (ifs) freeifaddrs(ifs);
    freeaddrinfo(res);
    if (!local)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "MASTER_ADDR='%s' is not an address of this host: the shm backend joins the processes of one node "
                        "(start multi-node jobs with mpirun/srun for the mpi backend, or set MASTER_ADDR=127.0.0.1)",
                        addr);
    return LK_STATUS_OK;
}

/* ------------------------------------------------------------------------
 * Identity: the claims that keep two jobs with one job id apart.
 * ---------------------------------------------------------------------- */
enum { RDV_CLAIM, RDV_OPEN, RDV_SLOT, RDV_PUBLISH, RDV_WAIT, RDV_SEAL, RDV_DONE, RDV_NSTEPS };
static const char *const rdv_step_names[RDV_NSTEPS] = {"claim", "open", "slot", "publish", "wait", "seal", "done"};

/* LK_COMM_TEST_RDV_PAUSE: "all" or a comma-separated list of step names. */
unsigned lk__shm_rdv_pause_mask(void) {
    const char *v = lk_env_get("LK_COMM_TEST_RDV_PAUSE");
    if (!v || !*v) return 0;
    char buf[160];
    snprintf(buf, sizeof buf, "%s", v);
    unsigned mask = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        int i = 0;
        while (i < RDV_NSTEPS && strcmp(t, rdv_step_names[i])) i++;
        if (!strcmp(t, "all")) mask = (1u << RDV_NSTEPS) - 1;
        else if (i < RDV_NSTEPS) mask |= 1u << i;
        else lk_log_warn("LK_COMM_TEST_RDV_PAUSE: unknown step '%s' (expected all or claim, open, slot, publish, wait, "
                         "seal, done): ignored", t);
    }
    return mask;
}

/* Tests stop here (SIGSTOP) and continue the process when they choose: the
 * steps of two jobs' ranks then run in the order the test forces. */
static void rdv_step(const shm_comm *s, int step) {
    if (s->pause_mask >> step & 1u) raise(SIGSTOP);
}

static uint64_t fnv1a64(const char *p) {
    uint64_t h = 1469598103934665603ull;
    for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* LK_JOB_NONCE as a number: the launcher's 16 hex digits, or any other text
 * hashed; never 0, which means "no nonce". */
uint64_t lk__shm_parse_nonce(const char *v) {
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 16);
    uint64_t n = !*end && !errno && strlen(v) == 16 ? (uint64_t)x : fnv1a64(v);
    return n ? n : 1;
}

/* The abstract socket names of a segment: "lockstep-<job>" (hashed when long:
 * an address holds 107 bytes). Abstract names live in the network namespace:
 * ranks in containers that share /dev/shm but not the network do not see
 * each other's claims, and only the segment's own checks remain. */
void lk__shm_sock_base(const char *segname, char *buf, size_t size) {
    const char *n = segname[0] == '/' ? segname + 1 : segname;
    if (strlen(n) <= 64) snprintf(buf, size, "%s", n);
    else snprintf(buf, size, "%.40s~%016llx", n, (unsigned long long)fnv1a64(n));
}

static socklen_t sock_addr(const char *base, const char *suffix, struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "%s%s", base, suffix); /* sun_path[0] = 0: abstract */
    if (n < 0) n = 0;
    if ((size_t)n > sizeof a->sun_path - 2) n = (int)(sizeof a->sun_path - 2);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Whether a live process holds the name (listens on it); its pid in *pid
 * (0: unknown: its queue is full). The connection stays queued on the
 * holder's socket: for a rank of a job without a nonce that is the notice
 * it reads at its seal. */
static bool probe_name(const struct sockaddr_un *a, socklen_t len, int *pid) {
    if (pid) *pid = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    int rc = connect(fd, (const struct sockaddr *)a, len), e = errno;
    if (rc == 0 && pid) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (!getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) *pid = cr.pid;
    }
    close(fd);
    return rc == 0 || e == EAGAIN;
}

/* Takes the name for this process (released when *fd is closed or the
 * process dies; close-on-exec, but a child forked without exec keeps it
 * until it exits): 0 taken; 1 a live process holds it (pid in *holder, 0
 * unknown), and now has our connection queued; -1 error (errno). Probing
 * before binding makes "find it held" and "tell the holder" one step: the
 * holder can only miss the notice if it looked before we found it held. */
static int claim_name(const struct sockaddr_un *a, socklen_t len, int *fd, int *holder) {
    for (int tries = 0;; tries++) {
        if (probe_name(a, len, holder)) return 1;
        int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (sfd < 0) return -1;
        /* The queue holds the notices (and probes) of other jobs' ranks; a
         * full one still reads as held, only without the holder's pid. */
        if (!bind(sfd, (const struct sockaddr *)a, len) && !listen(sfd, 128)) {
            *fd = sfd;
            return 0;
        }
        int e = errno;
        close(sfd);
        if (e != EADDRINUSE) {
            errno = e;
            return -1;
        }
        /* Bound but not listening yet (its holder is between the two calls),
         * or just released. Something that binds and never listens is not
         * lockstep: after 2 s it counts as a holder. */
        if (tries >= 2000) {
            *holder = 0;
            return 1;
        }
        lk__shm_sleep_ms(1);
    }
}

static void holder_words(int pid, char *buf, size_t size) {
    if (pid > 0) snprintf(buf, size, "pid %d", pid);
    else snprintf(buf, size, "a live process (its pid unknown)");
}

/* Step 1: rank 0 takes "<name>#<nonce>" (a launch's) and then "<name>";
 * without a nonce, rank k > 0 takes "<name>/rank<k>". Joiners of a launch
 * take nothing: the nonce keeps them out of other segments. */
static lk_status claim(shm_comm *s) {
    struct sockaddr_un a;
    socklen_t len;
    char suffix[40], who[64], pids[400];
    int holder = 0, rc;
    if (s->rank == 0 && s->nonce) {
        snprintf(suffix, sizeof suffix, "#%016llx", (unsigned long long)s->nonce);
        len = sock_addr(s->sockbase, suffix, &a);
        rc = claim_name(&a, len, &s->nonce_fd, &holder);
        if (rc < 0) return lk_error(LK_STATUS_IO, "rendezvous: cannot claim the socket @%s: %s", a.sun_path + 1, strerror(errno));
        if (rc > 0) {
            holder_words(holder, who, sizeof who);
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "rendezvous: rank 0 of this launch of %s is already running as %s (two processes started with "
                            "RANK=0 and the same LK_JOB_NONCE?)",
                            s->ident, who);
        }
    }
    if (s->rank == 0) {
        len = sock_addr(s->sockbase, "", &a);
        rc = claim_name(&a, len, &s->claim_fd, &holder);
        if (rc < 0) return lk_error(LK_STATUS_IO, "rendezvous: cannot claim the socket @%s: %s", a.sun_path + 1, strerror(errno));
        if (rc > 0) {
            holder_words(holder, who, sizeof who);
            lk__shm_segment_pids(s->name, pids, sizeof pids);
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "rendezvous: %s is already in use on this host: %s holds it (rank 0 of another job, shm segment "
                            "%s%s); two jobs cannot share it: %s, or stop the other job",
                            s->ident, who, s->name, pids, s->remedy);
        }
        return LK_STATUS_OK;
    }
    if (s->nonce) return LK_STATUS_OK;
    snprintf(suffix, sizeof suffix, "/rank%d", s->rank);
    len = sock_addr(s->sockbase, suffix, &a);
    rc = claim_name(&a, len, &s->claim_fd, &holder);
    if (rc < 0) return lk_error(LK_STATUS_IO, "rendezvous: cannot claim the socket @%s: %s", a.sun_path + 1, strerror(errno));
    if (rc > 0) {
        holder_words(holder, who, sizeof who);
        lk__shm_segment_pids(s->name, pids, sizeof pids);
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "rendezvous: rank %d of %s is already held on this host by %s, a live process that claims the "
                        "same rank: two processes were given rank %d (RANK, SLURM_PROCID or PMI_RANK set alike), or a "
                        "process of another job (shm segment %s%s); each rank must be started once, and two jobs "
                        "cannot share a job id: %s, or stop the other job",
                        s->rank, s->ident, who, s->rank, s->name, pids, s->remedy);
    }
    return LK_STATUS_OK;
}

/* A joiner of a launch waiting for its segment: "<name>" held while
 * "<name>#<our nonce>" is not means rank 0 of another job holds the id (our
 * rank 0 takes its nonce's name first and releases it last), so ours cannot
 * get it: fail now instead of at comm_timeout (lk__shm_attach_segment runs
 * it between its tries). */
static lk_status check_foreign_holder(shm_comm *s) {
    struct sockaddr_un a;
    int holder = 0;
    socklen_t len = sock_addr(s->sockbase, "", &a);
    if (!probe_name(&a, len, &holder)) return LK_STATUS_OK;
    char suffix[40], who[64];
    snprintf(suffix, sizeof suffix, "#%016llx", (unsigned long long)s->nonce);
    len = sock_addr(s->sockbase, suffix, &a);
    if (probe_name(&a, len, NULL)) return LK_STATUS_OK;
    holder_words(holder, who, sizeof who);
    return lk_error(LK_STATUS_INVALID_USAGE,
                    "rendezvous: %s is already in use on this host: %s holds it, and it is not rank 0 of this rank's launch "
                    "(another job with the same id; shm segment %s): %s, or stop the other job",
                    s->ident, who, s->name, s->remedy);
}

/* Step 6, after every rank attached: a notice queued on this rank's claim
 * means another process wanted this rank while the job formed (see the top
 * of the file). This rank then aborts with the reason in its slot: no
 * collective can complete without it, and a peer that sealed first fails
 * its first collective quoting that reason. */
static lk_status seal(shm_comm *s) {
    shm_slot *me = slot_of(s, s->rank);
    if (!s->nonce && s->claim_fd >= 0) {
        int fd = accept4(s->claim_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            struct ucred cr = {0};
            socklen_t cl = sizeof cr;
            if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) cr.pid = 0;
            close(fd);
            char who[64], pids[400];
            holder_words(cr.pid, who, sizeof who);
            lk__shm_segment_pids(s->name, pids, sizeof pids);
            lk_status st = lk_error(LK_STATUS_INVALID_USAGE,
                                    "rendezvous: %s also wanted rank %d of %s while this job formed (shm segment %s%s): "
                                    "two jobs with the same id started together on this host, so this job's ranks may "
                                    "come from both, and it stops before any collective mixes their data: %s",
                                    who, s->rank, s->ident, s->name, pids, s->remedy);
            snprintf(me->reason, sizeof me->reason, "%s", lk_last_error());
            atomic_store(&me->state, ST_ABORTED);
            return st;
        }
    }
    return LK_STATUS_OK;
}

/* The launcher, after its ranks are gone: removes the segment name when it
 * is its job's (same nonce), or nobody holds the id any more (a stale one).
 * Another live job's segment is left alone. */
void lk__shm_cleanup(const char *job_id, uint64_t nonce) {
    char name[256], base[96];
    lk_comm_shm_segment_name(job_id, name, sizeof name);
    int fd = shm_open(name, O_RDONLY, 0600);
    if (fd < 0) return;
    bool ours = false;
    struct stat st;
    if (!fstat(fd, &st) && (size_t)st.st_size >= sizeof(shm_header)) {
        shm_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            ours = atomic_load(&h->magic) == SHM_MAGIC && h->nonce == nonce;
            munmap(h, sizeof *h);
        }
    }
    struct sockaddr_un a;
    lk__shm_sock_base(name, base, sizeof base);
    socklen_t len = sock_addr(base, "", &a);
    if ((ours || !probe_name(&a, len, NULL)) && lk__shm_same_segment(name, fd)) shm_unlink(name);
    close(fd);
}

uint64_t lk__job_nonce(const char *text) { return lk__shm_parse_nonce(text); }

lk_status lk__shm_rendezvous(lk_comm *c, shm_comm *s) {
    uint64_t t0 = lk_time_ns(), deadline = t0 + (uint64_t)(c->timeout_s * 1e9);
    rdv_step(s, RDV_CLAIM);
    LK_TRY(claim(s));
    rdv_step(s, RDV_OPEN);
    if (s->rank == 0) LK_TRY(lk__shm_create_segment(c, s));
    else LK_TRY(lk__shm_attach_segment(c, s, deadline, s->nonce ? check_foreign_holder : NULL));
    rdv_step(s, RDV_SLOT);
    shm_header *h = s->hdr;
    if (h->world != s->world)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "rendezvous: WORLD_SIZE mismatch: rank %d has world size %d but rank 0 created the job with world "
                        "size %d",
                        s->rank, s->world, h->world);
    s->small_bytes = h->small_bytes; /* rank 0's choice wins, whatever this rank's environment says */
    s->chunk_shared = h->chunk_shared;
    shm_slot *me = slot_of(s, s->rank);
    int expected = 0, mypid = getpid();
    if (!atomic_compare_exchange_strong(&me->pid, &expected, mypid))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "rendezvous: rank %d of %s is already taken by pid %d (shm segment %s): two processes started with "
                        "the same RANK, or two jobs with the same id (%s)",
                        s->rank, s->ident, expected, s->name, s->remedy);
    me->world = s->world;
    atomic_store(&me->active_ns, lk_time_ns());
    rdv_step(s, RDV_PUBLISH);
    atomic_store(&me->state, ST_ATTACHED);
    atomic_fetch_add(&h->attached, 1);
    rdv_step(s, RDV_WAIT);
    uint64_t next_check = lk_time_ns() + CHECK_NS;
    while (atomic_load(&h->attached) < s->world) {
        uint64_t now = lk_time_ns();
        if (now >= deadline) {
            char missing[512] = "";
            size_t len = 0;
            int n = 0;
            for (int k = 0; k < s->world && len < sizeof missing - 16; k++)
                if (atomic_load(&slot_of(s, k)->state) == ST_EMPTY)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", n++ ? ", " : "", k);
            return lk_error(LK_STATUS_TIMEOUT,
                            "rendezvous timed out after %.1f s: %d of %d ranks attached to %s (missing rank%s %s); "
                            "WORLD_SIZE=%d does not match the processes started?",
                            (double)(now - t0) * 1e-9, atomic_load(&h->attached), s->world, s->name, n == 1 ? "" : "s",
                            missing, s->world);
        }
        if (now >= next_check) {
            for (int k = 0; k < s->world; k++) {
                shm_slot *sl = slot_of(s, k);
                int pid = atomic_load(&sl->pid);
                if (k != s->rank && pid && !lk__pid_alive(pid))
                    return lk_error(LK_STATUS_REMOTE, "rendezvous: rank %d (pid %d) died while the job was starting", k, pid);
            }
            next_check = now + CHECK_NS;
        }
        lk__shm_sleep_ms(1);
    }
    rdv_step(s, RDV_SEAL);
    LK_TRY(seal(s));
    rdv_step(s, RDV_DONE);
    /* Peers in another pid namespace (containers sharing /dev/shm) have pids
     * that mean nothing here: for them only timeouts and abort states count. */
    for (int k = 0; k < s->world; k++) s->pid_visible[k] = lk__pid_alive(atomic_load(&slot_of(s, k)->pid));
    /* Everyone is in: remove the name now, so no crash can leak it. Rank 0
     * holds the id, so the name is still its segment; another rank removes
     * it only while it still is (rank 0 may have moved on to a new
     * communicator under the same name). */
    if (s->rank == 0 || lk__shm_same_segment(s->name, s->fd)) shm_unlink(s->name);
    s->unlinked = true;
    return LK_STATUS_OK;
}

/* Releases the claims: "<name>" before "<name>#<nonce>", so a joiner never
 * sees the id held and its launch's name free while its own rank 0 has it. */
void lk__shm_release_claims(shm_comm *s) {
    if (s->claim_fd >= 0) close(s->claim_fd);
    if (s->nonce_fd >= 0) close(s->nonce_fd);
    s->claim_fd = s->nonce_fd = -1;
}


/* How messages name the identity, and what to change: the job id, or the
 * MASTER_PORT it was derived from (lk_pg_info_from_env). */
void lk__shm_describe_identity(const lk_comm *c, shm_comm *s) {
    char pre[32];
    int port = c->pg.master_port;
    snprintf(pre, sizeof pre, "p%d-", port);
    const char *env_id = getenv("LK_JOB_ID");
    bool from_port = port > 0 && !strncmp(c->job_id, pre, strlen(pre)) && !(env_id && !strcmp(env_id, c->job_id));
    if (from_port) {
        snprintf(s->ident, sizeof s->ident, "job id '%s' (derived from MASTER_PORT=%d)", c->job_id, port);
        snprintf(s->remedy, sizeof s->remedy, "give one of the jobs another MASTER_PORT (or its own LK_JOB_ID)");
    } else {
        snprintf(s->ident, sizeof s->ident, "job id '%s'", c->job_id);
        snprintf(s->remedy, sizeof s->remedy, "start one of the jobs with another --job-id (lockstep launch) or LK_JOB_ID");
    }
}
