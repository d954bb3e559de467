/* trainer.precision: Lightning's names and aliases, and the dtypes a
 * precision decides (the steps' autocast, the parameters'). */
#include <string.h>

#include "train/train_impl.h"

const char *lk__precision_name(const char *p) {
    return !strcmp(p, "32") ? "32-true" : !strcmp(p, "bf16") ? "bf16-mixed" : !strcmp(p, "16") ? "16-mixed" : p;
}

/* trainer.precision (with Lightning's aliases) -> the autocast dtype of the
 * steps (LK_F32: none) and the parameters' dtype. The *-true precisions
 * keep the parameters (and so the gradients) themselves in the low dtype
 * and run the steps under autocast of it: the GEMMs take the 16-bit
 * weights as they are, the fp32-list ops (softmax, losses) still widen. */
lk_status lk__precision_parse(const char *given, lk_dtype *autocast, lk_dtype *params) {
    *autocast = *params = LK_F32;
    const char *p = lk__precision_name(given);
    if (!strcmp(p, "32-true")) return LK_STATUS_OK;
    if (!strcmp(p, "bf16-mixed")) return (*autocast = LK_BF16), LK_STATUS_OK;
    if (!strcmp(p, "16-mixed")) return (*autocast = LK_F16), LK_STATUS_OK;
    if (!strcmp(p, "bf16-true")) return (*autocast = *params = LK_BF16), LK_STATUS_OK;
    if (!strcmp(p, "16-true")) return (*autocast = *params = LK_F16), LK_STATUS_OK;
    if (!strcmp(p, "64-true") || !strcmp(p, "64"))
        return lk_error(LK_STATUS_UNSUPPORTED, "trainer.precision '%s': f64 training is not supported (use 32-true)", p);
    return lk_error(LK_STATUS_INVALID_ARGUMENT,
                    "trainer.precision '%s' is not one of 32-true, 32, bf16-mixed, bf16, 16-mixed, 16, bf16-true, "
                    "16-true, 64-true, 64", p);
}
