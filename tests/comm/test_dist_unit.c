/* dist, in one process: bf16/f16 conversions, the reduction kernels against
 * a double reference, process-group parsing from every launcher's variables
 * (and its errors), the world-size-1 communicator, argument errors and the
 * MASTER_ADDR checks. */
#include "coll_check.h"

static void f16_roundtrip_and_rounding(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t x = (uint16_t)h;
        if ((x & 0x7c00) == 0x7c00 && (x & 0x3ff)) continue; /* NaN payloads are not preserved bit for bit */
        CHECK_MSG(lk_f32_to_f16_bits(lk_f16_bits_to_f32(x)) == x, "f16 %04x", x);
        CHECK_MSG(lk_f32_to_bf16_bits(lk_bf16_bits_to_f32(x)) == x || ((x & 0x7f80) == 0x7f80 && (x & 0x7f)), "bf16 %04x", x);
    }
    /* halfway cases round to even */
    CHECK(lk_f32_to_f16_bits(1.0f + 0x1p-11f) == 0x3c00);
    CHECK(lk_f32_to_f16_bits(1.0f + 3 * 0x1p-11f) == 0x3c02);
    CHECK(lk_f32_to_bf16_bits(1.0f + 0x1p-8f) == 0x3f80);
    CHECK(lk_f32_to_bf16_bits(1.0f + 3 * 0x1p-8f) == 0x3f82);
    CHECK(lk_f32_to_f16_bits(65520.0f) == 0x7c00);
    CHECK(lk_f32_to_f16_bits(65519.0f) == 0x7bff);
    CHECK(lk_f32_to_f16_bits(0x1p-25f) == 0);         /* exactly half of the smallest subnormal: even */
    CHECK(lk_f32_to_f16_bits(0x1.8p-25f) == 0x0001);
    CHECK(lk_f32_to_f16_bits(-0.0f) == 0x8000);
    CHECK(lk_f16_bits_to_f32(0x0001) == 0x1p-24f);
    /* against a double-precision reference on random values */
    for (int i = 0; i < 100000; i++) {
        double u = (double)(du_mix((uint64_t)i) >> 11) * 0x1p-53 * 200.0 - 100.0;
        float f = (float)u;
        double h = lk_f16_bits_to_f32(lk_f32_to_f16_bits(f)), b = lk_bf16_bits_to_f32(lk_f32_to_bf16_bits(f));
        CHECK_MSG(fabs(h - f) <= fabs(f) * 0x1p-11 + 0x1p-25, "f16(%g) = %g", f, h);
        CHECK_MSG(fabs(b - f) <= fabs(f) * 0x1p-8, "bf16(%g) = %g", f, b);
    }
}

static void reduce_kernels_against_reference(void) {
    static const size_t ns[] = {0, 1, 7, 8, 9, 511, 512, 513, 1023, 5000};
    for (int d = 0; d < CC_NDT; d++) {
        lk_dtype dt = cc_dtypes[d];
        size_t esz = lk_dtype_size(dt);
        for (int W = 1; W <= 5; W++)
            for (int op = 0; op < LK_REDUCE_COUNT; op++)
                for (size_t s = 0; s < sizeof ns / sizeof ns[0]; s++) {
                    size_t n = ns[s];
                    void *in[5];
                    const void *src[5];
                    for (int k = 0; k < W; k++) {
                        in[k] = lk_malloc(n * esz + 8);
                        du_fill(in[k], dt, 42, k, n);
                        src[k] = in[k];
                    }
                    void *out = lk_malloc(n * esz + 8);
                    lk__reduce(out, src, W, n, dt, (lk_reduce_op)op, op == LK_REDUCE_AVG ? W : 1);
                    for (size_t i = 0; i < n; i++) {
                        double want = du_ref_reduce(dt, (lk_reduce_op)op, 42, W, i), got = du_load(out, dt, i);
                        if (!(fabs(got - want) <= du_tol(dt, want, W))) {
                            CHECK_MSG(0, "%s W=%d op=%d n=%zu i=%zu: %.17g vs %.17g", lk_dtype_name(dt), W, op, n, i, got, want);
                            break;
                        }
                    }
                    if (dt == LK_F32 && W == 2 && op == LK_REDUCE_AVG) /* the two-rank fast path: (a + b) / 2 to the bit */
                        for (size_t i = 0; i < n; i++) {
                            float want = (((const float *)in[0])[i] + ((const float *)in[1])[i]) / 2.0f;
                            CHECK(memcmp(&want, (float *)out + i, 4) == 0);
                        }
                    /* in place on input 0 gives the same bits */
                    lk__reduce(in[0], src, W, n, dt, (lk_reduce_op)op, op == LK_REDUCE_AVG ? W : 1);
                    CHECK(n == 0 || !memcmp(in[0], out, n * esz));
                    for (int k = 0; k < W; k++) lk_free(in[k]);
                    lk_free(out);
                }
    }
}

