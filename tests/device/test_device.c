/* The device layer: the registry (names, numbers, indices, bad input), the
 * storage pool keyed by (device, size), copies between devices (peer copies
 * between two of one kind), and a small
 * network trained on the tests' debug device (tests/debug_device.h) giving
 * the same bits as on the CPU while allocating nothing after its first step. */
#include "debug_device.h"
#include "lk_test.h"

static void registry(void) {
    lk_device d = dbg_device(), again = dbg_device();
    CHECK(d.kind != LK_CPU && d.kind != LK_CUDA);
    CHECK(lk_device_equal(d, again)); /* registering a name twice gives its first number */
    lk_device p;
    CHECK_OK(lk_device_parse("cpu", &p));
    CHECK(lk_device_equal(p, LK_DEVICE_CPU));
    CHECK_OK(lk_device_parse("debug:1", &p));
    CHECK(p.kind == d.kind && p.index == 1);
    CHECK_ERR(lk_device_parse("debug:2", &p), LK_STATUS_INVALID_ARGUMENT, "this process sees 2 debug devices");
    CHECK_ERR(lk_device_parse("debug:x", &p), LK_STATUS_INVALID_ARGUMENT, "expected KIND or KIND:INDEX");
    CHECK_ERR(lk_device_parse("tpu", &p), LK_STATUS_INVALID_ARGUMENT, "unknown device 'tpu' (registered in this build: cpu, debug)");
    char buf[32];
    CHECK(!strcmp(lk_device_str(p, buf, sizeof buf), "debug:1"));
    CHECK(!strcmp(lk_device_str(LK_DEVICE_CPU, buf, sizeof buf), "cpu"));
    CHECK(lk_device_is_host(d) && lk_device_count(d.kind) == 2 && lk_device_count(LK_CPU) == 1);
    static const lk_device_vtable incomplete = {.name = "half", .alloc = dbg_alloc, .free = dbg_free};
    lk_device_kind k;
    CHECK_ERR(lk_device_register(&incomplete, NULL, &k), LK_STATUS_INVALID_ARGUMENT, "must provide memset and all three copies");
}

/* A device the CPU cannot address: data only moves through its copies, and it
 * cannot be the default until a backend runs ops there. */
static lk_status far_memset(void *c, int i, void *p, int v, size_t n) { return (void)c, (void)i, memset(p, v, n), LK_STATUS_OK; }
static lk_device far_device(void) {
    static const lk_device_vtable far_vt = {.name = "far", .alloc = dbg_alloc, .free = dbg_free, .memset = far_memset,
                                            .copy_to_host = dbg_to_host, .copy_from_host = dbg_from_host, .copy = dbg_copy};
    lk_device_kind k = LK_CPU;
    CHECK_OK(lk_device_register(&far_vt, NULL, &k));
    return (lk_device){k, 0};
}

static void far_tests(void) {
    lk_device far = far_device(), d = dbg_device();
    CHECK(!lk_device_is_host(far));
    CHECK_ERR(lk_device_set_default(far), LK_STATUS_UNSUPPORTED, "device 'far' cannot be the default yet");
    float v[5] = {1, -2, 3.5f, 0, 1e-30f}, back[5];
    lk_tensor *t = lk_tensor_from_data(LK_F32, LK_SHAPE(5), v);
    long in0 = dbg.copies_in, out0 = dbg.copies_out;
    lk_tensor *f = lk_tensor_to(t, far);
    CHECK(f && lk_device_equal(f->device, far) && dbg.copies_in == in0 + 1);
    lk_tensor *g = lk_tensor_to(f, d); /* far -> debug: two host-addressed hops through a host buffer */
    CHECK(g && lk_device_equal(g->device, d));
    lk_tensor *h = lk_tensor_to(g, LK_DEVICE_CPU);
    CHECK(h && h->device.kind == LK_CPU && dbg.copies_out >= out0 + 2);
    if (h) memcpy(back, h->data, sizeof back);
    CHECK(h && memcmp(back, v, sizeof v) == 0);
    lk_tensor_release(t), lk_tensor_release(f), lk_tensor_release(g), lk_tensor_release(h);
}

/* Two devices of one kind: lk_device_copy takes the kind's copy_peer
 * between two indexes, its own copy within one, and stages through the
 * host for a kind without copy_peer (the fallback). */
