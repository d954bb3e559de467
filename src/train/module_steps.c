/* The module contract as the trainer runs it: each step is the vtable's
 * slot when the module sets it, else its default composed from forward and
 * loss, so a module that only sets training_step works as before and one
 * that sets forward + loss gets every step (and a pipeline stage can run
 * forward alone). */
#include "train/train_impl.h"

static const char *module_name(const lk_module *m) { return m && m->name ? m->name : "(unnamed)"; }

static _Thread_local lk_tensor *replay;

void lk__module_forward_replay(lk_tensor *out) { replay = out; }

lk_tensor *lk_module_forward(lk_module *m, const lk_batch *b) {
    if (replay && b && replay->ndim >= 1 && replay->shape[0] == b->size) return replay;
    if (!m || !m->vt || !m->vt->forward)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no forward", module_name(m)), NULL;
    return m->vt->forward(m, b);
}

lk_tensor *lk_module_loss(lk_module *m, lk_tensor *output, const lk_batch *b) {
    if (!m || !m->vt || !m->vt->loss)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no loss", module_name(m)), NULL;
    if (!output) return NULL; /* the forward's error stands */
    return m->vt->loss(m, output, b);
}

/* loss(forward(b), b), or NULL with the error set. */
static lk_tensor *composed_loss(lk_module *m, const lk_batch *b, const char *step) {
    if (!m || !m->vt || !m->vt->forward || !m->vt->loss)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no %s (and no forward and loss to compose one)",
                        module_name(m), step),
               NULL;
    return lk_module_loss(m, lk_module_forward(m, b), b);
}

lk_tensor *lk_module_training_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr) {
    if (m && m->vt && m->vt->training_step) return m->vt->training_step(m, b, batch_idx, tr);
    lk_tensor *loss = composed_loss(m, b, "training_step");
    /* as a hand-written step would: the progress bar shows it, and on a
     * device the value is logged when the strategy reads the loss */
    if (loss && lk__log_loss(tr, "train_loss", loss, &(lk_log_opts){.prog_bar = true})) return NULL;
    return loss;
}

/* The default validation/test step: nothing without forward and loss (as
 * before a module could leave the slot empty), else `<prefix>_loss`. */
static lk_status eval_default(lk_module *m, const lk_batch *b, lk_trainer *tr, const char *metric) {
    if (!m || !m->vt || !m->vt->forward || !m->vt->loss) return LK_STATUS_OK;
    lk_tensor *loss = lk_module_loss(m, lk_module_forward(m, b), b);
    if (!loss) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_USAGE, "module '%s': loss returned nothing", module_name(m));
    return lk__log_tensor(tr, metric, loss, &(lk_log_opts){.prog_bar = true, .sync_dist = true});
}

lk_status lk_module_validation_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr) {
    if (m && m->vt && m->vt->validation_step) return m->vt->validation_step(m, b, batch_idx, tr);
    return eval_default(m, b, tr, "val_loss");
}

lk_status lk_module_test_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr) {
    if (m && m->vt && m->vt->test_step) return m->vt->test_step(m, b, batch_idx, tr);
    return eval_default(m, b, tr, "test_loss");
}

lk_tensor *lk_module_predict_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr) {
    if (m && m->vt && m->vt->predict_step) return m->vt->predict_step(m, b, batch_idx, tr);
    if (!m || !m->vt || !m->vt->forward)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no predict_step (and no forward)", module_name(m)), NULL;
    return m->vt->forward(m, b);
}
