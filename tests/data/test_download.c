/* lk_data_download against servers the test runs itself: file:// URLs,
 * Python's http.server on a loopback port (200 and 404) and a socket that
 * accepts connections but never answers (the timeout). A failed download
 * must leave no file behind. Skips what the build or machine cannot do. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"

static char dir[256];

static const char *path(const char *name) {
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static bool built_with_curl(void) {
    lk_status st = lk_data_download("file:///nonexistent", path("x"), 5);
    return !(st == LK_STATUS_UNSUPPORTED && strstr(lk_last_error(), "without libcurl"));
}

static bool same_file(const char *a, const char *b) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    return system(cmd) == 0;
}

/* A loopback socket listening on a free port; returns its fd. */
static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK), .sin_port = 0};
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 8) || getsockname(fd, (struct sockaddr *)&a, &n)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static void file_urls(void) {
    if (!built_with_curl()) {
        printf("skip: built without libcurl\n");
        return;
    }
    char url[600];
    FILE *f = fopen(path("src.bin"), "wb");
    for (int i = 0; i < 100000; i++) fputc(i * 7, f);
    fclose(f);
    snprintf(url, sizeof url, "file://%s", path("src.bin"));
    CHECK_OK(lk_data_download(url, path("dst.bin"), 10));
    CHECK(same_file(path("src.bin"), path("dst.bin")));
    snprintf(url, sizeof url, "file://%s", path("missing.bin"));
    CHECK_ERR(lk_data_download(url, path("m.bin"), 10), LK_STATUS_IO, "missing.bin");
    CHECK(access(path("m.bin"), F_OK) != 0);
    CHECK_ERR(lk_data_download("file:///etc/hostname", "/nonexistent-dir/x", 10), LK_STATUS_IO, "/nonexistent-dir/x");
}

static void http_server(void) {
    if (!built_with_curl()) return;
    if (system("python3 -c 'import http.server' >/dev/null 2>&1") != 0) {
        printf("skip: no python3 for the HTTP server\n");
        return;
    }
    FILE *f = fopen(path("data.bin"), "wb");
    for (int i = 0; i < 300000; i++) fputc(i * 13, f);
    fclose(f);
    int port = 0, fd = listen_any(&port);
    CHECK(fd >= 0);
    close(fd); /* the port is free again for the server (a small race, retried below) */
    pid_t pid = fork();
    if (pid == 0) {
        char p[16];
        snprintf(p, sizeof p, "%d", port);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive a test killed by its timeout */
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execlp("python3", "python3", "-m", "http.server", p, "--bind", "127.0.0.1", "--directory", dir, (char *)NULL);
        _exit(127);
    }
    char url[600];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/data.bin", port);
    lk_status st = LK_STATUS_IO;
    for (int tries = 0; tries < 100 && st; tries++) { /* the server takes a moment to start */
        st = lk_data_download(url, path("got.bin"), 10);
        if (st) usleep(100000);
    }
    CHECK_OK(st);
    CHECK(same_file(path("data.bin"), path("got.bin")));
    snprintf(url, sizeof url, "http://127.0.0.1:%d/nope.bin", port);
    CHECK_ERR(lk_data_download(url, path("nope.bin"), 10), LK_STATUS_IO, "the server answered HTTP 404");
    CHECK(access(path("nope.bin"), F_OK) != 0);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

static void timeout(void) {
    if (!built_with_curl()) return;
    int port = 0, fd = listen_any(&port); /* accepts (the kernel does) but never answers */
    CHECK(fd >= 0);
    char url[100];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/slow", port);
    double t0 = lk_time_now();
    CHECK_ERR(lk_data_download(url, path("slow.bin"), 1), LK_STATUS_TIMEOUT, "timed out after 1 s");
    CHECK(lk_time_now() - t0 < 10);
    CHECK(access(path("slow.bin"), F_OK) != 0);
    close(fd);
}

static void mnist_download(void) {
    if (!built_with_curl() || access("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", R_OK) != 0) {
        printf("skip: no libcurl or no local Fashion-MNIST to serve\n");
        return;
    }
    /* Serve the installed copy through file://; put a bad file in the way of a second fetch. */
    CHECK_OK(lk_data_mnist_download(dir, "file:///usr/share/datasets/fashion-mnist", 30));
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_mnist_create(dir, "test", &ds));
    CHECK(ds && lk_dataset_len(ds) == 10000);
    lk_dataset_free(ds);
    CHECK_OK(lk_data_mnist_download(dir, "file:///nonexistent", 30)); /* all present: nothing fetched */
    char sub[400];
    snprintf(sub, sizeof sub, "%s/bad", dir);
    CHECK(mkdir(sub, 0700) == 0);
    snprintf(sub, sizeof sub, "%s/bad/srv", dir);
    CHECK(mkdir(sub, 0700) == 0);
    for (int i = 0; i < 4; i++) {
        static const char *const n[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
        char p[600];
        snprintf(p, sizeof p, "%s/%s", sub, n[i]);
        FILE *f = fopen(p, "w");
        fputs("<html>proxy error</html>", f);
        fclose(f);
    }
    char url[500];
    snprintf(url, sizeof url, "file://%s/", sub);
    snprintf(sub, sizeof sub, "%s/bad", dir);
    CHECK_ERR(lk_data_mnist_download(sub, url, 30), LK_STATUS_INVALID_ARGUMENT, "is not valid idx data");
    char p[600];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", sub);
    CHECK(access(p, F_OK) != 0);
}

static void setup_dir(void) {
    snprintf(dir, sizeof dir, "/tmp/lk_data_dl_XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
}

static void cleanup_dir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup_dir), LK_TEST_CASE(file_urls), LK_TEST_CASE(http_server), LK_TEST_CASE(timeout), LK_TEST_CASE(mnist_download),
             LK_TEST_CASE(cleanup_dir))
