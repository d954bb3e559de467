/* Pipeline schedules as data (lockstep/pipeline.h), checked before anything
 * trains: every generated schedule for 1..8 stages and 1..16 micro-batches
 * is complete, matches every message and cannot deadlock with blocking
 * sends; its simulated bubble is the theory's (p-1)/(m+p-1); 1F1B keeps at
 * most p - stage micro-batches alive where GPipe keeps all m. And the
 * checker catches what it exists for, on hand-made lists: the naive 1F1B
 * whose send and receive are not posted together (the classic deadlock),
 * a message that meets another one, a schedule that skips a backward or
 * reduces before it, bad arguments. interleaved_1f1b (2 and 3 stages per
 * rank on 2..6 ranks, 1..16 micro-batches) is checked the same way; where
 * the micro-batches are a multiple of the ranks its simulated bubble is
 * the theory's (p-1)/(vm+p-1) and rank k keeps at most (v-1)p + 2(p-1-k) + 1
 * micro-batch-stages alive, Megatron-LM's warm-up plus one. */
#include <math.h>
#include <string.h>

#include "lk_test.h"
#include "lockstep/pipeline.h"

static void generated_schedules(void) {
    const char *const *names = lk_pipe_schedule_names();
    int checked = 0;
    for (int n = 0; names[n]; n++) {
        if (!strcmp(names[n], "interleaved_1f1b")) continue; /* below */
        bool training = strcmp(names[n], "forward") != 0;
        for (int p = 1; p <= 8; p++)
            for (int m = 1; m <= 16; m++) {
                lk_pipe_schedule *s = NULL;
                CHECK_OK(lk_pipe_schedule_make(names[n], p, m, &s));
                lk_pipe_report r;
                lk_status st = lk_pipe_schedule_check(s, &r);
                CHECK_MSG(st == LK_STATUS_OK, "%s p=%d m=%d: %s", names[n], p, m, lk_last_error());
                if (!st && training) {
                    double theory = lk_pipe_bubble_theory(p, m);
                    CHECK_MSG(fabs(r.bubble - theory) < 1e-12, "%s p=%d m=%d: bubble %.6f, theory %.6f", names[n], p, m,
                              r.bubble, theory);
                    for (int k = 0; k < p; k++) {
                        int want = !strcmp(names[n], "gpipe") ? m : (p - k < m ? p - k : m);
                        CHECK_MSG(r.peak_alive[k] == want, "%s p=%d m=%d stage %d: %d micro-batches alive, want %d",
                                  names[n], p, m, k, r.peak_alive[k], want);
                    }
                }
                /* every stage runs each forward once, and a training one each backward once */
                for (int k = 0; k < p; k++) {
                    int f = 0, b = 0;
                    for (int i = 0; i < lk_pipe_schedule_length(s, k); i++) {
                        const lk_pipe_action *a = lk_pipe_schedule_action(s, k, i);
                        f += a->kind == LK_PIPE_FORWARD, b += a->kind == LK_PIPE_BACKWARD;
                    }
                    CHECK(f == m && b == (training ? m : 0));
                }
                lk_pipe_schedule_free(s);
                checked++;
            }
    }
    CHECK(checked == 3 * 8 * 16);
}

