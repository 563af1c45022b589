// A run's set-up: everything that can fail on bad input (options the model cannot run, data,
// layout, a checkpoint to resume, the statistics file's path, the checkpoint folder) is opened
// before the first collective that a failed rank would miss, and every rank agrees on the outcome,
// so that bad input stops all ranks with one message before anything is replaced. Then the Trainer
// is built (and loaded from the checkpoint), the statistics file published and the configuration
// reported. Legend: W ranks, P EP group size.
#pragma once

#include <memory>

#include "comm/communicator.hpp"
#include "comm/host_layout.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/records.hpp"
#include "runtime/output/run_stats.hpp"
#include "runtime/run/checkpoint.hpp"
#include "runtime/run/trainer.hpp"

namespace moe {

// What a run holds from its set-up to its end.
struct RunSetup {
  HostLayout hosts;                  // --ranks-per-host's blocks, else as the launcher placed them
  int node_ranks = 1;                // the ranks sharing this node's memory and cores
  int threads = 1;                   // per rank: --threads, else the node's cores / node_ranks
  std::unique_ptr<RunStats> stats;   // null with --stats none
  CheckpointPlan checkpoints;        // rank 0's folder, lock and header
  std::unique_ptr<Trainer> trainer;  // points to *stats: declared after it, so destroyed first
  TrainSummary summary;              // what set-up learnt of the run; the step loop adds the rest
};

// Collective over `world`: the set-up above. Throws SetupError on every rank when any rank
// failed (the lowest failing rank reports it; an unpublished statistics file is removed and the
// file at its path left as it was). `quiet` silences rank 0's configuration table.
RunSetup run_setup(const RunConfig& cfg, const Comm& world, bool quiet);

}  // namespace moe
