/* Process groups: lk_comm_split (MPI_Comm_split's colour and key) and the
 * 2-D mesh built from two splits. The groups are worked out here, the same
 * way on every rank, from one all_gather of (colour, key, node) over the
 * parent; the backend's split slot then joins them (shm: a segment per
 * group, mpi: MPI_Comm_split, nccl: a fresh NCCL communicator) and one
 * all_reduce tells every rank whether all of them made it. */
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

/* A group member: its rank in the parent and its key. */
typedef struct {
    int rank, key, node;
} member;

/* Key, then rank in the parent: MPI_Comm_split's order. Insertion sort:
 * the list is at most the world and is already in rank order. */
static void sort_members(member *m, int n) {
    for (int i = 1; i < n; i++) {
        member x = m[i];
        int j = i - 1;
        while (j >= 0 && (m[j].key > x.key || (m[j].key == x.key && m[j].rank > x.rank))) {
            m[j + 1] = m[j];
            j--;
        }
        m[j + 1] = x;
    }
}

lk_status lk_comm_split(lk_comm *c, int colour, int key, lk_comm **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_split: out is NULL");
    *out = NULL;
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_split: comm is NULL");
    if (!c->vt->split)
        return lk_error(LK_STATUS_UNSUPPORTED, "lk_comm_split: the %s backend cannot make process groups", c->vt->name);
    if (colour < 0) colour = LK_COMM_NO_GROUP;
    const int W = c->pg.world_size;
    int32_t *all = lk_malloc(sizeof(int32_t) * 3 * (size_t)W);
    member *m = lk_malloc(sizeof *m * (size_t)W);
    if (!all || !m) {
        lk_free(all);
        lk_free(m);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    int32_t mine[3] = {colour, key, c->pg.node_rank};
    lk_status st = lk_comm_all_gather(c, mine, all, 3, LK_I32);
    if (st) {
        lk_free(all);
        lk_free(m);
        return st;
    }
    int n = 0;
    if (colour >= 0)
        for (int k = 0; k < W; k++)
            if (all[3 * k] == colour) m[n++] = (member){k, all[3 * k + 1], all[3 * k + 2]};
    sort_members(m, n);
    lk_free(all);
    c->nsplit++; /* every rank, grouped or not: the shm groups' names stay equal across ranks */

    /* The group's process-group record: its ranks on this node are the
     * members on this node, in group order. */
    lk_comm *child = NULL;
    if (colour >= 0) {
        lk_pg_info pg = c->pg;
        int nodes = 0;
        pg.local_rank = pg.local_world_size = 0;
        for (int i = 0; i < n; i++) {
            bool first_of_node = true;
            for (int j = 0; j < i; j++) first_of_node = first_of_node && m[j].node != m[i].node;
            nodes += first_of_node;
            if (m[i].rank == c->pg.rank) pg.rank = i;
            if (m[i].node == c->pg.node_rank) {
                if (m[i].rank == c->pg.rank) pg.local_rank = pg.local_world_size;
                pg.local_world_size++;
            }
        }
        pg.world_size = n;
        pg.num_nodes = nodes;
        child = lk__comm_new(c->vt, &pg);
        if (child) {
            child->timeout_s = c->timeout_s;
            snprintf(child->timeout_from, sizeof child->timeout_from, "%s", c->timeout_from);
            child->check_desync = c->check_desync;
            child->shared_bytes = c->shared_bytes;
            /* Unique within the job and equal on the group's ranks: the
             * parent's id, which split of it this is, and the colour. */
            snprintf(child->job_id, sizeof child->job_id, "%.60s.g%llu.c%d", c->job_id, (unsigned long long)c->nsplit,
                     colour);
        }
    }
    lk_free(m);
    /* Every rank takes part in the backend's split (MPI_Comm_split is
     * collective over the parent), even one that is out of memory: it
     * joins as a rank without a group and fails below. */
    bool oom = colour >= 0 && !child;
    lk__comm_drain(c); /* no send or receive of the parent may be in flight during MPI_Comm_split */
    st = oom ? LK_STATUS_OUT_OF_MEMORY : c->vt->split(c, child, colour, key);
    char why[600] = "";
    if (st) snprintf(why, sizeof why, "%s", oom ? "out of memory" : lk_last_error());
    int32_t failed = st ? c->pg.rank : -1;
    lk_status ast = lk_comm_all_reduce(c, &failed, 1, LK_I32, LK_REDUCE_MAX);
    if (!st && !ast && failed < 0) {
        *out = child;
        return LK_STATUS_OK;
    }
    if (child) {
        if (!st) child->vt->destroy(child);
        lk__comm_delete(child);
    }
    if (st) return lk_error(st, "lk_comm_split: rank %d could not join group %d: %s", c->pg.rank, colour, why);
    if (ast) return ast;
    return lk_error(LK_STATUS_REMOTE, "lk_comm_split: rank %d could not join its group (its own error says why), so no "
                    "rank keeps one", failed);
}

lk_status lk_comm_mesh_2d_create(lk_comm *c, int dp_size, int pp_size, lk_comm_mesh_2d *out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_mesh_2d_create: out is NULL");
    memset(out, 0, sizeof *out);
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_mesh_2d_create: comm is NULL");
    const int W = c->pg.world_size;
    /* Every rank must pick the same shape, or the splits would group ranks
     * silently wrong: compare the sizes before splitting (min == max). */
    int32_t mm[4] = {dp_size, pp_size, -dp_size, -pp_size};
    LK_TRY(lk_comm_all_reduce(c, mm, 4, LK_I32, LK_REDUCE_MAX));
    if (mm[0] != -mm[2] || mm[1] != -mm[3])
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "lk_comm_mesh_2d_create: the ranks asked for different meshes (dp_size from %d to %d, pp_size "
                        "from %d to %d; rank %d asked for %d x %d)",
                        -mm[2], mm[0], -mm[3], mm[1], c->pg.rank, dp_size, pp_size);
    if (dp_size < 1 || pp_size < 1 || (long)dp_size * pp_size != W)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "lk_comm_mesh_2d_create: dp_size %d x pp_size %d must be the world size %d (both >= 1)", dp_size,
                        pp_size, W);
    int r = c->pg.rank;
    out->dp_size = dp_size;
    out->pp_size = pp_size;
    out->dp_rank = r % dp_size; /* rank = pp_rank * dp_size + dp_rank */
    out->pp_rank = r / dp_size;
    lk_status st = lk_comm_split(c, out->pp_rank, out->dp_rank, &out->dp);
    if (!st) st = lk_comm_split(c, out->dp_rank, out->pp_rank, &out->pp);
    if (st) lk_comm_mesh_2d_free(out);
    return st;
}

void lk_comm_mesh_2d_free(lk_comm_mesh_2d *mesh) {
    if (!mesh) return;
    lk_comm_free(mesh->dp);
    lk_comm_free(mesh->pp);
    mesh->dp = mesh->pp = NULL;
}
