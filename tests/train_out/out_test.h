/* Helpers shared by the train_out tests: scratch directories under /tmp that
 * are removed afterwards, and whole-file reads. */
#ifndef LK_OUT_TEST_H
#define LK_OUT_TEST_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lk_test.h"
#include "train/loggers.h"

static int out_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes a scratch tree made by out_tmpdir. */
static inline void out_rm_rf(const char *dir) { nftw(dir, out_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* A fresh directory /tmp/lk_out_<tag>_XXXXXX in `buf`. */
static inline char *out_tmpdir(char *buf, size_t size, const char *tag) {
    snprintf(buf, size, "/tmp/lk_out_%s_XXXXXX", tag);
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(2);
    }
    return buf;
}

/* The whole file as a NUL-terminated string (malloc'd), NULL when unreadable. */
static inline char *out_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    if (p) p[n] = 0;
    if (len) *len = (size_t)n;
    fclose(f);
    return p;
}

#define CHECK_STR(got, want)                                                                   \
    do {                                                                                       \
        const char *lk_t_g = (got), *lk_t_w = (want);                                          \
        if (!lk_t_g || strcmp(lk_t_g, lk_t_w) != 0) {                                          \
            fprintf(stderr, "%s:%d: CHECK_STR failed for %s:\n--- got ---\n%s\n--- want ---\n%s\n", \
                    __FILE__, __LINE__, #got, lk_t_g ? lk_t_g : "(null)", lk_t_w);             \
            lk_t_failed_checks++;                                                              \
            lk_t_case_failed = 1;                                                              \
        }                                                                                      \
    } while (0)

#endif
