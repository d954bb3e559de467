/* `lockstep bench comm`: all-reduce latency and bandwidth per message size
 * for every communicator backend built, next to OpenMPI's own
 * MPI_Allreduce on the same sizes, in the nccl-tests convention
 * (algbw = bytes / time, busbw = algbw * 2(n-1)/n). The parent process
 * launches itself N times per backend (lk_launch for shm, mpirun for mpi);
 * rank 0 of each job writes CSV rows to a temporary file the parent merges.
 * Rows: shm (buffer inside the segment: the DDP bucket path), shm-private
 * (ordinary memory, copied through staging), mpi (lockstep's mpi backend,
 * with its desync check), MPI_Allreduce (raw OpenMPI).
 *
 * --op sendrecv: point-to-point instead, a ping-pong between ranks 0 and 1
 * (rank 0 sends, rank 1 sends it back; the time is half the round trip,
 * the bandwidth the size over it), 8 B to 64 MiB by default. Rows:
 * shm-sendrecv, mpi-sendrecv (lockstep's lk_comm_send/recv) and
 * MPI_Send/Recv (raw OpenMPI on the same sizes). */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "lockstep.h"

extern char **environ;
/* Defined by the mpi backend when it is built; absent otherwise. */
extern lk_status lk__mpi_raw_allreduce_us(size_t bytes, int iters, double limit_s, double *us) __attribute__((weak));
extern lk_status lk__mpi_raw_pingpong_us(size_t bytes, int iters, double *us) __attribute__((weak));

typedef struct {
    const char *backend, *worker, *csv, *out;
    int n;
    size_t min, max;
    double time_s;
    int iters;  /* fixed count, 0: from time_s */
    int repeat; /* measurements per size; the fastest is reported (a shared machine only ever adds noise) */
    bool touch; /* every rank rewrites its buffer before each all-reduce, as backward does (not timed) */
    bool p2p;   /* --op sendrecv: the ping-pong instead of all_reduce */
    double raw_limit_s; /* --raw-limit: bound of one raw MPI_Allreduce loop (0: comm_timeout) */
} bench_opts;

/* The sizes: x4 steps from min, and max itself when the steps miss it. */
static size_t next_size(const bench_opts *o, size_t bytes) {
    if (bytes >= o->max) return 0;
    return bytes * 4 > o->max ? o->max : bytes * 4;
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || v <= 0) return 0;
    size_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024ull * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return 0;
    *out = (size_t)(v * (double)mul);
    return 1;
}

static void usage(FILE *f) {
    fprintf(f, "usage: lockstep bench comm [--op allreduce|sendrecv] [--backend shm|mpi|all] [-n RANKS] [--min 4K]\n"
               "                           [--max 256M] [--time SECONDS] [--iters N] [--repeat K] [--touch 0|1] [--csv FILE]\n\n"
               "All-reduce (f32, sum) time and bandwidth per size, x4 steps from --min to --max,\n"
               "for each backend built and raw MPI_Allreduce (when MPI and mpirun exist).\n"
               "Each size runs K times (--repeat, default 5) for about --time seconds (0.1);\n"
               "the fastest is reported, as the slowest rank measured it.\n"
               "--touch 1: every rank rewrites its buffer before each all-reduce (untimed), as a\n"
               "training step's backward does, so the data starts in the writer's cache, not\n"
               "where the last all-reduce left it (lockstep's rows; raw MPI_Allreduce is left out).\n"
               "busbw = algbw * 2(n-1)/n. CSV columns: backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps\n"
               "--op sendrecv: lk_comm_send/recv ping-pong between 2 ranks (and raw MPI_Send/Recv),\n"
               "time one way (half the round trip), bandwidth = bytes / time; default sizes 8 to 64M.\n"
               "--raw-limit SECONDS: a raw MPI_Allreduce loop still running after this long (default:\n"
               "comm_timeout) ends its rank with a message (a blocking MPI call cannot time out).\n");
}

/* ---- worker: one rank of a benchmark job ---- */
static double measure(lk_comm *c, void *buf, size_t count, int iters, bool touch) {
    double spent = 0;
    for (int i = 0; i < iters; i++) {
        if (touch) memset(buf, 0x3c + (i & 1), count * sizeof(float)); /* small positive floats */
        double t0 = lk_time_now();
        if (lk_comm_all_reduce(c, buf, count, LK_F32, LK_REDUCE_SUM)) return -1;
        spent += lk_time_now() - t0;
    }
    return spent / iters;
}

