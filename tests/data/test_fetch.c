/* SHA-256 known answers (FIPS 180-2 examples) and lk_data_fetch against a
 * local HTTP server started by the test: a good download, a corrupted one
 * (checksum mismatch: clear error, nothing left), an existing verified file
 * (no download), and a server that dies mid-transfer. Skips the HTTP part
 * when /usr/bin/python3 or libcurl is missing. */
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/data.h"

static void sha256_known_answers(void) {
    static const struct { const char *in; const char *hex; } kat[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    char hex[65];
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        lk_sha256 s;
        lk_sha256_init(&s);
        lk_sha256_update(&s, kat[i].in, strlen(kat[i].in));
        lk_sha256_final(&s, hex);
        CHECK_MSG(!strcmp(hex, kat[i].hex), "'%s': %s", kat[i].in, hex);
    }
    lk_sha256 s; /* one million 'a', fed in odd-sized pieces */
    lk_sha256_init(&s);
    char a[997];
    memset(a, 'a', sizeof a);
    size_t left = 1000000;
    while (left) {
        size_t k = left < sizeof a ? left : sizeof a;
        lk_sha256_update(&s, a, k);
        left -= k;
    }
    lk_sha256_final(&s, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
}

static pid_t spawn(char *const argv[]) {
    pid_t p = fork();
    if (p == 0) {
        int devnull = open("/dev/null", 1);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return p;
}

static void fetch_over_http(void) {
    if (access("/usr/bin/python3", X_OK) != 0) {
        printf("skip: no /usr/bin/python3 for the local HTTP server\n");
        return;
    }
    char dir[] = "/tmp/lkfetch.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512], dest[512], part[600], url[256];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 100000; i++) fputc(i * 7 % 251, f);
    fclose(f);
    char good[65];
    CHECK_OK(lk_sha256_file(path, good));
    int port = 20000 + (int)(getpid() % 20000);
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    pid_t srv = spawn((char *[]){"/usr/bin/python3", "-m", "http.server", ports, "--bind", "127.0.0.1", "--directory", dir, NULL});
    snprintf(url, sizeof url, "http://127.0.0.1:%d/data.bin", port);
    snprintf(dest, sizeof dest, "%s/out.bin", dir);
    snprintf(part, sizeof part, "%s.part", dest);
    lk_status st = LK_STATUS_IO;
    for (int i = 0; i < 100 && st; i++) { /* wait for the server */
        st = lk_data_fetch(url, dest, good, 10);
        if (st == LK_STATUS_UNSUPPORTED) break;
        if (st) usleep(100000);
    }
    if (st == LK_STATUS_UNSUPPORTED) {
        printf("skip: built without libcurl\n");
    } else {
        CHECK_OK(st);
        char got[65];
        CHECK(!lk_sha256_file(dest, got) && !strcmp(got, good));
        /* already there and verified: nothing is downloaded (the server is gone) */
        kill(srv, SIGTERM);
        waitpid(srv, NULL, 0);
        srv = 0;
        CHECK_OK(lk_data_fetch(url, dest, good, 2));
        /* corrupted: another checksum than the data has */
        srv = spawn((char *[]){"/usr/bin/python3", "-m", "http.server", ports, "--bind", "127.0.0.1", "--directory", dir, NULL});
        unlink(dest);
        char bad[65];
        memcpy(bad, good, 65);
        bad[0] = bad[0] == '0' ? '1' : '0';
        st = LK_STATUS_IO;
        for (int i = 0; i < 100; i++) {
            lk_clear_error();
            st = lk_data_fetch(url, dest, bad, 10);
            if (strstr(lk_last_error(), "corrupt")) break;
            usleep(100000);
        }
        CHECK_MSG(st == LK_STATUS_IO && strstr(lk_last_error(), "is corrupt: sha256"), "%s", lk_last_error());
        CHECK(access(dest, F_OK) != 0 && access(part, F_OK) != 0);
        kill(srv, SIGTERM);
        waitpid(srv, NULL, 0);
        /* a server that dies mid-transfer */
        char script[512];
        snprintf(script, sizeof script, "%s/tests/data/partial_server.py", LK_SOURCE_DIR);
        srv = spawn((char *[]){"/usr/bin/python3", script, ports, NULL});
        st = LK_STATUS_OK;
        for (int i = 0; i < 100; i++) {
            lk_clear_error();
            st = lk_data_fetch(url, dest, good, 10);
            if (st && !strstr(lk_last_error(), "onnect")) break; /* not "connection refused" */
            usleep(100000);
        }
        CHECK_MSG(st != LK_STATUS_OK, "a broken-off transfer was accepted");
        printf("mid-transfer death: %s\n", lk_last_error());
        CHECK(access(dest, F_OK) != 0 && access(part, F_OK) != 0);
    }
    if (srv > 0) {
        kill(srv, SIGTERM);
        waitpid(srv, NULL, 0);
    }
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    CHECK(system(rm) == 0);
}

LK_TEST_MAIN(LK_TEST_CASE(sha256_known_answers), LK_TEST_CASE(fetch_over_http))
