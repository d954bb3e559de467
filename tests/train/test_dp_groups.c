/* The trainer under a strategy whose data-parallel group is a subgroup of
 * the world, as a pipeline or tensor-parallel strategy makes them: 4 ranks
 * as 2 groups of 2 (ranks {0, 1} and {2, 3}; lk_comm_split), each group
 * training its own replica. The test strategy (registered here through
 * lk__strategy_register_test) averages the gradients over its group only,
 * and group 1 zeroes them, so its replica never moves and its val_loss
 * stays put while group 0's falls. It checks that:
 *  - the epoch metrics are reduced over each group (val_loss equal inside
 *    a group, different between them);
 *  - EarlyStopping (patience 1), which only group 1 triggers after the
 *    second validation, stops every rank at the same epoch (a group that
 *    stopped alone would leave the others in their collectives);
 *  - a strategy whose state dict is a collective over its group (this
 *    one's all-reduces a counter there) has it gathered on every rank for
 *    each checkpoint, not on the writing rank alone (which would wait
 *    for its group forever), and rank 0 writes last.ckpt;
 *  - predict gathers the rows of rank 0's group: every sample once.
 * Run alone, this program is the launcher (devices 4): the ranks replay
 * main, fit, predict and write what they saw to files the launcher reads. */
#include <stdlib.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "strategy/strategy_impl.h"

enum { WORLD = 4, GROUP = 2, SAMPLES = 256 };

typedef struct {
    lk_comm *group;
    int colour;
} groups;

static groups *me(lk_strategy *s) { return s->self; }
static int g_state_dicts; /* state-dict gathers this rank took part in */
static int g_fail_rank = -1; /* this rank's gather fails (the second fit) */

static lk_status g_create(lk_strategy *s) {
    if (!s->comm || s->world != WORLD)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "dp_groups_test runs on %d ranks, not %d", WORLD, s->world);
    groups *g = lk_calloc(1, sizeof *g);
    if (!g) return LK_STATUS_OUT_OF_MEMORY;
    s->self = g;
    g->colour = s->rank / GROUP;
    return lk_comm_split(s->comm, g->colour, s->rank, &g->group);
}

static void g_free(lk_strategy *s) {
    groups *g = me(s);
    if (!g) return;
    lk_comm_free(g->group);
    lk_free(g);
}

static lk_comm *g_dp_comm(lk_strategy *s) { return me(s)->group; }

static lk_status g_finish_backward(lk_strategy *s) {
    if (!s->sync) return LK_STATUS_OK;
    LK_TRY(lk_comm_all_reduce(me(s)->group, s->flat_grad, (size_t)s->flat_numel, s->cfg.param_dtype, LK_REDUCE_AVG));
    if (me(s)->colour == 1) memset(s->flat_grad, 0, (size_t)s->flat_numel * lk_dtype_size(s->cfg.param_dtype));
    return LK_STATUS_OK;
}

/* A sharded strategy's gather, in shape: a collective over the group. */
static lk_status g_state_dict(lk_strategy *s, lk_layer *net, lk_named_tensors *out) {
    double one = 1;
    LK_TRY(lk_comm_all_reduce(me(s)->group, &one, 1, LK_F64, LK_REDUCE_SUM));
    if (one != GROUP) return lk_error(LK_STATUS_INTERNAL, "state dict gather: %g of %d ranks", one, GROUP);
    if (s->rank == g_fail_rank) return lk_error(LK_STATUS_IO, "dp_groups_test: the gather failed on purpose");
    g_state_dicts++;
    return lk_state_dict_get(net, out);
}

static const lk_strategy_vt groups_vt = {
    .name = "dp_groups_test",
    .summary = "test: 2 data-parallel groups of 2 ranks",
    .create = g_create,
    .free = g_free,
    .training_step = lk__strategy_local_step,
    .finish_backward = g_finish_backward,
    .state_dict = g_state_dict,
    .dp_comm = g_dp_comm,
};
static const lk_strategy_info groups_info = {"dp_groups_test", NULL, LK_PROCESS_PER_DEVICE, false, false};

