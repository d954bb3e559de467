/* lockstep/pipeline.h — pipeline schedules as data.
 *
 * A pipeline cuts the model into p consecutive stages, one per rank, and
 * the batch into m micro-batches ("chunks"). A schedule says, for every
 * stage, the order of its work: the forward and backward of each
 * micro-batch and the messages between neighbouring stages (activations go
 * forward, their gradients come back). Here a schedule is a list of actions
 * per stage, made by one generator per schedule and run by one interpreter
 * (torch.distributed.pipelining and DeepSpeed's TrainSchedule work the same
 * way), so that it can be printed, and checked before anything runs:
 *
 *     lk_pipe_schedule *s;
 *     LK_TRY(lk_pipe_schedule_make("1f1b", 4, 8, &s));   // 4 stages, 8 micro-batches
 *     lk_pipe_report r;
 *     LK_TRY(lk_pipe_schedule_check(s, &r));             // complete, matched, no deadlock
 *     for (int i = 0; i < lk_pipe_schedule_length(s, stage); i++) {
 *         const lk_pipe_action *a = lk_pipe_schedule_action(s, stage, i);
 *         ... run a ...
 *     }
 *     lk_pipe_schedule_free(s);
 *
 * Messages. The actions that move data are COMM actions, each a group of at
 * most LK_PIPE_MAX_OPS point-to-point operations posted together and waited
 * for together (Megatron's send_forward_recv_backward): a stage that sends its
 * activation on and needs the next stage's gradient posts both at once, so
 * no order of the two can deadlock however the transport blocks. The
 * checker assumes the worst transport: a send completes only when its
 * receive is posted (rendezvous), the n-th send from a to b meets the n-th
 * receive by b from a, and both must name the same tensor.
 */
#ifndef LOCKSTEP_PIPELINE_H
#define LOCKSTEP_PIPELINE_H

#include <stdio.h>

#include "lockstep/core.h"
#include "lockstep/dist.h"
#include "lockstep/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lk_pipe_kind {
    LK_PIPE_FORWARD,        /* the stage's forward of micro-batch `chunk` (the last stage: and its loss) */
    LK_PIPE_BACKWARD,       /* its backward (the last stage: from the loss), gradients accumulated */
    LK_PIPE_COMM,           /* ops[0..nops) posted together, then waited for together */
    LK_PIPE_REDUCE_GRADS,   /* the stage's gradients all-reduced over its data-parallel group */
    LK_PIPE_OPTIMIZER_STEP, /* the stage's optimizer step, once per batch */
} lk_pipe_kind;

typedef enum lk_pipe_msg {
    LK_PIPE_ACTIVATION, /* a stage's output, to the next stage */
    LK_PIPE_GRADIENT,   /* the gradient of the previous stage's output, back to it */
} lk_pipe_msg;

/* The most ops one COMM action posts together (interleaved: the outputs of
 * a forward and a backward sent, an activation and a gradient received). */
enum { LK_PIPE_MAX_OPS = 4 };

typedef struct lk_pipe_op {
    bool send;       /* a send to `peer`; else a receive from it */
    lk_pipe_msg msg;
    int chunk;       /* the micro-batch it belongs to */
    int peer;        /* the other rank */
    int vstage;      /* this rank's local stage it belongs to (the sender's or the receiver's; 0 but interleaved) */
} lk_pipe_op;

/* With one stage per rank (gpipe, 1f1b) a rank's list is its stage's. With
 * v stages per rank (interleaved_1f1b), rank k holds the model's stages k,
 * k + p, ..., k + (v - 1) p, its local stages 0 .. v - 1: a compute names
 * the local stage it runs (vstage), a message the local stage whose input
 * or output it carries; the model's stage is vstage * p + k. */
typedef struct lk_pipe_action {
    lk_pipe_kind kind;
    int chunk;          /* FORWARD, BACKWARD: the micro-batch; -1 otherwise */
    int nops;           /* COMM: 1 .. LK_PIPE_MAX_OPS */
    lk_pipe_op ops[LK_PIPE_MAX_OPS];
    int vstage;         /* FORWARD, BACKWARD: the local stage (0 but interleaved) */
} lk_pipe_action;

typedef struct lk_pipe_schedule lk_pipe_schedule;

