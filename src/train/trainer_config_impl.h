/* Private to the trainer's config (trainer_config.c, config_classes.c): the
 * helpers both halves use and the class_path lists' entry points. */
#ifndef LK_TRAINER_CONFIG_IMPL_H
#define LK_TRAINER_CONFIG_IMPL_H

#include "lockstep/config.h"
#include "lockstep/trainer.h"

/* An INVALID_ARGUMENT error that starts with the node's FILE:LINE:COL. */
lk_status lk__cfg_at(const lk_config_node *n, const char *fmt, ...);
/* "00:01:30:00", "90" (seconds) or {days: 1, hours: 2, ...} (Python's
 * timedelta arguments) -> seconds; a null node is 0. */
lk_status lk__cfg_parse_duration(const lk_config_node *n, const char *what, double *out);
/* As lk__cfg_parse_duration; hms: "H:MM:SS" too (str(timedelta), a DDPStrategy timeout). */
lk_status lk__cfg_parse_duration_hms(const lk_config_node *n, const char *what, bool hms, double *out);
/* trainer.callbacks' and trainer.logger's entry `e` (a class_path map, or a
 * bare class name) into cfg; `what` names it in errors ("trainer.callbacks[2]"). */
lk_status lk__cfg_apply_callback(const lk_config_node *e, const char *what, lk_trainer_config *cfg);
lk_status lk__cfg_apply_logger(const lk_config_node *e, const char *what, lk_trainer_config *cfg);

#endif