static void interleaved_schedules(void) {
    int checked = 0, at_theory = 0;
    for (int p = 2; p <= 6; p++)
        for (int v = 2; v <= 3; v++)
            for (int m = 1; m <= 16; m++)
                for (int training = 0; training <= 1; training++) {
                    const char *name = training ? "interleaved_1f1b" : "forward";
                    lk_pipe_schedule *s = NULL;
                    CHECK_OK(lk_pipe_schedule_make_virtual(name, p, v, m, &s));
                    CHECK(lk_pipe_schedule_virtual(s) == v);
                    lk_pipe_report r;
                    lk_status st = lk_pipe_schedule_check(s, &r);
                    CHECK_MSG(st == LK_STATUS_OK, "%s p=%d v=%d m=%d: %s", name, p, v, m, lk_last_error());
                    if (!st && training && m % p == 0) {
                        double theory = lk_pipe_schedule_bubble_theory(s);
                        CHECK_MSG(fabs(theory - lk_pipe_bubble_theory(p, v * m)) < 1e-15, "theory p=%d v=%d m=%d", p, v, m);
                        CHECK_MSG(fabs(r.bubble - theory) < 1e-12, "%s p=%d v=%d m=%d: bubble %.6f, theory %.6f", name, p,
                                  v, m, r.bubble, theory);
                        for (int k = 0; k < p; k++) {
                            int want = (v - 1) * p + 2 * (p - 1 - k) + 1;
                            if (want > m * v) want = m * v;
                            CHECK_MSG(r.peak_alive[k] == want, "%s p=%d v=%d m=%d rank %d: %d alive, want %d", name, p, v,
                                      m, k, r.peak_alive[k], want);
                        }
                        at_theory++;
                    }
                    /* every rank runs each forward of each of its stages once, and a training one each backward */
                    for (int k = 0; k < p; k++) {
                        int f = 0, b = 0;
                        for (int i = 0; i < lk_pipe_schedule_length(s, k); i++) {
                            const lk_pipe_action *a = lk_pipe_schedule_action(s, k, i);
                            f += a->kind == LK_PIPE_FORWARD, b += a->kind == LK_PIPE_BACKWARD;
                            CHECK(a->kind != LK_PIPE_COMM || (a->nops >= 1 && a->nops <= LK_PIPE_MAX_OPS));
                        }
                        CHECK(f == m * v && b == (training ? m * v : 0));
                    }
                    lk_pipe_schedule_free(s);
                    checked++;
                }
    CHECK(checked == 5 * 2 * 16 * 2);
    CHECK(at_theory > 40);
    /* the default: two stages per rank */
    lk_pipe_schedule *s = NULL;
    CHECK_OK(lk_pipe_schedule_make("interleaved_1f1b", 2, 8, &s));
    CHECK(lk_pipe_schedule_virtual(s) == 2);
    CHECK(fabs(lk_pipe_schedule_bubble_theory(s) - 1.0 / 17.0) < 1e-15);
    lk_pipe_schedule_free(s);
}

#define F(c) {.kind = LK_PIPE_FORWARD, .chunk = (c)}
#define B(c) {.kind = LK_PIPE_BACKWARD, .chunk = (c)}
#define R {.kind = LK_PIPE_REDUCE_GRADS, .chunk = -1}
#define S {.kind = LK_PIPE_OPTIMIZER_STEP, .chunk = -1}
#define OP(send, msg, c, peer) {send, msg, c, peer}
#define C1(o) {.kind = LK_PIPE_COMM, .chunk = -1, .nops = 1, .ops = {o}}
#define C2(o1, o2) {.kind = LK_PIPE_COMM, .chunk = -1, .nops = 2, .ops = {o1, o2}}
#define SA(c, q) OP(true, LK_PIPE_ACTIVATION, c, q)
#define RA(c, q) OP(false, LK_PIPE_ACTIVATION, c, q)
#define SG(c, q) OP(true, LK_PIPE_GRADIENT, c, q)
#define RG(c, q) OP(false, LK_PIPE_GRADIENT, c, q)

static lk_status check_lists(const lk_pipe_action *s0, int n0, const lk_pipe_action *s1, int n1, int chunks) {
    const lk_pipe_action *lists[2] = {s0, s1};
    int n[2] = {n0, n1};
    lk_pipe_schedule *s = NULL;
    lk_status st = lk_pipe_schedule_from_lists("hand-made", 2, chunks, true, lists, n, &s);
    if (!st) st = lk_pipe_schedule_check(s, NULL);
    lk_pipe_schedule_free(s);
    return st;
}
#define N(a) (int)(sizeof(a) / sizeof((a)[0]))

