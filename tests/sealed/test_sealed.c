/* Training on a device the host cannot read (tests/sealed_device.h): the
 * mlp (with dropout) and the cnn (batch norm) fit with strategy single on
 * sealed:0 give the CPU's bits — parameters, training and validation losses
 * and accuracy — in f32 and bf16-mixed; a checkpoint written on the sealed
 * device resumes on the CPU and the other way round with the bits of an
 * uninterrupted run; after the second step the pool serves every storage,
 * and a step copies the batch in, never the parameters. Any host read of
 * device memory outside the device's methods and backend is a SIGSEGV
 * (run under `gdb -batch -ex run -ex bt` to see where), and a host pointer
 * handed to a device op is an error naming the op. */
#include "sealed_harness.h"

/* The sealed test's runs also read val_acc and test_acc, check the default
 * device was put back and move the module back to the host. */
static run_out fit(run_spec s) {
    s.accuracy = s.move_back = true;
    return sh_fit(s);
}

/* 20 steps: an epoch of 16 batches, its validation, and 4 steps more. */
static void single_fit(const char *model, const char *precision) {
    run_out cpu = fit((run_spec){.model = model, .accelerator = "cpu", .precision = precision, .max_steps = 20});
    run_out sd = fit((run_spec){.model = model, .accelerator = "sealed", .precision = precision, .max_steps = 20});
    CHECK_MSG(sd.after.ops > sd.before.ops, "nothing ran on the sealed device");
    CHECK_MSG(cpu.after.ops == cpu.before.ops, "the cpu run used the sealed device");
    CHECK_MSG(!isnan(sd.val_loss) && !isnan(sd.val_acc), "no validation metrics");
    char what[64];
    snprintf(what, sizeof what, "%s %s", model, precision);
    same_bits(what, &cpu, &sd);
}

static void mlp_single(void) { single_fit("mlp", "32-true"); }
static void cnn_single(void) { single_fit("cnn", "32-true"); }
static void mlp_bf16_mixed(void) { single_fit("mlp", "bf16-mixed"); }
static void cnn_bf16_mixed(void) { single_fit("cnn", "bf16-mixed"); }

/* dp with two sealed devices: replica k on sealed:k (its batch slice is
 * copied there), the gradients summed on sealed:0 through peer copies (no
 * host in between), the parameters copied back out the same way: the bits
 * of dp x2 on the CPU. */
static void dp_two_devices(void) {
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_spec s = {.model = model, .strategy = "dp", .devices = 2, .max_steps = 20};
        s.accelerator = "cpu";
        run_out cpu = fit(s);
        s.accelerator = "sealed";
        run_out sd = fit(s);
        CHECK_MSG(sd.after.copies_in_to[1] > sd.before.copies_in_to[1] &&
                      sd.after.copies_in_to[0] > sd.before.copies_in_to[0],
                  "%s: replica 1 got no data on sealed:1 (%ld copies in) or replica 0 none on sealed:0 (%ld)", model,
                  sd.after.copies_in_to[1] - sd.before.copies_in_to[1], sd.after.copies_in_to[0] - sd.before.copies_in_to[0]);
        long peer = sd.peer_after.copies - sd.peer_before.copies;
        size_t out = sd.after.bytes_out - sd.before.bytes_out, in = sd.after.bytes_in - sd.before.bytes_in;
        printf("%s dp x2: %ld peer copies (%zu bytes), %ld copies out (%zu bytes), %ld in (%zu bytes), params %lld bytes\n", model, peer,
               sd.peer_after.bytes - sd.peer_before.bytes, sd.after.copies_out - sd.before.copies_out, out,
               sd.after.copies_in - sd.before.copies_in, in, (long long)sd.param_bytes);
        /* The replica sync is device to device: every step sends the
         * gradients to sealed:0 and the parameters back as peer copies, and
         * nothing of it crosses the host (staged, it would copy at least
         * 2 x the parameters' bytes out per step; what does leave is the
         * losses, metrics and checkpoints). */
        CHECK_MSG(peer >= 2 * s.max_steps, "%s: %ld peer copies in %lld steps (expected 2 per step at least)", model, peer,
                  (long long)s.max_steps);
        CHECK_MSG(out < (size_t)(s.max_steps * sd.param_bytes), "%s: %zu bytes copied to the host in %lld steps of %lld "
                  "bytes of parameters: the replica sync goes through the host", model, out, (long long)s.max_steps,
                  (long long)sd.param_bytes);
        char what[64];
        snprintf(what, sizeof what, "%s dp x2", model);
        same_bits(what, &cpu, &sd);
    }
}

/* fp16 loss scaling with an overflow at step 2 (the scaler's found-inf
 * count read back in one copy, the step skipped), gradient clipping by
 * norm (the norms read back in one copy), then test and predict on the
 * fitted module where it is. */
static void mlp_scaler_clipping_test_predict(void) {
    run_spec s = {.model = "mlp", .precision = "16-mixed", .max_steps = 20, .clip = 0.5, .overflow = "0:2",
                  .test_after = true};
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed";
    run_out sd = fit(s);
    CHECK_MSG(!isnan(sd.test_loss) && !isnan(sd.test_acc), "no test metrics");
    same_bits("mlp 16-mixed, clipped, overflow at step 2", &cpu, &sd);
}

