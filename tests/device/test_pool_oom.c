/* Out of device memory, as a GPU runs out: a "capped" test device (host
 * memory with a byte budget, so the CPU kernels run on it) whose allocator
 * refuses past the budget with the bytes asked and free, as the cuda device
 * does.
 *
 * - The storage pool keeps freed blocks by exact size; when the device
 *   refuses, the pool gives the device back its cached blocks and asks once
 *   more (PyTorch's caching allocator does the same): an allocation that
 *   fits only without the cache succeeds.
 * - Past that, the error names the bytes asked, what is free, and that the
 *   cache was already returned; nothing crashes.
 * - A fit whose activations do not fit fails with that error from
 *   lk_trainer_fit, leaves no storage behind on the device, and the next fit
 *   on the same device (smaller batch) trains. */
#include <pthread.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"

#define MIB ((size_t)1 << 20)

static struct {
    pthread_mutex_t mu;
    size_t budget, live;
    long refusals;
} capped = {.mu = PTHREAD_MUTEX_INITIALIZER};

static lk_status capped_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx;
    *ptr = NULL;
    pthread_mutex_lock(&capped.mu);
    size_t live = capped.live;
    bool fits = live + bytes <= capped.budget;
    if (fits) capped.live += bytes;
    else capped.refusals++;
    pthread_mutex_unlock(&capped.mu);
    if (!fits)
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "capped:%d: out of device memory: asked for %zu bytes, %zu bytes free of %zu",
                        index, bytes, capped.budget - live, capped.budget);
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    if (*ptr) return LK_STATUS_OK;
    pthread_mutex_lock(&capped.mu);
    capped.live -= bytes;
    pthread_mutex_unlock(&capped.mu);
    return lk_error(LK_STATUS_OUT_OF_MEMORY, "capped: host allocation of %zu bytes failed", bytes);
}

static void capped_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index;
    if (!ptr) return;
    pthread_mutex_lock(&capped.mu);
    capped.live -= bytes;
    pthread_mutex_unlock(&capped.mu);
    lk_aligned_free(ptr);
}

static const lk_device_vtable capped_vt = {
    .name = "capped", .host_addressable = true, .alloc = capped_alloc, .free = capped_free};

static lk_device capped_device(void) {
    lk_device_kind k = LK_CPU;
    CHECK_OK(lk_device_register(&capped_vt, NULL, &k));
    return (lk_device){k, 0};
}

static lk_tensor *on_capped(size_t bytes) {
    CHECK_OK(lk_device_set_default(capped_device()));
    lk_tensor *t = lk_tensor_empty(LK_F32, 1, (int64_t[]){(int64_t)(bytes / sizeof(float))});
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    return t;
}

/* 3 + 3 MiB freed into the cache, then 5 MiB on an 8 MiB device: it fits
 * only once the cache is given back. */
static void pool_gives_back_its_cache(void) {
    lk_pool_trim();
    capped.budget = 8 * MIB;
    lk_tensor *a = on_capped(3 * MIB), *b = on_capped(3 * MIB);
    CHECK(a && b);
    lk_tensor_release(a), lk_tensor_release(b);
    CHECK_MSG(capped.live == 6 * MIB, "the pool should cache both blocks (live %zu)", capped.live);
    uint64_t before = lk_pool_get_stats().oom_releases;
    long refused = capped.refusals;
    lk_tensor *c = on_capped(5 * MIB);
    CHECK_MSG(c != NULL, "5 MiB after giving back 6 MiB of cache: %s", lk_last_error());
    CHECK(capped.refusals == refused + 1); /* the device refused once, then took it */
    CHECK(lk_pool_get_stats().oom_releases == before + 1);
    CHECK_MSG(capped.live == 5 * MIB, "live %zu after the retry", capped.live);
    CHECK(lk_last_status() == LK_STATUS_OK); /* the first refusal is not left behind as an error */
    lk_tensor_release(c);
    lk_pool_trim();
    CHECK(capped.live == 0);
}

/* Too big even with the cache given back: the device's message (bytes asked
 * and free) plus what the pool already tried; a NULL tensor, no crash. */
static void too_big_is_a_clear_error(void) {
    lk_pool_trim();
    capped.budget = 8 * MIB;
    lk_tensor *a = on_capped(MIB);
    lk_tensor_release(a); /* 1 MiB cached, so the pool has something to give back */
    lk_tensor *t = on_capped(9 * MIB);
    CHECK(t == NULL);
    CHECK(lk_last_status() == LK_STATUS_OUT_OF_MEMORY);
    CHECK_MSG(strstr(lk_last_error(), "capped:0: out of device memory: asked for 9437184 bytes, 8388608 bytes free of 8388608") &&
                  strstr(lk_last_error(), "after the storage pool gave the device back every block it had cached"),
              "message: %s", lk_last_error());
    lk_tensor_release(t);
    lk_pool_trim();
    CHECK(capped.live == 0);
}

static char root[256];

static lk_status fit(const char *hidden, const char *batch, double *loss) {
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "capped");
    cfg.max_steps = 3;
    cfg.enable_checkpointing = false;
    cfg.enable_progress_bar = false;
    cfg.enable_tensorboard = false;
    cfg.enable_model_summary = false;
    cfg.num_sanity_val_steps = 0;
    cfg.log_every_n_steps = 1;
    cfg.seed = 5;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", root);
    const lk_model_kv margs[] = {{"input_dim", "16"}, {"hidden", hidden}, {"num_classes", "4"}};
    const lk_model_kv dargs[] = {{"num_samples", "2048"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                 {"batch_size", batch}, {"num_workers", "0"}};
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin("mlp", margs, 3, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", dargs, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    lk_status st = m && dm && tr ? lk_trainer_fit(tr, m, dm, NULL) : LK_STATUS_INTERNAL;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    *loss = NAN;
    if (!st) lk_trainer_metric(tr, "train_loss", loss);
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    if (st) lk_error(st, "%s", msg);
    return st;
}

/* A 4 MiB device: the mlp's parameters and Adam's state fit (~1 MiB), one
 * batch of 512 x 4096 activations (8 MiB) does not. */
static void fit_out_of_memory_then_fit_again(void) {
    snprintf(root, sizeof root, "/tmp/lk_test_pool_oom_%d", (int)getpid());
    lk_pool_trim();
    capped.budget = 4 * MIB;
    double loss;
    lk_status st = fit("[4096]", "512", &loss);
    CHECK_MSG(st == LK_STATUS_OUT_OF_MEMORY, "fit: status %d: %s", (int)st, lk_last_error());
    CHECK_MSG(strstr(lk_last_error(), "capped:0: out of device memory: asked for"), "message: %s", lk_last_error());
    lk_pool_trim();
    CHECK_MSG(capped.live == 0, "%zu bytes still live on the device after the failed fit", capped.live);
    CHECK(lk_device_equal(lk_device_default(), LK_DEVICE_CPU)); /* the failed run put the default back */
    CHECK_OK(fit("[64]", "32", &loss));
    CHECK_MSG(isfinite(loss), "the second fit logged no finite train_loss (%g)", loss);
    lk_pool_trim();
    CHECK(capped.live == 0);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", root);
    CHECK(system(rm) == 0);
}

LK_TEST_MAIN(LK_TEST_CASE(pool_gives_back_its_cache), LK_TEST_CASE(too_big_is_a_clear_error),
             LK_TEST_CASE(fit_out_of_memory_then_fit_again))
