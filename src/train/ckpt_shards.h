/* Sharded checkpoint sets (ckpt_shards.c; the format is docs/CHECKPOINTS.md).
 * A set is a directory under the checkpoint's name:
 *   shard-00001-of-0000N.safetensors   one per rank: the pieces it owned
 *   trainer_state.safetensors          rank 0: buffers, optimizer steps and
 *                                      hyperparameters, scheduler, scaler,
 *                                      the checkpoint's metadata
 *   model.safetensors.index.json       written last: the set is complete
 * Every file carries the set's id, so a file from another save is refused. */
#ifndef LK_TRAIN_CKPT_SHARDS_H
#define LK_TRAIN_CKPT_SHARDS_H

#include "io/safetensors.h"
#include "train/train_impl.h"

#define LK_SHARDS_INDEX "model.safetensors.index.json"
#define LK_SHARDS_STATE "trainer_state.safetensors"

typedef struct lk__shard_set lk__shard_set;

/* trainer.state_dict_type is sharded and the strategy shards its state. */
bool lk__shards_wanted(const lk_trainer *tr);
/* Collective: every rank writes its pieces into a staging directory under
 * `dir` (rank 0's choice, told to the others), then all agree it worked. */
lk_status lk__shards_stage(lk_trainer *tr, const char *dir);
/* Rank 0, after the staged shards went into their sets: the staging goes. */
void lk__shards_unstage(lk_trainer *tr);
/* Rank 0: the set at `path` from the staged shards, the trainer state
 * (written by `write_state`, checkpoint.c's writer with the extra metadata)
 * and the index, swapped in atomically. */
typedef lk_status (*lk__shards_state_writer)(lk_trainer *tr, const char *path, bool weights_only,
                                             const lk_st_meta *extra, int nextra);
lk_status lk__shards_write_set(lk_trainer *tr, const char *path, bool weights_only, lk__shards_state_writer write_state);
/* Removes a checkpoint: a file, or a set's directory with its files. */
int lk__shards_remove(const char *path);

/* A directory (a set) rather than a file. */
bool lk__shards_is_set(const char *path);
/* Opens every file of the set and checks they belong together (nothing is
 * loaded yet): missing, truncated or foreign files are named. */
lk_status lk__shards_open(const char *path, lk__shard_set **out);
void lk__shards_close(lk__shard_set *set);
lk_st_file *lk__shards_state(const lk__shard_set *set);
/* Before anything is loaded: every tensor of the live state dict is in the
 * set whole, and (optim non-NULL) the optimizer state arrays too. */
lk_status lk__shards_check(const lk__shard_set *set, const lk_named_tensors *live, const lk_optimizer *optim);
/* The model: buffers from the trainer state, parameters into this rank's
 * pieces (then the strategy shares them). */
lk_status lk__shards_load_model(lk_trainer *tr, const lk__shard_set *set, const lk_named_tensors *live);
/* The optimizer's arrays: into the pieces' state when the strategy holds
 * them (after lk_optimizer_state_load set the steps; *done true), else
 * whole per parameter into `fromfile` ("state.<name>.<array>") for
 * lk_optimizer_state_load. */
lk_status lk__shards_optim_whole(const lk__shard_set *set, const lk_optimizer *o, lk_named_tensors *fromfile);
lk_status lk__shards_optim_pieces(lk_trainer *tr, const lk__shard_set *set, bool *done);
/* `lockstep export`: the set as one file, PyTorch's names (with_opt: the
 * training state too, the optimizer's arrays whole). */
lk_status lk__shards_export(const char *path, const char *out, bool with_opt, int *ntensors);

#endif