static const char *pg_vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                                "MASTER_ADDR", "MASTER_PORT", "LK_JOB_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK",
                                "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "PMI_ID",
                                "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                "SLURM_NODEID", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID",
                                "TORCHELASTIC_RUN_ID"};
static void clear_env(void) {
    for (size_t i = 0; i < sizeof pg_vars / sizeof pg_vars[0]; i++) unsetenv(pg_vars[i]);
}

static void process_group_from_env(void) {
    lk_pg_info pg;
    clear_env();
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(pg.world_size == 1 && pg.rank == 0 && !strcmp(pg.source, "none") && pg.job_id[0] == 0);

    setenv("RANK", "3", 1), setenv("WORLD_SIZE", "8", 1), setenv("LOCAL_RANK", "1", 1), setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("GROUP_RANK", "1", 1), setenv("MASTER_ADDR", "10.0.0.1", 1), setenv("MASTER_PORT", "29500", 1);
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(pg.rank == 3 && pg.world_size == 8 && pg.local_rank == 1 && pg.local_world_size == 2 && pg.node_rank == 1 &&
          pg.num_nodes == 4 && pg.master_port == 29500 && !strcmp(pg.master_addr, "10.0.0.1") && !strcmp(pg.source, "torchrun"));
    CHECK(pg.job_id[0] != 0); /* derived from MASTER_ADDR:MASTER_PORT */
    char a[96];
    snprintf(a, sizeof a, "%s", pg.job_id);
    setenv("RANK", "4", 1);
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(!strcmp(a, pg.job_id)); /* the same on every rank */
    setenv("LK_JOB_ID", "myjob", 1);
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(!strcmp(pg.job_id, "myjob"));

    setenv("RANK", "8", 1);
    CHECK_ERR(lk_pg_info_from_env(&pg), LK_STATUS_INVALID_ARGUMENT, "rank 8 is out of range for world size 8");
    setenv("RANK", "two", 1);
    CHECK_ERR(lk_pg_info_from_env(&pg), LK_STATUS_INVALID_ARGUMENT, "RANK='two' is not an integer");
    setenv("RANK", "-1", 1);
    CHECK_ERR(lk_pg_info_from_env(&pg), LK_STATUS_INVALID_ARGUMENT, "RANK=-1 is out of range");
    setenv("RANK", "1", 1), setenv("LOCAL_RANK", "2", 1);
    CHECK_ERR(lk_pg_info_from_env(&pg), LK_STATUS_INVALID_ARGUMENT, "local rank 2 is out of range for local world size 2");
    unsetenv("WORLD_SIZE");
    CHECK_ERR(lk_pg_info_from_env(&pg), LK_STATUS_INVALID_ARGUMENT, "WORLD_SIZE is not");
    setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "1", 1), setenv("MASTER_PORT", "70000", 1);
    CHECK_ERR(lk_pg_info_from_env(&pg), LK_STATUS_INVALID_ARGUMENT, "MASTER_PORT=70000");

    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "5", 1), setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
    setenv("OMPI_MCA_ess_base_jobid", "1234", 1);
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(pg.rank == 5 && pg.world_size == 6 && pg.local_rank == 2 && pg.local_world_size == 3 && pg.node_rank == 1 &&
          pg.num_nodes == 2 && !strcmp(pg.source, "openmpi") && strstr(pg.job_id, "1234"));

    clear_env();
    setenv("PMI_RANK", "1", 1), setenv("PMI_SIZE", "2", 1);
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(pg.rank == 1 && pg.world_size == 2 && pg.local_rank == 1 && pg.local_world_size == 2 && !strcmp(pg.source, "pmi"));

    clear_env();
    setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "2", 1), setenv("SLURM_NNODES", "4", 1), setenv("SLURM_NTASKS_PER_NODE", "2(x4)", 1);
    setenv("SLURM_JOB_ID", "77", 1);
    CHECK_OK(lk_pg_info_from_env(&pg));
    CHECK(pg.rank == 5 && pg.world_size == 8 && pg.local_rank == 1 && pg.local_world_size == 2 && pg.node_rank == 2 &&
          pg.num_nodes == 4 && !strcmp(pg.source, "slurm") && strstr(pg.job_id, "77"));
    char desc[256];
    lk_pg_info_format(&pg, desc, sizeof desc);
    CHECK(strstr(desc, "rank 5/8") != NULL);
    clear_env();
}