static long peer_calls;
static int peer_last_dst = -1, peer_last_src = -1;
static lk_status peer_copy(void *c, int di, void *dst, int si, const void *src, size_t n) {
    (void)c;
    peer_calls++, peer_last_dst = di, peer_last_src = si;
    memcpy(dst, src, n);
    return LK_STATUS_OK;
}
static void peer_copies(void) {
    static const lk_device_vtable peer_vt = {.name = "farpeer", .count = dbg_count, .alloc = dbg_alloc, .free = dbg_free,
                                             .memset = far_memset, .copy_to_host = dbg_to_host,
                                             .copy_from_host = dbg_from_host, .copy = dbg_copy, .copy_peer = peer_copy};
    static const lk_device_vtable stage_vt = {.name = "farstage", .count = dbg_count, .alloc = dbg_alloc, .free = dbg_free,
                                              .memset = far_memset, .copy_to_host = dbg_to_host,
                                              .copy_from_host = dbg_from_host, .copy = dbg_copy};
    lk_device_kind kp, ks;
    CHECK_OK(lk_device_register(&peer_vt, NULL, &kp));
    CHECK_OK(lk_device_register(&stage_vt, NULL, &ks));
    float v[3] = {1, 2, 3}, back[3] = {0};
    for (int which = 0; which < 2; which++) {
        lk_device a = {which ? ks : kp, 0}, b = {which ? ks : kp, 1};
        void *pa, *pb, *pc;
        CHECK_OK(lk_device_alloc(a, sizeof v, &pa));
        CHECK_OK(lk_device_alloc(b, sizeof v, &pb));
        CHECK_OK(lk_device_alloc(b, sizeof v, &pc));
        CHECK_OK(lk_device_copy(a, pa, LK_DEVICE_CPU, v, sizeof v));
        long calls = peer_calls, in = dbg.copies_in, out = dbg.copies_out, within = dbg.copies_within;
        CHECK_OK(lk_device_copy(b, pb, a, pa, sizeof v)); /* 0 -> 1 */
        if (!which) CHECK(peer_calls == calls + 1 && peer_last_dst == 1 && peer_last_src == 0 && dbg.copies_in == in &&
                          dbg.copies_out == out);
        else CHECK(peer_calls == calls && dbg.copies_out == out + 1 && dbg.copies_in == in + 1); /* staged */
        calls = peer_calls;
        CHECK_OK(lk_device_copy(b, pc, b, pb, sizeof v)); /* within device 1: the kind's copy */
        CHECK(peer_calls == calls && dbg.copies_within == within + 1);
        CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, b, pc, sizeof v));
        CHECK(!memcmp(back, v, sizeof v));
        lk_device_free(a, pa, sizeof v), lk_device_free(b, pb, sizeof v), lk_device_free(b, pc, sizeof v);
    }
}

static void pool_is_keyed_by_device(void) {
    lk_device d = dbg_device();
    lk_pool_trim();
    CHECK_OK(lk_device_set_default(d));
    long a0 = dbg.allocs;
    lk_tensor *t = lk_tensor_zeros(LK_F32, LK_SHAPE(1000));
    CHECK(t && lk_device_equal(t->device, d) && dbg.allocs == a0 + 1);
    lk_tensor *v = lk_reshape(t, LK_SHAPE(10, 100)); /* views keep the device */
    CHECK(v && lk_device_equal(v->device, d));
    lk_tensor_release(v);
    lk_tensor_release(t);
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    lk_tensor *c = lk_tensor_zeros(LK_F32, LK_SHAPE(1000)); /* same size, other device: not the cached block */
    CHECK(c && c->device.kind == LK_CPU && dbg.allocs == a0 + 1);
    lk_tensor_release(c);
    CHECK_OK(lk_device_set_default(d));
    lk_tensor *again = lk_tensor_empty(LK_F32, LK_SHAPE(1000)); /* the cached debug block comes back */
    CHECK(again && lk_device_equal(again->device, d) && dbg.allocs == a0 + 1);
    lk_tensor_release(again);
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    long f0 = dbg.frees;
    lk_pool_trim();
    CHECK(dbg.frees > f0 && dbg.bad_frees == 0);
}

/* The pool's peak of live bytes (what a step's activations took) follows
 * allocations, not frees, and restarts at the live bytes when reset. */