/* The schedule names lk_pipe_schedule_make takes, NULL-terminated:
 * "gpipe" (every forward, then every backward), "1f1b" (after a warm-up of
 * p - 1 - stage forwards, one forward then one backward, so a stage keeps
 * at most p - stage micro-batches' activations), "interleaved_1f1b" (v
 * stages per rank, micro-batches in groups of p through each in turn: the
 * bubble (p - 1) / (v m + p - 1), for more messages and more activations
 * kept), "forward" (forwards only: validation, test and predict). */
const char *const *lk_pipe_schedule_names(void);
/* The schedule `name` for `stages` ranks and `chunks` micro-batches (both
 * >= 1; stages <= 4096, chunks <= 65536), one stage per rank
 * (interleaved_1f1b: two). A training schedule ends each rank's list with
 * REDUCE_GRADS and OPTIMIZER_STEP. INVALID_ARGUMENT names the unknown
 * schedule or the value out of range. */
lk_status lk_pipe_schedule_make(const char *name, int stages, int chunks, lk_pipe_schedule **out);
/* ... with `virtual_stages` (1..64) stages per rank: interleaved_1f1b, or
 * forward (evaluation through such a split); gpipe and 1f1b take 1. */
lk_status lk_pipe_schedule_make_virtual(const char *name, int stages, int virtual_stages, int chunks,
                                        lk_pipe_schedule **out);
void lk_pipe_schedule_free(lk_pipe_schedule *s);

const char *lk_pipe_schedule_name(const lk_pipe_schedule *s);
int lk_pipe_schedule_stages(const lk_pipe_schedule *s);
int lk_pipe_schedule_chunks(const lk_pipe_schedule *s);
int lk_pipe_schedule_virtual(const lk_pipe_schedule *s); /* stages per rank */
int lk_pipe_schedule_length(const lk_pipe_schedule *s, int stage);
/* Whether the schedule trains (backwards, reduce, step) or only runs forwards. */
bool lk_pipe_schedule_training(const lk_pipe_schedule *s);
/* Action i of `stage` (borrowed); NULL out of range. */
const lk_pipe_action *lk_pipe_schedule_action(const lk_pipe_schedule *s, int stage, int i);

/* What lk_pipe_schedule_check found out by running the lists. */
typedef struct lk_pipe_report {
    int steps;             /* rounds of the simulation until every stage was done */
    int peak_alive[64];    /* per stage (the first 64): most micro-batches whose forward ran and backward not yet
                              (several stages per rank: per rank, each micro-batch counted once per stage) */
    int peak_alive_max;    /* ... over every stage */
    /* A timeline with a rank's forward costing 1 (a stage's, 1 / v), a
     * backward 2 and messages free: each rank's idle share of the makespan,
     * averaged over the ranks. GPipe's and 1F1B's equal the theory
     * (p - 1) / (m + p - 1); interleaved 1F1B's (p - 1) / (v m + p - 1)
     * wherever m is a multiple of p. */
    double bubble;
    double makespan;       /* in forward units */
} lk_pipe_report;

/* Runs every stage's list against the others as a blocking transport
 * would and checks, before anything trains: every op has its partner (the
 * same tensor, in the same order per pair), no stage waits forever (a
 * deadlock is named: each stuck stage and the action it waits in), and the
 * schedule is complete (a training schedule: each stage runs the forward
 * and the backward of every micro-batch once, the backward after the
 * forward, a micro-batch's input received before its forward and its
 * output's gradient before its backward, sent on after them, then
 * REDUCE_GRADS and OPTIMIZER_STEP once). INVALID_ARGUMENT with the first
 * fault; `report` (may be NULL) is filled on success. */
lk_status lk_pipe_schedule_check(const lk_pipe_schedule *s, lk_pipe_report *report);

/* The theory's idle share of a pipeline of p stages and m micro-batches,
 * (p - 1) / (m + p - 1); of a schedule, (p - 1) / (v m + p - 1) with v
 * stages per rank (0 for a forward-only one). */
double lk_pipe_bubble_theory(int stages, int chunks);
double lk_pipe_schedule_bubble_theory(const lk_pipe_schedule *s);

/* Prints the schedule: a line per stage in a compact notation (F3: forward
 * of micro-batch 3, B3: backward, >a3 send activation 3 on, <a3 receive it,
 * >g3 send gradient 3 back, <g3 receive it, [..] ops posted together, R:
 * reduce gradients, S: optimizer step), the peak of live micro-batches per
 * stage and the bubble. */
