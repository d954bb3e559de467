/* Rank-aware logging: one line per call, written whole so ranks that share
 * a terminal do not interleave inside a line. The lowest file of the core
 * that says anything: env.c warns about bad LK_ values through it, so it
 * reads its one variable, LK_LOG_LEVEL (declared in env.c's table with the
 * others), with getenv itself and says a bad value itself, once, rather
 * than through env.c (which would make the two need each other). */
#include "lockstep/core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int log_rank = -1;
static int log_world = 0;
static int log_level = -1; /* -1: read LK_LOG_LEVEL on first use */
static const char *log_level_from = "default";
static _Atomic int level_warned;

void lk_log_set_rank(int rank, int world_size) {
    log_rank = rank;
    log_world = world_size;
}
int lk_log_rank(void) { return log_rank; }
void lk_log_set_level(lk_log_level level) {
    log_level = (int)level;
    log_level_from = "lk_log_set_level";
}

lk_log_level lk_log_get_level(void) {
    if (log_level < 0) {
        static const char *const names[] = {"debug", "info", "warn", "error", "off"};
        log_level = LK_LOG_INFO; /* set first: the warning below logs */
        const char *s = getenv("LK_LOG_LEVEL");
        if (s && *s) { /* set and not empty: what lk_env_is_set means */
            int found = -1;
            for (int i = 0; i < 5; i++)
                if (!strcmp(s, names[i])) found = i;
            if (found >= 0) {
                log_level = found;
                log_level_from = "LK_LOG_LEVEL";
            } else if (!atomic_exchange(&level_warned, 1)) { /* once, as env.c says a bad value */
                lk_warn0("LK_LOG_LEVEL=%s is none of debug, info, warn, error, off: "
                         "ignored, as if it were unset (info)", s);
            }
        }
    }
    return (lk_log_level)log_level;
}

const char *lk__log_level_from(void) {
    lk_log_get_level();
    return log_level_from;
}

void lk_logf(lk_log_level level, bool rank0_only, const char *fmt, ...) {
    if (level < lk_log_get_level()) return;
    if (rank0_only && log_rank > 0) return;
    char line[4096];
    size_t n = 0;
    static const char *const tags[] = {"debug: ", "", "warning: ", "error: ", ""};
    if (log_rank >= 0 && log_world > 1 && !rank0_only)
        n = (size_t)snprintf(line, sizeof line, "[rank %d] ", log_rank);
    n += (size_t)snprintf(line + n, sizeof line - n, "%s", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    if (n < sizeof line) n += (size_t)vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    if (n >= sizeof line - 1) n = sizeof line - 2;
    if (n == 0 || line[n - 1] != '\n') line[n++] = '\n';
    /* One write(2): lines from different ranks stay whole. */
    ssize_t w = write(level >= LK_LOG_WARN ? 2 : 1, line, n);
    (void)w;
}