static void pool_peak(void) {
    size_t base = lk_pool_reset_peak();
    CHECK(lk_pool_get_stats().bytes_live_peak == base);
    lk_tensor *a = lk_tensor_zeros(LK_F32, LK_SHAPE(4096)); /* 16 KiB */
    lk_tensor *b = lk_tensor_zeros(LK_F32, LK_SHAPE(8192)); /* 32 KiB */
    lk_tensor_release(a);
    lk_tensor_release(b);
    lk_pool_stats st = lk_pool_get_stats();
    CHECK(st.bytes_live == base);
    CHECK_MSG(st.bytes_live_peak == base + 49152, "peak %zu, base %zu", st.bytes_live_peak, base);
    CHECK(lk_pool_reset_peak() == base && lk_pool_get_stats().bytes_live_peak == base);
}

enum { IN = 7, HID = 11, OUT = 5, BATCH = 13, STEPS = 4 };

/* t moved to *to (NULL: t itself). */
static lk_tensor *place(lk_tensor *t, const lk_device *to) {
    if (!to) return t;
    lk_tensor *m = lk_tensor_to(t, *to);
    lk_tensor_release(t);
    return m;
}

/* Forward + backward + SGD of a 2-layer tanh network on the default device,
 * or with every tensor moved to *to after it is made (the default device
 * left alone: ops follow their inputs); writes the parameters after STEPS
 * steps and the last loss. */
static void train_small(const lk_device *to, float *params_out, float *loss_out, long *allocs_after_first) {
    lk_rng r;
    lk_rng_init(&r, 3, LK_RNG_INIT, 0, 0);
    lk_tensor *w1 = place(lk_tensor_randn(&r, LK_SHAPE(HID, IN), 0, 0.4f), to);
    lk_tensor *b1 = place(lk_tensor_randn(&r, LK_SHAPE(HID), 0, 0.1f), to);
    lk_tensor *w2 = place(lk_tensor_randn(&r, LK_SHAPE(OUT, HID), 0, 0.4f), to);
    lk_tensor *b2 = place(lk_tensor_zeros(LK_F32, LK_SHAPE(OUT)), to);
    lk_tensor *ps[4] = {w1, b1, w2, b2};
    for (int i = 0; i < 4; i++) lk_tensor_set_requires_grad(ps[i], true);
    float xs[BATCH * IN], ys[BATCH * OUT];
    for (int i = 0; i < BATCH * IN; i++) xs[i] = sinf((float)i * 0.37f);
    for (int i = 0; i < BATCH * OUT; i++) ys[i] = cosf((float)i * 0.11f);
    for (int s = 0; s < STEPS; s++) {
        if (s == 2) *allocs_after_first = dbg.allocs; /* step 0 keeps its gradients as .grad, step 1 refills the pool */
        lk_scope_begin();
        lk_tensor *x = lk_scope_adopt(place(lk_tensor_from_data(LK_F32, LK_SHAPE(BATCH, IN), xs), to));
        lk_tensor *y = lk_scope_adopt(place(lk_tensor_from_data(LK_F32, LK_SHAPE(BATCH, OUT), ys), to));
        lk_tensor *loss = lk_mse_loss(lk_linear(lk_tanh(lk_linear(x, w1, b1)), w2, b2), y, LK_REDUCTION_MEAN);
        CHECK(loss && lk_device_equal(loss->device, w1->device));
        CHECK_OK(lk_backward(loss));
        for (int i = 0; i < 4; i++) CHECK(ps[i]->grad && lk_device_equal(ps[i]->grad->device, w1->device));
        *loss_out = loss ? lk_tensor_item(loss) : NAN;
        lk_scope_end();
        for (int i = 0; i < 4; i++) {
            float *p = ps[i]->data, *g = ps[i]->grad->data;
            for (int64_t k = 0; k < ps[i]->numel; k++) p[k] -= 0.1f * g[k];
            memset(g, 0, (size_t)ps[i]->numel * 4);
        }
    }
    int off = 0;
    for (int i = 0; i < 4; i++) {
        memcpy(params_out + off, ps[i]->data, (size_t)ps[i]->numel * 4);
        off += (int)ps[i]->numel;
        lk_tensor_release(ps[i]);
    }
}

