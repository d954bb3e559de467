/* The module and data module helpers of the public API (free),
 * lk_batch_tensor: a batch field as a tensor on the run's device, and which
 * layers of a module's network recompute in the backward
 * (trainer.activation_checkpointing and its policy). */
#include <stdio.h>
#include <string.h>

#include "tensor/tensor_impl.h"
#include "train/prefetch.h"
#include "train/train_impl.h"

/* What a failed constructor was given is freed as a successful one's would
 * be later: the caller's code stays one straight line (as
 * lk_layer_add_child takes its child either way). */
static void drop_module_parts(const char *name, const lk_module_vtable *vt, lk_layer *net, void *self) {
    lk_layer_free(net);
    lk_module tmp = {.name = name, .vt = vt, .self = self};
    if (vt && vt->destroy && self) vt->destroy(&tmp);
}

lk_status lk_module_create(const char *name, const lk_module_vtable *vt, lk_layer *net, void *self, lk_module **out) {
    lk_status st = LK_STATUS_OK;
    if (!out) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_module_create: out is NULL");
    else *out = NULL;
    if (!st && !vt)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_module_create: module '%s' has no vtable", name ? name : "");
    if (!st && !net) { /* most often a layer constructor that failed just before: its message is the useful one */
        lk_status why = lk_last_status();
        char last[1024];
        snprintf(last, sizeof last, "%s", why ? lk_last_error() : "");
        st = lk_error(why ? why : LK_STATUS_INVALID_ARGUMENT, "lk_module_create: module '%s' has no network%s%s%s",
                      name ? name : "", why ? " (" : "", last, why ? ")" : "");
    }
    lk_module *m = st ? NULL : lk_calloc(1, sizeof *m);
    if (!st && !m) st = lk_last_status();
    if (st) {
        drop_module_parts(name, vt, net, self);
        return st;
    }
    *m = (lk_module){.name = name ? name : "module", .vt = vt, .net = net, .self = self};
    *out = m;
    return LK_STATUS_OK;
}

lk_status lk_datamodule_create(const char *name, const lk_datamodule_vtable *vt, void *self, int64_t batch_size,
                               lk_datamodule **out) {
    lk_status st = LK_STATUS_OK;
    if (!out) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_datamodule_create: out is NULL");
    else *out = NULL;
    if (!st && (!vt || !vt->dataset))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_datamodule_create: data module '%s' needs a vtable with "
                      "dataset()", name ? name : "");
    if (!st && batch_size < 1)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_datamodule_create: data module '%s': batch_size %lld, expected "
                      "1 or more", name ? name : "", (long long)batch_size);
    lk_datamodule *dm = st ? NULL : lk_calloc(1, sizeof *dm);
    if (!st && !dm) st = lk_last_status();
    if (st) {
        lk_datamodule tmp = {.name = name, .vt = vt, .self = self};
        if (vt && vt->destroy && self) vt->destroy(&tmp);
        return st;
    }
    *dm = (lk_datamodule){.name = name ? name : "data", .vt = vt, .self = self, .batch_size = batch_size};
    *out = dm;
    return LK_STATUS_OK;
}

void lk_module_free(lk_module *m) {
    if (!m) return;
    if (m->vt && m->vt->destroy) m->vt->destroy(m);
    lk_layer_free(m->net);
    lk_free(m->hparams_yaml);
    lk_free(m);
}

void lk_datamodule_free(lk_datamodule *dm) {
    if (!dm) return;
    if (dm->vt && dm->vt->destroy) dm->vt->destroy(dm);
    lk_free(dm->hparams_yaml);
    lk_free(dm);
}

lk_tensor *lk_batch_tensor(const lk_batch *b, int field) {
    if (!b || field < 0 || field >= b->nfields) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_batch_tensor: field %d out of range (the batch has %d)", field,
                 b ? b->nfields : 0);
        return NULL;
    }
    const lk_array *a = &b->field[field];
    lk_device dev = lk_device_default();
    if (!lk_device_is_host(dev)) { /* the trainer's loops may have copied it there already (prefetch.c) */
        lk_tensor *staged = NULL;
        if (lk__prefetch_tensor(b, field, dev, &staged)) return NULL;
        if (staged) lk__host_shadow_set(staged, a->data, b, field); /* copied from a->data: its host shadow */
        if (staged) return lk_scope_adopt(staged);
    }
    /* The loader's batch is host memory: on a host-addressable device the
     * field is that device's tensor as it is (the run's ops then put their
     * results there: they follow their first input); a run on another device
     * gets one copy of the field there (one check per field, not per element). */
    lk_device at = lk_device_is_host(dev) ? dev : LK_DEVICE_CPU;
    lk_tensor *t = lk__tensor_wrap_on(at, a->dtype, a->ndim, a->shape, a->data);
    if (t && !lk_device_is_host(dev)) {
        lk_tensor *d = lk_tensor_to(t, dev);
        lk_tensor_release(t);
        t = d;
        lk__host_shadow_set(t, a->data, b, field);
    }
    return lk_scope_adopt(t);
}

/* ---- activation checkpointing (trainer.activation_checkpointing[_policy]) ---------- */

static void collect_types(const lk_layer *l, const char **types, int *n, int max) {
    bool seen = false;
    for (int i = 0; i < *n && !seen; i++) seen = !strcmp(types[i], l->type);
    if (!seen && *n < max) types[(*n)++] = l->type;
    for (int c = 0; c < l->n_children; c++) collect_types(l->children[c].layer, types, n, max);
}

lk_status lk__activation_checkpointing(const lk_trainer_config *c, lk_layer *net, int *count) {
    *count = 0;
    bool policy = c->activation_checkpointing_policy[0] != '\0';
    if (!net || (!c->activation_checkpointing && !policy)) return LK_STATUS_OK;
    if (c->sync_batchnorm)
        return lk_error(LK_STATUS_UNSUPPORTED, "trainer.activation_checkpointing with trainer.sync_batchnorm: a "
                        "recompute would all-reduce the statistics again inside the backward; turn one of them off");
    if (!policy) {
        *count = lk_layer_checkpoint_policy(net, NULL, 0);
        return LK_STATUS_OK;
    }
    /* "Linear,Conv2d", "[Linear, Conv2d]": class names, checked against the model's */
    enum { MAX = 64 };
    const char *have[MAX];
    int nhave = 0;
    collect_types(net, have, &nhave, MAX);
    char buf[LK_PARAM_STR];
    snprintf(buf, sizeof buf, "%s", c->activation_checkpointing_policy);
    const char *names[MAX];
    int n = 0;
    for (char *tok = strtok(buf, "[], \t"); tok; tok = strtok(NULL, "[], \t")) {
        bool ok = false;
        for (int i = 0; i < nhave && !ok; i++) ok = !strcmp(have[i], tok);
        if (!ok) {
            char list[512] = "";
            for (int i = 0; i < nhave; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", have[i]);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.activation_checkpointing_policy: no layer of class "
                            "'%s' in the model (its layer classes: %s)", tok, list);
        }
        if (n < MAX) names[n++] = tok;
    }
    if (n == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.activation_checkpointing_policy: '%s' names no layer class",
                        c->activation_checkpointing_policy);
    *count = lk_layer_checkpoint_policy(net, names, n);
    return LK_STATUS_OK;
}
