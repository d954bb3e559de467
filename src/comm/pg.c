/* The process group as the environment describes it: torchrun, OpenMPI,
 * MPICH/PMI and SLURM variables, validated (numbers, ranges, consistency)
 * so a bad launch fails here with the variable and value named, before any
 * rendezvous is attempted. Also derives the job id that names the shm
 * segment, identical on every rank of one job and different across jobs. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Parses variable `name` as an int in [lo, hi]; absent leaves *out alone. */
static lk_status env_int(const char *name, int lo, int hi, int *out, bool *present) {
    const char *v = env(name);
    if (present) *present = v != NULL;
    if (!v) return LK_STATUS_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    while (*end && isspace((unsigned char)*end)) end++;
    if (end == v || *end || errno) return lk_error(LK_STATUS_INVALID_ARGUMENT, "environment variable %s='%s' is not an integer", name, v);
    if (x < lo || x > hi)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "environment variable %s=%ld is out of range (expected %d..%d)", name, x,
                        lo, hi);
    *out = (int)x;
    return LK_STATUS_OK;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

#define MAXW (1 << 20)

lk_status lk_pg_info_from_env(lk_pg_info *pg) {
    memset(pg, 0, sizeof *pg);
    pg->world_size = pg->local_world_size = pg->num_nodes = 1;
    pg->source = "none";
    bool has_rank = false, has_world = false, has_lrank = false, has_lworld = false, has_node = false, p;

    if (env("RANK") || env("WORLD_SIZE")) {
        pg->source = "torchrun";
        LK_TRY(env_int("WORLD_SIZE", 1, MAXW, &pg->world_size, &has_world));
        LK_TRY(env_int("RANK", 0, MAXW, &pg->rank, &has_rank));
        if (!has_world) return lk_error(LK_STATUS_INVALID_ARGUMENT, "RANK=%d is set but WORLD_SIZE is not (torchrun-style launch needs both)", pg->rank);
        if (!has_rank) return lk_error(LK_STATUS_INVALID_ARGUMENT, "WORLD_SIZE=%d is set but RANK is not (torchrun-style launch needs both)", pg->world_size);
        LK_TRY(env_int("LOCAL_RANK", 0, MAXW, &pg->local_rank, &has_lrank));
        LK_TRY(env_int("LOCAL_WORLD_SIZE", 1, MAXW, &pg->local_world_size, &has_lworld));
        LK_TRY(env_int("GROUP_RANK", 0, MAXW, &pg->node_rank, &has_node));
        if (!has_node) LK_TRY(env_int("NODE_RANK", 0, MAXW, &pg->node_rank, &has_node));
    } else if (env("OMPI_COMM_WORLD_SIZE")) {
        pg->source = "openmpi";
        LK_TRY(env_int("OMPI_COMM_WORLD_SIZE", 1, MAXW, &pg->world_size, &has_world));
        LK_TRY(env_int("OMPI_COMM_WORLD_RANK", 0, MAXW, &pg->rank, &has_rank));
        LK_TRY(env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0, MAXW, &pg->local_rank, &has_lrank));
        LK_TRY(env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, MAXW, &pg->local_world_size, &has_lworld));
        LK_TRY(env_int("OMPI_COMM_WORLD_NODE_RANK", 0, MAXW, &pg->node_rank, &has_node));
        has_node = false; /* OpenMPI's NODE_RANK is the rank within the node; derive the node below */
    } else if (env("PMI_SIZE") || env("PMI_RANK")) {
        pg->source = "pmi";
        LK_TRY(env_int("PMI_SIZE", 1, MAXW, &pg->world_size, &has_world));
        LK_TRY(env_int("PMI_RANK", 0, MAXW, &pg->rank, &has_rank));
        LK_TRY(env_int("MPI_LOCALRANKID", 0, MAXW, &pg->local_rank, &has_lrank));
        LK_TRY(env_int("MPI_LOCALNRANKS", 1, MAXW, &pg->local_world_size, &has_lworld));
    } else if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
        pg->source = "slurm";
        LK_TRY(env_int("SLURM_NTASKS", 1, MAXW, &pg->world_size, &has_world));
        LK_TRY(env_int("SLURM_PROCID", 0, MAXW, &pg->rank, &has_rank));
        LK_TRY(env_int("SLURM_LOCALID", 0, MAXW, &pg->local_rank, &has_lrank));
        LK_TRY(env_int("SLURM_NODEID", 0, MAXW, &pg->node_rank, &has_node));
        LK_TRY(env_int("SLURM_NNODES", 1, MAXW, &pg->num_nodes, &p));
        const char *tpn = env("SLURM_NTASKS_PER_NODE"); /* "4" or "4(x2)": the first count is ours on homogeneous jobs */
        if (tpn) {
            int v = atoi(tpn);
            if (v > 0) {
                pg->local_world_size = v;
                has_lworld = true;
            }
        }
    }

    /* Missing node-local variables: assume the whole world is on this node. */
    if (!has_lworld) pg->local_world_size = pg->world_size;
    if (!has_lrank) pg->local_rank = pg->local_world_size > 0 ? pg->rank % pg->local_world_size : 0;
    (void)has_rank;
    (void)has_world;

    if (pg->rank >= pg->world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "rank %d is out of range for world size %d (%s variables; expected 0..%d)",
                        pg->rank, pg->world_size, pg->source, pg->world_size - 1);
    if (pg->local_world_size > pg->world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "local world size %d exceeds world size %d (%s variables)",
                        pg->local_world_size, pg->world_size, pg->source);
    if (pg->local_rank >= pg->local_world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "local rank %d is out of range for local world size %d (%s variables)",
                        pg->local_rank, pg->local_world_size, pg->source);
    if (pg->num_nodes <= 1) pg->num_nodes = (pg->world_size + pg->local_world_size - 1) / pg->local_world_size;
    if (!has_node) pg->node_rank = pg->rank / pg->local_world_size;
    if (pg->node_rank >= pg->num_nodes)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "node rank %d is out of range for %d nodes (%s variables)", pg->node_rank,
                        pg->num_nodes, pg->source);

    const char *addr = env("MASTER_ADDR");
    if (addr) snprintf(pg->master_addr, sizeof pg->master_addr, "%s", addr);
    LK_TRY(env_int("MASTER_PORT", 1, 65535, &pg->master_port, NULL));

    /* Job id: the launcher's, else the launching system's, else one derived
     * from the rendezvous address (every torchrun rank sees the same). */
    const char *job = env("LK_JOB_ID");
    char tmp[160];
    if (job) snprintf(pg->job_id, sizeof pg->job_id, "%s", job);
    else if (!strcmp(pg->source, "openmpi") && (env("OMPI_MCA_ess_base_jobid") || env("PMIX_NAMESPACE")))
        snprintf(pg->job_id, sizeof pg->job_id, "ompi-%s", env("PMIX_NAMESPACE") ? env("PMIX_NAMESPACE") : env("OMPI_MCA_ess_base_jobid"));
    else if (!strcmp(pg->source, "slurm") && env("SLURM_JOB_ID"))
        snprintf(pg->job_id, sizeof pg->job_id, "slurm-%s.%s", env("SLURM_JOB_ID"), env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "0");
    else if (!strcmp(pg->source, "pmi") && env("PMI_ID")) snprintf(pg->job_id, sizeof pg->job_id, "pmi-%s", env("PMI_ID"));
    else if (pg->master_port) {
        snprintf(tmp, sizeof tmp, "%s:%d:%s", pg->master_addr, pg->master_port,
                 env("TORCHELASTIC_RUN_ID") ? env("TORCHELASTIC_RUN_ID") : "");
        snprintf(pg->job_id, sizeof pg->job_id, "p%d-%016llx", pg->master_port, (unsigned long long)fnv1a(tmp));
    }
    return LK_STATUS_OK;
}

void lk_pg_info_format(const lk_pg_info *pg, char *buf, size_t size) {
    snprintf(buf, size, "rank %d/%d, local rank %d/%d, node %d/%d (%s)%s%s%s", pg->rank, pg->world_size, pg->local_rank,
             pg->local_world_size, pg->node_rank, pg->num_nodes, pg->source, pg->job_id[0] ? ", job " : "", pg->job_id,
             "");
}