/* The network on the CPU, then with the debug device as the default, then
 * with the default left at the CPU and every tensor moved to the debug
 * device (the ops run there and put their results and gradients there:
 * torch's rule): the same bits each time, nothing allocated after the
 * second step, nothing left live. */
static void training_on_the_debug_device(void) {
    enum { NP = HID * IN + HID + OUT * HID + OUT };
    static float on_cpu[NP], on_dbg[NP], moved[NP];
    float l_cpu, l_dbg, l_moved;
    long first = 0;
    train_small(NULL, on_cpu, &l_cpu, &first);
    lk_device d = dbg_device();
    CHECK_OK(lk_device_set_default(d));
    long a0 = dbg.allocs;
    train_small(NULL, on_dbg, &l_dbg, &first);
    long a1 = dbg.allocs;
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    CHECK_MSG(a1 > a0, "nothing was allocated on the debug device");
    CHECK_MSG(a1 == first, "steps after the second allocated %ld blocks on the device (the pool should serve them)", a1 - first);
    lk_pool_trim(); /* the moved run's blocks come from the device again */
    train_small(&d, moved, &l_moved, &first);
    CHECK_MSG(dbg.allocs > a1, "nothing was allocated on the debug device with the tensors moved there");
    CHECK_MSG(memcmp(on_cpu, on_dbg, sizeof on_cpu) == 0 && l_cpu == l_dbg,
              "parameters or loss differ between cpu and debug (loss %.9g vs %.9g)", l_cpu, l_dbg);
    CHECK_MSG(memcmp(on_cpu, moved, sizeof on_cpu) == 0 && l_cpu == l_moved,
              "parameters or loss differ between cpu and the tensors moved to debug (loss %.9g vs %.9g)", l_cpu, l_moved);
    CHECK(isfinite(l_dbg)); /* poisoned (NaN) memory read before written would show here */
    lk_pool_trim();
    CHECK_MSG(dbg.live_bytes == 0 && dbg.bad_frees == 0, "%zu bytes still live on the debug device, %ld bad frees",
              dbg.live_bytes, dbg.bad_frees);
}

/* Which tensors one op may take: one device, or any mix of memory the CPU
 * addresses; anything else is an error naming both devices. */
static void ops_follow_their_inputs(void) {
    lk_device d = dbg_device();
    /* A host-addressable device and the CPU mix (one memory to the CPU
     * kernels: the loader's batch meets the parameters so); the result
     * follows the first argument. */
    lk_scope_begin();
    lk_tensor *c = lk_scope_adopt(lk_tensor_zeros(LK_F32, LK_SHAPE(3)));
    lk_tensor *g = lk_scope_adopt(lk_tensor_to(c, d));
    lk_tensor *gc = lk_add(g, c), *cg = lk_add(c, g);
    CHECK(gc && lk_device_equal(gc->device, d) && cg && lk_device_equal(cg->device, LK_DEVICE_CPU));
    /* A device the CPU cannot address does not mix: refused by name before
     * any kernel is given memory it cannot read. */
    lk_tensor *f = lk_scope_adopt(lk_tensor_to(c, far_device()));
    CHECK(f != NULL);
    CHECK(lk_add(c, f) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "lk_add: expected all tensors on one device, but argument 0 is on cpu and argument 1 on far"),
              "error: %s", lk_last_error());
    lk_clear_error();
    lk_tensor *ts[3] = {g, g, f};
    CHECK(lk_concat(ts, 3, 0) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "concat: expected all tensors on one device, but argument 0 is on debug:0 and argument 2 on far"),
              "error: %s", lk_last_error());
    lk_clear_error();
    CHECK(lk_linear(c, c, f) == NULL && strstr(lk_last_error(), "argument 2 on far"));
    lk_clear_error();
    lk_scope_end();
    lk_pool_trim();
    CHECK_MSG(dbg.live_bytes == 0 && dbg.bad_frees == 0, "%zu bytes still live on the debug device, %ld bad frees",
              dbg.live_bytes, dbg.bad_frees);
}

LK_TEST_MAIN(LK_TEST_CASE(registry), LK_TEST_CASE(far_tests), LK_TEST_CASE(peer_copies), LK_TEST_CASE(pool_is_keyed_by_device), LK_TEST_CASE(pool_peak),
             LK_TEST_CASE(training_on_the_debug_device), LK_TEST_CASE(ops_follow_their_inputs))
