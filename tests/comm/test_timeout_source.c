/* comm_timeout and LK_COMM_TIMEOUT under the one precedence rule (a key the
 * config sets wins over the variable, which wins over the default), and the
 * timeout message naming where the bound that ran out came from. The
 * trainer config records the source (lk_trainer_config_default: the
 * variable; lk_trainer_config_apply: a key), the communicator carries it
 * into the message (lk_comm_config.timeout_from), and a value a program
 * assigned itself is said to be the program's. A stalled rank is a rank
 * that sleeps before the barrier: no signals, a fraction of a second. */
#include "dist_util.h"

#include "lockstep/config.h"
#include "lockstep/trainer.h"

/* ---- the trainer config ---------------------------------------------------- */

static void trainer_config_rule(void) {
    lk_trainer_config c;
    char from[LK_PARAM_STR];
    unsetenv("LK_COMM_TIMEOUT");
    CHECK_OK(lk_trainer_config_default(&c));
    CHECK(c.comm_timeout == 120 && !strcmp(c.comm_timeout_from, "default"));
    CHECK(!strcmp(lk_trainer_config_comm_timeout_from(&c, from, sizeof from), "default"));

    /* the variable alone fills the default */
    setenv("LK_COMM_TIMEOUT", "30", 1);
    CHECK_OK(lk_trainer_config_default(&c));
    CHECK_MSG(c.comm_timeout == 30 && !strcmp(c.comm_timeout_from, "LK_COMM_TIMEOUT"), "%g from %s", c.comm_timeout,
              c.comm_timeout_from);

    /* a key in a config file wins over it, and says where it was written */
    lk_config *cfg = lk_config_create();
    const char *yaml = "trainer:\n  max_epochs: 1\n  comm_timeout: 7\n";
    CHECK_OK(lk_config_load_string(cfg, yaml, strlen(yaml), "run.yaml"));
    CHECK_OK(lk_trainer_config_apply(lk_config_get(cfg, "trainer"), &c));
    CHECK_MSG(c.comm_timeout == 7 && !strcmp(lk_trainer_config_comm_timeout_from(&c, from, sizeof from),
                                             "trainer.comm_timeout in run.yaml:3:17"),
              "%g from %s", c.comm_timeout, from);
    /* ... and so does a command-line override, named as one */
    CHECK_OK(lk_trainer_config_default(&c));
    CHECK_OK(lk_config_set_override(cfg, "trainer.comm_timeout", "9"));
    CHECK_OK(lk_trainer_config_apply(lk_config_get(cfg, "trainer"), &c));
    CHECK_MSG(c.comm_timeout == 9 && !strcmp(c.comm_timeout_from, "--trainer.comm_timeout on the command line"), "%g from %s",
              c.comm_timeout, c.comm_timeout_from);
    lk_config_free(cfg);

    /* a config without the key leaves the variable's value */
    cfg = lk_config_create();
    yaml = "trainer:\n  max_epochs: 1\n";
    CHECK_OK(lk_config_load_string(cfg, yaml, strlen(yaml), "other.yaml"));
    CHECK_OK(lk_trainer_config_default(&c));
    CHECK_OK(lk_trainer_config_apply(lk_config_get(cfg, "trainer"), &c));
    CHECK(c.comm_timeout == 30 && !strcmp(c.comm_timeout_from, "LK_COMM_TIMEOUT"));
    lk_config_free(cfg);

    /* a program that assigns the value itself is named as its source */
    c.comm_timeout = 45;
    CHECK_MSG(!strcmp(lk_trainer_config_comm_timeout_from(&c, from, sizeof from), "trainer.comm_timeout (set by the program)"),
              "%s", from);

    /* a variable outside the key's bounds, or not a number, is ignored (and said once) */
    setenv("LK_COMM_TIMEOUT", "0", 1);
    CHECK_OK(lk_trainer_config_default(&c));
    CHECK(c.comm_timeout == 120 && !strcmp(c.comm_timeout_from, "default"));
    setenv("LK_COMM_TIMEOUT", "soon", 1);
    CHECK_OK(lk_trainer_config_default(&c));
    CHECK(c.comm_timeout == 120 && !strcmp(c.comm_timeout_from, "default"));
    unsetenv("LK_COMM_TIMEOUT");
}

