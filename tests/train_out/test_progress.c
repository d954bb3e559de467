/* train_out: the progress display's exact text with an injected clock:
 * plain lines (CI logs), the in-place bar (throttling, width, eval bars that
 * give the epoch's bar back, printing without breaking it), and the real
 * terminal path through a pseudo-terminal (openpty) and `script`. */
#include <poll.h>
#include <pty.h>

#include "out_test.h"

static double fake_now;
static double fake_clock(void) { return fake_now; }

static int make_width = 80;
static lk_progress *make(FILE *f, lk_progress_mode mode, int every) {
    lk_progress_options o = lk_progress_options_default();
    o.out = f;
    o.mode = mode;
    o.every_n_steps = every;
    o.width = make_width;
    o.ascii = 0;
    o.clock = fake_clock;
    lk_progress *p = NULL;
    CHECK_OK(lk_progress_create(&o, &p));
    return p;
}

static const char *loss_name[] = {"train_loss"};
static const char *end_names[] = {"train_loss", "val_loss"};
static const char *val_names[] = {"val_loss", "val_acc"};

/* One epoch of 5 steps, 0.5 s each, with validation after step 5. */
static void run_epoch(lk_progress *p) {
    fake_now = 100;
    lk_progress_begin_epoch(p, 2, 10, 5);
    for (int i = 1; i <= 5; i++) {
        fake_now += 0.5;
        double loss = 1.0 / i;
        lk_progress_update(p, i, loss_name, &loss, 1);
    }
    lk_progress_begin_eval(p, "Validation", 3);
    for (int i = 1; i <= 3; i++) {
        fake_now += 0.25;
        lk_progress_update_eval(p, i);
    }
    double v[] = {0.0225, 0.8853};
    lk_progress_end_eval(p, val_names, v, 2);
    lk_progress_printf(p, "a note for the log");
    double e[] = {0.2, 0.0225};
    lk_progress_end_epoch(p, end_names, e, 2);
}

