/* libFuzzer target for resuming a fit from a checkpoint: the input is the
 * checkpoint file a user hands `--ckpt_path`. The fit must either resume
 * (and train, validate, save, rank its top-k) or stop with an error that
 * explains itself: never crash, hang, leak, overflow (UBSan) or delete a
 * file outside its checkpoint directory. The seeds in
 * fuzz/corpus/fuzz_resume/ are checkpoints of this very fit (16-mixed, so
 * the loss scaler's state is there; Adam with a cosine schedule; a
 * val_loss top-k and EarlyStopping), written by
 *   lockstep fit --model.class_path mlp --model.init_args.input_dim 16
 *     --model.init_args.hidden [8] --model.init_args.num_classes 4
 *     --data.class_path synthetic --data.init_args.num_samples 40
 *     --data.init_args.input_shape [16] --data.init_args.num_classes 4
 *     --data.init_args.batch_size 8 --data.init_args.num_workers 0
 *     --trainer.precision 16-mixed --trainer.max_epochs 1
 *     --trainer.monitor val_loss --trainer.early_stopping_monitor val_loss
 *     --optimizer.scheduler cosine --trainer.logger false
 * and, as same_dir.ckpt, that file with its dirpath, best_path and top_k
 * moved to /tmp/lk_fuzz_resume/checkpoints (tests/resume/ckpt_edit.py),
 * the directory this target's fit saves into. Those seeds predate the
 * tensor checksums and load with a note; crc_other_dir.ckpt is the same fit
 * resumed from other_dir.ckpt to epoch 2 by a lockstep that writes them
 * (its config metadata set back to other_dir.ckpt's), so the checksums'
 * parsing and checking are fuzzed too. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lockstep.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const lk_model_kv model_args[] = {{"input_dim", "16"}, {"hidden", "[8]"}, {"num_classes", "4"}};
static const lk_model_kv data_args[] = {{"num_samples", "40"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                        {"batch_size", "8"}, {"num_workers", "0"}};

/* Every file under dir/checkpoints is one the fit wrote; the canary
 * beside it must outlive any top-k list a checkpoint names. */
static char root[64], ckdir[96], canary[96], ckpt[64];
static int fd = -1; /* the checkpoint's memory file, read through the path ckpt */

static void setup(void) {
    setenv("LK_NUM_THREADS", "1", 1);
    lk_log_set_level(LK_LOG_OFF);
    /* a fixed place, so that a seed's dirpath can name this run's
     * checkpoint directory and take the path that keeps its top-k */
    snprintf(root, sizeof root, "/tmp/lk_fuzz_resume");
    if (mkdir(root, 0700) != 0 && errno != EEXIST) abort();
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", root);
    snprintf(canary, sizeof canary, "%s/canary.ckpt", root);
    fd = memfd_create("lk_fuzz_ckpt", 0);
    if (fd < 0) abort();
    snprintf(ckpt, sizeof ckpt, "/proc/self/fd/%d", fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fd < 0) setup();
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    FILE *c = fopen(canary, "w");
    if (!c) abort();
    fclose(c);

    lk_trainer_config cfg;
    lk_optim_settings opt;
    if (lk_trainer_config_default(&cfg) || lk_optim_settings_default(&opt)) abort();
    snprintf(cfg.precision, sizeof cfg.precision, "16-mixed");
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", root);
    snprintf(cfg.monitor, sizeof cfg.monitor, "val_loss");
    snprintf(cfg.early_stopping_monitor, sizeof cfg.early_stopping_monitor, "val_loss");
    cfg.logger_set = true, cfg.n_loggers = 0; /* logger: false: checkpoints under root/checkpoints */
    cfg.max_epochs = 3;
    cfg.enable_progress_bar = cfg.enable_model_summary = cfg.enable_tensorboard = false;
    cfg.num_sanity_val_steps = 0;
    snprintf(opt.scheduler, sizeof opt.scheduler, "cosine");

    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    if (lk_module_create_builtin("mlp", model_args, 3, 1, &m) ||
        lk_datamodule_create_builtin("synthetic", data_args, 5, 1, &dm) || lk_trainer_create(&cfg, &opt, NULL, &tr))
        abort();
    lk_clear_error();
    lk_status st = lk_trainer_fit(tr, m, dm, ckpt);
    if (st && !*lk_last_error()) __builtin_trap(); /* a failure always explains itself */
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    lk_thread_cleanup();
    if (access(canary, F_OK) != 0) __builtin_trap(); /* a file outside checkpoints/ was deleted */
    /* the next input starts from an empty checkpoint directory */
    DIR *d = opendir(ckdir);
    struct dirent *e;
    char p[sizeof ckdir + 300];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && snprintf(p, sizeof p, "%s/%s", ckdir, e->d_name) < (int)sizeof p) unlink(p);
    if (d) closedir(d);
    return 0;
}
