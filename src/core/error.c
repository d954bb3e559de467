/* Status strings, the per-thread last error and its LK_TRY trace, and the
 * panic path for broken internal invariants. */
#include "lockstep/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_strs[] = {
#define LK__STATUS_STR(name, str) str,
    LK_STATUS_LIST(LK__STATUS_STR)
#undef LK__STATUS_STR
};

const char *lk_status_str(lk_status s) {
    if ((unsigned)s >= LK_STATUS_COUNT_) return "unknown status";
    return status_strs[s];
}

static _Thread_local char err_msg[2048];
static _Thread_local char err_trace[1024];
static _Thread_local lk_status err_code;

lk_status lk_errorv(lk_status code, const char *fmt, va_list ap) {
    int rank = lk_log_rank();
    char body[sizeof err_msg - 32];
    vsnprintf(body, sizeof body, fmt, ap);
    /* A message passed on from another error already names its rank, at
     * its start or after the context a caller put in front of it ("checkpoint
     * X: [rank 0] ..."): said once, first. */
    char prefix[32] = "";
    if (rank >= 0) snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    size_t pl = strlen(prefix);
    for (char *in = pl && body[0] ? strstr(body + 1, prefix) : NULL; in; in = strstr(in, prefix))
        memmove(in, in + pl, strlen(in + pl) + 1);
    if (prefix[0] && strncmp(body, prefix, strlen(prefix)) != 0)
        snprintf(err_msg, sizeof err_msg, "%s%s", prefix, body);
    else
        snprintf(err_msg, sizeof err_msg, "%s", body);
    err_trace[0] = 0;
    err_code = code;
    return code;
}

lk_status lk_error(lk_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    lk_errorv(code, fmt, ap);
    va_end(ap);
    return code;
}

const char *lk_last_error(void) { return err_msg; }
lk_status lk_last_status(void) { return err_code; }
const char *lk_last_error_trace(void) { return err_trace; }

void lk_clear_error(void) {
    err_msg[0] = 0;
    err_trace[0] = 0;
    err_code = LK_STATUS_OK;
}

void lk__list_add(char *buf, size_t size, int *n, const char *sep, const char *fmt, ...) {
    size_t len = strlen(buf);
    if (len + 120 < size) { /* an item that would not fit whole is left to the count */
        len += (size_t)snprintf(buf + len, size - len, "%s", *n ? sep : "");
        va_list ap;
        va_start(ap, fmt);
        if (len < size) vsnprintf(buf + len, size - len, fmt, ap);
        va_end(ap);
    }
    (*n)++;
}

void lk__error_trace(const char *file, int line) {
    size_t n = strlen(err_trace);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (n + 2 < sizeof err_trace)
        snprintf(err_trace + n, sizeof err_trace - n, "%s%s:%d", n ? " <- " : "", base, line);
}

static lk_panic_hook panic_hook;
void lk_set_panic_hook(lk_panic_hook hook) { panic_hook = hook; }

LK_NORETURN void lk__panic(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int rank = lk_log_rank();
    if (rank >= 0)
        fprintf(stderr, "[rank %d] lockstep internal error at %s:%d: %s\n", rank, file, line, msg);
    else
        fprintf(stderr, "lockstep internal error at %s:%d: %s\n", file, line, msg);
    if (panic_hook) panic_hook(msg);
    abort();
}
