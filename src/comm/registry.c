/* The communicator backends' registry: the built-in list (shm, mpi, self,
 * nccl as built), a test's stand-in, and lk_comm_create, which picks the
 * backend (auto: self for one rank, shm on one node, hier across nodes with
 * several ranks per node, mpi with one) and
 * starts it. The one file naming the backends; they use comm.c. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "comm/comm_impl.h"

static const lk__comm_vtable *const backends[] = {
    &lk__comm_shm,
#ifdef LK_HAVE_MPI
    &lk__comm_mpi,
    &lk__comm_hier, /* by name (LK_COMM_BACKEND=hier); see lk_comm_create for auto */
#endif
    &lk__comm_self,
#ifdef LK_HAVE_NCCL
    &lk__comm_nccl, /* by name only: "auto" never picks it (its buffers must be GPU memory) */
#endif
};
#define NBACKENDS (int)(sizeof backends / sizeof backends[0])

int lk_comm_backend_count(void) { return NBACKENDS; }
const char *lk_comm_backend_name_at(int i) { return i >= 0 && i < NBACKENDS ? backends[i]->name : NULL; }

/* A test's stand-in backend (lk__comm_register_test_backend): by name only. */
static const lk__comm_vtable *test_backend;

void lk__comm_register_test_backend(const lk__comm_vtable *vt) { test_backend = vt; }

static const lk__comm_vtable *find_backend(const char *name) {
    for (int i = 0; i < NBACKENDS; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    if (test_backend && !strcmp(test_backend->name, name)) return test_backend;
    return NULL;
}

/* The shm heap's default per rank: this rank's share of /dev/shm, at least
 * 1 GiB. The heap is virtual until an allocation reserves its pages
 * (posix_fallocate, so a full /dev/shm is a clear error, not a SIGBUS), so a
 * large default costs nothing and lets a model's flat buffers fit without a
 * setting (GPT-2 124M's parameters, gradients and Adam state on 2 ranks do
 * not fit 1 GiB); a small /dev/shm (a container's 64 MB) keeps 1 GiB, which
 * fails at the allocation that does not fit, naming /dev/shm, as before. */
static size_t default_shared_bytes(const lk_pg_info *pg) {
    size_t floor = (size_t)1 << 30, share = 0;
    struct statvfs fs;
    if (!statvfs("/dev/shm", &fs)) {
        int local = pg->local_world_size > 0 ? pg->local_world_size : 1;
        share = (size_t)((double)fs.f_blocks * (double)fs.f_frsize / local) & ~(((size_t)1 << 20) - 1);
    }
    return share > floor ? share : floor;
}

lk_status lk_comm_create(const lk_comm_config *cfg_in, lk_comm **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_create: out is NULL");
    *out = NULL;
    lk_comm_config cfg = lk_comm_config_default();
    if (cfg_in) {
        if (cfg_in->struct_size < offsetof(lk_comm_config, backend) + sizeof(const char *))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_create: config.struct_size %zu is too small; use lk_comm_config_default()",
                            cfg_in->struct_size);
        size_t n = cfg_in->struct_size < sizeof cfg ? cfg_in->struct_size : sizeof cfg;
        memcpy(&cfg, cfg_in, n);
    }
    if (!(cfg.timeout_s > 0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_create: timeout_s %g must be > 0", cfg.timeout_s);
    lk_pg_info pg;
    if (cfg.pg) pg = *cfg.pg;
    else LK_TRY(lk_pg_info_from_env(&pg));
    if (pg.world_size < 1 || pg.rank < 0 || pg.rank >= pg.world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_create: rank %d is out of range for world size %d (expected 0..%d)",
                        pg.rank, pg.world_size, pg.world_size - 1);

    const char *name = cfg.backend ? cfg.backend : "auto";
    const lk__comm_vtable *vt = NULL;
    if (!strcmp(name, "auto")) {
        const char *forced = lk_env_get("LK_COMM_BACKEND");
        if (forced && *forced && strcmp(forced, "auto")) name = forced;
    }
    if (!strcmp(name, "auto")) {
        if (pg.world_size == 1) vt = &lk__comm_self;
        else if (pg.local_world_size == pg.world_size) vt = &lk__comm_shm;
        else {
#ifdef LK_HAVE_MPI
            /* Several ranks per node: the hierarchical all-reduce sends one
             * buffer per node over the network instead of one per rank. */
            vt = pg.local_world_size > 1 ? &lk__comm_hier : &lk__comm_mpi;
#else
            return lk_error(LK_STATUS_UNSUPPORTED,
                            "lk_comm_create: the job spans %d nodes (world %d, %d per node) but the mpi backend was not built "
                            "(install libopenmpi-dev and reconfigure)",
                            pg.num_nodes, pg.world_size, pg.local_world_size);
#endif
        }
    } else {
        vt = find_backend(name);
        if (!vt) {
            char list[128] = "";
            for (int i = 0; i < NBACKENDS; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, backends[i]->name, sizeof list - strlen(list) - 1);
            }
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_create: unknown backend '%s' (built: %s, or auto)", name, list);
        }
        if (vt == &lk__comm_self && pg.world_size != 1)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_create: backend 'self' needs world size 1, got %d", pg.world_size);
    }

    /* Errors and logs of a multi-rank job name their rank, unless the caller chose already. */
    if (pg.world_size > 1 && lk_log_rank() < 0) lk_log_set_rank(pg.rank, pg.world_size);
    lk_comm *c = lk__comm_new(vt, &pg);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    c->timeout_s = cfg.timeout_s;
    double env_s;
    if (cfg.timeout_from && *cfg.timeout_from)
        snprintf(c->timeout_from, sizeof c->timeout_from, "%s", cfg.timeout_from);
    else if (lk_env_get_number("LK_COMM_TIMEOUT", 0.1, 1e6, &env_s) && env_s == cfg.timeout_s)
        snprintf(c->timeout_from, sizeof c->timeout_from, "LK_COMM_TIMEOUT");
    else if (!lk_env_is_set("LK_COMM_TIMEOUT") && cfg.timeout_s == 120.0)
        snprintf(c->timeout_from, sizeof c->timeout_from, "default");
    else
        snprintf(c->timeout_from, sizeof c->timeout_from, "lk_comm_config.timeout_s");
    c->check_desync = cfg.check_desync;
    const char *job = cfg.job_id ? cfg.job_id : pg.job_id;
    snprintf(c->job_id, sizeof c->job_id, "%s", job ? job : "");
    c->shared_bytes = cfg.shared_bytes ? cfg.shared_bytes
                                       : (size_t)lk_env_get_long("LK_COMM_SHM_BYTES", (long)default_shared_bytes(&pg));
    c->make_host = lk_comm_create;
    lk_status st = vt->init(c, &cfg);
    if (st) {
        lk__comm_delete(c);
        return st;
    }
    *out = c;
    return LK_STATUS_OK;
}