static const lk_model_kv mlp_args[] = {{"input_dim", "16"}, {"hidden", "[32]"}, {"num_classes", "4"}};
static const lk_model_kv mlp_data[] = {{"num_samples", "256"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                       {"batch_size", "32"}, {"num_workers", "0"}};

/* One fit and one predict: in the launcher they start the ranks; in a rank
 * they run, and the rank writes <dir>/r<rank>.txt. With fail_rank >= 0
 * (a rank's second fit) that rank's state-dict gather fails and the rank
 * writes its status and error to <dir>/f<rank>.txt instead. */
static lk_status run(const char *dir, int fail_rank) {
    g_fail_rank = fail_rank;
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.strategy, sizeof cfg.strategy, "dp_groups_test");
    cfg.devices = WORLD;
    cfg.max_epochs = 4;
    cfg.enable_progress_bar = false;
    cfg.enable_tensorboard = false;
    cfg.enable_model_summary = false;
    cfg.num_sanity_val_steps = 0;
    cfg.seed = 3;
    snprintf(cfg.early_stopping_monitor, sizeof cfg.early_stopping_monitor, "val_loss");
    cfg.early_stopping_patience = 1;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", dir);
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    lk_status st = lk_module_create_builtin("mlp", mlp_args, 3, 3, &m);
    if (!st) st = lk_datamodule_create_builtin("synthetic", mlp_data, 5, 3, &dm);
    if (!st) st = lk_trainer_create(&cfg, NULL, NULL, &tr);
    if (!st) st = lk_trainer_fit(tr, m, dm, NULL);
    int rank = tr ? lk_trainer_rank(tr) : -1;
    double val_loss = NAN;
    int64_t epoch = tr ? lk_trainer_current_epoch(tr) : -1;
    bool have_ckpt = tr && lk_trainer_last_checkpoint(tr)[0];
    if (!st && rank >= 0 && !lk_trainer_metric(tr, "val_loss", &val_loss))
        st = lk_error(LK_STATUS_INTERNAL, "rank %d: no val_loss after the fit", rank);
    if (!st && rank >= 0) st = lk_trainer_predict(tr, m, dm, NULL);
    if (rank >= 0 && fail_rank >= 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/f%d.txt", dir, rank);
        FILE *f = fopen(path, "w");
        if (f) fprintf(f, "%d %s\n", st, st ? lk_last_error() : "-"), fclose(f);
    } else if (rank >= 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/r%d.txt", dir, rank);
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "%d %lld %.17g %d %d %s\n", st, (long long)epoch, val_loss, g_state_dicts, have_ckpt,
                    lk_trainer_log_dir(tr)[0] ? lk_trainer_log_dir(tr) : "-");
            fclose(f);
        }
    }
    if (st && fail_rank < 0) fprintf(stderr, "dp_groups: %s\n", lk_last_error());
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return st;
}

/* The row count of a .npy file's first dimension (-1: unreadable). */
static long long npy_rows(const char *path) {
    FILE *f = fopen(path, "rb");
    char head[512] = {0};
    size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
    if (f) fclose(f);
    const char *p = n > 10 ? strstr(head + 10, "'shape': (") : NULL;
    return p ? atoll(p + 10) : -1;
}

