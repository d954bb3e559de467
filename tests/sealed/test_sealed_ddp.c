/* ddp over 2 ranks, each on its own sealed device (sealed:<local rank>),
 * against ddp over 2 CPU ranks: the same bits. The gradient buckets live
 * on the device; the shm communicator reduces a host staging copy of them
 * (src/strategy/ddp.c), and parameters and batch norm buffers are
 * broadcast through host copies. Run alone, this program is the launcher:
 * its first fit starts it again as 2 ranks, which run every fit (mlp and
 * cnn, cpu and sealed) one after the other; rank 0 writes the trained
 * parameters and the last validation's val_loss and val_acc (all-reduced
 * over the ranks; on the devices kept there per batch, one read per loop)
 * to files the launcher compares. "cnn_sbn" is the cnn with
 * trainer.sync_batchnorm: SyncBatchNorm's statistics passes run on the
 * device and their per-channel sums cross through host copies;
 * "mlp_bf16c" compresses the f32 gradients to bf16 (ddp_comm_hook
 * bf16_compress) and "mlp_bf16t" trains in bf16-true, its bf16 gradients
 * averaged in f32: both convert the host stage of the device's buckets;
 * "mlp_one" puts both ranks on sealed:0 (one device visible,
 * LK_ALLOW_OVERSUBSCRIBE), as two ranks sharing one GPU over shm.
 * A "_dev" model is its base model on the sealed devices over the test's
 * device-reading communicator (tests/sealed_comm.h, nccl's shape): ddp
 * hands it the device buckets and parameters as they are (no host stage),
 * and converts the buckets on the device when they travel in another
 * dtype (mlp_bf16c_dev: bf16 on the wire; mlp_bf16t_dev: f32); it must give the bits of the base model's CPU run, and each rank
 * reports what the communicator got from device memory. */
#include <stdlib.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "sealed_comm.h"

