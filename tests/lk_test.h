/* A minimal test harness: CHECK macros that report file, line and values,
 * and a main that runs the listed cases and prints "N passed, N failed". */
#ifndef LK_TEST_H
#define LK_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep.h"

static int lk_t_failed_checks;
static int lk_t_case_failed;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
            lk_t_failed_checks++;                                                     \
            lk_t_case_failed = 1;                                                     \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            lk_t_failed_checks++;                                                     \
            lk_t_case_failed = 1;                                                     \
        }                                                                             \
    } while (0)

/* The call must succeed; on failure print the library's message. */
#define CHECK_OK(call)                                                                \
    do {                                                                              \
        lk_status lk_t_st = (call);                                                   \
        if (lk_t_st != LK_STATUS_OK) {                                                \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,  \
                    lk_status_str(lk_t_st), lk_last_error());                         \
            lk_t_failed_checks++;                                                     \
            lk_t_case_failed = 1;                                                     \
        }                                                                             \
    } while (0)

/* The call must fail with `code` and its message must contain `needle`. */
#define CHECK_ERR(call, code, needle)                                                 \
    do {                                                                              \
        lk_clear_error();                                                             \
        lk_status lk_t_st = (call);                                                   \
        if (lk_t_st != (code) || !strstr(lk_last_error(), (needle))) {                \
            fprintf(stderr, "%s:%d: %s: expected %s containing \"%s\", got %s: \"%s\"\n", \
                    __FILE__, __LINE__, #call, lk_status_str(code), (needle),         \
                    lk_status_str(lk_t_st), lk_last_error());                         \
            lk_t_failed_checks++;                                                     \
            lk_t_case_failed = 1;                                                     \
        }                                                                             \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
    do {                                                                              \
        double lk_t_a = (double)(a), lk_t_b = (double)(b);                            \
        if (!(fabs(lk_t_a - lk_t_b) <= (tol))) {                                      \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g (tol %g)\n", \
                    __FILE__, __LINE__, #a, lk_t_a, #b, lk_t_b, (double)(tol));       \
            lk_t_failed_checks++;                                                     \
            lk_t_case_failed = 1;                                                     \
        }                                                                             \
    } while (0)

typedef struct {
    const char *name;
    void (*fn)(void);
} lk_t_case;

#define LK_TEST_CASE(fn) {#fn, fn}

/* Runs every case (or only those named on the command line). */
static inline int lk_t_run(const lk_t_case *cases, int n, int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++) want |= !strcmp(argv[a], cases[i].name);
            if (!want) continue;
        }
        lk_t_case_failed = 0;
        lk_clear_error();
        cases[i].fn();
        if (lk_t_case_failed) {
            failed++;
            fprintf(stderr, "FAIL %s\n", cases[i].name);
        } else {
            passed++;
            printf("ok   %s\n", cases[i].name);
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define LK_TEST_MAIN(...)                                                             \
    int main(int argc, char **argv) {                                                 \
        static const lk_t_case cases[] = {__VA_ARGS__};                               \
        return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);    \
    }

#endif
