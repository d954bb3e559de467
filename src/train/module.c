/* The module and data module helpers of the public API (free) and
 * lk_batch_tensor: a batch field as a tensor on the run's device. */
#include "tensor/tensor_impl.h"
#include "train/prefetch.h"
#include "train/train_impl.h"

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
