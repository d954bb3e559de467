/* The cuda device on a GPU: registration as kind LK_CUDA, alloc/copy/memset
 * round trips (host->device, device->device, device->host), tensors moved
 * to the GPU and back bit for bit, the tensor pool handing the same device
 * block back (a repeated step calls cudaMalloc nothing), pinned staging
 * buffers, and out of device memory as a clear error (1 PiB asked). */
#include "gpu_test.h"
#include "lk_test.h"

static const lk_device gpu0 = {LK_CUDA, 0};

static void registry(void) {
    lk_device d;
    CHECK_OK(lk_device_parse("cuda", &d));
    CHECK(lk_device_equal(d, gpu0) && !lk_device_is_host(d));
    CHECK(lk_device_count(LK_CUDA) == lk__cuda_visible());
    char buf[32];
    CHECK(!strcmp(lk_device_str(gpu0, buf, sizeof buf), "cuda:0"));
    int n = lk__cuda_visible();
    char name[16];
    snprintf(name, sizeof name, "cuda:%d", n);
    CHECK_ERR(lk_device_parse(name, &d), LK_STATUS_INVALID_ARGUMENT, "this process sees");
    lk__cuda_props p;
    CHECK_OK(lk__cuda_props_get(0, &p));
    CHECK(p.name[0] && p.major >= 5 && p.mem_total > 0 && p.mem_free <= p.mem_total);
    printf("GPU 0: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f free)\n", p.name, p.major, p.minor,
           p.multiprocessors, p.mem_total / 1073741824.0, p.mem_free / 1073741824.0);
}

static void round_trip(void) {
    enum { N = 1 << 20 };
    unsigned char *host = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + 3);
    void *a = NULL, *b = NULL;
    CHECK_OK(lk_device_alloc(gpu0, N, &a));
    CHECK_OK(lk_device_alloc(gpu0, N, &b));
    CHECK_OK(lk_device_copy(gpu0, a, LK_DEVICE_CPU, host, N));
    CHECK_OK(lk_device_copy(gpu0, b, gpu0, a, N)); /* device to device */
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, gpu0, b, N));
    CHECK(memcmp(host, back, N) == 0);
    CHECK_OK(lk_device_memset(gpu0, (char *)b + 100, 0xab, 1000));
    CHECK_OK(lk_device_synchronize(gpu0));
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, gpu0, b, N));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += back[i] != (i >= 100 && i < 1100 ? 0xab : host[i]);
    CHECK_MSG(bad == 0, "%d bytes differ after memset", bad);
    lk_device_free(gpu0, a, N);
    lk_device_free(gpu0, b, N);
    /* pinned staging */
    void *pin = NULL;
    CHECK_OK(lk__cuda_host_alloc(N, &pin));
    if (pin) {
        memcpy(pin, host, N);
        CHECK_OK(lk_device_alloc(gpu0, N, &a));
        CHECK_OK(lk_device_copy(gpu0, a, LK_DEVICE_CPU, pin, N));
        memset(pin, 0, N);
        CHECK_OK(lk_device_copy(LK_DEVICE_CPU, pin, gpu0, a, N));
        CHECK(memcmp(pin, host, N) == 0);
        lk_device_free(gpu0, a, N);
    }
    lk__cuda_host_free(pin);
    free(host);
    free(back);
}

static void tensors_and_pool(void) {
    float v[7] = {1, -2, 3.5f, 0, 1e-30f, -0.0f, 65504};
    lk_tensor *t = lk_tensor_from_data(LK_F32, LK_SHAPE(7), v);
    lk_pool_trim();
    lk_pool_stats s0 = lk_pool_get_stats();
    for (int step = 0; step < 5; step++) { /* a "step": to the GPU and back */
        lk_tensor *g = lk_tensor_to(t, gpu0);
        CHECK(g && lk_device_equal(g->device, gpu0));
        lk_tensor *h = g ? lk_tensor_to(g, LK_DEVICE_CPU) : NULL;
        CHECK(h && memcmp(h->data, v, sizeof v) == 0);
        lk_tensor_release(h);
        lk_tensor_release(g);
    }
    lk_pool_stats s1 = lk_pool_get_stats();
    /* one device block and one host block on the first step, hits after */
    CHECK_MSG(s1.misses - s0.misses <= 2, "%llu pool misses over 5 steps", (unsigned long long)(s1.misses - s0.misses));
    lk_tensor_release(t);
    lk_pool_trim();
}

static void out_of_memory(void) {
    void *p = (void *)1;
    size_t pib = (size_t)1 << 50;
    CHECK_ERR(lk_device_alloc(gpu0, pib, &p), LK_STATUS_OUT_OF_MEMORY,
              "cuda:0: out of device memory: asked for 1125899906842624 bytes");
    CHECK(p == NULL);
    CHECK(strstr(lk_last_error(), "free of"));
    /* the device still works afterwards */
    CHECK_OK(lk_device_alloc(gpu0, 256, &p));
    lk_device_free(gpu0, p, 256);
}

/* An op on a GPU tensor while the default device (where ops make their
 * results) is the CPU: an error that says so and what to do, not a fault;
 * with the GPU the default, the same op runs. */
/* Ops run where their inputs are and put their results there, whatever the
 * default device (torch's rule): GPU tensors with the CPU as the default
 * train on the GPU, gradients included. Tensors of two devices in one op
 * are refused, in either order, before any kernel reads memory it cannot
 * address (the CPU backend given a device pointer would crash). */
