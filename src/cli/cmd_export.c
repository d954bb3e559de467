/* `lockstep export --ckpt FILE --out model.safetensors`: the weights of a
 * checkpoint (its model state dict under PyTorch's names) as a plain
 * safetensors file that torch/safetensors loads with strict=True. With
 * --with-optimizer the optimizer, scheduler and loss scaler state come along (used by the
 * reproducibility tests to compare whole training states bit for bit).
 * A sharded checkpoint set (a directory) is consolidated: each parameter
 * whole from the shards that hold its pieces (docs/CHECKPOINTS.md). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "lockstep.h"
#include "io/safetensors.h"
#include "train/ckpt_shards.h"

int lk_cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL;
    bool with_opt = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ckpt") && i + 1 < argc) ckpt = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--with-optimizer")) with_opt = true;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: lockstep export --ckpt CHECKPOINT --out WEIGHTS.safetensors [--with-optimizer]\n"
                   "Writes the model's weights (PyTorch state-dict names) from a lockstep checkpoint: a file, or a\n"
                   "sharded checkpoint set (a directory), whose shards are consolidated into whole tensors.\n");
            return 0;
        } else {
            fprintf(stderr, "lockstep export: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!ckpt || !out) {
        fprintf(stderr, "lockstep export: --ckpt and --out are required (see --help)\n");
        return 2;
    }
    if (lk__shards_is_set(ckpt)) {
        int k = 0;
        if (lk__shards_export(ckpt, out, with_opt, &k)) {
            fprintf(stderr, "lockstep export: error: %s\n", lk_last_error());
            return 1;
        }
        printf("wrote %d tensors to %s (consolidated from the sharded set)\n", k, out);
        return 0;
    }
    lk_st_file *f;
    if (lk_safetensors_open(ckpt, &f)) {
        fprintf(stderr, "lockstep export: error: %s\n", lk_last_error());
        return 1;
    }
    int n = lk_safetensors_count(f), k = 0;
    lk_st_entry *e = lk_calloc((size_t)n + 1, sizeof *e);
    for (int i = 0; e && i < n; i++) {
        const lk_st_info *info = lk_safetensors_at(f, i);
        bool train_state = !strncmp(info->name, "optimizer.", 10) || !strncmp(info->name, "lr_scheduler.", 13) ||
                           !strncmp(info->name, "grad_scaler.", 12);
        if (train_state && !with_opt) continue;
        if (info->dtype < 0) continue;
        e[k++] = (lk_st_entry){.name = info->name, .dtype = (lk_dtype)info->dtype, .ndim = info->ndim,
                               .shape = info->shape, .data = info->data};
    }
    lk_st_meta meta[] = {{"format", "pt"}};
    lk_status st = e ? lk_safetensors_write(out, e, k, meta, 1) : LK_STATUS_OUT_OF_MEMORY;
    lk_free(e);
    lk_safetensors_close(f);
    if (st) {
        fprintf(stderr, "lockstep export: error: %s\n", lk_last_error());
        return 1;
    }
    printf("wrote %d tensors to %s\n", k, out);
    return 0;
}