/* Stopped after 5 steps on one device, resumed on the other to 12: the bits
 * of 12 uninterrupted steps on the CPU. */
static void checkpoint_crosses_devices(void) {
    static const char *const order[2][2] = {{"sealed", "cpu"}, {"cpu", "sealed"}};
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_out whole = fit((run_spec){.model = model, .accelerator = "cpu", .max_steps = 12});
        for (int k = 0; k < 2; k++) {
            char last[1024] = "";
            run_out first = fit((run_spec){.model = model, .accelerator = order[k][0], .max_steps = 5, .last = last});
            free(first.params);
            CHECK_MSG(last[0], "%s on %s wrote no last.ckpt", model, order[k][0]);
            if (!last[0]) continue;
            run_out rest = fit((run_spec){.model = model, .accelerator = order[k][1], .max_steps = 12, .resume = last});
            char what[96];
            snprintf(what, sizeof what, "%s: 5 steps on %s, resumed on %s", model, order[k][0], order[k][1]);
            run_out w = whole;
            w.params = malloc((size_t)whole.n * sizeof(float) + 1);
            memcpy(w.params, whole.params, (size_t)whole.n * sizeof(float));
            same_bits(what, &w, &rest);
        }
        free(whole.params);
    }
}

/* From the third step on the pool serves every storage (no device
 * allocation, no miss), and a step copies in the batch's two fields,
 * nothing else (the dropout masks are drawn on the device), never the
 * parameters; it copies out scalars (the loss, the non-finite check),
 * never a parameter (sealed_syncs holds the count of those reads). */
static void steps_copy_the_batch_only(void) {
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_out o = fit((run_spec){.model = model, .accelerator = "sealed", .max_steps = 8, .probe = true});
        CHECK_MSG(o.steps_seen == 8, "%s: %lld steps probed", model, (long long)o.steps_seen);
        int64_t batch = m ? 16 : 32, batch_bytes = batch * (m ? 64 : 16) * 4 + batch * 8; /* x f32, y i64 */
        long max_in = 2, max_out = m ? 7 : 5; /* the mlp's dropout masks: drawn on the device, no copy */
        for (int k = 3; k < o.steps_seen; k++) {
            sealed_stats a = o.at[k - 1], b = o.at[k];
            CHECK_MSG(o.misses[k] == o.misses[2], "%s step %d: %llu pool misses since step 2", model, k - 1,
                      (unsigned long long)(o.misses[k] - o.misses[2]));
            CHECK_MSG(b.allocs == a.allocs, "%s step %d: %ld device allocations", model, k - 1, b.allocs - a.allocs);
            long in = b.copies_in - a.copies_in, out = b.copies_out - a.copies_out;
            int64_t bin = (int64_t)(b.bytes_in - a.bytes_in), bout = (int64_t)(b.bytes_out - a.bytes_out);
            if (k == 3) printf("%s: a step copies %ld in (%lld bytes), %ld out (%lld bytes); %lld parameter bytes\n", model,
                               in, (long long)bin, out, (long long)bout, (long long)o.param_bytes);
            CHECK_MSG(in == max_in && bin == batch_bytes, "%s step %d: %ld copies in, %lld bytes (the batch is %lld)",
                      model, k - 1, in, (long long)bin, (long long)batch_bytes);
            CHECK_MSG(out <= max_out && bout <= batch * 8 + 160, "%s step %d: %ld copies out, %lld bytes", model, k - 1, out,
                      (long long)bout);
        }
        free(o.params);
    }
}

/* What is not there yet is refused before anything starts, naming it; the
 * device index comes from trainer.devices. */
static void refusals(void) {
    if (!sh_root[0]) setup();
    lk_trainer_config cfg;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "sealed");
    cfg.devices = 3;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=3 asks for more GPUs than the 2 visible");
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "tpu");
    cfg.devices = 1;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_ARGUMENT,
              "trainer.accelerator 'tpu' is not one of cpu, gpu, cuda, auto");
    /* a device without a backend of its own cannot be the default: ops could not run there */
    static const lk_device_vtable bare = {.name = "bare", .alloc = sealed_alloc, .free = sealed_free, .memset = sealed_memset,
                                          .copy_to_host = sealed_to_host, .copy_from_host = sealed_from_host, .copy = sealed_copy};
    lk_device_kind k;
    CHECK_OK(lk_device_register(&bare, NULL, &k));
    CHECK_ERR(lk_device_set_default((lk_device){k, 0}), LK_STATUS_UNSUPPORTED, "no backend is registered for its kind");
    CHECK_OK(lk_device_set_default(sealed_device(0))); /* the sealed device has one */
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    CHECK(tr == NULL);
}

static void setup(void) {
    sh_root_init("sealed");
    sealed_device(0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(mlp_single), LK_TEST_CASE(cnn_single), LK_TEST_CASE(mlp_bf16_mixed),
             LK_TEST_CASE(cnn_bf16_mixed), LK_TEST_CASE(mlp_scaler_clipping_test_predict),
             LK_TEST_CASE(dp_two_devices),
             LK_TEST_CASE(checkpoint_crosses_devices), LK_TEST_CASE(steps_copy_the_batch_only), LK_TEST_CASE(refusals),
             LK_TEST_CASE(cleanup))
