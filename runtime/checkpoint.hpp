// Checkpoints of a training run (the file format is io/checkpoint_file.hpp): what a Trainer's
// state is made of, the collective save (gathered to rank 0, the one writer) and the load, where
// every rank reads what it holds. Expert tensors are named by global expert id, so a checkpoint
// written at one rank count and EP size loads at any other. Legend: W ranks, P EP group size,
// L layers, L_h hash layers, E experts, V vocabulary, K experts per token.
#pragma once

#include <span>
#include <string>

#include "comm/communicator.hpp"
#include "io/checkpoint_file.hpp"
#include "model/model.hpp"

namespace moe {

// Views into a Trainer: parameters and AdamW moments of both arenas, and the routing state.
struct TrainState {
  const ModelConfig* model = nullptr;
  const ModelLayout* layout = nullptr;             // this rank's layout (its own experts)
  ExpertPlacement placement;                       // E experts over P EP ranks
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

// Not collective: reads every dense tensor, this rank's experts, the bias and the hash tables of
// `r` into `s`. Throws CheckpointError naming the dataset when one is missing or of another size.
void checkpoint_load(const CheckpointReader& r, const TrainState& s);

}  // namespace moe
