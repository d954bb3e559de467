/* Weights written by PyTorch (tools/gen_weights_fixture.py: a weights-only
 * safetensors file of the same architecture) load into lockstep's module by
 * name and give PyTorch's outputs; a file of another model is refused with
 * every mismatch named. */
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "npy.h"

#define FIX LK_SOURCE_DIR "/tests/fixtures/weights/"

static void check_model(const char *name, const lk_model_kv *args, int n) {
    lk_module *m = NULL;
    CHECK_OK(lk_module_create_builtin(name, args, n, 0, &m));
    if (!m) return;
    char path[512];
    snprintf(path, sizeof path, FIX "%s.safetensors", name);
    CHECK_OK(lk_module_load_weights(m, path));
    snprintf(path, sizeof path, FIX "%s_x.npy", name);
    lk_tensor *x = NULL, *y = NULL;
    CHECK_OK(lk_npy_load(path, &x));
    snprintf(path, sizeof path, FIX "%s_y.npy", name);
    CHECK_OK(lk_npy_load(path, &y));
    if (x && y) {
        lk_layer_train(m->net, false);
        lk_scope_begin();
        bool prev = lk_set_grad_enabled(false);
        lk_tensor *out = lk_layer_forward(m->net, x);
        lk_set_grad_enabled(prev);
        CHECK(out && out->numel == y->numel);
        double worst = 0, mx = 0;
        for (int64_t i = 0; out && i < y->numel; i++) {
            double d = fabs(lk_tensor_get(out, i) - lk_tensor_get(y, i));
            worst = d > worst ? d : worst;
            mx = fabs(lk_tensor_get(y, i)) > mx ? fabs(lk_tensor_get(y, i)) : mx;
        }
        printf("%s: max |lockstep - pytorch| = %.3g (max |y| %.3g)\n", name, worst, mx);
        CHECK_MSG(worst <= 1e-5 * (mx > 1 ? mx : 1), "%s: %.3g", name, worst);
        lk_scope_end();
    }
    lk_tensor_release(x);
    lk_tensor_release(y);
    lk_module_free(m);
}

static void pytorch_weights_load(void) {
    static const lk_model_kv mlp[] = {{"input_dim", "16"}, {"hidden", "[32]"}, {"num_classes", "4"}};
    static const lk_model_kv cnn[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "3"}};
    check_model("mlp", mlp, 3);
    check_model("cnn", cnn, 4);
}

static void other_model_is_refused(void) {
    static const lk_model_kv mlp[] = {{"input_dim", "16"}, {"hidden", "[32, 8]"}, {"num_classes", "4"}};
    lk_module *m = NULL;
    CHECK_OK(lk_module_create_builtin("mlp", mlp, 3, 0, &m));
    CHECK_ERR(lk_module_load_weights(m, FIX "mlp.safetensors"), LK_STATUS_INVALID_ARGUMENT,
              "'layers.2.weight' has shape [4, 32], the model expects [8, 32]");
    CHECK(strstr(lk_last_error(), "missing 'layers.4.weight'") != NULL);
    CHECK_ERR(lk_module_load_weights(m, FIX "nope.safetensors"), LK_STATUS_IO, "nope.safetensors");
    lk_module_free(m);
}

#include "io/safetensors.h"

/* lockstep -> PyTorch: weights written the way `lockstep export` writes them
 * load into PyTorch with strict=True and give lockstep's outputs. */
static void lockstep_weights_in_pytorch(void) {
    static const lk_model_kv cnn[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "3"}};
    lk_module *m = NULL;
    CHECK_OK(lk_module_create_builtin("cnn", cnn, 4, 5, &m));
    lk_tensor *x = NULL;
    CHECK_OK(lk_npy_load(FIX "cnn_x.npy", &x));
    if (!m || !x) return;
    lk_layer_train(m->net, false);
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(m->net, x);
    CHECK_OK(lk_npy_save("/tmp/lk_w_y.npy", y));
    lk_scope_end();
    lk_named_tensors sd = {0};
    CHECK_OK(lk_state_dict_get(m->net, &sd));
    lk_st_entry e[64];
    for (int i = 0; i < sd.n && i < 64; i++) e[i] = (lk_st_entry){.name = sd.items[i].name, .tensor = sd.items[i].tensor};
    CHECK_OK(lk_safetensors_write("/tmp/lk_w.safetensors", e, sd.n, (lk_st_meta[]){{"format", "pt"}}, 1));
    lk_named_tensors_clear(&sd);
    if (access("/usr/bin/python3", X_OK) == 0) {
        int rc = system("/usr/bin/python3 " LK_SOURCE_DIR "/tools/torch_check_weights.py /tmp/lk_w.safetensors cnn "
                        "'{\"image_size\": 8, \"channels\": [4, 6], \"hidden\": 10, \"num_classes\": 3}' "
                        LK_SOURCE_DIR "/tests/fixtures/weights/cnn_x.npy /tmp/lk_w_y.npy");
        if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) printf("skip: torch is not importable by /usr/bin/python3\n");
        else CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "torch_check_weights.py failed");
    }
    lk_tensor_release(x);
    lk_module_free(m);
}

LK_TEST_MAIN(LK_TEST_CASE(lockstep_weights_in_pytorch), LK_TEST_CASE(pytorch_weights_load), LK_TEST_CASE(other_model_is_refused))
