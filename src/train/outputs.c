/* The run's outputs on rank 0: the progress bar, the loggers (the
 * default CSV + TensorBoard pair or trainer.logger's list), the log
 * directory, hparams.yaml and config.yaml. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

static bool is_rank0(const lk_trainer *tr) { return tr->rank == 0; }

lk_status lk__open_outputs(lk_trainer *tr, bool want_logs) {
    if (!is_rank0(tr)) return LK_STATUS_OK;
    if (tr->cfg.enable_progress_bar) {
        lk_progress_options po = lk_progress_options_default();
        po.every_n_steps = (int)tr->cfg.log_every_n_steps;
        LK_TRY(lk_progress_create(&po, &tr->progress));
    }
    if (!want_logs || tr->cfg.fast_dev_run) return LK_STATUS_OK;
    char root[LK_PATH];
    snprintf(root, sizeof root, "%s", tr->cfg.default_root_dir[0] ? tr->cfg.default_root_dir : ".");
    lk_logger *tbs[LK_MAX_CALLBACKS + 1]; /* the TensorBoard loggers, for their HParams tab */
    int ntb = 0;
    if (tr->cfg.logger_set && tr->cfg.n_loggers == 0) {
        /* logger: false. Lightning's log_dir is then default_root_dir:
         * config.yaml, run.json and checkpoints/ go there. */
        LK_TRY(lk_file_mkdirs(root));
        snprintf(tr->log_dir, sizeof tr->log_dir, "%s", root);
    } else {
        lk_logger *list, *csv;
        LK_TRY(lk_logger_list_create(&list));
        tr->logger = list;
        if (!tr->cfg.logger_set) {
            LK_TRY(lk_csv_logger_create(root, "lightning_logs", -1, &csv));
            LK_TRY(lk_logger_list_add(list, csv));
            const char *dir = lk_logger_log_dir(csv);
            snprintf(tr->log_dir, sizeof tr->log_dir, "%s", dir ? dir : root);
            if (tr->cfg.enable_tensorboard) {
                lk_logger *tb;
                LK_TRY(lk_tb_logger_create(tr->log_dir, &tb));
                LK_TRY(lk_logger_list_add(list, tb));
                tbs[ntb++] = tb;
            }
        }
        int versions[LK_MAX_CALLBACKS];
        for (int i = 0; tr->cfg.logger_set && i < tr->cfg.n_loggers; i++) {
            const lk_logger_config *lc = &tr->cfg.loggers[i];
            const char *save = lc->save_dir[0] ? lc->save_dir : root;
            int version = (int)lc->version;
            /* Loggers sharing save_dir/name and no version share the first's
             * version_N (Lightning resolves both to the same directory). */
            for (int j = 0; j < i && version < 0; j++) {
                const lk_logger_config *o = &tr->cfg.loggers[j];
                if (!strcmp(o->save_dir[0] ? o->save_dir : root, save) && !strcmp(o->name, lc->name)) version = versions[j];
            }
            lk_logger *lg;
            if (!strcmp(lc->kind, "csv")) LK_TRY(lk_csv_logger_create(save, lc->name, version, &lg));
            else {
                LK_TRY(lk_tb_logger_create_versioned(save, lc->name, version, &lg));
                tbs[ntb++] = lg;
            }
            versions[i] = lk_logger_version(lg);
            LK_TRY(lk_logger_list_add(list, lg));
            if (i == 0) {
                const char *dir = lk_logger_log_dir(lg);
                snprintf(tr->log_dir, sizeof tr->log_dir, "%s", dir && *dir ? dir : root);
            }
        }
    }
    lk_logger *list = tr->logger;
    /* hparams.yaml: the model's and data module's init args (save_hyperparameters),
     * merged into one flat map as Lightning's loggers get them: a key the
     * model has keeps the model's value */
    char *hp = NULL;
    size_t hl = 0;
    FILE *f = open_memstream(&hp, &hl);
    if (f) {
        if (tr->module && tr->module->hparams_yaml) fputs(tr->module->hparams_yaml, f);
        const char *d = tr->dm ? tr->dm->hparams_yaml : NULL;
        for (const char *p = d; p && *p;) {
            size_t n = strcspn(p, "\n"), k = strcspn(p, ":");
            bool dup = false;
            const char *m = tr->module ? tr->module->hparams_yaml : NULL;
            for (const char *q = m; q && *q && !dup && k < n; q += strcspn(q, "\n") + (q[strcspn(q, "\n")] != 0))
                dup = !strncmp(q, p, k + 1);
            if (!dup) fprintf(f, "%.*s\n", (int)n, p);
            p += n + (p[n] == '\n');
        }
        fclose(f);
        /* trainer.enable_autolog_hparams false: Lightning logs none (its CSVLogger still writes hparams.yaml: {}) */
        bool autolog = tr->cfg.enable_autolog_hparams;
        if (list) lk_logger_log_hyperparams(list, autolog && hp && *hp ? hp : "{}\n");
        for (int i = 0; list && autolog && i < ntb; i++) LK_TRY(lk_tb_logger_log_hparams_session(tbs[i], hp ? hp : ""));
        free(hp);
    }
    if (tr->config_yaml) {
        char path[LK_PATH + 16];
        snprintf(path, sizeof path, "%s/config.yaml", tr->log_dir);
        LK_TRY(lk_file_write_atomic(path, tr->config_yaml, strlen(tr->config_yaml)));
    }
    return LK_STATUS_OK;
}
