// Checkpoints of a training run (the file format and the folder's catalog, pruning and lock are
// io/checkpoint_file.hpp; which checkpoint --resume reads is the options' part). Here: what a
// Trainer's state is made of, the collective save (gathered to rank 0, the one writer) and the
// load, where every rank reads what it holds; and the run's policy: its identity, its folder
// (created and locked for the run), the header its checkpoints share, when one is written and
// what follows a failed write. Expert tensors are named by global expert id, so a checkpoint
// written at one rank count and EP size loads at any other. Legend: W ranks, P EP group size,
// L layers, L_h hash layers, E experts, V vocabulary, K experts per token.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "comm/communicator.hpp"
#include "io/checkpoint_file.hpp"
#include "model/model.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/records.hpp"

namespace moe {

// Views into a Trainer: parameters and AdamW moments of both arenas, and the routing state.
struct TrainState {
  const ModelConfig* model = nullptr;
  const ModelLayout* layout = nullptr;             // this rank's layout (its own experts)
  ModelPlacement placement;                        // [L] E experts over P EP ranks
  const Comm* ep = nullptr;                        // this rank's EP group
  int ep_group = 0;                                // its index; group 0 holds world rank 0
  std::span<float> dense, dense_m, dense_v;        // [dense elements]
  std::span<float> experts, experts_m, experts_v;  // [this rank's expert elements]
  RoutingState* routing = nullptr;                 // bias [L, E], hash tables [L_h, V, K]
};

// Collective over `world`. Rank 0 writes the checkpoint `path` with header `h`: its own dense
// tensors (replicated on every rank) and the experts of EP group 0 (which holds world rank 0 as
// its EP rank 0, and each expert once), gathered to it. Throws CheckpointError on every rank when
// the write failed, with rank 0's reason there and a pointer to rank 0 elsewhere.
void checkpoint_save(const std::string& path, const CheckpointHeader& h, const TrainState& s,
                     const Comm& world);

// This run's identity in its checkpoints and statistics file: a random id, new for every start
// and every resume, and when it started. Neither touches the run's arithmetic.
struct RunIdentity {
  std::string id;       // 16 hex digits
  int64_t started = 0;  // ns since the Unix epoch
  std::string lineage;  // the runs it continues (CheckpointHeader::lineage)
};
RunIdentity run_identity_make(const RunConfig& cfg);

// Rank 0's part of a run's checkpoints (the other ranks only take part in each write): the
// folder, locked for the run (one live run per folder), and the header its checkpoints share.
struct CheckpointPlan {
  std::string dir;            // "" when checkpointing is off (and on ranks other than 0)
  std::string note;           // a sentence when the folder holds other runs' checkpoints
  CheckpointHeader header;    // step and creation time are set per write
  CheckpointFolderLock lock;  // released, and a folder the run created and left empty removed,
                              // when the plan goes
};

// Rank 0, at set-up. The folder: --checkpoint-dir; when resuming, the resumed checkpoint's
// folder, so that checkpoints of one run stay together; else beside the statistics file,
// "<stats file without .h5>-checkpoints". The header's configuration has the schedule's horizon
// resolved, so that a resumed run that extends --steps keeps the schedule it started with; its
// data checksum is set once every rank has hashed its share. Throws CheckpointError (a folder
// another live run holds, one that is the statistics file's path).
CheckpointPlan checkpoint_plan_make(const RunConfig& cfg, int world_size, int ep_size,
                                    const std::string& stats_path,
                                    const std::string& data_description, const RunIdentity& run);

// Whether a checkpoint follows step `step`: every --checkpoint-every steps, after the last step,
// and when a signal asks the run to stop (`stop`). Never with checkpointing off.
bool checkpoint_due(const RunConfig& cfg, int step, bool stop);

class Trainer;

// Collective over `world`: writes the checkpoint of `step` into rank 0's plan (rank 0 names it,
// then prunes the folder to --keep-checkpoints of this branch) and charges its time to the
// trainer's next step. A failed write ends the run: false, with `summary`'s end saying why on
// every rank. The caller first agrees that every statistics row was written (train.cpp,
// stats_failed_agree): a checkpoint after a missing row would resume into a chain of files with
// rows missing.
bool checkpoint_after(int step, Trainer& trainer, CheckpointPlan& plan, const RunConfig& cfg,
                      const Comm& world, TrainSummary& summary);

// Not collective: reads every dense tensor, this rank's experts, the bias and the hash tables of
// `r` into `s`. Throws CheckpointError naming the dataset when one is missing or of another size.
void checkpoint_load(const CheckpointReader& r, const TrainState& s);

}  // namespace moe
