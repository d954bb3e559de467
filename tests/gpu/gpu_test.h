/* The gpu tests' common start: without a visible CUDA device they print
 * "no CUDA device" and exit 77, which tests/gpu/tests.cmake declares as
 * ctest's skip code, so a GPU-less machine reports them skipped. */
#ifndef LK_GPU_TEST_H
#define LK_GPU_TEST_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/builtin.h"
#include "device/gpu.h"

#define LK_GPU_SKIP 77

static inline void gpu_test_require(void) {
    if (lk__cuda_visible() == 0) {
        printf("no CUDA device: skipped (%s)\n", lk__cuda_why_none());
        exit(LK_GPU_SKIP);
    }
    if (lk__cuda_register()) {
        fprintf(stderr, "cuda device did not register: %s\n", lk_last_error());
        exit(1);
    }
}

/* Runs probe() in a child forked before anything touches CUDA (the child
 * owns the whole run), so that a host access of device memory or a kernel
 * fault is reported as the signal the child died of, naming `what`, rather
 * than killing the test silently. Returns the exit status for main. */
static inline int gpu_test_in_child(int (*probe)(void), const char *what) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    pid_t pid = fork();
    if (pid < 0) return perror("fork"), 1;
    if (pid == 0) _exit(probe());
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) return perror("waitpid"), 1;
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "FAIL %s died of signal %d (%s): an op touched device memory from the host, or a kernel "
                        "faulted\n", what, WTERMSIG(status), strsignal(WTERMSIG(status)));
        return 1;
    }
    return WEXITSTATUS(status);
}

#endif
