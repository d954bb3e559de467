/* core: growable arrays (lk_vec_reserve: growth, int and size_t capacities,
 * allocation failure leaving the array as it was) and files written
 * atomically (lk_file_write_atomic, lk_file_mkdirs, lk_file_remove_stale_tmp). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"

typedef struct {
    double x;
    int tag;
} item;

static void vec_grows_by_doubling(void) {
    item *v = NULL;
    int n = 0, cap = 0;
    for (int i = 0; i < 100; i++) {
        if (n == cap) CHECK_OK(lk_vec_reserve(v, cap, n + 1, 16));
        v[n++] = (item){i * 0.5, i};
    }
    CHECK(cap == 128); /* 16, 32, 64, 128: the hand-written loops' growth */
    for (int i = 0; i < n; i++) CHECK(v[i].tag == i && v[i].x == i * 0.5);
    /* enough room already: no allocation */
    uint64_t before = lk_alloc_count();
    CHECK_OK(lk_vec_reserve(v, cap, 100, 16));
    CHECK(lk_alloc_count() == before && cap == 128);
    /* a jump doubles until it fits, with one allocation */
    CHECK_OK(lk_vec_reserve(v, cap, 1000, 16));
    CHECK(cap == 1024 && lk_alloc_count() == before + 1);
    CHECK(v[99].tag == 99);
    lk_free(v);

    unsigned char *b = NULL;
    size_t bcap = 0;
    CHECK_OK(lk_vec_reserve(b, bcap, 5000, 4096));
    CHECK(bcap == 8192);
    memset(b, 7, bcap);
    lk_free(b);
}

static void vec_failure_keeps_the_array(void) {
    int *v = NULL;
    int cap = 0;
    CHECK_OK(lk_vec_reserve(v, cap, 3, 4));
    v[0] = 11, v[1] = 22, v[2] = 33;
    int *old = v;
    lk_alloc_fail_after(1);
    CHECK_ERR(lk_vec_reserve(v, cap, 5, 4), LK_STATUS_OUT_OF_MEMORY, "out of memory");
    CHECK(v == old && cap == 4 && v[2] == 33);
    lk_alloc_fail_after(0);
    /* a count that cannot fit an int capacity is refused, not wrapped */
    CHECK_ERR(lk_vec_reserve(v, cap, (size_t)1 << 40, 4), LK_STATUS_OUT_OF_MEMORY, "too many");
    CHECK(v == old && cap == 4);
    lk_free(v);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void files_atomic(void) {
    char root[] = "/tmp/lk_fileio_XXXXXX";
    CHECK(mkdtemp(root) != NULL);
    char dir[512], path[600], tmp[700];
    snprintf(dir, sizeof dir, "%s/a/b/c", root);
    CHECK_OK(lk_file_mkdirs(dir));
    CHECK_OK(lk_file_mkdirs(dir)); /* existing is fine */
    snprintf(path, sizeof path, "%s/out.txt", dir);
    CHECK_OK(lk_file_write_atomic(path, "hello\n", 6));
    CHECK(slurp(path) && !strcmp(slurp(path), "hello\n"));
    CHECK_OK(lk_file_write_atomic(path, "again\n", 6));
    CHECK(!strcmp(slurp(path), "again\n"));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(access(tmp, F_OK) != 0); /* no temporary left after success */
    /* a file in the way of a directory */
    snprintf(tmp, sizeof tmp, "%s/x", path);
    CHECK_ERR(lk_file_mkdirs(tmp), LK_STATUS_IO, "a file of that name exists");
    CHECK_ERR(lk_file_mkdirs(""), LK_STATUS_INVALID_ARGUMENT, "empty path");
    /* failure (the target is a directory) leaves no temporary behind */
    CHECK_ERR(lk_file_write_atomic(dir, "x", 1), LK_STATUS_IO, "cannot rename");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    CHECK(access(tmp, F_OK) != 0);

    /* a dead writer's temporary goes, a live one's (ours) stays */
    pid_t child = fork();
    if (child == 0) _exit(0);
    CHECK(child > 0 && waitpid(child, NULL, 0) == child);
    char dead[700], live[700];
    snprintf(dead, sizeof dead, "%s/out.txt.tmp.%ld", dir, (long)child);
    snprintf(live, sizeof live, "%s/out.txt.tmp.%ld", dir, (long)getppid());
    FILE *f = fopen(dead, "w");
    CHECK(f != NULL);
    fclose(f);
    CHECK((f = fopen(live, "w")) != NULL);
    fclose(f);
    CHECK(lk_file_remove_stale_tmp(dir) == 1);
    CHECK(access(dead, F_OK) != 0 && access(live, F_OK) == 0);
    CHECK(lk_file_remove_stale_tmp("/nonexistent/lk_fileio") == 0);
    unlink(live);
    unlink(path);
    for (int i = 0; i < 3; i++) { /* c, b, a */
        rmdir(dir);
        *strrchr(dir, '/') = 0;
    }
    rmdir(root);
}

LK_TEST_MAIN(LK_TEST_CASE(vec_grows_by_doubling), LK_TEST_CASE(vec_failure_keeps_the_array), LK_TEST_CASE(files_atomic))
