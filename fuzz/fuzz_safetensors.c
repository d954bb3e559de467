/* libFuzzer target for the safetensors reader: any byte string must either
 * open (and then every tensor lies inside the input and reads back into a
 * tensor of its shape) or fail with an error — never crash, leak or hang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lk_st_file *f;
    if (lk_safetensors_open_memory(data, size, "fuzz.safetensors", &f)) {
        if (f || !*lk_last_error()) __builtin_trap(); /* a failure always explains itself */
        return 0;
    }
    for (int i = 0; i < lk_safetensors_count(f); i++) {
        const lk_st_info *in = lk_safetensors_at(f, i);
        const uint8_t *p = in->data;
        if (p < data || p + in->nbytes > data + size || in->nbytes != (size_t)in->numel * in->elem_size) __builtin_trap();
        if (lk_safetensors_find(f, in->name) != in) __builtin_trap();
        if (in->dtype < 0 || in->ndim > LK_MAX_DIMS) continue;
        lk_tensor *t = lk_tensor_empty((lk_dtype)in->dtype, in->ndim, in->shape);
        if (!t) continue;
        if (lk_safetensors_read_into(f, in->name, t)) __builtin_trap();
        if (in->nbytes && memcmp(t->data, in->data, in->nbytes)) __builtin_trap();
        if (lk_dtype_is_float((lk_dtype)in->dtype)) { /* the converting path */
            lk_tensor *d = lk_tensor_empty(LK_F64, in->ndim, in->shape);
            if (d && lk_safetensors_read_into(f, in->name, d)) __builtin_trap();
            lk_tensor_release(d);
        }
        lk_tensor_release(t);
    }
    size_t total = 0;
    for (int i = 0; i < lk_safetensors_meta_count(f); i++)
        total += strlen(lk_safetensors_meta_key(f, i)) + strlen(lk_safetensors_meta_value(f, i));
    (void)total;
    lk_safetensors_close(f);
    return 0;
}