static void lines_mode(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    lk_progress *p = make(f, LK_PROGRESS_AUTO, 2); /* a memory stream is no terminal */
    CHECK(!lk_progress_is_bar(p));
    run_epoch(p);
    /* unknown length and no max_epochs */
    fake_now = 200;
    lk_progress_begin_epoch(p, 0, -1, -1);
    fake_now = 201;
    double loss = 1e-5;
    lk_progress_update(p, 2, loss_name, &loss, 1);
    lk_progress_end_epoch(p, NULL, NULL, 0);
    /* a standalone test loop */
    lk_progress_begin_eval(p, "Testing", 4);
    fake_now = 203;
    lk_progress_update_eval(p, 4);
    const char *tn[] = {"test_loss"};
    double tv = 123456.0;
    lk_progress_end_eval(p, tn, &tv, 1);
    lk_progress_free(p);
    fclose(f);
    CHECK_STR(buf, "epoch 3/10 step 2/5 (40%) 2.0 it/s train_loss=0.5\n"
                   "epoch 3/10 step 4/5 (80%) 2.0 it/s train_loss=0.25\n"
                   "Validation epoch 3/10: 3 batches in 00:00 (4.0 it/s) val_loss=0.0225 val_acc=0.8853\n"
                   "a note for the log\n"
                   "epoch 3/10 done 5 steps in 00:03 (1.5 it/s) train_loss=0.2 val_loss=0.0225\n"
                   "epoch 1 step 2 2.0 it/s train_loss=1e-5\n"
                   "epoch 1 done 2 steps in 00:01 (2.0 it/s) train_loss=1e-5\n"
                   "Testing: 4 batches in 00:02 (2.0 it/s) test_loss=1.235e5\n");
    free(buf);
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Display columns of each redraw stay below the terminal width. */
static void check_widths(const char *s, int width) {
    for (const char *p = s; (p = strchr(p, '\r'));) {
        p++;
        int cols = 0;
        const char *q = p;
        for (; *q && *q != '\r' && *q != '\n' && *q != '\033'; q++) cols += ((unsigned char)*q & 0xC0) != 0x80;
        CHECK_MSG(cols < width, "redraw of %d columns: %.*s", cols, (int)(q - p), p);
    }
}

static void bar_mode(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    make_width = 100;
    lk_progress *p = make(f, LK_PROGRESS_BAR, 2);
    make_width = 80;
    CHECK(lk_progress_is_bar(p));
    run_epoch(p);
    lk_progress_free(p);
    fclose(f);
    /* the bar after step 2 of 5 */
    CHECK_MSG(strstr(buf, "\rEpoch 3/10  40%|████████            | 2/5 "
                          "[00:01<00:01, 2.0 it/s, train_loss=0.5]\033[K") != NULL, "%s", buf);
    CHECK(strstr(buf, "\rEpoch 3/10  20%|████                | 1/5 [00:00<00:02, 2.0 it/s, train_loss=1]\033[K"));
    /* validation replaces it, then it comes back with the note above it */
    CHECK(strstr(buf, "\rValidation 100%|") != NULL);
    CHECK(strstr(buf, "| 3/3 [00:00<00:00, 4.0 it/s]\033[K") != NULL);
    CHECK(strstr(buf, "\r\033[Ka note for the log\n\rEpoch 3/10 100%|") != NULL);
    /* the epoch ends with its final metrics and a newline */
    const char *end = "\rEpoch 3/10 100%|████████████████████| 5/5 [00:03<00:00, 1.5 it/s, train_loss=0.2, "
                      "val_loss=0.0225]\033[K\n";
    CHECK_MSG(strlen(buf) >= strlen(end) && !strcmp(buf + strlen(buf) - strlen(end), end), "%s", buf);
    check_widths(buf, 100);
    free(buf);

    /* throttling: 1000 updates within 0.5 s draw at most ~6 times; the last step always draws */
    buf = NULL;
    f = open_memstream(&buf, &len);
    fake_now = 0;
    lk_progress_begin_epoch(p = make(f, LK_PROGRESS_BAR, 2), 0, 1, 1000);
    for (int i = 1; i <= 1000; i++) {
        fake_now += 0.0005;
        lk_progress_update(p, i, NULL, NULL, 0);
    }
    lk_progress_end_epoch(p, NULL, NULL, 0);
    lk_progress_free(p);
    fclose(f);
    int draws = count(buf, "\rEpoch");
    CHECK_MSG(draws >= 5 && draws <= 8, "%d redraws", draws);
    CHECK(strstr(buf, "1000/1000") != NULL);
    free(buf);

    /* many metrics: cut at the width, never wrapped */
    buf = NULL;
    f = open_memstream(&buf, &len);
    p = make(f, LK_PROGRESS_BAR, 2);
    const char *names[] = {"train_loss", "val_loss", "val_acc", "lr", "grad_norm", "tokens_per_s", "mem"};
    double vals[] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7};
    fake_now = 0;
    lk_progress_begin_epoch(p, 0, 3, 10);
    fake_now = 1;
    lk_progress_update(p, 3, names, vals, 7);
    lk_progress_free(p); /* ends the bar's line */
    fclose(f);
    check_widths(buf, 80);
    CHECK(buf[strlen(buf) - 1] == '\n');
    free(buf);

    /* OFF prints nothing but printf lines */
    buf = NULL;
    f = open_memstream(&buf, &len);
    p = make(f, LK_PROGRESS_OFF, 2);
    run_epoch(p);
    lk_progress_free(p);
    fclose(f);
    CHECK_STR(buf, "a note for the log\n");
    free(buf);

    /* ASCII terminals get '#' */
    buf = NULL;
    f = open_memstream(&buf, &len);
    lk_progress_options o = lk_progress_options_default();
    o.out = f;
    o.mode = LK_PROGRESS_BAR;
    o.width = 80;
    o.ascii = 1;
    o.clock = fake_clock;
    CHECK_OK(lk_progress_create(&o, &p));
    fake_now = 0;
    lk_progress_begin_epoch(p, 0, 1, 8);
    fake_now = 1;
    lk_progress_update(p, 3, NULL, NULL, 0);
    lk_progress_free(p);
    fclose(f);
    CHECK_MSG(strstr(buf, "\rEpoch 1/1  37%|#######             | 3/8 [00:01<00:01, 3.0 it/s]\033[K\n"), "%s", buf);
    free(buf);
}