static void ops_follow_their_inputs(void) {
    CHECK(lk_device_equal(lk_device_default(), LK_DEVICE_CPU));
    float v[3] = {1, 2, 3};
    lk_tensor *t = lk_tensor_from_data(LK_F32, LK_SHAPE(3), v);
    lk_tensor *g = t ? lk_tensor_to(t, gpu0) : NULL;
    CHECK(g != NULL);
    if (g) g->requires_grad = true;
    lk_scope_begin(); /* owns the ops' results */
    lk_tensor *y = g ? lk_mul_scalar(g, 2.0f) : NULL;
    CHECK_MSG(y != NULL, "error: %s", lk_last_error());
    CHECK(y && lk_device_equal(y->device, gpu0));
    lk_tensor *loss = y ? lk_sum(lk_mul(y, y), NULL, 0, false) : NULL; /* sum 4 v^2: d/dv = 8 v */
    CHECK(loss && lk_device_equal(loss->device, gpu0));
    CHECK_OK(loss ? lk_backward(loss) : lk_last_status());
    CHECK(g && g->grad && lk_device_equal(g->grad->device, gpu0));
    lk_tensor *h = y ? lk_tensor_to(y, LK_DEVICE_CPU) : NULL;
    lk_tensor *gh = g && g->grad ? lk_tensor_to(g->grad, LK_DEVICE_CPU) : NULL;
    CHECK(h && ((float *)h->data)[2] == 6.0f);
    CHECK(gh && ((float *)gh->data)[2] == 24.0f);
    CHECK(lk_add(g, t) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "lk_add: expected all tensors on one device, but argument 0 is on cuda:0 and argument 1 on cpu"),
              "error: %s", lk_last_error());
    lk_clear_error();
    CHECK(lk_linear(t, g, NULL) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "argument 0 is on cpu and argument 1 on cuda:0"), "error: %s", lk_last_error());
    lk_clear_error();
    /* a strided view of GPU memory moves as torch's t.to() does: gathered on
     * its GPU by the backend's copy, then one copy across */
    float m[6] = {1, 2, 3, 4, 5, 6};
    lk_tensor *mc = lk_scope_adopt(lk_tensor_from_data(LK_F32, LK_SHAPE(2, 3), m));
    lk_tensor *mt = lk_transpose(lk_scope_adopt(lk_tensor_to(mc, gpu0)), 0, 1); /* [3, 2] view */
    lk_tensor *back = mt ? lk_scope_adopt(lk_tensor_to(mt, LK_DEVICE_CPU)) : NULL;
    CHECK_MSG(back != NULL, "error: %s", lk_last_error());
    static const float want[6] = {1, 4, 2, 5, 3, 6};
    CHECK(back && back->shape[0] == 3 && !memcmp(back->data, want, sizeof want));
    lk_scope_end();
    lk_tensor_release(gh), lk_tensor_release(h), lk_tensor_release(g), lk_tensor_release(t);
}

/* The random constructors on a GPU default: drawn on the host (the same
 * generator stream as on the CPU) and copied once; they wrote the GPU's
 * memory from the host before. */
static void random_on_the_default_gpu(void) {
    lk_rng a, b;
    lk_rng_init(&a, 11, LK_RNG_INIT, 0, 0);
    lk_rng_init(&b, 11, LK_RNG_INIT, 0, 0);
    lk_tensor *c = lk_tensor_randn(&a, LK_SHAPE(5, 7), 0.5f, 2.0f);
    lk_tensor *cu = lk_tensor_rand(&a, LK_SHAPE(9), -1.0f, 1.0f);
    CHECK_OK(lk_device_set_default(gpu0));
    lk_tensor *g = lk_tensor_randn(&b, LK_SHAPE(5, 7), 0.5f, 2.0f);
    lk_tensor *gu = lk_tensor_rand(&b, LK_SHAPE(9), -1.0f, 1.0f);
    lk_device_set_default(LK_DEVICE_CPU);
    CHECK(g && lk_device_equal(g->device, gpu0) && gu && lk_device_equal(gu->device, gpu0));
    lk_tensor *h = g ? lk_tensor_to(g, LK_DEVICE_CPU) : NULL, *hu = gu ? lk_tensor_to(gu, LK_DEVICE_CPU) : NULL;
    CHECK(c && h && !memcmp(c->data, h->data, lk_tensor_nbytes(c)));
    CHECK(cu && hu && !memcmp(cu->data, hu->data, lk_tensor_nbytes(cu)));
    lk_tensor_release(c), lk_tensor_release(cu), lk_tensor_release(g), lk_tensor_release(gu);
    lk_tensor_release(h), lk_tensor_release(hu);
}

/* With a GPU visible, accelerator: gpu makes a trainer on cuda:0 (the
 * refusal that stood here until GPU training was built is gone). */
static void trainer_on_gpu(void) {
    lk_trainer_config c;
    lk_trainer_config_default(&c);
    snprintf(c.accelerator, sizeof c.accelerator, "gpu");
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_create(&c, NULL, NULL, &tr));
    CHECK(tr != NULL);
    lk_trainer_free(tr);
}

int main(int argc, char **argv) {
    gpu_test_require();
    static const lk_t_case cases[] = {LK_TEST_CASE(registry), LK_TEST_CASE(round_trip), LK_TEST_CASE(tensors_and_pool),
                                      LK_TEST_CASE(out_of_memory), LK_TEST_CASE(ops_follow_their_inputs), LK_TEST_CASE(random_on_the_default_gpu),
                                      LK_TEST_CASE(trainer_on_gpu)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}
