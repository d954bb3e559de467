/* What a piece of a test writes to stderr (a warning it must print):
 * lk_t_capture_begin sends fd 2 to a temporary file, lk_t_capture_end puts
 * fd 2 back and returns the first n - 1 bytes written in buf (NUL-ended),
 * the file removed. */
#ifndef LK_CAPTURE_H
#define LK_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    char path[32];
    int fd, saved;
} lk_t_capture;

static inline int lk_t_capture_begin(lk_t_capture *c) {
    snprintf(c->path, sizeof c->path, "/tmp/lk_stderr_XXXXXX");
    c->fd = mkstemp(c->path);
    c->saved = dup(2);
    if (c->fd < 0 || c->saved < 0) return -1;
    fflush(stderr);
    return dup2(c->fd, 2) < 0 ? -1 : 0;
}

static inline ssize_t lk_t_capture_end(lk_t_capture *c, char *buf, size_t n) {
    fflush(stderr);
    if (c->saved >= 0) dup2(c->saved, 2), close(c->saved);
    ssize_t got = c->fd >= 0 && n ? pread(c->fd, buf, n - 1, 0) : -1;
    if (n) buf[got > 0 ? got : 0] = 0;
    if (c->fd >= 0) close(c->fd), unlink(c->path);
    return got;
}

#endif
