/* Choosing GPUs without a GPU: trainer.devices in Lightning's forms resolved
 * against a given visible count (lk__gpu_select), trainer.accelerator
 * decided before anything starts (lk__accelerator_resolve), each rank bound
 * to its GPU, the YAML forms kept as ids by the config parser, and the
 * trainer refusing `accelerator: gpu` on this (GPU-less or CPU-only) build
 * with an error that names what was asked and what is visible. */
#include "device/gpu.h"
#include "lk_test.h"
#include "train/accelerator.h"

static int sel(const char *spec, int visible, int *ids) {
    int n = -1;
    lk_status st = lk__gpu_select(spec, visible, ids, LK__GPU_MAX, &n);
    return st ? -1 : n;
}

static void select_forms(void) {
    int ids[LK__GPU_MAX];
    CHECK(sel("2", 4, ids) == 2 && ids[0] == 0 && ids[1] == 1);
    CHECK(sel("-1", 3, ids) == 3 && ids[2] == 2);
    CHECK(sel("auto", 2, ids) == 2);
    CHECK(sel("", 1, ids) == 1 && ids[0] == 0);
    CHECK(sel("0,2", 4, ids) == 2 && ids[0] == 0 && ids[1] == 2);
    CHECK(sel("[3, 1]", 4, ids) == 2 && ids[0] == 3 && ids[1] == 1);
    CHECK(sel("[1]", 2, ids) == 1 && ids[0] == 1); /* a one-element list is an index, not a count */
    int n;
    CHECK_ERR(lk__gpu_select("0,2", 2, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=0,2 names GPU 2, but only 2 GPUs are visible (indices 0..1)");
    CHECK_ERR(lk__gpu_select("[5]", 1, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT,
              "names GPU 5, but only 1 GPU is visible");
    CHECK_ERR(lk__gpu_select("3", 2, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=3 asks for more GPUs than the 2 visible");
    setenv("LK_ALLOW_OVERSUBSCRIBE", "1", 1); /* ranks share the GPUs: rank i on GPU i % visible */
    CHECK_OK(lk__gpu_select("3", 2, ids, LK__GPU_MAX, &n));
    CHECK(n == 3 && ids[0] == 0 && ids[1] == 1 && ids[2] == 0);
    unsetenv("LK_ALLOW_OVERSUBSCRIBE");
    CHECK_ERR(lk__gpu_select("auto", 0, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=auto asks for GPUs, but no CUDA device is visible");
    CHECK_ERR(lk__gpu_select("1,1", 2, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT, "names GPU 1 twice");
    CHECK_ERR(lk__gpu_select("two", 2, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT,
              "expected a number of GPUs, -1, auto or a list of GPU indices");
    CHECK_ERR(lk__gpu_select("[]", 2, ids, LK__GPU_MAX, &n), LK_STATUS_INVALID_ARGUMENT, "selects no GPU");
}

static void rank_binding(void) {
    int ids[] = {2, 5}, g = -1;
    CHECK_OK(lk__gpu_for_rank(ids, 2, 0, &g));
    CHECK(g == 2);
    CHECK_OK(lk__gpu_for_rank(ids, 2, 1, &g));
    CHECK(g == 5);
    CHECK_ERR(lk__gpu_for_rank(ids, 2, 2, &g), LK_STATUS_INVALID_USAGE, "local rank 2 has no GPU: trainer.devices selects 2");
}

static lk_trainer_config cfg_of(const char *accel, const char *devices_yaml) {
    lk_trainer_config c;
    lk_trainer_config_default(&c);
    lk_config *y = lk_config_create();
    char text[256];
    snprintf(text, sizeof text, "trainer:\n  accelerator: %s\n  devices: %s\n", accel, devices_yaml);
    CHECK_OK(lk_config_load_string(y, text, strlen(text), "<test>"));
    CHECK_OK(lk_trainer_config_apply(lk_config_get(y, "trainer"), &c));
    lk_config_free(y);
    return c;
}

static void accelerator(void) {
    lk__accel a;
    int ids[LK__GPU_MAX], n;
    lk_trainer_config c = cfg_of("gpu", "[0, 2]");
    CHECK(!strcmp(c.devices_spec, "[0, 2]") && c.devices == 2); /* the list keeps its ids */
    CHECK_OK(lk__accelerator_resolve(&c, true, 4, &a, ids, &n));
    CHECK(a == LK__ACCEL_GPU && n == 2 && ids[1] == 2);
    CHECK_ERR(lk__accelerator_resolve(&c, true, 2, &a, ids, &n), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=[0, 2] names GPU 2, but only 2 GPUs are visible");
    CHECK_ERR(lk__accelerator_resolve(&c, true, 0, &a, ids, &n), LK_STATUS_UNSUPPORTED,
              "'gpu' with trainer.devices=[0, 2], but this build's CUDA backend sees no CUDA device");
    CHECK_ERR(lk__accelerator_resolve(&c, false, 0, &a, ids, &n), LK_STATUS_UNSUPPORTED,
              "'gpu' needs the CUDA backend, which this build does not have");
    c = cfg_of("cuda", "4");
    CHECK(!c.devices_spec[0] && c.devices == 4);
    CHECK_ERR(lk__accelerator_resolve(&c, true, 1, &a, ids, &n), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=4 asks for more GPUs than the 1 visible");
    c = cfg_of("gpu", "[1]"); /* one GPU, index 1: not "1 GPU" */
    CHECK(!strcmp(c.devices_spec, "[1]") && c.devices == 1);
    CHECK_OK(lk__accelerator_resolve(&c, true, 2, &a, ids, &n));
    CHECK(n == 1 && ids[0] == 1);
    c = cfg_of("gpu", "\"0,1\""); /* Lightning's string form */
    CHECK(!strcmp(c.devices_spec, "0,1") && c.devices == 2);
    CHECK_OK(lk__accelerator_resolve(&c, true, 2, &a, ids, &n));
    CHECK(n == 2 && ids[1] == 1);
    c = cfg_of("gpu", "-1");
    CHECK(!strcmp(c.devices_spec, "-1"));
    CHECK_OK(lk__accelerator_resolve(&c, true, 3, &a, ids, &n));
    CHECK(a == LK__ACCEL_GPU && n == 3);
    c = cfg_of("gpu", "auto");
    CHECK_OK(lk__accelerator_resolve(&c, true, 2, &a, ids, &n));
    CHECK(n == 2);
    snprintf(c.strategy, sizeof c.strategy, "ddp_spawn"); /* forks after CUDA is up */
    CHECK_ERR(lk__accelerator_resolve(&c, true, 2, &a, ids, &n), LK_STATUS_UNSUPPORTED,
              "trainer.strategy 'ddp_spawn' forks its ranks, and CUDA does not survive a fork: use ddp on GPUs");
    /* auto keeps the CPU: with no GPU, and (until GPU training has run on a
     * GPU in this project's tests) with one too; cpu never asks */
    c = cfg_of("auto", "1");
    CHECK_OK(lk__accelerator_resolve(&c, true, 0, &a, NULL, NULL));
    CHECK(a == LK__ACCEL_CPU);
    CHECK_OK(lk__accelerator_resolve(&c, true, 8, &a, NULL, NULL));
    CHECK(a == LK__ACCEL_CPU);
    c = cfg_of("cpu", "[0, 1]");
    CHECK_OK(lk__accelerator_resolve(&c, false, 0, &a, NULL, NULL));
    CHECK(a == LK__ACCEL_CPU);
}

/* The trainer itself, on this machine: no GPU is visible here (or CUDA is
 * not built), so accelerator: gpu fails at creation, before any process,
 * file or thread, naming what was asked and why there is no GPU. */
static void trainer_refuses(void) {
    if (lk__cuda_visible() > 0) {
        printf("a GPU is visible: the trainer-refusal case is for GPU-less machines, skipped\n");
        return;
    }
    lk_trainer_config c = cfg_of("gpu", "[0, 2]");
    lk_trainer *tr = NULL;
    const char *needle = lk__cuda_built() ? "sees no CUDA device" : "needs the CUDA backend";
    CHECK_ERR(lk_trainer_create(&c, NULL, NULL, &tr), LK_STATUS_UNSUPPORTED, needle);
    CHECK(tr == NULL);
    CHECK(strstr(lk_last_error(), "trainer.devices=[0, 2]"));
    /* naming the device kind reports why there is none, instead of "unknown device" */
    lk_device d;
    CHECK_ERR(lk_device_parse("cuda:0", &d), LK_STATUS_UNSUPPORTED, "device 'cuda': ");
    CHECK(lk__cuda_why_none()[0] != 0);
}

LK_TEST_MAIN(LK_TEST_CASE(select_forms), LK_TEST_CASE(rank_binding), LK_TEST_CASE(accelerator),
             LK_TEST_CASE(trainer_refuses))