static void comm_config_default(void) {
    unsetenv("LK_COMM_TIMEOUT");
    CHECK(lk_comm_config_default().timeout_s == 120);
    setenv("LK_COMM_TIMEOUT", "2.5", 1);
    CHECK(lk_comm_config_default().timeout_s == 2.5);
    setenv("LK_COMM_TIMEOUT", "-1", 1);
    CHECK(lk_comm_config_default().timeout_s == 120);
    unsetenv("LK_COMM_TIMEOUT");
}

/* ---- the message of a timeout ------------------------------------------------ */

typedef struct {
    double timeout_s;    /* rank 0's bound; 0: lk_comm_config_default's */
    const char *from;    /* lk_comm_config.timeout_from */
} stall_case;

/* Rank 1 arrives 1.5 s late; rank 0's barrier times out first. */
static int stall_rank(int r, int W, void *arg) {
    const stall_case *sc = arg;
    lk_comm_config cfg = lk_comm_config_default();
    lk_pg_info pg = du_pg(r, W);
    cfg.pg = &pg;
    cfg.backend = "shm";
    cfg.shared_bytes = 1u << 20;
    if (r == 0) {
        if (sc->timeout_s > 0) cfg.timeout_s = sc->timeout_s;
        cfg.timeout_from = sc->from;
    } else {
        cfg.timeout_s = 10;
    }
    lk_comm *c;
    if (lk_comm_create(&cfg, &c)) {
        du->status[r] = lk_last_status();
        snprintf(du->msg[r], sizeof du->msg[r], "%s", lk_last_error());
        return 1;
    }
    if (r == 1) usleep(1500000);
    lk_status st = lk_comm_barrier(c);
    du->status[r] = st;
    snprintf(du->msg[r], sizeof du->msg[r], "%s", lk_last_error());
    lk_comm_free(c);
    return 0;
}

static void expect_message(stall_case sc, const char *want) {
    du_map();
    int codes[DU_MAXW] = {-1, -1};
    du_run(2, stall_rank, &sc, 20, codes, NULL);
    CHECK_MSG(codes[0] == 0 && du->status[0] == LK_STATUS_TIMEOUT, "rank 0: exit %d, %s: %s", codes[0],
              lk_status_str(du->status[0]), du->msg[0]);
    CHECK_MSG(strstr(du->msg[0], want) && !strstr(du->msg[0], "(comm_timeout, LK_COMM_TIMEOUT)"), "wanted \"%s\" in: %s",
              want, du->msg[0]);
    printf("     %s\n", du->msg[0]);
}

static void timeout_names_config_key(void) {
    unsetenv("LK_COMM_TIMEOUT");
    expect_message((stall_case){0.3, "trainer.comm_timeout in run.yaml:4:3"},
                   "timed out after 0.3 s (comm_timeout from trainer.comm_timeout in run.yaml:4:3)");
}

static void timeout_names_variable(void) {
    setenv("LK_COMM_TIMEOUT", "0.3", 1); /* lk_comm_config_default takes it; nobody says where from */
    expect_message((stall_case){0, NULL}, "(comm_timeout from LK_COMM_TIMEOUT)");
    unsetenv("LK_COMM_TIMEOUT");
}

static void timeout_names_program(void) {
    setenv("LK_COMM_TIMEOUT", "30", 1); /* set, but the program's own value won */
    expect_message((stall_case){0.3, NULL}, "(comm_timeout from lk_comm_config.timeout_s)");
    unsetenv("LK_COMM_TIMEOUT");
}

LK_TEST_MAIN(LK_TEST_CASE(trainer_config_rule), LK_TEST_CASE(comm_config_default), LK_TEST_CASE(timeout_names_config_key),
             LK_TEST_CASE(timeout_names_variable), LK_TEST_CASE(timeout_names_program))
