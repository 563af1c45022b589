// The records of a run, one name per quantity from the step to the statistics file
// (docs/hdf5-schema.md: a field named as its dataset, e.g. StepRecord::load_variance is
// /routing/load_variance) to the summaries: what a step and an evaluation measured, where the
// time went, and how the run ended. The training loop (runtime/run/train.hpp) fills them; the
// statistics file (runtime/output/run_stats.hpp) and the report (runtime/output/report.hpp) read
// them. Legend: L layers, E experts, W ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace moe {

// What a step measured, globally reduced: the step line, the statistics file and tests read it.
struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;          // LM cross-entropy, global mean
  double balance_loss = 0.0;  // total sequence-wise balance loss added
  double z_loss = 0.0;        // total router z-loss added (0 without --z-loss-weight)
  double grad_norm = 0.0;     // before clipping
  double lr = 0.0;
  double step_time_s = 0.0;  // the slowest rank's step time
  double tokens_per_s = 0.0;
  double worst_violation = 0.0;        // worst max_violation over top-k (or forced) layers
  std::vector<int64_t> expert_load;    // [L, E] global counts of the step (selected, before drops)
  std::vector<int64_t> dropped;        // [L, E] of them dropped by the token capacity
  std::vector<int64_t> rank_load;      // [L, W] assignments received by each rank
  std::vector<int32_t> source_load;    // [L, W, E] assignments each rank's tokens sent to each
                                       // expert (dispatched: drops not counted)
  std::vector<int64_t> dispatch_rows;  // [L] assignments dispatched, all ranks (T·K − dropped)
  std::vector<int64_t> cross_host_rows;    // [L] of them sent to an expert owner on another host
  std::vector<int64_t> cross_host_tokens;  // [L] (token, other host holding one of its experts)
  std::vector<float> bias;                 // [L, E] bias used for the step's routing
  std::vector<double> load_variance;       // [L] population variance of expert_load
  std::vector<double> max_violation;       // [L] (max − mean)/mean of expert_load
  std::vector<double> load_cv;             // [L] std / mean of expert_load
  std::vector<double> rank_overload;       // [L] max / mean of rank_load
  std::vector<double> layer_balance_loss;  // [L] (/routing/balance_loss in the file)
  std::vector<double> layer_z_loss;        // [L] (/routing/z_loss in the file)
  // Shadow balancers (--shadow), R of them: /shadow/<rule>/ in the file.
  std::vector<int64_t> shadow_load;          // [R, L, E] global loads of each one's routing
  std::vector<float> shadow_bias;            // [R, L, E] the bias each routed the step with
  std::vector<double> shadow_max_violation;  // [R, L] (0 outside top-k layers)
};

// A validation loss after a step (--val-data): forward only, over --eval-batches global batches
// of validation sequences, the same ones at every evaluation. Globally reduced.
struct EvalRecord {
  int64_t step = 0;                   // the training step it followed
  double loss = 0.0;                  // LM cross-entropy, mean over the validation tokens
  int64_t tokens = 0;                 // validation tokens (targets) evaluated
  double time_s = 0.0;                // wall time of the evaluation (not part of any step's time)
  double worst_violation = 0.0;       // worst max_violation over top-k (or forced) layers
  std::vector<int64_t> expert_load;   // [L, E] assignments over all validation tokens
  std::vector<int64_t> dropped;       // [L, E] of them dropped by the token capacity
  std::vector<double> load_variance;  // [L] population variance of expert_load
  std::vector<double> max_violation;  // [L] (max − mean)/mean
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
  kStatsFailed,       // a statistics row could not be written: stopped, no checkpoint after it
};

struct TrainSummary {
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;  // --val-data: in step order
  std::string stats_path;         // the statistics file written, empty for --stats none
  bool stats_removed = false;     // the statistics file was removed (or replaced) during the run
  PhaseSummary phases;
  double model_gflops = 0;  // training FLOPs per second: 3 · forward FLOPs/token · tokens/s
  double peak_gflops = 0;   // measured sgemm rate of one core × cores in use (0: not measured)
  int peak_cores = 0;
  // Peak resident memory of a rank (getrusage's ru_maxrss) in MiB: the largest over the ranks and
  // their mean; 0 when not measured. Shared pages (a mapped data file, MPI's shared memory) count
  // in every rank that touched them.
  double peak_rss_max_mib = 0;
  double peak_rss_mean_mib = 0;
  double entropy_floor = -1.0;  // nats; < 0 when the data has no known floor
  std::string data_description;
  std::string val_data_description;       // "" without --val-data
  std::vector<RoutingMode> layer_modes;   // [L] how each layer routes
  std::vector<std::string> shadow_names;  // [R] the shadow balancers' rules (--shadow)
  double capacity_factor = 0;             // --capacity-factor (0: dropless)
  std::string drop_policy;                // --drop-policy
  int num_hosts = 1;                      // hosts the ranks lie on (comm/host_layout.hpp)
  int top_k = 1;                          // K
  RunEnd end = RunEnd::kCompleted;
  int stop_signal = 0;     // kSignal: the signal's number
  int64_t last_step = -1;  // the last step that ran
  std::string end_detail;  // kNonFinite: where it went non-finite; kCheckpointFailed, kStatsFailed
                           // (rank 0): why
  std::string checkpoint_dir;   // rank 0: where checkpoints go, "" when off
  std::string data_checksum;    // the --data file's content checksum, "" for generated data
  std::string last_checkpoint;  // rank 0: the newest checkpoint this run wrote, "" if none
  // The parameters after the last step, as one number (Trainer::param_digest): the same on any
  // rank count, EP size and machine wherever the run's bits are; 0 when no step ran.
  uint64_t param_digest = 0;
};

}  // namespace moe