static void broken_schedules(void) {
    /* 1F1B on 2 stages, 2 micro-batches, as generated: fine */
    const lk_pipe_action good0[] = {F(0), C1(SA(0, 1)), F(1), C2(SA(1, 1), RG(0, 1)), B(0), C1(RG(1, 1)), B(1), R, S};
    const lk_pipe_action good1[] = {C1(RA(0, 0)), F(0), B(0), C2(SG(0, 0), RA(1, 0)), F(1), B(1), C1(SG(1, 0)), R, S};
    CHECK_OK(check_lists(good0, N(good0), good1, N(good1), 2));
    /* the same with each pair of ops posted one after the other: stage 0
     * sends activation 1 while stage 1 sends gradient 0, each waiting for
     * the other's receive */
    const lk_pipe_action naive0[] = {F(0), C1(SA(0, 1)), F(1), C1(SA(1, 1)), C1(RG(0, 1)), B(0), C1(RG(1, 1)), B(1), R, S};
    const lk_pipe_action naive1[] = {C1(RA(0, 0)), F(0), B(0), C1(SG(0, 0)), C1(RA(1, 0)), F(1), B(1), C1(SG(1, 0)), R, S};
    CHECK_ERR(check_lists(naive0, N(naive0), naive1, N(naive1), 2), LK_STATUS_INVALID_ARGUMENT, "deadlocks");
    CHECK(strstr(lk_last_error(), "stage 0 waits in action 3 (>a1)") && strstr(lk_last_error(), "stage 1 waits in action 3 (>g0)"));
    /* stage 1 receives the activations in the other order */
    const lk_pipe_action swap1[] = {C1(RA(1, 0)), F(1), C1(RA(0, 0)), F(0), B(0), C1(SG(0, 0)), B(1), C1(SG(1, 0)), R, S};
    const lk_pipe_action gp0[] = {F(0), C1(SA(0, 1)), F(1), C1(SA(1, 1)), C1(RG(0, 1)), B(0), C1(RG(1, 1)), B(1), R, S};
    CHECK_ERR(check_lists(gp0, N(gp0), swap1, N(swap1), 2), LK_STATUS_INVALID_ARGUMENT, "mismatch");
    CHECK(strstr(lk_last_error(), "activation 0") && strstr(lk_last_error(), "activation 1"));
    /* a backward skipped: the gradients are reduced before it */
    const lk_pipe_action skip0[] = {F(0), C1(SA(0, 1)), F(1), C1(SA(1, 1)), C1(RG(0, 1)), B(0), R, S};
    const lk_pipe_action skip1[] = {C1(RA(0, 0)), F(0), C1(RA(1, 0)), F(1), B(0), C1(SG(0, 0)), R, S};
    CHECK_ERR(check_lists(skip0, N(skip0), skip1, N(skip1), 2), LK_STATUS_INVALID_ARGUMENT,
              "reduced before every backward ran (micro-batch 1)");
    /* a forward before its input came */
    const lk_pipe_action early1[] = {F(0), C1(RA(0, 0)), B(0), C1(SG(0, 0)), C1(RA(1, 0)), F(1), B(1), C1(SG(1, 0)), R, S};
    CHECK_ERR(check_lists(gp0, N(gp0), early1, N(early1), 2), LK_STATUS_INVALID_ARGUMENT,
              "its input activation was not received before");
    /* no optimizer step on stage 1 */
    const lk_pipe_action nostep1[] = {C1(RA(0, 0)), F(0), C1(RA(1, 0)), F(1), B(0), C1(SG(0, 0)), B(1), C1(SG(1, 0)), R};
    CHECK_ERR(check_lists(gp0, N(gp0), nostep1, N(nostep1), 2), LK_STATUS_INVALID_ARGUMENT,
              "stage 1 never steps its optimizer");
}

static void bad_arguments(void) {
    lk_pipe_schedule *s = NULL;
    CHECK_ERR(lk_pipe_schedule_make("zero_bubble", 2, 4, &s), LK_STATUS_INVALID_ARGUMENT,
              "pipeline schedule 'zero_bubble' is unknown (expected gpipe, 1f1b, interleaved_1f1b or forward)");
    CHECK_ERR(lk_pipe_schedule_make("interleaved_1f1b", 1, 4, &s), LK_STATUS_INVALID_ARGUMENT,
              "2 stages per rank need at least 2 ranks");
    CHECK_ERR(lk_pipe_schedule_make_virtual("1f1b", 2, 2, 4, &s), LK_STATUS_INVALID_ARGUMENT,
              "pipeline schedule 1f1b runs one stage per rank, not 2 (several stages per rank: interleaved_1f1b)");
    CHECK_ERR(lk_pipe_schedule_make_virtual("interleaved_1f1b", 2, 0, 4, &s), LK_STATUS_INVALID_ARGUMENT,
              "0 virtual stages per rank (expected 1..64)");
    CHECK(s == NULL);
    CHECK(s == NULL);
    CHECK_ERR(lk_pipe_schedule_make("1f1b", 0, 4, &s), LK_STATUS_INVALID_ARGUMENT, "0 stages (expected 1..4096)");
    CHECK_ERR(lk_pipe_schedule_make("gpipe", 2, 0, &s), LK_STATUS_INVALID_ARGUMENT, "0 micro-batches");
    CHECK(fabs(lk_pipe_bubble_theory(2, 8) - 1.0 / 9.0) < 1e-15);
}

LK_TEST_MAIN(LK_TEST_CASE(generated_schedules), LK_TEST_CASE(interleaved_schedules), LK_TEST_CASE(broken_schedules),
             LK_TEST_CASE(bad_arguments))
