/* libFuzzer target for the YAML config loader: any input must load or fail
 * with a located error; a loaded tree must apply to a parameter table
 * without crashing, and must emit YAML that loads back to the same tree
 * (--print_config's promise). The input is also fed to the override parser
 * as a value and as a key path. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    int64_t max_epochs;
    double lr;
    bool fast;
    char precision[LK_PARAM_STR];
    char name[LK_PARAM_STR];
    lk_int_list devices;
    lk_float_list betas;
} sample;

static const lk_param params[] = {
    {"max_epochs", LK_PARAM_INT, offsetof(sample, max_epochs), "10", 0, 1e9, NULL, "epochs"},
    {"lr", LK_PARAM_FLOAT, offsetof(sample, lr), "0.001", 0, 10, NULL, "learning rate"},
    {"fast", LK_PARAM_BOOL, offsetof(sample, fast), "false", 1, 0, NULL, "fast"},
    {"precision", LK_PARAM_ENUM, offsetof(sample, precision), "32-true", 1, 0, "32-true|16-mixed|bf16-mixed", "precision"},
    {"name", LK_PARAM_STRING, offsetof(sample, name), NULL, 1, 0, NULL, "a name"},
    {"devices", LK_PARAM_INTS, offsetof(sample, devices), "[0]", 0, 1024, NULL, "devices"},
    {"betas", LK_PARAM_FLOATS, offsetof(sample, betas), "[0.9, 0.999]", 0, 1, NULL, "betas"},
};
#define NP (int)(sizeof params / sizeof params[0])

static int same(const lk_config_node *a, const lk_config_node *b) {
    if (lk_config_node_type(a) != lk_config_node_type(b)) return 0;
    if (lk_config_node_type(a) == LK_CONFIG_SCALAR)
        return !strcmp(lk_config_node_text(a), lk_config_node_text(b)) && lk_config_node_quoted(a) == lk_config_node_quoted(b);
    if (lk_config_node_count(a) != lk_config_node_count(b)) return 0;
    for (int i = 0; i < lk_config_node_count(a); i++) {
        const lk_config_node *x = lk_config_node_child(a, i), *y = lk_config_node_child(b, i);
        const char *kx = lk_config_node_key(x), *ky = lk_config_node_key(y);
        if (!kx != !ky || (kx && strcmp(kx, ky)) || !same(x, y)) return 0;
    }
    return 1;
}

static void round_trip(const lk_config *c) {
    char *y;
    size_t l;
    if (lk_config_node_to_yaml(lk_config_root(c), &y, &l)) __builtin_trap(); /* every tree can be printed */
    lk_config *d = lk_config_create();
    if (lk_config_load_string(d, y, l, "emitted.yaml")) __builtin_trap(); /* and read back */
    if (!same(lk_config_root(c), lk_config_root(d))) __builtin_trap(); /* unchanged */
    lk_config_free(d);
    lk_free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lk_config *c = lk_config_create();
    if (!c) return 0;
    if (!lk_config_load_string(c, (const char *)data, size, "fuzz.yaml")) {
        sample s;
        lk_params_defaults(params, NP, &s);
        lk_config_apply_params(lk_config_get(c, "trainer"), params, NP, &s, "trainer");
        lk_config_apply_params(lk_config_root(c), params, NP, &s, "");
        round_trip(c);
    } else if (!*lk_last_error()) {
        __builtin_trap();
    }
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    if (!lk_config_set_override(c, "trainer.name", text)) round_trip(c);
    if (!lk_config_set_override(c, text, "1")) {
        if (!lk_config_get(c, text)) __builtin_trap(); /* what was set can be found */
        round_trip(c);
    }
    free(text);
    lk_config_free(c);
    return 0;
}
