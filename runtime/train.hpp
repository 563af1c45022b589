// The training loop of moe_rt: data -> forward -> backward -> gradient all-reduce -> clipping ->
// AdamW -> loss-free bias update -> one line of story on rank 0. Every rank runs it; collectives
// keep them in step. Legend: W ranks, P EP group size, B sequences per rank, S sequence length,
// T = W·B·S tokens per step, L layers, E experts.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "runtime/options.hpp"
#include "runtime/records.hpp"

namespace moe {

// A failure before the first collective (options, data, layout), agreed on by every rank: all ranks
// throw it, and exactly one of them (the lowest failing rank) reports it, so the user reads one
// message and every rank exits non-zero without MPI_Abort.
class SetupError : public std::runtime_error {
 public:
  SetupError(const std::string& message, bool report)
      : std::runtime_error(message), report_(report) {}
  bool report() const { return report_; }

 private:
  bool report_;
};

// Collective over `world`: returns when no rank has an error; otherwise throws SetupError on every
// rank. `local_error` is this rank's message, empty when it has none.
void setup_agree(const Comm& world, const std::string& local_error);

// Runs cfg.steps training steps over `world`. Throws on bad configuration or data (identically on
// every rank, before the first step, wherever possible). `quiet` silences rank 0's log.
// With `measure_peak`, rank 0 measures the sgemm peak after training for the MFU figure.
TrainSummary train_run(const RunConfig& cfg, const Comm& world, bool quiet = false,
                       bool measure_peak = false);

}  // namespace moe