static const lk_model_kv mlp_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}, {"dropout", "0.25"}};
static const lk_model_kv cnn_args[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "4"}};
static const lk_model_kv mlp_data[] = {{"num_samples", "640"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                       {"batch_size", "32"}, {"num_workers", "0"}};
static const lk_model_kv cnn_data[] = {{"num_samples", "320"}, {"input_shape", "[1, 8, 8]"}, {"num_classes", "4"},
                                       {"batch_size", "16"}, {"num_workers", "0"}};

static void config(lk_trainer_config *cfg, const char *accel) {
    CHECK_OK(lk_trainer_config_default(cfg));
    snprintf(cfg->accelerator, sizeof cfg->accelerator, "%s", accel);
    snprintf(cfg->strategy, sizeof cfg->strategy, "ddp");
    cfg->devices = 2;
    cfg->max_steps = 12;
    cfg->max_epochs = 3;
    cfg->enable_checkpointing = false;
    cfg->enable_progress_bar = false;
    cfg->enable_tensorboard = false;
    cfg->enable_model_summary = false;
    cfg->num_sanity_val_steps = 0;
    cfg->seed = 3;
    snprintf(cfg->default_root_dir, sizeof cfg->default_root_dir, "%s", getenv("SEALED_DDP_DIR"));
}

/* One fit: in the launcher it starts the ranks; in a rank it trains, and
 * rank 0 writes the parameters to <dir>/<model>.<accel>.bin. */
static lk_status fit(const char *model_in, const char *accel) {
    char model[64];
    snprintf(model, sizeof model, "%s", model_in);
    size_t ml = strlen(model);
    bool dev = ml > 4 && !strcmp(model + ml - 4, "_dev"); /* over the device-reading test communicator */
    if (dev) model[ml - 4] = 0;
    if (dev) setenv("LK_COMM_BACKEND", "sealed_nccl", 1);
    bool cnn = !strncmp(model, "cnn", 3);
    lk_trainer_config cfg;
    config(&cfg, accel);
    cfg.sync_batchnorm = !strcmp(model, "cnn_sbn");
    if (!strcmp(model, "mlp_bf16c")) /* f32 gradients compressed to bf16 from the host stage */
        snprintf(cfg.ddp_comm_hook, sizeof cfg.ddp_comm_hook, "bf16_compress");
    if (!strcmp(model, "mlp_bf16t")) /* bf16 gradients widened to f32 for the average, from the host stage */
        snprintf(cfg.precision, sizeof cfg.precision, "bf16-true");
    bool one = !strcmp(model, "mlp_one"); /* both ranks on sealed:0, as two ranks on one GPU */
    if (one) setenv("SEALED_DEVICES", "1", 1);
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    sealed_stats s0 = sealed_get_stats(); /* the counters are the process's: this fit's are the difference */
    sealed_comm_stats c0 = sealed_comm_get_stats();
    sealed_comm_counts.dev_all_reduce_dtypes = 0; /* this fit's (no communicator runs between fits) */
    lk_status st = lk_module_create_builtin(cnn ? "cnn" : "mlp", cnn ? cnn_args : mlp_args, 4, 3, &m);
    if (!st) st = lk_datamodule_create_builtin("synthetic", cnn ? cnn_data : mlp_data, 5, 3, &dm);
    if (!st) st = lk_trainer_create(&cfg, NULL, NULL, &tr);
    if (!st) st = lk_trainer_fit(tr, m, dm, NULL);
    if (!st && !strcmp(accel, "sealed") && lk_trainer_rank(tr) >= 0) { /* which sealed device this rank used */
        char path[600];
        snprintf(path, sizeof path, "%s/%s.sealed.r%d.txt", getenv("SEALED_DDP_DIR"), model_in, lk_trainer_rank(tr));
        FILE *f = fopen(path, "w");
        sealed_stats ss = sealed_get_stats();
        sealed_comm_stats cs = sealed_comm_get_stats();
        if (f)
            fprintf(f, "%ld %ld %ld %ld %ld %u\n", ss.ops - s0.ops, ss.copies_in_to[0] - s0.copies_in_to[0],
                    ss.copies_in_to[1] - s0.copies_in_to[1], cs.dev_all_reduce - c0.dev_all_reduce,
                    cs.dev_broadcast - c0.dev_broadcast, cs.dev_all_reduce_dtypes),
                fclose(f);
    }
    if (!st && lk_trainer_rank(tr) == 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s.%s.bin", getenv("SEALED_DDP_DIR"), model_in, accel);
        FILE *f = fopen(path, "wb");
        lk_named_tensors ps = {0};
        st = f ? lk_layer_named_parameters(m->net, &ps) : lk_error(LK_STATUS_IO, "cannot write %s", path);
        for (int i = 0; !st && i < ps.n; i++) {
            lk_tensor *h = lk_tensor_to(ps.items[i].tensor, LK_DEVICE_CPU);
            if (!h || fwrite(h->data, lk_tensor_nbytes(h), 1, f) != 1) st = lk_error(LK_STATUS_IO, "cannot write %s", path);
            lk_tensor_release(h);
        }
        double vm[2]; /* the validation metrics after the parameters, their bits compared with them */
        if (!st && (!lk_trainer_metric(tr, "val_loss", &vm[0]) || !lk_trainer_metric(tr, "val_acc", &vm[1])))
            st = lk_error(LK_STATUS_INTERNAL, "%s %s: no val_loss / val_acc after the fit", model_in, accel);
        if (!st && fwrite(vm, sizeof vm, 1, f) != 1) st = lk_error(LK_STATUS_IO, "cannot write %s", path);
        lk_named_tensors_clear(&ps);
        if (f) fclose(f);
    }
    if (one) unsetenv("SEALED_DEVICES");
    if (dev) unsetenv("LK_COMM_BACKEND");
    if (st) fprintf(stderr, "%s %s: %s\n", model, accel, lk_last_error());
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return st;
}

static size_t slurp(const char *dir, const char *model, const char *accel, char *buf, size_t cap) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.%s.bin", dir, model, accel);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap, f) : 0;
    if (f) fclose(f);
    return n;
}

enum { NMODELS = 10 };

static bool is_dev(const char *model) { return strlen(model) > 4 && !strcmp(model + strlen(model) - 4, "_dev"); }

