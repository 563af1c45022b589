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

namespace moe {

// What a step measured, globally reduced: the step line, the statistics file and tests read it.
struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;            // LM cross-entropy, global mean
  double balance_loss = 0.0;    // total sequence-wise balance loss added
  double grad_norm = 0.0;       // before clipping
  double lr = 0.0;
  double seconds = 0.0;         // the slowest rank's step time
  double tokens_per_s = 0.0;
  double max_violation = 0.0;   // worst (max c − mean c)/mean c over top-k (or forced) layers
  std::vector<int64_t> expert_load;        // [L, E] global counts of the step
  std::vector<int64_t> rank_load;          // [L, W] assignments received by each rank
  std::vector<int64_t> dispatch_rows;      // [L] assignments dispatched, all ranks (T·K)
  std::vector<int64_t> cross_host_rows;    // [L] of them sent to an expert owner on another host
  std::vector<int64_t> cross_host_tokens;  // [L] (token, other host holding one of its experts)
  std::vector<float> bias;                 // [L, E] bias used for the step's routing
  std::vector<double> layer_variance;      // [L] population variance of expert_load
  std::vector<double> layer_violation;     // [L] (max − mean)/mean
  std::vector<double> layer_cv;            // [L] std / mean
  std::vector<double> layer_overload;      // [L] max / mean of rank_load
  std::vector<double> layer_balance_loss;  // [L]
};

// A validation loss after a step (--val-data): forward only, over --eval-batches global batches
// of validation sequences, the same ones at every evaluation. Globally reduced.
struct EvalRecord {
  int64_t step = 0;             // the training step it followed
  double loss = 0.0;            // LM cross-entropy, mean over the validation tokens
  int64_t tokens = 0;           // validation tokens (targets) evaluated
  double seconds = 0.0;         // wall time of the evaluation (not part of any step's time)
  double max_violation = 0.0;   // worst layer_violation over top-k (or forced) layers
  std::vector<int64_t> expert_load;     // [L, E] assignments over all validation tokens
  std::vector<double> layer_variance;   // [L] population variance of expert_load
  std::vector<double> layer_violation;  // [L] (max − mean)/mean
};

// Where the time of the steps after the first went, per phase (model/phase_timer.hpp).
struct PhaseSummary {
  std::vector<double> mean_ms;  // [phases] per step, averaged over steps and ranks
  std::vector<double> max_ms;   // [phases] per step, the slowest rank's average
  double step_ms = 0;           // mean step time (the slowest rank's wall time)
};

// How a run ended (main turns it into the exit status: docs/checkpoints.md, "Exit status").
enum class RunEnd {
  kCompleted,         // every step of --steps ran
  kSignal,            // a stop signal: every rank stopped after the same step
  kNonFinite,         // a NaN or Inf loss or gradient norm: that step updated nothing
  kCheckpointFailed,  // a checkpoint could not be written: stopped after the step it followed
};

struct TrainSummary {
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;  // --val-data: in step order
  std::string stats_path;       // the statistics file written, empty for --stats none
  bool stats_removed = false;   // the statistics file was removed (or replaced) during the run
  PhaseSummary phases;
  double model_gflops = 0;      // training FLOPs per second: 3 · forward FLOPs/token · tokens/s
  double peak_gflops = 0;       // measured sgemm rate of one core × cores in use (0: not measured)
  int peak_cores = 0;
  double entropy_floor = -1.0;  // nats; < 0 when the data has no known floor
  std::string data_description;
  std::string val_data_description;  // "" without --val-data
  std::vector<RoutingMode> layer_modes;  // [L] how each layer routes
  int num_hosts = 1;                     // hosts the ranks lie on (comm/host_layout.hpp)
  int top_k = 1;                         // K
  RunEnd end = RunEnd::kCompleted;
  int stop_signal = 0;          // kSignal: the signal's number
  int64_t last_step = -1;       // the last step that ran
  std::string end_detail;       // kNonFinite: where it went non-finite; kCheckpointFailed: why
  std::string checkpoint_dir;   // rank 0: where checkpoints go, "" when off
  std::string last_checkpoint;  // rank 0: the newest checkpoint this run wrote, "" if none
};

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