/* The AUTO mode on a real (pseudo-)terminal draws the bar. */
static void pty_mode(void) {
    int master, slave;
    if (openpty(&master, &slave, NULL, NULL, NULL) != 0) {
        printf("skipped: openpty failed\n");
        return;
    }
    FILE *f = fdopen(slave, "w");
    lk_progress_options o = lk_progress_options_default();
    o.out = f;
    o.clock = fake_clock;
    lk_progress *p = NULL;
    CHECK_OK(lk_progress_create(&o, &p));
    CHECK(lk_progress_is_bar(p));
    fake_now = 0;
    lk_progress_begin_epoch(p, 0, 2, 4);
    fake_now = 1;
    double loss = 0.5;
    lk_progress_update(p, 4, loss_name, &loss, 1);
    lk_progress_end_epoch(p, NULL, NULL, 0);
    lk_progress_free(p);
    fclose(f);
    /* the pty hands the bytes over in pieces: read until it stays quiet */
    char out[4096];
    size_t got = 0;
    struct pollfd pfd = {master, POLLIN, 0};
    while (got < sizeof out - 1 && poll(&pfd, 1, 200) > 0) {
        ssize_t n = read(master, out + got, sizeof out - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(master);
    out[got] = 0;
    CHECK_MSG(strstr(out, "Epoch 1/2 100%|") != NULL && strstr(out, "4/4 [00:01<00:00, 4.0 it/s, train_loss=0.5]"),
              "%s", out);
}

/* Run by script_tty inside `script`: AUTO mode on the stdout it was given. */
static void tty_child(void) {
    if (!getenv("LK_OUT_TTY_CHILD")) return;
    lk_progress *p = NULL;
    lk_progress_options o = lk_progress_options_default();
    o.clock = fake_clock;
    CHECK_OK(lk_progress_create(&o, &p));
    fake_now = 0;
    lk_progress_begin_epoch(p, 1, 2, 8);
    fake_now = 2;
    double loss = 0.25;
    lk_progress_update(p, 8, loss_name, &loss, 1);
    lk_progress_end_epoch(p, NULL, NULL, 0);
    lk_progress_free(p);
}

static void script_tty(void) {
    if (access("/usr/bin/script", X_OK) != 0) {
        printf("skipped: no /usr/bin/script\n");
        return;
    }
    char self[4096], cmd[8400];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    /* under script stdout is a terminal: the bar; through a pipe: plain lines */
    snprintf(cmd, sizeof cmd, "LK_OUT_TTY_CHILD=1 /usr/bin/script -q -e -c '%s tty_child' /dev/null </dev/null", self);
    FILE *p = popen(cmd, "r");
    char out[8192] = "";
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = 0;
    CHECK(pclose(p) == 0);
    CHECK_MSG(strstr(out, "\rEpoch 2/2 100%|") && strstr(out, "8/8 [00:02<00:00, 4.0 it/s, train_loss=0.25]"), "%s",
              out);
    snprintf(cmd, sizeof cmd, "LK_OUT_TTY_CHILD=1 '%s' tty_child", self);
    p = popen(cmd, "r");
    got = fread(out, 1, sizeof out - 1, p);
    out[got] = 0;
    CHECK(pclose(p) == 0);
    CHECK_MSG(strstr(out, "epoch 2/2 done 8 steps in 00:02 (4.0 it/s) train_loss=0.25\n") && !strchr(out, '\r'), "%s",
              out);
}

LK_TEST_MAIN(LK_TEST_CASE(lines_mode), LK_TEST_CASE(bar_mode), LK_TEST_CASE(pty_mode), LK_TEST_CASE(tty_child),
             LK_TEST_CASE(script_tty))