/* Ping-pong between ranks 0 and 1 (others idle): seconds one way. */
static double measure_pp(lk_comm *c, void *buf, size_t bytes, int iters) {
    int r = lk_comm_rank(c);
    double t0 = lk_time_now();
    for (int i = 0; i < iters && r < 2; i++) {
        lk_status st = r == 0 ? lk_comm_send(c, buf, bytes, LK_U8, 1) : lk_comm_recv(c, buf, bytes, LK_U8, 0);
        if (!st) st = r == 0 ? lk_comm_recv(c, buf, bytes, LK_U8, 1) : lk_comm_send(c, buf, bytes, LK_U8, 0);
        if (st) return -1;
    }
    return (lk_time_now() - t0) / iters / 2;
}

static int pick_iters(lk_comm *c, void *buf, size_t count, const bench_opts *o) {
    int32_t iters = o->iters;
    if (!iters) {
        double t = o->p2p ? measure_pp(c, buf, count * sizeof(float), 3) : measure(c, buf, count, 3, o->touch);
        if (t < 0) return -1;
        iters = (int32_t)(o->time_s / (t > 1e-7 ? t : 1e-7));
        if (iters < 5) iters = 5;
        if (iters > 20000) iters = 20000;
    }
    if (lk_comm_broadcast(c, &iters, 1, LK_I32, 0)) return -1; /* every rank runs the same count */
    return iters;
}

static int row(FILE *out, lk_comm *c, const char *name, size_t bytes, double tmax) {
    int n = lk_comm_world_size(c);
    double alg = (double)bytes / tmax / 1e9;
    if (lk_comm_rank(c) == 0 && out) {
        fprintf(out, "%s,%d,%zu,%.3f,%.4f,%.4f\n", name, n, bytes, tmax * 1e6, alg, alg * 2.0 * (n - 1) / n);
        fflush(out);
    }
    return 0;
}

static int worker(const bench_opts *o) {
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = o->worker;
    cfg.shared_bytes = o->max + (1u << 20);
    lk_comm *c;
    if (lk_comm_create(&cfg, &c)) {
        fprintf(stderr, "bench comm worker: %s\n", lk_last_error());
        return 1;
    }
    FILE *out = NULL;
    if (lk_comm_rank(c) == 0) {
        out = o->out ? fopen(o->out, "w") : stdout;
        if (!out) {
            fprintf(stderr, "bench comm: cannot write %s: %s\n", o->out, strerror(errno));
            lk_comm_abort(c, "cannot write the output file");
            lk_comm_free(c);
            return 1;
        }
    }
    bool is_shm = !strcmp(lk_comm_backend(c), "shm");
    double raw_limit = o->raw_limit_s > 0 ? o->raw_limit_s : cfg.timeout_s;
    void *shared = NULL, *priv = lk_aligned_alloc(64, o->max);
    int rc = 0;
    if (!priv || lk_comm_alloc_shared(c, o->max, &shared)) {
        fprintf(stderr, "bench comm worker: %s\n", lk_last_error());
        rc = 1;
    }
    if (priv) memset(priv, 0, o->max);
    for (size_t bytes = o->min; !rc && o->p2p && bytes; bytes = next_size(o, bytes)) {
        const char *names[2] = {is_shm ? "shm-sendrecv" : "mpi-sendrecv", "MPI_Send/Recv"};
        for (int pass = 0; pass < (is_shm ? 1 : 2) && !rc; pass++) {
            /* pick_iters takes floats: round the probe down, it only sizes the loop */
            int iters = pick_iters(c, priv, bytes / sizeof(float) ? bytes / sizeof(float) : 1, o);
            double best = 1e30;
            for (int rep = 0; rep < o->repeat && iters > 0 && !rc; rep++) {
                double t, us;
                if (pass == 1) {
                    if (!lk__mpi_raw_pingpong_us || lk__mpi_raw_pingpong_us(bytes, iters, &us)) rc = 1;
                    t = us * 1e-6;
                } else {
                    if (lk_comm_barrier(c) || (t = measure_pp(c, priv, bytes, iters)) < 0) rc = 1;
                    else if (lk_comm_all_reduce(c, &t, 1, LK_F64, LK_REDUCE_MAX)) rc = 1;
                }
                if (!rc && t < best) best = t;
            }
            if (iters < 0) rc = 1;
            if (!rc && lk_comm_rank(c) == 0 && out) {
                fprintf(out, "%s,2,%zu,%.3f,%.4f,%.4f\n", names[pass], bytes, best * 1e6, (double)bytes / best / 1e9,
                        (double)bytes / best / 1e9);
                fflush(out);
            }
        }
    }
    for (size_t bytes = o->min; !rc && !o->p2p && bytes <= o->max; bytes *= 4) {
        size_t count = bytes / sizeof(float);
        for (int pass = 0; pass < 2 && !rc; pass++) {
            void *buf = pass == 0 ? shared : priv;
            const char *name = is_shm ? (pass == 0 ? "shm" : "shm-private") : (pass == 0 ? lk_comm_backend(c) : "MPI_Allreduce");
            if (!is_shm && pass == 1 && o->touch) continue; /* the raw MPI loop cannot touch between calls */
            /* The raw loop's count comes from the raw call's own time: one
             * from lockstep's (hier's, much faster on the namespace cluster)
             * made it run for minutes (see lk__mpi_raw_allreduce_us). The
             * probe's time is every rank's maximum, so all agree. */
            int iters;
            if (!is_shm && pass == 1 && !o->iters) {
                double us = 0;
                if (!lk__mpi_raw_allreduce_us || lk__mpi_raw_allreduce_us(bytes, 3, raw_limit, &us)) {
                    rc = 1;
                    break;
                }
                double k = o->time_s / (us > 0.1 ? us * 1e-6 : 1e-7);
                iters = k < 5 ? 5 : k > 20000 ? 20000 : (int)k;
            } else {
                iters = pick_iters(c, buf, count, o);
            }
            if (iters < 0) {
                rc = 1;
                break;
            }
            double best = 1e30;
            for (int rep = 0; rep < o->repeat && !rc; rep++) {
                double t;
                if (!is_shm && pass == 1) {
                    double us;
                    if (!lk__mpi_raw_allreduce_us || lk__mpi_raw_allreduce_us(bytes, iters, raw_limit, &us)) {
                        rc = 1;
                        break;
                    }
                    t = us * 1e-6;
                } else {
                    if (lk_comm_barrier(c) || (t = measure(c, buf, count, iters, o->touch)) < 0) {
                        rc = 1;
                        break;
                    }
                    if (lk_comm_all_reduce(c, &t, 1, LK_F64, LK_REDUCE_MAX)) rc = 1; /* the slowest rank's time */
                }
                if (t < best) best = t;
            }
            if (!rc && row(out, c, name, bytes, best)) rc = 1;
        }
    }
    if (rc) fprintf(stderr, "bench comm worker: %s\n", lk_last_error());
    if (out && out != stdout) fclose(out);
    lk_comm_free_shared(c, shared);
    lk_aligned_free(priv);
    lk_comm_free(c);
    return rc;
}