static void self_communicator(void) {
    clear_env();
    lk_comm_config cfg = lk_comm_config_default();
    CHECK(!strcmp(cfg.backend, "auto") && cfg.timeout_s > 0);
    lk_comm *c = NULL;
    CHECK_OK(lk_comm_create(&cfg, &c));
    if (!c) return;
    CHECK(!strcmp(lk_comm_backend(c), "self") && lk_comm_world_size(c) == 1 && lk_comm_rank(c) == 0);
    CHECK(cc_check_all(c, 5, false, NULL, NULL) == 0);
    float v[3] = {1, 2, 3};
    lk_work *w = NULL;
    CHECK_OK(lk_comm_all_reduce_async(c, v, 3, LK_F32, LK_REDUCE_AVG, &w));
    bool done = false;
    CHECK_OK(lk_work_test(w, &done));
    CHECK(done);
    CHECK_OK(lk_work_wait(w));
    lk_work_free(w);
    CHECK(v[0] == 1 && v[2] == 3);
    /* argument errors */
    CHECK_ERR(lk_comm_broadcast(c, v, 3, LK_F32, 1), LK_STATUS_INVALID_ARGUMENT, "root 1 is out of range for world size 1");
    CHECK_ERR(lk_comm_all_reduce(c, v, 3, (lk_dtype)99, LK_REDUCE_SUM), LK_STATUS_INVALID_ARGUMENT, "unsupported dtype");
    CHECK_ERR(lk_comm_all_reduce(c, v, 3, LK_F32, (lk_reduce_op)9), LK_STATUS_INVALID_ARGUMENT, "unknown reduce op 9");
    CHECK_ERR(lk_comm_all_reduce(c, NULL, 3, LK_F32, LK_REDUCE_SUM), LK_STATUS_INVALID_ARGUMENT, "buffer is NULL");
    CHECK_ERR(lk_comm_all_reduce_async(c, v, 3, LK_F32, LK_REDUCE_SUM, NULL), LK_STATUS_INVALID_ARGUMENT, "work is NULL");
    void *p = NULL;
    CHECK_OK(lk_comm_alloc_shared(c, 1000, &p));
    CHECK(p && ((uintptr_t)p & 63) == 0);
    lk_comm_free_shared(c, p);
    /* abort: later calls fail fast */
    CHECK(lk_comm_abort(c, "test abort") == LK_STATUS_ABORTED);
    CHECK_ERR(lk_comm_barrier(c), LK_STATUS_ABORTED, "test abort");
    CHECK_ERR(lk_comm_error(c), LK_STATUS_ABORTED, "test abort");
    lk_comm_free(c);
    lk_comm_free(NULL);
    lk_work_free(NULL);
}

static void config_errors(void) {
    clear_env();
    lk_comm_config cfg = lk_comm_config_default();
    lk_comm *c = (lk_comm *)1;
    cfg.backend = "nccl2";
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "unknown backend 'nccl2'");
    CHECK(c == NULL);
    lk_pg_info pg = du_pg(0, 2);
    cfg = lk_comm_config_default();
    cfg.pg = &pg;
    cfg.backend = "self";
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "needs world size 1");
    pg.rank = 2;
    cfg.backend = "shm";
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "rank 2 is out of range for world size 2");
    pg.rank = 0;
    pg.job_id[0] = 0;
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "no job id");
    snprintf(pg.job_id, sizeof pg.job_id, "unit-%d", (int)getpid());
    snprintf(pg.master_addr, sizeof pg.master_addr, "no-such-host.invalid");
    double t0 = lk_time_now();
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "MASTER_ADDR='no-such-host.invalid' does not resolve");
    snprintf(pg.master_addr, sizeof pg.master_addr, "192.0.2.1"); /* TEST-NET-1: never this host */
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "is not an address of this host");
    CHECK(lk_time_now() - t0 < 5.0);
    pg.local_world_size = 1;
    pg.num_nodes = 2;
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "spans 2 nodes");
    cfg = lk_comm_config_default();
    cfg.timeout_s = -1;
    CHECK_ERR(lk_comm_create(&cfg, &c), LK_STATUS_INVALID_ARGUMENT, "timeout_s");
    int n = lk_comm_backend_count();
    CHECK(n >= 2 && !strcmp(lk_comm_backend_name_at(0), "shm"));
    CHECK(!strcmp(lk_reduce_op_name(LK_REDUCE_AVG), "avg"));
    char name[256];
    lk_comm_shm_segment_name("a/b c", name, sizeof name);
    CHECK(!strcmp(name, "/lockstep-a_b_c"));
}

LK_TEST_MAIN(LK_TEST_CASE(f16_roundtrip_and_rounding), LK_TEST_CASE(reduce_kernels_against_reference),
             LK_TEST_CASE(process_group_from_env), LK_TEST_CASE(self_communicator), LK_TEST_CASE(config_errors))