lk_status lk_pipe_schedule_print(const lk_pipe_schedule *s, FILE *f);

/* ---- the interpreter ---------------------------------------------------------------
 * One stage's side of a pipeline step: its blocks and how its micro-batches
 * begin (stage 0) and end (the last stage). */
typedef struct lk_pipe_stage {
    lk_comm *comm;           /* the pipeline group (borrowed): its rank k is stage k, its size the stages */
    lk_layer *const *blocks; /* this stage's blocks in order (borrowed): its forward runs them one after another */
    int nblocks;
    /* (several stages per rank) [v] how many of `blocks` each local stage
     * runs, in order (local stage 0's first); NULL: one stage, all of them */
    const int *stage_blocks;
    void *ctx;
    /* The model's first stage: micro-batch c's input to the first block (in the current scope). */
    lk_tensor *(*input)(void *ctx, int chunk);
    /* The last stage: micro-batch c's loss (one element, in the current scope) from the last block's output. */
    lk_tensor *(*loss)(void *ctx, int chunk, lk_tensor *out);
    /* (forward-only schedules; the last stage) Micro-batch c's output
     * (borrowed: copy what is kept), given instead of a loss. */
    lk_status (*output)(void *ctx, int chunk, lk_tensor *out);
    float loss_mul; /* each micro-batch's loss times this before its backward (1/chunks: the batch's mean; 0: 1) */
    /* (optional) [chunks] micro-batch c's loss also times chunk_weight[c],
     * and counted so in *loss_sum: micro-batches of unequal rows weighted
     * by their rows (rows_c * chunks / rows); NULL: all 1. */
    const float *chunk_weight;
    /* (optional) Called just before each BACKWARD of local stage `vstage`,
     * `last` for the list's last one of that stage (its gradients are final
     * as it runs: pipeline x ddp starts all-reducing them bucket by bucket
     * from there). */
    void (*before_backward)(void *ctx, int chunk, int vstage, bool last);
    /* (optional) What REDUCE_GRADS and OPTIMIZER_STEP do; NULL: nothing. */
    lk_status (*reduce_grads)(void *ctx);
    lk_status (*optimizer_step)(void *ctx);
    /* (optional) Where the run's time went, added in (seconds): the whole
     * list, its forwards and backwards, and its COMM actions (posting and
     * waiting: on an idle machine, the stage's bubble plus the transfers). */
    struct lk_pipe_times {
        double total_s, compute_s, comm_s;
    } *times;
    /* (optional) Called with ctx after each action ran, and when (a profiler's trace). */
    void (*on_action)(void *ctx, const lk_pipe_action *a, double t_start, double t_end);
} lk_pipe_stage;

/* Runs this rank's list of schedule `s` (stage lk_comm_rank(st->comm);
 * checked first with lk_pipe_schedule_check): each FORWARD runs the blocks
 * on the micro-batch's input (stage 0: st->input; else the activation
 * received, a leaf that requires grad), each BACKWARD runs lk_backward from
 * the loss (the last stage) or lk_backward_with from the output with the
 * gradient received, so the blocks' parameters accumulate their gradients
 * over the micro-batches; messages are the activations (a small header with
 * dtype and shape, then the data) and the gradients of the inputs, posted
 * together per COMM action with the async point-to-point calls. Each
 * micro-batch's tensors (its graph's activations, the activation and the
 * gradient it received) are released once its backward ran and its input's
 * gradient was sent, so a stage holds only the micro-batches its schedule
 * has in flight (1F1B: at most p - stage; a forward-only schedule's until
 * the run ends). On the
 * last stage *loss_sum (may be NULL) gets the sum of the micro-batches'
 * losses (times chunk_weight when given) before loss_mul; elsewhere 0. Any failure (a peer's included)
 * aborts the communicator, so every stage stops. */
lk_status lk_pipe_run(const lk_pipe_schedule *s, const lk_pipe_stage *st, double *loss_sum);

/* Tests only: a schedule from hand-made lists (lists[k]: stage k's n[k]
 * actions, copied), so that the checker can be shown a broken one. */
lk_status lk_pipe_schedule_from_lists(const char *name, int stages, int chunks, bool training,
                                      const lk_pipe_action *const *lists, const int *n, lk_pipe_schedule **out);

#ifdef __cplusplus
}
#endif
#endif