int main(void) {
    lk__strategy_register_test(&groups_info, &groups_vt);
    const char *dir = getenv("DP_GROUPS_DIR");
    if (getenv("RANK")) { /* a rank: both fits of the job */
        if (!dir || run(dir, -1)) return 1;
        (void)run(dir, 2); /* fails on every rank: f<rank>.txt says how */
        return 0;
    }
    char tmp[] = "/tmp/lk_dp_groups_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    setenv("DP_GROUPS_DIR", tmp, 1);
    setenv("LK_ALLOW_OVERSUBSCRIBE", "1", 1); /* 4 ranks on 2 cores */
    /* A rank left waiting in a collective is an error within this bound,
     * not a hang until the test's timeout. */
    setenv("LK_COMM_TIMEOUT", "30", 1);
    CHECK_OK(run(tmp, -1));
    int st[WORLD], sd[WORLD], ck[WORLD];
    long long ep[WORLD];
    double vl[WORLD];
    char logdir[WORLD][512];
    for (int r = 0; r < WORLD; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s/r%d.txt", tmp, r);
        FILE *f = fopen(path, "r");
        st[r] = -1;
        CHECK_MSG(f && fscanf(f, "%d %lld %lg %d %d %511s", &st[r], &ep[r], &vl[r], &sd[r], &ck[r], logdir[r]) == 6,
                  "rank %d wrote no result (%s)", r, path);
        if (f) fclose(f);
    }
    if (!lk_t_failed_checks) {
        for (int r = 0; r < WORLD; r++) {
            CHECK_MSG(st[r] == 0, "rank %d: status %d", r, st[r]);
            /* every rank stopped after the second validation: 2 epochs ran */
            CHECK_MSG(ep[r] == ep[0] && ep[0] == 2, "rank %d stopped at epoch %lld, rank 0 at %lld (want 2 on all)", r,
                      ep[r], ep[0]);
            CHECK_MSG(sd[r] == sd[0] && sd[0] >= 2, "rank %d took part in %d state-dict gathers, rank 0 in %d (want >= 2)",
                      r, sd[r], sd[0]);
        }
        CHECK_MSG(vl[0] == vl[1] && vl[2] == vl[3], "val_loss not one value per group: %.17g %.17g | %.17g %.17g", vl[0],
                  vl[1], vl[2], vl[3]);
        CHECK_MSG(vl[0] < vl[2], "group 0 trained (val_loss %.9g) and group 1 did not (%.9g): group 0's must be lower",
                  vl[0], vl[2]);
        CHECK_MSG(ck[0], "rank 0 wrote no last.ckpt");
        char npy[700];
        snprintf(npy, sizeof npy, "%s/predictions.npy", logdir[0]);
        long long rows = npy_rows(npy);
        lk_datamodule *dm = NULL; /* each sample of the predict set once */
        CHECK_OK(lk_datamodule_create_builtin("synthetic", mlp_data, 5, 3, &dm));
        if (dm) CHECK_OK(dm->vt->setup(dm, "predict"));
        lk_dataset *ds = dm ? dm->vt->dataset(dm, "predict") : NULL;
        if (dm && !ds) ds = dm->vt->dataset(dm, "test");
        long long want = ds ? (long long)lk_dataset_len(ds) : -2;
        lk_datamodule_free(dm);
        CHECK_MSG(rows == want && rows > 0, "predictions: %lld rows in %s, the predict set has %lld", rows, npy, want);
        /* A gather that fails on rank 2 fails the checkpoint on every rank, none waiting. */
        for (int r = 0; r < WORLD; r++) {
            char path[600], line[2048] = "";
            snprintf(path, sizeof path, "%s/f%d.txt", tmp, r);
            FILE *f = fopen(path, "r");
            if (f && !fgets(line, sizeof line, f)) line[0] = 0;
            if (f) fclose(f);
            const char *want = r == 2 ? "dp_groups_test: the gather failed on purpose"
                                      : "another rank failed to gather the state dict for a checkpoint, or rank 0 to write it";
            CHECK_MSG(atoi(line) != 0 && strstr(line, want), "rank %d after rank 2's failed gather: '%s' (want '%s')", r,
                      line, want);
        }
        printf("ok   4 ranks in 2 dp groups: stopped together at epoch %lld, val_loss %.6g | %.6g, %d state-dict gathers "
               "on every rank, %lld predicted rows\n",
               ep[0], vl[0], vl[2], sd[0], rows);
    }
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", tmp);
    if (!lk_t_failed_checks && system(rm) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    printf("%d failed\n", lk_t_failed_checks);
    return lk_t_failed_checks ? 1 : 0;
}