int main(void) {
    sealed_comm_register();
    static const char *const models[] = {"mlp", "cnn", "cnn_sbn", "mlp_bf16c", "mlp_bf16t", "mlp_one", "mlp_dev", "cnn_dev",
                                          "mlp_bf16c_dev", "mlp_bf16t_dev"},
                             *const accels[] = {"cpu", "sealed"};
    if (getenv("RANK")) { /* a rank: every fit of the job, one after the other */
        lk_status st = LK_STATUS_OK;
        for (int mi = 0; mi < NMODELS && !st; mi++)
            for (int ai = is_dev(models[mi]) ? 1 : 0; ai < 2 && !st; ai++) st = fit(models[mi], accels[ai]);
        return st ? 1 : 0;
    }
    char dir[] = "/tmp/lk_sealed_ddp_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("SEALED_DDP_DIR", dir, 1);
    setenv("LK_ALLOW_OVERSUBSCRIBE", "1", 1); /* 2 CPU ranks on a 1-core machine */
    /* The launcher: its first fit starts the job (the ranks replay main),
     * which is all of them (a process starts one job). */
    CHECK_OK(fit(models[0], accels[0]));
    static char a[1 << 16], b[1 << 16];
    for (int mi = 0; mi < NMODELS; mi++) {
        char base[64]; /* a _dev model against its base model's CPU run */
        snprintf(base, sizeof base, "%.*s", (int)strlen(models[mi]) - (is_dev(models[mi]) ? 4 : 0), models[mi]);
        size_t na = slurp(dir, base, "cpu", a, sizeof a), nb = slurp(dir, models[mi], "sealed", b, sizeof b);
        CHECK_MSG(na > 0 && na == nb, "%s: %zu bytes of parameters from the cpu ranks, %zu from the sealed ranks", models[mi],
                  na, nb);
        CHECK_MSG(na == nb && !memcmp(a, b, na), "%s: ddp x2 on sealed:0/sealed:1 differs from ddp x2 on the CPU", models[mi]);
        if (na == nb && na >= 16) { /* the trailing val_loss, val_acc */
            double va[2], vb[2];
            memcpy(va, a + na - 16, 16), memcpy(vb, b + nb - 16, 16);
            CHECK_MSG(!memcmp(va, vb, 16), "%s: val_loss %.17g / %.17g, val_acc %.17g / %.17g (cpu / sealed)", models[mi],
                      va[0], vb[0], va[1], vb[1]);
        }
        bool one = !strcmp(models[mi], "mlp_one");
        for (int r = 0; r < 2; r++) { /* rank r trained on sealed:r (mlp_one: both on sealed:0), and only there */
            char path[600];
            snprintf(path, sizeof path, "%s/%s.sealed.r%d.txt", dir, models[mi], r);
            FILE *f = fopen(path, "r");
            long ops = 0, in[2] = {0, 0}, dev_ar = 0, dev_bc = 0;
            unsigned dts = 0;
            CHECK_MSG(f && fscanf(f, "%ld %ld %ld %ld %ld %u", &ops, &in[0], &in[1], &dev_ar, &dev_bc, &dts) == 6,
                      "%s: no stats from rank %d", models[mi], r);
            if (f) fclose(f);
            if (is_dev(models[mi])) { /* ddp handed the communicator device memory, in the dtype gradients travel in */
                unsigned want = 1u << (strstr(models[mi], "bf16c") ? LK_BF16 : LK_F32);
                CHECK_MSG(dev_ar > 0 && dev_bc > 0 && dts == want,
                          "%s rank %d: %ld all_reduces and %ld broadcasts of device memory, dtypes 0x%x (expected 0x%x)",
                          models[mi], r, dev_ar, dev_bc, dts, want);
            } else { /* shm reads host memory: ddp stages every device buffer */
                CHECK_MSG(dev_ar == 0 && dev_bc == 0, "%s rank %d: the shm run handed device memory to a communicator",
                          models[mi], r);
            }
            int mine = one ? 0 : r;
            CHECK_MSG(ops > 0 && in[mine] > 0 && in[1 - mine] == 0,
                      "%s rank %d: %ld ops, %ld copies in to sealed:0, %ld to sealed:1", models[mi], r, ops, in[0], in[1]);
        }
        if (na == nb && !lk_t_failed_checks)
            printf("ok   %s ddp x2 %s%s == on the cpu (%zu bytes)\n", models[mi],
                   one ? "both on sealed:0" : "on sealed:0/sealed:1", is_dev(models[mi]) ? " over a device-reading comm" : "",
                   na);
    }
    { /* sync_batchnorm took effect: its statistics over both ranks' halves train other bits than per-rank BN */
        size_t na = slurp(dir, "cnn", "cpu", a, sizeof a), nb = slurp(dir, "cnn_sbn", "cpu", b, sizeof b);
        CHECK_MSG(na == nb && na > 0 && memcmp(a, b, na), "cnn with and without sync_batchnorm trained the same bits");
    }
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    CHECK(system(rm) == 0);
    printf("%s\n", lk_t_failed_checks ? "FAIL" : "ok");
    return lk_t_failed_checks ? 1 : 0;
}