/* ---- parent: launch the workers, merge, print ---- */
typedef struct {
    char backend[32];
    int ranks;
    size_t bytes;
    double us, alg, bus;
} result;

static int run_job(const bench_opts *o, const char *self, const char *backend, const char *outfile) {
    char nbuf[16], minb[32], maxb[32], tb[32], ib[16], rb[16], tch[4], rl[32];
    snprintf(rl, sizeof rl, "%g", o->raw_limit_s);
    snprintf(tch, sizeof tch, "%d", o->touch ? 1 : 0);
    snprintf(rb, sizeof rb, "%d", o->repeat);
    snprintf(nbuf, sizeof nbuf, "%d", o->n);
    snprintf(minb, sizeof minb, "%zu", o->min);
    snprintf(maxb, sizeof maxb, "%zu", o->max);
    snprintf(tb, sizeof tb, "%g", o->time_s);
    snprintf(ib, sizeof ib, "%d", o->iters);
    char *wargs[] = {(char *)self, "bench", "comm", "--worker", (char *)backend, "--op", o->p2p ? "sendrecv" : "allreduce",
                     "--min", minb, "--max", maxb, "--time", tb, "--iters", ib, "--repeat", rb, "--touch", tch,
                     "--raw-limit", rl, "--out", (char *)outfile, NULL};
    if (!strcmp(backend, "shm")) {
        lk_launch_options lo = lk_launch_options_default();
        lo.quiet = true;
        int code = 1;
        if (lk_launch(o->n, wargs, &lo, &code)) {
            fprintf(stderr, "bench comm: %s\n", lk_last_error());
            return 1;
        }
        return code;
    }
    char *margs[48];
    int k = 0;
    margs[k++] = "mpirun";
    if (geteuid() == 0) margs[k++] = "--allow-run-as-root";
    /* Oversubscription makes OpenMPI yield when idle, which is not what we compare against. */
    if (o->n > sysconf(_SC_NPROCESSORS_ONLN)) margs[k++] = "--oversubscribe";
    margs[k++] = "-np";
    margs[k++] = nbuf;
    for (int i = 0; wargs[i]; i++) margs[k++] = wargs[i];
    margs[k] = NULL;
    pid_t pid;
    if (posix_spawnp(&pid, "mpirun", NULL, NULL, margs, environ)) {
        fprintf(stderr, "bench comm: cannot run mpirun: %s\n", strerror(errno));
        return 1;
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static int load(const char *file, result *res, int *nres, int cap) {
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    char line[256];
    while (*nres < cap && fgets(line, sizeof line, f)) {
        result r;
        if (sscanf(line, "%31[^,],%d,%zu,%lf,%lf,%lf", r.backend, &r.ranks, &r.bytes, &r.us, &r.alg, &r.bus) == 6)
            res[(*nres)++] = r;
    }
    fclose(f);
    return 1;
}

static void human(size_t b, char *buf, size_t size) {
    if (b >= (1u << 20) && b % (1u << 20) == 0) snprintf(buf, size, "%zuM", b >> 20);
    else if (b >= 1024 && b % 1024 == 0) snprintf(buf, size, "%zuK", b >> 10);
    else snprintf(buf, size, "%zu", b);
}

int lk_cmd_bench_comm(int argc, char **argv) {
    bench_opts o = {.backend = "all", .n = 2, .min = 4096, .max = 256u << 20, .time_s = 0.1, .repeat = 5};
    bool min_set = false, max_set = false;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = strcmp(a, "-h") && strcmp(a, "--help");
        if (takes && !v) {
            fprintf(stderr, "lockstep bench comm: %s needs a value\n", a);
            return 2;
        }
        if (!takes) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--backend")) o.backend = v;
        else if (!strcmp(a, "-n")) {
            o.n = atoi(v);
            if (o.n < 1 || o.n > 256) return fprintf(stderr, "lockstep bench comm: -n expects 1..256, got '%s'\n", v), 2;
        } else if (!strcmp(a, "--min") || !strcmp(a, "--max")) {
            size_t s;
            if (!parse_size(v, &s) || s < 4)
                return fprintf(stderr, "lockstep bench comm: %s expects a size like 4K, 1M, 256M; got '%s'\n", a, v), 2;
            *(!strcmp(a, "--min") ? &o.min : &o.max) = s;
            *(!strcmp(a, "--min") ? &min_set : &max_set) = true;
        } else if (!strcmp(a, "--csv")) o.csv = v;
        else if (!strcmp(a, "--time")) o.time_s = atof(v);
        else if (!strcmp(a, "--iters")) o.iters = atoi(v);
        else if (!strcmp(a, "--repeat")) {
            o.repeat = atoi(v);
            if (o.repeat < 1 || o.repeat > 1000) return fprintf(stderr, "lockstep bench comm: --repeat expects 1..1000, got '%s'\n", v), 2;
        }
        else if (!strcmp(a, "--touch")) {
            if (strcmp(v, "0") && strcmp(v, "1")) return fprintf(stderr, "lockstep bench comm: --touch expects 0 or 1, got '%s'\n", v), 2;
            o.touch = v[0] == '1';
        }
        else if (!strcmp(a, "--op")) {
            if (strcmp(v, "allreduce") && strcmp(v, "sendrecv"))
                return fprintf(stderr, "lockstep bench comm: --op expects allreduce or sendrecv, got '%s'\n", v), 2;
            o.p2p = !strcmp(v, "sendrecv");
        }
        else if (!strcmp(a, "--raw-limit")) {
            o.raw_limit_s = atof(v);
            if (!(o.raw_limit_s >= 0))
                return fprintf(stderr, "lockstep bench comm: --raw-limit expects seconds >= 0, got '%s'\n", v), 2;
        }
        else if (!strcmp(a, "--worker")) o.worker = v;
        else if (!strcmp(a, "--out")) o.out = v;
        else {
            fprintf(stderr, "lockstep bench comm: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (o.p2p) { /* a ping-pong: two ranks, 8 B to 64 MiB unless told */
        if (!min_set) o.min = 8;
        if (!max_set) o.max = 64u << 20;
        o.n = 2;
    }
    if (o.min > o.max) return fprintf(stderr, "lockstep bench comm: --min %zu exceeds --max %zu\n", o.min, o.max), 2;
    if (o.time_s <= 0) o.time_s = 0.25;
    if (o.worker) return worker(&o);

    bool want_shm = !strcmp(o.backend, "all") || !strcmp(o.backend, "shm");
    bool want_mpi = !strcmp(o.backend, "all") || !strcmp(o.backend, "mpi");
    if (!want_shm && !want_mpi)
        return fprintf(stderr, "lockstep bench comm: --backend expects shm, mpi or all; got '%s'\n", o.backend), 2;
    bool have_mpi = false;
    for (int i = 0; i < lk_comm_backend_count(); i++) have_mpi |= !strcmp(lk_comm_backend_name_at(i), "mpi");
    bool mpirun = !system("command -v mpirun >/dev/null 2>&1");
    if (want_mpi && (!have_mpi || !mpirun)) {
        fprintf(stderr, "lockstep bench comm: skipping mpi: %s\n", !have_mpi ? "the mpi backend was not built" : "mpirun not found");
        want_mpi = false;
        if (!want_shm) return 1;
    }
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) return fprintf(stderr, "lockstep bench comm: cannot find this program (/proc/self/exe)\n"), 1;
    self[sl] = 0;
    char tmp_shm[64], tmp_mpi[64];
    snprintf(tmp_shm, sizeof tmp_shm, "/tmp/lk-bench-comm-%d-shm.csv", (int)getpid());
    snprintf(tmp_mpi, sizeof tmp_mpi, "/tmp/lk-bench-comm-%d-mpi.csv", (int)getpid());
    if (o.p2p) printf("send/recv ping-pong, 2 ranks, %zu..%zu bytes\n", o.min, o.max);
    else
        printf("all_reduce f32 sum, %d ranks, %zu..%zu bytes%s\n", o.n, o.min, o.max,
               o.touch ? ", every buffer rewritten before each call" : "");
    fflush(stdout);
    int rc = 0;
    if (want_shm && run_job(&o, self, "shm", tmp_shm)) rc = 1, fprintf(stderr, "lockstep bench comm: the shm job failed\n");
    if (want_mpi && run_job(&o, self, "mpi", tmp_mpi)) rc = 1, fprintf(stderr, "lockstep bench comm: the mpi job failed\n");
    result res[256];
    int nres = 0;
    if (want_shm) load(tmp_shm, res, &nres, 256);
    if (want_mpi) load(tmp_mpi, res, &nres, 256);
    unlink(tmp_shm);
    unlink(tmp_mpi);

    const char *order_ar[] = {"shm", "shm-private", "mpi", "MPI_Allreduce"};
    const char *order_pp[] = {"shm-sendrecv", "mpi-sendrecv", "MPI_Send/Recv", ""};
    const char **order = o.p2p ? order_pp : order_ar;
    printf("\n%-8s", "size");
    for (int b = 0; b < 4; b++) {
        bool any = false;
        for (int i = 0; i < nres; i++) any |= !strcmp(res[i].backend, order[b]);
        if (any && o.p2p) printf(" | %-13s %9s %7s", order[b], "time_us", "GB/s");
        else if (any) printf(" | %-13s %9s %7s %7s", order[b], "time_us", "algbw", "busbw");
    }
    printf("\n");
    for (size_t bytes = o.min; bytes && bytes <= o.max; bytes = o.p2p ? next_size(&o, bytes) : bytes * 4) {
        char hb[32];
        human(bytes, hb, sizeof hb);
        printf("%-8s", hb);
        for (int b = 0; b < 4; b++) {
            bool any = false;
            for (int i = 0; i < nres; i++) any |= !strcmp(res[i].backend, order[b]);
            if (!any) continue;
            int k = -1;
            for (int i = 0; i < nres; i++)
                if (!strcmp(res[i].backend, order[b]) && res[i].bytes == bytes) k = i;
            if (o.p2p && k < 0) printf(" | %-13s %9s %7s", "", "-", "-");
            else if (o.p2p) printf(" | %-13s %9.2f %7.3f", "", res[k].us, res[k].alg);
            else if (k < 0) printf(" | %-13s %9s %7s %7s", "", "-", "-", "-");
            else printf(" | %-13s %9.2f %7.2f %7.2f", "", res[k].us, res[k].alg, res[k].bus);
        }
        printf("\n");
    }
    if (o.p2p) printf("(time in µs one way, half the round trip; bandwidth in GB/s = bytes / time)\n");
    else printf("(time in µs per all_reduce, bandwidth in GB/s; busbw = algbw * 2(n-1)/n)\n");
    if (o.csv) {
        FILE *f = fopen(o.csv, "w");
        if (!f) return fprintf(stderr, "lockstep bench comm: cannot write %s: %s\n", o.csv, strerror(errno)), 1;
        fprintf(f, "backend,ranks,bytes,time_us,algbw_gbps,busbw_gbps\n");
        for (int i = 0; i < nres; i++)
            fprintf(f, "%s,%d,%zu,%.3f,%.4f,%.4f\n", res[i].backend, res[i].ranks, res[i].bytes, res[i].us, res[i].alg, res[i].bus);
        fclose(f);
    }
    return rc;
}
