/* A rank's view of the job across namespace nodes, for test_multinode.sh:
 * makes a communicator (argv[1]: the backend, default mpi), prints one line "probe rank R/W host H local
 * L/LW node N/NN shm S" (S: the number of entries in this node's /dev/shm,
 * to show each node has its own) and checks a 1 MiB all-reduce of
 * rank-dependent values against the sum computed locally. Exit 0 on
 * success, 1 with lk_last_error() on stderr otherwise. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lockstep.h"

int main(int argc, char **argv) {
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = argc > 1 ? argv[1] : "mpi";
    cfg.timeout_s = 20;
    lk_comm *c = NULL;
    if (lk_comm_create(&cfg, &c)) {
        fprintf(stderr, "probe: %s\n", lk_last_error());
        return 1;
    }
    const lk_pg_info *pg = lk_comm_pg(c);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    int shm = 0;
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d));) shm += e->d_name[0] != '.';
    if (d) closedir(d);
    enum { N = 1 << 18 };
    static float v[N];
    int W = lk_comm_world_size(c), r = lk_comm_rank(c);
    for (int i = 0; i < N; i++) v[i] = (float)(r * 3 + (i & 7));
    int rc = 0;
    if (lk_comm_all_reduce(c, v, N, LK_F32, LK_REDUCE_SUM)) {
        fprintf(stderr, "probe: %s\n", lk_last_error());
        rc = 1;
    }
    for (int i = 0; !rc && i < N; i++) {
        float want = (float)(3 * W * (W - 1) / 2 + W * (i & 7));
        if (v[i] != want) {
            fprintf(stderr, "probe: rank %d element %d is %g, expected %g\n", r, i, v[i], want);
            rc = 1;
        }
    }
    printf("probe %s rank %d/%d host %s local %d/%d node %d/%d shm %d %s\n", lk_comm_backend(c), r, W, host, pg->local_rank,
           pg->local_world_size, pg->node_rank, pg->num_nodes, shm, rc ? "FAIL" : "ok");
    fflush(stdout);
    lk_comm_free(c);
    return rc;
}
