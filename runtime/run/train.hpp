// The training loop of moe_rt: data -> forward -> backward -> gradient all-reduce -> clipping ->
// AdamW -> loss-free bias update -> one line of story on rank 0. Every rank runs it; collectives
// keep them in step. Legend: W ranks, P EP group size, B sequences per rank, S sequence length,
// T = W·B·S tokens per step, L layers, E experts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/options/options.hpp"
#include "runtime/output/records.hpp"

namespace moe {

// Runs cfg.steps training steps over `world`. Throws on bad configuration or data (identically on
// every rank, before the first step, wherever possible). `quiet` silences rank 0's log.
// With `measure_peak`, after training, the ranks gather their peak resident memory and rank 0
// measures the sgemm peak for the MFU figure.
TrainSummary train_run(const RunConfig& cfg, const Comm& world, bool quiet = false,
                       bool measure_peak = false);

}  // namespace moe
